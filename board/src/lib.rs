//! The kanban board's steps, written once.
//!
//! A [`StoredBoard`] makes every board operation (a claim, a fenced
//! worker write, a booking, an operator's move, a listing) out of core's
//! rules and the primitives of an [`Engine`]: transactions, and the reads
//! and writes of rows in the engine's own SQL. The SQLite and PostgreSQL
//! crates each implement an engine, and [`board_ports!`] gives their board
//! types core's three ports (`Board`, `BoardAdmin`, `DispatchBoard`).

mod admin;
mod dispatch;
mod engine;
mod notify;
mod statements;
mod triage;
mod worker;

pub use engine::{
    Cell, Dialect, Durability, Engine, NUL_STAND_IN, Param, Row, Sql, Turns, TxError, TxFuture,
    TxResult, storable_json, storable_list, storable_text,
};
pub use statements::{
    BoardHealth, DispatcherSeen, LANE_WINDOW, Lane, LaneFilter, LanePage, LastEvents, RunOpening,
    lease_from_row, lease_query,
};

use statements::Tx;

use kanban_core::{BoardError, BoardStats, TaskRecord, TaskStatus};

/// Re-exported for [`board_ports!`].
#[doc(hidden)]
pub use async_trait::async_trait;

/// A board kept by the engine `E`.
#[derive(Clone, Debug)]
pub struct StoredBoard<E> {
    engine: E,
}

impl<E: Engine> StoredBoard<E> {
    /// The board of `engine`.
    pub fn new(engine: E) -> Self {
        Self { engine }
    }

    /// Its engine.
    pub fn engine(&self) -> &E {
        &self.engine
    }

    /// Its engine, given back.
    pub fn into_engine(self) -> E {
        self.engine
    }

    /// Its engine, mutably (to configure it before use).
    pub fn engine_mut(&mut self) -> &mut E {
        &mut self.engine
    }

    /// The board's counts, for metrics.
    pub async fn stats(&self) -> Result<BoardStats, BoardError> {
        let now = self.engine.now();
        self.engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).stats(now).await }))
            .await
    }

    /// One lane of the board as a page shows it: how many cards it holds
    /// (counted up to [`LANE_WINDOW`]), and its first `limit` (claim order:
    /// priority, then oldest; the done lane newest first), read through the
    /// lane index.
    pub async fn lane(
        &self,
        status: TaskStatus,
        limit: usize,
    ) -> Result<(usize, Vec<TaskRecord>), BoardError> {
        self.engine
            .read(move |sql| {
                Box::pin(async move {
                    let page = Tx::new(sql)
                        .lane(Lane::Status(status), &LaneFilter::default(), limit, 0)
                        .await?;
                    Ok((page.count, page.cards))
                })
            })
            .await
    }

    /// The cards of statuses this build does not know (the seed system's
    /// own, a newer build's): how many (counted up to [`LANE_WINDOW`]), and
    /// the first `limit`, oldest first.
    pub async fn unknown_lane(&self, limit: usize) -> Result<(usize, Vec<TaskRecord>), BoardError> {
        self.engine
            .read(move |sql| {
                Box::pin(async move {
                    let page = Tx::new(sql)
                        .lane(Lane::Unknown, &LaneFilter::default(), limit, 0)
                        .await?;
                    Ok((page.count, page.cards))
                })
            })
            .await
    }

    /// A page of one lane, narrowed by `filter`: `limit` cards after the
    /// first `skip`, in the lane's order, and how many there are, counted
    /// (and searched by a filter) among the lane's first [`LANE_WINDOW`].
    pub async fn lane_page(
        &self,
        lane: Lane,
        filter: &LaneFilter,
        limit: usize,
        skip: usize,
    ) -> Result<LanePage, BoardError> {
        let filter = filter.clone();
        self.engine
            .read(move |sql| {
                Box::pin(async move { Tx::new(sql).lane(lane, &filter, limit, skip).await })
            })
            .await
    }

    /// The walls, when the last event was written and what each host's
    /// dispatcher last said, in one read (a board page's health line).
    pub async fn health(&self) -> Result<BoardHealth, BoardError> {
        self.engine
            .read(|sql| {
                Box::pin(async move {
                    let mut tx = Tx::new(sql);
                    let walls = tx.walls().await?;
                    let last_activity = tx
                        .recent_events(1)
                        .await?
                        .first()
                        .map(|event| event.created_at);
                    let dispatchers = tx.dispatchers().await?;
                    Ok(BoardHealth {
                        walls,
                        last_activity,
                        dispatchers,
                    })
                })
            })
            .await
    }

    /// What each host's dispatcher last said of itself, the latest first.
    pub async fn dispatchers(&self) -> Result<Vec<DispatcherSeen>, BoardError> {
        self.engine
            .read(|sql| Box::pin(async move { Tx::new(sql).dispatchers().await }))
            .await
    }

    /// The newest event of each of these cards: its kind and time.
    pub async fn last_events(&self, ids: &[String]) -> Result<LastEvents, BoardError> {
        let ids = ids.to_vec();
        self.engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).last_events(&ids).await }))
            .await
    }

    /// The board's structural invariants: a running card holds a claim and
    /// points at its one open run; no other card holds a claim or an open
    /// run; a closed run has an outcome. Every violation found.
    pub async fn audit(&self) -> Result<Vec<String>, BoardError> {
        self.engine
            .read(|sql| Box::pin(async move { Tx::new(sql).audit().await }))
            .await
    }

    /// One card's row, if it exists.
    pub async fn task(&self, task_id: &str) -> Result<Option<TaskRecord>, BoardError> {
        let task_id = task_id.to_owned();
        self.engine
            .read(move |sql| Box::pin(async move { Tx::new(sql).task(&task_id).await }))
            .await
    }

    /// Test and operator hook: sets both lease expiries of a card's run.
    pub async fn set_lease_expiry(&self, task_id: &str, expires: i64) -> Result<(), BoardError> {
        let task_id = task_id.to_owned();
        self.engine
            .write(Durability::Synced, move |sql, _| {
                let task_id = task_id.clone();
                Box::pin(async move { Tx::new(sql).set_lease_expiry(&task_id, expires).await })
            })
            .await
    }
}

/// Gives a board type, a newtype of [`StoredBoard`] over `$engine`, core's
/// three ports and the stored board's own steps (it dereferences to it).
#[macro_export]
macro_rules! board_ports {
    ($board:ty, $engine:ty) => {
        impl ::std::ops::Deref for $board {
            type Target = $crate::StoredBoard<$engine>;

            fn deref(&self) -> &$crate::StoredBoard<$engine> {
                &self.0
            }
        }

        $crate::board_ports!($board);
    };
    ($board:ty) => {
        #[$crate::async_trait]
        impl ::kanban_core::Board for $board {
            async fn prove_claim(
                &self,
                claim: &::kanban_core::Claim,
                identity: ::kanban_core::ProofIdentity,
            ) -> Result<(), ::kanban_core::NotLive> {
                (**self).prove_claim(claim, identity).await
            }
            async fn bind_worker(
                &self,
                claim: &::kanban_core::Claim,
                pid: u32,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).bind_worker(claim, pid).await
            }
            async fn book_result(
                &self,
                claim: &::kanban_core::Claim,
                result: &::kanban_core::WorkerResult,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).book_result(claim, result).await
            }
            async fn run_status(
                &self,
                claim: &::kanban_core::Claim,
            ) -> Result<::kanban_core::RunStatus, ::kanban_core::BoardError> {
                (**self).run_status(claim).await
            }
            async fn heartbeat(
                &self,
                claim: &::kanban_core::Claim,
                note: Option<String>,
            ) -> Result<i64, ::kanban_core::BoardError> {
                (**self).heartbeat(claim, note).await
            }
            async fn hand_off(
                &self,
                claim: &::kanban_core::Claim,
                handoff: &::kanban_core::Handoff,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).hand_off(claim, handoff).await
            }
            async fn attach(
                &self,
                claim: &::kanban_core::Claim,
                new: &::kanban_core::attachments::NewAttachment,
            ) -> Result<i64, ::kanban_core::BoardError> {
                (**self).attach(claim, new).await
            }
            async fn create_child(
                &self,
                claim: &::kanban_core::Claim,
                task: &::kanban_core::NewTask,
            ) -> Result<String, ::kanban_core::BoardError> {
                (**self).create_child(claim, task).await
            }
            async fn link_child(
                &self,
                claim: &::kanban_core::Claim,
                parent: &str,
                child: &str,
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).link_child(claim, parent, child).await
            }
            async fn unblock_child(
                &self,
                claim: &::kanban_core::Claim,
                task_id: &str,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).unblock_child(claim, task_id).await
            }
            async fn block(
                &self,
                claim: &::kanban_core::Claim,
                reason: &str,
                kind: Option<::kanban_core::BlockKind>,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).block(claim, reason, kind).await
            }
            async fn settle_overrun(
                &self,
                claim: &::kanban_core::Claim,
                overrun: &::kanban_core::rules::Overrun,
                policy: &::kanban_core::rules::FailurePolicy,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).settle_overrun(claim, overrun, policy).await
            }
            async fn comment(
                &self,
                claim: &::kanban_core::Claim,
                author: &str,
                text: &str,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).comment(claim, author, text).await
            }
            async fn append_event(
                &self,
                claim: &::kanban_core::Claim,
                kind: &str,
                payload: ::serde_json::Value,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).append_event(claim, kind, payload).await
            }
        }

        #[$crate::async_trait]
        impl ::kanban_core::BoardAdmin for $board {
            async fn create_task(
                &self,
                task: &::kanban_core::NewTask,
            ) -> Result<String, ::kanban_core::BoardError> {
                (**self).create_task(task).await
            }
            async fn claim_task(
                &self,
                task_id: &str,
                ttl_seconds: i64,
                claim_lock: &str,
            ) -> Result<Option<::kanban_core::ClaimGrant>, ::kanban_core::BoardError> {
                (**self).claim_task(task_id, ttl_seconds, claim_lock).await
            }
            async fn unblock(&self, task_id: &str) -> Result<(), ::kanban_core::BoardError> {
                (**self).unblock(task_id).await
            }
            async fn add_comment(
                &self,
                task_id: &str,
                author: &str,
                text: &str,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).add_comment(task_id, author, text).await
            }
            async fn cancel(
                &self,
                task_id: &str,
                reason: &str,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).cancel(task_id, reason).await
            }
            async fn archive(&self, task_id: &str) -> Result<(), ::kanban_core::BoardError> {
                (**self).archive(task_id).await
            }
            async fn hold(
                &self,
                task_id: &str,
                reason: &str,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).hold(task_id, reason).await
            }
            async fn release_hold(&self, task_id: &str) -> Result<(), ::kanban_core::BoardError> {
                (**self).release_hold(task_id).await
            }
            async fn schedule(
                &self,
                task_id: &str,
                reason: Option<&str>,
                not_before: Option<i64>,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).schedule(task_id, reason, not_before).await
            }
            async fn promote(
                &self,
                task_id: &str,
                reason: Option<&str>,
                force: bool,
                dry_run: bool,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).promote(task_id, reason, force, dry_run).await
            }
            async fn triage(
                &self,
                task_id: &str,
                reason: Option<&str>,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).triage(task_id, reason).await
            }
            async fn review(
                &self,
                task_id: &str,
                reason: Option<&str>,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).review(task_id, reason).await
            }
            async fn edit(
                &self,
                task_id: &str,
                edit: &::kanban_core::rules::CardEdit,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).edit(task_id, edit).await
            }
            async fn subscribe(
                &self,
                new: &::kanban_core::notify::NewSubscription,
            ) -> Result<i64, ::kanban_core::BoardError> {
                (**self).subscribe(new).await
            }
            async fn subscriptions(
                &self,
            ) -> Result<Vec<::kanban_core::notify::SubscriptionView>, ::kanban_core::BoardError> {
                (**self).subscriptions().await
            }
            async fn unsubscribe(&self, id: i64) -> Result<bool, ::kanban_core::BoardError> {
                (**self).unsubscribe(id).await
            }
            async fn lease_notifications(
                &self,
                owner: &str,
                lease_seconds: i64,
                count: usize,
            ) -> Result<Vec<::kanban_core::notify::Delivery>, ::kanban_core::BoardError> {
                (**self).lease_notifications(owner, lease_seconds, count).await
            }
            async fn renew_notification(
                &self,
                outbox_id: i64,
                owner: &str,
                lease_seconds: i64,
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).renew_notification(outbox_id, owner, lease_seconds).await
            }
            async fn settle_notification(
                &self,
                outbox_id: i64,
                owner: &str,
                result: &::kanban_core::notify::DeliveryResult,
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).settle_notification(outbox_id, owner, result).await
            }
            async fn settle_triage(
                &self,
                task_id: &str,
                plan: &::kanban_core::triage::TriagePlan,
                agent: &str,
                author: &str,
            ) -> Result<::kanban_core::triage::Settled, ::kanban_core::BoardError> {
                (**self).settle_triage(task_id, plan, agent, author).await
            }
            async fn create_swarm(
                &self,
                swarm: &::kanban_core::swarm::Swarm,
            ) -> Result<::kanban_core::swarm::Swarmed, ::kanban_core::BoardError> {
                (**self).create_swarm(swarm).await
            }
            async fn prune(
                &self,
                before: i64,
                dry_run: bool,
            ) -> Result<Vec<String>, ::kanban_core::BoardError> {
                (**self).prune(before, dry_run).await
            }
            async fn gc_events(&self, before: i64) -> Result<u64, ::kanban_core::BoardError> {
                (**self).gc_events(before).await
            }
            async fn lift_wall(&self, scope: &str) -> Result<bool, ::kanban_core::BoardError> {
                (**self).lift_wall(scope).await
            }
            async fn add_attachment(
                &self,
                task_id: &str,
                new: &::kanban_core::attachments::NewAttachment,
            ) -> Result<i64, ::kanban_core::BoardError> {
                (**self).add_attachment(task_id, new).await
            }
            async fn attachments(
                &self,
                task_id: Option<&str>,
            ) -> Result<Vec<::kanban_core::attachments::AttachmentRecord>, ::kanban_core::BoardError>
            {
                (**self).attachments(task_id).await
            }
            async fn remove_attachment(
                &self,
                id: i64,
            ) -> Result<Option<::kanban_core::attachments::AttachmentRecord>, ::kanban_core::BoardError>
            {
                (**self).remove_attachment(id).await
            }
            async fn reclaim(
                &self,
                task_id: &str,
                reason: &str,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).reclaim(task_id, reason).await
            }
            async fn show_task(
                &self,
                task_id: &str,
            ) -> Result<::kanban_core::TaskView, ::kanban_core::BoardError> {
                (**self).show_task(task_id).await
            }
            async fn list_tasks(
                &self,
                status: Option<::kanban_core::TaskStatus>,
            ) -> Result<Vec<::kanban_core::TaskRecord>, ::kanban_core::BoardError> {
                (**self).list_tasks(status).await
            }
            async fn list_page(
                &self,
                status: Option<::kanban_core::TaskStatus>,
                after: Option<i64>,
                limit: usize,
            ) -> Result<::kanban_core::TaskPage, ::kanban_core::BoardError> {
                (**self).list_page(status, after, limit).await
            }
            async fn recent_events(
                &self,
                limit: usize,
            ) -> Result<Vec<::kanban_core::EventRecord>, ::kanban_core::BoardError> {
                (**self).recent_events(limit).await
            }
            async fn link(
                &self,
                parent: &str,
                child: &str,
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).link(parent, child).await
            }
            async fn unlink(
                &self,
                parent: &str,
                child: &str,
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).unlink(parent, child).await
            }
            async fn links(&self) -> Result<Vec<(String, String)>, ::kanban_core::BoardError> {
                (**self).links().await
            }
            async fn last_runs(
                &self,
            ) -> Result<::std::collections::BTreeMap<String, i64>, ::kanban_core::BoardError> {
                (**self).last_runs().await
            }
            async fn booked_exit_code(
                &self,
                claim: &::kanban_core::Claim,
            ) -> Result<i32, ::kanban_core::BoardError> {
                (**self).booked_exit_code(claim).await
            }
        }

        #[$crate::async_trait]
        impl ::kanban_core::DispatchBoard for $board {
            async fn running_workers(
                &self,
            ) -> Result<Vec<::kanban_core::RunningWorker>, ::kanban_core::BoardError> {
                (**self).running_workers().await
            }
            async fn claim_next_ready(
                &self,
                ttl_seconds: i64,
                claim_lock: &str,
                filter: &::kanban_core::ClaimFilter,
            ) -> Result<Option<::kanban_core::ClaimGrant>, ::kanban_core::BoardError> {
                (**self)
                    .claim_next_ready(ttl_seconds, claim_lock, filter)
                    .await
            }
            async fn claim_ready_batch(
                &self,
                ttl_seconds: i64,
                claim_locks: &[String],
                filter: &::kanban_core::ClaimFilter,
            ) -> Result<Vec<::kanban_core::ClaimGrant>, ::kanban_core::BoardError> {
                (**self)
                    .claim_ready_batch(ttl_seconds, claim_locks, filter)
                    .await
            }
            async fn claim_lane(
                &self,
                limit: usize,
            ) -> Result<Vec<::kanban_core::rules::ClaimCandidate>, ::kanban_core::BoardError> {
                (**self).claim_lane(limit).await
            }
            async fn report_dispatcher(
                &self,
                report: &::kanban_core::DispatcherReport,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).report_dispatcher(report).await
            }
            async fn walls(
                &self,
            ) -> Result<Vec<::kanban_core::walls::Wall>, ::kanban_core::BoardError> {
                (**self).walls().await
            }
            async fn start_probe(
                &self,
                claim: &::kanban_core::Claim,
                scopes: &[String],
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).start_probe(claim, scopes).await
            }
            async fn record_spawn(
                &self,
                claim: &::kanban_core::Claim,
                process: &::kanban_core::WorkerProcess,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).record_spawn(claim, process).await
            }
            async fn record_signal(
                &self,
                claim: &::kanban_core::Claim,
                signal: i32,
                reason: ::kanban_core::SignalReason,
            ) -> Result<(), ::kanban_core::BoardError> {
                (**self).record_signal(claim, signal, reason).await
            }
            async fn extend_lease(
                &self,
                claim: &::kanban_core::Claim,
                expires: i64,
                record: Option<(&'static str, &'static str)>,
            ) -> Result<bool, ::kanban_core::BoardError> {
                (**self).extend_lease(claim, expires, record).await
            }
            async fn booked_result(
                &self,
                claim: &::kanban_core::Claim,
            ) -> Result<Option<::kanban_core::WorkerResult>, ::kanban_core::BoardError> {
                (**self).booked_result(claim).await
            }
            async fn book_exit(
                &self,
                claim: &::kanban_core::Claim,
                report: &::kanban_core::ExitReport,
            ) -> Result<::kanban_core::Booking, ::kanban_core::BoardError> {
                (**self).book_exit(claim, report).await
            }
            async fn release_claim(
                &self,
                claim: &::kanban_core::Claim,
                release: &::kanban_core::rules::Release,
                policy: &::kanban_core::rules::FailurePolicy,
            ) -> Result<::kanban_core::rules::Released, ::kanban_core::BoardError> {
                (**self).release_claim(claim, release, policy).await
            }
            async fn promote_ready(&self) -> Result<usize, ::kanban_core::BoardError> {
                (**self).promote_ready().await
            }
            async fn check_health(&self) -> Result<(), ::kanban_core::BoardError> {
                (**self).check_health().await
            }
        }
    };
}

/// The wall clock, in whole epoch seconds, and a monotonic clock beside it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

fn process_start() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

impl kanban_core::Clock for SystemClock {
    #[expect(
        clippy::disallowed_methods,
        reason = "the wall clock itself: every other read of time goes through a Clock"
    )]
    fn now(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| {
                i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
            })
    }

    fn monotonic_millis(&self) -> u64 {
        u64::try_from(process_start().elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}
