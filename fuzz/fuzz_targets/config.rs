//! `cargo fuzz run config`: see `agentry_benches::fuzz::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentry_benches::fuzz::config(data);
});
