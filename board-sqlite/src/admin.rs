//! The operator's side of the board: cards, claims by hand, unblock,
//! reclaim, and reading it all back.

use async_trait::async_trait;
use kanban_core::events;
use kanban_core::rules::{self};
use kanban_core::{
    BoardAdmin, BoardError, BoardStats, COMMENTS_SHOWN, Claim, ClaimGrant, CommentRecord,
    DispatchBoard, EventRecord, NewTask, TaskPage, TaskRecord, TaskStatus, TaskView,
};
use rusqlite::{OptionalExtension, params};

use crate::dispatch::claim_in;
use crate::open::SqliteBoard;
use crate::rows::{
    EVENT_COLUMNS, RUN_COLUMNS, TASK_COLUMNS, append_event, apply, event_from_row, existing_card,
    read_task, run_from_row, task_from_row, task_from_row_at,
};

impl SqliteBoard {
    /// Applies one of core's operator rules to a card, in one transaction.
    async fn operate(
        &self,
        task_id: &str,
        rule: impl Fn(&rules::CardState) -> Result<rules::Transition, BoardError> + Send + 'static,
    ) -> Result<(), BoardError> {
        let task_id = task_id.to_owned();
        self.call(move |store| {
            store.write(|tx, now| {
                let card = existing_card(tx, &task_id)?;
                let transition = rule(&card)?;
                apply(tx, &task_id, &transition, now)?;
                Ok(())
            })
        })
        .await
    }
}

#[async_trait]
impl BoardAdmin for SqliteBoard {
    async fn create_task(&self, new: &NewTask) -> Result<String, BoardError> {
        events::check_new_task(new)?;
        let new = new.clone();
        self.call(move |store| store.write(|tx, now| insert_task(tx, &new, now)))
            .await
    }

    async fn claim_task(
        &self,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let task_id = task_id.to_owned();
        let claim_lock = claim_lock.to_owned();
        self.call(move |store| {
            let db = store.db();
            store.write(|tx, now| claim_in(tx, &db, &task_id, ttl_seconds, &claim_lock, now))
        })
        .await
    }

    async fn unblock(&self, task_id: &str) -> Result<(), BoardError> {
        let task_id = task_id.to_owned();
        self.call(move |store| {
            store.write(|tx, now| {
                let card = existing_card(tx, &task_id)?;
                let transition = rules::unblock(&card)?;
                apply(tx, &task_id, &transition, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn cancel(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        self.operate(task_id, move |card| rules::cancel(card, &reason))
            .await
    }

    async fn archive(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, rules::archive).await
    }

    async fn hold(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        self.operate(task_id, move |card| rules::hold(card, &reason))
            .await
    }

    async fn release_hold(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, rules::release_hold).await
    }

    async fn edit(&self, task_id: &str, edit: &rules::CardEdit) -> Result<(), BoardError> {
        let edit = edit.clone();
        self.operate(task_id, move |card| rules::edit(card, &edit))
            .await
    }

    async fn prune(&self, before: i64, dry_run: bool) -> Result<Vec<String>, BoardError> {
        self.call(move |store| {
            store.write(|tx, _| {
                let ids: Vec<String> = tx
                    .prepare_cached(
                        "SELECT t.id FROM tasks t
                          WHERE t.status IN ('done', 'archived')
                            AND COALESCE((SELECT MAX(e.created_at) FROM task_events e WHERE e.task_id = t.id),
                                         t.completed_at, t.created_at) < ?1
                          ORDER BY t.created_at",
                    )?
                    .query_map(params![before], |row| row.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                if dry_run {
                    return Ok(ids);
                }
                for id in &ids {
                    // Run ids stay unique after this (AUTOINCREMENT): a
                    // fencing token is never handed out twice.
                    for sql in [
                        "DELETE FROM task_events WHERE task_id = ?1",
                        "DELETE FROM task_comments WHERE task_id = ?1",
                        "DELETE FROM task_runs WHERE task_id = ?1",
                        "DELETE FROM task_links WHERE child_id = ?1 OR parent_id = ?1",
                        "DELETE FROM tasks WHERE id = ?1",
                    ] {
                        tx.prepare_cached(sql)?.execute(params![id])?;
                    }
                }
                Ok(ids)
            })
        })
        .await
    }

    async fn add_comment(&self, task_id: &str, author: &str, text: &str) -> Result<(), BoardError> {
        let text = events::check_comment(text)?;
        let (task_id, author, text) = (task_id.to_owned(), author.to_owned(), text.to_owned());
        self.call(move |store| {
            store.write(|tx, now| {
                existing_card(tx, &task_id)?;
                tx.prepare_cached(
                    "INSERT INTO task_comments (task_id, author, body, created_at) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![task_id, author, text, now])?;
                let event = events::commented(None, &author);
                append_event(tx, &task_id, &event, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn lift_wall(&self, scope: &str) -> Result<bool, BoardError> {
        let scope = scope.to_owned();
        self.call(move |store| {
            store.write(|tx, now| {
                let source: Option<String> = tx
                    .prepare_cached("DELETE FROM provider_walls WHERE scope = ?1 RETURNING source")?
                    .query_row(params![scope], |row| row.get(0))
                    .optional()?;
                let Some(source) = source else {
                    return Ok(false);
                };
                // `TASK#RUN`: the card that met the wall keeps its history.
                let (task_id, run) = source.split_once('#').unwrap_or((source.as_str(), ""));
                if let Ok(card) = existing_card(tx, task_id) {
                    let transition = rules::lift_wall(&card, &scope, run.parse::<i64>().ok());
                    apply(tx, task_id, &transition, now)?;
                }
                Ok(true)
            })
        })
        .await
    }

    async fn reclaim(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let task_id = task_id.to_owned();
        let reason = reason.to_owned();
        self.call(move |store| {
            store.write(|tx, now| {
                let card = existing_card(tx, &task_id)?;
                let transition = rules::reclaim(&card, &reason, now)?;
                apply(tx, &task_id, &transition, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn show_task(&self, task_id: &str) -> Result<TaskView, BoardError> {
        let task_id = task_id.to_owned();
        self.call(move |store| {
            let view = store.read(|conn| {
                let Some(task) = read_task(conn, &task_id)? else {
                    return Ok(None);
                };
                let runs = conn
                    .prepare_cached(&format!(
                        "SELECT {RUN_COLUMNS} FROM task_runs WHERE task_id = ?1 ORDER BY id"
                    ))?
                    .query_map(params![task_id], run_from_row)?
                    .collect::<rusqlite::Result<_>>()?;
                let events = conn
                    .prepare_cached(&format!(
                        "SELECT {EVENT_COLUMNS} FROM task_events WHERE task_id = ?1 ORDER BY id"
                    ))?
                    .query_map(params![task_id], event_from_row)?
                    .collect::<rusqlite::Result<_>>()?;
                let parents = conn
                    .prepare_cached(
                        "SELECT parent_id FROM task_links WHERE child_id = ?1 ORDER BY parent_id",
                    )?
                    .query_map(params![task_id], |row| row.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                let mut comments: Vec<CommentRecord> = conn
                    .prepare_cached(
                        "SELECT id, author, body, created_at FROM task_comments
                          WHERE task_id = ?1 ORDER BY id DESC LIMIT ?2",
                    )?
                    .query_map(params![task_id, COMMENTS_SHOWN as i64], |row| {
                        Ok(CommentRecord {
                            id: row.get(0)?,
                            author: row.get(1)?,
                            body: row.get(2)?,
                            created_at: row.get(3)?,
                        })
                    })?
                    .collect::<rusqlite::Result<_>>()?;
                comments.reverse();
                Ok(Some(TaskView {
                    task,
                    parents,
                    runs,
                    events,
                    comments,
                }))
            })?;
            view.ok_or_else(|| BoardError::TaskNotFound(task_id.clone()))
        })
        .await
    }

    async fn list_tasks(&self, status: Option<TaskStatus>) -> Result<Vec<TaskRecord>, BoardError> {
        self.call(move |store| {
            store.read(|conn| {
                let mut statement = conn.prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM tasks WHERE ?1 IS NULL OR status = ?1 ORDER BY created_at, rowid"
                ))?;
                statement
                    .query_map(params![status.map(TaskStatus::as_str)], task_from_row)?
                    .collect()
            })
        })
        .await
    }

    async fn list_page(
        &self,
        status: Option<TaskStatus>,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TaskPage, BoardError> {
        // The rowid is the card's place: a page is a range of the table's
        // own b-tree, read as far as the page goes, however big the board.
        let rows = i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1);
        let rows: Vec<(i64, TaskRecord)> = self
            .call(move |store| {
                store.read(|conn| {
                    let mut statement = conn.prepare_cached(&format!(
                        "SELECT rowid, {TASK_COLUMNS} FROM tasks
                          WHERE rowid > ?2 AND (?1 IS NULL OR status = ?1)
                          ORDER BY rowid LIMIT ?3"
                    ))?;
                    statement
                        .query_map(
                            params![status.map(TaskStatus::as_str), after.unwrap_or(0), rows],
                            |row| Ok((row.get(0)?, task_from_row_at(row, 1)?)),
                        )?
                        .collect()
                })
            })
            .await?;
        Ok(TaskPage::from_rows(rows, limit))
    }

    async fn recent_events(&self, limit: usize) -> Result<Vec<EventRecord>, BoardError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut events: Vec<EventRecord> = self
            .call(move |store| {
                store.read(|conn| {
                    conn.prepare_cached(&format!(
                        "SELECT {EVENT_COLUMNS} FROM task_events ORDER BY id DESC LIMIT ?1"
                    ))?
                    .query_map(params![limit], event_from_row)?
                    .collect()
                })
            })
            .await?;
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

impl SqliteBoard {
    /// Test and operator hook: sets both lease expiries of a task's current run.
    pub fn set_lease_expiry(&self, task_id: &str, expires: i64) -> Result<(), BoardError> {
        self.store.write(|tx, _| {
            tx.execute(
                "UPDATE tasks SET claim_expires = ?2 WHERE id = ?1",
                params![task_id, expires],
            )?;
            tx.execute(
                "UPDATE task_runs SET claim_expires = ?2 WHERE id = (SELECT current_run_id FROM tasks WHERE id = ?1)",
                params![task_id, expires],
            )?;
            Ok(())
        })
    }

    /// The board's structural invariants, checked with SQL: a running card
    /// holds a claim and points at its one open run; no other card holds a
    /// claim or an open run; a closed run has an outcome. Returns every
    /// violation found; empty when the board is sound.
    pub fn audit(&self) -> Result<Vec<String>, BoardError> {
        const CHECKS: [(&str, &str); 5] = [
            (
                "a running card without a claim or an open current run",
                "SELECT t.id FROM tasks t WHERE t.status = 'running' AND (t.claim_lock IS NULL
                   OR t.claim_expires IS NULL OR NOT EXISTS (SELECT 1 FROM task_runs r
                   WHERE r.id = t.current_run_id AND r.task_id = t.id AND r.ended_at IS NULL))",
            ),
            (
                "a card with more than one open run",
                "SELECT task_id FROM task_runs WHERE ended_at IS NULL GROUP BY task_id HAVING COUNT(*) > 1",
            ),
            (
                "an open run that is not its card's current run",
                "SELECT r.task_id || ' run ' || r.id FROM task_runs r JOIN tasks t ON t.id = r.task_id
                  WHERE r.ended_at IS NULL AND (t.status != 'running' OR t.current_run_id IS NOT r.id)",
            ),
            (
                "a card that is not running but holds a claim",
                "SELECT id FROM tasks WHERE status != 'running'
                  AND (current_run_id IS NOT NULL OR claim_lock IS NOT NULL OR claim_expires IS NOT NULL)",
            ),
            (
                "a closed run without an outcome",
                "SELECT task_id || ' run ' || id FROM task_runs WHERE ended_at IS NOT NULL AND outcome IS NULL",
            ),
        ];
        self.store.read(|conn| {
            let mut problems = Vec::new();
            for (what, sql) in CHECKS {
                let mut statement = conn.prepare_cached(sql)?;
                let found: Vec<String> = statement
                    .query_map([], |row| row.get(0))?
                    .collect::<rusqlite::Result<_>>()?;
                problems.extend(found.into_iter().map(|at| format!("{what}: {at}")));
            }
            Ok(problems)
        })
    }

    /// Reads one task row, if it exists.
    pub fn task(&self, task_id: &str) -> Result<Option<TaskRecord>, BoardError> {
        self.store.read(|conn| read_task(conn, task_id))
    }
}

/// The statuses this build knows, as an SQL list.
fn known_statuses() -> String {
    TaskStatus::ALL
        .iter()
        .map(|status| format!("'{}'", status.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Creates a card inside the caller's transaction; returns its id (or the
/// existing card's for a repeated idempotency key).
pub(crate) fn insert_task(
    tx: &rusqlite::Connection,
    new: &NewTask,
    now: i64,
) -> Result<String, crate::open::TxError> {
    if let Some(key) = &new.idempotency_key {
        let existing: Option<String> = tx
            .query_row(
                "SELECT id FROM tasks WHERE idempotency_key = ?1 AND status != 'archived' ORDER BY created_at DESC LIMIT 1",
                params![key],
                |row| row.get(0),
            )
            .optional()?;
        if let Some(id) = existing {
            return Ok(id);
        }
    }
    let mut open_parents = false;
    for parent in &new.parents {
        let status: Option<String> = tx
            .query_row(
                "SELECT status FROM tasks WHERE id = ?1",
                params![parent],
                |row| row.get(0),
            )
            .optional()?;
        match status.as_deref().map(TaskStatus::parse) {
            None => return Err(BoardError::TaskNotFound(parent.clone()).into()),
            Some(status) => {
                open_parents |= !matches!(status, Some(TaskStatus::Done | TaskStatus::Archived));
            }
        }
    }
    let status = rules::initial_status(new.start_blocked, open_parents);
    let id = loop {
        let candidate: String =
            tx.query_row("SELECT 't_' || lower(hex(randomblob(4)))", [], |row| {
                row.get(0)
            })?;
        let taken: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = ?1)",
            params![candidate],
            |row| row.get(0),
        )?;
        if !taken {
            break candidate;
        }
    };
    tx.execute(
        "INSERT INTO tasks (id, title, body, assignee, status, priority, created_at, idempotency_key,
                            max_retries, goal_mode, goal_max_turns, max_runtime_seconds,
                            not_before, every_seconds, scheduled_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
        params![
            id,
            new.title,
            new.body,
            new.assignee,
            status.as_str(),
            new.priority,
            now,
            new.idempotency_key,
            new.max_retries,
            i64::from(new.goal_mode),
            new.goal_max_turns,
            new.max_runtime_seconds,
            new.not_before,
            new.every_seconds,
            new.every_seconds.map(|_| new.not_before.unwrap_or(now)),
        ],
    )?;
    for parent in &new.parents {
        tx.execute(
            "INSERT OR IGNORE INTO task_links (parent_id, child_id) VALUES (?1, ?2)",
            params![parent, id],
        )?;
    }
    for event in rules::creation_events(status, &new.parents, new.assignee.as_deref()) {
        append_event(tx, &id, &event, now)?;
    }
    if let Some(event) = events::scheduled(new) {
        append_event(tx, &id, &event, now)?;
    }
    Ok(id)
}

/// The next occurrence of a recurring card that just completed, created in
/// the same transaction: one card at a time, due one period after this one
/// was ([`rules::next_occurrence`]).
pub(crate) fn recur(
    tx: &rusqlite::Connection,
    task_id: &str,
    now: i64,
) -> Result<(), crate::open::TxError> {
    let row = tx
        .prepare_cached(
            "SELECT title, body, assignee, priority, max_retries, goal_mode, goal_max_turns,
                    max_runtime_seconds, every_seconds, COALESCE(scheduled_at, created_at)
               FROM tasks WHERE id = ?1 AND every_seconds IS NOT NULL",
        )?
        .query_row(params![task_id], |row| {
            Ok((
                NewTask {
                    title: row.get(0)?,
                    body: row.get(1)?,
                    assignee: row.get(2)?,
                    priority: row.get::<_, Option<i64>>(3)?.unwrap_or(0),
                    max_retries: row.get(4)?,
                    goal_mode: row.get::<_, i64>(5)? != 0,
                    goal_max_turns: row.get(6)?,
                    max_runtime_seconds: row.get(7)?,
                    every_seconds: row.get(8)?,
                    ..NewTask::default()
                },
                row.get::<_, i64>(9)?,
            ))
        })
        .optional()?;
    let Some((mut next, scheduled_at)) = row else {
        return Ok(());
    };
    let every = next.every_seconds.unwrap_or(1);
    let due = rules::next_occurrence(scheduled_at, every, now);
    next.not_before = Some(due);
    let id = insert_task(tx, &next, now)?;
    let event = events::recurred(&id, due);
    append_event(tx, task_id, &event, now)?;
    Ok(())
}

impl SqliteBoard {
    /// The board's counts, read in one transaction.
    pub fn stats(&self) -> Result<BoardStats, BoardError> {
        let now = self.store.clock.now();
        self.store.read(|conn| {
            let pairs = |sql: &str| -> rusqlite::Result<Vec<(String, i64)>> {
                conn.prepare(sql)?
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect()
            };
            let one = |sql: &str| -> rusqlite::Result<i64> {
                conn.query_row(sql, params![now], |row| row.get::<_, Option<i64>>(0))
                    .map(Option::unwrap_or_default)
            };
            Ok(BoardStats {
                cards_by_status: pairs("SELECT status, COUNT(*) FROM tasks GROUP BY status ORDER BY status")?,
                runs_by_outcome: pairs(
                    "SELECT COALESCE(outcome, 'running'), COUNT(*) FROM task_runs GROUP BY 1 ORDER BY 1",
                )?,
                // The bookings' event kinds are core's (a settled exit is
                // `worker_exited`); the board only counts them.
                exits_by_code: {
                    let kinds: Vec<&str> = kanban_core::BookingKind::ALL
                        .iter()
                        .map(|kind| match kind {
                            kanban_core::BookingKind::Settled => "worker_exited",
                            other => other.as_str(),
                        })
                        .collect();
                    let kinds = serde_json::to_string(&kinds).unwrap_or_default();
                    conn.prepare(
                        "SELECT COALESCE(CAST(json_extract(payload, '$.exit_code') AS TEXT), 'none'), COUNT(*)
                           FROM task_events
                          WHERE kind IN (SELECT value FROM json_each(?1)) AND json_valid(payload)
                          GROUP BY 1 ORDER BY 1",
                    )?
                    .query_map(params![kinds], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect::<rusqlite::Result<_>>()?
                },
                recovery_attempts: one(
                    "SELECT SUM(json_extract(payload, '$.recovery_attempts')) FROM task_events
                      WHERE kind = 'worker_result' AND json_valid(payload) AND ?1 IS NOT NULL",
                )?,
                recovered_runs: one(
                    "SELECT COUNT(*) FROM task_events e JOIN task_runs r ON r.id = e.run_id
                      WHERE e.kind = 'worker_result' AND json_valid(e.payload)
                        AND json_extract(e.payload, '$.recovery_attempts') > 0
                        AND r.outcome = 'completed' AND ?1 IS NOT NULL",
                )?,
                stale_releases: one(
                    "SELECT COUNT(*) FROM task_events WHERE kind = 'reclaimed' AND json_valid(payload)
                        AND COALESCE(json_extract(payload, '$.manual'), 0) = 0 AND ?1 IS NOT NULL",
                )?,
                stale_writes_rejected: one(
                    "SELECT COUNT(*) FROM task_events WHERE kind = 'stale_write_rejected' AND ?1 IS NOT NULL",
                )?,
                walls: one("SELECT COUNT(*) FROM provider_walls WHERE ?1 IS NOT NULL")?,
                walls_holding: one("SELECT COUNT(*) FROM provider_walls WHERE until > ?1")?,
                tick_buckets: (0..=kanban_core::TICK_BUCKETS_MS.len())
                    .map(|bucket| {
                        conn.query_row(
                            "SELECT SUM(count) FROM dispatcher_ticks WHERE bucket = ?1",
                            params![bucket as i64],
                            |row| row.get::<_, Option<i64>>(0),
                        )
                        .map(Option::unwrap_or_default)
                    })
                    .collect::<rusqlite::Result<_>>()?,
                tick_sum_ms: one(
                    "SELECT SUM(count) FROM dispatcher_ticks WHERE bucket = -1 AND ?1 IS NOT NULL",
                )?,
            })
        })
    }
}

impl SqliteBoard {
    /// The newest event of each of these cards: its kind and time.
    pub fn last_events(
        &self,
        ids: &[String],
    ) -> Result<std::collections::HashMap<String, (String, i64)>, BoardError> {
        let ids = serde_json::to_string(ids).unwrap_or_else(|_| "[]".to_owned());
        self.store.read(|conn| {
            conn.prepare_cached(
                "SELECT e.task_id, e.kind, e.created_at FROM task_events e
                  WHERE e.id IN (SELECT MAX(id) FROM task_events
                                  WHERE task_id IN (SELECT value FROM json_each(?1)) GROUP BY task_id)",
            )?
            .query_map(params![ids], |row| {
                Ok((row.get::<_, String>(0)?, (row.get(1)?, row.get(2)?)))
            })?
            .collect()
        })
    }
}

impl SqliteBoard {
    /// One lane of the board as a page shows it: how many cards it holds,
    /// and the first `limit` in its order (claim order: priority, then
    /// oldest; the done lane newest first), read through the lane index, so
    /// a board of a million cards costs what a board of a hundred does.
    pub fn lane(
        &self,
        status: TaskStatus,
        limit: usize,
    ) -> Result<(usize, Vec<TaskRecord>), BoardError> {
        self.store.read(|conn| {
            let count: i64 = conn
                .prepare_cached("SELECT COUNT(*) FROM tasks WHERE status = ?1")?
                .query_row(params![status.as_str()], |row| row.get(0))?;
            // The newest done cards: a few found through the lane index and
            // sorted; many by walking the table back from its newest row,
            // which meets them soon (no index orders done cards by age, and
            // one would cost every claim a page).
            let (from, order) = match status {
                TaskStatus::Done if count > 1000 => ("tasks NOT INDEXED", "rowid DESC"),
                TaskStatus::Done => ("tasks", "rowid DESC"),
                _ => ("tasks", "priority DESC, created_at ASC, rowid ASC"),
            };
            let tasks = conn
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM {from} WHERE status = ?1 ORDER BY {order} LIMIT ?2"
                ))?
                .query_map(params![status.as_str(), limit as i64], task_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok((usize::try_from(count).unwrap_or(0), tasks))
        })
    }

    /// The cards of statuses this build does not know (the seed system's
    /// own, a newer build's), as a page shows them: how many, and the
    /// first `limit`, oldest first.
    pub fn unknown_lane(&self, limit: usize) -> Result<(usize, Vec<TaskRecord>), BoardError> {
        let known = known_statuses();
        self.store.read(|conn| {
            let count: i64 = conn
                .prepare_cached(&format!("SELECT COUNT(*) FROM tasks WHERE status NOT IN ({known})"))?
                .query_row([], |row| row.get(0))?;
            let tasks = conn
                .prepare_cached(&format!(
                    "SELECT {TASK_COLUMNS} FROM tasks WHERE status NOT IN ({known}) ORDER BY rowid LIMIT ?1"
                ))?
                .query_map(params![limit as i64], task_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok((usize::try_from(count).unwrap_or(0), tasks))
        })
    }
}
