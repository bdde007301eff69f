//! The one reading of an error as a fault of the environment, for the
//! processes that stop when they meet one (core's `EnvironmentFault::blocking`
//! for a board's error).

use kanban_core::{BoardError, EnvironmentFault};

/// The fault an error met while setting a process up means: a board's
/// error as core classes it; anything else (a missing folder, a lock that
/// cannot be taken) is the setup's.
pub(crate) fn of_setup(error: &anyhow::Error) -> EnvironmentFault {
    match error.downcast_ref::<BoardError>() {
        Some(error) => EnvironmentFault::blocking(error),
        None => EnvironmentFault::Configuration(format!("{error:#}")),
    }
}
