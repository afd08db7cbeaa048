//! The stored event format: every event round-trips; events stored by earlier builds
//! (format 1) still read; damaged bytes are a typed error.

use agentry_events::{EventEnvelope, EventPayload, sample};
use agentry_memory::{StoreError, conformance, rules};
use proptest::prelude::*;

#[test]
fn events_stored_in_format_1_by_an_earlier_build_still_read() {
    let events = conformance::format_1_events();
    assert!(events.len() > 40, "only {} events in the fixture", events.len());
    for (bytes, event) in events {
        assert_eq!(bytes[0], 1, "the fixture holds format 1 only");
        assert_eq!(rules::decode_event(&bytes).unwrap(), event);
        // Written again, it takes the current format and reads back the same.
        let written = rules::encode_event(&event).unwrap();
        assert_eq!(written[0], 2);
        assert_eq!(rules::decode_event(&written).unwrap(), event);
    }
}

#[test]
fn every_sample_event_round_trips_through_the_stored_format() {
    let mut checked = 0;
    for event in sample::all_turns().unwrap().into_iter().flatten().filter(|event| event.is_durable()) {
        let bytes = rules::encode_event(&event).unwrap();
        assert_eq!(rules::decode_event(&bytes).unwrap(), event);
        checked += 1;
    }
    assert!(checked > 40, "only {checked} durable sample events");
}

#[test]
fn a_truncated_or_unknown_event_is_reported_as_corruption() {
    let event = sample::answer_turn("q", "a").unwrap().remove(0);
    let bytes = rules::encode_event(&event).unwrap();
    for damaged in [&bytes[..0], &bytes[..10], &bytes[..60], &bytes[..bytes.len() - 3]] {
        assert!(matches!(rules::decode_event(damaged), Err(StoreError::Corrupt(_))));
    }
    // The header of format 2 with a damaged payload: its first byte one MessagePack never
    // uses.
    assert!(event.thread_id.is_none() && event.team.is_none());
    let mut damaged = bytes.clone();
    damaged[HEADER] = 0xc1;
    let error = rules::decode_event(&damaged).unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(ref message) if message.contains("payload")), "{error:?}");
    // Bytes after a whole payload (a record that kept another's tail) are damage too.
    let tails: [&[u8]; 8] = [
        &[0x00],
        &[0xc0],
        &[0x92, 0x01, 0x02],
        &[0xc1],
        &[0x91],
        &[0x81],
        &[0xdc, 0x00, 0x05],
        &[0xde, 0x00, 0x01],
    ];
    for tail in tails {
        let mut longer = bytes.clone();
        longer.extend_from_slice(tail);
        let error = rules::decode_event(&longer).unwrap_err();
        assert!(
            matches!(error, StoreError::Corrupt(ref message) if message.contains("after its end")),
            "{error:?}"
        );
    }
    let mut unknown = bytes.clone();
    unknown[0] = 99;
    let error = rules::decode_event(&unknown).unwrap_err();
    assert!(error.to_string().contains("unknown format"), "{error}");
}

/// The header of an event without thread and team context: format, three ids, seq, time,
/// version, the thread flag and length, the team context's length.
const HEADER: usize = 1 + 3 * 16 + 8 + 8 + 4 + 1 + 2 + 4;

/// A turn's first event with a `tool.call.activity` payload whose data is `data`.
fn activity(data: serde_json::Value) -> EventEnvelope {
    let mut event = sample::answer_turn("q", "a").unwrap().remove(0);
    event.payload = EventPayload::ToolCallActivity { tool_call_id: "call_1".to_owned(), data };
    event
}

fn nested_arrays(depth: usize) -> serde_json::Value {
    (0..depth).fold(serde_json::Value::Null, |inner, _| serde_json::Value::Array(vec![inner]))
}

#[test]
fn the_record_nesting_limit_is_what_serde_json_reads() {
    let nested = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let limit = rules::MAX_RECORD_NESTING;
    assert!(serde_json::from_str::<serde_json::Value>(&nested(limit)).is_ok());
    let error = serde_json::from_str::<serde_json::Value>(&nested(limit + 1)).unwrap_err();
    assert!(error.to_string().contains("recursion limit"), "{error}");
}

#[test]
fn an_event_nested_deeper_than_events_are_read_is_refused_when_written() {
    // As deep as serde_json parses JSON input: stored and read back.
    let event = activity(nested_arrays(127));
    assert_eq!(rules::decode_event(&rules::encode_event(&event).unwrap()).unwrap(), event);
    rules::check_event_size(&event).unwrap();
    for depth in [149, 500] {
        let event = activity(nested_arrays(depth));
        let error = rules::encode_event(&event).unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidInput(ref message) if message.contains("levels deep")),
            "{error:?}"
        );
        assert_eq!(rules::check_event_size(&event).unwrap_err(), error);
    }
}

#[test]
fn a_payload_nested_deeper_than_parsed_json_is_corruption_not_a_stack_overflow() {
    let event = activity(serde_json::Value::Null);
    let stored = rules::encode_event(&event).unwrap();
    // The payload ends with its `data`, a nil (0xc0); put nested one-element arrays (0x91
    // each) around it.
    assert_eq!(stored.last(), Some(&0xc0));
    let nested = |depth: usize| {
        let mut bytes = stored[..stored.len() - 1].to_vec();
        bytes.extend(std::iter::repeat_n(0x91, depth));
        bytes.push(0xc0);
        bytes
    };
    // As deep as serde_json parses JSON input.
    let decoded = rules::decode_event(&nested(127)).unwrap();
    let EventPayload::ToolCallActivity { data, .. } = decoded.payload else { panic!("{decoded:?}") };
    assert_eq!(serde_json::to_string(&data).unwrap(), format!("{}null{}", "[".repeat(127), "]".repeat(127)));
    for depth in [400, 100_000] {
        let error = rules::decode_event(&nested(depth)).unwrap_err();
        assert!(matches!(error, StoreError::Corrupt(_)), "{error:?}");
        assert!(error.to_string().contains("depth"), "{error}");
    }
}

proptest! {
    #[test]
    fn a_valid_header_with_an_arbitrary_or_mutated_payload_never_panics(
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let event = activity(serde_json::json!({"rows": [1, 2.5, "three", null, {"x": true}]}));
        let stored = rules::encode_event(&event).unwrap();
        let mut arbitrary = stored[..HEADER].to_vec();
        arbitrary.extend(&tail);
        let _ = rules::decode_event(&arbitrary);
        let mut mutated = stored.clone();
        for (at, byte) in flips {
            let at = HEADER + at.index(mutated.len() - HEADER);
            mutated[at] = byte;
        }
        let _ = rules::decode_event(&mutated);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = rules::decode_event(&bytes);
        for format in [1u8, 2] {
            let mut framed = vec![format];
            framed.extend(&bytes);
            let _ = rules::decode_event(&framed);
        }
    }

    #[test]
    fn any_json_data_round_trips_and_fills_its_record_exactly(data in json_value()) {
        let event = activity(data);
        let stored = rules::encode_event(&event).unwrap();
        prop_assert_eq!(rules::decode_event(&stored).unwrap(), event);
        let mut longer = stored;
        longer.push(0xc0);
        prop_assert!(rules::decode_event(&longer).is_err());
    }
}

/// JSON values of every MessagePack width this side of the huge: small and large integers
/// of both signs, floats, strings up to 300 bytes, arrays and objects a few levels deep.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |x| x.is_finite()).prop_map(Value::from),
        "[a-z\\u{e9}\\u{1F600}]{0,300}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 20, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..20).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{0,20}", inner, 0..20)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

#[test]
fn the_widest_strings_arrays_and_maps_round_trip() {
    let wide: serde_json::Map<String, serde_json::Value> =
        (0..70_000).map(|at| (format!("k{at}"), serde_json::json!(at))).collect();
    for data in [
        serde_json::json!("x".repeat(70_000)),
        serde_json::Value::Array(vec![serde_json::json!(1); 70_000]),
        serde_json::Value::Object(wide),
    ] {
        let event = activity(data);
        assert_eq!(rules::decode_event(&rules::encode_event(&event).unwrap()).unwrap(), event);
    }
}
