//! The board on a real server under contention: a claim never waits for a
//! row another transaction holds, claimers racing on one lane never take a
//! card twice, and a fenced write waits for its card's row and is judged on
//! what the other transaction left.

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::Duration;

use kanban_core::{BoardAdmin, ClaimFilter, DispatchBoard, NewTask};
use kanban_testkit::{PgCluster, TempPgBoard, VirtualClock, block_on};

fn card(board: &TempPgBoard, title: &str, priority: i64) -> String {
    block_on(board.create_task(&NewTask {
        title: title.to_owned(),
        priority,
        ..NewTask::default()
    }))
    .unwrap()
}

/// Runs `claim` on a thread; fails the test if it does not answer within
/// `limit` (a claim that waits on a lock would sit there until released).
fn answers_within<T: Send + 'static>(
    limit: Duration,
    claim: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(claim());
    });
    receiver
        .recv_timeout(limit)
        .expect("the claim waited on another transaction's row lock")
}

/// Another session, in a transaction that holds card `id`'s row lock until
/// it is committed through the client returned.
fn hold_row(url: &str, id: &str) -> (tokio::runtime::Runtime, tokio_postgres::Client) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, connection) = runtime
        .block_on(tokio_postgres::connect(url, tokio_postgres::NoTls))
        .unwrap();
    runtime.spawn(connection);
    runtime
        .block_on(client.batch_execute(&format!(
            "BEGIN; SELECT 1 FROM tasks WHERE id = '{id}' FOR UPDATE"
        )))
        .unwrap();
    (runtime, client)
}

#[test]
fn a_claim_skips_a_card_another_transaction_holds_instead_of_waiting() {
    let url = PgCluster::shared().fresh_database();
    let time = VirtualClock::at(1_000_000);
    let board = std::sync::Arc::new(TempPgBoard::at(&url, time.clone()));
    let first = card(&board, "first in line", 9);
    let second = card(&board, "second in line", 0);
    // Another session holds the first card's row, as a slow writer would.
    let (runtime, client) = hold_row(&url, &first);
    let held = board.clone();
    let grant = answers_within(Duration::from_secs(20), move || {
        block_on(held.claim_next_ready(600, "host:1:a", &ClaimFilter::any())).unwrap()
    });
    assert_eq!(
        grant.map(|grant| grant.claim.task_id),
        Some(second.clone()),
        "the held card is skipped, the next one claimed"
    );
    let held = board.clone();
    let by_id = first.clone();
    let direct = answers_within(Duration::from_secs(20), move || {
        block_on(held.claim_task(&by_id, 600, "host:1:b")).unwrap()
    });
    assert!(direct.is_none(), "a held card is not claimed by id either");
    runtime.block_on(client.batch_execute("COMMIT")).unwrap();
    let grant = block_on(board.claim_next_ready(600, "host:1:c", &ClaimFilter::any())).unwrap();
    assert_eq!(grant.map(|grant| grant.claim.task_id), Some(first));
}

#[test]
fn sixteen_claimers_on_one_lane_take_every_card_exactly_once() {
    let url = PgCluster::shared().fresh_database();
    let time = VirtualClock::at(1_000_000);
    let board = TempPgBoard::at(&url, time.clone());
    let total = 240;
    for n in 0..total {
        card(&board, &format!("card {n}"), n % 5);
    }
    let claimers: Vec<_> = (0..16)
        .map(|claimer| {
            let url = url.clone();
            let time = time.clone();
            std::thread::spawn(move || {
                // Each claimer is a board of its own: its own connections.
                let board = TempPgBoard::at(&url, time);
                let mut taken = Vec::new();
                for n in 0.. {
                    let lock = format!("host-{claimer}:1:{n}");
                    let locks = [lock.clone(), format!("{lock}b")];
                    let grants = if n % 2 == 0 {
                        block_on(board.claim_next_ready(600, &lock, &ClaimFilter::any()))
                            .unwrap()
                            .into_iter()
                            .collect::<Vec<_>>()
                    } else {
                        block_on(board.claim_ready_batch(600, &locks, &ClaimFilter::any())).unwrap()
                    };
                    if grants.is_empty() {
                        break;
                    }
                    taken.extend(grants.into_iter().map(|grant| grant.claim));
                }
                taken
            })
        })
        .collect();
    let mut cards = BTreeSet::new();
    let mut runs = BTreeSet::new();
    let mut claims = 0;
    for claimer in claimers {
        for claim in claimer.join().unwrap() {
            claims += 1;
            cards.insert(claim.task_id);
            runs.insert(claim.run_id);
        }
    }
    assert_eq!(claims, total as usize, "one claim per card");
    assert_eq!(cards.len(), total as usize, "no card claimed twice");
    assert_eq!(runs.len(), total as usize, "no run id handed out twice");
    let ready = block_on(board.list_tasks(Some(kanban_core::TaskStatus::Ready))).unwrap();
    assert!(ready.is_empty());
}

#[test]
fn racing_creates_with_one_idempotency_key_make_one_card() {
    let url = PgCluster::shared().fresh_database();
    let time = VirtualClock::at(1_000_000);
    let creators: Vec<_> = (0..8)
        .map(|_| {
            let (url, time) = (url.clone(), time.clone());
            std::thread::spawn(move || {
                let board = TempPgBoard::at(&url, time);
                (0..20)
                    .map(|round| {
                        block_on(board.create_task(&NewTask {
                            title: format!("retried {round}"),
                            idempotency_key: Some(format!("key-{round}")),
                            ..NewTask::default()
                        }))
                        .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<Vec<String>> = creators.into_iter().map(|c| c.join().unwrap()).collect();
    for round in 0..20 {
        let distinct: BTreeSet<&String> = ids.iter().map(|ids| &ids[round]).collect();
        assert_eq!(
            distinct.len(),
            1,
            "key-{round} made {} cards",
            distinct.len()
        );
    }
    let board = TempPgBoard::at(&url, time);
    assert_eq!(block_on(board.list_tasks(None)).unwrap().len(), 20);
}

#[test]
fn a_fenced_write_waits_for_a_change_to_its_card_and_is_judged_on_what_it_left() {
    let url = PgCluster::shared().fresh_database();
    let time = VirtualClock::at(1_000_000);
    let board = std::sync::Arc::new(TempPgBoard::at(&url, time.clone()));
    let id = card(&board, "taken back meanwhile", 0);
    let claim = block_on(board.claim_task(&id, 600, "host:1:w"))
        .unwrap()
        .unwrap()
        .claim;
    // Another session holds the card's row, about to take the claim back.
    let (runtime, client) = hold_row(&url, &id);
    let (sender, receiver) = mpsc::channel();
    let writer = board.clone();
    std::thread::spawn(move || {
        let _ = sender.send(block_on(writer.complete(&claim, "done", None)));
    });
    assert!(
        receiver.recv_timeout(Duration::from_millis(500)).is_err(),
        "the write waits for the row"
    );
    runtime
        .block_on(client.batch_execute(&format!(
            "UPDATE tasks SET status = 'ready', claim_lock = NULL, claim_expires = NULL,
                              worker_pid = NULL, current_run_id = NULL
              WHERE id = '{id}';
             COMMIT"
        )))
        .unwrap();
    let written = receiver.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        matches!(written, Err(kanban_core::BoardError::LeaseLost { .. })),
        "judged on the card as the other session left it: {written:?}"
    );
    let card = block_on(board.show_task(&id)).unwrap();
    assert_eq!(card.task.status, kanban_core::TaskStatus::Ready);
}
