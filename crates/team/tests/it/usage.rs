//! Budgets over a provider that reports no usage: a member on the OpenAI-compatible
//! provider, against a loopback server whose streams carry no usage chunk (as servers that
//! ignore `stream_options.include_usage` send them), is charged an estimate for every
//! call, also for one cut off mid-stream, instead of nothing.

use std::sync::Arc;

use agentry_events::{EventEnvelope, EventPayload};
use agentry_memory::InMemoryStore;
use agentry_model::{OpenAiCompatibleModel, OpenAiConfig, ScriptedModel, ScriptedResponse};
use agentry_runner::{Agent, Runtime, TurnRequest};
use agentry_team::Team;
use agentry_types::{BudgetLimit, Message, ModelMessage, ThreadId, Usage};
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The task the coordinator gives the member.
const TASK: &str = "Summarise the quarterly report in two sentences.";

fn chunk(delta: &serde_json::Value, finish: Option<&str>) -> String {
    let body = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    });
    format!("data: {body}\n\n")
}

/// Reads one request's head and body (by `Content-Length`).
async fn read_request(socket: &mut TcpStream) {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = socket.read(&mut buffer).await.unwrap();
        assert!(read > 0, "the client closed before sending its request");
        received.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&received).to_string();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_owned))
                .map_or(0, |value| value.trim().parse::<usize>().unwrap());
            if received.len() >= head_end + 4 + length {
                return;
            }
        }
    }
}

/// Serves one streaming completion per connection, none with usage: `pieces` of text, then
/// the finish reason and `[DONE]`, or, when `cut`, the connection closed after the text.
async fn usageless_server(pieces: &'static [&'static str], cut: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            read_request(&mut socket).await;
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            socket.write_all(head.as_bytes()).await.unwrap();
            for piece in pieces {
                socket.write_all(chunk(&json!({"content": piece}), None).as_bytes()).await.unwrap();
            }
            if !cut {
                socket.write_all(chunk(&json!({}), Some("stop")).as_bytes()).await.unwrap();
                socket.write_all(b"data: [DONE]\n\n").await.unwrap();
            }
            socket.shutdown().await.unwrap();
        }
    });
    format!("http://{address}/v1")
}

/// Runs a team whose one member is on the provider at `base_url`, with a mission budget,
/// and returns the tokens of each `agent_team.budget.usage` its member reported.
async fn member_usage(base_url: String) -> Vec<u64> {
    let mut config = OpenAiConfig::new("m");
    config.base_url = base_url;
    config.api_key = Some("sk-test".to_owned());
    let model = Arc::new(OpenAiCompatibleModel::new(config).unwrap());
    let member = Agent::builder("remote", model).build();
    let coordinator = Arc::new(ScriptedModel::responder(|request| {
        let answered = request.messages.iter().any(|message| message.tool_call_id.is_some());
        if answered {
            ScriptedResponse::text("Done.")
        } else {
            ScriptedResponse::tool_call(
                "delegate_task_to_member",
                &json!({"member_id": "remote", "task": TASK}),
            )
        }
    }));
    let team = Team::builder("frugal", coordinator)
        .member(member)
        .mission_budget(BudgetLimit { max_tokens: Some(100_000), ..BudgetLimit::default() })
        .build();
    let runtime = Runtime::new(Arc::new(InMemoryStore::new()));
    runtime.register(team);
    let session = runtime.create_session("frugal", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("Go.")).await.unwrap();
    let events: Vec<Arc<EventEnvelope>> = turn.stream(None).map(Result::unwrap).collect().await;
    events
        .iter()
        .filter_map(|event| match &event.payload {
            EventPayload::BudgetUsage { usage, .. } if event.thread_or_main() != ThreadId::main() => {
                Some(usage.tokens_used)
            }
            _ => None,
        })
        .collect()
}

/// Runs the member against a server streaming `pieces` (cut off before the end when
/// `cut`) and checks its one call was charged at least the estimate of its task and of the
/// text it received.
async fn charged_at_least_the_estimate(pieces: &'static [&'static str], cut: bool) {
    let usage = member_usage(usageless_server(pieces, cut).await).await;
    assert_eq!(usage.len(), 1, "one model call, settled once: {usage:?}");
    let output = ModelMessage { content: Some(pieces.concat()), ..ModelMessage::default() };
    let least = Usage::estimate(&[Message::user(TASK)], &output).total_tokens();
    assert!(usage[0] >= least, "charged {} tokens, at least {least} expected", usage[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_provider_reports_no_usage_is_charged_an_estimate() {
    charged_at_least_the_estimate(&["The report shows ", "growth in every region."], false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_mid_stream_is_charged_for_what_it_read_and_wrote() {
    charged_at_least_the_estimate(&["The report ", "shows"], true).await;
}
