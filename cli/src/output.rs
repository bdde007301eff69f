//! Human tables and the stable JSON shapes.

use kanban_core::{EventRecord, RunRecord, TaskRecord};
use serde_json::{Value, json};

/// A task as `--json` prints it.
pub(crate) fn task_json(task: &TaskRecord) -> Value {
    json!({
        "id": task.id,
        "title": task.title,
        "body": task.body,
        "assignee": task.assignee,
        "status": task.status.as_str(),
        "priority": task.priority,
        "created_at": task.created_at,
        "claim_lock": task.claim_lock,
        "claim_expires": task.claim_expires,
        "current_run_id": task.current_run_id,
        "worker_pid": task.worker_pid,
        "goal_mode": task.goal_mode,
        "goal_max_turns": task.goal_max_turns,
        "max_retries": task.max_retries,
        "consecutive_failures": task.consecutive_failures,
        "last_failure_error": task.last_failure_error,
        "not_before": task.not_before,
        "last_heartbeat_at": task.last_heartbeat_at,
        "max_runtime_seconds": task.max_runtime_seconds,
        "result": task.result,
    })
}

/// A run as `--json` prints it.
pub(crate) fn run_json(run: &RunRecord) -> Value {
    json!({
        "id": run.id,
        "status": run.status,
        "claim_lock": run.claim_lock,
        "claim_expires": run.claim_expires,
        "worker_pid": run.worker_pid,
        "started_at": run.started_at,
        "ended_at": run.ended_at,
        "outcome": run.outcome,
        "summary": run.summary,
        "error": run.error,
    })
}

/// An event as `--json` prints it.
pub(crate) fn event_json(event: &EventRecord) -> Value {
    json!({
        "id": event.id,
        "task_id": event.task_id,
        "run_id": event.run_id,
        "kind": event.kind,
        "payload": event.payload,
        "created_at": event.created_at,
    })
}

/// Renders rows as a plain, left-aligned table with a header.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (index, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if index + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

/// Shortens text to one line of at most `limit` characters.
pub(crate) fn short(text: &str, limit: usize) -> String {
    let flat = text.replace('\n', " ");
    if flat.chars().count() <= limit {
        return flat;
    }
    let mut out: String = flat.chars().take(limit.saturating_sub(1)).collect();
    out.push('…');
    out
}
