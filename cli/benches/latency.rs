//! Start and end latency of one run, measured on the dispatcher's own lines
//! (stamped to the millisecond) and the agent's clock.
//!
//! - spawn → the agent's first byte of input: from the dispatcher's
//!   `spawned worker` line to the agent reading its turn request;
//! - the agent's exit → the run booked: from the agent's last instant to the
//!   dispatcher's `worker exited` line (written once the booking committed).
//!
//! One card at a time, so each measures a quiet machine; p50 and p99 against
//! the 20 ms bound, and the floor of the same agent started with no board
//! (`kanban turn`), in the same run.
//!
//! `cargo bench -p kanban-cli --bench latency` (`KANBAN_BENCH_RUNS=N`).

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
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

const KANBAN: &str = env!("CARGO_BIN_EXE_kanban");

fn write_agent(path: &Path, stamps: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        format!(
            "#!/bin/sh\nhead -c 1 > /dev/null\necho \"in $HERMES_KANBAN_TASK $(date +%s%N)\" >> '{s}'\ncat > /dev/null\n[ -n \"$HERMES_KANBAN_TASK\" ] && \"$KANBAN_BIN\" complete --summary done\necho '{{\"completed\": true}}'\necho \"out $HERMES_KANBAN_TASK $(date +%s%N)\" >> '{s}'\n",
            s = stamps.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Milliseconds since midnight UTC of an `HH:MM:SS.mmm` stamp.
fn millis_of_day(stamp: &str) -> Option<f64> {
    let (hms, ms) = stamp.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<f64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60.0 + m) * 60.0 + s) * 1000.0 + ms.parse::<f64>().ok()?)
}

fn day_millis(epoch_ns: u128) -> f64 {
    (epoch_ns % (86_400 * 1_000_000_000)) as f64 / 1e6
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let runs: usize = std::env::var("KANBAN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kanban.db");
    let agent = dir.path().join("agent.sh");
    let stamps = dir.path().join("stamps");
    write_agent(&agent, &stamps);
    let kanban = || {
        let mut command = Command::new(KANBAN);
        command.arg("--db").arg(&db);
        command
    };
    assert!(kanban().arg("init").output().unwrap().status.success());
    for n in 0..runs {
        assert!(
            kanban()
                .args(["add", &format!("card {n}")])
                .output()
                .unwrap()
                .status
                .success()
        );
    }
    let output = kanban()
        .args([
            "dispatch",
            "--until-idle",
            "--max-in-progress",
            "1",
            "--agent",
        ])
        .arg(&agent)
        .stderr(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success());
    let said = String::from_utf8_lossy(&output.stdout).into_owned();
    let agent_says = std::fs::read_to_string(&stamps).unwrap();
    let stamp = |kind: &str, task: &str| -> Option<f64> {
        agent_says.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next()? == kind && words.next()? == task)
                .then(|| words.next()?.parse::<u128>().ok().map(day_millis))
                .flatten()
        })
    };
    let (mut start, mut end) = (Vec::new(), Vec::new());
    for line in said.lines() {
        let mut words = line.split_whitespace();
        let (Some(time), Some(task)) = (words.next(), words.next()) else {
            continue;
        };
        let Some(at) = millis_of_day(time) else {
            continue;
        };
        // The card's title, in quotes, comes between its id and the rest.
        if line.contains(" spawned worker ")
            && let Some(first_byte) = stamp("in", task)
        {
            start.push(first_byte - at);
        } else if line.contains(" worker exited ")
            && let Some(agent_exit) = stamp("out", task)
        {
            end.push(at - agent_exit);
        }
    }
    assert_eq!(start.len(), runs, "{said}");
    assert_eq!(end.len(), runs, "{said}");

    // The floor: `kanban turn` starting the same agent, no board: from the
    // command's start to the agent's first byte.
    let floor_stamps = dir.path().join("floor-stamps");
    write_agent(&agent, &floor_stamps);
    let mut floor = Vec::new();
    for _ in 0..runs {
        let _ = std::fs::remove_file(&floor_stamps);
        let began = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let status = Command::new(KANBAN)
            .args(["turn", "--agent"])
            .arg(&agent)
            .arg("hello")
            .env_remove("HERMES_KANBAN_TASK")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let text = std::fs::read_to_string(&floor_stamps).unwrap();
        let first: u128 = text
            .lines()
            .find_map(|line| {
                line.strip_prefix("in  ")
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap();
        floor.push((first - began) as f64 / 1e6);
    }
    println!(
        "spawn -> agent's first byte ({runs} runs): p50 {:.1} ms, p99 {:.1} ms (bound 20 ms); floor (kanban turn, no board) p50 {:.1} ms",
        percentile(&mut start, 0.5),
        percentile(&mut start, 0.99),
        percentile(&mut floor, 0.5)
    );
    println!(
        "agent's exit -> run booked ({runs} runs): p50 {:.1} ms, p99 {:.1} ms (bound 20 ms)",
        percentile(&mut end, 0.5),
        percentile(&mut end, 0.99)
    );
}
