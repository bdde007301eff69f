//! The read-only lease proof (the seed's `worker_claim_is_live`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kanban_core::lease::{LeaseView, RunLease, TaskLease, evaluate_lease, required_coordinates};
use kanban_core::{NotLive, ProofIdentity, ProofRequest};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

/// Proves, read-only, that the claim in `request` is live at `now` and owned
/// by `identity`.
///
/// The three pinned coordinates (board file, run id, claim lock) and the
/// task id are required; a missing one is "not live", never a fallback to
/// some other board. The file is opened read-only and never created,
/// migrated or written. Anything that cannot be proven, an unreadable file
/// included, is "not live" with a reason. Only the columns of the seed's
/// minimal board are read, so the proof works on any board that has them.
pub fn prove_lease(
    request: &ProofRequest,
    identity: ProofIdentity,
    now: i64,
) -> Result<(), NotLive> {
    let (task_id, db, run_id, claim_lock) = required_coordinates(request)?;
    let path = Path::new(db);
    if !path.is_file() {
        return Err(NotLive::BoardNotFound(db.to_owned()));
    }
    let view = read_view(path, task_id, identity)
        .map_err(|error| NotLive::Unreadable(error.to_string()))?;
    evaluate_lease(&view, run_id, claim_lock, identity, now)
}

/// The lease proof of one board, on one read-only connection kept open.
///
/// A worker proves before every retry; reopening the file each time is most
/// of the cost. Each proof checks the file's identity (device and inode)
/// with one `stat` and reads in a fresh read transaction, so it fails closed
/// exactly as [`prove_lease`] does: a deleted or moved board is "not found",
/// and a board replaced under the same name is read anew, never through the
/// old file's connection.
#[derive(Debug)]
pub struct LeaseProver {
    db: String,
    open: Mutex<Option<OpenProof>>,
}

#[derive(Debug)]
struct OpenProof {
    conn: Connection,
    identity: (u64, u64),
}

impl LeaseProver {
    /// A prover for the board file `db` (a claim's `HERMES_KANBAN_DB`).
    pub fn new(db: impl Into<String>) -> Self {
        Self {
            db: db.into(),
            open: Mutex::new(None),
        }
    }

    /// [`prove_lease`], on the kept connection when `request` pins this
    /// prover's board (else exactly [`prove_lease`]).
    pub fn prove(
        &self,
        request: &ProofRequest,
        identity: ProofIdentity,
        now: i64,
    ) -> Result<(), NotLive> {
        use std::os::unix::fs::MetadataExt;
        let (task_id, db, run_id, claim_lock) = required_coordinates(request)?;
        if db != self.db {
            return prove_lease(request, identity, now);
        }
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let path = PathBuf::from(db);
        let file = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => (meta.dev(), meta.ino()),
            _ => {
                *open = None;
                return Err(NotLive::BoardNotFound(db.to_owned()));
            }
        };
        if open.as_ref().map(|kept| kept.identity) != Some(file) {
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            let conn = Connection::open_with_flags(&path, flags)
                .map_err(|error| NotLive::Unreadable(error.to_string()))?;
            *open = Some(OpenProof {
                conn,
                identity: file,
            });
        }
        let Some(kept) = open.as_ref() else {
            return Err(NotLive::Unreadable(
                "the board could not be opened".to_owned(),
            ));
        };
        match read_in_transaction(&kept.conn, task_id, identity) {
            Ok(view) => evaluate_lease(&view, run_id, claim_lock, identity, now),
            Err(error) => {
                *open = None;
                Err(NotLive::Unreadable(error.to_string()))
            }
        }
    }
}

/// The proof's reads in one read transaction: one snapshot for both rows.
fn read_in_transaction(
    conn: &Connection,
    task_id: &str,
    identity: ProofIdentity,
) -> rusqlite::Result<LeaseView> {
    conn.execute_batch("BEGIN")?;
    let view = lease_view(conn, task_id, identity);
    let ended = conn.execute_batch("COMMIT");
    let view = view?;
    ended?;
    Ok(view)
}

fn read_view(path: &Path, task_id: &str, identity: ProofIdentity) -> rusqlite::Result<LeaseView> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags)?;
    lease_view(&conn, task_id, identity)
}

/// Reads the rows a lease proof needs, in whatever transaction `conn` is in.
pub(crate) fn lease_view(
    conn: &Connection,
    task_id: &str,
    identity: ProofIdentity,
) -> rusqlite::Result<LeaseView> {
    let task = conn
        .prepare_cached("SELECT status, worker_pid, current_run_id, claim_lock, claim_expires FROM tasks WHERE id = ?1")?
        .query_row(params![task_id], |row| {
                Ok(TaskLease {
                    status: row.get::<_, Option<String>>(0)?.unwrap_or_default(),
                    worker_pid: row.get(1)?,
                    current_run_id: row.get(2)?,
                    claim_lock: row.get(3)?,
                claim_expires: row.get(4)?,
            })
        })
        .optional()?;
    let run = match task.as_ref().and_then(|task| task.current_run_id) {
        None => None,
        Some(run_id) => conn
            .prepare_cached(
                "SELECT ended_at, worker_pid, claim_expires FROM task_runs WHERE id = ?1",
            )?
            .query_row(params![run_id], |row| {
                Ok(RunLease {
                    ended_at: row.get(0)?,
                    worker_pid: row.get(1)?,
                    claim_expires: row.get(2)?,
                })
            })
            .optional()?,
    };
    let newest_bound = match identity {
        ProofIdentity::BoundOwner(_) => conn
            .query_row(
                "SELECT payload FROM task_events WHERE task_id = ?1 AND kind = 'worker_bound' ORDER BY id DESC LIMIT 1",
                params![task_id],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()?
            .flatten()
            .and_then(|payload| serde_json::from_str::<serde_json::Value>(&payload).ok())
            .map(|payload| {
                (
                    payload["pid"].as_i64().unwrap_or(-1),
                    payload["claim_lock"].as_str().unwrap_or("").to_owned(),
                )
            }),
        _ => None,
    };
    Ok(LeaseView {
        task,
        run,
        newest_bound,
    })
}
