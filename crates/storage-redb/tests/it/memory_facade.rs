//! The Memory facade over this backend: a paused run checkpointed by one store instance is
//! loaded and resumed by a second instance opened on the same file.

use std::sync::Arc;

use agentry_memory::{Memory, MemoryConfig, Store};
use agentry_storage_redb::{RedbOptions, RedbStore};
use agentry_types::agno::{MemberResponse, RunOutput};
use agentry_types::{Message, RunStatus, SessionType, TurnId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_saved_by_one_instance_is_resumed_by_another_on_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.redb");
    let first: Arc<dyn Store> = Arc::new(RedbStore::open(&path, RedbOptions::default()).unwrap());
    let config = MemoryConfig { full_session_memory: true, ..MemoryConfig::default() };
    let memory = Memory::new(first.clone(), None, config.clone()).unwrap();
    let mut run = RunOutput::new(1_800_000_000);
    run.run_id = Some(TurnId::new().to_string());
    run.agent_id = Some("mailer".into());
    run.status = RunStatus::Paused;
    run.messages = Some(vec![Message::user("email the report"), Message::assistant("needs approval")]);
    let saved = memory
        .save_session(&MemberResponse::Agent(Box::new(run.clone())), SessionType::Agent, None)
        .await
        .unwrap();
    drop(first);

    let second: Arc<dyn Store> = Arc::new(RedbStore::open(&path, RedbOptions::default()).unwrap());
    let resumed =
        Memory::new(second, None, MemoryConfig { session_id: Some(memory.session_id()), ..config }).unwrap();
    let loaded = resumed
        .load_resumable_run(saved.id, Some("mailer"))
        .await
        .unwrap()
        .expect("the paused run is resumable");
    assert_eq!(loaded.status, RunStatus::Paused);
    let document: RunOutput = serde_json::from_value(loaded.output.unwrap()).unwrap();
    assert_eq!(document, run);
    assert!(resumed.get_messages().await.unwrap().is_empty(), "a checkpoint is not history");

    // Finishing the run on the second instance makes it history.
    let mut finished = run;
    finished.status = RunStatus::Completed;
    resumed.save_session(&MemberResponse::Agent(Box::new(finished)), SessionType::Agent, None).await.unwrap();
    assert_eq!(resumed.get_messages().await.unwrap().len(), 2);
    assert!(resumed.load_resumable_run(saved.id, None).await.unwrap().is_none());
}
