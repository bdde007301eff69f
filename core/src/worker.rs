//! A worker process's whole life on one claim: bind, run the turns while a
//! watch keeps the lease alive on the agent's progress, stop the agent the
//! moment the claim is lost or the run overruns, settle an overrun, book.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use crate::data::ExitCode;
use crate::data::{BoardError, FailurePolicy, Overrun};
use crate::ports::{Clock, Sleeper};

use crate::turn::TurnOutcome;
use crate::turns::{Frame, WorkerPorts, WorkerRun, run_worker_turns};

/// `turn_exit_reason` prefix of a turn its runner stopped at the turn's deadline.
pub const TURN_DEADLINE_EXIT_PREFIX: &str = "turn_deadline_exceeded";
/// `turn_exit_reason` prefix of a turn stopped because the run hit its limit.
pub const RUN_LIMIT_EXIT_PREFIX: &str = "run_limit_exceeded";
/// `turn_exit_reason` prefix of a tool loop that used its iteration budget.
pub const ITERATION_LIMIT_EXIT_PREFIX: &str = "max_iterations_reached";

/// Why a worker stops its agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StopReason {
    /// A signal reached the worker (SIGINT, SIGTERM): interrupt the turn.
    Signal(i32),
    /// The run lost its claim: the agent's work must stop now.
    Fenced,
    /// The run outlived its time limit.
    RunLimit,
}

/// The running agent, as the worker's watch sees it.
pub trait AgentControl: Send + Sync {
    /// Monotonic milliseconds of the agent's last sign of progress (output,
    /// a turn starting), if it showed any.
    fn last_progress_millis(&self) -> Option<u64>;
    /// Stops the agent's turn, and every later one: its process group is
    /// asked to stop, then killed after the grace period.
    fn stop(&self, reason: StopReason);
}

/// What a worker needs beyond the ports of its turns.
pub struct WorkerLife<'a> {
    pub clock: &'a dyn Clock,
    pub agent: &'a dyn AgentControl,
    /// How often the watch looks at the agent and the lease.
    pub heartbeat_interval: Duration,
    /// The run's time limit, if it has one.
    pub run_limit: Option<Duration>,
    /// The dispatcher's policy, for settling an overrun.
    pub failure_policy: FailurePolicy,
}

impl std::fmt::Debug for WorkerLife<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerLife")
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("run_limit", &self.run_limit)
            .finish_non_exhaustive()
    }
}

/// How the watch ended, if it did before the turns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchEnd {
    /// The board refused a heartbeat: the claim is lost.
    Fenced,
    /// The run outlived its limit.
    RunLimit,
}

/// What a worker's life did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerLifeReport {
    /// The turns' run (exit code, turns, recoveries…); `None` when the
    /// worker could not even bind its claim.
    pub run: Option<WorkerRun>,
    /// Why the bind failed, when it did.
    pub bind_error: Option<BoardError>,
    /// How the watch ended, when it ended first.
    pub watch: Option<WatchEnd>,
    /// The overrun the worker settled, if any.
    pub settled: Option<Overrun>,
    /// Heartbeats that extended the lease.
    pub heartbeats: u32,
}

impl WorkerLifeReport {
    /// The worker's exit code: its run's; for a claim it could not even
    /// bind, 1 when the claim was already lost (nothing is left to book) and
    /// 75 when the board failed, which is the environment's fault and must
    /// not be charged to the card.
    pub fn exit_code(&self) -> ExitCode {
        match (&self.run, &self.bind_error) {
            (Some(run), _) => run.exit_code,
            (None, Some(BoardError::LeaseLost { reason, .. })) if !reason.only_expired() => {
                ExitCode::Failure
            }
            (None, Some(BoardError::TaskNotFound(_))) | (None, None) => ExitCode::Failure,
            (None, Some(_)) => ExitCode::TempFail,
        }
    }
}

/// Gives the other futures of the task one chance to run.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            Poll::Ready(())
        } else {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await;
}

/// Keeps the lease alive while the agent shows progress, and ends when the
/// claim is lost or the run overruns. A silent agent gets no heartbeat: its
/// lease runs down, and a dispatcher that sees it silent long enough stops it.
async fn watch_run(
    ports: &WatchPorts<'_>,
    claim: &crate::data::Claim,
    heartbeats: &mut u32,
) -> WatchEnd {
    let started = ports.clock.monotonic_millis();
    let mut beaten_at = started;
    loop {
        ports.sleeper.sleep(ports.interval).await;
        // The turns get their turn whatever the sleeper did.
        yield_now().await;
        let mono = ports.clock.monotonic_millis();
        if let Some(limit) = ports.run_limit
            && mono.saturating_sub(started) >= u64::try_from(limit.as_millis()).unwrap_or(u64::MAX)
        {
            return WatchEnd::RunLimit;
        }
        let progressed = ports
            .agent
            .last_progress_millis()
            .is_some_and(|at| at > beaten_at);
        if !progressed {
            continue;
        }
        match ports
            .board
            .heartbeat(claim, Some("worker: agent progress".to_owned()))
            .await
        {
            Ok(_) => {
                *heartbeats += 1;
                beaten_at = mono;
            }
            // The lease only ran out: the card is still ours, and the
            // dispatcher extends a live worker's lease. Keep working.
            Err(BoardError::LeaseLost { reason, .. }) if reason.only_expired() => {}
            Err(BoardError::LeaseLost { .. }) => return WatchEnd::Fenced,
            // A passing board fault: the next beat tries again.
            Err(_) => {}
        }
    }
}

struct WatchPorts<'a> {
    board: &'a dyn crate::ports::Board,
    sleeper: &'a dyn Sleeper,
    clock: &'a dyn Clock,
    agent: &'a dyn AgentControl,
    interval: Duration,
    run_limit: Option<Duration>,
}

/// The overrun a run's last turn settled on, if any.
fn overrun_of(
    last: &TurnOutcome,
    watch: Option<WatchEnd>,
    run_limit: Option<Duration>,
) -> Option<Overrun> {
    if watch == Some(WatchEnd::RunLimit) {
        return Some(Overrun::RunLimit {
            seconds: run_limit.map_or(0, |limit| limit.as_secs()),
        });
    }
    let reason = last.as_ref().ok()?.as_ref()?.turn_exit_reason.as_deref()?;
    if reason.starts_with(ITERATION_LIMIT_EXIT_PREFIX) {
        let detail = reason
            .strip_prefix(ITERATION_LIMIT_EXIT_PREFIX)
            .unwrap_or("")
            .trim_matches(|c| c == '(' || c == ')');
        return Some(Overrun::IterationLimit(detail.to_owned()));
    }
    if reason.starts_with(TURN_DEADLINE_EXIT_PREFIX) {
        let seconds = reason
            .trim_start_matches(TURN_DEADLINE_EXIT_PREFIX)
            .trim_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(0);
        return Some(Overrun::TurnDeadline { seconds });
    }
    None
}

/// How long a worker waits, at most, for a claim it cannot bind yet.
pub const BIND_PATIENCE: Duration = Duration::from_secs(90);

/// Binds the claim to this worker. A lease that only expired (the card is
/// still this run's; its dispatcher extends a live worker's lease) and a
/// passing board fault are waited out, up to [`BIND_PATIENCE`]; a claim
/// that moved on is given up at once.
async fn bind(
    board: &dyn crate::ports::Board,
    sleeper: &dyn Sleeper,
    claim: &crate::data::Claim,
    pid: u32,
) -> Result<(), BoardError> {
    let pause = Duration::from_secs(2);
    let mut waited = Duration::ZERO;
    loop {
        let error = match board.bind_worker(claim, pid).await {
            Ok(()) => return Ok(()),
            Err(BoardError::LeaseLost { reason, task_id }) if !reason.only_expired() => {
                return Err(BoardError::LeaseLost { task_id, reason });
            }
            Err(error @ (BoardError::TaskNotFound(_) | BoardError::InvalidInput(_))) => {
                return Err(error);
            }
            Err(error) => error,
        };
        if waited >= BIND_PATIENCE {
            return Err(error);
        }
        sleeper.sleep(pause).await;
        waited += pause;
    }
}

/// A worker's life on the claim in `frame`: bind the claim to `pid`, run
/// the turns ([`run_worker_turns`]) while the watch keeps the lease alive
/// on agent progress, stop the agent when the claim is lost or the run
/// overruns, then settle an overrun (iteration budget, turn deadline, run
/// limit) as a timed-out run: counted, claim released.
pub async fn run_worker(
    frame: Frame,
    pid: u32,
    ports: &mut WorkerPorts<'_>,
    life: &WorkerLife<'_>,
) -> WorkerLifeReport {
    let Some(setup) = frame.worker.clone() else {
        let run = run_worker_turns(frame, ports).await;
        return WorkerLifeReport {
            run: Some(run),
            bind_error: None,
            watch: None,
            settled: None,
            heartbeats: 0,
        };
    };
    let claim = setup.claim.clone();
    if let Err(error) = bind(ports.board, ports.sleeper, &claim, pid).await {
        return WorkerLifeReport {
            run: None,
            bind_error: Some(error),
            watch: None,
            settled: None,
            heartbeats: 0,
        };
    }
    let watch_ports = WatchPorts {
        board: ports.board,
        sleeper: ports.sleeper,
        clock: life.clock,
        agent: life.agent,
        interval: life.heartbeat_interval.max(Duration::from_millis(1)),
        run_limit: life.run_limit,
    };
    let mut heartbeats = 0;
    let mut watch_end = None;
    let run = {
        let mut turns = pin!(run_worker_turns(frame, ports));
        let mut watch = pin!(watch_run(&watch_ports, &claim, &mut heartbeats));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(run) = turns.as_mut().poll(cx) {
                return Poll::Ready(run);
            }
            if watch_end.is_none()
                && let Poll::Ready(end) = watch.as_mut().poll(cx)
            {
                watch_end = Some(end);
                life.agent.stop(match end {
                    WatchEnd::Fenced => StopReason::Fenced,
                    WatchEnd::RunLimit => StopReason::RunLimit,
                });
                // The turns end soon now: poll them again at once.
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })
        .await
    };
    let settled = overrun_of(&run.last, watch_end, life.run_limit);
    if let Some(overrun) = &settled
        && let Err(error) = ports
            .board
            .settle_overrun(&claim, overrun, &life.failure_policy)
            .await
    {
        let line = format!(
            "[kanban] could not settle the overrun of {}: {error}",
            claim.task_id
        );
        (ports.emit)(&line);
    }
    WorkerLifeReport {
        run: Some(run),
        bind_error: None,
        watch: watch_end,
        settled,
        heartbeats,
    }
}
