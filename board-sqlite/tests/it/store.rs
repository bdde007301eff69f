//! The file's transactions as SQLite sees them: how each commit is synced,
//! and which statements are prepared (an authorizer hears every
//! preparation, a commit hook every commit).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kanban_board_sqlite::SqliteBoard;
use kanban_core::{
    Board, BoardAdmin, BookingKind, Claim, ClaimFilter, DispatchBoard, ExitCode, ExitWitness,
    NewTask, TaskStatus, WorkerProcess, WorkerResult,
};
use kanban_testkit::board_contract::{exit_report, worker_result};
use kanban_testkit::{VirtualClock, block_on};
use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

fn board_with(cards: usize) -> SqliteBoard {
    let board = SqliteBoard::open_in_memory(Arc::new(VirtualClock::at(1_700_000_000))).unwrap();
    for n in 0..cards {
        let title = format!("card {n}");
        block_on(board.create_task(&NewTask {
            title,
            ..NewTask::default()
        }))
        .unwrap();
    }
    board
}

fn claim(board: &SqliteBoard, lock: &str) -> Claim {
    block_on(board.claim_ready_batch(600, &[lock.to_owned()], &ClaimFilter::any()))
        .unwrap()
        .remove(0)
        .claim
}

/// How each commit from now on is synced: the last `synchronous` set before
/// it (the authorizer hears a pragma as it is prepared, and a pragma runs as
/// soon as it is prepared).
fn record_commits(board: &SqliteBoard) -> Arc<Mutex<Vec<String>>> {
    let setting = Arc::new(Mutex::new("FULL".to_owned()));
    let commits = Arc::new(Mutex::new(Vec::new()));
    let (seen, booked) = (setting.clone(), commits.clone());
    board.engine().with_connection(|conn| {
        conn.authorizer(Some(move |context: AuthContext<'_>| {
            if let AuthAction::Pragma {
                pragma_name: "synchronous",
                pragma_value: Some(value),
            } = context.action
            {
                *seen.lock().unwrap() = value.to_owned();
            }
            Authorization::Allow
        }))
        .unwrap();
        conn.commit_hook(Some(move || {
            booked.lock().unwrap().push(setting.lock().unwrap().clone());
            false
        }))
        .unwrap();
    });
    commits
}

#[test]
fn a_record_s_commit_is_unsynced_and_only_its_own() {
    let board = board_with(1);
    let run = claim(&board, "host:1:a");
    let commits = record_commits(&board);
    block_on(board.heartbeat(&run, None)).unwrap();
    // A record that fails changes nothing, and leaves the next commit synced.
    let stranger = Claim {
        claim_lock: "host:1:other".to_owned(),
        ..run.clone()
    };
    assert!(
        block_on(board.book_result(&stranger, &worker_result(&stranger, ExitCode::Success)))
            .is_err()
    );
    block_on(board.complete(&run, "done", None)).unwrap();
    assert_eq!(*commits.lock().unwrap(), ["NORMAL", "FULL"]);
}

#[test]
fn a_settled_run_s_exit_is_booked_unsynced_and_a_crash_synced() {
    let board = board_with(2);
    let commits = record_commits(&board);
    let booked = |claim: &Claim, code: i32| {
        commits.lock().unwrap().clear();
        let booking =
            block_on(board.book_exit(claim, &exit_report(ExitWitness::Code(code)))).unwrap();
        (booking.kind, commits.lock().unwrap().clone())
    };
    let settled = claim(&board, "host:1:a");
    block_on(board.complete(&settled, "done", None)).unwrap();
    assert_eq!(
        booked(&settled, 0),
        (BookingKind::Settled, vec!["NORMAL".to_owned()]),
        "a settled run's exit is a record, left to the next synced commit"
    );
    let crashed = claim(&board, "host:1:b");
    assert_eq!(
        booked(&crashed, 3),
        (BookingKind::Crashed, vec!["FULL".to_owned()]),
        "a crash changes the card: its booking is synced, and only it commits"
    );
    let status = block_on(board.show_task(&crashed.task_id))
        .unwrap()
        .task
        .status;
    assert_eq!(
        status,
        TaskStatus::Ready,
        "the crash was booked once, synced"
    );
}

/// Counts the statements prepared from now on (not transactions or
/// pragmas: `BEGIN` and a record's `synchronous` are parsed each time by
/// design).
fn count_preparations(board: &SqliteBoard) -> Arc<AtomicUsize> {
    let prepared = Arc::new(AtomicUsize::new(0));
    let counter = prepared.clone();
    board.engine().with_connection(|conn| {
        conn.authorizer(Some(move |context: AuthContext<'_>| {
            if !matches!(
                context.action,
                AuthAction::Transaction { .. } | AuthAction::Pragma { .. }
            ) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Authorization::Allow
        }))
        .unwrap();
    });
    prepared
}

#[test]
fn a_statement_used_again_is_not_prepared_again() {
    let board = board_with(0);
    let prepared = count_preparations(&board);
    let statements: Vec<String> = (0..128).map(|n| format!("SELECT {n}")).collect();
    let round = || {
        board.engine().with_connection(|conn| {
            for sql in &statements {
                let value: i64 = conn
                    .prepare_cached(sql)
                    .unwrap()
                    .query_row([], |row| row.get(0))
                    .unwrap();
                assert_eq!(sql, &format!("SELECT {value}"));
            }
        });
        prepared.load(Ordering::Relaxed)
    };
    let first = round();
    assert!(first >= 128, "{first} preparations");
    assert_eq!(round(), first, "the second round prepared again");
}

/// Every board call a dispatched card costs, once the statements are warm,
/// runs on statements already prepared. SQLite re-prepares a cached
/// statement on its next step when a value bound to it may change its plan
/// (a bound `LIMIT`, say): the cache then saves nothing.
#[test]
fn a_dispatched_card_s_calls_prepare_nothing_once_warm() {
    let board = board_with(4);
    let prepared = count_preparations(&board);
    let card = |n: u32| {
        block_on(board.running_workers()).unwrap();
        block_on(board.promote_ready()).unwrap();
        let claim = claim(&board, &format!("host:1:{n}"));
        let pid = 1000 + n;
        let process = WorkerProcess {
            pid,
            started_at: Some(i64::from(n)),
            seal_digest: None,
        };
        block_on(board.record_spawn(&claim, &process)).unwrap();
        block_on(board.show_task(&claim.task_id)).unwrap();
        block_on(board.bind_worker(&claim, pid)).unwrap();
        block_on(board.complete(&claim, "done", None)).unwrap();
        let result = WorkerResult {
            pid,
            ..worker_result(&claim, ExitCode::Success)
        };
        block_on(board.book_result(&claim, &result)).unwrap();
        block_on(board.book_exit(&claim, &exit_report(ExitWitness::Code(0)))).unwrap();
        prepared.swap(0, Ordering::Relaxed)
    };
    // The first two cards warm the cache; from the third on, nothing is
    // prepared again.
    assert!(card(1) > 0, "the authorizer saw no preparation");
    card(2);
    assert_eq!(card(3), 0, "the third card prepared statements");
    assert_eq!(card(4), 0, "the fourth card prepared statements");
}
