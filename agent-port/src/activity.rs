//! What a worker's watch sees of its agent, and how it stops it: shared by
//! the agent adapters and the host's signal handler.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kanban_core::{AgentControl, Clock, StopReason};

/// The agent's progress and stop, shared between the agent adapter, the
/// worker's watch and the host's signal handler.
pub struct Activity {
    clock: Arc<dyn Clock>,
    /// Monotonic milliseconds of the last progress, plus one (0: none yet).
    progress: AtomicU64,
    /// The number of a signal the host's handler stored (0: none).
    interrupt: Arc<AtomicUsize>,
    stop: Mutex<Option<StopReason>>,
    turn_active: AtomicBool,
}

impl std::fmt::Debug for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Activity")
            .field("stop", &self.stop_reason())
            .field("turn_active", &self.turn_active())
            .finish_non_exhaustive()
    }
}

impl Activity {
    /// An activity stamped by `clock`'s monotonic time, stopped by the
    /// signal number the host's handler stores in `interrupt`.
    pub fn new(clock: Arc<dyn Clock>, interrupt: Arc<AtomicUsize>) -> Arc<Self> {
        Arc::new(Self {
            clock,
            progress: AtomicU64::new(0),
            interrupt,
            stop: Mutex::new(None),
            turn_active: AtomicBool::new(false),
        })
    }

    /// Records a sign of progress (output, a turn starting, a model answer).
    pub fn touch(&self) {
        self.progress.store(
            self.clock.monotonic_millis().saturating_add(1),
            Ordering::SeqCst,
        );
    }

    /// Why the agent must stop, if it must: a stop the watch asked for, or
    /// a signal the host received.
    pub fn stop_reason(&self) -> Option<StopReason> {
        let asked = *self
            .stop
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        asked.or_else(|| match self.interrupt.load(Ordering::SeqCst) {
            0 => None,
            signal => Some(StopReason::Signal(i32::try_from(signal).unwrap_or(15))),
        })
    }

    /// True while a turn runs.
    pub fn turn_active(&self) -> bool {
        self.turn_active.load(Ordering::SeqCst)
    }

    pub(crate) fn set_turn_active(&self, active: bool) {
        self.turn_active.store(active, Ordering::SeqCst);
        if active {
            self.touch();
        }
    }
}

impl AgentControl for Activity {
    fn last_progress_millis(&self) -> Option<u64> {
        match self.progress.load(Ordering::SeqCst) {
            0 => None,
            stamped => Some(stamped - 1),
        }
    }

    fn stop(&self, reason: StopReason) {
        self.stop
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_or_insert(reason);
    }
}
