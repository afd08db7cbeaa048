//! Identifiers: UUIDv7 newtypes for sessions, turns and events, and the thread id.
//!
//! UUIDv7 ids sort by creation time, so listing by id is listing by age (but for the
//! sessions whose id derives from a name, such as the server's AG-UI threads: stores list
//! sessions by their creation time). Every id serializes as its canonical hyphenated
//! string.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// An id string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: {value:?} is not a UUID")]
pub struct InvalidId {
    /// Which kind of id was expected (`session id`, `turn id`, …).
    pub kind: &'static str,
    /// The rejected input.
    pub value: String,
}

/// Reads a string without allocating and parses it (ids and timestamps are decoded for
/// every stored event a replay reads).
pub(crate) struct ParseVisitor<T> {
    expecting: &'static str,
    parsed: std::marker::PhantomData<T>,
}

impl<T> ParseVisitor<T> {
    pub(crate) const fn new(expecting: &'static str) -> Self {
        Self { expecting, parsed: std::marker::PhantomData }
    }
}

impl<T> serde::de::Visitor<'_> for ParseVisitor<T>
where
    T: FromStr,
    T::Err: fmt::Display,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} string", self.expecting)
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<T, E> {
        value.parse().map_err(E::custom)
    }
}

macro_rules! uuid_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Uuid);

        impl $name {
            /// A new, time-ordered (UUIDv7) id.
            // No `Default`: a default that silently mints a fresh id hides mistakes.
            #[allow(clippy::new_without_default)]
            #[must_use]
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            /// Wraps an existing UUID.
            #[must_use]
            pub const fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            /// The UUID inside.
            #[must_use]
            pub const fn as_uuid(&self) -> &Uuid {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({})"), self.0.hyphenated())
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::try_parse(s).map(Self).map_err(|_| InvalidId { kind: $kind, value: s.to_owned() })
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                crate::fixed_text::serialize_fixed(serializer, &crate::ids::UuidText(self.0))
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(crate::ids::ParseVisitor::<Self>::new($kind))
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!({ "type": "string", "format": "uuid" })
            }
        }
    };
}

uuid_id!(
    /// Identifies a session (a conversation with an agent or a team).
    SessionId,
    "session id"
);
uuid_id!(
    /// Identifies a turn (one user interaction, also called a run).
    TurnId,
    "turn id"
);
uuid_id!(
    /// Identifies an event. Deltas share the id of the `model.message` they build.
    EventId,
    "event id"
);

/// Identifies a thread inside a session: `"main"` for the root agent, a unique id for
/// every sub-agent thread.
// Shared (`Arc<str>`): every event of a thread carries its id, and a copy is a count, not
// an allocation.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
#[schemars(transparent)]
pub struct ThreadId(#[schemars(with = "String")] Arc<str>);

impl Serialize for ThreadId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ThreadId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl ThreadId {
    /// The name of the root agent's thread.
    pub const MAIN: &'static str = "main";

    /// The root agent's thread.
    #[must_use]
    pub fn main() -> Self {
        static MAIN: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        Self(MAIN.get_or_init(|| Arc::from(Self::MAIN)).clone())
    }

    /// A new, unique sub-agent thread id (a UUIDv7 string).
    #[must_use]
    pub fn new_sub_thread() -> Self {
        Self(Arc::from(Uuid::now_v7().hyphenated().to_string()))
    }

    /// A thread id from a string. An empty string is refused.
    pub fn parse(value: impl Into<String>) -> Result<Self, InvalidId> {
        let value = value.into();
        if value.is_empty() {
            return Err(InvalidId { kind: "thread id", value });
        }
        Ok(Self(Arc::from(value)))
    }

    /// Whether this is the root agent's thread.
    #[must_use]
    pub fn is_main(&self) -> bool {
        &*self.0 == Self::MAIN
    }

    /// The id as a string slice.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for ThreadId {
    fn default() -> Self {
        Self::main()
    }
}

impl fmt::Display for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ThreadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ThreadId({})", self.0)
    }
}

impl FromStr for ThreadId {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// An id's text, formatted only when a serializer asks for it (see `fixed_text`).
pub(crate) struct UuidText(pub(crate) Uuid);

impl Serialize for UuidText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut buf = Uuid::encode_buffer();
        serializer.serialize_str(self.0.hyphenated().encode_lower(&mut buf))
    }
}

/// A name-based UUID (version 8) over SHA-256 of `parts`, each prefixed with its length so
/// that no two lists hash the same bytes: the same names give the same id in every process
/// and build (ids stored under it are found again by it, so the derivation never changes).
#[must_use]
pub fn name_based_uuid(parts: &[&str]) -> Uuid {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid()
}
