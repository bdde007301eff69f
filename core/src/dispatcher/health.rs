//! Faults of the environment: a configuration fault halts claiming, a
//! transient one pauses it, and a board unsafe to write winds our workers
//! down without a word written to it.

use std::time::Duration;

use crate::booking::SignalReason;
use crate::data::BoardError;
use crate::dispatcher::{
    DispatchEvent, Dispatcher, EnvironmentFault, FIRST_PAUSE, LONGEST_PAUSE, StopSignal, millis,
};

/// A dispatcher's faults and pauses.
#[derive(Debug)]
pub(super) struct Health {
    /// The configuration fault that stopped claiming for good.
    pub(super) halt: Option<EnvironmentFault>,
    /// Claiming is paused until then (monotonic ms) after a transient fault.
    pub(super) paused_until_ms: Option<u64>,
    /// What paused it.
    pub(super) paused_by: Option<String>,
    /// The next pause's length.
    pub(super) next_pause: Duration,
    /// The board failed its health check: nothing more is written to it,
    /// and our workers are wound down.
    pub(super) board_unsafe: Option<WindDown>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            halt: None,
            paused_until_ms: None,
            paused_by: None,
            next_pause: FIRST_PAUSE,
            board_unsafe: None,
        }
    }
}

/// Workers being stopped because the board became unsafe to write.
#[derive(Clone, Copy, Debug)]
pub(super) struct WindDown {
    pub(super) since_ms: u64,
    pub(super) killed: bool,
}

impl Dispatcher {
    /// Whether the board is still safe to write; the first time it is not,
    /// claiming halts and our workers are wound down.
    pub(super) async fn board_safe(&mut self) -> bool {
        if self.health.board_unsafe.is_some() {
            return false;
        }
        let Err(error) = self.ports.board.check_health().await else {
            return true;
        };
        self.note(DispatchEvent::BoardTrouble {
            message: error.to_string(),
        });
        self.halt(EnvironmentFault::Configuration(format!(
            "{error}; stop every kanban process on this board, then check it (a SQLite board: sqlite3 BOARD 'PRAGMA integrity_check') before dispatching again"
        )));
        self.begin_wind_down();
        false
    }

    /// Reacts to a fault of the environment: a configuration fault stops
    /// claiming for good (the run ends once the workers settled); a
    /// transient one pauses claiming, for longer while it lasts.
    pub fn halt(&mut self, fault: EnvironmentFault) {
        match fault {
            EnvironmentFault::Configuration(_) => {
                if self.health.halt.is_none() {
                    self.note(DispatchEvent::Halted {
                        fault: fault.clone(),
                    });
                    self.health.halt = Some(fault);
                }
            }
            EnvironmentFault::Transient(_) => {
                let mono = self.mono();
                if self
                    .health
                    .paused_until_ms
                    .is_some_and(|paused| mono < paused)
                {
                    // The same episode, met again by the calls a tick still
                    // makes while paused (watching workers): it lengthens
                    // nothing. A fault met after the pause doubles the next.
                    return;
                }
                // Any earlier pause is over by now, so this one ends later.
                let for_ms = millis(self.health.next_pause);
                self.health.paused_by = Some(fault.to_string());
                self.note(DispatchEvent::Paused { fault, for_ms });
                self.health.paused_until_ms = Some(mono.saturating_add(for_ms));
                self.health.next_pause = (self.health.next_pause * 2).min(LONGEST_PAUSE);
            }
        }
    }

    /// True while claiming is paused by a transient fault.
    pub(super) fn paused(&mut self) -> bool {
        match self.health.paused_until_ms {
            Some(until) if self.mono() < until => true,
            Some(_) => {
                self.health.paused_until_ms = None;
                self.health.paused_by = None;
                self.note(DispatchEvent::Resumed);
                false
            }
            None => false,
        }
    }

    pub(super) fn board_trouble(&mut self, error: &BoardError) {
        self.note(DispatchEvent::BoardTrouble {
            message: error.to_string(),
        });
        if let Some(fault) = EnvironmentFault::from_board(error) {
            self.halt(fault);
        }
    }

    /// The board cannot be written safely: every worker of ours is asked to
    /// stop now (its work could not be recorded), without a word written to
    /// the board. A dispatcher on the repaired board books them from their
    /// sealed trailers.
    pub(super) fn begin_wind_down(&mut self) {
        for child in self.children.values() {
            self.ports.supervisor.signal(
                i64::from(child.process.pid),
                child.process.started_at,
                StopSignal::Terminate,
            );
            self.note(DispatchEvent::Stopping {
                task_id: child.claim.task_id.clone(),
                pid: i64::from(child.process.pid),
                reason: SignalReason::Shutdown,
            });
        }
        // Stops of other hosts' workers were board business: forgotten.
        self.stopping.clear();
        self.health.board_unsafe = Some(WindDown {
            since_ms: self.mono(),
            killed: false,
        });
    }

    /// Reaps the workers of a wind-down, killing their groups once the
    /// grace period is over.
    pub(super) async fn wind_down(&mut self) {
        for exit in self.ports.supervisor.reap().await {
            if let Some(child) = self.children.remove(&exit.pid) {
                self.note(DispatchEvent::LeftUnbooked {
                    task_id: child.claim.task_id,
                    pid: exit.pid,
                });
            }
        }
        let mono = self.mono();
        let grace = millis(self.settings.grace);
        if let Some(wind_down) = &mut self.health.board_unsafe
            && !wind_down.killed
            && mono.saturating_sub(wind_down.since_ms) >= grace
        {
            wind_down.killed = true;
            for child in self.children.values() {
                self.ports.supervisor.signal(
                    i64::from(child.process.pid),
                    child.process.started_at,
                    StopSignal::Kill,
                );
            }
        }
    }
}
