//! What a dispatcher needs from a board: the workers it must watch, claims
//! that respect the rate-limit cooldown, and booking an exit from core's one
//! table ([`crate::book_worker_exit`]).

use async_trait::async_trait;

use crate::board::ClaimGrant;
use crate::booking::{Booking, ExitWitness};
use crate::claim::Claim;
use crate::ports::BoardError;
use crate::worker::WorkerResult;

/// A running card as a dispatcher sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningWorker {
    pub claim: Claim,
    /// The pid the dispatcher recorded at spawn, if any.
    pub worker_pid: Option<i64>,
    /// The worker process's start time as recorded at spawn, so a reused pid
    /// is not mistaken for the worker.
    pub worker_started_at: Option<i64>,
    pub claim_expires: Option<i64>,
    pub last_heartbeat_at: Option<i64>,
}

/// Everything the dispatcher learnt about one worker's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitReport {
    pub witness: ExitWitness,
    /// Where the witness came from: `wait`, `worker_result`, `trailer` or `none`.
    pub source: &'static str,
    /// The dispatcher itself signalled this worker (shutdown, reclaim).
    pub signalled_by_dispatcher: bool,
    /// The last lines of the worker's output.
    pub output_tail: String,
    /// Counted failures that block a card naming no `max_retries` of its own.
    pub default_failure_limit: u32,
    /// How long the provider asked to wait, from the worker's result: a rate
    /// limited card is held at least this long, beyond the cooldown.
    pub retry_after_seconds: Option<u64>,
}

/// A heartbeat older than this means a live worker is wedged, not slow.
pub const STALE_HEARTBEAT_SECONDS: i64 = 3600;
/// How long a reclaim waits when the worker survived its termination.
pub const RECLAIM_DEFER_SECONDS: i64 = 120;

/// What a dispatcher does with a claim whose lease expired.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StaleClaimAction {
    /// The worker is gone (or was never seen): release the card.
    Release,
    /// The worker is alive and heartbeated within the hour: it is slow, not
    /// lost; extend the lease.
    Extend,
    /// The worker is alive but silent for over an hour: terminate it, then
    /// release (or defer when it survives the termination).
    Terminate,
}

/// The stale-claim rule: extend a live, recently heartbeating worker's
/// lease; terminate a live, silent one; release the rest. A worker that
/// never heartbeated is not silent yet: its lease alone says when it ran out.
pub fn stale_claim_action(
    worker_alive: bool,
    last_heartbeat_at: Option<i64>,
    now: i64,
) -> StaleClaimAction {
    if !worker_alive {
        return StaleClaimAction::Release;
    }
    match last_heartbeat_at {
        Some(heartbeat) if now.saturating_sub(heartbeat) > STALE_HEARTBEAT_SECONDS => {
            StaleClaimAction::Terminate
        }
        _ => StaleClaimAction::Extend,
    }
}

/// The dispatcher's side of a board.
#[async_trait]
pub trait DispatchBoard: Send + Sync {
    /// Every running card, oldest claim first.
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError>;
    /// How many cards are running.
    async fn count_running(&self) -> Result<usize, BoardError>;
    /// Claims the next ready card (priority first, then oldest) whose last
    /// run did not hit a rate limit less than `rate_limit_cooldown` seconds ago.
    async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        rate_limit_cooldown: i64,
    ) -> Result<Option<ClaimGrant>, BoardError>;
    /// Records the worker pid and its process start time on the card and its
    /// run (event `spawned`). Fenced by the run and the claim lock.
    async fn record_spawn(
        &self,
        claim: &Claim,
        pid: u32,
        started_at: Option<i64>,
    ) -> Result<(), BoardError>;
    /// Records that the dispatcher signalled the run's worker (event
    /// `worker_signalled`), so whichever dispatcher books its exit knows a
    /// 130 was asked for.
    async fn record_signal(&self, claim: &Claim, signal: i32) -> Result<(), BoardError>;
    /// Moves an expired lease to `expires` when it is still expired and
    /// still held by `claim`; records `kind` (`claim_extended` or
    /// `reclaim_deferred`) with `reason`. Returns false when nothing matched.
    async fn extend_expired_lease(
        &self,
        claim: &Claim,
        expires: i64,
        kind: &str,
        reason: &str,
    ) -> Result<bool, BoardError>;
    /// The newest `worker_result` booked for the card, if its claim lock is `claim`'s.
    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError>;
    /// Books one worker exit with [`crate::book_worker_exit`] and applies it,
    /// in one transaction: the run closes with the booking's kind, the card
    /// goes back to ready or to blocked, and an event records the exit code,
    /// the kind and the worker's last output. Only a card still running under
    /// `claim` changes; otherwise the exit is recorded as `settled`. A run
    /// with a `worker_signalled` event counts as signalled by the dispatcher.
    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError>;
}
