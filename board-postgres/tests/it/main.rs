//! Integration tests of the PostgreSQL board, on a real server: an
//! ephemeral cluster this binary starts (see `kanban_testkit::pg`).

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

mod concurrency;
mod contract;
mod durability;
mod state_machine;
mod url;
