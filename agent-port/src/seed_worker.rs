//! The seed system's own worker as an agent: `hermes -p PROFILE --cli
//! --accept-hooks chat -q "work kanban task ID"`, started as the seed
//! system's dispatcher starts it, and settled from its exit code alone (it
//! prints prose, never our result line).

use kanban_core::{FailureReason, TurnInput, TurnKind, TurnOutcome, TurnResult};

use crate::protocol::{AgentExit, STDOUT_TAIL_CHARS, settle_turn};

/// How an agent spec names the seed system's worker: `hermes:PROFILE`.
pub const SEED_WORKER_PREFIX: &str = "hermes:";

/// The seed system's exit code for "my provider rate-limited me or my
/// quota is spent": BSD's `EX_TEMPFAIL`, as its `KANBAN_RATE_LIMIT_EXIT_CODE`.
pub const SEED_RATE_LIMIT_EXIT: i32 = 75;

/// Profile names the seed system reserves (its `_RESERVED_NAMES`).
const RESERVED_PROFILES: [&str; 5] = ["hermes", "test", "tmp", "root", "sudo"];

/// The seed worker an agent spec names, if it names one: `Some(Ok(profile))`
/// for `hermes:PROFILE` with a profile the seed system accepts, normalized
/// as it normalizes them; `Some(Err)` saying why for any other
/// `hermes:` spec; `None` for every other agent.
pub fn seed_worker_profile(spec: &str) -> Option<Result<String, String>> {
    let raw = spec.trim().strip_prefix(SEED_WORKER_PREFIX)?;
    Some(normalize_profile(raw))
}

/// The seed system's `normalize_profile_name` then `validate_profile_name`.
fn normalize_profile(raw: &str) -> Result<String, String> {
    let name = raw.trim();
    if name.eq_ignore_ascii_case("default") {
        return Ok("default".to_owned());
    }
    let name = name.to_lowercase();
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|first| first.is_ascii_lowercase() || first.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'))
        && name.len() <= 64;
    if !well_formed {
        return Err(format!(
            "{raw:?} is not a profile of the seed system: name one like `hermes:coder` (a letter or digit, then letters, digits, '_' or '-', 64 at most)"
        ));
    }
    if RESERVED_PROFILES.contains(&name.as_str()) {
        return Err(format!(
            "the seed system reserves the profile name {name:?}: name another profile"
        ));
    }
    Ok(name)
}

/// What the seed worker is started with, besides its program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedWorkerTurn<'a> {
    pub profile: &'a str,
    pub task_id: &'a str,
    /// The session its last turn printed (`session_id: …`), resumed so a
    /// later turn keeps the run's history.
    pub resume: Option<&'a str>,
}

/// The seed worker's arguments for one turn. The first turn's message is
/// the seed system's own (`work kanban task ID`: the worker reads the card
/// through its tools); later turns carry ours (a recovery or stop nudge).
/// Always its fully quiet path (`-Q`): only there does it exit 75 when its
/// provider rate-limits it (0.19.0 exits 0 on any other path), and only
/// there does its goal loop run (`HERMES_KANBAN_GOAL_MODE`).
pub fn seed_worker_args(turn: &SeedWorkerTurn<'_>, input: &TurnInput) -> Vec<String> {
    let message = match input.kind {
        TurnKind::Initial => format!("work kanban task {}", turn.task_id),
        _ => input.message.clone(),
    };
    let mut args: Vec<String> = ["-p", turn.profile, "--cli", "--accept-hooks", "chat"]
        .map(str::to_owned)
        .to_vec();
    if let Some(session) = turn.resume {
        args.extend(["--resume".to_owned(), session.to_owned()]);
    }
    args.extend(["-q".to_owned(), message, "-Q".to_owned()]);
    args
}

/// The session the seed worker said it used: its last `session_id: ID`
/// line on stderr, when the id is one a command line can carry.
pub fn seed_worker_session(stderr: &str) -> Option<String> {
    stderr.lines().rev().find_map(|line| {
        let id = line.trim().strip_prefix("session_id:")?.trim();
        let plain = !id.is_empty()
            && id.len() <= 128
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
        plain.then(|| id.to_owned())
    })
}

/// Settles one seed worker turn from its exit. Its `kanban_complete` and
/// `kanban_block` calls write the board themselves, so exit 0 is a turn
/// that ended (the worker then looks at the card); 75 is its rate-limit or
/// quota exit, booked as a rate limit (the dispatcher walls the agent and
/// never retries it in place); any other code is a failure it already
/// retried on its own.
pub fn settle_seed_worker(stdout: &str, exit: AgentExit, session_id: &str) -> TurnOutcome {
    let failed = |reason: FailureReason, error: String| TurnResult {
        failed: Some(true),
        failure_retryable: Some(false),
        failure_reason: Some(reason),
        final_response: Some(error.clone()),
        error: Some(error),
        completed: Some(false),
        session_id: Some(session_id.to_owned()),
        ..TurnResult::default()
    };
    match exit {
        AgentExit::Code(SEED_RATE_LIMIT_EXIT) => Ok(Some(failed(
            FailureReason::RateLimit,
            format!(
                "the seed system's worker exited {SEED_RATE_LIMIT_EXIT}: its provider rate-limited it or its quota is spent"
            ),
        ))),
        // Its stdout is prose: no line of it is read as a turn result.
        AgentExit::Code(0) => {
            let text = stdout.trim();
            let count = text.chars().count();
            let reply: String = text
                .chars()
                .skip(count.saturating_sub(STDOUT_TAIL_CHARS))
                .collect();
            Ok(Some(TurnResult {
                completed: Some(true),
                final_response: Some(reply),
                session_id: Some(session_id.to_owned()),
                ..TurnResult::default()
            }))
        }
        AgentExit::Interrupted => settle_turn("", exit, session_id),
        AgentExit::Code(code) => Ok(Some(failed(
            FailureReason::Unknown,
            format!("the seed system's worker exited {code}"),
        ))),
        AgentExit::Signal(signal) => Ok(Some(failed(
            FailureReason::Unknown,
            format!("the seed system's worker was killed by signal {signal}"),
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_the_seed_systems() {
        assert_eq!(seed_worker_profile("coder"), None);
        assert_eq!(
            seed_worker_profile("hermes:Coder"),
            Some(Ok("coder".into()))
        );
        assert_eq!(
            seed_worker_profile(" hermes: DEFAULT "),
            Some(Ok("default".into()))
        );
        assert_eq!(
            seed_worker_profile("hermes:a_b-9"),
            Some(Ok("a_b-9".into()))
        );
        for bad in ["", "-x", "_x", "a.b", "a/b", "a b", "ü", "hermes", "tmp"] {
            assert!(
                matches!(seed_worker_profile(&format!("hermes:{bad}")), Some(Err(_))),
                "{bad:?}"
            );
        }
        let longest = "a".repeat(64);
        assert!(matches!(
            seed_worker_profile(&format!("hermes:{longest}")),
            Some(Ok(_))
        ));
        assert!(matches!(
            seed_worker_profile(&format!("hermes:{longest}a")),
            Some(Err(_))
        ));
    }
}
