//! The kanban board on a SQLite file: fenced claims and the read-only lease proof.
//!
//! [`SqliteBoard`] implements core's `Board` (a worker's view), `BoardAdmin`
//! (the operator's) and `DispatchBoard` (the dispatcher's). It keeps rows,
//! indexes and transactions; every rule (which limit applies, whether a
//! release counts, where a card lands) is core's, applied here inside the
//! transaction that reads the rows it needs. Every worker write checks its
//! fence (task running, same run open, same claim lock, unexpired lease)
//! inside the same `BEGIN IMMEDIATE` transaction that writes.
//! [`prove_lease`] is the worker's proof before a retry: read-only, fail closed.
//!
//! rusqlite is synchronous: without an [`Offload`], each call runs on the
//! caller's thread; an async host gives the board an offload so that a call
//! waiting on a busy lock never blocks its executor.

mod admin;
mod dispatch;
mod open;
mod proof;
mod rows;
mod schema;
mod worker;

/// The board's counts for metrics (core's type, kept here for callers).
pub use kanban_core::BoardStats;
pub use open::{ChangeWatch, MEMORY_BOARD, Offload, SqliteBoard, Upgrade};
pub use proof::{LeaseProver, prove_lease};
pub use schema::{MIGRATIONS, SCHEMA_VERSION};

/// The wall clock, in whole epoch seconds, and a monotonic clock beside it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

fn process_start() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

impl kanban_core::Clock for SystemClock {
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| {
                i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
            })
    }

    fn monotonic_millis(&self) -> u64 {
        u64::try_from(process_start().elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
