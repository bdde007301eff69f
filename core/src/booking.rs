//! How a dispatcher books a worker's exit: one table, beside the exit mapping,
//! so the worker and the dispatcher cannot drift apart.

/// The line a worker writes last on stderr; the dispatcher reads it back from
/// the log when it has no wait status (it was restarted, for instance).
pub const WORKER_EXIT_TRAILER: &str = "[kanban-worker-exit] rc=";

/// How the dispatcher learnt how a worker ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExitWitness {
    /// The worker exited with this code.
    Code(i32),
    /// The worker died of this signal.
    Signal(i32),
    /// Nothing says how it ended.
    Unknown,
}

/// What the dispatcher knows when it books one worker exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BookingInput {
    pub witness: ExitWitness,
    /// The card is still `running` under the worker's run (no terminal call landed).
    pub still_running: bool,
    /// The dispatcher itself signalled this worker (shutdown, reclaim).
    pub signalled_by_dispatcher: bool,
    /// Protocol violations booked in a row before this one.
    pub violation_streak: u32,
    /// Counted failures before this one.
    pub consecutive_failures: u32,
    /// Counted failures that block the card (the card's `max_retries`, else 2).
    pub failure_limit: u32,
    /// Protocol violations in a row that block the card (the card's
    /// `max_retries`, else 3).
    pub violation_limit: u32,
}

/// The kind a worker exit is booked as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BookingKind {
    /// The worker made its terminal call; nothing more to book.
    Settled,
    /// Exit 0 without a terminal call.
    ProtocolViolation,
    /// Exit 75: a transient wall; requeue after a cooldown.
    RateLimited,
    /// Exit 78: needs a human; blocked at once.
    TerminalProvider,
    /// Exit 130 from a worker the dispatcher signalled.
    Interrupted,
    /// Anything else.
    Crashed,
}

impl BookingKind {
    /// The event kind and run outcome name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::ProtocolViolation => "protocol_violation",
            Self::RateLimited => "rate_limited",
            Self::TerminalProvider => "terminal_provider",
            Self::Interrupted => "interrupted",
            Self::Crashed => "crashed",
        }
    }
}

/// The booking decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Booking {
    pub kind: BookingKind,
    /// The exit counts toward the failure limit.
    pub counts_failure: bool,
    /// The card goes to `blocked` (for a human); otherwise back to `ready`.
    pub blocks: bool,
    /// Respawn waits for the rate-limit cooldown.
    pub cooldown: bool,
}

/// Protocol violations in a row that block a card.
pub const PROTOCOL_VIOLATION_LIMIT: u32 = 3;
/// Counted failures that block a card when it names no limit of its own.
pub const DEFAULT_FAILURE_LIMIT: u32 = 2;

/// Books one worker exit.
pub fn book_worker_exit(input: BookingInput) -> Booking {
    let booking = |kind, counts_failure, blocks, cooldown| Booking {
        kind,
        counts_failure,
        blocks,
        cooldown,
    };
    if !input.still_running {
        return booking(BookingKind::Settled, false, false, false);
    }
    match input.witness {
        ExitWitness::Code(0) => {
            let blocks = input.violation_streak + 1 >= input.violation_limit.max(1);
            booking(BookingKind::ProtocolViolation, false, blocks, false)
        }
        ExitWitness::Code(75) => booking(BookingKind::RateLimited, false, false, true),
        ExitWitness::Code(78) => booking(BookingKind::TerminalProvider, true, true, false),
        ExitWitness::Code(130) if input.signalled_by_dispatcher => {
            booking(BookingKind::Interrupted, false, false, false)
        }
        ExitWitness::Code(_) | ExitWitness::Signal(_) | ExitWitness::Unknown => {
            let blocks = input.consecutive_failures + 1 >= input.failure_limit.max(1);
            booking(BookingKind::Crashed, true, blocks, false)
        }
    }
}

/// The exit code of the last `[kanban-worker-exit] rc=N` line in a log tail.
pub fn exit_code_from_trailer(log_tail: &str) -> Option<i32> {
    log_tail
        .lines()
        .rev()
        .filter_map(|line| line.trim_end().strip_prefix(WORKER_EXIT_TRAILER))
        .find_map(|code| code.parse::<i32>().ok())
}
