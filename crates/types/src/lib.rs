//! Pure data types of the Agentry agent runtime.
//!
//! Everything here is plain data with serde and JSON Schema derivations: identifiers
//! ([`SessionId`], [`TurnId`], [`EventId`], [`ThreadId`]), [`Timestamp`]s, chat
//! [`Message`]s with text or file parts, tool calls and their streaming chunks, token
//! [`Usage`], run statuses and [`TurnState`]s, turn input with its validation rules
//! ([`validate_turn_input`]), and the data classes of AdalFlow ([`adalflow`]) and Agno
//! ([`agno`]) that the runtime's views are built from.
//!
//! This crate knows nothing of async, storage or transport.
//!
//! ```
//! use agentry_types::{validate_turn_input, PendingActions, TurnInputItem, ValidatedInput};
//!
//! let input = vec![TurnInputItem::message("What is 6 × 7?")];
//! let validated = validate_turn_input(&input, &PendingActions::none()).unwrap();
//! assert!(matches!(validated, ValidatedInput::Messages(ref messages) if messages.len() == 1));
//!
//! // A user message cannot be mixed with tool answers.
//! let mixed = vec![
//!     TurnInputItem::message("hi"),
//!     TurnInputItem::allow(agentry_types::ThreadId::main(), "call_1"),
//! ];
//! assert!(validate_turn_input(&mixed, &PendingActions::none()).is_err());
//! ```

pub mod adalflow;
pub mod agno;
mod budget;
mod fixed_text;
mod ids;
mod input;
mod message;
mod record;
mod status;
mod time;
mod tool;
mod usage;

pub use budget::{BudgetLimit, BudgetUsage};
pub use fixed_text::{FIXED_TEXT, FIXED_TEXT_MAX_LEN};
pub use ids::{EventId, InvalidId, SessionId, ThreadId, TurnId, name_based_uuid};
pub use input::{
    AnsweredCall, ApprovalDecision, DecidedCall, PendingActions, PendingCall, PendingKind, TurnInputError,
    TurnInputItem, UserMessage, UserToolApproval, UserToolResponse, ValidatedInput, validate_turn_input,
};
pub use message::{
    ContentPart, ContextMessage, DataUri, DataUriError, FilePart, FinishReason, ImageUrl, Message,
    MessageContent, ModelMessage, ModelMessageDelta, Role, ThreadMessage,
};
pub use record::{
    BudgetLedger, BudgetReservation, CLIENT_CONTEXT_HEADING, ClientContext, Fence, HistoryMessage,
    JournalEntry, Lease, RunRecord, SessionRecord, SessionType, ToolResult, UserMemory, UserProfile,
    lease_expiry,
};
pub use status::{
    CancellationReason, McpServerAuth, RequiredAction, RequiredActionRecord, RunStatus, Subject, TurnState,
};
pub use time::{InvalidTimestamp, LONGEST_WAIT, Timestamp};
pub use tool::{
    FunctionCall, FunctionCallDelta, McpServerRef, PendingToolCall, ToolCall, ToolCallDelta, ToolCallKind,
    ToolInfo, ToolSpec,
};
pub use usage::{InputTokensBreakdown, TurnMetrics, Usage};
