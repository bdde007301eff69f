//! The dispatcher: one tick at a time, it books the workers that ended,
//! stops work that lost its claim, extends, stops or releases expired
//! claims, promotes, and claims ready cards for new workers.
//!
//! It only decides. The board, the processes and the waiting are ports
//! (`ports`), so the same dispatcher runs the real binary and the
//! deterministic simulation. Its concerns, a module each: which agent
//! serves a card and which walls hold it (`routing`), claiming and starting
//! workers (`claiming`), watching and stopping them (`children`), booking
//! their exits and releasing claims, again when the board failed
//! (`backlog`), faults of the environment and an unsafe board (`health`),
//! what it tells its log (`events`), and a dry run of a tick's claims
//! (`preview`).

mod backlog;
mod children;
mod claiming;
mod events;
mod health;
mod ports;
mod preview;
mod routing;

pub use events::{DispatchEvent, DispatchNotes};
pub use ports::{
    ClaimFilter, DispatchBoard, DispatcherReport, DispatcherState, ExitReport, RunLog,
    RunningWorker, STALE_HEARTBEAT_SECONDS, StaleClaimAction, StopSignal, Supervisor,
    TICK_BUCKETS_MS, TickDurations, Wakeups, WorkerExit, WorkerProcess, stale_claim_action,
};
pub use preview::{Foreseen, Gates, TickPreview, foresee};
pub use routing::assignees_behind;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::booking::SignalReason;
use crate::data::EnvironmentFault;
use crate::data::{Claim, FailurePolicy};

use crate::data::ExitCode;
use crate::ports::Clock;

use crate::walls::{AgentRoute, route_label, scopes_of};

use backlog::Backlog;
use children::{Child, Stopping, Watch};
use health::Health;
use routing::Routing;

/// How long a killed worker may take to disappear before its reclaim is deferred.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// The SIGTERM number, recorded with a stop.
const SIGTERM: i32 = 15;
/// Attempts at recording why a worker is stopped before it is signalled.
const SIGNAL_RECORD_ATTEMPTS: usize = 5;
/// Exits kept for a later attempt when the board could not book them.
const UNBOOKED_LIMIT: usize = 4096;
/// Failed bookings of one exit after which its content is suspected: it is
/// booked once more without the worker's output, and its card blocked.
const BOOKING_ATTEMPTS: u32 = 3;
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
    /// The dispatcher's exit code: success, interrupted for a stop, the
    /// fault's for a halt.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Self::Finished => ExitCode::Success,
            Self::Interrupted => ExitCode::Interrupted,
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

/// The dispatcher.
pub struct Dispatcher {
    ports: DispatchPorts,
    settings: DispatchSettings,
    /// The workers this dispatcher started, by pid, until booked.
    children: BTreeMap<u32, Child>,
    /// Workers being stopped (ours or, by the board, another host's), by pid.
    stopping: BTreeMap<i64, Stopping>,
    /// What this dispatcher saw of each running run, by run id.
    watches: BTreeMap<i64, Watch>,
    backlog: Backlog,
    health: Health,
    routing: Routing,
    ticks: TickClock,
}

/// Tick durations not yet added to the board's histogram.
#[derive(Debug)]
struct TickClock {
    durations: TickDurations,
    /// When they were last added (monotonic ms).
    flushed_ms: u64,
}

impl fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dispatcher")
            .field("settings", &self.settings)
            .field("children", &self.children.len())
            .field("halt", &self.health.halt)
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
            backlog: Backlog::default(),
            health: Health::default(),
            routing: Routing::new(scopes),
            ticks: TickClock {
                durations: TickDurations::default(),
                // The first flush comes a whole period after the start.
                flushed_ms: started_ms,
            },
        }
    }

    /// The workers this dispatcher started that have not been booked yet.
    pub fn children(&self) -> impl Iterator<Item = (&Claim, &WorkerProcess)> {
        self.children
            .values()
            .map(|child| (&child.claim, &child.process))
    }

    /// The fault that stopped claiming, if one did.
    pub fn halted(&self) -> Option<&EnvironmentFault> {
        self.health.halt.as_ref()
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

    /// The loop: tick, then wait for the interval, a worker's exit, a board
    /// change or a stop.
    pub async fn run(&mut self, mode: RunMode) -> DispatchEnd {
        loop {
            if self.ports.wakeups.stop_requested() {
                self.shut_down().await;
                self.tell_board(true).await;
                return DispatchEnd::Interrupted;
            }
            let began = self.mono();
            let report = self.tick(true).await;
            self.ticks
                .durations
                .observe(self.mono().saturating_sub(began));
            if self.mono().saturating_sub(self.ticks.flushed_ms) >= TICK_FLUSH_MS {
                self.tell_board(false).await;
            }
            if let Some(fault) = &self.health.halt
                && self.children.is_empty()
                && self.stopping.is_empty()
            {
                let fault = fault.clone();
                self.tell_board(true).await;
                return DispatchEnd::Halted(fault);
            }
            match mode {
                RunMode::Once => {
                    self.tell_board(true).await;
                    return DispatchEnd::Finished;
                }
                RunMode::UntilIdle if report.idle => {
                    self.tell_board(true).await;
                    return DispatchEnd::Finished;
                }
                _ => {}
            }
            let wait = self.next_wait();
            self.ports.wakeups.wait(wait).await;
        }
    }

    /// Tells the board how this dispatcher is (`ended`: it ends now) and
    /// adds the ticks counted since the last report to the board's
    /// histogram; nothing on a board found unsafe to write.
    async fn tell_board(&mut self, ended: bool) {
        self.ticks.flushed_ms = self.mono();
        if self.health.board_unsafe.is_some() {
            return;
        }
        let report = DispatcherReport {
            host: self.ports.supervisor.host().to_owned(),
            ticks: std::mem::take(&mut self.ticks.durations),
            in_flight: self.children.len() as u64,
            state: if ended {
                DispatcherState::Stopped
            } else {
                self.state()
            },
        };
        if let Err(error) = self.ports.board.report_dispatcher(&report).await {
            // Metrics are not worth a fault: note it, keep dispatching.
            self.note(DispatchEvent::BoardTrouble {
                message: error.to_string(),
            });
        }
    }

    /// Whether it claims now, and why not (what it reports to the board).
    pub fn state(&self) -> DispatcherState {
        if let Some(fault) = &self.health.halt {
            return DispatcherState::Halted(fault.to_string());
        }
        if self.ports.wakeups.stop_requested() {
            return DispatcherState::Stopping;
        }
        match (&self.health.paused_until_ms, &self.health.paused_by) {
            (Some(until), Some(why)) if self.mono() < *until => {
                DispatcherState::Paused(why.clone())
            }
            _ => DispatcherState::Claiming,
        }
    }

    /// The wait before the next tick: the interval, or sooner when a stop
    /// escalates or a pause ends.
    pub fn next_wait(&self) -> Duration {
        let mono = self.mono();
        let grace = millis(self.settings.grace);
        let pause_end = self
            .health
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
                self.health
                    .board_unsafe
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
        let children: Vec<Child> = if self.health.board_unsafe.is_none() {
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
        if !self.board_safe().await {
            self.wind_down().await;
            return report;
        }
        self.retry_unbooked().await;
        self.retry_unreleased().await;
        for exit in self.ports.supervisor.reap().await {
            report.booked += usize::from(self.book_child(exit).await);
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
        let stopped = self.escalate(mono).await;
        report.booked += stopped.len();
        // A run booked as its stop ended is still in `running`, read before.
        for worker in running
            .iter()
            .filter(|w| !stopped.contains(&w.claim.run_id))
        {
            report.booked += self.watch_worker(worker, now, mono).await;
        }
        report.spawned = self.claim_step(claiming, &running).await;
        report.idle = report.spawned == 0
            && self.health.paused_until_ms.is_none()
            && running.is_empty()
            && self.children.is_empty()
            && self.stopping.is_empty();
        report
    }

    /// Promotes, then claims into this host's free slots unless claiming
    /// stopped, halted or paused; how many workers started (said in the
    /// log with why no more did).
    async fn claim_step(&mut self, claiming: bool, running: &[RunningWorker]) -> usize {
        let paused = self.paused();
        let ours = running
            .iter()
            .filter(|worker| self.host_local(&worker.claim));
        let local = ours.count().max(self.children.len());
        let room = self.settings.max_in_progress.saturating_sub(local);
        let mut spawned = 0;
        let why = match (claiming, self.health.halt.is_some(), paused) {
            (false, _, _) => "not claiming: stopping",
            (_, true, _) => "not claiming: halted by a fault of the environment",
            (_, _, true) => "not claiming: paused by a transient fault",
            _ => {
                match self.ports.board.promote_ready().await {
                    Ok(0) => {}
                    Ok(count) => self.note(DispatchEvent::Promoted { count }),
                    Err(error) => self.board_trouble(&error),
                }
                spawned = self.claim_and_spawn(running, room).await;
                if spawned > 0 {
                    // Claims went through: the environment is healthy again.
                    self.health.next_pause = FIRST_PAUSE;
                }
                if room == 0 {
                    "every slot is taken (--max-in-progress)"
                } else if spawned == room {
                    "every free slot was filled"
                } else {
                    "nothing more to claim now"
                }
            }
        };
        self.note(DispatchEvent::Tick {
            running: local,
            room,
            spawned,
            why,
        });
        spawned
    }
}
