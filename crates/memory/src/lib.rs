//! Storage and memory for Agentry.
//!
//! The storage traits ([`SessionStore`], [`RunStore`], [`EventStore`], [`MessageStore`],
//! [`UserStore`], [`JournalStore`], [`BudgetStore`], [`LeaseStore`], together [`Store`])
//! say what every backend keeps and the contract of each method; [`InMemoryStore`] is the
//! reference implementation, and the SQLite and redb backends live in their own crates.
//! Every backend passes the same conformance suite (feature `conformance`). The
//! [`rules`] module holds the checks every backend applies identically.
//!
//! ```
//! use agentry_memory::{InMemoryStore, SessionStore, RunStore, EventStore, Order};
//! use agentry_types::{RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = InMemoryStore::new();
//! let session = SessionRecord::new(SessionType::Agent, "demo", Subject::user("alice"));
//! store.create_session(&session).await.unwrap();
//! let run = RunRecord::new(session.id, vec![TurnInputItem::message("hi")], Subject::user("alice"));
//! store.put_run(&run, None).await.unwrap();
//! assert!(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().is_empty());
//! # });
//! ```

#[cfg(feature = "conformance")]
pub mod conformance;
mod durability;
mod error;
mod facade;
mod group_commit;
pub mod handoff;
mod in_memory;
mod json_bound;
mod page;
mod remembered;
pub mod rules;
mod store;
mod views;

pub use durability::Durability;
pub use error::{Conflict, StoreError, StoreResult};
pub use facade::{
    Memory, MemoryConfig, MemoryError, PreparedInputs, RunOutputDocument, SessionMemory, UserMemoryHandle,
    UserMemoryMode,
};
pub use group_commit::GroupCommit;
pub use in_memory::InMemoryStore;
pub use page::{MAX_PAGE, Order, Page, PageRequest, decode_key, decode_token, encode_token, runs_kind};
pub use remembered::{RememberedTurns, TurnFacts};
pub use store::{
    BudgetStore, Checkpoint, DEFAULT_HISTORY_RUNS, EventStore, FeedQuery, HistoryQuery, JournalStore,
    LeaseStore, MAX_HISTORY_SCAN, MAX_RECORD_BYTES, MessageStore, ParentFilter, RunQuery, RunStore,
    SessionQuery, SessionStore, SessionUpdate, Store, StoredEvent, TurnStart, TurnStep, UserStore,
};
pub use views::{LastRunsQuery, TeamSession, run_output};
