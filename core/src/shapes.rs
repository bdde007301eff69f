//! The canonical turn-result shapes of the contract.
//!
//! They name the cases the policy tables are written over; `kanban-testkit`
//! re-exports them as test builders, so tests and tables speak of the same
//! shapes.

use crate::data::FailureReason;
use crate::turn::TurnResult;

/// A failed turn after the provider retries gave up.
pub fn failed(retryable: bool, reason: &str, error: &str) -> TurnResult {
    TurnResult {
        failed: Some(true),
        failure_retryable: Some(retryable),
        failure_reason: Some(FailureReason::parse(reason)),
        error: Some(error.to_owned()),
        final_response: Some(format!("API call failed after 3 retries: {error}")),
        completed: Some(false),
        ..TurnResult::default()
    }
}

/// The usual retryable failure: a stream reset classified as `timeout`.
pub fn failed_timeout() -> TurnResult {
    failed(true, "timeout", "peer closed connection")
}

/// A retryable-looking failure of the given reason.
pub fn failed_with(reason: &str) -> TurnResult {
    failed(true, reason, "peer closed connection")
}

/// A settled successful turn.
pub fn success() -> TurnResult {
    success_with("done")
}

/// A settled successful turn replying `reply`.
pub fn success_with(reply: &str) -> TurnResult {
    TurnResult {
        failed: Some(false),
        completed: Some(true),
        final_response: Some(reply.to_owned()),
        ..TurnResult::default()
    }
}

/// A turn whose interrupt was already persisted and cleared.
pub fn interrupted() -> TurnResult {
    TurnResult {
        interrupted: Some(true),
        ..failed_timeout()
    }
}

/// A turn that went through the bounded terminal settlement, still carrying
/// a retryable failure stamp: the settlement must win.
pub fn settled() -> TurnResult {
    TurnResult {
        turn_exit_reason: Some("max_iterations_reached(60/60)".to_owned()),
        ..failed_timeout()
    }
}

/// A truncated, unfinished but not failed turn.
pub fn partial() -> TurnResult {
    TurnResult {
        partial: Some(true),
        completed: Some(false),
        final_response: Some("cut off".to_owned()),
        error: Some("truncated".to_owned()),
        ..TurnResult::default()
    }
}

/// A turn that only says it did not complete.
pub fn completed_false() -> TurnResult {
    TurnResult {
        completed: Some(false),
        final_response: Some("x".to_owned()),
        ..TurnResult::default()
    }
}

/// Every named shape with its id, in table order. `None` is "nothing settled".
pub fn all() -> Vec<(&'static str, Option<TurnResult>)> {
    vec![
        (
            "eligible (failed, retryable timeout)",
            Some(failed_timeout()),
        ),
        (
            "not-retryable (auth)",
            Some(failed(false, "auth", "401 unauthorized")),
        ),
        ("success", Some(success())),
        ("nothing-settled", None),
        ("quota-wall", Some(failed_with("rate_limit"))),
        ("billing-wall", Some(failed_with("billing"))),
        (
            "upstream-quota-wall",
            Some(failed_with("upstream_rate_limit")),
        ),
        ("interrupt", Some(interrupted())),
        ("terminal-settlement", Some(settled())),
        ("unfinished-nonfailed", Some(partial())),
        ("completed-false", Some(completed_false())),
        ("failed, overloaded", Some(failed_with("overloaded"))),
        ("failed, server_error", Some(failed_with("server_error"))),
        (
            "failed, model_not_found",
            Some(failed(false, "model_not_found", "no such model")),
        ),
        ("failed, unknown", Some(failed(true, "unknown", "???"))),
        (
            "failed, unnamed reason",
            Some(failed(true, "brand_new_reason", "???")),
        ),
    ]
}
