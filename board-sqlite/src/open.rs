//! Opening a board file, migrating it, and running transactions on it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{BoardError, Clock};
use rusqlite::{Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior};

use crate::schema::{MIGRATIONS, SCHEMA_VERSION};

/// How long one statement waits for another writer before SQLite says busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
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
        Some(ErrorCode::NotADatabase) => unusable(
            "is not a SQLite board file; point --db at a board, or create one with `kanban init`".to_owned(),
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

const SQLITE_HEADER: &[u8; 16] = b"SQLite format 3\0";

/// Refuses a file that is not SQLite before SQLite gets to touch it.
fn check_header(path: &Path) -> Result<(), BoardError> {
    use std::io::Read;
    let unusable = |message: String| BoardError::Unusable {
        path: path.display().to_string(),
        message,
    };
    let mut file =
        std::fs::File::open(path).map_err(|error| unusable(format!("cannot be read: {error}")))?;
    let mut header = Vec::with_capacity(100);
    file.by_ref()
        .take(100)
        .read_to_end(&mut header)
        .map_err(|error| unusable(format!("cannot be read: {error}")))?;
    if header.is_empty() {
        return Ok(()); // SQLite treats an empty file as an empty database.
    }
    if header.len() < 100 || &header[..16] != SQLITE_HEADER {
        return Err(unusable(
            "is not a SQLite board file (it does not start with the SQLite header); point --db at a board, \
             or create one with `kanban init`"
                .to_owned(),
        ));
    }
    Ok(())
}

/// The board's one connection and its clock.
pub(crate) struct Store {
    pub(crate) path: PathBuf,
    conn: Mutex<Connection>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The board file's device and inode when it was opened (none in memory).
    pub(crate) identity: Option<(u64, u64)>,
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

    fn open_with(path: &Path, flags: OpenFlags, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let fail = |error: rusqlite::Error| storage_error(path, &error);
        let conn = Connection::open_with_flags(path, flags).map_err(fail)?;
        Self::configure(path.to_owned(), conn, clock)
    }

    fn configure(
        path: PathBuf,
        conn: Connection,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BoardError> {
        let fail = |error: rusqlite::Error| storage_error(&path, &error);
        conn.busy_timeout(BUSY_TIMEOUT).map_err(fail)?;
        // Refuse a newer board before touching it: no pragma that writes runs first.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(fail)?;
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
        };
        store.migrate()?;
        Ok(store)
    }

    /// Creates the board file (and its folder) if needed, and brings its
    /// schema up to date.
    pub(crate) fn create(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|error| BoardError::Unusable {
                path: path.display().to_string(),
                message: format!("its folder {} cannot be created: {error}", parent.display()),
            })?;
        }
        if path.exists() {
            check_header(path)?;
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(path, flags, clock)
    }

    /// Opens an existing board file for reading and writing.
    pub(crate) fn open(path: &Path, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        if !path.is_file() {
            return Err(BoardError::Unusable {
                path: path.display().to_string(),
                message:
                    "does not exist; create the board with `kanban init`, or name another with --db"
                        .to_owned(),
            });
        }
        check_header(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        Self::open_with(path, flags, clock)
    }

    /// A board that lives in this process's memory: the same code and rules
    /// as a board file, for tests and simulations.
    pub(crate) fn in_memory(clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let path = PathBuf::from(MEMORY_BOARD);
        let conn = Connection::open_in_memory().map_err(|error| storage_error(&path, &error))?;
        Self::configure(path, conn, clock)
    }

    fn migrate(&self) -> Result<(), BoardError> {
        self.write(|tx, _| {
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
                tx.execute_batch(&format!("PRAGMA user_version = {}", index + 1))?;
            }
            Ok(())
        })
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
        mut body: impl FnMut(&Transaction<'_>, i64) -> Result<T, TxError>,
    ) -> Result<T, BoardError> {
        let mut conn = self
            .conn
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let now = self.clock.now();
            let outcome = (|| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                match body(&tx, now) {
                    Ok(value) => {
                        tx.commit()?;
                        Ok(Ok(value))
                    }
                    Err(TxError::CommitThen(error)) => {
                        tx.commit()?;
                        Ok(Err(error))
                    }
                    Err(TxError::Board(error)) => Ok(Err(error)),
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
                    return Err(BoardError::Busy { attempts: attempt });
                }
                Err(error) => return Err(storage_error(&self.path, &error)),
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
