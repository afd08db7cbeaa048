//! Integration tests of the runner.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

#[cfg(feature = "mcp")]
mod mcp;
mod provider;
mod runtime;
