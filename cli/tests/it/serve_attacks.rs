//! `kanban serve` against what a browser attack or a greedy client sends:
//! blank tokens, a foreign `Host` (DNS rebinding) or `Origin`, forms
//! without their CSRF token, silent sockets by the hundred, and listings
//! asked for whole.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::serve::{Server, agent, conforms, get};
use crate::{Bench, text};

fn openapi() -> Value {
    serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap()
}

/// One raw HTTP/1.1 request: the status and the whole answer.
fn raw(url: &str, request: &str) -> (u16, String) {
    let address = url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

fn body_of(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    serde_json::from_str(body).unwrap_or(Value::Null)
}

#[test]
fn a_blank_token_is_refused_and_a_token_file_keeps_it_out_of_ps() {
    let bench = Bench::new();
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        bench
            .command()
            .envs(env.iter().copied())
            .arg("--db")
            .arg(&bench.db)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap()
    };
    for (args, env, says) in [
        (&["--token", ""][..], &[][..], "the token is empty"),
        (&["--token", "   "], &[], "the token is empty"),
        (
            &[],
            &[("KANBAN_SERVE_TOKEN", "")],
            "KANBAN_SERVE_TOKEN is set but empty",
        ),
        (&[], &[("KANBAN_SERVE_TOKEN", " ")], "the token is empty"),
        (&["--token", "a b"], &[], "holds a space"),
    ] {
        let refused = serve(args, env);
        assert_eq!(refused.status.code(), Some(1), "{args:?} {env:?}");
        assert!(
            text(&refused.stderr).contains(says),
            "{args:?} {env:?}: {}",
            text(&refused.stderr)
        );
    }
    let file = bench.path().join("token");
    std::fs::write(&file, "f1le-t0ken\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = serve(&["--token-file", file.to_str().unwrap()], &[]);
    assert_eq!(open.status.code(), Some(1));
    assert!(
        text(&open.stderr).contains("chmod 600"),
        "{}",
        text(&open.stderr)
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let server = Server::start(&bench, &["--token-file", file.to_str().unwrap()]);
    let (status, _) = get(&format!("{}/api/cards", server.url));
    assert_eq!(status, 401);
    let ok = agent()
        .get(&format!("{}/api/cards", server.url))
        .header("Authorization", "Bearer f1le-t0ken")
        .call()
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    let command_line = std::fs::read(format!("/proc/{}/cmdline", server.pid())).unwrap();
    assert!(
        !String::from_utf8_lossy(&command_line).contains("f1le-t0ken"),
        "the token shows in ps"
    );
}

#[test]
fn without_a_token_only_loopback_names_are_served_and_writes_only_from_the_board_itself() {
    let bench = Bench::new();
    let server = Server::start(&bench, &[]);
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "localhost".to_owned(),
        format!("[::1]:{port}"),
        format!("board.localhost:{port}"),
    ] {
        let (status, answer) = raw(
            &server.url,
            &format!("GET /api/walls HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status, 200, "{host}: {answer}");
    }
    // A page of another site whose name was made to point here.
    for host in [
        format!("attacker.example:{port}"),
        "attacker.example".to_owned(),
        format!("127.0.0.1.attacker.example:{port}"),
        format!("localhost.attacker.example:{port}"),
        "127.0.0.1:notaport".to_owned(),
    ] {
        let (status, answer) = raw(
            &server.url,
            &format!("GET /api/cards HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status, 403, "{host}: {answer}");
        assert!(
            body_of(&answer)["error"]
                .as_str()
                .unwrap()
                .contains("--token"),
            "{answer}"
        );
    }
    // A write from another origin, even with the right host, is refused.
    let host = format!("127.0.0.1:{port}");
    let card = json!({"title": "forged"}).to_string();
    let post = |origin: &str| {
        raw(
            &server.url,
            &format!(
                "POST /api/cards HTTP/1.1\r\nHost: {host}\r\nOrigin: {origin}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{card}",
                card.len()
            ),
        )
    };
    for origin in ["http://attacker.example", "null", "https://127.0.0.1:1"] {
        let (status, answer) = post(origin);
        assert_eq!(status, 403, "{origin}: {answer}");
        conforms(&openapi(), "/api/cards", "post", 403, &body_of(&answer));
    }
    assert_eq!(bench.ok(&["ls", "--json"]).trim(), "[]");
    let (status, answer) = post(&format!("http://{host}"));
    assert_eq!(status, 201, "{answer}");
}

#[test]
fn every_answer_forbids_framing_sniffing_and_foreign_scripts() {
    let bench = Bench::new();
    let id = bench.add("a card", &[]);
    let server = Server::start(&bench, &[]);
    for path in [
        "/".to_owned(),
        format!("/cards/{id}"),
        "/api/cards".to_owned(),
        "/assets/board.js".to_owned(),
        "/no/such/page".to_owned(),
    ] {
        let response = agent()
            .get(&format!("{}{path}", server.url))
            .call()
            .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|value| value.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        let policy = header("content-security-policy");
        assert!(
            policy.contains("frame-ancestors 'none'")
                && policy.contains("script-src 'self'")
                && !policy.contains("unsafe-inline"),
            "{path}: {policy:?}"
        );
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
    // The pages carry no inline script or style the policy would block.
    let (_, page) = get(&format!("{}/cards/{id}", server.url));
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "{page}"
    );
}

#[test]
fn errors_are_the_documented_json_and_media_types_are_read_as_media_types() {
    let bench = Bench::new();
    let id = bench.add("a card", &[]);
    let server = Server::start(&bench, &[]);
    let base = &server.url;
    // A form without its CSRF token: 403, as with a wrong one.
    for form in ["title=forged", "csrf=&title=forged", ""] {
        let mut response = agent()
            .post(&format!("{base}/actions/add"))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .send(form)
            .unwrap();
        assert_eq!(response.status().as_u16(), 403, "{form:?}");
        let body: Value =
            serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
        assert!(body["error"].as_str().unwrap().contains("CSRF"), "{body}");
    }
    let mut comment = agent()
        .post(&format!("{base}/actions/{id}/comment"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send("text=hello")
        .unwrap();
    assert_eq!(comment.status().as_u16(), 403);
    assert!(
        comment
            .body_mut()
            .read_to_string()
            .unwrap()
            .contains("\"error\"")
    );
    // Media types compare as media types.
    let send = |content_type: &str| {
        let mut response = agent()
            .post(&format!("{base}/api/cards"))
            .header("Content-Type", content_type)
            .send(json!({"title": "typed"}).to_string())
            .unwrap();
        let status = response.status().as_u16();
        let body: Value =
            serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
        (status, body)
    };
    for accepted in [
        "APPLICATION/JSON",
        "application/json; charset=utf-8",
        "Application/Json ;charset=UTF-8",
    ] {
        assert_eq!(send(accepted).0, 201, "{accepted}");
    }
    for refused in [
        "application/jsonx",
        "application/json-patch",
        "text/json",
        "application",
    ] {
        let (status, body) = send(refused);
        assert_eq!(status, 415, "{refused}");
        conforms(&openapi(), "/api/cards", "post", 415, &body);
    }
    // Unknown pages and methods answer JSON too.
    let (status, body) = get(&format!("{base}/no/such/page"));
    assert_eq!(status, 404);
    assert!(
        serde_json::from_str::<Value>(&body).unwrap()["error"].is_string(),
        "{body}"
    );
    let mut wrong = agent().delete(&format!("{base}/api/cards")).call().unwrap();
    assert_eq!(wrong.status().as_u16(), 405);
    let body: Value = serde_json::from_str(&wrong.body_mut().read_to_string().unwrap()).unwrap();
    assert!(body["error"].is_string(), "{body}");
    // A bad query is a 400 of the documented shape.
    for query in [
        "limit=0",
        "limit=1001",
        "limit=many",
        "cursor=x",
        "cursor=-3",
        "colour=red",
    ] {
        let (status, body) = get(&format!("{base}/api/cards?{query}"));
        assert_eq!(status, 400, "{query}: {body}");
        conforms(
            &openapi(),
            "/api/cards",
            "get",
            400,
            &serde_json::from_str(&body).unwrap(),
        );
    }
}

#[test]
fn the_bearer_scheme_is_read_whatever_its_case() {
    let bench = Bench::new();
    let server = Server::start(&bench, &["--token", "s3cret"]);
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let response = agent()
            .get(&format!("{}/api/cards", server.url))
            .header("Authorization", &format!("{scheme} s3cret"))
            .call()
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{scheme}");
    }
}

#[test]
fn cards_are_listed_a_page_at_a_time_with_a_cursor() {
    let bench = Bench::new();
    let ids: Vec<String> = (0..7)
        .map(|n| bench.add(&format!("card {n}"), &[]))
        .collect();
    bench.ok(&["hold", &ids[3], "--reason", "later"]);
    let server = Server::start(&bench, &[]);
    let mut seen = Vec::new();
    let mut url = format!("{}/api/cards?limit=3", server.url);
    let mut pages = 0;
    loop {
        let (status, body) = get(&url);
        assert_eq!(status, 200, "{body}");
        let page: Value = serde_json::from_str(&body).unwrap();
        conforms(&openapi(), "/api/cards", "get", 200, &page);
        let cards = page["cards"].as_array().unwrap();
        assert!(cards.len() <= 3, "{page}");
        seen.extend(
            cards
                .iter()
                .map(|card| card["id"].as_str().unwrap().to_owned()),
        );
        pages += 1;
        match page["next_cursor"].as_str() {
            Some(cursor) => url = format!("{}/api/cards?limit=3&cursor={cursor}", server.url),
            None => break,
        }
    }
    assert_eq!(seen, ids, "every card once, in the order they were added");
    assert_eq!(pages, 3);
    // A page holds 100 cards unless asked otherwise.
    let (_, body) = get(&format!("{}/api/cards", server.url));
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["cards"].as_array().unwrap().len(), 7);
    assert!(page["next_cursor"].is_null());
    // The status filter pages too.
    let (_, body) = get(&format!("{}/api/cards?status=ready&limit=1", server.url));
    let page: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(page["cards"][0]["id"], ids[0].as_str());
    assert!(page["next_cursor"].is_string());
}

#[test]
fn silent_sockets_beyond_the_servers_descriptors_do_not_keep_a_client_out() {
    let bench = Bench::new();
    // A server with few descriptors: 96, so its cap is 32 connections.
    let mut command = bench.command();
    command
        .arg("--db")
        .arg(&bench.db)
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let mut limited = std::process::Command::new("prlimit");
    limited
        .args(["--nofile=96:96", "--"])
        .arg(command.get_program())
        .args(command.get_args())
        .envs(
            command
                .get_envs()
                .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v.to_owned()))),
        );
    for (name, value) in command.get_envs() {
        if value.is_none() {
            limited.env_remove(name);
        }
    }
    let (mut child, url) = kanban_testkit::start_server(limited);
    let address = url.trim_start_matches("http://").to_owned();
    // More silent sockets than the server has descriptors.
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&address).unwrap())
        .collect();
    let began = Instant::now();
    let (status, answer) = raw(
        &url,
        "GET /api/walls HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    );
    let waited = began.elapsed();
    assert_eq!(status, 200, "{answer}");
    // Before its head timeout (10 s) closes any of the silent ones.
    assert!(
        waited < Duration::from_secs(10),
        "a client behind 300 silent sockets waited {waited:?}"
    );
    drop(silent);
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn a_client_that_never_finishes_its_headers_is_closed_by_the_header_timeout() {
    let bench = Bench::new();
    let server = Server::start(&bench, &[]);
    let address = server.url.trim_start_matches("http://").to_owned();
    let mut slow = TcpStream::connect(&address).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let began = Instant::now();
    let mut answer = Vec::new();
    // The server answers (408) or just closes; either way the read ends.
    let ended = slow.read_to_end(&mut answer);
    let waited = began.elapsed();
    assert!(
        ended.is_ok(),
        "the socket was closed, not left open: {ended:?}"
    );
    assert!(
        (Duration::from_secs(9)..Duration::from_secs(20)).contains(&waited),
        "closed after {waited:?}, the header timeout being 10 s"
    );
}
