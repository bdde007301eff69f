//! Group commit: the fsync that makes a commit durable, shared by every
//! commit made while it waited.
//!
//! A connection commits with `synchronous = NORMAL`, so SQLite appends the
//! commit to the write-ahead log without syncing it, and releases the
//! connection at once. A call whose commit must be durable then waits here
//! for one `fsync` of the log that began after its commit: calls that
//! commit while a sync runs share the next one. WAL replays a prefix of the
//! log after a crash (each frame's checksum chains to the one before), so a
//! synced log holds every commit appended before the sync began.
//!
//! Before, each such commit synced the log itself, holding the connection
//! while it did: every other call of the dispatcher (and every worker's
//! call over its link) waited out each sync in turn.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// The commits of one connection and the syncs that made them durable.
#[derive(Debug, Default)]
pub(crate) struct SyncQueue {
    state: Mutex<SyncState>,
    synced: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    /// Commits made on the connection so far (their tickets are 1, 2, ...).
    committed: u64,
    /// Every commit up to this ticket is on the disk.
    durable: u64,
    /// A sync is running; it covers the commits up to the ticket it began at.
    running: bool,
}

impl SyncQueue {
    fn state(&self) -> MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The commits so far, and how many of them are known durable.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (u64, u64) {
        let state = self.state();
        (state.committed, state.durable)
    }

    /// Takes the ticket of a commit just made. Called while the connection
    /// is still held, so tickets follow the commits' order in the log.
    pub(crate) fn committed(&self) -> u64 {
        let mut state = self.state();
        state.committed += 1;
        state.committed
    }

    /// Returns once a sync that began after commit `ticket` succeeded: runs
    /// one when none is running, else waits for the running one and, if it
    /// began too early or failed, runs the next. A failed sync is reported
    /// to the call that ran it; each other call runs its own.
    pub(crate) fn wait_durable<E>(
        &self,
        ticket: u64,
        sync: impl Fn() -> Result<(), E>,
    ) -> Result<(), E> {
        let mut state = self.state();
        loop {
            if state.durable >= ticket {
                return Ok(());
            }
            if state.running {
                state = self
                    .synced
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            state.running = true;
            let covers = state.committed;
            drop(state);
            let result = sync();
            state = self.state();
            state.running = false;
            if result.is_ok() {
                state.durable = state.durable.max(covers);
            }
            self.synced.notify_all();
            result?;
        }
    }
}

/// Syncs a board's write-ahead log, and the board's folder once for each
/// log file it sees (a log SQLite made with `synchronous = NORMAL` was not
/// synced into its folder, and a crash could lose its name).
#[derive(Debug)]
pub(crate) struct LogSync {
    log: PathBuf,
    folder: PathBuf,
    /// The log file (device, inode) whose name is known to be on the disk.
    named: Mutex<Option<(u64, u64)>>,
}

impl LogSync {
    pub(crate) fn new(board: &Path) -> Self {
        let mut log = board.as_os_str().to_owned();
        log.push("-wal");
        let folder = match board.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
            _ => PathBuf::from("."),
        };
        Self {
            log: PathBuf::from(log),
            folder,
            named: Mutex::new(None),
        }
    }

    /// `fsync` of the log, opened by its name each time (the log exists
    /// while the connection that committed is open, and a handle kept from
    /// before could be a deleted file's); its folder too, the first time
    /// this log file is seen. `fsync`, as SQLite's own commits do:
    /// `fdatasync` of a log that grew measured slower here (210 against
    /// 175 µs a commit).
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let log = std::fs::File::open(&self.log)?;
        log.sync_all()?;
        let meta = log.metadata()?;
        let identity = (meta.dev(), meta.ino());
        let mut named = self.named.lock().unwrap_or_else(PoisonError::into_inner);
        if *named != Some(identity) {
            std::fs::File::open(&self.folder)?.sync_all()?;
            *named = Some(identity);
        }
        Ok(())
    }

    /// The log file this syncs.
    pub(crate) fn log(&self) -> &Path {
        &self.log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_commit_is_durable_only_after_a_sync_that_began_after_it() {
        let queue = SyncQueue::default();
        let syncs = AtomicUsize::new(0);
        let count = || -> Result<(), ()> {
            syncs.fetch_add(1, Ordering::SeqCst);
            Ok(())
        };
        let first = queue.committed();
        queue.wait_durable(first, count).unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 1);
        // Already covered: no second sync.
        queue.wait_durable(first, count).unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 1);
        // A later commit needs a sync of its own.
        let second = queue.committed();
        queue.wait_durable(second, count).unwrap();
        assert_eq!(syncs.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn commits_made_while_a_sync_runs_share_the_next_one() {
        let queue = Arc::new(SyncQueue::default());
        let syncs = Arc::new(AtomicUsize::new(0));
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let sync = {
            let syncs = syncs.clone();
            move || -> Result<(), ()> {
                let n = syncs.fetch_add(1, Ordering::SeqCst);
                if n == 0 {
                    // The first sync holds until three more commits queued.
                    entered_tx.send(()).unwrap();
                    release_rx.lock().unwrap().recv().unwrap();
                }
                Ok(())
            }
        };
        let sync = Arc::new(sync);
        let first = queue.committed();
        let runner = {
            let (queue, sync) = (queue.clone(), sync.clone());
            std::thread::spawn(move || queue.wait_durable(first, &*sync))
        };
        entered_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the first commit's wait never ran a sync");
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let ticket = queue.committed();
                let (queue, sync) = (queue.clone(), sync.clone());
                std::thread::spawn(move || queue.wait_durable(ticket, &*sync))
            })
            .collect();
        // Let the waiters reach the queue before the first sync ends.
        std::thread::sleep(std::time::Duration::from_millis(50));
        release_tx.send(()).unwrap();
        runner.join().unwrap().unwrap();
        for waiter in waiters {
            waiter.join().unwrap().unwrap();
        }
        // One sync for the first commit (it began before the others), one
        // shared by the three made while it ran.
        assert_eq!(syncs.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_failed_sync_is_reported_and_the_next_call_syncs_again() {
        let queue = SyncQueue::default();
        let attempts = AtomicUsize::new(0);
        let failing_once = || {
            if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                Err("no space left on device")
            } else {
                Ok(())
            }
        };
        let ticket = queue.committed();
        assert_eq!(
            queue.wait_durable(ticket, failing_once),
            Err("no space left on device")
        );
        // Not counted durable: the same ticket syncs again, and succeeds.
        assert_eq!(queue.wait_durable(ticket, failing_once), Ok(()));
        assert_eq!(attempts.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn the_log_and_its_folder_are_synced_and_a_missing_log_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let board = dir.path().join("board.db");
        let sync = LogSync::new(&board);
        assert_eq!(sync.log(), dir.path().join("board.db-wal"));
        assert!(sync.sync().is_err(), "no log yet");
        std::fs::write(sync.log(), b"frames").unwrap();
        sync.sync().unwrap();
        assert!(sync.named.lock().unwrap().is_some());
    }
}
