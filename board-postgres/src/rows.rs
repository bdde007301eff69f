//! Rows: reading them into core's types, and applying core's transitions.

use kanban_core::lease::{LeaseView, RunLease, TaskLease, evaluate_lease};
use kanban_core::rules::{CardState, NewEvent, Transition};
use kanban_core::walls::{Wall, WallChange, WallKind};
use kanban_core::{
    BoardError, CardStatus, Claim, EventRecord, ProofIdentity, RunRecord, TaskRecord, TaskStatus,
};
use serde_json::Value;
use tokio_postgres::Row;

use crate::conn::{Conn, Param, TxError, col};

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

type PgResult<T> = Result<T, tokio_postgres::Error>;

/// A count stored as `BIGINT`, read back into core's `u32`.
fn count(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// A status a rule can read: a card of one this build does not know is
/// left as it is.
fn status_of(task_id: &str, raw: &str) -> Result<TaskStatus, TxError> {
    TaskStatus::parse(raw).ok_or_else(|| {
        BoardError::UnknownStatus {
            task_id: task_id.to_owned(),
            status: raw.to_owned(),
        }
        .into()
    })
}

pub(crate) fn task_from_row(row: &Row) -> Result<TaskRecord, TxError> {
    task_from_row_at(row, 0)
}

/// A card read from the columns [`TASK_COLUMNS`] names, from column `at` on.
pub(crate) fn task_from_row_at(row: &Row, at: usize) -> Result<TaskRecord, TxError> {
    let id: String = col(row, at)?;
    let status: String = col(row, at + 4)?;
    Ok(TaskRecord {
        status: CardStatus::parse(&status),
        title: col(row, at + 1)?,
        body: col(row, at + 2)?,
        assignee: col(row, at + 3)?,
        priority: col(row, at + 5)?,
        created_at: col(row, at + 6)?,
        claim_lock: col(row, at + 7)?,
        claim_expires: col(row, at + 8)?,
        current_run_id: col(row, at + 9)?,
        worker_pid: col(row, at + 10)?,
        goal_mode: col(row, at + 11)?,
        goal_max_turns: col::<Option<i64>>(row, 12)?.map(count),
        max_retries: col::<Option<i64>>(row, 13)?.map(count),
        consecutive_failures: count(col(row, at + 14)?),
        result: col(row, at + 15)?,
        not_before: col(row, at + 16)?,
        last_failure_error: col(row, at + 17)?,
        last_heartbeat_at: col(row, at + 18)?,
        max_runtime_seconds: col(row, at + 19)?,
        held_reason: col(row, at + 20)?,
        every_seconds: col(row, at + 21)?,
        id,
    })
}

pub(crate) fn run_from_row(row: &Row) -> PgResult<RunRecord> {
    Ok(RunRecord {
        id: col(row, 0)?,
        task_id: col(row, 1)?,
        status: col(row, 2)?,
        claim_lock: col(row, 3)?,
        claim_expires: col(row, 4)?,
        worker_pid: col(row, 5)?,
        started_at: col(row, 6)?,
        ended_at: col(row, 7)?,
        outcome: col(row, 8)?,
        summary: col(row, 9)?,
        error: col(row, 10)?,
        worker_started_at: col(row, 11)?,
    })
}

pub(crate) fn event_from_row(row: &Row) -> PgResult<EventRecord> {
    Ok(EventRecord {
        id: col(row, 0)?,
        task_id: col(row, 1)?,
        run_id: col(row, 2)?,
        kind: col(row, 3)?,
        payload: col::<Option<Value>>(row, 4)?.unwrap_or(Value::Null),
        created_at: col(row, 5)?,
    })
}

pub(crate) async fn read_task(
    conn: &mut Conn,
    task_id: &str,
) -> Result<Option<TaskRecord>, TxError> {
    let sql = format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = $1");
    match conn.query_opt(&sql, &[&task_id]).await? {
        Some(row) => Ok(Some(task_from_row(&row)?)),
        None => Ok(None),
    }
}

/// How a card's state is read: for a change (its row locked for the rest
/// of the transaction: every change of a card is made by one writer at a
/// time, as SQLite's single writer makes them), or to look only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Read {
    ToChange,
    ToLook,
}

/// The rows of one card that core's rules read.
pub(crate) async fn card_state(
    conn: &mut Conn,
    task_id: &str,
    read: Read,
) -> Result<Option<CardState>, TxError> {
    let lock = match read {
        Read::ToChange => " FOR UPDATE OF t",
        Read::ToLook => "",
    };
    let sql = format!(
        "SELECT t.status, t.current_run_id, t.claim_lock, t.claim_expires, t.worker_pid,
                t.consecutive_failures, t.max_retries, EXISTS ({OPEN_PARENT}),
                t.held_reason IS NOT NULL
           FROM tasks t WHERE t.id = $1{lock}"
    );
    let Some(row) = conn.query_opt(&sql, &[&task_id]).await? else {
        return Ok(None);
    };
    Ok(Some(CardState {
        task_id: task_id.to_owned(),
        status: status_of(task_id, &col::<String>(&row, 0)?)?,
        current_run_id: col(&row, 1)?,
        claim_lock: col(&row, 2)?,
        claim_expires: col(&row, 3)?,
        worker_pid: col(&row, 4)?,
        consecutive_failures: count(col(&row, 5)?),
        max_retries: col::<Option<i64>>(&row, 6)?.map(count),
        open_parents: col(&row, 7)?,
        held: col(&row, 8)?,
    }))
}

/// The card's state (its row locked), or "not on this board".
pub(crate) async fn existing_card(conn: &mut Conn, task_id: &str) -> Result<CardState, TxError> {
    card_state(conn, task_id, Read::ToChange)
        .await?
        .ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()).into())
}

/// Appends an event; a null payload is stored as NULL.
pub(crate) async fn append_event(
    conn: &mut Conn,
    task_id: &str,
    event: &NewEvent,
    now: i64,
) -> PgResult<()> {
    let payload = (!event.payload.is_null()).then_some(&event.payload);
    conn.execute(
        "INSERT INTO task_events (task_id, run_id, kind, payload, created_at) VALUES ($1, $2, $3, $4, $5)",
        &[&task_id, &event.run_id, &event.kind, &payload, &now],
    )
    .await?;
    Ok(())
}

/// Applies one of core's transitions to a card, inside the caller's
/// transaction: close the open run, release the claim, set the columns,
/// append the events.
pub(crate) async fn apply(
    conn: &mut Conn,
    task_id: &str,
    transition: &Transition,
    now: i64,
) -> PgResult<()> {
    if let Some(close) = &transition.close_run {
        conn.execute(
            "UPDATE task_runs SET ended_at = $2, status = $3, outcome = $4, summary = $5, error = $6
              WHERE id = (SELECT current_run_id FROM tasks WHERE id = $1) AND ended_at IS NULL",
            &[
                &task_id,
                &now,
                &close.status,
                &close.outcome,
                &close.summary,
                &close.error,
            ],
        )
        .await?;
    }
    if transition.release_claim || transition.status.is_some() {
        // A card became ready, or a run ended: dispatchers may have work.
        crate::watch::notify(conn).await?;
    }
    if transition.release_claim {
        conn.execute(
            "UPDATE tasks SET current_run_id = NULL, claim_lock = NULL, claim_expires = NULL,
                              worker_pid = NULL, worker_started_at = NULL
              WHERE id = $1",
            &[&task_id],
        )
        .await?;
    }
    let status = transition.status.map(TaskStatus::as_str);
    let failures = transition.consecutive_failures.map(i64::from);
    let edit = transition.edit.as_ref();
    let max_retries: Option<Option<i64>> = edit
        .and_then(|edit| edit.max_retries)
        .map(|limit| limit.map(i64::from));
    let completed_at = transition.completion.as_ref().map(|c| c.completed_at);
    let mut sets: Vec<(&str, Param<'_>)> = Vec::new();
    let mut set = |column: &'static str, value| sets.push((column, value));
    if let Some(status) = &status {
        set("status", status);
    }
    if let Some(failures) = &failures {
        set("consecutive_failures", failures);
    }
    if let Some(error) = &transition.last_failure_error {
        set("last_failure_error", error);
    }
    if let Some(not_before) = &transition.not_before {
        set("not_before", not_before);
    }
    if let Some(held) = &transition.held {
        set("held_reason", held);
    }
    if let Some(edit) = edit {
        if let Some(title) = &edit.title {
            set("title", title);
        }
        if let Some(body) = &edit.body {
            set("body", body);
        }
        if let Some(priority) = &edit.priority {
            set("priority", priority);
        }
        if let Some(assignee) = &edit.assignee {
            set("assignee", assignee);
        }
        if let Some(max_retries) = &max_retries {
            set("max_retries", max_retries);
        }
        if let Some(max_runtime) = &edit.max_runtime_seconds {
            set("max_runtime_seconds", max_runtime);
        }
    }
    if let Some(completion) = &transition.completion {
        set("result", &completion.result);
    }
    if let Some(completed_at) = &completed_at {
        set("completed_at", completed_at);
    }
    if !sets.is_empty() {
        let assignments: Vec<String> = sets
            .iter()
            .enumerate()
            .map(|(index, (column, _))| format!("{column} = ${}", index + 2))
            .collect();
        let mut values: Vec<Param<'_>> = vec![&task_id];
        values.extend(sets.iter().map(|(_, value)| *value));
        let sql = format!("UPDATE tasks SET {} WHERE id = $1", assignments.join(", "));
        conn.execute(&sql, &values).await?;
    }
    for change in &transition.walls {
        apply_wall(conn, change).await?;
    }
    for event in &transition.events {
        append_event(conn, task_id, event, now).await?;
    }
    Ok(())
}

/// The fence of every worker write, checked on the card's locked row inside
/// the write's transaction. On failure the only change is a
/// `stale_write_rejected` event.
pub(crate) async fn fence(
    conn: &mut Conn,
    claim: &Claim,
    action: &str,
    now: i64,
) -> Result<(), TxError> {
    let view = lease_view(conn, &claim.task_id).await?;
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
        append_event(conn, &claim.task_id, &event, now).await?;
    }
    Err(TxError::CommitThen(BoardError::LeaseLost {
        task_id: claim.task_id.clone(),
        reason,
    }))
}

/// Reads the rows a write's fence needs, in the caller's transaction,
/// locking the card's row for the rest of it.
pub(crate) async fn lease_view(conn: &mut Conn, task_id: &str) -> PgResult<LeaseView> {
    let sql = "SELECT status, worker_pid, current_run_id, claim_lock, claim_expires FROM tasks WHERE id = $1 FOR UPDATE";
    let task = match conn.query_opt(sql, &[&task_id]).await? {
        None => None,
        Some(row) => Some(TaskLease {
            status: col(&row, 0)?,
            worker_pid: col(&row, 1)?,
            current_run_id: col(&row, 2)?,
            claim_lock: col(&row, 3)?,
            claim_expires: col(&row, 4)?,
        }),
    };
    let run = match task.as_ref().and_then(|task| task.current_run_id) {
        None => None,
        Some(run_id) => conn
            .query_opt(
                "SELECT ended_at, worker_pid, claim_expires FROM task_runs WHERE id = $1",
                &[&run_id],
            )
            .await?
            .map(|row| {
                Ok::<_, tokio_postgres::Error>(RunLease {
                    ended_at: col(&row, 0)?,
                    worker_pid: col(&row, 1)?,
                    claim_expires: col(&row, 2)?,
                })
            })
            .transpose()?,
    };
    // A write's fence proves any process's claim: no bound owner to read.
    let newest_bound = None;
    Ok(LeaseView {
        task,
        run,
        newest_bound,
    })
}

/// The columns of a wall, in [`wall_from_row`]'s order.
pub(crate) const WALL_COLUMNS: &str =
    "scope, kind, route, since, until, reason, source, hits, failed_probes, probe_run";

/// A wall row; a kind this build does not know reads as a credential wall
/// (the wider one: it holds more, never less).
pub(crate) fn wall_from_row(row: &Row) -> PgResult<Wall> {
    let kind: String = col(row, 1)?;
    Ok(Wall {
        scope: col(row, 0)?,
        kind: WallKind::parse(&kind).unwrap_or(WallKind::Credential),
        route: col(row, 2)?,
        since: col(row, 3)?,
        until: col(row, 4)?,
        reason: col(row, 5)?,
        source: col(row, 6)?,
        hits: count(col(row, 7)?),
        failed_probes: count(col(row, 8)?),
        probe_run: col(row, 9)?,
    })
}

async fn apply_wall(conn: &mut Conn, change: &WallChange) -> PgResult<()> {
    match change {
        WallChange::Arm(wall) => {
            let sql = format!(
                "INSERT INTO provider_walls ({WALL_COLUMNS})
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (scope) DO UPDATE SET kind = excluded.kind, route = excluded.route,
                    since = excluded.since, until = excluded.until, reason = excluded.reason,
                    source = excluded.source, hits = excluded.hits,
                    failed_probes = excluded.failed_probes, probe_run = excluded.probe_run"
            );
            conn.execute(
                &sql,
                &[
                    &wall.scope,
                    &wall.kind.as_str(),
                    &wall.route,
                    &wall.since,
                    &wall.until,
                    &wall.reason,
                    &wall.source,
                    &i64::from(wall.hits),
                    &i64::from(wall.failed_probes),
                    &wall.probe_run,
                ],
            )
            .await?;
        }
        WallChange::Lift { scope } => {
            conn.execute("DELETE FROM provider_walls WHERE scope = $1", &[scope])
                .await?;
        }
        WallChange::ProbeEnded { scope } => {
            conn.execute(
                "UPDATE provider_walls SET probe_run = NULL WHERE scope = $1",
                &[scope],
            )
            .await?;
        }
    }
    Ok(())
}
