//! The seed test's synthetic board: a SQLite file with only the columns the
//! lease proof reads, and a live lease by default.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, params};

/// Any live lease for these tests (2100-01-01 UTC).
pub const FAR_FUTURE_EXPIRY: i64 = 4_102_444_800;

/// The rows of a synthetic board; every field is one coordinate of the proof.
#[derive(Clone, Debug)]
pub struct SyntheticBoard {
    pub status: &'static str,
    pub task_pid: Option<i64>,
    pub run_id: Option<i64>,
    pub lock: &'static str,
    pub run_ended: Option<i64>,
    pub run_pid: Option<i64>,
    pub task_expires: Option<i64>,
    pub run_expires: Option<i64>,
}

impl SyntheticBoard {
    /// Task `t_live`, running under run 1 with lock `lk`, owned by `pid`.
    pub fn live(pid: u32) -> Self {
        Self {
            status: "running",
            task_pid: Some(i64::from(pid)),
            run_id: Some(1),
            lock: "lk",
            run_ended: None,
            run_pid: Some(i64::from(pid)),
            task_expires: Some(FAR_FUTURE_EXPIRY),
            run_expires: Some(FAR_FUTURE_EXPIRY),
        }
    }

    /// The seed's claim-ownership matrix: each id with its one broken
    /// coordinate (`owned-live` breaks none).
    #[expect(
        clippy::too_many_lines,
        reason = "a data table: the seed's matrix, a row each"
    )]
    pub fn ownership_matrix(pid: u32) -> Vec<(&'static str, SyntheticBoard)> {
        let live = Self::live(pid);
        vec![
            ("owned-live", live.clone()),
            (
                "released-to-the-board",
                Self {
                    status: "ready",
                    ..live.clone()
                },
            ),
            (
                "other-process-owns-the-claim",
                Self {
                    task_pid: Some(999_999_999),
                    ..live.clone()
                },
            ),
            (
                "run-already-closed",
                Self {
                    run_ended: Some(12_345),
                    ..live.clone()
                },
            ),
            (
                "run-handed-to-another-pid",
                Self {
                    run_pid: Some(999_999_999),
                    ..live.clone()
                },
            ),
            (
                "no-live-run-pointer",
                Self {
                    run_id: None,
                    ..live.clone()
                },
            ),
            (
                "board-moved-to-another-run",
                Self {
                    run_id: Some(2),
                    ..live.clone()
                },
            ),
            (
                "claim-lock-no-longer-ours",
                Self {
                    lock: "other-lock",
                    ..live.clone()
                },
            ),
            (
                "task-lease-expired",
                Self {
                    task_expires: Some(1),
                    ..live.clone()
                },
            ),
            (
                "run-lease-expired",
                Self {
                    run_expires: Some(1),
                    ..live.clone()
                },
            ),
            (
                "null-task-lease-is-not-unbounded",
                Self {
                    task_expires: None,
                    ..live.clone()
                },
            ),
            (
                "null-run-lease-is-not-unbounded",
                Self {
                    run_expires: None,
                    ..live
                },
            ),
        ]
    }

    /// Writes the board as `dir/kanban.db`.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let db = dir.join("kanban.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT, worker_pid INTEGER,
               current_run_id INTEGER, claim_lock TEXT, claim_expires INTEGER);
             CREATE TABLE task_runs (id INTEGER PRIMARY KEY, ended_at INTEGER,
               worker_pid INTEGER, claim_expires INTEGER);",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO tasks VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                "t_live",
                self.status,
                self.task_pid,
                self.run_id,
                self.lock,
                self.task_expires
            ],
        )
        .unwrap();
        if let Some(run_id) = self.run_id {
            conn.execute(
                "INSERT INTO task_runs VALUES (?1, ?2, ?3, ?4)",
                params![run_id, self.run_ended, self.run_pid, self.run_expires],
            )
            .unwrap();
        }
        db
    }
}

/// Which lanes [`bulk_add_cards`] fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkLanes {
    /// Every card ready.
    AllReady,
    /// Every other card done, the rest ready.
    HalfDone,
}

/// Adds `cards` cards (ids `t_%08x`) to an existing board file in one
/// unsynchronised transaction, the oldest created `cards` seconds before
/// `now`. For benchmarks, where adding is not what is measured.
pub fn bulk_add_cards(path: &Path, cards: u64, lanes: BulkLanes, now: i64) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA synchronous = OFF; BEGIN;")
        .unwrap();
    let done_every: i64 = match lanes {
        BulkLanes::AllReady => 0,
        BulkLanes::HalfDone => 2,
    };
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO tasks (id, title, status, priority, created_at, completed_at)
         SELECT printf('t_%08x', i), 'card ' || i,
                CASE WHEN ?3 > 0 AND i % ?3 = 0 THEN 'done' ELSE 'ready' END,
                i % 5, ?2 - (?1 - i), CASE WHEN ?3 > 0 AND i % ?3 = 0 THEN ?2 END
           FROM n",
        params![i64::try_from(cards).unwrap_or(i64::MAX), now, done_every],
    )
    .unwrap();
    conn.execute_batch("COMMIT; PRAGMA synchronous = FULL;")
        .unwrap();
}
