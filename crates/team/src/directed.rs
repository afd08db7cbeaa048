//! Spawns an operator asks for (through the server's `POST /v1/agent-team/spawn`) rather
//! than the coordinator's model.
//!
//! [`TeamControl::request_spawn`] registers the request and returns the text of the turn
//! input that carries it, marked with a directive id. The coordinator's model is wrapped in
//! [`Directed`]: when the latest user message carries a registered directive, the wrapper
//! answers instead of the model, first with exactly the requested `spawn_agent` call (its
//! call id is `ui_<directive>`, and the spawn's events say `source: ui_action`), then,
//! once the spawn's result is in, with that result. Every other request goes to the model.
//! The policy, approvals, budgets and events are those of any spawn: the operator gets no
//! more than the coordinator could.

use std::sync::Arc;

use agentry_model::{
    Model, ModelError, ModelInfo, ModelRequest, ModelStream, ScriptedResponse, ScriptedToolCall,
};
use agentry_types::{EventId, Role};
use async_trait::async_trait;

use crate::TeamControl;

/// The prefix of a directive id, and of the call id of the spawn it makes (after `ui_`).
const MARK: &str = "spawn_";

/// A spawn asked for through the API.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpawnRequest {
    /// The role to spawn.
    pub role: String,
    /// The task, self-contained.
    pub task: String,
    /// The role's template (`default` when absent).
    #[serde(default)]
    pub template: Option<String>,
    /// Why the instance is needed (required by roles that ask for a justification).
    #[serde(default)]
    pub justification: Option<String>,
}

impl TeamControl {
    /// Registers an operator's spawn; returns its directive id and the text of the user
    /// message whose turn (on the team's session) runs it. Forget it with
    /// [`TeamControl::forget_spawn`] when that turn cannot be created or has ended.
    #[must_use]
    pub fn request_spawn(&self, request: &SpawnRequest) -> (String, String) {
        let directive = format!("{MARK}{}", EventId::new());
        let text = format!(
            "[{directive}] An operator asks to spawn {} {} for: {}",
            article(&request.role),
            request.role,
            request.task
        );
        self.directives().insert(directive.clone(), request.clone());
        (directive, text)
    }

    /// Forgets an operator's spawn request (its turn was refused, or has ended).
    pub fn forget_spawn(&self, directive: &str) {
        self.directives().remove(directive);
    }

    fn directives(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, SpawnRequest>> {
        self.directives.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether a `spawn_agent` call was made for an operator's request.
/// Where a call of the coordinator's tools came from: an operator's request (the API's
/// spawn) or the model.
pub(crate) fn call_source(tool_call_id: &str) -> agentry_events::EventSource {
    if is_operator_call(tool_call_id) {
        agentry_events::EventSource::UiAction
    } else {
        agentry_events::EventSource::ToolCall
    }
}

pub(crate) fn is_operator_call(tool_call_id: &str) -> bool {
    tool_call_id.strip_prefix("ui_").is_some_and(|rest| rest.starts_with(MARK))
}

/// The directive id a message carries: `[spawn_<uuid>]` at its start.
fn directive_in(text: &str) -> Option<&str> {
    let rest = text.strip_prefix('[')?;
    let end = rest.find(']')?;
    let directive = &rest[..end];
    directive.starts_with(MARK).then_some(directive)
}

/// A coordinator's model that carries out operators' spawn requests itself.
#[derive(Debug)]
pub(crate) struct Directed {
    pub(crate) inner: Arc<dyn Model>,
    pub(crate) control: TeamControl,
}

#[async_trait]
impl Model for Directed {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let Some(at) = request.messages.iter().rposition(|message| message.role == Role::User) else {
            return self.inner.stream(request).await;
        };
        if request.messages[at].from_history {
            // A directive counts only in the input of the turn it was made for.
            return self.inner.stream(request).await;
        }
        let text = request.messages[at].text();
        let Some(directive) = directive_in(&text).map(str::to_owned) else {
            return self.inner.stream(request).await;
        };
        let Some(spawn) = self.control.directives().get(&directive).cloned() else {
            return self.inner.stream(request).await;
        };
        let call_id = format!("ui_{directive}");
        let result = request.messages[at + 1..].iter().find(|message| {
            message.role == Role::Tool && message.tool_call_id.as_deref() == Some(call_id.as_str())
        });
        let response = match result {
            None => {
                let arguments = serde_json::json!({
                    "role": spawn.role,
                    "task": spawn.task,
                    "template": spawn.template,
                    "justification": spawn.justification,
                });
                ScriptedResponse {
                    tool_calls: vec![ScriptedToolCall {
                        id: Some(call_id),
                        name: "spawn_agent".to_owned(),
                        arguments: arguments.to_string(),
                    }],
                    ..ScriptedResponse::default()
                }
            }
            Some(result) => {
                self.control.directives().remove(&directive);
                let text = result.text();
                if text.starts_with(agentry_events::SPAWN_DENIED_PREFIX) {
                    ScriptedResponse::text(format!("The {} spawn was refused: {text}", spawn.role))
                } else {
                    ScriptedResponse::text(format!("The {} instance answered: {text}", spawn.role))
                }
            }
        };
        let deltas = response.deltas(1, &request);
        Ok(Box::pin(futures_util::stream::iter(deltas.into_iter().map(Ok))))
    }
}

/// "an" before a word that starts with a vowel letter, "a" otherwise (close enough for role
/// names in a sentence).
fn article(word: &str) -> &'static str {
    if word.starts_with(|letter: char| "aeiouAEIOU".contains(letter)) { "an" } else { "a" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_read_only_at_the_start_of_a_message() {
        assert_eq!(directive_in("[spawn_abc] An operator asks"), Some("spawn_abc"));
        assert_eq!(directive_in("please [spawn_abc]"), None);
        assert_eq!(directive_in("[other] text"), None);
        assert!(is_operator_call("ui_spawn_abc"));
        assert!(!is_operator_call("call_1_0"));
    }

    #[test]
    fn a_spawn_request_reads_as_english() {
        let control = crate::TeamControl::new();
        let ask = |role: &str| {
            let request = crate::SpawnRequest {
                role: role.to_owned(),
                task: "t".to_owned(),
                template: None,
                justification: None,
            };
            control.request_spawn(&request).1
        };
        assert!(ask("analyst").contains("asks to spawn an analyst for: t"), "{}", ask("analyst"));
        assert!(ask("worker").contains("asks to spawn a worker for: t"), "{}", ask("worker"));
    }
}
