//! The SQLite schema and its forward migrations.
//!
//! The schema version lives in `PRAGMA user_version`; `PRAGMA application_id` marks the
//! file as an Agentry store. Opening a file of a newer version is refused; an older one
//! is migrated forward, each step in its own transaction.

use rusqlite::{Connection, TransactionBehavior};

use agentry_memory::StoreError;

use crate::error::sqlite;

/// `AGTR`: the application id of an Agentry store.
pub(crate) const APPLICATION_ID: i64 = 0x4147_5452;

/// The schema version this build writes. Version 2 changed no table: it marks a file whose
/// events may be stored in event format 2 (`agentry_memory::rules::encode_event`), which
/// a build of version 1 cannot read, so that such a build refuses the file as too new
/// instead of reporting its new events as damaged. Version 3 records the session a budget
/// ledger belongs to, so that deleting the session deletes it, and indexes reservations'
/// scope links by reservation (settling one looked at every link). Version 4 keeps each
/// run's parent beside its record and indexes runs by parent and turns by session.
/// Version 5 keeps each session's owner beside its record and indexes sessions by owner.
/// Version 6 keeps each session's latest activity (its turns' writes) beside its record.
pub(crate) const VERSION: u32 = 6;

/// Each migration takes the schema from version `index` to `index + 1`.
const MIGRATIONS: &[&str] = &[
    // 0 -> 1: the first schema.
    r"
    CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO meta (key, value) VALUES ('last_token', 0);

    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,
        created_us INTEGER NOT NULL,
        body BLOB NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX sessions_by_creation ON sessions (created_us, id);

    CREATE TABLE runs (
        run_order INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        session_id TEXT NOT NULL,
        high_water INTEGER NOT NULL DEFAULT 0,
        body BLOB NOT NULL
    );
    CREATE INDEX runs_by_session ON runs (session_id, run_order);

    CREATE TABLE events (
        position INTEGER PRIMARY KEY AUTOINCREMENT,
        turn_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        body BLOB NOT NULL
    );
    CREATE UNIQUE INDEX events_by_turn ON events (turn_id, seq);
    CREATE INDEX events_by_session ON events (session_id, position);

    CREATE TABLE messages (
        run_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (run_id, idx)
    ) WITHOUT ROWID;

    CREATE TABLE profiles (user_id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID;

    CREATE TABLE memories (
        user_id TEXT NOT NULL,
        id TEXT NOT NULL,
        created_us INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (user_id, id)
    ) WITHOUT ROWID;
    CREATE INDEX memories_by_time ON memories (user_id, created_us, id);

    CREATE TABLE journal (
        entry_order INTEGER PRIMARY KEY AUTOINCREMENT,
        turn_id TEXT NOT NULL,
        tool_call_id TEXT NOT NULL,
        body BLOB NOT NULL,
        UNIQUE (turn_id, tool_call_id)
    );

    CREATE TABLE budgets (scope TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID;

    CREATE TABLE reservations (id TEXT PRIMARY KEY, expires_us INTEGER NOT NULL, body BLOB NOT NULL) WITHOUT ROWID;
    CREATE TABLE reservation_scopes (
        scope TEXT NOT NULL,
        reservation_id TEXT NOT NULL,
        PRIMARY KEY (scope, reservation_id)
    ) WITHOUT ROWID;

    CREATE TABLE leases (session_id TEXT PRIMARY KEY, body BLOB NOT NULL) WITHOUT ROWID;
    ",
    // 1 -> 2: no table changes (see VERSION); events of format 1 stay readable.
    "",
    // 2 -> 3: the session a ledger belongs to (none for ledgers made before, or outside a
    // session).
    r"
    ALTER TABLE budgets ADD COLUMN session_id TEXT;
    CREATE INDEX budgets_by_session ON budgets (session_id) WHERE session_id IS NOT NULL;
    CREATE INDEX reservation_scopes_by_reservation ON reservation_scopes (reservation_id);
    ",
    // 3 -> 4: each run's parent, from its record (a record that is not valid JSON stays
    // top-level; it fails to decode wherever it is read, as before), and the indexes that
    // list a run's members and a session's turns without reading the other runs.
    r"
    ALTER TABLE runs ADD COLUMN parent_id TEXT;
    UPDATE runs SET parent_id = json_extract(CAST(body AS TEXT), '$.parent_run_id')
        WHERE json_valid(CAST(body AS TEXT));
    CREATE INDEX runs_by_parent ON runs (parent_id, run_order) WHERE parent_id IS NOT NULL;
    CREATE INDEX runs_top_level ON runs (session_id, run_order) WHERE parent_id IS NULL;
    ",
    // 4 -> 5: each session's owner, from its record (a record that is not valid JSON is
    // listed for no owner; one nested too deeply for the store to decode stays listed for
    // its owner, and such listings fail on it, as before), and the index that lists an
    // owner's sessions.
    r"
    ALTER TABLE sessions ADD COLUMN owner TEXT;
    UPDATE sessions SET owner = json_extract(CAST(body AS TEXT), '$.owner.subject_id')
        WHERE json_valid(CAST(body AS TEXT));
    CREATE INDEX sessions_by_owner ON sessions (owner, created_us, id);
    ",
    // 5 -> 6: each session's latest activity, the `updated_at` of its turns as written
    // (none for the sessions of older files until their next turn).
    r"
    ALTER TABLE sessions ADD COLUMN active_us INTEGER;
    ",
];

fn pragma_i64(connection: &Connection, name: &str) -> Result<i64, StoreError> {
    connection.pragma_query_value(None, name, |row| row.get(0)).map_err(sqlite)
}

/// Brings a connection's database to [`VERSION`], or refuses it. The file is checked with
/// a plain read first: a current file, a newer one or another application's is left
/// without taking its write lock (a busy one would otherwise wait out the busy timeout).
/// Then each step reads the version again and applies the next migration in one
/// `IMMEDIATE` transaction, under the write lock: two processes opening the same new or
/// older file at once do not both apply a step (the second would fail on a table the
/// first created).
pub(crate) fn migrate(connection: &mut Connection) -> Result<(), StoreError> {
    // Its three reads in one (deferred, read-only) transaction: read one by one, they could
    // straddle another process's first migration and see its tables without its id.
    let current = {
        let reading = connection.transaction().map_err(sqlite)?;
        checked_version(&reading)?
    };
    if current == VERSION {
        return Ok(());
    }
    loop {
        let transaction =
            connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sqlite)?;
        let version = checked_version(&transaction)?;
        // Up to date: the transaction changed nothing and is rolled back as it drops.
        let Some(sql) = MIGRATIONS.get(version as usize) else { return Ok(()) };
        transaction.execute_batch(sql).map_err(sqlite)?;
        transaction.pragma_update(None, "application_id", APPLICATION_ID).map_err(sqlite)?;
        transaction.pragma_update(None, "user_version", i64::from(version) + 1).map_err(sqlite)?;
        transaction.commit().map_err(sqlite)?;
    }
}

/// The file's schema version, refusing a database that is not an Agentry store or that a
/// newer Agentry wrote.
fn checked_version(connection: &Connection) -> Result<u32, StoreError> {
    let version = pragma_i64(connection, "user_version")?;
    let application = pragma_i64(connection, "application_id")?;
    let tables: i64 = connection
        .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |row| row.get(0))
        .map_err(sqlite)?;
    if application != APPLICATION_ID && (version != 0 || tables != 0) {
        return Err(StoreError::Corrupt(format!(
            "the file is an SQLite database but not an Agentry store (application id {application:#x})"
        )));
    }
    let version = u32::try_from(version)
        .map_err(|_| StoreError::Corrupt(format!("invalid schema version {version}")))?;
    if version > VERSION {
        return Err(StoreError::VersionTooNew { found: version, supported: VERSION });
    }
    Ok(version)
}
