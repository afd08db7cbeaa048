//! Spawning agent instances under a spawn policy (seed 001): the policy file, the
//! `spawn_agent` tool, approvals of gated spawns, and the `spawn.requested` →
//! `spawn.denied` | `spawn.approved` → `instance.started` lifecycle.
//!
//! The policy is TOML:
//!
//! ```toml
//! coordinator_role = "lead"          # the role of the team's coordinator (default "coordinator")
//!
//! [mission]                          # totals for all instances of one mission (team turn)
//! max_tokens = 40000
//!
//! [roles.lead]
//! can_spawn = ["worker"]             # which roles this role may spawn
//!
//! [roles.worker]
//! require_justification = true
//! require_approval = false
//! approval_timeout_secs = 3600       # a gated spawn undecided this long is denied (default an hour)
//! max_instances = 4                  # per mission (a mission resumed after a crash counts the dead process's)
//! max_depth = 1                      # spawned by the coordinator: depth 1
//! budget = { max_tokens = 8000, max_tool_calls = 10 }
//! capabilities = ["read"]            # the tools its instances may call
//!
//! [roles.worker.templates.default]   # what a worker is; `spawn_agent` names one (default "default")
//! instructions = "You research."
//! model = "small"                    # a model registered with the team
//! tools = ["read"]                   # tools registered with the team
//! skills = ["citations"]
//! ```
//!
//! With no policy every spawn is denied with `spawn_policy_missing`; every other refusal
//! has its own code: `unknown_role`, `spawn_not_allowed`, `justification_required`,
//! `instance_limit_reached`, `depth_limit_reached`, `template_missing`,
//! `budget_override_too_large`, `approval_denied`, `invalid_template`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long a gated spawn waits for a decision when its role does not say.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(3600);

use agentry_events::TeamContext;
use agentry_model::Model;
use agentry_runner::{Agent, FunctionTool, Tool, ToolContext, ToolError};
use agentry_types::{BudgetLimit, EventId};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::oneshot;

/// A spawn policy file could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read the spawn policy {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not a valid policy.
    #[error("the spawn policy is invalid: {0}")]
    Invalid(String),
}

/// A budget in the policy file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyBudget {
    /// Tokens.
    pub max_tokens: Option<u64>,
    /// Model calls.
    pub max_steps: Option<u64>,
    /// Tool calls.
    pub max_tool_calls: Option<u64>,
    /// US dollars.
    pub max_cost_usd: Option<f64>,
    /// Milliseconds.
    pub max_elapsed_ms: Option<u64>,
}

impl From<PolicyBudget> for BudgetLimit {
    fn from(budget: PolicyBudget) -> Self {
        Self {
            max_tokens: budget.max_tokens,
            max_steps: budget.max_steps,
            max_tool_calls: budget.max_tool_calls,
            max_cost_usd: budget.max_cost_usd,
            max_elapsed_ms: budget.max_elapsed_ms,
        }
    }
}

/// What an instance of a role is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// Its instructions.
    #[serde(default)]
    pub instructions: String,
    /// The model, by the name it was registered with; the coordinator's model when absent.
    pub model: Option<String>,
    /// Tools, by name, from those registered with the team.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Skills, named for the instance's skill hash.
    #[serde(default)]
    pub skills: Vec<String>,
}

/// A role of the policy.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Role {
    /// The roles this role may spawn.
    #[serde(default)]
    pub can_spawn: Vec<String>,
    /// Whether a spawn of this role must say why.
    #[serde(default)]
    pub require_justification: bool,
    /// Whether a spawn of this role waits for a person's approval.
    #[serde(default)]
    pub require_approval: bool,
    /// How long a gated spawn waits for a decision before it is denied
    /// (`approval_denied`); [`DEFAULT_APPROVAL_TIMEOUT`] when absent. Its turn runs, and
    /// its session takes no other turn, while it waits.
    pub approval_timeout_secs: Option<u64>,
    /// Instances of this role per mission.
    pub max_instances: Option<u32>,
    /// How deep in the spawn tree an instance of this role may be (the coordinator is 0).
    pub max_depth: Option<u32>,
    /// The default budget of its instances.
    #[serde(default)]
    pub budget: PolicyBudget,
    /// The tools its instances may call; all of their template's when absent.
    pub capabilities: Option<Vec<String>>,
    /// Its templates by name.
    #[serde(default)]
    pub templates: BTreeMap<String, Template>,
}

/// A spawn policy.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnPolicy {
    /// The role of the team's coordinator.
    #[serde(default = "coordinator_role")]
    pub coordinator_role: String,
    /// Totals for all instances of a mission.
    #[serde(default)]
    pub mission: PolicyBudget,
    /// The roles.
    #[serde(default)]
    pub roles: BTreeMap<String, Role>,
}

fn coordinator_role() -> String {
    "coordinator".to_owned()
}

/// Refuses a budget under which no model call could run (zero tokens, steps or time) or
/// whose cost limit is no amount of money. Zero tool calls is a real limit: no tools.
fn check_budget(whose: &str, budget: &PolicyBudget) -> Result<(), PolicyError> {
    let zero = [
        ("max_tokens", budget.max_tokens),
        ("max_steps", budget.max_steps),
        ("max_elapsed_ms", budget.max_elapsed_ms),
    ]
    .into_iter()
    .find(|(_, limit)| *limit == Some(0));
    if let Some((key, _)) = zero {
        return Err(PolicyError::Invalid(format!("{whose}: budget {key} must be at least 1")));
    }
    if let Some(cost) = budget.max_cost_usd
        && !(cost.is_finite() && cost >= 0.0)
    {
        return Err(PolicyError::Invalid(format!(
            "{whose}: budget max_cost_usd must be a finite amount of at least 0, not {cost}"
        )));
    }
    Ok(())
}

impl SpawnPolicy {
    /// Parses a policy from TOML text.
    ///
    /// Errors: `Invalid` naming the problem (syntax, an unknown key, a role that can spawn
    /// an undefined role, a coordinator role that is not defined while roles spawn, a limit
    /// of a spawnable role or of the mission that no instance could ever pass: a depth of 0,
    /// zero tokens, steps or time, a negative or non-finite cost).
    pub fn parse(text: &str) -> Result<Self, PolicyError> {
        let policy: Self = toml::from_str(text).map_err(|error| PolicyError::Invalid(error.to_string()))?;
        check_budget("mission", &policy.mission)?;
        for (name, role) in &policy.roles {
            if role.approval_timeout_secs == Some(0) {
                return Err(PolicyError::Invalid(format!(
                    "role {name:?}: approval_timeout_secs must be at least 1"
                )));
            }
            // Limits of a role something may spawn: one that no spawn could pass is a
            // mistake (the coordinator's role, never spawned, may say anything; zero
            // instances is the way to switch a role off).
            let spawnable = policy.roles.values().any(|spawner| spawner.can_spawn.contains(name));
            if spawnable {
                if role.max_depth == Some(0) {
                    return Err(PolicyError::Invalid(format!(
                        "role {name:?}: max_depth must be at least 1 (spawned instances are at depth 1 or more)"
                    )));
                }
                check_budget(&format!("role {name:?}"), &role.budget)?;
            }
            if let Some(unknown) = role.can_spawn.iter().find(|target| !policy.roles.contains_key(*target)) {
                return Err(PolicyError::Invalid(format!(
                    "role {name:?} can spawn {unknown:?}, which is not defined"
                )));
            }
        }
        // Roles that only set members' budgets need no coordinator; spawning starts with it.
        let spawns = policy.roles.values().any(|role| !role.can_spawn.is_empty());
        if spawns && !policy.roles.contains_key(&policy.coordinator_role) {
            let roles: Vec<&str> = policy.roles.keys().map(String::as_str).collect();
            return Err(PolicyError::Invalid(format!(
                "the coordinator's role {:?} is not defined, so nothing could be spawned (roles: {})",
                policy.coordinator_role,
                roles.join(", ")
            )));
        }
        Ok(policy)
    }

    /// Refuses the budgets under which a team with `members`, holding `tokens_per_step`
    /// tokens before each model call, could make no model call at all: a `max_tokens` below
    /// the hold (of the mission, of a role something may spawn, or of a role named like a
    /// member, whose budget it sets), and a zero budget of a member's role.
    ///
    /// Errors: `Invalid` naming the role (or the mission), its limit and the hold.
    pub fn check_for_team(&self, members: &[&str], tokens_per_step: u64) -> Result<(), PolicyError> {
        let below = |whose: &str, budget: &PolicyBudget| match budget.max_tokens {
            Some(tokens) if tokens < tokens_per_step => Err(PolicyError::Invalid(format!(
                "{whose}: budget max_tokens {tokens} is below the {tokens_per_step} tokens held before each \
                 model call (the team's tokens_per_step), so it allows no model call"
            ))),
            _ => Ok(()),
        };
        below("mission", &self.mission)?;
        for (name, role) in &self.roles {
            let member = members.contains(&name.as_str());
            if member {
                check_budget(&format!("role {name:?} (the budget of member {name:?})"), &role.budget)?;
            }
            if member || self.roles.values().any(|spawner| spawner.can_spawn.contains(name)) {
                below(&format!("role {name:?}"), &role.budget)?;
            }
        }
        Ok(())
    }

    /// Reads a policy file. A missing file is `Ok(None)`: every spawn is then denied with
    /// `spawn_policy_missing`.
    ///
    /// Errors: `Read` when the file exists but cannot be read; `Invalid` as in
    /// [`SpawnPolicy::parse`].
    pub fn load(path: impl AsRef<Path>) -> Result<Option<Self>, PolicyError> {
        let path = path.as_ref();
        match std::fs::read_to_string(path) {
            // The file is named: the error's line and column are in it, not in the
            // configuration that points to it.
            Ok(text) => Self::parse(&text).map(Some).map_err(|error| match error {
                PolicyError::Invalid(message) => {
                    PolicyError::Invalid(format!("{}: {message}", path.display()))
                }
                other => other,
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => {
                Err(PolicyError::Read { path: path.display().to_string(), reason: error.to_string() })
            }
        }
    }
}

/// A spawn waiting for a person's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSpawn {
    /// The approval's id (`appr_…`).
    pub approval_id: String,
    /// The mission.
    pub mission_id: String,
    /// The role asked for.
    pub role: String,
    /// The task.
    pub task: String,
    /// The justification given.
    pub justification: Option<String>,
}

/// How a spawn's wait for approval ended ([`SpawnApprovals::ended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApprovalEnd {
    /// A person approved it.
    Approved,
    /// A person denied it.
    Denied,
    /// Its wait ended undecided: it timed out, or its turn was cancelled or ended.
    Withdrawn,
}

/// A spawn whose wait for approval ended, as [`SpawnApprovals::ended`] tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedSpawn {
    /// The approval's id (`appr_…`).
    pub approval_id: String,
    /// The mission.
    pub mission_id: String,
    /// How its wait ended.
    pub end: ApprovalEnd,
}

/// How many ended approvals [`SpawnApprovals::ended`] remembers (the most recent).
const ENDED_KEPT: usize = 1024;

/// Spawns waiting for approval, shared by a team and whoever decides (the server's
/// approval routes, a test). The most recent ended ones are remembered too, so a second
/// decision (a double click, a retry) can be told the first one's outcome.
#[derive(Debug, Clone, Default)]
pub struct SpawnApprovals {
    pending: Arc<Mutex<Waiting>>,
    waiting: Arc<tokio::sync::Notify>,
    ended: Arc<Mutex<VecDeque<EndedSpawn>>>,
}

/// Spawns waiting for a decision, by approval id, with the channel their tool call waits on.
type Waiting = BTreeMap<String, (PendingSpawn, Option<oneshot::Sender<Decision>>)>;

#[derive(Debug)]
enum Decision {
    Approve,
    Deny(String),
}

impl SpawnApprovals {
    /// A new, empty set.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The spawns waiting for a decision, oldest first.
    #[must_use]
    pub fn pending(&self) -> Vec<PendingSpawn> {
        self.lock().values().map(|(spawn, _)| spawn.clone()).collect()
    }

    /// Waits until at least one spawn waits for a decision.
    pub async fn wait_for_pending(&self) -> Vec<PendingSpawn> {
        loop {
            let notified = self.waiting.notified();
            let pending = self.pending();
            if !pending.is_empty() {
                return pending;
            }
            notified.await;
        }
    }

    /// Approves a waiting spawn. Returns false when no spawn waits under that id.
    pub fn approve(&self, approval_id: &str) -> bool {
        self.decide(approval_id, Decision::Approve)
    }

    /// Denies a waiting spawn with a reason. Returns false when no spawn waits under that id.
    pub fn deny(&self, approval_id: &str, reason: impl Into<String>) -> bool {
        self.decide(approval_id, Decision::Deny(reason.into()))
    }

    /// How a recent spawn's wait for approval ended; none for one still waiting or not
    /// among the last 1,024 that ended in this process.
    #[must_use]
    pub fn ended(&self, approval_id: &str) -> Option<EndedSpawn> {
        let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        ended.iter().rev().find(|spawn| spawn.approval_id == approval_id).cloned()
    }

    fn decide(&self, approval_id: &str, decision: Decision) -> bool {
        let mut waiting = self.lock();
        let Some((spawn, sender)) = waiting.remove(approval_id) else { return false };
        let end = match decision {
            Decision::Approve => ApprovalEnd::Approved,
            Decision::Deny(_) => ApprovalEnd::Denied,
        };
        // The call no longer waits (its turn ended under the lock's release) when the
        // decision cannot be sent: then nothing was decided.
        let sent = sender.is_some_and(|sender| sender.send(decision).is_ok());
        self.remember(spawn, if sent { end } else { ApprovalEnd::Withdrawn });
        sent
    }

    /// Records how a spawn's wait ended (under the waiting list's lock, so a reader never
    /// finds a spawn in neither list).
    fn remember(&self, spawn: PendingSpawn, end: ApprovalEnd) {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        if ended.len() == ENDED_KEPT {
            ended.pop_front();
        }
        ended.push_back(EndedSpawn { approval_id: spawn.approval_id, mission_id: spawn.mission_id, end });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn register(&self, spawn: PendingSpawn) -> oneshot::Receiver<Decision> {
        let (sender, receiver) = oneshot::channel();
        self.lock().insert(spawn.approval_id.clone(), (spawn, Some(sender)));
        self.waiting.notify_waiters();
        receiver
    }

    fn forget(&self, approval_id: &str) {
        let mut waiting = self.lock();
        if let Some((spawn, _)) = waiting.remove(approval_id) {
            self.remember(spawn, ApprovalEnd::Withdrawn);
        }
    }
}

/// A spawn registered for approval: it leaves the waiting list when this is dropped (a
/// decided one already has).
struct Undecided<'a> {
    approvals: &'a SpawnApprovals,
    id: &'a str,
}

impl Drop for Undecided<'_> {
    fn drop(&mut self) {
        self.approvals.forget(self.id);
    }
}

/// What templates are made of: models and tools by name.
#[derive(Debug, Clone, Default)]
pub struct SpawnCatalog {
    /// Models by name.
    pub models: HashMap<String, Arc<dyn Model>>,
    /// Tools, named by their spec.
    pub tools: Vec<Arc<dyn Tool>>,
}

/// Instances spawned in one mission (one team turn), per team and role: the turn's own
/// (`ToolContext::turn_local`), shared by the spawners of every depth of one team. A team
/// nested in another counts its own (its policy is its own, whatever its roles are called).
#[derive(Debug, Default)]
struct SpawnCounts {
    /// Instances this process started in the mission, by team and role.
    started: Mutex<HashMap<(usize, String), u32>>,
    /// Instances the mission had started before this process took its turn over (a
    /// resumed turn), by role, read from the turn's stored events at its first spawn here.
    /// Stored events do not say which team spawned an instance: a role name that two
    /// nested teams share counts the other's too (a limit is never exceeded, a recovered
    /// nested team may be refused early).
    before: tokio::sync::OnceCell<HashMap<String, u32>>,
}

impl SpawnCounts {
    /// The instances the mission spawned before this process took its turn over: by
    /// role, each spawn approved (`spawn.approved`). Read once per turn, and only for a
    /// turn this process resumed (none otherwise, and outside a turn).
    async fn before(&self, context: &ToolContext) -> Result<&HashMap<String, u32>, ToolError> {
        self.before
            .get_or_try_init(|| async {
                if context.turn_resumed() { stored_spawns(context).await } else { Ok(HashMap::new()) }
            })
            .await
    }
}

/// See [`SpawnCounts::before`]. An approval counts whether or not its instance's start
/// is stored: a resumed paused instance starts under its first id, not the one its new
/// approval names, and the rare approval whose instance could not start errs on the side
/// of the limit.
async fn stored_spawns(context: &ToolContext) -> Result<HashMap<String, u32>, ToolError> {
    let mut counts = HashMap::new();
    for event in context.stored_turn_events().await? {
        if let agentry_events::EventPayload::SpawnApproved { requested_role, .. } = event.payload {
            *counts.entry(requested_role).or_default() += 1;
        }
    }
    Ok(counts)
}

/// Everything `spawn_agent` needs.
#[derive(Debug, Clone)]
pub(crate) struct Spawner {
    pub(crate) crew: Arc<crate::Crew>,
    pub(crate) policy: Option<Arc<SpawnPolicy>>,
    pub(crate) catalog: SpawnCatalog,
    pub(crate) approvals: SpawnApprovals,
    pub(crate) default_model: Arc<dyn Model>,
    /// The role that spawns through this tool; the coordinator's role when `None`.
    pub(crate) role: Option<String>,
    /// How deep the spawning agent is (the coordinator is 0).
    pub(crate) depth: u32,
    /// The instance that spawns, then the instance that spawned it, and so on (none for
    /// the coordinator): an instance it spawns reserves from each of their budgets too.
    pub(crate) ancestors: Vec<String>,
}

#[derive(Deserialize, JsonSchema)]
struct SpawnArgs {
    /// The role of the new instance.
    role: String,
    /// The role's template to use (`default` when absent).
    #[serde(default)]
    template: Option<String>,
    /// The task, self-contained.
    task: String,
    /// Why the instance is needed.
    #[serde(default)]
    justification: Option<String>,
    /// A budget for this instance instead of the role's default (at most the default).
    #[serde(default)]
    budget_override: Option<agentry_types::BudgetLimit>,
}

/// A refusal: its code and message.
struct Refusal(&'static str, String);

fn within(limit: Option<u64>, requested: Option<u64>) -> bool {
    match (limit, requested) {
        (Some(limit), Some(requested)) => requested <= limit,
        (Some(_), None) => false,
        (None, _) => true,
    }
}

impl Spawner {
    fn check(
        &self,
        args: &SpawnArgs,
        counts: &SpawnCounts,
        before: &HashMap<String, u32>,
    ) -> Result<(Arc<SpawnPolicy>, Role, Template), Refusal> {
        let Some(policy) = self.policy.clone() else {
            return Err(Refusal("spawn_policy_missing", "spawn policy file missing".to_owned()));
        };
        let Some(role) = policy.roles.get(&args.role).cloned() else {
            return Err(Refusal("unknown_role", format!("the policy has no role {:?}", args.role)));
        };
        let spawning = self.role.as_deref().unwrap_or(&policy.coordinator_role);
        if !policy.roles.get(spawning).is_some_and(|spawner| spawner.can_spawn.contains(&args.role)) {
            return Err(Refusal(
                "spawn_not_allowed",
                format!("role {spawning:?} may not spawn role {:?}", args.role),
            ));
        }
        if role.require_justification
            && args.justification.as_deref().is_none_or(|text| text.trim().is_empty())
        {
            return Err(Refusal(
                "justification_required",
                format!("a spawn of role {:?} needs a justification", args.role),
            ));
        }
        // The coordinator is at depth 0; what an agent at depth d spawns is at depth d + 1.
        if role.max_depth.is_some_and(|max| self.depth + 1 > max) {
            return Err(Refusal(
                "depth_limit_reached",
                format!("role {:?} may not be spawned this deep", args.role),
            ));
        }
        let template_name = args.template.clone().unwrap_or_else(|| "default".to_owned());
        let Some(template) = role.templates.get(&template_name).cloned() else {
            return Err(Refusal(
                "template_missing",
                format!("role {:?} has no template {template_name:?}", args.role),
            ));
        };
        if let Some(requested) = &args.budget_override {
            let default = BudgetLimit::from(role.budget);
            let fits = within(default.max_tokens, requested.max_tokens)
                && within(default.max_steps, requested.max_steps)
                && within(default.max_tool_calls, requested.max_tool_calls)
                && within(default.max_elapsed_ms, requested.max_elapsed_ms)
                && match (default.max_cost_usd, requested.max_cost_usd) {
                    (Some(limit), Some(requested)) => requested <= limit,
                    (Some(_), None) => false,
                    (None, _) => true,
                };
            if !fits {
                return Err(Refusal(
                    "budget_override_too_large",
                    format!("the budget asked for exceeds role {:?}'s default", args.role),
                ));
            }
        }
        let mut counts = counts.started.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(self.count_key(&args.role)).or_default();
        let all = *count + before.get(&args.role).copied().unwrap_or(0);
        if role.max_instances.is_some_and(|max| all >= max) {
            return Err(Refusal(
                "instance_limit_reached",
                format!("the mission already has {all} instance(s) of role {:?}, its limit", args.role),
            ));
        }
        *count += 1;
        Ok((policy, role, template))
    }

    /// The key of `role`'s count: the team (its crew, shared by its spawners of every
    /// depth) and the role.
    fn count_key(&self, role: &str) -> (usize, String) {
        (Arc::as_ptr(&self.crew) as usize, role.to_owned())
    }

    fn build_agent(
        &self,
        name: &str,
        role_name: &str,
        role: &Role,
        template: &Template,
        instance_id: &str,
    ) -> Result<Agent, Refusal> {
        let model = match &template.model {
            Some(model) => self.catalog.models.get(model).cloned().ok_or_else(|| {
                Refusal("invalid_template", format!("the template names the unknown model {model:?}"))
            })?,
            None => self.default_model.clone(),
        };
        let mut builder = Agent::builder(name, model).instructions(template.instructions.clone());
        for tool_name in &template.tools {
            let tool =
                self.catalog.tools.iter().find(|tool| &tool.spec().name == tool_name).ok_or_else(|| {
                    Refusal("invalid_template", format!("the template names the unknown tool {tool_name:?}"))
                })?;
            builder = builder.tool(tool.clone());
        }
        if !role.can_spawn.is_empty() {
            // An instance of a role that may spawn gets its own spawn_agent, one level deeper.
            let child = Self {
                role: Some(role_name.to_owned()),
                depth: self.depth + 1,
                ancestors: std::iter::once(instance_id.to_owned())
                    .chain(self.ancestors.iter().cloned())
                    .collect(),
                ..self.clone()
            };
            builder = builder.tool(spawn_agent(child));
        }
        if let Some(capabilities) = &role.capabilities {
            let mut capabilities = capabilities.clone();
            if !role.can_spawn.is_empty() {
                capabilities.push("spawn_agent".to_owned());
            }
            builder = builder.capabilities(capabilities);
        }
        Ok(builder.build())
    }
}

/// The `spawn_agent` tool of a team's coordinator.
pub(crate) fn spawn_agent(spawner: Spawner) -> Arc<dyn Tool> {
    FunctionTool::new(
        "spawn_agent",
        "Starts a new agent instance of a role (under the team's spawn policy) to work on a task on its own \
         thread; returns its answer.",
        move |args: SpawnArgs, context: ToolContext| {
            let spawner = spawner.clone();
            async move { spawn(&spawner, args, &context).await }
        },
    )
    .ends_on_cancel()
    .shared()
}

async fn spawn(spawner: &Spawner, args: SpawnArgs, context: &ToolContext) -> Result<String, ToolError> {
    let mission = context.turn_id;
    // A turn resumed from another process counts the instances that process spawned. Read
    // before the request is emitted: a read that fails leaves no request undecided.
    let counts = context.turn_local::<SpawnCounts>().unwrap_or_default();
    let before = counts.before(context).await?;
    let team = |instance_id: Option<String>| TeamContext {
        mission_id: Some(format!("mis_{mission}")),
        instance_id,
        parent_instance_id: spawner.ancestors.first().cloned(),
        source: Some(crate::directed::call_source(&context.tool_call_id)),
        message_id: context.message_id.map(|id| id.to_string()),
        tool_call_id: Some(context.tool_call_id.clone()),
    };
    context
        .emit_team_event(
            team(None),
            agentry_events::EventPayload::SpawnRequested {
                requested_role: args.role.clone(),
                template: args.template.clone(),
                task: Some(args.task.clone()),
                justification: args.justification.clone(),
                budget_override: args.budget_override,
            },
        )
        .await?;
    let requested_role = args.role.clone();
    let deny = |code: &'static str, error: String| {
        let requested_role = requested_role.clone();
        async move {
            context
                .emit_team_event(
                    team(None),
                    agentry_events::EventPayload::SpawnDenied {
                        requested_role,
                        code: code.to_owned(),
                        error: error.clone(),
                    },
                )
                .await?;
            Err::<String, ToolError>(ToolError::Failed(agentry_events::spawn_denial_result(code, &error)))
        }
    };
    let (_policy, role, template) = match spawner.check(&args, &counts, before) {
        Ok(granted) => granted,
        Err(Refusal(code, error)) => return deny(code, error).await,
    };
    // The slot `check` took counts only if the instance starts.
    let uncount = || {
        let mut counts = counts.started.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&spawner.count_key(&args.role)) {
            *count = count.saturating_sub(1);
        }
    };
    // The instance is made before anyone is asked to approve it: a template that cannot be
    // built is denied at once, never after an approval (`spawn.approved` is final).
    let instance_id = format!("ins_{}", EventId::new());
    // Named by the random end of its id (the start is a timestamp, shared by instances
    // spawned in the same minute).
    let name = format!("{}-{}", args.role, &instance_id[instance_id.len() - 8..]);
    let agent = match spawner.build_agent(&name, &args.role, &role, &template, &instance_id) {
        Ok(agent) => agent,
        Err(Refusal(code, error)) => {
            uncount();
            return deny(code, error).await;
        }
    };
    let mut approval_id = None;
    if role.require_approval {
        let id = format!("appr_{}", EventId::new());
        let mut decision = spawner.approvals.register(PendingSpawn {
            approval_id: id.clone(),
            mission_id: format!("mis_{mission}"),
            role: args.role.clone(),
            task: args.task.clone(),
            justification: args.justification.clone(),
        });
        // Undecided, the spawn leaves the list of those waiting however the wait ends: timed
        // out, cancelled, or dropped with the call (a panic elsewhere in the turn).
        let _waiting = Undecided { approvals: &spawner.approvals, id: &id };
        let wait = role.approval_timeout_secs.map_or(DEFAULT_APPROVAL_TIMEOUT, Duration::from_secs);
        let waited = context.until_cancelled(tokio::time::timeout(wait, &mut decision)).await;
        // A decision sent as the wait ended (its timeout, the turn's cancellation) was
        // answered as made: closed first, so none comes after this look, it is found and
        // honoured (an approval only while the turn goes on).
        let arrived = match &waited {
            Some(Ok(_)) => None,
            Some(Err(_)) | None => {
                decision.close();
                decision.try_recv().ok()
            }
        };
        match (waited, arrived) {
            (Some(Ok(Ok(Decision::Approve))), _) | (Some(Err(_)), Some(Decision::Approve)) => {
                approval_id = Some(id.clone());
            }
            (Some(Ok(Ok(Decision::Deny(reason)))), _) | (_, Some(Decision::Deny(reason))) => {
                uncount();
                return deny("approval_denied", reason).await;
            }
            (None, Some(Decision::Approve)) => {
                uncount();
                return deny(
                    "approval_denied",
                    "the turn was cancelled as the spawn was approved".to_owned(),
                )
                .await;
            }
            (Some(Err(_elapsed)), None) => {
                uncount();
                let waited = wait.as_secs();
                return deny("approval_denied", format!("no one decided the spawn within {waited} s")).await;
            }
            (Some(Ok(Err(_))) | None, _) => {
                uncount();
                return deny("approval_denied", "the spawn was not decided before the turn ended".to_owned())
                    .await;
            }
        }
    }
    // The approval names the instance it starts (made before it), so a feed reader matches
    // it with that instance's `instance.started` among parallel spawns of one role.
    let approved = context
        .emit_team_event(
            team(Some(instance_id.clone())),
            agentry_events::EventPayload::SpawnApproved { requested_role: args.role.clone(), approval_id },
        )
        .await;
    if let Err(error) = approved {
        uncount();
        return Err(error);
    }
    let started = std::sync::atomic::AtomicBool::new(false);
    let budget = args.budget_override.unwrap_or_else(|| BudgetLimit::from(role.budget));
    let title = crate::title(&args.role, &args.task);
    let skills = crate::skill_hash(&template.instructions, &template.skills);
    let spec = crate::InstanceSpec {
        role: &args.role,
        limit: budget,
        instance_id: Some(instance_id),
        ancestors: spawner.ancestors.clone(),
        skill_hash: skills,
        started: Some(&started),
    };
    let ran = crate::run_instance(&spawner.crew, context, &agent, args.task, title, spec).await;
    // The slot counts only an instance that started (its ledger could not be made).
    if !started.load(std::sync::atomic::Ordering::Acquire) {
        uncount();
    }
    ran.map(|result| result.answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn(id: &str) -> PendingSpawn {
        PendingSpawn {
            approval_id: id.to_owned(),
            mission_id: format!("mis_{id}"),
            role: "auditor".to_owned(),
            task: "audit".to_owned(),
            justification: None,
        }
    }

    #[test]
    fn an_ended_approval_is_remembered_with_how_it_ended() {
        let approvals = SpawnApprovals::new();
        let _approved = approvals.register(spawn("a"));
        let _denied = approvals.register(spawn("b"));
        let gone = approvals.register(spawn("c"));
        let _withdrawn = approvals.register(spawn("d"));
        assert!(approvals.ended("a").is_none(), "still waiting");
        assert!(approvals.approve("a"));
        assert!(approvals.deny("b", "no"));
        // The call stopped waiting before the decision came: nothing was decided.
        drop(gone);
        assert!(!approvals.approve("c"));
        approvals.forget("d");
        let ends: Vec<_> =
            ["a", "b", "c", "d"].iter().map(|id| approvals.ended(id).map(|ended| ended.end)).collect();
        let expected =
            [ApprovalEnd::Approved, ApprovalEnd::Denied, ApprovalEnd::Withdrawn, ApprovalEnd::Withdrawn];
        assert_eq!(ends, expected.map(Some));
        assert_eq!(approvals.ended("b").map(|ended| ended.mission_id), Some("mis_b".to_owned()));
        // Decided once: a second decision finds nothing waiting and changes nothing.
        assert!(!approvals.deny("a", "too late"));
        assert_eq!(approvals.ended("a").map(|ended| ended.end), Some(ApprovalEnd::Approved));
        assert!(approvals.pending().is_empty());
    }

    #[test]
    fn only_the_most_recent_ended_approvals_are_remembered() {
        let approvals = SpawnApprovals::new();
        for index in 0..=ENDED_KEPT {
            let id = index.to_string();
            let _receiver = approvals.register(spawn(&id));
            approvals.forget(&id);
        }
        assert!(approvals.ended("0").is_none(), "the oldest is forgotten");
        assert!(approvals.ended("1").is_some());
        assert!(approvals.ended(&ENDED_KEPT.to_string()).is_some());
    }
}
