//! The board contract: what every board adapter must do, one named clause
//! each, checked the same way for each engine.
//!
//! [`board_contract_tests!`](crate::board_contract_tests) expands the clauses
//! into one `#[test]` per clause, so one failing clause does not hide the
//! rest:
//!
//! ```text
//! kanban_testkit::board_contract_tests!(|time| make_board(time));
//! ```

use kanban_core::rules::{FailurePolicy, Overrun, Release, Released};
use kanban_core::walls::{WallHit, WallKind};
use kanban_core::{
    Board, BoardAdmin, BoardError, BookingKind, Claim, ClaimFilter, DispatchBoard, ExitCode,
    ExitReport, ExitWitness, NewTask, NotLive, ProofIdentity, RunStatus, SignalReason, TaskStatus,
    WorkerProcess, WorkerResult,
};

use crate::{VirtualClock, block_on};

/// The lease every clause claims with.
pub const TTL: i64 = 600;
/// When every clause's clock starts.
pub const START: i64 = 1_000_000;

/// Expands the board contract into one `#[test]` per clause, each on a
/// fresh board made by `$make`: a closure from a [`VirtualClock`] to a value
/// that dereferences to a board reading that time (a [`crate::TempBoard`],
/// say, which keeps its folder as long as the test runs).
#[macro_export]
macro_rules! board_contract_tests {
    ($make:expr) => {
        $crate::board_contract_tests!(@each $make;
            creating_cards,
            claiming_in_order,
            fenced_worker_writes,
            expired_leases_refuse_writes,
            expired_releases_count_and_block_at_the_limit,
            a_stale_run_its_dispatcher_stopped_at_shutdown_is_not_counted,
            releases_of_claims_never_started_are_not_counted,
            a_grant_tells_a_card_that_ran_before,
            operator_reclaim_fences_the_worker,
            block_unblock_promote,
            links_and_last_runs_are_read_back,
            linking_and_unlinking_cards,
            owner_seam,
            spawn_records,
            exit_75_holds_for_the_cooldown,
            crashes_back_off_then_block_at_the_limit,
            a_second_booking_changes_nothing,
            violations_block_at_the_third,
            exit_78_blocks_and_results_are_read_back,
            retry_after_holds_past_the_cooldown,
            max_retries_bounds_violations,
            stops_are_booked_by_their_reason,
            results_are_run_scoped,
            leases_extend_forward_while_held,
            overrun_settlements_count,
            run_status_follows_the_run,
            batched_claims_and_routing_filters,
            held_and_delayed_cards_wait,
            triage_schedule_promote_and_review,
            a_triage_card_is_specified_once,
            a_triage_card_is_decomposed_whole_and_once,
            typed_blocks_route_and_a_loop_goes_to_triage,
            a_run_fans_out_to_cards_of_its_own_only,
            attachments_and_tenants_are_kept_and_a_run_attaches_only_while_it_owns_its_card,
            gc_deletes_only_the_old_events_of_settled_cards,
            a_handoff_keeps_metadata_and_vouches_only_for_cards_the_run_made,
            a_swarm_is_made_whole_and_once_per_key,
            a_done_card_s_handoff_is_edited_on_its_last_completed_run,
            one_probe_per_wall,
            lifting_a_wall_frees_the_card_that_met_it,
            text_with_nul_is_stored_with_its_stand_in,
            a_lane_page_is_filtered_and_counted,
            each_host_s_dispatcher_report_is_kept_and_its_ticks_add_up,
            a_card_s_workspace_is_edited_before_its_run
        );
    };
    (@each $make:expr; $($clause:ident),* $(,)?) => {
        $(
            #[test]
            fn $clause() {
                let time = $crate::VirtualClock::at($crate::board_contract::START);
                let make = $make;
                let board = make(time.clone());
                $crate::board_contract::$clause(&*board, &time);
            }
        )*
    };
}

fn task(title: &str) -> NewTask {
    NewTask {
        title: title.to_owned(),
        ..NewTask::default()
    }
}

fn create<B: BoardAdmin>(board: &B, new: &NewTask) -> String {
    block_on(board.create_task(new)).expect("create a card")
}

fn claim<B: BoardAdmin>(board: &B, id: &str, lock: &str) -> Claim {
    block_on(board.claim_task(id, TTL, lock))
        .expect("claim")
        .expect("the card is ready")
        .claim
}

fn status<B: BoardAdmin>(board: &B, id: &str) -> TaskStatus {
    let status = block_on(board.show_task(id)).unwrap().task.status;
    status
        .known()
        .unwrap_or_else(|| panic!("{id} has status {status}"))
}

fn last_kind<B: BoardAdmin>(board: &B, id: &str) -> String {
    let view = block_on(board.show_task(id)).unwrap();
    view.events.last().expect("an event").kind.clone()
}

fn failures<B: BoardAdmin>(board: &B, id: &str) -> u32 {
    block_on(board.show_task(id))
        .unwrap()
        .task
        .consecutive_failures
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

/// A dispatcher's report of a worker's exit: seen by `wait`, not signalled, the
/// default policy.
pub fn exit_report(witness: ExitWitness) -> ExitReport {
    ExitReport {
        witness,
        source: "wait",
        signalled: None,
        output_tail: "last words".into(),
        policy: FailurePolicy::default(),
        retry_after_seconds: None,
        wall: None,
        unbookable: None,
    }
}

/// A worker's result for `claim`: one turn, no recovery, exiting `exit_code`.
pub fn worker_result(claim: &Claim, exit_code: ExitCode) -> WorkerResult {
    WorkerResult {
        pid: 1,
        claim_lock: claim.claim_lock.clone(),
        exit_code,
        last_output: String::new(),
        turns: 1,
        recovery_attempts: 0,
        retry_after_seconds: None,
        failure_reason: None,
        provider: None,
        model: None,
    }
}

fn next<B: DispatchBoard>(board: &B) -> Option<Claim> {
    block_on(board.claim_next_ready(TTL, "host:d", &ClaimFilter::any()))
        .expect("claim_next_ready")
        .map(|grant| grant.claim)
}

/// Creating cards: initial status, parents, idempotency, bad input.
pub fn creating_cards<B: BoardAdmin>(board: &B, _: &VirtualClock) {
    let parent = create(board, &task("parent"));
    let child = create(
        board,
        &NewTask {
            parents: vec![parent.clone()],
            ..task("child")
        },
    );
    let held = create(
        board,
        &NewTask {
            start: kanban_core::rules::Start::Blocked,
            ..task("held")
        },
    );
    assert_eq!(
        status(board, &parent),
        TaskStatus::Ready,
        "no parents → ready"
    );
    assert_eq!(
        status(board, &child),
        TaskStatus::Todo,
        "an open parent → todo"
    );
    assert_eq!(status(board, &held), TaskStatus::Blocked, "start blocked");
    let keyed = NewTask {
        idempotency_key: Some("k1".into()),
        ..task("once")
    };
    let first = create(board, &keyed);
    assert_eq!(
        create(board, &keyed),
        first,
        "a repeated idempotency key returns the first id"
    );
    assert!(
        matches!(
            block_on(board.create_task(&task("  "))),
            Err(BoardError::InvalidInput(_))
        ),
        "a blank title is refused"
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
        "an unknown parent is refused"
    );
    assert_eq!(
        block_on(board.list_tasks(None)).unwrap().len(),
        4,
        "nothing lost, nothing extra"
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

/// Claiming: the compare-and-set, the run, the event, claim order.
pub fn claiming_in_order<B: Board + BoardAdmin + DispatchBoard>(board: &B, time: &VirtualClock) {
    let low = create(board, &task("low"));
    time.advance(1);
    let high = create(
        board,
        &NewTask {
            priority: 5,
            ..task("high")
        },
    );
    time.advance(1);
    let low_later = create(board, &task("low later"));
    let grant = block_on(board.claim_next_ready(TTL, "host:1", &ClaimFilter::any()))
        .unwrap()
        .expect("a ready card");
    assert_eq!(grant.claim.task_id, high, "priority first");
    assert_eq!(grant.claim_expires, START + 2 + TTL);
    let second = block_on(board.claim_next_ready(TTL, "host:2", &ClaimFilter::any()))
        .unwrap()
        .unwrap();
    assert_eq!(second.claim.task_id, low, "then the oldest");
    assert!(second.claim.run_id > grant.claim.run_id, "run ids grow");
    assert_eq!(
        block_on(board.claim_task(&high, TTL, "host:3")).unwrap(),
        None,
        "a held card is not claimed twice"
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
    let third = block_on(board.claim_next_ready(TTL, "host:3", &ClaimFilter::any()))
        .unwrap()
        .unwrap();
    assert_eq!(third.claim.task_id, low_later);
    assert_eq!(
        block_on(board.claim_next_ready(TTL, "host:4", &ClaimFilter::any())).unwrap(),
        None,
        "nothing left"
    );
    assert!(matches!(
        block_on(board.claim_task("t_missing", TTL, "x")),
        Err(BoardError::TaskNotFound(_))
    ));
}

/// Fenced worker writes: heartbeat, comment, complete; stale writers change nothing.
pub fn fenced_worker_writes<B: Board + BoardAdmin>(board: &B, time: &VirtualClock) {
    let id = create(board, &task("work"));
    let claim = claim(board, &id, "host:1");
    time.advance(100);
    let expires = block_on(board.heartbeat(&claim, Some("still here".into()))).unwrap();
    assert_eq!(
        expires,
        START + 100 + TTL,
        "heartbeat extends by the claim's ttl"
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.claim_expires, Some(expires));
    assert_eq!(view.task.last_heartbeat_at, Some(START + 100));
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
        stale_rejections(board, &id),
        2,
        "each refused write leaves a stale_write_rejected event"
    );
    assert_eq!(
        status(board, &id),
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
        block_on(board.block(&claim, "late", None)),
        "block after complete",
    );
    assert!(
        block_on(board.prove_claim(&claim, ProofIdentity::AnyProcess)).is_err(),
        "a settled claim is not live"
    );
}

/// Expiry: an expired lease refuses writes before and after its release.
pub fn expired_leases_refuse_writes<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("slow"));
    let other = create(board, &task("fresh"));
    let stale = claim(board, &id, "host:1");
    time.advance(TTL);
    assert!(
        block_on(board.prove_claim(&stale, ProofIdentity::AnyProcess)).is_ok(),
        "a lease that expires exactly now is still live"
    );
    time.advance(1);
    let fresh_claim = claim(board, &other, "host:2");
    assert!(matches!(
        block_on(board.prove_claim(&stale, ProofIdentity::AnyProcess)),
        Err(NotLive::TaskLeaseExpired { .. })
    ));
    assert_lease_lost(
        block_on(board.heartbeat(&stale, None)),
        "heartbeat after expiry",
    );
    assert_eq!(
        block_on(board.release_claim(&fresh_claim, &Release::Expired, &FailurePolicy::default()))
            .unwrap(),
        Released::NotHeld,
        "a live lease is not released as expired"
    );
    assert_eq!(
        block_on(board.release_claim(&stale, &Release::Expired, &FailurePolicy::default()))
            .unwrap(),
        Released::Counted
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.current_run_id, None);
    assert_eq!(view.runs[0].outcome.as_deref(), Some("reclaimed"));
    assert!(view.events.iter().any(|e| e.kind == "reclaimed"));
    assert_lease_lost(
        block_on(board.complete(&stale, "zombie", None)),
        "complete after the release",
    );
    assert_eq!(
        status(board, &id),
        TaskStatus::Ready,
        "the zombie changed nothing"
    );
    assert_eq!(
        block_on(board.run_status(&stale)).unwrap(),
        RunStatus::Superseded
    );
    assert_eq!(
        block_on(board.release_claim(&stale, &Release::Expired, &FailurePolicy::default()))
            .unwrap(),
        Released::NotHeld,
        "a release is applied once"
    );
    time.advance(3600);
    let again = claim(board, &id, "host:3");
    assert!(again.run_id > fresh_claim.run_id, "run ids only grow");
    assert_lease_lost(
        block_on(board.comment(&stale, "w", "old run")),
        "the old run's token after a new claim",
    );
}

/// Expired releases count: a card whose workers keep wedging is blocked at the limit.
pub fn expired_releases_count_and_block_at_the_limit<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("wedged"));
    for round in 1..=2 {
        let stale = claim(board, &id, "host:1");
        time.advance(TTL + 1);
        assert_eq!(
            block_on(board.release_claim(&stale, &Release::Expired, &FailurePolicy::default()))
                .unwrap(),
            Released::Counted
        );
        assert_eq!(failures(board, &id), round);
        let expected = if round == 2 {
            TaskStatus::Blocked
        } else {
            TaskStatus::Ready
        };
        assert_eq!(status(board, &id), expected, "round {round}");
        time.advance(3600);
    }
    let view = block_on(board.show_task(&id)).unwrap();
    let gave_up = view
        .events
        .iter()
        .find(|e| e.kind == "gave_up")
        .expect("a gave_up event");
    assert_eq!(gave_up.payload["effective_limit"], 2);
}

/// A worker its dispatcher stopped as it shut down, whose exit that
/// dispatcher never booked (it died, or stalled), is released as stale by
/// another without a failure counted: its run was cut short by its
/// environment. Any other signal leaves the release counted.
pub fn a_stale_run_its_dispatcher_stopped_at_shutdown_is_not_counted<
    B: Board + BoardAdmin + DispatchBoard,
>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("stopped"));
    let stopped = claim(board, &id, "host:1");
    block_on(board.record_signal(&stopped, 15, SignalReason::Shutdown)).unwrap();
    time.advance(TTL + 1);
    assert_eq!(
        block_on(board.release_claim(&stopped, &Release::Expired, &FailurePolicy::default()))
            .unwrap(),
        Released::Uncounted
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.consecutive_failures, 0, "not counted");
    assert_eq!(view.runs[0].outcome.as_deref(), Some("reclaimed"));
    let reclaimed = view.events.iter().find(|e| e.kind == "reclaimed").unwrap();
    assert_eq!(reclaimed.payload["counted"], false);
    assert_eq!(reclaimed.payload["signalled"], "shutdown");

    // Stopped for overrunning: the run's own doing, counted.
    time.advance(3600);
    let overran = claim(board, &id, "host:2");
    block_on(board.record_signal(&overran, 15, SignalReason::Overrun)).unwrap();
    time.advance(TTL + 1);
    assert_eq!(
        block_on(board.release_claim(&overran, &Release::Expired, &FailurePolicy::default()))
            .unwrap(),
        Released::Counted
    );
    assert_eq!(failures(board, &id), 1);
}

/// A claim whose worker never ran goes back without a failure counted.
pub fn releases_of_claims_never_started_are_not_counted<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let id = create(board, &task("unlucky"));
    let held = claim(board, &id, "host:1");
    let release = Release::NotStarted {
        reason: "the agent is missing".into(),
    };
    assert_eq!(
        block_on(board.release_claim(&held, &release, &FailurePolicy::default())).unwrap(),
        Released::Uncounted
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.consecutive_failures, 0, "not counted");
    assert_eq!(view.task.not_before, None, "not held back either");
    assert_eq!(view.runs[0].outcome.as_deref(), Some("released"));
    assert!(
        view.events
            .iter()
            .any(|e| e.kind == "released" && e.payload["counted"] == false)
    );
    assert_eq!(
        next(board).map(|c| c.task_id),
        Some(id),
        "claimable again at once"
    );
}

/// A grant says whether the card ran before: only then does the dispatcher
/// look for an earlier run's leftover processes. Another card's runs do not
/// count.
pub fn a_grant_tells_a_card_that_ran_before<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let bystander = create(board, &task("ran first"));
    let id = create(board, &task("runs twice"));
    claim(board, &bystander, "host:0");
    let grant = |lock: &str| {
        block_on(board.claim_task(&id, TTL, lock))
            .expect("claim")
            .expect("the card is ready")
    };
    let first = grant("host:1");
    assert!(!first.rerun, "the card's first run");
    let release = Release::NotStarted {
        reason: "the agent is missing".into(),
    };
    assert_eq!(
        block_on(board.release_claim(&first.claim, &release, &FailurePolicy::default())).unwrap(),
        Released::Uncounted
    );
    assert!(grant("host:2").rerun, "the card ran before");
}

/// Operator reclaim: the run closes, the card is ready, the worker is fenced out.
pub fn operator_reclaim_fences_the_worker<B: Board + BoardAdmin>(board: &B, _: &VirtualClock) {
    let id = create(board, &task("taken back"));
    assert!(
        matches!(
            block_on(board.reclaim(&id, "no")),
            Err(BoardError::InvalidTransition { .. })
        ),
        "only running cards"
    );
    let held = claim(board, &id, "host:1");
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
        block_on(board.complete(&held, "late", None)),
        "complete after an operator reclaim",
    );
}

/// Block, unblock, promote.
/// The links of the board and the newest run of each card are read back
/// in one read each (`ls` shows them); a grant carries its card's title.
pub fn links_and_last_runs_are_read_back<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let first = create(board, &task("first parent"));
    let second = create(board, &task("second parent"));
    let child = create(
        board,
        &NewTask {
            parents: vec![second.clone(), first.clone()],
            ..task("child")
        },
    );
    let mut expected = vec![
        (first.clone(), child.clone()),
        (second.clone(), child.clone()),
    ];
    expected.sort();
    assert_eq!(block_on(board.links()).unwrap(), expected);
    assert!(
        block_on(board.last_runs()).unwrap().is_empty(),
        "nothing ran"
    );
    let grant = block_on(board.claim_task(&first, TTL, "host:1"))
        .unwrap()
        .expect("a ready card is claimed");
    assert_eq!(grant.title, "first parent");
    block_on(board.complete(&grant.claim, "done", None)).unwrap();
    let again = claim(board, &second, "host:1");
    block_on(board.block(&again, "need input", None)).unwrap();
    block_on(board.unblock(&second)).unwrap();
    let last = claim(board, &second, "host:1");
    let runs = block_on(board.last_runs()).unwrap();
    assert_eq!(
        runs,
        [(first, grant.claim.run_id), (second, last.run_id)].into(),
        "the newest run of each card that ran"
    );
    assert!(last.run_id > again.run_id);
}

/// `link` makes a card wait for another (a ready child of an open parent
/// goes back to `todo`), refuses a cycle, and `unlink` ends the wait (a
/// `todo` child with no open parent left is ready at once).
pub fn linking_and_unlinking_cards<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let parent = create(board, &task("parent"));
    let child = create(board, &task("child"));
    assert_eq!(status(board, &child), TaskStatus::Ready);
    assert!(block_on(board.link(&parent, &child)).unwrap());
    assert_eq!(
        status(board, &child),
        TaskStatus::Todo,
        "the parent is open"
    );
    assert!(
        !block_on(board.link(&parent, &child)).unwrap(),
        "linked already"
    );
    let view = block_on(board.show_task(&parent)).unwrap();
    assert_eq!(view.children, vec![child.clone()]);
    assert_eq!(
        block_on(board.show_task(&child)).unwrap().parents,
        vec![parent.clone()]
    );
    assert!(matches!(
        block_on(board.link(&child, &parent)),
        Err(BoardError::InvalidInput(_))
    ));
    assert!(matches!(
        block_on(board.link(&child, &child)),
        Err(BoardError::InvalidInput(_))
    ));
    assert!(matches!(
        block_on(board.link(&parent, "t_missing")),
        Err(BoardError::TaskNotFound(_))
    ));
    assert_eq!(
        block_on(board.links()).unwrap().len(),
        1,
        "nothing refused was made"
    );
    assert!(block_on(board.unlink(&parent, &child)).unwrap());
    assert_eq!(
        status(board, &child),
        TaskStatus::Ready,
        "no open parent left"
    );
    assert!(
        !block_on(board.unlink(&parent, &child)).unwrap(),
        "no such link"
    );
    let kinds: Vec<String> = block_on(board.show_task(&child))
        .unwrap()
        .events
        .into_iter()
        .map(|event| event.kind)
        .collect();
    assert_eq!(kinds, ["created", "linked", "unlinked", "promoted"]);
    // A done parent holds nothing back.
    let held = claim(board, &parent, "host:1");
    block_on(board.complete(&held, "done", None)).unwrap();
    assert!(block_on(board.link(&parent, &child)).unwrap());
    assert_eq!(status(board, &child), TaskStatus::Ready);
}

pub fn block_unblock_promote<B: Board + BoardAdmin + DispatchBoard>(board: &B, _: &VirtualClock) {
    let parent = create(board, &task("parent"));
    let child = create(
        board,
        &NewTask {
            parents: vec![parent.clone()],
            ..task("child")
        },
    );
    assert_eq!(
        block_on(board.promote_ready()).unwrap(),
        0,
        "the parent is not done"
    );
    let held = claim(board, &parent, "host:1");
    block_on(board.block(&held, "need input", None)).unwrap();
    let view = block_on(board.show_task(&parent)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Blocked);
    assert_eq!(view.runs[0].outcome.as_deref(), Some("blocked"));
    assert_eq!(
        block_on(board.run_status(&held)).unwrap(),
        RunStatus::Blocked
    );
    assert!(
        matches!(
            block_on(board.unblock(&child)),
            Err(BoardError::InvalidTransition { .. })
        ),
        "only blocked cards"
    );
    block_on(board.unblock(&parent)).unwrap();
    assert_eq!(status(board, &parent), TaskStatus::Ready);
    let held = claim(board, &parent, "host:1");
    block_on(board.complete(&held, "done", None)).unwrap();
    assert_eq!(
        status(board, &child),
        TaskStatus::Ready,
        "parents done → ready, in the parent's completion"
    );
    assert_eq!(block_on(board.promote_ready()).unwrap(), 0, "nothing left");

    // A child of two parents waits for both; the other's cancel frees it.
    let first = create(board, &task("first"));
    let second = create(board, &task("second"));
    let both = create(
        board,
        &NewTask {
            parents: vec![first.clone(), second.clone()],
            ..task("both")
        },
    );
    let held = claim(board, &first, "host:1");
    block_on(board.complete(&held, "done", None)).unwrap();
    assert_eq!(status(board, &both), TaskStatus::Todo, "one parent is open");
    block_on(board.cancel(&second, "not needed")).unwrap();
    assert_eq!(status(board, &both), TaskStatus::Ready);
}

/// The owner seam: bind, the owner-side proof, booking a result.
pub fn owner_seam<B: Board + BoardAdmin>(board: &B, time: &VirtualClock) {
    let id = create(board, &task("owned"));
    let held = claim(board, &id, "host:1");
    assert_eq!(
        block_on(board.prove_claim(&held, ProofIdentity::BoundOwner(42))),
        Err(NotLive::NotBound),
        "nobody bound yet"
    );
    block_on(board.bind_worker(&held, 42)).unwrap();
    assert!(block_on(board.prove_claim(&held, ProofIdentity::BoundOwner(42))).is_ok());
    assert_eq!(
        block_on(board.prove_claim(&held, ProofIdentity::BoundOwner(43))),
        Err(NotLive::NotBound)
    );
    block_on(board.bind_worker(&held, 43)).unwrap();
    assert_eq!(
        block_on(board.prove_claim(&held, ProofIdentity::BoundOwner(42))),
        Err(NotLive::NotBound),
        "the NEWEST worker_bound decides"
    );
    assert_eq!(
        block_on(board.booked_exit_code(&held)).unwrap(),
        1,
        "nothing booked → 1"
    );
    time.advance(TTL + 5);
    let booked = WorkerResult {
        pid: 43,
        exit_code: ExitCode::TempFail,
        last_output: "wall".into(),
        ..worker_result(&held, ExitCode::TempFail)
    };
    block_on(board.book_result(&held, &booked)).unwrap();
    assert_eq!(
        block_on(board.booked_exit_code(&held)).unwrap(),
        75,
        "a result is booked even after the lease lapsed"
    );
    let foreign = Claim {
        claim_lock: "other".into(),
        ..held.clone()
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
        block_on(board.bind_worker(&held, 44)),
        "bind on an expired lease",
    );
}

/// Spawn records: the pid and its fingerprint land on the card and its run.
pub fn spawn_records<B: BoardAdmin + DispatchBoard>(board: &B, _: &VirtualClock) {
    let id = create(board, &task("dispatched"));
    let held = next(board).expect("a ready card");
    assert_eq!(held.task_id, id);
    let process = WorkerProcess {
        pid: 4242,
        started_at: Some(777),
        seal_digest: Some("d1g3st".into()),
    };
    block_on(board.record_spawn(&held, &process)).unwrap();
    let workers = block_on(board.running_workers()).unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].claim, held);
    assert_eq!(workers[0].worker_pid, Some(4242));
    assert_eq!(
        workers[0].worker_started_at,
        Some(777),
        "the process fingerprint is kept"
    );
    assert_eq!(workers[0].run_started_at, START);
    assert_eq!(workers[0].seal_digest.as_deref(), Some("d1g3st"));
    let moved = Claim {
        run_id: held.run_id + 1,
        ..held.clone()
    };
    assert_lease_lost(
        block_on(board.record_spawn(&moved, &process)),
        "a spawn record for another run",
    );
}

/// Exit 75: back to ready, not counted, held for the cooldown.
pub fn exit_75_holds_for_the_cooldown<B: BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("walled"));
    let held = next(board).unwrap();
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(75)))).unwrap();
    assert_eq!(booking.kind, BookingKind::RateLimited);
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.consecutive_failures, 0);
    assert_eq!(view.task.not_before, Some(START + 300));
    assert_eq!(view.runs[0].outcome.as_deref(), Some("rate_limited"));
    assert!(
        view.events
            .iter()
            .any(|e| e.kind == "rate_limited" && e.payload["exit_code"] == 75)
    );
    time.advance(299);
    assert_eq!(next(board), None, "held during the cooldown");
    time.advance(1);
    assert_eq!(
        next(board).map(|c| c.task_id),
        Some(id),
        "claimable when the cooldown ends"
    );
}

/// Crashes are counted, back off, and block at the default limit of 2.
pub fn crashes_back_off_then_block_at_the_limit<B: BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("crashy"));
    let held = next(board).unwrap();
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Signal(9)))).unwrap();
    assert_eq!(
        (booking.kind, booking.blocks),
        (BookingKind::Crashed, false)
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.consecutive_failures, 1);
    let retry_at = view.task.not_before.expect("a crashed card backs off");
    assert!(
        (START + 30..=START + 38).contains(&retry_at),
        "the first backoff is 30 s plus up to a quarter: {retry_at}"
    );
    assert_eq!(next(board), None, "held during the backoff");
    time.set(retry_at);
    let held = next(board).expect("claimable once the backoff ends");
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Unknown))).unwrap();
    assert_eq!((booking.kind, booking.blocks), (BookingKind::Crashed, true));
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Blocked);
    assert_eq!(
        view.task.not_before, None,
        "a blocked card waits for a human"
    );
    assert!(view.events.iter().any(|e| e.kind == "gave_up"));
}

/// A second booking of the same exit records it and changes nothing.
pub fn a_second_booking_changes_nothing<B: BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let id = create(board, &task("twice"));
    let held = next(board).unwrap();
    block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(1)))).unwrap();
    let before = block_on(board.show_task(&id)).unwrap().task;
    let again = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(1)))).unwrap();
    assert_eq!(again.kind, BookingKind::Settled);
    assert_eq!(block_on(board.show_task(&id)).unwrap().task, before);
}

/// Exit 0 without a terminal call: not counted until the third in a row.
pub fn violations_block_at_the_third<B: BoardAdmin + DispatchBoard>(board: &B, _: &VirtualClock) {
    let id = create(board, &task("chatty"));
    for round in 1..=3 {
        let held = claim(board, &id, "host:d");
        let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(0)))).unwrap();
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
        (TaskStatus::Blocked.into(), 0)
    );
}

/// Exit 78 blocks at once; a booked result is read back by its lock.
pub fn exit_78_blocks_and_results_are_read_back<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let id = create(board, &task("terminal"));
    let held = claim(board, &id, "host:d");
    assert_eq!(block_on(board.booked_result(&held)).unwrap(), None);
    let booked = worker_result(&held, ExitCode::ConfigFail);
    block_on(board.book_result(&held, &booked)).unwrap();
    assert_eq!(block_on(board.booked_result(&held)).unwrap(), Some(booked));
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(78)))).unwrap();
    assert_eq!(
        (booking.kind, booking.blocks),
        (BookingKind::TerminalProvider, true)
    );
    assert_eq!(status(board, &id), TaskStatus::Blocked);
    assert_eq!(failures(board, &id), 1);
}

/// A provider's Retry-After holds the card beyond the cooldown.
pub fn retry_after_holds_past_the_cooldown<B: BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("retry after"));
    let held = claim(board, &id, "host:d");
    let wall = ExitReport {
        retry_after_seconds: Some(1_000),
        ..exit_report(ExitWitness::Code(75))
    };
    block_on(board.book_exit(&held, &wall)).unwrap();
    assert_eq!(
        block_on(board.show_task(&id)).unwrap().task.not_before,
        Some(START + 1_000)
    );
    time.advance(301);
    assert_eq!(next(board), None, "held past the cooldown by Retry-After");
    time.advance(700);
    assert_eq!(
        next(board).map(|c| c.task_id),
        Some(id),
        "claimable once the hold ends"
    );
}

/// A card's max_retries bounds protocol violations too.
pub fn max_retries_bounds_violations<B: BoardAdmin + DispatchBoard>(board: &B, _: &VirtualClock) {
    let id = create(
        board,
        &NewTask {
            max_retries: Some(1),
            ..task("strict")
        },
    );
    let held = claim(board, &id, "host:d");
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(0)))).unwrap();
    assert_eq!(
        (booking.kind, booking.blocks),
        (BookingKind::ProtocolViolation, true)
    );
}

/// A stop's recorded reason decides its booking, whoever books it: a
/// shutdown is not the card's fault, an overrun is; an interrupt nobody
/// recorded is not counted either.
pub fn stops_are_booked_by_their_reason<B: BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let id = create(board, &task("shut down"));
    let held = claim(board, &id, "host:d");
    block_on(board.record_signal(&held, 15, SignalReason::Shutdown)).unwrap();
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(130)))).unwrap();
    assert_eq!(
        (booking.kind, booking.counts_failure),
        (BookingKind::Interrupted, false)
    );
    assert_eq!(failures(board, &id), 0);
    let id = create(board, &task("killed at shutdown"));
    let held = claim(board, &id, "host:d");
    block_on(board.record_signal(&held, 15, SignalReason::Shutdown)).unwrap();
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Signal(9)))).unwrap();
    assert_eq!(booking.kind, BookingKind::Interrupted, "a SIGKILL we sent");
    let id = create(board, &task("wedged"));
    let held = claim(board, &id, "host:d");
    block_on(board.record_signal(&held, 15, SignalReason::Overrun)).unwrap();
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(130)))).unwrap();
    assert_eq!(
        (booking.kind, booking.counts_failure),
        (BookingKind::TimedOut, true)
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.runs[0].outcome.as_deref(), Some("timed_out"));
    assert_eq!(view.task.consecutive_failures, 1);
    let id = create(board, &task("unasked"));
    let held = claim(board, &id, "host:d");
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Code(130)))).unwrap();
    assert_eq!(
        (booking.kind, booking.counts_failure, booking.cooldown),
        (BookingKind::Interrupted, false, true),
        "a 130 we did not ask for (an operator, a host shutdown) is not the card's: uncounted, after the cooldown"
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.consecutive_failures, 0);
    assert!(
        view.task.not_before.is_some(),
        "the respawn waits: an agent that interrupts its own worker cannot loop hot"
    );
    let id = create(board, &task("killed by somebody"));
    let held = claim(board, &id, "host:d");
    let booking = block_on(board.book_exit(&held, &exit_report(ExitWitness::Signal(9)))).unwrap();
    assert_eq!(
        (booking.kind, booking.counts_failure),
        (BookingKind::Crashed, true),
        "a worker killed outright by a signal we did not send crashed"
    );
}

/// A result booked by an earlier run under the same lock is not this run's.
pub fn results_are_run_scoped<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("same lock"));
    let first = claim(board, &id, "host:d");
    block_on(board.book_result(&first, &worker_result(&first, ExitCode::TempFail))).unwrap();
    block_on(board.book_exit(&first, &exit_report(ExitWitness::Code(75)))).unwrap();
    time.advance(301);
    let second = claim(board, &id, "host:d");
    assert_eq!(
        block_on(board.booked_result(&second)).unwrap(),
        None,
        "run-scoped"
    );
    assert_eq!(block_on(board.booked_exit_code(&second)).unwrap(), 1);
}

/// A lease moves only forward, only while its claim holds the card, and
/// only a recorded extension leaves an event.
pub fn leases_extend_forward_while_held<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let id = create(board, &task("slow"));
    let held = claim(board, &id, "host:d");
    let events = |board: &B| block_on(board.show_task(&id)).unwrap().events.len();
    let before = events(board);
    assert!(
        block_on(board.extend_lease(&held, START + TTL + 60, None)).unwrap(),
        "a live lease is renewed"
    );
    assert_eq!(events(board), before, "a renewal is not an event");
    assert!(
        block_on(board.extend_lease(&held, START + 10, None)).unwrap(),
        "still held"
    );
    assert_eq!(
        block_on(board.show_task(&id)).unwrap().task.claim_expires,
        Some(START + TTL + 60),
        "never moved back"
    );
    time.advance(TTL + 61);
    let other = Claim {
        claim_lock: "host:other".into(),
        ..held.clone()
    };
    assert!(
        !block_on(board.extend_lease(&other, 9_999_999, Some(("claim_extended", "pid_alive"))))
            .unwrap(),
        "not ours"
    );
    assert!(
        block_on(board.extend_lease(&held, 9_999_999, Some(("claim_extended", "pid_alive"))))
            .unwrap(),
        "a lapsed lease of a card still held is revived"
    );
    assert!(
        block_on(board.prove_claim(&held, ProofIdentity::AnyProcess)).is_ok(),
        "the extended lease is live"
    );
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(
        view.runs[0].claim_expires,
        Some(9_999_999),
        "mirrored on the run"
    );
    assert!(
        view.events
            .last()
            .is_some_and(|e| e.kind == "claim_extended"),
        "a recorded extension is an event"
    );
    block_on(board.reclaim(&id, "x")).unwrap();
    assert!(
        !block_on(board.extend_lease(&held, 99_999_999, None)).unwrap(),
        "a reclaimed card's old claim extends nothing"
    );
}

/// A worker that overran settles its own run as timed out: counted, released.
pub fn overrun_settlements_count<B: Board + BoardAdmin>(board: &B, time: &VirtualClock) {
    let id = create(board, &task("looping"));
    let held = claim(board, &id, "host:d");
    let overrun = Overrun::IterationLimit("60/60".into());
    block_on(board.settle_overrun(&held, &overrun, &FailurePolicy::default())).unwrap();
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.consecutive_failures, 1);
    assert_eq!(view.task.claim_lock, None, "the claim is released");
    assert_eq!(view.runs[0].outcome.as_deref(), Some("timed_out"));
    assert!(view.task.not_before.is_some_and(|at| at > START));
    assert_lease_lost(
        block_on(board.settle_overrun(&held, &overrun, &FailurePolicy::default())),
        "a second settlement",
    );
    time.advance(3600);
    let held = claim(board, &id, "host:d");
    block_on(board.settle_overrun(
        &held,
        &Overrun::RunLimit { seconds: 60 },
        &FailurePolicy::default(),
    ))
    .unwrap();
    assert_eq!(
        status(board, &id),
        TaskStatus::Blocked,
        "blocked at the limit"
    );
}

/// A worker's view of its run follows the board.
pub fn run_status_follows_the_run<B: Board + BoardAdmin>(board: &B, _: &VirtualClock) {
    let id = create(board, &task("watched"));
    let held = claim(board, &id, "host:d");
    assert_eq!(
        block_on(board.run_status(&held)).unwrap(),
        RunStatus::Running
    );
    let other_lock = Claim {
        claim_lock: "host:x".into(),
        ..held.clone()
    };
    assert_eq!(
        block_on(board.run_status(&other_lock)).unwrap(),
        RunStatus::Superseded,
        "another lock does not hold the run"
    );
    block_on(board.reclaim(&id, "x")).unwrap();
    assert_eq!(
        block_on(board.run_status(&held)).unwrap(),
        RunStatus::Superseded
    );
    let missing = Claim {
        task_id: "t_missing".into(),
        ..held
    };
    assert!(matches!(
        block_on(board.run_status(&missing)),
        Err(BoardError::TaskNotFound(_))
    ));
}

/// A batch claims up to one card per lock, in claim order, in one go; a
/// filter admits only the assignees it names (`""`: no assignee).
pub fn batched_claims_and_routing_filters<B: BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let add = |title: &str, assignee: Option<&str>, priority: i64| {
        time.advance(1);
        block_on(board.create_task(&NewTask {
            title: title.into(),
            assignee: assignee.map(str::to_owned),
            priority,
            ..NewTask::default()
        }))
        .unwrap()
    };
    let low = add("low", None, 0);
    let high = add("high", Some("a"), 5);
    let mid = add("mid", Some("b"), 3);
    let locks: Vec<String> = (0..2).map(|n| format!("host:batch{n}")).collect();
    let grants = block_on(board.claim_ready_batch(TTL, &locks, &ClaimFilter::any())).unwrap();
    let claimed: Vec<&str> = grants.iter().map(|g| g.claim.task_id.as_str()).collect();
    assert_eq!(
        claimed,
        [high.as_str(), mid.as_str()],
        "priority order, one per lock"
    );
    assert_eq!(grants[0].claim.claim_lock, "host:batch0");
    assert_eq!(grants[1].claim.claim_lock, "host:batch1");
    assert_eq!(grants[0].assignee.as_deref(), Some("a"));
    // Only b's cards, then only unassigned ones.
    let b_only = ClaimFilter::only(["b".to_owned()]);
    let more = add("b again", Some("b"), 9);
    let grants = block_on(board.claim_ready_batch(TTL, &locks, &b_only)).unwrap();
    assert_eq!(grants.len(), 1, "fewer ready than locks");
    assert_eq!(grants[0].claim.task_id, more);
    let unassigned = ClaimFilter::only([String::new()]);
    let grants = block_on(board.claim_ready_batch(TTL, &locks, &unassigned)).unwrap();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].claim.task_id, low);
    assert!(
        block_on(board.claim_ready_batch(TTL, &locks, &ClaimFilter::any()))
            .unwrap()
            .is_empty()
    );
    assert!(
        block_on(board.claim_ready_batch(TTL, &[], &ClaimFilter::any()))
            .unwrap()
            .is_empty()
    );
}

/// A held card and a card not due yet wait in `scheduled`, where neither
/// system claims them: released, the held one is ready at once; the other
/// is put back in line by the first tick once its time has come.
pub fn held_and_delayed_cards_wait<B: BoardAdmin + DispatchBoard>(board: &B, time: &VirtualClock) {
    let held = block_on(board.create_task(&task("held"))).unwrap();
    let later = block_on(board.create_task(&NewTask {
        not_before: Some(kanban_core::Clock::now(time) + 60),
        ..task("later")
    }))
    .unwrap();
    block_on(board.hold(&held, "waiting for a key")).unwrap();
    assert_eq!(status(board, &held), TaskStatus::Scheduled);
    assert_eq!(status(board, &later), TaskStatus::Scheduled);
    assert_eq!(block_on(board.promote_ready()).unwrap(), 0, "not due yet");
    assert!(next(board).is_none(), "held and delayed cards wait");
    block_on(board.release_hold(&held)).unwrap();
    assert_eq!(status(board, &held), TaskStatus::Ready);
    assert_eq!(next(board).map(|c| c.task_id), Some(held));
    time.advance(59);
    assert_eq!(
        block_on(board.promote_ready()).unwrap(),
        0,
        "a second early"
    );
    time.advance(1);
    assert!(next(board).is_none(), "due, but not yet back in line");
    assert_eq!(block_on(board.promote_ready()).unwrap(), 1);
    assert_eq!(status(board, &later), TaskStatus::Ready);
    assert_eq!(last_kind(board, &later), "due");
    assert_eq!(next(board).map(|c| c.task_id), Some(later));
}

/// The seed system's lanes: a card in triage is never claimed until
/// promoted; `schedule` parks a card (a running one's worker is fenced out)
/// until its time or an unblock; `promote` by hand refuses a card whose
/// parent is open unless forced, and a dry run changes nothing; a card up
/// for review is claimed for its reviewer without waiting for its parents.
pub fn triage_schedule_promote_and_review<B: BoardAdmin + DispatchBoard>(
    board: &B,
    time: &VirtualClock,
) {
    let shaped = block_on(board.create_task(&NewTask {
        start: kanban_core::rules::Start::Triage,
        ..task("shape me")
    }))
    .unwrap();
    assert_eq!(status(board, &shaped), TaskStatus::Triage);
    assert_eq!(block_on(board.promote_ready()).unwrap(), 0);
    assert!(next(board).is_none(), "a card in triage is never claimed");
    block_on(board.promote(&shaped, Some("spec ok"), false, true)).unwrap();
    assert_eq!(
        status(board, &shaped),
        TaskStatus::Triage,
        "a dry run changes nothing"
    );
    block_on(board.promote(&shaped, Some("spec ok"), false, false)).unwrap();
    assert_eq!(status(board, &shaped), TaskStatus::Ready);
    assert_eq!(last_kind(board, &shaped), "promoted_manual");
    // Schedule a running card: its run closes, its claim is gone.
    let claim = next(board).unwrap();
    assert_eq!(claim.task_id, shaped);
    block_on(board.schedule(&shaped, Some("after the freeze"), None)).unwrap();
    let view = block_on(board.show_task(&shaped)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Scheduled);
    assert_eq!(view.task.claim_lock, None);
    assert_eq!(view.runs[0].outcome.as_deref(), Some("scheduled"));
    assert!(matches!(
        block_on(board.heartbeat(&claim, None)),
        Err(BoardError::LeaseLost { .. })
    ));
    time.advance(3600);
    assert_eq!(
        block_on(board.promote_ready()).unwrap(),
        0,
        "no time: it waits for an unblock"
    );
    block_on(board.unblock(&shaped)).unwrap();
    assert_eq!(status(board, &shaped), TaskStatus::Ready);
    // Promote by hand: refused while a parent is open, unless forced.
    let parent = create(board, &task("parent"));
    let child = create(
        board,
        &NewTask {
            parents: vec![parent.clone()],
            ..task("child")
        },
    );
    let refused = block_on(board.promote(&child, None, false, false)).unwrap_err();
    assert!(refused.to_string().contains("--force"), "{refused}");
    assert!(matches!(
        block_on(board.promote(&child, None, false, true)),
        Err(BoardError::InvalidInput(_))
    ));
    assert_eq!(status(board, &child), TaskStatus::Todo);
    block_on(board.triage(&child, Some("unclear"))).unwrap();
    assert_eq!(status(board, &child), TaskStatus::Triage);
    block_on(board.promote(&child, None, true, false)).unwrap();
    assert_eq!(status(board, &child), TaskStatus::Ready);
    // Review: claimed for its reviewer, parents not checked again.
    block_on(board.review(&child, Some("check it"))).unwrap();
    assert_eq!(status(board, &child), TaskStatus::Review);
    let mut claimed = Vec::new();
    while let Some(claim) = next(board) {
        claimed.push(claim.task_id);
    }
    assert!(claimed.contains(&child), "{claimed:?}");
    assert_eq!(status(board, &child), TaskStatus::Running);
    // Refused moves change nothing and name the move.
    assert!(matches!(
        block_on(board.triage(&child, None)),
        Err(BoardError::InvalidTransition { .. })
    ));
    assert!(matches!(
        block_on(board.review(&parent, None)).and(block_on(board.review(&parent, None))),
        Err(BoardError::InvalidTransition { .. })
    ));
}

/// A card in triage, specified: only its changed fields change, it is in
/// line (in todo while a parent is open), a note names the agent. Once: a
/// card out of triage is refused and nothing is written.
pub fn a_triage_card_is_specified_once<B: BoardAdmin + DispatchBoard>(board: &B, _: &VirtualClock) {
    use kanban_core::triage::{Specification, TriagePlan};
    let idea = create(
        board,
        &NewTask {
            start: kanban_core::rules::Start::Triage,
            body: Some("rough".into()),
            ..task("an idea")
        },
    );
    let spec = TriagePlan::Specify(Specification {
        title: Some("an idea".into()),
        body: Some("**Goal** done".into()),
        assignee: None,
    });
    let settled = block_on(board.settle_triage(&idea, &spec, "planner", "ann")).unwrap();
    assert_eq!(settled.child_ids, Vec::<String>::new());
    assert_eq!(settled.status, TaskStatus::Ready);
    let view = block_on(board.show_task(&idea)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.title, "an idea");
    assert_eq!(view.task.body.as_deref(), Some("**Goal** done"));
    let note = view.comments.last().expect("a note");
    assert_eq!(note.author, "ann");
    assert!(note.body.contains("planner"), "{}", note.body);
    let specified = view
        .events
        .iter()
        .find(|e| e.kind == "specified")
        .expect("event");
    assert_eq!(
        specified.payload["changed_fields"],
        serde_json::json!(["body"])
    );
    let again = block_on(board.settle_triage(&idea, &spec, "planner", "ann"));
    assert!(
        matches!(again, Err(BoardError::InvalidTransition { .. })),
        "{again:?}"
    );
    assert_eq!(block_on(board.show_task(&idea)).unwrap().comments.len(), 1);

    // A plan that breaks core's bounds is refused whole.
    let blank = TriagePlan::Decompose {
        rationale: None,
        children: vec![],
    };
    let shaped = create(
        board,
        &NewTask {
            start: kanban_core::rules::Start::Triage,
            ..task("shape")
        },
    );
    assert!(matches!(
        block_on(board.settle_triage(&shaped, &blank, "planner", "ann")),
        Err(BoardError::InvalidInput(_))
    ));
    assert_eq!(status(board, &shaped), TaskStatus::Triage);

    // When the card was already waiting for an open parent, the
    // specified card waits in todo.
    let parent = create(board, &task("first"));
    let waiting = create(
        board,
        &NewTask {
            start: kanban_core::rules::Start::Triage,
            parents: vec![parent],
            ..task("later")
        },
    );
    let settled = block_on(board.settle_triage(&waiting, &spec, "planner", "ann")).unwrap();
    assert_eq!(settled.status, TaskStatus::Todo);
    assert_eq!(status(board, &waiting), TaskStatus::Todo);
}

/// A card in triage, decomposed: its children are made with their links,
/// the tenant, priority and workspace of the card, and the card waits for
/// all of them. Once: a second decomposition, or one of a card out of
/// triage, is refused and makes nothing.
pub fn a_triage_card_is_decomposed_whole_and_once<B: BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    use kanban_core::triage::{ChildCard, TriagePlan};
    let big = create(
        board,
        &NewTask {
            start: kanban_core::rules::Start::Triage,
            tenant: Some("acme".into()),
            priority: 3,
            workspace: Some(kanban_core::workspaces::WorkspaceSpec {
                kind: kanban_core::workspaces::WorkspaceKind::Dir,
                path: Some("/srv/app".into()),
            }),
            ..task("a big idea")
        },
    );
    let child = |title: &str, parents: Vec<usize>| ChildCard {
        title: title.into(),
        body: Some(format!("do {title}")),
        assignee: Some("coder".into()),
        parents,
        workspace: Some(kanban_core::workspaces::WorkspaceSpec {
            kind: kanban_core::workspaces::WorkspaceKind::Dir,
            path: Some("/srv/app".into()),
        }),
    };
    let plan = TriagePlan::Decompose {
        rationale: Some("two steps".into()),
        // The second is listed first and waits for the first.
        children: vec![child("docs", vec![1]), child("api", vec![])],
    };
    let before = block_on(board.list_tasks(None)).unwrap().len();
    let settled = block_on(board.settle_triage(&big, &plan, "planner", "ann")).unwrap();
    assert_eq!(settled.status, TaskStatus::Todo);
    let ids = settled.child_ids;
    assert_eq!(ids.len(), 2);
    assert_eq!(block_on(board.list_tasks(None)).unwrap().len(), before + 2);
    let (docs, api) = (&ids[0], &ids[1]);
    let links = block_on(board.links()).unwrap();
    for pair in [(api, docs), (docs, &big), (api, &big)] {
        assert!(
            links.contains(&(pair.0.clone(), pair.1.clone())),
            "{pair:?} in {links:?}"
        );
    }
    assert_eq!(status(board, api), TaskStatus::Ready);
    assert_eq!(status(board, docs), TaskStatus::Todo);
    assert_eq!(status(board, &big), TaskStatus::Todo);
    let made = block_on(board.show_task(docs)).unwrap().task;
    assert_eq!(made.title, "docs");
    assert_eq!(made.body.as_deref(), Some("do docs"));
    assert_eq!(made.assignee.as_deref(), Some("coder"));
    assert_eq!(made.tenant.as_deref(), Some("acme"));
    assert_eq!(made.priority, 3);
    assert_eq!(made.created_by.as_deref(), Some("ann"));
    assert_eq!(made.workspace_kind(), "dir");
    assert_eq!(made.workspace_path(), Some("/srv/app"));
    let root = block_on(board.show_task(&big)).unwrap();
    let note = &root.comments.last().expect("a note").body;
    assert!(
        note.contains(docs.as_str()) && note.contains("two steps"),
        "{note}"
    );
    let decomposed = root
        .events
        .iter()
        .find(|e| e.kind == "decomposed")
        .expect("event");
    assert_eq!(decomposed.payload["child_ids"], serde_json::json!(ids));
    // Once: a second decomposition is refused and makes nothing.
    let count = block_on(board.list_tasks(None)).unwrap().len();
    assert!(matches!(
        block_on(board.settle_triage(&big, &plan, "planner", "ann")),
        Err(BoardError::InvalidTransition { .. })
    ));
    assert!(matches!(
        block_on(board.settle_triage(api, &plan, "planner", "ann")),
        Err(BoardError::InvalidTransition { .. })
    ));
    assert_eq!(block_on(board.list_tasks(None)).unwrap().len(), count);
    assert!(matches!(
        block_on(board.settle_triage("t_nothere", &plan, "planner", "ann")),
        Err(BoardError::TaskNotFound(_))
    ));
}

/// Typed blocks, as the seed system routes them: `needs_input` is blocked
/// for a person and its kind kept; blocked for the same kind again after an
/// unblock, the card goes to triage (`block_loop_detected`); a completion
/// starts the count again; a `dependency` block waits in todo, ready again
/// at the next tick when its parents are done.
pub fn typed_blocks_route_and_a_loop_goes_to_triage<B: BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    use kanban_core::BlockKind;
    let id = create(board, &task("needs answers"));
    let run = |kind| {
        let claim = next(board).expect("the card is claimable");
        block_on(board.block(&claim, "which region?", kind)).unwrap();
    };
    run(Some(BlockKind::NeedsInput));
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Blocked);
    assert_eq!(view.task.block_kind.as_deref(), Some("needs_input"));
    assert_eq!(view.runs[0].outcome.as_deref(), Some("blocked"));
    block_on(board.unblock(&id)).unwrap();
    run(Some(BlockKind::NeedsInput));
    assert_eq!(status(board, &id), TaskStatus::Triage);
    assert_eq!(last_kind(board, &id), "block_loop_detected");
    // Out of triage by hand, then done: the count starts again.
    block_on(board.promote(&id, None, false, false)).unwrap();
    let claim = next(board).unwrap();
    block_on(board.complete(&claim, "answered", None)).unwrap();
    block_on(board.review(&id, None)).unwrap();
    run(Some(BlockKind::NeedsInput));
    assert_eq!(
        status(board, &id),
        TaskStatus::Blocked,
        "counted from zero after done"
    );
    // A dependency waits in todo, and with no open parent is ready at the
    // next tick.
    let waiting = create(board, &task("waits for another"));
    let claim = next(board).unwrap();
    assert_eq!(claim.task_id, waiting);
    block_on(board.block(
        &claim,
        "needs the schema first",
        Some(BlockKind::Dependency),
    ))
    .unwrap();
    let view = block_on(board.show_task(&waiting)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Todo);
    assert_eq!(view.task.block_kind.as_deref(), Some("dependency"));
    assert_eq!(last_kind(board, &waiting), "dependency_wait");
    assert_eq!(block_on(board.promote_ready()).unwrap(), 1);
    assert_eq!(status(board, &waiting), TaskStatus::Ready);
}

/// A run's fan-out: a card made from inside a run waits for the run's card
/// and names its assignee as its maker; the run links and unblocks only the
/// cards its card made; each is fenced by the claim (a refused one changes
/// nothing) and recorded on the run's card.
pub fn attachments_and_tenants_are_kept_and_a_run_attaches_only_while_it_owns_its_card<
    B: Board + BoardAdmin,
>(
    board: &B,
    _: &VirtualClock,
) {
    use kanban_core::attachments::NewAttachment;
    let lead = create(
        board,
        &NewTask {
            tenant: Some("acme".into()),
            assignee: Some("lead".into()),
            ..task("ship the report")
        },
    );
    assert_eq!(
        block_on(board.show_task(&lead))
            .unwrap()
            .task
            .tenant
            .as_deref(),
        Some("acme")
    );
    let file = |name: &str| NewAttachment {
        filename: name.into(),
        stored_path: format!("/boards/attachments/{lead}/{name}"),
        content_type: Some("text/plain".into()),
        size: 5,
        uploaded_by: Some("alice".into()),
    };
    let by_hand = block_on(board.add_attachment(&lead, &file("a.txt"))).unwrap();
    assert!(matches!(
        block_on(board.add_attachment("t_00000000", &file("b.txt"))),
        Err(BoardError::TaskNotFound(_))
    ));
    let run = claim(board, &lead, "lock-lead");
    let by_run = block_on(board.attach(&run, &file("c.txt"))).unwrap();
    assert!(by_run > by_hand);
    // A card made inside the run belongs to the run card's tenant.
    let part = block_on(board.create_child(&run, &task("a part"))).unwrap();
    assert_eq!(
        block_on(board.show_task(&part))
            .unwrap()
            .task
            .tenant
            .as_deref(),
        Some("acme")
    );
    let kept = block_on(board.attachments(Some(&lead))).unwrap();
    let names: Vec<&str> = kept.iter().map(|a| a.filename.as_str()).collect();
    assert_eq!(names, ["a.txt", "c.txt"]);
    assert_eq!(kept[0].uploaded_by.as_deref(), Some("alice"));
    assert_eq!(kept[1].size, 5);
    let events = block_on(board.show_task(&lead)).unwrap().events;
    let attached: Vec<Option<i64>> = events
        .iter()
        .filter(|e| e.kind == "attached")
        .map(|e| e.run_id)
        .collect();
    assert_eq!(attached, [None, Some(run.run_id)]);
    // Removed: the row, once.
    let removed = block_on(board.remove_attachment(by_hand)).unwrap().unwrap();
    assert_eq!(removed.filename, "a.txt");
    assert_eq!(block_on(board.remove_attachment(by_hand)).unwrap(), None);
    // A run that lost its card attaches nothing.
    block_on(board.reclaim(&lead, "taken back")).unwrap();
    assert!(matches!(
        block_on(board.attach(&run, &file("late.txt"))),
        Err(BoardError::LeaseLost { .. })
    ));
    assert_eq!(block_on(board.attachments(Some(&lead))).unwrap().len(), 1);
}

pub fn gc_deletes_only_the_old_events_of_settled_cards<B: Board + BoardAdmin>(
    board: &B,
    clock: &VirtualClock,
) {
    let open = create(board, &task("still open"));
    let archived = create(board, &task("put away"));
    block_on(board.archive(&archived)).unwrap();
    use kanban_core::Clock as _;
    let before = clock.now() + 1;
    assert_eq!(
        block_on(board.gc_events(clock.now() - 1)).unwrap(),
        0,
        "nothing is that old"
    );
    let removed = block_on(board.gc_events(before)).unwrap();
    assert_eq!(
        removed, 2,
        "the archived card's created and archived events"
    );
    assert!(
        block_on(board.show_task(&archived))
            .unwrap()
            .events
            .is_empty()
    );
    assert_eq!(block_on(board.show_task(&open)).unwrap().events.len(), 1);
}

pub fn a_run_fans_out_to_cards_of_its_own_only<B: Board + BoardAdmin>(board: &B, _: &VirtualClock) {
    let lead = create(
        board,
        &NewTask {
            assignee: Some("lead".into()),
            ..task("plan the release")
        },
    );
    let other = create(board, &task("somebody else's card"));
    let run = claim(board, &lead, "lock-lead");
    let notes = NewTask {
        assignee: Some("writer".into()),
        ..task("write the notes")
    };
    let first = block_on(board.create_child(&run, &notes)).unwrap();
    let view = block_on(board.show_task(&first)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Todo, "it waits for the lead");
    assert_eq!(view.parents, vec![lead.clone()]);
    assert_eq!(view.task.created_by.as_deref(), Some("lead"));
    assert_eq!(view.task.assignee.as_deref(), Some("writer"));
    let recorded = block_on(board.show_task(&lead)).unwrap();
    let fanned = recorded.events.last().unwrap();
    assert_eq!(fanned.kind, "fanned_out");
    assert_eq!(fanned.run_id, Some(run.run_id));
    assert_eq!(fanned.payload["action"], "created");
    assert_eq!(fanned.payload["task_id"], first.as_str());
    // A second card that gathers the first.
    let gather = NewTask {
        parents: vec![first.clone()],
        ..task("gather")
    };
    let second = block_on(board.create_child(&run, &gather)).unwrap();
    let mut parents = block_on(board.show_task(&second)).unwrap().parents;
    parents.sort();
    let mut expected = vec![lead.clone(), first.clone()];
    expected.sort();
    assert_eq!(parents, expected);

    // Another card is out of the run's reach, and nothing changes.
    let refused = block_on(board.link_child(&run, &first, &other));
    assert!(
        matches!(refused, Err(BoardError::InvalidInput(_))),
        "{refused:?}"
    );
    assert!(
        block_on(board.show_task(&other))
            .unwrap()
            .parents
            .is_empty()
    );
    assert_eq!(status(board, &other), TaskStatus::Ready);
    block_on(board.schedule(&other, None, None)).unwrap();
    let refused = block_on(board.unblock_child(&run, &other));
    assert!(
        matches!(refused, Err(BoardError::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(status(board, &other), TaskStatus::Scheduled);
    // Its own card may wait for another, once; a cycle is refused.
    assert!(block_on(board.link_child(&run, &other, &second)).unwrap());
    assert!(!block_on(board.link_child(&run, &other, &second)).unwrap());
    let cycle = block_on(board.link_child(&run, &second, &first));
    assert!(
        matches!(cycle, Err(BoardError::InvalidInput(_))),
        "{cycle:?}"
    );
    let last = block_on(board.show_task(&lead)).unwrap().events;
    let linked = last.last().unwrap();
    assert_eq!(linked.payload["action"], "linked");
    assert_eq!(linked.payload["child"], second.as_str());
    // And its own blocked card back in line.
    block_on(board.schedule(&first, None, None)).unwrap();
    block_on(board.unblock_child(&run, &first)).unwrap();
    assert_eq!(status(board, &first), TaskStatus::Todo);
    assert_eq!(last_kind(board, &lead), "fanned_out");

    // Fenced: once the run is over, nothing more is made.
    block_on(board.complete(&run, "planned", None)).unwrap();
    assert_eq!(
        status(board, &first),
        TaskStatus::Ready,
        "freed at completion"
    );
    assert_fan_out_fenced(board, &run, &notes, [&lead, &first, &other]);
}

/// Once `run` is over, its fan-out is refused and changes nothing: no card
/// made, none unblocked, no link added between `first` and `other`.
fn assert_fan_out_fenced<B: Board + BoardAdmin>(
    board: &B,
    run: &Claim,
    notes: &NewTask,
    [lead, first, other]: [&String; 3],
) {
    let cards = block_on(board.list_tasks(None)).unwrap().len();
    assert_lease_lost(
        block_on(board.create_child(run, notes)),
        "create after the run",
    );
    assert_lease_lost(
        block_on(board.unblock_child(run, first)),
        "unblock after the run",
    );
    assert_lease_lost(
        block_on(board.link_child(run, other, first)),
        "link after the run",
    );
    assert_eq!(block_on(board.list_tasks(None)).unwrap().len(), cards);
    assert!(block_on(board.show_task(first)).unwrap().parents == vec![lead.clone()]);
}

/// A swarm: its root done at once with the seed system's metadata and
/// topology note, its workers ready, its verifier waiting for every worker
/// and its synthesizer for the verifier; a repeated key makes nothing new,
/// and a key of a card that is no swarm's root is refused.
pub fn a_swarm_is_made_whole_and_once_per_key<B: Board + BoardAdmin>(board: &B, _: &VirtualClock) {
    use kanban_core::swarm::{Swarm, SwarmWorker};
    let worker = |assignee: &str, title: &str| SwarmWorker {
        assignee: assignee.into(),
        title: title.into(),
    };
    let swarm = Swarm {
        goal: "ship the release notes\nwith a changelog".into(),
        workers: vec![
            worker("writer", "draft the notes"),
            worker("counter", "count the changes"),
        ],
        verifier: "checker".into(),
        synthesizer: "editor".into(),
        created_by: "lead".into(),
        priority: 3,
        idempotency_key: Some("notes-1".into()),
    };
    let made = block_on(board.create_swarm(&swarm)).unwrap();
    assert!(made.made);
    let cards = made.cards;
    assert_swarm_graph(board, &cards);

    // The same key again: the first swarm, nothing new.
    let count = block_on(board.list_tasks(None)).unwrap().len();
    assert_eq!(count, 5);
    let again = block_on(board.create_swarm(&swarm)).unwrap();
    assert_eq!((again.made, &again.cards), (false, &cards));
    // A key some plain card holds is refused, and nothing is made.
    let plain = create(
        board,
        &NewTask {
            idempotency_key: Some("plain".into()),
            ..task("a plain card")
        },
    );
    let other_key = Swarm {
        idempotency_key: Some("plain".into()),
        ..swarm.clone()
    };
    match block_on(board.create_swarm(&other_key)) {
        Err(BoardError::InvalidInput(message)) => assert!(message.contains(&plain), "{message}"),
        other => panic!("a plain card's key: {other:?}"),
    }
    let no_workers = Swarm {
        workers: Vec::new(),
        idempotency_key: None,
        ..swarm
    };
    assert!(matches!(
        block_on(board.create_swarm(&no_workers)),
        Err(BoardError::InvalidInput(_))
    ));
    assert_eq!(block_on(board.list_tasks(None)).unwrap().len(), count + 1);
}

/// The cards of a swarm the contract made: a done root with the seed
/// system's metadata and topology note, two ready workers, a verifier
/// waiting for both and a synthesizer waiting for it.
fn assert_swarm_graph<B: BoardAdmin>(board: &B, cards: &kanban_core::swarm::SwarmCards) {
    use kanban_core::swarm::recorded_topology;
    let root = block_on(board.show_task(&cards.root_id)).unwrap();
    assert_eq!(root.task.status, TaskStatus::Done);
    assert_eq!(root.task.title, "Swarm: ship the release notes");
    assert_eq!(root.runs.len(), 1);
    let metadata = root.runs[0].metadata.as_ref().unwrap();
    assert_eq!(metadata["kind"], "kanban_swarm_v1");
    assert_eq!(metadata["worker_count"], 2);
    let notes: Vec<&str> = root
        .comments
        .iter()
        .rev()
        .map(|c| c.body.as_str())
        .collect();
    assert_eq!(recorded_topology(notes).as_ref(), Some(cards));
    assert_eq!(cards.worker_ids.len(), 2);
    for (id, assignee) in cards.worker_ids.iter().zip(["writer", "counter"]) {
        let view = block_on(board.show_task(id)).unwrap();
        assert_eq!(view.task.status, TaskStatus::Ready, "{id} starts at once");
        assert_eq!(view.task.assignee.as_deref(), Some(assignee));
        assert_eq!(view.task.created_by.as_deref(), Some("lead"));
        assert_eq!(view.task.priority, 3);
        assert_eq!(view.parents, vec![cards.root_id.clone()]);
    }
    let verifier = block_on(board.show_task(&cards.verifier_id)).unwrap();
    assert_eq!(verifier.task.status, TaskStatus::Todo);
    assert_eq!(verifier.task.assignee.as_deref(), Some("checker"));
    let mut parents = verifier.parents.clone();
    parents.sort();
    let mut workers = cards.worker_ids.clone();
    workers.sort();
    assert_eq!(parents, workers);
    let synthesizer = block_on(board.show_task(&cards.synthesizer_id)).unwrap();
    assert_eq!(synthesizer.task.status, TaskStatus::Todo);
    assert_eq!(synthesizer.task.assignee.as_deref(), Some("editor"));
    assert_eq!(synthesizer.parents, vec![cards.verifier_id.clone()]);
}

/// An edit of a done card's handoff: its result on the card, its summary
/// and metadata on its last completed run (an earlier run keeps its own);
/// a card that is not done is refused and keeps what it had.
pub fn a_done_card_s_handoff_is_edited_on_its_last_completed_run<B: Board + BoardAdmin>(
    board: &B,
    _: &VirtualClock,
) {
    use kanban_core::Handoff;
    use kanban_core::rules::CardEdit;
    let id = create(board, &task("write the notes"));
    let first = claim(board, &id, "lock-1");
    block_on(board.block(&first, "which version?", None)).unwrap();
    let backfill = CardEdit {
        result: Some("shipped in 0.3".into()),
        summary: Some("notes for 0.3, checked".into()),
        metadata: serde_json::json!({"tests_run": 12}).as_object().cloned(),
        ..CardEdit::default()
    };
    assert!(matches!(
        block_on(board.edit(&id, &backfill)),
        Err(BoardError::InvalidInput(_))
    ));
    block_on(board.unblock(&id)).unwrap();
    let second = claim(board, &id, "lock-2");
    let handoff = Handoff {
        metadata: serde_json::json!({"draft": true}).as_object().cloned(),
        ..Handoff::new("draft notes", None)
    };
    block_on(board.hand_off(&second, &handoff)).unwrap();
    let before = block_on(board.show_task(&id)).unwrap();
    block_on(board.edit(&id, &backfill)).unwrap();
    let after = block_on(board.show_task(&id)).unwrap();
    assert_eq!(after.task.status, TaskStatus::Done);
    assert_eq!(after.task.result.as_deref(), Some("shipped in 0.3"));
    let run = |view: &kanban_core::TaskView, run_id: i64| {
        view.runs
            .iter()
            .find(|run| run.id == run_id)
            .cloned()
            .unwrap()
    };
    let completed = run(&after, second.run_id);
    assert_eq!(completed.summary.as_deref(), Some("notes for 0.3, checked"));
    assert_eq!(
        completed.metadata,
        Some(serde_json::json!({"tests_run": 12}))
    );
    assert_eq!(run(&after, first.run_id), run(&before, first.run_id));
    let edited = after.events.iter().rfind(|e| e.kind == "edited").unwrap();
    assert_eq!(
        edited.payload["fields"],
        serde_json::json!(["result", "summary", "metadata"])
    );
    // Metadata alone: the rest stays.
    let only = CardEdit {
        metadata: serde_json::json!({"tests_run": 13}).as_object().cloned(),
        ..CardEdit::default()
    };
    block_on(board.edit(&id, &only)).unwrap();
    let last = block_on(board.show_task(&id)).unwrap();
    let completed = run(&last, second.run_id);
    assert_eq!(completed.summary.as_deref(), Some("notes for 0.3, checked"));
    assert_eq!(completed.metadata.unwrap()["tests_run"], 13);
    assert_eq!(last.task.result.as_deref(), Some("shipped in 0.3"));
}

/// A completion's handoff: its metadata is kept on the run, and the cards
/// it names are vouched for only when the run's card made them; one it did
/// not make refuses the whole completion, which changes nothing.
pub fn a_handoff_keeps_metadata_and_vouches_only_for_cards_the_run_made<B: Board + BoardAdmin>(
    board: &B,
    _: &VirtualClock,
) {
    use kanban_core::Handoff;
    let lead = create(board, &task("split the work"));
    let stranger = create(board, &task("made by a person"));
    let run = claim(board, &lead, "lock-lead");
    let made = block_on(board.create_child(&run, &task("a part"))).unwrap();
    let metadata = serde_json::json!({"changed_files": ["NOTES.md"], "tests_run": 12});
    let handoff = |cards: &[&str]| Handoff {
        summary: "split in two".into(),
        result: None,
        metadata: metadata.as_object().cloned(),
        created_cards: cards.iter().map(|id| (*id).to_owned()).collect(),
    };
    for phantom in [stranger.as_str(), "t_deadbeefcafe"] {
        let refused = block_on(board.hand_off(&run, &handoff(&[made.as_str(), phantom])));
        match refused {
            Err(BoardError::InvalidInput(message)) => {
                assert!(message.contains(phantom), "{message}");
                assert!(!message.contains(made.as_str()), "{message}");
            }
            other => panic!("a card the run did not make: {other:?}"),
        }
        assert_eq!(status(board, &lead), TaskStatus::Running, "nothing changed");
    }
    block_on(board.hand_off(&run, &handoff(&[made.as_str(), made.as_str()]))).unwrap();
    let view = block_on(board.show_task(&lead)).unwrap();
    assert_eq!(view.task.status, TaskStatus::Done);
    assert_eq!(view.runs[0].metadata.as_ref(), Some(&metadata));
    let completed = view.events.iter().rfind(|e| e.kind == "completed").unwrap();
    assert_eq!(
        completed.payload["verified_cards"],
        serde_json::json!([made])
    );
    // A plain completion keeps no metadata and vouches for nothing.
    let plain = create(board, &task("plain"));
    let run = claim(board, &plain, "lock-plain");
    block_on(board.complete(&run, "done", None)).unwrap();
    let view = block_on(board.show_task(&plain)).unwrap();
    assert_eq!(view.runs[0].metadata, None);
    let completed = view.events.iter().rfind(|e| e.kind == "completed").unwrap();
    assert!(completed.payload.get("verified_cards").is_none());
}

/// Walls: one probe at a time. A probe starts only once the wall's reset
/// time came and no other running run probes it; a probe whose run was
/// released no longer bars the next; nothing is written when refused.
pub fn one_probe_per_wall<B: BoardAdmin + DispatchBoard>(board: &B, time: &VirtualClock) {
    for n in 0..5 {
        create(board, &task(&format!("walled {n}")));
    }
    let scopes = vec!["provider-a model:m".to_owned()];
    let hitter = next(board).unwrap();
    let walled = ExitReport {
        wall: Some(WallHit {
            scope: scopes[0].clone(),
            kind: WallKind::Rate,
            route: "default".into(),
            reported_wait: Some(60),
            reason: "rate_limit".into(),
        }),
        ..exit_report(ExitWitness::Code(75))
    };
    block_on(board.book_exit(&hitter, &walled)).unwrap();
    let until = block_on(board.walls()).unwrap()[0].until;
    let (first, second, third) = (
        next(board).unwrap(),
        next(board).unwrap(),
        next(board).unwrap(),
    );
    assert!(
        !block_on(board.start_probe(&first, &scopes)).unwrap(),
        "no probe before the reset"
    );
    time.set(until);
    assert!(block_on(board.start_probe(&first, &scopes)).unwrap());
    assert_eq!(
        block_on(board.walls()).unwrap()[0].probe_run,
        Some(first.run_id)
    );
    let probes = |claim: &Claim| {
        block_on(board.show_task(&claim.task_id))
            .unwrap()
            .events
            .iter()
            .filter(|e| e.kind == "wall_probe")
            .count()
    };
    assert!(
        !block_on(board.start_probe(&second, &scopes)).unwrap(),
        "a second probe while the first runs"
    );
    assert_eq!(
        block_on(board.walls()).unwrap()[0].probe_run,
        Some(first.run_id),
        "the refused probe wrote nothing"
    );
    assert_eq!(probes(&second), 0);
    assert!(
        block_on(board.start_probe(&first, &scopes)).unwrap(),
        "a probe recorded again by its own run"
    );
    assert!(
        block_on(board.start_probe(&third, &["no wall here".to_owned()])).unwrap(),
        "a scope with no wall bars nothing"
    );
    // The first probe's run is released unstarted: its probe lapses.
    let unstarted = Release::NotStarted {
        reason: "test".into(),
    };
    assert_eq!(
        block_on(board.release_claim(&first, &unstarted, &FailurePolicy::default())).unwrap(),
        Released::Uncounted
    );
    assert!(block_on(board.start_probe(&second, &scopes)).unwrap());
    assert_eq!(
        block_on(board.walls()).unwrap()[0].probe_run,
        Some(second.run_id)
    );
    assert_eq!(probes(&second), 1);
}

/// An operator lifting a wall by hand frees the card that met it at once:
/// the hold its booking left goes with the wall.
pub fn lifting_a_wall_frees_the_card_that_met_it<B: BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let id = create(board, &task("met the wall"));
    let hitter = next(board).unwrap();
    let walled = ExitReport {
        wall: Some(WallHit {
            scope: "provider-a".into(),
            kind: WallKind::Credential,
            route: "default".into(),
            reported_wait: Some(3000),
            reason: "billing".into(),
        }),
        retry_after_seconds: Some(3000),
        ..exit_report(ExitWitness::Code(75))
    };
    block_on(board.book_exit(&hitter, &walled)).unwrap();
    assert_eq!(next(board), None, "held by its booking");
    assert!(block_on(board.lift_wall("provider-a")).unwrap());
    assert!(block_on(board.walls()).unwrap().is_empty());
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.not_before, None, "the wall's hold is gone");
    assert!(
        view.events
            .iter()
            .any(|e| e.kind == "wall_lifted" && e.run_id == Some(hitter.run_id)),
        "{:?}",
        view.events
    );
    assert_eq!(
        next(board).map(|claim| claim.task_id),
        Some(id),
        "claimable at once"
    );
    assert!(
        !block_on(board.lift_wall("provider-a")).unwrap(),
        "no wall to lift twice"
    );
}

/// Text holding NUL (an agent's output, a title sent to the API) is stored,
/// on every engine, with U+FFFD in each NUL's place: a card is created, its
/// worker's writes and its exit are booked, and all of it reads back.
pub fn text_with_nul_is_stored_with_its_stand_in<B: Board + BoardAdmin + DispatchBoard>(
    board: &B,
    _: &VirtualClock,
) {
    let id = create(
        board,
        &NewTask {
            body: Some("body\0end".into()),
            ..task("title\0end")
        },
    );
    let held = claim(board, &id, "lock-nul");
    block_on(board.comment(&held, "agent\0x", "comment\0end")).expect("a comment with NUL");
    block_on(board.append_event(&held, "note", serde_json::json!({"k\0ey": ["v\0al"]})))
        .expect("an event with NUL");
    let mut report = exit_report(ExitWitness::Code(1));
    report.output_tail = "output\0end".into();
    block_on(board.book_exit(&held, &report)).expect("an exit whose output holds NUL is booked");
    let view = block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.title, "title\u{FFFD}end");
    assert_eq!(view.task.body.as_deref(), Some("body\u{FFFD}end"));
    let comment = view.comments.last().expect("the comment");
    assert_eq!(
        (comment.author.as_str(), comment.body.as_str()),
        ("agent\u{FFFD}x", "comment\u{FFFD}end")
    );
    let note = view
        .events
        .iter()
        .find(|event| event.kind == "note")
        .expect("the event");
    assert_eq!(
        note.payload,
        serde_json::json!({"k\u{FFFD}ey": ["v\u{FFFD}al"]})
    );
    let crash = view
        .events
        .iter()
        .find(|event| event.kind == "crashed")
        .expect("the booking's event");
    assert_eq!(crash.payload["output"], "output\u{FFFD}end");
    assert_eq!(status(board, &id), TaskStatus::Ready, "a crash is retried");
}

/// A board's pages of a lane, and its dispatchers' reports, as the web
/// board reads them.
pub trait LanePages {
    fn dispatchers(&self) -> Result<Vec<kanban_board::DispatcherSeen>, BoardError>;
    fn stats(&self) -> Result<kanban_core::BoardStats, BoardError>;

    fn lane_page(
        &self,
        lane: kanban_board::Lane,
        filter: &kanban_board::LaneFilter,
        limit: usize,
        skip: usize,
    ) -> Result<kanban_board::LanePage, BoardError>;
}

impl LanePages for kanban_board_sqlite::SqliteBoard {
    fn dispatchers(&self) -> Result<Vec<kanban_board::DispatcherSeen>, BoardError> {
        block_on(std::ops::Deref::deref(self).dispatchers())
    }

    fn stats(&self) -> Result<kanban_core::BoardStats, BoardError> {
        block_on(std::ops::Deref::deref(self).stats())
    }

    fn lane_page(
        &self,
        lane: kanban_board::Lane,
        filter: &kanban_board::LaneFilter,
        limit: usize,
        skip: usize,
    ) -> Result<kanban_board::LanePage, BoardError> {
        // The stored board's own method, not this trait's.
        block_on(std::ops::Deref::deref(self).lane_page(lane, filter, limit, skip))
    }
}

impl LanePages for kanban_board_postgres::PgBoard {
    fn dispatchers(&self) -> Result<Vec<kanban_board::DispatcherSeen>, BoardError> {
        block_on(std::ops::Deref::deref(self).dispatchers())
    }

    fn stats(&self) -> Result<kanban_core::BoardStats, BoardError> {
        block_on(std::ops::Deref::deref(self).stats())
    }

    fn lane_page(
        &self,
        lane: kanban_board::Lane,
        filter: &kanban_board::LaneFilter,
        limit: usize,
        skip: usize,
    ) -> Result<kanban_board::LanePage, BoardError> {
        // The stored board's own method, not this trait's.
        block_on(std::ops::Deref::deref(self).lane_page(lane, filter, limit, skip))
    }
}

/// A lane's page narrowed by a filter: words of the title in any case (a
/// `%` or `_` in them matched as itself) or a whole id, an assignee, a
/// tenant; its count that of the matches; a page after the first `skip`.
pub fn a_lane_page_is_filtered_and_counted<B: BoardAdmin + LanePages>(
    board: &B,
    time: &VirtualClock,
) {
    use kanban_board::{Lane, LaneFilter};
    let add = |title: &str, assignee: Option<&str>, tenant: Option<&str>| {
        time.advance(1);
        create(
            board,
            &NewTask {
                assignee: assignee.map(str::to_owned),
                tenant: tenant.map(str::to_owned),
                ..task(title)
            },
        )
    };
    let flaky = add("Fix the FLAKY parser test", Some("coder"), Some("acme"));
    let notes = add("write the release notes", Some("writer"), None);
    let percent = add("reach 100% coverage", Some("coder"), None);
    let plain = add("reach 1000 users", None, Some("acme"));
    let under = add("rename a_b", None, None);
    let ready = Lane::Status(TaskStatus::Ready);
    let ids = |filter: LaneFilter| -> (usize, Vec<String>) {
        let page = board.lane_page(ready, &filter, 10, 0).unwrap();
        (
            page.count,
            page.cards.into_iter().map(|card| card.id).collect(),
        )
    };
    let text = |words: &str| LaneFilter {
        text: Some(words.to_owned()),
        ..LaneFilter::default()
    };
    assert_eq!(ids(LaneFilter::default()).0, 5);
    assert_eq!(ids(text("flaky parser")), (1, vec![flaky.clone()]));
    assert_eq!(ids(text("100%")), (1, vec![percent.clone()]), "% is itself");
    assert_eq!(ids(text("a_b")), (1, vec![under.clone()]), "_ is itself");
    assert_eq!(ids(text(&notes)), (1, vec![notes.clone()]), "a whole id");
    assert_eq!(ids(text("nothing like it")), (0, Vec::new()));
    let coder = LaneFilter {
        assignee: Some("coder".to_owned()),
        ..LaneFilter::default()
    };
    assert_eq!(
        ids(coder.clone()),
        (2, vec![flaky.clone(), percent.clone()])
    );
    let acme_coder = LaneFilter {
        tenant: Some("acme".to_owned()),
        ..coder
    };
    assert_eq!(ids(acme_coder), (1, vec![flaky.clone()]));
    let acme = LaneFilter {
        tenant: Some("acme".to_owned()),
        ..LaneFilter::default()
    };
    assert_eq!(ids(acme.clone()), (2, vec![flaky.clone(), plain.clone()]));
    let any_of = |names: &[&str]| LaneFilter {
        assignees: Some(names.iter().map(|name| (*name).to_owned()).collect()),
        ..LaneFilter::default()
    };
    assert_eq!(
        ids(any_of(&["coder", ""])),
        (4, vec![flaky, percent, plain.clone(), under]),
        "\"\" is a card with no assignee"
    );
    assert_eq!(ids(any_of(&["writer"])), (1, vec![notes]));
    assert_eq!(ids(any_of(&[])), (0, Vec::new()));
    let second = board.lane_page(ready, &acme, 1, 1).unwrap();
    assert_eq!(
        (
            second.count,
            second.more,
            second.cards.len(),
            second.cards[0].id.as_str()
        ),
        (2, false, 1, plain.as_str())
    );
    let blocked = board
        .lane_page(Lane::Status(TaskStatus::Blocked), &acme, 10, 0)
        .unwrap();
    assert_eq!((blocked.count, blocked.cards.len()), (0, 0));
}

/// What a dispatcher says of itself is kept, one row per host, the latest
/// first; its tick durations add up per bucket whatever it says.
pub fn each_host_s_dispatcher_report_is_kept_and_its_ticks_add_up<
    B: DispatchBoard + BoardAdmin + LanePages,
>(
    board: &B,
    time: &VirtualClock,
) {
    use kanban_core::{DispatcherReport, DispatcherState, TICK_BUCKETS_MS, TickDurations};
    let mut ticks = TickDurations::default();
    for ms in [3, 3, 6000] {
        ticks.observe(ms);
    }
    let report = |host: &str, in_flight: u64, state: DispatcherState| DispatcherReport {
        host: host.to_owned(),
        ticks: ticks.clone(),
        in_flight,
        state,
    };
    block_on(board.report_dispatcher(&report("h1", 2, DispatcherState::Claiming))).unwrap();
    time.advance(5);
    block_on(board.report_dispatcher(&report(
        "h2",
        0,
        DispatcherState::Paused("the disk is full\0".to_owned()),
    )))
    .unwrap();
    let seen = board.dispatchers().unwrap();
    let said: Vec<_> = seen
        .iter()
        .map(|d| {
            (
                d.host.as_str(),
                d.in_flight,
                d.state.as_str(),
                d.why.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        said,
        vec![
            ("h2", 0, "paused", Some("the disk is full\u{FFFD}")),
            ("h1", 2, "claiming", None)
        ]
    );
    assert_eq!(seen[0].reported_at, seen[1].reported_at + 5);
    time.advance(5);
    block_on(board.report_dispatcher(&report(
        "h2",
        1,
        DispatcherState::Halted("no agent coder".to_owned()),
    )))
    .unwrap();
    block_on(board.report_dispatcher(&report("h2", 0, DispatcherState::Stopped))).unwrap();
    let seen = board.dispatchers().unwrap();
    assert_eq!(seen.len(), 2, "one row per host");
    assert_eq!(
        (
            seen[0].host.as_str(),
            seen[0].state.as_str(),
            seen[0].why.as_deref()
        ),
        ("h2", "stopped", None),
        "the latest report replaces the host's last"
    );
    let stats = LanePages::stats(board).unwrap();
    let mut buckets = vec![0; TICK_BUCKETS_MS.len() + 1];
    buckets[1] = 8;
    buckets[10] = 4;
    assert_eq!(stats.tick_buckets, buckets);
    assert_eq!(stats.tick_sum_ms, 24_024);
}

/// An edit moves a card's workspace before its run, and back to a
/// scratch folder of its own; a running card keeps its own.
pub fn a_card_s_workspace_is_edited_before_its_run<B: BoardAdmin>(board: &B, _time: &VirtualClock) {
    use kanban_core::rules::{CardEdit, WorkspaceEdit};
    use kanban_core::workspaces::{WorkspaceKind, WorkspaceSpec};
    let to = |kind, path: Option<&str>, branch: Option<&str>| CardEdit {
        workspace: Some(WorkspaceEdit {
            spec: WorkspaceSpec {
                kind,
                path: path.map(str::to_owned),
            },
            branch: branch.map(str::to_owned),
        }),
        ..CardEdit::default()
    };
    let id = create(board, &task("ship the parser"));
    block_on(board.edit(
        &id,
        &to(
            WorkspaceKind::Worktree,
            Some("/srv/repo"),
            Some("wt/parser"),
        ),
    ))
    .unwrap();
    let card = block_on(board.show_task(&id)).unwrap().task;
    assert_eq!(
        (
            card.workspace_kind(),
            card.workspace_path(),
            card.branch_name()
        ),
        ("worktree", Some("/srv/repo"), Some("wt/parser"))
    );
    block_on(board.edit(&id, &to(WorkspaceKind::Scratch, None, None))).unwrap();
    let card = block_on(board.show_task(&id)).unwrap().task;
    assert_eq!(card.workspace, None, "a scratch folder of its own again");
    claim(board, &id, "host:1");
    let refused = block_on(board.edit(&id, &to(WorkspaceKind::Dir, Some("/srv/x"), None)));
    assert!(
        matches!(refused, Err(BoardError::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(block_on(board.show_task(&id)).unwrap().task.workspace, None);
}
