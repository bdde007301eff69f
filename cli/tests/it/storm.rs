//! Storms and kills: many cards, real worker processes, two dispatchers, and
//! agents that succeed, fail retryably, hit quota walls, exit without a
//! terminal call, hang past their lease or crash. The invariants are checked
//! from the board alone.
//!
//! CI runs a bounded size; `KANBAN_STORM_CARDS=N` runs a larger one.

use std::io::Read;
use std::process::{Child, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kanban_testkit::{AgentCensus, BoardFigures, check_board_invariants, write_executable};

use crate::{Bench, text};

fn storm_cards() -> usize {
    std::env::var("KANBAN_STORM_CARDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// An agent whose behaviour is chosen by a hash of the card id; cards that
/// fail "once" remember it in a marker file and succeed on their next run.
fn storm_agent(bench: &Bench) -> std::path::PathBuf {
    let markers = bench.path().join("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let path = bench.path().join("storm-agent.sh");
    write_executable(
        &path,
        &format!(
            r#"#!/bin/sh
cat > /dev/null
marker='{markers}'/"$HERMES_KANBAN_TASK"
kind=$(( $(printf '%s' "$HERMES_KANBAN_TASK" | cksum | cut -d' ' -f1) % 10 ))
finish() {{ "$KANBAN_BIN" complete --summary "storm card done" >&2 || exit 1; echo '{{"completed": true, "final_response": "done"}}'; exit 0; }}
once() {{ if [ -e "$marker" ]; then finish; fi; touch "$marker"; }}
case $kind in
  5) if [ "$KANBAN_TURN" = 1 ]; then echo '{{"failed": true, "failure_retryable": true, "failure_reason": "timeout", "error": "stream reset"}}'; exit 0; fi; finish ;;
  6) once; echo '{{"failed": true, "failure_retryable": true, "failure_reason": "rate_limit", "error": "429"}}'; exit 0 ;;
  7) once; echo '{{"completed": true, "final_response": "prose only"}}'; exit 0 ;;
  8) sleep 3; finish ;;
  9) once; exit 3 ;;
  *) finish ;;
esac
"#,
            markers = markers.display()
        ),
    );
    path
}

/// A dispatcher whose output is drained as it comes: a chatty dispatcher
/// must never block on a full pipe while the test waits on another one.
struct Running {
    child: Child,
    stdout: JoinHandle<Vec<u8>>,
    stderr: JoinHandle<Vec<u8>>,
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

impl Running {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
    }

    fn finish(mut self) -> Output {
        let status = self.child.wait().unwrap();
        Output {
            status,
            stdout: self.stdout.join().unwrap(),
            stderr: self.stderr.join().unwrap(),
        }
    }
}

fn dispatcher(bench: &Bench, agent: &std::path::Path, until_idle: bool) -> Running {
    let mut command = bench.command();
    command
        .arg("--db")
        .arg(&bench.db)
        .args([
            "dispatch",
            "--interval",
            "0.2",
            "--max-in-progress",
            "6",
            "--ttl",
            "2",
            "--rate-limit-cooldown",
            "1",
            "--recovery-delays",
            "0",
            // Counted failures are retried at once, so the drain ends every
            // card done or blocked rather than waiting out a backoff.
            "--retry-backoff",
            "0",
            // One agent serves every card, so a 429 walls them all; a probe
            // goes through at once, which keeps the storm flowing.
            "--max-wall",
            "0",
            "--agent",
        ])
        .arg(agent)
        .env("HERMES_KANBAN_STOP_NUDGE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if until_idle {
        command.arg("--until-idle");
    }
    let mut child = command.spawn().unwrap();
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    Running {
        child,
        stdout,
        stderr,
    }
}

fn no_busy_errors(bench: &Bench, outputs: &[String]) {
    let mut texts: Vec<String> = outputs.to_vec();
    if let Ok(entries) = std::fs::read_dir(bench.path().join("logs")) {
        for entry in entries.flatten() {
            texts.push(std::fs::read_to_string(entry.path()).unwrap_or_default());
        }
    }
    for text in texts {
        let lower = text.to_lowercase();
        assert!(
            !lower.contains("database is locked") && !lower.contains("stayed busy"),
            "a busy error reached a user:\n{text}"
        );
    }
}

fn report(name: &str, figures: &BoardFigures, elapsed: Duration, extra: &str) {
    println!(
        "{name}: {} cards, {} runs, {:?} statuses, {:?} outcomes, {} bookings, {} stale writes rejected{extra}, {:.1} s",
        figures.cards,
        figures.runs,
        figures.statuses,
        figures.outcomes,
        figures.bookings,
        figures.stale_writes_rejected,
        elapsed.as_secs_f64()
    );
}

fn add_cards(bench: &Bench, cards: usize) {
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["add", "storm card"])
        .output()
        .unwrap();
    assert!(output.status.success());
    // The rest in one go, through a shell loop: adding is not under test.
    let script = format!(
        "i=1; while [ $i -lt {cards} ]; do '{}' --db '{}' add \"storm card $i\" > /dev/null || exit 1; i=$((i+1)); done",
        crate::BIN,
        bench.db.display()
    );
    assert!(
        std::process::Command::new("sh")
            .args(["-c", &script])
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn storm_two_dispatchers_many_workers_invariants_hold() {
    let started = Instant::now();
    let bench = Bench::new();
    let cards = storm_cards();
    add_cards(&bench, cards);
    let agent = storm_agent(&bench);
    let first = dispatcher(&bench, &agent, true);
    let second = dispatcher(&bench, &agent, true);
    let outputs: Vec<_> = [first, second].into_iter().map(Running::finish).collect();
    for output in &outputs {
        assert!(
            output.status.success(),
            "{}\n{}",
            text(&output.stdout),
            text(&output.stderr)
        );
    }
    let said: Vec<String> = outputs
        .iter()
        .flat_map(|o| [text(&o.stdout), text(&o.stderr)])
        .collect();
    no_busy_errors(&bench, &said);
    let figures = check_board_invariants(&bench.db)
        .unwrap_or_else(|problems| panic!("invariants broken:\n{}", problems.join("\n")));
    assert_eq!(figures.cards, cards, "nothing lost");
    let settled = figures.statuses.get("done").copied().unwrap_or(0)
        + figures.statuses.get("blocked").copied().unwrap_or(0);
    let cooling = figures.statuses.get("ready").copied().unwrap_or(0);
    assert_eq!(
        settled + cooling,
        cards,
        "every card is final or requeued: {:?}",
        figures.statuses
    );
    assert_eq!(
        figures.statuses.get("running"),
        None,
        "nothing left running"
    );
    assert!(
        figures.outcomes.get("completed").copied().unwrap_or(0) >= cards / 2,
        "{figures:?}"
    );
    report("storm", &figures, started.elapsed(), "");
}

/// A small, seeded pseudo-random sequence (the test needs no crate for it).
struct Chaos(u64);

impl Chaos {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

fn running_worker_pids(bench: &Bench) -> Vec<i32> {
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["ls", "--status", "running", "--json"])
        .output()
        .unwrap();
    let listed: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    listed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["worker_pid"].as_i64())
        .map(|p| p as i32)
        .collect()
}

#[test]
fn kill_chaos_workers_and_dispatchers_killed_at_random_invariants_hold() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let started = Instant::now();
    let bench = Bench::new();
    let cards = storm_cards();
    add_cards(&bench, cards);
    let agent = storm_agent(&bench);
    let seed = std::env::var("KANBAN_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_u64);
    println!("chaos seed {seed} (KANBAN_CHAOS_SEED reproduces it)");
    let mut chaos = Chaos(seed);
    // Two runs of one card must never have live agents at once, whatever dies.
    let census = AgentCensus::start(&bench.db, "storm-agent.sh", Duration::from_millis(10));
    let mut dispatcher_child = dispatcher(&bench, &agent, false);
    let (mut worker_kills, mut dispatcher_kills) = (0, 0);
    let mut outputs = Vec::new();
    let chaos_for = Duration::from_secs(
        std::env::var("KANBAN_CHAOS_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
    );
    while started.elapsed() < chaos_for {
        std::thread::sleep(Duration::from_millis(150 + chaos.next(300) as u64));
        if chaos.next(4) == 0 {
            dispatcher_child.kill();
            outputs.push(dispatcher_child.finish());
            dispatcher_kills += 1;
            dispatcher_child = dispatcher(&bench, &agent, false);
        } else {
            let pids = running_worker_pids(&bench);
            if !pids.is_empty() {
                let pid = pids[chaos.next(pids.len())];
                if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                    worker_kills += 1;
                }
            }
        }
    }
    // The chaos stops: the running dispatcher finishes gracefully, then one
    // more drains the board.
    kill(Pid::from_raw(dispatcher_child.pid()), Signal::SIGTERM).unwrap();
    outputs.push(dispatcher_child.finish());
    let drained = dispatcher(&bench, &agent, true).finish();
    assert!(
        drained.status.success(),
        "{}\n{}",
        text(&drained.stdout),
        text(&drained.stderr)
    );
    outputs.push(drained);
    let census = census.finish();
    assert_eq!(
        census.overlaps,
        Vec::<String>::new(),
        "two runs of one card had live agents at once"
    );
    let said: Vec<String> = outputs
        .iter()
        .flat_map(|o| [text(&o.stdout), text(&o.stderr)])
        .collect();
    no_busy_errors(&bench, &said);
    let figures = check_board_invariants(&bench.db)
        .unwrap_or_else(|problems| panic!("invariants broken:\n{}", problems.join("\n")));
    assert_eq!(figures.cards, cards, "nothing lost");
    for (status, count) in &figures.statuses {
        assert!(
            matches!(status.as_str(), "done" | "blocked" | "ready"),
            "{count} card(s) left {status}"
        );
    }
    assert!(
        worker_kills + dispatcher_kills > 0,
        "the chaos did something"
    );
    report(
        "kill",
        &figures,
        started.elapsed(),
        &format!(
            ", {worker_kills} workers and {dispatcher_kills} dispatchers SIGKILLed, {} overlapping agents in {} census samples (peak {} agents)",
            census.overlaps.len(),
            census.samples,
            census.peak_agents
        ),
    );
}
