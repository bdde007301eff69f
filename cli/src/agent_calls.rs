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
use kanban_core::ExitCode;
use kanban_core::{BIND_PATIENCE, Claim, Environment};

use crate::board_path::{OpenBoard, open_claim_board};
use crate::out::{errln, outln};
use crate::runtime::block_on;
use crate::worker_calls::{Call, CallError, Done, SOCKET_VAR, ask_worker, perform};

/// The exit code of a board call the environment failed.
const ENVIRONMENT: ExitCode = ExitCode::TempFail;

/// Where an agent's calls go: to its worker while one answers, else to
/// the board, opened once.
struct Route<'a> {
    env: &'a Environment,
    claim: Claim,
    board: Option<OpenBoard>,
}

impl<'a> Route<'a> {
    fn new(env: &'a Environment) -> anyhow::Result<Self> {
        let claim = Claim::from_env(env).context("this command works a claimed card")?;
        Ok(Self {
            env,
            claim,
            board: None,
        })
    }

    fn call(&mut self, call: &Call) -> Result<Done, CallError> {
        if self.board.is_none()
            && let Some(answered) = ask_worker(self.env.get(SOCKET_VAR), &self.claim, call)
        {
            return answered;
        }
        let board = match &self.board {
            Some(board) => board,
            None => {
                let opened = block_on(open_claim_board(
                    &self.claim,
                    Arc::new(SystemClock),
                    self.env,
                ))
                .map_err(|error| CallError::Unopenable(format!("{error:#}")))?;
                self.board.insert(opened)
            }
        };
        block_on(perform(&**board, &self.claim, call))
    }
}

/// Runs one fenced call, waiting out a lapsed lease and passing board
/// faults: the dispatcher renews a live worker's lease within a tick.
fn fenced(
    env: &Environment,
    call: &Call,
    done: impl FnOnce(&Claim, Done),
) -> anyhow::Result<ExitCode> {
    let mut route = Route::new(env)?;
    let started = Instant::now();
    loop {
        let error = match route.call(call) {
            Ok(value) => {
                done(&route.claim, value);
                return Ok(ExitCode::Success);
            }
            Err(CallError::Refused(message)) => return Err(anyhow::anyhow!(message)),
            Err(CallError::Unopenable(message)) => {
                errln!("error: {message}");
                return Ok(ENVIRONMENT);
            }
            Err(CallError::Lapsed(message) | CallError::Failed(message)) => message,
        };
        if started.elapsed() >= BIND_PATIENCE {
            errln!(
                "error: {error}\nthe board or the lease failed, not the card: exiting 75 so that the worker books it as such"
            );
            return Ok(ENVIRONMENT);
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

pub(crate) fn complete(
    env: &Environment,
    summary: &str,
    result: Option<String>,
    metadata: Option<serde_json::Map<String, serde_json::Value>>,
    created_cards: Vec<String>,
) -> anyhow::Result<ExitCode> {
    let call = Call::Complete {
        summary: summary.to_owned(),
        result,
        metadata,
        created_cards,
    };
    fenced(env, &call, |claim, _| outln!("{} completed", claim.task_id))
}

/// Makes a card from inside the run; it waits for the run's card. A call
/// retried after a lost answer finds the card the first one made: each
/// call carries an idempotency key of its own when it names none.
pub(crate) fn create(
    env: &Environment,
    claim: &Claim,
    mut task: kanban_core::NewTask,
    json: bool,
) -> anyhow::Result<ExitCode> {
    if task.idempotency_key.is_none() {
        task.idempotency_key = Some(format!(
            "{}#{}:{}",
            claim.task_id,
            claim.run_id,
            crate::supervisor::random_hex()
        ));
    }
    let call = Call::Create { task };
    fenced(env, &call, |claim, done| {
        let id = done.created.unwrap_or_default();
        if json {
            outln!(
                "{}",
                serde_json::json!({"id": id, "parent": claim.task_id, "run_id": claim.run_id})
            );
        } else {
            outln!("{id}");
        }
    })
}

/// Records a file this run attached to its own card (already written).
pub(crate) fn attach(
    env: &Environment,
    new: kanban_core::attachments::NewAttachment,
    done: impl FnOnce(i64),
) -> anyhow::Result<ExitCode> {
    let call = Call::Attach { new };
    fenced(env, &call, |_, answer| {
        done(answer.attached.unwrap_or_default())
    })
}

/// Makes `child`, a card this run's card made, wait for `parent` too.
pub(crate) fn link(env: &Environment, parent: &str, child: &str) -> anyhow::Result<ExitCode> {
    let call = Call::Link {
        parent: parent.to_owned(),
        child: child.to_owned(),
    };
    fenced(env, &call, |_, done| {
        if done.linked == Some(false) {
            outln!("{child} already waits for {parent}");
        } else {
            outln!("{child} waits for {parent}");
        }
    })
}

/// Unblocks a card this run's card made.
pub(crate) fn unblock(env: &Environment, task_id: &str) -> anyhow::Result<ExitCode> {
    let call = Call::Unblock {
        task_id: task_id.to_owned(),
    };
    fenced(env, &call, |_, _| outln!("{task_id} unblocked"))
}

pub(crate) fn block(
    env: &Environment,
    reason: &str,
    kind: Option<kanban_core::BlockKind>,
) -> anyhow::Result<ExitCode> {
    let call = Call::Block {
        reason: reason.to_owned(),
        kind,
    };
    fenced(env, &call, |claim, _| outln!("{} blocked", claim.task_id))
}

pub(crate) fn heartbeat(env: &Environment, note: Option<String>) -> anyhow::Result<ExitCode> {
    let mut route = Route::new(env)?;
    // A heartbeat is not worth waiting for: one refused is simply not made.
    match route.call(&Call::Heartbeat { note }) {
        Ok(done) => {
            let expires = done.lease_expires.unwrap_or_default();
            outln!("{} lease extended to {expires}", route.claim.task_id);
            Ok(ExitCode::Success)
        }
        Err(CallError::Lapsed(_)) => {
            errln!("the lease lapsed; the dispatcher renews it while this worker lives");
            Ok(ENVIRONMENT)
        }
        Err(CallError::Refused(message)) => Err(anyhow::anyhow!(message)),
        Err(CallError::Failed(message) | CallError::Unopenable(message)) => {
            errln!("error: {message}");
            Ok(ENVIRONMENT)
        }
    }
}

pub(crate) fn comment(env: &Environment, text: &str) -> anyhow::Result<ExitCode> {
    let author = env
        .get_trimmed("KANBAN_AUTHOR")
        .unwrap_or("worker")
        .to_owned();
    let call = Call::Comment {
        author,
        text: text.to_owned(),
    };
    fenced(env, &call, |claim, _| outln!("{} commented", claim.task_id))
}
