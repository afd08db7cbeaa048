//! The `agentry` command: `serve` runs the server; `chat` talks to an agent in the
//! terminal; `sessions list`, `turns list` and `events` inspect what is stored (JSON
//! lines, for piping).
#![allow(unreachable_pub, missing_docs)]

mod chat;
mod client;

use std::io::Write;
use std::path::PathBuf;

use agentry_server::{Config, Server};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use futures_util::StreamExt;

use crate::client::Api;

/// Agentry: an agent runtime with a harness HTTP/SSE API.
#[derive(Debug, Parser)]
#[command(name = "agentry", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the server is, for the client commands.
#[derive(Debug, clap::Args)]
struct Remote {
    /// The server's base URL.
    #[arg(
        long,
        env = "AGENTRY_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8787",
        value_parser = server_url
    )]
    url: String,
    /// A bearer API key (not needed for a server without keys).
    #[arg(long, env = "AGENTRY_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the server (the embedded default without --config: SQLite `agentry.db` in the
    /// working directory, or redb `agentry.redb` with `--backend redb`, 127.0.0.1:8787, the
    /// demo agents).
    Serve {
        /// A TOML configuration file.
        #[arg(long, env = "AGENTRY_CONFIG")]
        config: Option<PathBuf>,
        /// Listen here instead of the configured address (`127.0.0.1:0` picks a free port).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Store here instead of the configured path.
        #[arg(long)]
        store: Option<PathBuf>,
        /// The store's backend instead of the configured one (SQLite by default); without
        /// --store or --config, redb stores in `agentry.redb`.
        #[arg(long, value_parser = ["sqlite", "redb"])]
        backend: Option<String>,
    },
    /// Chats with an agent in the terminal.
    Chat {
        /// The agent (or team).
        agent: String,
        /// Continue this session instead of starting one.
        #[arg(long, value_parser = an_id)]
        session: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Sessions.
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// Turns.
    Turns {
        #[command(subcommand)]
        command: TurnsCommand,
    },
    /// Prints a turn's events as JSON lines: its stored events, or with --follow its live
    /// stream from the start.
    Events {
        /// The turn.
        #[arg(value_parser = an_id)]
        turn: String,
        /// Follow the turn's live stream until it ends.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// Lists an agent's sessions, newest first (JSON lines).
    List {
        /// The agent.
        #[arg(long, default_value = "demo")]
        agent: String,
        /// At most this many (at least 1).
        #[arg(long, default_value_t = 20, value_parser = at_least_one)]
        limit: u64,
        /// Oldest first.
        #[arg(long)]
        oldest_first: bool,
        /// Only sessions created at or after this time (ISO-8601: `2026-11-26T09:00:00Z`,
        /// without seconds or offset (UTC), with a `+hhmm` offset, or a date alone, its
        /// midnight UTC); sent as `start_timestamp`.
        #[arg(long)]
        since: Option<String>,
        /// Only sessions created at or before this time (as `--since`); sent as
        /// `end_timestamp`.
        #[arg(long)]
        until: Option<String>,
        #[command(flatten)]
        remote: Remote,
    },
    /// Cancels a session's running turn, if any; returns once it has ended (or, when
    /// another server runs it, once the request is stored).
    Cancel {
        /// The session.
        #[arg(value_parser = an_id)]
        session: String,
        #[command(flatten)]
        remote: Remote,
    },
    /// Deletes a session with its turns, events and history (refused while a turn of it
    /// runs: cancel it first); prints the deleted session as a JSON line.
    Delete {
        /// The session.
        #[arg(value_parser = an_id)]
        session: String,
        #[command(flatten)]
        remote: Remote,
    },
}

#[derive(Debug, Subcommand)]
enum TurnsCommand {
    /// Lists a session's turns, newest first (JSON lines).
    List {
        /// The session.
        #[arg(value_parser = an_id)]
        session: String,
        #[command(flatten)]
        remote: Remote,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(Into::into).and_then(
            |runtime| {
                let result = runtime.block_on(run(cli));
                // A read of the terminal may still be blocked (the user left with Ctrl-C at a
                // prompt): do not wait for it.
                runtime.shutdown_background();
                result
            },
        );
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // The reader of the output went away (`| head`): it took what it wanted.
        Err(error) if error.is::<OutputClosed>() => std::process::ExitCode::SUCCESS,
        Err(error) => {
            report(&error);
            std::process::ExitCode::FAILURE
        }
    }
}

/// Prints an error and its causes for a person, without the backtrace `anyhow` would add
/// under `RUST_BACKTRACE` (a refused request is not a crash).
fn report(error: &anyhow::Error) {
    let mut text = format!("error: {error}");
    let causes: Vec<String> = error.chain().skip(1).map(ToString::to_string).collect();
    if !causes.is_empty() {
        text.push_str("\n\nCaused by:");
        for cause in causes {
            text.push_str("\n    ");
            text.push_str(&cause);
        }
    }
    // A closed stderr leaves nothing to report to (eprintln! would panic).
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// The reader of a listing's output closed it.
#[derive(Debug)]
struct OutputClosed;

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the output was closed")
    }
}

impl std::error::Error for OutputClosed {}

/// Writes one line of a listing, at once. Only a write to an output its reader closed
/// ends the command quietly (`main`); a broken connection to the server is an error.
fn emit(out: &mut impl Write, line: impl std::fmt::Display) -> Result<()> {
    writeln!(out, "{line}").and_then(|()| out.flush()).map_err(|error| {
        if error.kind() == std::io::ErrorKind::BrokenPipe { OutputClosed.into() } else { error.into() }
    })
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve { config, listen, store, backend } => serve(config, listen, store, backend).await,
        Command::Chat { agent, session, remote } => chat::run(&api(&remote)?, &agent, session).await,
        Command::Sessions {
            command: SessionsCommand::List { agent, limit, oldest_first, since, until, remote },
        } => {
            let api = api(&remote)?;
            let mut token: Option<String> = None;
            let mut printed = 0;
            let mut filters = format!("agent_name={}", encode(&agent));
            if oldest_first {
                filters.push_str("&order=asc");
            }
            for (name, value) in [("start_timestamp", &since), ("end_timestamp", &until)] {
                if let Some(value) = value {
                    filters.push_str(&format!("&{name}={}", encode(value)));
                }
            }
            while printed < limit {
                let mut path = format!("/v1/agents/sessions?{filters}&limit={}", (limit - printed).min(100));
                if let Some(token) = &token {
                    path.push_str(&format!("&page_token={}", encode(token)));
                }
                let page = api.get(&path).await?;
                for session in page["data"].as_array().into_iter().flatten() {
                    emit(&mut std::io::stdout(), session)?;
                    printed += 1;
                }
                token = page["pagination"]["next_page_token"].as_str().map(str::to_owned);
                if token.is_none() {
                    break;
                }
            }
            Ok(())
        }
        Command::Sessions { command: SessionsCommand::Delete { session, remote } } => {
            let deleted = api(&remote)?.delete(&format!("/v1/agents/sessions/{session}")).await?;
            emit(&mut std::io::stdout(), &deleted["data"])?;
            Ok(())
        }
        Command::Sessions { command: SessionsCommand::Cancel { session, remote } } => {
            api(&remote)?
                .post(&format!("/v1/agents/sessions/{session}/cancel"), &serde_json::json!({}))
                .await?;
            eprintln!(
                "session {session}: its running turn, if it had one, has ended cancelled (or, run by another \
                 server, will within 500 ms)"
            );
            Ok(())
        }
        Command::Turns { command: TurnsCommand::List { session, remote } } => {
            let api = api(&remote)?;
            let mut token: Option<String> = None;
            loop {
                let mut path = format!("/v1/agents/sessions/{}/turns?limit=25", encode(&session));
                if let Some(token) = &token {
                    path.push_str(&format!("&page_token={}", encode(token)));
                }
                let page = api.get(&path).await?;
                for turn in page["data"].as_array().into_iter().flatten() {
                    emit(&mut std::io::stdout(), turn)?;
                }
                token = page["pagination"]["next_page_token"].as_str().map(str::to_owned);
                if token.is_none() {
                    return Ok(());
                }
            }
        }
        Command::Events { turn, follow, remote } => events(&api(&remote)?, &turn, follow).await,
    }
}

fn api(remote: &Remote) -> Result<Api> {
    Api::new(&remote.url, remote.api_key.clone())
}

/// A count of at least 1 (a listing's `--limit`).
fn at_least_one(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(count) if count >= 1 => Ok(count),
        _ => Err("a whole number of at least 1 is needed".to_owned()),
    }
}

/// A session's or a turn's id: a UUID (anything else would be read as part of a path).
fn an_id(text: &str) -> Result<String, String> {
    if text.len() == 36 && text.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        Ok(text.to_owned())
    } else {
        Err("an id is a UUID, such as `agentry sessions list` and `agentry turns list` show".to_owned())
    }
}

/// A server's base URL: http or https, with a host.
fn server_url(text: &str) -> Result<String, String> {
    match reqwest::Url::parse(text) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Ok(text.to_owned()),
        _ => {
            Err("an http:// or https:// URL with a host is needed, such as http://127.0.0.1:8787".to_owned())
        }
    }
}

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

async fn events(api: &Api, turn: &str, follow: bool) -> Result<()> {
    let found = api.get(&format!("/v1/agents/turns/{}", encode(turn))).await?;
    let session =
        found["data"]["session_id"].as_str().context("the server did not say the turn's session")?.to_owned();
    let mut out = std::io::stdout();
    if follow {
        // A broken connection is resumed from the last event received, a few times.
        let path = format!("/v1/agents/sessions/{session}/turns/{}/subscribe", encode(turn));
        let mut last: Option<String> = None;
        let mut attempts = 0;
        loop {
            let mut stream = api.resume(&path, last.as_deref()).await?;
            let mut broke = None;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => {
                        emit(&mut out, &event.data)?;
                        last = event.id.or(last);
                        if event.data["type"] == "turn.done" {
                            return Ok(());
                        }
                    }
                    Err(error) => {
                        broke = Some(error);
                        break;
                    }
                }
            }
            attempts += 1;
            // A stream that ends before `turn.done` (the server stopped) is resumed too.
            let error = broke.unwrap_or_else(|| anyhow::anyhow!("the stream ended before turn.done"));
            if attempts >= 5 {
                return Err(error.context("the turn's stream kept breaking"));
            }
            // A closed stderr does not stop the follow (eprintln! would panic).
            let _ = writeln!(std::io::stderr(), "reconnecting after: {error}");
        }
    }
    let mut token: Option<String> = None;
    loop {
        let mut path =
            format!("/v1/agents/sessions/{session}/turns/{}/events?limit=25&order=asc", encode(turn));
        if let Some(token) = &token {
            path.push_str(&format!("&page_token={}", encode(token)));
        }
        let page = api.get(&path).await.map_err(|error| {
            if error.to_string().contains("412") {
                error.context(format!(
                    "turn {turn} is still running: follow it with `agentry events {turn} --follow`"
                ))
            } else {
                error
            }
        })?;
        for event in page["data"].as_array().into_iter().flatten() {
            emit(&mut out, event)?;
        }
        token = page["pagination"]["next_page_token"].as_str().map(str::to_owned);
        if token.is_none() {
            return Ok(());
        }
    }
}

async fn serve(
    config: Option<PathBuf>,
    listen: Option<std::net::SocketAddr>,
    store: Option<PathBuf>,
    backend: Option<String>,
) -> Result<()> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The MCP SDK logs each failed connection (in Rust's debug format) and each
                // handshake at its own levels: the server logs both in its own words.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=off")),
        )
        .with_writer(std::io::stderr)
        .init();
    // The embedded default's file, when no other is named, is named for its backend.
    let default_file = config.is_none() && store.is_none();
    let mut config = match &config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    if let Some(listen) = listen {
        config.listen = listen;
    }
    if let Some(store) = store {
        config.storage.path = store;
    }
    match backend.as_deref() {
        Some("redb") => {
            config.storage.backend = agentry_server::config::Backend::Redb;
            if default_file {
                config.storage.path = PathBuf::from("agentry.redb");
            }
        }
        Some("sqlite") => config.storage.backend = agentry_server::config::Backend::Sqlite,
        Some(other) => anyhow::bail!("unknown backend {other:?}: sqlite or redb"),
        None => {}
    }
    let server = Server::start(config).await?;
    // The first line on stdout says where to connect (tests and scripts read it).
    let mut out = std::io::stdout();
    writeln!(out, "agentry listening on http://{}", server.local_addr())?;
    out.flush()?;
    let grace = server.grace();
    let signals = agentry_server::ShutdownSignals::listen();
    let first = signals.nth(1);
    let first = async move {
        first.await;
        tracing::info!(
            grace = ?grace,
            "stopping: waiting for requests and running turns for the grace at most; signal again to stop at once"
        );
    };
    server.run_with_force(first, signals.nth(2)).await?;
    Ok(())
}
