//! The deterministic simulation, run over many seeds.
//!
//! `KANBAN_SIM_SEEDS=N` runs N seeds (default 200), `KANBAN_SIM_STEPS=S`
//! steps each (default 1000), `KANBAN_SIM_FIRST=K` starts at seed K;
//! `KANBAN_SIM_FRESH=F` runs N more from seed F (CI derives F from the
//! commit id, so every commit tries seeds no one tuned the system to);
//! `KANBAN_SIM_SEED=K` runs seed K alone and prints its trace;
//! `KANBAN_SIM_STORE=file|postgres` runs them on that board instead of
//! SQLite in memory.

#![allow(
    clippy::too_many_lines,
    reason = "the length rule is for src/: a test or a benchmark reads best whole"
)]
#![allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "tests and benchmarks read their knobs from the environment and drive real processes and files"
)]

mod sim {
    use kanban_testkit::sim::{Counts, SimOptions, SimStore, run_seed};

    fn env_u64(name: &str, default: u64) -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|raw| raw.trim().parse().ok())
            .unwrap_or(default)
    }

    /// Seeds that once found a bug (docs/reliability.md lists each); they
    /// stay in CI for good.
    const REGRESSION_SEEDS: [u64; 19] = [
        0,
        9,
        15,
        32,
        423,
        877,
        1194,
        1252,
        1591,
        1918,
        2324,
        4688,
        5348,
        8530,
        8560,
        9691,
        707_181,
        707_376,
        300_036_365,
    ];

    fn run(seeds: impl Iterator<Item = u64>, steps: u64, store: SimStore) -> Counts {
        let mut total = Counts::default();
        let mut failures = Vec::new();
        let whole_trace = std::env::var("KANBAN_SIM_SEED").is_ok();
        for seed in seeds {
            let options = SimOptions {
                seed,
                steps,
                store,
                whole_trace,
            };
            let report = run_seed(options);
            total.add(&report.counts);
            if !report.findings.is_empty() {
                failures.push(report.failure_text(&options));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        total
    }

    #[test]
    fn seeds_hold_every_invariant_and_every_card_settles() {
        let steps = env_u64("KANBAN_SIM_STEPS", 1000);
        let (seeds, first): (Box<dyn Iterator<Item = u64>>, String) =
            match std::env::var("KANBAN_SIM_SEED")
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                Some(seed) => (Box::new(std::iter::once(seed)), format!("seed {seed}")),
                None => {
                    let first = env_u64("KANBAN_SIM_FIRST", 0);
                    let count = env_u64("KANBAN_SIM_SEEDS", 200);
                    let fresh = std::env::var("KANBAN_SIM_FRESH")
                        .ok()
                        .and_then(|raw| raw.trim().parse::<u64>().ok())
                        .map(|fresh| fresh..fresh.saturating_add(count));
                    let named = match &fresh {
                        Some(range) => format!(
                            "seeds {first}..{}, fresh seeds {}..{}",
                            first + count,
                            range.start,
                            range.end
                        ),
                        None => format!("seeds {first}..{}", first + count),
                    };
                    (
                        Box::new(
                            (first..first + count)
                                .chain(REGRESSION_SEEDS)
                                .chain(fresh.into_iter().flatten()),
                        ),
                        named,
                    )
                }
            };
        let store = match std::env::var("KANBAN_SIM_STORE") {
            Ok(name) => SimStore::parse(&name)
                .unwrap_or_else(|| panic!("KANBAN_SIM_STORE={name}: say memory, file or postgres")),
            Err(_) => SimStore::Memory,
        };
        let started = std::time::Instant::now();
        let total = run(seeds, steps, store);
        println!(
            "simulation, {first} x {steps} steps on {store:?}: {} steps, {} virtual s, {} cards, {} runs, {} faults ({} worker kills, {} dispatcher kills, {} stops, {} pauses, {} clock jumps, {} skews, {} board faults, {} spawn faults), {} orphaned agents, {} stale writes refused, {} bookings, {:.1} s",
            total.steps,
            total.virtual_seconds,
            total.cards,
            total.runs,
            total.faults(),
            total.worker_kills,
            total.dispatcher_kills,
            total.dispatcher_stops,
            total.pauses,
            total.clock_jumps,
            total.clock_skews,
            total.board_faults,
            total.spawn_faults,
            total.orphaned_agents,
            total.stale_writes_refused,
            total.bookings,
            started.elapsed().as_secs_f64()
        );
        assert!(total.faults() > 0, "faults were injected");
        assert!(total.bookings > 0, "exits were booked");
    }

    #[test]
    fn seeds_on_a_board_file() {
        let count = env_u64("KANBAN_SIM_FILE_SEEDS", 8);
        let total = run(1_000_000..1_000_000 + count, 600, SimStore::File);
        assert!(total.runs > 0);
    }

    /// The same simulation on PostgreSQL: a fresh database per seed on the
    /// test cluster (`KANBAN_SIM_PG_SEEDS`, default 200).
    #[test]
    fn seeds_on_postgresql() {
        let count = env_u64("KANBAN_SIM_PG_SEEDS", 200);
        let steps = env_u64("KANBAN_SIM_STEPS", 1000);
        let started = std::time::Instant::now();
        let total = run(2_000_000..2_000_000 + count, steps, SimStore::Postgres);
        println!(
            "simulation, {count} seeds x {steps} steps on PostgreSQL: {} runs, {} faults, {} bookings, {:.1} s",
            total.runs,
            total.faults(),
            total.bookings,
            started.elapsed().as_secs_f64()
        );
        assert!(total.runs > 0 && total.faults() > 0 && total.bookings > 0);
    }

    #[test]
    fn a_seed_replays_exactly() {
        for seed in [3, 17] {
            let options = SimOptions {
                seed,
                steps: 400,
                store: SimStore::Memory,
                whole_trace: false,
            };
            let first = run_seed(options);
            let second = run_seed(options);
            assert_eq!(
                first.trace, second.trace,
                "seed {seed} replays step for step"
            );
            assert_eq!(first.counts, second.counts);
        }
    }
}
