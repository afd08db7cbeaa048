//! Reading criterion's results: the median of every benchmark, with its throughput.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

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
    let mut dirs = Vec::new();
    if criterion_dir.is_dir() {
        find(criterion_dir, &mut dirs)?;
    }
    let mut results = Vec::new();
    for dir in dirs {
        let estimates: Value = serde_json::from_str(&fs::read_to_string(dir.join("estimates.json"))?)
            .with_context(|| format!("parsing {}", dir.display()))?;
        let benchmark: Value = serde_json::from_str(&fs::read_to_string(dir.join("benchmark.json"))?)
            .with_context(|| format!("parsing {}", dir.display()))?;
        let name = benchmark["full_id"].as_str().unwrap_or_default().to_owned();
        let median_ns = estimates["median"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
        let elements = benchmark["throughput"]["Elements"].as_u64();
        results.push(BenchResult { name, median_ns, elements });
    }
    results.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(results)
}

/// A table of medians (and throughput where declared).
pub fn summary(criterion_dir: &Path) -> Result<String> {
    let mut out =
        String::from("benchmark                                         median          throughput\n");
    for result in results(criterion_dir)? {
        let median = if result.median_ns >= 1e6 {
            format!("{:.3} ms", result.median_ns / 1e6)
        } else if result.median_ns >= 1e3 {
            format!("{:.3} µs", result.median_ns / 1e3)
        } else {
            format!("{:.1} ns", result.median_ns)
        };
        let throughput = result.per_second().map(|rate| format!("{rate:.0} elements/s")).unwrap_or_default();
        let _ = writeln!(out, "{:<48}  {median:>12}    {throughput}", result.name);
    }
    Ok(out)
}
