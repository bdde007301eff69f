//! `/metrics`: the board's counts in the Prometheus (OpenMetrics) text
//! format, through `prometheus-client`. Each metric is listed in
//! docs/api.md.

use kanban_board_sqlite::BoardStats;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Labelled = Family<Vec<(String, String)>, Gauge>;

fn labelled(registry: &mut Registry, name: &str, help: &str, label: &str, pairs: &[(String, i64)]) {
    let family = Labelled::default();
    for (value, count) in pairs {
        family
            .get_or_create(&vec![(label.to_owned(), value.clone())])
            .set(*count);
    }
    registry.register(name, help, family);
}

fn single(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let gauge = Gauge::<i64>::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

/// The metrics text for `stats`.
pub(crate) fn render(stats: &BoardStats) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::with_prefix("kanban");
    labelled(
        &mut registry,
        "cards",
        "Cards on the board, by status",
        "status",
        &stats.cards_by_status,
    );
    labelled(
        &mut registry,
        "runs",
        "Runs ever made, by outcome (running: still open)",
        "outcome",
        &stats.runs_by_outcome,
    );
    labelled(
        &mut registry,
        "worker_exits",
        "Worker exits the dispatchers booked, by exit code (none: killed by a signal)",
        "exit_code",
        &stats.exits_by_code,
    );
    let running = stats
        .cards_by_status
        .iter()
        .find(|(status, _)| status == "running")
        .map_or(0, |(_, count)| *count);
    single(
        &mut registry,
        "workers_running",
        "Cards running under a worker now",
        running,
    );
    single(
        &mut registry,
        "recovery_attempts",
        "In-place recovery attempts the workers authorised",
        stats.recovery_attempts,
    );
    single(
        &mut registry,
        "recovered_runs",
        "Runs that recovered in place and then completed",
        stats.recovered_runs,
    );
    single(
        &mut registry,
        "stale_releases",
        "Claims released because their lease ran out",
        stats.stale_releases,
    );
    single(
        &mut registry,
        "stale_writes_rejected",
        "Worker writes refused because the writer no longer held the claim",
        stats.stale_writes_rejected,
    );
    single(
        &mut registry,
        "walls",
        "Provider walls standing",
        stats.walls,
    );
    single(
        &mut registry,
        "walls_holding",
        "Provider walls holding their cards now",
        stats.walls_holding,
    );
    let mut text = String::new();
    encode(&mut text, &registry)?;
    // The tick histogram arrives counted already (by every dispatcher, on
    // the board), so it is written out here, before the end marker.
    let body = text.strip_suffix("# EOF\n").unwrap_or(&text).to_owned();
    Ok(body + &tick_histogram(stats) + "# EOF\n")
}

/// `kanban_tick_duration_seconds` in the OpenMetrics histogram form.
fn tick_histogram(stats: &BoardStats) -> String {
    let name = "kanban_tick_duration_seconds";
    let mut out = format!(
        "# HELP {name} How long dispatcher ticks took (every dispatcher of the board).\n# TYPE {name} histogram\n"
    );
    let mut cumulative = 0;
    for (index, count) in stats.tick_buckets.iter().enumerate() {
        cumulative += count;
        let le = kanban_core::TICK_BUCKETS_MS.get(index).map_or_else(
            || "+Inf".to_owned(),
            |ms| format!("{}", *ms as f64 / 1000.0),
        );
        out.push_str(&format!("{name}_bucket{{le=\"{le}\"}} {cumulative}\n"));
    }
    out.push_str(&format!(
        "{name}_sum {}\n{name}_count {cumulative}\n",
        stats.tick_sum_ms as f64 / 1000.0
    ));
    out
}
