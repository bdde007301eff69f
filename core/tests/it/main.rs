//! Integration tests of kanban-core: the seed's contract cases, the
//! interaction order, the property tests and the rendered tables.

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

mod architecture;
mod attachments;
mod carrier;
mod diagnostics;
mod dispatch_ports;
mod dispatcher;
mod exit;
mod interaction;
mod lease;
mod owner_seam;
mod policy;
mod preview;
mod properties;
mod recovery;
mod rules;
mod swarm;
mod tables;
mod walls;
mod workspaces;

use kanban_core::{Environment, vars};

/// An environment naming `task` as the worker's task.
fn worker_env(task: &str) -> Environment {
    Environment::new().with(vars::TASK, task)
}
