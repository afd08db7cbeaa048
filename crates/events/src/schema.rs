//! JSON Schemas of the envelope and of each wire vocabulary, derived from the types.
//!
//! `cargo xtask codegen` writes them to `docs/schemas/`; a test fails when the committed
//! files differ from what [`all`] derives.

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings};

use crate::envelope::EventEnvelope;
use crate::render::{adalflow, agent_team, agno, agui, harness};

/// The header every generated schema carries, as its `$comment`.
pub const GENERATED_HEADER: &str = "Generated from the Rust types by `cargo xtask codegen`; do not edit. Regenerate with: cargo xtask codegen";

/// One generated schema: its file name under `docs/schemas/` and its JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaFile {
    /// The file name, such as `envelope.schema.json`.
    pub file_name: &'static str,
    /// The pretty-printed JSON, ending with a newline.
    pub contents: String,
}

fn render<T: JsonSchema>(file_name: &'static str) -> SchemaFile {
    let generator = SchemaGenerator::new(SchemaSettings::draft2020_12());
    let mut schema: Schema = generator.into_root_schema_for::<T>();
    schema.insert("$comment".to_owned(), GENERATED_HEADER.into());
    // Pretty-printing a JSON value cannot fail.
    let mut contents = serde_json::to_string_pretty(&schema).unwrap_or_default();
    contents.push('\n');
    SchemaFile { file_name, contents }
}

/// Every schema, in a fixed order: the canonical envelope, then each vocabulary.
#[must_use]
pub fn all() -> Vec<SchemaFile> {
    vec![
        render::<EventEnvelope>("envelope.schema.json"),
        render::<harness::HarnessEvent>("harness-event.schema.json"),
        render::<harness::HarnessTurn>("harness-turn.schema.json"),
        render::<agent_team::AgentTeamEvent>("agent-team-event.schema.json"),
        render::<agno::AgnoEvent>("agno-event.schema.json"),
        render::<adalflow::AdalFlowStreamEvent>("adalflow-event.schema.json"),
        render::<agui::AguiEvent>("ag-ui-event.schema.json"),
    ]
}
