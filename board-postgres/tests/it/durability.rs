//! Which writes wait for the server's log flush, on a real server.
//!
//! The server here makes every synced commit wait for a synchronous
//! standby that never connects (`synchronous_standby_names`): a write that
//! waits for its sync shows in `pg_stat_activity` waiting for it (`SyncRep`)
//! and never answers, and one that does not answers at once. On PostgreSQL only the records nobody alive can act on commit
//! unsynced (docs/ARCHITECTURE.md, the PostgreSQL board): a worker
//! outlives a server that crashed, and would go on believing in a lease
//! extension or a bind the crash took.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use kanban_core::{
    Board, BoardAdmin, BookingKind, ClaimFilter, DispatchBoard, DispatcherReport, DispatcherState,
    ExitWitness, NewTask, TickDurations,
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

/// How many sessions of the cluster wait for their commit to reach a
/// synchronous standby (`wait_event` `SyncRep`): exactly the synced commits
/// made since the standby became required.
fn waiting_for_the_standby(cluster: &PgCluster) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = cluster
            .socket_config("postgres")
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap();
        let driver = tokio::spawn(connection);
        let row = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
                &[],
            )
            .await
            .unwrap();
        drop(client);
        let _ = driver.await;
        row.get(0)
    })
}

/// Waits up to 20 s for `count` sessions waiting on the standby; the count
/// last seen.
fn until_waiting(cluster: &PgCluster, count: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting = waiting_for_the_standby(cluster);
        if waiting >= count || Instant::now() >= deadline {
            return waiting;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Makes a synced write from a session of its own until one waits for
/// the standby: the server applies a reloaded setting a moment after it is
/// asked to, and a probe made before commits at once.
fn synced_commits_wait(cluster: &Arc<PgCluster>, url: &str) -> bool {
    for _ in 0..50 {
        let (probing, url) = (cluster.clone(), url.to_owned());
        let probe = started(move || probing.admin_on(&url, "INSERT INTO sync_probe VALUES (1)"));
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if waiting_for_the_standby(cluster) == 1 {
                return true;
            }
            if !matches!(probe.try_recv(), Err(TryRecvError::Empty)) {
                break; // committed without waiting: not applied yet
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
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
            let report = DispatcherReport {
                host: "host".to_owned(),
                ticks,
                in_flight: 1,
                state: DispatcherState::Claiming,
            };
            let counted = block_on(board.report_dispatcher(&report));
            (booking, counted)
        })
    };
    let (booking, counted) = unsynced
        .recv_timeout(Duration::from_secs(20))
        .expect("a settled run's exit and tick counts do not wait for the log flush");
    assert_eq!(booking.unwrap().kind, BookingKind::Settled);
    counted.unwrap();
    // The probe and the three synced writes, each waiting for the standby.
    let waiting = until_waiting(&cluster, 4);
    for (what, answer) in &synced {
        assert!(
            matches!(answer.try_recv(), Err(TryRecvError::Empty)),
            "{what} waits for the log flush"
        );
    }
    assert_eq!(waiting, 4, "sessions waiting for the standby");

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
