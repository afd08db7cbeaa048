//! How hard a durable backend works to keep an acknowledged write across a crash.

use std::fmt;
use std::str::FromStr;

/// A backend's durability mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// Every write is its own transaction, synced to disk before it is acknowledged.
    Strict,
    /// Concurrent writes are committed together in one transaction (group commit), synced
    /// to disk before any of them is acknowledged. The default: as safe as `strict` for
    /// every acknowledged write, and much faster under concurrency.
    #[default]
    Batched,
    /// Group commit without a sync per commit: survives a crash of the process, but the
    /// last writes may be lost if the machine loses power (and a redb file may be damaged:
    /// redb orders its commits with syncs).
    Relaxed,
}

impl Durability {
    /// The mode's name (`strict`, `batched`, `relaxed`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Strict => "strict",
            Self::Batched => "batched",
            Self::Relaxed => "relaxed",
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "strict" => Ok(Self::Strict),
            "batched" => Ok(Self::Batched),
            "relaxed" => Ok(Self::Relaxed),
            other => Err(format!("unknown durability {other:?}: expected strict, batched or relaxed")),
        }
    }
}
