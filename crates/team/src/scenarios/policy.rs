//! Capabilities enforced at dispatch, instance lifecycle events, and cancellation cascading
//! to every running member.

use agentry_memory::conformance::Harness;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::Team;
use agentry_events::{EventEnvelope, EventPayload};
use agentry_model::{ScriptedModel, ScriptedResponse, ScriptedToolCall};
use agentry_runner::{Agent, AgentLimits, FunctionTool, ToolError, TurnRequest};
use agentry_types::{BudgetLimit, CancellationReason, TurnState};
use futures_util::StreamExt;

use super::tool_results;
use serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Nothing {}

/// Scenario.
pub async fn a_member_calling_a_tool_outside_its_capabilities_is_refused_and_nothing_happens(
    harness: Harness,
) {
    let deleted = Arc::new(AtomicUsize::new(0));
    let delete = {
        let deleted = deleted.clone();
        FunctionTool::new("delete_everything", "Deletes everything.", move |_: Nothing, _| {
            let deleted = deleted.clone();
            async move {
                deleted.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolError>("deleted".to_owned())
            }
        })
    };
    let read =
        FunctionTool::new("read", "Reads.", |_: Nothing, _| async { Ok::<_, ToolError>("read".to_owned()) });
    let member_model = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delete_everything", &json!({}))
        } else {
            ScriptedResponse::text(format!("I could not: {}", tool_results(request)[0]))
        }
    }));
    // The member has the tool, but its role may only read: set on the agent, or by the
    // team's spawn policy for the role of the member's name.
    let (delete, read) = (delete.shared(), read.shared());
    let on_agent = Agent::builder("intern", member_model.clone())
        .tool(delete.clone())
        .tool(read.clone())
        .capabilities(["read"])
        .build();
    refuses_the_call_outside_its_capabilities(&harness, on_agent, None, &deleted).await;
    let by_policy =
        Agent::builder("intern", member_model.clone()).tool(delete.clone()).tool(read.clone()).build();
    let policy = crate::SpawnPolicy::parse("[roles.intern]\ncapabilities = [\"read\"]\n").unwrap();
    refuses_the_call_outside_its_capabilities(&harness, by_policy, Some(policy), &deleted).await;
    // A role allowing more than the agent does narrows nothing back open.
    let narrow =
        Agent::builder("intern", member_model).tool(delete).tool(read).capabilities(["read"]).build();
    let wide =
        crate::SpawnPolicy::parse("[roles.intern]\ncapabilities = [\"read\", \"delete_everything\"]\n")
            .unwrap();
    refuses_the_call_outside_its_capabilities(&harness, narrow, Some(wide), &deleted).await;
}

async fn refuses_the_call_outside_its_capabilities(
    harness: &Harness,
    member: Agent,
    policy: Option<crate::SpawnPolicy>,
    deleted: &AtomicUsize,
) {
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "intern", "task": "Clean up."}),
            )
        } else {
            ScriptedResponse::text("Done.")
        }
    }));
    let team = Team::builder("office", coordinator).member(member).spawn_policy(policy).build();
    let (_runtime, _session, turn) = super::start(harness, team, "Clean up.").await;
    let mut denied = Vec::new();
    let mut tool_calls_used = Vec::new();
    let mut stream = turn.stream(None);
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        let instance = event.team.as_ref().and_then(|team| team.instance_id.clone());
        if let EventPayload::CapabilityDenied { tool, reason } = &event.payload {
            denied.push((tool.clone(), reason.clone(), instance));
        } else if let EventPayload::BudgetUsage { usage, .. } = &event.payload
            && instance.is_some()
        {
            tool_calls_used.push(usage.tool_calls_used);
        }
    }
    // The refused call is no tool call: it takes nothing from the member's budget.
    assert!(tool_calls_used.iter().all(|used| *used == 0), "{tool_calls_used:?}");
    assert_eq!(deleted.load(Ordering::SeqCst), 0, "the refused tool did not run");
    assert_eq!(denied.len(), 1);
    assert_eq!(denied[0].0, "delete_everything");
    assert!(denied[0].1.contains("not among its capabilities"), "{}", denied[0].1);
    assert!(denied[0].2.as_deref().is_some_and(|id| id.starts_with("ins_")), "the event names the instance");
    assert!(matches!(turn.wait().await.unwrap(), TurnState::Done { .. }));
}

/// A member that waits in a tool until it is cancelled.
fn stuck(name: &str, started: Arc<tokio::sync::Barrier>) -> Agent {
    let wait = FunctionTool::new("wait", "Waits forever.", move |_: Nothing, _| {
        let started = started.clone();
        async move {
            started.wait().await;
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(String::new())
        }
    });
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::tool_call("wait", &json!({}))));
    let limits = AgentLimits { cancel_grace: Duration::from_millis(50), ..AgentLimits::default() };
    Agent::builder(name, model).tool(wait.shared()).limits(limits).build()
}

/// Scenario.
pub async fn cancelling_a_team_turn_cancels_every_running_member_with_instance_events(harness: Harness) {
    let started = Arc::new(tokio::sync::Barrier::new(4));
    let mut three = ScriptedResponse::default();
    for (index, name) in ["a", "b", "c"].iter().enumerate() {
        three.tool_calls.push(ScriptedToolCall {
            id: Some(format!("call_{index}")),
            name: "delegate_task_to_member".to_owned(),
            arguments: json!({"member_id": name, "task": "Wait."}).to_string(),
        });
    }
    let coordinator = Arc::new(ScriptedModel::new(vec![three]));
    let team = Team::builder("waiters", coordinator)
        .member(stuck("a", started.clone()))
        .member(stuck("b", started.clone()))
        .member(stuck("c", started.clone()))
        .build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Wait, all of you.").await;
    let stream = turn.stream(None);
    // All three members are inside their tools.
    started.wait().await;
    tokio::time::timeout(Duration::from_secs(10), turn.cancel()).await.expect("cancelled in time").unwrap();
    let state = turn.state().await.unwrap();
    assert!(
        matches!(state, TurnState::Cancelled { reason: CancellationReason::ClientCancelled, .. }),
        "{state:?}"
    );

    let events: Vec<Arc<EventEnvelope>> = stream.map(Result::unwrap).collect().await;
    let count = |kind: &str| events.iter().filter(|event| event.payload.kind() == kind).count();
    assert_eq!(count("agent_team.instance.started"), 3);
    assert_eq!(count("agent_team.instance.cancelled"), 3);
    assert_eq!(count("thread.done"), 3);
    let cancelled_instances: std::collections::HashSet<Option<String>> = events
        .iter()
        .filter(|event| event.payload.kind() == "agent_team.instance.cancelled")
        .map(|event| event.team.as_ref().and_then(|team| team.instance_id.clone()))
        .collect();
    assert_eq!(cancelled_instances.len(), 3, "one per instance");
    assert_eq!(events.last().map(|event| event.payload.kind()), Some("turn.done"));
}

/// Scenario.
pub async fn a_finished_member_reports_its_instance_started_and_completed_with_the_mission(harness: Harness) {
    let member =
        Agent::builder("helper", Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("ok"))))
            .build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "helper", "task": "Help."}),
            )
        } else {
            ScriptedResponse::text("Helped.")
        }
    }));
    let (_runtime, _session, turn) =
        super::start(&harness, Team::builder("t", coordinator).member(member).build(), "go").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let lifecycle: Vec<(&str, Option<String>)> = events
        .iter()
        .filter(|event| event.payload.kind().starts_with("agent_team.instance"))
        .map(|event| (event.payload.kind(), event.team.as_ref().and_then(|team| team.mission_id.clone())))
        .collect();
    let mission = Some(format!("mis_{}", turn.id()));
    assert_eq!(
        lifecycle,
        [("agent_team.instance.started", mission.clone()), ("agent_team.instance.completed", mission)]
    );
    let completed = events.iter().find_map(|event| match &event.payload {
        EventPayload::InstanceCompleted { output, .. } => output.clone(),
        _ => None,
    });
    assert_eq!(completed.as_deref(), Some("ok"));
}

/// Two members: `a` waits until cancelled, `b` until the test releases it.
fn pair(release: Arc<tokio::sync::Notify>) -> (Agent, Agent) {
    let forever = FunctionTool::new("wait", "Waits forever.", |_: Nothing, _| async {
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(String::new())
    });
    let released = FunctionTool::new("wait", "Waits for the release.", move |_: Nothing, _| {
        let release = release.clone();
        async move {
            release.notified().await;
            Ok::<_, ToolError>("released".to_owned())
        }
    });
    let model = |done: &'static str| {
        Arc::new(ScriptedModel::responder(move |request| {
            if tool_results(request).is_empty() {
                ScriptedResponse::tool_call("wait", &json!({}))
            } else {
                ScriptedResponse::text(done)
            }
        }))
    };
    let limits = AgentLimits { cancel_grace: Duration::from_millis(50), ..AgentLimits::default() };
    (
        Agent::builder("a", model("a done")).tool(forever.shared()).limits(limits.clone()).build(),
        Agent::builder("b", model("b done")).tool(released.shared()).limits(limits).build(),
    )
}

fn both_then_answer() -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::responder(|request| {
        let results = tool_results(request);
        if results.is_empty() {
            let mut both = ScriptedResponse::default();
            for member in ["a", "b"] {
                both.tool_calls.push(ScriptedToolCall {
                    id: Some(format!("call_{member}")),
                    name: "delegate_task_to_member".to_owned(),
                    arguments: json!({"member_id": member, "task": "Wait."}).to_string(),
                });
            }
            both
        } else {
            ScriptedResponse::text(results.join(" / "))
        }
    }))
}

/// Scenario.
pub async fn one_instance_is_cancelled_on_its_own_and_the_others_finish(harness: Harness) {
    let release = Arc::new(tokio::sync::Notify::new());
    let (a, b) = pair(release.clone());
    let control = crate::TeamControl::new();
    let team = Team::builder("pair", both_then_answer()).member(a).member(b).control(control.clone()).build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Wait, both.").await;
    let running = control.wait_for_instances(2).await;
    let a_instance = running.iter().find(|instance| instance.role == "a").unwrap().instance_id.clone();
    assert!(control.cancel_instance(&a_instance));
    assert!(!control.cancel_instance("ins_nobody"));
    release.notify_one();
    let state = turn.wait().await.unwrap();
    let TurnState::Done { output, .. } = state else { panic!("{state:?}") };
    let answer = output.unwrap().message.content.unwrap();
    assert!(answer.contains("cancelled: client-cancelled") && answer.contains("b done"), "{answer}");
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let ended: Vec<(String, Option<String>)> = events
        .iter()
        .filter(|event| {
            matches!(
                event.payload,
                EventPayload::InstanceCancelled { .. } | EventPayload::InstanceCompleted { .. }
            )
        })
        .map(|event| {
            (event.payload.kind().to_owned(), event.team.as_ref().and_then(|team| team.instance_id.clone()))
        })
        .collect();
    assert_eq!(ended.len(), 2);
    assert!(ended.contains(&("agent_team.instance.cancelled".to_owned(), Some(a_instance))), "{ended:?}");
    assert!(control.instances().is_empty(), "ended instances are no longer listed");
}

/// Scenario.
pub async fn a_mission_is_cancelled_with_all_its_instances(harness: Harness) {
    let (a, b) = pair(Arc::new(tokio::sync::Notify::new()));
    let control = crate::TeamControl::new();
    let team = Team::builder("pair", both_then_answer()).member(a).member(b).control(control.clone()).build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Wait, both.").await;
    let running = control.wait_for_instances(2).await;
    assert_eq!(control.cancel_mission(&running[0].mission_id), 2);
    let state = turn.wait().await.unwrap();
    assert!(matches!(state, TurnState::Done { .. }), "the coordinator still answers: {state:?}");
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let cancelled =
        events.iter().filter(|event| event.payload.kind() == "agent_team.instance.cancelled").count();
    assert_eq!(cancelled, 2);
}

/// A `file_report` tool answering `filed`, counting its runs in `filed`.
fn file_report(filed: &Arc<AtomicUsize>) -> FunctionTool<Nothing> {
    let filed = filed.clone();
    FunctionTool::new("file_report", "Files the report.", move |_: Nothing, _| {
        let filed = filed.clone();
        async move {
            filed.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>("filed".to_owned())
        }
    })
}

/// The `office` team: its coordinator delegates "File it." to its clerk, whose
/// `file_report` (counting its runs in `filed`) needs an approval, then passes the clerk's
/// answer on; `mission` is each mission's budget.
fn office(filed: &Arc<AtomicUsize>, mission: BudgetLimit) -> Agent {
    let clerk_model = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("file_report", &json!({}))
        } else {
            ScriptedResponse::text(format!("Report {}.", tool_results(request)[0]))
        }
    }));
    office_with(clerk_model, filed, mission)
}

/// [`office`] with its clerk answering as `clerk_model` does.
fn office_with(clerk_model: Arc<ScriptedModel>, filed: &Arc<AtomicUsize>, mission: BudgetLimit) -> Agent {
    let clerk = Agent::builder("clerk", clerk_model)
        .tool(file_report(filed).shared())
        .requires_approval("file_report")
        .build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "clerk", "task": "File it."}),
            )
        } else {
            ScriptedResponse::text(format!("Clerk says: {}", tool_results(request)[0]))
        }
    }));
    Team::builder("office", coordinator).member(clerk).mission_budget(mission).build()
}

/// The member's thread and the call that a turn of [`office`] waits on.
fn office_approval(state: &TurnState) -> (agentry_types::ThreadId, String) {
    let (thread, call) = match state.required_actions() {
        [record] => match &record.action {
            agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } => {
                (thread_id.clone(), tool_calls[0].id.clone())
            }
            other => panic!("unexpected {other:?}"),
        },
        other => panic!("expected one required action, got {other:?}"),
    };
    assert!(!thread.is_main(), "the request carries the member's thread");
    (thread, call)
}

/// Scenario.
pub async fn an_approval_asked_inside_a_member_is_answered_next_turn_and_both_finish(harness: Harness) {
    let filed = Arc::new(AtomicUsize::new(0));
    let (_runtime, session, first) =
        super::start(&harness, office(&filed, BudgetLimit::default()), "File the report.").await;
    let state = first.wait().await.unwrap();
    assert_eq!(filed.load(Ordering::SeqCst), 0, "nothing runs before the approval");
    let (thread, call) = office_approval(&state);
    let first_events: Vec<Arc<EventEnvelope>> = first.stream(None).map(Result::unwrap).collect().await;
    assert_eq!(first_events.iter().filter(|event| event.payload.kind() == "thread.done").count(), 0);

    let approve = agentry_types::TurnInputItem::allow(thread.clone(), call);
    let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let state = second.wait().await.unwrap();
    let TurnState::Done { output, required_actions, .. } = state else { panic!("{state:?}") };
    assert!(required_actions.is_empty());
    assert_eq!(output.unwrap().message.content.as_deref(), Some("Clerk says: Report filed."));
    assert_eq!(filed.load(Ordering::SeqCst), 1);
    let second_events: Vec<Arc<EventEnvelope>> = second.stream(None).map(Result::unwrap).collect().await;
    let done_on_member = second_events
        .iter()
        .any(|event| event.payload.kind() == "thread.done" && event.thread_id.as_ref() == Some(&thread));
    assert!(done_on_member, "the member's thread finished in the second turn");
    // The member goes on as the same instance, in the second turn's mission, and ends
    // there; its ledger holds the model calls of both turns.
    let lifecycle = |events: &[Arc<EventEnvelope>]| -> Vec<(&'static str, String, String)> {
        events
            .iter()
            .filter(|event| event.payload.kind().starts_with("agent_team.instance."))
            .map(|event| {
                let team = event.team.clone().unwrap_or_default();
                (
                    event.payload.kind(),
                    team.instance_id.unwrap_or_default(),
                    team.mission_id.unwrap_or_default(),
                )
            })
            .collect()
    };
    let first_lifecycle = lifecycle(&first_events);
    let [("agent_team.instance.started", instance, mission)] = first_lifecycle.as_slice() else {
        panic!("{first_lifecycle:?}")
    };
    assert_eq!(*mission, format!("mis_{}", first.id()));
    let second_mission = format!("mis_{}", second.id());
    assert_eq!(
        lifecycle(&second_events),
        [
            ("agent_team.instance.started", instance.clone(), second_mission.clone()),
            ("agent_team.instance.completed", instance.clone(), second_mission.clone()),
        ]
    );
    let ledger = harness.store.budget(instance, agentry_types::Timestamp::now()).await.unwrap();
    assert_eq!(ledger.used.steps_used, 2, "{ledger:?}");
    // The approved call is one of the member's tool calls, in its ledger and in the
    // mission of the turn it ran in.
    assert_eq!(ledger.used.tool_calls_used, 1, "{ledger:?}");
    let mission = harness.store.budget(&second_mission, agentry_types::Timestamp::now()).await.unwrap();
    assert_eq!(mission.used.tool_calls_used, 1, "{mission:?}");
    // The member that went on in the second turn is among that turn's member responses
    // (its run was stored with the first turn, where it is listed too).
    for turn in [first.id(), second.id()] {
        let output = crate::team_run_output(harness.store.as_ref(), turn).await.unwrap();
        let members: Vec<Option<serde_json::Value>> = output
            .member_responses
            .iter()
            .map(|member| match member {
                agentry_types::agno::MemberResponse::Agent(run) => run.content.clone(),
                agentry_types::agno::MemberResponse::Team(run) => run.content.clone(),
            })
            .collect();
        assert_eq!(members, [Some(json!("Report filed."))], "turn {turn}");
    }
}

/// Scenario: approving a call does not raise a budget. A member's call approved in the next
/// turn reserves a tool call like any other: with none left in that turn's mission, it does
/// not run, and the member stops for the budget.
pub async fn an_approved_call_past_its_missions_budget_does_not_run(harness: Harness) {
    let filed = Arc::new(AtomicUsize::new(0));
    let no_calls = BudgetLimit { max_tool_calls: Some(0), ..BudgetLimit::default() };
    let (_runtime, session, first) =
        super::start(&harness, office(&filed, no_calls), "File the report.").await;
    let (thread, call) = office_approval(&first.wait().await.unwrap());
    let approve = agentry_types::TurnInputItem::allow(thread, call);
    let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert!(state.required_actions().is_empty(), "nothing is asked again: {state:?}");
    assert_eq!(filed.load(Ordering::SeqCst), 0, "the approved call did not run");
    let events: Vec<Arc<EventEnvelope>> = second.stream(None).map(Result::unwrap).collect().await;
    let exhausted: Vec<&EventPayload> = events
        .iter()
        .map(|event| &event.payload)
        .filter(|payload| payload.kind() == "agent_team.mission.budget.exhausted")
        .collect();
    assert_eq!(exhausted.len(), 1, "{exhausted:?}");
    assert!(format!("{:?}", exhausted[0]).contains("mission_max_tool_calls"), "{exhausted:?}");
}

/// Scenario: a budget that refuses an approved call keeps the rest of the answer. The
/// clerk asks to file twice at once; the next turn allows one call, which its mission has no
/// tool call left for, and denies the other with a reason: the denial is still that call's
/// result, with its reason, and the allowed call does not run.
pub async fn a_denial_beside_an_approved_call_past_its_budget_is_kept(harness: Harness) {
    let filed = Arc::new(AtomicUsize::new(0));
    let clerk_model = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("file_report", &json!({})).with_tool_call("file_report", &json!({}))
        } else {
            ScriptedResponse::text(format!("Clerk: {}", tool_results(request).join(", ")))
        }
    }));
    let no_calls = BudgetLimit { max_tool_calls: Some(0), ..BudgetLimit::default() };
    let (_runtime, session, first) =
        super::start(&harness, office_with(clerk_model, &filed, no_calls), "File the report twice.").await;
    let state = first.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    let [allowed, denied] = tool_calls.as_slice() else { panic!("{tool_calls:?}") };
    let answer = vec![
        agentry_types::TurnInputItem::allow(thread_id.clone(), allowed.id.clone()),
        agentry_types::TurnInputItem::deny(
            thread_id.clone(),
            denied.id.clone(),
            Some("not twice".to_owned()),
        ),
    ];
    let second = session.create_turn(TurnRequest::input(answer)).await.unwrap();
    let state = second.wait().await.unwrap();
    assert!(state.required_actions().is_empty(), "nothing is asked again: {state:?}");
    assert_eq!(filed.load(Ordering::SeqCst), 0, "the approved call did not run");
    let events: Vec<Arc<EventEnvelope>> = second.stream(None).map(Result::unwrap).collect().await;
    // The clerk's thread's results (the coordinator's calls are numbered as the clerk's).
    let responses: Vec<(String, String, bool)> = events
        .iter()
        .filter(|event| event.thread_id.as_ref() == Some(thread_id))
        .filter_map(|event| match &event.payload {
            EventPayload::ToolResponse { tool_call_id, content, is_error, .. } => {
                Some((tool_call_id.clone(), content.clone(), *is_error))
            }
            _ => None,
        })
        .collect();
    let denial = responses.iter().find(|(id, ..)| *id == denied.id);
    assert_eq!(
        denial.map(|(_, content, is_error)| (content.as_str(), *is_error)),
        Some(("The user denied this tool call: not twice", true)),
        "{responses:?}"
    );
    // In the clerk's history, each of its calls has one result: the denial with its
    // reason, and a closing result for the call that did not run.
    let query = agentry_memory::HistoryQuery {
        include_member_runs: true,
        agent_id: Some("clerk".to_owned()),
        ..agentry_memory::HistoryQuery::default()
    };
    let history = harness.store.history(session.id(), &query).await.unwrap();
    let results = |id: &str| {
        history
            .iter()
            .filter(|stored| stored.message.tool_call_id.as_deref() == Some(id))
            .map(|stored| stored.message.text())
            .collect::<Vec<_>>()
    };
    assert_eq!(results(&denied.id), ["The user denied this tool call: not twice"], "{history:?}");
    assert_eq!(results(&allowed.id).len(), 1, "{history:?}");
    assert!(
        events.iter().any(|event| event.payload.kind() == "agent_team.mission.budget.exhausted"),
        "the member stopped for its budget"
    );
}

/// Scenario: a member that asks for one approval, and once allowed for another, goes on
/// each time as the same thread and run: the third turn resumes it although its run was
/// stored with the first, each tool runs once, and the coordinator gets its answer.
pub async fn a_member_asking_for_two_approvals_in_turn_resumes_each_time(harness: Harness) {
    let ran = Arc::new(std::sync::Mutex::new(Vec::<&'static str>::new()));
    let tool = |name: &'static str| {
        let ran = ran.clone();
        FunctionTool::new(name, "Does its part.", move |_: Nothing, _| {
            let ran = ran.clone();
            async move {
                ran.lock().unwrap().push(name);
                Ok::<_, ToolError>(format!("{name} done"))
            }
        })
        .shared()
    };
    let clerk_model = Arc::new(ScriptedModel::responder(|request| match tool_results(request).len() {
        0 => ScriptedResponse::tool_call("check", &json!({})),
        1 => ScriptedResponse::tool_call("file", &json!({})),
        _ => ScriptedResponse::text(format!("Clerk: {}", tool_results(request).join(", "))),
    }));
    let clerk = Agent::builder("clerk", clerk_model)
        .tool(tool("check"))
        .tool(tool("file"))
        .requires_approval("check")
        .requires_approval("file")
        .build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "clerk", "task": "Check, then file."}),
            )
        } else {
            ScriptedResponse::text(format!("Coordinator: {}", tool_results(request)[0]))
        }
    }));
    let (_runtime, session, first) =
        super::start(&harness, Team::builder("office", coordinator).member(clerk).build(), "Check and file.")
            .await;
    let mut state = first.wait().await.unwrap();
    let mut turns = vec![first.id()];
    let mut asked = Vec::new();
    let mut threads = Vec::new();
    while let [record] = state.required_actions() {
        let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
            panic!("{record:?}")
        };
        asked.push(tool_calls[0].name.clone());
        threads.push(thread_id.clone());
        assert!(asked.len() <= 2, "asked again and again: {asked:?}");
        let allow = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
        let next = session.create_turn(TurnRequest::input(vec![allow])).await.unwrap();
        turns.push(next.id());
        state = next.wait().await.unwrap();
    }
    assert_eq!(asked, ["check", "file"]);
    assert_eq!(threads[0], threads[1], "the second approval comes from the same thread");
    assert_eq!(*ran.lock().unwrap(), ["check", "file"], "each tool ran once");
    let TurnState::Done { output, .. } = &state else { panic!("{state:?}") };
    let answer = output.as_ref().unwrap().message.content.clone().unwrap_or_default();
    assert_eq!(answer, "Coordinator: Clerk: check done, file done");
    let members =
        agentry_memory::RunQuery { parent: agentry_memory::ParentFilter::Any, ..Default::default() };
    let runs = harness
        .store
        .list_runs(session.id(), &members, &agentry_memory::PageRequest::first(20))
        .await
        .unwrap()
        .items;
    assert_eq!(
        runs.iter().filter(|run| run.agent_id.as_deref() == Some("clerk")).count(),
        1,
        "one member run"
    );
    // The last turn lists the member it took up from the first.
    let output = crate::team_run_output(harness.store.as_ref(), turns[2]).await.unwrap();
    assert_eq!(output.member_responses.len(), 1, "{output:?}");
}

/// Scenario: a member of a team nested in a team asks for an approval; allowed, it goes
/// on where it was, under the same inner team's thread, and both coordinators answer.
pub async fn a_member_of_a_nested_team_paused_for_approval_resumes_in_place(harness: Harness) {
    let filed = Arc::new(AtomicUsize::new(0));
    let file = file_report(&filed);
    let clerk_model = Arc::new(ScriptedModel::responder(|request| match tool_results(request).first() {
        None => ScriptedResponse::tool_call("file_report", &json!({})),
        Some(result) => ScriptedResponse::text(format!("Report {result}.")),
    }));
    let clerk =
        Agent::builder("clerk", clerk_model).tool(file.shared()).requires_approval("file_report").build();
    let delegating = |member: &'static str, says: &'static str| {
        Arc::new(ScriptedModel::responder(move |request| match tool_results(request).last() {
            None => ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": member, "task": "File it."}),
            ),
            Some(result) => ScriptedResponse::text(format!("{says}: {result}")),
        }))
    };
    let inner = Team::builder("desk", delegating("clerk", "Desk")).member(clerk).build();
    let outer = Team::builder("office", delegating("desk", "Office")).member(inner).build();
    let (_runtime, session, first) = super::start(&harness, outer, "File the report.").await;
    let state = first.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    let allow = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
    let second = session.create_turn(TurnRequest::input(vec![allow])).await.unwrap();
    let state = second.wait().await.unwrap();
    let TurnState::Done { output, required_actions, .. } = &state else { panic!("{state:?}") };
    assert!(required_actions.is_empty(), "asked again: {required_actions:?}");
    let answer = output.as_ref().unwrap().message.content.clone().unwrap_or_default();
    assert_eq!(answer, "Office: Desk: Report filed.");
    assert_eq!(filed.load(Ordering::SeqCst), 1);
    let all = agentry_memory::RunQuery { parent: agentry_memory::ParentFilter::Any, ..Default::default() };
    let runs = harness
        .store
        .list_runs(session.id(), &all, &agentry_memory::PageRequest::first(20))
        .await
        .unwrap()
        .items;
    let agents: Vec<&str> = runs.iter().filter_map(|run| run.agent_id.as_deref()).collect();
    assert_eq!(agents.iter().filter(|agent| **agent == "clerk").count(), 1, "one clerk run: {agents:?}");
    // The second turn lists the inner team it took up, with its member.
    let output = crate::team_run_output(harness.store.as_ref(), second.id()).await.unwrap();
    let [agentry_types::agno::MemberResponse::Team(desk)] = output.member_responses.as_slice() else {
        panic!("{:?}", output.member_responses)
    };
    assert_eq!(desk.content, Some(json!("Desk: Report filed.")));
    assert_eq!(desk.member_responses.len(), 1);
}

/// Scenario: a member that pauses for an approval while another member of the same
/// delegation still works is not left paused when the turn is then cancelled: the turn
/// asks for nothing, so nothing would resume it. It ends cancelled with the turn
/// (`agent_team.instance.cancelled` in the turn's mission, then `thread.done`).
pub async fn a_member_paused_in_a_turn_then_cancelled_ends_with_it(harness: Harness) {
    use agentry_memory::{Order, PageRequest, ParentFilter, RunQuery};
    let filed = Arc::new(AtomicUsize::new(0));
    let clerk_model =
        Arc::new(ScriptedModel::responder(|_| ScriptedResponse::tool_call("file_report", &json!({}))));
    let clerk = Agent::builder("clerk", clerk_model)
        .tool(file_report(&filed).shared())
        .requires_approval("file_report")
        .build();
    // The researcher works until the turn is cancelled.
    let research = FunctionTool::new("research", "Researches.", |_: Nothing, context| async move {
        context.until_cancelled(std::future::pending::<()>()).await;
        Err::<String, _>(ToolError::Failed("stopped".to_owned()))
    });
    let researcher_model =
        Arc::new(ScriptedModel::responder(|_| ScriptedResponse::tool_call("research", &json!({}))));
    let researcher = Agent::builder("researcher", researcher_model).tool(research.shared()).build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            let mut both = ScriptedResponse::text("Both.");
            for member in ["clerk", "researcher"] {
                both.tool_calls.push(ScriptedToolCall {
                    id: None,
                    name: "delegate_task_to_member".to_owned(),
                    arguments: json!({"member_id": member, "task": "Work."}).to_string(),
                });
            }
            both
        } else {
            ScriptedResponse::text(format!("Earlier: {}", tool_results(request).join(" | ")))
        }
    }));
    let team = Team::builder("office", coordinator).member(clerk).member(researcher).build();
    let (_runtime, session, turn) = super::start(&harness, team, "Work, both.").await;
    // Once the clerk asks, the turn is cancelled (the researcher still works).
    let mut events = turn.stream(None);
    let asked = loop {
        let event = events.next().await.expect("the clerk asks before the turn ends").unwrap();
        if event.payload.kind() == "tool.approval_required" {
            break event.thread_id.clone().expect("on the clerk's thread");
        }
    };
    turn.cancel().await.unwrap();
    let state = turn.wait().await.unwrap();
    assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
    let members = RunQuery { parent: ParentFilter::Of(turn.id()), ..RunQuery::default() };
    let members =
        harness.store.list_runs(session.id(), &members, &PageRequest::first(10)).await.unwrap().items;
    let clerk_run = members.iter().find(|run| run.agent_id.as_deref() == Some("clerk")).unwrap();
    assert!(
        matches!(clerk_run.state, TurnState::Cancelled { .. }),
        "the clerk does not wait for ever: {:?}",
        clerk_run.state
    );
    let stored = turn.events(Order::Asc).await.unwrap();
    let on_thread: Vec<(&str, Option<&str>)> = stored
        .iter()
        .filter(|event| event.thread_id.as_ref() == Some(&asked))
        .map(|event| (event.payload.kind(), event.team.as_ref().and_then(|team| team.mission_id.as_deref())))
        .collect();
    let mission = format!("mis_{}", turn.id());
    assert_eq!(
        on_thread[on_thread.len() - 2..],
        [("agent_team.instance.cancelled", Some(mission.as_str())), ("thread.done", None)],
        "{on_thread:?}"
    );
    assert_eq!(filed.load(Ordering::SeqCst), 0);
    let next = session.create_turn(TurnRequest::message("Again?")).await.unwrap();
    let state = next.wait().await.unwrap();
    assert!(state.required_actions().is_empty(), "nothing waits any more: {state:?}");
}

/// Scenario: two members on models of their own both ask to approve a call, and their
/// calls have the same id (`call_1_0`: each model numbers its own). Each answer goes to its
/// own thread: one is allowed and runs, the other is denied and is told so.
pub async fn two_members_asking_with_the_same_call_id_each_get_their_own_answer(harness: Harness) {
    let filed = Arc::new(AtomicUsize::new(0));
    let member = |name: &str| {
        let model = Arc::new(ScriptedModel::responder(|request| match tool_results(request).first() {
            None => ScriptedResponse::tool_call("file_report", &json!({})),
            Some(result) => ScriptedResponse::text(format!("Got: {result}")),
        }));
        Agent::builder(name, model)
            .tool(file_report(&filed).shared())
            .requires_approval("file_report")
            .build()
    };
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            let mut both = ScriptedResponse::text("Both.");
            for member in ["north", "south"] {
                both.tool_calls.push(ScriptedToolCall {
                    id: None,
                    name: "delegate_task_to_member".to_owned(),
                    arguments: json!({"member_id": member, "task": "File it."}).to_string(),
                });
            }
            both
        } else {
            ScriptedResponse::text(tool_results(request).join(" | "))
        }
    }));
    let team = Team::builder("office", coordinator).member(member("north")).member(member("south")).build();
    let (_runtime, session, first) = super::start(&harness, team, "File both.").await;
    let state = first.wait().await.unwrap();
    let asked: Vec<(agentry_types::ThreadId, String)> = state
        .required_actions()
        .iter()
        .map(|record| match &record.action {
            agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } => {
                (thread_id.clone(), tool_calls[0].id.clone())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(asked.len(), 2, "{state:?}");
    assert_eq!(asked[0].1, asked[1].1, "the members' calls share an id");
    let answers = vec![
        agentry_types::TurnInputItem::allow(asked[0].0.clone(), asked[0].1.clone()),
        agentry_types::TurnInputItem::deny(
            asked[1].0.clone(),
            asked[1].1.clone(),
            Some("not this one".to_owned()),
        ),
    ];
    let second = session.create_turn(TurnRequest::input(answers)).await.unwrap();
    let state = second.wait().await.unwrap();
    let TurnState::Done { output, required_actions, .. } = &state else { panic!("{state:?}") };
    assert!(required_actions.is_empty(), "asked again: {required_actions:?}");
    assert_eq!(filed.load(Ordering::SeqCst), 1, "the allowed call ran once, the denied one not");
    let answer = output.as_ref().unwrap().message.content.clone().unwrap_or_default();
    assert!(answer.contains("Got: filed") && answer.contains("not this one"), "{answer}");
}

/// Scenario: a member paused for an approval whose answering turn is cancelled before the
/// member goes on (here by the turn's time limit, which a second process's definition of
/// the team sets to nothing) is not left waiting for ever: no later turn would resume it,
/// as the cancelled turn asks nothing. It ends cancelled with that turn (its run,
/// `agent_team.instance.cancelled` in the mission it paused in, then `thread.done`), the
/// coordinator's delegation is closed as not completed, and the session goes on.
pub async fn a_member_paused_when_the_answering_turn_is_cancelled_ends_with_it(harness: Harness) {
    use agentry_memory::{Order, PageRequest, ParentFilter, RunQuery};
    let filed = Arc::new(AtomicUsize::new(0));
    let team = |limits: AgentLimits| {
        let file = file_report(&filed);
        let clerk_model =
            Arc::new(ScriptedModel::responder(|_| ScriptedResponse::tool_call("file_report", &json!({}))));
        let clerk =
            Agent::builder("clerk", clerk_model).tool(file.shared()).requires_approval("file_report").build();
        let coordinator = Arc::new(ScriptedModel::responder(|request| {
            if request.last_user_text().as_deref() == Some("File the report.") {
                ScriptedResponse::tool_call(
                    "delegate_task_to_member",
                    &json!({"member_id": "clerk", "task": "File it."}),
                )
            } else {
                ScriptedResponse::text(format!("Earlier: {}", tool_results(request).join(" | ")))
            }
        }));
        Team::builder("office", coordinator).member(clerk).limits(limits).build()
    };
    let (_runtime, session, first) =
        super::start(&harness, team(AgentLimits::default()), "File the report.").await;
    let state = first.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    let thread = thread_id.clone();
    let approve = agentry_types::TurnInputItem::allow(thread.clone(), tool_calls[0].id.clone());
    let hasty = agentry_runner::Runtime::new(harness.store.clone());
    hasty.register(team(AgentLimits { timeout: Some(Duration::ZERO), ..AgentLimits::default() }));
    let resumed_here = hasty.get_session(session.id()).await.unwrap();
    let second = resumed_here.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert!(
        matches!(state, TurnState::Cancelled { reason: CancellationReason::ServerExecutionTimeout, .. }),
        "{state:?}"
    );
    assert_eq!(filed.load(Ordering::SeqCst), 0, "the member did not go on");

    let members = RunQuery { parent: ParentFilter::Of(first.id()), ..RunQuery::default() };
    let members =
        harness.store.list_runs(session.id(), &members, &PageRequest::first(10)).await.unwrap().items;
    let [member] = members.as_slice() else { panic!("{members:?}") };
    assert!(
        matches!(
            member.state,
            TurnState::Cancelled { reason: CancellationReason::ServerExecutionTimeout, .. }
        ),
        "the member does not wait for ever: {:?}",
        member.state
    );
    let events = second.events(Order::Asc).await.unwrap();
    let on_thread: Vec<(&str, Option<&str>)> = events
        .iter()
        .filter(|event| event.thread_id.as_ref() == Some(&thread))
        .map(|event| (event.payload.kind(), event.team.as_ref().and_then(|team| team.mission_id.as_deref())))
        .collect();
    let first_mission = format!("mis_{}", first.id());
    assert_eq!(
        on_thread,
        [("agent_team.instance.cancelled", Some(first_mission.as_str())), ("thread.done", None)],
        "the instance ends in the mission it paused in, not listed as paused for ever"
    );

    let third = session.create_turn(TurnRequest::message("Where is the report?")).await.unwrap();
    let state = third.wait().await.unwrap();
    let TurnState::Done { output, required_actions, .. } = state else { panic!("{state:?}") };
    assert!(required_actions.is_empty(), "nothing waits any more: {required_actions:?}");
    let answer = output.unwrap().message.content.unwrap_or_default();
    assert!(
        answer.contains("The call did not complete: the turn was cancelled (server-execution-timeout)"),
        "{answer}"
    );
}

/// Scenario.
pub async fn a_member_pausing_inside_a_parallel_delegation_resumes_without_rerunning_the_others(
    harness: Harness,
) {
    let helped = Arc::new(AtomicUsize::new(0));
    let helper_model = {
        let helped = helped.clone();
        Arc::new(ScriptedModel::responder(move |_| {
            helped.fetch_add(1, Ordering::SeqCst);
            ScriptedResponse::text("helped")
        }))
    };
    let helper = Agent::builder("helper", helper_model).build();
    let clerk = super::gated_clerk();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Do your part."}))
        } else {
            ScriptedResponse::text(tool_results(request)[0].clone())
        }
    }));
    let (_runtime, session, first) = super::start(
        &harness,
        Team::builder("office", coordinator).member(clerk).member(helper).build(),
        "Everyone, go.",
    )
    .await;
    let state = first.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    assert_eq!(helped.load(Ordering::SeqCst), 1);

    let approve = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
    let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let TurnState::Done { output, .. } = second.wait().await.unwrap() else { panic!("not done") };
    let answer = output.unwrap().message.content.unwrap();
    assert!(answer.contains("clerk: Report filed.") && answer.contains("helper: helped"), "{answer}");
    assert_eq!(helped.load(Ordering::SeqCst), 1, "the member that had finished did not run again");
}
