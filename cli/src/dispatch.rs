//! `kanban dispatch`: wires core's dispatcher to the board, the process
//! supervisor and the clock, and maps how it ended to an exit code.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use kanban_board_sqlite::SystemClock;
use kanban_core::ExitCode;
use kanban_core::rules::FailurePolicy;
use kanban_core::{
    DispatchEnd, DispatchPorts, DispatchSettings, Dispatcher, Environment, EnvironmentFault,
    RunMode, claim_ttl_seconds, vars,
};
use nix::fcntl::{Flock, FlockArg};

use crate::agent_check::agent_route;
use crate::agents_file::AgentCommand;
use crate::args::DispatchArgs;
use crate::board_path::{Engine, Schema, open_db};
use crate::dispatch_link::LinkServer;
use crate::out::errln;
use crate::output::time_of_day_now;
use crate::runtime::TokioOffload;
use crate::supervisor::{BoardWatch, ProcessSupervisor, WorkerCommand};

/// How a dispatcher is run.
#[derive(Clone, Debug)]
pub(crate) struct DispatchPlan {
    pub(crate) db: PathBuf,
    /// The board's folder on this host: its logs (and agents file).
    pub(crate) folder: PathBuf,
    pub(crate) board_slug: String,
    pub(crate) mode: RunMode,
    pub(crate) settings: DispatchSettings,
    pub(crate) worker_args: Vec<String>,
    pub(crate) worker_env: Vec<(String, String)>,
    /// The agents by route; each worker gets its card's.
    pub(crate) agents: Agents,
}

/// A dispatcher's agents.
#[derive(Clone, Debug, Default)]
pub(crate) struct Agents {
    /// By route (`""`: the unnamed agent).
    pub(crate) by_route: BTreeMap<String, AgentCommand>,
    /// The named agent for cards with no assignee (the file's `default`).
    pub(crate) unassigned: Option<String>,
}

impl DispatchPlan {
    pub(crate) fn from_args(
        args: &DispatchArgs,
        agents: Agents,
        db: PathBuf,
        folder: PathBuf,
        board_slug: String,
        env: &Environment,
    ) -> Result<Self, String> {
        let seconds = |duration: Duration| duration.as_secs_f64().to_string();
        let mut worker_args = Vec::new();
        if let Some(judge) = &args.judge {
            worker_args.extend(["--judge".to_owned(), judge.clone()]);
        }
        if let Some(delays) = &args.recovery_delays {
            worker_args.extend(["--recovery-delays".to_owned(), delays.clone()]);
        }
        if let Some(limit) = args.max_runtime {
            worker_args.extend(["--max-runtime".to_owned(), limit.to_string()]);
        }
        worker_args.extend([
            // Workers give their agents half the dispatcher's grace, so that
            // a stopped worker settles while the dispatcher still waits.
            "--grace".to_owned(),
            seconds(args.grace / 2),
            "--turn-timeout".to_owned(),
            seconds(args.turn_timeout),
            "--failure-limit".to_owned(),
            args.failure_limit.to_string(),
            "--retry-backoff".to_owned(),
            seconds(args.retry_backoff),
        ]);
        let mode = match (args.once, args.until_idle) {
            (true, _) => RunMode::Once,
            (false, true) => RunMode::UntilIdle,
            (false, false) => RunMode::Forever,
        };
        let ttl_seconds = claim_ttl_seconds(args.ttl, env)?;
        let rate_limit_cooldown = match (
            args.rate_limit_cooldown,
            env.get_trimmed(vars::RATE_LIMIT_COOLDOWN_SECONDS),
        ) {
            (Some(given), _) => given,
            (None, Some(raw)) => crate::duration::parse_duration(raw).map_err(|error| {
                format!(
                    "{}: {error}",
                    vars::both_names(vars::RATE_LIMIT_COOLDOWN_SECONDS)
                )
            })?,
            (None, None) => Duration::from_secs(300),
        };
        refuse_seed_workers_on_postgres(&db, &agents)?;
        Ok(Self {
            db,
            folder,
            board_slug,
            mode,
            settings: DispatchSettings {
                ttl_seconds,
                max_in_progress: usize::try_from(args.max_in_progress).unwrap_or(1),
                failure_policy: FailurePolicy {
                    failure_limit: args.failure_limit,
                    rate_limit_cooldown: i64::try_from(rate_limit_cooldown.as_secs())
                        .unwrap_or(i64::MAX),
                    backoff_base_seconds: i64::try_from(args.retry_backoff.as_secs())
                        .unwrap_or(i64::MAX),
                    // 0 is allowed: a probe goes through at once.
                    max_wall_seconds: i64::try_from(args.max_wall.as_secs()).unwrap_or(i64::MAX),
                },
                interval: args.interval.max(Duration::from_millis(50)),
                grace: args.grace,
                max_runtime_seconds: args.max_runtime,
                routes: agents
                    .by_route
                    .iter()
                    .map(|(route, agent)| (route.clone(), agent_route(route, agent, env)))
                    .collect(),
                unassigned_route: agents.unassigned.clone(),
            },
            worker_args,
            worker_env: Vec::new(),
            agents,
        })
    }
}

/// The seed system's worker writes the board's SQLite file itself: no
/// agent of a PostgreSQL board's dispatcher may be one.
fn refuse_seed_workers_on_postgres(db: &Path, agents: &Agents) -> Result<(), String> {
    let seed_worker = agents
        .by_route
        .iter()
        .find(|(_, agent)| kanban_agent_port::seed_worker_profile(&agent.spec).is_some());
    match seed_worker {
        Some((route, _)) if crate::board_path::postgres_url(db).is_some() => Err(format!(
            "agent {}: the seed system's worker writes the board's SQLite file itself, so it cannot work a PostgreSQL board; give the agent a `command` or `http` instead",
            kanban_core::walls::route_label(route)
        )),
        _ => Ok(()),
    }
}

/// A dispatcher's line on stdout, stamped with the time of day (UTC).
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{} {line}", time_of_day_now());
    let _ = out.flush();
}

/// The lock that makes a dispatcher the board's only one: an advisory lock
/// on `BOARD.dispatch.lock` beside the board's canonical path, the file the
/// seed system's dispatcher locks too, so the two exclude each other. The
/// board has one name (symlinks resolved, a second hard link refused), so
/// every way to reach it reaches this one lock file; a bind mount reaches the
/// same folder, and so the same file. The board file itself is never opened
/// outside SQLite: closing such a handle would drop SQLite's own locks.
fn take_lock(
    db: &Path,
    wait: bool,
    interrupt: &AtomicUsize,
) -> anyhow::Result<Option<Flock<File>>> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = db.as_os_str().to_owned();
    name.push(".dispatch.lock");
    let path = PathBuf::from(name);
    let mut said = false;
    loop {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot open the dispatch lock {}", path.display()))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(Some(lock)),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) => {}
            Err((_, errno)) => anyhow::bail!("cannot lock {}: {errno}", path.display()),
        }
        if !wait {
            say(&format!(
                "another dispatcher is ticking {}; this one exits",
                db.display()
            ));
            return Ok(None);
        }
        if !said {
            say(&format!(
                "another dispatcher is ticking {}; waiting for it to stop",
                db.display()
            ));
            said = true;
        }
        if interrupt.load(Ordering::SeqCst) != 0 {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Runs a dispatcher on its board until its plan says stop; returns its exit
/// code (success at once when `--once` finds another dispatcher holding the
/// board).
pub(crate) fn run(
    plan: &DispatchPlan,
    env: &Environment,
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // The blocking threads run the board's calls, and a SQLite board
        // makes them on one connection behind one lock: a second thread
        // only waited on that lock, woken and put to sleep again at each
        // call (about a tenth of the dispatcher's CPU). One thread takes
        // the calls in the order they came.
        .max_blocking_threads(1)
        .build()
        .context("cannot start the dispatcher's runtime")?;
    // Nothing is claimed until the board, its lock and the log folder are
    // known good: a setup fault is the environment's, never a card's.
    let opened = runtime.block_on(open_db(
        &plan.db,
        Arc::new(SystemClock),
        env,
        Schema::Upgrade,
        || Ok(plan.folder.clone()),
    ));
    let board = match opened {
        Ok(board) => board,
        Err(error) => return Ok(refuse_to_start(&crate::fault::of_setup(&error))),
    };
    let (_lock, watch, logs) = match hold_board(&board, plan, interrupt) {
        Ok(Some(held)) => held,
        // Another dispatcher holds the board (`--once`).
        Ok(None) => return Ok(ExitCode::Success),
        Err(fault) => return Ok(refuse_to_start(&fault)),
    };
    let exe = std::env::current_exe().context("cannot find the kanban binary to run workers")?;
    let board_name = board.name();
    let seed_logs = match &board.engine {
        Engine::Sqlite(sqlite) => crate::supervisor::seed_default_board(sqlite.path()),
        Engine::Postgres(_) => false,
    };
    let board = board.into_shared(Arc::new(TokioOffload));
    let worker_env = plan.worker_env.clone();
    // What no agent may read reaches a worker on its standard input.
    let mut secrets = crate::worker_secrets::from_dispatcher(env);
    // Workers make their board calls here, on the board this dispatcher
    // holds open; without the socket each opens the board itself.
    // The listener registers with the runtime's reactor as it is made.
    let bound = {
        let _inside = runtime.enter();
        LinkServer::bind()
    };
    let (closing, closed) = tokio::sync::watch::channel(false);
    let serving = match bound {
        Ok(server) => {
            secrets.push(server.env_pair());
            Some(runtime.spawn(server.serve(board.clone(), board_name, closed)))
        }
        Err(error) => {
            tracing::debug!("workers open the board for their calls: no socket ({error})");
            None
        }
    };
    let supervisor = Arc::new(ProcessSupervisor::new(
        WorkerCommand {
            exe,
            args: plan.worker_args.clone(),
            env: worker_env,
            secrets,
            withheld: crate::worker_secrets::withheld(env),
            agents: plan.agents.by_route.clone(),
            board_slug: plan.board_slug.clone(),
            seed_logs: seed_logs
                .then(|| crate::supervisor::seed_logs(&logs))
                .flatten(),
            logs,
            watch,
        },
        interrupt.clone(),
        Box::new(say),
    ));
    let ports = DispatchPorts {
        board,
        supervisor: supervisor.clone(),
        clock: Arc::new(SystemClock),
        wakeups: supervisor,
        notes: Arc::new(Notes::default()),
    };
    let mut dispatcher = Dispatcher::new(ports, plan.settings.clone());
    let deliverer = crate::notify::Background::start(&plan.db, &plan.folder, env);
    let end = runtime.block_on(dispatcher.run(plan.mode));
    deliverer.stop();
    // Workers that outlive this dispatcher (`--once`, a halt) are told it
    // is closing, after the calls it took are answered; they go on, on the
    // board itself.
    close_link(&runtime, &closing, serving);
    if let DispatchEnd::Halted(fault) = &end {
        errln!("error: the dispatcher stopped: {fault}");
    }
    Ok(end.exit_code())
}

/// Tells the workers the link is closing, and waits a moment for the calls
/// it took to be answered.
fn close_link(
    runtime: &tokio::runtime::Runtime,
    closing: &tokio::sync::watch::Sender<bool>,
    serving: Option<tokio::task::JoinHandle<()>>,
) {
    let _ = closing.send(true);
    if let Some(serving) = serving {
        let _ =
            runtime.block_on(async { tokio::time::timeout(LINK_CLOSING_PATIENCE, serving).await });
    }
}

/// What a dispatcher holds while it runs: a SQLite board's lock, a watch
/// on the board's changes, its log folder.
type Held = (Option<Flock<File>>, Option<BoardWatch>, PathBuf);

/// Takes what a dispatcher holds while it runs: a SQLite board's lock,
/// a watch on the board's changes and its log folder. `None` when another
/// dispatcher holds the board and this one was not to wait for it.
fn hold_board(
    board: &crate::board_path::OpenBoard,
    plan: &DispatchPlan,
    interrupt: &Arc<AtomicUsize>,
) -> Result<Option<Held>, EnvironmentFault> {
    // One dispatcher per SQLite board (a file lock); a PostgreSQL board
    // takes several at once, on one host or many: its claims skip each
    // other's rows, and each dispatcher signals its own host's workers only.
    let (lock, watch) = match &board.engine {
        Engine::Sqlite(sqlite) => {
            let lock = take_lock(sqlite.path(), plan.mode != RunMode::Once, interrupt)
                .map_err(|error| EnvironmentFault::Configuration(format!("{error:#}")))?;
            let Some(lock) = lock else {
                return Ok(None);
            };
            let watch = kanban_board_sqlite::ChangeWatch::open(sqlite.path())
                .ok()
                .map(BoardWatch::Sqlite);
            (Some(lock), watch)
        }
        Engine::Postgres(pg) => (None, Some(BoardWatch::Postgres(pg.watch()))),
    };
    let logs = board.folder.join("logs");
    let made = {
        use std::os::unix::fs::DirBuilderExt;
        // Logs hold what agents said: the owner's alone.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&logs)
    };
    if let Err(error) = made {
        return Err(EnvironmentFault::Configuration(format!(
            "cannot create the log folder {}: {error}; make the board's folder writable",
            logs.display()
        )));
    }
    Ok(Some((lock, watch, logs)))
}

/// Tells the dispatcher's log what it did, naming a card whose worker this
/// dispatcher started by its title beside its id.
#[derive(Debug, Default)]
struct Notes {
    /// The title of each card whose worker runs, by card id.
    titles: std::sync::Mutex<BTreeMap<String, String>>,
}

/// The most of a title a dispatcher's line shows.
const TITLE_WIDTH: usize = 40;

impl kanban_core::DispatchNotes for Notes {
    fn note(&self, event: &kanban_core::DispatchEvent) {
        use kanban_core::DispatchEvent;
        match event {
            // What each tick decided and why: `-v` and `-vv`, on stderr.
            DispatchEvent::Tick { .. } => {
                tracing::info!(target: "kanban::dispatch", "{event}");
                return;
            }
            DispatchEvent::ClaimPlan { .. } => {
                tracing::debug!(target: "kanban::dispatch", "{event}");
                return;
            }
            _ => {}
        }
        let mut titles = self
            .titles
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let DispatchEvent::Spawned { task_id, title, .. } = event {
            titles.insert(task_id.clone(), title.clone());
        }
        let line = event.to_string();
        let Some(task_id) = event.task_id() else {
            return say(&line);
        };
        say(&titled(
            &line,
            task_id,
            titles.get(task_id).map(String::as_str),
        ));
        // The worker's last line: its card's title is not needed again.
        if matches!(
            event,
            DispatchEvent::Booked { .. }
                | DispatchEvent::LeftRunning { .. }
                | DispatchEvent::LeftUnbooked { .. }
        ) {
            titles.remove(task_id);
        }
    }
}

/// `line` about card `task_id` with the card's title, cut to fit, after its
/// id: `t_1a2b3c4d "write the intro" spawned worker …`.
fn titled(line: &str, task_id: &str, title: Option<&str>) -> String {
    match (title, line.strip_prefix(task_id)) {
        (Some(title), Some(rest)) if !title.trim().is_empty() => {
            format!(
                "{task_id} \"{}\"{rest}",
                crate::output::short(title.trim(), TITLE_WIDTH)
            )
        }
        _ => line.to_owned(),
    }
}

/// How long a leaving dispatcher waits for the calls it took to be
/// answered: a call waiting out a busy board takes at most about this long.
const LINK_CLOSING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(35);

/// Says why the dispatcher cannot start; returns its exit code.
fn refuse_to_start(fault: &EnvironmentFault) -> ExitCode {
    errln!("error: {fault}; nothing was claimed");
    DispatchEnd::Halted(fault.clone()).exit_code()
}
