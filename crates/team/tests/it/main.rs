//! Integration tests of teams, end to end through the runtime with scripted models.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod coordinate;
mod modes;
mod policy;
mod spawn;
