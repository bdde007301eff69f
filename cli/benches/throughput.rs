//! Dispatch throughput against the cost of the processes themselves.
//!
//! The measured run: `kanban dispatch --until-idle` on N ready cards, 8 in
//! flight, with an agent that makes its one board call (`kanban complete`)
//! and answers. The floor, in the same run: the same process tree per card
//! with no board at all, 8 at a time: `kanban turn` (the worker's binary
//! starting and running one agent turn), the agent (`sh`), and the agent's
//! one call of the binary (`kanban --version`). Prints both rates and their
//! ratio.
//!
//! `cargo bench -p kanban-cli --bench throughput` (`KANBAN_BENCH_CARDS=200,2000`
//! picks the sizes, `KANBAN_BENCH_ROUNDS=5` how many pairs of the two run,
//! one right after the other, in alternating order).
//!
//! The ratio is the median of the pairs' own ratios. This machine's speed
//! moves by a third within a minute: two single pairs of 300 cards, run a
//! minute apart, gave 0.80x and 0.64x, and a ratio of the two best rounds,
//! taken minutes apart, mostly measures that drift. A pair's two runs share the
//! machine's speed of that moment; the median of several pairs is what the
//! target is read against, and the pairs' range is printed beside it.

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const KANBAN: &str = env!("CARGO_BIN_EXE_kanban");
const IN_FLIGHT: usize = 8;

fn write_agent(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\ncat > /dev/null\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn kanban(db: &Path) -> Command {
    let mut command = Command::new(KANBAN);
    command.arg("--db").arg(db);
    command
}

/// How many workers ran, on average, between the first spawn and the last
/// booking, from the dispatcher's progress lines (`HH:MM:SS.mmm CARD
/// "TITLE" spawned worker ...` and `... worker exited ...`, printed as each worker
/// is spawned and as its exit is booked): the part of the 8 slots a
/// dispatch keeps busy. The floor refills a slot within a millisecond.
fn slots_busy(progress: &str) -> f64 {
    let mut events: Vec<(f64, i32)> = Vec::new();
    for line in progress.lines() {
        let Some(clock) = line.split_whitespace().next() else {
            continue;
        };
        let step = if line.contains(" spawned worker ") {
            1
        } else if line.contains(" worker exited ") {
            -1
        } else {
            continue;
        };
        let parts: Vec<f64> = clock.split(':').filter_map(|p| p.parse().ok()).collect();
        let [h, m, sec] = parts[..] else { continue };
        let mut at = h * 3600.0 + m * 60.0 + sec;
        // Past midnight: the clock starts again.
        if let Some(&(last, _)) = events.last()
            && at < last
        {
            at += 86_400.0;
        }
        events.push((at, step));
    }
    let (Some(&(first, _)), Some(&(last, _))) = (events.first(), events.last()) else {
        return 0.0;
    };
    let (mut running, mut busy, mut since) = (0_i32, 0.0, first);
    for (at, step) in events {
        busy += f64::from(running) * (at - since);
        since = at;
        running += step;
    }
    if last > first {
        busy / (last - first)
    } else {
        0.0
    }
}

/// N cards dispatched to the end; returns the wall time and the slots busy.
fn dispatch(dir: &Path, cards: usize) -> (Duration, f64) {
    let db = dir.join(format!("board-{cards}.db"));
    assert!(kanban(&db).arg("init").output().unwrap().status.success());
    // Cards are added in one transaction: adding is not under test.
    kanban_testkit::bulk_add_cards(
        &db,
        cards as u64,
        kanban_testkit::BulkLanes::AllReady,
        1_700_000_000,
    );
    let agent = dir.join("finish.sh");
    write_agent(
        &agent,
        "\"$KANBAN_BIN\" complete --summary done || exit $?\necho '{\"completed\": true}'",
    );
    let started = Instant::now();
    let output = kanban(&db)
        .args([
            "dispatch",
            "--until-idle",
            "--interval",
            "1",
            "--max-in-progress",
            &IN_FLIGHT.to_string(),
            "--agent",
        ])
        .arg(&agent)
        .env("HERMES_KANBAN_STOP_NUDGE", "0")
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let done: i64 = conn
        .query_row(
            "SELECT count(*) FROM tasks WHERE status = 'done'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(done as usize, cards, "every card done");
    (
        elapsed,
        slots_busy(&String::from_utf8_lossy(&output.stdout)),
    )
}

/// The same process tree per card with no board, 8 at a time.
fn floor(dir: &Path, cards: usize) -> Duration {
    let agent = dir.join("floor.sh");
    write_agent(
        &agent,
        &format!("'{KANBAN}' --version > /dev/null\necho '{{\"completed\": true}}'"),
    );
    let spawn = || -> Child {
        Command::new(KANBAN)
            .args(["turn", "--agent"])
            .arg(&agent)
            .arg("do the card")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let started = Instant::now();
    let mut running: Vec<Child> = Vec::new();
    let mut left = cards;
    while left > 0 || !running.is_empty() {
        while left > 0 && running.len() < IN_FLIGHT {
            running.push(spawn());
            left -= 1;
        }
        // Reap whichever finished, at once.
        let mut still = Vec::with_capacity(running.len());
        for mut child in running {
            match child.try_wait().unwrap() {
                Some(status) => assert!(status.success()),
                None => still.push(child),
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(1));
    }
    started.elapsed()
}

fn main() {
    let sizes: Vec<usize> = std::env::var("KANBAN_BENCH_CARDS")
        .ok()
        .map(|raw| {
            raw.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![200, 2_000]);
    // Pairs, not best rounds: see the module's comment.
    let rounds: usize = std::env::var("KANBAN_BENCH_ROUNDS")
        .ok()
        .and_then(|raw| raw.trim().parse().ok())
        .filter(|rounds| *rounds > 0)
        .unwrap_or(5);
    // Every round's folder stays until the last size is done: ext4 without
    // a journal passes over inodes freed within the last minutes when it
    // gives out new ones, so deleting a round's log files just before the
    // next round (or size) made each new log file's creation scan past
    // them (a quarter of the dispatcher's CPU in a profile), a cost of this
    // benchmark's cleanup, not of dispatching.
    let mut folders = Vec::new();
    for cards in sizes {
        let (mut base, mut measured, mut busy) = (Duration::MAX, Duration::MAX, 0.0);
        let mut pairs: Vec<f64> = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let dir = tempfile::tempdir().unwrap();
            // Which of the two runs first alternates, so that a machine
            // speeding up or slowing down favours neither.
            let (floor_time, (time, slots)) = if round.is_multiple_of(2) {
                let floor_time = floor(dir.path(), cards);
                (floor_time, dispatch(dir.path(), cards))
            } else {
                let measured = dispatch(dir.path(), cards);
                (floor(dir.path(), cards), measured)
            };
            // The dispatch's rate over the floor's: the floor's time over
            // the dispatch's.
            pairs.push(floor_time.as_secs_f64() / time.as_secs_f64());
            base = base.min(floor_time);
            if time < measured {
                (measured, busy) = (time, slots);
            }
            folders.push(dir);
        }
        pairs.sort_by(f64::total_cmp);
        let middle = pairs.len() / 2;
        let median = if pairs.len().is_multiple_of(2) {
            f64::midpoint(pairs[middle - 1], pairs[middle])
        } else {
            pairs[middle]
        };
        let rate = |time: Duration| cards as f64 / time.as_secs_f64();
        println!(
            "{cards:>5} cards, {IN_FLIGHT} in flight: dispatch {:>7.1} cards/s ({:.2} s)   floor (same processes, no board) {:>7.1} cards/s ({:.2} s)   (each the best of {rounds})",
            rate(measured),
            measured.as_secs_f64(),
            rate(base),
            base.as_secs_f64(),
        );
        println!(
            "{cards:>5} cards: ratio {median:.2}x, the median of {rounds} pairs run back to back (the pairs {:.2}x to {:.2}x)   (target >= 0.70x)",
            pairs[0],
            pairs[pairs.len() - 1]
        );
        println!(
            "{cards:>5} cards: workers running between spawn and booking, on average {busy:.2} of {IN_FLIGHT} (the fastest round)"
        );
    }
}
