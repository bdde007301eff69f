//! Agent adapters for the kanban worker.
//!
//! [`ExecAgent`] runs an agent command once per turn as a child process and
//! reads its turn result back (the protocol is in `docs/agent-protocol.md`).
//! [`HttpAgent`] speaks the OpenAI-compatible chat-completions API and
//! offers the board as function tools ([`BoardTools`], shared with `kanban mcp`).
//! The seed system's own worker (`hermes:PROFILE`) runs as an [`ExecAgent`]
//! with a [`SeedWorker`].
//! [`CommandJudge`] asks a judge command for a goal-mode verdict.

mod activity;
mod attachment_store;
mod exec;
mod http;
mod judge;
mod mcp;
mod oneshot;
mod protocol;
mod seed_worker;
mod tools;

pub use activity::Activity;
pub use attachment_store::{
    checked_content_type, discard_attachment, store_attachment, store_attachment_from,
};
pub use exec::{
    BRIEF_COMMENTS, EXIT_DRAIN, ExecAgent, ExecAgentConfig, FORWARD_LIMIT_BYTES, Forward,
    ProcessStat, STDOUT_TAIL_BYTES, SeedWorker, TaskBrief, own_children, process_stat,
};
pub use http::{HttpAgent, HttpAgentConfig, parse_chat_completion, parse_chat_stream};
pub use judge::{CommandJudge, parse_verdict};
pub use mcp::{
    MCP_MAX_LINE_BYTES, MCP_PROTOCOL_VERSION, MCP_PROTOCOL_VERSIONS, McpServer,
    unreadable_line_answer,
};
pub use oneshot::{ONE_SHOT_ANSWER_BYTES, OneShotCommand};
pub use protocol::{AgentExit, ResultLine, STDOUT_TAIL_CHARS, parse_result_line, settle_turn};
pub use seed_worker::{
    SEED_RATE_LIMIT_EXIT, SEED_WORKER_PREFIX, SeedWorkerTurn, seed_worker_args,
    seed_worker_profile, seed_worker_session, settle_seed_worker,
};
pub use tools::{BoardTools, ToolBoard, ToolOutcome, ToolSpec, board_tool_specs};
