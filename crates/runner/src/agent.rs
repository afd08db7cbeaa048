//! Agents: a name, instructions, a model, tools and limits.

use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use agentry_events::McpServerSession;
use agentry_memory::MemoryConfig;
use agentry_model::{Model, ToolChoice};
use agentry_types::{SessionType, ToolInfo, ToolSpec};

use crate::tool::{Tool, ask_user_question};

/// How far one turn of an agent may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLimits {
    /// Model calls per turn; reaching it ends the turn with an error.
    pub max_iterations: u32,
    /// Wall time per turn; reaching it cancels the turn (`server-execution-timeout`).
    pub timeout: Option<Duration>,
    /// Time one tool call may take; a call that takes longer gets an error result.
    pub tool_timeout: Duration,
    /// After a cancellation, how long running tools may take to finish.
    pub cancel_grace: Duration,
    /// Runs of history given to the model (the latest ones).
    pub history_runs: usize,
    /// The most bytes of one tool result kept (for the model, the events and the
    /// history); a longer result is cut at this size and says how much was left out (an
    /// error keeps at least 1,024 bytes, so it still says why the call failed). A
    /// result goes back to the model with every later turn's history, so one huge output
    /// would fill every later context window.
    pub max_tool_output_bytes: usize,
}

/// [`AgentLimits::max_tool_output_bytes`] by default: 128 KiB, about 32,000 tokens.
pub const DEFAULT_MAX_TOOL_OUTPUT_BYTES: usize = 128 * 1024;

impl Default for AgentLimits {
    fn default() -> Self {
        Self {
            max_iterations: 25,
            timeout: None,
            tool_timeout: Duration::from_secs(120),
            cancel_grace: Duration::from_secs(5),
            history_runs: 50,
            max_tool_output_bytes: DEFAULT_MAX_TOOL_OUTPUT_BYTES,
        }
    }
}

/// An agent: cheap to clone (everything heavy is shared).
///
/// ```
/// use std::sync::Arc;
/// use agentry_model::{ScriptedModel, ScriptedResponse};
/// use agentry_runner::Agent;
/// let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Hi!")]));
/// let agent = Agent::builder("greeter", model).instructions("Greet the user.").build();
/// assert_eq!(agent.name(), "greeter");
/// ```
#[derive(Debug, Clone)]
pub struct Agent {
    inner: Arc<AgentInner>,
}

#[derive(Debug, Clone)]
struct AgentInner {
    name: String,
    instructions: Option<String>,
    model: Arc<dyn Model>,
    tools: Vec<Arc<dyn Tool>>,
    approval_required: Vec<String>,
    client_tools: Vec<ToolSpec>,
    limits: AgentLimits,
    /// The type of the sessions it runs in (`team` for a team's coordinator).
    session_type: SessionType,
    /// The tools the agent may call (its role's capabilities); `None` allows all.
    capabilities: Option<Vec<String>>,
    /// The tool choice of each turn's first model call (a broadcast team forces its
    /// delegation).
    first_tool_choice: Option<ToolChoice>,
    /// Summary, user-profile and metadata memory (seed 003), when enabled.
    memory: Option<AgentMemory>,
    /// The MCP server sessions whose tools the agent has (announced by `mcp.initialize`).
    mcp_sessions: Vec<McpServerSession>,
    /// What must live as long as the agent (the MCP connections its tools call through).
    keep_alive: Vec<Arc<dyn Any + Send + Sync>>,
    /// Every tool spec offered to the model, made at the first model call (not at
    /// construction, which stays allocation-light) and shared by every request after.
    specs: OnceLock<Arc<[ToolSpec]>>,
    /// What is wrong with the definition ([`Agent::problem`]), found when it was built.
    problem: Option<String>,
}

impl Agent {
    /// Starts building an agent named `name` on `model`.
    #[must_use]
    pub fn builder(name: impl Into<String>, model: Arc<dyn Model>) -> AgentBuilder {
        AgentBuilder {
            inner: AgentInner {
                name: name.into(),
                instructions: None,
                model,
                tools: Vec::new(),
                approval_required: Vec::new(),
                client_tools: Vec::new(),
                limits: AgentLimits::default(),
                session_type: SessionType::Agent,
                capabilities: None,
                first_tool_choice: None,
                memory: None,
                mcp_sessions: Vec::new(),
                keep_alive: Vec::new(),
                specs: OnceLock::new(),
                problem: None,
            },
        }
    }

    /// What is wrong with the agent's definition, if anything: an empty name, two tools of
    /// one name (the model would be offered both, and every call would reach the first),
    /// `requires_approval` naming none of its tools (a misspelt name would leave the real
    /// tool ungated) or a client-side tool (answered by the client, there is nothing to
    /// approve), or memory settings that cannot work. A runtime refuses sessions and
    /// turns of such an agent ([`RunnerError::InvalidAgent`](crate::RunnerError::InvalidAgent));
    /// [`AgentBuilder::try_build`] refuses to build it.
    #[must_use]
    pub fn problem(&self) -> Option<&str> {
        self.inner.problem.as_deref()
    }

    /// Its name (sessions name their agent by it).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its system instructions.
    #[must_use]
    pub fn instructions(&self) -> Option<&str> {
        self.inner.instructions.as_deref()
    }

    /// Its model.
    #[must_use]
    pub fn model(&self) -> &Arc<dyn Model> {
        &self.inner.model
    }

    /// Its server-side tools.
    #[must_use]
    pub fn tools(&self) -> &[Arc<dyn Tool>] {
        &self.inner.tools
    }

    /// Its client-side tools (run by the client; the turn ends to wait for their results).
    #[must_use]
    pub fn client_tools(&self) -> &[ToolSpec] {
        &self.inner.client_tools
    }

    /// Its limits.
    #[must_use]
    pub fn limits(&self) -> &AgentLimits {
        &self.inner.limits
    }

    /// The server-side tool named `name`.
    #[must_use]
    pub fn tool(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.inner.tools.iter().find(|tool| tool.spec().name == name)
    }

    /// Whether a call of `name` waits for a person's approval.
    #[must_use]
    pub fn requires_approval(&self, name: &str) -> bool {
        self.inner.approval_required.iter().any(|gated| gated == name)
    }

    /// The type of its sessions: `team` for a team's coordinator, `agent` otherwise.
    #[must_use]
    pub fn session_type(&self) -> SessionType {
        self.inner.session_type
    }

    /// Whether its capabilities allow calling `name` (checked where calls are dispatched,
    /// not in the prompt).
    #[must_use]
    pub fn may_call(&self, name: &str) -> bool {
        self.inner.capabilities.as_ref().is_none_or(|allowed| allowed.iter().any(|tool| tool == name))
    }

    /// The same agent, allowed to call only those of `tools` (a role's capabilities; see
    /// [`AgentBuilder::capabilities`]) that its own capabilities allow: a role narrows what
    /// an agent may call, never widens it. Its tools and connections are shared, not copied.
    #[must_use]
    pub fn with_capabilities<I, S>(&self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut inner = (*self.inner).clone();
        let allowed = tools.into_iter().map(Into::into).filter(|tool| self.may_call(tool)).collect();
        inner.capabilities = Some(allowed);
        Self { inner: Arc::new(inner) }
    }

    /// The tool choice of each turn's first model call (see
    /// [`AgentBuilder::first_tool_choice`]).
    #[must_use]
    pub fn first_tool_choice(&self) -> Option<&ToolChoice> {
        self.inner.first_tool_choice.as_ref()
    }

    /// Its memory settings.
    #[must_use]
    pub fn memory(&self) -> Option<&AgentMemory> {
        self.inner.memory.as_ref()
    }

    /// The MCP server sessions of its tools.
    #[must_use]
    pub fn mcp_sessions(&self) -> &[McpServerSession] {
        &self.inner.mcp_sessions
    }

    /// The routing metadata of a call of `name` (the `tool_info` of its tool-call chunks).
    #[must_use]
    pub fn tool_info(&self, name: &str) -> ToolInfo {
        ToolInfo {
            mcp_server: self.tool(name).and_then(|tool| tool.mcp_server().cloned()),
            is_approval_required: self.requires_approval(name),
            is_client_side: self.is_client_tool(name),
            ..ToolInfo::local(name)
        }
    }

    /// Whether `name` is a client-side tool.
    #[must_use]
    pub fn is_client_tool(&self, name: &str) -> bool {
        self.inner.client_tools.iter().any(|tool| tool.name == name)
    }

    /// Every tool the model is offered: server-side, then client-side.
    #[must_use]
    pub fn tool_specs(&self) -> Arc<[ToolSpec]> {
        self.inner
            .specs
            .get_or_init(|| {
                self.inner
                    .tools
                    .iter()
                    .map(|tool| tool.spec().clone())
                    .chain(self.inner.client_tools.iter().cloned())
                    .collect()
            })
            .clone()
    }
}

/// An agent's memory settings.
#[derive(Debug, Clone)]
pub struct AgentMemory {
    /// The Memory facade's settings.
    pub config: MemoryConfig,
    /// The model that writes summaries and profiles.
    pub analysis_model: Option<Arc<dyn Model>>,
}

/// Builds an [`Agent`].
#[derive(Debug)]
pub struct AgentBuilder {
    inner: AgentInner,
}

impl AgentBuilder {
    /// Sets the system instructions.
    #[must_use]
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.inner.instructions = Some(instructions.into());
        self
    }

    /// Adds a server-side tool.
    #[must_use]
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.inner.tools.push(tool);
        self
    }

    /// Adds server-side tools.
    #[must_use]
    pub fn tools(mut self, tools: impl IntoIterator<Item = Arc<dyn Tool>>) -> Self {
        self.inner.tools.extend(tools);
        self
    }

    /// Makes calls of the tool named `name` wait for a person's approval.
    #[must_use]
    pub fn requires_approval(mut self, name: impl Into<String>) -> Self {
        self.inner.approval_required.push(name.into());
        self
    }

    /// Adds a client-side tool: the turn ends with `tool.response_required` when the model
    /// calls it, and the next turn supplies the result.
    #[must_use]
    pub fn client_tool(mut self, spec: ToolSpec) -> Self {
        self.inner.client_tools.push(spec);
        self
    }

    /// Adds the tools of a connected MCP server; the agent keeps the connection open and
    /// its turns announce the server session with `mcp.initialize`.
    #[cfg(feature = "mcp")]
    #[must_use]
    pub fn mcp(mut self, connection: Arc<crate::mcp::McpConnection>) -> Self {
        self.inner.tools.extend(connection.tools());
        self.inner.mcp_sessions.push(connection.session());
        self.inner.keep_alive.push(connection);
        self
    }

    /// Adds the built-in client-side `ask_user_question` tool.
    #[must_use]
    pub fn ask_user_question(self) -> Self {
        self.client_tool(ask_user_question())
    }

    /// Enables the Memory facade (seed 003) for the agent's turns: before each turn its
    /// summary, user profile and metadata are injected into the system prompt; after a
    /// completed turn the summary and profile are updated through `analysis_model` (the
    /// turn emits `memory.update.started` and `memory.update.completed`). The session and
    /// user of each turn replace `session_id` and `user_id` of the settings, and the
    /// session's own type (agent or team) is the one served. History stays the runner's
    /// own window ([`AgentLimits::history_runs`]; the runner stores every turn's messages
    /// whatever `full_session_memory` says), cut to the last `num_last_messages` messages
    /// when that is set.
    #[must_use]
    pub fn memory(mut self, config: MemoryConfig, analysis_model: Option<Arc<dyn Model>>) -> Self {
        self.inner.memory = Some(AgentMemory { config, analysis_model });
        self
    }

    /// Sets the type of the sessions it runs in (a team's coordinator is a `team`: its
    /// sessions are team sessions and its turns team runs).
    #[must_use]
    pub fn session_type(mut self, session_type: SessionType) -> Self {
        self.inner.session_type = session_type;
        self
    }

    /// Restricts the tools the agent may call to `tools` (its role's capabilities). A call of
    /// any other tool is not run: the model gets an error result and the turn emits
    /// `agent_team.capability.denied`.
    #[must_use]
    pub fn capabilities<I, S>(mut self, tools: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.inner.capabilities = Some(tools.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the tool choice of each turn's first model call (for example, a call of one
    /// tool the turn must start with), when that call answers a user message: not when a
    /// turn goes on after answering required actions, where the first call was made in the
    /// turn that asked.
    #[must_use]
    pub fn first_tool_choice(mut self, choice: ToolChoice) -> Self {
        self.inner.first_tool_choice = Some(choice);
        self
    }

    /// Sets the limits.
    #[must_use]
    pub fn limits(mut self, limits: AgentLimits) -> Self {
        self.inner.limits = limits;
        self
    }

    /// The names of the tools added so far (server-side, then client-side).
    pub fn tool_names(&self) -> impl Iterator<Item = &str> {
        tool_names(&self.inner)
    }

    /// Builds the agent. A definition with a problem ([`Agent::problem`]) is built, and a
    /// runtime refuses its sessions and turns: use [`try_build`](Self::try_build) to be
    /// told at once.
    #[must_use]
    pub fn build(mut self) -> Agent {
        self.inner.problem = definition_problem(&self.inner);
        Agent { inner: Arc::new(self.inner) }
    }

    /// Builds the agent, or says what is wrong with its definition ([`Agent::problem`]).
    ///
    /// Errors: `InvalidAgent`.
    pub fn try_build(self) -> Result<Agent, crate::RunnerError> {
        let agent = self.build();
        match agent.problem() {
            Some(problem) => Err(crate::RunnerError::InvalidAgent {
                agent: agent.name().to_owned(),
                problem: problem.to_owned(),
            }),
            None => Ok(agent),
        }
    }
}

/// The names of a definition's tools: server-side, then client-side.
fn tool_names(agent: &AgentInner) -> impl Iterator<Item = &str> {
    agent
        .tools
        .iter()
        .map(|tool| tool.spec().name.as_str())
        .chain(agent.client_tools.iter().map(|spec| spec.name.as_str()))
}

/// [`Agent::problem`] of a definition.
fn definition_problem(agent: &AgentInner) -> Option<String> {
    if agent.name.trim().is_empty() {
        return Some("its name is empty".to_owned());
    }
    let names = || tool_names(agent);
    for (at, name) in names().enumerate() {
        if name.is_empty() {
            return Some("one of its tools has an empty name".to_owned());
        }
        if names().take(at).any(|earlier| earlier == name) {
            return Some(format!("it has two tools named {name:?}"));
        }
    }
    if let Some(gated) =
        agent.approval_required.iter().find(|gated| !names().any(|name| name == gated.as_str()))
    {
        let known: Vec<&str> = names().collect();
        let known = if known.is_empty() { "it has none".to_owned() } else { known.join(", ") };
        return Some(format!("requires_approval names {gated:?}, which is none of its tools ({known})"));
    }
    // A client-side tool is answered by the client, never run here: an approval of it
    // would gate nothing.
    if let Some(gated) = agent
        .approval_required
        .iter()
        .find(|gated| agent.client_tools.iter().any(|tool| tool.name == **gated))
    {
        return Some(format!(
            "requires_approval names {gated:?}, which the client answers (a client-side tool is never run on the \
             server, so there is nothing to approve)"
        ));
    }
    if let Some(memory) = &agent.memory
        && let Err(error) = memory.config.check(memory.analysis_model.is_some())
    {
        return Some(format!("memory: {error}"));
    }
    None
}
