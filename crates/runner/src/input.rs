//! The turn input rules of seed 002, applied through the one validator in `agentry-types`
//! (`validate_turn_input`), against what the previous turn left pending.

use agentry_types::{PendingActions, RunRecord, TurnInputError, TurnInputItem, validate_turn_input};

use crate::error::{RunnerError, RuntimeResult};

/// Rules that need nothing but the input (checked before the session's lease is taken):
/// user messages are not mixed with approvals or tool responses, and messages are valid.
pub(crate) fn check_shape(input: &[TurnInputItem]) -> RuntimeResult<()> {
    match validate_turn_input(input, &PendingActions::none()) {
        Err(
            error @ (TurnInputError::MessageMixedWithToolInput
            | TurnInputError::EmptyMessage { .. }
            | TurnInputError::UnnamedFile { .. }
            | TurnInputError::InvalidImageUrl { .. }),
        ) => Err(RunnerError::InvalidInput(error.to_string())),
        _ => Ok(()),
    }
}

/// Every rule, against how the previous turn ended: after required actions the input
/// answers exactly the pending calls; after only `mcp.auth_required` it is empty (the
/// waiting calls run again); otherwise it is one or more user messages.
pub(crate) fn check_against_previous(
    input: &[TurnInputItem],
    previous: Option<&RunRecord>,
) -> RuntimeResult<()> {
    let pending = previous
        .map(|run| PendingActions::from_required_actions(run.state.required_actions()))
        .unwrap_or_else(PendingActions::none);
    validate_turn_input(input, &pending)
        .map(|_| ())
        .map_err(|error| RunnerError::InvalidInput(error.to_string()))
}
