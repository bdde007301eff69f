//! Which agent serves a card, and the wall scopes each agent reaches.

use std::collections::{BTreeMap, BTreeSet};

use crate::data::ExitCode;
use crate::data::WorkerResult;
use crate::dispatcher::{ClaimFilter, Dispatcher};
use crate::walls::{ProviderId, WallHit, WallKind, route_label, wall_scope};

/// What a dispatcher knows of its agents' runs and walls.
#[derive(Debug)]
pub(super) struct Routing {
    /// The agent route of each running run, as far as known.
    pub(super) run_routes: BTreeMap<i64, String>,
    /// The wall scopes each route reaches: its own name and the provider it
    /// is entitled to (a run's report adds none: see `entitled_provider`).
    pub(super) scopes: BTreeMap<String, BTreeSet<String>>,
    /// The routes a wall held on the last tick, and until when (said once).
    pub(super) held: BTreeMap<String, i64>,
}

impl Routing {
    pub(super) fn new(scopes: BTreeMap<String, BTreeSet<String>>) -> Self {
        Self {
            run_routes: BTreeMap::new(),
            scopes,
            held: BTreeMap::new(),
        }
    }
}

/// The assignees whose cards `route` serves among `routes` (`""`: no
/// assignee), when `unassigned_route` serves the cards with none; `None`
/// for every card (a lone unnamed agent).
fn route_assignees<'a>(
    mut routes: impl Iterator<Item = &'a String>,
    unassigned_route: Option<&str>,
    route: &str,
) -> Option<BTreeSet<String>> {
    if !routes.any(|route| !route.is_empty()) {
        return None;
    }
    let mut assignees = BTreeSet::from([route.to_owned()]);
    if unassigned_route == Some(route) {
        assignees.insert(String::new());
    }
    Some(assignees)
}

/// The assignees whose cards a wall on `scope` holds back (`""`: cards
/// with no assignee), given the scopes each route reaches and the route of
/// the cards with none, as a dispatcher routes them; `None`: every card (a
/// lone unnamed agent).
pub fn assignees_behind(
    scope: &str,
    scopes: &BTreeMap<String, BTreeSet<String>>,
    unassigned_route: Option<&str>,
) -> Option<BTreeSet<String>> {
    let mut behind = BTreeSet::new();
    for (route, _) in scopes.iter().filter(|(_, reached)| reached.contains(scope)) {
        behind.extend(route_assignees(scopes.keys(), unassigned_route, route)?);
    }
    Some(behind)
}

impl Dispatcher {
    /// The route serving a card assigned to `assignee`: the agent of that
    /// name; else the unnamed agent for a card with no assignee, or for
    /// every card when no agent is named. `None`: no agent serves it (the
    /// card waits, uncharged).
    pub fn route_of(&self, assignee: Option<&str>) -> Option<String> {
        let assignee = assignee.unwrap_or("");
        let named = self.settings.routes.keys().any(|route| !route.is_empty());
        if !assignee.is_empty() && self.settings.routes.contains_key(assignee) {
            return Some(assignee.to_owned());
        }
        if self.settings.routes.contains_key("") {
            return (assignee.is_empty() || !named).then(String::new);
        }
        self.settings
            .unassigned_route
            .clone()
            .filter(|route| assignee.is_empty() && self.settings.routes.contains_key(route))
    }

    /// The assignees whose cards `route` serves (`""`: no assignee); `None`
    /// for every card (a lone unnamed agent).
    pub fn assignees_of(&self, route: &str) -> Option<BTreeSet<String>> {
        route_assignees(
            self.settings.routes.keys(),
            self.settings.unassigned_route.as_deref(),
            route,
        )
    }

    /// The filter admitting the cards of `routes` only.
    pub(super) fn filter_for<'a>(
        &self,
        routes: impl IntoIterator<Item = &'a String>,
    ) -> ClaimFilter {
        let mut admitted = BTreeSet::new();
        for route in routes {
            match self.assignees_of(route) {
                None => return ClaimFilter::any(),
                Some(assignees) => admitted.extend(assignees),
            }
        }
        ClaimFilter::only(admitted)
    }

    /// The identity of a route's agent, as walls name it.
    pub(super) fn identity(&self, route: &str) -> String {
        self.settings.routes.get(route).map_or_else(
            || route_label(route).to_owned(),
            |agent| agent.identity.clone(),
        )
    }
}

/// The wall a worker's result says its run hit: exit 75 or 78 with a
/// failure reason that is a wall (or none: a credential the runner found
/// limited or refused).
pub(super) fn wall_hit(
    result: &WorkerResult,
    route: &str,
    identity: &str,
    provider: &ProviderId,
) -> Option<WallHit> {
    let kind = match (&result.failure_reason, result.exit_code) {
        (Some(reason), ExitCode::TempFail | ExitCode::ConfigFail) => WallKind::of_failure(reason)?,
        (None, ExitCode::TempFail) => WallKind::Rate,
        (None, ExitCode::ConfigFail) => WallKind::Credential,
        _ => return None,
    };
    Some(WallHit {
        scope: wall_scope(kind, identity, provider),
        kind,
        route: route_label(route).to_owned(),
        reported_wait: result.retry_after_seconds,
        reason: result.failure_reason.as_ref().map_or_else(
            || format!("exit {}", result.exit_code),
            |reason| reason.as_str().to_owned(),
        ),
    })
}
