//! `kanban worker` and `kanban turn`: wiring core's worker life to the
//! board, the agent, the clock and the process's signals.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use async_trait::async_trait;
use kanban_agent_port::{
    Activity, BRIEF_COMMENTS, BoardTools, CommandJudge, ExecAgent, ExecAgentConfig, Forward,
    HttpAgent, HttpAgentConfig, SeedWorker, TaskBrief, seed_worker_profile,
};
use kanban_board_sqlite::SystemClock;
use kanban_core::ExitCode;
use kanban_core::rules::FailurePolicy;
use kanban_core::{
    Board, BoardError, Claim, Environment, EnvironmentFault, Frame, GoalSpec, Judge, ProofIdentity,
    Sleeper, TaskView, Trailer, TurnInput, TurnKind, TurnOutcome, TurnRunner, WorkerLife,
    WorkerPorts, WorkerSettings, WorkerSetup, heartbeat_interval_seconds, outcome_exit_code,
    run_worker, vars,
};

use crate::args::{GlobalArgs, TurnArgs, WorkerArgs};
use crate::board_path::{AnyBoard, open_board_for_reading, open_claim_board};
use crate::dispatch_link::{LINK_VAR, LinkedBoard};
use crate::out::{errln, outln_or_drop};
use crate::runtime::{TokioOffload, block_on};
use crate::seed_worker::{SeedWorkerPlace, seed_worker_place};
use crate::worker_calls::CallServer;

/// The variable a dispatcher hands its worker the secret seal in. The
/// worker signs its exit trailer with it; its agents never see it.
pub(crate) const SEAL_VAR: &str = "KANBAN_WORKER_SEAL";

/// How long a worker spends ending what its run left running; past it,
/// its dispatcher looks for them.
const ORPHANS_PATIENCE: Duration = Duration::from_secs(2);

/// How a worker process ended.
struct WorkerEnd {
    code: ExitCode,
    reply: String,
    /// A fault of the environment that kept the worker from its card.
    fault: Option<EnvironmentFault>,
}

impl WorkerEnd {
    fn fault(fault: EnvironmentFault) -> Self {
        Self {
            code: ExitCode::TempFail,
            reply: String::new(),
            fault: Some(fault),
        }
    }
}

/// Runs the worker and writes its two closing lines; returns the exit code.
pub(crate) fn worker(
    env: &Environment,
    args: &WorkerArgs,
    interrupt: Arc<AtomicUsize>,
) -> ExitCode {
    // The seal, the dispatcher's socket and the board's password come on
    // standard input from a dispatcher: never in this process's environment.
    let env = &crate::worker_secrets::receive(env).unwrap_or_else(|problem| {
        errln!("warning: {problem}; going on without them");
        env.clone()
    });
    let seal = env.get_trimmed(SEAL_VAR).map(str::to_owned);
    // What the agent leaves orphaned comes to this worker, not to init, so
    // that the worker can end all of it before it says it is done.
    let reaper = crate::orphans::Reaper::adopt_orphans();
    let ended = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| {
            runtime.block_on(async {
                let work = run_worker_process(env, args, interrupt);
                match &reaper {
                    Some(reaper) => tokio::select! {
                        ended = work => ended,
                        never = reaper.reap_ended_meanwhile() => match never {},
                    },
                    None => work.await,
                }
            })
        });
    let end = ended.unwrap_or_else(|error| {
        errln!("error: {error:#}");
        WorkerEnd {
            code: ExitCode::Failure,
            reply: String::new(),
            fault: None,
        }
    });
    // The last stdout line is the reply; the last stderr line is the
    // trailer, signed with the seal only this worker was given.
    outln_or_drop!("{}", end.reply.replace('\n', " ").trim());
    let alone = reaper
        .as_ref()
        .is_some_and(|reaper| reaper.end_all(ORPHANS_PATIENCE));
    let trailer = Trailer {
        code: end.code.code(),
        seal,
        alone,
        fault: end.fault,
    };
    errln!("\n{}", trailer.lines());
    end.code
}

/// The environment every agent process gets on top of ours: the settings
/// this worker read, under both their names (so that the two never
/// disagree), then its claim.
fn agent_env(claim: Option<&Claim>, env: &Environment) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = env
        .kanban_pairs()
        .into_iter()
        .chain(claim.map(Claim::to_env_pairs).unwrap_or_default())
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
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

/// The board a worker makes its calls on: its dispatcher's, over the link,
/// or the board itself.
enum WorkerBoard {
    Linked(Arc<LinkedBoard>),
    Own(Arc<dyn AnyBoard>),
}

impl WorkerBoard {
    fn board(&self) -> Arc<dyn Board> {
        match self {
            Self::Linked(board) => board.clone(),
            Self::Own(board) => board.clone(),
        }
    }

    /// The card; over the link, `pid` is bound with it (see
    /// [`LinkedBoard::show_task`]).
    async fn show_task(&self, task_id: &str, pid: u32) -> Result<TaskView, BoardError> {
        match self {
            Self::Linked(board) => board.show_task(pid).await,
            Self::Own(board) => board.show_task(task_id).await,
        }
    }
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

fn reply_of(outcome: &TurnOutcome) -> String {
    match outcome {
        Ok(Some(result)) => result.reply().to_owned(),
        Ok(None) => String::new(),
        Err(error) => error.message.clone(),
    }
}

/// Sleeps on the runtime's timer, and stops early when the worker must
/// stop: a worker told to stop does not sit out a 90 s backoff.
#[derive(Debug)]
struct StoppableSleeper {
    activity: Arc<Activity>,
}

#[async_trait]
impl Sleeper for StoppableSleeper {
    async fn sleep(&self, duration: Duration) {
        // Always one slice at least: a loop that sleeps must yield, even
        // once the worker was told to stop.
        let deadline = tokio::time::Instant::now() + duration;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::sleep(left.min(Duration::from_millis(100))).await;
            if left <= Duration::from_millis(100) || self.activity.stop_reason().is_some() {
                break;
            }
        }
    }
}

/// The board this worker makes its calls on: its dispatcher's, through the
/// link, or the board itself; a fault of the environment when neither.
async fn hold_board(
    claim: &Claim,
    agent: &str,
    clock: Arc<SystemClock>,
    env: &Environment,
) -> Result<WorkerBoard, EnvironmentFault> {
    // An exec agent's worker makes its board calls through its dispatcher,
    // which holds the board open; an HTTP agent's tools need the whole board.
    let socket = env
        .get_trimmed(LINK_VAR)
        .filter(|_| !agent.starts_with("http:"));
    let linked = match socket {
        Some(socket) => LinkedBoard::connect(socket, claim, clock.clone(), env).await,
        None => None,
    };
    match linked {
        Some(linked) => {
            tracing::debug!("board calls go to the dispatcher");
            Ok(WorkerBoard::Linked(Arc::new(linked)))
        }
        None => match open_claim_board(claim, clock, env).await {
            Ok(board) => Ok(WorkerBoard::Own(board.into_shared(Arc::new(TokioOffload)))),
            Err(error) => {
                errln!("error: {error:#}");
                Err(crate::fault::of_setup(&error))
            }
        },
    }
}

/// The agent of this worker's turns: an HTTP agent with the board's tools,
/// or a command run once per turn, whose board calls come back here (the
/// seed system's worker, with `seed`, makes its own).
#[expect(clippy::too_many_arguments, reason = "the parts of one worker, named")]
fn make_runner(
    agent: &str,
    env: &Environment,
    args: &WorkerArgs,
    held: &WorkerBoard,
    claim: &Claim,
    brief: TaskBrief,
    session_id: String,
    activity: &Arc<Activity>,
    seed: Option<(String, SeedWorkerPlace)>,
    place: Option<crate::workspace::Place>,
) -> anyhow::Result<Box<dyn TurnRunner>> {
    Ok(if agent.starts_with("http:") {
        let config = HttpAgentConfig::parse(agent, env).map_err(anyhow::Error::msg)?;
        // The HTTP agent's tools use the board this worker holds open.
        let WorkerBoard::Own(tool_board) = held else {
            anyhow::bail!("an HTTP agent's worker holds its board itself");
        };
        let tool_board: Arc<dyn kanban_agent_port::ToolBoard> = tool_board.clone();
        let tools = BoardTools::new(tool_board, claim.clone(), "worker")
            .with_attachments(crate::attach::claim_attachments_root(claim, env));
        Box::new(HttpAgent::new(
            config,
            Some(&brief),
            Some(tools),
            session_id,
            activity.clone(),
        ))
    } else {
        let mut agent_vars = agent_env(Some(claim), env);
        if let Some(place) = &place {
            agent_vars.extend(place.env());
        }
        let mut agent_env_remove = vec![SEAL_VAR.to_owned(), LINK_VAR.to_owned()];
        agent_env_remove.extend(crate::worker_secrets::notify_secret_names(env));
        // The agent runs in its card's workspace: a program named by a
        // relative path is the one beside the folder this worker started in.
        let mut command = match std::env::current_dir() {
            Ok(here) if place.is_some() => crate::agent_check::anchor_program(agent, &here),
            _ => agent.to_owned(),
        };
        let seed_worker = match seed {
            Some((profile, place)) => {
                agent_vars.extend(place.env);
                agent_env_remove.extend(place.env_remove);
                command = place.program;
                Some(SeedWorker {
                    profile,
                    workspace: place.workspace,
                })
            }
            None => None,
        };
        // The agent's board calls come back here, to the board this worker
        // holds open; without the socket they open the board themselves.
        match CallServer::bind() {
            Ok(server) => {
                agent_vars.push(server.env_pair());
                // The agent's calls and fence proofs need no credentials of
                // its own now; a password it is not handed cannot reach its
                // output (and the card's log) by an `env` or a crash dump.
                agent_env_remove.push("PGPASSWORD".to_owned());
                let facts = place.clone().map(|place| {
                    Arc::new(move || place.result()) as crate::worker_calls::HandoffFacts
                });
                tokio::spawn(server.serve(held.board(), claim.clone(), facts));
            }
            Err(error) => {
                tracing::debug!("agents open the board for their calls: no socket ({error})");
            }
        }
        Box::new(ExecAgent::new(
            ExecAgentConfig {
                command,
                task: brief,
                env: agent_vars,
                env_remove: agent_env_remove,
                session_id,
                interrupt_grace: args.grace,
                forward: Forward::Both,
                turn_timeout: Some(args.turn_timeout),
                seed_worker,
                workdir: place.map(|place| place.path),
            },
            activity.clone(),
        ))
    })
}

/// How the worker ends after its card's life: its exit code and reply, or
/// a fault of the environment that kept it from its card.
fn worker_end(report: kanban_core::WorkerLifeReport) -> WorkerEnd {
    if let Some(error) = &report.bind_error {
        errln!("error: cannot start work: {error}");
        let lost = matches!(error, BoardError::LeaseLost { reason, .. } if !reason.only_expired());
        if !lost && !matches!(error, BoardError::TaskNotFound(_)) {
            return WorkerEnd::fault(EnvironmentFault::blocking(error));
        }
    }
    let code = report.exit_code();
    let Some(run) = report.run else {
        return WorkerEnd {
            code,
            reply: String::new(),
            fault: None,
        };
    };
    tracing::info!(
        "worker done: exit {} after {} turns, {} in-place recoveries",
        run.exit_code,
        run.turns,
        run.recovery_attempts
    );
    if let Err(error) = &run.last
        && error.environment
    {
        // The agent could not even be started: the dispatcher's setup, not the card.
        return WorkerEnd::fault(EnvironmentFault::Configuration(error.message.clone()));
    }
    WorkerEnd {
        code,
        reply: reply_of(&run.last),
        fault: None,
    }
}

/// What the turns need of the card and the worker's settings.
fn worker_setup(
    claim: &Claim,
    view: &TaskView,
    pid: u32,
    env: &Environment,
    args: &WorkerArgs,
) -> WorkerSetup {
    let task = &view.task;
    let goal_mode = task.goal_mode || env.get_trimmed(vars::GOAL_MODE) == Some("1");
    let mut settings = WorkerSettings::from_env(env);
    settings.recovery_delays_seconds = args.recovery_delays.clone();
    WorkerSetup {
        claim: claim.clone(),
        pid,
        identity: ProofIdentity::BoundOwner(pid),
        goal: goal_mode
            .then(|| GoalSpec::new(&task.title, task.body.as_deref(), task.goal_max_turns)),
        settings,
    }
}

/// The card as its agent is told it: the newest comments with it.
fn brief_of(view: &TaskView, claim: Option<&Claim>) -> TaskBrief {
    let task = &view.task;
    TaskBrief {
        id: task.id.clone(),
        title: task.title.clone(),
        body: task.body.clone().unwrap_or_default(),
        fence_token: claim.map(|claim| claim.run_id),
        comments: view
            .comments
            .iter()
            .rev()
            .take(BRIEF_COMMENTS)
            .rev()
            .cloned()
            .collect(),
    }
}

/// The goal loop's judge, when there is one. It makes no board call: it
/// needs neither the seal that signs this worker's trailer nor the board's
/// password.
fn judge_of(args: &WorkerArgs, claim: &Claim, env: &Environment) -> Option<CommandJudge> {
    args.judge.clone().map(|command| CommandJudge {
        env_remove: [SEAL_VAR, LINK_VAR, "PGPASSWORD"]
            .into_iter()
            .map(str::to_owned)
            .chain(crate::worker_secrets::notify_secret_names(env))
            .collect(),
        ..CommandJudge::new(command, agent_env(Some(claim), env))
    })
}

/// The first turn's message: the card's title, and its body when it has one.
fn first_message(task: &kanban_core::TaskRecord) -> String {
    first_message_of(&task.id, &task.title, task.body.as_deref())
}

fn first_message_of(id: &str, title: &str, body: Option<&str>) -> String {
    match body {
        Some(body) if !body.trim().is_empty() => {
            format!("work kanban task {id}: {title}\n\n{body}")
        }
        _ => format!("work kanban task {id}: {title}"),
    }
}

/// What `kanban turn` tells its agent, and its message: the card `--card`
/// names (read only, nothing claimed), with `--id`, `--title` and `--body`
/// over it; the message given, else the task's first message as a worker
/// sends it.
pub(crate) fn turn_task(
    global: &GlobalArgs,
    env: &Environment,
    args: &TurnArgs,
) -> anyhow::Result<(TaskBrief, String)> {
    let mut brief = TaskBrief::default();
    if let Some(card) = &args.card {
        let board = open_board_for_reading(global, env)?;
        let card = crate::admin::card_id(&board, card)?;
        let view = block_on(board.show_task(&card))?;
        brief = TaskBrief {
            fence_token: None,
            ..brief_of(&view, None)
        };
    }
    for (given, field) in [
        (&args.id, &mut brief.id),
        (&args.title, &mut brief.title),
        (&args.body, &mut brief.body),
    ] {
        if let Some(given) = given {
            field.clone_from(given);
        }
    }
    let message = match &args.message {
        Some(message) => message.clone(),
        None if !brief.title.is_empty() => {
            first_message_of(&brief.id, &brief.title, Some(&brief.body))
        }
        None => anyhow::bail!(
            "kanban turn needs a message: give one (kanban turn --agent CMD \"say hello\"), or a task with --title or --card ID to send its first message"
        ),
    };
    Ok((brief, message))
}

/// The seed system's worker `agent` names, with its place for `claim`;
/// `None` for any other agent.
fn seed_worker_of(
    agent: &str,
    claim: &Claim,
    tenant: Option<&str>,
    env: &Environment,
    workspace: Option<&crate::workspace::Place>,
) -> Result<Option<(String, SeedWorkerPlace)>, EnvironmentFault> {
    match (seed_worker_profile(agent), workspace) {
        (Some(Ok(profile)), Some(workspace)) => {
            let place = seed_worker_place(&profile, claim, tenant, env, &workspace.path)?;
            Ok(Some((profile, place)))
        }
        (Some(Err(problem)), _) => Err(EnvironmentFault::Configuration(format!(
            "--agent {agent:?}: {problem}"
        ))),
        (Some(Ok(_)), None) | (None, _) => Ok(None),
    }
}

/// `kanban context ID [--json]`: what a worker would hand the card's
/// agent, read only (nothing claimed).
pub(crate) fn context(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let id = crate::admin::card_id(&board, id)?;
    let view = block_on(board.show_task(&id))?;
    let brief = brief_of(&view, None);
    let message = first_message(&view.task);
    if as_json {
        outln_or_drop!(
            "{}",
            serde_json::json!({"task": brief, "message": message, "turn": 1, "kind": TurnKind::Initial.as_str(), "fence_token": null})
        );
        return Ok(ExitCode::Success);
    }
    outln_or_drop!("{message}");
    if !brief.comments.is_empty() {
        outln_or_drop!("\ncomments (newest last):");
        for comment in &brief.comments {
            outln_or_drop!(
                "  {}: {}",
                crate::output::visible_line(&comment.author),
                crate::output::visible_line(&comment.body)
            );
        }
    }
    Ok(ExitCode::Success)
}

async fn run_worker_process(
    env: &Environment,
    args: &WorkerArgs,
    interrupt: Arc<AtomicUsize>,
) -> anyhow::Result<WorkerEnd> {
    let claim = Claim::from_env(env)?;
    let Some(agent) = args.agent.clone() else {
        anyhow::bail!(
            "no agent to run: pass --agent CMD or set KANBAN_AGENT (see docs/agent-protocol.md)"
        );
    };
    let clock = Arc::new(SystemClock);
    let held = match hold_board(&claim, &agent, clock.clone(), env).await {
        Ok(held) => held,
        Err(fault) => return Ok(WorkerEnd::fault(fault)),
    };
    let board = held.board();
    let pid = std::process::id();
    let view = match claimed_card(&held, &claim, pid).await? {
        Ok(view) => view,
        Err(end) => return Ok(end),
    };
    let interval = Duration::from_secs(heartbeat_interval_seconds(claim_ttl(&view, &claim)));
    let task = view.task.clone();
    let run_limit = task
        .max_runtime_seconds
        .or(args.max_runtime)
        .and_then(|seconds| u64::try_from(seconds).ok())
        .map(Duration::from_secs);
    let mut setup = worker_setup(&claim, &view, pid, env, args);
    let (place, seed) = match places_of(&agent, &task, &claim, env) {
        Ok(places) => places,
        Err(end) => return Ok(end),
    };
    // The seed system's worker runs its own goal loop, judged by its own
    // judge: ours would judge it twice.
    if seed.is_some() {
        setup.goal = None;
    }
    let brief = brief_of(&view, Some(&claim));
    let activity = Activity::new(clock.clone(), interrupt);
    let session_id = format!("{}-run{}", claim.task_id, claim.run_id);
    let mut runner = make_runner(
        &agent,
        env,
        args,
        &held,
        &claim,
        brief,
        session_id,
        &activity,
        seed,
        place.clone(),
    )?;
    let judge = judge_of(args, &claim, env);
    let sleeper = StoppableSleeper {
        activity: activity.clone(),
    };
    let mut emit = |line: &str| errln!("{line}");
    let message = first_message(&task);
    let mut ports = WorkerPorts {
        board: &*board,
        runner: runner.as_mut(),
        sleeper: &sleeper,
        judge: judge.as_ref().map(|j| j as &dyn Judge),
        emit: &mut emit,
    };
    let life = WorkerLife {
        clock: &*clock,
        agent: &*activity,
        heartbeat_interval: interval,
        run_limit,
        failure_policy: failure_policy(args),
    };
    let frame = Frame {
        message,
        worker: Some(setup),
    };
    let report = run_worker(frame, pid, &mut ports, &life).await;
    if let Some(place) = &place {
        remove_finished_scratch(&held, &claim, place, pid).await;
    }
    Ok(worker_end(report))
}

/// The claimed card, as the worker starts; a board that fails is the
/// environment's fault.
async fn claimed_card(
    held: &WorkerBoard,
    claim: &Claim,
    pid: u32,
) -> anyhow::Result<Result<kanban_core::TaskView, WorkerEnd>> {
    match held.show_task(&claim.task_id, pid).await {
        Ok(view) => Ok(Ok(view)),
        Err(BoardError::TaskNotFound(id)) => {
            anyhow::bail!("task {id} is not on the board {}", claim.db)
        }
        Err(error) => {
            errln!("error: {error}");
            Ok(Err(WorkerEnd::fault(EnvironmentFault::blocking(&error))))
        }
    }
}

/// The failure policy a worker settles an overrun with.
fn failure_policy(args: &WorkerArgs) -> FailurePolicy {
    FailurePolicy {
        failure_limit: args.failure_limit,
        backoff_base_seconds: i64::try_from(args.retry_backoff.as_secs()).unwrap_or(0),
        ..FailurePolicy::default()
    }
}

/// A workspace made ready, and the seed system's worker's place in it.
type Places = (
    Option<crate::workspace::Place>,
    Option<(String, SeedWorkerPlace)>,
);

/// Where a command agent (the seed system's worker too) works: the card's
/// workspace, made ready; one that cannot be is the environment's fault.
/// An HTTP agent works in no folder.
fn places_of(
    agent: &str,
    task: &kanban_core::TaskRecord,
    claim: &Claim,
    env: &Environment,
) -> Result<Places, WorkerEnd> {
    let fault = |fault: EnvironmentFault| {
        errln!("error: {fault}");
        WorkerEnd::fault(fault)
    };
    let place = if agent.starts_with("http:") {
        None
    } else {
        let place = crate::workspace::prepare(task, claim, env)
            .map_err(|problem| fault(EnvironmentFault::Configuration(problem)))?;
        Some(place)
    };
    let seed =
        seed_worker_of(agent, claim, task.tenant.as_deref(), env, place.as_ref()).map_err(fault)?;
    Ok((place, seed))
}

/// Removes the scratch folder of a card its run completed, as the seed
/// system does, unless a card that waits for it may still read what it left.
async fn remove_finished_scratch(
    held: &WorkerBoard,
    claim: &Claim,
    place: &crate::workspace::Place,
    pid: u32,
) {
    // An empty folder holds nothing for anyone: gone, whatever the card's
    // state (a later run makes it again), without reading the board.
    if place.kind != kanban_core::workspaces::WorkspaceKind::Scratch
        || std::fs::remove_dir(&place.path).is_ok()
    {
        return;
    }
    let Ok(view) = held.show_task(&claim.task_id, pid).await else {
        return;
    };
    let mut children = Vec::new();
    for child in &view.children {
        let status = held.show_task(child, pid).await.ok();
        children.push(status.and_then(|child| child.task.status.known()));
    }
    if !kanban_core::workspaces::scratch_may_go(view.task.status.known(), &children) {
        return;
    }
    crate::workspace::remove_scratch(place);
}

/// One turn outside any board: no claim, no recovery.
pub(crate) fn one_turn(
    env: &Environment,
    agent: &str,
    (task, message): &(TaskBrief, String),
    interrupt: Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if seed_worker_profile(agent).is_some() {
        anyhow::bail!(
            "the seed system's worker ({agent}) works a card it was claimed for: run it under `kanban dispatch` or `kanban worker`"
        );
    }
    let activity = Activity::new(Arc::new(SystemClock), interrupt);
    let session_id = format!("turn-{}", std::process::id());
    let mut runner: Box<dyn TurnRunner> = if agent.starts_with("http:") {
        let config = HttpAgentConfig::parse(agent, env).map_err(anyhow::Error::msg)?;
        // No task given: a plain chat turn, with no card's system prompt.
        let told = (!task.id.is_empty() || !task.title.is_empty()).then_some(task);
        Box::new(HttpAgent::new(
            config,
            told,
            None,
            session_id.clone(),
            activity,
        ))
    } else {
        Box::new(ExecAgent::new(
            ExecAgentConfig {
                command: agent.to_owned(),
                task: task.clone(),
                env: agent_env(None, env),
                env_remove: crate::worker_secrets::notify_secret_names(env),
                session_id: session_id.clone(),
                interrupt_grace: Duration::from_secs(10),
                forward: Forward::Stderr,
                turn_timeout: None,
                seed_worker: None,
                workdir: None,
            },
            activity,
        ))
    };
    let input = TurnInput {
        message: message.clone(),
        kind: TurnKind::Initial,
        turn: 1,
    };
    let outcome = runtime.block_on(runner.run_turn(&input));
    let session = match &outcome {
        Ok(Some(result)) => result.session_id.clone().unwrap_or(session_id),
        _ => session_id,
    };
    outln_or_drop!("{}", reply_of(&outcome));
    errln!("session_id: {session}");
    Ok(outcome_exit_code(&outcome, false))
}
