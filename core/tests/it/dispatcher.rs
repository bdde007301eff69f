//! The dispatcher's decisions, each on a board in memory and a fake host:
//! no process, no sleep, one decision per test.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kanban_board_sqlite::SqliteBoard;
use kanban_core::rules::FailurePolicy;
use kanban_core::{
    Board, BoardAdmin, Claim, Clock, DispatchBoard, DispatchEnd, DispatchEvent, DispatchPorts,
    DispatchSettings, Dispatcher, DispatcherState, EnvironmentFault, ExitCode, ExitWitness,
    NewTask, RunMode, StopSignal, TaskStatus, WorkerResult,
};
use kanban_testkit::{FakeHost, VirtualClock, block_on, memory_board};

const START: i64 = 2_000_000;
const TTL: i64 = 300;

struct Rig {
    board: Arc<SqliteBoard>,
    host: FakeHost,
    time: VirtualClock,
    dispatcher: Dispatcher,
    events: Arc<Mutex<Vec<DispatchEvent>>>,
}

fn settings() -> DispatchSettings {
    DispatchSettings {
        ttl_seconds: TTL,
        max_in_progress: 2,
        failure_policy: FailurePolicy::default(),
        interval: Duration::from_secs(10),
        grace: Duration::from_secs(5),
        max_runtime_seconds: None,
        routes: Default::default(),
        unassigned_route: None,
    }
}

fn rig_with(settings: DispatchSettings) -> Rig {
    rig_ahead(settings, 0)
}

/// A dispatcher's clock `ahead` seconds before its board's.
#[derive(Debug)]
struct Ahead(VirtualClock, i64);

impl Clock for Ahead {
    fn now(&self) -> i64 {
        self.0.now() + self.1
    }
}

/// A rig whose dispatcher reads a clock `ahead` seconds before the board's.
fn rig_ahead(settings: DispatchSettings, ahead: i64) -> Rig {
    let time = VirtualClock::at(START);
    let board = Arc::new(memory_board(Arc::new(time.clone())));
    rig_on(board, time, settings, ahead)
}

/// A rig on `board`, which reads `time`.
fn rig_on(
    board: Arc<SqliteBoard>,
    time: VirtualClock,
    settings: DispatchSettings,
    ahead: i64,
) -> Rig {
    let host = FakeHost::new("h1", time.clone());
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let ports = DispatchPorts {
        board: board.clone(),
        supervisor: Arc::new(host.clone()),
        clock: Arc::new(Ahead(time.clone(), ahead)),
        wakeups: Arc::new(host.clone()),
        notes: Arc::new(move |event: &DispatchEvent| seen.lock().unwrap().push(event.clone())),
    };
    Rig {
        board,
        host,
        time,
        dispatcher: Dispatcher::new(ports, settings),
        events,
    }
}

fn rig() -> Rig {
    rig_with(settings())
}

impl Rig {
    fn add(&self, title: &str) -> String {
        block_on(self.board.create_task(&NewTask {
            title: title.into(),
            ..NewTask::default()
        }))
        .unwrap()
    }

    fn tick(&mut self) -> kanban_core::TickReport {
        block_on(self.dispatcher.tick(true))
    }

    fn card(&self, id: &str) -> kanban_core::TaskView {
        block_on(self.board.show_task(id)).unwrap()
    }

    fn status(&self, id: &str) -> TaskStatus {
        self.card(id).task.status.known().unwrap()
    }

    fn events(&self) -> Vec<DispatchEvent> {
        self.events.lock().unwrap().clone()
    }

    fn stopping(&self) -> Vec<(String, kanban_core::SignalReason)> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                DispatchEvent::Stopping {
                    task_id, reason, ..
                } => Some((task_id, reason)),
                _ => None,
            })
            .collect()
    }

    fn released(&self) -> Vec<(String, bool)> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                DispatchEvent::Released {
                    task_id, counted, ..
                } => Some((task_id, counted)),
                _ => None,
            })
            .collect()
    }

    /// A claim by another dispatcher (`lock`), with a worker planted on this host.
    fn foreign_claim(&self, id: &str, lock: &str) -> (Claim, u32) {
        let claim = block_on(self.board.claim_task(id, TTL, lock))
            .unwrap()
            .unwrap()
            .claim;
        let pid = self.host.plant(&claim);
        block_on(self.board.record_spawn(
            &claim,
            &kanban_core::WorkerProcess {
                pid,
                started_at: None,
                seal_digest: None,
            },
        ))
        .unwrap();
        (claim, pid)
    }
}

#[test]
fn claims_in_priority_order_up_to_the_budget() {
    let mut rig = rig();
    let a = rig.add("a");
    rig.time.advance(1);
    let b = block_on(rig.board.create_task(&NewTask {
        title: "b".into(),
        priority: 3,
        ..NewTask::default()
    }))
    .unwrap();
    rig.time.advance(1);
    let c = rig.add("c");
    let report = rig.tick();
    assert_eq!(report.spawned, 2, "the budget is 2");
    assert_eq!(rig.host.live(&b).len(), 1, "priority first");
    assert_eq!(rig.host.live(&a).len(), 1, "then the oldest");
    assert!(rig.host.live(&c).is_empty());
    let worker = rig.host.worker(&b);
    let view = rig.card(&b);
    assert_eq!(
        view.task.worker_pid,
        Some(i64::from(worker.pid)),
        "the spawn is recorded"
    );
    assert!(
        worker.claim.claim_lock.starts_with("h1:"),
        "the lock names the host"
    );
    assert_ne!(
        worker.claim.claim_lock,
        rig.host.worker(&a).claim.claim_lock,
        "one claim, one lock"
    );
    assert_eq!(rig.tick().spawned, 0, "no budget left");
}

#[test]
fn every_exit_is_booked_from_the_one_table() {
    let mut rig = rig_with(DispatchSettings {
        max_in_progress: 4,
        ..settings()
    });
    let ids: Vec<String> = (0..4).map(|n| rig.add(&format!("card {n}"))).collect();
    rig.tick();
    let codes = [0, 75, 78, 3];
    for (id, code) in ids.iter().zip(codes) {
        rig.host
            .exit(rig.host.worker(id).pid, ExitWitness::Code(code));
    }
    assert_eq!(rig.tick().booked, 4);
    let view = rig.card(&ids[0]);
    assert_eq!(view.runs[0].outcome.as_deref(), Some("protocol_violation"));
    assert_eq!(
        view.task.consecutive_failures, 0,
        "a violation is not counted"
    );
    assert_eq!(
        (view.task.status, view.runs.len()),
        (TaskStatus::Running.into(), 2),
        "and not held: claimed again in the same tick"
    );
    let view = rig.card(&ids[1]);
    assert_eq!(view.runs[0].outcome.as_deref(), Some("rate_limited"));
    assert_eq!(
        view.task.not_before,
        Some(START + 300),
        "held for the cooldown"
    );
    assert_eq!(view.task.consecutive_failures, 0);
    assert_eq!(rig.status(&ids[2]), TaskStatus::Blocked, "78 blocks");
    let view = rig.card(&ids[3]);
    assert_eq!(view.task.consecutive_failures, 1, "a crash counts");
    assert!(view.task.not_before.is_some_and(|at| at >= START + 30));
    assert!(
        rig.host
            .sweeps()
            .iter()
            .filter(|(_, what)| *what == "run")
            .count()
            >= 4,
        "whatever each run left behind is swept"
    );
}

#[test]
fn a_previous_dispatchers_dead_worker_is_booked_from_its_result_or_its_trailer() {
    let mut rig = rig();
    let with_result = rig.add("left a result");
    let with_trailer = rig.add("left a trailer");
    let with_nothing = rig.add("left nothing");
    let (claim, pid) = rig.foreign_claim(&with_result, "h1:99:old");
    block_on(rig.board.book_result(
        &claim,
        &WorkerResult {
            pid,
            claim_lock: claim.claim_lock.clone(),
            exit_code: ExitCode::TempFail,
            last_output: String::new(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: None,
            failure_reason: None,
            provider: None,
            model: None,
        },
    ))
    .unwrap();
    rig.host.exit(pid, ExitWitness::Code(75));
    let (_, pid) = rig.foreign_claim(&with_trailer, "h1:99:old2");
    rig.host.exit(pid, ExitWitness::Code(78));
    let (_, pid) = rig.foreign_claim(&with_nothing, "h1:99:old3");
    rig.host.exit(pid, ExitWitness::Signal(9));
    assert_eq!(rig.tick().booked, 3, "each counted in the tick's report");
    let booked = |id: &str| {
        let view = rig.card(id);
        let event = view
            .events
            .iter()
            .rev()
            .find(|e| e.payload.get("source").is_some())
            .cloned()
            .expect("a booking");
        (
            view.runs[0].outcome.clone().unwrap(),
            event.payload["source"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(
        booked(&with_result),
        ("rate_limited".into(), "worker_result".into())
    );
    assert_eq!(
        booked(&with_trailer),
        ("terminal_provider".into(), "trailer".into())
    );
    assert_eq!(booked(&with_nothing), ("crashed".into(), "none".into()));
}

#[test]
fn a_live_workers_lease_is_renewed_and_a_silent_one_stopped_after_an_hour() {
    let mut rig = rig();
    let id = rig.add("quiet");
    rig.tick();
    let worker = rig.host.worker(&id);
    let first = rig.card(&id).task.claim_expires.unwrap();
    rig.time.advance(TTL / 3 + 5);
    rig.tick();
    let renewed = rig.card(&id).task.claim_expires.unwrap();
    assert!(renewed > first, "renewed before two thirds of it were gone");
    for _ in 0..400 {
        rig.time.advance(10);
        rig.tick();
        if !rig.stopping().is_empty() {
            break;
        }
    }
    assert_eq!(
        rig.stopping(),
        [(id.clone(), kanban_core::SignalReason::Overrun)],
        "stopped once silent for over an hour"
    );
    let elapsed = kanban_core::Clock::monotonic_millis(&rig.time) / 1000;
    assert!(
        (3600..=3720).contains(&elapsed),
        "after an hour of silence, not before: {elapsed} s"
    );
    assert_eq!(worker.signals, Vec::<StopSignal>::new());
    rig.tick();
    let view = rig.card(&id);
    assert_eq!(
        view.runs[0].outcome.as_deref(),
        Some("timed_out"),
        "booked as the overrun it was"
    );
    assert_eq!(view.task.consecutive_failures, 1, "counted");
}

#[test]
fn work_that_lost_its_claim_is_stopped() {
    let mut rig = rig();
    let id = rig.add("taken back");
    rig.tick();
    block_on(rig.board.reclaim(&id, "operator")).unwrap();
    rig.tick();
    assert_eq!(
        rig.stopping(),
        [(id.clone(), kanban_core::SignalReason::Fenced)],
        "the reclaimed run's worker is stopped at once"
    );
    assert!(rig.host.live(&id).is_empty() || rig.tick().spawned == 0);
}

#[test]
fn a_worker_that_finished_its_card_is_left_to_exit_by_itself() {
    let mut rig = rig();
    let id = rig.add("finished");
    rig.tick();
    let worker = rig.host.worker(&id);
    block_on(rig.board.complete(&worker.claim, "done", None)).unwrap();
    rig.tick();
    assert!(rig.stopping().is_empty(), "not stopped while it settles");
    rig.time.advance(6);
    rig.tick();
    assert_eq!(
        rig.stopping(),
        [(id.clone(), kanban_core::SignalReason::Fenced)],
        "one that lingers past the grace is"
    );
}

#[test]
fn a_worker_that_finished_before_its_spawn_was_recorded_is_left_to_exit_by_itself() {
    let mut rig = rig();
    let id = rig.add("quick");
    let board = rig.board.clone();
    rig.host.on_spawn(move |claim| {
        block_on(board.complete(claim, "done at once", None)).unwrap();
    });
    rig.tick();
    assert_eq!(rig.status(&id), TaskStatus::Done);
    assert!(
        rig.stopping().is_empty(),
        "a worker that settled its own card is not stopped as one that lost its claim"
    );
    let worker = rig.host.worker(&id);
    rig.host.exit(worker.pid, ExitWitness::Code(0));
    rig.tick();
    assert!(rig.stopping().is_empty());
    assert!(rig.host.live(&id).is_empty());
}

#[test]
fn a_claim_taken_back_before_its_spawn_was_recorded_stops_its_worker() {
    let mut rig = rig();
    let id = rig.add("taken");
    let board = rig.board.clone();
    let once = std::sync::atomic::AtomicBool::new(false);
    rig.host.on_spawn(move |claim| {
        if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            block_on(board.reclaim(&claim.task_id, "operator")).unwrap();
        }
    });
    rig.tick();
    assert_eq!(
        rig.stopping(),
        [(id.clone(), kanban_core::SignalReason::Fenced)]
    );
}

#[test]
fn shutdown_stops_every_worker_then_kills_the_stubborn_and_ends_130() {
    let mut rig = rig();
    let calm = rig.add("calm");
    let stubborn = rig.add("stubborn");
    rig.tick();
    rig.host.make_stubborn(rig.host.worker(&stubborn).pid);
    rig.host.request_stop();
    let end = block_on(rig.dispatcher.run(RunMode::Forever));
    assert_eq!(end, DispatchEnd::Interrupted);
    assert_eq!(
        end.exit_code(),
        ExitCode::Interrupted,
        "a stopped dispatcher exits 130, never 0"
    );
    let signals = |id: &str| {
        rig.host
            .processes()
            .into_iter()
            .find(|p| p.claim.task_id == id)
            .unwrap()
            .signals
    };
    assert_eq!(signals(&calm), [StopSignal::Terminate]);
    assert_eq!(
        signals(&stubborn),
        [StopSignal::Terminate, StopSignal::Kill],
        "SIGKILL after the grace period"
    );
    for id in [&calm, &stubborn] {
        let view = rig.card(id);
        assert_eq!(view.task.status, TaskStatus::Ready, "{id}");
        assert_eq!(view.task.consecutive_failures, 0, "not counted: {id}");
        assert_eq!(view.runs[0].outcome.as_deref(), Some("interrupted"), "{id}");
    }
}

#[test]
fn a_spawn_failure_is_the_environments_not_the_cards() {
    let mut rig = rig();
    let id = rig.add("unlucky");
    rig.host.fail_spawns(Some(EnvironmentFault::Configuration(
        "the agent ./agnet.sh does not exist".into(),
    )));
    let end = block_on(rig.dispatcher.run(RunMode::Forever));
    assert_eq!(
        end.exit_code(),
        ExitCode::ConfigFail,
        "a configuration fault ends the dispatcher with 78"
    );
    assert!(
        matches!(
            rig.dispatcher.halted(),
            Some(EnvironmentFault::Configuration(_))
        ),
        "{:?}",
        rig.dispatcher.halted()
    );
    let view = rig.card(&id);
    assert_eq!(view.task.status, TaskStatus::Ready, "released back");
    assert_eq!(view.task.consecutive_failures, 0, "not counted");
    assert_eq!(view.task.not_before, None, "not held back");
    assert_eq!(view.runs[0].outcome.as_deref(), Some("released"));
    assert_eq!(rig.released(), [(id, false)]);
}

#[test]
fn a_transient_fault_pauses_claiming_then_claiming_resumes() {
    let mut rig = rig();
    let id = rig.add("patient");
    rig.host
        .fail_spawns(Some(EnvironmentFault::Transient("fork failed".into())));
    rig.tick();
    assert!(rig.host.live(&id).is_empty());
    assert!(
        rig.events()
            .iter()
            .any(|e| matches!(e, DispatchEvent::Paused { .. }))
    );
    rig.host.fail_spawns(None);
    assert_eq!(rig.tick().spawned, 0, "still paused");
    rig.time.advance(2);
    assert_eq!(rig.tick().spawned, 1, "resumed after the pause");
    assert_eq!(rig.card(&id).task.consecutive_failures, 0);
}

#[test]
fn the_state_a_dispatcher_reports_says_whether_it_claims_and_why_not() {
    let mut rig = rig();
    rig.add("patient");
    assert_eq!(rig.dispatcher.state(), DispatcherState::Claiming);
    rig.host
        .fail_spawns(Some(EnvironmentFault::Transient("fork failed".into())));
    rig.tick();
    assert_eq!(
        rig.dispatcher.state(),
        DispatcherState::Paused("fork failed".into())
    );
    rig.host.fail_spawns(None);
    rig.time.advance(1);
    assert_eq!(
        rig.dispatcher.state(),
        DispatcherState::Claiming,
        "the pause is over once its time is, tick or not"
    );
    rig.host.request_stop();
    assert_eq!(rig.dispatcher.state(), DispatcherState::Stopping);
    let mut halted = self::rig();
    halted.add("unlucky");
    halted
        .host
        .fail_spawns(Some(EnvironmentFault::Configuration(
            "no agent coder".into(),
        )));
    halted.tick();
    halted.host.request_stop();
    assert_eq!(
        halted.dispatcher.state(),
        DispatcherState::Halted("no agent coder".into()),
        "a halt says why, stopping or not"
    );
}

#[test]
fn faults_met_while_paused_do_not_lengthen_the_pause_but_one_after_it_doubles_the_next() {
    let mut rig = rig();
    let id = rig.add("patient");
    let fault = || EnvironmentFault::Transient("the server cannot be reached".into());
    // One outage, met by every board call of every tick while it lasts.
    for _ in 0..5 {
        rig.dispatcher.halt(fault());
    }
    let pauses = |rig: &Rig| -> Vec<u64> {
        rig.events()
            .iter()
            .filter_map(|event| match event {
                DispatchEvent::Paused { for_ms, .. } => Some(*for_ms),
                _ => None,
            })
            .collect()
    };
    assert_eq!(pauses(&rig), [1000], "one pause for one outage");
    rig.time.advance(2);
    rig.dispatcher.halt(fault());
    assert_eq!(
        pauses(&rig),
        [1000, 2000],
        "met again after the pause: twice as long"
    );
    rig.time.advance(3);
    assert_eq!(rig.tick().spawned, 1, "claiming resumes once it is over");
    assert_eq!(rig.card(&id).task.consecutive_failures, 0);
}

#[test]
fn a_wall_clock_jump_stops_nothing_and_releases_nothing() {
    let mut rig = rig();
    let local = rig.add("local");
    let remote = rig.add("remote");
    rig.tick();
    let (remote_claim, _) = {
        // The second card goes to another host's dispatcher.
        let claim = block_on(rig.board.claim_task(&remote, TTL, "h2:7:far"));
        (claim, ())
    };
    let _ = remote_claim;
    rig.time.jump(2 * 3600);
    for _ in 0..20 {
        rig.time.advance(10);
        rig.tick();
    }
    assert!(
        rig.stopping().is_empty(),
        "no worker looks silent after a jump"
    );
    assert!(
        rig.released().is_empty(),
        "no lease looks run out after a jump"
    );
    assert_eq!(rig.status(&local), TaskStatus::Running);
    assert_eq!(rig.status(&remote), TaskStatus::Running);
}

#[test]
fn another_hosts_claim_is_released_only_after_a_whole_unchanged_lease() {
    let mut rig = rig();
    let id = rig.add("far away");
    let claim = block_on(rig.board.claim_task(&id, TTL, "h2:7:far"))
        .unwrap()
        .unwrap()
        .claim;
    block_on(rig.board.record_spawn(
        &claim,
        &kanban_core::WorkerProcess {
            pid: 4242,
            started_at: None,
            seal_digest: None,
        },
    ))
    .unwrap();
    rig.time.advance(TTL + 1);
    rig.tick();
    assert!(
        rig.released().is_empty(),
        "expired, but not yet seen unchanged for a lease"
    );
    rig.time.advance(TTL / 2);
    rig.tick();
    assert!(rig.released().is_empty());
    rig.time.advance(TTL / 2 + 1);
    rig.tick();
    assert_eq!(
        rig.released(),
        [(id.clone(), true)],
        "counted, as a stale release is"
    );
    assert!(
        rig.host.processes().is_empty(),
        "another host's worker is never signalled here"
    );
}

#[test]
fn a_claim_whose_dispatcher_died_before_spawning_is_released_uncounted() {
    let mut rig = rig();
    let id = rig.add("orphaned claim");
    block_on(rig.board.claim_task(&id, TTL, "h1:99:dead")).unwrap();
    rig.tick();
    assert!(
        rig.released().is_empty(),
        "its dispatcher may still be spawning"
    );
    rig.host.claimer_died("h1:99:dead");
    rig.tick();
    assert_eq!(rig.released().first(), Some(&(id.clone(), false)));
    assert_eq!(rig.card(&id).task.consecutive_failures, 0);
}

#[test]
fn a_rerun_first_kills_what_is_left_of_earlier_runs() {
    let mut rig = rig_without_backoff();
    let id = rig.add("again");
    rig.tick();
    let first = rig.host.worker(&id);
    assert!(
        !rig.host.sweeps().iter().any(|(_, what)| *what == "earlier"),
        "a first run has nothing to sweep"
    );
    rig.host.exit(first.pid, ExitWitness::Code(1));
    rig.tick();
    rig.tick();
    let second = rig.host.worker(&id);
    assert!(second.claim.run_id > first.claim.run_id);
    assert!(
        rig.host
            .sweeps()
            .contains(&(second.claim.run_id, "earlier")),
        "{:?}",
        rig.host.sweeps()
    );
}

#[test]
fn a_rerun_is_not_started_while_an_earlier_runs_process_will_not_die() {
    let mut rig = rig();
    let (id, first) = rig.start_unkillable("reclaimed under a stuck worker");
    block_on(rig.board.reclaim(&id, "operator reclaim")).unwrap();
    rig.tick();
    assert_eq!(
        rig.host.worker(&id).pid,
        first,
        "no second worker beside the one that would not die"
    );
    assert_eq!(rig.released(), [(id.clone(), false)], "{:?}", rig.events());
    let card = rig.card(&id);
    assert_eq!(card.task.status, TaskStatus::Ready);
    assert_eq!(card.task.consecutive_failures, 0);
}

#[test]
fn a_worker_that_survives_sigkill_has_its_reclaim_deferred() {
    let mut rig = rig();
    let (id, _) = rig.start_unkillable("unkillable");
    for _ in 0..400 {
        rig.time.advance(10);
        rig.tick();
        if rig
            .events()
            .iter()
            .any(|e| matches!(e, DispatchEvent::ReclaimDeferred { .. }))
        {
            break;
        }
    }
    let signals = rig.host.worker(&id).signals;
    assert_eq!(signals, [StopSignal::Terminate, StopSignal::Kill]);
    assert!(
        rig.card(&id)
            .events
            .iter()
            .any(|e| e.kind == "reclaim_deferred"),
        "the deferral is on the board"
    );
    assert_eq!(
        rig.status(&id),
        TaskStatus::Running,
        "not released under a live worker"
    );
}

#[test]
fn a_worker_that_reports_an_environment_fault_frees_its_card_uncounted_and_halts() {
    let mut rig = rig();
    let id = rig.add("the board went read-only");
    rig.tick();
    let pid = rig.host.worker(&id).pid;
    rig.host.exit_with_fault(
        pid,
        EnvironmentFault::Configuration("the board is read-only for the worker".into()),
    );
    let end = block_on(rig.dispatcher.run(RunMode::Forever));
    assert_eq!(
        end.exit_code(),
        ExitCode::ConfigFail,
        "the dispatcher stops and says why"
    );
    let view = rig.card(&id);
    assert_eq!(view.task.status, TaskStatus::Ready);
    assert_eq!(view.task.consecutive_failures, 0, "not the card's fault");
    assert_eq!(view.runs[0].outcome.as_deref(), Some("released"));
    assert!(
        view.runs[0]
            .error
            .as_deref()
            .is_some_and(|error| error.contains("read-only")),
        "the run says what went wrong: {:?}",
        view.runs[0].error
    );
}

/// Two agents, each on a provider of its own.
fn two_provider_rig(max_wall_seconds: i64) -> Rig {
    rig_with(two_provider_settings(max_wall_seconds))
}

fn two_provider_settings(max_wall_seconds: i64) -> DispatchSettings {
    use kanban_core::walls::{AgentRoute, ProviderId};
    let route = |name: &str| AgentRoute {
        identity: format!("{name}#1"),
        provider: ProviderId {
            provider: Some(format!("provider-{name}")),
            model: Some("m".into()),
        },
        max_in_progress: None,
    };
    DispatchSettings {
        max_in_progress: 4,
        failure_policy: FailurePolicy {
            rate_limit_cooldown: 0,
            max_wall_seconds,
            ..FailurePolicy::default()
        },
        routes: [("a".to_owned(), route("a")), ("b".to_owned(), route("b"))].into(),
        ..settings()
    }
}

impl Rig {
    fn add_for(&self, title: &str, assignee: &str, priority: i64) -> String {
        block_on(self.board.create_task(&NewTask {
            title: title.into(),
            assignee: Some(assignee.into()),
            priority,
            ..NewTask::default()
        }))
        .unwrap()
    }

    /// The card's live worker completes it and exits 0.
    fn finish(&self, id: &str) {
        let worker = self.host.worker(id);
        block_on(self.board.complete(&worker.claim, "done", None)).unwrap();
        self.host.exit(worker.pid, ExitWitness::Code(0));
    }

    /// The card's live worker meets a rate wall of provider `a` that resets
    /// in `reset` seconds, and exits 75.
    fn hit_wall(&self, id: &str, reset: u64) {
        let worker = self.host.worker(id);
        let result = WorkerResult {
            pid: worker.pid,
            claim_lock: worker.claim.claim_lock.clone(),
            exit_code: ExitCode::TempFail,
            last_output: "429".into(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: Some(reset),
            failure_reason: Some(kanban_core::FailureReason::RateLimit),
            provider: Some("provider-a".into()),
            model: Some("m".into()),
        };
        block_on(self.board.book_result(&worker.claim, &result)).unwrap();
        self.host.exit(worker.pid, ExitWitness::Code(75));
    }

    fn runs_of(&self, ids: &[String]) -> usize {
        ids.iter().map(|id| self.card(id).runs.len()).sum()
    }
}

#[test]
fn a_wall_holds_one_providers_cards_with_zero_spawns_until_its_reset_then_one_probe() {
    let mut rig = two_provider_rig(3600);
    let first = rig.add_for("a first", "a", 10);
    let held: Vec<String> = (0..3)
        .map(|n| rig.add_for(&format!("a{n}"), "a", 0))
        .collect();
    let others: Vec<String> = (0..6)
        .map(|n| rig.add_for(&format!("b{n}"), "b", 5))
        .collect();
    rig.tick();
    rig.hit_wall(&first, 30);
    let armed_at = rig.time.now();
    for id in &others[..3] {
        rig.finish(id);
    }
    rig.tick();
    let walls = block_on(rig.board.walls()).unwrap();
    assert_eq!(walls.len(), 1);
    assert_eq!(walls[0].scope, "provider-a model:m");
    assert_eq!(walls[0].until, armed_at + 30);
    // Up to the reset: B's cards go on, A's are never spawned nor charged.
    while rig.time.now() < armed_at + 30 {
        for id in &others {
            if rig.host.live(id).iter().any(|p| p.alive) {
                rig.finish(id);
            }
        }
        rig.tick();
        assert_eq!(rig.runs_of(&held), 0, "spawned through the wall");
        rig.time.advance(1);
    }
    for id in &others {
        assert_eq!(rig.status(id), TaskStatus::Done, "{id}");
    }
    assert!(
        held.iter()
            .all(|id| rig.card(id).task.consecutive_failures == 0)
    );
    // At the reset, with room for four, exactly one probe.
    rig.tick();
    let probing: Vec<&String> = std::iter::once(&first)
        .chain(&held)
        .filter(|id| rig.status(id) == TaskStatus::Running)
        .collect();
    assert_eq!(probing, [&first], "one probe, the first in line");
    assert!(rig.events().iter().any(|event| matches!(
        event,
        DispatchEvent::WallProbe { task_id, .. } if *task_id == first
    )));
    rig.tick();
    assert_eq!(rig.runs_of(&held), 0, "nothing more while the probe runs");
    // The probe gets an answer: the wall lifts and the rest go.
    rig.finish(&first);
    rig.tick();
    assert!(block_on(rig.board.walls()).unwrap().is_empty());
    rig.tick();
    assert!(held.iter().all(|id| rig.status(id) == TaskStatus::Running));
}

#[test]
fn a_probe_the_board_refuses_releases_its_card_uncounted_and_the_other_agents_go_on() {
    // The dispatcher sees the wall's reset come; its board (another
    // dispatcher's probe, a re-armed wall; here a board whose clock is
    // behind) refuses the probe: the card is put back as if never claimed.
    let mut rig = rig_ahead(two_provider_settings(3600), 5);
    let first = rig.add_for("a first", "a", 10);
    rig.tick();
    rig.hit_wall(&first, 30);
    let waiting = rig.add_for("a waiting", "a", 9);
    rig.tick();
    assert_eq!(rig.status(&waiting), TaskStatus::Ready, "held by the wall");
    // As many of the other agent's cards as the dispatcher has room for.
    let others: Vec<String> = (0..4)
        .map(|n| rig.add_for(&format!("b{n}"), "b", 5))
        .collect();
    let wall = block_on(rig.board.walls()).unwrap()[0].clone();
    // The dispatcher reads the reset as come; the board, five seconds behind, does not.
    rig.time.set(wall.until - 5);
    rig.tick();
    assert!(
        [&first, &waiting]
            .iter()
            .all(|id| rig.status(id) == TaskStatus::Ready),
        "no probe the board refused is left claimed"
    );
    assert!(
        [&first, &waiting]
            .iter()
            .all(|id| rig.card(id).task.consecutive_failures == 0)
    );
    assert!(
        !rig.events()
            .iter()
            .any(|event| matches!(event, DispatchEvent::WallProbe { .. }))
    );
    assert!(rig.events().iter().any(|event| matches!(
        event,
        DispatchEvent::Released { counted: false, why, .. } if why == "another run probes its wall"
    )));
    assert!(
        others
            .iter()
            .all(|id| rig.status(id) == TaskStatus::Running),
        "the other agent's cards start in the same tick, in the refused probe's room too"
    );
    // Once the board agrees the reset came (and there is room), the probe goes.
    for id in &others {
        rig.finish(id);
    }
    rig.time.advance(5);
    rig.tick();
    assert!(
        rig.events()
            .iter()
            .any(|event| matches!(event, DispatchEvent::WallProbe { .. }))
    );
}

#[test]
fn a_probe_that_meets_the_wall_again_re_arms_it_with_backoff_within_the_bound() {
    // The provider names a day; the dispatcher waits ten minutes at most.
    let mut rig = two_provider_rig(600);
    let ids: Vec<String> = (0..3)
        .map(|n| rig.add_for(&format!("a{n}"), "a", 3 - n))
        .collect();
    rig.tick();
    // All three met the wall: one wall, three hits.
    for id in &ids {
        if rig.status(id) == TaskStatus::Running {
            rig.hit_wall(id, 86_400);
        }
    }
    let armed_at = rig.time.now();
    rig.tick();
    let wall = block_on(rig.board.walls()).unwrap()[0].clone();
    assert_eq!(wall.hits, 3);
    assert_eq!(wall.until, armed_at + 600, "bounded by --max-wall");
    rig.time.advance(599);
    rig.tick();
    assert!(ids.iter().all(|id| rig.status(id) != TaskStatus::Running));
    rig.time.advance(1);
    rig.tick();
    let probe: Vec<&String> = ids
        .iter()
        .filter(|id| rig.status(id) == TaskStatus::Running)
        .collect();
    assert_eq!(probe.len(), 1, "one probe");
    rig.hit_wall(probe[0], 20);
    let again = rig.time.now();
    rig.tick();
    let wall = block_on(rig.board.walls()).unwrap()[0].clone();
    assert_eq!(wall.failed_probes, 1);
    assert_eq!(wall.until, again + 40, "the reset, doubled");
    assert!(ids.iter().all(|id| rig.status(id) != TaskStatus::Running));
}

#[test]
fn a_command_agent_with_no_declared_provider_walls_its_own_cards_only() {
    // One unnamed command agent, no provider declared for it: the provider
    // its result names is not one it is entitled to, so the wall is its own.
    let mut rig = rig_with(DispatchSettings {
        max_in_progress: 1,
        failure_policy: FailurePolicy {
            rate_limit_cooldown: 0,
            ..FailurePolicy::default()
        },
        ..settings()
    });
    let first = rig.add("first");
    rig.time.advance(1);
    let next = rig.add("next");
    rig.tick();
    rig.hit_wall(&first, 30);
    rig.tick();
    let walls = block_on(rig.board.walls()).unwrap();
    assert_eq!(walls.len(), 1, "{walls:?}");
    assert_eq!(walls[0].scope, "agent:default");
    assert_eq!(walls[0].route, "default");
    rig.time.advance(29);
    rig.tick();
    assert_eq!(
        rig.card(&next).runs.len(),
        0,
        "held by its own agent's wall"
    );
    assert!(rig.events().iter().any(|event| matches!(
        event,
        DispatchEvent::WallHeld { route, for_seconds: 30, .. } if route == "default"
    )));
}

#[test]
fn an_agent_cannot_wall_another_agents_provider_or_private_scope() {
    use kanban_core::walls::AgentRoute;
    for forged in ["provider-a", "agent:a#1", " provider-a "] {
        let mut settings = two_provider_settings(3600);
        settings.routes.insert(
            "c".to_owned(),
            AgentRoute {
                identity: "c#1".into(),
                ..AgentRoute::default()
            },
        );
        let mut rig = rig_with(settings);
        let bad = rig.add_for("forger", "c", 9);
        rig.tick();
        let worker = rig.host.worker(&bad);
        let result = WorkerResult {
            pid: worker.pid,
            claim_lock: worker.claim.claim_lock.clone(),
            exit_code: ExitCode::TempFail,
            last_output: "429".into(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: Some(3000),
            failure_reason: Some(kanban_core::FailureReason::RateLimit),
            provider: Some(forged.into()),
            model: Some("m".into()),
        };
        block_on(rig.board.book_result(&worker.claim, &result)).unwrap();
        rig.host.exit(worker.pid, ExitWitness::Code(75));
        rig.tick();
        let walls = block_on(rig.board.walls()).unwrap();
        let scopes: Vec<&str> = walls.iter().map(|wall| wall.scope.as_str()).collect();
        assert_eq!(scopes, ["agent:c#1"], "{forged:?}");
        rig.time.advance(1);
        let victims: Vec<String> = (0..2)
            .map(|n| rig.add_for(&format!("victim {n}"), "a", 0))
            .collect();
        rig.tick();
        for victim in &victims {
            assert_eq!(
                rig.card(victim).runs.len(),
                1,
                "{forged:?}: agent a's card {victim} is spawned"
            );
        }
    }
}

#[test]
fn an_agent_declared_on_a_provider_walls_it_for_every_agent_that_shares_it() {
    // Agent b is declared on provider-a too: a's wall holds b's cards.
    let mut settings = two_provider_settings(3600);
    if let Some(b) = settings.routes.get_mut("b") {
        b.provider.provider = Some("provider-a".into());
    }
    let mut rig = rig_with(settings);
    let first = rig.add_for("first", "a", 9);
    rig.tick();
    rig.time.advance(1);
    let other = rig.add_for("other", "b", 0);
    rig.hit_wall(&first, 600);
    rig.tick();
    rig.tick();
    assert_eq!(rig.card(&other).runs.len(), 0, "held by the shared wall");
}

#[test]
fn an_exit_the_board_refuses_to_book_blocks_its_card_and_the_board_goes_on() {
    let time = VirtualClock::at(START);
    let (board, dir) = kanban_testkit::shared_file_board(time.clone());
    let mut rig = rig_on(board, time, settings(), 0);
    let marker = "UNBOOKABLE-OUTPUT";
    kanban_testkit::refuse_events(
        &dir.path().join("kanban.db"),
        &format!("instr(COALESCE(NEW.payload, ''), '{marker}') > 0"),
    );
    let poisoned = rig.add("poisoned");
    rig.tick();
    let worker = rig.host.worker(&poisoned);
    rig.host
        .say(worker.claim.run_id, &format!("the agent said {marker}"));
    rig.host.exit(worker.pid, ExitWitness::Code(1));
    rig.tick();
    assert_eq!(rig.status(&poisoned), TaskStatus::Running, "not booked yet");
    rig.time.advance(11);
    rig.tick();
    assert_eq!(
        rig.status(&poisoned),
        TaskStatus::Running,
        "two refusals may be the board's"
    );
    rig.time.advance(11);
    rig.tick();
    let card = rig.card(&poisoned);
    assert_eq!(
        card.task.status.known(),
        Some(TaskStatus::Blocked),
        "{card:?}"
    );
    let error = card.task.last_failure_error.unwrap_or_default();
    assert!(error.contains("this event is refused"), "{error}");
    assert!(
        card.events
            .iter()
            .any(|event| event.kind == "gave_up" && event.payload["trigger"] == "unbookable"),
        "{:?}",
        card.events
    );
    // The board goes on: the next card is claimed and booked as usual.
    let next = rig.add("next");
    rig.time.advance(120);
    rig.tick();
    assert_eq!(rig.host.live(&next).len(), 1, "{:#?}", rig.events());
    let worker = rig.host.worker(&next);
    rig.host.exit(worker.pid, ExitWitness::Code(1));
    rig.tick();
    assert_eq!(rig.status(&next), TaskStatus::Ready, "a crash, retried");
}

#[test]
fn a_wall_the_board_refuses_to_arm_is_left_out_of_the_exit_booked_plain() {
    let time = VirtualClock::at(START);
    let (board, dir) = kanban_testkit::shared_file_board(time.clone());
    let mut rig = rig_on(board, time, two_provider_settings(3600), 0);
    kanban_testkit::refuse_events(&dir.path().join("kanban.db"), "NEW.kind = 'wall_armed'");
    let walled = rig.add_for("walled", "a", 0);
    rig.tick();
    rig.hit_wall(&walled, 30);
    for _ in 0..3 {
        rig.tick();
        rig.time.advance(11);
    }
    let card = rig.card(&walled);
    assert_eq!(
        card.task.status.known(),
        Some(TaskStatus::Blocked),
        "{card:?}"
    );
    assert!(
        block_on(rig.board.walls()).unwrap().is_empty(),
        "no wall was armed"
    );
}

#[test]
fn a_release_the_board_refused_is_made_at_the_next_tick() {
    let time = VirtualClock::at(START);
    let (board, dir) = kanban_testkit::shared_file_board(time.clone());
    let mut rig = rig_on(board, time, settings(), 0);
    let path = dir.path().join("kanban.db");
    let id = rig.add("unlucky");
    // A spawn that fails for a passing fault: its claim is released, and
    // the board refuses the release.
    rig.host
        .fail_spawns(Some(EnvironmentFault::Transient("fork: try again".into())));
    kanban_testkit::refuse_events(&path, "NEW.kind = 'released'");
    rig.tick();
    assert!(rig.released().is_empty(), "the board refused the release");
    assert_eq!(rig.status(&id), TaskStatus::Running);
    kanban_testkit::accept_events(&path);
    rig.host.fail_spawns(None);
    rig.time.advance(11);
    rig.tick();
    assert_eq!(rig.released().first(), Some(&(id.clone(), false)));
    let card = rig.card(&id);
    assert_eq!(
        card.runs[0].outcome.as_deref(),
        Some("released"),
        "{card:?}"
    );
    assert_eq!(card.task.consecutive_failures, 0);
}

#[test]
fn a_board_replaced_under_the_dispatcher_winds_its_workers_down_and_writes_nothing() {
    let time = VirtualClock::at(START);
    let (board, dir) = kanban_testkit::shared_file_board(time.clone());
    let mut rig = rig_on(board, time, settings(), 0);
    let working = rig.add("working");
    rig.tick();
    let worker = rig.host.worker(&working);
    let path = dir.path().join("kanban.db");
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::rename(&copy, &path).unwrap();
    let later = rig.add("never claimed");
    rig.tick();
    assert!(
        rig.stopping()
            .contains(&(working.clone(), kanban_core::SignalReason::Shutdown)),
        "the worker is asked to stop: {:?}",
        rig.events()
    );
    assert_eq!(
        rig.dispatcher.next_wait(),
        Duration::from_secs(5),
        "the next tick comes when the grace period ends"
    );
    let end = block_on(rig.dispatcher.run(RunMode::Once));
    assert!(
        matches!(end, DispatchEnd::Halted(EnvironmentFault::Configuration(_))),
        "its worker stopped, the run ends: {end:?}"
    );
    assert_eq!(
        ticks_recorded(&rig),
        0,
        "not even the tick count is written to the replaced board's file"
    );
    assert!(
        rig.events()
            .iter()
            .any(|event| matches!(event, DispatchEvent::Halted { .. })),
        "claiming halts"
    );
    assert_eq!(rig.status(&later), TaskStatus::Ready, "nothing is claimed");
    assert_eq!(worker.signals, [], "the worker had run untouched before");
}

#[test]
fn a_pause_ends_on_its_last_millisecond_and_a_fault_then_doubles_the_next() {
    let mut rig = rig();
    let id = rig.add("patient");
    let fault = || EnvironmentFault::Transient("the server cannot be reached".into());
    rig.dispatcher.halt(fault());
    rig.time.advance_millis(999);
    assert_eq!(rig.tick().spawned, 0, "paused for the whole second");
    rig.time.advance_millis(1);
    rig.dispatcher.halt(fault());
    let pauses: Vec<u64> = rig
        .events()
        .iter()
        .filter_map(|event| match event {
            DispatchEvent::Paused { for_ms, .. } => Some(*for_ms),
            _ => None,
        })
        .collect();
    assert_eq!(
        pauses,
        [1000, 2000],
        "a fault met as the pause ends is a new one"
    );
    rig.time.advance_millis(2000);
    assert_eq!(rig.tick().spawned, 1, "over on its last millisecond");
    assert_eq!(rig.card(&id).task.consecutive_failures, 0);
}

#[test]
fn a_board_fault_met_by_a_claim_pauses_claiming() {
    let time = VirtualClock::at(START);
    let (board, dir) = kanban_testkit::shared_file_board(time.clone());
    let mut rig = rig_on(board, time, settings(), 0);
    let path = dir.path().join("kanban.db");
    let id = rig.add("patient");
    kanban_testkit::refuse_events(&path, "NEW.kind = 'claimed'");
    rig.tick();
    assert!(
        rig.events()
            .iter()
            .any(|event| matches!(event, DispatchEvent::Paused { .. })),
        "{:?}",
        rig.events()
    );
    kanban_testkit::accept_events(&path);
    assert_eq!(rig.tick().spawned, 0, "still paused");
    rig.time.advance(2);
    assert_eq!(rig.tick().spawned, 1, "resumed after the pause");
    assert_eq!(rig.card(&id).task.consecutive_failures, 0);
}

#[test]
fn a_wind_down_kills_what_outlives_the_grace_period_and_books_nothing() {
    let time = VirtualClock::at(START);
    let (board, dir) = kanban_testkit::shared_file_board(time.clone());
    let mut rig = rig_on(board, time, settings(), 0);
    let stubborn = rig.add("stubborn");
    let willing = rig.add("willing");
    rig.tick();
    let (stubborn, willing) = (rig.host.worker(&stubborn), rig.host.worker(&willing));
    rig.host.make_stubborn(stubborn.pid);
    let path = dir.path().join("kanban.db");
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::rename(&copy, &path).unwrap();
    rig.tick();
    let signals = |rig: &Rig, pid: u32| {
        rig.host
            .processes()
            .into_iter()
            .find(|process| process.pid == pid)
            .map(|process| process.signals)
            .unwrap_or_default()
    };
    assert_eq!(signals(&rig, stubborn.pid), [StopSignal::Terminate]);
    rig.time.advance_millis(4_999);
    rig.tick();
    assert_eq!(
        signals(&rig, stubborn.pid),
        [StopSignal::Terminate],
        "within the grace period"
    );
    rig.time.advance_millis(1);
    rig.tick();
    assert_eq!(
        signals(&rig, stubborn.pid),
        [StopSignal::Terminate, StopSignal::Kill],
        "killed once the grace period is over"
    );
    rig.tick();
    assert_eq!(
        signals(&rig, stubborn.pid).len(),
        2,
        "killed once, not at every tick"
    );
    let unbooked: Vec<u32> = rig
        .events()
        .iter()
        .filter_map(|event| match event {
            DispatchEvent::LeftUnbooked { pid, .. } => Some(*pid),
            _ => None,
        })
        .collect();
    assert!(unbooked.contains(&willing.pid), "{unbooked:?}");
}

#[test]
fn a_card_goes_to_the_agent_of_its_assignee_or_to_none() {
    use kanban_core::walls::{AgentRoute, ProviderId};
    let route = |name: &str| AgentRoute {
        identity: format!("{name}#1"),
        provider: ProviderId::default(),
        max_in_progress: None,
    };
    let with = |routes: &[&str]| DispatchSettings {
        routes: routes
            .iter()
            .map(|name| ((*name).to_owned(), route(name)))
            .collect(),
        ..settings()
    };
    let rig = rig_with(with(&["", "a"]));
    assert_eq!(rig.dispatcher.route_of(Some("a")), Some("a".into()));
    assert_eq!(rig.dispatcher.route_of(None), Some(String::new()));
    assert_eq!(
        rig.dispatcher.route_of(Some("b")),
        None,
        "named agents: b has none"
    );
    let rig = rig_with(with(&[""]));
    assert_eq!(
        rig.dispatcher.route_of(Some("b")),
        Some(String::new()),
        "a lone unnamed agent serves every card"
    );
    let rig = rig_with(with(&["a"]));
    assert_eq!(rig.dispatcher.route_of(Some("b")), None);
    assert_eq!(rig.dispatcher.route_of(Some("a")), Some("a".into()));
}

#[test]
fn the_unassigned_route_takes_cards_with_no_assignee_and_only_those() {
    let mut settings = two_provider_settings(3600);
    settings.unassigned_route = Some("a".into());
    let rig = rig_with(settings);
    assert_eq!(rig.dispatcher.route_of(None), Some("a".into()));
    assert_eq!(rig.dispatcher.route_of(Some("c")), None, "c has no agent");
    assert_eq!(
        rig.dispatcher.assignees_of("a"),
        Some(["".to_owned(), "a".to_owned()].into())
    );
    assert_eq!(
        rig.dispatcher.assignees_of("b"),
        Some(["b".to_owned()].into())
    );
}

#[test]
fn an_exit_of_75_or_78_with_no_reason_walls_its_agent_by_rate_or_credential() {
    for (code, kind) in [
        (ExitCode::TempFail, kanban_core::walls::WallKind::Rate),
        (
            ExitCode::ConfigFail,
            kanban_core::walls::WallKind::Credential,
        ),
    ] {
        let mut rig = two_provider_rig(3600);
        let id = rig.add_for("walled", "a", 0);
        rig.tick();
        let worker = rig.host.worker(&id);
        let result = WorkerResult {
            pid: worker.pid,
            claim_lock: worker.claim.claim_lock.clone(),
            exit_code: code,
            last_output: String::new(),
            turns: 1,
            recovery_attempts: 0,
            retry_after_seconds: None,
            failure_reason: None,
            provider: Some("provider-a".into()),
            model: Some("m".into()),
        };
        block_on(rig.board.book_result(&worker.claim, &result)).unwrap();
        rig.host.exit(worker.pid, ExitWitness::Code(code.code()));
        rig.tick();
        let walls = block_on(rig.board.walls()).unwrap();
        assert_eq!(
            walls.iter().map(|wall| wall.kind).collect::<Vec<_>>(),
            [kind],
            "exit {code:?}: {walls:?}"
        );
        assert_eq!(walls[0].reason, format!("exit {code}"));
    }
}

fn ticks_recorded(rig: &Rig) -> i64 {
    block_on(rig.board.stats())
        .unwrap()
        .tick_buckets
        .iter()
        .sum()
}

#[test]
fn once_is_one_tick_and_its_count_is_recorded() {
    let mut rig = rig();
    for n in 0..3 {
        rig.add(&format!("card {n}"));
    }
    let end = block_on(rig.dispatcher.run(RunMode::Once));
    assert!(matches!(end, DispatchEnd::Finished), "{end:?}");
    assert_eq!(rig.dispatcher.children().count(), 2, "one tick's claims");
    assert_eq!(rig.host.processes().len(), 2);
    assert_eq!(ticks_recorded(&rig), 1, "the tick is counted on the board");
    let said = block_on(rig.board.dispatchers()).unwrap();
    assert_eq!(
        said.iter()
            .map(|d| (
                d.host.as_str(),
                d.in_flight,
                d.state.as_str(),
                d.reported_at
            ))
            .collect::<Vec<_>>(),
        [("h1", 2, "stopped", START)],
        "it says how it ended, with its workers still alive"
    );
    assert_eq!(rig.dispatcher.halted(), None);
    let shown = format!("{:?}", rig.dispatcher);
    assert!(shown.contains("children: 2"), "{shown}");
    assert!(
        format!(
            "{:?}",
            DispatchPorts {
                board: rig.board.clone(),
                supervisor: Arc::new(rig.host.clone()),
                clock: Arc::new(rig.time.clone()),
                wakeups: Arc::new(rig.host.clone()),
                notes: Arc::new(|_: &DispatchEvent| {}),
            }
        )
        .contains("h1")
    );
}

#[test]
fn until_idle_runs_until_nothing_is_left_to_claim_or_book() {
    let mut rig = rig();
    let id = rig.add("quick");
    let (board, host) = (rig.board.clone(), rig.host.clone());
    rig.host.on_spawn(move |claim| {
        let (board, host, claim) = (board.clone(), host.clone(), claim.clone());
        // The worker finishes its card as soon as it starts.
        std::thread::spawn(move || {
            block_on(board.complete(&claim, "done", None)).unwrap();
            let pid = host.worker(&claim.task_id).pid;
            host.exit(pid, ExitWitness::Code(0));
        })
        .join()
        .unwrap();
    });
    let end = block_on(rig.dispatcher.run(RunMode::UntilIdle));
    assert!(matches!(end, DispatchEnd::Finished), "{end:?}");
    assert_eq!(rig.status(&id), TaskStatus::Done, "booked before it ended");
    assert!(ticks_recorded(&rig) >= 2);
}

#[test]
fn a_long_run_records_its_ticks_every_fifteen_seconds_and_at_its_stop() {
    let time = VirtualClock::at(START);
    let board = Arc::new(memory_board(Arc::new(time.clone())));
    let host = FakeHost::new("h1", time.clone());
    // At each tick (every 10 s), how many ticks the board has recorded.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (watched, stopper, counts) = (board.clone(), host.clone(), seen.clone());
    let ports = DispatchPorts {
        board: board.clone(),
        supervisor: Arc::new(host.clone()),
        clock: Arc::new(time.clone()),
        wakeups: Arc::new(host.clone()),
        notes: Arc::new(move |event: &DispatchEvent| {
            if matches!(event, DispatchEvent::Tick { .. }) {
                let stats = block_on(watched.stats()).unwrap();
                let mut counts = counts.lock().unwrap();
                counts.push(stats.tick_buckets.iter().sum::<i64>());
                if counts.len() == 4 {
                    stopper.request_stop();
                }
            }
        }),
    };
    let mut dispatcher = Dispatcher::new(ports, settings());
    let end = block_on(dispatcher.run(RunMode::Forever));
    assert!(matches!(end, DispatchEnd::Interrupted), "{end:?}");
    assert_eq!(
        *seen.lock().unwrap(),
        [0, 0, 0, 3],
        "flushed after the tick 20 s in, not before"
    );
    let stats = block_on(board.stats()).unwrap();
    assert_eq!(
        stats.tick_buckets.iter().sum::<i64>(),
        4,
        "the last at the stop"
    );
}

impl Rig {
    /// A card claimed and started, whose worker ignores SIGTERM and
    /// survives SIGKILL.
    fn start_unkillable(&mut self, title: &str) -> (String, u32) {
        let id = self.add(title);
        self.tick();
        let pid = self.host.worker(&id).pid;
        self.host.make_stubborn(pid);
        self.host.make_unkillable(pid);
        (id, pid)
    }

    fn tick_whys(&self) -> Vec<&'static str> {
        self.events()
            .into_iter()
            .filter_map(|event| match event {
                DispatchEvent::Tick { why, .. } => Some(why),
                _ => None,
            })
            .collect()
    }

    fn board_events(&self, id: &str, kind: &str) -> usize {
        self.card(id)
            .events
            .iter()
            .filter(|event| event.kind == kind)
            .count()
    }

    fn count(&self, wanted: impl Fn(&DispatchEvent) -> bool) -> usize {
        self.events().iter().filter(|event| wanted(event)).count()
    }

    fn expires(&self, id: &str) -> i64 {
        self.card(id).task.claim_expires.unwrap()
    }
}

fn mono_ms(rig: &Rig) -> u64 {
    Clock::monotonic_millis(&rig.time)
}

#[test]
fn the_wait_between_ticks_ends_when_a_stop_escalates() {
    let mut rig = rig();
    assert_eq!(rig.dispatcher.next_wait(), Duration::from_secs(10));
    let (id, _) = rig.start_unkillable("unkillable");
    rig.time.advance(1);
    block_on(rig.board.reclaim(&id, "operator")).unwrap();
    rig.tick();
    rig.time.advance(1);
    assert_eq!(
        rig.dispatcher.next_wait(),
        Duration::from_secs(4),
        "until the grace period ends, 5 s after the stop"
    );
    rig.time.advance(4);
    rig.tick();
    assert_eq!(
        rig.host.worker(&id).signals,
        [StopSignal::Terminate, StopSignal::Kill]
    );
    rig.time.advance(2);
    assert_eq!(
        rig.dispatcher.next_wait(),
        Duration::from_secs(3),
        "until the kill wait ends, 10 s after the stop"
    );
}

#[test]
fn a_shutdown_waits_out_the_grace_and_the_kill_wait_then_leaves_an_unkillable_worker() {
    let mut rig = rig();
    let (id, pid) = rig.start_unkillable("unkillable");
    rig.host.request_stop();
    let began = mono_ms(&rig);
    let end = block_on(rig.dispatcher.run(RunMode::Forever));
    assert_eq!(end, DispatchEnd::Interrupted);
    let waited = mono_ms(&rig) - began;
    // The rig's dispatcher reads its monotonic clock in whole seconds.
    assert!(
        (10_001..=11_000).contains(&waited),
        "gives up one step after the 5 s grace and the 5 s kill wait: {waited} ms"
    );
    assert_eq!(
        rig.host.worker(&id).signals,
        [StopSignal::Terminate, StopSignal::Kill]
    );
    assert_eq!(
        rig.count(|event| matches!(
            event,
            DispatchEvent::LeftRunning { task_id, pid: left } if *task_id == id && *left == pid
        )),
        1,
        "{:?}",
        rig.events()
    );
}

#[test]
fn a_paused_dispatcher_is_never_idle() {
    let mut rig = rig();
    rig.dispatcher.halt(EnvironmentFault::Transient(
        "the server cannot be reached".into(),
    ));
    assert!(!rig.tick().idle, "paused, with nothing on the board");
    rig.time.advance(2);
    assert!(rig.tick().idle, "the pause is over");
}

#[test]
fn a_tick_counts_the_bookings_of_workers_it_did_not_start() {
    let mut rig = rig_with(DispatchSettings {
        max_runtime_seconds: Some(60),
        ..settings()
    });
    let id = rig.add("an earlier dispatcher's");
    let (_, pid) = rig.foreign_claim(&id, "h1:99:old");
    rig.host.make_stubborn(pid);
    rig.tick();
    rig.time.advance(66);
    rig.tick();
    assert_eq!(
        rig.stopping(),
        [(id.clone(), kanban_core::SignalReason::Overrun)]
    );
    let report = rig.tick();
    assert_eq!(report.booked, 0, "it still runs: nothing to book");
    assert_eq!(rig.status(&id), TaskStatus::Running);
    rig.host.exit(pid, ExitWitness::Signal(15));
    assert_eq!(rig.tick().booked, 1, "booked once it died");
    assert_eq!(
        rig.count(|event| matches!(event, DispatchEvent::Booked { .. })),
        1,
        "and only once: {:?}",
        rig.events()
    );
    assert_eq!(rig.card(&id).runs[0].outcome.as_deref(), Some("timed_out"));
}

#[test]
fn a_run_past_its_limit_and_the_grace_period_is_stopped_and_a_limit_of_zero_is_none() {
    let mut rig = rig_with(DispatchSettings {
        max_runtime_seconds: Some(60),
        ..settings()
    });
    let limited = rig.add("limited");
    let unlimited = block_on(rig.board.create_task(&NewTask {
        title: "unlimited".into(),
        max_runtime_seconds: Some(0),
        ..NewTask::default()
    }))
    .unwrap();
    rig.tick();
    // Runs are timed from when this dispatcher first saw them on the board.
    rig.tick();
    rig.time.advance(65);
    rig.tick();
    assert!(rig.stopping().is_empty(), "60 s and 5 s of grace: not yet");
    rig.time.advance(1);
    rig.tick();
    assert_eq!(
        rig.stopping(),
        [(limited.clone(), kanban_core::SignalReason::Overrun)],
        "and the card with a limit of 0 runs on"
    );
    assert_eq!(
        rig.board_events(&limited, "worker_signalled"),
        1,
        "why it was stopped is on the board before the signal"
    );
    assert_eq!(rig.board_events(&unlimited, "worker_signalled"), 0);
}

#[test]
fn a_reclaim_is_deferred_once_when_a_worker_outlives_the_kill_wait() {
    let mut rig = rig_with(DispatchSettings {
        max_runtime_seconds: Some(60),
        ..settings()
    });
    let (id, _) = rig.start_unkillable("unkillable");
    // Runs are timed from when this dispatcher first saw them on the board.
    rig.tick();
    rig.time.advance(66);
    rig.tick();
    let deferred =
        |rig: &Rig| rig.count(|event| matches!(event, DispatchEvent::ReclaimDeferred { .. }));
    for second in 1..10 {
        rig.time.advance(1);
        rig.tick();
        assert_eq!(deferred(&rig), 0, "{second} s after the stop");
    }
    assert_eq!(
        rig.host.worker(&id).signals,
        [StopSignal::Terminate, StopSignal::Kill]
    );
    rig.time.advance(1);
    rig.tick();
    assert_eq!(deferred(&rig), 1, "10 s after the stop");
    for _ in 0..3 {
        rig.time.advance(1);
        rig.tick();
    }
    assert_eq!(deferred(&rig), 1, "said once");
    assert_eq!(
        rig.board_events(&id, "reclaim_deferred"),
        1,
        "recorded once"
    );
}

#[test]
fn a_lease_is_renewed_once_a_third_is_gone_and_a_lapsed_one_is_recorded() {
    let mut rig = rig();
    let id = rig.add("quiet");
    rig.tick();
    let first = rig.expires(&id);
    rig.time.advance(TTL / 3);
    rig.tick();
    assert_eq!(rig.expires(&id), first, "two thirds left: not yet");
    rig.time.advance(1);
    rig.tick();
    assert_eq!(rig.expires(&id), START + TTL / 3 + 1 + TTL);
    let extended =
        |rig: &Rig| rig.count(|event| matches!(event, DispatchEvent::LeaseExtended { .. }));
    assert_eq!(extended(&rig), 0, "a renewal in time is not news");
    assert_eq!(rig.board_events(&id, "claim_extended"), 0);
    // The dispatcher stalled past the lease; its worker lives on.
    rig.time.advance(TTL + 1);
    rig.tick();
    assert_eq!(rig.expires(&id), START + TTL / 3 + 1 + TTL + 1 + TTL);
    assert_eq!(extended(&rig), 1, "a lapsed lease renewed is");
    assert_eq!(rig.board_events(&id, "claim_extended"), 1);
}

#[test]
fn a_claim_that_goes_through_ends_the_doubling_of_pauses_and_a_quiet_tick_does_not() {
    let mut rig = rig();
    let fault = || EnvironmentFault::Transient("the server cannot be reached".into());
    rig.dispatcher.halt(fault());
    rig.time.advance(1);
    rig.dispatcher.halt(fault());
    rig.time.advance(2);
    assert_eq!(rig.tick().spawned, 0, "nothing to claim");
    rig.dispatcher.halt(fault());
    rig.time.advance(4);
    rig.add("card");
    assert_eq!(rig.tick().spawned, 1);
    rig.dispatcher.halt(fault());
    let pauses: Vec<u64> = rig
        .events()
        .iter()
        .filter_map(|event| match event {
            DispatchEvent::Paused { for_ms, .. } => Some(*for_ms),
            _ => None,
        })
        .collect();
    assert_eq!(pauses, [1000, 2000, 4000, 1000]);
}

#[test]
fn each_tick_says_why_it_claimed_no_more() {
    let mut rig = rig();
    for n in 0..3 {
        rig.add(&format!("card {n}"));
    }
    rig.tick();
    rig.tick();
    let mut rig_one = rig_with(settings());
    rig_one.add("alone");
    rig_one.tick();
    assert_eq!(
        rig.tick_whys(),
        [
            "every free slot was filled",
            "every slot is taken (--max-in-progress)"
        ]
    );
    assert_eq!(rig_one.tick_whys(), ["nothing more to claim now"]);
}

#[test]
fn an_agent_at_its_own_limit_gets_no_more_cards() {
    use kanban_core::walls::{AgentRoute, ProviderId};
    let mut rig = rig_with(DispatchSettings {
        max_in_progress: 4,
        routes: [(
            "a".to_owned(),
            AgentRoute {
                identity: "a#1".into(),
                provider: ProviderId::default(),
                max_in_progress: Some(1),
            },
        )]
        .into(),
        ..settings()
    });
    let ids: Vec<String> = (0..3)
        .map(|n| rig.add_for(&format!("card {n}"), "a", 0))
        .collect();
    assert_eq!(rig.tick().spawned, 1, "a's own limit is 1");
    assert_eq!(rig.tick().spawned, 0);
    assert_eq!(rig.runs_of(&ids), 1);
    let at_their_limit: Vec<Vec<String>> = rig
        .events()
        .into_iter()
        .filter_map(|event| match event {
            DispatchEvent::ClaimPlan { at_their_limit, .. } => Some(at_their_limit),
            _ => None,
        })
        .collect();
    assert_eq!(at_their_limit, [vec![], vec!["a".to_owned()]]);
}

#[test]
fn a_card_skipped_for_an_earlier_run_that_will_not_die_uses_up_its_claim() {
    let mut rig = rig();
    let stuck = rig.add("an earlier run will not die");
    let (_, pid) = rig.foreign_claim(&stuck, "h1:99:old");
    rig.host.make_stubborn(pid);
    rig.host.make_unkillable(pid);
    block_on(rig.board.reclaim(&stuck, "operator")).unwrap();
    let next = rig.add("next");
    assert_eq!(rig.tick().spawned, 1);
    assert_eq!(
        rig.card(&stuck).runs.len(),
        2,
        "the earlier run, and one claim this tick, not one per free slot"
    );
    assert_eq!(rig.status(&next), TaskStatus::Running);
}

#[test]
fn the_log_says_how_each_exit_was_booked_and_where_its_code_came_from() {
    use kanban_core::{Booking, BookingKind};
    let booked = |source: &'static str, kind: BookingKind, blocks: bool| {
        DispatchEvent::Booked {
            task_id: "t_1".into(),
            witness: ExitWitness::Code(75),
            source,
            booking: Booking {
                kind,
                counts_failure: false,
                blocks,
                cooldown: false,
            },
        }
        .to_string()
    };
    assert_eq!(
        booked("wait", BookingKind::RateLimited, false),
        "t_1 worker exited 75: rate limited: back to ready, not counted, held for the cooldown"
    );
    assert_eq!(
        booked("trailer", BookingKind::Crashed, true),
        "t_1 worker exited 75 (from trailer): crashed, at the failure limit: blocked"
    );
}

#[test]
fn each_line_about_a_card_starts_with_its_id_and_a_spawn_names_its_title() {
    use kanban_core::{Booking, BookingKind, SignalReason};
    let id = || "t_1".to_owned();
    let about_a_card = [
        DispatchEvent::Spawned {
            task_id: id(),
            title: "write it".into(),
            run_id: 2,
            pid: 3,
        },
        DispatchEvent::Booked {
            task_id: id(),
            witness: ExitWitness::Code(0),
            source: "wait",
            booking: Booking {
                kind: BookingKind::Settled,
                counts_failure: false,
                blocks: false,
                cooldown: false,
            },
        },
        DispatchEvent::LeaseExtended {
            task_id: id(),
            pid: 3,
        },
        DispatchEvent::Stopping {
            task_id: id(),
            pid: 3,
            reason: SignalReason::Fenced,
        },
        DispatchEvent::Killed {
            task_id: id(),
            pid: 3,
        },
        DispatchEvent::ReclaimDeferred {
            task_id: id(),
            pid: 3,
        },
        DispatchEvent::Released {
            task_id: id(),
            counted: false,
            why: "stale".into(),
        },
        DispatchEvent::WallProbe {
            task_id: id(),
            scopes: vec!["coder".into()],
        },
        DispatchEvent::LeftRunning {
            task_id: id(),
            pid: 3,
        },
        DispatchEvent::LeftUnbooked {
            task_id: id(),
            pid: 3,
        },
    ];
    for event in &about_a_card {
        assert_eq!(event.task_id(), Some("t_1"), "{event:?}");
        assert!(event.to_string().starts_with("t_1 "), "{event}");
    }
    let fault = EnvironmentFault::Transient("disk full".into());
    let about_the_board = [
        DispatchEvent::Promoted { count: 1 },
        DispatchEvent::Halted {
            fault: fault.clone(),
        },
        DispatchEvent::Paused { fault, for_ms: 5 },
        DispatchEvent::Resumed,
        DispatchEvent::Tick {
            running: 0,
            room: 1,
            spawned: 0,
            why: "idle",
        },
        DispatchEvent::ClaimPlan {
            open: vec![],
            walled: vec![],
            probing: vec![],
            at_their_limit: vec![],
        },
        DispatchEvent::WallHeld {
            route: "coder".into(),
            until: 9,
            for_seconds: 9,
        },
        DispatchEvent::BoardTrouble {
            message: "busy".into(),
        },
    ];
    for event in &about_the_board {
        assert_eq!(event.task_id(), None, "{event:?}");
    }

    let mut rig = rig();
    let id = rig.add("write the intro");
    rig.tick();
    assert!(
        rig.events().iter().any(|event| matches!(
            event,
            DispatchEvent::Spawned { task_id, title, .. } if *task_id == id && title == "write the intro"
        )),
        "{:?}",
        rig.events()
    );
}

#[test]
fn only_the_worker_that_lost_its_claim_is_stopped() {
    let mut rig = rig();
    let lost = rig.add("taken back");
    let kept = rig.add("kept");
    rig.tick();
    block_on(rig.board.reclaim(&lost, "operator")).unwrap();
    rig.tick();
    assert_eq!(
        rig.stopping(),
        [(lost.clone(), kanban_core::SignalReason::Fenced)]
    );
    assert_eq!(
        rig.board_events(&lost, "worker_signalled"),
        0,
        "a fenced run's stop is not recorded: its run is over"
    );
    assert_eq!(rig.status(&kept), TaskStatus::Running);
}

/// A rig whose failed runs are claimed again at once.
fn rig_without_backoff() -> Rig {
    rig_with(DispatchSettings {
        failure_policy: FailurePolicy {
            backoff_base_seconds: 0,
            ..FailurePolicy::default()
        },
        ..settings()
    })
}

/// A rig whose card failed its first run, with `on_sweep` run as the
/// rerun's earlier processes are swept; the next tick claims the rerun.
fn rig_before_a_rerun(
    on_sweep: impl Fn(&Rig) -> Box<dyn Fn(&Claim) + Send + Sync>,
) -> (Rig, String) {
    let mut rig = rig_without_backoff();
    let id = rig.add("again");
    rig.tick();
    let first = rig.host.worker(&id);
    rig.host.on_sweep(on_sweep(&rig));
    rig.host.exit(first.pid, ExitWitness::Code(1));
    (rig, id)
}

#[test]
fn a_claim_that_aged_before_its_worker_started_is_renewed_before_the_start() {
    let (mut rig, id) = rig_before_a_rerun(|rig| {
        let time = rig.time.clone();
        Box::new(move |_| time.advance(TTL - 10))
    });
    rig.tick();
    let rerun = rig.host.worker(&id);
    assert_eq!(rerun.claim.run_id, 2, "the rerun started in this tick");
    assert_eq!(
        rig.expires(&id),
        rig.time.now() + TTL,
        "a whole lease from the start, not the ten seconds the slow sweep left"
    );
    assert_eq!(
        rig.board_events(&id, "claim_extended"),
        0,
        "a lease renewed before it lapsed is not news"
    );
}

#[test]
fn a_claim_that_lapsed_before_its_worker_started_is_renewed_and_recorded() {
    let (mut rig, id) = rig_before_a_rerun(|rig| {
        let time = rig.time.clone();
        Box::new(move |_| time.advance(TTL + 5))
    });
    rig.tick();
    assert_eq!(rig.host.worker(&id).claim.run_id, 2);
    assert_eq!(rig.expires(&id), rig.time.now() + TTL);
    assert_eq!(rig.board_events(&id, "claim_extended"), 1);
}

#[test]
fn a_claim_taken_back_before_its_worker_started_starts_nothing() {
    let (mut rig, id) = rig_before_a_rerun(|rig| {
        let (time, board) = (rig.time.clone(), rig.board.clone());
        Box::new(move |claim| {
            time.advance(TTL + 5);
            block_on(board.reclaim(&claim.task_id, "operator")).unwrap();
        })
    });
    rig.tick();
    assert!(rig.host.live(&id).is_empty(), "{:?}", rig.host.processes());
    assert!(rig.stopping().is_empty(), "no worker was started to stop");
    assert_eq!(rig.status(&id), TaskStatus::Ready);
}

#[test]
fn a_fresh_claim_keeps_its_lease_until_a_third_of_it_is_gone_by_the_dispatchers_clock() {
    let mut rig = rig_ahead(settings(), TTL / 3);
    let id = rig.add("on time");
    rig.tick();
    assert_eq!(rig.expires(&id), START + TTL, "two thirds left: untouched");
    let mut rig = rig_ahead(settings(), TTL / 3 + 1);
    let id = rig.add("late");
    rig.tick();
    assert_eq!(
        rig.expires(&id),
        START + TTL / 3 + 1 + TTL,
        "less than two thirds left at its start: renewed by the dispatcher's clock"
    );
}

#[test]
fn a_dry_run_foresees_the_ticks_claims_and_writes_nothing() {
    use kanban_core::Foreseen;
    use kanban_core::walls::{AgentRoute, ProviderId};
    let limited = |limit| AgentRoute {
        identity: "a#1".into(),
        provider: ProviderId::default(),
        max_in_progress: limit,
    };
    let mut rig = rig_with(DispatchSettings {
        max_in_progress: 3,
        routes: [
            ("a".to_owned(), limited(Some(2))),
            ("b".to_owned(), limited(None)),
        ]
        .into(),
        ..settings()
    });
    let running = rig.add_for("a runs", "a", 9);
    let a1 = rig.add_for("a one", "a", 8);
    let a2 = rig.add_for("a two", "a", 7);
    let b1 = rig.add_for("b one", "b", 6);
    let b2 = rig.add_for("b two", "b", 5);
    let nobody = rig.add_for("for nobody", "c", 4);
    // One of a's cards runs on this host: one slot and one of a's room gone.
    block_on(rig.board.claim_task(&running, TTL, "h1:1:x"))
        .unwrap()
        .unwrap();
    let before: Vec<_> = [&a1, &a2, &b1, &b2].iter().map(|id| rig.card(id)).collect();
    let preview = block_on(rig.dispatcher.preview(10)).unwrap();
    let after: Vec<_> = [&a1, &a2, &b1, &b2].iter().map(|id| rig.card(id)).collect();
    assert_eq!(before, after, "a dry run writes nothing");
    assert_eq!(
        (preview.running_here, preview.slots, preview.more),
        (1, 2, false)
    );
    let verdicts: Vec<(&str, &Foreseen)> = preview
        .cards
        .iter()
        .map(|(card, foreseen)| (card.task_id.as_str(), foreseen))
        .collect();
    let claim = |route: &str| Foreseen::Claim {
        route: route.to_owned(),
    };
    assert_eq!(
        verdicts,
        [
            (a1.as_str(), &claim("a")),
            (
                a2.as_str(),
                &Foreseen::AgentFull {
                    route: "a".to_owned()
                }
            ),
            (b1.as_str(), &claim("b")),
            (b2.as_str(), &Foreseen::NoRoom),
            (nobody.as_str(), &Foreseen::NoAgent),
        ]
    );
    // Reading fewer cards than wait says so.
    let preview = block_on(rig.dispatcher.preview(2)).unwrap();
    assert_eq!((preview.cards.len(), preview.more), (2, true));
    let preview = block_on(rig.dispatcher.preview(5)).unwrap();
    assert_eq!((preview.cards.len(), preview.more), (5, false));
    // The tick claims just what the dry run foresaw.
    rig.tick();
    assert_eq!(
        [&a1, &a2, &b1, &b2].map(|id| rig.status(id)),
        [
            TaskStatus::Running,
            TaskStatus::Ready,
            TaskStatus::Running,
            TaskStatus::Ready
        ]
    );
}

#[test]
fn a_wall_holds_back_the_cards_of_every_route_reaching_its_scope() {
    use std::collections::{BTreeMap, BTreeSet};
    let set = |names: &[&str]| -> BTreeSet<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    };
    let scopes: BTreeMap<String, BTreeSet<String>> = [
        ("coder", set(&["agent:coder#1", "http:api.example"])),
        ("writer", set(&["agent:writer#2", "http:api.example"])),
        ("reviewer", set(&["agent:reviewer#3"])),
    ]
    .into_iter()
    .map(|(route, reached)| (route.to_owned(), reached))
    .collect();
    let behind = |scope: &str, unassigned: Option<&str>| {
        kanban_core::assignees_behind(scope, &scopes, unassigned)
    };
    assert_eq!(
        behind("http:api.example", Some("writer")),
        Some(set(&["coder", "writer", ""])),
        "the default agent's wall holds the cards with no assignee too"
    );
    assert_eq!(
        behind("http:api.example", Some("reviewer")),
        Some(set(&["coder", "writer"]))
    );
    assert_eq!(behind("agent:reviewer#3", None), Some(set(&["reviewer"])));
    assert_eq!(behind("agent:nobody", None), Some(set(&[])));
    let lone: BTreeMap<String, BTreeSet<String>> = [(String::new(), set(&["agent:default"]))]
        .into_iter()
        .collect();
    assert_eq!(
        kanban_core::assignees_behind("agent:default", &lone, None),
        None,
        "a lone unnamed agent works every card"
    );
}
