//! The dispatcher's side of the board: claims, spawn and signal records,
//! lease extensions, bookings and releases. Every decision is core's.

use kanban_core::rules::{
    self, ClaimCandidate, ClaimVerdict, ExitHistory, FailurePolicy, Release, Released,
    STREAK_SCAN_LIMIT,
};
use kanban_core::walls::Wall;
use kanban_core::{
    BoardError, Booking, Claim, ClaimFilter, ClaimGrant, DispatcherReport, ExitReport, NotLive,
    RunningWorker, SignalReason, WorkerProcess, WorkerResult, events,
};

use crate::StoredBoard;
use crate::engine::{Durability, Engine, TxResult};
use crate::statements::{RunOpening, Tx};
use crate::worker::{apply, existing_card};

/// Rounds of a batched claim: each reads the next candidates, since another
/// dispatcher may hold some of the first.
const CLAIM_ROUNDS: usize = 4;

/// Claims `card` for `claim_lock` if core's rule says so: opens its run and
/// gives the card to it, in the caller's transaction. A ready card whose
/// parents are not done goes back to `todo`.
pub(crate) async fn claim_card(
    tx: &mut Tx<'_>,
    db: &str,
    card: &ClaimCandidate,
    verdict: ClaimVerdict,
    ttl_seconds: i64,
    claim_lock: &str,
    now: i64,
) -> TxResult<Option<ClaimGrant>> {
    match verdict {
        ClaimVerdict::Claim => {}
        ClaimVerdict::WaitForParents => {
            apply(tx, &card.task_id, &rules::reject_claim_for_parents(), now).await?;
            return Ok(None);
        }
        ClaimVerdict::Pass => return Ok(None),
    }
    let ttl = ttl_seconds.max(1);
    let opening = RunOpening {
        task_id: card.task_id.clone(),
        claim_lock: claim_lock.to_owned(),
        expires: now.saturating_add(ttl),
        started_at: now,
        ttl,
        profile: card.assignee.clone(),
    };
    let run_id = tx.open_run(&opening).await?;
    // The compare-and-set: only a ready, unclaimed card becomes the run's.
    if !tx.take_card(&opening, run_id).await? {
        return Err(BoardError::Storage(format!(
            "the claim of {} lost its compare-and-set inside its own transaction",
            card.task_id
        ))
        .into());
    }
    let claim = Claim {
        task_id: card.task_id.clone(),
        db: db.to_owned(),
        run_id,
        claim_lock: claim_lock.to_owned(),
        board: None,
    };
    let event = rules::claimed_event(&claim, opening.expires, ttl);
    tx.append_event(&card.task_id, &event, now).await?;
    Ok(Some(ClaimGrant {
        claim,
        claim_expires: opening.expires,
        goal_mode: card.goal_mode,
        rerun: card.ran_before,
        assignee: card.assignee.clone(),
        title: card.title.clone(),
    }))
}

/// Claims up to one card per lock, walking the ready lane in claim order.
async fn claim_batch(
    tx: &mut Tx<'_>,
    db: &str,
    ttl_seconds: i64,
    claim_locks: &[String],
    filter: &ClaimFilter,
    now: i64,
) -> TxResult<Vec<ClaimGrant>> {
    let mut grants = Vec::new();
    let mut locks = claim_locks.iter();
    let mut lock = locks.next();
    // Cards the rule passes over stay in the lane (an id no kanban wrote,
    // say): each round reads past the ones seen so far.
    let mut passed = std::collections::HashSet::new();
    for _ in 0..CLAIM_ROUNDS {
        let Some(_) = lock else { break };
        // As many as there are locks left, beyond those passed over: an
        // engine that locks what a claim reads (PostgreSQL) would otherwise
        // hold cards other claimers could take, and write a row lock for
        // each. A card sent back to `todo` for its parents leaves the lane.
        let wanted = claim_locks.len() - grants.len() + passed.len();
        let mut candidates = tx.ready_candidates(filter, now, wanted).await?;
        let exhausted = candidates.len() < wanted;
        candidates.sort_by(rules::claim_order);
        for card in &candidates {
            let Some(claim_lock) = lock else { break };
            if passed.contains(&card.task_id) {
                continue;
            }
            let verdict = rules::claim_verdict(card, now, filter, false);
            if verdict == ClaimVerdict::Pass {
                passed.insert(card.task_id.clone());
            }
            if let Some(grant) =
                claim_card(tx, db, card, verdict, ttl_seconds, claim_lock, now).await?
            {
                grants.push(grant);
                lock = locks.next();
            }
        }
        if exhausted {
            break;
        }
    }
    Ok(grants)
}

/// Why the claim's run was last signalled by a dispatcher, if it was.
async fn recorded_signal(tx: &mut Tx<'_>, claim: &Claim) -> TxResult<Option<SignalReason>> {
    Ok(tx
        .latest_payload(&claim.task_id, claim.run_id, "worker_signalled")
        .await?
        // A record without a reason predates reasons: it was a shutdown.
        .map(|payload| {
            payload["reason"]
                .as_str()
                .and_then(SignalReason::parse)
                .unwrap_or(SignalReason::Shutdown)
        }))
}

/// What a board knows about the run when its exit is booked.
async fn exit_history(
    tx: &mut Tx<'_>,
    claim: &Claim,
    scope: Option<&str>,
) -> TxResult<ExitHistory> {
    let recent_outcomes = tx
        .recent_outcomes(&claim.task_id, STREAK_SCAN_LIMIT)
        .await?;
    let recorded_signal = recorded_signal(tx, claim).await?;
    let walls = tx.walls_of(scope, claim.run_id).await?;
    Ok(ExitHistory {
        recent_outcomes,
        recorded_signal,
        walls,
    })
}

impl<E: Engine> StoredBoard<E> {
    pub async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError> {
        let db = self.engine.name().to_owned();
        self.engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).running_workers(&db).await }))
            .await
    }

    pub async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        filter: &ClaimFilter,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let grants = self
            .claim_ready_batch(ttl_seconds, &[claim_lock.to_owned()], filter)
            .await?;
        Ok(grants.into_iter().next())
    }

    pub async fn claim_ready_batch(
        &self,
        ttl_seconds: i64,
        claim_locks: &[String],
        filter: &ClaimFilter,
    ) -> Result<Vec<ClaimGrant>, BoardError> {
        if claim_locks.is_empty() {
            return Ok(Vec::new());
        }
        let (locks, filter) = (claim_locks.to_vec(), filter.clone());
        let db = self.engine.name().to_owned();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (locks, filter, db) = (locks.clone(), filter.clone(), db.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    claim_batch(tx, &db, ttl_seconds, &locks, &filter, now).await
                })
            })
            .await
    }

    pub async fn claim_lane(&self, limit: usize) -> Result<Vec<ClaimCandidate>, BoardError> {
        self.engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).claim_lane(limit).await }))
            .await
    }

    pub async fn report_dispatcher(&self, report: &DispatcherReport) -> Result<(), BoardError> {
        let report = report.clone();
        self.engine
            .write(Durability::Record, move |sql, now| {
                let report = report.clone();
                Box::pin(async move { Tx::new(sql).add_report(&report, now).await })
            })
            .await
    }

    pub async fn walls(&self) -> Result<Vec<Wall>, BoardError> {
        self.engine
            .read(|sql| Box::pin(async move { Tx::new(sql).walls().await }))
            .await
    }

    pub async fn start_probe(&self, claim: &Claim, scopes: &[String]) -> Result<bool, BoardError> {
        let (claim, scopes) = (claim.clone(), scopes.to_vec());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, scopes) = (claim.clone(), scopes.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    if tx.probe_barred(&scopes, now, claim.run_id).await? {
                        return Ok(false);
                    }
                    tx.set_probe(&scopes, claim.run_id).await?;
                    let event = events::wall_probe(&claim, &scopes);
                    tx.append_event(&claim.task_id, &event, now).await?;
                    Ok(true)
                })
            })
            .await
    }

    pub async fn record_spawn(
        &self,
        claim: &Claim,
        process: &WorkerProcess,
    ) -> Result<(), BoardError> {
        let (claim, process) = (claim.clone(), process.clone());
        self.engine
            .write(Durability::LocalRecord, move |sql, now| {
                let (claim, process) = (claim.clone(), process.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    if !tx.record_spawn(&claim, &process).await? {
                        return Err(BoardError::LeaseLost {
                            task_id: claim.task_id.clone(),
                            reason: NotLive::RunMoved { current: 0 },
                        }
                        .into());
                    }
                    let event = events::spawned(&claim, &process);
                    tx.append_event(&claim.task_id, &event, now).await
                })
            })
            .await
    }

    pub async fn record_signal(
        &self,
        claim: &Claim,
        signal: i32,
        reason: SignalReason,
    ) -> Result<(), BoardError> {
        let event = events::worker_signalled(claim, signal, reason);
        let task_id = claim.task_id.clone();
        self.engine
            .write(Durability::LocalRecord, move |sql, now| {
                let (task_id, event) = (task_id.clone(), event.clone());
                Box::pin(async move { Tx::new(sql).append_event(&task_id, &event, now).await })
            })
            .await
    }

    pub async fn extend_lease(
        &self,
        claim: &Claim,
        expires: i64,
        record: Option<(&'static str, &'static str)>,
    ) -> Result<bool, BoardError> {
        let claim = claim.clone();
        self.engine
            .write(Durability::LocalRecord, move |sql, now| {
                let claim = claim.clone();
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let card = existing_card(tx, &claim.task_id).await?;
                    if !rules::holds_claim(&card, &claim) {
                        return Ok(false);
                    }
                    // Never back.
                    if card.claim_expires.is_none_or(|current| current < expires) {
                        tx.set_lease(&claim, expires, None).await?;
                    }
                    if let Some((kind, reason)) = record {
                        let event = events::lease_record(&claim, kind, reason, expires);
                        tx.append_event(&claim.task_id, &event, now).await?;
                    }
                    Ok(true)
                })
            })
            .await
    }

    /// The newest result booked for the claim's run, when its lock is the
    /// claim's.
    pub async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError> {
        let owned = claim.clone();
        let payload = self
            .engine
            .read(move |sql| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    tx.latest_payload(&owned.task_id, owned.run_id, "worker_result")
                        .await
                })
            })
            .await?;
        Ok(payload
            .and_then(|payload| serde_json::from_value::<WorkerResult>(payload).ok())
            .filter(|result| result.claim_lock == claim.claim_lock))
    }

    pub async fn book_exit(
        &self,
        claim: &Claim,
        report: &ExitReport,
    ) -> Result<Booking, BoardError> {
        let (claim, report) = (claim.clone(), report.clone());
        self.engine
            .write(Durability::SyncedUnlessRecord, move |sql, now| {
                let (claim, report) = (claim.clone(), report.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let card = existing_card(tx, &claim.task_id).await?;
                    let scope = report.wall.as_ref().map(|wall| wall.scope.as_str());
                    let history = exit_history(tx, &claim, scope).await?;
                    let (booking, transition) =
                        rules::book_exit(&card, &claim, &history, &report, now);
                    // Most exits are of runs their workers settled, and only
                    // record: a crash losing one loses its event, which no
                    // rule reads back.
                    if !transition.only_records() {
                        tx.require_sync()?;
                    }
                    apply(tx, &claim.task_id, &transition, now).await?;
                    Ok(booking)
                })
            })
            .await
    }

    pub async fn release_claim(
        &self,
        claim: &Claim,
        release: &Release,
        policy: &FailurePolicy,
    ) -> Result<Released, BoardError> {
        let (claim, release, policy) = (claim.clone(), release.clone(), *policy);
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, release) = (claim.clone(), release.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let card = existing_card(tx, &claim.task_id).await?;
                    let signalled = match release {
                        Release::Expired => recorded_signal(tx, &claim).await?,
                        Release::NotStarted { .. } => None,
                    };
                    let Some(transition) =
                        rules::release_claim(&card, &claim, &release, &policy, now, signalled)
                    else {
                        return Ok(Released::NotHeld);
                    };
                    apply(tx, &claim.task_id, &transition, now).await?;
                    // A counted release is the one that sets the count.
                    Ok(if transition.consecutive_failures.is_some() {
                        Released::Counted
                    } else {
                        Released::Uncounted
                    })
                })
            })
            .await
    }

    pub async fn promote_ready(&self) -> Result<usize, BoardError> {
        // Most ticks have nothing to promote: look before writing.
        let now = self.engine.now();
        let waiting = self
            .engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).any_waiting(now).await }))
            .await?;
        if !waiting {
            return Ok(0);
        }
        self.engine
            .write(Durability::Synced, |sql, now| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let mut promoted = 0;
                    for id in tx.promotable(now).await? {
                        let card = existing_card(tx, &id).await?;
                        if let Some(transition) = rules::promote(&card, now) {
                            apply(tx, &id, &transition, now).await?;
                            promoted += 1;
                        }
                    }
                    Ok(promoted)
                })
            })
            .await
    }

    pub async fn check_health(&self) -> Result<(), BoardError> {
        self.engine.check_health().await
    }
}
