//! Tools: the [`Tool`] trait, function tools from async Rust functions, client-side tools
//! and the built-in `ask_user_question`.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

use agentry_events::{EventPayload, TeamContext, ThreadParent};
use agentry_types::{BudgetLimit, McpServerRef, SessionId, ThreadId, ThreadMessage, ToolSpec, TurnId};

use crate::agent::Agent;
use crate::engine::ThreadScope;
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// What a running tool call knows about itself, and what it may do on the turn: start
/// sub-agent threads ([`ToolContext::run_thread`]).
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// The thread the call was made on.
    pub thread_id: ThreadId,
    /// The model's id for the call.
    pub tool_call_id: String,
    /// Stable for this call across crashes and retries: a tool with side effects can use it
    /// to do its work at most once (for example as an idempotency key of a payment API).
    pub idempotency_key: String,
    /// The model message that made the call, when it is known (the agent-team events of a
    /// call carry it as `messageID`).
    pub message_id: Option<agentry_types::EventId>,
    /// The turn the call runs in; absent for a call made outside a turn.
    pub(crate) scope: Option<Arc<ThreadScope>>,
}

impl ToolContext {
    /// A context for calling a tool outside a turn (tests, tools calling tools): it cannot
    /// start threads.
    #[must_use]
    pub fn new(
        session_id: SessionId,
        turn_id: TurnId,
        thread_id: ThreadId,
        tool_call_id: impl Into<String>,
        idempotency_key: impl Into<String>,
    ) -> Self {
        Self {
            session_id,
            turn_id,
            thread_id,
            tool_call_id: tool_call_id.into(),
            idempotency_key: idempotency_key.into(),
            message_id: None,
            scope: None,
        }
    }

    /// Runs `agent` on a new sub-agent thread of this call's turn with `task` as its input:
    /// `thread.created` (this thread and call as the parent), the agent's events on the new
    /// thread, `thread.done`; the member run is stored with the turn as its parent run.
    /// Calls made in parallel run their threads concurrently. Returns the thread's answer.
    ///
    /// Errors: `ToolError::Failed` with the thread's error (a failed, cancelled or paused
    /// member), or when the call does not run inside a turn.
    pub async fn run_thread(
        &self,
        agent: &Agent,
        task: impl Into<String>,
        title: impl Into<String>,
    ) -> Result<ThreadResult, ToolError> {
        self.start_thread(agent, task.into(), title.into(), None).await
    }

    /// Like [`ToolContext::run_thread`], for an agent-team instance: the thread's events
    /// carry `instance.team`, and it reports `agent_team.instance.started` and then
    /// `instance.completed`, `instance.failed` or `instance.cancelled`.
    ///
    /// Errors: as [`ToolContext::run_thread`].
    pub async fn run_instance(
        &self,
        agent: &Agent,
        task: impl Into<String>,
        title: impl Into<String>,
        instance: ThreadInstance,
    ) -> Result<ThreadResult, ToolError> {
        self.start_thread(agent, task.into(), title.into(), Some(instance)).await
    }

    /// When this call resumes a thread of `agent` that paused in the previous turn (a
    /// member waiting for an approval or an answer): the agent-team context it ran with,
    /// so that it goes on as the same instance. Of two such threads of one agent, the one
    /// given `task` is taken up first.
    #[must_use]
    pub fn resumed_instance(&self, agent: &Agent, task: &str) -> Option<TeamContext> {
        self.scope.as_ref()?.resumed_team(&self.thread_id, &self.tool_call_id, agent.name(), task)
    }

    async fn start_thread(
        &self,
        agent: &Agent,
        task: String,
        title: String,
        instance: Option<ThreadInstance>,
    ) -> Result<ThreadResult, ToolError> {
        let Some(scope) = &self.scope else {
            return Err(ToolError::Failed(
                "sub-agent threads can only be started by a tool call inside a turn".to_owned(),
            ));
        };
        let parent =
            ThreadParent { thread_id: self.thread_id.clone(), tool_call_id: self.tool_call_id.clone() };
        let run = scope.run_thread(agent.clone(), task, title, parent, instance).await;
        match run.result {
            Ok((answer, output)) => {
                Ok(ThreadResult { thread_id: run.thread_id, run_id: run.run_id, answer, output })
            }
            Err(crate::engine::ThreadEnd::Failed(error)) => Err(ToolError::Failed(error)),
            Err(crate::engine::ThreadEnd::Paused(required)) => Err(ToolError::Paused { required }),
        }
    }

    /// Emits an agent-team event (`agent_team.*`) on this call's thread with `team` as its
    /// context, numbered and stored like every event of the turn.
    ///
    /// Errors: `ToolError::Failed` for an event that is not an agent-team event, outside a
    /// turn, or when it cannot be stored.
    pub async fn emit_team_event(&self, team: TeamContext, payload: EventPayload) -> Result<(), ToolError> {
        if !payload.is_agent_team() {
            return Err(ToolError::Failed(format!("{} is not an agent-team event", payload.kind())));
        }
        let Some(scope) = &self.scope else {
            return Err(ToolError::Failed(
                "events can only be emitted by a tool call inside a turn".to_owned(),
            ));
        };
        scope
            .emit_team(self.thread_id.clone(), team, payload)
            .await
            .map_err(|error| ToolError::Failed(format!("the event could not be recorded: {error}")))
    }

    /// The store of the turn the call runs in (for tools that keep state, such as budget
    /// ledgers); `None` outside a turn.
    #[must_use]
    pub fn store(&self) -> Option<Arc<dyn agentry_memory::Store>> {
        self.scope.as_ref().map(|scope| scope.store())
    }

    /// The fence of the lease this call's turn runs under (its session and token), for the
    /// writes a tool makes for the turn: a store refuses them once another process has
    /// taken the lease over. A budget reservation made with it ends with the lease, so a
    /// crashed process's reservations end when recovery takes its turn over. `None`
    /// outside a turn.
    #[must_use]
    pub fn fence(&self) -> Option<agentry_types::Fence> {
        self.scope.as_ref().map(|scope| scope.fence())
    }

    /// This call's turn's `T`: one value per turn and type, shared by every tool call of the
    /// turn on every thread (its sub-agent threads' calls too), made with `T::default()` on
    /// first use and dropped when the turn ends. For what a tool keeps about the turn it runs
    /// in, such as a team's count of instances spawned per role, so that it does not keep
    /// it for every turn it ever ran in. A turn resumed after a crash starts with none.
    /// `None` outside a turn.
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// use agentry_runner::ToolContext;
    ///
    /// #[derive(Default)]
    /// struct CallsThisTurn(AtomicU32);
    ///
    /// fn count(context: &ToolContext) -> Option<u32> {
    ///     let calls = context.turn_local::<CallsThisTurn>()?;
    ///     Some(calls.0.fetch_add(1, Ordering::Relaxed) + 1)
    /// }
    /// # let context = ToolContext::new(
    /// #     agentry_types::SessionId::new(), agentry_types::TurnId::new(), agentry_types::ThreadId::main(), "call_1", "key");
    /// assert_eq!(count(&context), None, "outside a turn");
    /// ```
    #[must_use]
    pub fn turn_local<T: Default + Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.scope.as_ref().map(|scope| scope.turn_local::<T>())
    }

    /// The events of the call's turn stored so far, in `seq` order (none outside a turn):
    /// what a tool that keeps count across the turn reads back when the turn was resumed
    /// ([`ToolContext::turn_resumed`]).
    ///
    /// Errors: `ToolError::Failed` when the store cannot be read.
    pub async fn stored_turn_events(&self) -> Result<Vec<agentry_events::EventEnvelope>, ToolError> {
        let Some(scope) = &self.scope else { return Ok(Vec::new()) };
        crate::live::stored_events(scope.store().as_ref(), self.turn_id, agentry_memory::Order::Asc)
            .await
            .map_err(|error| ToolError::Failed(format!("cannot read the turn's events: {error}")))
    }

    /// Whether this process took the call's turn over from another: a turn resumed after
    /// its process died or handed it over. What that process kept for the turn
    /// ([`ToolContext::turn_local`]) is gone; what it did is in the turn's stored events.
    /// False outside a turn.
    #[must_use]
    pub fn turn_resumed(&self) -> bool {
        self.scope.as_ref().is_some_and(|scope| scope.turn_resumed())
    }

    /// Waits for `future` unless the turn is cancelled first (then `None`). Outside a turn
    /// it just waits.
    pub async fn until_cancelled<F: std::future::Future>(&self, future: F) -> Option<F::Output> {
        match &self.scope {
            Some(scope) => scope.until_cancelled(future).await,
            None => Some(future.await),
        }
    }

    /// Makes a thread's final message the calling agent's answer: once this batch of tool
    /// calls is done, the agent's turn ends with it instead of calling the model again (a
    /// team routing the user to one member). Does nothing outside a turn.
    pub fn answer_directly(&self, output: ThreadMessage) {
        if let Some(scope) = &self.scope {
            scope.answer_directly(output);
        }
    }
}

/// A sub-agent thread that is an agent-team instance (seed 001).
#[derive(Debug, Clone)]
pub struct ThreadInstance {
    /// Mission, instance, parent instance and source, carried by the thread's events.
    pub team: TeamContext,
    /// The instance's role.
    pub role: String,
    /// Its budget limit, as reported by `instance.started`.
    pub budget: BudgetLimit,
    /// The ledger its model and tool calls reserve from and settle to; unbudgeted when
    /// absent.
    pub ledger: Option<Arc<dyn crate::StepBudget>>,
    /// Its own cancellation (cancelling one instance, or every instance of a mission), on
    /// top of the turn's.
    pub cancel: Option<crate::CancelToken>,
    /// A hash of its instructions and skills (`sha256:…`), reported by `instance.started`.
    pub skill_hash: Option<String>,
}

/// What a sub-agent thread answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadResult {
    /// The thread.
    pub thread_id: ThreadId,
    /// The member run stored for it.
    pub run_id: TurnId,
    /// The member's final answer.
    pub answer: String,
    /// The member's final message (absent when it answered nothing).
    pub output: Option<ThreadMessage>,
}

/// Why a tool call failed. The message is given to the model as the call's error result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The arguments do not fit the tool's parameters.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
    /// A sub-agent thread the tool ran waits for a person or the client: the turn ends with
    /// these required actions (on the member's thread), and the next turn's answers resume
    /// the thread and then this call.
    #[error("the member's thread waits for {} decision(s)", required.len())]
    Paused {
        /// What the member's thread waits for.
        required: Vec<agentry_types::RequiredActionRecord>,
    },
    /// The MCP server behind the tool needs the user to authorize access first. The turn
    /// ends with `mcp.auth_required`; the next turn (with no input) runs the call again.
    #[error("the MCP server {} needs authorization at {auth_url}", server.name)]
    AuthRequired {
        /// The server.
        server: McpServerRef,
        /// Where the user authorizes.
        auth_url: String,
    },
}

/// A tool the model can call, run on the server.
///
/// Implementations must be cheap to share: agents hold them as `Arc<dyn Tool>`.
#[async_trait]
pub trait Tool: Send + Sync + fmt::Debug {
    /// The name, description and JSON Schema of the parameters the model sees.
    fn spec(&self) -> &ToolSpec;

    /// Whether running the call twice with the same idempotency key has the effect of
    /// running it once. After a crash, a call that started but has no recorded result is
    /// re-run only when this is true; otherwise the turn asks a person what to do.
    fn idempotent(&self) -> bool {
        false
    }

    /// Whether the tool ends promptly on its own when the turn is cancelled (it runs a
    /// sub-agent thread, which stops itself): a cancelled turn then waits for it past the
    /// grace period rather than dropping it, so the thread records how it ended.
    fn ends_on_cancel(&self) -> bool {
        false
    }

    /// Whether the tool's only effects are the sub-agent threads it runs, each resumable
    /// (a delegation to named members, not a spawn of a new instance): after a crash, its
    /// threads that had ended give their stored ends when the call runs again, instead of
    /// running again, and a call all of whose threads had ended runs again without asking a
    /// person (otherwise it is in doubt, as a call of a tool that is not idempotent).
    fn resumes_threads(&self) -> bool {
        false
    }

    /// How long one call may take; `None` uses the agent's
    /// [`AgentLimits::tool_timeout`](crate::AgentLimits::tool_timeout).
    fn timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// The MCP server the tool belongs to, for the `tool_info` of its calls; `None` for a
    /// tool of this process.
    fn mcp_server(&self) -> Option<&McpServerRef> {
        None
    }

    /// Checks the arguments against the parameters before the call. The default compiles
    /// the schema on every call; tools that are called often cache a validator.
    ///
    /// Errors: `ToolError::InvalidArguments` naming each violation.
    fn validate(&self, arguments: &Value) -> Result<(), ToolError> {
        SchemaValidator::new(&self.spec().parameters)?.validate(arguments)
    }

    /// Runs the call with arguments that passed [`Tool::validate`]. The result text is what
    /// the model reads.
    async fn call(&self, arguments: Value, context: ToolContext) -> Result<String, ToolError>;
}

/// A compiled JSON Schema for tool arguments.
pub struct SchemaValidator {
    validator: jsonschema::Validator,
}

impl fmt::Debug for SchemaValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaValidator").finish_non_exhaustive()
    }
}

impl SchemaValidator {
    /// Compiles a schema. Errors: `InvalidArguments` when the schema itself is invalid.
    pub fn new(schema: &Value) -> Result<Self, ToolError> {
        jsonschema::validator_for(schema).map(|validator| Self { validator }).map_err(|error| {
            ToolError::InvalidArguments(format!("the tool's parameter schema is invalid: {error}"))
        })
    }

    /// Validates arguments; the error lists every violation with its JSON path.
    pub fn validate(&self, arguments: &Value) -> Result<(), ToolError> {
        // The common case first: checking validity tracks no paths and builds no errors.
        if self.validator.is_valid(arguments) {
            return Ok(());
        }
        let problems: Vec<String> = self
            .validator
            .iter_errors(arguments)
            .map(|error| {
                let path = error.instance_path.to_string();
                if path.is_empty() { error.to_string() } else { format!("{path}: {error}") }
            })
            .collect();
        if problems.is_empty() { Ok(()) } else { Err(ToolError::InvalidArguments(problems.join("; "))) }
    }
}

type BoxedCall<A> =
    dyn Fn(A, ToolContext) -> Pin<Box<dyn Future<Output = Result<String, ToolError>> + Send>> + Send + Sync;

/// A tool made from an async Rust function whose argument type derives `JsonSchema` and
/// `Deserialize`: the parameters schema is derived from the type, and arguments are
/// validated against it before the function runs.
///
/// ```
/// use agentry_runner::{FunctionTool, ToolError};
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Add { a: i64, b: i64 }
/// let tool = FunctionTool::new("add", "Adds two integers.", |args: Add, _context| async move {
///     Ok::<_, ToolError>((args.a + args.b).to_string())
/// });
/// # let _ = tool;
/// ```
pub struct FunctionTool<A> {
    spec: ToolSpec,
    /// Absent only if schemars derived a schema that does not compile; serde still checks
    /// the arguments then.
    validator: Option<SchemaValidator>,
    idempotent: bool,
    timeout: Option<std::time::Duration>,
    ends_on_cancel: bool,
    resumes_threads: bool,
    call: Box<BoxedCall<A>>,
    arguments: PhantomData<fn() -> A>,
}

impl<A> fmt::Debug for FunctionTool<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FunctionTool")
            .field("name", &self.spec.name)
            .field("idempotent", &self.idempotent)
            .finish()
    }
}

impl<A> FunctionTool<A>
where
    A: JsonSchema + DeserializeOwned + Send + 'static,
{
    /// A tool named `name` that runs `function`. Not idempotent unless declared with
    /// [`FunctionTool::idempotent`].
    ///
    /// When its turn is cancelled, a running call gets [`AgentLimits::cancel_grace`]
    /// (5 s by default) to finish before it is dropped: a function that waits on slow work
    /// should wait under [`ToolContext::until_cancelled`], which gives up at once. A panic in
    /// `function` fails the call, not the turn: the model gets its message as an error.
    ///
    /// [`AgentLimits::cancel_grace`]: crate::AgentLimits::cancel_grace
    pub fn new<F, Fut>(name: impl Into<String>, description: impl Into<String>, function: F) -> Self
    where
        F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, ToolError>> + Send + 'static,
    {
        let parameters = parameters_schema::<A>();
        let validator = SchemaValidator::new(&parameters).ok();
        Self {
            spec: ToolSpec { name: name.into(), description: Some(description.into()), parameters },
            validator,
            idempotent: false,
            timeout: None,
            ends_on_cancel: false,
            resumes_threads: false,
            call: Box::new(move |arguments, context| Box::pin(function(arguments, context))),
            arguments: PhantomData,
        }
    }

    /// Declares the tool idempotent (see [`Tool::idempotent`]).
    #[must_use]
    pub const fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    /// Gives the tool its own time limit per call (instead of the agent's).
    #[must_use]
    pub const fn timeout(mut self, timeout: std::time::Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Declares that the tool stops by itself when the turn is cancelled (see
    /// [`Tool::ends_on_cancel`]).
    #[must_use]
    pub const fn ends_on_cancel(mut self) -> Self {
        self.ends_on_cancel = true;
        self
    }

    /// Declares that the tool's only effects are resumable sub-agent threads (see
    /// [`Tool::resumes_threads`]).
    #[must_use]
    pub const fn resumes_threads(mut self) -> Self {
        self.resumes_threads = true;
        self
    }

    /// Shares it, ready for an agent.
    #[must_use]
    pub fn shared(self) -> Arc<dyn Tool> {
        Arc::new(self)
    }
}

/// The JSON Schema of a type as tool parameters: an object schema without the `$schema`
/// and `title` keys that providers do not want.
#[must_use]
pub fn parameters_schema<A: JsonSchema>() -> Value {
    let mut schema = serde_json::to_value(schemars::schema_for!(A)).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        object.entry("type").or_insert_with(|| Value::String("object".to_owned()));
    }
    schema
}

#[async_trait]
impl<A> Tool for FunctionTool<A>
where
    A: JsonSchema + DeserializeOwned + Send + 'static,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    fn validate(&self, arguments: &Value) -> Result<(), ToolError> {
        self.validator.as_ref().map_or(Ok(()), |validator| validator.validate(arguments))
    }

    fn timeout(&self) -> Option<std::time::Duration> {
        self.timeout
    }

    fn ends_on_cancel(&self) -> bool {
        self.ends_on_cancel
    }

    fn resumes_threads(&self) -> bool {
        self.resumes_threads
    }

    async fn call(&self, arguments: Value, context: ToolContext) -> Result<String, ToolError> {
        let arguments: A = serde_json::from_value(arguments)
            .map_err(|error| ToolError::InvalidArguments(error.to_string()))?;
        (self.call)(arguments, context).await
    }
}

/// The name of the built-in client-side tool that asks the user a structured question.
pub const ASK_USER_QUESTION: &str = "ask_user_question";

/// The spec of the built-in `ask_user_question` client-side tool: a question and the
/// options the user may pick from (the user may also answer freely).
#[must_use]
pub fn ask_user_question() -> ToolSpec {
    ToolSpec {
        name: ASK_USER_QUESTION.to_owned(),
        description: Some(
            "Ask the user a question you cannot safely answer yourself, with options to choose from."
                .to_owned(),
        ),
        parameters: serde_json::json!({
            "type": "object",
            "properties": {
                "question": {"type": "string", "description": "The question."},
                "options": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Answers the user may pick from."
                }
            },
            "required": ["question"]
        }),
    }
}
