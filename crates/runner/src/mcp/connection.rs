//! A live connection to one MCP server.

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentry_events::{McpServerSession, McpTransport};
use agentry_types::McpServerRef;
use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::{Peer, RoleClient, RunningService, ServiceExt};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio::io::AsyncBufReadExt;
use tokio::process::ChildStderr;
use tokio::time::Instant;

use super::config::{McpServerConfig, McpServerTransport};
use super::error::McpError;
use super::http::{SessionIdCell, SessionRecordingClient, parse_headers};
use super::tool::McpTool;
use crate::tool::Tool;

/// How much of a stdio server's stderr is kept: its last lines, up to this many bytes.
const STDERR_TAIL_BYTES: usize = 4096;

/// How long a failed handshake waits for the server's stderr to close, for the error message.
const STDERR_SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long closing waits for the server to shut down before giving up on it.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to an MCP server, initialized and with its tools listed.
///
/// The tools ([`McpConnection::tools`]) join an agent's tools; the session
/// ([`McpConnection::session`]) is what `mcp.initialize` reports. Keep the connection for as
/// long as an agent may call its tools: closing it ([`McpConnection::close`]) or dropping
/// it ends the session, and for a stdio server shuts the process (and the process group
/// it leads) down and reaps it. After that, calls of its tools fail with a clear error.
/// Until then, a server whose connection closed (a stdio server that exited or was killed,
/// an HTTP connection whose worker stopped) is connected again by the next call of one of
/// its tools, with a warning in the log (the call that was under way fails).
///
/// ```no_run
/// # async fn demo(model: std::sync::Arc<dyn agentry_model::Model>) -> Result<(), agentry_runner::McpError> {
/// use agentry_runner::{Agent, McpConnection, McpServerConfig};
///
/// let config = McpServerConfig::stdio("everything", "npx")
///     .args(["-y", "@modelcontextprotocol/server-everything", "stdio"]);
/// let connection = McpConnection::connect(config).await?;
/// let agent = Agent::builder("assistant", model).tools(connection.tools()).build();
/// // Emit `mcp.initialize` with `connection.session()`, run turns, then:
/// connection.close().await?;
/// # let _ = agent;
/// # Ok(())
/// # }
/// ```
pub struct McpConnection {
    session: McpServerSession,
    /// The session id the HTTP server assigned, kept current by the HTTP client.
    http_session_id: Option<SessionIdCell>,
    /// The running service, shared with the tools.
    link: Arc<Link>,
    tools: Vec<Arc<McpTool>>,
    server_info: Option<Implementation>,
    process_id: Option<u32>,
    stderr: Option<StderrTail>,
}

impl fmt::Debug for McpConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpConnection")
            .field("session", &self.session())
            .field("tools", &self.tools.iter().map(|tool| tool.spec().name.as_str()).collect::<Vec<_>>())
            .field("process_id", &self.process_id)
            .finish_non_exhaustive()
    }
}

impl McpConnection {
    /// Connects: starts the process (stdio) or reaches the URL (streamable HTTP), performs
    /// the `initialize` handshake, and lists the server's tools (those the allow-list
    /// admits), all within the configured connect timeout.
    ///
    /// Errors: [`McpError::InvalidConfig`] for headers that are not valid HTTP;
    /// [`McpError::Spawn`] when the command cannot be started (not found, not executable,
    /// bad working directory); [`McpError::Initialize`] when the server refuses the
    /// handshake, answers something that is not MCP, or exits (with the end of its stderr);
    /// [`McpError::Transport`] when listing the tools fails; [`McpError::Timeout`] when
    /// connecting takes longer than the connect timeout. A process started before a failure
    /// is shut down.
    pub async fn connect(config: McpServerConfig) -> Result<Self, McpError> {
        let deadline = Instant::now() + config.connect_timeout.min(agentry_types::LONGEST_WAIT);
        match &config.transport {
            McpServerTransport::Stdio { command, args, env, cwd } => {
                Self::connect_stdio(&config, deadline, command, args, env, cwd.as_deref()).await
            }
            McpServerTransport::StreamableHttp { url, headers } => {
                Self::connect_http(&config, deadline, url, headers).await
            }
        }
    }

    async fn connect_stdio(
        config: &McpServerConfig,
        deadline: Instant,
        command: &str,
        args: &[String],
        env: &std::collections::BTreeMap<String, String>,
        cwd: Option<&Path>,
    ) -> Result<Self, McpError> {
        let mut process = tokio::process::Command::new(command);
        process.args(args).env_clear();
        for name in super::config::MCP_INHERITED_ENV {
            if let Some(value) = std::env::var_os(name) {
                process.env(name, value);
            }
        }
        process.envs(env);
        if let Some(cwd) = cwd {
            process.current_dir(cwd);
        }
        let mut process = CommandWrap::from(process);
        // The server leads a process group so that launchers (`npx`, `uvx`, shell scripts)
        // are shut down together with the server they start.
        process.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
        let (transport, stderr) = TokioChildProcess::builder(process)
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| McpError::Spawn {
                server: config.name.clone(),
                command: command.to_owned(),
                reason: error.to_string(),
            })?;
        let process_id = transport.id();
        let stderr = stderr.map(StderrTail::capture);
        let service = Self::initialize(config, deadline, transport, stderr.as_ref()).await?;
        let session = session_of(config, McpTransport::Stdio, None);
        Self::list_tools(config, deadline, session, None, service, process_id, stderr).await
    }

    async fn connect_http(
        config: &McpServerConfig,
        deadline: Instant,
        url: &str,
        headers: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, McpError> {
        let invalid = |reason: String| McpError::InvalidConfig { server: config.name.clone(), reason };
        let headers = parse_headers(headers).map_err(invalid)?;
        let (client, session_id) = SessionRecordingClient::new().map_err(invalid)?;
        let transport_config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        let transport = StreamableHttpClientTransport::with_client(client, transport_config);
        let service = Self::initialize(config, deadline, transport, None).await?;
        let session = session_of(config, McpTransport::StreamableHttp, current(&session_id));
        Self::list_tools(config, deadline, session, Some(session_id), service, None, None).await
    }

    async fn initialize<T, E, A>(
        config: &McpServerConfig,
        deadline: Instant,
        transport: T,
        stderr: Option<&StderrTail>,
    ) -> Result<RunningService<RoleClient, ClientConfig>, McpError>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let client = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("agentry", env!("CARGO_PKG_VERSION")),
        );
        // On timeout the handshake future, and with it the transport, is dropped: a
        // started process is killed and reaped.
        match tokio::time::timeout_at(deadline, client.serve(transport)).await {
            Ok(Ok(service)) => Ok(service),
            Ok(Err(error)) => {
                let mut reason = match &error {
                    // Its text names the SDK's transport type; what went wrong is its cause.
                    rmcp::service::ClientInitializeError::TransportError { error, context } => {
                        format!("{} (while trying to {context})", error_chain(&*error.error))
                    }
                    other => other.to_string(),
                };
                if let Some(stderr) = stderr {
                    // The failed handshake dropped the transport, which kills the process:
                    // its stderr closes soon, and its last words are often the reason.
                    let tail = stderr.text_when_closed(STDERR_SETTLE_TIMEOUT).await;
                    if !tail.is_empty() {
                        reason.push_str("; the server's stderr ended with:\n");
                        reason.push_str(&tail);
                    }
                }
                Err(McpError::Initialize { server: config.name.clone(), reason })
            }
            Err(_) => Err(McpError::Timeout {
                server: config.name.clone(),
                operation: "initialize".to_owned(),
                timeout: config.connect_timeout,
            }),
        }
    }

    async fn list_tools(
        config: &McpServerConfig,
        deadline: Instant,
        session: McpServerSession,
        http_session_id: Option<SessionIdCell>,
        service: RunningService<RoleClient, ClientConfig>,
        process_id: Option<u32>,
        stderr: Option<StderrTail>,
    ) -> Result<Self, McpError> {
        let peer_info = service.peer_info();
        let server_info = peer_info.as_ref().and_then(|info| info.server_info.clone());
        let has_tools = peer_info.as_ref().is_some_and(|info| info.capabilities.tools.is_some());
        let listed = if has_tools {
            match tokio::time::timeout_at(deadline, service.peer().list_all_tools()).await {
                Ok(Ok(tools)) => tools,
                Ok(Err(error)) => {
                    return Err(McpError::Transport {
                        server: config.name.clone(),
                        reason: format!("listing the tools failed: {error}"),
                    });
                }
                Err(_) => {
                    return Err(McpError::Timeout {
                        server: config.name.clone(),
                        operation: "list its tools".to_owned(),
                        timeout: config.connect_timeout,
                    });
                }
            }
        } else {
            Vec::new()
        };
        let server = McpServerRef { id: config.id.clone(), name: config.name.clone() };
        let link = Arc::new(Link {
            config: config.clone(),
            peer: std::sync::RwLock::new(service.peer().clone()),
            service: tokio::sync::Mutex::new(Some(service)),
            reviving: tokio::sync::Mutex::new(()),
            shut: AtomicBool::new(false),
        });
        let tools = listed
            .into_iter()
            .filter(|tool| config.allows(&tool.name))
            .map(|tool| {
                Arc::new(McpTool::new(tool, server.clone(), Arc::clone(&link), config.request_timeout))
            })
            .collect();
        Ok(Self { session, http_session_id, link, tools, server_info, process_id, stderr })
    }

    /// The session as `mcp.initialize` reports it: the server's id and name, the transport,
    /// and the session id: the one a streamable HTTP server assigned (`Mcp-Session-Id`,
    /// kept current if the server re-creates the session), otherwise a UUIDv7 made at
    /// connect time that stays the same for the life of the connection.
    #[must_use]
    pub fn session(&self) -> McpServerSession {
        let mut session = self.session.clone();
        if let Some(current) = self.http_session_id.as_ref().and_then(current) {
            session.session_id = Some(current);
        }
        session
    }

    /// The server's tools (those the allow-list admits), in the server's order, ready for
    /// [`AgentBuilder::tools`](crate::AgentBuilder::tools).
    #[must_use]
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.tools.iter().map(|tool| Arc::clone(tool) as Arc<dyn Tool>).collect()
    }

    /// The same tools with their MCP-specific methods ([`McpTool::tool_info`]).
    #[must_use]
    pub fn mcp_tools(&self) -> &[Arc<McpTool>] {
        &self.tools
    }

    /// The server's name and version as it reported them in `initialize`, if it did.
    #[must_use]
    pub fn server_info(&self) -> Option<(&str, &str)> {
        self.server_info.as_ref().map(|info| (info.name.as_str(), info.version.as_str()))
    }

    /// The process id of a stdio server, as started by [`McpConnection::connect`] (a
    /// server started again after it exited has another).
    #[must_use]
    pub fn process_id(&self) -> Option<u32> {
        self.process_id
    }

    /// The last lines a stdio server wrote to stderr (at most 4 KiB), for diagnostics;
    /// `None` for other transports. Those of the process started at connect.
    #[must_use]
    pub fn stderr_tail(&self) -> Option<String> {
        self.stderr.as_ref().map(StderrTail::text)
    }

    /// Closes the connection and waits for it to be shut down: a streamable HTTP session is
    /// ended; a stdio server's stdin is closed, and a process that does not exit within a
    /// few seconds gets `SIGTERM` and then `SIGKILL`; the process is reaped.
    ///
    /// Errors: [`McpError::Timeout`] when the shutdown took longer than 10 s (the process
    /// is still killed when the connection's background task ends), [`McpError::Transport`]
    /// when the background task failed.
    pub async fn close(self) -> Result<(), McpError> {
        self.shutdown().await
    }

    /// [`McpConnection::close`] through a shared reference, for a connection an agent
    /// shares: a server shutting down ends every session and stdio process this way, so
    /// none outlives it. Later calls of its tools fail with a clear error; shutting down
    /// again does nothing.
    ///
    /// Errors: as [`McpConnection::close`].
    pub async fn shutdown(&self) -> Result<(), McpError> {
        self.link.shut.store(true, Ordering::Release);
        let Some(mut service) = self.link.service.lock().await.take() else {
            return Ok(());
        };
        match service.close_with_timeout(CLOSE_TIMEOUT).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(McpError::Timeout {
                server: self.session.name.clone(),
                operation: "shut down".to_owned(),
                timeout: CLOSE_TIMEOUT,
            }),
            Err(error) => Err(McpError::Transport {
                server: self.session.name.clone(),
                reason: format!("the connection's task failed while closing: {error}"),
            }),
        }
    }
}

impl Drop for McpConnection {
    /// Ends the session as [`McpConnection::close`] would, without waiting: the tools,
    /// which share it, must not keep the server running (nor start it again).
    fn drop(&mut self) {
        self.link.shut.store(true, Ordering::Release);
        if let Ok(mut service) = self.link.service.try_lock() {
            drop(service.take());
        }
    }
}

/// The running service of a connection, shared with its tools, which call through its
/// peer. When the server's transport has closed (a stdio server exited or was killed), the
/// next call connects again ([`Link::revive`]) instead of failing for the life of the
/// process.
pub(crate) struct Link {
    config: McpServerConfig,
    peer: std::sync::RwLock<Peer<RoleClient>>,
    /// Taken by the first shutdown; replaced by a revival. Held only briefly, never while
    /// connecting, so a shutdown does not wait for a revival's connect.
    service: tokio::sync::Mutex<Option<RunningService<RoleClient, ClientConfig>>>,
    /// One revival at a time.
    reviving: tokio::sync::Mutex<()>,
    /// Set by a shutdown: nothing connects again.
    shut: AtomicBool,
}

impl Link {
    /// The peer calls go through.
    pub(crate) fn peer(&self) -> Peer<RoleClient> {
        self.peer.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Connects again when the transport has closed (a stdio server that exited is started
    /// again, with the same configuration), and returns the peer to call through. One
    /// revival at a time; a call that finds the peer revived meanwhile uses it.
    ///
    /// Errors: as [`McpConnection::connect`]; [`McpError::Transport`] after a shutdown.
    pub(crate) async fn revive(&self) -> Result<Peer<RoleClient>, McpError> {
        let shut_down = || McpError::Transport {
            server: self.config.name.clone(),
            reason: "the connection was shut down".to_owned(),
        };
        let _reviving = self.reviving.lock().await;
        if self.shut.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        let current = self.peer();
        if !current.is_transport_closed() {
            return Ok(current);
        }
        tracing::warn!(server = %self.config.name, "the MCP server's connection closed; connecting again");
        let fresh = McpConnection::connect(self.config.clone()).await?;
        let Some(started) = fresh.link.service.lock().await.take() else {
            return Err(McpError::Transport {
                server: self.config.name.clone(),
                reason: "the new connection closed at once".to_owned(),
            });
        };
        let mut service = self.service.lock().await;
        if self.shut.load(Ordering::Acquire) {
            // Shut down (or dropped) while connecting: the new server is closed and reaped
            // too, not left behind.
            drop(service);
            let mut started = started;
            let _closed = started.close_with_timeout(CLOSE_TIMEOUT).await;
            return Err(shut_down());
        }
        let peer = started.peer().clone();
        *self.peer.write().unwrap_or_else(PoisonError::into_inner) = peer.clone();
        // The dead service goes: its process is reaped.
        *service = Some(started);
        tracing::info!(server = %self.config.name, "the MCP server is connected again");
        Ok(peer)
    }
}

fn session_of(
    config: &McpServerConfig,
    transport: McpTransport,
    session_id: Option<String>,
) -> McpServerSession {
    McpServerSession {
        id: config.id.clone(),
        name: config.name.clone(),
        session_id: Some(session_id.unwrap_or_else(|| uuid::Uuid::now_v7().hyphenated().to_string())),
        transport: Some(transport),
    }
}

fn current(cell: &SessionIdCell) -> Option<String> {
    cell.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The end of a stdio server's stderr, read by a background task until the pipe closes
/// (so the server never blocks on a full pipe).
#[derive(Debug, Clone)]
struct StderrTail {
    lines: Arc<Mutex<VecDeque<String>>>,
    /// Becomes `true` when the pipe is closed and every line is read.
    finished: tokio::sync::watch::Receiver<bool>,
}

impl StderrTail {
    fn capture(stderr: ChildStderr) -> Self {
        let (finish, finished) = tokio::sync::watch::channel(false);
        let tail = Self { lines: Arc::default(), finished };
        let lines = Arc::clone(&tail.lines);
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let mut lines = lines.lock().unwrap_or_else(PoisonError::into_inner);
                lines.push_back(line);
                let mut bytes: usize = lines.iter().map(String::len).sum();
                while bytes > STDERR_TAIL_BYTES && lines.len() > 1 {
                    bytes -= lines.pop_front().map_or(0, |line| line.len());
                }
            }
            finish.send_replace(true);
        });
        tail
    }

    /// The tail once the process has closed its stderr, or after `bound` if it has not.
    async fn text_when_closed(&self, bound: Duration) -> String {
        let mut finished = self.finished.clone();
        // A timeout or a dropped sender both mean: take what has been read so far.
        let _ = tokio::time::timeout(bound, finished.wait_for(|finished| *finished)).await;
        self.text()
    }

    fn text(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }
}

/// An error's message followed by each of its causes that it does not already say, as in
/// "error sending request for url (…): client error (Connect): tcp connect error:
/// Connection refused (os error 111)".
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    // The HTTP client's error is this variant's field, not its source: its chain is where
    // the cause (a refused connection, a failed TLS handshake) is.
    use rmcp::transport::streamable_http_client::StreamableHttpError;
    if let Some(StreamableHttpError::Client(client)) =
        error.downcast_ref::<StreamableHttpError<reqwest::Error>>()
    {
        return error_chain(client);
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}
