//! The simulated agent of `kanban demo`: a real child process speaking the
//! agent protocol, whose behaviour the card's body names (`sim: BEHAVIOUR`).

use std::io::Read;

use kanban_core::Environment;
use kanban_core::ExitCode;
use serde_json::{Value, json};

use crate::agent_calls;
use crate::out::{errln, outln_or_drop};

/// The behaviours, and what each does per turn.
pub(crate) const BEHAVIOURS: [(&str, &str); 5] = [
    ("ok", "finishes on its first turn"),
    (
        "flaky",
        "loses its first turn to a stream reset, then finishes",
    ),
    (
        "flaky-twice",
        "loses two turns (stream reset, 503), then finishes",
    ),
    ("quota", "hits a quota wall (429) every turn"),
    (
        "chatty",
        "replies in prose and never makes a terminal board call",
    ),
];

fn failure(reason: &str, error: &str) -> Value {
    json!({"failed": true, "failure_retryable": true, "failure_reason": reason, "error": error, "completed": false})
}

fn finish(env: &Environment, summary: &str) -> Value {
    match agent_calls::complete(env, summary, None, None, Vec::new()) {
        Ok(ExitCode::Success) => json!({"completed": true, "final_response": summary}),
        // The board failed, not the card: a transient failure, as the agent
        // protocol asks.
        Ok(_) => failure("server_error", "the board could not take the terminal call"),
        Err(error) => {
            json!({"failed": true, "failure_retryable": false, "failure_reason": "unknown", "error": format!("{error:#}")})
        }
    }
}

pub(crate) fn sim_agent(env: &Environment) -> anyhow::Result<ExitCode> {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let request: Value = serde_json::from_str(input.trim()).unwrap_or(Value::Null);
    let body = request["task"]["body"].as_str().unwrap_or("");
    let behaviour = body
        .split("sim:")
        .nth(1)
        .map(str::trim)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("ok");
    let turn: u32 = env
        .get_trimmed("KANBAN_TURN")
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    errln!(
        "[sim] {behaviour} agent, turn {turn} ({})",
        request["kind"].as_str().unwrap_or("initial")
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    let result = match (behaviour, turn) {
        ("flaky", 1) | ("flaky-twice", 1) => failure("timeout", "stream reset by peer (simulated)"),
        ("flaky-twice", 2) => failure("overloaded", "503 the model is overloaded (simulated)"),
        ("quota", _) => json!({
            "failed": true, "failure_retryable": true, "failure_reason": "rate_limit",
            "error": "429 quota exceeded for this key (simulated)", "retry_after_seconds": 300
        }),
        ("chatty", _) => {
            json!({"completed": true, "final_response": "I believe the work is done now."})
        }
        (_, _) => finish(env, &format!("{behaviour} card finished on turn {turn}")),
    };
    outln_or_drop!("{result}");
    Ok(ExitCode::Success)
}
