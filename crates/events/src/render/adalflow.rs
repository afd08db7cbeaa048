//! The AdalFlow runner vocabulary (seed 004): `RunItemStreamEvent`s wrapping run items
//! (`agent.tool_call_start`, `agent.tool_call_activity`, `agent.tool_call_complete`,
//! `agent.step_complete`, `agent.tool_permission_request`, `agent.final_output`,
//! `agent.execution_complete`) and `RawResponsesStreamEvent`s carrying model deltas.
//!
//! [`AdalFlowRenderer`] is a fold: it keeps the step history that the final
//! `RunnerResult` carries.

use agentry_types::adalflow::{Function, FunctionOutput, FunctionRequest, RunnerResult, StepOutput};
use agentry_types::{PendingToolCall, ToolCall, TurnState};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::envelope::EventEnvelope;
use crate::payload::EventPayload;

/// The fields every run item carries, with its typed `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunItemFields<T> {
    /// Unique per item.
    pub id: String,
    /// The item's data.
    pub data: Option<T>,
    /// The error, if the step failed.
    pub error: Option<String>,
    /// ISO-8601 time.
    pub timestamp: String,
}

/// A run item, tagged by its `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum RunItem {
    /// `ToolCallRunItem`: a tool is about to run.
    #[serde(rename = "tool_call_start")]
    ToolCall(RunItemFields<Function>),
    /// `ToolCallActivityRunItem`: progress of a running tool.
    #[serde(rename = "tool_call_activity")]
    ToolCallActivity(RunItemFields<Value>),
    /// `ToolCallPermissionRequest`: a tool call awaits permission.
    #[serde(rename = "tool_call_permission_request")]
    ToolCallPermissionRequest(RunItemFields<FunctionRequest>),
    /// `ToolOutputRunItem`: a tool ran.
    #[serde(rename = "tool_output")]
    ToolOutput(RunItemFields<FunctionOutput>),
    /// `StepRunItem`: a step finished.
    #[serde(rename = "step")]
    Step(RunItemFields<StepOutput>),
    /// `FinalOutputItem`: the run finished.
    #[serde(rename = "final_output")]
    FinalOutput(RunItemFields<RunnerResult>),
}

/// The name of a run-item stream event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RunItemName {
    /// A tool is about to run.
    #[serde(rename = "agent.tool_call_start")]
    ToolCallStart,
    /// A running tool reported progress.
    #[serde(rename = "agent.tool_call_activity")]
    ToolCallActivity,
    /// A tool finished.
    #[serde(rename = "agent.tool_call_complete")]
    ToolCallComplete,
    /// A step finished.
    #[serde(rename = "agent.step_complete")]
    StepComplete,
    /// The agent's final output.
    #[serde(rename = "agent.final_output")]
    FinalOutput,
    /// The whole execution finished.
    #[serde(rename = "agent.execution_complete")]
    ExecutionComplete,
    /// A tool call awaits permission.
    #[serde(rename = "agent.tool_permission_request")]
    ToolPermissionRequest,
}

/// An AdalFlow stream event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type")]
pub enum AdalFlowStreamEvent {
    /// `RawResponsesStreamEvent`: a model delta, passed through.
    #[serde(rename = "raw_response_event")]
    RawResponse {
        /// The input to the model (not repeated on every delta).
        input: Option<Value>,
        /// The delta.
        data: Option<Value>,
        /// The error, if any.
        error: Option<String>,
    },
    /// `RunItemStreamEvent`: a run item.
    #[serde(rename = "run_item_stream_event")]
    RunItem {
        /// What happened.
        name: RunItemName,
        /// The item.
        item: Box<RunItem>,
    },
}

/// Renders a turn's events as AdalFlow stream events.
#[derive(Debug, Default)]
pub struct AdalFlowRenderer {
    step_history: Vec<StepOutput>,
}

impl AdalFlowRenderer {
    /// A renderer at the start of a turn.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The AdalFlow events for the next canonical event of the turn.
    pub fn render(&mut self, event: &EventEnvelope) -> Vec<AdalFlowStreamEvent> {
        let id = event.event_id.to_string();
        let timestamp = event.created_at.to_rfc3339();
        let fields = |suffix: &str| RunItemFields::<()> {
            id: if suffix.is_empty() { id.clone() } else { format!("{id}-{suffix}") },
            data: None,
            error: None,
            timestamp: timestamp.clone(),
        };
        let item = |name, item| AdalFlowStreamEvent::RunItem { name, item: Box::new(item) };
        match &event.payload {
            EventPayload::ModelMessageDelta(delta) => vec![AdalFlowStreamEvent::RawResponse {
                input: None,
                data: serde_json::to_value(delta).ok(),
                error: None,
            }],
            EventPayload::ToolCallStarted { tool_call_id, name, arguments } => vec![item(
                RunItemName::ToolCallStart,
                RunItem::ToolCall(with(fields(""), function(tool_call_id, name, arguments), None)),
            )],
            EventPayload::ToolCallActivity { data, .. } => vec![item(
                RunItemName::ToolCallActivity,
                RunItem::ToolCallActivity(with(fields(""), data.clone(), None)),
            )],
            EventPayload::ToolResponse { tool_call_id, name, arguments, content, is_error } => {
                let input = function(tool_call_id, name, arguments);
                let output = if *is_error {
                    FunctionOutput::failure(input, content.clone())
                } else {
                    FunctionOutput::success(input, Value::String(content.clone()))
                };
                let error = is_error.then(|| content.clone());
                vec![item(
                    RunItemName::ToolCallComplete,
                    RunItem::ToolOutput(with(fields(""), output, error)),
                )]
            }
            EventPayload::StepCompleted { step, tool_call, observation } => {
                let step = StepOutput {
                    step: usize::try_from(*step).unwrap_or(usize::MAX),
                    planner_prompt: None,
                    action: tool_call.as_ref().map(tool_function),
                    function: tool_call.as_ref().map(tool_function),
                    observation: observation.clone(),
                    ctx: None,
                };
                self.step_history.push(step.clone());
                vec![item(RunItemName::StepComplete, RunItem::Step(with(fields(""), step, None)))]
            }
            EventPayload::ToolApprovalRequired { tool_calls } => tool_calls
                .iter()
                .map(|call| {
                    item(
                        RunItemName::ToolPermissionRequest,
                        RunItem::ToolCallPermissionRequest(with(
                            fields(&call.id),
                            permission_request(call),
                            None,
                        )),
                    )
                })
                .collect(),
            EventPayload::TurnDone { state } => {
                let Some(result) = self.result(state) else { return Vec::new() };
                let error = result.error.clone();
                vec![
                    item(
                        RunItemName::FinalOutput,
                        RunItem::FinalOutput(with(fields(""), result.clone(), error.clone())),
                    ),
                    item(
                        RunItemName::ExecutionComplete,
                        RunItem::FinalOutput(with(fields("complete"), result, error)),
                    ),
                ]
            }
            _ => Vec::new(),
        }
    }

    /// The `RunnerResult` of a finished turn: the steps rendered so far, and the answer or
    /// the error of `state`; `None` while the turn runs.
    #[must_use]
    pub fn result(&self, state: &TurnState) -> Option<RunnerResult> {
        let (answer, error) = match state {
            TurnState::Running => return None,
            TurnState::Done { output, .. } => (output.as_ref().and_then(|o| o.message.content.clone()), None),
            TurnState::Cancelled { reason, .. } => (None, Some(format!("cancelled: {}", reason.as_str()))),
            TurnState::Error { message, .. } => (None, Some(message.clone())),
        };
        Some(RunnerResult { step_history: self.step_history.clone(), answer, error, ctx: None })
    }
}

fn with<T>(fields: RunItemFields<()>, data: T, error: Option<String>) -> RunItemFields<T> {
    RunItemFields { id: fields.id, data: Some(data), error, timestamp: fields.timestamp }
}

/// A tool call as an AdalFlow `Function`: JSON-object arguments become keyword
/// arguments, anything else one positional argument.
fn function(id: &str, name: &str, arguments: &str) -> Function {
    let (args, kwargs) = match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(map)) => (Vec::new(), map),
        Ok(other) => (vec![other], Map::new()),
        Err(_) if arguments.trim().is_empty() => (Vec::new(), Map::new()),
        Err(_) => (vec![Value::String(arguments.to_owned())], Map::new()),
    };
    Function::new(name).with_id(id).with_args(args).with_kwargs(kwargs)
}

fn tool_function(call: &ToolCall) -> Function {
    function(&call.id, &call.function.name, &call.function.arguments)
}

fn permission_request(call: &PendingToolCall) -> FunctionRequest {
    FunctionRequest {
        id: call.id.clone(),
        tool_name: Some(call.name.clone()),
        tool: Some(function(&call.id, &call.name, &call.arguments)),
        confirmation_details: None,
    }
}
