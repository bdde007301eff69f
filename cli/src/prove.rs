//! `kanban prove`: the read-only lease proof for scripts and other hosts.

use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use kanban_board_postgres::PgBoard;
use kanban_board_sqlite::{LeaseProver, SystemClock};
use kanban_core::ExitCode;
use kanban_core::{Clock, Environment, NotLive, ProofIdentity, ProofRequest};
use serde_json::json;

use crate::args::{GlobalArgs, ProveArgs};
use crate::board_path::{postgres_config, postgres_url};
use crate::out::outln;

/// The lease proof of the board a request pins, kept open between proofs:
/// a SQLite file read-only, or a PostgreSQL board in read-only
/// transactions. A board that cannot be reached proves nothing.
#[derive(Debug)]
pub(crate) enum Prover {
    Sqlite(LeaseProver),
    Postgres(Result<Box<PgBoard>, String>),
}

impl Prover {
    /// The prover of the board `request` names.
    pub(crate) fn for_request(request: &ProofRequest, env: &Environment) -> Self {
        let db = request.db.clone().unwrap_or_default();
        let Some(url) = postgres_url(Path::new(&db)) else {
            return Self::Sqlite(LeaseProver::new(db));
        };
        let board = postgres_config(url, env)
            .map_err(|error| format!("{error:#}"))
            .and_then(|config| {
                crate::runtime::block_on(PgBoard::open(config, Arc::new(SystemClock)))
                    .map(Box::new)
                    .map_err(|error| error.to_string())
            });
        Self::Postgres(board)
    }

    /// Proves the claim in `request` now; fails closed.
    pub(crate) fn prove(
        &self,
        request: &ProofRequest,
        identity: ProofIdentity,
    ) -> Result<(), NotLive> {
        match self {
            Self::Sqlite(prover) => prover.prove(request, identity, SystemClock.now()),
            Self::Postgres(Ok(board)) => crate::runtime::block_on(board.prove(request, identity)),
            Self::Postgres(Err(error)) => Err(NotLive::Unreadable(error.clone())),
        }
    }
}

pub(crate) fn prove(
    global: &GlobalArgs,
    env: &Environment,
    args: &ProveArgs,
) -> anyhow::Result<ExitCode> {
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
    let verdict = Prover::for_request(&request, env).prove(&request, identity);
    match (&verdict, args.json) {
        (Ok(()), true) => outln!("{}", json!({"live": true, "reason": "live"})),
        (Err(reason), true) => outln!(
            "{}",
            json!({"live": false, "reason": reason.code(), "detail": reason.to_string()})
        ),
        (Ok(()), false) => outln!("live"),
        (Err(reason), false) => outln!("not live: {} ({reason})", reason.code()),
    }
    Ok(if verdict.is_ok() {
        ExitCode::Success
    } else {
        ExitCode::Failure
    })
}
