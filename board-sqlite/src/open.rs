//! Opening a board file, migrating it, and running transactions on it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{BoardError, Clock};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

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
    // The pauses that double: 50, 100, ... 1,600 µs; every later one is the longest.
    let doublings = (BUSY_LONGEST_PAUSE_MICROS / BUSY_FIRST_PAUSE_MICROS).ilog2();
    let pause = if attempt <= doublings {
        BUSY_FIRST_PAUSE_MICROS << attempt
    } else {
        BUSY_LONGEST_PAUSE_MICROS
    };
    let before = if attempt <= doublings + 1 {
        BUSY_FIRST_PAUSE_MICROS * ((1 << attempt) - 1)
    } else {
        BUSY_FIRST_PAUSE_MICROS * ((1 << (doublings + 1)) - 1)
            + u64::from(attempt - doublings - 1) * BUSY_LONGEST_PAUSE_MICROS
    };
    (pause, before)
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
/// them again (a tenth of a dispatcher's own time went to it). Every
/// `prepare_cached` of this crate fits, with room for the lane queries that
/// vary with their filter (`every_statement_of_the_board_fits_its_cache`).
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
pub trait Offload: Send + Sync + std::fmt::Debug {
    /// Runs `job` where it may block, and returns when it is done.
    async fn run(&self, job: Box<dyn FnOnce() + Send + 'static>);
}

/// Why a write transaction did not return a value.
pub(crate) enum TxError {
    Sql(rusqlite::Error),
    /// Roll back and fail.
    Board(BoardError),
    /// Commit what was written (a `stale_write_rejected` event) and fail.
    CommitThen(BoardError),
    /// Roll back and run the body again, synced: a write begun unsynced
    /// (see [`Store::write_synced_unless_record`]) found it changes more than
    /// a record.
    NeedsSync,
}

/// Why a write did not commit: the board's error, or a body begun unsynced
/// that asked to run again synced.
enum Unwritten {
    Board(BoardError),
    NeedsSync,
}

impl Unwritten {
    fn into_board_error(self) -> BoardError {
        match self {
            Self::Board(error) => error,
            // Only a body offered an unsynced commit may ask: one that asks
            // from a synced write is a bug of this crate.
            Self::NeedsSync => {
                BoardError::Storage("a write asked for a synced commit while in one".to_owned())
            }
        }
    }
}

impl From<rusqlite::Error> for TxError {
    fn from(error: rusqlite::Error) -> Self {
        Self::Sql(error)
    }
}

impl From<BoardError> for TxError {
    fn from(error: BoardError) -> Self {
        Self::Board(error)
    }
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

/// How soon a commit must be on the disk.
///
/// In WAL mode the log is only ever appended to and replayed as a prefix,
/// so a commit left unsynced becomes durable with the next synced one, and
/// an operating-system crash (or power loss) can lose only a tail of
/// unsynced commits, never one from the middle. An application crash loses
/// nothing either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Synced before the commit returns (`synchronous = FULL`): claims (a
    /// run id is a fencing token and must never be handed out twice),
    /// settlements, bookings and every change a person or an agent made.
    Synced,
    /// Left to the next synced commit (`synchronous = NORMAL` for this one
    /// commit): only records whose loss in a machine crash is the same as
    /// that crash coming just before them: a worker binding its pid, a
    /// spawn record, a lease extension, a worker's result (booked by the
    /// dispatcher's synced commit right after), the exit record of a run
    /// its worker already settled (see
    /// [`kanban_core::rules::Transition::only_records`]). Every
    /// process writing them dies in that same crash, and the claim they
    /// belong to lapses.
    Deferred,
}

/// The board's one connection and its clock.
pub(crate) struct Store {
    pub(crate) path: PathBuf,
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

/// A column as `PRAGMA table_info` describes it.
struct Column {
    name: String,
    kind: String,
    not_null: bool,
    default: Option<String>,
}

/// Adds the columns of `reference`'s tables that `tx`'s tables lack: the seed
/// system's boards predate some of them, and `CREATE TABLE IF NOT EXISTS`
/// leaves an existing table as it is.
fn add_missing_columns(tx: &Transaction<'_>, reference: &Connection) -> rusqlite::Result<()> {
    let columns = |conn: &Connection, table: &str| -> rusqlite::Result<Vec<Column>> {
        let mut statement = conn.prepare(&format!("PRAGMA table_info({table})"))?;
        let rows = statement.query_map([], |row| {
            Ok(Column {
                name: row.get(1)?,
                kind: row.get(2)?,
                not_null: row.get::<_, i64>(3)? != 0,
                default: row.get(4)?,
            })
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
            .map(|column| column.name)
            .collect();
        for Column {
            name,
            kind,
            not_null,
            default,
        } in columns(reference, &table)?
        {
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

/// A file's identity: its device and inode.
pub(crate) fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

impl Store {
    /// The board's name in claims: its path, or [`MEMORY_BOARD`].
    pub(crate) fn db(&self) -> String {
        self.path.display().to_string()
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

    fn upgrade(path: &Path, clock: Arc<dyn Clock>) -> Result<Upgrade, BoardError> {
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
        {
            let mut copy = Connection::open(&backup).map_err(fail)?;
            let run = rusqlite::backup::Backup::new(&file, &mut copy).map_err(fail)?;
            run.run_to_completion(256, Duration::ZERO, None)
                .map_err(fail)?;
        }
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
        {
            let backup = rusqlite::backup::Backup::new(&file, &mut copy).map_err(fail)?;
            backup
                .run_to_completion(256, Duration::ZERO, None)
                .map_err(fail)?;
        }
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
        self.write_unchecked(Durability::Synced, |tx, _| {
            let version: i64 = tx.query_row("PRAGMA user_version", [], |row| row.get(0))?;
            if version > SCHEMA_VERSION {
                return Err(BoardError::NewerSchema {
                    path: self.db(),
                    found: version,
                    supported: SCHEMA_VERSION,
                }
                .into());
            }
            for (index, migration) in MIGRATIONS
                .iter()
                .enumerate()
                .skip(usize::try_from(version).unwrap_or(0))
            {
                tx.execute_batch(migration)?;
                if index == 0 {
                    let reference = Connection::open_in_memory()?;
                    reference.execute_batch(MIGRATIONS[0])?;
                    add_missing_columns(tx, &reference)?;
                }
                tx.execute_batch(&format!("PRAGMA user_version = {}", index + 1))?;
            }
            Ok(())
        })
        .map_err(Unwritten::into_board_error)
    }

    /// Checks that the file on disk is still the board this store opened,
    /// with its write-ahead log: a board replaced, moved or stripped of its
    /// `-wal` while in use is unsafe to write.
    pub(crate) fn check_health(&self) -> Result<(), BoardError> {
        let Some(identity) = self.identity else {
            return Ok(());
        };
        let unusable = |message: &str| BoardError::Unusable {
            path: self.db(),
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

    /// Runs `body` in a `BEGIN IMMEDIATE` transaction, retrying the whole
    /// transaction a bounded number of times while SQLite reports busy.
    pub(crate) fn write<T>(
        &self,
        body: impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        self.write_with(Durability::Synced, body)
    }

    /// A write that reaches the disk with the next synced commit: see
    /// [`Durability::Deferred`] for which writes may be.
    pub(crate) fn write_deferred<T>(
        &self,
        body: impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        self.write_with(Durability::Deferred, body)
    }

    /// A write that is synced unless it turns out to be only a record (see
    /// [`Durability::Deferred`]), which only its own reading of the board can
    /// tell: the body runs unsynced first (`SQLite` will not change how a
    /// commit is synced inside a transaction) and returns
    /// [`TxError::NeedsSync`] when it must change more; that attempt is
    /// rolled back and the body runs again, synced.
    pub(crate) fn write_synced_unless_record<T>(
        &self,
        mut body: impl FnMut(&Transaction<'_>, i64, Durability) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        self.refuse_read_only_copy()?;
        match self.write_unchecked(Durability::Deferred, |tx, now| {
            body(tx, now, Durability::Deferred)
        }) {
            Err(Unwritten::NeedsSync) => self
                .write_unchecked(Durability::Synced, |tx, now| {
                    body(tx, now, Durability::Synced)
                })
                .map_err(Unwritten::into_board_error),
            written => written.map_err(Unwritten::into_board_error),
        }
    }

    pub(crate) fn write_with<T>(
        &self,
        durability: Durability,
        body: impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        self.refuse_read_only_copy()?;
        self.write_unchecked(durability, body)
            .map_err(Unwritten::into_board_error)
    }

    fn refuse_read_only_copy(&self) -> Result<(), BoardError> {
        if self.read_only_copy {
            return Err(BoardError::Unusable {
                path: self.db(),
                message: "is a board of the seed system, read here through a copy; upgrade it with `kanban migrate` before writing".to_owned(),
            });
        }
        Ok(())
    }

    fn write_unchecked<T>(
        &self,
        durability: Durability,
        mut body: impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, Unwritten> {
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deferred = durability == Durability::Deferred;
        if deferred {
            // For this one commit only, under the same lock: no other write
            // of this connection can slip in unsynced. (Not a cached
            // statement: SQLite expires a `synchronous` pragma once it ran,
            // so it is prepared anew each time either way.)
            conn.execute_batch("PRAGMA synchronous = NORMAL")
                .map_err(|error| Unwritten::Board(storage_error(&self.path, &error)))?;
        }
        let written = Self::write_on(&self.path, &self.clock, &mut conn, &mut body);
        if deferred {
            conn.execute_batch("PRAGMA synchronous = FULL")
                .map_err(|error| Unwritten::Board(storage_error(&self.path, &error)))?;
        }
        written
    }

    fn write_on<T>(
        path: &Path,
        clock: &Arc<dyn Clock>,
        conn: &mut Connection,
        body: &mut impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, Unwritten> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = clock.now();
            let outcome = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                match body(&tx, now) {
                    Ok(value) => {
                        tx.commit()?;
                        Ok(Ok(value))
                    }
                    Err(TxError::CommitThen(error)) => {
                        tx.commit()?;
                        Ok(Err(Unwritten::Board(error)))
                    }
                    Err(TxError::Board(error)) => Ok(Err(Unwritten::Board(error))),
                    Err(TxError::NeedsSync) => Ok(Err(Unwritten::NeedsSync)),
                    Err(TxError::Sql(error)) => Err(error),
                }
            })();
            match outcome {
                Ok(result) => return result,
                Err(error) if is_busy(&error) && attempt < BUSY_RETRIES => {
                    // Jitter so that racing writers do not retry in lockstep.
                    let jitter =
                        20 + (u64::from(std::process::id()) * 7 + u64::from(attempt) * 31) % 130;
                    std::thread::sleep(Duration::from_millis(jitter));
                }
                Err(error) if is_busy(&error) => {
                    return Err(Unwritten::Board(BoardError::Busy { attempts: attempt }));
                }
                Err(error) => return Err(Unwritten::Board(storage_error(path, &error))),
            }
        }
    }

    /// Runs a read on the board's connection.
    pub(crate) fn read<T>(
        &self,
        body: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, BoardError> {
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        body(&conn).map_err(|error| storage_error(&self.path, &error))
    }

    /// A read whose body may fail with a board error too.
    pub(crate) fn read_checked<T>(
        &self,
        body: impl FnOnce(&Connection) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match body(&conn) {
            Ok(value) => Ok(value),
            Err(TxError::Sql(error)) => Err(storage_error(&self.path, &error)),
            Err(TxError::Board(error) | TxError::CommitThen(error)) => Err(error),
            Err(TxError::NeedsSync) => Err(Unwritten::NeedsSync.into_board_error()),
        }
    }
}

/// A kanban board stored in one SQLite file (or in memory).
#[derive(Clone)]
pub struct SqliteBoard {
    pub(crate) store: Arc<Store>,
    offload: Option<Arc<dyn Offload>>,
}

impl std::fmt::Debug for SqliteBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteBoard")
            .field("path", &self.store.path)
            .field("offload", &self.offload)
            .finish_non_exhaustive()
    }
}

impl SqliteBoard {
    fn from_store(store: Store) -> Self {
        Self {
            store: Arc::new(store),
            offload: None,
        }
    }

    /// Creates the board file (and its folder) if needed, and brings its
    /// schema up to date.
    pub fn create(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        Store::create(path.as_ref(), clock).map(Self::from_store)
    }

    /// Opens an existing board file for reading and writing, bringing its
    /// schema up to date. A missing file, a file that is not SQLite and a
    /// board written by a newer version are refused and left untouched.
    pub fn open(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        Store::open(path.as_ref(), clock).map(Self::from_store)
    }

    /// Opens a board for reading only: a board of the seed system (schema
    /// version 0) is read through an upgraded copy in memory and its file is
    /// never written; writes through it are refused.
    pub fn open_for_reading(
        path: impl AsRef<Path>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BoardError> {
        Store::open_for_reading(path.as_ref(), clock).map(Self::from_store)
    }

    /// Upgrades a board file to this build's schema, after copying it to a
    /// backup beside it (owner-only). A board already up to date is left
    /// alone and no backup is made, so running it twice is harmless.
    pub fn upgrade(path: impl AsRef<Path>, clock: Arc<dyn Clock>) -> Result<Upgrade, BoardError> {
        Store::upgrade(path.as_ref(), clock)
    }

    /// A board in this process's memory, named [`MEMORY_BOARD`] in claims.
    pub fn open_in_memory(clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        Store::in_memory(clock).map(Self::from_store)
    }

    /// This board, running its blocking work through `offload`.
    #[must_use]
    pub fn with_offload(mut self, offload: Arc<dyn Offload>) -> Self {
        self.offload = Some(offload);
        self
    }

    /// The board file.
    pub fn path(&self) -> &Path {
        &self.store.path
    }

    /// Runs `job` on the store, through the offload when there is one.
    pub(crate) async fn call<T: Send + 'static>(
        &self,
        job: impl FnOnce(&Store) -> Result<T, BoardError> + Send + 'static,
    ) -> Result<T, BoardError> {
        let Some(offload) = &self.offload else {
            return job(&self.store);
        };
        let slot = Arc::new(Mutex::new(None));
        let filled = slot.clone();
        let store = self.store.clone();
        offload
            .run(Box::new(move || {
                let value = job(&store);
                *filled
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(value);
            }))
            .await;
        let value = slot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        value.unwrap_or_else(|| {
            Err(BoardError::Storage(
                "a board call ended without an answer (its thread failed)".to_owned(),
            ))
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn synchronous_during(store: &Store, durability: Durability) -> i64 {
        store
            .write_with(durability, |tx, _| {
                Ok(tx.query_row("PRAGMA synchronous", [], |row| row.get(0))?)
            })
            .unwrap()
    }

    #[test]
    fn a_deferred_write_is_unsynced_for_its_own_commit_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::create(
            &dir.path().join("board.db"),
            Arc::new(kanban_testkit::VirtualClock::at(1_700_000_000)),
        )
        .unwrap();
        // SQLite's values: 1 is NORMAL, 2 is FULL.
        assert_eq!(synchronous_during(&store, Durability::Synced), 2);
        assert_eq!(synchronous_during(&store, Durability::Deferred), 1);
        assert_eq!(synchronous_during(&store, Durability::Synced), 2);
        // A deferred write that fails leaves the connection synced too.
        let failed: Result<(), BoardError> =
            store.write_deferred(|_, _| Err(BoardError::InvalidInput("refused".to_owned()).into()));
        assert!(failed.is_err());
        assert_eq!(synchronous_during(&store, Durability::Synced), 2);
    }

    #[test]
    fn a_statement_used_again_is_not_prepared_again() {
        let store = Store::in_memory(Arc::new(kanban_testkit::VirtualClock::at(0))).unwrap();
        // SQLite asks the authorizer while it prepares a statement, never
        // while it runs one: each call is one preparation.
        let prepared = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = prepared.clone();
        store
            .conn
            .lock()
            .unwrap()
            .authorizer(Some(move |_: rusqlite::hooks::AuthContext<'_>| {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                rusqlite::hooks::Authorization::Allow
            }))
            .unwrap();
        let statements: Vec<String> = (0..STATEMENT_CACHE)
            .map(|n| format!("SELECT {n}"))
            .collect();
        let round = || {
            for sql in &statements {
                let value: i64 = store
                    .read(|conn| conn.prepare_cached(sql)?.query_row([], |row| row.get(0)))
                    .unwrap();
                assert_eq!(sql, &format!("SELECT {value}"));
            }
            prepared.load(std::sync::atomic::Ordering::Relaxed)
        };
        let first = round();
        assert!(first >= STATEMENT_CACHE, "{first} preparations");
        assert_eq!(round(), first, "the second round prepared again");
    }

    /// Every board call a dispatched card costs, once the statements are
    /// warm, runs on statements already prepared. SQLite re-prepares a
    /// cached statement on its next step when a value bound to it may change
    /// its plan (a bound `LIMIT`, say): the cache then saves nothing.
    #[test]
    fn a_dispatched_card_s_calls_prepare_nothing_once_warm() {
        use kanban_core::{
            Board, BoardAdmin, ClaimFilter, DispatchBoard, ExitWitness, NewTask, WorkerProcess,
            WorkerResult,
        };
        use kanban_testkit::block_on;

        let clock = kanban_testkit::VirtualClock::at(1_700_000_000);
        let board = SqliteBoard::open_in_memory(Arc::new(clock)).unwrap();
        for n in 0..4 {
            block_on(board.create_task(&NewTask {
                title: format!("card {n}"),
                ..NewTask::default()
            }))
            .unwrap();
        }
        // Statements, not transactions or pragmas: `BEGIN` and a deferred
        // write's `synchronous` are parsed each time by design.
        let prepared = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = prepared.clone();
        board
            .store
            .conn
            .lock()
            .unwrap()
            .authorizer(Some(move |context: rusqlite::hooks::AuthContext<'_>| {
                use rusqlite::hooks::AuthAction;
                if !matches!(
                    context.action,
                    AuthAction::Transaction { .. } | AuthAction::Pragma { .. }
                ) {
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                rusqlite::hooks::Authorization::Allow
            }))
            .unwrap();
        let card = |n: u32| {
            block_on(board.running_workers()).unwrap();
            block_on(board.promote_ready()).unwrap();
            let grants = block_on(board.claim_ready_batch(
                600,
                &[format!("host:1:{n}")],
                &ClaimFilter::any(),
            ))
            .unwrap();
            let claim = &grants[0].claim;
            let pid = 1000 + n;
            let process = WorkerProcess {
                pid,
                started_at: Some(i64::from(n)),
                seal_digest: None,
            };
            block_on(board.record_spawn(claim, &process)).unwrap();
            block_on(board.show_task(&claim.task_id)).unwrap();
            block_on(board.bind_worker(claim, pid)).unwrap();
            block_on(board.complete(claim, "done", None)).unwrap();
            let result = WorkerResult {
                pid,
                ..kanban_testkit::board_contract::worker_result(claim, 0)
            };
            block_on(board.book_result(claim, &result)).unwrap();
            let report = kanban_testkit::board_contract::exit_report(ExitWitness::Code(0));
            block_on(board.book_exit(claim, &report)).unwrap();
            prepared.swap(0, std::sync::atomic::Ordering::Relaxed)
        };
        // The first two cards warm the cache; from the third on, nothing
        // is prepared again.
        assert!(card(1) > 0, "the authorizer saw no preparation");
        card(2);
        assert_eq!(card(3), 0, "the third card prepared statements");
        assert_eq!(card(4), 0, "the fourth card prepared statements");
    }

    #[test]
    fn a_settled_run_s_exit_is_booked_unsynced_and_a_crash_synced() {
        use kanban_core::{Board, BoardAdmin, ClaimFilter, DispatchBoard, ExitWitness, NewTask};
        use kanban_testkit::block_on;
        use std::sync::Mutex as StdMutex;

        let board =
            SqliteBoard::open_in_memory(Arc::new(kanban_testkit::VirtualClock::at(1_700_000_000)))
                .unwrap();
        for n in 0..2 {
            block_on(board.create_task(&NewTask {
                title: format!("card {n}"),
                ..NewTask::default()
            }))
            .unwrap();
        }
        // How each commit was synced: the last `synchronous` set before it
        // (the authorizer sees a pragma as it is prepared, and a pragma is
        // run as soon as it is prepared).
        let setting = Arc::new(StdMutex::new("FULL".to_owned()));
        let commits = Arc::new(StdMutex::new(Vec::<String>::new()));
        {
            let mut conn = board.store.conn.lock().unwrap();
            let seen = setting.clone();
            conn.authorizer(Some(move |context: rusqlite::hooks::AuthContext<'_>| {
                if let rusqlite::hooks::AuthAction::Pragma {
                    pragma_name: "synchronous",
                    pragma_value: Some(value),
                } = context.action
                {
                    *seen.lock().unwrap() = value.to_owned();
                }
                rusqlite::hooks::Authorization::Allow
            }))
            .unwrap();
            let (seen, booked) = (setting.clone(), commits.clone());
            conn.commit_hook(Some(move || {
                booked.lock().unwrap().push(seen.lock().unwrap().clone());
                false
            }))
            .unwrap();
        }
        let claim = |lock: &str| {
            block_on(board.claim_ready_batch(600, &[lock.to_owned()], &ClaimFilter::any()))
                .unwrap()
                .remove(0)
                .claim
        };
        let booked = |claim: &kanban_core::Claim, code: i32| {
            commits.lock().unwrap().clear();
            let report = kanban_testkit::board_contract::exit_report(ExitWitness::Code(code));
            let booking = block_on(board.book_exit(claim, &report)).unwrap();
            (booking.kind, commits.lock().unwrap().clone())
        };

        let settled = claim("host:1:a");
        block_on(board.complete(&settled, "done", None)).unwrap();
        assert_eq!(
            booked(&settled, 0),
            (kanban_core::BookingKind::Settled, vec!["NORMAL".to_owned()]),
            "a settled run's exit is a record, left to the next synced commit"
        );
        let crashed = claim("host:1:b");
        assert_eq!(
            booked(&crashed, 3),
            (kanban_core::BookingKind::Crashed, vec!["FULL".to_owned()]),
            "a crash changes the card: its booking is synced, and only it commits"
        );
        assert_eq!(
            block_on(board.show_task(&crashed.task_id))
                .unwrap()
                .task
                .status,
            kanban_core::TaskStatus::Ready,
            "the crash was booked once, synced"
        );
    }

    #[test]
    fn a_waiter_pauses_briefly_at_first_then_in_steps_of_two_milliseconds() {
        let pauses: Vec<(u64, u64)> = (0..8).map(busy_pause).collect();
        assert_eq!(
            pauses,
            vec![
                (50, 0),
                (100, 50),
                (200, 150),
                (400, 350),
                (800, 750),
                (1_600, 1_550),
                (2_000, 3_150),
                (2_000, 5_150),
            ]
        );
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
