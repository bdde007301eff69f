//! The board as a state machine (`kanban_testkit::board_machine`), on a
//! board file and on a board in memory.

use kanban_testkit::board_machine::{BoardMachine, FreshBoard};
use kanban_testkit::{TempBoard, VirtualClock};
use proptest::prelude::*;
use proptest_state_machine::prop_state_machine;

struct OnFile;
struct InMemory;

impl FreshBoard for OnFile {
    type Board = kanban_board_sqlite::SqliteBoard;
    type Held = TempBoard;
    fn fresh(time: &VirtualClock) -> TempBoard {
        TempBoard::file(time.clone())
    }
}

impl FreshBoard for InMemory {
    type Board = kanban_board_sqlite::SqliteBoard;
    type Held = TempBoard;
    fn fresh(time: &VirtualClock) -> TempBoard {
        TempBoard::memory(time.clone())
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2048, ..ProptestConfig::default() })]

    #[test]
    fn a_board_file_matches_the_model(sequential 1..48 => BoardMachine<OnFile>);

    #[test]
    fn a_board_in_memory_matches_the_model(sequential 1..48 => BoardMachine<InMemory>);
}
