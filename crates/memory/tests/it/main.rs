//! Integration tests of `agentry-memory`: the in-memory store passes the conformance suite;
//! the Memory facade and the session views.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod codec;
mod facade;
mod views;

use std::sync::Arc;

use agentry_memory::InMemoryStore;
use agentry_memory::conformance::Harness;

agentry_memory::conformance_tests!(|| async { Harness::new(Arc::new(InMemoryStore::new())) });
