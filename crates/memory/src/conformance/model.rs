//! The model test: random sequences of store operations, applied to the backend and to a
//! plain reference model, with every read compared.
//!
//! The model covers sessions, runs (turns and member runs, listed by parent), events, the
//! feed, high-water marks and leases; results
//! are compared by outcome (ok, not found, conflict, invalid input) and by content.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::{
    RunRecord, SessionId, SessionRecord, SessionType, Subject, Timestamp, TurnId, TurnInputItem, TurnState,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use super::{Harness, event};
use crate::error::StoreError;
use crate::page::{Order, PageRequest};
use crate::store::{FeedQuery, ParentFilter, RunQuery, SessionQuery, Store, TurnStart, TurnStep};

const SESSIONS: u8 = 3;
const RUNS: u8 = 6;

/// One operation.
#[derive(Debug, Clone)]
pub enum Op {
    /// Create the session in a slot.
    CreateSession(u8),
    /// Delete the session in a slot.
    DeleteSession(u8),
    /// Put the run of a slot into a session slot, done or running, as a member of the run
    /// of another slot or as a turn.
    PutRun {
        /// The session slot.
        session: u8,
        /// The run slot.
        run: u8,
        /// Whether the run is finished.
        done: bool,
        /// The parent's run slot (`None`: a turn).
        parent: Option<u8>,
    },
    /// Append events: each step adds to the model's last seq (0 makes a stale seq).
    /// With `as_step`, through `write_step`, raising the high-water mark to that value with
    /// the same write (a refused step must not raise it).
    Append {
        /// The run slot.
        run: u8,
        /// Seq steps.
        steps: Vec<u8>,
        /// Write as a turn step raising the mark to this.
        as_step: Option<u8>,
    },
    /// Read a run's events.
    ReadTurn {
        /// The run slot.
        run: u8,
        /// Descending?
        desc: bool,
        /// The cursor.
        after: Option<u8>,
        /// The limit.
        limit: u8,
    },
    /// List a session's runs through every page.
    ListRuns {
        /// The session slot.
        session: u8,
        /// Descending?
        desc: bool,
        /// The page size.
        page: u8,
        /// Which runs: 0 turns, 1 every run, `2 + slot` the members of the run of a slot.
        parent: u8,
    },
    /// List sessions through every page: every one, or one owner's, within creation
    /// bounds (in seconds).
    ListSessions {
        /// The page size.
        page: u8,
        /// The owner number (sessions of even slots are owner 0's, of odd slots owner 1's).
        owner: Option<u8>,
        /// Created at or after.
        from: Option<u8>,
        /// Created at or before.
        until: Option<u8>,
        /// Oldest first?
        oldest_first: bool,
    },
    /// Read the whole feed.
    Feed,
    /// Raise a run's high-water mark, then read it.
    HighWater {
        /// The run slot.
        run: u8,
        /// The mark to raise to.
        raise: u8,
    },
    /// Acquire a session's lease at a time (in seconds).
    Acquire {
        /// The session slot.
        session: u8,
        /// The owner number.
        owner: u8,
        /// The time.
        now: u8,
    },
    /// Release a session's lease with the model's current token.
    Release(u8),
    /// List every lease, page by page.
    ListLeases {
        /// The page size.
        page: u8,
    },
    /// Start the run of a slot as a new turn of a session (`start_turn`), with its first
    /// event, taking the session's lease at a time (in seconds).
    StartTurn {
        /// The session slot.
        session: u8,
        /// The run slot.
        run: u8,
        /// The owner number.
        owner: u8,
        /// The time.
        now: u8,
        /// The run slot of the latest turn the start expects.
        previous: Option<u8>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..SESSIONS).prop_map(Op::CreateSession),
        1 => (0..SESSIONS).prop_map(Op::DeleteSession),
        4 => (0..SESSIONS, 0..RUNS, any::<bool>(), proptest::option::weighted(0.4, 0..RUNS))
            .prop_map(|(session, run, done, parent)| Op::PutRun { session, run, done, parent }),
        6 => (0..RUNS, proptest::collection::vec(0u8..3, 1..4), proptest::option::of(0u8..30))
            .prop_map(|(run, steps, as_step)| Op::Append { run, steps, as_step }),
        3 => (0..RUNS, any::<bool>(), proptest::option::of(0u8..12), 1u8..6)
            .prop_map(|(run, desc, after, limit)| Op::ReadTurn { run, desc, after, limit }),
        3 => (0..SESSIONS, any::<bool>(), 1u8..4, 0..RUNS + 2)
            .prop_map(|(session, desc, page, parent)| Op::ListRuns { session, desc, page, parent }),
        2 => (1u8..4, proptest::option::of(0u8..2), proptest::option::of(0u8..20), proptest::option::of(0u8..20), any::<bool>())
            .prop_map(|(page, owner, from, until, oldest_first)| Op::ListSessions { page, owner, from, until, oldest_first }),
        2 => Just(Op::Feed),
        2 => (0..RUNS, 0u8..20).prop_map(|(run, raise)| Op::HighWater { run, raise }),
        2 => (0..SESSIONS, 0u8..3, 0u8..40).prop_map(|(session, owner, now)| Op::Acquire { session, owner, now }),
        1 => (0..SESSIONS).prop_map(Op::Release),
        1 => (1u8..4).prop_map(|page| Op::ListLeases { page }),
        3 => (0..SESSIONS, 0..RUNS, 0u8..3, 0u8..40, proptest::option::of(0..RUNS))
            .prop_map(|(session, run, owner, now, previous)| Op::StartTurn { session, run, owner, now, previous }),
    ]
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Outcome {
    Ok,
    NotFound,
    Conflict,
    Invalid,
    Other,
}

fn outcome<T>(result: &Result<T, StoreError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok,
        Err(StoreError::NotFound { .. }) => Outcome::NotFound,
        Err(StoreError::Conflict(_)) => Outcome::Conflict,
        Err(StoreError::InvalidInput(_)) => Outcome::Invalid,
        Err(_) => Outcome::Other,
    }
}

#[derive(Debug, Default)]
struct ModelRun {
    session: u8,
    /// The parent's run slot, fixed when the run is created.
    parent: Option<u8>,
    seqs: Vec<u64>,
    high_water: u64,
}

#[derive(Debug)]
struct Model {
    session_ids: Vec<SessionId>,
    run_ids: Vec<TurnId>,
    sessions: HashMap<u8, i64>,
    runs: HashMap<u8, ModelRun>,
    /// Creation order of runs per session (run slots).
    run_order: HashMap<u8, Vec<u8>>,
    feed: Vec<(u8, u64)>,
    leases: HashMap<u8, (u8, u64, i64)>,
    last_token: u64,
    clock: i64,
    /// Per session, the clock of its latest top-level run written: its `updated_at`.
    activity: HashMap<u8, i64>,
}

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_unix_micros(1_800_000_000_000_000 + seconds * 1_000_000)
}

impl Model {
    fn new() -> Self {
        Self {
            session_ids: (0..SESSIONS).map(|_| SessionId::new()).collect(),
            run_ids: (0..RUNS).map(|_| TurnId::new()).collect(),
            sessions: HashMap::new(),
            runs: HashMap::new(),
            run_order: HashMap::new(),
            feed: Vec::new(),
            leases: HashMap::new(),
            last_token: 0,
            clock: 0,
            activity: HashMap::new(),
        }
    }

    /// A session's expected `updated_at`: its creation, or its latest turn's write.
    fn updated_at(&self, slot: u8) -> Option<Timestamp> {
        let created = *self.sessions.get(&slot)?;
        Some(at(self.activity.get(&slot).map_or(created, |activity| created.max(*activity))))
    }

    /// A run record written now (the clock moves on): its `updated_at` is the clock's.
    fn written_run(&mut self, slot: u8, session: u8, done: bool) -> RunRecord {
        self.clock += 1;
        let mut run = self.run_record(slot, session, done);
        run.updated_at = at(self.clock);
        run
    }

    fn run_record(&self, slot: u8, session: u8, done: bool) -> RunRecord {
        let mut run = RunRecord::new(
            self.session_ids[session as usize],
            vec![TurnInputItem::message("q")],
            Subject::user("m"),
        );
        run.id = self.run_ids[slot as usize];
        if done {
            run.set_state(TurnState::Error { message: "x".into(), completed_at: at(0), metrics: None });
        }
        run
    }
}

async fn apply(store: &dyn Store, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match *op {
        Op::CreateSession(slot) => {
            model.clock += 1;
            let mut session =
                SessionRecord::new(SessionType::Agent, "model", Subject::user(format!("owner{}", slot % 2)));
            session.id = model.session_ids[slot as usize];
            session.created_at = at(model.clock);
            session.updated_at = session.created_at;
            let result = store.create_session(&session).await;
            let expected = if model.sessions.contains_key(&slot) { Outcome::Conflict } else { Outcome::Ok };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            if expected == Outcome::Ok {
                model.sessions.insert(slot, model.clock);
            }
        }
        Op::DeleteSession(slot) => {
            let result = store.delete_session(model.session_ids[slot as usize]).await;
            let expected = if model.sessions.contains_key(&slot) { Outcome::Ok } else { Outcome::NotFound };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            if expected == Outcome::Ok {
                model.sessions.remove(&slot);
                model.activity.remove(&slot);
                model.leases.remove(&slot);
                let gone: Vec<u8> = model.run_order.remove(&slot).unwrap_or_default();
                for run in &gone {
                    model.runs.remove(run);
                }
                model.feed.retain(|(run, _)| !gone.contains(run));
            }
        }
        Op::PutRun { session, run, done, parent } => {
            let mut record = model.written_run(run, session, done);
            record.parent_run_id = parent.map(|slot| model.run_ids[slot as usize]);
            let result = store.put_run(&record, None).await;
            let expected = match (model.sessions.contains_key(&session), model.runs.get(&run)) {
                (false, _) => Outcome::NotFound,
                (true, Some(existing)) if existing.session != session || existing.parent != parent => {
                    Outcome::Invalid
                }
                _ => Outcome::Ok,
            };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            if expected == Outcome::Ok && parent.is_none() {
                model.activity.insert(session, model.clock);
            }
            if expected == Outcome::Ok && !model.runs.contains_key(&run) {
                model.runs.insert(run, ModelRun { session, parent, ..ModelRun::default() });
                model.run_order.entry(session).or_default().push(run);
            }
        }
        Op::Append { run, ref steps, as_step } => {
            let last = model.runs.get(&run).and_then(|r| r.seqs.last().copied()).unwrap_or(0);
            let mut seq = last;
            let mut seqs = Vec::new();
            for step in steps {
                seq += u64::from(*step);
                seqs.push(seq);
            }
            let record = match model.runs.get(&run) {
                Some(existing) => model.run_record(run, existing.session, false),
                None => model.run_record(run, 0, false),
            };
            let events: Vec<_> = seqs.iter().map(|seq| event(&record, *seq)).collect();
            let result = match as_step {
                None => store.append_events(record.id, &events, None).await,
                Some(raise) => {
                    let events = events.iter().cloned().map(Arc::new).collect();
                    let step = TurnStep { high_water: Some(u64::from(raise)), events, ..TurnStep::default() };
                    store.write_step(record.id, &step, None).await
                }
            };
            let increasing =
                seqs.first().is_some_and(|first| *first > last) && seqs.windows(2).all(|p| p[0] < p[1]);
            let expected = match model.runs.get(&run) {
                None => Outcome::NotFound,
                Some(_) if increasing => Outcome::Ok,
                Some(_) => Outcome::Conflict,
            };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            if let (Ok(positions), Some(model_run)) = (&result, model.runs.get_mut(&run)) {
                prop_assert!(positions.windows(2).all(|p| p[0] < p[1]));
                model_run.seqs.extend(&seqs);
                model_run.high_water = model_run.high_water.max(seq).max(as_step.map_or(0, u64::from));
                model.feed.extend(seqs.iter().map(|seq| (run, *seq)));
            }
        }
        Op::ReadTurn { run, desc, after, limit } => {
            let order = if desc { Order::Desc } else { Order::Asc };
            let after = after.map(u64::from);
            let result = store.turn_events(model.run_ids[run as usize], order, after, limit as usize).await;
            match model.runs.get(&run) {
                None => prop_assert_eq!(outcome(&result), Outcome::NotFound),
                Some(model_run) => {
                    let mut expected: Vec<u64> = model_run.seqs.clone();
                    if desc {
                        expected.reverse();
                        expected.retain(|seq| after.is_none_or(|after| *seq < after));
                    } else {
                        expected.retain(|seq| after.is_none_or(|after| *seq > after));
                    }
                    expected.truncate(limit as usize);
                    let got: Vec<u64> = result
                        .map_err(|e| TestCaseError::fail(e.to_string()))?
                        .iter()
                        .map(|s| s.event.seq)
                        .collect();
                    prop_assert_eq!(got, expected, "{:?}", op);
                }
            }
        }
        Op::ListRuns { session, desc, page, parent } => {
            let filter = match parent {
                0 => ParentFilter::TopLevel,
                1 => ParentFilter::Any,
                slot => ParentFilter::Of(model.run_ids[usize::from(slot - 2)]),
            };
            let listed = |slot: &u8| match parent {
                0 => model.runs.get(slot).is_some_and(|run| run.parent.is_none()),
                1 => true,
                of => model.runs.get(slot).is_some_and(|run| run.parent == Some(of - 2)),
            };
            let query = RunQuery {
                order: if desc { Order::Desc } else { Order::Asc },
                parent: filter,
                ..RunQuery::default()
            };
            let session_id = model.session_ids[session as usize];
            let mut request = PageRequest::first(page as usize);
            let mut got = Vec::new();
            loop {
                let result = store.list_runs(session_id, &query, &request).await;
                if !model.sessions.contains_key(&session) {
                    prop_assert_eq!(outcome(&result), Outcome::NotFound);
                    return Ok(());
                }
                let page_result = result.map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(page_result.items.len() <= page as usize);
                got.extend(page_result.items.iter().map(|run| run.id));
                match page_result.next_token {
                    Some(token) => request = PageRequest::after(token, page as usize),
                    None => break,
                }
            }
            let mut expected: Vec<TurnId> = model
                .run_order
                .get(&session)
                .map(|runs| {
                    runs.iter()
                        .filter(|slot| listed(slot))
                        .map(|slot| model.run_ids[*slot as usize])
                        .collect()
                })
                .unwrap_or_default();
            if desc {
                expected.reverse();
            }
            prop_assert_eq!(got, expected, "{:?}", op);
        }
        Op::ListSessions { page, owner, from, until, oldest_first } => {
            let query = SessionQuery {
                owner: owner.map(|owner| format!("owner{owner}")),
                created_from: from.map(|from| at(i64::from(from))),
                created_until: until.map(|until| at(i64::from(until))),
                oldest_first,
                ..SessionQuery::default()
            };
            let mut request = PageRequest::first(page as usize);
            let mut got = Vec::new();
            loop {
                let result = store.list_sessions(&query, &request).await;
                let page_result = result.map_err(|e| TestCaseError::fail(e.to_string()))?;
                got.extend(page_result.items.iter().map(|session| (session.id, session.updated_at)));
                match page_result.next_token {
                    Some(token) => request = PageRequest::after(token, page as usize),
                    None => break,
                }
            }
            let mut expected: Vec<(i64, SessionId, Option<Timestamp>)> = model
                .sessions
                .iter()
                .filter(|(slot, created)| {
                    owner.is_none_or(|owner| *slot % 2 == owner)
                        && from.is_none_or(|from| **created >= i64::from(from))
                        && until.is_none_or(|until| **created <= i64::from(until))
                })
                .map(|(slot, created)| (*created, model.session_ids[*slot as usize], model.updated_at(*slot)))
                .collect();
            expected.sort();
            if !oldest_first {
                expected.reverse();
            }
            let expected: Vec<(SessionId, Timestamp)> =
                expected.into_iter().map(|(_, id, updated)| (id, updated.unwrap_or_default())).collect();
            prop_assert_eq!(got, expected, "{:?}", op);
        }
        Op::Feed => {
            let feed = store
                .feed(&FeedQuery::default(), 10_000)
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(feed.windows(2).all(|p| p[0].position < p[1].position), "positions increase");
            let got: Vec<(TurnId, u64)> = feed.iter().map(|s| (s.event.turn_id, s.event.seq)).collect();
            let expected: Vec<(TurnId, u64)> =
                model.feed.iter().map(|(run, seq)| (model.run_ids[*run as usize], *seq)).collect();
            prop_assert_eq!(got, expected);
        }
        Op::HighWater { run, raise } => {
            let id = model.run_ids[run as usize];
            let raised = store.raise_high_water(id, u64::from(raise), None).await;
            let read = store.high_water(id).await;
            match model.runs.get_mut(&run) {
                None => {
                    prop_assert_eq!(outcome(&raised), Outcome::NotFound);
                    prop_assert_eq!(outcome(&read), Outcome::NotFound);
                }
                Some(model_run) => {
                    model_run.high_water = model_run.high_water.max(u64::from(raise));
                    prop_assert_eq!(raised.ok(), Some(model_run.high_water));
                    prop_assert_eq!(read.ok(), Some(model_run.high_water));
                }
            }
        }
        Op::Acquire { session, owner, now } => {
            let now_s = i64::from(now);
            let result = store
                .acquire_lease(
                    model.session_ids[session as usize],
                    &format!("owner{owner}"),
                    Duration::from_secs(10),
                    at(now_s),
                )
                .await;
            let expected = if !model.sessions.contains_key(&session) {
                Outcome::NotFound
            } else if model.leases.get(&session).is_some_and(|(_, _, expires)| *expires > now_s) {
                Outcome::Conflict
            } else {
                Outcome::Ok
            };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            if let Ok(lease) = result {
                prop_assert!(lease.token > model.last_token, "tokens increase");
                model.last_token = lease.token;
                model.leases.insert(session, (owner, lease.token, now_s + 10));
            }
        }
        Op::Release(session) => {
            let token = model.leases.get(&session).map_or(0, |(_, token, _)| *token);
            let result = store.release_lease(model.session_ids[session as usize], token).await;
            let expected = if model.leases.contains_key(&session) { Outcome::Ok } else { Outcome::Conflict };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            model.leases.remove(&session);
            let lease = store
                .lease(model.session_ids[session as usize])
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(lease, None);
        }
        Op::ListLeases { page } => {
            let mut listed = Vec::new();
            let mut after = None;
            loop {
                let leases = store
                    .list_leases(after, usize::from(page))
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(leases.len() <= usize::from(page));
                let Some(last) = leases.last() else { break };
                after = Some(last.session_id);
                listed.extend(
                    leases.into_iter().map(|lease| (lease.session_id, lease.token, lease.expires_at)),
                );
            }
            let mut expected: Vec<_> = model
                .leases
                .iter()
                .map(|(slot, (_, token, expires))| (model.session_ids[*slot as usize], *token, at(*expires)))
                .collect();
            expected.sort();
            prop_assert_eq!(listed, expected);
        }
        Op::StartTurn { session, run, owner, now, previous } => {
            let now_s = i64::from(now);
            let record = model.written_run(run, session, false);
            let step = TurnStep {
                events: vec![Arc::new(event(&record, 1))],
                run: Some(Arc::new(record.clone())),
                ..TurnStep::default()
            };
            let start = TurnStart {
                owner: format!("owner{owner}").into(),
                ttl: Duration::from_secs(10),
                now: at(now_s),
                previous: previous.map(|slot| model.run_ids[slot as usize]),
            };
            let result = store.start_turn(record.id, &step, &start).await;
            // The session's latest turn: member runs do not count.
            let latest = model.run_order.get(&session).and_then(|runs| {
                runs.iter()
                    .rev()
                    .copied()
                    .find(|slot| model.runs.get(slot).is_some_and(|run| run.parent.is_none()))
            });
            let expected = if !model.sessions.contains_key(&session) {
                Outcome::NotFound
            } else if model.leases.get(&session).is_some_and(|(_, _, expires)| *expires > now_s)
                || latest != previous
                || model.runs.contains_key(&run)
            {
                Outcome::Conflict
            } else {
                Outcome::Ok
            };
            prop_assert_eq!(outcome(&result), expected, "{:?}: {:?}", op, result);
            if let Ok((lease, positions)) = result {
                prop_assert!(lease.token > model.last_token, "tokens increase");
                prop_assert_eq!(positions.len(), 1);
                model.last_token = lease.token;
                model.leases.insert(session, (owner, lease.token, now_s + 10));
                model.activity.insert(session, model.clock);
                model.runs.insert(run, ModelRun { session, parent: None, seqs: vec![1], high_water: 1 });
                model.run_order.entry(session).or_default().push(run);
                model.feed.push((run, 1));
            }
        }
    }
    Ok(())
}

/// A factory of fresh stores.
pub type Factory<'a> = dyn Fn() -> Pin<Box<dyn Future<Output = Harness>>> + 'a;

/// Runs the model test against fresh stores from `factory`: `AGENTRY_MODEL_CASES` cases
/// (default 48) of up to 60 operations each.
pub fn run(factory: impl Fn() -> Pin<Box<dyn Future<Output = Harness>>>) {
    let cases = std::env::var("AGENTRY_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48);
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let result = runner.run(&proptest::collection::vec(op(), 1..60), |ops| {
        runtime.block_on(async {
            let harness = factory().await;
            let mut model = Model::new();
            for op in &ops {
                apply(&*harness.store, &mut model, op).await?;
            }
            Ok(())
        })
    });
    if let Err(error) = result {
        panic!("the store disagrees with the model: {error}");
    }
}
