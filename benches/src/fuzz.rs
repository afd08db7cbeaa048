//! Fuzz harnesses (design §10). Each takes arbitrary bytes and returns without panicking,
//! whatever they are, saying whether the bytes got past parsing (so the tests can check
//! that seeds reach the code behind the parser); `delta_merge` also panics when the merged
//! messages break the builders' own rules, as a fuzzer's oracle. The cargo-fuzz targets in
//! `fuzz/` call them under libFuzzer; this crate's `fuzz` tests run them over the seed
//! corpora in `fuzz/corpus/` and over random and mutated inputs on every test run, on a
//! stable toolchain.
//!
//! ```
//! agentry_benches::fuzz::turn_input(br#"{"input":[{"type":"user.message","content":"hi"}]}"#);
//! agentry_benches::fuzz::provider_stream(b"\x05data: [DONE]\n\n");
//! ```

use agentry_events::{MessageBuilder, ThreadMessageBuilders};
use agentry_server::Config;
use agentry_types::{
    EventId, ModelMessageDelta, PendingActions, RequiredActionRecord, ThreadId, TurnInputItem,
};
use futures_util::StreamExt;

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
    let deltas = agentry_model::sse_deltas(futures_util::stream::iter(chunks));
    let items = RUNTIME.with(|runtime| runtime.block_on(deltas.collect::<Vec<_>>()));
    let mut builder = MessageBuilder::new();
    let id = EventId::new();
    let mut parsed = false;
    for delta in items.iter().flatten() {
        parsed = true;
        if builder.push(id, delta).is_err() {
            return parsed;
        }
    }
    let _ = builder.build();
    parsed
}

thread_local! {
    /// Drives the parser's stream: a runtime per fuzzing thread, built once.
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().build().expect("a current-thread runtime builds");
}

/// Delta merging: a JSON array of deltas, each with a selector whose low two bits pick one
/// of four threads and the next two one of four message ids, pushed into
/// [`ThreadMessageBuilders`] as the engine pushes them. Each thread's pushes are checked
/// against a [`MessageBuilder`] of its own: the same deltas refused, the same messages
/// completed, the same partial messages left; and a refused delta changes nothing.
///
/// # Panics
///
/// When the two disagree, or a refused push changed the message, or a message whose last
/// delta was accepted cannot be built: each is a bug of the builders.
pub fn delta_merge(data: &[u8]) -> bool {
    let Ok(deltas) = serde_json::from_slice::<Vec<(u8, ModelMessageDelta)>>(data) else { return false };
    let threads: [ThreadId; 4] = std::array::from_fn(|_| ThreadId::new_sub_thread());
    let ids: [[EventId; 4]; 4] = std::array::from_fn(|_| std::array::from_fn(|_| EventId::new()));
    let mut merged = ThreadMessageBuilders::new();
    let mut models: [MessageBuilder; 4] = Default::default();
    for (selector, delta) in &deltas {
        let (thread, message) = (usize::from(selector & 3), usize::from((selector >> 2) & 3));
        let id = ids[thread][message];
        let model = &mut models[thread];
        let before = model.build_partial();
        let expected = match model.push(id, delta) {
            Err(error) => {
                assert_eq!(model.build_partial(), before, "a refused delta changed the message");
                Err(error)
            }
            Ok(()) if model.is_complete() => Ok(Some(
                model.build_and_reset().expect("an accepted finishing delta leaves a buildable message"),
            )),
            Ok(()) => Ok(None),
        };
        assert_eq!(merged.push(&threads[thread], id, delta), expected, "the thread builders disagree");
    }
    for (thread, model) in threads.iter().zip(&models) {
        let partial = merged.take_partial(thread).map(|(_, message)| message);
        assert_eq!(partial, model.id().map(|_| model.build_partial()), "the partial messages differ");
    }
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
