//! The in-memory board passes the same contract as the real one.

use std::sync::Arc;

use kanban_testkit::{InMemoryBoard, run_board_contract};

#[test]
fn in_memory_board_passes_the_board_contract() {
    run_board_contract(|time| InMemoryBoard::new(Arc::new(time)));
}
