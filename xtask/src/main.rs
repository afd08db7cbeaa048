//! `cargo xtask`: the workspace's development tasks (see `cargo xtask --help`).

// A command-line tool prints its results.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use xtask::{codegen, demo, fixtures, layering, tidy, workspace_root};

#[derive(Parser)]
#[command(about = "Development tasks of the Agentry workspace")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Runs a scripted demo turn and prints its event stream (SSE frames).
    Demo {
        /// The user's message.
        #[arg(default_value = "What is 6 * 7?")]
        message: String,
    },
    /// Runs every check: formatting, clippy, the Rust tests, the Python wire tests.
    Test {
        /// Skips formatting and clippy.
        #[arg(long)]
        quick: bool,
    },
    /// Writes the JSON Schemas of the events to docs/schemas/.
    Codegen,
    /// Writes the wire fixtures the Python tests parse.
    Fixtures {
        /// Where to write them.
        #[arg(long, default_value = "target/wire-fixtures.json")]
        out: PathBuf,
    },
    /// Runs the criterion benchmarks and prints their medians and the design's targets.
    Bench {
        /// Only benchmarks whose name contains this.
        filter: Option<String>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("xtask: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let root = workspace_root();
    match cli.task {
        Task::Demo { message } => {
            let runtime =
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
            let mut stdout = std::io::stdout().lock();
            runtime.block_on(demo::run(&message, &root.join("target/demo/agentry.db"), &mut stdout))
        }
        Task::Codegen => {
            let changed = codegen::write(&root)?;
            if changed.is_empty() {
                eprintln!("schemas are up to date");
            } else {
                eprintln!("updated: {}", changed.join(", "));
            }
            Ok(())
        }
        Task::Fixtures { out } => write_fixtures(&root.join(out)),
        Task::Test { quick } => test(&root, quick),
        Task::Bench { filter } => bench(&root, filter.as_deref()),
    }
}

fn write_fixtures(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let document = fixtures::build()?;
    std::fs::write(path, serde_json::to_vec_pretty(&document)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn cargo(root: &Path, args: &[&str]) -> Result<()> {
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("running cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed{}", args.join(" "), low_disk_hint(root));
    }
    Ok(())
}

/// Free space, in MiB, on the file system holding `root`, as `df` reports it.
fn free_mib(root: &Path) -> Option<u64> {
    let out = Command::new("df").args(["-Pk"]).arg(root).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let available = text.lines().nth(1)?.split_whitespace().nth(3)?;
    Some(available.parse::<u64>().ok()? / 1024)
}

/// A note for a failed cargo run when the disk is nearly full: the compiler's
/// own "No space left on device" is easy to miss among hundreds of lines.
fn low_disk_hint(root: &Path) -> String {
    match free_mib(root) {
        Some(mib) if mib < LOW_DISK_MIB => format!(
            " (only {mib} MiB free on the disk holding {}; a full test run needs about \
             3.5 GiB with CARGO_INCREMENTAL=0, 6 GiB without)",
            root.display()
        ),
        _ => String::new(),
    }
}

/// Below this much free space a cargo failure is reported with the figure.
const LOW_DISK_MIB: u64 = 2048;

/// Installs the npm packages the tests start (MCP servers), unless already installed.
fn npm_packages(root: &Path) -> Result<()> {
    let dir = root.join("tools/mcp");
    if dir.join("node_modules/.bin/mcp-server-everything").exists() {
        return Ok(());
    }
    eprintln!("$ npm ci --prefix tools/mcp");
    let status = Command::new("npm")
        .args(["ci", "--prefix", "tools/mcp", "--no-audit", "--no-fund"])
        .current_dir(root)
        .status()
        .context("running npm (Node.js 20 or later is needed for the MCP test server)")?;
    if !status.success() {
        bail!("npm ci --prefix tools/mcp failed");
    }
    Ok(())
}

fn test(root: &Path, quick: bool) -> Result<()> {
    if let Some(mib) = free_mib(root).filter(|mib| *mib < 2 * LOW_DISK_MIB) {
        eprintln!(
            "warning: only {mib} MiB free on the disk holding {}; the test run may not fit",
            root.display()
        );
    }
    npm_packages(root)?;
    if !quick {
        cargo(root, &["fmt", "--all", "--", "--check"])?;
        // The fuzz targets are a crate of their own, outside the workspace.
        cargo(root, &["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"])?;
        cargo(root, &["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"])?;
        // MCP is an optional feature of the runner: it must build without it too (features
        // unified across the workspace hide what only the MCP SDK turns on).
        cargo(root, &["check", "-p", "agentry-runner", "--no-default-features"])?;
    }
    let problems = tidy::problems(root)?;
    if !problems.is_empty() {
        bail!("tidy check failed:\n{}", problems.join("\n"));
    }
    let violations = layering::violations(root)?;
    if !violations.is_empty() {
        bail!("layering check failed:\n{}", violations.join("\n"));
    }
    cargo(root, &["test", "--workspace", "--all-targets"])?;
    cargo(root, &["test", "--workspace", "--doc"])?;
    let fixtures = root.join("target/wire-fixtures.json");
    write_fixtures(&fixtures)?;
    // The Python tests drive a real `agentry serve` process.
    cargo(root, &["build", "-p", "agentry-cli", "--bin", "agentry"])?;
    eprintln!("$ bash tests/python/run.sh");
    let status = Command::new("bash")
        .arg("tests/python/run.sh")
        .env("AGENTRY_FIXTURES", &fixtures)
        .env("AGENTRY_BIN", root.join("target/debug/agentry"))
        .current_dir(root)
        .status()
        .context("running the Python wire tests")?;
    if !status.success() {
        bail!("the Python wire tests failed");
    }
    eprintln!("all checks passed");
    Ok(())
}

fn bench(root: &Path, filter: Option<&str>) -> Result<()> {
    let mut args = vec!["bench", "-p", "agentry-benches", "--benches", "--"];
    if let Some(filter) = filter {
        args.push(filter);
    }
    let started = std::time::SystemTime::now();
    cargo(root, &args)?;
    // Only this run's results: criterion keeps those of earlier runs beside them.
    let results = xtask::bench::results_since(&root.join("target/criterion"), started)?;
    println!("{}", xtask::bench::summary(&results));
    println!("{}", xtask::bench::targets_table(&results));
    Ok(())
}
