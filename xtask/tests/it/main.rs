//! Tests of the development tasks: the layering table and the tidy checks hold for the
//! workspace, and each check catches what it is for.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;

use xtask::layering::{self, ALLOWED, Edge};
use xtask::{bench, tidy, workspace_root};

#[test]
fn the_workspace_follows_the_layering_table() {
    let violations = layering::violations(&workspace_root()).unwrap();
    assert!(violations.is_empty(), "layering violations:\n{}", violations.join("\n"));
}

#[test]
fn the_layering_check_reads_real_edges_from_cargo_metadata() {
    let (packages, edges) = layering::workspace_edges(&workspace_root()).unwrap();
    assert!(packages.contains("agentry-types") && packages.contains("agentry-events"));
    assert!(edges.iter().any(|edge| edge.from == "agentry-events" && edge.to == "agentry-types"));
    assert!(!edges.iter().any(|edge| edge.from == "agentry-types"), "types depends on no workspace crate");
}

#[test]
fn an_edge_outside_the_table_is_a_violation() {
    let packages: BTreeSet<String> =
        ["agentry-types", "agentry-events"].into_iter().map(str::to_owned).collect();
    let edges =
        vec![Edge { from: "agentry-types".into(), to: "agentry-events".into(), kind: "normal".into() }];
    let violations = layering::check(ALLOWED, &packages, &edges);
    assert_eq!(violations.len(), 1);
    assert!(violations[0].contains("`agentry-types` has a normal dependency on `agentry-events`"));
}

#[test]
fn a_storage_crate_may_not_depend_on_the_runner_or_another_storage_crate() {
    let packages: BTreeSet<String> = ["agentry-storage-sqlite", "agentry-storage-redb", "agentry-runner"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let edges = vec![
        Edge { from: "agentry-storage-sqlite".into(), to: "agentry-runner".into(), kind: "normal".into() },
        Edge { from: "agentry-storage-sqlite".into(), to: "agentry-storage-redb".into(), kind: "dev".into() },
    ];
    assert_eq!(layering::check(ALLOWED, &packages, &edges).len(), 2);
}

#[test]
fn a_crate_missing_from_the_table_is_a_violation() {
    let packages: BTreeSet<String> = ["agentry-gadget".to_owned()].into();
    let violations = layering::check(ALLOWED, &packages, &[]);
    assert_eq!(
        violations,
        ["workspace crate `agentry-gadget` is not in the layering table (xtask/src/layering.rs)"]
    );
}

#[test]
fn the_workspace_is_tidy() {
    let problems = tidy::problems(&workspace_root()).unwrap();
    assert!(problems.is_empty(), "tidy problems:\n{}", problems.join("\n"));
    assert!(tidy::rust_files(&workspace_root()).unwrap().len() > 20, "the check sees the source tree");
}

#[test]
fn tidy_catches_a_missing_module_doc_and_skipped_or_panicking_tests() {
    let path = Path::new("crates/x/src/lib.rs");
    assert!(tidy::problems_in(path, "//! Fine.\nfn main() {}\n").is_empty());
    let problems = tidy::problems_in(path, "fn main() {}\n");
    assert_eq!(problems.len(), 1);
    assert!(problems[0].contains("must start with a `//!` line"));
    let text = format!(
        "//! Tests.\n#[test]\n{}]\nfn skipped() {{}}\n    {}]\nfn panics() {{}}\n",
        concat!("#[", "ignore"),
        concat!("#[", "should_panic")
    );
    let problems = tidy::problems_in(path, &text);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains(":3:"));
}

#[test]
fn the_demo_streams_a_tool_call_turn_as_sse_frames_and_answers() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut out = Vec::new();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(xtask::demo::run("What is 6 * 7?", &dir.path().join("demo.db"), &mut out)).unwrap();
    let text = String::from_utf8(out).unwrap();
    let frames: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let ids: Vec<u64> =
        text.lines().filter_map(|line| line.strip_prefix("id: ")).map(|id| id.parse().unwrap()).collect();
    assert_eq!(ids.first(), Some(&1));
    assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "increasing sequence ids: {ids:?}");
    assert_eq!(frames.first().unwrap()["type"], "turn.created");
    assert_eq!(frames.last().unwrap()["type"], "turn.done");
    assert!(frames.iter().any(|f| f["type"] == "tool.response" && f["content"] == "42"));
    assert!(text.contains("\n: answer: The result is 42.\n"), "{text}");
    assert!(text.contains(": stored: "), "{text}");
}

fn result(name: &str, median_ns: f64, elements: Option<u64>) -> bench::BenchResult {
    bench::BenchResult { name: name.to_owned(), median_ns, elements }
}

#[test]
fn a_target_is_met_missed_or_beyond_the_bare_library_by_this_run_s_medians() {
    let time = bench::Target { bench: "a/b", goal: bench::Goal::AtMostNs(10_000.0), floor: Some("floor/b") };
    assert_eq!(bench::verdict(&time, &[result("a/b", 9_000.0, None)]), bench::Verdict::Met);
    assert_eq!(bench::verdict(&time, &[result("a/b", 11_000.0, None)]), bench::Verdict::Missed);
    let floor_meets = [result("a/b", 11_000.0, None), result("floor/b", 4_000.0, None)];
    assert_eq!(bench::verdict(&time, &floor_meets), bench::Verdict::Missed);
    let floor_misses = [result("a/b", 30_000.0, None), result("floor/b", 12_000.0, None)];
    assert_eq!(bench::verdict(&time, &floor_misses), bench::Verdict::BeyondFloor);
    assert_eq!(bench::verdict(&time, &[result("c/d", 1.0, None)]), bench::Verdict::NotRun);

    // 50 events in 1 ms: 50,000 a second.
    let rate = bench::Target { bench: "r", goal: bench::Goal::AtLeastPerSecond(40_000.0), floor: None };
    assert_eq!(bench::verdict(&rate, &[result("r", 1e6, Some(50))]), bench::Verdict::Met);
    assert_eq!(bench::verdict(&rate, &[result("r", 2e6, Some(50))]), bench::Verdict::Missed);
    assert_eq!(bench::verdict(&rate, &[result("r", 1e6, None)]), bench::Verdict::NotRun);

    let ratio = bench::Target {
        bench: "k/big",
        goal: bench::Goal::AtMostTimes { of: "k/small", ratio: 1.5 },
        floor: None,
    };
    assert_eq!(
        bench::verdict(&ratio, &[result("k/big", 14.0, None), result("k/small", 10.0, None)]),
        bench::Verdict::Met
    );
    assert_eq!(
        bench::verdict(&ratio, &[result("k/big", 16.0, None), result("k/small", 10.0, None)]),
        bench::Verdict::Missed
    );
    assert_eq!(bench::verdict(&ratio, &[result("k/big", 16.0, None)]), bench::Verdict::NotRun);

    let table = bench::targets_table(&floor_misses);
    assert!(!table.contains("a/b"), "only the design's own targets are listed");
    let table = bench::targets_table(&[
        result("event_appends_50_writers/redb/batched", 2e6, Some(50)),
        result("floor_event_appends_50/redb/batched", 1.5e6, Some(50)),
    ]);
    let row = table.lines().find(|line| line.starts_with("event_appends_50_writers/redb/batched")).unwrap();
    assert!(
        row.contains("25000/s") && row.contains("33333/s") && row.contains("so does the bare library"),
        "{row}"
    );
    assert!(!row.contains("better than its floor"), "{row}");

    // A store faster than its floor means the floor bounds nothing: the table says so.
    let beaten = [
        result("event_appends_50_writers/redb/batched", 1e6, Some(50)),
        result("floor_event_appends_50/redb/batched", 2e6, Some(50)),
    ];
    let target =
        bench::TARGETS.iter().find(|target| target.bench == "event_appends_50_writers/redb/batched").unwrap();
    assert!(bench::beats_floor(target, &beaten));
    assert!(!bench::beats_floor(target, &beaten[..1]), "no floor in the run, nothing to beat");
    let table = bench::targets_table(&beaten);
    assert!(table.contains("met; better than its floor"), "{table}");
}

#[test]
fn only_this_run_s_results_with_a_median_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, median: &str| {
        let path = dir.path().join(name).join("new");
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("estimates.json"), format!(r#"{{"median":{{"point_estimate":{median}}}}}"#))
            .unwrap();
        std::fs::write(path.join("benchmark.json"), format!(r#"{{"full_id":"{name}","throughput":null}}"#))
            .unwrap();
        path.join("estimates.json")
    };
    let old = write("old", "100.0");
    write("fresh", "200.0");
    write("broken", "null");
    let since = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(since - std::time::Duration::from_secs(3600))
        .unwrap();
    let names =
        |results: Vec<bench::BenchResult>| results.into_iter().map(|result| result.name).collect::<Vec<_>>();
    assert_eq!(names(bench::results_since(dir.path(), since).unwrap()), ["fresh"]);
    assert_eq!(names(bench::results(dir.path()).unwrap()), ["fresh", "old"]);
}

#[test]
fn every_target_names_a_benchmark_group_of_the_benches_and_every_floor_a_floor() {
    let benches = workspace_root().join("benches/benches");
    let mut sources = String::new();
    for entry in std::fs::read_dir(&benches).unwrap() {
        sources.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    let floors = std::fs::read_to_string(benches.join("floors.rs")).unwrap();
    for target in bench::TARGETS {
        let group = target.bench.split('/').next().unwrap();
        assert!(
            sources.contains(&format!("\"{group}")),
            "no benchmark group {group} (target {})",
            target.bench
        );
        if let Some(floor) = target.floor {
            // Floors are named by constants: the whole name is checked.
            let (group, name) = floor.split_once('/').unwrap();
            assert!(
                floors.contains(&format!("\"{group}\"")) && floors.contains(&format!("(\"{name}\"")),
                "floors.rs has no floor {floor}"
            );
        }
    }
}
