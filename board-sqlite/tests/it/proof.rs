//! The seed's claim-ownership matrix and fail-closed cases, on real files.

use std::path::Path;

use kanban_board_sqlite::prove_lease;
use kanban_core::shapes::failed_timeout;
use kanban_core::{
    Environment, NotLive, ProofIdentity, ProofRequest, RecoveryPolicy, TurnOutcome,
    recover_in_place, vars,
};
use kanban_testkit::SyntheticBoard;
use kanban_testkit::{ScriptedClock, ScriptedRunner, VirtualClock, block_on};

const NOW: i64 = 1_800_000_000;

/// The full dispatcher-spawn carrier: task + board + run id + claim lock.
fn carrier(db: &Path) -> Environment {
    Environment::new()
        .with(vars::TASK, "t_live")
        .with(vars::DB, db.display().to_string())
        .with(vars::RUN_ID, "1")
        .with(vars::CLAIM_LOCK, "lk")
}

fn worker_claim_is_live(env: &Environment) -> Result<(), NotLive> {
    prove_lease(
        &ProofRequest::from_env(env),
        ProofIdentity::Process(std::process::id()),
        NOW,
    )
}

macro_rules! claim_ownership_matrix {
    ($($name:ident => $id:literal,)*) => {
        mod test_claim_ownership_matrix {
            use super::*;
            $(
                #[test]
                fn $name() {
                    let (id, board) = SyntheticBoard::ownership_matrix(std::process::id())
                        .into_iter()
                        .find(|(id, _)| *id == $id)
                        .unwrap();
                    let dir = tempfile::tempdir().unwrap();
                    let db = board.write(dir.path());
                    let verdict = worker_claim_is_live(&carrier(&db));
                    assert_eq!(verdict.is_ok(), id == "owned-live", "{id}: {verdict:?}");
                }
            )*
        }
    };
}

claim_ownership_matrix! {
    owned_live => "owned-live",
    released_to_the_board => "released-to-the-board",
    other_process_owns_the_claim => "other-process-owns-the-claim",
    run_already_closed => "run-already-closed",
    run_handed_to_another_pid => "run-handed-to-another-pid",
    no_live_run_pointer => "no-live-run-pointer",
    board_moved_to_another_run => "board-moved-to-another-run",
    claim_lock_no_longer_ours => "claim-lock-no-longer-ours",
    task_lease_expired => "task-lease-expired",
    run_lease_expired => "run-lease-expired",
    null_task_lease_is_not_unbounded => "null-task-lease-is-not-unbounded",
    null_run_lease_is_not_unbounded => "null-run-lease-is-not-unbounded",
}

#[test]
fn the_matrix_has_the_seed_s_twelve_ids() {
    assert_eq!(SyntheticBoard::ownership_matrix(1).len(), 12);
}

#[test]
fn recorded_pids_are_checked_only_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard {
        task_pid: Some(999_999_999),
        run_pid: Some(999_999_999),
        ..SyntheticBoard::live(std::process::id())
    }
    .write(dir.path());
    let request = ProofRequest::from_env(&carrier(&db));
    assert!(prove_lease(&request, ProofIdentity::AnyProcess, NOW).is_ok());
    assert_eq!(
        prove_lease(&request, ProofIdentity::Process(1), NOW),
        Err(NotLive::PidMismatch {
            recorded: 999_999_999
        })
    );
    // A hand-claimed card has no pid yet: any pid may prove it.
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard {
        task_pid: None,
        run_pid: None,
        ..SyntheticBoard::live(std::process::id())
    }
    .write(dir.path());
    assert!(
        prove_lease(
            &ProofRequest::from_env(&carrier(&db)),
            ProofIdentity::Process(1),
            NOW
        )
        .is_ok()
    );
}

#[test]
fn test_claim_check_fails_closed_without_a_board() {
    let dir = tempfile::tempdir().unwrap();
    let env = Environment::new()
        .with(vars::TASK, "t_live")
        .with(
            vars::DB,
            dir.path().join("missing.db").display().to_string(),
        )
        .with(vars::RUN_ID, "1")
        .with(vars::CLAIM_LOCK, "lk");
    assert!(matches!(
        worker_claim_is_live(&env),
        Err(NotLive::BoardNotFound(_))
    ));
    assert!(
        !dir.path().join("missing.db").exists(),
        "the proof never creates a board"
    );
    let env = env.without(vars::DB).with(vars::BOARD, "no-such-board-xyz");
    assert_eq!(
        worker_claim_is_live(&env),
        Err(NotLive::NoBoard),
        "and no ambient fallback rescues it"
    );
}

#[test]
fn test_missing_pinned_carrier_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard::live(std::process::id()).write(dir.path());
    let env = carrier(&db);
    assert!(
        worker_claim_is_live(&env).is_ok(),
        "sanity: the full carrier proves live"
    );
    for (missing, reason) in [
        (vars::DB, NotLive::NoBoard),
        (vars::RUN_ID, NotLive::NoRunId),
        (vars::CLAIM_LOCK, NotLive::NoClaimLock),
    ] {
        assert_eq!(
            worker_claim_is_live(&env.clone().without(missing)),
            Err(reason.clone()),
            "{missing} missing"
        );
        assert_eq!(
            worker_claim_is_live(&env.clone().with(missing, "   ")),
            Err(reason),
            "{missing} blank"
        );
    }
    assert_eq!(
        worker_claim_is_live(&env.clone().without(vars::TASK)),
        Err(NotLive::NoTaskId)
    );
}

#[test]
fn test_missing_db_pin_never_resolves_an_ambient_board() {
    // A fully live board sits exactly where the CLI's resolver looks (the
    // home's default board, HOME/kanban.db); with the pin
    // gone, the proof must not find it.
    let home = tempfile::tempdir().unwrap();
    let time = VirtualClock::at(NOW);
    let board = kanban_board_sqlite::SqliteBoard::create(
        home.path().join("kanban.db"),
        std::sync::Arc::new(time),
    )
    .unwrap();
    let claim = block_on(async {
        use kanban_core::BoardAdmin;
        let id = board
            .create_task(&kanban_core::NewTask {
                title: "ambient live task".into(),
                ..Default::default()
            })
            .await
            .unwrap();
        board
            .claim_task(&id, 3600, "lk")
            .await
            .unwrap()
            .unwrap()
            .claim
    });
    let full = Environment::new()
        .with(vars::TASK, claim.task_id.clone())
        .with(vars::DB, claim.db.clone())
        .with(vars::RUN_ID, claim.run_id.to_string())
        .with(vars::CLAIM_LOCK, "lk");
    assert!(
        worker_claim_is_live(&full).is_ok(),
        "sanity: the board is live"
    );
    let ambient = Environment::new()
        .with(vars::TASK, claim.task_id.clone())
        .with(vars::HOME, home.path().display().to_string())
        .with(vars::BOARD, "default");
    assert_eq!(worker_claim_is_live(&ambient), Err(NotLive::NoBoard));
}

#[test]
fn test_lease_expired_during_the_backoff_blocks_model_reentry() {
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard {
        task_expires: Some(1_600),
        run_expires: Some(1_600),
        ..SyntheticBoard::live(std::process::id())
    }
    .write(dir.path());
    let env = carrier(&db);
    // The pre-backoff proof sees a live lease; the re-proof does not.
    let clock = ScriptedClock::new([1_000, 1_700]);
    let request = ProofRequest::from_env(&env);
    let check = || {
        use kanban_core::Clock;
        prove_lease(
            &request,
            ProofIdentity::Process(std::process::id()),
            clock.now(),
        )
    };
    let policy = RecoveryPolicy::from_env(&env, None);
    let time = VirtualClock::at(0);
    let mut runner = ScriptedRunner::always(failed_timeout());
    let entered = runner.entered();
    let mut latest: TurnOutcome = Ok(Some(failed_timeout()));
    let mut turns = 1;
    let mut emitted = Vec::new();
    let report = block_on(recover_in_place(
        &policy,
        &mut latest,
        0,
        &mut turns,
        &mut runner,
        &check,
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
    assert_eq!(clock.reads(), 2);
}

#[test]
fn the_proof_never_writes_the_board() {
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard::live(std::process::id()).write(dir.path());
    let before = std::fs::read(&db).unwrap();
    let modified = std::fs::metadata(&db).unwrap().modified().unwrap();
    for _ in 0..3 {
        assert!(worker_claim_is_live(&carrier(&db)).is_ok());
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
    assert_eq!(
        std::fs::metadata(&db).unwrap().modified().unwrap(),
        modified
    );
    let entries: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        entries.len(),
        1,
        "no journal or WAL files were created: {entries:?}"
    );
}

#[test]
fn a_file_that_is_not_sqlite_is_not_live() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kanban.db");
    std::fs::write(
        &db,
        b"definitely not a database, just some text that is long enough to matter",
    )
    .unwrap();
    assert!(matches!(
        worker_claim_is_live(&carrier(&db)),
        Err(NotLive::Unreadable(_))
    ));
}

/// The kept-connection proof fails closed exactly as the fresh one: the
/// claim matrix row by row, then a board moved away, brought back, and
/// replaced under its name by another file.
#[test]
fn the_kept_proof_agrees_with_the_fresh_one_and_follows_the_file() {
    use kanban_board_sqlite::LeaseProver;
    let pid = std::process::id();
    for (id, board) in SyntheticBoard::ownership_matrix(pid) {
        let dir = tempfile::tempdir().unwrap();
        let db = board.write(dir.path());
        let request = ProofRequest::from_env(&carrier(&db));
        let prover = LeaseProver::new(db.display().to_string());
        let identity = ProofIdentity::Process(pid);
        for _ in 0..2 {
            assert_eq!(
                prover.prove(&request, identity, NOW),
                prove_lease(&request, identity, NOW),
                "{id}"
            );
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let db = SyntheticBoard::live(pid).write(dir.path());
    let request = ProofRequest::from_env(&carrier(&db));
    let prover = LeaseProver::new(db.display().to_string());
    let identity = ProofIdentity::Process(pid);
    assert_eq!(prover.prove(&request, identity, NOW), Ok(()));
    let away = dir.path().join("moved.db");
    std::fs::rename(&db, &away).unwrap();
    assert_eq!(
        prover.prove(&request, identity, NOW),
        Err(NotLive::BoardNotFound(db.display().to_string()))
    );
    std::fs::rename(&away, &db).unwrap();
    assert_eq!(prover.prove(&request, identity, NOW), Ok(()));
    // Another file under the same name: a released card.
    let other = tempfile::tempdir().unwrap();
    let released = SyntheticBoard {
        status: "ready",
        ..SyntheticBoard::live(pid)
    }
    .write(other.path());
    std::fs::rename(&released, &db).unwrap();
    assert_eq!(
        prover.prove(&request, identity, NOW),
        Err(NotLive::NotRunning("ready".to_owned()))
    );
    std::fs::remove_file(&db).unwrap();
    assert_eq!(
        prover.prove(&request, identity, NOW),
        Err(NotLive::BoardNotFound(db.display().to_string()))
    );
}
