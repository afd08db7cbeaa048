//! The Memory facade: every parameter of seed 003, on the in-memory store and the scripted
//! model.

use std::sync::Arc;

use agentry_memory::{InMemoryStore, Memory, MemoryConfig, MemoryError, Store, UserMemoryMode};
use agentry_model::{Model, ModelError, ScriptedModel, ScriptedResponse};
use agentry_types::agno::{MemberResponse, RunOutput, TeamRunOutput};
use agentry_types::{Message, Role, RunStatus, SessionId, SessionType, ToolCall, TurnId};
use serde_json::{Map, Value, json};

fn store() -> Arc<dyn Store> {
    Arc::new(InMemoryStore::new())
}

fn agent_run(status: RunStatus, messages: Vec<Message>) -> MemberResponse {
    let mut run = RunOutput::new(1_800_000_000);
    run.run_id = Some(TurnId::new().to_string());
    run.agent_id = Some("helper".into());
    run.status = status;
    run.content = Some(json!(messages.last().map(Message::text).unwrap_or_default()));
    run.messages = Some(messages);
    MemberResponse::Agent(Box::new(run))
}

fn exchange(question: &str, answer: &str) -> Vec<Message> {
    vec![Message::user(question), Message::assistant(answer)]
}

/// Saves a completed run of `exchange(question, answer)` to an agent session.
async fn save_exchange(memory: &Memory, question: &str, answer: &str) {
    memory
        .save_session(&agent_run(RunStatus::Completed, exchange(question, answer)), SessionType::Agent, None)
        .await
        .unwrap();
}

fn memory(store: Arc<dyn Store>, model: Option<Arc<ScriptedModel>>, config: MemoryConfig) -> Memory {
    Memory::new(store, model.map(|model| model as Arc<dyn Model>), config).unwrap()
}

#[test]
fn summary_or_user_analysis_without_a_model_is_refused_and_a_profile_schema_must_describe_an_object() {
    for config in [
        MemoryConfig { summary_memory: true, ..MemoryConfig::default() },
        MemoryConfig { user_analysis_memory: true, ..MemoryConfig::default() },
        MemoryConfig { user_profile_schema: Some(json!({"type": "string"})), ..MemoryConfig::default() },
        MemoryConfig { num_last_messages: Some(0), ..MemoryConfig::default() },
    ] {
        assert!(matches!(Memory::new(store(), None, config), Err(MemoryError::InvalidConfig(_))));
    }
    let memory = Memory::new(store(), None, MemoryConfig::default()).unwrap();
    assert!(memory.user_id().starts_with("user-"), "a user id is generated when none is given");
    assert!(memory.user_memory().is_none(), "no user memory without user analysis");
}

#[tokio::test]
async fn without_full_session_memory_no_history_is_replayed() {
    let memory = memory(store(), None, MemoryConfig::default());
    memory
        .save_session(&agent_run(RunStatus::Completed, exchange("hi", "hello")), SessionType::Agent, None)
        .await
        .unwrap();
    let prepared = memory.prepare_inputs_for_task(None, None).await.unwrap();
    assert!(prepared.message_history.is_empty());
    assert!(memory.get_messages().await.unwrap().is_empty());
}

#[tokio::test]
async fn full_session_memory_replays_completed_runs_as_history_bounded_by_num_last_messages() {
    let config =
        MemoryConfig { full_session_memory: true, num_last_messages: Some(3), ..MemoryConfig::default() };
    let memory = memory(store(), None, config);
    for (question, answer) in [("q1", "a1"), ("q2", "a2"), ("q3", "a3")] {
        save_exchange(&memory, question, answer).await;
    }
    memory
        .save_session(&agent_run(RunStatus::Paused, exchange("q4", "a4")), SessionType::Agent, None)
        .await
        .unwrap();
    let prepared = memory.prepare_inputs_for_task(Some(SessionType::Agent), None).await.unwrap();
    let texts: Vec<String> = prepared.message_history.iter().map(Message::text).collect();
    assert_eq!(texts, ["a2", "q3", "a3"], "the last three messages; the paused run is not history");
    assert!(prepared.message_history.iter().all(|message| message.from_history));
}

#[tokio::test]
async fn saving_a_completed_run_twice_keeps_its_messages_once() {
    let memory = memory(store(), None, MemoryConfig { full_session_memory: true, ..MemoryConfig::default() });
    let run = agent_run(RunStatus::Completed, exchange("once", "only once"));
    memory.save_session(&run, SessionType::Agent, None).await.unwrap();
    memory.save_session(&run, SessionType::Agent, None).await.unwrap();
    assert_eq!(memory.get_messages().await.unwrap().len(), 2);
}

#[tokio::test]
async fn summary_memory_summarizes_completed_runs_through_the_model_and_injects_the_summary() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("The user greeted the assistant.")]));
    let config = MemoryConfig { summary_memory: true, ..MemoryConfig::default() };
    let memory = memory(store(), Some(model.clone()), config);
    save_exchange(&memory, "hello there", "hi!").await;
    let prompt = model.requests()[0].messages[0].text();
    assert!(prompt.contains("user: hello there") && prompt.contains("assistant: hi!"), "{prompt}");
    let prepared = memory.prepare_inputs_for_task(None, None).await.unwrap();
    assert_eq!(
        prepared.context_injection.as_deref(),
        Some("Summary of the conversation so far:\nThe user greeted the assistant.")
    );
    let session = memory.get_session(None).await.unwrap().unwrap();
    assert_eq!(session.summary.unwrap().summary, "The user greeted the assistant.");
}

#[tokio::test]
async fn an_empty_summary_from_the_model_keeps_the_previous_one_and_says_so() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::text("The user greeted the assistant."),
        ScriptedResponse::text("  "),
    ]));
    let config = MemoryConfig { summary_memory: true, ..MemoryConfig::default() };
    let memory = memory(store(), Some(model), config);
    let run = |question| agent_run(RunStatus::Completed, exchange(question, "hi!"));
    memory.save_session(&run("hello there"), SessionType::Agent, None).await.unwrap();
    let error = memory.save_session(&run("and again"), SessionType::Agent, None).await.unwrap_err();
    assert!(error.to_string().contains("the model's summary is empty"), "{error}");
    let session = memory.get_session(None).await.unwrap().unwrap();
    assert_eq!(session.summary.unwrap().summary, "The user greeted the assistant.");
}

#[tokio::test]
async fn incomplete_runs_are_checkpointed_without_memory_processing_and_can_be_resumed() {
    let model = Arc::new(ScriptedModel::new(Vec::new()));
    let config = MemoryConfig {
        summary_memory: true,
        user_analysis_memory: true,
        full_session_memory: true,
        ..MemoryConfig::default()
    };
    let memory = memory(store(), Some(model.clone()), config);
    let mut ids = Vec::new();
    for status in [RunStatus::Paused, RunStatus::Error, RunStatus::Cancelled] {
        let run = agent_run(status, exchange("send the email", "waiting for approval"));
        let saved = memory.save_session(&run, SessionType::Agent, Some("helper")).await.unwrap();
        assert_eq!(saved.status, status);
        ids.push(saved.id);
    }
    assert_eq!(model.calls(), 0, "no summary or profile work for incomplete runs");
    assert!(memory.get_messages().await.unwrap().is_empty());
    for id in &ids {
        let resumable = memory.load_resumable_run(*id, Some("helper")).await.unwrap().unwrap();
        let output: RunOutput = serde_json::from_value(resumable.output.unwrap()).unwrap();
        assert_eq!(output.messages.unwrap().len(), 2, "the checkpoint holds the run's state");
    }
    assert!(memory.load_resumable_run(ids[0], Some("someone-else")).await.unwrap().is_none());
    assert!(memory.load_resumable_run(TurnId::new(), None).await.unwrap().is_none());
}

#[tokio::test]
async fn load_run_returns_any_status_but_a_completed_run_is_not_resumable() {
    let memory = memory(store(), None, MemoryConfig::default());
    let saved = memory
        .save_session(&agent_run(RunStatus::Completed, exchange("q", "a")), SessionType::Agent, None)
        .await
        .unwrap();
    assert_eq!(memory.load_run(saved.id, None).await.unwrap().unwrap().status, RunStatus::Completed);
    assert!(memory.load_resumable_run(saved.id, None).await.unwrap().is_none());
}

#[tokio::test]
async fn user_analysis_builds_a_profile_from_the_model_and_injects_it_into_the_system_prompt() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::text("```json\n{\"name\": \"Ada\", \"language\": \"French\"}\n```"),
        ScriptedResponse::text("{\"city\": \"Lyon\"}"),
    ]));
    let config =
        MemoryConfig { user_analysis_memory: true, user_id: Some("ada".into()), ..MemoryConfig::default() };
    let memory = memory(store(), Some(model), config);
    save_exchange(&memory, "I'm Ada, I speak French", "Bonjour Ada").await;
    save_exchange(&memory, "I live in Lyon", "Nice").await;
    let profile = memory.user_memory().unwrap().profile().await.unwrap().unwrap();
    assert_eq!(profile, json!({"name": "Ada", "language": "French", "city": "Lyon"}), "update mode merges");
    let prepared = memory.prepare_inputs_for_task(None, None).await.unwrap();
    let injection = prepared.system_prompt_injection.unwrap();
    assert!(
        injection.starts_with("What you know about the user:") && injection.contains("Lyon"),
        "{injection}"
    );
}

/// A facade opened on a session another created, with no user of its own, serves the
/// session's user: it injects the profile the first built, and its updates go there too.
#[tokio::test]
async fn a_facade_without_a_user_serves_the_sessions_user() {
    let store = store();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::text("{\"name\": \"Ada\"}"),
        ScriptedResponse::text("{\"city\": \"Lyon\"}"),
    ]));
    let first = memory(
        store.clone(),
        Some(model.clone()),
        MemoryConfig { user_analysis_memory: true, ..MemoryConfig::default() },
    );
    save_exchange(&first, "I'm Ada", "Hello Ada").await;
    let config = MemoryConfig {
        user_analysis_memory: true,
        session_id: Some(first.session_id()),
        ..MemoryConfig::default()
    };
    let second = memory(store.clone(), Some(model), config);
    assert_ne!(second.user_id(), first.user_id(), "the second facade has no user of its own");
    let prepared = second.prepare_inputs_for_task(None, None).await.unwrap();
    let injection = prepared.system_prompt_injection.expect("the session's user's profile is injected");
    assert!(injection.contains("Ada"), "{injection}");
    save_exchange(&second, "I live in Lyon", "Nice").await;
    let profile = first.user_memory().unwrap().profile().await.unwrap().unwrap();
    assert_eq!(profile, json!({"name": "Ada", "city": "Lyon"}), "the update went to the session's user");
    // The second facade's user memory is that user's too, as its prompts are.
    let handle = second.user_memory().unwrap();
    assert_eq!(handle.user_id().await.unwrap(), first.user_id());
    assert_eq!(handle.profile().await.unwrap(), Some(profile));
}

/// A new session of user `ada` with profile analysis on `model`.
fn ada_session(store: &Arc<dyn Store>, model: Arc<dyn Model>) -> Memory {
    let config = MemoryConfig {
        user_analysis_memory: true,
        user_id: Some("ada".into()),
        session_id: Some(SessionId::new()),
        ..MemoryConfig::default()
    };
    Memory::new(store.clone(), Some(model), config).unwrap()
}

/// A model that answers only once `together` calls are waiting, so that each caller has
/// read whatever it reads before any of them writes.
#[derive(Debug)]
struct AnswersTogether {
    inner: ScriptedModel,
    barrier: tokio::sync::Barrier,
}

#[async_trait::async_trait]
impl Model for AnswersTogether {
    fn info(&self) -> agentry_model::ModelInfo {
        self.inner.info()
    }
    async fn stream(
        &self,
        request: agentry_model::ModelRequest,
    ) -> Result<agentry_model::ModelStream, ModelError> {
        self.barrier.wait().await;
        self.inner.stream(request).await
    }
}

#[tokio::test]
async fn profile_updates_from_two_sessions_of_one_user_at_once_both_land() {
    let store = store();
    let model = Arc::new(AnswersTogether {
        inner: ScriptedModel::responder(|request| {
            let prompt = request.messages.last().map(|message| message.text()).unwrap_or_default();
            ScriptedResponse::text(if prompt.contains("Lyon") {
                r#"{"city": "Lyon"}"#
            } else {
                r#"{"language": "French"}"#
            })
        }),
        barrier: tokio::sync::Barrier::new(2),
    });
    let (first, second) = (ada_session(&store, model.clone()), ada_session(&store, model));
    let french = agent_run(RunStatus::Completed, exchange("I speak French", "Bien"));
    let lyon = agent_run(RunStatus::Completed, exchange("I live in Lyon", "Nice"));
    let (french, lyon) = tokio::join!(
        first.save_session(&french, SessionType::Agent, None),
        second.save_session(&lyon, SessionType::Agent, None),
    );
    french.unwrap();
    lyon.unwrap();
    let profile = first.user_memory().unwrap().profile().await.unwrap().unwrap();
    assert_eq!(profile, json!({"language": "French", "city": "Lyon"}), "neither update is lost");
}

/// A model that, for a prompt containing `hold`, says it was called and then answers only
/// when let go.
#[derive(Debug)]
struct Held {
    inner: ScriptedModel,
    hold: &'static str,
    called: tokio::sync::Notify,
    go: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl Model for Held {
    fn info(&self) -> agentry_model::ModelInfo {
        self.inner.info()
    }
    async fn stream(
        &self,
        request: agentry_model::ModelRequest,
    ) -> Result<agentry_model::ModelStream, ModelError> {
        if request.messages.iter().any(|message| message.text().contains(self.hold)) {
            self.called.notify_one();
            self.go.notified().await;
        }
        self.inner.stream(request).await
    }
}

#[tokio::test]
async fn a_field_a_model_repeats_from_a_stale_read_does_not_undo_another_sessions_update() {
    let store = store();
    store
        .put_profile(&agentry_types::UserProfile {
            user_id: "ada".into(),
            profile: json!({"city": "Paris"}),
            updated_at: agentry_types::Timestamp::from_unix_millis(1),
        })
        .await
        .unwrap();
    // As models do, each answers with the whole profile it was shown, changed.
    let model = Arc::new(Held {
        inner: ScriptedModel::responder(|request| {
            let prompt = request.messages.last().map(|message| message.text()).unwrap_or_default();
            ScriptedResponse::text(if prompt.contains("I moved to Lyon") {
                r#"{"city": "Lyon"}"#
            } else {
                r#"{"city": "Paris", "language": "French"}"#
            })
        }),
        hold: "I speak French",
        called: tokio::sync::Notify::new(),
        go: tokio::sync::Notify::new(),
    });
    let (french, moved) = (ada_session(&store, model.clone()), ada_session(&store, model.clone()));
    // The first session reads {city: Paris} and waits in its model call; the second moves
    // the user to Lyon meanwhile; then the first answers with the Paris it read.
    let first = tokio::spawn(async move {
        let run = agent_run(RunStatus::Completed, exchange("I speak French", "Bien"));
        french.save_session(&run, SessionType::Agent, None).await
    });
    model.called.notified().await;
    let run = agent_run(RunStatus::Completed, exchange("I moved to Lyon", "Nice"));
    moved.save_session(&run, SessionType::Agent, None).await.unwrap();
    model.go.notify_one();
    first.await.unwrap().unwrap();
    let profile = moved.user_memory().unwrap().profile().await.unwrap().unwrap();
    assert_eq!(profile, json!({"city": "Lyon", "language": "French"}), "the move stays");
}

#[tokio::test]
async fn replace_mode_overwrites_the_profile() {
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::text("{\"name\": \"Ada\"}"),
        ScriptedResponse::text("{\"city\": \"Lyon\"}"),
    ]));
    let config = MemoryConfig {
        user_analysis_memory: true,
        user_memory_mode: UserMemoryMode::Replace,
        ..MemoryConfig::default()
    };
    let memory = memory(store(), Some(model), config);
    for _ in 0..2 {
        memory
            .save_session(&agent_run(RunStatus::Completed, exchange("q", "a")), SessionType::Agent, None)
            .await
            .unwrap();
    }
    assert_eq!(memory.user_memory().unwrap().profile().await.unwrap(), Some(json!({"city": "Lyon"})));
}

#[tokio::test]
async fn a_profile_schema_keeps_only_its_fields_unless_the_profile_is_dynamic_and_wrong_types_are_refused() {
    let schema =
        json!({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}});
    let answer = "{\"name\": \"Ada\", \"age\": 36, \"hobby\": \"chess\"}";
    for (dynamic, expected) in [
        (false, json!({"name": "Ada", "age": 36})),
        (true, json!({"name": "Ada", "age": 36, "hobby": "chess"})),
    ] {
        let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text(answer)]));
        let config = MemoryConfig {
            user_analysis_memory: true,
            user_profile_schema: Some(schema.clone()),
            dynamic_user_profile: dynamic,
            ..MemoryConfig::default()
        };
        let memory = memory(store(), Some(model.clone()), config);
        memory
            .save_session(&agent_run(RunStatus::Completed, exchange("q", "a")), SessionType::Agent, None)
            .await
            .unwrap();
        assert!(
            model.requests()[0].messages[0].text().contains("\"age\""),
            "the schema is shown to the model"
        );
        assert_eq!(memory.user_memory().unwrap().profile().await.unwrap(), Some(expected));
    }
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("{\"age\": \"old\"}")]));
    let config = MemoryConfig {
        user_analysis_memory: true,
        user_profile_schema: Some(schema),
        ..MemoryConfig::default()
    };
    let memory = memory(store(), Some(model), config);
    let run = agent_run(RunStatus::Completed, exchange("q", "a"));
    let error = memory.save_session(&run, SessionType::Agent, None).await.unwrap_err();
    let MemoryError::MemoryUpdate { run_id, reason } = error else {
        panic!("expected MemoryUpdate, got {error:?}")
    };
    assert!(reason.contains("\"age\""), "{reason}");
    assert!(
        memory.load_run(run_id, None).await.unwrap().is_some(),
        "the run was saved before the analysis failed"
    );
    assert_eq!(memory.user_memory().unwrap().profile().await.unwrap(), None);
}

#[tokio::test]
async fn tool_calls_and_results_reach_the_analysis_only_with_feed_tool_call_results() {
    let messages = vec![
        Message::user("what is 6*7"),
        Message {
            tool_calls: vec![ToolCall::function("c1", "calculator", "{\"e\":\"6*7\"}")],
            ..Message::assistant("")
        },
        Message::tool("c1", "42"),
        Message::assistant("It is 42."),
    ];
    for feed in [false, true] {
        let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("summary")]));
        let config =
            MemoryConfig { summary_memory: true, feed_tool_call_results: feed, ..MemoryConfig::default() };
        let memory = memory(store(), Some(model.clone()), config);
        memory
            .save_session(&agent_run(RunStatus::Completed, messages.clone()), SessionType::Agent, None)
            .await
            .unwrap();
        let prompt = model.requests()[0].messages[0].text();
        assert_eq!(prompt.contains("tool: 42"), feed, "{prompt}");
        assert_eq!(prompt.contains("calculator"), feed, "{prompt}");
        assert!(prompt.contains("assistant: It is 42."));
    }
}

#[tokio::test]
async fn a_model_failure_is_reported_after_the_run_is_saved() {
    let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::failing(ModelError::Http {
        status: 500,
        message: "down".into(),
    })]));
    let memory = memory(
        store(),
        Some(model),
        MemoryConfig { summary_memory: true, full_session_memory: true, ..MemoryConfig::default() },
    );
    let error = memory
        .save_session(&agent_run(RunStatus::Completed, exchange("q", "a")), SessionType::Agent, None)
        .await
        .unwrap_err();
    let MemoryError::MemoryUpdate { run_id, reason } = error else { panic!("expected MemoryUpdate") };
    assert!(reason.contains("HTTP 500"));
    assert!(memory.load_run(run_id, None).await.unwrap().is_some());
    assert_eq!(memory.get_messages().await.unwrap().len(), 2, "history was kept before the analysis");
}

#[tokio::test]
async fn one_memory_serves_agents_and_teams_and_routes_by_the_session_type_of_each_call() {
    let store = store();
    let memory =
        memory(store.clone(), None, MemoryConfig { full_session_memory: true, ..MemoryConfig::default() });
    let agent_session = memory.session_memory(SessionType::Agent);
    assert_eq!(agent_session.session_type(), SessionType::Agent);
    agent_session.save(&agent_run(RunStatus::Completed, exchange("q", "a")), None).await.unwrap();

    let team_session_id = SessionId::new();
    let mut team = TeamRunOutput::new(1_800_000_000);
    team.session_id = Some(team_session_id.to_string());
    team.team_id = Some("crew".into());
    team.status = RunStatus::Completed;
    team.messages = Some(exchange("team q", "team a"));
    let team = MemberResponse::Team(Box::new(team));
    memory.session_memory(SessionType::Team).save(&team, None).await.unwrap();

    assert_eq!(store.get_session(memory.session_id()).await.unwrap().session_type, SessionType::Agent);
    let team_record = store.get_session(team_session_id).await.unwrap();
    assert_eq!((team_record.session_type, team_record.name.as_str()), (SessionType::Team, "crew"));
    let error = memory.save_session(&team, SessionType::Workflow, None).await.unwrap_err();
    assert!(
        matches!(error, MemoryError::SessionTypeMismatch { expected: "workflow", found: "team", .. }),
        "{error:?}"
    );
    let error = memory.prepare_inputs_for_task(Some(SessionType::Team), None).await.unwrap_err();
    assert!(matches!(error, MemoryError::SessionTypeMismatch { .. }));
    let prepared = agent_session.prepare(None).await.unwrap();
    assert_eq!(prepared.message_history.len(), 2);
}

/// A team's run saved by the facade is found by the team's id (its session is named by
/// that id, not the team's display name), and the session's team view matches its runs.
#[tokio::test]
async fn a_teams_paused_run_is_found_by_the_teams_id_and_its_view_matches_its_runs() {
    let store = store();
    let memory =
        memory(store.clone(), None, MemoryConfig { full_session_memory: true, ..MemoryConfig::default() });
    let session_id = SessionId::new();
    let team_run = |status: RunStatus| {
        let mut team = TeamRunOutput::new(1_800_000_000);
        team.session_id = Some(session_id.to_string());
        team.run_id = Some(TurnId::new().to_string());
        team.team_id = Some("research".into());
        team.team_name = Some("Research Team".into());
        team.status = status;
        team.messages = Some(exchange("find it", "found"));
        MemberResponse::Team(Box::new(team))
    };
    let paused = memory.save_session(&team_run(RunStatus::Paused), SessionType::Team, None).await.unwrap();
    let found = memory.load_resumable_run(paused.id, Some("research")).await.unwrap();
    assert_eq!(found.map(|run| run.id), Some(paused.id));
    assert!(memory.load_resumable_run(paused.id, Some("someone-else")).await.unwrap().is_none());
    memory.save_session(&team_run(RunStatus::Completed), SessionType::Team, None).await.unwrap();
    assert_eq!(store.get_session(session_id).await.unwrap().name, "research");
    let view = agentry_memory::TeamSession::load(store.clone(), session_id).await.unwrap();
    assert_eq!(view.team_id.as_deref(), Some("research"));
    let query = agentry_memory::LastRunsQuery { team_id: view.team_id.clone(), ..Default::default() };
    let texts: Vec<String> =
        view.get_messages_from_last_n_runs(&query).await.unwrap().iter().map(Message::text).collect();
    assert_eq!(texts, ["find it", "found", "find it", "found"]);
}

#[tokio::test]
async fn sessions_can_be_found_listed_deleted_and_carry_metadata_into_the_prompt() {
    let config = MemoryConfig { user_id: Some("u1".into()), ..MemoryConfig::default() };
    let memory = memory(store(), None, config);
    assert_eq!(memory.get_session(None).await.unwrap(), None);
    assert_eq!(memory.get_metadata().await.unwrap(), None);
    memory
        .save_session(&agent_run(RunStatus::Completed, exchange("q", "a")), SessionType::Agent, None)
        .await
        .unwrap();
    let mut metadata = Map::new();
    metadata.insert("plan".into(), json!("pro"));
    memory.set_metadata(metadata.clone()).await.unwrap();
    assert_eq!(memory.get_metadata().await.unwrap(), Some(metadata));
    let mut agent = Map::new();
    agent.insert("agent".into(), Value::from("helper"));
    let prepared = memory.prepare_inputs_for_task(None, Some(&agent)).await.unwrap();
    assert_eq!(
        prepared.metadata_injection.as_deref(),
        Some("Session metadata: {\"plan\":\"pro\"}\nAgent metadata: {\"agent\":\"helper\"}")
    );
    assert_eq!(memory.find_session(None).await.unwrap().map(|s| s.id), Some(memory.session_id()));
    let listed = memory.list_sessions(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(memory.list_sessions(Some("someone-else")).await.unwrap().is_empty());
    assert!(memory.delete_session(None).await.unwrap());
    assert!(!memory.delete_session(None).await.unwrap());
    assert_eq!(memory.find_session(None).await.unwrap(), None);
}

#[tokio::test]
async fn a_profile_answer_with_a_brace_before_its_object_is_an_update_error_not_a_panic() {
    let model =
        Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Noted :} Profile: {\"name\": \"Al")]));
    let config = MemoryConfig { user_analysis_memory: true, ..MemoryConfig::default() };
    let memory = memory(store(), Some(model), config);
    let error = memory
        .save_session(
            &agent_run(RunStatus::Completed, exchange("I am Al", "Hi Al")),
            SessionType::Agent,
            None,
        )
        .await
        .unwrap_err();
    let MemoryError::MemoryUpdate { reason, .. } = error else { panic!("expected MemoryUpdate: {error:?}") };
    assert!(reason.contains("not a JSON object"), "{reason}");
}

#[tokio::test]
async fn replayed_history_leaves_out_system_prompts_and_never_starts_with_an_orphaned_tool_result() {
    let call = ToolCall::function("call_1", "add", "{}");
    let messages = vec![
        Message::system("You add numbers."),
        Message::user("add"),
        Message { tool_calls: vec![call], ..Message::assistant("") },
        Message::tool("call_1", "5"),
        Message::assistant("It is 5."),
    ];
    let store = store();
    let saver =
        memory(store.clone(), None, MemoryConfig { full_session_memory: true, ..MemoryConfig::default() });
    saver.save_session(&agent_run(RunStatus::Completed, messages), SessionType::Agent, None).await.unwrap();
    let window = |last| {
        let config = MemoryConfig {
            session_id: Some(saver.session_id()),
            full_session_memory: true,
            num_last_messages: Some(last),
            ..MemoryConfig::default()
        };
        memory(store.clone(), None, config)
    };
    let roles = |history: Vec<Message>| history.iter().map(|message| message.role).collect::<Vec<_>>();
    let prepared = window(2).prepare_inputs_for_task(None, None).await.unwrap();
    assert_eq!(roles(prepared.message_history), [Role::Assistant], "the tool result lost its call");
    let prepared = window(10).prepare_inputs_for_task(None, None).await.unwrap();
    assert_eq!(roles(prepared.message_history), [Role::User, Role::Assistant, Role::Tool, Role::Assistant]);
}

#[tokio::test]
async fn a_completed_run_whose_messages_cannot_be_stored_is_not_stored_at_all() {
    let memory = memory(store(), None, MemoryConfig { full_session_memory: true, ..MemoryConfig::default() });
    let huge = "x".repeat(agentry_memory::MAX_RECORD_BYTES + 1);
    let run = agent_run(RunStatus::Completed, exchange("q", &huge));
    let MemberResponse::Agent(output) = &run else { unreachable!() };
    let run_id: TurnId = output.run_id.as_deref().unwrap().parse().unwrap();
    let error = memory.save_session(&run, SessionType::Agent, None).await.unwrap_err();
    assert!(matches!(error, MemoryError::Store(agentry_memory::StoreError::TooLarge { .. })), "{error:?}");
    assert!(
        memory.load_run(run_id, None).await.unwrap().is_none(),
        "a retry would find it completed without history"
    );
    // Saved again within the limit, it is stored with its history.
    memory
        .save_session(&agent_run(RunStatus::Completed, exchange("q", "a")), SessionType::Agent, None)
        .await
        .unwrap();
    assert_eq!(memory.get_messages().await.unwrap().len(), 2);
}

#[test]
fn a_history_window_of_last_messages_looks_at_a_bounded_number_of_runs() {
    use agentry_memory::rules::history_window;
    use agentry_memory::{HistoryQuery, MAX_HISTORY_SCAN};
    use agentry_types::{RunRecord, Subject};
    let session = SessionId::new();
    let read = std::cell::Cell::new(0usize);
    // Runs without messages (saved while history was off): none fills the window.
    let runs = std::iter::repeat_with(|| {
        read.set(read.get() + 1);
        Ok(RunRecord::new(session, Vec::new(), Subject::user("u")))
    })
    .take(5 * MAX_HISTORY_SCAN);
    let query = HistoryQuery { last_messages: Some(20), ..HistoryQuery::default() };
    let window = history_window(runs, &query, |_, _| Ok(())).unwrap();
    assert!(window.is_empty());
    assert_eq!(read.get(), MAX_HISTORY_SCAN);
}
