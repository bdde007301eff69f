//! Watching our workers and others' runs: renewing live leases, stopping
//! work that lost its claim or overran, escalating stops.

use std::collections::BTreeSet;

use crate::booking::SignalReason;
use crate::data::{BoardError, Claim, Release, RunStatus};

use crate::dispatcher::{
    DispatchEvent, Dispatcher, KILL_WAIT, RunningWorker, SIGNAL_RECORD_ATTEMPTS, SIGTERM,
    StaleClaimAction, StopSignal, WorkerProcess, millis, stale_claim_action,
};

use crate::rules::lease_expired;

#[derive(Clone, Debug)]
pub(super) struct Child {
    pub(super) claim: Claim,
    pub(super) process: WorkerProcess,
    /// When the board first showed this child's run closed by its own
    /// terminal call (it is expected to exit by itself soon).
    pub(super) settled_since_ms: Option<u64>,
}

#[derive(Clone, Debug)]
pub(super) struct Stopping {
    pub(super) claim: Claim,
    pub(super) process: WorkerProcess,
    pub(super) reason: SignalReason,
    pub(super) since_ms: u64,
    pub(super) killed: bool,
    pub(super) deferred: bool,
}

/// What this dispatcher saw of a run, on its own monotonic clock: wall-clock
/// jumps must not make a healthy worker look silent or a live lease expired.
#[derive(Clone, Debug)]
pub(super) struct Watch {
    pub(super) first_seen_ms: u64,
    pub(super) heartbeat: Option<i64>,
    pub(super) heartbeat_seen_ms: u64,
    pub(super) expires: Option<i64>,
    pub(super) expires_seen_ms: u64,
}

impl Dispatcher {
    pub(super) fn observe(&mut self, running: &[RunningWorker], mono: u64) {
        let live: std::collections::BTreeSet<i64> =
            running.iter().map(|worker| worker.claim.run_id).collect();
        self.watches.retain(|run_id, _| live.contains(run_id));
        self.routing
            .run_routes
            .retain(|run_id, _| live.contains(run_id));
        for worker in running {
            if let Some(route) = self.route_of(worker.assignee.as_deref()) {
                self.routing
                    .run_routes
                    .entry(worker.claim.run_id)
                    .or_insert(route);
            }
        }
        for worker in running {
            let watch = self
                .watches
                .entry(worker.claim.run_id)
                .or_insert_with(|| Watch {
                    first_seen_ms: mono,
                    heartbeat: worker.last_heartbeat_at,
                    heartbeat_seen_ms: mono,
                    expires: worker.claim_expires,
                    expires_seen_ms: mono,
                });
            if watch.heartbeat != worker.last_heartbeat_at {
                watch.heartbeat = worker.last_heartbeat_at;
                watch.heartbeat_seen_ms = mono;
            }
            if watch.expires != worker.claim_expires {
                watch.expires = worker.claim_expires;
                watch.expires_seen_ms = mono;
            }
        }
    }

    /// True when another holder's lease ran out: expired by this
    /// dispatcher's wall clock, and unchanged for a whole lease on its own
    /// monotonic clock. A live holder's lease changes at least every two
    /// thirds of a lease (its worker's heartbeats, its dispatcher's
    /// renewals), so however the hosts' clocks disagree, only a holder that
    /// stopped renewing loses its claim.
    pub(super) fn lease_ran_out(&self, worker: &RunningWorker, now: i64, mono: u64) -> bool {
        if !lease_expired(worker.claim_expires, now) {
            return false;
        }
        let unchanged_ms = self
            .watches
            .get(&worker.claim.run_id)
            .map_or(0, |watch| mono.saturating_sub(watch.expires_seen_ms));
        let ttl_ms = u64::try_from(self.settings.ttl_seconds)
            .unwrap_or(0)
            .saturating_mul(1000);
        unchanged_ms >= ttl_ms
    }

    /// Seconds since `then` (a wall-clock time on the board) as far as
    /// this dispatcher can vouch for them: the wall clock's count, but never
    /// more than it watched the value itself on its own monotonic clock. A
    /// wall-clock jump, before or while it watches, cannot make time pass
    /// that did not; a dispatcher that just started stops nothing for an
    /// hour's silence before it saw that hour go by.
    pub(super) fn seconds_since(then: i64, seen_ms: u64, now: i64, mono: u64) -> i64 {
        let by_wall = now.saturating_sub(then);
        let watched = i64::try_from(mono.saturating_sub(seen_ms) / 1000).unwrap_or(i64::MAX);
        by_wall.min(watched)
    }

    /// Seconds the worker has been silent: since its last heartbeat, or its
    /// run's start when it never sent one.
    pub(super) fn silent_seconds(&self, worker: &RunningWorker, now: i64, mono: u64) -> i64 {
        let last = worker.last_heartbeat_at.unwrap_or(worker.run_started_at);
        let seen = self
            .watches
            .get(&worker.claim.run_id)
            .map_or(mono, |watch| watch.heartbeat_seen_ms);
        Self::seconds_since(last, seen, now, mono)
    }

    /// Seconds the run has run, measured the same careful way.
    pub(super) fn run_seconds(&self, worker: &RunningWorker, now: i64, mono: u64) -> i64 {
        let seen = self
            .watches
            .get(&worker.claim.run_id)
            .map_or(mono, |watch| watch.first_seen_ms);
        Self::seconds_since(worker.run_started_at, seen, now, mono)
    }

    pub(super) async fn fence_children(&mut self, running: &[RunningWorker], mono: u64) {
        // Only children the board no longer lists as running can have lost
        // their claim: the others cost no board read.
        let unlisted: Vec<u32> = self
            .children
            .iter()
            .filter(|(_, child)| !running.iter().any(|worker| worker.claim == child.claim))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in unlisted {
            let Some(child) = self.children.get(&pid).cloned() else {
                continue;
            };
            if self.stopping.contains_key(&i64::from(pid)) {
                continue;
            }
            let status = self.ports.board.run_status(&child.claim).await;
            let settle_window = millis(self.settings.grace);
            let fenced = match status {
                Ok(RunStatus::Running) => false,
                Ok(RunStatus::Done | RunStatus::Blocked) => {
                    // The worker's own terminal call closed the run: it exits
                    // by itself. Only one that lingers is stopped.
                    let since = *self
                        .children
                        .get_mut(&pid)
                        .map(|child| child.settled_since_ms.get_or_insert(mono))
                        .unwrap_or(&mut 0);
                    mono.saturating_sub(since) >= settle_window
                }
                Ok(RunStatus::Superseded) | Err(BoardError::TaskNotFound(_)) => true,
                Err(error) => {
                    self.board_trouble(&error);
                    false
                }
            };
            if fenced {
                self.stop(&child.claim, &child.process, SignalReason::Fenced)
                    .await;
            }
        }
    }

    /// Sends SIGTERM to a worker's group, recording why first.
    pub(super) async fn stop(
        &mut self,
        claim: &Claim,
        process: &WorkerProcess,
        reason: SignalReason,
    ) {
        let pid = i64::from(process.pid);
        let started_at = process.started_at;
        if self.stopping.contains_key(&pid) {
            return;
        }
        // Recorded before the signal: a dispatcher that books the exit later,
        // after this one is gone, must still know why it ended. A passing
        // board fault is retried; the stop goes ahead either way.
        if reason != SignalReason::Fenced {
            let mut last = None;
            for _ in 0..SIGNAL_RECORD_ATTEMPTS {
                match self.ports.board.record_signal(claim, SIGTERM, reason).await {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(error) => last = Some(error),
                }
            }
            if let Some(error) = last {
                self.board_trouble(&error);
            }
        }
        self.ports
            .supervisor
            .signal(pid, started_at, StopSignal::Terminate);
        self.note(DispatchEvent::Stopping {
            task_id: claim.task_id.clone(),
            pid,
            reason,
        });
        let since_ms = self.mono();
        self.stopping.insert(
            pid,
            Stopping {
                claim: claim.clone(),
                process: process.clone(),
                reason,
                since_ms,
                killed: false,
                deferred: false,
            },
        );
    }

    /// Moves every stop along: SIGKILL after the grace period; a worker that
    /// survives even that has its reclaim deferred. Returns the runs booked.
    pub(super) async fn escalate(&mut self, mono: u64) -> BTreeSet<i64> {
        let mut booked = BTreeSet::new();
        let grace = millis(self.settings.grace);
        let pids: Vec<i64> = self.stopping.keys().copied().collect();
        for pid in pids {
            let Some(stop) = self.stopping.get(&pid).cloned() else {
                continue;
            };
            let ours = u32::try_from(pid)
                .ok()
                .is_some_and(|pid| self.children.contains_key(&pid));
            let alive = ours || self.ports.supervisor.alive(pid, stop.process.started_at);
            if !alive {
                // Not ours, so nobody reaps it: book it from the board.
                self.stopping.remove(&pid);
                let seal = stop.process.seal_digest.clone();
                if self
                    .book_dead(&stop.claim, Some(stop.reason), seal.as_deref())
                    .await
                {
                    booked.insert(stop.claim.run_id);
                }
                continue;
            }
            let elapsed = mono.saturating_sub(stop.since_ms);
            if !stop.killed && elapsed >= grace {
                self.ports
                    .supervisor
                    .signal(pid, stop.process.started_at, StopSignal::Kill);
                self.ports.supervisor.sweep(&stop.claim).await;
                self.note(DispatchEvent::Killed {
                    task_id: stop.claim.task_id.clone(),
                    pid,
                });
                if let Some(entry) = self.stopping.get_mut(&pid) {
                    entry.killed = true;
                }
            } else if stop.killed && elapsed >= grace + millis(KILL_WAIT) {
                // It survived SIGKILL (a process in uninterruptible sleep):
                // its lease is kept alive so no other host takes the card
                // from under it, and the deferral is recorded once.
                let now = self.ports.clock.now();
                let record =
                    (!stop.deferred).then_some(("reclaim_deferred", "worker_survived_termination"));
                match self
                    .ports
                    .board
                    .extend_lease(
                        &stop.claim,
                        now.saturating_add(self.settings.ttl_seconds),
                        record,
                    )
                    .await
                {
                    Ok(_) if !stop.deferred => {
                        self.note(DispatchEvent::ReclaimDeferred {
                            task_id: stop.claim.task_id.clone(),
                            pid,
                        });
                        if let Some(entry) = self.stopping.get_mut(&pid) {
                            entry.deferred = true;
                        }
                    }
                    Ok(_) => {}
                    Err(error) => self.board_trouble(&error),
                }
            }
        }
        booked
    }

    /// Watches one running card; returns bookings made.
    pub(super) async fn watch_worker(
        &mut self,
        worker: &RunningWorker,
        now: i64,
        mono: u64,
    ) -> usize {
        let claim = &worker.claim;
        let child = self
            .children
            .values()
            .find(|child| child.claim == *claim)
            .map(|child| child.process.clone());
        let recorded = worker
            .worker_pid
            .or(child.as_ref().map(|process| i64::from(process.pid)));
        if recorded.is_some_and(|pid| self.stopping.contains_key(&pid)) {
            return 0;
        }
        if !self.host_local(claim) {
            return self.watch_foreign(worker, now, mono).await;
        }
        if let Some(process) = &child
            && worker.worker_pid.is_none()
        {
            // Our own worker whose spawn record failed: record it again.
            if let Err(error) = self.ports.board.record_spawn(claim, process).await {
                self.board_trouble(&error);
            }
        }
        let Some(pid) = recorded else {
            // Claimed, never spawned: its dispatcher died in between, or is
            // about to record the spawn.
            if self.ports.supervisor.claimer_gone(&claim.claim_lock)
                || self.lease_ran_out(worker, now, mono)
            {
                let reason = "its dispatcher stopped before starting a worker".to_owned();
                self.release(claim, Release::NotStarted { reason }).await;
            }
            return 0;
        };
        let ours = child.is_some();
        if !ours && u32::try_from(pid).is_ok_and(|pid| self.children.contains_key(&pid)) {
            // Our child of another run carries this pid: the recorded worker
            // is long gone.
            let seal = worker.seal_digest.as_deref();
            return usize::from(self.book_dead(claim, None, seal).await);
        }
        let process = child.unwrap_or_else(|| WorkerProcess {
            pid: u32::try_from(pid).unwrap_or(u32::MAX),
            started_at: worker.worker_started_at,
            seal_digest: worker.seal_digest.clone(),
        });
        if !self.ports.supervisor.alive(pid, process.started_at) {
            // Our own child is booked from its wait status once reaped (it
            // may have ended while this dispatcher was stalled); anyone
            // else's from what it left on the board.
            return if ours {
                0
            } else {
                let seal = worker.seal_digest.as_deref();
                usize::from(self.book_dead(claim, None, seal).await)
            };
        }
        let limit = worker
            .max_runtime_seconds
            .or(self.settings.max_runtime_seconds)
            .filter(|limit| *limit > 0);
        let grace = i64::try_from(self.settings.grace.as_secs()).unwrap_or(i64::MAX);
        if let Some(limit) = limit
            && self.run_seconds(worker, now, mono) > limit.saturating_add(grace)
        {
            self.stop(claim, &process, SignalReason::Overrun).await;
            return 0;
        }
        match stale_claim_action(true, Some(self.silent_seconds(worker, now, mono))) {
            StaleClaimAction::Terminate => {
                self.stop(claim, &process, SignalReason::Overrun).await;
            }
            StaleClaimAction::Extend => self.renew(worker, pid, now).await,
            StaleClaimAction::Release => {}
        }
        0
    }

    /// Watches another host's running card: its own dispatcher watches it.
    /// Once its lease has lapsed here too, its host is gone or cut off: a
    /// worker that booked its result is booked from it; a claim that never
    /// recorded a spawn is released uncounted; any other is released as
    /// stale, counted. Returns bookings made.
    pub(super) async fn watch_foreign(
        &mut self,
        worker: &RunningWorker,
        now: i64,
        mono: u64,
    ) -> usize {
        let claim = &worker.claim;
        if self.lease_ran_out(worker, now, mono) {
            if let Ok(Some(_)) = self.ports.board.booked_result(claim).await {
                let seal = worker.seal_digest.as_deref();
                return usize::from(self.book_dead(claim, None, seal).await);
            }
            let release = match worker.worker_pid {
                Some(_) => Release::Expired,
                None => Release::NotStarted {
                    reason: "its dispatcher never started a worker".to_owned(),
                },
            };
            self.release(claim, release).await;
        }
        0
    }

    /// Renews a live local worker's lease once less than two thirds of it
    /// is left (or it lapsed): a live worker never loses its claim to a
    /// lease that ran down while its agent was quiet, and observers on
    /// other hosts see its lease move at least every two thirds of a lease.
    pub(super) async fn renew(&mut self, worker: &RunningWorker, pid: i64, now: i64) {
        let ttl = self.settings.ttl_seconds;
        let left = worker
            .claim_expires
            .map_or(i64::MIN, |expires| expires.saturating_sub(now));
        if left >= ttl.saturating_mul(2) / 3 {
            return;
        }
        let lapsed = lease_expired(worker.claim_expires, now);
        let record = lapsed.then_some(("claim_extended", "worker_alive"));
        match self
            .ports
            .board
            .extend_lease(&worker.claim, now.saturating_add(ttl), record)
            .await
        {
            Ok(true) if lapsed => self.note(DispatchEvent::LeaseExtended {
                task_id: worker.claim.task_id.clone(),
                pid,
            }),
            Ok(_) => {}
            Err(error) => self.board_trouble(&error),
        }
    }
}
