//! The binary on a PostgreSQL board (a real server: the test cluster):
//! init, cards, claims and the proof by URL, and several dispatchers
//! ticking one board at once.

use std::collections::BTreeMap;
use std::process::Stdio;

use kanban_testkit::{AgentScript, AgentTurn};
use serde_json::Value;

use crate::{Bench, runs, text};

const SUCCESS: &str = r#"{"completed": true, "final_response": "all done"}"#;

fn cards(bench: &Bench) -> Vec<Value> {
    serde_json::from_str::<Value>(&bench.ok(&["ls", "--json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_postgres_board_takes_cards_claims_and_proofs_by_url() {
    let bench = Bench::postgres();
    let url = bench.db.to_str().unwrap().to_owned();
    let said = bench.ok(&["init"]);
    assert!(said.contains("PostgreSQL"), "{said}");
    let id = bench.add("on the server", &[]);
    assert_eq!(cards(&bench).len(), 1);
    let carrier = bench.claim(&id, Some(600));
    let db = &carrier
        .iter()
        .find(|(k, _)| k == kanban_core::vars::DB)
        .unwrap()
        .1;
    assert_eq!(db, &url, "the carrier names the board's URL");
    // The proof, by the carrier alone and by flags.
    let prove = |extra: &[(&str, &str)]| {
        bench
            .command()
            .envs(carrier.iter().map(|(k, v)| (k, v)))
            .envs(extra.iter().copied())
            .args(["prove", "--json"])
            .output()
            .unwrap()
    };
    let live = prove(&[]);
    assert_eq!(live.status.code(), Some(0), "{}", text(&live.stderr));
    assert!(text(&live.stdout).contains("\"live\":true"));
    let stale = prove(&[(kanban_core::vars::RUN_ID, "999999")]);
    assert_eq!(stale.status.code(), Some(1));
    assert!(
        text(&stale.stdout).contains("run_moved") || text(&stale.stdout).contains("run"),
        "{}",
        text(&stale.stdout)
    );
    // An agent's board call through the carrier completes the card.
    let complete = bench
        .command()
        .envs(carrier.iter().map(|(k, v)| (k, v)))
        .args(["complete", "--summary", "done by hand"])
        .output()
        .unwrap();
    assert!(complete.status.success(), "{}", text(&complete.stderr));
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    // Once done, the claim proves nothing.
    assert_eq!(prove(&[]).status.code(), Some(1));
}

#[test]
fn a_password_in_the_url_is_refused_and_never_echoed() {
    let bench = Bench::postgres();
    let url = bench
        .db
        .to_str()
        .unwrap()
        .replace("kanban@", "kanban:hunter2@");
    let output = bench.command().args(["--db", &url, "ls"]).output().unwrap();
    let said = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{said}");
    assert!(said.contains("PGPASSWORD"), "{said}");
    assert!(!said.contains("hunter2"), "{said}");
}

#[test]
fn an_unreachable_server_is_named_and_nothing_is_claimed() {
    let bench = Bench::postgres();
    let dead = "postgres://kanban@127.0.0.1:1/nothing";
    let output = bench
        .command()
        .args(["--db", dead, "dispatch", "--once", "--agent", "true"])
        .output()
        .unwrap();
    let said = text(&output.stderr);
    assert_ne!(output.status.code(), Some(0), "{said}");
    assert!(said.contains("127.0.0.1:1"), "{said}");
    assert!(said.contains("nothing was claimed"), "{said}");
}

#[test]
fn three_dispatchers_share_one_postgres_board_and_no_card_runs_twice() {
    let bench = Bench::postgres();
    let total = 60;
    for n in 0..total {
        bench.add(&format!("card {n}"), &[]);
    }
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).completing()])
        .write(bench.path(), "agent.sh");
    let dispatchers: Vec<_> = (0..3)
        .map(|_| {
            bench
                .dispatch_command(&agent.path, &["--max-in-progress", "4", "--until-idle"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for dispatcher in dispatchers {
        let output = dispatcher.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}\n{}",
            text(&output.stdout),
            text(&output.stderr)
        );
    }
    let mut runs_per_card = BTreeMap::new();
    for card in cards(&bench) {
        let id = card["id"].as_str().unwrap().to_owned();
        assert_eq!(card["status"], "done", "{card}");
        runs_per_card.insert(id.clone(), runs(&bench.show(&id)).len());
    }
    assert_eq!(runs_per_card.len(), total);
    assert!(
        runs_per_card.values().all(|runs| *runs == 1),
        "every card ran exactly once: {runs_per_card:?}"
    );
}

#[test]
fn kanban_serve_shows_a_postgres_board_and_goes_live_on_its_notifications() {
    let bench = Bench::postgres();
    let id = bench.add("served from postgres", &[]);
    let server = crate::serve::Server::start(&bench, &[]);
    let (status, page) = crate::serve::get(&format!("{}/", server.url));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("served from postgres"), "{page}");
    assert!(
        page.contains(bench.db.to_str().unwrap()),
        "the page names the board"
    );
    let (status, card) = crate::serve::get(&format!("{}/api/cards/{id}", server.url));
    assert_eq!(status, 200, "{card}");
    assert!(card.contains(&id), "{card}");
    let (status, metrics) = crate::serve::get(&format!("{}/metrics", server.url));
    assert_eq!(status, 200, "{metrics}");
    assert!(metrics.contains("status=\"ready\"} 1"), "{metrics}");
    a_new_card_reaches_the_open_page(&bench, &server.url);
}

/// A card added through the CLI reaches a page open on the server at `url`
/// through the board's notifications: the server has no other way to hear
/// of it (a PostgreSQL board's watch does not poll).
fn a_new_card_reaches_the_open_page(bench: &Bench, url: &str) {
    use std::io::BufRead;
    let live = ureq::get(&format!("{url}/live")).call().unwrap();
    let (sender, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let reader = std::io::BufReader::new(live.into_body().into_reader());
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if line.contains("changed") && sender.send(()).is_err() {
                break;
            }
        }
    });
    // Whatever the server says as it starts listening is not the card's.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    while seen.try_recv().is_ok() {}
    bench.add("added while the page is open", &[]);
    seen.recv_timeout(std::time::Duration::from_secs(20))
        .expect("the page heard of the new card");
}

#[test]
fn a_dispatcher_rides_out_a_server_restart_and_no_card_is_charged() {
    let mut cluster = kanban_testkit::PgCluster::start(&kanban_testkit::ClusterOptions::default());
    let bench = Bench::postgres_at(&cluster.fresh_database());
    let before = bench.add("before the restart", &[]);
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).completing()])
        .write(bench.path(), "agent.sh");
    let mut dispatcher = bench
        .dispatch_command(&agent.path, &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    crate::wait_for("the first card", || {
        bench.show(&before)["task"]["status"] == "done"
    });
    // The server goes away for two seconds: every connection is lost.
    cluster.restart(std::time::Duration::from_secs(2));
    let after = bench.add("after the restart", &[]);
    let started = std::time::Instant::now();
    let finished = loop {
        if bench.show(&after)["task"]["status"] == "done" {
            break true;
        }
        if started.elapsed() > std::time::Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let halted = dispatcher.try_wait().unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(dispatcher.id()).unwrap()),
        nix::sys::signal::Signal::SIGINT,
    );
    let output = dispatcher.wait_with_output().unwrap();
    let said = format!("{}\n{}", text(&output.stdout), text(&output.stderr));
    assert!(
        halted.is_none(),
        "the dispatcher paused and went on; it did not halt: {said}"
    );
    assert!(finished, "the card added after the restart ran: {said}");
    for id in [&before, &after] {
        let card = bench.show(id);
        assert_eq!(runs(&card).len(), 1, "{id} ran once: {said}");
        assert_eq!(
            card["task"]["consecutive_failures"], 0,
            "{id} was not charged: {said}"
        );
    }
    drop(cluster);
}

#[test]
fn only_init_migrate_and_dispatch_create_a_postgres_schema() {
    let url = kanban_testkit::PgCluster::shared().fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let bench = Bench {
        dir,
        db: std::path::PathBuf::from(&url),
        home: Some(home),
    };
    // A listing, a proof and an agent's call find no board and create none.
    let listing = bench.run(&["ls"]);
    let said = text(&listing.stderr);
    assert_eq!(listing.status.code(), Some(1), "{said}");
    assert!(said.contains("kanban --db URL init"), "{said}");
    let proof = bench
        .command()
        .env(kanban_core::vars::DB, &url)
        .env(kanban_core::vars::TASK, "t_00000001")
        .env(kanban_core::vars::RUN_ID, "1")
        .env(kanban_core::vars::CLAIM_LOCK, "host:1:x")
        .args(["prove", "--json"])
        .output()
        .unwrap();
    assert_eq!(proof.status.code(), Some(1), "{}", text(&proof.stderr));
    assert!(
        bench.run(&["ls"]).status.code() == Some(1),
        "still no board"
    );
    // `init` makes it.
    bench.ok(&["init"]);
    assert_eq!(cards(&bench).len(), 0);
}

/// Whether the server at `url` refuses a connection without TLS.
fn refuses_plain_text(url: &str) -> bool {
    let home = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(crate::BIN)
        .env(kanban_core::vars::HOME, home.path())
        .args(["--db", url, "ls"])
        .output()
        .unwrap();
    text(&output.stderr).contains("no encryption")
}

/// A cluster of its own that speaks TLS with a certificate for 127.0.0.1
/// signed by a CA of the test's, and refuses every TCP connection without
/// TLS; returns it and the CA's certificate file.
fn tls_cluster() -> (kanban_testkit::PgCluster, std::path::PathBuf) {
    use std::os::unix::fs::MetadataExt;
    let cluster = kanban_testkit::PgCluster::start(&kanban_testkit::ClusterOptions::default());
    let certs = cluster.folder().join("tls");
    std::fs::create_dir(&certs).unwrap();
    kanban_testkit::loopback_certificates(&certs);
    // The server reads its key only when it owns it and nobody else may.
    let owner = std::fs::metadata(cluster.folder()).unwrap();
    for file in ["server.key", "server.crt"] {
        let path = certs.join(file);
        std::os::unix::fs::chown(&path, Some(owner.uid()), Some(owner.gid())).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }
    std::os::unix::fs::chown(&certs, Some(owner.uid()), Some(owner.gid())).unwrap();
    let hba = cluster.folder().join("data").join("pg_hba.conf");
    let rules = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("hostnossl all all all reject\n{rules}")).unwrap();
    // One statement at a time: ALTER SYSTEM runs outside any transaction.
    for file in ["cert", "key"] {
        cluster.admin(&format!(
            "ALTER SYSTEM SET ssl_{file}_file = '{}'",
            certs
                .join(format!(
                    "server.{}",
                    if file == "cert" { "crt" } else { "key" }
                ))
                .display()
        ));
    }
    cluster.admin("ALTER SYSTEM SET ssl = on");
    cluster.admin("SELECT pg_reload_conf()");
    // The reload is asynchronous: wait until a connection in the clear is refused.
    let plain = cluster.url("postgres");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !refuses_plain_text(&plain) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never required TLS"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let ca = certs.join("ca.pem");
    (cluster, ca)
}

#[test]
fn with_sslmode_require_every_process_speaks_verified_tls_to_the_server() {
    let (cluster, ca) = tls_cluster();
    let plain = cluster.fresh_database();
    let url = format!("{plain}?sslmode=require&sslrootcert={}", ca.display());
    // The server refuses any TCP connection without TLS: the dispatcher,
    // its workers and their agents' calls all get through, so all speak it.
    let bench = Bench::postgres_at(&url);
    let ids: Vec<String> = (0..3)
        .map(|n| bench.add(&format!("over TLS {n}"), &[]))
        .collect();
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).completing()])
        .write(bench.path(), "agent.sh");
    let output = bench
        .dispatch_command(&agent.path, &["--until-idle"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    for id in &ids {
        assert_eq!(bench.show(id)["task"]["status"], "done");
    }
    // The claim carries the TLS settings to every process it reaches.
    let carrier = bench.claim(&bench.add("carried", &[]), None);
    let db = &carrier
        .iter()
        .find(|(k, _)| k == kanban_core::vars::DB)
        .unwrap()
        .1;
    assert!(
        db.ends_with(&format!(
            "?sslmode=require&sslrootcert={}",
            ca.display().to_string().replace('/', "%2F")
        )),
        "{db}"
    );
    // Without TLS the server refuses; without the CA the server is not trusted.
    let listing = |db: &str| bench.command().args(["--db", db, "ls"]).output().unwrap();
    assert!(refuses_plain_text(&plain));
    let untrusted = listing(&format!("{plain}?sslmode=require"));
    let said = text(&untrusted.stderr);
    assert_ne!(untrusted.status.code(), Some(0), "{said}");
    assert!(
        said.contains("TLS connection to the server failed") && said.contains("sslrootcert"),
        "{said}"
    );
    let missing = listing(&format!(
        "{plain}?sslmode=require&sslrootcert=/nonexistent/ca.pem"
    ));
    assert!(
        text(&missing.stderr).contains("sslrootcert /nonexistent/ca.pem cannot be read"),
        "{}",
        text(&missing.stderr)
    );
}

#[test]
fn with_sslmode_require_the_board_s_watch_listens_over_tls_too() {
    // The watch holds a connection of its own: on a server that refuses
    // every connection without TLS, a page hears of a new card only when
    // that connection speaks TLS as well.
    let (cluster, ca) = tls_cluster();
    let url = format!(
        "{}?sslmode=require&sslrootcert={}",
        cluster.fresh_database(),
        ca.display()
    );
    let bench = Bench::postgres_at(&url);
    bench.add("on the board before the page", &[]);
    let server = crate::serve::Server::start(&bench, &[]);
    a_new_card_reaches_the_open_page(&bench, &server.url);
}

/// NUL, which PostgreSQL's text cannot hold, from every way in: a card
/// sent to the API with `\u0000` in its title is stored with U+FFFD in its
/// place (it was a 500), and an agent whose raw output and answer hold NUL
/// is booked as any other, and the board goes on.
#[test]
fn nul_in_a_card_or_an_agent_s_output_is_stored_and_the_board_goes_on() {
    let bench = Bench::postgres();
    bench.ok(&["init"]);
    let server = crate::serve::Server::start(&bench, &[]);
    let (status, added) = crate::serve::post_json(
        &format!("{}/api/cards", server.url),
        &serde_json::json!({"title": "nul\0title", "body": "nul\0body"}),
    );
    assert_eq!(status, 201, "{added}");
    let id = added["id"].as_str().expect("the new card's id").to_owned();
    let card = bench.show(&id);
    assert_eq!(card["task"]["title"], "nul\u{FFFD}title", "{card}");
    assert_eq!(card["task"]["body"], "nul\u{FFFD}body", "{card}");
    let agent = AgentScript::new(vec![
        AgentTurn::result(SUCCESS)
            .after(r"printf 'poison\000here\n'; printf 'poison\000there\n' >&2")
            .completing(),
    ])
    .write(bench.path(), "nul.sh");
    let healthy = bench.add("after it", &[]);
    bench.dispatch_until_idle(&agent.path, &[]);
    assert_eq!(bench.show(&id)["task"]["status"], "done");
    assert_eq!(bench.show(&healthy)["task"]["status"], "done");
}
