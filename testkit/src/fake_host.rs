//! A host for the dispatcher without processes: a process table the test
//! drives by hand, and wake-ups that advance virtual time. Each of the
//! dispatcher's decisions can be shown in a few lines, deterministically.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::{
    Claim, EnvironmentFault, ExitWitness, RunLog, StopSignal, Supervisor, Wakeups, WorkerExit,
    WorkerProcess,
};

use crate::VirtualClock;

/// One process the fake host knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FakeProcess {
    pub pid: u32,
    pub claim: Claim,
    pub alive: bool,
    /// Signals it received, in order.
    pub signals: Vec<StopSignal>,
    /// Started by this host's dispatcher (as opposed to planted by the test).
    pub ours: bool,
    /// Ignores SIGTERM.
    pub stubborn: bool,
    /// Survives even SIGKILL (a process in uninterruptible sleep).
    pub unkillable: bool,
}

#[derive(Debug, Default)]
struct State {
    next_pid: u32,
    processes: BTreeMap<u32, FakeProcess>,
    exits: Vec<WorkerExit>,
    trailers: BTreeMap<i64, i32>,
    faults: BTreeMap<i64, EnvironmentFault>,
    outputs: BTreeMap<i64, String>,
    swept: Vec<(i64, &'static str)>,
    spawn_fault: Option<EnvironmentFault>,
    stop: bool,
    gone_claimers: Vec<String>,
    locks: u64,
    on_spawn: Option<SpawnHook>,
    on_sweep: Option<SpawnHook>,
}

/// What a test runs as each worker starts (or as each rerun's earlier
/// processes are swept).
#[derive(Clone)]
struct SpawnHook(Arc<dyn Fn(&Claim) + Send + Sync>);

impl std::fmt::Debug for SpawnHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnHook")
    }
}

/// A host with a hand-driven process table; clones share it.
#[derive(Clone, Debug)]
pub struct FakeHost {
    name: String,
    time: VirtualClock,
    state: Arc<Mutex<State>>,
}

impl FakeHost {
    /// A host named `name`, on `time`.
    pub fn new(name: &str, time: VirtualClock) -> Self {
        Self {
            name: name.to_owned(),
            time,
            state: Arc::new(Mutex::new(State {
                next_pid: 1000,
                ..State::default()
            })),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every process started or planted, by pid.
    pub fn processes(&self) -> Vec<FakeProcess> {
        self.state().processes.values().cloned().collect()
    }

    /// The live processes working `task_id`.
    pub fn live(&self, task_id: &str) -> Vec<FakeProcess> {
        self.processes()
            .into_iter()
            .filter(|p| p.alive && p.claim.task_id == task_id)
            .collect()
    }

    /// The one live process working `task_id`; panics when there is not exactly one.
    pub fn worker(&self, task_id: &str) -> FakeProcess {
        let live = self.live(task_id);
        assert_eq!(live.len(), 1, "one live worker of {task_id}: {live:?}");
        live[0].clone()
    }

    /// Ends process `pid` with `witness`, as if it exited; its trailer (when
    /// it exited with a code) is what its log says.
    pub fn exit(&self, pid: u32, witness: ExitWitness) {
        let mut state = self.state();
        let Some(process) = state.processes.get_mut(&pid) else {
            panic!("no process {pid}");
        };
        process.alive = false;
        let (ours, run_id) = (process.ours, process.claim.run_id);
        if let ExitWitness::Code(code) = witness {
            state.trailers.insert(run_id, code);
        }
        if ours {
            state.exits.push(WorkerExit { pid, witness });
        }
    }

    /// Ends process `pid` as a worker that could not work its card for the
    /// environment's fault, which its trailer reports.
    pub fn exit_with_fault(&self, pid: u32, fault: EnvironmentFault) {
        let run_id = self
            .state()
            .processes
            .get(&pid)
            .map(|process| process.claim.run_id);
        if let Some(run_id) = run_id {
            self.state().faults.insert(run_id, fault);
        }
        self.exit(pid, ExitWitness::Code(75));
    }

    /// Gives run `run_id`'s log `output`, as the last lines its worker wrote.
    pub fn say(&self, run_id: i64, output: &str) {
        self.state().outputs.insert(run_id, output.to_owned());
    }

    /// Plants a live process of this host working `claim` that this
    /// dispatcher did not start (a previous dispatcher's worker).
    pub fn plant(&self, claim: &Claim) -> u32 {
        self.start(claim, false)
    }

    fn start(&self, claim: &Claim, ours: bool) -> u32 {
        let mut state = self.state();
        let pid = state.next_pid;
        state.next_pid += 1;
        state.processes.insert(
            pid,
            FakeProcess {
                pid,
                claim: claim.clone(),
                alive: true,
                signals: Vec::new(),
                ours,
                stubborn: false,
                unkillable: false,
            },
        );
        pid
    }

    /// Runs `hook` with the claim of each worker this host starts, as it
    /// starts: a worker quick enough to settle its card before the
    /// dispatcher has recorded its spawn.
    pub fn on_spawn(&self, hook: impl Fn(&Claim) + Send + Sync + 'static) {
        self.state().on_spawn = Some(SpawnHook(Arc::new(hook)));
    }

    /// Runs `hook` with the claim of each rerun as its earlier runs'
    /// processes are swept, before its worker starts: a slow sweep, or a
    /// claim taken back meanwhile.
    pub fn on_sweep(&self, hook: impl Fn(&Claim) + Send + Sync + 'static) {
        self.state().on_sweep = Some(SpawnHook(Arc::new(hook)));
    }

    /// Makes the next spawns fail with `fault` (or succeed again with `None`).
    pub fn fail_spawns(&self, fault: Option<EnvironmentFault>) {
        self.state().spawn_fault = fault;
    }

    /// Process `pid` ignores SIGTERM from now on.
    pub fn make_stubborn(&self, pid: u32) {
        if let Some(process) = self.state().processes.get_mut(&pid) {
            process.stubborn = true;
        }
    }

    /// Process `pid` survives SIGKILL from now on.
    pub fn make_unkillable(&self, pid: u32) {
        if let Some(process) = self.state().processes.get_mut(&pid) {
            process.unkillable = true;
        }
    }

    /// Asks the dispatcher to stop, as SIGINT would.
    pub fn request_stop(&self) {
        self.state().stop = true;
    }

    /// Declares the dispatcher that took `claim_lock` gone.
    pub fn claimer_died(&self, claim_lock: &str) {
        self.state().gone_claimers.push(claim_lock.to_owned());
    }

    /// Every sweep asked for: (run id, "run" or "earlier").
    pub fn sweeps(&self) -> Vec<(i64, &'static str)> {
        self.state().swept.clone()
    }
}

#[async_trait]
impl Supervisor for FakeHost {
    fn host(&self) -> &str {
        &self.name
    }

    fn new_claim_lock(&self) -> String {
        let mut state = self.state();
        state.locks += 1;
        format!("{}:1:{:04}", self.name, state.locks)
    }

    fn claimer_gone(&self, claim_lock: &str) -> bool {
        self.state()
            .gone_claimers
            .iter()
            .any(|gone| gone == claim_lock)
    }

    async fn spawn(
        &self,
        claim: &Claim,
        _goal_mode: bool,
        _route: &str,
    ) -> Result<WorkerProcess, EnvironmentFault> {
        if let Some(fault) = self.state().spawn_fault.clone() {
            return Err(fault);
        }
        let pid = self.start(claim, true);
        let hook = self.state().on_spawn.clone();
        if let Some(SpawnHook(hook)) = hook {
            hook(claim);
        }
        Ok(WorkerProcess {
            pid,
            started_at: Some(i64::from(pid) * 7),
            seal_digest: Some(format!("seal-{pid}")),
        })
    }

    async fn reap(&self) -> Vec<WorkerExit> {
        std::mem::take(&mut self.state().exits)
    }

    fn alive(&self, pid: i64, started_at: Option<i64>) -> bool {
        let state = self.state();
        u32::try_from(pid)
            .ok()
            .and_then(|pid| state.processes.get(&pid))
            .is_some_and(|p| {
                p.alive && started_at.is_none_or(|at| at == i64::from(p.pid) * 7 || !p.ours)
            })
    }

    fn signal(&self, pid: i64, _started_at: Option<i64>, signal: StopSignal) {
        let mut state = self.state();
        let Some(process) = u32::try_from(pid)
            .ok()
            .and_then(|pid| state.processes.get_mut(&pid))
        else {
            return;
        };
        process.signals.push(signal);
        let dies = match signal {
            StopSignal::Terminate => !process.stubborn,
            StopSignal::Kill => !process.unkillable,
        };
        if dies && process.alive {
            process.alive = false;
            let (pid, ours) = (process.pid, process.ours);
            if ours {
                let witness = match signal {
                    StopSignal::Terminate => ExitWitness::Code(130),
                    StopSignal::Kill => ExitWitness::Signal(9),
                };
                state.exits.push(WorkerExit { pid, witness });
            }
        }
    }

    async fn sweep(&self, claim: &Claim) {
        self.state().swept.push((claim.run_id, "run"));
    }

    async fn sweep_earlier_runs(&self, claim: &Claim) -> bool {
        let hook = self.state().on_sweep.clone();
        if let Some(SpawnHook(hook)) = hook {
            hook(claim);
        }
        let mut state = self.state();
        state.swept.push((claim.run_id, "earlier"));
        let mut cleared = true;
        for process in state.processes.values_mut() {
            if process.claim.task_id == claim.task_id && process.claim.run_id != claim.run_id {
                process.alive &= process.unkillable;
                cleared &= !process.alive;
            }
        }
        cleared
    }

    async fn run_log(&self, claim: &Claim, _seal_digest: Option<&str>) -> RunLog {
        let state = self.state();
        RunLog {
            trailer_code: state.trailers.get(&claim.run_id).copied(),
            fault: state.faults.get(&claim.run_id).cloned(),
            output_tail: state
                .outputs
                .get(&claim.run_id)
                .cloned()
                .unwrap_or_default(),
        }
    }
}

#[async_trait]
impl Wakeups for FakeHost {
    async fn wait(&self, timeout: Duration) {
        self.time
            .advance_millis(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
    }

    fn stop_requested(&self) -> bool {
        self.state().stop
    }
}
