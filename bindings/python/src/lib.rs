//! `kanban_core._native`: kanban-core and its boards for a Python host.
//!
//! The Python package around it (`python/kanban_core/`) only reads its
//! arguments the way the seed module reads them; every decision is made
//! here, by `kanban-core` and the boards.

mod board;
mod recovery;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add(
        "DEFAULT_MAX_RECOVERY_ATTEMPTS",
        kanban_core::DEFAULT_MAX_RECOVERY_ATTEMPTS,
    )?;
    module.add(
        "RECOVERY_DELAYS_SECONDS",
        kanban_core::RECOVERY_DELAYS_SECONDS.to_vec(),
    )?;
    recovery::register(module)?;
    board::register(module)?;
    Ok(())
}
