//! The agent-team routes under `/v1/agent-team`: templates, instances, missions (with
//! usage roll-ups), spawn approvals (list, approve, deny), and cancelling an instance or a
//! whole mission. Instances and missions are read from the stored agent-team events of the
//! caller's sessions, so they survive restarts and show finished work too.

use std::collections::BTreeMap;
use std::sync::Arc;

use agentry_events::render::agent_team::{self, AgentTeamEvent};
use agentry_memory::{FeedQuery, Order, PageRequest, RunQuery, SessionQuery, StoreError};
use agentry_team::{ApprovalEnd, SpawnApprovals};
use agentry_types::{BudgetUsage, RunRecord, SessionType, Timestamp, TurnId, TurnState};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::harness::JsonBody;
use crate::harness::Params;

/// The most stored events a listing reads, newest first: instances and missions older than
/// that window are not listed.
const SCAN: usize = 20_000;

pub(crate) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/agent-team/templates", get(templates))
        .route("/v1/agent-team/instances", get(instances))
        .route("/v1/agent-team/instances/{instance_id}/cancel", post(cancel_instance))
        .route("/v1/agent-team/missions", get(missions))
        .route("/v1/agent-team/missions/{mission_id}/cancel", post(cancel_mission))
        .route("/v1/agent-team/spawn", post(spawn))
        .route("/v1/agent-team/approvals", get(approvals))
        .route("/v1/agent-team/approvals/{approval_id}/approve", post(approve))
        .route("/v1/agent-team/approvals/{approval_id}/deny", post(deny))
}

/// `GET /v1/agent-team/templates`: every role template of every team's spawn policy.
async fn templates(State(state): State<Arc<AppState>>, _caller: Caller) -> Response {
    let mut data = Vec::new();
    for (team, policy) in &state.policies {
        for (role, spec) in &policy.roles {
            for (name, template) in &spec.templates {
                data.push(json!({
                    "team": team,
                    "role": role,
                    "template": name,
                    "instructions": template.instructions,
                    "model": template.model,
                    "tools": template.tools,
                    "skills": template.skills,
                    "requireApproval": spec.require_approval,
                    "requireJustification": spec.require_justification,
                    "budgetLimit": budget_json(&spec.budget),
                }));
            }
        }
    }
    Json(json!({"data": data})).into_response()
}

fn budget_json(budget: &agentry_team::PolicyBudget) -> Value {
    json!({
        "max_tokens": budget.max_tokens,
        "max_steps": budget.max_steps,
        "max_tool_calls": budget.max_tool_calls,
        "max_cost_usd": budget.max_cost_usd,
        "max_elapsed_ms": budget.max_elapsed_ms,
    })
}

/// The mission of a turn (`mis_<turn id>`).
fn mission_turn(mission_id: &str) -> Option<TurnId> {
    mission_id.strip_prefix("mis_").and_then(|turn| turn.parse().ok())
}

/// Whether the caller owns the team session a mission runs in (a turn of another kind of
/// session is no mission).
async fn owns_mission(state: &AppState, caller: &Caller, mission_id: &str) -> bool {
    let Some(turn) = mission_turn(mission_id) else { return false };
    let Ok(run) = state.runtime.store().get_run(turn).await else { return false };
    caller
        .session(state, &run.session_id.to_string())
        .await
        .is_ok_and(|session| session.record().session_type == SessionType::Team)
}

/// The team sessions whose events a listing reads: the caller's newest.
const SESSIONS: usize = 200;

/// The rendered agent-team events of the caller's newest [`SESSIONS`] team sessions, at
/// most [`SCAN`] stored events read (newest first), returned oldest first. Only the caller's
/// sessions are read, so other subjects' traffic never pushes the caller's work out.
async fn team_events(state: &AppState, caller: &Caller) -> ApiResult<Vec<AgentTeamEvent>> {
    let store = state.runtime.store();
    let query = SessionQuery { session_type: Some(SessionType::Team), ..caller.sessions() };
    let sessions = state.runtime.list_sessions(&query, &PageRequest::first(SESSIONS)).await?;
    let mut rendered = Vec::new();
    let mut read = 0;
    for session in sessions.items {
        let mut after = None;
        while read < SCAN {
            let feed = FeedQuery { session_id: Some(session.id), order: Order::Desc, after };
            let batch = store.feed(&feed, 1000).await?;
            if batch.is_empty() {
                break;
            }
            read += batch.len();
            after = batch.last().map(|stored| stored.position);
            rendered.extend(batch.iter().filter_map(|stored| {
                agent_team::render(&stored.event).map(|event| (stored.position, event))
            }));
        }
    }
    // Oldest first: later events update what earlier ones said.
    rendered.sort_by_key(|(position, _)| *position);
    Ok(rendered.into_iter().map(|(_, event)| event).collect())
}

/// One instance as the listing shows it.
#[derive(Default)]
struct Instance {
    fields: serde_json::Map<String, Value>,
}

/// `GET /v1/agent-team/instances?mission_id=&parent_instance_id=&status=`.
async fn instances(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Params(params): Params,
) -> ApiResult<Response> {
    if let Some(status) = params.get("status")
        && !matches!(status.as_str(), "running" | "paused" | "completed" | "cancelled" | "failed")
    {
        return Err(ApiError::bad_param(
            "status",
            format!("status must be running, paused, completed, cancelled or failed, not {status:?}"),
        ));
    }
    let mut by_id: BTreeMap<String, Instance> = BTreeMap::new();
    for event in team_events(&state, &caller).await? {
        let properties = properties(&event);
        let Some(id) = properties.get("instanceID").and_then(Value::as_str).map(str::to_owned) else {
            continue;
        };
        let Some(status) = instance_status(&event) else { continue };
        let entry = by_id.entry(id).or_default();
        for (key, field) in properties {
            if key != "timestampMs" {
                entry.fields.insert(key, field);
            }
        }
        entry.fields.insert("status".to_owned(), json!(status));
    }
    // Running by its events, but its mission's turn ended waiting for an approval or an
    // answer from it: paused until the session's next turn, where it goes on (and is
    // listed under that turn's mission).
    let mut paused_missions: BTreeMap<String, bool> = BTreeMap::new();
    for instance in by_id.values_mut() {
        if instance.fields.get("status").and_then(Value::as_str) != Some("running") {
            continue;
        }
        let Some(mission) = instance.fields.get("missionID").and_then(Value::as_str).map(str::to_owned)
        else {
            continue;
        };
        let paused = match paused_missions.get(&mission) {
            Some(paused) => *paused,
            None => {
                let paused = mission_paused(&state, &mission).await;
                paused_missions.insert(mission, paused);
                paused
            }
        };
        if paused {
            instance.fields.insert("status".to_owned(), json!("paused"));
        }
    }
    let data: Vec<Value> = by_id
        .into_values()
        .filter(|instance| {
            let matches = |param: &str, field: &str| {
                params
                    .get(param)
                    .is_none_or(|want| instance.fields.get(field).and_then(Value::as_str) == Some(want))
            };
            matches("mission_id", "missionID")
                && matches("parent_instance_id", "parentInstanceID")
                && matches("status", "status")
        })
        .map(|instance| Value::Object(instance.fields))
        .collect();
    Ok(Json(json!({"data": data})).into_response())
}

/// The statuses a mission is listed with.
const MISSION_STATUSES: [&str; 6] =
    ["active", "paused", "completed", "cancelled", "failed", "budget_exhausted"];

/// `GET /v1/agent-team/missions?status=`: each mission with how many instances it
/// started and its usage (its budget ledger: tokens, model calls, tool calls and cost, each
/// counted once however deep its instances spawn), only those of `status` when it is given.
async fn missions(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Params(params): Params,
) -> ApiResult<Response> {
    let wanted = params.get("status");
    if let Some(status) = wanted
        && !MISSION_STATUSES.contains(&status.as_str())
    {
        return Err(ApiError::bad_param(
            "status",
            format!("status must be one of {}, not {status:?}", MISSION_STATUSES.join(", ")),
        ));
    }
    let mut missions: BTreeMap<String, serde_json::Map<String, Value>> = BTreeMap::new();
    for event in team_events(&state, &caller).await? {
        let properties = properties(&event);
        let Some(mission) = properties.get("missionID").and_then(Value::as_str).map(str::to_owned) else {
            continue;
        };
        let entry = missions.entry(mission.clone()).or_insert_with(|| {
            let mut fields = serde_json::Map::new();
            fields.insert("missionID".to_owned(), json!(mission));
            fields
                .insert("sessionID".to_owned(), properties.get("sessionID").cloned().unwrap_or(Value::Null));
            fields.insert("status".to_owned(), json!("active"));
            fields.insert("instances".to_owned(), json!(0));
            fields
        });
        match event {
            AgentTeamEvent::InstanceStarted(_) => {
                let count = entry.get("instances").and_then(Value::as_u64).unwrap_or(0) + 1;
                entry.insert("instances".to_owned(), json!(count));
            }
            AgentTeamEvent::MissionBudgetExhausted(_) => {
                entry.insert("status".to_owned(), json!("budget_exhausted"));
            }
            _ => {}
        }
    }
    // The usage is the mission's own ledger: every step of its instances is settled on it
    // once. (An instance's ledger also holds what the instances it spawned used, and an
    // instance that paused goes on in the next turn's mission with the same ledger: adding
    // up the instances' usage would count both twice.) A mission whose first instance never
    // started has no ledger and has used nothing; a ledger that cannot be read leaves its
    // mission's usage null (the rest of the listing stands), as a status that cannot be read
    // leaves the status as the events tell it.
    let now = Timestamp::now();
    for (mission, entry) in &mut missions {
        let used = match state.runtime.store().budget(mission, now).await {
            Ok(ledger) => Some(ledger.used),
            Err(StoreError::NotFound { .. }) => Some(BudgetUsage::default()),
            Err(error) => {
                tracing::warn!(%mission, %error, "reading a mission's budget ledger failed");
                None
            }
        };
        entry.insert("tokensUsed".to_owned(), json!(used.map(|used| used.tokens_used)));
        entry.insert("stepsUsed".to_owned(), json!(used.map(|used| used.steps_used)));
        entry.insert("toolCallsUsed".to_owned(), json!(used.map(|used| used.tool_calls_used)));
        entry.insert("costUsedUsd".to_owned(), json!(used.map(|used| used.cost_used_usd)));
    }
    // A mission is its turn: it runs while the turn runs, then ends as the turn did.
    for (mission, entry) in &mut missions {
        if entry.get("status").and_then(Value::as_str) != Some("active") {
            continue;
        }
        let Some(turn) = mission_turn(mission) else { continue };
        if let Ok(run) = state.runtime.store().get_run(turn).await {
            // Ended waiting for approvals or answers: its paused members go on in the
            // session's next turn (a mission of its own); once that turn is started, this
            // mission is over.
            let paused = waits_for_answers(state.as_ref(), &run).await;
            let status = match run.state {
                TurnState::Running => "active",
                TurnState::Done { .. } if paused => "paused",
                TurnState::Done { .. } => "completed",
                TurnState::Cancelled { .. } => "cancelled",
                TurnState::Error { .. } => "failed",
            };
            entry.insert("status".to_owned(), json!(status));
        }
    }
    let data: Vec<Value> = missions
        .into_values()
        .filter(|mission| {
            wanted.is_none_or(|want| mission.get("status").and_then(Value::as_str) == Some(want))
        })
        .map(Value::Object)
        .collect();
    Ok(Json(json!({"data": data})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Spawn {
    session_id: String,
    role: String,
    task: String,
    #[serde(default)]
    template: Option<String>,
    #[serde(default)]
    justification: Option<String>,
}

/// `POST /v1/agent-team/spawn`: an operator's spawn on a team session. It runs as a new
/// turn of that session (its mission), under the team's spawn policy like any spawn, with
/// `source: ui_action`; follow it on the feeds or by subscribing to the turn.
async fn spawn(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    JsonBody(body): JsonBody<Spawn>,
) -> ApiResult<Response> {
    let session = caller.session(&state, &body.session_id).await?;
    if session.record().session_type != agentry_types::SessionType::Team {
        return Err(ApiError::bad_param("session_id", "spawns run on a team's session; this is an agent's"));
    }
    if body.role.trim().is_empty() || body.task.trim().is_empty() {
        return Err(ApiError::bad_request("role and task must not be empty"));
    }
    // A role the team's policy does not have would only be denied (`unknown_role`) once the
    // turn runs: say so now. (Without a policy every spawn is denied the same way, and the
    // denial is the feed's to tell.)
    // A template the role does not have is said now too (`template_missing`).
    let team = &session.record().name;
    if let Some((_, policy)) = state.policies.iter().find(|(name, _)| name == team) {
        let Some(role) = policy.roles.get(&body.role).filter(|role| !role.templates.is_empty()) else {
            // The roles a spawn here can take: the coordinator's to spawn, with a template,
            // allowing an instance.
            let coordinator = policy.roles.get(&policy.coordinator_role);
            let roles: Vec<&str> = policy
                .roles
                .iter()
                .filter(|(name, role)| {
                    !role.templates.is_empty()
                        && role.max_instances != Some(0)
                        && coordinator.is_some_and(|coordinator| coordinator.can_spawn.contains(name))
                })
                .map(|(name, _)| name.as_str())
                .collect();
            return Err(ApiError::bad_param(
                "role",
                format!(
                    "team {team:?}'s spawn policy has no role {:?} to spawn (the roles it can spawn: {})",
                    body.role,
                    roles.join(", ")
                ),
            ));
        };
        let template = body.template.as_deref().unwrap_or("default");
        if !role.templates.contains_key(template) {
            let templates: Vec<&str> = role.templates.keys().map(String::as_str).collect();
            return Err(ApiError::bad_param(
                "template",
                format!(
                    "role {:?} of team {team:?} has no template {template:?} (its templates: {})",
                    body.role,
                    templates.join(", ")
                ),
            ));
        }
        // What the policy says of every spawn of the role, whatever the mission holds, is
        // said now too: the spawn runs as the coordinator's.
        let coordinator = &policy.coordinator_role;
        if !policy.roles.get(coordinator).is_some_and(|spawner| spawner.can_spawn.contains(&body.role)) {
            return Err(ApiError::bad_param(
                "role",
                format!(
                    "team {team:?}'s coordinator (role {coordinator:?}) may not spawn role {:?}",
                    body.role
                ),
            ));
        }
        if role.max_instances == Some(0) {
            return Err(ApiError::bad_param(
                "role",
                format!("role {:?} of team {team:?} allows no instances (max_instances = 0)", body.role),
            ));
        }
        if role.require_justification
            && body.justification.as_deref().is_none_or(|text| text.trim().is_empty())
        {
            return Err(ApiError::bad_param(
                "justification",
                format!("a spawn of role {:?} needs a justification", body.role),
            ));
        }
    }
    let request = agentry_team::SpawnRequest {
        role: body.role,
        task: body.task,
        template: body.template,
        justification: body.justification,
    };
    // A team session whose last turn waits for answers takes no message until they come:
    // said in the spawn's own terms rather than as a refused input it never sent.
    if let Some(latest) = crate::harness::latest_turn(&session).await?
        && let TurnState::Done { required_actions, .. } = &latest.record().state
        && !required_actions.is_empty()
    {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "session_paused",
            format!(
                "the team session {} waits for answers to {} required action(s) of its turn {}: answer them \
                 (a turn with user.tool_approval or user.tool_response items) before spawning into it",
                session.id(),
                required_actions.len(),
                latest.id()
            ),
        ));
    }
    let (directive, text) = state.control.request_spawn(&request);
    let created = session
        .create_turn(agentry_runner::TurnRequest {
            input: vec![agentry_types::TurnInputItem::message(text)],
            created_by: Some(caller.0.clone()),
            ..agentry_runner::TurnRequest::default()
        })
        .await;
    let turn = match created {
        Ok(turn) => turn,
        Err(error) => {
            state.control.forget_spawn(&directive);
            return Err(error.into());
        }
    };
    state.track(&turn);
    // The request is only good for this turn.
    let control = state.control.clone();
    let finished = turn.clone();
    tokio::spawn(async move {
        let _ = finished.wait().await;
        control.forget_spawn(&directive);
    });
    Ok((
        axum::http::StatusCode::ACCEPTED,
        Json(json!({
            "sessionID": session.id().to_string(),
            "turnID": turn.id().to_string(),
            "missionID": format!("mis_{}", turn.id()),
        })),
    )
        .into_response())
}

/// `GET /v1/agent-team/approvals[?wait_secs=N]`: spawns waiting for a decision. With
/// `wait_secs`, waits up to that long (at most 60 s) for one to be waiting.
async fn approvals(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Params(params): Params,
) -> ApiResult<Response> {
    if let Some(text) = params.get("wait_secs") {
        let secs: u64 =
            text.parse().ok().filter(|secs| *secs <= 60).ok_or_else(|| {
                ApiError::bad_param("wait_secs", "wait_secs must be an integer from 0 to 60")
            })?;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(secs);
        loop {
            let waiting = state.approvals.wait_for_pending();
            let pending = tokio::select! {
                pending = tokio::time::timeout_at(deadline, waiting) => pending.unwrap_or_default(),
                () = state.stopped() => break,
            };
            let mut mine = false;
            for spawn in &pending {
                mine |= owns_mission(&state, &caller, &spawn.mission_id).await;
            }
            if mine || tokio::time::Instant::now() >= deadline {
                break;
            }
            // Only other subjects' spawns wait (rare): look again shortly.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let mut data = Vec::new();
    for pending in state.approvals.pending() {
        if owns_mission(&state, &caller, &pending.mission_id).await {
            data.push(json!({
                "approvalID": pending.approval_id,
                "missionID": pending.mission_id,
                "role": pending.role,
                "task": pending.task,
                "justification": pending.justification,
            }));
        }
    }
    Ok(Json(json!({"data": data})).into_response())
}

/// 404 for an approval this server has not seen: approvals wait in the server that runs
/// their mission's turn, so with several servers on one store it may be another's.
fn unknown_approval(approval_id: &str) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!(
            "approval {} not found: none waits under that id in this server (a spawn waits for its approval in \
             the server running its mission's turn: decide it there)",
            crate::error::quoted_id(approval_id)
        ),
    )
}

/// Decides a pending approval the caller may decide with `decide` (which says whether it
/// decided). One no longer waiting is 409 with how its wait ended, when it ended recently
/// in this process and the caller may see it; otherwise 404.
async fn decide_approval(
    state: &AppState,
    caller: &Caller,
    approval_id: &str,
    decide: impl FnOnce(&SpawnApprovals) -> bool,
) -> ApiResult<()> {
    let pending = state.approvals.pending().into_iter().find(|pending| pending.approval_id == approval_id);
    let mission = match pending {
        Some(pending) => Some(pending.mission_id),
        None => state.approvals.ended(approval_id).map(|ended| ended.mission_id),
    };
    let Some(mission) = mission else { return Err(unknown_approval(approval_id)) };
    if !owns_mission(state, caller, &mission).await {
        return Err(ApiError::not_found("approval", approval_id));
    }
    // Decided between the two reads (by another request, or its wait ended): told below.
    if decide(&state.approvals) {
        return Ok(());
    }
    let Some(ended) = state.approvals.ended(approval_id) else {
        return Err(ApiError::not_found("approval", approval_id));
    };
    let how = match ended.end {
        ApprovalEnd::Approved => "was already approved",
        ApprovalEnd::Denied => "was already denied",
        _ => "was withdrawn: the spawn stopped waiting (it timed out, or its turn was cancelled or ended)",
    };
    Err(ApiError::new(
        axum::http::StatusCode::CONFLICT,
        "approval_ended",
        format!("approval {} {how}", crate::error::quoted_id(approval_id)),
    ))
}

async fn approve(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(approval_id): Path<String>,
) -> ApiResult<Response> {
    decide_approval(&state, &caller, &approval_id, |approvals| approvals.approve(&approval_id)).await?;
    Ok(Json(json!({"approvalID": approval_id, "status": "approved"})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Deny {
    #[serde(default)]
    reason: Option<String>,
}

async fn deny(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(approval_id): Path<String>,
    JsonBody(body): JsonBody<Deny>,
) -> ApiResult<Response> {
    // A blank reason is none: the denial still says who decided.
    let reason = body
        .reason
        .map(|reason| reason.trim().to_owned())
        .filter(|reason| !reason.is_empty())
        .unwrap_or_else(|| "denied by an operator".to_owned());
    decide_approval(&state, &caller, &approval_id, |approvals| approvals.deny(&approval_id, reason)).await?;
    Ok(Json(json!({"approvalID": approval_id, "status": "denied"})).into_response())
}

async fn cancel_instance(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(instance_id): Path<String>,
) -> ApiResult<Response> {
    let instance = state.control.instances().into_iter().find(|instance| instance.instance_id == instance_id);
    match instance {
        Some(instance) if owns_mission(&state, &caller, &instance.mission_id).await => {
            state.control.cancel_instance(&instance_id);
            Ok(Json(json!({"instanceID": instance_id, "status": "cancelled"})).into_response())
        }
        Some(_) => Err(ApiError::not_found("running instance", &instance_id)),
        None => match listed_running(&state, &caller, &instance_id).await? {
            // Listed as running in a mission whose turn has ended: the instance paused the
            // turn (an approval, an answer) and goes on when the session's next turn answers.
            Some(mission) if mission_paused(&state, &mission).await => Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "instance_paused",
                format!(
                    "instance {instance_id} is paused: mission {mission} ended waiting for an approval or an answer \
                     from it; deny the approval (or answer) in the session's next turn to end it"
                ),
            )),
            // Listed as running, but its turn runs in no process here: another server runs
            // it, or it waits for recovery after its process stopped. Only its mission can
            // be cancelled from here (the request is stored for its turn).
            Some(mission) => Err(ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "instance_elsewhere",
                format!(
                    "instance {instance_id} runs in a turn this server does not run (another server runs it, \
                     or it is recovered once its stopped process's lease lapses); cancel its mission {mission} \
                     to stop it"
                ),
            )),
            None => Err(ApiError::not_found("running instance", &instance_id)),
        },
    }
}

/// Whether a mission's turn waits for approvals or answers (see [`waits_for_answers`]).
async fn mission_paused(state: &AppState, mission_id: &str) -> bool {
    let Some(turn) = mission_turn(mission_id) else { return false };
    match state.runtime.store().get_run(turn).await {
        Ok(run) => waits_for_answers(state, &run).await,
        Err(_) => false,
    }
}

/// Whether a turn waits for approvals or answers: it ended asking for them, and its session
/// has no later turn (which answers them, or leaves them: the members it paused go on in
/// that turn or end with it).
async fn waits_for_answers(state: &AppState, run: &RunRecord) -> bool {
    if !matches!(&run.state, TurnState::Done { required_actions, .. } if !required_actions.is_empty()) {
        return false;
    }
    let latest = RunQuery { order: Order::Desc, ..RunQuery::default() };
    match state.runtime.store().list_runs(run.session_id, &latest, &PageRequest::first(1)).await {
        Ok(page) => page.items.first().is_none_or(|latest| latest.id == run.id),
        // Unknown: listed as it ended, waiting.
        Err(_) => true,
    }
}

/// The mission of an instance of the caller's that the stored events list as running (or
/// paused: `instances` tells the two apart by the mission's turn).
async fn listed_running(state: &AppState, caller: &Caller, instance_id: &str) -> ApiResult<Option<String>> {
    let mut running = None;
    for event in team_events(state, caller).await? {
        let properties = properties(&event);
        if properties.get("instanceID").and_then(Value::as_str) != Some(instance_id) {
            continue;
        }
        if let Some(status) = instance_status(&event) {
            running = (status == "running")
                .then(|| properties.get("missionID").and_then(Value::as_str).map(str::to_owned))
                .flatten();
        }
    }
    Ok(running)
}

/// An agent-team event's `properties`, as the feeds render them.
fn properties(event: &AgentTeamEvent) -> serde_json::Map<String, Value> {
    match serde_json::to_value(event) {
        Ok(Value::Object(mut rendered)) => match rendered.remove("properties") {
            Some(Value::Object(properties)) => properties,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    }
}

/// The status an instance's lifecycle event gives it; `None` for other events.
const fn instance_status(event: &AgentTeamEvent) -> Option<&'static str> {
    match event {
        AgentTeamEvent::InstanceStarted(_) => Some("running"),
        AgentTeamEvent::InstanceCompleted(_) => Some("completed"),
        AgentTeamEvent::InstanceCancelled(_) => Some("cancelled"),
        AgentTeamEvent::InstanceFailed(_) => Some("failed"),
        _ => None,
    }
}

async fn cancel_mission(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(mission_id): Path<String>,
) -> ApiResult<Response> {
    if !owns_mission(&state, &caller, &mission_id).await {
        return Err(ApiError::not_found("mission", &mission_id));
    }
    // A mission that has ended has nothing left to cancel: as for an ended instance, the
    // caller is told so rather than that it was cancelled; one that ended waiting for
    // approvals or answers is told how to end what waits.
    if mission_paused(&state, &mission_id).await {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "mission_paused",
            format!(
                "mission {mission_id} is paused: its turn ended waiting for approvals or answers; deny or answer \
                 them in the session's next turn to end it"
            ),
        ));
    }
    if let Some(turn) = mission_turn(&mission_id)
        && state.runtime.store().get_run(turn).await?.state.is_terminal()
    {
        return Err(ApiError::not_found("running mission", &mission_id));
    }
    let cancelled = state.control.cancel_mission(&mission_id);
    // The mission is its team turn: the coordinator stops too, and with it a spawn still
    // waiting for a person's approval (which is withdrawn). Returns once the turn has ended.
    if let Some(turn) = mission_turn(&mission_id) {
        let run = state.runtime.store().get_run(turn).await?;
        let session = state.runtime.get_session(run.session_id).await?;
        session.get_turn(turn).await?.cancel().await?;
    }
    Ok(Json(json!({"missionID": mission_id, "cancelledInstances": cancelled})).into_response())
}
