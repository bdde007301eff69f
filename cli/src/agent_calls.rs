//! The board calls an agent makes from inside a turn. Each reads the claim
//! carrier and goes through a fenced write: a stale worker is refused,
//! exits 1, and the board keeps its state.
//!
//! Two refusals are not the card's doing, and exit 75 instead (so an agent
//! that passes its board call's code on never has its card charged): the
//! board failing (busy, full, unreadable), and a lease that only ran out
//! (the card is still this run's) and was not renewed within 90 s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kanban_board_sqlite::SystemClock;
use kanban_core::{BIND_PATIENCE, BoardError, Claim, Environment};

use crate::board_path::{OpenBoard, open_claim_board};
use crate::out::{errln, outln};
use crate::runtime::block_on;

/// The exit code of a board call the environment failed.
const ENVIRONMENT: i32 = 75;

fn carrier(env: &Environment) -> anyhow::Result<(Claim, OpenBoard)> {
    let claim = Claim::from_env(env).context("this command works a claimed card")?;
    let board = block_on(open_claim_board(&claim, Arc::new(SystemClock), env))?;
    Ok((claim, board))
}

/// Runs one fenced call, waiting out a lapsed lease and passing board
/// faults: the dispatcher renews a live worker's lease within a tick.
fn fenced<T>(
    mut call: impl FnMut() -> Result<T, BoardError>,
    done: impl FnOnce(T),
) -> anyhow::Result<i32> {
    let started = Instant::now();
    loop {
        let error = match call() {
            Ok(value) => {
                done(value);
                return Ok(0);
            }
            Err(error) => error,
        };
        let passing = match &error {
            BoardError::LeaseLost { reason, .. } => reason.only_expired(),
            BoardError::TaskNotFound(_)
            | BoardError::InvalidInput(_)
            | BoardError::InvalidTransition { .. } => false,
            _ => true,
        };
        if !passing {
            return Err(match error {
                BoardError::LeaseLost { .. } => anyhow::anyhow!(
                    "{error}\nhint: the card was reclaimed, settled or taken by a newer run; `kanban show TASK` tells which"
                ),
                other => other.into(),
            });
        }
        if started.elapsed() >= BIND_PATIENCE {
            errln!(
                "error: {error}\nthe board or the lease failed, not the card: exiting 75 so that the worker books it as such"
            );
            return Ok(ENVIRONMENT);
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Opens the carrier's board; a board that cannot be opened is the
/// environment's fault (75), a missing carrier the caller's (1).
fn open(env: &Environment) -> anyhow::Result<Result<(Claim, OpenBoard), i32>> {
    let claim = Claim::from_env(env).context("this command works a claimed card")?;
    match block_on(open_claim_board(&claim, Arc::new(SystemClock), env)) {
        Ok(board) => Ok(Ok((claim, board))),
        Err(error) => {
            errln!("error: {error:#}");
            Ok(Err(ENVIRONMENT))
        }
    }
}

pub(crate) fn complete(
    env: &Environment,
    summary: &str,
    result: Option<String>,
) -> anyhow::Result<i32> {
    let (claim, board) = match open(env)? {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    fenced(
        || block_on(board.complete(&claim, summary, result.clone())),
        |()| outln!("{} completed", claim.task_id),
    )
}

pub(crate) fn block(env: &Environment, reason: &str) -> anyhow::Result<i32> {
    let (claim, board) = match open(env)? {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    fenced(
        || block_on(board.block(&claim, reason)),
        |()| outln!("{} blocked", claim.task_id),
    )
}

pub(crate) fn heartbeat(env: &Environment, note: Option<String>) -> anyhow::Result<i32> {
    let (claim, board) = carrier(env)?;
    // A heartbeat is not worth waiting for: one refused is simply not made.
    match block_on(board.heartbeat(&claim, note)) {
        Ok(expires) => {
            outln!("{} lease extended to {expires}", claim.task_id);
            Ok(0)
        }
        Err(BoardError::LeaseLost { reason, .. }) if reason.only_expired() => {
            errln!("the lease lapsed; the dispatcher renews it while this worker lives");
            Ok(ENVIRONMENT)
        }
        Err(error @ BoardError::LeaseLost { .. }) => Err(anyhow::anyhow!(
            "{error}\nhint: the card was reclaimed, settled or taken by a newer run; `kanban show TASK` tells which"
        )),
        Err(error) => {
            errln!("error: {error}");
            Ok(ENVIRONMENT)
        }
    }
}

pub(crate) fn comment(env: &Environment, text: &str) -> anyhow::Result<i32> {
    let (claim, board) = match open(env)? {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    let author = env
        .get_trimmed("KANBAN_AUTHOR")
        .unwrap_or("worker")
        .to_owned();
    fenced(
        || block_on(board.comment(&claim, &author, text)),
        |()| outln!("{} commented", claim.task_id),
    )
}
