//! The terminal board calls an agent makes from inside a turn. Each reads
//! the claim carrier and goes through a fenced write: a stale worker is
//! refused, exits 1, and the board keeps its state.

use std::sync::Arc;

use anyhow::Context;
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Board, BoardError, Claim, Environment};

use crate::runtime::block_on;

fn carrier(env: &Environment) -> anyhow::Result<(Claim, SqliteBoard)> {
    let claim = Claim::from_env(env).context("this command works a claimed card")?;
    let board = SqliteBoard::open(&claim.db, Arc::new(SystemClock))?;
    Ok((claim, board))
}

fn refused(error: BoardError) -> anyhow::Error {
    match error {
        BoardError::LeaseLost { .. } => anyhow::anyhow!(
            "{error}\nhint: the card was reclaimed, settled or its lease ran out; `kanban show TASK` tells which"
        ),
        other => other.into(),
    }
}

pub(crate) fn complete(
    env: &Environment,
    summary: &str,
    result: Option<String>,
) -> anyhow::Result<i32> {
    let (claim, board) = carrier(env)?;
    block_on(board.complete(&claim, summary, result)).map_err(refused)?;
    println!("{} completed", claim.task_id);
    Ok(0)
}

pub(crate) fn block(env: &Environment, reason: &str) -> anyhow::Result<i32> {
    let (claim, board) = carrier(env)?;
    block_on(board.block(&claim, reason)).map_err(refused)?;
    println!("{} blocked", claim.task_id);
    Ok(0)
}

pub(crate) fn heartbeat(env: &Environment, note: Option<String>) -> anyhow::Result<i32> {
    let (claim, board) = carrier(env)?;
    let expires = block_on(board.heartbeat(&claim, note)).map_err(refused)?;
    println!("{} lease extended to {expires}", claim.task_id);
    Ok(0)
}

pub(crate) fn comment(env: &Environment, text: &str) -> anyhow::Result<i32> {
    let (claim, board) = carrier(env)?;
    let author = env.get_trimmed("KANBAN_AUTHOR").unwrap_or("worker");
    block_on(board.comment(&claim, author, text)).map_err(refused)?;
    println!("{} commented", claim.task_id);
    Ok(0)
}
