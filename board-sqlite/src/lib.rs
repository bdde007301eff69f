//! The kanban board on a SQLite file: fenced claims and the read-only lease proof.
//!
//! [`SqliteBoard`] implements core's `Board` (a worker's view) and
//! `BoardAdmin` (the dispatcher's and operator's view). Every worker write
//! checks its fence (task running, same run open, same claim lock, unexpired
//! lease) inside the same `BEGIN IMMEDIATE` transaction that writes.
//! [`prove_lease`] is the worker's proof before a retry: read-only, fail closed.
//!
//! The ports are async for the hosts' sake, but rusqlite is synchronous: each
//! call runs to completion on the caller's thread. A worker holds one board
//! and makes one call at a time, so nothing waits behind it.

mod board;
mod proof;
mod schema;

pub use board::SqliteBoard;
pub use proof::prove_lease;
pub use schema::{MIGRATIONS, SCHEMA_VERSION};

/// The wall clock, in whole epoch seconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl kanban_core::Clock for SystemClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| {
                i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
            })
    }
}
