//! A board in memory, with the same semantics as the SQLite board: it must
//! pass the same contract suite.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use kanban_core::lease::{LeaseView, RunLease, TaskLease, evaluate_lease};
use kanban_core::{
    Board, BoardAdmin, BoardError, Booking, BookingInput, BookingKind, Claim, ClaimGrant, Clock,
    DispatchBoard, EventRecord, ExitReport, ExitWitness, NewTask, NotLive, ProofIdentity,
    RunRecord, RunStatus, RunningWorker, TaskRecord, TaskStatus, TaskView, WorkerResult,
    book_worker_exit,
};
use serde_json::{Value, json};

#[derive(Debug, Default)]
struct State {
    tasks: Vec<TaskRecord>,
    idempotency: Vec<(String, String)>,
    links: Vec<(String, String)>,
    runs: Vec<RunRecord>,
    events: Vec<EventRecord>,
    comments: Vec<(String, String, String)>,
    next_task: u64,
}

impl State {
    fn task(&self, id: &str) -> Option<&TaskRecord> {
        self.tasks.iter().find(|task| task.id == id)
    }

    fn task_mut(&mut self, id: &str) -> Option<&mut TaskRecord> {
        self.tasks.iter_mut().find(|task| task.id == id)
    }

    fn run_mut(&mut self, id: i64) -> Option<&mut RunRecord> {
        self.runs.iter_mut().find(|run| run.id == id)
    }

    fn event(&mut self, task_id: &str, run_id: Option<i64>, kind: &str, payload: Value, now: i64) {
        let id = self.events.len() as i64 + 1;
        self.events.push(EventRecord {
            id,
            task_id: task_id.to_owned(),
            run_id,
            kind: kind.to_owned(),
            payload,
            created_at: now,
        });
    }

    /// Puts a card back in line (ready, or todo while a parent is open) with
    /// its failure count reset, as an unblock or an operator reclaim does.
    fn requeue(&mut self, task_id: &str) -> TaskStatus {
        let status = if self.parents_done(task_id) {
            TaskStatus::Ready
        } else {
            TaskStatus::Todo
        };
        let task = self.task_mut(task_id).unwrap();
        task.status = status;
        task.consecutive_failures = 0;
        status
    }

    fn parents_done(&self, id: &str) -> bool {
        self.links
            .iter()
            .filter(|(_, child)| child == id)
            .all(|(parent, _)| {
                self.task(parent)
                    .is_some_and(|p| matches!(p.status, TaskStatus::Done | TaskStatus::Archived))
            })
    }

    fn lease_view(&self, task_id: &str, identity: ProofIdentity) -> LeaseView {
        let Some(task) = self.task(task_id) else {
            return LeaseView::default();
        };
        let run = task
            .current_run_id
            .and_then(|id| self.runs.iter().find(|run| run.id == id));
        let newest_bound = match identity {
            ProofIdentity::BoundOwner(_) => self
                .events
                .iter()
                .rev()
                .find(|event| event.task_id == task_id && event.kind == "worker_bound")
                .map(|event| {
                    (
                        event.payload["pid"].as_i64().unwrap_or(-1),
                        event.payload["claim_lock"]
                            .as_str()
                            .unwrap_or("")
                            .to_owned(),
                    )
                }),
            _ => None,
        };
        LeaseView {
            task: Some(TaskLease {
                status: task.status.as_str().to_owned(),
                worker_pid: task.worker_pid,
                current_run_id: task.current_run_id,
                claim_lock: task.claim_lock.clone(),
                claim_expires: task.claim_expires,
            }),
            run: run.map(|run| RunLease {
                ended_at: run.ended_at,
                worker_pid: run.worker_pid,
                claim_expires: run.claim_expires,
            }),
            newest_bound,
        }
    }

    /// The fence of every worker write: on failure nothing changes but a
    /// `stale_write_rejected` event.
    fn fence(&mut self, claim: &Claim, action: &str, now: i64) -> Result<(), BoardError> {
        let view = self.lease_view(&claim.task_id, ProofIdentity::AnyProcess);
        let verdict = evaluate_lease(
            &view,
            &claim.run_id.to_string(),
            &claim.claim_lock,
            ProofIdentity::AnyProcess,
            now,
        );
        if let Err(reason) = verdict {
            if self.task(&claim.task_id).is_some() {
                self.event(
                    &claim.task_id,
                    Some(claim.run_id),
                    "stale_write_rejected",
                    json!({"action": action, "run_id": claim.run_id, "claim_lock": claim.claim_lock, "reason": reason.code()}),
                    now,
                );
            }
            return Err(BoardError::LeaseLost {
                task_id: claim.task_id.clone(),
                reason,
            });
        }
        Ok(())
    }

    fn close_run(
        &mut self,
        task_id: &str,
        status: &str,
        outcome: &str,
        summary: Option<&str>,
        error: Option<&str>,
        now: i64,
    ) {
        let run_id = self.task(task_id).and_then(|task| task.current_run_id);
        if let Some(run) = run_id.and_then(|id| self.run_mut(id))
            && run.ended_at.is_none()
        {
            run.ended_at = Some(now);
            run.status = status.to_owned();
            run.outcome = Some(outcome.to_owned());
            run.summary = summary.map(str::to_owned);
            run.error = error.map(str::to_owned);
        }
        if let Some(task) = self.task_mut(task_id) {
            task.current_run_id = None;
            task.claim_lock = None;
            task.claim_expires = None;
            task.worker_pid = None;
        }
    }
}

/// A board held in memory. Cheap to clone; clones share the board.
#[derive(Clone)]
pub struct InMemoryBoard {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for InMemoryBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryBoard").finish_non_exhaustive()
    }
}

/// The `db` coordinate of claims on an in-memory board.
pub const MEMORY_DB: &str = ":memory:";

impl InMemoryBoard {
    /// An empty board reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            clock,
        }
    }

    /// Sets both lease expiries of a task's current run, as a test hook.
    pub fn set_lease_expiry(&self, task_id: &str, expires: i64) {
        let mut state = self.state.lock().unwrap();
        let run_id = state.task(task_id).and_then(|task| task.current_run_id);
        if let Some(task) = state.task_mut(task_id) {
            task.claim_expires = Some(expires);
        }
        if let Some(run) = run_id.and_then(|id| state.run_mut(id)) {
            run.claim_expires = Some(expires);
        }
    }

    fn now(&self) -> i64 {
        self.clock.now()
    }

    fn claim_in(
        state: &mut State,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
        now: i64,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let task = state
            .task(task_id)
            .ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()))?;
        if task.status != TaskStatus::Ready || task.claim_lock.is_some() {
            return Ok(None);
        }
        if !state.parents_done(task_id) {
            state.task_mut(task_id).unwrap().status = TaskStatus::Todo;
            state.event(
                task_id,
                None,
                "claim_rejected",
                json!({"reason": "parents_not_done"}),
                now,
            );
            return Ok(None);
        }
        let expires = now + ttl_seconds.max(1);
        let run_id = state.runs.len() as i64 + 1;
        state.runs.push(RunRecord {
            id: run_id,
            task_id: task_id.to_owned(),
            status: "running".to_owned(),
            claim_lock: Some(claim_lock.to_owned()),
            claim_expires: Some(expires),
            worker_pid: None,
            worker_started_at: None,
            hold_until: None,
            started_at: now,
            ended_at: None,
            outcome: None,
            summary: None,
            error: None,
        });
        let task = state.task_mut(task_id).unwrap();
        task.status = TaskStatus::Running;
        task.claim_lock = Some(claim_lock.to_owned());
        task.claim_expires = Some(expires);
        task.current_run_id = Some(run_id);
        state.event(
            task_id,
            Some(run_id),
            "claimed",
            json!({"lock": claim_lock, "expires": expires, "run_id": run_id, "ttl": ttl_seconds.max(1)}),
            now,
        );
        Ok(Some(ClaimGrant {
            claim: Claim {
                task_id: task_id.to_owned(),
                db: MEMORY_DB.to_owned(),
                run_id,
                claim_lock: claim_lock.to_owned(),
                board: None,
            },
            claim_expires: expires,
        }))
    }
}

#[async_trait]
impl Board for InMemoryBoard {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        let now = self.now();
        let state = self.state.lock().unwrap();
        let view = state.lease_view(&claim.task_id, identity);
        evaluate_lease(
            &view,
            &claim.run_id.to_string(),
            &claim.claim_lock,
            identity,
            now,
        )
    }

    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.fence(claim, "bind", now)?;
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "worker_bound",
            json!({"pid": pid, "claim_lock": claim.claim_lock}),
            now,
        );
        Ok(())
    }

    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let owned = state.runs.iter().any(|run| {
            run.id == claim.run_id
                && run.task_id == claim.task_id
                && run.claim_lock.as_deref() == Some(&claim.claim_lock)
        });
        if !owned {
            return Err(BoardError::LeaseLost {
                task_id: claim.task_id.clone(),
                reason: NotLive::RunNotFound,
            });
        }
        let payload =
            serde_json::to_value(result).map_err(|e| BoardError::Storage(e.to_string()))?;
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "worker_result",
            payload,
            now,
        );
        Ok(())
    }

    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        let state = self.state.lock().unwrap();
        let task = state
            .task(&claim.task_id)
            .ok_or_else(|| BoardError::TaskNotFound(claim.task_id.clone()))?;
        let run = state
            .runs
            .iter()
            .find(|run| run.id == claim.run_id && run.task_id == claim.task_id);
        Ok(match run {
            Some(run) if run.ended_at.is_none() => {
                if task.status == TaskStatus::Running && task.current_run_id == Some(run.id) {
                    RunStatus::Running
                } else {
                    RunStatus::Superseded
                }
            }
            Some(run) => match run.outcome.as_deref() {
                Some("completed") => RunStatus::Done,
                Some("blocked") => RunStatus::Blocked,
                _ => RunStatus::Superseded,
            },
            None => RunStatus::Superseded,
        })
    }

    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.fence(claim, "heartbeat", now)?;
        let ttl = state
            .events
            .iter()
            .rev()
            .find(|e| e.kind == "claimed" && e.run_id == Some(claim.run_id))
            .and_then(|e| e.payload["ttl"].as_i64())
            .unwrap_or(kanban_core::DEFAULT_CLAIM_TTL_SECONDS);
        let expires = now + ttl;
        let task = state.task_mut(&claim.task_id).unwrap();
        task.claim_expires = Some(expires);
        let run = state.run_mut(claim.run_id).unwrap();
        run.claim_expires = Some(expires);
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "heartbeat",
            json!({"note": note, "claim_expires": expires}),
            now,
        );
        Ok(expires)
    }

    async fn complete(
        &self,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.fence(claim, "complete", now)?;
        state.close_run(
            &claim.task_id,
            "done",
            "completed",
            Some(summary),
            None,
            now,
        );
        let task = state.task_mut(&claim.task_id).unwrap();
        task.status = TaskStatus::Done;
        task.result = Some(result.unwrap_or_else(|| summary.to_owned()));
        task.consecutive_failures = 0;
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "completed",
            json!({"summary": summary}),
            now,
        );
        Ok(())
    }

    async fn block(&self, claim: &Claim, reason: &str) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.fence(claim, "block", now)?;
        state.close_run(
            &claim.task_id,
            "blocked",
            "blocked",
            Some(reason),
            None,
            now,
        );
        state.task_mut(&claim.task_id).unwrap().status = TaskStatus::Blocked;
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "blocked",
            json!({"reason": reason}),
            now,
        );
        Ok(())
    }

    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.fence(claim, "comment", now)?;
        state
            .comments
            .push((claim.task_id.clone(), author.to_owned(), text.to_owned()));
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "commented",
            json!({"author": author}),
            now,
        );
        Ok(())
    }

    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: Value,
    ) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.fence(claim, "append_event", now)?;
        state.event(&claim.task_id, Some(claim.run_id), kind, payload, now);
        Ok(())
    }
}

#[async_trait]
impl BoardAdmin for InMemoryBoard {
    async fn create_task(&self, new: &NewTask) -> Result<String, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        if new.title.trim().is_empty() {
            return Err(BoardError::InvalidInput(
                "a task needs a non-blank title".to_owned(),
            ));
        }
        if let Some(key) = &new.idempotency_key
            && let Some((_, id)) = state.idempotency.iter().find(|(k, id)| {
                k == key
                    && state
                        .task(id)
                        .is_some_and(|t| t.status != TaskStatus::Archived)
            })
        {
            return Ok(id.clone());
        }
        for parent in &new.parents {
            if state.task(parent).is_none() {
                return Err(BoardError::TaskNotFound(parent.clone()));
            }
        }
        state.next_task += 1;
        let id = format!("t_{:08x}", state.next_task);
        let parents_open = new
            .parents
            .iter()
            .any(|p| state.task(p).is_some_and(|t| t.status != TaskStatus::Done));
        let status = if new.start_blocked {
            TaskStatus::Blocked
        } else if parents_open {
            TaskStatus::Todo
        } else {
            TaskStatus::Ready
        };
        state.tasks.push(TaskRecord {
            id: id.clone(),
            title: new.title.clone(),
            body: new.body.clone(),
            assignee: new.assignee.clone(),
            status,
            priority: new.priority,
            created_at: now,
            claim_lock: None,
            claim_expires: None,
            current_run_id: None,
            worker_pid: None,
            goal_mode: new.goal_mode,
            goal_max_turns: new.goal_max_turns,
            max_retries: new.max_retries,
            consecutive_failures: 0,
            result: None,
        });
        for parent in &new.parents {
            state.links.push((parent.clone(), id.clone()));
        }
        if let Some(key) = &new.idempotency_key {
            state.idempotency.push((key.clone(), id.clone()));
        }
        state.event(
            &id,
            None,
            "created",
            json!({"status": status.as_str(), "parents": new.parents, "assignee": new.assignee}),
            now,
        );
        match status {
            TaskStatus::Blocked => state.event(
                &id,
                None,
                "blocked",
                json!({"reason": "initial_status"}),
                now,
            ),
            TaskStatus::Todo => state.event(
                &id,
                None,
                "dependency_wait",
                json!({"reason": "parent_not_done"}),
                now,
            ),
            _ => {}
        }
        Ok(id)
    }

    async fn claim_task(
        &self,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        Self::claim_in(&mut state, task_id, ttl_seconds, claim_lock, now)
    }

    async fn claim_next(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let mut candidates: Vec<(i64, i64, usize, String)> = state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.status == TaskStatus::Ready && t.claim_lock.is_none())
            .map(|(index, t)| (-t.priority, t.created_at, index, t.id.clone()))
            .collect();
        candidates.sort();
        for (_, _, _, id) in candidates {
            if let Some(grant) = Self::claim_in(&mut state, &id, ttl_seconds, claim_lock, now)? {
                return Ok(Some(grant));
            }
        }
        Ok(None)
    }

    async fn unblock(&self, task_id: &str) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let task = state
            .task(task_id)
            .ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()))?;
        if task.status != TaskStatus::Blocked {
            return Err(BoardError::InvalidTransition {
                task_id: task_id.to_owned(),
                status: task.status.as_str().to_owned(),
                action: "unblock",
            });
        }
        let status = state.requeue(task_id);
        state.event(
            task_id,
            None,
            "unblocked",
            json!({"status": status.as_str()}),
            now,
        );
        Ok(())
    }

    async fn reclaim(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let task = state
            .task(task_id)
            .ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()))?;
        if task.status != TaskStatus::Running {
            return Err(BoardError::InvalidTransition {
                task_id: task_id.to_owned(),
                status: task.status.as_str().to_owned(),
                action: "reclaim",
            });
        }
        let (lock, run_id) = (task.claim_lock.clone(), task.current_run_id);
        let error = format!("manual_reclaim: {reason}");
        state.close_run(task_id, "reclaimed", "reclaimed", None, Some(&error), now);
        let status = state.requeue(task_id);
        state.event(
            task_id,
            run_id,
            "reclaimed",
            json!({"manual": true, "reason": reason, "prev_lock": lock, "status": status.as_str()}),
            now,
        );
        Ok(())
    }

    async fn release_stale_claims(&self, failure_limit: u32) -> Result<Vec<String>, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let stale: Vec<(String, Option<String>, Option<i64>)> = state
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Running && t.claim_expires.is_some_and(|e| e < now))
            .map(|t| (t.id.clone(), t.claim_lock.clone(), t.current_run_id))
            .collect();
        for (id, lock, run_id) in &stale {
            let error = format!("stale_lock={}", lock.as_deref().unwrap_or(""));
            state.close_run(id, "reclaimed", "reclaimed", None, Some(&error), now);
            let task = state.task_mut(id).unwrap();
            task.consecutive_failures += 1;
            let failures = task.consecutive_failures;
            let blocks = failures >= task.max_retries.unwrap_or(failure_limit).max(1);
            task.status = if blocks {
                TaskStatus::Blocked
            } else {
                TaskStatus::Ready
            };
            state.event(
                id,
                *run_id,
                "reclaimed",
                json!({"stale_lock": lock, "now": now, "failures": failures, "blocked": blocks}),
                now,
            );
            if blocks {
                state.event(
                    id,
                    *run_id,
                    "gave_up",
                    json!({"trigger": "reclaimed", "failures": failures}),
                    now,
                );
            }
        }
        Ok(stale.into_iter().map(|(id, _, _)| id).collect())
    }

    async fn promote_ready(&self) -> Result<usize, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let promotable: Vec<String> = state
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Todo && state.parents_done(&t.id))
            .map(|t| t.id.clone())
            .collect();
        for id in &promotable {
            state.task_mut(id).unwrap().status = TaskStatus::Ready;
            state.event(id, None, "promoted", Value::Null, now);
        }
        Ok(promotable.len())
    }

    async fn show_task(&self, task_id: &str) -> Result<TaskView, BoardError> {
        let state = self.state.lock().unwrap();
        let task = state
            .task(task_id)
            .cloned()
            .ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()))?;
        let runs = state
            .runs
            .iter()
            .filter(|r| r.task_id == task_id)
            .cloned()
            .collect();
        let events = state
            .events
            .iter()
            .filter(|e| e.task_id == task_id)
            .cloned()
            .collect();
        Ok(TaskView { task, runs, events })
    }

    async fn list_tasks(&self, status: Option<TaskStatus>) -> Result<Vec<TaskRecord>, BoardError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .tasks
            .iter()
            .filter(|t| status.is_none_or(|s| t.status == s))
            .cloned()
            .collect())
    }

    async fn recent_events(&self, limit: usize) -> Result<Vec<EventRecord>, BoardError> {
        let state = self.state.lock().unwrap();
        let skip = state.events.len().saturating_sub(limit);
        Ok(state.events[skip..].to_vec())
    }

    async fn booked_exit_code(&self, claim: &Claim) -> Result<i32, BoardError> {
        Ok(self
            .booked_result(claim)
            .await?
            .map_or(1, |result| result.exit_code))
    }
}

impl State {
    fn violation_streak(&self, task_id: &str) -> u32 {
        let mut streak = 0;
        for run in self
            .runs
            .iter()
            .rev()
            .filter(|r| r.task_id == task_id && r.ended_at.is_some())
        {
            match run.outcome.as_deref() {
                Some("rate_limited") => continue,
                Some("protocol_violation") => streak += 1,
                _ => break,
            }
        }
        streak
    }

    fn cooling_down(&self, task_id: &str, since: i64, now: i64) -> bool {
        self.runs
            .iter()
            .rev()
            .find(|r| r.task_id == task_id)
            .is_some_and(|r| {
                r.outcome.as_deref() == Some("rate_limited")
                    && (r.ended_at.is_some_and(|at| at > since)
                        || r.hold_until.is_some_and(|until| until > now))
            })
    }
}

#[async_trait]
impl DispatchBoard for InMemoryBoard {
    async fn running_workers(&self) -> Result<Vec<RunningWorker>, BoardError> {
        let state = self.state.lock().unwrap();
        let mut workers: Vec<RunningWorker> = state
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Running)
            .filter_map(|t| {
                let run = state.runs.iter().find(|r| Some(r.id) == t.current_run_id)?;
                Some(RunningWorker {
                    claim: Claim {
                        task_id: t.id.clone(),
                        db: MEMORY_DB.to_owned(),
                        run_id: run.id,
                        claim_lock: t.claim_lock.clone()?,
                        board: None,
                    },
                    worker_pid: t.worker_pid,
                    worker_started_at: run.worker_started_at,
                    claim_expires: t.claim_expires,
                    last_heartbeat_at: None,
                })
            })
            .collect();
        workers.sort_by_key(|w| w.claim.run_id);
        Ok(workers)
    }

    async fn count_running(&self) -> Result<usize, BoardError> {
        Ok(self
            .state
            .lock()
            .unwrap()
            .tasks
            .iter()
            .filter(|t| t.status == TaskStatus::Running)
            .count())
    }

    async fn claim_next_ready(
        &self,
        ttl_seconds: i64,
        claim_lock: &str,
        rate_limit_cooldown: i64,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let mut candidates: Vec<(i64, i64, usize, String)> = state
            .tasks
            .iter()
            .enumerate()
            .filter(|(_, t)| t.status == TaskStatus::Ready && t.claim_lock.is_none())
            .filter(|(_, t)| !state.cooling_down(&t.id, now - rate_limit_cooldown, now))
            .map(|(index, t)| (-t.priority, t.created_at, index, t.id.clone()))
            .collect();
        candidates.sort();
        for (_, _, _, id) in candidates {
            if let Some(grant) = Self::claim_in(&mut state, &id, ttl_seconds, claim_lock, now)? {
                return Ok(Some(grant));
            }
        }
        Ok(None)
    }

    async fn record_spawn(
        &self,
        claim: &Claim,
        pid: u32,
        started_at: Option<i64>,
    ) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let holds = state.task(&claim.task_id).is_some_and(|t| {
            t.status == TaskStatus::Running
                && t.current_run_id == Some(claim.run_id)
                && t.claim_lock.as_deref() == Some(claim.claim_lock.as_str())
        });
        if !holds {
            return Err(BoardError::LeaseLost {
                task_id: claim.task_id.clone(),
                reason: NotLive::RunMoved { current: 0 },
            });
        }
        state.task_mut(&claim.task_id).unwrap().worker_pid = Some(i64::from(pid));
        let run = state.run_mut(claim.run_id).unwrap();
        run.worker_pid = Some(i64::from(pid));
        run.worker_started_at = started_at;
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "spawned",
            json!({"pid": pid, "started_at": started_at}),
            now,
        );
        Ok(())
    }

    async fn record_signal(&self, claim: &Claim, signal: i32) -> Result<(), BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            "worker_signalled",
            json!({"signal": signal}),
            now,
        );
        Ok(())
    }

    async fn extend_expired_lease(
        &self,
        claim: &Claim,
        expires: i64,
        kind: &str,
        reason: &str,
    ) -> Result<bool, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let matches = state.task(&claim.task_id).is_some_and(|t| {
            t.status == TaskStatus::Running
                && t.current_run_id == Some(claim.run_id)
                && t.claim_lock.as_deref() == Some(claim.claim_lock.as_str())
                && t.claim_expires.is_some_and(|e| e < now)
        });
        if matches {
            state.task_mut(&claim.task_id).unwrap().claim_expires = Some(expires);
            state.run_mut(claim.run_id).unwrap().claim_expires = Some(expires);
            state.event(
                &claim.task_id,
                Some(claim.run_id),
                kind,
                json!({"reason": reason, "claim_expires": expires}),
                now,
            );
        }
        Ok(matches)
    }

    async fn booked_result(&self, claim: &Claim) -> Result<Option<WorkerResult>, BoardError> {
        let state = self.state.lock().unwrap();
        Ok(state
            .events
            .iter()
            .rev()
            .find(|e| {
                e.task_id == claim.task_id
                    && e.kind == "worker_result"
                    && e.run_id == Some(claim.run_id)
            })
            .and_then(|e| serde_json::from_value::<WorkerResult>(e.payload.clone()).ok())
            .filter(|r| r.claim_lock == claim.claim_lock))
    }

    async fn book_exit(&self, claim: &Claim, report: &ExitReport) -> Result<Booking, BoardError> {
        let now = self.now();
        let mut state = self.state.lock().unwrap();
        let task = state
            .task(&claim.task_id)
            .cloned()
            .ok_or_else(|| BoardError::TaskNotFound(claim.task_id.clone()))?;
        let still_running = task.status == TaskStatus::Running
            && task.current_run_id == Some(claim.run_id)
            && task.claim_lock.as_deref() == Some(claim.claim_lock.as_str());
        let signalled_on_record = state.events.iter().any(|e| {
            e.task_id == claim.task_id
                && e.kind == "worker_signalled"
                && e.run_id == Some(claim.run_id)
        });
        let booking = book_worker_exit(BookingInput {
            witness: report.witness,
            still_running,
            signalled_by_dispatcher: report.signalled_by_dispatcher || signalled_on_record,
            violation_streak: state.violation_streak(&claim.task_id),
            consecutive_failures: task.consecutive_failures,
            failure_limit: task.max_retries.unwrap_or(report.default_failure_limit),
            violation_limit: task
                .max_retries
                .unwrap_or(kanban_core::PROTOCOL_VIOLATION_LIMIT),
        });
        let (exit_code, signal) = match report.witness {
            ExitWitness::Code(code) => (Some(code), None),
            ExitWitness::Signal(signal) => (None, Some(signal)),
            ExitWitness::Unknown => (None, None),
        };
        if booking.kind == BookingKind::Settled {
            state.event(&claim.task_id, Some(claim.run_id), "worker_exited", json!({"kind": "settled", "exit_code": exit_code, "signal": signal, "source": report.source}), now);
            return Ok(booking);
        }
        let error = format!("worker booked as {}", booking.kind.as_str());
        let hold_until = report
            .retry_after_seconds
            .filter(|_| booking.cooldown)
            .map(|s| now.saturating_add(s as i64));
        state.close_run(
            &claim.task_id,
            booking.kind.as_str(),
            booking.kind.as_str(),
            None,
            Some(&error),
            now,
        );
        if let Some(run) = state.run_mut(claim.run_id) {
            run.hold_until = hold_until;
        }
        let failures = task.consecutive_failures + u32::from(booking.counts_failure);
        let task = state.task_mut(&claim.task_id).unwrap();
        task.status = if booking.blocks {
            TaskStatus::Blocked
        } else {
            TaskStatus::Ready
        };
        task.consecutive_failures = failures;
        let payload = json!({
            "kind": booking.kind.as_str(), "exit_code": exit_code, "signal": signal, "source": report.source,
            "counted": booking.counts_failure, "failures": failures, "blocked": booking.blocks, "cooldown": booking.cooldown,
            "hold_until": hold_until,
            "output": report.output_tail,
        });
        state.event(
            &claim.task_id,
            Some(claim.run_id),
            booking.kind.as_str(),
            payload,
            now,
        );
        if booking.blocks {
            state.event(
                &claim.task_id,
                Some(claim.run_id),
                "gave_up",
                json!({"trigger": booking.kind.as_str(), "failures": failures, "sticky": true}),
                now,
            );
        }
        Ok(booking)
    }
}
