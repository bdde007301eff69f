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

/// Runs `sh -c COMMAND` with `{"goal", "last_response"}` on stdin.
#[derive(Clone, Debug)]
pub struct CommandJudge {
    pub command: String,
    pub env: Vec<(String, String)>,
}

#[async_trait]
impl Judge for CommandJudge {
    async fn judge(&self, goal: &str, last_response: &str) -> Result<Verdict, JudgeError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(&self.command)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
            // A judge that does not read its input is allowed to.
            let _ = stdin.write_all(request.as_bytes());
        }
        let output = child
            .wait_with_output()
            .map_err(|error| JudgeError(format!("the judge `{}` failed: {error}", self.command)))?;
        if !output.status.success() {
            return Err(JudgeError(format!(
                "the judge `{}` exited with {}",
                self.command, output.status
            )));
        }
        parse_verdict(&String::from_utf8_lossy(&output.stdout))
    }
}
