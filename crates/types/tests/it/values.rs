//! Ids, timestamps, data URIs, finish reasons, turn states and Agno outputs.

use agentry_types::agno::{MemberResponse, RunOutput, TeamRunOutput};
use agentry_types::{
    CancellationReason, DataUri, FinishReason, ModelMessage, RunStatus, SessionId, ThreadId, Timestamp,
    TurnId, TurnMetrics, TurnState, Usage,
};
use proptest::prelude::*;

#[test]
fn ids_are_time_ordered_uuid_v7_strings() {
    let first = SessionId::new();
    let second = SessionId::new();
    assert!(first < second);
    let text = first.to_string();
    assert_eq!(text.len(), 36);
    assert_eq!(&text[14..15], "7", "version 7");
    assert_eq!(serde_json::to_string(&first).unwrap(), format!("\"{text}\""));
    assert_eq!(serde_json::from_str::<SessionId>(&format!("\"{text}\"")).unwrap(), first);
    let error = "not-a-uuid".parse::<TurnId>().unwrap_err();
    assert_eq!(error.to_string(), "invalid turn id: \"not-a-uuid\" is not a UUID");
    assert!(serde_json::from_str::<TurnId>("\"nope\"").is_err());
}

#[test]
fn the_main_thread_is_named_main_and_sub_threads_are_unique() {
    assert!(ThreadId::main().is_main());
    assert_eq!(serde_json::to_string(&ThreadId::main()).unwrap(), "\"main\"");
    let (a, b) = (ThreadId::new_sub_thread(), ThreadId::new_sub_thread());
    assert_ne!(a, b);
    assert!(!a.is_main());
    assert!(ThreadId::parse("").is_err());
}

#[test]
fn a_message_splits_into_deltas_of_whole_characters() {
    let message = ModelMessage {
        content: Some("héllo wörld".into()),
        finish_reason: Some(FinishReason::Stop),
        ..ModelMessage::default()
    };
    let pieces: Vec<Option<String>> = message.to_deltas(2).into_iter().map(|delta| delta.content).collect();
    let expected = ["hé", "ll", "o ", "wö", "rl", "d"].map(|piece| Some(piece.to_owned()));
    assert_eq!(pieces[..6], expected);
    assert_eq!(pieces.len(), 7, "the last delta carries the finish reason");
    let whole: Vec<Option<String>> = message.to_deltas(100).into_iter().map(|delta| delta.content).collect();
    assert_eq!(whole[0].as_deref(), Some("héllo wörld"));
}

#[test]
fn adding_a_duration_stops_at_the_latest_instant_that_reads_back() {
    let now = Timestamp::now();
    let far = now.saturating_add(std::time::Duration::MAX);
    assert_eq!(far, Timestamp::MAX);
    assert_eq!(far.to_rfc3339(), "9999-12-31T23:59:59.999999Z");
    assert_eq!(far.to_rfc3339().parse::<Timestamp>().unwrap(), far);
    let year = now.saturating_add(std::time::Duration::from_secs(365 * 24 * 3600));
    assert_eq!(year.unix_seconds() - now.unix_seconds(), 365 * 24 * 3600);
}

#[test]
fn timestamps_render_in_each_vocabulary_unit() {
    let at = Timestamp::from_unix_micros(1_739_850_000_123_456);
    assert_eq!(at.to_rfc3339(), "2025-02-18T03:40:00.123456Z");
    assert_eq!(at.unix_millis(), 1_739_850_000_123);
    assert_eq!(at.unix_seconds(), 1_739_850_000);
    assert_eq!("2025-02-18T04:40:00.123456+01:00".parse::<Timestamp>().unwrap(), at);
    assert_eq!(Timestamp::from_unix_micros(-1).to_rfc3339(), "1969-12-31T23:59:59.999999Z");
    assert!("yesterday".parse::<Timestamp>().is_err());
}

/// RFC 3339 writes years 0 to 9999 only: an instant outside them is brought to the nearest
/// one inside, so a record stored with it reads back (a year 10000 did not parse).
#[test]
fn every_timestamp_reads_back_from_what_it_writes() {
    let cases = [
        (i64::MAX, "9999-12-31T23:59:59.999999Z"),
        (253_402_300_800_000_001, "9999-12-31T23:59:59.999999Z"),
        (i64::MIN, "0000-01-01T00:00:00.000000Z"),
        (-62_167_219_200_000_001, "0000-01-01T00:00:00.000000Z"),
    ];
    for (micros, text) in cases {
        let at = Timestamp::from_unix_micros(micros);
        assert_eq!(at.to_rfc3339(), text);
        let json = serde_json::to_string(&at).unwrap();
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), at, "{json}");
    }
    assert_eq!(Timestamp::from_unix_micros(i64::MAX), Timestamp::MAX);
    assert_eq!(Timestamp::from_unix_millis(i64::MIN), Timestamp::MIN);
    // Read from text, an offset can carry a date past either end: refused, not kept.
    for text in ["9999-12-31T23:59:59-01:00", "0000-01-01T00:00:00+01:00"] {
        assert!(text.parse::<Timestamp>().is_err(), "{text}");
        assert!(serde_json::from_str::<Timestamp>(&format!("{text:?}")).is_err(), "{text}");
    }
    assert_eq!(
        "9999-12-31T22:59:59-01:00".parse::<Timestamp>().unwrap().to_rfc3339(),
        "9999-12-31T23:59:59.000000Z"
    );
}

proptest! {
    #[test]
    fn deltas_carry_every_text_in_pieces_of_whole_characters(
        content in ".{0,40}",
        reasoning in ".{0,20}",
        arguments in ".{0,20}",
        chunk in 0usize..10,
    ) {
        let message = ModelMessage {
            content: Some(content.clone()),
            reasoning_content: Some(reasoning.clone()),
            tool_calls: vec![agentry_types::ToolCall::function("c1", "f", arguments.clone())],
            finish_reason: Some(FinishReason::ToolCalls),
            ..ModelMessage::default()
        };
        let deltas = message.to_deltas(chunk);
        // Pieces of `chunk` characters (at least one), the last one possibly shorter.
        let expected = |text: &str| -> Vec<String> {
            let chars: Vec<char> = text.chars().collect();
            chars.chunks(chunk.max(1)).map(|piece| piece.iter().collect()).collect()
        };
        let texts: Vec<String> = deltas.iter().filter_map(|delta| delta.content.clone()).collect();
        prop_assert_eq!(texts, expected(&content));
        let thoughts: Vec<String> = deltas.iter().filter_map(|delta| delta.reasoning_content.clone()).collect();
        prop_assert_eq!(thoughts, expected(&reasoning));
        let pieces: Vec<String> = deltas
            .iter()
            .flat_map(|delta| &delta.tool_calls)
            .filter_map(|call| call.function.as_ref().and_then(|function| function.arguments.clone()))
            .collect();
        prop_assert_eq!(pieces, expected(&arguments));
    }

    #[test]
    fn timestamps_round_trip_through_their_rfc3339_form(micros in -62_000_000_000_000_000i64..253_000_000_000_000_000) {
        let at = Timestamp::from_unix_micros(micros);
        prop_assert_eq!(at.to_rfc3339().parse::<Timestamp>().unwrap(), at);
    }

    #[test]
    fn timestamps_are_written_as_a_calendar_library_writes_them(micros in -62_000_000_000_000_000i64..253_402_300_800_000_000) {
        let at = Timestamp::from_unix_micros(micros);
        let format = time::format_description::parse_borrowed::<2>(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z",
        )
        .unwrap();
        let expected = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1000)
            .unwrap()
            .format(&format)
            .unwrap();
        prop_assert_eq!(at.to_rfc3339(), expected.clone());
        prop_assert_eq!(at.to_string(), expected.clone());
        prop_assert_eq!(serde_json::to_string(&at).unwrap(), format!("\"{expected}\""));
    }

    #[test]
    fn data_uris_round_trip_their_bytes(bytes in proptest::collection::vec(any::<u8>(), 1..200)) {
        let uri = DataUri::encode("application/octet-stream", &bytes).unwrap();
        let parsed = DataUri::parse(uri.as_str()).unwrap();
        prop_assert_eq!(parsed.decode(), bytes);
        prop_assert_eq!(parsed.mime(), "application/octet-stream");
    }

    #[test]
    fn data_uri_parsing_never_panics(text in ".{0,80}") {
        let _ = DataUri::parse(format!("data:{text}"));
        let _ = DataUri::parse(text);
    }
}

#[test]
fn data_uris_expose_their_mime_type_and_hide_their_payload_in_debug_output() {
    let uri = DataUri::parse("data:image/png;charset=x;base64,iVBORw0KGgo=").unwrap();
    assert_eq!(uri.mime(), "image/png");
    assert!(uri.is_image());
    assert_eq!(uri.payload(), "iVBORw0KGgo=");
    assert_eq!(format!("{uri:?}"), "DataUri(image/png, 12 base64 chars)");
}

#[test]
fn unknown_finish_reasons_are_kept() {
    let reason: FinishReason = serde_json::from_str("\"end_turn\"").unwrap();
    assert_eq!(reason, FinishReason::Other("end_turn".into()));
    assert_eq!(serde_json::to_string(&reason).unwrap(), "\"end_turn\"");
    assert_eq!(serde_json::from_str::<FinishReason>("\"tool_calls\"").unwrap(), FinishReason::ToolCalls);
}

#[test]
fn turn_states_serialize_with_a_status_tag_and_map_to_run_statuses() {
    let cancelled = TurnState::Cancelled {
        reason: CancellationReason::ServerExecutionTimeout,
        completed_at: Timestamp::from_unix_micros(0),
        metrics: None,
    };
    let value = serde_json::to_value(&cancelled).unwrap();
    assert_eq!(value["status"], "cancelled");
    assert_eq!(value["reason"], "server-execution-timeout");
    assert_eq!(cancelled.run_status(), RunStatus::Cancelled);
    assert_eq!(TurnState::Running.run_status(), RunStatus::Running);
    assert!(!TurnState::Running.is_terminal());
    assert_eq!(serde_json::to_value(RunStatus::Paused).unwrap(), "PAUSED");
    assert!(RunStatus::Completed.is_terminal() && !RunStatus::Paused.is_terminal());
}

#[test]
fn turn_metrics_sum_usage() {
    let mut metrics = TurnMetrics::default();
    metrics.add(&Usage::new(10, 5));
    metrics.add(&Usage { reasoning_tokens: Some(2), ..Usage::new(1, 1) });
    assert_eq!((metrics.total_input_tokens, metrics.total_output_tokens, metrics.total_tokens), (11, 6, 17));
    assert_eq!(metrics.total_reasoning_tokens, Some(2));
    assert_eq!(metrics.total_cache_read_tokens, None);
}

#[test]
fn team_outputs_nest_member_responses_and_read_them_back_by_shape() {
    let mut member = RunOutput::new(100);
    member.agent_name = Some("researcher".into());
    member.status = RunStatus::Completed;
    let mut nested = TeamRunOutput::new(101);
    nested.team_name = Some("inner".into());
    nested.member_responses.push(MemberResponse::Agent(Box::new(member.clone())));
    let mut outer = TeamRunOutput::new(102);
    outer.member_responses =
        vec![MemberResponse::Agent(Box::new(member)), MemberResponse::Team(Box::new(nested))];
    let json = serde_json::to_value(&outer).unwrap();
    assert_eq!(json["member_responses"][1]["member_responses"][0]["agent_name"], "researcher");
    assert_eq!(json["content_type"], "str");
    let back: TeamRunOutput = serde_json::from_value(json).unwrap();
    assert_eq!(back, outer);
    assert!(matches!(back.member_responses[1], MemberResponse::Team(_)));
}

#[test]
fn an_empty_thread_id_is_refused_when_read_from_json() {
    assert!(serde_json::from_str::<ThreadId>("\"\"").is_err());
    assert_eq!(serde_json::from_str::<ThreadId>("\"main\"").unwrap(), ThreadId::main());
}

#[test]
fn cancellation_reasons_spell_the_same_in_json_and_as_strings() {
    for reason in [
        CancellationReason::ClientCancelled,
        CancellationReason::ServerExecutionTimeout,
        CancellationReason::CancelledForNextTurn,
        CancellationReason::Abandoned,
    ] {
        assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
    }
}
