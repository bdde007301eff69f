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
