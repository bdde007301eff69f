//! A worker's side of the board: the proof, and every write fenced by the
//! claim inside its own transaction.

use kanban_core::attachments::NewAttachment;
use kanban_core::lease::evaluate_lease;
use kanban_core::rules::{self, CardState, FailurePolicy, NewEvent, Overrun, Transition};
use kanban_core::{
    BlockKind, BoardError, Claim, Handoff, NewTask, NotLive, ProofIdentity, ProofRequest,
    RunStatus, WorkerResult, events,
};
use serde_json::{Value, json};

use crate::StoredBoard;
use crate::engine::{Durability, Engine, TxError, TxResult};
use crate::statements::Tx;

/// The fence of every worker write, checked inside the write's own
/// transaction: the card runs under the claim's run and lock, and the lease
/// has not run out. A write it refuses commits only its
/// `stale_write_rejected` event.
pub(crate) async fn fence(tx: &mut Tx<'_>, claim: &Claim, action: &str, now: i64) -> TxResult<()> {
    let identity = ProofIdentity::AnyProcess;
    let view = tx.lease_view(&claim.task_id).await?;
    let run = claim.run_id.to_string();
    let Err(reason) = evaluate_lease(&view, &run, &claim.claim_lock, identity, now) else {
        return Ok(());
    };
    if view.task.is_some() {
        let event = events::stale_write_rejected(claim, action, &reason);
        tx.append_event(&claim.task_id, &event, now).await?;
    }
    Err(TxError::CommitThen(BoardError::LeaseLost {
        task_id: claim.task_id.clone(),
        reason,
    }))
}

/// The card's state, or "not on this board".
pub(crate) async fn existing_card(tx: &mut Tx<'_>, task_id: &str) -> TxResult<CardState> {
    tx.card_state(task_id)
        .await?
        .ok_or_else(|| BoardError::TaskNotFound(task_id.to_owned()).into())
}

/// Applies a transition, telling the board's listeners when it may make work.
pub(crate) async fn apply(
    tx: &mut Tx<'_>,
    task_id: &str,
    transition: &Transition,
    now: i64,
) -> TxResult<()> {
    if transition.makes_work() {
        tx.notify().await?;
    }
    tx.apply(task_id, transition, now).await?;
    if transition.frees_children() {
        for child in tx.promotable_children(task_id).await? {
            let card = existing_card(tx, &child).await?;
            if let Some(promoted) = rules::promote(&card, now) {
                tx.apply(&child, &promoted, now).await?;
            }
        }
    }
    Ok(())
}

impl<E: Engine> StoredBoard<E> {
    /// One fenced write of `claim` whose change is core's `rule`.
    async fn fenced(
        &self,
        claim: &Claim,
        action: &'static str,
        durability: Durability,
        rule: impl Fn(&CardState, i64) -> Option<Transition> + Send + Sync + 'static,
    ) -> Result<(), BoardError> {
        let claim = claim.clone();
        let rule = std::sync::Arc::new(rule);
        self.engine
            .write(durability, move |sql, now| {
                let (claim, rule) = (claim.clone(), rule.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, action, now).await?;
                    let card = existing_card(tx, &claim.task_id).await?;
                    if let Some(transition) = rule(&card, now) {
                        apply(tx, &claim.task_id, &transition, now).await?;
                    }
                    Ok(())
                })
            })
            .await
    }

    /// A fenced write that only appends `event`.
    async fn fenced_event(
        &self,
        claim: &Claim,
        action: &'static str,
        durability: Durability,
        event: NewEvent,
    ) -> Result<(), BoardError> {
        self.fenced(claim, action, durability, move |_, _| {
            Some(Transition {
                events: vec![event.clone()],
                ..Transition::default()
            })
        })
        .await
    }

    pub async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        self.engine
            .prove(&ProofRequest::for_claim(claim), identity)
            .await
    }

    pub async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        let event = events::worker_bound(claim, pid);
        self.fenced_event(claim, "bind", Durability::LocalRecord, event)
            .await
    }

    /// A result is a record of what happened, not a change of the card: it
    /// is booked for the run the claim opened even after the lease lapsed,
    /// so that the dispatcher can read the exit code back.
    pub async fn book_result(
        &self,
        claim: &Claim,
        result: &WorkerResult,
    ) -> Result<(), BoardError> {
        let payload =
            serde_json::to_value(result).map_err(|error| BoardError::Storage(error.to_string()))?;
        let claim = claim.clone();
        self.engine
            .write(Durability::LocalRecord, move |sql, now| {
                let (claim, payload) = (claim.clone(), payload.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    if !tx.run_owned(&claim).await? {
                        return Err(BoardError::LeaseLost {
                            task_id: claim.task_id.clone(),
                            reason: NotLive::RunNotFound,
                        }
                        .into());
                    }
                    let event = NewEvent::new("worker_result", Some(claim.run_id), payload);
                    tx.append_event(&claim.task_id, &event, now).await
                })
            })
            .await
    }

    pub async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        let claim = claim.clone();
        self.engine
            .read(move |sql| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let Some(card) = tx.card_state(&claim.task_id).await? else {
                        return Err(BoardError::TaskNotFound(claim.task_id.clone()).into());
                    };
                    let run = tx.run_row(&claim).await?;
                    Ok(rules::run_status(&card, run.as_ref(), &claim))
                })
            })
            .await
    }

    pub async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        let claim = claim.clone();
        self.engine
            .write(Durability::LocalRecord, move |sql, now| {
                let (claim, note) = (claim.clone(), note.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "heartbeat", now).await?;
                    let ttl = run_ttl(tx, &claim).await?;
                    let expires = now.saturating_add(ttl);
                    tx.set_lease(&claim, expires, Some(now)).await?;
                    let event = events::heartbeat(&claim, note.as_deref(), expires);
                    tx.append_event(&claim.task_id, &event, now).await?;
                    Ok(expires)
                })
            })
            .await
    }

    pub async fn complete(
        &self,
        claim: &Claim,
        summary: &str,
        result: Option<String>,
    ) -> Result<(), BoardError> {
        self.hand_off(claim, &Handoff::new(summary, result)).await
    }

    pub async fn hand_off(&self, claim: &Claim, handoff: &Handoff) -> Result<(), BoardError> {
        events::check_handoff(handoff)?;
        let (claim, handoff) = (claim.clone(), handoff.clone());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, handoff) = (claim.clone(), handoff.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "complete", now).await?;
                    let verified = if handoff.created_cards.is_empty() {
                        Vec::new()
                    } else {
                        let task_id = &claim.task_id;
                        let found = tx.made_cards(task_id, &handoff.created_cards).await?;
                        let assignee = tx.assignee_of(task_id).await?;
                        rules::verify_created_cards(
                            task_id,
                            assignee.as_deref(),
                            &handoff.created_cards,
                            &found,
                        )?
                    };
                    let transition = rules::complete(&claim, &handoff, &verified, now);
                    apply(tx, &claim.task_id, &transition, now).await?;
                    // A recurring card's next occurrence, in the same commit.
                    crate::admin::recur(tx, &claim.task_id, now).await
                })
            })
            .await
    }

    /// Records a file a run attached to its own card, fenced like every
    /// worker write; its id.
    pub async fn attach(&self, claim: &Claim, new: &NewAttachment) -> Result<i64, BoardError> {
        let (claim, new) = (claim.clone(), new.clone());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, new) = (claim.clone(), new.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "attach", now).await?;
                    let id = tx.insert_attachment(&claim.task_id, &new, now).await?;
                    let event = events::attached(Some(claim.run_id), &new);
                    tx.append_event(&claim.task_id, &event, now).await?;
                    Ok(id)
                })
            })
            .await
    }

    pub async fn create_child(&self, claim: &Claim, task: &NewTask) -> Result<String, BoardError> {
        events::check_new_task(task)?;
        let (claim, task) = (claim.clone(), task.clone());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, task) = (claim.clone(), task.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "create", now).await?;
                    let (assignee, tenant) = tx.maker_of(&claim.task_id).await?;
                    let child =
                        rules::child_card(&claim, assignee.as_deref(), tenant.as_deref(), &task);
                    let id = crate::admin::insert_task(tx, &child, now).await?;
                    let event = rules::fanned_out(&claim, "created", json!({"task_id": id}));
                    tx.append_event(&claim.task_id, &event, now).await?;
                    Ok(id)
                })
            })
            .await
    }

    pub async fn link_child(
        &self,
        claim: &Claim,
        parent: &str,
        child: &str,
    ) -> Result<bool, BoardError> {
        let (claim, parent, child) = (claim.clone(), parent.to_owned(), child.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, parent, child) = (claim.clone(), parent.clone(), child.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "link", now).await?;
                    let made = tx.waits_on(&claim.task_id, &child).await?;
                    rules::check_fan_out_target(&claim.task_id, &child, made)?;
                    let linked = crate::admin::link_cards(tx, &parent, &child, now).await?;
                    if linked {
                        let details = json!({"parent": parent, "child": child});
                        let event = rules::fanned_out(&claim, "linked", details);
                        tx.append_event(&claim.task_id, &event, now).await?;
                    }
                    Ok(linked)
                })
            })
            .await
    }

    pub async fn unblock_child(&self, claim: &Claim, task_id: &str) -> Result<(), BoardError> {
        let (claim, target) = (claim.clone(), task_id.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, target) = (claim.clone(), target.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "unblock", now).await?;
                    let made = tx.waits_on(&claim.task_id, &target).await?;
                    rules::check_fan_out_target(&claim.task_id, &target, made)?;
                    let card = existing_card(tx, &target).await?;
                    apply(tx, &target, &rules::unblock(&card)?, now).await?;
                    let event = rules::fanned_out(&claim, "unblocked", json!({"task_id": target}));
                    tx.append_event(&claim.task_id, &event, now).await
                })
            })
            .await
    }

    pub async fn block(
        &self,
        claim: &Claim,
        reason: &str,
        kind: Option<BlockKind>,
    ) -> Result<(), BoardError> {
        let (owned, reason) = (claim.clone(), reason.to_owned());
        self.fenced(claim, "block", Durability::Synced, move |card, _| {
            Some(rules::block(card, &owned, &reason, kind))
        })
        .await
    }

    pub async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError> {
        let (owned, overrun, policy) = (claim.clone(), overrun.clone(), *policy);
        self.fenced(
            claim,
            "settle_overrun",
            Durability::Synced,
            move |card, now| rules::settle_overrun(card, &owned, &overrun, &policy, now),
        )
        .await
    }

    pub async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        let (claim, author, text) = (claim.clone(), author.to_owned(), text.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (claim, author, text) = (claim.clone(), author.clone(), text.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    fence(tx, &claim, "comment", now).await?;
                    tx.insert_comment(&claim.task_id, &author, &text, now)
                        .await?;
                    let event = events::commented(Some(claim.run_id), &author);
                    tx.append_event(&claim.task_id, &event, now).await
                })
            })
            .await
    }

    pub async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: Value,
    ) -> Result<(), BoardError> {
        let event = NewEvent::new(kind, Some(claim.run_id), payload);
        self.fenced_event(claim, "append_event", Durability::Synced, event)
            .await
    }
}

/// The lease length of the claim's run: what the claim asked for, else the
/// `ttl` its `claimed` event recorded (boards written before runs kept it),
/// else the default lease.
async fn run_ttl(tx: &mut Tx<'_>, claim: &Claim) -> TxResult<i64> {
    if let Some(ttl) = tx.lease_ttl(claim).await? {
        return Ok(ttl);
    }
    let recorded = tx
        .latest_payload(&claim.task_id, claim.run_id, "claimed")
        .await?
        .and_then(|payload| payload["ttl"].as_i64());
    Ok(recorded.unwrap_or(kanban_core::DEFAULT_CLAIM_TTL_SECONDS))
}
