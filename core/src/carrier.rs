//! The claim a worker holds, how it is carried, and why a proof can fail.

use crate::data::Claim;
use crate::env::{Environment, vars};

/// A claim carrier that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CarrierError {
    #[error(
        "{} is not set: this process was not given a claim (start it from `kanban dispatch`, or export it from `kanban claim --json`)",
        vars::both_names(.0)
    )]
    Missing(&'static str),
    #[error("{variable} is {value:?}, which is not a run id: it must be a whole number such as 1")]
    InvalidRunId {
        variable: &'static str,
        value: String,
    },
    #[error(
        "{variable} is {value:?}, which is not a task id: ids are 1-64 letters, digits, '_' or '-'"
    )]
    InvalidTaskId {
        variable: &'static str,
        value: String,
    },
}

/// Whether `id` can be a task id: 1-64 ASCII letters, digits, `_` or `-`.
///
/// Ids name log files and appear in shell lines, so one read from a board
/// (which anyone with the file can write) is checked before it is used:
/// `../x` must never become a path.
pub fn is_valid_task_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The run id `raw` names, written exactly as the board writes run ids: the
/// seed compares the carrier's text with exact equality, so `091` is not
/// run 91, for the proof and for every fenced write alike.
pub fn parse_run_id(raw: &str) -> Option<i64> {
    raw.parse::<i64>()
        .ok()
        .filter(|run_id| run_id.to_string() == raw)
}

impl Claim {
    /// Reads the full claim carrier from an environment snapshot.
    ///
    /// Every coordinate is required and stripped once; a blank value reads as
    /// missing, so a whitespace-only task id is never a worker.
    pub fn from_env(env: &Environment) -> Result<Self, CarrierError> {
        let required = |name: &'static str| {
            env.get_trimmed(name)
                .map(str::to_owned)
                .ok_or(CarrierError::Missing(name))
        };
        let task_id = required(vars::TASK)?;
        if !is_valid_task_id(&task_id) {
            return Err(CarrierError::InvalidTaskId {
                variable: vars::TASK,
                value: task_id,
            });
        }
        let db = required(vars::DB)?;
        let run_id_raw = required(vars::RUN_ID)?;
        let claim_lock = required(vars::CLAIM_LOCK)?;
        let run_id = parse_run_id(&run_id_raw).ok_or(CarrierError::InvalidRunId {
            variable: vars::RUN_ID,
            value: run_id_raw,
        })?;
        let board = env.get_trimmed(vars::BOARD).map(str::to_owned);
        Ok(Self {
            task_id,
            db,
            run_id,
            claim_lock,
            board,
        })
    }

    /// The carrier variables that hand this claim to a child process, each
    /// under both its names.
    pub fn to_env_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = vec![
            (vars::TASK, self.task_id.clone()),
            (vars::DB, self.db.clone()),
            (vars::RUN_ID, self.run_id.to_string()),
            (vars::CLAIM_LOCK, self.claim_lock.clone()),
            (vars::FENCE_TOKEN, self.run_id.to_string()),
        ];
        if let Some(board) = &self.board {
            pairs.push((vars::BOARD, board.clone()));
        }
        vars::under_both_names(pairs).collect()
    }
}

/// The raw coordinates of a lease proof, each possibly missing.
///
/// Hosts in other languages and the `kanban prove` command build this from
/// flags and the environment; a missing coordinate is not an error but a
/// "not live" answer, because the proof fails closed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProofRequest {
    pub task_id: Option<String>,
    pub db: Option<String>,
    /// Compared as text with the board's `current_run_id`.
    pub run_id: Option<String>,
    pub claim_lock: Option<String>,
}

impl ProofRequest {
    /// The request for a typed claim.
    pub fn for_claim(claim: &Claim) -> Self {
        Self {
            task_id: Some(claim.task_id.clone()),
            db: Some(claim.db.clone()),
            run_id: Some(claim.run_id.to_string()),
            claim_lock: Some(claim.claim_lock.clone()),
        }
    }

    /// The request carried by an environment snapshot, every value stripped.
    pub fn from_env(env: &Environment) -> Self {
        let pick = |name| env.get_trimmed(name).map(str::to_owned);
        Self {
            task_id: pick(vars::TASK),
            db: pick(vars::DB),
            run_id: pick(vars::RUN_ID),
            claim_lock: pick(vars::CLAIM_LOCK),
        }
    }
}
