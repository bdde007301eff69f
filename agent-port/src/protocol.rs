//! The agent protocol's pure half: reading a turn result from what the agent
//! printed and how it exited.

use kanban_core::{FailureReason, TurnOutcome, TurnResult};

/// How many characters of stdout a turn without a result line keeps as its reply.
pub const STDOUT_TAIL_CHARS: usize = 2_000;

/// What the last result line of an agent's stdout said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResultLine {
    /// No line parsed as a JSON object or `null`.
    Absent,
    /// `null`: the turn settled nothing.
    NothingSettled,
    /// An object with the turn result's fields.
    Result(TurnResult),
    /// An object that is not a turn result (a field has the wrong type).
    Invalid { line: String, error: String },
}

/// Finds the last line of `stdout` that parses as a JSON object or `null`.
///
/// Other JSON values (a bare number or string) are ordinary text: an agent
/// may well end its reply with `42`.
pub fn parse_result_line(stdout: &str) -> ResultLine {
    for line in stdout.lines().rev() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        let Ok(value) = serde_json::from_str::<serde_json::Value>(trimmed) else {
            continue;
        };
        return match value {
            serde_json::Value::Null => ResultLine::NothingSettled,
            serde_json::Value::Object(_) => match serde_json::from_value::<TurnResult>(value) {
                Ok(result) => ResultLine::Result(result),
                Err(error) => ResultLine::Invalid {
                    line: shorten(trimmed, 200),
                    error: error.to_string(),
                },
            },
            _ => continue,
        };
    }
    ResultLine::Absent
}

/// How the agent process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentExit {
    Code(i32),
    /// Killed by a signal the worker did not send.
    Signal(i32),
    /// Ended after the worker forwarded an interrupt.
    Interrupted,
}

fn shorten(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let mut short: String = text.chars().take(limit).collect();
    short.push('…');
    short
}

fn tail(text: &str, limit: usize) -> String {
    let count = text.chars().count();
    text.chars().skip(count.saturating_sub(limit)).collect()
}

fn failed(reason: FailureReason, retryable: bool, error: String) -> TurnResult {
    TurnResult {
        failed: Some(true),
        failure_retryable: Some(retryable),
        failure_reason: Some(reason),
        final_response: Some(error.clone()),
        error: Some(error),
        completed: Some(false),
        ..TurnResult::default()
    }
}

/// Settles one turn from the agent's stdout and exit.
///
/// An interrupt always wins. Otherwise the result line decides; without
/// one, exit 0 is a completed turn whose reply is the stdout tail, exit 75 a
/// retryable `overloaded` failure, anything else a non-retryable `unknown`
/// failure.
pub fn settle_turn(stdout: &str, exit: AgentExit, session_id: &str) -> TurnOutcome {
    let mut result = match exit {
        AgentExit::Interrupted => TurnResult {
            interrupted: Some(true),
            completed: Some(false),
            final_response: Some("the turn was interrupted".to_owned()),
            ..TurnResult::default()
        },
        _ => match parse_result_line(stdout) {
            ResultLine::NothingSettled => return Ok(None),
            ResultLine::Result(result) => result,
            ResultLine::Invalid { line, error } => failed(
                FailureReason::Unknown,
                false,
                format!("the agent's last JSON line is not a turn result ({error}): {line}"),
            ),
            ResultLine::Absent => match exit {
                AgentExit::Code(0) => TurnResult {
                    completed: Some(true),
                    final_response: Some(tail(stdout.trim(), STDOUT_TAIL_CHARS)),
                    ..TurnResult::default()
                },
                AgentExit::Code(75) => failed(
                    FailureReason::Overloaded,
                    true,
                    "the agent exited 75 (temporary failure)".to_owned(),
                ),
                AgentExit::Code(code) => failed(
                    FailureReason::Unknown,
                    false,
                    format!("the agent exited {code}"),
                ),
                AgentExit::Signal(signal) => failed(
                    FailureReason::Unknown,
                    false,
                    format!("the agent was killed by signal {signal}"),
                ),
                // Settled by the outer match; kept total so no input panics.
                AgentExit::Interrupted => failed(
                    FailureReason::Unknown,
                    false,
                    "the turn was interrupted".to_owned(),
                ),
            },
        },
    };
    if result.session_id.is_none() {
        result.session_id = Some(session_id.to_owned());
    }
    Ok(Some(result))
}
