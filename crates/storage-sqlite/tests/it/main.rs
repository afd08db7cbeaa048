//! Integration tests of `agentry-storage-sqlite`: the conformance suite on real files.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod bad_input;
mod durability;
mod memory_facade;
mod migration;
#[cfg(target_os = "linux")]
mod readers;
mod writer;

use std::sync::Arc;

use agentry_memory::conformance::Harness;
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};

async fn fresh() -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db"), SqliteOptions::default()).unwrap();
    Harness::with_guard(Arc::new(store), dir)
}

agentry_memory::conformance_tests!(fresh);
