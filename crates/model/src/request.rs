//! What is sent to a model.

use std::sync::Arc;

use agentry_types::{ContextMessage, ToolSpec};

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
    /// conversation going hands it over without copying it, and copies the list (never
    /// the messages, which are shared too) only if it changes it while the model (or a
    /// recording of the request) still holds it.
    pub messages: Arc<Vec<ContextMessage>>,
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
    ///
    /// ```
    /// use agentry_model::ModelRequest;
    /// use agentry_types::Message;
    /// let request = ModelRequest::new([Message::system("Be brief."), Message::user("Hi")]);
    /// assert_eq!(request.last_user_text().as_deref(), Some("Hi"));
    /// ```
    #[must_use]
    pub fn new<M: Into<ContextMessage>>(messages: impl IntoIterator<Item = M>) -> Self {
        Self::shared(Arc::new(messages.into_iter().map(Into::into).collect()))
    }

    /// A request with this shared context and defaults for everything else.
    #[must_use]
    pub fn shared(messages: Arc<Vec<ContextMessage>>) -> Self {
        Self {
            messages,
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
        self.messages.iter().rev().find(|m| m.role == agentry_types::Role::User).map(|m| m.text())
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
