//! Which writes wait for the server's log flush, on a real server.
//!
//! The server here makes every synced commit wait for a synchronous
//! standby that never connects (`synchronous_standby_names`), so a write
//! that waits for its sync never answers, and one that does not answers at
//! once. On PostgreSQL only the records nobody alive can act on commit
//! unsynced (docs/ARCHITECTURE.md, the PostgreSQL board): a worker
//! outlives a server that crashed, and would go on believing in a lease
//! extension or a bind the crash took.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use kanban_core::{
    Board, BoardAdmin, BookingKind, ClaimFilter, DispatchBoard, ExitWitness, NewTask, TickDurations,
};
use kanban_testkit::board_contract::exit_report;
use kanban_testkit::{ClusterOptions, PgCluster, TempPgBoard, VirtualClock, block_on};

/// Runs `call` on a thread of its own; its answer arrives on the receiver.
fn started<T: Send + 'static>(call: impl FnOnce() -> T + Send + 'static) -> Receiver<T> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(call());
    });
    receiver
}

/// Whether a synced write from a session of its own now waits: the
/// server applies a reloaded setting a moment after it is asked to.
fn synced_commits_wait(cluster: &Arc<PgCluster>, url: &str) -> bool {
    for _ in 0..50 {
        let (cluster, url) = (cluster.clone(), url.to_owned());
        let probe = started(move || cluster.admin_on(&url, "INSERT INTO sync_probe VALUES (1)"));
        match probe.recv_timeout(Duration::from_secs(1)) {
            Err(RecvTimeoutError::Timeout) => return true,
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    false
}

#[test]
fn only_a_settled_run_s_exit_and_tick_counts_commit_without_waiting_for_the_log_flush() {
    let cluster = Arc::new(PgCluster::start(&ClusterOptions::default()));
    let name = cluster.fresh_database_name();
    // The test server leaves every commit unsynced; this database's
    // sessions sync theirs, as a production server's do.
    cluster.admin(&format!(
        "ALTER DATABASE {name} SET synchronous_commit = on"
    ));
    let url = cluster.url(&name);
    cluster.admin_on(&url, "CREATE TABLE sync_probe (n integer)");
    let board = Arc::new(TempPgBoard::at(&url, VirtualClock::at(1_700_000_000)));
    let mut claims = Vec::new();
    for n in 0..4 {
        block_on(board.create_task(&NewTask {
            title: format!("card {n}"),
            ..NewTask::default()
        }))
        .unwrap();
        let grant =
            block_on(board.claim_ready_batch(600, &[format!("host:1:{n}")], &ClaimFilter::any()))
                .unwrap()
                .remove(0);
        claims.push(grant.claim);
    }
    let [settled, crashed, extended, bound] = <[_; 4]>::try_from(claims).unwrap();
    block_on(board.complete(&settled, "done", None)).unwrap();

    cluster.admin("ALTER SYSTEM SET synchronous_standby_names = 'standby_that_never_comes'");
    cluster.admin("SELECT pg_reload_conf()");
    assert!(
        synced_commits_wait(&cluster, &url),
        "the server never began to wait for its standby"
    );

    // Writes that must be synced: each waits as long as the standby stays away.
    let synced = [
        ("a crash's booking", {
            let board = board.clone();
            started(move || {
                let report = exit_report(ExitWitness::Code(3));
                block_on(board.book_exit(&crashed, &report)).map(|booking| Some(booking.kind))
            })
        }),
        ("a heartbeat", {
            let board = board.clone();
            started(move || block_on(board.heartbeat(&extended, None)).map(|_| None))
        }),
        ("a bind", {
            let board = board.clone();
            started(move || block_on(board.bind_worker(&bound, 4242)).map(|()| None))
        }),
    ];

    // Records: they answer while the synced writes wait.
    let unsynced = {
        let board = board.clone();
        started(move || {
            let booking = block_on(board.book_exit(&settled, &exit_report(ExitWitness::Code(0))));
            let mut ticks = TickDurations::default();
            ticks.observe(3);
            let counted = block_on(board.record_ticks("host", &ticks));
            (booking, counted)
        })
    };
    let (booking, counted) = unsynced
        .recv_timeout(Duration::from_secs(20))
        .expect("a settled run's exit and tick counts do not wait for the log flush");
    assert_eq!(booking.unwrap().kind, BookingKind::Settled);
    counted.unwrap();
    for (what, answer) in &synced {
        assert!(
            matches!(
                answer.recv_timeout(Duration::from_secs(1)),
                Err(RecvTimeoutError::Timeout)
            ),
            "{what} waits for the log flush"
        );
    }

    // With the standby no longer required, the waiting writes end, done.
    cluster.admin("ALTER SYSTEM RESET synchronous_standby_names");
    cluster.admin("SELECT pg_reload_conf()");
    for (what, answer) in synced {
        let booked = answer
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{what} ends once the standby is not required"))
            .unwrap_or_else(|error| panic!("{what}: {error}"));
        if what == "a crash's booking" {
            assert_eq!(booked, Some(BookingKind::Crashed));
        }
    }
}
