//! Messages: roles, content (plain text or parts), and the assistant's model output.

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::Arc;

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{EventId, ThreadId};
use crate::time::Timestamp;
use crate::tool::{ToolCall, ToolCallDelta};
use crate::usage::Usage;

/// Who a message is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions from the application.
    System,
    /// Instructions from the developer (newer OpenAI models' name for system).
    Developer,
    /// The human (or calling program).
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    /// The lowercase wire name (`"user"`, `"assistant"`, …).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::System => "system",
            Self::Developer => "developer",
            Self::User => "user",
            Self::Assistant => "assistant",
            Self::Tool => "tool",
        }
    }
}

/// Why a data URI was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DataUriError {
    /// It does not start with `data:`.
    #[error("a data URI must start with `data:`")]
    MissingScheme,
    /// It is not `data:<mime>;base64,<payload>`.
    #[error("a data URI must have the form data:<mime>;base64,<payload>")]
    NotBase64,
    /// The MIME type is not `type/subtype`.
    #[error("invalid MIME type {0:?} in data URI: expected type/subtype")]
    InvalidMime(String),
    /// The payload is empty.
    #[error("the data URI payload is empty")]
    EmptyPayload,
    /// The payload is not standard base64.
    #[error("the data URI payload is not valid base64")]
    InvalidBase64,
}

/// A validated `data:<mime>;base64,<payload>` URI, the form file uploads take.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DataUri {
    uri: String,
    mime_end: usize,
}

impl DataUri {
    const PREFIX: &'static str = "data:";
    const MARKER: &'static str = ";base64,";

    /// Parses and validates a data URI: a `type/subtype` MIME type (parameters such as
    /// `;charset=utf-8` are allowed before `;base64`) and a non-empty, valid base64 payload.
    pub fn parse(uri: impl Into<String>) -> Result<Self, DataUriError> {
        let uri = uri.into();
        let rest = uri.strip_prefix(Self::PREFIX).ok_or(DataUriError::MissingScheme)?;
        let marker = rest.find(Self::MARKER).ok_or(DataUriError::NotBase64)?;
        let mime_with_params = &rest[..marker];
        let mime = mime_with_params.split(';').next().unwrap_or_default();
        if !is_valid_mime(mime) {
            return Err(DataUriError::InvalidMime(mime.to_owned()));
        }
        let payload = &rest[marker + Self::MARKER.len()..];
        if payload.is_empty() {
            return Err(DataUriError::EmptyPayload);
        }
        if base64::engine::general_purpose::STANDARD.decode(payload).is_err() {
            return Err(DataUriError::InvalidBase64);
        }
        let mime_end = Self::PREFIX.len() + mime.len();
        Ok(Self { uri, mime_end })
    }

    /// A data URI holding `bytes` with the given MIME type.
    pub fn encode(mime: &str, bytes: &[u8]) -> Result<Self, DataUriError> {
        if !is_valid_mime(mime) {
            return Err(DataUriError::InvalidMime(mime.to_owned()));
        }
        if bytes.is_empty() {
            return Err(DataUriError::EmptyPayload);
        }
        let payload = base64::engine::general_purpose::STANDARD.encode(bytes);
        let uri = format!("{}{mime}{}{payload}", Self::PREFIX, Self::MARKER);
        Ok(Self { mime_end: Self::PREFIX.len() + mime.len(), uri })
    }

    /// The MIME type, such as `image/png`.
    #[must_use]
    pub fn mime(&self) -> &str {
        &self.uri[Self::PREFIX.len()..self.mime_end]
    }

    /// Whether the MIME type is an image type.
    #[must_use]
    pub fn is_image(&self) -> bool {
        self.mime().starts_with("image/")
    }

    /// The base64 payload.
    #[must_use]
    pub fn payload(&self) -> &str {
        let marker = self.uri.find(Self::MARKER).unwrap_or(self.uri.len());
        self.uri.get(marker + Self::MARKER.len()..).unwrap_or_default()
    }

    /// The decoded bytes.
    #[must_use]
    pub fn decode(&self) -> Vec<u8> {
        // The payload was validated when the URI was built.
        base64::engine::general_purpose::STANDARD.decode(self.payload()).unwrap_or_default()
    }

    /// The whole URI.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.uri
    }
}

fn is_valid_mime(mime: &str) -> bool {
    let token =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$&^_.+-".contains(&b));
    match mime.split_once('/') {
        Some((kind, sub)) => token(kind) && token(sub),
        None => false,
    }
}

impl fmt::Debug for DataUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The payload can be megabytes; show its size, not its bytes.
        write!(f, "DataUri({}, {} base64 chars)", self.mime(), self.payload().len())
    }
}

impl FromStr for DataUri {
    type Err = DataUriError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for DataUri {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.uri)
    }
}

impl<'de> Deserialize<'de> for DataUri {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(s).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for DataUri {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DataUri".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^data:[^;,]+/[^;,]+(;[^,]*)?;base64,.+$",
            "description": "data:<mime>;base64,<payload>"
        })
    }
}

/// A file attached to a message.
///
/// Serializes as the harness client does (`{"type": "file", "name", "data"}`); also reads
/// the form of the harness documentation (`{"type": "file_upload", "file": {"filename",
/// "file_data"}}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct FilePart {
    /// The file's name.
    pub name: String,
    /// Its content.
    pub data: DataUri,
}

#[derive(Deserialize)]
struct FilePartWire {
    name: Option<String>,
    data: Option<DataUri>,
    file: Option<NestedFile>,
}

#[derive(Deserialize)]
struct NestedFile {
    filename: String,
    file_data: DataUri,
}

impl<'de> Deserialize<'de> for FilePart {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        match FilePartWire::deserialize(deserializer)? {
            FilePartWire { file: Some(file), .. } => Ok(Self { name: file.filename, data: file.file_data }),
            FilePartWire { name: Some(name), data: Some(data), .. } => Ok(Self { name, data }),
            FilePartWire { name: None, .. } => Err(D::Error::missing_field("name")),
            FilePartWire { data: None, .. } => Err(D::Error::missing_field("data")),
        }
    }
}

/// An image given by URL (`https://…` or a `data:` URI), as in OpenAI's chat format.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageUrl {
    /// Where the image is.
    pub url: String,
    /// Requested detail level (`auto`, `low`, `high`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum ContentPart {
    /// Text.
    #[serde(rename = "text")]
    Text {
        /// The text.
        text: String,
    },
    /// A file upload as a data URI.
    #[serde(rename = "file", alias = "file_upload")]
    File(FilePart),
    /// An image by URL.
    #[serde(rename = "image_url")]
    Image {
        /// The image.
        image_url: ImageUrl,
    },
}

/// A message's content: plain text, or a list of parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Text, files and images.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the content: the string, or the text parts joined with newlines.
    #[must_use]
    pub fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::Parts(parts) => parts
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// Whether there is nothing in it: an empty string, no parts, or only empty text parts.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        match self {
            Self::Text(text) => text.trim().is_empty(),
            Self::Parts(parts) => {
                parts.iter().all(|part| matches!(part, ContentPart::Text { text } if text.trim().is_empty()))
            }
        }
    }
}

impl From<&str> for MessageContent {
    fn from(text: &str) -> Self {
        Self::Text(text.to_owned())
    }
}

impl From<String> for MessageContent {
    fn from(text: String) -> Self {
        Self::Text(text)
    }
}

/// A message of a conversation, as sent to a model and kept in history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Message {
    /// Who it is from.
    pub role: Role,
    /// What it says; absent for an assistant message that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// An optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls made by an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message, the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Reasoning the model produced before answering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Whether this message was replayed from history rather than produced in this run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub from_history: bool,
    /// When it was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<Timestamp>,
}

impl Message {
    /// A message with a role and text content.
    #[must_use]
    pub fn new(role: Role, content: impl Into<MessageContent>) -> Self {
        Self {
            role,
            content: Some(content.into()),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            reasoning_content: None,
            from_history: false,
            created_at: None,
        }
    }

    /// A system message.
    #[must_use]
    pub fn system(content: impl Into<MessageContent>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    #[must_use]
    pub fn user(content: impl Into<MessageContent>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message with text.
    #[must_use]
    pub fn assistant(content: impl Into<MessageContent>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// A tool result answering `tool_call_id`.
    #[must_use]
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<MessageContent>) -> Self {
        Self { tool_call_id: Some(tool_call_id.into()), ..Self::new(Role::Tool, content) }
    }

    /// The assistant message a model produced. A refusal without text becomes its
    /// content: it is what the model said, and the model sees it in later requests.
    ///
    /// ```
    /// use agentry_types::{Message, ModelMessage};
    /// let refused = ModelMessage { refusal: Some("I can't help with that.".into()), ..ModelMessage::default() };
    /// assert_eq!(Message::from_model(&refused).text(), "I can't help with that.");
    /// ```
    #[must_use]
    pub fn from_model(message: &ModelMessage) -> Self {
        let content = match (&message.content, &message.refusal) {
            (Some(text), Some(refusal)) if text.is_empty() => Some(refusal.clone()),
            (None, Some(refusal)) => Some(refusal.clone()),
            (content, _) => content.clone(),
        };
        Self {
            role: Role::Assistant,
            content: content.map(MessageContent::Text),
            name: message.name.clone(),
            tool_calls: message.tool_calls.clone(),
            tool_call_id: None,
            reasoning_content: message.reasoning_content.clone(),
            from_history: false,
            created_at: None,
        }
    }

    /// The message's text (empty when it has none).
    #[must_use]
    pub fn text(&self) -> String {
        self.content.as_ref().map(MessageContent::text).unwrap_or_default()
    }
}

impl AsRef<Message> for Message {
    fn as_ref(&self) -> &Message {
        self
    }
}

/// A message of a model request's context: a shared [`Message`], and whether this
/// request replays it from history.
///
/// The message is shared (an `Arc`), so a context built from stored history, and every
/// copy of it, copies none of the messages' text. It reads as the message it holds
/// (`Deref`), except that its own [`from_history`](Self::from_history) field, which
/// shadows the message's, says whether it was replayed: the same stored message is new
/// in the run that produced it and replayed in every later one.
///
/// ```
/// use std::sync::Arc;
/// use agentry_types::{ContextMessage, Message, Role};
/// let stored = Arc::new(Message::user("What is 6 * 7?"));
/// let replayed = ContextMessage::replayed(Arc::clone(&stored));
/// assert!(replayed.from_history && !stored.from_history);
/// assert_eq!(replayed.role, Role::User);
/// assert!(replayed.to_message().from_history);
/// assert!(format!("{replayed:?}").contains("from_history: true"));
/// assert!(Arc::ptr_eq(replayed.shared_message(), &stored));
/// ```
#[derive(Clone)]
pub struct ContextMessage {
    /// Whether the message was replayed from history rather than produced in this run.
    pub from_history: bool,
    message: Arc<Message>,
}

impl ContextMessage {
    /// The message as it is: replayed if its own `from_history` says so.
    #[must_use]
    pub fn new(message: Arc<Message>) -> Self {
        Self { from_history: message.from_history, message }
    }

    /// The message, replayed from history.
    #[must_use]
    pub fn replayed(message: Arc<Message>) -> Self {
        Self { from_history: true, message }
    }

    /// The shared message, with its own `from_history`.
    #[must_use]
    pub fn shared_message(&self) -> &Arc<Message> {
        &self.message
    }

    /// A copy of the message, with this context's `from_history`.
    #[must_use]
    pub fn to_message(&self) -> Message {
        Message { from_history: self.from_history, ..Message::clone(&self.message) }
    }

    /// The message, with this context's `from_history` (copied only if it is shared).
    #[must_use]
    pub fn into_message(self) -> Message {
        Message { from_history: self.from_history, ..Arc::unwrap_or_clone(self.message) }
    }
}

/// The message as stored: its `from_history` is the stored one, not this context's (read
/// the field on the `ContextMessage`, or [`ContextMessage::to_message`]).
impl Deref for ContextMessage {
    type Target = Message;

    fn deref(&self) -> &Message {
        &self.message
    }
}

/// The message as stored, as [`Deref`] gives it.
impl AsRef<Message> for ContextMessage {
    fn as_ref(&self) -> &Message {
        &self.message
    }
}

impl From<Message> for ContextMessage {
    fn from(message: Message) -> Self {
        Self::new(Arc::new(message))
    }
}

impl From<Arc<Message>> for ContextMessage {
    fn from(message: Arc<Message>) -> Self {
        Self::new(message)
    }
}

impl ContextMessage {
    /// The message as this context gives it (with this context's `from_history`),
    /// borrowed: what `Debug` shows and `PartialEq` compares.
    fn view(&self) -> view::ContextMessage<'_> {
        let Message {
            role,
            content,
            name,
            tool_calls,
            tool_call_id,
            reasoning_content,
            from_history: _,
            created_at,
        } = &*self.message;
        view::ContextMessage {
            role,
            content,
            name,
            tool_calls,
            tool_call_id,
            reasoning_content,
            from_history: self.from_history,
            created_at,
        }
    }
}

mod view {
    use super::{MessageContent, Role, Timestamp, ToolCall};

    /// A [`super::ContextMessage`] as it gives its message (named alike for `Debug`).
    #[derive(Debug, PartialEq)]
    pub(super) struct ContextMessage<'a> {
        pub(super) role: &'a Role,
        pub(super) content: &'a Option<MessageContent>,
        pub(super) name: &'a Option<String>,
        pub(super) tool_calls: &'a Vec<ToolCall>,
        pub(super) tool_call_id: &'a Option<String>,
        pub(super) reasoning_content: &'a Option<String>,
        pub(super) from_history: bool,
        pub(super) created_at: &'a Option<Timestamp>,
    }
}

/// Shows the message as this context gives it: with this context's `from_history`.
impl fmt::Debug for ContextMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.view().fmt(f)
    }
}

/// Equal when they would give equal messages: the message's own `from_history` is not
/// compared, this context's is.
impl PartialEq for ContextMessage {
    fn eq(&self, other: &Self) -> bool {
        self.view() == other.view()
    }
}

/// Why a model stopped producing a message. Unknown values from providers are kept.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A natural stop or a stop sequence.
    Stop,
    /// The token limit was reached.
    Length,
    /// The model called tools.
    ToolCalls,
    /// Content was filtered.
    ContentFilter,
    /// The legacy function-call form.
    FunctionCall,
    /// A value this version does not know, kept as sent.
    Other(String),
}

impl FinishReason {
    /// The wire value.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
            Self::FunctionCall => "function_call",
            Self::Other(other) => other,
        }
    }

    /// Reads a wire value; unknown values become [`FinishReason::Other`].
    #[must_use]
    pub fn from_wire(value: &str) -> Self {
        match value {
            "stop" => Self::Stop,
            "length" => Self::Length,
            "tool_calls" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
            "function_call" => Self::FunctionCall,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl Serialize for FinishReason {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl FromStr for FinishReason {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Self::from_wire(s))
    }
}

impl<'de> Deserialize<'de> for FinishReason {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(crate::ids::ParseVisitor::<Self>::new("finish reason"))
    }
}

impl JsonSchema for FinishReason {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "FinishReason".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "stop, length, tool_calls, content_filter, function_call, or a provider-specific value"
        })
    }
}

/// A complete message from a model: text, reasoning and tool calls, assembled from its
/// deltas.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelMessage {
    /// The assistant's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Reasoning text, where the provider sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// A refusal, where the provider sends one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// The tool calls, in index order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why the message ended; absent only on a message cut short (by cancellation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Token usage of the model call that produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The author name, if the provider set one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ModelMessage {
    /// The deltas a provider would stream for this message: reasoning, text and refusal in
    /// pieces of `chunk` characters (at least 1), each tool call opened by a chunk with its
    /// id, type, name and routing metadata and followed by its arguments in pieces, and a
    /// last delta with the finish reason and usage. Merging them gives the message back
    /// (its `name` aside, which deltas do not carry).
    #[must_use]
    pub fn to_deltas(&self, chunk: usize) -> Vec<ModelMessageDelta> {
        self.clone().into_deltas(chunk).collect()
    }

    /// [`ModelMessage::to_deltas`], made one at a time as they are taken: a long message
    /// never exists as all of its deltas at once.
    pub fn into_deltas(self, chunk: usize) -> impl Iterator<Item = ModelMessageDelta> + Send + 'static {
        let chunk = chunk.max(1);
        let Self { content, reasoning_content, refusal, tool_calls, finish_reason, usage, name: _ } = self;
        let reasoning = pieces(reasoning_content, chunk).map(|piece| ModelMessageDelta {
            reasoning_content: Some(piece),
            ..ModelMessageDelta::default()
        });
        let text = pieces(content, chunk).map(ModelMessageDelta::text);
        let refusal = pieces(refusal, chunk)
            .map(|piece| ModelMessageDelta { refusal: Some(piece), ..ModelMessageDelta::default() });
        let calls = tool_calls.into_iter().enumerate().flat_map(move |(index, call)| {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let ToolCall { id, kind, function, tool_info } = call;
            let opening = ModelMessageDelta {
                tool_calls: vec![ToolCallDelta {
                    index,
                    id: Some(id),
                    kind: Some(kind),
                    function: Some(crate::tool::FunctionCallDelta {
                        name: Some(function.name),
                        arguments: None,
                    }),
                    tool_info,
                }],
                ..ModelMessageDelta::default()
            };
            let arguments = pieces(Some(function.arguments), chunk).map(move |piece| ModelMessageDelta {
                tool_calls: vec![ToolCallDelta {
                    index,
                    function: Some(crate::tool::FunctionCallDelta { name: None, arguments: Some(piece) }),
                    ..ToolCallDelta::default()
                }],
                ..ModelMessageDelta::default()
            });
            std::iter::once(opening).chain(arguments)
        });
        let last = ModelMessageDelta { finish_reason, usage, ..ModelMessageDelta::default() };
        reasoning.chain(text).chain(refusal).chain(calls).chain(std::iter::once(last))
    }
}

/// The pieces of `chunk` characters (the last one shorter) of a text, cut at character
/// boundaries as they are taken.
fn pieces(text: Option<String>, chunk: usize) -> impl Iterator<Item = String> + Send + 'static {
    let text = text.unwrap_or_default();
    let mut at = 0;
    std::iter::from_fn(move || {
        let rest = text.get(at..).filter(|rest| !rest.is_empty())?;
        let end = rest.char_indices().nth(chunk).map_or(rest.len(), |(end, _)| end);
        at += end;
        rest.get(..end).map(str::to_owned)
    })
}

/// An increment of a [`ModelMessage`] as a model streams it.
///
/// Text, reasoning and refusal are appended; tool-call chunks merge by `index`;
/// `finish_reason` and `usage` overwrite. A delta with a `finish_reason` completes its
/// message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ModelMessageDelta {
    /// Text to append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Reasoning text to append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Refusal text to append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// Tool-call chunks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
    /// Set on the last delta of a message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Usage, usually on the last delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ModelMessageDelta {
    /// A delta carrying only text.
    #[must_use]
    pub fn text(content: impl Into<String>) -> Self {
        Self { content: Some(content.into()), ..Self::default() }
    }

    /// Whether it carries nothing at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.content.is_none()
            && self.reasoning_content.is_none()
            && self.refusal.is_none()
            && self.tool_calls.is_empty()
            && self.finish_reason.is_none()
            && self.usage.is_none()
    }
}

/// A model message as it was recorded on a thread: the message with its event id,
/// thread and time. This is the output of a turn and of a sub-agent thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ThreadMessage {
    /// The id of the `model.message` event.
    pub id: EventId,
    /// The thread that produced it.
    pub thread_id: ThreadId,
    /// When it was created.
    pub created_at: Timestamp,
    /// The message.
    #[serde(flatten)]
    pub message: ModelMessage,
}
