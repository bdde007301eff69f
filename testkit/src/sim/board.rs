//! The board as simulated processes see it: the real board (SQLite, or
//! PostgreSQL on a test cluster), with a scheduling point before every
//! call, BUGGIFY-style faults, and an oracle that no fenced-out run's write
//! is ever accepted.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;

use async_trait::async_trait;
use kanban_board_postgres::PgBoard;
use kanban_board_sqlite::SqliteBoard;
use kanban_core::rules::{ClaimCandidate, FailurePolicy, Overrun, Release, Released};
use kanban_core::walls::Wall;
use kanban_core::{
    Board, BoardAdmin, BoardError, Booking, Claim, ClaimFilter, ClaimGrant, DispatchBoard,
    DispatcherReport, ExitReport, NotLive, ProofIdentity, RunStatus, RunningWorker, SignalReason,
    WorkerProcess, WorkerResult,
};

use super::exec::{Shared, yield_now};

/// The board faults of one seed: each call site is drawn active or not the
/// first time it is reached (one in four are), then an active site fails
/// one call in twenty while faults are on.
#[derive(Debug, Default)]
pub(crate) struct BoardFaults {
    pub(crate) active: bool,
    pub(crate) sites: BTreeMap<&'static str, bool>,
}

/// A stored board the simulation runs on: either engine.
pub(crate) trait Stored: Board + DispatchBoard + BoardAdmin + Send + Sync {
    /// What a claim names as its board.
    fn location(&self) -> String;
    /// The board's own consistency check ([`kanban_board::StoredBoard::audit`]).
    fn audit(&self) -> Result<Vec<String>, BoardError>;
}

impl Stored for SqliteBoard {
    fn location(&self) -> String {
        self.path().display().to_string()
    }
    fn audit(&self) -> Result<Vec<String>, BoardError> {
        crate::block_on((**self).audit())
    }
}

impl Stored for PgBoard {
    fn location(&self) -> String {
        self.url().to_owned()
    }
    fn audit(&self) -> Result<Vec<String>, BoardError> {
        crate::block_on((**self).audit())
    }
}

/// The board every simulated process shares.
pub(crate) struct SimBoard {
    pub(crate) inner: Box<dyn Stored>,
    pub(crate) world: Shared,
    /// The PostgreSQL database made for this seed, dropped with it: a run
    /// of hundreds of seeds would otherwise fill the cluster's disk.
    pub(crate) database: Option<String>,
}

impl Drop for SimBoard {
    fn drop(&mut self) {
        if let Some(name) = &self.database {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            if let Err(error) = crate::PgCluster::shared().try_admin(&sql) {
                eprintln!("{sql}: {error}");
            }
        }
    }
}

impl std::fmt::Debug for SimBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimBoard")
    }
}

/// Runs a call of the stored board to its end before the simulated
/// process goes on: the scheduling points are the simulator's alone, so a
/// board on a server (whose calls wait on its sockets) replays as exactly
/// as one in memory.
fn done<F: Future>(call: F) -> F::Output {
    crate::block_on(call)
}

impl SimBoard {
    /// A scheduling point, then maybe a fault instead of the call.
    async fn gate(&self, site: &'static str) -> Result<(), BoardError> {
        yield_now(&self.world).await;
        let mut world = self.world.lock();
        if !world.board_faults.active {
            return Ok(());
        }
        let activated = match world.board_faults.sites.get(site) {
            Some(activated) => *activated,
            None => {
                let activated = world.rng.chance(250);
                world.board_faults.sites.insert(site, activated);
                activated
            }
        };
        if !activated || !world.rng.chance(50) {
            return Ok(());
        }
        world.counts.board_faults += 1;
        let error = match world.rng.below(3) {
            0 => BoardError::Busy { attempts: 8 },
            1 => BoardError::DiskFull {
                path: ":memory:".into(),
            },
            _ => BoardError::Storage("simulated I/O error".into()),
        };
        world.say(format!("fault: board {site} fails with {error}"));
        Err(error)
    }

    /// A worker write: gated, and checked against the proof taken just
    /// before it, in the same instant.
    async fn fenced<T>(
        &self,
        claim: &Claim,
        site: &'static str,
        call: impl Future<Output = Result<T, BoardError>>,
    ) -> Result<T, BoardError> {
        self.gate(site).await?;
        let live = done(self.inner.prove_claim(claim, ProofIdentity::AnyProcess));
        let result = done(call);
        let mut world = self.world.lock();
        match (&live, &result) {
            (Err(reason), Ok(_)) => world.finding(format!(
                "a write from a fenced-out run was accepted: {site} by run {} of {} ({reason})",
                claim.run_id, claim.task_id
            )),
            (Ok(()), Err(BoardError::LeaseLost { .. })) => world.finding(format!(
                "a live claim's write was refused: {site} by run {} of {}",
                claim.run_id, claim.task_id
            )),
            (Err(_), Err(BoardError::LeaseLost { .. })) => world.counts.stale_writes_refused += 1,
            _ => {}
        }
        result
    }
}

#[async_trait]
impl Board for SimBoard {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        self.gate("prove")
            .await
            .map_err(|error| NotLive::Unreadable(error.to_string()))?;
        done(self.inner.prove_claim(claim, identity))
    }
    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        self.fenced(claim, "bind", self.inner.bind_worker(claim, pid))
            .await
    }
    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError> {
        self.gate("book_result").await?;
        done(self.inner.book_result(claim, result))
    }
    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        self.gate("run_status").await?;
        done(self.inner.run_status(claim))
    }
    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        self.fenced(claim, "heartbeat", self.inner.heartbeat(claim, note))
            .await
    }
    async fn hand_off(
        &self,
        claim: &Claim,
        handoff: &kanban_core::Handoff,
    ) -> Result<(), BoardError> {
        self.fenced(claim, "complete", self.inner.hand_off(claim, handoff))
            .await
    }
    async fn create_child(
        &self,
        claim: &Claim,
        task: &kanban_core::NewTask,
    ) -> Result<String, BoardError> {
        self.fenced(claim, "create", self.inner.create_child(claim, task))
            .await
    }
    async fn link_child(
        &self,
        claim: &Claim,
        parent: &str,
        child: &str,
    ) -> Result<bool, BoardError> {
        self.fenced(claim, "link", self.inner.link_child(claim, parent, child))
            .await
    }
    async fn attach(
        &self,
        claim: &Claim,
        new: &kanban_core::attachments::NewAttachment,
    ) -> Result<i64, BoardError> {
        self.fenced(claim, "attach", self.inner.attach(claim, new))
            .await
    }
    async fn unblock_child(&self, claim: &Claim, task_id: &str) -> Result<(), BoardError> {
        self.fenced(claim, "unblock", self.inner.unblock_child(claim, task_id))
            .await
    }
    async fn block(
        &self,
        claim: &Claim,
        reason: &str,
        kind: Option<kanban_core::BlockKind>,
    ) -> Result<(), BoardError> {
        self.fenced(claim, "block", self.inner.block(claim, reason, kind))
            .await
    }
    async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError> {
        self.fenced(
            claim,
            "settle_overrun",
            self.inner.settle_overrun(claim, overrun, policy),
        )
        .await
    }
    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        self.fenced(claim, "comment", self.inner.comment(claim, author, text))
            .await
    }
    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: serde_json::Value,
    ) -> Result<(), BoardError> {
        self.fenced(
            claim,
            "append_event",
            self.inner.append_event(claim, kind, payload),
        )
        .await
    }
}

#[async_trait]
impl DispatchBoard for SimBoard {
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError> {
        self.gate("running_workers").await?;
        done(self.inner.running_workers())
    }
    async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        filter: &ClaimFilter,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        self.gate("claim_next_ready").await?;
        done(self.inner.claim_next_ready(ttl_seconds, claim_lock, filter))
    }
    /// One card at a time, each claim through its own gate: the simulator
    /// fails a batch part way through, as a board without batches would.
    async fn claim_ready_batch(
        &self,
        ttl_seconds: i64,
        claim_locks: &[String],
        filter: &ClaimFilter,
    ) -> Result<Vec<ClaimGrant>, BoardError> {
        let mut grants = Vec::new();
        for lock in claim_locks {
            match self.claim_next_ready(ttl_seconds, lock, filter).await? {
                Some(grant) => grants.push(grant),
                None => break,
            }
        }
        Ok(grants)
    }
    async fn claim_lane(&self, limit: usize) -> Result<Vec<ClaimCandidate>, BoardError> {
        self.gate("claim_lane").await?;
        done(self.inner.claim_lane(limit))
    }
    async fn report_dispatcher(&self, report: &DispatcherReport) -> Result<(), BoardError> {
        done(self.inner.report_dispatcher(report))
    }
    async fn walls(&self) -> Result<Vec<Wall>, BoardError> {
        self.gate("walls").await?;
        done(self.inner.walls())
    }
    async fn start_probe(&self, claim: &Claim, scopes: &[String]) -> Result<bool, BoardError> {
        self.gate("start_probe").await?;
        // The oracle: one probe per wall. The board as it stands just before
        // the call (nothing else runs between: no scheduling point).
        let running: BTreeSet<i64> = done(self.inner.running_workers())?
            .iter()
            .map(|worker| worker.claim.run_id)
            .collect();
        let probed: Vec<String> = done(self.inner.walls())?
            .into_iter()
            .filter(|wall| scopes.contains(&wall.scope))
            .filter_map(|wall| {
                let probe = wall.probe_run?;
                (probe != claim.run_id && running.contains(&probe))
                    .then(|| format!("{} (run {probe})", wall.scope))
            })
            .collect();
        let started = done(self.inner.start_probe(claim, scopes))?;
        if started && !probed.is_empty() {
            self.world.lock().finding(format!(
                "run {} started a second probe of a wall another running run probes: {probed:?}",
                claim.run_id
            ));
        }
        Ok(started)
    }
    async fn record_spawn(&self, claim: &Claim, process: &WorkerProcess) -> Result<(), BoardError> {
        self.gate("record_spawn").await?;
        done(self.inner.record_spawn(claim, process))
    }
    async fn record_signal(
        &self,
        claim: &Claim,
        signal: i32,
        reason: SignalReason,
    ) -> Result<(), BoardError> {
        self.gate("record_signal").await?;
        done(self.inner.record_signal(claim, signal, reason))
    }
    async fn extend_lease(
        &self,
        claim: &Claim,
        expires: i64,
        record: Option<(&'static str, &'static str)>,
    ) -> Result<bool, BoardError> {
        self.gate("extend_lease").await?;
        done(self.inner.extend_lease(claim, expires, record))
    }
    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError> {
        self.gate("booked_result").await?;
        done(self.inner.booked_result(claim))
    }
    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError> {
        self.gate("book_exit").await?;
        done(self.inner.book_exit(claim, report))
    }
    async fn release_claim(
        &self,
        claim: &Claim,
        release: &Release,
        policy: &FailurePolicy,
    ) -> Result<Released, BoardError> {
        self.gate("release_claim").await?;
        done(self.inner.release_claim(claim, release, policy))
    }
    async fn check_health(&self) -> Result<(), BoardError> {
        done(self.inner.check_health())
    }

    async fn promote_ready(&self) -> Result<usize, BoardError> {
        self.gate("promote_ready").await?;
        done(self.inner.promote_ready())
    }
}
