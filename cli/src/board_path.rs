//! Which board file a command means.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Environment, vars};

use crate::args::GlobalArgs;

/// The default board's name.
pub(crate) const DEFAULT_BOARD: &str = "default";

fn valid_slug(slug: &str) -> bool {
    let bytes = slug.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || *b == b'_')
}

/// The kanban home: `HERMES_KANBAN_HOME`, else `$XDG_DATA_HOME/kanban`, else
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
    bail!("cannot find a home for boards: set HERMES_KANBAN_HOME, or pass --db PATH")
}

/// The board's slug: `--board`, else `HERMES_KANBAN_BOARD`, else `default`.
pub(crate) fn board_slug(global: &GlobalArgs, env: &Environment) -> anyhow::Result<String> {
    let slug = global
        .board
        .as_deref()
        .or(env.get_trimmed(vars::BOARD))
        .unwrap_or(DEFAULT_BOARD)
        .trim()
        .to_lowercase();
    if !valid_slug(&slug) {
        bail!(
            "board name {slug:?} is not valid: use 1-64 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        );
    }
    Ok(slug)
}

/// The board file: `--db`, else `HERMES_KANBAN_DB`, else the named board
/// under the kanban home.
pub(crate) fn board_path(global: &GlobalArgs, env: &Environment) -> anyhow::Result<PathBuf> {
    if let Some(db) = &global.db {
        return Ok(db.clone());
    }
    if let Some(db) = env.get_trimmed(vars::DB) {
        return Ok(PathBuf::from(db));
    }
    let slug = board_slug(global, env)?;
    Ok(kanban_home(env)?
        .join("boards")
        .join(slug)
        .join("kanban.db"))
}

/// Opens the board a command means.
pub(crate) fn open_board(global: &GlobalArgs, env: &Environment) -> anyhow::Result<SqliteBoard> {
    let path = board_path(global, env)?;
    Ok(SqliteBoard::open(&path, Arc::new(SystemClock))?)
}

/// Opens the board a command means, for reading only: a board of the seed
/// system is read without being written.
pub(crate) fn open_board_for_reading(
    global: &GlobalArgs,
    env: &Environment,
) -> anyhow::Result<SqliteBoard> {
    let path = board_path(global, env)?;
    Ok(SqliteBoard::open_for_reading(&path, Arc::new(SystemClock))?)
}
