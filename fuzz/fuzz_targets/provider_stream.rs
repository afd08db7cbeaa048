//! `cargo fuzz run provider_stream`: see `agentry_benches::fuzz::provider_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentry_benches::fuzz::provider_stream(data);
});
