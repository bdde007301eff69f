//! The goal judge's output: a verdict or a readable error, never a panic.
#![no_main]

use kanban_agent_port::parse_verdict;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Err(error) = parse_verdict(&text) {
        assert!(!error.0.is_empty());
    }
});
