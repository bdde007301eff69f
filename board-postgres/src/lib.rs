//! The kanban board on PostgreSQL: the same ports and the same contract as
//! the SQLite board, for dispatchers on several hosts sharing one board.
//!
//! [`PgBoard`] is core's three board ports over the [`Postgres`] engine:
//! the steps are the shared board's (`kanban-board`), and this crate keeps
//! the connections, their transactions, the SQL and the migrations. Every
//! write locks what it reads to change (`SELECT … FOR UPDATE`), claims skip
//! rows another claimer holds (`FOR UPDATE SKIP LOCKED`), and time always
//! comes from the board's [`kanban_core::Clock`], never from the server's
//! `now()`, so a virtual clock drives this board exactly as it drives
//! SQLite's.

mod conn;
mod engine;
mod schema;
mod settings;
mod tls;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;

use kanban_board::{StoredBoard, TxError};
use kanban_core::{BoardError, Clock};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, percent_encode};

pub use engine::Postgres;
pub use schema::{MIGRATIONS, SCHEMA_VERSION};
pub use settings::settings;
/// The driver's connection settings, and a host in them.
pub use tokio_postgres::Config;
pub use tokio_postgres::config::Host;
pub use watch::ChangeWatch;

use conn::{Pool, storage_error};

/// Whether a `--db` value names a PostgreSQL board rather than a file.
pub fn is_postgres_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// A PostgreSQL board's address: the driver's settings, and the CA
/// certificates its server's certificate is verified against when the URL
/// asks for TLS (`sslmode=require&sslrootcert=PATH`; see `tls.rs`).
#[derive(Clone)]
pub struct BoardUrl {
    pub config: tokio_postgres::Config,
    /// `sslrootcert`, made absolute: every process it reaches reads the
    /// same file.
    pub root_cert: Option<PathBuf>,
}

impl std::fmt::Debug for BoardUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The settings may hold a password: only the public URL is shown.
        f.write_str(&public_url(self))
    }
}

/// A board URL as claims and messages carry it: no password, ever.
///
/// `postgres://USER@HOST:PORT/DBNAME`, whatever the input spelled (a
/// password in the URL is dropped here; the driver still uses it), then
/// `?sslmode=require` and its `sslrootcert` when the URL asks for TLS, so
/// that every process the claim reaches connects the same way.
pub fn public_url(url: &BoardUrl) -> String {
    let config = &url.config;
    use std::os::unix::ffi::OsStrExt;
    use tokio_postgres::config::Host;
    let user = config.get_user().unwrap_or("");
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) if host.contains(':') => format!("[{host}]"),
        Some(Host::Tcp(host)) => encoded(host.as_bytes()),
        // A socket folder goes percent-encoded, as the URL form asks.
        Some(Host::Unix(path)) => encoded(path.as_os_str().as_bytes()),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let dbname = config.get_dbname().unwrap_or(user);
    let at = if user.is_empty() {
        String::new()
    } else {
        format!("{}@", encoded(user.as_bytes()))
    };
    let tls = match (config.get_ssl_mode(), &url.root_cert) {
        (tokio_postgres::config::SslMode::Require, Some(root)) => format!(
            "?sslmode=require&sslrootcert={}",
            encoded(root.as_os_str().as_bytes())
        ),
        (tokio_postgres::config::SslMode::Require, None) => "?sslmode=require".to_owned(),
        _ => String::new(),
    };
    format!(
        "postgres://{at}{host}:{port}/{}{tls}",
        encoded(dbname.as_bytes())
    )
}

/// Every byte but the URL's unreserved ones is percent-encoded in a
/// public URL: a name with `@`, `/`, `?` or `:` reads back as itself.
const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encoded(bytes: &[u8]) -> String {
    percent_encode(bytes, RESERVED).to_string()
}

/// Parses a board URL; the error names what is wrong, never the password.
/// `sslrootcert` (which the driver does not know) is taken out here and
/// made absolute; a file that is not there is named at once.
pub fn parse_url(url: &str) -> Result<BoardUrl, BoardError> {
    let unusable = |message: String| BoardError::Unusable {
        path: "--db".to_owned(),
        message,
    };
    let (driver_url, root_cert) = take_param(url, "sslrootcert");
    let config = driver_url
        .parse::<tokio_postgres::Config>()
        .map_err(|error| {
            unusable(format!(
                "is not a PostgreSQL URL ({error}); write postgres://USER@HOST:PORT/DBNAME, with ?sslmode=require&sslrootcert=CA.pem for TLS"
            ))
        })?;
    let require = config.get_ssl_mode() == tokio_postgres::config::SslMode::Require;
    if require
        && config
            .get_hosts()
            .iter()
            .any(|host| matches!(host, Host::Unix(_)))
    {
        return Err(unusable(
            "asks for TLS (sslmode=require) on a Unix socket, where the server speaks none; name the server by host name or address".to_owned(),
        ));
    }
    let root_cert = match root_cert {
        None => None,
        Some(_) if !require => {
            return Err(unusable(
                "gives sslrootcert without sslmode=require, which would connect in the clear; add sslmode=require".to_owned(),
            ));
        }
        Some(Err(bytes)) => {
            return Err(unusable(format!(
                "gives an sslrootcert that is not UTF-8 ({} bytes); name the CA file by a UTF-8 path",
                bytes.len()
            )));
        }
        Some(Ok(path)) if path.is_empty() => {
            return Err(unusable(
                "gives an empty sslrootcert; name the PEM file of the CA that signed the server's certificate, or drop the parameter to trust the public roots".to_owned(),
            ));
        }
        // Absolute, not resolved: a CA file rotated behind a symbolic
        // link is read anew by every process the claim reaches.
        Some(Ok(path)) => Some(
            std::path::absolute(&path)
                .and_then(|absolute| std::fs::metadata(&absolute).map(|_| absolute))
                .map_err(|error| {
                    unusable(format!(
                        "sslrootcert {path} cannot be read ({error}); give the PEM file of the CA that signed the server's certificate"
                    ))
                })?,
        ),
    };
    Ok(BoardUrl { config, root_cert })
}

/// `url` without its query parameter `name`, and that parameter's last
/// value (percent-decoded; its bytes when they are not UTF-8), if any.
fn take_param(url: &str, name: &str) -> (String, Option<Result<String, Vec<u8>>>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((key, raw)) if key == name => {
                let bytes: Vec<u8> = percent_decode_str(raw).collect();
                value = Some(String::from_utf8(bytes).map_err(|error| error.into_bytes()));
                false
            }
            _ => true,
        })
        .collect();
    if kept.is_empty() {
        (base.to_owned(), value)
    } else {
        (format!("{base}?{}", kept.join("&")), value)
    }
}

/// A kanban board in one PostgreSQL database.
#[derive(Debug)]
pub struct PgBoard(StoredBoard<Postgres>);

kanban_board::board_ports!(PgBoard, Postgres);

impl PgBoard {
    /// Connects to the board at `url`, creating or upgrading its schema
    /// (under an advisory lock, so dispatchers starting at once agree), and
    /// reads time from `clock`.
    pub async fn connect(url: BoardUrl, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let board = Self::start(url, clock)?;
        board.migrate().await?;
        Ok(board)
    }

    /// Connects to the board at `url` as it is: a worker, an agent's call
    /// or a proof never creates or upgrades a schema. A database without a
    /// board, or with another schema version, is refused; a server out of
    /// reach is a passing fault (`Storage`).
    pub async fn open(url: BoardUrl, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let board = Self::start(url, clock)?;
        let found: Option<i64> = async {
            let conn = board.engine().pool.get().await?;
            let exists: bool = conn
                .value("SELECT to_regclass('kanban_schema') IS NOT NULL", &[])
                .await
                .map_err(|error| board.tx_error(error))?;
            if !exists {
                return Ok::<_, BoardError>(None);
            }
            conn.value("SELECT MAX(version) FROM kanban_schema", &[])
                .await
                .map_err(|error| board.tx_error(error))
        }
        .await?;
        let unusable = |message: String| BoardError::Unusable {
            path: board.url().to_owned(),
            message,
        };
        match found {
            None => Err(unusable(
                "holds no kanban board; create it with `kanban --db URL init`".to_owned(),
            )),
            Some(found) if found > SCHEMA_VERSION => Err(BoardError::NewerSchema {
                path: board.url().to_owned(),
                found,
                supported: SCHEMA_VERSION,
            }),
            Some(found) if found < SCHEMA_VERSION => Err(unusable(format!(
                "has schema {found}, older than this build's {SCHEMA_VERSION}; upgrade it with `kanban --db URL migrate`"
            ))),
            Some(_) => Ok(board),
        }
    }

    /// The board's runtime and pool, not yet connected. Every session gets
    /// bounds, so that a client that vanished mid-transaction cannot hold a
    /// card's row for hours: locks are waited for at most 10 s, a
    /// transaction left idle is ended after a minute, and a dead peer is
    /// noticed within half a minute.
    fn start(url: BoardUrl, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let name = public_url(&url);
        let tls = match url.config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => {
                Some(tls::Verified::trusting(url.root_cert.as_deref())?)
            }
            _ => None,
        };
        let mut config = url.config;
        const BOUNDS: &str = "-c lock_timeout=10s -c idle_in_transaction_session_timeout=60s";
        let options = match config.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{BOUNDS} {given}"),
            _ => BOUNDS.to_owned(),
        };
        config.options(options);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(std::time::Duration::from_secs(10));
        }
        config.keepalives_idle(std::time::Duration::from_secs(30));
        // Of several hosts in the URL, only a primary takes the board.
        config.target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
        config.tcp_user_timeout(std::time::Duration::from_secs(30));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kanban-postgres")
            .enable_all()
            .build()
            .map_err(|error| BoardError::Storage(format!("cannot start the driver: {error}")))?;
        let pool = Pool::new(config, tls, runtime.handle().clone(), name)?;
        Ok(Self(StoredBoard::new(Postgres {
            pool,
            clock,
            runtime: Some(runtime),
        })))
    }

    /// The board's URL without a password: what claims carry.
    pub fn url(&self) -> &str {
        &self.engine().pool.name
    }

    /// The lease proof: one read-only statement in its own snapshot.
    pub async fn prove(
        &self,
        request: &kanban_core::ProofRequest,
        identity: kanban_core::ProofIdentity,
    ) -> Result<(), kanban_core::NotLive> {
        kanban_board::Engine::prove(self.engine(), request, identity).await
    }

    /// A watch on the board's notifications (see [`Postgres::watch`]).
    pub fn watch(&self) -> ChangeWatch {
        self.engine().watch()
    }

    fn tx_error(&self, error: TxError) -> BoardError {
        error.into_board_error(|error| match error.downcast::<tokio_postgres::Error>() {
            Ok(error) => storage_error(self.url(), &error),
            Err(other) => BoardError::Storage(format!("{}: {other}", self.url())),
        })
    }

    async fn migrate(&self) -> Result<(), BoardError> {
        let name = self.url().to_owned();
        let mut conn = self
            .engine()
            .pool
            .get()
            .await
            .map_err(|error| conn::unreachable_at_open(&name, error))?;
        let fail = |error: tokio_postgres::Error| storage_error(&name, &error);
        conn.begin("BEGIN").await.map_err(fail)?;
        match schema::migrate(&mut conn, &name).await {
            Ok(()) => conn.end(true, false).await.map_err(fail),
            Err(error) => {
                let _ = conn.end(false, false).await;
                Err(self.tx_error(error))
            }
        }
    }
}
