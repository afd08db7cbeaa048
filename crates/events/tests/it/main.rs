//! Integration tests of `agentry-events`: the message builder, sequencing, JSON round trips,
//! every renderer, and the committed schemas.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod builder;
mod properties;
mod renderers;
mod schemas;
