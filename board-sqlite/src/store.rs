//! A board file: opening it as one board, migrating it, checking it is
//! still the one opened, and running transactions on its one connection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kanban_board::TxError;
use kanban_core::{BoardError, Clock};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};

use crate::schema::{MIGRATIONS, SCHEMA_VERSION};

/// How long one statement waits for another writer before SQLite says busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// The first and the longest pause of a statement waiting for the lock.
const BUSY_FIRST_PAUSE_MICROS: u64 = 50;
const BUSY_LONGEST_PAUSE_MICROS: u64 = 2_000;

/// How long the `attempt`-th wait for the lock pauses (from 0): doubling
/// from 50 µs to 1.6 ms, then 2 ms each; and how long the attempts before
/// it paused in all.
fn busy_pause(attempt: u32) -> (u64, u64) {
    // Past 16 doublings every pause is the longest (50 µs << 6 is already).
    let pause = |n: u32| (BUSY_FIRST_PAUSE_MICROS << n.min(16)).min(BUSY_LONGEST_PAUSE_MICROS);
    let first = (0..attempt.min(16)).map(pause).sum::<u64>();
    let rest = u64::from(attempt.saturating_sub(16)) * BUSY_LONGEST_PAUSE_MICROS;
    (pause(attempt), first + rest)
}

/// SQLite's busy handler: waits for another writer's commit in short
/// pauses. SQLite's own (`busy_timeout`) sleeps 1, 2, 5, 10, 15, 20, 25 ms
/// and on, so a lock held for a third of a millisecond, the usual commit
/// here, cost its waiter a millisecond or more and, with a dispatcher and
/// eight workers writing, most of a dispatcher's tick.
fn wait_for_lock(attempt: i32) -> bool {
    let (pause, before) = busy_pause(u32::try_from(attempt).unwrap_or(0));
    let limit = u64::try_from(BUSY_TIMEOUT.as_micros()).unwrap_or(u64::MAX);
    if before >= limit {
        return false;
    }
    std::thread::sleep(Duration::from_micros(pause));
    true
}
/// How many prepared statements a connection keeps. rusqlite keeps 16 by
/// default; the dispatcher's loop alone uses more than that, so each round
/// evicted statements it was about to need and SQLite parsed and planned
/// them again (`a_dispatched_card_s_calls_prepare_nothing_once_warm`).
pub(crate) const STATEMENT_CACHE: usize = 128;
/// Whole-transaction retries on `SQLITE_BUSY` beyond the busy timeout.
pub(crate) const BUSY_RETRIES: u32 = 8;
/// The name an in-memory board goes by, in claims and messages.
pub const MEMORY_BOARD: &str = ":memory:";

/// Where a board runs its blocking SQLite work.
///
/// Without one, every call runs on the caller's thread, which suits a
/// worker making one call at a time. An async host (the dispatcher, a web
/// server) hands the work to threads that may block, so that a board call
/// waiting on a busy lock never stalls its other work.
#[async_trait]
pub trait Offload: Send + std::marker::Sync + std::fmt::Debug {
    /// Runs `job` where it may block, and returns when it is done.
    async fn run(&self, job: Box<dyn FnOnce() + Send + 'static>);
}

/// A rusqlite error as a transaction's error.
pub(crate) fn sql(error: rusqlite::Error) -> TxError {
    TxError::engine(error)
}

/// What a transaction's error means for the board: its own error, or a
/// SQLite error named with the file and the fix.
fn board_error(path: &Path, error: TxError) -> Result<BoardError, rusqlite::Error> {
    let mut sqlite = None;
    let error = error.into_board_error(|error| match error.downcast::<rusqlite::Error>() {
        Ok(error) => {
            sqlite = Some(*error);
            BoardError::Storage(String::new())
        }
        Err(other) => BoardError::Storage(format!("{}: {other}", path.display())),
    });
    sqlite.map_or(Ok(error), Err)
}

/// A write's error that did not commit, as the board's.
pub(crate) fn unwritten(error: TxError) -> BoardError {
    error.into_board_error(|other| BoardError::Storage(other.to_string()))
}

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Turns a SQLite error into a board error that names the file and the fix.
pub(crate) fn storage_error(path: &Path, error: &rusqlite::Error) -> BoardError {
    let path_text = path.display().to_string();
    let unusable = |message: String| BoardError::Unusable {
        path: path_text.clone(),
        message,
    };
    match error.sqlite_error_code() {
        // SQLite reads the header before anything else, and writes nothing
        // to a file whose header is not its own: the first read refuses it.
        Some(ErrorCode::NotADatabase) => unusable(
            "is not a SQLite board file (it does not start with the SQLite header); point --db at a board, \
             or create one with `kanban init`"
                .to_owned(),
        ),
        Some(ErrorCode::DatabaseCorrupt) => unusable(format!(
            "is damaged ({error}); restore it from a backup, or start a new board with `kanban init --db NEW_PATH`"
        )),
        Some(ErrorCode::ReadOnly) => unusable(
            "is read-only for this user; make it and its folder writable, or copy it somewhere writable".to_owned(),
        ),
        Some(ErrorCode::DiskFull) => BoardError::DiskFull { path: path_text },
        Some(ErrorCode::CannotOpen) => unusable(format!(
            "cannot be opened ({error}); check that its folder exists and is writable"
        )),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => BoardError::Busy { attempts: BUSY_RETRIES },
        _ => BoardError::Storage(format!("{path_text}: {error}")),
    }
}

/// What a path names, checked before SQLite touches it: the one canonical,
/// absolute path of a regular file with a single name.
///
/// A second name (a hard link, or a symlink SQLite would not resolve) gives
/// SQLite a second lock and journal for the same bytes, which corrupts the
/// board; a FIFO would hang the open, and a folder is not a board.
pub(crate) fn inspect(path: &Path, allow_empty: bool) -> Result<PathBuf, BoardError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let unusable = |message: String| BoardError::Unusable {
        path: path.display().to_string(),
        message,
    };
    let canonical = match std::fs::canonicalize(path) {
        Ok(canonical) => canonical,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(unusable(
                "does not exist; create the board with `kanban init`, or name another with --db"
                    .to_owned(),
            ));
        }
        Err(error) => return Err(unusable(format!("cannot be resolved: {error}"))),
    };
    let meta = std::fs::metadata(&canonical)
        .map_err(|error| unusable(format!("cannot be read: {error}")))?;
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(unusable(
            "is a folder, not a board file; name the file itself (for example FOLDER/kanban.db)"
                .to_owned(),
        ));
    }
    if kind.is_fifo() || kind.is_socket() || kind.is_block_device() || kind.is_char_device() {
        return Err(unusable(
            "is not a regular file (a FIFO, socket or device); a board is a regular SQLite file"
                .to_owned(),
        ));
    }
    if meta.nlink() > 1 {
        return Err(unusable(format!(
            "has {} hard links; a board must have one name, or SQLite keeps a lock and a journal per name and corrupts it: \
             remove the other names (find / -xdev -samefile {}) or copy the board",
            meta.nlink(),
            canonical.display()
        )));
    }
    if meta.len() == 0 && !allow_empty {
        return Err(unusable(
            "is empty, not a board; `kanban init` makes it one".to_owned(),
        ));
    }
    Ok(canonical)
}

/// How a write's commit is synced. WAL only ever appends to its log and
/// replays it as a prefix, so a commit left unsynced becomes durable with
/// the next synced one, and a machine crash (or power loss) loses only a
/// tail of unsynced commits, never one from the middle; a crash of the
/// application loses nothing either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sync {
    /// `synchronous = FULL`: on the disk before the commit returns.
    Full,
    /// `synchronous = NORMAL` for this one commit: left to the next synced one.
    Normal,
}

/// The board's one connection and its clock.
pub(crate) struct Store {
    pub(crate) path: PathBuf,
    /// The board's name in claims: its path, or [`MEMORY_BOARD`].
    pub(crate) name: String,
    conn: Mutex<Connection>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The board file's device and inode when it was opened (none in memory).
    pub(crate) identity: Option<(u64, u64)>,
    /// An upgraded copy in memory of a board that must not be written.
    pub(crate) read_only_copy: bool,
    /// The lease proof of the claims on this board, made at the first proof.
    pub(crate) prover: std::sync::OnceLock<crate::proof::LeaseProver>,
}

/// What `kanban migrate` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upgrade {
    /// The board file, canonical.
    pub path: PathBuf,
    /// The schema version found.
    pub from: i64,
    /// The schema version now.
    pub to: i64,
    /// The copy taken before upgrading; none when nothing was to do.
    pub backup: Option<PathBuf>,
}

/// Which boards an open may upgrade in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Migrate {
    /// Boards of earlier kanban versions; a board of the seed system is
    /// refused until `kanban migrate`.
    OwnOnly,
    /// Any board (`init`, `migrate`, and in-memory copies).
    All,
}

fn schema_version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |row| row.get(0))
}

/// Whether the file already holds tables (a board of another program).
fn has_tables(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tasks')",
        [],
        |row| row.get(0),
    )
}

/// Adds the columns of `reference`'s tables that `tx`'s tables lack: the seed
/// system's boards predate some of them, and `CREATE TABLE IF NOT EXISTS`
/// leaves an existing table as it is.
fn add_missing_columns(tx: &Connection, reference: &Connection) -> rusqlite::Result<()> {
    // A column as `PRAGMA table_info` describes it: name, type, whether
    // it is NOT NULL, its default.
    type Column = (String, String, bool, Option<String>);
    let columns = |conn: &Connection, table: &str| -> rusqlite::Result<Vec<Column>> {
        let mut statement = conn.prepare(&format!("PRAGMA table_info({table})"))?;
        let rows = statement.query_map([], |row| {
            Ok((
                row.get(1)?,
                row.get(2)?,
                row.get::<_, i64>(3)? != 0,
                row.get(4)?,
            ))
        })?;
        rows.collect()
    };
    let tables: Vec<String> = {
        let mut statement = reference.prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'",
        )?;
        let rows = statement.query_map([], |row| row.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    for table in tables {
        let present: Vec<String> = columns(tx, &table)?
            .into_iter()
            .map(|column| column.0)
            .collect();
        for (name, kind, not_null, default) in columns(reference, &table)? {
            if present.contains(&name) {
                continue;
            }
            let mut clause = format!("ALTER TABLE {table} ADD COLUMN {name} {kind}");
            if let Some(default) = default {
                if not_null {
                    clause.push_str(" NOT NULL");
                }
                clause.push_str(&format!(" DEFAULT {default}"));
            }
            tx.execute_batch(&clause)?;
        }
    }
    Ok(())
}

/// Copies the board `from` whole into `to`.
fn copy_whole(from: &Connection, to: &mut Connection) -> rusqlite::Result<()> {
    rusqlite::backup::Backup::new(from, to)?.run_to_completion(256, Duration::ZERO, None)
}

/// A file's identity: its device and inode.
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

impl Store {
    /// The connection, for one transaction (a panic elsewhere while it was
    /// held left SQLite to roll back what it had begun).
    pub(crate) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn open_with(
        path: &Path,
        flags: OpenFlags,
        clock: Arc<dyn Clock>,
        migrate: Migrate,
    ) -> Result<Self, BoardError> {
        let fail = |error: rusqlite::Error| storage_error(path, &error);
        let conn = Connection::open_with_flags(path, flags).map_err(fail)?;
        Self::configure(path.to_owned(), conn, clock, migrate)
    }

    fn configure(
        path: PathBuf,
        mut conn: Connection,
        clock: Arc<dyn Clock>,
        migrate: Migrate,
    ) -> Result<Self, BoardError> {
        let fail = |error: rusqlite::Error| storage_error(&path, &error);
        conn.busy_handler(Some(wait_for_lock)).map_err(fail)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // A plan made once per statement. Without this, SQLite marks a
        // cached statement stale each time a value is bound where it might
        // change the plan (a bound `LIMIT` always does) and parses and plans
        // it again on its next step: ten of the statements a dispatched card
        // runs were prepared anew at every call, nearly all of a
        // dispatcher's preparing and a tenth of its CPU. This board keeps no
        // planner statistics, so a value
        // could never have bought a better plan
        // (`a_dispatched_card_s_calls_prepare_nothing_once_warm`).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)
            .map_err(fail)?;
        // Refuse a newer board before touching it: no pragma that writes runs first.
        let version = schema_version(&conn).map_err(fail)?;
        if migrate == Migrate::OwnOnly && version == 0 && has_tables(&conn).map_err(fail)? {
            return Err(BoardError::Unusable {
                path: path.display().to_string(),
                message: "was made by the seed system (schema version 0); kanban reads it as it is, \
                          but writes only after `kanban migrate` upgrades it (a backup is kept beside it)"
                    .to_owned(),
            });
        }
        if version > SCHEMA_VERSION {
            return Err(BoardError::NewerSchema {
                path: path.display().to_string(),
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .map_err(fail)?;
        conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA foreign_keys = ON;")
            .map_err(fail)?;
        let identity = file_identity(&path);
        let store = Self {
            name: path.display().to_string(),
            path,
            conn: Mutex::new(conn),
            clock,
            identity,
            read_only_copy: false,
            prover: std::sync::OnceLock::new(),
        };
        // An up-to-date board is not written at all on open: no write lock
        // is taken by every process that only opens it.
        if version < SCHEMA_VERSION {
            store.migrate()?;
        }
        Ok(store)
    }

    /// Creates the board file (and its folder) if needed, and brings its
    /// schema up to date.
    pub(crate) fn create(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let unusable = |message: String| BoardError::Unusable {
            path: path.display().to_string(),
            message,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            // Folders made here are the owner's alone: boards hold agents' work.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|error| {
                    unusable(format!(
                        "its folder {} cannot be created: {error}",
                        parent.display()
                    ))
                })?;
        }
        if std::fs::symlink_metadata(path).is_err() {
            // SQLite gives the -wal and -shm files the board file's mode.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|error| unusable(format!("cannot be created: {error}")))?;
        }
        let canonical = inspect(path, true)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let store = Self::open_with(&canonical, flags, clock, Migrate::All)?;
        Ok(store)
    }

    /// Opens an existing board file for reading and writing.
    pub(crate) fn open(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let canonical = inspect(path, false)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(&canonical, flags, clock, Migrate::OwnOnly)
    }

    /// A board's canonical path, a read-only connection to it and its
    /// schema version, with nothing written.
    fn peek(path: &Path) -> Result<(PathBuf, Connection, i64), BoardError> {
        let canonical = inspect(path, false)?;
        let fail = |error: rusqlite::Error| storage_error(&canonical, &error);
        let file = Connection::open_with_flags(
            &canonical,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(fail)?;
        file.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        let version = schema_version(&file).map_err(fail)?;
        Ok((canonical, file, version))
    }

    pub(crate) fn upgrade(path: &Path, clock: Arc<dyn Clock>) -> Result<Upgrade, BoardError> {
        use std::os::unix::fs::OpenOptionsExt;
        let (canonical, file, from) = Self::peek(path)?;
        let fail = |error: rusqlite::Error| storage_error(&canonical, &error);
        if from > SCHEMA_VERSION {
            return Err(BoardError::NewerSchema {
                path: canonical.display().to_string(),
                found: from,
                supported: SCHEMA_VERSION,
            });
        }
        if from == SCHEMA_VERSION {
            return Ok(Upgrade {
                path: canonical,
                from,
                to: SCHEMA_VERSION,
                backup: None,
            });
        }
        let mut name = canonical.clone().into_os_string();
        name.push(format!(".v{from}-{}.backup", clock.now()));
        let backup = PathBuf::from(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&backup)
            .map_err(|error| BoardError::Unusable {
                path: canonical.display().to_string(),
                message: format!(
                    "cannot be backed up to {}: {error}; free some space or make its folder writable",
                    backup.display()
                ),
            })?;
        copy_whole(&file, &mut Connection::open(&backup).map_err(fail)?).map_err(fail)?;
        drop(file);
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(&canonical, flags, clock, Migrate::All)?;
        Ok(Upgrade {
            path: canonical,
            from,
            to: SCHEMA_VERSION,
            backup: Some(backup),
        })
    }

    /// Opens a board for reading only. A board of the seed system (or of an
    /// older kanban) is read through an upgraded copy in memory, so that the
    /// file is never written; the copy refuses writes.
    pub(crate) fn open_for_reading(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let (canonical, file, version) = Self::peek(path)?;
        let fail = |error: rusqlite::Error| storage_error(&canonical, &error);
        if version == SCHEMA_VERSION {
            drop(file);
            let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
            return Self::open_with(&canonical, flags, clock, Migrate::OwnOnly);
        }
        let mut copy = Connection::open_in_memory().map_err(fail)?;
        copy_whole(&file, &mut copy).map_err(fail)?;
        let mut store = Self::configure(canonical, copy, clock, Migrate::All)?;
        store.read_only_copy = true;
        Ok(store)
    }

    /// A board that lives in this process's memory: the same code and rules
    /// as a board file, for tests and simulations.
    pub(crate) fn in_memory(clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let path = PathBuf::from(MEMORY_BOARD);
        let conn = Connection::open_in_memory().map_err(|error| storage_error(&path, &error))?;
        Self::configure(path, conn, clock, Migrate::All)
    }

    fn migrate(&self) -> Result<(), BoardError> {
        self.transact(Sync::Full, |tx, _| {
            let version = schema_version(tx).map_err(sql)?;
            if version > SCHEMA_VERSION {
                return Err(BoardError::NewerSchema {
                    path: self.name.clone(),
                    found: version,
                    supported: SCHEMA_VERSION,
                }
                .into());
            }
            let from = usize::try_from(version).unwrap_or(0);
            for (index, migration) in MIGRATIONS.iter().enumerate().skip(from) {
                tx.execute_batch(migration).map_err(sql)?;
                if index == 0 {
                    let reference = Connection::open_in_memory().map_err(sql)?;
                    reference.execute_batch(MIGRATIONS[0]).map_err(sql)?;
                    add_missing_columns(tx, &reference).map_err(sql)?;
                }
                tx.execute_batch(&format!("PRAGMA user_version = {}", index + 1))
                    .map_err(sql)?;
            }
            Ok(())
        })
        .map_err(unwritten)
    }

    /// Checks that the file on disk is still the board this store opened,
    /// with its write-ahead log: a board replaced, moved or stripped of its
    /// `-wal` while in use is unsafe to write.
    pub(crate) fn check_health(&self) -> Result<(), BoardError> {
        let Some(identity) = self.identity else {
            return Ok(());
        };
        let unusable = |message: &str| BoardError::Unusable {
            path: self.name.clone(),
            message: message.to_owned(),
        };
        if file_identity(&self.path) != Some(identity) {
            return Err(unusable("was replaced, moved or deleted while in use"));
        }
        // EROFS for a file system remounted read-only, EACCES for a board
        // whose permissions changed: either way no write would land.
        if let Err(errno) = nix::unistd::access(&self.path, nix::unistd::AccessFlags::W_OK) {
            return Err(unusable(&format!(
                "cannot be written any more ({}); make it writable again (remount its file system read-write, or fix its permissions)",
                errno.desc()
            )));
        }
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        if !wal.exists() {
            return Err(unusable(
                "lost its write-ahead log (the -wal file was deleted while in use)",
            ));
        }
        Ok(())
    }

    /// Refuses to write an upgraded copy in memory of a board that must
    /// not be written.
    pub(crate) fn refuse_read_only_copy(&self) -> Result<(), BoardError> {
        if self.read_only_copy {
            return Err(BoardError::Unusable {
                path: self.name.clone(),
                message: "is a board of the seed system, read here through a copy; upgrade it with `kanban migrate` before writing".to_owned(),
            });
        }
        Ok(())
    }

    /// Runs `body` in a `BEGIN IMMEDIATE` transaction at the board's time,
    /// synced as `sync` says, and the whole transaction again a bounded
    /// number of times while SQLite reports busy.
    pub(crate) fn transact<T>(
        &self,
        sync: Sync,
        mut body: impl FnMut(&mut Connection, i64) -> Result<T, TxError>,
    ) -> Result<T, TxError> {
        let mut conn = self.conn();
        let fail = |error: rusqlite::Error| TxError::Board(storage_error(&self.path, &error));
        if sync == Sync::Normal {
            // For this one commit only, under the same lock: no other write
            // of this connection can slip in unsynced. (Not a cached
            // statement: SQLite expires a `synchronous` pragma once it ran,
            // so it is prepared anew each time either way.)
            conn.execute_batch("PRAGMA synchronous = NORMAL")
                .map_err(fail)?;
        }
        let written = self.attempts(&mut conn, &mut body);
        if sync == Sync::Normal {
            conn.execute_batch("PRAGMA synchronous = FULL")
                .map_err(fail)?;
        }
        written
    }

    fn attempts<T>(
        &self,
        conn: &mut Connection,
        body: &mut impl FnMut(&mut Connection, i64) -> Result<T, TxError>,
    ) -> Result<T, TxError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let failed = match Self::attempt(&self.path, conn, self.clock.now(), body) {
                Ok(result) => return result,
                Err(error) => error,
            };
            if !is_busy(&failed) {
                return Err(TxError::Board(storage_error(&self.path, &failed)));
            }
            if attempt >= BUSY_RETRIES {
                return Err(TxError::Board(BoardError::Busy { attempts: attempt }));
            }
            // Jitter, so that racing writers do not retry in lockstep.
            let jitter = 20 + (u64::from(std::process::id()) * 7 + u64::from(attempt) * 31) % 130;
            std::thread::sleep(Duration::from_millis(jitter));
        }
    }

    /// One attempt: `Err` only for a SQLite error (busy among them).
    fn attempt<T>(
        path: &Path,
        conn: &mut Connection,
        now: i64,
        body: &mut impl FnMut(&mut Connection, i64) -> Result<T, TxError>,
    ) -> Result<Result<T, TxError>, rusqlite::Error> {
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let outcome = body(conn, now);
        let (commit, result) = match outcome {
            Ok(value) => (true, Ok(value)),
            Err(TxError::CommitThen(error)) => (true, Err(TxError::Board(error))),
            Err(TxError::NeedsSync) => (false, Err(TxError::NeedsSync)),
            Err(error) => match board_error(path, error) {
                Ok(error) => (false, Err(TxError::Board(error))),
                Err(sqlite) => {
                    let _ = conn.execute_batch("ROLLBACK");
                    return Err(sqlite);
                }
            },
        };
        if commit {
            if let Err(error) = conn.execute_batch("COMMIT") {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(error);
            }
        } else {
            conn.execute_batch("ROLLBACK")?;
        }
        Ok(result)
    }

    /// Runs `body` in one read transaction (one snapshot of the file).
    pub(crate) fn read<T>(
        &self,
        body: impl FnOnce(&mut Connection) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        let mut conn = self.conn();
        let fail = |error: rusqlite::Error| storage_error(&self.path, &error);
        conn.execute_batch("BEGIN").map_err(fail)?;
        let outcome = body(&mut conn);
        let ended = conn.execute_batch("COMMIT");
        let value = outcome.map_err(|error| match board_error(&self.path, error) {
            Ok(error) => error,
            Err(sqlite) => fail(sqlite),
        })?;
        ended.map_err(fail)?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_pauses_briefly_at_first_then_in_steps_of_two_milliseconds() {
        let pauses: Vec<(u64, u64)> = (0..8).map(busy_pause).collect();
        let expected = [
            (50, 0),
            (100, 50),
            (200, 150),
            (400, 350),
            (800, 750),
            (1_600, 1_550),
            (2_000, 3_150),
            (2_000, 5_150),
        ];
        assert_eq!(pauses, expected);
    }

    #[test]
    fn a_waiter_gives_up_once_it_has_waited_the_whole_timeout() {
        let limit = u64::try_from(BUSY_TIMEOUT.as_micros()).unwrap();
        // The attempt that would start at or past the timeout is refused.
        let last = (0..u32::MAX)
            .find(|attempt| busy_pause(*attempt).1 >= limit)
            .unwrap();
        assert!(busy_pause(last - 1).1 < limit);
        assert!(!wait_for_lock(i32::try_from(last).unwrap()));
        assert!(wait_for_lock(0));
    }
}
