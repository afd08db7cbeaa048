//! A tool of an MCP server, as a runner [`Tool`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::{McpServerRef, ToolInfo, ToolSpec};
use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock};
use rmcp::service::ServiceError;
use serde_json::Value;

use super::connection::Link;
use crate::tool::{SchemaValidator, Tool, ToolContext, ToolError};

/// Base64 strings longer than this are left out of a non-text result shown to the model.
const MAX_INLINE_BINARY_CHARS: usize = 256;

/// A tool of an MCP server: calling it sends `tools/call` to the server.
///
/// Its name is the tool's name on the server, unchanged, so two servers with a tool of the
/// same name clash in one agent (the agent finds the first): give such servers an
/// allow-list ([`McpServerConfig::allow_tools`]). The parameters are the server's
/// `inputSchema`; arguments are validated against it before the call. The tool is
/// [idempotent](Tool::idempotent) only when the server annotates it with
/// `idempotentHint: true`.
///
/// The tool does not keep its server connection open: once the [`McpConnection`] is
/// closed or dropped, calls fail.
///
/// [`McpServerConfig::allow_tools`]: crate::McpServerConfig::allow_tools
/// [`McpConnection`]: crate::McpConnection
pub struct McpTool {
    spec: ToolSpec,
    server: McpServerRef,
    /// Absent only when the server's schema does not compile; the server checks then.
    validator: Option<SchemaValidator>,
    idempotent: bool,
    link: Arc<Link>,
    request_timeout: Duration,
}

impl fmt::Debug for McpTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.spec.name)
            .field("server", &self.server.name)
            .field("idempotent", &self.idempotent)
            .finish_non_exhaustive()
    }
}

impl McpTool {
    pub(crate) fn new(
        tool: rmcp::model::Tool,
        server: McpServerRef,
        link: Arc<Link>,
        request_timeout: Duration,
    ) -> Self {
        let schema = Value::Object((*tool.input_schema).clone());
        let validator = SchemaValidator::new(&schema).ok();
        let mut parameters = schema;
        if let Some(object) = parameters.as_object_mut() {
            // Providers do not want the meta-schema key; the validator above honours it.
            object.remove("$schema");
            object.entry("type").or_insert_with(|| Value::String("object".to_owned()));
        }
        let description = tool
            .description
            .map(|description| description.into_owned())
            .or_else(|| tool.title.clone())
            .or_else(|| tool.annotations.as_ref().and_then(|annotations| annotations.title.clone()));
        let idempotent =
            tool.annotations.as_ref().and_then(|annotations| annotations.idempotent_hint) == Some(true);
        Self {
            spec: ToolSpec { name: tool.name.into_owned(), description, parameters },
            server,
            validator,
            idempotent,
            link,
            request_timeout,
        }
    }

    /// The server the tool belongs to.
    #[must_use]
    pub fn server(&self) -> &McpServerRef {
        &self.server
    }

    /// The routing metadata of a call of this tool (`tool_info` on tool-call events).
    #[must_use]
    pub fn tool_info(&self) -> ToolInfo {
        ToolInfo { mcp_server: Some(self.server.clone()), ..ToolInfo::local(self.spec.name.clone()) }
    }

    fn failure(&self, what: impl fmt::Display) -> ToolError {
        ToolError::Failed(format!(
            "the MCP tool `{}` of the server `{}` {what}",
            self.spec.name, self.server.name
        ))
    }

    fn service_error(&self, error: &ServiceError) -> ToolError {
        match error {
            ServiceError::McpError(error) => {
                let code = error.code.0;
                if code == rmcp::model::ErrorCode::INVALID_PARAMS.0 {
                    ToolError::InvalidArguments(error.message.to_string())
                } else {
                    self.failure(format_args!("failed: {} (JSON-RPC error {code})", error.message))
                }
            }
            ServiceError::TransportClosed => {
                self.failure("cannot be called: the connection to the server is closed")
            }
            // The transport's own error, without rmcp's wrapper naming its Rust type.
            ServiceError::TransportSend(error) => {
                self.failure(format_args!("cannot be called: sending to the server failed: {}", error.error))
            }
            ServiceError::Timeout { timeout } => {
                self.failure(format_args!("did not answer within {timeout:?}"))
            }
            ServiceError::Cancelled { reason } => self.failure(format_args!(
                "call was cancelled: {}",
                reason.as_deref().unwrap_or("no reason given")
            )),
            other => self.failure(format_args!("failed: {other}")),
        }
    }

    fn result_text(&self, result: CallToolResult) -> Result<String, ToolError> {
        let mut parts: Vec<String> = result.content.iter().map(content_text).collect();
        if parts.is_empty()
            && let Some(structured) = &result.structured_content
        {
            parts.push(structured.to_string());
        }
        let text = parts.join("\n");
        if result.is_error == Some(true) {
            let message =
                if text.is_empty() { "reported an error without a message".to_owned() } else { text };
            return Err(ToolError::Failed(message));
        }
        Ok(text)
    }
}

/// A content block as the model reads it: text as is; anything else as its JSON, with
/// long base64 payloads (images, audio, binary resources) replaced by their size.
fn content_text(content: &ContentBlock) -> String {
    if let Some(text) = content.as_text() {
        return text.text.clone();
    }
    let mut value = serde_json::to_value(content).unwrap_or_else(|error| {
        serde_json::json!({"type": "unknown", "error": format!("the content could not be shown: {error}")})
    });
    elide_binary(&mut value);
    value.to_string()
}

fn elide_binary(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for (key, field) in object.iter_mut() {
                match field {
                    Value::String(data)
                        if (key == "data" || key == "blob") && data.len() > MAX_INLINE_BINARY_CHARS =>
                    {
                        *field = Value::String(format!("<{} base64 characters left out>", data.len()));
                    }
                    _ => elide_binary(field),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(elide_binary),
        _ => {}
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    fn mcp_server(&self) -> Option<&McpServerRef> {
        Some(&self.server)
    }

    fn validate(&self, arguments: &Value) -> Result<(), ToolError> {
        self.validator.as_ref().map_or(Ok(()), |validator| validator.validate(arguments))
    }

    async fn call(&self, arguments: Value, _context: ToolContext) -> Result<String, ToolError> {
        let mut params = CallToolRequestParams::new(self.spec.name.clone());
        match arguments {
            Value::Object(arguments) => params = params.with_arguments(arguments),
            Value::Null => {}
            other => {
                return Err(ToolError::InvalidArguments(format!(
                    "the arguments must be a JSON object, not {other}"
                )));
            }
        }
        let mut peer = self.link.peer();
        if peer.is_transport_closed() {
            // The server is gone (a stdio server exited): nothing of this call was sent, so
            // the server is connected again first.
            peer = self.link.revive().await.map_err(|error| {
                self.failure(format_args!(
                    "cannot be called: its server stopped and connecting again failed: {error}"
                ))
            })?;
        }
        // Dropping the request future on timeout tells the server the call was cancelled.
        let response = tokio::time::timeout(self.request_timeout, peer.call_tool_once(params))
            .await
            .map_err(|_| self.failure(format_args!("did not answer within {:?}", self.request_timeout)))?
            .map_err(|error| self.service_error(&error))?;
        match response {
            CallToolResponse::Complete(result) => self.result_text(result),
            CallToolResponse::InputRequired(_) => Err(self.failure(
                "asked for input from the user (elicitation or sampling), which this client does not provide",
            )),
            CallToolResponse::Task(_) => {
                Err(self.failure("answered with a task to poll, which this client does not support"))
            }
            _ => Err(self.failure("answered with a response this client does not know")),
        }
    }
}
