//! The server's configuration: one TOML file, or the embedded default.
//!
//! ```toml
//! listen = "127.0.0.1:8787"
//! demo_agents = true               # the built-in `demo` and `demo-team`
//! public_metrics = false           # true: `/metrics` takes no key even with `[[keys]]`
//! cors_origins = ["https://app.example.com"]   # web pages that may call it from a browser ("*": any)
//!
//! [storage]
//! backend = "sqlite"               # or "redb"
//! path = "agentry.db"
//! durability = "batched"           # "strict", "batched" or "relaxed"
//!
//! [[keys]]                         # bearer API keys and the subject each acts as
//! key_env = "AGENTRY_KEY_ALICE"    # or `key = "…"`
//! subject = "alice"
//!
//! [providers.openai]               # OpenAI-compatible chat completions
//! base_url = "https://api.openai.com/v1"
//! api_key_env = "OPENAI_API_KEY"
//! model = "gpt-4o-mini"
//! timeout_secs = 60                # until the response's headers arrive
//! stream_idle_timeout_secs = 300   # the longest silence inside a streamed answer
//! max_retries = 3                   # after a 429, a 5xx or a failed connection, before any token
//! headers = { "HTTP-Referer" = "https://example.com" }   # sent with every request
//!
//! [[agents]]
//! name = "helper"
//! model = "openai"                 # a provider name, or "demo" for the scripted rules
//! instructions = "You are helpful."
//! tools = ["calculator", "send_email"]
//! requires_approval = ["send_email"]
//! ask_user_question = true
//! max_iterations = 25
//! timeout_secs = 300
//! max_tool_output_bytes = 131072   # a longer tool result is cut, saying how much was left out
//! [[agents.mcp]]
//! name = "everything"
//! command = "npx"                  # stdio; or `url = "http://…/mcp"` for streamable HTTP
//! args = ["-y", "@modelcontextprotocol/server-everything"]
//! env = { LOG_LEVEL = "info" }     # stdio: variables to set (it inherits only PATH, HOME, …)
//! inherit_env = ["GITHUB_TOKEN"]   # stdio: variables of the server's own to pass on
//! tools = ["get-sum", "echo"]      # only these of its tools (two tools may not share a name)
//! optional = false                 # true: start without its tools when it cannot be reached
//!                                   # (tried again in the background until it answers)
//! [agents.memory]                  # seed 003's memory (for an agent a session runs, not a
//!                                   # team member); history is always the recent turns
//! num_last_messages = 20           # about this many messages of history (a call and its
//!                                   # results are kept together, so a few more may come)
//! summary_memory = true            # keep a running summary (a model call after each run)
//! user_analysis_memory = true      # keep a profile of the user (a model call after each run)
//! user_profile_schema = { type = "object", properties = { name = { type = "string" } } }
//! dynamic_user_profile = false     # let the profile grow fields beyond the schema
//! feed_tool_call_results = false   # show tool calls and results to those model calls
//! user_memory_mode = "update"      # or "replace": how a new profile meets the stored one
//! model = "openai"                 # the provider of those calls (the agent's own by default)
//!
//! [[teams]]
//! name = "crew"
//! model = "openai"
//! members = ["helper"]
//! spawn_policy = "spawn-policy.toml" # must exist (relative to the working directory); checked
//!                                  # at start: budgets that allow no model call are refused, and
//!                                  # templates may name as `model` only `demo` or a provider, as
//!                                  # `tools` only built-in tools or tools of configured agents
//!                                  # (not of teams, nor tools an agent gates: spawns ask no approval)
//! tokens_per_step = 1000           # held from budgets before each model call of an instance
//!
//! [limits]
//! body_bytes = 8388608             # the largest request body (413 above it; at least 1024)
//! heartbeat_secs = 15              # SSE keep-alives and feed heartbeats
//! shutdown_grace_secs = 10         # how long SIGTERM waits for requests and running turns
//!                                   # (a second SIGTERM or Ctrl-C stops at once)
//! streams_per_subject = 64         # event streams one caller may have open at once
//! header_timeout_secs = 30         # to send a request's headers (and idle between requests)
//! body_timeout_secs = 30           # a request body may go without data (then 408)
//!
//! [runtime]
//! lease_ttl_secs = 30              # a crashed process's turns are recovered after this
//! live_retention_secs = 60         # finished turns' live logs (with deltas) kept this long
//! live_delta_budget_bytes = 8388608 # a turn's deltas kept one by one; past it, merged runs
//! cancel_poll_ms = 500             # how soon a cancel sent to another server of the store acts
//! ```
//!
//! Every section and key is optional; unknown keys are errors. Durations (`*_secs`) are at
//! most a year ([`MAX_SECS`]); `lease_ttl_secs` and timeouts at least a second
//! (`heartbeat_secs = 0` means 1). An agent with `model = "demo"` runs the demo agent's rules with its own tools
//! and instructions: it takes `max_iterations` and `timeout_secs`, and refuses `tools`,
//! `requires_approval`, `ask_user_question`, `mcp`, `memory` and `instructions`. Every provider is
//! built at start, also one no agent uses, and two subjects cannot share an API key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentry_memory::Durability;
use agentry_model::{Model, OpenAiCompatibleModel, OpenAiConfig, ScriptedModel, ScriptedResponse};
use agentry_runner::{
    Agent, AgentLimits, FunctionTool, McpConnection, McpServerConfig, RuntimeOptions, ToolError,
};
use agentry_team::{SpawnApprovals, SpawnCatalog, SpawnPolicy, Team, TeamControl};
use agentry_types::Subject;
use serde::Deserialize;

use crate::demo;

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("cannot read {path}: {message}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The file is not valid configuration TOML.
    #[error("invalid configuration{}: {message}", path.as_ref().map(|path| format!(" in {}", path.display())).unwrap_or_default())]
    Parse {
        /// The file, when there is one.
        path: Option<PathBuf>,
        /// What is wrong, with the line.
        message: String,
    },
    /// The configuration is well-formed but inconsistent.
    #[error("invalid configuration: {0}")]
    Invalid(String),
    /// Something the configuration names cannot be reached or started now (an MCP server
    /// that is not marked optional).
    #[error("cannot start: {0}")]
    Unavailable(String),
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The address to listen on.
    #[serde(default = "default_listen", deserialize_with = "listen_address")]
    pub listen: SocketAddr,
    /// Whether to register the built-in `demo` agent and `demo-team` team.
    #[serde(default = "yes")]
    pub demo_agents: bool,
    /// Where sessions, turns and events are stored.
    #[serde(default)]
    pub storage: StorageConfig,
    /// Bearer API keys; with none, only loopback clients are served (as subject `local`).
    #[serde(default)]
    pub keys: Vec<ApiKeyConfig>,
    /// Whether `GET /metrics` answers without an API key when keys are configured, for a
    /// scraper that sends no credentials. Off by default: with keys, metrics take a key
    /// (any configured one), as every other route but the health checks does.
    #[serde(default)]
    pub public_metrics: bool,
    /// Web origins (`scheme://host[:port]`, as a browser sends in `Origin`) whose pages may
    /// call the API from a browser, or `"*"` for any: responses to them carry CORS headers,
    /// and their preflight requests are answered. Empty (the default): no CORS headers, so
    /// browsers let only pages of the server's own origin read its responses. This does not
    /// replace API keys: without keys only loopback origins are served.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Model providers by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Agents.
    #[serde(default)]
    pub agents: Vec<AgentConfig>,
    /// Teams.
    #[serde(default)]
    pub teams: Vec<TeamConfig>,
    /// Request and stream limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// How turns are run.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// The file it was read from, named in its errors (`None` for text parsed without one).
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

/// How turns are run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Seconds a turn's lease lasts without renewal: after a crash, its turns are recovered
    /// by the next process this long after they were last renewed.
    #[serde(default = "default_lease")]
    pub lease_ttl_secs: u64,
    /// Seconds a finished turn's live log (with deltas) stays in memory for subscribers.
    #[serde(default = "default_retention")]
    pub live_retention_secs: u64,
    /// About how many bytes of a turn's deltas its live log keeps one by one; past it, runs
    /// of text deltas are merged (see `RuntimeOptions::live_delta_budget`).
    #[serde(default = "default_delta_budget")]
    pub live_delta_budget_bytes: usize,
    /// Milliseconds between this server's looks for cancellations that other servers sharing
    /// its store stored for the turns it runs (one session read per running turn each time;
    /// see `RuntimeOptions::cancel_poll`): the looks are at most this far apart, and at
    /// most a third of `lease_ttl_secs`. Between 10 and 3,600,000.
    #[serde(default = "default_cancel_poll")]
    pub cancel_poll_ms: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            lease_ttl_secs: default_lease(),
            live_retention_secs: default_retention(),
            live_delta_budget_bytes: default_delta_budget(),
            cancel_poll_ms: default_cancel_poll(),
        }
    }
}

/// A storage backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// SQLite (WAL).
    #[default]
    Sqlite,
    /// redb.
    Redb,
}

impl Backend {
    /// Its name in the configuration (`sqlite`, `redb`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Redb => "redb",
        }
    }
}

/// How hard the store works to keep acknowledged writes across a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum DurabilitySetting {
    /// Every write synced on its own.
    Strict,
    /// Concurrent writes committed together, synced (the default).
    #[default]
    Batched,
    /// Committed without a sync per commit.
    Relaxed,
}

impl From<DurabilitySetting> for Durability {
    fn from(setting: DurabilitySetting) -> Self {
        match setting {
            DurabilitySetting::Strict => Self::Strict,
            DurabilitySetting::Batched => Self::Batched,
            DurabilitySetting::Relaxed => Self::Relaxed,
        }
    }
}

/// The store.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    /// `sqlite` or `redb`.
    #[serde(default)]
    pub backend: Backend,
    /// The file (relative paths are relative to the working directory).
    #[serde(default = "default_path")]
    pub path: PathBuf,
    /// `strict`, `batched` or `relaxed`.
    #[serde(default)]
    pub durability: DurabilitySetting,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self { backend: Backend::Sqlite, path: default_path(), durability: DurabilitySetting::Batched }
    }
}

/// One API key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The key itself (prefer `key_env`: keys do not belong in files).
    #[serde(default)]
    pub key: Option<String>,
    /// The environment variable holding the key.
    #[serde(default)]
    pub key_env: Option<String>,
    /// The subject requests with this key act as.
    pub subject: String,
}

/// The most retries a provider may be given: each may wait up to 20 seconds.
const MAX_PROVIDER_RETRIES: u32 = 10;

/// An OpenAI-compatible provider. Its `Debug` output shows header names, not values.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The API base URL (default `https://api.openai.com/v1`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The model id.
    pub model: String,
    /// Seconds a request may take to be answered (its status and headers; default 60).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Seconds a streamed answer may send nothing before the call fails as stalled
    /// (default 300).
    #[serde(default)]
    pub stream_idle_timeout_secs: Option<u64>,
    /// Retries of a request that failed before its response (a 429, a 5xx status, a
    /// failed connection; default 3, at most 10). Each is logged as a warning.
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// Headers sent with every request (for example `OpenAI-Organization`, or OpenRouter's
    /// `HTTP-Referer`); the key is sent as `Authorization: Bearer` from `api_key_env`.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for ProviderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderConfig")
            .field("base_url", &self.base_url)
            .field("api_key_env", &self.api_key_env)
            .field("model", &self.model)
            .field("timeout_secs", &self.timeout_secs)
            .field("stream_idle_timeout_secs", &self.stream_idle_timeout_secs)
            .field("max_retries", &self.max_retries)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// An MCP server an agent uses.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// Its name.
    pub name: String,
    /// The command of a stdio server.
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The URL of a streamable-HTTP server.
    #[serde(default)]
    pub url: Option<String>,
    /// The environment variable holding a bearer token for an HTTP server.
    #[serde(default)]
    pub bearer_token_env: Option<String>,
    /// Variables set for a stdio server. It gets no other variable of the server's
    /// environment than `PATH`, `HOME` and the like (`agentry_runner::MCP_INHERITED_ENV`)
    /// and those named in `inherit_env`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables of the server's own environment passed on to a stdio server (each must be
    /// set), for example the token it needs, or `HTTPS_PROXY` for one behind a proxy.
    #[serde(default)]
    pub inherit_env: Vec<String>,
    /// Offers only these tools of the server (all when absent); each must be one of its
    /// tools. Two tools of one agent may not share a name: this leaves one out.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// When the server cannot be reached (or started) at start, start the agent without
    /// its tools, logging an error, instead of refusing to start (the default); a
    /// [`Server`](crate::Server) then tries it again in the background, and its tools
    /// join the agent once it answers and the agents build with them.
    #[serde(default)]
    pub optional: bool,
}

/// An agent.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// Its name (what sessions are created for).
    pub name: String,
    /// A provider name from `[providers]`, or `demo`.
    pub model: String,
    /// Its instructions.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Built-in server-side tools: `calculator`, `echo`, `send_email`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Tools whose calls wait for a person's approval.
    #[serde(default)]
    pub requires_approval: Vec<String>,
    /// Whether it may ask the user with the client-side `ask_user_question`.
    #[serde(default)]
    pub ask_user_question: bool,
    /// MCP servers whose tools it gets.
    #[serde(default)]
    pub mcp: Vec<McpConfig>,
    /// Model calls per turn.
    #[serde(default)]
    pub max_iterations: Option<u32>,
    /// Seconds a turn may take before it is cancelled (`server-execution-timeout`).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// The most bytes of one tool result kept (default 128 KiB); a longer one is cut and
    /// says how much was left out.
    #[serde(default)]
    pub max_tool_output_bytes: Option<usize>,
    /// Memory (seed 003): history, a running summary, a user profile.
    #[serde(default)]
    pub memory: Option<MemorySettings>,
}

/// An agent's `[agents.memory]`: the settings of seed 003's memory (see
/// [`agentry_memory::MemoryConfig`]), and the provider that writes summaries and profiles.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySettings {
    /// Keep a running summary of the session (a model call after each run).
    #[serde(default)]
    pub summary_memory: bool,
    /// Keep a profile of the user (a model call after each run).
    #[serde(default)]
    pub user_analysis_memory: bool,
    /// A JSON Schema (an object schema) the profile follows.
    #[serde(default)]
    pub user_profile_schema: Option<serde_json::Value>,
    /// Let the profile grow fields beyond the schema.
    #[serde(default)]
    pub dynamic_user_profile: bool,
    /// Replay about this many messages of history: a cut never separates a tool call
    /// from its results, so a few more may be replayed.
    #[serde(default)]
    pub num_last_messages: Option<usize>,
    /// Show tool calls and results to the summary and profile calls.
    #[serde(default)]
    pub feed_tool_call_results: bool,
    /// `update` (merge a new profile into the stored one, the default) or `replace`.
    #[serde(default)]
    pub user_memory_mode: MemoryMode,
    /// The provider of the summary and profile calls; the agent's own by default.
    #[serde(default)]
    pub model: Option<String>,
}

/// How a new user profile meets the stored one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryMode {
    /// Merge the new facts into the stored profile.
    #[default]
    Update,
    /// Replace the stored profile.
    Replace,
}

impl MemorySettings {
    /// The facade's settings.
    fn config(&self) -> agentry_memory::MemoryConfig {
        agentry_memory::MemoryConfig {
            summary_memory: self.summary_memory,
            user_analysis_memory: self.user_analysis_memory,
            user_profile_schema: self.user_profile_schema.clone(),
            dynamic_user_profile: self.dynamic_user_profile,
            num_last_messages: self.num_last_messages,
            feed_tool_call_results: self.feed_tool_call_results,
            user_memory_mode: match self.user_memory_mode {
                MemoryMode::Update => agentry_memory::UserMemoryMode::Update,
                MemoryMode::Replace => agentry_memory::UserMemoryMode::Replace,
            },
            ..agentry_memory::MemoryConfig::default()
        }
    }
}

/// A team (coordinate mode).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeamConfig {
    /// Its name.
    pub name: String,
    /// The coordinator's provider name, or `demo`: a scripted coordinator that answers
    /// `Hello from the demo model.` without delegating (for trying the configuration out;
    /// the built-in `demo-team` has rules of its own).
    pub model: String,
    /// The coordinator's instructions.
    #[serde(default)]
    pub instructions: Option<String>,
    /// Member agents, by name from `[[agents]]`.
    #[serde(default)]
    pub members: Vec<String>,
    /// The spawn policy file (relative to the working directory; it must exist). Without
    /// one, `spawn_agent` is denied.
    #[serde(default)]
    pub spawn_policy: Option<PathBuf>,
    /// Tokens an instance holds from its budgets before each model call, settled with the
    /// real count after (default 1,000; at least 1). A `max_tokens` below it allows no
    /// model call at all: the reservation is refused and the instance stops as exhausted.
    #[serde(default)]
    pub tokens_per_step: Option<u64>,
}

/// Request and stream limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest request body, in bytes.
    #[serde(default = "default_body_bytes")]
    pub body_bytes: usize,
    /// Seconds between SSE keep-alive comments and feed heartbeats.
    #[serde(default = "default_heartbeat")]
    pub heartbeat_secs: u64,
    /// Seconds requests under way and running turns get to finish when the server is
    /// asked to stop (connections still open after it are cut, turns handed over).
    #[serde(default = "default_grace")]
    pub shutdown_grace_secs: u64,
    /// The most event streams (turn streams, subscriptions, feeds, AG-UI runs) one caller
    /// may have open at once; one more is refused with 429 `too_many_streams`.
    #[serde(default = "default_streams")]
    pub streams_per_subject: usize,
    /// Seconds a connection has to send a request's headers, counted from when it is ready
    /// for them (its opening, or the end of its previous response); a connection over it,
    /// one that stalls or sits idle between requests, is closed.
    #[serde(default = "default_header_timeout")]
    pub header_timeout_secs: u64,
    /// Seconds a request body may go without sending data; a body over it is refused with
    /// 408 `request_timeout` and its connection closed.
    #[serde(default = "default_body_timeout")]
    pub body_timeout_secs: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            body_bytes: default_body_bytes(),
            heartbeat_secs: default_heartbeat(),
            shutdown_grace_secs: default_grace(),
            streams_per_subject: default_streams(),
            header_timeout_secs: default_header_timeout(),
            body_timeout_secs: default_body_timeout(),
        }
    }
}

/// An IP address and port; a host name is refused with an example of what is meant.
fn listen_address<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "{text:?} is not an IP address and port: give one such as \"127.0.0.1:8787\", \"0.0.0.0:8787\" \
             or \"[::1]:8787\" (a host name such as localhost is not looked up)"
        ))
    })
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8787))
}
fn default_path() -> PathBuf {
    PathBuf::from("agentry.db")
}
const fn yes() -> bool {
    true
}
const fn default_body_bytes() -> usize {
    8 * 1024 * 1024
}
const fn default_heartbeat() -> u64 {
    15
}
/// The longest duration a `*_secs` key takes: a year. Longer ones overflow clocks and
/// stored timestamps.
pub const MAX_SECS: u64 = 365 * 24 * 60 * 60;

/// The smallest `limits.body_bytes` allowed: below it even a short request is refused.
pub const MIN_BODY_BYTES: usize = 1024;

const fn default_grace() -> u64 {
    10
}
const fn default_streams() -> usize {
    64
}
const fn default_header_timeout() -> u64 {
    30
}
const fn default_body_timeout() -> u64 {
    30
}
const fn default_lease() -> u64 {
    30
}
const fn default_retention() -> u64 {
    60
}

fn default_delta_budget() -> usize {
    RuntimeOptions::default().live_delta_budget
}
fn default_cancel_poll() -> u64 {
    u64::try_from(RuntimeOptions::default().cancel_poll.as_millis()).unwrap_or(u64::MAX)
}

impl Default for Config {
    /// The embedded default: SQLite `agentry.db` in the working directory, `127.0.0.1:8787`,
    /// the demo agents, and `assistant` on OpenAI when `OPENAI_API_KEY` is set
    /// (`OPENAI_BASE_URL` and `AGENTRY_MODEL` optional).
    fn default() -> Self {
        let mut config = Self {
            listen: default_listen(),
            demo_agents: true,
            storage: StorageConfig::default(),
            keys: Vec::new(),
            public_metrics: false,
            cors_origins: Vec::new(),
            providers: BTreeMap::new(),
            agents: Vec::new(),
            teams: Vec::new(),
            limits: LimitsConfig::default(),
            runtime: RuntimeConfig::default(),
            path: None,
        };
        if std::env::var_os("OPENAI_API_KEY").is_some_and(|key| !key.is_empty()) {
            config.providers.insert(
                "openai".to_owned(),
                ProviderConfig {
                    base_url: std::env::var("OPENAI_BASE_URL").ok().filter(|url| !url.is_empty()),
                    api_key_env: Some("OPENAI_API_KEY".to_owned()),
                    model: std::env::var("AGENTRY_MODEL")
                        .ok()
                        .filter(|model| !model.is_empty())
                        .unwrap_or_else(|| "gpt-4o-mini".to_owned()),
                    timeout_secs: None,
                    stream_idle_timeout_secs: None,
                    max_retries: None,
                    headers: std::collections::BTreeMap::new(),
                },
            );
            config.agents.push(AgentConfig {
                name: "assistant".to_owned(),
                model: "openai".to_owned(),
                instructions: Some("You are a helpful assistant.".to_owned()),
                tools: vec!["calculator".to_owned()],
                requires_approval: Vec::new(),
                ask_user_question: true,
                mcp: Vec::new(),
                max_iterations: None,
                timeout_secs: None,
                max_tool_output_bytes: None,
                memory: None,
            });
        }
        config
    }
}

/// Checks a URL the server connects to: absolute, `http` or `https`, with a host.
fn check_http_url(url: &str) -> Result<(), &'static str> {
    let parsed: axum::http::Uri =
        url.parse().map_err(|_| "it is not a URL (an http:// or https:// URL is needed)")?;
    match parsed.scheme_str() {
        Some("http" | "https") => {}
        Some(_) => return Err("only http:// and https:// URLs are taken"),
        None => return Err("it is not an absolute URL (an http:// or https:// URL is needed)"),
    }
    if parsed.host().is_none_or(str::is_empty) {
        return Err("it names no host");
    }
    // A port the URL type does not take is dropped by it, not refused: read it here.
    let host_port = parsed.authority().and_then(|authority| authority.as_str().rsplit('@').next());
    let port = host_port.and_then(|host_port| host_port.rsplit_once(':')).map(|(_, port)| port);
    if let Some(port) = port.filter(|port| !port.contains(']'))
        && port.parse::<u16>().map_or(true, |port| port == 0)
    {
        return Err("its port is not a number from 1 to 65535");
    }
    Ok(())
}

/// [`check_http_url`] for a base URL, which paths are appended to: no query or fragment.
fn check_base_url(url: &str) -> Result<(), &'static str> {
    check_http_url(url)?;
    if url.contains(['?', '#']) {
        return Err("a base URL takes no query or fragment (`/chat/completions` is appended to its path)");
    }
    Ok(())
}

/// Whether `origin` is a web origin as browsers send it (`scheme://host[:port]`: no
/// path, no trailing slash), or `*`.
fn check_origin(origin: &str) -> Result<(), &'static str> {
    if origin == "*" {
        return Ok(());
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return Err("an origin is scheme://host[:port], such as \"https://app.example.com\"");
    };
    if scheme != "http" && scheme != "https" {
        return Err("an origin's scheme is http or https");
    }
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return Err("an origin has a host and an optional port only, with no path or trailing slash");
    }
    if axum::http::HeaderValue::from_str(origin).is_err() || !origin.is_ascii() {
        return Err("an origin is ASCII text (a browser sends international names punycoded)");
    }
    Ok(())
}

impl Config {
    /// Parses a configuration; `path` is named in errors, also in those of
    /// [`Config::build_agents`].
    ///
    /// Errors: `Parse` with the line of the first problem when it is not valid TOML of this
    /// shape; `Invalid` when a value is out of its range (see [`Config::validate`]).
    pub fn parse(text: &str, path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut config: Self = toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: path.map(Path::to_path_buf),
            message: error.to_string(),
        })?;
        config.path = path.map(Path::to_path_buf);
        config.validate().map_err(|error| config.in_file(error))?;
        Ok(config)
    }

    /// `error`, naming the file the configuration came from.
    fn in_file(&self, error: ConfigError) -> ConfigError {
        match (error, &self.path) {
            (ConfigError::Invalid(message), Some(path)) => {
                ConfigError::Invalid(format!("{}: {message}", path.display()))
            }
            (ConfigError::Unavailable(message), Some(path)) => {
                ConfigError::Unavailable(format!("{}: {message}", path.display()))
            }
            (error, _) => error,
        }
    }

    /// Checks what the file's shape cannot: every duration is at most a year
    /// ([`MAX_SECS`]), the lease time and timeouts are at least a second,
    /// `runtime.cancel_poll_ms` is between 10 ms and an hour, and agent and team names are
    /// not empty.
    ///
    /// Errors: `Invalid` naming the key and its allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let within = |key: String, value: u64, least: u64| {
            if (least..=MAX_SECS).contains(&value) {
                Ok(())
            } else {
                Err(ConfigError::Invalid(format!(
                    "{key} is {value}; it must be between {least} and {MAX_SECS} (a year)"
                )))
            }
        };
        if self.storage.path.to_str().is_some_and(|path| path.trim().is_empty()) {
            return Err(ConfigError::Invalid(format!(
                "storage.path is {:?}; name the store's file (the default is \"agentry.db\")",
                self.storage.path.display().to_string()
            )));
        }
        within("runtime.lease_ttl_secs".to_owned(), self.runtime.lease_ttl_secs, 1)?;
        within("runtime.live_retention_secs".to_owned(), self.runtime.live_retention_secs, 0)?;
        if !(10..=3_600_000).contains(&self.runtime.cancel_poll_ms) {
            return Err(ConfigError::Invalid(format!(
                "runtime.cancel_poll_ms is {}; it must be between 10 and 3600000 (an hour)",
                self.runtime.cancel_poll_ms
            )));
        }
        within("limits.heartbeat_secs".to_owned(), self.limits.heartbeat_secs, 0)?;
        within("limits.shutdown_grace_secs".to_owned(), self.limits.shutdown_grace_secs, 0)?;
        within("limits.header_timeout_secs".to_owned(), self.limits.header_timeout_secs, 1)?;
        within("limits.body_timeout_secs".to_owned(), self.limits.body_timeout_secs, 1)?;
        if self.limits.streams_per_subject == 0 {
            return Err(ConfigError::Invalid(
                "limits.streams_per_subject is 0; it must be at least 1 (every event stream would be refused)"
                    .to_owned(),
            ));
        }
        if self.limits.body_bytes < MIN_BODY_BYTES {
            return Err(ConfigError::Invalid(format!(
                "limits.body_bytes is {}; it must be at least {MIN_BODY_BYTES} (every request with a body would be refused)",
                self.limits.body_bytes
            )));
        }
        for (index, origin) in self.cors_origins.iter().enumerate() {
            check_origin(origin).map_err(|problem| {
                ConfigError::Invalid(format!("cors_origins[{index}] is {origin:?}: {problem}"))
            })?;
        }
        if self.cors_origins.len() > 1 && self.cors_origins.iter().any(|origin| origin == "*") {
            return Err(ConfigError::Invalid(
                "cors_origins has \"*\" (any origin) beside other origins; give \"*\" alone or only origins"
                    .to_owned(),
            ));
        }
        for (name, provider) in &self.providers {
            if name.trim().is_empty() || name.trim() != name {
                return Err(ConfigError::Invalid(format!(
                    "providers.{name:?}: a provider's name must not be blank or have spaces around it"
                )));
            }
            if name == "demo" {
                return Err(ConfigError::Invalid(
                    "providers.demo: `model = \"demo\"` names the built-in scripted model, so a provider of that \
                     name would never be used; give it another name"
                        .to_owned(),
                ));
            }
            if let Some(url) = &provider.base_url {
                check_base_url(url).map_err(|problem| {
                    ConfigError::Invalid(format!("providers.{name}.base_url is {url:?}: {problem}"))
                })?;
            }
            if let Some(secs) = provider.timeout_secs {
                within(format!("providers.{name}.timeout_secs"), secs, 1)?;
            }
            if let Some(secs) = provider.stream_idle_timeout_secs {
                within(format!("providers.{name}.stream_idle_timeout_secs"), secs, 1)?;
            }
            if let Some(retries) = provider.max_retries.filter(|retries| *retries > MAX_PROVIDER_RETRIES) {
                return Err(ConfigError::Invalid(format!(
                    "providers.{name}.max_retries is {retries}; it must be at most {MAX_PROVIDER_RETRIES}"
                )));
            }
        }
        for agent in &self.agents {
            if agent.name.trim().is_empty() {
                return Err(ConfigError::Invalid("an agent's name must not be empty".to_owned()));
            }
            if let Some(secs) = agent.timeout_secs {
                within(format!("agent {:?}: timeout_secs", agent.name), secs, 1)?;
            }
            if agent.max_iterations == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?}: max_iterations is 0; it must be at least 1 (every turn would end before its first model call)",
                    agent.name
                )));
            }
            if agent.max_tool_output_bytes == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?}: max_tool_output_bytes is 0; it must be at least 1",
                    agent.name
                )));
            }
            if let Some(twice) = agent
                .requires_approval
                .iter()
                .enumerate()
                .find(|(at, gated)| agent.requires_approval[..*at].contains(gated))
            {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?}: requires_approval names {:?} twice",
                    agent.name, twice.1
                )));
            }
            for (at, server) in agent.mcp.iter().enumerate() {
                if server.name.trim().is_empty() {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: MCP server {at} has no name; name it (its tools' events and errors say it)",
                        agent.name
                    )));
                }
                if server.name.trim() != server.name {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: MCP server {:?} has spaces around its name",
                        agent.name, server.name
                    )));
                }
                if agent.mcp[..at].iter().any(|earlier| earlier.name == server.name) {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: two MCP servers are named {:?}; give each its own name",
                        agent.name, server.name
                    )));
                }
                // A URL that cannot work is a setting to fix, also for an optional server:
                // it would be retried for ever as if the server were down.
                if let Some(url) = &server.url {
                    check_http_url(url).map_err(|problem| {
                        ConfigError::Invalid(format!(
                            "agent {:?}: MCP server {:?}: url is {url:?}: {problem}",
                            agent.name, server.name
                        ))
                    })?;
                }
            }
        }
        // A member's thread runs without memory (a team session's memory is the team's):
        // said once, at start, rather than left to be found.
        for team in &self.teams {
            let remembering = team.members.iter().filter_map(|member| {
                self.agents.iter().find(|agent| agent.name == *member && agent.memory.is_some())
            });
            for agent in remembering {
                tracing::warn!(team = %team.name, agent = %agent.name,
                    "the agent's [agents.memory] applies to its own sessions, not to its turns as a team member");
            }
        }
        if self.teams.iter().any(|team| team.name.trim().is_empty()) {
            return Err(ConfigError::Invalid("a team's name must not be empty".to_owned()));
        }
        if let Some(team) = self.teams.iter().find(|team| team.tokens_per_step == Some(0)) {
            return Err(ConfigError::Invalid(format!(
                "team {:?}: tokens_per_step must be at least 1",
                team.name
            )));
        }
        if let Some(team) =
            self.teams.iter().find(|team| team.members.is_empty() && team.spawn_policy.is_none())
        {
            return Err(ConfigError::Invalid(format!(
                "team {:?} has no members and no spawn policy, so it can hand work to no one: list agents in \
                 `members` or give a `spawn_policy`",
                team.name
            )));
        }
        Ok(())
    }

    /// Reads and parses a configuration file.
    ///
    /// Errors: `Read` when the file cannot be read; `Parse` when it is not valid.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| ConfigError::Read { path: path.to_path_buf(), message: error.to_string() })?;
        Self::parse(&text, Some(path))
    }

    /// The API keys and their subjects, read from the environment where the file says so.
    ///
    /// A key is trimmed (a variable set from a file often ends with a newline; a client's
    /// `Bearer` key is trimmed too, so surrounding spaces could never match).
    ///
    /// Errors: `Invalid`, naming the configuration file, for a key with neither `key` nor a
    /// set `key_env`, or an empty one.
    pub fn api_keys(&self) -> Result<Vec<(String, Subject)>, ConfigError> {
        self.read_api_keys().map_err(|error| self.in_file(error))
    }

    fn read_api_keys(&self) -> Result<Vec<(String, Subject)>, ConfigError> {
        self.keys
            .iter()
            .map(|entry| {
                let key = match (&entry.key, &entry.key_env) {
                    (Some(key), None) => key.clone(),
                    (None, Some(var)) => std::env::var(var).map_err(|_| {
                        ConfigError::Invalid(format!(
                            "the key of subject {:?} is read from ${var}, which is not set",
                            entry.subject
                        ))
                    })?,
                    _ => {
                        return Err(ConfigError::Invalid(format!(
                            "the key of subject {:?} needs exactly one of `key` and `key_env`",
                            entry.subject
                        )));
                    }
                };
                let key = key.trim().to_owned();
                if entry.subject.trim().is_empty() {
                    return Err(ConfigError::Invalid("a [[keys]] entry has an empty subject".to_owned()));
                }
                if key.is_empty() {
                    let from =
                        entry.key_env.as_ref().map_or_else(|| "`key`".to_owned(), |var| format!("${var}"));
                    return Err(ConfigError::Invalid(format!(
                        "the key of subject {:?} ({from}) is empty",
                        entry.subject
                    )));
                }
                Ok((key, subject(&entry.subject)))
            })
            .collect::<Result<Vec<_>, ConfigError>>()
            .and_then(|keys| {
                for (at, (key, subject)) in keys.iter().enumerate() {
                    let shared =
                        keys[..at].iter().find(|(earlier, other)| earlier == key && other != subject);
                    if let Some((_, other)) = shared {
                        return Err(ConfigError::Invalid(format!(
                            "subjects {:?} and {:?} have the same API key",
                            other.subject_id, subject.subject_id
                        )));
                    }
                }
                Ok(keys)
            })
    }

    /// Builds every configured agent and team (connecting to MCP servers), the demo ones
    /// first when enabled. Teams share `approvals` and `control` with the server's routes.
    ///
    /// Errors: `Invalid` naming the agent and what is wrong (an unknown provider, tool or
    /// member, an MCP server that cannot be reached, a bad spawn policy).
    pub async fn build_agents(
        &self,
        approvals: &SpawnApprovals,
        control: &TeamControl,
    ) -> Result<BuiltAgents, ConfigError> {
        self.build_all(approvals, control, None).await.map_err(|error| self.in_file(error))
    }

    /// Builds every agent and team again, as [`Config::build_agents`] does, taking over
    /// what `last` (the build before) made: an MCP server an agent is connected to already
    /// is not connected again, and spawn policies are not read again. Only the servers the
    /// last build could not reach are tried anew.
    ///
    /// Errors: as [`Config::build_agents`].
    pub async fn rebuild_agents(
        &self,
        approvals: &SpawnApprovals,
        control: &TeamControl,
        last: &Reuse,
    ) -> Result<BuiltAgents, ConfigError> {
        self.build_all(approvals, control, Some(last)).await.map_err(|error| self.in_file(error))
    }

    async fn build_all(
        &self,
        approvals: &SpawnApprovals,
        control: &TeamControl,
        reuse: Option<&Reuse>,
    ) -> Result<BuiltAgents, ConfigError> {
        // Every provider's address and settings are checked, also one no agent uses yet (its
        // key may be missing: it is read when an agent uses the provider).
        for (name, provider) in &self.providers {
            self.provider(name, "", false)?;
            if let Some(var) = provider.api_key_env.as_ref().filter(|var| std::env::var_os(var).is_none()) {
                tracing::warn!(
                    provider = %name,
                    "the provider reads its API key from ${var}, which is not set: an agent that uses it is refused at start"
                );
            }
        }
        let mut built: Vec<Agent> = Vec::new();
        let mut policies = Vec::new();
        let mut mcp = McpServers::default();
        if self.demo_agents {
            built.push(demo::demo_agent());
            let (team, policy) = demo::demo_team(approvals, control);
            built.push(team);
            policies.push((demo::DEMO_TEAM.to_owned(), policy));
        }
        for agent in &self.agents {
            if built.iter().any(|existing| existing.name() == agent.name) {
                return Err(self.name_taken("agent", &agent.name));
            }
            built.push(self.build_agent(agent, &mut mcp, reuse).await?);
        }
        for team in &self.teams {
            if built.iter().any(|existing| existing.name() == team.name) {
                return Err(self.name_taken("team", &team.name));
            }
            let model = self.model(&team.model, &team.name)?;
            let mut builder =
                Team::builder(team.name.clone(), model).approvals(approvals.clone()).control(control.clone());
            if let Some(instructions) = &team.instructions {
                builder = builder.instructions(instructions.clone());
            }
            if let Some(tokens) = team.tokens_per_step {
                builder = builder.tokens_per_step(tokens);
            }
            for member in &team.members {
                let agent = built.iter().find(|agent| agent.name() == member).ok_or_else(|| {
                    ConfigError::Invalid(format!(
                        "team {:?}: member {member:?} is not a configured agent",
                        team.name
                    ))
                })?;
                builder = builder.member(agent.clone());
            }
            if let Some(path) = &team.spawn_policy {
                let invalid =
                    |message: String| ConfigError::Invalid(format!("team {:?}: {message}", team.name));
                // A policy the configuration names must be there: without it every spawn
                // would be denied, found out only at run time.
                let reused = reuse
                    .and_then(|reuse| reuse.policies.iter().find(|(name, _)| *name == team.name))
                    .map(|(_, policy)| policy.clone());
                let loaded = match reused {
                    Some(policy) => Some(policy),
                    None => SpawnPolicy::load(path).map_err(|error| invalid(error.to_string()))?,
                };
                let Some(policy) = loaded else {
                    let cwd =
                        std::env::current_dir().map(|dir| dir.display().to_string()).unwrap_or_default();
                    return Err(invalid(format!(
                        "the spawn policy {} does not exist (a relative path is relative to the working directory, {cwd}); \
                         leave spawn_policy out to deny every spawn",
                        path.display()
                    )));
                };
                let members: Vec<&str> = team.members.iter().map(String::as_str).collect();
                let hold = team.tokens_per_step.unwrap_or(agentry_team::DEFAULT_TOKENS_PER_STEP);
                policy
                    .check_for_team(&members, hold)
                    .map_err(|error| invalid(format!("{}: {error}", path.display())))?;
                let catalog = self.spawn_catalog(&team.name, &policy, &built)?;
                policies.push((team.name.clone(), policy.clone()));
                builder = builder.spawn_policy(Some(policy)).catalog(catalog);
            }
            built.push(builder.build());
        }
        let McpServers { connected, unreached } = mcp;
        Ok(BuiltAgents {
            agents: built,
            policies: policies.clone(),
            mcp: connected.iter().map(|server| Arc::clone(&server.connection)).collect(),
            unreached,
            reuse: Reuse { connected, policies },
        })
    }

    /// The models and tools a team's spawn templates name, each checked at start: a model
    /// is `demo` or a configured provider; a tool is a built-in one or a tool of one of the
    /// configured agents (an MCP server's, say).
    fn spawn_catalog(
        &self,
        team: &str,
        policy: &SpawnPolicy,
        agents: &[Agent],
    ) -> Result<SpawnCatalog, ConfigError> {
        let mut catalog = SpawnCatalog::default();
        for (role_name, role) in &policy.roles {
            for (template_name, template) in &role.templates {
                let whose = format!("team {team:?}: role {role_name:?}, template {template_name:?}");
                if let Some(model) = &template.model
                    && !catalog.models.contains_key(model)
                {
                    if model != "demo" && !self.providers.contains_key(model) {
                        return Err(ConfigError::Invalid(format!(
                            "{whose} names the model {model:?}, which is neither `demo` nor a configured provider"
                        )));
                    }
                    catalog.models.insert(model.clone(), self.model(model, team)?);
                }
                for tool in &template.tools {
                    if catalog.tools.iter().any(|known| known.spec().name == *tool) {
                        continue;
                    }
                    // A team's coordinator tools work for their own team only, and a tool an
                    // agent gates would run ungated: a spawned instance asks no approval.
                    // This holds for a built-in tool too: one a configured agent gates is
                    // one the operator wants a person to approve. (The demo agents' rules
                    // are their own.)
                    let agents = || {
                        agents.iter().filter(|agent| agent.session_type() != agentry_types::SessionType::Team)
                    };
                    let configured =
                        |agent: &&Agent| self.agents.iter().any(|config| config.name == agent.name());
                    if let Some(gating) = agents()
                        .filter(configured)
                        .find(|agent| agent.tool(tool).is_some() && agent.requires_approval(tool))
                    {
                        return Err(ConfigError::Invalid(format!(
                            "{whose} names the tool {tool:?}, which agent {:?} runs only with approval; a \
                             spawned instance asks for none, so a template may not name it",
                            gating.name()
                        )));
                    }
                    let found = match builtin_tool(tool) {
                        Some(builtin) => builtin,
                        None => agents().find_map(|agent| agent.tool(tool).cloned()).ok_or_else(|| {
                            ConfigError::Invalid(format!(
                                "{whose} names the tool {tool:?}, which is neither a built-in tool (calculator, \
                                 echo, send_email) nor a tool of a configured agent"
                            ))
                        })?,
                    };
                    catalog.tools.push(found);
                }
            }
        }
        Ok(catalog)
    }

    fn model(&self, name: &str, agent: &str) -> Result<Arc<dyn Model>, ConfigError> {
        if name == "demo" {
            let model = ScriptedModel::responder(|_| ScriptedResponse::text("Hello from the demo model."));
            return Ok(Arc::new(model.without_request_log()));
        }
        self.provider(name, agent, true)
    }

    /// The error for an agent or team named as one built before it.
    fn name_taken(&self, kind: &str, name: &str) -> ConfigError {
        ConfigError::Invalid(if self.demo_agents && [demo::DEMO_AGENT, demo::DEMO_TEAM].contains(&name) {
            format!(
                "{kind} {name:?} has the name of a built-in demo agent: rename it, or set `demo_agents = false`"
            )
        } else {
            format!("{kind} {name:?} has the name of another agent or team")
        })
    }

    /// The provider `name` as a model for `agent`; `with_key` reads its API key (an unset
    /// variable is an error then).
    fn provider(&self, name: &str, agent: &str, with_key: bool) -> Result<Arc<dyn Model>, ConfigError> {
        let provider = self.providers.get(name).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "agent {agent:?}: model {name:?} is neither `demo` nor a configured provider"
            ))
        })?;
        let mut config = OpenAiConfig::new(provider.model.clone());
        if let Some(url) = &provider.base_url {
            config = config.with_base_url(url.clone());
        }
        if let Some(var) = provider.api_key_env.as_ref().filter(|_| with_key) {
            let key = std::env::var(var).map_err(|_| {
                ConfigError::Invalid(format!(
                    "provider {name:?} reads its API key from ${var}, which is not set"
                ))
            })?;
            config = config.with_api_key(key);
        }
        if let Some(secs) = provider.timeout_secs {
            config.request_timeout = Duration::from_secs(secs);
        }
        if let Some(secs) = provider.stream_idle_timeout_secs {
            config.stream_idle_timeout = Duration::from_secs(secs);
        }
        if let Some(retries) = provider.max_retries {
            config.max_retries = retries;
        }
        for (header, value) in &provider.headers {
            config = config.with_header(header.clone(), value.clone());
        }
        let model = OpenAiCompatibleModel::new(config)
            .map_err(|error| ConfigError::Invalid(format!("provider {name:?}: {error}")))?;
        Ok(Arc::new(model))
    }

    /// Builds an agent, taking over the connections of `reuse` to its MCP servers; its
    /// connections, and the optional servers it could not reach, are added to `mcp`.
    async fn build_agent(
        &self,
        config: &AgentConfig,
        mcp: &mut McpServers,
        reuse: Option<&Reuse>,
    ) -> Result<Agent, ConfigError> {
        let mut limits = AgentLimits::default();
        if let Some(max) = config.max_iterations {
            limits.max_iterations = max;
        }
        limits.timeout = config.timeout_secs.map(Duration::from_secs);
        if let Some(bytes) = config.max_tool_output_bytes {
            limits.max_tool_output_bytes = bytes;
        }
        if config.model == "demo" {
            let given: Vec<&str> = [
                ("instructions", config.instructions.is_some()),
                ("tools", !config.tools.is_empty()),
                ("requires_approval", !config.requires_approval.is_empty()),
                ("ask_user_question", config.ask_user_question),
                ("mcp", !config.mcp.is_empty()),
                ("memory", config.memory.is_some()),
            ]
            .into_iter()
            .filter_map(|(key, set)| set.then_some(key))
            .collect();
            if !given.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?}: model `demo` runs the demo agent's rules with its own tools and instructions, \
                     so it takes no {} (use a provider for an agent of your own)",
                    config.name,
                    given.join(", ")
                )));
            }
            return Ok(demo::demo_agent_with(&config.name, limits));
        }
        let model = self.model(&config.model, &config.name)?;
        let mut builder = Agent::builder(config.name.clone(), model.clone());
        if let Some(memory) = &config.memory {
            // Summaries and profiles need a model; history alone does not.
            let analysis = match &memory.model {
                Some(name) if name == "demo" => {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: memory.model is `demo`, which writes no summary or profile; name a provider",
                        config.name
                    )));
                }
                Some(name) if !self.providers.contains_key(name) => {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: memory.model {name:?} is not a configured provider",
                        config.name
                    )));
                }
                _ if !memory.summary_memory && !memory.user_analysis_memory => None,
                Some(name) => Some(self.model(name, &config.name)?),
                None => Some(model),
            };
            builder = builder.memory(memory.config(), analysis);
        }
        if let Some(instructions) = &config.instructions {
            builder = builder.instructions(instructions.clone());
        }
        for tool in &config.tools {
            builder = builder.tool(builtin_tool(tool).ok_or_else(|| {
                ConfigError::Invalid(format!(
                    "agent {:?}: unknown tool {tool:?} (built-in tools: calculator, echo, send_email)",
                    config.name
                ))
            })?);
        }
        if config.ask_user_question {
            builder = builder.ask_user_question();
        }
        builder = builder.limits(limits);
        // Where each tool name comes from: two tools of one name would be offered twice
        // (some providers refuse that), and every call of it would reach the first.
        let mut sources: Vec<(String, String)> = Vec::new();
        let builtins = config.tools.iter().map(|tool| (tool.clone(), "the built-in tools".to_owned()));
        let asking = config
            .ask_user_question
            .then(|| ("ask_user_question".to_owned(), "ask_user_question".to_owned()));
        for (name, source) in builtins.chain(asking) {
            claim(&config.name, &mut sources, name, source)?;
        }
        // Optional servers that could not be reached: their tools are unknown.
        let mut skipped: Vec<&McpConfig> = Vec::new();
        for server in &config.mcp {
            let transport = match (&server.command, &server.url) {
                (Some(command), None) => {
                    let mut stdio = McpServerConfig::stdio(server.name.clone(), command.clone())
                        .args(server.args.clone());
                    for name in &server.inherit_env {
                        let value = std::env::var(name).map_err(|_| {
                            ConfigError::Invalid(format!(
                                "agent {:?}: MCP server {:?} inherits ${name}, which is not set",
                                config.name, server.name
                            ))
                        })?;
                        stdio = stdio.env(name.clone(), value);
                    }
                    for (name, value) in &server.env {
                        stdio = stdio.env(name.clone(), value.clone());
                    }
                    stdio
                }
                (None, Some(_)) if !server.env.is_empty() || !server.inherit_env.is_empty() => {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: MCP server {:?}: `env` and `inherit_env` apply to stdio servers (`command`) only",
                        config.name, server.name
                    )));
                }
                (None, Some(url)) => {
                    let mut http = McpServerConfig::streamable_http(server.name.clone(), url.clone());
                    if let Some(var) = &server.bearer_token_env {
                        let token = std::env::var(var).map_err(|_| {
                            ConfigError::Invalid(format!(
                                "MCP server {:?} reads its token from ${var}, which is not set",
                                server.name
                            ))
                        })?;
                        http = http.bearer_token(token);
                    }
                    http
                }
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: MCP server {:?} needs exactly one of `command` and `url`",
                        config.name, server.name
                    )));
                }
            };
            let transport = match &server.tools {
                Some(tools) => transport.allow_tools(tools.iter().cloned()),
                None => transport,
            };
            let reused = reuse.and_then(|reuse| {
                reuse
                    .connected
                    .iter()
                    .find(|connected| connected.agent == config.name && connected.server == transport)
            });
            let connecting = match reused {
                Some(reused) => Ok(Arc::clone(&reused.connection)),
                None => McpConnection::connect(transport.clone()).await.map(Arc::new),
            };
            let connection = match connecting {
                Ok(connection) => connection,
                // A setting that cannot work is the configuration's fault, whether or not
                // the server is optional.
                Err(error @ agentry_runner::McpError::InvalidConfig { .. }) => {
                    return Err(ConfigError::Invalid(format!(
                        "agent {:?}: MCP server {:?}: {error}",
                        config.name, server.name
                    )));
                }
                Err(error) if server.optional => {
                    tracing::error!(agent = %config.name, server = %server.name, %error,
                        "an optional MCP server cannot be reached: the agent starts without its tools, \
                         and the server tries again in the background");
                    skipped.push(server);
                    mcp.unreached.push(UnreachedMcpServer { agent: config.name.clone(), server: transport });
                    continue;
                }
                Err(error) => {
                    return Err(ConfigError::Unavailable(format!(
                        "agent {:?}: MCP server {:?}: {error} (`optional = true` starts the agent without it)",
                        config.name, server.name
                    )));
                }
            };
            let offered: Vec<String> =
                connection.tools().iter().map(|tool| tool.spec().name.clone()).collect();
            if let Some(missing) =
                server.tools.iter().flatten().find(|name| !offered.iter().any(|offered| offered == *name))
            {
                return Err(ConfigError::Invalid(format!(
                    "agent {:?}: MCP server {:?} has no tool {missing:?} (its `tools` list names it)",
                    config.name, server.name
                )));
            }
            for name in offered {
                claim(&config.name, &mut sources, name, format!("MCP server {:?}", server.name))?;
            }
            mcp.connected.push(ConnectedMcpServer {
                agent: config.name.clone(),
                server: transport,
                connection: Arc::clone(&connection),
            });
            builder = builder.mcp(connection);
        }
        // A name that matches no tool would gate nothing: the agent's own check refuses it
        // as a typo. A name an unreached optional server may offer is no typo, and is left
        // out: the tool is not there to be called ungated while the server is not.
        let maybe_offline = |name: &str| {
            skipped
                .iter()
                .any(|server| server.tools.as_ref().is_none_or(|tools| tools.iter().any(|tool| tool == name)))
        };
        let offered: Vec<String> = builder.tool_names().map(str::to_owned).collect();
        for gated in &config.requires_approval {
            if !offered.contains(gated) && maybe_offline(gated) {
                tracing::warn!(agent = %config.name, tool = %gated,
                    "requires_approval names a tool no reached source offers; an unreached optional MCP server may");
            } else {
                builder = builder.requires_approval(gated.clone());
            }
        }
        builder.try_build().map_err(|error| match error {
            agentry_runner::RunnerError::InvalidAgent { agent, problem } => {
                ConfigError::Invalid(format!("agent {agent:?}: {problem}"))
            }
            other => ConfigError::Invalid(format!("agent {:?}: {other}", config.name)),
        })
    }
}

/// Records that `source` offers agent `agent` a tool `name`; refuses a name offered twice.
fn claim(
    agent: &str,
    sources: &mut Vec<(String, String)>,
    name: String,
    source: String,
) -> Result<(), ConfigError> {
    if let Some((_, first)) = sources.iter().find(|(known, _)| *known == name) {
        if *first == source {
            return Err(ConfigError::Invalid(format!(
                "agent {agent:?}: {source} list the tool {name:?} twice"
            )));
        }
        return Err(ConfigError::Invalid(format!(
            "agent {agent:?}: two tools are named {name:?} (from {first} and from {source}); leave one out \
             (an MCP server's `tools` list keeps only the tools it names)"
        )));
    }
    sources.push((name, source));
    Ok(())
}

/// What [`Config::build_agents`] builds.
#[derive(Debug)]
pub struct BuiltAgents {
    /// Agents and team coordinators, to register.
    pub agents: Vec<Agent>,
    /// Each team's spawn policy, by team name.
    pub policies: Vec<(String, SpawnPolicy)>,
    /// Every MCP connection the agents use, to shut down with the server.
    pub mcp: Vec<Arc<McpConnection>>,
    /// The optional MCP servers that could not be reached: their agents were built without
    /// their tools.
    pub unreached: Vec<UnreachedMcpServer>,
    /// What a rebuild ([`Config::rebuild_agents`]) takes over from this build.
    pub reuse: Reuse,
}

/// What a rebuild of the agents takes over from the build before it: its MCP connections
/// and the spawn policies it read.
#[derive(Debug, Clone, Default)]
pub struct Reuse {
    connected: Vec<ConnectedMcpServer>,
    policies: Vec<(String, SpawnPolicy)>,
}

/// An agent's connection to one of its MCP servers.
#[derive(Debug, Clone)]
struct ConnectedMcpServer {
    agent: String,
    server: McpServerConfig,
    connection: Arc<McpConnection>,
}

/// The MCP servers a build connected to, and the optional ones it could not reach.
#[derive(Debug, Default)]
struct McpServers {
    connected: Vec<ConnectedMcpServer>,
    unreached: Vec<UnreachedMcpServer>,
}

/// An optional MCP server an agent was built without, as it could not be reached.
#[derive(Debug, Clone)]
pub struct UnreachedMcpServer {
    /// The agent that names it.
    pub agent: String,
    /// How to reach it.
    pub server: McpServerConfig,
}

/// The subject a key name stands for.
#[must_use]
pub fn subject(name: &str) -> Subject {
    Subject { subject_id: name.to_owned(), subject_type: "user".to_owned(), subject_slug: name.to_owned() }
}

/// A built-in server-side tool by name.
fn builtin_tool(name: &str) -> Option<Arc<dyn agentry_runner::Tool>> {
    match name {
        "calculator" => Some(demo::calculator_tool()),
        "send_email" => Some(demo::send_email_tool()),
        "echo" => Some(
            FunctionTool::new("echo", "Returns its text.", |args: EchoArgs, _| async move {
                Ok::<_, ToolError>(args.text)
            })
            .idempotent()
            .shared(),
        ),
        _ => None,
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// The text.
    text: String,
}
