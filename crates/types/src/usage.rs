//! Token usage of one model call, and metrics accumulated over a turn.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{ContentPart, Message, MessageContent, ModelMessage, ToolCall};

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

    /// An estimate, at four characters a token, of a call that sent `prompt` and produced
    /// `output`: for a provider that reports no usage, or a stream cut short before its
    /// usage came. Text, reasoning, refusals, tool names and arguments count; images and
    /// files do not.
    ///
    /// ```
    /// use agentry_types::{Message, ModelMessage, Usage};
    ///
    /// let prompt = [Message::user("What is 6 * 7?")]; // 14 characters
    /// let output = ModelMessage { content: Some("42".to_owned()), ..ModelMessage::default() };
    /// assert_eq!(Usage::estimate(&prompt, &output), Usage::new(4, 1));
    /// ```
    #[must_use]
    pub fn estimate<M: AsRef<Message>>(prompt: &[M], output: &ModelMessage) -> Self {
        let input: usize = prompt.iter().map(|message| message_chars(message.as_ref())).sum();
        let output_chars = [&output.content, &output.reasoning_content, &output.refusal]
            .into_iter()
            .map(|text| text.as_deref().map_or(0, |text| text.chars().count()))
            .sum::<usize>()
            + calls_chars(&output.tool_calls);
        Self::new(tokens(input), tokens(output_chars))
    }
}

/// Tokens for `chars` characters, at four a token, rounded up.
fn tokens(chars: usize) -> u64 {
    u64::try_from(chars.div_ceil(4)).unwrap_or(u64::MAX)
}

/// The characters of a message's text, reasoning and tool calls, counted without building
/// them.
fn message_chars(message: &Message) -> usize {
    let content = match &message.content {
        None => 0,
        Some(MessageContent::Text(text)) => text.chars().count(),
        Some(MessageContent::Parts(parts)) => parts
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => text.chars().count() + 1,
                _ => 0,
            })
            .sum(),
    };
    content
        + message.reasoning_content.as_deref().map_or(0, |text| text.chars().count())
        + calls_chars(&message.tool_calls)
}

/// The characters of tool calls' names and arguments.
fn calls_chars(calls: &[ToolCall]) -> usize {
    calls
        .iter()
        .map(|call| call.function.name.chars().count() + call.function.arguments.chars().count())
        .sum()
}

/// Usage summed over every model call of a turn, and its cost. A call the provider
/// reported no usage for (it sends none, or the call was cut off: cancelled, or its stream
/// broke) counts an estimate ([`Usage::estimate`]), as the turn's budget is charged.
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
