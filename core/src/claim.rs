//! The claim a worker holds, how it is carried, and why a proof can fail.

use std::fmt;

use crate::env::{Environment, vars};

/// The exact authority a worker was spawned with: which task, on which board
/// file, under which run and claim lock.
///
/// `(run_id, claim_lock)` is the fencing token: run ids only grow, so a stale
/// worker's token can never match a newer claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Claim {
    pub task_id: String,
    /// The board file the claim lives on (`HERMES_KANBAN_DB`).
    pub db: String,
    pub run_id: i64,
    pub claim_lock: String,
    /// The board slug, when one was named.
    pub board: Option<String>,
}

/// A claim carrier that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CarrierError {
    #[error(
        "{0} is not set: this process was not given a claim (start it from `kanban dispatch`, or export it from `kanban claim --json`)"
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

    /// The carrier variables that hand this claim to a child process.
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
        pairs
    }
}

/// Whose process the proof must name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ProofIdentity {
    /// No process check: any process holding the token may act.
    AnyProcess,
    /// The recorded worker pid, where one is recorded, must be this pid.
    Process(u32),
    /// Owner-side: the recorded pid is not checked; instead the newest
    /// `worker_bound` event must name this pid and the claim lock.
    BoundOwner(u32),
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

/// Why a worker does not hold a live claim. Each has a stable reason code.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum NotLive {
    NoTaskId,
    NoBoard,
    BoardNotFound(String),
    NoRunId,
    NoClaimLock,
    TaskNotFound,
    NotRunning(String),
    PidMismatch { recorded: i64 },
    NoRunPointer,
    RunMoved { current: i64 },
    LockMismatch,
    TaskLeaseMissing,
    TaskLeaseExpired { expires: i64, now: i64 },
    RunNotFound,
    RunClosed,
    RunPidMismatch { recorded: i64 },
    RunLeaseMissing,
    RunLeaseExpired { expires: i64, now: i64 },
    NotBound,
    Unreadable(String),
}

impl NotLive {
    /// True when the claim is still the card's (same run, same lock, card
    /// running) and only its lease ran out: nobody took the card, and the
    /// dispatcher extends a live worker's lease.
    pub fn only_expired(&self) -> bool {
        matches!(
            self,
            Self::TaskLeaseExpired { .. }
                | Self::RunLeaseExpired { .. }
                | Self::TaskLeaseMissing
                | Self::RunLeaseMissing
        )
    }

    /// The stable reason code, for scripts and `--json` output.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NoTaskId => "no_task_id",
            Self::NoBoard => "no_board_pin",
            Self::BoardNotFound(_) => "board_not_found",
            Self::NoRunId => "no_run_id",
            Self::NoClaimLock => "no_claim_lock",
            Self::TaskNotFound => "task_not_found",
            Self::NotRunning(_) => "not_running",
            Self::PidMismatch { .. } => "pid_mismatch",
            Self::NoRunPointer => "no_run_pointer",
            Self::RunMoved { .. } => "run_moved",
            Self::LockMismatch => "claim_lock_mismatch",
            Self::TaskLeaseMissing => "task_lease_missing",
            Self::TaskLeaseExpired { .. } => "task_lease_expired",
            Self::RunNotFound => "run_not_found",
            Self::RunClosed => "run_closed",
            Self::RunPidMismatch { .. } => "run_pid_mismatch",
            Self::RunLeaseMissing => "run_lease_missing",
            Self::RunLeaseExpired { .. } => "run_lease_expired",
            Self::NotBound => "not_bound",
            Self::Unreadable(_) => "board_unreadable",
        }
    }
}

impl fmt::Display for NotLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoTaskId => f.write_str("no task id: this is not a worker"),
            Self::NoBoard => f.write_str("no pinned board file (HERMES_KANBAN_DB)"),
            Self::BoardNotFound(path) => write!(f, "board file {path} does not exist"),
            Self::NoRunId => f.write_str("no pinned run id (HERMES_KANBAN_RUN_ID)"),
            Self::NoClaimLock => f.write_str("no pinned claim lock (HERMES_KANBAN_CLAIM_LOCK)"),
            Self::TaskNotFound => f.write_str("the task is not on the board"),
            Self::NotRunning(status) => write!(f, "the task is {status}, not running"),
            Self::PidMismatch { recorded } => write!(f, "the task names worker pid {recorded}"),
            Self::NoRunPointer => f.write_str("the task has no current run"),
            Self::RunMoved { current } => write!(f, "the task moved on to run {current}"),
            Self::LockMismatch => f.write_str("the claim lock is no longer ours"),
            Self::TaskLeaseMissing => f.write_str("the task lease has no expiry"),
            Self::TaskLeaseExpired { expires, now } => {
                write!(f, "the task lease expired at {expires} (now {now})")
            }
            Self::RunNotFound => f.write_str("the run is not on the board"),
            Self::RunClosed => f.write_str("the run is already closed"),
            Self::RunPidMismatch { recorded } => write!(f, "the run names worker pid {recorded}"),
            Self::RunLeaseMissing => f.write_str("the run lease has no expiry"),
            Self::RunLeaseExpired { expires, now } => {
                write!(f, "the run lease expired at {expires} (now {now})")
            }
            Self::NotBound => f.write_str("the newest worker_bound event names another process"),
            Self::Unreadable(error) => write!(f, "the board could not be read: {error}"),
        }
    }
}
