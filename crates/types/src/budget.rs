//! Budgets: the limits of an agent instance or a mission, and what has been used of them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Limits on what an instance or a mission may use; an absent limit is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetLimit {
    /// Tokens, input and output together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Model calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u64>,
    /// Tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u64>,
    /// Cost in US dollars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// Wall-clock time in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_elapsed_ms: Option<u64>,
}

/// What has been used of a budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BudgetUsage {
    /// Tokens used.
    pub tokens_used: u64,
    /// Model calls made.
    pub steps_used: u64,
    /// Tool calls made.
    pub tool_calls_used: u64,
    /// Cost in US dollars.
    pub cost_used_usd: f64,
    /// Milliseconds elapsed, where the scope measures time (instances do, missions need not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}
