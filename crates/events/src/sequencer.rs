//! Numbering a turn's events: one [`TurnSequencer`] per running turn assigns `seq`, and a
//! [`TurnEmitter`] pairs it with the message builders so a completed message is numbered
//! right after the delta that completed it.
//!
//! These are pure: storing and publishing the envelopes, in `seq` order, is the caller's
//! job (the runner's sequencer task).

use std::collections::HashMap;

use agentry_types::{EventId, ModelMessageDelta, SessionId, ThreadId, Timestamp, TurnId};

use crate::builder::{MergeError, ThreadMessageBuilders};
use crate::envelope::{EventEnvelope, SCHEMA_VERSION, TeamContext};
use crate::payload::EventPayload;

/// Assigns strictly increasing, dense `seq` numbers to a turn's events.
#[derive(Debug, Clone)]
pub struct TurnSequencer {
    session_id: SessionId,
    turn_id: TurnId,
    last_seq: u64,
}

impl TurnSequencer {
    /// A sequencer for a new turn: the first event gets `seq` 1.
    #[must_use]
    pub const fn new(session_id: SessionId, turn_id: TurnId) -> Self {
        Self::resuming_after(session_id, turn_id, 0)
    }

    /// A sequencer continuing a turn whose issued numbers reached `last_seq` (for a turn
    /// recovered after a crash, its durable high-water mark).
    #[must_use]
    pub const fn resuming_after(session_id: SessionId, turn_id: TurnId, last_seq: u64) -> Self {
        Self { session_id, turn_id, last_seq }
    }

    /// The last number issued (0 before the first event).
    #[must_use]
    pub const fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The session.
    #[must_use]
    pub const fn session_id(&self) -> SessionId {
        self.session_id
    }

    /// The turn.
    #[must_use]
    pub const fn turn_id(&self) -> TurnId {
        self.turn_id
    }

    /// Numbers a new event with a fresh id and the current time.
    pub fn emit(&mut self, thread_id: Option<ThreadId>, payload: EventPayload) -> EventEnvelope {
        self.emit_with(EventId::new(), thread_id, None, Timestamp::now(), payload)
    }

    /// Numbers an event with a given id, team context and time.
    pub fn emit_with(
        &mut self,
        event_id: EventId,
        thread_id: Option<ThreadId>,
        team: Option<TeamContext>,
        created_at: Timestamp,
        payload: EventPayload,
    ) -> EventEnvelope {
        self.last_seq += 1;
        EventEnvelope {
            event_id,
            seq: self.last_seq,
            session_id: self.session_id,
            turn_id: self.turn_id,
            thread_id,
            team,
            created_at,
            schema_version: SCHEMA_VERSION,
            payload,
        }
    }
}

/// The envelopes one delta produces: the delta itself, and the complete message when the
/// delta finished it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaEmission {
    /// The numbered delta.
    pub delta: EventEnvelope,
    /// The numbered `model.message`, when this delta completed it.
    pub message: Option<EventEnvelope>,
}

/// A turn's sequencer together with its per-thread message builders.
#[derive(Debug, Clone)]
pub struct TurnEmitter {
    sequencer: TurnSequencer,
    builders: ThreadMessageBuilders,
    /// When each thread's message in progress began: a message is timed by its first delta.
    started: HashMap<ThreadId, Timestamp>,
}

impl TurnEmitter {
    /// An emitter over a sequencer.
    #[must_use]
    pub fn new(sequencer: TurnSequencer) -> Self {
        Self { sequencer, builders: ThreadMessageBuilders::new(), started: HashMap::new() }
    }

    /// The sequencer inside.
    #[must_use]
    pub const fn sequencer(&self) -> &TurnSequencer {
        &self.sequencer
    }

    /// Numbers a non-delta event. A streamed model message goes through
    /// [`TurnEmitter::delta`]; a complete message from a provider that does not stream may
    /// be emitted here directly.
    pub fn emit(&mut self, thread_id: Option<ThreadId>, payload: EventPayload) -> EventEnvelope {
        self.sequencer.emit(thread_id, payload)
    }

    /// Numbers an agent-team event with its team context.
    pub fn emit_team(
        &mut self,
        thread_id: Option<ThreadId>,
        team: TeamContext,
        payload: EventPayload,
    ) -> EventEnvelope {
        self.sequencer.emit_with(EventId::new(), thread_id, Some(team), Timestamp::now(), payload)
    }

    /// Numbers a delta of message `message_id` on `thread_id`, and the complete message
    /// when the delta finishes it. A delta that cannot merge is refused before it is
    /// numbered, so a refusal consumes no `seq`. The message carries the time of its first
    /// delta, as a client merging the deltas would give it.
    pub fn delta(
        &mut self,
        thread_id: ThreadId,
        message_id: EventId,
        delta: ModelMessageDelta,
    ) -> Result<DeltaEmission, MergeError> {
        let completed = self.builders.push(&thread_id, message_id, &delta)?;
        let now = Timestamp::now();
        let started = *self.started.entry(thread_id.clone()).or_insert(now);
        let delta = self.sequencer.emit_with(
            message_id,
            Some(thread_id.clone()),
            None,
            now,
            EventPayload::ModelMessageDelta(delta),
        );
        let message = completed.map(|message| {
            self.started.remove(&thread_id);
            self.sequencer.emit_with(
                message_id,
                Some(thread_id),
                None,
                started,
                EventPayload::ModelMessage(message),
            )
        });
        Ok(DeltaEmission { delta, message })
    }

    /// Ends the unfinished message of a thread (on cancellation or error): numbers and
    /// returns what was built so far as a `model.message`, if anything was.
    pub fn finish_partial(&mut self, thread_id: &ThreadId) -> Option<EventEnvelope> {
        let started = self.started.remove(thread_id).unwrap_or_else(Timestamp::now);
        let (id, message) = self.builders.take_partial(thread_id)?;
        let message = message.ok()?;
        Some(self.sequencer.emit_with(
            id,
            Some(thread_id.clone()),
            None,
            started,
            EventPayload::ModelMessage(message),
        ))
    }

    /// The threads with a message still streaming.
    pub fn open_threads(&self) -> Vec<ThreadId> {
        self.builders.open_threads().cloned().collect()
    }
}
