//! The lease proof's evaluation, one row per way a claim stops being live:
//! the same matrix the seed's `worker_claim_is_live` walks, in memory.

use kanban_core::lease::{LeaseView, RunLease, TaskLease, evaluate_lease, required_coordinates};
use kanban_core::{NotLive, ProofIdentity, ProofRequest};

const NOW: i64 = 1_000;
const PID: u32 = 4_242;

fn live() -> LeaseView {
    LeaseView {
        task: Some(TaskLease {
            status: "running".to_owned(),
            worker_pid: Some(i64::from(PID)),
            current_run_id: Some(7),
            claim_lock: Some("lk".to_owned()),
            claim_expires: Some(NOW + 60),
        }),
        run: Some(RunLease {
            ended_at: None,
            worker_pid: Some(i64::from(PID)),
            claim_expires: Some(NOW + 60),
        }),
        newest_bound: Some((i64::from(PID), "lk".to_owned())),
    }
}

fn with_task(change: impl FnOnce(&mut TaskLease)) -> LeaseView {
    let mut view = live();
    if let Some(task) = view.task.as_mut() {
        change(task);
    }
    view
}

fn with_run(change: impl FnOnce(&mut RunLease)) -> LeaseView {
    let mut view = live();
    if let Some(run) = view.run.as_mut() {
        change(run);
    }
    view
}

#[test]
fn every_way_a_claim_stops_being_live() {
    let rows: Vec<(&str, LeaseView, Result<(), NotLive>)> = vec![
        ("live", live(), Ok(())),
        (
            "no task row",
            LeaseView {
                task: None,
                ..live()
            },
            Err(NotLive::TaskNotFound),
        ),
        (
            "released",
            with_task(|t| t.status = "ready".into()),
            Err(NotLive::NotRunning("ready".into())),
        ),
        (
            "another pid on the task",
            with_task(|t| t.worker_pid = Some(9)),
            Err(NotLive::PidMismatch { recorded: 9 }),
        ),
        (
            "no pid on the task",
            with_task(|t| t.worker_pid = None),
            Ok(()),
        ),
        (
            "no run pointer",
            with_task(|t| t.current_run_id = None),
            Err(NotLive::NoRunPointer),
        ),
        (
            "moved to another run",
            with_task(|t| t.current_run_id = Some(8)),
            Err(NotLive::RunMoved { current: 8 }),
        ),
        (
            "another lock",
            with_task(|t| t.claim_lock = Some("other".into())),
            Err(NotLive::LockMismatch),
        ),
        (
            "no lock",
            with_task(|t| t.claim_lock = None),
            Err(NotLive::LockMismatch),
        ),
        (
            "no task lease",
            with_task(|t| t.claim_expires = None),
            Err(NotLive::TaskLeaseMissing),
        ),
        (
            "task lease expired",
            with_task(|t| t.claim_expires = Some(NOW - 1)),
            Err(NotLive::TaskLeaseExpired {
                expires: NOW - 1,
                now: NOW,
            }),
        ),
        (
            "task lease ends now",
            with_task(|t| t.claim_expires = Some(NOW)),
            Ok(()),
        ),
        (
            "no run row",
            LeaseView {
                run: None,
                ..live()
            },
            Err(NotLive::RunNotFound),
        ),
        (
            "run closed",
            with_run(|r| r.ended_at = Some(NOW - 5)),
            Err(NotLive::RunClosed),
        ),
        (
            "another pid on the run",
            with_run(|r| r.worker_pid = Some(9)),
            Err(NotLive::RunPidMismatch { recorded: 9 }),
        ),
        (
            "no pid on the run",
            with_run(|r| r.worker_pid = None),
            Ok(()),
        ),
        (
            "no run lease",
            with_run(|r| r.claim_expires = None),
            Err(NotLive::RunLeaseMissing),
        ),
        (
            "run lease expired",
            with_run(|r| r.claim_expires = Some(NOW - 1)),
            Err(NotLive::RunLeaseExpired {
                expires: NOW - 1,
                now: NOW,
            }),
        ),
        (
            "run lease ends now",
            with_run(|r| r.claim_expires = Some(NOW)),
            Ok(()),
        ),
    ];
    for (name, view, expected) in rows {
        assert_eq!(
            evaluate_lease(&view, "7", "lk", ProofIdentity::Process(PID), NOW),
            expected,
            "{name}"
        );
    }
    // The carrier's text is compared trimmed, as the seed strips it.
    assert_eq!(
        evaluate_lease(&live(), " 7 ", " lk ", ProofIdentity::Process(PID), NOW),
        Ok(())
    );
}

#[test]
fn only_a_process_identity_checks_pids_and_only_an_owner_checks_the_binding() {
    let other_pids = with_run(|r| r.worker_pid = Some(9));
    let other_pids = LeaseView {
        task: with_task(|t| t.worker_pid = Some(9)).task,
        ..other_pids
    };
    assert_eq!(
        evaluate_lease(&other_pids, "7", "lk", ProofIdentity::AnyProcess, NOW),
        Ok(())
    );
    assert_eq!(
        evaluate_lease(&other_pids, "7", "lk", ProofIdentity::BoundOwner(PID), NOW),
        Ok(()),
        "the owner side proves its identity by the binding, not the recorded pid"
    );
    for (name, bound) in [
        ("no binding", None),
        ("bound to another pid", Some((9, "lk".to_owned()))),
        (
            "bound under another lock",
            Some((i64::from(PID), "other".to_owned())),
        ),
    ] {
        let view = LeaseView {
            newest_bound: bound,
            ..live()
        };
        assert_eq!(
            evaluate_lease(&view, "7", "lk", ProofIdentity::BoundOwner(PID), NOW),
            Err(NotLive::NotBound),
            "{name}"
        );
        assert_eq!(
            evaluate_lease(&view, "7", "lk", ProofIdentity::Process(PID), NOW),
            Ok(()),
            "{name}: a worker's own proof does not read the binding"
        );
    }
}

#[test]
fn a_missing_coordinate_fails_before_any_board_is_read() {
    let full = ProofRequest {
        task_id: Some("t_1".into()),
        db: Some("/b.db".into()),
        run_id: Some("7".into()),
        claim_lock: Some(" lk ".into()),
    };
    assert_eq!(required_coordinates(&full), Ok(("t_1", "/b.db", "7", "lk")));
    type Change = fn(&mut ProofRequest);
    let cases: [(Change, NotLive); 4] = [
        (|r| r.task_id = Some("  ".into()), NotLive::NoTaskId),
        (|r| r.db = None, NotLive::NoBoard),
        (|r| r.run_id = Some(String::new()), NotLive::NoRunId),
        (|r| r.claim_lock = None, NotLive::NoClaimLock),
    ];
    for (change, reason) in cases {
        let mut request = full.clone();
        change(&mut request);
        assert_eq!(required_coordinates(&request), Err(reason));
    }
}
