//! Test support for the kanban workspace: virtual time, scripted agents and
//! judges, boards in memory (SQLite's, so the same code and rules as a board
//! file), the board contract suite every board adapter must pass, and the
//! deterministic simulation of the whole protocol. A dev-dependency only.

mod agents;
pub mod board_contract;
pub mod board_machine;
mod census;
mod fake_host;
mod http_server;
mod invariants;
mod owner_seam;
pub mod pg;
mod scripted;
mod seed_cases;
pub mod sim;
mod synthetic;
mod time;
mod tls;
mod webhook;

pub use agents::{AgentScript, AgentTurn, WrittenAgent, write_executable, write_judge};
pub use census::{AgentCensus, CensusReport};
pub use fake_host::{FakeHost, FakeProcess};
pub use http_server::{Reply, ScriptedHttpServer};
pub use invariants::{BoardFigures, check_board_invariants};

/// A fresh board in memory, reading time from `clock`: SQLite's in-memory
/// database behind the real board, so every rule is the one a file gets.
pub fn memory_board(
    clock: std::sync::Arc<dyn kanban_core::Clock>,
) -> kanban_board_sqlite::SqliteBoard {
    kanban_board_sqlite::SqliteBoard::open_in_memory(clock).expect("an in-memory board opens")
}

/// A board for one test: in memory, or in a file in a temporary folder that
/// lives as long as the value.
#[derive(Debug)]
pub struct TempBoard {
    board: kanban_board_sqlite::SqliteBoard,
    _dir: Option<tempfile::TempDir>,
}

impl TempBoard {
    /// A board in memory.
    pub fn memory(clock: VirtualClock) -> Self {
        Self {
            board: memory_board(std::sync::Arc::new(clock)),
            _dir: None,
        }
    }

    /// A board file in a fresh temporary folder.
    pub fn file(clock: VirtualClock) -> Self {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let board = kanban_board_sqlite::SqliteBoard::create(
            dir.path().join("kanban.db"),
            std::sync::Arc::new(clock),
        )
        .expect("a board file");
        Self {
            board,
            _dir: Some(dir),
        }
    }
}

/// A board file in a fresh temporary folder, shared: the board, and the
/// folder (removed when dropped).
pub fn shared_file_board(
    clock: VirtualClock,
) -> (
    std::sync::Arc<kanban_board_sqlite::SqliteBoard>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let board = kanban_board_sqlite::SqliteBoard::create(
        dir.path().join("kanban.db"),
        std::sync::Arc::new(clock),
    )
    .expect("a board file");
    (std::sync::Arc::new(board), dir)
}

/// Makes the SQLite board file at `path` refuse, as a storage error, every
/// event `when` (an SQL condition over the row, `NEW`) holds for: a write
/// whose content the board cannot take, as PostgreSQL once refused NUL.
pub fn refuse_events(path: &std::path::Path, when: &str) {
    let connection = rusqlite::Connection::open(path).expect("the board file opens");
    connection
        .execute_batch(&format!(
            "CREATE TRIGGER refuse_events BEFORE INSERT ON task_events WHEN {when}
             BEGIN SELECT RAISE(ABORT, 'this event is refused'); END;"
        ))
        .expect("the trigger is made");
}

/// Undoes [`refuse_events`]: the board takes every event again.
pub fn accept_events(path: &std::path::Path) {
    let connection = rusqlite::Connection::open(path).expect("the board file opens");
    connection
        .execute_batch("DROP TRIGGER IF EXISTS refuse_events")
        .expect("the trigger is dropped");
}

impl std::ops::Deref for TempBoard {
    type Target = kanban_board_sqlite::SqliteBoard;

    fn deref(&self) -> &Self::Target {
        &self.board
    }
}
pub use owner_seam::{OWNER_LOCK, OwnerSeam, SeamOptions, SeamOutcome};
pub use pg::{ClusterOptions, PgCluster, TempPgBoard};
pub use scripted::{Recorded, ScriptedJudge, ScriptedRunner};
pub use seed_cases::{SeedCase, seed_owner_case, seed_owner_cases};
pub use synthetic::{BulkLanes, FAR_FUTURE_EXPIRY, SyntheticBoard, bulk_add_cards};
pub use time::{ScriptedClock, VirtualClock};
pub use tls::{LoopbackCertificates, loopback_certificates};
pub use webhook::{Hook, WebhookReceiver, unused_loopback_address};

/// The seed's result shapes, as builders.
pub use kanban_core::shapes;

/// Runs a future to completion on the current thread; core has no runtime.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// Starts `kanban … serve --listen 127.0.0.1:0` (the caller's command) and
/// reads the first line it prints: the child and its base URL
/// (`http://127.0.0.1:PORT`, no trailing slash).
pub fn start_server(mut command: std::process::Command) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kanban serve starts");
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().expect("its stdout"))
        .read_line(&mut first)
        .expect("kanban serve says where it listens");
    let url = first
        .trim()
        .rsplit(' ')
        .next()
        .unwrap_or("")
        .trim_end_matches('/')
        .to_owned();
    assert!(url.starts_with("http://"), "kanban serve said {first:?}");
    (child, url)
}
