//! `TeamRunOutput` (seed 000) as a view of stored runs: the team's run, and for each member
//! run stored with it as parent, a nested `RunOutput` (or `TeamRunOutput` for a member that
//! delegated in turn), in the order the members started.

use agentry_memory::{Store, StoreResult, run_output};
use agentry_types::TurnId;
use agentry_types::agno::{MemberResponse, TeamRunOutput};

/// The `TeamRunOutput` of a stored team run (a team turn, or a member run of a nested team).
///
/// Errors: `NotFound` when the run does not exist; other store errors as they come.
pub async fn team_run_output(store: &dyn Store, run_id: TurnId) -> StoreResult<TeamRunOutput> {
    let run = store.get_run(run_id).await?;
    let created_at = run.created_at.unix_seconds();
    Ok(match run_output(store, run).await? {
        MemberResponse::Team(team) => *team,
        // A run without members is a team run that has not delegated yet.
        MemberResponse::Agent(agent) => {
            let mut team = TeamRunOutput::new(created_at);
            team.content = agent.content;
            team.run_id = agent.run_id;
            team.team_id = agent.agent_id.clone();
            team.team_name = agent.agent_id;
            team.session_id = agent.session_id;
            team.parent_run_id = agent.parent_run_id;
            team.status = agent.status;
            team
        }
    })
}
