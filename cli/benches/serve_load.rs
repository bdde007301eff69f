//! `kanban serve` under load, and its memory.
//!
//! Load: a board of 100k cards (half done), four client threads on
//! loopback, each asking in turn for the board page, a card through the API
//! and the metrics; requests per second and p99 latency of each, against a
//! floor measured in the same run: the server's static `/openapi.json`
//! (the same server, no board work). Memory: the server's VmHWM after
//! serving the board page, the metrics, 50 pages of the card listing and
//! 30 clients that ask for its biggest page and never read it, on a
//! 1M-card board, against its 64 MiB bound. On that board too, from a warm
//! server: the p99 latency of the board page and of filtered views
//! against their 100 ms bound, and of a move between lanes (what a drop
//! waits for) against its 200 ms bound.
//!
//! `cargo bench -p kanban-cli --bench serve_load` (`KANBAN_BENCH_CARDS=N`
//! sizes the load board, `KANBAN_BENCH_MEMORY_CARDS=N` the memory board).

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
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const KANBAN: &str = env!("CARGO_BIN_EXE_kanban");
const CLIENTS: usize = 4;
const REQUESTS: usize = 200;

fn cards_from(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn board(dir: &Path, name: &str, cards: u64) -> std::path::PathBuf {
    let db = dir.join(name);
    assert!(
        Command::new(KANBAN)
            .arg("--db")
            .arg(&db)
            .arg("init")
            .output()
            .unwrap()
            .status
            .success()
    );
    kanban_testkit::bulk_add_cards(
        &db,
        cards,
        kanban_testkit::BulkLanes::HalfDone,
        1_700_000_000,
    );
    db
}

fn serve(db: &Path) -> (Child, String) {
    let mut command = Command::new(KANBAN);
    command
        .arg("--db")
        .arg(db)
        .args(["serve", "--listen", "127.0.0.1:0"]);
    kanban_testkit::start_server(command)
}

/// `CLIENTS` threads asking for `url` `REQUESTS` times each: requests per
/// second and the p99 latency in milliseconds.
fn load(url: &str) -> (f64, f64) {
    let started = Instant::now();
    let threads: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let url = url.to_owned();
            std::thread::spawn(move || {
                let agent = ureq::Agent::new_with_config(
                    ureq::config::Config::builder()
                        .timeout_global(Some(Duration::from_secs(30)))
                        .build(),
                );
                let mut latencies = Vec::with_capacity(REQUESTS);
                for _ in 0..REQUESTS {
                    let began = Instant::now();
                    let mut response = agent.get(&url).call().unwrap();
                    let _ = response.body_mut().read_to_vec().unwrap();
                    latencies.push(began.elapsed().as_secs_f64() * 1000.0);
                }
                latencies
            })
        })
        .collect();
    let mut all: Vec<f64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let p99 = all[((all.len() as f64 - 1.0) * 0.99).round() as usize];
    (all.len() as f64 / elapsed, p99)
}

fn vm_hwm_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let cards = cards_from("KANBAN_BENCH_CARDS", 100_000);
    let db = board(dir.path(), "load.db", cards);
    let (mut server, url) = serve(&db);
    let listed: serde_json::Value = serde_json::from_str(
        &String::from_utf8(
            Command::new(KANBAN)
                .arg("--db")
                .arg(&db)
                .args(["ls", "--status", "ready", "--json"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap(),
    )
    .unwrap();
    let card = listed[0]["id"].as_str().unwrap().to_owned();
    let (floor_rate, floor_p99) = load(&format!("{url}/openapi.json"));
    println!(
        "serve, {cards} cards, {CLIENTS} clients on loopback; floor (static /openapi.json): {floor_rate:.0} req/s, p99 {floor_p99:.1} ms"
    );
    for (what, path) in [
        ("board page /", "/".to_owned()),
        ("API card /api/cards/ID", format!("/api/cards/{card}")),
        ("metrics /metrics", "/metrics".to_owned()),
    ] {
        let (rate, p99) = load(&format!("{url}{path}"));
        println!(
            "  {what:<24} {rate:>8.0} req/s ({:.2}x the floor's rate), p99 {p99:.1} ms",
            rate / floor_rate
        );
    }
    let _ = server.kill();
    let _ = server.wait();

    let big = cards_from("KANBAN_BENCH_MEMORY_CARDS", 1_000_000);
    let db = board(dir.path(), "memory.db", big);
    let (mut server, url) = serve(&db);
    let agent = ureq::Agent::new_with_config(ureq::config::Config::builder().build());
    let fetch = |path: &str| -> String {
        let mut response = agent.get(&format!("{url}{path}")).call().unwrap();
        response.body_mut().read_to_string().unwrap()
    };
    for path in [
        "/",
        "/metrics",
        "/api/walls",
        "/api/cards?status=done&limit=1000",
        "/",
    ] {
        fetch(path);
    }
    // The views a person opens, one at a time from a warm server: p99 of
    // 50 each.
    let p99 = |mut one: Box<dyn FnMut() + '_>| -> f64 {
        one();
        let mut took: Vec<f64> = (0..50)
            .map(|_| {
                let started = Instant::now();
                one();
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        took.sort_by(f64::total_cmp);
        took[((took.len() as f64 - 1.0) * 0.99).round() as usize]
    };
    for (what, path) in [
        ("board page /", "/"),
        ("filter ?q= (a title's words)", "/?q=card%20123457"),
        ("filter ?assignee= (none match)", "/?assignee=nobody"),
        ("filter ?tenant= (none match)", "/?tenant=acme"),
        ("one lane paged ?lane=ready&page=50", "/?lane=ready&page=50"),
    ] {
        let took = p99(Box::new(|| {
            fetch(path);
        }));
        println!(
            "  {big} cards: {what:<36} p99 {took:>6.1} ms (bound 100 ms, {:.2}x)",
            took / 100.0
        );
    }
    let listed: serde_json::Value =
        serde_json::from_str(&fetch("/api/cards?status=ready&limit=1")).unwrap();
    let moved = listed["cards"][0]["id"].as_str().unwrap().to_owned();
    let mut to = ["scheduled", "ready"].into_iter().cycle();
    let took = p99(Box::new(|| {
        let mut response = agent
            .post(&format!("{url}/api/cards/{moved}/move"))
            .header("Content-Type", "application/json")
            .send(format!("{{\"to\": \"{}\"}}", to.next().unwrap()))
            .unwrap();
        response.body_mut().read_to_string().unwrap();
    }));
    println!(
        "  {big} cards: {:<36} p99 {took:>6.1} ms (bound 200 ms, {:.2}x)",
        "move (drop) ready <-> scheduled",
        took / 200.0
    );
    // The listing, page after page, as a client that wants it all reads it.
    let mut next = Some("/api/cards?limit=1000".to_owned());
    let mut pages = 0;
    while let Some(path) = next.take().filter(|_| pages < 50) {
        let page: serde_json::Value = serde_json::from_str(&fetch(&path)).unwrap();
        next = page["next_cursor"]
            .as_str()
            .map(|cursor| format!("/api/cards?limit=1000&cursor={cursor}"));
        pages += 1;
    }
    // Thirty clients that ask for the biggest page and do not read it.
    let address = url.trim_start_matches("http://").to_owned();
    let slow: Vec<std::net::TcpStream> = (0..30)
        .map(|_| {
            use std::io::Write as _;
            let mut stream = std::net::TcpStream::connect(&address).unwrap();
            stream
                .write_all(b"GET /api/cards?limit=1000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .unwrap();
            stream
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    drop(slow);
    let peak = vm_hwm_kib(server.id());
    println!(
        "serve memory, {big} cards (board page, metrics, {pages} pages of /api/cards, 30 slow readers): peak {:.1} MiB (bound 64 MiB, {:.2}x)",
        peak as f64 / 1024.0,
        peak as f64 / 1024.0 / 64.0
    );
    let _ = server.kill();
    let _ = server.wait();
}
