//! How a dispatcher books a worker's exit: one table, beside the exit mapping,
//! so the worker and the dispatcher cannot drift apart.

use crate::data::{EnvironmentFault, ExitCode};

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

impl ExitWitness {
    /// The worker's exit code, when it exited with one of ours.
    pub fn exit_code(self) -> Option<ExitCode> {
        match self {
            Self::Code(code) => ExitCode::from_code(code),
            Self::Signal(_) | Self::Unknown => None,
        }
    }
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

    /// The kind of the event a booking of this kind appends: its name, but
    /// `worker_exited` for the exit of a settled run.
    pub fn event_kind(self) -> &'static str {
        match self {
            Self::Settled => "worker_exited",
            other => other.as_str(),
        }
    }

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
    match (input.signalled, input.witness.exit_code()) {
        (Some(SignalReason::Overrun), _) => counted(BookingKind::TimedOut),
        (_, Some(ExitCode::Success)) => {
            let blocks = input.violation_streak + 1 >= input.violation_limit.max(1);
            booking(BookingKind::ProtocolViolation, false, blocks, false)
        }
        (_, Some(ExitCode::TempFail)) => booking(BookingKind::RateLimited, false, false, true),
        (_, Some(ExitCode::ConfigFail)) => {
            booking(BookingKind::TerminalProvider, true, true, false)
        }
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
        (None, Some(ExitCode::Interrupted)) => {
            booking(BookingKind::Interrupted, false, false, true)
        }
        (None, Some(ExitCode::Failure) | None) => counted(BookingKind::Crashed),
    }
}

/// A worker's closing lines. The last is the seed's trailer exactly,
/// `[kanban-worker-exit] rc=N`, which the seed system's dispatcher reads
/// with `^\[kanban-worker-exit\] rc=(\d+)\s*$`; what only our dispatcher
/// needs stands on the line just before it, as the seed puts
/// `[kanban-worker-busy]` there:
/// `[kanban-worker-end] rc=N[ seal=S][ alone][ fault=KIND:TEXT]`.
/// A log of an older build, whose trailer carried those words on one
/// line, is still read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trailer {
    pub code: i32,
    /// The seal the worker signed it with.
    pub seal: Option<String>,
    /// The worker ended every process it started, and every one they
    /// started (it was their reaper), before it wrote the line: nothing of
    /// its run is left for its dispatcher to look for.
    pub alone: bool,
    /// A fault of the environment the worker reports.
    pub fault: Option<EnvironmentFault>,
}

/// The line before the trailer that carries the seal, `alone` and a fault.
pub const WORKER_END_DETAIL: &str = "[kanban-worker-end] rc=";

impl Trailer {
    /// The lines a worker writes last: the detail line (when there is any
    /// detail), then the seed's trailer.
    pub fn lines(&self) -> String {
        let trailer = format!("{WORKER_EXIT_TRAILER}{}", self.code);
        let details = self.details();
        if details.is_empty() {
            return trailer;
        }
        format!("{WORKER_END_DETAIL}{}{details}\n{trailer}", self.code)
    }

    fn details(&self) -> String {
        let mut words = String::new();
        if let Some(seal) = &self.seal {
            words.push_str(&format!(" seal={seal}"));
        }
        if self.alone {
            words.push_str(" alone");
        }
        if let Some(fault) = &self.fault {
            let (kind, text) = match fault {
                EnvironmentFault::Configuration(text) => ("config", text),
                EnvironmentFault::Transient(text) => ("transient", text),
            };
            words.push_str(&format!(
                " fault={kind}:{}",
                text.replace(['\n', '\r'], " ")
            ));
        }
        words
    }

    /// Reads a trailer from its line and the line before it. A trailer
    /// that carries its own words (an older build's) is read alone.
    pub fn parse(previous: Option<&str>, line: &str) -> Option<Self> {
        let rest = line.trim_end().strip_prefix(WORKER_EXIT_TRAILER)?;
        let (code, words) = rest.split_once(' ').unwrap_or((rest, ""));
        if !words.is_empty() {
            return Self::with_words(code, words);
        }
        let detail = previous
            .and_then(|previous| previous.trim_end().strip_prefix(WORKER_END_DETAIL))
            .and_then(|detail| {
                let (detail_code, words) = detail.split_once(' ').unwrap_or((detail, ""));
                (detail_code == code).then_some(words)
            });
        Self::with_words(code, detail.unwrap_or(""))
    }

    fn with_words(code: &str, mut rest: &str) -> Option<Self> {
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
            let text = text.to_owned();
            Some(match kind {
                "config" => EnvironmentFault::Configuration(text),
                _ => EnvironmentFault::Transient(text),
            })
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
    let lines: Vec<&str> = log_tail.lines().collect();
    (0..lines.len())
        .rev()
        .filter_map(|at| {
            let previous = at.checked_sub(1).map(|before| lines[before]);
            Trailer::parse(previous, lines[at])
        })
        .find(|trailer| accept(trailer.seal.as_deref()))
}

/// The exit code of the last `[kanban-worker-exit] rc=N` line in a log
/// tail, whatever it is signed with.
pub fn exit_code_from_trailer(log_tail: &str) -> Option<i32> {
    last_trailer(log_tail, |_| true).map(|trailer| trailer.code)
}
