//! How to reach an MCP server, and which of its tools to use.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How long connecting (starting the process, `initialize`, `tools/list`) may take by default.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one request (such as a `tools/call`) may take by default.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The variables a stdio server gets from this process's environment, when set: what a
/// program needs to run (its search path, home, user, shell, terminal, locale, time zone
/// and temporary directory) and nothing that usually holds a secret. Anything else it
/// needs (a token, a proxy, extra CA certificates) is given by name with
/// [`McpServerConfig::env`]. (The official MCP SDKs hand a server a similar short list.)
#[cfg(not(windows))]
pub const MCP_INHERITED_ENV: &[&str] =
    &["HOME", "LANG", "LC_ALL", "LOGNAME", "PATH", "SHELL", "TERM", "TMPDIR", "TZ", "USER"];

/// The variables a stdio server gets from this process's environment, when set (see the
/// list of other platforms): what a Windows program needs to run.
#[cfg(windows)]
pub const MCP_INHERITED_ENV: &[&str] = &[
    "APPDATA",
    "HOMEDRIVE",
    "HOMEPATH",
    "LOCALAPPDATA",
    "PATH",
    "PATHEXT",
    "PROCESSOR_ARCHITECTURE",
    "SYSTEMDRIVE",
    "SYSTEMROOT",
    "TEMP",
    "TMP",
    "USERNAME",
    "USERPROFILE",
];

/// How an MCP server is reached.
///
/// `Debug` shows environment variable and header names but never their values, which
/// often hold credentials.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum McpServerTransport {
    /// A child process that speaks MCP over its stdin and stdout. Its stderr is read and
    /// its last lines are kept for diagnostics ([`McpConnection::stderr_tail`]).
    ///
    /// [`McpConnection::stderr_tail`]: crate::McpConnection::stderr_tail
    Stdio {
        /// The program: a path, or a name looked up on `PATH`.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Its environment variables besides the [`MCP_INHERITED_ENV`] ones, which these
        /// override. It gets no other variable of this process: API keys and other secrets
        /// in the server's environment stay out of a third-party program's reach.
        env: BTreeMap<String, String>,
        /// Its working directory; the current one when absent.
        cwd: Option<PathBuf>,
    },
    /// A server reached over MCP's streamable HTTP transport.
    StreamableHttp {
        /// The endpoint, for example `https://mcp.example.com/mcp`.
        url: String,
        /// Headers sent with every request, for example `Authorization: Bearer <token>`
        /// (see [`McpServerConfig::bearer_token`]).
        headers: BTreeMap<String, String>,
    },
}

impl fmt::Debug for McpServerTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio { command, args, env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
            Self::StreamableHttp { url, headers } => f
                .debug_struct("StreamableHttp")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// An MCP server to connect to with [`McpConnection::connect`].
///
/// ```
/// use std::time::Duration;
/// use agentry_runner::McpServerConfig;
///
/// let files = McpServerConfig::stdio("files", "npx")
///     .args(["-y", "@modelcontextprotocol/server-filesystem", "/srv/data"])
///     .allow_tools(["read_file", "list_directory"]);
/// let search = McpServerConfig::streamable_http("search", "https://mcp.example.com/mcp")
///     .bearer_token("secret")
///     .request_timeout(Duration::from_secs(30));
/// assert_eq!(files.name, "files");
/// assert!(!format!("{search:?}").contains("secret"));
/// ```
///
/// [`McpConnection::connect`]: crate::McpConnection::connect
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct McpServerConfig {
    /// The server's id, reported in `mcp.initialize` and in the tools' routing metadata;
    /// the name unless set with [`McpServerConfig::id`].
    pub id: String,
    /// The server's name, as people and events know it.
    pub name: String,
    /// How the server is reached.
    pub transport: McpServerTransport,
    /// When present, only the server's tools with these names are offered; names the
    /// server does not have are ignored. When absent, every tool is offered.
    pub allowed_tools: Option<Vec<String>>,
    /// How long connecting may take: starting the process (stdio), `initialize` and the
    /// first `tools/list`. Default 60 s.
    pub connect_timeout: Duration,
    /// How long one request, such as a tool call, may take. Default 60 s. A call that
    /// takes longer fails, and the server is told the request was cancelled.
    pub request_timeout: Duration,
}

impl McpServerConfig {
    /// A server named `name` reached through `transport`, with the default timeouts and
    /// every tool allowed.
    #[must_use]
    pub fn new(name: impl Into<String>, transport: McpServerTransport) -> Self {
        let name = name.into();
        Self {
            id: name.clone(),
            name,
            transport,
            allowed_tools: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }

    /// A server started as the child process `command` (no arguments yet) that speaks MCP
    /// over stdio. It gets only the [`MCP_INHERITED_ENV`] variables of this process's
    /// environment, and those set with [`McpServerConfig::env`].
    #[must_use]
    pub fn stdio(name: impl Into<String>, command: impl Into<String>) -> Self {
        Self::new(
            name,
            McpServerTransport::Stdio {
                command: command.into(),
                args: Vec::new(),
                env: BTreeMap::new(),
                cwd: None,
            },
        )
    }

    /// A server at `url` that speaks MCP's streamable HTTP transport.
    #[must_use]
    pub fn streamable_http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::new(name, McpServerTransport::StreamableHttp { url: url.into(), headers: BTreeMap::new() })
    }

    /// Sets the id (see [`McpServerConfig::id`](field@McpServerConfig::id)).
    #[must_use]
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Adds arguments of a stdio server's command; no effect on other transports.
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let McpServerTransport::Stdio { args: existing, .. } = &mut self.transport {
            existing.extend(args.into_iter().map(Into::into));
        }
        self
    }

    /// Sets an environment variable of a stdio server (also one of [`MCP_INHERITED_ENV`], which
    /// it then overrides); no effect on other transports.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpServerTransport::Stdio { env, .. } = &mut self.transport {
            env.insert(name.into(), value.into());
        }
        self
    }

    /// Sets the working directory of a stdio server; no effect on other transports.
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        if let McpServerTransport::Stdio { cwd: existing, .. } = &mut self.transport {
            *existing = Some(cwd.into());
        }
        self
    }

    /// Sets a header sent with every request to a streamable HTTP server; no effect on
    /// other transports.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        if let McpServerTransport::StreamableHttp { headers, .. } = &mut self.transport {
            headers.insert(name.into(), value.into());
        }
        self
    }

    /// Sends `Authorization: Bearer <token>` with every request to a streamable HTTP
    /// server; no effect on other transports.
    #[must_use]
    pub fn bearer_token(self, token: impl AsRef<str>) -> Self {
        let value = format!("Bearer {}", token.as_ref());
        self.header("Authorization", value)
    }

    /// Offers only the server's tools with these names (see
    /// [`McpServerConfig::allowed_tools`](field@McpServerConfig::allowed_tools)).
    #[must_use]
    pub fn allow_tools<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.allowed_tools = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Sets how long connecting may take.
    #[must_use]
    pub const fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one request may take.
    #[must_use]
    pub const fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Whether the tool named `name` is offered.
    pub(crate) fn allows(&self, name: &str) -> bool {
        self.allowed_tools.as_ref().is_none_or(|allowed| allowed.iter().any(|allowed| allowed == name))
    }
}
