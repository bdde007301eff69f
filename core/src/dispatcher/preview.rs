//! A dry run of one tick's claims: which cards of the claim lanes a tick
//! would claim now, and why not the others. It reads the board through the
//! dispatcher's own ports and decides with the dispatcher's own routing,
//! walls and limits, and writes nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::data::{BoardError, TaskStatus};
use crate::dispatcher::Dispatcher;
use crate::rules::ClaimCandidate;
use crate::walls::{Gate, gate, route_label};

/// What a tick would do with one card of the claim lanes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Foreseen {
    /// Claimed, its worker started for the agent `route`.
    Claim { route: String },
    /// Claimed as the one card that probes its agent's wall, whose reset
    /// time came.
    Probe { route: String },
    /// A run holds it.
    Running,
    /// An operator holds it (`kanban hold`).
    Held,
    /// It waits for its time (a backoff, a cooldown, `--not-before`).
    Waits { until: i64 },
    /// An id no kanban writes: never claimed.
    InvalidId,
    /// No agent of this dispatcher serves its assignee.
    NoAgent,
    /// A parent is not done: the claim would send it back to `todo`.
    ParentsOpen,
    /// A provider wall holds its agent's cards until then.
    Walled { route: String, until: i64 },
    /// Its agent's wall is probed by another card this tick.
    WallProbed { route: String },
    /// Its agent runs as many cards as its own limit allows.
    AgentFull { route: String },
    /// This host's slots are full (`--max-in-progress`).
    NoRoom,
}

impl Foreseen {
    /// Whether the tick would claim the card.
    pub fn claimed(&self) -> bool {
        matches!(self, Self::Claim { .. } | Self::Probe { .. })
    }
}

/// What may claim this tick, per agent route.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Gates {
    /// The route of each assignee's cards (`None`: no agent serves it).
    pub routes: BTreeMap<Option<String>, Option<String>>,
    /// Each route's gate; a route absent here is at its own limit.
    pub gates: BTreeMap<String, Gate>,
    /// Room left per route under its own limit (routes that have one).
    pub room: BTreeMap<String, usize>,
}

/// What a tick would do with each card of `lane` (in claim order) at
/// `now`, with `slots` free on this host: probes first, one claim (and
/// slot) per walled route whose reset came, whether or not a card of it
/// waits, then the open routes' cards in order,
/// each within its agent's room and the host's slots; as the dispatcher's
/// claims go.
pub fn foresee(lane: &[ClaimCandidate], now: i64, slots: usize, gates: &Gates) -> Vec<Foreseen> {
    let mut verdicts: Vec<Option<Foreseen>> = lane
        .iter()
        .map(|card| passed_over(card, now, gates))
        .collect();
    let mut slots = slots;
    let mut room = gates.room.clone();
    // Probes first: each walled route whose reset came makes one claim call,
    // in route order, whether or not a card of it waits.
    let mut probing = BTreeSet::new();
    for (route, _) in gates.gates.iter().filter(|(_, gate)| **gate == Gate::Probe) {
        if slots == 0 {
            break;
        }
        slots -= 1;
        probing.insert(route.clone());
    }
    let mut probed = BTreeSet::new();
    for (card, verdict) in lane.iter().zip(verdicts.iter_mut()) {
        if verdict.is_some() {
            continue;
        }
        let route = route_of(card, gates);
        if gates.gates.get(&route) != Some(&Gate::Probe) {
            continue;
        }
        // Its agent's other cards wait for the probe: its room is moot.
        *verdict = Some(if probed.contains(&route) {
            Foreseen::WallProbed {
                route: label(&route),
            }
        } else if probing.contains(&route) {
            probed.insert(route.clone());
            Foreseen::Probe {
                route: label(&route),
            }
        } else {
            Foreseen::NoRoom
        });
    }
    for (card, verdict) in lane.iter().zip(verdicts.iter_mut()) {
        if verdict.is_some() {
            continue;
        }
        let route = route_of(card, gates);
        *verdict = Some(match gates.gates.get(&route) {
            Some(Gate::Held { until }) => Foreseen::Walled {
                route: label(&route),
                until: *until,
            },
            None | Some(Gate::Probe) => Foreseen::AgentFull {
                route: label(&route),
            },
            Some(Gate::Open) if room.get(&route) == Some(&0) => Foreseen::AgentFull {
                route: label(&route),
            },
            Some(Gate::Open) if slots == 0 => Foreseen::NoRoom,
            Some(Gate::Open) => {
                slots -= 1;
                take_room(&mut room, &route);
                Foreseen::Claim {
                    route: label(&route),
                }
            }
        });
    }
    verdicts
        .into_iter()
        .map(|verdict| verdict.unwrap_or(Foreseen::NoRoom))
        .collect()
}

fn label(route: &str) -> String {
    route_label(route).to_owned()
}

fn take_room(room: &mut BTreeMap<String, usize>, route: &str) {
    if let Some(left) = room.get_mut(route) {
        *left = left.saturating_sub(1);
    }
}

/// The route of a card the first pass left for routing (it has one).
fn route_of(card: &ClaimCandidate, gates: &Gates) -> String {
    gates
        .routes
        .get(&card.assignee)
        .cloned()
        .flatten()
        .unwrap_or_default()
}

/// Why no tick claims `card` now, whatever its agent: the claim rule's
/// reasons, in its order, and no agent for it.
fn passed_over(card: &ClaimCandidate, now: i64, gates: &Gates) -> Option<Foreseen> {
    if card.claimed {
        return Some(Foreseen::Running);
    }
    if card.held {
        return Some(Foreseen::Held);
    }
    if let Some(until) = card.not_before.filter(|until| *until > now) {
        return Some(Foreseen::Waits { until });
    }
    if !crate::is_valid_task_id(&card.task_id) {
        return Some(Foreseen::InvalidId);
    }
    if gates.routes.get(&card.assignee).is_none_or(Option::is_none) {
        return Some(Foreseen::NoAgent);
    }
    if card.open_parents && card.status == Some(TaskStatus::Ready) {
        return Some(Foreseen::ParentsOpen);
    }
    None
}

/// A dry run of one tick's claims.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TickPreview {
    /// When it was read.
    pub now: i64,
    /// Runs of this host on the board.
    pub running_here: usize,
    /// Slots free on this host.
    pub slots: usize,
    /// The cards of the claim lanes read (ready, then review), in claim
    /// order, each with what the tick would do.
    pub cards: Vec<(ClaimCandidate, Foreseen)>,
    /// More cards wait in the lanes than were read.
    pub more: bool,
}

impl Dispatcher {
    /// What a tick would claim now, and why not the rest of the first
    /// `limit` cards of the claim lanes; reads the board, writes nothing.
    pub async fn preview(&mut self, limit: usize) -> Result<TickPreview, BoardError> {
        let running = self.ports.board.running_workers().await?;
        for worker in &running {
            if let Some(route) = self.route_of(worker.assignee.as_deref()) {
                self.routing.run_routes.insert(worker.claim.run_id, route);
            }
        }
        let running_here = running
            .iter()
            .filter(|worker| self.host_local(&worker.claim))
            .count();
        let slots = self.settings.max_in_progress.saturating_sub(running_here);
        let walls = self.ports.board.walls().await?;
        let now = self.ports.clock.now();
        let running_runs: BTreeSet<i64> =
            running.iter().map(|worker| worker.claim.run_id).collect();
        let room = self.room_per_agent();
        let mut gates = Gates::default();
        for route in self.settings.routes.keys() {
            if room.get(route) == Some(&0) {
                continue;
            }
            let scopes = self.routing.scopes.get(route).cloned().unwrap_or_default();
            gates
                .gates
                .insert(route.clone(), gate(&walls, &scopes, &running_runs, now));
        }
        gates.room = room;
        let mut lane = self.ports.board.claim_lane(limit.saturating_add(1)).await?;
        let more = lane.len() > limit;
        lane.truncate(limit);
        for card in &lane {
            let route = self.route_of(card.assignee.as_deref());
            gates.routes.insert(card.assignee.clone(), route);
        }
        let verdicts = foresee(&lane, now, slots, &gates);
        Ok(TickPreview {
            now,
            running_here,
            slots,
            cards: lane.into_iter().zip(verdicts).collect(),
            more,
        })
    }
}
