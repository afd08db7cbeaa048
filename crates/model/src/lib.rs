//! Models: the [`Model`] trait every provider implements, a provider for
//! OpenAI-compatible chat-completions servers (with the `openai` feature), and a
//! deterministic [`ScriptedModel`] for tests and offline demos.
//!
//! A model turns a [`ModelRequest`] (messages and tool specifications) into a stream of
//! [`ModelMessageDelta`]s: text, reasoning, tool-call chunks, and finally a finish reason
//! and usage. Dropping the stream cancels the request.
//!
//! ```
//! use agentry_model::{Model, ModelRequest, ScriptedModel, ScriptedResponse};
//! use agentry_types::Message;
//! use futures_util::StreamExt;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let model = ScriptedModel::new(vec![ScriptedResponse::text("Hello there")]);
//! let mut stream = model.stream(ModelRequest::new(vec![Message::user("Hi")])).await.unwrap();
//! let mut text = String::new();
//! while let Some(delta) = stream.next().await {
//!     text.push_str(delta.unwrap().content.as_deref().unwrap_or_default());
//! }
//! assert_eq!(text, "Hello there");
//! # });
//! ```
//!
//! With the `openai` feature, `OpenAiCompatibleModel` streams from any server that speaks
//! OpenAI's chat-completions API (OpenAI, Ollama, vLLM, llama.cpp's server, OpenRouter, …):
//!
#![cfg_attr(feature = "openai", doc = "```no_run")]
#![cfg_attr(not(feature = "openai"), doc = "```text")]
//! use agentry_model::{Model, ModelRequest, OpenAiCompatibleModel, OpenAiConfig};
//! use agentry_types::Message;
//! use futures_util::StreamExt;
//!
//! # async fn run() -> Result<(), agentry_model::ModelError> {
//! let config = OpenAiConfig::new("qwen3:8b").with_base_url("http://localhost:11434/v1");
//! let model = OpenAiCompatibleModel::new(config)?;
//! let mut stream = model.stream(ModelRequest::new(vec![Message::user("Hi")])).await?;
//! while let Some(delta) = stream.next().await {
//!     print!("{}", delta?.content.unwrap_or_default());
//! }
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "openai")]
mod openai;
mod request;
mod scripted;

use std::fmt;
use std::pin::Pin;
use std::time::Duration;

use agentry_types::ModelMessageDelta;
use async_trait::async_trait;
use futures_core::Stream;

#[cfg(feature = "openai")]
pub use openai::{OpenAiCompatibleModel, OpenAiConfig, sse_deltas};
pub use request::{ModelInfo, ModelRequest, ToolChoice};
pub use scripted::{RECORDED_REQUESTS, ScriptedModel, ScriptedResponse, ScriptedToolCall};

/// The deltas of one model response. Dropping it cancels the request.
pub type ModelStream = Pin<Box<dyn Stream<Item = Result<ModelMessageDelta, ModelError>> + Send>>;

/// A language model that streams completions.
#[async_trait]
pub trait Model: Send + Sync + fmt::Debug {
    /// The model's id and provider.
    fn info(&self) -> ModelInfo;

    /// Starts a completion and returns its deltas.
    ///
    /// Errors returned here happen before any output (the request was refused or could
    /// not be sent); errors inside the stream happen after output began, and end it. The
    /// last delta of a successful stream carries the `finish_reason`; `usage`, when the
    /// provider reports it, comes with or before it.
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError>;
}

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The request was invalid (for example no messages).
    #[error("invalid model request: {0}")]
    InvalidRequest(String),
    /// The provider answered with an error status.
    #[error("model provider returned HTTP {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The provider is rate limiting.
    #[error("model provider is rate limiting requests: {message}")]
    RateLimited {
        /// How long the provider asked to wait.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The provider could not be reached, or the connection failed.
    #[error("the connection to the model provider failed: {0}")]
    Transport(String),
    /// The provider did not answer in time.
    #[error("the model provider did not answer within {0:?}")]
    Timeout(Duration),
    /// A streaming response sent nothing (not even a keep-alive comment) for this long.
    #[error("the model provider sent nothing for {0:?} while it was sending its response")]
    Stalled(Duration),
    /// A streamed chunk could not be understood.
    #[error("malformed chunk from the model provider: {0}")]
    MalformedChunk(String),
    /// The stream ended before the response was complete.
    #[error("the model stream ended before the response was complete")]
    Disconnected,
    /// A scripted model has no response left.
    #[error("the scripted model has no response left after {used} responses")]
    ScriptExhausted {
        /// How many responses were used.
        used: usize,
    },
}
