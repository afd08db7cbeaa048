//! Properties: envelopes round-trip through JSON, split messages merge back whole, and
//! sequence numbers stay dense and ordered through the emitter.

use agentry_events::sample;
use agentry_events::{
    EventEnvelope, EventPayload, EventSource, MessageBuilder, TeamContext, TurnEmitter, TurnSequencer,
};
use agentry_types::{
    CancellationReason, EventId, FinishReason, FunctionCallDelta, ModelMessage, ModelMessageDelta, SessionId,
    ThreadId, Timestamp, ToolCall, ToolCallDelta, TurnId, TurnState, Usage,
};
use proptest::collection::vec;
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![".{0,40}", "[a-z ]{0,20}", Just(String::new()), "[\\u{1F600}-\\u{1F64F}é\"\\\\\n]{1,8}"]
}

fn finish_reason() -> impl Strategy<Value = FinishReason> {
    prop_oneof![
        Just(FinishReason::Stop),
        Just(FinishReason::Length),
        Just(FinishReason::ToolCalls),
        "[a-z_]{1,12}".prop_map(|other| FinishReason::from_wire(&other)),
    ]
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    ("call_[a-z0-9]{1,8}", "[a-z_]{1,12}", text())
        .prop_map(|(id, name, arguments)| ToolCall::function(id, name, arguments))
}

fn message() -> impl Strategy<Value = ModelMessage> {
    (
        proptest::option::of(text().prop_filter("non-empty", |t| !t.is_empty())),
        proptest::option::of(text().prop_filter("non-empty", |t| !t.is_empty())),
        vec(tool_call(), 0..4),
        finish_reason(),
        proptest::option::of((0u64..100_000, 0u64..100_000)),
    )
        .prop_map(|(content, reasoning_content, tool_calls, finish_reason, usage)| {
            // Call ids are unique within a message.
            let tool_calls = tool_calls
                .into_iter()
                .enumerate()
                .map(|(index, mut call)| {
                    call.id = format!("{}_{index}", call.id);
                    call
                })
                .collect();
            ModelMessage {
                content,
                reasoning_content,
                tool_calls,
                finish_reason: Some(finish_reason),
                usage: usage.map(|(input, output)| Usage::new(input, output)),
                ..ModelMessage::default()
            }
        })
}

/// Splits a message into deltas at arbitrary points: every text and argument string is cut
/// into pieces whose sizes come from `cuts`.
fn split(message: &ModelMessage, cuts: &[usize]) -> Vec<ModelMessageDelta> {
    let mut cut = cuts.iter().cycle();
    let mut pieces = |text: &str| {
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        let mut start = 0;
        while start < chars.len() {
            let size = (*cut.next().unwrap_or(&1)).max(1);
            let end = (start + size).min(chars.len());
            out.push(chars[start..end].iter().collect::<String>());
            start = end;
        }
        out
    };
    let mut deltas = Vec::new();
    for piece in pieces(message.reasoning_content.as_deref().unwrap_or_default()) {
        deltas.push(ModelMessageDelta { reasoning_content: Some(piece), ..Default::default() });
    }
    for piece in pieces(message.content.as_deref().unwrap_or_default()) {
        deltas.push(ModelMessageDelta::text(piece));
    }
    for (index, call) in message.tool_calls.iter().enumerate() {
        let index = u32::try_from(index).unwrap();
        let arguments = pieces(&call.function.arguments);
        let (first, rest) = arguments.split_first().map_or((None, &[][..]), |(f, r)| (Some(f.clone()), r));
        deltas.push(ModelMessageDelta {
            tool_calls: vec![ToolCallDelta {
                index,
                id: Some(call.id.clone()),
                kind: Some(call.kind),
                function: Some(FunctionCallDelta {
                    name: Some(call.function.name.clone()),
                    arguments: first,
                }),
                tool_info: None,
            }],
            ..Default::default()
        });
        for piece in rest {
            deltas.push(ModelMessageDelta {
                tool_calls: vec![ToolCallDelta {
                    index,
                    function: Some(FunctionCallDelta { name: None, arguments: Some(piece.clone()) }),
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
    }
    deltas.push(ModelMessageDelta {
        finish_reason: message.finish_reason.clone(),
        usage: message.usage,
        ..Default::default()
    });
    deltas
}

fn payload() -> impl Strategy<Value = EventPayload> {
    prop_oneof![
        message().prop_map(EventPayload::ModelMessage),
        (text(), proptest::option::of(finish_reason())).prop_map(|(content, finish_reason)| {
            EventPayload::ModelMessageDelta(ModelMessageDelta {
                content: Some(content),
                finish_reason,
                ..Default::default()
            })
        }),
        ("[a-z_]{1,10}", "[a-z]{1,10}", text(), text(), any::<bool>()).prop_map(
            |(tool_call_id, name, arguments, content, is_error)| EventPayload::ToolResponse {
                tool_call_id,
                name,
                arguments,
                content,
                is_error
            }
        ),
        (text(), text()).prop_map(|(tool, reason)| EventPayload::CapabilityDenied { tool, reason }),
        text().prop_map(|message| EventPayload::TurnDone {
            state: TurnState::Error { message, completed_at: Timestamp::from_unix_micros(1), metrics: None }
        }),
        Just(EventPayload::TurnDone {
            state: TurnState::Cancelled {
                reason: CancellationReason::ServerExecutionTimeout,
                completed_at: Timestamp::from_unix_micros(1_700_000_000_000_000),
                metrics: None
            }
        }),
        Just(EventPayload::MemoryUpdateStarted {}),
        (any::<u32>(), proptest::option::of(text())).prop_map(|(step, observation)| {
            EventPayload::StepCompleted { step, tool_call: None, observation }
        }),
    ]
}

fn envelope() -> impl Strategy<Value = EventEnvelope> {
    (
        any::<u64>(),
        proptest::option::of(prop_oneof![Just(ThreadId::main()), Just(ThreadId::new_sub_thread())]),
        proptest::option::of(("[a-z0-9_]{1,8}", any::<bool>())),
        -62_000_000_000_000_000i64..253_000_000_000_000_000,
        payload(),
    )
        .prop_map(|(seq, thread_id, team, micros, payload)| EventEnvelope {
            event_id: EventId::new(),
            seq,
            session_id: SessionId::new(),
            turn_id: TurnId::new(),
            thread_id,
            team: team.map(|(mission, tool)| TeamContext {
                mission_id: Some(mission),
                source: tool.then_some(EventSource::ToolCall),
                ..TeamContext::default()
            }),
            created_at: Timestamp::from_unix_micros(micros),
            schema_version: agentry_events::SCHEMA_VERSION,
            payload,
        })
}

proptest! {
    #[test]
    fn every_envelope_round_trips_through_json(event in envelope()) {
        let json = serde_json::to_string(&event).unwrap();
        let back: EventEnvelope = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(back, event);
    }

    #[test]
    fn a_message_split_at_arbitrary_points_merges_back_to_the_original(
        message in message(),
        cuts in vec(1usize..12, 1..8),
    ) {
        let id = EventId::new();
        let mut builder = MessageBuilder::new();
        for delta in split(&message, &cuts) {
            builder.push(id, &delta).unwrap();
        }
        prop_assert_eq!(builder.build().unwrap(), message);
    }

    #[test]
    fn sequence_numbers_stay_dense_and_ordered_through_the_emitter(
        messages in vec((message(), vec(1usize..6, 1..4)), 1..4),
        order in vec(0usize..4, 0..200),
        durable_between in vec(any::<bool>(), 0..200),
    ) {
        // Each thread streams one message; the threads interleave in the order drawn.
        let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
        let threads: Vec<ThreadId> = messages.iter().map(|_| ThreadId::new_sub_thread()).collect();
        let ids: Vec<EventId> = messages.iter().map(|_| EventId::new()).collect();
        let mut queues: Vec<std::collections::VecDeque<ModelMessageDelta>> =
            messages.iter().map(|(message, cuts)| split(message, cuts).into()).collect();
        let mut emitted: Vec<EventEnvelope> = Vec::new();
        let mut picks = order.iter().chain(std::iter::repeat(&0)).zip(durable_between.iter().chain(std::iter::repeat(&false)));
        while queues.iter().any(|queue| !queue.is_empty()) {
            let (pick, durable) = picks.next().unwrap();
            let open: Vec<usize> = (0..queues.len()).filter(|i| !queues[*i].is_empty()).collect();
            let thread = open[pick % open.len()];
            if *durable {
                emitted.push(emitter.emit(Some(threads[thread].clone()), EventPayload::MemoryUpdateStarted {}));
            }
            let delta = queues[thread].pop_front().unwrap();
            let emission = emitter.delta(threads[thread].clone(), ids[thread], delta).unwrap();
            emitted.push(emission.delta);
            if let Some(message) = emission.message {
                emitted.push(message);
            }
        }
        let seqs: Vec<u64> = emitted.iter().map(|event| event.seq).collect();
        let expected: Vec<u64> = (1..=u64::try_from(emitted.len()).unwrap()).collect();
        prop_assert_eq!(&seqs, &expected, "seq is dense from 1 and in emission order");
        let durable: Vec<u64> = emitted.iter().filter(|e| e.is_durable()).map(|e| e.seq).collect();
        prop_assert!(durable.windows(2).all(|pair| pair[0] < pair[1]), "stored seqs strictly increase");
        // Each thread's message is complete and equals what was streamed.
        for (index, (original, _)) in messages.iter().enumerate() {
            let built = emitted.iter().find_map(|event| match &event.payload {
                EventPayload::ModelMessage(message) if event.event_id == ids[index] => Some(message.clone()),
                _ => None,
            });
            prop_assert_eq!(built.as_ref(), Some(original));
        }
    }
}

#[test]
fn every_sample_event_round_trips_through_json() {
    let mut kinds = std::collections::BTreeSet::new();
    for event in sample::all_turns().unwrap().into_iter().flatten() {
        kinds.insert(event.kind());
        let json = serde_json::to_vec(&event).unwrap();
        let back: EventEnvelope = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, event);
    }
    // Every canonical event kind appears in the samples.
    assert_eq!(kinds.len(), 32, "sample kinds: {kinds:?}");
}

#[test]
fn the_sample_splitter_and_the_builder_agree() {
    let message = ModelMessage {
        content: Some("héllo wörld".into()),
        reasoning_content: Some("hmm".into()),
        tool_calls: vec![ToolCall::function("c1", "f", "{\"a\":1}")],
        finish_reason: Some(FinishReason::ToolCalls),
        usage: Some(Usage::new(3, 4)),
        ..ModelMessage::default()
    };
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    for delta in message.to_deltas(2) {
        builder.push(id, &delta).unwrap();
    }
    assert_eq!(builder.build().unwrap(), message);
}

fn arbitrary_delta() -> impl Strategy<Value = ModelMessageDelta> {
    let chunk = (
        prop_oneof![0u32..4, any::<u32>()],
        proptest::option::of("[a-c]{0,2}"),
        proptest::option::of("[fg]{0,1}"),
        proptest::option::of(".{0,4}"),
    )
        .prop_map(|(index, id, name, arguments)| ToolCallDelta {
            index,
            id,
            kind: None,
            function: Some(FunctionCallDelta { name, arguments }),
            tool_info: None,
        });
    (proptest::option::of(".{0,4}"), vec(chunk, 0..3), proptest::option::of(Just(FinishReason::Stop)))
        .prop_map(|(content, tool_calls, finish_reason)| ModelMessageDelta {
            content,
            tool_calls,
            finish_reason,
            ..Default::default()
        })
}

proptest! {
    #[test]
    fn arbitrary_deltas_give_typed_errors_and_never_panic(
        deltas in vec((0usize..3, arbitrary_delta()), 0..30),
    ) {
        let ids = [EventId::new(), EventId::new(), EventId::new()];
        let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
        let mut last_seq = 0;
        for (which, delta) in deltas {
            match emitter.delta(ThreadId::main(), ids[which], delta) {
                Ok(emission) => {
                    prop_assert_eq!(emission.delta.seq, last_seq + 1);
                    last_seq = emission.message.as_ref().map_or(emission.delta.seq, |m| m.seq);
                }
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
            prop_assert_eq!(emitter.sequencer().last_seq(), last_seq, "a refused delta takes no number");
        }
        let _ = emitter.finish_partial(&ThreadId::main());
    }
}
