//! Integration tests of `agentry-types`.

// Test helpers fail loudly, like the tests that call them.
#![allow(clippy::unwrap_used)]

mod adalflow;
mod input;
mod values;
