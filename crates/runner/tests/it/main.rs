//! Integration tests of the runner.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod provider;
mod runtime;
