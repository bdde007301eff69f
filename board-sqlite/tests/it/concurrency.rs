//! Concurrency on real files: racing threads, then racing processes.

use std::sync::{Arc, Barrier};

use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::{Board, BoardAdmin, DispatchBoard, NewTask, TaskStatus};
use kanban_testkit::block_on;

#[test]
fn threads_racing_for_one_task_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    let board = SqliteBoard::create(&path, Arc::new(SystemClock)).unwrap();
    for round in 0..5 {
        let id = block_on(board.create_task(&NewTask {
            title: format!("contested {round}"),
            ..NewTask::default()
        }))
        .unwrap();
        let racers = 6;
        let barrier = Arc::new(Barrier::new(racers));
        let handles: Vec<_> = (0..racers)
            .map(|racer| {
                let (path, id, barrier) = (path.clone(), id.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let own = SqliteBoard::open(&path, Arc::new(SystemClock)).unwrap();
                    barrier.wait();
                    block_on(own.claim_task(&id, 900, &format!("racer:{racer}")))
                        .unwrap()
                        .is_some()
                })
            })
            .collect();
        let winners = handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|won| *won)
            .count();
        assert_eq!(winners, 1, "round {round}: exactly one racer wins");
        assert_eq!(block_on(board.show_task(&id)).unwrap().runs.len(), 1);
    }
}

/// The child half of the multi-process test: claims and completes cards
/// until none is left, and reports how many.
fn child_claim_complete_loop(path: &str, worker: &str) {
    let board = SqliteBoard::open(path, Arc::new(SystemClock)).expect("child opens the board");
    // Start together, so that the processes really race.
    let go = std::path::Path::new(path).with_extension("go");
    while !go.exists() {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let mut done = 0;
    while let Some(grant) =
        block_on(board.claim_next_ready(900, worker, &kanban_core::ClaimFilter::any()))
            .expect("a claim never errors")
    {
        // An agent works between the claim and the terminal call.
        std::thread::sleep(std::time::Duration::from_millis(3));
        block_on(board.heartbeat(&grant.claim, None)).expect("heartbeat on our own claim");
        block_on(board.complete(&grant.claim, &format!("by {worker}"), None))
            .expect("complete on our own claim");
        done += 1;
    }
    println!("KANBAN_CHILD_DONE={done}");
}

/// Four processes race to claim and complete 300 cards. The test runs its
/// own binary again, once per racer: a racer is this very test with the
/// board named in its environment.
#[test]
fn processes_running_claim_complete_cycles_never_double_claim() {
    match (
        std::env::var("KANBAN_TEST_CHILD_BOARD"),
        std::env::var("KANBAN_TEST_CHILD_NAME"),
    ) {
        (Ok(path), Ok(worker)) => child_claim_complete_loop(&path, &worker),
        _ => race_processes(),
    }
}

fn race_processes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    let board = SqliteBoard::create(&path, Arc::new(SystemClock)).unwrap();
    let cards = 300;
    for n in 0..cards {
        block_on(board.create_task(&NewTask {
            title: format!("card {n}"),
            priority: n % 3,
            ..NewTask::default()
        }))
        .unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|n| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "concurrency::processes_running_claim_complete_cycles_never_double_claim",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("KANBAN_TEST_CHILD_BOARD", &path)
                .env("KANBAN_TEST_CHILD_NAME", format!("proc:{n}"))
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect::<Vec<_>>();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(path.with_extension("go"), b"").unwrap();
    let children: Vec<_> = children
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect();
    let mut total = 0;
    let mut reports = Vec::new();
    for output in children {
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "a child failed (a busy error escaped?):\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let done: usize = stdout
            .lines()
            .find_map(|line| line.split("KANBAN_CHILD_DONE=").nth(1))
            .unwrap_or_else(|| panic!("the child did not report:\n{stdout}"))
            .parse()
            .unwrap();
        total += done;
        reports.push(done);
    }
    assert_eq!(
        total, cards as usize,
        "every card was completed exactly once"
    );
    assert!(
        reports.iter().filter(|done| **done > 0).count() >= 2,
        "the processes really raced: {reports:?}"
    );
    for task in block_on(board.list_tasks(None)).unwrap() {
        assert_eq!(task.status, TaskStatus::Done, "{}", task.id);
        let view = block_on(board.show_task(&task.id)).unwrap();
        assert_eq!(view.runs.len(), 1, "{}: claimed once", task.id);
        assert_eq!(
            view.events
                .iter()
                .filter(|e| e.kind == "stale_write_rejected")
                .count(),
            0
        );
    }
}
