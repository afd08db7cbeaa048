//! `cargo fuzz run delta_merge`: see `agentry_benches::fuzz::delta_merge`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentry_benches::fuzz::delta_merge(data);
});
