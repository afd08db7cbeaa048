//! `cargo xtask fixtures`: renders the sample turns into the wire fixtures that the Python
//! tests (`tests/python/`) parse with the published client libraries.
//!
//! The file holds, under `harness`: every streamed event with its SSE frame (`streaming`),
//! the stored events of each turn as a list-events response (`stored`), every event of the
//! session as a list-session-events response (`session_events`), each turn record
//! (`turns`), and each model message's deltas with the message our builder merged
//! (`merges`); under `agui`: each turn's AG-UI stream, live and replayed from storage.

use agentry_events::render::{agui::AguiRenderer, harness};
use agentry_events::{EventEnvelope, EventPayload, sample};
use agentry_types::{RunRecord, SessionId, Subject, Timestamp, TurnId, TurnInputItem, TurnState};
use anyhow::{Context, Result};
use serde_json::{Value, json};

fn to_value<T: serde::Serialize>(value: &T) -> Result<Value> {
    serde_json::to_value(value).context("serializing a fixture")
}

/// Builds the fixture document.
pub fn build() -> Result<Value> {
    let turns = sample::all_turns()?;
    let mut streaming = Vec::new();
    let mut session_events = Vec::new();
    let mut stored = Vec::new();
    let mut merges = Vec::new();
    let mut records = Vec::new();
    let mut agui = Vec::new();

    for events in &turns {
        let mut deltas: Vec<(agentry_types::EventId, Value)> = Vec::new();
        for event in events {
            let Some(rendered) = harness::render(event) else { continue };
            streaming.push(json!({
                "kind": rendered.kind(),
                "seq": event.seq,
                "sse": harness::sse_frame(event.seq, &rendered),
                "event": to_value(&rendered)?,
            }));
            match &event.payload {
                EventPayload::ModelMessageDelta(_) => deltas.push((event.event_id, to_value(&rendered)?)),
                EventPayload::ModelMessage(_) => {
                    let own: Vec<Value> = deltas
                        .iter()
                        .filter(|(id, _)| *id == event.event_id)
                        .map(|(_, delta)| delta.clone())
                        .collect();
                    // A message cut short by cancellation has no finishing delta to compare.
                    let finished = own.last().is_some_and(|delta| delta.get("finish_reason").is_some());
                    if finished {
                        merges.push(json!({ "deltas": own, "merged": to_value(&rendered)? }));
                    }
                }
                _ => {}
            }
            if event.is_durable() {
                session_events
                    .push(json!({ "turn_id": event.turn_id.to_string(), "event": to_value(&rendered)? }));
                if rendered.is_turn_event() {
                    stored.push(to_value(&rendered)?);
                }
            }
        }
        records.push(to_value(&harness::turn(&record_of(events)))?);
        agui.push(agui_stream(events.iter())?);
        agui.push(agui_stream(events.iter().filter(|event| event.is_durable()))?);
    }
    if let Some(first) = turns.first() {
        let mut running = record_of(first);
        running.set_state(TurnState::Running);
        records.push(to_value(&harness::turn(&running))?);
    }

    Ok(json!({
        "harness": {
            "streaming": streaming,
            "stored": { "data": stored, "pagination": { "limit": 100, "next_page_token": null } },
            "session_events": { "data": session_events, "pagination": { "limit": 100 } },
            "turns": records,
            "merges": merges,
        },
        "agui": agui,
    }))
}

fn agui_stream<'a>(events: impl Iterator<Item = &'a EventEnvelope>) -> Result<Value> {
    let mut renderer = AguiRenderer::new();
    let mut frames = Vec::new();
    for event in events {
        for frame in renderer.render(event) {
            frames.push(to_value(&frame)?);
        }
    }
    Ok(Value::Array(frames))
}

/// The turn record a sample turn's events describe.
fn record_of(events: &[EventEnvelope]) -> RunRecord {
    let first = events.first();
    let (previous_turn_id, input, created_by) = match first.map(|event| &event.payload) {
        Some(EventPayload::TurnCreated { previous_turn_id, input, created_by }) => {
            (*previous_turn_id, input.clone(), created_by.clone())
        }
        _ => (None, Vec::<TurnInputItem>::new(), Subject::user("unknown")),
    };
    let state = events
        .iter()
        .rev()
        .find_map(|event| match &event.payload {
            EventPayload::TurnDone { state } => Some(state.clone()),
            _ => None,
        })
        .unwrap_or(TurnState::Running);
    let mut record =
        RunRecord::new(first.map_or_else(SessionId::new, |event| event.session_id), input, created_by);
    record.id = first.map_or_else(TurnId::new, |event| event.turn_id);
    record.previous_turn_id = previous_turn_id;
    record.created_at = first.map_or_else(Timestamp::now, |event| event.created_at);
    record.set_state(state);
    record
}
