//! Workload drivers shared by the criterion benchmarks in `benches/`.

use agentry_events::EventEnvelope;
use agentry_events::sample;
use agentry_types::{EventId, ModelMessage, ModelMessageDelta};

/// Every event of every sample turn, in stream order (deltas included).
#[must_use]
pub fn sample_events() -> Vec<EventEnvelope> {
    sample::all_turns().into_iter().flatten().collect()
}

/// A long streamed answer: `pieces` text deltas of 6 characters and a finishing delta.
#[must_use]
pub fn long_answer(pieces: usize) -> (EventId, Vec<ModelMessageDelta>) {
    let message = ModelMessage {
        content: Some("token ".repeat(pieces)),
        finish_reason: Some(agentry_types::FinishReason::Stop),
        ..ModelMessage::default()
    };
    (EventId::new(), sample::deltas_of(&message, 6))
}
