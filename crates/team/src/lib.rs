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

use std::sync::Arc;

use agentry_model::Model;
use agentry_runner::{Agent, AgentLimits, FunctionTool, Tool, ToolContext, ToolError};
use schemars::JsonSchema;
use serde::Deserialize;

/// How a team works. Only `Coordinate` exists so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TeamMode {
    /// The coordinator delegates tasks to members and writes the answer from their results.
    #[default]
    Coordinate,
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

    /// Sets the coordinator's limits.
    #[must_use]
    pub fn limits(mut self, limits: AgentLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The coordinator agent, named after the team, with `delegate_task_to_member` and
    /// `delegate_task_to_members`.
    #[must_use]
    pub fn build(self) -> Agent {
        let members = Arc::new(self.members);
        let roster: Vec<String> = members.iter().map(|member| format!("- {}", member.name())).collect();
        let mut instructions = self.instructions.unwrap_or_else(|| "You coordinate a team.".to_owned());
        instructions.push_str(&format!(
            "\n\nYour team members:\n{}\n\nDelegate a task to one member with delegate_task_to_member, or the same \
             task to every member with delegate_task_to_members; call several delegations at once to run them in \
             parallel. Then answer the user from their results.",
            roster.join("\n")
        ));
        Agent::builder(self.name, self.model)
            .instructions(instructions)
            .tool(delegate_to_member(members.clone()))
            .tool(delegate_to_members(members))
            .limits(self.limits)
            .build()
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

/// A thread title: the member and the start of the task.
fn title(member: &str, task: &str) -> String {
    let short: String = task.chars().take(60).collect();
    if short.len() < task.len() { format!("{member}: {short}…") } else { format!("{member}: {short}") }
}

fn delegate_to_member(members: Arc<Vec<Agent>>) -> Arc<dyn Tool> {
    FunctionTool::new(
        "delegate_task_to_member",
        "Delegates a task to one team member, who works on it on its own thread and returns its answer.",
        move |args: DelegateToMember, context: ToolContext| {
            let members = members.clone();
            async move {
                let Some(member) = members.iter().find(|member| member.name() == args.member_id) else {
                    let names: Vec<&str> = members.iter().map(Agent::name).collect();
                    return Err(ToolError::Failed(format!(
                        "no team member is named {:?}; the members are: {}",
                        args.member_id,
                        names.join(", ")
                    )));
                };
                let result =
                    context.run_thread(member, args.task.clone(), title(member.name(), &args.task)).await?;
                Ok(result.answer)
            }
        },
    )
    .shared()
}

fn delegate_to_members(members: Arc<Vec<Agent>>) -> Arc<dyn Tool> {
    FunctionTool::new(
        "delegate_task_to_members",
        "Gives the same task to every team member at once; each works on its own thread. Returns every answer.",
        move |args: DelegateToMembers, context: ToolContext| {
            let members = members.clone();
            async move {
                let runs = members.iter().map(|member| {
                    let context = &context;
                    let task = args.task.clone();
                    async move {
                        let outcome = context.run_thread(member, task.clone(), title(member.name(), &task)).await;
                        (member.name().to_owned(), outcome)
                    }
                });
                let results = futures_util::future::join_all(runs).await;
                let lines: Vec<String> = results
                    .into_iter()
                    .map(|(name, outcome)| match outcome {
                        Ok(result) => format!("{name}: {}", result.answer),
                        Err(error) => format!("{name} failed: {error}"),
                    })
                    .collect();
                Ok(lines.join("\n"))
            }
        },
    )
    .shared()
}
