//! The turn input rules of seed 002.

use std::collections::HashMap;

use agentry_types::{RequiredAction, RunRecord, TurnInputItem};

use crate::error::{RunnerError, RuntimeResult};

/// Rules that need nothing but the input: user messages are not mixed with approvals or
/// tool responses, and no tool call is answered twice.
pub(crate) fn check_shape(input: &[TurnInputItem]) -> RuntimeResult<()> {
    let messages = input.iter().filter(|item| matches!(item, TurnInputItem::Message(_))).count();
    if messages > 0 && messages < input.len() {
        return Err(invalid(
            "user messages cannot be mixed with tool approvals or tool responses in one turn",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for item in input {
        let id = match item {
            TurnInputItem::Message(message) => {
                if message.content.is_empty() {
                    return Err(invalid("a user message has no content"));
                }
                continue;
            }
            TurnInputItem::ToolApproval(approval) => &approval.tool_call_id,
            TurnInputItem::ToolResponse(response) => &response.tool_call_id,
        };
        if !seen.insert(id) {
            return Err(invalid(format!("tool call {id} is answered more than once")));
        }
    }
    Ok(())
}

/// Rules that depend on how the previous turn ended: after required actions, the input
/// answers exactly the pending calls (approvals for approvals, responses for client tools,
/// on the right thread); after only `mcp.auth_required`, the input is empty (the waiting
/// calls run again); otherwise it is one or more user messages.
pub(crate) fn check_against_previous(
    input: &[TurnInputItem],
    previous: Option<&RunRecord>,
) -> RuntimeResult<()> {
    let required = previous.map(|run| run.state.required_actions()).unwrap_or_default();
    if required.is_empty() {
        if input.is_empty() {
            return Err(invalid("the input is empty; send a user message"));
        }
        if !matches!(input.first(), Some(TurnInputItem::Message(_))) {
            return Err(invalid("there are no pending tool calls to approve or answer; send a user message"));
        }
        return Ok(());
    }
    // tool_call_id -> (needs an approval?, thread)
    let mut pending = HashMap::new();
    for record in required {
        match &record.action {
            RequiredAction::ToolApproval { thread_id, tool_calls } => {
                for call in tool_calls {
                    pending.insert(call.id.as_str(), (true, thread_id));
                }
            }
            RequiredAction::ToolResponse { thread_id, tool_calls } => {
                for call in tool_calls {
                    pending.insert(call.id.as_str(), (false, thread_id));
                }
            }
            _ => {}
        }
    }
    if pending.is_empty() {
        // Only MCP servers waited for authorization: the calls run again with no input.
        if !input.is_empty() {
            return Err(invalid(
                "the previous turn ended with mcp.auth_required: resume with an empty input",
            ));
        }
        return Ok(());
    }
    if matches!(input.first(), Some(TurnInputItem::Message(_))) || input.is_empty() {
        return Err(invalid(format!(
            "the previous turn is waiting for {} tool call(s) to be approved or answered; send one \
             user.tool_approval or user.tool_response per pending call",
            pending.len()
        )));
    }
    for item in input {
        let (id, thread, approval) = match item {
            TurnInputItem::ToolApproval(approval) => (&approval.tool_call_id, &approval.thread_id, true),
            TurnInputItem::ToolResponse(response) => (&response.tool_call_id, &response.thread_id, false),
            TurnInputItem::Message(_) => continue,
        };
        match pending.remove(id.as_str()) {
            None => return Err(invalid(format!("tool call {id} is not pending"))),
            Some((needs_approval, pending_thread)) => {
                if needs_approval != approval {
                    let (wanted, got) = if needs_approval {
                        ("user.tool_approval", "user.tool_response")
                    } else {
                        ("user.tool_response", "user.tool_approval")
                    };
                    return Err(invalid(format!("tool call {id} needs a {wanted}, not a {got}")));
                }
                if pending_thread != thread {
                    return Err(invalid(format!(
                        "tool call {id} is pending on thread {pending_thread}, not on thread {thread}"
                    )));
                }
            }
        }
    }
    if let Some(missing) = pending.keys().min() {
        return Err(invalid(format!("tool call {missing} is pending and was not answered")));
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> RunnerError {
    RunnerError::InvalidInput(message.into())
}
