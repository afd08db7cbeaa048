//! What is sent to a model.

use std::sync::Arc;

use agentry_types::{Message, ToolSpec};

/// Which tool the model must call, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool.
    Function(String),
}

/// A completion request.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The conversation so far, instructions first. Shared: a caller that keeps the
    /// conversation going hands it over without copying it, and copies it only if it
    /// changes it while the model (or a recording of the request) still holds it.
    pub messages: Arc<Vec<Message>>,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
    /// Which tool to call.
    pub tool_choice: Option<ToolChoice>,
    /// Whether the model may call several tools in one message.
    pub parallel_tool_calls: Option<bool>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// The most tokens to generate.
    pub max_tokens: Option<u32>,
    /// Sequences that stop generation.
    pub stop: Vec<String>,
}

impl ModelRequest {
    /// A request with these messages and defaults for everything else.
    #[must_use]
    pub fn new(messages: impl Into<Arc<Vec<Message>>>) -> Self {
        Self {
            messages: messages.into(),
            tools: Arc::from(Vec::new()),
            tool_choice: None,
            parallel_tool_calls: None,
            temperature: None,
            max_tokens: None,
            stop: Vec::new(),
        }
    }

    /// The same request with tools.
    #[must_use]
    pub fn with_tools(mut self, tools: impl Into<Arc<[ToolSpec]>>) -> Self {
        self.tools = tools.into();
        self
    }

    /// The text of the latest user message, if there is one.
    #[must_use]
    pub fn last_user_text(&self) -> Option<String> {
        self.messages.iter().rev().find(|m| m.role == agentry_types::Role::User).map(Message::text)
    }
}

/// Which model this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The model id (`gpt-4o-mini`, `scripted`, …).
    pub id: String,
    /// The provider (`openai`, `scripted`, …).
    pub provider: String,
}
