//! The simulation's deterministic executor: processes are futures, polled
//! one at a time on one thread, in an order drawn from the seed, over
//! virtual time that only the scheduler moves.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{Clock, Sleeper, StopReason};

/// A process's id; also its pid as the board records it.
pub(crate) type ProcId = u32;

/// A process's future.
pub(crate) type ProcFuture = Pin<Box<dyn Future<Output = ProcEnd> + Send>>;

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProcEnd {
    Exited(i32),
    Killed,
}

/// How a process is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kill {
    /// SIGKILL to the one process (a fault, the OOM killer): an agent in
    /// its own process group lives on.
    Process,
    /// SIGKILL to the worker's process group: its agent's group lives on too.
    Group,
    /// Every process carrying the run's claim: nothing of it survives.
    Sweep,
}

/// What kind of process it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProcKind {
    Dispatcher,
    Worker {
        task_id: String,
        run_id: i64,
        dispatcher: ProcId,
    },
    /// An agent whose worker died under it, still running on its own.
    OrphanAgent {
        task_id: String,
        run_id: i64,
    },
}

#[derive(Debug)]
pub(crate) struct ProcState {
    pub(crate) host: usize,
    pub(crate) kind: ProcKind,
    pub(crate) alive: bool,
    /// The earliest timer the process waits on, in virtual milliseconds.
    pub(crate) wake_at: Option<u64>,
    /// Asked to stop (a signal to a worker, a stop to a dispatcher).
    pub(crate) stop: Option<StopReason>,
    /// Not polled before this time: a stalled process (SIGSTOP, a paused VM).
    pub(crate) paused_until: Option<u64>,
    /// Monotonic milliseconds of the agent's last progress.
    pub(crate) progress_ms: Option<u64>,
    /// The spawn sequence number: a fingerprint a reused id never matches.
    pub(crate) fingerprint: i64,
}

/// Everything the simulated processes share.
pub(crate) struct World {
    pub(crate) now_ms: u64,
    /// The wall clock of each host runs this far ahead (seconds, may be negative).
    pub(crate) host_offsets: Vec<i64>,
    pub(crate) current: Option<ProcId>,
    pub(crate) procs: BTreeMap<ProcId, ProcState>,
    pub(crate) woken: BTreeSet<ProcId>,
    pub(crate) spawns: Vec<(ProcId, ProcFuture)>,
    pub(crate) kills: Vec<(ProcId, Kill)>,
    /// Exits of workers, for the dispatcher that started them.
    pub(crate) exits: BTreeMap<ProcId, Vec<kanban_core::WorkerExit>>,
    /// The exit code each run's worker wrote in its trailer.
    pub(crate) trailers: BTreeMap<i64, i32>,
    /// The exit code each run's worker really exited with (or `None` when killed).
    pub(crate) worker_ends: BTreeMap<i64, Option<i32>>,
    /// Live agents per card: (host, process).
    pub(crate) agents: BTreeMap<String, BTreeSet<(usize, ProcId)>>,
    pub(crate) next_id: ProcId,
    pub(crate) next_fingerprint: i64,
    pub(crate) trace: Vec<String>,
    pub(crate) findings: Vec<String>,
    pub(crate) rng: super::rng::Rng,
    pub(crate) board_faults: super::board::BoardFaults,
    pub(crate) counts: super::Counts,
    /// Runs started per card, to pick each run's script.
    pub(crate) card_runs: BTreeMap<String, u32>,
    /// The script each run played.
    pub(crate) run_scripts: BTreeMap<i64, super::agent::RunScript>,
    /// Card ids (random on the board) and the stable names the trace uses.
    pub(crate) aliases: Vec<(String, String)>,
    /// The trace leading to the first finding.
    pub(crate) first_context: Vec<String>,
    /// Keep every trace line, not only the last few hundred.
    pub(crate) whole_trace: bool,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("now_ms", &self.now_ms)
            .field("procs", &self.procs.len())
            .finish_non_exhaustive()
    }
}

impl World {
    pub(crate) fn new(hosts: usize, seed: u64) -> Self {
        Self {
            rng: super::rng::Rng::new(seed ^ 0x005E_ED0F_FA17),
            board_faults: super::board::BoardFaults::default(),
            counts: super::Counts::default(),
            card_runs: BTreeMap::new(),
            run_scripts: BTreeMap::new(),
            aliases: Vec::new(),
            first_context: Vec::new(),
            whole_trace: false,
            now_ms: 0,
            host_offsets: vec![0; hosts],
            current: None,
            procs: BTreeMap::new(),
            woken: BTreeSet::new(),
            spawns: Vec::new(),
            kills: Vec::new(),
            exits: BTreeMap::new(),
            trailers: BTreeMap::new(),
            worker_ends: BTreeMap::new(),
            agents: BTreeMap::new(),
            next_id: 100,
            next_fingerprint: 1,
            trace: Vec::new(),
            findings: Vec::new(),
        }
    }

    /// The process being polled.
    pub(crate) fn current(&self) -> ProcId {
        self.current.unwrap_or(0)
    }

    pub(crate) fn current_host(&self) -> usize {
        self.procs.get(&self.current()).map_or(0, |proc| proc.host)
    }

    pub(crate) fn add_timer(&mut self, deadline: u64) {
        let id = self.current();
        if let Some(proc) = self.procs.get_mut(&id) {
            proc.wake_at = Some(proc.wake_at.map_or(deadline, |at| at.min(deadline)));
        }
    }

    pub(crate) fn say(&mut self, line: impl Into<String>) {
        const KEEP: usize = 400;
        if !self.whole_trace && self.trace.len() >= 2 * KEEP {
            self.trace.drain(..KEEP);
        }
        let mut line = format!("{:>10} ms  {}", self.now_ms, line.into());
        for (id, alias) in &self.aliases {
            if line.contains(id.as_str()) {
                line = line.replace(id.as_str(), alias);
            }
        }
        self.trace.push(line);
    }

    /// `text` with every card id replaced by the card's stable name.
    pub(crate) fn alias(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (id, alias) in &self.aliases {
            if text.contains(id.as_str()) {
                text = text.replace(id.as_str(), alias);
            }
        }
        text
    }

    pub(crate) fn finding(&mut self, what: impl Into<String>) {
        let what = self.alias(&what.into());
        self.say(format!("FINDING: {what}"));
        if self.findings.is_empty() {
            let from = self.trace.len().saturating_sub(80);
            self.first_context = self.trace[from..].to_vec();
        }
        self.findings.push(what);
    }

    /// Registers a new process and its future; returns its id.
    pub(crate) fn spawn(
        &mut self,
        host: usize,
        kind: ProcKind,
        future: ProcFuture,
    ) -> (ProcId, i64) {
        let id = self.next_id;
        self.next_id += 1;
        let fingerprint = self.next_fingerprint;
        self.next_fingerprint += 1;
        self.procs.insert(
            id,
            ProcState {
                host,
                kind,
                alive: true,
                wake_at: None,
                stop: None,
                paused_until: None,
                progress_ms: None,
                fingerprint,
            },
        );
        self.woken.insert(id);
        self.spawns.push((id, future));
        (id, fingerprint)
    }
}

/// The world, shared by every port of the simulation.
#[derive(Clone, Debug)]
pub(crate) struct Shared(pub(crate) Arc<Mutex<World>>);

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, World> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The epoch second virtual time starts at.
pub(crate) const EPOCH: i64 = 1_800_000_000;

/// Each process reads the wall clock of its host; the monotonic clock is
/// virtual time itself, which never jumps.
#[derive(Clone, Debug)]
pub(crate) struct SimClock(pub(crate) Shared);

impl Clock for SimClock {
    fn now(&self) -> i64 {
        let world = self.0.lock();
        let offset = world
            .host_offsets
            .get(world.current_host())
            .copied()
            .unwrap_or(0);
        EPOCH + i64::try_from(world.now_ms / 1000).unwrap_or(i64::MAX) + offset
    }

    fn monotonic_millis(&self) -> u64 {
        self.0.lock().now_ms
    }
}

/// Waits until virtual time reaches the deadline.
struct Until {
    world: Shared,
    deadline: u64,
}

impl Future for Until {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        let mut world = self.world.lock();
        if world.now_ms >= self.deadline {
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        world.add_timer(deadline);
        Poll::Pending
    }
}

/// Waits `duration` of virtual time.
pub(crate) async fn sleep_for(world: &Shared, duration: Duration) {
    let deadline = world.lock().now_ms + u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    Until {
        world: world.clone(),
        deadline,
    }
    .await;
}

/// Gives the scheduler a chance to run another process first.
pub(crate) async fn yield_now(world: &Shared) {
    struct Yield {
        world: Shared,
        yielded: bool,
    }
    impl Future for Yield {
        type Output = ();
        fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.yielded {
                return Poll::Ready(());
            }
            self.yielded = true;
            let mut world = self.world.lock();
            let id = world.current();
            world.woken.insert(id);
            Poll::Pending
        }
    }
    Yield {
        world: world.clone(),
        yielded: false,
    }
    .await;
}

/// The sleeper of simulated processes.
#[derive(Clone, Debug)]
pub(crate) struct SimSleeper(pub(crate) Shared);

#[async_trait]
impl Sleeper for SimSleeper {
    async fn sleep(&self, duration: Duration) {
        sleep_for(&self.0, duration).await;
    }
}

struct ProcWaker {
    id: ProcId,
    world: Shared,
}

impl Wake for ProcWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.world.lock().woken.insert(self.id);
    }
}

/// Polls process `id` once; returns how it ended, if it did.
pub(crate) fn poll_process(world: &Shared, id: ProcId, future: &mut ProcFuture) -> Option<ProcEnd> {
    {
        let mut guard = world.lock();
        guard.current = Some(id);
        guard.woken.remove(&id);
        if let Some(proc) = guard.procs.get_mut(&id) {
            proc.wake_at = None;
        }
    }
    let waker = Waker::from(Arc::new(ProcWaker {
        id,
        world: world.clone(),
    }));
    let mut context = Context::from_waker(&waker);
    let poll = future.as_mut().poll(&mut context);
    world.lock().current = None;
    match poll {
        Poll::Ready(end) => Some(end),
        Poll::Pending => None,
    }
}
