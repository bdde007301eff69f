//! In-place recovery: core's policy, proof and loop, with Python callables
//! as the loop's ports.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use kanban_board_sqlite::LeaseProver;
use kanban_core::lease::required_coordinates;
use kanban_core::{
    ClaimCheck, Environment, FailureReason, NotLive, ProofIdentity, ProofRequest, RecoveryPolicy,
    Sleeper, TurnInput, TurnOutcome, TurnResult, TurnRunner, build_recovery_nudge,
    max_recovery_attempts as budget, recover_in_place, resolve_task_id as resolve,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict};

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(resolve_task_id, module)?)?;
    module.add_function(wrap_pyfunction!(recovery_enabled, module)?)?;
    module.add_function(wrap_pyfunction!(max_recovery_attempts, module)?)?;
    module.add_function(wrap_pyfunction!(recovery_delay, module)?)?;
    module.add_function(wrap_pyfunction!(should_recover, module)?)?;
    module.add_function(wrap_pyfunction!(recovery_nudge, module)?)?;
    module.add_function(wrap_pyfunction!(claim_is_live, module)?)?;
    module.add_function(wrap_pyfunction!(recover, module)?)?;
    Ok(())
}

fn environment(env: HashMap<String, String>) -> Environment {
    Environment::from_vars(env)
}

/// A count from Python: below zero is zero, past `u32` is `u32::MAX`.
fn count(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

/// A settled turn as the seed module reads one: only a `dict` settles, a
/// flag counts only when it is a real `bool`, a text field is `str(x)` of a
/// truthy value. Anything else settles nothing.
fn turn_result(result: &Bound<'_, PyAny>) -> Option<TurnResult> {
    let dict = result.cast::<PyDict>().ok()?;
    let item = |key: &str| dict.get_item(key).ok().flatten();
    let flag = |key: &str| {
        item(key)
            .filter(|value| value.is_instance_of::<PyBool>())
            .and_then(|value| value.extract::<bool>().ok())
    };
    let text = |key: &str| {
        item(key)
            .filter(|value| value.is_truthy().unwrap_or(false))
            .and_then(|value| value.str().ok().map(|text| text.to_string()))
    };
    Some(TurnResult {
        completed: flag("completed"),
        failed: flag("failed"),
        failure_retryable: flag("failure_retryable"),
        failure_reason: text("failure_reason").map(FailureReason::from),
        error: text("error"),
        final_response: text("final_response"),
        interrupted: flag("interrupted"),
        partial: flag("partial"),
        turn_exit_reason: text("turn_exit_reason"),
        ..TurnResult::default()
    })
}

/// The worker's task id: `explicit` when given (blank: not a worker), else
/// the carrier's `HERMES_KANBAN_TASK`, stripped.
#[pyfunction]
#[pyo3(signature = (explicit, env))]
fn resolve_task_id(explicit: Option<&str>, env: HashMap<String, String>) -> Option<String> {
    resolve(explicit, &environment(env))
}

#[pyfunction]
#[pyo3(signature = (env, task_id=None))]
fn recovery_enabled(env: HashMap<String, String>, task_id: Option<&str>) -> bool {
    RecoveryPolicy::from_env(&environment(env), task_id).enabled()
}

#[pyfunction]
fn max_recovery_attempts(env: HashMap<String, String>) -> u32 {
    budget(&environment(env))
}

#[pyfunction]
fn recovery_delay(attempt: i64, schedule: Vec<f64>) -> f64 {
    kanban_core::recovery_delay_seconds(attempt, &schedule)
}

#[pyfunction]
#[pyo3(signature = (result, attempt, env, task_id=None))]
fn should_recover(
    result: &Bound<'_, PyAny>,
    attempt: i64,
    env: HashMap<String, String>,
    task_id: Option<&str>,
) -> bool {
    RecoveryPolicy::from_env(&environment(env), task_id)
        .should_recover(turn_result(result).as_ref(), count(attempt))
}

#[pyfunction]
#[pyo3(signature = (result, attempt, max_attempts, env, task_id=None))]
fn recovery_nudge(
    result: &Bound<'_, PyAny>,
    attempt: i64,
    max_attempts: i64,
    env: HashMap<String, String>,
    task_id: Option<&str>,
) -> String {
    let task = resolve(task_id, &environment(env));
    build_recovery_nudge(
        turn_result(result).as_ref(),
        count(attempt),
        count(max_attempts),
        task.as_deref(),
    )
}

/// The read-only lease proof of the seed's `worker_claim_is_live`: live or
/// not, and why. `now` is called only once the carrier is whole and the
/// board is there, as the seed module reads its clock.
#[pyfunction]
fn claim_is_live(
    py: Python<'_>,
    task_id: String,
    db: Option<String>,
    run_id: String,
    claim_lock: String,
    verify_pid: bool,
    now: &Bound<'_, PyAny>,
) -> PyResult<(bool, String)> {
    let nonempty = |text: String| Some(text).filter(|text| !text.is_empty());
    let request = ProofRequest {
        task_id: Some(task_id),
        db,
        run_id: nonempty(run_id),
        claim_lock: nonempty(claim_lock),
    };
    if let Err(reason) = required_coordinates(&request) {
        return Ok((false, reason.to_string()));
    }
    let db = request.db.clone().unwrap_or_default();
    if !Path::new(&db).is_file() {
        return Ok((false, NotLive::BoardNotFound(db).to_string()));
    }
    let now: i64 = now.call0()?.extract()?;
    let identity = if verify_pid {
        ProofIdentity::Process(std::process::id())
    } else {
        ProofIdentity::AnyProcess
    };
    let prover = kept_prover(&db);
    let proved = py.detach(|| prover.prove(&request, identity, now));
    Ok(match proved {
        Ok(()) => (true, "live".to_owned()),
        Err(reason) => (false, reason.to_string()),
    })
}

/// The most boards a process keeps a proof connection to.
const KEPT_PROVERS: usize = 16;

/// The kept proof of board `db` ([`LeaseProver`]: one read-only connection,
/// the file's identity checked at every proof, so it fails closed exactly
/// as a fresh open would). A worker proves before every retry.
fn kept_prover(db: &str) -> Arc<LeaseProver> {
    static PROVERS: OnceLock<Mutex<HashMap<String, Arc<LeaseProver>>>> = OnceLock::new();
    let mut provers = PROVERS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !provers.contains_key(db) && provers.len() >= KEPT_PROVERS {
        provers.clear();
    }
    provers
        .entry(db.to_owned())
        .or_insert_with(|| Arc::new(LeaseProver::new(db)))
        .clone()
}

/// The first exception a host callable raised; the loop stops at it.
#[derive(Debug, Default)]
struct Raised(Mutex<Option<PyErr>>);

impl Raised {
    fn keep(&self, error: PyErr) {
        let mut kept = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.get_or_insert(error);
    }

    fn any(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }

    fn take(&self) -> Option<PyErr> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// `turn_fn(nudge)`, then `get_result()`: one recovery turn.
struct HostTurns<'a> {
    turn_fn: Py<PyAny>,
    get_result: Py<PyAny>,
    raised: &'a Raised,
}

#[async_trait]
impl TurnRunner for HostTurns<'_> {
    async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome {
        Python::attach(|py| {
            let settled = self
                .turn_fn
                .call1(py, (input.message.as_str(),))
                .and_then(|_| self.get_result.call0(py));
            match settled {
                Ok(result) => Ok(turn_result(result.bind(py))),
                Err(error) => {
                    // Nothing settles: the loop stops, and the error is raised.
                    self.raised.keep(error);
                    Ok(None)
                }
            }
        })
    }
}

/// The host's claim check; after an exception, never live.
struct HostCheck<'a> {
    check: Py<PyAny>,
    raised: &'a Raised,
}

#[async_trait]
impl ClaimCheck for HostCheck<'_> {
    async fn check(&self) -> Result<(), NotLive> {
        if self.raised.any() {
            return Err(NotLive::Unreadable("the host raised".to_owned()));
        }
        Python::attach(|py| {
            match self
                .check
                .call0(py)
                .and_then(|answer| answer.bind(py).is_truthy())
            {
                Ok(true) => Ok(()),
                Ok(false) => Err(NotLive::Unreadable(
                    "the claim check found no live claim".to_owned(),
                )),
                Err(error) => {
                    self.raised.keep(error);
                    Err(NotLive::Unreadable("the claim check raised".to_owned()))
                }
            }
        })
    }
}

/// The host's `sleep_fn(seconds)`.
struct HostSleep<'a> {
    sleep_fn: Py<PyAny>,
    raised: &'a Raised,
}

#[async_trait]
impl Sleeper for HostSleep<'_> {
    async fn sleep(&self, duration: Duration) {
        Python::attach(|py| {
            if let Err(error) = self.sleep_fn.call1(py, (duration.as_secs_f64(),)) {
                self.raised.keep(error);
            }
        });
    }
}

/// Core's check -> sleep -> check -> turn loop; the attempts it made.
#[pyfunction]
#[allow(clippy::too_many_arguments, reason = "the seed's ports, one each")]
fn recover(
    py: Python<'_>,
    turn_fn: Py<PyAny>,
    get_result: Py<PyAny>,
    sleep_fn: Py<PyAny>,
    say: Py<PyAny>,
    check: Py<PyAny>,
    env: HashMap<String, String>,
    task_id: Option<&str>,
    schedule: Vec<u64>,
) -> PyResult<u32> {
    let mut policy = RecoveryPolicy::from_env(&environment(env), task_id);
    policy.delays_seconds = schedule;
    let mut latest: TurnOutcome = Ok(turn_result(get_result.bind(py).call0()?.as_any()));
    let raised = Raised::default();
    let mut runner = HostTurns {
        turn_fn,
        get_result,
        raised: &raised,
    };
    let check = HostCheck {
        check,
        raised: &raised,
    };
    let sleeper = HostSleep {
        sleep_fn,
        raised: &raised,
    };
    let mut emit = |line: &str| {
        Python::attach(|py| {
            // The module's `say` logs and swallows the host's own errors.
            let _ = say.call1(py, (line,));
        });
    };
    // The initial turn was the first.
    let mut turns = 1;
    let report = pollster::block_on(recover_in_place(
        &policy,
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &check,
        &sleeper,
        &mut emit,
    ));
    match raised.take() {
        Some(error) => Err(error),
        None => Ok(report.attempts),
    }
}
