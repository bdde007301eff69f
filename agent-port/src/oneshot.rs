//! One run of a command that reads a request on its standard input and
//! answers on its standard output: a goal judge, or an agent asked to
//! specify or decompose a card. It runs in a process group of its own,
//! and that group is killed when it outlives its limit, so nothing it
//! started is left behind.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The most of an answer's start that is kept; the rest is read and
/// discarded but for its end.
pub const ONE_SHOT_ANSWER_BYTES: u64 = 1024 * 1024;

/// The most of an answer's end kept beyond [`ONE_SHOT_ANSWER_BYTES`], for
/// a reader that wants its last line (a judge's verdict).
const TAIL_BYTES: usize = 64 * 1024;
/// How long the output of an exited command is read on: what it started
/// and left running may hold its output open.
const EXIT_DRAIN: Duration = Duration::from_millis(500);

/// A command run once per request: `sh -c COMMAND`.
#[derive(Clone)]
pub struct OneShotCommand {
    pub command: String,
    pub env: Vec<(String, String)>,
    /// Variables of this process it is not handed (a worker's seal, a
    /// database password).
    pub env_remove: Vec<String>,
    /// Its folder; the caller's when none.
    pub cwd: Option<std::path::PathBuf>,
    pub timeout: Duration,
    /// Run it in a process group of its own, killed whole at its limit or
    /// on an interrupt. Without one it stays in the caller's group, where
    /// whoever stops the caller stops it too (a worker's judge).
    pub own_group: bool,
    /// Set (non-zero) when the caller is interrupted: the command is
    /// stopped and the run fails.
    pub interrupt: Option<Arc<AtomicUsize>>,
}

impl std::fmt::Debug for OneShotCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment may carry secrets: names only.
        f.debug_struct("OneShotCommand")
            .field("command", &self.command)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("env_remove", &self.env_remove)
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .field("own_group", &self.own_group)
            .finish_non_exhaustive()
    }
}

/// What was read of an answer so far: its first [`ONE_SHOT_ANSWER_BYTES`],
/// and of the rest only its last [`TAIL_BYTES`], so a command that prints
/// without end is never cut off by a closed pipe.
#[derive(Default)]
struct Answer {
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
}

impl Answer {
    fn add(&mut self, chunk: &[u8]) {
        let head_limit = usize::try_from(ONE_SHOT_ANSWER_BYTES).unwrap_or(usize::MAX);
        let room = head_limit.saturating_sub(self.head.len()).min(chunk.len());
        self.head.extend_from_slice(&chunk[..room]);
        self.tail.extend(&chunk[room..]);
        let extra = self.tail.len().saturating_sub(TAIL_BYTES);
        self.tail.drain(..extra);
    }

    fn take(&mut self) -> Vec<u8> {
        let mut bytes = std::mem::take(&mut self.head);
        if !self.tail.is_empty() {
            bytes.push(b'\n');
            bytes.extend(self.tail.drain(..));
        }
        bytes
    }
}

/// Reads `stdout` into `answer` until its end.
fn read_into(mut stdout: impl Read, answer: &std::sync::Mutex<Answer>) {
    let mut buffer = [0_u8; 8192];
    loop {
        match stdout.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                if let Ok(mut answer) = answer.lock() {
                    answer.add(&buffer[..read]);
                }
            }
        }
    }
}

impl OneShotCommand {
    /// A command in its own process group, with no interrupt.
    pub fn new(command: String, timeout: Duration) -> Self {
        Self {
            command,
            env: Vec::new(),
            env_remove: Vec::new(),
            cwd: None,
            timeout,
            own_group: true,
            interrupt: None,
        }
    }

    fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|flag| flag.load(std::sync::atomic::Ordering::SeqCst) != 0)
    }

    /// `sh -c COMMAND` started with its environment, folder and group.
    fn spawn(&self) -> Result<std::process::Child, String> {
        let mut command = Command::new(crate::exec::shell());
        command
            .arg("-c")
            .arg(&self.command)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        if self.own_group {
            command.process_group(0);
        }
        for name in &self.env_remove {
            command.env_remove(name);
        }
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| format!("cannot start `{}`: {error}", self.command))
    }

    /// Runs it with `request` on its standard input: what it printed on its
    /// standard output, once it exits with status 0 within its limit.
    pub fn run(&self, request: &str) -> Result<String, String> {
        String::from_utf8(self.run_bytes(request)?)
            .map_err(|_| format!("`{}` answered with bytes that are not UTF-8", self.command))
    }

    /// Like [`OneShotCommand::run`], its answer as bytes, whatever they are.
    pub fn run_bytes(&self, request: &str) -> Result<Vec<u8>, String> {
        let mut child = self.spawn()?;
        let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        let own_group = self.own_group;
        let stop = |child: &mut std::process::Child| {
            if own_group {
                let _ = killpg(group, Signal::SIGKILL);
            } else {
                let _ = child.kill();
            }
            let _ = child.wait();
        };
        if let Some(mut stdin) = child.stdin.take() {
            let request = request.to_owned();
            // From a thread: a command that writes before it reads must not
            // deadlock us; one that never reads gets a broken pipe.
            std::thread::spawn(move || {
                let _ = stdin.write_all(request.as_bytes());
            });
        }
        let Some(stdout) = child.stdout.take() else {
            stop(&mut child);
            return Err(format!("cannot read the answer of `{}`", self.command));
        };
        let answer: Arc<std::sync::Mutex<Answer>> = Arc::default();
        let (sender, finished) = std::sync::mpsc::channel();
        let reading = answer.clone();
        std::thread::spawn(move || {
            read_into(stdout, &reading);
            let _ = sender.send(());
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if self.interrupted() => {
                    stop(&mut child);
                    return Err(format!("`{}` was stopped: interrupted", self.command));
                }
                Ok(None) if Instant::now() >= deadline => {
                    stop(&mut child);
                    return Err(format!(
                        "`{}` gave no answer within {:?}; it was stopped",
                        self.command, self.timeout
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(error) => {
                    stop(&mut child);
                    return Err(format!("`{}` failed: {error}", self.command));
                }
            }
        };
        // What it left running in its group would hold the pipe open: it
        // goes too. A process that left the group is not waited for long.
        if own_group {
            let _ = killpg(group, Signal::SIGKILL);
        }
        // Read to its end, or for a moment when something else holds it open.
        let _ = finished.recv_timeout(EXIT_DRAIN);
        let bytes = answer
            .lock()
            .map(|mut answer| answer.take())
            .unwrap_or_default();
        if !status.success() {
            return Err(format!("`{}` exited with {status}", self.command));
        }
        Ok(bytes)
    }
}
