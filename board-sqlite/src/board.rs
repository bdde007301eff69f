//! The SQLite board.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::lease::evaluate_lease;
use kanban_core::{
    Board, BoardAdmin, BoardError, Booking, BookingInput, BookingKind, Claim, ClaimGrant, Clock,
    DispatchBoard, EventRecord, ExitReport, ExitWitness, NewTask, NotLive, ProofIdentity,
    ProofRequest, RunRecord, RunStatus, RunningWorker, TaskRecord, TaskStatus, TaskView,
    WorkerResult, book_worker_exit,
};
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior,
    params,
};
use serde_json::{Value, json};

use crate::proof::{lease_view, prove_lease};
use crate::schema::{MIGRATIONS, SCHEMA_VERSION};

/// How long one statement waits for another writer before SQLite says busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// Whole-transaction retries on `SQLITE_BUSY` beyond the busy timeout.
const BUSY_RETRIES: u32 = 8;

const TASK_COLUMNS: &str = "id, title, body, assignee, status, priority, created_at, claim_lock, \
    claim_expires, current_run_id, worker_pid, goal_mode, goal_max_turns, max_retries, \
    consecutive_failures, result";
const RUN_COLUMNS: &str = "id, task_id, status, claim_lock, claim_expires, worker_pid, started_at, ended_at, outcome, summary, error, worker_started_at, hold_until";

/// Why a write transaction did not return a value.
enum TxError {
    Sql(rusqlite::Error),
    /// Roll back and fail.
    Board(BoardError),
    /// Commit what was written (a `stale_write_rejected` event) and fail.
    CommitThen(BoardError),
}

impl From<rusqlite::Error> for TxError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sql(error)
    }
}

impl From<BoardError> for TxError {
    fn from(error: BoardError) -> Self {
        Self::Board(error)
    }
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Turns a SQLite error into a board error that names the file and the fix.
fn storage_error(path: &Path, error: &rusqlite::Error) -> BoardError {
    let path_text = path.display().to_string();
    let unusable = |message: String| BoardError::Unusable {
        path: path_text.clone(),
        message,
    };
    match error.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => unusable(
            "is not a SQLite board file; point --db at a board, or create one with `kanban init`".to_owned(),
        ),
        Some(ErrorCode::DatabaseCorrupt) => unusable(format!(
            "is damaged ({error}); restore it from a backup, or start a new board with `kanban init --db NEW_PATH`"
        )),
        Some(ErrorCode::ReadOnly) => unusable(
            "is read-only for this user; make it and its folder writable, or copy it somewhere writable".to_owned(),
        ),
        Some(ErrorCode::DiskFull) => unusable("cannot grow: the disk is full; free some space and retry".to_owned()),
        Some(ErrorCode::CannotOpen) => unusable(format!(
            "cannot be opened ({error}); check that its folder exists and is writable"
        )),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => BoardError::Busy { attempts: BUSY_RETRIES },
        _ => BoardError::Storage(format!("{path_text}: {error}")),
    }
}

const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Refuses a file that is not SQLite before SQLite gets to touch it.
fn check_header(path: &Path) -> Result<(), BoardError> {
    use std::io::Read;
    let unusable = |message: String| BoardError::Unusable {
        path: path.display().to_string(),
        message,
    };
    let mut file =
        std::fs::File::open(path).map_err(|error| unusable(format!("cannot be read: {error}")))?;
    let mut header = Vec::with_capacity(100);
    file.by_ref()
        .take(100)
        .read_to_end(&mut header)
        .map_err(|error| unusable(format!("cannot be read: {error}")))?;
    if header.is_empty() {
        return Ok(()); // SQLite treats an empty file as an empty database.
    }
    if header.len() < 100 || &header[..16] != SQLITE_HEADER {
        return Err(unusable(
            "is not a SQLite board file (it does not start with the SQLite header); point --db at a board, \
             or create one with `kanban init`"
                .to_owned(),
        ));
    }
    Ok(())
}

fn status_of(raw: &str) -> rusqlite::Result<TaskStatus> {
    TaskStatus::parse(raw).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            4,
            rusqlite::types::Type::Text,
            format!("unknown task status {raw:?}").into(),
        )
    })
}

fn task_from_row(row: &Row<'_>) -> rusqlite::Result<TaskRecord> {
    Ok(TaskRecord {
        id: row.get(0)?,
        title: row.get(1)?,
        body: row.get(2)?,
        assignee: row.get(3)?,
        status: status_of(&row.get::<_, String>(4)?)?,
        priority: row.get::<_, Option<i64>>(5)?.unwrap_or(0),
        created_at: row.get(6)?,
        claim_lock: row.get(7)?,
        claim_expires: row.get(8)?,
        current_run_id: row.get(9)?,
        worker_pid: row.get(10)?,
        goal_mode: row.get::<_, i64>(11)? != 0,
        goal_max_turns: row.get(12)?,
        max_retries: row.get(13)?,
        consecutive_failures: row.get(14)?,
        result: row.get(15)?,
    })
}

fn run_from_row(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
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
        hold_until: row.get(12)?,
    })
}

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<EventRecord> {
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

/// Appends an event; a null payload is stored as NULL.
fn append_event(
    tx: &Connection,
    task_id: &str,
    run_id: Option<i64>,
    kind: &str,
    payload: &Value,
    now: i64,
) -> rusqlite::Result<()> {
    let payload = (!payload.is_null()).then(|| payload.to_string());
    tx.prepare_cached("INSERT INTO task_events (task_id, run_id, kind, payload, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![task_id, run_id, kind, payload, now])?;
    Ok(())
}

/// The fence of every worker write, checked inside the write's transaction.
/// On failure the only change is a `stale_write_rejected` event.
fn fence(tx: &Transaction<'_>, claim: &Claim, action: &str, now: i64) -> Result<(), TxError> {
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
        let payload = json!({"action": action, "run_id": claim.run_id, "claim_lock": claim.claim_lock, "reason": reason.code()});
        append_event(
            tx,
            &claim.task_id,
            Some(claim.run_id),
            "stale_write_rejected",
            &payload,
            now,
        )?;
    }
    Err(TxError::CommitThen(BoardError::LeaseLost {
        task_id: claim.task_id.clone(),
        reason,
    }))
}

/// Closes the task's open run and clears its claim.
fn close_run(
    tx: &Connection,
    task_id: &str,
    status: &str,
    outcome: &str,
    summary: Option<&str>,
    error: Option<&str>,
    now: i64,
) -> rusqlite::Result<()> {
    tx.execute(
        "UPDATE task_runs SET ended_at = ?2, status = ?3, outcome = ?4, summary = ?5, error = ?6
          WHERE id = (SELECT current_run_id FROM tasks WHERE id = ?1) AND ended_at IS NULL",
        params![task_id, now, status, outcome, summary, error],
    )?;
    tx.execute(
        "UPDATE tasks SET current_run_id = NULL, claim_lock = NULL, claim_expires = NULL,
                          worker_pid = NULL, worker_started_at = NULL
          WHERE id = ?1",
        params![task_id],
    )?;
    Ok(())
}

fn open_parents(tx: &Connection, task_id: &str) -> rusqlite::Result<i64> {
    tx.prepare_cached(
        "SELECT COUNT(*) FROM task_links l JOIN tasks p ON p.id = l.parent_id
          WHERE l.child_id = ?1 AND p.status NOT IN ('done', 'archived')",
    )?
    .query_row(params![task_id], |row| row.get(0))
}

/// Puts a card back in line (ready, or todo while a parent is open) with its
/// failure count reset, as an unblock or an operator reclaim does.
fn requeue(tx: &Connection, task_id: &str) -> rusqlite::Result<&'static str> {
    let landing = if open_parents(tx, task_id)? > 0 {
        "todo"
    } else {
        "ready"
    };
    tx.execute(
        "UPDATE tasks SET status = ?2, consecutive_failures = 0, last_failure_error = NULL WHERE id = ?1",
        params![task_id, landing],
    )?;
    Ok(landing)
}

fn read_task(conn: &Connection, task_id: &str) -> rusqlite::Result<Option<TaskRecord>> {
    conn.query_row(
        &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"),
        params![task_id],
        task_from_row,
    )
    .optional()
}

fn claim_in(
    tx: &Connection,
    db: &str,
    task_id: &str,
    ttl_seconds: i64,
    claim_lock: &str,
    now: i64,
) -> Result<Option<ClaimGrant>, TxError> {
    let ttl = ttl_seconds.max(1);
    let expires = now.saturating_add(ttl);
    // The happy path in one statement: open a run only for a ready,
    // unclaimed card whose parents are all done. Why a claim failed is asked
    // only when it did.
    let opened = tx
        .prepare_cached(
            "INSERT INTO task_runs (task_id, profile, status, claim_lock, claim_expires, started_at)
             SELECT t.id, t.assignee, 'running', ?2, ?3, ?4 FROM tasks t
              WHERE t.id = ?1 AND t.status = 'ready' AND t.claim_lock IS NULL
                AND NOT EXISTS (
                    SELECT 1 FROM task_links l JOIN tasks p ON p.id = l.parent_id
                     WHERE l.child_id = t.id AND p.status NOT IN ('done', 'archived'))",
        )?
        .execute(params![task_id, claim_lock, expires, now])?;
    if opened == 0 {
        let row: Option<(String, Option<String>)> = tx
            .prepare_cached("SELECT status, claim_lock FROM tasks WHERE id = ?1")?
            .query_row(params![task_id], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let Some((status, lock)) = row else {
            return Err(BoardError::TaskNotFound(task_id.to_owned()).into());
        };
        if status == "ready" && lock.is_none() && open_parents(tx, task_id)? > 0 {
            tx.execute(
                "UPDATE tasks SET status = 'todo' WHERE id = ?1 AND status = 'ready'",
                params![task_id],
            )?;
            append_event(
                tx,
                task_id,
                None,
                "claim_rejected",
                &json!({"reason": "parents_not_done"}),
                now,
            )?;
        }
        return Ok(None);
    }
    let run_id = tx.last_insert_rowid();
    // The compare-and-set: only a ready, unclaimed card becomes ours. The
    // IMMEDIATE transaction already excludes other writers; the guard keeps
    // the statement honest on its own.
    let changed = tx
        .prepare_cached(
            "UPDATE tasks SET status = 'running', claim_lock = ?2, claim_expires = ?3, current_run_id = ?5,
                              started_at = COALESCE(started_at, ?4), last_heartbeat_at = NULL
              WHERE id = ?1 AND status = 'ready' AND claim_lock IS NULL",
        )?
        .execute(params![task_id, claim_lock, expires, now, run_id])?;
    if changed != 1 {
        return Err(BoardError::Storage(format!(
            "claim of {task_id} lost its compare-and-set inside its own transaction"
        ))
        .into());
    }
    let payload = json!({"lock": claim_lock, "expires": expires, "run_id": run_id, "ttl": ttl});
    append_event(tx, task_id, Some(run_id), "claimed", &payload, now)?;
    Ok(Some(ClaimGrant {
        claim: Claim {
            task_id: task_id.to_owned(),
            db: db.to_owned(),
            run_id,
            claim_lock: claim_lock.to_owned(),
            board: None,
        },
        claim_expires: expires,
    }))
}

/// A kanban board stored in one SQLite file.
pub struct SqliteBoard {
    path: PathBuf,
    conn: Mutex<Connection>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SqliteBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBoard")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteBoard {
    /// Creates the board file (and its folder) if needed, and brings its
    /// schema up to date.
    pub fn create(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let path = path.as_ref();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|error| BoardError::Unusable {
                path: path.display().to_string(),
                message: format!("its folder {} cannot be created: {error}", parent.display()),
            })?;
        }
        if path.exists() {
            check_header(path)?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(path, flags, clock)
    }

    /// Opens an existing board file for reading and writing, bringing its
    /// schema up to date. A missing file, a file that is not SQLite and a
    /// board written by a newer version are refused and left untouched.
    pub fn open(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(BoardError::Unusable {
                path: path.display().to_string(),
                message:
                    "does not exist; create the board with `kanban init`, or name another with --db"
                        .to_owned(),
            });
        }
        check_header(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(path, flags, clock)
    }

    fn open_with(path: &Path, flags: OpenFlags, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let fail = |error: rusqlite::Error| storage_error(path, &error);
        let conn = Connection::open_with_flags(path, flags).map_err(fail)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        // Refuse a newer board before touching it: no pragma that writes runs first.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(fail)?;
        if version > SCHEMA_VERSION {
            return Err(BoardError::NewerSchema {
                path: path.display().to_string(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .map_err(fail)?;
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(fail)?;
        let board = Self {
            path: path.to_owned(),
            conn: Mutex::new(conn),
            clock,
        };
        board.migrate()?;
        Ok(board)
    }

    fn migrate(&self) -> Result<(), BoardError> {
        self.write(|tx, _| {
            let version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
            if version > SCHEMA_VERSION {
                return Err(BoardError::NewerSchema {
                    path: self.path.display().to_string(),
                    found: version,
                    supported: SCHEMA_VERSION,
                }
                .into());
            }
            for (index, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
                tx.execute_batch(migration)?;
                tx.execute_batch(&format!("PRAGMA user_version = {}", index + 1))?;
            }
            Ok(())
        })
    }

    /// The board file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn db(&self) -> String {
        self.path.display().to_string()
    }

    /// Runs `body` in a `BEGIN IMMEDIATE` transaction, retrying the whole
    /// transaction a bounded number of times while SQLite reports busy.
    fn write<T>(
        &self,
        mut body: impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = self.clock.now();
            let outcome = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                match body(&tx, now) {
                    Ok(value) => {
                        tx.commit()?;
                        Ok(Ok(value))
                    }
                    Err(TxError::CommitThen(error)) => {
                        tx.commit()?;
                        Ok(Err(error))
                    }
                    Err(TxError::Board(error)) => Ok(Err(error)),
                    Err(TxError::Sql(error)) => Err(error),
                }
            })();
            match outcome {
                Ok(result) => return result,
                Err(error) if is_busy(&error) && attempt < BUSY_RETRIES => {
                    // Jitter so that racing writers do not retry in lockstep.
                    let jitter =
                        20 + (u64::from(std::process::id()) * 7 + u64::from(attempt) * 31) % 130;
                    std::thread::sleep(Duration::from_millis(jitter));
                }
                Err(error) if is_busy(&error) => {
                    return Err(BoardError::Busy { attempts: attempt });
                }
                Err(error) => return Err(storage_error(&self.path, &error)),
            }
        }
    }

    /// Runs a read on the board's connection.
    fn read<T>(
        &self,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, BoardError> {
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        body(&conn).map_err(|error| storage_error(&self.path, &error))
    }
}

#[async_trait]
impl Board for SqliteBoard {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        // The proof reads the file the claim pins, read-only, exactly as a
        // worker in another language would.
        prove_lease(&ProofRequest::for_claim(claim), identity, self.clock.now())
    }

    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        self.write(|tx, now| {
            fence(tx, claim, "bind", now)?;
            append_event(
                tx,
                &claim.task_id,
                Some(claim.run_id),
                "worker_bound",
                &json!({"pid": pid, "claim_lock": claim.claim_lock}),
                now,
            )?;
            Ok(())
        })
    }

    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError> {
        // A result is a record of what happened, not a change of the card: it
        // is booked for the run the claim opened even after the lease lapsed,
        // so the dispatcher can read the exit code back.
        let payload =
            serde_json::to_value(result).map_err(|e| BoardError::Storage(e.to_string()))?;
        self.write(|tx, now| {
            let owned: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM task_runs WHERE id = ?1 AND task_id = ?2 AND claim_lock = ?3)",
                params![claim.run_id, claim.task_id, claim.claim_lock],
                |row| row.get(0),
            )?;
            if !owned {
                return Err(BoardError::LeaseLost { task_id: claim.task_id.clone(), reason: NotLive::RunNotFound }.into());
            }
            append_event(tx, &claim.task_id, Some(claim.run_id), "worker_result", &payload, now)?;
            Ok(())
        })
    }

    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        let found = self.read(|conn| {
            let task: Option<(String, Option<i64>)> = conn
                .query_row(
                    "SELECT status, current_run_id FROM tasks WHERE id = ?1",
                    params![claim.task_id],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            let run: Option<(Option<i64>, Option<String>)> = conn
                .query_row(
                    "SELECT ended_at, outcome FROM task_runs WHERE id = ?1 AND task_id = ?2",
                    params![claim.run_id, claim.task_id],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            Ok((task, run))
        })?;
        let (Some((status, current)), run) = found else {
            return Err(BoardError::TaskNotFound(claim.task_id.clone()));
        };
        Ok(match run {
            Some((None, _)) if status == "running" && current == Some(claim.run_id) => {
                RunStatus::Running
            }
            Some((Some(_), Some(outcome))) if outcome == "completed" => RunStatus::Done,
            Some((Some(_), Some(outcome))) if outcome == "blocked" => RunStatus::Blocked,
            _ => RunStatus::Superseded,
        })
    }

    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        self.write(|tx, now| {
            fence(tx, claim, "heartbeat", now)?;
            let ttl = tx
                .query_row(
                    "SELECT payload FROM task_events WHERE task_id = ?1 AND kind = 'claimed' AND run_id = ?2
                      ORDER BY id DESC LIMIT 1",
                    params![claim.task_id, claim.run_id],
                    |row| row.get::<_, Option<String>>(0),
                )
                .optional()?
                .flatten()
                .and_then(|payload| serde_json::from_str::<Value>(&payload).ok())
                .and_then(|payload| payload["ttl"].as_i64())
                .unwrap_or(kanban_core::DEFAULT_CLAIM_TTL_SECONDS);
            let expires = now.saturating_add(ttl);
            tx.execute(
                "UPDATE tasks SET claim_expires = ?2, last_heartbeat_at = ?3 WHERE id = ?1",
                params![claim.task_id, expires, now],
            )?;
            tx.execute(
                "UPDATE task_runs SET claim_expires = ?2, last_heartbeat_at = ?3 WHERE id = ?1",
                params![claim.run_id, expires, now],
            )?;
            append_event(tx, &claim.task_id, Some(claim.run_id), "heartbeat", &json!({"note": note, "claim_expires": expires}), now)?;
            Ok(expires)
        })
    }

    async fn complete(
        &self,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> Result<(), BoardError> {
        self.write(|tx, now| {
            fence(tx, claim, "complete", now)?;
            close_run(tx, &claim.task_id, "done", "completed", Some(summary), None, now)?;
            tx.execute(
                "UPDATE tasks SET status = 'done', result = ?2, completed_at = ?3, consecutive_failures = 0,
                                  last_failure_error = NULL
                  WHERE id = ?1",
                params![claim.task_id, result.as_deref().unwrap_or(summary), now],
            )?;
            append_event(tx, &claim.task_id, Some(claim.run_id), "completed", &json!({"summary": summary}), now)?;
            Ok(())
        })
    }

    async fn block(&self, claim: &Claim, reason: &str) -> Result<(), BoardError> {
        self.write(|tx, now| {
            fence(tx, claim, "block", now)?;
            close_run(
                tx,
                &claim.task_id,
                "blocked",
                "blocked",
                Some(reason),
                None,
                now,
            )?;
            tx.execute(
                "UPDATE tasks SET status = 'blocked' WHERE id = ?1",
                params![claim.task_id],
            )?;
            append_event(
                tx,
                &claim.task_id,
                Some(claim.run_id),
                "blocked",
                &json!({"reason": reason}),
                now,
            )?;
            Ok(())
        })
    }

    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        self.write(|tx, now| {
            fence(tx, claim, "comment", now)?;
            tx.execute(
                "INSERT INTO task_comments (task_id, author, body, created_at) VALUES (?1, ?2, ?3, ?4)",
                params![claim.task_id, author, text, now],
            )?;
            append_event(tx, &claim.task_id, Some(claim.run_id), "commented", &json!({"author": author}), now)?;
            Ok(())
        })
    }

    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: Value,
    ) -> Result<(), BoardError> {
        self.write(|tx, now| {
            fence(tx, claim, "append_event", now)?;
            append_event(tx, &claim.task_id, Some(claim.run_id), kind, &payload, now)?;
            Ok(())
        })
    }
}

#[async_trait]
impl BoardAdmin for SqliteBoard {
    async fn create_task(&self, new: &NewTask) -> Result<String, BoardError> {
        if new.title.trim().is_empty() {
            return Err(BoardError::InvalidInput(
                "a task needs a non-blank title".to_owned(),
            ));
        }
        self.write(|tx, now| {
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
            let mut parents_open = false;
            for parent in &new.parents {
                let status: Option<String> =
                    tx.query_row("SELECT status FROM tasks WHERE id = ?1", params![parent], |row| row.get(0)).optional()?;
                match status {
                    None => return Err(BoardError::TaskNotFound(parent.clone()).into()),
                    Some(status) => parents_open |= status != "done",
                }
            }
            let status = if new.start_blocked {
                TaskStatus::Blocked
            } else if parents_open {
                TaskStatus::Todo
            } else {
                TaskStatus::Ready
            };
            let id = loop {
                let candidate: String = tx.query_row("SELECT 't_' || lower(hex(randomblob(4)))", [], |row| row.get(0))?;
                let taken: bool = tx.query_row("SELECT EXISTS (SELECT 1 FROM tasks WHERE id = ?1)", params![candidate], |row| row.get(0))?;
                if !taken {
                    break candidate;
                }
            };
            tx.execute(
                "INSERT INTO tasks (id, title, body, assignee, status, priority, created_at, idempotency_key,
                                    max_retries, goal_mode, goal_max_turns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
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
                    new.goal_max_turns
                ],
            )?;
            for parent in &new.parents {
                tx.execute("INSERT OR IGNORE INTO task_links (parent_id, child_id) VALUES (?1, ?2)", params![parent, id])?;
            }
            let payload = json!({"status": status.as_str(), "parents": new.parents, "assignee": new.assignee});
            append_event(tx, &id, None, "created", &payload, now)?;
            match status {
                TaskStatus::Blocked => append_event(tx, &id, None, "blocked", &json!({"reason": "initial_status"}), now)?,
                TaskStatus::Todo => append_event(tx, &id, None, "dependency_wait", &json!({"reason": "parent_not_done"}), now)?,
                _ => {}
            }
            Ok(id)
        })
    }

    async fn claim_task(
        &self,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let db = self.db();
        self.write(|tx, now| claim_in(tx, &db, task_id, ttl_seconds, claim_lock, now))
    }

    async fn claim_next(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let db = self.db();
        self.write(|tx, now| {
            let candidates: Vec<String> = {
                let mut statement = tx.prepare_cached(
                    "SELECT id FROM tasks WHERE status = 'ready' AND claim_lock IS NULL
                      ORDER BY priority DESC, created_at ASC, rowid ASC LIMIT 32",
                )?;
                statement
                    .query_map([], |row| row.get(0))?
                    .collect::<rusqlite::Result<_>>()?
            };
            for id in candidates {
                if let Some(grant) = claim_in(tx, &db, &id, ttl_seconds, claim_lock, now)? {
                    return Ok(Some(grant));
                }
            }
            Ok(None)
        })
    }

    async fn unblock(&self, task_id: &str) -> Result<(), BoardError> {
        self.write(|tx, now| {
            let status: Option<String> = tx
                .query_row(
                    "SELECT status FROM tasks WHERE id = ?1",
                    params![task_id],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(status) = status else {
                return Err(BoardError::TaskNotFound(task_id.to_owned()).into());
            };
            if status != "blocked" {
                return Err(BoardError::InvalidTransition {
                    task_id: task_id.to_owned(),
                    status,
                    action: "unblock",
                }
                .into());
            }
            let landing = requeue(tx, task_id)?;
            append_event(
                tx,
                task_id,
                None,
                "unblocked",
                &json!({"status": landing}),
                now,
            )?;
            Ok(())
        })
    }

    async fn reclaim(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        self.write(|tx, now| {
            let row: Option<(String, Option<String>, Option<i64>)> = tx
                .query_row(
                    "SELECT status, claim_lock, current_run_id FROM tasks WHERE id = ?1",
                    params![task_id],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .optional()?;
            let Some((status, lock, run_id)) = row else {
                return Err(BoardError::TaskNotFound(task_id.to_owned()).into());
            };
            if status != "running" {
                return Err(BoardError::InvalidTransition {
                    task_id: task_id.to_owned(),
                    status,
                    action: "reclaim",
                }
                .into());
            }
            close_run(
                tx,
                task_id,
                "reclaimed",
                "reclaimed",
                None,
                Some(&format!("manual_reclaim: {reason}")),
                now,
            )?;
            let landing = requeue(tx, task_id)?;
            let payload =
                json!({"manual": true, "reason": reason, "prev_lock": lock, "status": landing});
            append_event(tx, task_id, run_id, "reclaimed", &payload, now)?;
            Ok(())
        })
    }

    async fn release_stale_claims(&self, failure_limit: u32) -> Result<Vec<String>, BoardError> {
        self.write(|tx, now| {
            type Stale = (String, Option<String>, Option<i64>, u32, Option<u32>);
            let stale: Vec<Stale> = {
                let mut statement = tx.prepare_cached(
                    "SELECT id, claim_lock, current_run_id, consecutive_failures, max_retries FROM tasks
                      WHERE status = 'running' AND claim_expires IS NOT NULL AND claim_expires < ?1",
                )?;
                statement
                    .query_map(params![now], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)))?
                    .collect::<rusqlite::Result<_>>()?
            };
            for (id, lock, run_id, failures, max_retries) in &stale {
                let error = format!("stale_lock={}", lock.as_deref().unwrap_or(""));
                close_run(tx, id, "reclaimed", "reclaimed", None, Some(&error), now)?;
                let failures = failures + 1;
                let blocks = failures >= max_retries.unwrap_or(failure_limit).max(1);
                let landing = if blocks { "blocked" } else { "ready" };
                tx.execute(
                    "UPDATE tasks SET status = ?2, consecutive_failures = ?3, last_failure_error = ?4 WHERE id = ?1",
                    params![id, landing, failures, error],
                )?;
                let payload = json!({"stale_lock": lock, "now": now, "failures": failures, "blocked": blocks});
                append_event(tx, id, *run_id, "reclaimed", &payload, now)?;
                if blocks {
                    append_event(tx, id, *run_id, "gave_up", &json!({"trigger": "reclaimed", "failures": failures}), now)?;
                }
            }
            Ok(stale.into_iter().map(|(id, ..)| id).collect())
        })
    }

    async fn promote_ready(&self) -> Result<usize, BoardError> {
        self.write(|tx, now| {
            let promotable: Vec<String> = {
                let mut statement = tx.prepare_cached(
                    "SELECT t.id FROM tasks t WHERE t.status = 'todo' AND NOT EXISTS (
                        SELECT 1 FROM task_links l JOIN tasks p ON p.id = l.parent_id
                         WHERE l.child_id = t.id AND p.status NOT IN ('done', 'archived'))",
                )?;
                statement
                    .query_map([], |row| row.get(0))?
                    .collect::<rusqlite::Result<_>>()?
            };
            for id in &promotable {
                tx.execute(
                    "UPDATE tasks SET status = 'ready' WHERE id = ?1 AND status = 'todo'",
                    params![id],
                )?;
                append_event(tx, id, None, "promoted", &Value::Null, now)?;
            }
            Ok(promotable.len())
        })
    }

    async fn show_task(&self, task_id: &str) -> Result<TaskView, BoardError> {
        let view = self.read(|conn| {
            let Some(task) = read_task(conn, task_id)? else { return Ok(None) };
            let runs = conn
                .prepare_cached(&format!("SELECT {RUN_COLUMNS} FROM task_runs WHERE task_id = ?1 ORDER BY id"))?
                .query_map(params![task_id], run_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            let events = conn
                .prepare_cached("SELECT id, task_id, run_id, kind, payload, created_at FROM task_events WHERE task_id = ?1 ORDER BY id")?
                .query_map(params![task_id], event_from_row)?
                .collect::<rusqlite::Result<_>>()?;
            Ok(Some(TaskView { task, runs, events }))
        })?;
        view.ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()))
    }

    async fn list_tasks(&self, status: Option<TaskStatus>) -> Result<Vec<TaskRecord>, BoardError> {
        self.read(|conn| {
            let mut statement = conn.prepare_cached(&format!(
                "SELECT {TASK_COLUMNS} FROM tasks WHERE ?1 IS NULL OR status = ?1 ORDER BY created_at, rowid"
            ))?;
            statement.query_map(params![status.map(TaskStatus::as_str)], task_from_row)?.collect()
        })
    }

    async fn recent_events(&self, limit: usize) -> Result<Vec<EventRecord>, BoardError> {
        let mut events: Vec<EventRecord> = self.read(|conn| {
            conn.prepare_cached("SELECT id, task_id, run_id, kind, payload, created_at FROM task_events ORDER BY id DESC LIMIT ?1")?
                .query_map(params![limit as i64], event_from_row)?
                .collect()
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

impl SqliteBoard {
    /// Test and operator hook: sets both lease expiries of a task's current run.
    pub fn set_lease_expiry(&self, task_id: &str, expires: i64) -> Result<(), BoardError> {
        self.write(|tx, _| {
            tx.execute("UPDATE tasks SET claim_expires = ?2 WHERE id = ?1", params![task_id, expires])?;
            tx.execute(
                "UPDATE task_runs SET claim_expires = ?2 WHERE id = (SELECT current_run_id FROM tasks WHERE id = ?1)",
                params![task_id, expires],
            )?;
            Ok(())
        })
    }

    /// Reads one task row, if it exists.
    pub fn task(&self, task_id: &str) -> Result<Option<TaskRecord>, BoardError> {
        self.read(|conn| read_task(conn, task_id))
    }
}

/// Counts the protocol violations booked in a row, newest first; rate-limit
/// runs do not break the streak, anything else does.
fn violation_streak(tx: &Connection, task_id: &str) -> rusqlite::Result<u32> {
    let mut statement = tx.prepare_cached(
        "SELECT outcome FROM task_runs WHERE task_id = ?1 AND ended_at IS NOT NULL ORDER BY id DESC LIMIT 50",
    )?;
    let outcomes: Vec<Option<String>> = statement
        .query_map(params![task_id], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut streak = 0;
    for outcome in outcomes {
        match outcome.as_deref() {
            Some("rate_limited") => continue,
            Some("protocol_violation") => streak += 1,
            _ => break,
        }
    }
    Ok(streak)
}

fn witness_json(witness: ExitWitness) -> (Option<i32>, Option<i32>) {
    match witness {
        ExitWitness::Code(code) => (Some(code), None),
        ExitWitness::Signal(signal) => (None, Some(signal)),
        ExitWitness::Unknown => (None, None),
    }
}

/// The error text a booking leaves on the run and the card.
fn booking_error(booking: &Booking, witness: ExitWitness, tail: &str) -> String {
    let how = match witness {
        ExitWitness::Code(code) => format!("exited with code {code}"),
        ExitWitness::Signal(signal) => format!("was killed by signal {signal}"),
        ExitWitness::Unknown => "ended, and nothing says how".to_owned(),
    };
    let what = match booking.kind {
        BookingKind::ProtocolViolation => "worker exited cleanly (rc=0) without kanban complete or kanban block: protocol violation; a run without a terminal board call counts as unfinished".to_owned(),
        BookingKind::RateLimited => "worker hit a transient provider wall (rc=75); requeued after the cooldown".to_owned(),
        BookingKind::TerminalProvider => "worker hit a provider failure that needs a human (rc=78)".to_owned(),
        BookingKind::Interrupted => "worker was interrupted by the dispatcher (rc=130)".to_owned(),
        BookingKind::Crashed | BookingKind::Settled => format!("worker {how}"),
    };
    if tail.trim().is_empty() {
        what
    } else {
        format!("{what}. Worker's last output: {:?}", tail.trim())
    }
}

#[async_trait]
impl DispatchBoard for SqliteBoard {
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError> {
        let db = self.db();
        self.read(|conn| {
            let mut statement = conn.prepare_cached(
                "SELECT id, current_run_id, claim_lock, worker_pid, claim_expires, last_heartbeat_at, worker_started_at
                   FROM tasks WHERE status = 'running' ORDER BY current_run_id",
            )?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, Option<i64>>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<i64>>(3)?,
                    row.get::<_, Option<i64>>(4)?,
                    row.get::<_, Option<i64>>(5)?,
                    row.get::<_, Option<i64>>(6)?,
                ))
            })?;
            let mut workers = Vec::new();
            for row in rows {
                let (task_id, run_id, lock, worker_pid, claim_expires, last_heartbeat_at, worker_started_at) = row?;
                let (Some(run_id), Some(claim_lock)) = (run_id, lock) else {
                    continue;
                };
                workers.push(RunningWorker {
                    claim: Claim {
                        task_id,
                        db: db.clone(),
                        run_id,
                        claim_lock,
                        board: None,
                    },
                    worker_pid,
                    worker_started_at,
                    claim_expires,
                    last_heartbeat_at,
                });
            }
            Ok(workers)
        })
    }

    async fn count_running(&self) -> Result<usize, BoardError> {
        self.read(|conn| {
            conn.prepare_cached("SELECT COUNT(*) FROM tasks WHERE status = 'running'")?
                .query_row([], |row| row.get::<_, i64>(0))
                .map(|count| count as usize)
        })
    }

    async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        rate_limit_cooldown: i64,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let db = self.db();
        self.write(|tx, now| {
            // Walk the ready lane in order; the cooldown check is one index
            // lookup per candidate, so the tick stays index-driven.
            let candidates: Vec<String> = {
                let mut statement = tx.prepare_cached(
                    "SELECT t.id FROM tasks t
                      WHERE t.status = 'ready' AND t.claim_lock IS NULL
                        AND NOT EXISTS (
                            SELECT 1 FROM task_runs r
                             WHERE r.id = (SELECT MAX(id) FROM task_runs WHERE task_id = t.id)
                               AND r.outcome = 'rate_limited' AND (r.ended_at > ?1 OR r.hold_until > ?2))
                      ORDER BY t.priority DESC, t.created_at ASC, t.rowid ASC LIMIT 32",
                )?;
                statement.query_map(params![now - rate_limit_cooldown, now], |row| row.get(0))?
                    .collect::<rusqlite::Result<_>>()?
            };
            for id in candidates {
                if let Some(grant) = claim_in(tx, &db, &id, ttl_seconds, claim_lock, now)? {
                    return Ok(Some(grant));
                }
            }
            Ok(None)
        })
    }

    async fn record_spawn(
        &self,
        claim: &Claim,
        pid: u32,
        started_at: Option<i64>,
    ) -> Result<(), BoardError> {
        self.write(|tx, now| {
            let changed = tx.execute(
                "UPDATE tasks SET worker_pid = ?4, worker_started_at = ?5
                  WHERE id = ?1 AND status = 'running' AND current_run_id = ?2 AND claim_lock = ?3",
                params![
                    claim.task_id,
                    claim.run_id,
                    claim.claim_lock,
                    pid,
                    started_at
                ],
            )?;
            if changed != 1 {
                return Err(BoardError::LeaseLost {
                    task_id: claim.task_id.clone(),
                    reason: NotLive::RunMoved { current: 0 },
                }
                .into());
            }
            tx.execute(
                "UPDATE task_runs SET worker_pid = ?2, worker_started_at = ?3 WHERE id = ?1",
                params![claim.run_id, pid, started_at],
            )?;
            append_event(
                tx,
                &claim.task_id,
                Some(claim.run_id),
                "spawned",
                &json!({"pid": pid, "started_at": started_at}),
                now,
            )?;
            Ok(())
        })
    }

    async fn record_signal(&self, claim: &Claim, signal: i32) -> Result<(), BoardError> {
        self.write(|tx, now| {
            append_event(
                tx,
                &claim.task_id,
                Some(claim.run_id),
                "worker_signalled",
                &json!({"signal": signal}),
                now,
            )?;
            Ok(())
        })
    }

    async fn extend_expired_lease(
        &self,
        claim: &Claim,
        expires: i64,
        kind: &str,
        reason: &str,
    ) -> Result<bool, BoardError> {
        self.write(|tx, now| {
            let changed = tx.execute(
                "UPDATE tasks SET claim_expires = ?4
                  WHERE id = ?1 AND status = 'running' AND current_run_id = ?2 AND claim_lock = ?3
                    AND claim_expires IS NOT NULL AND claim_expires < ?5",
                params![claim.task_id, claim.run_id, claim.claim_lock, expires, now],
            )?;
            if changed == 1 {
                tx.execute(
                    "UPDATE task_runs SET claim_expires = ?2 WHERE id = ?1",
                    params![claim.run_id, expires],
                )?;
                append_event(
                    tx,
                    &claim.task_id,
                    Some(claim.run_id),
                    kind,
                    &json!({"reason": reason, "claim_expires": expires}),
                    now,
                )?;
            }
            Ok(changed == 1)
        })
    }

    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError> {
        let payload: Option<String> = self.read(|conn| {
            conn.query_row(
                "SELECT payload FROM task_events
                  WHERE task_id = ?1 AND kind = 'worker_result' AND run_id = ?2
                  ORDER BY id DESC LIMIT 1",
                params![claim.task_id, claim.run_id],
                |row| row.get(0),
            )
            .optional()
            .map(Option::flatten)
        })?;
        // Run-scoped and lock-checked: a dispatcher claims every card with
        // the same lock, so the lock alone cannot tell runs apart.
        Ok(payload
            .and_then(|payload| serde_json::from_str::<WorkerResult>(&payload).ok())
            .filter(|result| result.claim_lock == claim.claim_lock))
    }

    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError> {
        self.write(|tx, now| {
            let row: Option<(String, Option<i64>, Option<String>, u32, Option<u32>)> = tx
                .query_row(
                    "SELECT status, current_run_id, claim_lock, consecutive_failures, max_retries FROM tasks WHERE id = ?1",
                    params![claim.task_id],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
                )
                .optional()?;
            let Some((status, run_id, lock, failures, max_retries)) = row else {
                return Err(BoardError::TaskNotFound(claim.task_id.clone()).into());
            };
            let still_running =
                status == "running" && run_id == Some(claim.run_id) && lock.as_deref() == Some(claim.claim_lock.as_str());
            let signalled_on_record: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM task_events WHERE task_id = ?1 AND kind = 'worker_signalled' AND run_id = ?2)",
                params![claim.task_id, claim.run_id],
                |row| row.get(0),
            )?;
            let input = BookingInput {
                witness: report.witness,
                still_running,
                signalled_by_dispatcher: report.signalled_by_dispatcher || signalled_on_record,
                violation_streak: violation_streak(tx, &claim.task_id)?,
                consecutive_failures: failures,
                failure_limit: max_retries.unwrap_or(report.default_failure_limit),
                violation_limit: max_retries.unwrap_or(kanban_core::PROTOCOL_VIOLATION_LIMIT),
            };
            let booking = book_worker_exit(input);
            let (exit_code, signal) = witness_json(report.witness);
            let tail: String = report.output_tail.chars().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect();
            if booking.kind == BookingKind::Settled {
                let payload = json!({"kind": "settled", "exit_code": exit_code, "signal": signal, "source": report.source, "output": tail});
                append_event(tx, &claim.task_id, Some(claim.run_id), "worker_exited", &payload, now)?;
                return Ok(booking);
            }
            let error = booking_error(&booking, report.witness, &tail);
            close_run(tx, &claim.task_id, booking.kind.as_str(), booking.kind.as_str(), None, Some(&error), now)?;
            let hold_until = report.retry_after_seconds.filter(|_| booking.cooldown).map(|s| now.saturating_add(s as i64));
            if let Some(hold_until) = hold_until {
                tx.execute("UPDATE task_runs SET hold_until = ?2 WHERE id = ?1", params![claim.run_id, hold_until])?;
            }
            let failures = failures + u32::from(booking.counts_failure);
            let landing = if booking.blocks { "blocked" } else { "ready" };
            tx.execute(
                "UPDATE tasks SET status = ?2, consecutive_failures = ?3, last_failure_error = ?4 WHERE id = ?1",
                params![claim.task_id, landing, failures, error],
            )?;
            let payload = json!({
                "kind": booking.kind.as_str(),
                "exit_code": exit_code,
                "signal": signal,
                "source": report.source,
                "counted": booking.counts_failure,
                "failures": failures,
                "blocked": booking.blocks,
                "cooldown": booking.cooldown,
                "hold_until": hold_until,
                "output": tail,
            });
            append_event(tx, &claim.task_id, Some(claim.run_id), booking.kind.as_str(), &payload, now)?;
            if booking.blocks {
                let payload = json!({"trigger": booking.kind.as_str(), "failures": failures, "sticky": true});
                append_event(tx, &claim.task_id, Some(claim.run_id), "gave_up", &payload, now)?;
            }
            Ok(booking)
        })
    }
}
