//! The kanban board on a SQLite file: fenced claims and the read-only lease proof.
//!
//! [`SqliteBoard`] is core's three board ports (`Board`, `BoardAdmin`,
//! `DispatchBoard`) over the [`Sqlite`] engine: the steps are the shared
//! board's (`kanban-board`), and this crate keeps the file, its connection,
//! its transactions, its SQL and its migrations. Every worker write checks
//! its fence inside the same `BEGIN IMMEDIATE` transaction that writes.
//! [`prove_lease`] is the worker's proof before a retry: read-only, fail closed.
//!
//! rusqlite is synchronous: without an [`Offload`], each call runs on the
//! caller's thread; an async host gives the board an offload so that a call
//! waiting on a busy lock never blocks its executor.

mod engine;
mod proof;
mod schema;
mod store;
mod watch;

use std::path::Path;
use std::sync::Arc;

use kanban_board::StoredBoard;
use kanban_core::{BoardError, Clock};

pub use engine::Sqlite;
/// The wall clock (the shared board's), kept here for callers.
pub use kanban_board::SystemClock;
/// The board's counts for metrics (core's type, kept here for callers).
pub use kanban_core::BoardStats;
pub use proof::{LeaseProver, prove_lease};
pub use schema::{MIGRATIONS, SCHEMA_VERSION};
pub use store::{MEMORY_BOARD, Offload, Upgrade};
pub use watch::ChangeWatch;

/// A kanban board stored in one SQLite file (or in memory).
#[derive(Clone, Debug)]
pub struct SqliteBoard(StoredBoard<Sqlite>);

kanban_board::board_ports!(SqliteBoard, Sqlite);

impl SqliteBoard {
    fn of(store: store::Store) -> Self {
        Self(StoredBoard::new(Sqlite::new(store)))
    }

    /// Creates the board file (and its folder) if needed, and brings its
    /// schema up to date.
    pub fn create(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        store::Store::create(path.as_ref(), clock).map(Self::of)
    }

    /// Opens an existing board file for reading and writing, bringing its
    /// schema up to date. A missing file, a file that is not SQLite and a
    /// board written by a newer version are refused and left untouched.
    pub fn open(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        store::Store::open(path.as_ref(), clock).map(Self::of)
    }

    /// Opens a board for reading only: a board of the seed system (schema
    /// version 0) is read through an upgraded copy in memory and its file is
    /// never written; writes through it are refused.
    pub fn open_for_reading(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BoardError> {
        store::Store::open_for_reading(path.as_ref(), clock).map(Self::of)
    }

    /// Upgrades a board file to this build's schema, after copying it to a
    /// backup beside it (owner-only). A board already up to date is left
    /// alone and no backup is made, so running it twice is harmless.
    pub fn upgrade(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Upgrade, BoardError> {
        store::Store::upgrade(path.as_ref(), clock)
    }

    /// A board in this process's memory, named [`MEMORY_BOARD`] in claims.
    pub fn open_in_memory(clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        store::Store::in_memory(clock).map(Self::of)
    }

    /// This board, running its blocking work through `offload`.
    #[must_use]
    pub fn with_offload(mut self, offload: Arc<dyn Offload>) -> Self {
        self.0.engine_mut().set_offload(offload);
        self
    }

    /// Its shared board, to run over an engine that wraps this one.
    pub fn into_stored(self) -> StoredBoard<Sqlite> {
        self.0
    }

    /// The board file.
    pub fn path(&self) -> &Path {
        &self.engine().store.path
    }
}
