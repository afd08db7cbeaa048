//! The rules every backend applies the same way: record encoding and size limits, event
//! batch checks, fencing, leases, budgets, the journal and history windows. Backends call
//! these inside their transactions so that all of them behave identically.

use std::time::Duration;

use agentry_events::EventEnvelope;
use agentry_types::{
    BudgetLimit, BudgetUsage, Fence, HistoryMessage, JournalEntry, Lease, RunRecord, SessionId, Timestamp,
    ToolResult, TurnId,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Conflict, StoreError, StoreResult};
use crate::store::{HistoryQuery, MAX_RECORD_BYTES};

/// Serializes a record as JSON, refusing one larger than [`MAX_RECORD_BYTES`].
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> StoreResult<Vec<u8>> {
    let bytes = serde_json::to_vec(value)
        .map_err(|error| StoreError::InvalidInput(format!("{what} cannot be serialized: {error}")))?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(StoreError::TooLarge { what, size: bytes.len(), limit: MAX_RECORD_BYTES });
    }
    Ok(bytes)
}

/// Reads a stored record; a record that does not parse means the store is corrupt.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| StoreError::Corrupt(format!("a stored {what} does not parse: {error}")))
}

/// Checks a batch of events for turn `turn` of session `session` against the turn's last
/// stored `seq`.
pub fn check_event_batch(
    turn: TurnId,
    session: SessionId,
    last_seq: u64,
    events: &[EventEnvelope],
) -> StoreResult<()> {
    let mut previous = last_seq;
    for event in events {
        if event.turn_id != turn {
            return Err(StoreError::InvalidInput(format!(
                "event {} belongs to turn {}, not {turn}",
                event.event_id, event.turn_id
            )));
        }
        if event.session_id != session {
            return Err(StoreError::InvalidInput(format!(
                "event {} names session {}, but turn {turn} is in session {session}",
                event.event_id, event.session_id
            )));
        }
        if !event.is_durable() {
            return Err(StoreError::InvalidInput(format!(
                "event {} is a {}, which is streamed but not stored",
                event.event_id,
                event.kind()
            )));
        }
        if event.seq <= previous {
            return Err(Conflict::StaleSeq { turn_id: turn, seq: event.seq, last: previous }.into());
        }
        previous = event.seq;
    }
    Ok(())
}

/// Checks a write's fence against the session's current lease.
pub fn check_fence(session: SessionId, current: Option<&Lease>, fence: Option<Fence>) -> StoreResult<()> {
    let Some(fence) = fence else { return Ok(()) };
    if fence.session_id != session {
        return Err(StoreError::InvalidInput(format!(
            "the fence is for session {}, but the write is to session {session}",
            fence.session_id
        )));
    }
    match current {
        Some(lease) if lease.token == fence.token => Ok(()),
        current => Err(Conflict::StaleFence {
            session_id: session,
            token: fence.token,
            current: current.map(|lease| lease.token),
        }
        .into()),
    }
}

/// Grants a lease unless a live one is held; `next_token` is the store's next token.
pub fn grant_lease(
    session: SessionId,
    current: Option<&Lease>,
    owner: &str,
    ttl: Duration,
    now: Timestamp,
    next_token: u64,
) -> StoreResult<Lease> {
    if owner.is_empty() {
        return Err(StoreError::InvalidInput("a lease owner must not be empty".to_owned()));
    }
    if let Some(lease) = current.filter(|lease| !lease.is_expired(now)) {
        return Err(Conflict::LeaseHeld {
            session_id: session,
            holder: lease.owner.clone(),
            expires_at: lease.expires_at,
        }
        .into());
    }
    Ok(Lease {
        session_id: session,
        owner: owner.to_owned(),
        token: next_token,
        expires_at: now.saturating_add(ttl),
    })
}

/// Renews the current lease if it holds `token`.
pub fn renew_lease(
    session: SessionId,
    current: Option<&Lease>,
    token: u64,
    ttl: Duration,
    now: Timestamp,
) -> StoreResult<Lease> {
    match current {
        Some(lease) if lease.token == token => {
            Ok(Lease { expires_at: now.saturating_add(ttl), ..lease.clone() })
        }
        current => {
            Err(Conflict::StaleFence { session_id: session, token, current: current.map(|l| l.token) }.into())
        }
    }
}

/// Checks that releasing with `token` is allowed.
pub fn check_release(session: SessionId, current: Option<&Lease>, token: u64) -> StoreResult<()> {
    check_fence(session, current, Some(Fence { session_id: session, token }))
}

/// Adds two usages, dimension by dimension.
#[must_use]
pub fn add_usage(a: &BudgetUsage, b: &BudgetUsage) -> BudgetUsage {
    BudgetUsage {
        tokens_used: a.tokens_used.saturating_add(b.tokens_used),
        steps_used: a.steps_used.saturating_add(b.steps_used),
        tool_calls_used: a.tool_calls_used.saturating_add(b.tool_calls_used),
        cost_used_usd: a.cost_used_usd + b.cost_used_usd,
        elapsed_ms: match (a.elapsed_ms, b.elapsed_ms) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        },
    }
}

/// Checks that `amount` fits a scope's limit on top of what is used and reserved.
#[allow(clippy::cast_precision_loss)]
pub fn check_room(
    scope: &str,
    limit: &BudgetLimit,
    held: &BudgetUsage,
    amount: &BudgetUsage,
) -> StoreResult<()> {
    let checks: [(&'static str, Option<f64>, f64, f64); 5] = [
        (
            "max_tokens",
            limit.max_tokens.map(|l| l as f64),
            held.tokens_used as f64,
            amount.tokens_used as f64,
        ),
        ("max_steps", limit.max_steps.map(|l| l as f64), held.steps_used as f64, amount.steps_used as f64),
        (
            "max_tool_calls",
            limit.max_tool_calls.map(|l| l as f64),
            held.tool_calls_used as f64,
            amount.tool_calls_used as f64,
        ),
        ("max_cost_usd", limit.max_cost_usd, held.cost_used_usd, amount.cost_used_usd),
        (
            "max_elapsed_ms",
            limit.max_elapsed_ms.map(|l| l as f64),
            held.elapsed_ms.unwrap_or(0) as f64,
            amount.elapsed_ms.unwrap_or(0) as f64,
        ),
    ];
    for (dimension, limit, used, requested) in checks {
        if let Some(limit) = limit
            && used + requested > limit
        {
            return Err(Conflict::BudgetExceeded {
                scope: scope.to_owned(),
                dimension,
                used,
                requested,
                limit,
            }
            .into());
        }
    }
    Ok(())
}

/// What `journal_start` does given the entry already stored for the call, if any.
pub fn journal_start(
    existing: Option<&JournalEntry>,
    entry: &JournalEntry,
) -> StoreResult<Option<JournalEntry>> {
    match existing {
        None => Ok(None),
        Some(stored) if stored.arguments_hash == entry.arguments_hash => Ok(Some(stored.clone())),
        Some(_) => Err(Conflict::JournalMismatch {
            turn_id: entry.turn_id,
            tool_call_id: entry.tool_call_id.clone(),
        }
        .into()),
    }
}

/// What `journal_complete` stores given the started entry: the completed entry, and
/// whether it changed.
pub fn journal_complete(
    existing: Option<&JournalEntry>,
    turn: TurnId,
    tool_call_id: &str,
    result: &ToolResult,
    completed_at: Timestamp,
) -> StoreResult<(JournalEntry, bool)> {
    let Some(stored) = existing else {
        return Err(StoreError::not_found("journaled tool call", format!("{turn}/{tool_call_id}")));
    };
    match &stored.result {
        Some(previous) if previous == result => Ok((stored.clone(), false)),
        Some(_) => {
            Err(Conflict::AlreadyCompleted { turn_id: turn, tool_call_id: tool_call_id.to_owned() }.into())
        }
        None => Ok((
            JournalEntry { result: Some(result.clone()), completed_at: Some(completed_at), ..stored.clone() },
            true,
        )),
    }
}

/// Collects a history window from a session's runs, given newest first, and a loader of
/// each run's messages. Reads only as many runs as the window needs.
pub fn history_window<R, L>(runs: R, query: &HistoryQuery, mut load: L) -> StoreResult<Vec<HistoryMessage>>
where
    R: IntoIterator<Item = StoreResult<RunRecord>>,
    L: FnMut(&RunRecord) -> StoreResult<Vec<HistoryMessage>>,
{
    let run_bound = query.run_bound();
    let mut taken_runs = 0usize;
    let mut collected: Vec<Vec<HistoryMessage>> = Vec::new();
    let mut message_count = 0usize;
    for run in runs {
        if run_bound.is_some_and(|bound| taken_runs >= bound)
            || query.last_messages.is_some_and(|bound| message_count >= bound)
        {
            break;
        }
        let run = run?;
        if !query.run_matches(&run) {
            continue;
        }
        taken_runs += 1;
        let messages: Vec<HistoryMessage> =
            load(&run)?.into_iter().filter(|message| query.message_matches(&message.message)).collect();
        message_count += messages.len();
        collected.push(messages);
    }
    let mut window: Vec<HistoryMessage> = collected.into_iter().rev().flatten().collect();
    if let Some(bound) = query.last_messages
        && window.len() > bound
    {
        window.drain(..window.len() - bound);
    }
    Ok(window)
}
