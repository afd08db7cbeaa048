//! The agent-team vocabulary (seed 001): `{ "type": "agent_team.…", "properties": {…} }`
//! frames with camelCase properties, as carried on the `/event` and `/global/event` feeds.

use agentry_types::{BudgetLimit, BudgetUsage, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::envelope::{EventEnvelope, EventSource, TeamContext};
use crate::payload::EventPayload;

/// The fields every agent-team event may carry; absent ones are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommonProperties {
    /// The session the event happened in.
    #[serde(rename = "sessionID", skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The model message whose tool call caused it.
    #[serde(rename = "messageID", skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The run (turn).
    #[serde(rename = "runID", skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The mission.
    #[serde(rename = "missionID", skip_serializing_if = "Option::is_none")]
    pub mission_id: Option<String>,
    /// The instance.
    #[serde(rename = "instanceID", skip_serializing_if = "Option::is_none")]
    pub instance_id: Option<String>,
    /// The instance that spawned it.
    #[serde(rename = "parentInstanceID", skip_serializing_if = "Option::is_none")]
    pub parent_instance_id: Option<String>,
    /// Milliseconds since the Unix epoch.
    #[serde(rename = "timestampMs")]
    pub timestamp_ms: i64,
    /// `ui_action`, `tool_call` or `orchestrator_runtime`; on spawn lifecycle events only
    /// (`spawn.*` and `instance.started`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<EventSource>,
}

/// Usage counters as the budget events carry them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageProperties {
    /// Tokens used.
    pub tokens_used: u64,
    /// Model calls made.
    pub steps_used: u64,
    /// Tool calls made.
    pub tool_calls_used: u64,
    /// Cost in US dollars.
    pub cost_used_usd: f64,
    /// Milliseconds elapsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed_ms: Option<u64>,
}

impl From<&BudgetUsage> for UsageProperties {
    fn from(usage: &BudgetUsage) -> Self {
        Self {
            tokens_used: usage.tokens_used,
            steps_used: usage.steps_used,
            tool_calls_used: usage.tool_calls_used,
            cost_used_usd: usage.cost_used_usd,
            elapsed_ms: usage.elapsed_ms,
        }
    }
}

macro_rules! properties {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// The common fields.
            #[serde(flatten)]
            pub common: CommonProperties,
            $($(#[$fmeta])* pub $field: $ty,)*
        }
    };
}

properties!(
    /// `agent_team.spawn.requested`.
    SpawnRequestedProperties {
        /// The role asked for.
        requested_role: String,
        /// The template asked for.
        #[serde(skip_serializing_if = "Option::is_none")]
        template: Option<String>,
        /// The task.
        #[serde(skip_serializing_if = "Option::is_none")]
        task: Option<String>,
        /// Why.
        #[serde(skip_serializing_if = "Option::is_none")]
        justification: Option<String>,
        /// A requested budget.
        #[serde(skip_serializing_if = "Option::is_none")]
        budget_override: Option<BudgetLimit>,
    }
);
properties!(
    /// `agent_team.spawn.denied`.
    SpawnDeniedProperties {
        /// The role asked for.
        requested_role: String,
        /// A machine-readable reason.
        code: String,
        /// A human-readable reason.
        error: String,
    }
);
properties!(
    /// `agent_team.spawn.approved`.
    SpawnApprovedProperties {
        /// The role granted.
        requested_role: String,
        /// The approval that allowed it.
        #[serde(rename = "approvalID", skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    }
);
properties!(
    /// `agent_team.instance.started`.
    InstanceStartedProperties {
        /// Its role.
        role: String,
        /// Its status.
        status: String,
        /// Its budget.
        budget_limit: BudgetLimit,
        /// A hash of its skills.
        #[serde(skip_serializing_if = "Option::is_none")]
        skill_hash: Option<String>,
    }
);
properties!(
    /// `agent_team.budget.usage`.
    BudgetUsageProperties {
        /// The usage.
        #[serde(flatten)]
        usage: UsageProperties,
        /// The limit.
        #[serde(skip_serializing_if = "Option::is_none")]
        budget_limit: Option<BudgetLimit>,
    }
);
properties!(
    /// `agent_team.budget.exhausted` and `agent_team.mission.budget.exhausted`.
    BudgetExhaustedProperties {
        /// The limit that ran out.
        exhausted_by: String,
        /// The usage.
        #[serde(flatten)]
        usage: UsageProperties,
    }
);
properties!(
    /// `agent_team.instance.cancelled`.
    InstanceCancelledProperties {
        /// Why.
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    }
);
properties!(
    /// `agent_team.instance.completed`.
    InstanceCompletedProperties {
        /// The final answer.
        #[serde(skip_serializing_if = "Option::is_none")]
        output: Option<String>,
        /// What it used.
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        usage: Option<UsageProperties>,
    }
);
properties!(
    /// `agent_team.instance.failed`.
    InstanceFailedProperties {
        /// What went wrong.
        error: String,
    }
);
properties!(
    /// `agent_team.capability.denied`.
    CapabilityDeniedProperties {
        /// The tool refused.
        tool: String,
        /// Why.
        reason: String,
    }
);

/// An agent-team event frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", content = "properties")]
pub enum AgentTeamEvent {
    /// A spawn was requested.
    #[serde(rename = "agent_team.spawn.requested")]
    SpawnRequested(SpawnRequestedProperties),
    /// A spawn was refused.
    #[serde(rename = "agent_team.spawn.denied")]
    SpawnDenied(SpawnDeniedProperties),
    /// A spawn was allowed.
    #[serde(rename = "agent_team.spawn.approved")]
    SpawnApproved(SpawnApprovedProperties),
    /// An instance started.
    #[serde(rename = "agent_team.instance.started")]
    InstanceStarted(InstanceStartedProperties),
    /// Budget usage of an instance.
    #[serde(rename = "agent_team.budget.usage")]
    BudgetUsage(BudgetUsageProperties),
    /// An instance's budget ran out.
    #[serde(rename = "agent_team.budget.exhausted")]
    BudgetExhausted(BudgetExhaustedProperties),
    /// An instance was cancelled.
    #[serde(rename = "agent_team.instance.cancelled")]
    InstanceCancelled(InstanceCancelledProperties),
    /// An instance finished.
    #[serde(rename = "agent_team.instance.completed")]
    InstanceCompleted(InstanceCompletedProperties),
    /// An instance failed.
    #[serde(rename = "agent_team.instance.failed")]
    InstanceFailed(InstanceFailedProperties),
    /// A mission's budget ran out.
    #[serde(rename = "agent_team.mission.budget.exhausted")]
    MissionBudgetExhausted(BudgetExhaustedProperties),
    /// A tool call was refused by policy.
    #[serde(rename = "agent_team.capability.denied")]
    CapabilityDenied(CapabilityDeniedProperties),
}

/// Where an agent-team event happened: the common fields apart from the time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentTeamContext {
    /// The session.
    pub session_id: Option<String>,
    /// The originating model message.
    pub message_id: Option<String>,
    /// The run.
    pub run_id: Option<String>,
    /// The mission.
    pub mission_id: Option<String>,
    /// The instance.
    pub instance_id: Option<String>,
    /// The spawning instance.
    pub parent_instance_id: Option<String>,
    /// Where the action came from.
    pub source: Option<EventSource>,
}

impl AgentTeamContext {
    /// The context of a turn's event: its session and run, and its team context.
    #[must_use]
    pub fn of(event: &EventEnvelope) -> Self {
        let team = event.team.clone().unwrap_or_default();
        // The tool call is the runtime's own bookkeeping: the wire names the message.
        let TeamContext { mission_id, instance_id, parent_instance_id, source, message_id, tool_call_id: _ } =
            team;
        Self {
            session_id: Some(event.session_id.to_string()),
            message_id,
            run_id: Some(event.turn_id.to_string()),
            mission_id,
            instance_id,
            parent_instance_id,
            source,
        }
    }
}

fn is_spawn_lifecycle(payload: &EventPayload) -> bool {
    matches!(
        payload,
        EventPayload::SpawnRequested { .. }
            | EventPayload::SpawnDenied { .. }
            | EventPayload::SpawnApproved { .. }
            | EventPayload::InstanceStarted { .. }
    )
}

/// Renders a turn's agent-team event; `None` for other events.
#[must_use]
pub fn render(event: &EventEnvelope) -> Option<AgentTeamEvent> {
    render_payload(&AgentTeamContext::of(event), &event.payload, event.created_at)
}

/// Renders an agent-team payload in a given context (for events raised outside a turn,
/// such as a spawn requested through the API); `None` for other payloads.
#[must_use]
pub fn render_payload(
    context: &AgentTeamContext,
    payload: &EventPayload,
    created_at: Timestamp,
) -> Option<AgentTeamEvent> {
    let common = CommonProperties {
        session_id: context.session_id.clone(),
        message_id: context.message_id.clone(),
        run_id: context.run_id.clone(),
        mission_id: context.mission_id.clone(),
        instance_id: context.instance_id.clone(),
        parent_instance_id: context.parent_instance_id.clone(),
        timestamp_ms: created_at.unix_millis(),
        source: is_spawn_lifecycle(payload).then_some(context.source).flatten(),
    };
    Some(match payload {
        EventPayload::SpawnRequested { requested_role, template, task, justification, budget_override } => {
            AgentTeamEvent::SpawnRequested(SpawnRequestedProperties {
                common,
                requested_role: requested_role.clone(),
                template: template.clone(),
                task: task.clone(),
                justification: justification.clone(),
                budget_override: *budget_override,
            })
        }
        EventPayload::SpawnDenied { requested_role, code, error } => {
            AgentTeamEvent::SpawnDenied(SpawnDeniedProperties {
                common,
                requested_role: requested_role.clone(),
                code: code.clone(),
                error: error.clone(),
            })
        }
        EventPayload::SpawnApproved { requested_role, approval_id } => {
            AgentTeamEvent::SpawnApproved(SpawnApprovedProperties {
                common,
                requested_role: requested_role.clone(),
                approval_id: approval_id.clone(),
            })
        }
        EventPayload::InstanceStarted { role, status, budget_limit, skill_hash } => {
            AgentTeamEvent::InstanceStarted(InstanceStartedProperties {
                common,
                role: role.clone(),
                status: status.clone(),
                budget_limit: *budget_limit,
                skill_hash: skill_hash.clone(),
            })
        }
        EventPayload::BudgetUsage { usage, limit } => AgentTeamEvent::BudgetUsage(BudgetUsageProperties {
            common,
            usage: usage.into(),
            budget_limit: *limit,
        }),
        EventPayload::BudgetExhausted { exhausted_by, usage } => {
            AgentTeamEvent::BudgetExhausted(BudgetExhaustedProperties {
                common,
                exhausted_by: exhausted_by.clone(),
                usage: usage.into(),
            })
        }
        EventPayload::InstanceCancelled { reason } => {
            AgentTeamEvent::InstanceCancelled(InstanceCancelledProperties { common, reason: reason.clone() })
        }
        EventPayload::InstanceCompleted { output, usage } => {
            AgentTeamEvent::InstanceCompleted(InstanceCompletedProperties {
                common,
                output: output.clone(),
                usage: usage.as_ref().map(UsageProperties::from),
            })
        }
        EventPayload::InstanceFailed { error } => {
            AgentTeamEvent::InstanceFailed(InstanceFailedProperties { common, error: error.clone() })
        }
        EventPayload::MissionBudgetExhausted { exhausted_by, usage } => {
            AgentTeamEvent::MissionBudgetExhausted(BudgetExhaustedProperties {
                common,
                exhausted_by: exhausted_by.clone(),
                usage: usage.into(),
            })
        }
        EventPayload::CapabilityDenied { tool, reason } => {
            AgentTeamEvent::CapabilityDenied(CapabilityDeniedProperties {
                common,
                tool: tool.clone(),
                reason: reason.clone(),
            })
        }
        _ => return None,
    })
}
