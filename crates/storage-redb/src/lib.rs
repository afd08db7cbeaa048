//! Agentry's storage over redb.
//!
//! [`RedbStore`] keeps every record of the storage traits in one redb file, in tables
//! with composite keys over 128-bit ids. All writes go through one writer thread that
//! commits the writes waiting together (group commit); each write validates everything
//! before it changes anything, so a refused write leaves its batch-mates alone. Reads run
//! on MVCC snapshots on blocking threads, but for short ones made while the writer thread
//! is free, which it runs between its transactions (no thread has to be woken for them).
//! The file opens in redb's multi-writer mode, so
//! several processes can share one store (the session lease keeps their turns apart).
//!
//! Durability maps onto redb's: `strict` commits every write alone with
//! `Durability::Immediate`; `batched` commits groups with `Immediate`. `relaxed` also
//! commits groups with `Immediate`, so every commit reaches the operating system and an
//! acknowledged write survives a crash of the process, but through a file backend that
//! skips the sync to disk except at least once every [`RedbOptions::relaxed_sync_interval`]
//! (redb's own `Durability::None` keeps commits inside the process, where a crash would lose
//! them). A power loss can lose the writes since the last sync and, because redb relies on
//! syncs to order its copy-on-write commits, can damage the file: choose `batched` where
//! power loss matters.
//!
//! The writer remembers each running turn's session and last `seq`, so an event append
//! reads nothing; every transaction bumps a `generation` counter, and a different value at
//! the start of the next one (another process wrote) makes the writer forget.
//!
//! ```
//! use agentry_memory::SessionStore;
//! use agentry_storage_redb::{RedbOptions, RedbStore};
//! use agentry_types::{SessionRecord, SessionType, Subject};
//!
//! # tokio::runtime::Builder::new_multi_thread().build().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let store = RedbStore::open(dir.path().join("agentry.redb"), RedbOptions::default()).unwrap();
//! let session = SessionRecord::new(SessionType::Agent, "demo", Subject::user("alice"));
//! store.create_session(&session).await.unwrap();
//! assert_eq!(store.get_session(session.id).await.unwrap(), session);
//! # });
//! ```

mod backend;
mod ops;
mod tables;

use std::fmt;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use agentry_memory::handoff::{self, Replies, WriterLoad};
use agentry_memory::{Durability, GroupCommit, RememberedTurns, StoreError, StoreResult};
use redb::{ConcurrencyMode, Database, ReadTransaction, ReadableDatabase, ReadableTable, WriteTransaction};

use crate::backend::{DeferredSyncBackend, SyncSwitch};
use crate::tables::META;

/// The schema version this build writes. Version 2 dropped the last stored seq from
/// `run_meta` (it is the turn's last key in `turn_events`). Version 3 changed no table: it
/// marks a file whose events may be stored in event format 2
/// (`agentry_memory::rules::encode_event`), which a build of version 2 cannot read, so
/// that such a build refuses the file as too new instead of reporting its new events as
/// damaged. Version 4 indexes runs by parent (`session_turns`, `member_runs`,
/// `run_parents`), which a build of version 3 would not keep up to date. Version 5 indexes
/// sessions by owner (`session_owners`), likewise.
///
/// A new table that older builds can do without (their writes stay correct; they only
/// ignore it) comes without a version change and is created on open: `session_budgets`
/// (which ledgers a session owns; a build without it leaves a deleted session's ledgers
/// behind, as builds before it did), `session_activity` (each session's latest activity;
/// a build without it does not move it, and leaves a deleted session's entry behind).
pub(crate) const VERSION: u64 = 5;

/// How a [`RedbStore`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedbOptions {
    /// How hard to work to keep acknowledged writes across a crash.
    pub durability: Durability,
    /// The most writes committed in one transaction.
    pub max_batch: usize,
    /// Under `relaxed`, the longest time committed writes wait for a sync to disk.
    pub relaxed_sync_interval: Duration,
    /// redb's page cache size in bytes.
    pub cache_bytes: usize,
}

impl Default for RedbOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Batched,
            max_batch: 512,
            relaxed_sync_interval: Duration::from_millis(100),
            cache_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Turns any redb error into a store error that names the problem.
pub(crate) fn redb_error(error: impl Into<redb::Error>) -> StoreError {
    match error.into() {
        redb::Error::Corrupted(message) => {
            StoreError::Corrupt(format!("the redb file is damaged: {message}"))
        }
        redb::Error::DatabaseAlreadyOpen => {
            StoreError::Io("the redb file is already open exclusively by another process".to_owned())
        }
        redb::Error::UpgradeRequired(version) => StoreError::Corrupt(format!(
            "the redb file uses the old file format {version} and must be upgraded"
        )),
        // Raised by an insert, possibly after the job changed other tables: as a storage
        // failure it abandons the transaction, where a refusal would commit the job's
        // earlier changes. Records are checked against `MAX_RECORD_BYTES`, far below
        // redb's limit, before they reach the writer.
        redb::Error::ValueTooLarge(size) => {
            StoreError::Io(format!("redb refused a value of {size} bytes as too large"))
        }
        other => StoreError::Io(format!("redb failed: {other}")),
    }
}

type Finish = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

/// How a write ended on the writer thread.
enum Outcome {
    /// It succeeded; its changes stand with the transaction.
    Done,
    /// It was refused before it changed anything.
    Refused,
    /// Storage failed while it was changing things: the transaction must be abandoned.
    Poisoned(StoreError),
}

/// The writer's open transaction and what the writer remembers. Dereferences to the
/// transaction.
pub(crate) struct Tx<'a> {
    transaction: &'a WriteTransaction,
    /// What the writer remembers about running turns.
    pub(crate) turns: &'a mut RememberedTurns,
    /// The last event position handed out in this transaction, stored once at commit.
    last_position: Option<u64>,
}

impl Tx<'_> {
    /// Hands out `count` store-wide event positions; returns the first.
    pub(crate) fn allocate_positions(&mut self, count: u64) -> StoreResult<u64> {
        let last = match self.last_position {
            Some(last) => last,
            None => counter(self.transaction, "last_position")?,
        };
        self.last_position = Some(last + count);
        Ok(last + 1)
    }
}

impl Deref for Tx<'_> {
    type Target = WriteTransaction;

    fn deref(&self) -> &WriteTransaction {
        self.transaction
    }
}

trait WriteJob: Send {
    fn run(self: Box<Self>, transaction: &mut Tx<'_>) -> (Outcome, Finish);
    fn fail(self: Box<Self>, error: StoreError);

    /// Whether the job only reads, on a snapshot of its own, outside any write
    /// transaction ([`WriteJob::read`]; see [`RedbStore::read_sized`]).
    fn is_read(&self) -> bool {
        false
    }

    /// Runs a job that [`WriteJob::is_read`] on a snapshot of `database`, and reports;
    /// returns the read's error, if it failed.
    fn read(self: Box<Self>, database: &Database) -> Result<(), StoreError> {
        let _ = database;
        self.fail(StoreError::Io("a write was run as a read".to_owned()));
        Ok(())
    }
}

/// A read handed to the writer thread (see [`RedbStore::read_sized`]).
struct ReadJob<W, R> {
    work: W,
    reply: tokio::sync::oneshot::Sender<StoreResult<R>>,
}

impl<W, R> WriteJob for ReadJob<W, R>
where
    W: FnOnce(&ReadTransaction) -> StoreResult<R> + Send + 'static,
    R: Send + 'static,
{
    fn run(self: Box<Self>, _: &mut Tx<'_>) -> (Outcome, Finish) {
        self.fail(StoreError::Io("a read was run inside a write".to_owned()));
        (Outcome::Refused, Box::new(drop))
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }

    fn is_read(&self) -> bool {
        true
    }

    fn read(self: Box<Self>, database: &Database) -> Result<(), StoreError> {
        let Self { work, reply } = *self;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            database.begin_read().map_err(redb_error).and_then(|transaction| work(&transaction))
        }))
        .unwrap_or_else(|_| Err(StoreError::Io("a read panicked".to_owned())));
        let failed = result.as_ref().err().cloned();
        let _ = reply.send(result);
        failed.map_or(Ok(()), Err)
    }
}

struct TypedJob<W, R> {
    work: W,
    reply: tokio::sync::oneshot::Sender<StoreResult<R>>,
}

impl<W, R> WriteJob for TypedJob<W, R>
where
    W: FnOnce(&mut Tx<'_>) -> StoreResult<R> + Send + 'static,
    R: Send + 'static,
{
    fn run(self: Box<Self>, transaction: &mut Tx<'_>) -> (Outcome, Finish) {
        let Self { work, reply } = *self;
        // Answers the caller if `work` panics (the writer loop catches the panic).
        let reply = handoff::Reply::new(reply);
        let result = work(transaction);
        let outcome = match &result {
            Ok(_) => Outcome::Done,
            // A stored record that does not decode is read before the job changes anything
            // (every job reads and checks first): the job is refused alone.
            Err(error) if agentry_memory::rules::is_damaged_record(error) => Outcome::Refused,
            Err(error @ (StoreError::Io(_) | StoreError::Corrupt(_) | StoreError::Closed)) => {
                Outcome::Poisoned(error.clone())
            }
            Err(_) => Outcome::Refused,
        };
        (outcome, Box::new(move |commit: Result<(), StoreError>| reply.send(commit.and(result))))
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

type Job = Box<dyn WriteJob>;

/// The open database, shared by the writer thread and the reads: `None` while the writer
/// reopens the file after an I/O error (see [`Reopen`]).
type Slot = Arc<RwLock<Option<Arc<Database>>>>;

/// What the writer thread and the reads share to recover from an I/O error. redb answers
/// every call after one with "Previous I/O error occurred. Please close and re-open the
/// database" (a full disk, a file briefly unwritable), so the store does that: the writer
/// thread closes its handle and opens the file again when it next has a job, and the reads
/// go through it meanwhile.
#[derive(Clone)]
struct Reopen {
    slot: Slot,
    /// Set by a read that met such an error: the writer reopens before its next batch.
    broken: Arc<AtomicBool>,
}

impl Reopen {
    /// The database to read from, unless it is to be reopened first.
    fn current(&self) -> Option<Arc<Database>> {
        if self.broken.load(Ordering::Acquire) {
            return None;
        }
        self.slot.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Notes an error of a read: one that needs the file reopened marks the store broken.
    fn note<R>(&self, result: &StoreResult<R>) {
        if let Err(error) = result
            && needs_reopen(error)
        {
            self.broken.store(true, Ordering::Release);
        }
    }
}

/// Whether an error leaves redb's handle unusable until the file is opened again: an I/O
/// error of redb's (after which it answers "Previous I/O error" to everything).
fn needs_reopen(error: &StoreError) -> bool {
    matches!(error, StoreError::Io(message)
        if message.contains("Previous I/O error") || message.contains("redb failed: I/O error"))
}

struct Inner {
    path: PathBuf,
    options: RedbOptions,
    reopen: Reopen,
    writer: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    replies: Replies,
    /// What the writer thread has waiting: whether a small read may run there.
    load: Arc<WriterLoad>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel ends the writer loop after the jobs already queued; waiting
        // for it means the file is closed when the store is dropped.
        self.writer.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A store in one redb file.
#[derive(Clone)]
pub struct RedbStore {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.options.durability)
            .finish_non_exhaustive()
    }
}

/// How long a store's opening waits for another process to finish creating its file.
const CREATION_WAIT: Duration = Duration::from_secs(3);

/// Whether the file may be being created by another process, as far as its first bytes
/// tell: missing, shorter than a magic number, or zeros where redb's magic number goes (redb sizes the file,
/// writes and syncs the header, and writes the magic number last).
fn maybe_unfinished(path: &Path) -> bool {
    use std::io::Read;
    let mut start = [0u8; 9];
    match std::fs::File::open(path) {
        Err(error) => error.kind() == std::io::ErrorKind::NotFound,
        Ok(mut file) => file.read_exact(&mut start).map_or(true, |()| start.iter().all(|byte| *byte == 0)),
    }
}

/// The checks made before redb opens a file (its format, its length, its version), made
/// again while they fail on a file another process may still be creating (one
/// [`maybe_unfinished`] before the checks or after them), [`CREATION_WAIT`] at most:
/// processes opening one new store at once all open it. A file still unfinished then is
/// refused, as one whose creation was cut short.
fn check_before_open(path: &Path, mode: ConcurrencyMode) -> StoreResult<()> {
    let deadline = Instant::now() + CREATION_WAIT;
    loop {
        let before = maybe_unfinished(path);
        let checked =
            agentry_memory::rules::check_store_format(path, agentry_memory::rules::FileFormat::Redb)
                .and_then(|()| check_length(path))
                .and_then(|()| guard_panics(path, || check_existing(path, mode)));
        match checked {
            Err(_) if (before || maybe_unfinished(path)) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            checked => return checked,
        }
    }
}

/// Refuses a redb file shorter than the layout its header records, before redb opens it.
/// redb keeps its file at least that long (it grows the file before the header records a
/// larger layout, and shrinks it only after it records a smaller one), so a shorter file
/// was cut: copied while incomplete, or truncated by hand. redb itself refuses one closed
/// cleanly, but rebuilds the layout of one that needs recovery (a crash, a copy of an open
/// store) from the file's length, and then fails inside, after it has written to it.
fn check_length(path: &Path) -> StoreResult<()> {
    use std::io::Read;
    let Ok(mut file) = std::fs::File::open(path) else { return Ok(()) };
    let length = file.metadata().map_or(0, |metadata| metadata.len());
    let mut header = [0u8; 32];
    let read = file
        .read(&mut header)
        .map_err(|error| StoreError::Io(format!("cannot read {}: {error}", path.display())))?;
    if length == 0 {
        return Ok(());
    }
    let truncated = |needed: u64| {
        StoreError::Corrupt(format!(
            "{} is truncated: its header says {needed} bytes, the file has {length}; restore it from a backup \
             (a copy taken while a server was writing it can be cut short)",
            path.display()
        ))
    };
    if read < header.len() {
        return Err(truncated(header.len() as u64));
    }
    let field = |offset: usize| {
        u64::from(u32::from_le_bytes([
            header[offset],
            header[offset + 1],
            header[offset + 2],
            header[offset + 3],
        ]))
    };
    // The super-header's layout fields (redb's file format): page size, a region's header
    // and data pages, the full regions and the data pages of a trailing partial one.
    let (page, header_pages, data_pages, full, trailing) =
        (field(12), field(16), field(20), field(24), field(28));
    if page == 0 || data_pages == 0 || trailing > data_pages {
        // Not a layout redb writes: redb's own checks name it.
        return Ok(());
    }
    let region = (header_pages + data_pages) * page;
    let trailing_region = if trailing > 0 { (header_pages + trailing) * page } else { 0 };
    let needed = page + full * region + trailing_region;
    if length < needed { Err(truncated(needed)) } else { Ok(()) }
}

/// Runs an open of a file, turning a panic inside redb (a damaged page it trips over) into
/// an error naming the file.
fn guard_panics<T>(path: &Path, open: impl FnOnce() -> StoreResult<T>) -> StoreResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(open)).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        Err(StoreError::Corrupt(format!(
            "{} is damaged: redb stopped reading it ({message}); restore it from a backup",
            path.display()
        )))
    })
}

/// Checks an existing file's schema version and marker through a read-only handle, which
/// never changes the file. A file that needs crash recovery is checked after it is repaired.
fn check_existing(path: &Path, mode: ConcurrencyMode) -> StoreResult<()> {
    let exists = std::fs::metadata(path).map(|metadata| metadata.len() > 0).unwrap_or(false);
    if !exists {
        return Ok(());
    }
    match Database::builder().set_concurrency_mode(mode).open_read_only(path) {
        Ok(database) => check_version(&database.begin_read().map_err(redb_error)?),
        Err(redb::DatabaseError::RepairAborted) => Ok(()),
        Err(error) => Err(redb_error(error)),
    }
}

/// Refuses a store of a newer version, or a redb file that is not an Agentry store.
fn check_version(read: &ReadTransaction) -> StoreResult<()> {
    let version = match read.open_table(META) {
        Ok(meta) => meta.get("schema_version").map_err(redb_error)?.map(|value| value.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(error) => return Err(redb_error(error)),
    };
    let tables = read.list_tables().map_err(redb_error)?.count();
    match version {
        Some(found) if found > VERSION => Err(version_too_new(found)),
        None if tables > 0 => {
            Err(StoreError::Corrupt("the file is a redb database but not an Agentry store".to_owned()))
        }
        _ => Ok(()),
    }
}

/// Refuses to write to a file a newer build migrated past this one's schema while this
/// process had it open.
fn check_not_migrated_past(transaction: &WriteTransaction) -> StoreResult<()> {
    let meta = transaction.open_table(META).map_err(redb_error)?;
    match meta.get("schema_version").map_err(redb_error)?.map(|value| value.value()) {
        Some(found) if found > VERSION => Err(version_too_new(found)),
        _ => Ok(()),
    }
}

fn version_too_new(found: u64) -> StoreError {
    StoreError::VersionTooNew {
        found: u32::try_from(found).unwrap_or(u32::MAX),
        supported: u32::try_from(VERSION).unwrap_or(u32::MAX),
    }
}

/// Checks the version again (a repaired file was not checked before), migrates an older
/// store forward and creates the tables and counters of a new store, in one transaction.
fn prepare(database: &Database) -> StoreResult<()> {
    check_version(&database.begin_read().map_err(redb_error)?)?;
    let write = database.begin_write().map_err(redb_error)?;
    // An error drops the transaction, which aborts it: the file stays as it was.
    migrate(&write)?;
    write.commit().map_err(redb_error)?;
    Ok(())
}

/// [`prepare`]'s changes, in its write transaction. The version is read again under the
/// write lock: another process may have migrated the file to a newer version between the
/// check on a snapshot and this transaction (a rolling upgrade), and stamping the file with
/// this build's version would make later opens of this build accept a newer file.
fn migrate(write: &WriteTransaction) -> StoreResult<()> {
    {
        let version = write
            .open_table(META)
            .map_err(redb_error)?
            .get("schema_version")
            .map_err(redb_error)?
            .map(|value| value.value());
        if let Some(found) = version.filter(|found| *found > VERSION) {
            return Err(version_too_new(found));
        }
        if version == Some(1) {
            ops::migrate_1_to_2(write)?;
        }
        if version.is_some_and(|version| version < 4) {
            ops::index_runs_by_parent(write)?;
        }
        if version.is_some_and(|version| version < 5) {
            ops::index_sessions_by_owner(write)?;
        }
        let mut meta = write.open_table(META).map_err(redb_error)?;
        meta.insert("schema_version", VERSION).map_err(redb_error)?;
        for counter in ["last_token", "last_position", "last_run_order", "last_journal_order", "generation"] {
            if meta.get(counter).map_err(redb_error)?.is_none() {
                meta.insert(counter, 0).map_err(redb_error)?;
            }
        }
    }
    ops::create_tables(write)
}

/// Opens the file read-write (repairing it after a crash) and prepares it ([`prepare`]);
/// a panic inside redb is an error naming the file.
fn open_database(path: &Path, options: &RedbOptions, switch: &SyncSwitch) -> StoreResult<Database> {
    let cannot_open = |error: redb::DatabaseError| match redb_error(error) {
        StoreError::Io(message) => StoreError::Io(format!("cannot open {}: {message}", path.display())),
        other => other,
    };
    let mut builder = Database::builder();
    builder.set_concurrency_mode(ConcurrencyMode::MultiWriter).set_cache_size(options.cache_bytes);
    guard_panics(path, || {
        let database = match options.durability {
            Durability::Strict | Durability::Batched => builder.create(path).map_err(cannot_open)?,
            Durability::Relaxed => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(|error| StoreError::Io(format!("cannot open {}: {error}", path.display())))?;
                let backend = DeferredSyncBackend::new(file, switch.clone()).map_err(cannot_open)?;
                builder.create_with_backend(backend).map_err(cannot_open)?
            }
        };
        prepare(&database)?;
        Ok(database)
    })
}

impl RedbStore {
    /// Opens (creating if needed) the store at `path`.
    ///
    /// Errors: `Io` when the file cannot be created or opened, `OtherBackend` when it is the
    /// other backend's store, `Corrupt` when it is not an Agentry store or is damaged,
    /// `VersionTooNew` when a newer Agentry wrote it.
    pub fn open(path: impl AsRef<Path>, options: RedbOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        agentry_memory::rules::check_store_path(&path)?;
        let mode = ConcurrencyMode::MultiWriter;
        check_before_open(&path, mode)?;
        let switch = SyncSwitch::on();
        let database = open_database(&path, &options, &switch)?;
        let file = agentry_memory::rules::FileIdentity::of(&path)?;
        let reopen = Reopen {
            slot: Arc::new(RwLock::new(Some(Arc::new(database)))),
            broken: Arc::new(AtomicBool::new(false)),
        };
        let (sender, receiver) = mpsc::channel::<Job>();
        let writer = Writer {
            path: path.clone(),
            options: options.clone(),
            switch,
            load: Arc::new(WriterLoad::default()),
            file,
            reopen: reopen.clone(),
        };
        let load = writer.load.clone();
        let thread = std::thread::Builder::new()
            .name("agentry-redb-writer".to_owned())
            .spawn(move || writer.run(&receiver))
            .map_err(|error| StoreError::Io(format!("cannot start the redb writer thread: {error}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                options,
                reopen,
                writer: Some(sender),
                thread: Some(thread),
                replies: Replies::default(),
                load,
            }),
        })
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

    /// Runs a write on the writer thread; resolves once it is committed (or refused). The
    /// write must validate before it changes anything.
    pub(crate) async fn write<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Tx<'_>) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        let _in_flight = self.inner.load.write();
        let (reply, receive) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(TypedJob { work, reply });
        self.inner.writer.as_ref().ok_or(StoreError::Closed)?.send(job).map_err(|_| StoreError::Closed)?;
        self.inner.replies.wait(receive).await?
    }

    /// Runs a read on a snapshot, on a blocking thread.
    pub(crate) async fn read<R: Send + 'static>(
        &self,
        work: impl FnOnce(&ReadTransaction) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        self.read_sized(false, work).await
    }

    /// [`RedbStore::read`]; a `small` read (one record or a handful) runs on the writer
    /// thread when it is free (see [`WriterLoad`]), and otherwise polls for its answer
    /// before it sleeps when no other store call is in flight (see [`Replies::read`]).
    pub(crate) async fn read_sized<R: Send + 'static>(
        &self,
        small: bool,
        work: impl FnOnce(&ReadTransaction) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        self.read_where(small, small, work).await
    }

    /// [`RedbStore::read_sized`], on the writer thread when `on_writer` and it is free (a
    /// short history window, which is not `small`, goes there too).
    pub(crate) async fn read_where<R: Send + 'static>(
        &self,
        on_writer: bool,
        small: bool,
        work: impl FnOnce(&ReadTransaction) -> StoreResult<R> + Send + 'static,
    ) -> StoreResult<R> {
        let (inner, job) = (&self.inner, |work, reply| Box::new(ReadJob { work, reply }) as Job);
        let writer = inner.writer.as_ref();
        let work =
            match handoff::read_on_writer(on_writer, &inner.load, &inner.replies, writer, work, job).await {
                Ok(result) => return result,
                Err(work) => work,
            };
        let Some(database) = inner.reopen.current() else {
            // The file is to be opened again: the writer thread does it, then runs the read.
            let (reply, answer) = tokio::sync::oneshot::channel();
            let writer = inner.writer.as_ref().ok_or(StoreError::Closed)?;
            writer.send(job(work, reply)).map_err(|_| StoreError::Closed)?;
            return inner.replies.wait(answer).await?;
        };
        let reopen = inner.reopen.clone();
        let read = tokio::task::spawn_blocking(move || {
            let result = database.begin_read().map_err(redb_error).and_then(|transaction| work(&transaction));
            // Noted while this read still holds the handle: the writer, which waits for the
            // reads holding it, cannot have opened the file again in between.
            reopen.note(&result);
            result
        });
        self.inner
            .replies
            .read(read, small)
            .await
            .map_err(|error| StoreError::Io(format!("a read task failed: {error}")))?
    }
}

/// Under `batched`, how long a group commit waits for the writers it just acknowledged
/// to come back (see [`GroupCommit`]); small next to the syncs every commit pays.
const BATCHED_LINGER: Duration = Duration::from_micros(200);

/// The writer thread's own: what it opens the file with again after an I/O error.
struct Writer {
    path: PathBuf,
    options: RedbOptions,
    switch: SyncSwitch,
    load: Arc<WriterLoad>,
    file: agentry_memory::rules::FileIdentity,
    reopen: Reopen,
}

/// Why [`Writer::serve`] returned.
enum Ended {
    /// The store was dropped: every handle's channel end is gone.
    Disconnected,
    /// redb's handle is unusable after an I/O error: the file is to be opened again, then
    /// these jobs (taken, not yet run) served.
    Broken(Vec<Job>),
}

impl Writer {
    /// The writer thread: serves jobs, and after an I/O error opens the file again before
    /// it serves the next ones. While it cannot (the disk is still full), each job fails
    /// with the reason, and the next job tries again.
    fn run(self, jobs: &mpsc::Receiver<Job>) {
        let mut pending = Vec::new();
        loop {
            let database = self.reopen.slot.read().unwrap_or_else(PoisonError::into_inner).clone();
            let ended = match database {
                Some(database) => self.serve(&database, jobs, std::mem::take(&mut pending)),
                None => Ended::Broken(std::mem::take(&mut pending)),
            };
            let Ended::Broken(waiting) = ended else { return };
            match self.reopen_file() {
                Ok(()) => pending = waiting,
                Err(error) => {
                    for job in waiting {
                        job.fail(error.clone());
                    }
                    match jobs.recv() {
                        Ok(job) => pending.push(job),
                        Err(_) => return,
                    }
                }
            }
        }
    }

    /// Closes the handle (once the reads holding it are done) and opens the file again;
    /// leaves no handle when that fails.
    fn reopen_file(&self) -> StoreResult<()> {
        let old = self.reopen.slot.write().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(old) = old {
            let held = Arc::downgrade(&old);
            drop(old);
            // A read holds it for one snapshot: redb's file locks go with the last one.
            let until = Instant::now() + Duration::from_secs(5);
            while held.strong_count() > 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        // The file at the path must still be the one this store opened, and whole.
        self.file.check()?;
        check_length(&self.path)?;
        // Under `relaxed` the error may have come with syncs switched off: the repair and
        // the commits acknowledged before the error are synced now.
        self.switch.set(true);
        let database = open_database(&self.path, &self.options, &self.switch)?;
        sync(&database, &self.switch)?;
        *self.reopen.slot.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(database));
        self.reopen.broken.store(false, Ordering::Release);
        Ok(())
    }

    /// Takes the jobs waiting (`pending` first), runs the reads among them first (each on
    /// a snapshot of its own), then the writes in one transaction, commits, and reports to
    /// every write. Under `relaxed`, committed writes wait for a sync to disk about
    /// [`RedbOptions::relaxed_sync_interval`] at most.
    fn serve(&self, database: &Database, jobs: &mpsc::Receiver<Job>, pending: Vec<Job>) -> Ended {
        let Self { options, switch, load, file, reopen, .. } = self;
        write_loop(database, jobs, options, switch, load, file, &reopen.broken, pending)
    }
}

/// [`Writer::serve`].
#[allow(clippy::too_many_arguments, clippy::too_many_lines)]
fn write_loop(
    database: &Database,
    jobs: &mpsc::Receiver<Job>,
    options: &RedbOptions,
    switch: &SyncSwitch,
    load: &WriterLoad,
    file: &agentry_memory::rules::FileIdentity,
    broken: &AtomicBool,
    mut pending: Vec<Job>,
) -> Ended {
    // Set by an error that leaves redb's handle unusable: the next batch waits for the
    // file to be opened again.
    let failed = std::cell::Cell::new(false);
    let note = |error: &StoreError| {
        if needs_reopen(error) {
            failed.set(true);
            // Reads come here from now on, not to the unusable handle.
            broken.store(true, Ordering::Release);
        }
    };
    let (max_batch, linger) = match options.durability {
        Durability::Strict => (1, Duration::ZERO),
        Durability::Batched => (options.max_batch.max(1), BATCHED_LINGER),
        Durability::Relaxed => (options.max_batch.max(1), Duration::ZERO),
    };
    let relaxed = options.durability == Durability::Relaxed;
    let mut last_sync = Instant::now();
    let mut unsynced = false;
    let mut turns = RememberedTurns::default();
    let mut seen_generation: Option<u64> = None;
    let mut gather = GroupCommit::new(max_batch, linger);
    loop {
        // Only commits left unsynced need the writer to wake up without a job: an idle
        // store sleeps (a zero interval syncs every commit, and never waits with zero).
        let wait = (unsynced && !failed.get()).then_some(options.relaxed_sync_interval);
        let batch = if pending.is_empty() {
            match gather.next_batch(jobs, wait) {
                Ok(batch) => batch,
                Err(RecvTimeoutError::Timeout) => {
                    match sync_idle(database, switch, load) {
                        Ok(()) => {
                            unsynced = false;
                            last_sync = Instant::now();
                        }
                        Err(error) => note(&error),
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            std::mem::take(&mut pending)
        };
        if failed.get() || broken.load(Ordering::Acquire) {
            return Ended::Broken(batch);
        }
        let batch = if batch.iter().any(|job| job.is_read()) {
            let (reads, writes): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|job| job.is_read());
            for read in reads {
                if let Err(error) = read.read(database) {
                    note(&error);
                }
            }
            // The handle is unusable: the writes wait for it to be opened again.
            if failed.get() {
                return Ended::Broken(writes);
            }
            if writes.is_empty() {
                // No write committed: the next batch waits for no writers. Reads coming
                // one after another must not put off the sync that is due.
                gather.committed(0, jobs);
                if unsynced
                    && last_sync.elapsed() >= options.relaxed_sync_interval
                    && sync_idle(database, switch, load).is_ok()
                {
                    unsynced = false;
                    last_sync = Instant::now();
                }
                continue;
            }
            writes
        } else {
            batch
        };
        // redb writes through the handle it holds: to a file removed or replaced since,
        // which no later open reads (SQLite refuses such writes itself).
        if let Err(error) = file.check() {
            for job in batch {
                job.fail(error.clone());
            }
            continue;
        }
        let size = batch.len();
        // Every commit is `Immediate`, so it leaves the process; under `relaxed` the switch
        // skips the sync except once per interval. It is set before the transaction
        // begins, which may itself sync.
        let durable = !relaxed || last_sync.elapsed() >= options.relaxed_sync_interval;
        switch.set(durable);
        let mut transaction = match database.begin_write() {
            Ok(transaction) => transaction,
            Err(error) => {
                let error = redb_error(error);
                note(&error);
                for job in batch {
                    job.fail(error.clone());
                }
                continue;
            }
        };
        if let Err(error) = transaction.set_durability(redb::Durability::Immediate) {
            let error = StoreError::Io(format!("redb refused the durability level: {error}"));
            for job in batch {
                job.fail(error.clone());
            }
            continue;
        }
        transaction.set_quick_repair(true);
        let generation = match counter(&transaction, "generation") {
            Ok(generation) => generation,
            Err(error) => {
                note(&error);
                for job in batch {
                    job.fail(error.clone());
                }
                continue;
            }
        };
        // Another process wrote since this writer's last transaction: what it remembers
        // may be stale, and a newer build may have migrated the file past this one's schema
        // (its indexes would not be kept up to date): then this process writes no more.
        if seen_generation != Some(generation) {
            turns.forget_all();
            if let Err(error) = check_not_migrated_past(&transaction) {
                let _ = transaction.abort();
                for job in batch {
                    job.fail(error.clone());
                }
                continue;
            }
        }
        seen_generation = None;
        let mut tx = Tx { transaction: &transaction, turns: &mut turns, last_position: None };
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        let mut poisoned: Option<StoreError> = None;
        let mut jobs_left = batch.into_iter();
        for job in jobs_left.by_ref() {
            let Ok((outcome, finish)) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&mut tx)))
            else {
                poisoned = Some(handoff::write_panicked());
                break;
            };
            match outcome {
                Outcome::Done => {
                    tx.turns.write_done();
                    finishes.push(finish);
                }
                Outcome::Refused => {
                    // A refused job changed nothing, so neither does what it remembered.
                    // Its refusal is answered after the commit: it may rest on what a job
                    // before it in this batch wrote, which a caller told of it must be able
                    // to read, and which a failed commit undoes.
                    tx.turns.write_undone();
                    finishes.push(finish);
                }
                Outcome::Poisoned(error) => {
                    finish(Ok(()));
                    poisoned = Some(error);
                    break;
                }
            }
        }
        if poisoned.is_none() {
            let last_position = tx.last_position;
            let counters = last_position
                .map_or(Ok(()), |last| set_counter(&transaction, "last_position", last))
                .and_then(|()| set_counter(&transaction, "generation", generation + 1));
            poisoned = counters.err();
        }
        if let Some(error) = poisoned {
            note(&error);
            turns.forget_all();
            let _ = transaction.abort();
            for finish in finishes {
                finish(Err(error.clone()));
            }
            for job in jobs_left {
                job.fail(error.clone());
            }
            continue;
        }
        let committed = transaction.commit().map_err(redb_error);
        gather.committed(size, jobs);
        if committed.is_ok() {
            seen_generation = Some(generation + 1);
            if durable {
                last_sync = Instant::now();
                unsynced = false;
            } else {
                unsynced = true;
            }
        } else {
            turns.forget_all();
        }
        if let Err(error) = &committed {
            note(error);
        }
        for finish in finishes {
            finish(committed.clone());
        }
    }
    if unsynced {
        let _ = sync(database, switch);
    }
    switch.set(true);
    Ended::Disconnected
}

/// [`sync`] while no write waits: counted as one, so that no read is sent to wait
/// behind it.
fn sync_idle(database: &Database, switch: &SyncSwitch, load: &WriterLoad) -> StoreResult<()> {
    let _busy = load.write();
    sync(database, switch)
}

/// Syncs every earlier commit to disk with an empty commit whose sync goes through.
fn sync(database: &Database, switch: &SyncSwitch) -> StoreResult<()> {
    switch.set(true);
    let mut transaction = database.begin_write().map_err(redb_error)?;
    transaction
        .set_durability(redb::Durability::Immediate)
        .map_err(|error| StoreError::Io(error.to_string()))?;
    // Like every other commit, keep the allocator state so a crash needs no full repair.
    transaction.set_quick_repair(true);
    transaction.commit().map_err(redb_error)
}

/// Reads a counter.
pub(crate) fn counter(transaction: &WriteTransaction, name: &str) -> StoreResult<u64> {
    let meta = transaction.open_table(META).map_err(redb_error)?;
    let value = meta.get(name).map_err(redb_error)?.map_or(0, |value| value.value());
    Ok(value)
}

/// Sets a counter.
pub(crate) fn set_counter(transaction: &WriteTransaction, name: &str, value: u64) -> StoreResult<()> {
    let mut meta = transaction.open_table(META).map_err(redb_error)?;
    meta.insert(name, value).map_err(redb_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    use agentry_memory::handoff::{self, WriterLoad};
    use agentry_memory::{StoreError, StoreResult};
    use redb::{Database, ReadTransaction, ReadableDatabase, ReadableTableMetadata, TableDefinition};
    use tokio::sync::oneshot;

    use super::{Job, META, ReadJob, RedbOptions, TypedJob, VERSION, migrate, prepare, write_loop};
    use crate::backend::SyncSwitch;

    const ROWS: TableDefinition<'_, u64, u64> = TableDefinition::new("test_rows");

    fn count(transaction: &ReadTransaction) -> StoreResult<u64> {
        Ok(transaction.open_table(ROWS).unwrap().len().unwrap())
    }

    /// Runs the write loop on `database` until the queue's senders are gone.
    fn serve(database: &Database, queue: &mpsc::Receiver<Job>, file: &agentry_memory::rules::FileIdentity) {
        let options = RedbOptions { max_batch: 4, ..RedbOptions::default() };
        let (broken, load) = (AtomicBool::new(false), WriterLoad::default());
        write_loop(database, queue, &options, &SyncSwitch::on(), &load, file, &broken, Vec::new());
    }

    fn read(jobs: &mpsc::Sender<Job>) -> oneshot::Receiver<StoreResult<u64>> {
        let (reply, answer) = oneshot::channel();
        jobs.send(Box::new(ReadJob { work: count, reply })).unwrap();
        answer
    }

    fn insert(jobs: &mpsc::Sender<Job>, key: u64, refuse: bool) -> oneshot::Receiver<StoreResult<()>> {
        let (reply, answer) = oneshot::channel();
        let work = move |tx: &mut super::Tx<'_>| {
            if refuse {
                return Err(StoreError::InvalidInput("refused".to_owned()));
            }
            tx.open_table(ROWS).unwrap().insert(key, key).unwrap();
            Ok(())
        };
        jobs.send(Box::new(TypedJob { work, reply })).unwrap();
        answer
    }

    #[test]
    fn reads_in_a_batch_run_first_on_their_own_snapshot_and_see_only_what_is_committed() {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::create(dir.path().join("store.redb")).unwrap();
        let file = agentry_memory::rules::FileIdentity::of(&dir.path().join("store.redb")).unwrap();
        prepare(&database).unwrap();
        let write = database.begin_write().unwrap();
        write.open_table(ROWS).unwrap().insert(0, 0).unwrap();
        write.commit().unwrap();
        let (jobs, queue) = mpsc::channel::<Job>();
        // One batch: an accepted write, a read, a refused write, a read; then a batch of
        // reads alone. The queue is full before the loop starts, so each batch is as sent.
        let accepted = insert(&jobs, 1, false);
        let first = read(&jobs);
        let refused = insert(&jobs, 2, true);
        let second = read(&jobs);
        let writer = std::thread::spawn(move || serve(&database, &queue, &file));
        let (accepted, first, refused, second) = (
            accepted.blocking_recv().unwrap(),
            first.blocking_recv().unwrap(),
            refused.blocking_recv().unwrap(),
            second.blocking_recv().unwrap(),
        );
        let alone = (read(&jobs), read(&jobs));
        let (third, fourth) = (alone.0.blocking_recv().unwrap(), alone.1.blocking_recv().unwrap());
        drop(jobs);
        writer.join().unwrap();
        assert_eq!(accepted, Ok(()));
        assert!(matches!(refused, Err(StoreError::InvalidInput(_))));
        // The reads ran before the batch's writes: the row of neither is seen.
        assert_eq!((first, second), (Ok(1), Ok(1)));
        // Later reads see the accepted write.
        assert_eq!((third, fourth), (Ok(2), Ok(2)));
    }

    #[test]
    fn a_write_that_panics_fails_its_batch_and_its_caller_hears_why() {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::create(dir.path().join("store.redb")).unwrap();
        let file = agentry_memory::rules::FileIdentity::of(&dir.path().join("store.redb")).unwrap();
        prepare(&database).unwrap();
        let (jobs, queue) = mpsc::channel::<Job>();
        // One batch: an accepted write, then one whose work panics after it changed a row.
        let accepted = insert(&jobs, 1, false);
        let (reply, panicked) = oneshot::channel::<StoreResult<()>>();
        let work = |tx: &mut super::Tx<'_>| -> StoreResult<()> {
            tx.open_table(ROWS).unwrap().insert(2, 2).unwrap();
            panic!("a bug in a write");
        };
        jobs.send(Box::new(TypedJob { work, reply })).unwrap();
        let writer = std::thread::spawn(move || serve(&database, &queue, &file));
        let (accepted, panicked) = (accepted.blocking_recv().unwrap(), panicked.blocking_recv().unwrap());
        // The writer goes on.
        let later = insert(&jobs, 3, false).blocking_recv().unwrap();
        let rows = read(&jobs).blocking_recv().unwrap();
        drop(jobs);
        writer.join().unwrap();
        // Not `Closed`, which would tell the caller the store is closing.
        assert_eq!(panicked, Err(handoff::write_panicked()));
        assert_eq!(accepted, Err(handoff::write_panicked()), "its batch is abandoned");
        assert_eq!(later, Ok(()));
        assert_eq!(rows, Ok(1), "the later write's row only");
    }

    /// A writer whose file a newer build migrated past this one's schema while it was open
    /// writes no more: its indexes would not be kept up to date.
    #[test]
    fn a_writer_stops_once_another_process_migrated_the_file_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let database = std::sync::Arc::new(Database::create(dir.path().join("store.redb")).unwrap());
        let file = agentry_memory::rules::FileIdentity::of(&dir.path().join("store.redb")).unwrap();
        prepare(&database).unwrap();
        let (jobs, queue) = mpsc::channel::<Job>();
        let writer_database = database.clone();
        let writer = std::thread::spawn(move || serve(&writer_database, &queue, &file));
        assert_eq!(insert(&jobs, 1, false).blocking_recv().unwrap(), Ok(()));
        // Another process migrates the file (its write moves the generation on).
        let newer = database.begin_write().unwrap();
        let generation = super::counter(&newer, "generation").unwrap();
        super::set_counter(&newer, "generation", generation + 1).unwrap();
        newer.open_table(META).unwrap().insert("schema_version", VERSION + 1).unwrap();
        newer.commit().unwrap();
        let refused = insert(&jobs, 2, false).blocking_recv().unwrap();
        assert!(
            matches!(refused, Err(StoreError::VersionTooNew { found, .. }) if u64::from(found) == VERSION + 1),
            "{refused:?}"
        );
        drop(jobs);
        writer.join().unwrap();
        assert_eq!(count(&database.begin_read().unwrap()), Ok(1), "the write before the migration only");
    }

    #[test]
    fn a_file_another_process_migrated_past_this_build_is_refused_and_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let database = Database::create(dir.path().join("store.redb")).unwrap();
        prepare(&database).unwrap();
        // A newer build migrates the file after this one checked its snapshot and before
        // it took the write lock.
        let newer = database.begin_write().unwrap();
        newer.open_table(META).unwrap().insert("schema_version", VERSION + 1).unwrap();
        newer.commit().unwrap();
        let write = database.begin_write().unwrap();
        let refused = migrate(&write);
        drop(write);
        assert!(
            matches!(refused, Err(StoreError::VersionTooNew { found, .. }) if u64::from(found) == VERSION + 1),
            "{refused:?}"
        );
        let read = database.begin_read().unwrap();
        let stamped =
            read.open_table(META).unwrap().get("schema_version").unwrap().map(|value| value.value());
        assert_eq!(stamped, Some(VERSION + 1), "the newer version stays");
    }
}
