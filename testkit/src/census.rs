//! A census of live agents on this host, read from `/proc` every few
//! milliseconds: it catches the moment two runs of one card have live
//! agents at once, which must never happen on one host.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a census saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CensusReport {
    /// Samples taken.
    pub samples: u64,
    /// Every sample in which a card had live agents of two runs or more:
    /// `card: [runs]`.
    pub overlaps: Vec<String>,
    /// The most agents seen alive at once.
    pub peak_agents: usize,
}

/// Samples the live agents of one board until finished.
#[derive(Debug)]
pub struct AgentCensus {
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<CensusReport>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn environ(pid: u32) -> Option<Vec<String>> {
    let bytes = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        bytes
            .split(|b| *b == 0)
            .map(|entry| String::from_utf8_lossy(entry).into_owned())
            .collect(),
    )
}

fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
    })
}

/// The live agents of `db`: (card, run) per process whose command line
/// contains `marker` (the agent's script) and whose environment carries a
/// claim on `db`.
fn sample(db: &str, marker: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut cards: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return cards;
    };
    for pid in entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
    {
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmdline).contains(marker) || !running(pid) {
            continue;
        }
        let Some(environ) = environ(pid) else {
            continue;
        };
        let value = |name: &str| {
            environ
                .iter()
                .find_map(|entry| entry.strip_prefix(&format!("{name}=")).map(str::to_owned))
        };
        if value("HERMES_KANBAN_DB").as_deref() != Some(db) {
            continue;
        }
        if let (Some(task), Some(run)) =
            (value("HERMES_KANBAN_TASK"), value("HERMES_KANBAN_RUN_ID"))
        {
            cards.entry(task).or_default().insert(run);
        }
    }
    cards
}

impl AgentCensus {
    /// Starts sampling the agents of board `db` whose command line contains
    /// `marker`, every `every`.
    pub fn start(db: &Path, marker: &str, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let report = Arc::new(Mutex::new(CensusReport::default()));
        let (db, marker) = (db.display().to_string(), marker.to_owned());
        let (stopping, filling) = (stop.clone(), report.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                let cards = sample(&db, &marker);
                let mut report = filling.lock().unwrap();
                report.samples += 1;
                report.peak_agents = report
                    .peak_agents
                    .max(cards.values().map(BTreeSet::len).sum());
                for (card, runs) in &cards {
                    if runs.len() > 1 {
                        report.overlaps.push(format!("{card}: runs {runs:?}"));
                    }
                }
                drop(report);
                std::thread::sleep(every);
            }
        });
        Self {
            stop,
            report,
            thread: Some(thread),
        }
    }

    /// Stops sampling and returns what was seen.
    pub fn finish(mut self) -> CensusReport {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.report.lock().unwrap().clone()
    }
}
