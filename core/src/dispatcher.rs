//! The dispatcher: one tick at a time, it books the workers that ended,
//! stops work that lost its claim, extends, stops or releases expired
//! claims, promotes, and claims ready cards for new workers.
//!
//! It only decides. The board, the processes and the waiting are ports, so
//! the same dispatcher runs the real binary and the deterministic simulation.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::board::ClaimGrant;
use crate::booking::{Booking, BookingKind, ExitWitness, SignalReason};
use crate::claim::Claim;
use crate::dispatch::{
    ClaimFilter, DispatchBoard, EnvironmentFault, ExitReport, RunLog, RunningWorker,
    StaleClaimAction, StopSignal, Supervisor, TickDurations, Wakeups, WorkerExit, WorkerProcess,
    stale_claim_action,
};
use crate::ports::{BoardError, Clock, RunStatus};
use crate::rules::{FailurePolicy, Release, lease_expired};
use crate::walls::{
    AgentRoute, Gate, ProviderId, WallHit, WallKind, entitled_provider, gate, probed_walls,
    route_label, scopes_of, wall_scope,
};
use crate::worker::WorkerResult;

/// How long a killed worker may take to disappear before its reclaim is deferred.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// The SIGTERM number, recorded with a stop.
const SIGTERM: i32 = 15;
/// Attempts at recording why a worker is stopped before it is signalled.
const SIGNAL_RECORD_ATTEMPTS: usize = 5;
/// Exits kept for a later attempt when the board could not book them.
const UNBOOKED_LIMIT: usize = 4096;
/// The first pause after a transient environment fault; it doubles while
/// the fault lasts.
const FIRST_PAUSE: Duration = Duration::from_secs(1);
/// The longest pause.
const LONGEST_PAUSE: Duration = Duration::from_secs(60);
/// How often tick durations are added to the board's histogram.
const TICK_FLUSH_MS: u64 = 15_000;

/// How a dispatcher runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DispatchSettings {
    /// The lease of each claim, in seconds.
    pub ttl_seconds: i64,
    /// Workers of this host running at once, at most.
    pub max_in_progress: usize,
    /// Limits, cooldown and backoff for failed runs.
    pub failure_policy: FailurePolicy,
    /// The longest wait between ticks; never more than a third of the
    /// lease, so that live workers' leases are renewed in time.
    pub interval: Duration,
    /// How long a stopped worker gets before its process group is killed.
    pub grace: Duration,
    /// A run's time limit for cards naming none (`max_runtime_seconds`).
    pub max_runtime_seconds: Option<i64>,
    /// The agents, by route (`""`: the unnamed agent, which serves cards
    /// with no assignee, or every card when no agent is named), each with
    /// the provider it is known to call (for walls). Empty: one unnamed agent.
    pub routes: BTreeMap<String, AgentRoute>,
    /// The named agent that takes the cards with no assignee, when there is
    /// no unnamed agent.
    pub unassigned_route: Option<String>,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            ttl_seconds: crate::DEFAULT_CLAIM_TTL_SECONDS,
            max_in_progress: 2,
            failure_policy: FailurePolicy::default(),
            interval: Duration::from_secs(60),
            grace: Duration::from_secs(10),
            max_runtime_seconds: None,
            routes: BTreeMap::new(),
            unassigned_route: None,
        }
    }
}

/// Something a dispatcher did or saw, for its log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchEvent {
    Spawned {
        task_id: String,
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
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spawned {
                task_id,
                run_id,
                pid,
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

fn describe_booking(booking: &Booking) -> &'static str {
    match (booking.kind, booking.blocks) {
        (BookingKind::Settled, _) => "settled by its terminal board call",
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

/// The adapters a dispatcher uses.
#[derive(Clone)]
pub struct DispatchPorts {
    pub board: Arc<dyn DispatchBoard>,
    pub supervisor: Arc<dyn Supervisor>,
    pub clock: Arc<dyn Clock>,
    pub wakeups: Arc<dyn Wakeups>,
    pub notes: Arc<dyn DispatchNotes>,
}

impl fmt::Debug for DispatchPorts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatchPorts")
            .field("host", &self.supervisor.host())
            .finish_non_exhaustive()
    }
}

/// How a dispatcher's run loop goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunMode {
    /// Until a stop is requested or the environment fails.
    Forever,
    /// One tick.
    Once,
    /// Until nothing runs and nothing can be claimed.
    UntilIdle,
}

/// How a dispatcher's run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DispatchEnd {
    /// `--once` or `--until-idle` reached its end.
    Finished,
    /// A stop was requested; every worker was stopped and booked.
    Interrupted,
    /// The environment failed; claiming stopped and the workers settled.
    Halted(EnvironmentFault),
}

impl DispatchEnd {
    /// The dispatcher's exit code: 0, 130 for a stop, 78 or 75 for a halt.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Finished => 0,
            Self::Interrupted => 130,
            Self::Halted(fault) => fault.exit_code(),
        }
    }
}

/// What one tick did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickReport {
    pub spawned: usize,
    pub booked: usize,
    /// Nothing runs, nothing is being stopped and nothing was claimed.
    pub idle: bool,
}

#[derive(Clone, Debug)]
struct Child {
    claim: Claim,
    process: WorkerProcess,
    /// When the board first showed this child's run closed by its own
    /// terminal call (it is expected to exit by itself soon).
    settled_since_ms: Option<u64>,
}

/// Workers being stopped because the board became unsafe to write.
#[derive(Clone, Copy, Debug)]
struct WindDown {
    since_ms: u64,
    killed: bool,
}

#[derive(Clone, Debug)]
struct Stopping {
    claim: Claim,
    process: WorkerProcess,
    reason: SignalReason,
    since_ms: u64,
    killed: bool,
    deferred: bool,
}

/// What this dispatcher saw of a run, on its own monotonic clock: wall-clock
/// jumps must not make a healthy worker look silent or a live lease expired.
#[derive(Clone, Debug)]
struct Watch {
    first_seen_ms: u64,
    heartbeat: Option<i64>,
    heartbeat_seen_ms: u64,
    expires: Option<i64>,
    expires_seen_ms: u64,
}

/// The dispatcher.
pub struct Dispatcher {
    ports: DispatchPorts,
    settings: DispatchSettings,
    children: BTreeMap<u32, Child>,
    stopping: BTreeMap<i64, Stopping>,
    watches: BTreeMap<i64, Watch>,
    unbooked: Vec<(Claim, ExitReport)>,
    /// Releases the board could not make yet.
    unreleased: Vec<(Claim, Release)>,
    halt: Option<EnvironmentFault>,
    /// Claiming is paused until then (monotonic ms) after a transient fault.
    paused_until_ms: Option<u64>,
    /// The next pause's length.
    next_pause: Duration,
    /// The board failed its health check: nothing more is written to it,
    /// and our workers are wound down.
    board_unsafe: Option<WindDown>,
    /// The agent route of each running run, as far as known.
    run_routes: BTreeMap<i64, String>,
    /// The wall scopes each route reaches: its own name and the provider it
    /// is entitled to (a run's report adds none: see `entitled_provider`).
    scopes: BTreeMap<String, BTreeSet<String>>,
    /// The routes a wall held on the last tick, and until when (said once).
    held: BTreeMap<String, i64>,
    /// Tick durations not yet added to the board's histogram.
    ticks: TickDurations,
    ticks_flushed_ms: u64,
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("settings", &self.settings)
            .field("children", &self.children.len())
            .field("halt", &self.halt)
            .finish_non_exhaustive()
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Dispatcher {
    /// A dispatcher with no workers yet. Its interval is cut to a third of
    /// the lease when longer: it renews live workers' leases on its ticks.
    pub fn new(ports: DispatchPorts, mut settings: DispatchSettings) -> Self {
        let third =
            Duration::from_secs(u64::try_from(settings.ttl_seconds / 3).unwrap_or(0).max(1));
        settings.interval = settings.interval.min(third);
        if settings.routes.is_empty() {
            let unnamed = AgentRoute {
                identity: route_label("").to_owned(),
                ..AgentRoute::default()
            };
            settings.routes.insert(String::new(), unnamed);
        }
        let started_ms = ports.clock.monotonic_millis();
        let scopes = settings
            .routes
            .iter()
            .map(|(route, agent)| (route.clone(), scopes_of(&agent.identity, &agent.provider)))
            .collect();
        Self {
            ports,
            settings,
            children: BTreeMap::new(),
            stopping: BTreeMap::new(),
            watches: BTreeMap::new(),
            unbooked: Vec::new(),
            unreleased: Vec::new(),
            halt: None,
            paused_until_ms: None,
            next_pause: FIRST_PAUSE,
            board_unsafe: None,
            run_routes: BTreeMap::new(),
            scopes,
            held: BTreeMap::new(),
            ticks: TickDurations::default(),
            // The first flush comes a whole period after the start.
            ticks_flushed_ms: started_ms,
        }
    }

    /// The route serving a card assigned to `assignee`: the agent of that
    /// name; else the unnamed agent for a card with no assignee, or for
    /// every card when no agent is named. `None`: no agent serves it (the
    /// card waits, uncharged).
    pub fn route_of(&self, assignee: Option<&str>) -> Option<String> {
        let assignee = assignee.unwrap_or("");
        let named = self.settings.routes.keys().any(|route| !route.is_empty());
        if !assignee.is_empty() && self.settings.routes.contains_key(assignee) {
            return Some(assignee.to_owned());
        }
        if self.settings.routes.contains_key("") {
            return (assignee.is_empty() || !named).then(String::new);
        }
        self.settings
            .unassigned_route
            .clone()
            .filter(|route| assignee.is_empty() && self.settings.routes.contains_key(route))
    }

    /// The assignees whose cards `route` serves (`""`: no assignee); `None`
    /// for every card (a lone unnamed agent).
    fn assignees_of(&self, route: &str) -> Option<BTreeSet<String>> {
        let named = self.settings.routes.keys().any(|route| !route.is_empty());
        if !named {
            return None;
        }
        let mut assignees = BTreeSet::from([route.to_owned()]);
        if self.settings.unassigned_route.as_deref() == Some(route) {
            assignees.insert(String::new());
        }
        Some(assignees)
    }

    /// The filter admitting the cards of `routes` only.
    fn filter_for<'a>(&self, routes: impl IntoIterator<Item = &'a String>) -> ClaimFilter {
        let mut admitted = BTreeSet::new();
        for route in routes {
            match self.assignees_of(route) {
                None => return ClaimFilter::any(),
                Some(assignees) => admitted.extend(assignees),
            }
        }
        ClaimFilter::only(admitted)
    }

    /// The identity of a route's agent, as walls name it.
    fn identity(&self, route: &str) -> String {
        self.settings.routes.get(route).map_or_else(
            || route_label(route).to_owned(),
            |agent| agent.identity.clone(),
        )
    }

    /// The workers this dispatcher started that have not been booked yet.
    pub fn children(&self) -> impl Iterator<Item = (&Claim, &WorkerProcess)> {
        self.children
            .values()
            .map(|child| (&child.claim, &child.process))
    }

    /// The fault that stopped claiming, if one did.
    pub fn halted(&self) -> Option<&EnvironmentFault> {
        self.halt.as_ref()
    }

    /// Reacts to a fault of the environment: a configuration fault stops
    /// claiming for good (the run ends once the workers settled); a
    /// transient one pauses claiming, for longer while it lasts.
    pub fn halt(&mut self, fault: EnvironmentFault) {
        match fault {
            EnvironmentFault::Configuration(_) => {
                if self.halt.is_none() {
                    self.note(DispatchEvent::Halted {
                        fault: fault.clone(),
                    });
                    self.halt = Some(fault);
                }
            }
            EnvironmentFault::Transient(_) => {
                let mono = self.mono();
                if self.paused_until_ms.is_some_and(|paused| mono < paused) {
                    // The same episode, met again by the calls a tick still
                    // makes while paused (watching workers): it lengthens
                    // nothing. A fault met after the pause doubles the next.
                    return;
                }
                let for_ms = millis(self.next_pause);
                let until = mono.saturating_add(for_ms);
                if self.paused_until_ms.is_none_or(|paused| paused < until) {
                    self.note(DispatchEvent::Paused { fault, for_ms });
                    self.paused_until_ms = Some(until);
                    self.next_pause = (self.next_pause * 2).min(LONGEST_PAUSE);
                }
            }
        }
    }

    /// True while claiming is paused by a transient fault.
    fn paused(&mut self) -> bool {
        match self.paused_until_ms {
            Some(until) if self.mono() < until => true,
            Some(_) => {
                self.paused_until_ms = None;
                self.note(DispatchEvent::Resumed);
                false
            }
            None => false,
        }
    }

    fn note(&self, event: DispatchEvent) {
        self.ports.notes.note(&event);
    }

    fn mono(&self) -> u64 {
        self.ports.clock.monotonic_millis()
    }

    fn host_local(&self, claim: &Claim) -> bool {
        claim
            .claim_lock
            .strip_prefix(self.ports.supervisor.host())
            .is_some_and(|rest| rest.starts_with(':'))
    }

    fn board_trouble(&mut self, error: &BoardError) {
        self.note(DispatchEvent::BoardTrouble {
            message: error.to_string(),
        });
        if let Some(fault) = EnvironmentFault::from_board(error) {
            self.halt(fault);
        }
    }

    /// The loop: tick, then wait for the interval, a worker's exit, a board
    /// change or a stop.
    pub async fn run(&mut self, mode: RunMode) -> DispatchEnd {
        loop {
            if self.ports.wakeups.stop_requested() {
                self.shut_down().await;
                self.flush_ticks().await;
                return DispatchEnd::Interrupted;
            }
            let began = self.mono();
            let report = self.tick(true).await;
            self.ticks.observe(self.mono().saturating_sub(began));
            if self.mono().saturating_sub(self.ticks_flushed_ms) >= TICK_FLUSH_MS {
                self.flush_ticks().await;
            }
            if let Some(fault) = &self.halt
                && self.children.is_empty()
                && self.stopping.is_empty()
            {
                let fault = fault.clone();
                self.flush_ticks().await;
                return DispatchEnd::Halted(fault);
            }
            match mode {
                RunMode::Once => {
                    self.flush_ticks().await;
                    return DispatchEnd::Finished;
                }
                RunMode::UntilIdle if report.idle => {
                    self.flush_ticks().await;
                    return DispatchEnd::Finished;
                }
                _ => {}
            }
            let wait = self.next_wait();
            self.ports.wakeups.wait(wait).await;
        }
    }

    /// Adds the ticks counted since the last flush to the board's histogram.
    async fn flush_ticks(&mut self) {
        self.ticks_flushed_ms = self.mono();
        if self.ticks.count == 0 || self.board_unsafe.is_some() {
            return;
        }
        let ticks = std::mem::take(&mut self.ticks);
        let host = self.ports.supervisor.host().to_owned();
        if let Err(error) = self.ports.board.record_ticks(&host, &ticks).await {
            // Metrics are not worth a fault: note it, keep dispatching.
            self.note(DispatchEvent::BoardTrouble {
                message: error.to_string(),
            });
        }
    }

    /// The wait before the next tick: the interval, or sooner when a stop
    /// escalates or a pause ends.
    pub fn next_wait(&self) -> Duration {
        let mono = self.mono();
        let grace = millis(self.settings.grace);
        let pause_end = self
            .paused_until_ms
            .map(|until| Duration::from_millis(until.saturating_sub(mono).max(50)));
        self.stopping
            .values()
            .map(|stop| {
                let due = if stop.killed {
                    stop.since_ms + grace + millis(KILL_WAIT)
                } else {
                    stop.since_ms + grace
                };
                Duration::from_millis(due.saturating_sub(mono).max(50))
            })
            .chain(pause_end)
            .chain(
                self.board_unsafe
                    .filter(|wind_down| !wind_down.killed)
                    .map(|wind_down| {
                        Duration::from_millis(
                            (wind_down.since_ms + grace).saturating_sub(mono).max(50),
                        )
                    }),
            )
            .chain(std::iter::once(self.settings.interval))
            .min()
            .unwrap_or(self.settings.interval)
    }

    /// Stops every worker of ours (SIGTERM, then SIGKILL after the grace
    /// period) and books each exit.
    pub async fn shut_down(&mut self) {
        // On an unsafe board the wind-down already stopped them, unrecorded.
        let children: Vec<Child> = if self.board_unsafe.is_none() {
            self.children.values().cloned().collect()
        } else {
            Vec::new()
        };
        for child in &children {
            self.stop(&child.claim, &child.process, SignalReason::Shutdown)
                .await;
        }
        let since = self.mono();
        let limit = millis(self.settings.grace) + millis(KILL_WAIT);
        while !self.children.is_empty() {
            self.tick(false).await;
            if self.children.is_empty() || self.mono().saturating_sub(since) > limit {
                break;
            }
            self.ports
                .wakeups
                .wait(Duration::from_millis(100).min(self.next_wait()))
                .await;
        }
        for child in self.children.values() {
            self.note(DispatchEvent::LeftRunning {
                task_id: child.claim.task_id.clone(),
                pid: child.process.pid,
            });
        }
    }

    /// One tick, in order: book the exits, stop work that lost its claim,
    /// escalate stops, watch every running card, promote, claim and spawn.
    pub async fn tick(&mut self, claiming: bool) -> TickReport {
        let mut report = TickReport::default();
        if self.board_unsafe.is_none()
            && let Err(error) = self.ports.board.check_health().await
        {
            self.note(DispatchEvent::BoardTrouble {
                message: error.to_string(),
            });
            self.halt(EnvironmentFault::Configuration(format!(
                "{error}; stop every kanban process on this board, then check it (a SQLite board: sqlite3 BOARD 'PRAGMA integrity_check') before dispatching again"
            )));
            self.begin_wind_down();
        }
        if self.board_unsafe.is_some() {
            self.wind_down().await;
            return report;
        }
        self.retry_unbooked().await;
        self.retry_unreleased().await;
        for exit in self.ports.supervisor.reap().await {
            if self.book_child(exit).await {
                report.booked += 1;
            }
        }
        let running = match self.ports.board.running_workers().await {
            Ok(running) => running,
            Err(error) => {
                self.board_trouble(&error);
                return report;
            }
        };
        let now = self.ports.clock.now();
        let mono = self.mono();
        self.observe(&running, mono);
        self.fence_children(&running, mono).await;
        report.booked += self.escalate(mono).await;
        for worker in &running {
            report.booked += self.watch_worker(worker, now, mono).await;
        }
        let paused = self.paused();
        let local = running
            .iter()
            .filter(|worker| self.host_local(&worker.claim))
            .count()
            .max(self.children.len());
        let room = self.settings.max_in_progress.saturating_sub(local);
        let mut why = "nothing more to claim now";
        if claiming && self.halt.is_none() && !paused {
            match self.ports.board.promote_ready().await {
                Ok(0) => {}
                Ok(count) => self.note(DispatchEvent::Promoted { count }),
                Err(error) => self.board_trouble(&error),
            }
            report.spawned = self.claim_and_spawn(&running).await;
            if report.spawned > 0 {
                // Claims went through: the environment is healthy again.
                self.next_pause = FIRST_PAUSE;
            }
            if room == 0 {
                why = "every slot is taken (--max-in-progress)";
            } else if report.spawned == room {
                why = "every free slot was filled";
            }
        } else {
            why = match (claiming, self.halt.is_some(), paused) {
                (false, _, _) => "not claiming: stopping",
                (_, true, _) => "not claiming: halted by a fault of the environment",
                _ => "not claiming: paused by a transient fault",
            };
        }
        self.note(DispatchEvent::Tick {
            running: local,
            room,
            spawned: report.spawned,
            why,
        });
        report.idle = report.spawned == 0
            && self.paused_until_ms.is_none()
            && running.is_empty()
            && self.children.is_empty()
            && self.stopping.is_empty();
        report
    }

    fn observe(&mut self, running: &[RunningWorker], mono: u64) {
        let live: std::collections::BTreeSet<i64> =
            running.iter().map(|worker| worker.claim.run_id).collect();
        self.watches.retain(|run_id, _| live.contains(run_id));
        self.run_routes.retain(|run_id, _| live.contains(run_id));
        for worker in running {
            if let Some(route) = self.route_of(worker.assignee.as_deref()) {
                self.run_routes.entry(worker.claim.run_id).or_insert(route);
            }
        }
        for worker in running {
            let watch = self
                .watches
                .entry(worker.claim.run_id)
                .or_insert_with(|| Watch {
                    first_seen_ms: mono,
                    heartbeat: worker.last_heartbeat_at,
                    heartbeat_seen_ms: mono,
                    expires: worker.claim_expires,
                    expires_seen_ms: mono,
                });
            if watch.heartbeat != worker.last_heartbeat_at {
                watch.heartbeat = worker.last_heartbeat_at;
                watch.heartbeat_seen_ms = mono;
            }
            if watch.expires != worker.claim_expires {
                watch.expires = worker.claim_expires;
                watch.expires_seen_ms = mono;
            }
        }
    }

    /// True when another holder's lease ran out: expired by this
    /// dispatcher's wall clock, and unchanged for a whole lease on its own
    /// monotonic clock. A live holder's lease changes at least every two
    /// thirds of a lease (its worker's heartbeats, its dispatcher's
    /// renewals), so however the hosts' clocks disagree, only a holder that
    /// stopped renewing loses its claim.
    fn lease_ran_out(&self, worker: &RunningWorker, now: i64, mono: u64) -> bool {
        if !lease_expired(worker.claim_expires, now) {
            return false;
        }
        let unchanged_ms = self
            .watches
            .get(&worker.claim.run_id)
            .map_or(0, |watch| mono.saturating_sub(watch.expires_seen_ms));
        let ttl_ms = u64::try_from(self.settings.ttl_seconds)
            .unwrap_or(0)
            .saturating_mul(1000);
        unchanged_ms >= ttl_ms
    }

    /// Seconds since `then` (a wall-clock time on the board) as far as
    /// this dispatcher can vouch for them: the wall clock's count, but never
    /// more than it watched the value itself on its own monotonic clock. A
    /// wall-clock jump, before or while it watches, cannot make time pass
    /// that did not; a dispatcher that just started stops nothing for an
    /// hour's silence before it saw that hour go by.
    fn seconds_since(then: i64, seen_ms: u64, now: i64, mono: u64) -> i64 {
        let by_wall = now.saturating_sub(then);
        let watched = i64::try_from(mono.saturating_sub(seen_ms) / 1000).unwrap_or(i64::MAX);
        by_wall.min(watched)
    }

    /// Seconds the worker has been silent: since its last heartbeat, or its
    /// run's start when it never sent one.
    fn silent_seconds(&self, worker: &RunningWorker, now: i64, mono: u64) -> i64 {
        let last = worker.last_heartbeat_at.unwrap_or(worker.run_started_at);
        let seen = self
            .watches
            .get(&worker.claim.run_id)
            .map_or(mono, |watch| watch.heartbeat_seen_ms);
        Self::seconds_since(last, seen, now, mono)
    }

    /// Seconds the run has run, measured the same careful way.
    fn run_seconds(&self, worker: &RunningWorker, now: i64, mono: u64) -> i64 {
        let seen = self
            .watches
            .get(&worker.claim.run_id)
            .map_or(mono, |watch| watch.first_seen_ms);
        Self::seconds_since(worker.run_started_at, seen, now, mono)
    }

    async fn fence_children(&mut self, running: &[RunningWorker], mono: u64) {
        let pids: Vec<u32> = self.children.keys().copied().collect();
        for pid in pids {
            let Some(child) = self.children.get(&pid).cloned() else {
                continue;
            };
            if running.iter().any(|worker| worker.claim == child.claim)
                || self.stopping.contains_key(&i64::from(pid))
            {
                continue;
            }
            let status = self.ports.board.run_status(&child.claim).await;
            let settle_window = millis(self.settings.grace);
            let fenced = match status {
                Ok(RunStatus::Running) => false,
                Ok(RunStatus::Done | RunStatus::Blocked) => {
                    // The worker's own terminal call closed the run: it exits
                    // by itself. Only one that lingers is stopped.
                    let since = *self
                        .children
                        .get_mut(&pid)
                        .map(|child| child.settled_since_ms.get_or_insert(mono))
                        .unwrap_or(&mut 0);
                    mono.saturating_sub(since) >= settle_window
                }
                Ok(RunStatus::Superseded) | Err(BoardError::TaskNotFound(_)) => true,
                Err(error) => {
                    self.board_trouble(&error);
                    false
                }
            };
            if fenced {
                self.stop(&child.claim, &child.process, SignalReason::Fenced)
                    .await;
            }
        }
    }

    /// Sends SIGTERM to a worker's group, recording why first.
    /// The board cannot be written safely: every worker of ours is asked to
    /// stop now (its work could not be recorded), without a word written to
    /// the board. A dispatcher on the repaired board books them from their
    /// sealed trailers.
    fn begin_wind_down(&mut self) {
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
        self.board_unsafe = Some(WindDown {
            since_ms: self.mono(),
            killed: false,
        });
    }

    /// Reaps the workers of a wind-down, killing their groups once the
    /// grace period is over.
    async fn wind_down(&mut self) {
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
        if let Some(wind_down) = &mut self.board_unsafe
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

    async fn stop(&mut self, claim: &Claim, process: &WorkerProcess, reason: SignalReason) {
        let pid = i64::from(process.pid);
        let started_at = process.started_at;
        if self.stopping.contains_key(&pid) {
            return;
        }
        // Recorded before the signal: a dispatcher that books the exit later,
        // after this one is gone, must still know why it ended. A passing
        // board fault is retried; the stop goes ahead either way.
        if reason != SignalReason::Fenced {
            let mut last = None;
            for _ in 0..SIGNAL_RECORD_ATTEMPTS {
                match self.ports.board.record_signal(claim, SIGTERM, reason).await {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(error) => last = Some(error),
                }
            }
            if let Some(error) = last {
                self.board_trouble(&error);
            }
        }
        self.ports
            .supervisor
            .signal(pid, started_at, StopSignal::Terminate);
        self.note(DispatchEvent::Stopping {
            task_id: claim.task_id.clone(),
            pid,
            reason,
        });
        let since_ms = self.mono();
        self.stopping.insert(
            pid,
            Stopping {
                claim: claim.clone(),
                process: process.clone(),
                reason,
                since_ms,
                killed: false,
                deferred: false,
            },
        );
    }

    /// Moves every stop along: SIGKILL after the grace period; a worker that
    /// survives even that has its reclaim deferred. Returns bookings made.
    async fn escalate(&mut self, mono: u64) -> usize {
        let mut booked = 0;
        let grace = millis(self.settings.grace);
        let pids: Vec<i64> = self.stopping.keys().copied().collect();
        for pid in pids {
            let Some(stop) = self.stopping.get(&pid).cloned() else {
                continue;
            };
            let ours = u32::try_from(pid)
                .ok()
                .is_some_and(|pid| self.children.contains_key(&pid));
            let alive = ours || self.ports.supervisor.alive(pid, stop.process.started_at);
            if !alive {
                // Not ours, so nobody reaps it: book it from the board.
                self.stopping.remove(&pid);
                let seal = stop.process.seal_digest.clone();
                booked += usize::from(
                    self.book_dead(&stop.claim, Some(stop.reason), seal.as_deref())
                        .await,
                );
                continue;
            }
            let elapsed = mono.saturating_sub(stop.since_ms);
            if !stop.killed && elapsed >= grace {
                self.ports
                    .supervisor
                    .signal(pid, stop.process.started_at, StopSignal::Kill);
                self.ports.supervisor.sweep(&stop.claim).await;
                self.note(DispatchEvent::Killed {
                    task_id: stop.claim.task_id.clone(),
                    pid,
                });
                if let Some(entry) = self.stopping.get_mut(&pid) {
                    entry.killed = true;
                }
            } else if stop.killed && elapsed >= grace + millis(KILL_WAIT) {
                // It survived SIGKILL (a process in uninterruptible sleep):
                // its lease is kept alive so no other host takes the card
                // from under it, and the deferral is recorded once.
                let now = self.ports.clock.now();
                let record =
                    (!stop.deferred).then_some(("reclaim_deferred", "worker_survived_termination"));
                match self
                    .ports
                    .board
                    .extend_lease(
                        &stop.claim,
                        now.saturating_add(self.settings.ttl_seconds),
                        record,
                    )
                    .await
                {
                    Ok(_) if !stop.deferred => {
                        self.note(DispatchEvent::ReclaimDeferred {
                            task_id: stop.claim.task_id.clone(),
                            pid,
                        });
                        if let Some(entry) = self.stopping.get_mut(&pid) {
                            entry.deferred = true;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => self.board_trouble(&error),
                }
            }
        }
        booked
    }

    /// Watches one running card; returns bookings made.
    async fn watch_worker(&mut self, worker: &RunningWorker, now: i64, mono: u64) -> usize {
        let claim = &worker.claim;
        let child = self
            .children
            .values()
            .find(|child| child.claim == *claim)
            .map(|child| child.process.clone());
        let recorded = worker
            .worker_pid
            .or(child.as_ref().map(|process| i64::from(process.pid)));
        if recorded.is_some_and(|pid| self.stopping.contains_key(&pid)) {
            return 0;
        }
        if !self.host_local(claim) {
            // Another host's worker: its own dispatcher watches it. Once its
            // lease has lapsed here too, its host is gone or cut off: a
            // worker that booked its result is booked from it; a claim that
            // never recorded a spawn is released uncounted; any other is
            // released as stale, counted.
            if self.lease_ran_out(worker, now, mono) {
                if let Ok(Some(_)) = self.ports.board.booked_result(claim).await {
                    let seal = worker.seal_digest.as_deref();
                    return usize::from(self.book_dead(claim, None, seal).await);
                }
                let release = match worker.worker_pid {
                    Some(_) => Release::Expired,
                    None => Release::NotStarted {
                        reason: "its dispatcher never started a worker".to_owned(),
                    },
                };
                self.release(claim, release).await;
            }
            return 0;
        }
        if let Some(process) = &child
            && worker.worker_pid.is_none()
        {
            // Our own worker whose spawn record failed: record it again.
            if let Err(error) = self.ports.board.record_spawn(claim, process).await {
                self.board_trouble(&error);
            }
        }
        let Some(pid) = recorded else {
            // Claimed, never spawned: its dispatcher died in between, or is
            // about to record the spawn.
            if self.ports.supervisor.claimer_gone(&claim.claim_lock)
                || self.lease_ran_out(worker, now, mono)
            {
                let reason = "its dispatcher stopped before starting a worker".to_owned();
                self.release(claim, Release::NotStarted { reason }).await;
            }
            return 0;
        };
        let ours = child.is_some();
        if !ours && u32::try_from(pid).is_ok_and(|pid| self.children.contains_key(&pid)) {
            // Our child of another run carries this pid: the recorded worker
            // is long gone.
            let seal = worker.seal_digest.as_deref();
            return usize::from(self.book_dead(claim, None, seal).await);
        }
        let process = child.unwrap_or_else(|| WorkerProcess {
            pid: u32::try_from(pid).unwrap_or(u32::MAX),
            started_at: worker.worker_started_at,
            seal_digest: worker.seal_digest.clone(),
        });
        if !self.ports.supervisor.alive(pid, process.started_at) {
            // Our own child is booked from its wait status once reaped (it
            // may have ended while this dispatcher was stalled); anyone
            // else's from what it left on the board.
            return if ours {
                0
            } else {
                let seal = worker.seal_digest.as_deref();
                usize::from(self.book_dead(claim, None, seal).await)
            };
        }
        let limit = worker
            .max_runtime_seconds
            .or(self.settings.max_runtime_seconds)
            .filter(|limit| *limit > 0);
        let grace = i64::try_from(self.settings.grace.as_secs()).unwrap_or(i64::MAX);
        if let Some(limit) = limit
            && self.run_seconds(worker, now, mono) > limit.saturating_add(grace)
        {
            self.stop(claim, &process, SignalReason::Overrun).await;
            return 0;
        }
        match stale_claim_action(true, Some(self.silent_seconds(worker, now, mono))) {
            StaleClaimAction::Terminate => {
                self.stop(claim, &process, SignalReason::Overrun).await;
            }
            StaleClaimAction::Extend => self.renew(worker, pid, now).await,
            StaleClaimAction::Release => {}
        }
        0
    }

    /// Renews a live local worker's lease once less than two thirds of it
    /// is left (or it lapsed): a live worker never loses its claim to a
    /// lease that ran down while its agent was quiet, and observers on
    /// other hosts see its lease move at least every two thirds of a lease.
    async fn renew(&mut self, worker: &RunningWorker, pid: i64, now: i64) {
        let ttl = self.settings.ttl_seconds;
        let left = worker
            .claim_expires
            .map_or(i64::MIN, |expires| expires.saturating_sub(now));
        if left >= ttl.saturating_mul(2) / 3 {
            return;
        }
        let lapsed = lease_expired(worker.claim_expires, now);
        let record = lapsed.then_some(("claim_extended", "worker_alive"));
        match self
            .ports
            .board
            .extend_lease(&worker.claim, now.saturating_add(ttl), record)
            .await
        {
            Ok(true) if lapsed => self.note(DispatchEvent::LeaseExtended {
                task_id: worker.claim.task_id.clone(),
                pid,
            }),
            Ok(_) => {}
            Err(error) => self.board_trouble(&error),
        }
    }

    async fn release(&mut self, claim: &Claim, release: Release) {
        let counted = release == Release::Expired;
        let why = match &release {
            Release::Expired => "its lease ran out and its worker is gone".to_owned(),
            Release::NotStarted { reason } => reason.clone(),
        };
        match self
            .ports
            .board
            .release_claim(claim, &release, &self.settings.failure_policy)
            .await
        {
            Ok(true) => {
                self.ports.supervisor.sweep(claim).await;
                self.note(DispatchEvent::Released {
                    task_id: claim.task_id.clone(),
                    counted,
                    why,
                });
            }
            Ok(false) => {}
            Err(error) => {
                self.board_trouble(&error);
                if self.unreleased.len() < UNBOOKED_LIMIT {
                    self.unreleased.push((claim.clone(), release));
                }
            }
        }
    }

    async fn retry_unreleased(&mut self) {
        let pending = std::mem::take(&mut self.unreleased);
        for (claim, release) in pending {
            self.release(&claim, release).await;
        }
    }

    async fn report(
        &mut self,
        claim: &Claim,
        witness: ExitWitness,
        source: &'static str,
        signalled: Option<SignalReason>,
        log: RunLog,
    ) -> ExitReport {
        // What the worker booked, whoever witnessed the exit.
        let result = self.ports.board.booked_result(claim).await.ok().flatten();
        let retry_after_seconds = result
            .as_ref()
            .and_then(|result| result.retry_after_seconds);
        let route = self.run_routes.get(&claim.run_id).cloned();
        let wall = match (&result, &route) {
            (Some(result), Some(route)) => {
                let reported = ProviderId {
                    provider: result.provider.clone(),
                    model: result.model.clone(),
                };
                let entitled = self
                    .settings
                    .routes
                    .get(route)
                    .map(|agent| entitled_provider(&agent.provider, &reported))
                    .unwrap_or_default();
                wall_hit(result, route, &self.identity(route), &entitled)
            }
            _ => None,
        };
        ExitReport {
            wall,
            witness,
            source,
            signalled,
            output_tail: log.output_tail,
            policy: self.settings.failure_policy,
            retry_after_seconds,
        }
    }

    /// Ends the bookkeeping of a worker that ended: a worker that reported
    /// a fault of the environment has its claim released uncounted and
    /// halts (or pauses) this dispatcher; any other exit is booked.
    async fn conclude(
        &mut self,
        claim: &Claim,
        witness: ExitWitness,
        source: &'static str,
        signalled: Option<SignalReason>,
        log: RunLog,
    ) -> bool {
        if let Some(fault) = log.fault.clone() {
            let reason = format!("its worker could not work the card: {fault}");
            match self
                .ports
                .board
                .release_claim(
                    claim,
                    &Release::NotStarted {
                        reason: reason.clone(),
                    },
                    &self.settings.failure_policy,
                )
                .await
            {
                Ok(true) => {
                    self.ports.supervisor.sweep(claim).await;
                    self.note(DispatchEvent::Released {
                        task_id: claim.task_id.clone(),
                        counted: false,
                        why: reason,
                    });
                    self.halt(fault);
                    return true;
                }
                Ok(false) => {}
                Err(error) => {
                    self.board_trouble(&error);
                    self.halt(fault);
                }
            }
        }
        let report = self.report(claim, witness, source, signalled, log).await;
        self.book(claim, report).await
    }

    async fn book(&mut self, claim: &Claim, report: ExitReport) -> bool {
        match self.ports.board.book_exit(claim, &report).await {
            Ok(booking) => {
                // Whatever of the run still runs (an agent the worker left
                // behind) stops now.
                self.ports.supervisor.sweep(claim).await;
                self.note(DispatchEvent::Booked {
                    task_id: claim.task_id.clone(),
                    witness: report.witness,
                    source: report.source,
                    booking,
                });
                true
            }
            Err(error) => {
                self.board_trouble(&error);
                if self.unbooked.len() < UNBOOKED_LIMIT {
                    self.unbooked.push((claim.clone(), report));
                }
                false
            }
        }
    }

    async fn retry_unbooked(&mut self) {
        let pending = std::mem::take(&mut self.unbooked);
        for (claim, report) in pending {
            self.book(&claim, report).await;
        }
    }

    async fn book_child(&mut self, exit: WorkerExit) -> bool {
        let Some(child) = self.children.remove(&exit.pid) else {
            return false;
        };
        let signalled = self
            .stopping
            .remove(&i64::from(exit.pid))
            .map(|stop| stop.reason);
        let log = self
            .ports
            .supervisor
            .run_log(&child.claim, child.process.seal_digest.as_deref())
            .await;
        self.conclude(&child.claim, exit.witness, "wait", signalled, log)
            .await
    }

    /// Books a worker of this host that ended while nobody waited for it:
    /// from its own `worker_result`, else its sealed log trailer.
    async fn book_dead(
        &mut self,
        claim: &Claim,
        signalled: Option<SignalReason>,
        seal_digest: Option<&str>,
    ) -> bool {
        let log = self.ports.supervisor.run_log(claim, seal_digest).await;
        let booked = self.ports.board.booked_result(claim).await.ok().flatten();
        let (witness, source) = match (booked, log.trailer_code) {
            (Some(result), _) => (ExitWitness::Code(result.exit_code), "worker_result"),
            (None, Some(code)) => (ExitWitness::Code(code), "trailer"),
            (None, None) => (ExitWitness::Unknown, "none"),
        };
        self.conclude(claim, witness, source, signalled, log).await
    }

    async fn claim_and_spawn(&mut self, running: &[RunningWorker]) -> usize {
        let local = running
            .iter()
            .filter(|worker| self.host_local(&worker.claim))
            .count()
            .max(self.children.len());
        let budget = self.settings.max_in_progress.saturating_sub(local);
        if budget == 0 {
            return 0;
        }
        let walls = match self.ports.board.walls().await {
            Ok(walls) => walls,
            Err(error) => {
                // Fail closed: a wall nobody can read might hold every card.
                self.board_trouble(&error);
                return 0;
            }
        };
        let running_runs: BTreeSet<i64> =
            running.iter().map(|worker| worker.claim.run_id).collect();
        let now = self.ports.clock.now();
        let mut open = BTreeSet::new();
        let mut probes = Vec::new();
        let mut held = BTreeMap::new();
        // Room per agent under its own limit, counting its runs on the board.
        let mut room: BTreeMap<String, usize> = BTreeMap::new();
        for (route, agent) in &self.settings.routes {
            if let Some(limit) = agent.max_in_progress {
                let runs = self.run_routes.values().filter(|r| *r == route).count();
                room.insert(route.clone(), limit.saturating_sub(runs));
            }
        }
        let routes: Vec<String> = self
            .settings
            .routes
            .keys()
            .filter(|route| room.get(*route) != Some(&0))
            .cloned()
            .collect();
        for route in &routes {
            let scopes = self.scopes.get(route).cloned().unwrap_or_default();
            match gate(&walls, &scopes, &running_runs, now) {
                Gate::Open => {
                    open.insert(route.clone());
                }
                Gate::Held { until } => {
                    held.insert(route.clone(), until);
                }
                Gate::Probe => {
                    let probed = probed_walls(&walls, &scopes, now)
                        .into_iter()
                        .map(|wall| wall.scope.clone())
                        .collect::<Vec<_>>();
                    probes.push((route.clone(), probed));
                }
            }
        }
        let label = |routes: &mut dyn Iterator<Item = &String>| {
            routes
                .map(|route| route_label(route).to_owned())
                .collect::<Vec<_>>()
        };
        self.note(DispatchEvent::ClaimPlan {
            open: label(&mut open.iter()),
            walled: label(&mut held.keys()),
            probing: label(&mut probes.iter().map(|(route, _)| route)),
            at_their_limit: label(
                &mut room
                    .iter()
                    .filter(|(_, left)| **left == 0)
                    .map(|(route, _)| route),
            ),
        });
        for (route, until) in &held {
            if self.held.get(route) != Some(until) {
                self.note(DispatchEvent::WallHeld {
                    route: route_label(route).to_owned(),
                    until: *until,
                    for_seconds: until.saturating_sub(now).max(0),
                });
            }
        }
        self.held = held;
        let mut spawned = 0;
        let mut probes = probes.into_iter();
        let mut left = budget;
        // Each claim call counts, found or not: a tick makes at most
        // `budget` of them.
        let mut calls = budget;
        'claiming: while left > 0 && calls > 0 {
            calls -= 1;
            // Probes first: one card per walled route whose reset came.
            let (filter, probe) = match probes.next() {
                Some((route, scopes)) => (self.filter_for([&route]), Some(scopes)),
                None if open.is_empty() => break,
                None => (self.filter_for(&open), None),
            };
            // Several cards in one transaction, unless a probe (one card)
            // or an agent's own limit has to be counted card by card.
            let want = if probe.is_none() && room.is_empty() {
                left
            } else {
                1
            };
            let locks: Vec<String> = (0..want)
                .map(|_| self.ports.supervisor.new_claim_lock())
                .collect();
            let grants = match self
                .ports
                .board
                .claim_ready_batch(self.settings.ttl_seconds, &locks, &filter)
                .await
            {
                Ok(grants) => grants,
                Err(error) => {
                    self.board_trouble(&error);
                    break;
                }
            };
            if grants.is_empty() {
                if probe.is_some() {
                    continue;
                }
                break;
            }
            let mut grants = grants.into_iter();
            while let Some(grant) = grants.next() {
                left = left.saturating_sub(1);
                match self
                    .start_grant(grant, probe.clone(), &mut room, &mut open)
                    .await
                {
                    Started::Spawned => spawned += 1,
                    Started::Skipped => {}
                    Started::Refused => left += 1,
                    Started::Stop => {
                        for rest in grants {
                            let reason = "claiming stopped before its worker started".to_owned();
                            self.release(&rest.claim, Release::NotStarted { reason })
                                .await;
                        }
                        break 'claiming;
                    }
                }
            }
        }
        spawned
    }

    /// Starts the worker of one claimed card: its agent, its probe record,
    /// the leftovers of its earlier runs, the spawn.
    async fn start_grant(
        &mut self,
        grant: ClaimGrant,
        probe: Option<Vec<String>>,
        room: &mut BTreeMap<String, usize>,
        open: &mut BTreeSet<String>,
    ) -> Started {
        let claim = grant.claim;
        let Some(route) = self.route_of(grant.assignee.as_deref()) else {
            // The filter admitted a card no agent serves: never spawn it.
            let reason = "no agent serves its assignee".to_owned();
            self.release(&claim, Release::NotStarted { reason }).await;
            return Started::Skipped;
        };
        if let Some(scopes) = probe {
            match self.ports.board.start_probe(&claim, &scopes).await {
                Ok(true) => {}
                Ok(false) => {
                    // Another dispatcher's probe got there first (or the
                    // wall was re-armed): the wall stays shut for this one.
                    let reason = "another run probes its wall".to_owned();
                    self.release(&claim, Release::NotStarted { reason }).await;
                    return Started::Refused;
                }
                Err(error) => {
                    self.board_trouble(&error);
                    let reason = "its wall probe could not be recorded".to_owned();
                    self.release(&claim, Release::NotStarted { reason }).await;
                    return Started::Stop;
                }
            }
            self.note(DispatchEvent::WallProbe {
                task_id: claim.task_id.clone(),
                scopes,
            });
        }
        self.run_routes.insert(claim.run_id, route.clone());
        if let Some(left) = room.get_mut(&route) {
            *left = left.saturating_sub(1);
            if *left == 0 {
                open.remove(&route);
            }
        }
        if grant.rerun && !self.ports.supervisor.sweep_earlier_runs(&claim).await {
            let reason = "a process of an earlier run of this card would not die".to_owned();
            self.release(&claim, Release::NotStarted { reason }).await;
            return Started::Skipped;
        }
        let process = match self
            .ports
            .supervisor
            .spawn(&claim, grant.goal_mode, &route)
            .await
        {
            Ok(process) => process,
            Err(fault) => {
                let reason = format!("the worker could not be started: {fault}");
                self.release(&claim, Release::NotStarted { reason }).await;
                self.halt(fault);
                return Started::Stop;
            }
        };
        self.note(DispatchEvent::Spawned {
            task_id: claim.task_id.clone(),
            run_id: claim.run_id,
            pid: process.pid,
        });
        self.children.insert(
            process.pid,
            Child {
                claim: claim.clone(),
                process: process.clone(),
                settled_since_ms: None,
            },
        );
        match self.ports.board.record_spawn(&claim, &process).await {
            Ok(()) => {}
            Err(BoardError::LeaseLost { .. }) => {
                // The claim moved on between the claim and the spawn; unless
                // the worker was quick enough to settle the card by its own
                // terminal call, and exits by itself (one that lingers is
                // stopped after the settle window, as any settled worker).
                match self.ports.board.run_status(&claim).await {
                    Ok(RunStatus::Done | RunStatus::Blocked) => {}
                    _ => self.stop(&claim, &process, SignalReason::Fenced).await,
                }
            }
            Err(error) => self.board_trouble(&error),
        }
        Started::Spawned
    }
}

/// What starting one claimed card came to.
enum Started {
    Spawned,
    /// Released unstarted; claiming goes on.
    Skipped,
    /// Released unstarted without using its room (a probe the board
    /// refused): claiming goes on, with the room for another card.
    Refused,
    /// Released unstarted; claiming stops for this tick.
    Stop,
}

/// The wall a worker's result says its run hit: exit 75 or 78 with a
/// failure reason that is a wall (or none: a credential the runner found
/// limited or refused).
fn wall_hit(
    result: &WorkerResult,
    route: &str,
    identity: &str,
    provider: &ProviderId,
) -> Option<WallHit> {
    let kind = match (&result.failure_reason, result.exit_code) {
        (Some(reason), 75 | 78) => WallKind::of_failure(reason)?,
        (None, 75) => WallKind::Rate,
        (None, 78) => WallKind::Credential,
        _ => return None,
    };
    Some(WallHit {
        scope: wall_scope(kind, identity, provider),
        kind,
        route: route_label(route).to_owned(),
        reported_wait: result.retry_after_seconds,
        reason: result.failure_reason.as_ref().map_or_else(
            || format!("exit {}", result.exit_code),
            |reason| reason.as_str().to_owned(),
        ),
    })
}
