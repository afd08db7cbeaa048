//! Budgets shared by a mission and its instances: concurrent members stop at the mission's
//! limit, within one reservation, and every instance is cancelled; reservations end with
//! the turn's lease.

use agentry_memory::conformance::Harness;
use std::sync::Arc;

use crate::Team;
use agentry_events::{EventEnvelope, EventPayload};
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, FunctionTool, Runtime, ToolError, TurnRequest};
use agentry_types::{BudgetLimit, Timestamp, Usage};
use futures_util::StreamExt;
use serde_json::json;

use super::tool_results;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Nothing {}

/// A member that works forever: every model call costs 200 tokens and calls `work`.
fn tireless(name: String) -> Agent {
    let work =
        FunctionTool::new("work", "Works.", |_: Nothing, _| async { Ok::<_, ToolError>("more".to_owned()) });
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse {
        usage: Some(Usage::new(150, 50)),
        ..ScriptedResponse::tool_call("work", &json!({}))
    }));
    Agent::builder(name, model).tool(work.shared()).build()
}

/// A model that waits for a permit before each answer: members hold their reservations
/// for as long as the test wants.
#[derive(Debug)]
struct Gated {
    inner: ScriptedModel,
    permits: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl agentry_model::Model for Gated {
    fn info(&self) -> agentry_model::ModelInfo {
        self.inner.info()
    }

    async fn stream(
        &self,
        request: agentry_model::ModelRequest,
    ) -> Result<agentry_model::ModelStream, agentry_model::ModelError> {
        if let Ok(permit) = self.permits.acquire().await {
            permit.forget();
        }
        self.inner.stream(request).await
    }
}

/// Scenario.
pub async fn a_member_refused_only_for_what_others_hold_stops_alone(harness: Harness) {
    // Three members at once, 1,000 tokens held for each model call, 2,500 in all: the
    // third cannot hold its step while the other two hold theirs, with nothing spent yet.
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Answer."}))
        } else {
            ScriptedResponse::text("Answered.")
        }
    }));
    let permits = Arc::new(tokio::sync::Semaphore::new(0));
    let member = |name: &str| {
        let inner = ScriptedModel::responder(|_| ScriptedResponse {
            usage: Some(Usage::new(80, 20)),
            ..ScriptedResponse::text("Done.")
        });
        Agent::builder(name, Arc::new(Gated { inner, permits: permits.clone() })).build()
    };
    let team = Team::builder("trio", coordinator)
        .mission_budget(BudgetLimit { max_tokens: Some(2_500), ..BudgetLimit::default() })
        .tokens_per_step(1_000)
        .member(member("a"))
        .member(member("b"))
        .member(member("c"));
    let runtime = Runtime::new(harness.store.clone());
    runtime.register(team.build());
    let session = runtime.create_session("trio", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("Go.")).await.unwrap();
    let mut stream = turn.stream(None);
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        // The refused member has stopped: the two holding theirs may answer now.
        if matches!(event.payload, EventPayload::BudgetExhausted { .. }) {
            permits.add_permits(2);
        }
        events.push(event);
    }
    let count = |kind: &str| events.iter().filter(|event| event.payload.kind() == kind).count();
    assert_eq!(count("agent_team.budget.exhausted"), 1, "one member could not hold its step");
    assert_eq!(count("agent_team.mission.budget.exhausted"), 0, "the mission was not used up");
    assert_eq!(count("agent_team.instance.cancelled"), 1, "only the refused member stopped");
    assert_eq!(count("agent_team.instance.completed"), 2, "the others finished their calls");
    let exhausted_by = events.iter().find_map(|event| match &event.payload {
        EventPayload::BudgetExhausted { exhausted_by, .. } => Some(exhausted_by.clone()),
        _ => None,
    });
    assert_eq!(exhausted_by.as_deref(), Some("mission_max_tokens"));
    assert!(matches!(turn.wait().await.unwrap(), agentry_types::TurnState::Done { .. }));
}

/// Scenario.
pub async fn a_member_whose_own_calls_do_not_fit_uses_the_mission_up(harness: Harness) {
    // One tool call left in the mission, two asked for in one message: the second is
    // refused for the first's hold, the member's own, so the mission is used up.
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "pair", "task": "Twice."}),
            )
        } else {
            ScriptedResponse::text("Stopped.")
        }
    }));
    let work =
        FunctionTool::new("work", "Works.", |_: Nothing, _| async { Ok::<_, ToolError>("done".to_owned()) });
    let model = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("work", &json!({})).with_tool_call("work", &json!({}))
        } else {
            ScriptedResponse::text("Worked.")
        }
    }));
    let pair = Agent::builder("pair", model).tool(work.shared()).build();
    let team = Team::builder("duo", coordinator)
        .mission_budget(BudgetLimit { max_tool_calls: Some(1), ..BudgetLimit::default() })
        .member(pair);
    let runtime = Runtime::new(harness.store.clone());
    runtime.register(team.build());
    let session = runtime.create_session("duo", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("Go.")).await.unwrap();
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let exhausted_by = events.iter().find_map(|event| match &event.payload {
        EventPayload::MissionBudgetExhausted { exhausted_by, .. } => Some(exhausted_by.clone()),
        _ => None,
    });
    assert_eq!(exhausted_by.as_deref(), Some("mission_max_tool_calls"), "the mission is used up");
    assert!(matches!(turn.wait().await.unwrap(), agentry_types::TurnState::Done { .. }));
}

/// Scenario.
pub async fn ten_concurrent_members_stop_at_the_mission_limit_and_are_all_cancelled(harness: Harness) {
    const LIMIT: u64 = 5_000;
    const STEP: u64 = 200;
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Work until stopped."}))
        } else {
            ScriptedResponse::text("Out of budget.")
        }
    }));
    let mut team = Team::builder("crowd", coordinator)
        .mission_budget(BudgetLimit { max_tokens: Some(LIMIT), ..BudgetLimit::default() })
        .tokens_per_step(STEP);
    for index in 0..10 {
        team = team.member(tireless(format!("member-{index}")));
    }
    let store = harness.store.clone();
    let runtime = Runtime::new(store.clone());
    runtime.register(team.build());
    let session = runtime.create_session("crowd", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("Go.")).await.unwrap();
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;

    let count = |kind: &str| events.iter().filter(|event| event.payload.kind() == kind).count();
    assert_eq!(count("agent_team.mission.budget.exhausted"), 1, "reported once");
    assert_eq!(count("agent_team.instance.started"), 10);
    assert_eq!(count("agent_team.instance.cancelled"), 10, "every instance was cancelled");
    let exhausted_by = events.iter().find_map(|event| match &event.payload {
        EventPayload::MissionBudgetExhausted { exhausted_by, .. } => Some(exhausted_by.clone()),
        _ => None,
    });
    assert_eq!(exhausted_by.as_deref(), Some("mission_max_tokens"));
    let cancelled_for_budget = events.iter().all(|event| match &event.payload {
        EventPayload::InstanceCancelled { reason } => reason.as_deref() == Some("budget-exhausted"),
        _ => true,
    });
    assert!(cancelled_for_budget);
    assert!(count("agent_team.budget.usage") > 0, "settled usage is reported");

    // The mission's ledger, in the store: within one reservation of the limit.
    let mission = format!("mis_{}", turn.id());
    let ledger = store.budget(&mission, Timestamp::now()).await.unwrap();
    assert!(ledger.used.tokens_used <= LIMIT + STEP, "{ledger:?}");
    assert!(ledger.used.tokens_used >= LIMIT - STEP * 10, "the members used the budget: {ledger:?}");
    let state = turn.wait().await.unwrap();
    assert!(matches!(state, agentry_types::TurnState::Done { .. }), "the coordinator answered: {state:?}");
    // The session owns the mission's ledger: deleting it leaves nothing behind.
    store.delete_session(session.id()).await.unwrap();
    let deleted = store.budget(&mission, Timestamp::now()).await.unwrap_err();
    assert!(matches!(deleted, agentry_memory::StoreError::NotFound { .. }), "{deleted:?}");
}

/// Scenario.
pub async fn an_instance_stops_when_its_cost_or_its_time_runs_out(harness: Harness) {
    let policy = crate::SpawnPolicy::parse(
        r#"
[roles.spender]
budget = { max_cost_usd = 0.025 }
[roles.slowpoke]
budget = { max_elapsed_ms = 40 }
"#,
    )
    .unwrap();
    let slow = FunctionTool::new("work", "Takes a while.", |_: Nothing, _| async {
        // The work itself: time passing is what this member spends.
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        Ok::<_, ToolError>("more".to_owned())
    })
    .shared();
    let looping = || {
        Arc::new(ScriptedModel::responder(|_| ScriptedResponse {
            usage: Some(Usage::new(1_000, 0)),
            ..ScriptedResponse::tool_call("work", &json!({}))
        }))
    };
    let spender = Agent::builder("spender", looping()).tool(slow.clone()).build();
    let slowpoke = Agent::builder("slowpoke", looping()).tool(slow).build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Spend."}))
        } else {
            ScriptedResponse::text("Stopped.")
        }
    }));
    let team = Team::builder("spenders", coordinator)
        .member(spender)
        .member(slowpoke)
        .spawn_policy(Some(policy))
        // Each call: 1,000 input tokens at $10 per million, $0.01.
        .price("scripted", crate::Price { input_per_million: 10.0, output_per_million: 0.0 })
        .build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Go.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let mut exhausted = super::exhausted_by(&events);
    exhausted.sort();
    assert_eq!(exhausted, ["max_cost_usd", "max_elapsed_ms"]);
    let cancelled =
        events.iter().filter(|event| event.payload.kind() == "agent_team.instance.cancelled").count();
    assert_eq!(cancelled, 2);
    let spent = events.iter().filter_map(|event| match &event.payload {
        EventPayload::BudgetUsage { usage, .. } => Some(usage.cost_used_usd),
        _ => None,
    });
    let most = spent.fold(0.0_f64, f64::max);
    assert!(most > 0.02 && most < 0.04, "the spender stopped within one call of its limit: {most}");
}

/// Scenario: a step that uses more than its instance's budget, or its mission's, allows
/// (one model call reporting 700 tokens against 100 held) exhausts it at once: a member
/// answering in one call never reaches a next reservation that would be refused.
pub async fn a_step_past_a_budget_exhausts_it_at_once_not_at_the_next_step(harness: Harness) {
    let verbose = |name: &str| {
        let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse {
            usage: Some(Usage::new(500, 200)),
            ..ScriptedResponse::text("A long answer.")
        }));
        Agent::builder(name, model).build()
    };
    let coordinator = || {
        Arc::new(ScriptedModel::responder(|request| {
            if tool_results(request).is_empty() {
                ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Explain."}))
            } else {
                ScriptedResponse::text("Done.")
            }
        }))
    };
    let kinds = |events: &[Arc<EventEnvelope>], kind: &str| {
        events.iter().filter(|event| event.payload.kind() == kind).count()
    };
    // The instance's own budget.
    let policy = crate::SpawnPolicy::parse("[roles.talker]\nbudget = { max_tokens = 100 }\n").unwrap();
    let team = Team::builder("talkers", coordinator())
        .member(verbose("talker"))
        .spawn_policy(Some(policy))
        .tokens_per_step(10)
        .build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Go.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let exhausted: Vec<(String, u64)> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::BudgetExhausted { exhausted_by, usage } => {
                Some((exhausted_by.clone(), usage.tokens_used))
            }
            _ => None,
        })
        .collect();
    assert_eq!(exhausted, [("max_tokens".to_owned(), 700)]);
    assert_eq!(kinds(&events, "agent_team.instance.cancelled"), 1);
    assert_eq!(kinds(&events, "agent_team.instance.completed"), 0, "its answer is past its budget");
    // The mission's: two members of 700 tokens each against 1,000 for the mission.
    let team = Team::builder("pair", coordinator())
        .member(verbose("first"))
        .member(verbose("second"))
        .mission_budget(BudgetLimit { max_tokens: Some(1_000), ..BudgetLimit::default() })
        .tokens_per_step(10)
        .build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Go.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let by: Vec<String> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::MissionBudgetExhausted { exhausted_by, .. } => Some(exhausted_by.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(by, ["mission_max_tokens"], "reported once");
    assert!(kinds(&events, "agent_team.instance.cancelled") >= 1);
    assert!(matches!(turn.wait().await.unwrap(), agentry_types::TurnState::Done { .. }));
}

/// Scenario: an instance's time runs out while its model call is still streaming: it is
/// stopped then, not when the call ends.
pub async fn an_instance_out_of_time_is_stopped_in_the_middle_of_a_step(harness: Harness) {
    let slow = Arc::new(ScriptedModel::responder(|_| {
        // 400 pieces, 50 ms apart: 20 s, far past its 100 ms.
        ScriptedResponse::text("x".repeat(400)).chunked(1).delayed(std::time::Duration::from_millis(50))
    }));
    let policy = crate::SpawnPolicy::parse("[roles.dawdler]\nbudget = { max_elapsed_ms = 100 }\n").unwrap();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "dawdler", "task": "Go."}),
            )
        } else {
            ScriptedResponse::text("Stopped.")
        }
    }));
    let team = Team::builder("slow", coordinator)
        .member(Agent::builder("dawdler", slow).build())
        .spawn_policy(Some(policy))
        .build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Go.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let exhausted: Vec<(String, Option<u64>)> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::BudgetExhausted { exhausted_by, usage } => {
                Some((exhausted_by.clone(), usage.elapsed_ms))
            }
            _ => None,
        })
        .collect();
    assert_eq!(exhausted.len(), 1, "{exhausted:?}");
    assert_eq!(exhausted[0].0, "max_elapsed_ms");
    assert!(exhausted[0].1.is_some_and(|ms| ms >= 100), "{exhausted:?}");
    let cancelled: Vec<Option<String>> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::InstanceCancelled { reason } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, [Some("budget-exhausted".to_owned())]);
    // It streamed only part of its answer.
    let streamed: usize = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ModelMessageDelta(delta)
                if event.thread_id.as_ref().is_some_and(|t| !t.is_main()) =>
            {
                delta.content.as_ref().map(String::len)
            }
            _ => None,
        })
        .sum();
    assert!(streamed < 400, "{streamed} characters streamed");
    assert!(matches!(turn.wait().await.unwrap(), agentry_types::TurnState::Done { .. }));
}

/// Scenario: a member's reservations are made under its turn's lease, so they stop holding
/// the mission's budget when the lease ends: given back (here, from outside), or taken
/// over by another process (the conformance case `budget_reservations_end_with_their_lease`
/// covers a takeover of a lapsed lease, which this turn's keeper would not let lapse). The
/// fenced-out turn then stops without writing anything.
pub async fn a_members_reservations_end_with_the_turns_lease(harness: Harness) {
    let started = Arc::new(tokio::sync::Notify::new());
    let finish = Arc::new(tokio::sync::Notify::new());
    let (working, finishing) = (started.clone(), finish.clone());
    let work = FunctionTool::new("work", "Works until told to stop.", move |_: Nothing, _| {
        let (working, finishing) = (working.clone(), finishing.clone());
        async move {
            working.notify_one();
            finishing.notified().await;
            Ok::<_, ToolError>("done".to_owned())
        }
    });
    let member_model = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("work", &json!({}))
        } else {
            ScriptedResponse::text("Worked.")
        }
    }));
    let member = Agent::builder("worker", member_model).tool(work.shared()).build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Work."}))
        } else {
            ScriptedResponse::text("Done.")
        }
    }));
    let team = Team::builder("workers", coordinator)
        .mission_budget(BudgetLimit { max_tool_calls: Some(5), ..BudgetLimit::default() })
        .member(member)
        .build();
    let store = harness.store.clone();
    let (_runtime, session, turn) = super::start(&harness, team, "Go.").await;
    started.notified().await;

    // The member's tool call holds one tool call of the mission's budget.
    let mission = format!("mis_{}", turn.id());
    let reserved = store.budget(&mission, Timestamp::now()).await.unwrap().reserved;
    assert_eq!(reserved.tool_calls_used, 1, "{reserved:?}");
    // The lease is given back, and another process takes it.
    let lease = store.lease(session.id()).await.unwrap().expect("the running turn holds the lease");
    store.release_lease(session.id(), lease.token).await.unwrap();
    let reserved = store.budget(&mission, Timestamp::now()).await.unwrap().reserved;
    assert_eq!(reserved, agentry_types::BudgetUsage::default(), "the reservation ended with the give-back");
    let ttl = std::time::Duration::from_secs(60);
    let taken = store.acquire_lease(session.id(), "another-process", ttl, Timestamp::now()).await.unwrap();
    let reserved = store.budget(&mission, Timestamp::now()).await.unwrap().reserved;
    assert_eq!(reserved, agentry_types::BudgetUsage::default(), "and stays ended under the new lease");

    // The turn, fenced out, stops and leaves the stored turn running for the new holder.
    finish.notify_one();
    let state = turn.wait().await.unwrap();
    assert!(matches!(state, agentry_types::TurnState::Running), "{state:?}");
    assert_eq!(store.lease(session.id()).await.unwrap().map(|lease| lease.token), Some(taken.token));
}
