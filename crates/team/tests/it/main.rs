//! Integration tests of teams, end to end through the runtime with scripted models.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod budgets;
mod coordinate;
mod modes;
mod policy;
mod spawn;

/// The tool results a model request carries, oldest first.
fn tool_results(request: &agentry_model::ModelRequest) -> Vec<String> {
    request
        .messages
        .iter()
        .filter(|message| message.role == agentry_types::Role::Tool)
        .map(agentry_types::Message::text)
        .collect()
}
