//! A simulated host's dispatcher: core's `Dispatcher` over the shared board,
//! a supervisor of simulated worker processes, the host's clock and
//! wake-ups in virtual time.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{
    Claim, DispatchEvent, DispatchPorts, DispatchSettings, Dispatcher, EnvironmentFault,
    ExitWitness, RunLog, RunMode, StopReason, StopSignal, Supervisor, Wakeups, WorkerExit,
    WorkerProcess,
};

use super::agent::{RunScript, WorkerPlan, worker_process};
use super::board::SimBoard;
use super::exec::{Kill, ProcEnd, ProcFuture, ProcId, ProcKind, Shared, SimClock};

/// What every dispatcher of a simulation shares: the board, the cards'
/// scripts and the workers' plan.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) board: Arc<SimBoard>,
    /// Each card's runs, in order; past the end it completes.
    pub(crate) scripts: BTreeMap<String, Vec<RunScript>>,
    /// Each card's parents.
    pub(crate) parents: BTreeMap<String, Vec<String>>,
    pub(crate) plan: WorkerPlan,
    pub(crate) settings: DispatchSettings,
    /// Whether spawns may fail (on while faults are on).
    pub(crate) spawn_faults: std::sync::atomic::AtomicBool,
}

pub(crate) fn host_name(host: usize) -> String {
    format!("h{host}")
}

/// The processes of one host, as one dispatcher supervises them.
#[derive(Debug)]
struct SimSupervisor {
    world: Shared,
    fleet: Arc<Fleet>,
    host: usize,
    name: String,
    me: ProcId,
}

impl SimSupervisor {
    /// Kills every process of this host working a run of `claim`'s card
    /// that `runs` picks: whatever carries the claim dies with it.
    fn kill_runs(&self, claim: &Claim, runs: impl Fn(i64) -> bool, what: &str) {
        let mut world = self.world.lock();
        let doomed: Vec<ProcId> = world
            .procs
            .iter()
            .filter(|(_, proc)| proc.alive && proc.host == self.host)
            .filter(|(_, proc)| match &proc.kind {
                ProcKind::Worker {
                    task_id, run_id, ..
                }
                | ProcKind::OrphanAgent { task_id, run_id } => {
                    *task_id == claim.task_id && runs(*run_id)
                }
                ProcKind::Dispatcher => false,
            })
            .map(|(id, _)| *id)
            .collect();
        for id in doomed {
            world.say(format!(
                "{} {what} process {id} (run {})",
                self.name, claim.run_id
            ));
            world.kills.push((id, Kill::Sweep));
        }
    }

    fn local(&self, pid: i64, fingerprint: Option<i64>) -> Option<ProcId> {
        let id = ProcId::try_from(pid).ok()?;
        let world = self.world.lock();
        let proc = world.procs.get(&id)?;
        (proc.alive
            && proc.host == self.host
            && fingerprint.is_none_or(|fingerprint| fingerprint == proc.fingerprint))
        .then_some(id)
    }
}

#[async_trait]
impl Supervisor for SimSupervisor {
    fn host(&self) -> &str {
        &self.name
    }

    fn new_claim_lock(&self) -> String {
        let mut world = self.world.lock();
        let nonce = world.rng.next_u64();
        format!("{}:{}:{nonce:016x}", self.name, self.me)
    }

    fn claimer_gone(&self, claim_lock: &str) -> bool {
        let mut parts = claim_lock.splitn(3, ':');
        let (Some(host), Some(pid)) = (parts.next(), parts.next()) else {
            return false;
        };
        let Ok(pid) = pid.parse::<ProcId>() else {
            return false;
        };
        let world = self.world.lock();
        host == self.name && pid != self.me && world.procs.get(&pid).is_none_or(|proc| !proc.alive)
    }

    async fn spawn(
        &self,
        claim: &Claim,
        _goal_mode: bool,
        _route: &str,
    ) -> Result<WorkerProcess, EnvironmentFault> {
        let faults = self
            .fleet
            .spawn_faults
            .load(std::sync::atomic::Ordering::SeqCst);
        let mut world = self.world.lock();
        if faults && world.rng.chance(40) {
            world.counts.spawn_faults += 1;
            world.say(format!("fault: spawn of {} fails", claim.task_id));
            return Err(EnvironmentFault::Transient(
                "fork failed: resource temporarily unavailable (simulated)".into(),
            ));
        }
        let runs = world.card_runs.entry(claim.task_id.clone()).or_insert(0);
        let script = self
            .fleet
            .scripts
            .get(&claim.task_id)
            .and_then(|scripts| scripts.get(*runs as usize))
            .copied()
            .unwrap_or(RunScript::Complete { failing: 0 });
        *runs += 1;
        world.run_scripts.insert(claim.run_id, script);
        let id = world.next_id;
        let future = worker_process(
            self.world.clone(),
            self.fleet.board.clone(),
            claim.clone(),
            script,
            id,
            self.host,
            self.fleet.plan,
        );
        let kind = ProcKind::Worker {
            task_id: claim.task_id.clone(),
            run_id: claim.run_id,
            dispatcher: self.me,
        };
        let (pid, fingerprint) = world.spawn(self.host, kind, future);
        world.say(format!(
            "{} spawns worker {pid} for {} run {} ({script:?})",
            self.name, claim.task_id, claim.run_id
        ));
        Ok(WorkerProcess {
            pid,
            started_at: Some(fingerprint),
            seal_digest: None,
        })
    }

    async fn reap(&self) -> Vec<WorkerExit> {
        self.world.lock().exits.remove(&self.me).unwrap_or_default()
    }

    fn alive(&self, pid: i64, started_at: Option<i64>) -> bool {
        self.local(pid, started_at).is_some()
    }

    fn signal(&self, pid: i64, started_at: Option<i64>, signal: StopSignal) {
        let Some(id) = self.local(pid, started_at) else {
            return;
        };
        let mut world = self.world.lock();
        match signal {
            StopSignal::Terminate => {
                if let Some(proc) = world.procs.get_mut(&id) {
                    proc.stop.get_or_insert(StopReason::Signal(15));
                }
                world.woken.insert(id);
            }
            StopSignal::Kill => world.kills.push((id, Kill::Group)),
        }
    }

    async fn sweep(&self, claim: &Claim) {
        self.kill_runs(claim, |run| run == claim.run_id, "sweeps");
    }

    async fn sweep_earlier_runs(&self, claim: &Claim) -> bool {
        // A simulated kill always lands before the next process step.
        self.kill_runs(claim, |run| run != claim.run_id, "kills an earlier run's");
        true
    }

    async fn run_log(&self, claim: &Claim, _seal_digest: Option<&str>) -> RunLog {
        RunLog {
            trailer_code: self.world.lock().trailers.get(&claim.run_id).copied(),
            fault: None,
            output_tail: String::new(),
        }
    }
}

/// Waits in virtual time until the timeout, or until a worker of this
/// dispatcher exits (the exit wakes the process).
struct WaitOnce {
    world: Shared,
    deadline: u64,
    registered: bool,
}

impl Future for WaitOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        let mut world = self.world.lock();
        if self.registered || world.now_ms >= self.deadline {
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        world.add_timer(deadline);
        drop(world);
        self.registered = true;
        Poll::Pending
    }
}

#[derive(Debug)]
struct SimWakeups {
    world: Shared,
    me: ProcId,
}

#[async_trait]
impl Wakeups for SimWakeups {
    async fn wait(&self, timeout: Duration) {
        let deadline =
            self.world.lock().now_ms + u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        WaitOnce {
            world: self.world.clone(),
            deadline,
            registered: false,
        }
        .await;
    }

    fn stop_requested(&self) -> bool {
        self.world
            .lock()
            .procs
            .get(&self.me)
            .is_some_and(|proc| proc.stop.is_some())
    }
}

/// Starts a dispatcher process on `host`; returns its id.
pub(crate) fn start_dispatcher(world: &Shared, fleet: &Arc<Fleet>, host: usize) -> ProcId {
    let mut guard = world.lock();
    let me = guard.next_id;
    let future = dispatcher_process(world.clone(), fleet.clone(), host, me);
    let (id, _) = guard.spawn(host, ProcKind::Dispatcher, future);
    guard.say(format!("{} starts dispatcher {id}", host_name(host)));
    id
}

fn dispatcher_process(world: Shared, fleet: Arc<Fleet>, host: usize, me: ProcId) -> ProcFuture {
    Box::pin(async move {
        let supervisor = Arc::new(SimSupervisor {
            world: world.clone(),
            fleet: fleet.clone(),
            host,
            name: host_name(host),
            me,
        });
        let notes_world = world.clone();
        let name = host_name(host);
        let ports = DispatchPorts {
            board: fleet.board.clone(),
            supervisor,
            clock: Arc::new(SimClock(world.clone())),
            wakeups: Arc::new(SimWakeups {
                world: world.clone(),
                me,
            }),
            notes: Arc::new(move |event: &DispatchEvent| {
                let mut world = notes_world.lock();
                if let DispatchEvent::Booked { .. } = event {
                    world.counts.bookings += 1;
                }
                world.say(format!("{name} dispatcher {me}: {event}"));
            }),
        };
        let mut dispatcher = Dispatcher::new(ports, fleet.settings.clone());
        let end = dispatcher.run(RunMode::Forever).await;
        world.lock().say(format!("dispatcher {me} ends: {end:?}"));
        ProcEnd::Exited(end.exit_code().code())
    })
}

/// The witness a worker's end gives its dispatcher.
pub(crate) fn witness(end: ProcEnd) -> ExitWitness {
    match end {
        ProcEnd::Exited(code) => ExitWitness::Code(code),
        ProcEnd::Killed => ExitWitness::Signal(9),
    }
}
