//! `cargo fuzz run turn_input`: see `agentry_benches::fuzz::turn_input`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agentry_benches::fuzz::turn_input(data);
});
