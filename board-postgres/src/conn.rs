//! Connections: deadpool's pool of tokio-postgres clients, each with its
//! prepared statements, opened on a runtime the board owns (so that a
//! call may be awaited from any executor: the dispatcher's tokio runtime,
//! or a test's `block_on`; a client talks to its connection task through
//! channels and needs no runtime of its own), and what their errors mean.

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool as Clients, RecyclingMethod};
use kanban_board::{TxError, TxResult};
use kanban_core::BoardError;
use tokio_postgres::types::{FromSql, ToSql};
use tokio_postgres::{NoTls, Row};

/// Connections kept for the next call; more wait for one.
const CONNECTIONS: usize = 16;
/// Whole-transaction retries after a serialization failure or a deadlock.
pub(crate) const CONFLICT_RETRIES: u32 = 16;

/// A statement parameter.
pub(crate) type Param<'a> = &'a (dyn ToSql + Sync);

/// A driver error as a transaction's error.
pub(crate) fn pg(error: tokio_postgres::Error) -> TxError {
    TxError::engine(error)
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
/// a missing database) as [`storage_error`] says; a refused certificate or
/// a server without TLS is the URL's or the server's to change; anything
/// else is passing once the board was open (it pauses the dispatcher).
fn unreachable(board: &str, error: &tokio_postgres::Error) -> BoardError {
    if error.as_db_error().is_some() {
        return storage_error(board, error);
    }
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

/// One client on loan, and whether a transaction is open on it.
pub(crate) struct Conn {
    client: Option<Object>,
    /// A transaction was begun and not yet ended: a connection dropped in
    /// this state (its caller's future was dropped) is closed, not reused.
    in_transaction: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.in_transaction
            && let Some(client) = self.client.take()
        {
            // Out of the pool: its connection closes with it.
            drop(Object::take(client));
        }
    }
}

impl Conn {
    fn client(&self) -> TxResult<&Object> {
        self.client
            .as_ref()
            .ok_or_else(|| BoardError::Storage("a connection used after its end".to_owned()).into())
    }

    async fn statement(&self, sql: &str) -> TxResult<tokio_postgres::Statement> {
        self.client()?.prepare_cached(sql).await.map_err(pg)
    }

    pub(crate) async fn query(&self, sql: &str, params: &[Param<'_>]) -> TxResult<Vec<Row>> {
        let statement = self.statement(sql).await?;
        self.client()?.query(&statement, params).await.map_err(pg)
    }

    /// `query` after `prelude` (settings, simple statements), the two sent
    /// at once: one round trip.
    pub(crate) async fn query_after(
        &self,
        prelude: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> TxResult<Vec<Row>> {
        let statement = self.statement(sql).await?;
        let client = self.client()?;
        let (_, rows) = tokio::try_join!(
            client.batch_execute(prelude),
            client.query(&statement, params)
        )
        .map_err(pg)?;
        Ok(rows)
    }

    pub(crate) async fn execute(&self, sql: &str, params: &[Param<'_>]) -> TxResult<u64> {
        let statement = self.statement(sql).await?;
        self.client()?.execute(&statement, params).await.map_err(pg)
    }

    /// One value of the one row a query returns.
    pub(crate) async fn value<T>(&self, sql: &str, params: &[Param<'_>]) -> TxResult<T>
    where
        T: for<'r> FromSql<'r>,
    {
        let statement = self.statement(sql).await?;
        let row = self
            .client()?
            .query_one(&statement, params)
            .await
            .map_err(pg)?;
        col(&row, 0)
    }

    /// `query_opt` inside its own transaction opened with `begin`, the
    /// three sent at once (pipelined): one round trip to the server.
    pub(crate) async fn query_opt_alone(
        &mut self,
        begin: &str,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let Some(client) = self.client.as_ref() else {
            return Ok(None);
        };
        let statement = client.prepare_cached(sql).await?;
        self.in_transaction = true;
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
        self.batch(mode).await
    }

    /// Ends the transaction: `COMMIT` (with `unsynced`, returning before
    /// the server flushed its log: `SET LOCAL` is read at the commit and
    /// sent with it, no round trip more) or `ROLLBACK`.
    pub(crate) async fn end(
        &mut self,
        commit: bool,
        unsynced: bool,
    ) -> Result<(), tokio_postgres::Error> {
        let sql = match (commit, unsynced) {
            (true, false) => "COMMIT",
            (true, true) => "SET LOCAL synchronous_commit TO OFF; COMMIT",
            (false, _) => "ROLLBACK",
        };
        self.batch(sql).await?;
        self.in_transaction = false;
        Ok(())
    }

    pub(crate) async fn batch(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        match &self.client {
            Some(client) => client.batch_execute(sql).await,
            None => Ok(()),
        }
    }
}

/// The board's clients, opened on its runtime when needed.
pub(crate) struct Pool {
    clients: Clients,
    config: tokio_postgres::Config,
    /// Verified TLS when the URL asks for it (`sslmode=require`).
    tls: Option<crate::tls::Verified>,
    runtime: tokio::runtime::Handle,
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
    ) -> Result<Self, BoardError> {
        // A connection handed out is only checked for being open: one
        // whose server went away fails its first statement, which is
        // passing (and a connection left inside a transaction never goes
        // back: see `Conn`'s drop).
        let manager_config = ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let manager = match &tls {
            None => Manager::from_config(config.clone(), NoTls, manager_config),
            Some(tls) => Manager::from_config(config.clone(), tls.clone(), manager_config),
        };
        let clients = Clients::builder(manager)
            .max_size(CONNECTIONS)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|error| BoardError::Storage(format!("{name}: {error}")))?;
        Ok(Self {
            clients,
            config,
            tls,
            runtime,
            name,
        })
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

    /// A connection: a kept one, or a new one opened on the board's runtime.
    pub(crate) async fn get(&self) -> Result<Conn, BoardError> {
        let got = OnRuntime {
            runtime: &self.runtime,
            future: Box::pin(self.clients.get()),
        }
        .await;
        let client = match got {
            Ok(client) => client,
            Err(deadpool_postgres::PoolError::Backend(error)) => {
                return Err(unreachable(&self.name, &error));
            }
            Err(error) => {
                return Err(BoardError::Storage(format!("{}: {error}", self.name)));
            }
        };
        Ok(Conn {
            client: Some(client),
            in_transaction: false,
        })
    }
}

/// `future`, polled inside the board's runtime: a connection it opens
/// (deadpool's manager spawns the connection's task) lives there, while a
/// kept connection is handed out on the caller's thread, with no hop to
/// the runtime's and back.
struct OnRuntime<'r, F> {
    runtime: &'r tokio::runtime::Handle,
    future: std::pin::Pin<Box<F>>,
}

impl<F: std::future::Future> std::future::Future for OnRuntime<'_, F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let _inside = self.runtime.enter();
        self.future.as_mut().poll(context)
    }
}

/// A column of a row, typed; a mismatch is a storage error, never a panic.
pub(crate) fn col<'r, T: FromSql<'r>>(row: &'r Row, index: usize) -> TxResult<T> {
    row.try_get(index).map_err(pg)
}
