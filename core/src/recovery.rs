//! The in-place recovery loop: check, back off, check again, re-enter.

use crate::data::NotLive;
use crate::policy::{Authority, RecoveryPolicy, Refusal, build_recovery_nudge};
use crate::ports::{ClaimCheck, Sleeper, TurnRunner};
use crate::turn::{TurnInput, TurnKind, TurnOutcome, TurnResult};

/// Why the loop stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecoveryStop {
    /// The latest result grants no retry authority.
    Refused(Refusal),
    /// The worker could not prove its claim (before or after the backoff).
    ClaimLost(NotLive),
}

/// What one call of [`recover_in_place`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Attempts authorised by this call (each one slept its backoff).
    pub attempts: u32,
    /// Why the loop ended.
    pub stop: RecoveryStop,
}

/// The line said before each authorised attempt.
pub fn recovery_message(task: &str, attempt: u32, max_attempts: u32, delay_seconds: u64) -> String {
    format!(
        "[kanban] provider failure on {task} — retrying the turn in place \
         (attempt {attempt}/{max_attempts}) after {delay_seconds}s; session context preserved"
    )
}

/// The line said when the claim proof denies a retry.
pub fn skipped_message(task: &str, reason: &NotLive) -> String {
    format!(
        "[kanban] in-place recovery skipped for {task}: this worker no longer holds a live \
         run/claim (already settled, reclaimed, or unverifiable: {reason})"
    )
}

fn settled(outcome: &TurnOutcome) -> Option<&TurnResult> {
    outcome.as_ref().ok().and_then(Option::as_ref)
}

/// Retries the latest turn in place while the policy grants authority and
/// the claim stays provable.
///
/// Order per attempt: check → sleep → check → turn. The second proof closes
/// the window in which the dispatcher reclaims or settles the run during the
/// backoff. The lease is deliberately not extended while sleeping: holding a
/// claim alive is the lease's business, not recovery's, so a lease that runs
/// out during the backoff stops the loop before the model is re-entered.
///
/// `latest` is the latest turn outcome and is replaced by each recovery
/// turn's outcome; `attempts_made` counts attempts already spent in this run
/// (the budget is per run); `turns` counts turns run so far and numbers the
/// next one. The loop is bounded by the budget even if the result never
/// changes.
#[allow(clippy::too_many_arguments)]
pub async fn recover_in_place(
    policy: &RecoveryPolicy,
    latest: &mut TurnOutcome,
    attempts_made: u32,
    turns: &mut u32,
    runner: &mut dyn TurnRunner,
    check: &dyn ClaimCheck,
    sleeper: &dyn Sleeper,
    emit: &mut (dyn FnMut(&str) + Send),
) -> RecoveryReport {
    let task = policy.task_id.clone().unwrap_or_else(|| "task".to_owned());
    let mut attempts = 0;
    let mut say = |line: String| {
        tracing::warn!(target: "kanban::recovery", "{line}");
        emit(&line);
    };
    loop {
        if let Authority::Refused(refusal) =
            policy.authority(settled(latest), attempts_made + attempts)
        {
            return RecoveryReport {
                attempts,
                stop: RecoveryStop::Refused(refusal),
            };
        }
        if let Err(reason) = check.check().await {
            say(skipped_message(&task, &reason));
            return RecoveryReport {
                attempts,
                stop: RecoveryStop::ClaimLost(reason),
            };
        }
        attempts += 1;
        let attempt = attempts_made + attempts;
        let delay = policy.delay_before(attempt);
        say(recovery_message(
            &task,
            attempt,
            policy.max_attempts,
            delay.as_secs(),
        ));
        sleeper.sleep(delay).await;
        if let Err(reason) = check.check().await {
            say(skipped_message(&task, &reason));
            return RecoveryReport {
                attempts,
                stop: RecoveryStop::ClaimLost(reason),
            };
        }
        let nudge =
            build_recovery_nudge(settled(latest), attempt, policy.max_attempts, Some(&task));
        *turns += 1;
        let input = TurnInput {
            message: nudge,
            kind: TurnKind::Recovery,
            turn: *turns,
        };
        *latest = runner.run_turn(&input).await;
    }
}
