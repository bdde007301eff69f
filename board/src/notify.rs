//! Notification subscriptions, and the outbox deliverers lease from like
//! cards: a notification is leased to one deliverer at a time, and an
//! attempt is recorded only by the deliverer that holds it.

use kanban_core::BoardError;
use kanban_core::notify::{self, Delivery, DeliveryResult, NewSubscription, SubscriptionView};

use crate::StoredBoard;
use crate::engine::{Durability, Engine};
use crate::statements::Tx;

impl<E: Engine> StoredBoard<E> {
    /// Stores a subscription ([`notify::check_subscription`] first); its id.
    /// It wants the events from now on.
    pub async fn subscribe(&self, new: &NewSubscription) -> Result<i64, BoardError> {
        notify::check_subscription(new).map_err(BoardError::InvalidInput)?;
        if let notify::NotifyScope::Card(id) = &new.scope {
            self.show_task(id).await?;
        }
        let new = new.clone();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let new = new.clone();
                Box::pin(async move { Tx::new(sql).insert_subscription(&new, now).await })
            })
            .await
    }

    /// The subscriptions, with their notifications' counts.
    pub async fn subscriptions(&self) -> Result<Vec<SubscriptionView>, BoardError> {
        self.engine
            .read(|sql| Box::pin(async move { Tx::new(sql).subscriptions().await }))
            .await
    }

    /// Removes a subscription; false when there is none of that id.
    pub async fn unsubscribe(&self, id: i64) -> Result<bool, BoardError> {
        self.engine
            .write(Durability::Synced, move |sql, now| {
                Box::pin(async move { Tx::new(sql).remove_subscription(id, now).await })
            })
            .await
    }

    /// Leases up to `count` due notifications to `owner` for
    /// `lease_seconds`, with what each carries.
    pub async fn lease_notifications(
        &self,
        owner: &str,
        lease_seconds: i64,
        count: usize,
    ) -> Result<Vec<Delivery>, BoardError> {
        // Looked for first in a read, so that a board with nothing due is
        // not locked for writing at each poll.
        let now = self.engine.now();
        let due = self
            .engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).any_notification_due(now).await }))
            .await?;
        if !due {
            return Ok(Vec::new());
        }
        let owner = owner.to_owned();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let owner = owner.clone();
                Box::pin(async move {
                    let tx = &mut Tx::new(sql);
                    let until = now.saturating_add(lease_seconds.max(1));
                    let mut deliveries = Vec::new();
                    for id in tx.lease_notifications(&owner, until, now, count).await? {
                        if let Some(delivery) = tx.delivery(id).await? {
                            deliveries.push(delivery);
                        }
                    }
                    Ok(deliveries)
                })
            })
            .await
    }

    /// Holds a leased notification `lease_seconds` more, just before it is
    /// sent; false when `owner` lost it, and it must not be sent.
    pub async fn renew_notification(
        &self,
        outbox_id: i64,
        owner: &str,
        lease_seconds: i64,
    ) -> Result<bool, BoardError> {
        let owner = owner.to_owned();
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let owner = owner.clone();
                Box::pin(async move {
                    let until = now.saturating_add(lease_seconds.max(1));
                    Tx::new(sql)
                        .renew_notification(outbox_id, &owner, until)
                        .await
                })
            })
            .await
    }

    /// Records an attempt at a notification `owner` holds; false when its
    /// lease was lost (another deliverer may have it).
    pub async fn settle_notification(
        &self,
        outbox_id: i64,
        owner: &str,
        result: &DeliveryResult,
    ) -> Result<bool, BoardError> {
        let (owner, result) = (owner.to_owned(), result.clone());
        self.engine
            .write(Durability::Synced, move |sql, now| {
                let (owner, result) = (owner.clone(), result.clone());
                Box::pin(async move {
                    Tx::new(sql)
                        .settle_notification(outbox_id, &owner, &result, now)
                        .await
                })
            })
            .await
    }
}
