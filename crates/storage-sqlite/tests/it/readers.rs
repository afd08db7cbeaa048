//! Reads share a bounded pool of read-only connections: a burst of reads waits for them
//! instead of opening a connection per read. (Linux: connections are counted in
//! `/proc/self/fd`.)

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use agentry_memory::{HistoryQuery, MessageStore, SessionStore};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{SessionRecord, SessionType, Subject};

/// How many of this process's file descriptors are open on `path`: one per connection.
fn open_handles(path: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|entry| std::fs::read_link(entry.path()).is_ok_and(|target| target == path))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_reads_uses_at_most_the_configured_connections() {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().canonicalize().unwrap().join("store.db");
    let store =
        Arc::new(SqliteStore::open(&path, SqliteOptions { readers: 2, ..SqliteOptions::default() }).unwrap());
    let session = SessionRecord::new(SessionType::Agent, "demo", Subject::user("alice"));
    store.create_session(&session).await.unwrap();
    // The writer and the checkpointer.
    let before = open_handles(&path);
    assert!(before >= 1, "the store's own connections hold the file open");
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (done, path) = (done.clone(), path.clone());
        std::thread::spawn(move || {
            let mut most = open_handles(&path);
            while !done.load(Ordering::Acquire) {
                most = most.max(open_handles(&path));
                std::thread::yield_now();
            }
            most
        })
    };
    // Short reads (a record) and long ones (a history window), which leave a connection
    // to the short.
    let reads = (0..1000).map(|index| {
        let (store, id) = (store.clone(), session.id);
        tokio::spawn(async move {
            if index % 2 == 0 {
                assert_eq!(store.get_session(id).await.unwrap().id, id);
            } else {
                assert!(store.history(id, &HistoryQuery::default()).await.unwrap().is_empty());
            }
        })
    });
    for read in futures_util::future::join_all(reads).await {
        read.unwrap();
    }
    done.store(true, Ordering::Release);
    let most = watcher.join().unwrap();
    assert!(
        most <= before + 2,
        "{most} connections were open at once; 2 readers and {before} others allowed"
    );
    let after = open_handles(&path);
    assert!(
        (before + 1..=before + 2).contains(&after),
        "{after} open: the readers stay open for the next reads"
    );
}
