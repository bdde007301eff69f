//! A watch on a board file: has anybody committed since the last look?

use std::path::Path;

use kanban_core::BoardError;
use rusqlite::{Connection, OpenFlags};

use crate::store::storage_error;

/// Tells whether anybody committed to a board since it last looked: SQLite's
/// `PRAGMA data_version` on a read-only connection of its own, a few
/// microseconds per look, so a dispatcher can wake for a new card at once
/// instead of at its next tick, without busy polling.
#[derive(Debug)]
pub struct ChangeWatch {
    conn: Connection,
    seen: Option<i64>,
}

impl ChangeWatch {
    /// A watch on the board file at `path` (read-only; never creates it).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, BoardError> {
        let path = path.as_ref();
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| storage_error(path, &error))?;
        let mut watch = Self { conn, seen: None };
        watch.changed();
        Ok(watch)
    }

    /// True when a commit landed since the last call (the first call, and
    /// a board that cannot be read, say true: look, rather than miss one).
    pub fn changed(&mut self) -> bool {
        let now = self
            .conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut look| look.query_row([], |row| row.get::<_, i64>(0)))
            .ok();
        let changed = now.is_none() || now != self.seen;
        self.seen = now;
        changed
    }
}
