//! Spawning instances under a spawn policy: each refusal has its seed 001 code, and gated
//! spawns wait for a decision.

use agentry_memory::conformance::Harness;
use std::collections::HashMap;
use std::sync::Arc;

use crate::{SpawnApprovals, SpawnCatalog, SpawnPolicy, Team};
use agentry_events::{EventEnvelope, EventPayload};
use agentry_model::{Model, ModelRequest, ScriptedModel, ScriptedResponse, ScriptedToolCall};
use agentry_runner::{Runtime, TurnRequest};
use futures_util::StreamExt;

use super::tool_results;
use serde_json::{Value, json};

const POLICY: &str = r#"
coordinator_role = "lead"

[roles.lead]
can_spawn = ["worker", "auditor", "broken"]

[roles.worker]
require_justification = true
max_instances = 1
budget = { max_tokens = 8000 }
[roles.worker.templates.default]
instructions = "You work."
model = "small"

[roles.auditor]
require_approval = true
[roles.auditor.templates.default]
instructions = "You audit."
model = "small"

[roles.intruder]
[roles.intruder.templates.default]
instructions = "You should not exist."

[roles.broken]
require_approval = true
approval_timeout_secs = 1
[roles.broken.templates.default]
instructions = "You cannot be made."
model = "missing"
"#;

/// A coordinator that makes the given `spawn_agent` calls, one model message each, then
/// answers with every result joined.
fn coordinator(calls: Vec<Value>) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::responder(move |request| {
        let results = tool_results(request);
        match calls.get(results.len()) {
            Some(arguments) => ScriptedResponse {
                tool_calls: vec![ScriptedToolCall {
                    id: Some(format!("spawn_{}", results.len())),
                    name: "spawn_agent".to_owned(),
                    arguments: arguments.to_string(),
                }],
                ..ScriptedResponse::default()
            },
            None => ScriptedResponse::text(results.join(" | ")),
        }
    }))
}

fn small_model() -> Arc<dyn Model> {
    Arc::new(ScriptedModel::responder(|request: &ModelRequest| {
        ScriptedResponse::text(format!("worked on: {}", request.last_user_text().unwrap_or_default()))
    }))
}

async fn run(
    harness: &Harness,
    policy: Option<SpawnPolicy>,
    approvals: SpawnApprovals,
    calls: Vec<Value>,
) -> (Vec<Arc<EventEnvelope>>, String) {
    let catalog =
        SpawnCatalog { models: HashMap::from([("small".to_owned(), small_model())]), tools: Vec::new() };
    let team = Team::builder("org", coordinator(calls))
        .spawn_policy(policy)
        .catalog(catalog)
        .approvals(approvals)
        .build();
    let (_runtime, _session, turn) = super::start(harness, team, "Staff the project.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let answer = match turn.wait().await.unwrap() {
        agentry_types::TurnState::Done { output, .. } => output.unwrap().message.content.unwrap_or_default(),
        other => panic!("{other:?}"),
    };
    (events, answer)
}

/// The spawn lifecycle as (event kind, code or role).
fn lifecycle(events: &[Arc<EventEnvelope>]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::SpawnRequested { requested_role, .. } => {
                Some(("requested".to_owned(), requested_role.clone()))
            }
            EventPayload::SpawnDenied { code, .. } => Some(("denied".to_owned(), code.clone())),
            EventPayload::SpawnApproved { requested_role, .. } => {
                Some(("approved".to_owned(), requested_role.clone()))
            }
            EventPayload::InstanceStarted { role, .. } => Some(("started".to_owned(), role.clone())),
            EventPayload::InstanceCompleted { .. } => Some(("completed".to_owned(), String::new())),
            _ => None,
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected.iter().map(|(kind, detail)| ((*kind).to_owned(), (*detail).to_owned())).collect()
}

/// Scenario.
pub async fn without_a_policy_every_spawn_is_denied_as_spawn_policy_missing(harness: Harness) {
    let dir = std::env::temp_dir().join(format!("agentry-no-policy-{}", agentry_types::EventId::new()));
    assert_eq!(SpawnPolicy::load(dir.join("spawn.toml")).unwrap(), None, "a missing file is no policy");
    let (events, answer) =
        run(&harness, None, SpawnApprovals::new(), vec![json!({"role": "worker", "task": "Work."})]).await;
    assert_eq!(lifecycle(&events), pairs(&[("requested", "worker"), ("denied", "spawn_policy_missing")]));
    assert!(answer.contains("spawn_policy_missing"), "{answer}");
    let denied = events.iter().find(|event| event.payload.kind() == "agent_team.spawn.denied").unwrap();
    assert!(
        denied
            .team
            .as_ref()
            .and_then(|team| team.mission_id.as_deref())
            .is_some_and(|id| id.starts_with("mis_"))
    );
}

/// Scenario.
pub async fn each_refusal_of_the_policy_has_its_own_code(harness: Harness) {
    let policy = SpawnPolicy::parse(POLICY).unwrap();
    let cases = [
        (json!({"role": "intruder", "task": "Sneak."}), "spawn_not_allowed"),
        (json!({"role": "worker", "task": "Work."}), "justification_required"),
        (json!({"role": "ghost", "task": "Haunt."}), "unknown_role"),
        (
            json!({"role": "worker", "task": "Work.", "justification": "x", "template": "nope"}),
            "template_missing",
        ),
        (
            json!({"role": "worker", "task": "Work.", "justification": "x", "budget_override": {"max_tokens": 9000}}),
            "budget_override_too_large",
        ),
        // Refused before anyone is asked to approve it: never approved, then denied.
        (json!({"role": "broken", "task": "Break."}), "invalid_template"),
    ];
    for (arguments, code) in cases {
        let (events, _) =
            run(&harness, Some(policy.clone()), SpawnApprovals::new(), vec![arguments.clone()]).await;
        let role = arguments["role"].as_str().unwrap();
        assert_eq!(lifecycle(&events), pairs(&[("requested", role), ("denied", code)]), "{arguments}");
    }
}

/// A worker spawned and finished, then a second one refused at the role's limit of one.
const ONE_WORKER_THEN_THE_LIMIT: &[(&str, &str)] = &[
    ("requested", "worker"),
    ("approved", "worker"),
    ("started", "worker"),
    ("completed", ""),
    ("requested", "worker"),
    ("denied", "instance_limit_reached"),
];

/// Scenario.
pub async fn a_granted_spawn_starts_an_instance_and_the_second_beyond_the_limit_is_denied(harness: Harness) {
    let policy = SpawnPolicy::parse(POLICY).unwrap();
    let spawn = json!({"role": "worker", "task": "Write the plan.", "justification": "Needs doing."});
    let (events, answer) =
        run(&harness, Some(policy), SpawnApprovals::new(), vec![spawn.clone(), spawn]).await;
    assert_eq!(lifecycle(&events), pairs(ONE_WORKER_THEN_THE_LIMIT));
    assert!(answer.starts_with("worked on: Write the plan."), "{answer}");
    let started = events.iter().find_map(|event| match &event.payload {
        EventPayload::InstanceStarted { budget_limit, .. } => Some(*budget_limit),
        _ => None,
    });
    assert_eq!(started.and_then(|limit| limit.max_tokens), Some(8000), "the role's default budget");
    let skill_hash = events.iter().find_map(|event| match &event.payload {
        EventPayload::InstanceStarted { skill_hash, .. } => skill_hash.clone(),
        _ => None,
    });
    let skill_hash = skill_hash.expect("instance.started carries the skill hash");
    // The spawn names the model message whose call asked for it (seed 001's messageID).
    let asking =
        events.iter().find(|event| event.payload.kind() == "model.message").unwrap().event_id.to_string();
    let requested = events.iter().find(|event| event.payload.kind() == "agent_team.spawn.requested").unwrap();
    assert_eq!(requested.team.as_ref().and_then(|team| team.message_id.clone()), Some(asking.clone()));
    let frame = serde_json::to_value(agentry_events::render::agent_team::render(requested).unwrap()).unwrap();
    assert_eq!(frame["properties"]["messageID"], asking.as_str());
    assert!(skill_hash.starts_with("sha256:") && skill_hash.len() == 7 + 64, "{skill_hash}");
    // The instance is named by the random end of its id, not its timestamp start.
    let started = events.iter().find(|event| event.payload.kind() == "agent_team.instance.started").unwrap();
    let instance = started.team.as_ref().and_then(|team| team.instance_id.clone()).unwrap();
    let name = events.iter().find_map(|event| match &event.payload {
        EventPayload::ThreadCreated { agent, .. } => Some(agent.name.clone()),
        _ => None,
    });
    assert_eq!(name, Some(format!("worker-{}", &instance[instance.len() - 8..])));
    // The approval names the instance it starts.
    let approved = events.iter().find(|event| event.payload.kind() == "agent_team.spawn.approved").unwrap();
    assert_eq!(approved.team.as_ref().and_then(|team| team.instance_id.as_deref()), Some(instance.as_str()));
}

/// Scenario: a gated spawn no one decides within its role's `approval_timeout_secs` is
/// denied, its approval withdrawn, and the turn goes on to its answer.
pub async fn an_undecided_gated_spawn_is_denied_when_its_wait_ends(harness: Harness) {
    let policy = SpawnPolicy::parse(&POLICY.replace(
        "[roles.auditor]\nrequire_approval = true\n",
        "[roles.auditor]\nrequire_approval = true\napproval_timeout_secs = 1\n",
    ))
    .unwrap();
    assert_eq!(policy.roles["auditor"].approval_timeout_secs, Some(1));
    let approvals = SpawnApprovals::new();
    let audit = json!({"role": "auditor", "task": "Audit the books."});
    let (events, answer) = run(&harness, Some(policy), approvals.clone(), vec![audit]).await;
    assert_eq!(lifecycle(&events), pairs(&[("requested", "auditor"), ("denied", "approval_denied")]));
    assert!(answer.contains("no one decided the spawn within 1 s"), "{answer}");
    assert!(approvals.pending().is_empty(), "the approval was withdrawn");
    let zero = POLICY.replace(
        "[roles.auditor]\nrequire_approval = true\n",
        "[roles.auditor]\napproval_timeout_secs = 0\n",
    );
    assert!(
        SpawnPolicy::parse(&zero)
            .unwrap_err()
            .to_string()
            .contains("approval_timeout_secs must be at least 1")
    );
}

/// Scenario.
pub async fn a_gated_spawn_waits_for_approval_and_is_approved_once_and_denied_once(harness: Harness) {
    let policy = SpawnPolicy::parse(POLICY).unwrap();
    let approvals = SpawnApprovals::new();
    let audit = json!({"role": "auditor", "task": "Audit the books."});
    let decider = {
        let approvals = approvals.clone();
        tokio::spawn(async move {
            let first = approvals.wait_for_pending().await;
            assert_eq!(first.len(), 1);
            assert_eq!(first[0].role, "auditor");
            assert!(approvals.approve(&first[0].approval_id));
            assert!(!approvals.approve(&first[0].approval_id), "a decision is taken once");
        })
    };
    let (events, answer) = run(&harness, Some(policy.clone()), approvals.clone(), vec![audit.clone()]).await;
    decider.await.unwrap();
    assert_eq!(
        lifecycle(&events),
        pairs(&[
            ("requested", "auditor"),
            ("approved", "auditor"),
            ("started", "auditor"),
            ("completed", "")
        ])
    );
    let approval_id = events.iter().find_map(|event| match &event.payload {
        EventPayload::SpawnApproved { approval_id, .. } => approval_id.clone(),
        _ => None,
    });
    assert!(approval_id.is_some_and(|id| id.starts_with("appr_")));
    assert!(answer.contains("Audit the books."), "{answer}");

    let decider = {
        let approvals = approvals.clone();
        tokio::spawn(async move {
            let pending = approvals.wait_for_pending().await;
            assert!(approvals.deny(&pending[0].approval_id, "not this quarter"));
        })
    };
    let (events, answer) = run(&harness, Some(policy), approvals, vec![audit]).await;
    decider.await.unwrap();
    assert_eq!(lifecycle(&events), pairs(&[("requested", "auditor"), ("denied", "approval_denied")]));
    assert!(answer.contains("not this quarter"), "{answer}");
}

/// Scenario.
pub async fn an_invalid_policy_is_refused_with_the_problem_named(_harness: Harness) {
    let unknown_key = SpawnPolicy::parse("[roles.worker]\nmax_instancez = 3\n").unwrap_err();
    assert!(unknown_key.to_string().contains("max_instancez"), "{unknown_key}");
    let dangling = SpawnPolicy::parse("[roles.lead]\ncan_spawn = [\"ghost\"]\n").unwrap_err();
    assert!(dangling.to_string().contains("ghost"), "{dangling}");
    let typo =
        SpawnPolicy::parse(&POLICY.replace("coordinator_role = \"lead\"", "coordinator_role = \"leader\""));
    let typo = typo.unwrap_err().to_string();
    assert!(typo.contains("\"leader\" is not defined") && typo.contains("lead, worker"), "{typo}");
    for (from, to, named) in [
        ("max_instances = 1", "max_depth = 0", "role \"worker\": max_depth must be at least 1"),
        ("max_tokens = 8000", "max_tokens = 0", "role \"worker\": budget max_tokens must be at least 1"),
        ("max_tokens = 8000", "max_cost_usd = -1.0", "budget max_cost_usd must be a finite amount"),
        (
            "[roles.lead]",
            "[mission]\nmax_steps = 0\n[roles.lead]",
            "mission: budget max_steps must be at least 1",
        ),
    ] {
        assert!(POLICY.contains(from), "{from}");
        let error = SpawnPolicy::parse(&POLICY.replacen(from, to, 1)).unwrap_err().to_string();
        assert!(error.contains(named), "{to}: {error}");
    }
    // Zero tool calls is a real limit, zero instances switches a role off, the coordinator's
    // role (never spawned) may have any limits, and roles that only set members' budgets
    // need no coordinator role.
    assert!(SpawnPolicy::parse(&POLICY.replace("max_tokens = 8000", "max_tool_calls = 0")).is_ok());
    assert!(SpawnPolicy::parse(&POLICY.replace("max_instances = 1", "max_instances = 0")).is_ok());
    let root = POLICY.replace("[roles.lead]\n", "[roles.lead]\nmax_depth = 0\nbudget = { max_tokens = 0 }\n");
    assert!(SpawnPolicy::parse(&root).is_ok(), "{root}");
    assert!(SpawnPolicy::parse("[roles.member]\nbudget = { max_tokens = 10 }\n").is_ok());
}

/// Scenario.
pub async fn an_instance_may_spawn_in_turn_within_the_depth_limit(harness: Harness) {
    let policy = |worker_depth: u32| {
        SpawnPolicy::parse(&format!(
            r#"
coordinator_role = "lead"
[roles.lead]
can_spawn = ["manager"]
[roles.manager]
can_spawn = ["worker"]
max_depth = 1
[roles.manager.templates.default]
instructions = "You manage."
model = "manager"
[roles.worker]
max_depth = {worker_depth}
[roles.worker.templates.default]
instructions = "You work."
model = "small"
"#
        ))
        .unwrap()
    };
    let manager: Arc<dyn Model> = Arc::new(ScriptedModel::responder(|request| {
        let results = tool_results(request);
        if results.is_empty() {
            ScriptedResponse::tool_call("spawn_agent", &json!({"role": "worker", "task": "Do the work."}))
        } else {
            ScriptedResponse::text(format!("manager: {}", results[0]))
        }
    }));
    for (depth, expected) in [(2, "approved"), (1, "depth_limit_reached")] {
        let catalog = SpawnCatalog {
            models: HashMap::from([
                ("small".to_owned(), small_model()),
                ("manager".to_owned(), manager.clone()),
            ]),
            tools: Vec::new(),
        };
        let team =
            Team::builder("org", coordinator(vec![json!({"role": "manager", "task": "Run the project."})]))
                .spawn_policy(Some(policy(depth)))
                .catalog(catalog)
                .build();
        let runtime = Runtime::new(harness.store.clone());
        runtime.register(team);
        let session = runtime.create_session("org", None).await.unwrap();
        let turn = session.create_turn(TurnRequest::message("Staff it.")).await.unwrap();
        let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
        let worker_spawn = events.iter().rev().find_map(|event| match &event.payload {
            EventPayload::SpawnApproved { requested_role, .. } if requested_role == "worker" => {
                Some(("approved".to_owned(), event.team.clone().unwrap_or_default()))
            }
            EventPayload::SpawnDenied { requested_role, code, .. } if requested_role == "worker" => {
                Some((code.clone(), event.team.clone().unwrap_or_default()))
            }
            _ => None,
        });
        let (outcome, team_context) = worker_spawn.expect("the manager asked for a worker");
        assert_eq!(outcome, expected, "worker max_depth {depth}");
        let manager_instance = events.iter().find_map(|event| match &event.payload {
            EventPayload::InstanceStarted { role, .. } if role == "manager" => {
                event.team.as_ref().and_then(|team| team.instance_id.clone())
            }
            _ => None,
        });
        assert_eq!(team_context.parent_instance_id, manager_instance, "the manager spawned it");
        if depth == 2 {
            let worker_parent = events.iter().find_map(|event| match &event.payload {
                EventPayload::InstanceStarted { role, .. } if role == "worker" => {
                    event.team.as_ref().and_then(|team| team.parent_instance_id.clone())
                }
                _ => None,
            });
            assert_eq!(worker_parent, manager_instance);
        }
    }
}

/// Scenario: a team nested in another counts its spawns apart: each may start its one
/// `worker`, though their roles share the name.
pub async fn a_nested_team_counts_its_own_spawns(harness: Harness) {
    let policy = || {
        SpawnPolicy::parse(
            r#"
coordinator_role = "lead"
[roles.lead]
can_spawn = ["worker"]
[roles.worker]
max_instances = 1
[roles.worker.templates.default]
instructions = "You work."
model = "small"
"#,
        )
        .unwrap()
    };
    let catalog =
        || SpawnCatalog { models: HashMap::from([("small".to_owned(), small_model())]), tools: Vec::new() };
    let inner_coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("spawn_agent", &json!({"role": "worker", "task": "Inner work."}))
        } else {
            ScriptedResponse::text("inner done")
        }
    }));
    let inner =
        Team::builder("inner", inner_coordinator).spawn_policy(Some(policy())).catalog(catalog()).build();
    let outer_coordinator = Arc::new(ScriptedModel::responder(|request| match tool_results(request).len() {
        0 => ScriptedResponse::tool_call("spawn_agent", &json!({"role": "worker", "task": "Outer work."})),
        1 => ScriptedResponse::tool_call(
            "delegate_task_to_member",
            &json!({"member_id": "inner", "task": "Do yours."}),
        ),
        _ => ScriptedResponse::text("outer done"),
    }));
    let outer = Team::builder("outer", outer_coordinator)
        .member(inner)
        .spawn_policy(Some(policy()))
        .catalog(catalog())
        .build();
    let (_runtime, _session, turn) = super::start(&harness, outer, "Go.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    let outcomes: Vec<String> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::SpawnApproved { .. } => Some("approved".to_owned()),
            EventPayload::SpawnDenied { code, .. } => Some(code.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, ["approved", "approved"], "one worker each");
}

/// Scenario: an instance spends no more than what is left to the instance that spawned
/// it (design §8a: a reservation covers the instance, its ancestors and its mission). A
/// manager allowed two tool calls, its spawn one of them, leaves its worker one, however
/// large the worker's own budget: the worker's second call is refused as its ancestor's.
pub async fn an_instance_spends_no_more_than_its_spawner_has_left(harness: Harness) {
    let policy = SpawnPolicy::parse(
        r#"
coordinator_role = "lead"
[roles.lead]
can_spawn = ["manager"]
[roles.manager]
can_spawn = ["worker"]
budget = { max_tool_calls = 2 }
[roles.manager.templates.default]
instructions = "You manage."
model = "manager"
[roles.worker]
budget = { max_tool_calls = 10 }
[roles.worker.templates.default]
instructions = "You work."
model = "worker"
tools = ["work"]
"#,
    )
    .unwrap();
    let manager: Arc<dyn Model> = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("spawn_agent", &json!({"role": "worker", "task": "Work."}))
        } else {
            ScriptedResponse::text("managed")
        }
    }));
    // The worker works until it is stopped.
    let worker: Arc<dyn Model> =
        Arc::new(ScriptedModel::responder(|_| ScriptedResponse::tool_call("work", &json!({}))));
    let works = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let work = {
        let works = works.clone();
        agentry_runner::FunctionTool::new("work", "Works.", move |_: serde_json::Map<String, Value>, _| {
            works.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<_, agentry_runner::ToolError>("more".to_owned()) }
        })
        .shared()
    };
    let catalog = SpawnCatalog {
        models: HashMap::from([("manager".to_owned(), manager), ("worker".to_owned(), worker)]),
        tools: vec![work],
    };
    let team = Team::builder("org", coordinator(vec![json!({"role": "manager", "task": "Run it."})]))
        .spawn_policy(Some(policy))
        .catalog(catalog)
        .build();
    let (_runtime, _session, turn) = super::start(&harness, team, "Staff it.").await;
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    assert_eq!(
        super::exhausted_by(&events),
        ["ancestor_max_tool_calls"],
        "the worker ran into its manager's budget"
    );
    assert_eq!(works.load(std::sync::atomic::Ordering::SeqCst), 1, "the one call the manager had left");
    let state = turn.wait().await.unwrap();
    assert!(matches!(state, agentry_types::TurnState::Done { .. }), "the team answered: {state:?}");
}

/// Scenario: an instance left running by a handed-over turn ends as failed when another
/// process resumes the turn (`agent_team.instance.failed`, then `thread.done`; its member
/// run an error), so nothing lists it as running for ever. The resumed turn cannot know
/// whether its spawn ran and asks whether to spawn again; the approval names the stored
/// model message that made the call.
pub async fn an_instance_left_by_a_handed_over_turn_ends_when_the_turn_resumes(harness: Harness) {
    use agentry_memory::{Order, PageRequest, ParentFilter, RunQuery};
    use agentry_types::{RequiredAction, RequiredActionRecord, TurnState};
    let (second, session, turn) = hand_over_a_running_instance(&harness).await;
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(agentry_runner::TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    let state = resumed[0].wait().await.unwrap();
    let TurnState::Done { required_actions, .. } = &state else { panic!("{state:?}") };
    let [RequiredActionRecord { action: RequiredAction::ToolApproval { tool_calls, .. }, .. }] =
        required_actions.as_slice()
    else {
        panic!("{required_actions:?}")
    };
    assert_eq!(tool_calls[0].name, "spawn_agent");
    let events = resumed[0].events(Order::Asc).await.unwrap();
    let calling = events.iter().find_map(|event| match &event.payload {
        EventPayload::ModelMessage(message)
            if message.tool_calls.iter().any(|call| call.id == tool_calls[0].id) =>
        {
            Some(event.event_id)
        }
        _ => None,
    });
    assert_eq!(
        Some(tool_calls[0].source_event_id),
        calling,
        "the approval names the message that made the call"
    );
    let started = events.iter().find(|event| event.payload.kind() == "agent_team.instance.started");
    let thread = started.expect("the instance started before the hand-over").thread_id.clone();
    let on_thread: Vec<&str> =
        events.iter().filter(|event| event.thread_id == thread).map(|event| event.payload.kind()).collect();
    assert_eq!(
        on_thread[on_thread.len() - 2..],
        ["agent_team.instance.failed", "thread.done"],
        "{on_thread:?}"
    );
    let members = RunQuery { parent: ParentFilter::Of(turn.id()), ..RunQuery::default() };
    let members =
        harness.store.list_runs(session.id(), &members, &PageRequest::first(10)).await.unwrap().items;
    assert_eq!(members.len(), 1);
    assert!(
        matches!(&members[0].state, TurnState::Error { message, .. } if message.starts_with("interrupted")),
        "{:?}",
        members[0].state
    );
}

/// A coordinator that spawns a worker, then stalls once it has the worker's answer (it
/// says when it is asked, and never replies): its process is stopped mid-turn there.
#[derive(Debug)]
struct SpawnThenStall(Arc<tokio::sync::Notify>);

#[async_trait::async_trait]
impl Model for SpawnThenStall {
    fn info(&self) -> agentry_model::ModelInfo {
        agentry_model::ModelInfo { id: "spawn-then-stall".to_owned(), provider: "test".to_owned() }
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<agentry_model::ModelStream, agentry_model::ModelError> {
        if tool_results(&request).is_empty() {
            return coordinator(vec![json!({"role": "worker", "task": "Work.", "justification": "needed"})])
                .stream(request)
                .await;
        }
        self.0.notify_one();
        Ok(Box::pin(futures_util::stream::pending()))
    }
}

/// Scenario: a mission's instance limit holds across a crash. A team turn started a
/// worker (its role's limit is one) in a process that stopped mid-turn; the process that
/// resumes the turn refuses a second worker (`instance_limit_reached`), counting the
/// instance the first process started.
pub async fn an_instance_limit_counts_the_instances_a_dead_process_started(harness: Harness) {
    let spawn = json!({"role": "worker", "task": "Work again.", "justification": "needed"});
    let team = |coordinator: Arc<dyn Model>| {
        let catalog =
            SpawnCatalog { models: HashMap::from([("small".to_owned(), small_model())]), tools: Vec::new() };
        Team::builder("org", coordinator)
            .spawn_policy(Some(SpawnPolicy::parse(POLICY).unwrap()))
            .catalog(catalog)
            .build()
    };
    let asked = Arc::new(tokio::sync::Notify::new());
    let (first, _session, turn) =
        super::start(&harness, team(Arc::new(SpawnThenStall(asked.clone()))), "Staff it.").await;
    asked.notified().await;
    assert_eq!(first.hand_over().await, 1);
    let second = Runtime::new(harness.store.clone());
    // The same coordinator, past its first spawn: it asks for another worker.
    second.register(team(coordinator(vec![json!({}), spawn])));
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(agentry_runner::TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    let state = resumed[0].wait().await.unwrap();
    assert!(matches!(state, agentry_types::TurnState::Done { .. }), "{state:?}");
    let events: Vec<Arc<EventEnvelope>> =
        resumed[0].events(agentry_memory::Order::Asc).await.unwrap().into_iter().map(Arc::new).collect();
    assert_eq!(lifecycle(&events), pairs(ONE_WORKER_THEN_THE_LIMIT));
    let denied = events.iter().find(|event| event.payload.kind() == "agent_team.spawn.denied").unwrap();
    let EventPayload::SpawnDenied { error, .. } = &denied.payload else { unreachable!() };
    assert!(error.contains("already has 1 instance(s)"), "{error}");
}

/// A team turn whose spawned instance runs when its process hands it over (as at a
/// shutdown), and another process ready to resume it; returns that process, the session
/// and the turn.
async fn hand_over_a_running_instance(
    harness: &Harness,
) -> (Runtime, agentry_runner::Session, agentry_runner::TurnHandle) {
    let team = |small: Arc<dyn Model>| {
        let catalog =
            SpawnCatalog { models: HashMap::from([("small".to_owned(), small)]), tools: Vec::new() };
        let spawn = json!({"role": "worker", "task": "Work.", "justification": "needed"});
        Team::builder("org", coordinator(vec![spawn]))
            .spawn_policy(Some(SpawnPolicy::parse(POLICY).unwrap()))
            .catalog(catalog)
            .build()
    };
    let asked = Arc::new(tokio::sync::Notify::new());
    let (first, session, turn) =
        super::start(harness, team(super::modes::Stalled::new(&asked, None)), "Staff the project.").await;
    asked.notified().await;
    assert_eq!(first.hand_over().await, 1);
    let second = Runtime::new(harness.store.clone());
    second.register(team(small_model()));
    (second, session, turn)
}

/// Scenario: a team turn cancelled while no process runs it (its process handed it over
/// with an instance running) ends cancelled when it is resumed, instead of asking whether
/// to spawn again for a mission already cancelled.
pub async fn a_team_turn_cancelled_while_no_process_runs_it_ends_cancelled_when_resumed(harness: Harness) {
    use agentry_types::{CancellationReason, TurnState};
    let (second, session, turn) = hand_over_a_running_instance(&harness).await;
    second.get_turn(turn.id()).await.unwrap().cancel().await.unwrap();
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.len(), 1);
    let state = resumed[0].wait().await.unwrap();
    assert!(
        matches!(state, TurnState::Cancelled { reason: CancellationReason::ClientCancelled, .. }),
        "{state:?}"
    );
    let next = second.get_session(session.id()).await.unwrap();
    assert!(next.create_turn(TurnRequest::message("Again.")).await.is_ok(), "the session goes on");
}

/// Scenario: a gated spawn waiting for a person when its process hands the turn over is
/// denied (`approval_denied`) when another process resumes the turn, so the request's
/// lifecycle on the feed closes; the call that asked gets the denial as its result (it had
/// no effect, so it is not put to a person as a call in doubt) and the turn goes on.
pub async fn a_spawn_waiting_for_approval_when_its_process_stops_is_denied_on_resume(harness: Harness) {
    use agentry_memory::Order;
    let team = |approvals: SpawnApprovals| {
        let catalog =
            SpawnCatalog { models: HashMap::from([("small".to_owned(), small_model())]), tools: Vec::new() };
        Team::builder("org", coordinator(vec![json!({"role": "auditor", "task": "Audit the books."})]))
            .spawn_policy(Some(SpawnPolicy::parse(POLICY).unwrap()))
            .catalog(catalog)
            .approvals(approvals)
            .build()
    };
    let approvals = SpawnApprovals::new();
    let (first, _session, turn) = super::start(&harness, team(approvals.clone()), "Audit.").await;
    assert_eq!(approvals.wait_for_pending().await.len(), 1);
    assert_eq!(first.hand_over().await, 1);
    let second = Runtime::new(harness.store.clone());
    second.register(team(SpawnApprovals::new()));
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(agentry_runner::TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    let state = resumed[0].wait().await.unwrap();
    let denial =
        "spawn denied (approval_denied): the process running the turn stopped before the spawn was decided";
    match &state {
        agentry_types::TurnState::Done { output: Some(output), required_actions, .. } => {
            assert!(required_actions.is_empty(), "nothing is put to a person: {required_actions:?}");
            assert_eq!(output.message.content.as_deref(), Some(denial), "the coordinator is told");
        }
        other => panic!("the turn goes on to its answer, asking no one: {other:?}"),
    }
    let events: Vec<Arc<EventEnvelope>> =
        resumed[0].events(Order::Asc).await.unwrap().into_iter().map(Arc::new).collect();
    assert_eq!(lifecycle(&events), pairs(&[("requested", "auditor"), ("denied", "approval_denied")]));
    let responses: Vec<_> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ToolResponse { tool_call_id, content, .. } => {
                Some((tool_call_id.as_str(), content.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(responses, [("spawn_0", denial)]);
    // The denial is the call's journaled result: another recovery would not ask again.
    let journal = harness.store.journal(turn.id()).await.unwrap();
    assert_eq!(journal.len(), 1, "{journal:?}");
    assert_eq!(
        journal[0].result.as_ref().map(|result| (result.content.as_str(), result.is_error)),
        Some((denial, true))
    );
}
