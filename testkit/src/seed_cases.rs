//! The seed's owner-side call-site cases as one table, checked the same way
//! on every board: the in-memory board in core's tests, a real SQLite file in
//! the board's.

use std::sync::Arc;

use kanban_core::shapes::{self, failed_timeout, failed_with, success};
use kanban_core::{Board, BoardAdmin, TurnResult, VerdictKind};

use crate::{OwnerSeam, ScriptedJudge, ScriptedRunner, SeamOptions, VirtualClock};

/// What the case does to the claim before the worker runs.
#[derive(Clone, Copy, Debug)]
enum Lease {
    Live,
    /// Both lease expiries set to this time.
    Expires(i64),
    /// Live at 1000 for the pre-backoff proof; the backoff carries the clock
    /// to 1700, past the expiry of 1600, so the re-proof fails.
    ExpiresDuringBackoff,
}

/// One row of the table.
#[derive(Clone, Debug)]
pub struct SeedCase {
    /// The seed's test name, plus its parametrised id where it has one.
    pub id: &'static str,
    goal_mode: bool,
    lease: Lease,
    recovery: Option<&'static str>,
    script: Vec<Option<TurnResult>>,
    /// The exit code the dispatcher books.
    code: i32,
    /// Model entries made.
    entries: usize,
}

fn case(id: &'static str, script: Vec<Option<TurnResult>>, code: i32, entries: usize) -> SeedCase {
    SeedCase {
        id,
        goal_mode: false,
        lease: Lease::Live,
        recovery: None,
        script,
        code,
        entries,
    }
}

fn goal(id: &'static str, script: TurnResult, code: i32, entries: usize) -> SeedCase {
    SeedCase {
        goal_mode: true,
        ..case(id, vec![Some(script)], code, entries)
    }
}

/// Every owner-side case of the seed suite.
#[expect(
    clippy::too_many_lines,
    reason = "a data table: one case of the seed suite each"
)]
pub fn seed_owner_cases() -> Vec<SeedCase> {
    vec![
        SeedCase {
            recovery: Some("2"),
            ..case(
                "test_recovers_in_place",
                vec![Some(failed_timeout()), Some(success())],
                0,
                2,
            )
        },
        SeedCase {
            recovery: Some("1"),
            ..case(
                "test_budget_exhausted_stops_and_releases",
                vec![Some(failed_timeout())],
                75,
                2,
            )
        },
        case(
            "test_single_turn_route_outcomes[nothing-settled]",
            vec![None],
            1,
            1,
        ),
        case(
            "test_single_turn_route_outcomes[denial-unfinished-turn]",
            vec![Some(shapes::partial())],
            1,
            1,
        ),
        case(
            "test_single_turn_route_outcomes[quota-wall]",
            vec![Some(failed_with("rate_limit"))],
            75,
            1,
        ),
        case(
            "test_single_turn_route_outcomes[billing-wall]",
            vec![Some(failed_with("billing"))],
            75,
            1,
        ),
        case(
            "test_single_turn_route_outcomes[upstream-quota-wall]",
            vec![Some(failed_with("upstream_rate_limit"))],
            75,
            1,
        ),
        SeedCase {
            lease: Lease::Expires(1),
            ..case(
                "test_claim_denial_stops_before_model_reentry",
                vec![Some(failed_timeout())],
                75,
                1,
            )
        },
        SeedCase {
            lease: Lease::Expires(1),
            ..goal(
                "test_goal_mode_does_not_continue[recovery-denied]",
                failed_timeout(),
                75,
                1,
            )
        },
        SeedCase {
            lease: Lease::ExpiresDuringBackoff,
            ..goal(
                "test_goal_mode_does_not_continue[lease-expired-during-backoff]",
                failed_timeout(),
                75,
                1,
            )
        },
        goal(
            "test_goal_mode_does_not_continue[quota-wall-billing]",
            failed_with("billing"),
            75,
            1,
        ),
        goal(
            "test_goal_mode_does_not_continue[quota-wall-upstream]",
            failed_with("upstream_rate_limit"),
            75,
            1,
        ),
        goal(
            "test_goal_mode_does_not_continue[interrupt]",
            shapes::interrupted(),
            130,
            1,
        ),
        goal(
            "test_goal_mode_does_not_continue[terminal-settlement]",
            shapes::settled(),
            75,
            1,
        ),
        SeedCase {
            recovery: Some("1"),
            ..goal(
                "test_goal_mode_does_not_continue[budget-exhausted]",
                failed_timeout(),
                75,
                2,
            )
        },
        goal(
            "test_goal_mode_does_not_continue[unfinished-nonfailed]",
            shapes::partial(),
            1,
            1,
        ),
        SeedCase {
            goal_mode: true,
            recovery: Some("2"),
            ..case(
                "test_goal_mode_continues_after_a_successful_authorized_recovery",
                vec![Some(failed_timeout()), Some(success())],
                0,
                2,
            )
        },
    ]
}

/// The case with `id`.
pub fn seed_owner_case(id: &str) -> SeedCase {
    seed_owner_cases()
        .into_iter()
        .find(|case| case.id == id)
        .unwrap_or_else(|| panic!("no seed case {id:?}"))
}

impl SeedCase {
    /// Runs the case on a board made by `make` and checks every expectation.
    /// `set_expiry(board, task_id, expires)` moves both lease expiries.
    pub fn check<B, M, S>(&self, make: M, set_expiry: S)
    where
        B: Board + BoardAdmin + 'static,
        M: FnOnce(VirtualClock) -> B,
        S: Fn(&B, &str, i64),
    {
        let id = self.id;
        let time = VirtualClock::at(1_000_000);
        let seam = OwnerSeam::install(Arc::new(make(time.clone())), time, self.goal_mode);
        let mut options = SeamOptions {
            goal_mode: self.goal_mode,
            recovery: self.recovery.map(str::to_owned),
            ..SeamOptions::default()
        };
        match self.lease {
            Lease::Live => {}
            Lease::Expires(expires) => set_expiry(&seam.board, &seam.claim.task_id, expires),
            Lease::ExpiresDuringBackoff => {
                seam.time.set(1_000);
                set_expiry(&seam.board, &seam.claim.task_id, 1_600);
                options.delays_seconds = vec![700];
            }
        }
        // The positive control's judge rules "blocked" so that the only
        // model entries are the seed's; the refusal rows' judge must never
        // be asked at all.
        let judge = ScriptedJudge::new(vec![VerdictKind::Blocked]);
        let out = seam.run(
            ScriptedRunner::results(self.script.clone()),
            &options,
            Some(&judge),
        );
        assert_eq!(out.booked_exit_code, self.code, "{id}: booked exit code");
        assert_eq!(out.entered.len(), self.entries, "{id}: model entries");
        let judged: Vec<String> = judge
            .calls()
            .all()
            .into_iter()
            .map(|(_, last)| last)
            .collect();
        if self.goal_mode && self.code == 0 {
            assert_eq!(
                judged,
                ["done"],
                "{id}: the judge sees the RECOVERED response"
            );
        } else {
            assert!(
                judged.is_empty(),
                "{id}: no continuation after a refused recovery"
            );
        }
        if self.entries == 2 {
            let nudge = &out.entered[1].message;
            assert!(nudge.contains("Do NOT start over"), "{id}: recovery nudge");
            assert!(
                nudge.contains(&seam.claim.task_id) && !nudge.contains("t_foreign"),
                "{id}: the frame's task, never the env's"
            );
        }
        if matches!(self.lease, Lease::Expires(_) | Lease::ExpiresDuringBackoff) {
            assert!(
                out.emitted
                    .iter()
                    .any(|l| l.contains("no longer holds a live run/claim")),
                "{id}: the skip is said: {:?}",
                out.emitted
            );
        }
    }
}
