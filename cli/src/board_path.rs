//! Which board a command means: a SQLite file, or a PostgreSQL database
//! named by a `postgres://` URL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::bail;
use kanban_board_postgres::{PgBoard, is_postgres_url};
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Board, BoardAdmin, Clock, DispatchBoard, Environment, vars};

use crate::args::GlobalArgs;

pub(crate) use crate::home::DEFAULT_BOARD;
use crate::home::{Home, normalized_slug};

/// The kanban home: `HERMES_KANBAN_HOME` (or `KANBAN_HOME`), else `$XDG_DATA_HOME/kanban`, else
/// `~/.local/share/kanban`.
pub(crate) fn kanban_home(env: &Environment) -> anyhow::Result<PathBuf> {
    if let Some(home) = env.get_trimmed(vars::HOME) {
        return Ok(PathBuf::from(home));
    }
    if let Some(data) = env.get_trimmed("XDG_DATA_HOME") {
        return Ok(PathBuf::from(data).join("kanban"));
    }
    if let Some(home) = env.get_trimmed("HOME") {
        return Ok(PathBuf::from(home).join(".local/share/kanban"));
    }
    bail!(
        "cannot find a home for boards: set KANBAN_HOME (or HERMES_KANBAN_HOME), or pass --db PATH"
    )
}

/// The kanban home's boards.
pub(crate) fn home(env: &Environment) -> anyhow::Result<Home> {
    kanban_home(env).map(Home::at)
}

/// The board's slug: `--board`, else `HERMES_KANBAN_BOARD` (or
/// `KANBAN_BOARD`), else the home's current board (`kanban boards
/// switch`), else `default`.
pub(crate) fn board_slug(global: &GlobalArgs, env: &Environment) -> anyhow::Result<String> {
    if let Some(given) = global.board.as_deref().or(env.get_trimmed(vars::BOARD)) {
        return normalized_slug(given);
    }
    Ok(home(env)
        .ok()
        .and_then(|home| home.current())
        .unwrap_or_else(|| DEFAULT_BOARD.to_owned()))
}

/// The board: `--db`, else `HERMES_KANBAN_DB` (or `KANBAN_DB`), else the
/// named board under the kanban home. A `postgres://` URL comes back as a
/// path; [`open_board`] tells the two apart.
pub(crate) fn board_path(global: &GlobalArgs, env: &Environment) -> anyhow::Result<PathBuf> {
    if let Some(db) = &global.db {
        return Ok(db.clone());
    }
    if let Some(db) = env.get_trimmed(vars::DB) {
        return Ok(PathBuf::from(db));
    }
    let slug = board_slug(global, env)?;
    home(env)?.board_db(&slug)
}

/// The board's URL when `path` names a PostgreSQL board.
pub(crate) fn postgres_url(path: &Path) -> Option<&str> {
    path.to_str().filter(|text| is_postgres_url(text))
}

/// The board ports a command works through, whichever engine keeps them.
pub(crate) trait AnyBoard: kanban_agent_port::ToolBoard + DispatchBoard {}

impl<T: Board + BoardAdmin + DispatchBoard> AnyBoard for T {}

/// The engine keeping a board.
#[derive(Debug)]
pub(crate) enum Engine {
    Sqlite(SqliteBoard),
    Postgres(Box<PgBoard>),
}

/// An open board: its engine, and the folder on this host where its logs
/// and agents file live (beside a SQLite file; under the kanban home for a
/// PostgreSQL board, one folder per host).
#[derive(Debug)]
pub(crate) struct OpenBoard {
    pub(crate) engine: Engine,
    pub(crate) folder: PathBuf,
}

impl std::ops::Deref for OpenBoard {
    type Target = dyn AnyBoard;

    fn deref(&self) -> &(dyn AnyBoard + 'static) {
        match &self.engine {
            Engine::Sqlite(board) => board,
            Engine::Postgres(board) => &**board,
        }
    }
}

impl OpenBoard {
    /// A SQLite board opened for reading, its folder beside it.
    pub(crate) fn for_reading(board: SqliteBoard) -> Self {
        let folder = board.path().parent().unwrap_or(Path::new(".")).to_owned();
        Self {
            engine: Engine::Sqlite(board),
            folder,
        }
    }

    /// The board's name in messages and claims: the canonical file path, or
    /// the URL without a password.
    pub(crate) fn name(&self) -> String {
        match &self.engine {
            Engine::Sqlite(board) => board.path().display().to_string(),
            Engine::Postgres(board) => board.url().to_owned(),
        }
    }

    /// The same board, a SQLite board's blocking work offloaded to
    /// `offload`.
    pub(crate) fn with_offload(self, offload: Arc<dyn kanban_board_sqlite::Offload>) -> Self {
        let engine = match self.engine {
            Engine::Sqlite(board) => Engine::Sqlite(board.with_offload(offload)),
            postgres @ Engine::Postgres(_) => postgres,
        };
        Self {
            engine,
            folder: self.folder,
        }
    }

    /// The board's counts, for metrics.
    pub(crate) async fn stats(&self) -> Result<kanban_core::BoardStats, kanban_core::BoardError> {
        match &self.engine {
            Engine::Sqlite(board) => board.stats().await,
            Engine::Postgres(board) => board.stats().await,
        }
    }

    /// The walls, the last event's time and the dispatchers' reports, in
    /// one read.
    pub(crate) async fn health(
        &self,
    ) -> Result<kanban_board::BoardHealth, kanban_core::BoardError> {
        match &self.engine {
            Engine::Sqlite(board) => board.health().await,
            Engine::Postgres(board) => board.health().await,
        }
    }

    /// A page of one lane, narrowed by a filter: its count and cards.
    pub(crate) async fn lane_page(
        &self,
        lane: kanban_board::Lane,
        filter: &kanban_board::LaneFilter,
        limit: usize,
        skip: usize,
    ) -> Result<kanban_board::LanePage, kanban_core::BoardError> {
        match &self.engine {
            Engine::Sqlite(board) => board.lane_page(lane, filter, limit, skip).await,
            Engine::Postgres(board) => board.lane_page(lane, filter, limit, skip).await,
        }
    }

    /// The newest event of each of these cards: its kind and time.
    pub(crate) async fn last_events(
        &self,
        ids: &[String],
    ) -> Result<kanban_board::LastEvents, kanban_core::BoardError> {
        match &self.engine {
            Engine::Sqlite(board) => board.last_events(ids).await,
            Engine::Postgres(board) => board.last_events(ids).await,
        }
    }

    /// The worker's and agents' ports as one shared value.
    pub(crate) fn into_tool_board(self) -> Arc<dyn kanban_agent_port::ToolBoard> {
        match self.engine {
            Engine::Sqlite(board) => Arc::new(board),
            Engine::Postgres(board) => Arc::<PgBoard>::from(board),
        }
    }

    /// The ports as one shared value, a SQLite board's work done inline.
    pub(crate) fn into_inline(self) -> Arc<dyn AnyBoard> {
        match self.engine {
            Engine::Sqlite(board) => Arc::new(board),
            Engine::Postgres(board) => Arc::<PgBoard>::from(board),
        }
    }

    /// The ports as one shared value (the dispatcher's), SQLite's blocking
    /// work offloaded to `offload`.
    pub(crate) fn into_shared(
        self,
        offload: Arc<dyn kanban_board_sqlite::Offload>,
    ) -> Arc<dyn AnyBoard> {
        match self.engine {
            Engine::Sqlite(board) => Arc::new(board.with_offload(offload)),
            Engine::Postgres(board) => Arc::<PgBoard>::from(board),
        }
    }
}

/// The connection settings of a board URL, its password from the
/// environment or the password file, never from the URL
/// ([`kanban_board_postgres::settings`]).
pub(crate) fn postgres_config(
    url: &str,
    env: &Environment,
) -> anyhow::Result<kanban_board_postgres::BoardUrl> {
    Ok(kanban_board_postgres::settings(url, env)?)
}

/// Whether opening a PostgreSQL board may create or upgrade its schema:
/// `init`, `migrate` and a dispatcher may; a worker, an agent's call, a
/// proof or a listing never does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Schema {
    AsItIs,
    Upgrade,
}

/// Opens the board `db` names (a file, or a `postgres://` URL), reading
/// time from `clock`; `folder` is where a PostgreSQL board's logs live on
/// this host.
pub(crate) async fn open_db(
    db: &Path,
    clock: Arc<dyn Clock>,
    env: &Environment,
    schema: Schema,
    folder: impl FnOnce() -> anyhow::Result<PathBuf>,
) -> anyhow::Result<OpenBoard> {
    if let Some(url) = postgres_url(db) {
        let config = postgres_config(url, env)?;
        let board = match schema {
            Schema::Upgrade => PgBoard::connect(config, clock).await?,
            Schema::AsItIs => PgBoard::open(config, clock).await?,
        };
        return Ok(OpenBoard {
            engine: Engine::Postgres(Box::new(board)),
            folder: folder()?,
        });
    }
    let board = SqliteBoard::open(db, clock)?;
    let folder = board.path().parent().unwrap_or(Path::new(".")).to_owned();
    Ok(OpenBoard {
        engine: Engine::Sqlite(board),
        folder,
    })
}

/// The folder of a PostgreSQL board on this host: the named board's folder
/// under the kanban home.
pub(crate) fn host_folder(global: &GlobalArgs, env: &Environment) -> anyhow::Result<PathBuf> {
    let slug = board_slug(global, env)?;
    Ok(home(env)?.board_folder(&slug))
}

/// Opens the board a claim pins (the carrier's `HERMES_KANBAN_DB`).
pub(crate) async fn open_claim_board(
    claim: &kanban_core::Claim,
    clock: Arc<dyn Clock>,
    env: &Environment,
) -> anyhow::Result<OpenBoard> {
    open_db(Path::new(&claim.db), clock, env, Schema::AsItIs, || {
        Ok(claim_host_folder(env))
    })
    .await
}

/// The folder on this host of the PostgreSQL board a claim pins: the
/// folder of the carrier's board under the kanban home.
pub(crate) fn claim_host_folder(env: &Environment) -> PathBuf {
    let slug = env
        .get_trimmed(vars::BOARD)
        .and_then(|given| normalized_slug(given).ok())
        .unwrap_or_else(|| DEFAULT_BOARD.to_owned());
    home(env).map_or_else(|_| PathBuf::from("."), |home| home.board_folder(&slug))
}

/// The folder of the board `db` names on this host, without opening it.
pub(crate) fn board_folder(
    global: &GlobalArgs,
    env: &Environment,
    db: &Path,
) -> anyhow::Result<PathBuf> {
    if postgres_url(db).is_some() {
        return host_folder(global, env);
    }
    Ok(db.parent().unwrap_or(Path::new(".")).to_owned())
}

/// Opens the board a command means.
pub(crate) fn open_board(global: &GlobalArgs, env: &Environment) -> anyhow::Result<OpenBoard> {
    open_board_with(global, env, Schema::AsItIs)
}

/// Opens the board a command means, creating or upgrading a PostgreSQL
/// board's schema (`init`, `migrate`).
pub(crate) fn open_board_with(
    global: &GlobalArgs,
    env: &Environment,
    schema: Schema,
) -> anyhow::Result<OpenBoard> {
    let path = board_path(global, env)?;
    crate::runtime::block_on(open_db(&path, Arc::new(SystemClock), env, schema, || {
        host_folder(global, env)
    }))
}

/// Opens the board a command means, for reading only: a board of the seed
/// system is read without being written.
pub(crate) fn open_board_for_reading(
    global: &GlobalArgs,
    env: &Environment,
) -> anyhow::Result<OpenBoard> {
    let path = board_path(global, env)?;
    if postgres_url(&path).is_some() {
        return open_board(global, env);
    }
    let board = SqliteBoard::open_for_reading(&path, Arc::new(SystemClock))?;
    Ok(OpenBoard::for_reading(board))
}
