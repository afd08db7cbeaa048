//! Budgets around the steps of a thread: a [`StepBudget`] reserves before each model call
//! and each tool call and settles with what was really used after. The team crate backs it
//! with ledgers in the store shared by a mission and its instances.

use std::fmt;

use agentry_types::{BudgetLimit, BudgetUsage, Usage};
use async_trait::async_trait;

/// What a reservation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// One model call.
    Model,
    /// One tool call.
    Tool,
}

/// A budget ran out: the thread stops (cancelled, `budget-exhausted`).
#[derive(Debug, Clone, PartialEq)]
pub struct Exhausted {
    /// The limit that ran out (`max_tokens`, …; `mission_max_tokens`, … for the mission's).
    pub exhausted_by: String,
    /// The usage at that point.
    pub usage: BudgetUsage,
    /// Whether the mission's total ran out (rather than the instance's own budget).
    pub mission: bool,
    /// Whether this is the first time this budget was found exhausted: only then is the
    /// exhaustion event emitted, so it is emitted once however many threads run into it.
    pub first: bool,
}

/// Why a step's reservation was not made.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// A budget ran out: the thread stops, cancelled (`budget-exhausted`).
    Exhausted(Exhausted),
    /// The budget could not be read or held (the store failed): the thread fails with this
    /// message, and no budget is reported exhausted.
    Unavailable(String),
    /// The turn's lease went to another process: this one stops writing, as on any other
    /// fenced write.
    LeaseLost,
}

impl From<Exhausted> for Refused {
    fn from(exhausted: Exhausted) -> Self {
        Self::Exhausted(exhausted)
    }
}

/// What a step really used.
#[derive(Debug, Clone, PartialEq)]
pub struct Spent {
    /// Tokens, steps and tool calls.
    pub usage: BudgetUsage,
    /// For a model call: the model's id and its usage report (for pricing).
    pub model: Option<(String, Usage)>,
}

/// A reservation's settlement: what to report in `budget.usage`.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// The instance's usage after settling.
    pub usage: BudgetUsage,
    /// Its limit.
    pub limit: Option<BudgetLimit>,
    /// The step took the instance's budget or its mission's past its limit (a model call
    /// that used more tokens than were held, a step slower than the time left): the thread
    /// stops as if its next reservation had been refused.
    pub exhausted: Option<Exhausted>,
}

/// Budget checks around each model and tool call of a thread.
#[async_trait]
pub trait StepBudget: Send + Sync + fmt::Debug {
    /// Holds an amount for the next step (all scopes or none). Returns the reservation's
    /// id, or why none was made: the budget cannot cover the step, or the budget could not
    /// be reached.
    async fn reserve(&self, step: Step) -> Result<String, Refused>;

    /// Settles a reservation with what the step really used (the implementation adds cost
    /// and elapsed time as it measures them); `None` when it could not be settled (it expired
    /// or the store failed: the hold then lapses).
    async fn settle(&self, reservation: &str, spent: Spent) -> Option<Settled>;

    /// Gives a reservation back unused (its step will not run).
    async fn release(&self, reservation: &str);
}
