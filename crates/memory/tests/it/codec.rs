//! The stored event format: every event round-trips; damaged bytes are a typed error.

use agentry_events::sample;
use agentry_memory::{StoreError, rules};
use proptest::prelude::*;

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
    let mut unknown = bytes.clone();
    unknown[0] = 99;
    let error = rules::decode_event(&unknown).unwrap_err();
    assert!(error.to_string().contains("unknown format"), "{error}");
}

proptest! {
    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = rules::decode_event(&bytes);
        let mut framed = vec![1u8];
        framed.extend(bytes);
        let _ = rules::decode_event(&framed);
    }
}
