//! `kanban dispatch --dry-run`: what one tick of this dispatcher would
//! claim now, and why not the rest, decided by core's dispatcher on the
//! board as it stands. Nothing is written, nothing is started, no lock is
//! taken: it may run beside a dispatcher that ticks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kanban_board_sqlite::SystemClock;
use kanban_core::{
    Claim, DispatchPorts, Dispatcher, Environment, EnvironmentFault, ExitCode, Foreseen, RunLog,
    StopSignal, Supervisor, TickPreview, Wakeups, WorkerExit, WorkerProcess,
};
use serde_json::{Value, json};

use crate::board_path::{Schema, open_db, postgres_url};
use crate::dispatch::DispatchPlan;
use crate::out::outln;
use crate::output::{human_time, short, table, visible_line};
use crate::runtime::block_on;

/// The most cards of the claim lanes a dry run reads.
const READ_AT_MOST: usize = 500;

/// The lanes a tick claims from.
const CLAIM_LANES: [&str; 2] = ["ready", "review"];

/// What the lanes no tick claims from wait for.
fn lane_note(status: &str) -> &'static str {
    match status {
        "todo" => "wait for their parents",
        "scheduled" => "are held or due later",
        "triage" => "wait to be specified",
        "blocked" => "wait for a human",
        "running" => "run",
        "done" | "archived" => "are finished",
        _ => "are in a lane this build does not know",
    }
}

/// `kanban dispatch --dry-run [--json]`.
pub(crate) fn dry_run(
    plan: &DispatchPlan,
    env: &Environment,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let host = crate::supervisor::hostname();
    let (preview, elsewhere) = block_on(async {
        // Read only: a seed system's board, or one of an older schema, is
        // read without being written.
        let board = if postgres_url(&plan.db).is_some() {
            open_db(&plan.db, Arc::new(SystemClock), env, Schema::AsItIs, || {
                Ok(plan.folder.clone())
            })
            .await?
        } else {
            crate::board_path::OpenBoard::for_reading(
                kanban_board_sqlite::SqliteBoard::open_for_reading(
                    &plan.db,
                    Arc::new(SystemClock),
                )?,
            )
        };
        // The cards no tick claims from where they are, by lane.
        let elsewhere: BTreeMap<String, i64> = board
            .stats()
            .await?
            .cards_by_status
            .into_iter()
            .filter(|(status, count)| *count > 0 && !CLAIM_LANES.contains(&status.as_str()))
            .collect();
        let onlooker = Arc::new(Onlooker { host: host.clone() });
        let ports = DispatchPorts {
            board: board.into_inline(),
            supervisor: onlooker.clone(),
            clock: Arc::new(SystemClock),
            wakeups: onlooker,
            notes: Arc::new(Silent),
        };
        let mut dispatcher = Dispatcher::new(ports, plan.settings.clone());
        anyhow::Ok((dispatcher.preview(READ_AT_MOST).await?, elsewhere))
    })?;
    if as_json {
        outln!("{}", preview_json(&preview, &host, &elsewhere));
    } else {
        say(&preview, &host, plan.settings.max_in_progress, &elsewhere);
    }
    Ok(ExitCode::Success)
}

/// The dry run as one JSON object (docs/cli.md).
fn preview_json(preview: &TickPreview, host: &str, elsewhere: &BTreeMap<String, i64>) -> Value {
    let cards: Vec<Value> = preview
        .cards
        .iter()
        .map(|(card, foreseen)| {
            let mut entry = json!({
                "task_id": card.task_id,
                "title": card.title,
                "status": card.status.map(kanban_core::TaskStatus::as_str),
                "assignee": card.assignee,
                "priority": card.priority,
                "claimed": foreseen.claimed(),
            });
            if let (Value::Object(entry), Ok(Value::Object(verdict))) =
                (&mut entry, serde_json::to_value(foreseen))
            {
                entry.extend(verdict);
            }
            entry
        })
        .collect();
    // `spawned` and `skipped_unassigned` as the seed system's
    // `dispatch --dry-run --json` names them.
    let spawned: Vec<Value> = preview
        .cards
        .iter()
        .filter(|(_, foreseen)| foreseen.claimed())
        .map(|(card, _)| {
            json!({"task_id": card.task_id, "assignee": card.assignee, "workspace": null})
        })
        .collect();
    let unassigned: Vec<&str> = preview
        .cards
        .iter()
        .filter(|(_, foreseen)| *foreseen == Foreseen::NoAgent)
        .map(|(card, _)| card.task_id.as_str())
        .collect();
    json!({
        "dry_run": true,
        "now": preview.now,
        "host": host,
        "running_here": preview.running_here,
        "slots": preview.slots,
        "more": preview.more,
        "cards": cards,
        "spawned": spawned,
        "skipped_unassigned": unassigned,
        "elsewhere": elsewhere,
    })
}

/// The dry run for people: a line of slots, the other lanes, a table.
fn say(preview: &TickPreview, host: &str, slots: usize, elsewhere: &BTreeMap<String, i64>) {
    outln!(
        "dry run on {}: {} of {slots} slots free ({} run{} of this host); nothing was claimed",
        visible_line(host),
        preview.slots,
        preview.running_here,
        if preview.running_here == 1 { "" } else { "s" },
    );
    let others: Vec<String> = elsewhere
        .iter()
        .filter(|(status, _)| !matches!(status.as_str(), "done" | "archived"))
        .map(|(status, count)| format!("{count} {status} ({})", lane_note(status)))
        .collect();
    if !others.is_empty() {
        outln!("not in the claim lanes: {}", others.join(", "));
    }
    if preview.cards.is_empty() {
        outln!("no card is ready or in review");
        return;
    }
    let rows: Vec<Vec<String>> = preview
        .cards
        .iter()
        .map(|(card, foreseen)| {
            vec![
                card.task_id.clone(),
                if foreseen.claimed() { "claim" } else { "-" }.to_owned(),
                visible_line(card.assignee.as_deref().unwrap_or("-")).into_owned(),
                card.priority.to_string(),
                why(foreseen, card.assignee.as_deref(), preview.now),
                short(&visible_line(&card.title), 40),
            ]
        })
        .collect();
    crate::out::out!(
        "{}",
        table(&["ID", "TICK", "ASSIGNEE", "PRIO", "WHY", "TITLE"], &rows)
    );
    let claimed = preview.cards.iter().filter(|(_, f)| f.claimed()).count();
    outln!(
        "{claimed} of {} would be claimed{}",
        preview.cards.len(),
        if preview.more {
            format!("; more than {READ_AT_MOST} cards wait, the rest were not read")
        } else {
            String::new()
        }
    );
}

/// One card's verdict in words.
fn why(foreseen: &Foreseen, assignee: Option<&str>, now: i64) -> String {
    match foreseen {
        Foreseen::Claim { route } => format!("its agent {route} takes it"),
        Foreseen::Probe { route } => format!("probes the wall of agent {route}"),
        Foreseen::Running => "a run holds it".to_owned(),
        Foreseen::Held => "held (kanban release)".to_owned(),
        Foreseen::Waits { until } => format!("waits until {}", human_time(*until, now)),
        Foreseen::InvalidId => "an id no kanban writes: never claimed".to_owned(),
        Foreseen::NoAgent => format!(
            "no agent serves {}",
            assignee.map_or_else(
                || "cards with no assignee".to_owned(),
                |name| format!("{:?}", visible_line(name))
            )
        ),
        Foreseen::ParentsOpen => "a parent is not done: back to todo".to_owned(),
        Foreseen::Walled { route, until } => {
            format!("agent {route} is walled until {}", human_time(*until, now))
        }
        Foreseen::WallProbed { route } => format!("another card probes agent {route}'s wall"),
        Foreseen::AgentFull { route } => format!("agent {route} is at its max_in_progress"),
        Foreseen::NoRoom => "no slot left (--max-in-progress)".to_owned(),
    }
}

/// The dispatcher's processes, for a dry run: this host's name, and
/// nothing started, signalled or swept (a dry run's dispatcher only reads).
#[derive(Debug)]
struct Onlooker {
    host: String,
}

#[async_trait]
impl Supervisor for Onlooker {
    fn host(&self) -> &str {
        &self.host
    }
    fn new_claim_lock(&self) -> String {
        format!("{}:{}:dry-run", self.host, std::process::id())
    }
    fn claimer_gone(&self, _claim_lock: &str) -> bool {
        false
    }
    async fn spawn(
        &self,
        _claim: &Claim,
        _goal_mode: bool,
        _route: &str,
    ) -> Result<WorkerProcess, EnvironmentFault> {
        Err(EnvironmentFault::Configuration(
            "a dry run starts no worker".to_owned(),
        ))
    }
    async fn reap(&self) -> Vec<WorkerExit> {
        Vec::new()
    }
    fn alive(&self, _pid: i64, _started_at: Option<i64>) -> bool {
        true
    }
    fn signal(&self, _pid: i64, _started_at: Option<i64>, _signal: StopSignal) {}
    async fn sweep(&self, _claim: &Claim) {}
    async fn sweep_earlier_runs(&self, _claim: &Claim) -> bool {
        false
    }
    async fn run_log(&self, _claim: &Claim, _seal_digest: Option<&str>) -> RunLog {
        RunLog::default()
    }
}

#[async_trait]
impl Wakeups for Onlooker {
    async fn wait(&self, _timeout: Duration) {}
    fn stop_requested(&self) -> bool {
        true
    }
}

/// A dry run's dispatcher tells no log.
#[derive(Debug)]
struct Silent;

impl kanban_core::DispatchNotes for Silent {
    fn note(&self, _event: &kanban_core::DispatchEvent) {}
}
