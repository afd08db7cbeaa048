//! Fuzz harnesses (design §10): each takes arbitrary bytes and must return without
//! panicking, whatever they are; each says whether the bytes got past parsing (so tests can
//! check that their seeds reach the code behind it). The cargo-fuzz targets in `fuzz/` call them under
//! libFuzzer; the `fuzz` tests of this crate run them on every test run over the seed
//! corpora in `fuzz/corpus/` and on random and mutated inputs, so a stable toolchain
//! exercises them too.
//!
//! ```
//! agentry_benches::fuzz::turn_input(br#"{"input":[{"type":"user.message","content":"hi"}]}"#);
//! agentry_benches::fuzz::provider_stream(b"\x05data: [DONE]\n\n");
//! ```

use std::pin::Pin;
use std::task::{Context, Poll};

use agentry_events::MessageBuilder;
use agentry_server::Config;
use agentry_types::{EventId, ModelMessageDelta, PendingActions, RequiredActionRecord, TurnInputItem};
use futures_util::Stream;

/// A harness: takes any bytes, says whether they got past parsing.
pub type Harness = fn(&[u8]) -> bool;

/// The harnesses by the names of their fuzz targets and corpus directories.
pub const HARNESSES: [(&str, Harness); 4] = [
    ("turn_input", turn_input),
    ("provider_stream", provider_stream),
    ("delta_merge", delta_merge),
    ("config", config),
];

/// A turn's input as a client sends it, with the required actions the previous turn left.
#[derive(serde::Deserialize)]
struct TurnInputCase {
    #[serde(default)]
    input: Vec<TurnInputItem>,
    #[serde(default)]
    required_actions: Vec<RequiredActionRecord>,
}

/// Input parsing: JSON into a turn's input and the previous turn's required actions,
/// then seed 002's input rules (and the error's message) over them.
pub fn turn_input(data: &[u8]) -> bool {
    let Ok(case) = serde_json::from_slice::<TurnInputCase>(data) else { return false };
    let pending = PendingActions::from_required_actions(&case.required_actions);
    if let Err(error) = agentry_types::validate_turn_input(&case.input, &pending) {
        let _ = error.to_string();
    }
    for item in &case.input {
        let _ = serde_json::to_vec(item);
    }
    true
}

/// Provider stream parsing: the first byte (plus one) is the size of the chunks the rest
/// arrives in, as an HTTP body cut at arbitrary places; the chat-completions SSE parser
/// turns it into deltas, which are then merged into a message as the engine merges them.
pub fn provider_stream(data: &[u8]) -> bool {
    let Some((&size, body)) = data.split_first() else { return false };
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(usize::from(size) + 1).map(|chunk| Ok(chunk.to_vec())).collect();
    let mut deltas = agentry_model::sse_deltas(futures_util::stream::iter(chunks));
    let mut builder = MessageBuilder::new();
    let id = EventId::new();
    let mut parsed = false;
    while let Some(item) = ready(deltas.as_mut()) {
        let Ok(delta) = item else { continue };
        parsed = true;
        if builder.push(id, &delta).is_err() {
            return parsed;
        }
    }
    let _ = builder.build();
    parsed
}

/// Delta merging: a JSON array of deltas, each with the index of the message it belongs to
/// (0 to 3), pushed into the builders of the messages as they come.
pub fn delta_merge(data: &[u8]) -> bool {
    let Ok(deltas) = serde_json::from_slice::<Vec<(u8, ModelMessageDelta)>>(data) else { return false };
    let ids = [EventId::new(), EventId::new(), EventId::new(), EventId::new()];
    let mut builder = MessageBuilder::new();
    for (message, delta) in &deltas {
        let id = ids[usize::from(*message % 4)];
        if builder.check(id, delta).is_ok() {
            let _ = builder.push(id, delta);
            let _ = builder.build_partial();
        } else {
            let _ = builder.build_and_reset();
        }
    }
    let _ = builder.build();
    true
}

/// Configuration parsing: TOML into the server's configuration, and the API keys it
/// names. (Building its agents is left out: a configuration names commands to run.)
pub fn config(data: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(data) else { return false };
    let Ok(config) = Config::parse(text, None) else { return false };
    let _ = config.api_keys();
    let _ = format!("{config:?}");
    true
}

/// The next item of a stream that never waits (its body is in memory): `None` at its end.
///
/// # Panics
///
/// When the stream waits: a parser over bytes in memory has nothing to wait for.
fn ready<T>(mut stream: Pin<&mut (dyn Stream<Item = T> + Send)>) -> Option<T> {
    let mut context = Context::from_waker(futures_util::task::noop_waker_ref());
    match stream.as_mut().poll_next(&mut context) {
        Poll::Ready(item) => item,
        Poll::Pending => panic!("a stream over an in-memory body waited"),
    }
}
