//! Tools of MCP servers (Model Context Protocol), through the official Rust SDK `rmcp`.
//!
//! An [`McpServerConfig`] says how to reach a server: a child process over stdio, or a URL
//! over streamable HTTP. [`McpConnection::connect`] starts or reaches it, performs the
//! `initialize` handshake and lists its tools; each is an [`McpTool`] that joins an agent's
//! tools like any other, and [`McpConnection::session`] is what the `mcp.initialize` event
//! reports. Only tools are used: the client declares no capabilities (no sampling,
//! elicitation or roots), and a tool list the server changes later is not reloaded.

mod config;
mod connection;
mod error;
mod http;
mod tool;

pub use config::{MCP_INHERITED_ENV, McpServerConfig, McpServerTransport};
pub use connection::McpConnection;
pub use error::McpError;
pub use tool::McpTool;
