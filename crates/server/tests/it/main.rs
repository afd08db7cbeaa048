//! The server in process: configuration errors, the redb backend over real HTTP, and the
//! loopback rule without API keys. (The HTTP API itself is driven with the SDK client in
//! `tests/python/test_server.py`.)

// Test helpers stop the test loudly on any failure.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use agentry_server::{Backend, Config, ConfigError, Server};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// `request`, a whole raw HTTP/1.1 request (which should ask `Connection: close`), sent on
/// its own connection; returns the whole answer.
async fn raw_exchange(address: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    answer
}

/// One HTTP/1.1 request on its own connection; returns the status and the body (for SSE,
/// the `data:` payloads up to `turn.done`).
async fn request(address: SocketAddr, method: &str, path: &str, body: &Value) -> (u16, String) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let body = body.to_string();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).await.unwrap();
    let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut event_stream = false;
    loop {
        line.clear();
        reader.read_line(&mut line).await.unwrap();
        if line.to_ascii_lowercase().starts_with("content-type: text/event-stream") {
            event_stream = true;
        }
        if line == "\r\n" {
            break;
        }
    }
    let mut text = String::new();
    if event_stream {
        loop {
            line.clear();
            if reader.read_line(&mut line).await.unwrap() == 0 {
                break;
            }
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                text.push_str(data);
                text.push('\n');
                if data.contains(r#""type":"turn.done""#) {
                    break;
                }
            }
        }
    } else {
        reader.read_to_string(&mut text).await.unwrap();
    }
    (status, text)
}

async fn serve(
    config: Config,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let server = Server::start(config).await.unwrap();
    let address = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        server
            .run(async move {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (address, stop, serving)
}

/// The launcher of `@modelcontextprotocol/server-everything`, installed by the test script.
fn server_everything() -> std::path::PathBuf {
    let launcher = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/mcp/node_modules/.bin/mcp-server-everything");
    assert!(launcher.exists(), "run `npm ci --prefix tools/mcp` first: {}", launcher.display());
    launcher
}

/// A configuration on a loopback port and the store file `path`, with `storage` lines.
fn config_at(path: &std::path::Path, storage: &str) -> Config {
    let mut config = Config::parse(&format!("listen = \"127.0.0.1:0\"\n[storage]\n{storage}"), None).unwrap();
    config.storage.path = path.to_path_buf();
    config
}

#[test]
fn configuration_errors_name_the_problem() {
    let unknown = Config::parse("listen = \"127.0.0.1:1\"\nlisten_port = 3\n", None).unwrap_err();
    assert!(matches!(&unknown, ConfigError::Parse { .. }), "{unknown}");
    assert!(unknown.to_string().contains("listen_port"), "{unknown}");
    let durability = Config::parse("[storage]\ndurability = \"sometimes\"\n", None).unwrap_err();
    assert!(durability.to_string().contains("sometimes"), "{durability}");
    let key = Config::parse("[[keys]]\nsubject = \"alice\"\n", None).unwrap();
    let error = key.api_keys().unwrap_err();
    assert!(error.to_string().contains("exactly one of `key` and `key_env`"), "{error}");
    let unset =
        Config::parse("[[keys]]\nkey_env = \"AGENTRY_TEST_SURELY_UNSET\"\nsubject = \"a\"\n", None).unwrap();
    assert!(unset.api_keys().unwrap_err().to_string().contains("AGENTRY_TEST_SURELY_UNSET"));
    let parsed = Config::parse("[storage]\nbackend = \"redb\"\npath = \"x.redb\"\n", None).unwrap();
    assert_eq!(parsed.storage.backend, Backend::Redb);
    assert!(parsed.demo_agents, "the demo agents are on unless switched off");
}

#[test]
fn durations_beyond_a_year_and_empty_names_are_refused_naming_the_key() {
    for (text, named) in [
        ("[runtime]\nlease_ttl_secs = 1000000000000\n", "runtime.lease_ttl_secs is 1000000000000"),
        ("[runtime]\nlease_ttl_secs = 0\n", "runtime.lease_ttl_secs is 0"),
        ("[runtime]\nlive_retention_secs = 31536001\n", "runtime.live_retention_secs"),
        ("[limits]\nheartbeat_secs = 18446744073709551615\n", "limits.heartbeat_secs"),
        ("[limits]\nshutdown_grace_secs = 99999999999\n", "limits.shutdown_grace_secs"),
        ("[limits]\nbody_bytes = 0\n", "limits.body_bytes is 0; it must be at least 1024"),
        ("[limits]\nstreams_per_subject = 0\n", "limits.streams_per_subject is 0; it must be at least 1"),
        ("[limits]\nheader_timeout_secs = 0\n", "limits.header_timeout_secs is 0; it must be between 1"),
        ("[limits]\nbody_timeout_secs = 31536001\n", "limits.body_timeout_secs is 31536001"),
        ("[providers.p]\nmodel = \"m\"\ntimeout_secs = 18446744073709551615\n", "providers.p.timeout_secs"),
        (
            "[providers.p]\nmodel = \"m\"\nstream_idle_timeout_secs = 0\n",
            "providers.p.stream_idle_timeout_secs is 0",
        ),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\ntimeout_secs = 18446744073709551615\n",
            "agent \"a\": timeout_secs",
        ),
        ("[[agents]]\nname = \" \"\nmodel = \"demo\"\n", "an agent's name must not be empty"),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\nmax_tool_output_bytes = 0\n",
            "agent \"a\": max_tool_output_bytes is 0",
        ),
        ("[[teams]]\nname = \"\"\nmodel = \"demo\"\n", "a team's name must not be empty"),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\nmax_iterations = 0\n",
            "agent \"a\": max_iterations is 0; it must be at least 1",
        ),
        ("[[teams]]\nname = \"t\"\nmodel = \"demo\"\n", "team \"t\" has no members and no spawn policy"),
        ("[storage]\npath = \"\"\n", "storage.path is \"\""),
        ("[storage]\npath = \"  \"\n", "storage.path is \"  \""),
        (
            "[[teams]]\nname = \"t\"\nmodel = \"demo\"\ntokens_per_step = 0\n",
            "team \"t\": tokens_per_step must be at least 1",
        ),
        ("[providers.demo]\nmodel = \"m\"\n", "providers.demo: `model = \"demo\"` names the built-in"),
        (
            "[providers.p]\nmodel = \"m\"\nbase_url = \"not a url\"\n",
            "providers.p.base_url is \"not a url\": it is not",
        ),
        ("[providers.p]\nmodel = \"m\"\nbase_url = \"ftp://h/v1\"\n", "only http:// and https://"),
        ("[providers.p]\nmodel = \"m\"\nbase_url = \"http://h:99999/v1\"\n", "its port is not a number"),
        ("[providers.p]\nmodel = \"m\"\nbase_url = \"http://u:p@h:0/v1\"\n", "its port is not a number"),
        (
            "[providers.p]\nmodel = \"m\"\nbase_url = \"http://h/v1?api-version=1\"\n",
            "takes no query or fragment",
        ),
        ("[providers.\"\"]\nmodel = \"m\"\n", "a provider's name must not be blank"),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\nrequires_approval = [\"x\", \"x\"]\n",
            "agent \"a\": requires_approval names \"x\" twice",
        ),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\n[[agents.mcp]]\nname = \"s \"\ncommand = \"x\"\n",
            "MCP server \"s \" has spaces around its name",
        ),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\n[[agents.mcp]]\nname = \"s\"\nurl = \"not a url\"\noptional = true\n",
            "agent \"a\": MCP server \"s\": url is \"not a url\"",
        ),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\n[[agents.mcp]]\nname = \"s\"\nurl = \"http:///mcp\"\n",
            "url is \"http:///mcp\"",
        ),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\n[[agents.mcp]]\nname = \" \"\ncommand = \"x\"\n",
            "agent \"a\": MCP server 0 has no name",
        ),
        (
            "[[agents]]\nname = \"a\"\nmodel = \"demo\"\n[[agents.mcp]]\nname = \"s\"\ncommand = \"x\"\n[[agents.mcp]]\nname = \"s\"\ncommand = \"y\"\n",
            "agent \"a\": two MCP servers are named \"s\"",
        ),
    ] {
        let error = Config::parse(text, None).unwrap_err();
        assert!(matches!(error, ConfigError::Invalid(_)), "{text}: {error}");
        assert!(error.to_string().contains(named), "{text}: {error}");
    }
    let host = Config::parse("listen = \"localhost:8787\"\n", None).unwrap_err().to_string();
    assert!(
        host.contains("\"localhost:8787\" is not an IP address and port") && host.contains("127.0.0.1:8787"),
        "{host}"
    );
    // Good URLs pass: a port, IPv6, a path, user info.
    for url in ["http://127.0.0.1:11434/v1", "http://[::1]:8000/v1", "https://u:p@api.example.com/openai/v1"]
    {
        Config::parse(&format!("[providers.p]\nmodel = \"m\"\nbase_url = \"{url}\"\n"), None).unwrap();
    }
    let longest = Config::parse("[runtime]\nlease_ttl_secs = 31536000\n", None).unwrap();
    assert_eq!(longest.runtime.lease_ttl_secs, agentry_server::config::MAX_SECS);
}

#[tokio::test]
async fn an_agent_named_as_a_demo_agent_is_refused_saying_how_to_keep_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config::parse("listen = \"127.0.0.1:0\"\n[[agents]]\nname = \"demo\"\nmodel = \"demo\"\n", None)
            .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let error = Server::start(config.clone()).await.unwrap_err().to_string();
    assert!(
        error.contains("agent \"demo\" has the name of a built-in demo agent")
            && error.contains("demo_agents = false"),
        "{error}"
    );
    config.demo_agents = false;
    let server = Server::start(config).await.unwrap();
    assert!(server.runtime().agent("demo").is_some());
}

#[test]
fn two_subjects_with_one_api_key_are_refused() {
    let text = "[[keys]]\nkey = \"same\"\nsubject = \"alice\"\n[[keys]]\nkey = \"same\"\nsubject = \"bob\"\n";
    let error = Config::parse(text, None).unwrap().api_keys().unwrap_err();
    assert!(error.to_string().contains("subjects \"alice\" and \"bob\" have the same API key"), "{error}");
    let twice = "[[keys]]\nkey = \"k\"\nsubject = \"alice\"\n[[keys]]\nkey = \"k\"\nsubject = \"alice\"\n";
    assert_eq!(Config::parse(twice, None).unwrap().api_keys().unwrap().len(), 2, "one subject listed twice");
    // A key is trimmed, as the key a client presents is: one with a newline (a variable
    // read from a file) still matches.
    let padded = "[[keys]]\nkey = \" k-1\\n\"\nsubject = \"alice\"\n";
    assert_eq!(Config::parse(padded, None).unwrap().api_keys().unwrap()[0].0, "k-1");
    // Key errors name the file, the subject and where the key came from.
    let file = std::path::Path::new("agentry.toml");
    let empty = "[[keys]]\nkey = \"  \"\nsubject = \"carol\"\n";
    let error = Config::parse(empty, Some(file)).unwrap().api_keys().unwrap_err().to_string();
    assert!(error.contains("agentry.toml: the key of subject \"carol\" (`key`) is empty"), "{error}");
    let unset = "[[keys]]\nkey_env = \"AGENTRY_TEST_NEVER_SET\"\nsubject = \"dan\"\n";
    let error = Config::parse(unset, Some(file)).unwrap().api_keys().unwrap_err().to_string();
    assert!(error.starts_with("invalid configuration: agentry.toml: the key of subject \"dan\""), "{error}");
}

#[tokio::test]
async fn a_value_out_of_range_or_an_agent_that_cannot_be_built_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.toml");
    std::fs::write(&path, "[runtime]\nlease_ttl_secs = 0\n").unwrap();
    let error = Config::load(&path).unwrap_err();
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");
    assert!(error.to_string().contains("runtime.lease_ttl_secs is 0"), "{error}");
    // A heartbeat of 0 keeps meaning one second.
    assert_eq!(Config::parse("[limits]\nheartbeat_secs = 0\n", None).unwrap().limits.heartbeat_secs, 0);
    std::fs::write(&path, "listen = \"127.0.0.1:0\"\n[[agents]]\nname = \"a\"\nmodel = \"nowhere\"\n")
        .unwrap();
    let mut config = Config::load(&path).unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let error = Server::start(config).await.unwrap_err();
    assert!(error.to_string().contains(&format!("{}: agent \"a\"", path.display())), "{error}");
    // A malformed spawn policy names its own file, where the line and column are.
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[roles.lead\n").unwrap();
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[[teams]]\nname = \"crew\"\nmodel = \"demo\"\nspawn_policy = {:?}\n",
        policy.display().to_string()
    );
    std::fs::write(&path, text).unwrap();
    let mut config = Config::load(&path).unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let error = Server::start(config).await.unwrap_err();
    assert!(
        error.to_string().contains(&format!("the spawn policy is invalid: {}: ", policy.display())),
        "{error}"
    );
    // A policy the configuration names must exist; and one whose budgets allow no model
    // call under the team's hold (a spawnable role's, a member's) is refused, naming both.
    let start = |policy_text: Option<&str>, team_keys: &str| {
        match policy_text {
            Some(text) => std::fs::write(&policy, text).unwrap(),
            None => std::fs::remove_file(&policy).unwrap(),
        }
        let text = format!(
            "listen = \"127.0.0.1:0\"\n[[agents]]\nname = \"helper\"\nmodel = \"demo\"\n[[teams]]\nname = \"crew\"\nmodel = \"demo\"\nspawn_policy = {:?}\n{team_keys}",
            policy.display().to_string()
        );
        std::fs::write(&path, text).unwrap();
        let mut config = Config::load(&path).unwrap();
        config.storage.path = dir.path().join("agentry.db");
        Server::start(config)
    };
    let error = start(None, "").await.unwrap_err().to_string();
    assert!(
        error.contains("does not exist (a relative path is relative to the working directory"),
        "{error}"
    );
    let spawnable = "coordinator_role = \"lead\"\n[roles.lead]\ncan_spawn = [\"worker\"]\n[roles.worker]\nbudget = { max_tokens = 500 }\n";
    let error = start(Some(spawnable), "").await.unwrap_err().to_string();
    assert!(
        error.contains("role \"worker\": budget max_tokens 500 is below the 1000 tokens held"),
        "{error}"
    );
    start(Some(spawnable), "tokens_per_step = 400\n").await.unwrap();
    let member = "[roles.helper]\nbudget = { max_steps = 0 }\n";
    let error = start(Some(member), "members = [\"helper\"]\n").await.unwrap_err().to_string();
    assert!(
        error.contains("(the budget of member \"helper\"): budget max_steps must be at least 1"),
        "{error}"
    );
    start(Some(member), "").await.unwrap();
}

#[tokio::test]
async fn a_provider_no_agent_uses_may_lack_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let text = "listen = \"127.0.0.1:0\"\n[providers.spare]\nmodel = \"m\"\napi_key_env = \"AGENTRY_TEST_SURELY_UNSET\"\n";
    let mut config = Config::parse(text, None).unwrap();
    config.storage.path = dir.path().join("agentry.db");
    Server::start(config).await.unwrap();
}

#[tokio::test]
async fn a_demo_agent_with_settings_it_would_ignore_and_a_bad_unused_provider_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let start = |text: &str| {
        let mut config = Config::parse(&format!("listen = \"127.0.0.1:0\"\n{text}"), None).unwrap();
        config.storage.path = dir.path().join("agentry.db");
        Server::start(config)
    };
    let error = start(
        "[[agents]]\nname = \"calc\"\nmodel = \"demo\"\ntools = [\"calculator\"]\nask_user_question = true\n",
    )
    .await
    .unwrap_err();
    assert!(error.to_string().contains("agent \"calc\": model `demo`"), "{error}");
    assert!(error.to_string().contains("takes no tools, ask_user_question"), "{error}");
    // A provider no agent uses is checked too, as the file is read.
    let error =
        Config::parse("[providers.spare]\nmodel = \"m\"\nbase_url = \"not a url\"\n", None).unwrap_err();
    assert!(error.to_string().contains("providers.spare.base_url is \"not a url\""), "{error}");
    assert!(!dir.path().join("agentry.db").exists(), "a refused configuration created the store");
    // A demo agent's limits apply: one model call is allowed, so a turn that needs a second
    // (after its tool call) fails.
    let (address, stop, serving) = serve({
        let mut config = Config::parse(
            "listen = \"127.0.0.1:0\"\n[[agents]]\nname = \"stuck\"\nmodel = \"demo\"\nmax_iterations = 1\n",
            None,
        )
        .unwrap();
        config.storage.path = dir.path().join("agentry.db");
        config
    })
    .await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "stuck"})).await;
    assert_eq!(status, 200, "{body}");
    let session = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    let turn = json!({"input": [{"type": "user.message", "content": "calculate 2 + 2"}], "stream": true});
    let (status, events) =
        request(address, "POST", &format!("/v1/agents/sessions/{session}/turns"), &turn).await;
    assert_eq!(status, 200, "{events}");
    assert!(events.contains("limit of 1 model call in one turn"), "{events}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_team_spawns_with_its_templates_model_and_tools_and_unknown_ones_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("spawn.toml");
    let template = |model: &str, tool: &str| {
        format!(
            "coordinator_role = \"coordinator\"\n[roles.coordinator]\ncan_spawn = [\"analyst\"]\n[roles.analyst]\n\
             [roles.analyst.templates.default]\ninstructions = \"You analyse.\"\nmodel = \"{model}\"\ntools = [\"{tool}\"]\n"
        )
    };
    let config = || {
        let text = format!(
            "listen = \"127.0.0.1:0\"\n[[teams]]\nname = \"crew\"\nmodel = \"demo\"\nspawn_policy = {:?}\n",
            policy.display().to_string()
        );
        let mut config = Config::parse(&text, None).unwrap();
        config.storage.path = dir.path().join("agentry.db");
        config
    };
    for (model, tool, problem) in [
        ("demo", "nope", "names the tool \"nope\", which is neither a built-in tool"),
        (
            "nowhere",
            "calculator",
            "names the model \"nowhere\", which is neither `demo` nor a configured provider",
        ),
        // A team's own tools are not a template's to take.
        ("demo", "spawn_agent", "names the tool \"spawn_agent\", which is neither a built-in tool"),
    ] {
        std::fs::write(&policy, template(model, tool)).unwrap();
        let error = Server::start(config()).await.unwrap_err().to_string();
        assert!(error.contains("team \"crew\": role \"analyst\", template \"default\""), "{error}");
        assert!(error.contains(problem), "{error}");
    }
    // Nor is a built-in tool a configured agent gates: a spawned instance would run it
    // unasked. (The demo agents' own rules do not count.)
    std::fs::write(&policy, template("demo", "send_email")).unwrap();
    let mut gated = config();
    let agents = "[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"mailer\"\nmodel = \"p\"\n\
                  tools = [\"send_email\"]\nrequires_approval = [\"send_email\"]\n";
    let parsed = Config::parse(agents, None).unwrap();
    (gated.providers, gated.agents) = (parsed.providers, parsed.agents);
    let error = Server::start(gated).await.unwrap_err().to_string();
    assert!(
        error.contains("names the tool \"send_email\", which agent \"mailer\" runs only with approval"),
        "{error}"
    );
    let (_address, stop, serving) = serve(config()).await;
    stop.send(()).unwrap();
    serving.await.unwrap();
    // Beside the analyst: a role the coordinator may not spawn, and one allowing no instance.
    let more = "[roles.orphan]\n[roles.orphan.templates.default]\ninstructions = \"x\"\n\
                [roles.lazy]\nmax_instances = 0\n[roles.lazy.templates.default]\ninstructions = \"x\"\n";
    let policy_text = template("demo", "calculator")
        .replace("can_spawn = [\"analyst\"]", "can_spawn = [\"analyst\", \"lazy\"]");
    std::fs::write(&policy, format!("{policy_text}{more}")).unwrap();
    let (address, stop, serving) = serve(config()).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "crew"})).await;
    assert_eq!(status, 200, "{body}");
    let session = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    // A role or a template the policy does not have is refused at once, naming what it has.
    for (spawn, param, named) in [
        (
            json!({"session_id": session, "role": "auditor", "task": "x"}),
            "role",
            "the roles it can spawn: analyst)",
        ),
        (
            json!({"session_id": session, "role": "orphan", "task": "x"}),
            "role",
            "may not spawn role \"orphan\"",
        ),
        (json!({"session_id": session, "role": "lazy", "task": "x"}), "role", "allows no instances"),
        // The coordinator's role has no template: it is never spawned.
        (
            json!({"session_id": session, "role": "coordinator", "task": "x"}),
            "role",
            "no role \"coordinator\" to spawn",
        ),
        (
            json!({"session_id": session, "role": "analyst", "task": "x", "template": "deep"}),
            "template",
            "its templates: default",
        ),
    ] {
        let (status, body) = request(address, "POST", "/v1/agent-team/spawn", &spawn).await;
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!((status, &error["error"]["param"]), (400, &json!(param)), "{body}");
        assert!(error["error"]["message"].as_str().unwrap().contains(named), "{body}");
    }
    let spawn = json!({"session_id": session, "role": "analyst", "task": "Look into it."});
    let (status, body) = request(address, "POST", "/v1/agent-team/spawn", &spawn).await;
    assert_eq!(status, 202, "{body}");
    let turn = serde_json::from_str::<Value>(&body).unwrap()["turnID"].as_str().unwrap().to_owned();
    let subscribe = format!("/v1/agents/sessions/{session}/turns/{turn}/subscribe");
    let (status, events) = request(address, "POST", &subscribe, &json!({"after_sequence_number": 0})).await;
    assert_eq!(status, 200, "{events}");
    // The instance ran on its thread, on the template's model, and answered the spawn.
    assert!(events.contains(r#""name":"analyst-"#), "{events}");
    assert!(events.contains("The analyst instance answered: Hello from the demo model."), "{events}");
    assert!(!events.contains("spawn denied"), "{events}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn an_unknown_member_provider_or_gated_tool_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse(
        "listen = \"127.0.0.1:0\"\n[[teams]]\nname = \"crew\"\nmodel = \"demo\"\nmembers = [\"ghost\"]\n",
        None,
    )
    .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let error = Server::start(config).await.unwrap_err();
    assert!(error.to_string().contains("member \"ghost\" is not a configured agent"), "{error}");
    let mut config =
        Config::parse("listen = \"127.0.0.1:0\"\n[[agents]]\nname = \"a\"\nmodel = \"nowhere\"\n", None)
            .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let error = Server::start(config).await.unwrap_err();
    assert!(error.to_string().contains("neither `demo` nor a configured provider"), "{error}");
    // A misspelt gated tool would gate nothing: the tool would run without approval.
    let mut config = Config::parse(
        "listen = \"127.0.0.1:0\"\n[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"mailer\"\nmodel = \"p\"\n\
         tools = [\"send_email\"]\nrequires_approval = [\"send-email\"]\n",
        None,
    )
    .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let error = Server::start(config).await.unwrap_err();
    assert!(
        error.to_string().contains(
            "agent \"mailer\": requires_approval names \"send-email\", which is none of its tools (send_email)"
        ),
        "{error}"
    );
    assert!(!dir.path().join("agentry.db").exists(), "a refused configuration created the store");
}

#[tokio::test]
async fn an_mcp_server_inheriting_an_unset_variable_or_an_http_one_given_variables_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (server, named) in [
        (
            "command = \"node\"\ninherit_env = [\"AGENTRY_TEST_SURELY_UNSET\"]\n",
            "MCP server \"tools\" inherits $AGENTRY_TEST_SURELY_UNSET, which is not set",
        ),
        (
            "url = \"http://127.0.0.1:9/mcp\"\nenv = { A = \"b\" }\n",
            "`env` and `inherit_env` apply to stdio servers (`command`) only",
        ),
    ] {
        let text = format!(
            "listen = \"127.0.0.1:0\"\n[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"a\"\nmodel = \"p\"\n\
             [[agents.mcp]]\nname = \"tools\"\n{server}"
        );
        let mut config = Config::parse(&text, None).unwrap();
        config.storage.path = dir.path().join("agentry.db");
        let error = Server::start(config).await.unwrap_err();
        assert!(error.to_string().contains(named), "{error}");
    }
    assert!(!dir.path().join("agentry.db").exists(), "a refused configuration created the store");
}

#[tokio::test]
async fn a_taken_address_is_refused_before_the_store_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = config_at(&dir.path().join("agentry.db"), "");
    config.listen = taken.local_addr().unwrap();
    let error = Server::start(config).await.unwrap_err();
    assert!(matches!(error, agentry_server::ServerError::Bind { .. }), "{error}");
    assert!(!dir.path().join("agentry.db").exists(), "a start that could not bind created the store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redb_backend_serves_turns_and_keeps_them_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.redb");
    let config = || config_at(&path, "backend = \"redb\"\n");
    let (address, stop, serving) = serve(config()).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
    assert_eq!(status, 200, "{body}");
    let session: Value = serde_json::from_str(&body).unwrap();
    let id = session["data"]["id"].as_str().unwrap().to_owned();
    let turn = json!({"input": [{"type": "user.message", "content": "calculate 6 * 7"}], "stream": true});
    let (status, events) = request(address, "POST", &format!("/v1/agents/sessions/{id}/turns"), &turn).await;
    assert_eq!(status, 200);
    assert!(events.contains(r#""content":"The result is 42.""#), "{events}");
    stop.send(()).unwrap();
    serving.await.unwrap();

    // A second server on the same file sees the session and its turn.
    let (address, stop, serving) = serve(config()).await;
    let (status, body) =
        request(address, "GET", &format!("/v1/agents/sessions/{id}/turns"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let turns: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(turns["data"][0]["state"]["status"], "done");
    assert_eq!(turns["data"][0]["state"]["output"]["content"], "The result is 42.");
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving).await.unwrap().unwrap();
}

/// The text of the `model.message.delta` events of an SSE body from [`request`], and how many
/// there were.
fn delta_text(events: &str) -> (String, usize) {
    let deltas: Vec<Value> = events
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|event| event["type"] == "model.message.delta")
        .collect();
    (deltas.iter().filter_map(|delta| delta["content"].as_str()).collect(), deltas.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_configured_delta_budget_a_replay_gets_fewer_deltas_with_the_same_text() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config::parse("listen = \"127.0.0.1:0\"\n[runtime]\nlive_delta_budget_bytes = 0\n", None).unwrap();
    assert_eq!(config.runtime.live_delta_budget_bytes, 0);
    config.storage.path = dir.path().join("agentry.db");
    let (address, stop, serving) = serve(config).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
    assert_eq!(status, 200, "{body}");
    let session = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    let message = "y".repeat(400);
    let turn = json!({"input": [{"type": "user.message", "content": message}], "stream": true});
    let (status, live) =
        request(address, "POST", &format!("/v1/agents/sessions/{session}/turns"), &turn).await;
    assert_eq!(status, 200, "{live}");
    let turn_id = serde_json::from_str::<Value>(live.lines().next().unwrap()).unwrap()["turn_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let subscribe = format!("/v1/agents/sessions/{session}/turns/{turn_id}/subscribe");
    let (status, replay) = request(address, "POST", &subscribe, &json!({"after_sequence_number": 0})).await;
    assert_eq!(status, 200, "{replay}");
    // The demo streams its echo in deltas of 4 characters: 102 of them here. With the
    // smallest budget, a reader that is behind (even the turn's own stream) gets them merged.
    let ((live_text, _), (replay_text, replay_deltas)) = (delta_text(&live), delta_text(&replay));
    assert_eq!(live_text, format!("Echo: {message}"));
    assert_eq!(replay_text, live_text);
    assert!(replay_deltas < 10, "{replay_deltas} deltas replayed");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_or_lacks_a_field_gets_an_error_saying_which() {
    let dir = tempfile::tempdir().unwrap();
    let (address, stop, serving) = serve(config_at(&dir.path().join("agentry.db"), "")).await;
    let post = |body: &'static str| async move {
        let raw = format!(
            "POST /v1/agents/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let answer = raw_exchange(address, &raw).await;
        let status: u16 = answer.split_whitespace().nth(1).unwrap().parse().unwrap();
        let error: Value = serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        (status, error["error"]["param"].clone(), error["error"]["message"].as_str().unwrap().to_owned())
    };
    // Cut short: the JSON is at fault, not the field it stopped in.
    let (status, param, message) = post(r#"{"agent_name":"#).await;
    assert_eq!((status, &param), (400, &Value::Null), "{message}");
    assert!(message.starts_with("the request body is not valid JSON: EOF"), "{message}");
    let (status, param, message) = post(r#"{"agent_name": demo}"#).await;
    assert_eq!((status, &param), (400, &Value::Null), "{message}");
    assert!(message.starts_with("the request body is not valid JSON"), "{message}");
    // Empty, or without the field: the field is named.
    for body in ["", "{}"] {
        let (status, param, message) = post(body).await;
        assert_eq!((status, param), (400, json!("agent_name")), "{message}");
        assert_eq!(message, "the request body has no `agent_name`, which is required");
    }
    // A value of the wrong type: named at its field.
    let (status, param, message) = post(r#"{"agent_name": 42}"#).await;
    assert_eq!((status, param), (400, json!("agent_name")), "{message}");
    let _ = stop.send(());
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turns_listing_takes_an_order_and_bad_paths_get_json_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (address, stop, serving) = serve(config_at(&dir.path().join("agentry.db"), "")).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
    assert_eq!(status, 200, "{body}");
    let session = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    for text in ["one", "two", "three"] {
        let turn = json!({"input": [{"type": "user.message", "content": text}], "stream": true});
        let (status, events) =
            request(address, "POST", &format!("/v1/agents/sessions/{session}/turns"), &turn).await;
        assert_eq!(status, 200, "{events}");
    }
    let listed = |order: &'static str| {
        let path = format!("/v1/agents/sessions/{session}/turns?order={order}");
        async move {
            let (status, body) = request(address, "GET", &path, &json!({})).await;
            let body: Value = serde_json::from_str(&body).unwrap();
            let ids: Vec<String> = body["data"]
                .as_array()
                .map(|turns| turns.iter().map(|turn| turn["id"].as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            (status, ids, body)
        }
    };
    let (status, newest_first, _) = listed("desc").await;
    assert_eq!((status, newest_first.len()), (200, 3));
    let (status, mut oldest_first, _) = listed("asc").await;
    assert_eq!(status, 200);
    oldest_first.reverse();
    assert_eq!(oldest_first, newest_first);
    let (status, _, body) = listed("sideways").await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("order")), "{body}");
    // A path segment that is not UTF-8 is refused by axum itself: still a JSON error body.
    let (status, body) = request(address, "GET", "/v1/agents/sessions/%FF%FE/turns", &json!({})).await;
    let body: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_request")), "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|message| message.contains("UTF-8")), "{body}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_file_removed_under_the_server_makes_it_not_ready_and_refuse_writes() {
    for backend in ["sqlite", "redb"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentry.db");
        let (address, stop, serving) = serve(config_at(&path, &format!("backend = \"{backend}\"\n"))).await;
        let (status, body) = request(address, "GET", "/readyz", &json!({})).await;
        assert_eq!(status, 200, "{body}");
        std::fs::remove_file(&path).unwrap();
        let (status, body) = request(address, "GET", "/readyz", &json!({})).await;
        assert_eq!(status, 503, "{backend}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["code"], "not_ready", "{backend}: {body}");
        // A write would be acknowledged and lost with the process: it is refused.
        let (status, body) =
            request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
        assert_eq!(status, 503, "{backend}: a write to the removed file was acknowledged: {body}");
        stop.send(()).unwrap();
        serving.await.unwrap();
    }
}

#[tokio::test]
async fn without_keys_only_loopback_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse("listen = \"0.0.0.0:0\"\n", None).unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let server = Server::start(config).await.unwrap();
    assert!(server.local_addr().ip().is_loopback(), "{}", server.local_addr());
}

#[tokio::test]
async fn without_keys_requests_from_web_pages_or_for_other_hosts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse("listen = \"127.0.0.1:0\"\n", None).unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let (address, stop, serving) = serve(config).await;
    // A plain-text POST, as any site's page may send without a CORS preflight.
    let post = |headers: &str| {
        let body = r#"{"agent_name": "demo"}"#;
        format!(
            "POST /v1/agents/sessions HTTP/1.1\r\n{headers}Connection: close\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let status_of = |raw: String| async move {
        let answer = raw_exchange(address, &raw).await;
        (answer.split_whitespace().nth(1).unwrap().to_owned(), answer)
    };
    for refused in [
        "Host: 127.0.0.1\r\nOrigin: http://evil.example\r\n",
        "Host: evil.example:8787\r\n",
        "Host: 127.0.0.1\r\nOrigin: null\r\n",
    ] {
        let (status, answer) = status_of(post(refused)).await;
        assert_eq!(status, "403", "{refused:?}: {answer}");
        assert!(answer.contains("configure API keys"), "{answer}");
    }
    // Every route: a rebound page reads no metrics either.
    let (status, answer) =
        status_of("GET /metrics HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n".to_owned())
            .await;
    assert_eq!(status, "403", "{answer}");
    for allowed in [
        "Host: localhost:8787\r\nOrigin: http://localhost:3000\r\n",
        "Host: [::1]:8787\r\nOrigin: http://127.0.0.1:5173\r\n",
        "Host: 127.0.0.1\r\n",
    ] {
        let (status, answer) = status_of(post(allowed)).await;
        assert_eq!(status, "200", "{allowed:?}: {answer}");
    }
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn a_key_is_required_when_keys_are_configured() {
    let dir = tempfile::tempdir().unwrap();
    let mut config =
        Config::parse("listen = \"127.0.0.1:0\"\n[[keys]]\nkey = \"k-123\"\nsubject = \"alice\"\n", None)
            .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let (address, stop, serving) = serve(config).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
    assert_eq!(status, 401);
    let error: Value = serde_json::from_str(&body).unwrap();
    assert!(error["error"]["message"].as_str().unwrap().contains("missing API key"));
    // The 401 names the scheme (RFC 9110).
    let answer = raw_exchange(
        address,
        "GET /v1/agents/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    let head = answer.split("\r\n\r\n").next().unwrap().to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 401") && head.contains("\r\nwww-authenticate: bearer"), "{head}");
    // The scheme is case-insensitive (RFC 9110 §11.1); the key is not.
    for (scheme, key, expected) in
        [("BEARER", "k-123", "200"), ("bearer", "k-123", "200"), ("Bearer", "K-123", "401")]
    {
        let head = format!(
            "GET /v1/agents/sessions?agent_name=demo HTTP/1.1\r\nHost: test\r\nAuthorization: {scheme} {key}\r\nConnection: close\r\n\r\n"
        );
        let answer = raw_exchange(address, &head).await;
        assert!(answer.starts_with(&format!("HTTP/1.1 {expected}")), "{scheme} {key}: {answer}");
    }
    let (status, _) = request(address, "GET", "/healthz", &json!({})).await;
    assert_eq!(status, 200, "health needs no key");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

/// `GET /metrics` with a raw request, optionally with a key: the status line's code.
async fn metrics_status(address: SocketAddr, key: Option<&str>) -> String {
    let authorization = key.map(|key| format!("Authorization: Bearer {key}\r\n")).unwrap_or_default();
    let head =
        format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n{authorization}Connection: close\r\n\r\n");
    raw_exchange(address, &head).await.split(' ').nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn with_keys_metrics_take_a_key_unless_made_public() {
    let keys = "listen = \"127.0.0.1:0\"\n[[keys]]\nkey = \"k-123\"\nsubject = \"alice\"\n";
    for (public, without_key) in [(false, "401"), (true, "200")] {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("public_metrics = {public}\n{keys}");
        let mut config = Config::parse(&text, None).unwrap();
        config.storage.path = dir.path().join("agentry.db");
        let (address, stop, serving) = serve(config).await;
        assert_eq!(metrics_status(address, None).await, without_key, "public_metrics = {public}");
        assert_eq!(metrics_status(address, Some("wrong")).await, if public { "200" } else { "401" });
        assert_eq!(metrics_status(address, Some("k-123")).await, "200");
        stop.send(()).unwrap();
        serving.await.unwrap();
    }
}

/// A caller's event streams are capped (`limits.streams_per_subject`): one more is 429
/// `too_many_streams`, and a streamed turn refused so is never created; other callers
/// are not affected, and a stream closed gives its slot back.
#[tokio::test]
async fn a_caller_may_have_only_so_many_event_streams_open() {
    let dir = tempfile::tempdir().unwrap();
    let text = "listen = \"127.0.0.1:0\"\n[limits]\nstreams_per_subject = 2\nheartbeat_secs = 1\n\
                [[keys]]\nkey = \"k-alice\"\nsubject = \"alice\"\n[[keys]]\nkey = \"k-bob\"\nsubject = \"bob\"\n";
    let mut config = Config::parse(text, None).unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let (address, stop, serving) = serve(config).await;
    // A feed kept open: the connection, once its response's head is read.
    let open_feed = |key: &'static str| async move {
        let mut stream = TcpStream::connect(address).await.unwrap();
        let head = format!(
            "GET /global/event HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut reader = BufReader::new(stream);
        let mut status = String::new();
        reader.read_line(&mut status).await.unwrap();
        (status, reader)
    };
    let first = open_feed("k-alice").await;
    let second = open_feed("k-alice").await;
    assert!(first.0.starts_with("HTTP/1.1 200") && second.0.starts_with("HTTP/1.1 200"), "{first:?}");
    let (refused, mut body) = open_feed("k-alice").await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    let mut rest = String::new();
    let _ = body.read_to_string(&mut rest).await;
    assert!(rest.contains("\"code\":\"too_many_streams\""), "{rest}");
    // A streamed turn refused is not created.
    let post = |path: String, body: Value| async move {
        let body = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k-alice\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        raw_exchange(address, &head).await
    };
    let created = post("/v1/agents/sessions".to_owned(), json!({"agent_name": "demo"})).await;
    let session: Value = serde_json::from_str(created.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let id = session["data"]["id"].as_str().unwrap().to_owned();
    let turn_body = json!({"input": [{"type": "user.message", "content": "hi"}], "stream": true});
    let turn = post(format!("/v1/agents/sessions/{id}/turns"), turn_body).await;
    assert!(turn.starts_with("HTTP/1.1 429"), "{turn}");
    let turns = raw_exchange(
        address,
        &format!(
            "GET /v1/agents/sessions/{id}/turns HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k-alice\r\n\
             Connection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(turns.contains("\"data\":[]"), "no turn was created: {turns}");
    // Another caller's streams are its own.
    let bobs = open_feed("k-bob").await;
    assert!(bobs.0.starts_with("HTTP/1.1 200"), "{bobs:?}");
    // Closed, a stream gives its slot back once the server notices (at its next write: a
    // heartbeat, every second here).
    drop(first);
    let mut tries = 0;
    loop {
        let (status, _reader) = open_feed("k-alice").await;
        if status.starts_with("HTTP/1.1 200") {
            break;
        }
        tries += 1;
        assert!(tries < 200, "the slot came back: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop((second, bobs));
    stop.send(()).unwrap();
    serving.await.unwrap();
}

/// Every session titled `title`, with its number of runs, read from the store file.
async fn titled(path: &std::path::Path, title: &str) -> Vec<usize> {
    use agentry_memory::{PageRequest, RunQuery, RunStore, SessionQuery, SessionStore};
    let store =
        agentry_storage_sqlite::SqliteStore::open(path, agentry_storage_sqlite::SqliteOptions::default())
            .unwrap();
    let (mut found, mut page) = (Vec::new(), PageRequest::first(500));
    loop {
        let sessions = store.list_sessions(&SessionQuery::default(), &page).await.unwrap();
        for session in sessions.items.iter().filter(|session| session.title.as_deref() == Some(title)) {
            let runs =
                store.list_runs(session.id, &RunQuery::default(), &PageRequest::first(100)).await.unwrap();
            found.push(runs.items.len());
        }
        match sessions.next_token {
            Some(token) => page = PageRequest::after(token, 500),
            None => return found,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agui_thread_continues_its_session_after_a_restart_behind_a_thousand_newer_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.db");
    let config = || config_at(&path, "durability = \"relaxed\"\n");
    let agui = |thread: &str, run: &str, text: &str| json!({"threadId": thread, "runId": run, "messages": [{"id": run, "role": "user", "content": text}]});
    let (address, stop, serving) = serve(config()).await;
    let (status, events) = request(address, "POST", "/agui/demo", &agui("thread-1", "r1", "first")).await;
    assert_eq!(status, 200, "{events}");
    assert!(events.contains("RUN_FINISHED"), "{events}");
    // More newer sessions of the agent than a title search looks through, and one titled
    // like a new thread (made through the sessions API: not that thread's).
    for _ in 0..1000 {
        let (status, body) =
            request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
        assert_eq!(status, 200, "{body}");
    }
    let lookalike = json!({"agent_name": "demo", "title": "new-thread"});
    assert_eq!(request(address, "POST", "/v1/agents/sessions", &lookalike).await.0, 200);
    stop.send(()).unwrap();
    serving.await.unwrap();
    {
        // A thread begun by a build before derived session ids: its session has a random id
        // and the thread's title, and was created before such builds were replaced.
        use agentry_memory::SessionStore;
        let store = agentry_storage_sqlite::SqliteStore::open(
            &path,
            agentry_storage_sqlite::SqliteOptions::default(),
        )
        .unwrap();
        let subject = agentry_types::Subject {
            subject_id: "local".to_owned(),
            subject_type: "user".to_owned(),
            subject_slug: "local".to_owned(),
        };
        let mut legacy =
            agentry_types::SessionRecord::new(agentry_types::SessionType::Agent, "demo", subject);
        legacy.title = Some("legacy-thread".to_owned());
        legacy.created_at = "2026-11-22T12:00:00Z".parse().unwrap();
        legacy.updated_at = legacy.created_at;
        store.create_session(&legacy).await.unwrap();
    }

    let (address, stop, serving) = serve(config()).await;
    for (thread, run) in [("thread-1", "r2"), ("legacy-thread", "r3"), ("new-thread", "r4")] {
        let (status, events) = request(address, "POST", "/agui/demo", &agui(thread, run, "again")).await;
        assert_eq!(status, 200, "{events}");
        assert!(events.contains("Echo: again"), "{events}");
    }
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving).await.unwrap().unwrap();
    // One session per thread, holding every run of it.
    assert_eq!(titled(&path, "thread-1").await, [2]);
    assert_eq!(titled(&path, "legacy-thread").await, [1]);
    // The look-alike keeps no run; the new thread has a session of its own.
    let mut lookalikes = titled(&path, "new-thread").await;
    lookalikes.sort_unstable();
    assert_eq!(lookalikes, [0, 1]);
}

/// A loopback OpenAI-compatible provider answering each request with the next of
/// `replies` (a whole HTTP response), and recording each request (head and body).
async fn fake_provider(replies: Vec<String>) -> (SocketAddr, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let requests = std::sync::Arc::clone(&recorded);
    tokio::spawn(async move {
        let mut replies = replies.into_iter();
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let mut reader = BufReader::new(stream);
            let mut head = String::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).await.unwrap() == 0 || line == "\r\n" {
                    break;
                }
                if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = value.trim().parse().unwrap();
                }
                head.push_str(&line);
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).await.unwrap();
            requests.lock().unwrap().push(format!("{head}\r\n{}", String::from_utf8_lossy(&body)));
            let reply = replies.next().unwrap_or_else(|| "HTTP/1.1 599 No reply left\r\n\r\n".to_owned());
            let mut stream = reader.into_inner();
            stream.write_all(reply.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
        }
    });
    (address, recorded)
}

/// A `200 OK` event stream of these `data:` payloads, closed after them.
fn sse_reply(events: &[&str]) -> String {
    let body: String = events.iter().map(|data| format!("data: {data}\n\n")).collect();
    format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{body}")
}

/// A streamed reply making one tool call.
fn call_reply(id: &str, name: &str, arguments: &str) -> String {
    let arguments = serde_json::to_string(arguments).unwrap();
    sse_reply(&[
        &format!(
            r#"{{"choices":[{{"index":0,"delta":{{"tool_calls":[{{"index":0,"id":"{id}","type":"function","function":{{"name":"{name}","arguments":{arguments}}}}}]}},"finish_reason":"tool_calls"}}]}}"#
        ),
        "[DONE]",
    ])
}

/// A streamed reply answering `text`.
fn answer_reply(text: &str) -> String {
    sse_reply(&[
        &format!(r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":"stop"}}]}}"#),
        "[DONE]",
    ])
}

/// `reply` (a streamed one) with the usage a provider reports in its last chunk.
fn with_usage(reply: &str, total_tokens: u64) -> String {
    let usage = format!(
        r#"{{"choices":[],"usage":{{"prompt_tokens":{total_tokens},"completion_tokens":0,"total_tokens":{total_tokens}}}}}"#
    );
    reply.replace("data: [DONE]", &format!("data: {usage}\n\ndata: [DONE]"))
}

/// Starts a server on the configuration `text`, stored in `dir`.
async fn serve_text(
    dir: &std::path::Path,
    text: &str,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let mut config = Config::parse(text, None).unwrap();
    config.storage.path = dir.join("agentry.db");
    serve(config).await
}

/// Opens a session with `agent` and runs one streamed turn saying `content`: the
/// session's id and the turn's stream.
async fn streamed_turn(address: SocketAddr, agent: &str, content: &str) -> (String, String) {
    let (status, body) = request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": agent})).await;
    assert_eq!(status, 200, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    let turn = json!({"input": [{"type": "user.message", "content": content}], "stream": true});
    let (status, events) = request(address, "POST", &format!("/v1/agents/sessions/{id}/turns"), &turn).await;
    assert_eq!(status, 200, "{events}");
    (id, events)
}

/// `GET path`, answered 200 with JSON: the document, and its text for messages.
async fn get_ok(address: SocketAddr, path: &str) -> (Value, String) {
    let (status, body) = request(address, "GET", path, &json!({})).await;
    assert_eq!(status, 200, "{body}");
    (serde_json::from_str(&body).unwrap(), body)
}

/// A mission's usage counts each model call once: an instance's own ledger also holds
/// what the instances it spawned used (its budget bounds theirs), so adding up the
/// instances' usage counted a spawned instance's calls once for it and once for each
/// instance above it.
#[tokio::test]
async fn a_missions_usage_counts_each_model_call_once_however_deep_its_instances_spawn() {
    let dir = tempfile::tempdir().unwrap();
    let spawn = |id: &str, role: &str| {
        call_reply(
            id,
            "spawn_agent",
            &json!({"role": role, "task": "Do it.", "justification": "Needed."}).to_string(),
        )
    };
    let (provider, requests) = fake_provider(vec![
        with_usage(&spawn("call_lead", "manager"), 5),
        with_usage(&spawn("call_manager", "worker"), 20),
        with_usage(&answer_reply("Worked."), 100),
        with_usage(&answer_reply("Managed."), 10),
        with_usage(&answer_reply("All done."), 1),
    ])
    .await;
    let policy = dir.path().join("spawn-policy.toml");
    std::fs::write(
        &policy,
        "coordinator_role = \"lead\"\n[roles.lead]\ncan_spawn = [\"manager\"]\n\
         [roles.manager]\ncan_spawn = [\"worker\"]\n[roles.manager.templates.default]\ninstructions = \"You manage.\"\nmodel = \"fake\"\n\
         [roles.worker]\n[roles.worker.templates.default]\ninstructions = \"You work.\"\nmodel = \"fake\"\n",
    )
    .unwrap();
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[providers.fake]\nmodel = \"fake-model\"\nbase_url = \"http://{provider}/v1\"\n\
         [[teams]]\nname = \"crew\"\nmodel = \"fake\"\nspawn_policy = {:?}\n",
        policy.display().to_string()
    );
    let (address, stop, serving) = serve_text(dir.path(), &text).await;
    let (_, events) = streamed_turn(address, "crew", "Go.").await;
    assert!(events.contains("All done."), "{events}");
    assert_eq!(requests.lock().unwrap().len(), 5, "every scripted reply was asked for: {events}");
    let (instances, body) = get_ok(address, "/v1/agent-team/instances").await;
    let roles: Vec<&str> =
        instances["data"].as_array().unwrap().iter().map(|item| item["role"].as_str().unwrap()).collect();
    assert_eq!(roles.len(), 2, "a manager and the worker it spawned: {body}");
    let (missions, body) = get_ok(address, "/v1/agent-team/missions").await;
    let mission = &missions["data"][0];
    assert_eq!(mission["instances"], json!(2), "{body}");
    // The manager's two calls and the worker's one; the coordinator's own are the turn's.
    assert_eq!(mission["stepsUsed"], json!(3), "{body}");
    assert_eq!(mission["tokensUsed"], json!(20 + 100 + 10), "{body}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn an_agents_memory_is_configured_in_its_file_and_summaries_reach_the_next_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, requests) = fake_provider(vec![
        answer_reply("Noted."),
        answer_reply("Ann likes green tea."),
        answer_reply("You like green tea."),
        answer_reply("Ann likes green tea, and asked what she likes."),
    ])
    .await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[providers.fake]\nmodel = \"fake-model\"\nbase_url = \"http://{provider}/v1\"\n\
         [[agents]]\nname = \"rememberer\"\nmodel = \"fake\"\ninstructions = \"Be brief.\"\n\
         [agents.memory]\nnum_last_messages = 10\nsummary_memory = true\n"
    );
    let (address, stop, serving) = serve_text(dir.path(), &text).await;
    let (session, events) = streamed_turn(address, "rememberer", "I am Ann and I like green tea.").await;
    assert!(events.contains("Noted."), "{events}");
    assert_eq!(requests.lock().unwrap().len(), 2, "the answer, then the summary");
    let turn = json!({"input": [{"type": "user.message", "content": "What do I like?"}], "stream": true});
    let (status, events) =
        request(address, "POST", &format!("/v1/agents/sessions/{session}/turns"), &turn).await;
    assert_eq!(status, 200, "{events}");
    assert!(events.contains("You like green tea."), "{events}");
    let sent = requests.lock().unwrap().clone();
    assert_eq!(sent.len(), 4, "an answer and a summary per turn");
    // The second turn's request carries the summary the first turn's memory update wrote.
    assert!(sent[2].contains("Ann likes green tea."), "{}", sent[2]);
    stop.send(()).unwrap();
    serving.await.unwrap();
    for (memory, problem) in [
        ("summary_memory = true\nmodel = \"demo\"\n", "memory.model is `demo`"),
        (
            "summary_memory = true\nmodel = \"nowhere\"\n",
            "memory.model \"nowhere\" is not a configured provider",
        ),
        ("model = \"nowhere\"\n", "memory.model \"nowhere\" is not a configured provider"),
        ("full_session_memory = true\n", "full_session_memory"),
        ("user_memory_mode = \"sometimes\"\n", "sometimes"),
        ("remember_everything = true\n", "remember_everything"),
    ] {
        let text = format!(
            "[providers.fake]\nmodel = \"m\"\n[[agents]]\nname = \"a\"\nmodel = \"fake\"\n[agents.memory]\n{memory}"
        );
        let error = match Config::parse(&text, None) {
            Ok(mut config) => {
                config.storage.path = dir.path().join("refused.db");
                Server::start(config).await.map(|_| ()).unwrap_err().to_string()
            }
            Err(error) => error.to_string(),
        };
        assert!(error.contains(problem), "{memory}: {error}");
    }
}

#[tokio::test]
async fn a_configured_provider_gets_its_headers_and_retries_and_its_odd_streams_are_understood() {
    let dir = tempfile::tempdir().unwrap();
    let failure = r#"{"error":{"message":"upstream hiccup"}}"#;
    let (provider, requests) = fake_provider(vec![
        format!("HTTP/1.1 503 Busy\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{failure}", failure.len()),
        // A proxy numbering its one tool call from 1, with no finish reason before `[DONE]`.
        sse_reply(&[
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_x","type":"function","function":{"name":"calculator","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"expression\":\"6 * 7\"}"}}]}}]}"#,
            "[DONE]",
        ]),
        // An answer ended by `[DONE]` only.
        sse_reply(&[r#"{"choices":[{"index":0,"delta":{"content":"The answer is 42."}}]}"#, "[DONE]"]),
    ])
    .await;
    let mut config = Config::parse(
        &format!(
            "listen = \"127.0.0.1:0\"\n[providers.fake]\nmodel = \"fake-model\"\nbase_url = \"http://{provider}/v1\"\n\
             max_retries = 1\nheaders = {{ \"X-Title\" = \"agentry-test\" }}\n\
             [[agents]]\nname = \"calc\"\nmodel = \"fake\"\ntools = [\"calculator\"]\n"
        ),
        None,
    )
    .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let (address, stop, serving) = serve(config).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "calc"})).await;
    assert_eq!(status, 200, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    let turn = json!({"input": [{"type": "user.message", "content": "What is 6 * 7?"}], "stream": true});
    let (status, events) = request(address, "POST", &format!("/v1/agents/sessions/{id}/turns"), &turn).await;
    assert_eq!(status, 200);
    assert!(events.contains(r#""type":"tool.response""#) && events.contains(r#""content":"42""#), "{events}");
    assert!(events.contains(r#""status":"done""#) && events.contains("The answer is 42."), "{events}");
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3, "the 503 is retried once, then two model calls");
    for request in &requests {
        assert!(request.to_ascii_lowercase().contains("x-title: agentry-test"), "{request}");
    }
    // The tool call went back to the provider under its id, with its result.
    assert!(requests[2].contains(r#""tool_call_id":"call_x""#), "{}", requests[2]);
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn a_member_paused_for_approval_is_listed_paused_and_its_cancel_says_how_to_end_it() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, _requests) = fake_provider(vec![
        call_reply(
            "call_lead",
            "delegate_task_to_member",
            r#"{"member_id":"mailer","task":"Mail the team."}"#,
        ),
        call_reply("call_mail", "send_email", r#"{"to":"team@example.com","subject":"Hi","body":"Hello."}"#),
        answer_reply("Mailed."),
        answer_reply("The team is mailed."),
    ])
    .await;
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[providers.fake]\nmodel = \"fake-model\"\nbase_url = \"http://{provider}/v1\"\n\
         [[agents]]\nname = \"mailer\"\nmodel = \"fake\"\ntools = [\"send_email\"]\nrequires_approval = [\"send_email\"]\n\
         [[teams]]\nname = \"crew\"\nmodel = \"fake\"\nmembers = [\"mailer\"]\n"
    );
    let (address, stop, serving) = serve_text(dir.path(), &text).await;
    let (id, events) = streamed_turn(address, "crew", "Mail the team.").await;
    assert!(events.contains("tool.approval_required"), "{events}");
    let (status, body) = request(address, "GET", "/v1/agent-team/instances?status=running", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["data"], json!([]), "none runs: {body}");
    let (status, body) = request(address, "GET", "/v1/agent-team/instances?status=paused", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let listed = serde_json::from_str::<Value>(&body).unwrap();
    let instance =
        listed["data"][0]["instanceID"].as_str().expect("the paused member is listed paused").to_owned();
    let mission = listed["data"][0]["missionID"].as_str().unwrap().to_owned();
    let (status, body) = request(address, "GET", "/v1/agent-team/missions?status=paused", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let paused = serde_json::from_str::<Value>(&body).unwrap();
    assert_eq!(paused["data"][0]["missionID"], json!(mission), "its mission waits too: {body}");
    let (status, body) =
        request(address, "POST", &format!("/v1/agent-team/missions/{mission}/cancel"), &json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["error"]["code"], "mission_paused", "{body}");
    let (status, body) =
        request(address, "POST", &format!("/v1/agent-team/instances/{instance}/cancel"), &json!({})).await;
    assert_eq!(status, 409, "{body}");
    let error = serde_json::from_str::<Value>(&body).unwrap();
    assert_eq!(error["error"]["code"], "instance_paused", "{body}");
    assert!(error["error"]["message"].as_str().unwrap().contains("deny the approval"), "{body}");

    // Approved, it goes on as the same instance in the next turn's mission, which counts
    // only the model call it made there (its ledger holds both turns').
    let asked = events.lines().find(|line| line.contains("tool.approval_required")).unwrap();
    let thread = serde_json::from_str::<Value>(asked).unwrap()["thread_id"].as_str().unwrap().to_owned();
    let approve = json!({"input": [{"type": "user.tool_approval", "thread_id": thread, "tool_call_id": "call_mail",
        "approval": {"status": "allow"}}], "stream": true});
    let (status, events) =
        request(address, "POST", &format!("/v1/agents/sessions/{id}/turns"), &approve).await;
    assert_eq!(status, 200);
    assert!(events.contains("The team is mailed."), "{events}");
    let (status, body) = request(address, "GET", "/v1/agent-team/instances", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let listed = serde_json::from_str::<Value>(&body).unwrap();
    let ids: Vec<(&str, &str)> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| (item["instanceID"].as_str().unwrap(), item["status"].as_str().unwrap()))
        .collect();
    assert_eq!(ids, [(instance.as_str(), "completed")]);
    let (status, body) = request(address, "GET", "/v1/agent-team/missions", &json!({})).await;
    assert_eq!(status, 200, "{body}");
    let missions = serde_json::from_str::<Value>(&body).unwrap();
    let steps: Vec<u64> =
        missions["data"].as_array().unwrap().iter().map(|m| m["stepsUsed"].as_u64().unwrap_or(0)).collect();
    assert_eq!(steps, [1, 1], "{body}");
    // The mission that paused is over once the next turn took its member up.
    let statuses: Vec<&str> =
        missions["data"].as_array().unwrap().iter().map(|m| m["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["completed", "completed"], "{body}");
    let (status, body) =
        request(address, "POST", &format!("/v1/agent-team/missions/{mission}/cancel"), &json!({})).await;
    assert_eq!(status, 404, "nothing of it runs any more: {body}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[test]
fn a_cancel_poll_out_of_range_is_refused_naming_the_key() {
    let parse = |value: u64| Config::parse(&format!("[runtime]\ncancel_poll_ms = {value}\n"), None);
    assert_eq!(Config::parse("", None).unwrap().runtime.cancel_poll_ms, 500, "the default");
    assert_eq!(parse(10).unwrap().runtime.cancel_poll_ms, 10);
    for value in [0, 9, 3_600_001] {
        let error = parse(value).unwrap_err().to_string();
        assert!(
            error.contains(&format!("runtime.cancel_poll_ms is {value}; it must be between 10 and 3600000")),
            "{error}"
        );
    }
}

#[test]
fn too_many_provider_retries_are_refused_naming_the_key() {
    let error = Config::parse("[providers.p]\nmodel = \"m\"\nmax_retries = 11\n", None).unwrap_err();
    assert!(error.to_string().contains("providers.p.max_retries is 11"), "{error}");
}

/// A second signal during the grace stops the server at once: its running turn is handed
/// over, and the next start on the store recovers and finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_stop_cuts_the_grace_short_and_hands_the_running_turn_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&dir.path().join("agentry.db"), "");
    config.limits.shutdown_grace_secs = 3600;
    let server = Server::start(config.clone()).await.unwrap();
    let address = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (force, forced) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run_with_force(
        async move {
            let _ = stopped.await;
        },
        async move {
            let _ = forced.await;
        },
    ));
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
    assert_eq!(status, 200, "{body}");
    let session = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    let turn = json!({"input": [{"type": "user.message", "content": "slow"}], "stream": false});
    let (status, body) =
        request(address, "POST", &format!("/v1/agents/sessions/{session}/turns"), &turn).await;
    assert_eq!(status, 200, "{body}");
    let turn_id = serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().to_owned();
    stop.send(()).unwrap();
    force.send(()).unwrap();
    // Bounded only so that a regression fails instead of waiting out the hour's grace.
    tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .expect("the forced stop did not wait out the grace")
        .unwrap()
        .unwrap();
    // Handed over, not abandoned until its lease would lapse: the next start takes it over
    // at once and finishes it.
    let (address, stop, serving) = serve(config).await;
    let path = format!("/v1/agents/sessions/{session}/turns/{turn_id}/subscribe");
    let (status, events) = request(address, "POST", &path, &json!({})).await;
    assert_eq!(status, 200, "{events}");
    assert!(events.contains(r#""type":"turn.done""#), "{events}");
    let (status, body) =
        request(address, "GET", &format!("/v1/agents/sessions/{session}/turns/{turn_id}"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["data"]["state"]["status"], "done", "{body}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

/// A client that stalls in the middle of a request does not hold the server's stop up past
/// the grace: its connection is closed, and the stop goes on to the turns and MCP servers.
#[tokio::test]
async fn a_client_stalled_mid_request_does_not_hold_the_stop_past_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&dir.path().join("agentry.db"), "");
    config.limits.shutdown_grace_secs = 1;
    let (address, stop, serving) = serve(config).await;
    let mut stalled = TcpStream::connect(address).await.unwrap();
    let head = "POST /v1/agents/sessions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
                content-length: 1000\r\n\r\n{\"agent_name\"";
    stalled.write_all(head.as_bytes()).await.unwrap();
    // The request is being read: a second connection gets an answer, so the first was
    // accepted and is waiting for the rest of its body.
    let (status, _) = request(address, "GET", "/v1/agents/sessions?agent_name=nobody", &json!(null)).await;
    assert_eq!(status, 404);
    stop.send(()).unwrap();
    // Awaited, with a bound only so that a regression fails instead of hanging the suite.
    tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .expect("the server stopped while a client stalled")
        .unwrap();
    // Cut, even though the process (this test) goes on: no answer, and the socket closes.
    let mut rest = Vec::new();
    let read = stalled.read_to_end(&mut rest).await;
    assert!(read.is_err() || rest.is_empty(), "the stalled request got no answer: {rest:?}");
}

/// A connection that does not send a request's headers in time (one that stalls in them,
/// one that sends nothing, one kept alive idle after its answer) is closed, and an event
/// stream open longer than that is not: the timeout is for reading a request's head.
#[tokio::test]
async fn connections_that_send_no_request_in_time_are_closed_and_streams_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&dir.path().join("agentry.db"), "");
    config.limits.header_timeout_secs = 1;
    config.limits.heartbeat_secs = 3;
    let (address, stop, serving) = serve(config).await;
    // The stream's first keep-alive comes after three seconds, past the header timeout.
    let mut feed = TcpStream::connect(address).await.unwrap();
    feed.write_all(b"GET /global/event HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut feed = BufReader::new(feed);
    // Each read is bounded only so that a regression fails instead of hanging the suite.
    let closed = |mut stream: TcpStream| async move {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer))
            .await
            .expect("the server closed the connection");
        (read.is_ok(), String::from_utf8_lossy(&answer).into_owned())
    };
    let mut silent = TcpStream::connect(address).await.unwrap();
    let mut stalled = TcpStream::connect(address).await.unwrap();
    stalled.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n").await.unwrap();
    let mut idle = TcpStream::connect(address).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let (_, answer) = closed(idle).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "the kept-alive connection was answered first: {answer}");
    let (_, answer) = closed(stalled).await;
    assert!(!answer.contains("200 OK"), "a request whose head never ended is not answered: {answer}");
    let mut nothing = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(60), silent.read(&mut nothing))
        .await
        .expect("the server closed the silent connection");
    assert!(matches!(read, Ok(0) | Err(_)), "nothing is sent to a silent connection: {read:?}");
    // The stream outlived them all: after them it still sends its keep-alive, a comment, or
    // the feed's heartbeat, an event that stands for one (whichever of the two timers comes
    // first; the heartbeat puts the comment off).
    let mut lines = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut line = String::new();
        let read = tokio::time::timeout_at(deadline, feed.read_line(&mut line))
            .await
            .unwrap_or_else(|_| panic!("the stream sent no keep-alive within a minute: {lines:?}"));
        assert!(read.unwrap() > 0, "the stream stayed open: {lines:?}");
        if line.starts_with(':') || line.contains("server.heartbeat") {
            break;
        }
        lines.push(line);
    }
    assert!(lines[0].starts_with("HTTP/1.1 200"), "{lines:?}");
    drop(feed);
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .expect("the server stopped within a minute")
        .unwrap();
}

/// A request body that stops arriving is refused with 408 in the API's error shape.
#[tokio::test]
async fn a_request_body_that_stops_arriving_is_refused_with_408() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&dir.path().join("agentry.db"), "");
    config.limits.body_timeout_secs = 1;
    let (address, stop, serving) = serve(config).await;
    let mut stalled = TcpStream::connect(address).await.unwrap();
    let head = "POST /v1/agents/sessions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
                content-length: 1000\r\n\r\n{\"agent_name\"";
    stalled.write_all(head.as_bytes()).await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(60), stalled.read_to_string(&mut answer))
        .await
        .expect("the stalled body was answered")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"code\":\"request_timeout\"") && answer.contains("body_timeout_secs"),
        "{answer}"
    );
    // Nothing was created.
    let (status, sessions) =
        request(address, "GET", "/v1/agents/sessions?agent_name=demo", &json!(null)).await;
    assert_eq!(status, 200);
    assert!(sessions.contains("\"data\":[]"), "{sessions}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn stopping_the_server_shuts_its_mcp_servers_down_and_leaves_no_process_behind() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = server_everything();
    let pid_file = dir.path().join("mcp.pid");
    // The shell records its pid, then becomes the server (same pid).
    let script = format!("echo $$ > '{}'; exec '{}' stdio", pid_file.display(), launcher.display());
    let mut config = Config::parse(
        &format!(
            "listen = \"127.0.0.1:0\"\n[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"tooled\"\nmodel = \"p\"\n\
             [[agents.mcp]]\nname = \"everything\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\n"
        ),
        None,
    )
    .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let (_address, stop, serving) = serve(config).await;
    let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_owned();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "the MCP server runs");
    stop.send(()).unwrap();
    serving.await.unwrap();
    // Shut down and reaped before `run` returned: not even a zombie is left.
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the MCP server {pid} outlived the server"
    );
}

#[tokio::test]
async fn tools_sharing_a_name_are_refused_at_start_and_an_mcp_tools_list_leaves_one_out() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = server_everything();
    let config = |tools: &str| {
        let mut config = Config::parse(
            &format!(
                "listen = \"127.0.0.1:0\"\n[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"a\"\nmodel = \"p\"\n\
                 tools = [\"echo\"]\n[[agents.mcp]]\nname = \"everything\"\ncommand = {:?}\nargs = [\"stdio\"]\n{tools}",
                launcher.display().to_string()
            ),
            None,
        )
        .unwrap();
        config.storage.path = dir.path().join("agentry.db");
        config
    };
    // server-everything has an `echo` too.
    let error = Server::start(config("")).await.unwrap_err().to_string();
    assert!(
        error.contains(
            "two tools are named \"echo\" (from the built-in tools and from MCP server \"everything\")"
        ),
        "{error}"
    );
    let mut twice = config("");
    twice.agents[0].mcp.clear();
    twice.agents[0].tools.push("echo".to_owned());
    let error = Server::start(twice).await.unwrap_err().to_string();
    assert!(error.contains("agent \"a\": the built-in tools list the tool \"echo\" twice"), "{error}");
    let error = Server::start(config("tools = [\"get-sum\", \"nope\"]\n")).await.unwrap_err().to_string();
    assert!(error.contains("MCP server \"everything\" has no tool \"nope\""), "{error}");
    let (_address, stop, serving) = serve(config("tools = [\"get-sum\"]\n")).await;
    stop.send(()).unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn an_unreachable_mcp_server_stops_the_start_unless_it_is_optional() {
    let dir = tempfile::tempdir().unwrap();
    let config_with = |optional: bool, agent: &str, server: &str| {
        let mut config = Config::parse(
            &format!(
                "listen = \"127.0.0.1:0\"\n[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"a\"\nmodel = \"p\"\n{agent}\
                 [[agents.mcp]]\nname = \"down\"\nurl = \"http://127.0.0.1:9/mcp\"\noptional = {optional}\n{server}"
            ),
            None,
        )
        .unwrap();
        config.storage.path = dir.path().join("agentry.db");
        config
    };
    let config = |optional: bool| config_with(optional, "", "");
    // A gate on a tool the unreached server may offer starts (the tool is not there to call);
    // a gate on a name its `tools` list leaves out is still a typo.
    let gated = "requires_approval = [\"wire_money\"]\n";
    let (_address, stop, serving) = serve(config_with(true, gated, "")).await;
    stop.send(()).unwrap();
    serving.await.unwrap();
    let (_address, stop, serving) = serve(config_with(true, gated, "tools = [\"wire_money\"]\n")).await;
    stop.send(()).unwrap();
    serving.await.unwrap();
    let error = Server::start(config_with(true, gated, "tools = [\"read_balance\"]\n")).await.unwrap_err();
    assert!(error.to_string().contains("requires_approval names \"wire_money\""), "{error}");
    std::fs::remove_file(dir.path().join("agentry.db")).unwrap();
    let error = Server::start(config(false)).await.unwrap_err().to_string();
    assert!(error.contains("MCP server \"down\"") && error.contains("`optional = true`"), "{error}");
    // Said as a server that cannot be reached, in words: the cause, not the SDK's type names.
    assert!(error.starts_with("cannot start: ") && error.contains("Connection refused"), "{error}");
    assert!(!error.contains("rmcp::"), "{error}");
    assert!(!dir.path().join("agentry.db").exists(), "a refused start created the store");
    let (address, stop, serving) = serve(config(true)).await;
    let (status, body) = request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "a"})).await;
    assert_eq!(status, 200, "the agent serves without the server's tools: {body}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

/// An optional MCP server that is down at the start is tried again in the background:
/// once it listens, the agent has its tools, gated as the configuration says, and the
/// agent's other MCP server, connected all along, is not started again.
#[tokio::test]
async fn an_optional_mcp_server_reached_after_the_start_gives_its_agent_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let launcher = server_everything();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let starts = dir.path().join("starts");
    // The shell notes each start of the steady server, then becomes it.
    let script = format!("echo $$ >> '{}'; exec '{}' stdio", starts.display(), launcher.display());
    let mut config = Config::parse(
        &format!(
            "listen = \"127.0.0.1:0\"\n[providers.p]\nmodel = \"m\"\n[[agents]]\nname = \"a\"\nmodel = \"p\"\n\
             requires_approval = [\"echo\"]\n\
             [[agents.mcp]]\nname = \"steady\"\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\ntools = [\"get-sum\"]\n\
             [[agents.mcp]]\nname = \"late\"\nurl = \"http://127.0.0.1:{port}/mcp\"\noptional = true\ntools = [\"echo\"]\n"
        ),
        None,
    )
    .unwrap();
    config.storage.path = dir.path().join("agentry.db");
    let server = Server::start(config).await.unwrap();
    let runtime = server.runtime().clone();
    let first = runtime.agent("a").unwrap();
    assert!(first.tool("get-sum").is_some());
    assert!(first.tool("echo").is_none(), "the late server is down at the start");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let _late = tokio::process::Command::new(&launcher)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The retry runs in the background and signals nothing: look until it has run, for at
    // most 60 seconds (it waits 1, 2, 4, … seconds between tries).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let agent = loop {
        let agent = runtime.agent("a").unwrap();
        if agent.tool("echo").is_some() {
            break agent;
        }
        assert!(std::time::Instant::now() < deadline, "the agent never got the late server's tools");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(agent.tool("get-sum").is_some());
    assert!(agent.requires_approval("echo"), "the configured gate holds once the tool is there");
    assert!(!agent.requires_approval("get-sum"));
    let started = std::fs::read_to_string(&starts).unwrap();
    assert_eq!(started.lines().count(), 1, "the steady server was started again: {started}");
    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
}

#[test]
fn cors_origins_must_be_origins() {
    for (origins, named) in [
        (
            r#"["app.example.com"]"#,
            "cors_origins[0] is \"app.example.com\": an origin is scheme://host[:port]",
        ),
        (r#"["https://a.example", "https://b.example/"]"#, "cors_origins[1] is \"https://b.example/\""),
        (r#"["ftp://files.example"]"#, "scheme is http or https"),
        (r#"["*", "https://a.example"]"#, "\"*\" (any origin) beside other origins"),
    ] {
        let error = Config::parse(&format!("cors_origins = {origins}\n"), None).unwrap_err();
        assert!(error.to_string().contains(named), "{origins}: {error}");
    }
    let parsed = Config::parse("cors_origins = [\"https://app.example.com:8443\"]\n", None).unwrap();
    assert_eq!(parsed.cors_origins, ["https://app.example.com:8443"]);
}

/// The headers of a raw answer, lowercased, up to the blank line.
fn answer_headers(answer: &str) -> String {
    answer.split("\r\n\r\n").next().unwrap_or_default().to_ascii_lowercase()
}

#[tokio::test]
async fn a_configured_origin_gets_cors_headers_and_its_preflights_are_answered() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&dir.path().join("agentry.db"), "");
    config.cors_origins = vec!["http://localhost:5173".to_owned()];
    let (address, stop, serving) = serve(config).await;
    // A browser asks before a cross-origin POST with a JSON body and a key; no
    // credentials come with the question, and it is answered without them.
    let preflight = raw_exchange(
        address,
        "OPTIONS /agui/demo HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost:5173\r\n\
         Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type, authorization\r\n\
         Connection: close\r\n\r\n",
    )
    .await;
    let headers = answer_headers(&preflight);
    assert!(headers.starts_with("http/1.1 200"), "{preflight}");
    assert!(headers.contains("access-control-allow-origin: http://localhost:5173"), "{preflight}");
    assert!(headers.contains("access-control-allow-methods: get,post,delete"), "{preflight}");
    assert!(headers.contains("authorization") && headers.contains("last-event-id"), "{preflight}");
    // A retry-safe turn request sends its key, and reads whether it was replayed.
    let allowed =
        headers.lines().find(|line| line.starts_with("access-control-allow-headers:")).unwrap_or_default();
    assert!(allowed.contains("idempotency-key"), "{preflight}");
    let get = |origin: &str| {
        format!(
            "GET /v1/agents/sessions?agent_name=demo HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {origin}\r\n\
             Connection: close\r\n\r\n"
        )
    };
    let allowed = raw_exchange(address, &get("http://localhost:5173")).await;
    assert!(answer_headers(&allowed).starts_with("http/1.1 200"), "{allowed}");
    assert!(
        answer_headers(&allowed).contains("access-control-expose-headers: idempotent-replayed"),
        "{allowed}"
    );
    assert!(
        answer_headers(&allowed).contains("access-control-allow-origin: http://localhost:5173"),
        "{allowed}"
    );
    // Another page (served here, as the loopback rule allows) gets no headers to read it by.
    let other = raw_exchange(address, &get("http://localhost:9999")).await;
    assert!(answer_headers(&other).starts_with("http/1.1 200"), "{other}");
    assert!(!answer_headers(&other).contains("access-control-allow-origin"), "{other}");
    stop.send(()).unwrap();
    serving.await.unwrap();

    // Without `cors_origins`, no origin gets them.
    let (address, stop, serving) = serve(config_at(&dir.path().join("other.db"), "")).await;
    let plain = raw_exchange(
        address,
        "GET /v1/agents/sessions?agent_name=demo HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost:5173\r\n\
         Connection: close\r\n\r\n",
    )
    .await;
    assert!(answer_headers(&plain).starts_with("http/1.1 200"), "{plain}");
    assert!(!answer_headers(&plain).contains("access-control-allow-origin"), "{plain}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}

/// A session whose lease another process holds with no turn running (a turn it is
/// starting, a deletion under way) refuses turns and deletions as busy, without naming a
/// turn that does not exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_held_without_a_running_turn_is_busy_not_running_a_turn() {
    use agentry_memory::LeaseStore;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.db");
    let (address, stop, serving) = serve(config_at(&path, "")).await;
    let (status, body) =
        request(address, "POST", "/v1/agents/sessions", &json!({"agent_name": "demo"})).await;
    assert_eq!(status, 200, "{body}");
    let id: agentry_types::SessionId =
        serde_json::from_str::<Value>(&body).unwrap()["data"]["id"].as_str().unwrap().parse().unwrap();
    let other =
        agentry_storage_sqlite::SqliteStore::open(&path, agentry_storage_sqlite::SqliteOptions::default())
            .unwrap();
    other
        .acquire_lease(id, "another process", Duration::from_secs(600), agentry_types::Timestamp::now())
        .await
        .unwrap();
    let turn = json!({"input": [{"type": "user.message", "content": "hi"}]});
    let (status, body) = request(address, "POST", &format!("/v1/agents/sessions/{id}/turns"), &turn).await;
    assert_eq!(status, 412, "{body}");
    assert!(body.contains("is busy") && body.contains("send the request again"), "{body}");
    let (status, body) = request(address, "DELETE", &format!("/v1/agents/sessions/{id}"), &Value::Null).await;
    assert_eq!(status, 412, "{body}");
    assert!(body.contains("is busy") && body.contains("send the deletion again"), "{body}");
    // An AG-UI run of a thread whose session is busy is told the same.
    let run = |id: &str| json!({"threadId": "busy-thread", "runId": id, "messages": [{"id": id, "role": "user", "content": "hi"}]});
    let (status, body) = request(address, "POST", "/agui/demo", &run("r1")).await;
    assert_eq!(status, 200, "{body}");
    let (_, listed) =
        request(address, "GET", "/v1/agents/sessions?agent_name=demo&limit=100", &Value::Null).await;
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let thread =
        listed["data"].as_array().unwrap().iter().find(|session| session["title"] == "busy-thread").unwrap();
    let thread: agentry_types::SessionId = thread["id"].as_str().unwrap().parse().unwrap();
    other
        .acquire_lease(thread, "another process", Duration::from_secs(600), agentry_types::Timestamp::now())
        .await
        .unwrap();
    let (status, body) = request(address, "POST", "/agui/demo", &run("r2")).await;
    assert_eq!(status, 412, "{body}");
    assert!(body.contains("is busy"), "{body}");
    stop.send(()).unwrap();
    serving.await.unwrap();
}
