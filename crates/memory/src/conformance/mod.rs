//! The backend conformance suite: one free async function per case, each taking a fresh
//! store, and [`conformance_tests!`](crate::conformance_tests) to expand them (and the
//! model test of [`model`]) into one named test each. A backend runs the whole suite with
//! one line:
//!
//! ```text
//! agentry_memory::conformance_tests!(|| async { Harness::new(Arc::new(MyStore::open_temp())) });
//! ```

// The suite asserts: a failing expectation is the result.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

pub mod model;

use std::any::Any;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use agentry_events::{EventEnvelope, EventPayload, SCHEMA_VERSION};
use agentry_types::agno::SessionSummary;
use agentry_types::{
    BudgetLimit, BudgetReservation, BudgetUsage, CancellationReason, EventId, Fence, JournalEntry, Lease,
    Message, ModelMessageDelta, Role, RunRecord, RunStatus, SessionId, SessionRecord, SessionType, Subject,
    ThreadId, Timestamp, ToolResult, TurnId, TurnInputItem, TurnState, UserMemory, UserProfile,
};
use serde_json::json;

use crate::error::{Conflict, StoreError, StoreResult};
use crate::page::{Order, Page, PageRequest};
use crate::store::{
    FeedQuery, HistoryQuery, MAX_HISTORY_SCAN, MAX_RECORD_BYTES, ParentFilter, RunQuery, SessionQuery,
    SessionUpdate, Store, StoredEvent, TurnStart, TurnStep,
};

/// A fresh store for one case, with whatever must live as long as it (a temporary
/// directory, say).
pub struct Harness {
    /// The store under test.
    pub store: Arc<dyn Store>,
    _guard: Option<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness").field("store", &self.store).finish_non_exhaustive()
    }
}

impl Harness {
    /// A harness around a store that needs nothing else.
    #[must_use]
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self { store, _guard: None }
    }

    /// A harness that keeps `guard` alive as long as the store.
    #[must_use]
    pub fn with_guard(store: Arc<dyn Store>, guard: impl Any + Send) -> Self {
        Self { store, _guard: Some(Box::new(guard)) }
    }
}

/// Expands the conformance suite into one `#[tokio::test]` per case, plus the model test,
/// for a backend. `$factory` is a closure returning a future of a fresh [`Harness`].
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::conformance_tests!(@cases $factory;
            session_create_and_get_round_trips,
            session_created_twice_conflicts,
            a_session_refused_as_existing_is_readable_at_once,
            session_unknown_is_not_found_everywhere,
            session_update_merges_metadata_and_state_and_null_removes_keys,
            a_session_shows_its_latest_activity,
            session_delete_removes_its_runs_events_messages_journal_and_lease,
            sessions_list_newest_first_across_pages,
            sessions_list_oldest_first_across_pages,
            sessions_list_filters_by_type_name_owner_user_and_creation_time,
            an_owners_sessions_are_listed_among_others_in_both_orders_across_pages_within_creation_bounds,
            sessions_list_refuses_a_garbage_or_foreign_page_token,
            run_put_and_get_round_trips,
            run_put_replaces_by_id_and_keeps_creation_order,
            run_put_into_an_unknown_session_is_not_found,
            run_cannot_move_to_another_session,
            run_unknown_is_not_found,
            runs_list_in_both_orders_across_pages,
            runs_list_filters_by_parent_status_agent_and_team,
            runs_members_are_listed_by_parent_among_other_runs_in_both_orders_across_pages,
            a_runs_parent_is_fixed_when_it_is_created,
            runs_list_of_an_unknown_session_is_not_found,
            events_append_assigns_increasing_positions_and_read_back_by_turn,
            events_with_a_stale_or_repeated_seq_are_refused_and_change_nothing,
            events_in_a_batch_must_increase,
            deltas_and_events_of_other_turns_are_refused,
            events_of_an_unknown_run_are_not_found,
            turn_events_read_after_a_cursor_in_both_orders,
            feed_reads_store_wide_and_per_session_after_a_position,
            high_water_mark_rises_never_falls_and_covers_stored_events,
            turn_step_stores_every_part_in_one_write,
            turn_step_refused_in_any_part_stores_none_of_it,
            an_event_at_the_largest_seq_is_read_in_both_orders,
            turn_steps_refused_among_concurrent_ones_leave_the_others_whole,
            turn_step_journals_calls_as_the_journal_does,
            turn_step_creates_its_run_with_its_first_events,
            turn_start_takes_the_lease_and_stores_the_turn_in_one_write,
            turn_start_refused_for_any_reason_changes_nothing,
            concurrent_appends_to_many_turns_keep_seq_and_positions_ordered,
            reads_see_every_write_acknowledged_before_them_alone_or_among_others,
            history_returns_the_last_runs_messages_oldest_first,
            history_filters_roles_statuses_agents_teams_and_replayed_messages,
            history_last_messages_bound_and_the_default_bound,
            history_includes_member_runs_only_when_asked,
            a_team_sessions_member_runs_do_not_push_its_turns_out_of_a_history_window,
            messages_of_an_unknown_run_or_session_are_not_found,
            profiles_are_saved_and_replaced,
            profile_merges_keep_other_fields_and_refuse_bad_patches_unchanged,
            profile_merges_made_at_once_all_land,
            memories_list_newest_first_and_delete,
            memory_ids_are_unique_and_unknown_deletes_are_not_found,
            journal_start_is_idempotent_for_the_same_arguments,
            journal_start_with_other_arguments_conflicts,
            journal_complete_records_the_result_once,
            journal_complete_of_an_unstarted_call_is_not_found,
            journal_lists_calls_in_start_order,
            budget_reserve_settle_and_release_account_correctly,
            budget_reservation_past_any_limit_is_refused_on_every_scope,
            budget_expired_reservations_stop_counting,
            budget_reservations_end_with_their_lease,
            records_nested_deeper_than_they_are_read_are_refused,
            deleting_a_session_deletes_its_budget_ledgers_and_their_reservations,
            budget_scopes_and_reservation_ids_may_be_any_string,
            budget_unknown_scopes_and_reservations_and_duplicates,
            concurrent_reservations_never_pass_the_limit,
            lease_is_exclusive_while_live,
            lease_tokens_increase_with_every_grant,
            lease_takeover_after_expiry_fences_out_the_old_holder,
            lease_renew_and_release_need_the_current_token,
            lease_of_an_unknown_session_is_not_found,
            leases_are_listed_by_session_in_pages,
            fence_of_another_session_is_invalid_input,
            session_update_with_a_stale_fence_is_refused_and_changes_nothing,
            oversized_records_are_refused_and_change_nothing,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let harness: $crate::conformance::Harness = ($factory)().await;
                $crate::conformance::$case(harness.store.clone()).await;
            }
        )*

        #[test]
        fn model_test_agrees_with_the_reference_model_after_every_read() {
            $crate::conformance::model::run(|| Box::pin(($factory)()));
        }
    };
}

// ---------------------------------------------------------------------------------------
// Builders.
// ---------------------------------------------------------------------------------------

fn alice() -> Subject {
    Subject::user("alice")
}

fn session_named(name: &str) -> SessionRecord {
    SessionRecord::new(SessionType::Agent, name, alice())
}

async fn new_session(store: &dyn Store) -> SessionRecord {
    let session = session_named("agent");
    store.create_session(&session).await.unwrap();
    session
}

fn run_in(session: SessionId) -> RunRecord {
    RunRecord::new(session, vec![TurnInputItem::message("hello")], alice())
}

async fn new_run(store: &dyn Store, session: SessionId) -> RunRecord {
    let run = run_in(session);
    store.put_run(&run, None).await.unwrap();
    run
}

/// A durable event of a run with the given seq.
#[must_use]
pub fn event(run: &RunRecord, seq: u64) -> EventEnvelope {
    EventEnvelope {
        event_id: EventId::new(),
        seq,
        session_id: run.session_id,
        turn_id: run.id,
        thread_id: Some(ThreadId::main()),
        team: None,
        created_at: Timestamp::now(),
        schema_version: SCHEMA_VERSION,
        payload: EventPayload::ToolResponse {
            tool_call_id: format!("call_{seq}"),
            name: "tool".into(),
            arguments: "{}".into(),
            content: format!("result {seq}"),
            is_error: false,
        },
    }
}

/// The durable events of `agentry_events::sample`'s turns as a build before event format 2
/// stored them (format 1, JSON payloads; see [`crate::rules::encode_event`]): the stored
/// bytes and the event they hold, in the order of the turns. Bytes an older build wrote,
/// for checking that a store still reads them.
#[must_use]
pub fn format_1_events() -> Vec<(Vec<u8>, EventEnvelope)> {
    include_str!("events_format_1.jsonl")
        .lines()
        .map(|line| {
            let line: serde_json::Value = serde_json::from_str(line).unwrap();
            let hex = line["stored"].as_str().unwrap();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).unwrap())
                .collect();
            (bytes, serde_json::from_value(line["event"].clone()).unwrap())
        })
        .collect()
}

/// A session's runs stored for a migration test: turns with members among them (one a
/// member of a member), the parent of each run listed in [`RunsWithMembers::members`].
#[derive(Debug)]
pub struct RunsWithMembers {
    /// The session.
    pub session: SessionId,
    /// Its turns, oldest first.
    pub turns: Vec<TurnId>,
    /// Each parent with its members, oldest first.
    pub members: Vec<(TurnId, Vec<TurnId>)>,
}

/// Stores [`RunsWithMembers`] in a new session.
pub async fn store_runs_with_members(store: &dyn Store) -> RunsWithMembers {
    let session = new_session(store).await;
    let first = new_run(store, session.id).await.id;
    let mut of_first = Vec::new();
    let mut of_member = Vec::new();
    for _ in 0..2 {
        let mut member = run_in(session.id);
        member.parent_run_id = Some(first);
        store.put_run(&member, None).await.unwrap();
        of_first.push(member.id);
    }
    let second = new_run(store, session.id).await.id;
    let mut nested = run_in(session.id);
    nested.parent_run_id = Some(of_first[0]);
    store.put_run(&nested, None).await.unwrap();
    of_member.push(nested.id);
    RunsWithMembers {
        session: session.id,
        turns: vec![first, second],
        members: vec![(of_first[0], of_member), (first, of_first), (second, Vec::new())],
    }
}

/// Checks a store holding [`RunsWithMembers`], stored before its runs were indexed by
/// parent and its sessions by owner: turns and each parent's members are listed, a member
/// keeps its parent, a member stored now is listed after the others, and the session is
/// listed for its owner.
pub async fn check_runs_with_members(store: &dyn Store, runs: &RunsWithMembers) {
    let owned = SessionQuery { owner: Some(alice().subject_id), ..SessionQuery::default() };
    let sessions = store.list_sessions(&owned, &PageRequest::first(10)).await.unwrap();
    assert_eq!(sessions.items.iter().map(|session| session.id).collect::<Vec<_>>(), [runs.session]);
    let list = |parent: ParentFilter| async move {
        let query = RunQuery { parent, ..RunQuery::default() };
        let page = store.list_runs(runs.session, &query, &PageRequest::first(10)).await.unwrap();
        page.items.into_iter().map(|run| run.id).collect::<Vec<_>>()
    };
    assert_eq!(list(ParentFilter::TopLevel).await, runs.turns);
    for (parent, members) in &runs.members {
        assert_eq!(&list(ParentFilter::Of(*parent)).await, members);
    }
    let (parent, members) = &runs.members[1];
    let mut moved = store.get_run(members[0]).await.unwrap();
    moved.parent_run_id = Some(runs.turns[1]);
    assert_invalid(store.put_run(&moved, None).await);
    let mut later = run_in(runs.session);
    later.parent_run_id = Some(*parent);
    store.put_run(&later, None).await.unwrap();
    let mut expected = members.clone();
    expected.push(later.id);
    assert_eq!(list(ParentFilter::Of(*parent)).await, expected);
}

/// The first turn of [`format_1_events`] (over 20 events), with a session and a run with
/// its ids, to store them under.
#[must_use]
pub fn format_1_turn() -> (SessionRecord, RunRecord, Vec<(Vec<u8>, EventEnvelope)>) {
    let events = format_1_events();
    let turn = events[0].1.turn_id;
    let events: Vec<_> = events.into_iter().filter(|(_, event)| event.turn_id == turn).collect();
    let mut session = SessionRecord::new(SessionType::Team, "old", alice());
    session.id = events[0].1.session_id;
    let mut run = RunRecord::new(session.id, vec![TurnInputItem::message("hi")], alice());
    run.id = turn;
    (session, run, events)
}

/// Checks a store holding [`format_1_turn`]'s events as an older build stored them: the
/// turn reads them back, and an event appended now is read after them in the session's
/// feed.
pub async fn check_format_1_turn(store: &dyn Store, session: &SessionRecord, run: &RunRecord) {
    let expected: Vec<_> = format_1_turn().2.into_iter().map(|(_, event)| event).collect();
    let stored = store.turn_events(run.id, Order::Asc, None, 1000).await.unwrap();
    assert_eq!(stored.into_iter().map(|stored| stored.event).collect::<Vec<_>>(), expected);
    let mut newer = event(run, expected.last().unwrap().seq + 1);
    newer.thread_id = None;
    store.append_events(run.id, std::slice::from_ref(&newer), None).await.unwrap();
    let query = FeedQuery { session_id: Some(session.id), ..FeedQuery::default() };
    let feed = store.feed(&query, 1000).await.unwrap();
    let mut all = expected;
    all.push(newer);
    assert_eq!(feed.into_iter().map(|stored| stored.event).collect::<Vec<_>>(), all);
}

/// Two sessions for [`check_damaged_session_deleted_whole`], stored in `store`: the first,
/// with a run, to be damaged by the caller (its record overwritten with
/// [`too_deep_session_json`]); the second, to be kept.
pub async fn sessions_to_damage(store: &dyn Store) -> (SessionRecord, SessionRecord) {
    let damaged = session_named("damaged");
    let kept = session_named("kept");
    for session in [&damaged, &kept] {
        store.create_session(session).await.unwrap();
    }
    new_run(store, damaged.id).await;
    (damaged, kept)
}

/// `session` as JSON, its metadata nested more deeply than records are read back (what a
/// build before the nesting limit could store).
#[must_use]
pub fn too_deep_session_json(session: &SessionRecord) -> Vec<u8> {
    let mut body = serde_json::to_value(session).unwrap();
    body["metadata"]["deep"] = (0..300).fold(json!(1), |inner, _| json!([inner]));
    serde_json::to_vec(&body).unwrap()
}

/// Checks a store whose `damaged` session record no longer reads: reading it is
/// `Corrupt`, deleting it succeeds, and afterwards it and its runs are gone while `kept`
/// is still listed.
pub async fn check_damaged_session_deleted_whole(
    store: &dyn Store,
    damaged: &SessionRecord,
    kept: &SessionRecord,
) {
    let error = store.get_session(damaged.id).await.unwrap_err();
    assert!(matches!(error, StoreError::Corrupt(ref message) if message.contains("session")), "{error:?}");
    store.delete_session(damaged.id).await.unwrap();
    assert_not_found(store.get_session(damaged.id).await);
    let listed = store.list_sessions(&SessionQuery::default(), &PageRequest::first(10)).await.unwrap();
    assert_eq!(listed.items.iter().map(|session| session.id).collect::<Vec<_>>(), [kept.id]);
    assert_not_found(store.list_runs(damaged.id, &RunQuery::default(), &PageRequest::first(10)).await);
}

/// Checks a file store's handling of its file going away while it is open (`open` opens
/// the backend's store at a path): the file removed, then another put in its place. Each
/// write is refused with an `Io` error saying so (it would go to a file no later open
/// reads), and nothing is written to the new file.
pub async fn check_writes_refused_once_the_file_is_gone<S: Store>(
    open: impl Fn(&std::path::Path) -> StoreResult<S>,
) {
    let dir = tempfile_dir();
    let path = dir.join("store");
    let store = open(&path).unwrap();
    let kept = SessionRecord::new(SessionType::Agent, "a", Subject::user("u"));
    store.create_session(&kept).await.unwrap();
    std::fs::rename(&path, dir.join("moved")).unwrap();
    let refused = |error: StoreError, what: &str| {
        assert!(
            matches!(error, StoreError::Io(ref message) if message.contains(what) && message.contains("put the")),
            "expected an Io error saying the file was {what}, got {error:?}"
        );
    };
    let late = SessionRecord::new(SessionType::Agent, "a", Subject::user("u"));
    refused(store.create_session(&late).await.unwrap_err(), "removed");
    std::fs::write(&path, b"").unwrap();
    refused(store.create_session(&late).await.unwrap_err(), "replaced");
    drop(store);
    assert_eq!(std::fs::read(&path).unwrap(), b"", "the new file was written to");
    // Put back, the file is the store's again: writes are accepted.
    std::fs::rename(dir.join("moved"), &path).unwrap();
    let store = open(&path).unwrap();
    store.create_session(&late).await.unwrap();
    assert_eq!(store.get_session(kept.id).await.unwrap().id, kept.id);
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Checks that an empty or blank path is refused before anything is touched.
pub fn check_blank_paths_refused<S: Store>(open: impl Fn(&std::path::Path) -> StoreResult<S>) {
    for (path, what) in [("", "is empty"), ("   ", "is only whitespace")] {
        let error = open(std::path::Path::new(path)).map(drop).unwrap_err();
        assert!(
            matches!(error, StoreError::Io(ref message) if message.contains(what)),
            "{path:?}: {error:?}"
        );
        assert!(!std::path::Path::new(path).exists() || path.is_empty(), "{path:?} was created");
    }
}

/// A new directory under the system's temporary directory (the conformance suite has no
/// `tempfile` dependency); the caller removes it.
fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("agentry-conformance-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir(&dir).unwrap();
    dir
}

fn seqs(events: &[crate::store::StoredEvent]) -> Vec<u64> {
    events.iter().map(|stored| stored.event.seq).collect()
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_unix_micros(1_800_000_000_000_000 + seconds * 1_000_000)
}

fn assert_not_found<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    assert!(matches!(result, Err(StoreError::NotFound { .. })), "expected NotFound, got {result:?}");
}

fn assert_invalid<T: std::fmt::Debug>(result: Result<T, StoreError>) {
    assert!(matches!(result, Err(StoreError::InvalidInput(_))), "expected InvalidInput, got {result:?}");
}

// ---------------------------------------------------------------------------------------
// Sessions.
// ---------------------------------------------------------------------------------------

/// A created session reads back equal.
pub async fn session_create_and_get_round_trips(store: Arc<dyn Store>) {
    let mut session = session_named("support");
    session.title = Some("Billing question".into());
    session.user_id = Some("u1".into());
    session.metadata.insert("plan".into(), json!("pro"));
    session.summary = Some(SessionSummary {
        summary: "so far".into(),
        topics: Some(vec!["billing".into()]),
        updated_at: None,
    });
    store.create_session(&session).await.unwrap();
    assert_eq!(store.get_session(session.id).await.unwrap(), session);
}

/// Creating a session whose id exists is a conflict and keeps the first.
pub async fn session_created_twice_conflicts(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut again = session.clone();
    again.name = "other".into();
    let error = store.create_session(&again).await.unwrap_err();
    assert!(
        matches!(error, StoreError::Conflict(Conflict::AlreadyExists { kind: "session", .. })),
        "{error:?}"
    );
    assert_eq!(store.get_session(session.id).await.unwrap().name, "agent");
}

/// A creation refused because the session exists is answered only once that session
/// can be read: when concurrent creations of one id meet (two first requests of one
/// conversation), the losers read the winner's session at once.
pub async fn a_session_refused_as_existing_is_readable_at_once(store: Arc<dyn Store>) {
    for _ in 0..40 {
        let session = session_named("agent");
        let creators: Vec<_> = (0..6)
            .map(|_| {
                let (store, session) = (store.clone(), session.clone());
                tokio::spawn(async move {
                    match store.create_session(&session).await {
                        Ok(()) => true,
                        Err(StoreError::Conflict(Conflict::AlreadyExists { .. })) => {
                            let read = store.get_session(session.id).await;
                            assert_eq!(read.as_ref().ok(), Some(&session), "{read:?}");
                            false
                        }
                        Err(error) => panic!("{error:?}"),
                    }
                })
            })
            .collect();
        let mut created = 0;
        for creator in creators {
            created += usize::from(creator.await.unwrap());
        }
        assert_eq!(created, 1);
    }
}

/// Every session operation on an unknown id is not found.
pub async fn session_unknown_is_not_found_everywhere(store: Arc<dyn Store>) {
    let id = SessionId::new();
    assert_not_found(store.get_session(id).await);
    assert_not_found(store.update_session(id, &SessionUpdate::default()).await);
    assert_not_found(store.delete_session(id).await);
}

/// An update sets fields, merges metadata and state, and a null removes a key.
pub async fn session_update_merges_metadata_and_state_and_null_removes_keys(store: Arc<dyn Store>) {
    let mut session = session_named("agent");
    session.metadata.insert("keep".into(), json!(1));
    session.metadata.insert("drop".into(), json!(2));
    store.create_session(&session).await.unwrap();
    let mut metadata = serde_json::Map::new();
    metadata.insert("drop".into(), serde_json::Value::Null);
    metadata.insert("new".into(), json!("x"));
    let mut state = serde_json::Map::new();
    state.insert("cart".into(), json!(["apple"]));
    let update = SessionUpdate {
        title: Some("Renamed".into()),
        user_id: Some("u9".into()),
        metadata: Some(metadata),
        state: Some(state),
        summary: Some(SessionSummary { summary: "short".into(), topics: None, updated_at: Some(5) }),
        fence: None,
    };
    let updated = store.update_session(session.id, &update).await.unwrap();
    assert_eq!(updated.title.as_deref(), Some("Renamed"));
    assert_eq!(updated.user_id.as_deref(), Some("u9"));
    assert_eq!(updated.metadata.get("keep"), Some(&json!(1)));
    assert_eq!(updated.metadata.get("new"), Some(&json!("x")));
    assert!(!updated.metadata.contains_key("drop"));
    assert_eq!(updated.state.get("cart"), Some(&json!(["apple"])));
    assert_eq!(updated.summary.as_ref().map(|s| s.summary.as_str()), Some("short"));
    assert!(updated.updated_at >= session.updated_at);
    assert_eq!(store.get_session(session.id).await.unwrap(), updated);
}

/// A session shows when it was last active: its `updated_at` moves forward to that of its
/// top-level runs as they are written (`put_run`, a step carrying the run), in reads and
/// listings alike, never back; member runs do not move it.
pub async fn a_session_shows_its_latest_activity(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let later =
        |seconds: i64| Timestamp::from_unix_micros(session.updated_at.unix_micros() + seconds * 1_000_000);
    let updated_at = || async { store.get_session(session.id).await.unwrap().updated_at };
    let mut turn = run_in(session.id);
    turn.updated_at = later(10);
    store.put_run(&turn, None).await.unwrap();
    assert_eq!(updated_at().await, later(10), "a turn written");
    let listed = store.list_sessions(&SessionQuery::default(), &PageRequest::first(10)).await.unwrap();
    assert_eq!(listed.items.iter().find(|listed| listed.id == session.id).unwrap().updated_at, later(10));
    // A member run does not count; an older write does not move it back.
    let mut member = run_in(session.id);
    member.parent_run_id = Some(turn.id);
    member.updated_at = later(20);
    store.put_run(&member, None).await.unwrap();
    turn.updated_at = later(5);
    store.put_run(&turn, None).await.unwrap();
    assert_eq!(updated_at().await, later(10), "neither a member nor an older write moved it");
    // A step carrying the run (a turn's end, say) moves it too.
    turn.updated_at = later(30);
    let step = TurnStep {
        run: Some(Arc::new(turn.clone())),
        events: vec![Arc::new(event(&turn, 1))],
        ..TurnStep::default()
    };
    store.write_step(turn.id, &step, None).await.unwrap();
    assert_eq!(updated_at().await, later(30), "a step with the run");
    // The session's own update stamps it with its time, later still.
    let renamed = SessionUpdate { title: Some("renamed".into()), ..SessionUpdate::default() };
    let updated = store.update_session(session.id, &renamed).await.unwrap();
    assert!(updated.updated_at >= later(30), "{:?}", updated.updated_at);
    assert_eq!(updated_at().await, updated.updated_at);
    // Deleted and made again under its id (as AG-UI threads are), it starts afresh.
    store.delete_session(session.id).await.unwrap();
    store.create_session(&session).await.unwrap();
    assert_eq!(updated_at().await, session.updated_at, "nothing of the deleted session's activity is left");
}

/// Deleting a session deletes everything that belongs to it, and only that.
pub async fn session_delete_removes_its_runs_events_messages_journal_and_lease(store: Arc<dyn Store>) {
    let doomed = new_session(&*store).await;
    let kept = new_session(&*store).await;
    let doomed_run = new_run(&*store, doomed.id).await;
    let kept_run = new_run(&*store, kept.id).await;
    store.append_events(doomed_run.id, &[event(&doomed_run, 1)], None).await.unwrap();
    store.append_events(kept_run.id, &[event(&kept_run, 1)], None).await.unwrap();
    store.append_messages(doomed_run.id, &[Arc::new(Message::user("bye"))], None).await.unwrap();
    store.journal_start(&journal_entry(doomed_run.id, "c1", "h"), None).await.unwrap();
    store.acquire_lease(doomed.id, "p1", Duration::from_secs(30), at(0)).await.unwrap();

    store.delete_session(doomed.id).await.unwrap();
    assert_not_found(store.get_session(doomed.id).await);
    assert_not_found(store.get_run(doomed_run.id).await);
    assert_not_found(store.turn_events(doomed_run.id, Order::Asc, None, 10).await);
    assert_not_found(store.journal(doomed_run.id).await);
    assert_eq!(store.lease(doomed.id).await.unwrap(), None);
    let feed = store.feed(&FeedQuery::default(), 100).await.unwrap();
    assert_eq!(feed.len(), 1, "only the kept session's event remains");
    assert_eq!(feed[0].event.turn_id, kept_run.id);
    assert_eq!(store.get_run(kept_run.id).await.unwrap(), kept_run);
}

/// Sessions list newest first; pages chain through tokens without gaps or repeats.
pub async fn sessions_list_newest_first_across_pages(store: Arc<dyn Store>) {
    let mut created = Vec::new();
    for index in 0..7 {
        let mut session = session_named("agent");
        session.created_at = at(index);
        session.updated_at = at(index);
        store.create_session(&session).await.unwrap();
        created.push(session.id);
    }
    let mut listed = Vec::new();
    let mut page = PageRequest::first(3);
    loop {
        let result = store.list_sessions(&SessionQuery::default(), &page).await.unwrap();
        assert!(result.items.len() <= 3);
        listed.extend(result.items.iter().map(|session| session.id));
        match result.next_token {
            Some(token) => page = PageRequest::after(token, 3),
            None => break,
        }
    }
    created.reverse();
    assert_eq!(listed, created);
}

/// Sessions list oldest first when asked; pages chain through tokens without gaps or
/// repeats, and filters still apply.
pub async fn sessions_list_oldest_first_across_pages(store: Arc<dyn Store>) {
    let mut created = Vec::new();
    for index in 0..7 {
        let mut session = session_named(if index == 3 { "other" } else { "agent" });
        session.created_at = at(index);
        session.updated_at = at(index);
        store.create_session(&session).await.unwrap();
        if index != 3 {
            created.push(session.id);
        }
    }
    let query =
        SessionQuery { name: Some("agent".to_owned()), oldest_first: true, ..SessionQuery::default() };
    let mut listed = Vec::new();
    let mut page = PageRequest::first(2);
    loop {
        let result = store.list_sessions(&query, &page).await.unwrap();
        assert!(result.items.len() <= 2);
        listed.extend(result.items.iter().map(|session| session.id));
        match result.next_token {
            Some(token) => page = PageRequest::after(token, 2),
            None => break,
        }
    }
    assert_eq!(listed, created);
}

/// Every session filter narrows the listing.
pub async fn sessions_list_filters_by_type_name_owner_user_and_creation_time(store: Arc<dyn Store>) {
    let make = |kind, name: &str, owner: &str, user: Option<&str>, seconds| {
        let mut session = SessionRecord::new(kind, name, Subject::user(owner));
        session.user_id = user.map(str::to_owned);
        session.created_at = at(seconds);
        session
    };
    let sessions = [
        make(SessionType::Agent, "helper", "alice", Some("u1"), 10),
        make(SessionType::Team, "crew", "alice", Some("u2"), 20),
        make(SessionType::Agent, "helper", "bob", None, 30),
        make(SessionType::Workflow, "flow", "bob", Some("u1"), 40),
    ];
    for session in &sessions {
        store.create_session(session).await.unwrap();
    }
    let ids = |query: SessionQuery| {
        let store = store.clone();
        async move {
            let page = store.list_sessions(&query, &PageRequest::first(100)).await.unwrap();
            page.items.into_iter().map(|session| session.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        ids(SessionQuery { name: Some("helper".into()), ..Default::default() }).await,
        [sessions[2].id, sessions[0].id]
    );
    assert_eq!(
        ids(SessionQuery { session_type: Some(SessionType::Team), ..Default::default() }).await,
        [sessions[1].id]
    );
    assert_eq!(
        ids(SessionQuery { owner: Some("bob".into()), ..Default::default() }).await,
        [sessions[3].id, sessions[2].id]
    );
    assert_eq!(
        ids(SessionQuery { user_id: Some("u1".into()), ..Default::default() }).await,
        [sessions[3].id, sessions[0].id]
    );
    assert_eq!(
        ids(SessionQuery { created_from: Some(at(20)), created_until: Some(at(30)), ..Default::default() })
            .await,
        [sessions[2].id, sessions[1].id]
    );
    assert!(
        ids(SessionQuery { name: Some("helper".into()), owner: Some("carol".into()), ..Default::default() })
            .await
            .is_empty()
    );
}

/// A page token that this listing did not issue is invalid input.
pub async fn sessions_list_refuses_a_garbage_or_foreign_page_token(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    for _ in 0..3 {
        new_run(&*store, session.id).await;
    }
    let runs = store.list_runs(session.id, &RunQuery::default(), &PageRequest::first(1)).await.unwrap();
    let foreign = runs.next_token.unwrap();
    let said = |result: StoreResult<Page<SessionRecord>>| match result {
        Err(StoreError::InvalidInput(message)) => message,
        other => panic!("expected invalid input, got {other:?}"),
    };
    let error = said(store.list_sessions(&SessionQuery::default(), &PageRequest::after(foreign, 10)).await);
    assert!(error.contains("belongs to another listing"), "{error}");
    let error =
        said(store.list_sessions(&SessionQuery::default(), &PageRequest::after("%%%not-a-token", 10)).await);
    assert!(error.contains("is not a page token"), "{error}");
    assert_invalid(
        store.list_runs(session.id, &RunQuery::default(), &PageRequest::after("bm9wZQ", 10)).await,
    );
    // A token is its listing's: not another filter's, nor the other order's. Filters may
    // hold any character.
    new_session(&*store).await;
    let named =
        SessionQuery { name: Some("agent".into()), owner: Some("alice".into()), ..SessionQuery::default() };
    let mut odd = session_named("agent");
    odd.owner = Subject::user("auth0|1:2");
    for _ in 0..2 {
        store.create_session(&SessionRecord { id: SessionId::new(), ..odd.clone() }).await.unwrap();
    }
    let piped = SessionQuery { owner: Some("auth0|1:2".into()), ..SessionQuery::default() };
    let page = store.list_sessions(&piped, &PageRequest::first(1)).await.unwrap();
    let next = store.list_sessions(&piped, &PageRequest::after(page.next_token.unwrap(), 10)).await.unwrap();
    assert_eq!(page.items.len() + next.items.len(), 2);
    let token = store.list_sessions(&named, &PageRequest::first(1)).await.unwrap().next_token.unwrap();
    assert!(store.list_sessions(&named, &PageRequest::after(token.clone(), 10)).await.is_ok());
    for other in [
        SessionQuery { name: Some("other".into()), ..SessionQuery::default() },
        SessionQuery { oldest_first: true, ..named.clone() },
        SessionQuery { user_id: Some("u".into()), ..named.clone() },
        SessionQuery::default(),
    ] {
        assert_invalid(store.list_sessions(&other, &PageRequest::after(token.clone(), 10)).await);
    }
}

// ---------------------------------------------------------------------------------------
// Runs.
// ---------------------------------------------------------------------------------------

/// A run reads back equal, whatever its state.
pub async fn run_put_and_get_round_trips(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut run = run_in(session.id);
    run.agent_id = Some("helper".into());
    run.output = Some(json!({"content": "done"}));
    run.set_state(TurnState::Cancelled {
        reason: CancellationReason::ClientCancelled,
        completed_at: at(1),
        metrics: None,
    });
    store.put_run(&run, None).await.unwrap();
    assert_eq!(store.get_run(run.id).await.unwrap(), run);
}

/// Putting a run with an existing id replaces it and keeps its place in the listing.
pub async fn run_put_replaces_by_id_and_keeps_creation_order(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let first = new_run(&*store, session.id).await;
    let second = new_run(&*store, session.id).await;
    let mut updated = first.clone();
    updated.set_state(TurnState::Error { message: "boom".into(), completed_at: at(2), metrics: None });
    store.put_run(&updated, None).await.unwrap();
    assert_eq!(store.get_run(first.id).await.unwrap(), updated);
    let listed = store.list_runs(session.id, &RunQuery::default(), &PageRequest::first(10)).await.unwrap();
    assert_eq!(listed.items.iter().map(|run| run.id).collect::<Vec<_>>(), [first.id, second.id]);
    assert_eq!(listed.items[0].status, RunStatus::Error);
}

/// A run needs its session.
pub async fn run_put_into_an_unknown_session_is_not_found(store: Arc<dyn Store>) {
    let run = run_in(SessionId::new());
    assert_not_found(store.put_run(&run, None).await);
    assert_not_found(store.get_run(run.id).await);
}

/// A run stays in its session.
pub async fn run_cannot_move_to_another_session(store: Arc<dyn Store>) {
    let first = new_session(&*store).await;
    let second = new_session(&*store).await;
    let run = new_run(&*store, first.id).await;
    let mut moved = run.clone();
    moved.session_id = second.id;
    assert_invalid(store.put_run(&moved, None).await);
    assert_eq!(store.get_run(run.id).await.unwrap().session_id, first.id);
}

/// Unknown runs are not found.
pub async fn run_unknown_is_not_found(store: Arc<dyn Store>) {
    let id = TurnId::new();
    assert_not_found(store.get_run(id).await);
    assert_not_found(store.high_water(id).await);
    assert_not_found(store.raise_high_water(id, 3, None).await);
}

/// Runs list oldest or newest first, across pages.
pub async fn runs_list_in_both_orders_across_pages(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(new_run(&*store, session.id).await.id);
    }
    // Pages of 2 end with a short page; a page of 5 holds them all, and no empty page
    // follows it.
    for (order, limit) in [(Order::Asc, 2), (Order::Desc, 2), (Order::Asc, 5), (Order::Desc, 5)] {
        let query = RunQuery { order, ..RunQuery::default() };
        let mut listed = Vec::new();
        let mut pages = 0;
        let mut page = PageRequest::first(limit);
        loop {
            let result = store.list_runs(session.id, &query, &page).await.unwrap();
            pages += 1;
            assert!(!result.items.is_empty(), "{order:?} by {limit}: page {pages} is empty");
            listed.extend(result.items.iter().map(|run| run.id));
            match result.next_token {
                Some(token) => page = PageRequest::after(token, limit),
                None => break,
            }
        }
        let mut expected = ids.clone();
        if order == Order::Desc {
            expected.reverse();
        }
        assert_eq!(listed, expected, "{order:?} by {limit}");
        assert_eq!(pages, ids.len().div_ceil(limit), "{order:?} by {limit}");
    }
}

/// Runs filter by parent, status, agent and team.
pub async fn runs_list_filters_by_parent_status_agent_and_team(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut turn = run_in(session.id);
    turn.team_id = Some("crew".into());
    store.put_run(&turn, None).await.unwrap();
    let mut member = run_in(session.id);
    member.parent_run_id = Some(turn.id);
    member.agent_id = Some("researcher".into());
    member.set_state(TurnState::Error { message: "x".into(), completed_at: at(1), metrics: None });
    store.put_run(&member, None).await.unwrap();
    let list = |query: RunQuery| {
        let store = store.clone();
        async move {
            let page = store.list_runs(session.id, &query, &PageRequest::first(10)).await.unwrap();
            page.items.into_iter().map(|run| run.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(list(RunQuery::default()).await, [turn.id], "top-level by default");
    assert_eq!(
        list(RunQuery { parent: ParentFilter::Any, ..Default::default() }).await,
        [turn.id, member.id]
    );
    assert_eq!(list(RunQuery { parent: ParentFilter::Of(turn.id), ..Default::default() }).await, [member.id]);
    let errors =
        RunQuery { parent: ParentFilter::Any, statuses: vec![RunStatus::Error], ..Default::default() };
    assert_eq!(list(errors).await, [member.id]);
    let by_agent =
        RunQuery { parent: ParentFilter::Any, agent_id: Some("researcher".into()), ..Default::default() };
    assert_eq!(list(by_agent).await, [member.id]);
    assert_eq!(list(RunQuery { team_id: Some("crew".into()), ..Default::default() }).await, [turn.id]);
}

/// The members of a run are listed by their parent among the session's other turns and
/// members, in creation order both ways and across pages; turns are listed without the
/// members between them; a member stored in another session under the same parent is that
/// session's, and deleting it leaves the listing as it was.
pub async fn runs_members_are_listed_by_parent_among_other_runs_in_both_orders_across_pages(
    store: Arc<dyn Store>,
) {
    let session = new_session(&*store).await;
    let other = new_session(&*store).await;
    let first = new_run(&*store, session.id).await;
    let second = new_run(&*store, session.id).await;
    let (mut of_first, mut of_second, mut turns) = (Vec::new(), Vec::new(), vec![first.id, second.id]);
    for round in 0..3 {
        for (parent, members) in [(first.id, &mut of_first), (second.id, &mut of_second)] {
            let mut member = run_in(session.id);
            member.parent_run_id = Some(parent);
            store.put_run(&member, None).await.unwrap();
            members.push(member.id);
        }
        // A member of a member, and a later turn, in between.
        let mut nested = run_in(session.id);
        nested.parent_run_id = Some(of_first[round]);
        store.put_run(&nested, None).await.unwrap();
        turns.push(new_run(&*store, session.id).await.id);
    }
    let mut stranger = run_in(other.id);
    stranger.parent_run_id = Some(first.id);
    store.put_run(&stranger, None).await.unwrap();
    let listed = |session: SessionId, parent: ParentFilter, order: Order| {
        let store = store.clone();
        async move {
            let query = RunQuery { order, parent, ..RunQuery::default() };
            let mut page = PageRequest::first(2);
            let mut listed = Vec::new();
            loop {
                let result = store.list_runs(session, &query, &page).await.unwrap();
                assert!(result.items.len() <= 2);
                listed.extend(result.items.iter().map(|run| run.id));
                match result.next_token {
                    Some(token) => page = PageRequest::after(token, 2),
                    None => break listed,
                }
            }
        }
    };
    let reversed = |ids: &[TurnId]| ids.iter().rev().copied().collect::<Vec<_>>();
    for pass in 0..2 {
        assert_eq!(listed(session.id, ParentFilter::Of(first.id), Order::Asc).await, of_first);
        assert_eq!(listed(session.id, ParentFilter::Of(first.id), Order::Desc).await, reversed(&of_first));
        assert_eq!(listed(session.id, ParentFilter::Of(second.id), Order::Asc).await, of_second);
        assert_eq!(listed(session.id, ParentFilter::Of(second.id), Order::Desc).await, reversed(&of_second));
        assert_eq!(listed(session.id, ParentFilter::TopLevel, Order::Asc).await, turns);
        assert_eq!(listed(session.id, ParentFilter::TopLevel, Order::Desc).await, reversed(&turns));
        assert_eq!(listed(session.id, ParentFilter::Any, Order::Asc).await.len(), 2 + 3 * 4);
        assert!(listed(session.id, ParentFilter::Of(turns[4]), Order::Asc).await.is_empty());
        if pass == 0 {
            assert_eq!(listed(other.id, ParentFilter::Of(first.id), Order::Asc).await, [stranger.id]);
            // The second pass: the stranger's session deleted changes nothing here.
            store.delete_session(other.id).await.unwrap();
        }
    }
    store.delete_session(session.id).await.unwrap();
    let query = RunQuery { parent: ParentFilter::Of(first.id), ..RunQuery::default() };
    assert_not_found(store.list_runs(session.id, &query, &PageRequest::first(10)).await);
}

/// A stored run keeps its parent: a record that moves a member under another parent or to
/// the top level, or a turn under a parent, is refused (by `put_run` and by `write_step`)
/// and changes nothing.
pub async fn a_runs_parent_is_fixed_when_it_is_created(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let turn = new_run(&*store, session.id).await;
    let other = new_run(&*store, session.id).await;
    let mut member = run_in(session.id);
    member.parent_run_id = Some(turn.id);
    store.put_run(&member, None).await.unwrap();
    let moved = |parent: Option<TurnId>, run: &RunRecord| RunRecord {
        parent_run_id: parent,
        agent_id: Some("moved".into()),
        ..run.clone()
    };
    for (run, parent) in [(&member, Some(other.id)), (&member, None), (&turn, Some(other.id))] {
        assert_invalid(store.put_run(&moved(parent, run), None).await);
        let step = TurnStep {
            run: Some(Arc::new(moved(parent, run))),
            events: vec![Arc::new(event(run, 1))],
            ..TurnStep::default()
        };
        assert_invalid(store.write_step(run.id, &step, None).await);
        assert_eq!(store.get_run(run.id).await.unwrap(), *run);
        assert!(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().is_empty());
    }
    let members = RunQuery { parent: ParentFilter::Of(turn.id), ..RunQuery::default() };
    let listed = store.list_runs(session.id, &members, &PageRequest::first(10)).await.unwrap();
    assert_eq!(listed.items, [member.clone()]);
    // The same parent is no move.
    let renamed = moved(Some(turn.id), &member);
    store.put_run(&renamed, None).await.unwrap();
    assert_eq!(store.get_run(member.id).await.unwrap(), renamed);
}

/// An owner's sessions are listed among many of other owners, in both orders, across
/// pages (sessions created at the same moment included), within creation bounds (alone
/// too, and empty when they cross); a deleted session leaves the owner's listing.
pub async fn an_owners_sessions_are_listed_among_others_in_both_orders_across_pages_within_creation_bounds(
    store: Arc<dyn Store>,
) {
    let mut all = Vec::new();
    for second in 0..12i64 {
        for owner in ["ann", "bob", "cy"] {
            let mut session = SessionRecord::new(SessionType::Agent, "helper", Subject::user(owner));
            // Two of each owner's sessions share their creation time.
            session.created_at = at(second - second % 2 * i64::from(second % 4 == 1));
            store.create_session(&session).await.unwrap();
            all.push(session);
        }
    }
    let listed = |query: SessionQuery| {
        let store = store.clone();
        async move {
            let mut page = PageRequest::first(2);
            let mut ids = Vec::new();
            loop {
                let result = store.list_sessions(&query, &page).await.unwrap();
                ids.extend(result.items.iter().map(|session| session.id));
                match result.next_token {
                    Some(token) => page = PageRequest::after(token, 2),
                    None => break ids,
                }
            }
        }
    };
    let expected = |all: &[SessionRecord], owner: Option<&str>, from: i64, until: i64, oldest_first: bool| {
        let mut sessions: Vec<&SessionRecord> = all
            .iter()
            .filter(|session| owner.is_none_or(|owner| session.owner.subject_id == owner))
            .filter(|session| session.created_at >= at(from) && session.created_at <= at(until))
            .collect();
        sessions.sort_by_key(|session| (session.created_at, session.id));
        if !oldest_first {
            sessions.reverse();
        }
        sessions.into_iter().map(|session| session.id).collect::<Vec<_>>()
    };
    for (owner, from, until) in
        [(Some("ann"), 0, 11), (Some("bob"), 3, 8), (None, 4, 6), (Some("cy"), 4, 4), (Some("ann"), 7, 2)]
    {
        for oldest_first in [false, true] {
            let query = SessionQuery {
                owner: owner.map(str::to_owned),
                created_from: Some(at(from)),
                created_until: Some(at(until)),
                oldest_first,
                ..SessionQuery::default()
            };
            let want = expected(&all, owner, from, until, oldest_first);
            assert_eq!(listed(query.clone()).await, want, "{owner:?} {from}..={until} {oldest_first}");
            if from == 0 {
                let unbounded = SessionQuery { created_from: None, created_until: None, ..query };
                assert_eq!(listed(unbounded).await, want);
            }
        }
    }
    assert!(listed(SessionQuery { owner: Some("dee".into()), ..SessionQuery::default() }).await.is_empty());
    let gone = all.remove(0);
    store.delete_session(gone.id).await.unwrap();
    let ann = SessionQuery { owner: Some("ann".into()), ..SessionQuery::default() };
    assert_eq!(listed(ann).await, expected(&all, Some("ann"), 0, 11, false));
}

/// Listing the runs of an unknown session is not found.
pub async fn runs_list_of_an_unknown_session_is_not_found(store: Arc<dyn Store>) {
    assert_not_found(store.list_runs(SessionId::new(), &RunQuery::default(), &PageRequest::first(10)).await);
}

// ---------------------------------------------------------------------------------------
// Events.
// ---------------------------------------------------------------------------------------

/// Appended events get increasing positions and read back by turn with their seq.
pub async fn events_append_assigns_increasing_positions_and_read_back_by_turn(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let batch: Vec<EventEnvelope> = [1, 4, 5].iter().map(|seq| event(&run, *seq)).collect();
    let positions = store.append_events(run.id, &batch, None).await.unwrap();
    assert_eq!(positions.len(), 3);
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]));
    let more = store.append_events(run.id, &[event(&run, 9)], None).await.unwrap();
    assert!(more[0] > positions[2]);
    let stored = store.turn_events(run.id, Order::Asc, None, 100).await.unwrap();
    assert_eq!(seqs(&stored), [1, 4, 5, 9]);
    assert_eq!(stored[0].event, batch[0]);
    assert_eq!(stored.iter().map(|s| s.position).collect::<Vec<_>>(), [positions, more].concat());
    assert!(store.append_events(run.id, &[], None).await.unwrap().is_empty(), "an empty batch is a no-op");
}

/// An event whose seq is not above the turn's last is refused, with its whole batch.
pub async fn events_with_a_stale_or_repeated_seq_are_refused_and_change_nothing(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    store.append_events(run.id, &[event(&run, 1), event(&run, 2)], None).await.unwrap();
    for stale in [vec![event(&run, 2)], vec![event(&run, 3), event(&run, 1)], vec![event(&run, 0)]] {
        let error = store.append_events(run.id, &stale, None).await.unwrap_err();
        assert!(matches!(error, StoreError::Conflict(Conflict::StaleSeq { .. })), "{error:?}");
    }
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 100).await.unwrap()), [1, 2]);
    store.append_events(run.id, &[event(&run, 3)], None).await.unwrap();
}

/// A batch's seqs must strictly increase.
pub async fn events_in_a_batch_must_increase(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let error = store.append_events(run.id, &[event(&run, 5), event(&run, 5)], None).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleSeq { seq: 5, last: 5, .. })), "{error:?}");
    assert!(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().is_empty());
}

/// Deltas are not stored, and a turn takes only its own events.
pub async fn deltas_and_events_of_other_turns_are_refused(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let other = new_run(&*store, session.id).await;
    let mut delta = event(&run, 1);
    delta.payload = EventPayload::ModelMessageDelta(ModelMessageDelta::text("hi"));
    assert_invalid(store.append_events(run.id, &[delta], None).await);
    assert_invalid(store.append_events(run.id, &[event(&other, 1)], None).await);
    let mut wrong_session = event(&run, 1);
    wrong_session.session_id = SessionId::new();
    assert_invalid(store.append_events(run.id, &[wrong_session], None).await);
    assert!(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().is_empty());
}

/// Events need their run.
pub async fn events_of_an_unknown_run_are_not_found(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let ghost = run_in(session.id);
    assert_not_found(store.append_events(ghost.id, &[event(&ghost, 1)], None).await);
    assert_not_found(store.turn_events(ghost.id, Order::Asc, None, 10).await);
}

/// A turn's events read after a seq cursor, ascending or descending, with a limit.
pub async fn turn_events_read_after_a_cursor_in_both_orders(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let batch: Vec<EventEnvelope> = (1..=10).map(|seq| event(&run, seq * 2)).collect();
    store.append_events(run.id, &batch, None).await.unwrap();
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, Some(7), 3).await.unwrap()), [8, 10, 12]);
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, Some(20), 3).await.unwrap()), Vec::<u64>::new());
    assert_eq!(seqs(&store.turn_events(run.id, Order::Desc, None, 2).await.unwrap()), [20, 18]);
    assert_eq!(seqs(&store.turn_events(run.id, Order::Desc, Some(7), 10).await.unwrap()), [6, 4, 2]);
}

/// The feed reads every stored event by position, store-wide or for one session.
pub async fn feed_reads_store_wide_and_per_session_after_a_position(store: Arc<dyn Store>) {
    let first = new_session(&*store).await;
    let second = new_session(&*store).await;
    let run_a = new_run(&*store, first.id).await;
    let run_b = new_run(&*store, second.id).await;
    store.append_events(run_a.id, &[event(&run_a, 1)], None).await.unwrap();
    store.append_events(run_b.id, &[event(&run_b, 1), event(&run_b, 2)], None).await.unwrap();
    store.append_events(run_a.id, &[event(&run_a, 2)], None).await.unwrap();
    let all = store.feed(&FeedQuery::default(), 100).await.unwrap();
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|pair| pair[0].position < pair[1].position));
    let after =
        store.feed(&FeedQuery { after: Some(all[1].position), ..Default::default() }, 100).await.unwrap();
    assert_eq!(after, all[2..].to_vec());
    let only_first = FeedQuery { session_id: Some(first.id), ..Default::default() };
    let first_events = store.feed(&only_first, 100).await.unwrap();
    assert_eq!(
        first_events.iter().map(|e| (e.event.turn_id, e.event.seq)).collect::<Vec<_>>(),
        [(run_a.id, 1), (run_a.id, 2)]
    );
    let newest = FeedQuery { order: Order::Desc, ..Default::default() };
    let desc = store.feed(&newest, 2).await.unwrap();
    assert_eq!(desc, vec![all[3].clone(), all[2].clone()]);
    let before = FeedQuery { order: Order::Desc, after: Some(all[2].position), session_id: Some(second.id) };
    assert_eq!(store.feed(&before, 10).await.unwrap(), vec![all[1].clone()]);
}

/// The messages of a run's history, in order.
async fn run_messages(store: &dyn Store, session: SessionId, run: TurnId) -> Vec<String> {
    let history = store.history(session, &HistoryQuery::default()).await.unwrap();
    history.into_iter().filter(|stored| stored.run_id == run).map(|stored| stored.message.text()).collect()
}

/// A turn step stores its high-water mark, messages, events and run record together, and
/// returns the events' positions.
pub async fn turn_step_stores_every_part_in_one_write(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    store.append_messages(run.id, &[Arc::new(Message::user("first"))], None).await.unwrap();
    let mut done = run.clone();
    done.set_state(TurnState::Cancelled {
        reason: CancellationReason::ClientCancelled,
        completed_at: Timestamp::now(),
        metrics: None,
    });
    let step = TurnStep {
        high_water: Some(300),
        messages: vec![Arc::new(Message::user("second")), Arc::new(Message::user("third"))],
        events: vec![Arc::new(event(&run, 4)), Arc::new(event(&run, 7))],
        journal: vec![journal_entry(run.id, "c1", "h")],
        run: Some(Arc::new(done.clone())),
        release_lease: true,
    };
    let lease = store.acquire_lease(session.id, "p", Duration::from_secs(5), at(0)).await.unwrap();
    let positions = store.write_step(run.id, &step, Some(lease.fence())).await.unwrap();
    assert_eq!(store.lease(session.id).await.unwrap(), None, "the step released the lease");
    assert_eq!(positions.len(), 2);
    assert!(positions[0] < positions[1]);
    let stored = store.turn_events(run.id, Order::Asc, None, 10).await.unwrap();
    assert_eq!(seqs(&stored), [4, 7]);
    assert_eq!(stored.iter().map(|stored| stored.position).collect::<Vec<_>>(), positions);
    assert_eq!(run_messages(&*store, session.id, run.id).await, ["first", "second", "third"]);
    assert_eq!(store.get_run(run.id).await.unwrap(), done);
    assert_eq!(store.high_water(run.id).await.unwrap(), 300);
    assert_eq!(store.journal(run.id).await.unwrap(), step.journal);
    // Parts are optional; an empty step writes nothing and a later one continues the turn.
    assert!(store.write_step(run.id, &TurnStep::default(), None).await.unwrap().is_empty());
    let more = TurnStep { events: vec![Arc::new(event(&run, 8))], ..TurnStep::default() };
    store.write_step(run.id, &more, None).await.unwrap();
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [4, 7, 8]);
    assert_eq!(store.high_water(run.id).await.unwrap(), 300);
}

/// A turn's first step creates its run with its first events, after the session's other
/// runs; later steps continue it.
pub async fn turn_step_creates_its_run_with_its_first_events(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let earlier = new_run(&*store, session.id).await;
    let lease = store.acquire_lease(session.id, "p", Duration::from_secs(5), at(0)).await.unwrap();
    let run = run_in(session.id);
    let first = TurnStep {
        high_water: Some(257),
        messages: vec![Arc::new(Message::user("hello"))],
        events: vec![Arc::new(event(&run, 1))],
        journal: Vec::new(),
        run: Some(Arc::new(run.clone())),
        release_lease: false,
    };
    assert_eq!(store.write_step(run.id, &first, Some(lease.fence())).await.unwrap().len(), 1);
    assert_eq!(store.get_run(run.id).await.unwrap(), run);
    let query = RunQuery { order: Order::Desc, ..RunQuery::default() };
    let latest = store.list_runs(session.id, &query, &PageRequest::first(5)).await.unwrap().items;
    assert_eq!(latest.iter().map(|run| run.id).collect::<Vec<_>>(), [run.id, earlier.id]);
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [1]);
    assert_eq!(run_messages(&*store, session.id, run.id).await, ["hello"]);
    assert_eq!(store.high_water(run.id).await.unwrap(), 257);
    let next = TurnStep { events: vec![Arc::new(event(&run, 2))], ..TurnStep::default() };
    store.write_step(run.id, &next, Some(lease.fence())).await.unwrap();
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [1, 2]);
    assert_eq!(store.get_run(run.id).await.unwrap(), run, "a step without a record keeps it");
}

/// A turn's first step with the turn's start (`start_turn`).
fn first_step(run: &RunRecord) -> TurnStep {
    TurnStep {
        high_water: Some(64),
        messages: vec![Arc::new(Message::user("hello"))],
        events: vec![Arc::new(event(run, 1))],
        journal: Vec::new(),
        run: Some(Arc::new(run.clone())),
        release_lease: false,
    }
}

/// What a turn's start asks for.
fn turn_start(owner: &str, seconds: i64, previous: Option<TurnId>) -> TurnStart {
    TurnStart { owner: owner.into(), ttl: Duration::from_secs(30), now: at(seconds), previous }
}

/// `start_turn` grants the session's lease and stores the new turn with its first step in
/// one write; the lease fences the turn's later writes, a lease expired by then is taken
/// over, and the next turn starts on the latest one (member runs are not turns).
pub async fn turn_start_takes_the_lease_and_stores_the_turn_in_one_write(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let other = new_session(&*store).await;
    let earlier = store.acquire_lease(other.id, "q", Duration::from_secs(5), at(0)).await.unwrap();
    let run = run_in(session.id);
    let (lease, positions) =
        store.start_turn(run.id, &first_step(&run), &turn_start("p", 0, None)).await.unwrap();
    assert_eq!((lease.session_id, lease.owner.as_str(), lease.expires_at), (session.id, "p", at(30)));
    assert!(lease.token > earlier.token, "{} after {}", lease.token, earlier.token);
    assert_eq!(store.lease(session.id).await.unwrap(), Some(lease.clone()));
    assert_eq!(store.get_run(run.id).await.unwrap(), run);
    let stored = store.turn_events(run.id, Order::Asc, None, 10).await.unwrap();
    assert_eq!(seqs(&stored), [1]);
    assert_eq!(stored.iter().map(|event| event.position).collect::<Vec<_>>(), positions);
    assert_eq!(run_messages(&*store, session.id, run.id).await, ["hello"]);
    assert_eq!(store.high_water(run.id).await.unwrap(), 64);
    // The lease fences the turn's writes, and its last step gives it back.
    let member = RunRecord { parent_run_id: Some(run.id), ..run_in(session.id) };
    store.put_run(&member, Some(lease.fence())).await.unwrap();
    let last =
        TurnStep { events: vec![Arc::new(event(&run, 2))], release_lease: true, ..TurnStep::default() };
    store.write_step(run.id, &last, Some(lease.fence())).await.unwrap();
    assert_eq!(store.lease(session.id).await.unwrap(), None);
    // The next turn follows the latest turn, not the newer member run; it takes over a
    // lease expired by then.
    let dead = store.acquire_lease(session.id, "dead", Duration::from_secs(5), at(40)).await.unwrap();
    let next = run_in(session.id);
    let (taken, _) =
        store.start_turn(next.id, &first_step(&next), &turn_start("p", 46, Some(run.id))).await.unwrap();
    assert!(taken.token > dead.token);
    assert_eq!(taken.expires_at, at(76));
    let stale = store.put_run(&next, Some(dead.fence())).await;
    assert!(matches!(stale, Err(StoreError::Conflict(Conflict::StaleFence { .. }))), "{stale:?}");
    let query = RunQuery { order: Order::Desc, parent: ParentFilter::Any, ..RunQuery::default() };
    let runs = store.list_runs(session.id, &query, &PageRequest::first(5)).await.unwrap().items;
    assert_eq!(runs.iter().map(|run| run.id).collect::<Vec<_>>(), [next.id, member.id, run.id]);
}

/// `start_turn` refused for any reason (a live lease, another latest turn, an existing run,
/// an unknown session, a malformed step or owner, a refused part of the step) stores
/// nothing and takes no lease.
pub async fn turn_start_refused_for_any_reason_changes_nothing(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let older = run_in(session.id);
    let (lease, _) =
        store.start_turn(older.id, &first_step(&older), &turn_start("p", 0, None)).await.unwrap();
    let release = TurnStep { release_lease: true, ..TurnStep::default() };
    store.write_step(older.id, &release, Some(lease.fence())).await.unwrap();
    let latest = run_in(session.id);
    let (lease, _) =
        store.start_turn(latest.id, &first_step(&latest), &turn_start("p", 1, Some(older.id))).await.unwrap();
    let run = run_in(session.id);
    let step = first_step(&run);
    // Leased while the latest turn runs.
    let error = store.start_turn(run.id, &step, &turn_start("q", 2, Some(latest.id))).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::LeaseHeld { .. })), "{error:?}");
    store.write_step(latest.id, &release, Some(lease.fence())).await.unwrap();
    // Not the latest turn.
    for previous in [None, Some(older.id), Some(run.id)] {
        let error = store.start_turn(run.id, &step, &turn_start("q", 3, previous)).await.unwrap_err();
        let StoreError::Conflict(Conflict::LatestTurnChanged { session_id, expected, latest: found }) = error
        else {
            panic!("expected LatestTurnChanged, got {error:?}");
        };
        assert_eq!((session_id, expected, found), (session.id, previous, Some(latest.id)));
    }
    // The run exists.
    let again = first_step(&latest);
    let error = store.start_turn(latest.id, &again, &turn_start("q", 3, Some(latest.id))).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::AlreadyExists { .. })), "{error:?}");
    // An unknown session.
    let stranger = run_in(SessionId::new());
    assert_not_found(store.start_turn(stranger.id, &first_step(&stranger), &turn_start("q", 3, None)).await);
    // Malformed: no record, a member run's record, a release, an empty owner.
    let start = turn_start("q", 3, Some(latest.id));
    assert_invalid(store.start_turn(run.id, &TurnStep { run: None, ..step.clone() }, &start).await);
    let member = RunRecord { parent_run_id: Some(latest.id), ..run.clone() };
    assert_invalid(store.start_turn(run.id, &first_step(&member), &start).await);
    assert_invalid(store.start_turn(run.id, &TurnStep { release_lease: true, ..step.clone() }, &start).await);
    assert_invalid(store.start_turn(run.id, &step, &turn_start("", 3, Some(latest.id))).await);
    // A part of the step refused: events out of order.
    let disordered =
        TurnStep { events: vec![Arc::new(event(&run, 2)), Arc::new(event(&run, 1))], ..step.clone() };
    let error = store.start_turn(run.id, &disordered, &start).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleSeq { .. })), "{error:?}");
    // Nothing of it is stored, and the session is free.
    assert_not_found(store.get_run(run.id).await);
    assert_eq!(store.lease(session.id).await.unwrap(), None);
    let query = RunQuery { order: Order::Desc, parent: ParentFilter::Any, ..RunQuery::default() };
    let runs = store.list_runs(session.id, &query, &PageRequest::first(5)).await.unwrap().items;
    assert_eq!(runs.iter().map(|run| run.id).collect::<Vec<_>>(), [latest.id, older.id]);
    assert_eq!(store.turn_events(latest.id, Order::Asc, None, 10).await.unwrap().len(), 1);
    store.start_turn(run.id, &step, &start).await.unwrap();
}

/// An event stored at the largest storable seq is read newest first from the top, and in
/// both orders around a cursor.
pub async fn an_event_at_the_largest_seq_is_read_in_both_orders(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let top = crate::rules::MAX_SEQ;
    store.append_events(run.id, &[event(&run, 7), event(&run, top)], None).await.unwrap();
    let seqs =
        |events: Vec<StoredEvent>| events.into_iter().map(|stored| stored.event.seq).collect::<Vec<_>>();
    assert_eq!(seqs(store.turn_events(run.id, Order::Desc, None, 10).await.unwrap()), [top, 7]);
    assert_eq!(seqs(store.turn_events(run.id, Order::Desc, Some(top), 10).await.unwrap()), [7]);
    assert_eq!(seqs(store.turn_events(run.id, Order::Desc, Some(u64::MAX), 10).await.unwrap()), [top, 7]);
    assert_eq!(seqs(store.turn_events(run.id, Order::Asc, Some(7), 10).await.unwrap()), [top]);
    assert_eq!(seqs(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [7, top]);
}

/// A step refused for any of its parts (a stale seq, another run's record, a stale fence,
/// an unknown run) stores none of its parts.
pub async fn turn_step_refused_in_any_part_stores_none_of_it(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let other = new_run(&*store, session.id).await;
    let lease = store.acquire_lease(session.id, "p", Duration::from_secs(5), at(0)).await.unwrap();
    store.append_events(run.id, &[event(&run, 5)], Some(lease.fence())).await.unwrap();
    let mut changed = run.clone();
    changed.agent_id = Some("changed".into());
    let step = |events: Vec<EventEnvelope>, record: RunRecord| TurnStep {
        high_water: Some(900),
        messages: vec![Arc::new(Message::user("must not be stored"))],
        events: events.into_iter().map(Arc::new).collect(),
        journal: vec![journal_entry(record.id, "must-not-be-stored", "h")],
        run: Some(Arc::new(record)),
        release_lease: false,
    };
    let stale_seq = step(vec![event(&run, 6), event(&run, 3)], changed.clone());
    let error = store.write_step(run.id, &stale_seq, None).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleSeq { .. })), "{error:?}");
    assert_invalid(store.write_step(run.id, &step(vec![event(&run, 6)], other.clone()), None).await);
    let mut moved = changed.clone();
    moved.session_id = SessionId::new();
    assert_invalid(store.write_step(run.id, &step(vec![event(&run, 6)], moved), None).await);
    let taken = store.acquire_lease(session.id, "q", Duration::from_secs(5), at(6)).await.unwrap();
    let stale_fence = TurnStep { release_lease: true, ..step(vec![event(&run, 6)], changed.clone()) };
    let error = store.write_step(run.id, &stale_fence, Some(lease.fence())).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleFence { .. })), "{error:?}");
    // A holder that lost the lease is told so even when its seqs are stale too (a new
    // holder stored later events meanwhile): the fence is checked first.
    let both = step(vec![event(&run, 3)], changed.clone());
    let error = store.write_step(run.id, &both, Some(lease.fence())).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleFence { .. })), "{error:?}");
    let error = store.append_events(run.id, &[event(&run, 3)], Some(lease.fence())).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleFence { .. })), "{error:?}");
    assert_eq!(store.lease(session.id).await.unwrap().map(|lease| lease.token), Some(taken.token));
    // A release needs the fence that holds the lease.
    let unfenced = TurnStep { release_lease: true, ..step(vec![event(&run, 6)], changed.clone()) };
    assert_invalid(store.write_step(run.id, &unfenced, None).await);
    // An unknown run: without its record, or with one of an unknown session, or (creating
    // it) under a stale fence.
    let ghost = run_in(session.id);
    let no_record = TurnStep { run: None, ..step(vec![event(&ghost, 1)], ghost.clone()) };
    assert_not_found(store.write_step(ghost.id, &no_record, None).await);
    let orphan = run_in(SessionId::new());
    assert_not_found(store.write_step(orphan.id, &step(vec![event(&orphan, 1)], orphan.clone()), None).await);
    let error = store
        .write_step(ghost.id, &step(vec![event(&ghost, 1)], ghost.clone()), Some(lease.fence()))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleFence { .. })), "{error:?}");
    // Nothing of any refused step is stored.
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [5]);
    assert!(run_messages(&*store, session.id, run.id).await.is_empty());
    assert_eq!(store.get_run(run.id).await.unwrap(), run);
    assert_eq!(store.high_water(run.id).await.unwrap(), 5);
    assert!(store.journal(run.id).await.unwrap().is_empty());
    assert_not_found(store.get_run(ghost.id).await);
    assert_not_found(store.get_run(orphan.id).await);
    assert_eq!(store.lease(session.id).await.unwrap().map(|lease| lease.token), Some(taken.token));
    // The current holder's step goes through.
    store
        .write_step(run.id, &step(vec![event(&run, 6)], changed.clone()), Some(taken.fence()))
        .await
        .unwrap();
    assert_eq!(store.get_run(run.id).await.unwrap(), changed);
}

/// Steps written together (a backend that commits groups puts them in one transaction):
/// one refused after part of it was applied leaves nothing, and its neighbours stand whole.
pub async fn turn_steps_refused_among_concurrent_ones_leave_the_others_whole(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut runs = Vec::new();
    for _ in 0..40 {
        let run = new_run(&*store, session.id).await;
        store.append_events(run.id, &[event(&run, 5)], None).await.unwrap();
        runs.push(run);
    }
    let steps = runs.iter().enumerate().map(|(index, run)| {
        let mut changed = run.clone();
        changed.agent_id = Some(format!("changed-{index}"));
        // Every other step fails on its last event (a store that applies a step's parts in
        // order has applied its first event by then).
        let last = if index % 2 == 0 { 7 } else { 3 };
        let step = TurnStep {
            high_water: Some(900),
            messages: vec![Arc::new(Message::user(format!("step {index}")))],
            events: vec![Arc::new(event(run, 6)), Arc::new(event(run, last))],
            journal: vec![journal_entry(run.id, &format!("call-{index}"), "h")],
            run: Some(Arc::new(changed)),
            release_lease: false,
        };
        let store = store.clone();
        async move { store.write_step(step.events[0].turn_id, &step, None).await }
    });
    let results = futures_util::future::join_all(steps).await;
    for (index, (run, result)) in runs.iter().zip(results).enumerate() {
        let stored = seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap());
        if index % 2 == 0 {
            result.unwrap();
            assert_eq!(stored, [5, 6, 7], "step {index}");
            assert_eq!(run_messages(&*store, session.id, run.id).await.len(), 1, "step {index}");
            assert_eq!(store.get_run(run.id).await.unwrap().agent_id, Some(format!("changed-{index}")));
            assert_eq!(store.journal(run.id).await.unwrap().len(), 1, "step {index}");
        } else {
            let error = result.unwrap_err();
            assert!(matches!(error, StoreError::Conflict(Conflict::StaleSeq { .. })), "{error:?}");
            assert_eq!(stored, [5], "step {index}");
            assert!(run_messages(&*store, session.id, run.id).await.is_empty(), "step {index}");
            assert_eq!(store.get_run(run.id).await.unwrap(), *run);
            assert!(store.journal(run.id).await.unwrap().is_empty(), "step {index}");
            assert_eq!(store.high_water(run.id).await.unwrap(), 5, "step {index}");
        }
    }
}

/// The high-water mark only rises and is never below a stored seq.
pub async fn high_water_mark_rises_never_falls_and_covers_stored_events(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    assert_eq!(store.high_water(run.id).await.unwrap(), 0);
    assert_eq!(store.raise_high_water(run.id, 64, None).await.unwrap(), 64);
    assert_eq!(store.raise_high_water(run.id, 10, None).await.unwrap(), 64, "it never falls");
    store.append_events(run.id, &[event(&run, 70)], None).await.unwrap();
    assert_eq!(store.high_water(run.id).await.unwrap(), 70);
    assert_eq!(store.raise_high_water(run.id, 128, None).await.unwrap(), 128);
    assert_eq!(store.high_water(run.id).await.unwrap(), 128);
}

/// Concurrent writers on many turns: every turn's seqs increase, positions are unique and
/// increase in each turn, and nothing is lost.
pub async fn concurrent_appends_to_many_turns_keep_seq_and_positions_ordered(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut runs = Vec::new();
    for _ in 0..8 {
        runs.push(new_run(&*store, session.id).await);
    }
    let mut tasks = Vec::new();
    for run in runs.clone() {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for seq in 1..=25u64 {
                store.append_events(run.id, &[event(&run, seq)], None).await.unwrap();
            }
            // A stale seq is still refused under contention.
            let stale = store.append_events(run.id, &[event(&run, 10)], None).await;
            assert!(matches!(stale, Err(StoreError::Conflict(Conflict::StaleSeq { .. }))));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut positions = BTreeSet::new();
    for run in &runs {
        let stored = store.turn_events(run.id, Order::Asc, None, 1000).await.unwrap();
        assert_eq!(seqs(&stored), (1..=25).collect::<Vec<_>>());
        assert!(stored.windows(2).all(|pair| pair[0].position < pair[1].position));
        for event in stored {
            assert!(positions.insert(event.position), "position {} used twice", event.position);
        }
    }
    assert_eq!(store.feed(&FeedQuery::default(), 1000).await.unwrap().len(), 200);
}

/// A read sees every write acknowledged before it, whether it is the only call in flight
/// (file stores may run it on their writer thread) or one of many (on a reader thread).
pub async fn reads_see_every_write_acknowledged_before_them_alone_or_among_others(store: Arc<dyn Store>) {
    // Alone: every call waits for the one before.
    let session = new_session(&*store).await;
    read_back_runs(&*store, session.id, 5).await;
    // Among others: eight sessions' calls interleave.
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let session = new_session(&*store).await;
            read_back_runs(&*store, session.id, 10).await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Writes `count` runs with a message each to a session, reading every one back (by id, as
/// the latest run and in the history window) as soon as it is acknowledged.
async fn read_back_runs(store: &dyn Store, session: SessionId, count: usize) {
    let latest = RunQuery { order: Order::Desc, ..RunQuery::default() };
    let window = HistoryQuery { last_runs: Some(3), ..HistoryQuery::default() };
    for turn in 0..count {
        let run = run_with_messages(store, session, &[Message::user(format!("q{turn}"))], |_| {}).await;
        assert_eq!(store.get_run(run.id).await.unwrap(), run);
        let listed = store.list_runs(session, &latest, &PageRequest::first(1)).await.unwrap();
        assert_eq!(listed.items.first().map(|run| run.id), Some(run.id));
        let history = store.history(session, &window).await.unwrap();
        assert_eq!(texts(&history).last().map(String::as_str), Some(format!("q{turn}").as_str()));
        assert_eq!(history.len(), (turn + 1).min(3));
    }
}

// ---------------------------------------------------------------------------------------
// History.
// ---------------------------------------------------------------------------------------

async fn run_with_messages(
    store: &dyn Store,
    session: SessionId,
    messages: &[Message],
    configure: impl FnOnce(&mut RunRecord),
) -> RunRecord {
    let mut run = run_in(session);
    configure(&mut run);
    store.put_run(&run, None).await.unwrap();
    let messages: Vec<Arc<Message>> = messages.iter().cloned().map(Arc::new).collect();
    store.append_messages(run.id, &messages, None).await.unwrap();
    run
}

fn texts(history: &[agentry_types::HistoryMessage]) -> Vec<String> {
    history.iter().map(|message| message.message.text()).collect()
}

/// The window holds the last runs' messages, oldest first, in their order.
pub async fn history_returns_the_last_runs_messages_oldest_first(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    for turn in 1..=4 {
        let messages = [Message::user(format!("q{turn}")), Message::assistant(format!("a{turn}"))];
        run_with_messages(&*store, session.id, &messages, |_| {}).await;
    }
    let window =
        store.history(session.id, &HistoryQuery { last_runs: Some(2), ..Default::default() }).await.unwrap();
    assert_eq!(texts(&window), ["q3", "a3", "q4", "a4"]);
    assert_eq!(window[1].index, 1);
}

/// Roles, statuses, agents, teams and replayed messages are filtered out on request.
pub async fn history_filters_roles_statuses_agents_teams_and_replayed_messages(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let mut replayed = Message::user("old question");
    replayed.from_history = true;
    run_with_messages(&*store, session.id, &[Message::system("sys"), replayed, Message::user("q1")], |run| {
        run.agent_id = Some("a".into());
    })
    .await;
    run_with_messages(&*store, session.id, &[Message::user("q2")], |run| {
        run.agent_id = Some("b".into());
        run.set_state(TurnState::Error { message: "x".into(), completed_at: at(1), metrics: None });
    })
    .await;
    run_with_messages(&*store, session.id, &[Message::user("q3")], |run| run.team_id = Some("crew".into()))
        .await;
    let query = |configure: fn(&mut HistoryQuery)| {
        let store = store.clone();
        async move {
            let mut query = HistoryQuery { last_runs: Some(10), ..Default::default() };
            configure(&mut query);
            texts(&store.history(session.id, &query).await.unwrap())
        }
    };
    assert_eq!(query(|_| {}).await, ["sys", "old question", "q1", "q2", "q3"]);
    assert_eq!(query(|q| q.skip_roles = vec![Role::System]).await, ["old question", "q1", "q2", "q3"]);
    assert_eq!(query(|q| q.skip_history_messages = true).await, ["sys", "q1", "q2", "q3"]);
    assert_eq!(
        query(|q| q.skip_statuses = vec![RunStatus::Error]).await,
        ["sys", "old question", "q1", "q3"]
    );
    assert_eq!(query(|q| q.agent_id = Some("b".into())).await, ["q2"]);
    assert_eq!(query(|q| q.team_id = Some("crew".into())).await, ["q3"]);
}

/// `last_messages` keeps the latest messages; with no bound, the default run bound applies.
pub async fn history_last_messages_bound_and_the_default_bound(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    for turn in 1..=3 {
        run_with_messages(
            &*store,
            session.id,
            &[Message::user(format!("q{turn}")), Message::assistant(format!("a{turn}"))],
            |_| {},
        )
        .await;
    }
    let last3 = store
        .history(session.id, &HistoryQuery { last_messages: Some(3), ..Default::default() })
        .await
        .unwrap();
    assert_eq!(texts(&last3), ["a2", "q3", "a3"]);
    let both = HistoryQuery { last_runs: Some(1), last_messages: Some(5), ..Default::default() };
    assert_eq!(texts(&store.history(session.id, &both).await.unwrap()), ["q3", "a3"]);
    let all = store.history(session.id, &HistoryQuery::default()).await.unwrap();
    assert_eq!(all.len(), 6);
}

/// Member runs count only when asked for.
pub async fn history_includes_member_runs_only_when_asked(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let turn = run_with_messages(&*store, session.id, &[Message::user("team question")], |_| {}).await;
    run_with_messages(&*store, session.id, &[Message::assistant("member answer")], |run| {
        run.parent_run_id = Some(turn.id)
    })
    .await;
    let default = store.history(session.id, &HistoryQuery::default()).await.unwrap();
    assert_eq!(texts(&default), ["team question"]);
    let with_members = HistoryQuery { include_member_runs: true, ..Default::default() };
    assert_eq!(
        texts(&store.history(session.id, &with_members).await.unwrap()),
        ["team question", "member answer"]
    );
}

/// A window without member runs does not look at them: a turn followed by more member
/// runs than a window looks at still has its messages in the window.
pub async fn a_team_sessions_member_runs_do_not_push_its_turns_out_of_a_history_window(
    store: Arc<dyn Store>,
) {
    let session = new_session(&*store).await;
    let first = run_with_messages(&*store, session.id, &[Message::user("first question")], |_| {}).await;
    let members: Vec<RunRecord> = (0..=MAX_HISTORY_SCAN)
        .map(|_| RunRecord { parent_run_id: Some(first.id), ..run_in(session.id) })
        .collect();
    // Together, so that the backends commit them in a few groups.
    futures_util::future::try_join_all(members.iter().map(|member| store.put_run(member, None)))
        .await
        .unwrap();
    run_with_messages(&*store, session.id, &[Message::user("second question")], |_| {}).await;
    let window = store.history(session.id, &HistoryQuery::default()).await.unwrap();
    assert_eq!(texts(&window), ["first question", "second question"]);
    // A window of member runs too looks at no more than its bound.
    let with_members = HistoryQuery { include_member_runs: true, ..Default::default() };
    assert_eq!(texts(&store.history(session.id, &with_members).await.unwrap()), ["second question"]);
}

/// Messages need their run, history its session.
pub async fn messages_of_an_unknown_run_or_session_are_not_found(store: Arc<dyn Store>) {
    assert_not_found(store.append_messages(TurnId::new(), &[Arc::new(Message::user("x"))], None).await);
    assert_not_found(store.history(SessionId::new(), &HistoryQuery::default()).await);
}

// ---------------------------------------------------------------------------------------
// Users.
// ---------------------------------------------------------------------------------------

/// A profile is saved, read and replaced.
pub async fn profiles_are_saved_and_replaced(store: Arc<dyn Store>) {
    assert_eq!(store.profile("u1").await.unwrap(), None);
    let profile = UserProfile { user_id: "u1".into(), profile: json!({"name": "Ada"}), updated_at: at(1) };
    store.put_profile(&profile).await.unwrap();
    assert_eq!(store.profile("u1").await.unwrap(), Some(profile));
    let replaced = UserProfile {
        user_id: "u1".into(),
        profile: json!({"name": "Ada", "lang": "fr"}),
        updated_at: at(2),
    };
    store.put_profile(&replaced).await.unwrap();
    assert_eq!(store.profile("u1").await.unwrap(), Some(replaced));
    assert_eq!(store.profile("u2").await.unwrap(), None);
}

fn profile(user: &str, profile: serde_json::Value, seconds: i64) -> UserProfile {
    UserProfile { user_id: user.into(), profile, updated_at: at(seconds) }
}

/// A merge creates a missing profile, keeps the fields it does not name, replaces a
/// profile that is not an object, never moves its time back, and refuses a patch that is not an object or a result
/// too large to store, changing nothing.
pub async fn profile_merges_keep_other_fields_and_refuse_bad_patches_unchanged(store: Arc<dyn Store>) {
    let created = store.merge_profile(&profile("u1", json!({"name": "Ada"}), 1)).await.unwrap();
    assert_eq!(created, profile("u1", json!({"name": "Ada"}), 1));
    let merged =
        store.merge_profile(&profile("u1", json!({"lang": "fr", "name": "Ada L."}), 2)).await.unwrap();
    assert_eq!(merged, profile("u1", json!({"name": "Ada L.", "lang": "fr"}), 2));
    assert_eq!(store.profile("u1").await.unwrap(), Some(merged.clone()));

    assert_invalid(store.merge_profile(&profile("u1", json!(["not", "fields"]), 3)).await);
    let huge = profile("u1", json!({"notes": "x".repeat(MAX_RECORD_BYTES)}), 3);
    assert!(matches!(store.merge_profile(&huge).await, Err(StoreError::TooLarge { .. })));
    assert_eq!(store.profile("u1").await.unwrap(), Some(merged), "refused merges change nothing");

    store.put_profile(&profile("u2", json!("a plain note"), 1)).await.unwrap();
    let replaced = store.merge_profile(&profile("u2", json!({"name": "Grace"}), 2)).await.unwrap();
    assert_eq!(replaced.profile, json!({"name": "Grace"}));
    // A merge that lands after a later one keeps the later time.
    let late = store.merge_profile(&profile("u2", json!({"lang": "en"}), 1)).await.unwrap();
    assert_eq!((late.profile, late.updated_at), (json!({"name": "Grace", "lang": "en"}), at(2)));
    assert_eq!(store.profile("u3").await.unwrap(), None);
}

/// Merges of different fields into one profile, made at the same time, all land.
pub async fn profile_merges_made_at_once_all_land(store: Arc<dyn Store>) {
    let merges = (0..32).map(|field| {
        let store = store.clone();
        tokio::spawn(async move {
            store.merge_profile(&profile("u1", json!({ format!("field{field}"): field }), field)).await
        })
    });
    for merge in futures_util::future::join_all(merges).await {
        merge.unwrap().unwrap();
    }
    let stored = store.profile("u1").await.unwrap().unwrap().profile;
    let fields = stored.as_object().unwrap();
    assert_eq!(fields.len(), 32, "{stored}");
    for field in 0..32 {
        assert_eq!(fields[&format!("field{field}")], json!(field));
    }
}

fn memory(user: &str, id: &str, seconds: i64) -> UserMemory {
    UserMemory {
        id: id.into(),
        user_id: user.into(),
        memory: format!("fact {id}"),
        topics: vec!["t".into()],
        created_at: at(seconds),
    }
}

/// Memories list newest first, per user, and can be deleted.
pub async fn memories_list_newest_first_and_delete(store: Arc<dyn Store>) {
    for (id, seconds) in [("m1", 1), ("m2", 3), ("m3", 2)] {
        store.add_memory(&memory("u1", id, seconds)).await.unwrap();
    }
    store.add_memory(&memory("u2", "m9", 9)).await.unwrap();
    // User ids that extend another's, or sort right after it, keep their own memories.
    for (user, id) in [("u", "short"), ("u1\0", "nul"), ("u10", "longer"), ("u1\u{10FFFF}", "max")] {
        store.add_memory(&memory(user, id, 5)).await.unwrap();
    }
    let ids = |memories: Vec<UserMemory>| memories.into_iter().map(|m| m.id).collect::<Vec<_>>();
    assert_eq!(ids(store.memories("u1", 10).await.unwrap()), ["m2", "m3", "m1"]);
    assert_eq!(ids(store.memories("u1\0", 10).await.unwrap()), ["nul"]);
    assert_eq!(ids(store.memories("u", 10).await.unwrap()), ["short"]);
    assert_eq!(ids(store.memories("u1", 2).await.unwrap()), ["m2", "m3"]);
    store.delete_memory("u1", "m3").await.unwrap();
    assert_eq!(ids(store.memories("u1", 10).await.unwrap()), ["m2", "m1"]);
    assert_eq!(ids(store.memories("u2", 10).await.unwrap()), ["m9"]);
}

/// A memory id is unique; deleting an unknown one is not found.
pub async fn memory_ids_are_unique_and_unknown_deletes_are_not_found(store: Arc<dyn Store>) {
    store.add_memory(&memory("u1", "m1", 1)).await.unwrap();
    let error = store.add_memory(&memory("u1", "m1", 2)).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::AlreadyExists { .. })), "{error:?}");
    assert_not_found(store.delete_memory("u1", "nope").await);
    assert_not_found(store.delete_memory("u2", "m1").await);
}

// ---------------------------------------------------------------------------------------
// Journal.
// ---------------------------------------------------------------------------------------

fn journal_entry(turn: TurnId, call: &str, hash: &str) -> JournalEntry {
    JournalEntry {
        turn_id: turn,
        tool_call_id: call.into(),
        tool_name: "send_email".into(),
        idempotency_key: format!("{turn}:{call}"),
        arguments_hash: hash.into(),
        started_at: at(1),
        result: None,
        completed_at: None,
    }
}

/// Starting a journaled call again with the same arguments returns the stored entry.
pub async fn journal_start_is_idempotent_for_the_same_arguments(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let entry = journal_entry(run.id, "c1", "h1");
    assert_eq!(store.journal_start(&entry, None).await.unwrap(), entry);
    let result = ToolResult { content: "sent".into(), is_error: false };
    store.journal_complete(run.id, "c1", &result, at(2), None).await.unwrap();
    let again =
        store.journal_start(&JournalEntry { started_at: at(9), ..entry.clone() }, None).await.unwrap();
    assert_eq!(again.result, Some(result), "a restart learns the call already completed");
    assert_eq!(again.started_at, at(1));
    assert_eq!(store.journal(run.id).await.unwrap().len(), 1);
}

/// Journaling a call again with other arguments is a conflict.
pub async fn journal_start_with_other_arguments_conflicts(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    store.journal_start(&journal_entry(run.id, "c1", "h1"), None).await.unwrap();
    let error = store.journal_start(&journal_entry(run.id, "c1", "h2"), None).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::JournalMismatch { .. })), "{error:?}");
    assert_not_found(store.journal_start(&journal_entry(TurnId::new(), "c1", "h1"), None).await);
}

/// A result is recorded once: the same result again is a no-op, another is a conflict.
pub async fn journal_complete_records_the_result_once(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    store.journal_start(&journal_entry(run.id, "c1", "h1"), None).await.unwrap();
    let result = ToolResult { content: "42".into(), is_error: false };
    let done = store.journal_complete(run.id, "c1", &result, at(5), None).await.unwrap();
    assert_eq!(done.result.as_ref(), Some(&result));
    assert_eq!(done.completed_at, Some(at(5)));
    assert_eq!(store.journal_complete(run.id, "c1", &result, at(6), None).await.unwrap(), done);
    let other = ToolResult { content: "43".into(), is_error: true };
    let error = store.journal_complete(run.id, "c1", &other, at(7), None).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::AlreadyCompleted { .. })), "{error:?}");
    assert_eq!(store.journal(run.id).await.unwrap(), vec![done]);
}

/// A call must be started before it completes.
pub async fn journal_complete_of_an_unstarted_call_is_not_found(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let result = ToolResult { content: "x".into(), is_error: false };
    assert_not_found(store.journal_complete(run.id, "ghost", &result, at(1), None).await);
    assert_not_found(store.journal(TurnId::new()).await);
}

/// The journal lists calls in the order they started.
pub async fn journal_lists_calls_in_start_order(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    for call in ["c3", "c1", "c2"] {
        store.journal_start(&journal_entry(run.id, call, "h"), None).await.unwrap();
    }
    let calls: Vec<String> =
        store.journal(run.id).await.unwrap().into_iter().map(|e| e.tool_call_id).collect();
    assert_eq!(calls, ["c3", "c1", "c2"]);
}

// ---------------------------------------------------------------------------------------
// Budgets.
// ---------------------------------------------------------------------------------------

fn tokens(amount: u64) -> BudgetUsage {
    BudgetUsage { tokens_used: amount, steps_used: 1, ..BudgetUsage::default() }
}

fn reservation(id: &str, scopes: &[&str], amount: BudgetUsage, expires_at: Timestamp) -> BudgetReservation {
    BudgetReservation {
        id: id.into(),
        scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
        amount,
        expires_at,
        lease: None,
    }
}

/// Reservations hold amounts; settling moves the real amount to used; releasing frees.
pub async fn budget_reserve_settle_and_release_account_correctly(store: Arc<dyn Store>) {
    let limit = BudgetLimit { max_tokens: Some(1000), max_steps: Some(10), ..BudgetLimit::default() };
    store.create_budget("mission:m1", &limit, None).await.unwrap();
    store
        .create_budget("instance:i1", &BudgetLimit { max_tokens: Some(500), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    store
        .reserve(&reservation("r1", &["instance:i1", "mission:m1"], tokens(300), at(100)), at(0))
        .await
        .unwrap();
    let ledger = store.budget("mission:m1", at(1)).await.unwrap();
    assert_eq!(ledger.limit, limit);
    assert_eq!(ledger.reserved.tokens_used, 300);
    assert_eq!(ledger.used.tokens_used, 0);
    store
        .settle(
            "r1",
            &BudgetUsage {
                tokens_used: 120,
                steps_used: 1,
                tool_calls_used: 0,
                cost_used_usd: 0.5,
                elapsed_ms: Some(40),
            },
        )
        .await
        .unwrap();
    for scope in ["mission:m1", "instance:i1"] {
        let ledger = store.budget(scope, at(2)).await.unwrap();
        assert_eq!(ledger.used.tokens_used, 120, "{scope}");
        assert!((ledger.used.cost_used_usd - 0.5).abs() < 1e-9);
        assert_eq!(ledger.reserved.tokens_used, 0);
    }
    store.reserve(&reservation("r2", &["mission:m1"], tokens(50), at(100)), at(3)).await.unwrap();
    store.release("r2").await.unwrap();
    assert_eq!(store.budget("mission:m1", at(4)).await.unwrap().reserved.tokens_used, 0);
    assert_not_found(store.settle("r1", &tokens(1)).await);
}

/// A reservation that passes any limit of any scope is refused whole.
pub async fn budget_reservation_past_any_limit_is_refused_on_every_scope(store: Arc<dyn Store>) {
    store
        .create_budget("mission:m", &BudgetLimit { max_tokens: Some(1000), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    store
        .create_budget("instance:a", &BudgetLimit { max_tool_calls: Some(2), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    let calls = |n| BudgetUsage { tool_calls_used: n, tokens_used: 10, ..BudgetUsage::default() };
    store.reserve(&reservation("ok", &["instance:a", "mission:m"], calls(2), at(100)), at(0)).await.unwrap();
    let error = store
        .reserve(&reservation("over", &["mission:m", "instance:a"], calls(1), at(100)), at(0))
        .await
        .unwrap_err();
    match error {
        StoreError::Conflict(Conflict::BudgetExceeded { scope, dimension, .. }) => {
            assert_eq!((scope.as_str(), dimension), ("instance:a", "max_tool_calls"));
        }
        other => panic!("expected BudgetExceeded, got {other:?}"),
    }
    assert_eq!(
        store.budget("mission:m", at(1)).await.unwrap().reserved.tokens_used,
        10,
        "nothing held by the refusal"
    );
    let error =
        store.reserve(&reservation("huge", &["mission:m"], tokens(991), at(100)), at(0)).await.unwrap_err();
    assert!(
        matches!(error, StoreError::Conflict(Conflict::BudgetExceeded { dimension: "max_tokens", .. })),
        "{error:?}"
    );
}

/// An expired reservation no longer holds room.
pub async fn budget_expired_reservations_stop_counting(store: Arc<dyn Store>) {
    store
        .create_budget("s", &BudgetLimit { max_tokens: Some(100), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    store.reserve(&reservation("r1", &["s"], tokens(80), at(10)), at(0)).await.unwrap();
    assert!(store.reserve(&reservation("r2", &["s"], tokens(30), at(20)), at(5)).await.is_err());
    assert_eq!(store.budget("s", at(11)).await.unwrap().reserved.tokens_used, 0);
    store.reserve(&reservation("r3", &["s"], tokens(90), at(30)), at(11)).await.unwrap();
}

/// A reservation made under a lease holds while the lease is its session's current one,
/// renewed or lapsed, and ends when the lease is taken over or given back; one made with a
/// stale lease is refused and changes nothing; an ended one still settles what was used.
pub async fn budget_reservations_end_with_their_lease(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let ttl = Duration::from_secs(30);
    let under = |id: &str, amount: u64, lease: &Lease| BudgetReservation {
        lease: Some(lease.fence()),
        ..reservation(id, &["s"], tokens(amount), at(1000))
    };
    store
        .create_budget("s", &BudgetLimit { max_tokens: Some(100), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    let first = store.acquire_lease(session.id, "p1", ttl, at(0)).await.unwrap();
    store.reserve(&under("r1", 80, &first), at(1)).await.unwrap();
    store.renew_lease(session.id, first.token, ttl, at(20)).await.unwrap();
    assert_eq!(store.budget("s", at(21)).await.unwrap().reserved.tokens_used, 80, "renewed");
    let over = store.reserve(&under("r2", 30, &first), at(21)).await.unwrap_err();
    assert!(matches!(over, StoreError::Conflict(Conflict::BudgetExceeded { .. })), "{over:?}");
    // Lapsed but not taken over: the holder may still be running.
    assert_eq!(store.budget("s", at(90)).await.unwrap().reserved.tokens_used, 80, "lapsed");

    // Recovery takes the lapsed lease over: the dead holder's reservation ends.
    let second = store.acquire_lease(session.id, "p2", ttl, at(100)).await.unwrap();
    assert_eq!(store.budget("s", at(101)).await.unwrap().reserved.tokens_used, 0, "taken over");
    let stale = store.reserve(&under("r3", 10, &first), at(101)).await.unwrap_err();
    assert!(matches!(stale, StoreError::Conflict(Conflict::StaleFence { .. })), "{stale:?}");
    assert_not_found(store.release("r3").await);
    store.reserve(&under("r4", 90, &second), at(102)).await.unwrap();
    assert_eq!(store.budget("s", at(103)).await.unwrap().reserved.tokens_used, 90);
    // The ended reservation still settles what its step used.
    store.settle("r1", &tokens(5)).await.unwrap();
    let ledger = store.budget("s", at(104)).await.unwrap();
    assert_eq!((ledger.reserved.tokens_used, ledger.used.tokens_used), (90, 5));

    // Given back with a reservation unsettled: the reservation ends too.
    store.release_lease(session.id, second.token).await.unwrap();
    let ledger = store.budget("s", at(105)).await.unwrap();
    assert_eq!((ledger.reserved.tokens_used, ledger.used.tokens_used), (0, 5));
    let third = store.acquire_lease(session.id, "p3", ttl, at(106)).await.unwrap();
    store.reserve(&under("r5", 95, &third), at(106)).await.unwrap();
}

/// Deleting a session deletes the ledgers it owns and the reservations on them (whole, even
/// those also on a free scope), and nothing else; a ledger cannot belong to a session that
/// does not exist.
pub async fn deleting_a_session_deletes_its_budget_ledgers_and_their_reservations(store: Arc<dyn Store>) {
    let (first, second) = (new_session(&*store).await, new_session(&*store).await);
    let limit = BudgetLimit { max_tokens: Some(1000), ..BudgetLimit::default() };
    store.create_budget("m1", &limit, Some(first.id)).await.unwrap();
    store.create_budget("i1", &limit, Some(first.id)).await.unwrap();
    store.create_budget("m2", &limit, Some(second.id)).await.unwrap();
    store.create_budget("free", &limit, None).await.unwrap();
    assert_not_found(store.create_budget("x", &limit, Some(SessionId::new())).await);
    // The session is checked first, even for a scope that exists.
    assert_not_found(store.create_budget("m1", &limit, Some(SessionId::new())).await);
    assert_not_found(store.budget("x", at(0)).await);
    store.reserve(&reservation("r1", &["i1", "m1"], tokens(10), at(100)), at(0)).await.unwrap();
    store.reserve(&reservation("r2", &["m2"], tokens(20), at(100)), at(0)).await.unwrap();
    store.reserve(&reservation("r3", &["free"], tokens(30), at(100)), at(0)).await.unwrap();
    // On an owned scope and a free one: deleted whole, freeing both.
    store.reserve(&reservation("r4", &["i1", "free"], tokens(40), at(100)), at(0)).await.unwrap();
    assert_eq!(store.budget("free", at(1)).await.unwrap().reserved.tokens_used, 70);

    store.delete_session(first.id).await.unwrap();
    assert_not_found(store.budget("m1", at(1)).await);
    assert_not_found(store.budget("i1", at(1)).await);
    assert_not_found(store.settle("r1", &tokens(10)).await);
    assert_not_found(store.release("r4").await);
    assert_eq!(store.budget("m2", at(1)).await.unwrap().reserved.tokens_used, 20);
    assert_eq!(store.budget("free", at(1)).await.unwrap().reserved.tokens_used, 30);
    store.settle("r2", &tokens(15)).await.unwrap();
    assert_eq!(store.budget("m2", at(2)).await.unwrap().used.tokens_used, 15);
    // The scope's name is free again.
    store.create_budget("m1", &limit, Some(second.id)).await.unwrap();
}

/// Scopes and reservation ids may be any strings, also ones that sort after every other:
/// their reservations count, and they are deleted with their session.
pub async fn budget_scopes_and_reservation_ids_may_be_any_string(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let last = "\u{10FFFF}\u{10FFFF}last";
    store
        .create_budget(
            last,
            &BudgetLimit { max_tokens: Some(100), ..BudgetLimit::default() },
            Some(session.id),
        )
        .await
        .unwrap();
    store.reserve(&reservation(last, &[last], tokens(80), at(100)), at(0)).await.unwrap();
    assert_eq!(store.budget(last, at(1)).await.unwrap().reserved.tokens_used, 80);
    let over = store.reserve(&reservation("more", &[last], tokens(30), at(100)), at(1)).await.unwrap_err();
    assert!(matches!(over, StoreError::Conflict(Conflict::BudgetExceeded { .. })), "{over:?}");
    store.delete_session(session.id).await.unwrap();
    assert_not_found(store.budget(last, at(2)).await);
    assert_not_found(store.release(last).await);
}

/// Unknown scopes and reservations are not found; ids are unique.
pub async fn budget_unknown_scopes_and_reservations_and_duplicates(store: Arc<dyn Store>) {
    assert_not_found(store.budget("nope", at(0)).await);
    store.create_budget("s", &BudgetLimit::default(), None).await.unwrap();
    let error = store.create_budget("s", &BudgetLimit::default(), None).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::AlreadyExists { .. })), "{error:?}");
    assert_not_found(store.reserve(&reservation("r", &["s", "nope"], tokens(1), at(9)), at(0)).await);
    assert_eq!(store.budget("s", at(0)).await.unwrap().reserved.tokens_used, 0);
    // A scope named twice would be held and settled twice on one ledger.
    assert_invalid(store.reserve(&reservation("r", &["s", "s"], tokens(1), at(9)), at(0)).await);
    assert_eq!(store.budget("s", at(0)).await.unwrap().reserved.tokens_used, 0);
    store.reserve(&reservation("r", &["s"], tokens(1), at(9)), at(0)).await.unwrap();
    let error = store.reserve(&reservation("r", &["s"], tokens(1), at(9)), at(0)).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::AlreadyExists { .. })), "{error:?}");
    // A retried reservation whose id is held is a conflict also where its second hold
    // would not fit: the first does not count against itself.
    store
        .create_budget("tight", &BudgetLimit { max_tokens: Some(10), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    store.reserve(&reservation("t", &["tight"], tokens(6), at(9)), at(0)).await.unwrap();
    let error = store.reserve(&reservation("t", &["tight"], tokens(6), at(9)), at(0)).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::AlreadyExists { .. })), "{error:?}");
    assert_not_found(store.settle("nope", &tokens(1)).await);
    assert_not_found(store.release("nope").await);
    // Costs at the edge of the number range saturate: the ledger stays readable.
    store.create_budget("costly", &BudgetLimit::default(), None).await.unwrap();
    let huge = BudgetUsage { cost_used_usd: f64::MAX, ..BudgetUsage::default() };
    for id in ["c1", "c2"] {
        store.reserve(&reservation(id, &["costly"], BudgetUsage::default(), at(9)), at(0)).await.unwrap();
        store.settle(id, &huge).await.unwrap();
    }
    let ledger = store.budget("costly", at(1)).await.unwrap();
    assert!(ledger.used.cost_used_usd.is_finite(), "{:?}", ledger.used);
}

/// Many concurrent reservations never hold more than the limit.
pub async fn concurrent_reservations_never_pass_the_limit(store: Arc<dyn Store>) {
    store
        .create_budget("m", &BudgetLimit { max_tokens: Some(1000), ..BudgetLimit::default() }, None)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for worker in 0..10 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut granted = 0u64;
            for attempt in 0..20 {
                let id = format!("w{worker}-{attempt}");
                if store.reserve(&reservation(&id, &["m"], tokens(30), at(1000)), at(0)).await.is_ok() {
                    granted += 30;
                }
            }
            granted
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert_eq!(total, 990, "exactly 33 reservations of 30 fit in 1000");
    assert_eq!(store.budget("m", at(0)).await.unwrap().reserved.tokens_used, 990);
}

// ---------------------------------------------------------------------------------------
// Leases.
// ---------------------------------------------------------------------------------------

/// A live lease is exclusive.
pub async fn lease_is_exclusive_while_live(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let lease = store.acquire_lease(session.id, "p1", Duration::from_secs(30), at(0)).await.unwrap();
    assert_eq!(lease.owner, "p1");
    assert_eq!(lease.expires_at, at(30));
    for owner in ["p2", "p1"] {
        let error =
            store.acquire_lease(session.id, owner, Duration::from_secs(30), at(10)).await.unwrap_err();
        assert!(matches!(error, StoreError::Conflict(Conflict::LeaseHeld { .. })), "{error:?}");
    }
    assert_eq!(store.lease(session.id).await.unwrap(), Some(lease));
}

/// Every grant's token is greater than every earlier one, across sessions.
pub async fn lease_tokens_increase_with_every_grant(store: Arc<dyn Store>) {
    let first = new_session(&*store).await;
    let second = new_session(&*store).await;
    let mut tokens = Vec::new();
    for step in 0..3 {
        let a = store.acquire_lease(first.id, "p", Duration::from_secs(1), at(step * 10)).await.unwrap();
        let b = store.acquire_lease(second.id, "q", Duration::from_secs(1), at(step * 10)).await.unwrap();
        tokens.extend([a.token, b.token]);
        store.release_lease(first.id, a.token).await.unwrap();
    }
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "{tokens:?}");
}

/// After expiry another owner takes the lease over, and the old holder's writes are fenced out.
pub async fn lease_takeover_after_expiry_fences_out_the_old_holder(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let old = store.acquire_lease(session.id, "dead", Duration::from_secs(5), at(0)).await.unwrap();
    store.append_events(run.id, &[event(&run, 1)], Some(old.fence())).await.unwrap();
    let new = store.acquire_lease(session.id, "alive", Duration::from_secs(5), at(6)).await.unwrap();
    assert!(new.token > old.token);
    let stale = Some(old.fence());
    let is_stale = |result: Result<(), StoreError>| {
        assert!(
            matches!(result, Err(StoreError::Conflict(Conflict::StaleFence { .. }))),
            "expected StaleFence, got {result:?}"
        );
    };
    is_stale(store.append_events(run.id, &[event(&run, 2)], stale).await.map(|_| ()));
    is_stale(store.put_run(&run, stale).await);
    is_stale(store.append_messages(run.id, &[Arc::new(Message::user("x"))], stale).await);
    is_stale(store.journal_start(&journal_entry(run.id, "c", "h"), stale).await.map(|_| ()));
    is_stale(store.raise_high_water(run.id, 9, stale).await.map(|_| ()));
    is_stale(store.renew_lease(session.id, old.token, Duration::from_secs(5), at(7)).await.map(|_| ()));
    store.append_events(run.id, &[event(&run, 2)], Some(new.fence())).await.unwrap();
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [1, 2]);
}

/// Renewing and releasing need the current token; an expired lease not yet taken over can
/// still be renewed by its holder.
pub async fn lease_renew_and_release_need_the_current_token(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let lease = store.acquire_lease(session.id, "p", Duration::from_secs(5), at(0)).await.unwrap();
    let renewed = store.renew_lease(session.id, lease.token, Duration::from_secs(5), at(8)).await.unwrap();
    assert_eq!((renewed.token, renewed.expires_at), (lease.token, at(13)));
    let error = store.release_lease(session.id, lease.token + 1000).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleFence { .. })), "{error:?}");
    store.release_lease(session.id, lease.token).await.unwrap();
    assert_eq!(store.lease(session.id).await.unwrap(), None);
    let error = store.renew_lease(session.id, lease.token, Duration::from_secs(5), at(9)).await.unwrap_err();
    assert!(matches!(error, StoreError::Conflict(Conflict::StaleFence { current: None, .. })), "{error:?}");
    let run = new_run(&*store, session.id).await;
    let after_release = store.put_run(&run, Some(Fence { session_id: session.id, token: lease.token })).await;
    assert!(
        matches!(after_release, Err(StoreError::Conflict(Conflict::StaleFence { .. }))),
        "{after_release:?}"
    );
    store.acquire_lease(session.id, "q", Duration::from_secs(5), at(9)).await.unwrap();
}

/// Leases need a session.
pub async fn lease_of_an_unknown_session_is_not_found(store: Arc<dyn Store>) {
    assert_not_found(store.acquire_lease(SessionId::new(), "p", Duration::from_secs(1), at(0)).await);
    assert_eq!(store.lease(SessionId::new()).await.unwrap(), None);
}

/// Leases are listed by session id, expired ones too, a page after a cursor; a released
/// lease and the lease of a deleted session are gone from the list.
pub async fn leases_are_listed_by_session_in_pages(store: Arc<dyn Store>) {
    assert_eq!(store.list_leases(None, 10).await.unwrap(), []);
    let mut sessions = Vec::new();
    for _ in 0..6 {
        sessions.push(new_session(&*store).await.id);
    }
    let mut leases = Vec::new();
    for (index, session) in sessions.iter().enumerate() {
        // Ten-second leases granted a second apart, read at 100 s: all of them expired.
        let seconds = i64::try_from(index).unwrap();
        leases.push(store.acquire_lease(*session, "p", Duration::from_secs(10), at(seconds)).await.unwrap());
    }
    store.release_lease(sessions[1], leases[1].token).await.unwrap();
    store.delete_session(sessions[4]).await.unwrap();
    let mut expected: Vec<Lease> = leases
        .into_iter()
        .enumerate()
        .filter(|(index, _)| ![1, 4].contains(index))
        .map(|(_, lease)| lease)
        .collect();
    expected.sort_by_key(|lease| lease.session_id);
    assert!(expected.iter().all(|lease| lease.is_expired(at(100))));
    assert_eq!(store.list_leases(None, 10).await.unwrap(), expected);
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = store.list_leases(after, 3).await.unwrap();
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        after = Some(last.session_id);
        paged.extend(page);
    }
    assert_eq!(paged, expected);
    assert_eq!(store.list_leases(Some(expected[1].session_id), 1).await.unwrap(), &expected[2..3]);
    // A cursor need not be a leased session: the released one sits where it sat.
    let released = sessions[1];
    let following: Vec<Lease> =
        expected.iter().filter(|lease| lease.session_id > released).cloned().collect();
    assert_eq!(store.list_leases(Some(released), 10).await.unwrap(), following);
    assert_eq!(store.list_leases(None, 0).await.unwrap(), []);
}

/// A fence names the session it guards.
pub async fn fence_of_another_session_is_invalid_input(store: Arc<dyn Store>) {
    let first = new_session(&*store).await;
    let second = new_session(&*store).await;
    let run = new_run(&*store, first.id).await;
    let lease = store.acquire_lease(second.id, "p", Duration::from_secs(5), at(0)).await.unwrap();
    assert_invalid(store.append_events(run.id, &[event(&run, 1)], Some(lease.fence())).await);
}

/// A session update made for a turn holds only while the turn's lease does: after a
/// takeover (or with no lease at all) it is refused and changes nothing, and the update
/// under the current token stands.
pub async fn session_update_with_a_stale_fence_is_refused_and_changes_nothing(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let other = new_session(&*store).await;
    let keyed = |value: serde_json::Value| SessionUpdate {
        state: Some(serde_json::Map::from_iter([("tasks".to_owned(), value)])),
        ..SessionUpdate::default()
    };
    let old = store.acquire_lease(session.id, "p1", Duration::from_secs(5), at(0)).await.unwrap();
    let held = SessionUpdate { fence: Some(old.fence()), ..keyed(json!(["first"])) };
    assert_eq!(
        store.update_session(session.id, &held).await.unwrap().state.get("tasks"),
        Some(&json!(["first"]))
    );
    // Recovery takes the expired lease over: the first holder's updates are refused.
    let new = store.acquire_lease(session.id, "p2", Duration::from_secs(5), at(10)).await.unwrap();
    let stale =
        SessionUpdate { fence: Some(old.fence()), title: Some("stale".into()), ..keyed(json!(["stale"])) };
    let refused = store.update_session(session.id, &stale).await;
    assert!(matches!(refused, Err(StoreError::Conflict(Conflict::StaleFence { .. }))), "{refused:?}");
    let stored = store.get_session(session.id).await.unwrap();
    assert_eq!(stored.state.get("tasks"), Some(&json!(["first"])));
    assert_eq!(stored.title, session.title);
    let current = SessionUpdate { fence: Some(new.fence()), ..keyed(json!(["second"])) };
    assert_eq!(
        store.update_session(session.id, &current).await.unwrap().state.get("tasks"),
        Some(&json!(["second"]))
    );
    // A released lease fences out its holder too; an update without a fence still goes through.
    store.release_lease(session.id, new.token).await.unwrap();
    let released = SessionUpdate { fence: Some(new.fence()), ..keyed(json!(["late"])) };
    let refused = store.update_session(session.id, &released).await;
    assert!(matches!(refused, Err(StoreError::Conflict(Conflict::StaleFence { .. }))), "{refused:?}");
    assert_eq!(
        store.update_session(session.id, &keyed(json!([]))).await.unwrap().state.get("tasks"),
        Some(&json!([]))
    );
    // A fence guards its own session only, and an unknown session is still not found.
    let lease = store.acquire_lease(other.id, "p3", Duration::from_secs(5), at(20)).await.unwrap();
    assert_invalid(
        store
            .update_session(session.id, &SessionUpdate { fence: Some(lease.fence()), ..keyed(json!(1)) })
            .await,
    );
    assert_not_found(
        store
            .update_session(
                SessionId::new(),
                &SessionUpdate { fence: Some(lease.fence()), ..keyed(json!(1)) },
            )
            .await,
    );
}

/// A step's journal entries are written as `journal_start` and `journal_complete` write
/// them: a new call is stored as given, a call journaled with the same arguments gains a
/// result it lacks and otherwise keeps its entry, other arguments or another result refuse
/// the whole step, and an entry of another turn is invalid.
pub async fn turn_step_journals_calls_as_the_journal_does(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let other = new_run(&*store, session.id).await;
    store.journal_start(&journal_entry(run.id, "done", "h"), None).await.unwrap();
    let result = ToolResult { content: "42".into(), is_error: false };
    let completed = store.journal_complete(run.id, "done", &result, at(3), None).await.unwrap();
    let fresh = journal_entry(run.id, "fresh", "h");
    let step = TurnStep {
        events: vec![Arc::new(event(&run, 1))],
        // The same call twice in one step is journaled once.
        journal: vec![journal_entry(run.id, "done", "h"), fresh.clone(), fresh.clone()],
        ..TurnStep::default()
    };
    store.write_step(run.id, &step, None).await.unwrap();
    assert_eq!(store.journal(run.id).await.unwrap(), [completed.clone(), fresh.clone()]);
    // A result completes a started call; a new call may come completed; an entry without
    // a result, or with the same result, leaves a completed call as it is.
    let answered = JournalEntry { result: Some(result.clone()), completed_at: Some(at(5)), ..fresh.clone() };
    let at_once = JournalEntry {
        result: Some(result.clone()),
        completed_at: Some(at(6)),
        ..journal_entry(run.id, "quick", "h")
    };
    let step = TurnStep {
        journal: vec![answered.clone(), at_once.clone(), fresh.clone(), completed.clone()],
        ..TurnStep::default()
    };
    store.write_step(run.id, &step, None).await.unwrap();
    let journal = vec![completed, answered, at_once];
    assert_eq!(store.journal(run.id).await.unwrap(), journal);
    let other_result = ToolResult { content: "41".into(), is_error: false };
    let refused = [
        vec![journal_entry(run.id, "new", "h"), journal_entry(run.id, "fresh", "other")],
        vec![journal_entry(run.id, "new", "h"), journal_entry(run.id, "new", "other")],
        vec![
            journal_entry(run.id, "new", "h"),
            JournalEntry {
                result: Some(other_result),
                completed_at: Some(at(7)),
                ..journal_entry(run.id, "done", "h")
            },
        ],
    ];
    for entries in refused {
        let step =
            TurnStep { events: vec![Arc::new(event(&run, 2))], journal: entries, ..TurnStep::default() };
        let error = store.write_step(run.id, &step, None).await.unwrap_err();
        assert!(
            matches!(
                error,
                StoreError::Conflict(Conflict::JournalMismatch { .. } | Conflict::AlreadyCompleted { .. })
            ),
            "{error:?}"
        );
    }
    let foreign = TurnStep { journal: vec![journal_entry(other.id, "new", "h")], ..TurnStep::default() };
    assert_invalid(store.write_step(run.id, &foreign, None).await);
    // Nothing of the refused steps is stored.
    assert_eq!(store.journal(run.id).await.unwrap(), journal);
    assert!(store.journal(other.id).await.unwrap().is_empty());
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [1]);
    // The refused steps' events were undone with them: their seq is free.
    store.append_events(run.id, &[event(&run, 2)], None).await.unwrap();
    assert_eq!(seqs(&store.turn_events(run.id, Order::Asc, None, 10).await.unwrap()), [1, 2]);
}

/// A record nested as deeply as JSON records are read back is stored and read back; one
/// nested deeper is refused with a clear error, and nothing changes.
pub async fn records_nested_deeper_than_they_are_read_are_refused(store: Arc<dyn Store>) {
    // The record's object and its metadata object, then nested arrays.
    let nested = |arrays: usize| {
        let mut session = session_named("deep");
        let value = (0..arrays).fold(json!(null), |inner, _| json!([inner]));
        session.metadata.insert("deep".into(), value);
        session
    };
    let deepest = nested(crate::rules::MAX_RECORD_NESTING - 2);
    store.create_session(&deepest).await.unwrap();
    assert_eq!(store.get_session(deepest.id).await.unwrap(), deepest);
    let deeper = nested(crate::rules::MAX_RECORD_NESTING - 1);
    let error = store.create_session(&deeper).await.unwrap_err();
    assert!(
        matches!(error, StoreError::InvalidInput(ref message) if message.contains("levels deep")),
        "{error:?}"
    );
    assert_not_found(store.get_session(deeper.id).await);
    // Brackets inside a string do not nest.
    let run = new_run(&*store, deepest.id).await;
    let brackets = Arc::new(Message::user("[".repeat(500)));
    store.append_messages(run.id, std::slice::from_ref(&brackets), None).await.unwrap();
}

/// Records larger than the limit, and events nested too deeply to be read back, are refused
/// with a clear error, and nothing changes.
pub async fn oversized_records_are_refused_and_change_nothing(store: Arc<dyn Store>) {
    let session = new_session(&*store).await;
    let run = new_run(&*store, session.id).await;
    let huge = "x".repeat(MAX_RECORD_BYTES + 1);
    let mut big_event = event(&run, 1);
    big_event.payload = EventPayload::ToolResponse {
        tool_call_id: "c".into(),
        name: "t".into(),
        arguments: "{}".into(),
        content: huge.clone(),
        is_error: false,
    };
    let error = store.append_events(run.id, &[event(&run, 1), big_event], None).await.unwrap_err();
    assert!(matches!(error, StoreError::TooLarge { what: "event", .. }), "{error:?}");
    assert!(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().is_empty());
    // Nested deeper than a stored event could be read back.
    let mut deep_event = event(&run, 1);
    let deep = (0..500).fold(json!(null), |inner, _| json!([inner]));
    deep_event.payload = EventPayload::ToolCallActivity { tool_call_id: "c".into(), data: deep };
    let error = store.append_events(run.id, &[event(&run, 1), deep_event], None).await.unwrap_err();
    assert!(
        matches!(error, StoreError::InvalidInput(ref message) if message.contains("levels deep")),
        "{error:?}"
    );
    assert!(store.turn_events(run.id, Order::Asc, None, 10).await.unwrap().is_empty());
    let mut big_session = session_named("big");
    big_session.title = Some(huge.clone());
    assert!(matches!(store.create_session(&big_session).await, Err(StoreError::TooLarge { .. })));
    assert_not_found(store.get_session(big_session.id).await);
    assert!(matches!(
        store.append_messages(run.id, &[Arc::new(Message::user(huge))], None).await,
        Err(StoreError::TooLarge { .. })
    ));
    assert!(store.history(session.id, &HistoryQuery::default()).await.unwrap().is_empty());
}
