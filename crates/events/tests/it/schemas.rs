//! The committed JSON Schemas in `docs/schemas/` match the types.

use std::collections::BTreeSet;
use std::path::PathBuf;

use agentry_events::schema;

fn schema_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/schemas")
}

#[test]
fn the_committed_schemas_are_current() {
    let dir = schema_dir();
    for file in schema::all() {
        let path = dir.join(file.file_name);
        let committed = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("{} is missing: run `cargo xtask codegen`", path.display()));
        assert!(
            committed == file.contents,
            "{} is stale: run `cargo xtask codegen` and commit the result",
            path.display()
        );
    }
}

#[test]
fn no_schema_file_is_left_over_from_a_removed_type() {
    let generated: BTreeSet<&str> = schema::all().iter().map(|file| file.file_name).collect();
    for entry in std::fs::read_dir(schema_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            generated.contains(name.as_str()),
            "docs/schemas/{name} is not generated: run `cargo xtask codegen`"
        );
    }
}

#[test]
fn every_schema_says_how_to_regenerate_it_and_is_deterministic() {
    let first = schema::all();
    let second = schema::all();
    assert_eq!(first, second);
    for file in first {
        let value: serde_json::Value = serde_json::from_str(&file.contents).unwrap();
        assert_eq!(value["$comment"], serde_json::json!(schema::GENERATED_HEADER), "{}", file.file_name);
        assert!(value["$schema"].as_str().unwrap().contains("2020-12"));
    }
}
