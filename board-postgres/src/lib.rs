//! The kanban board on PostgreSQL: the same ports and the same contract as
//! the SQLite board, for dispatchers on several hosts sharing one board.
//!
//! [`PgBoard`] implements core's `Board`, `BoardAdmin` and `DispatchBoard`.
//! As on SQLite, every rule is core's: a write locks the card's row
//! (`SELECT … FOR UPDATE`), reads what the rule needs, and applies core's
//! transition in the same transaction. Claims skip rows another claimer has
//! locked (`FOR UPDATE SKIP LOCKED`), so no claim ever waits for another.
//! Every worker write checks its fence (card running, same run open, same
//! claim lock, unexpired lease) on the locked row. Time always comes from
//! the board's [`kanban_core::Clock`], never from the server's `now()`, so
//! a virtual clock drives this board exactly as it drives SQLite's.

mod admin;
mod conn;
mod dispatch;
mod rows;
mod schema;
mod tls;
mod watch;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;

use kanban_core::{BoardError, Clock};

pub use schema::{MIGRATIONS, SCHEMA_VERSION};
/// The driver's connection settings, and a host in them.
pub use tokio_postgres::Config;
pub use tokio_postgres::config::Host;
pub use watch::ChangeWatch;

use conn::{Pool, TxError, storage_error};

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

/// `bytes` with every byte but the URL's unreserved ones percent-encoded:
/// a name with `@`, `/`, `?` or `:` in it reads back as itself.
fn encoded(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for &byte in bytes {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            text.push(char::from(byte));
        } else {
            text.push_str(&format!("%{byte:02X}"));
        }
    }
    text
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
                value = Some(decoded(raw));
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

/// `text` with its `%XX` escapes read back (anything else kept as
/// written); the bytes themselves when they are not UTF-8.
fn decoded(text: &str) -> Result<String, Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escape = match bytes.get(at..at + 3) {
            Some([b'%', high, low]) if high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => {
                char::from(*high)
                    .to_digit(16)
                    .zip(char::from(*low).to_digit(16))
                    .and_then(|(high, low)| u8::try_from(high * 16 + low).ok())
            }
            _ => None,
        };
        match escape {
            Some(byte) => {
                out.push(byte);
                at += 3;
            }
            None => {
                out.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|error| error.into_bytes())
}

/// A kanban board in one PostgreSQL database.
pub struct PgBoard {
    pool: Pool,
    clock: Arc<dyn Clock>,
    /// Runs the clients' connection tasks; shut down with the board.
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for PgBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgBoard")
            .field("board", &self.pool.name)
            .finish_non_exhaustive()
    }
}

impl Drop for PgBoard {
    fn drop(&mut self) {
        // Never block: the board may be dropped inside another runtime.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl PgBoard {
    /// Connects to the board at `config`, creating or upgrading its schema
    /// (under an advisory lock, so dispatchers starting at once agree), and
    /// reads time from `clock`.
    pub async fn connect(url: BoardUrl, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let board = Self::start(url, clock)?;
        board.migrate().await?;
        Ok(board)
    }

    /// Connects to the board at `config` as it is: a worker, an agent's
    /// call or a proof never creates or upgrades a schema. A database
    /// without a board, or with another schema version, is refused; a
    /// server out of reach is a passing fault (`Storage`).
    pub async fn open(url: BoardUrl, clock: Arc<dyn Clock>) -> Result<Self, BoardError> {
        let board = Self::start(url, clock)?;
        let found: Option<i64> = snapshot!(board, |conn, _now| {
            let exists: bool = conn
                .value("SELECT to_regclass('kanban_schema') IS NOT NULL", &[])
                .await?;
            if !exists {
                return Ok(None);
            }
            let version: Option<i64> = conn
                .value("SELECT MAX(version) FROM kanban_schema", &[])
                .await?;
            Ok(version)
        })?;
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
        let pool = Pool::new(config, tls, runtime.handle().clone(), name);
        Ok(Self {
            pool,
            clock,
            runtime: Some(runtime),
        })
    }

    /// The board's URL without a password: what claims carry.
    pub fn url(&self) -> &str {
        &self.pool.name
    }

    async fn migrate(&self) -> Result<(), BoardError> {
        let name = self.pool.name.clone();
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(|error| conn::unreachable_at_open(&name, error))?;
        let fail = |error: tokio_postgres::Error| storage_error(&name, &error);
        conn.begin("BEGIN").await.map_err(fail)?;
        let outcome = schema::migrate(&mut conn, &name).await;
        match outcome {
            Ok(()) => conn.end(true).await.map_err(fail),
            Err(error) => {
                let _ = conn.end(false).await;
                Err(match error {
                    TxError::Pg(error) => fail(error),
                    TxError::Board(error) | TxError::CommitThen(error) => error,
                })
            }
        }
    }

    /// Runs `body` in a read-write transaction, retried on a serialization
    /// failure or a deadlock; a [`TxError::CommitThen`] commits and fails.
    pub(crate) async fn settle<T>(
        &self,
        conn: &mut conn::Conn,
        outcome: Result<T, TxError>,
    ) -> Result<Result<T, BoardError>, tokio_postgres::Error> {
        match outcome {
            Ok(value) => {
                conn.end(true).await?;
                Ok(Ok(value))
            }
            Err(TxError::CommitThen(error)) => {
                conn.end(true).await?;
                Ok(Err(error))
            }
            Err(TxError::Board(error)) => {
                conn.end(false).await?;
                Ok(Err(error))
            }
            Err(TxError::Pg(error)) => {
                let _ = conn.end(false).await;
                Err(error)
            }
        }
    }

    pub(crate) fn fail(&self, error: &tokio_postgres::Error) -> BoardError {
        storage_error(&self.pool.name, error)
    }
}

/// Runs a block as one write transaction on a pooled connection, with the
/// board's time: `transaction!(self, |tx, now| { … Ok(value) })`. Retried whole on
/// a conflict PostgreSQL resolved by failing this side.
macro_rules! transaction {
    ($board:expr, |$tx:ident, $now:ident| $body:block) => {{
        let board = &$board;
        let mut pooled = board.pool.get().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let $now: i64 = board.clock.now();
            if let Err(error) = pooled.begin("BEGIN").await {
                break Err(board.fail(&error));
            }
            let outcome: Result<_, $crate::conn::TxError> = async {
                let $tx: &mut $crate::conn::Conn = &mut pooled;
                $body
            }
            .await;
            match board.settle(&mut pooled, outcome).await {
                Ok(result) => break result,
                Err(error)
                    if $crate::conn::is_conflict(&error)
                        && attempt < $crate::conn::CONFLICT_RETRIES =>
                {
                    continue;
                }
                Err(error) => break Err(board.fail(&error)),
            }
        }
    }};
}

/// Runs a block of reads in one read-only snapshot:
/// `snapshot!(self, |conn, now| { … Ok(value) })`.
macro_rules! snapshot {
    ($board:expr, |$conn:ident, $now:ident| $body:block) => {{
        let board = &$board;
        let mut pooled = board.pool.get().await?;
        let $now: i64 = board.clock.now();
        match pooled
            .begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
        {
            Err(error) => Err(board.fail(&error)),
            Ok(()) => {
                let outcome: Result<_, $crate::conn::TxError> = async {
                    let $conn: &mut $crate::conn::Conn = &mut pooled;
                    $body
                }
                .await;
                match board.settle(&mut pooled, outcome).await {
                    Ok(result) => result,
                    Err(error) => Err(board.fail(&error)),
                }
            }
        }
    }};
}

pub(crate) use {snapshot, transaction};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_url_reads_back_as_the_same_board_whatever_its_names_hold() {
        for url in [
            "postgres://kanban@db.example:6543/boards",
            "postgres://a%40b%3Ac@%2Fvar%2Frun%2Fpostgres%20sock:5433/x%2Fy%3Fz",
            "postgres://k@[::1]:5432/k",
            "postgres://%C3%A9l%C3%A8ve@localhost/d%C3%A9p%C3%B4t",
        ] {
            let parsed = parse_url(url).unwrap();
            let again = parse_url(&public_url(&parsed)).unwrap();
            let (config, again) = (&parsed.config, &again.config);
            assert_eq!(again.get_user(), config.get_user(), "{url}");
            assert_eq!(again.get_hosts(), config.get_hosts(), "{url}");
            assert_eq!(again.get_ports(), config.get_ports(), "{url}");
            assert_eq!(again.get_dbname(), config.get_dbname(), "{url}");
        }
        let odd = parse_url("postgres://a%40b@%2Ftmp%2Fpg:5433/x%2Fy").unwrap();
        assert_eq!(odd.config.get_user(), Some("a@b"));
        assert_eq!(public_url(&odd), "postgres://a%40b@%2Ftmp%2Fpg:5433/x%2Fy");
    }

    #[test]
    fn tls_settings_read_back_and_the_root_certificate_is_named_absolutely() {
        use tokio_postgres::config::SslMode;
        let dir = std::env::temp_dir().join(format!("kanban-tls-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a b")).unwrap();
        let ca = dir.join("a b").join("ca.pem");
        std::fs::write(&ca, "").unwrap();
        let given = format!(
            "postgres://k@db.example:5432/k?sslmode=require&sslrootcert={}&connect_timeout=3",
            ca.display().to_string().replace(' ', "%20")
        );
        let parsed = parse_url(&given).unwrap();
        assert_eq!(parsed.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(parsed.root_cert.as_deref(), Some(ca.as_path()));
        assert_eq!(
            parsed.config.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3)),
            "the other parameters reach the driver"
        );
        let public = public_url(&parsed);
        assert!(
            public.contains("/k?sslmode=require&sslrootcert=%2F"),
            "{public}"
        );
        let again = parse_url(&public).unwrap();
        assert_eq!(again.root_cert, parsed.root_cert);
        assert_eq!(again.config.get_ssl_mode(), SslMode::Require);
        assert_eq!(public_url(&again), public);
        // Without TLS asked for, the URL is as before.
        let plain = parse_url("postgres://k@db.example:5432/k?sslmode=disable").unwrap();
        assert_eq!(public_url(&plain), "postgres://k@db.example:5432/k");
        // A root certificate that is not there is named.
        let missing = parse_url("postgres://k@h/k?sslmode=require&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("sslrootcert /nonexistent/ca.pem cannot be read"),
            "{missing}"
        );
        // Settings that would not do what they seem are refused by name.
        for (given, said) in [
            (
                "postgres://k@h/k?sslrootcert=/etc/ca.pem",
                "without sslmode=require",
            ),
            (
                "postgres://k@h/k?sslmode=prefer&sslrootcert=/etc/ca.pem",
                "without sslmode=require",
            ),
            (
                "postgres://k@h/k?sslmode=require&sslrootcert=",
                "an empty sslrootcert",
            ),
            ("postgres://k@%2Ftmp/k?sslmode=require", "on a Unix socket"),
            (
                "postgres://k@h/k?sslmode=require&sslrootcert=%FF%FE",
                "not UTF-8",
            ),
        ] {
            let error = parse_url(given).unwrap_err().to_string();
            assert!(error.contains(said), "{given}: {error}");
        }
        // Only two hexadecimal digits make an escape.
        assert_eq!(decoded("%2F%+A%4"), Ok("/%+A%4".to_owned()));
        assert_eq!(decoded("caf%C3%A9"), Ok("café".to_owned()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
