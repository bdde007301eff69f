//! The seed's owner-side cases through core's orchestration, on a real
//! SQLite board with a real claim.

use kanban_testkit::seed_owner_cases;

#[test]
fn seed_owner_cases_on_a_real_board() {
    for case in seed_owner_cases() {
        let dir = tempfile::tempdir().unwrap();
        case.check(
            |time| crate::board_in(dir.path(), &time),
            |board, task_id, expires| {
                kanban_testkit::block_on(board.set_lease_expiry(task_id, expires)).unwrap()
            },
        );
    }
}
