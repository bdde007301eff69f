//! The recovery loop over fake ports.

use std::sync::Mutex;

use kanban_core::shapes::{failed_timeout, success};
use kanban_core::{
    DEFAULT_MAX_RECOVERY_ATTEMPTS, Environment, NotLive, RecoveryPolicy, RecoveryStop, TurnKind,
    TurnOutcome, recover_in_place,
};
use kanban_testkit::{ScriptedRunner, VirtualClock, block_on};

use crate::worker_env;

struct LoopRun {
    attempts: u32,
    stop: RecoveryStop,
    entered: Vec<kanban_core::TurnInput>,
    sleeps: Vec<u64>,
    emitted: Vec<String>,
}

fn run_loop(
    env: &Environment,
    first: TurnOutcome,
    mut runner: ScriptedRunner,
    check: impl Fn() -> Result<(), NotLive> + Send + Sync,
) -> LoopRun {
    let policy = RecoveryPolicy::from_env(env, None);
    let time = VirtualClock::at(0);
    let entered = runner.entered();
    let mut latest = first;
    let mut turns = 1;
    let mut emitted = Vec::new();
    let mut emit = |line: &str| emitted.push(line.to_owned());
    let report = block_on(recover_in_place(
        &policy,
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &check,
        &time,
        &mut emit,
    ));
    LoopRun {
        attempts: report.attempts,
        stop: report.stop,
        entered: entered.all(),
        sleeps: time.sleep_seconds(),
        emitted,
    }
}

fn live() -> Result<(), NotLive> {
    Ok(())
}

#[test]
fn test_disabled_without_kanban_task() {
    let env = Environment::new();
    assert_eq!(kanban_core::worker_task_id(&env), None);
    assert!(!RecoveryPolicy::from_env(&env, None).enabled());
    let run = run_loop(
        &env,
        Ok(Some(failed_timeout())),
        ScriptedRunner::always(failed_timeout()),
        live,
    );
    assert_eq!(run.attempts, 0);
    assert!(run.entered.is_empty());
}

#[test]
fn test_recovery_loop_retries_until_success_and_reports() {
    let run = run_loop(
        &worker_env("t_probe"),
        Ok(Some(failed_timeout())),
        ScriptedRunner::always(success()),
        live,
    );
    assert_eq!(run.attempts, 1);
    assert_eq!(run.sleeps, [15]);
    assert_eq!(run.entered.len(), 1);
    assert!(run.entered[0].message.contains("Do NOT start over"));
    assert!(run.entered[0].message.contains("t_probe"));
    assert_eq!(run.entered[0].kind, TurnKind::Recovery);
    assert_eq!(run.entered[0].turn, 2);
    assert_eq!(run.emitted.len(), 1);
    assert!(
        run.emitted[0].contains("[kanban]") && run.emitted[0].contains("attempt 1/3"),
        "{}",
        run.emitted[0]
    );
}

#[test]
fn test_recovery_loop_bounded_when_result_never_changes() {
    let run = run_loop(
        &worker_env("t_probe"),
        Ok(Some(failed_timeout())),
        ScriptedRunner::always(failed_timeout()),
        live,
    );
    assert_eq!(run.attempts, DEFAULT_MAX_RECOVERY_ATTEMPTS);
    assert_eq!(run.sleeps, [15, 45, 90]);
    assert_eq!(run.entered.len(), 3);
    assert_eq!(
        run.stop,
        RecoveryStop::Refused(kanban_core::Refusal::BudgetExhausted)
    );
}

#[test]
fn test_recovery_loop_order_is_check_sleep_check_turn() {
    // The first proof holds; the run is lost during the backoff.
    let env = worker_env("t_probe").with(kanban_core::vars::TURN_RECOVERY, "3");
    let events = Mutex::new(Vec::<&str>::new());
    let proofs = Mutex::new(0);
    let policy = RecoveryPolicy::from_env(&env, None);
    let check = || {
        events.lock().unwrap().push("check");
        let mut proofs = proofs.lock().unwrap();
        *proofs += 1;
        if *proofs == 1 {
            Ok(())
        } else {
            Err(NotLive::RunClosed)
        }
    };
    struct RecordingSleeper<'a>(&'a Mutex<Vec<&'static str>>);
    #[async_trait::async_trait]
    impl kanban_core::Sleeper for RecordingSleeper<'_> {
        async fn sleep(&self, _: std::time::Duration) {
            self.0.lock().unwrap().push("sleep");
        }
    }
    let mut runner = ScriptedRunner::always(success());
    let entered = runner.entered();
    let mut latest: TurnOutcome = Ok(Some(failed_timeout()));
    let mut turns = 1;
    let report = block_on(recover_in_place(
        &policy,
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &check,
        &RecordingSleeper(&events),
        &mut |_| {},
    ));
    assert_eq!(
        *events.lock().unwrap(),
        ["check", "sleep", "check"],
        "the lost run vetoed re-entry"
    );
    assert_eq!(report.attempts, 1, "the attempt was authorised");
    assert!(entered.is_empty());

    // With the proof intact, the happy path is the full check → sleep → check → turn.
    events.lock().unwrap().clear();
    let check = || {
        events.lock().unwrap().push("check");
        Ok(())
    };
    let mut runner = ScriptedRunner::outcomes(|_| Ok(Some(success())));
    let entered = runner.entered();
    let mut latest: TurnOutcome = Ok(Some(failed_timeout()));
    let report = block_on(recover_in_place(
        &policy,
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &check,
        &RecordingSleeper(&events),
        &mut |_| {},
    ));
    assert_eq!(report.attempts, 1);
    assert_eq!(*events.lock().unwrap(), ["check", "sleep", "check"]);
    assert_eq!(entered.len(), 1, "then the turn");
    assert_eq!(latest, Ok(Some(success())));
}

#[test]
fn lease_expired_during_the_backoff_blocks_model_reentry_on_a_board_in_memory() {
    use kanban_core::{Board, BoardAdmin, BoardProof, NewTask, ProofIdentity};
    use std::sync::Arc;

    let time = VirtualClock::at(0);
    let board = kanban_testkit::memory_board(Arc::new(time.clone()));
    let claim = block_on(async {
        let id = board
            .create_task(&NewTask {
                title: "t".into(),
                ..NewTask::default()
            })
            .await
            .unwrap();
        board
            .claim_task(&id, 900, "lk")
            .await
            .unwrap()
            .unwrap()
            .claim
    });
    block_on(board.set_lease_expiry(&claim.task_id, 1_600)).unwrap();
    time.set(1_000);
    let env = worker_env(&claim.task_id);
    let mut policy = RecoveryPolicy::from_env(&env, None);
    policy.delays_seconds = vec![700]; // the backoff carries the clock from 1000 to 1700
    let mut runner = ScriptedRunner::always(success());
    let entered = runner.entered();
    let mut latest: TurnOutcome = Ok(Some(failed_timeout()));
    let mut turns = 1;
    let mut emitted = Vec::new();
    let proof = BoardProof {
        board: &board,
        claim: &claim,
        identity: ProofIdentity::AnyProcess,
    };
    let report = block_on(recover_in_place(
        &policy,
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &proof,
        &time,
        &mut |l| emitted.push(l.to_owned()),
    ));
    assert_eq!(report.attempts, 1);
    assert!(
        entered.is_empty(),
        "the expired lease vetoed re-entry before the model call"
    );
    assert!(
        emitted
            .last()
            .unwrap()
            .contains("no longer holds a live run/claim")
    );
    assert!(matches!(
        report.stop,
        RecoveryStop::ClaimLost(NotLive::TaskLeaseExpired {
            expires: 1_600,
            now: 1_700
        })
    ));
    assert!(block_on(board.prove_claim(&claim, ProofIdentity::AnyProcess)).is_err());
}
