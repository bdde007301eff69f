//! JSON inputs of `kanban mcp` (JSON-RPC lines and tool arguments) against a
//! board holding one claimed card: every line gets a response or none, and a
//! rejected call leaves the board unchanged.
#![no_main]

use std::sync::Arc;

use kanban_agent_port::{BoardTools, McpServer};
use kanban_core::{BoardAdmin, NewTask};
use kanban_board_sqlite::SqliteBoard;
use kanban_testkit::{VirtualClock, block_on, memory_board};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    server: McpServer,
    board: SqliteBoard,
    task_id: String,
}

/// A fresh board with one claimed card for every input: accepted writes
/// must not pile up across inputs.
fn fixture() -> Fixture {
    let board = memory_board(Arc::new(VirtualClock::at(1_000)));
    let task_id = block_on(board.create_task(&NewTask { title: "fuzzed".into(), ..NewTask::default() })).unwrap();
    let claim = block_on(board.claim_task(&task_id, 900, "fuzz")).unwrap().unwrap().claim;
    let server = McpServer::new(BoardTools::new(Arc::new(board.clone()), claim, "fuzz"));
    Fixture { server, board, task_id }
}

fuzz_target!(|data: &[u8]| {
    let fixture = &fixture();
    let line = String::from_utf8_lossy(data);
    let before = block_on(fixture.board.show_task(&fixture.task_id)).unwrap();
    if let Some(answer) = block_on(fixture.server.handle_line(&line)) {
        let answer: serde_json::Value = serde_json::from_str(&answer).expect("every answer is JSON");
        let rejected = answer.get("error").is_some() || answer.pointer("/result/isError") == Some(&serde_json::Value::Bool(true));
        let after = block_on(fixture.board.show_task(&fixture.task_id)).unwrap();
        if rejected {
            assert_eq!(before.task, after.task, "a rejected call changed the card");
            assert_eq!(before.runs, after.runs, "a rejected call changed a run");
            assert_eq!(before.events.len(), after.events.len(), "a rejected call wrote an event");
        }
    }
});
