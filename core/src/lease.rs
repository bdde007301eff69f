//! The lease proof as a pure function over the rows a board holds.
//!
//! Every board adapter reads the same few columns and asks this function, so
//! the proof means the same thing on SQLite, in memory and anywhere else.

use crate::carrier::ProofRequest;
use crate::data::{NotLive, ProofIdentity};

/// The lease columns of a task row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskLease {
    pub status: String,
    pub worker_pid: Option<i64>,
    pub current_run_id: Option<i64>,
    pub claim_lock: Option<String>,
    pub claim_expires: Option<i64>,
}

/// The lease columns of a run row.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunLease {
    pub ended_at: Option<i64>,
    pub worker_pid: Option<i64>,
    pub claim_expires: Option<i64>,
}

/// What the board holds about one claim, read in one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseView {
    /// The task row, if there is one.
    pub task: Option<TaskLease>,
    /// The row of the task's current run, if there is one.
    pub run: Option<RunLease>,
    /// The `(pid, claim_lock)` of the newest `worker_bound` event of the
    /// task, read only for [`ProofIdentity::BoundOwner`].
    pub newest_bound: Option<(i64, String)>,
}

/// Checks the pinned coordinates of a request before any board is read.
///
/// Returns the request's `(task_id, db, run_id, claim_lock)`; a missing one
/// is "not live" (fail closed, never a fallback to ambient board state).
pub fn required_coordinates(request: &ProofRequest) -> Result<(&str, &str, &str, &str), NotLive> {
    fn pick(value: &Option<String>) -> Option<&str> {
        value.as_deref().map(str::trim).filter(|v| !v.is_empty())
    }
    let task = pick(&request.task_id).ok_or(NotLive::NoTaskId)?;
    let db = pick(&request.db).ok_or(NotLive::NoBoard)?;
    let run_id = pick(&request.run_id).ok_or(NotLive::NoRunId)?;
    let lock = pick(&request.claim_lock).ok_or(NotLive::NoClaimLock)?;
    Ok((task, db, run_id, lock))
}

/// True when the claim in `view` is live for the pinned `run_id` and
/// `claim_lock` at `now`, owned by `identity`.
///
/// A NULL lease is not an unbounded one: it fails, like an expired one.
pub fn evaluate_lease(
    view: &LeaseView,
    run_id: &str,
    claim_lock: &str,
    identity: ProofIdentity,
    now: i64,
) -> Result<(), NotLive> {
    let pid_checked = match identity {
        ProofIdentity::Process(pid) => Some(i64::from(pid)),
        ProofIdentity::AnyProcess | ProofIdentity::BoundOwner(_) => None,
    };
    let task = view.task.as_ref().ok_or(NotLive::TaskNotFound)?;
    if task.status != "running" {
        return Err(NotLive::NotRunning(task.status.clone()));
    }
    if let (Some(pid), Some(recorded)) = (pid_checked, task.worker_pid)
        && recorded != pid
    {
        return Err(NotLive::PidMismatch { recorded });
    }
    let current = task.current_run_id.ok_or(NotLive::NoRunPointer)?;
    if current.to_string() != run_id.trim() {
        return Err(NotLive::RunMoved { current });
    }
    if task.claim_lock.as_deref() != Some(claim_lock.trim()) {
        return Err(NotLive::LockMismatch);
    }
    match task.claim_expires {
        None => return Err(NotLive::TaskLeaseMissing),
        Some(expires) if expires < now => return Err(NotLive::TaskLeaseExpired { expires, now }),
        Some(_) => {}
    }
    let run = view.run.as_ref().ok_or(NotLive::RunNotFound)?;
    if run.ended_at.is_some() {
        return Err(NotLive::RunClosed);
    }
    if let (Some(pid), Some(recorded)) = (pid_checked, run.worker_pid)
        && recorded != pid
    {
        return Err(NotLive::RunPidMismatch { recorded });
    }
    match run.claim_expires {
        None => return Err(NotLive::RunLeaseMissing),
        Some(expires) if expires < now => return Err(NotLive::RunLeaseExpired { expires, now }),
        Some(_) => {}
    }
    if let ProofIdentity::BoundOwner(pid) = identity {
        let bound = view.newest_bound.as_ref().ok_or(NotLive::NotBound)?;
        if bound.0 != i64::from(pid) || bound.1 != claim_lock.trim() {
            return Err(NotLive::NotBound);
        }
    }
    Ok(())
}
