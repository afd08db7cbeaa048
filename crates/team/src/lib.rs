//! Agentry's teams: a coordinator agent that delegates to member agents, each delegation
//! running on its own sub-agent thread of the turn (`thread.created`, the member's events on
//! that thread, `thread.done`), concurrently when the coordinator delegates in parallel.
//! Member runs are stored once, with the turn as their parent run.
//!
//! A team is built into an [`Agent`] (the coordinator with the delegation tools) and
//! registered with a [`Runtime`](agentry_runner::Runtime) like any agent.
//!
//! ```
//! use std::sync::Arc;
//! use agentry_model::{ScriptedModel, ScriptedResponse};
//! use agentry_runner::Agent;
//! use agentry_team::Team;
//!
//! let model = Arc::new(ScriptedModel::new(vec![ScriptedResponse::text("Done.")]));
//! let researcher = Agent::builder("researcher", model.clone()).instructions("Find facts.").build();
//! let writer = Agent::builder("writer", model.clone()).instructions("Write prose.").build();
//! let team = Team::builder("demo-team", model).member(researcher).member(writer).build();
//! assert_eq!(team.name(), "demo-team");
//! assert!(team.tool("delegate_task_to_member").is_some());
//! ```

mod budget;
mod directed;
mod output;
#[cfg(feature = "scenarios")]
pub mod scenarios;
mod spawn;
mod tasks;

use std::collections::HashMap;
use std::sync::Arc;

use agentry_events::{EventPayload, TeamContext};
use agentry_model::{Model, ToolChoice};
use agentry_runner::{
    Agent, AgentLimits, CancelToken, FunctionTool, ThreadInstance, ThreadResult, Tool, ToolContext, ToolError,
};
use agentry_types::{BudgetLimit, CancellationReason, EventId, SessionType};
use schemars::JsonSchema;
use serde::Deserialize;

pub use budget::Price;
pub use directed::SpawnRequest;
pub use output::team_run_output;
pub use spawn::{
    ApprovalEnd, DEFAULT_APPROVAL_TIMEOUT, EndedSpawn, PendingSpawn, PolicyBudget, PolicyError, Role,
    SpawnApprovals, SpawnCatalog, SpawnPolicy, Template,
};

/// Tokens an instance or member holds from its budgets before each model call unless the
/// team says otherwise ([`TeamBuilder::tokens_per_step`]).
pub const DEFAULT_TOKENS_PER_STEP: u64 = 1000;

/// How a team works.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TeamMode {
    /// The coordinator delegates tasks to members and writes the answer from their results.
    #[default]
    Coordinate,
    /// The coordinator picks one member (`route_to_member`), whose answer is the team's
    /// answer, unedited.
    Route,
    /// Every member gets the task at once (the coordinator's first call is always
    /// `delegate_task_to_members`); the coordinator writes the answer from all results.
    Broadcast,
    /// The coordinator keeps a task list (`create_task`, `run_task`, `run_tasks`,
    /// `complete_task`, `list_tasks`), assigns tasks to members and runs them, one by one or
    /// in parallel, within its iteration limit, then answers.
    Tasks,
}

/// A team: a coordinator on `model` and its members.
#[derive(Debug)]
pub struct Team;

impl Team {
    /// Starts building a team named `name` whose coordinator runs on `model`.
    #[must_use]
    pub fn builder(name: impl Into<String>, model: Arc<dyn Model>) -> TeamBuilder {
        TeamBuilder {
            name: name.into(),
            model,
            instructions: None,
            members: Vec::new(),
            mode: TeamMode::Coordinate,
            limits: AgentLimits::default(),
            policy: None,
            catalog: SpawnCatalog::default(),
            approvals: SpawnApprovals::new(),
            mission_budget: None,
            tokens_per_step: DEFAULT_TOKENS_PER_STEP,
            control: TeamControl::new(),
            prices: HashMap::new(),
        }
    }
}

/// Builds a team into its coordinator [`Agent`].
#[derive(Debug)]
pub struct TeamBuilder {
    name: String,
    model: Arc<dyn Model>,
    instructions: Option<String>,
    members: Vec<Agent>,
    mode: TeamMode,
    limits: AgentLimits,
    policy: Option<SpawnPolicy>,
    catalog: SpawnCatalog,
    approvals: SpawnApprovals,
    mission_budget: Option<BudgetLimit>,
    tokens_per_step: u64,
    control: TeamControl,
    prices: HashMap<String, Price>,
}

impl TeamBuilder {
    /// The coordinator's instructions (the member list and the delegation tools are
    /// described after them).
    #[must_use]
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = Some(instructions.into());
        self
    }

    /// Adds a member; the coordinator names it by the agent's name.
    #[must_use]
    pub fn member(mut self, agent: Agent) -> Self {
        self.members.push(agent);
        self
    }

    /// Sets the mode.
    #[must_use]
    pub const fn mode(mut self, mode: TeamMode) -> Self {
        self.mode = mode;
        self
    }

    /// The spawn policy for `spawn_agent` (see [`SpawnPolicy`]); without one, every spawn is
    /// denied with `spawn_policy_missing`.
    #[must_use]
    pub fn spawn_policy(mut self, policy: Option<SpawnPolicy>) -> Self {
        self.policy = policy;
        self
    }

    /// The models and tools spawned instances' templates name.
    #[must_use]
    pub fn catalog(mut self, catalog: SpawnCatalog) -> Self {
        self.catalog = catalog;
        self
    }

    /// Where spawns that need a person's approval wait (share it with whoever decides).
    #[must_use]
    pub fn approvals(mut self, approvals: SpawnApprovals) -> Self {
        self.approvals = approvals;
        self
    }

    /// The totals every mission (team turn) may use across its instances; the spawn
    /// policy's `[mission]` when not set.
    #[must_use]
    pub const fn mission_budget(mut self, limit: BudgetLimit) -> Self {
        self.mission_budget = Some(limit);
        self
    }

    /// Tokens held before each model call of an instance, settled with the real count after
    /// (default 1,000). A budget is never passed by more than one such reservation per
    /// concurrent instance.
    #[must_use]
    pub const fn tokens_per_step(mut self, tokens: u64) -> Self {
        self.tokens_per_step = tokens;
        self
    }

    /// The price of a model (by its id): instances' model calls on it count against the
    /// cost budgets (`max_cost_usd`).
    #[must_use]
    pub fn price(mut self, model_id: impl Into<String>, price: Price) -> Self {
        self.prices.insert(model_id.into(), price);
        self
    }

    /// Where the team's running instances are listed and cancelled (share it with whoever
    /// cancels).
    #[must_use]
    pub fn control(mut self, control: TeamControl) -> Self {
        self.control = control;
        self
    }

    /// Sets the coordinator's limits.
    #[must_use]
    pub fn limits(mut self, limits: AgentLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The coordinator agent, named after the team, with the tools of its mode.
    #[must_use]
    pub fn build(self) -> Agent {
        let policy = self.policy.map(Arc::new);
        let mission = self
            .mission_budget
            .or_else(|| policy.as_ref().map(|policy| BudgetLimit::from(policy.mission)))
            .unwrap_or_default();
        let role_budgets = policy
            .as_ref()
            .map(|policy| {
                policy
                    .roles
                    .iter()
                    .map(|(name, role)| (name.clone(), BudgetLimit::from(role.budget)))
                    .collect()
            })
            .unwrap_or_default();
        // A member is an instance of the role of its name: it may call only that role's
        // capabilities, as a spawned instance of the role may.
        let agents = self
            .members
            .into_iter()
            .map(|member| {
                let capabilities = policy
                    .as_ref()
                    .and_then(|policy| policy.roles.get(member.name()))
                    .and_then(|role| role.capabilities.clone());
                match capabilities {
                    Some(capabilities) => member.with_capabilities(capabilities),
                    None => member,
                }
            })
            .collect();
        let members = Arc::new(Crew {
            agents,
            control: self.control,
            budgets: budget::Budgets {
                mission,
                tokens_per_step: self.tokens_per_step,
                prices: Arc::new(self.prices),
            },
            role_budgets,
        });
        let roster: Vec<String> =
            members.agents.iter().map(|member| format!("- {}", member.name())).collect();
        let mut instructions = self.instructions.unwrap_or_else(|| "You coordinate a team.".to_owned());
        let how = match self.mode {
            TeamMode::Coordinate => {
                "Delegate a task to one member with delegate_task_to_member, or the same task to every member \
                 with delegate_task_to_members; call several delegations at once to run them in parallel. Then \
                 answer the user from their results."
            }
            TeamMode::Route => {
                "Pick the one member best placed to answer and hand the user's request to it with \
                 route_to_member; its answer goes to the user as it is."
            }
            TeamMode::Broadcast => {
                "Every member first gets the user's request (delegate_task_to_members); then answer the user \
                 from all their results."
            }
            TeamMode::Tasks => {
                "Break the request into tasks with create_task (each assigned to a member), run them with \
                 run_task or, when independent, run_tasks in parallel, mark them done with complete_task, check \
                 progress with list_tasks, and answer when every task is done."
            }
        };
        // A coordinator without members can only spawn (with a policy): it is offered no
        // delegation to members it does not have.
        let memberless = roster.is_empty() && self.mode == TeamMode::Coordinate;
        if memberless {
            instructions.push_str(
                "\n\nYour team has no standing members: spawn an agent for a task with spawn_agent when \
                 it helps, then answer the user from its result.",
            );
        } else {
            instructions.push_str(&format!("\n\nYour team members:\n{}\n\n{how}", roster.join("\n")));
        }
        // The coordinator carries out operators' spawn requests (`TeamControl::request_spawn`).
        let model: Arc<dyn Model> =
            Arc::new(directed::Directed { inner: self.model.clone(), control: members.control.clone() });
        let name = self.name.clone();
        let builder = Agent::builder(self.name, model)
            .instructions(instructions)
            .limits(self.limits)
            .session_type(SessionType::Team);
        match self.mode {
            TeamMode::Coordinate => {
                let spawner = spawn::Spawner {
                    crew: members.clone(),
                    policy,
                    catalog: self.catalog,
                    approvals: self.approvals,
                    default_model: self.model.clone(),
                    role: None,
                    depth: 0,
                    ancestors: Vec::new(),
                };
                let builder = if memberless {
                    builder
                } else {
                    builder.tool(delegate_to_member(members.clone())).tool(delegate_to_members(members))
                };
                builder.tool(spawn::spawn_agent(spawner)).build()
            }
            TeamMode::Route => builder.tool(route_to_member(members)).build(),
            TeamMode::Broadcast => builder
                .tool(delegate_to_members(members))
                .first_tool_choice(ToolChoice::Function("delegate_task_to_members".to_owned()))
                .build(),
            TeamMode::Tasks => builder.tools(tasks::tools(&name, members)).build(),
        }
    }
}

/// The live instances of a team's missions, to list them and cancel one instance or a
/// whole mission on its own (share it with the server's routes, a test).
#[derive(Debug, Clone, Default)]
pub struct TeamControl {
    live: Arc<std::sync::Mutex<std::collections::BTreeMap<String, (InstanceInfo, CancelToken)>>>,
    changed: Arc<tokio::sync::Notify>,
    /// Operators' spawn requests by directive id, until their turn has answered them.
    directives: Arc<std::sync::Mutex<HashMap<String, SpawnRequest>>>,
}

/// A running instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// Its id (`ins_…`).
    pub instance_id: String,
    /// Its mission (`mis_<turn>`).
    pub mission_id: String,
    /// Its role.
    pub role: String,
}

impl TeamControl {
    /// A control with no instance.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, (InstanceInfo, CancelToken)>> {
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The running instances.
    #[must_use]
    pub fn instances(&self) -> Vec<InstanceInfo> {
        self.lock().values().map(|(info, _)| info.clone()).collect()
    }

    /// Waits until at least `count` instances run, and returns them.
    pub async fn wait_for_instances(&self, count: usize) -> Vec<InstanceInfo> {
        loop {
            let notified = self.changed.notified();
            let instances = self.instances();
            if instances.len() >= count {
                return instances;
            }
            notified.await;
        }
    }

    /// Cancels one running instance; its thread ends `instance.cancelled` and its caller
    /// gets an error result. False when no such instance runs.
    pub fn cancel_instance(&self, instance_id: &str) -> bool {
        self.lock().get(instance_id).is_some_and(|(_, token)| {
            token.cancel(CancellationReason::ClientCancelled);
            true
        })
    }

    /// Cancels every running instance of a mission; returns how many.
    pub fn cancel_mission(&self, mission_id: &str) -> usize {
        self.cancel_mission_for(mission_id, CancellationReason::ClientCancelled)
    }

    /// Cancels every running instance of a mission for `reason`; returns how many.
    pub(crate) fn cancel_mission_for(&self, mission_id: &str, reason: CancellationReason) -> usize {
        let live = self.lock();
        let mut count = 0;
        for (info, token) in live.values() {
            if info.mission_id == mission_id {
                token.cancel(reason);
                count += 1;
            }
        }
        count
    }

    fn start(&self, info: InstanceInfo, token: CancelToken) {
        self.lock().insert(info.instance_id.clone(), (info, token));
        self.changed.notify_waiters();
    }

    fn end(&self, instance_id: &str) {
        self.lock().remove(instance_id);
        self.changed.notify_waiters();
    }
}

/// A team's members and the budgets they run under, shared by its tools.
#[derive(Debug)]
pub(crate) struct Crew {
    pub(crate) agents: Vec<Agent>,
    pub(crate) control: TeamControl,
    pub(crate) budgets: budget::Budgets,
    /// Instance budgets by role (a member's role is its name), from the spawn policy.
    pub(crate) role_budgets: HashMap<String, BudgetLimit>,
}

impl Crew {
    /// The member named `name`, or an error listing the members.
    pub(crate) fn find(&self, name: &str) -> Result<&Agent, ToolError> {
        self.agents.iter().find(|member| member.name() == name).ok_or_else(|| {
            let names: Vec<&str> = self.agents.iter().map(Agent::name).collect();
            ToolError::Failed(format!(
                "no team member is named {name:?}; the members are: {}",
                names.join(", ")
            ))
        })
    }
}

#[derive(Deserialize, JsonSchema)]
struct DelegateToMember {
    /// The member's name.
    member_id: String,
    /// The task, self-contained: the member sees nothing else.
    task: String,
}

#[derive(Deserialize, JsonSchema)]
struct DelegateToMembers {
    /// The task every member gets.
    task: String,
}

/// Runs a member on its own thread as an agent-team instance of the turn's mission, under
/// its role's budget and the mission's.
pub(crate) async fn run_member(
    crew: &Crew,
    context: &ToolContext,
    member: &Agent,
    task: String,
    title: String,
) -> Result<ThreadResult, ToolError> {
    let limit = crew.role_budgets.get(member.name()).copied().unwrap_or_default();
    let skills = skill_hash(member.instructions().unwrap_or_default(), &[]);
    let spec = InstanceSpec {
        role: member.name(),
        limit,
        instance_id: None,
        ancestors: Vec::new(),
        skill_hash: skills,
        started: None,
    };
    run_instance(crew, context, member, task, title, spec).await
}

/// `sha256:<hex>` of an instance's instructions and skills: the same template hashes the
/// same, so a client can tell instances of one definition apart from changed ones.
pub(crate) fn skill_hash(instructions: &str, skills: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(instructions.as_bytes());
    for skill in skills {
        hasher.update(b"\n");
        hasher.update(skill.as_bytes());
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

/// What a new instance is.
pub(crate) struct InstanceSpec<'a> {
    pub(crate) role: &'a str,
    pub(crate) limit: BudgetLimit,
    pub(crate) instance_id: Option<String>,
    /// The instance that spawned it, then that one's spawner, and so on (none for a
    /// member of the coordinator's): it reserves from their budgets as well as its own and
    /// its mission's.
    pub(crate) ancestors: Vec<String>,
    pub(crate) skill_hash: String,
    /// Set once the instance starts (its ledger made): a spawn whose instance never
    /// started gives its slot back.
    pub(crate) started: Option<&'a std::sync::atomic::AtomicBool>,
}

/// Runs an agent as a new instance of `role` with its own ledger.
pub(crate) async fn run_instance(
    crew: &Crew,
    context: &ToolContext,
    agent: &Agent,
    task: String,
    title: String,
    spec: InstanceSpec<'_>,
) -> Result<ThreadResult, ToolError> {
    let InstanceSpec { role, limit, instance_id, ancestors, skill_hash, started } = spec;
    let parent_instance_id = ancestors.first().cloned();
    let mission_id = format!("mis_{}", context.turn_id);
    // A member that paused in the previous turn (for an approval, an answer) goes on as the
    // same instance, with the usage its ledger holds, in this turn's mission.
    let resumed = context.resumed_instance(agent, &task).and_then(|team| team.instance_id);
    let instance_id = resumed.clone().or(instance_id).unwrap_or_else(|| format!("ins_{}", EventId::new()));
    let ledger = crew
        .budgets
        .instance(
            context,
            &mission_id,
            &instance_id,
            ancestors,
            limit,
            resumed.is_some(),
            crew.control.clone(),
        )
        .await
        .map_err(|error| ToolError::Failed(format!("the budget ledger is unavailable: {error}")))?;
    let ledger = ledger.map(Arc::new);
    if let Some(started) = started {
        started.store(true, std::sync::atomic::Ordering::Release);
    }
    let token = CancelToken::new();
    let info = InstanceInfo {
        instance_id: instance_id.clone(),
        mission_id: mission_id.clone(),
        role: role.to_owned(),
    };
    let instance = ThreadInstance {
        team: TeamContext {
            mission_id: Some(mission_id),
            instance_id: Some(instance_id.clone()),
            parent_instance_id,
            source: Some(crate::directed::call_source(&context.tool_call_id)),
            message_id: context.message_id.map(|id| id.to_string()),
            tool_call_id: Some(context.tool_call_id.clone()),
        },
        role: role.to_owned(),
        budget: limit,
        ledger: ledger.clone().map(|ledger| ledger as Arc<dyn agentry_runner::StepBudget>),
        cancel: Some(token.clone()),
        skill_hash: Some(skill_hash),
    };
    let team = instance.team.clone();
    crew.control.start(info, token.clone());
    // Listed while it runs, even if the call is dropped part way.
    let _listed = Listed { control: &crew.control, instance_id: &instance_id };
    let run = context.run_instance(agent, task, title, instance);
    let (Some(limit_ms), Some(ledger)) = (limit.max_elapsed_ms, ledger) else { return run.await };
    // Its time runs out when it does, not at the next step after: a model call or tool
    // still under way is stopped (with the cancellation grace tools get).
    let mut run = std::pin::pin!(run);
    tokio::select! {
        biased;
        result = &mut run => return result,
        () = tokio::time::sleep(ledger.time_left(limit_ms)) => {}
    }
    token.cancel(CancellationReason::BudgetExhausted);
    let result = run.await;
    // Reported only when the instance did stop for it (it may have finished meanwhile).
    if result.is_err() {
        let exhausted = ledger.out_of_time().await;
        if exhausted.first {
            let payload = EventPayload::BudgetExhausted {
                exhausted_by: exhausted.exhausted_by,
                usage: exhausted.usage,
            };
            if let Err(error) = context.emit_team_event(team, payload).await {
                tracing::warn!(instance = %instance_id, %error, "reporting an instance out of time failed");
            }
        }
    }
    result
}

/// Removes a running instance from its control's list when dropped.
struct Listed<'a> {
    control: &'a TeamControl,
    instance_id: &'a str,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.control.end(self.instance_id);
    }
}

/// A thread title: the member and the start of the task.
pub(crate) fn title(member: &str, task: &str) -> String {
    let short: String = task.chars().take(60).collect();
    if short.len() < task.len() { format!("{member}: {short}…") } else { format!("{member}: {short}") }
}

/// The result of a call that ran several threads, one `name: answer` (or `name failed: …`)
/// line each; when any thread paused, the call pauses with every paused thread's required
/// actions together (the others' results are kept with their runs and given again when the
/// call resumes).
pub(crate) fn join_outcomes(results: Vec<(String, Result<String, ToolError>)>) -> Result<String, ToolError> {
    let required: Vec<_> = results
        .iter()
        .filter_map(|(_, outcome)| match outcome {
            Err(ToolError::Paused { required }) => Some(required.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    if !required.is_empty() {
        return Err(ToolError::Paused { required });
    }
    let lines: Vec<String> = results
        .into_iter()
        .map(|(name, outcome)| match outcome {
            Ok(answer) => format!("{name}: {answer}"),
            Err(error) => format!("{name} failed: {error}"),
        })
        .collect();
    Ok(lines.join("\n"))
}

/// Runs the named member on the task.
async fn delegate(
    crew: &Crew,
    context: &ToolContext,
    args: &DelegateToMember,
) -> Result<ThreadResult, ToolError> {
    let member = crew.find(&args.member_id)?;
    run_member(crew, context, member, args.task.clone(), title(member.name(), &args.task)).await
}

fn delegate_to_member(members: Arc<Crew>) -> Arc<dyn Tool> {
    FunctionTool::new(
        "delegate_task_to_member",
        "Delegates a task to one team member, who works on it on its own thread and returns its answer.",
        move |args: DelegateToMember, context: ToolContext| {
            let members = members.clone();
            async move { delegate(&members, &context, &args).await.map(|result| result.answer) }
        },
    )
    .ends_on_cancel()
    .resumes_threads()
    .shared()
}

fn route_to_member(members: Arc<Crew>) -> Arc<dyn Tool> {
    FunctionTool::new(
        "route_to_member",
        "Hands the user's request to one team member, whose answer goes to the user as it is.",
        move |args: DelegateToMember, context: ToolContext| {
            let members = members.clone();
            async move {
                let result = delegate(&members, &context, &args).await?;
                if let Some(output) = result.output {
                    context.answer_directly(output);
                }
                Ok(result.answer)
            }
        },
    )
    .ends_on_cancel()
    .resumes_threads()
    .shared()
}

fn delegate_to_members(members: Arc<Crew>) -> Arc<dyn Tool> {
    FunctionTool::new(
        "delegate_task_to_members",
        "Gives the same task to every team member at once; each works on its own thread. Returns every answer.",
        move |args: DelegateToMembers, context: ToolContext| {
            let members = members.clone();
            async move {
                let crew = &*members;
                let runs = crew.agents.iter().map(|member| {
                    let context = &context;
                    let task = args.task.clone();
                    async move {
                        let outcome = run_member(crew, context, member, task.clone(), title(member.name(), &task)).await;
                        (member.name().to_owned(), outcome.map(|result| result.answer))
                    }
                });
                join_outcomes(futures_util::future::join_all(runs).await)
            }
        },
    )
    .ends_on_cancel()
    .resumes_threads()
    .shared()
}
