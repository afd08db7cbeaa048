//! Reading criterion's results: the median of every benchmark, with its throughput, and
//! design §9's targets checked against them and against the bare-library floors of the same run.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Context, Result};
use serde_json::Value;

/// One benchmark's result.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// `group/function`.
    pub name: String,
    /// The median time of one iteration, in nanoseconds.
    pub median_ns: f64,
    /// Elements processed per iteration, when the benchmark declares a throughput.
    pub elements: Option<u64>,
}

impl BenchResult {
    /// Elements per second at the median, when the benchmark declares a throughput.
    #[must_use]
    pub fn per_second(&self) -> Option<f64> {
        #[allow(clippy::cast_precision_loss)]
        self.elements.map(|elements| elements as f64 / (self.median_ns / 1e9))
    }
}

fn find(dir: &Path, found: &mut Vec<PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name == "new") && path.join("estimates.json").is_file() {
                found.push(path);
            } else {
                find(&path, found)?;
            }
        }
    }
    Ok(())
}

/// Every benchmark result under criterion's output directory, sorted by name.
pub fn results(criterion_dir: &Path) -> Result<Vec<BenchResult>> {
    results_since(criterion_dir, SystemTime::UNIX_EPOCH)
}

/// The benchmark results under criterion's output directory written at `since` or later
/// (those of one run, when `since` is its start), sorted by name.
pub fn results_since(criterion_dir: &Path, since: SystemTime) -> Result<Vec<BenchResult>> {
    let mut dirs = Vec::new();
    if criterion_dir.is_dir() {
        find(criterion_dir, &mut dirs)?;
    }
    let mut results = Vec::new();
    for dir in dirs {
        let written = fs::metadata(dir.join("estimates.json"))?.modified()?;
        if written < since {
            continue;
        }
        let estimates: Value = serde_json::from_str(&fs::read_to_string(dir.join("estimates.json"))?)
            .with_context(|| format!("parsing {}", dir.display()))?;
        let benchmark: Value = serde_json::from_str(&fs::read_to_string(dir.join("benchmark.json"))?)
            .with_context(|| format!("parsing {}", dir.display()))?;
        let name = benchmark["full_id"].as_str().unwrap_or_default().to_owned();
        // A result without a usable median is not a result (and would compare as unmet).
        let Some(median_ns) = estimates["median"]["point_estimate"]
            .as_f64()
            .filter(|median| median.is_finite() && *median > 0.0)
        else {
            continue;
        };
        let elements = benchmark["throughput"]["Elements"].as_u64();
        results.push(BenchResult { name, median_ns, elements });
    }
    results.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(results)
}

/// A duration in nanoseconds, in the unit that suits it.
fn duration(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.3} µs", ns / 1e3)
    } else {
        format!("{ns:.1} ns")
    }
}

/// A table of medians (and throughput where declared).
#[must_use]
pub fn summary(results: &[BenchResult]) -> String {
    let mut out =
        String::from("benchmark                                         median          throughput\n");
    for result in results {
        let median = duration(result.median_ns);
        let throughput = result.per_second().map(|rate| format!("{rate:.0} elements/s")).unwrap_or_default();
        let _ = writeln!(out, "{:<48}  {median:>12}    {throughput}", result.name);
    }
    out
}

/// What a target asks of a benchmark's median.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// At most this many nanoseconds an iteration.
    AtMostNs(f64),
    /// At least this many elements a second.
    AtLeastPerSecond(f64),
    /// At most this multiple of another benchmark's median, measured in the same run.
    AtMostTimes {
        /// The other benchmark.
        of: &'static str,
        /// The largest multiple allowed.
        ratio: f64,
    },
}

/// A target of design §9 (or of an issue) on one benchmark.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// The benchmark's `group/function` name.
    pub bench: &'static str,
    /// What its median must do.
    pub goal: Goal,
    /// The benchmark timing the bare storage library doing the same writes (`floors.rs`),
    /// in the same run: no store built on that library can do better.
    pub floor: Option<&'static str>,
}

const fn target(bench: &'static str, goal: Goal, floor: Option<&'static str>) -> Target {
    Target { bench, goal, floor }
}

/// Design §9's targets, per benchmark.
pub const TARGETS: &[Target] = &[
    target("agent_construction", Goal::AtMostNs(500.0), None),
    target("one_turn/memory/current_thread", Goal::AtMostNs(10_000.0), None),
    target("one_turn/memory/multi_thread", Goal::AtMostNs(10_000.0), None),
    target("conversation_25/memory/current_thread", Goal::AtMostNs(500_000.0), None),
    target("conversation_25/memory/relaxed", Goal::AtMostNs(500_000.0), None),
    target(
        "conversation_25/sqlite/strict",
        Goal::AtMostNs(10e6),
        Some("floor_conversation_25/sqlite/strict"),
    ),
    target(
        "conversation_25/sqlite/relaxed",
        Goal::AtMostNs(2e6),
        Some("floor_conversation_25/sqlite/relaxed"),
    ),
    target("conversation_25/redb/strict", Goal::AtMostNs(10e6), Some("floor_conversation_25/redb/strict")),
    target("conversation_25/redb/relaxed", Goal::AtMostNs(2e6), Some("floor_conversation_25/redb/relaxed")),
    target("append_run/memory/k=10000", Goal::AtMostTimes { of: "append_run/memory/k=10", ratio: 1.5 }, None),
    target("append_run/sqlite/k=10000", Goal::AtMostTimes { of: "append_run/sqlite/k=10", ratio: 1.5 }, None),
    target("append_run/redb/k=10000", Goal::AtMostTimes { of: "append_run/redb/k=10", ratio: 1.5 }, None),
    target(
        "event_appends_50_writers/sqlite/batched",
        Goal::AtLeastPerSecond(40_000.0),
        Some("floor_event_appends_50/sqlite/batched"),
    ),
    target(
        "event_appends_50_writers/redb/batched",
        Goal::AtLeastPerSecond(40_000.0),
        Some("floor_event_appends_50/redb/batched"),
    ),
    target(
        "event_appends_50_writers/sqlite/relaxed",
        Goal::AtLeastPerSecond(150_000.0),
        Some("floor_event_appends_50/sqlite/relaxed"),
    ),
    target(
        "event_appends_50_writers/redb/relaxed",
        Goal::AtLeastPerSecond(150_000.0),
        Some("floor_event_appends_50/redb/relaxed"),
    ),
    target("replay_1000_events/memory", Goal::AtMostNs(1e6), None),
    target("replay_1000_events/sqlite", Goal::AtMostNs(1e6), None),
    target("replay_1000_events/redb", Goal::AtMostNs(1e6), None),
    target("fan_out_100/memory", Goal::AtLeastPerSecond(2_000_000.0), None),
    target("server/cold_start_to_first_request", Goal::AtMostNs(50e6), None),
];

/// The result of the benchmark called `name`, if it ran.
fn named<'a>(all: &'a [BenchResult], name: &str) -> Option<&'a BenchResult> {
    all.iter().find(|result| result.name == name)
}

/// How a benchmark of this run stands against its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The median meets the target.
    Met,
    /// The median misses the target; its floor (if any) meets it.
    Missed,
    /// The median misses the target, and so does, in the same run, the bare library doing
    /// the same writes: a store built on it would have to beat its own floor to reach the
    /// target on this machine. (One run's medians: where the floor is near the target, the
    /// verdict can change from run to run.)
    BeyondFloor,
    /// The benchmark (or one it is compared with) did not run.
    NotRun,
}

impl Goal {
    /// Whether `result` meets the goal, given the run's other results; `None` when a
    /// result it needs is missing.
    fn met(&self, result: &BenchResult, all: &[BenchResult]) -> Option<bool> {
        match *self {
            Self::AtMostNs(limit) => Some(result.median_ns <= limit),
            Self::AtLeastPerSecond(rate) => result.per_second().map(|measured| measured >= rate),
            Self::AtMostTimes { of, ratio } => {
                let other = named(all, of)?;
                Some(result.median_ns <= other.median_ns * ratio)
            }
        }
    }

    fn describe(&self) -> String {
        match *self {
            Self::AtMostNs(limit) => format!("<= {}", duration(limit)),
            Self::AtLeastPerSecond(rate) => format!(">= {rate:.0}/s"),
            Self::AtMostTimes { of, ratio } => format!("<= {ratio} x {of}"),
        }
    }

    /// The measured figure the goal looks at.
    fn measure(&self, result: &BenchResult, all: &[BenchResult]) -> String {
        match *self {
            Self::AtMostNs(_) => duration(result.median_ns),
            Self::AtLeastPerSecond(_) => {
                result.per_second().map_or_else(|| "-".to_owned(), |rate| format!("{rate:.0}/s"))
            }
            Self::AtMostTimes { of, .. } => named(all, of).map_or_else(
                || "-".to_owned(),
                |other| format!("{:.2} x", result.median_ns / other.median_ns),
            ),
        }
    }
}

/// The verdict on one target, from the results of one run.
#[must_use]
pub fn verdict(target: &Target, all: &[BenchResult]) -> Verdict {
    let Some(result) = named(all, target.bench) else { return Verdict::NotRun };
    match target.goal.met(result, all) {
        None => Verdict::NotRun,
        Some(true) => Verdict::Met,
        Some(false) => {
            let floor = target.floor.and_then(|floor| named(all, floor));
            match floor.and_then(|floor| target.goal.met(floor, all)) {
                Some(false) => Verdict::BeyondFloor,
                _ => Verdict::Missed,
            }
        }
    }
}

/// Whether the benchmark did better than its floor in the same run: more than noise, that
/// would mean the floor does not bound what it is meant to.
#[must_use]
pub fn beats_floor(target: &Target, all: &[BenchResult]) -> bool {
    let (Some(result), Some(floor)) =
        (named(all, target.bench), target.floor.and_then(|floor| named(all, floor)))
    else {
        return false;
    };
    match target.goal {
        Goal::AtLeastPerSecond(_) => {
            result.per_second().zip(floor.per_second()).is_some_and(|(measured, bound)| measured > bound)
        }
        Goal::AtMostNs(_) | Goal::AtMostTimes { .. } => result.median_ns < floor.median_ns,
    }
}

/// A table of every target with a benchmark in `all`: the measured figure, the target, the
/// floor measured in the same run, and the verdict.
#[must_use]
pub fn targets_table(all: &[BenchResult]) -> String {
    let mut out = String::from(
        "design §9 targets (this run's medians; a floor is the bare library doing the same writes, in the same run)\n",
    );
    let _ =
        writeln!(out, "{:<42}  {:>14}  {:>22}  {:>14}  verdict", "benchmark", "measured", "target", "floor");
    for target in TARGETS {
        let verdict = verdict(target, all);
        if verdict == Verdict::NotRun {
            continue;
        }
        let Some(result) = named(all, target.bench) else { continue };
        let floor = target
            .floor
            .and_then(|floor| named(all, floor))
            .map_or_else(|| "-".to_owned(), |floor| target.goal.measure(floor, all));
        let mut verdict = match verdict {
            Verdict::Met => "met".to_owned(),
            Verdict::Missed => "missed".to_owned(),
            Verdict::BeyondFloor => "missed; so does the bare library (the floor)".to_owned(),
            Verdict::NotRun => continue,
        };
        if beats_floor(target, all) {
            verdict.push_str("; better than its floor: check the floor");
        }
        let _ = writeln!(
            out,
            "{:<42}  {:>14}  {:>22}  {:>14}  {verdict}",
            target.bench,
            target.goal.measure(result, all),
            target.goal.describe(),
            floor
        );
    }
    out
}
