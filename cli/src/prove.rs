//! `kanban prove`: the read-only lease proof for scripts and other hosts.

use anyhow::bail;
use kanban_board_sqlite::{SystemClock, prove_lease};
use kanban_core::{Clock, Environment, ProofIdentity, ProofRequest};
use serde_json::json;

use crate::args::{GlobalArgs, ProveArgs};
use crate::out::outln;

pub(crate) fn prove(
    global: &GlobalArgs,
    env: &Environment,
    args: &ProveArgs,
) -> anyhow::Result<i32> {
    let mut request = ProofRequest::from_env(env);
    // Flags override the carrier. A blank --task is "not a worker" and never
    // falls back to the environment.
    if let Some(task) = &args.task {
        request.task_id = Some(task.trim().to_owned()).filter(|t| !t.is_empty());
    }
    if let Some(db) = &global.db {
        request.db = Some(db.display().to_string());
    }
    if let Some(run_id) = &args.run_id {
        request.run_id = Some(run_id.clone());
    }
    if let Some(lock) = &args.claim_lock {
        request.claim_lock = Some(lock.clone());
    }
    let identity = match (args.owner, args.pid) {
        (true, Some(pid)) => ProofIdentity::BoundOwner(pid),
        (true, None) => {
            bail!("--owner proves the worker_bound identity of a process: name it with --pid N")
        }
        (false, Some(pid)) => ProofIdentity::Process(pid),
        (false, None) => ProofIdentity::AnyProcess,
    };
    let verdict = prove_lease(&request, identity, SystemClock.now());
    match (&verdict, args.json) {
        (Ok(()), true) => outln!("{}", json!({"live": true, "reason": "live"})),
        (Err(reason), true) => outln!(
            "{}",
            json!({"live": false, "reason": reason.code(), "detail": reason.to_string()})
        ),
        (Ok(()), false) => outln!("live"),
        (Err(reason), false) => outln!("not live: {} ({reason})", reason.code()),
    }
    Ok(if verdict.is_ok() { 0 } else { 1 })
}
