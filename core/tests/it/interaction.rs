//! mockall pins the interaction order of the recovery loop over the ports.

use std::time::Duration;

use async_trait::async_trait;
use kanban_core::shapes::{failed_timeout, success};
use kanban_core::{
    Board, BoardError, BoardProof, Claim, NotLive, ProofIdentity, RecoveryPolicy, RunStatus,
    Sleeper, TurnInput, TurnKind, TurnOutcome, TurnRunner, WorkerResult, recover_in_place,
};
use kanban_testkit::block_on;
use mockall::{Sequence, mock, predicate::always};

mock! {
    Board {}
    #[async_trait]
    impl Board for Board {
        async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive>;
        async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError>;
        async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError>;
        async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError>;
        async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError>;
        async fn complete(&self, claim: &Claim, summary: &str, result: Option<String>) -> Result<(), BoardError>;
        async fn hand_off(&self, claim: &Claim, handoff: &kanban_core::Handoff) -> Result<(), BoardError>;
        async fn attach(&self, claim: &Claim, new: &kanban_core::attachments::NewAttachment) -> Result<i64, BoardError>;
        async fn create_child(&self, claim: &Claim, task: &kanban_core::NewTask) -> Result<String, BoardError>;
        async fn link_child(&self, claim: &Claim, parent: &str, child: &str) -> Result<bool, BoardError>;
        async fn unblock_child(&self, claim: &Claim, task_id: &str) -> Result<(), BoardError>;
        async fn block(&self, claim: &Claim, reason: &str, kind: Option<kanban_core::BlockKind>) -> Result<(), BoardError>;
        async fn settle_overrun(&self, claim: &Claim, overrun: &kanban_core::rules::Overrun, policy: &kanban_core::rules::FailurePolicy) -> Result<(), BoardError>;
        async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError>;
        async fn append_event(&self, claim: &Claim, kind: &str, payload: serde_json::Value) -> Result<(), BoardError>;
    }
}

mock! {
    Sleeper {}
    #[async_trait]
    impl Sleeper for Sleeper {
        async fn sleep(&self, duration: Duration);
    }
}

mock! {
    Runner {}
    #[async_trait]
    impl TurnRunner for Runner {
        async fn run_turn(&mut self, input: &TurnInput) -> TurnOutcome;
    }
}

fn claim() -> Claim {
    Claim {
        task_id: "t_probe".into(),
        db: "/b.db".into(),
        run_id: 1,
        claim_lock: "lk".into(),
        board: None,
    }
}

fn policy() -> RecoveryPolicy {
    RecoveryPolicy {
        task_id: Some("t_probe".into()),
        max_attempts: 3,
        delays_seconds: vec![15, 45, 90],
    }
}

#[test]
fn the_order_is_check_sleep_check_turn() {
    let mut sequence = Sequence::new();
    let mut board = MockBoard::new();
    let mut sleeper = MockSleeper::new();
    let mut runner = MockRunner::new();
    board
        .expect_prove_claim()
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_, _| Ok(()));
    sleeper
        .expect_sleep()
        .withf(|duration| *duration == Duration::from_secs(15))
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_| ());
    board
        .expect_prove_claim()
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_, _| Ok(()));
    runner
        .expect_run_turn()
        .withf(|input| input.kind == TurnKind::Recovery && input.message.contains("1/3"))
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_| Ok(Some(success())));
    let claim = claim();
    let proof = BoardProof {
        board: &board,
        claim: &claim,
        identity: ProofIdentity::BoundOwner(7),
    };
    let mut latest: TurnOutcome = Ok(Some(failed_timeout()));
    let mut turns = 1;
    let report = block_on(recover_in_place(
        &policy(),
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &proof,
        &sleeper,
        &mut |_| {},
    ));
    assert_eq!(report.attempts, 1);
    assert_eq!(turns, 2);
}

#[test]
fn nothing_runs_after_a_denied_proof() {
    for denied_at in [1, 2] {
        let mut sequence = Sequence::new();
        let mut board = MockBoard::new();
        let mut sleeper = MockSleeper::new();
        let mut runner = MockRunner::new();
        if denied_at == 1 {
            board
                .expect_prove_claim()
                .times(1)
                .in_sequence(&mut sequence)
                .returning(|_, _| Err(NotLive::RunClosed));
            sleeper.expect_sleep().never();
        } else {
            board
                .expect_prove_claim()
                .times(1)
                .in_sequence(&mut sequence)
                .returning(|_, _| Ok(()));
            sleeper
                .expect_sleep()
                .with(always())
                .times(1)
                .in_sequence(&mut sequence)
                .returning(|_| ());
            board
                .expect_prove_claim()
                .times(1)
                .in_sequence(&mut sequence)
                .returning(|_, _| Err(NotLive::TaskLeaseExpired { expires: 1, now: 2 }));
        }
        runner.expect_run_turn().never();
        let claim = claim();
        let proof = BoardProof {
            board: &board,
            claim: &claim,
            identity: ProofIdentity::AnyProcess,
        };
        let mut latest: TurnOutcome = Ok(Some(failed_timeout()));
        let mut turns = 1;
        let report = block_on(recover_in_place(
            &policy(),
            &mut latest,
            0,
            &mut turns,
            &mut runner,
            &proof,
            &sleeper,
            &mut |_| {},
        ));
        assert_eq!(
            report.attempts,
            denied_at - 1,
            "denied at proof {denied_at}"
        );
        assert_eq!(
            latest,
            Ok(Some(failed_timeout())),
            "the latest result is untouched"
        );
    }
}
