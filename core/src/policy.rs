//! When a failed turn may be retried in place, and the nudges that go with it.

use std::time::Duration;

use crate::data::FailureReason;
use crate::env::{Environment, vars};
use crate::turn::TurnResult;

/// Recovery attempts when `HERMES_KANBAN_TURN_RECOVERY` is unset.
pub const DEFAULT_MAX_RECOVERY_ATTEMPTS: u32 = 3;
/// The most recovery attempts any setting can ask for: a bad value must never
/// create an unbounded loop.
pub const MAX_RECOVERY_ATTEMPTS_CEILING: u32 = 10;
/// The backoff before recovery attempt N (1-based); the last entry repeats.
pub const RECOVERY_DELAYS_SECONDS: [u64; 3] = [15, 45, 90];
/// Failure reasons never retried in place: quota and billing walls belong to
/// the dispatcher's cooldown and breaker, not to another model call.
pub const NON_RECOVERABLE_REASONS: [FailureReason; 3] = [
    FailureReason::RateLimit,
    FailureReason::Billing,
    FailureReason::UpstreamRateLimit,
];
/// `turn_exit_reason` prefixes of a turn that already went through a durable
/// terminal settlement (its run may be closed and its claim released): an
/// exhausted iteration budget, a turn stopped at its deadline, a run stopped
/// at its limit.
pub const TERMINAL_TURN_EXIT_PREFIXES: [&str; 3] = [
    "max_iterations_reached",
    "turn_deadline_exceeded",
    "run_limit_exceeded",
];
/// Stop nudges sent at most, per run, outside goal mode.
pub const DEFAULT_STOP_NUDGE_ATTEMPTS: u32 = 2;

const OFF_VALUES: [&str; 4] = ["0", "false", "no", "off"];

/// True for the values that switch a setting off: `0`, `false`, `no`, `off`
/// (any case, surrounding whitespace ignored).
pub fn is_off_value(raw: &str) -> bool {
    let raw = raw.trim();
    OFF_VALUES.iter().any(|off| raw.eq_ignore_ascii_case(off))
}

/// The worker's task id from `HERMES_KANBAN_TASK`, or `None` when this is not
/// a worker.
///
/// The single worker predicate: the value is stripped exactly once, here, so
/// a whitespace-only id can never read as a worker to one caller and not to
/// another.
pub fn worker_task_id(env: &Environment) -> Option<String> {
    env.get_trimmed(vars::TASK).map(str::to_owned)
}

/// An explicit carrier id wins over the environment; `None` reads the
/// environment. A blank explicit id is not a worker and never falls back to
/// the environment: an owner process may carry somebody else's pin.
pub fn resolve_task_id(explicit: Option<&str>, env: &Environment) -> Option<String> {
    match explicit {
        None => worker_task_id(env),
        Some(explicit) => Some(explicit.trim())
            .filter(|id| !id.is_empty())
            .map(str::to_owned),
    }
}

/// Parses a recovery budget: unset or blank → 3; an off value → 0; anything
/// unparseable → 3; otherwise clamped to `0..=10`.
pub fn parse_recovery_budget(raw: Option<&str>) -> u32 {
    let raw = raw.map(str::trim).unwrap_or("");
    if raw.is_empty() {
        return DEFAULT_MAX_RECOVERY_ATTEMPTS;
    }
    if is_off_value(raw) {
        return 0;
    }
    match parse_whole_number(raw) {
        Some(value) => value.clamp(0, i64::from(MAX_RECOVERY_ATTEMPTS_CEILING)) as u32,
        None => DEFAULT_MAX_RECOVERY_ATTEMPTS,
    }
}

/// Reads a whole number the way the seed system's settings are read: an
/// optional sign, digits, single underscores between digits (`1_0` is 10);
/// values too large for `i64` saturate, so a huge negative budget is off,
/// not the default.
fn parse_whole_number(raw: &str) -> Option<i64> {
    let (negative, digits) = match raw.as_bytes().first()? {
        b'-' => (true, &raw[1..]),
        b'+' => (false, &raw[1..]),
        _ => (false, raw),
    };
    let bytes = digits.as_bytes();
    let well_formed = bytes.first().is_some_and(u8::is_ascii_digit)
        && bytes.last().is_some_and(u8::is_ascii_digit)
        && bytes.iter().all(|b| b.is_ascii_digit() || *b == b'_')
        && !digits.contains("__");
    if !well_formed {
        return None;
    }
    let mut value: i64 = 0;
    for digit in bytes.iter().filter(|b| b.is_ascii_digit()) {
        let digit = i64::from(digit - b'0');
        value = value
            .saturating_mul(10)
            .saturating_add(if negative { -digit } else { digit });
    }
    Some(value)
}

/// `HERMES_KANBAN_TURN_RECOVERY` parsed as an attempt budget.
pub fn max_recovery_attempts(env: &Environment) -> u32 {
    parse_recovery_budget(env.get(vars::TURN_RECOVERY))
}

/// Stop nudges allowed by `HERMES_KANBAN_STOP_NUDGE`: an off value gives 0,
/// anything else the default of 2.
pub fn stop_nudge_attempts(env: &Environment) -> u32 {
    match env.get(vars::STOP_NUDGE) {
        Some(raw) if is_off_value(raw) => 0,
        _ => DEFAULT_STOP_NUDGE_ATTEMPTS,
    }
}

/// The backoff before recovery attempt `attempt` (1-based) on `schedule`.
/// Attempts at or below zero get the first entry; past the end the last
/// entry repeats. An empty schedule waits not at all. Whole seconds for the
/// worker; a host may keep its schedule in fractions (the Python binding).
pub fn recovery_delay_seconds<T: Copy + Default>(attempt: i64, schedule: &[T]) -> T {
    let Some(last) = schedule.len().checked_sub(1) else {
        return T::default();
    };
    let index = usize::try_from(attempt.max(1) - 1)
        .unwrap_or(usize::MAX)
        .min(last);
    schedule[index]
}

/// Why retry authority was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// No worker task id: this process is not a kanban worker.
    NotAWorker,
    /// The budget is zero.
    RecoveryDisabled,
    /// Every attempt of the budget was already made.
    BudgetExhausted,
    /// The turn settled nothing.
    NothingSettled,
    /// The turn was interrupted: re-entering would resurrect cancelled work.
    Interrupted,
    /// The turn went through a durable terminal settlement.
    TerminalSettlement,
    /// The turn did not fail (success, partial or `completed: false`).
    NotFailed,
    /// The classifier did not mark the failure retryable.
    NotRetryable,
    /// A quota or billing wall: the dispatcher's cooldown owns it.
    QuotaWall,
}

impl Refusal {
    /// A short stable name, for tables and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NotAWorker => "not a worker",
            Self::RecoveryDisabled => "recovery disabled",
            Self::BudgetExhausted => "budget exhausted",
            Self::NothingSettled => "nothing settled",
            Self::Interrupted => "interrupted",
            Self::TerminalSettlement => "terminal settlement",
            Self::NotFailed => "not failed",
            Self::NotRetryable => "not retryable",
            Self::QuotaWall => "quota wall",
        }
    }
}

/// The answer to "may this turn be retried in place?".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Authority {
    Granted,
    Refused(Refusal),
}

impl Authority {
    /// True when retry authority was granted.
    pub fn is_granted(self) -> bool {
        self == Self::Granted
    }
}

/// The in-place recovery rules for one worker: who it is, how many attempts
/// it may make, and how long it waits before each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// The worker's task id; `None` means not a worker.
    pub task_id: Option<String>,
    /// The attempt budget.
    pub max_attempts: u32,
    /// The backoff schedule in seconds; the last entry repeats.
    pub delays_seconds: Vec<u64>,
}

impl RecoveryPolicy {
    /// The policy for a process whose identity comes from `explicit_task_id`
    /// (see [`resolve_task_id`]) and whose budget comes from the environment.
    pub fn from_env(env: &Environment, explicit_task_id: Option<&str>) -> Self {
        Self {
            task_id: resolve_task_id(explicit_task_id, env),
            max_attempts: max_recovery_attempts(env),
            delays_seconds: RECOVERY_DELAYS_SECONDS.to_vec(),
        }
    }

    /// On when a worker task id is carried and the budget is non-zero.
    pub fn enabled(&self) -> bool {
        self.task_id.is_some() && self.max_attempts > 0
    }

    /// The backoff before attempt `attempt` (1-based).
    pub fn delay_before(&self, attempt: u32) -> Duration {
        Duration::from_secs(recovery_delay_seconds(
            i64::from(attempt),
            &self.delays_seconds,
        ))
    }

    /// Retry authority for `result` after `attempts_made` recovery attempts.
    ///
    /// Authority is positive and typed: only a failed turn the classifier
    /// marked retryable, within budget, that is not a quota wall, was not
    /// interrupted and did not settle terminally. Nothing is inferred from a
    /// result's shape; partial and `completed: false` are outcomes, not
    /// authority.
    pub fn authority(&self, result: Option<&TurnResult>, attempts_made: u32) -> Authority {
        use Authority::Refused;
        if self.task_id.is_none() {
            return Refused(Refusal::NotAWorker);
        }
        if self.max_attempts == 0 {
            return Refused(Refusal::RecoveryDisabled);
        }
        if attempts_made >= self.max_attempts {
            return Refused(Refusal::BudgetExhausted);
        }
        let Some(result) = result else {
            return Refused(Refusal::NothingSettled);
        };
        if result.is_interrupted() {
            return Refused(Refusal::Interrupted);
        }
        let exit_reason = result.turn_exit_reason.as_deref().unwrap_or("");
        if TERMINAL_TURN_EXIT_PREFIXES
            .iter()
            .any(|prefix| exit_reason.starts_with(prefix))
        {
            return Refused(Refusal::TerminalSettlement);
        }
        if !result.is_failed() {
            return Refused(Refusal::NotFailed);
        }
        if result.failure_retryable != Some(true) {
            return Refused(Refusal::NotRetryable);
        }
        if result
            .failure_reason
            .as_ref()
            .is_some_and(|r| NON_RECOVERABLE_REASONS.contains(r))
        {
            return Refused(Refusal::QuotaWall);
        }
        Authority::Granted
    }

    /// True when [`RecoveryPolicy::authority`] grants a retry.
    pub fn should_recover(&self, result: Option<&TurnResult>, attempts_made: u32) -> bool {
        self.authority(result, attempts_made).is_granted()
    }
}

/// Shortens `text` to one line of at most `limit` characters.
fn one_line(text: &str, limit: usize) -> String {
    let flat = text.trim().replace('\n', " ");
    if flat.chars().count() <= limit {
        return flat;
    }
    let mut short: String = flat.chars().take(limit.saturating_sub(1)).collect();
    short.push('…');
    short
}

/// The synthetic user message of a recovery turn.
///
/// Its contract: it names the task and the attempt (`a/m`), quotes the error,
/// says this is the same session and not to start over, and asks for a
/// terminal `kanban_complete` or `kanban_block` call.
pub fn build_recovery_nudge(
    result: Option<&TurnResult>,
    attempt: u32,
    max_attempts: u32,
    task_id: Option<&str>,
) -> String {
    let error = result
        .map(|result| {
            // As the seed's `error or final_response`: an empty error falls through.
            let error = result.error.as_deref().filter(|error| !error.is_empty());
            one_line(
                error.or(result.final_response.as_deref()).unwrap_or(""),
                300,
            )
        })
        .filter(|error| !error.is_empty())
        .unwrap_or_else(|| "provider stream failure".to_owned());
    let task = task_id.unwrap_or("this task");
    format!(
        "[kanban: your previous turn did not finish: the provider call failed and was given up \
         (recovery attempt {attempt}/{max_attempts}). Error: {error}.\n\n\
         Task `{task}` is still `running`, and this is the SAME session: everything you already \
         read, wrote or worked out is still here. Do NOT start over.\n\n\
         Next:\n\
         1. If the failed turn was in the middle of a tool call, check the real state of whatever \
         it was changing before going on; the call may not have happened.\n\
         2. Continue from where the work stopped and finish what remains.\n\
         3. End with `kanban_complete` (summary, result) when the work is done, or \
         `kanban_block` (reason) when you cannot go on.]"
    )
}

/// The synthetic user message sent after a successful turn that made no
/// terminal board call.
pub fn build_stop_nudge(task_id: &str, attempt: u32, max_attempts: u32) -> String {
    format!(
        "[kanban: a plain reply does not finish a card (reminder {attempt}/{max_attempts}).\n\n\
         Task `{task_id}` is still `running`. Ending now without a board call is booked as a \
         protocol violation, and repeated violations block the card for a human.\n\n\
         In your next reply, without describing what you will do:\n\
         1. Finish any deliverable that is still missing.\n\
         2. Call `kanban_complete` (summary, result) if the work is done, or `kanban_block` \
         (reason) if you are blocked.]"
    )
}
