//! Tool calls, their streaming chunks, their routing metadata, and tool specifications.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::EventId;

/// The kind of a tool call; OpenAI's format knows only `function`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolCallKind {
    /// A function call.
    #[default]
    Function,
}

/// The MCP server behind a tool.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct McpServerRef {
    /// The server's id.
    pub id: String,
    /// The server's name.
    pub name: String,
}

/// Routing metadata of a tool call: where the tool lives and how it must be run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct ToolInfo {
    /// The tool's name at its origin (an MCP tool's name on its server).
    pub original_tool_name: String,
    /// The MCP server the tool comes from; absent for tools defined in-process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<McpServerRef>,
    /// Whether a human must approve the call before it runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_approval_required: bool,
    /// Whether the call runs later, outside the turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_deferred: bool,
    /// Whether the client runs the tool (for example `ask_user_question`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_client_side: bool,
}

impl ToolInfo {
    /// Metadata of an in-process tool that runs without approval.
    #[must_use]
    pub fn local(name: impl Into<String>) -> Self {
        Self {
            original_tool_name: name.into(),
            mcp_server: None,
            is_approval_required: false,
            is_deferred: false,
            is_client_side: false,
        }
    }
}

/// The function a tool call invokes, with its complete arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCall {
    /// The tool name.
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

/// A complete tool call, shaped like OpenAI's `ChatCompletionMessageToolCall`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct ToolCall {
    /// The call id, unique within the turn.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default)]
    pub kind: ToolCallKind,
    /// The function and its arguments.
    pub function: FunctionCall,
    /// Routing metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_info: Option<ToolInfo>,
}

impl ToolCall {
    /// A function call with JSON-string arguments.
    #[must_use]
    pub fn function(id: impl Into<String>, name: impl Into<String>, arguments: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            kind: ToolCallKind::Function,
            function: FunctionCall { name: name.into(), arguments: arguments.into() },
            tool_info: None,
        }
    }
}

/// Part of a tool call's function as it streams.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FunctionCallDelta {
    /// The tool name; on the first chunk of an index only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A piece of the JSON arguments, to be concatenated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A streaming tool-call chunk, shaped like OpenAI's chunk delta: chunks with the same
/// `index` belong to one call; `id`, `type`, `name` and `tool_info` come on the first one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCallDelta {
    /// Position in the message's `tool_calls`.
    pub index: u32,
    /// The call id; first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`; first chunk only.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ToolCallKind>,
    /// Name and a piece of the arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionCallDelta>,
    /// Routing metadata; first chunk only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_info: Option<ToolInfo>,
}

/// A tool call awaiting a human decision or a client-supplied result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct PendingToolCall {
    /// The tool call id.
    pub id: String,
    /// The id of the `model.message` event that made the call.
    pub source_event_id: EventId,
    /// The tool name.
    pub name: String,
    /// The call's arguments as a JSON string.
    pub arguments: String,
    /// The call was started by a process that stopped before its result was stored, and
    /// its tool is not safe to repeat: it may already have run. Allowing it runs it again;
    /// a denial (with what happened, say) goes to the model instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub may_have_run: bool,
}

/// What a model is told about a tool: its name, description and JSON Schema parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: serde_json::Value,
}
