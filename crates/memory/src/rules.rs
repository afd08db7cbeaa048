//! The rules every backend applies the same way: record encoding and size limits, event
//! batch checks, fencing, leases, budgets, the journal and history windows. Backends call
//! these inside their transactions so that all of them behave identically.

use std::time::Duration;

use agentry_events::{EventEnvelope, EventPayload, TeamContext};
use agentry_types::{
    BudgetLimit, BudgetUsage, Fence, HistoryMessage, JournalEntry, Lease, Role, RunRecord, RunStatus,
    SessionId, ThreadId, Timestamp, ToolResult, TurnId, UserProfile,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Conflict, StoreError, StoreResult};
use crate::json_bound::json_len_and_depth;
use crate::store::{HistoryQuery, MAX_RECORD_BYTES, TurnStart, TurnStep};

/// The deepest nesting (arrays and objects inside one another) a JSON record may have:
/// `serde_json` reads no deeper, so a deeper record would be stored and never read back.
/// A JSON document a client sent fits as long as the record keeps its values no deeper
/// than the request held them (every route does).
pub const MAX_RECORD_NESTING: usize = 127;

/// Serializes a record as JSON, refusing one larger than [`MAX_RECORD_BYTES`]
/// (`TooLarge`) or nested more than [`MAX_RECORD_NESTING`] levels deep (`InvalidInput`).
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> StoreResult<Vec<u8>> {
    let mut bytes = Vec::new();
    let deepest = write_json(what, &mut bytes, value)?;
    check_nesting(what, deepest, MAX_RECORD_NESTING)?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(StoreError::TooLarge { what, size: bytes.len(), limit: MAX_RECORD_BYTES });
    }
    Ok(bytes)
}

/// Refuses a patch for [`UserStore::merge_profile`](crate::UserStore::merge_profile)
/// whose profile is not a JSON object. Errors: `InvalidInput`.
pub fn check_profile_patch(patch: &UserProfile) -> StoreResult<()> {
    let kind = match &patch.profile {
        serde_json::Value::Object(_) => return Ok(()),
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
    };
    Err(StoreError::InvalidInput(format!("a profile patch is a JSON object of fields, not {kind}")))
}

/// The profile [`UserStore::merge_profile`](crate::UserStore::merge_profile) stores:
/// `patch`'s fields over `current`'s when `current` is a JSON object, `patch` alone
/// otherwise; updated at the later of the two times (merges landing out of the order of
/// their times never move it back).
#[must_use]
pub fn merged_profile(current: Option<UserProfile>, patch: &UserProfile) -> UserProfile {
    let updated_at =
        current.as_ref().map_or(patch.updated_at, |current| current.updated_at.max(patch.updated_at));
    let profile = match (current.map(|current| current.profile), &patch.profile) {
        (Some(serde_json::Value::Object(mut stored)), serde_json::Value::Object(fields)) => {
            stored.extend(fields.iter().map(|(key, value)| (key.clone(), value.clone())));
            serde_json::Value::Object(stored)
        }
        _ => patch.profile.clone(),
    };
    UserProfile { user_id: patch.user_id.clone(), profile, updated_at }
}

/// Checks that a record serializes within [`MAX_RECORD_BYTES`] and [`MAX_RECORD_NESTING`],
/// as [`encode`] does, without keeping the bytes (for stores that keep records as values).
pub fn check_size<T: Serialize>(what: &'static str, value: &T) -> StoreResult<()> {
    check_size_within(what, value, MAX_RECORD_BYTES)
}

/// As [`check_size`], against a `limit` of the caller's (below [`MAX_RECORD_BYTES`] to
/// leave room for what the record will gain before it is next stored).
pub fn check_size_within<T: Serialize>(what: &'static str, value: &T, limit: usize) -> StoreResult<()> {
    if let Some((bound, deepest)) = json_len_and_depth(value) {
        check_nesting(what, deepest, MAX_RECORD_NESTING)?;
        if bound <= limit {
            return Ok(());
        }
    }
    let mut counter = ByteCounter(0);
    let deepest = write_json(what, &mut counter, value)?;
    check_nesting(what, deepest, MAX_RECORD_NESTING)?;
    if counter.0 > limit {
        return Err(StoreError::TooLarge { what, size: counter.0, limit });
    }
    Ok(())
}

/// Refuses a record (or an event's payload) that nests deeper than `limit` levels.
fn check_nesting(what: &'static str, deepest: usize, limit: usize) -> StoreResult<()> {
    if deepest > limit {
        return Err(StoreError::InvalidInput(format!(
            "the {what} nests {deepest} levels deep; at most {limit} are stored"
        )));
    }
    Ok(())
}

/// Writes `value` as compact JSON and returns how deeply it nests (what
/// [`json_len_and_depth`] gives too, where that gives anything).
fn write_json<W: std::io::Write, T: Serialize>(
    what: &'static str,
    writer: W,
    value: &T,
) -> StoreResult<usize> {
    let mut deepest = 0;
    let formatter = DepthFormatter { depth: 0, deepest: &mut deepest };
    value
        .serialize(&mut serde_json::Serializer::with_formatter(writer, formatter))
        .map_err(|error| StoreError::InvalidInput(format!("{what} cannot be serialized: {error}")))?;
    Ok(deepest)
}

/// `serde_json`'s compact output, counting how deeply arrays and objects nest.
struct DepthFormatter<'a> {
    depth: usize,
    deepest: &'a mut usize,
}

impl DepthFormatter<'_> {
    fn open<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.depth += 1;
        *self.deepest = (*self.deepest).max(self.depth);
        writer.write_all(bracket)
    }

    fn close<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, bracket: &[u8]) -> std::io::Result<()> {
        self.depth = self.depth.saturating_sub(1);
        writer.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for DepthFormatter<'_> {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"}")
    }
}

/// Counts what is written to it.
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Checks that an event can be stored, the same in every store: `TooLarge` when its payload
/// and team context as JSON, with a fixed allowance for the envelope's other fields, pass
/// [`MAX_RECORD_BYTES`]; `InvalidInput` when either nests more than 150 levels deep (a
/// stored event could not be read back). Its payload and team context are what can grow.
pub fn check_event_size(event: &EventEnvelope) -> StoreResult<()> {
    check_payload_size(&event.payload, event.team.as_ref(), event.thread_id.as_ref())
}

/// [`check_event_size`] before the event exists: a sequencer checks what it is about to
/// number, so a refused event leaves no gap in the numbers.
pub fn check_payload_size(
    payload: &EventPayload,
    team: Option<&TeamContext>,
    thread: Option<&ThreadId>,
) -> StoreResult<()> {
    // The envelope's fixed fields and the thread id; the payload and team context vary.
    let fixed = 80 + thread.map_or(0, |thread| thread.as_str().len());
    let payload_shape = json_len_and_depth(payload);
    let team_shape = team.map_or(Some((0, 0)), json_len_and_depth);
    if let Some(((payload, payload_depth), (team, team_depth))) = payload_shape.zip(team_shape) {
        check_nesting("event's payload", payload_depth.max(team_depth), MAX_EVENT_NESTING)?;
        if fixed + payload + team <= MAX_RECORD_BYTES {
            return Ok(());
        }
    }
    // Measured exactly: near the limit, or a value the bound gives up on.
    let mut counter = ByteCounter(fixed);
    let mut deepest = write_json("event", &mut counter, payload)?;
    if let Some(team) = team {
        deepest = deepest.max(write_json("event", &mut counter, team)?);
    }
    check_nesting("event's payload", deepest, MAX_EVENT_NESTING)?;
    if counter.0 > MAX_RECORD_BYTES {
        return Err(StoreError::TooLarge { what: "event", size: counter.0, limit: MAX_RECORD_BYTES });
    }
    Ok(())
}

/// The file formats a store file may be in, known by their first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// A SQLite database (`SQLite format 3\0`).
    Sqlite,
    /// A redb database (redb's magic number).
    Redb,
}

impl FileFormat {
    /// The backend's name, as a configuration names it.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Redb => "redb",
        }
    }

    /// The format's name with its article, as a sentence says it.
    const fn spoken(self) -> &'static str {
        match self {
            Self::Sqlite => "an SQLite",
            Self::Redb => "a redb",
        }
    }

    /// The format of the file at `path` by its first bytes; `None` when it is missing,
    /// empty, unreadable or of neither format.
    #[must_use]
    pub fn of(path: &std::path::Path) -> Option<Self> {
        use std::io::Read as _;
        let mut head = [0_u8; 16];
        let mut file = std::fs::File::open(path).ok()?;
        let read = file.read(&mut head).ok()?;
        let head = &head[..read];
        if head.starts_with(b"SQLite format 3\0") {
            Some(Self::Sqlite)
        } else if head.starts_with(&[b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A]) {
            Some(Self::Redb)
        } else {
            None
        }
    }
}

/// Refuses a non-empty file at `path` that is not in `format` before a backend opens it:
/// one in the other backend's format is named as such, and the backend to open it with.
/// Errors: `OtherBackend` for the other backend's file, `Corrupt` for anything else.
pub fn check_store_format(path: &std::path::Path, format: FileFormat) -> StoreResult<()> {
    if std::fs::metadata(path).map_or(true, |metadata| metadata.len() == 0) {
        return Ok(());
    }
    match FileFormat::of(path) {
        Some(found) if found == format => Ok(()),
        Some(found) => Err(StoreError::OtherBackend(format!(
            "{} is {} database, not {} one: open it with the {} backend (`backend = \"{}\"`)",
            path.display(),
            found.spoken(),
            format.spoken(),
            found.name(),
            found.name()
        ))),
        None => Err(StoreError::Corrupt(format!(
            "{} is not {} database: its first bytes are not {}'s",
            path.display(),
            format.spoken(),
            format.name()
        ))),
    }
}

/// Refuses a store path no file can be opened or created at, before anything is touched:
/// a directory, or a file whose directory does not exist. Errors: `Io`, naming the path.
pub fn check_store_path(path: &std::path::Path) -> StoreResult<()> {
    if path.as_os_str().is_empty() {
        return Err(StoreError::Io("the store path is empty: name the file to open or create".to_owned()));
    }
    if path.to_str().is_some_and(|path| path.trim().is_empty()) {
        return Err(StoreError::Io(format!(
            "the store path {:?} is only whitespace: name the file to open or create",
            path.display().to_string()
        )));
    }
    if path.is_dir() {
        return Err(StoreError::Io(format!("cannot open {}: it is a directory", path.display())));
    }
    match path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        Some(parent) if !parent.is_dir() => Err(StoreError::Io(format!(
            "cannot create {}: {} {}",
            path.display(),
            parent.display(),
            if parent.exists() {
                "is not a directory"
            } else {
                "does not exist (create the directory first)"
            }
        ))),
        _ => Ok(()),
    }
}

/// The identity of the file a store opened: a file removed (or replaced by another) while
/// the store is open still takes its writes, through the handle the store holds, and no
/// later open reads them. A backend checks it before each write transaction and refuses
/// the writes then, as SQLite itself does (`SQLITE_READONLY_DBMOVED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIdentity {
    path: std::path::PathBuf,
    /// Device and inode; `None` where files have no identity to compare (not Unix).
    identity: Option<(u64, u64)>,
}

impl FileIdentity {
    /// The file at `path` now.
    ///
    /// # Errors
    /// `Io` when it cannot be read (it does not exist, or its directory is not readable).
    pub fn of(path: &std::path::Path) -> StoreResult<Self> {
        // Made absolute now: a program that changes its working directory later still
        // checks the file it opened.
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let identity = Self::read(&path)
            .map_err(|error| StoreError::Io(format!("cannot read {}: {error}", path.display())))?;
        Ok(Self { path, identity })
    }

    #[cfg(unix)]
    fn read(path: &std::path::Path) -> std::io::Result<Option<(u64, u64)>> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).map(|meta| Some((meta.dev(), meta.ino())))
    }

    #[cfg(not(unix))]
    fn read(path: &std::path::Path) -> std::io::Result<Option<(u64, u64)>> {
        std::fs::metadata(path).map(|_| None)
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Whether the path still names the file opened.
    ///
    /// # Errors
    /// `Io` saying whether the file was removed or replaced: what is written to it now
    /// would be lost.
    pub fn check(&self) -> StoreResult<()> {
        let now = Self::read(&self.path);
        match now {
            Ok(identity) if identity == self.identity => Ok(()),
            Ok(_) => Err(StoreError::Io(format!(
                "the store file {} was replaced by another file since the store opened it: writes are \
                 refused, since they would go to the old file and be lost; put the old file back to go on, \
                 or reopen the store (restart) to use the new one",
                self.path.display()
            ))),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Err(StoreError::Io(format!(
                "the store file {} was removed since the store opened it: writes are refused, since \
                 they would be lost; put the file back to go on (reopening now starts an empty store)",
                self.path.display()
            ))),
            // Not knowing is not a reason to refuse: the file is most likely still there.
            Err(_) => Ok(()),
        }
    }
}

/// Reads a stored record; a record that does not parse means the store is corrupt.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes)
        .map_err(|error| StoreError::Corrupt(format!("{DAMAGED_RECORD}{what} does not parse: {error}")))
}

/// How the error of a stored record that does not decode begins ([`decode`],
/// [`decode_event`]).
const DAMAGED_RECORD: &str = "a stored ";

/// Whether `error` is about one stored record that does not decode, as opposed to a store
/// whose file is damaged or failing: a write job that reads such a record before changing
/// anything is refused alone, and its batch-mates still commit.
#[must_use]
pub fn is_damaged_record(error: &StoreError) -> bool {
    matches!(error, StoreError::Corrupt(message) if message.starts_with(DAMAGED_RECORD))
}

/// The first byte of a stored event in format 1, which earlier builds wrote (see
/// [`EVENT_FORMAT`]); still read.
const EVENT_FORMAT_JSON: u8 = 1;

/// The first byte of a stored event: the format of what follows. Both formats share the
/// binary header; they differ in how the team context and the payload are written.
/// - Format 1 wrote them as JSON. Stores written before format 2 hold it, so it is still
///   read.
/// - Format 2, written now, uses MessagePack with named fields, in the form a type takes
///   in JSON (human-readable: ids as strings). Decoding it takes about half the time
///   JSON does: lengths come first, so nothing is scanned for escapes or ends.
const EVENT_FORMAT: u8 = 2;

/// The deepest nesting (arrays and objects inside one another, enum variants' wrapping
/// objects counted) an event's payload or team context may have to be stored: a JSON value
/// `serde_json` parsed (at most 127 deep) fits inside the payload's own levels. Deeper
/// events are refused when they are written ([`check_payload_size`]), so that every
/// stored event reads back.
const MAX_EVENT_NESTING: usize = 150;

/// The deepest nesting a stored event's payload may have when it is read: above
/// [`MAX_EVENT_NESTING`] (MessagePack's decoder counts a little differently), and shallow
/// enough that decoding cannot run out of stack.
const MAX_DEPTH: usize = 160;

/// Encodes a durable event for storage: a fixed binary header (format, ids, seq, time,
/// version, thread) followed by the team context and the payload in MessagePack, with
/// named fields and the forms the types take in JSON. Replaying a turn decodes every
/// event; the header decodes without parsing anything, and the MessagePack in about half
/// the time JSON takes. Stored events of format 1 (JSON payloads, written by earlier
/// builds) still read.
///
/// Events are refused as every store refuses them ([`check_event_size`]): as too large
/// when their payload and team context as JSON, with a fixed allowance for the envelope,
/// pass [`MAX_RECORD_BYTES`]; as invalid when they nest deeper than stored events are read.
pub fn encode_event(event: &EventEnvelope) -> StoreResult<Vec<u8>> {
    check_event_size(event)?;
    let thread = event.thread_id.as_ref().map(agentry_types::ThreadId::as_str).unwrap_or_default();
    let thread_len = u16::try_from(thread.len())
        .map_err(|_| StoreError::InvalidInput("a thread id is longer than 65535 bytes".to_owned()))?;
    let mut bytes = Vec::with_capacity(256 + thread.len());
    bytes.push(EVENT_FORMAT);
    bytes.extend_from_slice(event.event_id.as_uuid().as_bytes());
    bytes.extend_from_slice(event.session_id.as_uuid().as_bytes());
    bytes.extend_from_slice(event.turn_id.as_uuid().as_bytes());
    bytes.extend_from_slice(&event.seq.to_le_bytes());
    bytes.extend_from_slice(&event.created_at.unix_micros().to_le_bytes());
    bytes.extend_from_slice(&event.schema_version.to_le_bytes());
    bytes.push(u8::from(event.thread_id.is_some()));
    bytes.extend_from_slice(&thread_len.to_le_bytes());
    bytes.extend_from_slice(thread.as_bytes());
    // The team context's length goes before it, once it is known.
    let team_at = bytes.len();
    bytes.extend_from_slice(&[0; 4]);
    if let Some(team) = &event.team {
        pack(&mut bytes, team)?;
    }
    let team_len = u32::try_from(bytes.len() - team_at - 4)
        .map_err(|_| StoreError::InvalidInput("an event's team context is larger than 4 GiB".to_owned()))?;
    bytes[team_at..team_at + 4].copy_from_slice(&team_len.to_le_bytes());
    pack(&mut bytes, &event.payload)?;
    Ok(bytes)
}

/// Appends `value` to `bytes` in MessagePack, as [`EVENT_FORMAT`] writes it.
fn pack<T: Serialize>(bytes: &mut Vec<u8>, value: &T) -> StoreResult<()> {
    let mut serializer = rmp_serde::Serializer::new(bytes).with_struct_map().with_human_readable();
    value
        .serialize(&mut serializer)
        .map_err(|error| StoreError::InvalidInput(format!("event cannot be serialized: {error}")))
}

/// Reads a value [`pack`] wrote, which must fill `bytes`; anything else means corruption.
///
/// MessagePack frames itself: a value cut short fails. The decoder does not say where it
/// stopped, so bytes after a whole value are found by asking it for one more value (see
/// [`NothingAfter`]). The header's lengths frame the team context; the payload is the rest.
fn unpack<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> StoreResult<T> {
    let mut deserializer = rmp_serde::Deserializer::from_read_ref(bytes).with_human_readable();
    deserializer.set_max_depth(MAX_DEPTH);
    let value = T::deserialize(&mut deserializer)
        .map_err(|error| StoreError::Corrupt(format!("a stored {what} does not parse: {error}")))?;
    match serde::Deserializer::deserialize_any(&mut deserializer, NothingAfter) {
        Err(rmp_serde::decode::Error::InvalidMarkerRead(error))
            if error.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            Ok(value)
        }
        _ => Err(StoreError::Corrupt(format!("a stored {what} has bytes after its end"))),
    }
}

/// Reads what follows a whole value, to prove there is nothing: the decoder fails with
/// `InvalidMarkerRead` of an unexpected end only when the next marker is missing. Every
/// read after a marker that is there fails otherwise (a missing length or datum is an
/// `InvalidDataRead`), or reaches this visitor, which refuses any value. An array or a map
/// is refused before its first item is read, so that an item cut short (whose marker read
/// would fail the same way) cannot pass for the end.
struct NothingAfter;

impl<'de> serde::de::Visitor<'de> for NothingAfter {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("nothing")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(serde::de::Error::custom("an array"))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(serde::de::Error::custom("a map"))
    }
}

/// Decodes a stored event written by [`encode_event`], in either format; anything else
/// means corruption.
pub fn decode_event(bytes: &[u8]) -> StoreResult<EventEnvelope> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("{DAMAGED_RECORD}event is damaged: {what}"));
    let mut reader = Reader { bytes, at: 0 };
    let format = reader.take(1).ok_or_else(|| corrupt("empty"))?[0];
    if format != EVENT_FORMAT && format != EVENT_FORMAT_JSON {
        return Err(corrupt("unknown format"));
    }
    let uuid = |reader: &mut Reader<'_>| {
        reader.array::<16>().map(uuid::Uuid::from_bytes).ok_or_else(|| corrupt("truncated header"))
    };
    let event_id = agentry_types::EventId::from_uuid(uuid(&mut reader)?);
    let session_id = SessionId::from_uuid(uuid(&mut reader)?);
    let turn_id = TurnId::from_uuid(uuid(&mut reader)?);
    let seq = u64::from_le_bytes(reader.array().ok_or_else(|| corrupt("truncated header"))?);
    let created_at = Timestamp::from_unix_micros(i64::from_le_bytes(
        reader.array().ok_or_else(|| corrupt("truncated header"))?,
    ));
    let schema_version = u32::from_le_bytes(reader.array().ok_or_else(|| corrupt("truncated header"))?);
    let has_thread = reader.take(1).ok_or_else(|| corrupt("truncated header"))?[0] == 1;
    let thread_len = u16::from_le_bytes(reader.array().ok_or_else(|| corrupt("truncated header"))?);
    let thread = reader.take(usize::from(thread_len)).ok_or_else(|| corrupt("truncated thread"))?;
    let thread_id = if has_thread {
        let text = std::str::from_utf8(thread).map_err(|_| corrupt("thread id is not UTF-8"))?;
        Some(agentry_types::ThreadId::parse(text).map_err(|_| corrupt("empty thread id"))?)
    } else {
        None
    };
    let team_len = u32::from_le_bytes(reader.array().ok_or_else(|| corrupt("truncated header"))?);
    let team = reader
        .take(usize::try_from(team_len).unwrap_or(usize::MAX))
        .ok_or_else(|| corrupt("truncated team"))?;
    let (team, payload) = if format == EVENT_FORMAT {
        let team = if team.is_empty() { None } else { Some(unpack("event team context", team)?) };
        (team, unpack("event payload", reader.rest())?)
    } else {
        let team = if team.is_empty() { None } else { Some(decode("event team context", team)?) };
        (team, decode("event payload", reader.rest())?)
    };
    Ok(EventEnvelope {
        event_id,
        seq,
        session_id,
        turn_id,
        thread_id,
        team,
        created_at,
        schema_version,
        payload,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(count)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes.get(self.at..).unwrap_or_default()
    }
}

/// The largest `seq` (and high-water mark) a store keeps: every backend stores them as
/// signed 64-bit integers somewhere.
pub const MAX_SEQ: u64 = i64::MAX as u64;

/// Refuses a `seq` or mark above [`MAX_SEQ`].
pub fn check_seq(seq: u64) -> StoreResult<()> {
    if seq > MAX_SEQ {
        return Err(StoreError::InvalidInput(format!(
            "seq {seq} is above the largest storable seq {MAX_SEQ}"
        )));
    }
    Ok(())
}

/// A [`TurnStep`] checked and encoded before it reaches a writer thread.
#[derive(Debug)]
pub struct EncodedStep {
    /// The high-water mark to raise to.
    pub high_water: Option<u64>,
    /// The encoded history messages.
    pub messages: Vec<Vec<u8>>,
    /// The encoded events.
    pub events: Vec<Vec<u8>>,
    /// What [`check_event_batch`] needs of each event.
    pub keys: Vec<EventKey>,
    /// The step's journal writes (their sizes checked).
    pub journal: Vec<JournalEntry>,
    /// The run record, encoded.
    pub run: Option<EncodedRun>,
    /// Whether the lease is released after the step.
    pub release_lease: bool,
}

/// The keys a page of a listing reads, in key order: from `low` to `high`, both included,
/// cut at the page's cursor `after` in the listing's direction (`ascending`: the keys above
/// it; otherwise the keys below it). `None` when nothing is left to read.
#[must_use]
pub fn listing_range<K: Ord + Copy>(
    low: K,
    high: K,
    after: Option<K>,
    ascending: bool,
) -> Option<(std::ops::Bound<K>, std::ops::Bound<K>)> {
    use std::ops::Bound;
    let ((mut low, mut low_open), (mut high, mut high_open)) = ((low, false), (high, false));
    match after {
        Some(after) if ascending && after >= low => (low, low_open) = (after, true),
        Some(after) if !ascending && after <= high => (high, high_open) = (after, true),
        _ => {}
    }
    let bound = |key, open| if open { Bound::Excluded(key) } else { Bound::Included(key) };
    (low < high || (low == high && !low_open && !high_open))
        .then(|| (bound(low, low_open), bound(high, high_open)))
}

/// A run record encoded for a backend, with the fields its indexes are keyed by.
#[derive(Debug)]
pub struct EncodedRun {
    /// The run's session.
    pub session_id: SessionId,
    /// The run it is a member run of (`None` for a turn): fixed once stored (see
    /// [`check_run_parent`]), so that members can be listed by parent.
    pub parent_run_id: Option<TurnId>,
    /// When the record was last changed: a turn's moves its session's `updated_at` (see
    /// [`SessionStore::get_session`](crate::SessionStore::get_session)).
    pub updated_at: Timestamp,
    /// The record's encoding ([`encode`]).
    pub body: Vec<u8>,
}

impl EncodedRun {
    /// Encodes a run record.
    ///
    /// # Errors
    /// `TooLarge` or `InvalidInput`, as [`encode`].
    pub fn of(run: &RunRecord) -> StoreResult<Self> {
        Ok(Self {
            session_id: run.session_id,
            parent_run_id: run.parent_run_id,
            updated_at: run.updated_at,
            body: encode("run", run)?,
        })
    }

    /// The time its session shows as its latest activity, for a turn (a member run moves
    /// nothing).
    #[must_use]
    pub fn activity(&self) -> Option<Timestamp> {
        self.parent_run_id.is_none().then_some(self.updated_at)
    }
}

/// A session as read, with the latest activity its store kept beside the record (see
/// [`SessionStore::get_session`](crate::SessionStore::get_session)).
#[must_use]
pub fn with_activity(
    mut session: agentry_types::SessionRecord,
    activity: Option<Timestamp>,
) -> agentry_types::SessionRecord {
    if let Some(activity) = activity {
        session.updated_at = session.updated_at.max(activity);
    }
    session
}

/// Checks what of a step can be checked without the store (seq range, record sizes, the
/// run record being the turn's own, a fence for a release) and encodes it.
///
/// # Errors
/// `InvalidInput` or `TooLarge`, as the methods the step stands for.
pub fn encode_step(turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<EncodedStep> {
    check_step_shape(turn, step, fence)?;
    let messages =
        step.messages.iter().map(|message| encode("message", message)).collect::<StoreResult<_>>()?;
    let events = step.events.iter().map(|event| encode_event(event)).collect::<StoreResult<_>>()?;
    let run = match &step.run {
        Some(run) => Some(EncodedRun::of(run)?),
        None => None,
    };
    for entry in &step.journal {
        check_size("journal entry", entry)?;
    }
    let journal = step.journal.clone();
    Ok(EncodedStep {
        high_water: step.high_water,
        messages,
        events,
        keys: step.events.iter().map(|event| EventKey::of(event)).collect(),
        journal,
        run,
        release_lease: step.release_lease,
    })
}

/// The checks of a step that need no store: its mark is storable, its run record is the
/// turn's own, and a release of the lease comes with a fence.
///
/// # Errors
/// `InvalidInput`.
pub fn check_step_shape(turn: TurnId, step: &TurnStep, fence: Option<Fence>) -> StoreResult<()> {
    if let Some(seq) = step.high_water {
        check_seq(seq)?;
    }
    if step.release_lease && fence.is_none() {
        return Err(StoreError::InvalidInput(format!(
            "a step of turn {turn} can release the lease only with the fence that holds it"
        )));
    }
    if let Some(entry) = step.journal.iter().find(|entry| entry.turn_id != turn) {
        return Err(StoreError::InvalidInput(format!(
            "a step of turn {turn} cannot journal tool call {} of turn {}",
            entry.tool_call_id, entry.turn_id
        )));
    }
    check_step_run(turn, step.run.as_deref())
}

/// What one journal write of a step stores given the call's stored entry (see
/// [`TurnStep::journal`]): the entry to store, or `None` when the stored one stays.
///
/// # Errors
/// `Conflict::JournalMismatch` for other arguments, `Conflict::AlreadyCompleted` for
/// another result.
pub fn journal_write(
    existing: Option<&JournalEntry>,
    entry: &JournalEntry,
) -> StoreResult<Option<JournalEntry>> {
    let Some(stored) = existing else {
        return Ok(Some(entry.clone()));
    };
    check_same_arguments(stored, entry)?;
    match &entry.result {
        None => Ok(None),
        Some(result) => completed(stored, result, entry.completed_at.unwrap_or(entry.started_at)),
    }
}

/// The journal writes of a step (see [`TurnStep::journal`]), given a lookup of the turn's
/// stored entries (with what the backend keeps beside each, `S`): each entry to store,
/// with `None` to insert it or the stored entry's `S` to replace it. Entries of the same
/// call apply in order.
///
/// # Errors
/// As [`journal_write`], or the lookup's error.
pub fn journal_writes<S: Clone>(
    entries: &[JournalEntry],
    mut stored: impl FnMut(&str) -> StoreResult<Option<(S, JournalEntry)>>,
) -> StoreResult<Vec<(Option<S>, JournalEntry)>> {
    let mut writes: Vec<(Option<S>, JournalEntry)> = Vec::new();
    for entry in entries {
        let earlier = writes.iter().position(|(_, write)| write.tool_call_id == entry.tool_call_id);
        let (place, existing) = match earlier {
            Some(index) => (writes[index].0.clone(), Some(writes[index].1.clone())),
            None => match stored(&entry.tool_call_id)? {
                Some((place, existing)) => (Some(place), Some(existing)),
                None => (None, None),
            },
        };
        if let Some(write) = journal_write(existing.as_ref(), entry)? {
            match earlier {
                Some(index) => writes[index].1 = write,
                None => writes.push((place, write)),
            }
        }
    }
    Ok(writes)
}

/// Refuses a [`TurnStep`] run record that is not the turn's own, before the store is
/// touched (its session is checked against the stored run's by [`check_run_session_id`]).
fn check_step_run(turn: TurnId, run: Option<&RunRecord>) -> StoreResult<()> {
    match run {
        Some(run) if run.id != turn => Err(StoreError::InvalidInput(format!(
            "a step of turn {turn} cannot replace the record of run {}",
            run.id
        ))),
        _ => Ok(()),
    }
}

/// The checks of [`EventStore::start_turn`](crate::EventStore::start_turn) that need no
/// store (besides [`check_step_shape`]'s): the step carries the new turn's record, of a
/// top-level run, and does not release the lease it takes. Returns the record.
///
/// # Errors
/// `InvalidInput`.
pub fn check_start_shape(turn: TurnId, step: &TurnStep) -> StoreResult<&RunRecord> {
    check_step_shape(turn, step, None)?;
    let Some(run) = &step.run else {
        return Err(StoreError::InvalidInput(format!(
            "the first step of turn {turn} must carry the turn's run record"
        )));
    };
    if let Some(parent) = run.parent_run_id {
        return Err(StoreError::InvalidInput(format!(
            "run {turn} is a member run of {parent}: only a top-level turn is started with a lease"
        )));
    }
    if step.release_lease {
        return Err(StoreError::InvalidInput(format!(
            "the first step of turn {turn} cannot release the lease it takes"
        )));
    }
    Ok(run)
}

/// What the store holds that [`check_turn_start`] checks.
#[derive(Debug, Clone, Copy)]
pub struct StartFacts<'a> {
    /// Whether the session exists.
    pub session_exists: bool,
    /// The session's lease, expired or not.
    pub lease: Option<&'a Lease>,
    /// The last fencing token granted.
    pub last_token: u64,
    /// Whether the run to start exists.
    pub run_exists: bool,
}

/// The checks of [`EventStore::start_turn`](crate::EventStore::start_turn) against the
/// stored state, in their order; returns the lease to grant. `latest_turn` reads the
/// session's newest top-level run, only once the lease can be granted.
///
/// # Errors
/// `NotFound` for an unknown session, `InvalidInput` for an empty owner,
/// `Conflict::LeaseHeld`, `Conflict::LatestTurnChanged`, `Conflict::AlreadyExists`, and
/// `latest_turn`'s error.
pub fn check_turn_start(
    turn: TurnId,
    session: SessionId,
    start: &TurnStart,
    facts: &StartFacts<'_>,
    latest_turn: impl FnOnce() -> StoreResult<Option<TurnId>>,
) -> StoreResult<Lease> {
    if !facts.session_exists {
        return Err(StoreError::not_found("session", session));
    }
    let lease = grant_lease(session, facts.lease, &start.owner, start.ttl, start.now, facts.last_token + 1)?;
    let latest = latest_turn()?;
    if start.previous != latest {
        let expected = start.previous;
        return Err(Conflict::LatestTurnChanged { session_id: session, expected, latest }.into());
    }
    if facts.run_exists {
        return Err(Conflict::AlreadyExists { kind: "run", id: turn.to_string() }.into());
    }
    Ok(lease)
}

/// The parent of an encoded run record (`None` for a turn), read without building the
/// rest of the record (it is still parsed through).
///
/// # Errors
/// `Corrupt` when the record does not parse.
pub fn run_parent(body: &[u8]) -> StoreResult<Option<TurnId>> {
    Ok(decode::<RunHead>("run", body)?.parent_run_id)
}

/// Refuses a step's run record (of `run`, in `claimed`) whose session is not the stored
/// run's (`stored`).
pub fn check_run_session_id(run: TurnId, claimed: SessionId, stored: SessionId) -> StoreResult<()> {
    if claimed == stored {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!("run {run} belongs to session {stored}, not {claimed}")))
    }
}

/// Refuses a record of a stored run (`run`) that names another parent (`claimed`) than the
/// stored one (`stored`), or moves a turn under a parent or a member run to the top level:
/// backends index runs by parent, and a run's parent is fixed when it is created.
pub fn check_run_parent(run: TurnId, claimed: Option<TurnId>, stored: Option<TurnId>) -> StoreResult<()> {
    if claimed == stored {
        return Ok(());
    }
    let named = |parent: Option<TurnId>| match parent {
        Some(parent) => format!("a member run of {parent}"),
        None => "a top-level run".to_owned(),
    };
    Err(StoreError::InvalidInput(format!(
        "run {run} is {}; it cannot become {}: a run's parent is fixed when it is created",
        named(stored),
        named(claimed)
    )))
}

/// What [`check_event_batch`] needs of an event: small and `Copy`, so a backend can hand
/// a batch's keys to its writer thread without cloning the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventKey {
    /// The event's id (named in errors).
    pub event_id: agentry_types::EventId,
    /// The turn it names.
    pub turn_id: TurnId,
    /// The session it names.
    pub session_id: SessionId,
    /// Its `seq`.
    pub seq: u64,
    /// Whether it is a durable event (deltas are not stored).
    pub durable: bool,
    /// Its kind (named in errors).
    pub kind: &'static str,
}

impl EventKey {
    /// The key of an event.
    #[must_use]
    pub fn of(event: &EventEnvelope) -> Self {
        Self {
            event_id: event.event_id,
            turn_id: event.turn_id,
            session_id: event.session_id,
            seq: event.seq,
            durable: event.is_durable(),
            kind: event.kind(),
        }
    }
}

/// Checks a batch of events (by their keys) for turn `turn` of session `session` against
/// the turn's last stored `seq`.
pub fn check_event_batch(
    turn: TurnId,
    session: SessionId,
    last_seq: u64,
    events: impl IntoIterator<Item = EventKey>,
) -> StoreResult<()> {
    let mut previous = last_seq;
    for event in events {
        if event.turn_id != turn {
            return Err(StoreError::InvalidInput(format!(
                "event {} belongs to turn {}, not {turn}",
                event.event_id, event.turn_id
            )));
        }
        if event.session_id != session {
            return Err(StoreError::InvalidInput(format!(
                "event {} names session {}, but turn {turn} is in session {session}",
                event.event_id, event.session_id
            )));
        }
        if !event.durable {
            return Err(StoreError::InvalidInput(format!(
                "event {} is a {}, which is streamed but not stored",
                event.event_id, event.kind
            )));
        }
        check_seq(event.seq)?;
        if event.seq <= previous {
            return Err(Conflict::StaleSeq { turn_id: turn, seq: event.seq, last: previous }.into());
        }
        previous = event.seq;
    }
    Ok(())
}

/// Checks a write's fence against the session's current lease.
pub fn check_fence(session: SessionId, current: Option<&Lease>, fence: Option<Fence>) -> StoreResult<()> {
    let Some(fence) = fence else { return Ok(()) };
    if fence.session_id != session {
        return Err(StoreError::InvalidInput(format!(
            "the fence is for session {}, but the write is to session {session}",
            fence.session_id
        )));
    }
    match current {
        Some(lease) if lease.token == fence.token => Ok(()),
        current => Err(Conflict::StaleFence {
            session_id: session,
            token: fence.token,
            current: current.map(|lease| lease.token),
        }
        .into()),
    }
}

/// Whether a budget reservation holds its amounts at `now`: before its `expires_at`, and,
/// when it was made under a lease, while that lease is still its session's current one
/// (`current`, the session's lease as stored). A lease renewed keeps its token, so its
/// reservations hold; one taken over by recovery, or given back, has a new token or none,
/// so the reservations made under it end with it (design §8a).
#[must_use]
pub fn reservation_holds(
    reservation: &agentry_types::BudgetReservation,
    current: Option<&Lease>,
    now: Timestamp,
) -> bool {
    reservation.expires_at > now
        && reservation.lease.is_none_or(|fence| current.is_some_and(|lease| lease.token == fence.token))
}

/// Grants a lease unless a live one is held; `next_token` is the store's next token.
pub fn grant_lease(
    session: SessionId,
    current: Option<&Lease>,
    owner: &str,
    ttl: Duration,
    now: Timestamp,
    next_token: u64,
) -> StoreResult<Lease> {
    if owner.is_empty() {
        return Err(StoreError::InvalidInput("a lease owner must not be empty".to_owned()));
    }
    if let Some(lease) = current.filter(|lease| !lease.is_expired(now)) {
        return Err(Conflict::LeaseHeld {
            session_id: session,
            holder: lease.owner.clone(),
            expires_at: lease.expires_at,
        }
        .into());
    }
    Ok(Lease {
        session_id: session,
        owner: owner.to_owned(),
        token: next_token,
        expires_at: now.saturating_add(ttl),
    })
}

/// Renews the current lease if it holds `token`.
pub fn renew_lease(
    session: SessionId,
    current: Option<&Lease>,
    token: u64,
    ttl: Duration,
    now: Timestamp,
) -> StoreResult<Lease> {
    match current {
        Some(lease) if lease.token == token => {
            Ok(Lease { expires_at: now.saturating_add(ttl), ..lease.clone() })
        }
        current => {
            Err(Conflict::StaleFence { session_id: session, token, current: current.map(|l| l.token) }.into())
        }
    }
}

/// Checks that releasing with `token` is allowed.
pub fn check_release(session: SessionId, current: Option<&Lease>, token: u64) -> StoreResult<()> {
    check_fence(session, current, Some(Fence { session_id: session, token }))
}

/// Adds two usages, dimension by dimension.
#[must_use]
pub fn add_usage(a: &BudgetUsage, b: &BudgetUsage) -> BudgetUsage {
    BudgetUsage {
        tokens_used: a.tokens_used.saturating_add(b.tokens_used),
        steps_used: a.steps_used.saturating_add(b.steps_used),
        tool_calls_used: a.tool_calls_used.saturating_add(b.tool_calls_used),
        // Saturated as the counts are: an infinite cost would not be stored as a number,
        // and the ledger would not read back.
        cost_used_usd: (a.cost_used_usd + b.cost_used_usd).min(f64::MAX),
        elapsed_ms: match (a.elapsed_ms, b.elapsed_ms) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        },
    }
}

/// Refuses an amount that is not a real, non-negative quantity (a NaN or negative cost
/// would otherwise slip past every limit).
pub fn check_amount(amount: &BudgetUsage) -> StoreResult<()> {
    if !amount.cost_used_usd.is_finite() || amount.cost_used_usd < 0.0 {
        return Err(StoreError::InvalidInput(format!(
            "a budget cost must be a finite, non-negative number, not {}",
            amount.cost_used_usd
        )));
    }
    Ok(())
}

/// Refuses a reservation whose amount is not a real quantity ([`check_amount`]) or that
/// names a scope twice (it would be held, and settled, twice on one ledger).
pub fn check_reservation(reservation: &agentry_types::BudgetReservation) -> StoreResult<()> {
    check_amount(&reservation.amount)?;
    for (at, scope) in reservation.scopes.iter().enumerate() {
        if reservation.scopes[..at].contains(scope) {
            return Err(StoreError::InvalidInput(format!(
                "budget reservation {} names scope {scope:?} twice",
                reservation.id
            )));
        }
    }
    Ok(())
}

/// Checks that `amount` fits a scope's limit on top of what is used and reserved.
#[allow(clippy::cast_precision_loss)]
pub fn check_room(
    scope: &str,
    limit: &BudgetLimit,
    held: &BudgetUsage,
    amount: &BudgetUsage,
) -> StoreResult<()> {
    let checks: [(&'static str, Option<f64>, f64, f64); 5] = [
        (
            "max_tokens",
            limit.max_tokens.map(|l| l as f64),
            held.tokens_used as f64,
            amount.tokens_used as f64,
        ),
        ("max_steps", limit.max_steps.map(|l| l as f64), held.steps_used as f64, amount.steps_used as f64),
        (
            "max_tool_calls",
            limit.max_tool_calls.map(|l| l as f64),
            held.tool_calls_used as f64,
            amount.tool_calls_used as f64,
        ),
        ("max_cost_usd", limit.max_cost_usd, held.cost_used_usd, amount.cost_used_usd),
        (
            "max_elapsed_ms",
            limit.max_elapsed_ms.map(|l| l as f64),
            held.elapsed_ms.unwrap_or(0) as f64,
            amount.elapsed_ms.unwrap_or(0) as f64,
        ),
    ];
    for (dimension, limit, used, requested) in checks {
        if let Some(limit) = limit
            && used + requested > limit
        {
            return Err(Conflict::BudgetExceeded {
                scope: scope.to_owned(),
                dimension,
                used,
                requested,
                limit,
            }
            .into());
        }
    }
    Ok(())
}

/// What `journal_start` does given the entry already stored for the call, if any.
pub fn journal_start(
    existing: Option<&JournalEntry>,
    entry: &JournalEntry,
) -> StoreResult<Option<JournalEntry>> {
    let Some(stored) = existing else { return Ok(None) };
    check_same_arguments(stored, entry)?;
    Ok(Some(stored.clone()))
}

/// What `journal_complete` stores given the started entry: the completed entry, and
/// whether it changed.
pub fn journal_complete(
    existing: Option<&JournalEntry>,
    turn: TurnId,
    tool_call_id: &str,
    result: &ToolResult,
    completed_at: Timestamp,
) -> StoreResult<(JournalEntry, bool)> {
    let Some(stored) = existing else {
        return Err(StoreError::not_found("journaled tool call", format!("{turn}/{tool_call_id}")));
    };
    Ok(match completed(stored, result, completed_at)? {
        Some(completed) => (completed, true),
        None => (stored.clone(), false),
    })
}

/// Refuses an entry for a call the journal holds with other arguments.
fn check_same_arguments(stored: &JournalEntry, entry: &JournalEntry) -> StoreResult<()> {
    if stored.arguments_hash == entry.arguments_hash {
        return Ok(());
    }
    Err(Conflict::JournalMismatch { turn_id: entry.turn_id, tool_call_id: entry.tool_call_id.clone() }.into())
}

/// The stored entry completed with `result`, or `None` when it has that result already.
fn completed(
    stored: &JournalEntry,
    result: &ToolResult,
    completed_at: Timestamp,
) -> StoreResult<Option<JournalEntry>> {
    match &stored.result {
        Some(previous) if previous == result => Ok(None),
        Some(_) => Err(Conflict::AlreadyCompleted {
            turn_id: stored.turn_id,
            tool_call_id: stored.tool_call_id.clone(),
        }
        .into()),
        None => Ok(Some(JournalEntry {
            result: Some(result.clone()),
            completed_at: Some(completed_at),
            ..stored.clone()
        })),
    }
}

/// The fields of a stored run that a history window filters on. A file store decodes only
/// these from a run's body: its state, input and output are skipped, not built.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct RunHead {
    id: TurnId,
    #[serde(default)]
    parent_run_id: Option<TurnId>,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    team_id: Option<String>,
    status: RunStatus,
}

/// A run as a history window sees it: a whole record, or a stored run's [`RunHead`].
pub trait WindowRun {
    /// The run's id.
    fn run_id(&self) -> TurnId;
    /// Whether the run's messages belong to `query`'s window.
    fn in_window(&self, query: &HistoryQuery) -> bool;
}

impl<T: WindowRun> WindowRun for &T {
    fn run_id(&self) -> TurnId {
        (**self).run_id()
    }

    fn in_window(&self, query: &HistoryQuery) -> bool {
        (**self).in_window(query)
    }
}

impl WindowRun for RunRecord {
    fn run_id(&self) -> TurnId {
        self.id
    }

    fn in_window(&self, query: &HistoryQuery) -> bool {
        query.run_matches(self)
    }
}

impl WindowRun for RunHead {
    fn run_id(&self) -> TurnId {
        self.id
    }

    fn in_window(&self, query: &HistoryQuery) -> bool {
        query.fields_match(
            self.parent_run_id.is_some(),
            self.status,
            self.agent_id.as_deref(),
            self.team_id.as_deref(),
        )
    }
}

/// Collects a history window from a session's runs, given newest first, and a loader that
/// appends a run's messages (given its id), in order, to a list. Reads only as many runs
/// as the window needs.
pub fn history_window<R, B, L>(runs: R, query: &HistoryQuery, mut load: L) -> StoreResult<Vec<HistoryMessage>>
where
    R: IntoIterator<Item = StoreResult<B>>,
    B: WindowRun,
    L: FnMut(TurnId, &mut Vec<HistoryMessage>) -> StoreResult<()>,
{
    let run_bound = query.run_bound();
    let scan_bound = query.scan_bound();
    let mut taken_runs = 0usize;
    // The runs' messages in one list, newest run first, and where each run's part begins.
    let mut window: Vec<HistoryMessage> = Vec::new();
    let mut starts: Vec<usize> = Vec::new();
    let mut runs = runs.into_iter();
    // Bounds are checked before the next run is read, so none is read beyond them.
    for _ in 0..scan_bound {
        if run_bound.is_some_and(|bound| taken_runs >= bound)
            || query.last_messages.is_some_and(|bound| window.len() >= bound)
        {
            break;
        }
        let Some(run) = runs.next() else { break };
        let run = run?;
        if !run.in_window(query) {
            continue;
        }
        taken_runs += 1;
        let start = window.len();
        load(run.run_id(), &mut window)?;
        // The run's messages the query keeps, in order, moved to the front of its part.
        let mut kept = start;
        for at in start..window.len() {
            if query.message_matches(&window[at].message) {
                window.swap(kept, at);
                kept += 1;
            }
        }
        window.truncate(kept);
        starts.push(start);
    }
    // Oldest run first, each run's messages in order: the whole list reversed, then each
    // run's part (in place: no message is copied).
    window.reverse();
    let len = window.len();
    let mut end = len;
    for start in starts.into_iter().rev() {
        let part = len - end..len - start;
        end = start;
        window[part].reverse();
    }
    if let Some(bound) = query.last_messages
        && window.len() > bound
    {
        window.drain(..window.len() - bound);
        // A tool result whose call was cut off would be refused by every provider.
        let orphans = window.iter().take_while(|message| message.message.role == Role::Tool).count();
        window.drain(..orphans);
    }
    Ok(window)
}
