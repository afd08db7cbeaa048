//! `cargo xtask codegen`: writes the JSON Schemas of the envelope and of each vocabulary to
//! `docs/schemas/`, and removes schema files that are no longer generated.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};

/// Where the schemas live, relative to the workspace root.
pub const SCHEMA_DIR: &str = "docs/schemas";

/// Writes every schema; returns the names of the files that changed.
pub fn write(root: &Path) -> Result<Vec<String>> {
    let dir = root.join(SCHEMA_DIR);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let generated = agentry_events::schema::all();
    let mut changed = Vec::new();
    for file in &generated {
        let path = dir.join(file.file_name);
        if fs::read_to_string(&path).ok().as_deref() != Some(file.contents.as_str()) {
            fs::write(&path, &file.contents).with_context(|| format!("writing {}", path.display()))?;
            changed.push(file.file_name.to_owned());
        }
    }
    for entry in fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|name| name.to_str()).unwrap_or_default().to_owned();
        if name.ends_with(".schema.json") && !generated.iter().any(|file| file.file_name == name) {
            fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
            changed.push(name);
        }
    }
    Ok(changed)
}
