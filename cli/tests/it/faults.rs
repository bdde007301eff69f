//! The system under real faults: the environment's failures halt the
//! dispatcher and never count against a card; work that lost its claim
//! stops, agent group and all; hung turns and runs end as `timed_out`; the
//! worker's exit witness cannot be forged. Real processes, real board files,
//! real signals, a real remount and a real clock jump.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use kanban_testkit::{AgentCensus, write_executable};

use crate::{Bench, Mount, dead, reaped, runs, text, wait_for};

/// An agent script from its body; it reads the prompt first, as agents do.
fn script(bench: &Bench, name: &str, body: &str) -> PathBuf {
    let path = bench.path().join(name);
    write_executable(&path, &format!("#!/bin/sh\ncat > /dev/null\n{body}\n"));
    path
}

fn spawn_dispatch(bench: &Bench, agent: &Path, extra: &[&str]) -> Child {
    bench
        .dispatch_command(agent, extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Fails the test, with what `child` said, if it has ended.
fn still_running(child: &mut Child) {
    if child.try_wait().unwrap().is_some() {
        let mut said = String::new();
        if let Some(mut out) = child.stdout.take() {
            let _ = out.read_to_string(&mut said);
        }
        if let Some(mut err) = child.stderr.take() {
            let _ = err.read_to_string(&mut said);
        }
        panic!("ended early: {said}");
    }
}

/// Waits for `child` at most `limit`; kills it and fails the test past that.
fn finish_within(mut child: Child, limit: Duration) -> Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}:\n{}\n{}",
                text(&output.stdout),
                text(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn failures(bench: &Bench, id: &str) -> i64 {
    bench.show(id)["task"]["consecutive_failures"]
        .as_i64()
        .unwrap()
}

fn worker_pid(bench: &Bench, id: &str) -> Option<i32> {
    bench.show(id)["task"]["worker_pid"]
        .as_i64()
        .map(|pid| pid as i32)
}

/// The pid an agent wrote to `file` (agents here write `$$` on start).
fn pid_in(file: &Path) -> i32 {
    std::fs::read_to_string(file)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn outcomes(bench: &Bench, id: &str) -> Vec<String> {
    runs(&bench.show(id))
        .iter()
        .map(|run| run["outcome"].as_str().unwrap_or("").to_owned())
        .collect()
}

// 1. The environment's failures halt the dispatcher, not the cards.

#[test]
fn a_mistyped_agent_halts_with_78_before_any_claim() {
    let bench = Bench::new();
    let ids: Vec<String> = (0..5)
        .map(|i| bench.add(&format!("card {i}"), &[]))
        .collect();
    let missing = bench.path().join("agnet.sh");
    let output = bench
        .dispatch_command(&missing, &["--until-idle"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(78), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("agnet.sh") && stderr.contains("does not exist"),
        "{stderr}"
    );
    for id in &ids {
        let card = bench.show(id);
        assert_eq!(card["task"]["status"], "ready");
        assert!(runs(&card).is_empty(), "nothing claimed: {card}");
    }
}

#[test]
fn dispatch_without_an_agent_claims_nothing() {
    let bench = Bench::new();
    let id = bench.add("waiting", &[]);
    let output = bench.run(&["dispatch", "--until-idle"]);
    assert_eq!(output.status.code(), Some(78));
    assert!(text(&output.stderr).contains("--agent"));
    assert!(runs(&bench.show(&id)).is_empty());
}

#[test]
fn an_agent_deleted_mid_dispatch_halts_78_and_charges_no_card() {
    let bench = Bench::new();
    let first = bench.add("first", &["--priority", "9"]);
    let rest: Vec<String> = (0..3)
        .map(|i| bench.add(&format!("later {i}"), &[]))
        .collect();
    // The first card's agent finishes it, then deletes itself: every later
    // worker finds no agent to run.
    let agent = script(
        &bench,
        "vanishing.sh",
        r#""$KANBAN_BIN" complete --summary done >&2 || exit $?
rm -f "$0"
echo '{"completed": true, "final_response": "done"}'"#,
    );
    let output = finish_within(
        spawn_dispatch(&bench, &agent, &["--max-in-progress", "1"]),
        Duration::from_secs(60),
    );
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("vanishing.sh"), "names the agent: {stderr}");
    assert_eq!(bench.show(&first)["task"]["status"], "done");
    for id in &rest {
        let card = bench.show(id);
        assert_eq!(card["task"]["status"], "ready", "{card}");
        assert_eq!(failures(&bench, id), 0, "not charged: {card}");
    }
    let tried: usize = rest.iter().map(|id| runs(&bench.show(id)).len()).sum();
    assert_eq!(tried, 1, "claiming stopped after the first setup failure");
}

/// A board on a tmpfs, with `cards` cards and a slow agent working them.
fn board_on_tmpfs(bench: &mut Bench) -> Mount {
    let mount = Mount::tmpfs(bench, "16m");
    bench.db = mount.0.join("kanban.db");
    bench.ok(&["init"]);
    mount
}

/// Dispatches slow cards until the first worker runs, then breaks the
/// board with `fault`; the dispatcher must halt 78 within the grace period
/// and a few ticks, and no card may be charged.
fn dispatch_and_break_the_board(bench: &Bench, fault: impl FnOnce()) -> (Output, Vec<String>) {
    let ids: Vec<String> = (0..4)
        .map(|i| bench.add(&format!("card {i}"), &[]))
        .collect();
    let agent = script(
        bench,
        "slow.sh",
        r#"sleep 30
"$KANBAN_BIN" complete --summary done >&2 || exit $?"#,
    );
    let child = spawn_dispatch(bench, &agent, &["--max-in-progress", "2", "--grace", "1"]);
    wait_for("two workers", || {
        ids.iter()
            .filter(|id| worker_pid(bench, id).is_some())
            .count()
            == 2
    });
    let pids: Vec<i32> = ids.iter().filter_map(|id| worker_pid(bench, id)).collect();
    fault();
    let output = finish_within(child, Duration::from_secs(20));
    for pid in pids {
        assert!(reaped(pid), "worker {pid} was stopped before the halt");
    }
    (output, ids)
}

#[test]
fn a_board_made_read_only_under_a_dispatcher_halts_78_and_charges_no_card() {
    let mut bench = Bench::new();
    let mount = board_on_tmpfs(&mut bench);
    let (output, ids) = dispatch_and_break_the_board(&bench, || mount.freeze());
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("kanban.db") && stderr.contains("Read-only file system"),
        "names the board and the fault: {stderr}"
    );
    // Made writable again, the board books the stopped workers uncounted.
    mount.thaw();
    let agent = script(
        &bench,
        "quick.sh",
        r#""$KANBAN_BIN" complete --summary done >&2 || exit $?"#,
    );
    bench.dispatch_until_idle(&agent, &["--ttl", "1", "--rate-limit-cooldown", "0"]);
    for id in &ids {
        assert_eq!(failures(&bench, id), 0, "{}", bench.show(id));
        assert_eq!(bench.show(id)["task"]["status"], "done");
    }
}

#[test]
fn dispatch_on_a_read_only_board_exits_78_and_claims_nothing() {
    let mut bench = Bench::new();
    let mount = board_on_tmpfs(&mut bench);
    let id = bench.add("waiting", &[]);
    mount.remount_read_only();
    let agent = script(&bench, "never.sh", "exit 0");
    let output = bench
        .dispatch_command(&agent, &["--until-idle"])
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("kanban.db") && stderr.contains("nothing was claimed"),
        "{stderr}"
    );
    mount.remount("rw");
    assert!(runs(&bench.show(&id)).is_empty());
}

#[test]
fn a_deleted_write_ahead_log_halts_78_and_writes_nothing_more() {
    let bench = Bench::new();
    let wal = PathBuf::from(format!("{}-wal", bench.db.display()));
    let (output, ids) = dispatch_and_break_the_board(&bench, || {
        std::fs::remove_file(&wal).unwrap();
    });
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("write-ahead log") && stderr.contains("integrity_check"),
        "says what broke and what to do: {stderr}"
    );
    for id in &ids {
        assert_eq!(failures(&bench, id), 0);
    }
}

// 2. Fenced-out work stops.

#[test]
fn an_operator_reclaim_stops_the_old_agent_group_before_the_next_run() {
    let bench = Bench::new();
    let id = bench.add("reclaimed", &[]);
    let pids = bench.path().join("pids");
    // The first run works forever, with a helper in its group; later runs
    // finish at once.
    let agent = script(
        &bench,
        "fenced-agent.sh",
        &format!(
            r#"echo $$ >> '{pids}'
if [ "$(wc -l < '{pids}')" -gt 1 ]; then
  "$KANBAN_BIN" complete --summary "second run" >&2 || exit $?
  exit 0
fi
sleep 300 &
while true; do echo working; sleep 0.2; done"#,
            pids = pids.display()
        ),
    );
    let census = AgentCensus::start(&bench.db, "fenced-agent.sh", Duration::from_millis(5));
    let child = spawn_dispatch(&bench, &agent, &["--grace", "2"]);
    wait_for("the first agent", || pids.exists());
    std::thread::sleep(Duration::from_millis(500));
    let first_agent = pid_in(&pids);
    bench.ok(&["reclaim", &id]);
    wait_for("the second run to finish the card", || {
        bench.show(&id)["task"]["status"] == "done"
    });
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let output = finish_within(child, Duration::from_secs(20));
    let report = census.finish();
    assert!(dead(first_agent), "the reclaimed run's agent is gone");
    assert_eq!(
        report.overlaps,
        Vec::<String>::new(),
        "two runs of one card had live agents at once ({} samples): {:?}\n{}",
        report.samples,
        report.overlaps.first(),
        text(&output.stdout)
    );
    assert!(report.samples > 100, "the census watched: {report:?}");
    assert_eq!(outcomes(&bench, &id), ["reclaimed", "completed"]);
    assert_eq!(failures(&bench, &id), 0);
}

#[test]
fn a_dead_workers_agent_group_is_killed_by_the_dispatcher() {
    let bench = Bench::new();
    let id = bench.add("orphaned", &["--max-retries", "1"]);
    let pids = bench.path().join("pids");
    let agent = script(
        &bench,
        "long.sh",
        &format!("echo $$ >> '{}'\nsleep 300", pids.display()),
    );
    let child = spawn_dispatch(&bench, &agent, &["--until-idle"]);
    wait_for("the agent", || pids.exists());
    let worker = worker_pid(&bench, &id).unwrap();
    let agent_pid = pid_in(&pids);
    kill(Pid::from_raw(worker), Signal::SIGKILL).unwrap();
    let output = finish_within(child, Duration::from_secs(20));
    assert!(output.status.success(), "{}", text(&output.stderr));
    wait_for("the orphaned agent to be killed", || dead(agent_pid));
    assert_eq!(outcomes(&bench, &id), ["crashed"]);
}

// 3. Hung turns end.

#[test]
fn a_hung_turn_is_timed_out_counted_and_held_back_with_a_retry_time() {
    let bench = Bench::new();
    let id = bench.add("hung", &[]);
    let pids = bench.path().join("pids");
    let agent = script(
        &bench,
        "hung.sh",
        &format!("echo $$ >> '{}'\nsleep 300", pids.display()),
    );
    let started = Instant::now();
    let output = finish_within(
        spawn_dispatch(
            &bench,
            &agent,
            &[
                "--until-idle",
                "--turn-timeout",
                "1",
                "--retry-backoff",
                "10m",
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(dead(pid_in(&pids)), "the hung agent was killed");
    assert_eq!(outcomes(&bench, &id), ["timed_out"]);
    assert_eq!(failures(&bench, &id), 1, "counted");
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "ready");
    assert!(card["task"]["not_before"].as_i64().is_some(), "{card}");
    let listed = bench.ok(&["ls"]);
    assert!(listed.contains("retry at"), "{listed}");
    let shown = bench.ok(&["show", &id]);
    assert!(shown.contains("retry at"), "{shown}");
}

#[test]
fn a_run_past_its_max_runtime_is_timed_out_though_its_agent_keeps_talking() {
    let bench = Bench::new();
    let id = bench.add("chatty", &["--max-runtime", "2", "--max-retries", "1"]);
    let agent = script(
        &bench,
        "chatty.sh",
        "while true; do echo still going; sleep 0.1; done",
    );
    let output = finish_within(
        spawn_dispatch(&bench, &agent, &["--until-idle"]),
        Duration::from_secs(30),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(outcomes(&bench, &id), ["timed_out"]);
    assert_eq!(bench.show(&id)["task"]["status"], "blocked", "at its limit");
}

// 6. Shutdown honours the grace period.

#[test]
fn sigterm_to_dispatch_gives_the_agent_its_grace_and_exits_130() {
    let bench = Bench::new();
    let id = bench.add("graceful", &[]);
    let marker = bench.path().join("cleaned-up");
    let agent = script(
        &bench,
        "trapping.sh",
        &format!(
            "trap 'sleep 1; echo cleaned > \"{}\"; exit 0' TERM\nsleep 300 &\nwait",
            marker.display()
        ),
    );
    let child = spawn_dispatch(&bench, &agent, &["--grace", "5"]);
    wait_for("the worker", || worker_pid(&bench, &id).is_some());
    std::thread::sleep(Duration::from_millis(500));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let output = finish_within(child, Duration::from_secs(20));
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap_or_default().trim(),
        "cleaned",
        "the agent's one-second cleanup ran to its end"
    );
    assert_eq!(outcomes(&bench, &id), ["interrupted"]);
    assert_eq!(failures(&bench, &id), 0);
}

#[test]
fn the_first_ctrl_c_on_dispatch_exits_130() {
    let bench = Bench::new();
    let id = bench.add("interrupted", &[]);
    let agent = script(&bench, "sleepy.sh", "sleep 300");
    let child = spawn_dispatch(&bench, &agent, &[]);
    wait_for("the worker", || worker_pid(&bench, &id).is_some());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let output = finish_within(child, Duration::from_secs(20));
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    assert_eq!(bench.show(&id)["task"]["status"], "ready");
}

// 7. The worker's witness cannot be forged.

#[test]
fn an_agent_printing_a_trailer_cannot_change_how_its_workers_crash_is_booked() {
    let bench = Bench::new();
    let id = bench.add("forger", &["--max-retries", "3"]);
    let pids = bench.path().join("pids");
    let agent = script(
        &bench,
        "forger.sh",
        &format!(
            r#"echo $$ >> '{pids}'
echo '[kanban-worker-exit] rc=0'
echo '[kanban-worker-exit] rc=0' >&2
sleep 300"#,
            pids = pids.display()
        ),
    );
    let dispatcher = spawn_dispatch(&bench, &agent, &["--ttl", "2"]);
    wait_for("the agent", || pids.exists());
    std::thread::sleep(Duration::from_millis(300));
    let worker = worker_pid(&bench, &id).unwrap();
    // The dispatcher dies first, then the worker: only the log is left.
    kill(Pid::from_raw(dispatcher.id() as i32), Signal::SIGKILL).unwrap();
    finish_within(dispatcher, Duration::from_secs(5));
    kill(Pid::from_raw(worker), Signal::SIGKILL).unwrap();
    let _ = nix::sys::signal::killpg(Pid::from_raw(pid_in(&pids)), Signal::SIGKILL);
    let quick = script(
        &bench,
        "quick.sh",
        r#""$KANBAN_BIN" complete --summary done >&2 || exit $?"#,
    );
    bench.dispatch_until_idle(&quick, &["--ttl", "2", "--retry-backoff", "0"]);
    assert_eq!(outcomes(&bench, &id), ["crashed", "completed"]);
    let crashed = bench.event(&id, "crashed");
    assert_ne!(crashed["payload"]["exit_code"], 0, "{crashed}");
}

// 8. One claim, one lock.

#[test]
fn each_claim_has_its_own_lock_and_one_cards_agent_cannot_finish_another() {
    let bench = Bench::new();
    let first = bench.add("first", &[]);
    let second = bench.add("second", &[]);
    let carriers = bench.path().join("carriers");
    std::fs::create_dir(&carriers).unwrap();
    // Each agent leaves its carrier behind, waits for the other's, then
    // tries to complete the other card with its own lock.
    let agent = script(
        &bench,
        "swapper.sh",
        &format!(
            r#"dir='{carriers}'
printf '%s' "$HERMES_KANBAN_CLAIM_LOCK" > "$dir/$HERMES_KANBAN_TASK"
while [ "$(ls "$dir" | wc -l)" -lt 2 ]; do sleep 0.1; done
other=$(ls "$dir" | grep -v "^$HERMES_KANBAN_TASK$")
if HERMES_KANBAN_TASK=$other "$KANBAN_BIN" complete --summary "not mine" >&2; then
  echo stolen > "$dir/../stolen"
fi
"$KANBAN_BIN" complete --summary mine >&2 || exit $?"#,
            carriers = carriers.display()
        ),
    );
    let output = finish_within(
        spawn_dispatch(&bench, &agent, &["--until-idle", "--max-in-progress", "2"]),
        Duration::from_secs(60),
    );
    assert!(output.status.success(), "{}", text(&output.stderr));
    let lock = |id: &str| std::fs::read_to_string(carriers.join(id)).unwrap();
    assert_ne!(lock(&first), lock(&second));
    assert!(lock(&first).len() >= 32, "unguessable: {}", lock(&first));
    assert!(
        !bench.path().join("stolen").exists(),
        "a card was completed by another card's agent"
    );
    for id in [&first, &second] {
        let card = bench.show(id);
        assert_eq!(runs(&card)[0]["summary"], "mine", "{card}");
    }
}

// 9. Clock jumps.

const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

#[test]
fn a_two_hour_wall_clock_jump_stops_no_healthy_worker_and_counts_nothing() {
    assert!(
        Path::new(FAKETIME).exists(),
        "this test moves the wall clock with libfaketime: apt-get install libfaketime (CI does)"
    );
    let bench = Bench::new();
    let id = bench.add("through the jump", &[]);
    let offset = bench.path().join("faketime");
    std::fs::write(&offset, "+0\n").unwrap();
    let started = bench.path().join("started");
    // Works for six seconds, talking, then finishes the card.
    let agent = script(
        &bench,
        "steady.sh",
        &format!(
            r#"touch '{started}'
i=0
while [ $i -lt 30 ]; do echo "step $i"; sleep 0.2; i=$((i+1)); done
"$KANBAN_BIN" complete --summary "done across the jump" >&2 || exit $?"#,
            started = started.display()
        ),
    );
    // Every process, the agent's board calls too, sees the one wall clock
    // the file names; monotonic clocks keep running true.
    let child = bench
        .dispatch_command(&agent, &["--until-idle", "--ttl", "60"])
        .env("LD_PRELOAD", FAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", &offset)
        .env("FAKETIME_NO_CACHE", "1")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = child;
    wait_for("the agent", || {
        still_running(&mut child);
        started.exists()
    });
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&offset, "+2h\n").unwrap();
    let output = finish_within(child, Duration::from_secs(60));
    let said = format!("{}\n{}", text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{said}");
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done", "{said}\n{card}");
    assert_eq!(outcomes(&bench, &id), ["completed"], "{said}");
    assert_eq!(failures(&bench, &id), 0);
    assert!(!said.contains("stopping"), "nothing was stopped: {said}");
    // The jump really happened: the card finished two hours after it began.
    let run = &runs(&card)[0];
    let took = run["ended_at"].as_i64().unwrap() - run["started_at"].as_i64().unwrap();
    assert!(took >= 7200, "the board saw the jump: {run}");
}

// 10. A worker calls through its dispatcher, and outlives it.

/// An agent body that writes what its worker process holds open to
/// `fds`: it climbs from itself to the nearest `kanban` process.
fn list_workers_files(fds: &Path) -> String {
    format!(
        r#"p=$$
while [ "$p" -gt 1 ] && [ "$(cat /proc/$p/comm)" != kanban ]; do p=$(awk '{{print $4}}' /proc/$p/stat); done
ls -l /proc/$p/fd/ > '{fds}.part' && mv '{fds}.part' '{fds}'"#,
        fds = fds.display()
    )
}

#[test]
fn a_dispatched_worker_makes_its_board_calls_through_its_dispatcher() {
    let bench = Bench::new();
    let id = bench.add("linked", &[]);
    let (fds, daemon) = (bench.path().join("fds"), bench.path().join("daemon"));
    let agent = script(
        &bench,
        "linked.sh",
        &format!(
            "{}\n( setsid sleep 300 > /dev/null 2>&1 & echo $! > '{}' )\n\"$KANBAN_BIN\" complete --summary done >&2 || exit $?",
            list_workers_files(&fds),
            daemon.display()
        ),
    );
    let output = bench
        .dispatch_command(&agent, &["--until-idle"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    let held = std::fs::read_to_string(&fds).unwrap();
    let pid = pid_in(&daemon);
    let survived = !dead(pid);
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    assert!(!survived, "the agent's daemon outlived its run");
    let log = std::fs::read_to_string(bench.path().join(format!("logs/{id}.log"))).unwrap();
    let trailer = log
        .lines()
        .rev()
        .find(|line| line.starts_with("[kanban-worker-end]"))
        .unwrap();
    assert!(
        trailer.ends_with(" alone"),
        "the worker ended it, not the dispatcher's sweep: {trailer}"
    );
    let board = bench.db.display().to_string();
    assert!(
        held.contains("socket:"),
        "the link to its dispatcher: {held}"
    );
    assert!(
        !held.contains(&board),
        "the worker never opened the board itself: {held}"
    );
}

#[test]
fn a_worker_whose_dispatcher_died_finishes_its_card_on_the_board_itself() {
    let bench = Bench::new();
    let id = bench.add("orphaned", &[]);
    let (pids, go) = (bench.path().join("pids"), bench.path().join("go"));
    let agent = script(
        &bench,
        "patient.sh",
        &format!(
            r#"echo $$ > '{pids}'
while [ ! -e '{go}' ]; do sleep 0.05; done
"$KANBAN_BIN" complete --summary "done without its dispatcher" >&2 || exit $?"#,
            pids = pids.display(),
            go = go.display()
        ),
    );
    let dispatcher = spawn_dispatch(&bench, &agent, &[]);
    wait_for("the agent", || pids.exists());
    let worker = worker_pid(&bench, &id).unwrap();
    kill(Pid::from_raw(dispatcher.id() as i32), Signal::SIGKILL).unwrap();
    finish_within(dispatcher, Duration::from_secs(5));
    std::fs::write(&go, "").unwrap();
    wait_for("the worker to end", || dead(worker));
    let card = bench.show(&id);
    assert_eq!(card["task"]["status"], "done", "{card}");
    assert_eq!(
        runs(&card)[0]["summary"],
        "done without its dispatcher",
        "{card}"
    );
    assert_eq!(bench.event(&id, "worker_result")["payload"]["exit_code"], 0);
}

#[test]
fn a_worker_ends_what_its_agent_left_running_before_it_exits() {
    let bench = Bench::new();
    let id = bench.add("leaves a daemon", &[]);
    let carrier = bench.claim(&id, None);
    let (daemon, sidecar) = (bench.path().join("daemon"), bench.path().join("sidecar"));
    // A daemon the usual way: a subshell that starts it in a session of its
    // own and leaves, so that neither the agent's group nor its parent is
    // there any more to end it.
    let agent = script(
        &bench,
        "daemon.sh",
        &format!(
            r#"( setsid sleep 300 > /dev/null 2>&1 & echo $! > '{daemon}' )
"$KANBAN_BIN" complete --summary done >&2 || exit $?
echo '{{"completed": true}}'"#,
            daemon = daemon.display()
        ),
    );
    // The worker is exec'd by a wrapper that left a sidecar running: a
    // child of the worker from before it started, not of its run.
    let template = bench.command();
    let mut wrapped = std::process::Command::new("sh");
    for (name, value) in template.get_envs() {
        match value {
            Some(value) => wrapped.env(name, value),
            None => wrapped.env_remove(name),
        };
    }
    wrapped
        .envs(carrier.iter().map(|(k, v)| (k, v)))
        .arg("-c")
        .arg(format!(
            r#"sleep 300 > /dev/null 2>&1 & echo $! > '{sidecar}'; exec "$0" worker --agent '{agent}' --recovery-delays 0"#,
            sidecar = sidecar.display(),
            agent = agent.display()
        ))
        .arg(crate::BIN);
    let output = wrapped.output().unwrap();
    let (pid, sidecar) = (pid_in(&daemon), pid_in(&sidecar));
    let (survived, sidecar_lived) = (!dead(pid), !dead(sidecar));
    for pid in [pid, sidecar] {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(!survived, "the daemon outlived its worker");
    assert!(
        sidecar_lived,
        "the worker killed a process that was not its run's"
    );
    let stderr = text(&output.stderr);
    let detail = stderr
        .lines()
        .rev()
        .find(|line| line.starts_with("[kanban-worker-end]"))
        .unwrap_or_default();
    assert!(detail.ends_with(" alone"), "{stderr}");
}

#[test]
fn an_agent_that_kills_its_worker_cannot_spare_its_daemon_or_halt_its_dispatcher_with_a_forged_trailer()
 {
    let bench = Bench::new();
    let id = bench.add("forges alone", &[]);
    let daemon = bench.path().join("daemon");
    // The agent looks for its worker's seal where a process of the same
    // user could read it (the worker's environment, which holds none),
    // prints a trailer with it saying nothing is left and the setup is
    // broken, leaves a daemon and kills its worker.
    let agent = script(
        &bench,
        "forger.sh",
        &format!(
            r#"p=$$
while [ "$p" -gt 1 ] && [ "$(cat /proc/$p/comm)" != kanban ]; do p=$(awk '{{print $4}}' /proc/$p/stat); done
seal=$(tr '\0' '\n' < /proc/$p/environ | sed -n 's/^KANBAN_WORKER_SEAL=//p')
( setsid sleep 300 > /dev/null 2>&1 & echo $! > '{daemon}.part' && mv '{daemon}.part' '{daemon}' )
echo "[kanban-worker-exit] rc=0 seal=$seal alone fault=config:forged" >&2
sleep 0.5
kill -9 $p
sleep 300"#,
            daemon = daemon.display()
        ),
    );
    let mut dispatcher = spawn_dispatch(&bench, &agent, &[]);
    wait_for("the daemon", || daemon.exists());
    wait_for("the crash to be booked", || {
        outcomes(&bench, &id)
            .first()
            .is_some_and(|o| o == "crashed")
    });
    let pid = pid_in(&daemon);
    let mut gone = false;
    for _ in 0..100 {
        gone = dead(pid);
        if gone {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    still_running(&mut dispatcher);
    let _ = dispatcher.kill();
    let _ = dispatcher.wait();
    assert!(gone, "the daemon outlived its run");
}
