//! Agent definitions that cannot run safely are refused: by `try_build` at once, and by a
//! runtime before any session or turn of theirs is stored.

use std::sync::Arc;

use agentry_memory::{InMemoryStore, MemoryConfig, PageRequest, SessionQuery, SessionStore};
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, FunctionTool, RunnerError, Runtime, Tool, ToolError};

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Add {
    a: i64,
    b: i64,
}

fn add(name: &str) -> Arc<dyn Tool> {
    FunctionTool::new(name, "Adds.", |args: Add, _| async move {
        Ok::<_, ToolError>((args.a + args.b).to_string())
    })
    .shared()
}

fn model() -> Arc<ScriptedModel> {
    Arc::new(ScriptedModel::new(vec![ScriptedResponse::tool_call(
        "add",
        &serde_json::json!({"a": 1, "b": 2}),
    )]))
}

#[tokio::test]
async fn a_misdefined_agent_is_refused_by_try_build_and_runs_nothing() {
    let cases: Vec<(agentry_runner::AgentBuilder, &str)> = vec![
        (
            Agent::builder("typo", model()).tool(add("add")).requires_approval("Add"),
            "requires_approval names \"Add\"",
        ),
        (Agent::builder("twice", model()).tool(add("add")).tool(add("add")), "two tools named \"add\""),
        (
            Agent::builder("clash", model()).tool(add("add")).client_tool(add("add").spec().clone()),
            "two tools named \"add\"",
        ),
        (Agent::builder(" ", model()), "its name is empty"),
        (
            Agent::builder("asking", model()).ask_user_question().requires_approval("ask_user_question"),
            "which the client answers",
        ),
        (
            Agent::builder("forgetful", model())
                .memory(MemoryConfig { summary_memory: true, ..MemoryConfig::default() }, None),
            "need a model",
        ),
    ];
    for (builder, problem) in cases {
        let error = builder.try_build().map(|agent| agent.name().to_owned()).unwrap_err();
        assert!(
            matches!(&error, RunnerError::InvalidAgent { problem: said, .. } if said.contains(problem)),
            "{error}"
        );
    }
    // Built anyway, it is registered, and its sessions and turns are refused: a misspelt
    // gate never lets the real tool run ungated.
    let store = Arc::new(InMemoryStore::new());
    let runtime = Runtime::new(store.clone());
    let agent = Agent::builder("typo", model()).tool(add("add")).requires_approval("Add").build();
    assert!(
        agent.problem().is_some_and(|problem| problem.contains("none of its tools (add)")),
        "{:?}",
        agent.problem()
    );
    runtime.register(agent);
    let error = runtime.create_session("typo", None).await.map(|session| session.id()).unwrap_err();
    assert!(matches!(error, RunnerError::InvalidAgent { ref agent, .. } if agent == "typo"), "{error}");
    let stored = store.list_sessions(&SessionQuery::default(), &PageRequest::first(10)).await.unwrap();
    assert!(stored.items.is_empty(), "nothing is stored");
    // A sound definition builds.
    let sound =
        Agent::builder("sound", model()).tool(add("add")).requires_approval("add").try_build().unwrap();
    assert_eq!(sound.problem(), None);
}
