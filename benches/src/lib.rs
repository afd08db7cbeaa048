//! Workload drivers shared by the criterion benchmarks in `benches/` (run them with
//! `cargo xtask bench`).
//!
//! ```
//! let events = agentry_benches::sample_events().unwrap();
//! assert!(events.iter().any(|event| event.kind() == "model.message.delta"));
//! let (_, deltas) = agentry_benches::long_answer(10);
//! assert_eq!(deltas.len(), 11);
//! ```

use agentry_events::EventEnvelope;
use agentry_events::sample;
use agentry_types::{EventId, ModelMessage, ModelMessageDelta};

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
