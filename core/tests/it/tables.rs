//! The rendered tables: snapshot-tested, and equal to docs/policy.md.

use kanban_core::tables::{authority_table, exit_table};

#[test]
fn authority_table_snapshot() {
    insta::assert_snapshot!(authority_table());
}

#[test]
fn exit_table_snapshot() {
    insta::assert_snapshot!(exit_table());
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
}

#[test]
fn booking_table_rows() {
    use kanban_core::{BookingInput, BookingKind, ExitWitness, book_worker_exit};
    let input = |witness, still_running| BookingInput {
        witness,
        still_running,
        signalled_by_dispatcher: false,
        violation_streak: 0,
        consecutive_failures: 0,
        failure_limit: 2,
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
        (b.kind, b.counts_failure),
        (BookingKind::Crashed, true),
        "130 from elsewhere is a crash"
    );
    let b = book_worker_exit(BookingInput {
        signalled_by_dispatcher: true,
        ..input(ExitWitness::Code(130), true)
    });
    assert_eq!(
        (b.kind, b.counts_failure, b.blocks),
        (BookingKind::Interrupted, false, false)
    );
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
