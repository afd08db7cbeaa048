//! Tests of the development tasks: the layering table and the tidy checks hold for the
//! workspace, and each check catches what it is for.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::Path;

use xtask::layering::{self, ALLOWED, Edge};
use xtask::{tidy, workspace_root};

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
