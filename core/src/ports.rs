//! The ports: everything core needs from the outside world, as traits.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::board::{Handoff, NewTask};
use crate::data::{
    BoardError, Claim, FailurePolicy, NotLive, Overrun, ProofIdentity, RunStatus, WorkerResult,
};
use crate::turn::{TurnInput, TurnOutcome};

/// Wall-clock time in whole epoch seconds, as the board stores it.
pub trait Clock: Send + Sync {
    /// Seconds since the Unix epoch.
    fn now(&self) -> i64;
    /// Milliseconds on a clock that never jumps, from an arbitrary start.
    /// Liveness is measured on it where the host has one; the default
    /// follows the wall clock, which suits clocks that only move forward.
    fn monotonic_millis(&self) -> u64 {
        u64::try_from(self.now()).unwrap_or(0).saturating_mul(1000)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> i64 {
        (**self).now()
    }
    fn monotonic_millis(&self) -> u64 {
        (**self).monotonic_millis()
    }
}

/// The only way core waits.
#[async_trait]
pub trait Sleeper: Send + Sync {
    /// Waits for `duration`.
    async fn sleep(&self, duration: Duration);
}

/// Runs one agent turn of a run, in the run's session.
#[async_trait]
pub trait TurnRunner: Send {
    /// Runs one turn with `input` and returns what it settled to.
    async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome;
}

/// What a worker needs from a board. Every write is fenced by the claim: it
/// commits only while the claim is live, and otherwise changes nothing and
/// fails with [`BoardError::LeaseLost`].
#[async_trait]
pub trait Board: Send + Sync {
    /// Proves that `claim` is live and owned by `identity`. Read-only, fails
    /// closed: anything that cannot be proven is [`NotLive`].
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive>;
    /// Records that process `pid` now works this claim (event `worker_bound`).
    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError>;
    /// Books the worker's result (event `worker_result`, run-scoped).
    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError>;
    /// Where the claim's run stands.
    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError>;
    /// Extends the lease; returns the new expiry.
    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError>;
    /// Completes the task with a summary and a result, and closes the run.
    async fn complete(
        &self,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> Result<(), BoardError> {
        self.hand_off(claim, &Handoff::new(summary, result)).await
    }
    /// Completes the task with all `handoff` says, and closes the run: the
    /// metadata is kept on the run, and every card it says the run made is
    /// checked ([`crate::rules::verify_created_cards`]) before anything changes.
    async fn hand_off(&self, claim: &Claim, handoff: &Handoff) -> Result<(), BoardError>;
    /// Records a file the run attached to its own card (already written);
    /// its id.
    async fn attach(
        &self,
        claim: &Claim,
        new: &crate::attachments::NewAttachment,
    ) -> Result<i64, BoardError>;
    /// Makes a card from inside the run: it waits for the claim's card
    /// ([`crate::rules::child_card`]); its id (the existing card's for a
    /// repeated idempotency key). Recorded on the claim's card.
    async fn create_child(&self, claim: &Claim, task: &NewTask) -> Result<String, BoardError>;
    /// Makes `child`, a card the claim's card made, wait for `parent` too;
    /// false when it did already ([`crate::rules::check_fan_out_target`]).
    async fn link_child(
        &self,
        claim: &Claim,
        parent: &str,
        child: &str,
    ) -> Result<bool, BoardError>;
    /// Unblocks `task_id`, a card the claim's card made.
    async fn unblock_child(&self, claim: &Claim, task_id: &str) -> Result<(), BoardError>;
    /// Blocks the task and closes the run; `kind` routes it
    /// ([`crate::rules::block`]).
    async fn block(
        &self,
        claim: &Claim,
        reason: &str,
        kind: Option<crate::BlockKind>,
    ) -> Result<(), BoardError>;
    /// Settles the run as timed out because the worker overran (its
    /// iteration budget, a turn's deadline or the run's limit): a failure is
    /// counted and the claim released, as [`crate::rules::settle_overrun`] says.
    async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError>;
    /// Adds a comment to the task.
    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError>;
    /// Appends a run-scoped event.
    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: serde_json::Value,
    ) -> Result<(), BoardError>;
}

#[async_trait]
impl<B: Board + ?Sized> Board for Arc<B> {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        (**self).prove_claim(claim, identity).await
    }
    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        (**self).bind_worker(claim, pid).await
    }
    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError> {
        (**self).book_result(claim, result).await
    }
    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        (**self).run_status(claim).await
    }
    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        (**self).heartbeat(claim, note).await
    }
    async fn hand_off(&self, claim: &Claim, handoff: &Handoff) -> Result<(), BoardError> {
        (**self).hand_off(claim, handoff).await
    }
    async fn attach(
        &self,
        claim: &Claim,
        new: &crate::attachments::NewAttachment,
    ) -> Result<i64, BoardError> {
        (**self).attach(claim, new).await
    }
    async fn create_child(&self, claim: &Claim, task: &NewTask) -> Result<String, BoardError> {
        (**self).create_child(claim, task).await
    }
    async fn link_child(
        &self,
        claim: &Claim,
        parent: &str,
        child: &str,
    ) -> Result<bool, BoardError> {
        (**self).link_child(claim, parent, child).await
    }
    async fn unblock_child(&self, claim: &Claim, task_id: &str) -> Result<(), BoardError> {
        (**self).unblock_child(claim, task_id).await
    }
    async fn block(
        &self,
        claim: &Claim,
        reason: &str,
        kind: Option<crate::BlockKind>,
    ) -> Result<(), BoardError> {
        (**self).block(claim, reason, kind).await
    }
    async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError> {
        (**self).settle_overrun(claim, overrun, policy).await
    }
    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        (**self).comment(claim, author, text).await
    }
    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: serde_json::Value,
    ) -> Result<(), BoardError> {
        (**self).append_event(claim, kind, payload).await
    }
}

/// The proof taken before every recovery attempt.
#[async_trait]
pub trait ClaimCheck: Send + Sync {
    /// `Ok` while the worker still owns a live, unexpired claim.
    async fn check(&self) -> Result<(), NotLive>;
}

/// A board proof of one claim for one identity.
#[derive(Clone, Copy)]
pub struct BoardProof<'a> {
    pub board: &'a dyn Board,
    pub claim: &'a Claim,
    pub identity: ProofIdentity,
}

impl std::fmt::Debug for BoardProof<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoardProof")
            .field("claim", self.claim)
            .field("identity", &self.identity)
            .finish()
    }
}

#[async_trait]
impl ClaimCheck for BoardProof<'_> {
    async fn check(&self) -> Result<(), NotLive> {
        self.board.prove_claim(self.claim, self.identity).await
    }
}

/// Any closure is a claim check, which keeps loop tests short.
#[async_trait]
impl<F> ClaimCheck for F
where
    F: Fn() -> Result<(), NotLive> + Send + Sync,
{
    async fn check(&self) -> Result<(), NotLive> {
        self()
    }
}

/// A goal judge's ruling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerdictKind {
    Done,
    Blocked,
    Continue,
    Wait,
}

/// A verdict with the judge's reason.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Verdict {
    pub verdict: VerdictKind,
    #[serde(default)]
    pub reason: String,
}

/// A judge that could not rule; the goal loop fails open to `continue`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("goal judge failed: {0}")]
pub struct JudgeError(pub String);

/// Rules whether a goal-mode task's goal is reached.
#[async_trait]
pub trait Judge: Send + Sync {
    /// Judges `last_response` against `goal`.
    async fn judge(&self, goal: &str, last_response: &str) -> Result<Verdict, JudgeError>;
}
