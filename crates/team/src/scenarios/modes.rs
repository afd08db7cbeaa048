//! Route, broadcast and tasks modes, and a team nested in a team, end to end.

use agentry_memory::conformance::Harness;
use std::sync::Arc;

use crate::{Team, TeamMode, team_run_output};
use agentry_events::{EventEnvelope, EventPayload};
use agentry_model::{ModelRequest, ScriptedModel, ScriptedResponse, ScriptedToolCall, ToolChoice};
use agentry_runner::{Agent, Runtime, TurnHandle, TurnRequest};
use agentry_types::TurnState;
use agentry_types::agno::MemberResponse;
use futures_util::StreamExt;

use super::tool_results;
use serde_json::json;

fn echoing(name: &'static str) -> Agent {
    let model = Arc::new(ScriptedModel::responder(move |request: &ModelRequest| {
        ScriptedResponse::text(format!("{name} says: {}", request.last_user_text().unwrap_or_default()))
    }));
    Agent::builder(name, model).build()
}

async fn run(
    harness: &Harness,
    team: Agent,
    message: &str,
) -> (Runtime, TurnHandle, Vec<Arc<EventEnvelope>>) {
    let runtime = Runtime::new(harness.store.clone());
    let name = team.name().to_owned();
    runtime.register(team);
    let session = runtime.create_session(&name, None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message(message)).await.unwrap();
    let mut stream = turn.stream(None);
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.unwrap());
    }
    (runtime, turn, events)
}

fn answer(state: &TurnState) -> Option<(String, String)> {
    match state {
        TurnState::Done { output, .. } => output
            .as_ref()
            .map(|output| (output.thread_id.to_string(), output.message.content.clone().unwrap_or_default())),
        _ => None,
    }
}

/// Scenario.
pub async fn route_mode_answers_with_the_chosen_members_own_message(harness: Harness) {
    let coordinator = Arc::new(ScriptedModel::new(vec![ScriptedResponse::tool_call(
        "route_to_member",
        &json!({"member_id": "billing", "task": "Why was I charged twice?"}),
    )]));
    let team = Team::builder("support", coordinator.clone())
        .mode(TeamMode::Route)
        .member(echoing("billing"))
        .member(echoing("tech"))
        .build();
    let (_runtime, turn, events) = run(&harness, team, "Why was I charged twice?").await;
    let state = turn.wait().await.unwrap();
    let (thread, text) = answer(&state).unwrap();
    assert_eq!(text, "billing says: Why was I charged twice?");
    assert_ne!(thread, "main", "the answer is the member's message, on its thread");
    assert_eq!(coordinator.calls(), 1, "the coordinator does not rewrite the member's answer");
    let created = events.iter().filter(|event| event.payload.kind() == "thread.created").count();
    assert_eq!(created, 1);
}

/// Scenario: a member that paused (for an approval) while another call of the same message
/// answered the user directly is not left waiting: the turn ends asking for nothing, and
/// the paused member's instance, thread and run end with it.
pub async fn a_member_paused_beside_a_direct_answer_ends_with_the_turn(harness: Harness) {
    let mut both =
        ScriptedResponse::tool_call("route_to_member", &json!({"member_id": "billing", "task": "Hi."}));
    both.tool_calls.push(ScriptedToolCall {
        id: None,
        name: "route_to_member".to_owned(),
        arguments: json!({"member_id": "clerk", "task": "File it."}).to_string(),
    });
    let coordinator = Arc::new(ScriptedModel::new(vec![both]));
    let team = Team::builder("support", coordinator)
        .mode(TeamMode::Route)
        .member(echoing("billing"))
        .member(super::gated_clerk())
        .build();
    let (_runtime, turn, events) = run(&harness, team, "Hello.").await;
    let state = turn.wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "billing says: Hi.");
    assert!(state.required_actions().is_empty(), "{state:?}");
    let on = |kind: &str| -> Vec<Option<String>> {
        events
            .iter()
            .filter(|event| event.payload.kind() == kind)
            .map(|event| event.thread_id.as_ref().map(ToString::to_string))
            .collect()
    };
    let started = on("agent_team.instance.started");
    assert_eq!(started.len(), 2, "{started:?}");
    let mut ended = on("agent_team.instance.completed");
    ended.extend(on("agent_team.instance.failed"));
    ended.extend(on("agent_team.instance.cancelled"));
    for thread in &started {
        assert!(ended.contains(thread), "the instance on {thread:?} ends: {ended:?}");
    }
    let done = on("thread.done");
    for thread in &started {
        assert!(done.contains(thread), "the thread {thread:?} is done: {done:?}");
    }
    let members = harness
        .store
        .list_runs(
            turn.record().session_id,
            &agentry_memory::RunQuery {
                parent: agentry_memory::ParentFilter::Of(turn.id()),
                ..Default::default()
            },
            &agentry_memory::PageRequest::first(10),
        )
        .await
        .unwrap();
    assert_eq!(members.items.len(), 2);
    for member in &members.items {
        assert!(member.state.is_terminal() && member.state.required_actions().is_empty(), "{member:?}");
    }
}

/// Scenario.
pub async fn broadcast_mode_gives_every_member_the_task_and_the_coordinator_synthesizes(harness: Harness) {
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        let results = tool_results(request);
        if results.is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Name a colour."}))
        } else {
            ScriptedResponse::text(format!("Synthesis of {} answers.", results[0].lines().count()))
        }
    }));
    let team = Team::builder("panel", coordinator.clone())
        .mode(TeamMode::Broadcast)
        .member(echoing("a"))
        .member(echoing("b"))
        .member(echoing("c"))
        .build();
    let (_runtime, turn, events) = run(&harness, team, "Name a colour.").await;
    let state = turn.wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "Synthesis of 3 answers.");
    let first = &coordinator.requests()[0];
    assert_eq!(first.tool_choice, Some(ToolChoice::Function("delegate_task_to_members".to_owned())));
    assert_eq!(first.tools.len(), 1, "broadcast offers only the broadcast");
    assert!(coordinator.requests()[1].tool_choice.is_none(), "only the first call is forced");
    let done = events.iter().filter(|event| event.payload.kind() == "thread.done").count();
    assert_eq!(done, 3);
}

/// Scenario: a broadcast whose member paused for an approval goes on after the approval
/// without broadcasting again: the coordinator's first call of the answering turn is not
/// forced (a provider obeys a forced choice, and would start every member over).
pub async fn a_broadcast_resumed_after_an_approval_is_not_forced_to_broadcast_again(harness: Harness) {
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Check it."}))
        } else {
            ScriptedResponse::text("Synthesised.")
        }
    }));
    let team = Team::builder("panel", coordinator.clone())
        .mode(TeamMode::Broadcast)
        .member(echoing("a"))
        .member(super::gated_clerk())
        .build();
    let (_runtime, session, first) = super::start(&harness, team, "Check it.").await;
    let state = first.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    let asked_before = coordinator.requests().len();
    let allow = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
    let second = session.create_turn(TurnRequest::input(vec![allow])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "Synthesised.");
    let requests = coordinator.requests();
    let resumed = &requests[asked_before..];
    assert_eq!(resumed.len(), 1, "one call after the broadcast's results");
    assert!(resumed[0].tool_choice.is_none(), "not forced again: {:?}", resumed[0].tool_choice);
}

/// Scenario.
pub async fn tasks_mode_creates_runs_in_parallel_and_completes_a_task_list(harness: Harness) {
    let call = |id: &str, name: &str, arguments: serde_json::Value| ScriptedToolCall {
        id: Some(id.to_owned()),
        name: name.to_owned(),
        arguments: arguments.to_string(),
    };
    let mut create_two = ScriptedResponse::text("Planning.");
    create_two.tool_calls = vec![
        call(
            "c1",
            "create_task",
            json!({"title": "Facts", "description": "List otter facts.", "assignee": "researcher"}),
        ),
        call(
            "c2",
            "create_task",
            json!({"title": "Title", "description": "Title an otter story.", "assignee": "writer"}),
        ),
    ];
    let run_both = ScriptedResponse {
        tool_calls: vec![call("r", "run_tasks", json!({"task_ids": ["task-1", "task-2"]}))],
        ..ScriptedResponse::default()
    };
    let coordinator = Arc::new(ScriptedModel::new(vec![
        create_two,
        run_both,
        ScriptedResponse::tool_call("list_tasks", &json!({})),
        ScriptedResponse::text("All tasks done."),
    ]));
    let team = Team::builder("studio", coordinator.clone())
        .mode(TeamMode::Tasks)
        .member(echoing("researcher"))
        .member(echoing("writer"))
        .build();
    let (runtime, turn, _events) = run(&harness, team, "Write about otters.").await;
    let state = turn.wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "All tasks done.");
    let requests = coordinator.requests();
    let ran = tool_results(&requests[2]).last().cloned().unwrap();
    // The two tasks were created by parallel calls: which got which id depends on which ran
    // first.
    assert!(ran.contains(": researcher says: List otter facts."), "{ran}");
    assert!(ran.contains(": writer says: Title an otter story."), "{ran}");
    assert!(ran.contains("task-1: ") && ran.contains("task-2: "), "{ran}");
    let listed: serde_json::Value = serde_json::from_str(tool_results(&requests[3]).last().unwrap()).unwrap();
    let statuses: Vec<&str> =
        listed.as_array().unwrap().iter().map(|task| task["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["done", "done"]);
    let output = team_run_output(runtime.store().as_ref(), turn.id()).await.unwrap();
    assert_eq!(output.member_responses.len(), 2);
}

/// Scenario.
pub async fn a_team_nested_in_a_team_nests_its_member_responses(harness: Harness) {
    let inner_coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "leaf", "task": "Say hi."}),
            )
        } else {
            ScriptedResponse::text("Inner done.")
        }
    }));
    let inner = Team::builder("inner", inner_coordinator).member(echoing("leaf")).build();
    let outer_coordinator = Arc::new(ScriptedModel::responder(|request| {
        if tool_results(request).is_empty() {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "inner", "task": "Greet."}),
            )
        } else {
            ScriptedResponse::text("Outer done.")
        }
    }));
    let outer = Team::builder("outer", outer_coordinator).member(inner).build();
    let (runtime, turn, events) = run(&harness, outer, "Go.").await;
    turn.wait().await.unwrap();
    // The leaf's thread was started by the inner coordinator's thread.
    let parents: Vec<bool> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ThreadCreated { parent, .. } => Some(parent.thread_id.is_main()),
            _ => None,
        })
        .collect();
    assert_eq!(parents, [true, false]);
    let output = team_run_output(runtime.store().as_ref(), turn.id()).await.unwrap();
    assert_eq!(output.content, Some(json!("Outer done.")));
    let [MemberResponse::Team(inner)] = output.member_responses.as_slice() else {
        panic!("{:?}", output.member_responses)
    };
    assert_eq!(inner.content, Some(json!("Inner done.")));
    let [MemberResponse::Agent(leaf)] = inner.member_responses.as_slice() else {
        panic!("{:?}", inner.member_responses)
    };
    assert_eq!(leaf.content, Some(json!("leaf says: Say hi.")));
}

/// Scenario.
pub async fn a_task_whose_member_pauses_resumes_next_turn_from_the_stored_task_list(harness: Harness) {
    let clerk = super::gated_clerk();
    let coordinator = Arc::new(ScriptedModel::responder(|request| match tool_results(request).len() {
        0 => ScriptedResponse::tool_call(
            "create_task",
            &json!({"title": "Report", "description": "File the report.", "assignee": "clerk"}),
        ),
        1 => ScriptedResponse::tool_call("run_task", &json!({"task_id": "task-1"})),
        _ => ScriptedResponse::text(format!("Done: {}", tool_results(request).last().unwrap())),
    }));
    let (_runtime, session, first) = super::start(
        &harness,
        Team::builder("desk", coordinator).mode(TeamMode::Tasks).member(clerk).build(),
        "File the report.",
    )
    .await;
    let state = first.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    let stored = harness.store.get_session(session.id()).await.unwrap().state["agentry.tasks.desk"].clone();
    assert_eq!(stored[0]["status"], "paused", "{stored}");

    let approve = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
    let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "Done: Report filed.");
    let stored = harness.store.get_session(session.id()).await.unwrap().state["agentry.tasks.desk"].clone();
    assert_eq!(stored[0]["status"], "done", "{stored}");
    assert_eq!(stored[0]["result"], "Report filed.");
}

/// Scenario: two tasks assigned to one member both pause for an approval; allowed, each
/// member thread goes on with its own task, and each task records its own result (the
/// threads are taken up by task, not in whatever order the calls come).
pub async fn two_paused_tasks_of_one_member_each_resume_with_their_own_task(harness: Harness) {
    let clerk_model = Arc::new(ScriptedModel::responder(|request| {
        let task = request.last_user_text().unwrap_or_default();
        match tool_results(request).first() {
            None => ScriptedResponse::tool_call("file_report", &json!({})),
            Some(_) => ScriptedResponse::text(format!("Filed: {task}")),
        }
    }));
    let clerk = {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        struct Nothing {}
        let file =
            agentry_runner::FunctionTool::new("file_report", "Files the report.", |_: Nothing, _| async {
                Ok::<_, agentry_runner::ToolError>("filed".to_owned())
            });
        Agent::builder("clerk", clerk_model).tool(file.shared()).requires_approval("file_report").build()
    };
    let coordinator = Arc::new(ScriptedModel::responder(|request| match tool_results(request).len() {
        0 => {
            let mut both = ScriptedResponse::text("Two tasks.");
            for (title, description) in [("North", "North report."), ("South", "South report.")] {
                both.tool_calls.push(ScriptedToolCall {
                    id: None,
                    name: "create_task".to_owned(),
                    arguments: json!({"title": title, "description": description, "assignee": "clerk"})
                        .to_string(),
                });
            }
            both
        }
        2 => ScriptedResponse::tool_call("run_tasks", &json!({"task_ids": ["task-1", "task-2"]})),
        _ => ScriptedResponse::text("Done."),
    }));
    let (_runtime, session, first) = super::start(
        &harness,
        Team::builder("desk", coordinator).mode(TeamMode::Tasks).member(clerk).build(),
        "File both reports.",
    )
    .await;
    let state = first.wait().await.unwrap();
    let answers: Vec<agentry_types::TurnInputItem> = state
        .required_actions()
        .iter()
        .map(|record| match &record.action {
            agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } => {
                agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone())
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(answers.len(), 2, "{state:?}");
    let second = session.create_turn(TurnRequest::input(answers)).await.unwrap();
    let state = second.wait().await.unwrap();
    assert!(state.required_actions().is_empty(), "{state:?}");
    let stored = harness.store.get_session(session.id()).await.unwrap().state["agentry.tasks.desk"].clone();
    let results: Vec<(String, String)> = stored
        .as_array()
        .unwrap()
        .iter()
        .map(|task| {
            (
                task["description"].as_str().unwrap().to_owned(),
                task["result"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("North report.".to_owned(), "Filed: North report.".to_owned()),
            ("South report.".to_owned(), "Filed: South report.".to_owned())
        ],
        "{stored}"
    );
}

/// A broadcast team `panel` (members `swift`, which answers at once, and `slow`) whose
/// process is handed over once swift answered while slow works; then a second process,
/// with `slow` as given, recovers the turn, which asks whether to run the broadcast again
/// (it may have run). Returns swift's model, that process's session, and the call to
/// allow.
async fn broadcast_in_doubt_after_a_crash(
    harness: &Harness,
    slow_next: Agent,
) -> (Arc<ScriptedModel>, agentry_runner::Session, agentry_types::TurnInputItem) {
    let swift = Arc::new(ScriptedModel::responder(|request| {
        ScriptedResponse::text(format!("swift says: {}", request.last_user_text().unwrap_or_default()))
    }));
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if this_turns_results(request).is_empty() && request.last_user_text().as_deref() == Some("Report.") {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Report."}))
        } else {
            ScriptedResponse::text(format!("Heard: {}", this_turns_results(request).join(" | ")))
        }
    }));
    let team = |slow: Agent| {
        Team::builder("panel", coordinator.clone())
            .mode(TeamMode::Broadcast)
            .member(Agent::builder("swift", swift.clone()).build())
            .member(slow)
            .build()
    };
    let asked = Arc::new(tokio::sync::Notify::new());
    let stalled = Agent::builder(slow_next.name(), Stalled::new(&asked, None)).build();
    let (first, session, turn) = super::start(harness, team(stalled), "Report.").await;
    // The process stops once swift has answered and slow works.
    let mut events = turn.stream(None);
    let mut swift_done = false;
    while !swift_done {
        let event = events.next().await.expect("the broadcast runs").unwrap();
        swift_done =
            matches!(&event.payload, EventPayload::ThreadDone { title, .. } if title.starts_with("swift"));
    }
    asked.notified().await;
    assert_eq!(first.hand_over().await, 1);
    let second = Runtime::new(harness.store.clone());
    second.register(team(slow_next));
    let resumed = second.recover().await.unwrap();
    let state = resumed[0].wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    assert!(thread_id.is_main() && tool_calls[0].may_have_run, "the broadcast is in doubt: {record:?}");
    let allow = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
    (swift, second.get_session(session.id()).await.unwrap(), allow)
}

/// Scenario: a broadcast whose process stops while one member still works and the other
/// has answered is put to a person (the call may have run); allowed, the member that had
/// answered gives its stored answer instead of running again, and only the interrupted
/// one starts afresh.
pub async fn a_broadcast_retried_after_a_crash_does_not_run_the_member_that_answered(harness: Harness) {
    use agentry_memory::Order;
    let late = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("slow says: late.")));
    let (swift, session, allow) =
        broadcast_in_doubt_after_a_crash(&harness, Agent::builder("slow", late).build()).await;
    let retry = session.create_turn(TurnRequest::input(vec![allow])).await.unwrap();
    let state = retry.wait().await.unwrap();
    let (_, answer) = answer(&state).unwrap();
    assert!(answer.contains("swift says: Report.") && answer.contains("slow says: late."), "{answer}");
    assert_eq!(swift.requests().len(), 1, "swift, which had answered, did not run again");
    let started: Vec<String> = retry
        .events(Order::Asc)
        .await
        .unwrap()
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ThreadCreated { title, .. } => Some(title.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(started.len(), 1, "only slow starts again: {started:?}");
    assert!(started[0].starts_with("slow"), "{started:?}");
}

/// Scenario: as above, and the member that starts afresh asks for an approval: the retry
/// pauses for it (on that member's thread) rather than dropping its request and asking to
/// run the broadcast again; allowed, the broadcast ends with both answers, swift's from
/// before the crash.
pub async fn a_retried_broadcast_whose_fresh_member_asks_pauses_for_it(harness: Harness) {
    let (swift, session, allow) = broadcast_in_doubt_after_a_crash(&harness, super::gated_clerk()).await;
    let retry = session.create_turn(TurnRequest::input(vec![allow])).await.unwrap();
    let state = retry.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolApproval { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    assert!(!thread_id.is_main(), "the clerk's own request, not the broadcast again: {record:?}");
    assert_eq!(tool_calls[0].name, "file_report");
    let allow = agentry_types::TurnInputItem::allow(thread_id.clone(), tool_calls[0].id.clone());
    let last = session.create_turn(TurnRequest::input(vec![allow])).await.unwrap();
    let state = last.wait().await.unwrap();
    let (_, answer) = answer(&state).unwrap();
    assert!(answer.contains("swift says: Report.") && answer.contains("Report filed."), "{answer}");
    assert_eq!(swift.requests().len(), 1, "swift, which had answered, did not run again");
}

/// A member model that answers nothing: it says when it is asked, then holds its reply
/// back until the request is dropped.
#[derive(Debug)]
pub(super) struct Stalled {
    asked: Arc<tokio::sync::Notify>,
    /// Holds back only tasks whose text has this word; answers the others once a task is
    /// held back.
    only_when: Option<&'static str>,
    held: Arc<tokio::sync::Semaphore>,
}

impl Stalled {
    pub(super) fn new(asked: &Arc<tokio::sync::Notify>, only_when: Option<&'static str>) -> Arc<Self> {
        Arc::new(Self { asked: asked.clone(), only_when, held: Arc::new(tokio::sync::Semaphore::new(0)) })
    }
}

#[async_trait::async_trait]
impl agentry_model::Model for Stalled {
    fn info(&self) -> agentry_model::ModelInfo {
        agentry_model::ModelInfo { id: "stalled".to_owned(), provider: "test".to_owned() }
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<agentry_model::ModelStream, agentry_model::ModelError> {
        let task = request.last_user_text().unwrap_or_default();
        if self.only_when.is_some_and(|word| !task.contains(word)) {
            let deltas = ScriptedResponse::text(format!("Done: {task}")).deltas(1, &request);
            let held = self.held.clone();
            let answer = futures_util::stream::once(async move {
                let _held = held.acquire().await;
                futures_util::stream::iter(deltas.into_iter().map(Ok))
            });
            return Ok(Box::pin(answer.flatten()));
        }
        self.held.add_permits(1);
        self.asked.notify_one();
        Ok(Box::pin(futures_util::stream::pending()))
    }
}

/// Scenario: a task list is saved under the turn's lease. A turn handed over while a task
/// runs stops here, and what its engine does on the way out (marking the cancelled task
/// failed) is not saved: the process that takes the turn over finds the list as it was.
pub async fn a_handed_over_turn_leaves_the_stored_task_list_to_its_next_holder(harness: Harness) {
    let asked = Arc::new(tokio::sync::Notify::new());
    let clerk = Agent::builder("clerk", Stalled::new(&asked, None)).build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| match tool_results(request).len() {
        0 => ScriptedResponse::tool_call(
            "create_task",
            &json!({"title": "Report", "description": "File the report.", "assignee": "clerk"}),
        ),
        1 => ScriptedResponse::tool_call("run_task", &json!({"task_id": "task-1"})),
        _ => ScriptedResponse::text("unreachable"),
    }));
    let team = Team::builder("desk", coordinator).mode(TeamMode::Tasks).member(clerk).build();
    let (runtime, session, turn) = super::start(&harness, team, "File the report.").await;
    asked.notified().await;
    let stored = || async {
        harness.store.get_session(session.id()).await.unwrap().state["agentry.tasks.desk"].clone()
    };
    assert_eq!(stored().await[0]["status"], "pending");

    assert_eq!(runtime.hand_over().await, 1);
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(30), turn.wait()).await;
    let state = stopped.expect("the handed-over engine stops while its member's model holds back").unwrap();
    assert!(matches!(state, TurnState::Running), "the handed-over turn ended here: {state:?}");
    // The cancelled task ended failed in this process's list, and its save was refused.
    let tasks = stored().await;
    assert_eq!(tasks[0]["status"], "pending", "{tasks}");
    assert!(tasks[0].get("result").is_none_or(serde_json::Value::is_null), "{tasks}");
}

/// A tasks-mode coordinator that adds one task named after the user's message, then
/// answers.
fn adding_coordinator() -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::responder(|request| match request.messages.last().map(|message| message.role) {
        Some(agentry_types::Role::Tool) => ScriptedResponse::text("Added."),
        _ => ScriptedResponse::tool_call(
            "create_task",
            &json!({
                "title": request.last_user_text().unwrap_or_default(),
                "description": "Do it.",
                "assignee": "clerk",
            }),
        ),
    }))
}

/// Scenario: two processes take turns on one session of a tasks-mode team; each turn
/// works from the list the turn before stored, whichever process ran it, not from a list
/// it kept from an earlier turn of its own.
pub async fn each_turn_works_from_the_stored_task_list_whichever_process_ran_the_last(harness: Harness) {
    let team =
        || Team::builder("desk", adding_coordinator()).mode(TeamMode::Tasks).member(echoing("clerk")).build();
    let (first, second) = (Runtime::new(harness.store.clone()), Runtime::new(harness.store.clone()));
    first.register(team());
    second.register(team());
    let session = first.create_session("desk", None).await.unwrap();
    for (runtime, title) in [(&first, "One"), (&second, "Two"), (&first, "Three")] {
        let here = runtime.get_session(session.id()).await.unwrap();
        let state = here.create_turn(TurnRequest::message(title)).await.unwrap().wait().await.unwrap();
        assert!(matches!(state, TurnState::Done { .. }), "{state:?}");
    }
    let stored = harness.store.get_session(session.id()).await.unwrap().state["agentry.tasks.desk"].clone();
    let listed: Vec<(String, String)> = stored
        .as_array()
        .unwrap()
        .iter()
        .map(|task| (task["id"].as_str().unwrap().to_owned(), task["title"].as_str().unwrap().to_owned()))
        .collect();
    let expected = [("task-1", "One"), ("task-2", "Two"), ("task-3", "Three")];
    assert_eq!(listed, expected.map(|(id, title)| (id.to_owned(), title.to_owned())), "{stored}");
}

/// The tool results a request carries after its last user message (this turn's).
fn this_turns_results(request: &ModelRequest) -> Vec<String> {
    let last_user = request.messages.iter().rposition(|message| message.role == agentry_types::Role::User);
    request.messages[last_user.map_or(0, |at| at + 1)..]
        .iter()
        .filter(|message| message.role == agentry_types::Role::Tool)
        .map(|message| message.text())
        .collect()
}

/// Scenario: a task left running by a turn that was handed over (one of two run at once:
/// the other's end was saved, with the list as it stood) runs again in another process:
/// a start there resumes the turn, which cannot know whether its `run_tasks` call ran and
/// asks to allow a retry; allowed, the task runs again (it is pending there, not running
/// for ever).
pub async fn a_task_left_running_by_a_handed_over_turn_runs_again_next_turn(harness: Harness) {
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        let results = this_turns_results(request);
        let task = |title: &str, description: &str| {
            ScriptedResponse::tool_call(
                "create_task",
                &json!({"title": title, "description": description, "assignee": "clerk"}),
            )
        };
        match (request.last_user_text().as_deref(), results.len()) {
            (Some("Plan."), 0) => task("One", "Be quick."),
            (Some("Plan."), 1) => task("Two", "Please stall."),
            (Some("Plan."), 2) => {
                ScriptedResponse::tool_call("run_tasks", &json!({"task_ids": ["task-1", "task-2"]}))
            }
            _ => ScriptedResponse::text(format!("Finished: {}", results.last().cloned().unwrap_or_default())),
        }
    }));
    let asked = Arc::new(tokio::sync::Notify::new());
    let clerk = Agent::builder("clerk", Stalled::new(&asked, Some("stall"))).build();
    let team = Team::builder("desk", coordinator.clone()).mode(TeamMode::Tasks).member(clerk).build();
    let (first, session, turn) = super::start(&harness, team, "Plan.").await;
    asked.notified().await;
    // The quick task's end is saved while the other still runs (a save writes the list as
    // it is): wait for it without sleeping.
    let stored = || async {
        harness.store.get_session(session.id()).await.unwrap().state["agentry.tasks.desk"].clone()
    };
    let waited = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while stored().await[0]["status"] != "done" {
            tokio::task::yield_now().await;
        }
    });
    waited.await.expect("the quick task's end is saved");
    assert_eq!(stored().await[1]["status"], "running");
    assert_eq!(first.hand_over().await, 1);
    let state = tokio::time::timeout(std::time::Duration::from_secs(30), turn.wait()).await.unwrap().unwrap();
    assert!(matches!(state, TurnState::Running), "{state:?}");

    // Another process: its clerk answers every task.
    let second = Runtime::new(harness.store.clone());
    second
        .register(Team::builder("desk", coordinator).mode(TeamMode::Tasks).member(echoing("clerk")).build());
    let again = second.get_session(session.id()).await.unwrap();
    let refused = again.create_turn(TurnRequest::message("Again.")).await;
    assert!(matches!(refused, Err(agentry_runner::RunnerError::TurnResumed { .. })), "{refused:?}");
    let resumed = second.get_turn(turn.id()).await.unwrap().wait().await.unwrap();
    let TurnState::Done { required_actions, .. } = &resumed else { panic!("{resumed:?}") };
    let in_doubt = match required_actions.as_slice() {
        [
            agentry_types::RequiredActionRecord {
                action: agentry_types::RequiredAction::ToolApproval { tool_calls, .. },
                ..
            },
        ] => tool_calls[0].clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(in_doubt.name, "run_tasks");
    let retry = vec![agentry_types::TurnInputItem::allow(agentry_types::ThreadId::main(), in_doubt.id)];
    let state = again.create_turn(TurnRequest::input(retry)).await.unwrap().wait().await.unwrap();
    let TurnState::Done { output: Some(output), .. } = &state else { panic!("{state:?}") };
    let answer = output.message.content.clone().unwrap_or_default();
    assert!(answer.contains("clerk says: Please stall."), "{answer}");
    let tasks = stored().await;
    assert_eq!(tasks[1]["status"], "done", "{tasks}");
}

/// A tasks-mode coordinator that makes one task of each request for `assignee`, runs it and
/// answers with its result, prefixed with `name`.
fn one_task_coordinator(name: &'static str, assignee: &'static str) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::responder(move |request| {
        let results = this_turns_results(request);
        let asked = request.last_user_text().unwrap_or_default();
        match results.as_slice() {
            [] => ScriptedResponse::tool_call(
                "create_task",
                &json!({"title": asked, "description": format!("Handle: {asked}"), "assignee": assignee}),
            ),
            [created] => ScriptedResponse::tool_call(
                "run_task",
                &json!({"task_id": created.trim_start_matches("created ")}),
            ),
            [.., result] => ScriptedResponse::text(format!("{name}: {result}")),
        }
    }))
}

/// The (id, title, assignee, status) of each task of a stored list.
fn tasks_of(list: &serde_json::Value) -> Vec<[String; 4]> {
    let field = |task: &serde_json::Value, name: &str| task[name].as_str().unwrap_or_default().to_owned();
    list.as_array()
        .map(|tasks| {
            tasks
                .iter()
                .map(|task| {
                    [field(task, "id"), field(task, "title"), field(task, "assignee"), field(task, "status")]
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Scenario: a tasks-mode team inside a tasks-mode team keeps a task list of its own, turn
/// after turn: neither list overwrites the other in the session's state.
pub async fn a_tasks_team_inside_a_tasks_team_keeps_its_own_task_list(harness: Harness) {
    let inner = Team::builder("inner", one_task_coordinator("Inner", "leaf"))
        .mode(TeamMode::Tasks)
        .member(echoing("leaf"))
        .build();
    let outer = Team::builder("outer", one_task_coordinator("Outer", "inner"))
        .mode(TeamMode::Tasks)
        .member(inner)
        .build();
    let (runtime, session, turn) = super::start(&harness, outer, "One").await;
    let state = turn.wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "Outer: Inner: leaf says: Handle: Handle: One");
    let state = session.create_turn(TurnRequest::message("Two")).await.unwrap().wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "Outer: Inner: leaf says: Handle: Handle: Two");
    let stored = runtime.store().get_session(session.id()).await.unwrap().state;
    let task = |id: &str, title: &str, assignee: &str| [id, title, assignee, "done"].map(str::to_owned);
    assert_eq!(
        tasks_of(&stored["agentry.tasks.outer"]),
        [task("task-1", "One", "inner"), task("task-2", "Two", "inner")],
        "{stored:?}"
    );
    assert_eq!(
        tasks_of(&stored["agentry.tasks.inner"]),
        [task("task-1", "Handle: One", "leaf"), task("task-2", "Handle: Two", "leaf")],
        "{stored:?}"
    );
}

/// Scenario: a task list stored under the key of earlier versions (`agentry.tasks`, one per
/// session) is the session's team's list; it is saved back under the team's own key.
pub async fn a_task_list_stored_under_the_earlier_key_is_read_by_the_sessions_team(harness: Harness) {
    let coordinator =
        Arc::new(ScriptedModel::responder(|request| match this_turns_results(request).as_slice() {
            [] => ScriptedResponse::tool_call("run_task", &json!({"task_id": "task-1"})),
            [.., result] => ScriptedResponse::text(format!("Ran: {result}")),
        }));
    let runtime = Runtime::new(harness.store.clone());
    runtime
        .register(Team::builder("desk", coordinator).mode(TeamMode::Tasks).member(echoing("clerk")).build());
    let session = runtime.create_session("desk", None).await.unwrap();
    let earlier = json!([{"id": "task-1", "title": "Old", "description": "Kept.", "assignee": "clerk", "status": "pending"}]);
    let update = agentry_memory::SessionUpdate {
        state: Some(serde_json::Map::from_iter([("agentry.tasks".to_owned(), earlier)])),
        ..agentry_memory::SessionUpdate::default()
    };
    harness.store.update_session(session.id(), &update).await.unwrap();
    let state = session.create_turn(TurnRequest::message("Go.")).await.unwrap().wait().await.unwrap();
    assert_eq!(answer(&state).unwrap().1, "Ran: clerk says: Kept.");
    let stored = harness.store.get_session(session.id()).await.unwrap().state;
    assert_eq!(
        tasks_of(&stored["agentry.tasks.desk"]),
        [["task-1", "Old", "clerk", "done"].map(str::to_owned)]
    );
}

/// A member model that asks the client `ask_user_question` first, then (once answered)
/// holds its reply back like [`Stalled`] until the request is dropped.
#[derive(Debug)]
struct AsksThenStalls {
    stalled: Arc<Stalled>,
}

#[async_trait::async_trait]
impl agentry_model::Model for AsksThenStalls {
    fn info(&self) -> agentry_model::ModelInfo {
        agentry_model::ModelInfo { id: "asks".to_owned(), provider: "test".to_owned() }
    }

    async fn stream(
        &self,
        request: ModelRequest,
    ) -> Result<agentry_model::ModelStream, agentry_model::ModelError> {
        if request.messages.iter().any(|message| message.role == agentry_types::Role::Tool) {
            return self.stalled.stream(request).await;
        }
        let question = json!({"questions": [{"question": "Which colour?", "options": [{"label": "red"}]}]});
        let deltas = ScriptedResponse::tool_call("ask_user_question", &question).deltas(1, &request);
        Ok(Box::pin(futures_util::stream::iter(deltas.into_iter().map(Ok))))
    }
}

/// Scenario: a member thread paused in one turn, resumed by the next and handed over mid-way
/// is not left running: the process that resumes the turn cannot know whether the
/// delegation finished and asks whether to run it again, and the member thread it will not
/// take up again ends (its run an error, `thread.done`).
pub async fn a_member_resumed_by_a_turn_that_is_handed_over_ends_with_it(harness: Harness) {
    use agentry_memory::{Order, PageRequest, ParentFilter, RunQuery};
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if this_turns_results(request).is_empty() && request.last_user_text().as_deref() == Some("Ask.") {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "asker", "task": "Ask."}),
            )
        } else {
            ScriptedResponse::text(format!("Heard: {}", this_turns_results(request).join(" | ")))
        }
    }));
    let asked = Arc::new(tokio::sync::Notify::new());
    let team = |member: Arc<dyn agentry_model::Model>| {
        Team::builder("desk", coordinator.clone())
            .member(Agent::builder("asker", member).ask_user_question().build())
            .build()
    };
    let first_member = Arc::new(AsksThenStalls { stalled: Stalled::new(&asked, None) });
    let (first, session, turn) = super::start(&harness, team(first_member), "Ask.").await;
    let state = turn.wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    let agentry_types::RequiredAction::ToolResponse { thread_id, tool_calls } = &record.action else {
        panic!("{record:?}")
    };
    let member_thread = thread_id.clone();
    let answer = agentry_types::TurnInputItem::respond(thread_id.clone(), tool_calls[0].id.clone(), "red");
    let answered = session.create_turn(TurnRequest::input(vec![answer])).await.unwrap();
    asked.notified().await;
    assert_eq!(first.hand_over().await, 1);

    let second = Runtime::new(harness.store.clone());
    second.register(team(Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Red it is.")))));
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [answered.id()]);
    let state = resumed[0].wait().await.unwrap();
    let [record] = state.required_actions() else { panic!("{state:?}") };
    assert!(
        matches!(&record.action, agentry_types::RequiredAction::ToolApproval { tool_calls, .. }
            if tool_calls[0].name == "delegate_task_to_member"),
        "{record:?}"
    );
    let events = resumed[0].events(Order::Asc).await.unwrap();
    let on_thread: Vec<(&str, Option<&str>)> = events
        .iter()
        .filter(|event| event.thread_id.as_ref() == Some(&member_thread))
        .map(|event| (event.payload.kind(), event.team.as_ref().and_then(|team| team.mission_id.as_deref())))
        .collect();
    // Its instance had started again in this turn's mission: it ends there, not listed as
    // running for ever.
    let mission = format!("mis_{}", answered.id());
    assert_eq!(
        on_thread[on_thread.len() - 2..],
        [("agent_team.instance.failed", Some(mission.as_str())), ("thread.done", None)],
        "the member thread ends with the turn that abandoned it: {on_thread:?}"
    );
    let members = RunQuery { parent: ParentFilter::Of(turn.id()), ..RunQuery::default() };
    let members =
        harness.store.list_runs(session.id(), &members, &PageRequest::first(10)).await.unwrap().items;
    assert!(
        matches!(&members[0].state, TurnState::Error { message, .. } if message.starts_with("interrupted")),
        "{:?}",
        members[0].state
    );
}
