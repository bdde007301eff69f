//! One run of a command that reads a request on its standard input and
//! answers on its standard output: a goal judge, or an agent asked to
//! specify or decompose a card. It runs in a process group of its own,
//! and that group is killed when it outlives its limit, so nothing it
//! started is left behind.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The most of an answer that is read; the rest is discarded.
pub const ONE_SHOT_ANSWER_BYTES: u64 = 1024 * 1024;

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
            .finish()
    }
}

impl OneShotCommand {
    /// Runs it with `request` on its standard input: what it printed on its
    /// standard output, once it exits with status 0 within its limit.
    pub fn run(&self, request: &str) -> Result<String, String> {
        let mut command = Command::new(crate::exec::shell());
        command
            .arg("-c")
            .arg(&self.command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .process_group(0);
        for name in &self.env_remove {
            command.env_remove(name);
        }
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| format!("cannot start `{}`: {error}", self.command))?;
        let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        if let Some(mut stdin) = child.stdin.take() {
            let request = request.to_owned();
            // From a thread: a command that writes before it reads must not
            // deadlock us; one that never reads gets a broken pipe.
            std::thread::spawn(move || {
                let _ = stdin.write_all(request.as_bytes());
            });
        }
        let Some(stdout) = child.stdout.take() else {
            return Err(format!("cannot read the answer of `{}`", self.command));
        };
        let reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = stdout.take(ONE_SHOT_ANSWER_BYTES).read_to_end(&mut bytes);
            bytes
        });
        let deadline = Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = killpg(group, Signal::SIGKILL);
                    let _ = child.wait();
                    return Err(format!(
                        "`{}` gave no answer within {:?}; it was stopped",
                        self.command, self.timeout
                    ));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(error) => return Err(format!("`{}` failed: {error}", self.command)),
            }
        };
        // What it left running would hold the pipe open: it goes too.
        let _ = killpg(group, Signal::SIGKILL);
        let bytes = reader.join().unwrap_or_default();
        if !status.success() {
            return Err(format!("`{}` exited with {status}", self.command));
        }
        String::from_utf8(bytes)
            .map_err(|_| format!("`{}` answered with bytes that are not UTF-8", self.command))
    }
}
