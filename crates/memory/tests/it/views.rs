//! Session views (seed 000): `TeamSession` over stored runs.

use std::sync::Arc;

use agentry_memory::{InMemoryStore, LastRunsQuery, SessionUpdate, Store, StoreError, TeamSession};
use agentry_types::agno::{MemberResponse, RunOutput, SessionSummary, TeamRunOutput};
use agentry_types::{Message, Role, RunStatus, SessionRecord, SessionType, Subject, TurnId};
use serde_json::json;

async fn session(store: &Arc<dyn Store>) -> SessionRecord {
    let mut session = SessionRecord::new(SessionType::Team, "crew", Subject::user("u"));
    session.user_id = Some("u1".into());
    session.state.insert("cart".into(), json!(["apple"]));
    store.create_session(&session).await.unwrap();
    session
}

fn team_run(status: RunStatus, messages: Vec<Message>) -> MemberResponse {
    let mut run = TeamRunOutput::new(1_800_000_000);
    run.run_id = Some(TurnId::new().to_string());
    run.team_id = Some("crew".into());
    run.status = status;
    run.messages = Some(messages);
    MemberResponse::Team(Box::new(run))
}

fn member_run(agent: &str, parent: &MemberResponse, messages: Vec<Message>) -> MemberResponse {
    let MemberResponse::Team(parent) = parent else { unreachable!() };
    let mut run = RunOutput::new(1_800_000_000);
    run.run_id = Some(TurnId::new().to_string());
    run.parent_run_id = parent.run_id.clone();
    run.agent_id = Some(agent.into());
    run.status = RunStatus::Completed;
    run.messages = Some(messages);
    MemberResponse::Agent(Box::new(run))
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(Message::text).collect()
}

#[tokio::test]
async fn a_team_session_view_shows_the_stored_session() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let record = session(&store).await;
    let view = TeamSession::load(store.clone(), record.id).await.unwrap();
    assert_eq!(view.team_id.as_deref(), Some("crew"));
    assert_eq!(view.user_id.as_deref(), Some("u1"));
    assert_eq!(view.session_data.unwrap()["session_state"], json!({"cart": ["apple"]}));
    assert_eq!(view.created_at, Some(record.created_at.unix_seconds()));
    assert!(matches!(
        TeamSession::load(store, agentry_types::SessionId::new()).await,
        Err(StoreError::NotFound { .. })
    ));
}

#[tokio::test]
async fn upsert_run_replaces_a_run_with_the_same_run_id_and_get_run_reads_it() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let view = TeamSession::load(store.clone(), session(&store).await.id).await.unwrap();
    let mut run = team_run(RunStatus::Running, vec![Message::user("q")]);
    view.upsert_run(&run).await.unwrap();
    if let MemberResponse::Team(team) = &mut run {
        team.status = RunStatus::Completed;
        team.content = Some(json!("done"));
    }
    view.upsert_run(&run).await.unwrap();
    let MemberResponse::Team(team) = &run else { unreachable!() };
    let stored = view.get_run(team.run_id.as_deref().unwrap()).await.unwrap().unwrap();
    assert_eq!(stored, run);
    let record = store.get_run(team.run_id.as_deref().unwrap().parse().unwrap()).await.unwrap();
    assert!(record.state.is_terminal(), "the state follows the status: {:?}", record.state);
    assert_eq!(record.state.run_status(), RunStatus::Completed);
    assert_eq!(view.runs(10).await.unwrap().len(), 1, "replaced, not added");
    assert_eq!(view.get_run("not-an-id").await.unwrap(), None);
    let mut no_id = TeamRunOutput::new(0);
    no_id.status = RunStatus::Completed;
    assert!(matches!(
        view.upsert_run(&MemberResponse::Team(Box::new(no_id))).await,
        Err(StoreError::InvalidInput(_))
    ));
}

#[tokio::test]
async fn messages_from_the_last_runs_honour_every_filter() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let view = TeamSession::load(store.clone(), session(&store).await.id).await.unwrap();
    let mut replayed = Message::user("old");
    replayed.from_history = true;
    let first = team_run(RunStatus::Completed, vec![Message::system("sys"), replayed, Message::user("q1")]);
    let failed = team_run(RunStatus::Error, vec![Message::user("q2")]);
    let last = team_run(RunStatus::Completed, vec![Message::user("q3"), Message::assistant("a3")]);
    for run in [&first, &failed, &last] {
        view.upsert_run(run).await.unwrap();
    }
    view.upsert_run(&member_run("researcher", &last, vec![Message::assistant("found it")])).await.unwrap();
    let get = |query: LastRunsQuery| {
        let view = view.clone();
        async move { texts(&view.get_messages_from_last_n_runs(&query).await.unwrap()) }
    };
    assert_eq!(get(LastRunsQuery::default()).await, ["sys", "old", "q1", "q2", "q3", "a3"]);
    assert_eq!(get(LastRunsQuery { last_n: Some(2), ..Default::default() }).await, ["q2", "q3", "a3"]);
    assert_eq!(
        get(LastRunsQuery { skip_role: Some(Role::System), ..Default::default() }).await,
        ["old", "q1", "q2", "q3", "a3"]
    );
    assert_eq!(
        get(LastRunsQuery { skip_status: vec![RunStatus::Error], ..Default::default() }).await,
        ["sys", "old", "q1", "q3", "a3"]
    );
    assert_eq!(
        get(LastRunsQuery { skip_history_messages: true, ..Default::default() }).await,
        ["sys", "q1", "q2", "q3", "a3"]
    );
    assert_eq!(
        get(LastRunsQuery { agent_id: Some("researcher".into()), ..Default::default() }).await,
        ["found it"]
    );
    assert!(get(LastRunsQuery { team_id: Some("other".into()), ..Default::default() }).await.is_empty());
    assert_eq!(
        get(LastRunsQuery { last_n: Some(1), skip_status: vec![RunStatus::Completed], ..Default::default() })
            .await,
        ["q2"],
        "skipped runs do not count toward last_n"
    );
    assert_eq!(texts(&view.get_chat_history().await.unwrap()), ["sys", "q1", "q2", "q3", "a3"]);
}

#[tokio::test]
async fn the_session_summary_is_read_from_the_store() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let record = session(&store).await;
    let view = TeamSession::load(store.clone(), record.id).await.unwrap();
    assert_eq!(view.get_session_summary().await.unwrap(), None);
    let summary = SessionSummary { summary: "they planned a trip".into(), topics: None, updated_at: None };
    store
        .update_session(record.id, &SessionUpdate { summary: Some(summary.clone()), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(view.get_session_summary().await.unwrap(), Some(summary));
}

/// A member paused in one turn and kept waiting by the next goes on in the third: each of
/// the three turns lists it among its members (its run is stored with the first), and a
/// later turn does not.
#[tokio::test]
async fn a_turn_lists_the_members_it_took_up_from_the_turns_that_kept_them_waiting() {
    use agentry_types::{
        EventId, RequiredAction, RequiredActionRecord, RunRecord, ThreadId, Timestamp, TurnState,
    };
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let session = session(&store).await;
    let waiting = ThreadId::new_sub_thread();
    let done = |waits: bool| TurnState::Done {
        output: None,
        required_actions: if waits {
            vec![RequiredActionRecord {
                id: EventId::new(),
                created_at: Timestamp::now(),
                action: RequiredAction::ToolApproval { thread_id: waiting.clone(), tool_calls: Vec::new() },
            }]
        } else {
            Vec::new()
        },
        completed_at: Timestamp::now(),
        metrics: None,
    };
    let mut turns: Vec<RunRecord> = Vec::new();
    for waits in [true, true, false, false] {
        let mut turn = RunRecord::new(session.id, Vec::new(), Subject::user("u"));
        turn.team_id = Some("crew".into());
        turn.previous_turn_id = turns.last().map(|previous| previous.id);
        turn.set_state(done(waits));
        store.put_run(&turn, None).await.unwrap();
        turns.push(turn);
    }
    let mut member = RunRecord::new(session.id, Vec::new(), Subject::user("u"));
    member.parent_run_id = Some(turns[0].id);
    member.thread_id = Some(waiting.clone());
    member.agent_id = Some("clerk".into());
    member.set_state(done(false));
    store.put_run(&member, None).await.unwrap();
    // Another member of the first turn, which finished there.
    let mut finished = RunRecord::new(session.id, Vec::new(), Subject::user("u"));
    finished.parent_run_id = Some(turns[0].id);
    finished.thread_id = Some(ThreadId::new_sub_thread());
    finished.agent_id = Some("helper".into());
    finished.set_state(done(false));
    store.put_run(&finished, None).await.unwrap();

    let mut listed = Vec::new();
    for turn in &turns {
        let MemberResponse::Team(output) =
            agentry_memory::run_output(store.as_ref(), turn.clone()).await.unwrap()
        else {
            panic!("a team turn is a TeamRunOutput")
        };
        let agents: Vec<String> = output
            .member_responses
            .iter()
            .map(|member| match member {
                MemberResponse::Agent(run) => run.agent_id.clone().unwrap_or_default(),
                MemberResponse::Team(run) => run.team_id.clone().unwrap_or_default(),
            })
            .collect();
        listed.push(agents);
    }
    assert_eq!(listed, [vec!["clerk", "helper"], vec!["clerk"], vec!["clerk"], vec![]]);
}

/// A session holding runs the runner stored (messages in the history) and runs saved from
/// output documents gives the messages of both, whichever kind is newest.
#[tokio::test]
async fn runs_the_runner_stored_and_runs_saved_from_documents_are_both_read() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let record = session(&store).await;
    let view = TeamSession::load(store.clone(), record.id).await.unwrap();
    let runner_run = |question: &str, answer: &str| {
        let mut run = agentry_types::RunRecord::new(record.id, Vec::new(), Subject::user("u"));
        run.team_id = Some("crew".into());
        run.set_state(agentry_types::TurnState::Done {
            output: None,
            required_actions: Vec::new(),
            completed_at: agentry_types::Timestamp::now(),
            metrics: None,
        });
        let messages = vec![Message::user(question), Message::assistant(answer)]
            .into_iter()
            .map(std::sync::Arc::new)
            .collect();
        (
            run.id,
            agentry_memory::TurnStep {
                run: Some(std::sync::Arc::new(run)),
                messages,
                ..agentry_memory::TurnStep::default()
            },
        )
    };
    let (id, step) = runner_run("one", "1");
    store.write_step(id, &step, None).await.unwrap();
    view.upsert_run(&team_run(RunStatus::Completed, vec![Message::user("two"), Message::assistant("2")]))
        .await
        .unwrap();
    let (id, step) = runner_run("three", "3");
    store.write_step(id, &step, None).await.unwrap();
    let all = view.get_messages_from_last_n_runs(&LastRunsQuery::default()).await.unwrap();
    assert_eq!(texts(&all), ["one", "1", "two", "2", "three", "3"]);
    view.upsert_run(&team_run(RunStatus::Completed, vec![Message::user("four"), Message::assistant("4")]))
        .await
        .unwrap();
    let last_three = view
        .get_messages_from_last_n_runs(&LastRunsQuery { last_n: Some(3), ..LastRunsQuery::default() })
        .await
        .unwrap();
    assert_eq!(texts(&last_three), ["two", "2", "three", "3", "four", "4"]);
}
