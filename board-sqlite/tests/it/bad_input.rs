//! Bad board files: each refused with an error naming the file and the fix,
//! each left exactly as it was.

use std::sync::Arc;

use kanban_board_sqlite::{SCHEMA_VERSION, SqliteBoard};
use kanban_core::BoardError;
use kanban_testkit::VirtualClock;

fn clock() -> Arc<VirtualClock> {
    Arc::new(VirtualClock::at(1_000))
}

#[test]
fn a_board_path_that_does_not_exist_is_named_and_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.db");
    let error = SqliteBoard::open(&path, clock()).unwrap_err();
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("kanban init"),
        "the fix is named: {message}"
    );
    assert!(!path.exists(), "opening never creates a board");
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.db");
    let bytes = b"these are my notes, not a board. please do not overwrite them.\n".repeat(4);
    std::fs::write(&path, &bytes).unwrap();
    for error in [
        SqliteBoard::open(&path, clock()).unwrap_err(),
        SqliteBoard::create(&path, clock()).unwrap_err(),
    ] {
        let message = error.to_string();
        assert!(matches!(error, BoardError::Unusable { .. }), "{error:?}");
        assert!(
            message.contains("notes.db") && message.contains("not a SQLite board"),
            "{message}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn a_board_from_a_newer_version_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    drop(SqliteBoard::create(&path, clock()).unwrap());
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1))
            .unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let error = SqliteBoard::open(&path, clock()).unwrap_err();
    assert!(matches!(error, BoardError::NewerSchema { .. }), "{error:?}");
    assert!(error.to_string().contains("upgrade kanban"), "{error}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[test]
fn reopening_a_board_keeps_its_cards_and_migrates_nothing_twice() {
    use kanban_core::{BoardAdmin, NewTask};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    let board = SqliteBoard::create(&path, clock()).unwrap();
    let id = kanban_testkit::block_on(board.create_task(&NewTask {
        title: "keep me".into(),
        ..Default::default()
    }))
    .unwrap();
    drop(board);
    let board = SqliteBoard::open(&path, clock()).unwrap();
    let view = kanban_testkit::block_on(board.show_task(&id)).unwrap();
    assert_eq!(view.task.title, "keep me");
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

#[test]
fn a_missing_folder_is_created_for_a_new_board_but_named_when_it_cannot_be() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b/kanban.db");
    SqliteBoard::create(&nested, clock()).unwrap();
    assert!(nested.is_file());
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let error = SqliteBoard::create(blocker.join("kanban.db"), clock()).unwrap_err();
    assert!(error.to_string().contains("cannot be created"), "{error}");
}

#[test]
fn a_board_of_schema_version_1_is_migrated_in_place() {
    use kanban_core::{BoardAdmin, NewTask};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    {
        // A version-1 board, as the first release wrote it, with one card.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(kanban_board_sqlite_schema_v1()).unwrap();
        conn.execute_batch(
            "INSERT INTO tasks (id, title, status, created_at) VALUES ('t_old', 'from v1', 'ready', 1);
             PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let board = SqliteBoard::open(&path, clock()).unwrap();
    let view = kanban_testkit::block_on(board.show_task("t_old")).unwrap();
    assert_eq!(view.task.title, "from v1");
    let version: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let id = kanban_testkit::block_on(board.create_task(&NewTask {
        title: "new".into(),
        ..Default::default()
    }))
    .unwrap();
    assert!(kanban_testkit::block_on(board.show_task(&id)).is_ok());
}

/// The tables of schema version 1, as written by migration 1.
fn kanban_board_sqlite_schema_v1() -> &'static str {
    kanban_board_sqlite::MIGRATIONS[0]
}

#[test]
fn cards_with_ids_no_kanban_writes_at_the_head_of_the_lane_do_not_stop_a_batch() {
    use kanban_core::{BoardAdmin, ClaimFilter, DispatchBoard, NewTask, TaskStatus};
    use kanban_testkit::block_on;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    let board = SqliteBoard::create(&path, clock()).unwrap();
    let add = |title: &str, priority: i64| {
        block_on(board.create_task(&NewTask {
            title: title.into(),
            priority,
            ..NewTask::default()
        }))
        .unwrap()
    };
    // Another program's rows, first in claim order.
    for (n, id) in [add("foreign 1", 9), add("foreign 2", 9)]
        .iter()
        .enumerate()
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE tasks SET id = ?1 WHERE id = ?2",
            (format!("../foreign-{n}"), id),
        )
        .unwrap();
    }
    let ours = [add("ours 1", 0), add("ours 2", 0)];
    let locks = ["h:1".to_owned(), "h:2".to_owned()];
    let grants = block_on(board.claim_ready_batch(300, &locks, &ClaimFilter::any())).unwrap();
    let claimed: Vec<&str> = grants
        .iter()
        .map(|grant| grant.claim.task_id.as_str())
        .collect();
    assert_eq!(claimed, [ours[0].as_str(), ours[1].as_str()]);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let untouched: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM tasks WHERE id LIKE '../%' AND status = 'ready' AND claim_lock IS NULL",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(untouched, 2, "passed over and left as they were");
    assert!(
        ours.iter()
            .all(|id| block_on(board.show_task(id)).unwrap().task.status == TaskStatus::Running)
    );
}

#[test]
fn a_card_held_on_a_board_of_schema_version_6_is_parked_where_neither_system_claims_it() {
    use kanban_core::{BoardAdmin, TaskStatus};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kanban.db");
    {
        // A version-6 board, where a held card kept its lane.
        let conn = rusqlite::Connection::open(&path).unwrap();
        for migration in &kanban_board_sqlite::MIGRATIONS[..6] {
            conn.execute_batch(migration).unwrap();
        }
        conn.execute_batch(
            "INSERT INTO tasks (id, title, status, created_at, held_reason)
                  VALUES ('t_held1', 'held ready', 'ready', 1, 'a key'),
                         ('t_held2', 'held todo', 'todo', 1, 'a key'),
                         ('t_free1', 'not held', 'ready', 1, NULL),
                         ('t_done1', 'held, then done', 'done', 1, 'a key');
             PRAGMA user_version = 6;",
        )
        .unwrap();
    }
    let board = SqliteBoard::open(&path, clock()).unwrap();
    let status = |id: &str| {
        kanban_testkit::block_on(board.show_task(id))
            .unwrap()
            .task
            .status
    };
    assert_eq!(status("t_held1"), TaskStatus::Scheduled);
    assert_eq!(status("t_held2"), TaskStatus::Scheduled);
    assert_eq!(status("t_free1"), TaskStatus::Ready);
    assert_eq!(status("t_done1"), TaskStatus::Done);
    // Released, it goes back in line.
    kanban_testkit::block_on(board.release_hold("t_held1")).unwrap();
    assert_eq!(status("t_held1"), TaskStatus::Ready);
}
