//! The canonical event stream of Agentry and its renderings.
//!
//! Every turn produces one typed stream of [`EventEnvelope`]s: identity, a per-turn `seq`,
//! the session, turn and thread, optional team context, and an [`EventPayload`]. Durable
//! events are persisted; `model.message.delta`s are only streamed, and the
//! [`MessageBuilder`] merges them into the `model.message` that is. A [`TurnSequencer`]
//! numbers a turn's events; a [`TurnEmitter`] pairs it with per-thread builders.
//!
//! Every external vocabulary is a pure rendering of the canonical stream ([`render`]):
//! the harness API, agent-team frames, Agno `TeamRun*` events, AdalFlow run items and
//! AG-UI. Only this crate decides how an event looks on the wire.
//!
//! ```
//! use agentry_events::{render::harness, EventPayload, TurnEmitter, TurnSequencer};
//! use agentry_types::{EventId, FinishReason, ModelMessageDelta, SessionId, ThreadId, TurnId};
//!
//! let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
//! let message_id = EventId::new();
//! let first = emitter.delta(ThreadId::main(), message_id, ModelMessageDelta::text("Hel")).unwrap();
//! assert_eq!(first.delta.seq, 1);
//! assert!(first.message.is_none());
//!
//! let last = ModelMessageDelta { finish_reason: Some(FinishReason::Stop), ..ModelMessageDelta::text("lo") };
//! let done = emitter.delta(ThreadId::main(), message_id, last).unwrap();
//! let message = done.message.unwrap();
//! assert_eq!(message.seq, 3);
//! let EventPayload::ModelMessage(merged) = &message.payload else { unreachable!() };
//! assert_eq!(merged.content.as_deref(), Some("Hello"));
//!
//! let wire = harness::render(&message).unwrap();
//! assert_eq!(wire.kind(), "model.message");
//! ```

mod builder;
mod envelope;
mod payload;
pub mod render;
#[cfg(feature = "sample")]
pub mod sample;
pub mod schema;
mod sequencer;

pub use builder::{MAX_TOOL_CALL_INDEX, MergeError, MessageBuilder, ThreadMessageBuilders};
pub use envelope::{EventEnvelope, EventSource, SCHEMA_VERSION, TeamContext};
pub use payload::{
    Durability, EventPayload, McpServerSession, McpTransport, SPAWN_DENIED_PREFIX, ThreadAgent,
    ThreadOutcome, ThreadParent, spawn_denial_result,
};
pub use sequencer::{DeltaEmission, TurnEmitter, TurnSequencer};
