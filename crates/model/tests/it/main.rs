//! Integration tests of `agentry-model`: the scripted model streams like a provider, and
//! (with the `openai` feature) the OpenAI-compatible provider against a loopback server.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "openai")]
mod openai;

use agentry_model::{Model, ModelError, ModelRequest, ScriptedModel, ScriptedResponse};
use agentry_types::{FinishReason, Message, ModelMessageDelta, Role, Usage};
use futures_util::StreamExt;
use serde_json::json;

async fn collect(model: &ScriptedModel, text: &str) -> Result<Vec<ModelMessageDelta>, ModelError> {
    let mut stream = model.stream(ModelRequest::new(vec![Message::user(text)])).await?;
    let mut deltas = Vec::new();
    while let Some(delta) = stream.next().await {
        deltas.push(delta?);
    }
    Ok(deltas)
}

#[tokio::test]
async fn a_text_response_streams_in_pieces_and_ends_with_stop_and_usage() {
    let model = ScriptedModel::new(vec![ScriptedResponse::text("Hello, world!").chunked(4)]);
    let deltas = collect(&model, "hi").await.unwrap();
    let pieces: Vec<&str> = deltas.iter().filter_map(|d| d.content.as_deref()).collect();
    assert_eq!(pieces, ["Hell", "o, w", "orld", "!"]);
    let last = deltas.last().unwrap();
    assert_eq!(last.finish_reason, Some(FinishReason::Stop));
    assert_eq!(last.usage, Some(Usage::new(1, 4)), "four characters a token, rounded up");
    assert!(deltas[..deltas.len() - 1].iter().all(|d| d.finish_reason.is_none()));
}

#[tokio::test]
async fn tool_calls_open_with_id_and_name_then_stream_their_arguments() {
    let model = ScriptedModel::new(vec![
        ScriptedResponse::tool_call("search", &json!({"query": "rust async"}))
            .with_tool_call("fetch", &json!({"url": "https://example.com"}))
            .with_reasoning("I should look it up")
            .chunked(6),
    ]);
    let deltas = collect(&model, "find it").await.unwrap();
    assert!(deltas[0].reasoning_content.is_some(), "reasoning streams first");
    let chunks: Vec<_> = deltas.iter().flat_map(|d| d.tool_calls.iter()).collect();
    let openers: Vec<_> = chunks.iter().filter(|c| c.id.is_some()).collect();
    assert_eq!(openers.len(), 2);
    assert_eq!(openers[0].id.as_deref(), Some("call_1_0"));
    assert_eq!(openers[0].function.as_ref().unwrap().name.as_deref(), Some("search"));
    assert_eq!(openers[1].index, 1);
    let arguments: String = chunks
        .iter()
        .filter(|c| c.index == 0)
        .filter_map(|c| c.function.as_ref().and_then(|f| f.arguments.as_deref()))
        .collect();
    assert_eq!(arguments, json!({"query": "rust async"}).to_string());
    assert_eq!(deltas.last().unwrap().finish_reason, Some(FinishReason::ToolCalls));
}

#[tokio::test]
async fn unique_call_ids_do_not_repeat_in_a_new_model_and_given_ids_stay() {
    let script = || {
        ScriptedModel::responder(|_| {
            ScriptedResponse::tool_call("search", &json!({})).with_tool_call("fetch", &json!({}))
        })
        .with_unique_call_ids()
    };
    let ids = |deltas: Vec<agentry_types::ModelMessageDelta>| -> Vec<String> {
        deltas.iter().flat_map(|d| d.tool_calls.iter()).filter_map(|c| c.id.clone()).collect()
    };
    // A restarted process: a new model answering the same script.
    let (first, again) = (script(), script());
    let mut seen = ids(collect(&first, "a").await.unwrap());
    seen.extend(ids(collect(&first, "b").await.unwrap()));
    seen.extend(ids(collect(&again, "a").await.unwrap()));
    assert_eq!(seen.len(), 6);
    assert!(seen.iter().all(|id| id.starts_with("call_") && id.len() == 37), "{seen:?}");
    let distinct: std::collections::BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), 6, "{seen:?}");
    let given =
        ScriptedModel::new(vec![ScriptedResponse::tool_call("search", &json!({}))]).with_unique_call_ids();
    let mut response = ScriptedResponse::tool_call("search", &json!({}));
    response.tool_calls[0].id = Some("mine".to_owned());
    let given_id = ScriptedModel::new(vec![response]).with_unique_call_ids();
    assert_ne!(ids(collect(&given, "a").await.unwrap()), ["call_1_0"]);
    assert_eq!(ids(collect(&given_id, "a").await.unwrap()), ["mine"]);
}

#[tokio::test]
async fn the_script_is_used_in_order_and_then_runs_out() {
    let model = ScriptedModel::new(vec![ScriptedResponse::text("one"), ScriptedResponse::text("two")]);
    let first = collect(&model, "a").await.unwrap();
    let second = collect(&model, "b").await.unwrap();
    assert_eq!(first[0].content.as_deref(), Some("one"));
    assert_eq!(second[0].content.as_deref(), Some("two"));
    assert_eq!(collect(&model, "c").await.unwrap_err(), ModelError::ScriptExhausted { used: 2 });
    assert_eq!(model.calls(), 3);
    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].messages[0].text(), "b");
}

#[tokio::test]
async fn a_model_without_its_request_log_answers_and_keeps_no_request() {
    let model = ScriptedModel::new(vec![ScriptedResponse::text("one")]).without_request_log();
    let conversation = std::sync::Arc::new(vec![Message::user("a").into()]);
    let mut stream = model.stream(ModelRequest::shared(conversation.clone())).await.unwrap();
    assert_eq!(stream.next().await.unwrap().unwrap().content.as_deref(), Some("one"));
    drop(stream);
    assert_eq!(model.calls(), 1);
    assert!(model.requests().is_empty());
    // Nothing holds the conversation any more: the caller can add to it without a copy.
    assert_eq!(std::sync::Arc::strong_count(&conversation), 1);
}

#[tokio::test]
async fn a_responder_answers_from_the_request() {
    let model = ScriptedModel::responder(|request| {
        ScriptedResponse::text(format!("Echo: {}", request.last_user_text().unwrap_or_default()))
    })
    .named("echo");
    assert_eq!(model.info().id, "echo");
    assert_eq!(model.info().provider, "scripted");
    let deltas = collect(&model, "ping").await.unwrap();
    let text: String = deltas.iter().filter_map(|d| d.content.as_deref()).collect();
    assert_eq!(text, "Echo: ping");
}

#[tokio::test]
async fn failures_before_and_during_the_stream_are_typed_errors() {
    let model = ScriptedModel::new(vec![
        ScriptedResponse::failing(ModelError::Http { status: 503, message: "overloaded".into() }),
        ScriptedResponse {
            fail_after: Some((2, ModelError::Disconnected)),
            ..ScriptedResponse::text("abcdefghijklmnopqrstuvwxyz").chunked(3)
        },
    ]);
    assert_eq!(
        collect(&model, "x").await.unwrap_err(),
        ModelError::Http { status: 503, message: "overloaded".into() }
    );
    let mut stream = model.stream(ModelRequest::new(vec![Message::user("y")])).await.unwrap();
    assert!(stream.next().await.unwrap().is_ok());
    assert!(stream.next().await.unwrap().is_ok());
    assert_eq!(stream.next().await.unwrap().unwrap_err(), ModelError::Disconnected);
    assert!(stream.next().await.is_none());
}

#[tokio::test]
async fn a_request_without_messages_is_refused() {
    let model = ScriptedModel::new(vec![ScriptedResponse::text("unused")]);
    let error = model.stream(ModelRequest::new(Vec::<Message>::new())).await.err().unwrap();
    assert!(matches!(error, ModelError::InvalidRequest(_)));
    assert_eq!(model.calls(), 0, "a refused request does not consume the script");
}

#[tokio::test(start_paused = true)]
async fn a_delayed_response_waits_between_deltas() {
    let model = ScriptedModel::new(vec![
        ScriptedResponse::text("slow answer").chunked(2).delayed(std::time::Duration::from_secs(1)),
    ]);
    let started = tokio::time::Instant::now();
    let mut stream = model.stream(ModelRequest::new(vec![Message::new(Role::User, "go")])).await.unwrap();
    assert_eq!(stream.next().await.unwrap().unwrap().content.as_deref(), Some("sl"));
    assert_eq!(stream.next().await.unwrap().unwrap().content.as_deref(), Some("ow"));
    assert_eq!(started.elapsed(), std::time::Duration::from_secs(2));
}
