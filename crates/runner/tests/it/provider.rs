//! The runner over the OpenAI-compatible provider against a loopback HTTP server:
//! cancelling a turn while the model streams closes the provider's request.

use std::sync::Arc;
use std::time::Duration;

use agentry_memory::InMemoryStore;
use agentry_model::{OpenAiCompatibleModel, OpenAiConfig};
use agentry_runner::{Agent, Runtime, TurnRequest};
use agentry_types::{CancellationReason, Role, TurnState};
use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

fn chunk(text: &str) -> String {
    let body = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]
    });
    format!("data: {body}\n\n")
}

/// Serves one streaming completion that sends two chunks and then holds the connection
/// open; reports each request body, and reports when the client closed the connection.
async fn hanging_server() -> (String, mpsc::UnboundedReceiver<String>, oneshot::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (requests, requests_rx) = mpsc::unbounded_channel();
    let (closed, closed_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        // Read the request head and its body (Content-Length).
        loop {
            let read = socket.read(&mut buffer).await.unwrap();
            received.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&received).to_string();
            if let Some(head_end) = text.find("\r\n\r\n") {
                let length = text[..head_end]
                    .lines()
                    .find_map(|line| {
                        line.to_ascii_lowercase().strip_prefix("content-length:").map(str::to_owned)
                    })
                    .map_or(0, |value| value.trim().parse::<usize>().unwrap());
                if received.len() >= head_end + 4 + length {
                    requests.send(text[head_end + 4..].to_owned()).unwrap();
                    break;
                }
            }
        }
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\r\n";
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(chunk("Thinking ").as_bytes()).await.unwrap();
        socket.write_all(chunk("hard").as_bytes()).await.unwrap();
        // Hold the stream open until the client goes away: a read of 0 bytes (or a reset).
        loop {
            match socket.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = closed.send(());
    });
    (format!("http://{address}/v1"), requests_rx, closed_rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_turn_while_the_provider_streams_closes_its_http_request() {
    let (base_url, mut requests, closed) = hanging_server().await;
    let mut config = OpenAiConfig::new("m");
    config.base_url = base_url;
    config.api_key = Some("sk-test".to_owned());
    let model = Arc::new(OpenAiCompatibleModel::new(config).unwrap());
    let runtime = Runtime::new(Arc::new(InMemoryStore::new()));
    runtime.register(Agent::builder("remote", model).build());
    let session = runtime.create_session("remote", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("Think")).await.unwrap();

    let body: serde_json::Value = serde_json::from_str(&requests.recv().await.unwrap()).unwrap();
    assert_eq!(body["stream"], true);
    assert_eq!(body["messages"][0]["content"], "Think");

    // Wait until both deltas arrived: the model is mid-stream.
    let mut events = turn.stream(None);
    let mut deltas = 0;
    while let Some(event) = events.next().await {
        if event.unwrap().payload.kind() == "model.message.delta" {
            deltas += 1;
            if deltas == 2 {
                break;
            }
        }
    }
    turn.cancel().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), closed).await.expect("the request was closed").unwrap();
    let state = turn.state().await.unwrap();
    assert!(matches!(state, TurnState::Cancelled { reason: CancellationReason::ClientCancelled, .. }));

    // The partial answer is kept in the history the next turn sees.
    let stored = turn.events(agentry_memory::Order::Asc).await.unwrap();
    let partial = stored.iter().find_map(|event| match &event.payload {
        agentry_events::EventPayload::ModelMessage(message) => message.content.clone(),
        _ => None,
    });
    assert_eq!(partial.as_deref(), Some("Thinking hard"));
    let history =
        runtime.store().history(session.id(), &agentry_memory::HistoryQuery::default()).await.unwrap();
    let roles: Vec<Role> = history.iter().map(|message| message.message.role).collect();
    assert_eq!(roles, [Role::User, Role::Assistant]);
}
