//! Agents as child processes, one per turn.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use kanban_core::{TurnError, TurnInput, TurnOutcome, TurnRunner};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::protocol::{AgentExit, settle_turn};

/// The card the agent works on, as the agent sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TaskBrief {
    pub id: String,
    pub title: String,
    pub body: String,
}

/// How an [`ExecAgent`] runs its command.
#[derive(Clone, Debug)]
pub struct ExecAgentConfig {
    /// Run as `sh -c COMMAND`.
    pub command: String,
    pub task: TaskBrief,
    /// Extra environment for the agent (the claim carrier, for a worker).
    pub env: Vec<(String, String)>,
    /// Stable across the turns of one run, so the agent can resume its session.
    pub session_id: String,
    /// How long an interrupted agent gets before its process group is killed.
    pub interrupt_grace: Duration,
    /// Copy the agent's stdout and stderr to ours as they arrive.
    pub forward_output: bool,
}

/// Runs the agent command once per turn, in its own process group.
///
/// `interrupt` holds the number of a signal to forward (0 for none): the
/// host's signal handler sets it, and the agent's whole process group gets
/// that signal, then SIGKILL after the grace period. `turn_active` is true
/// exactly while a turn's process runs (a host heartbeats only then).
#[derive(Debug)]
pub struct ExecAgent {
    config: ExecAgentConfig,
    interrupt: Arc<AtomicUsize>,
    turn_active: Arc<AtomicBool>,
}

impl ExecAgent {
    /// An agent that forwards the signal stored in `interrupt`.
    pub fn new(config: ExecAgentConfig, interrupt: Arc<AtomicUsize>) -> Self {
        Self {
            config,
            interrupt,
            turn_active: Arc::new(AtomicBool::new(false)),
        }
    }

    /// True while a turn's process runs; shared.
    pub fn turn_active(&self) -> Arc<AtomicBool> {
        self.turn_active.clone()
    }

    fn spawn(&self, input: &TurnInput) -> std::io::Result<Child> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.config.command)
            .envs(self.config.env.iter().map(|(k, v)| (k, v)))
            .env("KANBAN_TURN", input.turn.to_string())
            .env("KANBAN_SESSION_ID", &self.config.session_id)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let request = serde_json::json!({
            "task": self.config.task,
            "message": input.message,
            "turn": input.turn,
            "kind": input.kind.as_str(),
            "session_id": self.config.session_id,
        });
        if let Some(mut stdin) = child.stdin.take() {
            // Written from a thread: an agent that never reads stdin must not
            // block the worker, and one that exits early is not an error.
            std::thread::spawn(move || {
                let _ = stdin.write_all(format!("{request}\n").as_bytes());
            });
        }
        Ok(child)
    }

    /// Waits for the agent, forwarding an interrupt; returns how it ended.
    fn wait(&self, child: &mut Child) -> std::io::Result<AgentExit> {
        let group = Pid::from_raw(child.id() as i32);
        let mut forwarded: Option<Instant> = None;
        let mut killed = false;
        loop {
            if let Some(status) = child.try_wait()? {
                if forwarded.is_some() {
                    // Whatever is left of the group goes too.
                    let _ = killpg(group, Signal::SIGKILL);
                    return Ok(AgentExit::Interrupted);
                }
                return Ok(match (status.code(), status.signal()) {
                    (Some(code), _) => AgentExit::Code(code),
                    (None, Some(signal)) => AgentExit::Signal(signal),
                    (None, None) => AgentExit::Code(1),
                });
            }
            let requested = self.interrupt.load(Ordering::SeqCst);
            match forwarded {
                None if requested != 0 => {
                    let signal = Signal::try_from(requested as i32).unwrap_or(Signal::SIGTERM);
                    tracing::info!(target: "kanban::agent", "forwarding {signal} to the agent's process group {group}");
                    let _ = killpg(group, signal);
                    forwarded = Some(Instant::now());
                }
                Some(at) if !killed && at.elapsed() >= self.config.interrupt_grace => {
                    tracing::warn!(target: "kanban::agent", "the agent outlived its grace period; killing process group {group}");
                    let _ = killpg(group, Signal::SIGKILL);
                    killed = true;
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Reads a pipe to its end on its own thread, line by line, optionally
/// copying each line to our own stream.
fn drain<R: Read + Send + 'static>(pipe: R, forward: Option<fn(&str)>) -> mpsc::Receiver<String> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut collected = String::new();
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while let Ok(read) = reader.read_until(b'\n', &mut line) {
            if read == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&line);
            if let Some(forward) = forward {
                forward(&text);
            }
            collected.push_str(&text);
            // Keep the tail only: the result line is the last one that counts.
            if collected.len() > 1 << 20 {
                let cut = collected.len() - (1 << 19);
                let cut = (cut..collected.len())
                    .find(|i| collected.is_char_boundary(*i))
                    .unwrap_or(cut);
                collected.drain(..cut);
            }
            line.clear();
        }
        let _ = sender.send(collected);
    });
    receiver
}

fn to_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

fn to_stderr(text: &str) {
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

#[async_trait]
impl TurnRunner for ExecAgent {
    async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome {
        if self.interrupt.load(Ordering::SeqCst) != 0 {
            return settle_turn("", AgentExit::Interrupted, &self.config.session_id);
        }
        let mut child = self.spawn(input).map_err(|error| {
            TurnError::new(format!(
                "cannot start the agent `{}`: {error}",
                self.config.command
            ))
        })?;
        self.turn_active.store(true, Ordering::SeqCst);
        let (out_forward, err_forward): (Option<fn(&str)>, Option<fn(&str)>) =
            if self.config.forward_output {
                (Some(to_stdout), Some(to_stderr))
            } else {
                (None, None)
            };
        let stdout = drain(child.stdout.take().expect("stdout is piped"), out_forward);
        let stderr = drain(child.stderr.take().expect("stderr is piped"), err_forward);
        let exit = self.wait(&mut child);
        self.turn_active.store(false, Ordering::SeqCst);
        let exit =
            exit.map_err(|error| TurnError::new(format!("lost track of the agent: {error}")))?;
        // A grandchild may still hold the pipes open; do not wait for it forever.
        let group = Pid::from_raw(child.id() as i32);
        let collect = |receiver: mpsc::Receiver<String>| {
            receiver
                .recv_timeout(Duration::from_secs(2))
                .unwrap_or_else(|_| {
                    let _ = killpg(group, Signal::SIGKILL);
                    receiver
                        .recv_timeout(Duration::from_secs(2))
                        .unwrap_or_default()
                })
        };
        let stdout = collect(stdout);
        let _stderr = collect(stderr);
        settle_turn(&stdout, exit, &self.config.session_id)
    }
}
