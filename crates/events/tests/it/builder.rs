//! The message builder: merge rules and every refusal.

use agentry_events::{
    EventPayload, MergeError, MessageBuilder, ThreadMessageBuilders, TurnEmitter, TurnSequencer,
};
use agentry_types::{
    EventId, FinishReason, FunctionCallDelta, ModelMessageDelta, SessionId, ThreadId, ToolCallDelta,
    ToolCallKind, ToolInfo, TurnId, Usage,
};

fn chunk(index: u32, id: Option<&str>, name: Option<&str>, arguments: Option<&str>) -> ModelMessageDelta {
    ModelMessageDelta {
        tool_calls: vec![ToolCallDelta {
            index,
            id: id.map(str::to_owned),
            kind: id.map(|_| ToolCallKind::Function),
            function: Some(FunctionCallDelta {
                name: name.map(str::to_owned),
                arguments: arguments.map(str::to_owned),
            }),
            tool_info: None,
        }],
        ..ModelMessageDelta::default()
    }
}

fn finish(reason: FinishReason) -> ModelMessageDelta {
    ModelMessageDelta { finish_reason: Some(reason), ..ModelMessageDelta::default() }
}

#[test]
fn text_reasoning_and_refusal_are_appended_in_order() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder
        .push(id, &ModelMessageDelta { reasoning_content: Some("think ".into()), ..Default::default() })
        .unwrap();
    builder.push(id, &ModelMessageDelta::text("Hel")).unwrap();
    builder.push(id, &ModelMessageDelta::text("")).unwrap();
    builder
        .push(id, &ModelMessageDelta { reasoning_content: Some("more".into()), ..Default::default() })
        .unwrap();
    builder.push(id, &ModelMessageDelta::text("lo")).unwrap();
    builder.push(id, &ModelMessageDelta { refusal: Some("no".into()), ..Default::default() }).unwrap();
    builder.push(id, &finish(FinishReason::Stop)).unwrap();
    let message = builder.build().unwrap();
    assert_eq!(message.content.as_deref(), Some("Hello"));
    assert_eq!(message.reasoning_content.as_deref(), Some("think more"));
    assert_eq!(message.refusal.as_deref(), Some("no"));
    assert_eq!(message.finish_reason, Some(FinishReason::Stop));
}

#[test]
fn empty_text_pieces_leave_content_absent() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder.push(id, &ModelMessageDelta::text("")).unwrap();
    builder.push(id, &finish(FinishReason::Stop)).unwrap();
    assert_eq!(builder.build().unwrap().content, None);
}

#[test]
fn tool_call_chunks_merge_by_index_with_identity_from_the_first_chunk() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    let mut first = chunk(0, Some("call_a"), Some("search"), Some("{\"q\":"));
    first.tool_calls[0].tool_info = Some(ToolInfo::local("search"));
    builder.push(id, &first).unwrap();
    builder.push(id, &chunk(1, Some("call_b"), Some("fetch"), None)).unwrap();
    builder.push(id, &chunk(0, None, None, Some("\"rust\"}"))).unwrap();
    builder.push(id, &chunk(1, Some("call_b"), Some("fetch"), Some("{}"))).unwrap();
    let usage = Usage::new(10, 5);
    builder.push(id, &ModelMessageDelta { usage: Some(Usage::new(1, 1)), ..Default::default() }).unwrap();
    builder.push(id, &ModelMessageDelta { usage: Some(usage), ..finish(FinishReason::ToolCalls) }).unwrap();
    let message = builder.build().unwrap();
    assert_eq!(message.tool_calls.len(), 2);
    assert_eq!(message.tool_calls[0].id, "call_a");
    assert_eq!(message.tool_calls[0].function.name, "search");
    assert_eq!(message.tool_calls[0].function.arguments, "{\"q\":\"rust\"}");
    assert_eq!(message.tool_calls[0].tool_info, Some(ToolInfo::local("search")));
    assert_eq!(message.tool_calls[1].id, "call_b");
    assert_eq!(message.tool_calls[1].function.arguments, "{}");
    assert_eq!(message.usage, Some(usage), "usage is overwritten by the latest delta");
}

#[test]
fn a_delta_with_a_different_id_is_refused_and_changes_nothing() {
    let (id, other) = (EventId::new(), EventId::new());
    let mut builder = MessageBuilder::new();
    builder.push(id, &ModelMessageDelta::text("a")).unwrap();
    let error = builder.push(other, &ModelMessageDelta::text("b")).unwrap_err();
    assert_eq!(error, MergeError::DifferentId { expected: id, got: other });
    builder.push(id, &finish(FinishReason::Stop)).unwrap();
    assert_eq!(builder.build().unwrap().content.as_deref(), Some("a"));
}

#[test]
fn a_chunk_for_an_unknown_index_without_a_name_is_refused() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder.push(id, &chunk(0, Some("call_a"), Some("search"), None)).unwrap();
    let error = builder.push(id, &chunk(3, None, None, Some("{}"))).unwrap_err();
    assert_eq!(error, MergeError::UnknownToolCallIndex { index: 3 });
    let error = MessageBuilder::new().push(id, &chunk(0, Some("x"), None, Some("{}"))).unwrap_err();
    assert_eq!(error, MergeError::UnknownToolCallIndex { index: 0 });
}

#[test]
fn a_huge_tool_call_index_is_refused_instead_of_allocated() {
    let error =
        MessageBuilder::new().push(EventId::new(), &chunk(u32::MAX, Some("c"), Some("f"), None)).unwrap_err();
    assert_eq!(error, MergeError::ToolCallIndexTooLarge { index: u32::MAX });
}

#[test]
fn conflicting_call_ids_and_names_are_refused() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder.push(id, &chunk(0, Some("call_a"), Some("search"), None)).unwrap();
    assert!(matches!(
        builder.push(id, &chunk(0, Some("call_z"), None, None)),
        Err(MergeError::ConflictingToolCallId { index: 0, .. })
    ));
    assert!(matches!(
        builder.push(id, &chunk(0, None, Some("other"), None)),
        Err(MergeError::ConflictingToolName { index: 0, .. })
    ));
}

/// Chunks of one delta merge as the same chunks in deltas of their own do: a call opened
/// and continued in one delta merges, and one index opened twice with other names is
/// refused, changing nothing.
#[test]
fn the_chunks_of_one_delta_are_checked_in_turn() {
    let id = EventId::new();
    let mut opened_and_continued = chunk(0, Some("call_a"), Some("get"), Some(""));
    opened_and_continued.tool_calls.extend(chunk(0, None, None, Some("{\"q\":1}")).tool_calls);
    let mut builder = MessageBuilder::new();
    builder.push(id, &opened_and_continued).unwrap();
    builder.push(id, &finish(FinishReason::ToolCalls)).unwrap();
    let message = builder.build().unwrap();
    assert_eq!(message.tool_calls.len(), 1);
    assert_eq!(
        (message.tool_calls[0].function.name.as_str(), message.tool_calls[0].function.arguments.as_str()),
        ("get", "{\"q\":1}")
    );
    let mut opened_twice = chunk(0, Some("call_a"), Some("get"), None);
    opened_twice.tool_calls.extend(chunk(0, None, Some("put"), None).tool_calls);
    let mut builder = MessageBuilder::new();
    assert!(matches!(builder.push(id, &opened_twice), Err(MergeError::ConflictingToolName { index: 0, .. })));
    assert!(builder.is_empty(), "a refused delta changes nothing");
}

#[test]
fn a_finishing_delta_that_would_leave_a_call_without_an_id_is_refused_whole() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder.push(id, &chunk(0, None, Some("search"), Some("{}"))).unwrap();
    let mut last = finish(FinishReason::ToolCalls);
    last.content = Some("late text".into());
    assert_eq!(builder.push(id, &last).unwrap_err(), MergeError::MissingToolCallId { index: 0 });
    assert!(!builder.is_complete(), "the refused delta changed nothing");
    let partial = builder.build_partial().unwrap();
    assert_eq!(partial.content, None, "the refused delta's text was not merged");
    assert!(partial.tool_calls.is_empty(), "a partial build leaves out calls that never got an id");
}

#[test]
fn a_gap_in_tool_call_indexes_is_refused_at_completion() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder.push(id, &chunk(1, Some("call_b"), Some("fetch"), None)).unwrap();
    assert_eq!(
        builder.push(id, &finish(FinishReason::ToolCalls)).unwrap_err(),
        MergeError::MissingToolCall { index: 0 }
    );
}

#[test]
fn deltas_after_the_finish_are_refused() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    builder.push(id, &finish(FinishReason::Stop)).unwrap();
    assert_eq!(builder.push(id, &ModelMessageDelta::text("x")).unwrap_err(), MergeError::AfterFinish { id });
}

#[test]
fn building_before_the_finish_is_an_error_but_a_partial_build_is_not() {
    let id = EventId::new();
    let mut builder = MessageBuilder::new();
    assert_eq!(builder.build().unwrap_err(), MergeError::Empty);
    builder.push(id, &ModelMessageDelta::text("half")).unwrap();
    assert_eq!(builder.build().unwrap_err(), MergeError::Incomplete { id });
    let partial = builder.build_partial().unwrap();
    assert_eq!(partial.content.as_deref(), Some("half"));
    assert_eq!(partial.finish_reason, None);
}

#[test]
fn threads_build_their_messages_independently() {
    let (main, sub) = (ThreadId::main(), ThreadId::new_sub_thread());
    let (a, b) = (EventId::new(), EventId::new());
    let mut builders = ThreadMessageBuilders::new();
    assert!(builders.push(&main, a, &ModelMessageDelta::text("main ")).unwrap().is_none());
    assert!(builders.push(&sub, b, &ModelMessageDelta::text("sub")).unwrap().is_none());
    assert!(builders.push(&main, b, &ModelMessageDelta::text("x")).is_err(), "ids are checked per thread");
    let sub_done = builders.push(&sub, b, &finish(FinishReason::Stop)).unwrap().unwrap();
    assert_eq!(sub_done.content.as_deref(), Some("sub"));
    let main_done = builders.push(&main, a, &ModelMessageDelta::text("done")).unwrap();
    assert!(main_done.is_none());
    let main_done = builders.push(&main, a, &finish(FinishReason::Stop)).unwrap().unwrap();
    assert_eq!(main_done.content.as_deref(), Some("main done"));
    assert_eq!(builders.open_threads().count(), 0);
}

#[test]
fn a_refused_delta_consumes_no_sequence_number() {
    let mut emitter = TurnEmitter::new(TurnSequencer::new(SessionId::new(), TurnId::new()));
    let (id, other) = (EventId::new(), EventId::new());
    assert_eq!(emitter.delta(ThreadId::main(), id, ModelMessageDelta::text("a")).unwrap().delta.seq, 1);
    assert!(emitter.delta(ThreadId::main(), other, ModelMessageDelta::text("b")).is_err());
    let done = emitter.delta(ThreadId::main(), id, finish(FinishReason::Stop)).unwrap();
    assert_eq!(done.delta.seq, 2);
    let message = done.message.unwrap();
    assert_eq!(message.seq, 3);
    assert_eq!(message.event_id, id, "the message shares its deltas' id");
    assert!(matches!(message.payload, EventPayload::ModelMessage(_)));
}

#[test]
fn a_cancelled_stream_leaves_its_partial_message() {
    let mut emitter = TurnEmitter::new(TurnSequencer::resuming_after(SessionId::new(), TurnId::new(), 41));
    let id = EventId::new();
    let first = emitter.delta(ThreadId::main(), id, ModelMessageDelta::text("Once upon")).unwrap();
    assert_eq!(first.delta.seq, 42, "a recovered turn continues above its high-water mark");
    assert_eq!(emitter.open_threads(), vec![ThreadId::main()]);
    let partial = emitter.finish_partial(&ThreadId::main()).unwrap();
    assert_eq!(partial.seq, 43);
    assert_eq!(partial.created_at, first.delta.created_at, "a message is timed by its first delta");
    let EventPayload::ModelMessage(message) = partial.payload else { panic!("expected a model.message") };
    assert_eq!(message.content.as_deref(), Some("Once upon"));
    assert!(emitter.finish_partial(&ThreadId::main()).is_none());
}
