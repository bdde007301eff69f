//! The dispatcher's ports: its side of the board, the processes it
//! supervises, and what wakes it up. The [`crate::Dispatcher`] decides;
//! these only do.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;

use crate::board::ClaimGrant;
use crate::booking::{Booking, ExitWitness, SignalReason};
use crate::data::{
    BoardError, Claim, EnvironmentFault, ExitCode, FailurePolicy, Release, Released, WorkerResult,
};

use crate::ports::Board;
use crate::rules::ClaimCandidate;

use crate::walls::{Wall, WallHit};

/// A running card as a dispatcher sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningWorker {
    pub claim: Claim,
    /// The pid the dispatcher recorded at spawn, if any.
    pub worker_pid: Option<i64>,
    /// The worker process's start time as recorded at spawn, so a reused pid
    /// is not mistaken for the worker.
    pub worker_started_at: Option<i64>,
    /// The digest of the seal the worker signs its exit trailer with.
    pub seal_digest: Option<String>,
    pub claim_expires: Option<i64>,
    pub last_heartbeat_at: Option<i64>,
    /// When the run started.
    pub run_started_at: i64,
    /// The card's assignee, which picks its agent.
    pub assignee: Option<String>,
    /// The card's own limit on a run's duration.
    pub max_runtime_seconds: Option<i64>,
}

/// Everything the dispatcher learnt about one worker's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExitReport {
    pub witness: ExitWitness,
    /// Where the witness came from: `wait`, `worker_result`, `trailer` or `none`.
    pub source: &'static str,
    /// Why this dispatcher signalled the worker, if it did (the board may
    /// hold a recorded reason too; the stronger one wins).
    pub signalled: Option<SignalReason>,
    /// The last lines of the worker's output.
    pub output_tail: String,
    /// The dispatcher's limits, cooldown and backoff.
    pub policy: FailurePolicy,
    /// How long the provider asked to wait, from the worker's result: a rate
    /// limited card is held at least this long, beyond the cooldown.
    pub retry_after_seconds: Option<u64>,
    /// The provider wall the run hit, if its result names one.
    pub wall: Option<WallHit>,
    /// Why the board refused every earlier booking of this exit, when the
    /// exit is booked again without its output: the card is blocked with it.
    pub unbookable: Option<String>,
}

/// A heartbeat older than this means a live worker is wedged, not slow.
pub const STALE_HEARTBEAT_SECONDS: i64 = 3600;

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
/// never heartbeated is not silent yet: its lease alone says when it ran
/// out. `silent_seconds` is how long the worker has been silent, as the
/// dispatcher measured it (see [`crate::Dispatcher`] on clock jumps).
pub fn stale_claim_action(worker_alive: bool, silent_seconds: Option<i64>) -> StaleClaimAction {
    if !worker_alive {
        return StaleClaimAction::Release;
    }
    match silent_seconds {
        Some(silent) if silent > STALE_HEARTBEAT_SECONDS => StaleClaimAction::Terminate,
        _ => StaleClaimAction::Extend,
    }
}

/// The dispatcher's side of a board, beyond a worker's.
#[async_trait]
pub trait DispatchBoard: Board {
    /// Every running card, oldest run first.
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError>;
    /// Claims the next claimable ready card (priority first, then oldest):
    /// unclaimed, every parent done, and not held (`not_before`) past now.
    /// Only cards `filter` admits are claimed.
    async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        filter: &ClaimFilter,
    ) -> Result<Option<ClaimGrant>, BoardError>;
    /// Claims up to `claim_locks.len()` cards as [`Self::claim_next_ready`]
    /// would, one lock each, in one transaction where the board can: a
    /// dispatcher with room for several pays one commit, not several.
    async fn claim_ready_batch(
        &self,
        ttl_seconds: i64,
        claim_locks: &[String],
        filter: &ClaimFilter,
    ) -> Result<Vec<ClaimGrant>, BoardError>;
    /// The first `limit` cards of the claim lanes (ready, then review), in
    /// claim order, whatever their claims, holds and times: what a dry run
    /// of a tick reads. Writes nothing.
    async fn claim_lane(&self, limit: usize) -> Result<Vec<ClaimCandidate>, BoardError>;
    /// Records what a dispatcher says of itself (for the web board's
    /// health line) and adds its tick durations to the board's (for
    /// metrics).
    async fn report_dispatcher(&self, report: &DispatcherReport) -> Result<(), BoardError>;
    /// Every provider wall on the board.
    async fn walls(&self) -> Result<Vec<Wall>, BoardError>;
    /// Marks `claim`'s run as the probe of the walls of `scopes` (event
    /// `wall_probe`), as one compare-and-set: only when every one of those
    /// walls has reached its reset time and no other running run probes it
    /// (a probe whose run was released or reclaimed no longer counts), so
    /// that two dispatchers seeing a wall open at once let one probe
    /// through, not two. `false`, with nothing written, when a wall is
    /// probed or was re-armed meanwhile. A scope with no wall is no bar.
    async fn start_probe(&self, claim: &Claim, scopes: &[String]) -> Result<bool, BoardError>;
    /// Records the worker process (pid, start time, seal digest) on the
    /// card and its run (event `spawned`). Fenced by the run and the claim lock.
    async fn record_spawn(&self, claim: &Claim, process: &WorkerProcess) -> Result<(), BoardError>;
    /// Records that the dispatcher signals the run's worker and why (event
    /// `worker_signalled`), so whichever dispatcher books its exit knows.
    async fn record_signal(
        &self,
        claim: &Claim,
        signal: i32,
        reason: SignalReason,
    ) -> Result<(), BoardError>;
    /// Moves the lease of a card still running under `claim` forward to
    /// `expires` (never back), on the card and its run; with `record`
    /// (`(kind, reason)`, such as `claim_extended` for a lease that had run
    /// out, or `reclaim_deferred`), the extension is an event too. Returns
    /// false when the card no longer runs under the claim.
    async fn extend_lease(
        &self,
        claim: &Claim,
        expires: i64,
        record: Option<(&'static str, &'static str)>,
    ) -> Result<bool, BoardError>;
    /// The newest `worker_result` booked for the claim's run, if its claim
    /// lock is the claim's.
    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError>;
    /// Books one worker exit with [`crate::rules::book_exit`] and applies
    /// it, in one transaction.
    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError>;
    /// Releases a claim with [`crate::rules::release_claim`], given the
    /// run's recorded signal, and says what it came to.
    async fn release_claim(
        &self,
        claim: &Claim,
        release: &Release,
        policy: &FailurePolicy,
    ) -> Result<Released, BoardError>;
    /// Promotes `todo` cards whose parents are all done; returns how many.
    async fn promote_ready(&self) -> Result<usize, BoardError>;
    /// Checks that the board is still the one it was opened as and safe to
    /// write (a board file replaced, or its journal deleted, while in use is
    /// not). An error means: write nothing more.
    async fn check_health(&self) -> Result<(), BoardError>;
}

/// The upper bounds (milliseconds) of the tick-duration histogram's buckets.
pub const TICK_BUCKETS_MS: [u64; 10] = [1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000];

/// How long ticks took, as a histogram: a count per bucket (a tick counts
/// in the first bucket whose bound it does not pass; the last counts the
/// rest), their sum and their number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickDurations {
    /// One per [`TICK_BUCKETS_MS`] bound, then one for longer ticks.
    pub buckets: [u64; TICK_BUCKETS_MS.len() + 1],
    pub sum_ms: u64,
    pub count: u64,
}

impl TickDurations {
    /// Counts one tick of `ms` milliseconds.
    pub fn observe(&mut self, ms: u64) {
        let bucket = TICK_BUCKETS_MS
            .iter()
            .position(|bound| ms <= *bound)
            .unwrap_or(TICK_BUCKETS_MS.len());
        self.buckets[bucket] += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.count += 1;
    }
}

/// What a dispatcher tells the board of itself every 15 s and as it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatcherReport {
    /// The host it runs on (the claim locks' prefix).
    pub host: String,
    /// Its ticks since its last report.
    pub ticks: TickDurations,
    /// Its workers alive.
    pub in_flight: u64,
    pub state: DispatcherState,
}

/// Whether a dispatcher claims, and why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatcherState {
    Claiming,
    /// A fault that may pass paused claiming (a full disk, a busy board).
    Paused(String),
    /// A fault a person must fix stopped claiming (a missing agent).
    Halted(String),
    /// It is winding down: a stop was asked for, or the board is unsafe.
    Stopping,
    /// It ended.
    Stopped,
}

impl DispatcherState {
    /// Its name, as the board keeps it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Claiming => "claiming",
            Self::Paused(_) => "paused",
            Self::Halted(_) => "halted",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
        }
    }

    /// Why it does not claim, when a fault says why.
    pub fn why(&self) -> Option<&str> {
        match self {
            Self::Paused(why) | Self::Halted(why) => Some(why),
            _ => None,
        }
    }
}

/// Which ready cards a claim may take, by assignee.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimFilter {
    /// The assignees admitted (`""` for a card with none); `None` admits
    /// every card.
    pub assignees: Option<BTreeSet<String>>,
}

impl ClaimFilter {
    /// Admits every card.
    pub fn any() -> Self {
        Self { assignees: None }
    }

    /// Admits the cards of these assignees only (`""`: unassigned).
    pub fn only(assignees: impl IntoIterator<Item = String>) -> Self {
        Self {
            assignees: Some(assignees.into_iter().collect()),
        }
    }

    /// True when a card assigned to `assignee` may be claimed.
    pub fn admits(&self, assignee: Option<&str>) -> bool {
        self.assignees
            .as_ref()
            .is_none_or(|set| set.contains(assignee.unwrap_or("")))
    }

    /// True when it admits no card at all.
    pub fn admits_none(&self) -> bool {
        self.assignees.as_ref().is_some_and(BTreeSet::is_empty)
    }
}

/// A worker process as its supervisor started it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WorkerProcess {
    pub pid: u32,
    /// The process's start time, a fingerprint a reused pid does not match.
    pub started_at: Option<i64>,
    /// The digest of the secret seal the worker signs its exit trailer
    /// with: only that worker can write a trailer a dispatcher trusts.
    pub seal_digest: Option<String>,
}

/// One exit of a worker this supervisor started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkerExit {
    pub pid: u32,
    pub witness: ExitWitness,
}

/// What a run's log says about its end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunLog {
    /// The exit code of the worker's own sealed trailer, if it wrote one.
    pub trailer_code: Option<i32>,
    /// The fault of the environment the worker's trailer reported, if any:
    /// the worker could not work its card for reasons not the card's.
    pub fault: Option<EnvironmentFault>,
    /// The last lines of the worker's output.
    pub output_tail: String,
}

/// How hard a stop is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopSignal {
    /// Asks the process group to finish (SIGTERM).
    Terminate,
    /// Ends the process group at once (SIGKILL).
    Kill,
}

impl EnvironmentFault {
    /// The exit code a dispatcher that halts on this fault ends with:
    /// `EX_CONFIG` for configuration, `EX_TEMPFAIL` otherwise.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Configuration(_) => ExitCode::ConfigFail,
            Self::Transient(_) => ExitCode::TempFail,
        }
    }

    /// The fault a board error means, if it is the environment's: the board
    /// cannot be opened, written or grown.
    pub fn from_board(error: &BoardError) -> Option<Self> {
        match error {
            BoardError::Unusable { .. } | BoardError::NewerSchema { .. } => {
                Some(Self::Configuration(error.to_string()))
            }
            BoardError::Storage(_) | BoardError::DiskFull { .. } | BoardError::Busy { .. } => {
                Some(Self::Transient(error.to_string()))
            }
            _ => None,
        }
    }

    /// The fault of a process that cannot go on without the board (a
    /// dispatcher opening it, a worker starting its card) when a board call
    /// failed: the environment's own kind when the error is one; a claim
    /// whose lease only ran out means a slow host, which passes; any other
    /// refusal means the setup that started the process is wrong.
    pub fn blocking(error: &BoardError) -> Self {
        match (Self::from_board(error), error) {
            (Some(fault), _) => fault,
            (None, BoardError::LeaseLost { reason, .. }) if reason.only_expired() => {
                Self::Transient(error.to_string())
            }
            (None, _) => Self::Configuration(error.to_string()),
        }
    }
}

/// The processes a dispatcher supervises, on its own host.
#[async_trait]
pub trait Supervisor: Send + Sync {
    /// This host's name; every claim lock of this host starts with `HOST:`.
    fn host(&self) -> &str;
    /// A fresh, unguessable claim lock naming this host and dispatcher.
    fn new_claim_lock(&self) -> String;
    /// True when `claim_lock` names a dispatcher process of this host that
    /// no longer runs (its claims can never be spawned).
    fn claimer_gone(&self, claim_lock: &str) -> bool;
    /// Starts a worker for `claim` in a process group of its own. An error
    /// is the environment's, never the card's.
    /// `route` names the agent (`""`: the unnamed one).
    async fn spawn(
        &self,
        claim: &Claim,
        goal_mode: bool,
        route: &str,
    ) -> Result<WorkerProcess, EnvironmentFault>;
    /// The exits of workers this supervisor started, since the last call.
    async fn reap(&self) -> Vec<WorkerExit>;
    /// True when process `pid` of this host runs and, where `started_at` is
    /// known, is the very process that was recorded.
    fn alive(&self, pid: i64, started_at: Option<i64>) -> bool;
    /// Sends `signal` to the process group of worker `pid`, if it is the
    /// recorded process.
    fn signal(&self, pid: i64, started_at: Option<i64>, signal: StopSignal);
    /// Stops every process of this host still working `claim`'s run, the
    /// worker's agents included, whoever started them.
    async fn sweep(&self, claim: &Claim);
    /// Kills every process of this host still working an earlier run of
    /// `claim`'s card, before its new run starts: two runs of one card never
    /// have live agents at once on one host. True once none is left alive;
    /// false when one outlived a bounded wait (the new run must not start).
    async fn sweep_earlier_runs(&self, claim: &Claim) -> bool;
    /// What the run's log says; a trailer counts only when it is signed
    /// with the seal whose digest is `seal_digest` (or, for a worker
    /// recorded without one, unsigned).
    async fn run_log(&self, claim: &Claim, seal_digest: Option<&str>) -> RunLog;
}

/// What wakes a dispatcher between ticks.
#[async_trait]
pub trait Wakeups: Send + Sync {
    /// Waits up to `timeout`, returning sooner when a worker exits, the
    /// board changes or a stop is requested.
    async fn wait(&self, timeout: Duration);
    /// True once a stop was requested (the first SIGINT or SIGTERM).
    fn stop_requested(&self) -> bool;
}
