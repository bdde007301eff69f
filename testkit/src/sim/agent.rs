//! Simulated workers and their agents: core's worker life (`run_worker`)
//! driving a scripted agent whose turns take virtual time, show progress,
//! fail in every way a provider fails, and make their terminal board calls.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::rules::FailurePolicy;
use kanban_core::{
    AgentControl, Board, BoardError, Claim, FailureReason, Frame, ProofIdentity, StopReason,
    TurnInput, TurnOutcome, TurnResult, TurnRunner, WorkerLife, WorkerPorts, WorkerSettings,
    WorkerSetup, run_worker,
};

use super::board::SimBoard;
use super::exec::{ProcEnd, ProcFuture, ProcId, Shared, SimClock, SimSleeper, sleep_for};

/// What one run of a card does, turn by turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RunScript {
    /// Fails `failing` turns retryably (recovered in place), then completes.
    Complete { failing: u32 },
    /// Blocks the card for a human.
    Block,
    /// Answers in prose without a terminal board call (a protocol violation).
    Prose,
    /// Hits a quota wall (exit 75).
    Wall,
    /// Hits an auth wall (exit 78).
    Auth,
    /// Fails for good (exit 1, a crash).
    Crash,
    /// One turn runs `seconds` and shows no progress, then completes.
    Hang { seconds: u64 },
    /// One turn runs `seconds` with steady progress, then completes.
    Slow { seconds: u64 },
    /// The tool loop uses its iteration budget (the run is settled timed out).
    IterationLimit,
}

impl RunScript {
    /// True when a counted failure of this run is the run's own doing.
    pub(crate) fn may_fail(self) -> bool {
        !matches!(
            self,
            Self::Complete { .. } | Self::Block | Self::Prose | Self::Wall | Self::Slow { .. }
        )
    }
}

/// The agent's side of a worker process: its progress and its stop.
#[derive(Debug)]
pub(crate) struct SimControl {
    pub(crate) world: Shared,
    pub(crate) proc: ProcId,
}

impl AgentControl for SimControl {
    fn last_progress_millis(&self) -> Option<u64> {
        self.world
            .lock()
            .procs
            .get(&self.proc)
            .and_then(|proc| proc.progress_ms)
    }

    fn stop(&self, reason: StopReason) {
        let mut world = self.world.lock();
        if let Some(proc) = world.procs.get_mut(&self.proc) {
            proc.stop.get_or_insert(reason);
        }
        world.woken.insert(self.proc);
    }
}

struct SimAgent {
    world: Shared,
    board: Arc<SimBoard>,
    claim: Claim,
    script: RunScript,
    proc: ProcId,
    host: usize,
    turns: u32,
}

fn failed(reason: &str, retryable: bool, error: &str) -> TurnResult {
    TurnResult {
        failed: Some(true),
        failure_retryable: Some(retryable),
        failure_reason: Some(FailureReason::parse(reason)),
        error: Some(error.to_owned()),
        completed: Some(false),
        ..TurnResult::default()
    }
}

fn done(reply: &str) -> TurnResult {
    TurnResult {
        completed: Some(true),
        final_response: Some(reply.to_owned()),
        ..TurnResult::default()
    }
}

fn outcome_text(outcome: &Result<(), BoardError>) -> String {
    match outcome {
        Ok(()) => String::new(),
        Err(error) => error.to_string(),
    }
}

/// What a well-behaved agent reports after its terminal call: done, or
/// refused (the claim moved on), or a transient failure when the board
/// failed or the lease only lapsed with nobody to revive it (`kanban
/// complete` exits 75 then), so the environment's fault is never booked as
/// the card's crash.
fn board_failure(outcome: Result<(), BoardError>, reply: &str) -> TurnResult {
    match outcome {
        Ok(()) => done(reply),
        Err(BoardError::LeaseLost { ref reason, .. }) if !reason.only_expired() => {
            failed("unknown", false, &outcome_text(&outcome))
        }
        Err(error) => failed("server_error", true, &error.to_string()),
    }
}

impl SimAgent {
    fn stop(&self) -> Option<StopReason> {
        self.world.lock().procs.get(&self.proc)?.stop
    }

    fn touch(&self) {
        let mut world = self.world.lock();
        let now = world.now_ms;
        if let Some(proc) = world.procs.get_mut(&self.proc) {
            proc.progress_ms = Some(now);
        }
    }

    /// Works for `seconds`, in one-second slices; returns early on a stop.
    async fn work(&self, seconds: u64, progress: bool) -> Option<StopReason> {
        for _ in 0..seconds {
            if let Some(stop) = self.stop() {
                return Some(stop);
            }
            if progress {
                self.touch();
            }
            sleep_for(&self.world, Duration::from_secs(1)).await;
        }
        self.stop()
    }

    /// A terminal call, as `kanban complete` makes it: retried through
    /// passing board faults, and through a lease that only expired (the card
    /// is still this run's; the dispatcher extends a live worker's lease),
    /// for up to a minute and a half.
    async fn terminal(&self, complete: bool) -> Result<(), BoardError> {
        let mut last = Ok(());
        for _ in 0..45 {
            last = if complete {
                self.board
                    .complete(&self.claim, "done in the simulation", None)
                    .await
            } else {
                self.board.block(&self.claim, "needs a human", None).await
            };
            match &last {
                Ok(()) => return last,
                Err(BoardError::LeaseLost { reason, .. }) if !reason.only_expired() => return last,
                Err(_) => sleep_for(&self.world, Duration::from_secs(2)).await,
            }
        }
        last
    }

    async fn turn(&mut self) -> TurnResult {
        self.turns += 1;
        let (seconds, progress) = match self.script {
            RunScript::Hang { seconds } if self.turns == 1 => (seconds, false),
            RunScript::Slow { seconds } if self.turns == 1 => (seconds, true),
            _ => {
                let seconds = self.world.lock().rng.between(1, 20);
                (seconds, true)
            }
        };
        if let Some(stop) = self.work(seconds, progress).await {
            return match stop {
                StopReason::RunLimit => TurnResult {
                    turn_exit_reason: Some("run_limit_exceeded".to_owned()),
                    ..failed("timeout", false, "the run reached its limit")
                },
                StopReason::Signal(_) | StopReason::Fenced => TurnResult {
                    interrupted: Some(true),
                    completed: Some(false),
                    ..TurnResult::default()
                },
            };
        }
        match self.script {
            RunScript::Complete { failing } if self.turns <= failing => {
                failed("timeout", true, "stream reset by peer (simulated)")
            }
            RunScript::Complete { .. } | RunScript::Hang { .. } | RunScript::Slow { .. } => {
                board_failure(self.terminal(true).await, "completed")
            }
            RunScript::Block => board_failure(self.terminal(false).await, "blocked"),
            RunScript::Prose => done("I believe the work is done now."),
            RunScript::Wall => failed("rate_limit", true, "429 quota (simulated)"),
            RunScript::Auth => failed("auth", false, "401 (simulated)"),
            RunScript::Crash => failed("unknown", false, "the agent fell over (simulated)"),
            RunScript::IterationLimit => TurnResult {
                turn_exit_reason: Some("max_iterations_reached(60/60)".to_owned()),
                ..failed("timeout", true, "tool loop budget used (simulated)")
            },
        }
    }
}

#[async_trait]
impl TurnRunner for SimAgent {
    async fn run_turn(&mut self, _: &TurnInput) -> TurnOutcome {
        {
            let mut world = self.world.lock();
            world
                .agents
                .entry(self.claim.task_id.clone())
                .or_default()
                .insert((self.host, self.proc));
        }
        self.touch();
        let result = self.turn().await;
        let mut world = self.world.lock();
        world.say(format!(
            "agent of worker {} turn {}: {}",
            self.proc,
            self.turns,
            serde_json::to_string(&result).unwrap_or_default()
        ));
        if let Some(live) = world.agents.get_mut(&self.claim.task_id) {
            live.remove(&(self.host, self.proc));
        }
        Ok(Some(result))
    }
}

/// How a simulated worker is set up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WorkerPlan {
    pub(crate) heartbeat_interval: Duration,
    pub(crate) run_limit: Option<Duration>,
    pub(crate) failure_policy: FailurePolicy,
}

/// A worker process's future: core's worker life on `claim`.
pub(crate) fn worker_process(
    world: Shared,
    board: Arc<SimBoard>,
    claim: Claim,
    script: RunScript,
    proc: ProcId,
    host: usize,
    plan: WorkerPlan,
) -> ProcFuture {
    Box::pin(async move {
        let clock = SimClock(world.clone());
        let sleeper = SimSleeper(world.clone());
        let control = SimControl {
            world: world.clone(),
            proc,
        };
        let mut agent = SimAgent {
            world: world.clone(),
            board: board.clone(),
            claim: claim.clone(),
            script,
            proc,
            host,
            turns: 0,
        };
        let said = world.clone();
        let mut emit = move |line: &str| said.lock().say(format!("worker {proc}: {line}"));
        let mut ports = WorkerPorts {
            board: &*board,
            runner: &mut agent,
            sleeper: &sleeper,
            judge: None,
            emit: &mut emit,
        };
        let setup = WorkerSetup {
            claim: claim.clone(),
            pid: proc,
            identity: ProofIdentity::BoundOwner(proc),
            goal: None,
            settings: WorkerSettings {
                max_recovery_attempts: 3,
                recovery_delays_seconds: vec![5, 15, 30],
                stop_nudge_attempts: 1,
            },
        };
        let life = WorkerLife {
            clock: &clock,
            agent: &control,
            heartbeat_interval: plan.heartbeat_interval,
            run_limit: plan.run_limit,
            failure_policy: plan.failure_policy,
        };
        let frame = Frame {
            message: format!("work kanban task {}", claim.task_id),
            worker: Some(setup),
        };
        let report = run_worker(frame, proc, &mut ports, &life).await;
        let code = report.exit_code().code();
        world.lock().say(format!(
            "worker {proc} exits {code} (bind: {:?}, watch: {:?}, settled: {:?}, heartbeats: {})",
            report.bind_error, report.watch, report.settled, report.heartbeats
        ));
        world.lock().trailers.insert(claim.run_id, code);
        ProcEnd::Exited(code)
    })
}

/// An agent whose worker was killed under it: it finishes its turn and
/// makes its terminal call with the dead worker's claim, as a real agent
/// in its own process group would.
pub(crate) fn orphan_agent(
    world: Shared,
    board: Arc<SimBoard>,
    claim: Claim,
    seconds: u64,
) -> ProcFuture {
    Box::pin(async move {
        sleep_for(&world, Duration::from_secs(seconds)).await;
        let result = board
            .complete(&claim, "finished by an orphaned agent", None)
            .await;
        ProcEnd::Exited(i32::from(result.is_err()))
    })
}
