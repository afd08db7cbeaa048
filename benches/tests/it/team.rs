//! Teams on real store files: a mission's budget ledger survives reopening the store.

use std::sync::Arc;

use agentry_memory::Durability;
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, FunctionTool, Runtime, ToolError, TurnRequest};
use agentry_team::Team;
use agentry_types::{BudgetLimit, Role, Timestamp, Usage};
use serde_json::json;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Nothing {}

async fn ledger_survives_a_restart(backend: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("team.{backend}"));
    let mission;
    let used;
    {
        let store = agentry_benches::open_store(backend, &path, Durability::Batched).unwrap();
        let work = FunctionTool::new("work", "Works.", |_: Nothing, _| async {
            Ok::<_, ToolError>("more".to_owned())
        })
        .shared();
        let member_model = Arc::new(ScriptedModel::responder(|_| ScriptedResponse {
            usage: Some(Usage::new(150, 50)),
            ..ScriptedResponse::tool_call("work", &json!({}))
        }));
        let coordinator = Arc::new(ScriptedModel::responder(|request| {
            if request.messages.iter().any(|message| message.role == Role::Tool) {
                ScriptedResponse::text("Stopped.")
            } else {
                ScriptedResponse::tool_call("delegate_task_to_members", &json!({"task": "Work."}))
            }
        }));
        let team = Team::builder("crowd", coordinator)
            .member(Agent::builder("a", member_model.clone()).tool(work.clone()).build())
            .member(Agent::builder("b", member_model).tool(work).build())
            .mission_budget(BudgetLimit { max_tokens: Some(1_000), ..BudgetLimit::default() })
            .tokens_per_step(200)
            .build();
        let runtime = Runtime::new(store.clone());
        runtime.register(team);
        let session = runtime.create_session("crowd", None).await.unwrap();
        let turn = session.create_turn(TurnRequest::message("Go.")).await.unwrap();
        turn.wait().await.unwrap();
        mission = format!("mis_{}", turn.id());
        used = store.budget(&mission, Timestamp::now()).await.unwrap().used;
        assert!(used.tokens_used > 0 && used.tokens_used <= 1_200, "{used:?}");
    }
    let reopened = agentry_benches::open_store(backend, &path, Durability::Batched).unwrap();
    let ledger = reopened.budget(&mission, Timestamp::now()).await.unwrap();
    assert_eq!(ledger.used, used);
    assert_eq!(ledger.limit.max_tokens, Some(1_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missions_budget_ledger_survives_reopening_a_sqlite_store() {
    ledger_survives_a_restart("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missions_budget_ledger_survives_reopening_a_redb_store() {
    ledger_survives_a_restart("redb").await;
}
