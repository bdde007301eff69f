//! The board rules, one table each: every engine applies these answers, so
//! each row here is a row every board honours.

use kanban_core::rules::Change;
use kanban_core::rules::{
    self, CardState, ClaimCandidate, ClaimVerdict, ExitHistory, FailurePolicy, Overrun, Release,
    RunRow, Transition,
};
use kanban_core::{
    BoardError, BookingKind, Claim, ClaimFilter, ExitReport, ExitWitness, Handoff, RunStatus,
    SignalReason, TaskStatus,
};

const NOW: i64 = 1_000_000;

fn claim() -> Claim {
    Claim {
        task_id: "t_1".into(),
        db: "/b.db".into(),
        run_id: 7,
        claim_lock: "h:1:x".into(),
        board: None,
    }
}

fn card(status: TaskStatus) -> CardState {
    CardState {
        task_id: "t_1".into(),
        status,
        current_run_id: Some(7),
        claim_lock: Some("h:1:x".into()),
        claim_expires: Some(NOW + 100),
        worker_pid: Some(42),
        consecutive_failures: 0,
        max_retries: None,
        open_parents: false,
        held: false,
        not_before: None,
        block_kind: None,
        block_recurrences: 0,
    }
}

fn running() -> CardState {
    card(TaskStatus::Running)
}

fn report(witness: ExitWitness) -> ExitReport {
    ExitReport {
        witness,
        source: "wait",
        signalled: None,
        output_tail: "  the end  ".into(),
        policy: FailurePolicy::default(),
        retry_after_seconds: None,
        wall: None,
        unbookable: None,
    }
}

fn kinds(transition: &Transition) -> Vec<&str> {
    transition.events.iter().map(|e| e.kind.as_str()).collect()
}

#[test]
fn which_failure_limit_applies() {
    let rows = [
        (None, 2, 2, false),
        (None, 5, 5, false),
        (Some(4), 2, 4, true),
        (Some(1), 9, 1, true),
        (Some(0), 2, 1, true),
        (None, 0, 1, false),
    ];
    for (max_retries, default, limit, from_card) in rows {
        let got = rules::failure_limit(max_retries, default);
        assert_eq!(
            (got.limit, got.from_card),
            (limit, from_card),
            "{max_retries:?} / {default}"
        );
    }
    assert_eq!(rules::violation_limit(None), 3);
    assert_eq!(rules::violation_limit(Some(1)), 1);
    assert_eq!(rules::violation_limit(Some(5)), 5);
    assert_eq!(rules::violation_limit(Some(0)), 1);
}

#[test]
fn the_violation_streak_over_a_run_history() {
    let rows: [(&[&str], u32); 8] = [
        (&[], 0),
        (&["protocol_violation"], 1),
        (&["protocol_violation", "protocol_violation"], 2),
        (&["rate_limited", "protocol_violation"], 1),
        (
            &["protocol_violation", "rate_limited", "protocol_violation"],
            2,
        ),
        (&["crashed", "protocol_violation"], 0),
        (
            &["protocol_violation", "completed", "protocol_violation"],
            1,
        ),
        (&["rate_limited", "rate_limited"], 0),
    ];
    for (outcomes, streak) in rows {
        assert_eq!(
            rules::violation_streak(outcomes.iter().copied()),
            streak,
            "{outcomes:?}"
        );
    }
    let long = vec!["protocol_violation"; 80];
    assert_eq!(
        rules::violation_streak(long.iter().copied()),
        rules::STREAK_SCAN_LIMIT as u32,
        "only the newest runs are read"
    );
}

#[test]
fn landings() {
    assert_eq!(rules::requeue_landing(false), TaskStatus::Ready);
    assert_eq!(rules::requeue_landing(true), TaskStatus::Todo);
    use rules::Start;
    let start = |start, open, not_before| rules::initial_status(start, open, not_before, NOW);
    assert_eq!(start(Start::InLine, false, None), TaskStatus::Ready);
    assert_eq!(start(Start::InLine, true, None), TaskStatus::Todo);
    assert_eq!(start(Start::Blocked, false, None), TaskStatus::Blocked);
    assert_eq!(start(Start::Blocked, true, None), TaskStatus::Blocked);
    assert_eq!(start(Start::Triage, false, None), TaskStatus::Triage);
    assert_eq!(
        start(Start::Triage, true, Some(NOW + 1)),
        TaskStatus::Triage
    );
    // Due later: parked where neither system claims it; due now: in line.
    assert_eq!(
        start(Start::InLine, false, Some(NOW + 1)),
        TaskStatus::Scheduled
    );
    assert_eq!(
        start(Start::InLine, true, Some(NOW + 1)),
        TaskStatus::Scheduled
    );
    assert_eq!(start(Start::InLine, false, Some(NOW)), TaskStatus::Ready);
    assert_eq!(start(Start::InLine, true, Some(NOW)), TaskStatus::Todo);
    assert_eq!(
        start(Start::Blocked, false, Some(NOW + 1)),
        TaskStatus::Blocked
    );
}

#[test]
fn the_backoff_between_failed_runs() {
    // (failures, lowest, highest) for the default 30 s base.
    let rows = [
        (1, 30, 37),
        (2, 60, 75),
        (3, 120, 150),
        (5, 480, 600),
        (8, 3600, 4500),
        (40, 3600, 4500),
    ];
    for (failures, low, high) in rows {
        for seed in 0..64 {
            let wait = rules::retry_backoff_seconds(30, failures, seed);
            assert!(
                (low..=high).contains(&wait),
                "failure {failures}, seed {seed}: {wait}"
            );
        }
    }
    assert_eq!(
        rules::retry_backoff_seconds(0, 3, 1),
        0,
        "a zero base is off"
    );
    assert_eq!(rules::retry_backoff_seconds(-5, 3, 1), 0);
    assert_eq!(
        rules::retry_backoff_seconds(30, 0, 9),
        rules::retry_backoff_seconds(30, 1, 9),
        "the first failure waits the base"
    );
    let spread: std::collections::BTreeSet<i64> = (0..64)
        .map(|seed| rules::retry_backoff_seconds(30, 2, seed))
        .collect();
    assert!(spread.len() > 8, "the jitter spreads: {spread:?}");
    assert_eq!(
        rules::retry_backoff_seconds(30, 2, 11),
        rules::retry_backoff_seconds(30, 2, 11),
        "and is stable for one seed"
    );
}

#[test]
fn when_a_lease_has_expired() {
    assert!(rules::lease_expired(None, NOW), "no expiry is no lease");
    assert!(
        !rules::lease_expired(Some(NOW), NOW),
        "expiring exactly now is still live"
    );
    assert!(rules::lease_expired(Some(NOW - 1), NOW));
    assert!(!rules::lease_expired(Some(NOW + 1), NOW));
}

#[test]
fn who_holds_a_claim() {
    let held = claim();
    assert!(rules::holds_claim(&running(), &held));
    for (what, state) in [
        ("not running", card(TaskStatus::Ready)),
        (
            "another run",
            CardState {
                current_run_id: Some(8),
                ..running()
            },
        ),
        (
            "another lock",
            CardState {
                claim_lock: Some("h:1:y".into()),
                ..running()
            },
        ),
        (
            "no lock",
            CardState {
                claim_lock: None,
                ..running()
            },
        ),
    ] {
        assert!(!rules::holds_claim(&state, &held), "{what}");
    }
}

#[test]
fn where_a_run_stands() {
    let open = RunRow {
        ended: false,
        outcome: None,
    };
    let closed = |outcome: &str| RunRow {
        ended: true,
        outcome: Some(outcome.into()),
    };
    let held = claim();
    let rows = [
        (running(), Some(open.clone()), RunStatus::Running),
        (
            card(TaskStatus::Ready),
            Some(open.clone()),
            RunStatus::Superseded,
        ),
        (
            card(TaskStatus::Done),
            Some(closed("completed")),
            RunStatus::Done,
        ),
        (
            card(TaskStatus::Blocked),
            Some(closed("blocked")),
            RunStatus::Blocked,
        ),
        (
            card(TaskStatus::Ready),
            Some(closed("reclaimed")),
            RunStatus::Superseded,
        ),
        (
            card(TaskStatus::Ready),
            Some(closed("crashed")),
            RunStatus::Superseded,
        ),
        (running(), None, RunStatus::Superseded),
        (
            CardState {
                current_run_id: Some(9),
                ..running()
            },
            Some(open),
            RunStatus::Superseded,
        ),
    ];
    for (state, run, expected) in rows {
        assert_eq!(
            rules::run_status(&state, run.as_ref(), &held),
            expected,
            "{state:?} {run:?}"
        );
    }
}

#[test]
fn booking_a_crash_counts_backs_off_and_blocks_at_the_limit() {
    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Code(3)),
        NOW,
    );
    assert_eq!(booking.kind, BookingKind::Crashed);
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(t.consecutive_failures, Some(1));
    assert!(t.release_claim);
    let close = t.close_run.as_ref().unwrap();
    assert_eq!(
        (close.status.as_str(), close.outcome.as_str()),
        ("crashed", "crashed")
    );
    assert!(
        close
            .error
            .as_deref()
            .unwrap()
            .contains("exited with code 3")
    );
    assert!(
        close.error.as_deref().unwrap().ends_with("\"the end\""),
        "the trimmed output tail: {close:?}"
    );
    let retry_at = t.not_before.value().flatten().copied().expect("a backoff");
    assert!((NOW + 30..=NOW + 37).contains(&retry_at));
    assert_eq!(kinds(&t), ["crashed"]);
    assert_eq!(t.events[0].run_id, Some(7));
    assert_eq!(t.events[0].payload["counted"], true);
    assert_eq!(t.events[0].payload["retry_at"], retry_at);

    let (booking, t) = rules::book_exit(
        &CardState {
            consecutive_failures: 1,
            ..running()
        },
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Signal(9)),
        NOW,
    );
    assert!(booking.blocks);
    assert_eq!(t.status, Some(TaskStatus::Blocked));
    assert_eq!(t.consecutive_failures, Some(2));
    assert_eq!(
        t.not_before,
        Change::Clear,
        "a blocked card waits for a human"
    );
    assert_eq!(kinds(&t), ["crashed", "gave_up"]);
    assert_eq!(t.events[1].payload["effective_limit"], 2);
    assert_eq!(t.events[1].payload["limit_source"], "dispatcher");

    let (_, t) = rules::book_exit(
        &CardState {
            consecutive_failures: 1,
            max_retries: Some(3),
            ..running()
        },
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Unknown),
        NOW,
    );
    assert_eq!(
        t.status,
        Some(TaskStatus::Ready),
        "the card's own limit wins"
    );
    let no_backoff = ExitReport {
        policy: FailurePolicy {
            backoff_base_seconds: 0,
            ..FailurePolicy::default()
        },
        ..report(ExitWitness::Code(1))
    };
    let (_, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &no_backoff,
        NOW,
    );
    assert_eq!(t.not_before, Change::Clear, "no backoff, no hold");
}

#[test]
fn booking_walls_and_violations_counts_nothing() {
    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &ExitReport {
            retry_after_seconds: Some(900),
            ..report(ExitWitness::Code(75))
        },
        NOW,
    );
    assert_eq!(booking.kind, BookingKind::RateLimited);
    assert_eq!(t.consecutive_failures, None, "not counted");
    assert_eq!(
        t.not_before,
        Change::Set(NOW + 900),
        "Retry-After beyond the cooldown"
    );
    assert_eq!(t.status, Some(TaskStatus::Ready));
    let (_, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &ExitReport {
            retry_after_seconds: Some(10),
            ..report(ExitWitness::Code(75))
        },
        NOW,
    );
    assert_eq!(
        t.not_before,
        Change::Set(NOW + 300),
        "the cooldown when longer"
    );

    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Code(0)),
        NOW,
    );
    assert_eq!(
        (booking.kind, booking.blocks),
        (BookingKind::ProtocolViolation, false)
    );
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(t.not_before, Change::Clear, "no hold after a violation");
    let history = ExitHistory {
        recent_outcomes: vec!["protocol_violation".into(), "protocol_violation".into()],
        ..ExitHistory::default()
    };
    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &history,
        &report(ExitWitness::Code(0)),
        NOW,
    );
    assert!(booking.blocks, "the third in a row blocks");
    assert_eq!(t.status, Some(TaskStatus::Blocked));
    assert_eq!(kinds(&t), ["protocol_violation", "gave_up"]);

    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Code(78)),
        NOW,
    );
    assert_eq!(booking.kind, BookingKind::TerminalProvider);
    assert_eq!(t.status, Some(TaskStatus::Blocked), "78 blocks at once");
    assert_eq!(t.consecutive_failures, Some(1));
    assert_eq!(t.not_before, Change::Clear);
    assert!(kinds(&t).contains(&"gave_up"));
}

#[test]
fn booking_follows_the_recorded_stop() {
    let shutdown = ExitHistory {
        recorded_signal: Some(SignalReason::Shutdown),
        ..ExitHistory::default()
    };
    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &shutdown,
        &report(ExitWitness::Code(130)),
        NOW,
    );
    assert_eq!(booking.kind, BookingKind::Interrupted);
    assert_eq!(t.consecutive_failures, None);
    let overrun = ExitHistory {
        recorded_signal: Some(SignalReason::Overrun),
        ..ExitHistory::default()
    };
    let (booking, _) = rules::book_exit(
        &running(),
        &claim(),
        &overrun,
        &report(ExitWitness::Code(130)),
        NOW,
    );
    assert_eq!(
        booking.kind,
        BookingKind::TimedOut,
        "the recorded reason wins"
    );
    let (booking, _) = rules::book_exit(
        &running(),
        &claim(),
        &shutdown,
        &ExitReport {
            signalled: Some(SignalReason::Overrun),
            ..report(ExitWitness::Code(130))
        },
        NOW,
    );
    assert_eq!(
        booking.kind,
        BookingKind::TimedOut,
        "the stronger reason wins"
    );
}

#[test]
fn booking_a_settled_run_changes_nothing() {
    let (booking, t) = rules::book_exit(
        &card(TaskStatus::Done),
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Code(1)),
        NOW,
    );
    assert_eq!(booking.kind, BookingKind::Settled);
    assert_eq!(
        t,
        Transition {
            events: t.events.clone(),
            ..Transition::default()
        }
    );
    assert_eq!(kinds(&t), ["worker_exited"]);
}

#[test]
fn releasing_a_claim() {
    let policy = FailurePolicy::default();
    let expired = CardState {
        claim_expires: Some(NOW - 1),
        ..running()
    };
    assert_eq!(
        rules::release_claim(&running(), &claim(), &Release::Expired, &policy, NOW, None),
        None,
        "a live lease is not released"
    );
    assert_eq!(
        rules::release_claim(
            &card(TaskStatus::Ready),
            &claim(),
            &Release::Expired,
            &policy,
            NOW,
            None
        ),
        None,
        "a claim the card no longer holds"
    );
    let t =
        rules::release_claim(&expired, &claim(), &Release::Expired, &policy, NOW, None).unwrap();
    assert_eq!(t.consecutive_failures, Some(1), "counted");
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(t.close_run.as_ref().unwrap().outcome, "reclaimed");
    assert_eq!(kinds(&t), ["reclaimed"]);
    let t = rules::release_claim(
        &CardState {
            open_parents: true,
            ..expired.clone()
        },
        &claim(),
        &Release::Expired,
        &policy,
        NOW,
        None,
    )
    .unwrap();
    assert_eq!(
        t.status,
        Some(TaskStatus::Todo),
        "back to todo while a parent is open"
    );
    let t = rules::release_claim(
        &CardState {
            consecutive_failures: 1,
            ..expired
        },
        &claim(),
        &Release::Expired,
        &policy,
        NOW,
        None,
    )
    .unwrap();
    assert_eq!(t.status, Some(TaskStatus::Blocked), "at the limit");
    let not_started = Release::NotStarted {
        reason: "no agent".into(),
    };
    let t = rules::release_claim(&running(), &claim(), &not_started, &policy, NOW, None).unwrap();
    assert_eq!(t.consecutive_failures, None, "not counted");
    assert_eq!(t.not_before, Change::Keep, "not held back");
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert!(t.release_claim, "the lock is let go with the run");
    assert_eq!(t.close_run.as_ref().unwrap().outcome, "released");
    assert_eq!(t.events[0].payload["counted"], false);
}

#[test]
fn a_stale_run_its_dispatcher_stopped_at_shutdown_is_released_uncounted() {
    let policy = FailurePolicy::default();
    let expired = CardState {
        claim_expires: Some(NOW - 1),
        consecutive_failures: 1,
        ..running()
    };
    let release = |signal, card: &CardState| {
        rules::release_claim(card, &claim(), &Release::Expired, &policy, NOW, signal)
    };
    let t = release(Some(SignalReason::Shutdown), &expired).unwrap();
    assert_eq!(t.consecutive_failures, None, "not counted");
    assert_eq!(t.not_before, Change::Keep, "not held back");
    assert!(t.release_claim);
    assert_eq!(
        t.status,
        Some(TaskStatus::Ready),
        "not blocked at the limit"
    );
    let closed = t.close_run.as_ref().unwrap();
    assert_eq!(
        (closed.status.as_str(), closed.outcome.as_str()),
        ("reclaimed", "reclaimed")
    );
    assert!(closed.error.as_deref().unwrap().starts_with("stale_lock="));
    assert_eq!(kinds(&t), ["reclaimed"]);
    assert_eq!(t.events[0].run_id, Some(claim().run_id));
    assert_eq!(t.events[0].payload["counted"], false);
    assert_eq!(t.events[0].payload["signalled"], "shutdown");
    let waiting = CardState {
        open_parents: true,
        ..expired.clone()
    };
    assert_eq!(
        release(Some(SignalReason::Shutdown), &waiting)
            .unwrap()
            .status,
        Some(TaskStatus::Todo),
        "back to todo while a parent is open"
    );
    assert_eq!(
        release(Some(SignalReason::Shutdown), &running()),
        None,
        "a live lease is not released"
    );
    // Any other signal (or none) leaves the stale release the run's own.
    for signal in [
        None,
        Some(SignalReason::Overrun),
        Some(SignalReason::Fenced),
    ] {
        let t = release(signal, &expired).unwrap();
        assert_eq!(t.consecutive_failures, Some(2), "{signal:?}");
        assert_eq!(t.status, Some(TaskStatus::Blocked), "{signal:?}");
    }
}

#[test]
fn an_overrun_settles_as_timed_out() {
    let policy = FailurePolicy::default();
    for overrun in [
        Overrun::IterationLimit("60/60".into()),
        Overrun::TurnDeadline { seconds: 1800 },
        Overrun::RunLimit { seconds: 3600 },
    ] {
        let t = rules::settle_overrun(&running(), &claim(), &overrun, &policy, NOW).unwrap();
        assert_eq!(
            t.close_run.as_ref().unwrap().outcome,
            "timed_out",
            "{overrun:?}"
        );
        assert_eq!(t.consecutive_failures, Some(1));
        assert!(t.release_claim);
        assert_eq!(t.status, Some(TaskStatus::Ready));
    }
    assert_eq!(
        rules::settle_overrun(
            &card(TaskStatus::Done),
            &claim(),
            &Overrun::RunLimit { seconds: 1 },
            &policy,
            NOW
        ),
        None
    );
}

#[test]
fn terminal_calls_and_operator_moves() {
    let t = rules::complete(&claim(), &Handoff::new("did it", None), &[], NOW);
    assert_eq!(t.status, Some(TaskStatus::Done));
    assert_eq!(t.consecutive_failures, Some(0));
    assert_eq!(t.completion.as_ref().unwrap().result, "did it");
    assert_eq!(t.completion.as_ref().unwrap().completed_at, NOW);
    let t = rules::complete(
        &claim(),
        &Handoff::new("did it", Some("the result".into())),
        &[],
        NOW,
    );
    assert_eq!(t.completion.unwrap().result, "the result");
    let t = rules::block(&running(), &claim(), "need a key", None);
    assert_eq!(t.status, Some(TaskStatus::Blocked));
    assert_eq!(t.close_run.unwrap().summary.as_deref(), Some("need a key"));

    let t = rules::reclaim(&running(), "stuck", NOW).unwrap();
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(
        t.consecutive_failures,
        Some(0),
        "an operator reclaim starts the count again"
    );
    assert!(matches!(
        rules::reclaim(&card(TaskStatus::Ready), "x", NOW),
        Err(BoardError::InvalidTransition { action, .. }) if action == "reclaim"
    ));
    let t = rules::unblock(&card(TaskStatus::Blocked)).unwrap();
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(t.not_before, Change::Clear);
    let t = rules::unblock(&CardState {
        open_parents: true,
        ..card(TaskStatus::Blocked)
    })
    .unwrap();
    assert_eq!(t.status, Some(TaskStatus::Todo));
    assert!(rules::unblock(&running()).is_err());
    assert!(rules::promote(&card(TaskStatus::Todo), NOW).is_some());
    assert!(
        rules::promote(
            &CardState {
                open_parents: true,
                ..card(TaskStatus::Todo)
            },
            NOW
        )
        .is_none()
    );
    assert!(rules::promote(&card(TaskStatus::Ready), NOW).is_none());
    let t = rules::reject_claim_for_parents();
    assert_eq!(t.status, Some(TaskStatus::Todo));
}

#[test]
fn creation_events() {
    let parents = vec!["t_p".to_owned()];
    let events = rules::creation_events(TaskStatus::Todo, &parents, Some("ana"));
    let kinds: Vec<_> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "dependency_wait"]);
    assert_eq!(events[0].payload["assignee"], "ana");
    let events = rules::creation_events(TaskStatus::Blocked, &[], None);
    assert_eq!(events[1].kind, "blocked");
    assert_eq!(
        rules::creation_events(TaskStatus::Ready, &[], None).len(),
        1
    );
}

#[test]
fn the_lease_length_and_where_it_comes_from() {
    use kanban_core::{
        DEFAULT_CLAIM_TTL_SECONDS, Environment, MAX_CLAIM_TTL_SECONDS, claim_ttl_seconds, vars,
    };
    assert_eq!(
        (DEFAULT_CLAIM_TTL_SECONDS, MAX_CLAIM_TTL_SECONDS),
        (900, 86_400)
    );
    let none = Environment::new();
    let env = |value: &str| Environment::new().with(vars::CLAIM_TTL_SECONDS, value);
    for (explicit, environment, expected) in [
        (None, none.clone(), Ok(900)),
        (Some(1), none.clone(), Ok(1)),
        (Some(86_400), none.clone(), Ok(86_400)),
        (None, env("60"), Ok(60)),
        (Some(30), env("60"), Ok(30)),
        (None, env("1"), Ok(1)),
        (None, env("86400"), Ok(86_400)),
        (None, env("  "), Ok(900)),
    ] {
        assert_eq!(
            claim_ttl_seconds(explicit, &environment),
            expected,
            "{explicit:?} {environment:?}"
        );
    }
    for explicit in [0, -1, 86_401] {
        let refused = claim_ttl_seconds(Some(explicit), &none).unwrap_err();
        assert!(refused.contains(&format!("--ttl {explicit}")), "{refused}");
    }
    for bad in ["0", "-5", "86401", "ten", "1.5"] {
        let refused = claim_ttl_seconds(None, &env(bad)).unwrap_err();
        assert!(
            refused.contains(vars::CLAIM_TTL_SECONDS) && refused.contains(bad),
            "{refused}"
        );
    }
}

#[test]
fn workers_heartbeat_three_times_a_lease_and_at_least_once_a_minute() {
    use kanban_core::heartbeat_interval_seconds;
    for (ttl, every) in [
        (-5, 1),
        (0, 1),
        (3, 1),
        (5, 1),
        (6, 2),
        (9, 3),
        (179, 59),
        (180, 60),
        (900, 60),
    ] {
        assert_eq!(heartbeat_interval_seconds(ttl), every, "ttl {ttl}");
    }
}

#[test]
fn lanes_are_stored_by_the_seeds_names() {
    let names: Vec<&str> = TaskStatus::ALL
        .iter()
        .map(|status| status.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "triage",
            "todo",
            "scheduled",
            "ready",
            "running",
            "blocked",
            "review",
            "done",
            "archived"
        ]
    );
    for status in TaskStatus::ALL {
        assert_eq!(TaskStatus::parse(status.as_str()), Some(status));
    }
    assert_eq!(TaskStatus::parse("xyzzy"), None);
    assert_eq!(TaskStatus::parse(""), None);
}

#[test]
fn a_lease_expiring_exactly_now_is_still_live_and_a_second_later_is_not() {
    use kanban_core::NotLive;
    use kanban_core::ProofIdentity;
    use kanban_core::lease::{LeaseView, RunLease, TaskLease, evaluate_lease};
    // The seed's stale selector is `claim_expires < now`: at `now` itself
    // the lease still holds, for the card and for its run alike.
    let view = |task_expires: i64, run_expires: i64| LeaseView {
        task: Some(TaskLease {
            status: "running".to_owned(),
            worker_pid: None,
            current_run_id: Some(7),
            claim_lock: Some("lk".to_owned()),
            claim_expires: Some(task_expires),
        }),
        run: Some(RunLease {
            ended_at: None,
            worker_pid: None,
            claim_expires: Some(run_expires),
        }),
        newest_bound: None,
    };
    let prove = |task_expires, run_expires| {
        evaluate_lease(
            &view(task_expires, run_expires),
            "7",
            "lk",
            ProofIdentity::AnyProcess,
            NOW,
        )
    };
    assert_eq!(prove(NOW, NOW), Ok(()));
    assert_eq!(
        prove(NOW - 1, NOW),
        Err(NotLive::TaskLeaseExpired {
            expires: NOW - 1,
            now: NOW
        })
    );
    assert_eq!(
        prove(NOW, NOW - 1),
        Err(NotLive::RunLeaseExpired {
            expires: NOW - 1,
            now: NOW
        })
    );
}

#[test]
fn signal_reasons_are_stored_by_name() {
    for (reason, name) in [
        (SignalReason::Shutdown, "shutdown"),
        (SignalReason::Overrun, "overrun"),
        (SignalReason::Fenced, "fenced"),
    ] {
        assert_eq!(reason.as_str(), name);
        assert_eq!(SignalReason::parse(name), Some(reason));
    }
    assert_eq!(SignalReason::parse("Shutdown"), None);
    assert_eq!(SignalReason::parse(""), None);
}

#[test]
fn exit_trailers_are_written_and_read_back_exactly() {
    use kanban_core::{Trailer, last_trailer};
    let trailer = |code, seal: Option<&str>, alone, fault: Option<(bool, &str)>| Trailer {
        code,
        seal: seal.map(str::to_owned),
        alone,
        fault: fault.map(|(configuration, text): (bool, &str)| {
            if configuration {
                kanban_core::EnvironmentFault::Configuration(text.to_owned())
            } else {
                kanban_core::EnvironmentFault::Transient(text.to_owned())
            }
        }),
    };
    let rows = [
        (trailer(0, None, false, None), "[kanban-worker-exit] rc=0"),
        (
            trailer(75, Some("ab12"), false, None),
            "[kanban-worker-end] rc=75 seal=ab12\n[kanban-worker-exit] rc=75",
        ),
        (
            trailer(78, Some("cd"), false, Some((true, "no agent"))),
            "[kanban-worker-end] rc=78 seal=cd fault=config:no agent\n[kanban-worker-exit] rc=78",
        ),
        (
            trailer(75, None, false, Some((false, "board busy"))),
            "[kanban-worker-end] rc=75 fault=transient:board busy\n[kanban-worker-exit] rc=75",
        ),
        (
            trailer(0, Some("ef"), true, None),
            "[kanban-worker-end] rc=0 seal=ef alone\n[kanban-worker-exit] rc=0",
        ),
        (
            trailer(75, Some("ef"), true, Some((false, "alone on a full disk"))),
            "[kanban-worker-end] rc=75 seal=ef alone fault=transient:alone on a full disk\n[kanban-worker-exit] rc=75",
        ),
        (
            trailer(1, None, true, None),
            "[kanban-worker-end] rc=1 alone\n[kanban-worker-exit] rc=1",
        ),
    ];
    for (trailer, lines) in rows {
        assert_eq!(trailer.lines(), lines);
        let log = format!("agent output\n{lines}\n");
        assert_eq!(
            last_trailer(&log, |_| true),
            Some(trailer.clone()),
            "{lines}"
        );
        let spaced = lines.replace('\n', "  \n") + "  ";
        assert_eq!(
            last_trailer(&spaced, |_| true),
            Some(trailer),
            "trailing space"
        );
    }
    // A fault keeps on one line whatever its text.
    let multiline = trailer(1, None, false, Some((false, "two\nlines\rand more")));
    assert_eq!(
        multiline.lines(),
        "[kanban-worker-end] rc=1 fault=transient:two lines and more\n[kanban-worker-exit] rc=1"
    );
    assert_eq!(Trailer::parse(None, "[kanban-worker-exit] rc=x"), None);
    assert_eq!(Trailer::parse(None, "not a trailer"), None);
    // The detail line counts only just before a trailer of the same code.
    let apart = "[kanban-worker-end] rc=0 seal=ef alone\nmore\n[kanban-worker-exit] rc=0";
    assert_eq!(
        last_trailer(apart, |_| true),
        Some(trailer(0, None, false, None))
    );
    let other = "[kanban-worker-end] rc=1 seal=ef alone\n[kanban-worker-exit] rc=0";
    assert_eq!(
        last_trailer(other, |_| true),
        Some(trailer(0, None, false, None))
    );
    // A sealed trailer is found behind a later unsealed one (an agent's).
    let forged =
        "[kanban-worker-end] rc=1 seal=ef\n[kanban-worker-exit] rc=1\n[kanban-worker-exit] rc=0";
    assert_eq!(
        last_trailer(forged, |seal| seal == Some("ef")),
        Some(trailer(1, Some("ef"), false, None))
    );
}

#[test]
fn an_older_builds_one_line_trailer_is_still_read() {
    use kanban_core::{Trailer, last_trailer};
    let rows = [
        (
            "[kanban-worker-exit] rc=75 seal=ab12",
            75,
            Some("ab12"),
            false,
            None,
        ),
        (
            "[kanban-worker-exit] rc=78 seal=cd fault=config:no agent",
            78,
            Some("cd"),
            false,
            Some(kanban_core::EnvironmentFault::Configuration(
                "no agent".to_owned(),
            )),
        ),
        (
            "[kanban-worker-exit] rc=0 seal=ef alone",
            0,
            Some("ef"),
            true,
            None,
        ),
        ("[kanban-worker-exit] rc=1 alone", 1, None, true, None),
        (
            "[kanban-worker-exit] rc=75 fault=transient:busy",
            75,
            None,
            false,
            Some(kanban_core::EnvironmentFault::Transient("busy".to_owned())),
        ),
    ];
    for (line, code, seal, alone, fault) in rows {
        let expected = Trailer {
            code,
            seal: seal.map(str::to_owned),
            alone,
            fault,
        };
        assert_eq!(Trailer::parse(None, line), Some(expected.clone()), "{line}");
        assert_eq!(
            last_trailer(&format!("x\n{line}\n"), |_| true),
            Some(expected)
        );
    }
    // Only the word itself: a longer one is not it.
    let lonely = Trailer::parse(None, "[kanban-worker-exit] rc=0 seal=ef alonely").unwrap();
    assert!(!lonely.alone, "{lonely:?}");
}

#[test]
fn task_ids_and_run_ids_are_read_exactly() {
    use kanban_core::{is_valid_task_id, parse_run_id};
    for id in ["t_0123abcd", "a", "A-b_9", &"x".repeat(64)] {
        assert!(is_valid_task_id(id), "{id}");
    }
    for id in ["", "../x", "a/b", "a b", "t.1", "é", &"x".repeat(65)] {
        assert!(!is_valid_task_id(id), "{id}");
    }
    assert_eq!(parse_run_id("91"), Some(91));
    assert_eq!(parse_run_id("0"), Some(0));
    assert_eq!(parse_run_id("-3"), Some(-3));
    for raw in ["091", "+91", " 91", "91 ", "9.0", "", "x"] {
        assert_eq!(parse_run_id(raw), None, "{raw:?}");
    }
}

#[test]
fn the_backoffs_jitter_is_a_fixed_function_of_the_run() {
    // splitmix64's finaliser, pinned: a replay waits exactly the same, and
    // neighbouring runs do not come back in the same second.
    for (seed, wait) in [(0, 468), (1, 475), (2, 480), (7, 483), (1000, 428)] {
        assert_eq!(
            rules::retry_backoff_seconds(400, 1, seed),
            wait,
            "seed {seed}"
        );
    }
    // Through a booking, the seed is the run id (7 here).
    let mut crash = report(ExitWitness::Code(3));
    crash.policy.backoff_base_seconds = 400;
    let (_, t) = rules::book_exit(&running(), &claim(), &ExitHistory::default(), &crash, NOW);
    assert_eq!(t.not_before, Change::Set(NOW + 483));
}

#[test]
fn a_booking_records_the_exit_code_or_the_signal() {
    for (witness, code, signal) in [
        (
            ExitWitness::Code(3),
            serde_json::json!(3),
            serde_json::Value::Null,
        ),
        (
            ExitWitness::Signal(9),
            serde_json::Value::Null,
            serde_json::json!(9),
        ),
        (
            ExitWitness::Unknown,
            serde_json::Value::Null,
            serde_json::Value::Null,
        ),
    ] {
        let (_, t) = rules::book_exit(
            &running(),
            &claim(),
            &ExitHistory::default(),
            &report(witness),
            NOW,
        );
        assert_eq!(t.events[0].payload["exit_code"], code, "{witness:?}");
        assert_eq!(t.events[0].payload["signal"], signal, "{witness:?}");
    }
}

#[test]
fn an_overrun_says_what_ran_over() {
    let policy = FailurePolicy::default();
    for (overrun, words) in [
        (
            Overrun::IterationLimit("60/60".into()),
            "iteration budget exhausted (60/60): the task could not complete within the allowed iterations",
        ),
        (
            Overrun::TurnDeadline { seconds: 1800 },
            "a turn ran past its 1800 s deadline and its agent was stopped",
        ),
        (
            Overrun::RunLimit { seconds: 3600 },
            "the run ran past its 3600 s limit and its agent was stopped",
        ),
    ] {
        let t = rules::settle_overrun(&running(), &claim(), &overrun, &policy, NOW).unwrap();
        assert_eq!(t.close_run.as_ref().unwrap().error.as_deref(), Some(words));
    }
}

#[test]
fn a_block_closes_the_run_releases_the_claim_and_lifts_any_hold() {
    let t = rules::block(&running(), &claim(), "needs a key", None);
    assert_eq!(t.status, Some(TaskStatus::Blocked));
    assert!(t.release_claim);
    assert_eq!(t.not_before, Change::Clear);
    let close = t.close_run.as_ref().unwrap();
    assert_eq!(
        (
            close.status.as_str(),
            close.outcome.as_str(),
            close.summary.as_deref()
        ),
        ("blocked", "blocked", Some("needs a key"))
    );
    assert_eq!(kinds(&t), ["blocked"]);
    assert_eq!(t.events[0].payload["reason"], "needs a key");
    assert_eq!(t.events[0].run_id, Some(7));
}

#[test]
fn operator_moves_reset_what_they_say_and_leave_an_event() {
    let blocked = CardState {
        consecutive_failures: 2,
        ..card(TaskStatus::Blocked)
    };
    let t = rules::unblock(&blocked).unwrap();
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(t.consecutive_failures, Some(0));
    assert_eq!(t.last_failure_error, Change::Clear);
    assert_eq!(t.not_before, Change::Clear);
    assert_eq!(kinds(&t), ["unblocked"]);
    assert_eq!(t.events[0].payload["status"], "ready");
    let t = rules::promote(&card(TaskStatus::Todo), NOW).unwrap();
    assert_eq!(t.status, Some(TaskStatus::Ready));
    assert_eq!(kinds(&t), ["promoted"]);
    let t = rules::reject_claim_for_parents();
    assert_eq!(kinds(&t), ["claim_rejected"]);
    assert_eq!(t.events[0].payload["reason"], "parents_not_done");
}

#[test]
fn operators_cancel_archive_hold_release_and_edit() {
    use kanban_core::rules::{CardEdit, archive, cancel, edit, hold, release_hold};
    // Cancel: every lane but done and archived; a running card's run closes
    // and its claim goes, so its worker is fenced out.
    let t = cancel(&running(), "no longer needed").unwrap();
    assert_eq!(t.status, Some(TaskStatus::Archived));
    assert!(t.release_claim);
    assert_eq!(t.close_run.as_ref().unwrap().outcome, "cancelled");
    assert_eq!(t.events[0].kind, "cancelled");
    assert_eq!(t.events[0].run_id, Some(7));
    assert_eq!(t.events[0].payload["was"], "running");
    assert_eq!(t.held, Change::Clear);
    assert_eq!(
        t.not_before,
        Change::Clear,
        "a cancelled card waits for nothing"
    );
    for status in [TaskStatus::Ready, TaskStatus::Todo, TaskStatus::Blocked] {
        let t = cancel(&card(status), "r").unwrap();
        assert!(!t.release_claim && t.close_run.is_none(), "{status:?}");
        assert_eq!(t.events[0].run_id, None);
        assert_eq!(t.status, Some(TaskStatus::Archived));
    }
    for status in [TaskStatus::Done, TaskStatus::Archived] {
        assert!(cancel(&card(status), "r").is_err(), "{status:?}");
    }
    // Archive: not while it runs (cancel that), not twice.
    for (status, ok) in [
        (TaskStatus::Done, true),
        (TaskStatus::Blocked, true),
        (TaskStatus::Ready, true),
        (TaskStatus::Todo, true),
        (TaskStatus::Running, false),
        (TaskStatus::Archived, false),
    ] {
        let result = archive(&card(status));
        assert_eq!(result.is_ok(), ok, "{status:?}");
        if let Ok(t) = result {
            assert_eq!(t.status, Some(TaskStatus::Archived));
            assert_eq!(t.not_before, Change::Clear);
            assert_eq!(t.events[0].kind, "archived");
        }
    }
    // Hold: ready or todo, once; release: only a held card.
    for (status, ok) in [
        (TaskStatus::Ready, true),
        (TaskStatus::Todo, true),
        (TaskStatus::Running, false),
        (TaskStatus::Blocked, false),
        (TaskStatus::Done, false),
    ] {
        assert_eq!(hold(&card(status), "why").is_ok(), ok, "{status:?}");
    }
    let t = hold(&card(TaskStatus::Ready), "why").unwrap();
    assert_eq!(t.held, Change::Set("why".into()));
    assert_eq!(
        t.status,
        Some(TaskStatus::Scheduled),
        "a held card is parked where neither system claims it"
    );
    assert_eq!(t.events[0].kind, "held");
    assert_eq!(t.events[0].payload["reason"], "why");
    let held = CardState {
        held: true,
        ..card(TaskStatus::Ready)
    };
    assert!(hold(&held, "again").is_err());
    assert_eq!(release_hold(&held, NOW).unwrap().held, Change::Clear);
    assert_eq!(release_hold(&held, NOW).unwrap().events[0].kind, "released");
    assert!(matches!(
        release_hold(&card(TaskStatus::Ready), NOW),
        Err(BoardError::InvalidInput(_))
    ));
    // Edit: anything but an archived card; at least one field; a title
    // that is not blank.
    let change = CardEdit {
        priority: Some(3),
        assignee: Change::Clear,
        ..CardEdit::default()
    };
    let t = edit(&running(), &change).unwrap();
    assert_eq!(t.edit, Some(change.clone()));
    assert_eq!(
        t.events[0].payload["fields"],
        serde_json::json!(["priority", "assignee"])
    );
    assert!(edit(&card(TaskStatus::Archived), &change).is_err());
    assert!(edit(&running(), &CardEdit::default()).is_err());
    let blank = CardEdit {
        title: Some("  ".into()),
        ..CardEdit::default()
    };
    assert!(edit(&running(), &blank).is_err());
    // A tenant is checked as `add` checks it.
    for bad in ["two\nlines", " padded", &"x".repeat(201)] {
        let change = CardEdit {
            tenant: Change::Set(bad.to_owned()),
            ..CardEdit::default()
        };
        assert!(
            matches!(edit(&running(), &change), Err(BoardError::InvalidInput(why)) if why.starts_with("a card's tenant")),
            "{bad:?}"
        );
    }
    let fine = CardEdit {
        tenant: Change::Set("x".repeat(200)),
        ..CardEdit::default()
    };
    assert!(edit(&running(), &fine).is_ok());
    // A workspace changes only before a run starts in it, and only to one
    // `add` takes.
    use kanban_core::rules::WorkspaceEdit;
    use kanban_core::workspaces::{WorkspaceKind, WorkspaceSpec};
    let moved = |kind, path: Option<&str>, branch: Option<&str>| CardEdit {
        workspace: Some(WorkspaceEdit {
            spec: WorkspaceSpec {
                kind,
                path: path.map(str::to_owned),
            },
            branch: branch.map(str::to_owned),
        }),
        ..CardEdit::default()
    };
    let to_dir = moved(WorkspaceKind::Dir, Some("/srv/work"), None);
    for status in [
        TaskStatus::Todo,
        TaskStatus::Ready,
        TaskStatus::Blocked,
        TaskStatus::Triage,
    ] {
        assert_eq!(
            edit(&card(status), &to_dir).unwrap().edit,
            Some(to_dir.clone())
        );
    }
    for status in [TaskStatus::Running, TaskStatus::Done] {
        let refused = if status == TaskStatus::Running {
            edit(&running(), &to_dir)
        } else {
            edit(&card(status), &to_dir)
        };
        assert!(
            matches!(&refused, Err(BoardError::InvalidInput(why)) if why.contains("its run works or worked in its workspace")),
            "{status:?}: {refused:?}"
        );
    }
    for (kind, path, branch) in [
        (WorkspaceKind::Dir, None, None),
        (WorkspaceKind::Dir, Some("relative"), None),
        (WorkspaceKind::Scratch, None, Some("wt/x")),
        (WorkspaceKind::Worktree, Some("/repo"), Some("-bad")),
    ] {
        assert!(
            matches!(
                edit(&card(TaskStatus::Ready), &moved(kind, path, branch)),
                Err(BoardError::InvalidInput(_))
            ),
            "{kind:?} {path:?} {branch:?}"
        );
    }
    let metadata = serde_json::json!({"tests_run": 12});
    let all = CardEdit {
        title: Some("t".into()),
        body: Some("b".into()),
        priority: Some(1),
        assignee: Change::Set("a".into()),
        tenant: Change::Set("team".into()),
        max_retries: Change::Set(2),
        max_runtime_seconds: Change::Set(60),
        result: Some("r".into()),
        summary: Some("s".into()),
        metadata: metadata.as_object().cloned(),
        workspace: Some(kanban_core::rules::WorkspaceEdit::default()),
    };
    assert_eq!(
        all.fields(),
        [
            "title",
            "body",
            "priority",
            "assignee",
            "tenant",
            "max_retries",
            "max_runtime_seconds",
            "result",
            "summary",
            "metadata",
            "workspace"
        ]
    );
}

#[test]
fn only_a_done_card_s_handoff_is_edited() {
    use kanban_core::rules::{CardEdit, edit};
    let metadata = serde_json::json!({"tests_run": 12});
    let handoffs = [
        CardEdit {
            result: Some("shipped".into()),
            ..CardEdit::default()
        },
        CardEdit {
            summary: Some("shipped".into()),
            ..CardEdit::default()
        },
        CardEdit {
            metadata: metadata.as_object().cloned(),
            ..CardEdit::default()
        },
    ];
    for change in &handoffs {
        assert!(change.changes_handoff());
        let t = edit(&card(TaskStatus::Done), change).unwrap();
        assert_eq!(t.edit.as_ref(), Some(change));
        assert_eq!(t.status, None, "it stays done");
        assert_eq!(t.events[0].payload["fields"].as_array().unwrap().len(), 1);
        for status in [TaskStatus::Ready, TaskStatus::Running, TaskStatus::Blocked] {
            match edit(&card(status), change) {
                Err(BoardError::InvalidInput(message)) => {
                    assert!(message.contains("done card"), "{message}");
                }
                other => panic!("{status:?}: {other:?}"),
            }
        }
    }
    let fields = CardEdit {
        title: Some("t".into()),
        ..CardEdit::default()
    };
    assert!(!fields.changes_handoff());
    let huge = serde_json::json!({"notes": "x".repeat(kanban_core::MAX_METADATA_BYTES)});
    let too_big = CardEdit {
        metadata: huge.as_object().cloned(),
        ..CardEdit::default()
    };
    assert!(matches!(
        edit(&card(TaskStatus::Done), &too_big),
        Err(BoardError::InvalidInput(message)) if message.contains("at most")
    ));
    // The bound, to the byte: `{"n":"…"}` is eight bytes and the text.
    let sized = |bytes: usize| {
        let metadata = serde_json::json!({"n": "x".repeat(bytes - 8)});
        metadata.as_object().cloned()
    };
    let limit = kanban_core::MAX_METADATA_BYTES;
    assert_eq!(
        kanban_core::events::check_metadata(sized(limit).as_ref()),
        Ok(())
    );
    assert!(kanban_core::events::check_metadata(sized(limit + 1).as_ref()).is_err());
    let handoff = |metadata| kanban_core::Handoff {
        metadata,
        ..kanban_core::Handoff::new("done", None)
    };
    assert_eq!(
        kanban_core::events::check_handoff(&handoff(sized(limit))),
        Ok(())
    );
    assert!(kanban_core::events::check_handoff(&handoff(sized(limit + 1))).is_err());
}

#[test]
fn a_recurring_card_is_due_at_the_first_period_boundary_after_now() {
    use kanban_core::rules::next_occurrence;
    let table = [
        // (scheduled at, every, now, next due)
        (1000, 60, 1010, 1060),
        (1000, 60, 1059, 1060),
        (1000, 60, 1060, 1120),
        (1000, 60, 1061, 1120),
        (1000, 60, 1000, 1060),
        (1000, 60, 5000, 5020),
        (1000, 60, 900, 1060),
        (1000, 60, -5000, 1060),
        (0, 60, i64::MAX, i64::MAX),
        (1000, 0, 1010, 1011),
        (i64::MAX - 10, 60, i64::MAX - 5, i64::MAX),
    ];
    for (scheduled, every, now, due) in table {
        assert_eq!(
            next_occurrence(scheduled, every, now),
            due,
            "{scheduled} {every} {now}"
        );
    }
}

#[test]
fn only_a_change_that_adds_history_alone_is_a_record() {
    let record = Transition {
        events: vec![rules::NewEvent::new(
            "worker_exited",
            Some(7),
            serde_json::Value::Null,
        )],
        ..Transition::default()
    };
    assert!(record.only_records());
    assert!(Transition::default().only_records());
    // Each change of the card, run, claim or walls alone makes it more.
    let changes = [
        Transition {
            close_run: Some(rules::RunClose {
                status: "done".into(),
                outcome: "completed".into(),
                summary: None,
                error: None,
                metadata: None,
            }),
            ..record.clone()
        },
        Transition {
            release_claim: true,
            ..record.clone()
        },
        Transition {
            status: Some(TaskStatus::Ready),
            ..record.clone()
        },
        Transition {
            consecutive_failures: Some(0),
            ..record.clone()
        },
        Transition {
            last_failure_error: Change::Clear,
            ..record.clone()
        },
        Transition {
            not_before: Change::Clear,
            ..record.clone()
        },
        Transition {
            completion: Some(rules::Completion {
                result: "ok".into(),
                completed_at: NOW,
            }),
            ..record.clone()
        },
        Transition {
            walls: vec![kanban_core::walls::WallChange::Lift {
                scope: "provider:x".into(),
            }],
            ..record.clone()
        },
        Transition {
            held: Change::Clear,
            ..record.clone()
        },
        Transition {
            edit: Some(rules::CardEdit::default()),
            ..record.clone()
        },
    ];
    for change in changes {
        assert!(!change.only_records(), "{change:?}");
    }

    // The exit of a run whose worker settled the card is a record; a crash
    // of a running card is not.
    let settled = rules::book_exit(
        &card(TaskStatus::Done),
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Code(0)),
        NOW,
    );
    assert_eq!(settled.0.kind, BookingKind::Settled);
    assert_eq!(kinds(&settled.1), ["worker_exited"]);
    assert!(settled.1.only_records());
    let crashed = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &report(ExitWitness::Code(3)),
        NOW,
    );
    assert!(!crashed.1.only_records());
}

#[test]
fn lifting_a_wall_frees_a_waiting_card_and_only_records_on_the_others() {
    for status in TaskStatus::ALL {
        let transition = rules::lift_wall(&card(status), "provider-a", Some(7));
        let waiting = matches!(status, TaskStatus::Ready | TaskStatus::Todo);
        let cleared = if waiting { Change::Clear } else { Change::Keep };
        assert_eq!(transition.not_before, cleared, "{status:?}");
        assert_eq!(transition.events.len(), 1);
        assert_eq!(transition.events[0].kind, "wall_lifted");
        assert_eq!(transition.events[0].run_id, Some(7));
        assert_eq!(transition.events[0].payload["scope"], "provider-a");
        assert_eq!(transition.only_records(), !waiting, "{status:?}");
    }
}

#[test]
fn an_exit_the_board_would_not_book_blocks_its_card_with_the_refusal() {
    let unbookable = ExitReport {
        output_tail: String::new(),
        unbookable: Some("storage: refused".into()),
        ..report(ExitWitness::Code(1))
    };
    let (booking, t) = rules::book_exit(
        &running(),
        &claim(),
        &ExitHistory::default(),
        &unbookable,
        NOW,
    );
    assert_eq!(booking.kind, BookingKind::Crashed, "booked as what it was");
    assert_eq!(t.status, Some(TaskStatus::Blocked), "not retried");
    assert_eq!(t.not_before, Change::Clear);
    let Change::Set(error) = &t.last_failure_error else {
        panic!("the card says why: {t:?}");
    };
    assert!(error.contains("storage: refused"), "{error}");
    assert_eq!(
        t.close_run
            .as_ref()
            .and_then(|close| close.error.as_deref()),
        Some(error.as_str()),
        "the run says why too"
    );
    let gave_up = t.events.iter().find(|event| event.kind == "gave_up");
    assert_eq!(
        gave_up.map(|event| (&event.payload["trigger"], event.run_id)),
        Some((&serde_json::json!("unbookable"), Some(7))),
        "{:?}",
        kinds(&t)
    );
    // A card no longer under the claim is left as it is.
    let (_, t) = rules::book_exit(
        &card(TaskStatus::Ready),
        &claim(),
        &ExitHistory::default(),
        &unbookable,
        NOW,
    );
    assert_eq!(t.status, None);
    assert!(!kinds(&t).contains(&"gave_up"), "{:?}", kinds(&t));
}

#[test]
fn linking_a_card_to_another_and_ending_it() {
    let named = |id: &str, status: TaskStatus| CardState {
        task_id: id.into(),
        ..card(status)
    };
    let pairs = |links: &[(&str, &str)]| -> Vec<(String, String)> {
        links
            .iter()
            .map(|(parent, child)| ((*parent).to_owned(), (*child).to_owned()))
            .collect()
    };
    // a → b → c, and d on its own.
    let board = pairs(&[("a", "b"), ("b", "c")]);

    // Where the child lands, by the parent's status and its own.
    for (parent, child, lands) in [
        (TaskStatus::Todo, TaskStatus::Ready, Some(TaskStatus::Todo)),
        (
            TaskStatus::Running,
            TaskStatus::Ready,
            Some(TaskStatus::Todo),
        ),
        (
            TaskStatus::Blocked,
            TaskStatus::Ready,
            Some(TaskStatus::Todo),
        ),
        (TaskStatus::Done, TaskStatus::Ready, None),
        (TaskStatus::Archived, TaskStatus::Ready, None),
        (TaskStatus::Todo, TaskStatus::Todo, None),
        (TaskStatus::Todo, TaskStatus::Running, None),
        (TaskStatus::Todo, TaskStatus::Done, None),
    ] {
        let transition = rules::link(&named("d", parent), &named("c", child), &board)
            .unwrap()
            .expect("a new link");
        assert_eq!(transition.status, lands, "{parent:?} -> {child:?}");
        assert_eq!(kinds(&transition), ["linked"]);
        assert_eq!(
            transition.events[0].payload,
            serde_json::json!({"parent": "d", "child": "c"})
        );
    }
    // A link the board has already changes nothing.
    assert_eq!(
        rules::link(
            &named("a", TaskStatus::Todo),
            &named("b", TaskStatus::Ready),
            &board
        ),
        Ok(None)
    );
    // A card never waits for itself, directly or through others.
    for (parent, child) in [("a", "a"), ("c", "a"), ("b", "a"), ("c", "b")] {
        let refused = rules::link(
            &named(parent, TaskStatus::Todo),
            &named(child, TaskStatus::Todo),
            &board,
        );
        assert!(
            matches!(refused, Err(BoardError::InvalidInput(_))),
            "{parent} -> {child}: {refused:?}"
        );
    }
    assert!(rules::waits_for("c", "a", &board));
    assert!(rules::waits_for("b", "a", &board));
    assert!(!rules::waits_for("a", "c", &board));
    assert!(!rules::waits_for("d", "a", &board));
    // A diamond is no cycle, and a loop already on the board ends the walk.
    let diamond = pairs(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]);
    assert!(rules::waits_for("d", "a", &diamond));
    assert!(
        rules::link(
            &named("b", TaskStatus::Todo),
            &named("c", TaskStatus::Todo),
            &diamond
        )
        .unwrap()
        .is_some()
    );
    let looped = pairs(&[("x", "y"), ("y", "x")]);
    assert!(!rules::waits_for("z", "x", &looped));

    // Ending a wait: a todo child with no open parent left is ready.
    let unlinked = rules::unlinked(&named("c", TaskStatus::Todo), "b", NOW);
    assert_eq!(unlinked.status, Some(TaskStatus::Ready));
    assert_eq!(kinds(&unlinked), ["unlinked", "promoted"]);
    assert_eq!(
        unlinked.events[0].payload,
        serde_json::json!({"parent": "b", "child": "c"})
    );
    let still_waiting = CardState {
        open_parents: true,
        ..named("c", TaskStatus::Todo)
    };
    for child in [still_waiting, named("c", TaskStatus::Blocked)] {
        let unlinked = rules::unlinked(&child, "b", NOW);
        assert_eq!(unlinked.status, None, "{child:?}");
        assert_eq!(kinds(&unlinked), ["unlinked"]);
    }
}

#[test]
fn a_card_done_or_archived_frees_its_children() {
    for status in TaskStatus::ALL {
        let transition = Transition {
            status: Some(status),
            ..Transition::default()
        };
        assert_eq!(
            transition.frees_children(),
            matches!(status, TaskStatus::Done | TaskStatus::Archived),
            "{status:?}"
        );
    }
    assert!(
        !Transition::default().frees_children(),
        "no move, no change"
    );
    let cancelled = rules::cancel(&card(TaskStatus::Ready), "not needed").unwrap();
    assert!(cancelled.frees_children());
}

/// An unclaimed card of `status`, due, nobody's in particular.
fn waiting_candidate(status: TaskStatus, open_parents: bool) -> ClaimCandidate {
    ClaimCandidate {
        task_id: "t_1".into(),
        title: String::new(),
        status: Some(status),
        claimed: false,
        held: false,
        not_before: None,
        assignee: None,
        priority: 0,
        created_at: 0,
        place: 0,
        open_parents,
        goal_mode: false,
        ran_before: false,
    }
}

/// Every move core allows, from every status, in one table: a cell is the
/// status the move lands the card in, `=` when it stays where it is, `-`
/// when the move is refused (for `tick`: nothing to do; for `claim`: passed
/// over). `promote!` promotes a card with an open parent by `--force`;
/// `promote?` tries without; `release` and `tick` are given a held card and
/// one whose time has come.
#[test]
fn every_move_from_every_status() {
    const TABLE: &str = "
        status     unblock promote promote? promote! hold      release schedule  triage review cancel   archive  reclaim tick  claim
        triage     -       ready   -        ready    -         =       -         -      -      archived archived -       -     -
        todo       -       ready   -        ready    scheduled =       scheduled triage review archived archived -       ready -
        scheduled  ready   -       -        -        scheduled ready   -         triage review archived archived -       ready -
        ready      -       -       -        -        scheduled =       scheduled triage review archived archived -       -     claim
        running    -       -       -        -        -         =       scheduled -      -      archived -        ready   -     -
        blocked    ready   ready   -        ready    -         =       scheduled triage review archived archived -       -     -
        review     -       -       -        -        -         =       -         -      -      archived archived -       -     claim
        done       -       -       -        -        -         =       -         -      review -        archived -       -     -
        archived   -       -       -        -        -         =       -         -      -      -        -        -       -     -
    ";
    let landed = |result: Result<Transition, BoardError>| match result {
        Ok(Transition {
            status: Some(status),
            ..
        }) => status.as_str().to_owned(),
        Ok(_) => "=".to_owned(),
        Err(_) => "-".to_owned(),
    };
    let mut lines = TABLE.trim().lines().map(str::split_whitespace);
    let header: Vec<&str> = lines.next().unwrap().collect();
    let mut seen = Vec::new();
    for mut row in lines {
        let status = TaskStatus::parse(row.next().unwrap()).unwrap();
        seen.push(status);
        let at = card(status);
        let open = CardState {
            open_parents: true,
            ..at.clone()
        };
        let held = CardState {
            held: true,
            ..at.clone()
        };
        let due = CardState {
            not_before: Some(NOW),
            claim_lock: None,
            ..at.clone()
        };
        let candidate = waiting_candidate(status, false);
        for (column, expected) in header[1..].iter().zip(row) {
            let got = match *column {
                "unblock" => landed(rules::unblock(&at)),
                "promote" => landed(rules::promote_by_hand(&at, None, false)),
                "promote?" => landed(rules::promote_by_hand(&open, None, false)),
                "promote!" => landed(rules::promote_by_hand(&open, Some("why"), true)),
                "hold" => landed(rules::hold(&at, "why")),
                "release" => landed(rules::release_hold(&held, NOW)),
                "schedule" => landed(rules::schedule(&at, Some("why"), None)),
                "triage" => landed(rules::to_triage(&at, None)),
                "review" => landed(rules::to_review(&at, None)),
                "cancel" => landed(rules::cancel(&at, "why")),
                "archive" => landed(rules::archive(&at)),
                "reclaim" => landed(rules::reclaim(&at, "why", NOW)),
                "tick" => {
                    landed(rules::promote(&due, NOW).ok_or(BoardError::InvalidInput(String::new())))
                }
                "claim" => {
                    match rules::claim_verdict(&candidate, NOW, &ClaimFilter::any(), false) {
                        ClaimVerdict::Claim => "claim".to_owned(),
                        _ => "-".to_owned(),
                    }
                }
                other => panic!("no column {other}"),
            };
            assert_eq!(got, expected, "{column} from {}", status.as_str());
        }
    }
    assert_eq!(seen, TaskStatus::ALL, "one row per status, in order");
}

#[test]
fn parked_and_reviewed_cards_keep_their_own_waits() {
    use rules::{promote, release_hold, schedule, unblock};
    // A parked card whose time is still to come stays parked; held, it
    // waits for its release whatever its time.
    let parked = CardState {
        not_before: Some(NOW + 1),
        ..card(TaskStatus::Scheduled)
    };
    assert_eq!(promote(&parked, NOW), None);
    let landing = promote(
        &CardState {
            not_before: Some(NOW),
            ..parked.clone()
        },
        NOW,
    )
    .unwrap();
    assert_eq!(landing.events[0].kind, "due");
    assert_eq!(landing.events[0].payload["status"], "ready");
    let held = CardState {
        held: true,
        not_before: Some(NOW - 1),
        ..parked.clone()
    };
    assert_eq!(promote(&held, NOW), None);
    assert_eq!(
        promote(&card(TaskStatus::Scheduled), NOW),
        None,
        "no time: it waits for an unblock"
    );
    // Its parents still open, it lands in todo.
    let open_due = CardState {
        open_parents: true,
        not_before: Some(NOW),
        ..card(TaskStatus::Scheduled)
    };
    assert_eq!(
        promote(&open_due, NOW).unwrap().status,
        Some(TaskStatus::Todo)
    );
    // Released before its time: it stays parked; after: in line (todo
    // while a parent is open).
    let on_time = release_hold(
        &CardState {
            held: true,
            not_before: Some(NOW),
            ..card(TaskStatus::Scheduled)
        },
        NOW,
    )
    .unwrap();
    assert_eq!(on_time.status, Some(TaskStatus::Ready), "due this second");
    let early = release_hold(
        &CardState {
            held: true,
            ..parked.clone()
        },
        NOW,
    )
    .unwrap();
    assert_eq!((early.status, early.held), (None, Change::Clear));
    let late = release_hold(
        &CardState {
            held: true,
            open_parents: true,
            ..card(TaskStatus::Scheduled)
        },
        NOW,
    )
    .unwrap();
    assert_eq!(late.status, Some(TaskStatus::Todo));
    // An unblock ends the hold and the wait together.
    let t = unblock(&held).unwrap();
    assert_eq!((t.held, t.not_before), (Change::Clear, Change::Clear));
    assert_eq!(unblock(&parked).unwrap().held, Change::Keep);
    // Schedule: the time is kept, a running card's run closes and its claim
    // is released.
    let t = schedule(
        &card(TaskStatus::Ready),
        Some("after the freeze"),
        Some(NOW + 60),
    )
    .unwrap();
    assert_eq!(t.not_before, Change::Set(NOW + 60));
    assert_eq!(t.events[0].kind, "scheduled");
    assert_eq!(t.events[0].payload["reason"], "after the freeze");
    assert!(!t.release_claim && t.close_run.is_none());
    let t = schedule(&running(), None, None).unwrap();
    assert!(t.release_claim);
    assert_eq!(t.close_run.unwrap().outcome, "scheduled");
    assert_eq!(t.events[0].run_id, Some(7));
    assert_eq!(t.not_before, Change::Clear);
    // Promote by hand: refused with a reason that names the fix.
    let err = rules::promote_by_hand(
        &CardState {
            open_parents: true,
            ..card(TaskStatus::Todo)
        },
        None,
        false,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--force"), "{err}");
    let t = rules::promote_by_hand(&card(TaskStatus::Triage), Some("spec ok"), false).unwrap();
    assert_eq!(t.events[0].kind, "promoted_manual");
    assert_eq!(t.events[0].payload["was"], "triage");
    assert_eq!(t.events[0].payload["forced"], false);
    // A review card is claimed without waiting for its parents again; a
    // ready one waits for them.
    let verdict = |status| {
        rules::claim_verdict(
            &waiting_candidate(status, true),
            NOW,
            &ClaimFilter::any(),
            false,
        )
    };
    assert_eq!(verdict(TaskStatus::Review), ClaimVerdict::Claim);
    assert_eq!(verdict(TaskStatus::Ready), ClaimVerdict::WaitForParents);
    // A move to triage or review ends the card's wait for its time, and
    // says why and from where.
    let due_later = CardState {
        not_before: Some(NOW + 60),
        ..card(TaskStatus::Scheduled)
    };
    for (t, kind) in [
        (
            rules::to_triage(&due_later, Some("unclear")).unwrap(),
            "triaged",
        ),
        (
            rules::to_review(&due_later, Some("unclear")).unwrap(),
            "review",
        ),
    ] {
        assert_eq!(t.not_before, Change::Clear, "{kind}");
        assert_eq!(t.events.len(), 1);
        assert_eq!(t.events[0].kind, kind);
        assert_eq!(t.events[0].run_id, None);
        assert_eq!(
            t.events[0].payload,
            serde_json::json!({"reason": "unclear", "was": "scheduled"})
        );
    }
    // Moves that clear a hold say so; those on a card with none keep it.
    let held_todo = CardState {
        held: true,
        ..card(TaskStatus::Todo)
    };
    assert_eq!(
        rules::to_triage(&held_todo, None).unwrap().held,
        Change::Clear
    );
    assert_eq!(
        rules::to_review(&held_todo, None).unwrap().held,
        Change::Clear
    );
    assert_eq!(rules::archive(&held_todo).unwrap().held, Change::Clear);
    assert_eq!(
        rules::to_triage(&card(TaskStatus::Todo), None)
            .unwrap()
            .held,
        Change::Keep
    );
    assert_eq!(
        rules::to_review(&card(TaskStatus::Todo), None)
            .unwrap()
            .held,
        Change::Keep
    );
    assert_eq!(
        rules::archive(&card(TaskStatus::Todo)).unwrap().held,
        Change::Keep
    );
}

/// The seed system's typed blocks: a dependency waits in todo for the
/// card's parents; any other kind is blocked for a person, until the card
/// is blocked for the same kind twice in a row (unblocked between), when it
/// goes to triage; a completion starts the count again.
#[test]
fn blocks_are_routed_by_their_kind_and_a_loop_goes_to_triage() {
    use kanban_core::BlockKind;
    let blocked_before = |kind: Option<&str>, recurrences| CardState {
        block_kind: kind.map(str::to_owned),
        block_recurrences: recurrences,
        ..running()
    };
    let first = rules::block(
        &running(),
        &claim(),
        "which region?",
        Some(BlockKind::NeedsInput),
    );
    assert_eq!(first.status, Some(TaskStatus::Blocked));
    assert_eq!(first.block_kind, Change::Set("needs_input".into()));
    assert_eq!(first.block_recurrences, Some(1));
    assert_eq!(first.events[0].kind, "blocked");
    assert_eq!(first.events[0].payload["kind"], "needs_input");
    assert_eq!(first.events[0].run_id, Some(7));
    // The same kind again: the loop breaker sends it to triage.
    let again = rules::block(
        &blocked_before(Some("needs_input"), 1),
        &claim(),
        "which region?",
        Some(BlockKind::NeedsInput),
    );
    assert_eq!(again.status, Some(TaskStatus::Triage));
    assert!(again.release_claim && again.close_run.is_some());
    assert_eq!(again.block_recurrences, Some(2));
    assert_eq!(again.events[0].kind, "block_loop_detected");
    assert_eq!(again.events[0].payload["recurrences"], 2);
    assert_eq!(
        again.events[0].payload["limit"],
        rules::BLOCK_RECURRENCE_LIMIT
    );
    // Another kind starts the count again; untyped blocks count alike.
    let other = rules::block(
        &blocked_before(Some("needs_input"), 1),
        &claim(),
        "no access",
        Some(BlockKind::Capability),
    );
    assert_eq!(
        (other.status, other.block_recurrences),
        (Some(TaskStatus::Blocked), Some(1))
    );
    let untyped = rules::block(&blocked_before(None, 1), &claim(), "stuck", None);
    assert_eq!(untyped.status, Some(TaskStatus::Triage));
    assert_eq!(untyped.block_kind, Change::Clear);
    assert_eq!(untyped.events[0].payload["kind"], serde_json::Value::Null);
    let first_untyped = rules::block(&running(), &claim(), "stuck", None);
    assert_eq!(first_untyped.status, Some(TaskStatus::Blocked));
    // A dependency waits for the card's parents, counts nothing.
    let dependency = rules::block(
        &blocked_before(Some("dependency"), 1),
        &claim(),
        "needs t_abc first",
        Some(BlockKind::Dependency),
    );
    assert_eq!(dependency.status, Some(TaskStatus::Todo));
    assert!(dependency.release_claim);
    assert_eq!(dependency.close_run.unwrap().outcome, "blocked");
    assert_eq!(dependency.block_kind, Change::Set("dependency".into()));
    assert_eq!(dependency.block_recurrences, None);
    assert_eq!(dependency.events[0].kind, "dependency_wait");
    assert_eq!(dependency.not_before, Change::Clear);
    // Done: the count starts again, the kind is kept.
    let done = rules::complete(&claim(), &Handoff::new("did it", None), &[], NOW);
    assert_eq!(
        (done.block_recurrences, done.block_kind.clone()),
        (Some(0), Change::Keep)
    );
    assert!(!done.only_records());
    // Each kind by the seed system's name, and back.
    for kind in BlockKind::ALL {
        assert_eq!(BlockKind::parse(kind.as_str()), Some(kind));
    }
    let names: Vec<_> = BlockKind::ALL.iter().map(|kind| kind.as_str()).collect();
    assert_eq!(
        names,
        ["dependency", "needs_input", "capability", "transient"]
    );
    assert_eq!(BlockKind::parse("needs input"), None);
}

/// What a claim passes over: a card claimed, held or of an id no kanban
/// writes, whatever claims it; a card not due yet or of another agent,
/// only for a dispatcher (a claim by hand takes the card it names).
#[test]
fn a_claim_passes_over_what_it_must_not_take() {
    let claim = |card: &ClaimCandidate, filter: &ClaimFilter, by_hand| {
        rules::claim_verdict(card, NOW, filter, by_hand)
    };
    let any = ClaimFilter::any();
    let others = ClaimFilter::only(["someone else".to_owned()]);
    let ready = waiting_candidate(TaskStatus::Ready, false);
    for by_hand in [false, true] {
        assert_eq!(claim(&ready, &any, by_hand), ClaimVerdict::Claim);
        for passed in [
            ClaimCandidate {
                claimed: true,
                ..ready.clone()
            },
            ClaimCandidate {
                held: true,
                ..ready.clone()
            },
            ClaimCandidate {
                task_id: "../x".into(),
                ..ready.clone()
            },
        ] {
            assert_eq!(
                claim(&passed, &any, by_hand),
                ClaimVerdict::Pass,
                "{passed:?}"
            );
        }
    }
    let later = ClaimCandidate {
        not_before: Some(NOW + 1),
        ..ready.clone()
    };
    assert_eq!(claim(&later, &any, false), ClaimVerdict::Pass);
    assert_eq!(claim(&later, &any, true), ClaimVerdict::Claim);
    let due = ClaimCandidate {
        not_before: Some(NOW),
        ..ready.clone()
    };
    assert_eq!(
        claim(&due, &any, false),
        ClaimVerdict::Claim,
        "due this second"
    );
    assert_eq!(claim(&ready, &others, false), ClaimVerdict::Pass);
    assert_eq!(claim(&ready, &others, true), ClaimVerdict::Claim);
}

#[test]
fn a_handoff_vouches_only_for_cards_its_card_made() {
    use kanban_core::rules::{MadeCard, verify_created_cards};
    let made = |id: &str, created_by: Option<&str>, child: bool| MadeCard {
        id: id.into(),
        created_by: created_by.map(Into::into),
        child,
    };
    let found = [
        made("t_child", None, true),
        made("t_by_card", Some("t_lead"), false),
        made("t_by_agent", Some("planner"), false),
        made("t_by_person", Some("alice"), false),
        made("t_nobodys", None, false),
    ];
    let ids = |list: &[&str]| list.iter().map(|id| (*id).to_owned()).collect::<Vec<_>>();
    // Each test of the three makes a card the card's own, once, in order.
    assert_eq!(
        verify_created_cards(
            "t_lead",
            Some("planner"),
            &ids(&["t_by_agent", "t_child", "t_by_card", "t_child"]),
            &found
        )
        .unwrap(),
        ids(&["t_by_agent", "t_child", "t_by_card"])
    );
    assert_eq!(
        verify_created_cards("t_lead", None, &[], &found).unwrap(),
        Vec::<String>::new()
    );
    // Anything else refuses the completion, naming each stranger once.
    for (assignee, claimed, strangers) in [
        (
            Some("planner"),
            vec!["t_child", "t_by_person"],
            "t_by_person",
        ),
        (Some("planner"), vec!["t_gone", "t_gone"], "t_gone"),
        (Some("planner"), vec!["t_nobodys"], "t_nobodys"),
        // With no assignee, a card with no maker is not the card's.
        (
            None,
            vec!["t_nobodys", "t_by_agent"],
            "t_nobodys, t_by_agent",
        ),
    ] {
        match verify_created_cards("t_lead", assignee, &ids(&claimed), &found) {
            Err(BoardError::InvalidInput(message)) => {
                assert!(
                    message.contains(&format!("did not make: {strangers} (")),
                    "{message}"
                );
                assert!(!message.contains("t_child"), "{message}");
            }
            other => panic!("{claimed:?}: {other:?}"),
        }
    }
}

#[test]
fn a_run_fans_out_to_cards_of_its_own() {
    use kanban_core::NewTask;
    use kanban_core::rules::{check_fan_out_target, child_card, fanned_out};
    assert_eq!(check_fan_out_target("t_lead", "t_child", true), Ok(()));
    assert!(matches!(
        check_fan_out_target("t_lead", "t_other", false),
        Err(BoardError::InvalidInput(message)) if message.starts_with("t_other does not wait for t_lead")
    ));
    let run = claim();
    let asked = NewTask {
        title: "part".into(),
        parents: vec!["t_other".into()],
        ..NewTask::default()
    };
    let child = child_card(&run, Some("planner"), Some("acme"), &asked);
    assert_eq!(child.parents, vec![run.task_id.clone(), "t_other".into()]);
    assert_eq!(child.created_by.as_deref(), Some("planner"));
    assert_eq!(
        child.tenant.as_deref(),
        Some("acme"),
        "the run card's tenant"
    );
    assert_eq!(child.title, "part");
    // Named already: once; no assignee: the card itself is the maker; a
    // tenant of its own is kept.
    let own = NewTask {
        tenant: Some("own".into()),
        ..child.clone()
    };
    let again = child_card(&run, None, Some("acme"), &own);
    assert_eq!(again.parents, child.parents);
    assert_eq!(again.created_by.as_deref(), Some(run.task_id.as_str()));
    assert_eq!(again.tenant.as_deref(), Some("own"));
    let event = fanned_out(
        &run,
        "linked",
        serde_json::json!({"parent": "a", "child": "b"}),
    );
    assert_eq!(event.kind, "fanned_out");
    assert_eq!(event.run_id, Some(run.run_id));
    assert_eq!(
        event.payload,
        serde_json::json!({"action": "linked", "parent": "a", "child": "b"})
    );
    // A handoff's metadata rides on the run; its cards on the event.
    let handoff = Handoff {
        metadata: serde_json::json!({"tests_run": 3}).as_object().cloned(),
        ..Handoff::new("did it", None)
    };
    let done = rules::complete(&run, &handoff, &["t_child".into()], NOW);
    let close = done.close_run.unwrap();
    assert_eq!(close.metadata, Some(serde_json::json!({"tests_run": 3})));
    assert_eq!(
        done.events[0].payload,
        serde_json::json!({"summary": "did it", "verified_cards": ["t_child"]})
    );
}
