//! The shared board's admin moves and listings, read back through the
//! board itself: what `ls`, `show`, the web board and the metrics rely on.

use std::sync::Arc;

use kanban_board_sqlite::SqliteBoard;
use kanban_core::rules::{CardEdit, Change};
use kanban_core::{Board, BoardAdmin, ClaimFilter, DispatchBoard, NewTask, TaskStatus};
use kanban_testkit::{VirtualClock, block_on};

const START: i64 = 1_000_000;

fn board() -> (SqliteBoard, VirtualClock, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let time = VirtualClock::at(START);
    let board = SqliteBoard::create(dir.path().join("kanban.db"), Arc::new(time.clone())).unwrap();
    (board, time, dir)
}

fn add(board: &SqliteBoard, title: &str) -> String {
    block_on(board.create_task(&NewTask {
        title: title.into(),
        ..NewTask::default()
    }))
    .unwrap()
}

fn status(board: &SqliteBoard, id: &str) -> TaskStatus {
    block_on(board.show_task(id))
        .unwrap()
        .task
        .status
        .known()
        .unwrap()
}

#[test]
fn admin_moves_change_the_card_they_name_and_say_so() {
    let (board, time, _dir) = board();
    let cancelled = add(&board, "cancelled");
    let archived = add(&board, "archived");
    let edited = add(&board, "edited");
    let other = add(&board, "untouched");
    block_on(board.cancel(&cancelled, "not needed")).unwrap();
    assert_ne!(status(&board, &cancelled), TaskStatus::Ready);
    block_on(board.archive(&archived)).unwrap();
    assert_eq!(status(&board, &archived), TaskStatus::Archived);
    block_on(board.edit(
        &edited,
        &CardEdit {
            title: Some("renamed".into()),
            priority: Some(7),
            assignee: Change::Set("ann".into()),
            ..CardEdit::default()
        },
    ))
    .unwrap();
    let card = block_on(board.task(&edited)).unwrap().unwrap();
    assert_eq!(
        (card.title.as_str(), card.priority, card.assignee.as_deref()),
        ("renamed", 7, Some("ann"))
    );
    time.advance(5);
    block_on(board.add_comment(&other, "ann", "looks right")).unwrap();
    let view = block_on(board.show_task(&other)).unwrap();
    assert_eq!(view.comments.len(), 1);
    assert_eq!(status(&board, &other), TaskStatus::Ready);
    let last = block_on(board.last_events(&[other.clone(), edited.clone()])).unwrap();
    assert_eq!(last[&other], ("commented".to_owned(), START + 5));
    assert_eq!(last[&edited].1, START);
    assert_eq!(block_on(board.task("t_nowhere")).unwrap(), None);
    assert_eq!(block_on(board.audit()).unwrap(), Vec::<String>::new());
}

#[test]
fn pruning_deletes_old_finished_cards_unless_it_is_a_dry_run() {
    let (board, time, _dir) = board();
    let old = add(&board, "old");
    let kept = add(&board, "kept");
    block_on(board.archive(&old)).unwrap();
    time.advance(100);
    let found = block_on(board.prune(START + 50, true)).unwrap();
    assert_eq!(found, vec![old.clone()]);
    assert!(
        block_on(board.task(&old)).unwrap().is_some(),
        "a dry run deletes nothing"
    );
    assert_eq!(
        block_on(board.prune(START + 50, false)).unwrap(),
        vec![old.clone()]
    );
    assert_eq!(block_on(board.task(&old)).unwrap(), None);
    assert!(block_on(board.task(&kept)).unwrap().is_some());
}

#[test]
fn listings_page_lanes_and_count_the_board() {
    let (board, time, _dir) = board();
    let ids: Vec<String> = (0..3)
        .map(|n| {
            time.advance(1);
            add(&board, &format!("card {n}"))
        })
        .collect();
    let grant = block_on(board.claim_next_ready(300, "h:1", &ClaimFilter::any()))
        .unwrap()
        .unwrap();
    assert_eq!(grant.claim.task_id, ids[0]);
    let first = block_on(board.list_page(None, None, 2)).unwrap();
    assert_eq!(first.tasks.len(), 2);
    let next = block_on(board.list_page(None, first.next, 2)).unwrap();
    assert_eq!(next.tasks.len(), 1);
    assert_eq!(next.next, None);
    let (ready, shown) = block_on(board.lane(TaskStatus::Ready, 1)).unwrap();
    assert_eq!((ready, shown.len()), (2, 1));
    assert_eq!(shown[0].id, ids[1], "claim order");
    assert_eq!(
        (
            shown[0].held_reason.as_deref(),
            shown[0].last_failure_error.as_deref()
        ),
        (None, None)
    );
    let (unknown, none) = block_on(board.unknown_lane(5)).unwrap();
    assert_eq!((unknown, none.len()), (0, 0));
    let events = block_on(board.recent_events(2)).unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1].kind, "claimed", "newest last");
    let stats = block_on(board.stats()).unwrap();
    assert!(
        stats.cards_by_status.contains(&("ready".to_owned(), 2))
            && stats.cards_by_status.contains(&("running".to_owned(), 1)),
        "{:?}",
        stats.cards_by_status
    );
    assert!(
        block_on(board.prove_claim(&grant.claim, kanban_core::ProofIdentity::AnyProcess)).is_ok()
    );
}

#[test]
fn a_recurring_card_comes_back_with_all_its_fields() {
    let (board, _time, _dir) = board();
    let id = block_on(board.create_task(&NewTask {
        title: "weekly".into(),
        body: Some("the report".into()),
        assignee: Some("ann".into()),
        priority: 3,
        max_retries: Some(4),
        goal_mode: true,
        goal_max_turns: Some(6),
        max_runtime_seconds: Some(900),
        every_seconds: Some(3600),
        ..NewTask::default()
    }))
    .unwrap();
    let grant = block_on(board.claim_next_ready(300, "h:1", &ClaimFilter::any()))
        .unwrap()
        .unwrap();
    block_on(board.complete(&grant.claim, "sent", None)).unwrap();
    let next = block_on(board.list_tasks(None))
        .unwrap()
        .into_iter()
        .find(|card| card.id != id)
        .expect("the next occurrence");
    assert_eq!(
        (
            next.title.as_str(),
            next.body.as_deref(),
            next.assignee.as_deref(),
            next.priority,
            next.max_retries,
            next.goal_mode,
            next.goal_max_turns,
            next.max_runtime_seconds,
            next.every_seconds,
        ),
        (
            "weekly",
            Some("the report"),
            Some("ann"),
            3,
            Some(4),
            true,
            Some(6),
            Some(900),
            Some(3600)
        )
    );
}

#[test]
fn rows_another_program_wrote_show_in_their_own_lane_and_in_the_audit() {
    let (board, _time, dir) = board();
    let foreign = add(&board, "the seed system's");
    let broken = add(&board, "half written");
    let conn = rusqlite::Connection::open(dir.path().join("kanban.db")).unwrap();
    conn.execute(
        "UPDATE tasks SET status = 'icebox' WHERE id = ?1",
        [&foreign],
    )
    .unwrap();
    conn.execute(
        "UPDATE tasks SET claim_lock = 'h:1' WHERE id = ?1",
        [&broken],
    )
    .unwrap();
    let (count, cards) = block_on(board.unknown_lane(5)).unwrap();
    assert_eq!(count, 1);
    assert_eq!(cards[0].id, foreign);
    let violations = block_on(board.audit()).unwrap();
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert!(violations[0].contains(&broken), "{violations:?}");
}

#[test]
fn a_board_file_replaced_while_open_is_not_healthy() {
    let (board, _time, dir) = board();
    assert!(block_on(board.check_health()).is_ok());
    let path = dir.path().join("kanban.db");
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::rename(&copy, &path).unwrap();
    assert!(block_on(board.check_health()).is_err());
}

#[test]
fn the_system_clock_reads_the_epoch_and_a_monotonic_clock_that_moves() {
    use kanban_core::Clock;
    let clock = kanban_board::SystemClock;
    assert!(
        clock.now() > 1_700_000_000,
        "seconds since 1970: {}",
        clock.now()
    );
    let before = clock.monotonic_millis();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(clock.monotonic_millis() >= before + 20);
}

/// A view reads a big lane no further than its window: the count stops
/// there, and a filter searches only the window's cards (the lane's
/// first, in claim order).
#[test]
fn a_lane_is_counted_and_searched_within_its_window() {
    use kanban_board::{LANE_WINDOW, Lane, LaneFilter};
    let (board, _time, dir) = board();
    let path = dir.path().join("kanban.db");
    let cards = u64::try_from(LANE_WINDOW).unwrap() + 50;
    kanban_testkit::bulk_add_cards(&path, cards, kanban_testkit::BulkLanes::AllReady, START);
    let ready = Lane::Status(TaskStatus::Ready);
    let whole = block_on(board.lane_page(ready, &LaneFilter::default(), 100, 0)).unwrap();
    assert_eq!(
        (whole.count, whole.more, whole.cards.len()),
        (LANE_WINDOW, true, 100)
    );
    let last_page =
        block_on(board.lane_page(ready, &LaneFilter::default(), 100, LANE_WINDOW - 100)).unwrap();
    assert_eq!(last_page.cards.len(), 100);
    let text = |words: &str| LaneFilter {
        text: Some(words.to_owned()),
        ..LaneFilter::default()
    };
    // Card 4 is of the highest priority (card i has i % 5): inside the
    // window; the last card, of priority 0 and the newest, is past it.
    let inside = block_on(board.lane_page(ready, &text("card 4"), 100, 0)).unwrap();
    assert!(inside.more && inside.count > 0 && inside.cards.iter().any(|c| c.title == "card 4"));
    let past = block_on(board.lane_page(ready, &text(&format!("card {cards}")), 100, 0)).unwrap();
    assert_eq!(
        (past.count, past.more),
        (0, true),
        "searched within the window only"
    );
}
