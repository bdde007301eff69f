//! The board as a state machine (`kanban_testkit::board_machine`), the
//! same machine SQLite's boards pass, each case on a fresh database.

use kanban_testkit::board_machine::{BoardMachine, FreshBoard};
use kanban_testkit::{TempPgBoard, VirtualClock};
use proptest::prelude::*;
use proptest_state_machine::prop_state_machine;

struct OnPostgres;

impl FreshBoard for OnPostgres {
    type Board = kanban_board_postgres::PgBoard;
    type Held = TempPgBoard;
    fn fresh(time: &VirtualClock) -> TempPgBoard {
        TempPgBoard::new(time.clone())
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 2048, ..ProptestConfig::default() })]

    #[test]
    fn a_postgres_board_matches_the_model(sequential 1..48 => BoardMachine<OnPostgres>);
}
