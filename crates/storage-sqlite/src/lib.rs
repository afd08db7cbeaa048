//! Agentry's storage over SQLite.
//!
//! [`SqliteStore`] keeps every record of the storage traits in one SQLite file in WAL
//! mode. All writes go through one writer thread that commits concurrent writes together
//! (group commit). Each write runs in its own savepoint so that a failed write leaves the
//! others alone, except a single-event append, which is one statement after all its checks
//! and relies on SQLite undoing a failed statement. Reads run on blocking threads, on a
//! bounded pool of read-only connections kept open ([`SqliteOptions::readers`]; further
//! reads wait for one), but for short ones made while the writer thread is free, which it
//! runs between its transactions (no thread has to be woken for them). Nothing blocks the
//! async executor.
//!
//! The writer remembers each running turn's session and last `seq`, so an event append
//! costs one insert; it checks `PRAGMA data_version` at the start of every transaction and
//! forgets everything when another process has written, a job failed or a transaction did
//! not commit. WAL checkpoints run on their own thread. The schema is versioned and
//! migrated forward on open; a file from a newer version, a damaged file or a foreign
//! database is refused with a clear error and left as it was.
//!
//! ```
//! use agentry_memory::{Durability, SessionStore};
//! use agentry_storage_sqlite::{SqliteOptions, SqliteStore};
//! use agentry_types::{SessionRecord, SessionType, Subject};
//!
//! # tokio::runtime::Builder::new_multi_thread().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let store = SqliteStore::open(dir.path().join("agentry.db"), SqliteOptions::default()).unwrap();
//! let session = SessionRecord::new(SessionType::Agent, "demo", Subject::user("alice"));
//! store.create_session(&session).await.unwrap();
//! assert_eq!(store.get_session(session.id).await.unwrap(), session);
//! # });
//! ```

mod error;
mod ops;
mod schema;

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use agentry_memory::handoff::{self, Replies, WriterLoad};
use agentry_memory::{Durability, GroupCommit, RememberedTurns, StoreError, StoreResult};
use rusqlite::config::DbConfig;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, MAIN_DB, OpenFlags};
use tokio::sync::Semaphore;

use crate::error::sqlite;

/// How a [`SqliteStore`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// How hard to work to keep acknowledged writes across a crash.
    pub durability: Durability,
    /// How many reads run at once, each on a read-only connection kept open for the next
    /// (at least one). Further reads wait for a connection: opening one per read, as a busy
    /// server would otherwise, parses the schema again every time. With two or more, long
    /// reads (replays, history windows, listings) leave one connection to short ones (a
    /// record, a lease).
    pub readers: usize,
    /// How long to wait for a lock held by another process.
    pub busy_timeout: Duration,
    /// The most writes committed in one transaction.
    pub max_batch: usize,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Batched,
            readers: 4,
            busy_timeout: Duration::from_secs(5),
            max_batch: 512,
        }
    }
}

/// The writer thread's connection (inside the open transaction, for a write) and what the
/// writer remembers between transactions. Dereferences to the connection.
pub(crate) struct Tx<'a> {
    connection: &'a Connection,
    /// What the writer remembers about running turns.
    pub(crate) turns: &'a mut RememberedTurns,
}

impl Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.connection
    }
}

/// What the writer thread does with a job once its savepoint is settled: report the
/// outcome, `Ok` only once the enclosing transaction has committed.
type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// A job waiting for the writer thread: a write, or a short read ([`ReadJob`]).
trait WriteJob: Send {
    /// Runs (inside a savepoint unless [`WriteJob::needs_savepoint`] says otherwise); says
    /// whether it succeeded (so the savepoint is kept or rolled back) and how to report
    /// once the transaction is settled.
    fn run(self: Box<Self>, tx: &mut Tx<'_>) -> (bool, Finish);

    /// Whether the job must run in a savepoint (see [`SqliteStore::write_one_statement`]).
    fn needs_savepoint(&self) -> bool;

    /// Reports that the job could not run.
    fn fail(self: Box<Self>, error: StoreError);

    /// Whether the job only reads, and runs outside any transaction (see
    /// [`SqliteStore::read_sized`]).
    fn is_read(&self) -> bool {
        false
    }
}

type Job = Box<dyn WriteJob>;

struct TypedJob<W, R> {
    work: W,
    reply: tokio::sync::oneshot::Sender<StoreResult<R>>,
    savepoint: bool,
}

impl<W, R> WriteJob for TypedJob<W, R>
where
    W: FnOnce(&mut Tx<'_>) -> StoreResult<R> + Send + 'static,
    R: Send + 'static,
{
    fn run(self: Box<Self>, tx: &mut Tx<'_>) -> (bool, Finish) {
        let Self { work, reply, .. } = *self;
        // Answers the caller if `work` panics (the writer loop catches the panic).
        let reply = handoff::Reply::new(reply);
        let result = work(tx);
        let ok = result.is_ok();
        (ok, Box::new(move |commit: Result<(), StoreError>| reply.send(commit.and(result))))
    }

    fn needs_savepoint(&self) -> bool {
        self.savepoint
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

/// A read handed to the writer thread: it runs on the writer's connection, outside any
/// transaction, and reports at once.
struct ReadJob<W, R> {
    work: W,
    reply: tokio::sync::oneshot::Sender<StoreResult<R>>,
}

impl<W, R> WriteJob for ReadJob<W, R>
where
    W: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    R: Send + 'static,
{
    fn run(self: Box<Self>, tx: &mut Tx<'_>) -> (bool, Finish) {
        let Self { work, reply } = *self;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(tx.connection)))
            .unwrap_or_else(|_| Err(StoreError::Io("a read panicked".to_owned())));
        let _ = reply.send(result);
        (true, Box::new(drop))
    }

    fn needs_savepoint(&self) -> bool {
        false
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }

    fn is_read(&self) -> bool {
        true
    }
}

struct Inner {
    path: PathBuf,
    options: SqliteOptions,
    writer: Option<mpsc::Sender<Job>>,
    writer_thread: Option<JoinHandle<()>>,
    readers: Mutex<Vec<Connection>>,
    /// One permit per reader connection: a read holds one while it runs.
    read_permits: Arc<Semaphore>,
    /// One permit fewer, which a read that is not small holds too (`None` with one reader).
    long_read_permits: Option<Arc<Semaphore>>,
    replies: Replies,
    /// What the writer thread has waiting: whether a small read may run there.
    load: WriterLoad,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The pooled readers close first, so that the writer's connection is the last
        // and copies the log into the main file. Closing the channel ends the writer loop
        // after the jobs already queued; the writer thread ends the checkpointer and
        // closes both connections, so the file is closed when the store is dropped.
        self.readers.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.writer.take();
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

/// A store in one SQLite file.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.options.durability)
            .finish_non_exhaustive()
    }
}

fn configure(connection: &Connection, options: &SqliteOptions) -> StoreResult<()> {
    // SQLite takes at most `i32::MAX` milliseconds (about 24 days): a longer wait is that.
    let most = Duration::from_millis(u64::try_from(i32::MAX).unwrap_or(u64::MAX));
    connection.busy_timeout(options.busy_timeout.min(most)).map_err(sqlite)?;
    connection.set_prepared_statement_cache_capacity(64);
    // The query planner's stability guarantee: a cached statement keeps its plan. Without
    // it SQLite compiles a statement again whenever a parameter its plan looked at (a
    // `LIMIT ?`, for one) gets a new value: a tenth of the writer's time went to it.
    connection.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map_err(sqlite)?;
    Ok(())
}

/// Puts the file in WAL mode. Switching needs the file to itself, and SQLite answers
/// "database is locked" at once (without its busy handler) while another connection reads
/// it, as several processes opening a new file together do: the switch is tried again for
/// up to `busy_timeout`.
fn enable_wal(writer: &Connection, busy_timeout: Duration) -> StoreResult<()> {
    let started = std::time::Instant::now();
    loop {
        match writer.pragma_update(None, "journal_mode", "WAL") {
            Ok(()) => return Ok(()),
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if matches!(
                    failure.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) && started.elapsed() < busy_timeout =>
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(error) => return Err(sqlite(error)),
        }
    }
}

/// Refuses a main file shorter than its header says, unless a WAL or a rollback journal
/// beside it accounts for the difference.
fn check_not_truncated(path: &Path) -> StoreResult<()> {
    use std::io::Read as _;
    let Ok(mut file) = std::fs::File::open(path) else { return Ok(()) };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Ok(());
    }
    let mut header = [0u8; 100];
    if file.read_exact(&mut header).is_err() {
        return Err(StoreError::Corrupt(format!("{} is too short to be a database", path.display())));
    }
    if &header[..16] != b"SQLite format 3\0" {
        return Err(StoreError::Corrupt(format!("{} is not an SQLite database", path.display())));
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65_536,
        size => u64::from(size),
    };
    let pages = u64::from(u32::from_be_bytes([header[28], header[29], header[30], header[31]]));
    // A WAL may hold the rest; a hot rollback journal (a first migration cut short: it runs
    // before the file is in WAL mode) undoes the growth when SQLite opens the file.
    // (Only a journal with content is hot; an empty one undoes nothing.)
    let beside = |suffix: &str| {
        std::fs::metadata(format!("{}-{suffix}", path.display())).is_ok_and(|beside| beside.len() > 0)
    };
    if pages > 0 && len < pages * page_size && !beside("wal") && !beside("journal") {
        return Err(StoreError::Corrupt(format!(
            "{} is truncated: its header says {} bytes, the file has {len}",
            path.display(),
            pages * page_size
        )));
    }
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the store at `path` and migrates its schema forward.
    ///
    /// Errors: `Io` when the file cannot be created or opened, `OtherBackend` when it is the
    /// other backend's store, `Corrupt` when it is not an Agentry store or is damaged,
    /// `VersionTooNew` when a newer Agentry wrote it. A refused
    /// file is left as it was.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        agentry_memory::rules::check_store_path(&path)?;
        agentry_memory::rules::check_store_format(&path, agentry_memory::rules::FileFormat::Sqlite)?;
        check_not_truncated(&path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut writer = Connection::open_with_flags(&path, flags).map_err(|error| {
            // A new file in a directory this user may not write to is the usual cause.
            let hint = if path.exists() {
                ""
            } else {
                " (the file does not exist yet: can this user create files in its directory?)"
            };
            StoreError::Io(format!("cannot open {}{hint}: {error}", path.display()))
        })?;
        configure(&writer, &options)?;
        // SQLite falls back to reading a file it may not write (another user's, or one that
        // is immutable): a store that acknowledged nothing but reads would serve as ready
        // and fail every write.
        if writer.is_readonly(rusqlite::MAIN_DB).map_err(sqlite)? {
            return Err(StoreError::Io(format!(
                "{} cannot be written (SQLite could open it only for reading): check the owner and \
                 permissions of the file and of its directory",
                path.display()
            )));
        }
        // Validate before changing anything in the file.
        schema::migrate(&mut writer)?;
        enable_wal(&writer, options.busy_timeout)?;
        let synchronous = match options.durability {
            Durability::Strict | Durability::Batched => "FULL",
            Durability::Relaxed => "NORMAL",
        };
        writer.pragma_update(None, "synchronous", synchronous).map_err(sqlite)?;
        writer.pragma_update(None, "foreign_keys", "OFF").map_err(sqlite)?;
        let checkpointer = start_checkpointer(&mut writer, &path, &options)?;
        let file = agentry_memory::rules::FileIdentity::of(&path)?;

        let (sender, receiver) = mpsc::channel::<Job>();
        let (batch, linger) = match options.durability {
            Durability::Strict => (1, Duration::ZERO),
            Durability::Batched => (options.max_batch.max(1), BATCHED_LINGER),
            Durability::Relaxed => (options.max_batch.max(1), Duration::ZERO),
        };
        let thread = std::thread::Builder::new()
            .name("sqlite-writer".to_owned())
            .spawn(move || {
                let writer = CloseLast { writer, checkpointer: Some(checkpointer), file };
                write_loop(&writer.writer, &receiver, batch, linger, &writer.file);
            })
            .map_err(|error| StoreError::Io(format!("cannot start the SQLite writer thread: {error}")))?;
        let readers = options.readers.clamp(1, Semaphore::MAX_PERMITS);
        let read_permits = Arc::new(Semaphore::new(readers));
        let long_read_permits = (readers > 1).then(|| Arc::new(Semaphore::new(readers - 1)));
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                options,
                writer: Some(sender),
                writer_thread: Some(thread),
                readers: Mutex::new(Vec::new()),
                read_permits,
                long_read_permits,
                replies: Replies::default(),
                load: WriterLoad::default(),
            }),
        })
    }

    /// How long a statement waits for another connection's lock.
    pub(crate) fn busy_timeout(&self) -> Duration {
        self.inner.options.busy_timeout
    }

    /// Empties the log into the file on a connection of its own, opened for it (blocking),
    /// waiting at most `wait` for another connection's lock: whether it did (not when
    /// another connection held the log); any other failure is an error.
    pub(crate) fn empty_log_now(&self, wait: Duration) -> StoreResult<bool> {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let connection = Connection::open_with_flags(&self.inner.path, flags).map_err(sqlite)?;
        configure(&connection, &self.inner.options)?;
        connection.busy_timeout(wait).map_err(sqlite)?;
        match truncate_log(&connection) {
            Ok(emptied) => Ok(emptied),
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if matches!(
                    failure.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                ) =>
            {
                Ok(false)
            }
            Err(error) => Err(sqlite(error)),
        }
    }

    /// The file the store lives in.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The store's durability mode.
    #[must_use]
    pub fn durability(&self) -> Durability {
        self.inner.options.durability
    }

    /// Runs a write on the writer thread; resolves once it is committed (or refused).
    pub(crate) async fn write<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Tx<'_>) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        self.send_job(work, true).await
    }

    /// Runs a write that changes the file with at most one statement, run after all of its
    /// checks, without a savepoint: SQLite undoes a failed statement by itself, and a
    /// savepoint would copy every page the statement touches into its journal.
    pub(crate) async fn write_one_statement<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Tx<'_>) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        self.send_job(work, false).await
    }

    async fn send_job<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Tx<'_>) -> StoreResult<R> + Send + 'static,
        savepoint: bool,
    ) -> StoreResult<R> {
        let _in_flight = self.inner.load.write();
        let (reply, receive) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(TypedJob { work, reply, savepoint });
        self.inner.writer.as_ref().ok_or(StoreError::Closed)?.send(job).map_err(|_| StoreError::Closed)?;
        self.inner.replies.wait(receive).await?
    }

    /// Runs a read on a pooled read-only connection, on a blocking thread.
    pub(crate) async fn read<R: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        self.read_sized(false, work).await
    }

    /// [`SqliteStore::read`]; a `small` read (one record or a handful) runs on the writer
    /// thread when it is free (see [`WriterLoad`]), and otherwise polls for its answer
    /// before it sleeps when no other store call is in flight (see [`Replies::read`]).
    pub(crate) async fn read_sized<R: Send + 'static>(
        &self,
        small: bool,
        work: impl FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        self.read_where(small, small, work).await
    }

    /// [`SqliteStore::read_sized`], on the writer thread when `on_writer` and it is free (a
    /// short history window, which is not `small`, goes there too).
    pub(crate) async fn read_where<R: Send + 'static>(
        &self,
        on_writer: bool,
        small: bool,
        work: impl FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        let (inner, job) = (&self.inner, |work, reply| Box::new(ReadJob { work, reply }) as Job);
        let writer = inner.writer.as_ref();
        let work =
            match handoff::read_on_writer(on_writer, &inner.load, &inner.replies, writer, work, job).await {
                Ok(result) => return result,
                Err(work) => work,
            };
        let inner = self.inner.clone();
        // The semaphores are never closed.
        let long = match inner.long_read_permits.as_ref().filter(|_| !small) {
            Some(permits) => Some(permits.clone().acquire_owned().await.map_err(|_| StoreError::Closed)?),
            None => None,
        };
        let permit = inner.read_permits.clone().acquire_owned().await.map_err(|_| StoreError::Closed)?;
        let read = tokio::task::spawn_blocking(move || {
            let _permits = (permit, long);
            let pooled = inner.readers.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let connection = match pooled {
                Some(connection) => connection,
                None => {
                    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
                    let connection = Connection::open_with_flags(&inner.path, flags).map_err(sqlite)?;
                    configure(&connection, &inner.options)?;
                    connection
                }
            };
            let result = work(&connection);
            inner.readers.lock().unwrap_or_else(PoisonError::into_inner).push(connection);
            result
        });
        self.inner
            .replies
            .read(read, small)
            .await
            .map_err(|error| StoreError::Io(format!("a read task failed: {error}")))?
    }
}

/// The writer's connection, closed after the checkpointer's (also when the writer thread
/// panics). The last connection to close copies the log into the main file and removes
/// it; two closing at once each see the other and leave the log behind (nothing is lost:
/// the next open reads it).
struct CloseLast {
    writer: Connection,
    checkpointer: Option<JoinHandle<()>>,
    file: agentry_memory::rules::FileIdentity,
}

impl Drop for CloseLast {
    fn drop(&mut self) {
        // The checkpointer's wake-ups end with the hook that sends them.
        let _ = self.writer.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, i32) -> rusqlite::Result<()>>);
        if let Some(checkpointer) = self.checkpointer.take() {
            let _ = checkpointer.join();
        }
        // Closed with its file gone: SQLite leaves the log of a moved file behind, and a
        // database put at the path would be opened with it. Emptied now that the
        // checkpointer is gone (its pass would make this checkpoint fail as busy).
        if self.file.check().is_err() {
            let _ = empty_log(&self.writer);
        }
    }
}

/// Copies the whole log into the file the connection has open and empties it (a
/// truncating checkpoint): whether it did, as SQLite reports it (a reader holding the log
/// makes it give up after the busy timeout, and the log stays).
fn empty_log(connection: &Connection) -> bool {
    truncate_log(connection).unwrap_or(false)
}

/// Runs a truncating checkpoint: whether the log was emptied (SQLite reports `busy` when
/// another connection held it).
fn truncate_log(connection: &Connection) -> rusqlite::Result<bool> {
    connection
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| row.get::<_, i64>(0))
        .map(|busy| busy == 0)
}

/// Under `batched`, how long a group commit waits for the writers it just acknowledged
/// to come back (see [`GroupCommit`]); small next to the sync every commit pays.
const BATCHED_LINGER: Duration = Duration::from_micros(200);

/// Runs one cached statement that takes no parameters.
fn run(connection: &Connection, sql: &str) -> StoreResult<()> {
    connection.prepare_cached(sql).map_err(sqlite)?.execute([]).map(drop).map_err(sqlite)
}

/// The writer thread: takes the jobs waiting, runs the reads among them first (outside
/// any transaction), then the writes in one immediate transaction (each in a savepoint
/// when it needs one), commits, and reports to every write.
fn write_loop(
    connection: &Connection,
    jobs: &mpsc::Receiver<Job>,
    max_batch: usize,
    linger: Duration,
    file: &agentry_memory::rules::FileIdentity,
) {
    let mut turns = RememberedTurns::default();
    let mut seen_version: Option<i64> = None;
    let mut gather = GroupCommit::new(max_batch, linger);
    // Whether the log was emptied since the file was found gone.
    let mut log_emptied = false;
    while let Ok(batch) = gather.next_batch(jobs, None) {
        // Reads run first, outside any transaction (each statement sees what is
        // committed): they come from calls that wait for no write of this batch.
        let batch = if batch.iter().any(|job| job.is_read()) {
            let (reads, writes): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|job| job.is_read());
            // Every batch ends its transaction; should ending one have failed, a read must
            // not see what it left uncommitted.
            if !connection.is_autocommit() {
                let _ = run(connection, "ROLLBACK");
            }
            for read in reads {
                if connection.is_autocommit() {
                    let (_, reported) = read.run(&mut Tx { connection, turns: &mut turns });
                    reported(Ok(()));
                } else {
                    read.fail(StoreError::Io("the writer's connection is stuck in a transaction".to_owned()));
                }
            }
            if writes.is_empty() {
                // No write committed: the next batch waits for no writers.
                gather.committed(0, jobs);
                continue;
            }
            writes
        } else {
            batch
        };
        // In WAL mode SQLite does not notice its file removed or replaced (it does with a
        // rollback journal): the writes would go to a file no later open reads.
        if let Err(error) = file.check() {
            if !log_emptied {
                // What the log holds is copied into the file this connection has open, and
                // the log at the path emptied: a database put at the path later is not
                // opened with this one's log (best effort: readers may hold it up).
                log_emptied = empty_log(connection);
            }
            for job in batch {
                job.fail(error.clone());
            }
            continue;
        }
        log_emptied = false;
        let size = batch.len();
        // IMMEDIATE takes the write lock up front, so another process sharing the file
        // makes this wait (busy timeout) instead of failing a read-then-write.
        let began = run(connection, "BEGIN IMMEDIATE").and_then(|()| data_version(connection));
        let version = match began {
            Ok(version) => version,
            Err(error) => {
                if !connection.is_autocommit() {
                    let _ = run(connection, "ROLLBACK");
                }
                for job in batch {
                    job.fail(error.clone());
                }
                continue;
            }
        };
        // Another connection wrote since the last transaction: what the writer remembers
        // may be stale, and a newer build may have migrated the file past this one's schema
        // (its indexes would not be kept up to date): then this process writes no more.
        if seen_version != Some(version) {
            turns.forget_all();
            if let Err(error) = check_not_migrated_past(connection) {
                let _ = run(connection, "ROLLBACK");
                for job in batch {
                    job.fail(error.clone());
                }
                continue;
            }
            seen_version = Some(version);
        }
        let mut tx = Tx { connection, turns: &mut turns };
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        let mut jobs_left = batch.into_iter();
        let mut aborted: Option<StoreError> = None;
        for job in jobs_left.by_ref() {
            let savepoint = job.needs_savepoint();
            if savepoint && let Err(error) = run(connection, "SAVEPOINT job") {
                job.fail(error.clone());
                aborted = Some(error);
                break;
            }
            let (ok, finish) =
                match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&mut tx))) {
                    Ok(outcome) => outcome,
                    Err(_) => {
                        aborted = Some(handoff::write_panicked());
                        break;
                    }
                };
            if connection.is_autocommit() {
                // SQLite rolled the whole transaction back (disk full, I/O error): nothing
                // of this batch stands.
                let error = StoreError::Io("SQLite rolled the transaction back after an error".to_owned());
                finish(Err(error.clone()));
                aborted = Some(error);
                break;
            }
            // A refused job changed nothing (its savepoint is rolled back, or its one
            // statement undone by SQLite), so neither does what it remembered.
            if ok {
                tx.turns.write_done();
            } else {
                tx.turns.write_undone();
            }
            let settled = match (ok, savepoint) {
                (true, true) => run(connection, "RELEASE job"),
                (false, true) => {
                    run(connection, "ROLLBACK TO job").and_then(|()| run(connection, "RELEASE job"))
                }
                (_, false) => Ok(()),
            };
            match settled {
                // A refusal is answered after the commit too: it may rest on what a job
                // before it in this batch wrote (a session it created), which a caller
                // told of it must be able to read, and which a failed commit undoes.
                Ok(()) => finishes.push(finish),
                Err(error) => {
                    finish(Err(error.clone()));
                    aborted = Some(error);
                    break;
                }
            }
        }
        if let Some(error) = aborted {
            turns.forget_all();
            if !connection.is_autocommit() {
                let _ = run(connection, "ROLLBACK");
            }
            for finish in finishes {
                finish(Err(error.clone()));
            }
            for job in jobs_left {
                job.fail(error.clone());
            }
            continue;
        }
        let committed = run(connection, "COMMIT");
        gather.committed(size, jobs);
        if committed.is_err() {
            turns.forget_all();
            if !connection.is_autocommit() {
                let _ = run(connection, "ROLLBACK");
            }
        }
        for finish in finishes {
            finish(committed.clone());
        }
    }
}

/// Refuses to write to a file a newer build migrated past this one's schema while this
/// process had it open.
fn check_not_migrated_past(connection: &Connection) -> StoreResult<()> {
    let found: i64 = connection.pragma_query_value(None, "user_version", |row| row.get(0)).map_err(sqlite)?;
    let found = u32::try_from(found).unwrap_or(u32::MAX);
    if found > schema::VERSION {
        return Err(StoreError::VersionTooNew { found, supported: schema::VERSION });
    }
    Ok(())
}

/// `PRAGMA data_version`: changes when another connection commits.
fn data_version(connection: &Connection) -> StoreResult<i64> {
    connection
        .prepare_cached("PRAGMA data_version")
        .map_err(sqlite)?
        .query_row([], |row| row.get(0))
        .map_err(sqlite)
}

/// WAL pages after which the checkpointer thread is asked to copy the log into the main
/// file.
const CHECKPOINT_PAGES: i32 = 1000;

/// The most uncopied WAL pages the writer copies itself. SQLite starts the log over only
/// once every frame in it is copied, which a checkpointer running beside a busy writer
/// never sees (the writer commits during its pass), so once the checkpointer's pass has
/// left at most this many the writer copies the rest, and the log starts over at its next
/// transaction. A checkpoint pays two syncs and grows with what it copies; the writer
/// keeps its share small.
const CHECKPOINT_PAGES_WRITER_LEFT: i32 = 300;

/// WAL pages past which the writer checkpoints whatever is left, when the checkpointer
/// falls behind: about 31 MiB at the default page size. A checkpoint cannot copy frames a
/// reader's snapshot still needs, so a long read lets the log grow past it.
const CHECKPOINT_PAGES_MAX: i32 = 8 * CHECKPOINT_PAGES;

/// What the writer's WAL hook and the checkpointer thread share.
#[derive(Debug, Default)]
struct CheckpointState {
    /// Set from a wake-up until the pass it asked for has ended.
    busy: AtomicBool,
    /// How many times the writer has seen the log start over.
    restarts: AtomicU32,
    /// The checkpointer's last pass: the `restarts` it began under (high half) and the
    /// frames of the log it found copied (low half).
    progress: AtomicU64,
}

impl CheckpointState {
    /// Frames of the current log not yet copied into the main file, as far as the
    /// checkpointer's last pass knows: all of them when that pass saw another log.
    fn uncopied(&self, pages: i32) -> i32 {
        let progress = self.progress.load(Ordering::Acquire);
        let same_log = progress >> 32 == u64::from(self.restarts.load(Ordering::Acquire));
        let copied = i32::try_from(progress & u64::from(u32::MAX)).unwrap_or(0);
        if same_log && copied <= pages { pages - copied } else { pages }
    }
}

/// Opens the checkpointer's connection. It reads the file once: a connection learns that
/// the database is in WAL mode, and opens its log, only when it first reads, and until
/// then a checkpoint through it is a no-op that reports success.
fn open_checkpointer(path: &Path, options: &SqliteOptions) -> StoreResult<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let connection = Connection::open_with_flags(path, flags).map_err(sqlite)?;
    configure(&connection, options)?;
    connection.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(())).map_err(sqlite)?;
    Ok(connection)
}

/// One passive checkpoint: the frames in the log and those copied, as SQLite counts them
/// (`-1` each when the connection is not in WAL mode).
fn checkpoint_pass(connection: &Connection) -> rusqlite::Result<(i32, i32)> {
    connection.wal_checkpoint_v2(Some(MAIN_DB), CheckpointMode::PASSIVE)
}

/// Moves the bulk of checkpointing off the writer thread: after each commit, SQLite
/// reports the WAL's size to the writer's hook, which wakes a checkpointer thread with its
/// own connection once the log passes [`CHECKPOINT_PAGES`]. The writer copies the little
/// the checkpointer's pass left ([`CHECKPOINT_PAGES_WRITER_LEFT`]) so that the log starts
/// over, or everything past [`CHECKPOINT_PAGES_MAX`]. The checkpoints are SQLite's own
/// (passive, crash-safe); only the thread that pays for them changes.
fn start_checkpointer(
    writer: &mut Connection,
    path: &Path,
    options: &SqliteOptions,
) -> StoreResult<JoinHandle<()>> {
    let connection = open_checkpointer(path, options)?;
    let (wake, woken) = mpsc::sync_channel::<()>(1);
    let state = Arc::new(CheckpointState::default());
    let checkpointer_state = state.clone();
    let mut last_pages = 0;
    writer
        .wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: i32| {
            if pages < last_pages {
                state.restarts.fetch_add(1, Ordering::AcqRel);
            }
            last_pages = pages;
            if pages < CHECKPOINT_PAGES {
                return Ok(());
            }
            let idle = !state.busy.load(Ordering::Acquire);
            if pages >= CHECKPOINT_PAGES_MAX
                || (idle && state.uncopied(pages) <= CHECKPOINT_PAGES_WRITER_LEFT)
            {
                // Best effort: a busy checkpoint is retried after the next commit.
                let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
            } else if idle && !state.busy.swap(true, Ordering::AcqRel) {
                let _ = wake.try_send(());
            }
            Ok(())
        }))
        .map_err(sqlite)?;
    std::thread::Builder::new()
        .name("sqlite-ckpt".to_owned())
        .spawn(move || {
            while woken.recv().is_ok() {
                let restarts = checkpointer_state.restarts.load(Ordering::Acquire);
                // Best effort: what is not copied now is copied on the next wake-up.
                if let Ok((_, copied)) = checkpoint_pass(&connection) {
                    let copied = u64::try_from(copied).unwrap_or(0);
                    checkpointer_state.progress.store(u64::from(restarts) << 32 | copied, Ordering::Release);
                }
                checkpointer_state.busy.store(false, Ordering::Release);
            }
        })
        .map_err(|error| StoreError::Io(format!("cannot start the SQLite checkpointer thread: {error}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use rusqlite::Connection;

    use std::sync::atomic::Ordering;

    use std::sync::mpsc;
    use std::time::Duration;

    use agentry_memory::handoff;
    use agentry_memory::{StoreError, StoreResult};
    use tokio::sync::oneshot;

    use super::{
        CheckpointState, Job, ReadJob, SqliteOptions, TypedJob, checkpoint_pass, open_checkpointer,
        write_loop,
    };

    fn count(connection: &Connection) -> StoreResult<i64> {
        Ok(connection.query_row("SELECT count(*) FROM t", [], |row| row.get(0)).unwrap())
    }

    fn read(jobs: &mpsc::Sender<Job>) -> oneshot::Receiver<StoreResult<i64>> {
        let (reply, answer) = oneshot::channel();
        jobs.send(Box::new(ReadJob { work: count, reply })).unwrap();
        answer
    }

    fn insert(jobs: &mpsc::Sender<Job>, refuse: bool) -> oneshot::Receiver<StoreResult<()>> {
        let (reply, answer) = oneshot::channel();
        let work = move |tx: &mut super::Tx<'_>| {
            tx.execute("INSERT INTO t VALUES (1)", []).unwrap();
            if refuse { Err(StoreError::InvalidInput("refused".to_owned())) } else { Ok(()) }
        };
        jobs.send(Box::new(TypedJob { work, reply, savepoint: true })).unwrap();
        answer
    }

    #[test]
    fn reads_in_a_batch_run_first_outside_its_transaction_and_see_only_what_is_committed() {
        let dir = tempfile::tempdir().unwrap();
        let connection = Connection::open(dir.path().join("store.db")).unwrap();
        let file = agentry_memory::rules::FileIdentity::of(&dir.path().join("store.db")).unwrap();
        connection.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (0);").unwrap();
        let (jobs, queue) = mpsc::channel::<Job>();
        // One batch: an accepted write, a read, a refused write, a read; then a batch of
        // reads alone. The queue is full before the loop starts, so each batch is as sent.
        let accepted = insert(&jobs, false);
        let first = read(&jobs);
        let refused = insert(&jobs, true);
        let second = read(&jobs);
        let writer = std::thread::spawn(move || {
            write_loop(&connection, &queue, 4, Duration::ZERO, &file);
            connection
        });
        let (accepted, first, refused, second) = (
            accepted.blocking_recv().unwrap(),
            first.blocking_recv().unwrap(),
            refused.blocking_recv().unwrap(),
            second.blocking_recv().unwrap(),
        );
        let alone = (read(&jobs), read(&jobs));
        let (third, fourth) = (alone.0.blocking_recv().unwrap(), alone.1.blocking_recv().unwrap());
        drop(jobs);
        let connection = writer.join().unwrap();
        assert_eq!(accepted, Ok(()));
        assert!(matches!(refused, Err(StoreError::InvalidInput(_))));
        // The reads ran before the batch's writes: the row of neither is seen.
        assert_eq!((first, second), (Ok(1), Ok(1)));
        // Later reads see the accepted write, and nothing of the refused one.
        assert_eq!((third, fourth), (Ok(2), Ok(2)));
        assert!(connection.is_autocommit());
    }

    #[test]
    fn a_write_that_panics_fails_its_batch_and_its_caller_hears_why() {
        let dir = tempfile::tempdir().unwrap();
        let connection = Connection::open(dir.path().join("store.db")).unwrap();
        let file = agentry_memory::rules::FileIdentity::of(&dir.path().join("store.db")).unwrap();
        connection.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (0);").unwrap();
        let (jobs, queue) = mpsc::channel::<Job>();
        // One batch: an accepted write, then one whose work panics after it changed a row.
        let accepted = insert(&jobs, false);
        let (reply, panicked) = oneshot::channel::<StoreResult<()>>();
        let work = |tx: &mut super::Tx<'_>| -> StoreResult<()> {
            tx.execute("INSERT INTO t VALUES (2)", []).unwrap();
            panic!("a bug in a write");
        };
        jobs.send(Box::new(TypedJob { work, reply, savepoint: true })).unwrap();
        let writer = std::thread::spawn(move || write_loop(&connection, &queue, 4, Duration::ZERO, &file));
        let (accepted, panicked) = (accepted.blocking_recv().unwrap(), panicked.blocking_recv().unwrap());
        // The writer goes on.
        let later = insert(&jobs, false).blocking_recv().unwrap();
        let rows = read(&jobs).blocking_recv().unwrap();
        drop(jobs);
        writer.join().unwrap();
        // Not `Closed`, which would tell the caller the store is closing.
        assert_eq!(panicked, Err(handoff::write_panicked()));
        assert_eq!(accepted, Err(handoff::write_panicked()), "its batch is rolled back");
        assert_eq!(later, Ok(()));
        assert_eq!(rows, Ok(2), "the first row and the later write's");
    }

    /// A writer whose file a newer build migrated past this one's schema while it was open
    /// writes no more: its indexes would not be kept up to date.
    #[test]
    fn a_writer_stops_once_another_process_migrated_the_file_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let connection = Connection::open(&path).unwrap();
        let file = agentry_memory::rules::FileIdentity::of(&path).unwrap();
        connection.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (0);").unwrap();
        let (jobs, queue) = mpsc::channel::<Job>();
        let writer = std::thread::spawn(move || write_loop(&connection, &queue, 4, Duration::ZERO, &file));
        assert_eq!(insert(&jobs, false).blocking_recv().unwrap(), Ok(()));
        // Another process migrates the file.
        let newer = Connection::open(&path).unwrap();
        newer.pragma_update(None, "user_version", i64::from(super::schema::VERSION) + 1).unwrap();
        let refused = insert(&jobs, false).blocking_recv().unwrap();
        assert_eq!(
            refused,
            Err(StoreError::VersionTooNew {
                found: super::schema::VERSION + 1,
                supported: super::schema::VERSION
            })
        );
        drop(jobs);
        writer.join().unwrap();
        let rows: i64 = newer.query_row("SELECT count(*) FROM t", [], |row| row.get(0)).unwrap();
        assert_eq!(rows, 2, "the first row and the write before the migration only");
    }

    #[test]
    fn only_a_pass_over_the_same_log_counts_as_copied() {
        let state = CheckpointState::default();
        assert_eq!(state.uncopied(1200), 1200, "no pass yet");
        state.progress.store(1000, Ordering::Release);
        assert_eq!(state.uncopied(1200), 200);
        // A count larger than the log is of an older log.
        assert_eq!(state.uncopied(900), 900);
        // The log started over since the pass.
        state.restarts.store(1, Ordering::Release);
        assert_eq!(state.uncopied(1200), 1200);
        state.progress.store(1 << 32 | 1100, Ordering::Release);
        assert_eq!(state.uncopied(1200), 100);
    }

    #[test]
    fn the_checkpointers_connection_copies_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let writer = Connection::open(&path).unwrap();
        writer.pragma_update(None, "journal_mode", "WAL").unwrap();
        writer.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
        writer.execute_batch("CREATE TABLE t (x BLOB); INSERT INTO t VALUES (zeroblob(20000));").unwrap();
        let checkpointer = open_checkpointer(&path, &SqliteOptions::default()).unwrap();
        // A connection that has not read yet does not know the log, and its checkpoint
        // copies nothing while reporting success.
        let (log, copied) = checkpoint_pass(&checkpointer).unwrap();
        assert!(log > 0, "the log holds the writer's frames: {log}");
        assert_eq!(copied, log);
    }
}
