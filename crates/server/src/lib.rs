//! Agentry's server: the harness HTTP/SSE API that `truefoundry-gateway-sdk` 0.4.2 clients
//! talk to, the opencode-style event feeds (`/event`, `/global/event`), the agent-team
//! routes, an AG-UI endpoint per agent, bearer-key auth, health, readiness and Prometheus
//! metrics, and the TOML configuration with its embedded default.
//!
//! ```no_run
//! # async fn run() -> Result<(), agentry_server::ServerError> {
//! use agentry_server::{Config, Server};
//!
//! let server = Server::start(Config::default()).await?; // agentry.db, 127.0.0.1:8787, demo agents
//! println!("listening on http://{}", server.local_addr());
//! server.run(agentry_server::shutdown_signal()).await
//! # }
//! ```
//!
//! Only this crate (with the CLI) names a concrete store: [`Config::storage`] picks SQLite
//! or redb; everything below sees the store traits.

mod agui;
mod auth;
pub mod config;
mod cut;
pub mod demo;
mod error;
mod feed;
mod harness;
mod metrics;
mod sse;
mod team_routes;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use agentry_memory::rules::FileIdentity;
use agentry_memory::{Durability, Store};
use agentry_runner::{Runtime, RuntimeOptions, TurnHandle};
use agentry_storage_redb::{RedbOptions, RedbStore};
use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
use agentry_team::{SpawnApprovals, TeamControl};
use agentry_types::TurnId;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::sync::watch;

pub use config::{Backend, Config, ConfigError, DurabilitySetting};
pub use error::ApiError;

use crate::auth::Keys;
use crate::metrics::Metrics;

/// Why the server cannot start or stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store cannot be opened.
    #[error("cannot open the store {path}: {message}")]
    Store {
        /// The store file.
        path: String,
        /// Why.
        message: String,
    },
    /// The listen address cannot be bound.
    #[error("cannot listen on {address}: {message}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// Why.
        message: String,
    },
    /// Serving failed for good (not returned today: see [`Server::run`]).
    #[error("serving failed: {0}")]
    Serve(String),
}

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) runtime: Runtime,
    pub(crate) keys: Keys,
    /// Whether `/metrics` answers without a key when keys are configured.
    pub(crate) public_metrics: bool,
    pub(crate) metrics: Metrics,
    pub(crate) approvals: SpawnApprovals,
    pub(crate) control: TeamControl,
    /// Each team's spawn policy, by team name.
    pub(crate) policies: Vec<(String, agentry_team::SpawnPolicy)>,
    pub(crate) heartbeat: Duration,
    /// New stored events, for the feeds.
    pub(crate) feed: feed::FeedHub,
    /// Becomes true when the server is asked to stop: event streams are cut.
    pub(crate) stopping: watch::Receiver<bool>,
    /// AG-UI threads begun before derived session ids, mapped to their sessions.
    pub(crate) agui_threads: agui::Threads,
    /// The AG-UI streams open on each turn: a run's turn is cancelled when its last
    /// client goes away and no retry comes back for it.
    pub(crate) agui_streams: agui::Streams,
    /// Each caller's open event streams (`limits.streams_per_subject`).
    pub(crate) streams: Arc<sse::StreamSlots>,
    /// Turns started or recovered by this server that may still run.
    pub(crate) running: Mutex<std::collections::HashMap<TurnId, TurnHandle>>,
    /// The store's file as it was opened, when the server opened it: readiness checks it
    /// is still there (a file removed or replaced under a running server fails readiness,
    /// so an operator, or an orchestrator, sees it at once).
    pub(crate) store_file: Option<FileIdentity>,
}

impl AppState {
    /// Starts following a turn this server created or recovered: counts it in the metrics
    /// while it runs and lets shutdown wait for it.
    pub(crate) fn track(self: &Arc<Self>, turn: &TurnHandle) {
        self.metrics.turn_started();
        self.running.lock().unwrap_or_else(PoisonError::into_inner).insert(turn.id(), turn.clone());
        let state = Arc::clone(self);
        let turn = turn.clone();
        tokio::spawn(async move {
            let status = match turn.wait().await {
                Ok(agentry_types::TurnState::Done { .. }) => "done",
                Ok(agentry_types::TurnState::Cancelled { .. }) => "cancelled",
                Ok(agentry_types::TurnState::Error { .. }) => "error",
                // Stopped here without ending (handed over, its lease lost, or its end not
                // stored): it goes on elsewhere, or when resumed.
                Ok(agentry_types::TurnState::Running) => "left",
                Err(_) => "unknown",
            };
            state.metrics.turn_finished(status);
            state.running.lock().unwrap_or_else(PoisonError::into_inner).remove(&turn.id());
        });
    }

    /// A future that resolves when the server starts stopping.
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stopping = self.stopping.clone();
        async move {
            // An error means the sender is gone: the server is gone too.
            let _ = stopping.wait_for(|stopping| *stopping).await;
        }
    }
}

/// A started server: the store is open, the agents are registered, turns a dead process
/// left running are recovered, and the address is bound.
#[derive(Debug)]
pub struct Server {
    state: Arc<AppState>,
    listener: tokio::net::TcpListener,
    stop: watch::Sender<bool>,
    body_limit: usize,
    /// The CORS headers for `cors_origins` (none when it is empty).
    cors: Option<tower_http::cors::CorsLayer>,
    grace: Duration,
    /// How long a connection may take to send a request's headers (`limits.header_timeout_secs`).
    header_timeout: Duration,
    /// How long a request body may go without sending data (`limits.body_timeout_secs`).
    body_timeout: Duration,
    /// The agents' MCP connections, shut down when serving ends (the background retry of
    /// unreached optional servers adds to them).
    mcp: McpConnections,
}

/// The MCP connections of every build of the agents; taken (`None`) once serving ends,
/// to be shut down.
type McpConnections = Arc<Mutex<Option<Vec<Arc<agentry_runner::McpConnection>>>>>;

/// The first wait before an unreached optional MCP server is tried again; each miss
/// doubles it, up to [`MCP_RETRY_MAX`].
const MCP_RETRY_FIRST: Duration = Duration::from_secs(1);

/// The longest wait between two tries of an unreached optional MCP server.
const MCP_RETRY_MAX: Duration = Duration::from_secs(60);

impl Server {
    /// Checks the configuration, builds the agents and binds the address, then opens the
    /// store (creating it when it does not exist) and recovers abandoned turns: a start
    /// that fails before the store leaves no new file behind. With no API keys configured
    /// only loopback clients are served: a non-loopback listen address is replaced by
    /// `127.0.0.1` on the same port, and a warning says so.
    ///
    /// Errors: `Config` for an unusable configuration, `Store` when the store cannot be
    /// opened, `Bind` when the address is taken.
    pub async fn start(config: Config) -> Result<Self, ServerError> {
        let ready = Ready::new(&config).await?;
        let store = open_store(&config).await?;
        let file = FileIdentity::of(&config.storage.path).ok();
        Self::assemble(config, ready, store, file).await
    }

    /// As [`Server::start`], over a store the caller opened.
    ///
    /// Errors: as [`Server::start`].
    pub async fn start_with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, ServerError> {
        let ready = Ready::new(&config).await?;
        Self::assemble(config, ready, store, None).await
    }

    /// The server over its store, once everything else is [`Ready`].
    async fn assemble(
        config: Config,
        ready: Ready,
        store: Arc<dyn Store>,
        store_file: Option<FileIdentity>,
    ) -> Result<Self, ServerError> {
        let Ready { keys, approvals, control, built, options, listener } = ready;
        let lease_ttl = options.lease_ttl;
        let runtime = Runtime::with_options(store, options);
        for agent in built.agents {
            runtime.register(agent);
        }
        let mcp: McpConnections = Arc::new(Mutex::new(Some(built.mcp)));
        let (unreached, reuse) = (built.unreached, built.reuse);
        let (stop, stopping) = watch::channel(false);
        let feed = feed::FeedHub::start(runtime.store().clone(), runtime.events_appended(), stopping.clone())
            .await
            .map_err(|error| ServerError::Store {
                path: config.storage.path.display().to_string(),
                message: error.to_string(),
            })?;
        let state = Arc::new(AppState {
            feed,
            runtime,
            keys,
            public_metrics: config.public_metrics,
            metrics: Metrics::default(),
            approvals: approvals.clone(),
            control: control.clone(),
            policies: built.policies,
            heartbeat: Duration::from_secs(config.limits.heartbeat_secs.max(1)),
            stopping,
            running: Mutex::new(std::collections::HashMap::new()),
            agui_threads: agui::Threads::default(),
            agui_streams: agui::Streams::default(),
            streams: sse::StreamSlots::new(config.limits.streams_per_subject),
            store_file,
        });
        // Turns a dead process left running are finished in the background; the server
        // serves meanwhile (their sessions refuse new turns until their lease expires; then
        // a start on such a session resumes its turn at once). Passes run at start and
        // every half lease time: a turn whose lease was still live at a restart, or a turn
        // of another dead process sharing the store (or handed over by one that stopped),
        // is picked up within half a lease time of its lease's expiry.
        let recovering = Arc::clone(&state);
        let stopped = state.stopped();
        tokio::spawn(async move {
            let passes = async {
                let mut wait = Duration::ZERO;
                loop {
                    tokio::time::sleep(wait).await;
                    match recovering.runtime.recover().await {
                        Ok(turns) if !turns.is_empty() => {
                            tracing::info!(count = turns.len(), "recovered abandoned turns");
                            // Counted and awaited at shutdown like the turns this server starts.
                            for turn in &turns {
                                recovering.track(turn);
                            }
                        }
                        Ok(_) => {}
                        Err(error) => tracing::error!(%error, "recovering abandoned turns failed"),
                    }
                    wait = (lease_ttl / 2).max(Duration::from_secs(1));
                }
            };
            tokio::select! {
                () = passes => {},
                () = stopped => {},
            }
        });
        if !unreached.is_empty() {
            let retry = McpRetry { config: config.clone(), approvals, control, mcp: Arc::clone(&mcp), reuse };
            let stopped = state.stopped();
            let runtime = state.runtime.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = retry.run(runtime, unreached) => {},
                    () = stopped => {},
                }
            });
        }
        Ok(Self {
            state,
            listener,
            stop,
            body_limit: config.limits.body_bytes,
            cors: cors_layer(&config.cors_origins),
            grace: Duration::from_secs(config.limits.shutdown_grace_secs),
            header_timeout: Duration::from_secs(config.limits.header_timeout_secs),
            body_timeout: Duration::from_secs(config.limits.body_timeout_secs),
            mcp,
        })
    }

    /// The bound address (useful with port 0).
    ///
    /// # Panics
    /// Never in practice: a bound listener has an address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// How long a shutdown waits for requests under way and running turns
    /// (`limits.shutdown_grace_secs`).
    #[must_use]
    pub const fn grace(&self) -> Duration {
        self.grace
    }

    /// The runtime the server runs turns on.
    #[must_use]
    pub fn runtime(&self) -> &Runtime {
        &self.state.runtime
    }

    /// Serves until `shutdown` resolves; then stops accepting connections, ends event
    /// streams, and gives requests under way and running turns the configured grace to
    /// finish (a turn's progress is stored at every step either way; one still running
    /// afterwards is handed over, so the next start recovers it at once; a connection
    /// still open, a client that stalls in the middle of a request, is closed); last, it
    /// shuts down the agents' MCP servers.
    ///
    /// Errors: none today. A failed accept (too many open files) is waited out, and a
    /// connection's errors end only that connection; the `Result` leaves room for a
    /// listener that can fail for good (`Serve`).
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), ServerError> {
        self.run_with_force(shutdown, std::future::pending()).await
    }

    /// As [`Server::run`], and once `force` resolves (after `shutdown`; an operator's
    /// second signal, see [`ShutdownSignals`]) the grace ends at once: open connections
    /// are cut and running turns handed over, so the next start recovers them at once.
    ///
    /// Errors: as [`Server::run`].
    pub async fn run_with_force(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
        force: impl Future<Output = ()> + Send,
    ) -> Result<(), ServerError> {
        let mut app = router(self.state.clone(), self.body_limit, self.body_timeout);
        if let Some(cors) = self.cors {
            // Outermost: a preflight is answered before any route or key check (browsers
            // send no credentials with it), and every response, errors too, carries the
            // headers a page needs to read it.
            app = app.layer(cors);
        }
        let stop = self.stop;
        let stopped = self.state.stopped();
        let (signalled, shutting_down) = tokio::sync::oneshot::channel::<tokio::time::Instant>();
        let (cut, cut_when) = watch::channel(false);
        let listener = cut::CutListener { inner: self.listener, cut: cut_when };
        let signal = async move {
            shutdown.await;
            tracing::info!(
                "stopping: no new connections; event streams are cut (clients reconnect with their cursor)"
            );
            let _ = signalled.send(tokio::time::Instant::now());
            let _ = stop.send(true);
            stopped.await;
        };
        // The grace runs from the signal, for connections and turns together: a client that
        // stalls in the middle of a request (or stops reading a response) must not keep the
        // process from handing its turns over and shutting its MCP servers down.
        let mut serving = std::pin::pin!(cut::serve(listener, app, self.header_timeout, signal));
        let mut shutting_down = shutting_down;
        let stage = tokio::select! {
            biased;
            signalled = &mut shutting_down => match signalled {
                Ok(at) => Stage::Signalled(at),
                // The shutdown future went without a signal: serving is ending on its own.
                Err(_) => Stage::Ending,
            },
            () = &mut serving => Stage::Served,
        };
        // Serving ending on its own drains first; the grace for turns starts after.
        if matches!(stage, Stage::Ending) {
            serving.as_mut().await;
        }
        // The grace is over at its end, or at once when forced.
        let end = match stage {
            Stage::Signalled(at) => at + self.grace,
            Stage::Ending | Stage::Served => tokio::time::Instant::now() + self.grace,
        };
        let mut grace_over = std::pin::pin!(async {
            tokio::select! {
                () = tokio::time::sleep_until(end) => {}
                () = force => tracing::warn!("stopping at once, as asked: the grace is cut short"),
            }
        });
        let mut over = false;
        match stage {
            Stage::Signalled(_) => {
                tokio::select! {
                    () = &mut serving => {}
                    () = &mut grace_over => {
                        over = true;
                        // Their next read or write fails (one they wait on too), which ends them.
                        let _ = cut.send(true);
                        tracing::warn!(grace = ?self.grace, "connections still open after the grace are cut");
                    }
                }
            }
            Stage::Ending | Stage::Served => {}
        }
        // Every turn the runtime runs, also those no request of this server started (one a
        // start resumed for a dead process, one a recovery pass took over).
        let runtime = &self.state.runtime;
        let running = runtime.running_count();
        if running > 0 {
            tracing::info!(count = running, grace = ?self.grace, "waiting for running turns");
            let idle = if over {
                futures_util::FutureExt::now_or_never(runtime.idle()).is_some()
            } else {
                tokio::select! {
                    biased;
                    () = runtime.idle() => true,
                    () = &mut grace_over => false,
                }
            };
            if !idle {
                let handed = self.state.runtime.hand_over().await;
                tracing::warn!(
                    count = handed,
                    "turns still running after the grace: their leases expire now, so the next start recovers them at once"
                );
            }
        }
        // Every MCP session ends, and every stdio server's process group is shut down and
        // reaped, before the process exits: none is left behind, orphaned.
        // Taken: a rebuild that ends after this shuts its own new connections down.
        let connections = self.mcp.lock().unwrap_or_else(PoisonError::into_inner).take().unwrap_or_default();
        let closing = connections.iter().map(|connection| async move {
            if let Err(error) = connection.shutdown().await {
                tracing::warn!(server = %connection.session().name, %error, "an MCP server did not shut down cleanly");
            }
        });
        futures_util::future::join_all(closing).await;
        // The store's file alone holds every write acknowledged so far: the process may exit
        // before the store's last handle is dropped (tasks are dropped in the background).
        if let Err(error) = runtime.store().checkpoint().await {
            tracing::warn!(%error, "the store's file could not be made whole before stopping");
        }
        Ok(())
    }
}

/// Where serving stood when it stopped waiting for the shutdown signal.
enum Stage {
    /// The signal came at this instant.
    Signalled(tokio::time::Instant),
    /// Serving is ending without a signal.
    Ending,
    /// Serving ended.
    Served,
}

/// Tries the optional MCP servers that could not be reached at start again, in the
/// background, until every one is reached or the server stops.
struct McpRetry {
    config: Config,
    approvals: SpawnApprovals,
    control: TeamControl,
    mcp: McpConnections,
    /// What the last build made, for the next to take over.
    reuse: config::Reuse,
}

impl McpRetry {
    /// Waits [`MCP_RETRY_FIRST`], doubling up to [`MCP_RETRY_MAX`] after each miss, then
    /// tries each unreached server. Once one answers, every agent and team is built again
    /// ([`Config::rebuild_agents`]: connected servers and spawn policies are taken over,
    /// only unreached servers are connected anew) and, when the build reached more than
    /// the last, registered in place of it: new turns and sessions get the server's tools
    /// (gated as the configuration says), while turns already running keep the agents
    /// they started with.
    async fn run(mut self, runtime: Runtime, mut unreached: Vec<config::UnreachedMcpServer>) {
        let mut wait = MCP_RETRY_FIRST;
        while !unreached.is_empty() {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(MCP_RETRY_MAX);
            if !Self::any_answers(&unreached).await {
                continue;
            }
            let built = match self.config.rebuild_agents(&self.approvals, &self.control, &self.reuse).await {
                Ok(built) => built,
                Err(error) => {
                    tracing::error!(%error, "an unreached MCP server answers, but the agents cannot be built with it; trying again later");
                    continue;
                }
            };
            // A server that answered the probe but not the build: nothing changes.
            if built.unreached.len() >= unreached.len() {
                continue;
            }
            let serving = match self.mcp.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                Some(connections) => {
                    for connection in &built.mcp {
                        if !connections.iter().any(|known| Arc::ptr_eq(known, connection)) {
                            connections.push(Arc::clone(connection));
                        }
                    }
                    true
                }
                None => false,
            };
            if !serving {
                // Serving ended while the build ran: its new connections end with it.
                for connection in built.mcp {
                    let _ = connection.shutdown().await;
                }
                return;
            }
            for agent in built.agents {
                runtime.register(agent);
            }
            for reached in unreached.iter().filter(|old| {
                !built.unreached.iter().any(|still| still.agent == old.agent && still.server == old.server)
            }) {
                tracing::info!(agent = %reached.agent, server = %reached.server.name,
                    "an optional MCP server is reached: the agent has its tools from now on");
            }
            unreached = built.unreached;
            self.reuse = built.reuse;
            wait = MCP_RETRY_FIRST;
        }
    }

    /// Whether one of the unreached servers answers now (its probe is closed at once).
    async fn any_answers(unreached: &[config::UnreachedMcpServer]) -> bool {
        for server in unreached {
            if let Ok(connection) = agentry_runner::McpConnection::connect(server.server.clone()).await {
                let _ = connection.close().await;
                return true;
            }
        }
        false
    }
}

/// What a server needs besides its store: its configuration checked, its agents built and
/// its address bound.
struct Ready {
    keys: Keys,
    approvals: SpawnApprovals,
    control: TeamControl,
    built: config::BuiltAgents,
    options: RuntimeOptions,
    listener: tokio::net::TcpListener,
}

impl Ready {
    async fn new(config: &Config) -> Result<Self, ServerError> {
        let keys = Keys::new(config.api_keys()?);
        config.validate()?;
        let options = RuntimeOptions {
            lease_ttl: Duration::from_secs(config.runtime.lease_ttl_secs),
            live_retention: Duration::from_secs(config.runtime.live_retention_secs),
            live_delta_budget: config.runtime.live_delta_budget_bytes,
            cancel_poll: Duration::from_millis(config.runtime.cancel_poll_ms),
            ..RuntimeOptions::default()
        };
        let approvals = SpawnApprovals::new();
        let control = TeamControl::new();
        let built = config.build_agents(&approvals, &control).await?;
        let mut address = config.listen;
        if keys.is_empty() {
            if !address.ip().is_loopback() {
                tracing::warn!(
                    requested = %address,
                    "no API keys are configured: serving loopback clients only, on 127.0.0.1"
                );
                address = SocketAddr::from(([127, 0, 0, 1], address.port()));
            }
            tracing::info!(
                "no API keys are configured: every request acts as subject `local` (loopback only)"
            );
        }
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|error| ServerError::Bind { address, message: error.to_string() })?;
        Ok(Self { keys, approvals, control, built, options, listener })
    }
}

/// Opens the configured store.
async fn open_store(config: &Config) -> Result<Arc<dyn Store>, ServerError> {
    let storage = config.storage.clone();
    let path = storage.path.display().to_string();
    let opened = tokio::task::spawn_blocking(move || -> Result<Arc<dyn Store>, String> {
        // A new store says so: a mistyped path shows as a new, empty store in the log.
        let (backend, durability) = (storage.backend.as_str(), Durability::from(storage.durability).as_str());
        let exists = storage.path.exists();
        if exists {
            tracing::info!(path = %storage.path.display(), %backend, %durability, "opening the store");
        } else {
            tracing::info!(path = %storage.path.display(), %backend, %durability, "creating a new store");
        }
        // A new file named for the other backend is most likely meant for it (an existing
        // file of the other backend is refused, saying so).
        let named =
            storage.path.extension().and_then(|extension| extension.to_str()).map(str::to_ascii_lowercase);
        let named_for = match named.as_deref() {
            Some("redb") => Some(Backend::Redb),
            Some("db" | "sqlite" | "sqlite3") => Some(Backend::Sqlite),
            _ => None,
        };
        // The default name (`agentry.db`, whatever the backend) was not chosen: no warning.
        let chosen = storage.path != Config::default().storage.path;
        if let Some(named_for) =
            named_for.filter(|named_for| chosen && !exists && *named_for != storage.backend)
        {
            tracing::warn!(
                path = %storage.path.display(),
                %backend,
                "the store's file name says {}, but the backend is {backend}: set `[storage] backend` (or \
                 `agentry serve --backend`) if the file is meant for {}",
                named_for.as_str(),
                named_for.as_str()
            );
        }
        if let Some(parent) = storage.path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|error| {
                if parent.exists() && !parent.is_dir() {
                    format!("{} is not a directory, so no store file can be created in it", parent.display())
                } else {
                    format!("cannot create the store's directory {}: {error}", parent.display())
                }
            })?;
        }
        Ok(match storage.backend {
            Backend::Sqlite => Arc::new(
                SqliteStore::open(
                    &storage.path,
                    SqliteOptions { durability: storage.durability.into(), ..SqliteOptions::default() },
                )
                .map_err(|error| error.to_string())?,
            ),
            Backend::Redb => Arc::new(
                RedbStore::open(
                    &storage.path,
                    RedbOptions { durability: storage.durability.into(), ..RedbOptions::default() },
                )
                .map_err(|error| error.to_string())?,
            ),
        })
    })
    .await
    .map_err(|error| ServerError::Store { path: path.clone(), message: error.to_string() })?;
    opened.map_err(|message| ServerError::Store { path, message })
}

/// The process's SIGTERM and Ctrl-C, counted: the first asks for a shutdown, the next
/// for it at once ([`Server::run_with_force`]: an operator who signals again does not want
/// to wait out the grace). A signal within a second of the last one counted is not
/// counted: one Ctrl-C under a supervisor that forwards signals arrives as SIGINT and
/// SIGTERM together.
#[derive(Debug, Clone)]
pub struct ShutdownSignals {
    count: watch::Receiver<u32>,
}

impl ShutdownSignals {
    /// Starts listening. Must be called inside a Tokio runtime; signals are counted from
    /// the call on. A signal that cannot be listened for is logged and left out.
    #[must_use]
    pub fn listen() -> Self {
        let (counter, count) = watch::channel(0u32);
        // Made before the first signal, so none is missed between two.
        #[cfg(unix)]
        let mut listeners = {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| {
                signal(kind)
                    .map_err(|error| tracing::warn!(%error, "{name} cannot be listened for: it does not stop the server"))
                    .ok()
            };
            (listen(SignalKind::terminate(), "SIGTERM"), listen(SignalKind::interrupt(), "SIGINT"))
        };
        tokio::spawn(async move {
            let mut last: Option<tokio::time::Instant> = None;
            loop {
                #[cfg(unix)]
                {
                    tokio::select! {
                        () = next_signal(&mut listeners.0) => {}
                        () = next_signal(&mut listeners.1) => {}
                    }
                }
                #[cfg(not(unix))]
                if tokio::signal::ctrl_c().await.is_err() {
                    return std::future::pending::<()>().await;
                }
                let now = tokio::time::Instant::now();
                if last.is_some_and(|last| now.duration_since(last) < Duration::from_secs(1)) {
                    continue;
                }
                last = Some(now);
                counter.send_modify(|signals| *signals += 1);
            }
        });
        Self { count }
    }

    /// Resolves once `n` signals were counted (never, if the listener is gone).
    pub fn nth(&self, n: u32) -> impl Future<Output = ()> + Send + 'static {
        let mut count = self.count.clone();
        async move {
            if count.wait_for(|signals| *signals >= n).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The next signal a listener hears; never without a listener (or once it is closed).
#[cfg(unix)]
async fn next_signal(listener: &mut Option<tokio::signal::unix::Signal>) {
    let heard = match listener {
        Some(listener) => listener.recv().await.is_some(),
        None => false,
    };
    if !heard {
        std::future::pending::<()>().await;
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// The CORS layer for the configured origins (checked by [`Config::validate`]): the
/// methods and request headers the API takes, and preflights cached for ten minutes.
fn cors_layer(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{HeaderName, HeaderValue, Method, header};
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|origin| origin == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|origin| HeaderValue::from_str(origin).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::ACCEPT,
                HeaderName::from_static("last-event-id"),
                HeaderName::from_static(harness::IDEMPOTENCY_KEY),
            ])
            .expose_headers([HeaderName::from_static(harness::IDEMPOTENT_REPLAYED)])
            .max_age(Duration::from_secs(600)),
    )
}

/// Every route.
fn router(state: Arc<AppState>, body_limit: usize, body_timeout: Duration) -> Router {
    Router::new()
        .route("/healthz", get(health))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics::render))
        .merge(harness::routes())
        .merge(feed::routes())
        .merge(team_routes::routes())
        .merge(agui::routes())
        .fallback(|| async { ApiError::new(axum::http::StatusCode::NOT_FOUND, "no_route", "no such route") })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            let message = format!("this route does not take {method}");
            ApiError::new(axum::http::StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message)
        })
        .layer(DefaultBodyLimit::max(body_limit))
        // A body that stalls fails its read (`JsonBody` answers 408) rather than holding
        // its connection and handler for ever.
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(body_timeout))
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth::local_only))
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::count_requests))
        .with_state(state)
}

/// Error responses axum's extractors make themselves (a path segment that is not UTF-8, a
/// query that does not parse) are plain text: they become `RequestErrorResponse` bodies
/// like every other error, with the same status and message.
async fn json_errors(response: axum::response::Response) -> axum::response::Response {
    let plain = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/plain"));
    let status = response.status();
    if !(plain && (status.is_client_error() || status.is_server_error())) {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), 64 * 1024).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let message =
        if text.is_empty() { status.canonical_reason().unwrap_or("error").to_owned() } else { text };
    let code =
        if status == axum::http::StatusCode::BAD_REQUEST { "invalid_request" } else { "request_error" };
    ApiError::new(status, code, message).into_response()
}

async fn health() -> impl IntoResponse {
    axum::Json(serde_json::json!({"status": "ok"}))
}

/// Ready when the store answers a read.
async fn ready(State(state): State<Arc<AppState>>) -> axum::response::Response {
    match metrics::probe_store(&state).await {
        Ok(_) => axum::Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(error) => {
            tracing::error!(%error, "readiness probe failed");
            ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "the store is not usable (the server log says why)",
            )
            .into_response()
        }
    }
}
