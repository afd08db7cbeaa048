//! The runner's acceptance scenarios, end to end through the public API with scripted
//! models: one free async function per scenario taking a fresh store, and
//! [`runner_scenarios!`](crate::runner_scenarios) to expand them into one named test each,
//! so every store backend runs the same suite:
//!
//! ```text
//! agentry_runner::runner_scenarios!(|| async { Harness::new(Arc::new(InMemoryStore::new())) });
//! ```

// The suite asserts: a failing expectation is the result.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, clippy::too_many_lines)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{
    Agent, AgentLimits, EventStream, FunctionTool, RunnerError, Runtime, RuntimeOptions, Session, Tool,
    ToolContext, ToolError, TurnHandle, TurnRequest,
};
use agentry_events::{EventEnvelope, EventPayload};
use agentry_memory::conformance::Harness;
use agentry_memory::{Order, PageRequest, StoreError};
use agentry_model::{
    Model, ModelError, ModelInfo, ModelRequest, ModelStream, ScriptedModel, ScriptedResponse,
    ScriptedToolCall,
};
use agentry_types::{CancellationReason, Role, TurnInputItem, TurnState};
use futures_util::StreamExt;
use serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: i64,
    b: i64,
}

fn add_tool(calls: Arc<AtomicUsize>) -> Arc<dyn Tool> {
    FunctionTool::new("add", "Adds two integers.", move |args: AddArgs, _context| {
        let calls = calls.clone();
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ToolError>((args.a + args.b).to_string())
        }
    })
    .shared()
}

/// A model that streams `text` one character per delta, holding the last delta back until
/// the test opens its gate: the turn stays running until then.
#[derive(Debug)]
struct GatedModel {
    gate: Arc<tokio::sync::Semaphore>,
    text: &'static str,
}

impl GatedModel {
    fn new(text: &'static str) -> (Arc<Self>, Arc<tokio::sync::Semaphore>) {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        (Arc::new(Self { gate: gate.clone(), text }), gate)
    }
}

#[async_trait::async_trait]
impl Model for GatedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo { id: "gated".to_owned(), provider: "test".to_owned() }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let response = ScriptedResponse { chunk_chars: Some(1), ..ScriptedResponse::text(self.text) };
        let mut deltas = response.deltas(1, &request);
        let last = deltas.pop();
        let gate = self.gate.clone();
        let held = futures_util::stream::once(async move {
            let _permit = gate.acquire().await.map_err(|_| ModelError::Disconnected)?;
            last.ok_or(ModelError::Disconnected)
        });
        Ok(Box::pin(futures_util::stream::iter(deltas.into_iter().map(Ok)).chain(held)))
    }
}

fn runtime(harness: &Harness, agent: Agent) -> Runtime {
    let options = RuntimeOptions { live_retention: Duration::from_secs(600), ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(harness.store.clone(), options);
    runtime.register(agent);
    runtime
}

async fn collect(mut stream: EventStream) -> Vec<Arc<EventEnvelope>> {
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.expect("an event"));
    }
    events
}

fn kinds(events: &[Arc<EventEnvelope>]) -> Vec<&'static str> {
    events.iter().map(|event| event.payload.kind()).filter(|kind| *kind != "model.message.delta").collect()
}

/// Reads `stream` up to its first `model.message.delta`: the model is streaming.
async fn until_first_delta(stream: &mut EventStream) {
    until_kind(stream, "model.message.delta").await;
}

/// Reads `stream` up to its first event of `kind`.
async fn until_kind(stream: &mut EventStream, kind: &str) {
    while let Some(event) = stream.next().await {
        if event.unwrap().payload.kind() == kind {
            break;
        }
    }
}

fn answer_text(state: &TurnState) -> Option<String> {
    match state {
        TurnState::Done { output, .. } => output.as_ref().and_then(|output| output.message.content.clone()),
        _ => None,
    }
}

async fn session_for(runtime: &Runtime, agent: &str) -> Session {
    runtime.create_session(agent, Some("test")).await.expect("session")
}

/// Scenario.
pub async fn a_turn_with_a_tool_call_streams_dense_events_and_stores_the_durable_ones(harness: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("add", &json!({"a": 2, "b": 3})),
        ScriptedResponse::text("The sum is 5."),
    ]));
    let runtime =
        runtime(&harness, Agent::builder("math", model.clone()).tool(add_tool(calls.clone())).build());
    let session = session_for(&runtime, "math").await;
    let turn = session.create_turn(TurnRequest::message("What is 2 + 3?")).await.unwrap();
    let events = collect(turn.stream(None)).await;

    let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "live seq is dense from 1");
    assert_eq!(
        kinds(&events),
        [
            "turn.created",
            "model.message",
            "tool.call.started",
            "tool.response",
            "step.completed",
            "model.message",
            "step.completed",
            "turn.done"
        ]
    );
    assert!(events.iter().any(|event| event.payload.kind() == "model.message.delta"));
    let response = events.iter().find_map(|event| match &event.payload {
        EventPayload::ToolResponse { content, is_error, .. } => Some((content.clone(), *is_error)),
        _ => None,
    });
    assert_eq!(response, Some(("5".to_owned(), false)));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let state = turn.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("The sum is 5."));
    let stored = turn.events(Order::Asc).await.unwrap();
    assert!(stored.iter().all(|event| event.payload.kind() != "model.message.delta"));
    assert_eq!(stored.len(), 8);
    let descending = turn.events(Order::Desc).await.unwrap();
    assert_eq!(descending.first().map(|event| event.seq), stored.last().map(|event| event.seq));

    // The second model call saw the tool result after the call.
    let requests = model.requests();
    let second = &requests[1].messages;
    assert_eq!(second.last().map(|message| message.role), Some(Role::Tool));
    assert_eq!(second.last().map(|message| message.text()).as_deref(), Some("5"));
}

/// Scenario.
pub async fn a_second_turn_chains_on_the_first_and_sees_its_history(harness: Harness) {
    let model =
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Hi Ada."), ScriptedResponse::text("Ada.")]));
    let runtime = runtime(&harness, Agent::builder("chat", model.clone()).instructions("Be brief.").build());
    let session = session_for(&runtime, "chat").await;
    let first = session.create_turn(TurnRequest::message("I am Ada.")).await.unwrap();
    first.wait().await.unwrap();
    let second = session.create_turn(TurnRequest::message("Who am I?")).await.unwrap();
    second.wait().await.unwrap();
    assert_eq!(second.previous_turn_id(), Some(first.id()));
    let messages = &model.requests()[1].messages;
    let texts: Vec<(Role, String)> = messages.iter().map(|message| (message.role, message.text())).collect();
    assert_eq!(
        texts,
        [
            (Role::System, "Be brief.".to_owned()),
            (Role::User, "I am Ada.".to_owned()),
            (Role::Assistant, "Hi Ada.".to_owned()),
            (Role::User, "Who am I?".to_owned()),
        ]
    );
    // The first turn's messages are replayed from history; this turn's own are not (the
    // instructions are written for each turn).
    let replayed: Vec<bool> = messages.iter().map(|message| message.from_history).collect();
    assert_eq!(replayed, [false, true, true, false]);
    assert!(messages[1].to_message().from_history && !messages[3].to_message().from_history);
    let turns = session.list_turns(Order::Desc, &PageRequest::first(10)).await.unwrap();
    assert_eq!(turns.items.iter().map(TurnHandle::id).collect::<Vec<_>>(), [second.id(), first.id()]);
    // The session shows its latest activity: the second turn's end.
    let ended = harness.store.get_run(second.id()).await.unwrap();
    assert!(ended.updated_at > session.record().created_at);
    assert_eq!(harness.store.get_session(session.id()).await.unwrap().updated_at, ended.updated_at);
}

/// Scenario.
pub async fn invalid_tool_arguments_give_the_model_an_error_result_and_the_tool_does_not_run(
    harness: Harness,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("add", &json!({"a": "two", "b": 3})),
        ScriptedResponse::text("Sorry."),
    ]));
    let runtime =
        runtime(&harness, Agent::builder("math", model.clone()).tool(add_tool(calls.clone())).build());
    let session = session_for(&runtime, "math").await;
    let turn = session.create_turn(TurnRequest::message("Add")).await.unwrap();
    let events = collect(turn.stream(None)).await;
    let (content, is_error) = events
        .iter()
        .find_map(|event| match &event.payload {
            EventPayload::ToolResponse { content, is_error, .. } => Some((content.clone(), *is_error)),
            _ => None,
        })
        .unwrap();
    assert!(is_error);
    assert!(content.contains("/a"), "the error names the argument: {content}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(matches!(turn.wait().await.unwrap(), TurnState::Done { .. }));
}

/// Scenario.
pub async fn the_calls_of_one_model_message_run_concurrently(harness: Harness) {
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Wait {
        name: String,
    }
    let tool = FunctionTool::new("meet", "Waits for the other call.", move |args: Wait, _| {
        let barrier = barrier.clone();
        async move {
            // Both calls must be running at once to pass the barrier.
            barrier.wait().await;
            Ok::<_, ToolError>(format!("met {}", args.name))
        }
    });
    let mut both = ScriptedResponse::tool_call("meet", &json!({"name": "a"}));
    both.tool_calls.push(ScriptedToolCall {
        id: None,
        name: "meet".to_owned(),
        arguments: r#"{"name":"b"}"#.to_owned(),
    });
    let model = Arc::new(ScriptedModel::new(vec![both, ScriptedResponse::text("Both met.")]));
    let runtime = runtime(&harness, Agent::builder("pair", model).tool(tool.shared()).build());
    let session = session_for(&runtime, "pair").await;
    let turn = session.create_turn(TurnRequest::message("Meet")).await.unwrap();
    let state =
        tokio::time::timeout(Duration::from_secs(10), turn.wait()).await.expect("not deadlocked").unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Both met."));
}

/// Scenario.
pub async fn a_tool_needing_approval_pauses_the_turn_and_an_allow_runs_it_in_the_next_turn(harness: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 1})),
        ScriptedResponse::text("Done: 2."),
    ]));
    let agent =
        Agent::builder("gated", model.clone()).tool(add_tool(calls.clone())).requires_approval("add").build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "gated").await;
    let first = session.create_turn(TurnRequest::message("Add 1 and 1")).await.unwrap();
    let events = collect(first.stream(None)).await;
    assert_eq!(kinds(&events), ["turn.created", "model.message", "tool.approval_required", "turn.done"]);
    let state = first.wait().await.unwrap();
    let pending = state.required_actions().to_vec();
    assert_eq!(pending.len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing runs before the approval");

    let approve = TurnInputItem::allow(agentry_types::ThreadId::main(), "call_1_0");
    let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Done: 2."));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let last_request = model.requests().last().cloned().unwrap();
    assert_eq!(last_request.messages.last().map(|message| message.text()).as_deref(), Some("2"));
}

/// Scenario.
pub async fn a_denial_and_its_reason_reach_the_model(harness: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 1})),
        ScriptedResponse::text("Not added."),
    ]));
    let agent =
        Agent::builder("gated", model.clone()).tool(add_tool(calls.clone())).requires_approval("add").build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "gated").await;
    session.create_turn(TurnRequest::message("Add")).await.unwrap().wait().await.unwrap();
    let deny = TurnInputItem::ToolApproval(agentry_types::UserToolApproval {
        thread_id: agentry_types::ThreadId::main(),
        tool_call_id: "call_1_0".to_owned(),
        approval: agentry_types::ApprovalDecision::Deny { reason: Some("too risky".to_owned()) },
    });
    let second = session.create_turn(TurnRequest::input(vec![deny])).await.unwrap();
    second.wait().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let seen = model.requests().last().unwrap().messages.last().unwrap().text();
    assert!(seen.contains("too risky"), "{seen}");
}

/// Scenario.
pub async fn ask_user_question_pauses_for_the_client_and_its_answer_resumes_the_agent(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|request| {
        match request.messages.last().map(|message| message.role) {
            Some(Role::Tool) => {
                ScriptedResponse::text(format!("You chose {}.", request.messages.last().unwrap().text()))
            }
            _ => ScriptedResponse::tool_call(
                "ask_user_question",
                &json!({"question": "Tea or coffee?", "options": ["tea", "coffee"]}),
            ),
        }
    }));
    let runtime = runtime(&harness, Agent::builder("asker", model).ask_user_question().build());
    let session = session_for(&runtime, "asker").await;
    let first = session.create_turn(TurnRequest::message("ask me")).await.unwrap();
    let events = collect(first.stream(None)).await;
    assert!(kinds(&events).contains(&"tool.response_required"));
    let state = first.wait().await.unwrap();
    let call_id = match &state.required_actions()[0].action {
        agentry_types::RequiredAction::ToolResponse { tool_calls, .. } => tool_calls[0].id.clone(),
        other => panic!("unexpected {other:?}"),
    };
    let answer = TurnInputItem::ToolResponse(agentry_types::UserToolResponse {
        thread_id: agentry_types::ThreadId::main(),
        tool_call_id: call_id,
        content: "tea".to_owned(),
    });
    let second = session.create_turn(TurnRequest::input(vec![answer])).await.unwrap();
    assert_eq!(answer_text(&second.wait().await.unwrap()).as_deref(), Some("You chose tea."));
}

/// Scenario: a turn's own client-side tools (an AG-UI client's frontend tools) are offered
/// beside the agent's, a call of one ends the turn for the caller's result, and bad ones
/// are refused before anything is stored.
pub async fn a_turns_own_client_tools_are_offered_and_their_calls_wait_for_the_caller(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|request| match request.messages.last().map(|m| m.role) {
        Some(Role::Tool) => {
            ScriptedResponse::text(format!("It is {}.", request.messages.last().unwrap().text()))
        }
        _ => ScriptedResponse::tool_call("get_weather", &json!({"city": "Oslo"})),
    }));
    let runtime =
        runtime(&harness, Agent::builder("weather", model.clone()).tool(add_tool(Arc::default())).build());
    let session = session_for(&runtime, "weather").await;
    let weather = agentry_types::ToolSpec {
        name: "get_weather".to_owned(),
        description: Some("The weather in a city.".to_owned()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    };
    let spec = |name: &str, parameters: serde_json::Value| agentry_types::ToolSpec {
        name: name.to_owned(),
        description: None,
        parameters,
    };
    for (tools, problem) in [
        (vec![spec("add", json!({"type": "object"}))], "has the name of one of agent"),
        (vec![spec("get weather", json!({"type": "object"}))], "is not a tool name"),
        (vec![weather.clone(), weather.clone()], "is offered twice"),
        (vec![spec("x", json!("not a schema"))], "must be a JSON Schema object"),
    ] {
        let request = TurnRequest { client_tools: tools, ..TurnRequest::message("hi") };
        let error = session.create_turn(request).await.map(|turn| turn.id()).unwrap_err();
        assert!(
            matches!(&error, RunnerError::InvalidInput(message) if message.contains(problem)),
            "{error:?}"
        );
    }
    assert!(session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap().items.is_empty());

    let request =
        TurnRequest { client_tools: vec![weather.clone()], ..TurnRequest::message("Weather in Oslo?") };
    let first = session.create_turn(request).await.unwrap();
    let events = collect(first.stream(None)).await;
    let state = first.wait().await.unwrap();
    let call = match state.required_actions() {
        [record] => match &record.action {
            agentry_types::RequiredAction::ToolResponse { tool_calls, .. } => tool_calls[0].clone(),
            other => panic!("unexpected {other:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(call.name, "get_weather");
    assert!(kinds(&events).contains(&"tool.response_required"));
    let offered: Vec<String> = model.requests()[0].tools.iter().map(|tool| tool.name.clone()).collect();
    assert_eq!(offered, ["add", "get_weather"]);
    let client_side = events.iter().any(|event| match &event.payload {
        EventPayload::ModelMessageDelta(delta) => delta
            .tool_calls
            .iter()
            .any(|chunk| chunk.tool_info.as_ref().is_some_and(|info| info.is_client_side)),
        _ => false,
    });
    assert!(client_side, "the call is marked client-side");
    // The record keeps the turn's tools (a process recovering it offers them again).
    assert_eq!(harness.store.get_run(first.id()).await.unwrap().client_tools, [weather]);
    let answer = TurnInputItem::respond(agentry_types::ThreadId::main(), call.id, "sunny");
    let second = session.create_turn(TurnRequest::input(vec![answer])).await.unwrap();
    assert_eq!(answer_text(&second.wait().await.unwrap()).as_deref(), Some("It is sunny."));
}

/// Scenario.
pub async fn a_turns_client_context_is_shown_to_its_model_after_the_instructions_and_kept(harness: Harness) {
    let model =
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Page 2."), ScriptedResponse::text("Ok.")]));
    let runtime =
        runtime(&harness, Agent::builder("helper", model.clone()).instructions("Be brief.").build());
    let session = session_for(&runtime, "helper").await;
    let context = |description: &str, value: &str| agentry_types::ClientContext {
        description: description.to_owned(),
        value: value.to_owned(),
    };
    let nameless = TurnRequest { client_context: vec![context(" ", "x")], ..TurnRequest::message("hi") };
    let error = session.create_turn(nameless).await.map(|turn| turn.id()).unwrap_err();
    assert!(
        matches!(&error, RunnerError::InvalidInput(message) if message.contains("no description")),
        "{error:?}"
    );
    assert!(session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap().items.is_empty());
    assert_eq!(harness.store.lease(session.id()).await.unwrap(), None, "refused before the lease is taken");

    let given = vec![context("The page open", "Invoices, page 2"), context("Selected rows", "3")];
    let request = TurnRequest { client_context: given.clone(), ..TurnRequest::message("Where am I?") };
    let first = session.create_turn(request).await.unwrap();
    first.wait().await.unwrap();
    let system = model.requests()[0].messages[0].clone();
    assert_eq!(system.role, Role::System);
    assert_eq!(
        system.text(),
        "Be brief.\n\nContext from the user's application:\n- The page open: Invoices, page 2\n- Selected rows: 3"
    );
    // Kept with the turn (a process recovering it shows it again), and for that turn alone.
    assert_eq!(harness.store.get_run(first.id()).await.unwrap().client_context, given);
    session.create_turn(TurnRequest::message("And now?")).await.unwrap().wait().await.unwrap();
    assert_eq!(model.requests()[1].messages[0].text(), "Be brief.");
}

/// Scenario.
pub async fn input_that_breaks_the_rules_is_refused_and_stores_nothing(harness: Harness) {
    let model =
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 1}))]));
    let agent =
        Agent::builder("gated", model).tool(add_tool(Arc::default())).requires_approval("add").build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "gated").await;
    let main = agentry_types::ThreadId::main();

    let mixed = vec![TurnInputItem::message("hi"), TurnInputItem::allow(main.clone(), "x")];
    assert!(matches!(
        session.create_turn(TurnRequest::input(mixed)).await,
        Err(RunnerError::InvalidInput(_))
    ));
    let approval_without_pending = vec![TurnInputItem::allow(main.clone(), "x")];
    assert!(matches!(
        session.create_turn(TurnRequest::input(approval_without_pending)).await,
        Err(RunnerError::InvalidInput(_))
    ));
    assert!(matches!(
        session.create_turn(TurnRequest::input(vec![])).await,
        Err(RunnerError::InvalidInput(_))
    ));
    assert!(session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap().items.is_empty());

    session.create_turn(TurnRequest::message("Add")).await.unwrap().wait().await.unwrap();
    let cases = vec![
        vec![TurnInputItem::message("never mind")],
        vec![TurnInputItem::allow(main.clone(), "call_1_0"), TurnInputItem::allow(main.clone(), "call_1_0")],
        vec![TurnInputItem::allow(main.clone(), "other")],
        vec![TurnInputItem::allow(agentry_types::ThreadId::new_sub_thread(), "call_1_0")],
        vec![TurnInputItem::ToolResponse(agentry_types::UserToolResponse {
            thread_id: main.clone(),
            tool_call_id: "call_1_0".to_owned(),
            content: "2".to_owned(),
        })],
    ];
    for input in cases {
        let result = session.create_turn(TurnRequest::input(input.clone())).await;
        assert!(matches!(result, Err(RunnerError::InvalidInput(_))), "{input:?} gave {result:?}");
    }
    assert_eq!(session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap().items.len(), 1);
}

/// Scenario.
pub async fn of_fifty_concurrent_turns_on_one_session_exactly_one_runs(harness: Harness) {
    let (model, gate) = GatedModel::new("ok");
    let runtime = runtime(&harness, Agent::builder("busy", model).build());
    let session = session_for(&runtime, "busy").await;
    let attempts = (0..50).map(|index| {
        let session = session.clone();
        tokio::spawn(async move { session.create_turn(TurnRequest::message(format!("hi {index}"))).await })
    });
    let results = futures_util::future::join_all(attempts).await;
    let mut started = Vec::new();
    let mut refused = 0;
    for result in results {
        match result.unwrap() {
            Ok(turn) => started.push(turn),
            Err(RunnerError::TurnRunning { session_id }) => {
                assert_eq!(session_id, session.id());
                refused += 1;
            }
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    assert_eq!(started.len(), 1);
    assert_eq!(refused, 49);
    // While it runs, a request that would not fit the turn it names is refused as running
    // too (a caller may retry that), and stores nothing either.
    let unknown = TurnRequest {
        previous_turn_id: crate::PreviousTurn::Turn(agentry_types::TurnId::new()),
        ..TurnRequest::message("late")
    };
    let answer = TurnRequest {
        previous_turn_id: crate::PreviousTurn::Turn(started[0].id()),
        ..TurnRequest::input(vec![TurnInputItem::allow(agentry_types::ThreadId::main(), "no_such_call")])
    };
    for request in [unknown, answer] {
        let result = session.create_turn(request).await;
        assert!(matches!(result, Err(RunnerError::TurnRunning { .. })), "{result:?}");
    }
    // A request that breaks a rule whatever turn it follows is refused as invalid: a
    // caller told the session is busy would retry it for ever.
    let nameless = agentry_types::ClientContext { description: String::new(), value: "x".to_owned() };
    let broken = TurnRequest { client_context: vec![nameless], ..TurnRequest::message("late") };
    let result = session.create_turn(broken).await;
    assert!(matches!(result, Err(RunnerError::InvalidInput(_))), "{result:?}");
    gate.add_permits(1);
    started[0].wait().await.unwrap();
    let turns = session.list_turns(Order::Asc, &PageRequest::first(100)).await.unwrap();
    assert_eq!(turns.items.len(), 1, "refused turns store nothing");
}

/// Scenario: a turn request sent many times with one idempotency key (a client retrying)
/// runs once, whether the copies come while it runs or after it ended, and each copy is
/// told which turn has the key; a copy that would not fit the latest turn is told so too.
pub async fn a_turn_request_with_a_key_runs_once_however_often_it_is_sent(harness: Harness) {
    let (model, gate) = GatedModel::new("ok");
    let runtime = runtime(&harness, Agent::builder("keyed", model).build());
    let session = session_for(&runtime, "keyed").await;
    let keyed =
        |key: &str| TurnRequest { idempotency_key: Some(key.to_owned()), ..TurnRequest::message("hi") };
    let expected = crate::turn_id_for_key(session.id(), "run-1");
    let send = |request: TurnRequest| {
        let session = session.clone();
        tokio::spawn(async move { session.create_turn(request).await })
    };
    let results = futures_util::future::join_all((0..50).map(|_| send(keyed("run-1")))).await;
    let mut started = Vec::new();
    for result in results {
        match result.unwrap() {
            Ok(turn) => started.push(turn),
            Err(RunnerError::TurnRunning { .. }) => {}
            Err(RunnerError::TurnExists { turn_id, .. }) => assert_eq!(turn_id, expected),
            Err(other) => panic!("unexpected error {other}"),
        }
    }
    assert_eq!(started.iter().map(TurnHandle::id).collect::<Vec<_>>(), [expected]);
    // A copy sent while it runs is told the turn, not that the session is busy.
    let during = session.create_turn(keyed("run-1")).await;
    assert!(
        matches!(during, Err(RunnerError::TurnExists { turn_id, .. }) if turn_id == expected),
        "{during:?}"
    );
    gate.add_permits(1);
    started[0].wait().await.unwrap();
    // Sent again once it has ended: nothing runs again, and each copy is told the turn.
    let late = futures_util::future::join_all((0..10).map(|_| send(keyed("run-1")))).await;
    for result in late {
        let result = result.unwrap();
        assert!(
            matches!(result, Err(RunnerError::TurnExists { turn_id, .. }) if turn_id == expected),
            "{result:?}"
        );
    }
    // Also when its input no longer fits the latest turn (it answers no pending call).
    let answer = TurnRequest {
        idempotency_key: Some("run-1".to_owned()),
        ..TurnRequest::input(vec![TurnInputItem::allow(agentry_types::ThreadId::main(), "no_such_call")])
    };
    let result = session.create_turn(answer).await;
    assert!(
        matches!(result, Err(RunnerError::TurnExists { turn_id, .. }) if turn_id == expected),
        "{result:?}"
    );
    // Also by a process without the session's agent (a rolling deploy), and once the
    // session is cancelled.
    let stranger = Runtime::with_options(harness.store.clone(), RuntimeOptions::default());
    let result = stranger.get_session(session.id()).await.unwrap().create_turn(keyed("run-1")).await;
    assert!(
        matches!(result, Err(RunnerError::TurnExists { turn_id, .. }) if turn_id == expected),
        "{result:?}"
    );
    // Another key is another turn; the same key in another session is that session's own.
    gate.add_permits(2);
    let second = session.create_turn(keyed("run-2")).await.unwrap();
    assert_eq!(second.id(), crate::turn_id_for_key(session.id(), "run-2"));
    second.wait().await.unwrap();
    let other = session_for(&runtime, "keyed").await;
    let theirs = other.create_turn(keyed("run-1")).await.unwrap();
    assert_ne!(theirs.id(), expected);
    theirs.wait().await.unwrap();
    for (key, problem) in
        [(" ".to_owned(), "blank"), ("k".repeat(crate::MAX_IDEMPOTENCY_KEY + 1), "bytes long")]
    {
        let result = session.create_turn(keyed(&key)).await;
        assert!(
            matches!(&result, Err(RunnerError::InvalidInput(message)) if message.contains(problem)),
            "{result:?}"
        );
    }
    let turns = session.list_turns(Order::Asc, &PageRequest::first(100)).await.unwrap();
    assert_eq!(turns.items.iter().map(TurnHandle::id).collect::<Vec<_>>(), [expected, second.id()]);
    session.cancel().await.unwrap();
    let result = session.create_turn(keyed("run-2")).await;
    assert!(
        matches!(result, Err(RunnerError::TurnExists { turn_id, .. }) if turn_id == second.id()),
        "{result:?}"
    );
}

/// Scenario.
pub async fn cancelling_while_the_model_streams_ends_the_turn_cancelled_and_the_next_turn_sees_its_history(
    harness: Harness,
) {
    let slow = ScriptedResponse { chunk_chars: Some(1), ..ScriptedResponse::text("a very slow answer") }
        .delayed(Duration::from_millis(20));
    let model = Arc::new(ScriptedModel::new(vec![slow, ScriptedResponse::text("Fresh start.")]));
    let runtime = runtime(&harness, Agent::builder("slow", model.clone()).build());
    let session = session_for(&runtime, "slow").await;
    let turn = session.create_turn(TurnRequest::message("Take your time")).await.unwrap();
    let mut stream = turn.stream(None);
    // The model is streaming.
    until_first_delta(&mut stream).await;
    turn.cancel().await.unwrap();
    turn.cancel().await.unwrap(); // idempotent
    let state = turn.state().await.unwrap();
    assert!(
        matches!(state, TurnState::Cancelled { reason: CancellationReason::ClientCancelled, .. }),
        "{state:?}"
    );
    let rest = collect(stream).await;
    assert_eq!(rest.last().map(|event| event.payload.kind()), Some("turn.done"));

    let next = session.create_turn(TurnRequest::message("Again")).await.unwrap();
    next.wait().await.unwrap();
    assert_eq!(next.previous_turn_id(), Some(turn.id()));
    let seen = &model.requests()[1].messages;
    assert_eq!(seen.first().map(|message| message.text()).as_deref(), Some("Take your time"));
    assert!(seen.iter().any(|message| message.role == Role::Assistant && message.text().starts_with('a')));
}

/// Scenario.
pub async fn a_turn_past_its_timeout_ends_cancelled_by_the_server(harness: Harness) {
    let slow = ScriptedResponse { chunk_chars: Some(1), ..ScriptedResponse::text("never finishing") }
        .delayed(Duration::from_millis(50));
    let model = Arc::new(ScriptedModel::new(vec![slow]));
    let limits = AgentLimits { timeout: Some(Duration::from_millis(100)), ..AgentLimits::default() };
    let runtime = runtime(&harness, Agent::builder("slow", model).limits(limits).build());
    let session = session_for(&runtime, "slow").await;
    let turn = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    let state = turn.wait().await.unwrap();
    assert!(matches!(state, TurnState::Cancelled { reason: CancellationReason::ServerExecutionTimeout, .. }));
}

/// A tool named `hang` that never returns.
fn hanging_tool() -> FunctionTool<NoArguments> {
    FunctionTool::new("hang", "Never returns.", |_: NoArguments, _| async {
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(String::new())
    })
}

/// A tool's empty arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoArguments {}

/// Scenario.
pub async fn a_tool_past_its_timeout_gives_the_model_an_error_result(harness: Harness) {
    let hang = hanging_tool();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("hang", &json!({})),
        ScriptedResponse::text("It hung."),
    ]));
    let limits = AgentLimits { tool_timeout: Duration::from_millis(50), ..AgentLimits::default() };
    let runtime =
        runtime(&harness, Agent::builder("hang", model.clone()).tool(hang.shared()).limits(limits).build());
    let session = session_for(&runtime, "hang").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    assert_eq!(answer_text(&turn.wait().await.unwrap()).as_deref(), Some("It hung."));
    let result = model.requests()[1].messages.last().unwrap().text();
    assert!(result.contains("did not finish"), "{result}");
}

/// Scenario.
pub async fn the_iteration_limit_and_model_failures_end_the_turn_with_an_error(harness: Harness) {
    let looping =
        Arc::new(ScriptedModel::responder(|_| ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 1}))));
    let limits = AgentLimits { max_iterations: 3, ..AgentLimits::default() };
    let runtime = runtime(
        &harness,
        Agent::builder("loop", looping.clone()).tool(add_tool(Arc::default())).limits(limits).build(),
    );
    let session = session_for(&runtime, "loop").await;
    let state = session.create_turn(TurnRequest::message("go")).await.unwrap().wait().await.unwrap();
    assert!(
        matches!(&state, TurnState::Error { message, .. } if message.contains("limit of 3")),
        "{state:?}"
    );
    assert_eq!(looping.calls(), 3);

    let failing = Arc::new(ScriptedModel::new(vec![ScriptedResponse::failing(ModelError::Http {
        status: 500,
        message: "upstream exploded".to_owned(),
    })]));
    runtime.register(Agent::builder("failing", failing).build());
    let session = session_for(&runtime, "failing").await;
    let state = session.create_turn(TurnRequest::message("go")).await.unwrap().wait().await.unwrap();
    assert!(
        matches!(&state, TurnState::Error { message, .. } if message.contains("upstream exploded")),
        "{state:?}"
    );
}

/// Scenario.
pub async fn a_cancelled_session_refuses_new_turns(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("ok")));
    let runtime = runtime(&harness, Agent::builder("a", model).build());
    let session = session_for(&runtime, "a").await;
    session.cancel().await.unwrap();
    session.cancel().await.unwrap();
    let result = session.create_turn(TurnRequest::message("hi")).await;
    assert!(matches!(result, Err(RunnerError::SessionCancelled { .. })), "{result:?}");
}

/// Scenario: a session is deleted with its turns, their events and the live logs kept
/// after them, but not while a turn of it runs, in this runtime or another on the store.
pub async fn a_session_is_deleted_with_its_turns_only_while_none_runs(harness: Harness) {
    let (model, gate) = GatedModel::new("done");
    let runtime = runtime(&harness, Agent::builder("held", model).build());
    let session = session_for(&runtime, "held").await;
    let turn = session.create_turn(TurnRequest::message("hold")).await.unwrap();
    let result = session.delete().await;
    assert!(matches!(result, Err(RunnerError::TurnRunning { .. })), "{result:?}");
    let other = Runtime::with_options(harness.store.clone(), RuntimeOptions::default());
    let result = other.get_session(session.id()).await.unwrap().delete().await;
    assert!(matches!(result, Err(RunnerError::TurnRunning { .. })), "{result:?}");
    gate.add_permits(1);
    assert_eq!(answer_text(&turn.wait().await.unwrap()).as_deref(), Some("done"), "the turn ran on");
    // Deltas are in the live log only: it is kept.
    let kept = collect(turn.stream(None)).await;
    assert!(kept.iter().any(|event| event.payload.kind() == "model.message.delta"), "its live log is kept");
    session.delete().await.unwrap();
    assert!(matches!(runtime.get_session(session.id()).await, Err(RunnerError::NotFound { .. })));
    assert!(matches!(runtime.get_turn(turn.id()).await, Err(RunnerError::NotFound { .. })));
    assert!(matches!(turn.events(Order::Asc).await, Err(RunnerError::NotFound { .. })));
    let streamed = turn.stream(None).next().await.expect("an answer");
    assert!(streamed.is_err(), "the kept live log went too: {streamed:?}");
    assert!(matches!(session.delete().await, Err(RunnerError::NotFound { .. })));
    let result = session.create_turn(TurnRequest::message("again")).await;
    assert!(matches!(result, Err(RunnerError::NotFound { .. })), "{result:?}");
    // The lease the deletion took went with the session: the store holds none for it.
    assert!(harness.store.lease(session.id()).await.unwrap().is_none());
}

/// Scenario: a session deleted and created again under the same id (a name-based id, as
/// an AG-UI thread's), with a keyed turn of the same id, is served as the new turn by a
/// runtime that still keeps the old turn's live log.
pub async fn a_turn_created_again_under_a_deleted_turns_id_is_not_served_the_old_live_log(harness: Harness) {
    let echo = || {
        Arc::new(ScriptedModel::responder(|request| {
            ScriptedResponse::text(request.messages.last().unwrap().text())
        }))
    };
    let first = runtime(&harness, Agent::builder("echo", echo()).build());
    let (held, _gate) = GatedModel::new("never sent");
    let second = runtime(&harness, Agent::builder("echo", held).build());
    let id = agentry_types::SessionId::new();
    let owner = agentry_types::Subject::user("u");
    let keyed =
        |text: &str| TurnRequest { idempotency_key: Some("run-1".to_owned()), ..TurnRequest::message(text) };
    let session = first.create_session_with_id(id, owner.clone(), "echo", None).await.unwrap();
    let old = session.create_turn(keyed("first words")).await.unwrap();
    assert_eq!(answer_text(&old.wait().await.unwrap()).as_deref(), Some("first words"));
    second.get_session(id).await.unwrap().delete().await.unwrap();
    let again = second.create_session_with_id(id, owner, "echo", None).await.unwrap();
    let new = again.create_turn(keyed("second words")).await.unwrap();
    assert_eq!(new.id(), old.id(), "the same derived ids");
    // Handed over while it runs, it is recovered by the first runtime, whose kept log of
    // the old turn does not pass for it running there.
    assert_eq!(second.hand_over().await, 1);
    let recovered = first.recover().await.unwrap();
    assert_eq!(recovered.iter().map(TurnHandle::id).collect::<Vec<_>>(), [new.id()]);
    // The first runtime serves the new turn.
    let there = first.get_turn(new.id()).await.unwrap();
    assert_eq!(answer_text(&there.wait().await.unwrap()).as_deref(), Some("second words"));
    let messages: Vec<String> = collect(there.stream(None))
        .await
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ModelMessage(message) => message.content.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(messages, ["second words"]);
}

/// Scenario: a cancel of a session that lands while one of its turns starts (after the
/// start read the session, before the turn is live) still ends that turn, at once: every
/// turn started beside a cancel ends cancelled, though this runtime's look for cancels
/// that other processes stored is put off for an hour, and its model answers only after
/// an hour.
pub async fn a_session_cancelled_while_a_turn_starts_leaves_no_turn_running(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|_| {
        ScriptedResponse::text("late").delayed(Duration::from_secs(3600))
    }));
    let hour = Duration::from_secs(3600);
    let options = RuntimeOptions { cancel_poll: hour, lease_ttl: 3 * hour, ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(harness.store.clone(), options);
    runtime.register(Agent::builder("slow", model).build());
    let mut started = 0;
    for _ in 0..40 {
        let session = session_for(&runtime, "slow").await;
        let (turn, cancelled) =
            tokio::join!(session.create_turn(TurnRequest::message("hi")), session.cancel());
        cancelled.unwrap();
        match turn {
            Ok(turn) => {
                started += 1;
                // Bounded: without the cancel, the turn would wait an hour for its model.
                let state = tokio::time::timeout(Duration::from_secs(30), turn.wait())
                    .await
                    .expect("a turn started beside a cancel of its session is left running")
                    .unwrap();
                assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
                // Its input is kept: the next turn's history has it.
                let history = harness
                    .store
                    .history(session.id(), &agentry_memory::HistoryQuery::default())
                    .await
                    .unwrap();
                let kept = history.iter().any(|stored| {
                    stored.run_id == turn.id()
                        && stored.message.role == Role::User
                        && stored.message.text() == "hi"
                });
                assert!(kept, "the cancelled turn's message is in the history: {history:?}");
            }
            Err(RunnerError::SessionCancelled { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    // Both ways are taken: a start before the cancel (the cancel ends its turn) or beside
    // it, and one after (refused).
    assert!(started > 0, "no turn started before its session was cancelled");
}

/// Scenario.
pub async fn a_subscriber_resuming_after_a_seq_gets_every_later_event_once(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse {
        chunk_chars: Some(2),
        ..ScriptedResponse::text("twenty characters!!!")
    }]));
    let runtime = runtime(&harness, Agent::builder("a", model).build());
    let session = session_for(&runtime, "a").await;
    let turn = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    let all = collect(turn.stream(None)).await;
    for cut in [0, 1, 3, all.len() as u64 - 1] {
        let resumed = collect(turn.stream(Some(cut))).await;
        let seqs: Vec<u64> = resumed.iter().map(|event| event.seq).collect();
        assert_eq!(seqs, ((cut + 1)..=all.len() as u64).collect::<Vec<_>>());
    }
}

/// Scenario.
pub async fn after_the_live_log_expires_a_stream_is_served_from_the_stored_log(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("stored answer")]));
    let options = RuntimeOptions { live_retention: Duration::ZERO, ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(harness.store.clone(), options);
    runtime.register(Agent::builder("a", model).build());
    let session = session_for(&runtime, "a").await;
    let turn = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    turn.wait().await.unwrap();
    let events = collect(turn.stream(None)).await;
    assert!(events.iter().all(|event| event.payload.kind() != "model.message.delta"));
    assert_eq!(kinds(&events), ["turn.created", "model.message", "step.completed", "turn.done"]);
}

/// Scenario.
pub async fn tools_get_a_stable_idempotency_key_and_the_journal_records_each_call(harness: Harness) {
    let keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    let recorder = {
        let keys = keys.clone();
        FunctionTool::new("record", "Records its key.", move |_: Nothing, context| {
            let keys = keys.clone();
            async move {
                keys.lock().unwrap().push(context.idempotency_key.clone());
                Ok::<_, ToolError>("recorded".to_owned())
            }
        })
    };
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("record", &json!({})),
        ScriptedResponse::text("ok"),
    ]));
    let store = harness.store.clone();
    let runtime = Runtime::new(store.clone());
    runtime.register(Agent::builder("a", model).tool(recorder.shared()).build());
    let session = session_for(&runtime, "a").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    turn.wait().await.unwrap();
    let journal = store.journal(turn.id()).await.unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(journal[0].result.as_ref().map(|result| result.content.as_str()), Some("recorded"));
    assert_eq!(keys.lock().unwrap().as_slice(), [journal[0].idempotency_key.clone()]);
}

/// Scenario.
pub async fn a_subscriber_reading_one_event_per_50_ms_still_receives_thousands_in_order(harness: Harness) {
    // The clock is paused: the 50 ms reads cost no wall time, and the turn runs far ahead.
    tokio::time::pause();
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse {
        chunk_chars: Some(1),
        ..ScriptedResponse::text("x".repeat(3000))
    }]));
    let runtime = runtime(&harness, Agent::builder("a", model).build());
    let session = session_for(&runtime, "a").await;
    let turn = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    let mut stream = turn.stream(None);
    let mut seqs = Vec::new();
    while let Some(event) = stream.next().await {
        seqs.push(event.unwrap().seq);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert!(seqs.len() > 3000, "{} events", seqs.len());
}

/// Scenario.
pub async fn past_its_delta_budget_a_live_log_merges_deltas_and_every_reader_still_gets_the_whole_text(
    harness: Harness,
) {
    // The clock is paused: the 50 ms reads cost no wall time, and the turn runs far ahead.
    tokio::time::pause();
    let reply: String = (0..3000).map(|at| char::from(b'a' + (at * 7 % 26) as u8)).collect();
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse {
        chunk_chars: Some(1),
        ..ScriptedResponse::text(reply.clone())
    }]));
    // Merge at every delta: the smallest budget.
    let options = RuntimeOptions {
        live_retention: Duration::from_secs(600),
        live_delta_budget: 0,
        ..Default::default()
    };
    let runtime = Runtime::with_options(harness.store.clone(), options);
    runtime.register(Agent::builder("a", model).build());
    let session = session_for(&runtime, "a").await;
    let turn = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    let mut stream = turn.stream(None);
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event.unwrap());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text_of = |events: &[Arc<EventEnvelope>]| -> String {
        events
            .iter()
            .filter_map(|event| match &event.payload {
                EventPayload::ModelMessageDelta(delta) => delta.content.clone(),
                _ => None,
            })
            .collect()
    };
    assert!(events.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert_eq!(kinds(&events), ["turn.created", "model.message", "step.completed", "turn.done"]);
    assert!(events.len() < 3000, "nothing merged: {} events", events.len());
    assert_eq!(text_of(&events), reply);
    let message = events.iter().find_map(|event| match &event.payload {
        EventPayload::ModelMessage(message) => message.content.clone(),
        _ => None,
    });
    assert_eq!(message.as_deref(), Some(reply.as_str()));
    // The finished turn, from positions among its deltas (the i-th carries character i):
    // the rest of the text.
    let first_delta = events[0].seq + 1;
    for read in (0..3000).step_by(97).chain([2999]) {
        let rest = collect(turn.stream(Some(first_delta + read))).await;
        assert_eq!(text_of(&rest), reply[read as usize + 1..], "after {read} deltas");
        assert_eq!(rest.last().map(|event| event.payload.kind()), Some("turn.done"));
    }
}

/// Scenario: durations past the clock's range (an agent's turn timeout, the lease time) mean
/// no limit: turns run and end, and what they store reads back.
pub async fn durations_past_the_clocks_range_mean_no_limit(harness: Harness) {
    let model =
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("one"), ScriptedResponse::text("two")]));
    let limits = AgentLimits { timeout: Some(Duration::MAX), ..AgentLimits::default() };
    let options = RuntimeOptions { lease_ttl: Duration::MAX, ..RuntimeOptions::default() };
    let runtime = Runtime::with_options(harness.store.clone(), options);
    runtime.register(Agent::builder("a", model).limits(limits).build());
    let session = session_for(&runtime, "a").await;
    for expected in ["one", "two"] {
        let state = session.create_turn(TurnRequest::message("hi")).await.unwrap().wait().await.unwrap();
        let TurnState::Done { output: Some(output), .. } = &state else { panic!("{state:?}") };
        assert_eq!(output.message.content.as_deref(), Some(expected));
    }
    assert!(runtime.recover().await.unwrap().is_empty(), "nothing left to recover");
}

/// Scenario.
pub async fn unknown_agents_sessions_and_turns_are_not_found(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![]));
    let runtime = runtime(&harness, Agent::builder("a", model).build());
    assert!(matches!(
        runtime.create_session("nobody", None).await,
        Err(RunnerError::NotFound { kind: "agent", .. })
    ));
    assert!(matches!(
        runtime.get_session(agentry_types::SessionId::new()).await,
        Err(RunnerError::NotFound { kind: "session", .. })
    ));
    let session = session_for(&runtime, "a").await;
    assert!(matches!(
        session.get_turn(agentry_types::TurnId::new()).await,
        Err(RunnerError::NotFound { .. })
    ));
}

/// Scenario.
pub async fn stream_after_every_position_of_a_running_and_a_finished_turn_gives_exactly_the_rest(
    harness: Harness,
) {
    let (model, gate) = GatedModel::new("running");
    let runtime = runtime(&harness, Agent::builder("gated", model).build());
    let session = session_for(&runtime, "gated").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    // Read up to the held delta: turn.created and the deltas before it.
    let mut first = turn.stream(None);
    let mut seen = Vec::new();
    while seen.len() < "running".len() {
        let event = first.next().await.unwrap().unwrap();
        seen.push(event.seq);
    }
    let running_last = *seen.last().unwrap();
    // While it runs, every position yields exactly what follows it so far.
    let mut subscribers = Vec::new();
    for after in 0..=running_last {
        let mut stream = turn.stream(Some(after));
        for expected in after + 1..=running_last {
            assert_eq!(stream.next().await.unwrap().unwrap().seq, expected);
        }
        subscribers.push((after, stream));
    }
    gate.add_permits(1);
    let total = collect(first).await.last().map_or(running_last, |event| event.seq);
    for (after, stream) in subscribers {
        let rest: Vec<u64> = collect(stream).await.iter().map(|event| event.seq).collect();
        assert_eq!(rest, (running_last.max(after) + 1..=total).collect::<Vec<_>>(), "after {after}");
    }
    // Finished: every position again.
    for after in 0..=total {
        let rest: Vec<u64> = collect(turn.stream(Some(after))).await.iter().map(|event| event.seq).collect();
        assert_eq!(rest, (after + 1..=total).collect::<Vec<_>>(), "after {after}, finished");
    }
}

/// A tool behind an MCP server that needs authorization until `authorized` is set.
fn guarded_tool(authorized: Arc<std::sync::atomic::AtomicBool>, calls: Arc<AtomicUsize>) -> Arc<dyn Tool> {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Query {
        q: String,
    }
    FunctionTool::new("search", "Searches a private index.", move |args: Query, _| {
        let (authorized, calls) = (authorized.clone(), calls.clone());
        async move {
            if !authorized.load(Ordering::SeqCst) {
                return Err(ToolError::AuthRequired {
                    server: agentry_types::McpServerRef { id: "idx".to_owned(), name: "index".to_owned() },
                    auth_url: "https://auth.example/authorize".to_owned(),
                });
            }
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(format!("found {}", args.q))
        }
    })
    .shared()
}

/// Scenario.
pub async fn mcp_auth_required_ends_the_turn_and_an_empty_turn_after_authorizing_resumes(harness: Harness) {
    let authorized = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let model = Arc::new(ScriptedModel::responder(|request| {
        match request.messages.last().map(|message| message.role) {
            Some(Role::Tool) => {
                ScriptedResponse::text(format!("Result: {}", request.messages.last().unwrap().text()))
            }
            _ => ScriptedResponse::tool_call("search", &json!({"q": "rust"})),
        }
    }));
    let agent =
        Agent::builder("searcher", model).tool(guarded_tool(authorized.clone(), calls.clone())).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "searcher").await;
    let first = session.create_turn(TurnRequest::message("search rust")).await.unwrap();
    let events = collect(first.stream(None)).await;
    let servers = events.iter().find_map(|event| match &event.payload {
        EventPayload::McpAuthRequired { servers } => Some(servers.clone()),
        _ => None,
    });
    assert_eq!(
        servers.map(|servers| servers[0].auth_url.clone()).as_deref(),
        Some("https://auth.example/authorize")
    );
    let state = first.wait().await.unwrap();
    assert!(matches!(state.required_actions()[0].action, agentry_types::RequiredAction::McpAuth { .. }));

    // A user message or any input is refused until the empty resumption.
    for input in [
        vec![TurnInputItem::message("hello?")],
        vec![TurnInputItem::allow(agentry_types::ThreadId::main(), "call_1_0")],
    ] {
        let refused = session.create_turn(TurnRequest::input(input)).await;
        assert!(matches!(refused, Err(RunnerError::InvalidInput(_))), "{refused:?}");
    }
    authorized.store(true, Ordering::SeqCst);
    let second = session.create_turn(TurnRequest::input(vec![])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Result: found rust"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let turns = session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap();
    assert_eq!(turns.items.len(), 2, "the refused inputs stored nothing");
}

/// Scenario.
pub async fn answers_to_client_tools_must_match_the_pending_calls_exactly(harness: Harness) {
    let mut two = ScriptedResponse::tool_call("ask_user_question", &json!({"question": "A?"}));
    two.tool_calls.push(ScriptedToolCall {
        id: None,
        name: "ask_user_question".to_owned(),
        arguments: r#"{"question":"B?"}"#.to_owned(),
    });
    let model = Arc::new(ScriptedModel::new(vec![two, ScriptedResponse::text("Thanks.")]));
    let runtime = runtime(&harness, Agent::builder("asker", model).ask_user_question().build());
    let session = session_for(&runtime, "asker").await;
    session.create_turn(TurnRequest::message("ask me twice")).await.unwrap().wait().await.unwrap();
    let main = agentry_types::ThreadId::main();
    let respond = |id: &str| {
        TurnInputItem::ToolResponse(agentry_types::UserToolResponse {
            thread_id: main.clone(),
            tool_call_id: id.to_owned(),
            content: "yes".to_owned(),
        })
    };
    let refused_inputs = vec![
        vec![respond("call_1_0")], // one pending call unanswered
        vec![TurnInputItem::allow(main.clone(), "call_1_0"), respond("call_1_1")], // approval for a client tool
        vec![respond("call_1_0"), respond("call_1_1"), respond("call_9_9")],       // an unknown call
        vec![respond("call_1_0"), respond("call_1_0")],                            // answered twice
    ];
    for input in refused_inputs {
        let refused = session.create_turn(TurnRequest::input(input.clone())).await;
        assert!(matches!(refused, Err(RunnerError::InvalidInput(_))), "{input:?} gave {refused:?}");
    }
    assert_eq!(session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap().items.len(), 1);
    let done = session
        .create_turn(TurnRequest::input(vec![respond("call_1_0"), respond("call_1_1")]))
        .await
        .unwrap();
    assert_eq!(answer_text(&done.wait().await.unwrap()).as_deref(), Some("Thanks."));
}

/// Scenario: a provider that numbers its calls per response (`call_0` in every step): each
/// step's call runs on its own, and a later call of an approved tool is put to a person
/// again instead of passing as the approved one.
pub async fn calls_whose_provider_reuses_an_id_each_run_and_ask_for_their_own_approval(harness: Harness) {
    let same_id = |a: i64| ScriptedResponse {
        tool_calls: vec![ScriptedToolCall {
            id: Some("call_0".to_owned()),
            name: "add".to_owned(),
            arguments: json!({"a": a, "b": a}).to_string(),
        }],
        ..ScriptedResponse::default()
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let model =
        Arc::new(ScriptedModel::new(vec![same_id(1), same_id(2), ScriptedResponse::text("4 and 2.")]));
    let runtime =
        runtime(&harness, Agent::builder("adder", model.clone()).tool(add_tool(calls.clone())).build());
    let session = session_for(&runtime, "adder").await;
    let turn = session.create_turn(TurnRequest::message("Add twice")).await.unwrap();
    assert_eq!(answer_text(&turn.wait().await.unwrap()).as_deref(), Some("4 and 2."));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each step's call ran");
    let events = turn.events(Order::Asc).await.unwrap();
    let responses: Vec<(String, String)> = events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ToolResponse { tool_call_id, content, .. } => {
                Some((tool_call_id.clone(), content.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(responses, [("call_0".to_owned(), "2".to_owned()), ("call_0_2".to_owned(), "4".to_owned())]);
    // The provider is sent back the ids the turn gave: each result follows its own call.
    let last = model.requests().last().cloned().unwrap();
    let ids: Vec<String> = last
        .messages
        .iter()
        .flat_map(|message| message.tool_calls.iter().map(|call| call.id.clone()))
        .collect();
    assert_eq!(ids, ["call_0", "call_0_2"]);

    // Gated: the approval of the first call does not let the second through.
    let model = Arc::new(ScriptedModel::new(vec![same_id(1), same_id(1), ScriptedResponse::text("Done.")]));
    let gated =
        Agent::builder("gated-adder", model).tool(add_tool(calls.clone())).requires_approval("add").build();
    runtime.register(gated);
    let session = session_for(&runtime, "gated-adder").await;
    let first = session.create_turn(TurnRequest::message("Add")).await.unwrap();
    let pending = first.wait().await.unwrap().required_actions().to_vec();
    assert_eq!(pending.len(), 1);
    let approve = TurnInputItem::allow(agentry_types::ThreadId::main(), "call_0");
    let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    let state = second.wait().await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 3, "the approved call ran, the next one waits");
    let asked: Vec<String> = state
        .required_actions()
        .iter()
        .flat_map(|action| match &action.action {
            agentry_types::RequiredAction::ToolApproval { tool_calls, .. } => {
                tool_calls.iter().map(|call| call.id.clone()).collect::<Vec<_>>()
            }
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(asked, ["call_0_2"], "{state:?}");

    // Two gated calls of one message under one id: each is its own, asked for and run.
    let both = ScriptedResponse {
        tool_calls: [1, 2]
            .map(|a| ScriptedToolCall {
                id: Some("x".to_owned()),
                name: "add".to_owned(),
                arguments: json!({"a": a, "b": a}).to_string(),
            })
            .to_vec(),
        ..ScriptedResponse::default()
    };
    let model = Arc::new(ScriptedModel::new(vec![both, ScriptedResponse::text("2 and 4.")]));
    let twin = Agent::builder("twin-adder", model.clone())
        .tool(add_tool(calls.clone()))
        .requires_approval("add")
        .build();
    runtime.register(twin);
    let session = session_for(&runtime, "twin-adder").await;
    let first = session.create_turn(TurnRequest::message("Add both")).await.unwrap();
    let state = first.wait().await.unwrap();
    let pending: Vec<(String, String)> = state
        .required_actions()
        .iter()
        .flat_map(|action| match &action.action {
            agentry_types::RequiredAction::ToolApproval { tool_calls, .. } => {
                tool_calls.iter().map(|call| (call.id.clone(), call.arguments.clone())).collect::<Vec<_>>()
            }
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(
        pending,
        [
            ("x".to_owned(), json!({"a": 1, "b": 1}).to_string()),
            ("x_2".to_owned(), json!({"a": 2, "b": 2}).to_string())
        ]
    );
    let allow = |id: &str| TurnInputItem::allow(agentry_types::ThreadId::main(), id);
    let second = session.create_turn(TurnRequest::input(vec![allow("x"), allow("x_2")])).await.unwrap();
    assert_eq!(answer_text(&second.wait().await.unwrap()).as_deref(), Some("2 and 4."));
    assert_eq!(calls.load(Ordering::SeqCst), 5, "both ran");
    let sent = model.requests().last().cloned().unwrap();
    let results: Vec<(Option<String>, String)> = sent
        .messages
        .iter()
        .filter(|message| message.role == Role::Tool)
        .map(|message| (message.tool_call_id.clone(), message.text()))
        .collect();
    assert_eq!(results, [(Some("x".to_owned()), "2".to_owned()), (Some("x_2".to_owned()), "4".to_owned())]);
}

/// Scenario: a turn that pauses for an approval after its process stopped (recovered with
/// the gated call unanswered) ends as it would have: with the model message that asked as
/// its output, beside the required action.
pub async fn a_turn_recovered_into_an_approval_keeps_the_message_that_asked_as_its_output(harness: Harness) {
    let started = Arc::new(tokio::sync::Notify::new());
    // The first process's `lookup` never finishes; the second's answers at once.
    let lookup = |started: Arc<tokio::sync::Notify>, hold: bool| {
        FunctionTool::new("lookup", "Looks a number up.", move |args: AddArgs, _context| {
            let started = started.clone();
            async move {
                started.notify_one();
                if hold {
                    std::future::pending::<()>().await;
                }
                Ok::<_, ToolError>((args.a * args.b).to_string())
            }
        })
        .idempotent()
        .shared()
    };
    let asking = ScriptedResponse::text("Let me look that up, then add.")
        .with_tool_call("lookup", &json!({"a": 2, "b": 3}))
        .with_tool_call("add", &json!({"a": 1, "b": 1}));
    let agent = |lookup: Arc<dyn Tool>| {
        let model = Arc::new(ScriptedModel::new(vec![asking.clone()]));
        Agent::builder("asker", model)
            .tool(lookup)
            .tool(add_tool(Arc::default()))
            .requires_approval("add")
            .build()
    };
    let first = runtime(&harness, agent(lookup(started.clone(), true)));
    let session = session_for(&first, "asker").await;
    let turn = session.create_turn(TurnRequest::message("Look up and add")).await.unwrap();
    started.notified().await;
    assert_eq!(first.hand_over().await, 1);
    let second = runtime(&harness, agent(lookup(Arc::default(), false)));
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    let state = resumed[0].wait().await.unwrap();
    assert_eq!(state.required_actions().len(), 1, "{state:?}");
    assert_eq!(answer_text(&state).as_deref(), Some("Let me look that up, then add."), "{state:?}");
}

/// Scenario: a streaming result whose turn its runtime hands over (a shutdown) waits for
/// the end another runtime gives the turn, instead of failing.
pub async fn a_streaming_result_of_a_handed_over_turn_completes_where_it_is_resumed(harness: Harness) {
    let (held, _gate) = GatedModel::new("held back");
    let first = runtime(&harness, Agent::builder("held", held).build());
    let session = session_for(&first, "held").await;
    let result = session.run_streamed(TurnRequest::message("go")).await.unwrap();
    let mut live = result.turn().stream(None);
    until_first_delta(&mut live).await;
    assert_eq!(first.hand_over().await, 1);
    let waiting = tokio::spawn(async move { result.wait_for_completion().await });
    let second = runtime(
        &harness,
        Agent::builder("held", Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("recovered")])))
            .build(),
    );
    assert_eq!(second.recover().await.unwrap().len(), 1);
    let outcome =
        tokio::time::timeout(Duration::from_secs(30), waiting).await.expect("it completes").unwrap();
    assert_eq!(outcome.unwrap().answer.as_deref(), Some("recovered"));
}

/// Scenario.
pub async fn the_adalflow_streaming_result_streams_run_items_writes_json_and_returns_the_step_history(
    harness: Harness,
) {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("add", &json!({"a": 2, "b": 3})).with_reasoning("I should add."),
        ScriptedResponse::text("The sum is 5."),
    ]));
    let runtime = runtime(&harness, Agent::builder("math", model).tool(add_tool(Arc::default())).build());
    let session = session_for(&runtime, "math").await;
    let result = session.run_streamed(TurnRequest::message("2 + 3?")).await.unwrap();
    let dir = std::env::temp_dir().join(format!("agentry-adalflow-{}", result.turn().id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("live_events.json");
    let mut events = result.stream_to_json(&path).await.unwrap();
    let mut names = Vec::new();
    let mut raw = 0;
    while let Some(event) = events.next().await {
        match event.unwrap() {
            agentry_events::render::adalflow::AdalFlowStreamEvent::RunItem { name, .. } => {
                names.push(serde_json::to_value(name).unwrap().as_str().unwrap().to_owned());
            }
            agentry_events::render::adalflow::AdalFlowStreamEvent::RawResponse { .. } => raw += 1,
        }
    }
    assert!(raw > 0, "model deltas come as raw response events");
    assert_eq!(
        names,
        [
            "agent.tool_call_start",
            "agent.tool_call_complete",
            "agent.step_complete",
            "agent.step_complete",
            "agent.final_output",
            "agent.execution_complete"
        ]
    );
    let written: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(written.as_array().unwrap().len(), names.len() + raw);
    assert!(result.is_complete());
    let outcome = result.wait_for_completion().await.unwrap();
    assert_eq!(outcome.answer.as_deref(), Some("The sum is 5."));
    assert_eq!(outcome.step_history.len(), 2);
    assert_eq!(outcome.step_history[0].observation.as_deref(), Some("5"));
    assert_eq!(outcome.step_history[0].function.as_ref().map(|function| function.name.as_str()), Some("add"));
    assert!(outcome.error.is_none());
    std::fs::remove_dir_all(dir).unwrap();

    // Reasoning streamed by the model is reported as reasoning events.
    let stored = result.turn().events(Order::Asc).await.unwrap();
    let reasoning: Vec<&str> = stored
        .iter()
        .map(|event| event.payload.kind())
        .filter(|kind| kind.starts_with("reasoning."))
        .collect();
    assert_eq!(reasoning, ["reasoning.started", "reasoning.step", "reasoning.completed"]);
}

/// Scenario.
pub async fn a_cancelled_adalflow_result_reports_the_cancellation_as_its_error(harness: Harness) {
    let (model, _gate) = GatedModel::new("never");
    let runtime = runtime(&harness, Agent::builder("gated", model).build());
    let session = session_for(&runtime, "gated").await;
    let result = session.run_streamed(TurnRequest::message("go")).await.unwrap();
    let mut events = result.stream_events();
    // The first raw delta: the model is streaming.
    while let Some(event) = events.next().await {
        if matches!(event.unwrap(), agentry_events::render::adalflow::AdalFlowStreamEvent::RawResponse { .. })
        {
            break;
        }
    }
    result.cancel().await.unwrap();
    let outcome = result.wait_for_completion().await.unwrap();
    assert_eq!(outcome.error.as_deref(), Some("cancelled: client-cancelled"));
    assert!(outcome.answer.is_none());
}

/// Whether a memory-analysis request asks for the session's summary (else the profile).
fn asks_for_a_summary(request: &ModelRequest) -> bool {
    let prompt = request.messages.last().map(|message| message.text()).unwrap_or_default();
    prompt.starts_with("Update the summary")
}

/// A memory-analysis model answering `summary` to summary requests and `profile` to
/// profile requests.
fn analysis_model(summary: &'static str, profile: &'static str) -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::responder(move |request| {
        ScriptedResponse::text(if asks_for_a_summary(request) { summary } else { profile })
    }))
}

/// Scenario.
pub async fn memory_summaries_and_profiles_are_updated_after_a_turn_and_injected_into_the_next(
    harness: Harness,
) {
    let analysis = analysis_model("Ada asked about tea.", r#"{"name": "Ada"}"#);
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Noted.")));
    let config = agentry_memory::MemoryConfig {
        summary_memory: true,
        user_analysis_memory: true,
        ..agentry_memory::MemoryConfig::default()
    };
    let agent = Agent::builder("remember", model.clone())
        .instructions("Be kind.")
        .memory(config, Some(analysis))
        .build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "remember").await;
    let first = session.create_turn(TurnRequest::message("I am Ada and I like tea.")).await.unwrap();
    let events = collect(first.stream(None)).await;
    let memory_events: Vec<&str> =
        kinds(&events).into_iter().filter(|kind| kind.starts_with("memory.")).collect();
    assert_eq!(memory_events, ["memory.update.started", "memory.update.completed"]);
    assert!(events.iter().any(|event| event.payload == EventPayload::MemoryUpdateCompleted { error: None }));
    let stored = harness.store.get_session(session.id()).await.unwrap();
    assert_eq!(stored.summary.map(|summary| summary.summary).as_deref(), Some("Ada asked about tea."));
    let profile = harness.store.profile("local").await.unwrap().unwrap();
    assert_eq!(profile.profile["name"], "Ada");

    session.create_turn(TurnRequest::message("What do I like?")).await.unwrap().wait().await.unwrap();
    let system = model.requests().last().unwrap().messages[0].text();
    assert!(system.starts_with("Be kind."), "{system}");
    assert!(system.contains("Ada asked about tea."), "{system}");
    assert!(system.contains("\"name\": \"Ada\""), "{system}");
}

/// Scenario: a memory update that fails does not fail the turn, and says what failed.
pub async fn a_failed_memory_update_keeps_the_answer_and_names_the_failure(harness: Harness) {
    let analysis = analysis_model("Ada asked about tea.", "I would rather not say.");
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Noted.")));
    let config = agentry_memory::MemoryConfig {
        summary_memory: true,
        user_analysis_memory: true,
        ..agentry_memory::MemoryConfig::default()
    };
    let agent = Agent::builder("remember", model).memory(config, Some(analysis)).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "remember").await;
    let turn = session.create_turn(TurnRequest::message("I am Ada.")).await.unwrap();
    let live = collect(turn.stream(None)).await;
    let state = turn.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Noted."), "{state:?}");
    let failure = |events: &[Arc<EventEnvelope>]| {
        events.iter().find_map(|event| match &event.payload {
            EventPayload::MemoryUpdateCompleted { error } => Some(error.clone()),
            _ => None,
        })
    };
    let error = failure(&live).flatten().expect("the failure is named");
    assert!(error.contains("profile is not a JSON object"), "{error}");
    assert!(!error.contains("was saved"), "only the reason: {error}");
    // The stored event says the same, and the summary (which did not fail) is written.
    let stored: Vec<Arc<EventEnvelope>> =
        turn.events(Order::Asc).await.unwrap().into_iter().map(Arc::new).collect();
    assert_eq!(failure(&stored).flatten().as_deref(), Some(error.as_str()));
    let stored = harness.store.get_session(session.id()).await.unwrap();
    assert_eq!(stored.summary.map(|summary| summary.summary).as_deref(), Some("Ada asked about tea."));
    assert!(harness.store.profile("local").await.unwrap().is_none());
}

/// Scenario: a cancellation while the memory update waits on a slow model cuts the update
/// at once; the turn ends with its answer, and the update's end says it was cut.
pub async fn a_cancel_during_the_memory_update_cuts_it_and_the_answer_stands(harness: Harness) {
    let (analysis, gate) = GatedModel::new("A summary that never ends.");
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Noted.")));
    let config =
        agentry_memory::MemoryConfig { summary_memory: true, ..agentry_memory::MemoryConfig::default() };
    let agent = Agent::builder("remember", model).memory(config, Some(analysis)).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "remember").await;
    let turn = session.create_turn(TurnRequest::message("I am Ada.")).await.unwrap();
    let mut stream = turn.stream(None);
    until_kind(&mut stream, "memory.update.started").await;
    // The summary's model stream holds the gate while it waits (the test, the model and it).
    tokio::time::timeout(Duration::from_secs(10), async {
        while Arc::strong_count(&gate) < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the summary is asked for");
    tokio::time::timeout(Duration::from_secs(10), turn.cancel()).await.expect("cut at once").unwrap();
    let state = turn.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Noted."), "{state:?}");
    let stored = turn.events(Order::Asc).await.unwrap();
    let error = stored
        .iter()
        .find_map(|event| match &event.payload {
            EventPayload::MemoryUpdateCompleted { error } => error.clone(),
            _ => None,
        })
        .expect("the update's end names the cut");
    assert!(error.starts_with("cut short: the turn was cancelled"), "{error}");
    assert!(harness.store.get_session(session.id()).await.unwrap().summary.is_none());
    assert_eq!(Arc::strong_count(&gate), 2, "the summary's model request was dropped");
}

/// Scenario.
pub async fn memory_serves_a_team_session_and_cuts_history_to_its_last_messages(harness: Harness) {
    let analysis = analysis_model("A sum was asked.", r#"{"likes": "sums"}"#);
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("add", &json!({"a": 2, "b": 3})),
        ScriptedResponse::text("It is 5."),
        ScriptedResponse::text("You asked for a sum."),
    ]));
    // Two messages: the last two of turn 1 are its tool result and answer; the result
    // would stand without its call, so the call is kept too.
    let config = agentry_memory::MemoryConfig {
        summary_memory: true,
        num_last_messages: Some(2),
        ..agentry_memory::MemoryConfig::default()
    };
    let agent = Agent::builder("lead", model.clone())
        .instructions("Lead the team.")
        .session_type(agentry_types::SessionType::Team)
        .tool(add_tool(Arc::new(AtomicUsize::new(0))))
        .memory(config, Some(analysis))
        .build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "lead").await;
    let first =
        session.create_turn(TurnRequest::message("What is 2 + 3?")).await.unwrap().wait().await.unwrap();
    assert!(matches!(first, TurnState::Done { .. }), "{first:?}");
    let stored = harness.store.get_session(session.id()).await.unwrap();
    assert_eq!(stored.session_type, agentry_types::SessionType::Team);
    assert_eq!(stored.summary.map(|summary| summary.summary).as_deref(), Some("A sum was asked."));

    let second =
        session.create_turn(TurnRequest::message("What did I ask?")).await.unwrap().wait().await.unwrap();
    assert!(matches!(second, TurnState::Done { .. }), "{second:?}");
    let request = model.requests().last().unwrap().clone();
    let roles: Vec<Role> = request.messages.iter().map(|message| message.role).collect();
    let expected = [Role::System, Role::Assistant, Role::Tool, Role::Assistant, Role::User];
    assert_eq!(roles, expected, "{:?}", request.messages);
    assert_eq!(request.messages[1].tool_calls.len(), 1);
    assert_eq!(request.messages[3].text(), "It is 5.");
    assert!(request.messages[0].text().contains("A sum was asked."));
}

/// Scenario.
pub async fn a_running_checkpoint_saved_through_the_session_views_is_not_resumed_as_a_turn(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Fresh answer.")));
    let agent =
        Agent::builder("keeper", model.clone()).session_type(agentry_types::SessionType::Team).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "keeper").await;
    let view = agentry_memory::TeamSession::load(harness.store.clone(), session.id()).await.unwrap();
    let mut checkpoint = agentry_types::agno::RunOutput::new(1_800_000_000);
    checkpoint.run_id = Some(agentry_types::TurnId::new().to_string());
    checkpoint.status = agentry_types::RunStatus::Running;
    view.upsert_run(&agentry_types::agno::MemberResponse::Agent(Box::new(checkpoint))).await.unwrap();
    let turn =
        session.create_turn(TurnRequest::message("Hello")).await.expect("a new turn, not a resumption");
    let state = turn.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Fresh answer."), "{state:?}");
    assert_eq!(model.requests().len(), 1);
}

/// Scenario: a turn a dead process left running is recovered even under more runs than a
/// listing page that an application saved as running through the session views since.
pub async fn a_turn_left_under_many_running_checkpoints_is_still_recovered(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Recovered.")));
    let agent = Agent::builder("keeper", model).session_type(agentry_types::SessionType::Team).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "keeper").await;
    let left = leave_a_dead_process(&harness, &session, true).await.unwrap();
    let view = agentry_memory::TeamSession::load(harness.store.clone(), session.id()).await.unwrap();
    for _ in 0..12 {
        let mut checkpoint = agentry_types::agno::RunOutput::new(1_800_000_000);
        checkpoint.run_id = Some(agentry_types::TurnId::new().to_string());
        checkpoint.status = agentry_types::RunStatus::Running;
        view.upsert_run(&agentry_types::agno::MemberResponse::Agent(Box::new(checkpoint))).await.unwrap();
    }
    let resumed = runtime.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [left]);
    let state = resumed[0].wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Recovered."), "{state:?}");
}

/// A model whose first answer sends text, then a tool-call chunk that cannot merge (its
/// index skips 0); later answers are plain text.
#[derive(Debug, Default)]
struct UnmergeableModel {
    calls: AtomicUsize,
    last: std::sync::Mutex<Option<ModelRequest>>,
}

#[async_trait::async_trait]
impl Model for UnmergeableModel {
    fn info(&self) -> ModelInfo {
        ModelInfo { id: "unmergeable".to_owned(), provider: "test".to_owned() }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        *self.last.lock().unwrap() = Some(request.clone());
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            return Ok(Box::pin(futures_util::stream::iter(
                ScriptedResponse::text("Again.").deltas(2, &request).into_iter().map(Ok),
            )));
        }
        let text = agentry_types::ModelMessageDelta { content: Some("Partial".into()), ..Default::default() };
        let call = agentry_types::ToolCallDelta {
            index: 1,
            id: Some("call_1".into()),
            kind: None,
            function: None,
            tool_info: None,
        };
        let broken = agentry_types::ModelMessageDelta { tool_calls: vec![call], ..Default::default() };
        Ok(Box::pin(futures_util::stream::iter([Ok(text), Ok(broken)])))
    }
}

/// Scenario.
pub async fn a_delta_that_does_not_merge_keeps_the_text_already_streamed(harness: Harness) {
    let model = Arc::new(UnmergeableModel::default());
    let runtime = runtime(&harness, Agent::builder("odd", model.clone()).build());
    let session = session_for(&runtime, "odd").await;
    let turn = session.create_turn(TurnRequest::message("Hi")).await.unwrap();
    let state = turn.wait().await.unwrap();
    let TurnState::Error { message, .. } = &state else { panic!("{state:?}") };
    assert!(message.contains("does not merge"), "{message}");
    let stored = turn.events(Order::Asc).await.unwrap();
    let kept = stored.iter().find_map(|event| match &event.payload {
        EventPayload::ModelMessage(message) => message.content.clone(),
        _ => None,
    });
    assert_eq!(kept.as_deref(), Some("Partial"), "the streamed text has its model.message");
    session.create_turn(TurnRequest::message("Once more")).await.unwrap().wait().await.unwrap();
    let request = model.last.lock().unwrap().clone().unwrap();
    let texts: Vec<String> = request.messages.iter().map(|message| message.text()).collect();
    assert!(texts.iter().any(|text| text == "Partial"), "the next turn sees it: {texts:?}");
}

/// Scenario.
pub async fn a_tool_output_past_the_limit_is_cut_and_says_how_much_was_left_out(harness: Harness) {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    // 10,000 bytes of two-byte characters, against an odd limit: the cut falls inside one.
    let huge = FunctionTool::new("huge", "Returns a lot.", |_: Nothing, _| async {
        Ok::<_, ToolError>("é".repeat(5_000))
    })
    .shared();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("huge", &json!({})),
        ScriptedResponse::text("Done."),
    ]));
    let limits = AgentLimits { max_tool_output_bytes: 1_001, ..AgentLimits::default() };
    let runtime = runtime(&harness, Agent::builder("cut", model.clone()).tool(huge).limits(limits).build());
    let session = session_for(&runtime, "cut").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    assert!(matches!(turn.wait().await.unwrap(), TurnState::Done { .. }));
    let sent = model.requests().last().unwrap().messages.last().unwrap().text();
    let note = "\n[9000 more bytes of the tool's output were left out: at most 1001 bytes are kept]";
    assert_eq!(sent, format!("{}{note}", "é".repeat(500)));
    let stored = turn.events(Order::Asc).await.unwrap();
    let response = stored.iter().find_map(|event| match &event.payload {
        EventPayload::ToolResponse { content, .. } => Some(content.clone()),
        _ => None,
    });
    assert_eq!(response.as_deref(), Some(sent.as_str()), "the event and the history keep the same cut");

    // Under a limit set low, a failure still says why: errors keep at least 1,024 bytes.
    let why = format!("the backend refused: {}", "x".repeat(200));
    let failing = {
        let why = why.clone();
        FunctionTool::new("failing", "Fails.", move |_: Nothing, _| {
            let why = why.clone();
            async move { Err::<String, _>(ToolError::Failed(why)) }
        })
        .shared()
    };
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("failing", &json!({})),
        ScriptedResponse::text("It failed."),
    ]));
    let limits = AgentLimits { max_tool_output_bytes: 20, ..AgentLimits::default() };
    runtime.register(Agent::builder("terse", model.clone()).tool(failing).limits(limits).build());
    let session = session_for(&runtime, "terse").await;
    session.create_turn(TurnRequest::message("go")).await.unwrap().wait().await.unwrap();
    assert_eq!(model.requests().last().unwrap().messages.last().unwrap().text(), why);
}

/// Scenario.
pub async fn a_cancelled_turn_lets_a_running_tool_finish_within_the_grace_period(harness: Harness) {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let release = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (release, finished) = (release.clone(), finished.clone());
        FunctionTool::new("slow", "Takes its time.", move |_: Nothing, _| {
            let (started_tx, release, finished) = (started_tx.clone(), release.clone(), finished.clone());
            async move {
                if let Some(started) = started_tx.lock().unwrap().take() {
                    let _ = started.send(());
                }
                release.notified().await;
                finished.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolError>("slow result".to_owned())
            }
        })
    };
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::tool_call("slow", &json!({}))]));
    let limits = AgentLimits { cancel_grace: Duration::from_secs(30), ..AgentLimits::default() };
    let runtime = runtime(&harness, Agent::builder("slow", model).tool(slow.shared()).limits(limits).build());
    let session = session_for(&runtime, "slow").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    started_rx.await.unwrap();
    let cancelling = tokio::spawn({
        let turn = turn.clone();
        async move { turn.cancel().await }
    });
    // The turn waits for the tool; let it finish inside the grace period.
    tokio::task::yield_now().await;
    release.notify_one();
    cancelling.await.unwrap().unwrap();
    assert_eq!(finished.load(Ordering::SeqCst), 1);
    let state = turn.state().await.unwrap();
    assert!(
        matches!(state, TurnState::Cancelled { reason: CancellationReason::ClientCancelled, .. }),
        "{state:?}"
    );
    let stored = turn.events(Order::Asc).await.unwrap();
    let kept = stored.iter().any(|event| {
        matches!(&event.payload, EventPayload::ToolResponse { content, .. } if content == "slow result")
    });
    assert!(kept, "the result that finished in the grace period is kept");
    let journal = harness.store.journal(turn.id()).await.unwrap();
    assert!(journal[0].result.is_some());
}

/// A `hang` tool that never returns (and ignores cancellation), and what says it started.
fn hanging_tool_started() -> (FunctionTool<NoArguments>, tokio::sync::oneshot::Receiver<()>) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let started_tx = Arc::new(std::sync::Mutex::new(Some(started_tx)));
    let hang = FunctionTool::new("hang", "Never returns.", move |_: NoArguments, _| {
        let started_tx = started_tx.clone();
        async move {
            if let Some(started) = started_tx.lock().unwrap().take() {
                let _ = started.send(());
            }
            std::future::pending::<()>().await;
            Ok::<_, ToolError>(String::new())
        }
    });
    (hang, started_rx)
}

/// Scenario.
pub async fn a_tool_past_the_grace_period_is_abandoned_and_the_turn_ends_cancelled(harness: Harness) {
    let (hang, started_rx) = hanging_tool_started();
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::tool_call("hang", &json!({}))]));
    let limits = AgentLimits { cancel_grace: Duration::from_millis(20), ..AgentLimits::default() };
    let runtime = runtime(&harness, Agent::builder("hang", model).tool(hang.shared()).limits(limits).build());
    let session = session_for(&runtime, "hang").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    started_rx.await.unwrap();
    turn.cancel().await.unwrap();
    let state = turn.state().await.unwrap();
    assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
    // The journal shows the call started without a result: it is in doubt, not done.
    let journal = harness.store.journal(turn.id()).await.unwrap();
    assert!(journal[0].result.is_none());
}

/// Scenario: of two calls of one message, the one that finished is kept when the other
/// outlasts the cancellation's grace: its result is stored and is what the next turn's
/// model sees; only the abandoned call is closed as not completed.
pub async fn a_call_that_finished_is_kept_when_another_outlasts_the_grace(harness: Harness) {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    let (hang, started_rx) = hanging_tool_started();
    let quick = FunctionTool::new("quick", "Returns at once.", |_: Nothing, _| async {
        Ok::<_, ToolError>("quick result".to_owned())
    });
    let model = Arc::new(ScriptedModel::responder(|request| {
        if request.messages.iter().any(|message| message.role == Role::Tool) {
            ScriptedResponse::text("Seen.")
        } else {
            ScriptedResponse::tool_call("quick", &json!({})).with_tool_call("hang", &json!({}))
        }
    }));
    let limits = AgentLimits { cancel_grace: Duration::from_millis(20), ..AgentLimits::default() };
    let agent =
        Agent::builder("pair", model.clone()).tool(quick.shared()).tool(hang.shared()).limits(limits).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "pair").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    started_rx.await.unwrap();
    turn.cancel().await.unwrap();
    let state = turn.state().await.unwrap();
    assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
    let stored = turn.events(Order::Asc).await.unwrap();
    let responses: Vec<String> = stored
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::ToolResponse { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(responses, ["quick result"], "the finished call's result is kept");
    let next = session.create_turn(TurnRequest::message("and now?")).await.unwrap();
    next.wait().await.unwrap();
    let requests = model.requests();
    let last = requests.last().unwrap();
    let results: Vec<String> = last
        .messages
        .iter()
        .filter(|message| message.role == Role::Tool)
        .map(|message| message.text())
        .collect();
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0], "quick result", "the model sees what ran");
    // It started and was cut off: it may have had its effect.
    assert!(results[1].starts_with("The call may have run; its result is unknown"), "{results:?}");
}

/// Scenario.
pub async fn a_paused_turn_is_resumed_by_another_runtime_on_the_same_store(harness: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = |calls: Arc<AtomicUsize>| {
        let model = Arc::new(ScriptedModel::responder(|request| {
            match request.messages.last().map(|message| message.role) {
                Some(Role::Tool) => ScriptedResponse::text("Added."),
                _ => ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 2})),
            }
        }));
        Agent::builder("gated", model).tool(add_tool(calls)).requires_approval("add").build()
    };
    let first = runtime(&harness, agent(calls.clone()));
    let session = session_for(&first, "gated").await;
    let paused = session.create_turn(TurnRequest::message("add")).await.unwrap();
    let state = paused.wait().await.unwrap();
    let call_id = match &state.required_actions()[0].action {
        agentry_types::RequiredAction::ToolApproval { tool_calls, .. } => tool_calls[0].id.clone(),
        other => panic!("unexpected {other:?}"),
    };
    drop(first);

    let second = runtime(&harness, agent(calls.clone()));
    let session = second.get_session(session.id()).await.unwrap();
    let approve = TurnInputItem::allow(agentry_types::ThreadId::main(), call_id);
    let resumed = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
    assert_eq!(answer_text(&resumed.wait().await.unwrap()).as_deref(), Some("Added."));
    assert_eq!(resumed.previous_turn_id(), Some(paused.id()));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Scenario.
pub async fn a_tool_with_its_own_timeout_uses_it_instead_of_the_agents(harness: Harness) {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    let quick = FunctionTool::new("quick", "Must answer fast.", |_: Nothing, _| async {
        std::future::pending::<()>().await;
        Ok::<_, ToolError>(String::new())
    })
    .timeout(Duration::from_millis(30));
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("quick", &json!({})),
        ScriptedResponse::text("Too slow."),
    ]));
    // The agent's own limit is far longer: the tool's wins.
    let limits = AgentLimits { tool_timeout: Duration::from_secs(3600), ..AgentLimits::default() };
    let runtime =
        runtime(&harness, Agent::builder("quick", model.clone()).tool(quick.shared()).limits(limits).build());
    let session = session_for(&runtime, "quick").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    assert_eq!(answer_text(&turn.wait().await.unwrap()).as_deref(), Some("Too slow."));
    let result = model.requests()[1].messages.last().unwrap().text();
    assert!(result.contains("30ms"), "{result}");
}

/// Scenario.
pub async fn a_new_turn_chains_only_on_the_latest_turn(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("ok")));
    let runtime = runtime(&harness, Agent::builder("a", model).build());
    let session = session_for(&runtime, "a").await;
    let first = session.create_turn(TurnRequest::message("one")).await.unwrap();
    first.wait().await.unwrap();
    let second = session.create_turn(TurnRequest::message("two")).await.unwrap();
    second.wait().await.unwrap();
    let stale = TurnRequest {
        previous_turn_id: crate::PreviousTurn::Turn(first.id()),
        ..TurnRequest::message("three")
    };
    let refused = session.create_turn(stale).await;
    assert!(
        matches!(refused, Err(RunnerError::NotLatestTurn { turn_id }) if turn_id == first.id()),
        "{refused:?}"
    );
    let latest = TurnRequest {
        previous_turn_id: crate::PreviousTurn::Turn(second.id()),
        ..TurnRequest::message("three")
    };
    let third = session.create_turn(latest).await.unwrap();
    third.wait().await.unwrap();
    assert_eq!(third.previous_turn_id(), Some(second.id()));
}

/// Scenario.
pub async fn calls_left_open_by_a_stopped_turn_get_error_results_for_the_next_turn(harness: Harness) {
    let hang = hanging_tool();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("hang", &json!({})),
        ScriptedResponse::text("Starting over."),
    ]));
    let limits = AgentLimits {
        cancel_grace: Duration::from_millis(10),
        timeout: Some(Duration::from_millis(100)),
        ..AgentLimits::default()
    };
    let runtime =
        runtime(&harness, Agent::builder("hang", model.clone()).tool(hang.shared()).limits(limits).build());
    let session = session_for(&runtime, "hang").await;
    let stopped = session.create_turn(TurnRequest::message("go")).await.unwrap();
    assert!(matches!(stopped.wait().await.unwrap(), TurnState::Cancelled { .. }));
    let next = session.create_turn(TurnRequest::message("again")).await.unwrap();
    next.wait().await.unwrap();
    let seen = &model.requests()[1].messages;
    let closed = seen.iter().find(|message| message.role == Role::Tool).map(|message| message.text());
    assert!(
        closed.is_some_and(
            |text| text.starts_with("The call may have run") && text.contains("server-execution-timeout")
        ),
        "{seen:?}"
    );
}

/// Scenario.
pub async fn a_turn_running_in_one_runtime_is_cancelled_from_another_on_the_same_store(harness: Harness) {
    let (model, _gate) = GatedModel::new("never finishes");
    // The default lease time (30 s): the cancellation is looked for far more often than
    // leases are renewed, so it lands well within the wait below.
    let options = RuntimeOptions::default();
    let owner = Runtime::with_options(harness.store.clone(), options.clone());
    owner.register(Agent::builder("held", model).build());
    let session = owner.create_session("held", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("hold")).await.unwrap();
    let other = Runtime::with_options(harness.store.clone(), options);
    let remote = other.get_turn(turn.id()).await.unwrap();
    remote.cancel().await.unwrap();
    let state =
        tokio::time::timeout(Duration::from_secs(5), turn.wait()).await.expect("cancelled in time").unwrap();
    let TurnState::Cancelled { reason: CancellationReason::ClientCancelled, metrics, .. } = &state else {
        panic!("{state:?}")
    };
    // The cut-off call sent no usage: its estimate is counted, not zero.
    let metrics = metrics.as_ref().expect("a model call was made");
    assert!(metrics.total_output_tokens > 0 && metrics.total_input_tokens > 0, "{metrics:?}");
    remote.cancel().await.unwrap(); // idempotent once finished
}

/// Scenario.
pub async fn a_panicking_model_ends_the_turn_with_an_error_and_frees_the_session(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|request| {
        assert!(request.last_user_text().as_deref() != Some("explode"), "the model panics on purpose");
        ScriptedResponse::text("Still here.")
    }));
    let runtime = runtime(&harness, Agent::builder("fragile", model).build());
    let session = session_for(&runtime, "fragile").await;
    let turn = session.create_turn(TurnRequest::message("explode")).await.unwrap();
    let events = collect(turn.stream(None)).await;
    assert_eq!(events.last().map(|event| event.payload.kind()), Some("turn.done"));
    let state = turn.wait().await.unwrap();
    assert!(
        matches!(&state, TurnState::Error { message, .. }
            if message.contains("stopped unexpectedly") && message.contains("the model panics on purpose")),
        "{state:?}"
    );
    assert!(matches!(turn.state().await.unwrap(), TurnState::Error { .. }), "the error state is stored");
    let next = session.create_turn(TurnRequest::message("hello")).await.unwrap();
    assert!(matches!(next.wait().await.unwrap(), TurnState::Done { .. }), "the session takes new turns");
}

/// Scenario.
pub async fn a_panicking_tool_fails_its_call_and_the_turn_goes_on(harness: Harness) {
    let model = Arc::new(ScriptedModel::responder(|request| match request.messages.last().map(|m| m.role) {
        Some(Role::Tool) => {
            ScriptedResponse::text(format!("The tool said: {}", request.messages.last().unwrap().text()))
        }
        _ => ScriptedResponse::tool_call("fragile", &json!({"a": 1, "b": 2})),
    }));
    let fragile = FunctionTool::new("fragile", "Breaks.", |_args: AddArgs, _context| async move {
        if true {
            panic!("the tool panics on purpose");
        }
        Ok::<_, ToolError>(String::new())
    })
    .shared();
    let runtime = runtime(&harness, Agent::builder("brittle", model).tool(fragile).build());
    let session = session_for(&runtime, "brittle").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    let state = turn.wait().await.unwrap();
    assert_eq!(
        answer_text(&state).as_deref(),
        Some("The tool said: the tool failed: it panicked (the tool panics on purpose)"),
        "{state:?}"
    );
    // Journaled complete: a recovery would not run it again.
    let journal = harness.store.journal(turn.id()).await.unwrap();
    assert!(
        journal.iter().all(|entry| entry.result.as_ref().is_some_and(|result| result.is_error)),
        "{journal:?}"
    );
}

/// Scenario: a caller that drops `create_turn` part way (an HTTP client that disconnects)
/// leaves the session free for the next turn, and a turn whose first step was stored runs
/// to its end. The future is dropped after 1, 2, … 256 polls, so the drop lands at each of
/// its waits on the store (on the in-memory store it finishes on its first poll), each
/// time over an expired lease a dead process left, and every other time over a turn it
/// left running too (which a start resumes under the lease, answering `TurnResumed`).
pub async fn a_dropped_create_turn_frees_the_session_and_a_stored_turn_runs_to_its_end(harness: Harness) {
    let model = Arc::new(ScriptedModel::new((0..120).map(|_| ScriptedResponse::text("done")).collect()));
    let runtime = runtime(&harness, Agent::builder("quick", model).build());
    let session = session_for(&runtime, "quick").await;
    let drop_points = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 80, 96, 128, 160, 192, 256];
    let mut left = Vec::new();
    for (index, polls) in drop_points.into_iter().enumerate() {
        left.extend(leave_a_dead_process(&harness, &session, index % 2 == 1).await);
        let mut creating = Box::pin(session.create_turn(TurnRequest::message(format!("dropped {polls}"))));
        for _ in 0..polls {
            if futures_util::poll!(creating.as_mut()).is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(creating);
        // The next turn starts once whatever the dropped call left is given back or run.
        let next = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match session.create_turn(TurnRequest::message(format!("after {polls}"))).await {
                    Ok(turn) => return turn,
                    Err(RunnerError::TurnRunning { .. } | RunnerError::TurnResumed { .. }) => {
                        // A dropped start's turn, or the dead process's, which a start
                        // resumed, runs to its end. A resumption the drop cut short left the
                        // dead process's turn to the next start: the wait is bounded.
                        let running = session.list_turns(Order::Desc, &PageRequest::first(1)).await.unwrap();
                        for turn in &running.items {
                            let _ = tokio::time::timeout(Duration::from_millis(100), turn.wait()).await;
                        }
                        tokio::task::yield_now().await;
                    }
                    Err(other) => panic!("unexpected error {other}"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| {
            panic!("the session stayed blocked after a create_turn dropped after {polls} polls")
        });
        assert_eq!(answer_text(&next.wait().await.unwrap()).as_deref(), Some("done"));
    }
    // Dropped the moment its first step is stored, before it hears so: the turn runs. Each
    // time the call waits, the turns are watched for a while without polling the call: once
    // its first step is on its way to the store, the step is seen stored before the call can
    // hear so. Half the rounds start after a turn the dead process left running, which a
    // first start resumes (and is told so, with the turn's id).
    let (mut waited, mut in_window) = (0, [0, 0]);
    for round in 0..8 {
        let over_a_running_turn = round % 2 == 1;
        if let Some(dead) = leave_a_dead_process(&harness, &session, over_a_running_turn).await {
            let refused = session.create_turn(TurnRequest::message("too early")).await;
            assert!(
                matches!(refused, Err(RunnerError::TurnResumed { turn_id, .. }) if turn_id == dead),
                "{refused:?}"
            );
            let state = runtime.get_turn(dead).await.unwrap().wait().await.unwrap();
            assert_eq!(answer_text(&state).as_deref(), Some("done"), "the resumed turn ran: {state:?}");
            left.push(dead);
        }
        let stored =
            || async { session.list_turns(Order::Asc, &PageRequest::first(100)).await.unwrap().items.len() };
        let before = stored().await;
        let mut creating = Box::pin(session.create_turn(TurnRequest::message(format!("stored {round}"))));
        while futures_util::poll!(creating.as_mut()).is_pending() {
            waited += 1;
            let watching = async {
                while stored().await == before {
                    tokio::task::yield_now().await;
                }
            };
            if tokio::time::timeout(Duration::from_millis(100), watching).await.is_ok() {
                in_window[usize::from(over_a_running_turn)] += 1;
                break;
            }
        }
        drop(creating);
        let latest = session.list_turns(Order::Desc, &PageRequest::first(1)).await.unwrap().items;
        let state = tokio::time::timeout(Duration::from_secs(10), latest[0].wait()).await.unwrap().unwrap();
        assert_eq!(answer_text(&state).as_deref(), Some("done"), "{state:?}");
    }
    // A store that answers at once (in memory) has no such moment.
    if waited > 0 {
        assert!(in_window.iter().all(|rounds| *rounds > 0), "calls dropped once stored: {in_window:?}");
    }
    // No turn is left running, every stored turn answered and its log ends with its
    // `turn.done`, those the dead process left too (resumed, none thrown away), and the
    // turns chain in a line.
    let turns = session.list_turns(Order::Asc, &PageRequest::first(100)).await.unwrap().items;
    assert!(turns.len() >= drop_points.len(), "{} turns", turns.len());
    for pair in turns.windows(2) {
        assert_eq!(pair[1].previous_turn_id(), Some(pair[0].id()), "{:?}", pair[1].record());
    }
    for turn in &turns {
        let state = turn.wait().await.unwrap();
        assert_eq!(answer_text(&state).as_deref(), Some("done"), "{state:?}");
        let events = turn.events(Order::Asc).await.unwrap();
        assert_eq!(events.last().map(|event| event.payload.kind()), Some("turn.done"));
    }
    assert_eq!(left.len(), drop_points.len() / 2 + 4);
    assert!(left.iter().all(|dead| turns.iter().any(|turn| turn.id() == *dead)), "every left turn is kept");
    assert_eq!(harness.store.lease(session.id()).await.unwrap(), None);
}

/// Scenario: recovery passes running beside live turns leave them alone; a turn that ends
/// between a pass's listing of running turns and its lease request is not resumed (and
/// ended a second time).
pub async fn recovery_passes_beside_live_turns_leave_them_alone(harness: Harness) {
    let model = Arc::new(ScriptedModel::new((0..100).map(|_| ScriptedResponse::text("done")).collect()));
    let runtime = runtime(&harness, Agent::builder("quick", model).build());
    let mut sessions = Vec::new();
    for _ in 0..8 {
        sessions.push(session_for(&runtime, "quick").await);
    }
    let conversations = futures_util::future::join_all(sessions.iter().map(|session| async move {
        for turn in 0..10 {
            let started = session.create_turn(TurnRequest::message(format!("turn {turn}"))).await;
            started.unwrap().wait().await.unwrap();
        }
    }));
    let recovering = async {
        loop {
            let resumed = runtime.recover().await.unwrap();
            assert!(
                resumed.is_empty(),
                "a pass resumed live turns: {:?}",
                resumed.iter().map(TurnHandle::id)
            );
            tokio::task::yield_now().await;
        }
    };
    tokio::select! {
        _ = conversations => {}
        () = recovering => {}
    }
    for session in &sessions {
        let turns = session.list_turns(Order::Asc, &PageRequest::first(100)).await.unwrap().items;
        assert_eq!(turns.len(), 10);
        for turn in &turns {
            assert_eq!(answer_text(&turn.wait().await.unwrap()).as_deref(), Some("done"));
            let events = turn.events(Order::Asc).await.unwrap();
            let ends = events.iter().filter(|event| event.payload.kind() == "turn.done").count();
            assert_eq!(ends, 1, "turn {} ended {ends} times", turn.id());
        }
        assert_eq!(harness.store.lease(session.id()).await.unwrap(), None);
    }
}

/// Scenario: a runtime about to stop hands its running turn over. Its engine stops at once,
/// while its model's reply is held back, without ending the turn; another runtime on the same store recovers it at
/// once, without waiting out the lease time (30 s here); the first takes no new turns and
/// recovers none, and the turn ends once, in the second.
pub async fn a_handed_over_turn_is_recovered_at_once_by_another_runtime(harness: Harness) {
    let (held, _gate) = GatedModel::new("held back");
    let first = runtime(&harness, Agent::builder("held", held).build());
    let session = session_for(&first, "held").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    let mut live = turn.stream(None);
    until_first_delta(&mut live).await;
    assert!(first.recover().await.unwrap().is_empty(), "the lease is live: nothing to recover");
    assert_eq!(first.hand_over().await, 1);
    let refused = session.create_turn(TurnRequest::message("again")).await;
    assert!(matches!(refused, Err(RunnerError::HandedOver)), "{:?}", refused.map(|turn| turn.id()));
    assert!(first.recover().await.unwrap().is_empty(), "its own turns are for another process");

    // The first engine stops at once, its model's reply still held back, without ending the
    // turn (its end is refused): the stored turn is still running, with nothing of its
    // model's message.
    let stopped = tokio::time::timeout(Duration::from_secs(30), turn.wait()).await;
    let state = stopped.expect("the handed-over engine stops while its model's reply is held back").unwrap();
    assert!(matches!(state, TurnState::Running), "the handed-over turn ended here");
    assert!(
        turn.events(Order::Asc).await.unwrap().iter().all(|event| event.payload.kind() == "turn.created")
    );

    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("recovered")]));
    let second = runtime(&harness, Agent::builder("held", model).build());
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    assert_eq!(answer_text(&resumed[0].wait().await.unwrap()).as_deref(), Some("recovered"));
    // The stream opened on the first runtime did not end with the hand-over: it followed
    // the turn through the store to the end the second runtime gave it.
    let rest = tokio::time::timeout(Duration::from_secs(30), collect(live)).await.expect("the stream ends");
    assert_eq!(kinds(&rest).last(), Some(&"turn.done"), "{:?}", kinds(&rest));
    let events = turn.events(Order::Asc).await.unwrap();
    assert_eq!(events.iter().filter(|event| event.payload.kind() == "turn.done").count(), 1);
    assert_eq!(events.iter().filter(|event| event.payload.kind() == "model.message").count(), 1);
    let again = second.get_session(session.id()).await.unwrap();
    let next = again.create_turn(TurnRequest::message("more")).await;
    assert!(next.is_ok(), "the session takes turns again in the second runtime");
}

/// Scenario: `hand_over` racing `create_turn`, at every point of the start: the start is
/// refused, or the turn it starts is handed over too (its model is held back until after
/// `hand_over`, so only a turn left running here could end).
pub async fn a_turn_starting_while_its_runtime_hands_over_is_handed_over_too(harness: Harness) {
    let mut started = 0;
    for yields in 0..24 {
        let (held, gate) = GatedModel::new("held back");
        let runtime = runtime(&harness, Agent::builder("held", held).build());
        let session = session_for(&runtime, "held").await;
        let creating = tokio::spawn(async move { session.create_turn(TurnRequest::message("go")).await });
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
        runtime.hand_over().await;
        gate.add_permits(1);
        match creating.await.unwrap() {
            Err(RunnerError::HandedOver) => {}
            Err(error) => panic!("{error:?}"),
            Ok(turn) => {
                started += 1;
                let stopped = tokio::time::timeout(Duration::from_secs(30), turn.wait()).await;
                let state = stopped.expect("a handed-over engine stops").unwrap();
                assert!(
                    matches!(state, TurnState::Running),
                    "after {yields} yields the turn ended here: {state:?}"
                );
            }
        }
    }
    assert!(started > 0, "every start was refused: no turn raced the hand-over");
}

/// Scenario: a client of a restarted server reaches it before its recovery pass took the
/// turns over (the server serves while the pass runs). A stream opened then follows the
/// stored log, and switches to the live log once the pass runs the turn here (it gets the
/// recovered turn's deltas); a cancellation asked for then is stored, and the recovered
/// turn acts on it at once rather than at its lease keeper's round (minutes away here).
pub async fn a_turn_followed_or_cancelled_before_this_process_recovers_it_is_then_live_here(
    harness: Harness,
) {
    let (held, _gate) = GatedModel::new("held back");
    let options = RuntimeOptions {
        lease_ttl: Duration::from_secs(600),
        live_retention: Duration::from_secs(600),
        ..RuntimeOptions::default()
    };
    let first = Runtime::with_options(harness.store.clone(), options.clone());
    first.register(Agent::builder("held", held.clone()).build());
    let (followed, cancelled) = (session_for(&first, "held").await, session_for(&first, "held").await);
    let mut turns = Vec::new();
    for session in [&followed, &cancelled] {
        let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
        until_first_delta(&mut turn.stream(None)).await;
        turns.push(turn);
    }
    assert_eq!(first.hand_over().await, 2);
    for turn in &turns {
        assert!(matches!(turn.wait().await.unwrap(), TurnState::Running));
    }

    // The restarted process, before its recovery pass.
    let second = Runtime::with_options(harness.store.clone(), options);
    let streamed = ScriptedResponse { chunk_chars: Some(2), ..ScriptedResponse::text("recovered here") };
    second.register(Agent::builder("held", Arc::new(ScriptedModel::new(vec![streamed]))).build());
    let here = second.get_turn(turns[0].id()).await.unwrap();
    let stored_seq = here.events(Order::Asc).await.unwrap().last().unwrap().seq;
    let following = tokio::spawn(collect(here.stream(Some(stored_seq))));
    // Cancelled through the first runtime's handle: the turn is no longer its to cancel,
    // so the request is stored for whoever recovers it.
    turns[1].cancel().await.unwrap();
    tokio::task::yield_now().await;

    let mut resumed = second.recover().await.unwrap();
    resumed.sort_by_key(|turn| turns.iter().position(|mine| mine.id() == turn.id()));
    assert_eq!(
        resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(),
        turns.iter().map(TurnHandle::id).collect::<Vec<_>>()
    );
    let within = Duration::from_secs(30);
    let events = tokio::time::timeout(within, following)
        .await
        .expect("the stream ends with the recovered turn")
        .unwrap();
    let deltas = events.iter().filter(|event| event.payload.kind() == "model.message.delta").count();
    assert!(deltas > 0, "followed from the store only: {:?}", kinds(&events));
    assert_eq!(kinds(&events).last(), Some(&"turn.done"));
    let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
    assert!(seqs.first().is_some_and(|first| *first > stored_seq), "{seqs:?}");
    assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{seqs:?}");
    assert_eq!(answer_text(&resumed[0].wait().await.unwrap()).as_deref(), Some("recovered here"));

    let state = tokio::time::timeout(within, resumed[1].wait()).await;
    let state = state.expect("the stored cancellation is acted on at once").unwrap();
    assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
}

/// Scenario: a turn handed over while its memory update asks for a summary stops at once,
/// its update cut (the session is the next holder's, and so is its summary), and the
/// process that recovers the turn updates the summary and the profile.
pub async fn a_turn_handed_over_while_its_summary_is_written_leaves_the_summary_alone(harness: Harness) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let analysis = analysis_model("A summary from the old holder.", r#"{"likes": "tea"}"#);
    let held = Arc::new(HeldSummaries { inner: analysis, gate: gate.clone() });
    let model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("Noted.")));
    let config = agentry_memory::MemoryConfig {
        summary_memory: true,
        user_analysis_memory: true,
        ..agentry_memory::MemoryConfig::default()
    };
    let agent = |analysis: Arc<dyn Model>| {
        Agent::builder("remember", model.clone()).memory(config.clone(), Some(analysis)).build()
    };
    let first = runtime(&harness, agent(held));
    let session = session_for(&first, "remember").await;
    let turn = session.create_turn(TurnRequest::message("I like tea.")).await.unwrap();
    let mut live = turn.stream(None);
    until_kind(&mut live, "memory.update.started").await;
    assert_eq!(first.hand_over().await, 1);
    // The summary's model answers only now, after the turn's lease was fenced.
    gate.add_permits(1);
    let stopped = tokio::time::timeout(Duration::from_secs(30), turn.wait()).await;
    let state = stopped.expect("the handed-over engine stops").unwrap();
    assert!(matches!(state, TurnState::Running), "the handed-over turn ended here: {state:?}");
    let stored = harness.store.get_session(session.id()).await.unwrap();
    assert_eq!(stored.summary, None, "the old holder stored its summary");
    // The update asks for the summary first: cut there, it stored no profile either.
    assert!(harness.store.profile("local").await.unwrap().is_none(), "the old holder's update went on");

    let second = runtime(&harness, agent(analysis_model("Recovered summary.", r#"{"likes": "coffee"}"#)));
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    assert_eq!(answer_text(&resumed[0].wait().await.unwrap()).as_deref(), Some("Noted."));
    let stored = harness.store.get_session(session.id()).await.unwrap();
    assert_eq!(stored.summary.map(|summary| summary.summary).as_deref(), Some("Recovered summary."));
    let profile = harness.store.profile("local").await.unwrap().expect("the profile is the user's");
    assert_eq!(profile.profile["likes"], "coffee");
}

/// An analysis model whose summaries wait for a permit of `gate`.
#[derive(Debug)]
struct HeldSummaries {
    inner: Arc<ScriptedModel>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl Model for HeldSummaries {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        if asks_for_a_summary(&request) {
            let _permit = self.gate.acquire().await.map_err(|_| ModelError::Disconnected)?;
        }
        self.inner.stream(request).await
    }
}

/// Scenario: a recovery pass resumes the turns left running under lapsed leases and only
/// those: it looks at the sessions with a lease, so neither the many finished sessions nor
/// a run an application stored as running without a lease are its business. A start that
/// took over a dead process's lease and failed lets it lapse instead of deleting it, so the
/// dead turn is still found; a lapsed lease with no running turn is deleted.
pub async fn a_recovery_pass_resumes_only_turns_under_lapsed_leases(harness: Harness) {
    let model = Arc::new(ScriptedModel::new((0..100).map(|_| ScriptedResponse::text("done")).collect()));
    let runtime = runtime(&harness, Agent::builder("quick", model).build());
    for _ in 0..20 {
        let finished = session_for(&runtime, "quick").await;
        finished.create_turn(TurnRequest::message("hi")).await.unwrap().wait().await.unwrap();
    }
    let crashed = session_for(&runtime, "quick").await;
    let left = leave_a_dead_process(&harness, &crashed, true).await.unwrap();
    // A start that takes the dead process's lease over and is then refused (it names a
    // turn that is not the latest).
    let refused_over = session_for(&runtime, "quick").await;
    let left_under_refused = leave_a_dead_process(&harness, &refused_over, true).await.unwrap();
    let mut wrong = TurnRequest::message("chained wrong");
    wrong.previous_turn_id = crate::PreviousTurn::Turn(agentry_types::TurnId::new());
    assert!(refused_over.create_turn(wrong).await.is_err());
    // A start over a turn a dead process left running resumes it, whatever its input, and
    // is told `TurnResumed`: the turn is not thrown away, and the pass has nothing to do.
    let resumed_by_start = session_for(&runtime, "quick").await;
    let left_under_start = leave_a_dead_process(&harness, &resumed_by_start, true).await.unwrap();
    let approval = vec![TurnInputItem::allow(agentry_types::ThreadId::main(), "x")];
    let refused = resumed_by_start.create_turn(TurnRequest::input(approval)).await;
    assert!(
        matches!(refused, Err(RunnerError::TurnResumed { turn_id, .. }) if turn_id == left_under_start),
        "{refused:?}"
    );
    let state = runtime.get_turn(left_under_start).await.unwrap().wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("done"), "{state:?}");
    let events = runtime.get_turn(left_under_start).await.unwrap().events(Order::Asc).await.unwrap();
    assert_eq!(events.last().map(|event| event.payload.kind()), Some("turn.done"));
    let lapsed = session_for(&runtime, "quick").await;
    leave_a_dead_process(&harness, &lapsed, false).await;
    let unleased = session_for(&runtime, "quick").await;
    let mut outside =
        agentry_types::RunRecord::new(unleased.id(), vec![], agentry_types::Subject::user("an application"));
    outside.status = agentry_types::RunStatus::Running;
    harness.store.put_run(&outside, None).await.unwrap();

    let resumed = runtime.recover().await.unwrap();
    let mut ids: Vec<_> = resumed.iter().map(TurnHandle::id).collect();
    ids.sort();
    let mut expected = vec![left, left_under_refused];
    expected.sort();
    assert_eq!(ids, expected);
    for turn in &resumed {
        let state = turn.wait().await.unwrap();
        assert!(!matches!(state, TurnState::Running), "{state:?}");
    }
    for session in [&crashed, &refused_over, &resumed_by_start, &lapsed] {
        assert_eq!(harness.store.lease(session.id()).await.unwrap(), None, "every lease was given back");
    }
    assert_eq!(harness.store.get_run(outside.id).await.unwrap().status, agentry_types::RunStatus::Running);
    assert!(runtime.recover().await.unwrap().is_empty(), "a second pass finds nothing more");
    for session in [&refused_over, &lapsed] {
        let next = session.create_turn(TurnRequest::message("again")).await.unwrap();
        assert_eq!(answer_text(&next.wait().await.unwrap()).as_deref(), Some("done"));
    }
}

/// Scenario: a dead process that stored a member run and stopped before its thread's first
/// event leaves no run running for ever: the recovered turn ends it with an error, and
/// the turn goes on to its end.
pub async fn a_member_run_stored_just_before_a_crash_ends_when_its_turn_is_recovered(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("done")]));
    let runtime = runtime(&harness, Agent::builder("quick", model).build());
    let session = session_for(&runtime, "quick").await;
    let left = leave_a_dead_process(&harness, &session, true).await.unwrap();
    let mut member = agentry_types::RunRecord::new(
        session.id(),
        vec![TurnInputItem::message("help")],
        agentry_types::Subject::user("dead"),
    );
    member.parent_run_id = Some(left);
    member.thread_id = Some(agentry_types::ThreadId::new_sub_thread());
    member.agent_id = Some("helper".to_owned());
    harness.store.put_run(&member, None).await.unwrap();
    let resumed = runtime.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [left]);
    let state = resumed[0].wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("done"), "{state:?}");
    let ended = harness.store.get_run(member.id).await.unwrap();
    assert!(
        matches!(&ended.state, TurnState::Error { message, .. } if message.starts_with("interrupted")),
        "{:?}",
        ended.state
    );
}

/// Scenario: a delegating call whose thread had answered when its process stopped (before
/// the call's own result was stored) runs again on the thread's stored answer, without
/// asking anyone: the sub-agent does not run twice and the turn goes on to its end.
pub async fn a_delegation_whose_thread_had_answered_is_not_in_doubt_after_a_crash(harness: Harness) {
    let helper_model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse::text("helped")));
    let helper = Agent::builder("helper", helper_model.clone()).build();
    let (after_thread_tx, after_thread_rx) = tokio::sync::oneshot::channel::<()>();
    let after_thread = Arc::new(std::sync::Mutex::new(Some(after_thread_tx)));
    let delegate = {
        let (helper, after_thread) = (helper.clone(), after_thread.clone());
        FunctionTool::new("delegate", "Asks the helper.", move |_: NoArguments, context| {
            let (helper, after_thread) = (helper.clone(), after_thread.clone());
            async move {
                let answer = context.run_thread(&helper, "Help.", "helper").await?.answer;
                // The first process stops here, after the thread's end and before the
                // call's result is stored.
                let stopped = after_thread.lock().unwrap().take();
                if let Some(stopped) = stopped {
                    let _ = stopped.send(());
                    std::future::pending::<()>().await;
                }
                Ok::<_, ToolError>(format!("helper: {answer}"))
            }
        })
        .ends_on_cancel()
        .resumes_threads()
        .shared()
    };
    let model = Arc::new(ScriptedModel::responder(|request| match request.messages.last() {
        Some(message) if message.role == Role::Tool => {
            ScriptedResponse::text(format!("Done, {}", message.text()))
        }
        _ => ScriptedResponse::tool_call("delegate", &json!({})),
    }));
    let agent = |model: Arc<ScriptedModel>| Agent::builder("lead", model).tool(delegate.clone()).build();
    let first = runtime(&harness, agent(model.clone()));
    let session = session_for(&first, "lead").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    after_thread_rx.await.unwrap();
    assert_eq!(first.hand_over().await, 1);
    let second = runtime(&harness, agent(model));
    let resumed = second.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [turn.id()]);
    let state = resumed[0].wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Done, helper: helped"), "{state:?}");
    assert_eq!(helper_model.requests().len(), 1, "the helper answered once");
}

/// Scenario: a recovery pass in a process without the session's agent leaves the turn a
/// dead process left for a process that has the agent, unless its cancellation is stored:
/// then it ends it cancelled; one whose agent has a problem ends it with an error. Either
/// way its `turn.done` is stored, numbered above every `seq` the dead process reserved: a
/// client following the turn sees it end, and the session goes on.
pub async fn a_turn_recovered_without_its_agent_or_with_a_broken_one_ends_with_a_stored_turn_done(
    harness: Harness,
) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("done")]));
    let runtime = runtime(&harness, Agent::builder("quick", model).build());
    let session = session_for(&runtime, "quick").await;
    let left = leave_a_dead_process(&harness, &session, true).await.unwrap();
    // The dead process had the model call a tool, which never answered: the ended turn's
    // history gives the call a result, or every later turn's model would refuse it.
    let mut asked = agentry_types::Message::assistant("Let me add.");
    asked.tool_calls = vec![agentry_types::ToolCall::function("call_left", "add", "{}")];
    let said = [Arc::new(agentry_types::Message::user("left running")), Arc::new(asked)];
    harness.store.append_messages(left, &said, None).await.unwrap();
    let reserved = harness.store.high_water(left).await.unwrap();
    let stranger = Runtime::new(harness.store.clone());
    assert!(stranger.recover().await.unwrap().is_empty(), "nothing to resume without the agent");
    let waiting = harness.store.get_run(left).await.unwrap();
    assert_eq!(waiting.status, agentry_types::RunStatus::Running, "left for a process with the agent");
    // Cancelled through the stranger (where it does not run): the stranger's next pass
    // ends it, which needs no agent.
    stranger.get_turn(left).await.unwrap().cancel().await.unwrap();
    assert!(stranger.recover().await.unwrap().is_empty());
    let turn = runtime.get_turn(left).await.unwrap();
    let state = turn.wait().await.unwrap();
    assert!(
        matches!(&state, TurnState::Cancelled { reason: CancellationReason::ClientCancelled, .. }),
        "{state:?}"
    );
    let events = turn.events(Order::Asc).await.unwrap();
    let done = events.last().expect("the turn has events");
    assert_eq!(done.payload.kind(), "turn.done");
    assert!(done.seq > reserved, "turn.done is numbered {} after {reserved} reserved", done.seq);
    let followed = collect(turn.stream(None)).await;
    assert_eq!(
        followed.last().map(|event| event.payload.kind()),
        Some("turn.done"),
        "a follower sees the end"
    );
    assert_eq!(harness.store.lease(session.id()).await.unwrap(), None, "the lease was released");
    let next = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    assert_eq!(answer_text(&next.wait().await.unwrap()).as_deref(), Some("done"));
    // Nor does a process whose agent of that name has a problem (which `create_turn`
    // refuses to run: here a misspelt `requires_approval` would leave its tool ungated).
    let crashed = session_for(&runtime, "quick").await;
    let left = leave_a_dead_process(&harness, &crashed, true).await.unwrap();
    let called = Arc::new(AtomicUsize::new(0));
    let counting = {
        let called = called.clone();
        Arc::new(ScriptedModel::responder(move |_| {
            called.fetch_add(1, Ordering::SeqCst);
            ScriptedResponse::text("ran")
        }))
    };
    let misconfigured = Runtime::new(harness.store.clone());
    misconfigured.register(Agent::builder("quick", counting).requires_approval("send_mail").build());
    assert!(misconfigured.recover().await.unwrap().is_empty(), "nothing to resume with a broken agent");
    let state = runtime.get_turn(left).await.unwrap().wait().await.unwrap();
    assert!(
        matches!(&state, TurnState::Error { message, .. }
            if message.contains("agent quick cannot resume") && message.contains("send_mail")),
        "{state:?}"
    );
    assert_eq!(called.load(Ordering::SeqCst), 0, "the broken agent's model was never called");
    assert_eq!(harness.store.lease(crashed.id()).await.unwrap(), None, "the lease was released");
}

/// Scenario: an input and an answer each under the record limit but over it together (the
/// turn's end state holds both) end the turn with an error, stored with its `turn.done`
/// and the answer in its events, instead of leaving the turn for recovery passes that
/// would call the model again and fail the same way for ever.
pub async fn an_end_too_large_to_keep_with_its_input_fails_the_turn_once(harness: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let echo = {
        let calls = calls.clone();
        Arc::new(ScriptedModel::responder(move |request| {
            calls.fetch_add(1, Ordering::SeqCst);
            let said = request
                .messages
                .last()
                .and_then(|message| message.content.as_ref())
                .map(|content| content.text());
            ScriptedResponse {
                chunk_chars: Some(1 << 20),
                ..ScriptedResponse::text(said.unwrap_or_default())
            }
        }))
    };
    let runtime = runtime(&harness, Agent::builder("echo", echo).build());
    let session = session_for(&runtime, "echo").await;
    let text = "y".repeat(agentry_memory::MAX_RECORD_BYTES / 2 + 1024);
    let turn = session.create_turn(TurnRequest::message(text.clone())).await.unwrap();
    let state = turn.wait().await.unwrap();
    assert!(
        matches!(&state, TurnState::Error { message, .. } if message.contains("too large to keep with its input")),
        "{state:?}"
    );
    let events = turn.events(Order::Asc).await.unwrap();
    assert_eq!(events.last().map(|event| event.payload.kind()), Some("turn.done"));
    let answer = events.iter().find_map(|event| match &event.payload {
        EventPayload::ModelMessage(message) => message.content.clone(),
        _ => None,
    });
    assert_eq!(answer.map(|answer| answer.len()), Some(text.len()), "the answer is kept in the events");
    assert!(runtime.recover().await.unwrap().is_empty(), "nothing is left for recovery");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the model was called once");
    assert_eq!(harness.store.lease(session.id()).await.unwrap(), None);
}

/// Scenario: an input that fills the record limit leaves no room for the turn's end, so the
/// start is refused as too large, before the model is called and with nothing stored; the
/// session goes on.
pub async fn an_input_leaving_no_room_for_the_end_is_refused_at_the_start(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Fine.")]));
    let runtime = runtime(&harness, Agent::builder("full", model.clone()).build());
    let session = session_for(&runtime, "full").await;
    let text = "z".repeat(agentry_memory::MAX_RECORD_BYTES - 1024);
    let refused = session.create_turn(TurnRequest::message(text)).await;
    match refused {
        Err(RunnerError::Store(StoreError::TooLarge { what, size, limit })) => {
            assert_eq!(what, "a new turn with its input");
            assert!(size > limit && limit < agentry_memory::MAX_RECORD_BYTES, "{size} {limit}");
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(session.list_turns(Order::Asc, &PageRequest::first(10)).await.unwrap().items.is_empty());
    assert!(model.requests().is_empty(), "the model was not called");
    let next = session.create_turn(TurnRequest::message("hi")).await.unwrap();
    assert_eq!(answer_text(&next.wait().await.unwrap()).as_deref(), Some("Fine."));
}

/// Scenario: a start on a session whose turn runs here under a lapsed lease (a keeper that
/// could not renew it for a while) is refused without taking the lease: the running turn
/// is not fenced out, and ends as it would have.
pub async fn a_start_beside_a_live_turn_whose_lease_lapsed_leaves_it_running(harness: Harness) {
    let (held, gate) = GatedModel::new("held back");
    let runtime = runtime(&harness, Agent::builder("held", held).build());
    let session = session_for(&runtime, "held").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    until_first_delta(&mut turn.stream(None)).await;
    let lease = harness.store.lease(session.id()).await.unwrap().expect("the turn's lease");
    let now = agentry_types::Timestamp::now();
    harness.store.renew_lease(session.id(), lease.token, Duration::ZERO, now).await.unwrap();
    let refused = session.create_turn(TurnRequest::message("again")).await;
    assert!(matches!(refused, Err(RunnerError::TurnRunning { .. })), "{refused:?}");
    let after = harness.store.lease(session.id()).await.unwrap().expect("a lease");
    assert_eq!(after.token, lease.token, "the start did not take the lease");
    assert!(runtime.recover().await.unwrap().is_empty(), "a pass leaves a turn running here alone");
    gate.add_permits(1);
    let state = turn.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("held back"), "{state:?}");
}

/// Leaves what a dead process left behind: its expired lease on the session and, with
/// `with_running_turn`, a turn it left running on the latest one (returned).
async fn leave_a_dead_process(
    harness: &Harness,
    session: &Session,
    with_running_turn: bool,
) -> Option<agentry_types::TurnId> {
    let past = agentry_types::Timestamp::from_unix_micros(
        agentry_types::Timestamp::now().unix_micros() - 60_000_000,
    );
    let dead = harness
        .store
        .acquire_lease(session.id(), "a dead process", Duration::from_secs(1), past)
        .await
        .unwrap();
    if !with_running_turn {
        return None;
    }
    let latest = session.list_turns(Order::Desc, &PageRequest::first(1)).await.unwrap().items;
    let input = vec![TurnInputItem::message("left running")];
    let mut left = agentry_types::RunRecord::new(session.id(), input, agentry_types::Subject::user("dead"));
    left.previous_turn_id = latest.first().map(TurnHandle::id);
    harness.store.put_run(&left, Some(dead.fence())).await.unwrap();
    Some(left.id)
}

/// Scenario: a turn that answered an earlier turn's call, left by a dead process that ran
/// the call, is ended without resuming (cancelled where its agent is not registered):
/// the call gets its result in the history, the one its journal holds, so the session's
/// next turn is answered, and its model sees what the call returned.
pub async fn a_left_turn_that_answered_an_earlier_call_closes_it_when_ended(harness: Harness) {
    let asks = ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 1}));
    let answers = ScriptedResponse::text("Hello again.");
    let model = Arc::new(ScriptedModel::new(vec![asks.clone(), answers.clone(), asks, answers]));
    let agent = Agent::builder("gated", model.clone())
        .tool(add_tool(Arc::default()))
        .requires_approval("add")
        .build();
    let runtime = runtime(&harness, agent);
    // The call ran (its journal holds the result), or started and may have run.
    for completed in [true, false] {
        let session = session_for(&runtime, "gated").await;
        let first = session.create_turn(TurnRequest::message("Add 1 and 1")).await.unwrap();
        assert_eq!(first.wait().await.unwrap().required_actions().len(), 1);
        let call = first.wait().await.unwrap().required_actions()[0].clone();
        let agentry_types::RequiredAction::ToolApproval { tool_calls, .. } = &call.action else {
            panic!("{call:?}")
        };
        let call_id = tool_calls[0].id.clone();
        // A dead process took the approval in a turn of its own and started the call.
        let now = agentry_types::Timestamp::now();
        let past = agentry_types::Timestamp::from_unix_micros(now.unix_micros() - 60_000_000);
        let dead = harness
            .store
            .acquire_lease(session.id(), "a dead process", Duration::from_secs(1), past)
            .await
            .unwrap();
        let approval = TurnInputItem::allow(agentry_types::ThreadId::main(), call_id.clone());
        let mut left =
            agentry_types::RunRecord::new(session.id(), vec![approval], agentry_types::Subject::user("dead"));
        left.previous_turn_id = Some(first.id());
        harness.store.put_run(&left, Some(dead.fence())).await.unwrap();
        harness.store.journal_start(&added(left.id, &call_id, now), Some(dead.fence())).await.unwrap();
        if completed {
            let result = agentry_types::ToolResult { content: "2".to_owned(), is_error: false };
            harness
                .store
                .journal_complete(left.id, &call_id, &result, now, Some(dead.fence()))
                .await
                .unwrap();
        }
        let stranger = Runtime::new(harness.store.clone());
        stranger.get_turn(left.id).await.unwrap().cancel().await.unwrap();
        assert!(stranger.recover().await.unwrap().is_empty(), "nothing to resume without the agent");
        let state = runtime.get_turn(left.id).await.unwrap().wait().await.unwrap();
        assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
        let next = session.create_turn(TurnRequest::message("Hello")).await.unwrap();
        let state = next.wait().await.unwrap();
        assert_eq!(answer_text(&state).as_deref(), Some("Hello again."), "{state:?}");
        let seen = model.requests().last().cloned().unwrap();
        let answered =
            seen.messages.iter().find(|message| message.tool_call_id.as_deref() == Some(call_id.as_str()));
        let answer = answered.map(|message| message.text()).unwrap_or_default();
        if completed {
            assert_eq!(answer, "2", "{:?}", seen.messages);
        } else {
            assert!(answer.starts_with("The call may have run; its result is unknown"), "{answer}");
        }
    }
}

/// Scenario: a turn a dead process left after its call ran (the result journaled, not yet
/// in the history), cancelled while no process ran it, is resumed and ends cancelled, and
/// its call's result in the history is the journaled one: the model is not told that the
/// call did not complete.
pub async fn a_cancelled_resumed_turn_gives_a_call_that_ran_its_result(harness: Harness) {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Hello again.")]));
    let runtime =
        runtime(&harness, Agent::builder("adder", model.clone()).tool(add_tool(Arc::default())).build());
    let session = session_for(&runtime, "adder").await;
    let left = leave_a_dead_process(&harness, &session, true).await.unwrap();
    let mut asked = agentry_types::Message::assistant("Let me add.");
    asked.tool_calls = vec![agentry_types::ToolCall::function("call_ran", "add", r#"{"a":1,"b":1}"#)];
    let said = [Arc::new(agentry_types::Message::user("left running")), Arc::new(asked)];
    harness.store.append_messages(left, &said, None).await.unwrap();
    let now = agentry_types::Timestamp::now();
    harness.store.journal_start(&added(left, "call_ran", now), None).await.unwrap();
    let result = agentry_types::ToolResult { content: "2".to_owned(), is_error: false };
    harness.store.journal_complete(left, "call_ran", &result, now, None).await.unwrap();
    runtime.get_turn(left).await.unwrap().cancel().await.unwrap();
    let resumed = runtime.recover().await.unwrap();
    assert_eq!(resumed.iter().map(TurnHandle::id).collect::<Vec<_>>(), [left]);
    let state = resumed[0].wait().await.unwrap();
    assert!(matches!(state, TurnState::Cancelled { .. }), "{state:?}");
    let next = session.create_turn(TurnRequest::message("Hello")).await.unwrap();
    assert_eq!(answer_text(&next.wait().await.unwrap()).as_deref(), Some("Hello again."));
    let seen = model.requests().last().cloned().unwrap();
    let answered = seen.messages.iter().find(|message| message.tool_call_id.as_deref() == Some("call_ran"));
    assert_eq!(answered.map(|message| message.text()).as_deref(), Some("2"), "{:?}", seen.messages);
}

/// The journal entry of an `add` call `call` of `turn` started at `at` (as a process that
/// then died wrote it).
fn added(
    turn: agentry_types::TurnId,
    call: &str,
    at: agentry_types::Timestamp,
) -> agentry_types::JournalEntry {
    agentry_types::JournalEntry {
        turn_id: turn,
        tool_call_id: call.to_owned(),
        tool_name: "add".to_owned(),
        idempotency_key: "key".to_owned(),
        arguments_hash: "hash".to_owned(),
        started_at: at,
        result: None,
        completed_at: None,
    }
}

/// The seqs of a turn's live stream, and that they run from 1 without a gap.
async fn dense_stream(turn: &TurnHandle) -> Vec<Arc<EventEnvelope>> {
    let events = collect(turn.stream(None)).await;
    let seqs: Vec<u64> = events.iter().map(|event| event.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "no number is skipped");
    assert_eq!(events.last().map(|event| event.payload.kind()), Some("turn.done"));
    events
}

/// Scenario: a tool result too large for the store reaches the model as an error result,
/// journaled, and the call is not run again.
pub async fn a_tool_result_too_large_to_keep_reaches_the_model_as_an_error_and_runs_once(harness: Harness) {
    let calls = Arc::new(AtomicUsize::new(0));
    let huge = {
        let calls = calls.clone();
        FunctionTool::new("huge", "Returns too much.", move |_: NoArguments, _| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, ToolError>("x".repeat(agentry_memory::MAX_RECORD_BYTES + 1)) }
        })
    };
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("huge", &json!({})),
        ScriptedResponse::text("Recovered."),
    ]));
    // No output limit (one above the record limit would cut the result first).
    let limits = AgentLimits { max_tool_output_bytes: usize::MAX, ..AgentLimits::default() };
    let agent = Agent::builder("huge", model.clone()).tool(huge.shared()).limits(limits).build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "huge").await;
    let turn = session.create_turn(TurnRequest::message("go")).await.unwrap();
    dense_stream(&turn).await;
    assert_eq!(answer_text(&turn.wait().await.unwrap()).as_deref(), Some("Recovered."));
    let seen = &model.requests()[1].messages;
    let result = seen.iter().find(|message| message.role == Role::Tool).map(|message| message.text());
    assert!(result.is_some_and(|text| text.contains("cannot be kept")), "{seen:?}");
    let journal = harness.store.journal(turn.id()).await.unwrap();
    assert!(journal[0].result.as_ref().is_some_and(|result| result.is_error), "{journal:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Scenario: a model message too large for the store fails the turn; a small stand-in keeps
/// its number, so the streamed and stored numbers stay whole, and the session goes on.
pub async fn a_model_message_too_large_to_keep_fails_the_turn_and_keeps_every_number(harness: Harness) {
    // In two deltas: each fits in memory comfortably, their message does not fit the store.
    let big = ScriptedResponse {
        chunk_chars: Some(agentry_memory::MAX_RECORD_BYTES / 2 + 1),
        ..ScriptedResponse::text("x".repeat(agentry_memory::MAX_RECORD_BYTES + 1))
    };
    let model = Arc::new(ScriptedModel::new(vec![big, ScriptedResponse::text("Fine.")]));
    let runtime = runtime(&harness, Agent::builder("big", model.clone()).build());
    let session = session_for(&runtime, "big").await;
    let failed = session.create_turn(TurnRequest::message("go")).await.unwrap();
    let streamed = dense_stream(&failed).await;
    match failed.wait().await.unwrap() {
        TurnState::Error { message, .. } => assert!(message.contains("cannot be kept"), "{message}"),
        other => panic!("expected an error, got {other:?}"),
    }
    let stored = failed.events(Order::Asc).await.unwrap();
    let durable: Vec<u64> = streamed
        .iter()
        .filter(|event| event.payload.kind() != "model.message.delta")
        .map(|event| event.seq)
        .collect();
    assert_eq!(stored.iter().map(|event| event.seq).collect::<Vec<_>>(), durable);
    let stand_in = stored.iter().find_map(|event| match &event.payload {
        EventPayload::ModelMessage(message) => message.content.clone(),
        _ => None,
    });
    assert!(stand_in.is_some_and(|text| text.starts_with("[the message was not kept")));
    let next = session.create_turn(TurnRequest::message("again")).await.unwrap();
    assert_eq!(answer_text(&next.wait().await.unwrap()).as_deref(), Some("Fine."));
}

/// Scenario: an agent whose history window holds no earlier turns still sees its own input,
/// once.
pub async fn a_window_of_no_earlier_turns_still_holds_the_turns_own_input_once(harness: Harness) {
    let model =
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("one"), ScriptedResponse::text("two")]));
    let limits = AgentLimits { history_runs: 0, ..AgentLimits::default() };
    let runtime = runtime(&harness, Agent::builder("forgetful", model.clone()).limits(limits).build());
    let session = session_for(&runtime, "forgetful").await;
    for text in ["first", "second"] {
        session.create_turn(TurnRequest::message(text)).await.unwrap().wait().await.unwrap();
    }
    let seen: Vec<String> = model.requests()[1].messages.iter().map(|message| message.text()).collect();
    assert_eq!(seen, ["second"]);
    let history =
        harness.store.history(session.id(), &agentry_memory::HistoryQuery::default()).await.unwrap();
    assert_eq!(history.iter().filter(|stored| stored.message.text() == "second").count(), 1);
}

/// Scenario: a short history window never hands the model a tool result without its
/// call (providers refuse it). With a window of one run, the turn that approves a call
/// still sees the call it answers; with two, a later turn whose window begins at that
/// approving turn leaves its results out.
pub async fn a_history_window_never_starts_with_results_whose_call_it_cut_off(harness: Harness) {
    for history_runs in [1, 2] {
        let calls = Arc::new(AtomicUsize::new(0));
        let model = Arc::new(ScriptedModel::new(vec![
            ScriptedResponse::tool_call("add", &json!({"a": 1, "b": 1})),
            ScriptedResponse::text("Done: 2."),
            ScriptedResponse::text("Hello again."),
        ]));
        let limits = AgentLimits { history_runs, ..AgentLimits::default() };
        let agent = Agent::builder("gated", model.clone())
            .tool(add_tool(calls.clone()))
            .requires_approval("add")
            .limits(limits)
            .build();
        let runtime = runtime(&harness, agent);
        let session = session_for(&runtime, "gated").await;
        let first = session.create_turn(TurnRequest::message("Add 1 and 1")).await.unwrap();
        assert_eq!(first.wait().await.unwrap().required_actions().len(), 1);
        let approve = TurnInputItem::allow(agentry_types::ThreadId::main(), "call_1_0");
        let second = session.create_turn(TurnRequest::input(vec![approve])).await.unwrap();
        let state = second.wait().await.unwrap();
        assert_eq!(answer_text(&state).as_deref(), Some("Done: 2."), "window of {history_runs}: {state:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let third = session.create_turn(TurnRequest::message("Hello")).await.unwrap();
        let state = third.wait().await.unwrap();
        assert_eq!(
            answer_text(&state).as_deref(),
            Some("Hello again."),
            "window of {history_runs}: {state:?}"
        );
        let seen = model.requests().last().cloned().unwrap();
        assert!(
            seen.messages.first().is_none_or(|message| message.role != agentry_types::Role::Tool),
            "window of {history_runs}: {:?}",
            seen.messages
        );
    }
}

/// Scenario: a call that answers the user directly (a route to a member) next to a call
/// that waits for an approval ends the turn with the member's answer, and the waiting call
/// gets a result saying it did not run: the history stays a conversation a provider takes,
/// and the next turn is answered.
pub async fn a_direct_answer_closes_the_calls_of_its_message_still_waiting(harness: Harness) {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    let member = Agent::builder(
        "member",
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Hi from the member.")])),
    )
    .build();
    let route =
        FunctionTool::new("route", "Hands the user to a member.", move |_: Nothing, context: ToolContext| {
            let member = member.clone();
            async move {
                let result = context.run_thread(&member, "Greet.", "member").await?;
                if let Some(output) = result.output {
                    context.answer_directly(output);
                }
                Ok::<_, ToolError>(result.answer)
            }
        });
    let mut both = ScriptedResponse::tool_call("route", &json!({}));
    both.tool_calls.push(ScriptedToolCall {
        id: None,
        name: "add".to_owned(),
        arguments: r#"{"a":1,"b":1}"#.to_owned(),
    });
    let model = Arc::new(ScriptedModel::new(vec![both, ScriptedResponse::text("Hello again.")]));
    let calls = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder("router", model)
        .tool(route.shared())
        .tool(add_tool(calls.clone()))
        .requires_approval("add")
        .build();
    let runtime = runtime(&harness, agent);
    let session = session_for(&runtime, "router").await;
    let first = session.create_turn(TurnRequest::message("Hi")).await.unwrap();
    let state = first.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Hi from the member."));
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let next = session.create_turn(TurnRequest::message("Hello")).await.unwrap();
    let state = next.wait().await.unwrap();
    assert_eq!(answer_text(&state).as_deref(), Some("Hello again."), "{state:?}");
}

/// Scenario.
pub async fn turn_locals_are_shared_by_a_turns_calls_and_threads_and_end_with_the_turn(harness: Harness) {
    #[derive(Default)]
    struct Tally(AtomicUsize);
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct Nothing {}
    type Seen = Arc<std::sync::Mutex<Vec<(usize, std::sync::Weak<Tally>)>>>;
    let seen: Seen = Arc::default();
    let recorded = seen.clone();
    let tally =
        FunctionTool::new("tally", "Counts this turn's calls.", move |_: Nothing, context: ToolContext| {
            let recorded = recorded.clone();
            async move {
                let tally = context
                    .turn_local::<Tally>()
                    .ok_or_else(|| ToolError::Failed("not in a turn".to_owned()))?;
                let count = tally.0.fetch_add(1, Ordering::SeqCst) + 1;
                recorded
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((count, Arc::downgrade(&tally)));
                Ok::<_, ToolError>(count.to_string())
            }
        })
        .shared();
    let member_turn = ScriptedResponse::tool_call("tally", &json!({}));
    let member_model = Arc::new(ScriptedModel::new(vec![
        member_turn.clone(),
        ScriptedResponse::text("Counted once."),
        member_turn,
        ScriptedResponse::text("Counted once."),
    ]));
    let member = Agent::builder("member", member_model).tool(tally.clone()).build();
    let delegate = FunctionTool::new("delegate", "Has a member count.", move |_: Nothing, context: ToolContext| {
        let member = member.clone();
        async move { context.run_thread(&member, "Count once.", "member").await.map(|result| result.answer) }
    })
    .shared();
    // Two calls on the main thread and one on a member's thread, all at once.
    let calls = ScriptedResponse::tool_call("tally", &json!({}))
        .with_tool_call("tally", &json!({}))
        .with_tool_call("delegate", &json!({}));
    let model = Arc::new(ScriptedModel::new(vec![
        calls.clone(),
        ScriptedResponse::text("Counted."),
        calls,
        ScriptedResponse::text("Counted."),
    ]));
    let runtime = runtime(&harness, Agent::builder("counter", model).tool(tally).tool(delegate).build());
    let session = session_for(&runtime, "counter").await;
    // Counts that start at 1 in the second turn show it has a value of its own.
    for turn in 0..2 {
        let state = session.create_turn(TurnRequest::message("Count")).await.unwrap().wait().await.unwrap();
        assert_eq!(answer_text(&state).as_deref(), Some("Counted."), "turn {turn}");
        let mut calls = std::mem::take(&mut *seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        calls.sort_by_key(|(count, _)| *count);
        let counts: Vec<usize> = calls.iter().map(|(count, _)| *count).collect();
        assert_eq!(counts, [1, 2, 3], "turn {turn}: one tally for the turn's three calls, the member's too");
        assert!(
            calls.iter().all(|(_, tally)| tally.ptr_eq(&calls[0].1)),
            "turn {turn}: one value for the turn"
        );
        assert!(calls[0].1.upgrade().is_none(), "turn {turn}: the value ended with the turn");
    }
}

/// Expands every scenario into a named `#[tokio::test]` over stores from `$factory`
/// (an async closure returning a fresh [`Harness`]). A store backend's test suite runs the
/// whole runner acceptance suite with one line.
#[macro_export]
macro_rules! runner_scenarios {
    ($factory:expr) => {
        $crate::runner_scenarios!(@cases $factory; a_turn_running_in_one_runtime_is_cancelled_from_another_on_the_same_store,
            a_new_turn_chains_only_on_the_latest_turn,
            calls_left_open_by_a_stopped_turn_get_error_results_for_the_next_turn,
            a_cancelled_turn_lets_a_running_tool_finish_within_the_grace_period,
            a_tool_past_the_grace_period_is_abandoned_and_the_turn_ends_cancelled,
            a_call_that_finished_is_kept_when_another_outlasts_the_grace,
            a_member_run_stored_just_before_a_crash_ends_when_its_turn_is_recovered,
            a_delegation_whose_thread_had_answered_is_not_in_doubt_after_a_crash,
            a_paused_turn_is_resumed_by_another_runtime_on_the_same_store,
            a_tool_with_its_own_timeout_uses_it_instead_of_the_agents,
            memory_summaries_and_profiles_are_updated_after_a_turn_and_injected_into_the_next,
            memory_serves_a_team_session_and_cuts_history_to_its_last_messages,
            a_failed_memory_update_keeps_the_answer_and_names_the_failure,
            a_running_checkpoint_saved_through_the_session_views_is_not_resumed_as_a_turn,
            a_turn_left_under_many_running_checkpoints_is_still_recovered,
            a_delta_that_does_not_merge_keeps_the_text_already_streamed,
            a_tool_output_past_the_limit_is_cut_and_says_how_much_was_left_out,
            the_adalflow_streaming_result_streams_run_items_writes_json_and_returns_the_step_history,
            a_streaming_result_of_a_handed_over_turn_completes_where_it_is_resumed,
            a_cancelled_adalflow_result_reports_the_cancellation_as_its_error,
            a_turn_with_a_tool_call_streams_dense_events_and_stores_the_durable_ones,
            a_second_turn_chains_on_the_first_and_sees_its_history,
            invalid_tool_arguments_give_the_model_an_error_result_and_the_tool_does_not_run,
            the_calls_of_one_model_message_run_concurrently,
            a_tool_needing_approval_pauses_the_turn_and_an_allow_runs_it_in_the_next_turn,
            a_denial_and_its_reason_reach_the_model,
            ask_user_question_pauses_for_the_client_and_its_answer_resumes_the_agent,
            input_that_breaks_the_rules_is_refused_and_stores_nothing,
            of_fifty_concurrent_turns_on_one_session_exactly_one_runs,
            a_turn_request_with_a_key_runs_once_however_often_it_is_sent,
            a_turn_recovered_into_an_approval_keeps_the_message_that_asked_as_its_output,
            calls_whose_provider_reuses_an_id_each_run_and_ask_for_their_own_approval,
            cancelling_while_the_model_streams_ends_the_turn_cancelled_and_the_next_turn_sees_its_history,
            a_turn_past_its_timeout_ends_cancelled_by_the_server,
            a_tool_past_its_timeout_gives_the_model_an_error_result,
            the_iteration_limit_and_model_failures_end_the_turn_with_an_error,
            a_cancelled_session_refuses_new_turns,
            a_turn_created_again_under_a_deleted_turns_id_is_not_served_the_old_live_log,
            a_cancel_during_the_memory_update_cuts_it_and_the_answer_stands,
            a_session_is_deleted_with_its_turns_only_while_none_runs,
            a_session_cancelled_while_a_turn_starts_leaves_no_turn_running,
            a_subscriber_resuming_after_a_seq_gets_every_later_event_once,
            after_the_live_log_expires_a_stream_is_served_from_the_stored_log,
            tools_get_a_stable_idempotency_key_and_the_journal_records_each_call,
            a_subscriber_reading_one_event_per_50_ms_still_receives_thousands_in_order,
            past_its_delta_budget_a_live_log_merges_deltas_and_every_reader_still_gets_the_whole_text,
            durations_past_the_clocks_range_mean_no_limit,
            unknown_agents_sessions_and_turns_are_not_found,
            mcp_auth_required_ends_the_turn_and_an_empty_turn_after_authorizing_resumes,
            answers_to_client_tools_must_match_the_pending_calls_exactly,
            a_turns_own_client_tools_are_offered_and_their_calls_wait_for_the_caller,
            a_turns_client_context_is_shown_to_its_model_after_the_instructions_and_kept,
            a_panicking_model_ends_the_turn_with_an_error_and_frees_the_session,
            a_panicking_tool_fails_its_call_and_the_turn_goes_on,
            a_tool_result_too_large_to_keep_reaches_the_model_as_an_error_and_runs_once,
            a_model_message_too_large_to_keep_fails_the_turn_and_keeps_every_number,
            a_window_of_no_earlier_turns_still_holds_the_turns_own_input_once,
            a_history_window_never_starts_with_results_whose_call_it_cut_off,
            a_direct_answer_closes_the_calls_of_its_message_still_waiting,
            a_left_turn_that_answered_an_earlier_call_closes_it_when_ended,
            a_cancelled_resumed_turn_gives_a_call_that_ran_its_result,
            a_dropped_create_turn_frees_the_session_and_a_stored_turn_runs_to_its_end,
            recovery_passes_beside_live_turns_leave_them_alone,
            a_recovery_pass_resumes_only_turns_under_lapsed_leases,
            a_turn_recovered_without_its_agent_or_with_a_broken_one_ends_with_a_stored_turn_done,
            an_end_too_large_to_keep_with_its_input_fails_the_turn_once,
            an_input_leaving_no_room_for_the_end_is_refused_at_the_start,
            a_start_beside_a_live_turn_whose_lease_lapsed_leaves_it_running,
            a_handed_over_turn_is_recovered_at_once_by_another_runtime,
            a_turn_handed_over_while_its_summary_is_written_leaves_the_summary_alone,
            a_turn_starting_while_its_runtime_hands_over_is_handed_over_too,
            a_turn_followed_or_cancelled_before_this_process_recovers_it_is_then_live_here,
            turn_locals_are_shared_by_a_turns_calls_and_threads_and_end_with_the_turn);
    };
    (@cases $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                let harness = ($factory)().await;
                $crate::scenarios::$name(harness).await;
            }
        )*
    };
}
