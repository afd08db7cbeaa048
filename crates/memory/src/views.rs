//! Session views (seed 000): [`TeamSession`] over a stored team session, with Agno's
//! methods. Runs are the stored run documents, or, for runs the runner stored (which keep
//! their messages in the history and their members as child runs), documents assembled
//! from the records ([`run_output`]); every read takes a bounded window of the latest
//! runs, never the whole session.

use std::collections::HashMap;
use std::sync::Arc;

use agentry_types::agno::{MemberResponse, RunOutput, SessionSummary, TeamRunOutput};
use agentry_types::{Message, Role, RunRecord, RunStatus, SessionId, TurnId, TurnState};
use serde_json::{Map, Value, json};

use crate::error::{StoreError, StoreResult};
use crate::page::{MAX_PAGE, Order, PageRequest};
use crate::store::{DEFAULT_HISTORY_RUNS, HistoryQuery, ParentFilter, RunQuery, Store};

/// The filters of `get_messages_from_last_n_runs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LastRunsQuery {
    /// Only runs of this agent (member runs included).
    pub agent_id: Option<String>,
    /// Only runs of this team.
    pub team_id: Option<String>,
    /// The most runs to read (default [`DEFAULT_HISTORY_RUNS`]).
    pub last_n: Option<usize>,
    /// Leave out messages of this role.
    pub skip_role: Option<Role>,
    /// Leave out runs with these statuses.
    pub skip_status: Vec<RunStatus>,
    /// Leave out messages that were themselves replayed history.
    pub skip_history_messages: bool,
}

/// A team session (Agno's `TeamSession`), read from the store.
#[derive(Debug, Clone)]
pub struct TeamSession {
    store: Arc<dyn Store>,
    /// The session's id.
    pub session_id: SessionId,
    /// The team it belongs to.
    pub team_id: Option<String>,
    /// The user it serves.
    pub user_id: Option<String>,
    /// The workflow it belongs to (from metadata `workflow_id`).
    pub workflow_id: Option<String>,
    /// Team data: name and team id.
    pub team_data: Option<Map<String, Value>>,
    /// Session data: the session state.
    pub session_data: Option<Map<String, Value>>,
    /// Metadata.
    pub metadata: Option<Map<String, Value>>,
    /// The summary.
    pub summary: Option<SessionSummary>,
    /// Unix seconds.
    pub created_at: Option<i64>,
    /// Unix seconds.
    pub updated_at: Option<i64>,
}

impl TeamSession {
    /// Loads a session's view. `NotFound` when it does not exist; `InvalidInput` when it is
    /// not a team session.
    pub async fn load(store: Arc<dyn Store>, session_id: SessionId) -> StoreResult<Self> {
        let session = store.get_session(session_id).await?;
        if session.session_type != agentry_types::SessionType::Team {
            return Err(StoreError::InvalidInput(format!(
                "session {session_id} is of type {}, not team",
                session.session_type.as_str()
            )));
        }
        let mut team_data = Map::new();
        team_data.insert("name".to_owned(), json!(session.name));
        team_data.insert("team_id".to_owned(), json!(session.name));
        let mut session_data = Map::new();
        session_data.insert("session_state".to_owned(), Value::Object(session.state.clone()));
        Ok(Self {
            store,
            session_id,
            team_id: Some(session.name.clone()),
            user_id: session.user_id.clone(),
            workflow_id: session.metadata.get("workflow_id").and_then(Value::as_str).map(str::to_owned),
            team_data: Some(team_data),
            session_data: Some(session_data),
            metadata: (!session.metadata.is_empty()).then(|| session.metadata.clone()),
            summary: session.summary.clone(),
            created_at: Some(session.created_at.unix_seconds()),
            updated_at: Some(session.updated_at.unix_seconds()),
        })
    }

    /// Adds a run, or replaces the run with the same `run_id`. The run needs a `run_id`, and
    /// a replaced run keeps its `parent_run_id` (`InvalidInput` otherwise: the store lists
    /// members by parent).
    pub async fn upsert_run(&self, run: &MemberResponse) -> StoreResult<()> {
        let (run_id, status, parent, agent, team) = match run {
            MemberResponse::Agent(run) => (
                run.run_id.as_deref(),
                run.status,
                run.parent_run_id.as_deref(),
                run.agent_id.as_deref(),
                None,
            ),
            MemberResponse::Team(run) => (
                run.run_id.as_deref(),
                run.status,
                run.parent_run_id.as_deref(),
                None,
                run.team_id.as_deref(),
            ),
        };
        let run_id =
            parse_run_id(run_id.ok_or_else(|| StoreError::InvalidInput("a run needs a run_id".to_owned()))?)?;
        let parent = parent.map(parse_run_id).transpose()?;
        let mut record = match self.store.get_run(run_id).await {
            Ok(existing) => existing,
            Err(StoreError::NotFound { .. }) => {
                let owner = self.store.get_session(self.session_id).await?.owner;
                RunRecord::new(self.session_id, Vec::new(), owner)
            }
            Err(error) => return Err(error),
        };
        record.id = run_id;
        // A run_id of another session is refused by the store rather than moved.
        record.session_id = self.session_id;
        record.parent_run_id = parent;
        record.agent_id = agent.map(str::to_owned);
        record.team_id = team.map(str::to_owned);
        // The state agrees with the status, as the facade's saved runs do: a completed run
        // left `running` would look like a turn a dead process left behind.
        record.state = crate::facade::state_for(status);
        record.status = status;
        record.output = Some(serde_json::to_value(run).map_err(|e| StoreError::InvalidInput(e.to_string()))?);
        record.updated_at = agentry_types::Timestamp::now();
        self.store.put_run(&record, None).await
    }

    /// A run of this session by its `run_id`: its stored document, or one assembled from
    /// the records (with nested member responses).
    pub async fn get_run(&self, run_id: &str) -> StoreResult<Option<MemberResponse>> {
        let Ok(id) = parse_run_id(run_id) else { return Ok(None) };
        match self.store.get_run(id).await {
            Ok(run) if run.session_id == self.session_id => match document(&run)? {
                Some(document) => Ok(Some(document)),
                None => run_output(self.store.as_ref(), run).await.map(Some),
            },
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// The latest runs, newest first, at most `limit`.
    pub async fn runs(&self, limit: usize) -> StoreResult<Vec<MemberResponse>> {
        let query = RunQuery { order: Order::Desc, parent: ParentFilter::Any, ..RunQuery::default() };
        let page =
            self.store.list_runs(self.session_id, &query, &PageRequest::first(limit.min(MAX_PAGE))).await?;
        let mut runs = Vec::with_capacity(page.items.len());
        for run in page.items {
            match document(&run)? {
                Some(document) => runs.push(document),
                None => runs.push(run_output(self.store.as_ref(), run).await?),
            }
        }
        Ok(runs)
    }

    /// The messages of the last `last_n` runs that match the filters, oldest first.
    pub async fn get_messages_from_last_n_runs(&self, query: &LastRunsQuery) -> StoreResult<Vec<Message>> {
        let wanted = query.last_n.unwrap_or(DEFAULT_HISTORY_RUNS);
        let run_query = RunQuery {
            order: Order::Desc,
            parent: if query.agent_id.is_some() { ParentFilter::Any } else { ParentFilter::TopLevel },
            agent_id: query.agent_id.clone(),
            team_id: query.team_id.clone(),
            ..RunQuery::default()
        };
        // Runs the runner stored keep their messages in the history; runs saved from an
        // output document (the facade, `upsert_run`) keep them in the document. A session
        // may hold both: each run is read from its own source.
        let history = HistoryQuery {
            last_runs: Some(wanted),
            agent_id: query.agent_id.clone(),
            team_id: query.team_id.clone(),
            skip_roles: query.skip_role.into_iter().collect(),
            skip_statuses: query.skip_status.clone(),
            skip_history_messages: query.skip_history_messages,
            include_member_runs: query.agent_id.is_some(),
            ..HistoryQuery::default()
        };
        let mut kept: HashMap<TurnId, Vec<Message>> = HashMap::new();
        for stored in self.store.history(self.session_id, &history).await? {
            kept.entry(stored.run_id).or_default().push(Arc::unwrap_or_clone(stored.message));
        }
        let mut taken: Vec<Vec<Message>> = Vec::new();
        let mut page = PageRequest::first(wanted.clamp(1, MAX_PAGE));
        'pages: while taken.len() < wanted {
            let result = self.store.list_runs(self.session_id, &run_query, &page).await?;
            for run in &result.items {
                if query.skip_status.contains(&run.status) {
                    continue;
                }
                let messages = match document(run)? {
                    Some(document) => messages_of(&document)
                        .into_iter()
                        .filter(|message| query.skip_role.is_none_or(|role| message.role != role))
                        .filter(|message| !(query.skip_history_messages && message.from_history))
                        .collect(),
                    // Filtered by the store.
                    None => kept.remove(&run.id).unwrap_or_default(),
                };
                taken.push(messages);
                if taken.len() == wanted {
                    break 'pages;
                }
            }
            match result.next_token {
                Some(token) => page = PageRequest::after(token, wanted.clamp(1, MAX_PAGE)),
                None => break,
            }
        }
        Ok(taken.into_iter().rev().flatten().collect())
    }

    /// The session's summary, read afresh.
    pub async fn get_session_summary(&self) -> StoreResult<Option<SessionSummary>> {
        Ok(self.store.get_session(self.session_id).await?.summary)
    }

    /// The conversation: the messages of the latest runs (at most
    /// [`DEFAULT_HISTORY_RUNS`]), without replayed history, oldest first.
    pub async fn get_chat_history(&self) -> StoreResult<Vec<Message>> {
        self.get_messages_from_last_n_runs(&LastRunsQuery {
            skip_history_messages: true,
            ..LastRunsQuery::default()
        })
        .await
    }
}

fn parse_run_id(id: &str) -> StoreResult<TurnId> {
    id.parse().map_err(|_| StoreError::InvalidInput(format!("run_id {id:?} is not a UUID")))
}

/// The run's output document, if it has one.
fn document(run: &RunRecord) -> StoreResult<Option<MemberResponse>> {
    run.output
        .as_ref()
        .map(|value| {
            serde_json::from_value(value.clone()).map_err(|error| {
                StoreError::Corrupt(format!("run {} has an unreadable output document: {error}", run.id))
            })
        })
        .transpose()
}

fn messages_of(document: &MemberResponse) -> Vec<Message> {
    match document {
        MemberResponse::Agent(run) => run.messages.clone().unwrap_or_default(),
        MemberResponse::Team(run) => run.messages.clone().unwrap_or_default(),
    }
}

/// The Agno document of a run the runner stored: a `TeamRunOutput` (its member runs nested
/// in `member_responses` in the order they started) for a run with members or of a team,
/// a `RunOutput` otherwise. A turn's members are the runs stored with it as parent, after
/// the members it took up again: those that paused in an earlier turn (waiting for an
/// approval or an answer that this turn brought) and went on in this one. Such a member
/// is listed in both turns, as it is now.
///
/// Errors: as the store's reads.
pub fn run_output(
    store: &dyn Store,
    run: RunRecord,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = StoreResult<MemberResponse>> + Send + '_>> {
    Box::pin(async move {
        let mut members = resumed_members(store, &run).await?;
        members.extend(member_runs(store, &run).await?);
        let content = match &run.state {
            TurnState::Done { output, .. } => {
                output.as_ref().and_then(|output| output.message.content.clone()).map(Value::String)
            }
            _ => None,
        };
        if members.is_empty() && run.team_id.is_none() {
            let mut output = RunOutput::new(run.created_at.unix_seconds());
            output.content = content;
            output.run_id = Some(run.id.to_string());
            output.agent_id = run.agent_id.clone();
            output.agent_name = run.agent_id.clone();
            output.session_id = Some(run.session_id.to_string());
            output.parent_run_id = run.parent_run_id.map(|parent| parent.to_string());
            output.status = run.status;
            return Ok(MemberResponse::Agent(Box::new(output)));
        }
        let mut output = TeamRunOutput::new(run.created_at.unix_seconds());
        output.content = content;
        output.run_id = Some(run.id.to_string());
        output.team_id = run.team_id.clone().or_else(|| run.agent_id.clone());
        output.team_name = output.team_id.clone();
        output.session_id = Some(run.session_id.to_string());
        output.parent_run_id = run.parent_run_id.map(|parent| parent.to_string());
        output.status = run.status;
        for member in members {
            output.member_responses.push(run_output(store, member).await?);
        }
        Ok(MemberResponse::Team(Box::new(output)))
    })
}

/// The most earlier turns [`resumed_members`] looks through: a member waiting that long
/// is shown in the turn it started in only.
const MAX_RESUMED_CHAIN: usize = 64;

/// The member runs of earlier turns that `run` (a turn) took up again, in the order they
/// started: each waited on its thread when the previous turn ended, and its run is a
/// member of the turn it started in, found back along the turns that kept it waiting.
async fn resumed_members(store: &dyn Store, run: &RunRecord) -> StoreResult<Vec<RunRecord>> {
    let waiting_on = |turn: &RunRecord| -> std::collections::HashSet<agentry_types::ThreadId> {
        let actions = turn.state.required_actions();
        actions
            .iter()
            .filter_map(|record| record.action.thread_id())
            .filter(|thread| !thread.is_main())
            .cloned()
            .collect()
    };
    if run.parent_run_id.is_some() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    let mut wanted = None;
    let mut at = run.previous_turn_id;
    for _ in 0..MAX_RESUMED_CHAIN {
        let Some(id) = at else { break };
        let turn = match store.get_run(id).await {
            Ok(turn) => turn,
            Err(StoreError::NotFound { .. }) => break,
            Err(error) => return Err(error),
        };
        // The threads still to find that this turn too ended waiting on.
        let waiting = waiting_on(&turn);
        let mut threads = match wanted.take() {
            None => waiting,
            Some(wanted) => waiting.intersection(&wanted).cloned().collect(),
        };
        if threads.is_empty() {
            break;
        }
        for member in member_runs(store, &turn).await? {
            if takes_threads(store, &member, &mut threads).await? {
                found.push(member);
            }
        }
        wanted = Some(threads);
        at = turn.previous_turn_id;
    }
    found.sort_by_key(|member| member.created_at);
    Ok(found)
}

/// Whether `member`, or a member run under it (the member of a team nested in a team),
/// ran one of `threads`; those it ran are taken out of `threads`.
async fn takes_threads(
    store: &dyn Store,
    member: &RunRecord,
    threads: &mut std::collections::HashSet<agentry_types::ThreadId>,
) -> StoreResult<bool> {
    /// Nesting levels looked into.
    const MAX_NESTING: usize = 8;
    let mut took = false;
    let mut level = vec![member.clone()];
    for _ in 0..MAX_NESTING {
        let mut below = Vec::new();
        for run in level {
            took |= run.thread_id.as_ref().is_some_and(|thread| threads.remove(thread));
            if !threads.is_empty() {
                below.extend(member_runs(store, &run).await?);
            }
        }
        if below.is_empty() || threads.is_empty() {
            break;
        }
        level = below;
    }
    Ok(took)
}

/// A run's member runs, in the order they started.
async fn member_runs(store: &dyn Store, run: &RunRecord) -> StoreResult<Vec<RunRecord>> {
    let query = RunQuery { order: Order::Asc, parent: ParentFilter::Of(run.id), ..RunQuery::default() };
    let mut page = PageRequest::first(MAX_PAGE);
    let mut members = Vec::new();
    loop {
        let found = store.list_runs(run.session_id, &query, &page).await?;
        members.extend(found.items);
        match found.next_token {
            Some(token) => page = PageRequest::after(token, MAX_PAGE),
            None => return Ok(members),
        }
    }
}
