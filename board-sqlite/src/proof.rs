//! The read-only lease proof (the seed's `worker_claim_is_live`).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kanban_board::{lease_from_row, lease_query};
use kanban_core::lease::{LeaseView, evaluate_lease, required_coordinates};
use kanban_core::{NotLive, ProofIdentity, ProofRequest};
use rusqlite::config::DbConfig;
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
    let view = read_view(path, task_id, identity).map_err(NotLive::Unreadable)?;
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
        let kept = match open.take() {
            Some(kept) if kept.identity == file => open.insert(kept),
            _ => {
                let conn = open_read_only(&path).map_err(NotLive::Unreadable)?;
                open.insert(OpenProof {
                    conn,
                    identity: file,
                })
            }
        };
        match read_in_transaction(&kept.conn, task_id, identity) {
            Ok(view) => evaluate_lease(&view, run_id, claim_lock, identity, now),
            Err(error) => {
                *open = None;
                Err(NotLive::Unreadable(error))
            }
        }
    }
}

/// The proof's read in one read transaction: one snapshot for both rows.
fn read_in_transaction(
    conn: &Connection,
    task_id: &str,
    identity: ProofIdentity,
) -> Result<LeaseView, String> {
    conn.execute_batch("BEGIN")
        .map_err(|error| error.to_string())?;
    let view = lease_view(conn, task_id, identity);
    let ended = conn.execute_batch("COMMIT");
    let view = view?;
    ended.map_err(|error| error.to_string())?;
    Ok(view)
}

fn read_view(path: &Path, task_id: &str, identity: ProofIdentity) -> Result<LeaseView, String> {
    let conn = open_read_only(path)?;
    lease_view(&conn, task_id, identity)
}

/// A read-only connection to the board file, never creating it.
fn open_read_only(path: &Path) -> Result<Connection, String> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(|error| error.to_string())?;
    // One plan per statement, as on the board's own connection: the proof's
    // query joins the card to its run on a bound id, and without this SQLite
    // plans it anew at every proof (five times the proof's cost).
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
        .map_err(|error| error.to_string())?;
    Ok(conn)
}

/// Reads the rows a lease proof needs (the board's shared query), in
/// whatever transaction `conn` is in.
fn lease_view(
    conn: &Connection,
    task_id: &str,
    identity: ProofIdentity,
) -> Result<LeaseView, String> {
    let row = conn
        .prepare_cached(&lease_query(identity))
        .and_then(|mut statement| {
            statement
                .query_row(params![task_id], crate::engine::row_of)
                .optional()
        })
        .map_err(|error| error.to_string())?;
    lease_from_row(row.as_ref()).map_err(|error| format!("{error:?}"))
}
