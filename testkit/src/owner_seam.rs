//! The seed's owner-side worker seam, over any board: a real claim, a bound
//! worker, core's orchestration, and the exit code the dispatcher books.

use std::sync::Arc;

use kanban_core::{
    Board, BoardAdmin, Claim, Environment, Frame, GoalSpec, Judge, NewTask, ProofIdentity,
    TurnInput, WorkerPorts, WorkerRun, WorkerSettings, WorkerSetup, run_worker_turns, vars,
};

use crate::{ScriptedRunner, VirtualClock, block_on};

/// The claim lock the seam claims with.
pub const OWNER_LOCK: &str = "private-host:owner";

/// Options of one seam run, as the seed fixture's `install(...)` takes them.
#[derive(Clone, Debug)]
pub struct SeamOptions {
    pub goal_mode: bool,
    /// `HERMES_KANBAN_TURN_RECOVERY`, unset when `None`.
    pub recovery: Option<String>,
    /// The backoff schedule; the seed fixture shrinks it to zero.
    pub delays_seconds: Vec<u64>,
    /// Stop nudges allowed. The seed's owner seam predates the stop nudge, so
    /// its cases run with none.
    pub stop_nudges: u32,
    pub goal_max_turns: u32,
}

impl Default for SeamOptions {
    fn default() -> Self {
        Self {
            goal_mode: false,
            recovery: None,
            delays_seconds: vec![0],
            stop_nudges: 0,
            goal_max_turns: 2,
        }
    }
}

/// What a seam run did.
#[derive(Debug)]
pub struct SeamOutcome {
    /// The exit code the dispatcher books (`booked_exit_code`).
    pub booked_exit_code: i32,
    /// Every model entry, in order.
    pub entered: Vec<TurnInput>,
    /// Every line the worker said.
    pub emitted: Vec<String>,
    pub run: WorkerRun,
}

/// A claimed, bound task on a board, ready for a worker run.
#[derive(Debug)]
pub struct OwnerSeam<B> {
    pub board: Arc<B>,
    pub time: VirtualClock,
    pub claim: Claim,
}

impl<B: Board + BoardAdmin + 'static> OwnerSeam<B> {
    /// Creates a task, claims it and records this process's `worker_bound`
    /// event, as the seed fixture does.
    pub fn install(board: Arc<B>, time: VirtualClock, goal_mode: bool) -> Self {
        let claim = block_on(async {
            let new = NewTask {
                title: "recover".into(),
                assignee: Some("default".into()),
                goal_mode,
                ..NewTask::default()
            };
            let task_id = board.create_task(&new).await.expect("create the task");
            let grant = board
                .claim_task(&task_id, 900, OWNER_LOCK)
                .await
                .expect("claim")
                .expect("the task is ready");
            board
                .bind_worker(&grant.claim, std::process::id())
                .await
                .expect("bind");
            grant.claim
        });
        Self { board, time, claim }
    }

    /// Runs the worker's turns with `runner` and returns what the dispatcher books.
    ///
    /// The environment deliberately carries a FOREIGN claim: the proof must
    /// come from the frame, never from the owner's environment.
    pub fn run(
        &self,
        mut runner: ScriptedRunner,
        options: &SeamOptions,
        judge: Option<&dyn Judge>,
    ) -> SeamOutcome {
        let mut env = Environment::new()
            .with(vars::TASK, "t_foreign")
            .with(vars::DB, "/nonexistent/nope.db")
            .with(vars::RUN_ID, "999")
            .with(vars::CLAIM_LOCK, "foreign");
        if let Some(recovery) = &options.recovery {
            env.set(vars::TURN_RECOVERY, recovery.clone());
        }
        let mut settings = WorkerSettings::from_env(&env);
        settings.recovery_delays_seconds = options.delays_seconds.clone();
        settings.stop_nudge_attempts = options.stop_nudges;
        let setup = WorkerSetup {
            claim: self.claim.clone(),
            pid: std::process::id(),
            identity: ProofIdentity::BoundOwner(std::process::id()),
            goal: options
                .goal_mode
                .then(|| GoalSpec::new("g", None, Some(options.goal_max_turns))),
            settings,
        };
        let entered = runner.entered();
        let mut emitted = Vec::new();
        let mut emit = |line: &str| emitted.push(line.to_owned());
        let run = block_on(async {
            let mut ports = WorkerPorts {
                board: self.board.as_ref(),
                runner: &mut runner,
                sleeper: &self.time,
                judge,
                emit: &mut emit,
            };
            run_worker_turns(
                Frame {
                    message: "work".into(),
                    worker: Some(setup),
                },
                &mut ports,
            )
            .await
        });
        let booked_exit_code =
            block_on(self.board.booked_exit_code(&self.claim)).expect("read the booking");
        SeamOutcome {
            booked_exit_code,
            entered: entered.all(),
            emitted,
            run,
        }
    }
}
