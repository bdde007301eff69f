//! Booking the exits of workers and releasing claims, kept for another
//! attempt when the board could not take them.

use crate::booking::{ExitWitness, SignalReason};
use crate::data::{Claim, Release, Released};

use crate::BoardError;
use crate::dispatcher::routing::wall_hit;
use crate::dispatcher::{
    BOOKING_ATTEMPTS, DispatchEvent, Dispatcher, ExitReport, RunLog, UNBOOKED_LIMIT, WorkerExit,
};

use crate::walls::{ProviderId, entitled_provider};

/// What the board could not take yet.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// Exits to book, with the failed attempts at each.
    pub(super) unbooked: Vec<(Claim, ExitReport, u32)>,
    /// Claims to release.
    pub(super) unreleased: Vec<(Claim, Release)>,
}

impl Dispatcher {
    pub(super) async fn release(&mut self, claim: &Claim, release: Release) {
        let why = match &release {
            Release::Expired => "its lease ran out and its worker is gone".to_owned(),
            Release::NotStarted { reason } => reason.clone(),
        };
        match self
            .ports
            .board
            .release_claim(claim, &release, &self.settings.failure_policy)
            .await
        {
            Ok(Released::NotHeld) => {}
            Ok(released) => {
                self.ports.supervisor.sweep(claim).await;
                self.note(DispatchEvent::Released {
                    task_id: claim.task_id.clone(),
                    counted: released == Released::Counted,
                    why,
                });
            }
            Err(error) => {
                self.board_trouble(&error);
                keep(&mut self.backlog.unreleased, (claim.clone(), release));
            }
        }
    }

    pub(super) async fn retry_unreleased(&mut self) {
        let pending = std::mem::take(&mut self.backlog.unreleased);
        for (claim, release) in pending {
            self.release(&claim, release).await;
        }
    }

    pub(super) async fn report(
        &mut self,
        claim: &Claim,
        witness: ExitWitness,
        source: &'static str,
        signalled: Option<SignalReason>,
        log: RunLog,
    ) -> ExitReport {
        // What the worker booked, whoever witnessed the exit.
        let result = self.ports.board.booked_result(claim).await.ok().flatten();
        let retry_after_seconds = result
            .as_ref()
            .and_then(|result| result.retry_after_seconds);
        let route = self.routing.run_routes.get(&claim.run_id).cloned();
        let wall = match (&result, &route) {
            (Some(result), Some(route)) => {
                let reported = ProviderId {
                    provider: result.provider.clone(),
                    model: result.model.clone(),
                };
                let entitled = self
                    .settings
                    .routes
                    .get(route)
                    .map(|agent| entitled_provider(&agent.provider, &reported))
                    .unwrap_or_default();
                wall_hit(result, route, &self.identity(route), &entitled)
            }
            _ => None,
        };
        ExitReport {
            wall,
            witness,
            source,
            signalled,
            output_tail: log.output_tail,
            policy: self.settings.failure_policy,
            retry_after_seconds,
            unbookable: None,
        }
    }

    /// Ends the bookkeeping of a worker that ended: a worker that reported
    /// a fault of the environment has its claim released uncounted and
    /// halts (or pauses) this dispatcher; any other exit is booked.
    pub(super) async fn conclude(
        &mut self,
        claim: &Claim,
        witness: ExitWitness,
        source: &'static str,
        signalled: Option<SignalReason>,
        log: RunLog,
    ) -> bool {
        if let Some(fault) = log.fault.clone() {
            let reason = format!("its worker could not work the card: {fault}");
            match self
                .ports
                .board
                .release_claim(
                    claim,
                    &Release::NotStarted {
                        reason: reason.clone(),
                    },
                    &self.settings.failure_policy,
                )
                .await
            {
                Ok(Released::NotHeld) => {}
                Ok(Released::Uncounted | Released::Counted) => {
                    self.ports.supervisor.sweep(claim).await;
                    self.note(DispatchEvent::Released {
                        task_id: claim.task_id.clone(),
                        counted: false,
                        why: reason,
                    });
                    self.halt(fault);
                    return true;
                }
                Err(error) => {
                    self.board_trouble(&error);
                    self.halt(fault);
                }
            }
        }
        let report = self.report(claim, witness, source, signalled, log).await;
        self.book(claim, report).await
    }

    pub(super) async fn book(&mut self, claim: &Claim, report: ExitReport) -> bool {
        self.book_attempt(claim, report, 0).await
    }

    /// Books `report`, which `failures` earlier attempts could not. An exit
    /// the board refused [`BOOKING_ATTEMPTS`] times for no fault of the
    /// environment is booked without the worker's output, its card blocked
    /// with the reason: one card's content never stops the board.
    async fn book_attempt(&mut self, claim: &Claim, report: ExitReport, failures: u32) -> bool {
        let error = match self.ports.board.book_exit(claim, &report).await {
            Ok(booking) => {
                self.booked(claim, &report, booking).await;
                return true;
            }
            Err(error) => error,
        };
        let failures = failures.saturating_add(1);
        if failures >= BOOKING_ATTEMPTS && report.unbookable.is_none() && of_content(&error) {
            let plain = ExitReport {
                output_tail: String::new(),
                wall: None,
                unbookable: Some(error.to_string()),
                ..report.clone()
            };
            if let Ok(booking) = self.ports.board.book_exit(claim, &plain).await {
                // The board took the plain booking: the refusal was the
                // exit's content's, no fault of the environment, and pauses
                // nothing.
                self.note(DispatchEvent::BoardTrouble {
                    message: error.to_string(),
                });
                self.booked(claim, &plain, booking).await;
                return true;
            }
        }
        self.board_trouble(&error);
        keep(
            &mut self.backlog.unbooked,
            (claim.clone(), report, failures),
        );
        false
    }

    async fn booked(&mut self, claim: &Claim, report: &ExitReport, booking: crate::Booking) {
        // Whatever of the run still runs (an agent the worker left behind)
        // stops now.
        self.ports.supervisor.sweep(claim).await;
        self.note(DispatchEvent::Booked {
            task_id: claim.task_id.clone(),
            witness: report.witness,
            source: report.source,
            booking,
        });
    }

    pub(super) async fn retry_unbooked(&mut self) {
        let pending = std::mem::take(&mut self.backlog.unbooked);
        for (claim, report, failures) in pending {
            self.book_attempt(&claim, report, failures).await;
        }
    }

    pub(super) async fn book_child(&mut self, exit: WorkerExit) -> bool {
        let Some(child) = self.children.remove(&exit.pid) else {
            return false;
        };
        let signalled = self
            .stopping
            .remove(&i64::from(exit.pid))
            .map(|stop| stop.reason);
        let log = self
            .ports
            .supervisor
            .run_log(&child.claim, child.process.seal_digest.as_deref())
            .await;
        self.conclude(&child.claim, exit.witness, "wait", signalled, log)
            .await
    }

    /// Books a worker of this host that ended while nobody waited for it:
    /// from its own `worker_result`, else its sealed log trailer.
    pub(super) async fn book_dead(
        &mut self,
        claim: &Claim,
        signalled: Option<SignalReason>,
        seal_digest: Option<&str>,
    ) -> bool {
        let log = self.ports.supervisor.run_log(claim, seal_digest).await;
        let booked = self.ports.board.booked_result(claim).await.ok().flatten();
        let (witness, source) = match (booked, log.trailer_code) {
            (Some(result), _) => (ExitWitness::Code(result.exit_code.code()), "worker_result"),
            (None, Some(code)) => (ExitWitness::Code(code), "trailer"),
            (None, None) => (ExitWitness::Unknown, "none"),
        };
        self.conclude(claim, witness, source, signalled, log).await
    }
}

/// Whether a failed booking may be the exit's own content's fault: not when
/// the board was busy, full or unusable, which every write would meet.
fn of_content(error: &BoardError) -> bool {
    !matches!(
        error,
        BoardError::Busy { .. }
            | BoardError::DiskFull { .. }
            | BoardError::Unusable { .. }
            | BoardError::NewerSchema { .. }
    )
}

/// Keeps `item` for another attempt, unless `queue` already holds
/// [`UNBOOKED_LIMIT`]: what a board refuses for good must not grow a
/// dispatcher's memory without bound.
fn keep<T>(queue: &mut Vec<T>, item: T) {
    if queue.len() < UNBOOKED_LIMIT {
        queue.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backlog_keeps_up_to_its_limit_and_no_more() {
        let mut queue = vec![0; UNBOOKED_LIMIT - 1];
        keep(&mut queue, 1);
        assert_eq!(queue.len(), UNBOOKED_LIMIT, "the last place is taken");
        keep(&mut queue, 2);
        assert_eq!(queue.len(), UNBOOKED_LIMIT, "none beyond it");
        assert_eq!(queue.last(), Some(&1));
        let mut empty = Vec::new();
        keep(&mut empty, 3);
        assert_eq!(empty, [3]);
    }

    #[test]
    fn only_a_refusal_every_write_would_not_meet_is_the_exits_content() {
        assert!(of_content(&BoardError::Storage("refused".into())));
        assert!(!of_content(&BoardError::Busy { attempts: 8 }));
        assert!(!of_content(&BoardError::DiskFull { path: "b".into() }));
        let path = "b".to_owned();
        let message = "gone".to_owned();
        assert!(!of_content(&BoardError::Unusable { path, message }));
    }
}
