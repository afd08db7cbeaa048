//! The Agno run and team data classes (seed 000): [`RunOutput`], [`TeamRunOutput`] with
//! nested `member_responses`, and the values they hold.
//!
//! Field names and value spellings are Agno's, so these serialize the way Agno stores and
//! sends them (for example `RunStatus` as `"COMPLETED"`, `created_at` as unix seconds).

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::message::Message;
use crate::status::RunStatus;
use crate::usage::{TurnMetrics, Usage};

/// Usage metrics of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Metrics {
    /// Prompt tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Generated tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Both.
    #[serde(default)]
    pub total_tokens: u64,
    /// Audio prompt tokens.
    #[serde(default)]
    pub audio_input_tokens: u64,
    /// Audio generated tokens.
    #[serde(default)]
    pub audio_output_tokens: u64,
    /// Tokens read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Reasoning tokens.
    #[serde(default)]
    pub reasoning_tokens: u64,
    /// Seconds until the first token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_to_first_token: Option<f64>,
    /// Seconds the run took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    /// Cost in US dollars, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

impl Metrics {
    /// Adds one model call's usage.
    pub fn add_usage(&mut self, usage: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(usage.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(usage.output_tokens);
        self.total_tokens = self.input_tokens.saturating_add(self.output_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(usage.cache_read_tokens.unwrap_or(0));
        self.cache_write_tokens =
            self.cache_write_tokens.saturating_add(usage.cache_write_tokens.unwrap_or(0));
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(usage.reasoning_tokens.unwrap_or(0));
    }
}

impl From<&TurnMetrics> for Metrics {
    fn from(metrics: &TurnMetrics) -> Self {
        Self {
            input_tokens: metrics.total_input_tokens,
            output_tokens: metrics.total_output_tokens,
            total_tokens: metrics.total_tokens,
            cache_read_tokens: metrics.total_cache_read_tokens.unwrap_or(0),
            cache_write_tokens: metrics.total_cache_write_tokens.unwrap_or(0),
            reasoning_tokens: metrics.total_reasoning_tokens.unwrap_or(0),
            cost: metrics.total_cost_in_usd,
            ..Self::default()
        }
    }
}

/// An image, video or audio clip attached to a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Media {
    /// Its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Where it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its bytes, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Its MIME type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Its format (`png`, `mp4`, `wav`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// A transcript (audio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcript: Option<String>,
    /// Alternative text (images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_text: Option<String>,
}

/// An image.
pub type Image = Media;
/// A video.
pub type Video = Media;
/// An audio clip.
pub type Audio = Media;

/// A URL cited by a response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UrlCitation {
    /// The URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// A document cited by a response.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DocumentCitation {
    /// The document's title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document_title: Option<String>,
    /// The cited passage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cited_text: Option<String>,
    /// The file it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_name: Option<String>,
}

/// Citations used in a response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Citations {
    /// The provider's raw citation data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<Value>,
    /// Cited URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<UrlCitation>>,
    /// Cited documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<Vec<DocumentCitation>>,
}

/// Knowledge references added to a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MessageReferences {
    /// The query that found them.
    pub query: String,
    /// What was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<Vec<Value>>,
    /// Seconds the search took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
}

/// What a reasoning step decided to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NextAction {
    /// Keep reasoning.
    Continue,
    /// Check the result.
    Validate,
    /// Answer.
    FinalAnswer,
    /// Start over.
    Reset,
}

/// One step of a reasoning process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReasoningStep {
    /// A short title.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the step does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// What it found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The reasoning behind it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// What comes next.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_action: Option<NextAction>,
    /// Confidence between 0 and 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
}

/// A summary of a session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSummary {
    /// The summary.
    pub summary: String,
    /// Topics discussed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<Vec<String>>,
    /// When it was last updated (unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
}

/// One tool call made during a run, with its result.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ToolExecution {
    /// The call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The tool called.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_args: Option<Map<String, Value>>,
    /// Whether the call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_error: Option<bool>,
    /// Its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// Whether a human had to approve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_confirmation: Option<bool>,
    /// Whether it was approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed: Option<bool>,
    /// The approver's note (a denial reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_note: Option<String>,
    /// Whether the client runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_execution_required: Option<bool>,
    /// When it was made (unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
}

/// The input of a run: its content and media.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunInput {
    /// The input: a string, a list of messages, or a structured value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_content: Option<Value>,
    /// Images sent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<Image>>,
    /// Videos sent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub videos: Option<Vec<Video>>,
    /// Audio sent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Vec<Audio>>,
    /// Files sent with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<Vec<Media>>,
}

/// The input of a team run (same shape as [`RunInput`]).
pub type TeamRunInput = RunInput;

fn content_type_default() -> String {
    "str".to_owned()
}

/// The result of one agent's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunOutput {
    /// The response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    /// The type of `content` (`"str"` for text).
    #[serde(default = "content_type_default")]
    pub content_type: String,
    /// Messages of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message>>,
    /// Usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// The model used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model's provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_provider: Option<String>,
    /// The run's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The agent's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The agent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_name: Option<String>,
    /// The session's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The parent run, for a member run inside a team run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// The user's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    /// Tool calls made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolExecution>>,
    /// Images produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<Image>>,
    /// Videos produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub videos: Option<Vec<Video>>,
    /// Audio produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Vec<Audio>>,
    /// The model's raw audio response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_audio: Option<Audio>,
    /// The run's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<RunInput>,
    /// Reasoning the model produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Citations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub citations: Option<Citations>,
    /// Provider-specific data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_provider_data: Option<Value>,
    /// Extra metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Knowledge references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<Vec<MessageReferences>>,
    /// Additional input messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_input: Option<Vec<Message>>,
    /// Reasoning steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_steps: Option<Vec<ReasoningStep>>,
    /// Reasoning messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_messages: Option<Vec<Message>>,
    /// When it was created (unix seconds).
    pub created_at: i64,
    /// Events of the run, each rendered in the Agno vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<Value>>,
    /// Its status.
    #[serde(default)]
    pub status: RunStatus,
    /// The workflow step it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_step_id: Option<String>,
}

impl RunOutput {
    /// An empty, running output created at `created_at` (unix seconds).
    #[must_use]
    pub fn new(created_at: i64) -> Self {
        Self {
            content: None,
            content_type: content_type_default(),
            messages: None,
            metrics: None,
            model: None,
            model_provider: None,
            run_id: None,
            agent_id: None,
            agent_name: None,
            session_id: None,
            parent_run_id: None,
            user_id: None,
            tools: None,
            images: None,
            videos: None,
            audio: None,
            response_audio: None,
            input: None,
            reasoning_content: None,
            citations: None,
            model_provider_data: None,
            metadata: None,
            references: None,
            additional_input: None,
            reasoning_steps: None,
            reasoning_messages: None,
            created_at,
            events: None,
            status: RunStatus::Running,
            workflow_step_id: None,
        }
    }
}

/// The result of a team run: the team's response and each member's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TeamRunOutput {
    /// The response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    /// The type of `content` (`"str"` for text).
    #[serde(default = "content_type_default")]
    pub content_type: String,
    /// Messages of the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message>>,
    /// Usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// The model used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The model's provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_provider: Option<String>,
    /// Responses of the members, in the order they finished; nested teams nest.
    #[serde(default)]
    pub member_responses: Vec<MemberResponse>,
    /// The run's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The team's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_id: Option<String>,
    /// The team's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team_name: Option<String>,
    /// The session's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The parent run, for a nested team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// Tools provided to the model, with their calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolExecution>>,
    /// Images from member runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Vec<Image>>,
    /// Videos from member runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub videos: Option<Vec<Video>>,
    /// Audio from member runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audio: Option<Vec<Audio>>,
    /// The model's raw audio response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_audio: Option<Audio>,
    /// The run's input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<TeamRunInput>,
    /// Reasoning the model produced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Citations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub citations: Option<Citations>,
    /// Provider-specific data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_provider_data: Option<Value>,
    /// Extra metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Knowledge references.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub references: Option<Vec<MessageReferences>>,
    /// Additional input messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_input: Option<Vec<Message>>,
    /// Reasoning steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_steps: Option<Vec<ReasoningStep>>,
    /// Reasoning messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_messages: Option<Vec<Message>>,
    /// When it was created (unix seconds).
    pub created_at: i64,
    /// Events of the run, each rendered in the Agno vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<Value>>,
    /// Its status.
    #[serde(default)]
    pub status: RunStatus,
    /// The workflow step it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_step_id: Option<String>,
}

impl TeamRunOutput {
    /// An empty, running team output created at `created_at` (unix seconds).
    #[must_use]
    pub fn new(created_at: i64) -> Self {
        Self {
            content: None,
            content_type: content_type_default(),
            messages: None,
            metrics: None,
            model: None,
            model_provider: None,
            member_responses: Vec::new(),
            run_id: None,
            team_id: None,
            team_name: None,
            session_id: None,
            parent_run_id: None,
            tools: None,
            images: None,
            videos: None,
            audio: None,
            response_audio: None,
            input: None,
            reasoning_content: None,
            citations: None,
            model_provider_data: None,
            metadata: None,
            references: None,
            additional_input: None,
            reasoning_steps: None,
            reasoning_messages: None,
            created_at,
            events: None,
            status: RunStatus::Running,
            workflow_step_id: None,
        }
    }
}

/// A member's response inside a team run: an agent's run or a nested team's run.
///
/// Serializes as the run itself; a value with a `member_responses` key reads as a team run.
#[derive(Debug, Clone, PartialEq, JsonSchema)]
#[schemars(untagged)]
pub enum MemberResponse {
    /// An agent member's run.
    Agent(Box<RunOutput>),
    /// A nested team's run.
    Team(Box<TeamRunOutput>),
}

impl Serialize for MemberResponse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Agent(run) => run.serialize(serializer),
            Self::Team(run) => run.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for MemberResponse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        let is_team = value.get("member_responses").is_some();
        if is_team {
            serde_json::from_value(value)
                .map(|run| Self::Team(Box::new(run)))
                .map_err(serde::de::Error::custom)
        } else {
            serde_json::from_value(value)
                .map(|run| Self::Agent(Box::new(run)))
                .map_err(serde::de::Error::custom)
        }
    }
}
