//! The layering rule: which workspace crate may depend on which (design §2).
//!
//! [`violations`] reads `cargo metadata` and reports every dependency edge between
//! workspace crates that the table does not allow, and every workspace crate the table
//! does not know. Extending the table needs a reason in the commit message.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// A crate allowed to depend on any workspace crate.
pub const ANYTHING: &[&str] = &["*"];

/// The table: each workspace package and the workspace packages it may depend on.
pub const ALLOWED: &[(&str, &[&str])] = &[
    ("agentry-types", &[]),
    ("agentry-events", &["agentry-types"]),
    ("agentry-model", &["agentry-types"]),
    ("agentry-memory", &["agentry-types", "agentry-events", "agentry-model"]),
    ("agentry-storage-sqlite", &["agentry-types", "agentry-events", "agentry-memory"]),
    ("agentry-storage-redb", &["agentry-types", "agentry-events", "agentry-memory"]),
    ("agentry-runner", &["agentry-types", "agentry-events", "agentry-model", "agentry-memory"]),
    (
        "agentry-team",
        &["agentry-types", "agentry-events", "agentry-model", "agentry-memory", "agentry-runner"],
    ),
    (
        "agentry-server",
        &[
            "agentry-types",
            "agentry-events",
            "agentry-model",
            "agentry-memory",
            "agentry-storage-sqlite",
            "agentry-storage-redb",
            "agentry-runner",
            "agentry-team",
        ],
    ),
    (
        "agentry-cli",
        &[
            "agentry-types",
            "agentry-events",
            "agentry-model",
            "agentry-memory",
            "agentry-storage-sqlite",
            "agentry-storage-redb",
            "agentry-runner",
            "agentry-team",
            "agentry-server",
        ],
    ),
    ("xtask", ANYTHING),
    ("agentry-benches", ANYTHING),
];

/// A dependency edge: `from` depends on `to` (of the given kind: normal, dev or build).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The depending package.
    pub from: String,
    /// The package depended on.
    pub to: String,
    /// `normal`, `dev` or `build`.
    pub kind: String,
}

/// The dependency edges between the workspace's own packages, from `cargo metadata`.
pub fn workspace_edges(root: &Path) -> Result<(BTreeSet<String>, Vec<Edge>)> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(root)
        .output()
        .context("running cargo metadata")?;
    if !output.status.success() {
        bail!("cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let metadata: Value = serde_json::from_slice(&output.stdout).context("parsing cargo metadata")?;
    let packages = metadata["packages"].as_array().context("cargo metadata has no packages")?;
    let names: BTreeSet<String> =
        packages.iter().filter_map(|package| package["name"].as_str().map(str::to_owned)).collect();
    let mut edges = Vec::new();
    for package in packages {
        let from = package["name"].as_str().unwrap_or_default().to_owned();
        for dependency in package["dependencies"].as_array().into_iter().flatten() {
            let to = dependency["name"].as_str().unwrap_or_default();
            if names.contains(to) && to != from {
                let kind = dependency["kind"].as_str().unwrap_or("normal").to_owned();
                edges.push(Edge { from: from.clone(), to: to.to_owned(), kind });
            }
        }
    }
    edges.sort();
    Ok((names, edges))
}

/// Checks packages and edges against a table; returns one line per violation.
#[must_use]
pub fn check(table: &[(&str, &[&str])], packages: &BTreeSet<String>, edges: &[Edge]) -> Vec<String> {
    let table: BTreeMap<&str, &[&str]> = table.iter().copied().collect();
    let mut violations = Vec::new();
    for package in packages {
        if !table.contains_key(package.as_str()) {
            violations.push(format!(
                "workspace crate `{package}` is not in the layering table (xtask/src/layering.rs)"
            ));
        }
    }
    for edge in edges {
        let Some(allowed) = table.get(edge.from.as_str()) else { continue };
        if *allowed != ANYTHING && !allowed.contains(&edge.to.as_str()) {
            violations.push(format!(
                "`{}` has a {} dependency on `{}`, which the layering table does not allow",
                edge.from, edge.kind, edge.to
            ));
        }
    }
    violations
}

/// The violations of the workspace at `root`.
pub fn violations(root: &Path) -> Result<Vec<String>> {
    let (packages, edges) = workspace_edges(root)?;
    Ok(check(ALLOWED, &packages, &edges))
}
