//! The agent protocol's result line: any stdout and exit settle to a turn
//! outcome without a panic.
#![no_main]

use kanban_agent_port::{AgentExit, parse_result_line, settle_turn};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else { return };
    let stdout = String::from_utf8_lossy(rest);
    let _ = parse_result_line(&stdout);
    let exit = match selector % 4 {
        0 => AgentExit::Code(0),
        1 => AgentExit::Code(75),
        2 => AgentExit::Code(i32::from(selector)),
        _ => AgentExit::Signal(9),
    };
    let outcome = settle_turn(&stdout, exit, "s");
    if let Ok(Some(result)) = outcome {
        assert!(result.session_id.is_some());
    }
    assert!(matches!(settle_turn(&stdout, AgentExit::Interrupted, "s"), Ok(Some(r)) if r.interrupted == Some(true)));
});
