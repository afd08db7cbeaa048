//! Token usage of one model call, and metrics accumulated over a turn.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the input tokens of a model call went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InputTokensBreakdown {
    /// Tokens the runtime itself added.
    pub harness: u64,
    /// Tokens of skills.
    pub skills: u64,
    /// Tokens of the agent's instructions.
    pub instructions: u64,
    /// Tokens of the tool definitions.
    pub tool_definitions: u64,
    /// Tokens of the conversation messages.
    pub messages: u64,
}

/// Token usage of one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// Input tokens read from the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// Output tokens spent on reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    /// Where the input tokens went, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens_breakdown: Option<InputTokensBreakdown>,
}

impl Usage {
    /// Usage with input and output counts only.
    #[must_use]
    pub const fn new(input_tokens: u64, output_tokens: u64) -> Self {
        Self {
            input_tokens,
            output_tokens,
            cache_read_tokens: None,
            cache_write_tokens: None,
            reasoning_tokens: None,
            input_tokens_breakdown: None,
        }
    }

    /// Input plus output tokens.
    #[must_use]
    pub const fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

/// Usage summed over every model call of a turn, and its cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TurnMetrics {
    /// Sum of input tokens.
    pub total_input_tokens: u64,
    /// Sum of output tokens.
    pub total_output_tokens: u64,
    /// Sum of both.
    pub total_tokens: u64,
    /// Sum of cache-read tokens, when any call reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cache_read_tokens: Option<u64>,
    /// Sum of cache-write tokens, when any call reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cache_write_tokens: Option<u64>,
    /// Sum of reasoning tokens, when any call reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_reasoning_tokens: Option<u64>,
    /// Cost in US dollars, when prices are configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cost_in_usd: Option<f64>,
}

impl TurnMetrics {
    /// Adds one model call's usage.
    pub fn add(&mut self, usage: &Usage) {
        fn add_opt(total: &mut Option<u64>, value: Option<u64>) {
            if let Some(value) = value {
                *total = Some(total.unwrap_or(0).saturating_add(value));
            }
        }
        self.total_input_tokens = self.total_input_tokens.saturating_add(usage.input_tokens);
        self.total_output_tokens = self.total_output_tokens.saturating_add(usage.output_tokens);
        self.total_tokens = self.total_input_tokens.saturating_add(self.total_output_tokens);
        add_opt(&mut self.total_cache_read_tokens, usage.cache_read_tokens);
        add_opt(&mut self.total_cache_write_tokens, usage.cache_write_tokens);
        add_opt(&mut self.total_reasoning_tokens, usage.reasoning_tokens);
    }
}
