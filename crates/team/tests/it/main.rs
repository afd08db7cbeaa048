//! The team's acceptance scenarios on the in-memory store (SQLite and redb run them in
//! `agentry-benches`).

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use agentry_memory::InMemoryStore;
use agentry_memory::conformance::Harness;

agentry_team::team_scenarios!(|| async { Harness::new(Arc::new(InMemoryStore::new())) });

mod usage;
