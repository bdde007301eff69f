//! Pickup latency and idle CPU of a dispatcher on its default 60 s interval.
//!
//! Pickup: the time from `kanban add` returning to the agent of that card
//! starting, for cards added one at a time while the dispatcher waits
//! between ticks. The floor, in the same run: the same process chain with no
//! board and no waiting (`kanban turn` starting the same agent), so the
//! ratio is what watching the board costs over spawning at once. Idle CPU:
//! the dispatcher's user + system time over ten idle seconds, against the
//! 1% bound.
//!
//! `cargo bench -p kanban-cli --bench pickup` (`KANBAN_BENCH_PICKUPS=N`).

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
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const KANBAN: &str = env!("CARGO_BIN_EXE_kanban");

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn write_agent(path: &Path, stamps: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        format!(
            "#!/bin/sh\ndate +%s%N >> '{}'\ncat > /dev/null\n[ -n \"$HERMES_KANBAN_TASK\" ] && \"$KANBAN_BIN\" complete --summary done\necho '{{\"completed\": true}}'\n",
            stamps.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn stamps(path: &Path) -> Vec<u128> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

fn wait_for_stamps(path: &Path, count: usize) -> Vec<u128> {
    let started = Instant::now();
    loop {
        let seen = stamps(path);
        if seen.len() >= count {
            return seen;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the agent never started"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at ") ".
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line (11, 12 here).
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn main() {
    let rounds: usize = std::env::var("KANBAN_BENCH_PICKUPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("kanban.db");
    let agent = dir.path().join("agent.sh");
    let stamp_file = dir.path().join("stamps");
    write_agent(&agent, &stamp_file);
    let kanban = || {
        let mut command = Command::new(KANBAN);
        command.arg("--db").arg(&db);
        command
    };
    assert!(kanban().arg("init").status().unwrap().success());

    // The floor: the same agent started by `kanban turn`, no board.
    let floor_stamps = dir.path().join("floor-stamps");
    write_agent(&agent, &floor_stamps);
    let mut floor = Vec::new();
    for n in 0..rounds {
        let started = now_ns();
        let status = Command::new(KANBAN)
            .args(["turn", "--agent"])
            .arg(&agent)
            .arg("hello")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        let seen = wait_for_stamps(&floor_stamps, n + 1);
        floor.push((seen[n] - started) as f64 / 1e6);
    }
    write_agent(&agent, &stamp_file);

    let mut dispatcher = kanban()
        .args(["dispatch", "--agent"])
        .arg(&agent)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let ticks_before = cpu_ticks(dispatcher.id());
    std::thread::sleep(Duration::from_secs(10));
    let ticks_after = cpu_ticks(dispatcher.id());
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let idle_cpu = (ticks_after - ticks_before) as f64 / hz / 10.0 * 100.0;

    let mut pickup = Vec::new();
    for n in 0..rounds {
        let output = kanban()
            .args(["add", &format!("card {n}")])
            .output()
            .unwrap();
        let added = now_ns();
        assert!(output.status.success());
        let seen = wait_for_stamps(&stamp_file, n + 1);
        pickup.push((seen[n].saturating_sub(added)) as f64 / 1e6);
        // Let the card finish so each pickup starts from an idle wait.
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dispatcher.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = dispatcher.wait();

    floor.sort_by(f64::total_cmp);
    pickup.sort_by(f64::total_cmp);
    let (f50, f99) = (percentile(&floor, 0.5), percentile(&floor, 0.99));
    let (p50, p99) = (percentile(&pickup, 0.5), percentile(&pickup, 0.99));
    println!(
        "pickup ({rounds} cards, --interval 60 s): p50 {p50:.1} ms, p99 {p99:.1} ms; floor (kanban turn, no board) p50 {f50:.1} ms, p99 {f99:.1} ms; ratio p50 {:.2}x",
        p50 / f50
    );
    println!("idle dispatcher CPU: {idle_cpu:.2}% over 10 s (bound 1%)");
}
