use kanban_testkit::run_board_contract;

#[test]
fn sqlite_board_passes_the_board_contract() {
    let dirs = std::sync::Mutex::new(Vec::new());
    run_board_contract(|time| {
        let dir = tempfile::tempdir().unwrap();
        let board = crate::board_in(dir.path(), &time);
        dirs.lock().unwrap().push(dir); // keep every file alive until the end
        board
    });
}
