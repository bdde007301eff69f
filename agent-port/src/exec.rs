//! Agents as child processes, one per turn.

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use async_trait::async_trait;
use kanban_core::{
    FailureReason, StopReason, TURN_DEADLINE_EXIT_PREFIX, TurnError, TurnInput, TurnOutcome,
    TurnResult, TurnRunner,
};
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::activity::Activity;
use crate::protocol::{AgentExit, ResultLine, parse_result_line, settle_turn};
use crate::seed_worker::{
    SeedWorkerTurn, seed_worker_args, seed_worker_session, settle_seed_worker,
};

/// The most of an agent's stdout a turn keeps: its result line is the last
/// JSON line, so a bounded tail is all that is ever read, whatever it prints.
pub const STDOUT_TAIL_BYTES: usize = 1 << 20;
/// What one turn's agent output may add to the card's log, per pipe.
pub const FORWARD_LIMIT_BYTES: usize = 8 * 1024 * 1024;
/// How long the pipes are read after the agent exits: a background process
/// that inherited them (a `setsid` daemon) must not hold the turn open.
pub const EXIT_DRAIN: Duration = Duration::from_millis(200);

/// Which of an agent's pipes a turn copies to its own as they arrive (what
/// is not copied is still read: stdout for the result line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forward {
    /// A worker's: both go to the card's log.
    Both,
    /// `kanban turn`'s: the agent's complaints are shown, its result line
    /// is read and its text printed once.
    Stderr,
    /// Nothing is shown.
    Neither,
}

/// The card the agent works on, as the agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TaskBrief {
    pub id: String,
    pub title: String,
    pub body: String,
    /// The run's fencing token (its run id): it only grows per board, so a
    /// side effect stamped with it can be refused once a newer run exists.
    #[serde(skip)]
    pub fence_token: Option<i64>,
    /// The newest comments on the card (at most [`BRIEF_COMMENTS`]), newest
    /// last: how a human steers the agent between runs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub comments: Vec<kanban_core::CommentRecord>,
}

/// Comments a turn request carries.
pub const BRIEF_COMMENTS: usize = 20;

/// How an [`ExecAgent`] runs its command.
#[derive(Clone, Debug)]
pub struct ExecAgentConfig {
    /// Run as `sh -c COMMAND`.
    pub command: String,
    pub task: TaskBrief,
    /// Extra environment for the agent (the claim carrier, for a worker).
    pub env: Vec<(String, String)>,
    /// Variables the agent must not inherit.
    pub env_remove: Vec<String>,
    /// Stable across the turns of one run, so the agent can resume its session.
    pub session_id: String,
    /// How long a stopped agent's process group gets before SIGKILL.
    pub interrupt_grace: Duration,
    /// Which of the agent's pipes are copied to ours as they arrive.
    pub forward: Forward,
    /// A turn is stopped after this long.
    pub turn_timeout: Option<Duration>,
    /// Set when the agent is the seed system's own worker: `command` is
    /// then its program, started with the seed system's arguments and
    /// settled from its exit code ([`crate::settle_seed_worker`]).
    pub seed_worker: Option<SeedWorker>,
    /// Its working directory: the card's workspace (`None`: the worker's).
    pub workdir: Option<std::path::PathBuf>,
}

/// The seed system's worker, as an [`ExecAgent`] runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedWorker {
    /// Its profile (`hermes -p PROFILE`), normalized.
    pub profile: String,
    /// Its working directory: the card's workspace.
    pub workspace: std::path::PathBuf,
}

/// Runs the agent command once per turn, in its own process group.
///
/// Every byte it prints is progress (the worker's watch heartbeats on it).
/// A stop ([`Activity`]: a signal to the worker, a lost claim, the run's
/// limit) or the turn's deadline sends SIGTERM (or the worker's signal) to
/// the agent's whole group, and SIGKILL once the grace period is over
/// while any of the group lives.
#[derive(Debug)]
pub struct ExecAgent {
    config: ExecAgentConfig,
    activity: Arc<Activity>,
    /// The seed worker's session, as its last turn printed it: the next
    /// turn resumes it.
    seed_session: Option<String>,
}

/// The last bytes a pipe delivered.
#[derive(Debug, Default)]
struct Tail {
    bytes: VecDeque<u8>,
}

type SharedTail = Arc<Mutex<Tail>>;

fn lock(tail: &SharedTail) -> std::sync::MutexGuard<'_, Tail> {
    tail.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Reads a pipe to its end on its own task, keeping the last `keep`
/// bytes, stamping progress, and copying what it reads when asked.
fn drain<R: AsyncRead + Unpin + Send + 'static>(
    mut pipe: R,
    keep: usize,
    forward: Option<fn(&[u8])>,
    activity: Arc<Activity>,
) -> (SharedTail, tokio::task::JoinHandle<()>) {
    let tail: SharedTail = Arc::default();
    let filled = tail.clone();
    let reader = tokio::spawn(async move {
        let mut chunk = vec![0u8; 8192];
        let mut forwarded = 0usize;
        let mut noted = false;
        loop {
            match pipe.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    activity.touch();
                    if let Some(forward) = forward {
                        // The log keeps what a turn printed up to a bound;
                        // past it, one line says so (the tail is still kept).
                        let room = FORWARD_LIMIT_BYTES.saturating_sub(forwarded);
                        let part = read.min(room);
                        if part > 0 {
                            forward(&chunk[..part]);
                        }
                        if part < read && !noted {
                            noted = true;
                            forward(
                                format!(
                                    "\n[kanban] the agent printed more than {} MiB this turn; the rest is not logged\n",
                                    FORWARD_LIMIT_BYTES >> 20
                                )
                                .as_bytes(),
                            );
                        }
                        forwarded = forwarded.saturating_add(read);
                    }
                    let mut tail = lock(&filled);
                    tail.bytes.extend(&chunk[..read]);
                    let excess = tail.bytes.len().saturating_sub(keep);
                    tail.bytes.drain(..excess);
                }
            }
        }
    });
    (tail, reader)
}

fn to_stdout(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

fn to_stderr(bytes: &[u8]) {
    let _ = std::io::stderr().lock().write_all(bytes);
}

/// The shell agents run in: `/bin/sh` by its path where it is, so that the
/// agent starts through `posix_spawn` (a `vfork`) rather than a copy of the
/// worker's address space, whatever `PATH` the agent is given.
pub(crate) fn shell() -> &'static str {
    static SHELL: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    SHELL.get_or_init(|| {
        if std::path::Path::new("/bin/sh").is_file() {
            "/bin/sh"
        } else {
            "sh"
        }
    })
}

/// True while any process of group `group` lives.
///
/// A zombie still counts as a member of its group until its parent waits
/// for it, and a worker is the parent of every orphan its agent leaves (it
/// is their subreaper): its own zombies in the group are reaped first, so
/// that a wrapper's child that ended after the wrapper does not hold a
/// stopped turn for the rest of its grace.
fn group_alive(group: Pid) -> bool {
    reap_zombies_in(group);
    killpg(group, None).is_ok()
}

/// This process's children, from every thread's list; `None` when the
/// lists cannot be read, or the main thread's is missing (a kernel built
/// without them, where an empty list would prove nothing).
pub fn own_children() -> Option<Vec<Pid>> {
    let me = std::process::id().to_string();
    let mut found = Vec::new();
    let mut read_mine = false;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let task = task.ok()?;
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(text) => {
                read_mine |= task.file_name() == me.as_str();
                found.extend(
                    text.split_ascii_whitespace()
                        .filter_map(|pid| pid.parse::<i32>().ok())
                        .map(Pid::from_raw),
                );
            }
            // Another thread that ended meanwhile has no children to list.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    read_mine.then_some(found)
}

/// What `/proc/PID/stat` says of a process: whether it is a zombie, and
/// its process group and session (a zombie keeps both until reaped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessStat {
    pub zombie: bool,
    pub group: Pid,
    pub session: Pid,
}

/// Reads `pid`'s stat; `None` when it is gone or the line is not
/// understood.
pub fn process_stat(pid: Pid) -> Option<ProcessStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis (a command may hold any
    // byte, parentheses too): state, parent, group, session.
    let mut fields = stat.rsplit_once(')')?.1.split_ascii_whitespace();
    let state = fields.next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some(ProcessStat {
        zombie: state == "Z",
        group: Pid::from_raw(group),
        session: Pid::from_raw(session),
    })
}

/// Reaps this process's children that are zombies of `group`, but never
/// the group's leader: that is the agent, whose exit tokio reaps.
fn reap_zombies_in(group: Pid) {
    for pid in own_children()
        .unwrap_or_default()
        .into_iter()
        .filter(|pid| *pid != group)
    {
        if process_stat(pid).is_some_and(|stat| stat.zombie && stat.group == group) {
            let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Why the worker stopped the turn, if it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopped {
    By(StopReason),
    Deadline(Duration),
}

impl ExecAgent {
    /// The turn's outcome, from how it ended and what the agent printed.
    fn settle(&self, stopped: Option<Stopped>, exit: AgentExit, text: &str) -> TurnOutcome {
        match stopped {
            Some(Stopped::Deadline(limit)) => {
                Ok(Some(deadline_result(limit, &self.config.session_id)))
            }
            Some(Stopped::By(StopReason::RunLimit)) => Ok(Some(TurnResult {
                turn_exit_reason: Some("run_limit_exceeded".to_owned()),
                ..deadline_result(Duration::ZERO, &self.config.session_id)
            })),
            Some(Stopped::By(_)) => {
                settle_turn(text, AgentExit::Interrupted, &self.config.session_id)
            }
            None => match exit {
                // `sh -c` could not find or execute the command and the
                // agent never answered: the setup failed, not the card.
                AgentExit::Code(code @ (126 | 127))
                    if matches!(parse_result_line(text), ResultLine::Absent) =>
                {
                    Err(TurnError {
                        environment: true,
                        ..TurnError::new(format!(
                            "cannot run the agent `{}`: the shell exited {code} ({})",
                            self.config.command,
                            if code == 127 {
                                "command not found"
                            } else {
                                "not executable"
                            }
                        ))
                    })
                }
                _ if self.config.seed_worker.is_some() => {
                    settle_seed_worker(text, exit, &self.config.session_id)
                }
                _ => settle_turn(text, exit, &self.config.session_id),
            },
        }
    }

    /// An agent that reports to, and is stopped through, `activity`.
    pub fn new(config: ExecAgentConfig, activity: Arc<Activity>) -> Self {
        Self {
            config,
            activity,
            seed_session: None,
        }
    }

    fn spawn(&self, input: &TurnInput) -> std::io::Result<Child> {
        let mut command = Command::new(shell());
        command.kill_on_drop(false).arg("-c");
        match &self.config.seed_worker {
            // Through the shell as every agent, so that a program it cannot
            // find is the same environment fault (127); `exec` leaves the
            // seed worker itself the group's leader, its arguments unquoted.
            Some(seed) => {
                let turn = SeedWorkerTurn {
                    profile: &seed.profile,
                    task_id: &self.config.task.id,
                    resume: self.seed_session.as_deref(),
                };
                command
                    .current_dir(&seed.workspace)
                    .arg("exec \"$0\" \"$@\"")
                    .arg(&self.config.command)
                    .args(seed_worker_args(&turn, input));
            }
            None => {
                command.arg(&self.config.command);
                if let Some(workdir) = &self.config.workdir {
                    command.current_dir(workdir);
                }
            }
        }
        command
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .env("KANBAN_TURN", input.turn.to_string())
            .env("KANBAN_SESSION_ID", &self.config.session_id)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for name in &self.config.env_remove {
            command.env_remove(name);
        }
        if self.config.seed_worker.is_some() {
            // As the seed system's dispatcher starts it: nothing on stdin.
            command.stdin(Stdio::null());
            return command.spawn();
        }
        let mut child = command.spawn()?;
        let request = serde_json::json!({
            "task": self.config.task,
            "message": input.message,
            "turn": input.turn,
            "kind": input.kind.as_str(),
            "session_id": self.config.session_id,
            "fence_token": self.config.task.fence_token,
        });
        if let Some(mut stdin) = child.stdin.take() {
            // Written from a task: an agent that never reads stdin must not
            // block the worker, and one that exits early is not an error.
            tokio::spawn(async move {
                let _ = stdin.write_all(format!("{request}\n").as_bytes()).await;
            });
        }
        Ok(child)
    }

    /// Waits for the agent, stopping its group when asked or at the deadline.
    async fn wait(
        &self,
        child: &mut Child,
        group: Pid,
    ) -> std::io::Result<(AgentExit, Option<Stopped>)> {
        let started = Instant::now();
        let mut stopped: Option<(Stopped, Instant)> = None;
        let mut killed = false;
        let grace = self.config.interrupt_grace;
        let exit = loop {
            if let Some(status) = child.try_wait()? {
                break match (status.code(), status.signal()) {
                    (Some(code), _) => AgentExit::Code(code),
                    (None, Some(signal)) => AgentExit::Signal(signal),
                    (None, None) => AgentExit::Code(1),
                };
            }
            if stopped.is_none() {
                let why = self.activity.stop_reason().map(Stopped::By).or_else(|| {
                    self.config
                        .turn_timeout
                        .filter(|limit| started.elapsed() >= *limit)
                        .map(Stopped::Deadline)
                });
                if let Some(why) = why {
                    let signal = match why {
                        Stopped::By(StopReason::Signal(number)) => {
                            Signal::try_from(number).unwrap_or(Signal::SIGTERM)
                        }
                        _ => Signal::SIGTERM,
                    };
                    tracing::info!(target: "kanban::agent", "stopping the agent ({why:?}): {signal} to its process group {group}");
                    let _ = killpg(group, signal);
                    stopped = Some((why, Instant::now()));
                }
            }
            if let Some((_, at)) = stopped
                && !killed
                && at.elapsed() >= grace
            {
                tracing::warn!(target: "kanban::agent", "the agent outlived its grace period; killing process group {group}");
                let _ = killpg(group, Signal::SIGKILL);
                killed = true;
            }
            // Wake at the agent's exit at once, else every 20 ms to look for
            // a stop request or the deadline (`Child::wait` is cancel safe).
            let _ = tokio::time::timeout(Duration::from_millis(20), child.wait()).await;
        };
        if let Some((_, at)) = stopped {
            // The leader is gone; its group gets the rest of the grace period
            // (a `sh -c` wrapper dies first, the agent it started may not).
            while group_alive(group) && at.elapsed() < grace {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok((exit, stopped.map(|(why, _)| why)))
    }
}

/// What a turn stopped at its deadline settles to: a terminal settlement
/// (never retried in place), which the worker settles as a timed-out run.
fn deadline_result(limit: Duration, session_id: &str) -> TurnResult {
    let error = format!(
        "the turn ran past its {} s deadline and its agent was stopped",
        limit.as_secs()
    );
    TurnResult {
        failed: Some(true),
        failure_retryable: Some(false),
        failure_reason: Some(FailureReason::Timeout),
        turn_exit_reason: Some(format!("{TURN_DEADLINE_EXIT_PREFIX}({}s)", limit.as_secs())),
        final_response: Some(error.clone()),
        error: Some(error),
        completed: Some(false),
        session_id: Some(session_id.to_owned()),
        ..TurnResult::default()
    }
}

#[async_trait]
impl TurnRunner for ExecAgent {
    async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome {
        if let Some(reason) = self.activity.stop_reason() {
            let exit = match reason {
                StopReason::RunLimit => {
                    return Ok(Some(TurnResult {
                        turn_exit_reason: Some("run_limit_exceeded".to_owned()),
                        ..deadline_result(Duration::ZERO, &self.config.session_id)
                    }));
                }
                _ => AgentExit::Interrupted,
            };
            return settle_turn("", exit, &self.config.session_id);
        }
        let mut child = self.spawn(input).map_err(|error| TurnError {
            environment: true,
            ..TurnError::new(format!(
                "cannot start the agent `{}`: {error}",
                self.config.command
            ))
        })?;
        let group = Pid::from_raw(
            child
                .id()
                .and_then(|pid| i32::try_from(pid).ok())
                .unwrap_or(i32::MAX),
        );
        self.activity.set_turn_active(true);
        let (out_forward, err_forward): (Option<fn(&[u8])>, Option<fn(&[u8])>) =
            match self.config.forward {
                Forward::Both => (Some(to_stdout), Some(to_stderr)),
                Forward::Stderr => (None, Some(to_stderr)),
                Forward::Neither => (None, None),
            };
        let mut stdout = child
            .stdout
            .take()
            .map(|pipe| drain(pipe, STDOUT_TAIL_BYTES, out_forward, self.activity.clone()));
        let mut stderr = child
            .stderr
            .take()
            .map(|pipe| drain(pipe, 4096, err_forward, self.activity.clone()));
        let waited = self.wait(&mut child, group).await;
        self.activity.set_turn_active(false);
        let (exit, stopped) =
            waited.map_err(|error| TurnError::new(format!("lost track of the agent: {error}")))?;
        // Read what the pipes still hold, but only briefly: whatever kept
        // them open after the agent exited does not hold the turn. Each
        // reader is awaited, so a pipe at its end is seen at once.
        let drained_by = tokio::time::Instant::now() + EXIT_DRAIN;
        for (_, reader) in stdout.iter_mut().chain(stderr.iter_mut()) {
            let _ = tokio::time::timeout_at(drained_by, reader).await;
        }
        // Nothing of the turn outlives it in the agent's own group.
        if group_alive(group) {
            let _ = killpg(group, Signal::SIGKILL);
        }
        let text_of = |tail: &SharedTail| {
            String::from_utf8_lossy(lock(tail).bytes.make_contiguous()).into_owned()
        };
        let text = stdout.map(|(tail, _)| text_of(&tail)).unwrap_or_default();
        if self.config.seed_worker.is_some()
            && let Some((tail, _)) = &stderr
            && let Some(session) = seed_worker_session(&text_of(tail))
        {
            self.seed_session = Some(session);
        }
        self.settle(stopped, exit, &text)
    }
}
