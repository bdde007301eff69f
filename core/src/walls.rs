//! Provider-scoped quota walls: when one card's provider says "no more for
//! now", every card bound for that provider waits, instead of each being
//! spawned to hit the same wall.
//!
//! A wall is board state (every dispatcher and host sees it) with a scope:
//! a credential wall (billing, exhausted quota, a refused key) covers every
//! model reached with that credential; a rate wall covers one model. While a
//! scope is walled nothing is spawned for its cards, and they are charged
//! nothing. At the wall's reset time one probe card goes through
//! (half-open): a run that gets an answer lifts the wall, another wall
//! re-arms it with backoff. Every wait is bounded by the dispatcher's
//! `max_wall_seconds`.
//!
//! This module only decides; the board stores and the dispatcher asks.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::booking::BookingKind;
use crate::data::FailureReason;

/// The bound on a wall's wait when the dispatcher names none (`--max-wall`).
pub const DEFAULT_MAX_WALL_SECONDS: i64 = 3600;
/// The longest provider or model name kept in a scope.
const SCOPE_PART_LIMIT: usize = 200;

/// What a wall covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WallKind {
    /// One credential at one endpoint, every model: billing, exhausted
    /// quota, a refused key.
    Credential,
    /// One model through one credential at one endpoint: a rate limit.
    Rate,
}

impl WallKind {
    /// The name stored on the board.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Credential => "credential",
            Self::Rate => "rate",
        }
    }

    /// Parses a stored name.
    pub fn parse(raw: &str) -> Option<Self> {
        [Self::Credential, Self::Rate]
            .into_iter()
            .find(|kind| kind.as_str() == raw)
    }

    /// The wall a failure reason means, if it means one. Overloaded servers
    /// and time-outs are the endpoint's weather, not a wall of ours.
    pub fn of_failure(reason: &FailureReason) -> Option<Self> {
        match reason {
            FailureReason::RateLimit | FailureReason::UpstreamRateLimit => Some(Self::Rate),
            FailureReason::Billing | FailureReason::Auth | FailureReason::AuthPermanent => {
                Some(Self::Credential)
            }
            _ => None,
        }
    }
}

/// Who a turn talked to: the provider (endpoint and credential, never the
/// credential itself) and the model, as the agent reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProviderId {
    pub provider: Option<String>,
    pub model: Option<String>,
}

/// An agent as walls see it: its identity (its name and a digest of its
/// command, so two different commands are two agents) and the provider it
/// is known to call before it ran (an HTTP agent's; a command agent reports
/// its own in its results).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct AgentRoute {
    pub identity: String,
    pub provider: ProviderId,
    /// Runs of this agent on the board at once, at most (`None`: only the
    /// dispatcher's own limit).
    pub max_in_progress: Option<usize>,
}

/// Keeps a name fit for a scope: printable, one line, bounded.
fn clean(part: &str) -> Option<String> {
    let cleaned: String = part
        .chars()
        .filter(|c| !c.is_control())
        .take(SCOPE_PART_LIMIT)
        .collect();
    let cleaned = cleaned.trim();
    (!cleaned.is_empty()).then(|| cleaned.to_owned())
}

/// The scope of a wall of `kind` hit through the agent `identity` with
/// `provider`. An agent that names no provider is its own scope
/// (`agent:IDENTITY`).
pub fn wall_scope(kind: WallKind, identity: &str, provider: &ProviderId) -> String {
    let base = provider
        .provider
        .as_deref()
        .and_then(clean)
        .unwrap_or_else(|| format!("agent:{identity}"));
    match (kind, provider.model.as_deref().and_then(clean)) {
        (WallKind::Rate, Some(model)) => format!("{base} model:{model}"),
        _ => base,
    }
}

/// The provider a run's wall may name: the one its agent is entitled to
/// (declared for it in the agents file, or derived by the HTTP agent from
/// its endpoint and key), when the run names that one or none; with the
/// model the agent is set up with, else the one the run names. A run that
/// names any other provider (another agent's, or another agent's private
/// `agent:…` scope) is entitled to nothing but its agent's own scope: it
/// cannot wall the cards of agents it does not share a provider with.
pub fn entitled_provider(entitled: &ProviderId, reported: &ProviderId) -> ProviderId {
    let Some(own) = entitled.provider.as_deref().and_then(clean) else {
        return ProviderId::default();
    };
    let named = reported.provider.as_deref().and_then(clean);
    if named.is_some_and(|named| named != own) {
        return ProviderId::default();
    }
    ProviderId {
        provider: Some(own),
        model: entitled.model.clone().or_else(|| reported.model.clone()),
    }
}

/// True for a provider name an agents file may declare: not one of the
/// agents' own scopes.
pub fn is_declarable_provider(provider: &str) -> bool {
    clean(provider).is_some_and(|name| !name.starts_with("agent:"))
}

/// Every scope a wall on which holds the agent `identity` that calls
/// `provider`: the agent itself, its credential, and its model.
pub fn scopes_of(identity: &str, provider: &ProviderId) -> BTreeSet<String> {
    let mut scopes = BTreeSet::from([format!("agent:{identity}")]);
    if provider.provider.as_deref().and_then(clean).is_some() {
        scopes.insert(wall_scope(WallKind::Credential, identity, provider));
        scopes.insert(wall_scope(WallKind::Rate, identity, provider));
    }
    scopes
}

/// How a route is named to people: the unnamed agent is `default`.
pub fn route_label(route: &str) -> &str {
    if route.is_empty() { "default" } else { route }
}

/// A wall as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wall {
    pub scope: String,
    pub kind: WallKind,
    /// The agent that hit it last, as people name it (`default`: the
    /// unnamed agent); for people, not for matching.
    pub route: String,
    /// When it was first armed.
    pub since: i64,
    /// Nothing of its scope is spawned before this time.
    pub until: i64,
    /// What the provider said, in short.
    pub reason: String,
    /// The card and run that hit it last (`TASK#RUN`).
    pub source: String,
    /// How many runs hit it.
    pub hits: u32,
    /// Probes that hit it again; each doubles the next wait.
    pub failed_probes: u32,
    /// The run let through as the probe, while it runs.
    pub probe_run: Option<i64>,
}

/// One run hitting a wall, as the dispatcher books it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WallHit {
    pub scope: String,
    pub kind: WallKind,
    pub route: String,
    /// The provider's reset time, in seconds from now, if it named one.
    pub reported_wait: Option<u64>,
    pub reason: String,
}

/// The dispatcher's limits on a wall's wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WallBounds {
    /// The first wait when the provider named no reset time.
    pub unnamed_wait: i64,
    /// The longest wait, whatever the provider named.
    pub max_wall: i64,
}

/// A change to the walls table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WallChange {
    /// Insert or replace the wall of this scope.
    Arm(Wall),
    /// The probe got an answer: the wall is gone.
    Lift { scope: String },
    /// The probe ended without telling anything; the next may go.
    ProbeEnded { scope: String },
}

/// How long a wall waits: the provider's reset time when it named one, else
/// `unnamed` (the dispatcher's rate-limit cooldown); doubled per failed
/// probe; never past `max_wall`.
pub fn wall_wait_seconds(
    reported: Option<u64>,
    unnamed: i64,
    failed_probes: u32,
    max_wall: i64,
) -> i64 {
    let base = reported.map_or(unnamed, |seconds| {
        i64::try_from(seconds).unwrap_or(i64::MAX)
    });
    let factor = 1_i64.checked_shl(failed_probes.min(62)).unwrap_or(i64::MAX);
    base.saturating_mul(factor).min(max_wall).max(0)
}

/// The wall after `hit`, given the wall of its scope (if any) and the run
/// that hit it. A probe that hits the wall again re-arms it with backoff;
/// other runs (started before the wall was armed) only extend it to the
/// provider's reset time.
pub fn arm_wall(
    existing: Option<&Wall>,
    hit: &WallHit,
    task_id: &str,
    run_id: i64,
    now: i64,
    bounds: WallBounds,
) -> Wall {
    let failed_probes = existing.map_or(0, |wall| {
        wall.failed_probes + u32::from(wall.probe_run == Some(run_id))
    });
    let wait = wall_wait_seconds(
        hit.reported_wait,
        bounds.unnamed_wait,
        failed_probes,
        bounds.max_wall,
    );
    let until = now.saturating_add(wait);
    // A wall already armed further out stays there, unless this hit is its
    // probe: a failed probe decides the next wait on its own.
    let until = match existing {
        Some(wall) if wall.probe_run != Some(run_id) => until.max(wall.until),
        _ => until,
    };
    Wall {
        scope: hit.scope.clone(),
        kind: hit.kind,
        route: hit.route.clone(),
        since: existing.map_or(now, |wall| wall.since),
        until,
        reason: hit.reason.chars().take(SCOPE_PART_LIMIT).collect(),
        source: format!("{task_id}#{run_id}"),
        hits: existing.map_or(1, |wall| wall.hits.saturating_add(1)),
        failed_probes,
        probe_run: existing
            .and_then(|wall| wall.probe_run)
            .filter(|probe| *probe != run_id),
    }
}

/// The wall changes one booked run makes: its own hit (if it hit a wall),
/// and the end of any probe it was. `walls` are the walls of the hit's
/// scope and those probed by `run_id`.
pub fn walls_after_booking(
    walls: &[Wall],
    hit: Option<&WallHit>,
    kind: BookingKind,
    task_id: &str,
    run_id: i64,
    now: i64,
    bounds: WallBounds,
) -> Vec<WallChange> {
    let walled = matches!(
        kind,
        BookingKind::RateLimited | BookingKind::TerminalProvider
    );
    let mut changes = Vec::new();
    let hit = hit.filter(|_| walled);
    if let Some(hit) = hit {
        let existing = walls.iter().find(|wall| wall.scope == hit.scope);
        changes.push(WallChange::Arm(arm_wall(
            existing, hit, task_id, run_id, now, bounds,
        )));
    }
    for wall in walls.iter().filter(|wall| wall.probe_run == Some(run_id)) {
        if hit.is_some_and(|hit| hit.scope == wall.scope) {
            continue;
        }
        // The agent finished its turn (a terminal call, or an exit 0): the
        // provider answered. Anything else (a crash, a time-out, a wall of
        // another scope) says nothing about this one.
        let answered = matches!(kind, BookingKind::Settled | BookingKind::ProtocolViolation);
        let scope = wall.scope.clone();
        changes.push(if answered {
            WallChange::Lift { scope }
        } else {
            WallChange::ProbeEnded { scope }
        });
    }
    changes
}

/// What a dispatcher may do for the cards of one agent route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// No wall covers it.
    Open,
    /// Walled: spawn nothing before `until` (or while a probe runs).
    Held { until: i64 },
    /// A wall reached its reset time and no probe runs: one card may go.
    Probe,
}

/// The gate of an agent whose scopes are `scopes`, given every wall on the
/// board and the runs still running. A probe whose run no longer runs
/// (released, reclaimed) no longer holds its wall.
pub fn gate(
    walls: &[Wall],
    scopes: &BTreeSet<String>,
    running_runs: &BTreeSet<i64>,
    now: i64,
) -> Gate {
    let mut gate = Gate::Open;
    for wall in walls.iter().filter(|wall| scopes.contains(&wall.scope)) {
        let probing = wall
            .probe_run
            .is_some_and(|run| running_runs.contains(&run));
        let this = if now < wall.until || probing {
            Gate::Held { until: wall.until }
        } else {
            Gate::Probe
        };
        gate = match (gate, this) {
            (Gate::Held { until: a }, Gate::Held { until: b }) => Gate::Held { until: a.max(b) },
            (Gate::Held { until }, _) | (_, Gate::Held { until }) => Gate::Held { until },
            (Gate::Probe, _) | (_, Gate::Probe) => Gate::Probe,
            (Gate::Open, Gate::Open) => Gate::Open,
        };
    }
    gate
}

/// The walls a probe of an agent with `scopes` tests: those covering it
/// whose reset time has come.
pub fn probed_walls<'a>(walls: &'a [Wall], scopes: &BTreeSet<String>, now: i64) -> Vec<&'a Wall> {
    walls
        .iter()
        .filter(|wall| scopes.contains(&wall.scope) && now >= wall.until)
        .collect()
}
