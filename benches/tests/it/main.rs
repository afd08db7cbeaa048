//! Integration tests of the workload drivers: crash tests of both storage backends, two
//! processes sharing one store, the runner's and the team's scenarios on SQLite and redb,
//! and the fuzz harnesses over their corpora.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod crash;
mod fuzz;
mod recovery;
mod scenarios;
mod shared;
mod team;
