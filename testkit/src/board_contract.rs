//! The board contract: what every board adapter must do, checked the same way
//! for each. The in-memory board earns its place by passing it too.

use kanban_core::{
    Board, BoardAdmin, BoardError, BookingKind, Claim, DispatchBoard, ExitReport, ExitWitness,
    NewTask, NotLive, ProofIdentity, RunStatus, TaskStatus, WorkerResult,
};

use crate::{VirtualClock, block_on};

const TTL: i64 = 600;

fn task(title: &str) -> NewTask {
    NewTask {
        title: title.to_owned(),
        ..NewTask::default()
    }
}

fn stale_rejections<B: BoardAdmin>(board: &B, task_id: &str) -> usize {
    let view = block_on(board.show_task(task_id)).unwrap();
    view.events
        .iter()
        .filter(|e| e.kind == "stale_write_rejected")
        .count()
}

fn assert_lease_lost(result: Result<impl std::fmt::Debug, BoardError>, what: &str) {
    match result {
        Err(BoardError::LeaseLost { .. }) => {}
        other => panic!("{what}: expected a lease-lost refusal, got {other:?}"),
    }
}

/// Runs the whole contract against boards made by `make`, one fresh board per
/// section, each reading time from the `VirtualClock` it is given.
pub fn run_board_contract<B, F>(make: F)
where
    B: Board + BoardAdmin + DispatchBoard,
    F: Fn(VirtualClock) -> B,
{
    let fresh = || {
        let time = VirtualClock::at(1_000_000);
        (make(time.clone()), time)
    };

    // Creating cards: initial status, parents, idempotency, bad input.
    {
        let (board, _) = fresh();
        let parent = block_on(board.create_task(&task("parent"))).unwrap();
        let child = block_on(board.create_task(&NewTask {
            parents: vec![parent.clone()],
            ..task("child")
        }))
        .unwrap();
        let blocked = block_on(board.create_task(&NewTask {
            start_blocked: true,
            ..task("held")
        }))
        .unwrap();
        let status = |id: &str| block_on(board.show_task(id)).unwrap().task.status;
        assert_eq!(
            status(&parent),
            TaskStatus::Ready,
            "create: no parents → ready"
        );
        assert_eq!(
            status(&child),
            TaskStatus::Todo,
            "create: an open parent → todo"
        );
        assert_eq!(
            status(&blocked),
            TaskStatus::Blocked,
            "create: start blocked"
        );
        let keyed = NewTask {
            idempotency_key: Some("k1".into()),
            ..task("once")
        };
        let first = block_on(board.create_task(&keyed)).unwrap();
        assert_eq!(
            block_on(board.create_task(&keyed)).unwrap(),
            first,
            "create: a repeated idempotency key returns the first id"
        );
        assert!(
            matches!(
                block_on(board.create_task(&task("  "))),
                Err(BoardError::InvalidInput(_))
            ),
            "create: blank title"
        );
        let orphan = NewTask {
            parents: vec!["t_missing".into()],
            ..task("orphan")
        };
        assert!(
            matches!(
                block_on(board.create_task(&orphan)),
                Err(BoardError::TaskNotFound(_))
            ),
            "create: unknown parent"
        );
        assert_eq!(
            block_on(board.list_tasks(None)).unwrap().len(),
            4,
            "create: nothing lost, nothing extra"
        );
        assert_eq!(
            block_on(board.list_tasks(Some(TaskStatus::Todo)))
                .unwrap()
                .len(),
            1
        );
        assert!(matches!(
            block_on(board.show_task("t_missing")),
            Err(BoardError::TaskNotFound(_))
        ));
    }

    // Claiming: the compare-and-set, the run, the event, claim order.
    {
        let (board, time) = fresh();
        let low = block_on(board.create_task(&task("low"))).unwrap();
        time.advance(1);
        let high = block_on(board.create_task(&NewTask {
            priority: 5,
            ..task("high")
        }))
        .unwrap();
        time.advance(1);
        let low_later = block_on(board.create_task(&task("low later"))).unwrap();
        let grant = block_on(board.claim_next(TTL, "host:1"))
            .unwrap()
            .expect("claim_next finds a ready card");
        assert_eq!(grant.claim.task_id, high, "claim_next: priority first");
        assert_eq!(grant.claim_expires, 1_000_002 + TTL);
        let second = block_on(board.claim_next(TTL, "host:2")).unwrap().unwrap();
        assert_eq!(second.claim.task_id, low, "claim_next: then the oldest");
        assert!(second.claim.run_id > grant.claim.run_id, "run ids grow");
        assert_eq!(
            block_on(board.claim_task(&high, TTL, "host:3")).unwrap(),
            None,
            "claim: a held card is not claimed twice"
        );
        let view = block_on(board.show_task(&high)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Running);
        assert_eq!(view.task.current_run_id, Some(grant.claim.run_id));
        assert_eq!(view.task.claim_lock.as_deref(), Some("host:1"));
        assert_eq!(view.runs.len(), 1);
        assert_eq!(view.runs[0].ended_at, None);
        let claimed = view
            .events
            .iter()
            .find(|e| e.kind == "claimed")
            .expect("a claimed event");
        assert_eq!(claimed.payload["lock"], "host:1");
        assert_eq!(claimed.payload["run_id"], grant.claim.run_id);
        assert_eq!(claimed.payload["expires"], grant.claim_expires);
        assert!(
            block_on(board.prove_claim(&grant.claim, ProofIdentity::AnyProcess)).is_ok(),
            "a fresh claim is live"
        );
        let third = block_on(board.claim_next(TTL, "host:3")).unwrap().unwrap();
        assert_eq!(third.claim.task_id, low_later);
        assert_eq!(
            block_on(board.claim_next(TTL, "host:4")).unwrap(),
            None,
            "claim_next: nothing left"
        );
        assert!(matches!(
            block_on(board.claim_task("t_missing", TTL, "x")),
            Err(BoardError::TaskNotFound(_))
        ));
    }

    // Fenced worker writes: heartbeat, comment, complete; stale writers change nothing.
    {
        let (board, time) = fresh();
        let id = block_on(board.create_task(&task("work"))).unwrap();
        let grant = block_on(board.claim_task(&id, TTL, "host:1"))
            .unwrap()
            .unwrap();
        let claim = grant.claim.clone();
        time.advance(100);
        let expires = block_on(board.heartbeat(&claim, Some("still here".into()))).unwrap();
        assert_eq!(
            expires,
            1_000_100 + TTL,
            "heartbeat extends by the claim's ttl"
        );
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(view.task.claim_expires, Some(expires));
        assert_eq!(
            view.runs[0].claim_expires,
            Some(expires),
            "heartbeat mirrors onto the run"
        );
        block_on(board.comment(&claim, "worker", "progress")).unwrap();

        let wrong_lock = Claim {
            claim_lock: "someone-else".into(),
            ..claim.clone()
        };
        assert_lease_lost(
            block_on(board.complete(&wrong_lock, "x", None)),
            "complete with another lock",
        );
        let wrong_run = Claim {
            run_id: claim.run_id + 100,
            ..claim.clone()
        };
        assert_lease_lost(
            block_on(board.heartbeat(&wrong_run, None)),
            "heartbeat with another run",
        );
        assert_eq!(
            stale_rejections(&board, &id),
            2,
            "each refused write leaves a stale_write_rejected event"
        );
        assert_eq!(
            block_on(board.show_task(&id)).unwrap().task.status,
            TaskStatus::Running,
            "refused writes change nothing"
        );

        block_on(board.complete(&claim, "finished", Some("the result".into()))).unwrap();
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Done);
        assert_eq!(
            view.task.current_run_id, None,
            "no open run, no run pointer"
        );
        assert_eq!(view.task.claim_lock, None);
        assert_eq!(view.task.result.as_deref(), Some("the result"));
        assert_eq!(view.runs[0].outcome.as_deref(), Some("completed"));
        assert!(view.runs[0].ended_at.is_some());
        assert_eq!(block_on(board.run_status(&claim)).unwrap(), RunStatus::Done);
        assert_lease_lost(
            block_on(board.complete(&claim, "again", None)),
            "a second complete",
        );
        assert_lease_lost(
            block_on(board.block(&claim, "late")),
            "block after complete",
        );
        assert!(
            block_on(board.prove_claim(&claim, ProofIdentity::AnyProcess)).is_err(),
            "a settled claim is not live"
        );
    }

    // Expiry: an expired lease refuses writes before and after the reclaim.
    {
        let (board, time) = fresh();
        let id = block_on(board.create_task(&task("slow"))).unwrap();
        let other = block_on(board.create_task(&task("fresh"))).unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:1"))
            .unwrap()
            .unwrap()
            .claim;
        time.advance(TTL + 1);
        let fresh_claim = block_on(board.claim_task(&other, TTL, "host:2"))
            .unwrap()
            .unwrap()
            .claim;
        assert!(matches!(
            block_on(board.prove_claim(&claim, ProofIdentity::AnyProcess)),
            Err(NotLive::TaskLeaseExpired { .. })
        ));
        assert_lease_lost(
            block_on(board.heartbeat(&claim, None)),
            "heartbeat after expiry",
        );
        assert_eq!(
            block_on(board.release_stale_claims(2)).unwrap(),
            vec![id.clone()],
            "only the expired claim is released"
        );
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Ready);
        assert_eq!(view.task.current_run_id, None);
        assert_eq!(view.runs[0].outcome.as_deref(), Some("reclaimed"));
        assert!(view.events.iter().any(|e| e.kind == "reclaimed"));
        assert_lease_lost(
            block_on(board.complete(&claim, "zombie", None)),
            "complete after the reclaim",
        );
        assert_eq!(
            block_on(board.show_task(&id)).unwrap().task.status,
            TaskStatus::Ready,
            "the zombie changed nothing"
        );
        assert_eq!(
            block_on(board.run_status(&claim)).unwrap(),
            RunStatus::Superseded
        );
        let again = block_on(board.claim_task(&id, TTL, "host:3"))
            .unwrap()
            .unwrap()
            .claim;
        assert!(again.run_id > fresh_claim.run_id, "run ids only grow");
        assert_lease_lost(
            block_on(board.comment(&claim, "w", "old run")),
            "the old run's token after a new claim",
        );
        assert!(
            block_on(board.prove_claim(&fresh_claim, ProofIdentity::AnyProcess)).is_ok(),
            "the fresh claim is untouched"
        );
    }

    // Stale releases count: a card whose workers keep wedging is blocked at the limit.
    {
        let (board, time) = fresh();
        let id = block_on(board.create_task(&task("wedged"))).unwrap();
        for round in 1..=2 {
            block_on(board.claim_task(&id, TTL, "host:1"))
                .unwrap()
                .unwrap();
            time.advance(TTL + 1);
            assert_eq!(
                block_on(board.release_stale_claims(2)).unwrap(),
                vec![id.clone()]
            );
            let view = block_on(board.show_task(&id)).unwrap();
            assert_eq!(view.task.consecutive_failures, round);
            let expected = if round == 2 {
                TaskStatus::Blocked
            } else {
                TaskStatus::Ready
            };
            assert_eq!(view.task.status, expected, "round {round}");
        }
        assert!(
            block_on(board.show_task(&id))
                .unwrap()
                .events
                .iter()
                .any(|e| e.kind == "gave_up")
        );
    }

    // Operator reclaim: the run closes, the card is ready, the worker is fenced out.
    {
        let (board, _) = fresh();
        let id = block_on(board.create_task(&task("taken back"))).unwrap();
        assert!(
            matches!(
                block_on(board.reclaim(&id, "no")),
                Err(BoardError::InvalidTransition { .. })
            ),
            "reclaim: only running cards"
        );
        let claim = block_on(board.claim_task(&id, TTL, "host:1"))
            .unwrap()
            .unwrap()
            .claim;
        block_on(board.reclaim(&id, "operator")).unwrap();
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Ready);
        assert_eq!(view.runs[0].outcome.as_deref(), Some("reclaimed"));
        assert!(
            view.events
                .iter()
                .any(|e| e.kind == "reclaimed" && e.payload["manual"] == true)
        );
        assert_lease_lost(
            block_on(board.complete(&claim, "late", None)),
            "complete after an operator reclaim",
        );
    }

    // Block, unblock, promote.
    {
        let (board, _) = fresh();
        let parent = block_on(board.create_task(&task("parent"))).unwrap();
        let child = block_on(board.create_task(&NewTask {
            parents: vec![parent.clone()],
            ..task("child")
        }))
        .unwrap();
        assert_eq!(
            block_on(board.promote_ready()).unwrap(),
            0,
            "promote: the parent is not done"
        );
        let claim = block_on(board.claim_task(&parent, TTL, "host:1"))
            .unwrap()
            .unwrap()
            .claim;
        block_on(board.block(&claim, "need input")).unwrap();
        let view = block_on(board.show_task(&parent)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Blocked);
        assert_eq!(view.runs[0].outcome.as_deref(), Some("blocked"));
        assert_eq!(
            block_on(board.run_status(&claim)).unwrap(),
            RunStatus::Blocked
        );
        assert!(
            matches!(
                block_on(board.unblock(&child)),
                Err(BoardError::InvalidTransition { .. })
            ),
            "unblock: only blocked cards"
        );
        block_on(board.unblock(&parent)).unwrap();
        assert_eq!(
            block_on(board.show_task(&parent)).unwrap().task.status,
            TaskStatus::Ready
        );
        let claim = block_on(board.claim_task(&parent, TTL, "host:1"))
            .unwrap()
            .unwrap()
            .claim;
        block_on(board.complete(&claim, "done", None)).unwrap();
        assert_eq!(block_on(board.promote_ready()).unwrap(), 1);
        assert_eq!(
            block_on(board.show_task(&child)).unwrap().task.status,
            TaskStatus::Ready,
            "promote: parents done → ready"
        );
    }

    // The owner seam: bind, the owner-side proof, booking.
    {
        let (board, time) = fresh();
        let id = block_on(board.create_task(&task("owned"))).unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:1"))
            .unwrap()
            .unwrap()
            .claim;
        assert_eq!(
            block_on(board.prove_claim(&claim, ProofIdentity::BoundOwner(42))),
            Err(NotLive::NotBound),
            "owner proof: nobody bound yet"
        );
        block_on(board.bind_worker(&claim, 42)).unwrap();
        assert!(block_on(board.prove_claim(&claim, ProofIdentity::BoundOwner(42))).is_ok());
        assert_eq!(
            block_on(board.prove_claim(&claim, ProofIdentity::BoundOwner(43))),
            Err(NotLive::NotBound)
        );
        block_on(board.bind_worker(&claim, 43)).unwrap();
        assert_eq!(
            block_on(board.prove_claim(&claim, ProofIdentity::BoundOwner(42))),
            Err(NotLive::NotBound),
            "owner proof: the NEWEST worker_bound decides"
        );
        assert_eq!(
            block_on(board.booked_exit_code(&claim)).unwrap(),
            1,
            "nothing booked → 1"
        );
        time.advance(TTL + 5);
        let booked = WorkerResult {
            pid: 43,
            claim_lock: claim.claim_lock.clone(),
            exit_code: 75,
            last_output: "wall".into(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: None,
        };
        block_on(board.book_result(&claim, &booked)).unwrap();
        assert_eq!(
            block_on(board.booked_exit_code(&claim)).unwrap(),
            75,
            "a result is booked even after the lease lapsed"
        );
        let foreign = Claim {
            claim_lock: "other".into(),
            ..claim.clone()
        };
        assert_eq!(
            block_on(board.booked_exit_code(&foreign)).unwrap(),
            1,
            "another lock reads 1"
        );
        assert_lease_lost(
            block_on(board.book_result(&foreign, &booked)),
            "booking for a run we never held",
        );
        assert_lease_lost(
            block_on(board.bind_worker(&claim, 44)),
            "bind on an expired lease",
        );
    }

    // The dispatcher's side: spawn records, bookings from core's table, cooldowns.
    {
        let (board, time) = fresh();
        let report = |witness| ExitReport {
            witness,
            source: "wait",
            signalled_by_dispatcher: false,
            output_tail: "last words".into(),
            default_failure_limit: 2,
            retry_after_seconds: None,
        };
        let id = block_on(board.create_task(&task("dispatched"))).unwrap();
        let claim = block_on(board.claim_next_ready(TTL, "host:d", 300))
            .unwrap()
            .expect("a ready card");
        block_on(board.record_spawn(&claim.claim, 4242, Some(777))).unwrap();
        assert_eq!(block_on(board.count_running()).unwrap(), 1);
        let workers = block_on(board.running_workers()).unwrap();
        assert_eq!(workers.len(), 1);
        assert_eq!(workers[0].worker_pid, Some(4242));
        assert_eq!(
            workers[0].worker_started_at,
            Some(777),
            "the process fingerprint is kept"
        );
        assert_eq!(workers[0].claim, claim.claim);

        // Exit 75: back to ready, not counted, held for the cooldown.
        let booking =
            block_on(board.book_exit(&claim.claim, &report(ExitWitness::Code(75)))).unwrap();
        assert_eq!(booking.kind, BookingKind::RateLimited);
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Ready);
        assert_eq!(view.task.consecutive_failures, 0);
        assert_eq!(view.runs[0].outcome.as_deref(), Some("rate_limited"));
        assert!(
            view.events
                .iter()
                .any(|e| e.kind == "rate_limited" && e.payload["exit_code"] == 75)
        );
        assert_eq!(
            block_on(board.claim_next_ready(TTL, "host:d", 300)).unwrap(),
            None,
            "held during the cooldown"
        );
        time.advance(301);
        let claim = block_on(board.claim_next_ready(TTL, "host:d", 300))
            .unwrap()
            .expect("claimable after the cooldown");

        // Two crashes block at the default limit of 2.
        let booking =
            block_on(board.book_exit(&claim.claim, &report(ExitWitness::Signal(9)))).unwrap();
        assert_eq!(
            (booking.kind, booking.blocks),
            (BookingKind::Crashed, false)
        );
        assert_eq!(
            block_on(board.show_task(&id))
                .unwrap()
                .task
                .consecutive_failures,
            1
        );
        let claim = block_on(board.claim_next_ready(TTL, "host:d", 300))
            .unwrap()
            .unwrap();
        let booking =
            block_on(board.book_exit(&claim.claim, &report(ExitWitness::Unknown))).unwrap();
        assert_eq!((booking.kind, booking.blocks), (BookingKind::Crashed, true));
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Blocked);
        assert!(view.events.iter().any(|e| e.kind == "gave_up"));

        // A second booking of the same exit changes nothing.
        let again = block_on(board.book_exit(&claim.claim, &report(ExitWitness::Unknown))).unwrap();
        assert_eq!(again.kind, BookingKind::Settled);
        assert_eq!(
            block_on(board.show_task(&id))
                .unwrap()
                .task
                .consecutive_failures,
            2
        );

        // Exit 0 without a terminal call: not counted until the third in a row.
        let id = block_on(board.create_task(&task("chatty"))).unwrap();
        for round in 1..=3 {
            let claim = block_on(board.claim_task(&id, TTL, "host:d"))
                .unwrap()
                .unwrap();
            let booking =
                block_on(board.book_exit(&claim.claim, &report(ExitWitness::Code(0)))).unwrap();
            assert_eq!(
                booking.kind,
                BookingKind::ProtocolViolation,
                "round {round}"
            );
            assert_eq!(booking.blocks, round == 3, "round {round}");
        }
        let view = block_on(board.show_task(&id)).unwrap();
        assert_eq!(
            (view.task.status, view.task.consecutive_failures),
            (TaskStatus::Blocked, 0)
        );

        // Exit 78 blocks at once; a booked result is read back by its lock.
        let id = block_on(board.create_task(&task("terminal"))).unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .unwrap()
            .claim;
        assert_eq!(block_on(board.booked_result(&claim)).unwrap(), None);
        let result = WorkerResult {
            pid: 1,
            claim_lock: claim.claim_lock.clone(),
            exit_code: 78,
            last_output: "auth".into(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: None,
        };
        block_on(board.book_result(&claim, &result)).unwrap();
        assert_eq!(block_on(board.booked_result(&claim)).unwrap(), Some(result));
        let booking = block_on(board.book_exit(&claim, &report(ExitWitness::Code(78)))).unwrap();
        assert_eq!(
            (booking.kind, booking.blocks),
            (BookingKind::TerminalProvider, true)
        );

        // A provider's Retry-After holds the card beyond the cooldown.
        let id = block_on(board.create_task(&NewTask {
            priority: 100,
            ..task("retry after")
        }))
        .unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .unwrap()
            .claim;
        let wall = ExitReport {
            retry_after_seconds: Some(1_000),
            ..report(ExitWitness::Code(75))
        };
        block_on(board.book_exit(&claim, &wall)).unwrap();
        assert!(
            block_on(board.show_task(&id)).unwrap().runs[0]
                .hold_until
                .is_some()
        );
        time.advance(301);
        let next = block_on(board.claim_next_ready(TTL, "host:d", 300)).unwrap();
        assert!(
            next.as_ref().is_none_or(|g| g.claim.task_id != id),
            "held past the cooldown by Retry-After"
        );
        if let Some(grant) = next {
            block_on(board.book_exit(&grant.claim, &report(ExitWitness::Code(0)))).unwrap();
        }
        time.advance(700);
        let next = block_on(board.claim_next_ready(TTL, "host:d", 300))
            .unwrap()
            .expect("claimable once the hold ends");
        assert_eq!(next.claim.task_id, id);
        block_on(board.book_exit(&next.claim, &report(ExitWitness::Code(0)))).unwrap();

        // A card's max_retries bounds protocol violations too.
        let id = block_on(board.create_task(&NewTask {
            max_retries: Some(1),
            ..task("strict")
        }))
        .unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .unwrap()
            .claim;
        let booking = block_on(board.book_exit(&claim, &report(ExitWitness::Code(0)))).unwrap();
        assert_eq!(
            (booking.kind, booking.blocks),
            (BookingKind::ProtocolViolation, true)
        );

        // A 130 after a recorded signal is an interruption, whoever books it.
        let id = block_on(board.create_task(&task("signalled"))).unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .unwrap()
            .claim;
        block_on(board.record_signal(&claim, 15)).unwrap();
        let booking = block_on(board.book_exit(&claim, &report(ExitWitness::Code(130)))).unwrap();
        assert_eq!(
            (booking.kind, booking.counts_failure),
            (BookingKind::Interrupted, false)
        );

        // A result booked by an earlier run under the same lock is not this run's.
        let id = block_on(board.create_task(&task("same lock"))).unwrap();
        let first = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .unwrap()
            .claim;
        let early = WorkerResult {
            pid: 1,
            claim_lock: "host:d".into(),
            exit_code: 75,
            last_output: String::new(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: None,
        };
        block_on(board.book_result(&first, &early)).unwrap();
        block_on(board.book_exit(&first, &report(ExitWitness::Code(75)))).unwrap();
        time.advance(301);
        let second = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .expect("the same card again")
            .claim;
        assert_eq!(
            block_on(board.booked_result(&second)).unwrap(),
            None,
            "run-scoped"
        );
        assert_eq!(block_on(board.booked_exit_code(&second)).unwrap(), 1);

        // An expired lease is extended only while it is still expired and ours.
        let id = block_on(board.create_task(&task("slow"))).unwrap();
        let claim = block_on(board.claim_task(&id, TTL, "host:d"))
            .unwrap()
            .unwrap()
            .claim;
        assert!(
            !block_on(board.extend_expired_lease(&claim, 9_999_999, "claim_extended", "pid_alive"))
                .unwrap(),
            "not expired yet"
        );
        time.advance(TTL + 1);
        assert!(
            block_on(board.extend_expired_lease(&claim, 9_999_999, "claim_extended", "pid_alive"))
                .unwrap()
        );
        assert!(
            block_on(board.prove_claim(&claim, ProofIdentity::AnyProcess)).is_ok(),
            "the extended lease is live"
        );
        assert!(
            block_on(board.recent_events(3))
                .unwrap()
                .last()
                .is_some_and(|e| e.kind == "claim_extended")
        );
    }
}
