//! Budget ledgers of a mission (one team turn) and its instances, kept in the store: every
//! model call and tool call of an instance reserves from its own ledger and its mission's
//! in one transaction, and settles with the real usage after, so concurrent members can
//! never push a budget past its limit by more than one reservation.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentry_memory::{Conflict, Store, StoreError};
use agentry_runner::{Exhausted, Refused, Settled, Spent, Step, StepBudget, ToolContext};
use agentry_types::{
    BudgetLimit, BudgetReservation, BudgetUsage, CancellationReason, EventId, Fence, Timestamp, Usage,
    lease_expiry,
};
use async_trait::async_trait;

/// How long a reservation made outside a turn (without a lease) holds at most if its
/// instance dies before settling it.
const RESERVATION_TTL: Duration = Duration::from_secs(600);

/// The same for a reservation made in a turn. It ends with the turn's lease (when another
/// process takes the turn over, or the turn gives its lease back), so its time limit only
/// bounds how long a dead holder's reservation is kept. It is long: a step holds its
/// reservation for as long as it runs, and a step may run as long as its turn (a
/// `spawn_agent` call lasts the spawned instance's whole run, and its approval wait an hour
/// by default); a reservation that lapsed part way would stop holding, and once swept,
/// its settlement would fail and the step's usage go uncounted. A week (approval waits are
/// not bounded, and neither is a spawned instance's run); the leftovers of dead holders
/// are kept that long (redb's `reserve` reads every reservation).
const LEASED_RESERVATION_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Mission-wide settings of a team's budgets.
#[derive(Debug, Clone)]
pub(crate) struct Budgets {
    /// The mission's totals.
    pub(crate) mission: BudgetLimit,
    /// Tokens held before each model call (the real count is settled after).
    pub(crate) tokens_per_step: u64,
    /// US dollars per million input and output tokens, by model id.
    pub(crate) prices: Arc<HashMap<String, Price>>,
}

/// What a model costs: US dollars per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Price {
    /// Per million input (prompt) tokens.
    pub input_per_million: f64,
    /// Per million output tokens.
    pub output_per_million: f64,
}

impl Price {
    /// The cost of one model call's usage.
    #[must_use]
    pub fn cost(&self, usage: &Usage) -> f64 {
        // Token counts are far below 2^52: the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        let (input, output) = (usage.input_tokens as f64, usage.output_tokens as f64);
        (input * self.input_per_million + output * self.output_per_million) / 1_000_000.0
    }
}

/// Whether a mission's exhaustion was reported: one per mission, that is per team turn,
/// kept as the turn's own (`ToolContext::turn_local`), so it ends with the turn.
#[derive(Debug, Default)]
pub(crate) struct MissionReported(AtomicBool);

impl Budgets {
    /// A ledger for a new instance of `mission` started by the tool call of `context`,
    /// creating the mission's ledger on first use; `None` outside a turn. The turn's
    /// session owns the ledgers (deleting it deletes them), its [`MissionReported`] is
    /// shared by the mission's instances, and reservations are made under its lease. An
    /// instance that `resumes` (it paused in an earlier turn) keeps the ledger it has.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn instance(
        &self,
        context: &ToolContext,
        mission: &str,
        instance: &str,
        ancestors: Vec<String>,
        limit: BudgetLimit,
        resumes: bool,
        control: crate::TeamControl,
    ) -> Result<Option<InstanceLedger>, StoreError> {
        let (Some(store), Some(mission_reported)) =
            (context.store(), context.turn_local::<MissionReported>())
        else {
            return Ok(None);
        };
        let lease = context.fence();
        let session = lease.map(|fence| fence.session_id);
        match store.create_budget(mission, &self.mission, session).await {
            Ok(()) | Err(StoreError::Conflict(Conflict::AlreadyExists { .. })) => {}
            Err(error) => return Err(error),
        }
        // A resumed instance keeps its ledger, and the time it ran before counts.
        let earlier_ms = match store.create_budget(instance, &limit, session).await {
            Ok(()) => 0,
            Err(StoreError::Conflict(Conflict::AlreadyExists { .. })) if resumes => {
                store.budget(instance, Timestamp::now()).await?.used.elapsed_ms.unwrap_or(0)
            }
            Err(error) => return Err(error),
        };
        Ok(Some(InstanceLedger {
            control,
            prices: self.prices.clone(),
            started: Instant::now(),
            earlier_ms,
            settled_ms: AtomicU64::new(0),
            store,
            instance: instance.to_owned(),
            ancestors,
            mission: mission.to_owned(),
            limit,
            tokens_per_step: self.tokens_per_step,
            mission_reported,
            instance_reported: AtomicBool::new(false),
            lease,
        }))
    }
}

/// One instance's view of the ledgers: its own and its mission's.
#[derive(Debug)]
pub(crate) struct InstanceLedger {
    /// To cancel every instance of the mission when its budget runs out, rather than at
    /// each one's next step.
    control: crate::TeamControl,
    prices: Arc<HashMap<String, Price>>,
    /// When the instance started (here): its elapsed time counts against `max_elapsed_ms`.
    started: Instant,
    /// Milliseconds it ran before it paused in an earlier turn (a resumed instance).
    earlier_ms: u64,
    /// Elapsed milliseconds already settled.
    settled_ms: AtomicU64,
    store: Arc<dyn Store>,
    instance: String,
    /// The instances above it, nearest first (design §8a: a reservation covers the
    /// instance, its ancestors and its mission), so a spawner's budget bounds what the
    /// instances it spawns spend: their tokens, steps, tool calls and cost (not their time,
    /// which the spawner's own `spawn_agent` step counts). Held in a second reservation,
    /// settled without the step's time.
    ancestors: Vec<String>,
    mission: String,
    limit: BudgetLimit,
    tokens_per_step: u64,
    mission_reported: Arc<MissionReported>,
    instance_reported: AtomicBool,
    /// The turn's lease: reservations end with it.
    lease: Option<Fence>,
}

#[async_trait]
impl StepBudget for InstanceLedger {
    async fn reserve(&self, step: Step) -> Result<String, Refused> {
        let amount = match step {
            Step::Model => {
                BudgetUsage { tokens_used: self.tokens_per_step, steps_used: 1, ..BudgetUsage::default() }
            }
            Step::Tool => BudgetUsage { tool_calls_used: 1, ..BudgetUsage::default() },
        };
        let own = self.hold(vec![self.instance.clone(), self.mission.clone()], amount).await?;
        if self.ancestors.is_empty() {
            return Ok(own);
        }
        // The instances above it hold the step too, in a reservation of their own: it is
        // settled without the step's time, which each spawner counts as its own (its
        // `spawn_agent` step lasts as long as the instance it spawned runs).
        match self.hold(self.ancestors.clone(), amount).await {
            Ok(theirs) => Ok(format!("{own}{SEPARATOR}{theirs}")),
            Err(refused) => {
                self.release(&own).await;
                Err(refused)
            }
        }
    }

    async fn release(&self, reservation: &str) {
        // A hold that cannot be released ends with the turn's lease, or at the latest with
        // its reservation's time limit.
        for id in reservation.split(SEPARATOR) {
            let _released = self.store.release(id).await;
        }
    }

    async fn settle(&self, reservation: &str, spent: Spent) -> Option<Settled> {
        let mut used = spent.usage;
        if let Some((model, usage)) = &spent.model
            && let Some(price) = self.prices.get(model)
        {
            used.cost_used_usd += price.cost(usage);
        }
        // Time passes whether or not a step used anything: each settlement adds what passed
        // since the last.
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let before = self.settled_ms.swap(now_ms, Ordering::AcqRel);
        used.elapsed_ms = Some(now_ms.saturating_sub(before));
        let mut ids = reservation.split(SEPARATOR);
        let own = ids.next().unwrap_or_default();
        let theirs = ids.next();
        if let Err(error) = self.store.settle(own, &used).await {
            // The usage is not counted; the hold ends with the turn's lease, or at the latest
            // with the reservation's time limit. The ancestors' is given back, not left
            // holding what their other instances could use.
            tracing::warn!(reservation = own, %error, "settling a budget reservation failed");
            if let Some(theirs) = theirs {
                let _released = self.store.release(theirs).await;
            }
            return None;
        }
        if let Some(theirs) = theirs {
            let untimed = BudgetUsage { elapsed_ms: None, ..used };
            if let Err(error) = self.store.settle(theirs, &untimed).await {
                tracing::warn!(reservation = theirs, %error, "settling a budget reservation of the ancestors failed");
            }
        }
        let now = Timestamp::now();
        let ledger = self.store.budget(&self.instance, now).await.ok()?;
        // A step may use more than it held (a model call's real tokens, its time): past a
        // limit, the budget is exhausted now, not at the instance's next step (which a
        // member answering in one call never takes).
        let over =
            |scope: &str, limit: &BudgetLimit, used: &BudgetUsage| match agentry_memory::rules::check_room(
                scope,
                limit,
                used,
                &BudgetUsage::default(),
            ) {
                Err(StoreError::Conflict(Conflict::BudgetExceeded { dimension, .. })) => Some(dimension),
                _ => None,
            };
        // The mission's first: past both, every instance of the mission stops.
        let mut exhausted = match self.store.budget(&self.mission, now).await {
            Ok(mission) => over(&self.mission, &mission.limit, &mission.used)
                .map(|dimension| self.exhausted(true, dimension, mission.used)),
            Err(_) => None,
        };
        if exhausted.is_none() {
            exhausted = over(&self.instance, &ledger.limit, &ledger.used)
                .map(|dimension| self.exhausted(false, dimension, ledger.used));
        }
        Some(Settled { usage: ledger.used, limit: Some(self.limit), exhausted })
    }
}

/// Between the ids of a step's two reservations (its own and its mission's, then its
/// ancestors'), in the one id the engine holds.
const SEPARATOR: char = ' ';

impl InstanceLedger {
    /// Holds `amount` on `scopes`, all or none; returns the reservation's id, or why not.
    async fn hold(&self, scopes: Vec<String>, amount: BudgetUsage) -> Result<String, Refused> {
        let now = Timestamp::now();
        let ttl = if self.lease.is_some() { LEASED_RESERVATION_TTL } else { RESERVATION_TTL };
        let reservation = BudgetReservation {
            id: format!("res_{}", EventId::new()),
            scopes,
            amount,
            expires_at: lease_expiry(now, ttl),
            lease: self.lease,
        };
        match self.store.reserve(&reservation, now).await {
            Ok(()) => Ok(reservation.id),
            Err(StoreError::Conflict(Conflict::BudgetExceeded { scope, dimension, .. })) => {
                if self.ancestors.contains(&scope) {
                    // The instance can spend no more than what is left to those above it. It
                    // reports its own usage; an ancestor reports its exhaustion only if one
                    // of its own steps is refused.
                    let usage = self
                        .store
                        .budget(&self.instance, now)
                        .await
                        .map(|ledger| ledger.used)
                        .unwrap_or_default();
                    return Err(self.stopped_alone(format!("ancestor_{dimension}"), usage));
                }
                let ledger = self.store.budget(&scope, now).await.ok();
                let usage = ledger.as_ref().map(|ledger| ledger.used).unwrap_or_default();
                // Refused only for what other instances of the mission hold (what is spent,
                // and what this instance holds itself, leave room for this step): the
                // mission is not used up, and they go on; only this instance, which cannot
                // have its step, stops. (Its own holds count as spent: an instance whose
                // calls together do not fit has used the mission up.)
                if scope == self.mission
                    && let (Some(mission), Ok(own)) = (&ledger, self.store.budget(&self.instance, now).await)
                    && agentry_memory::rules::check_room(
                        &scope,
                        &mission.limit,
                        &agentry_memory::rules::add_usage(&mission.used, &own.reserved),
                        &reservation.amount,
                    )
                    .is_ok()
                {
                    return Err(self.stopped_alone(format!("mission_{dimension}"), own.used));
                }
                Err(self.exhausted(scope == self.mission, dimension, usage).into())
            }
            // Not the budget's doing: nothing is reported exhausted (a real exhaustion later
            // still is), and the store's words stay out of the team's events.
            Err(StoreError::Conflict(Conflict::StaleFence { .. })) => Err(Refused::LeaseLost),
            Err(error) => {
                tracing::warn!(instance = %self.instance, %error, "reserving a step's budget failed");
                Err(Refused::Unavailable(error.to_string()))
            }
        }
    }

    /// The instance's time (`max_elapsed_ms`) ran out while a step was under way: its
    /// exhaustion, with its usage and the time it has run.
    pub(crate) async fn out_of_time(&self) -> Exhausted {
        let mut usage = self
            .store
            .budget(&self.instance, Timestamp::now())
            .await
            .map(|ledger| ledger.used)
            .unwrap_or_default();
        let here = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        usage.elapsed_ms = Some(self.earlier_ms.saturating_add(here));
        self.exhausted(false, "max_elapsed_ms", usage)
    }

    /// How long the instance may still run before `limit_ms` (counting its earlier turns).
    pub(crate) fn time_left(&self, limit_ms: u64) -> Duration {
        Duration::from_millis(limit_ms.saturating_sub(self.earlier_ms))
    }

    /// The instance stops for a budget above its own (`exhausted_by`), with its own
    /// `usage`; the others of its mission go on.
    fn stopped_alone(&self, exhausted_by: String, usage: BudgetUsage) -> Refused {
        let first = !self.instance_reported.swap(true, Ordering::AcqRel);
        Exhausted { exhausted_by, usage, mission: false, first }.into()
    }

    /// The exhaustion of the instance's budget or (`mission`) its mission's, by
    /// `dimension`; the first time the mission's is found, every instance of it is
    /// cancelled.
    fn exhausted(&self, mission: bool, dimension: &str, usage: BudgetUsage) -> Exhausted {
        let flag = if mission { &self.mission_reported.0 } else { &self.instance_reported };
        let first = !flag.swap(true, Ordering::AcqRel);
        if mission && first {
            self.control.cancel_mission_for(&self.mission, CancellationReason::BudgetExhausted);
        }
        Exhausted {
            exhausted_by: if mission { format!("mission_{dimension}") } else { dimension.to_owned() },
            usage,
            mission,
            first,
        }
    }
}

#[cfg(test)]
mod tests {
    use agentry_memory::InMemoryStore;

    use super::*;

    fn ledger(store: Arc<dyn Store>) -> InstanceLedger {
        InstanceLedger {
            control: crate::TeamControl::default(),
            prices: Arc::default(),
            started: Instant::now(),
            earlier_ms: 0,
            settled_ms: AtomicU64::new(0),
            store,
            instance: "ins_a".to_owned(),
            ancestors: Vec::new(),
            mission: "mis_a".to_owned(),
            limit: BudgetLimit { max_tool_calls: Some(1), ..BudgetLimit::default() },
            tokens_per_step: 10,
            mission_reported: Arc::default(),
            instance_reported: AtomicBool::new(false),
            lease: None,
        }
    }

    /// A reservation made under the turn's lease still holds after the ten minutes one
    /// made outside a turn gets: a step (a spawn whose instance runs long) keeps what it
    /// holds for as long as it runs.
    #[tokio::test]
    async fn a_reservation_under_the_turns_lease_holds_for_as_long_as_its_step_runs() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let session = agentry_types::SessionRecord::new(
            agentry_types::SessionType::Team,
            "team",
            agentry_types::Subject::user("u"),
        );
        store.create_session(&session).await.unwrap();
        let now = Timestamp::now();
        let lease = store.acquire_lease(session.id, "here", Duration::from_secs(30), now).await.unwrap();
        let mut ledger = ledger(store.clone());
        ledger.lease = Some(lease.fence());
        store.create_budget("ins_a", &ledger.limit, Some(session.id)).await.unwrap();
        store.create_budget("mis_a", &BudgetLimit::default(), Some(session.id)).await.unwrap();
        ledger.reserve(Step::Tool).await.unwrap();
        let later = now.saturating_add(RESERVATION_TTL + Duration::from_secs(60));
        let held = store.budget("ins_a", later).await.unwrap().reserved;
        assert_eq!(held.tool_calls_used, 1, "still held after {RESERVATION_TTL:?}");
    }

    /// A spawned instance's step is held and charged on its ancestors' ledgers too, but
    /// without its time: a spawner's own `spawn_agent` step counts that.
    #[tokio::test]
    async fn ancestors_are_charged_a_step_but_not_its_time() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let mut ledger = ledger(store.clone());
        ledger.ancestors = vec!["ins_parent".to_owned()];
        ledger.started = Instant::now().checked_sub(Duration::from_secs(5)).unwrap();
        for scope in ["ins_a", "mis_a", "ins_parent"] {
            store.create_budget(scope, &BudgetLimit::default(), None).await.unwrap();
        }
        let reservation = ledger.reserve(Step::Tool).await.unwrap();
        let held = store.budget("ins_parent", Timestamp::now()).await.unwrap().reserved;
        assert_eq!(held.tool_calls_used, 1, "the ancestor holds the step");
        let spent =
            Spent { usage: BudgetUsage { tool_calls_used: 1, ..BudgetUsage::default() }, model: None };
        ledger.settle(&reservation, spent).await.expect("settled");
        let used = |scope: &'static str| {
            let store = store.clone();
            async move { store.budget(scope, Timestamp::now()).await.unwrap().used }
        };
        let (own, mission, parent) = (used("ins_a").await, used("mis_a").await, used("ins_parent").await);
        assert_eq!((own.tool_calls_used, mission.tool_calls_used, parent.tool_calls_used), (1, 1, 1));
        assert!(own.elapsed_ms.unwrap_or(0) >= 5_000 && mission.elapsed_ms == own.elapsed_ms, "{own:?}");
        assert_eq!(parent.elapsed_ms.unwrap_or(0), 0, "the ancestor is not charged the step's time");
        assert_eq!(store.budget("ins_parent", Timestamp::now()).await.unwrap().reserved.tool_calls_used, 0);
    }

    /// A budget the store cannot hold (here: its ledgers are not there) fails the step
    /// without reporting the budget exhausted, and a real exhaustion afterwards is still
    /// the first reported.
    #[tokio::test]
    async fn a_ledger_the_store_cannot_hold_is_unavailable_not_exhausted() {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let ledger = ledger(store.clone());
        let refused = ledger.reserve(Step::Tool).await.unwrap_err();
        assert!(
            matches!(&refused, Refused::Unavailable(message) if message.contains("ins_a")),
            "{refused:?}"
        );
        store.create_budget("ins_a", &ledger.limit, None).await.unwrap();
        store.create_budget("mis_a", &BudgetLimit::default(), None).await.unwrap();
        ledger.reserve(Step::Tool).await.expect("the one tool call the budget allows");
        let refused = ledger.reserve(Step::Tool).await.unwrap_err();
        assert!(
            matches!(&refused, Refused::Exhausted(Exhausted { first: true, mission: false, exhausted_by, .. })
                if exhausted_by == "max_tool_calls"),
            "{refused:?}"
        );
    }
}
