//! What a dispatcher tells its log.

use std::fmt;

use crate::booking::{Booking, BookingKind, ExitWitness, SignalReason};
use crate::data::EnvironmentFault;

/// Something a dispatcher did or saw, for its log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchEvent {
    Spawned {
        task_id: String,
        /// The card's title: a log names it beside the id of each line
        /// about the card's worker.
        title: String,
        run_id: i64,
        pid: u32,
    },
    Booked {
        task_id: String,
        witness: ExitWitness,
        source: &'static str,
        booking: Booking,
    },
    LeaseExtended {
        task_id: String,
        pid: i64,
    },
    Stopping {
        task_id: String,
        pid: i64,
        reason: SignalReason,
    },
    Killed {
        task_id: String,
        pid: i64,
    },
    ReclaimDeferred {
        task_id: String,
        pid: i64,
    },
    Released {
        task_id: String,
        counted: bool,
        why: String,
    },
    Promoted {
        count: usize,
    },
    Halted {
        fault: EnvironmentFault,
    },
    Paused {
        fault: EnvironmentFault,
        for_ms: u64,
    },
    Resumed,
    /// What one tick decided about claiming, and why (for `-v`).
    Tick {
        /// Workers of this host running or being stopped.
        running: usize,
        /// Claims this tick could make (the room under --max-in-progress).
        room: usize,
        spawned: usize,
        /// Why no more were claimed.
        why: &'static str,
    },
    /// Which agents' cards a tick could claim (for `-vv`).
    ClaimPlan {
        open: Vec<String>,
        walled: Vec<String>,
        probing: Vec<String>,
        at_their_limit: Vec<String>,
    },
    /// A wall holds an agent's cards.
    WallHeld {
        route: String,
        until: i64,
        for_seconds: i64,
    },
    /// A wall's reset time came: one card goes through as its probe.
    WallProbe {
        task_id: String,
        scopes: Vec<String>,
    },
    BoardTrouble {
        message: String,
    },
    LeftRunning {
        task_id: String,
        pid: u32,
    },
    LeftUnbooked {
        task_id: String,
        pid: u32,
    },
}

impl fmt::Display for DispatchEvent {
    #[expect(
        clippy::too_many_lines,
        reason = "a table: one line of the log per event"
    )]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spawned {
                task_id,
                run_id,
                pid,
                ..
            } => write!(f, "{task_id} spawned worker {pid} (run {run_id})"),
            Self::Booked {
                task_id,
                witness,
                source,
                booking,
            } => {
                let how = match witness {
                    ExitWitness::Code(code) => format!("exited {code}"),
                    ExitWitness::Signal(signal) => format!("killed by signal {signal}"),
                    ExitWitness::Unknown => "ended (no exit code found)".to_owned(),
                };
                let source = if *source == "wait" {
                    String::new()
                } else {
                    format!(" (from {source})")
                };
                write!(
                    f,
                    "{task_id} worker {how}{source}: {}",
                    describe_booking(booking)
                )
            }
            Self::LeaseExtended { task_id, pid } => write!(
                f,
                "{task_id} lease expired while worker {pid} is alive and heartbeating: extended"
            ),
            Self::Stopping {
                task_id,
                pid,
                reason,
            } => {
                let why = match reason {
                    SignalReason::Shutdown => "the dispatcher is shutting down",
                    SignalReason::Overrun => {
                        "it overran its time (silent too long or past its run limit)"
                    }
                    SignalReason::Fenced => "its run lost its claim",
                };
                write!(f, "{task_id} stopping worker {pid}: {why}")
            }
            Self::Killed { task_id, pid } => write!(
                f,
                "{task_id} worker {pid} outlived its grace period: its process group was killed"
            ),
            Self::ReclaimDeferred { task_id, pid } => write!(
                f,
                "{task_id} worker {pid} survived termination: reclaim deferred"
            ),
            Self::Released {
                task_id,
                counted,
                why,
            } => {
                let counted = if *counted { "counted" } else { "not counted" };
                write!(f, "{task_id} released back to its lane ({counted}): {why}")
            }
            Self::Promoted { count } => write!(f, "{count} card(s) promoted to ready"),
            Self::Halted { fault } => {
                write!(f, "stopped claiming: {fault}; no card is charged for this")
            }
            Self::Paused { fault, for_ms } => write!(
                f,
                "claiming paused for {:.1} s: {fault}; no card is charged for this",
                *for_ms as f64 / 1000.0
            ),
            Self::Resumed => f.write_str("claiming resumed"),
            Self::Tick {
                running,
                room,
                spawned,
                why,
            } => write!(
                f,
                "tick: {running} running, room for {room}, spawned {spawned}; {why}"
            ),
            Self::ClaimPlan {
                open,
                walled,
                probing,
                at_their_limit,
            } => write!(
                f,
                "claim plan: open [{}], walled [{}], probing [{}], at their limit [{}]",
                open.join(", "),
                walled.join(", "),
                probing.join(", "),
                at_their_limit.join(", ")
            ),
            Self::WallHeld {
                route, for_seconds, ..
            } => write!(
                f,
                "a provider wall holds the cards of agent {route} for {for_seconds}s (kanban walls); nothing is spawned for them and they are charged nothing"
            ),
            Self::WallProbe { task_id, scopes } => write!(
                f,
                "{task_id} goes through as the probe of the wall on {}",
                scopes.join(", ")
            ),
            Self::BoardTrouble { message } => write!(f, "board call failed: {message}"),
            Self::LeftUnbooked { task_id, pid } => write!(
                f,
                "{task_id} worker {pid} ended; not booked on an unsafe board (its trailer keeps its exit)"
            ),
            Self::LeftRunning { task_id, pid } => {
                write!(f, "{task_id} worker {pid} did not stop: left to its lease")
            }
        }
    }
}

impl DispatchEvent {
    /// The card a line is about, which every such line starts with.
    pub fn task_id(&self) -> Option<&str> {
        match self {
            Self::Spawned { task_id, .. }
            | Self::Booked { task_id, .. }
            | Self::LeaseExtended { task_id, .. }
            | Self::Stopping { task_id, .. }
            | Self::Killed { task_id, .. }
            | Self::ReclaimDeferred { task_id, .. }
            | Self::Released { task_id, .. }
            | Self::WallProbe { task_id, .. }
            | Self::LeftRunning { task_id, .. }
            | Self::LeftUnbooked { task_id, .. } => Some(task_id),
            Self::Promoted { .. }
            | Self::Halted { .. }
            | Self::Paused { .. }
            | Self::Resumed
            | Self::Tick { .. }
            | Self::ClaimPlan { .. }
            | Self::WallHeld { .. }
            | Self::BoardTrouble { .. } => None,
        }
    }
}

fn describe_booking(booking: &Booking) -> &'static str {
    match (booking.kind, booking.blocks) {
        (BookingKind::Settled, _) => {
            "settled on the board before it exited (by its terminal call, or by an operator's cancel, reclaim or schedule)"
        }
        (BookingKind::ProtocolViolation, true) => {
            "protocol violation, the limit in a row: blocked for a human"
        }
        (BookingKind::ProtocolViolation, false) => {
            "protocol violation (no terminal board call): back to ready, not counted"
        }
        (BookingKind::RateLimited, _) => {
            "rate limited: back to ready, not counted, held for the cooldown"
        }
        (BookingKind::TerminalProvider, _) => "needs a human (provider/config): blocked",
        (BookingKind::Interrupted, _) => "stopped by the dispatcher: back to ready, not counted",
        (BookingKind::TimedOut, true) => "timed out, at the failure limit: blocked",
        (BookingKind::TimedOut, false) => "timed out: back to ready after a backoff, counted",
        (BookingKind::Crashed, true) => "crashed, at the failure limit: blocked",
        (BookingKind::Crashed, false) => "crashed: back to ready after a backoff, counted",
    }
}

/// Receives what a dispatcher did.
pub trait DispatchNotes: Send + Sync {
    fn note(&self, event: &DispatchEvent);
}

impl<F: Fn(&DispatchEvent) + Send + Sync> DispatchNotes for F {
    fn note(&self, event: &DispatchEvent) {
        self(event);
    }
}
