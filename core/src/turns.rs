//! The worker-turns orchestration every host reuses: first turn, in-place
//! recovery, stop nudges, goal loop, booking.

use crate::data::ExitCode;
use crate::data::{Claim, ProofIdentity, RunStatus, WorkerResult};
use crate::env::Environment;
use crate::exit::outcome_exit_code;
use crate::policy::{
    RECOVERY_DELAYS_SECONDS, RecoveryPolicy, build_stop_nudge, max_recovery_attempts,
    stop_nudge_attempts,
};
use crate::ports::{Board, BoardProof, Judge, Sleeper, TurnRunner, VerdictKind};
use crate::recovery::recover_in_place;
use crate::turn::{TurnInput, TurnKind, TurnOutcome};

/// Goal-mode turns per run when the card names no budget.
pub const DEFAULT_GOAL_MAX_TURNS: u32 = 20;
/// The most characters of the final reply kept in `worker_result`.
pub const LAST_OUTPUT_LIMIT: usize = 500;

/// A goal-mode card's goal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GoalSpec {
    /// Title, a blank line, then the body.
    pub text: String,
    /// Turns allowed in the run, the first one included.
    pub max_turns: u32,
}

impl GoalSpec {
    /// The goal of a card titled `title` with `body`; a budget below 1 falls back to 20.
    pub fn new(title: &str, body: Option<&str>, max_turns: Option<u32>) -> Self {
        let text = match body.map(str::trim).filter(|body| !body.is_empty()) {
            Some(body) => format!("{title}\n\n{body}"),
            None => title.to_owned(),
        };
        let max_turns = max_turns
            .filter(|turns| *turns >= 1)
            .unwrap_or(DEFAULT_GOAL_MAX_TURNS);
        Self { text, max_turns }
    }
}

/// Per-run limits, read from the environment by the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSettings {
    pub max_recovery_attempts: u32,
    pub recovery_delays_seconds: Vec<u64>,
    pub stop_nudge_attempts: u32,
}

impl WorkerSettings {
    /// The settings `HERMES_KANBAN_TURN_RECOVERY` and `HERMES_KANBAN_STOP_NUDGE` ask for.
    pub fn from_env(env: &Environment) -> Self {
        Self {
            max_recovery_attempts: max_recovery_attempts(env),
            recovery_delays_seconds: RECOVERY_DELAYS_SECONDS.to_vec(),
            stop_nudge_attempts: stop_nudge_attempts(env),
        }
    }
}

/// A worker's claim and identity, as bound by the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSetup {
    pub claim: Claim,
    /// The pid booked in `worker_result`.
    pub pid: u32,
    /// Whose process the recovery proof must name.
    pub identity: ProofIdentity,
    /// Set for goal-mode cards.
    pub goal: Option<GoalSpec>,
    pub settings: WorkerSettings,
}

/// One request to run turns: the first message and, for a worker, its claim.
/// A frame without a claim is not a worker, whatever the environment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub message: String,
    pub worker: Option<WorkerSetup>,
}

/// The adapters a run uses.
pub struct WorkerPorts<'a> {
    pub board: &'a dyn Board,
    pub runner: &'a mut dyn TurnRunner,
    pub sleeper: &'a dyn Sleeper,
    pub judge: Option<&'a dyn Judge>,
    /// Receives every line the worker says about recovery and the goal loop.
    pub emit: &'a mut (dyn FnMut(&str) + Send),
}

impl std::fmt::Debug for WorkerPorts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerPorts")
            .field("judge", &self.judge.is_some())
            .finish_non_exhaustive()
    }
}

/// How a goal loop ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoalOutcome {
    CompletedByWorker,
    BlockedByWorker,
    BlockedUnachievable,
    BlockedBudget,
    /// The loop stopped because a turn did not end with exit code 0.
    TurnFailed(ExitCode),
    /// The run ended some other way or its status could not be read.
    Stopped(String),
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRun {
    pub exit_code: ExitCode,
    /// The latest turn outcome, untouched.
    pub last: TurnOutcome,
    /// Model entries made.
    pub turns: u32,
    /// In-place recovery attempts authorised.
    pub recovery_attempts: u32,
    pub stop_nudges: u32,
    pub judge_calls: u32,
    pub goal: Option<GoalOutcome>,
}

/// The worker's run of one card, or a single turn for a non-worker frame.
struct Run<'p, 'a> {
    ports: &'p mut WorkerPorts<'a>,
    setup: &'p WorkerSetup,
    policy: RecoveryPolicy,
    latest: TurnOutcome,
    turns: u32,
    recovery_attempts: u32,
}

impl Run<'_, '_> {
    /// Runs one turn, then recovers it in place if the policy allows; returns
    /// the post-recovery exit code.
    async fn turn(&mut self, message: String, kind: TurnKind) -> ExitCode {
        self.turns += 1;
        let input = TurnInput {
            message,
            kind,
            turn: self.turns,
        };
        self.latest = self.ports.runner.run_turn(&input).await;
        let proof = BoardProof {
            board: self.ports.board,
            claim: &self.setup.claim,
            identity: self.setup.identity,
        };
        let report = recover_in_place(
            &self.policy,
            &mut self.latest,
            self.recovery_attempts,
            &mut self.turns,
            &mut *self.ports.runner,
            &proof,
            self.ports.sleeper,
            &mut *self.ports.emit,
        )
        .await;
        self.recovery_attempts += report.attempts;
        outcome_exit_code(&self.latest, true)
    }

    /// Proves the claim before a turn that no failure authorised: a stop
    /// nudge or a goal turn re-enters the model just like a recovery does.
    async fn claim_live(&mut self) -> bool {
        match self
            .ports
            .board
            .prove_claim(&self.setup.claim, self.setup.identity)
            .await
        {
            Ok(()) => true,
            Err(reason) => {
                let line = crate::recovery::skipped_message(&self.setup.claim.task_id, &reason);
                self.say(&line);
                false
            }
        }
    }

    fn say(&mut self, line: &str) {
        tracing::info!(target: "kanban::worker", "{line}");
        (self.ports.emit)(line);
    }

    fn last_response(&self) -> String {
        match &self.latest {
            Ok(Some(result)) => result.reply().to_owned(),
            Ok(None) => String::new(),
            Err(error) => error.message.clone(),
        }
    }

    async fn stop_nudges(&mut self, mut code: ExitCode) -> (ExitCode, u32) {
        let mut sent = 0;
        while code == ExitCode::Success && sent < self.setup.settings.stop_nudge_attempts {
            if self.ports.board.run_status(&self.setup.claim).await != Ok(RunStatus::Running)
                || !self.claim_live().await
            {
                break;
            }
            sent += 1;
            let task = self.setup.claim.task_id.clone();
            self.say(&format!(
                "[kanban] {task}: reply without a terminal board call; stop nudge {sent}"
            ));
            let nudge = build_stop_nudge(&task, sent, self.setup.settings.stop_nudge_attempts);
            code = self.turn(nudge, TurnKind::StopNudge).await;
        }
        (code, sent)
    }

    async fn block(&mut self, reason: String) {
        if let Err(error) = self
            .ports
            .board
            .block(&self.setup.claim, &reason, None)
            .await
        {
            let line = format!(
                "[kanban] goal loop could not block {}: {error}",
                self.setup.claim.task_id
            );
            self.say(&line);
        }
    }

    async fn goal_loop(
        &mut self,
        goal: &GoalSpec,
        judge_calls: &mut u32,
    ) -> (ExitCode, GoalOutcome) {
        let mut turns_used = 1;
        let mut finalize_sent = false;
        loop {
            match self.ports.board.run_status(&self.setup.claim).await {
                Ok(RunStatus::Running) => {}
                Ok(RunStatus::Done) => return (ExitCode::Success, GoalOutcome::CompletedByWorker),
                Ok(RunStatus::Blocked) => return (ExitCode::Success, GoalOutcome::BlockedByWorker),
                Ok(RunStatus::Superseded) => {
                    return (
                        ExitCode::Success,
                        GoalOutcome::Stopped("run superseded".to_owned()),
                    );
                }
                Err(error) => return (ExitCode::Success, GoalOutcome::Stopped(error.to_string())),
            }
            let verdict = match self.ports.judge {
                None => None,
                Some(judge) => {
                    *judge_calls += 1;
                    // Fail open: a judge that cannot rule lets the work go on.
                    judge.judge(&goal.text, &self.last_response()).await.ok()
                }
            };
            let (kind, reason) = verdict
                .map(|verdict| (verdict.verdict, verdict.reason))
                .unwrap_or((VerdictKind::Continue, String::new()));
            let prompt = match kind {
                VerdictKind::Blocked => {
                    self.block(format!("goal judge ruled the goal unachievable: {reason}"))
                        .await;
                    return (ExitCode::Success, GoalOutcome::BlockedUnachievable);
                }
                VerdictKind::Done if finalize_sent => {
                    self.block("goal judge ruled the goal done twice, but the worker never called kanban_complete after the finalize nudge".to_owned()).await;
                    return (ExitCode::Success, GoalOutcome::BlockedBudget);
                }
                VerdictKind::Done => {
                    finalize_sent = true;
                    format!(
                        "[kanban goal: the judge rules the goal reached ({reason}). Finish now: \
                         call `kanban_complete` (summary, result) for task `{}`, or \
                         `kanban_block` (reason) if something is still missing.]",
                        self.setup.claim.task_id
                    )
                }
                VerdictKind::Continue | VerdictKind::Wait => format!(
                    "[kanban goal: the goal is not reached yet{}. Keep working on it in this \
                     session:\n\n{}\n\nEnd with `kanban_complete` when it is reached, or \
                     `kanban_block` if it cannot be.]",
                    if reason.is_empty() {
                        String::new()
                    } else {
                        format!(" ({reason})")
                    },
                    goal.text
                ),
            };
            if turns_used >= goal.max_turns {
                self.block(format!(
                    "goal-mode worker used its whole turn budget ({turns_used}/{}) without reaching the goal",
                    goal.max_turns
                ))
                .await;
                return (ExitCode::Success, GoalOutcome::BlockedBudget);
            }
            if !self.claim_live().await {
                return (
                    ExitCode::Success,
                    GoalOutcome::Stopped("the claim is no longer live".to_owned()),
                );
            }
            let code = self.turn(prompt, TurnKind::Goal).await;
            turns_used += 1;
            if code != ExitCode::Success {
                return (code, GoalOutcome::TurnFailed(code));
            }
        }
    }
}

fn tail(text: &str, limit: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(limit)).collect()
}

/// Runs a frame's turns and returns the exit code the dispatcher books.
///
/// A worker frame runs: the first turn → in-place recovery → (outside goal
/// mode) up to N stop nudges while the card is still running after a
/// successful turn → (goal mode, only when the post-recovery exit code is 0)
/// the goal loop → booking `worker_result`. A refused or failed recovery
/// therefore never reaches the judge. A frame without a claim runs exactly
/// one turn and returns its result untouched.
pub async fn run_worker_turns(frame: Frame, ports: &mut WorkerPorts<'_>) -> WorkerRun {
    let Some(setup) = frame.worker.as_ref() else {
        let input = TurnInput {
            message: frame.message,
            kind: TurnKind::Initial,
            turn: 1,
        };
        let last = ports.runner.run_turn(&input).await;
        let exit_code = outcome_exit_code(&last, false);
        return WorkerRun {
            exit_code,
            last,
            turns: 1,
            recovery_attempts: 0,
            stop_nudges: 0,
            judge_calls: 0,
            goal: None,
        };
    };
    let policy = RecoveryPolicy {
        task_id: Some(setup.claim.task_id.clone()),
        max_attempts: setup.settings.max_recovery_attempts,
        delays_seconds: setup.settings.recovery_delays_seconds.clone(),
    };
    let mut run = Run {
        ports,
        setup,
        policy,
        latest: Ok(None),
        turns: 0,
        recovery_attempts: 0,
    };
    let mut code = run.turn(frame.message, TurnKind::Initial).await;
    let mut stop_nudges = 0;
    let mut judge_calls = 0;
    let mut goal_outcome = None;
    match &setup.goal {
        Some(goal) if code == ExitCode::Success => {
            let (goal_code, outcome) = run.goal_loop(goal, &mut judge_calls).await;
            code = goal_code;
            goal_outcome = Some(outcome);
        }
        Some(_) => {}
        None => (code, stop_nudges) = run.stop_nudges(code).await,
    }
    let last = match &run.latest {
        Ok(Some(result)) => Some(result),
        _ => None,
    };
    let booking = WorkerResult {
        pid: setup.pid,
        claim_lock: setup.claim.claim_lock.clone(),
        exit_code: code,
        last_output: tail(&run.last_response(), LAST_OUTPUT_LIMIT),
        turns: run.turns,
        recovery_attempts: run.recovery_attempts,
        retry_after_seconds: last.and_then(|result| result.retry_after_seconds),
        failure_reason: last.and_then(|result| result.failure_reason.clone()),
        provider: last.and_then(|result| result.provider.clone()),
        model: last.and_then(|result| result.model.clone()),
    };
    if let Err(error) = run.ports.board.book_result(&setup.claim, &booking).await {
        let line = format!(
            "[kanban] could not book the result of {}: {error}",
            setup.claim.task_id
        );
        run.say(&line);
    }
    WorkerRun {
        exit_code: code,
        last: run.latest,
        turns: run.turns,
        recovery_attempts: run.recovery_attempts,
        stop_nudges,
        judge_calls,
        goal: goal_outcome,
    }
}
