//! A worker's side of the board: the proof, and every write fenced by the
//! claim inside its own transaction.

use async_trait::async_trait;
use kanban_core::events;
use kanban_core::rules::{self, FailurePolicy, NewEvent, Overrun, RunRow};
use kanban_core::{
    Board, BoardError, Claim, NotLive, ProofIdentity, ProofRequest, RunStatus, WorkerResult,
};
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use crate::open::{Durability, MEMORY_BOARD, SqliteBoard, TxError};
use crate::proof::{LeaseProver, lease_view};
use crate::rows::{append_event, apply, card_state, existing_card, fence};

impl SqliteBoard {
    /// Runs one fenced write of `claim`: the fence, then `body`'s transition.
    async fn fenced(
        &self,
        claim: &Claim,
        action: &'static str,
        durability: Durability,
        body: impl Fn(&rules::CardState, i64) -> Option<rules::Transition> + Send + 'static,
    ) -> Result<(), BoardError> {
        let claim = claim.clone();
        self.call(move |store| {
            store.write_with(durability, |tx, now| {
                fence(tx, &claim, action, now)?;
                let card = existing_card(tx, &claim.task_id)?;
                if let Some(transition) = body(&card, now) {
                    apply(tx, &claim.task_id, &transition, now)?;
                }
                Ok(())
            })
        })
        .await
    }
}

#[async_trait]
impl Board for SqliteBoard {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        let request = ProofRequest::for_claim(claim);
        let now = self.store.clock.now();
        if claim.db != MEMORY_BOARD {
            // The proof reads the file the claim pins, read-only, exactly as
            // a worker in another language would, on a connection kept open.
            return self
                .store
                .prover
                .get_or_init(|| LeaseProver::new(claim.db.clone()))
                .prove(&request, identity, now);
        }
        let task_id = claim.task_id.clone();
        let view = self
            .call(move |store| store.read(|conn| lease_view(conn, &task_id, identity)))
            .await
            .map_err(|error| NotLive::Unreadable(error.to_string()))?;
        kanban_core::lease::evaluate_lease(
            &view,
            &claim.run_id.to_string(),
            &claim.claim_lock,
            identity,
            now,
        )
    }

    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        let event = events::worker_bound(claim, pid);
        self.fenced(claim, "bind", Durability::Deferred, move |_, _| {
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
        let claim = claim.clone();
        self.call(move |store| {
            store.write_deferred(|tx, now| {
                let owned: bool = tx
                    .prepare_cached(
                        "SELECT EXISTS (SELECT 1 FROM task_runs WHERE id = ?1 AND task_id = ?2 AND claim_lock = ?3)",
                    )?
                    .query_row(
                        params![claim.run_id, claim.task_id, claim.claim_lock],
                        |row| row.get(0),
                    )?;
                if !owned {
                    return Err(BoardError::LeaseLost {
                        task_id: claim.task_id.clone(),
                        reason: NotLive::RunNotFound,
                    }
                    .into());
                }
                let event = NewEvent::new("worker_result", Some(claim.run_id), payload.clone());
                append_event(tx, &claim.task_id, &event, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        let claim = claim.clone();
        self.call(move |store| {
            store.read_checked(|conn| {
                let card = card_state(conn, &claim.task_id)?;
                let run = conn
                    .prepare_cached(
                        "SELECT ended_at IS NOT NULL, outcome FROM task_runs WHERE id = ?1 AND task_id = ?2",
                    )?
                    .query_row(params![claim.run_id, claim.task_id], |row| {
                        Ok(RunRow {
                            ended: row.get(0)?,
                            outcome: row.get(1)?,
                        })
                    })
                    .optional()?;
                Ok(card.map(|card| rules::run_status(&card, run.as_ref(), &claim)))
            })?
            .ok_or_else(|| BoardError::TaskNotFound(claim.task_id.clone()))
        })
        .await
    }

    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        let claim = claim.clone();
        self.call(move |store| {
            store.write_deferred(|tx, now| {
                fence(tx, &claim, "heartbeat", now)?;
                let ttl = run_ttl(tx, &claim)?;
                let expires = now.saturating_add(ttl);
                tx.prepare_cached(
                    "UPDATE tasks SET claim_expires = ?2, last_heartbeat_at = ?3 WHERE id = ?1",
                )?
                .execute(params![claim.task_id, expires, now])?;
                tx.prepare_cached(
                    "UPDATE task_runs SET claim_expires = ?2, last_heartbeat_at = ?3 WHERE id = ?1",
                )?
                .execute(params![claim.run_id, expires, now])?;
                let event = events::heartbeat(&claim, note.as_deref(), expires);
                append_event(tx, &claim.task_id, &event, now)?;
                Ok(expires)
            })
        })
        .await
    }

    async fn complete(
        &self,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> Result<(), BoardError> {
        let summary = summary.to_owned();
        let claim = claim.clone();
        self.call(move |store| {
            store.write(|tx, now| {
                fence(tx, &claim, "complete", now)?;
                let transition = rules::complete(&claim, &summary, result.as_deref(), now);
                apply(tx, &claim.task_id, &transition, now)?;
                // A recurring card's next occurrence, in the same commit.
                crate::admin::recur(tx, &claim.task_id, now)
            })
        })
        .await
    }

    async fn block(&self, claim: &Claim, reason: &str) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        let owned = claim.clone();
        self.fenced(claim, "block", Durability::Synced, move |_, _| {
            Some(rules::block(&owned, &reason))
        })
        .await
    }

    async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError> {
        let overrun = overrun.clone();
        let policy = *policy;
        let owned = claim.clone();
        self.fenced(
            claim,
            "settle_overrun",
            Durability::Synced,
            move |card, now| rules::settle_overrun(card, &owned, &overrun, &policy, now),
        )
        .await
    }

    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        let claim = claim.clone();
        let author = author.to_owned();
        let text = text.to_owned();
        self.call(move |store| {
            store.write(|tx, now| {
                fence(tx, &claim, "comment", now)?;
                tx.prepare_cached(
                    "INSERT INTO task_comments (task_id, author, body, created_at) VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![claim.task_id, author, text, now])?;
                let event = events::commented(Some(claim.run_id), &author);
                append_event(tx, &claim.task_id, &event, now)?;
                Ok(())
            })
        })
        .await
    }

    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: Value,
    ) -> Result<(), BoardError> {
        let event = NewEvent::new(kind, Some(claim.run_id), payload);
        self.fenced(claim, "append_event", Durability::Synced, move |_, _| {
            Some(rules::Transition {
                events: vec![event.clone()],
                ..rules::Transition::default()
            })
        })
        .await
    }
}

/// The lease length of the claim's run: what the claim asked for, else the
/// `ttl` its `claimed` event recorded (boards written before runs kept it).
fn run_ttl(tx: &rusqlite::Connection, claim: &Claim) -> Result<i64, TxError> {
    let stored: Option<i64> = tx
        .prepare_cached("SELECT lease_ttl FROM task_runs WHERE id = ?1")?
        .query_row(params![claim.run_id], |row| row.get(0))
        .optional()?
        .flatten();
    if let Some(ttl) = stored {
        return Ok(ttl);
    }
    let recorded = tx
        .prepare_cached(
            "SELECT payload FROM task_events WHERE task_id = ?1 AND kind = 'claimed' AND run_id = ?2
              ORDER BY id DESC LIMIT 1",
        )?
        .query_row(params![claim.task_id, claim.run_id], |row| {
            row.get::<_, Option<String>>(0)
        })
        .optional()?
        .flatten()
        .and_then(|payload| serde_json::from_str::<Value>(&payload).ok())
        .and_then(|payload| payload["ttl"].as_i64());
    Ok(recorded.unwrap_or(kanban_core::DEFAULT_CLAIM_TTL_SECONDS))
}
