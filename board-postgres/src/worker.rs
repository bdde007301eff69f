//! A worker's side of the board: the proof, and every write fenced by the
//! claim inside its own transaction.

use async_trait::async_trait;
use kanban_core::events;
use kanban_core::lease::{LeaseView, RunLease, TaskLease, evaluate_lease, required_coordinates};
use kanban_core::rules::{self, FailurePolicy, NewEvent, Overrun, RunRow};
use kanban_core::{
    Board, BoardError, Claim, NotLive, ProofIdentity, ProofRequest, RunStatus, WorkerResult,
};
use serde_json::Value;

use crate::conn::{Conn, TxError, col};
use crate::rows::{Read, append_event, apply, card_state, existing_card, fence};
use crate::{PgBoard, snapshot, transaction};

impl PgBoard {
    /// One fenced write of `claim` whose change is core's `rule`.
    async fn fenced(
        &self,
        claim: &Claim,
        action: &'static str,
        rule: impl Fn(&rules::CardState, i64) -> Option<rules::Transition> + Send + Sync,
    ) -> Result<(), BoardError> {
        transaction!(self, |tx, now| {
            fence(tx, claim, action, now).await?;
            let card = existing_card(tx, &claim.task_id).await?;
            if let Some(transition) = rule(&card, now) {
                apply(tx, &claim.task_id, &transition, now).await?;
            }
            Ok(())
        })
    }

    /// The lease proof as one read-only transaction: one snapshot of the
    /// card and its run, no lock taken, nothing written.
    pub async fn prove(
        &self,
        request: &ProofRequest,
        identity: ProofIdentity,
    ) -> Result<(), NotLive> {
        let (task_id, db, run_id, claim_lock) = required_coordinates(request)?;
        // A claim on another board is never proven here; the same board
        // spelled another way (`postgresql://`, a default port) is this one.
        let same = db == self.url()
            || crate::parse_url(db).is_ok_and(|url| crate::public_url(&url) == self.url());
        if !same {
            return Err(NotLive::BoardNotFound(db.to_owned()));
        }
        let now = self.clock.now();
        let view = async {
            let mut conn = self.pool.get().await?;
            proof_view(&mut conn, task_id, identity)
                .await
                .map_err(|error| self.fail(&error))
        }
        .await
        .map(|view| (view, now));
        match view {
            Ok((view, now)) => evaluate_lease(&view, run_id, claim_lock, identity, now),
            Err(error) => Err(NotLive::Unreadable(error.to_string())),
        }
    }
}

#[async_trait]
impl Board for PgBoard {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        self.prove(&ProofRequest::for_claim(claim), identity).await
    }

    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        let event = events::worker_bound(claim, pid);
        self.fenced(claim, "bind", move |_, _| {
            Some(rules::Transition {
                events: vec![event.clone()],
                ..rules::Transition::default()
            })
        })
        .await
    }

    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError> {
        // A result is a record of what happened, not a change of the card: it
        // is booked for the run the claim opened even after the lease lapsed,
        // so the dispatcher can read the exit code back.
        let payload =
            serde_json::to_value(result).map_err(|e| BoardError::Storage(e.to_string()))?;
        transaction!(self, |tx, now| {
            let owned: bool = tx
                .value(
                    "SELECT EXISTS (SELECT 1 FROM task_runs WHERE id = $1 AND task_id = $2 AND claim_lock = $3)",
                    &[&claim.run_id, &claim.task_id, &claim.claim_lock],
                )
                .await?;
            if !owned {
                return Err(BoardError::LeaseLost {
                    task_id: claim.task_id.clone(),
                    reason: NotLive::RunNotFound,
                }
                .into());
            }
            let event = NewEvent::new("worker_result", Some(claim.run_id), payload.clone());
            append_event(tx, &claim.task_id, &event, now).await?;
            Ok(())
        })
    }

    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        // A look, not a change: one snapshot, no row lock to wait for.
        let status = snapshot!(self, |tx, _now| {
            let card = card_state(tx, &claim.task_id, Read::ToLook).await?;
            let run = tx
                .query_opt(
                    "SELECT ended_at IS NOT NULL, outcome FROM task_runs WHERE id = $1 AND task_id = $2",
                    &[&claim.run_id, &claim.task_id],
                )
                .await?
                .map(|row| {
                    Ok::<_, tokio_postgres::Error>(RunRow {
                        ended: col(&row, 0)?,
                        outcome: col(&row, 1)?,
                    })
                })
                .transpose()?;
            Ok(card.map(|card| rules::run_status(&card, run.as_ref(), claim)))
        })?;
        status.ok_or_else(|| BoardError::TaskNotFound(claim.task_id.clone()))
    }

    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        transaction!(self, |tx, now| {
            fence(tx, claim, "heartbeat", now).await?;
            let ttl = run_ttl(tx, claim).await?;
            let expires = now.saturating_add(ttl);
            tx.execute(
                "UPDATE tasks SET claim_expires = $2, last_heartbeat_at = $3 WHERE id = $1",
                &[&claim.task_id, &expires, &now],
            )
            .await?;
            tx.execute(
                "UPDATE task_runs SET claim_expires = $2, last_heartbeat_at = $3 WHERE id = $1",
                &[&claim.run_id, &expires, &now],
            )
            .await?;
            let event = events::heartbeat(claim, note.as_deref(), expires);
            append_event(tx, &claim.task_id, &event, now).await?;
            Ok(expires)
        })
    }

    async fn complete(
        &self,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> Result<(), BoardError> {
        transaction!(self, |tx, now| {
            fence(tx, claim, "complete", now).await?;
            let transition = rules::complete(claim, summary, result.as_deref(), now);
            apply(tx, &claim.task_id, &transition, now).await?;
            // A recurring card's next occurrence, in the same commit.
            crate::admin::recur(tx, &claim.task_id, now).await
        })
    }

    async fn block(&self, claim: &Claim, reason: &str) -> Result<(), BoardError> {
        self.fenced(claim, "block", |_, _| Some(rules::block(claim, reason)))
            .await
    }

    async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError> {
        self.fenced(claim, "settle_overrun", |card, now| {
            rules::settle_overrun(card, claim, overrun, policy, now)
        })
        .await
    }

    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        transaction!(self, |tx, now| {
            fence(tx, claim, "comment", now).await?;
            tx.execute(
                "INSERT INTO task_comments (task_id, author, body, created_at) VALUES ($1, $2, $3, $4)",
                &[&claim.task_id, &author, &text, &now],
            )
            .await?;
            let event = events::commented(Some(claim.run_id), author);
            append_event(tx, &claim.task_id, &event, now).await?;
            Ok(())
        })
    }

    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: Value,
    ) -> Result<(), BoardError> {
        let event = NewEvent::new(kind, Some(claim.run_id), payload);
        self.fenced(claim, "append_event", move |_, _| {
            Some(rules::Transition {
                events: vec![event.clone()],
                ..rules::Transition::default()
            })
        })
        .await
    }
}

/// The rows a lease proof reads, in one statement inside one read-only
/// snapshot transaction, pipelined: one round trip.
async fn proof_view(
    conn: &mut Conn,
    task_id: &str,
    identity: ProofIdentity,
) -> Result<LeaseView, tokio_postgres::Error> {
    const PROOF: &str =
        "SELECT t.status, t.worker_pid, t.current_run_id, t.claim_lock, t.claim_expires,
            r.id, r.ended_at, r.worker_pid, r.claim_expires, NULL::jsonb
       FROM tasks t LEFT JOIN task_runs r ON r.id = t.current_run_id WHERE t.id = $1";
    const OWNED_PROOF: &str =
        "SELECT t.status, t.worker_pid, t.current_run_id, t.claim_lock, t.claim_expires,
            r.id, r.ended_at, r.worker_pid, r.claim_expires,
            (SELECT e.payload FROM task_events e WHERE e.task_id = t.id AND e.kind = 'worker_bound'
              ORDER BY e.id DESC LIMIT 1)
       FROM tasks t LEFT JOIN task_runs r ON r.id = t.current_run_id WHERE t.id = $1";
    let sql = match identity {
        ProofIdentity::BoundOwner(_) => OWNED_PROOF,
        _ => PROOF,
    };
    let row = conn
        .query_opt_alone(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
            sql,
            &[&task_id],
        )
        .await?;
    let Some(row) = row else {
        return Ok(LeaseView {
            task: None,
            run: None,
            newest_bound: None,
        });
    };
    let run = match col::<Option<i64>>(&row, 5)? {
        None => None,
        Some(_) => Some(RunLease {
            ended_at: col(&row, 6)?,
            worker_pid: col(&row, 7)?,
            claim_expires: col(&row, 8)?,
        }),
    };
    let newest_bound = col::<Option<Value>>(&row, 9)?.map(|payload| {
        (
            payload["pid"].as_i64().unwrap_or(-1),
            payload["claim_lock"].as_str().unwrap_or("").to_owned(),
        )
    });
    Ok(LeaseView {
        task: Some(TaskLease {
            status: col(&row, 0)?,
            worker_pid: col(&row, 1)?,
            current_run_id: col(&row, 2)?,
            claim_lock: col(&row, 3)?,
            claim_expires: col(&row, 4)?,
        }),
        run,
        newest_bound,
    })
}

/// The lease length of the claim's run.
async fn run_ttl(tx: &mut Conn, claim: &Claim) -> Result<i64, TxError> {
    let stored: Option<i64> = match tx
        .query_opt(
            "SELECT lease_ttl FROM task_runs WHERE id = $1",
            &[&claim.run_id],
        )
        .await?
    {
        Some(row) => col(&row, 0)?,
        None => None,
    };
    Ok(stored.unwrap_or(kanban_core::DEFAULT_CLAIM_TTL_SECONDS))
}
