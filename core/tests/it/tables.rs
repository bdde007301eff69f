//! The rendered tables: snapshot-tested, and equal to docs/policy.md.

use kanban_core::tables::{authority_table, classifier_table, exit_table};

#[test]
fn authority_table_snapshot() {
    insta::assert_snapshot!(authority_table());
}

#[test]
fn exit_table_snapshot() {
    insta::assert_snapshot!(exit_table());
}

#[test]
fn classifier_table_snapshot() {
    insta::assert_snapshot!(classifier_table());
}

#[test]
fn docs_policy_carries_the_same_tables() {
    let policy = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/policy.md"))
        .expect("docs/policy.md exists");
    assert!(
        policy.contains(&authority_table()),
        "docs/policy.md: the authority table is stale; paste `authority_table()` again"
    );
    assert!(
        policy.contains(&exit_table()),
        "docs/policy.md: the exit table is stale; paste `exit_table()` again"
    );
    assert!(
        policy.contains(&classifier_table()),
        "docs/policy.md: the classifier table is stale; paste `classifier_table()` again"
    );
}

#[test]
fn booking_table_rows() {
    use kanban_core::{BookingInput, BookingKind, ExitWitness, SignalReason, book_worker_exit};
    let input = |witness, still_running| BookingInput {
        witness,
        still_running,
        signalled: None,
        violation_streak: 0,
        consecutive_failures: 0,
        failure_limit: 2,
        violation_limit: 3,
    };
    let b = book_worker_exit(input(ExitWitness::Code(0), false));
    assert_eq!(b.kind, BookingKind::Settled);
    let b = book_worker_exit(input(ExitWitness::Code(0), true));
    assert_eq!(
        (b.kind, b.counts_failure, b.blocks),
        (BookingKind::ProtocolViolation, false, false)
    );
    let b = book_worker_exit(BookingInput {
        violation_streak: 2,
        ..input(ExitWitness::Code(0), true)
    });
    assert!(b.blocks, "the third violation in a row blocks");
    let b = book_worker_exit(input(ExitWitness::Code(75), true));
    assert_eq!(
        (b.kind, b.counts_failure, b.blocks, b.cooldown),
        (BookingKind::RateLimited, false, false, true)
    );
    let b = book_worker_exit(input(ExitWitness::Code(78), true));
    assert_eq!((b.kind, b.blocks), (BookingKind::TerminalProvider, true));
    let b = book_worker_exit(input(ExitWitness::Code(130), true));
    assert_eq!(
        (b.kind, b.counts_failure, b.blocks, b.cooldown),
        (BookingKind::Interrupted, false, false, true),
        "130 from elsewhere is an interrupt the card did not cause, respawned after the cooldown"
    );
    let b = book_worker_exit(input(ExitWitness::Code(131), true));
    assert_eq!((b.kind, b.counts_failure), (BookingKind::Crashed, true));
    for witness in [
        ExitWitness::Code(130),
        ExitWitness::Code(1),
        ExitWitness::Signal(9),
        ExitWitness::Unknown,
    ] {
        let b = book_worker_exit(BookingInput {
            signalled: Some(SignalReason::Shutdown),
            ..input(witness, true)
        });
        assert_eq!(
            (b.kind, b.counts_failure, b.blocks),
            (BookingKind::Interrupted, false, false),
            "a worker we stopped for our shutdown is not charged: {witness:?}"
        );
        let b = book_worker_exit(BookingInput {
            signalled: Some(SignalReason::Overrun),
            ..input(witness, true)
        });
        assert_eq!(
            (b.kind, b.counts_failure, b.blocks),
            (BookingKind::TimedOut, true, false),
            "a worker we stopped for overrunning is: {witness:?}"
        );
    }
    for signalled in [
        None,
        Some(SignalReason::Shutdown),
        Some(SignalReason::Overrun),
    ] {
        let b = book_worker_exit(BookingInput {
            signalled,
            ..input(ExitWitness::Code(0), false)
        });
        assert_eq!(b.kind, BookingKind::Settled, "a settled run stays settled");
    }
    let b = book_worker_exit(BookingInput {
        signalled: Some(SignalReason::Shutdown),
        ..input(ExitWitness::Code(75), true)
    });
    assert_eq!(b.kind, BookingKind::RateLimited, "75 keeps its meaning");
    for witness in [
        ExitWitness::Code(1),
        ExitWitness::Signal(9),
        ExitWitness::Unknown,
    ] {
        let b = book_worker_exit(input(witness, true));
        assert_eq!(
            (b.kind, b.counts_failure, b.blocks),
            (BookingKind::Crashed, true, false),
            "{witness:?}"
        );
        let b = book_worker_exit(BookingInput {
            consecutive_failures: 1,
            ..input(witness, true)
        });
        assert!(
            b.blocks,
            "the second crash blocks at the default limit: {witness:?}"
        );
    }
    assert_eq!(
        kanban_core::exit_code_from_trailer(
            "x\n[kanban-worker-exit] rc=1\nmore\n[kanban-worker-exit] rc=75\n"
        ),
        Some(75)
    );
    assert_eq!(kanban_core::exit_code_from_trailer("no trailer"), None);
}

#[test]
fn classifier_rows_and_retry_after() {
    use kanban_core::{
        FailureReason as R, ProviderOutcome, TransportFailure, classify_provider_failure,
        parse_retry_after,
    };
    let status = |status, body| classify_provider_failure(ProviderOutcome::Status { status, body });
    assert_eq!(
        (
            status(429, "slow down").reason,
            status(429, "slow down").retryable
        ),
        (R::RateLimit, true)
    );
    assert_eq!(
        status(429, "You exceeded your current quota").reason,
        R::Billing
    );
    // A plain rate limit that links a billing page is still a rate limit.
    assert_eq!(
        status(
            429,
            "Rate limit reached for requests. See https://platform.openai.com/account/billing for your limits"
        )
        .reason,
        R::RateLimit
    );
    assert_eq!(
        status(429, r#"{"error": {"code": "insufficient_quota"}}"#).reason,
        R::Billing
    );
    assert_eq!(
        (
            status(429, "The server is overloaded").reason,
            status(429, "overloaded").retryable
        ),
        (R::Overloaded, true)
    );
    assert_eq!(status(402, "").reason, R::Billing);
    assert_eq!(status(401, "").reason, R::Auth);
    assert_eq!(status(403, "").reason, R::Auth);
    assert_eq!(
        status(403, "This account's billing is not set up").reason,
        R::Billing
    );
    // LiteLLM's proxy answers an unknown model with a 400.
    let litellm = status(
        400,
        r#"{"error": {"message": "Invalid model name passed in model=gpt-9", "type": "invalid_request_error", "code": "400"}}"#,
    );
    assert_eq!(
        (litellm.reason, litellm.retryable),
        (R::ModelNotFound, false)
    );
    assert_eq!(
        status(400, r#"{"error": {"code": "model_not_found"}}"#).reason,
        R::ModelNotFound
    );
    let generic_404 = status(404, "Not Found");
    assert_eq!(
        (generic_404.reason, generic_404.retryable),
        (R::Unknown, true)
    );
    assert_eq!(
        status(404, "The model `x` does not exist").reason,
        R::ModelNotFound
    );
    assert_eq!(status(408, "").reason, R::Timeout);
    assert_eq!(status(500, "").reason, R::ServerError);
    assert_eq!(status(502, "").reason, R::ServerError);
    assert_eq!(
        (status(504, "").reason, status(504, "").retryable),
        (R::ServerError, true)
    );
    assert_eq!(status(599, "").reason, R::ServerError);
    assert_eq!(status(503, "").reason, R::Overloaded);
    assert_eq!(status(529, "").reason, R::Overloaded);
    assert_eq!(
        status(400, "This model's maximum context length is 8192 tokens").reason,
        R::ContextOverflow
    );
    assert_eq!(
        (
            status(418, "teapot").reason,
            status(418, "teapot").retryable
        ),
        (R::Unknown, false)
    );
    let transport =
        |failure| classify_provider_failure(ProviderOutcome::Transport(&failure)).reason;
    assert_eq!(transport(TransportFailure::StreamCut), R::Timeout);
    assert_eq!(transport(TransportFailure::ConnectionReset), R::Timeout);
    assert_eq!(transport(TransportFailure::Other), R::Timeout);
    assert_eq!(
        transport(TransportFailure::TlsCertificate),
        R::SslCertVerification
    );
    assert_eq!(parse_retry_after(" 30 "), Some(30));
    assert_eq!(parse_retry_after("1.5"), Some(2));
    assert_eq!(parse_retry_after("Wed, 21 Oct 2015"), None);
    assert_eq!(parse_retry_after("-1"), None);
}

#[test]
fn stale_claim_rows_and_heartbeat_interval() {
    use kanban_core::{StaleClaimAction as A, heartbeat_interval_seconds, stale_claim_action};
    assert_eq!(
        stale_claim_action(false, Some(0)),
        A::Release,
        "a dead worker's card is released"
    );
    assert_eq!(
        stale_claim_action(false, Some(10_000)),
        A::Release,
        "however silent"
    );
    assert_eq!(
        stale_claim_action(true, None),
        A::Extend,
        "a silence nobody measured is not one"
    );
    assert_eq!(
        stale_claim_action(true, Some(3_600)),
        A::Extend,
        "an hour is still recent"
    );
    assert_eq!(
        stale_claim_action(true, Some(3_601)),
        A::Terminate,
        "silent for over an hour"
    );
    assert_eq!(stale_claim_action(true, Some(i64::MAX)), A::Terminate);
    assert_eq!(
        heartbeat_interval_seconds(900),
        60,
        "at least once a minute"
    );
    assert_eq!(heartbeat_interval_seconds(90), 30, "a third of the lease");
    assert_eq!(
        heartbeat_interval_seconds(2),
        1,
        "never more often than every second"
    );
    assert_eq!(heartbeat_interval_seconds(-5), 1);
}

#[test]
fn the_wait_a_provider_asks_for_is_read_from_what_it_really_sends() {
    use kanban_core::provider_wait_seconds;
    // 2026-12-02T00:00:00Z
    let now = 1_796_169_600;
    type Row<'a> = (&'a [(&'a str, &'a str)], &'a str, Option<u64>);
    let rows: &[Row<'_>] = &[
        (&[("Retry-After", "30")], "", Some(30)),
        (&[("retry-after", "1.5")], "", Some(2)),
        (
            &[("Retry-After", "Wed, 02 Dec 2026 00:01:40 GMT")],
            "",
            Some(100),
        ),
        (
            &[("Retry-After", "Tue, 01 Dec 2026 23:00:00 GMT")],
            "",
            Some(0),
        ),
        (&[("retry-after-ms", "1500")], "", Some(2)),
        (&[("x-ratelimit-reset-requests", "1s")], "", Some(1)),
        (&[("x-ratelimit-reset-tokens", "6m0s")], "", Some(360)),
        (
            &[("x-ratelimit-reset-requests", "1h2m3.5s")],
            "",
            Some(3724),
        ),
        (&[("x-ratelimit-reset-requests", "250ms")], "", Some(1)),
        (
            &[
                ("x-ratelimit-reset-requests", "2s"),
                ("x-ratelimit-reset-tokens", "17s"),
            ],
            "",
            Some(17),
        ),
        (
            &[("anthropic-ratelimit-requests-reset", "2026-12-02T00:00:45Z")],
            "",
            Some(45),
        ),
        (
            &[
                ("anthropic-ratelimit-tokens-reset", "2026-12-02T00:01:00Z"),
                ("anthropic-ratelimit-requests-reset", "2026-12-02T00:00:10Z"),
            ],
            "",
            Some(60),
        ),
        (
            &[],
            "Rate limit reached. Please try again in 20s.",
            Some(20),
        ),
        (&[], "please try again in 1m30s", Some(90)),
        (&[], "Try again in 2.5 seconds", Some(3)),
        (&[], "try again in 3 minutes", Some(180)),
        (&[], "try again in 4 sec", Some(4)),
        (&[], "try again in 5 min", Some(300)),
        (&[], "try again in 2 hours", Some(7200)),
        (&[], "try again in 1500 milliseconds", Some(2)),
        (&[], "try again in 500 ms", Some(1)),
        (&[], "try again in 3 days", None),
        (&[], "try again in a moment", None),
        (&[("retry-after-ms", "-5")], "", None),
        (&[("retry-after-ms", "NaN")], "", None),
        (
            &[
                (
                    "anthropic-ratelimit-requests-remaining",
                    "2026-12-02T00:05:00Z",
                ),
                ("anthropic-ratelimit-requests-reset", "2026-12-02T00:00:45Z"),
            ],
            "",
            Some(45),
        ),
        (&[], "slow down", None),
        (&[("Retry-After", "soon")], "", None),
        (&[("x-ratelimit-reset-requests", "x1s")], "", None),
        // The standard header wins over the others.
        (
            &[("x-ratelimit-reset-requests", "9s"), ("Retry-After", "4")],
            "try again in 7s",
            Some(4),
        ),
        (&[], "", None),
    ];
    for (headers, body, expected) in rows {
        assert_eq!(
            provider_wait_seconds(headers, body, now),
            *expected,
            "{headers:?} {body:?}"
        );
    }
}
