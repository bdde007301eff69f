//! `kanban fence`: fencing tokens carried to side effects.
//!
//! The lease fences the board; a run that stalled past its lease (a paused
//! VM, a long collection) can still push a branch or post upstream when it
//! wakes. A run's fencing token is its run id, which only grows per board:
//! `fence check` passes only while the carrier's claim is live and its run
//! is the card's newest, and `fence run` runs a command only while that
//! holds, stopping its process group the moment it no longer does.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kanban_core::ExitCode;
use kanban_core::{Environment, NotLive, ProofIdentity, ProofRequest, vars};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::out::{errln, outln};
use crate::prove::Prover;
use crate::worker_calls::{SOCKET_VAR, ask_worker_proof};

/// How often `fence run` proves the claim while its command runs.
const PROOF_EVERY: Duration = Duration::from_millis(250);
/// How long a stopped command's group gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// The carrier's proof request, with the fencing token checked against it:
/// a token that names another run than the carrier's is stale by itself.
fn request(env: &Environment) -> Result<ProofRequest, String> {
    let request = ProofRequest::from_env(env);
    if let Some(token) = env.get_trimmed(vars::FENCE_TOKEN) {
        let carrier = request.run_id.as_deref().unwrap_or("");
        if token != carrier {
            return Err(format!(
                "fence token {token} is not this claim's run ({carrier}); a newer run owns the card"
            ));
        }
    }
    Ok(request)
}

/// The proof of a fence: asked of the worker that started this agent when
/// the claim is that worker's own (it holds the board open, and the agent
/// needs no credentials of its own), else made on the board, opened once.
struct FenceProver<'a> {
    env: &'a Environment,
    board: Option<Prover>,
}

impl<'a> FenceProver<'a> {
    fn new(env: &'a Environment) -> Self {
        Self { env, board: None }
    }

    fn verdict(&mut self, request: &ProofRequest) -> Result<(), NotLive> {
        if self.board.is_none()
            && let Some(verdict) = ask_worker_proof(self.env.get(SOCKET_VAR), request)
        {
            return verdict;
        }
        let env = self.env;
        self.board
            .get_or_insert_with(|| Prover::for_request(request, env))
            .prove(request, ProofIdentity::AnyProcess)
    }
}

/// `kanban fence check`: exit 0 while the claim is live and its token the
/// newest; 1 otherwise, saying why on stderr.
pub(crate) fn check(env: &Environment, quiet: bool) -> anyhow::Result<ExitCode> {
    let request = match request(env) {
        Ok(request) => request,
        Err(stale) => {
            errln!("kanban fence: stale: {stale}");
            return Ok(ExitCode::Failure);
        }
    };
    match FenceProver::new(env).verdict(&request) {
        Ok(()) => {
            if !quiet {
                outln!(
                    "live: fence token {}",
                    request.run_id.as_deref().unwrap_or("")
                );
            }
            Ok(ExitCode::Success)
        }
        Err(reason) => {
            errln!(
                "kanban fence: stale: {} ({reason}); refusing the side effect",
                reason.code()
            );
            Ok(ExitCode::Failure)
        }
    }
}

/// `kanban fence run -- CMD…`: runs CMD in a process group of its own only
/// while the claim is live, and stops that group when the claim is lost.
/// Exits with CMD's status (128+N for a signal), or 1 when the claim was
/// not live (CMD never started) or was lost while it ran (CMD stopped).
pub(crate) fn run(
    env: &Environment,
    command: &[String],
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<i32> {
    let Some((program, args)) = command.split_first() else {
        anyhow::bail!("kanban fence run needs a command: kanban fence run -- CMD [ARGS…]");
    };
    let request = match request(env) {
        Ok(request) => request,
        Err(stale) => {
            errln!("kanban fence: stale: {stale}; {program} was not run");
            return Ok(ExitCode::Failure.code());
        }
    };
    let mut prover = FenceProver::new(env);
    if let Err(reason) = prover.verdict(&request) {
        errln!(
            "kanban fence: stale: {} ({reason}); {program} was not run",
            reason.code()
        );
        return Ok(ExitCode::Failure.code());
    }
    let mut child = Command::new(program)
        .args(args)
        .process_group(0)
        .stdin(Stdio::inherit())
        .spawn()
        .map_err(|error| anyhow::anyhow!("cannot run {program}: {error}"))?;
    let group = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let mut next_proof = Instant::now() + PROOF_EVERY;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status
                .code()
                .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)));
        }
        if interrupt.load(Ordering::SeqCst) != 0 {
            stop(&mut child, group);
            return Ok(ExitCode::Interrupted.code());
        }
        if Instant::now() >= next_proof {
            if let Err(reason) = prover.verdict(&request) {
                stop(&mut child, group);
                errln!(
                    "kanban fence: the claim was lost while {program} ran ({}: {reason}); it was stopped",
                    reason.code()
                );
                return Ok(ExitCode::Failure.code());
            }
            next_proof = Instant::now() + PROOF_EVERY;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGTERM to the command's group, SIGKILL after the grace.
fn stop(child: &mut std::process::Child, group: Pid) {
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            // The leader is gone; what it left in the group goes too.
            let _ = killpg(group, Signal::SIGKILL);
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait();
}
