//! The board contract, one test per clause, each on a database of its own.

kanban_testkit::board_contract_tests!(kanban_testkit::TempPgBoard::new);
