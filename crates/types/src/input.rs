//! Turn input: user messages, tool approvals and client-side tool responses, and the
//! rules that decide whether an input may start a turn.
//!
//! The rules (from the harness specification):
//! - user messages cannot be mixed with tool approvals or tool responses in one input;
//!   approvals and responses may be mixed together;
//! - approvals and responses answer exactly the tool calls the previous turn left
//!   pending: one answer per call, of the right kind, on the call's thread, none unknown,
//!   none twice, none missing;
//! - a turn resuming after `mcp.auth_required` alone takes no input;
//! - a new conversation turn needs at least one non-empty user message.
//!
//! [`validate_turn_input`] applies them and returns a typed error naming what is wrong.

use std::collections::HashMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::ThreadId;
use crate::message::{ContentPart, DataUri, MessageContent};
use crate::status::{McpServerAuth, RequiredAction, RequiredActionRecord};
use crate::tool::PendingToolCall;

/// A user message: text, or parts with files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UserMessage {
    /// The text or the parts.
    pub content: MessageContent,
}

/// A human's decision on a tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum ApprovalDecision {
    /// Run the call.
    Allow,
    /// Do not run it; the reason is given to the model.
    Deny {
        /// Why, for the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
}

/// The answer to one `tool.approval_required` call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UserToolApproval {
    /// The thread from the `tool.approval_required` event.
    pub thread_id: ThreadId,
    /// The call being decided.
    pub tool_call_id: String,
    /// The decision.
    pub approval: ApprovalDecision,
}

/// The result of one client-side tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UserToolResponse {
    /// The thread from the `tool.response_required` event.
    pub thread_id: ThreadId,
    /// The call answered.
    pub tool_call_id: String,
    /// The result for the agent.
    pub content: String,
}

/// One item of a turn's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum TurnInputItem {
    /// A user message.
    #[serde(rename = "user.message")]
    Message(UserMessage),
    /// A decision on a pending tool call.
    #[serde(rename = "user.tool_approval")]
    ToolApproval(UserToolApproval),
    /// A result for a pending client-side tool call.
    #[serde(rename = "user.tool_response")]
    ToolResponse(UserToolResponse),
}

impl TurnInputItem {
    /// A user message with plain text.
    #[must_use]
    pub fn message(text: impl Into<String>) -> Self {
        Self::Message(UserMessage { content: MessageContent::Text(text.into()) })
    }

    /// An approval (allow) of a pending call.
    #[must_use]
    pub fn allow(thread_id: ThreadId, tool_call_id: impl Into<String>) -> Self {
        Self::ToolApproval(UserToolApproval {
            thread_id,
            tool_call_id: tool_call_id.into(),
            approval: ApprovalDecision::Allow,
        })
    }

    /// A denial of a pending call, with an optional reason for the model.
    #[must_use]
    pub fn deny(thread_id: ThreadId, tool_call_id: impl Into<String>, reason: Option<String>) -> Self {
        Self::ToolApproval(UserToolApproval {
            thread_id,
            tool_call_id: tool_call_id.into(),
            approval: ApprovalDecision::Deny { reason },
        })
    }

    /// A result for a pending client-side call.
    #[must_use]
    pub fn respond(thread_id: ThreadId, tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self::ToolResponse(UserToolResponse {
            thread_id,
            tool_call_id: tool_call_id.into(),
            content: content.into(),
        })
    }
}

/// Which kind of answer a pending tool call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A `user.tool_approval`.
    Approval,
    /// A `user.tool_response`.
    Response,
}

impl PendingKind {
    fn input_type(self) -> &'static str {
        match self {
            Self::Approval => "user.tool_approval",
            Self::Response => "user.tool_response",
        }
    }
}

/// A tool call the next turn must answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PendingCall {
    /// The thread that made it.
    pub thread_id: ThreadId,
    /// Which answer it needs.
    pub kind: PendingKind,
    /// The call.
    pub call: PendingToolCall,
}

/// What the previous turn left for the next one to answer.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PendingActions {
    /// Tool calls awaiting approvals or responses.
    pub calls: Vec<PendingCall>,
    /// MCP servers awaiting authorization.
    pub mcp_auth: Vec<McpServerAuth>,
}

impl PendingActions {
    /// Nothing pending: the previous turn finished normally, or there is none.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// The pending actions of a turn that ended with these required actions.
    #[must_use]
    pub fn from_required_actions(actions: &[RequiredActionRecord]) -> Self {
        let mut pending = Self::default();
        for record in actions {
            match &record.action {
                RequiredAction::ToolApproval { thread_id, tool_calls } => {
                    pending.push_calls(thread_id, PendingKind::Approval, tool_calls);
                }
                RequiredAction::ToolResponse { thread_id, tool_calls } => {
                    pending.push_calls(thread_id, PendingKind::Response, tool_calls);
                }
                RequiredAction::McpAuth { servers, .. } => pending.mcp_auth.extend(servers.iter().cloned()),
            }
        }
        pending
    }

    fn push_calls(&mut self, thread_id: &ThreadId, kind: PendingKind, calls: &[PendingToolCall]) {
        self.calls.extend(calls.iter().map(|call| PendingCall {
            thread_id: thread_id.clone(),
            kind,
            call: call.clone(),
        }));
    }

    /// Whether nothing is pending.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.mcp_auth.is_empty()
    }
}

/// A tool call with the human's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecidedCall {
    /// The thread that made the call.
    pub thread_id: ThreadId,
    /// The call.
    pub call: PendingToolCall,
    /// The decision.
    pub decision: ApprovalDecision,
}

/// A client-side tool call with its result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnsweredCall {
    /// The thread that made the call.
    pub thread_id: ThreadId,
    /// The call.
    pub call: PendingToolCall,
    /// The client's result.
    pub content: String,
}

/// A turn input that passed every rule, in the form the runner acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValidatedInput {
    /// A new conversation step: one or more user messages.
    Messages(Vec<UserMessage>),
    /// Answers to every pending tool call, in the order the calls were made.
    Resume {
        /// Approval decisions.
        approvals: Vec<DecidedCall>,
        /// Client-side results.
        responses: Vec<AnsweredCall>,
    },
    /// Resume after the user authorized the MCP servers; no input.
    McpAuthorized,
}

/// Why a turn input was refused. Nothing is changed when this is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TurnInputError {
    /// No input, and nothing is pending that an empty input could resume.
    #[error("the input is empty: send a user.message")]
    Empty,
    /// A user message has no text and no files.
    #[error("input item {index}: the user.message has no content")]
    EmptyMessage {
        /// Position in the input list.
        index: usize,
    },
    /// A file part has no name.
    #[error("input item {index}: a file part has an empty name")]
    UnnamedFile {
        /// Position in the input list.
        index: usize,
    },
    /// An image part's URL is neither `http(s)://…` nor a valid `data:` URI.
    #[error("input item {index}: invalid image URL: {reason}")]
    InvalidImageUrl {
        /// Position in the input list.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// User messages and tool answers were mixed.
    #[error("user.message cannot be mixed with user.tool_approval or user.tool_response in one input")]
    MessageMixedWithToolInput,
    /// Input was given to a turn that resumes after `mcp.auth_required`, which takes none.
    #[error("the previous turn ended with mcp.auth_required: resume with an empty input")]
    InputAfterMcpAuth,
    /// A user message was sent while tool calls await answers.
    #[error("tool calls are awaiting answers ({}): answer them before sending a user.message", .pending.join(", "))]
    PendingToolCalls {
        /// The ids of the waiting calls.
        pending: Vec<String>,
    },
    /// An approval or response was sent, but no tool call is pending.
    #[error("input item {index}: no tool call is pending, so tool call {tool_call_id:?} cannot be answered")]
    NothingPending {
        /// Position in the input list.
        index: usize,
        /// The call it tried to answer.
        tool_call_id: String,
    },
    /// An approval or response names a call that is not pending.
    #[error("input item {index}: tool call {tool_call_id:?} is not pending")]
    UnknownToolCall {
        /// Position in the input list.
        index: usize,
        /// The unknown id.
        tool_call_id: String,
    },
    /// A call was answered twice.
    #[error("input item {index}: tool call {tool_call_id:?} is answered more than once")]
    DuplicateAnswer {
        /// Position of the second answer.
        index: usize,
        /// The call.
        tool_call_id: String,
    },
    /// The answer names a different thread than the pending call's.
    #[error("input item {index}: tool call {tool_call_id:?} belongs to thread {expected:?}, not {given:?}")]
    WrongThread {
        /// Position in the input list.
        index: usize,
        /// The call.
        tool_call_id: String,
        /// The call's thread.
        expected: String,
        /// The thread given.
        given: String,
    },
    /// An approval answered a call that needs a response, or the other way round.
    #[error("input item {index}: tool call {tool_call_id:?} needs a {expected}, not a {given}")]
    WrongAnswerKind {
        /// Position in the input list.
        index: usize,
        /// The call.
        tool_call_id: String,
        /// The input type the call needs.
        expected: &'static str,
        /// The input type given.
        given: &'static str,
    },
    /// Some pending calls were not answered.
    #[error("tool calls left unanswered: {}", .tool_call_ids.join(", "))]
    MissingAnswers {
        /// The ids of the unanswered calls.
        tool_call_ids: Vec<String>,
    },
}

/// Checks a turn's input against what the previous turn left pending.
///
/// Returns the input in the form the runner acts on, or the first rule it breaks
/// (`MissingAnswers` lists every unanswered call at once).
pub fn validate_turn_input(
    input: &[TurnInputItem],
    pending: &PendingActions,
) -> Result<ValidatedInput, TurnInputError> {
    let has_message = input.iter().any(|item| matches!(item, TurnInputItem::Message(_)));
    let has_tool_input = input.iter().any(|item| !matches!(item, TurnInputItem::Message(_)));
    if has_message && has_tool_input {
        return Err(TurnInputError::MessageMixedWithToolInput);
    }

    if input.is_empty() {
        if !pending.calls.is_empty() {
            return Err(TurnInputError::MissingAnswers { tool_call_ids: pending_ids(pending) });
        }
        if !pending.mcp_auth.is_empty() {
            return Ok(ValidatedInput::McpAuthorized);
        }
        return Err(TurnInputError::Empty);
    }

    if has_message {
        if pending.calls.is_empty() && !pending.mcp_auth.is_empty() {
            return Err(TurnInputError::InputAfterMcpAuth);
        }
        if !pending.calls.is_empty() {
            return Err(TurnInputError::PendingToolCalls { pending: pending_ids(pending) });
        }
        let mut messages = Vec::with_capacity(input.len());
        for (index, item) in input.iter().enumerate() {
            if let TurnInputItem::Message(message) = item {
                check_message(index, message)?;
                messages.push(message.clone());
            }
        }
        return Ok(ValidatedInput::Messages(messages));
    }

    validate_answers(input, pending)
}

fn check_message(index: usize, message: &UserMessage) -> Result<(), TurnInputError> {
    if message.content.is_empty() {
        return Err(TurnInputError::EmptyMessage { index });
    }
    if let MessageContent::Parts(parts) = &message.content {
        for part in parts {
            match part {
                ContentPart::File(file) if file.name.trim().is_empty() => {
                    return Err(TurnInputError::UnnamedFile { index });
                }
                ContentPart::Image { image_url } => check_image_url(index, &image_url.url)?,
                _ => {}
            }
        }
    }
    Ok(())
}

fn check_image_url(index: usize, url: &str) -> Result<(), TurnInputError> {
    if url.starts_with("data:") {
        let uri = DataUri::parse(url)
            .map_err(|error| TurnInputError::InvalidImageUrl { index, reason: error.to_string() })?;
        if !uri.is_image() {
            return Err(TurnInputError::InvalidImageUrl {
                index,
                reason: format!("{} is not an image type", uri.mime()),
            });
        }
        return Ok(());
    }
    if url.starts_with("https://") || url.starts_with("http://") {
        return Ok(());
    }
    Err(TurnInputError::InvalidImageUrl {
        index,
        reason: "expected an http(s):// URL or a data: URI".to_owned(),
    })
}

fn validate_answers(
    input: &[TurnInputItem],
    pending: &PendingActions,
) -> Result<ValidatedInput, TurnInputError> {
    if pending.calls.is_empty() {
        if !pending.mcp_auth.is_empty() {
            return Err(TurnInputError::InputAfterMcpAuth);
        }
        let (index, tool_call_id) = input
            .iter()
            .enumerate()
            .find_map(|(index, item)| answer_target(item).map(|(_, id, _)| (index, id.to_owned())))
            .unwrap_or_default();
        return Err(TurnInputError::NothingPending { index, tool_call_id });
    }

    // A call is its thread and its id: two threads (members on models of their own) may
    // give their calls the same id.
    let by_key: HashMap<(&ThreadId, &str), &PendingCall> =
        pending.calls.iter().map(|call| ((&call.thread_id, call.call.id.as_str()), call)).collect();
    let mut answered: HashMap<(&ThreadId, &str), usize> = HashMap::with_capacity(input.len());

    for (index, item) in input.iter().enumerate() {
        let Some((thread_id, tool_call_id, given_kind)) = answer_target(item) else { continue };
        let Some(call) = by_key.get(&(thread_id, tool_call_id)) else {
            return Err(match pending.calls.iter().find(|call| call.call.id == tool_call_id) {
                Some(elsewhere) => TurnInputError::WrongThread {
                    index,
                    tool_call_id: tool_call_id.to_owned(),
                    expected: elsewhere.thread_id.to_string(),
                    given: thread_id.to_string(),
                },
                None => TurnInputError::UnknownToolCall { index, tool_call_id: tool_call_id.to_owned() },
            });
        };
        if call.kind != given_kind {
            return Err(TurnInputError::WrongAnswerKind {
                index,
                tool_call_id: tool_call_id.to_owned(),
                expected: call.kind.input_type(),
                given: given_kind.input_type(),
            });
        }
        if answered.insert((thread_id, tool_call_id), index).is_some() {
            return Err(TurnInputError::DuplicateAnswer { index, tool_call_id: tool_call_id.to_owned() });
        }
    }

    let missing: Vec<String> = pending
        .calls
        .iter()
        .filter(|call| !answered.contains_key(&(&call.thread_id, call.call.id.as_str())))
        .map(|call| call.call.id.clone())
        .collect();
    if !missing.is_empty() {
        return Err(TurnInputError::MissingAnswers { tool_call_ids: missing });
    }

    let mut approvals = Vec::new();
    let mut responses = Vec::new();
    for call in &pending.calls {
        let Some(&index) = answered.get(&(&call.thread_id, call.call.id.as_str())) else { continue };
        match &input[index] {
            TurnInputItem::ToolApproval(approval) => approvals.push(DecidedCall {
                thread_id: call.thread_id.clone(),
                call: call.call.clone(),
                decision: approval.approval.clone(),
            }),
            TurnInputItem::ToolResponse(response) => responses.push(AnsweredCall {
                thread_id: call.thread_id.clone(),
                call: call.call.clone(),
                content: response.content.clone(),
            }),
            TurnInputItem::Message(_) => {}
        }
    }
    Ok(ValidatedInput::Resume { approvals, responses })
}

fn answer_target(item: &TurnInputItem) -> Option<(&ThreadId, &str, PendingKind)> {
    match item {
        TurnInputItem::Message(_) => None,
        TurnInputItem::ToolApproval(approval) => {
            Some((&approval.thread_id, approval.tool_call_id.as_str(), PendingKind::Approval))
        }
        TurnInputItem::ToolResponse(response) => {
            Some((&response.thread_id, response.tool_call_id.as_str(), PendingKind::Response))
        }
    }
}

fn pending_ids(pending: &PendingActions) -> Vec<String> {
    pending.calls.iter().map(|call| call.call.id.clone()).collect()
}
