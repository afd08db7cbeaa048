//! The message builder: merges `model.message.delta`s into the `model.message` they build.
//!
//! Merge rules: text, reasoning and refusal are appended (empty pieces change nothing);
//! tool-call chunks merge by `index`, `arguments` concatenated, and `id`, `type`, `name`
//! and `tool_info` taken from the first chunk of the index that carries each. A later
//! chunk may repeat an id or name but not change it: where the SDK's `merge_event_delta`
//! lets it overwrite, this builder refuses, because a provider that renames a call
//! mid-stream has sent a broken stream. `finish_reason` and `usage` are overwritten. A
//! delta for a different message id is an error; so is a chunk that opens an unknown index
//! without a name, and a finishing delta that would leave a call without an id. A failed
//! push changes nothing.

use agentry_types::{
    EventId, FunctionCall, ModelMessage, ModelMessageDelta, ThreadId, ToolCall, ToolCallDelta, ToolCallKind,
    ToolInfo,
};
// Keyed by thread ids the runtime made: nothing a client picks to collide.
use foldhash::HashMap;

/// The largest tool-call index accepted; higher ones are refused rather than allocated.
pub const MAX_TOOL_CALL_INDEX: u32 = 1023;

/// Why a delta could not be merged, or a message could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// The delta belongs to another message.
    #[error("delta for message {got} cannot merge into message {expected}")]
    DifferentId {
        /// The message being built.
        expected: EventId,
        /// The delta's message.
        got: EventId,
    },
    /// The message already has its `finish_reason`.
    #[error("message {id} is already complete; no more deltas can merge into it")]
    AfterFinish {
        /// The message.
        id: EventId,
    },
    /// A chunk opens a tool-call index with no name.
    #[error("tool-call chunk for unknown index {index} has no function name")]
    UnknownToolCallIndex {
        /// The index.
        index: u32,
    },
    /// A tool-call index beyond [`MAX_TOOL_CALL_INDEX`].
    #[error("tool-call index {index} exceeds the maximum of {MAX_TOOL_CALL_INDEX}")]
    ToolCallIndexTooLarge {
        /// The index.
        index: u32,
    },
    /// A later chunk names a different call id than the first.
    #[error("tool-call chunk at index {index} has id {got:?}, but the call's id is {first:?}")]
    ConflictingToolCallId {
        /// The index.
        index: u32,
        /// The id from the first chunk.
        first: String,
        /// The id of this chunk.
        got: String,
    },
    /// A later chunk names a different function than the first.
    #[error("tool-call chunk at index {index} names function {got:?}, but the call is to {first:?}")]
    ConflictingToolName {
        /// The index.
        index: u32,
        /// The name from the first chunk.
        first: String,
        /// The name of this chunk.
        got: String,
    },
    /// The message has tool calls at indexes above a missing one.
    #[error("tool call at index {index} never started, but later indexes did")]
    MissingToolCall {
        /// The missing index.
        index: u32,
    },
    /// A tool call never received an id.
    #[error("tool call at index {index} has no id")]
    MissingToolCallId {
        /// The index.
        index: u32,
    },
    /// No delta was merged yet.
    #[error("no delta has been merged")]
    Empty,
    /// The message has no `finish_reason` yet.
    #[error("message {id} is not complete: no delta carried a finish_reason")]
    Incomplete {
        /// The message.
        id: EventId,
    },
}

#[derive(Debug, Clone, Default)]
struct PartialCall {
    id: Option<String>,
    kind: Option<ToolCallKind>,
    name: String,
    arguments: String,
    tool_info: Option<ToolInfo>,
}

impl PartialCall {
    /// The call, once it has an id.
    fn assemble(&self) -> Option<ToolCall> {
        Some(ToolCall {
            id: self.id.clone()?,
            kind: self.kind.unwrap_or_default(),
            function: FunctionCall { name: self.name.clone(), arguments: self.arguments.clone() },
            tool_info: self.tool_info.clone(),
        })
    }
}

/// Builds one model message from its deltas.
#[derive(Debug, Clone, Default)]
pub struct MessageBuilder {
    id: Option<EventId>,
    message: ModelMessage,
    calls: Vec<Option<PartialCall>>,
}

impl MessageBuilder {
    /// An empty builder.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of the message being built, once a delta arrived.
    #[must_use]
    pub const fn id(&self) -> Option<EventId> {
        self.id
    }

    /// Whether a delta with a `finish_reason` has been merged.
    #[must_use]
    pub const fn is_complete(&self) -> bool {
        self.message.finish_reason.is_some()
    }

    /// Whether nothing has been merged.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.id.is_none()
    }

    /// Checks that `delta` (of message `id`) can merge, without changing anything.
    pub fn check(&self, id: EventId, delta: &ModelMessageDelta) -> Result<(), MergeError> {
        if let Some(expected) = self.id {
            if expected != id {
                return Err(MergeError::DifferentId { expected, got: id });
            }
            if self.is_complete() {
                return Err(MergeError::AfterFinish { id });
            }
        }
        if let [chunk] = delta.tool_calls.as_slice() {
            check_chunk(&self.calls, chunk)?;
        } else if !delta.tool_calls.is_empty() {
            // Several chunks in one delta, which may open a call and continue it, or open
            // one index twice: each is checked against the calls as the chunks before it
            // leave them, as if they came in deltas of their own.
            let mut calls = self.calls.clone();
            for chunk in &delta.tool_calls {
                check_chunk(&calls, chunk)?;
                merge_chunk(&mut calls, chunk);
            }
        }
        if delta.finish_reason.is_some() {
            self.check_completes_with(delta)?;
        }
        Ok(())
    }

    /// Checks that, with `delta` merged, every tool-call index up to the highest one has a
    /// call with an id, so completing the message cannot fail half-way.
    fn check_completes_with(&self, delta: &ModelMessageDelta) -> Result<(), MergeError> {
        let highest = delta.tool_calls.iter().map(|chunk| chunk.index as usize + 1).max().unwrap_or(0);
        for slot in 0..self.calls.len().max(highest) {
            let index = u32::try_from(slot).unwrap_or(u32::MAX);
            let existing = self.calls.get(slot).and_then(Option::as_ref);
            let chunks = || delta.tool_calls.iter().filter(|chunk| chunk.index as usize == slot);
            if existing.is_none() && chunks().next().is_none() {
                return Err(MergeError::MissingToolCall { index });
            }
            let has_id = existing.is_some_and(|call| call.id.is_some())
                || chunks().any(|chunk| chunk.id.as_deref().is_some_and(|id| !id.is_empty()));
            if !has_id {
                return Err(MergeError::MissingToolCallId { index });
            }
        }
        Ok(())
    }
    /// Merges a delta of message `id`. On error nothing changes.
    pub fn push(&mut self, id: EventId, delta: &ModelMessageDelta) -> Result<(), MergeError> {
        self.check(id, delta)?;
        self.apply(id, delta);
        Ok(())
    }

    /// Merges a delta that [`MessageBuilder::check`] accepted.
    fn apply(&mut self, id: EventId, delta: &ModelMessageDelta) {
        self.id = Some(id);
        append(&mut self.message.content, delta.content.as_deref());
        append(&mut self.message.reasoning_content, delta.reasoning_content.as_deref());
        append(&mut self.message.refusal, delta.refusal.as_deref());
        for chunk in &delta.tool_calls {
            merge_chunk(&mut self.calls, chunk);
        }
        if let Some(reason) = &delta.finish_reason {
            self.message.finish_reason = Some(reason.clone());
        }
        if let Some(usage) = delta.usage {
            self.message.usage = Some(usage);
        }
    }
    /// The message built so far, complete or not: what a cancelled stream leaves. Tool
    /// calls that never received their id are left out.
    pub fn build_partial(&self) -> Result<ModelMessage, MergeError> {
        if self.id.is_none() {
            return Err(MergeError::Empty);
        }
        let mut message = self.message.clone();
        message.tool_calls = self.calls.iter().flatten().filter_map(PartialCall::assemble).collect();
        Ok(message)
    }

    /// The complete message. Fails when no delta carried a `finish_reason`.
    pub fn build(&self) -> Result<ModelMessage, MergeError> {
        let id = self.id.ok_or(MergeError::Empty)?;
        if !self.is_complete() {
            return Err(MergeError::Incomplete { id });
        }
        let mut message = self.message.clone();
        message.tool_calls = Vec::with_capacity(self.calls.len());
        for (index, slot) in self.calls.iter().enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let call = slot.as_ref().ok_or(MergeError::MissingToolCall { index })?;
            message.tool_calls.push(call.assemble().ok_or(MergeError::MissingToolCallId { index })?);
        }
        Ok(message)
    }

    /// Builds the complete message and empties the builder for the next one.
    pub fn build_and_reset(&mut self) -> Result<ModelMessage, MergeError> {
        let message = self.build()?;
        *self = Self::default();
        Ok(message)
    }
}

/// Checks that a tool-call chunk can merge into `calls`.
fn check_chunk(calls: &[Option<PartialCall>], chunk: &ToolCallDelta) -> Result<(), MergeError> {
    let index = chunk.index;
    if index > MAX_TOOL_CALL_INDEX {
        return Err(MergeError::ToolCallIndexTooLarge { index });
    }
    let name =
        chunk.function.as_ref().and_then(|function| function.name.as_deref()).filter(|n| !n.is_empty());
    let existing = calls.get(index as usize).and_then(Option::as_ref);
    match existing {
        None if name.is_none() => Err(MergeError::UnknownToolCallIndex { index }),
        None => Ok(()),
        Some(call) => {
            if let (Some(first), Some(got)) = (call.id.as_deref(), chunk.id.as_deref())
                && !got.is_empty()
                && first != got
            {
                return Err(MergeError::ConflictingToolCallId {
                    index,
                    first: first.to_owned(),
                    got: got.to_owned(),
                });
            }
            match name {
                Some(got) if got != call.name => Err(MergeError::ConflictingToolName {
                    index,
                    first: call.name.clone(),
                    got: got.to_owned(),
                }),
                _ => Ok(()),
            }
        }
    }
}

/// Merges a tool-call chunk that [`check_chunk`] accepted into `calls`.
fn merge_chunk(calls: &mut Vec<Option<PartialCall>>, chunk: &ToolCallDelta) {
    let index = chunk.index as usize;
    if calls.len() <= index {
        calls.resize(index + 1, None);
    }
    let slot = &mut calls[index];
    let call = slot.get_or_insert_with(PartialCall::default);
    if call.id.is_none() {
        call.id = chunk.id.clone().filter(|id| !id.is_empty());
    }
    if call.kind.is_none() {
        call.kind = chunk.kind;
    }
    if call.tool_info.is_none() {
        call.tool_info = chunk.tool_info.clone();
    }
    if let Some(function) = &chunk.function {
        if call.name.is_empty()
            && let Some(name) = &function.name
        {
            call.name.clone_from(name);
        }
        if let Some(arguments) = &function.arguments {
            call.arguments.push_str(arguments);
        }
    }
}

fn append(target: &mut Option<String>, piece: Option<&str>) {
    if let Some(piece) = piece.filter(|piece| !piece.is_empty()) {
        target.get_or_insert_with(String::new).push_str(piece);
    }
}

/// One [`MessageBuilder`] per thread: threads stream their messages concurrently.
#[derive(Debug, Clone, Default)]
pub struct ThreadMessageBuilders {
    /// Boxed: a builder is a few hundred bytes, and a table holding them inline is a
    /// large allocation (with glibc, one that consolidates the allocator's free lists).
    builders: HashMap<ThreadId, Box<MessageBuilder>>,
}

impl ThreadMessageBuilders {
    /// No messages in progress.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks that the delta can merge into its thread's message, changing nothing.
    pub fn check(&self, thread: &ThreadId, id: EventId, delta: &ModelMessageDelta) -> Result<(), MergeError> {
        match self.builders.get(thread) {
            Some(builder) => builder.check(id, delta),
            None => MessageBuilder::new().check(id, delta),
        }
    }

    /// Merges a delta into its thread's message. When the delta completes the message,
    /// returns it and starts the thread's next message afresh. On error nothing changes.
    pub fn push(
        &mut self,
        thread: &ThreadId,
        id: EventId,
        delta: &ModelMessageDelta,
    ) -> Result<Option<ModelMessage>, MergeError> {
        self.check(thread, id, delta)?;
        let builder = match self.builders.get_mut(thread) {
            Some(builder) => builder,
            None => self.builders.entry(thread.clone()).or_default(),
        };
        builder.apply(id, delta);
        if !builder.is_complete() {
            return Ok(None);
        }
        // The check above made sure a finishing delta leaves a buildable message.
        let message = builder.build()?;
        self.builders.remove(thread);
        Ok(Some(message))
    }

    /// Removes and returns the unfinished message of a thread, as built so far.
    pub fn take_partial(&mut self, thread: &ThreadId) -> Option<(EventId, Result<ModelMessage, MergeError>)> {
        let builder = *self.builders.remove(thread)?;
        let id = builder.id()?;
        Some((id, builder.build_partial()))
    }

    /// The threads with an unfinished message.
    pub fn open_threads(&self) -> impl Iterator<Item = &ThreadId> {
        self.builders.keys()
    }
}
