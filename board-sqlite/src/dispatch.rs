//! The dispatcher's side of the board: claims, spawn and signal records,
//! lease extensions, bookings and releases. Every decision is core's.

use async_trait::async_trait;
use kanban_core::events;
use kanban_core::rules::{self, ExitHistory, FailurePolicy, Release, STREAK_SCAN_LIMIT};
use kanban_core::walls::Wall;
use kanban_core::{
    BoardError, Booking, Claim, ClaimFilter, ClaimGrant, DispatchBoard, ExitReport, NotLive,
    RunningWorker, SignalReason, TickDurations, WorkerProcess, WorkerResult,
};
use rusqlite::{Connection, OptionalExtension, params};

use crate::open::{Durability, SqliteBoard, TxError};
use crate::rows::{OPEN_PARENT, WALL_COLUMNS, append_event, apply, existing_card, wall_from_row};

/// Claims one card inside the caller's transaction: the compare-and-set
/// opens a run only for a ready, unclaimed card whose parents are all done.
pub(crate) fn claim_in(
    tx: &Connection,
    db: &str,
    task_id: &str,
    ttl_seconds: i64,
    claim_lock: &str,
    now: i64,
) -> Result<Option<ClaimGrant>, TxError> {
    let ttl = ttl_seconds.max(1);
    let expires = now.saturating_add(ttl);
    // The happy path in one statement; why a claim failed is asked only
    // when it did.
    let opened = tx
        .prepare_cached(&format!(
            "INSERT INTO task_runs (task_id, profile, status, claim_lock, claim_expires, started_at, lease_ttl)
             SELECT t.id, t.assignee, 'running', ?2, ?3, ?4, ?5 FROM tasks t
              WHERE t.id = ?1 AND t.status = 'ready' AND t.claim_lock IS NULL
                AND t.held_reason IS NULL AND NOT EXISTS ({OPEN_PARENT})"
        ))?
        .execute(params![task_id, claim_lock, expires, now, ttl])?;
    if opened == 0 {
        let card = existing_card(tx, task_id)?;
        if card.status == kanban_core::TaskStatus::Ready
            && card.claim_lock.is_none()
            && card.open_parents
        {
            apply(tx, task_id, &rules::reject_claim_for_parents(), now)?;
        }
        return Ok(None);
    }
    let run_id = tx.last_insert_rowid();
    // The compare-and-set: only a ready, unclaimed card becomes ours. The
    // IMMEDIATE transaction already excludes other writers; the guard keeps
    // the statement honest on its own. (Not `RETURNING`: SQLite makes that
    // a trigger, and a statement with a trigger keeps a statement journal,
    // allocated and freed at every claim: a seventh of a single claim's
    // time, with the heap grown and trimmed each time.)
    let granted = tx
        .prepare_cached(
            "UPDATE tasks SET status = 'running', claim_lock = ?2, claim_expires = ?3, current_run_id = ?5,
                              started_at = COALESCE(started_at, ?4), last_heartbeat_at = NULL
              WHERE id = ?1 AND status = 'ready' AND claim_lock IS NULL",
        )?
        .execute(params![task_id, claim_lock, expires, now, run_id])?;
    if granted != 1 {
        return Err(BoardError::Storage(format!(
            "claim of {task_id} lost its compare-and-set inside its own transaction"
        ))
        .into());
    }
    // What the grant carries, in one statement.
    let (goal_mode, assignee, rerun): (bool, Option<String>, bool) = tx
        .prepare_cached(
            "SELECT t.goal_mode != 0, t.assignee,
                    EXISTS (SELECT 1 FROM task_runs r WHERE r.task_id = t.id AND r.id < ?2)
               FROM tasks t WHERE t.id = ?1",
        )?
        .query_row(params![task_id, run_id], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })?;
    let claim = Claim {
        task_id: task_id.to_owned(),
        db: db.to_owned(),
        run_id,
        claim_lock: claim_lock.to_owned(),
        board: None,
    };
    append_event(
        tx,
        task_id,
        &rules::claimed_event(&claim, expires, ttl),
        now,
    )?;
    Ok(Some(ClaimGrant {
        claim,
        claim_expires: expires,
        goal_mode,
        rerun,
        assignee,
    }))
}

/// What a board knows about the run when its exit is booked.
fn exit_history(
    tx: &Connection,
    claim: &Claim,
    scope: Option<&str>,
) -> rusqlite::Result<ExitHistory> {
    let recent_outcomes = tx
        .prepare_cached(
            "SELECT outcome FROM task_runs WHERE task_id = ?1 AND ended_at IS NOT NULL
              ORDER BY id DESC LIMIT ?2",
        )?
        .query_map(params![claim.task_id, STREAK_SCAN_LIMIT as i64], |row| {
            Ok(row.get::<_, Option<String>>(0)?.unwrap_or_default())
        })?
        .collect::<rusqlite::Result<_>>()?;
    let recorded_signal = tx
        .prepare_cached(
            "SELECT payload FROM task_events
              WHERE task_id = ?1 AND kind = 'worker_signalled' AND run_id = ?2
              ORDER BY id DESC LIMIT 1",
        )?
        .query_row(params![claim.task_id, claim.run_id], |row| {
            row.get::<_, Option<String>>(0)
        })
        .optional()?
        .flatten()
        .and_then(|payload| serde_json::from_str::<serde_json::Value>(&payload).ok())
        // A record without a reason predates reasons: it was a shutdown.
        .map(|payload| {
            payload["reason"]
                .as_str()
                .and_then(SignalReason::parse)
                .unwrap_or(SignalReason::Shutdown)
        });
    let walls = tx
        .prepare_cached(&format!(
            "SELECT {WALL_COLUMNS} FROM provider_walls WHERE scope = ?1 OR probe_run = ?2"
        ))?
        .query_map(params![scope.unwrap_or(""), claim.run_id], wall_from_row)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(ExitHistory {
        recent_outcomes,
        recorded_signal,
        walls,
    })
}

#[async_trait]
impl DispatchBoard for SqliteBoard {
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError> {
        self.call(move |store| {
            let db = store.db();
            store.read(|conn| {
                let mut statement = conn.prepare_cached(
                    "SELECT t.id, t.current_run_id, t.claim_lock, t.worker_pid, t.claim_expires,
                            t.last_heartbeat_at, t.worker_started_at, r.started_at, t.max_runtime_seconds,
                            r.worker_seal, t.assignee
                       FROM tasks t JOIN task_runs r ON r.id = t.current_run_id
                      WHERE t.status = 'running' AND t.claim_lock IS NOT NULL
                      ORDER BY t.current_run_id",
                )?;
                let rows = statement.query_map([], |row| {
                    Ok(RunningWorker {
                        claim: Claim {
                            task_id: row.get(0)?,
                            db: db.clone(),
                            run_id: row.get(1)?,
                            claim_lock: row.get(2)?,
                            board: None,
                        },
                        worker_pid: row.get(3)?,
                        claim_expires: row.get(4)?,
                        last_heartbeat_at: row.get(5)?,
                        worker_started_at: row.get(6)?,
                        run_started_at: row.get(7)?,
                        max_runtime_seconds: row.get(8)?,
                        seal_digest: row.get(9)?,
                        assignee: row.get(10)?,
                    })
                })?;
                rows.collect()
            })
        })
        .await
    }

    async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        filter: &ClaimFilter,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let grants = self
            .claim_ready_batch(ttl_seconds, &[claim_lock.to_owned()], filter)
            .await?;
        Ok(grants.into_iter().next())
    }

    async fn claim_ready_batch(
        &self,
        ttl_seconds: i64,
        claim_locks: &[String],
        filter: &ClaimFilter,
    ) -> Result<Vec<ClaimGrant>, BoardError> {
        let claim_locks = claim_locks.to_vec();
        // The admitted assignees as a JSON array, so one cached statement
        // serves every filter (NULL: every card).
        let admitted = filter
            .assignees
            .as_ref()
            .map(|set| serde_json::to_string(set).unwrap_or_else(|_| "[]".to_owned()));
        self.call(move |store| {
            let db = store.db();
            store.write(|tx, now| {
                let mut grants = Vec::new();
                if claim_locks.is_empty() {
                    return Ok(grants);
                }
                // Walk the ready lane in order; a held card (backoff,
                // cooldown, an operator's hold) is skipped by the query, not
                // the rules.
                let candidates: Vec<String> = {
                    let mut statement = tx.prepare_cached(
                        "SELECT id FROM tasks
                          WHERE status = 'ready' AND claim_lock IS NULL AND held_reason IS NULL
                            AND (not_before IS NULL OR not_before <= ?1)
                            AND (?2 IS NULL OR COALESCE(assignee, '') IN (SELECT value FROM json_each(?2)))
                          ORDER BY priority DESC, created_at ASC, rowid ASC LIMIT ?3",
                    )?;
                    let limit = i64::try_from(32 + claim_locks.len()).unwrap_or(i64::MAX);
                    statement
                        .query_map(params![now, admitted, limit], |row| row.get(0))?
                        .collect::<rusqlite::Result<_>>()?
                };
                let mut locks = claim_locks.iter();
                let mut lock = locks.next();
                // An id no kanban wrote (`../x`) is never claimed: ids name
                // log files and reach workers' environments.
                for id in candidates
                    .into_iter()
                    .filter(|id| kanban_core::is_valid_task_id(id))
                {
                    let Some(claim_lock) = lock else { break };
                    if let Some(grant) = claim_in(tx, &db, &id, ttl_seconds, claim_lock, now)? {
                        grants.push(grant);
                        lock = locks.next();
                    }
                }
                Ok(grants)
            })
        })
        .await
    }

    async fn record_ticks(&self, host: &str, ticks: &TickDurations) -> Result<(), BoardError> {
        let host = host.to_owned();
        let ticks = ticks.clone();
        self.call(move |store| {
            store.write_deferred(|tx, _| {
                let mut add = tx.prepare_cached(
                    "INSERT INTO dispatcher_ticks (host, bucket, count) VALUES (?1, ?2, ?3)
                     ON CONFLICT (host, bucket) DO UPDATE SET count = count + excluded.count",
                )?;
                for (bucket, count) in ticks.buckets.iter().enumerate() {
                    if *count > 0 {
                        add.execute(params![host, bucket as i64, *count as i64])?;
                    }
                }
                add.execute(params![host, -1_i64, ticks.sum_ms as i64])?;
                Ok(())
            })
        })
        .await
    }

    async fn walls(&self) -> Result<Vec<Wall>, BoardError> {
        self.call(move |store| {
            store.read(|conn| {
                conn.prepare_cached(&format!(
                    "SELECT {WALL_COLUMNS} FROM provider_walls ORDER BY until, scope"
                ))?
                .query_map([], wall_from_row)?
                .collect()
            })
        })
        .await
    }

    async fn start_probe(&self, claim: &Claim, scopes: &[String]) -> Result<bool, BoardError> {
        let claim = claim.clone();
        let scopes = scopes.to_vec();
        self.call(move |store| {
            store.write(|tx, now| {
                // Looked at inside the write lock: nobody moves a wall between.
                for scope in &scopes {
                    let barred: bool = tx
                        .prepare_cached(
                            "SELECT EXISTS (SELECT 1 FROM provider_walls w
                              WHERE w.scope = ?1
                                AND (w.until > ?2
                                     OR (w.probe_run IS NOT NULL AND w.probe_run != ?3
                                         AND EXISTS (SELECT 1 FROM tasks t
                                                      WHERE t.current_run_id = w.probe_run
                                                        AND t.status = 'running'
                                                        AND t.claim_lock IS NOT NULL))))",
                        )?
                        .query_row(params![scope, now, claim.run_id], |row| row.get(0))?;
                    if barred {
                        return Ok(false);
                    }
                }
                for scope in &scopes {
                    tx.prepare_cached("UPDATE provider_walls SET probe_run = ?2 WHERE scope = ?1")?
                        .execute(params![scope, claim.run_id])?;
                }
                let event = events::wall_probe(&claim, &scopes);
                append_event(tx, &claim.task_id, &event, now)?;
                Ok(true)
            })
        })
        .await
    }

    async fn record_spawn(&self, claim: &Claim, process: &WorkerProcess) -> Result<(), BoardError> {
        let claim = claim.clone();
        let process = process.clone();
        self.call(move |store| {
            store.write_deferred(|tx, now| {
                let changed = tx
                    .prepare_cached(
                        "UPDATE tasks SET worker_pid = ?4, worker_started_at = ?5
                          WHERE id = ?1 AND status = 'running' AND current_run_id = ?2 AND claim_lock = ?3",
                    )?
                    .execute(params![
                        claim.task_id,
                        claim.run_id,
                        claim.claim_lock,
                        process.pid,
                        process.started_at
                    ])?;
                if changed != 1 {
                    return Err(BoardError::LeaseLost {
                        task_id: claim.task_id.clone(),
                        reason: NotLive::RunMoved { current: 0 },
                    }
                    .into());
                }
                tx.prepare_cached(
                    "UPDATE task_runs SET worker_pid = ?2, worker_started_at = ?3, worker_seal = ?4 WHERE id = ?1",
                )?
                .execute(params![claim.run_id, process.pid, process.started_at, process.seal_digest])?;
                let event = events::spawned(&claim, &process);
                append_event(tx, &claim.task_id, &event, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn record_signal(
        &self,
        claim: &Claim,
        signal: i32,
        reason: SignalReason,
    ) -> Result<(), BoardError> {
        let claim = claim.clone();
        self.call(move |store| {
            store.write_deferred(|tx, now| {
                let event = events::worker_signalled(&claim, signal, reason);
                append_event(tx, &claim.task_id, &event, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        expires: i64,
        record: Option<(&'static str, &'static str)>,
    ) -> Result<bool, BoardError> {
        let claim = claim.clone();
        self.call(move |store| {
            store.write_deferred(|tx, now| {
                let card = existing_card(tx, &claim.task_id)?;
                if !rules::holds_claim(&card, &claim) {
                    return Ok(false);
                }
                if card.claim_expires.is_none_or(|current| current < expires) {
                    tx.prepare_cached("UPDATE tasks SET claim_expires = ?2 WHERE id = ?1")?
                        .execute(params![claim.task_id, expires])?;
                    tx.prepare_cached("UPDATE task_runs SET claim_expires = ?2 WHERE id = ?1")?
                        .execute(params![claim.run_id, expires])?;
                }
                if let Some((kind, reason)) = record {
                    let event = events::lease_record(&claim, kind, reason, expires);
                    append_event(tx, &claim.task_id, &event, now)?;
                }
                Ok(true)
            })
        })
        .await
    }

    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError> {
        let claim = claim.clone();
        self.call(move |store| {
            let payload: Option<String> = store.read(|conn| {
                conn.prepare_cached(
                    "SELECT payload FROM task_events
                      WHERE task_id = ?1 AND kind = 'worker_result' AND run_id = ?2
                      ORDER BY id DESC LIMIT 1",
                )?
                .query_row(params![claim.task_id, claim.run_id], |row| row.get(0))
                .optional()
                .map(Option::flatten)
            })?;
            // Run-scoped and lock-checked.
            Ok(payload
                .and_then(|payload| serde_json::from_str::<WorkerResult>(&payload).ok())
                .filter(|result| result.claim_lock == claim.claim_lock))
        })
        .await
    }

    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError> {
        let claim = claim.clone();
        let report = report.clone();
        self.call(move |store| {
            // Most exits are of runs their workers settled, and book only a
            // record, left to the next synced commit (the claim that fills
            // the slot): one sync a card fewer.
            store.write_synced_unless_record(|tx, now, durability| {
                let card = existing_card(tx, &claim.task_id)?;
                let scope = report.wall.as_ref().map(|wall| wall.scope.as_str());
                let history = exit_history(tx, &claim, scope)?;
                let (booking, transition) = rules::book_exit(&card, &claim, &history, &report, now);
                if durability == Durability::Deferred && !transition.only_records() {
                    return Err(TxError::NeedsSync);
                }
                apply(tx, &claim.task_id, &transition, now)?;
                Ok(booking)
            })
        })
        .await
    }

    async fn release_claim(
        &self,
        claim: &Claim,
        release: &Release,
        policy: &FailurePolicy,
    ) -> Result<bool, BoardError> {
        let policy = *policy;
        let claim = claim.clone();
        let release = release.clone();
        self.call(move |store| {
            store.write(|tx, now| {
                let card = existing_card(tx, &claim.task_id)?;
                let Some(transition) = rules::release_claim(&card, &claim, &release, &policy, now)
                else {
                    return Ok(false);
                };
                apply(tx, &claim.task_id, &transition, now)?;
                Ok(true)
            })
        })
        .await
    }

    async fn check_health(&self) -> Result<(), BoardError> {
        self.store.check_health()
    }

    async fn promote_ready(&self) -> Result<usize, BoardError> {
        self.call(move |store| {
            // Most ticks have nothing to promote: look before taking the write lock.
            let waiting: bool = store.read(|conn| {
                conn.prepare_cached("SELECT EXISTS (SELECT 1 FROM tasks WHERE status = 'todo')")?
                    .query_row([], |row| row.get(0))
            })?;
            if !waiting {
                return Ok(0);
            }
            store.write(|tx, now| {
                let todo: Vec<String> = {
                    let mut statement = tx.prepare_cached(&format!(
                        "SELECT t.id FROM tasks t WHERE t.status = 'todo' AND NOT EXISTS ({OPEN_PARENT})"
                    ))?;
                    statement
                        .query_map([], |row| row.get(0))?
                        .collect::<rusqlite::Result<_>>()?
                };
                let mut promoted = 0;
                for id in &todo {
                    let card = existing_card(tx, id)?;
                    if let Some(transition) = rules::promote(&card) {
                        apply(tx, id, &transition, now)?;
                        promoted += 1;
                    }
                }
                Ok(promoted)
            })
        })
        .await
    }
}
