//! A deterministic model for tests and offline demos.
//!
//! A [`ScriptedModel`] answers each call with the next [`ScriptedResponse`] of its script,
//! or with what a responder function decides from the request. Each response streams the
//! way an OpenAI-compatible provider streams: reasoning pieces, then text pieces of a few
//! characters, then each tool call as a first chunk with its id and name followed by
//! argument pieces, then a last delta with the finish reason and usage.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentry_types::{EventId, FinishReason, ModelMessage, ModelMessageDelta, ToolCall, Usage};
use async_trait::async_trait;
use futures_util::StreamExt;

use crate::{Model, ModelError, ModelInfo, ModelRequest, ModelStream};

/// A tool call a scripted response makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptedToolCall {
    /// The call id; generated (`call_<call>_<index>`) when absent.
    pub id: Option<String>,
    /// The tool.
    pub name: String,
    /// The JSON arguments.
    pub arguments: String,
}

/// One scripted answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScriptedResponse {
    /// The text.
    pub text: Option<String>,
    /// Reasoning streamed before the text.
    pub reasoning: Option<String>,
    /// Tool calls streamed after the text.
    pub tool_calls: Vec<ScriptedToolCall>,
    /// The finish reason; `tool_calls` when there are calls, `stop` otherwise.
    pub finish_reason: Option<FinishReason>,
    /// The usage; estimated from the text lengths when absent.
    pub usage: Option<Usage>,
    /// Characters per text and argument piece (at least 1; default 8).
    pub chunk_chars: Option<usize>,
    /// A pause before each delta, to simulate a slow provider.
    pub delay: Option<Duration>,
    /// The error the call fails with instead of answering.
    pub error: Option<ModelError>,
    /// The error the stream ends with after this many deltas (a mid-stream failure).
    pub fail_after: Option<(usize, ModelError)>,
}

impl ScriptedResponse {
    /// A text answer.
    #[must_use]
    pub fn text(text: impl Into<String>) -> Self {
        Self { text: Some(text.into()), ..Self::default() }
    }

    /// A single tool call with JSON arguments.
    #[must_use]
    pub fn tool_call(name: impl Into<String>, arguments: &serde_json::Value) -> Self {
        Self::default().with_tool_call(name, arguments)
    }

    /// The same response with one more tool call.
    #[must_use]
    pub fn with_tool_call(mut self, name: impl Into<String>, arguments: &serde_json::Value) -> Self {
        self.tool_calls.push(ScriptedToolCall {
            id: None,
            name: name.into(),
            arguments: arguments.to_string(),
        });
        self
    }

    /// The same response with reasoning before it.
    #[must_use]
    pub fn with_reasoning(mut self, reasoning: impl Into<String>) -> Self {
        self.reasoning = Some(reasoning.into());
        self
    }

    /// The same response with exact usage.
    #[must_use]
    pub const fn with_usage(mut self, usage: Usage) -> Self {
        self.usage = Some(usage);
        self
    }

    /// The same response streamed in pieces of `chars` characters.
    #[must_use]
    pub const fn chunked(mut self, chars: usize) -> Self {
        self.chunk_chars = Some(chars);
        self
    }

    /// The same response with a pause before each delta.
    #[must_use]
    pub const fn delayed(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// A call that fails with `error` before any output.
    #[must_use]
    pub fn failing(error: ModelError) -> Self {
        Self { error: Some(error), ..Self::default() }
    }

    /// The deltas this response streams as call number `call` (from 1) of a model.
    #[must_use]
    pub fn deltas(&self, call: usize, request: &ModelRequest) -> Vec<ModelMessageDelta> {
        self.delta_iter(call, request).collect()
    }

    /// [`ScriptedResponse::deltas`], made one at a time as they are taken.
    fn delta_iter(
        &self,
        call: usize,
        request: &ModelRequest,
    ) -> impl Iterator<Item = ModelMessageDelta> + Send + 'static {
        let finish_reason = self.finish_reason.clone().unwrap_or(if self.tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        });
        let message = ModelMessage {
            content: self.text.clone().filter(|text| !text.is_empty()),
            reasoning_content: self.reasoning.clone().filter(|text| !text.is_empty()),
            tool_calls: self
                .tool_calls
                .iter()
                .enumerate()
                .map(|(index, tool_call)| {
                    let id = tool_call.id.clone().unwrap_or_else(|| format!("call_{call}_{index}"));
                    ToolCall::function(id, tool_call.name.clone(), tool_call.arguments.clone())
                })
                .collect(),
            finish_reason: Some(finish_reason),
            ..ModelMessage::default()
        };
        let usage = self.usage.unwrap_or_else(|| Usage::estimate(&request.messages, &message));
        let message = ModelMessage { usage: Some(usage), ..message };
        message.into_deltas(self.chunk_chars.unwrap_or(8))
    }
}

/// Refuses a conversation that an OpenAI-compatible provider refuses with a 400, as a real
/// provider does: a tool result must answer a call of the assistant message it follows
/// (with only other results between them), and an assistant message's calls must each be
/// answered before the conversation goes on.
fn check_tool_pairs(messages: &[agentry_types::ContextMessage]) -> Result<(), ModelError> {
    use agentry_types::Role;
    // The calls of the latest assistant message with calls not answered yet.
    let mut open: Vec<&str> = Vec::new();
    let mut answering = false;
    for (index, message) in messages.iter().enumerate() {
        if message.role == Role::Tool {
            let id = message.tool_call_id.as_deref().unwrap_or_default();
            let Some(position) = open.iter().position(|call| *call == id).filter(|_| answering) else {
                return Err(ModelError::InvalidRequest(format!(
                    "messages[{index}]: a message with role 'tool' must be a response to a preceding message with 'tool_calls' (tool_call_id {id:?})"
                )));
            };
            open.remove(position);
            continue;
        }
        if !open.is_empty() {
            return Err(ModelError::InvalidRequest(format!(
                "messages[{index}]: an assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'; these had none: {open:?}"
            )));
        }
        answering = message.role == Role::Assistant && !message.tool_calls.is_empty();
        open = message.tool_calls.iter().map(|call| call.id.as_str()).collect();
    }
    Ok(())
}

type Responder = dyn Fn(&ModelRequest) -> ScriptedResponse + Send + Sync;

enum Script {
    Sequence(Mutex<VecDeque<ScriptedResponse>>),
    Responder(Arc<Responder>),
}

/// How many of the latest requests a [`ScriptedModel`] keeps for inspection: a long-running
/// scripted model that keeps its log must not grow without bound (demos and benchmarks
/// keep none: [`ScriptedModel::without_request_log`]).
pub const RECORDED_REQUESTS: usize = 1024;

/// A model that answers from a script.
pub struct ScriptedModel {
    id: String,
    script: Script,
    calls: AtomicUsize,
    /// Tool calls without an id get one unique across processes.
    unique_ids: bool,
    /// The latest requests, at most [`RECORDED_REQUESTS`]; `None` when not recorded.
    requests: Option<Mutex<VecDeque<ModelRequest>>>,
}

impl fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("id", &self.id)
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl ScriptedModel {
    /// A model answering its calls with these responses, in order; a call after the last
    /// fails with [`ModelError::ScriptExhausted`].
    #[must_use]
    pub fn new(responses: Vec<ScriptedResponse>) -> Self {
        Self::with_script(Script::Sequence(Mutex::new(responses.into())))
    }

    /// A model answering each call with what `responder` returns for the request.
    #[must_use]
    pub fn responder(responder: impl Fn(&ModelRequest) -> ScriptedResponse + Send + Sync + 'static) -> Self {
        Self::with_script(Script::Responder(Arc::new(responder)))
    }

    fn with_script(script: Script) -> Self {
        Self {
            id: "scripted".to_owned(),
            script,
            calls: AtomicUsize::new(0),
            unique_ids: false,
            requests: Some(Mutex::new(VecDeque::new())),
        }
    }

    /// The same model without its log of requests, as a real provider keeps none: a
    /// recorded request shares the caller's conversation, so the caller must copy the
    /// conversation the next time it adds to it. For demos and benchmarks; tests that
    /// inspect [`requests`](Self::requests) keep the log.
    #[must_use]
    pub fn without_request_log(mut self) -> Self {
        self.requests = None;
        self
    }

    /// The same model, giving each tool call it makes without an id one that is unique
    /// across processes (`call_` and 32 hex digits), as a real provider does, instead of
    /// `call_<call>_<index>`, which a restarted process repeats (clients that keep a
    /// conversation's calls by id, such as AG-UI's, would take a new call for an old one).
    #[must_use]
    pub fn with_unique_call_ids(mut self) -> Self {
        self.unique_ids = true;
        self
    }

    /// The same model under another id.
    #[must_use]
    pub fn named(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// How many calls were made.
    #[must_use]
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// The requests received so far, in order (the latest [`RECORDED_REQUESTS`] of them);
    /// empty for a model built [`without_request_log`](Self::without_request_log).
    #[must_use]
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.as_ref().map_or_else(Vec::new, |requests| {
            requests.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned().collect()
        })
    }

    /// The response to call number `call` (from 1).
    fn next_response(&self, call: usize, request: &ModelRequest) -> Result<ScriptedResponse, ModelError> {
        match &self.script {
            Script::Sequence(queue) => queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front()
                .ok_or(ModelError::ScriptExhausted { used: call - 1 }),
            Script::Responder(responder) => Ok(responder(request)),
        }
    }
}

#[async_trait]
impl Model for ScriptedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo { id: self.id.clone(), provider: "scripted".to_owned() }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        if request.messages.is_empty() {
            return Err(ModelError::InvalidRequest("the request has no messages".to_owned()));
        }
        check_tool_pairs(&request.messages)?;
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(requests) = &self.requests {
            let mut requests = requests.lock().unwrap_or_else(PoisonError::into_inner);
            if requests.len() == RECORDED_REQUESTS {
                requests.pop_front();
            }
            requests.push_back(request.clone());
        }
        let mut response = self.next_response(call, &request)?;
        if self.unique_ids {
            for tool_call in &mut response.tool_calls {
                tool_call.id.get_or_insert_with(|| format!("call_{}", EventId::new().as_uuid().simple()));
            }
        }
        if let Some(error) = response.error.clone() {
            return Err(error);
        }
        // Made as they are taken: a long reply never exists as all of its deltas at once.
        let deltas = response.delta_iter(call, &request).map(Ok);
        let items: Box<dyn Iterator<Item = Result<ModelMessageDelta, ModelError>> + Send> =
            match response.fail_after.clone() {
                Some((after, error)) => Box::new(deltas.take(after).chain(std::iter::once(Err(error)))),
                None => Box::new(deltas),
            };
        let stream = futures_util::stream::iter(items);
        Ok(match response.delay {
            Some(delay) => stream
                .then(move |item| async move {
                    tokio::time::sleep(delay).await;
                    item
                })
                .boxed(),
            None => stream.boxed(),
        })
    }
}
