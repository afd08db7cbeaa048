//! House-style checks over the source tree: every Rust file opens with a `//!` line saying
//! what it is for, and no test is skipped (`#[ignore]`) or expects a panic
//! (`#[should_panic]`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Result;

/// The directories whose Rust files are checked.
pub const SOURCE_DIRS: &[&str] = &["crates", "xtask", "benches", "fuzz"];

/// Every `.rs` file under the source directories of `root`, sorted.
pub fn rust_files(root: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for dir in SOURCE_DIRS {
        collect(&root.join(dir), &mut files)?;
    }
    files.sort();
    Ok(files)
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
    if !dir.is_dir() {
        return Ok(());
    }
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                collect(&path, files)?;
            }
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
    Ok(())
}

/// The problems of one file's text (empty when it is tidy).
#[must_use]
pub fn problems_in(path: &Path, text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let shown = path.display();
    if !text.starts_with("//!") {
        problems.push(format!("{shown}: the file must start with a `//!` line saying what it is for"));
    }
    // The attribute names are split so this file does not trip its own check.
    for (forbidden, why) in [
        (concat!("#[", "ignore"), "tests are never skipped"),
        (concat!("#[", "should_panic"), "tests assert on typed errors, not panics"),
    ] {
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with(forbidden) {
                problems.push(format!("{shown}:{}: `{forbidden}]`: {why}", number + 1));
            }
        }
    }
    problems
}

/// Every problem in the tree at `root`.
pub fn problems(root: &Path) -> Result<Vec<String>> {
    let mut all = Vec::new();
    for file in rust_files(root)? {
        let text = fs::read_to_string(&file)?;
        let relative = file.strip_prefix(root).unwrap_or(&file);
        all.extend(problems_in(relative, &text));
    }
    Ok(all)
}
