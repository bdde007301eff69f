//! Integration tests of the SQLite board, all on real files.

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

mod bad_input;
mod concurrency;
mod contract;
mod listings;
mod owner_seam;
mod proof;
mod state_machine;
mod steps;
mod store;

use std::path::Path;
use std::sync::Arc;

use kanban_board_sqlite::SqliteBoard;
use kanban_testkit::VirtualClock;

/// A fresh board file in `dir`, reading time from `time`.
fn board_in(dir: &Path, time: &VirtualClock) -> SqliteBoard {
    SqliteBoard::create(dir.join("kanban.db"), Arc::new(time.clone())).expect("create a board")
}
