//! Integration tests of `agentry-storage-redb`: the conformance suite on real files.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod bad_input;
mod durability;
mod memory_facade;
mod migration;

use std::sync::Arc;

use agentry_memory::conformance::Harness;
use agentry_storage_redb::{RedbOptions, RedbStore};

async fn fresh() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path().join("store.redb"), RedbOptions::default()).unwrap();
    Harness::with_guard(Arc::new(store), dir)
}

agentry_memory::conformance_tests!(fresh);
