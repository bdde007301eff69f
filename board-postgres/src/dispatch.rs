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
use serde_json::Value;

use crate::conn::{Conn, TxError, col};
use crate::rows::{OPEN_PARENT, WALL_COLUMNS, append_event, apply, existing_card, wall_from_row};
use crate::{PgBoard, snapshot, transaction};

/// Claims one card inside the caller's transaction: the compare-and-set
/// opens a run only for a ready, unclaimed card whose parents are all done.
/// A card another transaction has locked is skipped, never waited for.
pub(crate) async fn claim_in(
    tx: &mut Conn,
    db: &str,
    task_id: &str,
    ttl_seconds: i64,
    claim_lock: &str,
    now: i64,
) -> Result<Option<ClaimGrant>, TxError> {
    let ttl = ttl_seconds.max(1);
    let expires = now.saturating_add(ttl);
    let locked = tx
        .query_opt(
            "SELECT status FROM tasks WHERE id = $1 FOR UPDATE SKIP LOCKED",
            &[&task_id],
        )
        .await?;
    if locked.is_none() {
        let exists: bool = tx
            .value(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE id = $1)",
                &[&task_id],
            )
            .await?;
        if !exists {
            return Err(BoardError::TaskNotFound(task_id.to_owned()).into());
        }
        // Another claimer or writer holds the card's row right now.
        return Ok(None);
    }
    let sql = format!(
        "INSERT INTO task_runs (task_id, profile, status, claim_lock, claim_expires, started_at, lease_ttl)
         SELECT t.id, t.assignee, 'running', $2, $3, $4, $5 FROM tasks t
          WHERE t.id = $1 AND t.status = 'ready' AND t.claim_lock IS NULL
            AND t.held_reason IS NULL AND NOT EXISTS ({OPEN_PARENT})
         RETURNING id"
    );
    let opened = tx
        .query_opt(&sql, &[&task_id, &claim_lock, &expires, &now, &ttl])
        .await?;
    let Some(opened) = opened else {
        let card = existing_card(tx, task_id).await?;
        if card.status == kanban_core::TaskStatus::Ready
            && card.claim_lock.is_none()
            && card.open_parents
        {
            apply(tx, task_id, &rules::reject_claim_for_parents(), now).await?;
        }
        return Ok(None);
    };
    let run_id: i64 = col(&opened, 0)?;
    let granted = tx
        .query_opt(
            "UPDATE tasks SET status = 'running', claim_lock = $2, claim_expires = $3, current_run_id = $5,
                              started_at = COALESCE(started_at, $4), last_heartbeat_at = NULL
              WHERE id = $1 AND status = 'ready' AND claim_lock IS NULL
              RETURNING goal_mode, assignee",
            &[&task_id, &claim_lock, &expires, &now, &run_id],
        )
        .await?;
    let Some(granted) = granted else {
        return Err(BoardError::Storage(format!(
            "claim of {task_id} lost its compare-and-set inside its own transaction"
        ))
        .into());
    };
    let goal_mode: bool = col(&granted, 0)?;
    let assignee: Option<String> = col(&granted, 1)?;
    let rerun: bool = tx
        .value(
            "SELECT EXISTS (SELECT 1 FROM task_runs WHERE task_id = $1 AND id < $2)",
            &[&task_id, &run_id],
        )
        .await?;
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
    )
    .await?;
    Ok(Some(ClaimGrant {
        claim,
        claim_expires: expires,
        goal_mode,
        rerun,
        assignee,
    }))
}

/// What a board knows about the run when its exit is booked.
async fn exit_history(
    tx: &mut Conn,
    claim: &Claim,
    scope: Option<&str>,
) -> Result<ExitHistory, tokio_postgres::Error> {
    let scan = STREAK_SCAN_LIMIT as i64;
    let recent_outcomes = tx
        .query(
            "SELECT outcome FROM task_runs WHERE task_id = $1 AND ended_at IS NOT NULL
              ORDER BY id DESC LIMIT $2",
            &[&claim.task_id, &scan],
        )
        .await?
        .iter()
        .map(|row| Ok(col::<Option<String>>(row, 0)?.unwrap_or_default()))
        .collect::<Result<_, tokio_postgres::Error>>()?;
    let recorded_signal = tx
        .query_opt(
            "SELECT payload FROM task_events
              WHERE task_id = $1 AND kind = 'worker_signalled' AND run_id = $2
              ORDER BY id DESC LIMIT 1",
            &[&claim.task_id, &claim.run_id],
        )
        .await?
        .map(|row| col::<Option<Value>>(&row, 0))
        .transpose()?
        .flatten()
        // A record without a reason predates reasons: it was a shutdown.
        .map(|payload| {
            payload["reason"]
                .as_str()
                .and_then(SignalReason::parse)
                .unwrap_or(SignalReason::Shutdown)
        });
    // Two dispatchers booking exits of one scope take turns, so neither
    // arms or lifts a wall from a stale read of it: the scope's advisory
    // lock covers a wall not armed yet, the row lock one that stands.
    if let Some(scope) = scope {
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 1))",
            &[&scope],
        )
        .await?;
    }
    let sql = format!(
        "SELECT {WALL_COLUMNS} FROM provider_walls WHERE scope = $1 OR probe_run = $2 FOR UPDATE"
    );
    let walls = tx
        .query(&sql, &[&scope.unwrap_or(""), &claim.run_id])
        .await?
        .iter()
        .map(wall_from_row)
        .collect::<Result<_, _>>()?;
    Ok(ExitHistory {
        recent_outcomes,
        recorded_signal,
        walls,
    })
}

#[async_trait]
impl DispatchBoard for PgBoard {
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError> {
        let db = self.url().to_owned();
        snapshot!(self, |conn, _now| {
            let rows = conn
                .query(
                    "SELECT t.id, t.current_run_id, t.claim_lock, t.worker_pid, t.claim_expires,
                            t.last_heartbeat_at, t.worker_started_at, r.started_at, t.max_runtime_seconds,
                            r.worker_seal, t.assignee
                       FROM tasks t JOIN task_runs r ON r.id = t.current_run_id
                      WHERE t.status = 'running' AND t.claim_lock IS NOT NULL
                      ORDER BY t.current_run_id",
                    &[],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(RunningWorker {
                        claim: Claim {
                            task_id: col(row, 0)?,
                            db: db.clone(),
                            run_id: col(row, 1)?,
                            claim_lock: col(row, 2)?,
                            board: None,
                        },
                        worker_pid: col(row, 3)?,
                        claim_expires: col(row, 4)?,
                        last_heartbeat_at: col(row, 5)?,
                        worker_started_at: col(row, 6)?,
                        run_started_at: col(row, 7)?,
                        max_runtime_seconds: col(row, 8)?,
                        seal_digest: col(row, 9)?,
                        assignee: col(row, 10)?,
                    })
                })
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()
                .map_err(TxError::from)
        })
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
        if claim_locks.is_empty() {
            return Ok(Vec::new());
        }
        // The admitted assignees (NULL: every card), so one prepared
        // statement serves every filter.
        let admitted: Option<Vec<String>> = filter
            .assignees
            .as_ref()
            .map(|set| set.iter().cloned().collect());
        let limit = i64::try_from(claim_locks.len()).unwrap_or(i64::MAX);
        let db = self.url().to_owned();
        transaction!(self, |tx, now| {
            // Walk the ready lane in order, skipping the rows other claimers
            // hold (they are theirs this instant); a held card (backoff,
            // cooldown, an operator's hold) is skipped by the query.
            let mut grants = Vec::new();
            let mut locks = claim_locks.iter();
            let mut lock = locks.next();
            let mut rounds = 0;
            while lock.is_some() && rounds < 4 {
                rounds += 1;
                let candidates: Vec<String> = tx
                    .query(
                        "SELECT t.id FROM tasks t
                          WHERE t.status = 'ready' AND t.claim_lock IS NULL AND t.held_reason IS NULL
                            AND (t.not_before IS NULL OR t.not_before <= $1)
                            AND ($2::text[] IS NULL OR COALESCE(t.assignee, '') = ANY($2::text[]))
                          ORDER BY t.priority DESC, t.created_at ASC, t.seq ASC
                          LIMIT $3 FOR UPDATE OF t SKIP LOCKED",
                        &[&now, &admitted, &(limit + 8)],
                    )
                    .await?
                    .iter()
                    .map(|row| col(row, 0))
                    .collect::<Result<_, _>>()?;
                if candidates.is_empty() {
                    break;
                }
                // An id no kanban wrote (`../x`) is never claimed: ids name
                // log files and reach workers' environments.
                for id in candidates
                    .into_iter()
                    .filter(|id| kanban_core::is_valid_task_id(id))
                {
                    let Some(claim_lock) = lock else { break };
                    if let Some(grant) =
                        claim_in(tx, &db, &id, ttl_seconds, claim_lock, now).await?
                    {
                        grants.push(grant);
                        lock = locks.next();
                    }
                }
            }
            Ok(grants)
        })
    }

    async fn record_ticks(&self, host: &str, ticks: &TickDurations) -> Result<(), BoardError> {
        transaction!(self, |tx, _now| {
            // Counts for `kanban metrics`: one lost in a crash misleads nobody.
            tx.commit_unsynced();
            let add = "INSERT INTO dispatcher_ticks (host, bucket, count) VALUES ($1, $2, $3)
                       ON CONFLICT (host, bucket) DO UPDATE SET count = dispatcher_ticks.count + excluded.count";
            for (bucket, count) in ticks.buckets.iter().enumerate() {
                if *count > 0 {
                    let bucket = bucket as i64;
                    let count = i64::try_from(*count).unwrap_or(i64::MAX);
                    tx.execute(add, &[&host, &bucket, &count]).await?;
                }
            }
            let sum = i64::try_from(ticks.sum_ms).unwrap_or(i64::MAX);
            tx.execute(add, &[&host, &-1_i64, &sum]).await?;
            Ok(())
        })
    }

    async fn walls(&self) -> Result<Vec<Wall>, BoardError> {
        snapshot!(self, |conn, _now| {
            let sql = format!("SELECT {WALL_COLUMNS} FROM provider_walls ORDER BY until, scope");
            conn.query(&sql, &[])
                .await?
                .iter()
                .map(wall_from_row)
                .collect::<Result<Vec<_>, _>>()
                .map_err(TxError::from)
        })
    }

    async fn start_probe(&self, claim: &Claim, scopes: &[String]) -> Result<bool, BoardError> {
        transaction!(self, |tx, now| {
            // The walls' rows stay locked to the commit: a second dispatcher
            // probing the same wall waits here, then reads this probe.
            tx.query(
                "SELECT 1 FROM provider_walls WHERE scope = ANY($1) ORDER BY scope FOR UPDATE",
                &[&scopes],
            )
            .await?;
            for scope in scopes {
                let barred: bool = tx
                    .value(
                        "SELECT EXISTS (SELECT 1 FROM provider_walls w
                          WHERE w.scope = $1
                            AND (w.until > $2
                                 OR (w.probe_run IS NOT NULL AND w.probe_run != $3
                                     AND EXISTS (SELECT 1 FROM tasks t
                                                  WHERE t.current_run_id = w.probe_run
                                                    AND t.status = 'running'
                                                    AND t.claim_lock IS NOT NULL))))",
                        &[scope, &now, &claim.run_id],
                    )
                    .await?;
                if barred {
                    return Ok(false);
                }
            }
            for scope in scopes {
                tx.execute(
                    "UPDATE provider_walls SET probe_run = $2 WHERE scope = $1",
                    &[scope, &claim.run_id],
                )
                .await?;
            }
            let event = events::wall_probe(claim, scopes);
            append_event(tx, &claim.task_id, &event, now).await?;
            Ok(true)
        })
    }

    async fn record_spawn(&self, claim: &Claim, process: &WorkerProcess) -> Result<(), BoardError> {
        let pid = i64::from(process.pid);
        transaction!(self, |tx, now| {
            let changed = tx
                .execute(
                    "UPDATE tasks SET worker_pid = $4, worker_started_at = $5
                      WHERE id = $1 AND status = 'running' AND current_run_id = $2 AND claim_lock = $3",
                    &[
                        &claim.task_id,
                        &claim.run_id,
                        &claim.claim_lock,
                        &pid,
                        &process.started_at,
                    ],
                )
                .await?;
            if changed != 1 {
                return Err(BoardError::LeaseLost {
                    task_id: claim.task_id.clone(),
                    reason: NotLive::RunMoved { current: 0 },
                }
                .into());
            }
            tx.execute(
                "UPDATE task_runs SET worker_pid = $2, worker_started_at = $3, worker_seal = $4 WHERE id = $1",
                &[&claim.run_id, &pid, &process.started_at, &process.seal_digest],
            )
            .await?;
            let event = events::spawned(claim, process);
            append_event(tx, &claim.task_id, &event, now).await?;
            Ok(())
        })
    }

    async fn record_signal(
        &self,
        claim: &Claim,
        signal: i32,
        reason: SignalReason,
    ) -> Result<(), BoardError> {
        transaction!(self, |tx, now| {
            let event = events::worker_signalled(claim, signal, reason);
            append_event(tx, &claim.task_id, &event, now).await?;
            Ok(())
        })
    }

    async fn extend_lease(
        &self,
        claim: &Claim,
        expires: i64,
        record: Option<(&'static str, &'static str)>,
    ) -> Result<bool, BoardError> {
        transaction!(self, |tx, now| {
            let card = existing_card(tx, &claim.task_id).await?;
            if !rules::holds_claim(&card, claim) {
                return Ok(false);
            }
            if card.claim_expires.is_none_or(|current| current < expires) {
                tx.execute(
                    "UPDATE tasks SET claim_expires = $2 WHERE id = $1",
                    &[&claim.task_id, &expires],
                )
                .await?;
                tx.execute(
                    "UPDATE task_runs SET claim_expires = $2 WHERE id = $1",
                    &[&claim.run_id, &expires],
                )
                .await?;
            }
            if let Some((kind, reason)) = record {
                let event = events::lease_record(claim, kind, reason, expires);
                append_event(tx, &claim.task_id, &event, now).await?;
            }
            Ok(true)
        })
    }

    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError> {
        let payload: Option<Value> = snapshot!(self, |conn, _now| {
            match conn
                .query_opt(
                    "SELECT payload FROM task_events
                      WHERE task_id = $1 AND kind = 'worker_result' AND run_id = $2
                      ORDER BY id DESC LIMIT 1",
                    &[&claim.task_id, &claim.run_id],
                )
                .await?
            {
                Some(row) => Ok(col::<Option<Value>>(&row, 0)?),
                None => Ok(None),
            }
        })?;
        // Run-scoped and lock-checked.
        Ok(payload
            .and_then(|payload| serde_json::from_value::<WorkerResult>(payload).ok())
            .filter(|result| result.claim_lock == claim.claim_lock))
    }

    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError> {
        transaction!(self, |tx, now| {
            let card = existing_card(tx, &claim.task_id).await?;
            let scope = report.wall.as_ref().map(|wall| wall.scope.as_str());
            let history = exit_history(tx, claim, scope).await?;
            let (booking, transition) = rules::book_exit(&card, claim, &history, report, now);
            if transition.only_records() {
                // The exit of a run its worker settled (synced): the card is
                // already where it ends, and a crash losing this record
                // loses only its event, which no rule reads back.
                tx.commit_unsynced();
            }
            apply(tx, &claim.task_id, &transition, now).await?;
            Ok(booking)
        })
    }

    async fn release_claim(
        &self,
        claim: &Claim,
        release: &Release,
        policy: &FailurePolicy,
    ) -> Result<bool, BoardError> {
        transaction!(self, |tx, now| {
            let card = existing_card(tx, &claim.task_id).await?;
            let Some(transition) = rules::release_claim(&card, claim, release, policy, now) else {
                return Ok(false);
            };
            apply(tx, &claim.task_id, &transition, now).await?;
            Ok(true)
        })
    }

    async fn check_health(&self) -> Result<(), BoardError> {
        // A server out of reach is passing: the calls that follow fail and
        // pause claiming until it is back. What makes a PostgreSQL board
        // unsafe to write is a schema newer than this build's (a newer
        // kanban upgraded it meanwhile).
        let found = async {
            snapshot!(self, |conn, _now| {
                let version: Option<i64> = conn
                    .value("SELECT MAX(version) FROM kanban_schema", &[])
                    .await?;
                Ok(version)
            })
        }
        .await;
        match found {
            Ok(Some(found)) if found > crate::SCHEMA_VERSION => Err(BoardError::NewerSchema {
                path: self.url().to_owned(),
                found,
                supported: crate::SCHEMA_VERSION,
            }),
            _ => Ok(()),
        }
    }

    async fn promote_ready(&self) -> Result<usize, BoardError> {
        transaction!(self, |tx, now| {
            // Cards another transaction holds are promoted on a later tick.
            let sql = format!(
                "SELECT t.id FROM tasks t WHERE t.status = 'todo' AND NOT EXISTS ({OPEN_PARENT})
                  ORDER BY t.seq FOR UPDATE OF t SKIP LOCKED"
            );
            let todo: Vec<String> = tx
                .query(&sql, &[])
                .await?
                .iter()
                .map(|row| col(row, 0))
                .collect::<Result<_, _>>()?;
            let mut promoted = 0;
            for id in &todo {
                let card = existing_card(tx, id).await?;
                if let Some(transition) = rules::promote(&card) {
                    apply(tx, id, &transition, now).await?;
                    promoted += 1;
                }
            }
            Ok(promoted)
        })
    }
}
