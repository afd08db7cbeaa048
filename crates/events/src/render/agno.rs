//! The Agno team vocabulary (seed 000): `TeamRun*` events with Agno's field names, times in
//! unix seconds, and `None` fields left out as Agno's `to_dict` does.
//!
//! [`AgnoRenderer`] is a fold over a turn's events: it remembers the sub-agent threads so
//! that `TeamRunCompleted` carries each member's response, and which messages streamed, so
//! that a replay from the stored log (no deltas) still yields the content. Events of the
//! main thread render as the team's events; a member thread contributes its final
//! response to `member_responses`, and a member that delegated in turn becomes a nested
//! team run holding its own members' responses.

use std::collections::{HashMap, HashSet};

use agentry_types::agno::{
    Audio, Citations, Image, MemberResponse, MessageReferences, Metrics, ReasoningStep, RunOutput,
    TeamRunOutput, Video,
};
use agentry_types::{EventId, Message, RunStatus, ThreadId, TurnState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::envelope::EventEnvelope;
use crate::payload::{EventPayload, ThreadAgent, ThreadOutcome, ThreadParent};

/// The fields every `TeamRun*` event carries (`BaseTeamRunEvent`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BaseTeamRunEvent {
    /// Unix seconds.
    pub created_at: i64,
    /// The team's id.
    pub team_id: String,
    /// The team's name.
    pub team_name: String,
    /// The run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The workflow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<String>,
    /// The workflow's run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow_run_id: Option<String>,
    /// The workflow step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    /// The workflow step's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_name: Option<String>,
    /// The workflow step's index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_index: Option<u32>,
    /// The content, for the events that carry one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
}

/// A team run event, tagged by its `event` name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event")]
pub enum AgnoEvent {
    /// The run started.
    TeamRunStarted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// The model.
        model: String,
        /// The model's provider.
        model_provider: String,
    },
    /// A chunk of the response.
    TeamRunContent {
        /// Common fields (with the chunk as `content`).
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// `"str"` for text.
        content_type: String,
        /// Reasoning produced.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<String>,
        /// Citations.
        #[serde(skip_serializing_if = "Option::is_none")]
        citations: Option<Citations>,
        /// Provider-specific data.
        #[serde(skip_serializing_if = "Option::is_none")]
        model_provider_data: Option<Value>,
        /// Audio response.
        #[serde(skip_serializing_if = "Option::is_none")]
        response_audio: Option<Audio>,
        /// An image.
        #[serde(skip_serializing_if = "Option::is_none")]
        image: Option<Image>,
        /// References.
        #[serde(skip_serializing_if = "Option::is_none")]
        references: Option<Vec<MessageReferences>>,
        /// Additional input.
        #[serde(skip_serializing_if = "Option::is_none")]
        additional_input: Option<Vec<Message>>,
        /// Reasoning steps.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_steps: Option<Vec<ReasoningStep>>,
        /// Reasoning messages.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_messages: Option<Vec<Message>>,
    },
    /// Intermediate content.
    TeamRunIntermediateContent {
        /// Common fields (with the content).
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// Its type.
        content_type: String,
    },
    /// The run completed.
    TeamRunCompleted {
        /// Common fields (with the final content).
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// `"str"` for text.
        content_type: String,
        /// Reasoning produced.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<String>,
        /// Citations.
        #[serde(skip_serializing_if = "Option::is_none")]
        citations: Option<Citations>,
        /// Provider-specific data.
        #[serde(skip_serializing_if = "Option::is_none")]
        model_provider_data: Option<Value>,
        /// Images.
        #[serde(skip_serializing_if = "Option::is_none")]
        images: Option<Vec<Image>>,
        /// Videos.
        #[serde(skip_serializing_if = "Option::is_none")]
        videos: Option<Vec<Video>>,
        /// Audio.
        #[serde(skip_serializing_if = "Option::is_none")]
        audio: Option<Vec<Audio>>,
        /// Audio response.
        #[serde(skip_serializing_if = "Option::is_none")]
        response_audio: Option<Audio>,
        /// References.
        #[serde(skip_serializing_if = "Option::is_none")]
        references: Option<Vec<MessageReferences>>,
        /// Additional input.
        #[serde(skip_serializing_if = "Option::is_none")]
        additional_input: Option<Vec<Message>>,
        /// Reasoning steps.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_steps: Option<Vec<ReasoningStep>>,
        /// Reasoning messages.
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_messages: Option<Vec<Message>>,
        /// The members' responses (a member that delegated in turn is a nested team).
        #[serde(default)]
        member_responses: Vec<MemberResponse>,
        /// Metadata.
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Map<String, Value>>,
        /// Usage.
        #[serde(skip_serializing_if = "Option::is_none")]
        metrics: Option<Metrics>,
        /// `COMPLETED`, or `PAUSED` when the run waits for a human.
        status: RunStatus,
        /// The workflow step.
        #[serde(skip_serializing_if = "Option::is_none")]
        workflow_step_id: Option<String>,
    },
    /// The run failed.
    TeamRunError {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// What went wrong.
        error: String,
    },
    /// The run was cancelled.
    TeamRunCancelled {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
    },
    /// A tool call started.
    TeamToolCallStarted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// The tool.
        tool_name: String,
        /// Its arguments.
        tool_args: Map<String, Value>,
    },
    /// A tool call completed.
    TeamToolCallCompleted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// The tool.
        tool_name: String,
        /// Its arguments.
        tool_args: Map<String, Value>,
        /// Its result.
        tool_result: Value,
    },
    /// Reasoning started.
    TeamReasoningStarted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
    },
    /// A reasoning step.
    TeamReasoningStep {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
        /// The step.
        step: ReasoningStep,
    },
    /// Reasoning completed.
    TeamReasoningCompleted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
    },
    /// A memory update started.
    TeamMemoryUpdateStarted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
    },
    /// A memory update completed.
    TeamMemoryUpdateCompleted {
        /// Common fields.
        #[serde(flatten)]
        base: BaseTeamRunEvent,
    },
}

/// The team and workflow a run belongs to: what the canonical events do not carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgnoContext {
    /// The team's id.
    pub team_id: String,
    /// The team's name.
    pub team_name: String,
    /// The coordinator's model.
    pub model: String,
    /// The model's provider.
    pub model_provider: String,
    /// The workflow, if the team runs inside one.
    pub workflow_id: Option<String>,
    /// The workflow's run.
    pub workflow_run_id: Option<String>,
    /// The workflow step.
    pub step_id: Option<String>,
    /// The workflow step's name.
    pub step_name: Option<String>,
    /// The workflow step's index.
    pub step_index: Option<u32>,
}

/// Renders a team turn's events as Agno `TeamRun*` events.
#[derive(Debug)]
pub struct AgnoRenderer {
    context: AgnoContext,
    threads: HashMap<ThreadId, (ThreadAgent, ThreadParent)>,
    streamed: HashSet<EventId>,
    /// Finished members' responses, by the thread that started them (`main` for the team).
    responses: HashMap<ThreadId, Vec<MemberResponse>>,
}

impl AgnoRenderer {
    /// A renderer for one turn of the team described by `context`.
    #[must_use]
    pub fn new(context: AgnoContext) -> Self {
        Self { context, threads: HashMap::new(), streamed: HashSet::new(), responses: HashMap::new() }
    }

    fn base(&self, event: &EventEnvelope, content: Option<Value>) -> BaseTeamRunEvent {
        BaseTeamRunEvent {
            created_at: event.created_at.unix_seconds(),
            team_id: self.context.team_id.clone(),
            team_name: self.context.team_name.clone(),
            run_id: Some(event.turn_id.to_string()),
            session_id: Some(event.session_id.to_string()),
            workflow_id: self.context.workflow_id.clone(),
            workflow_run_id: self.context.workflow_run_id.clone(),
            step_id: self.context.step_id.clone(),
            step_name: self.context.step_name.clone(),
            step_index: self.context.step_index,
            content,
        }
    }

    /// The Agno events for the next canonical event of the turn (zero or one).
    pub fn render(&mut self, event: &EventEnvelope) -> Option<AgnoEvent> {
        let on_main = event.thread_id.as_ref().is_none_or(ThreadId::is_main);
        match &event.payload {
            EventPayload::ThreadCreated { agent, parent, .. } => {
                self.threads.insert(event.thread_or_main(), (agent.clone(), parent.clone()));
                None
            }
            EventPayload::ThreadDone { outcome, parent, .. } => {
                let thread = event.thread_or_main();
                let run = self.member_response(event, outcome);
                let members = self.responses.remove(&thread).unwrap_or_default();
                let response = if members.is_empty() {
                    MemberResponse::Agent(Box::new(run))
                } else {
                    MemberResponse::Team(Box::new(nested_team(run, members)))
                };
                let parent = parent
                    .as_ref()
                    .or_else(|| self.threads.get(&thread).map(|(_, parent)| parent))
                    .map_or_else(ThreadId::main, |parent| parent.thread_id.clone());
                self.responses.entry(parent).or_default().push(response);
                None
            }
            _ if !on_main => None,
            EventPayload::TurnCreated { .. } => Some(AgnoEvent::TeamRunStarted {
                base: self.base(event, None),
                model: self.context.model.clone(),
                model_provider: self.context.model_provider.clone(),
            }),
            EventPayload::ModelMessageDelta(delta) => {
                self.streamed.insert(event.event_id);
                let content = delta.content.clone().filter(|text| !text.is_empty());
                let reasoning = delta.reasoning_content.clone().filter(|text| !text.is_empty());
                (content.is_some() || reasoning.is_some())
                    .then(|| self.content_event(event, content, reasoning))
            }
            EventPayload::ModelMessage(message) => {
                if self.streamed.remove(&event.event_id) {
                    return None;
                }
                let content = message.content.clone().filter(|text| !text.is_empty());
                let reasoning = message.reasoning_content.clone().filter(|text| !text.is_empty());
                (content.is_some() || reasoning.is_some())
                    .then(|| self.content_event(event, content, reasoning))
            }
            EventPayload::IntermediateContent { content, content_type } => {
                Some(AgnoEvent::TeamRunIntermediateContent {
                    base: self.base(event, Some(content.clone())),
                    content_type: content_type.clone(),
                })
            }
            EventPayload::ToolCallStarted { name, arguments, .. } => Some(AgnoEvent::TeamToolCallStarted {
                base: self.base(event, None),
                tool_name: name.clone(),
                tool_args: arguments_map(arguments),
            }),
            EventPayload::ToolResponse { name, arguments, content, .. } => {
                Some(AgnoEvent::TeamToolCallCompleted {
                    base: self.base(event, None),
                    tool_name: name.clone(),
                    tool_args: arguments_map(arguments),
                    tool_result: Value::String(content.clone()),
                })
            }
            EventPayload::ReasoningStarted {} => {
                Some(AgnoEvent::TeamReasoningStarted { base: self.base(event, None) })
            }
            EventPayload::ReasoningStep { step } => {
                Some(AgnoEvent::TeamReasoningStep { base: self.base(event, None), step: step.clone() })
            }
            EventPayload::ReasoningCompleted {} => {
                Some(AgnoEvent::TeamReasoningCompleted { base: self.base(event, None) })
            }
            EventPayload::MemoryUpdateStarted {} => {
                Some(AgnoEvent::TeamMemoryUpdateStarted { base: self.base(event, None) })
            }
            EventPayload::MemoryUpdateCompleted { .. } => {
                Some(AgnoEvent::TeamMemoryUpdateCompleted { base: self.base(event, None) })
            }
            EventPayload::TurnDone { state } => self.finish(event, state),
            _ => None,
        }
    }

    fn content_event(
        &self,
        event: &EventEnvelope,
        content: Option<String>,
        reasoning: Option<String>,
    ) -> AgnoEvent {
        AgnoEvent::TeamRunContent {
            base: self.base(event, content.map(Value::String)),
            content_type: "str".to_owned(),
            reasoning_content: reasoning,
            citations: None,
            model_provider_data: None,
            response_audio: None,
            image: None,
            references: None,
            additional_input: None,
            reasoning_steps: None,
            reasoning_messages: None,
        }
    }

    fn member_response(&self, event: &EventEnvelope, outcome: &ThreadOutcome) -> RunOutput {
        let thread = event.thread_or_main();
        let agent = self.threads.get(&thread).map(|(agent, _)| agent);
        let (output, status) = match outcome {
            ThreadOutcome::Done { output } => (Some(output.as_ref()), RunStatus::Completed),
            ThreadOutcome::Error { output, .. } => (output.as_deref(), RunStatus::Error),
        };
        let mut run = RunOutput::new(event.created_at.unix_seconds());
        run.run_id = Some(thread.to_string());
        run.parent_run_id = Some(event.turn_id.to_string());
        run.session_id = Some(event.session_id.to_string());
        run.agent_name = agent.map(|agent| agent.name.clone());
        run.agent_id = run.agent_name.clone();
        run.model = agent.and_then(|agent| agent.model.clone());
        run.content = output.and_then(|output| output.message.content.clone()).map(Value::String);
        run.reasoning_content = output.and_then(|output| output.message.reasoning_content.clone());
        run.metrics = output.and_then(|output| output.message.usage.as_ref()).map(|usage| {
            let mut metrics = Metrics::default();
            metrics.add_usage(usage);
            metrics
        });
        run.status = status;
        run
    }

    fn finish(&mut self, event: &EventEnvelope, state: &TurnState) -> Option<AgnoEvent> {
        let base = |content| self.base(event, content);
        Some(match state {
            TurnState::Running => return None,
            TurnState::Done { output, metrics, .. } => {
                let message = output.as_ref().map(|output| &output.message);
                AgnoEvent::TeamRunCompleted {
                    base: base(message.and_then(|m| m.content.clone()).map(Value::String)),
                    content_type: "str".to_owned(),
                    reasoning_content: message.and_then(|m| m.reasoning_content.clone()),
                    citations: None,
                    model_provider_data: None,
                    images: None,
                    videos: None,
                    audio: None,
                    response_audio: None,
                    references: None,
                    additional_input: None,
                    reasoning_steps: None,
                    reasoning_messages: None,
                    member_responses: self.responses.remove(&ThreadId::main()).unwrap_or_default(),
                    metadata: None,
                    metrics: metrics.as_ref().map(Metrics::from),
                    status: state.run_status(),
                    workflow_step_id: self.context.step_id.clone(),
                }
            }
            TurnState::Cancelled { .. } => AgnoEvent::TeamRunCancelled { base: base(None) },
            TurnState::Error { message, .. } => {
                AgnoEvent::TeamRunError { base: base(None), error: message.clone() }
            }
        })
    }
}

/// A member that delegated in turn, as Agno sees it: a nested team run.
fn nested_team(run: RunOutput, members: Vec<MemberResponse>) -> TeamRunOutput {
    let mut team = TeamRunOutput::new(run.created_at);
    team.content = run.content;
    team.reasoning_content = run.reasoning_content;
    team.metrics = run.metrics;
    team.model = run.model;
    team.run_id = run.run_id;
    team.team_id = run.agent_id;
    team.team_name = run.agent_name;
    team.session_id = run.session_id;
    team.parent_run_id = run.parent_run_id;
    team.status = run.status;
    team.member_responses = members;
    team
}

fn arguments_map(arguments: &str) -> Map<String, Value> {
    match serde_json::from_str(arguments) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    }
}
