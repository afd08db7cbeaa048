//! The Agentry workspace's development tasks, as a library so that their checks are tested.
//!
//! - [`layering`]: the crate dependency table of the design, checked against `cargo metadata`;
//! - [`tidy`]: house-style checks over the source tree;
//! - [`codegen`]: writing and checking the JSON Schemas in `docs/schemas/`;
//! - [`fixtures`]: the wire fixtures the Python client tests parse;
//! - [`demo`]: a scripted turn printed as the harness event stream;
//! - [`bench`](mod@bench): the medians of criterion's results and design §9's targets.
//!
//! ```
//! use std::collections::BTreeSet;
//! use xtask::layering::{check, Edge, ALLOWED};
//!
//! // `types` may depend on no workspace crate.
//! let packages: BTreeSet<String> = ["agentry-types".to_owned(), "agentry-model".to_owned()].into();
//! let edge = Edge { from: "agentry-types".into(), to: "agentry-model".into(), kind: "normal".into() };
//! assert_eq!(check(ALLOWED, &packages, &[edge]).len(), 1);
//! ```

pub mod bench;
pub mod codegen;
pub mod demo;
pub mod fixtures;
pub mod layering;
pub mod tidy;

use std::path::PathBuf;

/// The workspace root (the parent of this crate's directory).
#[must_use]
pub fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().map(PathBuf::from).unwrap_or(manifest_dir)
}
