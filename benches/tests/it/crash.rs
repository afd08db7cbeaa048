//! Crash tests: a child process writes to a store and is killed with SIGKILL at a random
//! moment, again and again on the same file. After every kill the store must open, hold
//! every write the child saw acknowledged (in every durability mode, which the kills rotate
//! through: even `relaxed` survives a crash of the process), keep every turn's
//! `seq` strictly increasing, and never give a stored position to another event.
//!
//! 20 kills per backend by default; set `AGENTRY_SOAK` for 200.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentry_benches::open_store;
use agentry_memory::{Durability, FeedQuery, HistoryQuery, Order};
use agentry_types::{EventId, SessionId, TurnId};

#[derive(Debug, Default)]
struct Acked {
    sessions: Vec<SessionId>,
    runs: Vec<TurnId>,
    events: Vec<(TurnId, u64)>,
    marks: Vec<(TurnId, u64)>,
    messages: Vec<(TurnId, usize)>,
    /// Event ids of batches announced before they were sent: each batch must be stored
    /// whole or not at all.
    batches: Vec<Vec<EventId>>,
}

impl Acked {
    fn add(&mut self, line: &str) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["session", id] => self.sessions.push(id.parse().unwrap()),
            ["run", id] => self.runs.push(id.parse().unwrap()),
            ["event", turn, seq] => self.events.push((turn.parse().unwrap(), seq.parse().unwrap())),
            ["mark", turn, value] => self.marks.push((turn.parse().unwrap(), value.parse().unwrap())),
            ["message", run, count] => self.messages.push((run.parse().unwrap(), count.parse().unwrap())),
            ["ready"] => {}
            ["try", ids @ ..] => self.batches.push(ids.iter().map(|id| id.parse().unwrap()).collect()),
            other => panic!("unexpected acknowledgment line {other:?}"),
        }
    }
}

/// A small deterministic generator, seeded per run so a failure can be replayed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % below
    }
}

/// Runs one child until a random moment after it is ready, kills it, and returns the
/// complete acknowledgment lines it printed.
fn run_and_kill(backend: &str, path: &str, durability: &str, wait: Duration) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentry-workload"))
        .args(["crash-writer", backend, path, durability])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        // Only complete lines count: a line cut by the kill was never fully acknowledged.
        while reader.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            if line.ends_with(b"\n") {
                let text = String::from_utf8_lossy(&line).trim().to_owned();
                if lines_tx.send(text).is_err() {
                    break;
                }
            }
            line.clear();
        }
    });
    let mut lines = Vec::new();
    // The child is ready once it has opened the store and continued old turns.
    loop {
        match lines_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let ready = line == "ready";
                lines.push(line);
                if ready {
                    break;
                }
            }
            Err(_) => {
                let _ = child.kill();
                let mut stderr = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
                panic!("the writer never became ready: {stderr}");
            }
        }
    }
    // Let it write for a while, then kill it mid-flight.
    std::thread::sleep(wait);
    let still_running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(lines_rx.try_iter());
    if !still_running {
        let mut stderr = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
        panic!("the writer stopped on its own before the kill: {stderr}");
    }
    lines
}

fn crash_test(backend: &str) {
    let kills = if std::env::var_os("AGENTRY_SOAK").is_some() { 200 } else { 20 };
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("{backend} crash test seed: {seed}");
    let mut random = Lcg(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("crash.{backend}"));
    let path_text = path.to_str().unwrap().to_owned();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut acked = Acked::default();
    let mut positions: HashMap<(TurnId, u64), (u64, EventId)> = HashMap::new();
    let mut owners: HashMap<u64, (TurnId, u64, EventId)> = HashMap::new();
    for kill in 0..kills {
        let durability = ["strict", "batched", "relaxed"][kill % 3];
        let wait = Duration::from_millis(10 + random.next(140));
        for line in run_and_kill(backend, &path_text, durability, wait) {
            acked.add(&line);
        }
        runtime.block_on(async {
            let store = open_store(backend, &path, Durability::Batched)
                .unwrap_or_else(|error| panic!("after kill {kill} the store does not open: {error}"));
            for session in &acked.sessions {
                store
                    .get_session(*session)
                    .await
                    .unwrap_or_else(|e| panic!("kill {kill}: acknowledged session lost: {e}"));
            }
            for run in &acked.runs {
                store
                    .get_run(*run)
                    .await
                    .unwrap_or_else(|e| panic!("kill {kill}: acknowledged run lost: {e}"));
            }
            let mut by_turn: BTreeMap<TurnId, Vec<u64>> = BTreeMap::new();
            for (turn, seq) in &acked.events {
                by_turn.entry(*turn).or_default().push(*seq);
            }
            for (turn, seqs) in &by_turn {
                let stored: Vec<u64> = store
                    .turn_events(*turn, Order::Asc, None, 100_000)
                    .await
                    .unwrap()
                    .iter()
                    .map(|e| e.event.seq)
                    .collect();
                assert!(
                    stored.windows(2).all(|pair| pair[0] < pair[1]),
                    "kill {kill}: seq of {turn} not strictly increasing: {stored:?}"
                );
                for seq in seqs {
                    assert!(
                        stored.binary_search(seq).is_ok(),
                        "kill {kill}: acknowledged event {turn}/{seq} lost"
                    );
                }
                let mark = store.high_water(*turn).await.unwrap();
                assert!(
                    mark >= stored.last().copied().unwrap_or(0),
                    "kill {kill}: high-water mark below a stored seq"
                );
            }
            for (turn, value) in &acked.marks {
                assert!(
                    store.high_water(*turn).await.unwrap() >= *value,
                    "kill {kill}: acknowledged high-water mark lost"
                );
            }
            for (run, count) in &acked.messages {
                let run_record = store.get_run(*run).await.unwrap();
                let history = store
                    .history(
                        run_record.session_id,
                        &HistoryQuery { last_runs: Some(10), ..HistoryQuery::default() },
                    )
                    .await
                    .unwrap();
                let found = history.iter().filter(|message| message.run_id == *run).count();
                assert!(found >= *count, "kill {kill}: acknowledged messages of {run} lost");
            }
            let feed = store.feed(&FeedQuery::default(), 10_000_000).await.unwrap();
            assert!(
                feed.windows(2).all(|pair| pair[0].position < pair[1].position),
                "kill {kill}: positions not increasing"
            );
            for stored in &feed {
                let key = (stored.event.turn_id, stored.event.seq);
                let value = (stored.position, stored.event.event_id);
                if let Some(previous) = positions.insert(key, value) {
                    assert_eq!(previous, value, "kill {kill}: event {key:?} changed position or identity");
                }
                let owner = (stored.event.turn_id, stored.event.seq, stored.event.event_id);
                if let Some(previous) = owners.insert(stored.position, owner) {
                    assert_eq!(
                        previous, owner,
                        "kill {kill}: position {} was given to another event",
                        stored.position
                    );
                }
            }
            let stored: std::collections::HashSet<EventId> =
                feed.iter().map(|stored| stored.event.event_id).collect();
            for batch in &acked.batches {
                let present = batch.iter().filter(|id| stored.contains(id)).count();
                assert!(
                    present == 0 || present == batch.len(),
                    "kill {kill}: batch {batch:?} was stored in part"
                );
            }
        });
    }
    assert!(acked.events.len() > kills * 5, "the writers acknowledged only {} events", acked.events.len());
    eprintln!("{backend}: {kills} kills, {} events acknowledged and verified", acked.events.len());
}

#[test]
fn sqlite_keeps_every_acknowledged_write_across_repeated_sigkills() {
    crash_test("sqlite");
}

#[test]
fn redb_keeps_every_acknowledged_write_across_repeated_sigkills() {
    crash_test("redb");
}
