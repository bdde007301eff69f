pub fn run_board_contract() {}
