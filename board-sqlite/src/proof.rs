//! The read-only lease proof (the seed's `worker_claim_is_live`).

use std::path::Path;

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
        .query_row("SELECT status, worker_pid, current_run_id, claim_lock, claim_expires FROM tasks WHERE id = ?1", params![task_id], |row| {
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
            .query_row(
                "SELECT ended_at, worker_pid, claim_expires FROM task_runs WHERE id = ?1",
                params![run_id],
                |row| {
                    Ok(RunLease {
                        ended_at: row.get(0)?,
                        worker_pid: row.get(1)?,
                        claim_expires: row.get(2)?,
                    })
                },
            )
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
