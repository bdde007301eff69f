//! The seed's owner-side call-site cases, on the in-memory board.
//! `kanban-board-sqlite` runs the same cases on a real SQLite file.

use std::sync::Arc;

use kanban_core::shapes::{self, failed_timeout, failed_with, success};
use kanban_core::{Frame, TurnKind, TurnResult, VerdictKind, WorkerPorts, run_worker_turns};
use kanban_testkit::{
    InMemoryBoard, OwnerSeam, ScriptedJudge, ScriptedRunner, SeamOptions, VirtualClock, block_on,
};

fn seam(goal_mode: bool) -> OwnerSeam<InMemoryBoard> {
    let time = VirtualClock::at(1_000_000);
    let board = Arc::new(InMemoryBoard::new(Arc::new(time.clone())));
    OwnerSeam::install(board, time, goal_mode)
}

fn recovery(budget: u32) -> SeamOptions {
    SeamOptions {
        recovery: Some(budget.to_string()),
        ..SeamOptions::default()
    }
}

#[test]
fn test_recovers_in_place() {
    let seam = seam(false);
    let out = seam.run(
        ScriptedRunner::results(vec![Some(failed_timeout()), Some(success())]),
        &recovery(2),
        None,
    );
    assert_eq!(out.booked_exit_code, 0);
    assert_eq!(
        out.entered.len(),
        2,
        "the failed turn, then the recovery turn"
    );
    assert!(out.entered[1].message.contains("Do NOT start over"));
    assert!(out.entered[1].message.contains(&seam.claim.task_id));
    assert!(!out.entered[1].message.contains("t_foreign"));
}

#[test]
fn test_budget_exhausted_stops_and_releases() {
    let out = seam(false).run(ScriptedRunner::always(failed_timeout()), &recovery(1), None);
    assert_eq!(out.booked_exit_code, 75);
    assert_eq!(out.entered.len(), 2, "original + one recovery attempt");
}

macro_rules! single_turn_route_outcomes {
    ($($id:ident => ($result:expr, $code:expr),)*) => {
        mod test_single_turn_route_outcomes {
            use super::*;
            $(
                #[test]
                fn $id() {
                    let result: Option<TurnResult> = $result;
                    let out = seam(false).run(ScriptedRunner::results(vec![result]), &SeamOptions::default(), None);
                    assert_eq!(out.booked_exit_code, $code);
                    assert_eq!(out.entered.len(), 1);
                }
            )*
        }
    };
}

single_turn_route_outcomes! {
    nothing_settled => (None, 1),
    denial_unfinished_turn => (Some(shapes::partial()), 1),
    quota_wall => (Some(failed_with("rate_limit")), 75),
    billing_wall => (Some(failed_with("billing")), 75),
    upstream_quota_wall => (Some(failed_with("upstream_rate_limit")), 75),
}

#[test]
fn test_non_worker_frame_is_never_recovered() {
    let time = VirtualClock::at(0);
    let board = InMemoryBoard::new(Arc::new(time.clone()));
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
fn test_claim_denial_stops_before_model_reentry() {
    let seam = seam(false);
    seam.board.set_lease_expiry(&seam.claim.task_id, 1);
    let out = seam.run(
        ScriptedRunner::always(failed_timeout()),
        &SeamOptions::default(),
        None,
    );
    assert_eq!(out.booked_exit_code, 75);
    assert_eq!(out.entered.len(), 1);
    assert!(
        out.emitted
            .iter()
            .any(|l| l.contains("no longer holds a live run/claim")),
        "{:?}",
        out.emitted
    );
}

/// Goal mode: every way model entry can be refused ends without the judge.
macro_rules! goal_mode_does_not_continue {
    ($($id:ident => ($setup:expr, $script:expr, $code:expr, $entries:expr),)*) => {
        mod test_goal_mode_does_not_continue {
            use super::*;
            $(
                #[test]
                fn $id() {
                    let seam = seam(true);
                    let mut options = SeamOptions { goal_mode: true, ..SeamOptions::default() };
                    let setup: fn(&OwnerSeam<InMemoryBoard>, &mut SeamOptions) = $setup;
                    setup(&seam, &mut options);
                    let judge = ScriptedJudge::new(vec![VerdictKind::Continue]);
                    let out = seam.run(ScriptedRunner::always($script), &options, Some(&judge));
                    assert_eq!(out.booked_exit_code, $code);
                    assert_eq!(out.entered.len(), $entries);
                    assert!(judge.calls().is_empty(), "no continuation after a refused recovery");
                }
            )*
        }
    };
}

goal_mode_does_not_continue! {
    recovery_denied => (|s, _| s.board.set_lease_expiry(&s.claim.task_id, 1), failed_timeout(), 75, 1),
    lease_expired_during_backoff => (|s, o| {
        // The pre-backoff proof sees a live lease at 1000; the backoff carries
        // the clock to 1700, past the expiry, so the re-proof fails.
        s.time.set(1_000);
        s.board.set_lease_expiry(&s.claim.task_id, 1_600);
        o.delays_seconds = vec![700];
    }, failed_timeout(), 75, 1),
    quota_wall_billing => (|_, _| {}, failed_with("billing"), 75, 1),
    quota_wall_upstream => (|_, _| {}, failed_with("upstream_rate_limit"), 75, 1),
    interrupt => (|_, _| {}, shapes::interrupted(), 130, 1),
    terminal_settlement => (|_, _| {}, shapes::settled(), 75, 1),
    budget_exhausted => (|_, o| o.recovery = Some("1".into()), failed_timeout(), 75, 2),
    unfinished_nonfailed => (|_, _| {}, shapes::partial(), 1, 1),
}

#[test]
fn test_goal_mode_continues_after_a_successful_authorized_recovery() {
    let seam = seam(true);
    let judge = ScriptedJudge::new(vec![VerdictKind::Blocked]);
    let options = SeamOptions {
        goal_mode: true,
        recovery: Some("2".into()),
        ..SeamOptions::default()
    };
    let out = seam.run(
        ScriptedRunner::results(vec![Some(failed_timeout()), Some(success())]),
        &options,
        Some(&judge),
    );
    assert_eq!(out.booked_exit_code, 0);
    assert_eq!(out.entered.len(), 2);
    let calls = judge.calls().all();
    assert_eq!(
        calls
            .iter()
            .map(|(_, last)| last.as_str())
            .collect::<Vec<_>>(),
        ["done"],
        "the judge sees the RECOVERED response"
    );
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
