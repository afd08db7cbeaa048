//! The file backend of `relaxed` stores: every commit reaches the operating system, the
//! sync to disk waits for the writer's periodic one.
//!
//! redb's only commit that leaves the process is `Durability::Immediate`, which syncs;
//! its `Durability::None` keeps commits inside the process, where a crash loses them. A
//! `relaxed` store commits with `Immediate` through this backend, whose `sync_data` does
//! nothing while the writer has not asked for a sync, so an acknowledged write survives a
//! crash of the process and costs no sync.

use std::fs::File;
use std::io;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Whether syncs go to disk; shared between the backend and the writer thread.
#[derive(Debug, Clone)]
pub(crate) struct SyncSwitch(Arc<AtomicBool>);

impl SyncSwitch {
    /// A switch that starts on (opening, repair and set-up sync as usual).
    pub(crate) fn on() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// Makes the next syncs go to disk (`true`) or be skipped (`false`).
    pub(crate) fn set(&self, sync: bool) {
        self.0.store(sync, Ordering::Release);
    }

    fn is_on(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// A [`FileBackend`] whose syncs obey a [`SyncSwitch`].
#[derive(Debug)]
pub(crate) struct DeferredSyncBackend {
    file: FileBackend,
    switch: SyncSwitch,
}

impl DeferredSyncBackend {
    pub(crate) fn new(file: File, switch: SyncSwitch) -> Result<Self, redb::DatabaseError> {
        Ok(Self { file: FileBackend::new(file)?, switch })
    }
}

impl StorageBackend for DeferredSyncBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        if self.switch.is_on() { self.file.sync_data() } else { Ok(()) }
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.file.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}
