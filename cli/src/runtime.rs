//! The real adapters of time and signals.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use async_trait::async_trait;
use signal_hook::consts::{SIGINT, SIGTERM};

/// The first SIGINT or SIGTERM is stored in `interrupt` (its number) for
/// the agent adapter to forward; a second one exits at once with 130.
pub(crate) fn install_signal_handlers(interrupt: &Arc<AtomicUsize>) -> anyhow::Result<()> {
    let seen = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // Registered first, so it sees the flag as the previous signal left it.
        signal_hook::flag::register_conditional_shutdown(signal, 130, seen.clone())?;
        signal_hook::flag::register(signal, seen.clone())?;
        signal_hook::flag::register_usize(signal, interrupt.clone(), signal as usize)?;
    }
    Ok(())
}

/// Runs a future to completion on this thread: every adapter here is
/// synchronous underneath, so no runtime is needed.
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    pollster::block_on(future)
}

/// Runs a board's blocking SQLite work on tokio's blocking threads, so a
/// call waiting on a busy lock never stalls the dispatcher's other work.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TokioOffload;

#[async_trait]
impl kanban_board_sqlite::Offload for TokioOffload {
    async fn run(&self, job: Box<dyn FnOnce() + Send + 'static>) {
        // A job that panicked leaves its answer empty; the board reports it.
        let _ = tokio::task::spawn_blocking(job).await;
    }
}
