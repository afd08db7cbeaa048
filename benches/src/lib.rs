//! Workload drivers shared by the criterion benchmarks in `benches/`, the
//! `agentry-workload` binary and the crash tests (run the benchmarks with
//! `cargo xtask bench`), and the fuzz harnesses ([`fuzz`]) of the `fuzz/` targets.
//!
//! ```
//! let events = agentry_benches::sample_events().unwrap();
//! assert!(events.iter().any(|event| event.kind() == "model.message.delta"));
//! let (_, deltas) = agentry_benches::long_answer(10);
//! assert_eq!(deltas.len(), 11);
//! ```

pub mod fuzz;
pub mod http;

use std::path::Path;
use std::sync::Arc;

use agentry_events::{EventEnvelope, EventPayload, SCHEMA_VERSION, sample};
use agentry_memory::{Durability, Store, StoreError};
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_storage_redb::{RedbOptions, RedbStore};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_types::{EventId, ModelMessage, ModelMessageDelta, Role, RunRecord, ThreadId, Timestamp, Usage};

/// Every event of every sample turn, in stream order (deltas included).
pub fn sample_events() -> Result<Vec<EventEnvelope>, agentry_events::MergeError> {
    Ok(sample::all_turns()?.into_iter().flatten().collect())
}

/// A long streamed answer: `pieces` text deltas of 6 characters and a finishing delta.
#[must_use]
pub fn long_answer(pieces: usize) -> (EventId, Vec<ModelMessageDelta>) {
    let message = ModelMessage {
        content: Some("token ".repeat(pieces)),
        finish_reason: Some(agentry_types::FinishReason::Stop),
        ..ModelMessage::default()
    };
    (EventId::new(), message.to_deltas(6))
}

/// A typical durable event of a run (a tool result of about 100 bytes) with the given seq.
#[must_use]
pub fn event_for(run: &RunRecord, seq: u64) -> EventEnvelope {
    EventEnvelope {
        event_id: EventId::new(),
        seq,
        session_id: run.session_id,
        turn_id: run.id,
        thread_id: Some(ThreadId::main()),
        team: None,
        created_at: Timestamp::now(),
        schema_version: SCHEMA_VERSION,
        payload: EventPayload::ToolResponse {
            tool_call_id: format!("call_{seq}"),
            name: "calculator".to_owned(),
            arguments: "{\"expression\":\"6 * 7\"}".to_owned(),
            content: "42".to_owned(),
            is_error: false,
        },
    }
}

/// A fresh directory for a benchmark's store under `target/bench-stores`: on the disk the
/// project lives on (not a temporary file system that may be in memory), so syncs cost
/// what they cost. Removed when dropped.
pub fn bench_store_dir() -> std::io::Result<tempfile::TempDir> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-stores");
    std::fs::create_dir_all(&root)?;
    tempfile::tempdir_in(root)
}

/// Opens a store of a backend (`sqlite` or `redb`) at `path`.
pub fn open_store(backend: &str, path: &Path, durability: Durability) -> Result<Arc<dyn Store>, StoreError> {
    match backend {
        "sqlite" => {
            Ok(Arc::new(SqliteStore::open(path, SqliteOptions { durability, ..SqliteOptions::default() })?))
        }
        "redb" => Ok(Arc::new(RedbStore::open(path, RedbOptions { durability, ..RedbOptions::default() })?)),
        other => Err(StoreError::InvalidInput(format!("unknown backend {other:?}: expected sqlite or redb"))),
    }
}

/// The turn the runner benchmarks time: calls `multiply` (6 × 7) when the last message is
/// the user's, answers after the tool result. It keeps no request log, as a real provider
/// keeps none: a kept request would make the engine copy the conversation at its next
/// change.
#[must_use]
pub fn tool_then_answer() -> Arc<ScriptedModel> {
    // Usage as a provider reports it on its last chunk: the runtime reads it, and counting
    // the whole prompt's characters, as the scripted model does when a script gives none,
    // is the stand-in provider's work, not the runtime's.
    let call = ScriptedResponse::tool_call("multiply", &serde_json::json!({"a": 6, "b": 7}))
        .with_usage(Usage::new(60, 18));
    let answer = ScriptedResponse::text("The answer is 42.").with_usage(Usage::new(90, 6));
    let model =
        ScriptedModel::responder(move |request| match request.messages.last().map(|message| message.role) {
            Some(Role::Tool) => answer.clone(),
            _ => call.clone(),
        });
    Arc::new(model.without_request_log())
}
