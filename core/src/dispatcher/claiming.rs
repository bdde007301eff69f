//! Claiming ready cards within the room each agent has, past the walls
//! that hold them, and starting their workers.

use std::collections::{BTreeMap, BTreeSet};

use crate::board::ClaimGrant;
use crate::booking::SignalReason;
use crate::data::{BoardError, Claim, Release, RunStatus};
use crate::dispatcher::children::Child;
use crate::dispatcher::{ClaimFilter, DispatchEvent, Dispatcher, RunningWorker};
use crate::rules::lease_expired;

use crate::walls::{Gate, gate, probed_walls, route_label};

impl Dispatcher {
    /// Claims up to `budget` cards (this host's free slots) and starts
    /// their workers; how many started.
    pub(super) async fn claim_and_spawn(
        &mut self,
        running: &[RunningWorker],
        budget: usize,
    ) -> usize {
        if budget == 0 {
            return 0;
        }
        let Some(mut plan) = self.plan_claims(running).await else {
            return 0;
        };
        let mut probes = std::mem::take(&mut plan.probes).into_iter();
        let (mut spawned, mut left) = (0, budget);
        // Each claim call counts, found or not: a tick makes at most
        // `budget` of them.
        for _ in 0..budget {
            if left == 0 {
                break;
            }
            // Probes first: one card per walled route whose reset came.
            let (filter, probe) = match probes.next() {
                Some((route, scopes)) => (self.filter_for([&route]), Some(scopes)),
                None if plan.open.is_empty() => break,
                None => (self.filter_for(&plan.open), None),
            };
            // Several cards in one transaction, unless a probe (one card)
            // or an agent's own limit has to be counted card by card.
            let want = if probe.is_none() && plan.room.is_empty() {
                left
            } else {
                1
            };
            let Some(grants) = self.claim_batch(want, &filter).await else {
                break;
            };
            if grants.is_empty() {
                if probe.is_some() {
                    continue;
                }
                break;
            }
            let round = self.start_grants(grants, probe, &mut plan).await;
            spawned += round.spawned;
            left = left.saturating_sub(round.used);
            if round.stop {
                break;
            }
        }
        spawned
    }

    /// Claims up to `want` cards the filter admits; `None` when the board failed.
    async fn claim_batch(&mut self, want: usize, filter: &ClaimFilter) -> Option<Vec<ClaimGrant>> {
        let locks: Vec<String> = (0..want)
            .map(|_| self.ports.supervisor.new_claim_lock())
            .collect();
        let claimed = self
            .ports
            .board
            .claim_ready_batch(self.settings.ttl_seconds, &locks, filter)
            .await;
        claimed.map_err(|error| self.board_trouble(&error)).ok()
    }

    /// Which routes may claim this tick, as the walls and the agents' own
    /// limits say (said in the log); `None` when the walls cannot be read.
    async fn plan_claims(&mut self, running: &[RunningWorker]) -> Option<ClaimPlan> {
        let walls = match self.ports.board.walls().await {
            Ok(walls) => walls,
            Err(error) => {
                // Fail closed: a wall nobody can read might hold every card.
                self.board_trouble(&error);
                return None;
            }
        };
        let running_runs: BTreeSet<i64> =
            running.iter().map(|worker| worker.claim.run_id).collect();
        let now = self.ports.clock.now();
        let mut plan = ClaimPlan {
            room: self.room_per_agent(),
            ..ClaimPlan::default()
        };
        let mut held = BTreeMap::new();
        let routes = self.settings.routes.keys();
        for route in routes.filter(|route| plan.room.get(*route) != Some(&0)) {
            let scopes = self.routing.scopes.get(route).cloned().unwrap_or_default();
            match gate(&walls, &scopes, &running_runs, now) {
                Gate::Open => {
                    plan.open.insert(route.clone());
                }
                Gate::Held { until } => {
                    held.insert(route.clone(), until);
                }
                Gate::Probe => {
                    let probed = probed_walls(&walls, &scopes, now);
                    let scopes = probed.into_iter().map(|wall| wall.scope.clone());
                    plan.probes.push((route.clone(), scopes.collect()));
                }
            }
        }
        self.note_plan(&plan, held, now);
        Some(plan)
    }

    /// Room per agent under its own limit, counting its runs on the board.
    pub(super) fn room_per_agent(&self) -> BTreeMap<String, usize> {
        let mut room = BTreeMap::new();
        for (route, agent) in &self.settings.routes {
            if let Some(limit) = agent.max_in_progress {
                let runs = self.routing.run_routes.values();
                let runs = runs.filter(|run_route| *run_route == route).count();
                room.insert(route.clone(), limit.saturating_sub(runs));
            }
        }
        room
    }

    /// Tells the log the plan, and each wall that newly holds a route.
    fn note_plan(&mut self, plan: &ClaimPlan, held: BTreeMap<String, i64>, now: i64) {
        let label = |routes: &mut dyn Iterator<Item = &String>| {
            routes
                .map(|route| route_label(route).to_owned())
                .collect::<Vec<_>>()
        };
        let full = plan.room.iter().filter(|(_, left)| **left == 0);
        self.note(DispatchEvent::ClaimPlan {
            open: label(&mut plan.open.iter()),
            walled: label(&mut held.keys()),
            probing: label(&mut plan.probes.iter().map(|(route, _)| route)),
            at_their_limit: label(&mut full.map(|(route, _)| route)),
        });
        for (route, until) in &held {
            if self.routing.held.get(route) != Some(until) {
                self.note(DispatchEvent::WallHeld {
                    route: route_label(route).to_owned(),
                    until: *until,
                    for_seconds: until.saturating_sub(now).max(0),
                });
            }
        }
        self.routing.held = held;
    }

    /// Starts the workers of one claim call's grants.
    async fn start_grants(
        &mut self,
        grants: Vec<ClaimGrant>,
        probe: Option<Vec<String>>,
        plan: &mut ClaimPlan,
    ) -> Round {
        let mut round = Round::default();
        let mut grants = grants.into_iter();
        while let Some(grant) = grants.next() {
            match self.start_grant(grant, probe.clone(), plan).await {
                Started::Spawned => {
                    (round.spawned, round.used) = (round.spawned + 1, round.used + 1)
                }
                Started::Skipped => round.used += 1,
                Started::Refused => {}
                Started::Stop => {
                    for rest in grants {
                        let reason = "claiming stopped before its worker started".to_owned();
                        self.release(&rest.claim, Release::NotStarted { reason })
                            .await;
                    }
                    round.stop = true;
                    break;
                }
            }
        }
        round
    }

    /// Starts the worker of one claimed card: its agent, its probe record,
    /// the leftovers of its earlier runs, the spawn.
    async fn start_grant(
        &mut self,
        grant: ClaimGrant,
        probe: Option<Vec<String>>,
        plan: &mut ClaimPlan,
    ) -> Started {
        let claim = grant.claim;
        let Some(route) = self.route_of(grant.assignee.as_deref()) else {
            // The filter admitted a card no agent serves: never spawn it.
            let reason = "no agent serves its assignee".to_owned();
            self.release(&claim, Release::NotStarted { reason }).await;
            return Started::Skipped;
        };
        if let Some(scopes) = probe
            && let Some(refused) = self.start_wall_probe(&claim, scopes).await
        {
            return refused;
        }
        self.routing.run_routes.insert(claim.run_id, route.clone());
        if let Some(left) = plan.room.get_mut(&route) {
            *left = left.saturating_sub(1);
            if *left == 0 {
                plan.open.remove(&route);
            }
        }
        if grant.rerun && !self.ports.supervisor.sweep_earlier_runs(&claim).await {
            let reason = "a process of an earlier run of this card would not die".to_owned();
            self.release(&claim, Release::NotStarted { reason }).await;
            return Started::Skipped;
        }
        match self.renew_aged_claim(&claim, grant.claim_expires).await {
            Ok(true) => {}
            Ok(false) => return Started::Skipped,
            Err(error) => {
                self.board_trouble(&error);
                let reason = "its aged lease could not be renewed".to_owned();
                self.release(&claim, Release::NotStarted { reason }).await;
                return Started::Stop;
            }
        }
        let process = match self
            .ports
            .supervisor
            .spawn(&claim, grant.goal_mode, &route)
            .await
        {
            Ok(process) => process,
            Err(fault) => {
                let reason = format!("the worker could not be started: {fault}");
                self.release(&claim, Release::NotStarted { reason }).await;
                self.halt(fault);
                return Started::Stop;
            }
        };
        self.note(DispatchEvent::Spawned {
            task_id: claim.task_id.clone(),
            title: grant.title,
            run_id: claim.run_id,
            pid: process.pid,
        });
        self.children.insert(
            process.pid,
            Child {
                claim: claim.clone(),
                process: process.clone(),
                settled_since_ms: None,
            },
        );
        match self.ports.board.record_spawn(&claim, &process).await {
            Ok(()) => {}
            Err(BoardError::LeaseLost { .. }) => {
                // The claim moved on between the claim and the spawn; unless
                // the worker was quick enough to settle the card by its own
                // terminal call, and exits by itself (one that lingers is
                // stopped after the settle window, as any settled worker).
                match self.ports.board.run_status(&claim).await {
                    Ok(RunStatus::Done | RunStatus::Blocked) => {}
                    _ => self.stop(&claim, &process, SignalReason::Fenced).await,
                }
            }
            Err(error) => self.board_trouble(&error),
        }
        Started::Spawned
    }
}

impl Dispatcher {
    /// Records that this claim's run probes its agent's wall; what the start
    /// came to instead when the probe cannot be this run's.
    async fn start_wall_probe(&mut self, claim: &Claim, scopes: Vec<String>) -> Option<Started> {
        match self.ports.board.start_probe(claim, &scopes).await {
            Ok(true) => {}
            Ok(false) => {
                // Another dispatcher's probe got there first (or the
                // wall was re-armed): the wall stays shut for this one.
                let reason = "another run probes its wall".to_owned();
                self.release(claim, Release::NotStarted { reason }).await;
                return Some(Started::Refused);
            }
            Err(error) => {
                self.board_trouble(&error);
                let reason = "its wall probe could not be recorded".to_owned();
                self.release(claim, Release::NotStarted { reason }).await;
                return Some(Started::Stop);
            }
        }
        self.note(DispatchEvent::WallProbe {
            task_id: claim.task_id.clone(),
            scopes,
        });
        None
    }

    /// Renews a claim that aged while this dispatcher was slow to start its
    /// worker (a stall, a long sweep of earlier runs), so that the worker
    /// starts with at least two thirds of a lease. Otherwise the renewal
    /// would wait for the next tick, and by then another host may have
    /// watched the lease lapse and released the card as stale, charging it
    /// for its dispatcher's delay. False when the claim moved on (the card
    /// is someone else's now: nothing to release, nothing to start).
    async fn renew_aged_claim(&mut self, claim: &Claim, expires: i64) -> Result<bool, BoardError> {
        let ttl = self.settings.ttl_seconds;
        let now = self.ports.clock.now();
        if expires.saturating_sub(now) >= ttl.saturating_mul(2) / 3 {
            return Ok(true);
        }
        let record =
            lease_expired(Some(expires), now).then_some(("claim_extended", "worker_starting"));
        self.ports
            .board
            .extend_lease(claim, now.saturating_add(ttl), record)
            .await
    }
}

/// Which routes may claim this tick.
#[derive(Debug, Default)]
struct ClaimPlan {
    /// Routes no wall holds.
    open: BTreeSet<String>,
    /// Walled routes whose reset came, with the scopes one card of each
    /// probes.
    probes: Vec<(String, Vec<String>)>,
    /// Room per agent under its own limit (agents that have one).
    room: BTreeMap<String, usize>,
}

/// What one claim call's grants came to.
#[derive(Debug, Default)]
struct Round {
    /// Workers started.
    spawned: usize,
    /// Slots used (a card released unstarted uses its slot, unless a
    /// probe the board refused).
    used: usize,
    /// Claiming stops for this tick.
    stop: bool,
}

/// What starting one claimed card came to.
enum Started {
    Spawned,
    /// Released unstarted; claiming goes on.
    Skipped,
    /// Released unstarted without using its room (a probe the board
    /// refused): claiming goes on, with the room for another card.
    Refused,
    /// Released unstarted; claiming stops for this tick.
    Stop,
}
