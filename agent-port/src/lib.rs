//! Agent adapters for the kanban worker.
//!
//! [`ExecAgent`] runs an agent command once per turn as a child process and
//! reads its turn result back (the protocol is in `docs/agent-protocol.md`).
//! [`CommandJudge`] asks a judge command for a goal-mode verdict.

mod exec;
mod judge;
mod protocol;

pub use exec::{ExecAgent, ExecAgentConfig, TaskBrief};
pub use judge::{CommandJudge, parse_verdict};
pub use protocol::{AgentExit, ResultLine, STDOUT_TAIL_CHARS, parse_result_line, settle_turn};
