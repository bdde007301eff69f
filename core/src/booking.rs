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

/// Why a dispatcher signalled a worker. Recorded on the board before the
/// signal is sent, so whichever dispatcher books the exit knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SignalReason {
    /// The dispatcher is shutting down: the card did nothing wrong.
    Shutdown,
    /// The worker overran: silent past the wedge limit, or past its run's
    /// time limit. Counted as a timed-out run.
    Overrun,
    /// The run lost its claim (reclaimed, released, or a newer run exists):
    /// its work must stop. The run is already closed.
    Fenced,
}

impl SignalReason {
    /// The name stored on the board.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shutdown => "shutdown",
            Self::Overrun => "overrun",
            Self::Fenced => "fenced",
        }
    }

    /// Parses a stored name.
    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Shutdown, Self::Overrun, Self::Fenced]
            .into_iter()
            .find(|reason| reason.as_str() == raw)
    }
}

/// What the dispatcher knows when it books one worker exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BookingInput {
    pub witness: ExitWitness,
    /// The card is still `running` under the worker's run (no terminal call landed).
    pub still_running: bool,
    /// Why a dispatcher signalled this worker, if one did.
    pub signalled: Option<SignalReason>,
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
    /// A worker the dispatcher stopped for its own shutdown.
    Interrupted,
    /// A worker the dispatcher stopped because it overran its time.
    TimedOut,
    /// Anything else.
    Crashed,
}

impl BookingKind {
    /// Every kind, in table order.
    pub const ALL: [BookingKind; 7] = [
        Self::Settled,
        Self::ProtocolViolation,
        Self::RateLimited,
        Self::TerminalProvider,
        Self::Interrupted,
        Self::TimedOut,
        Self::Crashed,
    ];

    /// The event kind and run outcome name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Settled => "settled",
            Self::ProtocolViolation => "protocol_violation",
            Self::RateLimited => "rate_limited",
            Self::TerminalProvider => "terminal_provider",
            Self::Interrupted => "interrupted",
            Self::TimedOut => "timed_out",
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
    let counted = |kind| {
        let blocks = input.consecutive_failures + 1 >= input.failure_limit.max(1);
        booking(kind, true, blocks, false)
    };
    if !input.still_running {
        return booking(BookingKind::Settled, false, false, false);
    }
    match (input.signalled, input.witness) {
        (Some(SignalReason::Overrun), _) => counted(BookingKind::TimedOut),
        (_, ExitWitness::Code(0)) => {
            let blocks = input.violation_streak + 1 >= input.violation_limit.max(1);
            booking(BookingKind::ProtocolViolation, false, blocks, false)
        }
        (_, ExitWitness::Code(75)) => booking(BookingKind::RateLimited, false, false, true),
        (_, ExitWitness::Code(78)) => booking(BookingKind::TerminalProvider, true, true, false),
        // Whatever else a worker stopped for our own shutdown (or a fenced
        // one whose run was not closed yet) ends with, we caused it.
        (Some(SignalReason::Shutdown | SignalReason::Fenced), _) => {
            booking(BookingKind::Interrupted, false, false, false)
        }
        // A worker exits 130 when a signal interrupted it: one we did not
        // send came from an operator, a host shutdown or a dispatcher that
        // could not record it (an unsafe board). Not the card's doing, so
        // not counted (the seed counts it); the respawn waits out the
        // cooldown, so an agent that interrupts its own worker cannot loop hot.
        (None, ExitWitness::Code(130)) => booking(BookingKind::Interrupted, false, false, true),
        (None, ExitWitness::Code(_) | ExitWitness::Signal(_) | ExitWitness::Unknown) => {
            counted(BookingKind::Crashed)
        }
    }
}

/// A worker's exit trailer:
/// `[kanban-worker-exit] rc=N[ seal=S][ alone][ fault=KIND:TEXT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub code: i32,
    /// The seal the worker signed it with.
    pub seal: Option<String>,
    /// The worker ended every process it started, and every one they
    /// started (it was their reaper), before it wrote the line: nothing of
    /// its run is left for its dispatcher to look for.
    pub alone: bool,
    /// A fault of the environment the worker reports: `(configuration, text)`.
    pub fault: Option<(bool, String)>,
}

impl Trailer {
    /// The line a worker writes last.
    pub fn line(&self) -> String {
        let mut line = format!("{WORKER_EXIT_TRAILER}{}", self.code);
        if let Some(seal) = &self.seal {
            line.push_str(&format!(" seal={seal}"));
        }
        if self.alone {
            line.push_str(" alone");
        }
        if let Some((configuration, text)) = &self.fault {
            let kind = if *configuration {
                "config"
            } else {
                "transient"
            };
            line.push_str(&format!(" fault={kind}:{}", text.replace('\n', " ")));
        }
        line
    }

    /// Reads one trailer line.
    pub fn parse(line: &str) -> Option<Self> {
        let rest = line.trim_end().strip_prefix(WORKER_EXIT_TRAILER)?;
        let (code, mut rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let code = code.parse::<i32>().ok()?;
        let mut seal = None;
        if let Some(after) = rest.strip_prefix("seal=") {
            let (value, tail) = after.split_once(' ').unwrap_or((after, ""));
            seal = Some(value.to_owned());
            rest = tail;
        }
        let (word, tail) = rest.split_once(' ').unwrap_or((rest, ""));
        let alone = word == "alone";
        if alone {
            rest = tail;
        }
        let fault = rest.strip_prefix("fault=").and_then(|fault| {
            let (kind, text) = fault.split_once(':')?;
            Some((kind == "config", text.to_owned()))
        });
        Some(Self {
            code,
            seal,
            alone,
            fault,
        })
    }
}

/// The last trailer in a log tail that `accept` takes (by its seal).
pub fn last_trailer(log_tail: &str, accept: impl Fn(Option<&str>) -> bool) -> Option<Trailer> {
    log_tail
        .lines()
        .rev()
        .filter_map(Trailer::parse)
        .find(|trailer| accept(trailer.seal.as_deref()))
}

/// The exit code of the last `[kanban-worker-exit] rc=N` line in a log
/// tail, whatever it is signed with.
pub fn exit_code_from_trailer(log_tail: &str) -> Option<i32> {
    last_trailer(log_tail, |_| true).map(|trailer| trailer.code)
}
