//! The operator's side of the board: cards, claims by hand, the lifecycle,
//! and reading it all back.

use std::collections::BTreeMap;

use kanban_core::attachments::{AttachmentRecord, NewAttachment};
use kanban_core::rules::{self, CardEdit, CardState, Transition};
use kanban_core::swarm::{self, Swarm, SwarmCards, Swarmed};
use kanban_core::{
    BoardError, COMMENTS_SHOWN, CardStatus, Claim, ClaimFilter, ClaimGrant, EventRecord, ExitCode,
    NewTask, TaskPage, TaskRecord, TaskStatus, TaskView, events,
};

use crate::StoredBoard;
use crate::dispatch::claim_card;
use crate::engine::{Durability, Engine, TxResult};
use crate::statements::Tx;
use crate::worker::{apply, existing_card};

/// Creates a card inside the caller's transaction; its id, or the
/// existing card's for a repeated idempotency key.
pub(crate) async fn insert_task(tx: &mut Tx<'_>, new: &NewTask, now: i64) -> TxResult<String> {
    if let Some(key) = &new.idempotency_key
        && let Some(id) = tx.idempotent_card(key).await?
    {
        return Ok(id);
    }
    let mut open_parents = false;
    for parent in &new.parents {
        match tx.status_of(parent).await? {
            None => return Err(BoardError::TaskNotFound(parent.clone()).into()),
            Some(status) => {
                open_parents |= !matches!(
                    status,
                    CardStatus::Known(TaskStatus::Done | TaskStatus::Archived)
                );
            }
        }
    }
    let status = rules::initial_status(new.start, open_parents, new.not_before, now);
    let id = tx.new_task_id().await?;
    tx.insert_task(&id, new, status, now).await?;
    tx.notify().await?;
    for event in rules::creation_events(status, &new.parents, new.assignee.as_deref()) {
        tx.append_event(&id, &event, now).await?;
    }
    if let Some(event) = events::scheduled(new) {
        tx.append_event(&id, &event, now).await?;
    }
    Ok(id)
}

/// Makes `child` wait for `parent` inside the caller's transaction, as
/// core's [`rules::link`] says; false when it waited for it already.
pub(crate) async fn link_cards(
    tx: &mut Tx<'_>,
    parent: &str,
    child: &str,
    now: i64,
) -> TxResult<bool> {
    let links = tx.links_to_change().await?;
    let parent_card = existing_card(tx, parent).await?;
    let child_card = existing_card(tx, child).await?;
    let Some(transition) = rules::link(&parent_card, &child_card, &links)? else {
        return Ok(false);
    };
    tx.insert_link(parent, child).await?;
    apply(tx, child, &transition, now).await?;
    Ok(true)
}

/// The next occurrence of a recurring card that just completed, created in
/// the same transaction: one card at a time, due one period after this one
/// was ([`rules::next_occurrence`]).
pub(crate) async fn recur(tx: &mut Tx<'_>, task_id: &str, now: i64) -> TxResult<()> {
    let Some((mut next, scheduled_at)) = tx.recurring(task_id).await? else {
        return Ok(());
    };
    let every = next.every_seconds.unwrap_or(1);
    let due = rules::next_occurrence(scheduled_at, every, now);
    next.not_before = Some(due);
    let id = Box::pin(insert_task(tx, &next, now)).await?;
    tx.append_event(task_id, &events::recurred(&id, due), now)
        .await
}

/// Claims one card by hand inside the caller's transaction: whatever its
/// time, if core's rule lets it.
async fn claim_by_hand(
    tx: &mut Tx<'_>,
    db: &str,
    task_id: &str,
    ttl_seconds: i64,
    claim_lock: &str,
    now: i64,
) -> TxResult<Option<ClaimGrant>> {
    let Some(card) = tx.claim_candidate(task_id).await? else {
        return Ok(None);
    };
    let verdict = rules::claim_verdict(&card, now, &ClaimFilter::any(), true);
    claim_card(tx, db, &card, verdict, ttl_seconds, claim_lock, now).await
}

/// Makes a swarm inside the caller's transaction: the root, claimed and
/// done at once, then its workers, verifier and synthesizer, and the
/// topology note on the root. A repeated idempotency key finds the first
/// swarm's cards in its root's note.
async fn make_swarm(tx: &mut Tx<'_>, db: &str, swarm: &Swarm, now: i64) -> TxResult<Swarmed> {
    if let Some(key) = &swarm.idempotency_key
        && let Some(root) = tx.idempotent_card(key).await?
    {
        let notes = tx.swarm_notes(&root).await?;
        return match swarm::recorded_topology(notes.iter().map(String::as_str)) {
            Some(cards) => Ok(Swarmed { cards, made: false }),
            None => Err(BoardError::InvalidInput(format!(
                "idempotency key {key:?} belongs to card {root}, which is not a swarm's root; pick another key"
            ))
            .into()),
        };
    }
    let root = insert_task(tx, &swarm.root(), now).await?;
    let Some(grant) = claim_by_hand(tx, db, &root, 1, "swarm", now).await? else {
        return Err(BoardError::Storage(format!(
            "the swarm's root {root} could not be claimed in its own transaction"
        ))
        .into());
    };
    let done = rules::complete(&grant.claim, &swarm.root_handoff(), &[], now);
    apply(tx, &root, &done, now).await?;
    let mut worker_ids = Vec::with_capacity(swarm.workers.len());
    for card in swarm.worker_cards(&root) {
        worker_ids.push(insert_task(tx, &card, now).await?);
    }
    let verifier_id = insert_task(tx, &swarm.verifier_card(&root, &worker_ids), now).await?;
    let synthesizer = swarm.synthesizer_card(&root, &verifier_id);
    let synthesizer_id = insert_task(tx, &synthesizer, now).await?;
    let cards = SwarmCards {
        root_id: root.clone(),
        worker_ids,
        verifier_id,
        synthesizer_id,
    };
    tx.insert_comment(&root, &swarm.created_by, &swarm.topology_note(&cards), now)
        .await?;
    let event = events::commented(None, &swarm.created_by);
    tx.append_event(&root, &event, now).await?;
    Ok(Swarmed { cards, made: true })
}

impl<E: Engine> StoredBoard<E> {
    /// Applies one of core's operator rules to a card, in one transaction.
    async fn operate(
        &self,
        task_id: &str,
        rule: impl Fn(&CardState, i64) -> Result<Transition, BoardError> + Send + Sync + 'static,
    ) -> Result<(), BoardError> {
        let task_id = task_id.to_owned();
        let rule = std::sync::Arc::new(rule);
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (task_id, rule) = (task_id.clone(), rule.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let card = existing_card(tx, &task_id).await?;
                    let transition = rule(&card, now)?;
                    apply(tx, &task_id, &transition, now).await
                })
            })
            .await
    }

    pub async fn create_task(&self, new: &NewTask) -> Result<String, BoardError> {
        events::check_new_task(new)?;
        let new = new.clone();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let new = new.clone();
                Box::pin(async move { insert_task(&mut Tx::new(sql), &new, now).await })
            })
            .await
    }

    /// Makes a swarm in one transaction ([`make_swarm`]).
    pub async fn create_swarm(&self, swarm: &Swarm) -> Result<Swarmed, BoardError> {
        swarm.check()?;
        let swarm = swarm.clone();
        let db = self.engine.name().to_owned();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (swarm, db) = (swarm.clone(), db.clone());
                Box::pin(async move { make_swarm(&mut Tx::new(sql), &db, &swarm, now).await })
            })
            .await
    }

    /// Claims one card by hand: whatever its time, if core's rule lets it.
    pub async fn claim_task(
        &self,
        task_id: &str,
        ttl_seconds: i64,
        claim_lock: &str,
    ) -> Result<Option<ClaimGrant>, BoardError> {
        let (task_id, claim_lock) = (task_id.to_owned(), claim_lock.to_owned());
        let db = self.engine.name().to_owned();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (task_id, lock, db) = (task_id.clone(), claim_lock.clone(), db.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    claim_by_hand(tx, &db, &task_id, ttl_seconds, &lock, now).await
                })
            })
            .await
    }

    pub async fn unblock(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, |card, _| rules::unblock(card)).await
    }

    pub async fn cancel(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        self.operate(task_id, move |card, _| rules::cancel(card, &reason))
            .await
    }

    pub async fn archive(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, |card, _| rules::archive(card)).await
    }

    pub async fn hold(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        self.operate(task_id, move |card, _| rules::hold(card, &reason))
            .await
    }

    pub async fn release_hold(&self, task_id: &str) -> Result<(), BoardError> {
        self.operate(task_id, rules::release_hold).await
    }

    /// Parks a card in `scheduled` until `not_before`, or until an unblock.
    pub async fn schedule(
        &self,
        task_id: &str,
        reason: Option<&str>,
        not_before: Option<i64>,
    ) -> Result<(), BoardError> {
        let reason = reason.map(str::to_owned);
        self.operate(task_id, move |card, _| {
            rules::schedule(card, reason.as_deref(), not_before)
        })
        .await
    }

    /// Promotes a card by hand (core's [`rules::promote_by_hand`]); with
    /// `dry_run`, only says whether it would, changing nothing.
    pub async fn promote(
        &self,
        task_id: &str,
        reason: Option<&str>,
        force: bool,
        dry_run: bool,
    ) -> Result<(), BoardError> {
        let (task_id, reason) = (task_id.to_owned(), reason.map(str::to_owned));
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (task_id, reason) = (task_id.clone(), reason.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let card = existing_card(tx, &task_id).await?;
                    let transition = rules::promote_by_hand(&card, reason.as_deref(), force)?;
                    if dry_run {
                        return Ok(());
                    }
                    apply(tx, &task_id, &transition, now).await
                })
            })
            .await
    }

    /// Sends a card nobody works to `triage`.
    pub async fn triage(&self, task_id: &str, reason: Option<&str>) -> Result<(), BoardError> {
        let reason = reason.map(str::to_owned);
        self.operate(task_id, move |card, _| {
            rules::to_triage(card, reason.as_deref())
        })
        .await
    }

    /// Puts a card nobody works up for review by its assignee.
    pub async fn review(&self, task_id: &str, reason: Option<&str>) -> Result<(), BoardError> {
        let reason = reason.map(str::to_owned);
        self.operate(task_id, move |card, _| {
            rules::to_review(card, reason.as_deref())
        })
        .await
    }

    pub async fn edit(&self, task_id: &str, edit: &CardEdit) -> Result<(), BoardError> {
        let edit = edit.clone();
        self.operate(task_id, move |card, _| rules::edit(card, &edit))
            .await
    }

    pub async fn reclaim(&self, task_id: &str, reason: &str) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        self.operate(task_id, move |card, now| rules::reclaim(card, &reason, now))
            .await
    }

    /// Deletes done and archived cards whose last event is older than
    /// `before`, with their runs, events, comments and links; their ids.
    /// Run ids stay unique after it: a fencing token is never handed out
    /// twice.
    pub async fn prune(&self, before: i64, dry_run: bool) -> Result<Vec<String>, BoardError> {
        self.engine
            .write(Durability::Synced, move |sql, _| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let ids = tx.prunable(before).await?;
                    if !dry_run {
                        for id in &ids {
                            tx.delete_card(id).await?;
                        }
                    }
                    Ok(ids)
                })
            })
            .await
    }

    pub async fn add_comment(
        &self,
        task_id: &str,
        author: &str,
        text: &str,
    ) -> Result<(), BoardError> {
        let text = events::check_comment(text)?;
        let (task_id, author, text) = (task_id.to_owned(), author.to_owned(), text.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (task_id, author, text) = (task_id.clone(), author.clone(), text.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    existing_card(tx, &task_id).await?;
                    tx.insert_comment(&task_id, &author, &text, now).await?;
                    let event = events::commented(None, &author);
                    tx.append_event(&task_id, &event, now).await
                })
            })
            .await
    }

    /// Lifts the wall of `scope` by hand; the card that met it last (its
    /// source, `TASK#RUN`) gets what core's rule says.
    pub async fn gc_events(&self, before: i64) -> Result<u64, BoardError> {
        self.engine
            .write(Durability::Synced, move |sql, _| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    // Notifications are kept as long as their events are.
                    tx.delete_settled_notifications(before).await?;
                    tx.delete_settled_events(before).await
                })
            })
            .await
    }

    pub async fn lift_wall(&self, scope: &str) -> Result<bool, BoardError> {
        let scope = scope.to_owned();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let scope = scope.clone();
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let Some(source) = tx.take_wall(&scope).await? else {
                        return Ok(false);
                    };
                    let (task_id, run) = source.split_once('#').unwrap_or((source.as_str(), ""));
                    if let Some(card) = tx.card_state(task_id).await? {
                        let transition = rules::lift_wall(&card, &scope, run.parse().ok());
                        apply(tx, task_id, &transition, now).await?;
                    }
                    Ok(true)
                })
            })
            .await
    }

    /// Records a file already written for `task_id` (event `attached`);
    /// its id. A card the board does not have is refused.
    pub async fn add_attachment(
        &self,
        task_id: &str,
        new: &NewAttachment,
    ) -> Result<i64, BoardError> {
        let (task_id, new) = (task_id.to_owned(), new.clone());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (task_id, new) = (task_id.clone(), new.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    if tx.status_of(&task_id).await?.is_none() {
                        return Err(BoardError::TaskNotFound(task_id).into());
                    }
                    let id = tx.insert_attachment(&task_id, &new, now).await?;
                    tx.append_event(&task_id, &events::attached(None, &new), now)
                        .await?;
                    Ok(id)
                })
            })
            .await
    }

    /// The files attached to `task_id`, oldest first (every card's, with none).
    pub async fn attachments(
        &self,
        task_id: Option<&str>,
    ) -> Result<Vec<AttachmentRecord>, BoardError> {
        let task_id = task_id.map(str::to_owned);
        self.engine
            .read(move |sql| {
                let task_id = task_id.clone();
                Box::pin(async move { Tx::new(sql).attachments(task_id.as_deref()).await })
            })
            .await
    }

    /// Deletes attachment `id`'s row (event `attachment_removed`); the row
    /// it was, whose file is the caller's to remove; `None` when there was none.
    pub async fn remove_attachment(&self, id: i64) -> Result<Option<AttachmentRecord>, BoardError> {
        self.engine
            .write(Durability::Synced, move |sql, now| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let removed = tx.delete_attachment(id).await?;
                    if let Some(removed) = &removed {
                        let event = rules::NewEvent::new(
                            "attachment_removed",
                            None,
                            serde_json::json!({"filename": removed.filename}),
                        );
                        tx.append_event(&removed.task_id, &event, now).await?;
                    }
                    Ok(removed)
                })
            })
            .await
    }

    pub async fn show_task(&self, task_id: &str) -> Result<TaskView, BoardError> {
        let task_id = task_id.to_owned();
        self.engine
            .read(move |sql| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    tx.task_view(&task_id, COMMENTS_SHOWN)
                        .await?
                        .ok_or_else(|| BoardError::TaskNotFound(task_id.clone()).into())
                })
            })
            .await
    }

    pub async fn list_tasks(
        &self,
        status: Option<TaskStatus>,
    ) -> Result<Vec<TaskRecord>, BoardError> {
        self.engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).tasks(status).await }))
            .await
    }

    pub async fn list_page(
        &self,
        status: Option<TaskStatus>,
        after: Option<i64>,
        limit: usize,
    ) -> Result<TaskPage, BoardError> {
        // One row more than the page says whether a next page follows.
        let rows = self
            .engine
            .read(move |sql| {
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    tx.page(status, after.unwrap_or(0), limit.saturating_add(1))
                        .await
                })
            })
            .await?;
        Ok(TaskPage::from_rows(rows, limit))
    }

    /// The newest `limit` events of the whole board, newest last.
    pub async fn recent_events(&self, limit: usize) -> Result<Vec<EventRecord>, BoardError> {
        let mut events = self
            .engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).recent_events(limit).await }))
            .await?;
        events.reverse();
        Ok(events)
    }

    /// Makes `child` wait for `parent`; false when it waited for it already.
    pub async fn link(&self, parent: &str, child: &str) -> Result<bool, BoardError> {
        let (parent, child) = (parent.to_owned(), child.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (parent, child) = (parent.clone(), child.clone());
                Box::pin(async move { link_cards(&mut Tx::new(sql), &parent, &child, now).await })
            })
            .await
    }

    /// Ends `child`'s wait for `parent`; false when it did not wait for it.
    pub async fn unlink(&self, parent: &str, child: &str) -> Result<bool, BoardError> {
        let (parent, child) = (parent.to_owned(), child.to_owned());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (parent, child) = (parent.clone(), child.clone());
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    existing_card(tx, &child).await?;
                    if !tx.delete_link(&parent, &child).await? {
                        return Ok(false);
                    }
                    // Read again: the link is gone from its open parents.
                    let child_card = existing_card(tx, &child).await?;
                    apply(tx, &child, &rules::unlinked(&child_card, &parent, now), now).await?;
                    Ok(true)
                })
            })
            .await
    }

    /// Every link of the board, as `(parent, child)` pairs, sorted.
    pub async fn links(&self) -> Result<Vec<(String, String)>, BoardError> {
        self.engine
            .read(|sql| Box::pin(async move { Tx::new(sql).links().await }))
            .await
    }

    /// The newest run of each card that has run, by card id.
    pub async fn last_runs(&self) -> Result<BTreeMap<String, i64>, BoardError> {
        self.engine
            .read(|sql| Box::pin(async move { Tx::new(sql).last_runs().await }))
            .await
    }

    /// The exit code the worker holding `claim` booked, else a failure's.
    pub async fn booked_exit_code(&self, claim: &Claim) -> Result<i32, BoardError> {
        let booked = self.booked_result(claim).await?;
        let exit = booked.map_or(ExitCode::Failure, |result| result.exit_code);
        Ok(exit.code())
    }
}
