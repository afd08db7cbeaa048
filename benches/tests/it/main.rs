//! Integration tests of the workload drivers: crash tests of both storage backends, and
//! two processes sharing one store.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod crash;
mod fuzz;
mod recovery;
mod scenarios;
mod shared;
mod team;
