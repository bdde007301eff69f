//! The board contract, one test per clause, on a board file and in memory.

mod on_a_file {
    kanban_testkit::board_contract_tests!(kanban_testkit::TempBoard::file);
}

mod in_memory {
    kanban_testkit::board_contract_tests!(kanban_testkit::TempBoard::memory);
}
