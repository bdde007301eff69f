//! The real supervisor: worker processes in their own process groups, their
//! logs, their exits, and the signals that stop them. Core's dispatcher
//! decides; this only does.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agents_file::AgentCommand;
use async_trait::async_trait;
use kanban_core::{
    Claim, EnvironmentFault, ExitWitness, RunLog, StopSignal, Supervisor, Wakeups, WorkerExit,
    WorkerProcess, last_trailer, vars,
};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

/// How much of a card's log is read back for a trailer and an output tail.
const LOG_WINDOW: u64 = 64 * 1024;

/// The line a dispatcher writes to a card's log before each spawn, so the
/// log's trailer and tail are read for this run only.
pub(crate) fn run_marker(run_id: i64) -> String {
    format!("[kanban-dispatch] run {run_id} spawned")
}

/// This machine's name, as claim locks carry it.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat`,
/// field 22): with the pid, a fingerprint that a reused pid does not match.
pub(crate) fn process_start(pid: i64) -> Option<i64> {
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
pub(crate) fn alive(pid: i64, started_at: Option<i64>) -> bool {
    let running =
        i32::try_from(pid).is_ok_and(|pid| pid > 0 && kill(Pid::from_raw(pid), None).is_ok());
    running && started_at.is_none_or(|recorded| process_start(pid) == Some(recorded))
}

/// The hex SHA-256 digest of a worker's seal: what the board keeps, so that
/// the seal itself is never written where an agent could read it.
/// A card's log in `logs`; an id that is not a plain id (a hostile board
/// row) is named by its digest, so no id can make a path outside `logs/`.
pub(crate) fn log_path(logs: &Path, task_id: &str) -> PathBuf {
    if kanban_core::is_valid_task_id(task_id) {
        logs.join(format!("{task_id}.log"))
    } else {
        let digest = seal_digest(task_id);
        logs.join(format!("invalid-id-{}.log", &digest[..16]))
    }
}

/// Where the seed system looks for the worker logs of a board whose logs
/// are in `logs` (`logs/` beside the board): `kanban/logs/` beside it, as
/// for its default board (`HOME/kanban.db`, its logs in
/// `HOME/kanban/logs/`). Its other boards keep their logs in `logs/`
/// beside the board file, where ours are.
pub(crate) fn seed_logs(logs: &Path) -> Option<PathBuf> {
    logs.parent()
        .map(|folder| folder.join("kanban").join("logs"))
}

/// Whether the seed system opens the SQLite board at `path` as its default
/// board, whose logs it looks for in `kanban/logs/` beside it: a
/// `kanban.db` with the seed system's `kanban.db.init.lock` beside it, not
/// in a `boards/` folder (where both systems keep logs in `logs/`).
pub(crate) fn seed_default_board(path: &Path) -> bool {
    let in_boards = path
        .parent()
        .and_then(Path::parent)
        .is_some_and(|boards| boards.file_name() == Some("boards".as_ref()));
    path.file_name() == Some("kanban.db".as_ref())
        && !in_boards
        && std::fs::symlink_metadata(path.with_file_name("kanban.db.init.lock")).is_ok()
}

/// The log to read of a card: ours, else the one the seed system's worker
/// wrote for it (a plain file only: a link there is not followed).
pub(crate) fn readable_log(logs: &Path, task_id: &str) -> PathBuf {
    let ours = log_path(logs, task_id);
    if std::fs::symlink_metadata(&ours).is_ok() {
        return ours;
    }
    seed_logs(logs)
        .map(|seed| log_path(&seed, task_id))
        .filter(|theirs| std::fs::symlink_metadata(theirs).is_ok_and(|meta| meta.is_file()))
        .unwrap_or(ours)
}

/// Links a card's log where the seed system looks for it (`seed`), so that
/// `hermes kanban log ID` shows our worker's: a link relative to the board's
/// folder, made once; a log of the seed system's own there is left alone.
/// The link is a courtesy to the other system: without it our log is whole,
/// so a folder that cannot be made costs the card nothing.
fn link_for_seed(seed: &Path, task_id: &str) {
    use std::os::unix::fs::DirBuilderExt;
    let link = log_path(seed, task_id);
    if std::fs::symlink_metadata(&link).is_ok() {
        return;
    }
    let Some(name) = link.file_name() else {
        return;
    };
    let target = Path::new("../../logs").join(name);
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(seed)
        .and_then(|()| std::os::unix::fs::symlink(&target, &link));
    if let Err(error) = made {
        tracing::debug!("no link to {task_id}'s log for the seed system: {error}");
    }
}

/// A card's log past this size is moved to `TASK.log.1` (replacing the one
/// before) when its next run starts: a card's logs never hold more than
/// about twice this plus one run.
pub(crate) const LOG_ROTATE_BYTES: u64 = 16 * 1024 * 1024;

/// Moves a long log aside before a new run writes to it. No run of the card
/// is alive then (earlier runs are swept first), so nothing writes to it.
fn rotate_log(log: &Path) {
    if std::fs::metadata(log).is_ok_and(|meta| meta.len() > LOG_ROTATE_BYTES) {
        let mut old = log.as_os_str().to_owned();
        old.push(".1");
        let _ = std::fs::rename(log, PathBuf::from(old));
    }
}

pub(crate) fn seal_digest(seal: &str) -> String {
    Sha256::digest(seal.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// 128 random bits from the kernel, as 32 hex digits.
/// The lock of a claim taken by hand (`kanban claim`): as unguessable as a
/// dispatcher's, and marked so that no dispatcher takes its maker's exit
/// for a dispatcher's death (its lease alone says when it is gone).
pub(crate) fn hand_claim_lock() -> String {
    format!("{}:claim:{}", hostname(), random_hex())
}

pub(crate) fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // The kernel gave no randomness (it always does on Linux 3.17+):
        // the time and pid still keep the value unique on this host.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (nanos ^ u128::from(std::process::id()).rotate_left(64)).to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
        .filter(|line| {
            !line.is_empty()
                && !line.starts_with(kanban_core::WORKER_EXIT_TRAILER)
                && !line.starts_with(kanban_core::WORKER_END_DETAIL)
        })
        .collect();
    let start = lines.len().saturating_sub(6);
    let tail = lines[start..].join("\n");
    let count = tail.chars().count();
    tail.chars().skip(count.saturating_sub(400)).collect()
}

/// Which runs of a card a process scan picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runs {
    /// Exactly the claim's run.
    This,
    /// Every run of the claim's card but the claim's.
    Earlier,
}

/// Every process of this machine whose environment carries `claim`'s card
/// and (per `runs`) run: workers, their agents, and whatever they left running.
///
/// A dispatcher sweeps after every booked exit, so the scan reads each
/// environment into one reused buffer (no `stat` for a size `/proc` does
/// not know, no list of its entries) and looks at every entry once.
fn processes_of(claim: &Claim, runs: Runs) -> Vec<i32> {
    let task = format!("{}={}", vars::TASK, claim.task_id);
    let db = format!("{}={}", vars::DB, claim.db);
    let run = format!("{}={}", vars::RUN_ID, claim.run_id);
    let run_prefix = format!("{}=", vars::RUN_ID);
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut environ = Vec::with_capacity(16 * 1024);
    let mut found = Vec::new();
    for pid in entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
    {
        if pid == me {
            continue;
        }
        environ.clear();
        // Another user's process, or one already gone, cannot be read.
        let read = File::open(format!("/proc/{pid}/environ"))
            .and_then(|mut file| file.read_to_end(&mut environ));
        if read.is_err() {
            continue;
        }
        let (mut same_task, mut same_board, mut this_run, mut some_run) =
            (false, false, false, false);
        for entry in environ.split(|byte| *byte == 0) {
            if entry == task.as_bytes() {
                same_task = true;
            } else if entry == db.as_bytes() {
                same_board = true;
            } else if entry.starts_with(run_prefix.as_bytes()) {
                some_run = true;
                this_run |= entry == run.as_bytes();
            }
        }
        let wanted = match runs {
            Runs::This => this_run,
            Runs::Earlier => some_run && !this_run,
        };
        if same_task
            && same_board
            && wanted
            && let Ok(pid) = i32::try_from(pid)
        {
            found.push(pid);
        }
    }
    found
}

/// SIGKILLs the process group of every process in `pids` (the process
/// alone when it shares the dispatcher's own group).
fn kill_groups(pids: Vec<i32>) {
    let own_group = nix::unistd::getpgrp();
    for pid in pids {
        let pid = Pid::from_raw(pid);
        match nix::unistd::getpgid(Some(pid)) {
            Ok(group) if group != own_group => {
                let _ = killpg(group, Signal::SIGKILL);
            }
            _ => {
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
    }
}

/// The most runs remembered as left alone before their sweep.
const ALONE_RUNS_KEPT: usize = 4096;

/// How long a sweep of earlier runs waits for their processes to die.
const SWEEP_PATIENCE: Duration = Duration::from_secs(2);

/// Where a worker's log is read from for live `[kanban]` lines.
struct Cursor {
    task_id: String,
    run_id: i64,
    log: PathBuf,
    /// The log, kept open from its first look.
    file: Option<File>,
    read_to: Option<u64>,
}

/// Workers as child processes of this dispatcher.
pub(crate) struct ProcessSupervisor {
    host: String,
    exe: PathBuf,
    logs: PathBuf,
    /// Where the seed system looks for this board's logs, when it does.
    seed_logs: Option<PathBuf>,
    worker_args: Vec<String>,
    worker_env: Vec<(String, String)>,
    /// Variables of the dispatcher no worker gets (notification secrets).
    withheld: Vec<String>,
    /// Sent on each worker's standard input, never in its environment.
    worker_secrets: Vec<(String, String)>,
    agents: BTreeMap<String, AgentCommand>,
    board_slug: String,
    exits: Arc<Mutex<Vec<WorkerExit>>>,
    wake: Arc<tokio::sync::Notify>,
    interrupt: Arc<AtomicUsize>,
    stop_seen: AtomicBool,
    cursors: Mutex<BTreeMap<u32, Cursor>>,
    /// Runs whose worker's sealed trailer said it ended everything it
    /// started (`alone`): their sweep has nothing to find.
    alone_runs: Mutex<BTreeSet<i64>>,
    /// Runs whose worker a signal killed, until their log is read.
    killed_runs: Mutex<BTreeSet<i64>>,
    echo: Box<dyn Fn(&str) + Send + Sync>,
    /// Commits to the board by anybody else (a card added, a worker's
    /// call) wake the dispatcher at once; `None` polls on the interval only.
    board_watch: Mutex<Option<BoardWatch>>,
}

/// What tells a dispatcher that somebody else made work on its board.
#[derive(Debug)]
pub(crate) enum BoardWatch {
    /// The SQLite file's `data_version`, looked at between ticks.
    Sqlite(kanban_board_sqlite::ChangeWatch),
    /// The PostgreSQL board's notifications (`LISTEN`).
    Postgres(kanban_board_postgres::ChangeWatch),
}

impl BoardWatch {
    pub(crate) fn changed(&mut self) -> bool {
        match self {
            Self::Sqlite(watch) => watch.changed(),
            Self::Postgres(watch) => watch.changed(),
        }
    }
}

impl std::fmt::Debug for ProcessSupervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSupervisor")
            .field("host", &self.host)
            .field("logs", &self.logs)
            .finish_non_exhaustive()
    }
}

/// How the supervisor starts workers.
pub(crate) struct WorkerCommand {
    pub(crate) exe: PathBuf,
    pub(crate) args: Vec<String>,
    pub(crate) env: Vec<(String, String)>,
    /// What no agent may read (the dispatcher's socket, the board's
    /// password): on the worker's standard input, with its seal.
    pub(crate) secrets: Vec<(String, String)>,
    /// Variables of the dispatcher's environment no worker (nor so any
    /// agent) gets: the notifications' secrets.
    pub(crate) withheld: Vec<String>,
    /// The agent of each route (`""`: the unnamed agent).
    pub(crate) agents: BTreeMap<String, AgentCommand>,
    pub(crate) board_slug: String,
    pub(crate) logs: PathBuf,
    /// Where the seed system looks for the logs, on a board it opens as
    /// its default one: each card's log is linked there.
    pub(crate) seed_logs: Option<PathBuf>,
    /// The board's commits, watched between ticks.
    pub(crate) watch: Option<BoardWatch>,
}

impl ProcessSupervisor {
    pub(crate) fn new(
        command: WorkerCommand,
        interrupt: Arc<AtomicUsize>,
        echo: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Self {
        Self {
            host: hostname(),
            exe: command.exe,
            logs: command.logs,
            seed_logs: command.seed_logs,
            worker_args: command.args,
            worker_env: command.env,
            withheld: command.withheld,
            worker_secrets: command.secrets,
            agents: command.agents,
            board_slug: command.board_slug,
            exits: Arc::new(Mutex::new(Vec::new())),
            wake: Arc::new(tokio::sync::Notify::new()),
            interrupt,
            stop_seen: AtomicBool::new(false),
            cursors: Mutex::new(BTreeMap::new()),
            alone_runs: Mutex::new(BTreeSet::new()),
            killed_runs: Mutex::new(BTreeSet::new()),
            echo,
            // Without a watch the interval still ticks: the watch only
            // makes pickup sooner, never correctness.
            board_watch: Mutex::new(command.watch),
        }
    }

    /// True when somebody committed to the board since the last look.
    fn board_changed(&self) -> bool {
        self.board_watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
            .is_some_and(BoardWatch::changed)
    }

    fn log_path(&self, task_id: &str) -> PathBuf {
        log_path(&self.logs, task_id)
    }

    /// Copies the `[kanban]` lines workers wrote since the last look.
    fn echo_worker_lines(&self) {
        let mut cursors = self
            .cursors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for cursor in cursors.values_mut() {
            // Opened once per run: the worker appends to this very file.
            if cursor.file.is_none() {
                cursor.file = File::open(&cursor.log).ok();
            }
            let Some(file) = cursor.file.as_mut() else {
                continue;
            };
            let length = file.metadata().map(|m| m.len()).unwrap_or(0);
            let read_to = *cursor.read_to.get_or_insert_with(|| {
                // Start at this run's marker, not at the top of an old log.
                let text = log_since_marker(&cursor.log, cursor.run_id);
                length.saturating_sub(text.len() as u64)
            });
            if length <= read_to || file.seek(SeekFrom::Start(read_to)).is_err() {
                continue;
            }
            let mut bytes = Vec::new();
            let _ = Read::by_ref(file).take(LOG_WINDOW).read_to_end(&mut bytes);
            let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
                continue;
            };
            cursor.read_to = Some(read_to + end as u64 + 1);
            for line in String::from_utf8_lossy(&bytes[..=end]).lines() {
                if line.starts_with("[kanban]") {
                    (self.echo)(&format!("{} │ {line}", cursor.task_id));
                }
            }
        }
    }
}

/// Opens a card's worker log for a new run (rotated when it grew too long,
/// the run's marker written): the worker's stdout and stderr.
fn open_run_log(
    log: &Path,
    run_id: i64,
) -> Result<(std::fs::File, std::fs::File), EnvironmentFault> {
    rotate_log(log);
    let unwritable = |error: std::io::Error| {
        EnvironmentFault::Configuration(format!(
            "cannot write the worker log {}: {error}; make the log folder writable",
            log.display()
        ))
    };
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .map_err(unwritable)?;
    writeln!(file, "\n{}", run_marker(run_id)).map_err(unwritable)?;
    let stdout = file.try_clone().map_err(unwritable)?;
    Ok((stdout, file))
}

impl ProcessSupervisor {
    /// The command that starts a worker on `claim` with `agent`, its
    /// output going to `log` (stdout, stderr): the claim in its environment,
    /// its secrets kept for its standard input.
    fn worker_command(
        &self,
        claim: &Claim,
        agent: &AgentCommand,
        goal_mode: bool,
        log: (std::fs::File, std::fs::File),
    ) -> tokio::process::Command {
        let (stdout, file) = log;
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .arg("worker")
            .args(&self.worker_args)
            .args(["--agent", agent.spec.as_str()])
            .args(&agent.args)
            .envs(agent.env.iter().map(|(k, v)| (k, v)))
            .envs(claim.to_env_pairs())
            .envs(vars::under_both_names([(
                vars::BOARD,
                self.board_slug.clone(),
            )]))
            .envs(self.worker_env.iter().map(|(k, v)| (k, v)))
            .env(crate::worker_secrets::SECRETS_VAR, "stdin")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(stdout)
            .stderr(file);
        // Whatever of them this dispatcher's own environment holds stays
        // out of the worker's: a process of the same user can read it.
        for name in crate::worker_secrets::SECRET_VARS {
            command.env_remove(name);
        }
        for name in &self.withheld {
            command.env_remove(name);
        }
        if goal_mode {
            command.envs(vars::under_both_names([(vars::GOAL_MODE, "1".to_owned())]));
        }
        command
    }
}

#[async_trait]
impl Supervisor for ProcessSupervisor {
    fn host(&self) -> &str {
        &self.host
    }

    fn new_claim_lock(&self) -> String {
        format!("{}:{}:{}", self.host, std::process::id(), random_hex())
    }

    fn claimer_gone(&self, claim_lock: &str) -> bool {
        // Only a lock a dispatcher made (`HOST:PID:NONCE`, 32 hex digits)
        // names its claimer: a hand claim, ours (`HOST:claim:NONCE`) or the
        // seed system's (`HOST:PID` of a process that already exited), is
        // left until its lease lapses.
        let mut parts = claim_lock.split(':');
        let (Some(host), Some(pid), Some(nonce), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let Ok(pid) = pid.parse::<i64>() else {
            return false;
        };
        let ours = nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit());
        ours && host == self.host && pid != i64::from(std::process::id()) && !alive(pid, None)
    }

    async fn spawn(
        &self,
        claim: &Claim,
        goal_mode: bool,
        route: &str,
    ) -> Result<WorkerProcess, EnvironmentFault> {
        let Some(agent) = self.agents.get(route) else {
            return Err(EnvironmentFault::Configuration(format!(
                "no agent is named {route:?}; name it with --agent {route}=CMD"
            )));
        };
        let log = self.log_path(&claim.task_id);
        let (stdout, file) = open_run_log(&log, claim.run_id)?;
        if let Some(seed) = &self.seed_logs {
            link_for_seed(seed, &claim.task_id);
        }
        let seal = random_hex();
        let mut command = self.worker_command(claim, agent, goal_mode, (stdout, file));
        let mut child = command.spawn().map_err(|error| {
            EnvironmentFault::Configuration(format!(
                "cannot start a worker ({}): {error}",
                self.exe.display()
            ))
        })?;
        let Some(pid) = child.id() else {
            return Err(EnvironmentFault::Transient(
                "a worker exited before its pid could be read".to_owned(),
            ));
        };
        // Its secrets, then the end of its input: the line fits a pipe's
        // buffer, so the write does not wait for the worker to read it.
        if let Some(mut stdin) = child.stdin.take() {
            use tokio::io::AsyncWriteExt as _;
            let mut secrets = self.worker_secrets.clone();
            secrets.push((crate::worker::SEAL_VAR.to_owned(), seal.clone()));
            let line = crate::worker_secrets::encode(&secrets);
            // A worker that died at once is booked from its exit.
            let _ = stdin.write_all(line.as_bytes()).await;
        }
        let started_at = process_start(i64::from(pid));
        self.cursors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(
                pid,
                Cursor {
                    task_id: claim.task_id.clone(),
                    run_id: claim.run_id,
                    log,
                    file: None,
                    read_to: None,
                },
            );
        let exits = self.exits.clone();
        let wake = self.wake.clone();
        tokio::spawn(async move {
            let witness = match child.wait().await {
                Ok(status) => match (status.code(), status.signal()) {
                    (Some(code), _) => ExitWitness::Code(code),
                    (None, Some(signal)) => ExitWitness::Signal(signal),
                    (None, None) => ExitWitness::Unknown,
                },
                Err(_) => ExitWitness::Unknown,
            };
            exits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(WorkerExit { pid, witness });
            wake.notify_one();
        });
        Ok(WorkerProcess {
            pid,
            started_at,
            seal_digest: Some(seal_digest(&seal)),
        })
    }

    async fn reap(&self) -> Vec<WorkerExit> {
        self.echo_worker_lines();
        let exits = std::mem::take(
            &mut *self
                .exits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let mut cursors = self
            .cursors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut killed = self
            .killed_runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for exit in &exits {
            let cursor = cursors.remove(&exit.pid);
            // Read with its log (`run_log`): its trailer is not its own.
            if let (Some(cursor), ExitWitness::Signal(_)) = (cursor, &exit.witness) {
                if killed.len() >= ALONE_RUNS_KEPT {
                    killed.clear();
                }
                killed.insert(cursor.run_id);
            }
        }
        exits
    }

    fn alive(&self, pid: i64, started_at: Option<i64>) -> bool {
        alive(pid, started_at)
    }

    fn signal(&self, pid: i64, started_at: Option<i64>, signal: StopSignal) {
        if !alive(pid, started_at) {
            return;
        }
        let Ok(raw) = i32::try_from(pid) else { return };
        let signal = match signal {
            StopSignal::Terminate => Signal::SIGTERM,
            StopSignal::Kill => Signal::SIGKILL,
        };
        // Workers lead their own process groups: the group is the worker
        // and whatever it started there.
        let _ = killpg(Pid::from_raw(raw), signal);
    }

    async fn sweep(&self, claim: &Claim) {
        // A worker that reaped its own tree left nothing with the run's
        // marker; one that did not say so is looked for through `/proc`.
        let alone = self
            .alone_runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&claim.run_id);
        if alone {
            return;
        }
        kill_groups(processes_of(claim, Runs::This));
    }

    async fn sweep_earlier_runs(&self, claim: &Claim) -> bool {
        // A SIGKILLed process runs on until the kernel tears it down, and a
        // group may fork while being killed: sweep until nothing is left.
        let patience = Instant::now() + SWEEP_PATIENCE;
        loop {
            let left = processes_of(claim, Runs::Earlier);
            if left.is_empty() {
                return true;
            }
            if Instant::now() >= patience {
                return false;
            }
            kill_groups(left);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn run_log(&self, claim: &Claim, expected: Option<&str>) -> RunLog {
        let since = log_since_marker(&self.log_path(&claim.task_id), claim.run_id);
        // Only the worker's own trailer counts: one signed with its seal. A
        // line an agent printed, even a copy of an old trailer, is not.
        let trailer = last_trailer(&since, |seal| match (expected, seal) {
            (Some(digest), Some(seal)) => seal_digest(seal) == digest,
            (Some(_), None) => false,
            (None, _) => true,
        });
        // A worker a signal killed wrote no trailer of its own: a sealed
        // line in its log was put there by somebody who read its seal (a
        // process of the same user can), and says nothing of its end.
        let killed = self
            .killed_runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&claim.run_id);
        let trailer = trailer.filter(|_| !killed);
        // Only a sealed trailer is believed about what is left running.
        if expected.is_some() && trailer.as_ref().is_some_and(|trailer| trailer.alone) {
            let mut alone = self
                .alone_runs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // A run read but never swept must not pile up: forgetting one
            // only costs its sweep.
            if alone.len() >= ALONE_RUNS_KEPT {
                alone.clear();
            }
            alone.insert(claim.run_id);
        }
        RunLog {
            trailer_code: trailer.as_ref().map(|trailer| trailer.code),
            fault: trailer.and_then(|trailer| trailer.fault),
            output_tail: output_tail(&since),
        }
    }
}

#[async_trait]
impl Wakeups for ProcessSupervisor {
    async fn wait(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        // What the tick itself committed is not news.
        self.board_changed();
        loop {
            if self.interrupt.load(Ordering::SeqCst) != 0
                && !self.stop_seen.swap(true, Ordering::SeqCst)
            {
                return; // the stop request itself wakes the dispatcher, once
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let slice = left.min(Duration::from_millis(100));
            tokio::select! {
                () = self.wake.notified() => return,
                () = tokio::time::sleep(slice) => {}
            }
            self.echo_worker_lines();
            if self.board_changed() {
                return;
            }
        }
    }

    fn stop_requested(&self) -> bool {
        self.interrupt.load(Ordering::SeqCst) != 0
    }
}
