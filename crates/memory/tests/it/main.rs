//! Integration tests of `agentry-memory`: the in-memory store passes the conformance suite.

use std::sync::Arc;

use agentry_memory::InMemoryStore;
use agentry_memory::conformance::Harness;

agentry_memory::conformance_tests!(|| async { Harness::new(Arc::new(InMemoryStore::new())) });
