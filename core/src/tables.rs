//! The authority and exit tables, rendered from the code itself.
//!
//! `docs/policy.md` carries the same text, and a test keeps the two equal:
//! the documentation cannot drift from the behaviour.

use crate::exit::{CredentialFailure, turn_exit_code};
use crate::policy::{Authority, RecoveryPolicy};
use crate::shapes;

fn policy(task: Option<&str>, max_attempts: u32) -> RecoveryPolicy {
    RecoveryPolicy {
        task_id: task.map(str::to_owned),
        max_attempts,
        delays_seconds: crate::RECOVERY_DELAYS_SECONDS.to_vec(),
    }
}

fn cell(authority: Authority) -> String {
    match authority {
        Authority::Granted => "**retry**".to_owned(),
        Authority::Refused(refusal) => format!("no: {}", refusal.as_str()),
    }
}

/// The retry-authority table: each shape against each worker situation.
pub fn authority_table() -> String {
    let columns: [(&str, RecoveryPolicy, u32); 4] = [
        ("worker, 0 of 3 used", policy(Some("t_probe"), 3), 0),
        ("worker, 3 of 3 used", policy(Some("t_probe"), 3), 3),
        ("worker, budget 0", policy(Some("t_probe"), 0), 0),
        ("not a worker", policy(None, 3), 0),
    ];
    let mut out = String::from("| turn result |");
    for (name, _, _) in &columns {
        out.push_str(&format!(" {name} |"));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(columns.len()));
    out.push('\n');
    for (id, result) in shapes::all() {
        out.push_str(&format!("| {id} |"));
        for (_, policy, used) in &columns {
            out.push_str(&format!(
                " {} |",
                cell(policy.authority(result.as_ref(), *used))
            ));
        }
        out.push('\n');
    }
    out
}

/// The exit-code table: each shape for a non-worker and for a worker, plus
/// the credential failures of a turn that settled nothing.
pub fn exit_table() -> String {
    let mut out = String::from("| turn result | not a worker | kanban worker |\n|---|---|---|\n");
    let none = CredentialFailure::default();
    for (id, result) in shapes::all() {
        let plain = turn_exit_code(result.as_ref(), false, none);
        let worker = turn_exit_code(result.as_ref(), true, none);
        out.push_str(&format!("| {id} | {plain} | {worker} |\n"));
    }
    for (id, credentials) in [
        (
            "nothing settled, credential rate-limited",
            CredentialFailure {
                rate_limited: true,
                terminal: false,
            },
        ),
        (
            "nothing settled, credential needs re-login",
            CredentialFailure {
                rate_limited: false,
                terminal: true,
            },
        ),
    ] {
        let plain = turn_exit_code(None, false, credentials);
        let worker = turn_exit_code(None, true, credentials);
        out.push_str(&format!("| {id} | {plain} | {worker} |\n"));
    }
    out
}

/// The provider-failure classifier: each transport outcome, its reason and
/// whether a retry may help.
#[expect(
    clippy::too_many_lines,
    reason = "a data table: one row per transport outcome"
)]
pub fn classifier_table() -> String {
    use crate::classify::{ProviderOutcome, TransportFailure, classify_provider_failure};
    let rows: Vec<(&str, ProviderOutcome<'static>)> = vec![
        (
            "HTTP 429",
            ProviderOutcome::Status {
                status: 429,
                body: "rate limit reached",
            },
        ),
        (
            "HTTP 429, quota or credits exhausted",
            ProviderOutcome::Status {
                status: 429,
                body: "insufficient_quota",
            },
        ),
        (
            "HTTP 402",
            ProviderOutcome::Status {
                status: 402,
                body: "",
            },
        ),
        (
            "HTTP 401",
            ProviderOutcome::Status {
                status: 401,
                body: "",
            },
        ),
        (
            "HTTP 429 whose message links a billing page",
            ProviderOutcome::Status {
                status: 429,
                body: "Rate limit reached; see your billing page for limits",
            },
        ),
        (
            "HTTP 403",
            ProviderOutcome::Status {
                status: 403,
                body: "",
            },
        ),
        (
            "HTTP 403 naming billing",
            ProviderOutcome::Status {
                status: 403,
                body: "billing is not active for this account",
            },
        ),
        (
            "HTTP 400, unknown model (LiteLLM's proxy)",
            ProviderOutcome::Status {
                status: 400,
                body: "Invalid model name passed in model=gpt-9",
            },
        ),
        (
            "HTTP 404 naming the model",
            ProviderOutcome::Status {
                status: 404,
                body: "model not found",
            },
        ),
        (
            "HTTP 404, other",
            ProviderOutcome::Status {
                status: 404,
                body: "no route",
            },
        ),
        (
            "HTTP 408",
            ProviderOutcome::Status {
                status: 408,
                body: "",
            },
        ),
        (
            "HTTP 413",
            ProviderOutcome::Status {
                status: 413,
                body: "",
            },
        ),
        (
            "HTTP 400, context length exceeded",
            ProviderOutcome::Status {
                status: 400,
                body: "context_length_exceeded",
            },
        ),
        (
            "HTTP 400, other",
            ProviderOutcome::Status {
                status: 400,
                body: "bad request",
            },
        ),
        (
            "HTTP 500",
            ProviderOutcome::Status {
                status: 500,
                body: "",
            },
        ),
        (
            "HTTP 502",
            ProviderOutcome::Status {
                status: 502,
                body: "",
            },
        ),
        (
            "HTTP 503",
            ProviderOutcome::Status {
                status: 503,
                body: "",
            },
        ),
        (
            "HTTP 529",
            ProviderOutcome::Status {
                status: 529,
                body: "",
            },
        ),
        (
            "HTTP 504",
            ProviderOutcome::Status {
                status: 504,
                body: "",
            },
        ),
        (
            "any status, overloaded body",
            ProviderOutcome::Status {
                status: 500,
                body: "Overloaded",
            },
        ),
        (
            "timeout",
            ProviderOutcome::Transport(&TransportFailure::Timeout),
        ),
        (
            "connection reset",
            ProviderOutcome::Transport(&TransportFailure::ConnectionReset),
        ),
        (
            "host unreachable",
            ProviderOutcome::Transport(&TransportFailure::Unreachable),
        ),
        (
            "stream cut before its end",
            ProviderOutcome::Transport(&TransportFailure::StreamCut),
        ),
        (
            "TLS certificate not verified",
            ProviderOutcome::Transport(&TransportFailure::TlsCertificate),
        ),
        (
            "malformed answer body",
            ProviderOutcome::Transport(&TransportFailure::MalformedBody),
        ),
        (
            "other transport failure",
            ProviderOutcome::Transport(&TransportFailure::Other),
        ),
    ];
    let mut out = String::from(
        "| provider outcome | failure_reason | retryable | worker exit after recovery |\n|---|---|---|---|\n",
    );
    for (name, outcome) in rows {
        let classified = classify_provider_failure(outcome);
        // The exit after recovery is decided by the reason alone.
        let result = crate::TurnResult {
            failed: Some(true),
            failure_reason: Some(classified.reason.clone()),
            ..crate::TurnResult::default()
        };
        let exit = turn_exit_code(Some(&result), true, CredentialFailure::default());
        out.push_str(&format!(
            "| {name} | `{}` | {} | {exit} |\n",
            classified.reason,
            if classified.retryable { "yes" } else { "no" }
        ));
    }
    out
}
