//! The chat-completions wire format: the request body, streamed chunks, and error bodies.
//!
//! Reading is deliberately lenient, because "OpenAI-compatible" servers differ: unknown
//! fields are ignored, `null` stands for absent anywhere, and where servers disagree on a
//! shape (reasoning under `reasoning_content` or `reasoning`, tool arguments as a string
//! or an object, content as a string or parts) every known shape is accepted.

use std::borrow::Cow;

use agentry_types::{
    ContentPart, FinishReason, FunctionCallDelta, Message, MessageContent, ModelMessageDelta, Role,
    ToolCallDelta, ToolCallKind, ToolSpec, Usage,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sse::SseEvent;
use crate::{ModelError, ModelRequest, ToolChoice};

/// How much of a malformed chunk or a non-JSON error body an error message quotes.
const EXCERPT_CHARS: usize = 200;

/// The body of `POST /chat/completions`.
#[derive(Debug, Serialize)]
pub(crate) struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
}

#[derive(Debug, Serialize)]
struct StreamOptions {
    include_usage: bool,
}

impl<'a> ChatRequest<'a> {
    /// The streaming request for `request` to `model`.
    ///
    /// `tool_choice` and `parallel_tool_calls` are sent only with tools: OpenAI refuses
    /// them otherwise, and without tools they mean nothing.
    pub(crate) fn new(model: &'a str, request: &'a ModelRequest) -> Self {
        let has_tools = !request.tools.is_empty();
        Self {
            model,
            messages: request.messages.iter().map(|message| WireMessage::from_message(message)).collect(),
            stream: true,
            stream_options: StreamOptions { include_usage: true },
            tools: request.tools.iter().map(WireTool::from_spec).collect(),
            tool_choice: request.tool_choice.as_ref().filter(|_| has_tools).map(tool_choice),
            parallel_tool_calls: request.parallel_tool_calls.filter(|_| has_tools),
            temperature: request.temperature,
            max_tokens: request.max_tokens,
            stop: &request.stop,
        }
    }
}

fn tool_choice(choice: &ToolChoice) -> Value {
    match choice {
        ToolChoice::Auto => Value::from("auto"),
        ToolChoice::None => Value::from("none"),
        ToolChoice::Required => Value::from("required"),
        ToolChoice::Function(name) => serde_json::json!({"type": "function", "function": {"name": name}}),
    }
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<WireContent<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

impl<'a> WireMessage<'a> {
    /// The wire form of a message. Only user messages keep their parts (images and
    /// files); the other roles accept text only, so their parts are sent as the joined
    /// text. An assistant message that only calls tools has no `content`; any other
    /// message without content is sent with an empty string, which every server accepts.
    /// Reasoning is not sent back: DeepSeek refuses it, and the others ignore it.
    fn from_message(message: &'a Message) -> Self {
        let content = match (&message.content, message.role) {
            (None, Role::Assistant) if !message.tool_calls.is_empty() => None,
            (None, _) => Some(WireContent::Text(Cow::Borrowed(""))),
            (Some(MessageContent::Text(text)), _) => Some(WireContent::Text(Cow::Borrowed(text))),
            (Some(MessageContent::Parts(parts)), Role::User) => {
                Some(WireContent::Parts(parts.iter().map(WirePart::from_part).collect()))
            }
            (Some(content @ MessageContent::Parts(_)), _) => {
                Some(WireContent::Text(Cow::Owned(content.text())))
            }
        };
        Self {
            role: message.role.as_str(),
            content,
            name: message.name.as_deref(),
            tool_calls: if message.role == Role::Assistant {
                message
                    .tool_calls
                    .iter()
                    .map(|call| WireToolCall {
                        id: &call.id,
                        kind: "function",
                        function: WireFunction {
                            name: &call.function.name,
                            arguments: &call.function.arguments,
                        },
                    })
                    .collect()
            } else {
                Vec::new()
            },
            tool_call_id: if message.role == Role::Tool { message.tool_call_id.as_deref() } else { None },
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum WireContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<WirePart<'a>>),
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WirePart<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: WireImageUrl<'a> },
    File { file: WireFile<'a> },
}

impl<'a> WirePart<'a> {
    /// Images (by URL, or files with an image MIME type) become `image_url` parts; other
    /// files become OpenAI's `file` parts with the data URI as `file_data`.
    fn from_part(part: &'a ContentPart) -> Self {
        match part {
            ContentPart::Text { text } => Self::Text { text },
            ContentPart::Image { image_url } => Self::ImageUrl {
                image_url: WireImageUrl { url: &image_url.url, detail: image_url.detail.as_deref() },
            },
            ContentPart::File(file) if file.data.is_image() => {
                Self::ImageUrl { image_url: WireImageUrl { url: file.data.as_str(), detail: None } }
            }
            ContentPart::File(file) => {
                Self::File { file: WireFile { filename: &file.name, file_data: file.data.as_str() } }
            }
        }
    }
}

#[derive(Debug, Serialize)]
struct WireImageUrl<'a> {
    url: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

#[derive(Debug, Serialize)]
struct WireFile<'a> {
    filename: &'a str,
    file_data: &'a str,
}

#[derive(Debug, Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireToolFunction<'a>,
}

#[derive(Debug, Serialize)]
struct WireToolFunction<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    parameters: &'a Value,
}

impl<'a> WireTool<'a> {
    fn from_spec(spec: &'a ToolSpec) -> Self {
        Self {
            kind: "function",
            function: WireToolFunction {
                name: &spec.name,
                description: spec.description.as_deref(),
                parameters: &spec.parameters,
            },
        }
    }
}

/// One streamed `chat.completion.chunk`, or an error object in its place.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Chunk {
    choices: Option<Vec<Choice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Choice {
    index: Option<u32>,
    delta: Option<ChoiceDelta>,
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ChoiceDelta {
    content: Option<Value>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    tool_calls: Option<Vec<WireToolCallDelta>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireToolCallDelta {
    /// Signed: some servers (GLM behind proxies) send `-1`.
    index: Option<i64>,
    id: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    function: Option<WireFunctionDelta>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireFunctionDelta {
    name: Option<String>,
    arguments: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptTokensDetails>,
    completion_tokens_details: Option<CompletionTokensDetails>,
    /// DeepSeek's name for cached prompt tokens.
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PromptTokensDetails {
    cached_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompletionTokensDetails {
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    /// The usage, or `None` when the object counts nothing (some servers send an empty
    /// or all-`null` usage object on every chunk).
    fn into_usage(self) -> Option<Usage> {
        if self.prompt_tokens.is_none() && self.completion_tokens.is_none() {
            return None;
        }
        let mut usage = Usage::new(self.prompt_tokens.unwrap_or(0), self.completion_tokens.unwrap_or(0));
        usage.cache_read_tokens = self
            .prompt_tokens_details
            .and_then(|details| details.cached_tokens)
            .or(self.prompt_cache_hit_tokens);
        usage.reasoning_tokens = self.completion_tokens_details.and_then(|details| details.reasoning_tokens);
        Some(usage)
    }
}

/// What one server-sent event says.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StreamEvent {
    /// `[DONE]`: the response is over.
    Done,
    /// A chunk, as a delta (possibly empty).
    Delta(ModelMessageDelta),
    /// An error object sent in place of a chunk.
    Error(ModelError),
}

/// Reads one event's data. An event the server marked as an error is one, whatever its
/// data.
///
/// Data that is not one JSON value is retried line by line, for servers that send
/// several `data:` lines without the blank line between events.
pub(crate) fn parse_event(event: &SseEvent) -> Result<Vec<StreamEvent>, ModelError> {
    let data = event.data.as_str();
    if event.error {
        return Ok(vec![StreamEvent::Error(marked_error(data))]);
    }
    match parse_one(data) {
        Ok(event) => Ok(vec![event]),
        Err(error) if data.contains('\n') => {
            let lines = data.lines().filter(|line| !line.trim().is_empty());
            lines.map(parse_one).collect::<Result<Vec<_>, _>>().map_err(|_| malformed(data, &error))
        }
        Err(error) => Err(malformed(data, &error)),
    }
}

fn malformed(data: &str, error: &serde_json::Error) -> ModelError {
    ModelError::MalformedChunk(format!("{error} in {:?}", excerpt(data)))
}

fn parse_one(data: &str) -> Result<StreamEvent, serde_json::Error> {
    if data.trim() == "[DONE]" {
        return Ok(StreamEvent::Done);
    }
    let chunk: Chunk = serde_json::from_str(data)?;
    if let Some(error) = &chunk.error {
        return Ok(StreamEvent::Error(stream_error(error)));
    }
    Ok(StreamEvent::Delta(chunk_delta(chunk)))
}

/// The error of an event marked as one: its JSON `error` member, or the JSON value itself,
/// or else its text.
fn marked_error(data: &str) -> ModelError {
    match serde_json::from_str::<Value>(data) {
        Ok(value) => match value.get("error") {
            Some(error) if !error.is_null() => stream_error(error),
            _ => stream_error(&value),
        },
        Err(_) => ModelError::Http { status: 0, message: excerpt(data.trim()) },
    }
}

/// An error object sent inside a `200 OK` stream, as [`ModelError::Http`]: its status is
/// the object's `code` (or `status`) when that is an HTTP error status, as OpenRouter and
/// vLLM send, and 0 otherwise, since the HTTP response itself succeeded. A 429 is
/// [`ModelError::RateLimited`], as in a response's status, unless it says the quota is
/// used up, which waiting does not fix.
fn stream_error(error: &Value) -> ModelError {
    let status = ["code", "status"]
        .iter()
        .filter_map(|key| error.get(key).and_then(Value::as_u64))
        .find(|code| (400..=599).contains(code))
        .and_then(|code| u16::try_from(code).ok())
        .unwrap_or(0);
    let message = error_value_message(error);
    if status == 429 && !says_quota_exhausted(error) {
        tracing::warn!(%message, "the model provider is rate limiting requests (429 in its stream)");
        return ModelError::RateLimited { retry_after: None, message };
    }
    ModelError::Http { status, message }
}

/// Whether an error object says the account's quota is used up.
fn says_quota_exhausted(error: &Value) -> bool {
    ["code", "type"].iter().any(|key| error.get(key).and_then(Value::as_str) == Some("insufficient_quota"))
}

fn error_value_message(error: &Value) -> String {
    match error {
        Value::String(message) => message.clone(),
        _ => match error.get("message").and_then(Value::as_str) {
            Some(message) => message.to_owned(),
            None => excerpt(&error.to_string()),
        },
    }
}

/// The delta of the first choice (index 0; only one is requested), with the chunk's
/// usage. Empty strings count as absent, so role-only chunks give an empty delta.
fn chunk_delta(chunk: Chunk) -> ModelMessageDelta {
    let choice = chunk
        .choices
        .and_then(|choices| choices.into_iter().find(|choice| choice.index.unwrap_or(0) == 0))
        .unwrap_or_default();
    let delta = choice.delta.unwrap_or_default();
    let non_empty = |text: Option<String>| text.filter(|text| !text.is_empty());
    ModelMessageDelta {
        content: non_empty(delta.content.and_then(content_text)),
        reasoning_content: non_empty(delta.reasoning_content).or_else(|| non_empty(delta.reasoning)),
        refusal: non_empty(delta.refusal),
        tool_calls: delta
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .filter_map(|(position, call)| tool_call_delta(position, call))
            .collect(),
        finish_reason: non_empty(choice.finish_reason).map(|reason| FinishReason::from_wire(&reason)),
        usage: chunk.usage.and_then(WireUsage::into_usage),
    }
}

/// A whole (non-streamed) `chat.completion`, or an error object in its place.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Completion {
    choices: Option<Vec<CompletionChoice>>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct CompletionChoice {
    index: Option<u32>,
    message: Option<ChoiceDelta>,
    finish_reason: Option<String>,
}

/// Reads a JSON body sent in place of an event stream: a whole completion, as one delta
/// (its tool calls numbered by position), or the error object it carries.
pub(crate) fn parse_completion(body: &[u8]) -> Result<ModelMessageDelta, ModelError> {
    let text = String::from_utf8_lossy(body);
    let completion: Completion = serde_json::from_str(&text).map_err(|error| malformed(&text, &error))?;
    if let Some(error) = &completion.error {
        return Err(stream_error(error));
    }
    let choices: Vec<Choice> = completion
        .choices
        .unwrap_or_default()
        .into_iter()
        .map(|choice| Choice {
            index: choice.index,
            delta: choice.message,
            finish_reason: choice.finish_reason,
        })
        .collect();
    if choices.is_empty() {
        return Err(ModelError::MalformedChunk(format!(
            "a JSON response with neither choices nor an error: {:?}",
            excerpt(&text)
        )));
    }
    Ok(chunk_delta(Chunk { choices: Some(choices), usage: completion.usage, error: None }))
}

/// Text content: a string, or the `text` of each part of a content array.
fn content_text(content: Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text),
        Value::Array(parts) => {
            Some(parts.iter().filter_map(|part| part.get("text").and_then(Value::as_str)).collect())
        }
        _ => None,
    }
}

/// A tool-call chunk; a chunk without a usable `index` (none, or negative) takes its
/// position in the list, and one that carries nothing is dropped. The index is the
/// server's: the stream renumbers calls densely (see `ToolCallSlots` in the provider).
fn tool_call_delta(position: usize, call: WireToolCallDelta) -> Option<ToolCallDelta> {
    let index = call
        .index
        .and_then(|index| u32::try_from(index).ok())
        .unwrap_or_else(|| u32::try_from(position).unwrap_or(u32::MAX));
    let function = call.function.unwrap_or_default();
    let name = function.name.filter(|name| !name.is_empty());
    let arguments = match function.arguments {
        Some(Value::String(arguments)) => Some(arguments),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    }
    .filter(|arguments| !arguments.is_empty());
    let id = call.id.filter(|id| !id.is_empty());
    let kind = call.kind.filter(|kind| kind == "function").map(|_| ToolCallKind::Function);
    if id.is_none() && kind.is_none() && name.is_none() && arguments.is_none() {
        return None;
    }
    let function = (name.is_some() || arguments.is_some()).then_some(FunctionCallDelta { name, arguments });
    Some(ToolCallDelta { index, id, kind, function, tool_info: None })
}

/// The message of an HTTP error response: `error.message` (or `error` when it is a
/// string, or top-level `message` or `detail`) of a JSON body, or else the body's text,
/// trimmed and shortened.
pub(crate) fn error_body_message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if let Ok(json) = serde_json::from_str::<Value>(&text) {
        let message = match json.get("error") {
            Some(error) if !error.is_null() => Some(error_value_message(error)),
            _ => ["message", "detail"]
                .iter()
                .find_map(|key| json.get(key).and_then(Value::as_str).map(str::to_owned)),
        };
        if let Some(message) = message {
            return message;
        }
    }
    // An HTML page comes from a proxy or gateway in front of the model server (a 502 of
    // nginx, say): its text, without the markup, says what it was.
    if text.trim_start_matches('\u{feff}').trim_start().starts_with('<')
        && text.to_ascii_lowercase().contains("<html")
    {
        let words = without_markup(&text).split_whitespace().collect::<Vec<_>>().join(" ");
        let said =
            if words.is_empty() { "an empty page".to_owned() } else { format!("\"{}\"", excerpt(&words)) };
        return format!("an HTML page, {said}: a proxy or gateway answered instead of the model server");
    }
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if text.is_empty() { "empty response body".to_owned() } else { excerpt(&text) }
}

/// The text of an HTML page: tags (and what `<script>` and `<style>` hold) left out.
fn without_markup(html: &str) -> String {
    // Lowered once (ASCII only, so every byte offset is the same in both).
    let lower = html.to_ascii_lowercase();
    let mut text = String::with_capacity(html.len());
    let mut at = 0;
    while let Some(start) = lower[at..].find('<').map(|start| at + start) {
        text.push_str(&html[at..start]);
        text.push(' ');
        let closing = if lower[start..].starts_with("<script") {
            "</script>"
        } else if lower[start..].starts_with("<style") {
            "</style>"
        } else {
            ">"
        };
        at = match lower[start..].find(closing) {
            Some(end) => start + end + closing.len(),
            None => html.len(),
        };
    }
    text.push_str(&html[at..]);
    text
}

/// The first [`EXCERPT_CHARS`] characters of `text`, with an ellipsis when it was longer.
pub(crate) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(EXCERPT_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Whether an error body says the account's quota is used up (OpenAI sends this with
/// 429), which waiting does not fix.
pub(crate) fn is_quota_exhausted(body: &[u8]) -> bool {
    serde_json::from_slice::<Value>(body)
        .is_ok_and(|json| json.get("error").is_some_and(says_quota_exhausted))
}
