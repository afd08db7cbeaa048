//! Two processes on one store: what a writer remembers about a turn (its session and last
//! `seq`) never hides what another process wrote. The second process is a real child
//! (`agentry-workload append-one` / `delete-session`) writing while this one keeps the
//! store open.

use std::process::Command;
use std::sync::Arc;

use agentry_benches::{event_for, open_store};
use agentry_memory::{Conflict, Durability, Order, Store, StoreError};
use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};

/// Runs the child with `args` and returns the one line it printed.
fn child(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_agentry-workload")).args(args).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

async fn session_with_run(store: &Arc<dyn Store>) -> (SessionRecord, RunRecord) {
    let session = SessionRecord::new(SessionType::Agent, "shared", Subject::user("ann"));
    store.create_session(&session).await.unwrap();
    let run = RunRecord::new(session.id, vec![TurnInputItem::message("hi")], Subject::user("ann"));
    store.put_run(&run, None).await.unwrap();
    (session, run)
}

fn stale(error: &StoreError, expected_seq: u64, expected_last: u64) -> bool {
    matches!(error, StoreError::Conflict(Conflict::StaleSeq { seq, last, .. })
        if *seq == expected_seq && *last == expected_last)
}

async fn sees_seqs_stored_by_another_process(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("shared.{backend}"));
    let path_text = path.to_str().unwrap();
    let store = open_store(backend, &path, Durability::Batched).unwrap();
    let (_, run) = session_with_run(&store).await;
    let turn = run.id.to_string();

    // This writer now remembers seq 1 as the turn's last.
    store.append_events(run.id, &[event_for(&run, 1)], None).await.unwrap();
    assert!(child(&["append-one", backend, path_text, "batched", &turn, "5"]).starts_with("ok "));

    // Seq 3 was never stored, but it is not above the turn's last (5): refused.
    let refused = store.append_events(run.id, &[event_for(&run, 3)], None).await.unwrap_err();
    assert!(stale(&refused, 3, 5), "{refused:?}");
    store.append_events(run.id, &[event_for(&run, 6)], None).await.unwrap();
    let line = child(&["append-one", backend, path_text, "batched", &turn, "6"]);
    assert!(line.starts_with("refused "), "{line}");

    let seqs: Vec<u64> = store
        .turn_events(run.id, Order::Asc, None, 10)
        .await
        .unwrap()
        .iter()
        .map(|stored| stored.event.seq)
        .collect();
    assert_eq!(seqs, [1, 5, 6]);
    assert_eq!(store.high_water(run.id).await.unwrap(), 6);
}

async fn sees_a_session_deleted_by_another_process(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("shared.{backend}"));
    let store = open_store(backend, &path, Durability::Batched).unwrap();
    let (session, run) = session_with_run(&store).await;
    store.append_events(run.id, &[event_for(&run, 1)], None).await.unwrap();

    let line =
        child(&["delete-session", backend, path.to_str().unwrap(), "batched", &session.id.to_string()]);
    assert_eq!(line, "ok");
    let refused = store.append_events(run.id, &[event_for(&run, 2)], None).await.unwrap_err();
    assert!(matches!(refused, StoreError::NotFound { .. }), "{refused:?}");
    assert!(store.feed(&agentry_memory::FeedQuery::default(), 10).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writer_sees_seqs_stored_by_another_process() {
    sees_seqs_stored_by_another_process("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_writer_sees_seqs_stored_by_another_process() {
    sees_seqs_stored_by_another_process("redb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_writer_sees_a_session_deleted_by_another_process() {
    sees_a_session_deleted_by_another_process("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_writer_sees_a_session_deleted_by_another_process() {
    sees_a_session_deleted_by_another_process("redb").await;
}

/// A real I/O error (the file cannot grow: a file size limit on the child, as a full disk
/// would) fails writes with the reason; once the file can grow again the next write
/// succeeds and nothing acknowledged is lost, without a restart. redb answers every call
/// after one I/O error with "Previous I/O error" until its file is opened again.
fn recovers_from_an_io_error(backend: &str, durability: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("io.{backend}"));
    let output = Command::new(env!("CARGO_BIN_EXE_agentry-workload"))
        .args(["io-error", backend, path.to_str().unwrap(), durability])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.lines().any(|line| line.starts_with("failed ")), "{stdout}");
    assert!(stdout.lines().any(|line| line.starts_with("recovered ")), "{stdout}");
}

#[test]
fn sqlite_recovers_from_an_io_error_without_a_restart() {
    recovers_from_an_io_error("sqlite", "batched");
}

#[test]
fn redb_recovers_from_an_io_error_without_a_restart() {
    recovers_from_an_io_error("redb", "batched");
}

#[test]
fn redb_recovers_from_an_io_error_under_relaxed_durability() {
    recovers_from_an_io_error("redb", "relaxed");
}

/// Processes that open one new store at the same moment all open it: one creates the file,
/// and the others wait for it to be finished instead of refusing it as not yet a store.
fn concurrent_creators_all_open_the_new_store(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..8 {
        let path = dir.path().join(format!("new-{round}.{backend}"));
        let path_text = path.to_str().unwrap();
        let children: Vec<_> = (0..3)
            .map(|_| {
                Command::new(env!("CARGO_BIN_EXE_agentry-workload"))
                    .args(["open", backend, path_text, "batched"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            let line = String::from_utf8(output.stdout).unwrap();
            assert_eq!(line.trim(), "ok", "round {round}: {line}");
        }
    }
}

#[test]
fn redb_concurrent_creators_all_open_the_new_store() {
    concurrent_creators_all_open_the_new_store("redb");
}

#[test]
fn sqlite_concurrent_creators_all_open_the_new_store() {
    concurrent_creators_all_open_the_new_store("sqlite");
}
