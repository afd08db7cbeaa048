//! Why connecting to (or closing) an MCP server failed.

use std::time::Duration;

/// Why connecting to an MCP server, or closing the connection, failed. Each variant names
/// the server (its configured name); the reason is text, so no SDK error type leaks out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The configuration cannot work, for example a header value that is not valid HTTP.
    #[error("the MCP server `{server}` is misconfigured: {reason}")]
    InvalidConfig {
        /// The server's name.
        server: String,
        /// What is wrong.
        reason: String,
    },
    /// The stdio server's process could not be started.
    #[error("could not start the MCP server `{server}` with the command `{command}`: {reason}")]
    Spawn {
        /// The server's name.
        server: String,
        /// The command that failed to start.
        command: String,
        /// Why, as the operating system put it.
        reason: String,
    },
    /// The server was reached but the `initialize` handshake (or the first `tools/list`)
    /// failed: it refused, answered something that is not MCP, or exited.
    #[error("the MCP server `{server}` failed to initialize: {reason}")]
    Initialize {
        /// The server's name.
        server: String,
        /// Why, with the end of the server's stderr for stdio servers.
        reason: String,
    },
    /// Talking to the server failed: the connection broke or could not be opened.
    #[error("the connection to the MCP server `{server}` failed: {reason}")]
    Transport {
        /// The server's name.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server did not finish in time.
    #[error("the MCP server `{server}` did not {operation} within {timeout:?}")]
    Timeout {
        /// The server's name.
        server: String,
        /// What it did not finish, for example `initialize`.
        operation: String,
        /// The limit that was reached.
        timeout: Duration,
    },
}
