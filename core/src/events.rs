//! The events a board appends beside its rows, one shape each: every board
//! writes the same kind with the same payload, because readers (`show`,
//! the web board, metrics, the seed system) read them by these names.
//! The events of a booking or a transition are [`crate::rules`]'; these are
//! the records around them.

use serde_json::json;

use crate::board::{MAX_COMMENT_BYTES, MAX_METADATA_BYTES, NewTask};
use crate::booking::SignalReason;
use crate::data::{BoardError, Claim, NewEvent, NotLive};

use crate::dispatcher::WorkerProcess;

/// A worker bound itself to its claim.
pub fn worker_bound(claim: &Claim, pid: u32) -> NewEvent {
    NewEvent::new(
        "worker_bound",
        Some(claim.run_id),
        json!({"pid": pid, "claim_lock": claim.claim_lock}),
    )
}

/// A worker renewed its lease until `expires`.
pub fn heartbeat(claim: &Claim, note: Option<&str>, expires: i64) -> NewEvent {
    NewEvent::new(
        "heartbeat",
        Some(claim.run_id),
        json!({"note": note, "claim_expires": expires}),
    )
}

/// A comment, from a run's agent (`run`) or from a person (none).
pub fn commented(run: Option<i64>, author: &str) -> NewEvent {
    NewEvent::new("commented", run, json!({"author": author}))
}

/// A file attached to a card, by a run (`run`) or by a person (none): the
/// seed system's event, with its payload.
pub fn attached(run: Option<i64>, new: &crate::attachments::NewAttachment) -> NewEvent {
    NewEvent::new(
        "attached",
        run,
        json!({"filename": new.filename, "size": new.size, "by": new.uploaded_by}),
    )
}

/// A write refused because its writer no longer holds the claim.
pub fn stale_write_rejected(claim: &Claim, action: &str, reason: &NotLive) -> NewEvent {
    NewEvent::new(
        "stale_write_rejected",
        Some(claim.run_id),
        json!({"action": action, "run_id": claim.run_id, "claim_lock": claim.claim_lock, "reason": reason.code()}),
    )
}

/// A dispatcher spawned the claim's worker.
pub fn spawned(claim: &Claim, process: &WorkerProcess) -> NewEvent {
    NewEvent::new(
        "spawned",
        Some(claim.run_id),
        json!({"pid": process.pid, "started_at": process.started_at}),
    )
}

/// A dispatcher signalled the claim's worker, and why.
pub fn worker_signalled(claim: &Claim, signal: i32, reason: SignalReason) -> NewEvent {
    NewEvent::new(
        "worker_signalled",
        Some(claim.run_id),
        json!({"signal": signal, "reason": reason.as_str()}),
    )
}

/// A dispatcher extended the claim's lease (`kind` says how), and why.
pub fn lease_record(claim: &Claim, kind: &str, reason: &str, expires: i64) -> NewEvent {
    NewEvent::new(
        kind,
        Some(claim.run_id),
        json!({"reason": reason, "claim_expires": expires}),
    )
}

/// The claim's run goes through walls of these scopes as their probe.
pub fn wall_probe(claim: &Claim, scopes: &[String]) -> NewEvent {
    NewEvent::new("wall_probe", Some(claim.run_id), json!({"scopes": scopes}))
}

/// An operator lifted the wall of `scope`, which run `run` met last.
pub fn wall_lifted_by_operator(scope: &str, run: Option<i64>) -> NewEvent {
    NewEvent::new(
        "wall_lifted",
        run,
        json!({"scope": scope, "by": "operator"}),
    )
}

/// A new card waits for a time, or recurs.
pub fn scheduled(new: &NewTask) -> Option<NewEvent> {
    (new.not_before.is_some() || new.every_seconds.is_some()).then(|| {
        NewEvent::new(
            "scheduled",
            None,
            json!({"not_before": new.not_before, "every_seconds": new.every_seconds}),
        )
    })
}

/// A recurring card made its next occurrence, due at `due`.
pub fn recurred(next: &str, due: i64) -> NewEvent {
    NewEvent::new("recurred", None, json!({"next": next, "due": due}))
}

/// What a board refuses to create, before it opens a transaction.
pub fn check_new_task(new: &NewTask) -> Result<(), BoardError> {
    if new.title.trim().is_empty() {
        return Err(BoardError::InvalidInput(
            "a task needs a non-blank title".to_owned(),
        ));
    }
    if new.every_seconds.is_some_and(|every| every < 1) {
        return Err(BoardError::InvalidInput(
            "a recurring card's period (--every) is at least one second".to_owned(),
        ));
    }
    for (what, name) in [
        ("tenant", &new.tenant),
        ("maker (created_by)", &new.created_by),
    ] {
        if let Some(name) = name
            && let Err(problem) = check_label(name)
        {
            return Err(BoardError::InvalidInput(format!(
                "a card's {what} {problem}"
            )));
        }
    }
    let workspace = new.workspace.clone().unwrap_or_default();
    crate::workspaces::check_workspace(&workspace, new.branch.as_deref())
        .map_err(|problem| BoardError::InvalidInput(problem.to_string()))
}

/// The longest name a card keeps for its tenant or its maker.
pub const MAX_LABEL_CHARS: usize = 200;

/// A tenant or maker name: not blank, one line of at most
/// [`MAX_LABEL_CHARS`] printable characters, no space around it.
pub fn check_label(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("is blank: give a name".to_owned());
    }
    if name.trim() != name || name.chars().any(char::is_control) {
        return Err(format!(
            "{name:?} has spaces around it or a control character: give a plain name"
        ));
    }
    if name.chars().count() > MAX_LABEL_CHARS {
        return Err(format!("is longer than {MAX_LABEL_CHARS} characters"));
    }
    Ok(())
}

/// What a board refuses of a worker's handoff, before it opens a
/// transaction: metadata past [`MAX_METADATA_BYTES`].
pub fn check_handoff(handoff: &crate::Handoff) -> Result<(), BoardError> {
    check_metadata(handoff.metadata.as_ref())
}

/// What a board refuses of run metadata: more than [`MAX_METADATA_BYTES`]
/// of JSON.
pub fn check_metadata(
    metadata: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(), BoardError> {
    if let Some(metadata) = metadata {
        let size = serde_json::to_string(metadata).map_or(usize::MAX, |text| text.len());
        if size > MAX_METADATA_BYTES {
            return Err(BoardError::InvalidInput(format!(
                "run metadata is at most {MAX_METADATA_BYTES} bytes of JSON ({size} given); put long facts in a file and name its path"
            )));
        }
    }
    Ok(())
}

/// A person's comment as a board stores it (trimmed), or why it is refused.
pub fn check_comment(text: &str) -> Result<&str, BoardError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(BoardError::InvalidInput(
            "a comment needs some text".to_owned(),
        ));
    }
    if text.len() > MAX_COMMENT_BYTES {
        return Err(BoardError::InvalidInput(format!(
            "a comment is at most {MAX_COMMENT_BYTES} bytes ({} given); put long text in a file and comment its path",
            text.len()
        )));
    }
    Ok(text)
}
