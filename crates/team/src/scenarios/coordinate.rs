//! Coordinate mode: the coordinator delegates to members on concurrent sub-agent threads.

use agentry_memory::conformance::Harness;
use std::collections::HashMap;
use std::sync::Arc;

use crate::Team;
use agentry_events::{EventEnvelope, EventPayload, ThreadOutcome};
use agentry_memory::{Order, PageRequest, ParentFilter, RunQuery};
use agentry_model::{ScriptedModel, ScriptedResponse, ScriptedToolCall};
use agentry_runner::{Agent, FunctionTool, Runtime, ToolError, TurnRequest};
use agentry_types::{Role, ThreadId, TurnState};
use futures_util::StreamExt;
use serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Nothing {}

/// A member whose tool waits at `barrier` (so both members must run at once), then answers
/// `answer`.
fn member(name: &str, answer: &'static str, barrier: Arc<tokio::sync::Barrier>) -> Agent {
    let meet = FunctionTool::new("meet", "Waits for the other member.", move |_: Nothing, _| {
        let barrier = barrier.clone();
        async move {
            barrier.wait().await;
            Ok::<_, ToolError>("met".to_owned())
        }
    });
    let model = Arc::new(ScriptedModel::responder(move |request| {
        match request.messages.last().map(|message| message.role) {
            Some(Role::Tool) => ScriptedResponse::text(answer),
            _ => ScriptedResponse::tool_call("meet", &json!({})),
        }
    }));
    Agent::builder(name, model).instructions(format!("You are the {name}.")).tool(meet.shared()).build()
}

fn coordinator() -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::responder(|request| {
        let results: Vec<String> = request
            .messages
            .iter()
            .filter(|message| message.role == Role::Tool)
            .map(|message| message.text())
            .collect();
        if results.is_empty() {
            let mut both = ScriptedResponse::text("Asking the team.");
            for (id, member, task) in [
                ("call_r", "researcher", "Find three facts about otters."),
                ("call_w", "writer", "Draft a title about otters."),
            ] {
                both.tool_calls.push(ScriptedToolCall {
                    id: Some(id.to_owned()),
                    name: "delegate_task_to_member".to_owned(),
                    arguments: json!({"member_id": member, "task": task}).to_string(),
                });
            }
            both
        } else {
            ScriptedResponse::text(format!("Team answer: {}", results.join(" + ")))
        }
    }))
}

/// Scenario.
pub async fn two_members_called_in_one_message_run_concurrently_on_their_own_threads(harness: Harness) {
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let team = Team::builder("demo-team", coordinator())
        .member(member("researcher", "Otters hold hands.", barrier.clone()))
        .member(member("writer", "Paws of the River", barrier))
        .build();
    let store = harness.store.clone();
    let runtime = Runtime::new(store.clone());
    runtime.register(team);
    let session = runtime.create_session("demo-team", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("Write about otters.")).await.unwrap();
    let events: Vec<Arc<EventEnvelope>> = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        let mut stream = turn.stream(None);
        let mut events = Vec::new();
        while let Some(event) = stream.next().await {
            events.push(event.unwrap());
        }
        events
    })
    .await
    .expect("the members met: they ran concurrently");

    // Each member thread opened and closed, with the coordinator's call as its parent.
    let mut threads: HashMap<ThreadId, (String, String, Option<String>)> = HashMap::new();
    for event in &events {
        match &event.payload {
            EventPayload::ThreadCreated { parent, agent, .. } => {
                assert_eq!(parent.thread_id, ThreadId::main());
                threads
                    .insert(event.thread_or_main(), (agent.name.clone(), parent.tool_call_id.clone(), None));
            }
            EventPayload::ThreadDone { outcome, .. } => {
                let ThreadOutcome::Done { output } = outcome else { panic!("a member failed: {outcome:?}") };
                threads.get_mut(&event.thread_or_main()).unwrap().2 = output.message.content.clone();
            }
            _ => {}
        }
    }
    let mut summary: Vec<(String, String, Option<String>)> = threads.values().cloned().collect();
    summary.sort();
    assert_eq!(
        summary,
        [
            ("researcher".to_owned(), "call_r".to_owned(), Some("Otters hold hands.".to_owned())),
            ("writer".to_owned(), "call_w".to_owned(), Some("Paws of the River".to_owned())),
        ]
    );
    // The two threads' events interleave: the second opened before the first closed.
    let position = |kind: &str, name: &str| {
        events.iter().position(|event| match &event.payload {
            EventPayload::ThreadCreated { agent, .. } => kind == "created" && agent.name == name,
            EventPayload::ThreadDone { title, .. } => kind == "done" && title.starts_with(name),
            _ => false,
        })
    };
    let (opened_r, opened_w) =
        (position("created", "researcher").unwrap(), position("created", "writer").unwrap());
    let (closed_r, closed_w) = (position("done", "researcher").unwrap(), position("done", "writer").unwrap());
    assert!(opened_r.max(opened_w) < closed_r.min(closed_w), "threads ran one after the other");
    // Sequence numbers stay dense over both threads.
    let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // The coordinator answered from both results.
    let state = turn.wait().await.unwrap();
    let TurnState::Done { output, .. } = state else { panic!("{state:?}") };
    assert_eq!(
        output.unwrap().message.content.as_deref(),
        Some("Team answer: Otters hold hands. + Paws of the River")
    );

    // Member runs are stored once each, with the turn as their parent.
    let query = RunQuery { parent: ParentFilter::Of(turn.id()), ..RunQuery::default() };
    let members = runtime.store().list_runs(session.id(), &query, &PageRequest::first(10)).await.unwrap();
    let mut agents: Vec<String> = members.items.iter().filter_map(|run| run.agent_id.clone()).collect();
    agents.sort();
    assert_eq!(agents, ["researcher", "writer"]);
    assert!(members.items.iter().all(|run| run.thread_id.is_some() && run.state.is_terminal()));
    // TeamRunOutput holds both member responses.
    let output = crate::team_run_output(runtime.store().as_ref(), turn.id()).await.unwrap();
    assert_eq!(output.content, Some(json!("Team answer: Otters hold hands. + Paws of the River")));
    assert_eq!(output.team_name.as_deref(), Some("demo-team"));
    let mut responses: Vec<(Option<String>, Option<serde_json::Value>)> = output
        .member_responses
        .iter()
        .map(|response| match response {
            agentry_types::agno::MemberResponse::Agent(run) => (run.agent_name.clone(), run.content.clone()),
            agentry_types::agno::MemberResponse::Team(team) => (team.team_name.clone(), team.content.clone()),
        })
        .collect();
    responses.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        responses,
        [
            (Some("researcher".to_owned()), Some(json!("Otters hold hands."))),
            (Some("writer".to_owned()), Some(json!("Paws of the River"))),
        ]
    );
    // The session's top-level turns are just the one.
    let turns = session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap();
    assert_eq!(turns.items.len(), 1);
}

/// Scenario.
pub async fn delegating_to_an_unknown_member_gives_the_coordinator_an_error_listing_the_members(
    harness: Harness,
) {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("delegate_task_to_member", &json!({"member_id": "nobody", "task": "x"})),
        ScriptedResponse::text("Sorry."),
    ]));
    let helper = Agent::builder("helper", Arc::new(ScriptedModel::new(vec![]))).build();
    let runtime = Runtime::new(harness.store.clone());
    runtime.register(Team::builder("t", model.clone()).member(helper).build());
    let session = runtime.create_session("t", None).await.unwrap();
    session.create_turn(TurnRequest::message("go")).await.unwrap().wait().await.unwrap();
    let result = model.requests()[1].messages.last().unwrap().text();
    assert!(result.contains("no team member is named \"nobody\""), "{result}");
    assert!(result.contains("helper"), "{result}");
}

/// Scenario: a member whose task and answer are each under the record limit but over it
/// together (its run holds both) still ends its thread: with a small error state and a
/// `thread.done` saying why, its answer kept in its events, and the turn goes on.
pub async fn a_member_end_too_large_to_keep_with_its_task_still_ends_its_thread(harness: Harness) {
    let task = "t".repeat(agentry_memory::MAX_RECORD_BYTES / 2 + 1024);
    let echo = Agent::builder(
        "echo",
        Arc::new(ScriptedModel::responder(|request| ScriptedResponse {
            chunk_chars: Some(1 << 20),
            ..ScriptedResponse::text(request.last_user_text().unwrap_or_default())
        })),
    )
    .build();
    let coordinator = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("delegate_task_to_member", &json!({"member_id": "echo", "task": task})),
        ScriptedResponse::text("Done."),
    ]));
    let team = Team::builder("big", coordinator.clone()).member(echo).build();
    let (_runtime, session, turn) = super::start(&harness, team, "go").await;
    let state = turn.wait().await.unwrap();
    let TurnState::Done { output: Some(output), .. } = &state else { panic!("{state:?}") };
    assert_eq!(output.message.content.as_deref(), Some("Done."));
    let events = turn.events(Order::Asc).await.unwrap();
    let ended = events.iter().find_map(|event| match &event.payload {
        EventPayload::ThreadDone { outcome: ThreadOutcome::Error { error, .. }, .. } => Some(error.clone()),
        _ => None,
    });
    assert!(
        ended.as_ref().is_some_and(|error| error.contains("too large to keep with its task")),
        "{ended:?}"
    );
    let members = RunQuery { parent: ParentFilter::Of(turn.id()), ..RunQuery::default() };
    let members =
        harness.store.list_runs(session.id(), &members, &PageRequest::first(10)).await.unwrap().items;
    assert!(matches!(&members[0].state, TurnState::Error { .. }), "{:?}", members[0].state);
    let seen = coordinator.requests()[1].messages.last().map(|message| message.text()).unwrap_or_default();
    assert!(seen.contains("too large to keep"), "the coordinator hears why: {seen}");
}

/// Scenario: a coordinating team without members is offered spawning only, and told so.
pub async fn a_team_without_members_is_offered_no_delegation(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Alone.")]));
    let runtime = Runtime::new(harness.store.clone());
    runtime.register(Team::builder("solo", model.clone()).build());
    let session = runtime.create_session("solo", None).await.unwrap();
    session.create_turn(TurnRequest::message("go")).await.unwrap().wait().await.unwrap();
    let request = &model.requests()[0];
    let offered: Vec<&str> = request.tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(offered, ["spawn_agent"]);
    let instructions = request.messages[0].text();
    assert!(instructions.contains("no standing members"), "{instructions}");
    assert!(!instructions.contains("delegate_task_to_member"), "{instructions}");
}

/// Scenario.
pub async fn delegating_to_every_member_collects_each_answer_and_a_failed_member_is_reported(
    harness: Harness,
) {
    let ok =
        Agent::builder("ok", Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("fine")))).build();
    let broken = Agent::builder(
        "broken",
        Arc::new(ScriptedModel::responder(|_| {
            ScriptedResponse::failing(agentry_model::ModelError::Http {
                status: 500,
                message: "down".to_owned(),
            })
        })),
    )
    .build();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "status?"})),
        ScriptedResponse::text("Summarized."),
    ]));
    let (_runtime, _session, turn) =
        super::start(&harness, Team::builder("all", model.clone()).member(ok).member(broken).build(), "go")
            .await;
    let mut errors = Vec::new();
    let mut stream = turn.stream(None);
    while let Some(event) = stream.next().await {
        if let EventPayload::ThreadDone { outcome: ThreadOutcome::Error { error, .. }, .. } =
            &event.unwrap().payload
        {
            errors.push(error.clone());
        }
    }
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("down"), "{errors:?}");
    let result = model.requests()[1].messages.last().unwrap().text();
    assert!(result.contains("ok: fine"), "{result}");
    assert!(result.contains("broken failed:"), "{result}");
}

/// A team `crew` of members `x` and `y`, whose coordinator asks both to report and then
/// answers `All reported.`, and a session of it.
async fn crew(harness: &Harness) -> (Runtime, agentry_runner::Session) {
    let member = |name: &'static str| {
        Agent::builder(
            name,
            Arc::new(ScriptedModel::responder(move |_| ScriptedResponse::text(format!("{name} ok")))),
        )
        .build()
    };
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        if super::tool_results(request).is_empty() {
            ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Report."}))
        } else {
            ScriptedResponse::text("All reported.")
        }
    }));
    let runtime = Runtime::new(harness.store.clone());
    runtime.register(Team::builder("crew", coordinator).member(member("x")).member(member("y")).build());
    let session = runtime.create_session("crew", None).await.unwrap();
    (runtime, session)
}

/// Scenario.
pub async fn a_team_turn_renders_in_the_harness_agent_team_and_agno_vocabularies(harness: Harness) {
    use agentry_events::render::{agent_team, agno, harness as wire};
    let (_runtime, session) = crew(&harness).await;
    let turn = session.create_turn(TurnRequest::message("Report, everyone.")).await.unwrap();
    let mut events = Vec::new();
    let mut stream = turn.stream(None);
    while let Some(event) = stream.next().await {
        events.push(event.unwrap());
    }

    // Harness: thread events carry their thread, the stream opens and closes the turn.
    let rendered: Vec<serde_json::Value> = events
        .iter()
        .filter_map(|event| wire::render(event))
        .map(|event| serde_json::to_value(event).unwrap())
        .collect();
    assert_eq!(rendered.first().unwrap()["type"], "turn.created");
    assert_eq!(rendered.last().unwrap()["type"], "turn.done");
    let threads: Vec<&serde_json::Value> =
        rendered.iter().filter(|event| event["type"] == "thread.created").collect();
    assert_eq!(threads.len(), 2);
    assert!(
        threads.iter().all(|event| event["thread_id"].is_string() && event["parent"]["thread_id"] == "main")
    );

    // Agent-team: instance events as {type, properties} with camelCase fields.
    let team_frames: Vec<serde_json::Value> = events
        .iter()
        .filter_map(|event| agent_team::render(event))
        .map(|event| serde_json::to_value(event).unwrap())
        .collect();
    let started: Vec<&serde_json::Value> =
        team_frames.iter().filter(|frame| frame["type"] == "agent_team.instance.started").collect();
    assert_eq!(started.len(), 2);
    for frame in started {
        let properties = &frame["properties"];
        assert!(properties["missionID"].as_str().unwrap().starts_with("mis_"), "{frame}");
        assert!(properties["instanceID"].as_str().unwrap().starts_with("ins_"), "{frame}");
        assert!(properties["timestampMs"].is_number(), "{frame}");
        assert_eq!(properties["sessionID"], session.id().to_string());
    }

    // Agno: TeamRunStarted first, TeamRunCompleted last with both member responses.
    let mut renderer = agno::AgnoRenderer::new(agno::AgnoContext {
        team_id: "crew".to_owned(),
        team_name: "crew".to_owned(),
        model: "scripted".to_owned(),
        model_provider: "scripted".to_owned(),
        workflow_id: None,
        workflow_run_id: None,
        step_id: None,
        step_name: None,
        step_index: None,
    });
    let agno_events: Vec<serde_json::Value> = events
        .iter()
        .filter_map(|event| renderer.render(event))
        .map(|event| serde_json::to_value(event).unwrap())
        .collect();
    assert_eq!(agno_events.first().unwrap()["event"], "TeamRunStarted");
    let completed = agno_events.last().unwrap();
    assert_eq!(completed["event"], "TeamRunCompleted");
    assert_eq!(completed["content"], "All reported.");
    let members = completed["member_responses"].as_array().unwrap();
    let mut contents: Vec<&str> = members.iter().map(|member| member["content"].as_str().unwrap()).collect();
    contents.sort_unstable();
    assert_eq!(contents, ["x ok", "y ok"]);
}

/// Scenario.
pub async fn a_team_session_is_read_through_the_team_session_view(harness: Harness) {
    let (_runtime, session) = crew(&harness).await;
    assert_eq!(session.record().session_type, agentry_types::SessionType::Team);
    let turn = session.create_turn(TurnRequest::message("Report, everyone.")).await.unwrap();
    turn.wait().await.unwrap();

    let view = agentry_memory::TeamSession::load(harness.store.clone(), session.id()).await.unwrap();
    assert_eq!(view.team_id.as_deref(), Some("crew"));
    let Some(agentry_types::agno::MemberResponse::Team(run)) =
        view.get_run(&turn.id().to_string()).await.unwrap()
    else {
        panic!("the team turn reads as a team run")
    };
    assert_eq!(run.team_id.as_deref(), Some("crew"));
    assert_eq!(run.content, Some(json!("All reported.")));
    assert_eq!(run.member_responses.len(), 2);
    let history = view.get_chat_history().await.unwrap();
    let texts: Vec<String> = history.iter().map(agentry_types::Message::text).collect();
    assert_eq!(texts.first().map(String::as_str), Some("Report, everyone."));
    assert_eq!(texts.last().map(String::as_str), Some("All reported."));
    let members_only = view
        .get_messages_from_last_n_runs(&agentry_memory::LastRunsQuery {
            agent_id: Some("x".to_owned()),
            ..agentry_memory::LastRunsQuery::default()
        })
        .await
        .unwrap();
    let member_texts: Vec<String> = members_only.iter().map(agentry_types::Message::text).collect();
    assert_eq!(member_texts, ["Report.", "x ok"]);
}

/// Scenario.
pub async fn a_member_whose_model_panics_leaves_no_run_running(harness: Harness) {
    let fragile = Agent::builder(
        "fragile",
        Arc::new(ScriptedModel::responder(|_| -> ScriptedResponse {
            panic!("the member's model panics on purpose")
        })),
    )
    .build();
    let model = Arc::new(ScriptedModel::responder(|request| {
        if request.messages.iter().any(|message| message.role == Role::Tool) {
            ScriptedResponse::text("Done.")
        } else {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "fragile", "task": "x"}),
            )
        }
    }));
    let (runtime, session, turn) =
        super::start(&harness, Team::builder("brittle", model).member(fragile).build(), "go").await;
    let state = tokio::time::timeout(std::time::Duration::from_secs(20), turn.wait())
        .await
        .expect("it ends")
        .unwrap();
    assert!(state.is_terminal(), "{state:?}");
    let all = RunQuery { parent: ParentFilter::Any, ..RunQuery::default() };
    let runs = harness.store.list_runs(session.id(), &all, &PageRequest::first(100)).await.unwrap();
    assert!(runs.items.len() >= 2, "the member's run was stored");
    for run in &runs.items {
        assert!(run.state.is_terminal(), "run {} ({:?}) is left {:?}", run.id, run.agent_id, run.state);
    }
    let next = session.create_turn(TurnRequest::message("again")).await.unwrap();
    assert!(tokio::time::timeout(std::time::Duration::from_secs(20), next.wait()).await.is_ok());
    drop(runtime);
}
