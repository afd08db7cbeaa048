//! `agentry-workload`: workload drivers run as separate processes.
//!
//! `agentry-workload crash-writer <sqlite|redb> <path> <strict|batched|relaxed>` opens the
//! store and writes forever from several concurrent tasks (sessions, runs, events,
//! messages, high-water marks, and continuations of turns found in the store), printing one
//! line per acknowledged write: `session <id>`, `run <id>`, `event <turn> <seq>`,
//! `message <run> <count>`, `mark <turn> <value>`; before each event batch it prints
//! `try <event id>...`. The crash tests kill it with SIGKILL at random moments and check
//! that every acknowledged write survived and that every batch is stored whole or not at all.
//!
//! `agentry-workload append-one <backend> <path> <durability> <turn id> <seq>` appends one
//! event to a stored turn and `agentry-workload delete-session <backend> <path> <durability>
//! <session id>` deletes a session, each printing `ok…` or `refused <error>`: the second
//! process of the shared-file tests. `agentry-workload append-rate <backend> <path>
//! <durability> <writers> <events per writer> [<events per call>]` measures sustained append
//! throughput. `agentry-workload io-error <backend> <path> <durability>` writes through a real I/O
//! error (a file size limit, set and lifted with `prlimit`) and checks the store recovers.

// A workload driver reports on standard output.
#![allow(clippy::print_stdout)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use agentry_benches::{event_for, open_store};
use agentry_memory::{Order, PageRequest, RunQuery, SessionQuery, Store};
use agentry_types::{Message, RunRecord, SessionRecord, SessionType, Subject, TurnInputItem};
use anyhow::{Context, Result, bail};

type Acks = Arc<Mutex<std::io::Stdout>>;

fn ack(acks: &Acks, line: &str) {
    let mut out = acks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn turn_writer(store: Arc<dyn Store>, acks: Acks, worker: u64) -> Result<()> {
    let mut round = 0u64;
    loop {
        round += 1;
        let mut session =
            SessionRecord::new(SessionType::Agent, format!("crash-{worker}"), Subject::user("crash"));
        session.metadata.insert("round".into(), round.into());
        store.create_session(&session).await?;
        ack(&acks, &format!("session {}", session.id));
        for _ in 0..3 {
            let run = RunRecord::new(session.id, vec![TurnInputItem::message("go")], Subject::user("crash"));
            store.put_run(&run, None).await?;
            ack(&acks, &format!("run {}", run.id));
            let mut seq = 0;
            for step in 0..12u64 {
                let batch: Vec<_> = (0..1 + step % 3)
                    .map(|_| {
                        seq += 1 + step % 2;
                        event_for(&run, seq)
                    })
                    .collect();
                let ids: Vec<String> = batch.iter().map(|event| event.event_id.to_string()).collect();
                ack(&acks, &format!("try {}", ids.join(" ")));
                store.append_events(run.id, &batch, None).await?;
                for event in &batch {
                    ack(&acks, &format!("event {} {}", run.id, event.seq));
                }
                if step % 5 == 4 {
                    let mark = seq + 16;
                    store.raise_high_water(run.id, mark, None).await?;
                    ack(&acks, &format!("mark {} {mark}", run.id));
                    seq = mark;
                }
            }
            store
                .append_messages(
                    run.id,
                    &[Arc::new(Message::user("q")), Arc::new(Message::assistant("a"))],
                    None,
                )
                .await?;
            ack(&acks, &format!("message {} 2", run.id));
        }
    }
}

/// Continues turns a killed writer left behind, above their high-water marks.
async fn continue_turns(store: Arc<dyn Store>, acks: Acks) -> Result<()> {
    let sessions = store.list_sessions(&SessionQuery::default(), &PageRequest::first(3)).await?;
    for session in sessions.items {
        let runs = store
            .list_runs(
                session.id,
                &RunQuery { order: Order::Desc, ..RunQuery::default() },
                &PageRequest::first(1),
            )
            .await?;
        for run in runs.items {
            let mut seq = store.high_water(run.id).await?;
            for _ in 0..5 {
                seq += 1;
                store.append_events(run.id, &[event_for(&run, seq)], None).await?;
                ack(&acks, &format!("event {} {seq}", run.id));
            }
        }
    }
    Ok(())
}

async fn crash_writer(backend: &str, path: &str, durability: &str) -> Result<()> {
    let durability = durability.parse().map_err(anyhow::Error::msg)?;
    let store = open_store(backend, path.as_ref(), durability).context("opening the store")?;
    let acks: Acks = Arc::new(Mutex::new(std::io::stdout()));
    continue_turns(store.clone(), acks.clone()).await?;
    ack(&acks, "ready");
    let mut tasks = Vec::new();
    for worker in 0..4 {
        tasks.push(tokio::spawn(turn_writer(store.clone(), acks.clone(), worker)));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Appends one event under `seq` to an existing turn; prints `ok <position>` or
/// `refused <error>`.
async fn append_one(backend: &str, path: &str, durability: &str, turn: &str, seq: u64) -> Result<()> {
    let durability = durability.parse().map_err(anyhow::Error::msg)?;
    let store = open_store(backend, path.as_ref(), durability).context("opening the store")?;
    let run = store.get_run(turn.parse().map_err(anyhow::Error::msg)?).await?;
    match store.append_events(run.id, &[event_for(&run, seq)], None).await {
        Ok(positions) => println!("ok {}", positions[0]),
        Err(error) => println!("refused {error}"),
    }
    Ok(())
}

/// Sets this process's file size limit (the soft one) with `prlimit`; `None` lifts it.
fn limit_file_size(bytes: Option<u64>) -> Result<()> {
    let limit = bytes.map_or_else(|| "unlimited:".to_owned(), |bytes| format!("{bytes}:"));
    let status = std::process::Command::new("prlimit")
        .args(["--pid", &std::process::id().to_string(), &format!("--fsize={limit}")])
        .status()
        .context("running prlimit")?;
    if !status.success() {
        bail!("prlimit failed: {status}");
    }
    Ok(())
}

/// A real I/O error in the middle of a store's life (a full disk, in effect): the file
/// size limit is set to the store file's size, writes go on until one fails, the limit is
/// lifted, and the very next write must succeed with every write acknowledged before it
/// still there. Prints `failed <error>` and `recovered <sessions>`.
async fn io_error(backend: &str, path: &str, durability: &str) -> Result<()> {
    // A write past the limit also raises SIGXFSZ (25 on Linux), whose default ends the
    // process: listening for it leaves the write to fail with EFBIG.
    let _xfsz = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::from_raw(25))?;
    let durability = durability.parse().map_err(anyhow::Error::msg)?;
    let store = open_store(backend, path.as_ref(), durability).context("opening the store")?;
    let new_session = || SessionRecord::new(SessionType::Agent, "io".repeat(400), Subject::user("io"));
    let mut kept = Vec::new();
    for _ in 0..20 {
        let session = new_session();
        store.create_session(&session).await?;
        kept.push(session.id);
    }
    limit_file_size(Some(std::fs::metadata(path)?.len()))?;
    let mut failure = None;
    for _ in 0..100_000 {
        let session = new_session();
        match store.create_session(&session).await {
            Ok(()) => kept.push(session.id),
            Err(error) => {
                failure = Some(error);
                break;
            }
        }
    }
    let failure = failure.context("no write failed under the file size limit")?;
    println!("failed {failure}");
    // Tried again while the limit holds: refused, or stored where the file has room.
    let again = new_session();
    if store.create_session(&again).await.is_ok() {
        kept.push(again.id);
    }
    limit_file_size(None)?;
    // A read first, as a readiness probe's would be, then a write: each goes through.
    store
        .list_sessions(&SessionQuery::default(), &PageRequest::first(1))
        .await
        .context("the first read once the file can grow again")?;
    let session = new_session();
    store.create_session(&session).await.context("the first write once the file can grow again")?;
    kept.push(session.id);
    for id in &kept {
        store.get_session(*id).await.with_context(|| format!("acknowledged session {id}"))?;
    }
    println!("recovered {}", kept.len());
    Ok(())
}

/// Opens (or creates) a store; prints `ok` or `refused <error>`.
fn open(backend: &str, path: &str, durability: &str) -> Result<()> {
    let durability = durability.parse().map_err(anyhow::Error::msg)?;
    match open_store(backend, path.as_ref(), durability) {
        Ok(_) => println!("ok"),
        Err(error) => println!("refused {error}"),
    }
    Ok(())
}

/// Deletes a session; prints `ok` or `refused <error>`.
async fn delete_session(backend: &str, path: &str, durability: &str, session: &str) -> Result<()> {
    let durability = durability.parse().map_err(anyhow::Error::msg)?;
    let store = open_store(backend, path.as_ref(), durability).context("opening the store")?;
    match store.delete_session(session.parse().map_err(anyhow::Error::msg)?).await {
        Ok(()) => println!("ok"),
        Err(error) => println!("refused {error}"),
    }
    Ok(())
}

/// Appends events from concurrent writers, `per_call` events per call, and prints the rate.
async fn append_rate(
    backend: &str,
    path: &str,
    durability: &str,
    writers: usize,
    per_writer: u64,
    per_call: usize,
) -> Result<()> {
    if per_call == 0 {
        bail!("events per call must be at least 1");
    }
    let durability = durability.parse().map_err(anyhow::Error::msg)?;
    let store = open_store(backend, path.as_ref(), durability).context("opening the store")?;
    let session = SessionRecord::new(SessionType::Agent, "rate", Subject::user("rate"));
    store.create_session(&session).await?;
    let mut runs = Vec::new();
    for _ in 0..writers {
        let run = RunRecord::new(session.id, vec![TurnInputItem::message("go")], Subject::user("rate"));
        store.put_run(&run, None).await?;
        runs.push(run);
    }
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for run in runs {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            for first in (1..=per_writer).step_by(per_call) {
                let last = (first + per_call as u64 - 1).min(per_writer);
                let events: Vec<_> = (first..=last).map(|seq| event_for(&run, seq)).collect();
                store.append_events(run.id, &events, None).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed = started.elapsed();
    #[allow(clippy::cast_precision_loss)]
    let rate = (writers as f64 * per_writer as f64) / elapsed.as_secs_f64();
    println!("{backend} {durability}: {writers} writers, {per_call} events per call, {rate:.0} events/s");
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["crash-writer", backend, path, durability] => {
            runtime.block_on(crash_writer(backend, path, durability))
        }
        ["append-one", backend, path, durability, turn, seq] => {
            runtime.block_on(append_one(backend, path, durability, turn, seq.parse()?))
        }
        ["delete-session", backend, path, durability, session] => {
            runtime.block_on(delete_session(backend, path, durability, session))
        }
        ["io-error", backend, path, durability] => runtime.block_on(io_error(backend, path, durability)),
        ["open", backend, path, durability] => open(backend, path, durability),
        ["append-rate", backend, path, durability, writers, per_writer] => {
            runtime.block_on(append_rate(backend, path, durability, writers.parse()?, per_writer.parse()?, 1))
        }
        ["append-rate", backend, path, durability, writers, per_writer, per_call] => runtime.block_on(
            append_rate(backend, path, durability, writers.parse()?, per_writer.parse()?, per_call.parse()?),
        ),
        _ => bail!(
            "usage: agentry-workload crash-writer <sqlite|redb> <path> <strict|batched|relaxed>\n       agentry-workload append-one <sqlite|redb> <path> <durability> <turn id> <seq>\n       agentry-workload delete-session <sqlite|redb> <path> <durability> <session id>\n       agentry-workload append-rate <sqlite|redb> <path> <durability> <writers> <events per writer> [<events per call>]\n       agentry-workload io-error <sqlite|redb> <path> <durability>\n       agentry-workload open <sqlite|redb> <path> <durability>"
        ),
    }
}
