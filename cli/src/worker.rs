//! `kanban worker` and `kanban turn`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kanban_agent_port::{
    BoardTools, CommandJudge, ExecAgent, ExecAgentConfig, HttpAgent, HttpAgentConfig, TaskBrief,
};
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{
    Board, BoardAdmin, BoardError, Claim, Environment, Frame, GoalSpec, Judge, ProofIdentity,
    TaskView, TurnInput, TurnKind, TurnOutcome, TurnRunner, WORKER_EXIT_TRAILER, WorkerPorts,
    WorkerSettings, WorkerSetup, heartbeat_interval_seconds, outcome_exit_code, run_worker_turns,
    vars,
};

use crate::args::WorkerArgs;
use crate::runtime::{InterruptibleSleeper, block_on};

/// Runs the worker and writes its two closing lines; returns the exit code.
pub(crate) fn worker(env: &Environment, args: &WorkerArgs, interrupt: Arc<AtomicUsize>) -> i32 {
    let (code, reply) = match run_worker(env, args, interrupt) {
        Ok(done) => done,
        Err(error) => {
            eprintln!("error: {error:#}");
            (1, String::new())
        }
    };
    // The last stdout line is the reply; the last stderr line is the trailer
    // that a dispatcher reads back from the log when it has no wait status.
    println!("{}", reply.replace('\n', " ").trim());
    eprintln!("\n{WORKER_EXIT_TRAILER}{code}");
    code
}

/// The environment every agent process gets on top of ours.
fn agent_env(claim: Option<&Claim>, env: &Environment) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = claim
        .map(|claim| {
            claim
                .to_env_pairs()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
        })
        .unwrap_or_default();
    // Agents call `kanban complete` and friends: make this very binary reachable.
    if let Ok(exe) = std::env::current_exe() {
        pairs.push(("KANBAN_BIN".to_owned(), exe.display().to_string()));
        if let Some(dir) = exe.parent() {
            let path = env.get("PATH").unwrap_or("/usr/bin:/bin");
            pairs.push(("PATH".to_owned(), format!("{}:{path}", dir.display())));
        }
    }
    pairs
}

/// The claim's lease length: the `ttl` its `claimed` event recorded.
fn claim_ttl(view: &TaskView, claim: &Claim) -> i64 {
    view.events
        .iter()
        .rev()
        .find(|e| e.kind == "claimed" && e.run_id == Some(claim.run_id))
        .and_then(|e| e.payload["ttl"].as_i64())
        .unwrap_or(kanban_core::DEFAULT_CLAIM_TTL_SECONDS)
}

/// Keeps the lease alive while a turn's process runs, and only then: the
/// recovery backoff deliberately lets the lease run down.
struct Heartbeater {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeater {
    fn start(
        claim: Claim,
        interval: Duration,
        turn_active: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let board = SqliteBoard::open(&claim.db, Arc::new(SystemClock))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut last = Instant::now();
            let mut was_active = false;
            while !stopping.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                let active = turn_active.load(Ordering::SeqCst);
                if active && !was_active {
                    last = Instant::now(); // a turn just started: count from here
                }
                was_active = active;
                if active && last.elapsed() >= interval {
                    last = Instant::now();
                    match block_on(
                        board.heartbeat(&claim, Some("worker: turn in progress".to_owned())),
                    ) {
                        Ok(expires) => tracing::debug!("lease extended to {expires}"),
                        Err(error) => tracing::warn!("heartbeat refused: {error}"),
                    }
                }
            }
        });
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Heartbeater {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn reply_of(outcome: &TurnOutcome) -> String {
    match outcome {
        Ok(Some(result)) => result.reply().to_owned(),
        Ok(None) => String::new(),
        Err(error) => error.message.clone(),
    }
}

fn run_worker(
    env: &Environment,
    args: &WorkerArgs,
    interrupt: Arc<AtomicUsize>,
) -> anyhow::Result<(i32, String)> {
    let claim = Claim::from_env(env)?;
    let Some(agent) = args.agent.clone() else {
        anyhow::bail!(
            "no agent to run: pass --agent CMD or set KANBAN_AGENT (see docs/agent-protocol.md)"
        );
    };
    let board = SqliteBoard::open(&claim.db, Arc::new(SystemClock))?;
    let view = match block_on(board.show_task(&claim.task_id)) {
        Ok(view) => view,
        Err(BoardError::TaskNotFound(id)) => {
            anyhow::bail!("task {id} is not on the board {}", claim.db)
        }
        Err(error) => return Err(error.into()),
    };
    let pid = std::process::id();
    block_on(board.bind_worker(&claim, pid))
        .map_err(|error| anyhow::anyhow!("cannot start work: {error}"))?;
    let interval = Duration::from_secs(heartbeat_interval_seconds(claim_ttl(&view, &claim)));
    let task = view.task;

    let goal_mode = task.goal_mode || env.get_trimmed(vars::GOAL_MODE) == Some("1");
    let mut settings = WorkerSettings::from_env(env);
    settings.recovery_delays_seconds = args.recovery_delays.clone();
    let setup = WorkerSetup {
        claim: claim.clone(),
        pid,
        identity: ProofIdentity::BoundOwner(pid),
        goal: goal_mode
            .then(|| GoalSpec::new(&task.title, task.body.as_deref(), task.goal_max_turns)),
        settings,
    };
    let brief = TaskBrief {
        id: task.id.clone(),
        title: task.title.clone(),
        body: task.body.clone().unwrap_or_default(),
    };
    let session_id = format!("{}-run{}", claim.task_id, claim.run_id);
    let (mut runner, turn_active): (Box<dyn TurnRunner>, Arc<AtomicBool>) =
        if agent.starts_with("http:") {
            let config = HttpAgentConfig::parse(&agent, env).map_err(anyhow::Error::msg)?;
            let tool_board = SqliteBoard::open(&claim.db, Arc::new(SystemClock))?;
            let tools = BoardTools::new(Arc::new(tool_board), claim.clone(), "worker");
            let agent = HttpAgent::new(
                config,
                Some(&brief),
                Some(tools),
                session_id,
                interrupt.clone(),
            );
            let active = agent.turn_active();
            (Box::new(agent), active)
        } else {
            let agent = ExecAgent::new(
                ExecAgentConfig {
                    command: agent,
                    task: brief,
                    env: agent_env(Some(&claim), env),
                    session_id,
                    interrupt_grace: Duration::from_secs(args.grace),
                    forward_output: true,
                },
                interrupt.clone(),
            );
            let active = agent.turn_active();
            (Box::new(agent), active)
        };
    let heartbeater = Heartbeater::start(claim.clone(), interval, turn_active)?;
    let judge = args
        .judge
        .clone()
        .map(|command| CommandJudge::new(command, agent_env(Some(&claim), env)));
    let sleeper = InterruptibleSleeper { interrupt };
    let mut emit = |line: &str| eprintln!("{line}");
    let message = match &task.body {
        Some(body) if !body.trim().is_empty() => {
            format!("work kanban task {}: {}\n\n{body}", task.id, task.title)
        }
        _ => format!("work kanban task {}: {}", task.id, task.title),
    };
    let run = block_on(async {
        let mut ports = WorkerPorts {
            board: &board,
            runner: runner.as_mut(),
            sleeper: &sleeper,
            judge: judge.as_ref().map(|j| j as &dyn Judge),
            emit: &mut emit,
        };
        run_worker_turns(
            Frame {
                message,
                worker: Some(setup),
            },
            &mut ports,
        )
        .await
    });
    drop(heartbeater);
    tracing::info!(
        "worker done: exit {} after {} turns, {} in-place recoveries",
        run.exit_code,
        run.turns,
        run.recovery_attempts
    );
    Ok((run.exit_code.code(), reply_of(&run.last)))
}

/// One turn outside any board: no claim, no recovery.
pub(crate) fn one_turn(
    env: &Environment,
    agent: &str,
    message: &str,
    interrupt: Arc<AtomicUsize>,
) -> anyhow::Result<i32> {
    let session_id = format!("turn-{}", std::process::id());
    let mut runner: Box<dyn TurnRunner> = if agent.starts_with("http:") {
        let config = HttpAgentConfig::parse(agent, env).map_err(anyhow::Error::msg)?;
        Box::new(HttpAgent::new(
            config,
            None,
            None,
            session_id.clone(),
            interrupt,
        ))
    } else {
        Box::new(ExecAgent::new(
            ExecAgentConfig {
                command: agent.to_owned(),
                task: TaskBrief::default(),
                env: agent_env(None, env),
                session_id: session_id.clone(),
                interrupt_grace: Duration::from_secs(10),
                forward_output: false,
            },
            interrupt,
        ))
    };
    let input = TurnInput {
        message: message.to_owned(),
        kind: TurnKind::Initial,
        turn: 1,
    };
    let outcome = block_on(runner.run_turn(&input));
    let session = match &outcome {
        Ok(Some(result)) => result.session_id.clone().unwrap_or(session_id),
        _ => session_id,
    };
    println!("{}", reply_of(&outcome));
    eprintln!("session_id: {session}");
    Ok(outcome_exit_code(&outcome, false).code())
}
