//! Rows: reading them into core's types, and applying core's transitions.

use kanban_core::lease::evaluate_lease;
use kanban_core::rules::{CardState, NewEvent, Transition};
use kanban_core::walls::{Wall, WallChange, WallKind};
use kanban_core::{
    BoardError, CardStatus, Claim, EventRecord, ProofIdentity, RunRecord, TaskRecord, TaskStatus,
};
use rusqlite::types::ToSql;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};
use serde_json::Value;

use crate::open::TxError;
use crate::proof::lease_view;

pub(crate) const TASK_COLUMNS: &str = "id, title, body, assignee, status, priority, created_at, claim_lock, \
    claim_expires, current_run_id, worker_pid, goal_mode, goal_max_turns, max_retries, \
    consecutive_failures, result, not_before, last_failure_error, last_heartbeat_at, max_runtime_seconds, \
    held_reason, every_seconds";
pub(crate) const RUN_COLUMNS: &str = "id, task_id, status, claim_lock, claim_expires, worker_pid, \
    started_at, ended_at, outcome, summary, error, worker_started_at";
pub(crate) const EVENT_COLUMNS: &str = "id, task_id, run_id, kind, payload, created_at";

/// A parent that is neither done nor archived keeps its children waiting.
pub(crate) const OPEN_PARENT: &str = "SELECT 1 FROM task_links l JOIN tasks p ON p.id = l.parent_id \
    WHERE l.child_id = t.id AND p.status NOT IN ('done', 'archived')";

pub(crate) fn task_from_row(row: &Row<'_>) -> rusqlite::Result<TaskRecord> {
    task_from_row_at(row, 0)
}

/// A card read from the columns [`TASK_COLUMNS`] names, from column `at` on.
pub(crate) fn task_from_row_at(row: &Row<'_>, at: usize) -> rusqlite::Result<TaskRecord> {
    Ok(TaskRecord {
        id: row.get(at)?,
        title: row.get(at + 1)?,
        body: row.get(at + 2)?,
        assignee: row.get(at + 3)?,
        status: CardStatus::parse(&row.get::<_, String>(at + 4)?),
        priority: row.get::<_, Option<i64>>(at + 5)?.unwrap_or(0),
        created_at: row.get(at + 6)?,
        claim_lock: row.get(at + 7)?,
        claim_expires: row.get(at + 8)?,
        current_run_id: row.get(at + 9)?,
        worker_pid: row.get(at + 10)?,
        goal_mode: row.get::<_, i64>(at + 11)? != 0,
        goal_max_turns: row.get(at + 12)?,
        max_retries: row.get(at + 13)?,
        consecutive_failures: row.get(at + 14)?,
        result: row.get(at + 15)?,
        not_before: row.get(at + 16)?,
        last_failure_error: row.get(at + 17)?,
        last_heartbeat_at: row.get(at + 18)?,
        max_runtime_seconds: row.get(at + 19)?,
        held_reason: row.get(at + 20)?,
        every_seconds: row.get(at + 21)?,
    })
}

pub(crate) fn run_from_row(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: row.get(0)?,
        task_id: row.get(1)?,
        status: row.get(2)?,
        claim_lock: row.get(3)?,
        claim_expires: row.get(4)?,
        worker_pid: row.get(5)?,
        started_at: row.get(6)?,
        ended_at: row.get(7)?,
        outcome: row.get(8)?,
        summary: row.get(9)?,
        error: row.get(10)?,
        worker_started_at: row.get(11)?,
    })
}

pub(crate) fn event_from_row(row: &Row<'_>) -> rusqlite::Result<EventRecord> {
    let payload: Option<String> = row.get(4)?;
    Ok(EventRecord {
        id: row.get(0)?,
        task_id: row.get(1)?,
        run_id: row.get(2)?,
        kind: row.get(3)?,
        payload: payload
            .and_then(|p| serde_json::from_str(&p).ok())
            .unwrap_or(Value::Null),
        created_at: row.get(5)?,
    })
}

pub(crate) fn read_task(conn: &Connection, task_id: &str) -> rusqlite::Result<Option<TaskRecord>> {
    conn.prepare_cached(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"))?
        .query_row(params![task_id], task_from_row)
        .optional()
}

/// The rows of one card that core's rules read. A card of a status this
/// build does not know is left as it is: no rule reads it.
pub(crate) fn card_state(conn: &Connection, task_id: &str) -> Result<Option<CardState>, TxError> {
    let row = conn
        .prepare_cached(&format!(
            "SELECT t.status, t.current_run_id, t.claim_lock, t.claim_expires, t.worker_pid,
                    t.consecutive_failures, t.max_retries, EXISTS ({OPEN_PARENT}),
                    t.held_reason IS NOT NULL
               FROM tasks t WHERE t.id = ?1"
        ))?
        .query_row(params![task_id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                CardState {
                    task_id: task_id.to_owned(),
                    status: TaskStatus::Todo,
                    current_run_id: row.get(1)?,
                    claim_lock: row.get(2)?,
                    claim_expires: row.get(3)?,
                    worker_pid: row.get(4)?,
                    consecutive_failures: row.get(5)?,
                    max_retries: row.get(6)?,
                    open_parents: row.get(7)?,
                    held: row.get(8)?,
                },
            ))
        })
        .optional()?;
    let Some((status, card)) = row else {
        return Ok(None);
    };
    let Some(status) = TaskStatus::parse(&status) else {
        return Err(BoardError::UnknownStatus {
            task_id: task_id.to_owned(),
            status,
        }
        .into());
    };
    Ok(Some(CardState { status, ..card }))
}

/// The card's state, or "not on this board".
pub(crate) fn existing_card(conn: &Connection, task_id: &str) -> Result<CardState, TxError> {
    card_state(conn, task_id)?.ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()).into())
}

/// Appends an event; a null payload is stored as NULL.
pub(crate) fn append_event(
    conn: &Connection,
    task_id: &str,
    event: &NewEvent,
    now: i64,
) -> rusqlite::Result<()> {
    let payload = (!event.payload.is_null()).then(|| event.payload.to_string());
    conn.prepare_cached(
        "INSERT INTO task_events (task_id, run_id, kind, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![task_id, event.run_id, event.kind, payload, now])?;
    Ok(())
}

/// Applies one of core's transitions to a card, inside the caller's
/// transaction: close the open run, release the claim, set the columns,
/// append the events.
pub(crate) fn apply(
    conn: &Connection,
    task_id: &str,
    transition: &Transition,
    now: i64,
) -> rusqlite::Result<()> {
    if let Some(close) = &transition.close_run {
        conn.prepare_cached(
            "UPDATE task_runs SET ended_at = ?2, status = ?3, outcome = ?4, summary = ?5, error = ?6
              WHERE id = (SELECT current_run_id FROM tasks WHERE id = ?1) AND ended_at IS NULL",
        )?
        .execute(params![
            task_id,
            now,
            close.status,
            close.outcome,
            close.summary,
            close.error
        ])?;
    }
    if transition.release_claim {
        conn.prepare_cached(
            "UPDATE tasks SET current_run_id = NULL, claim_lock = NULL, claim_expires = NULL,
                              worker_pid = NULL, worker_started_at = NULL
              WHERE id = ?1",
        )?
        .execute(params![task_id])?;
    }
    let mut columns: Vec<&str> = Vec::new();
    let mut values: Vec<Box<dyn ToSql>> = vec![Box::new(task_id.to_owned())];
    let mut set = |column: &'static str, value: Box<dyn ToSql>| {
        columns.push(column);
        values.push(value);
    };
    if let Some(status) = transition.status {
        set("status", Box::new(status.as_str()));
    }
    if let Some(failures) = transition.consecutive_failures {
        set("consecutive_failures", Box::new(failures));
    }
    if let Some(error) = &transition.last_failure_error {
        set("last_failure_error", Box::new(error.clone()));
    }
    if let Some(not_before) = transition.not_before {
        set("not_before", Box::new(not_before));
    }
    if let Some(held) = &transition.held {
        set("held_reason", Box::new(held.clone()));
    }
    if let Some(edit) = &transition.edit {
        if let Some(title) = &edit.title {
            set("title", Box::new(title.clone()));
        }
        if let Some(body) = &edit.body {
            set("body", Box::new(body.clone()));
        }
        if let Some(priority) = edit.priority {
            set("priority", Box::new(priority));
        }
        if let Some(assignee) = &edit.assignee {
            set("assignee", Box::new(assignee.clone()));
        }
        if let Some(max_retries) = edit.max_retries {
            set("max_retries", Box::new(max_retries));
        }
        if let Some(max_runtime) = edit.max_runtime_seconds {
            set("max_runtime_seconds", Box::new(max_runtime));
        }
    }
    if let Some(completion) = &transition.completion {
        set("result", Box::new(completion.result.clone()));
        set("completed_at", Box::new(completion.completed_at));
    }
    if !columns.is_empty() {
        let assignments: Vec<String> = columns
            .iter()
            .enumerate()
            .map(|(index, column)| format!("{column} = ?{}", index + 2))
            .collect();
        let sql = format!("UPDATE tasks SET {} WHERE id = ?1", assignments.join(", "));
        conn.prepare_cached(&sql)?
            .execute(rusqlite::params_from_iter(values.iter()))?;
    }
    for change in &transition.walls {
        apply_wall(conn, change)?;
    }
    for event in &transition.events {
        append_event(conn, task_id, event, now)?;
    }
    Ok(())
}

/// The fence of every worker write, checked inside the write's transaction.
/// On failure the only change is a `stale_write_rejected` event.
pub(crate) fn fence(
    tx: &Transaction<'_>,
    claim: &Claim,
    action: &str,
    now: i64,
) -> Result<(), TxError> {
    let view = lease_view(tx, &claim.task_id, ProofIdentity::AnyProcess)?;
    let verdict = evaluate_lease(
        &view,
        &claim.run_id.to_string(),
        &claim.claim_lock,
        ProofIdentity::AnyProcess,
        now,
    );
    let Err(reason) = verdict else { return Ok(()) };
    if view.task.is_some() {
        let event = kanban_core::events::stale_write_rejected(claim, action, &reason);
        append_event(tx, &claim.task_id, &event, now)?;
    }
    Err(TxError::CommitThen(BoardError::LeaseLost {
        task_id: claim.task_id.clone(),
        reason,
    }))
}

/// The columns of a wall, in [`wall_from_row`]'s order.
pub(crate) const WALL_COLUMNS: &str =
    "scope, kind, route, since, until, reason, source, hits, failed_probes, probe_run";

/// A wall row; a kind this build does not know reads as a credential wall
/// (the wider one: it holds more, never less).
pub(crate) fn wall_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Wall> {
    let kind: String = row.get(1)?;
    Ok(Wall {
        scope: row.get(0)?,
        kind: WallKind::parse(&kind).unwrap_or(WallKind::Credential),
        route: row.get(2)?,
        since: row.get(3)?,
        until: row.get(4)?,
        reason: row.get(5)?,
        source: row.get(6)?,
        hits: row.get(7)?,
        failed_probes: row.get(8)?,
        probe_run: row.get(9)?,
    })
}

fn apply_wall(conn: &Connection, change: &WallChange) -> rusqlite::Result<()> {
    match change {
        WallChange::Arm(wall) => {
            conn.prepare_cached(&format!(
                "INSERT OR REPLACE INTO provider_walls ({WALL_COLUMNS})
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
            ))?
            .execute(params![
                wall.scope,
                wall.kind.as_str(),
                wall.route,
                wall.since,
                wall.until,
                wall.reason,
                wall.source,
                wall.hits,
                wall.failed_probes,
                wall.probe_run
            ])?;
        }
        WallChange::Lift { scope } => {
            conn.prepare_cached("DELETE FROM provider_walls WHERE scope = ?1")?
                .execute(params![scope])?;
        }
        WallChange::ProbeEnded { scope } => {
            conn.prepare_cached("UPDATE provider_walls SET probe_run = NULL WHERE scope = ?1")?
                .execute(params![scope])?;
        }
    }
    Ok(())
}
