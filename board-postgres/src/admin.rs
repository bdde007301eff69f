//! The operator's side of the board: cards, claims by hand, the lifecycle,
//! and reading it all back.

use async_trait::async_trait;
use kanban_core::events;
use kanban_core::rules::{self};
use kanban_core::{
    BoardAdmin, BoardError, COMMENTS_SHOWN, Claim, ClaimGrant, CommentRecord, DispatchBoard,
    EventRecord, NewTask, TaskPage, TaskRecord, TaskStatus, TaskView,
};

use crate::conn::{Conn, TxError, col};
use crate::dispatch::claim_in;
use crate::rows::{
    EVENT_COLUMNS, RUN_COLUMNS, Read, TASK_COLUMNS, append_event, apply, card_state,
    event_from_row, existing_card, read_task, run_from_row, task_from_row, task_from_row_at,
};
use crate::{PgBoard, snapshot, transaction};

impl PgBoard {
    /// Applies one of core's operator rules to a card, in one transaction.
    async fn operate(
        &self,
        task_id: &str,
        rule: impl Fn(&rules::CardState) -> Result<rules::Transition, BoardError> + Send + Sync,
    ) -> Result<(), BoardError> {
        transaction!(self, |tx, now| {
            let card = existing_card(tx, task_id).await?;
            let transition = rule(&card)?;
            apply(tx, task_id, &transition, now).await?;
            Ok(())
        })
    }

    /// Test and operator hook: sets both lease expiries of a card's current run.
    pub async fn set_lease_expiry(&self, task_id: &str, expires: i64) -> Result<(), BoardError> {
        transaction!(self, |tx, _now| {
            tx.execute(
                "UPDATE tasks SET claim_expires = $2 WHERE id = $1",
                &[&task_id, &expires],
            )
            .await?;
            tx.execute(
                "UPDATE task_runs SET claim_expires = $2 WHERE id = (SELECT current_run_id FROM tasks WHERE id = $1)",
                &[&task_id, &expires],
            )
            .await?;
            Ok(())
        })
    }
}

#[async_trait]
impl BoardAdmin for PgBoard {
    async fn create_task(&self, new: &NewTask) -> Result<String, BoardError> {
        events::check_new_task(new)?;
        transaction!(self, |tx, now| { insert_task(tx, new, now).await })
    }

    async fn claim_task(
        &self,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let db = self.url().to_owned();
        transaction!(self, |tx, now| {
            claim_in(tx, &db, task_id, ttl_seconds, claim_lock, now).await
        })
    }

    async fn unblock(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, rules::unblock).await
    }

    async fn cancel(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        self.operate(task_id, |card| rules::cancel(card, reason))
            .await
    }

    async fn archive(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, rules::archive).await
    }

    async fn hold(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        self.operate(task_id, |card| rules::hold(card, reason))
            .await
    }

    async fn release_hold(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, rules::release_hold).await
    }

    async fn edit(&self, task_id: &str, edit: &rules::CardEdit) -> Result<(), BoardError> {
        self.operate(task_id, |card| rules::edit(card, edit)).await
    }

    async fn prune(&self, before: i64, dry_run: bool) -> Result<Vec<String>, BoardError> {
        transaction!(self, |tx, _now| {
            let ids: Vec<String> = tx
                .query(
                    "SELECT t.id FROM tasks t
                      WHERE t.status IN ('done', 'archived')
                        AND COALESCE((SELECT MAX(e.created_at) FROM task_events e WHERE e.task_id = t.id),
                                     t.completed_at, t.created_at) < $1
                      ORDER BY t.created_at, t.seq",
                    &[&before],
                )
                .await?
                .iter()
                .map(|row| col(row, 0))
                .collect::<Result<_, _>>()?;
            if dry_run {
                return Ok(ids);
            }
            for id in &ids {
                // Run ids come from a sequence: a fencing token is never
                // handed out twice, pruned or not.
                for sql in [
                    "DELETE FROM task_events WHERE task_id = $1",
                    "DELETE FROM task_comments WHERE task_id = $1",
                    "DELETE FROM task_runs WHERE task_id = $1",
                    "DELETE FROM task_links WHERE child_id = $1 OR parent_id = $1",
                    "DELETE FROM tasks WHERE id = $1",
                ] {
                    tx.execute(sql, &[id]).await?;
                }
            }
            Ok(ids)
        })
    }

    async fn add_comment(&self, task_id: &str, author: &str, text: &str) -> Result<(), BoardError> {
        let text = events::check_comment(text)?;
        transaction!(self, |tx, now| {
            existing_card(tx, task_id).await?;
            tx.execute(
                "INSERT INTO task_comments (task_id, author, body, created_at) VALUES ($1, $2, $3, $4)",
                &[&task_id, &author, &text, &now],
            )
            .await?;
            let event = events::commented(None, author);
            append_event(tx, task_id, &event, now).await?;
            Ok(())
        })
    }

    async fn lift_wall(&self, scope: &str) -> Result<bool, BoardError> {
        transaction!(self, |tx, now| {
            let source: Option<String> = match tx
                .query_opt(
                    "DELETE FROM provider_walls WHERE scope = $1 RETURNING source",
                    &[&scope],
                )
                .await?
            {
                Some(row) => Some(col(&row, 0)?),
                None => None,
            };
            let Some(source) = source else {
                return Ok(false);
            };
            // `TASK#RUN`: the card that met the wall keeps its history.
            let (task_id, run) = source.split_once('#').unwrap_or((source.as_str(), ""));
            if let Some(card) = card_state(tx, task_id, Read::ToChange).await? {
                let transition = rules::lift_wall(&card, scope, run.parse::<i64>().ok());
                apply(tx, task_id, &transition, now).await?;
            }
            Ok(true)
        })
    }

    async fn reclaim(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        transaction!(self, |tx, now| {
            let card = existing_card(tx, task_id).await?;
            let transition = rules::reclaim(&card, reason, now)?;
            apply(tx, task_id, &transition, now).await?;
            Ok(())
        })
    }

    async fn show_task(&self, task_id: &str) -> Result<TaskView, BoardError> {
        let view: Option<TaskView> = snapshot!(self, |conn, _now| {
            let Some(task) = read_task(conn, task_id).await? else {
                return Ok(None);
            };
            let runs = conn
                .query(
                    &format!("SELECT {RUN_COLUMNS} FROM task_runs WHERE task_id = $1 ORDER BY id"),
                    &[&task_id],
                )
                .await?
                .iter()
                .map(run_from_row)
                .collect::<Result<_, _>>()?;
            let events = conn
                .query(
                    &format!(
                        "SELECT {EVENT_COLUMNS} FROM task_events WHERE task_id = $1 ORDER BY id"
                    ),
                    &[&task_id],
                )
                .await?
                .iter()
                .map(event_from_row)
                .collect::<Result<_, _>>()?;
            let parents = conn
                .query(
                    "SELECT parent_id FROM task_links WHERE child_id = $1 ORDER BY parent_id",
                    &[&task_id],
                )
                .await?
                .iter()
                .map(|row| col(row, 0))
                .collect::<Result<_, _>>()?;
            let shown = COMMENTS_SHOWN as i64;
            let mut comments: Vec<CommentRecord> = conn
                .query(
                    "SELECT id, author, body, created_at FROM task_comments
                      WHERE task_id = $1 ORDER BY id DESC LIMIT $2",
                    &[&task_id, &shown],
                )
                .await?
                .iter()
                .map(|row| {
                    Ok(CommentRecord {
                        id: col(row, 0)?,
                        author: col(row, 1)?,
                        body: col(row, 2)?,
                        created_at: col(row, 3)?,
                    })
                })
                .collect::<Result<_, tokio_postgres::Error>>()?;
            comments.reverse();
            Ok(Some(TaskView {
                task,
                parents,
                runs,
                events,
                comments,
            }))
        })?;
        view.ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()))
    }

    async fn list_tasks(&self, status: Option<TaskStatus>) -> Result<Vec<TaskRecord>, BoardError> {
        let status = status.map(TaskStatus::as_str);
        snapshot!(self, |conn, _now| {
            let sql = format!(
                "SELECT {TASK_COLUMNS} FROM tasks WHERE $1::text IS NULL OR status = $1::text
                  ORDER BY created_at, seq"
            );
            conn.query(&sql, &[&status])
                .await?
                .iter()
                .map(task_from_row)
                .collect::<Result<Vec<_>, TxError>>()
        })
    }

    async fn list_page(
        &self,
        status: Option<TaskStatus>,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TaskPage, BoardError> {
        let status = status.map(TaskStatus::as_str);
        let after = after.unwrap_or(0);
        let rows = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let rows: Vec<(i64, TaskRecord)> = snapshot!(self, |conn, _now| {
            let sql = format!(
                "SELECT seq, {TASK_COLUMNS} FROM tasks
                  WHERE seq > $2 AND ($1::text IS NULL OR status = $1::text)
                  ORDER BY seq LIMIT $3"
            );
            conn.query(&sql, &[&status, &after, &rows])
                .await?
                .iter()
                .map(|row| Ok((col::<i64>(row, 0)?, task_from_row_at(row, 1)?)))
                .collect::<Result<Vec<_>, TxError>>()
        })?;
        Ok(TaskPage::from_rows(rows, limit))
    }

    async fn recent_events(&self, limit: usize) -> Result<Vec<EventRecord>, BoardError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut events: Vec<EventRecord> = snapshot!(self, |conn, _now| {
            let sql = format!("SELECT {EVENT_COLUMNS} FROM task_events ORDER BY id DESC LIMIT $1");
            conn.query(&sql, &[&limit])
                .await?
                .iter()
                .map(event_from_row)
                .collect::<Result<Vec<_>, _>>()
                .map_err(TxError::from)
        })?;
        events.reverse();
        Ok(events)
    }

    async fn booked_exit_code(&self, claim: &Claim) -> Result<i32, BoardError> {
        Ok(self
            .booked_result(claim)
            .await?
            .map_or(1, |result| result.exit_code))
    }
}

/// A fresh card id: `t_` and eight hex digits, as the SQLite board writes.
fn new_task_id() -> Result<String, BoardError> {
    let mut bytes = [0_u8; 4];
    getrandom::fill(&mut bytes)
        .map_err(|error| BoardError::Storage(format!("no randomness for a card id: {error}")))?;
    Ok(format!(
        "t_{}",
        bytes
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect::<String>()
    ))
}

/// Creates a card inside the caller's transaction; returns its id (or the
/// existing card's for a repeated idempotency key).
pub(crate) async fn insert_task(tx: &mut Conn, new: &NewTask, now: i64) -> Result<String, TxError> {
    if let Some(key) = &new.idempotency_key {
        // Two creates with one key (an agent's retry racing its first try,
        // two hosts) take turns here, so the second finds the first's card.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[key],
        )
        .await?;
        let existing = tx
            .query_opt(
                "SELECT id FROM tasks WHERE idempotency_key = $1 AND status != 'archived'
                  ORDER BY created_at DESC, seq DESC LIMIT 1",
                &[key],
            )
            .await?;
        if let Some(row) = existing {
            return Ok(col(&row, 0)?);
        }
    }
    let mut open_parents = false;
    for parent in &new.parents {
        let status: Option<String> = match tx
            .query_opt("SELECT status FROM tasks WHERE id = $1", &[parent])
            .await?
        {
            Some(row) => Some(col(&row, 0)?),
            None => None,
        };
        match status.as_deref().map(TaskStatus::parse) {
            None => return Err(BoardError::TaskNotFound(parent.clone()).into()),
            Some(status) => {
                open_parents |= !matches!(status, Some(TaskStatus::Done | TaskStatus::Archived));
            }
        }
    }
    let status = rules::initial_status(new.start_blocked, open_parents);
    let id = loop {
        let candidate = new_task_id()?;
        let taken: bool = tx
            .value(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)",
                &[&candidate],
            )
            .await?;
        if !taken {
            break candidate;
        }
    };
    let max_retries = new.max_retries.map(i64::from);
    let goal_max_turns = new.goal_max_turns.map(i64::from);
    let scheduled_at = new.every_seconds.map(|_| new.not_before.unwrap_or(now));
    tx.execute(
        "INSERT INTO tasks (id, title, body, assignee, status, priority, created_at, idempotency_key,
                            max_retries, goal_mode, goal_max_turns, max_runtime_seconds,
                            not_before, every_seconds, scheduled_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        &[
            &id,
            &new.title,
            &new.body,
            &new.assignee,
            &status.as_str(),
            &new.priority,
            &now,
            &new.idempotency_key,
            &max_retries,
            &new.goal_mode,
            &goal_max_turns,
            &new.max_runtime_seconds,
            &new.not_before,
            &new.every_seconds,
            &scheduled_at,
        ],
    )
    .await?;
    for parent in &new.parents {
        tx.execute(
            "INSERT INTO task_links (parent_id, child_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[parent, &id],
        )
        .await?;
    }
    crate::watch::notify(tx).await?;
    for event in rules::creation_events(status, &new.parents, new.assignee.as_deref()) {
        append_event(tx, &id, &event, now).await?;
    }
    if let Some(event) = events::scheduled(new) {
        append_event(tx, &id, &event, now).await?;
    }
    Ok(id)
}

/// The next occurrence of a recurring card that just completed, created in
/// the same transaction ([`rules::next_occurrence`]).
pub(crate) async fn recur(tx: &mut Conn, task_id: &str, now: i64) -> Result<(), TxError> {
    let row = tx
        .query_opt(
            "SELECT title, body, assignee, priority, max_retries, goal_mode, goal_max_turns,
                    max_runtime_seconds, every_seconds, COALESCE(scheduled_at, created_at)
               FROM tasks WHERE id = $1 AND every_seconds IS NOT NULL",
            &[&task_id],
        )
        .await?;
    let Some(row) = row else {
        return Ok(());
    };
    let count = |value: Option<i64>| value.map(|v| u32::try_from(v.max(0)).unwrap_or(u32::MAX));
    let mut next = NewTask {
        title: col(&row, 0)?,
        body: col(&row, 1)?,
        assignee: col(&row, 2)?,
        priority: col(&row, 3)?,
        max_retries: count(col(&row, 4)?),
        goal_mode: col(&row, 5)?,
        goal_max_turns: count(col(&row, 6)?),
        max_runtime_seconds: col(&row, 7)?,
        every_seconds: col(&row, 8)?,
        ..NewTask::default()
    };
    let scheduled_at: i64 = col(&row, 9)?;
    let every = next.every_seconds.unwrap_or(1);
    let due = rules::next_occurrence(scheduled_at, every, now);
    next.not_before = Some(due);
    let id = Box::pin(insert_task(tx, &next, now)).await?;
    let event = events::recurred(&id, due);
    append_event(tx, task_id, &event, now).await?;
    Ok(())
}

impl PgBoard {
    /// The board's counts for metrics, read in one snapshot.
    pub async fn stats(&self) -> Result<kanban_core::BoardStats, BoardError> {
        // The bookings' event kinds are core's (a settled exit is
        // `worker_exited`); the board only counts them.
        let kinds: Vec<String> = kanban_core::BookingKind::ALL
            .iter()
            .map(|kind| match kind {
                kanban_core::BookingKind::Settled => "worker_exited".to_owned(),
                other => other.as_str().to_owned(),
            })
            .collect();
        snapshot!(self, |conn, now| {
            let pairs = |rows: Vec<tokio_postgres::Row>| -> Result<Vec<(String, i64)>, TxError> {
                rows.iter()
                    .map(|row| Ok((col(row, 0)?, col(row, 1)?)))
                    .collect()
            };
            let cards_by_status = pairs(
                conn.query(
                    "SELECT status, COUNT(*) FROM tasks GROUP BY status ORDER BY status",
                    &[],
                )
                .await?,
            )?;
            let runs_by_outcome = pairs(
                conn.query(
                    "SELECT COALESCE(outcome, 'running'), COUNT(*) FROM task_runs GROUP BY 1 ORDER BY 1",
                    &[],
                )
                .await?,
            )?;
            let exits_by_code = pairs(
                conn.query(
                    "SELECT COALESCE(payload->>'exit_code', 'none'), COUNT(*) FROM task_events
                      WHERE kind = ANY($1) GROUP BY 1 ORDER BY 1",
                    &[&kinds],
                )
                .await?,
            )?;
            // A value that is not a number counts for nothing, and never
            // fails the read.
            let recovery_attempts: Option<i64> = conn
                .value(
                    "SELECT (SUM((payload->>'recovery_attempts')::numeric)
                               FILTER (WHERE jsonb_typeof(payload->'recovery_attempts') = 'number'))::bigint
                       FROM task_events WHERE kind = 'worker_result'",
                    &[],
                )
                .await?;
            let recovered_runs: i64 = conn
                .value(
                    "SELECT COUNT(*) FROM task_events e JOIN task_runs r ON r.id = e.run_id
                      WHERE e.kind = 'worker_result'
                        AND jsonb_typeof(e.payload->'recovery_attempts') = 'number'
                        AND e.payload->'recovery_attempts' > '0'::jsonb
                        AND r.outcome = 'completed'",
                    &[],
                )
                .await?;
            let stale_releases: i64 = conn
                .value(
                    "SELECT COUNT(*) FROM task_events WHERE kind = 'reclaimed'
                        AND COALESCE(payload->'manual', 'false'::jsonb) NOT IN ('true'::jsonb, '1'::jsonb)",
                    &[],
                )
                .await?;
            let stale_writes_rejected: i64 = conn
                .value(
                    "SELECT COUNT(*) FROM task_events WHERE kind = 'stale_write_rejected'",
                    &[],
                )
                .await?;
            let walls: i64 = conn
                .value("SELECT COUNT(*) FROM provider_walls", &[])
                .await?;
            let walls_holding: i64 = conn
                .value(
                    "SELECT COUNT(*) FROM provider_walls WHERE until > $1",
                    &[&now],
                )
                .await?;
            let mut tick_buckets = Vec::new();
            for bucket in 0..=kanban_core::TICK_BUCKETS_MS.len() {
                let bucket = bucket as i64;
                let count: Option<i64> = conn
                    .value(
                        "SELECT SUM(count)::bigint FROM dispatcher_ticks WHERE bucket = $1",
                        &[&bucket],
                    )
                    .await?;
                tick_buckets.push(count.unwrap_or_default());
            }
            let tick_sum_ms: Option<i64> = conn
                .value(
                    "SELECT SUM(count)::bigint FROM dispatcher_ticks WHERE bucket = -1",
                    &[],
                )
                .await?;
            Ok(kanban_core::BoardStats {
                cards_by_status,
                runs_by_outcome,
                exits_by_code,
                recovery_attempts: recovery_attempts.unwrap_or_default(),
                recovered_runs,
                stale_releases,
                stale_writes_rejected,
                walls,
                walls_holding,
                tick_buckets,
                tick_sum_ms: tick_sum_ms.unwrap_or_default(),
            })
        })
    }

    /// One lane as a page shows it: how many cards it holds, and the first
    /// `limit` in its order (claim order; the done lane newest first),
    /// read through the lane index.
    pub async fn lane(
        &self,
        status: TaskStatus,
        limit: usize,
    ) -> Result<(usize, Vec<TaskRecord>), BoardError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let order = match status {
            TaskStatus::Done => "seq DESC",
            _ => "priority DESC, created_at ASC, seq ASC",
        };
        let status = status.as_str();
        snapshot!(self, |conn, _now| {
            let count: i64 = conn
                .value("SELECT COUNT(*) FROM tasks WHERE status = $1", &[&status])
                .await?;
            let sql = format!(
                "SELECT {TASK_COLUMNS} FROM tasks WHERE status = $1 ORDER BY {order} LIMIT $2"
            );
            let tasks = conn
                .query(&sql, &[&status, &limit])
                .await?
                .iter()
                .map(task_from_row)
                .collect::<Result<Vec<_>, TxError>>()?;
            Ok((usize::try_from(count).unwrap_or(0), tasks))
        })
    }

    /// The cards of statuses this build does not know (the seed system's
    /// own, a newer build's), as a page shows them: how many, and the
    /// first `limit`, oldest first.
    pub async fn unknown_lane(&self, limit: usize) -> Result<(usize, Vec<TaskRecord>), BoardError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let known: Vec<&str> = TaskStatus::ALL
            .iter()
            .map(|status| status.as_str())
            .collect();
        snapshot!(self, |conn, _now| {
            let count: i64 = conn
                .value(
                    "SELECT COUNT(*) FROM tasks WHERE status <> ALL($1::text[])",
                    &[&known],
                )
                .await?;
            let sql = format!(
                "SELECT {TASK_COLUMNS} FROM tasks WHERE status <> ALL($1::text[]) ORDER BY seq LIMIT $2"
            );
            let tasks = conn
                .query(&sql, &[&known, &limit])
                .await?
                .iter()
                .map(task_from_row)
                .collect::<Result<Vec<_>, TxError>>()?;
            Ok((usize::try_from(count).unwrap_or(0), tasks))
        })
    }

    /// The newest event of each of these cards: its kind and time.
    pub async fn last_events(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, (String, i64)>, BoardError> {
        snapshot!(self, |conn, _now| {
            conn.query(
                "SELECT DISTINCT ON (task_id) task_id, kind, created_at FROM task_events
                  WHERE task_id = ANY($1) ORDER BY task_id, id DESC",
                &[&ids],
            )
            .await?
            .iter()
            .map(|row| Ok((col(row, 0)?, (col(row, 1)?, col(row, 2)?))))
            .collect::<Result<_, TxError>>()
        })
    }
}
