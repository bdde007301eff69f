//! The seed's owner-side call-site cases, on a board in memory.
//! `kanban-board-sqlite` runs the same cases on a real SQLite file.

use std::sync::Arc;

use kanban_board_sqlite::SqliteBoard;
use kanban_core::shapes::{self, failed_timeout, success};
use kanban_core::{Frame, TurnKind, VerdictKind, WorkerPorts, run_worker_turns};
use kanban_testkit::{
    OwnerSeam, ScriptedJudge, ScriptedRunner, SeamOptions, VirtualClock, block_on, memory_board,
};

fn seam(goal_mode: bool) -> OwnerSeam<SqliteBoard> {
    let time = VirtualClock::at(1_000_000);
    let board = Arc::new(memory_board(Arc::new(time.clone())));
    OwnerSeam::install(board, time, goal_mode)
}

/// One test per seed case, named as in the seed; the table lives in testkit
/// so the SQLite board runs exactly the same cases.
macro_rules! seed_cases {
    ($($name:ident => $id:literal,)*) => {
        $(
            #[test]
            fn $name() {
                kanban_testkit::seed_owner_case($id).check(|time| memory_board(Arc::new(time)), |board, task, expires| kanban_testkit::block_on(board.set_lease_expiry(task, expires)).unwrap());
            }
        )*
    };
}

seed_cases! {
    test_recovers_in_place => "test_recovers_in_place",
    test_budget_exhausted_stops_and_releases => "test_budget_exhausted_stops_and_releases",
    test_claim_denial_stops_before_model_reentry => "test_claim_denial_stops_before_model_reentry",
    test_goal_mode_continues_after_a_successful_authorized_recovery => "test_goal_mode_continues_after_a_successful_authorized_recovery",
}

mod test_single_turn_route_outcomes {
    use super::*;
    seed_cases! {
        nothing_settled => "test_single_turn_route_outcomes[nothing-settled]",
        denial_unfinished_turn => "test_single_turn_route_outcomes[denial-unfinished-turn]",
        quota_wall => "test_single_turn_route_outcomes[quota-wall]",
        billing_wall => "test_single_turn_route_outcomes[billing-wall]",
        upstream_quota_wall => "test_single_turn_route_outcomes[upstream-quota-wall]",
    }
}

mod test_goal_mode_does_not_continue {
    use super::*;
    seed_cases! {
        recovery_denied => "test_goal_mode_does_not_continue[recovery-denied]",
        lease_expired_during_backoff => "test_goal_mode_does_not_continue[lease-expired-during-backoff]",
        quota_wall_billing => "test_goal_mode_does_not_continue[quota-wall-billing]",
        quota_wall_upstream => "test_goal_mode_does_not_continue[quota-wall-upstream]",
        interrupt => "test_goal_mode_does_not_continue[interrupt]",
        terminal_settlement => "test_goal_mode_does_not_continue[terminal-settlement]",
        budget_exhausted => "test_goal_mode_does_not_continue[budget-exhausted]",
        unfinished_nonfailed => "test_goal_mode_does_not_continue[unfinished-nonfailed]",
    }
}

#[test]
fn test_non_worker_frame_is_never_recovered() {
    let time = VirtualClock::at(0);
    let board = memory_board(Arc::new(time.clone()));
    let mut runner = ScriptedRunner::always(failed_timeout());
    let entered = runner.entered();
    let mut emit = |_: &str| {};
    let mut ports = WorkerPorts {
        board: &board,
        runner: &mut runner,
        sleeper: &time,
        judge: None,
        emit: &mut emit,
    };
    let run = block_on(run_worker_turns(
        Frame {
            message: "hello".into(),
            worker: None,
        },
        &mut ports,
    ));
    assert_eq!(
        run.last,
        Ok(Some(failed_timeout())),
        "result returned untouched"
    );
    assert_eq!(
        entered
            .all()
            .iter()
            .map(|i| i.message.as_str())
            .collect::<Vec<_>>(),
        ["hello"]
    );
    assert_eq!(run.exit_code.code(), 1, "a non-worker never gets 75");
}

#[test]
fn every_seed_case_has_a_test_here() {
    assert_eq!(kanban_testkit::seed_owner_cases().len(), 4 + 5 + 8);
}

#[test]
fn goal_loop_continues_then_blocks_at_the_turn_budget_without_a_judge() {
    let seam = seam(true);
    let options = SeamOptions {
        goal_mode: true,
        goal_max_turns: 3,
        ..SeamOptions::default()
    };
    let out = seam.run(ScriptedRunner::always(success()), &options, None);
    assert_eq!(
        out.entered.len(),
        3,
        "the first turn plus two continuations"
    );
    assert_eq!(out.entered[1].kind, TurnKind::Goal);
    assert_eq!(out.run.goal, Some(kanban_core::GoalOutcome::BlockedBudget));
    let view = block_on(kanban_core::BoardAdmin::show_task(
        seam.board.as_ref(),
        &seam.claim.task_id,
    ))
    .unwrap();
    assert_eq!(view.task.status, kanban_core::TaskStatus::Blocked);
    assert_eq!(out.booked_exit_code, 0);
}

#[test]
fn goal_loop_finalizes_then_blocks_when_the_worker_never_completes() {
    let seam = seam(true);
    let judge = ScriptedJudge::new(vec![VerdictKind::Done]);
    let options = SeamOptions {
        goal_mode: true,
        goal_max_turns: 10,
        ..SeamOptions::default()
    };
    let out = seam.run(ScriptedRunner::always(success()), &options, Some(&judge));
    assert_eq!(
        out.entered.len(),
        2,
        "the first turn and one finalize nudge"
    );
    assert!(out.entered[1].message.contains("kanban_complete"));
    assert_eq!(judge.calls().len(), 2);
    assert_eq!(out.run.goal, Some(kanban_core::GoalOutcome::BlockedBudget));
}

#[test]
fn goal_loop_stops_when_the_worker_completes_the_card() {
    let seam = seam(true);
    let board = seam.board.clone();
    let claim = seam.claim.clone();
    let runner = ScriptedRunner::outcomes(move |input| {
        if input.turn == 2 {
            block_on(kanban_core::Board::complete(
                board.as_ref(),
                &claim,
                "finished",
                None,
            ))
            .unwrap();
        }
        Ok(Some(success()))
    });
    let judge = ScriptedJudge::failing(); // fails open to continue
    let options = SeamOptions {
        goal_mode: true,
        goal_max_turns: 10,
        ..SeamOptions::default()
    };
    let out = seam.run(runner, &options, Some(&judge));
    assert_eq!(out.entered.len(), 2);
    assert_eq!(
        out.run.goal,
        Some(kanban_core::GoalOutcome::CompletedByWorker)
    );
    assert_eq!(out.booked_exit_code, 0);
}

#[test]
fn stop_nudges_follow_a_reply_without_a_terminal_call_at_most_twice() {
    let seam = seam(false);
    let options = SeamOptions {
        stop_nudges: 2,
        ..SeamOptions::default()
    };
    let out = seam.run(ScriptedRunner::always(success()), &options, None);
    assert_eq!(out.entered.len(), 3);
    assert_eq!(out.entered[1].kind, TurnKind::StopNudge);
    assert!(
        out.entered[2].message.contains("kanban_complete")
            && out.entered[2].message.contains("2/2")
    );
    assert_eq!(out.run.stop_nudges, 2);
    assert_eq!(out.booked_exit_code, 0);
}

#[test]
fn no_stop_nudge_once_the_card_is_completed_or_after_a_failure() {
    let seam = seam(false);
    let board = seam.board.clone();
    let claim = seam.claim.clone();
    let runner = ScriptedRunner::outcomes(move |_| {
        block_on(kanban_core::Board::complete(
            board.as_ref(),
            &claim,
            "finished",
            None,
        ))
        .unwrap();
        Ok(Some(success()))
    });
    let out = seam.run(
        runner,
        &SeamOptions {
            stop_nudges: 2,
            ..SeamOptions::default()
        },
        None,
    );
    assert_eq!(out.entered.len(), 1);

    let out = self::seam(false).run(
        ScriptedRunner::always(shapes::partial()),
        &SeamOptions {
            stop_nudges: 2,
            ..SeamOptions::default()
        },
        None,
    );
    assert_eq!(
        out.entered.len(),
        1,
        "only a successful turn (exit 0) is nudged"
    );
    assert_eq!(out.booked_exit_code, 1);
}

#[test]
fn worker_result_keeps_at_most_500_characters_of_the_reply() {
    let seam = seam(false);
    let long = format!("{}END", "é".repeat(700));
    let out = seam.run(
        ScriptedRunner::always(shapes::success_with(&long)),
        &SeamOptions::default(),
        None,
    );
    assert_eq!(out.booked_exit_code, 0);
    let view = block_on(kanban_core::BoardAdmin::show_task(
        seam.board.as_ref(),
        &seam.claim.task_id,
    ))
    .unwrap();
    let booked = view
        .events
        .iter()
        .rev()
        .find(|e| e.kind == "worker_result")
        .unwrap();
    let last = booked.payload["last_output"].as_str().unwrap();
    assert_eq!(last.chars().count(), 500);
    assert!(last.ends_with("END"));
    assert_eq!(booked.payload["pid"], std::process::id());
    assert_eq!(booked.payload["claim_lock"], kanban_testkit::OWNER_LOCK);
}
