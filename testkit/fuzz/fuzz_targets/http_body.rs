//! The HTTP agent's answer bodies, whole and streamed: a reply or a
//! readable error, never a panic.
#![no_main]

use kanban_agent_port::{parse_chat_completion, parse_chat_stream};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(error) = parse_chat_completion(&String::from_utf8_lossy(data)) {
        assert!(!error.is_empty());
    }
    if let Err(error) = parse_chat_stream(data) {
        assert!(!error.is_empty());
    }
});
