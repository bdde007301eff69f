//! Deterministic simulation of the whole protocol.
//!
//! One seed draws a fleet (hosts, cards, each card's runs), a fault mix and
//! a schedule. Dispatchers (core's `Dispatcher`), workers (core's
//! `run_worker`) and agents run as simulated processes: futures polled one
//! at a time, in an order drawn from the seed, over virtual time, against
//! the real board (SQLite, in memory or on a file). Faults are injected
//! between steps: kills of workers and dispatchers, graceful stops,
//! pauses longer than a lease, clock skew and forward jumps per host,
//! board failures (busy, disk full, I/O) at call sites drawn per seed,
//! failed spawns, agents orphaned by their worker's death, and agents that
//! fail in every way a provider fails, hang or crawl.
//!
//! After every step the invariants are checked: the board's own structure
//! (one open run per running card, none elsewhere), no write accepted from
//! a fenced-out run, never two live agents of one card on one host. When
//! the faulty phase ends, the simulation heals (faults off, processes
//! resumed, clocks aligned, one dispatcher per host) and every card must
//! reach `done` or a documented `blocked` within a virtual-time budget;
//! then every run must have been closed exactly once, booked with the code
//! its worker exited with, and charged only for what it did.
//!
//! A failing seed prints itself; `run_seed` with the same seed replays it
//! exactly.

mod agent;
mod board;
mod exec;
mod host;
mod rng;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kanban_board_sqlite::SqliteBoard;
use kanban_core::rules::FailurePolicy;
use kanban_core::{DispatchSettings, NewTask, StopReason, TaskStatus, WorkerExit};
use serde_json::Value;

use agent::{RunScript, WorkerPlan, orphan_agent};
use board::SimBoard;
use exec::{Kill, ProcEnd, ProcFuture, ProcId, ProcKind, Shared, SimClock, World, poll_process};
use host::{Fleet, start_dispatcher, witness};
use rng::Rng;

/// What a seed's run did, counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub steps: u64,
    pub virtual_seconds: u64,
    pub hosts: u64,
    pub cards: u64,
    pub runs: u64,
    pub worker_kills: u64,
    pub dispatcher_kills: u64,
    pub dispatcher_stops: u64,
    pub pauses: u64,
    pub clock_jumps: u64,
    pub clock_skews: u64,
    pub board_faults: u64,
    pub spawn_faults: u64,
    pub orphaned_agents: u64,
    pub stale_writes_refused: u64,
    pub bookings: u64,
}

impl Counts {
    /// Faults injected, of every kind.
    pub fn faults(&self) -> u64 {
        self.worker_kills
            + self.dispatcher_kills
            + self.dispatcher_stops
            + self.pauses
            + self.clock_jumps
            + self.clock_skews
            + self.board_faults
            + self.spawn_faults
    }

    /// Adds another run's counts to these.
    pub fn add(&mut self, other: &Counts) {
        self.steps += other.steps;
        self.virtual_seconds += other.virtual_seconds;
        self.hosts += other.hosts;
        self.cards += other.cards;
        self.runs += other.runs;
        self.worker_kills += other.worker_kills;
        self.dispatcher_kills += other.dispatcher_kills;
        self.dispatcher_stops += other.dispatcher_stops;
        self.pauses += other.pauses;
        self.clock_jumps += other.clock_jumps;
        self.clock_skews += other.clock_skews;
        self.board_faults += other.board_faults;
        self.spawn_faults += other.spawn_faults;
        self.orphaned_agents += other.orphaned_agents;
        self.stale_writes_refused += other.stale_writes_refused;
        self.bookings += other.bookings;
    }
}

/// Where the simulated board lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimStore {
    /// SQLite in memory: the fast default.
    Memory,
    /// A SQLite file in a temporary folder, one host (as SQLite serves one machine).
    File,
    /// A fresh database on the shared PostgreSQL test cluster
    /// ([`crate::PgCluster::shared`]), with several hosts.
    Postgres,
}

impl SimStore {
    /// The store as `KANBAN_SIM_STORE` names it (`memory`, `file`, `postgres`).
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim() {
            "memory" => Some(Self::Memory),
            "file" => Some(Self::File),
            "postgres" => Some(Self::Postgres),
            _ => None,
        }
    }

    /// What a replay command sets to run on this store.
    fn replay_setting(self) -> &'static str {
        match self {
            Self::Memory => "",
            Self::File => "KANBAN_SIM_STORE=file ",
            Self::Postgres => "KANBAN_SIM_STORE=postgres ",
        }
    }
}

/// One simulation run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimOptions {
    pub seed: u64,
    /// Steps of the faulty phase (each step polls one process once).
    pub steps: u64,
    pub store: SimStore,
    /// Keep the whole trace (a replay), not only its last few hundred lines.
    pub whole_trace: bool,
}

/// What a seed's run found.
#[derive(Clone, Debug, Default)]
pub struct SimReport {
    pub seed: u64,
    pub counts: Counts,
    /// Cards per final status.
    pub statuses: BTreeMap<String, u64>,
    /// Every invariant violation, liveness failure and finding; empty when
    /// the seed passed.
    pub findings: Vec<String>,
    /// The last lines of the run's trace, for a failing seed.
    pub trace: Vec<String>,
    /// The trace leading to the first finding raised during the run.
    pub first_finding_trace: Vec<String>,
}

impl SimReport {
    /// The report of a failing seed: what broke, how to replay it, and the
    /// end of the trace.
    pub fn failure_text(&self, options: &SimOptions) -> String {
        format!(
            "simulation seed {} failed ({} steps, {:?}):\n  {}\nreplay: {}KANBAN_SIM_SEED={} KANBAN_SIM_STEPS={} cargo test -p kanban-testkit --test it sim::seeds_hold -- --nocapture\nthe trace up to the first finding:\n{}\nthe last trace lines:\n{}",
            self.seed,
            options.steps,
            options.store,
            self.findings.join("\n  "),
            options.store.replay_setting(),
            self.seed,
            options.steps,
            self.first_finding_trace.join("\n"),
            self.trace
                .iter()
                .rev()
                .take(if options.whole_trace { usize::MAX } else { 60 })
                .rev()
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        )
    }
}

/// Per-run facts the end-of-run checks need.
#[derive(Debug, Default, Clone, Copy)]
struct RunFacts {
    /// Its worker was killed or paused, or its script may fail: a counted
    /// failure is the run's own doing.
    own_cause: bool,
    /// Its lease was at risk for the environment: board faults, its host's
    /// dispatcher dead or stalled, its host's clock jumped. A stale release
    /// of it is counted, as the reference counts one.
    lease_at_risk: bool,
}

struct Scheduler {
    world: Shared,
    futures: BTreeMap<ProcId, ProcFuture>,
    fleet: Arc<Fleet>,
    hosts: usize,
    rng: Rng,
    restarts: Vec<(u64, usize)>,
    next_fault_step: u64,
    board_faults_until: u64,
    worker_claims: BTreeMap<ProcId, kanban_core::Claim>,
    facts: BTreeMap<i64, RunFacts>,
    healing: bool,
}

/// The seconds a lease lasts in a run: drawn per seed.
const TTLS: [i64; 3] = [60, 120, 300];

impl Scheduler {
    fn live_procs(&self, filter: impl Fn(&ProcKind) -> bool) -> Vec<ProcId> {
        let world = self.world.lock();
        world
            .procs
            .iter()
            .filter(|(id, proc)| proc.alive && self.futures.contains_key(id) && filter(&proc.kind))
            .map(|(id, _)| *id)
            .collect()
    }

    fn open_runs(&self) -> Vec<i64> {
        let world = self.world.lock();
        world
            .procs
            .values()
            .filter(|proc| proc.alive)
            .filter_map(|proc| match proc.kind {
                ProcKind::Worker { run_id, .. } => Some(run_id),
                _ => None,
            })
            .collect()
    }

    /// Ends a process: records how, tells its dispatcher, maybe orphans its agent.
    fn end_process(&mut self, id: ProcId, end: ProcEnd, kill: Option<Kill>) {
        self.futures.remove(&id);
        let mut world = self.world.lock();
        let Some(proc) = world.procs.get_mut(&id) else {
            return;
        };
        if !proc.alive {
            return;
        }
        proc.alive = false;
        let host = proc.host;
        let kind = proc.kind.clone();
        world.say(format!("process {id} ends: {end:?}"));
        match kind {
            ProcKind::Worker {
                task_id,
                run_id,
                dispatcher,
            } => {
                world.worker_ends.insert(
                    run_id,
                    match end {
                        ProcEnd::Exited(code) => Some(code),
                        ProcEnd::Killed => None,
                    },
                );
                let agent_live = world
                    .agents
                    .get_mut(&task_id)
                    .is_some_and(|live| live.remove(&(host, id)));
                let orphaned = matches!(kill, Some(Kill::Process | Kill::Group));
                if agent_live && orphaned && world.rng.chance(500) {
                    // The agent was in its own process group: it lives on.
                    if let Some(claim) = self.worker_claims.get(&id).cloned() {
                        let seconds = world.rng.between(1, 40);
                        let future = orphan_agent(
                            self.world.clone(),
                            self.fleet.board.clone(),
                            claim,
                            seconds,
                        );
                        let (orphan, _) = world.spawn(
                            host,
                            ProcKind::OrphanAgent {
                                task_id: task_id.clone(),
                                run_id,
                            },
                            future,
                        );
                        world
                            .agents
                            .entry(task_id)
                            .or_default()
                            .insert((host, orphan));
                        world.counts.orphaned_agents += 1;
                    }
                }
                let parent_alive = world.procs.get(&dispatcher).is_some_and(|proc| proc.alive);
                if parent_alive {
                    world.exits.entry(dispatcher).or_default().push(WorkerExit {
                        pid: id,
                        witness: witness(end),
                    });
                    world.woken.insert(dispatcher);
                }
            }
            ProcKind::OrphanAgent { task_id, .. } => {
                if let Some(live) = world.agents.get_mut(&task_id) {
                    live.remove(&(host, id));
                }
            }
            ProcKind::Dispatcher => {
                let at = world.now_ms + world.rng.between(1_000, 90_000);
                self.restarts.push((at, host));
            }
        }
    }

    /// Takes in what the last poll asked for: new processes, kills.
    fn settle(&mut self) {
        loop {
            let (spawns, kills) = {
                let mut world = self.world.lock();
                (
                    std::mem::take(&mut world.spawns),
                    std::mem::take(&mut world.kills),
                )
            };
            if spawns.is_empty() && kills.is_empty() {
                return;
            }
            for (id, future) in spawns {
                if let Some(claim) = self.claim_of(id) {
                    self.worker_claims.insert(id, claim);
                }
                self.futures.insert(id, future);
            }
            for (id, how) in kills {
                self.end_process(id, ProcEnd::Killed, Some(how));
            }
        }
    }

    fn claim_of(&self, id: ProcId) -> Option<kanban_core::Claim> {
        let world = self.world.lock();
        let ProcKind::Worker {
            task_id, run_id, ..
        } = &world.procs.get(&id)?.kind
        else {
            return None;
        };
        let (task_id, run_id) = (task_id.clone(), *run_id);
        drop(world);
        // The lock is the one the claim carried: read it from the board.
        let view = crate::block_on(self.fleet.board.inner.show_task(&task_id)).ok()?;
        let run = view.runs.iter().find(|run| run.id == run_id)?;
        Some(kanban_core::Claim {
            task_id,
            db: self.fleet.board.inner.location(),
            run_id,
            claim_lock: run.claim_lock.clone()?,
            board: None,
        })
    }

    fn due_restarts(&mut self) {
        let now = self.world.lock().now_ms;
        let due: Vec<usize> = self
            .restarts
            .iter()
            .filter(|(at, _)| *at <= now)
            .map(|(_, host)| *host)
            .collect();
        self.restarts.retain(|(at, _)| *at > now);
        for host in due {
            let running = {
                let world = self.world.lock();
                world
                    .procs
                    .values()
                    .any(|p| p.alive && p.host == host && p.kind == ProcKind::Dispatcher)
            };
            if !running {
                start_dispatcher(&self.world, &self.fleet, host);
                self.settle();
            }
        }
    }

    fn mark_open_runs(&mut self, mark: impl Fn(&mut RunFacts)) {
        for run in self.open_runs() {
            mark(self.facts.entry(run).or_default());
        }
    }

    /// Marks the leases of every open run on `host` as at risk.
    fn risk_host(&mut self, host: usize) {
        let runs: Vec<i64> = {
            let world = self.world.lock();
            world
                .procs
                .values()
                .filter(|proc| proc.alive && proc.host == host)
                .filter_map(|proc| match proc.kind {
                    ProcKind::Worker { run_id, .. } => Some(run_id),
                    _ => None,
                })
                .collect()
        };
        for run in runs {
            self.facts.entry(run).or_default().lease_at_risk = true;
        }
    }

    fn host_of(&self, id: ProcId) -> usize {
        self.world.lock().procs.get(&id).map_or(0, |proc| proc.host)
    }

    /// Injects one fault, drawn from the seed.
    fn fault(&mut self, step: u64) {
        if step < self.next_fault_step {
            return;
        }
        self.next_fault_step = step + self.rng.between(15, 80);
        let ttl = self.fleet.settings.ttl_seconds as u64;
        match self.rng.below(100) {
            0..=29 => self.kill_worker(),
            30..=39 => self.kill_dispatcher(),
            40..=46 => self.stop_dispatcher(),
            47..=66 => self.stall_process(ttl),
            67..=74 => self.jump_clock(),
            75..=82 => self.skew_clock(),
            _ => self.misbehave(step),
        }
        self.settle();
    }

    /// A worker killed with SIGKILL.
    fn kill_worker(&mut self) {
        let workers = self.live_procs(|kind| matches!(kind, ProcKind::Worker { .. }));
        if let Some(id) = workers.get(self.rng.pick(workers.len())).copied() {
            let run = self.run_of(id);
            if let Some(run) = run {
                self.facts.entry(run).or_default().own_cause = true;
            }
            let mut world = self.world.lock();
            world.counts.worker_kills += 1;
            world.say(format!("fault: kill -9 worker {id}"));
            world.kills.push((id, Kill::Process));
        }
    }

    /// A dispatcher killed with SIGKILL.
    fn kill_dispatcher(&mut self) {
        let dispatchers = self.live_procs(|kind| *kind == ProcKind::Dispatcher);
        if let Some(id) = dispatchers.get(self.rng.pick(dispatchers.len())).copied() {
            self.risk_host(self.host_of(id));
            let mut world = self.world.lock();
            world.counts.dispatcher_kills += 1;
            world.say(format!("fault: kill -9 dispatcher {id}"));
            world.kills.push((id, Kill::Process));
        }
    }

    /// A dispatcher asked to stop (SIGTERM).
    fn stop_dispatcher(&mut self) {
        let dispatchers = self.live_procs(|kind| *kind == ProcKind::Dispatcher);
        if let Some(id) = dispatchers.get(self.rng.pick(dispatchers.len())).copied() {
            self.risk_host(self.host_of(id));
            let mut world = self.world.lock();
            world.counts.dispatcher_stops += 1;
            world.say(format!("fault: SIGTERM to dispatcher {id}"));
            if let Some(proc) = world.procs.get_mut(&id) {
                proc.stop = Some(StopReason::Signal(15));
            }
            world.woken.insert(id);
        }
    }

    /// A process stalled: briefly, past a lease, or for an hour.
    fn stall_process(&mut self, ttl: u64) {
        let all = self.live_procs(|kind| !matches!(kind, ProcKind::OrphanAgent { .. }));
        if let Some(id) = all.get(self.rng.pick(all.len())).copied() {
            let seconds = match self.rng.below(10) {
                0..=5 => self.rng.between(1, ttl),
                6..=8 => self.rng.between(ttl, 3 * ttl),
                _ => self.rng.between(3600, 7200),
            };
            if let Some(run) = self.run_of(id) {
                self.facts.entry(run).or_default().own_cause = true;
            } else {
                self.risk_host(self.host_of(id));
            }
            let mut world = self.world.lock();
            world.counts.pauses += 1;
            let until = world.now_ms + seconds * 1000;
            world.say(format!("fault: process {id} stalls for {seconds} s"));
            if let Some(proc) = world.procs.get_mut(&id) {
                proc.paused_until = Some(until);
            }
        }
    }

    /// A host's clock jumps forward.
    fn jump_clock(&mut self) {
        let host = self.rng.pick(self.hosts);
        let jump = self.rng.between(3600, 7200) as i64;
        self.risk_host(host);
        let mut world = self.world.lock();
        world.counts.clock_jumps += 1;
        world.host_offsets[host] += jump;
        world.say(format!(
            "fault: the clock of h{host} jumps {jump} s forward"
        ));
    }

    /// A host's clock drifts.
    fn skew_clock(&mut self) {
        let host = self.rng.pick(self.hosts);
        let skew = self.rng.between(0, 120) as i64 - 60;
        let mut world = self.world.lock();
        world.counts.clock_skews += 1;
        world.host_offsets[host] += skew;
        world.say(format!("fault: the clock of h{host} drifts {skew} s"));
    }

    /// The board fails its calls for a while.
    fn misbehave(&mut self, step: u64) {
        let span = self.rng.between(20, 300);
        self.board_faults_until = step + span;
        self.fleet
            .spawn_faults
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut world = self.world.lock();
        world.board_faults.active = true;
        world.say(format!("fault: the board misbehaves for {span} steps"));
    }

    fn run_of(&self, id: ProcId) -> Option<i64> {
        match self.world.lock().procs.get(&id)?.kind {
            ProcKind::Worker { run_id, .. } => Some(run_id),
            _ => None,
        }
    }

    /// Polls one runnable process, or moves time to the next event.
    /// Returns false when nothing can ever run again.
    fn step(&mut self) -> bool {
        self.due_restarts();
        let runnable: Vec<ProcId> = {
            let mut world = self.world.lock();
            let now = world.now_ms;
            for proc in world.procs.values_mut() {
                if proc.paused_until.is_some_and(|until| until <= now) {
                    proc.paused_until = None;
                }
            }
            let woken = world.woken.clone();
            world
                .procs
                .iter()
                .filter(|(id, proc)| {
                    proc.alive
                        && self.futures.contains_key(id)
                        && proc.paused_until.is_none()
                        && (woken.contains(id) || proc.wake_at.is_some_and(|at| at <= now))
                })
                .map(|(id, _)| *id)
                .collect()
        };
        if runnable.is_empty() {
            return self.advance_time();
        }
        let id = runnable[self.rng.pick(runnable.len())];
        let Some(mut future) = self.futures.remove(&id) else {
            return true;
        };
        match poll_process(&self.world, id, &mut future) {
            Some(end) => {
                self.futures.insert(id, future);
                self.end_process(id, end, None);
            }
            None => {
                self.futures.insert(id, future);
            }
        }
        self.settle();
        true
    }

    fn advance_time(&mut self) -> bool {
        let mut world = self.world.lock();
        let next = world
            .procs
            .iter()
            .filter(|(id, proc)| proc.alive && self.futures.contains_key(id))
            .filter_map(|(_, proc)| match proc.paused_until {
                Some(until) => Some(until),
                None => proc.wake_at,
            })
            .chain(self.restarts.iter().map(|(at, _)| *at))
            .min();
        match next {
            Some(at) if at > world.now_ms => {
                world.now_ms = at;
                true
            }
            Some(_) => true,
            None => false,
        }
    }

    /// The invariants checked after every step.
    fn check_step(&mut self) {
        let audit = self.fleet.board.inner.audit();
        let mut world = self.world.lock();
        match audit {
            Ok(problems) => {
                for problem in problems {
                    world.finding(format!("board: {problem}"));
                }
            }
            Err(error) => world.finding(format!("board audit failed: {error}")),
        }
        let crowded: Vec<String> = world
            .agents
            .iter()
            .filter_map(|(task, live)| {
                let hosts: BTreeSet<usize> = live.iter().map(|(host, _)| *host).collect();
                (hosts.len() < live.len()).then(|| format!("{task}: {live:?}"))
            })
            .collect();
        for card in crowded {
            world.finding(format!("two live agents of one card on one host: {card}"));
        }
    }
}

/// A seed's dispatcher settings, for leases of `ttl` seconds.
fn sim_settings(rng: &mut Rng, ttl: i64) -> DispatchSettings {
    DispatchSettings {
        ttl_seconds: ttl,
        max_in_progress: 1 + rng.pick(4),
        failure_policy: FailurePolicy {
            failure_limit: 2 + rng.pick(2) as u32,
            rate_limit_cooldown: rng.between(10, 120) as i64,
            backoff_base_seconds: rng.between(0, 60) as i64,
            ..FailurePolicy::default()
        },
        interval: Duration::from_secs(rng.between(1, 30)),
        grace: Duration::from_secs(rng.between(1, 10)),
        max_runtime_seconds: None,
        routes: Default::default(),
        unassigned_route: None,
    }
}

/// What one run of a card does, drawn from the seed.
fn run_script(rng: &mut Rng, ttl: i64) -> RunScript {
    match rng.below(100) {
        0..=29 => RunScript::Complete {
            failing: rng.below(4) as u32,
        },
        30..=34 => RunScript::Block,
        35..=46 => RunScript::Prose,
        47..=58 => RunScript::Wall,
        59..=62 => RunScript::Auth,
        63..=72 => RunScript::Crash,
        73..=80 => RunScript::Hang {
            seconds: rng.between(1, 3 * ttl as u64),
        },
        81..=90 => RunScript::Slow {
            seconds: rng.between(ttl as u64, 4 * ttl as u64),
        },
        _ => RunScript::IterationLimit,
    }
}

/// Builds a seed's fleet: hosts, settings, cards and their scripts.
fn fleet(options: &SimOptions, world: &Shared, rng: &mut Rng) -> (Arc<Fleet>, usize) {
    let hosts = match options.store {
        SimStore::Memory | SimStore::Postgres => 1 + rng.pick(3),
        SimStore::File => 1,
    };
    let clock = Arc::new(SimClock(world.clone()));
    let mut database = None;
    let inner: Box<dyn board::Stored> = match options.store {
        SimStore::Memory => {
            Box::new(SqliteBoard::open_in_memory(clock).expect("a board in memory"))
        }
        SimStore::File => {
            let dir = tempfile::tempdir().expect("a temporary folder").keep();
            Box::new(SqliteBoard::create(dir.join("kanban.db"), clock).expect("a board file"))
        }
        SimStore::Postgres => {
            let cluster = crate::PgCluster::shared();
            let name = cluster.fresh_database_name();
            let board = crate::pg::pg_board_at(&cluster.url(&name), clock);
            database = Some(name);
            Box::new(board)
        }
    };
    let ttl = TTLS[rng.pick(TTLS.len())];
    let settings = sim_settings(rng, ttl);
    let plan = WorkerPlan {
        heartbeat_interval: Duration::from_secs(kanban_core::heartbeat_interval_seconds(ttl)),
        run_limit: None,
        failure_policy: settings.failure_policy,
    };
    let board = Arc::new(SimBoard {
        inner,
        world: world.clone(),
        database,
    });
    let cards = 3 + rng.pick(10);
    let mut scripts = BTreeMap::new();
    let mut card_parents = BTreeMap::new();
    let mut ids: Vec<String> = Vec::new();
    for index in 0..cards {
        let parents = if index > 0 && rng.chance(150) {
            vec![ids[rng.pick(ids.len())].clone()]
        } else {
            Vec::new()
        };
        let new = NewTask {
            title: format!("card {index}"),
            priority: rng.below(3) as i64,
            parents: parents.clone(),
            max_retries: rng.chance(150).then(|| 1 + rng.below(3) as u32),
            ..NewTask::default()
        };
        let id = crate::block_on(board.inner.create_task(&new)).expect("a card");
        let runs = rng.below(4);
        let script: Vec<RunScript> = (0..runs).map(|_| run_script(rng, ttl)).collect();
        world
            .lock()
            .aliases
            .push((id.clone(), format!("card{index}")));
        scripts.insert(id.clone(), script);
        card_parents.insert(id.clone(), parents);
        ids.push(id);
    }
    let fleet = Fleet {
        board,
        scripts,
        parents: card_parents,
        plan,
        settings,
        spawn_faults: std::sync::atomic::AtomicBool::new(false),
    };
    (Arc::new(fleet), hosts)
}

/// The event kinds that close a run: exactly one per closed run.
const CLOSING: [&str; 10] = [
    "completed",
    "blocked",
    "reclaimed",
    "released",
    "timed_out",
    "protocol_violation",
    "rate_limited",
    "crashed",
    "terminal_provider",
    "interrupted",
];

/// The checks of a settled card's runs: each closed once, booked with
/// its worker's own exit, charged only for what it caused.
fn check_runs(
    scheduler: &Scheduler,
    world: &World,
    task: &kanban_core::TaskRecord,
    view: &kanban_core::TaskView,
    report: &mut SimReport,
) {
    for run in &view.runs {
        let closing: Vec<&kanban_core::EventRecord> = view
            .events
            .iter()
            .filter(|e| e.run_id == Some(run.id) && CLOSING.contains(&e.kind.as_str()))
            .collect();
        if run.ended_at.is_some() && closing.len() != 1 {
            report.findings.push(format!(
                "{} run {} was closed by {} events: {:?}",
                task.id,
                run.id,
                closing.len(),
                closing.iter().map(|e| &e.kind).collect::<Vec<_>>()
            ));
        }
        let facts = scheduler.facts.get(&run.id).copied().unwrap_or_default();
        let script_may_fail = world
            .run_scripts
            .get(&run.id)
            .is_some_and(|script| script.may_fail());
        for event in &closing {
            if event.payload.get("source") == Some(&Value::from("wait")) {
                let booked = event.payload["exit_code"].as_i64();
                let exited = world.worker_ends.get(&run.id).copied().flatten();
                if booked.is_some() && booked != exited.map(i64::from) {
                    report.findings.push(format!(
                        "{} run {} was booked with exit {booked:?} but its worker exited {exited:?}",
                        task.id, run.id
                    ));
                }
            }
            if event.payload["counted"] == Value::Bool(true) {
                let excused = facts.own_cause
                    || script_may_fail
                    || (event.kind == "reclaimed" && facts.lease_at_risk);
                if !excused {
                    report.findings.push(format!(
                        "{} run {}: a failure was counted ({}) that the run did not cause: {}",
                        task.id, run.id, event.kind, event.payload
                    ));
                }
            }
        }
    }
}

/// The checks once every card settled.
fn check_end(scheduler: &Scheduler, report: &mut SimReport) {
    let board = &scheduler.fleet.board.inner;
    let tasks = match crate::block_on(board.list_tasks(None)) {
        Ok(tasks) => tasks,
        Err(error) => {
            report
                .findings
                .push(format!("cannot list the cards: {error}"));
            return;
        }
    };
    let world = scheduler.world.lock();
    for task in &tasks {
        *report
            .statuses
            .entry(task.status.as_str().to_owned())
            .or_default() += 1;
        let Ok(view) = crate::block_on(board.show_task(&task.id)) else {
            report.findings.push(format!("{}: cannot be read", task.id));
            continue;
        };
        report.counts.runs += view.runs.len() as u64;
        let waits_on_a_human = task.status == TaskStatus::Todo
            && view.parents.iter().any(|parent| {
                tasks
                    .iter()
                    .any(|t| t.id == *parent && t.status != TaskStatus::Done)
            });
        if !matches!(
            task.status.known(),
            Some(TaskStatus::Done | TaskStatus::Blocked)
        ) && !waits_on_a_human
        {
            report.findings.push(format!(
                "liveness: {} is still {} after healing",
                task.id,
                task.status.as_str()
            ));
        }
        if task.status == TaskStatus::Blocked
            && !view
                .events
                .iter()
                .any(|e| matches!(e.kind.as_str(), "gave_up" | "blocked"))
        {
            report
                .findings
                .push(format!("{} is blocked without a recorded reason", task.id));
        }
        check_runs(scheduler, &world, task, &view, report);
    }
    report.counts.cards = tasks.len() as u64;
}

/// Runs one seed: the faulty phase, healing, then the end checks.
pub fn run_seed(options: SimOptions) -> SimReport {
    let mut rng = Rng::new(options.seed);
    let world = Shared(Arc::new(Mutex::new(World::new(3, options.seed))));
    world.lock().whole_trace = options.whole_trace;
    let (fleet, hosts) = fleet(&options, &world, &mut rng);
    let mut scheduler = Scheduler {
        world: world.clone(),
        futures: BTreeMap::new(),
        fleet,
        hosts,
        rng,
        restarts: Vec::new(),
        next_fault_step: 20,
        board_faults_until: 0,
        worker_claims: BTreeMap::new(),
        facts: BTreeMap::new(),
        healing: false,
    };
    for host in 0..hosts {
        start_dispatcher(&world, &scheduler.fleet, host);
    }
    scheduler.settle();
    let mut steps = 0;
    while steps < options.steps {
        steps += 1;
        if steps >= scheduler.board_faults_until && world.lock().board_faults.active {
            world.lock().board_faults.active = false;
            scheduler
                .fleet
                .spawn_faults
                .store(false, std::sync::atomic::Ordering::SeqCst);
        }
        if world.lock().board_faults.active {
            scheduler.mark_open_runs(|facts| facts.lease_at_risk = true);
        }
        scheduler.fault(steps);
        if !scheduler.step() {
            break;
        }
        scheduler.check_step();
    }
    heal(&mut scheduler);
    let budget_ms = world.lock().now_ms + 72 * 3600 * 1000;
    let mut healing_steps = 0;
    while !settled(&scheduler) && healing_steps < 400_000 && world.lock().now_ms < budget_ms {
        healing_steps += 1;
        if !scheduler.step() {
            break;
        }
        scheduler.check_step();
    }
    let mut report = SimReport {
        seed: options.seed,
        ..SimReport::default()
    };
    check_end(&scheduler, &mut report);
    let mut world = world.lock();
    let end_findings: Vec<String> = report.findings.iter().map(|f| world.alias(f)).collect();
    report.findings = world.findings.drain(..).chain(end_findings).collect();
    report.counts.steps = steps + healing_steps;
    report.counts.hosts = hosts as u64;
    report.counts.virtual_seconds = world.now_ms / 1000;
    let counted = std::mem::take(&mut world.counts);
    report.counts.add(&Counts {
        steps: 0,
        virtual_seconds: 0,
        hosts: 0,
        cards: 0,
        runs: 0,
        ..counted
    });
    report.trace = std::mem::take(&mut world.trace);
    report.first_finding_trace = std::mem::take(&mut world.first_context);
    report
}

/// Ends the faulty phase as VOPR does: faults off, every process resumed,
/// clocks aligned, one dispatcher on every host.
fn heal(scheduler: &mut Scheduler) {
    scheduler.healing = true;
    {
        let mut world = scheduler.world.lock();
        world.board_faults.active = false;
        let aligned = world.host_offsets.iter().copied().max().unwrap_or(0);
        for offset in &mut world.host_offsets {
            *offset = aligned;
        }
        for proc in world.procs.values_mut() {
            proc.paused_until = None;
            if proc.kind == ProcKind::Dispatcher {
                proc.stop = None;
            }
        }
        world.say("healing: faults off, processes resumed, clocks aligned");
    }
    scheduler
        .fleet
        .spawn_faults
        .store(false, std::sync::atomic::Ordering::SeqCst);
    scheduler.restarts.clear();
    for host in 0..scheduler.hosts {
        scheduler.restarts.push((0, host));
    }
    scheduler.due_restarts();
}

/// True once every card is done or blocked and no process of a run is left.
fn settled(scheduler: &Scheduler) -> bool {
    let Ok(tasks) = crate::block_on(scheduler.fleet.board.inner.list_tasks(None)) else {
        return false;
    };
    let waiting = |task: &kanban_core::TaskRecord| {
        task.status == TaskStatus::Todo
            && scheduler
                .fleet
                .parents
                .get(&task.id)
                .is_some_and(|parents| {
                    tasks
                        .iter()
                        .any(|t| parents.contains(&t.id) && t.status != TaskStatus::Done)
                })
    };
    tasks.iter().all(|task| {
        matches!(
            task.status.known(),
            Some(TaskStatus::Done | TaskStatus::Blocked)
        ) || waiting(task)
    }) && scheduler
        .live_procs(|kind| !matches!(kind, ProcKind::Dispatcher))
        .is_empty()
}
