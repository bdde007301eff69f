//! A judge command for goal mode.

use async_trait::async_trait;
use kanban_core::{Judge, JudgeError, Verdict};

use crate::oneshot::OneShotCommand;

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
        let request = serde_json::json!({"goal": goal, "last_response": last_response}).to_string();
        // In the worker's process group: whoever stops the worker stops
        // its judge with it.
        let run = OneShotCommand {
            env: self.env.clone(),
            env_remove: self.env_remove.clone(),
            own_group: false,
            ..OneShotCommand::new(self.command.clone(), self.timeout)
        };
        let text = run
            .run(&request)
            .map_err(|error| JudgeError(format!("the judge {error}")))?;
        parse_verdict(&text)
    }
}
