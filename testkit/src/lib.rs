//! Test support for the kanban workspace: virtual time, scripted agents and
//! judges, an in-memory board, and the board contract suite every board
//! adapter must pass. A dev-dependency only.

mod agents;
mod board_contract;
mod http_server;
mod invariants;
mod memory_board;
mod owner_seam;
mod scripted;
mod seed_cases;
mod synthetic;
mod time;

pub use agents::{AgentScript, AgentTurn, WrittenAgent, write_executable, write_judge};
pub use board_contract::run_board_contract;
pub use http_server::{Reply, ScriptedHttpServer};
pub use invariants::{BoardFigures, check_board_invariants};
pub use memory_board::{InMemoryBoard, MEMORY_DB};
pub use owner_seam::{OWNER_LOCK, OwnerSeam, SeamOptions, SeamOutcome};
pub use scripted::{Recorded, ScriptedJudge, ScriptedRunner};
pub use seed_cases::{SeedCase, seed_owner_case, seed_owner_cases};
pub use synthetic::{FAR_FUTURE_EXPIRY, SyntheticBoard};
pub use time::{ScriptedClock, VirtualClock};

/// The seed's result shapes, as builders.
pub use kanban_core::shapes;

/// Runs a future to completion on the current thread; core has no runtime.
pub fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}
