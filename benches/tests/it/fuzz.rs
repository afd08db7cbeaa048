//! The fuzz harnesses (`agentry_benches::fuzz`) on their seed corpora, and on mutations of
//! the seeds and random bytes: what libFuzzer does with `cargo fuzz`, in small, on every
//! test run.

use std::path::{Path, PathBuf};

use agentry_benches::fuzz::{HARNESSES, Harness};

/// Mutations tried per seed, and random inputs per harness.
const MUTATIONS: usize = 150;
const RANDOM_INPUTS: usize = 300;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut seeds: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    seeds.sort();
    seeds
}

/// A small deterministic generator (xorshift64*), so a failure repeats.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: usize) -> usize {
        usize::try_from(self.next() % bound.max(1) as u64).unwrap()
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        // Bytes the parsers care about, and any byte.
        const SPECIAL: &[u8] = b"{}[]\":,\\ \n\r0123456789-.eEtrufalsn=#data:[DONE]";
        (0..len)
            .map(|_| if self.below(2) == 0 { SPECIAL[self.below(SPECIAL.len())] } else { self.next() as u8 })
            .collect()
    }

    /// `seed` changed the way fuzzers change inputs: bytes overwritten, inserted, removed,
    /// repeated, the input cut short, or spliced with another seed.
    fn mutate(&mut self, seed: &[u8], other: &[u8]) -> Vec<u8> {
        let mut input = seed.to_vec();
        for _ in 0..=self.below(4) {
            let at = self.below(input.len() + 1);
            match self.below(6) {
                0 if !input.is_empty() => {
                    let at = at.min(input.len() - 1);
                    input[at] = self.bytes(1)[0];
                }
                1 => {
                    let len = self.below(8) + 1;
                    let inserted = self.bytes(len);
                    input.splice(at..at, inserted);
                }
                2 => {
                    let end = (at + self.below(16) + 1).min(input.len());
                    input.drain(at..end);
                }
                3 => {
                    let end = (at + self.below(32) + 1).min(input.len());
                    let repeated = input[at..end].to_vec();
                    input.splice(at..at, repeated);
                }
                4 => input.truncate(at),
                _ => {
                    let from = self.below(other.len() + 1);
                    input.truncate(at);
                    input.extend_from_slice(&other[from..]);
                }
            }
        }
        input
    }
}

/// Runs a harness, failing with the input (escaped) when it panics.
fn run(target: &str, harness: Harness, input: &[u8]) -> bool {
    match std::panic::catch_unwind(|| harness(input)) {
        Ok(parsed) => parsed,
        Err(_) => panic!("the {target} harness panicked on {:?}", String::from_utf8_lossy(input)),
    }
}

#[test]
fn every_seed_of_every_fuzz_target_runs_without_a_panic_and_most_get_past_parsing() {
    for (target, harness) in HARNESSES {
        let seeds = corpus(target);
        // Inputs a fuzzer found a panic on belong here too once fixed, parsing or not; the
        // seeds written to reach past the parser must still do.
        let parsed = seeds.iter().filter(|(_, bytes)| run(target, harness, bytes)).count();
        assert!(parsed >= 3, "only {parsed} seeds of fuzz/corpus/{target} get past parsing, fewer than 3");
        assert!(parsed * 2 > seeds.len(), "most seeds of fuzz/corpus/{target} do not get past parsing");
    }
}

#[test]
fn every_harness_has_a_cargo_fuzz_target_that_calls_it_and_nothing_else_is_one() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    let mut targets: Vec<String> = std::fs::read_dir(fuzz.join("fuzz_targets"))
        .unwrap()
        .map(|entry| entry.unwrap().path().file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    targets.sort();
    let mut harnesses: Vec<&str> = HARNESSES.iter().map(|(name, _)| *name).collect();
    harnesses.sort_unstable();
    assert_eq!(targets, harnesses, "fuzz/fuzz_targets/ and agentry_benches::fuzz::HARNESSES differ");
    for name in harnesses {
        let source = std::fs::read_to_string(fuzz.join("fuzz_targets").join(format!("{name}.rs"))).unwrap();
        assert!(
            source.contains(&format!("agentry_benches::fuzz::{name}(data)")),
            "the {name} target calls another harness"
        );
        assert!(manifest.contains(&format!("name = \"{name}\"")), "fuzz/Cargo.toml has no [[bin]] {name}");
    }
}

#[test]
fn mutated_seeds_and_random_bytes_never_make_a_fuzz_harness_panic() {
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    for (target, harness) in HARNESSES {
        let seeds = corpus(target);
        let mut parsed = 0;
        for (index, (_, seed)) in seeds.iter().enumerate() {
            let other = &seeds[(index + 1) % seeds.len()].1;
            for _ in 0..MUTATIONS {
                let input = random.mutate(seed, other);
                parsed += usize::from(run(target, harness, &input));
            }
        }
        for _ in 0..RANDOM_INPUTS {
            let len = random.below(256);
            let input = random.bytes(len);
            run(target, harness, &input);
        }
        // Mutations that still parse reach past the parser: without them this test would
        // only ever exercise the parser's errors.
        assert!(parsed > 0, "no mutated {target} seed got past parsing");
    }
}
