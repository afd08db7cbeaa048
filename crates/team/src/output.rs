//! `TeamRunOutput` (seed 000) as a view of stored runs: the team's run, and for each member
//! run stored with it as parent, a nested `RunOutput` (or `TeamRunOutput` for a member that
//! delegated in turn), in the order the members started.

use std::future::Future;
use std::pin::Pin;

use agentry_memory::{Order, PageRequest, ParentFilter, RunQuery, Store, StoreResult};
use agentry_types::agno::{MemberResponse, RunOutput, TeamRunOutput};
use agentry_types::{RunRecord, TurnId, TurnState};
use serde_json::Value;

/// The `TeamRunOutput` of a stored team run (a team turn, or a member run of a nested team).
///
/// Errors: `NotFound` when the run does not exist; other store errors as they come.
pub async fn team_run_output(store: &dyn Store, run_id: TurnId) -> StoreResult<TeamRunOutput> {
    let run = store.get_run(run_id).await?;
    team_output(store, run).await
}

fn answer(run: &RunRecord) -> Option<Value> {
    match &run.state {
        TurnState::Done { output, .. } => {
            output.as_ref().and_then(|output| output.message.content.clone()).map(Value::String)
        }
        _ => None,
    }
}

async fn members(store: &dyn Store, run: &RunRecord) -> StoreResult<Vec<RunRecord>> {
    let query = RunQuery { order: Order::Asc, parent: ParentFilter::Of(run.id), ..RunQuery::default() };
    let mut page = PageRequest::first(100);
    let mut members = Vec::new();
    loop {
        let found = store.list_runs(run.session_id, &query, &page).await?;
        members.extend(found.items);
        match found.next_token {
            Some(token) => page = PageRequest { token: Some(token), limit: 100 },
            None => return Ok(members),
        }
    }
}

fn team_output<'a>(
    store: &'a dyn Store,
    run: RunRecord,
) -> Pin<Box<dyn Future<Output = StoreResult<TeamRunOutput>> + Send + 'a>> {
    Box::pin(async move {
        let mut output = TeamRunOutput::new(run.created_at.unix_seconds());
        output.content = answer(&run);
        output.run_id = Some(run.id.to_string());
        output.team_id = run.team_id.clone().or_else(|| run.agent_id.clone());
        output.team_name = output.team_id.clone();
        output.session_id = Some(run.session_id.to_string());
        output.parent_run_id = run.parent_run_id.map(|parent| parent.to_string());
        output.status = run.status;
        for member in members(store, &run).await? {
            let nested = !members(store, &member).await?.is_empty();
            output.member_responses.push(if nested {
                MemberResponse::Team(Box::new(team_output(store, member).await?))
            } else {
                MemberResponse::Agent(Box::new(run_output(&member)))
            });
        }
        Ok(output)
    })
}

fn run_output(run: &RunRecord) -> RunOutput {
    let mut output = RunOutput::new(run.created_at.unix_seconds());
    output.content = answer(run);
    output.run_id = Some(run.id.to_string());
    output.agent_id = run.agent_id.clone();
    output.agent_name = run.agent_id.clone();
    output.session_id = Some(run.session_id.to_string());
    output.parent_run_id = run.parent_run_id.map(|parent| parent.to_string());
    output.status = run.status;
    output
}
