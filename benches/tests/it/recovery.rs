//! Crash recovery of running turns: a child process runs a turn on a real store and is
//! killed with SIGKILL part way; a second process recovers and finishes it. The counter file
//! written by the tools proves that no non-idempotent call ran twice, and a subscriber that
//! had events up to some `seq` resumes against the second process with no gap and no
//! duplicate.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use agentry_benches::open_store;
use agentry_memory::Durability;
use agentry_model::{Model, ModelError, ModelInfo, ModelRequest, ModelStream, ScriptedResponse};
use agentry_runner::{Agent, Runtime, TurnRequest};

const BIN: &str = env!("CARGO_BIN_EXE_agentry-turns");

/// What one crash-and-recover round saw.
struct Round {
    killed: bool,
    before: Vec<(u64, String)>,
    after: Vec<(u64, String)>,
    final_line: String,
    in_doubt: Vec<String>,
    /// The recovered turn's metered tokens, then those its stored model messages report.
    tokens: String,
}

fn event_line(line: &str) -> Option<(u64, String)> {
    let mut parts = line.strip_prefix("event ")?.splitn(2, ' ');
    Some((parts.next()?.parse().ok()?, parts.next()?.to_owned()))
}

fn crash_and_recover(backend: &str, dir: &Path, kill_after: usize) -> Round {
    let path = dir.join(format!("turns.{backend}"));
    let counter = dir.join("counter");
    let (path_text, counter_text) = (path.to_str().unwrap(), counter.to_str().unwrap());
    let mut child = Command::new(BIN)
        .args(["start", backend, path_text, counter_text])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let turn_line = lines.next().unwrap().unwrap();
    let turn = turn_line.split(' ').nth(2).unwrap().to_owned();
    let mut before = Vec::new();
    let mut killed = false;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(event) = event_line(&line) {
            before.push(event);
            if before.len() == kill_after {
                child.kill().unwrap();
                killed = true;
                break;
            }
        }
    }
    child.wait().unwrap();
    let cursor = before.last().map_or(0, |(seq, _)| *seq);

    let output = Command::new(BIN)
        .args(["recover", backend, path_text, counter_text, &turn, &cursor.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "recover failed: {}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let after = stdout.lines().filter_map(event_line).collect();
    let in_doubt =
        stdout.lines().filter_map(|line| line.strip_prefix("indoubt ")).map(str::to_owned).collect();
    let final_line =
        stdout.lines().find_map(|line| line.strip_prefix("final ")).unwrap_or_default().to_owned();
    let tokens = stdout.lines().find_map(|line| line.strip_prefix("tokens ")).unwrap_or_default().to_owned();
    Round { killed, before, after, final_line, in_doubt, tokens }
}

fn recovers_turns_killed_at_many_points(backend: &str) {
    let kill_points = [1, 2, 4, 6, 9, 13, 18, 24, 31, 39, 48, 58];
    let mut kills = 0;
    for kill_after in kill_points {
        let dir = tempfile::tempdir().unwrap();
        let round = crash_and_recover(backend, dir.path(), kill_after);
        kills += usize::from(round.killed);
        let context = format!("{backend}, killed after {kill_after} events; in doubt: {:?}", round.in_doubt);

        // The subscriber resumed after its last seq: every later event, in order, once.
        let cursor = round.before.last().map_or(0, |(seq, _)| *seq);
        let seqs: Vec<u64> = round.after.iter().map(|(seq, _)| *seq).collect();
        assert!(seqs.iter().all(|seq| *seq > cursor), "{context}: {seqs:?} after {cursor}");
        assert!(seqs.windows(2).all(|pair| pair[0] < pair[1]), "{context}: {seqs:?}");
        let all: BTreeSet<u64> = round.before.iter().chain(&round.after).map(|(seq, _)| *seq).collect();
        assert_eq!(all.len(), round.before.len() + round.after.len(), "{context}: a seq came twice");
        if round.killed {
            assert_eq!(round.after.last().map(|(_, kind)| kind.as_str()), Some("turn.done"), "{context}");
        }

        // A call asked about again after the crash says it may already have run.
        assert!(round.in_doubt.iter().all(|line| line.ends_with(" flagged")), "{context}");
        // The turn finished, and every charge ran exactly once.
        assert_eq!(round.final_line, "done All five steps are done.", "{context}");
        // Its metrics count every model call, those of the killed process included.
        let tokens: Vec<u64> = round.tokens.split(' ').filter_map(|n| n.parse().ok()).collect();
        assert!(tokens.len() == 2 && tokens[0] == tokens[1] && tokens[0] > 0, "{context}: tokens {tokens:?}");
        let counter = std::fs::read_to_string(dir.path().join("counter")).unwrap();
        for step in ["step0", "step2", "step4"] {
            let runs = counter.lines().filter(|line| *line == format!("charge {step}")).count();
            assert_eq!(runs, 1, "{context}: charge {step} ran {runs} times:\n{counter}");
        }
        for step in ["step1", "step3"] {
            assert!(counter.lines().any(|line| line == format!("lookup {step}")), "{context}");
        }
    }
    assert!(kills >= 10, "only {kills} of the kill points landed before the turn ended");
}

#[test]
fn sqlite_turns_killed_at_many_points_are_recovered_and_charges_run_exactly_once() {
    recovers_turns_killed_at_many_points("sqlite");
}

#[test]
fn redb_turns_killed_at_many_points_are_recovered_and_charges_run_exactly_once() {
    recovers_turns_killed_at_many_points("redb");
}

/// A model that answers only once the test opens its gate.
#[derive(Debug)]
struct GatedModel {
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl Model for GatedModel {
    fn info(&self) -> ModelInfo {
        ModelInfo { id: "gated".to_owned(), provider: "test".to_owned() }
    }

    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let _permit = self.gate.acquire().await.map_err(|_| ModelError::Disconnected)?;
        let deltas = ScriptedResponse::text("first process").deltas(1, &request);
        Ok(Box::pin(futures_util::stream::iter(deltas.into_iter().map(Ok))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_cannot_start_a_turn_while_one_runs_on_the_same_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.sqlite");
    let store = open_store("sqlite", &path, Durability::Batched).unwrap();
    let runtime = Runtime::new(store);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    runtime.register(Agent::builder("shared", Arc::new(GatedModel { gate: gate.clone() })).build());
    let session = runtime.create_session("shared", None).await.unwrap();
    let turn = session.create_turn(TurnRequest::message("hold the session")).await.unwrap();

    let (path_text, session_text) = (path.to_str().unwrap().to_owned(), session.id().to_string());
    let try_turn = move || {
        let output =
            Command::new(BIN).args(["try-turn", "sqlite", &path_text, &session_text]).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    };
    let answer = tokio::task::spawn_blocking(try_turn.clone()).await.unwrap();
    assert_eq!(answer, "running");

    gate.add_permits(1);
    turn.wait().await.unwrap();
    let answer = tokio::task::spawn_blocking(try_turn).await.unwrap();
    assert_eq!(answer, "ok done from the second process");
}
