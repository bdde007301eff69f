//! Connections: a small pool of tokio-postgres clients, each with its own
//! prepared statements, and the transactions the board runs on them.
//!
//! The clients' connection tasks run on a runtime the board owns, so a board
//! call may be awaited from any executor (the dispatcher's tokio runtime, or
//! a test's `block_on`): a client talks to its connection task through
//! channels and needs no runtime of its own.

use std::collections::HashMap;
use std::sync::Mutex;

use kanban_core::BoardError;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{Client, NoTls, Row, Statement};

/// Connections kept idle for the next call; more may be open at once.
const IDLE_KEPT: usize = 16;
/// Whole-transaction retries after a serialization failure or a deadlock.
pub(crate) const CONFLICT_RETRIES: u32 = 16;

/// A statement parameter.
pub(crate) type Param<'a> = &'a (dyn ToSql + Sync);

/// Why a transaction did not return a value.
#[derive(Debug)]
pub(crate) enum TxError {
    Pg(tokio_postgres::Error),
    /// Roll back and fail.
    Board(BoardError),
    /// Commit what was written (a `stale_write_rejected` event) and fail.
    CommitThen(BoardError),
}

impl From<tokio_postgres::Error> for TxError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Pg(error)
    }
}

impl From<BoardError> for TxError {
    fn from(error: BoardError) -> Self {
        Self::Board(error)
    }
}

/// A conflict PostgreSQL resolves by failing one side: worth a retry.
pub(crate) fn is_conflict(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    error.code().is_some_and(|code| {
        *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
    })
}

/// Turns a driver error into a board error that names the board and the fix.
pub(crate) fn storage_error(board: &str, error: &tokio_postgres::Error) -> BoardError {
    use tokio_postgres::error::SqlState;
    let unusable = |message: String| BoardError::Unusable {
        path: board.to_owned(),
        message,
    };
    match error.as_db_error() {
        Some(db) if *db.code() == SqlState::DISK_FULL => BoardError::DiskFull {
            path: board.to_owned(),
        },
        Some(db)
            if *db.code() == SqlState::INVALID_PASSWORD
                || *db.code() == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
        {
            unusable(format!(
                "refused the login ({}); give the password through PGPASSWORD or ~/.pgpass, never in the URL",
                db.message()
            ))
        }
        Some(db) if *db.code() == SqlState::INVALID_CATALOG_NAME => unusable(format!(
            "{}; create the database first (createdb NAME), then run kanban init --db URL",
            db.message()
        )),
        // A standby answering for a moment (a failover in progress): passing.
        Some(db) if *db.code() == SqlState::READ_ONLY_SQL_TRANSACTION => {
            BoardError::Storage(format!(
                "{board}: the server is read-only ({}); waiting for a primary",
                db.message()
            ))
        }
        Some(db) => BoardError::Storage(format!("{board}: {}", db.message())),
        // A connection lost mid-call (a restart, the network) is passing:
        // the dispatcher pauses and retries, and no card is charged.
        None if error.is_closed() => BoardError::Storage(format!(
            "{board}: the connection to the server closed; retrying"
        )),
        None => BoardError::Storage(format!("{board}: {error}")),
    }
}

/// A connection that could not be opened: the server's refusal (a login,
/// a missing database) as [`storage_error`] says; a server out of reach is
/// passing once the board was open (it pauses the dispatcher), and is
/// named with the fix when the board is first opened.
fn unreachable(board: &str, error: &tokio_postgres::Error) -> BoardError {
    if error.as_db_error().is_some() {
        return storage_error(board, error);
    }
    // A certificate refused or a server without TLS fails the same way
    // every time: the URL or the server is to be changed, not waited for. A
    // handshake cut short (a restarting server) is passing, like any other.
    if let Some(refusal) = tls_refusal(error) {
        return BoardError::Unusable {
            path: board.to_owned(),
            message: format!(
                "the TLS connection to the server failed ({refusal}); with sslmode=require the server must offer TLS (ssl = on) and present a certificate for the URL's host signed by a CA in sslrootcert=PATH (or a public one)"
            ),
        };
    }
    BoardError::Storage(format!("{board}: the server cannot be reached ({error})"))
}

/// What refused a TLS connection for good, if that is why `error` came:
/// rustls's verdict (a certificate, an alert) or a server that offers no TLS.
fn tls_refusal(error: &tokio_postgres::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(current) = cause {
        let inner = current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .map_or(current, |inner| inner as &(dyn std::error::Error + 'static));
        if let Some(refused) = inner.downcast_ref::<rustls::Error>() {
            return Some(refused.to_string());
        }
        if inner.to_string().contains("server does not support TLS") {
            return Some("the server does not offer TLS".to_owned());
        }
        cause = current.source();
    }
    None
}

/// Drives one connection until its client is dropped.
async fn drive<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(error) = connection.await {
        tracing::debug!(%error, "postgres connection ended");
    }
}

/// [`unreachable`]'s error at the first open: not passing, but a URL or a
/// server to check.
pub(crate) fn unreachable_at_open(board: &str, error: BoardError) -> BoardError {
    match error {
        BoardError::Storage(message) => BoardError::Unusable {
            path: board.to_owned(),
            message: format!(
                "{}; check that the server runs and that the URL names the right host, port and database",
                message
                    .strip_prefix(&format!("{board}: "))
                    .unwrap_or(&message)
            ),
        },
        other => other,
    }
}

/// One client and the statements prepared on it.
pub(crate) struct Conn {
    client: Client,
    statements: HashMap<String, Statement>,
    /// A transaction was begun and not yet ended: a connection returned in
    /// this state (its caller's future was dropped) is closed, not reused.
    in_transaction: bool,
    /// The open transaction's commit may return before the server has
    /// flushed it (`commit_unsynced`).
    unsynced_commit: bool,
}

impl Conn {
    async fn statement(&mut self, sql: &str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.client.prepare(sql).await?;
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    pub(crate) async fn query(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.query(&statement, params).await
    }

    pub(crate) async fn query_opt(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.query_opt(&statement, params).await
    }

    pub(crate) async fn query_one(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Row, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.query_one(&statement, params).await
    }

    pub(crate) async fn execute(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.client.execute(&statement, params).await
    }

    /// One value of the first row of a query that returns exactly one row.
    pub(crate) async fn value<T>(
        &mut self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<T, tokio_postgres::Error>
    where
        T: for<'r> FromSql<'r>,
    {
        self.query_one(sql, params).await?.try_get(0)
    }

    /// `query_opt` inside its own transaction opened with `begin`, the
    /// three sent at once (pipelined): one round trip to the server.
    pub(crate) async fn query_opt_alone(
        &mut self,
        begin: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let statement = self.statement(sql).await?;
        self.in_transaction = true;
        let client = &self.client;
        let (_, row, _) = tokio::try_join!(
            client.batch_execute(begin),
            client.query_opt(&statement, params),
            client.batch_execute("COMMIT"),
        )?;
        self.in_transaction = false;
        Ok(row)
    }

    pub(crate) async fn begin(&mut self, mode: &str) -> Result<(), tokio_postgres::Error> {
        self.in_transaction = true;
        self.unsynced_commit = false;
        self.client.batch_execute(mode).await
    }

    /// Lets this transaction's commit return before the server has flushed
    /// its log, as SQLite's `Durability::Deferred` does; only for records
    /// whose loss no live process can act on (docs/ARCHITECTURE.md, the
    /// board's invariant on log flushes). The log is sequential: a synced
    /// commit after it flushes it too.
    pub(crate) fn commit_unsynced(&mut self) {
        self.unsynced_commit = true;
    }

    pub(crate) async fn end(&mut self, commit: bool) -> Result<(), tokio_postgres::Error> {
        // `SET LOCAL` is read at the commit, and sent with it: no round trip
        // more for an unsynced commit.
        let sql = match (commit, self.unsynced_commit) {
            (true, false) => "COMMIT",
            (true, true) => "SET LOCAL synchronous_commit TO OFF; COMMIT",
            (false, _) => "ROLLBACK",
        };
        self.client.batch_execute(sql).await?;
        self.in_transaction = false;
        Ok(())
    }

    pub(crate) async fn batch(&mut self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute(sql).await
    }
}

/// Clients to one database, opened on the board's runtime when needed.
pub(crate) struct Pool {
    config: tokio_postgres::Config,
    /// Verified TLS when the URL asks for it (`sslmode=require`).
    tls: Option<crate::tls::Verified>,
    runtime: tokio::runtime::Handle,
    idle: Mutex<Vec<Conn>>,
    /// The board's name in messages: its URL without a password.
    pub(crate) name: String,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The config may carry a password: only the name is shown.
        f.debug_struct("Pool").field("name", &self.name).finish()
    }
}

impl Pool {
    pub(crate) fn new(
        config: tokio_postgres::Config,
        tls: Option<crate::tls::Verified>,
        runtime: tokio::runtime::Handle,
        name: String,
    ) -> Self {
        Self {
            config,
            tls,
            runtime,
            idle: Mutex::new(Vec::new()),
            name,
        }
    }

    pub(crate) fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    pub(crate) fn tls(&self) -> Option<&crate::tls::Verified> {
        self.tls.as_ref()
    }

    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.runtime
    }

    /// An idle connection, or a new one.
    pub(crate) async fn get(&self) -> Result<Pooled<'_>, BoardError> {
        let kept = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let conn = match kept {
            Some(conn) if !conn.client.is_closed() => conn,
            _ => self.connect().await?,
        };
        Ok(Pooled {
            pool: self,
            conn: Some(conn),
        })
    }

    async fn connect(&self) -> Result<Conn, BoardError> {
        let config = self.config.clone();
        let tls = self.tls.clone();
        let opened = self.runtime.spawn(async move {
            // The connection task ends when its client is dropped.
            let client = match tls {
                None => {
                    let (client, connection) = config.connect(NoTls).await?;
                    tokio::spawn(drive(connection));
                    client
                }
                Some(tls) => {
                    let (client, connection) = config.connect(tls).await?;
                    tokio::spawn(drive(connection));
                    client
                }
            };
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = match opened.await {
            Ok(Ok(client)) => client,
            Ok(Err(error)) => return Err(unreachable(&self.name, &error)),
            Err(join) => {
                return Err(BoardError::Unusable {
                    path: self.name.clone(),
                    message: format!("the connection attempt stopped: {join}"),
                });
            }
        };
        Ok(Conn {
            client,
            statements: HashMap::new(),
            in_transaction: false,
            unsynced_commit: false,
        })
    }
}

/// A connection on loan; back to the pool when dropped, unless it is broken
/// or was left inside a transaction.
pub(crate) struct Pooled<'a> {
    pool: &'a Pool,
    conn: Option<Conn>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Conn;

    fn deref(&self) -> &Conn {
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn
            .as_mut()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if conn.in_transaction || conn.client.is_closed() {
            return;
        }
        let mut idle = self
            .pool
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < IDLE_KEPT {
            idle.push(conn);
        }
    }
}

/// A column of a row, typed; a mismatch is a storage error, never a panic.
pub(crate) fn col<'r, T: FromSql<'r>>(
    row: &'r Row,
    index: usize,
) -> Result<T, tokio_postgres::Error> {
    row.try_get(index)
}
