//! The OpenAI-compatible provider against a loopback HTTP/1.1 server that records each
//! request and replays recorded streams from `tests/fixtures/`.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_model::{Model, ModelError, ModelRequest, OpenAiCompatibleModel, OpenAiConfig, ToolChoice};
use agentry_types::{
    ContentPart, DataUri, FilePart, FinishReason, ImageUrl, Message, MessageContent, ModelMessageDelta,
    ToolCall, ToolSpec, Usage,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// What the server answers one request with.
enum Reply {
    /// `200 OK` with an event stream, sent in chunked encoding `piece` bytes per chunk;
    /// `truncated` closes the connection without the closing chunk, as a crash would.
    Sse { body: Vec<u8>, piece: usize, truncated: bool },
    /// An error status with headers and a body.
    Status { status: u16, headers: Vec<(&'static str, String)>, body: String },
    /// No answer at all; the connection stays open until the client closes it.
    Silence,
    /// The connection closed after the request, before any response.
    Reset,
    /// `200 OK` with this content type and body, whole.
    Whole { content_type: &'static str, body: String },
    /// Part of an event stream, then waiting until the client closes the connection,
    /// which is reported with the number of bytes read meanwhile.
    SseUntilClosed { body: Vec<u8>, closed: oneshot::Sender<usize> },
}

impl Reply {
    fn sse(body: Vec<u8>) -> Self {
        Self::Sse { body, piece: 64, truncated: false }
    }

    fn status(status: u16, body: impl Into<String>) -> Self {
        Self::Status { status, headers: Vec::new(), body: body.into() }
    }
}

/// A request as the server received it.
#[derive(Debug, Clone)]
struct Recorded {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
    at: Instant,
}

impl Recorded {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }
}

struct TestServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl TestServer {
    /// A server answering its requests with `replies`, in order, one connection each.
    async fn start(replies: Vec<Reply>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let recorded = Arc::clone(&requests);
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else { return };
                let reply = replies.lock().unwrap().pop_front();
                tokio::spawn(serve(socket, reply, Arc::clone(&recorded)));
            }
        });
        Self { addr, requests }
    }

    fn config(&self) -> OpenAiConfig {
        OpenAiConfig::new("test-model")
            .with_base_url(format!("http://{}/v1/", self.addr))
            .with_backoff(Duration::from_millis(1), Duration::from_secs(5))
            .with_request_timeout(Duration::from_secs(10))
    }

    fn model(&self) -> OpenAiCompatibleModel {
        OpenAiCompatibleModel::new(self.config()).unwrap()
    }

    fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }
}

async fn serve(mut socket: TcpStream, reply: Option<Reply>, recorded: Arc<Mutex<Vec<Recorded>>>) {
    socket.set_nodelay(true).unwrap();
    let Some(request) = read_request(&mut socket).await else { return };
    recorded.lock().unwrap().push(request);
    let Some(reply) = reply else {
        let _ = write_status(&mut socket, 599, &[], "the test server has no reply left").await;
        return;
    };
    match reply {
        Reply::Sse { body, piece, truncated } => {
            let _ = write_sse(&mut socket, &body, piece, truncated).await;
        }
        Reply::Status { status, headers, body } => {
            let _ = write_status(&mut socket, status, &headers, &body).await;
        }
        Reply::Silence => {
            let _ = read_until_closed(&mut socket).await;
        }
        Reply::Reset => drop(socket),
        Reply::Whole { content_type, body } => {
            let _ = write_status(&mut socket, 200, &[("content-type", content_type.to_owned())], &body).await;
        }
        Reply::SseUntilClosed { body, closed } => {
            socket.write_all(SSE_HEAD.as_bytes()).await.unwrap();
            write_chunk(&mut socket, &body).await.unwrap();
            let read = read_until_closed(&mut socket).await;
            let _ = closed.send(read);
        }
    }
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n\
                        transfer-encoding: chunked\r\nconnection: close\r\ncache-control: no-cache\r\n\r\n";

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") {
            break end;
        }
        let mut chunk = [0_u8; 4096];
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let at = Instant::now();
    let head = String::from_utf8(buffer[..head_end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let mut request_line = lines.next().unwrap().split(' ');
    let method = request_line.next().unwrap().to_owned();
    let path = request_line.next().unwrap().to_owned();
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    let length: usize =
        headers.iter().find(|(name, _)| name == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let mut chunk = [0_u8; 4096];
        let read = socket.read(&mut chunk).await.ok()?;
        if read == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..read]);
    }
    let body = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap() };
    Some(Recorded { method, path, headers, body, at })
}

async fn write_chunk(socket: &mut TcpStream, piece: &[u8]) -> std::io::Result<()> {
    socket.write_all(format!("{:x}\r\n", piece.len()).as_bytes()).await?;
    socket.write_all(piece).await?;
    socket.write_all(b"\r\n").await?;
    socket.flush().await
}

async fn write_sse(
    socket: &mut TcpStream,
    body: &[u8],
    piece: usize,
    truncated: bool,
) -> std::io::Result<()> {
    socket.write_all(SSE_HEAD.as_bytes()).await?;
    for chunk in body.chunks(piece) {
        write_chunk(socket, chunk).await?;
    }
    if !truncated {
        socket.write_all(b"0\r\n\r\n").await?;
    }
    socket.shutdown().await
}

async fn write_status(
    socket: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &str,
) -> std::io::Result<()> {
    let mut head =
        format!("HTTP/1.1 {status} Test\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    socket.write_all(head.as_bytes()).await?;
    socket.write_all(body.as_bytes()).await?;
    socket.shutdown().await
}

/// Reads until the peer closes the connection (or it fails); returns the bytes read.
async fn read_until_closed(socket: &mut TcpStream) -> usize {
    let mut total = 0;
    let mut chunk = [0_u8; 1024];
    loop {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return total,
            Ok(read) => total += read,
        }
    }
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn hello() -> ModelRequest {
    ModelRequest::new(vec![Message::user("Hello")])
}

/// Every delta of a response, and the error that ended it, if any.
async fn run(
    model: &OpenAiCompatibleModel,
    request: ModelRequest,
) -> (Vec<ModelMessageDelta>, Option<ModelError>) {
    let mut stream = match model.stream(request).await {
        Ok(stream) => stream,
        Err(error) => return (Vec::new(), Some(error)),
    };
    let mut deltas = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(delta) => deltas.push(delta),
            Err(error) => {
                assert!(stream.next().await.is_none(), "an error ends the stream");
                return (deltas, Some(error));
            }
        }
    }
    (deltas, None)
}

/// A response assembled from its deltas.
#[derive(Debug, Default, PartialEq)]
struct Merged {
    content: String,
    reasoning: String,
    refusal: String,
    /// Per index: id, name, arguments.
    calls: BTreeMap<u32, (String, String, String)>,
    finish_reason: Option<FinishReason>,
    usage: Option<Usage>,
}

fn merge(deltas: &[ModelMessageDelta]) -> Merged {
    let mut merged = Merged::default();
    for delta in deltas {
        assert!(!delta.is_empty(), "empty deltas are skipped");
        assert!(merged.finish_reason.is_none(), "the delta with the finish reason is the last one");
        merged.content.push_str(delta.content.as_deref().unwrap_or_default());
        merged.reasoning.push_str(delta.reasoning_content.as_deref().unwrap_or_default());
        merged.refusal.push_str(delta.refusal.as_deref().unwrap_or_default());
        for chunk in &delta.tool_calls {
            let call = merged.calls.entry(chunk.index).or_default();
            if let Some(id) = &chunk.id {
                call.0.push_str(id);
            }
            if let Some(function) = &chunk.function {
                call.1.push_str(function.name.as_deref().unwrap_or_default());
                call.2.push_str(function.arguments.as_deref().unwrap_or_default());
            }
        }
        merged.finish_reason.clone_from(&delta.finish_reason);
        if delta.usage.is_some() {
            merged.usage = delta.usage;
        }
    }
    merged
}

fn usage(input: u64, output: u64, cached: Option<u64>, reasoning: Option<u64>) -> Usage {
    Usage { cache_read_tokens: cached, reasoning_tokens: reasoning, ..Usage::new(input, output) }
}

#[tokio::test]
async fn openai_text_streams_its_pieces_and_folds_the_trailing_usage_into_the_finishing_delta() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai_text.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let pieces: Vec<_> = deltas.iter().map(|delta| delta.content.as_deref()).collect();
    assert_eq!(pieces, [Some("Hello"), Some("!"), Some(" How can I help you today?"), None]);
    let last = deltas.last().unwrap();
    assert_eq!(last.finish_reason, Some(FinishReason::Stop));
    assert_eq!(last.usage, Some(usage(19, 10, Some(0), Some(0))));
    assert_eq!(deltas.iter().filter(|delta| delta.usage.is_some()).count(), 1);
}

#[tokio::test]
async fn parallel_tool_calls_split_across_chunks_merge_into_complete_calls() {
    let server = TestServer::start(vec![Reply::sse(fixture("openai_parallel_tool_calls.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    let calls: Vec<_> = merged.calls.into_iter().collect();
    assert_eq!(
        calls,
        [
            (0, ("call_weather_paris".into(), "get_weather".into(), r#"{"city": "Paris"}"#.into())),
            (1, ("call_weather_tokyo".into(), "get_weather".into(), r#"{"city": "Tokyo"}"#.into())),
            (2, ("call_time_tokyo".into(), "get_time".into(), r#"{"timezone": "Asia/Tokyo"}"#.into())),
        ]
    );
    assert_eq!(merged.content, "", "a null content is no content");
    assert_eq!(merged.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(merged.usage, Some(usage(88, 64, Some(64), Some(0))));
    let opener = &deltas[0].tool_calls[0];
    assert_eq!(opener.kind, Some(agentry_types::ToolCallKind::Function));
    assert_eq!(opener.function.as_ref().unwrap().arguments, None, "empty argument pieces are dropped");
}

#[tokio::test]
async fn vllm_reasoning_content_streams_as_reasoning_before_the_text() {
    let server = TestServer::start(vec![Reply::sse(fixture("vllm_reasoning.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(deltas[0].reasoning_content.as_deref(), Some("The user"));
    let merged = merge(&deltas);
    assert_eq!(merged.reasoning, "The user asks for 6 × 7.");
    assert_eq!(merged.content, "6 × 7 = 42");
    assert_eq!(merged.finish_reason, Some(FinishReason::Stop));
    assert_eq!(merged.usage, Some(usage(14, 25, None, None)), "null details are absent details");
}

#[tokio::test]
async fn ollama_reasoning_and_its_usage_shape_are_read() {
    let server = TestServer::start(vec![Reply::sse(fixture("ollama_reasoning.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!(merged.reasoning, "Okay, a greeting.");
    assert_eq!(merged.content, "Hi there!");
    assert_eq!(merged.finish_reason, Some(FinishReason::Stop));
    assert_eq!(merged.usage, Some(Usage::new(11, 42)));
}

#[tokio::test]
async fn a_stream_split_at_every_byte_gives_the_same_deltas_as_one_sent_whole() {
    let body = fixture("openrouter_awkward.sse");
    let server = TestServer::start(vec![
        Reply::Sse { body: body.clone(), piece: 1, truncated: false },
        Reply::Sse { body: body.clone(), piece: body.len(), truncated: false },
    ])
    .await;
    let model = server.model();
    let (byte_by_byte, error) = run(&model, hello()).await;
    assert_eq!(error, None);
    let (whole, error) = run(&model, hello()).await;
    assert_eq!(error, None);
    assert_eq!(byte_by_byte, whole);
    let merged = merge(&byte_by_byte);
    assert_eq!(merged.reasoning, "Grüße auf Japanisch: ");
    assert_eq!(
        merged.content, "こんにちは 🌍, café ☕",
        "multi-line data is joined, split characters rejoined"
    );
    assert_eq!(merged.finish_reason, Some(FinishReason::Other("end_turn".into())));
    assert_eq!(merged.usage, Some(usage(7, 12, Some(2), Some(5))));
    let last = byte_by_byte.last().unwrap();
    assert_eq!(last.content.as_deref(), Some(", café ☕"), "text with the finish reason stays on its delta");
    assert!(last.usage.is_some(), "the later usage chunk is folded into the finishing delta");
}

#[tokio::test]
async fn crlf_line_endings_are_read_like_lf() {
    let body = fixture("crlf.sse");
    assert!(body.windows(4).any(|window| window == b"\r\n\r\n"), "the fixture keeps its CRLF endings");
    let server = TestServer::start(vec![Reply::Sse { body, piece: 7, truncated: false }]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!(merged.content, "Let me check.");
    assert_eq!(merged.calls[&0], ("call_lookup".into(), "lookup".into(), r#"{"term":"crlf"}"#.into()));
    assert_eq!(merged.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(merged.usage, Some(Usage::new(31, 17)), "usage on the finishing chunk itself is kept");
}

#[tokio::test]
async fn nulls_unknown_fields_odd_shapes_and_role_only_chunks_are_tolerated() {
    let body = concat!(
        "data: {\"choices\":null,\"usage\":null,\"error\":null}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":null}],\"x_extension\":{\"nested\":[1,2]}}\n\n",
        "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"second choice, ignored\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":[{\"type\":\"text\",\"text\":\"parts \"}],\"refusal\":\"no\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"\",\"function\":{\"arguments\":null}}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":null},\"finish_reason\":\"eos_token\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":null,\"prompt_cache_hit_tokens\":1}}\n\n",
        "data: [DONE]\n\n",
    );
    let server = TestServer::start(vec![Reply::sse(body.as_bytes().to_vec())]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(deltas.len(), 3, "{deltas:?}");
    let merged = merge(&deltas);
    assert_eq!(merged.content, "parts ");
    assert_eq!(merged.refusal, "no");
    assert_eq!(merged.calls[&0], ("c1".into(), "f".into(), r#"{"a":1}"#.into()));
    assert_eq!(merged.finish_reason, Some(FinishReason::Other("eos_token".into())));
    assert_eq!(merged.usage, Some(usage(3, 0, Some(1), None)));
}

#[tokio::test]
async fn the_request_carries_stream_options_tools_tool_choice_and_the_whole_conversation() {
    let server = TestServer::start(vec![
        Reply::sse(fixture("openai_text.sse")),
        Reply::sse(fixture("openai_text.sse")),
    ])
    .await;
    let config = server.config().with_api_key("sk-test-123").with_header("OpenAI-Organization", "org-42");
    let model = OpenAiCompatibleModel::new(config).unwrap();
    let pdf = DataUri::encode("application/pdf", b"%PDF-1.4").unwrap();
    let png = DataUri::encode("image/png", b"\x89PNG").unwrap();
    let mut assistant = Message::from_model(&agentry_types::ModelMessage {
        tool_calls: vec![ToolCall::function("call_1", "get_weather", r#"{"city":"Paris"}"#)],
        reasoning_content: Some("not sent back".into()),
        ..Default::default()
    });
    assistant.content = None;
    let request = ModelRequest {
        messages: vec![
            Message::system("Be brief."),
            Message::user(MessageContent::Parts(vec![
                ContentPart::Text { text: "What is in these?".into() },
                ContentPart::Image {
                    image_url: ImageUrl {
                        url: "https://example.com/a.jpg".into(),
                        detail: Some("low".into()),
                    },
                },
                ContentPart::File(FilePart { name: "report.pdf".into(), data: pdf.clone() }),
                ContentPart::File(FilePart { name: "chart.png".into(), data: png.clone() }),
            ])),
            assistant,
            Message::tool("call_1", "18°C and sunny"),
            Message::assistant("It is sunny."),
        ]
        .into_iter()
        .map(Into::into)
        .collect::<Vec<_>>()
        .into(),
        tools: vec![ToolSpec {
            name: "get_weather".into(),
            description: Some("Current weather".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        }]
        .into(),
        tool_choice: Some(ToolChoice::Function("get_weather".into())),
        parallel_tool_calls: Some(false),
        temperature: Some(0.5),
        max_tokens: Some(256),
        stop: vec!["END".into()],
    };
    let (_, error) = run(&model, request).await;
    assert_eq!(error, None);
    let recorded = &server.requests()[0];
    assert_eq!(recorded.method, "POST");
    assert_eq!(recorded.path, "/v1/chat/completions");
    assert_eq!(recorded.header("authorization"), Some("Bearer sk-test-123"));
    assert_eq!(recorded.header("openai-organization"), Some("org-42"));
    assert_eq!(recorded.header("content-type"), Some("application/json"));
    assert_eq!(recorded.header("accept"), Some("text/event-stream"));
    assert_eq!(
        recorded.body,
        json!({
            "model": "test-model",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [
                    {"type": "text", "text": "What is in these?"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg", "detail": "low"}},
                    {"type": "file", "file": {"filename": "report.pdf", "file_data": pdf.as_str()}},
                    {"type": "image_url", "image_url": {"url": png.as_str()}},
                ]},
                {"role": "assistant", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18°C and sunny"},
                {"role": "assistant", "content": "It is sunny."},
            ],
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            }}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false,
            "temperature": 0.5,
            "max_tokens": 256,
            "stop": ["END"],
        })
    );

    // Absent options are omitted, and tool options mean nothing without tools.
    let keyless = server.model();
    let request = ModelRequest { tool_choice: Some(ToolChoice::Required), ..hello() };
    let (_, error) = run(&keyless, request).await;
    assert_eq!(error, None);
    let recorded = &server.requests()[1];
    assert_eq!(recorded.header("authorization"), None);
    assert_eq!(
        recorded.body,
        json!({
            "model": "test-model",
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "Hello"}],
        })
    );
}

#[tokio::test]
async fn a_malformed_chunk_mid_stream_ends_the_stream_with_an_excerpt() {
    let server = TestServer::start(vec![Reply::sse(fixture("malformed_mid_stream.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(merge(&deltas).content, "First second");
    let Some(ModelError::MalformedChunk(message)) = error else {
        panic!("expected a malformed chunk, got {error:?}")
    };
    assert!(message.contains("\\\"content\\\":\\\"broken"), "{message}");
    assert_eq!(server.requests().len(), 1, "a broken stream is not retried");
}

#[tokio::test]
async fn a_disconnect_mid_stream_without_a_finish_reason_is_disconnected() {
    let body = fixture("disconnect_mid_stream.sse");
    let server = TestServer::start(vec![
        Reply::Sse { body: body.clone(), piece: 64, truncated: true },
        Reply::Sse { body, piece: 64, truncated: false },
    ])
    .await;
    let model = server.model();
    for ending in ["a broken connection", "a clean end without [DONE]"] {
        let (deltas, error) = run(&model, hello()).await;
        assert_eq!(merge(&deltas).content, "Once upon a time", "{ending}");
        assert_eq!(error, Some(ModelError::Disconnected), "{ending}");
    }
}

#[tokio::test]
async fn a_stream_that_ends_after_its_finish_reason_without_done_is_complete() {
    let text = String::from_utf8(fixture("ollama_reasoning.sse")).unwrap().replace("data: [DONE]\n\n", "");
    let server =
        TestServer::start(vec![Reply::Sse { body: text.into_bytes(), piece: 64, truncated: true }]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!(merged.finish_reason, Some(FinishReason::Stop));
    assert_eq!(merged.usage, Some(Usage::new(11, 42)));
}

#[tokio::test]
async fn an_error_object_mid_stream_becomes_an_http_error_with_its_code() {
    let server = TestServer::start(vec![Reply::sse(fixture("error_chunk_mid_stream.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(merge(&deltas).content, "Partial answer");
    assert_eq!(
        error,
        Some(ModelError::Http {
            status: 502,
            message: "Provider returned error: upstream connection reset".into()
        })
    );
}

#[tokio::test]
async fn an_error_after_the_first_token_is_not_retried() {
    let server = TestServer::start(vec![
        Reply::Sse { body: fixture("disconnect_mid_stream.sse"), piece: 64, truncated: true },
        Reply::sse(fixture("openai_text.sse")),
    ])
    .await;
    let model = OpenAiCompatibleModel::new(server.config().with_max_retries(3)).unwrap();
    let (deltas, error) = run(&model, hello()).await;
    assert!(!deltas.is_empty());
    assert_eq!(error, Some(ModelError::Disconnected));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_non_json_500_body_becomes_an_http_error_with_its_trimmed_text_after_the_retries() {
    let page = format!("\n  Internal   Server Error\n{}\n", "x".repeat(500));
    let server = TestServer::start(vec![Reply::status(500, page.clone()), Reply::status(500, page)]).await;
    let model = OpenAiCompatibleModel::new(server.config().with_max_retries(1)).unwrap();
    let (_, error) = run(&model, hello()).await;
    let Some(ModelError::Http { status, message }) = error else {
        panic!("expected an HTTP error, got {error:?}")
    };
    assert_eq!(status, 500);
    assert!(message.starts_with("Internal Server Error x"), "{message}");
    assert!(message.ends_with('…') && message.chars().count() == 201, "{message}");
    assert_eq!(server.requests().len(), 2, "one retry");
}

#[tokio::test]
async fn a_client_error_is_reported_with_its_json_message_and_not_retried() {
    let body = json!({"error": {"message": "Invalid 'messages[0].role'", "type": "invalid_request_error"}});
    let server = TestServer::start(vec![Reply::status(400, body.to_string())]).await;
    let (_, error) = run(&server.model(), hello()).await;
    assert_eq!(error, Some(ModelError::Http { status: 400, message: "Invalid 'messages[0].role'".into() }));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_429_is_retried_after_the_wait_the_server_asked_for() {
    let limited = Reply::Status {
        status: 429,
        headers: vec![("retry-after", "1".into())],
        body: json!({"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}).to_string(),
    };
    let server = TestServer::start(vec![limited, Reply::sse(fixture("openai_text.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).finish_reason, Some(FinishReason::Stop));
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].at - requests[0].at;
    assert!(waited >= Duration::from_secs(1), "waited {waited:?}, not the second asked for");
}

#[tokio::test]
async fn a_long_retry_after_is_capped_by_the_maximum_backoff() {
    let limited =
        Reply::Status { status: 429, headers: vec![("retry-after", "3600".into())], body: String::new() };
    let server = TestServer::start(vec![limited, Reply::sse(fixture("openai_text.sse"))]).await;
    let config = server.config().with_backoff(Duration::from_millis(1), Duration::from_millis(50));
    let started = Instant::now();
    let (_, error) = run(&OpenAiCompatibleModel::new(config).unwrap(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(server.requests().len(), 2);
    assert!(started.elapsed() < Duration::from_secs(30), "the hour asked for was not waited");
}

#[tokio::test]
async fn a_429_left_after_the_retries_is_rate_limited_with_the_wait_asked_for() {
    let limited = || Reply::Status {
        status: 429,
        headers: vec![("retry-after-ms", "20".into())],
        body: json!({"error": {"message": "slow down"}}).to_string(),
    };
    let server = TestServer::start(vec![limited(), limited()]).await;
    let model = OpenAiCompatibleModel::new(server.config().with_max_retries(1)).unwrap();
    let (_, error) = run(&model, hello()).await;
    let error = error.unwrap();
    assert_eq!(
        error,
        ModelError::RateLimited {
            retry_after: Some(Duration::from_millis(20)),
            message: "slow down".to_owned()
        }
    );
    assert_eq!(
        error.to_string(),
        "model provider is rate limiting requests: slow down",
        "the provider's words reach the client"
    );
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_html_error_page_of_a_gateway_is_told_as_such_without_its_markup() {
    let page = "<html>\r\n<head><title>502 Bad Gateway</title><style>body{color:red}</style></head>\r\n\
                <body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>";
    let server = TestServer::start(vec![Reply::status(400, page.to_owned())]).await;
    let (_, error) = run(&server.model(), hello()).await;
    let message = error.unwrap().to_string();
    assert!(!message.contains('<') && !message.contains("color:red"), "{message}");
    assert!(message.contains("\"502 Bad Gateway 502 Bad Gateway nginx\""), "{message}");
    assert!(message.contains("a proxy or gateway answered"), "{message}");
}

#[tokio::test]
async fn an_exhausted_quota_is_not_retried() {
    let body = json!({"error": {"message": "You exceeded your current quota", "type": "insufficient_quota"}});
    let server = TestServer::start(vec![Reply::status(429, body.to_string())]).await;
    let (_, error) = run(&server.model(), hello()).await;
    assert_eq!(
        error,
        Some(ModelError::Http { status: 429, message: "You exceeded your current quota".into() })
    );
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn two_503s_are_retried_and_the_third_attempt_streams() {
    let unavailable = || Reply::status(503, json!({"error": {"message": "overloaded"}}).to_string());
    let server =
        TestServer::start(vec![unavailable(), unavailable(), Reply::sse(fixture("openai_text.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).content, "Hello! How can I help you today?");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn an_unanswered_request_times_out_without_retrying() {
    let server = TestServer::start(vec![Reply::Silence, Reply::sse(fixture("openai_text.sse"))]).await;
    let timeout = Duration::from_millis(300);
    let model = OpenAiCompatibleModel::new(server.config().with_request_timeout(timeout)).unwrap();
    let started = Instant::now();
    let (_, error) = run(&model, hello()).await;
    assert_eq!(error, Some(ModelError::Timeout(timeout)));
    assert!(started.elapsed() >= timeout);
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn a_refused_connection_is_retried_and_reported_as_a_transport_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let config = OpenAiConfig::new("m")
        .with_base_url(format!("http://{addr}/v1"))
        .with_backoff(Duration::from_millis(1), Duration::from_millis(5))
        .with_max_retries(2);
    let (_, error) = run(&OpenAiCompatibleModel::new(config).unwrap(), hello()).await;
    assert!(matches!(error, Some(ModelError::Transport(_))), "{error:?}");
}

#[tokio::test]
async fn dropping_the_stream_closes_the_connection() {
    let (closed_tx, closed_rx) = oneshot::channel();
    let partial = fixture("disconnect_mid_stream.sse");
    let server = TestServer::start(vec![Reply::SseUntilClosed { body: partial, closed: closed_tx }]).await;
    let mut stream = server.model().stream(hello()).await.unwrap();
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.content.as_deref(), Some("Once upon"));
    drop(stream);
    let read_after_drop = tokio::time::timeout(Duration::from_secs(10), closed_rx)
        .await
        .expect("the server saw the connection close")
        .unwrap();
    assert_eq!(read_after_drop, 0, "nothing more was sent");
}

#[tokio::test]
async fn a_stream_that_sends_nothing_for_the_idle_timeout_stalls_and_its_connection_is_closed() {
    let (closed_tx, closed_rx) = oneshot::channel();
    let partial = fixture("disconnect_mid_stream.sse");
    let server = TestServer::start(vec![Reply::SseUntilClosed { body: partial, closed: closed_tx }]).await;
    let idle = Duration::from_millis(200);
    let model = OpenAiCompatibleModel::new(server.config().with_stream_idle_timeout(idle)).unwrap();
    let mut stream = model.stream(hello()).await.unwrap();
    let mut text = String::new();
    let error = loop {
        match stream.next().await.expect("the stream ends with an error, not silently") {
            Ok(delta) => text.push_str(delta.content.as_deref().unwrap_or_default()),
            Err(error) => break error,
        }
    };
    assert_eq!(text, "Once upon a time");
    assert_eq!(error, ModelError::Stalled(idle));
    assert_eq!(
        error.to_string(),
        "the model provider sent nothing for 200ms while it was sending its response"
    );
    // The stream is still held: the stall itself closed the connection.
    let read_after_stall = tokio::time::timeout(Duration::from_secs(10), closed_rx)
        .await
        .expect("the server saw the connection close")
        .unwrap();
    assert_eq!(read_after_stall, 0, "nothing more was sent");
    assert!(stream.next().await.is_none(), "an error ends the stream");
}

#[test]
fn the_config_debug_output_hides_the_key_and_header_values_and_info_names_the_provider() {
    let config =
        OpenAiConfig::new("gpt-4o-mini").with_api_key("sk-secret-value").with_header("api-key", "hidden-too");
    let model = OpenAiCompatibleModel::new(config.clone()).unwrap();
    for debug in [format!("{config:?}"), format!("{model:?}")] {
        assert!(!debug.contains("sk-secret-value") && !debug.contains("hidden-too"), "{debug}");
        assert!(debug.contains("[redacted]") && debug.contains("api-key"), "{debug}");
    }
    let info = model.info();
    assert_eq!((info.id.as_str(), info.provider.as_str()), ("gpt-4o-mini", "openai-compatible"));
    assert_eq!(config.base_url, "https://api.openai.com/v1");
    assert_eq!((config.max_retries, config.initial_backoff), (3, Duration::from_millis(200)));
}

#[test]
fn invalid_configurations_are_refused() {
    let refused = |config: OpenAiConfig| {
        matches!(OpenAiCompatibleModel::new(config), Err(ModelError::InvalidRequest(_)))
    };
    assert!(refused(OpenAiConfig::new(" ")));
    assert!(refused(OpenAiConfig::new("m").with_base_url("ftp://example.com")));
    assert!(refused(OpenAiConfig::new("m").with_base_url("not a url")));
    assert!(refused(OpenAiConfig::new("m").with_header("bad header", "v")));
    assert!(refused(OpenAiConfig::new("m").with_api_key("line\nbreak")));
    assert!(!refused(OpenAiConfig::new("m").with_base_url("http://localhost:11434/v1/")));
}

#[tokio::test]
async fn a_request_without_messages_is_refused_before_sending() {
    let server = TestServer::start(Vec::new()).await;
    let (_, error) = run(&server.model(), ModelRequest::new(Vec::<Message>::new())).await;
    assert!(matches!(error, Some(ModelError::InvalidRequest(_))));
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn a_server_that_keeps_the_connection_open_after_the_usage_does_not_hold_the_stream_open() {
    let (closed_tx, closed_rx) = oneshot::channel();
    let body = String::from_utf8(fixture("openai_text.sse")).unwrap().replace("data: [DONE]\n\n", "");
    let server =
        TestServer::start(vec![Reply::SseUntilClosed { body: body.into_bytes(), closed: closed_tx }]).await;
    let (deltas, error) = tokio::time::timeout(Duration::from_secs(10), run(&server.model(), hello()))
        .await
        .expect("the stream ended");
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).usage, Some(usage(19, 10, Some(0), Some(0))));
    tokio::time::timeout(Duration::from_secs(10), closed_rx)
        .await
        .expect("the connection was closed")
        .unwrap();
}

/// An event stream of these chunks (each a JSON value), then `[DONE]` when `done`.
fn stream_of(chunks: &[Value], done: bool) -> Vec<u8> {
    let mut body: String = chunks.iter().map(|chunk| format!("data: {chunk}\n\n")).collect();
    if done {
        body.push_str("data: [DONE]\n\n");
    }
    body.into_bytes()
}

fn call_chunk(index: Option<i64>, id: Option<&str>, name: Option<&str>, arguments: Option<&str>) -> Value {
    let mut call = json!({"type": "function", "function": {}});
    if let Some(index) = index {
        call["index"] = json!(index);
    }
    if let Some(id) = id {
        call["id"] = json!(id);
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    if let Some(arguments) = arguments {
        call["function"]["arguments"] = json!(arguments);
    }
    json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
}

fn finish(reason: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})
}

/// The calls of a response: per dense index, id, name and arguments.
async fn calls_of(chunks: &[Value]) -> Vec<(u32, (String, String, String))> {
    let server = TestServer::start(vec![Reply::sse(stream_of(chunks, true))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!(merged.finish_reason, Some(FinishReason::ToolCalls));
    merged.calls.into_iter().collect()
}

fn call(id: &str, name: &str, arguments: &str) -> (String, String, String) {
    (id.to_owned(), name.to_owned(), arguments.to_owned())
}

#[tokio::test]
async fn tool_calls_are_numbered_densely_whatever_the_server_indexes() {
    // Ollama: every call whole, each at index 0 with its own id.
    let ollama = [
        call_chunk(Some(0), Some("call_a"), Some("add"), Some("{\"a\":1}")),
        call_chunk(Some(0), Some("call_b"), Some("mul"), Some("{\"b\":2}")),
        finish("tool_calls"),
    ];
    assert_eq!(
        calls_of(&ollama).await,
        [(0, call("call_a", "add", "{\"a\":1}")), (1, call("call_b", "mul", "{\"b\":2}"))]
    );
    // No index, one call per chunk, each continued by a chunk with neither index nor id.
    let unindexed = [
        call_chunk(None, Some("call_a"), Some("add"), Some("{\"a\":")),
        call_chunk(None, None, None, Some("1}")),
        call_chunk(None, Some("call_b"), Some("mul"), None),
        call_chunk(None, None, None, Some("{}")),
        finish("tool_calls"),
    ];
    assert_eq!(
        calls_of(&unindexed).await,
        [(0, call("call_a", "add", "{\"a\":1}")), (1, call("call_b", "mul", "{}"))]
    );
    // Every call whole, without ids, at one index: a new name is a new call.
    let anonymous = [
        call_chunk(Some(0), None, Some("add"), Some("{\"a\":1}")),
        call_chunk(Some(0), None, Some("mul"), Some("{\"b\":2}")),
        call_chunk(None, None, Some("div"), Some("{}")),
        finish("tool_calls"),
    ];
    let calls: Vec<(u32, (String, String))> = calls_of(&anonymous)
        .await
        .into_iter()
        .map(|(index, (_, name, arguments))| (index, (name, arguments)))
        .collect();
    let expected = [("add", "{\"a\":1}"), ("mul", "{\"b\":2}"), ("div", "{}")];
    let expected: Vec<(u32, (String, String))> = (0..)
        .zip(expected)
        .map(|(index, (name, arguments))| (index, (name.to_owned(), arguments.to_owned())))
        .collect();
    assert_eq!(calls, expected);
    // Proxies for Claude start at 1; GLM sends -1.
    for first in [1, -1] {
        let chunks = [
            call_chunk(Some(first), Some("call_a"), Some("add"), None),
            call_chunk(Some(first), None, None, Some("{}")),
            finish("tool_calls"),
        ];
        assert_eq!(calls_of(&chunks).await, [(0, call("call_a", "add", "{}"))], "first index {first}");
    }
}

#[tokio::test]
async fn a_tool_call_without_an_id_gets_one_and_a_late_server_id_does_not_split_it() {
    let chunks = [
        call_chunk(Some(0), None, Some("add"), Some("{\"a\":")),
        call_chunk(Some(0), Some(""), None, Some("1}")),
        call_chunk(Some(1), None, Some("mul"), None),
        call_chunk(Some(1), Some("call_late"), None, Some("{}")),
        finish("tool_calls"),
    ];
    let calls = calls_of(&chunks).await;
    assert_eq!(calls.len(), 2, "{calls:?}");
    let ids: Vec<&str> = calls.iter().map(|(_, (id, _, _))| id.as_str()).collect();
    assert!(ids.iter().all(|id| id.starts_with("call_") && id.len() > 10), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    assert_eq!((calls[0].1.1.as_str(), calls[0].1.2.as_str()), ("add", "{\"a\":1}"));
    assert_eq!((calls[1].1.1.as_str(), calls[1].1.2.as_str()), ("mul", "{}"));
}

#[tokio::test]
async fn done_without_a_finish_reason_finishes_the_message_by_its_kind() {
    let text = [json!({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})];
    let server = TestServer::start(vec![
        Reply::sse(stream_of(&text, true)),
        Reply::sse(stream_of(&[call_chunk(Some(0), Some("call_a"), Some("add"), Some("{}"))], true)),
        Reply::sse(stream_of(&text, false)),
    ])
    .await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!((merged.content.as_str(), merged.finish_reason), ("Hi", Some(FinishReason::Stop)));
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).finish_reason, Some(FinishReason::ToolCalls));
    // Without `[DONE]` nor a finish reason the response may be cut short: still an error.
    let (_, error) = run(&server.model(), hello()).await;
    assert_eq!(error, Some(ModelError::Disconnected));
}

#[tokio::test]
async fn error_events_and_llama_cpp_error_lines_keep_the_servers_message() {
    let named = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"}}]}\n\nevent: error\ndata: {\"message\":\"Overloaded\"}\n\n";
    let llama = b"error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"exceed_context_size_error\"}\n\n";
    let server = TestServer::start(vec![Reply::sse(named.to_vec()), Reply::sse(llama.to_vec())]).await;
    let (_, error) = run(&server.model(), hello()).await;
    assert_eq!(error, Some(ModelError::Http { status: 0, message: "Overloaded".into() }));
    let (_, error) = run(&server.model(), hello()).await;
    let message = "the request exceeds the available context size".to_owned();
    assert_eq!(error, Some(ModelError::Http { status: 400, message }));
}

#[tokio::test]
async fn a_whole_json_completion_is_read_as_one_finished_delta() {
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me add.",
            "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]
        }}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    });
    let server = TestServer::start(vec![Reply::Whole {
        content_type: "application/json; charset=utf-8",
        body: completion.to_string(),
    }])
    .await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!(merged.content, "Let me add.");
    assert_eq!(merged.calls.into_iter().collect::<Vec<_>>(), [(0, call("call_a", "add", "{\"a\":1}"))]);
    assert_eq!(merged.finish_reason, Some(FinishReason::ToolCalls));
    assert_eq!(merged.usage, Some(Usage::new(12, 5)));
}

#[tokio::test]
async fn a_200_json_error_an_html_page_and_ndjson_are_refused_with_what_they_mean() {
    let server = TestServer::start(vec![
        Reply::Whole {
            content_type: "application/json",
            body: json!({"error": {"message": "model 'gpt-5' not found", "code": 404}}).to_string(),
        },
        Reply::Whole { content_type: "text/html", body: "<html><body>Welcome</body></html>".into() },
        Reply::Whole { content_type: "application/x-ndjson", body: "{\"message\":{}}\n".into() },
    ])
    .await;
    let model = server.model();
    let (_, error) = run(&model, hello()).await;
    assert_eq!(error, Some(ModelError::Http { status: 404, message: "model 'gpt-5' not found".into() }));
    for hint in ["HTML page", "newline-delimited JSON"] {
        let (_, error) = run(&model, hello()).await;
        let Some(ModelError::Http { status: 200, message }) = error else { panic!("{error:?}") };
        assert!(message.contains(hint), "{message}");
    }
    assert_eq!(server.requests().len(), 3, "none of them is retried");
}

#[tokio::test]
async fn a_connection_closed_before_any_response_is_retried() {
    let server = TestServer::start(vec![Reply::Reset, Reply::sse(fixture("openai_text.sse"))]).await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).finish_reason, Some(FinishReason::Stop));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn an_error_object_or_an_empty_body_in_place_of_the_first_delta_is_retried() {
    let loading = json!({"error": {"message": "model is loading", "code": 503}});
    let server = TestServer::start(vec![
        Reply::sse(stream_of(&[loading], false)),
        Reply::sse(Vec::new()),
        Reply::sse(fixture("openai_text.sse")),
    ])
    .await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).content, "Hello! How can I help you today?");
    assert_eq!(server.requests().len(), 3);
}

/// In a stream as in a status, a 429 for an exhausted quota is not waited out (waiting
/// does not fix it), and one that only limits the rate is.
#[tokio::test]
async fn an_exhausted_quota_in_place_of_the_first_delta_is_not_retried_and_a_rate_limit_is() {
    let quota = json!({"error": {"message": "You exceeded your current quota", "code": 429, "type": "insufficient_quota"}});
    let server = TestServer::start(vec![
        Reply::sse(stream_of(&[quota], false)),
        Reply::sse(fixture("openai_text.sse")),
    ])
    .await;
    let (_, error) = run(&server.model(), hello()).await;
    assert_eq!(
        error,
        Some(ModelError::Http { status: 429, message: "You exceeded your current quota".into() })
    );
    assert_eq!(server.requests().len(), 1, "not retried");
    let limited = json!({"error": {"message": "Rate limit reached", "code": 429}});
    let server = TestServer::start(vec![
        Reply::sse(stream_of(&[limited], false)),
        Reply::sse(fixture("openai_text.sse")),
    ])
    .await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    assert_eq!(merge(&deltas).content, "Hello! How can I help you today?");
    assert_eq!(server.requests().len(), 2, "retried once");
}

#[tokio::test]
async fn a_finished_answer_without_usage_is_not_held_by_a_server_that_keeps_the_connection_open() {
    let (closed_tx, _closed_rx) = oneshot::channel();
    let body =
        stream_of(&[json!({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}), finish("stop")], false);
    let server = TestServer::start(vec![Reply::SseUntilClosed { body, closed: closed_tx }]).await;
    // Well within the idle timeout the test server's config leaves (5 minutes by default).
    let (deltas, error) = tokio::time::timeout(Duration::from_secs(30), run(&server.model(), hello()))
        .await
        .expect("the finished answer was not held until the idle timeout");
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!((merged.content.as_str(), merged.finish_reason), ("Hi", Some(FinishReason::Stop)));
}

#[tokio::test]
async fn a_call_whose_later_chunks_carry_another_id_stays_one_call_and_a_reused_id_elsewhere_is_another() {
    // Poolside and older mlx servers send another id with a call's arguments.
    let changed = [
        call_chunk(Some(0), Some("call_a"), Some("add"), None),
        call_chunk(Some(0), Some("call_b"), None, Some("{\"a\":1}")),
        finish("tool_calls"),
    ];
    assert_eq!(calls_of(&changed).await, [(0, call("call_a", "add", "{\"a\":1}"))]);
    // One id at two indexes: two calls (the engine answers the second with an error).
    let reused = [
        call_chunk(Some(0), Some("call_a"), Some("add"), Some("{}")),
        call_chunk(Some(1), Some("call_a"), Some("mul"), Some("{}")),
        finish("tool_calls"),
    ];
    assert_eq!(calls_of(&reused).await, [(0, call("call_a", "add", "{}")), (1, call("call_a", "mul", "{}"))]);
}

#[tokio::test]
async fn an_empty_done_stream_and_a_json_503_are_retried_and_a_stream_labelled_json_is_read() {
    let busy = json!({"error": {"message": "busy", "code": 503}}).to_string();
    let labelled = String::from_utf8(fixture("openai_text.sse")).unwrap();
    let server = TestServer::start(vec![
        Reply::sse(b"data: [DONE]\n\n".to_vec()),
        Reply::Whole { content_type: "application/json", body: busy },
        Reply::Whole { content_type: "application/json", body: labelled },
    ])
    .await;
    let (deltas, error) = run(&server.model(), hello()).await;
    assert_eq!(error, None);
    let merged = merge(&deltas);
    assert_eq!(
        (merged.content.as_str(), merged.finish_reason),
        ("Hello! How can I help you today?", Some(FinishReason::Stop))
    );
    assert_eq!(server.requests().len(), 3);
}
