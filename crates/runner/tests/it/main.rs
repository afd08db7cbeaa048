//! Integration tests of the runner.

mod runtime;
