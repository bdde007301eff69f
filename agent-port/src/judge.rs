//! A judge command for goal mode.

use std::io::Write;
use std::process::{Command, Stdio};

use async_trait::async_trait;
use kanban_core::{Judge, JudgeError, Verdict};

/// Parses the judge's output: the last line that is a JSON object with a
/// `verdict` of `done`, `blocked`, `continue` or `wait`.
pub fn parse_verdict(stdout: &str) -> Result<Verdict, JudgeError> {
    stdout
        .lines()
        .rev()
        .find_map(|line| serde_json::from_str::<Verdict>(line.trim()).ok())
        .ok_or_else(|| {
            JudgeError(format!(
                "the judge printed no verdict line such as {{\"verdict\": \"continue\", \"reason\": \"...\"}}; it printed: {}",
                stdout.trim().chars().take(200).collect::<String>()
            ))
        })
}

/// Runs `sh -c COMMAND` with `{"goal", "last_response"}` on stdin, and gives
/// up (killing it) after `timeout`: a judge that hangs must not hang the worker.
#[derive(Clone, Debug)]
pub struct CommandJudge {
    pub command: String,
    pub env: Vec<(String, String)>,
    /// Variables of this process the judge is not handed (a worker's seal,
    /// a database password): a judge is a command like an agent, and what
    /// it prints reaches the card's log.
    pub env_remove: Vec<String>,
    pub timeout: std::time::Duration,
}

impl CommandJudge {
    /// A judge with the default limit of 60 s.
    pub fn new(command: String, env: Vec<(String, String)>) -> Self {
        Self {
            command,
            env,
            env_remove: Vec::new(),
            timeout: std::time::Duration::from_secs(60),
        }
    }
}

#[async_trait]
impl Judge for CommandJudge {
    async fn judge(&self, goal: &str, last_response: &str) -> Result<Verdict, JudgeError> {
        use std::io::Read;
        let mut command = Command::new(crate::exec::shell());
        command
            .arg("-c")
            .arg(&self.command)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        for name in &self.env_remove {
            command.env_remove(name);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| {
                JudgeError(format!(
                    "cannot start the judge `{}`: {error}",
                    self.command
                ))
            })?;
        let request = serde_json::json!({"goal": goal, "last_response": last_response}).to_string();
        if let Some(mut stdin) = child.stdin.take() {
            // From a thread: a judge that writes before it reads must not deadlock us.
            std::thread::spawn(move || {
                let _ = stdin.write_all(request.as_bytes());
            });
        }
        let mut stdout = child.stdout.take().expect("stdout is piped");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stdout.read_to_string(&mut text);
            text
        });
        let deadline = std::time::Instant::now() + self.timeout;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if std::time::Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(JudgeError(format!(
                        "the judge `{}` gave no verdict within {:?}",
                        self.command, self.timeout
                    )));
                }
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(20)),
                Err(error) => {
                    return Err(JudgeError(format!(
                        "the judge `{}` failed: {error}",
                        self.command
                    )));
                }
            }
        };
        let text = reader.join().unwrap_or_default();
        if !status.success() {
            return Err(JudgeError(format!(
                "the judge `{}` exited with {status}",
                self.command
            )));
        }
        parse_verdict(&text)
    }
}
