//! The storage traits over SQLite. Records are stored as JSON bodies (events in the binary
//! form of `rules::encode_event`) next to the columns that index them; records are encoded
//! before they reach the writer thread, so the single writer spends its time on SQL.

use std::sync::Arc;
use std::time::Duration;

use agentry_events::EventEnvelope;
use agentry_memory::handoff;
use agentry_memory::{
    BudgetStore, Conflict, EventStore, FeedQuery, HistoryQuery, JournalStore, LeaseStore, MessageStore,
    Order, Page, PageRequest, ParentFilter, RunQuery, RunStore, SessionQuery, SessionStore, SessionUpdate,
    StoreError, StoreResult, StoredEvent, TurnFacts, TurnStart, TurnStep, UserStore, decode_key,
    decode_token, rules,
};
use agentry_types::{
    BudgetLedger, BudgetLimit, BudgetReservation, BudgetUsage, Fence, HistoryMessage, JournalEntry, Lease,
    Message, RunRecord, SessionId, SessionRecord, Timestamp, ToolResult, TurnId, UserMemory, UserProfile,
};
use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::error::sqlite;
use crate::{SqliteStore, Tx};

fn session_exists(connection: &Connection, id: &str) -> StoreResult<bool> {
    connection
        .prepare_cached("SELECT 1 FROM sessions WHERE id = ?1")
        .map_err(sqlite)?
        .exists([id])
        .map_err(sqlite)
}

fn session_row(connection: &Connection, id: &str) -> StoreResult<Option<SessionRecord>> {
    let row: Option<(Vec<u8>, Option<i64>)> = connection
        .prepare_cached("SELECT body, active_us FROM sessions WHERE id = ?1")
        .map_err(sqlite)?
        .query_row([id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .map_err(sqlite)?;
    row.map(|(body, active)| decode_session(&body, active)).transpose()
}

/// A session's record with the latest activity kept beside it (`active_us`).
fn decode_session(body: &[u8], active: Option<i64>) -> StoreResult<SessionRecord> {
    Ok(rules::with_activity(rules::decode("session", body)?, active.map(Timestamp::from_unix_micros)))
}

/// Moves a session's latest activity forward to a turn's record as written.
fn touch_session(connection: &Connection, session: &str, run: &rules::EncodedRun) -> StoreResult<()> {
    if let Some(activity) = run.activity() {
        connection
            .prepare_cached(
                "UPDATE sessions SET active_us = ?2 WHERE id = ?1 AND (active_us IS NULL OR active_us < ?2)",
            )
            .map_err(sqlite)?
            .execute(params![session, activity.unix_micros()])
            .map_err(sqlite)?;
    }
    Ok(())
}

fn require_run(connection: &Connection, id: TurnId) -> StoreResult<RunRecord> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("SELECT body FROM runs WHERE id = ?1")
        .map_err(sqlite)?
        .query_row([id.to_string()], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    rules::decode("run", &body.ok_or_else(|| StoreError::not_found("run", id))?)
}

fn lease_row(connection: &Connection, session: &str) -> StoreResult<Option<Lease>> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("SELECT body FROM leases WHERE session_id = ?1")
        .map_err(sqlite)?
        .query_row([session], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    body.map(|body| rules::decode("lease", &body)).transpose()
}

fn check_fence(connection: &Connection, session: SessionId, fence: Option<Fence>) -> StoreResult<()> {
    if fence.is_none() {
        return Ok(());
    }
    rules::check_fence(session, lease_row(connection, &session.to_string())?.as_ref(), fence)
}

fn as_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn as_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

#[async_trait]
impl SessionStore for SqliteStore {
    async fn create_session(&self, session: &SessionRecord) -> StoreResult<()> {
        let body = rules::encode("session", session)?;
        let (id, created) = (session.id.to_string(), session.created_at.unix_micros());
        let owner = session.owner.subject_id.clone();
        self.write(move |connection| {
            let inserted = connection
                .prepare_cached(
                    "INSERT OR IGNORE INTO sessions (id, created_us, owner, body) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(sqlite)?
                .execute(params![id, created, owner, body])
                .map_err(sqlite)?;
            if inserted == 0 {
                return Err(Conflict::AlreadyExists { kind: "session", id }.into());
            }
            Ok(())
        })
        .await
    }

    async fn get_session(&self, id: SessionId) -> StoreResult<SessionRecord> {
        self.read_sized(true, move |connection| {
            session_row(connection, &id.to_string())?.ok_or_else(|| StoreError::not_found("session", id))
        })
        .await
    }

    async fn update_session(&self, id: SessionId, update: &SessionUpdate) -> StoreResult<SessionRecord> {
        let update = update.clone();
        self.write(move |connection| {
            let key = id.to_string();
            let mut session =
                session_row(connection, &key)?.ok_or_else(|| StoreError::not_found("session", id))?;
            check_fence(connection, id, update.fence)?;
            update.apply(&mut session, Timestamp::now());
            let body = rules::encode("session", &session)?;
            connection
                .prepare_cached("UPDATE sessions SET body = ?2 WHERE id = ?1")
                .map_err(sqlite)?
                .execute(params![key, body])
                .map_err(sqlite)?;
            Ok(session)
        })
        .await
    }

    async fn delete_session(&self, id: SessionId) -> StoreResult<()> {
        self.write(move |connection| {
            connection.turns.forget_all();
            let key = id.to_string();
            let deleted = connection.execute("DELETE FROM sessions WHERE id = ?1", [&key]).map_err(sqlite)?;
            if deleted == 0 {
                return Err(StoreError::not_found("session", id));
            }
            for sql in [
                "DELETE FROM messages WHERE run_id IN (SELECT id FROM runs WHERE session_id = ?1)",
                "DELETE FROM journal WHERE turn_id IN (SELECT id FROM runs WHERE session_id = ?1)",
                "DELETE FROM events WHERE session_id = ?1",
                "DELETE FROM runs WHERE session_id = ?1",
                "DELETE FROM leases WHERE session_id = ?1",
                // The session's ledgers, and every reservation on one of them with all its
                // scope links (each subquery is evaluated before its delete starts).
                "DELETE FROM reservations WHERE id IN (SELECT reservation_id FROM reservation_scopes
                 WHERE scope IN (SELECT scope FROM budgets WHERE session_id = ?1))",
                "DELETE FROM reservation_scopes WHERE reservation_id IN (SELECT reservation_id FROM reservation_scopes
                 WHERE scope IN (SELECT scope FROM budgets WHERE session_id = ?1))",
                "DELETE FROM budgets WHERE session_id = ?1",
            ] {
                connection.prepare_cached(sql).map_err(sqlite)?.execute([&key]).map_err(sqlite)?;
            }
            Ok(())
        })
        .await
    }

    async fn list_sessions(
        &self,
        query: &SessionQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<SessionRecord>> {
        let limit = page.effective_limit();
        // Once per call: the kind serializes and hashes the query.
        let kind = query.page_kind();
        let after = match &page.token {
            Some(token) => {
                let key = decode_token(&kind, token)?;
                let invalid = || StoreError::InvalidInput(format!("invalid page token {token:?}"));
                let (micros, id) = key.split_once(':').ok_or_else(invalid)?;
                let micros: i64 = micros.parse().map_err(|_| invalid())?;
                let id: SessionId = id.parse().map_err(|_| invalid())?;
                Some((micros, id.to_string()))
            }
            None => None,
        };
        let query = query.clone();
        self.read(move |connection| {
            // An owner's sessions through their own index. The creation bounds and the
            // cursor bound the range of the index read.
            let (index, owned) = match query.owner {
                Some(_) => ("INDEXED BY sessions_by_owner", "owner = ?3 AND"),
                None => ("", ""),
            };
            let (beyond, direction) = if query.oldest_first { (">", "ASC") } else { ("<", "DESC") };
            let cursor = match after {
                Some(_) => format!("AND (created_us, id) {beyond} (?4, ?5)"),
                None => String::new(),
            };
            let sql = format!(
                "SELECT body, active_us FROM sessions {index} WHERE {owned} created_us BETWEEN ?1 AND ?2 {cursor}
                 ORDER BY created_us {direction}, id {direction}"
            );
            let mut statement = connection.prepare_cached(&sql).map_err(sqlite)?;
            let from = query.created_from.map_or(i64::MIN, Timestamp::unix_micros);
            let until = query.created_until.map_or(i64::MAX, Timestamp::unix_micros);
            // ?3 is the owner and ?4, ?5 the cursor; SQLite counts parameters up to the
            // highest number used, so with a cursor and no owner ?3 is bound and unused.
            let owner = query.owner.as_deref().unwrap_or_default();
            let mut rows = match (&after, &query.owner) {
                (Some((micros, id)), _) => statement.query(params![from, until, owner, micros, id]),
                (None, Some(owner)) => statement.query(params![from, until, owner]),
                (None, None) => statement.query(params![from, until]),
            }
            .map_err(sqlite)?;
            let mut items = Vec::new();
            while let Some(row) = rows.next().map_err(sqlite)? {
                let body: Vec<u8> = row.get(0).map_err(sqlite)?;
                let session = decode_session(&body, row.get(1).map_err(sqlite)?)?;
                if query.matches(&session) {
                    items.push(session);
                    if items.len() > limit {
                        break;
                    }
                }
            }
            Ok(Page::from_lookahead(items, limit, &kind, |s| {
                format!("{}:{}", s.created_at.unix_micros(), s.id)
            }))
        })
        .await
    }
}

#[async_trait]
impl RunStore for SqliteStore {
    async fn put_run(&self, run: &RunRecord, fence: Option<Fence>) -> StoreResult<()> {
        let id = run.id;
        let run = rules::EncodedRun::of(run)?;
        self.write(move |connection| put_run_in(connection, id, &run, fence)).await
    }

    async fn get_run(&self, id: TurnId) -> StoreResult<RunRecord> {
        self.read_sized(true, move |connection| require_run(connection, id)).await
    }

    async fn list_runs(
        &self,
        session: SessionId,
        query: &RunQuery,
        page: &PageRequest,
    ) -> StoreResult<Page<RunRecord>> {
        let limit = page.effective_limit();
        let kind = agentry_memory::runs_kind(session, query.order);
        let after: Option<i64> = decode_key(&kind, page)?;
        let query = query.clone();
        self.read_sized(handoff::small_run_page(&query, limit), move |connection| {
            let key = session.to_string();
            if !session_exists(connection, &key)? {
                return Err(StoreError::not_found("session", session));
            }
            // Members through their parent's index, turns through the session's index of
            // turns (the parent filter is then met already), every run through the session's.
            let sql = match (&query.parent, query.order) {
                (ParentFilter::Of(_), Order::Asc) => "SELECT run_order, body FROM runs INDEXED BY runs_by_parent WHERE parent_id = ?3 AND session_id = ?1 AND run_order > ?2 ORDER BY run_order ASC",
                (ParentFilter::Of(_), Order::Desc) => "SELECT run_order, body FROM runs INDEXED BY runs_by_parent WHERE parent_id = ?3 AND session_id = ?1 AND run_order < ?2 ORDER BY run_order DESC",
                (ParentFilter::TopLevel, Order::Asc) => "SELECT run_order, body FROM runs INDEXED BY runs_top_level WHERE session_id = ?1 AND parent_id IS NULL AND run_order > ?2 ORDER BY run_order ASC",
                (ParentFilter::TopLevel, Order::Desc) => "SELECT run_order, body FROM runs INDEXED BY runs_top_level WHERE session_id = ?1 AND parent_id IS NULL AND run_order < ?2 ORDER BY run_order DESC",
                (ParentFilter::Any, Order::Asc) => "SELECT run_order, body FROM runs WHERE session_id = ?1 AND run_order > ?2 ORDER BY run_order ASC",
                (ParentFilter::Any, Order::Desc) => "SELECT run_order, body FROM runs WHERE session_id = ?1 AND run_order < ?2 ORDER BY run_order DESC",
            };
            let bound = after.unwrap_or(match query.order {
                Order::Asc => i64::MIN,
                Order::Desc => i64::MAX,
            });
            let mut statement = connection.prepare_cached(sql).map_err(sqlite)?;
            let mut rows = match &query.parent {
                ParentFilter::Of(parent) => statement.query(params![key, bound, parent.to_string()]),
                ParentFilter::TopLevel | ParentFilter::Any => statement.query(params![key, bound]),
            }
            .map_err(sqlite)?;
            // The statements select exactly the runs wanted unless the query filters on
            // records: the look-ahead row then tells of a next page undecoded (`None`).
            let decode_all = query.filters_records();
            let mut items: Vec<(i64, Option<RunRecord>)> = Vec::new();
            while let Some(row) = rows.next().map_err(sqlite)? {
                let order: i64 = row.get(0).map_err(sqlite)?;
                if items.len() == limit && !decode_all {
                    items.push((order, None));
                    break;
                }
                let run: RunRecord = rules::decode("run", blob(row, 1)?)?;
                if query.matches(&run) {
                    items.push((order, Some(run)));
                    if items.len() > limit {
                        break;
                    }
                }
            }
            let page = Page::from_lookahead(items, limit, &kind, |(order, _)| order.to_string());
            Ok(Page { items: page.items.into_iter().filter_map(|(_, run)| run).collect(), next_token: page.next_token })
        })
        .await
    }
}

#[async_trait]
impl EventStore for SqliteStore {
    async fn append_events(
        &self,
        turn: TurnId,
        events: &[EventEnvelope],
        fence: Option<Fence>,
    ) -> StoreResult<Vec<u64>> {
        let mut bodies = Vec::with_capacity(events.len());
        for event in events {
            bodies.push(rules::encode_event(event)?);
        }
        let single = events.len() == 1;
        let keys: Vec<rules::EventKey> = events.iter().map(rules::EventKey::of).collect();
        let work = move |tx: &mut Tx<'_>| append_events_in(tx, turn, &keys, &bodies, fence);
        // One event is one insert after every check: no savepoint needed.
        if single { self.write_one_statement(work).await } else { self.write(work).await }
    }

    async fn turn_events(
        &self,
        turn: TurnId,
        order: Order,
        after: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<StoredEvent>> {
        self.read(move |connection| {
            let key = turn.to_string();
            let exists: bool = connection
                .prepare_cached("SELECT 1 FROM runs WHERE id = ?1")
                .map_err(sqlite)?
                .exists([&key])
                .map_err(sqlite)?;
            if !exists {
                return Err(StoreError::not_found("run", turn));
            }
            let (sql, bound) = match order {
                Order::Asc => (
                    "SELECT position, body FROM events WHERE turn_id = ?1 AND seq > ?2 ORDER BY seq ASC LIMIT ?3",
                    after.map_or(-1, as_i64),
                ),
                // Below the cursor; from the top (`MAX_SEQ` included) without one, or with one
                // above every storable seq.
                Order::Desc => match after.filter(|after| *after <= rules::MAX_SEQ) {
                    Some(after) => (
                        "SELECT position, body FROM events WHERE turn_id = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3",
                        as_i64(after),
                    ),
                    None => (
                        "SELECT position, body FROM events WHERE turn_id = ?1 AND seq <= ?2 ORDER BY seq DESC LIMIT ?3",
                        i64::MAX,
                    ),
                },
            };
            collect_events(connection, sql, params![key, bound, as_i64(limit as u64)])
        })
        .await
    }

    async fn feed(&self, query: &FeedQuery, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let query = *query;
        self.read(move |connection| {
            let session = query.session_id.map(|id| id.to_string());
            let limit = as_i64(limit as u64);
            match (query.order, session) {
                (Order::Asc, None) => collect_events(
                    connection,
                    "SELECT position, body FROM events WHERE position > ?1 ORDER BY position ASC LIMIT ?2",
                    params![query.after.map_or(0, as_i64), limit],
                ),
                (Order::Desc, None) => collect_events(
                    connection,
                    "SELECT position, body FROM events WHERE position < ?1 ORDER BY position DESC LIMIT ?2",
                    params![query.after.map_or(i64::MAX, as_i64), limit],
                ),
                (Order::Asc, Some(session)) => collect_events(
                    connection,
                    "SELECT position, body FROM events WHERE session_id = ?1 AND position > ?2 ORDER BY position ASC LIMIT ?3",
                    params![session, query.after.map_or(0, as_i64), limit],
                ),
                (Order::Desc, Some(session)) => collect_events(
                    connection,
                    "SELECT position, body FROM events WHERE session_id = ?1 AND position < ?2 ORDER BY position DESC LIMIT ?3",
                    params![session, query.after.map_or(i64::MAX, as_i64), limit],
                ),
            }
        })
        .await
    }

    async fn raise_high_water(&self, turn: TurnId, seq: u64, fence: Option<Fence>) -> StoreResult<u64> {
        rules::check_seq(seq)?;
        self.write(move |connection| {
            let key = turn.to_string();
            let RunRow { session, high_water, .. } = run_row(connection, turn, &key)?;
            check_fence(connection, session, fence)?;
            let mark = high_water.max(last_stored_seq(connection, &key)?).max(seq);
            connection
                .prepare_cached("UPDATE runs SET high_water = ?2 WHERE id = ?1")
                .map_err(sqlite)?
                .execute(params![key, as_i64(mark)])
                .map_err(sqlite)?;
            Ok(mark)
        })
        .await
    }

    async fn high_water(&self, turn: TurnId) -> StoreResult<u64> {
        self.read_sized(true, move |connection| {
            let key = turn.to_string();
            let high_water = run_row(connection, turn, &key)?.high_water;
            Ok(high_water.max(last_stored_seq(connection, &key)?))
        })
        .await
    }

    async fn write_step(&self, turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<Vec<u64>> {
        let step = rules::encode_step(turn, step, fence)?;
        self.write(move |tx| write_step_in(tx, turn, &step, fence)).await
    }

    async fn start_turn(
        &self,
        turn: TurnId,
        step: &TurnStep,
        start: &TurnStart,
    ) -> StoreResult<(Lease, Vec<u64>)> {
        let session = rules::check_start_shape(turn, step)?.session_id;
        let step = rules::encode_step(turn, step, None)?;
        let start = start.clone();
        self.write(move |tx| {
            let key = session.to_string();
            let current = lease_row(tx, &key)?;
            let facts = rules::StartFacts {
                session_exists: session_exists(tx, &key)?,
                lease: current.as_ref(),
                last_token: as_u64(last_token(tx)?),
                run_exists: run_exists(tx, turn)?,
            };
            let lease = rules::check_turn_start(turn, session, &start, &facts, || latest_turn(tx, &key))?;
            // The lease is new, so the step needs no fence; a refused part rolls the whole
            // write back.
            let positions = write_step_in(tx, turn, &step, None)?;
            set_last_token(tx, lease.token)?;
            put_lease(tx, &lease)?;
            Ok((lease, positions))
        })
        .await
    }
}

/// [`EventStore::write_step`] inside a write, its step encoded and checked.
fn write_step_in(
    tx: &mut Tx<'_>,
    turn: TurnId,
    step: &rules::EncodedStep,
    fence: Option<Fence>,
) -> StoreResult<Vec<u64>> {
    // The run's existence, session and fence are checked once for the whole step:
    // nothing inside it can change them.
    let key = turn.to_string();
    let (session, stored_parent, created) = match (run_row(tx, turn, &key), &step.run) {
        (Ok(row), _) => (row.session, parse_parent(turn, row.parent)?, false),
        // The turn's first step creates its run (checking its session and the fence).
        (Err(error), Some(run)) if error.is_not_found() => {
            put_run_in(tx, turn, run, fence)?;
            (run.session_id, run.parent_run_id, true)
        }
        (Err(error), _) => return Err(error),
    };
    if let Some(run) = &step.run {
        rules::check_run_session_id(turn, run.session_id, session)?;
        rules::check_run_parent(turn, run.parent_run_id, stored_parent)?;
    }
    check_fence(tx, session, fence)?;
    if let Some(seq) = step.high_water {
        // Reads take the larger of the mark and the last stored seq.
        tx.prepare_cached("UPDATE runs SET high_water = max(high_water, ?2) WHERE id = ?1")
            .map_err(sqlite)?
            .execute(params![key, as_i64(seq)])
            .map_err(sqlite)?;
    }
    if !step.messages.is_empty() {
        insert_messages(tx, &key, &step.messages)?;
    }
    let positions = if step.keys.is_empty() {
        Vec::new()
    } else {
        append_events_in(tx, turn, &step.keys, &step.events, None)?
    };
    if !step.journal.is_empty() {
        let writes = rules::journal_writes(&step.journal, |call| {
            Ok(journal_row(tx, &key, call)?.map(|stored| ((), stored)))
        })?;
        for (stored, entry) in writes {
            write_journal_row(tx, &key, &entry, stored.is_none())?;
        }
    }
    if let Some(run) = step.run.as_ref().filter(|_| !created) {
        update_run_body(tx, &key, &run.body)?;
        touch_session(tx, &session.to_string(), run)?;
    }
    if step.release_lease {
        delete_lease(tx, session)?;
    }
    Ok(positions)
}

/// Whether a run exists.
fn run_exists(connection: &Connection, turn: TurnId) -> StoreResult<bool> {
    match run_row(connection, turn, &turn.to_string()) {
        Ok(_) => Ok(true),
        Err(error) if error.is_not_found() => Ok(false),
        Err(error) => Err(error),
    }
}

/// The session's newest top-level run.
fn latest_turn(connection: &Connection, session: &str) -> StoreResult<Option<TurnId>> {
    let id: Option<String> = connection
        .prepare_cached(
            "SELECT id FROM runs INDEXED BY runs_top_level WHERE session_id = ?1 AND parent_id IS NULL ORDER BY run_order DESC LIMIT 1",
        )
        .map_err(sqlite)?
        .query_row([session], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    id.map(|id| id.parse().map_err(|_| StoreError::Corrupt(format!("a stored run id {id:?} does not parse"))))
        .transpose()
}

/// Removes a session's lease, inside a write.
fn delete_lease(connection: &Connection, session: SessionId) -> StoreResult<()> {
    connection
        .prepare_cached("DELETE FROM leases WHERE session_id = ?1")
        .map_err(sqlite)?
        .execute([session.to_string()])
        .map_err(sqlite)?;
    Ok(())
}

/// Appends encoded events of one turn (see [`EventStore::append_events`]), inside a write.
fn append_events_in(
    tx: &mut Tx<'_>,
    turn: TurnId,
    keys: &[rules::EventKey],
    bodies: &[Vec<u8>],
    fence: Option<Fence>,
) -> StoreResult<Vec<u64>> {
    let turn_key = turn.to_string();
    let facts = match tx.turns.get(turn) {
        Some(facts) => facts,
        None => {
            let session = run_row(tx, turn, &turn_key)?.session;
            TurnFacts { session, last_seq: last_stored_seq(tx, &turn_key)? }
        }
    };
    let session = facts.session;
    // The fence first: a holder that lost the lease learns that, whatever its seqs.
    check_fence(tx, session, fence)?;
    rules::check_event_batch(turn, session, facts.last_seq, keys.iter().copied())?;
    let session_key = session.to_string();
    let connection: &Connection = tx;
    let mut insert = connection
        .prepare_cached("INSERT INTO events (turn_id, session_id, seq, body) VALUES (?1, ?2, ?3, ?4)")
        .map_err(sqlite)?;
    let mut positions = Vec::with_capacity(keys.len());
    for (event, body) in keys.iter().zip(bodies) {
        insert.execute(params![turn_key, session_key, as_i64(event.seq), body]).map_err(sqlite)?;
        positions.push(as_u64(connection.last_insert_rowid()));
    }
    drop(insert);
    let last_seq = keys.last().map_or(facts.last_seq, |event| event.seq);
    tx.turns.remember(turn, TurnFacts { session, last_seq });
    Ok(positions)
}

/// Appends encoded messages after a checked run's last (the changing half of
/// [`MessageStore::append_messages`]).
fn insert_messages(connection: &Connection, key: &str, bodies: &[Vec<u8>]) -> StoreResult<()> {
    let next: i64 = connection
        .prepare_cached("SELECT coalesce(max(idx) + 1, 0) FROM messages WHERE run_id = ?1")
        .map_err(sqlite)?
        .query_row([key], |row| row.get(0))
        .map_err(sqlite)?;
    let mut insert = connection
        .prepare_cached("INSERT INTO messages (run_id, idx, body) VALUES (?1, ?2, ?3)")
        .map_err(sqlite)?;
    for (offset, body) in bodies.iter().enumerate() {
        insert.execute(params![key, next + as_i64(offset as u64), body]).map_err(sqlite)?;
    }
    Ok(())
}

/// Replaces a stored run's record.
fn update_run_body(connection: &Connection, key: &str, body: &[u8]) -> StoreResult<()> {
    connection
        .prepare_cached("UPDATE runs SET body = ?2 WHERE id = ?1")
        .map_err(sqlite)?
        .execute(params![key, body])
        .map_err(sqlite)?;
    Ok(())
}

/// Stores a run's record (see [`RunStore::put_run`]), inside a write.
fn put_run_in(
    connection: &Connection,
    id: TurnId,
    run: &rules::EncodedRun,
    fence: Option<Fence>,
) -> StoreResult<()> {
    let session = run.session_id;
    let session_key = session.to_string();
    if !session_exists(connection, &session_key)? {
        return Err(StoreError::not_found("session", session));
    }
    check_fence(connection, session, fence)?;
    let key = id.to_string();
    let existing: Option<(String, Option<String>)> = connection
        .prepare_cached("SELECT session_id, parent_id FROM runs WHERE id = ?1")
        .map_err(sqlite)?
        .query_row([&key], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
        .map_err(sqlite)?;
    match existing {
        Some((stored, _)) if stored != session_key => {
            Err(StoreError::InvalidInput(format!("run {id} belongs to session {stored}, not {session_key}")))
        }
        Some((_, parent)) => {
            rules::check_run_parent(id, run.parent_run_id, parse_parent(id, parent)?)?;
            update_run_body(connection, &key, &run.body)?;
            touch_session(connection, &session_key, run)
        }
        None => {
            connection
                .prepare_cached("INSERT INTO runs (id, session_id, parent_id, body) VALUES (?1, ?2, ?3, ?4)")
                .map_err(sqlite)?
                .execute(params![
                    key,
                    session_key,
                    run.parent_run_id.map(|parent| parent.to_string()),
                    run.body
                ])
                .map_err(sqlite)?;
            touch_session(connection, &session_key, run)
        }
    }
}

/// A stored run's parent, from its `parent_id` column.
fn parse_parent(run: TurnId, parent: Option<String>) -> StoreResult<Option<TurnId>> {
    parent
        .map(|parent| {
            parent
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("run {run} has an invalid parent id {parent:?}")))
        })
        .transpose()
}

/// What a write needs of a stored run, read without decoding its record.
struct RunRow {
    session: SessionId,
    /// The explicitly raised high-water mark.
    high_water: u64,
    /// The parent's id as stored (`None` for a turn; see [`parse_parent`]).
    parent: Option<String>,
}

/// A stored run's [`RunRow`]. `NotFound` when the run does not exist.
fn run_row(connection: &Connection, turn: TurnId, key: &str) -> StoreResult<RunRow> {
    let (session, high_water, parent): (String, i64, Option<String>) = connection
        .prepare_cached("SELECT session_id, high_water, parent_id FROM runs WHERE id = ?1")
        .map_err(sqlite)?
        .query_row([key], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()
        .map_err(sqlite)?
        .ok_or_else(|| StoreError::not_found("run", turn))?;
    let session =
        session.parse().map_err(|_| StoreError::Corrupt(format!("run {turn} has an invalid session id")))?;
    Ok(RunRow { session, high_water: as_u64(high_water), parent })
}

/// The last stored seq of a turn (0 when none), from the events index.
fn last_stored_seq(connection: &Connection, turn_key: &str) -> StoreResult<u64> {
    let last: i64 = connection
        .prepare_cached("SELECT coalesce(max(seq), 0) FROM events WHERE turn_id = ?1")
        .map_err(sqlite)?
        .query_row([turn_key], |row| row.get(0))
        .map_err(sqlite)?;
    Ok(as_u64(last))
}

fn collect_events(
    connection: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> StoreResult<Vec<StoredEvent>> {
    let mut statement = connection.prepare_cached(sql).map_err(sqlite)?;
    let mut rows = statement.query(params).map_err(sqlite)?;
    let mut events = Vec::new();
    while let Some(row) = rows.next().map_err(sqlite)? {
        let position: i64 = row.get(0).map_err(sqlite)?;
        events.push(StoredEvent { position: as_u64(position), event: rules::decode_event(blob(row, 1)?)? });
    }
    Ok(events)
}

/// A row's BLOB column as SQLite holds it, for decoding without a copy.
fn blob<'row>(row: &'row rusqlite::Row<'_>, index: usize) -> StoreResult<&'row [u8]> {
    row.get_ref(index).map_err(sqlite)?.as_blob().map_err(|error| StoreError::Corrupt(error.to_string()))
}

#[async_trait]
impl MessageStore for SqliteStore {
    async fn append_messages(
        &self,
        run: TurnId,
        messages: &[Arc<Message>],
        fence: Option<Fence>,
    ) -> StoreResult<()> {
        let mut bodies = Vec::with_capacity(messages.len());
        for message in messages {
            bodies.push(rules::encode("message", message)?);
        }
        self.write(move |connection| {
            let key = run.to_string();
            let session = run_row(connection, run, &key)?.session;
            check_fence(connection, session, fence)?;
            insert_messages(connection, &key, &bodies)
        })
        .await
    }

    async fn history(&self, session: SessionId, query: &HistoryQuery) -> StoreResult<Vec<HistoryMessage>> {
        let query = query.clone();
        self.read_where(handoff::short_history(&query), false, move |connection| {
            let key = session.to_string();
            if !session_exists(connection, &key)? {
                return Err(StoreError::not_found("session", session));
            }
            // Member runs are not looked at unless the window takes them: turns only, then.
            let mut runs_statement = connection
                .prepare_cached(if query.include_member_runs {
                    "SELECT body FROM runs WHERE session_id = ?1 ORDER BY run_order DESC"
                } else {
                    "SELECT body FROM runs INDEXED BY runs_top_level WHERE session_id = ?1 AND parent_id IS NULL ORDER BY run_order DESC"
                })
                .map_err(sqlite)?;
            let mut rows = runs_statement.query([&key]).map_err(sqlite)?;
            let runs = std::iter::from_fn(|| match rows.next() {
                Ok(Some(row)) => {
                    Some(blob(row, 0).and_then(|body| rules::decode::<rules::RunHead>("run", body)))
                }
                Ok(None) => None,
                Err(error) => Some(Err(sqlite(error))),
            });
            let mut messages_statement = connection
                .prepare_cached("SELECT idx, body FROM messages WHERE run_id = ?1 ORDER BY idx ASC")
                .map_err(sqlite)?;
            rules::history_window(runs, &query, |run, window| {
                let mut rows = messages_statement.query([run.to_string()]).map_err(sqlite)?;
                while let Some(row) = rows.next().map_err(sqlite)? {
                    let index: i64 = row.get(0).map_err(sqlite)?;
                    window.push(HistoryMessage {
                        run_id: run,
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                        // Decoded, then shared: decoding into the `Arc` allocates twice.
                        message: Arc::new(rules::decode("message", blob(row, 1)?)?),
                    });
                }
                Ok(())
            })
        })
        .await
    }
}

#[async_trait]
impl UserStore for SqliteStore {
    async fn profile(&self, user_id: &str) -> StoreResult<Option<UserProfile>> {
        let user = user_id.to_owned();
        self.read_sized(true, move |connection| {
            let body: Option<Vec<u8>> = connection
                .prepare_cached("SELECT body FROM profiles WHERE user_id = ?1")
                .map_err(sqlite)?
                .query_row([user], |row| row.get(0))
                .optional()
                .map_err(sqlite)?;
            body.map(|body| rules::decode("user profile", &body)).transpose()
        })
        .await
    }

    async fn put_profile(&self, profile: &UserProfile) -> StoreResult<()> {
        let body = rules::encode("user profile", profile)?;
        let user = profile.user_id.clone();
        self.write(move |connection| {
            connection
                .prepare_cached("INSERT INTO profiles (user_id, body) VALUES (?1, ?2) ON CONFLICT (user_id) DO UPDATE SET body = ?2")
                .map_err(sqlite)?
                .execute(params![user, body])
                .map_err(sqlite)?;
            Ok(())
        })
        .await
    }

    async fn merge_profile(&self, patch: &UserProfile) -> StoreResult<UserProfile> {
        rules::check_profile_patch(patch)?;
        let patch = patch.clone();
        self.write(move |connection| {
            let body: Option<Vec<u8>> = connection
                .prepare_cached("SELECT body FROM profiles WHERE user_id = ?1")
                .map_err(sqlite)?
                .query_row([&patch.user_id], |row| row.get(0))
                .optional()
                .map_err(sqlite)?;
            let current = body.map(|body| rules::decode("user profile", &body)).transpose()?;
            let merged = rules::merged_profile(current, &patch);
            let body = rules::encode("user profile", &merged)?;
            connection
                .prepare_cached("INSERT INTO profiles (user_id, body) VALUES (?1, ?2) ON CONFLICT (user_id) DO UPDATE SET body = ?2")
                .map_err(sqlite)?
                .execute(params![patch.user_id, body])
                .map_err(sqlite)?;
            Ok(merged)
        })
        .await
    }

    async fn add_memory(&self, memory: &UserMemory) -> StoreResult<()> {
        let body = rules::encode("user memory", memory)?;
        let (user, id, created) =
            (memory.user_id.clone(), memory.id.clone(), memory.created_at.unix_micros());
        self.write(move |connection| {
            let inserted = connection
                .prepare_cached(
                    "INSERT OR IGNORE INTO memories (user_id, id, created_us, body) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(sqlite)?
                .execute(params![user, id, created, body])
                .map_err(sqlite)?;
            if inserted == 0 {
                return Err(Conflict::AlreadyExists { kind: "user memory", id }.into());
            }
            Ok(())
        })
        .await
    }

    async fn memories(&self, user_id: &str, limit: usize) -> StoreResult<Vec<UserMemory>> {
        let user = user_id.to_owned();
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached(
                    "SELECT body FROM memories WHERE user_id = ?1 ORDER BY created_us DESC, id DESC LIMIT ?2",
                )
                .map_err(sqlite)?;
            let mut rows = statement.query(params![user, as_i64(limit as u64)]).map_err(sqlite)?;
            let mut memories = Vec::new();
            while let Some(row) = rows.next().map_err(sqlite)? {
                let body: Vec<u8> = row.get(0).map_err(sqlite)?;
                memories.push(rules::decode("user memory", &body)?);
            }
            Ok(memories)
        })
        .await
    }

    async fn delete_memory(&self, user_id: &str, id: &str) -> StoreResult<()> {
        let (user, id) = (user_id.to_owned(), id.to_owned());
        self.write(move |connection| {
            let deleted = connection
                .prepare_cached("DELETE FROM memories WHERE user_id = ?1 AND id = ?2")
                .map_err(sqlite)?
                .execute(params![user, id])
                .map_err(sqlite)?;
            if deleted == 0 {
                return Err(StoreError::not_found("user memory", id));
            }
            Ok(())
        })
        .await
    }
}

fn journal_row(connection: &Connection, turn: &str, call: &str) -> StoreResult<Option<JournalEntry>> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("SELECT body FROM journal WHERE turn_id = ?1 AND tool_call_id = ?2")
        .map_err(sqlite)?
        .query_row([turn, call], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    body.map(|body| rules::decode("journal entry", &body)).transpose()
}

/// Inserts an encoded new journal entry of the turn keyed `turn`, inside a write.
fn insert_journal_row(connection: &Connection, turn: &str, call: &str, body: &[u8]) -> StoreResult<()> {
    connection
        .prepare_cached("INSERT INTO journal (turn_id, tool_call_id, body) VALUES (?1, ?2, ?3)")
        .map_err(sqlite)?
        .execute(params![turn, call, body])
        .map_err(sqlite)?;
    Ok(())
}

/// Stores a checked journal entry of the turn keyed `turn`, as a new row or over its row.
fn write_journal_row(
    connection: &Connection,
    turn: &str,
    entry: &JournalEntry,
    new: bool,
) -> StoreResult<()> {
    let body = rules::encode("journal entry", entry)?;
    if new {
        return insert_journal_row(connection, turn, &entry.tool_call_id, &body);
    }
    connection
        .prepare_cached("UPDATE journal SET body = ?3 WHERE turn_id = ?1 AND tool_call_id = ?2")
        .map_err(sqlite)?
        .execute(params![turn, entry.tool_call_id, body])
        .map_err(sqlite)?;
    Ok(())
}

#[async_trait]
impl JournalStore for SqliteStore {
    async fn journal_start(&self, entry: &JournalEntry, fence: Option<Fence>) -> StoreResult<JournalEntry> {
        let body = rules::encode("journal entry", entry)?;
        let entry = entry.clone();
        self.write(move |connection| {
            let turn = entry.turn_id.to_string();
            let session = run_row(connection, entry.turn_id, &turn)?.session;
            check_fence(connection, session, fence)?;
            let existing = journal_row(connection, &turn, &entry.tool_call_id)?;
            if let Some(stored) = rules::journal_start(existing.as_ref(), &entry)? {
                return Ok(stored);
            }
            insert_journal_row(connection, &turn, &entry.tool_call_id, &body)?;
            Ok(entry)
        })
        .await
    }

    async fn journal_complete(
        &self,
        turn: TurnId,
        tool_call_id: &str,
        result: &ToolResult,
        completed_at: Timestamp,
        fence: Option<Fence>,
    ) -> StoreResult<JournalEntry> {
        rules::encode("tool result", result)?;
        let (call, result) = (tool_call_id.to_owned(), result.clone());
        self.write(move |connection| {
            let key = turn.to_string();
            let session = run_row(connection, turn, &key)?.session;
            check_fence(connection, session, fence)?;
            let existing = journal_row(connection, &key, &call)?;
            let (entry, changed) =
                rules::journal_complete(existing.as_ref(), turn, &call, &result, completed_at)?;
            if changed {
                write_journal_row(connection, &key, &entry, false)?;
            }
            Ok(entry)
        })
        .await
    }

    async fn journal(&self, turn: TurnId) -> StoreResult<Vec<JournalEntry>> {
        self.read(move |connection| {
            run_row(connection, turn, &turn.to_string())?;
            let mut statement = connection
                .prepare_cached("SELECT body FROM journal WHERE turn_id = ?1 ORDER BY entry_order ASC")
                .map_err(sqlite)?;
            let mut rows = statement.query([turn.to_string()]).map_err(sqlite)?;
            let mut entries = Vec::new();
            while let Some(row) = rows.next().map_err(sqlite)? {
                let body: Vec<u8> = row.get(0).map_err(sqlite)?;
                entries.push(rules::decode("journal entry", &body)?);
            }
            Ok(entries)
        })
        .await
    }
}

/// A budget row: the limit and what is used.
#[derive(Serialize, Deserialize)]
struct BudgetRow {
    limit: BudgetLimit,
    used: BudgetUsage,
}

fn budget_row(connection: &Connection, scope: &str) -> StoreResult<Option<BudgetRow>> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("SELECT body FROM budgets WHERE scope = ?1")
        .map_err(sqlite)?
        .query_row([scope], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    body.map(|body| rules::decode("budget", &body)).transpose()
}

fn reserved(connection: &Connection, scope: &str, now: Timestamp) -> StoreResult<BudgetUsage> {
    let mut statement = connection
        .prepare_cached(
            "SELECT r.body FROM reservation_scopes s JOIN reservations r ON r.id = s.reservation_id
             WHERE s.scope = ?1 AND r.expires_us > ?2",
        )
        .map_err(sqlite)?;
    let mut rows = statement.query(params![scope, now.unix_micros()]).map_err(sqlite)?;
    let mut total = BudgetUsage::default();
    while let Some(row) = rows.next().map_err(sqlite)? {
        let reservation: BudgetReservation = rules::decode("budget reservation", blob(row, 0)?)?;
        if holds(connection, &reservation, now)? {
            total = rules::add_usage(&total, &reservation.amount);
        }
    }
    Ok(total)
}

/// Whether a reservation holds at `now` (see [`rules::reservation_holds`]).
fn holds(connection: &Connection, reservation: &BudgetReservation, now: Timestamp) -> StoreResult<bool> {
    let lease = match reservation.lease {
        Some(fence) => lease_row(connection, &fence.session_id.to_string())?,
        None => None,
    };
    Ok(rules::reservation_holds(reservation, lease.as_ref(), now))
}

fn take_reservation(connection: &Connection, id: &str) -> StoreResult<BudgetReservation> {
    let body: Option<Vec<u8>> = connection
        .prepare_cached("DELETE FROM reservations WHERE id = ?1 RETURNING body")
        .map_err(sqlite)?
        .query_row([id], |row| row.get(0))
        .optional()
        .map_err(sqlite)?;
    let body = body.ok_or_else(|| StoreError::not_found("budget reservation", id))?;
    connection
        .prepare_cached("DELETE FROM reservation_scopes WHERE reservation_id = ?1")
        .map_err(sqlite)?
        .execute([id])
        .map_err(sqlite)?;
    rules::decode("budget reservation", &body)
}

#[async_trait]
impl BudgetStore for SqliteStore {
    async fn create_budget(
        &self,
        scope: &str,
        limit: &BudgetLimit,
        session: Option<SessionId>,
    ) -> StoreResult<()> {
        let body = rules::encode("budget", &BudgetRow { limit: *limit, used: BudgetUsage::default() })?;
        let scope = scope.to_owned();
        self.write(move |connection| {
            let session_key = session.map(|session| session.to_string());
            if let Some(key) = &session_key
                && !session_exists(connection, key)?
            {
                return Err(StoreError::not_found("session", key));
            }
            let inserted = connection
                .prepare_cached("INSERT OR IGNORE INTO budgets (scope, body, session_id) VALUES (?1, ?2, ?3)")
                .map_err(sqlite)?
                .execute(params![scope, body, session_key])
                .map_err(sqlite)?;
            if inserted == 0 {
                return Err(Conflict::AlreadyExists { kind: "budget", id: scope }.into());
            }
            Ok(())
        })
        .await
    }

    async fn budget(&self, scope: &str, now: Timestamp) -> StoreResult<BudgetLedger> {
        let scope = scope.to_owned();
        self.read(move |connection| {
            // Both reads on one snapshot: a settlement committed between two would move its
            // amount from reserved to used with neither read seeing it.
            let snapshot = connection.unchecked_transaction().map_err(sqlite)?;
            let row =
                budget_row(&snapshot, &scope)?.ok_or_else(|| StoreError::not_found("budget", &scope))?;
            let reserved = reserved(&snapshot, &scope, now)?;
            Ok(BudgetLedger { scope, limit: row.limit, used: row.used, reserved })
        })
        .await
    }

    async fn reserve(&self, reservation: &BudgetReservation, now: Timestamp) -> StoreResult<()> {
        rules::check_reservation(reservation)?;
        let body = rules::encode("budget reservation", reservation)?;
        let reservation = reservation.clone();
        self.write(move |connection| {
            if let Some(fence) = reservation.lease {
                check_fence(connection, fence.session_id, Some(fence))?;
            }
            // An id held already is a conflict, not a lack of room (the held reservation
            // would count against itself), as on the other backends.
            let held_already = connection
                .prepare_cached("SELECT 1 FROM reservations WHERE id = ?1")
                .map_err(sqlite)?
                .exists(params![reservation.id])
                .map_err(sqlite)?;
            if held_already {
                return Err(Conflict::AlreadyExists { kind: "budget reservation", id: reservation.id.clone() }.into());
            }
            for scope in &reservation.scopes {
                let row = budget_row(connection, scope)?.ok_or_else(|| StoreError::not_found("budget", scope))?;
                let held = rules::add_usage(&row.used, &reserved(connection, scope, now)?);
                rules::check_room(scope, &row.limit, &held, &reservation.amount)?;
            }
            let inserted = connection
                .prepare_cached("INSERT OR IGNORE INTO reservations (id, expires_us, body) VALUES (?1, ?2, ?3)")
                .map_err(sqlite)?
                .execute(params![reservation.id, reservation.expires_at.unix_micros(), body])
                .map_err(sqlite)?;
            if inserted == 0 {
                return Err(Conflict::AlreadyExists { kind: "budget reservation", id: reservation.id.clone() }.into());
            }
            let mut link = connection
                .prepare_cached("INSERT OR IGNORE INTO reservation_scopes (scope, reservation_id) VALUES (?1, ?2)")
                .map_err(sqlite)?;
            for scope in &reservation.scopes {
                link.execute(params![scope, reservation.id]).map_err(sqlite)?;
            }
            // Expired reservations are dropped, but for this one (stored even when already
            // expired, as the other stores keep it, holding nothing). One whose lease ended
            // stays until it expires, holding nothing: its holder may still settle what its
            // step really used.
            for sql in [
                "DELETE FROM reservation_scopes WHERE reservation_id IN (SELECT id FROM reservations WHERE expires_us <= ?1 AND id != ?2)",
                "DELETE FROM reservations WHERE expires_us <= ?1 AND id != ?2",
            ] {
                connection
                    .prepare_cached(sql)
                    .map_err(sqlite)?
                    .execute(params![now.unix_micros(), reservation.id])
                    .map_err(sqlite)?;
            }
            Ok(())
        })
        .await
    }

    async fn settle(&self, reservation_id: &str, actual: &BudgetUsage) -> StoreResult<()> {
        rules::check_amount(actual)?;
        let (id, actual) = (reservation_id.to_owned(), *actual);
        self.write(move |connection| {
            let reservation = take_reservation(connection, &id)?;
            for scope in &reservation.scopes {
                if let Some(mut row) = budget_row(connection, scope)? {
                    row.used = rules::add_usage(&row.used, &actual);
                    let body = rules::encode("budget", &row)?;
                    connection
                        .prepare_cached("UPDATE budgets SET body = ?2 WHERE scope = ?1")
                        .map_err(sqlite)?
                        .execute(params![scope, body])
                        .map_err(sqlite)?;
                }
            }
            Ok(())
        })
        .await
    }

    async fn release(&self, reservation_id: &str) -> StoreResult<()> {
        let id = reservation_id.to_owned();
        self.write(move |connection| take_reservation(connection, &id).map(|_| ())).await
    }
}

/// The last fencing token granted.
fn last_token(connection: &Connection) -> StoreResult<i64> {
    connection
        .prepare_cached("SELECT value FROM meta WHERE key = 'last_token'")
        .map_err(sqlite)?
        .query_row([], |row| row.get(0))
        .map_err(sqlite)
}

/// Records the last fencing token granted.
fn set_last_token(connection: &Connection, token: u64) -> StoreResult<()> {
    connection
        .prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'last_token'")
        .map_err(sqlite)?
        .execute([as_i64(token)])
        .map_err(sqlite)?;
    Ok(())
}

fn put_lease(connection: &Connection, lease: &Lease) -> StoreResult<()> {
    let body = rules::encode("lease", lease)?;
    connection
        .prepare_cached("INSERT INTO leases (session_id, body) VALUES (?1, ?2) ON CONFLICT (session_id) DO UPDATE SET body = ?2")
        .map_err(sqlite)?
        .execute(params![lease.session_id.to_string(), body])
        .map_err(sqlite)?;
    Ok(())
}

#[async_trait]
impl agentry_memory::Checkpoint for SqliteStore {
    /// Copies the log into the file and empties it (a truncating checkpoint), on a
    /// connection of its own outside any transaction (the readers' are read-only, and the
    /// writer's may be in one): every acknowledged write is committed, so it is copied.
    /// The writer's own checkpoints go on afterwards.
    async fn checkpoint(&self) -> StoreResult<()> {
        // A checkpoint running on another connection (the store's own checkpointer, after
        // each commit) makes this one give up at once rather than wait: tried again for
        // as long as the busy timeout.
        let deadline = tokio::time::Instant::now() + self.busy_timeout();
        loop {
            let store = self.clone();
            let wait = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(Duration::from_millis(100));
            let emptied = tokio::task::spawn_blocking(move || store.empty_log_now(wait))
                .await
                .map_err(|error| StoreError::Io(format!("the checkpoint task failed: {error}")))??;
            if emptied {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Io(format!(
                    "the log of {} could not be copied into it: another connection held it for the busy \
                     timeout; the next open replays it",
                    self.path().display()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn acquire_lease(
        &self,
        session: SessionId,
        owner: &str,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease> {
        let owner = owner.to_owned();
        self.write(move |connection| {
            let key = session.to_string();
            if !session_exists(connection, &key)? {
                return Err(StoreError::not_found("session", session));
            }
            let lease = rules::grant_lease(
                session,
                lease_row(connection, &key)?.as_ref(),
                &owner,
                ttl,
                now,
                as_u64(last_token(connection)?) + 1,
            )?;
            set_last_token(connection, lease.token)?;
            put_lease(connection, &lease)?;
            Ok(lease)
        })
        .await
    }

    async fn renew_lease(
        &self,
        session: SessionId,
        token: u64,
        ttl: Duration,
        now: Timestamp,
    ) -> StoreResult<Lease> {
        self.write(move |connection| {
            let current = lease_row(connection, &session.to_string())?;
            let lease = rules::renew_lease(session, current.as_ref(), token, ttl, now)?;
            put_lease(connection, &lease)?;
            Ok(lease)
        })
        .await
    }

    async fn release_lease(&self, session: SessionId, token: u64) -> StoreResult<()> {
        self.write(move |connection| {
            let key = session.to_string();
            rules::check_release(session, lease_row(connection, &key)?.as_ref(), token)?;
            delete_lease(connection, session)
        })
        .await
    }

    async fn lease(&self, session: SessionId) -> StoreResult<Option<Lease>> {
        self.read_sized(true, move |connection| lease_row(connection, &session.to_string())).await
    }

    async fn list_leases(&self, after: Option<SessionId>, limit: usize) -> StoreResult<Vec<Lease>> {
        // Ids are fixed-width lowercase hyphenated hex, so their text order is their numeric
        // order, and the empty string comes before every id.
        let after = after.map(|session| session.to_string()).unwrap_or_default();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |connection| {
            let mut statement = connection
                .prepare_cached("SELECT body FROM leases WHERE session_id > ?1 ORDER BY session_id LIMIT ?2")
                .map_err(sqlite)?;
            let mut rows = statement.query(rusqlite::params![after, limit]).map_err(sqlite)?;
            let mut leases = Vec::new();
            while let Some(row) = rows.next().map_err(sqlite)? {
                leases.push(rules::decode("lease", blob(row, 0)?)?);
            }
            Ok(leases)
        })
        .await
    }
}
