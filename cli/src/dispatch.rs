//! `kanban dispatch`: claim ready cards, spawn workers, book every exit from
//! core's one table, release stale claims.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{
    BoardAdmin, Booking, BookingKind, Claim, Clock, DEFAULT_FAILURE_LIMIT, DispatchBoard,
    Environment, ExitReport, ExitWitness, RECLAIM_DEFER_SECONDS, RunningWorker, StaleClaimAction,
    claim_ttl_seconds, exit_code_from_trailer, stale_claim_action, vars,
};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::args::DispatchArgs;
use crate::runtime::block_on;

/// How much of a card's log is read back for a trailer and an output tail.
const LOG_WINDOW: u64 = 64 * 1024;

/// The line a dispatcher writes to a card's log before each spawn, so the
/// log's trailer and tail are read for this run only.
fn run_marker(run_id: i64) -> String {
    format!("[kanban-dispatch] run {run_id} spawned")
}

/// How a dispatcher is run.
#[derive(Clone, Debug)]
pub(crate) struct DispatchPlan {
    pub(crate) db: PathBuf,
    pub(crate) board_slug: String,
    pub(crate) once: bool,
    pub(crate) until_idle: bool,
    pub(crate) interval: Duration,
    pub(crate) max_in_progress: usize,
    pub(crate) worker_args: Vec<String>,
    pub(crate) worker_env: Vec<(String, String)>,
    pub(crate) ttl: i64,
    pub(crate) rate_limit_cooldown: i64,
    pub(crate) failure_limit: u32,
    pub(crate) grace: Duration,
}

impl DispatchPlan {
    pub(crate) fn from_args(
        args: &DispatchArgs,
        db: PathBuf,
        board_slug: String,
        env: &Environment,
    ) -> Self {
        let mut worker_args = Vec::new();
        if let Some(agent) = &args.agent {
            worker_args.extend(["--agent".to_owned(), agent.clone()]);
        }
        if let Some(judge) = &args.judge {
            worker_args.extend(["--judge".to_owned(), judge.clone()]);
        }
        if let Some(delays) = &args.recovery_delays {
            worker_args.extend(["--recovery-delays".to_owned(), delays.clone()]);
        }
        // Workers give their agents half the dispatcher's grace, so that a
        // shutdown's interrupted workers exit while it still waits for them.
        worker_args.extend(["--grace".to_owned(), (args.grace / 2).max(1).to_string()]);
        Self {
            db,
            board_slug,
            once: args.once,
            until_idle: args.until_idle,
            interval: Duration::from_secs_f64(args.interval.max(0.05)),
            max_in_progress: args.max_in_progress.max(1),
            worker_args,
            worker_env: Vec::new(),
            ttl: claim_ttl_seconds(args.ttl, env),
            rate_limit_cooldown: args.rate_limit_cooldown,
            failure_limit: args.failure_limit.unwrap_or(DEFAULT_FAILURE_LIMIT),
            grace: Duration::from_secs(args.grace),
        }
    }
}

struct Spawned {
    claim: Claim,
    child: Child,
    log: PathBuf,
    /// Where the dispatcher stopped reading the log for live lines.
    read_to: u64,
}

fn clock_time(epoch: i64) -> String {
    let day = epoch.rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", day / 3600, day % 3600 / 60, day % 60)
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{} {line}", clock_time(SystemClock.now()));
    let _ = out.flush();
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`,
/// field 22): with the pid, a fingerprint that a reused pid does not match.
fn process_start(pid: i64) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: count from the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// True when `pid` runs and, where a fingerprint was recorded, is the same
/// process that was spawned.
fn alive(pid: i64, started_at: Option<i64>) -> bool {
    let running =
        i32::try_from(pid).is_ok_and(|pid| pid > 0 && kill(Pid::from_raw(pid), None).is_ok());
    running && started_at.is_none_or(|recorded| process_start(pid) == Some(recorded))
}

/// The part of a card's log written since the run's marker.
fn log_since_marker(log: &Path, run_id: i64) -> String {
    let Ok(mut file) = File::open(log) else {
        return String::new();
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(length.saturating_sub(LOG_WINDOW)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let marker = run_marker(run_id);
    match text.rfind(&marker) {
        Some(at) => text[at + marker.len()..].to_owned(),
        // The marker is further back than the window: the whole window was
        // written by this run, the latest to append.
        None if length > LOG_WINDOW => text.into_owned(),
        None => String::new(),
    }
}

/// The last lines of a worker's output, without the dispatcher's own chrome.
fn output_tail(since_marker: &str) -> String {
    let lines: Vec<&str> = since_marker
        .lines()
        .map(str::trim_end)
        .filter(|line| !line.is_empty() && !line.starts_with(kanban_core::WORKER_EXIT_TRAILER))
        .collect();
    let start = lines.len().saturating_sub(6);
    let tail = lines[start..].join("\n");
    let count = tail.chars().count();
    tail.chars().skip(count.saturating_sub(400)).collect()
}

/// Everything one dispatcher owns while it ticks a board.
pub(crate) struct Dispatcher {
    plan: DispatchPlan,
    board: SqliteBoard,
    logs: PathBuf,
    host: String,
    lock_name: String,
    children: HashMap<u32, Spawned>,
    signalled: HashSet<u32>,
    interrupt: Arc<AtomicUsize>,
    _lock: Flock<File>,
}

/// Takes the board's dispatch lock, waiting for it unless told not to.
fn take_lock(
    db: &Path,
    wait: bool,
    interrupt: &AtomicUsize,
) -> anyhow::Result<Option<Flock<File>>> {
    let path = PathBuf::from(format!("{}.dispatch.lock", db.display()));
    let mut said = false;
    loop {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open the dispatch lock {}", path.display()))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => return Ok(Some(lock)),
            Err((_, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
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
            Err((_, errno)) => anyhow::bail!("cannot lock {}: {errno}", path.display()),
        }
    }
}

impl Dispatcher {
    /// Opens the board and takes its dispatch lock; `None` when another
    /// dispatcher holds it and this one should not wait.
    pub(crate) fn start(
        plan: DispatchPlan,
        interrupt: Arc<AtomicUsize>,
    ) -> anyhow::Result<Option<Self>> {
        let board = SqliteBoard::open(&plan.db, Arc::new(SystemClock))?;
        let Some(lock) = take_lock(board.path(), !plan.once, &interrupt)? else {
            return Ok(None);
        };
        let logs = board.path().parent().unwrap_or(Path::new(".")).join("logs");
        std::fs::create_dir_all(&logs)
            .with_context(|| format!("cannot create the log folder {}", logs.display()))?;
        let host = hostname();
        let lock_name = format!("{host}:{}:dispatch", std::process::id());
        Ok(Some(Self {
            plan,
            board,
            logs,
            host,
            lock_name,
            children: HashMap::new(),
            signalled: HashSet::new(),
            interrupt,
            _lock: lock,
        }))
    }

    fn log_path(&self, task_id: &str) -> PathBuf {
        self.logs.join(format!("{task_id}.log"))
    }

    fn host_local(&self, claim: &Claim) -> bool {
        claim.claim_lock.starts_with(&format!("{}:", self.host))
    }

    fn report(
        &self,
        claim: &Claim,
        witness: ExitWitness,
        source: &'static str,
        signalled: bool,
    ) -> ExitReport {
        ExitReport {
            witness,
            source,
            signalled_by_dispatcher: signalled,
            output_tail: output_tail(&log_since_marker(
                &self.log_path(&claim.task_id),
                claim.run_id,
            )),
            default_failure_limit: self.plan.failure_limit,
            // What the worker booked, whoever witnessed the exit.
            retry_after_seconds: block_on(self.board.booked_result(claim))
                .ok()
                .flatten()
                .and_then(|result| result.retry_after_seconds),
        }
    }

    fn book(&self, claim: &Claim, report: &ExitReport) {
        match block_on(self.board.book_exit(claim, report)) {
            Ok(booking) => say(&describe(claim, report, &booking)),
            Err(error) => tracing::error!("cannot book the exit of {}: {error}", claim.task_id),
        }
    }

    /// Books every child of ours that has exited, from its wait status.
    fn reap(&mut self) -> usize {
        let exited: Vec<(u32, std::process::ExitStatus)> = self
            .children
            .iter_mut()
            .filter_map(|(pid, spawned)| {
                spawned
                    .child
                    .try_wait()
                    .ok()
                    .flatten()
                    .map(|status| (*pid, status))
            })
            .collect();
        for (pid, status) in &exited {
            self.echo_worker_lines();
            let spawned = self.children.remove(pid).expect("an exited child is ours");
            let witness = match (status.code(), status.signal()) {
                (Some(code), _) => ExitWitness::Code(code),
                (None, Some(signal)) => ExitWitness::Signal(signal),
                (None, None) => ExitWitness::Unknown,
            };
            let signalled = self.signalled.remove(pid);
            let report = self.report(&spawned.claim, witness, "wait", signalled);
            self.book(&spawned.claim, &report);
        }
        exited.len()
    }

    /// Books workers that died while nobody waited for them (a previous
    /// dispatcher's), from their `worker_result`, else their log's trailer.
    fn book_dead_workers(&self, running: &[RunningWorker]) {
        for worker in running {
            let Some(pid) = worker.worker_pid else {
                continue;
            };
            if self.children.contains_key(&(pid as u32))
                || !self.host_local(&worker.claim)
                || alive(pid, worker.worker_started_at)
            {
                continue;
            }
            let claim = &worker.claim;
            let (witness, source) = match block_on(self.board.booked_result(claim)) {
                Ok(Some(result)) => (ExitWitness::Code(result.exit_code), "worker_result"),
                _ => match exit_code_from_trailer(&log_since_marker(
                    &self.log_path(&claim.task_id),
                    claim.run_id,
                )) {
                    Some(code) => (ExitWitness::Code(code), "trailer"),
                    None => (ExitWitness::Unknown, "none"),
                },
            };
            let report = self.report(claim, witness, source, false);
            self.book(claim, &report);
        }
    }

    /// Expired leases: extended while their worker is alive and heartbeating,
    /// deferred while a terminated worker survives, released otherwise.
    fn release_stale(&mut self, running: &[RunningWorker]) {
        let now = SystemClock.now();
        for worker in running
            .iter()
            .filter(|w| w.claim_expires.is_some_and(|e| e < now))
        {
            let claim = &worker.claim;
            let fingerprint = worker.worker_started_at;
            // Only a worker of this host can be seen alive; any other is judged
            // gone, and release_stale_claims below releases its card.
            let live_pid = worker
                .worker_pid
                .filter(|pid| self.host_local(claim) && alive(*pid, fingerprint));
            let action = stale_claim_action(live_pid.is_some(), worker.last_heartbeat_at, now);
            let Some(pid) = live_pid.filter(|_| action != StaleClaimAction::Release) else {
                continue;
            };
            if action == StaleClaimAction::Extend {
                if let Ok(true) = block_on(self.board.extend_expired_lease(
                    claim,
                    now + self.plan.ttl,
                    "claim_extended",
                    "worker_alive",
                )) {
                    say(&format!(
                        "{} lease expired while worker {pid} is alive and heartbeating: extended",
                        claim.task_id
                    ));
                }
                continue;
            }
            say(&format!(
                "{} worker {pid} is alive but silent for over an hour: terminating it",
                claim.task_id
            ));
            self.signalled.insert(pid as u32);
            let _ = block_on(self.board.record_signal(claim, Signal::SIGTERM as i32));
            let group = Pid::from_raw(pid as i32);
            let _ = killpg(group, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while alive(pid, fingerprint) && Instant::now() < deadline {
                self.reap();
                std::thread::sleep(Duration::from_millis(100));
            }
            if alive(pid, fingerprint) {
                let _ = killpg(group, Signal::SIGKILL);
                std::thread::sleep(Duration::from_millis(200));
            }
            if alive(pid, fingerprint) {
                let _ = block_on(self.board.extend_expired_lease(
                    claim,
                    now + RECLAIM_DEFER_SECONDS,
                    "reclaim_deferred",
                    "worker_survived_termination",
                ));
                say(&format!(
                    "{} worker {pid} survived termination: reclaim deferred",
                    claim.task_id
                ));
            }
        }
        match block_on(self.board.release_stale_claims(self.plan.failure_limit)) {
            Ok(released) => {
                for id in released {
                    say(&format!("{id} lease expired: released back to ready"));
                }
            }
            Err(error) => tracing::error!("cannot release stale claims: {error}"),
        }
    }

    fn spawn(&mut self, claim: Claim) -> anyhow::Result<()> {
        let log = self.log_path(&claim.task_id);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open the log {}", log.display()))?;
        writeln!(file, "\n{}", run_marker(claim.run_id))?;
        let goal_mode = self
            .board
            .task(&claim.task_id)
            .ok()
            .flatten()
            .is_some_and(|task| task.goal_mode);
        let exe =
            std::env::current_exe().context("cannot find the kanban binary to run workers")?;
        let mut command = Command::new(exe);
        command
            .arg("worker")
            .args(&self.plan.worker_args)
            .envs(claim.to_env_pairs())
            .env(vars::BOARD, &self.plan.board_slug)
            .envs(self.plan.worker_env.iter().map(|(k, v)| (k, v)))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        if goal_mode {
            command.env(vars::GOAL_MODE, "1");
        }
        let child = command.spawn().context("cannot spawn a worker")?;
        let pid = child.id();
        if let Err(error) = block_on(self.board.record_spawn(
            &claim,
            pid,
            process_start(i64::from(pid)),
        )) {
            let _ = block_on(self.board.record_signal(&claim, Signal::SIGTERM as i32));
            // The claim moved on between the claim and the spawn: stop the worker.
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
            self.signalled.insert(pid);
            tracing::warn!("{}: {error}", claim.task_id);
        }
        say(&format!(
            "{} spawned worker {pid} (run {})",
            claim.task_id, claim.run_id
        ));
        self.children.insert(
            pid,
            Spawned {
                claim,
                child,
                log,
                read_to: 0,
            },
        );
        Ok(())
    }

    /// Claims ready cards up to the in-progress budget and spawns a worker
    /// for each; returns how many were spawned.
    fn claim_and_spawn(&mut self) -> anyhow::Result<usize> {
        let running = block_on(self.board.count_running())?;
        let mut spawned = 0;
        for _ in running..self.plan.max_in_progress {
            let Some(grant) = block_on(self.board.claim_next_ready(
                self.plan.ttl,
                &self.lock_name,
                self.plan.rate_limit_cooldown,
            ))?
            else {
                break;
            };
            let claim = grant.claim;
            if let Err(error) = self.spawn(claim.clone()) {
                let report = ExitReport {
                    witness: ExitWitness::Unknown,
                    source: "spawn",
                    signalled_by_dispatcher: false,
                    output_tail: format!("{error:#}"),
                    default_failure_limit: self.plan.failure_limit,
                    retry_after_seconds: None,
                };
                self.book(&claim, &report);
                continue;
            }
            spawned += 1;
        }
        Ok(spawned)
    }

    /// One tick, in order: reap, book dead workers, release stale claims,
    /// promote, claim and spawn. Returns true when the board is idle.
    pub(crate) fn tick(&mut self, claiming: bool) -> anyhow::Result<bool> {
        self.reap();
        let running = block_on(self.board.running_workers())?;
        self.book_dead_workers(&running);
        let running = block_on(self.board.running_workers())?;
        self.release_stale(&running);
        let promoted = block_on(self.board.promote_ready())?;
        if promoted > 0 {
            say(&format!("{promoted} card(s) promoted to ready"));
        }
        let spawned = if claiming { self.claim_and_spawn()? } else { 0 };
        Ok(spawned == 0 && self.children.is_empty() && block_on(self.board.count_running())? == 0)
    }

    /// Copies the `[kanban]` lines workers wrote since the last look.
    fn echo_worker_lines(&mut self) {
        for spawned in self.children.values_mut() {
            let Ok(mut file) = File::open(&spawned.log) else {
                continue;
            };
            let length = file.metadata().map(|m| m.len()).unwrap_or(0);
            if spawned.read_to == 0 {
                // Start at this run's marker, not at the top of an old log.
                let text = log_since_marker(&spawned.log, spawned.claim.run_id);
                spawned.read_to = length.saturating_sub(text.len() as u64);
            }
            if length <= spawned.read_to || file.seek(SeekFrom::Start(spawned.read_to)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            let _ = file.read_to_end(&mut bytes);
            let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            spawned.read_to += end as u64 + 1;
            for line in String::from_utf8_lossy(&bytes[..=end]).lines() {
                if line.starts_with("[kanban]") {
                    say(&format!("{} │ {line}", spawned.claim.task_id));
                }
            }
        }
    }

    /// Waits up to the interval, returning early when a worker exits or an
    /// interrupt arrives.
    fn wait(&mut self) {
        let deadline = Instant::now() + self.plan.interval;
        while Instant::now() < deadline && self.interrupt.load(Ordering::SeqCst) == 0 {
            self.echo_worker_lines();
            if self
                .children
                .values_mut()
                .any(|s| matches!(s.child.try_wait(), Ok(Some(_))))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops claiming, forwards the signal to every worker, waits the grace
    /// period and books what exited; the rest is left to lease expiry.
    fn shut_down(&mut self) {
        say(&format!(
            "shutting down: stopping {} worker(s)",
            self.children.len()
        ));
        for (pid, spawned) in &self.children {
            // Recorded first: a dispatcher that books this exit later, after
            // this one is gone, must still know the 130 was asked for.
            let _ = block_on(
                self.board
                    .record_signal(&spawned.claim, Signal::SIGTERM as i32),
            );
            let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGTERM);
            self.signalled.insert(*pid);
        }
        let deadline = Instant::now() + self.plan.grace;
        while !self.children.is_empty() && Instant::now() < deadline {
            self.reap();
            std::thread::sleep(Duration::from_millis(100));
        }
        for spawned in self.children.values() {
            say(&format!(
                "{} worker {} still running: left to its lease",
                spawned.claim.task_id,
                spawned.child.id()
            ));
        }
    }

    /// The loop: tick, then wait; `--once` ticks once, `--until-idle` stops
    /// when nothing runs and nothing can be claimed.
    pub(crate) fn run(&mut self) -> anyhow::Result<()> {
        loop {
            let interrupted = self.interrupt.load(Ordering::SeqCst) != 0;
            if interrupted {
                self.shut_down();
                return Ok(());
            }
            let idle = self.tick(true)?;
            if self.plan.once || (self.plan.until_idle && idle) {
                return Ok(());
            }
            self.wait();
        }
    }

    /// The board this dispatcher ticks.
    pub(crate) fn board(&self) -> &SqliteBoard {
        &self.board
    }
}

fn describe(claim: &Claim, report: &ExitReport, booking: &Booking) -> String {
    let how = match report.witness {
        ExitWitness::Code(code) => format!("exited {code}"),
        ExitWitness::Signal(signal) => format!("killed by signal {signal}"),
        ExitWitness::Unknown => "ended (no exit code found)".to_owned(),
    };
    let what = match booking.kind {
        BookingKind::Settled => "settled by its terminal board call".to_owned(),
        BookingKind::ProtocolViolation if booking.blocks => {
            "protocol violation, third in a row: blocked for a human".to_owned()
        }
        BookingKind::ProtocolViolation => {
            "protocol violation (no terminal board call): back to ready, not counted".to_owned()
        }
        BookingKind::RateLimited => {
            "rate limited: back to ready, not counted, held for the cooldown".to_owned()
        }
        BookingKind::TerminalProvider => "needs a human (provider/config): blocked".to_owned(),
        BookingKind::Interrupted => {
            "interrupted by this dispatcher: back to ready, not counted".to_owned()
        }
        BookingKind::Crashed if booking.blocks => {
            "crashed, at the failure limit: blocked".to_owned()
        }
        BookingKind::Crashed => "crashed: back to ready, counted".to_owned(),
    };
    let source = if report.source == "wait" {
        String::new()
    } else {
        format!(" (from {})", report.source)
    };
    format!("{} worker {how}{source}: {what}", claim.task_id)
}
