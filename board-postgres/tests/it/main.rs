//! Integration tests of the PostgreSQL board, on a real server: an
//! ephemeral cluster this binary starts (see `kanban_testkit::pg`).

mod concurrency;
mod contract;
mod durability;
mod state_machine;
mod url;
