//! Integration tests of the runner.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "mcp")]
mod agent;
mod mcp;
mod provider;
mod runtime;
