//! MCP tools against the real `@modelcontextprotocol/server-everything` (pinned in
//! `tools/mcp/package.json`; install it with `npm ci --prefix tools/mcp`), over stdio and
//! streamable HTTP, directly and through a turn.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentry_events::{EventPayload, McpTransport};
use agentry_memory::InMemoryStore;
use agentry_model::{ScriptedModel, ScriptedResponse};
use agentry_runner::{
    Agent, MCP_INHERITED_ENV, McpConnection, McpError, McpServerConfig, Runtime, Tool, ToolContext,
    ToolError, TurnRequest,
};
use agentry_types::{SessionId, ThreadId, TurnId};
use futures_util::StreamExt;
use serde_json::json;

/// The installed server's launcher; fails (never skips) when it is not installed.
fn server_everything() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let launcher = root.join("tools/mcp/node_modules/.bin/mcp-server-everything");
    assert!(
        launcher.exists(),
        "the MCP test server is not installed at {}: run `npm ci --prefix tools/mcp` in the repository root",
        launcher.display()
    );
    launcher
}

fn stdio_config() -> McpServerConfig {
    McpServerConfig::stdio("everything", server_everything().to_string_lossy()).args(["stdio"])
}

async fn connect_stdio() -> McpConnection {
    McpConnection::connect(stdio_config()).await.expect("server-everything connects over stdio")
}

fn tool(connection: &McpConnection, name: &str) -> Arc<dyn Tool> {
    connection.tools().into_iter().find(|tool| tool.spec().name == name).unwrap_or_else(|| {
        let names: Vec<String> = connection.tools().iter().map(|tool| tool.spec().name.clone()).collect();
        panic!("no tool `{name}` among {names:?}")
    })
}

fn context() -> ToolContext {
    ToolContext::new(SessionId::new(), TurnId::new(), ThreadId::main(), "call_1", "key_1")
}

/// Whether the process `pid` is gone (exited and reaped: a zombie still has a `/proc`
/// entry). The test does not own the process, so it cannot await its exit; it polls, for
/// at most ten seconds.
async fn process_is_gone(pid: u32) -> bool {
    let entry = PathBuf::from(format!("/proc/{pid}"));
    for _ in 0..200 {
        if !entry.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn the_stdio_server_lists_echo_and_get_sum_with_their_schemas_and_hints() {
    let connection = connect_stdio().await;

    let echo = tool(&connection, "echo");
    assert_eq!(echo.spec().description.as_deref(), Some("Echoes back the input string"));
    assert_eq!(echo.spec().parameters["type"], "object");
    assert_eq!(echo.spec().parameters["properties"]["message"]["type"], "string");
    assert_eq!(echo.spec().parameters["required"], json!(["message"]));
    assert!(echo.spec().parameters.get("$schema").is_none(), "the meta-schema key is left out");
    assert!(echo.idempotent(), "echo is annotated idempotentHint: true");

    let sum = tool(&connection, "get-sum");
    assert_eq!(sum.spec().parameters["properties"]["a"]["type"], "number");
    assert_eq!(sum.spec().parameters["properties"]["b"]["type"], "number");
    let mut required: Vec<String> =
        serde_json::from_value(sum.spec().parameters["required"].clone()).expect("a list of names");
    required.sort();
    assert_eq!(required, ["a", "b"]);

    let toggle = tool(&connection, "toggle-simulated-logging");
    assert!(!toggle.idempotent(), "a tool annotated idempotentHint: false is not idempotent");

    let info =
        connection.mcp_tools().iter().find(|tool| tool.spec().name == "echo").expect("echo").tool_info();
    assert_eq!(info.original_tool_name, "echo");
    assert_eq!(info.mcp_server.map(|server| server.name).as_deref(), Some("everything"));
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn calling_echo_returns_the_echoed_message() {
    let connection = connect_stdio().await;
    let echo = tool(&connection, "echo");
    let arguments = json!({"message": "hello from agentry"});
    echo.validate(&arguments).expect("valid arguments");
    let result = echo.call(arguments, context()).await;
    assert_eq!(result, Ok("Echo: hello from agentry".to_owned()));
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn calling_get_sum_returns_the_sum() {
    let connection = connect_stdio().await;
    let sum = tool(&connection, "get-sum");
    let result = sum.call(json!({"a": 2, "b": 3.5}), context()).await;
    assert_eq!(result, Ok("The sum of 2 and 3.5 is 5.5.".to_owned()));
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn a_stdio_server_gets_only_the_inherited_variables_and_those_it_is_given() {
    // Cargo sets this for the test process; it stands for any secret in the environment.
    let secret = "CARGO_MANIFEST_DIR";
    assert!(std::env::var_os(secret).is_some(), "the test process has {secret}");
    let connection = McpConnection::connect(stdio_config().env("AGENTRY_GIVEN", "given value"))
        .await
        .expect("the stdio server starts");
    let printed = tool(&connection, "get-env").call(json!({}), context()).await.expect("get-env answers");
    let env: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&printed).expect("get-env prints a JSON object");
    assert_eq!(env.get("AGENTRY_GIVEN"), Some(&json!("given value")));
    assert!(env.contains_key("PATH"), "PATH is inherited: {printed}");
    assert!(!env.contains_key(secret), "{secret} leaked to the server: {printed}");
    let unexpected: Vec<&String> = env
        .keys()
        .filter(|name| !MCP_INHERITED_ENV.contains(&name.as_str()) && *name != "AGENTRY_GIVEN")
        .collect();
    assert!(unexpected.is_empty(), "variables the server was not given: {unexpected:?}");
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn arguments_that_do_not_fit_the_schema_are_refused_by_validate() {
    let connection = connect_stdio().await;
    let sum = tool(&connection, "get-sum");
    let Err(ToolError::InvalidArguments(problems)) = sum.validate(&json!({"a": "two"})) else {
        panic!("arguments with a string for a number and a missing field must be refused");
    };
    assert!(problems.contains("/a"), "the wrong type is named with its path: {problems}");
    assert!(problems.contains("\"b\""), "the missing field is named: {problems}");
    assert!(tool(&connection, "echo").validate(&json!({})).is_err(), "echo needs a message");
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn arguments_the_server_rejects_give_a_tool_error_with_its_reason() {
    let connection = connect_stdio().await;
    // Skipping validate: the server checks too, and its refusal must reach the caller.
    let result = tool(&connection, "get-sum").call(json!({"a": "two", "b": 3}), context()).await;
    let message = match result {
        Err(ToolError::Failed(message) | ToolError::InvalidArguments(message)) => message,
        other => panic!("the server's refusal must be an error, got {other:?}"),
    };
    assert!(message.contains("Invalid arguments"), "the server's reason is given: {message}");
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn a_call_that_takes_longer_than_the_request_timeout_fails_and_the_connection_stays_usable() {
    let config = stdio_config().request_timeout(Duration::from_millis(500));
    let connection = McpConnection::connect(config).await.expect("connects");
    let slow = tool(&connection, "trigger-long-running-operation");
    let Err(ToolError::Failed(message)) = slow.call(json!({"duration": 30, "steps": 3}), context()).await
    else {
        panic!("a 30 s operation cannot finish within 500 ms");
    };
    assert!(message.contains("did not answer within 500ms"), "{message}");
    let echo = tool(&connection, "echo");
    assert_eq!(
        echo.call(json!({"message": "still here"}), context()).await,
        Ok("Echo: still here".to_owned())
    );
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn non_text_content_is_summarised_as_json_without_its_base64_payload() {
    let connection = connect_stdio().await;
    let result = tool(&connection, "get-tiny-image").call(json!({}), context()).await.expect("an image");
    assert!(result.contains(r#""type":"image""#), "the image is shown as JSON: {result}");
    assert!(result.contains(r#""mimeType":"image/png""#), "with its media type: {result}");
    assert!(result.contains("base64 characters left out"), "without its data: {result}");
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn the_session_names_the_server_and_keeps_one_session_id() {
    let connection = McpConnection::connect(stdio_config().id("srv_everything")).await.expect("connects");
    let session = connection.session();
    assert_eq!(session.name, "everything");
    assert_eq!(session.id, "srv_everything");
    assert_eq!(session.transport, Some(McpTransport::Stdio));
    let session_id = session.session_id.clone().expect("a stdio session gets a generated id");
    assert_eq!(session_id.len(), 36, "a UUID: {session_id}");
    assert_eq!(connection.session().session_id, Some(session_id), "the id is stable");
    assert_eq!(connection.server_info().map(|(name, _)| name), Some("mcp-servers/everything"));
    let payload = EventPayload::McpInitialize { servers: vec![session] };
    assert_eq!(payload.kind(), "mcp.initialize");
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn the_allow_list_keeps_only_the_named_tools() {
    let config = stdio_config().allow_tools(["echo", "get-sum", "no-such-tool"]);
    let connection = McpConnection::connect(config).await.expect("connects");
    let mut names: Vec<String> = connection.tools().iter().map(|tool| tool.spec().name.clone()).collect();
    names.sort();
    assert_eq!(names, ["echo", "get-sum"]);
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn a_command_that_does_not_exist_fails_to_spawn_with_its_name_in_the_error() {
    let config = McpServerConfig::stdio("ghost", "/nonexistent/agentry-mcp-server");
    let error = McpConnection::connect(config).await.expect_err("nothing to start");
    assert!(
        matches!(&error, McpError::Spawn { server, command, .. }
            if server == "ghost" && command == "/nonexistent/agentry-mcp-server"),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("/nonexistent/agentry-mcp-server"), "{message}");
    assert!(message.contains("No such file"), "the reason is given: {message}");
}

#[tokio::test]
async fn a_process_that_does_not_speak_mcp_fails_to_initialize_with_its_stderr() {
    let config = McpServerConfig::stdio("mute", "sh").args(["-c", "echo 'not an MCP server' >&2; exit 3"]);
    let error = McpConnection::connect(config).await.expect_err("no handshake");
    assert!(matches!(&error, McpError::Initialize { server, .. } if server == "mute"), "{error:?}");
    assert!(error.to_string().contains("not an MCP server"), "the server's last words are given: {error}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_while_connecting() {
    let config = McpServerConfig::stdio("silent", "sh")
        .args(["-c", "exec sleep 30"])
        .connect_timeout(Duration::from_millis(300));
    let error = McpConnection::connect(config).await.expect_err("no answer");
    assert!(
        matches!(&error, McpError::Timeout { server, operation, .. } if server == "silent" && operation == "initialize"),
        "{error:?}"
    );
}

#[tokio::test]
async fn closing_the_connection_shuts_the_server_down_and_reaps_it() {
    let connection = connect_stdio().await;
    let pid = connection.process_id().expect("a stdio server has a process");
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "the server runs while connected");
    connection.close().await.expect("closes");
    assert!(process_is_gone(pid).await, "the server process {pid} is gone (not left as a zombie)");
}

#[tokio::test]
async fn dropping_the_connection_shuts_the_server_down_and_its_tools_then_fail() {
    let connection = connect_stdio().await;
    let pid = connection.process_id().expect("a stdio server has a process");
    let echo = tool(&connection, "echo");
    drop(connection);
    assert!(process_is_gone(pid).await, "the server process {pid} is gone (not left as a zombie)");
    let Err(ToolError::Failed(message)) = echo.call(json!({"message": "anyone?"}), context()).await else {
        panic!("a tool of a closed connection cannot be called");
    };
    assert!(message.contains("everything"), "the error names the server: {message}");
}

#[tokio::test]
async fn a_stdio_server_that_was_killed_is_started_again_by_the_next_call() {
    let connection = connect_stdio().await;
    let pid = connection.process_id().expect("a stdio server has a process");
    let echo = tool(&connection, "echo");
    let killed =
        std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill runs");
    assert!(killed.success());
    assert!(process_is_gone(pid).await, "the server process {pid} was killed");
    // A call racing the connection's own notice of the death may fail (it cannot know
    // whether its request left); the one after it finds the server started again.
    match echo.call(json!({"message": "again"}), context()).await {
        Ok(answer) => assert_eq!(answer, "Echo: again"),
        Err(ToolError::Failed(message)) => {
            assert!(message.contains("closed"), "{message}");
            assert_eq!(echo.call(json!({"message": "again"}), context()).await, Ok("Echo: again".to_owned()));
        }
        Err(other) => panic!("{other:?}"),
    }
    let sum = tool(&connection, "get-sum");
    assert_eq!(sum.call(json!({"a": 1, "b": 2}), context()).await, Ok("The sum of 1 and 2 is 3.".to_owned()));
    connection.close().await.expect("closes the new server too");
    let Err(ToolError::Failed(message)) = echo.call(json!({"message": "after close"}), context()).await
    else {
        panic!("a closed connection is not started again");
    };
    assert!(message.contains("everything"), "{message}");
}

#[tokio::test]
async fn the_stderr_of_a_stdio_server_is_kept_for_diagnostics() {
    let connection = connect_stdio().await;
    // The server writes its banner before it answers `initialize`; the reader may lag.
    let mut tail = String::new();
    for _ in 0..100 {
        tail = connection.stderr_tail().unwrap_or_default();
        if !tail.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(tail.contains("Starting default (STDIO) server"), "stderr tail: {tail:?}");
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn an_agent_calls_mcp_tools_in_a_turn_and_the_tool_responses_carry_their_results() {
    let connection = Arc::new(connect_stdio().await);
    let expected_session = connection.session();
    let model = Arc::new(ScriptedModel::new(vec![
        ScriptedResponse::tool_call("echo", &json!({"message": "ping"})),
        ScriptedResponse::tool_call("get-sum", &json!({"a": 2, "b": 3})),
        ScriptedResponse::text("Echoed ping; 2 + 3 = 5."),
    ]));
    let runtime = Runtime::new(Arc::new(InMemoryStore::new()));
    runtime.register(Agent::builder("mcp", model.clone()).mcp(connection.clone()).build());
    let session = runtime.create_session("mcp", Some("test")).await.expect("session");
    let turn = session.create_turn(TurnRequest::message("Echo ping, then add 2 and 3.")).await.expect("turn");
    let mut stream = turn.stream(None);
    let mut responses = Vec::new();
    let mut last = None;
    let mut initialized = Vec::new();
    let mut servers_of_calls = Vec::new();
    while let Some(event) = stream.next().await {
        let event = event.expect("an event");
        match &event.payload {
            EventPayload::ToolResponse { name, content, is_error, .. } => {
                responses.push((name.clone(), content.clone(), *is_error));
            }
            EventPayload::McpInitialize { servers } => initialized.clone_from(servers),
            EventPayload::ModelMessage(message) => servers_of_calls.extend(
                message
                    .tool_calls
                    .iter()
                    .map(|call| call.tool_info.as_ref().and_then(|info| info.mcp_server.clone())),
            ),
            _ => {}
        }
        last = Some(event.payload.kind());
    }
    assert_eq!(
        initialized,
        std::slice::from_ref(&expected_session),
        "mcp.initialize announces the server session"
    );
    assert_eq!(servers_of_calls.len(), 2);
    assert!(
        servers_of_calls
            .iter()
            .all(|server| server.as_ref().is_some_and(|server| server.name == expected_session.name)),
        "{servers_of_calls:?}"
    );
    assert_eq!(
        responses,
        [
            ("echo".to_owned(), "Echo: ping".to_owned(), false),
            ("get-sum".to_owned(), "The sum of 2 and 3 is 5.".to_owned(), false),
        ]
    );
    assert_eq!(last, Some("turn.done"));
    let offered: Vec<String> = model.requests()[0].tools.iter().map(|tool| tool.name.clone()).collect();
    assert!(offered.contains(&"echo".to_owned()) && offered.contains(&"get-sum".to_owned()), "{offered:?}");
}

/// A free loopback port: bound, read, released for the server to take.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// server-everything over streamable HTTP on `port`, once it accepts connections (polled,
/// for at most 20 seconds; it has no readiness signal).
async fn start_http_server(port: u16) -> tokio::process::Child {
    let mut server = tokio::process::Command::new(server_everything())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the HTTP server starts");
    let mut ready = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            ready = true;
            break;
        }
        if let Ok(Some(status)) = server.try_wait() {
            panic!("the HTTP server exited before listening: {status}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the HTTP server listens on port {port}");
    server
}

#[tokio::test]
async fn a_restarted_http_server_gets_a_new_session_and_the_call_goes_through() {
    let port = free_port();
    let mut server = start_http_server(port).await;
    let config = McpServerConfig::streamable_http("restarting", format!("http://127.0.0.1:{port}/mcp"));
    let connection = McpConnection::connect(config).await.expect("connects over streamable HTTP");
    let echo = tool(&connection, "echo");
    assert_eq!(echo.call(json!({"message": "before"}), context()).await, Ok("Echo: before".to_owned()));
    server.kill().await.expect("the server stops");
    let _server = start_http_server(port).await;
    // The new server answers the old session with a 400 JSON-RPC error naming no request;
    // the call must neither wait for its timeout (60 s) nor fail: the session is opened
    // again and the call sent once more.
    let call = echo.call(json!({"message": "after"}), context());
    let answer = tokio::time::timeout(Duration::from_secs(30), call).await.expect("answered, not timed out");
    assert_eq!(answer, Ok("Echo: after".to_owned()));
    connection.close().await.expect("closes");
}

#[tokio::test]
async fn the_streamable_http_server_serves_the_tools_with_its_own_session_id() {
    let port = free_port();
    let mut server = start_http_server(port).await;

    let config = McpServerConfig::streamable_http("everything-http", format!("http://127.0.0.1:{port}/mcp"))
        .bearer_token("not-checked-by-this-server");
    let connection = McpConnection::connect(config).await.expect("connects over streamable HTTP");
    let session = connection.session();
    assert_eq!(session.name, "everything-http");
    assert_eq!(session.transport, Some(McpTransport::StreamableHttp));
    let session_id = session.session_id.expect("the server assigns a session id");
    // The server's ids are random UUIDs (version 4); a generated one would be version 7.
    assert_eq!(session_id.as_bytes().get(14), Some(&b'4'), "the server's own session id: {session_id}");
    assert_eq!(connection.process_id(), None);
    assert_eq!(connection.stderr_tail(), None);

    let echo = tool(&connection, "echo");
    assert_eq!(echo.call(json!({"message": "over http"}), context()).await, Ok("Echo: over http".to_owned()));
    let sum = tool(&connection, "get-sum");
    assert_eq!(
        sum.call(json!({"a": 40, "b": 2}), context()).await,
        Ok("The sum of 40 and 2 is 42.".to_owned())
    );
    assert_eq!(connection.session().session_id, Some(session_id), "the session id is stable");
    connection.close().await.expect("closes");

    server.kill().await.expect("the HTTP server stops");
}
