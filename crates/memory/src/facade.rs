//! The Memory facade (seed 003): one instance shared by agents, teams and workflows, with
//! the session type chosen per call.
//!
//! Before a task, [`Memory::prepare_inputs_for_task`] gathers the message history, the
//! session summary (context injection), the user profile (system-prompt injection) and the
//! session and caller metadata. After it, [`Memory::save_session`] stores the run: an
//! incomplete run (paused, error, cancelled) is checkpointed without any memory processing,
//! so any process can load and resume it ([`Memory::load_resumable_run`]); a completed run
//! has its messages kept for history and, when enabled, the summary and the user profile
//! updated through the [`Model`].

use std::sync::Arc;

use agentry_model::{Model, ModelError, ModelRequest};
use agentry_types::agno::{MemberResponse, SessionSummary};
use agentry_types::{
    Fence, Message, Role, RunRecord, RunStatus, SessionId, SessionRecord, SessionType, Subject, Timestamp,
    TurnId, TurnState, UserProfile,
};
use futures_util::StreamExt;
use serde_json::{Map, Value};

use crate::error::StoreError;
use crate::page::PageRequest;
use crate::store::{HistoryQuery, SessionQuery, SessionUpdate, Store, TurnStep};

/// How a new user profile combines with the stored one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UserMemoryMode {
    /// Merge the new facts into the stored profile.
    #[default]
    Update,
    /// Replace the stored profile.
    Replace,
}

/// The facade's settings (the parameters of seed 003 besides storage and model).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryConfig {
    /// The session used when a call names none; generated when absent.
    pub session_id: Option<SessionId>,
    /// The user served; generated when absent.
    pub user_id: Option<String>,
    /// Keep every completed run's messages and replay them as history.
    pub full_session_memory: bool,
    /// Keep a running summary of the session (needs a model).
    pub summary_memory: bool,
    /// Build a profile of the user from the conversation (needs a model).
    pub user_analysis_memory: bool,
    /// A JSON Schema (an object schema) the profile follows.
    pub user_profile_schema: Option<Value>,
    /// Let the profile grow fields beyond the schema.
    pub dynamic_user_profile: bool,
    /// Replay at most this many messages of history.
    pub num_last_messages: Option<usize>,
    /// Show tool calls and results to the summary and profile analysis.
    pub feed_tool_call_results: bool,
    /// Merge or replace the profile.
    pub user_memory_mode: UserMemoryMode,
}

/// Why a facade call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The settings contradict each other.
    #[error("invalid memory settings: {0}")]
    InvalidConfig(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A session exists with another type than the call's.
    #[error("session {session_id} is of type {found}, not {expected}")]
    SessionTypeMismatch {
        /// The session.
        session_id: SessionId,
        /// The type the call asked for.
        expected: &'static str,
        /// The session's type.
        found: &'static str,
    },
    /// A run output names an id that is not a valid run or session id.
    #[error("invalid id in the run output: {0}")]
    InvalidOutput(String),
    /// The run was saved, but updating the summary or profile failed.
    #[error("run {run_id} was saved, but updating memory failed: {reason}")]
    MemoryUpdate {
        /// The saved run.
        run_id: TurnId,
        /// What failed.
        reason: String,
    },
}

/// A run output as callers hand it over: an agent's or a team's (Agno shapes).
pub type RunOutputDocument = MemberResponse;

/// What [`Memory::prepare_inputs_for_task`] gathers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PreparedInputs {
    /// Earlier messages to put before the new input, each marked as history.
    pub message_history: Vec<Message>,
    /// The session summary, as context for the model.
    pub context_injection: Option<String>,
    /// The user profile, for the system prompt.
    pub system_prompt_injection: Option<String>,
    /// Session and caller metadata, as text.
    pub metadata_injection: Option<String>,
}

/// The Memory facade.
#[derive(Debug, Clone)]
pub struct Memory {
    store: Arc<dyn Store>,
    model: Option<Arc<dyn Model>>,
    session_id: SessionId,
    user_id: String,
    config: MemoryConfig,
}

/// A session memory bound to one session type (`get_session_memory`): always available when
/// storage is, because incomplete runs must be checkpointed for resumption.
#[derive(Debug, Clone)]
pub struct SessionMemory {
    memory: Memory,
    session_type: SessionType,
}

impl SessionMemory {
    /// The session type it serves.
    #[must_use]
    pub const fn session_type(&self) -> SessionType {
        self.session_type
    }

    /// Saves a run of this session type ([`Memory::save_session`]).
    pub async fn save(
        &self,
        output: &RunOutputDocument,
        agent_id: Option<&str>,
    ) -> Result<RunRecord, MemoryError> {
        self.memory.save_session(output, self.session_type, agent_id).await
    }

    /// Prepares a task's inputs ([`Memory::prepare_inputs_for_task`]).
    pub async fn prepare(
        &self,
        agent_metadata: Option<&Map<String, Value>>,
    ) -> Result<PreparedInputs, MemoryError> {
        self.memory.prepare_inputs_for_task(Some(self.session_type), agent_metadata).await
    }
}

/// The user memory (`user_memory`): the profile of the user the facade's session serves,
/// the one its analysis builds and its prompts show: the configured user, else the user of
/// the facade's session (a facade opened on a session another created), else the facade's
/// own.
#[derive(Debug, Clone)]
pub struct UserMemoryHandle {
    memory: Memory,
}

impl UserMemoryHandle {
    /// The user the profile belongs to (see the type).
    ///
    /// Errors: `Store` when the session cannot be read.
    pub async fn user_id(&self) -> Result<String, MemoryError> {
        let session = match self.memory.store.get_session(self.memory.session_id).await {
            Ok(session) => Some(session),
            Err(StoreError::NotFound { .. }) => None,
            Err(error) => return Err(error.into()),
        };
        Ok(self.memory.user_of(session.as_ref()).to_owned())
    }

    /// The user's profile, if one was built.
    pub async fn profile(&self) -> Result<Option<Value>, MemoryError> {
        let user_id = self.user_id().await?;
        Ok(self.memory.store.profile(&user_id).await?.map(|profile| profile.profile))
    }

    /// Replaces the user's profile.
    pub async fn set_profile(&self, profile: Value) -> Result<(), MemoryError> {
        let profile = UserProfile { user_id: self.user_id().await?, profile, updated_at: Timestamp::now() };
        Ok(self.memory.store.put_profile(&profile).await?)
    }
}

fn type_name(kind: SessionType) -> &'static str {
    kind.as_str()
}

impl MemoryConfig {
    /// Checks the settings, given whether an analysis model comes with them: a model is
    /// required when `summary_memory` or `user_analysis_memory` is on; a profile schema
    /// must be a JSON object schema; `num_last_messages` is at least 1. Errors:
    /// `InvalidConfig`, saying which.
    pub fn check(&self, has_model: bool) -> Result<(), MemoryError> {
        if (self.summary_memory || self.user_analysis_memory) && !has_model {
            return Err(MemoryError::InvalidConfig(
                "summary_memory and user_analysis_memory need a model for the analysis".to_owned(),
            ));
        }
        if let Some(schema) = &self.user_profile_schema {
            let is_object_schema = schema.as_object().is_some_and(|object| {
                object.get("type").is_none_or(|kind| kind == "object")
                    && object.get("properties").is_none_or(Value::is_object)
            });
            if !is_object_schema {
                return Err(MemoryError::InvalidConfig(
                    "user_profile_schema must be a JSON Schema of an object (type \"object\", properties an object)"
                        .to_owned(),
                ));
            }
        }
        if self.num_last_messages == Some(0) {
            return Err(MemoryError::InvalidConfig("num_last_messages must be at least 1".to_owned()));
        }
        Ok(())
    }
}

impl Memory {
    /// A facade over `store`. `model` is required when `summary_memory` or
    /// `user_analysis_memory` is on; a profile schema must be a JSON object schema.
    pub fn new(
        store: Arc<dyn Store>,
        model: Option<Arc<dyn Model>>,
        config: MemoryConfig,
    ) -> Result<Self, MemoryError> {
        config.check(model.is_some())?;
        Ok(Self {
            store,
            model,
            session_id: config.session_id.unwrap_or_else(SessionId::new),
            user_id: config.user_id.clone().unwrap_or_else(|| format!("user-{}", SessionId::new())),
            config,
        })
    }

    /// The user whose profile a session's memory reads and updates: the configured one,
    /// else the session's own (a facade opened on a session another created), else this
    /// facade's.
    fn user_of<'a>(&'a self, session: Option<&'a SessionRecord>) -> &'a str {
        match (self.config.user_id.as_deref(), session.and_then(|session| session.user_id.as_deref())) {
            (Some(user), _) | (None, Some(user)) => user,
            (None, None) => &self.user_id,
        }
    }

    /// The session used when a call names none.
    #[must_use]
    pub const fn session_id(&self) -> SessionId {
        self.session_id
    }

    /// The user served.
    #[must_use]
    pub fn user_id(&self) -> &str {
        &self.user_id
    }

    /// The session memory for a session type (`get_session_memory`).
    #[must_use]
    pub fn session_memory(&self, session_type: SessionType) -> SessionMemory {
        SessionMemory { memory: self.clone(), session_type }
    }

    /// The user memory, when `user_analysis_memory` is on.
    #[must_use]
    pub fn user_memory(&self) -> Option<UserMemoryHandle> {
        self.config.user_analysis_memory.then(|| UserMemoryHandle { memory: self.clone() })
    }

    async fn session_of_type(
        &self,
        id: SessionId,
        kind: SessionType,
        name: &str,
    ) -> Result<SessionRecord, MemoryError> {
        match self.store.get_session(id).await {
            Ok(session) if session.session_type == kind => Ok(session),
            Ok(session) => Err(MemoryError::SessionTypeMismatch {
                session_id: id,
                expected: type_name(kind),
                found: type_name(session.session_type),
            }),
            Err(StoreError::NotFound { .. }) => {
                let mut session = SessionRecord::new(kind, name, Subject::user(&self.user_id));
                session.id = id;
                session.user_id = Some(self.user_id.clone());
                match self.store.create_session(&session).await {
                    // Another caller created it meanwhile; read what it wrote.
                    Err(StoreError::Conflict(_)) => Ok(self.store.get_session(id).await?),
                    other => other.map(|()| session).map_err(MemoryError::from),
                }
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Gathers the memory a task starts from: history (`full_session_memory`, at most
    /// `num_last_messages`), the summary (`summary_memory`), the user profile
    /// (`user_analysis_memory`) and metadata. The session type defaults to agent.
    pub async fn prepare_inputs_for_task(
        &self,
        session_type: Option<SessionType>,
        agent_metadata: Option<&Map<String, Value>>,
    ) -> Result<PreparedInputs, MemoryError> {
        let kind = session_type.unwrap_or(SessionType::Agent);
        let session = match self.store.get_session(self.session_id).await {
            Ok(session) if session.session_type != kind => {
                return Err(MemoryError::SessionTypeMismatch {
                    session_id: self.session_id,
                    expected: type_name(kind),
                    found: type_name(session.session_type),
                });
            }
            Ok(session) => Some(session),
            Err(StoreError::NotFound { .. }) => None,
            Err(error) => return Err(error.into()),
        };
        let mut prepared = PreparedInputs::default();
        if let (true, Some(_)) = (self.config.full_session_memory, &session) {
            prepared.message_history = self.history(self.session_id).await?;
        }
        if self.config.summary_memory
            && let Some(summary) = session.as_ref().and_then(|session| session.summary.as_ref())
        {
            prepared.context_injection =
                Some(format!("Summary of the conversation so far:\n{}", summary.summary));
        }
        if self.config.user_analysis_memory
            && let Some(profile) = self.store.profile(self.user_of(session.as_ref())).await?
        {
            let text = serde_json::to_string_pretty(&profile.profile).unwrap_or_default();
            prepared.system_prompt_injection = Some(format!("What you know about the user:\n{text}"));
        }
        let mut metadata = Vec::new();
        if let Some(session) = session.as_ref().filter(|session| !session.metadata.is_empty()) {
            metadata.push(format!("Session metadata: {}", Value::Object(session.metadata.clone())));
        }
        if let Some(agent) = agent_metadata.filter(|agent| !agent.is_empty()) {
            metadata.push(format!("Agent metadata: {}", Value::Object(agent.clone())));
        }
        if !metadata.is_empty() {
            prepared.metadata_injection = Some(metadata.join("\n"));
        }
        Ok(prepared)
    }

    async fn history(&self, session: SessionId) -> Result<Vec<Message>, MemoryError> {
        let query = HistoryQuery {
            last_messages: self.config.num_last_messages,
            // Incomplete runs are checkpoints, not conversation.
            skip_statuses: vec![
                RunStatus::Paused,
                RunStatus::Error,
                RunStatus::Cancelled,
                RunStatus::Running,
            ],
            skip_history_messages: true,
            // Each saved run's system prompt is the task's own, not conversation.
            skip_roles: vec![Role::System],
            ..HistoryQuery::default()
        };
        Ok(self
            .store
            .history(session, &query)
            .await?
            .into_iter()
            .map(|entry| Message { from_history: true, ..Arc::unwrap_or_clone(entry.message) })
            .collect())
    }

    /// Saves a run. Incomplete runs (paused, error, cancelled) are checkpointed without
    /// memory processing; a completed run keeps its messages (`full_session_memory`) and
    /// updates the summary (`summary_memory`) and the user profile
    /// (`user_analysis_memory`). The run is durable before any analysis starts; when the
    /// analysis fails, the error says the run was saved. A run saved again keeps its
    /// `parent_run_id` (the store refuses a move with `InvalidInput`).
    pub async fn save_session(
        &self,
        output: &RunOutputDocument,
        session_type: SessionType,
        agent_id: Option<&str>,
    ) -> Result<RunRecord, MemoryError> {
        let facts = OutputFacts::of(output);
        let session_id = match facts.session_id {
            Some(id) => id.parse().map_err(|_| MemoryError::InvalidOutput(format!("session id {id:?}")))?,
            None => self.session_id,
        };
        // A team session is named by the team's id, which its runs carry (a team's view
        // and its filters match runs by it); other sessions by the agent's name.
        let name = match session_type {
            SessionType::Team => agent_id.or(facts.team_id).or(facts.name),
            _ => agent_id.or(facts.name).or(facts.team_id),
        };
        let name = name.or(facts.agent_id).unwrap_or("memory");
        self.session_of_type(session_id, session_type, name).await?;
        let run_id: TurnId = match facts.run_id {
            Some(id) => id.parse().map_err(|_| MemoryError::InvalidOutput(format!("run id {id:?}")))?,
            None => TurnId::new(),
        };
        let previous = match self.store.get_run(run_id).await {
            Ok(run) => Some(run),
            Err(StoreError::NotFound { .. }) => None,
            Err(error) => return Err(error.into()),
        };
        let document =
            serde_json::to_value(output).map_err(|error| MemoryError::InvalidOutput(error.to_string()))?;
        let mut run = previous
            .clone()
            .unwrap_or_else(|| RunRecord::new(session_id, Vec::new(), Subject::user(&self.user_id)));
        run.id = run_id;
        run.session_id = session_id;
        run.parent_run_id = facts.parent_run_id.and_then(|id| id.parse().ok());
        run.agent_id = agent_id.map(str::to_owned).or_else(|| facts.agent_id.map(str::to_owned));
        run.team_id = facts.team_id.map(str::to_owned);
        run.state = state_for(facts.status);
        run.status = facts.status;
        run.output = Some(document);
        run.updated_at = Timestamp::now();
        let completed = facts.status == RunStatus::Completed;
        let newly_completed =
            completed && previous.as_ref().is_none_or(|run| run.status != RunStatus::Completed);
        // The record and its messages are one write: a run stored as completed always has
        // its history, so a retry after a failure stores both or finds both.
        let messages = if newly_completed && self.config.full_session_memory {
            facts.messages.iter().cloned().map(Arc::new).collect()
        } else {
            Vec::new()
        };
        let step = TurnStep { run: Some(Arc::new(run.clone())), messages, ..TurnStep::default() };
        self.store.write_step(run.id, &step, None).await?;
        if !newly_completed {
            return Ok(run);
        }
        if let Err(reason) = self.process_memory(session_id, facts.messages, None).await {
            return Err(MemoryError::MemoryUpdate { run_id: run.id, reason });
        }
        Ok(run)
    }

    /// Updates the session summary and the user profile (as the settings enable them) from
    /// the messages of a completed run, through the model. The runner calls it after a turn
    /// it stored itself.
    ///
    /// Errors: `MemoryUpdate` naming the run and what failed (the model, its answer, the
    /// store).
    pub async fn update_memory(&self, run_id: TurnId, messages: &[Message]) -> Result<(), MemoryError> {
        self.update_memory_under(run_id, messages, None).await
    }

    /// [`Memory::update_memory`] for a turn running under `fence`: the summary is written
    /// only while the turn's lease is still held under it, so a turn that was handed over
    /// or taken over while its summary was being written cannot replace the one its next
    /// holder wrote (the update then fails with `MemoryUpdate`, saying the fence is stale).
    /// The user profile belongs to the user, not the session, and is written either way.
    ///
    /// Errors: as [`Memory::update_memory`].
    pub async fn update_memory_under(
        &self,
        run_id: TurnId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<(), MemoryError> {
        self.process_memory(self.session_id, messages, fence)
            .await
            .map_err(|reason| MemoryError::MemoryUpdate { run_id, reason })
    }

    /// Whether a completed run updates anything (a summary or a user profile).
    #[must_use]
    pub const fn updates_after_runs(&self) -> bool {
        self.config.summary_memory || self.config.user_analysis_memory
    }

    async fn process_memory(
        &self,
        session_id: SessionId,
        messages: &[Message],
        fence: Option<Fence>,
    ) -> Result<(), String> {
        let Some(model) = &self.model else { return Ok(()) };
        let transcript = self.transcript(messages);
        // The profile is the user's: a summary that fails (or is refused by a stale fence)
        // does not keep it from being written.
        let summarized = self.summarize(model.as_ref(), session_id, &transcript, fence).await;
        let profiled = self.analyze_user(model.as_ref(), session_id, &transcript).await;
        summarized.and(profiled)
    }

    async fn summarize(
        &self,
        model: &dyn Model,
        session_id: SessionId,
        transcript: &str,
        fence: Option<Fence>,
    ) -> Result<(), String> {
        if self.config.summary_memory {
            let session = self.store.get_session(session_id).await.map_err(|e| e.to_string())?;
            let previous = session.summary.as_ref().map_or("(none)", |summary| summary.summary.as_str());
            let prompt = format!(
                "Update the summary of this conversation. Previous summary: {previous}\n\nNew messages:\n{transcript}\n\nAnswer with the new summary only."
            );
            let summary = complete(model, &prompt).await.map_err(|e| e.to_string())?;
            // An empty answer is no summary: the one the session has is kept.
            if summary.trim().is_empty() {
                return Err("the model's summary is empty; the session keeps its previous one".to_owned());
            }
            let update = SessionUpdate {
                summary: Some(SessionSummary {
                    summary: summary.trim().to_owned(),
                    topics: None,
                    updated_at: Some(Timestamp::now().unix_seconds()),
                }),
                fence,
                ..SessionUpdate::default()
            };
            self.store.update_session(session_id, &update).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    async fn analyze_user(
        &self,
        model: &dyn Model,
        session_id: SessionId,
        transcript: &str,
    ) -> Result<(), String> {
        if self.config.user_analysis_memory {
            let session = match self.store.get_session(session_id).await {
                Ok(session) => Some(session),
                Err(StoreError::NotFound { .. }) => None,
                Err(error) => return Err(error.to_string()),
            };
            let user_id = self.user_of(session.as_ref()).to_owned();
            let current = self.store.profile(&user_id).await.map_err(|e| e.to_string())?;
            let current_profile = current.as_ref().map_or(Value::Object(Map::new()), |p| p.profile.clone());
            let schema = self
                .config
                .user_profile_schema
                .as_ref()
                .map(|schema| format!("\nThe profile follows this JSON Schema:\n{schema}"))
                .unwrap_or_default();
            let prompt = format!(
                "Extract what this conversation tells about the user as one JSON object.{schema}\nCurrent profile: {current_profile}\n\nConversation:\n{transcript}\n\nAnswer with the JSON object only."
            );
            let answer = complete(model, &prompt).await.map_err(|e| e.to_string())?;
            let extracted = parse_json_object(&answer)?;
            let mut extracted = self.fit_to_schema(extracted)?;
            let mode = self.config.user_memory_mode;
            if mode == UserMemoryMode::Update {
                // Only what the model changed is merged: a field it repeated as it was read
                // above must not undo what another session of the same user stored since.
                extracted.retain(|key, value| current_profile.get(key) != Some(value));
                if extracted.is_empty() && current.is_some() {
                    return Ok(());
                }
            }
            let profile =
                UserProfile { user_id, profile: Value::Object(extracted), updated_at: Timestamp::now() };
            // An update is merged by the store in one step, so that another session's
            // fields stored meanwhile stay too.
            match mode {
                UserMemoryMode::Update => self.store.merge_profile(&profile).await.map(drop),
                UserMemoryMode::Replace => self.store.put_profile(&profile).await,
            }
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The messages shown to the analysis: tool calls and results only with
    /// `feed_tool_call_results`.
    fn transcript(&self, messages: &[Message]) -> String {
        messages
            .iter()
            .filter(|message| {
                self.config.feed_tool_call_results
                    || (message.role != Role::Tool && message.tool_calls.is_empty())
            })
            .map(|message| {
                let mut line = format!("{}: {}", message.role.as_str(), message.text());
                if self.config.feed_tool_call_results {
                    for call in &message.tool_calls {
                        line.push_str(&format!(
                            " [calls {}({})]",
                            call.function.name, call.function.arguments
                        ));
                    }
                }
                line
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Keeps the extracted profile within the schema: with `dynamic_user_profile` new
    /// fields are kept; otherwise only the schema's properties. A property of the wrong
    /// JSON type is an error.
    fn fit_to_schema(&self, mut profile: Map<String, Value>) -> Result<Map<String, Value>, String> {
        let Some(properties) = self
            .config
            .user_profile_schema
            .as_ref()
            .and_then(|schema| schema.get("properties"))
            .and_then(Value::as_object)
        else {
            return Ok(profile);
        };
        if !self.config.dynamic_user_profile {
            profile.retain(|key, _| properties.contains_key(key));
        }
        for (key, value) in &profile {
            let expected =
                properties.get(key).and_then(|property| property.get("type")).and_then(Value::as_str);
            let fits = match expected {
                None => true,
                Some("string") => value.is_string(),
                Some("integer") => value.is_i64() || value.is_u64(),
                Some("number") => value.is_number(),
                Some("boolean") => value.is_boolean(),
                Some("array") => value.is_array(),
                Some("object") => value.is_object(),
                Some("null") => value.is_null(),
                Some(_) => true,
            };
            if !fits {
                return Err(format!(
                    "profile field {key:?} is {value}, not of type {}",
                    expected.unwrap_or("any")
                ));
            }
        }
        Ok(profile)
    }

    /// The current session (or `session_id`'s), if it exists.
    pub async fn get_session(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<Option<SessionRecord>, MemoryError> {
        match self.store.get_session(session_id.unwrap_or(self.session_id)).await {
            Ok(session) => Ok(Some(session)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Finds a session by id (default: the current one).
    pub async fn find_session(
        &self,
        session_id: Option<SessionId>,
    ) -> Result<Option<SessionRecord>, MemoryError> {
        self.get_session(session_id).await
    }

    /// The current session's history (empty when there is no session).
    pub async fn get_messages(&self) -> Result<Vec<Message>, MemoryError> {
        match self.history(self.session_id).await {
            Err(MemoryError::Store(StoreError::NotFound { .. })) => Ok(Vec::new()),
            other => other,
        }
    }

    /// Sets metadata keys on the current session (a `null` value removes a key).
    pub async fn set_metadata(&self, metadata: Map<String, Value>) -> Result<(), MemoryError> {
        let update = SessionUpdate { metadata: Some(metadata), ..SessionUpdate::default() };
        self.store.update_session(self.session_id, &update).await?;
        Ok(())
    }

    /// The current session's metadata, if the session exists.
    pub async fn get_metadata(&self) -> Result<Option<Map<String, Value>>, MemoryError> {
        Ok(self.get_session(None).await?.map(|session| session.metadata))
    }

    /// The sessions of a user (default: the facade's), newest first.
    pub async fn list_sessions(&self, user_id: Option<&str>) -> Result<Vec<SessionRecord>, MemoryError> {
        let query = SessionQuery {
            user_id: Some(user_id.unwrap_or(&self.user_id).to_owned()),
            ..SessionQuery::default()
        };
        let mut sessions = Vec::new();
        let mut page = PageRequest::first(crate::page::MAX_PAGE);
        loop {
            let result = self.store.list_sessions(&query, &page).await?;
            sessions.extend(result.items);
            match result.next_token {
                Some(token) => page = PageRequest::after(token, crate::page::MAX_PAGE),
                None => return Ok(sessions),
            }
        }
    }

    /// Deletes a session (default: the current one). `false` when it did not exist.
    pub async fn delete_session(&self, session_id: Option<SessionId>) -> Result<bool, MemoryError> {
        match self.store.delete_session(session_id.unwrap_or(self.session_id)).await {
            Ok(()) => Ok(true),
            Err(StoreError::NotFound { .. }) => Ok(false),
            Err(error) => Err(error.into()),
        }
    }

    /// A run that can be resumed (paused, error or cancelled), by id. With `agent_id`, only
    /// a run of that agent or team (a team's run is found by the team's id). `None` when it
    /// does not exist or is not resumable.
    pub async fn load_resumable_run(
        &self,
        run_id: TurnId,
        agent_id: Option<&str>,
    ) -> Result<Option<RunRecord>, MemoryError> {
        Ok(self
            .load_run(run_id, agent_id)
            .await?
            .filter(|run| matches!(run.status, RunStatus::Paused | RunStatus::Error | RunStatus::Cancelled)))
    }

    /// A run by id, whatever its status. With `agent_id`, only a run of that agent or team.
    pub async fn load_run(
        &self,
        run_id: TurnId,
        agent_id: Option<&str>,
    ) -> Result<Option<RunRecord>, MemoryError> {
        let ran = |run: &RunRecord, id: &str| {
            run.agent_id.as_deref() == Some(id) || run.team_id.as_deref() == Some(id)
        };
        match self.store.get_run(run_id).await {
            Ok(run) if agent_id.is_none_or(|id| ran(&run, id)) => Ok(Some(run)),
            Ok(_) | Err(StoreError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }
}

/// What the facade reads from an output document.
struct OutputFacts<'a> {
    session_id: Option<&'a str>,
    run_id: Option<&'a str>,
    parent_run_id: Option<&'a str>,
    agent_id: Option<&'a str>,
    team_id: Option<&'a str>,
    name: Option<&'a str>,
    status: RunStatus,
    messages: &'a [Message],
}

impl<'a> OutputFacts<'a> {
    fn of(output: &'a RunOutputDocument) -> Self {
        match output {
            MemberResponse::Agent(run) => Self {
                session_id: run.session_id.as_deref(),
                run_id: run.run_id.as_deref(),
                parent_run_id: run.parent_run_id.as_deref(),
                agent_id: run.agent_id.as_deref(),
                team_id: None,
                name: run.agent_name.as_deref(),
                status: run.status,
                messages: run.messages.as_deref().unwrap_or_default(),
            },
            MemberResponse::Team(run) => Self {
                session_id: run.session_id.as_deref(),
                run_id: run.run_id.as_deref(),
                parent_run_id: run.parent_run_id.as_deref(),
                agent_id: None,
                team_id: run.team_id.as_deref(),
                name: run.team_name.as_deref(),
                status: run.status,
                messages: run.messages.as_deref().unwrap_or_default(),
            },
        }
    }
}

/// The turn state a run's status stands for (an output document has no required actions
/// of the harness's kind; a paused run keeps its details in the document).
pub(crate) fn state_for(status: RunStatus) -> TurnState {
    let now = Timestamp::now();
    match status {
        RunStatus::Pending | RunStatus::Running => TurnState::Running,
        RunStatus::Completed | RunStatus::Paused => {
            TurnState::Done { output: None, required_actions: Vec::new(), completed_at: now, metrics: None }
        }
        RunStatus::Cancelled => TurnState::Cancelled {
            reason: agentry_types::CancellationReason::ClientCancelled,
            completed_at: now,
            metrics: None,
        },
        RunStatus::Error => {
            TurnState::Error { message: "the run failed".to_owned(), completed_at: now, metrics: None }
        }
    }
}

/// Runs a one-message completion and returns its text.
async fn complete(model: &dyn Model, prompt: &str) -> Result<String, ModelError> {
    let mut stream = model.stream(ModelRequest::new(vec![Message::user(prompt)])).await?;
    let mut text = String::new();
    while let Some(delta) = stream.next().await {
        if let Some(piece) = delta?.content {
            text.push_str(&piece);
        }
    }
    Ok(text)
}

/// Reads a JSON object from a model's answer, tolerating a code fence around it.
fn parse_json_object(answer: &str) -> Result<Map<String, Value>, String> {
    let trimmed = answer.trim();
    let start =
        trimmed.find('{').ok_or_else(|| format!("the model's profile is not a JSON object: {trimmed:?}"))?;
    let end =
        trimmed.rfind('}').ok_or_else(|| format!("the model's profile is not a JSON object: {trimmed:?}"))?;
    // The last `}` may come before the first `{` (an answer cut short).
    match trimmed.get(start..=end).map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(object))) => Ok(object),
        _ => Err(format!("the model's profile is not a JSON object: {trimmed:?}")),
    }
}
