//! `kanban serve` over real HTTP on loopback: the JSON API checked against
//! its OpenAPI description, `/metrics` parsed as Prometheus text, the token
//! and CSRF guards, and a real browser (headless Chromium through
//! WebDriver) watching the board live.

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Bench, text};

/// A running `kanban serve`, stopped when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Server {
    pub(crate) fn start(bench: &Bench, extra: &[&str]) -> Self {
        let mut command = bench.command();
        command
            .arg("--db")
            .arg(&bench.db)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra);
        let (child, url) = kanban_testkit::start_server(command);
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        Self { child, url }
    }

    /// A server started otherwise, stopped as this one is.
    pub(crate) fn adopt(child: std::process::Child, url: String) -> Self {
        Self { child, url }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::new_with_config(
        ureq::config::Config::builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(10)))
            .build(),
    )
}

pub(crate) fn get(url: &str) -> (u16, String) {
    let mut response = agent().get(url).call().unwrap();
    let status = response.status().as_u16();
    (status, response.body_mut().read_to_string().unwrap())
}

pub(crate) fn post_json(url: &str, body: &Value) -> (u16, Value) {
    let mut response = agent()
        .post(url)
        .header("Content-Type", "application/json")
        .send(body.to_string())
        .unwrap();
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Checks `value` against the response schema the OpenAPI description gives
/// for `path`, `method` and `status`.
pub(crate) fn conforms(openapi: &Value, path: &str, method: &str, status: u16, value: &Value) {
    let schema = &openapi["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]
        ["schema"];
    assert!(
        !schema.is_null(),
        "the OpenAPI description has no {status} for {method} {path}"
    );
    let mut root = schema.clone();
    root["components"] = openapi["components"].clone();
    let validator = jsonschema::validator_for(&root).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|error| format!("{error} at {}", error.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{method} {path} {status} does not match the description:\n{}\n{value}",
        errors.join("\n")
    );
}

#[test]
fn the_json_api_matches_its_openapi_description() {
    let openapi: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    let bench = Bench::new();
    let done = bench.add("done card", &["--body", "the body"]);
    let carrier = bench.claim(&done, None);
    bench.ok(&["comment", &done, "a human's note"]);
    let mut complete = bench.command();
    complete
        .envs(carrier.iter().cloned())
        .args(["complete", "--summary", "finished"]);
    assert!(complete.output().unwrap().status.success());
    let file = bench.path().join("report.txt");
    std::fs::write(&file, "the report").unwrap();
    bench.ok(&["attach", &done, file.to_str().unwrap()]);
    let ready = bench.add("ready card", &["--assignee", "coder", "--tenant", "acme"]);
    let waiting = bench.add("waiting card", &["--parent", &ready]);
    let server = Server::start(&bench, &[]);
    let base = &server.url;
    // The description the server serves is the one in docs/.
    let (status, served) = get(&format!("{base}/openapi.json"));
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&served).unwrap(), openapi);

    for (path, url) in [
        ("/api/cards", format!("{base}/api/cards")),
        ("/api/cards", format!("{base}/api/cards?status=done")),
        ("/api/cards/{id}", format!("{base}/api/cards/{done}")),
        ("/api/cards/{id}", format!("{base}/api/cards/{waiting}")),
        (
            "/api/cards/{id}/runs",
            format!("{base}/api/cards/{done}/runs"),
        ),
        (
            "/api/cards/{id}/events",
            format!("{base}/api/cards/{done}/events"),
        ),
        (
            "/api/cards/{id}/comments",
            format!("{base}/api/cards/{done}/comments"),
        ),
        ("/api/walls", format!("{base}/api/walls")),
    ] {
        let (status, body) = get(&url);
        assert_eq!(status, 200, "{url}: {body}");
        conforms(
            &openapi,
            path,
            "get",
            200,
            &serde_json::from_str(&body).unwrap(),
        );
    }
    let (_, card) = get(&format!("{base}/api/cards/{done}"));
    let card: Value = serde_json::from_str(&card).unwrap();
    assert_eq!(card["task"]["status"], "done");
    assert_eq!(card["comments"][0]["body"], "a human's note");
    // A card names the cards it waits for and those that wait for it, with
    // their statuses, in the API and on its page.
    let (_, card) = get(&format!("{base}/api/cards/{waiting}"));
    let card: Value = serde_json::from_str(&card).unwrap();
    assert_eq!(card["parents"], serde_json::json!([ready]));
    assert_eq!(card["linked_statuses"][&ready], "ready");
    let (_, card) = get(&format!("{base}/api/cards/{ready}"));
    let card: Value = serde_json::from_str(&card).unwrap();
    assert_eq!(card["children"], serde_json::json!([waiting]));
    assert_eq!(card["linked_statuses"][&waiting], "todo");
    let (_, page) = get(&format!("{base}/cards/{waiting}"));
    assert!(
        page.contains("Waits for")
            && page.contains(&format!("<a href=\"/cards/{ready}\">{ready}</a>")),
        "{page}"
    );
    let (_, listed) = get(&format!("{base}/api/cards?status=ready"));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["cards"][0]["id"], ready.as_str());

    // Errors are described too.
    let (status, body) = get(&format!("{base}/api/cards/t_00000000"));
    assert_eq!(status, 404);
    conforms(
        &openapi,
        "/api/cards/{id}",
        "get",
        404,
        &serde_json::from_str(&body).unwrap(),
    );
    let (status, body) = get(&format!("{base}/api/cards?status=lost"));
    assert_eq!(status, 400);
    conforms(
        &openapi,
        "/api/cards",
        "get",
        400,
        &serde_json::from_str(&body).unwrap(),
    );

    // Writes: the same operations as the CLI.
    let (status, added) = post_json(
        &format!("{base}/api/cards"),
        &json!({"title": "from the API", "priority": 4}),
    );
    assert_eq!(status, 201, "{added}");
    conforms(&openapi, "/api/cards", "post", 201, &added);
    let new = added["id"].as_str().unwrap().to_owned();
    assert_eq!(bench.show(&new)["task"]["priority"], 4);
    let (status, body) = post_json(&format!("{base}/api/cards"), &json!({"title": "  "}));
    assert_eq!(status, 400);
    conforms(&openapi, "/api/cards", "post", 400, &body);
    let action = "/api/cards/{id}/{action}";
    for (act, request) in [
        ("comment", json!({"text": "steer it"})),
        ("hold", json!({"reason": "not yet"})),
        ("release", json!({})),
        ("cancel", json!({"reason": "not needed"})),
    ] {
        let (status, body) = post_json(&format!("{base}/api/cards/{new}/{act}"), &request);
        assert_eq!(status, 200, "{act}: {body}");
        conforms(&openapi, action, "post", 200, &body);
    }
    let card = bench.show(&new);
    assert_eq!(card["task"]["status"], "archived");
    assert_eq!(card["comments"][0]["body"], "steer it");
    let (status, body) = post_json(&format!("{base}/api/cards/{done}/unblock"), &json!({}));
    assert_eq!(status, 409, "{body}");
    conforms(&openapi, action, "post", 409, &body);
    let (status, body) = post_json(&format!("{base}/api/cards/{done}/launch"), &json!({}));
    assert_eq!(status, 404, "{body}");
    // A write that is not JSON is refused (a cross-site form cannot send JSON).
    let mut response = agent()
        .post(&format!("{base}/api/cards"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send("title=sneaky")
        .unwrap();
    assert_eq!(response.status().as_u16(), 415);
    let body: Value = serde_json::from_str(&response.body_mut().read_to_string().unwrap()).unwrap();
    conforms(&openapi, "/api/cards", "post", 415, &body);
}

#[test]
fn metrics_are_prometheus_text_with_the_boards_counts() {
    let bench = Bench::new();
    for n in 0..3 {
        bench.add(&format!("ready {n}"), &[]);
    }
    let blocked = bench.add("blocked", &["--blocked"]);
    let server = Server::start(&bench, &[]);
    let (status, body) = get(&format!("{}/metrics", server.url));
    assert_eq!(status, 200);
    let lines = body.lines().map(|line| Ok(line.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let value = |name: &str, label: Option<(&str, &str)>| -> f64 {
        scrape
            .samples
            .iter()
            .find(|sample| {
                sample.metric == name
                    && label.is_none_or(|(key, want)| sample.labels.get(key) == Some(want))
            })
            .map(|sample| match sample.value {
                prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .unwrap_or_else(|| panic!("{name} {label:?} missing:\n{body}"))
    };
    assert_eq!(value("kanban_cards", Some(("status", "ready"))), 3.0);
    assert_eq!(value("kanban_cards", Some(("status", "blocked"))), 1.0);
    assert_eq!(value("kanban_workers_running", None), 0.0);
    assert_eq!(value("kanban_walls", None), 0.0);
    assert_eq!(value("kanban_stale_writes_rejected", None), 0.0);
    // A stale worker's refused write is counted.
    let carrier = bench.claim(&blocked_or_ready(&bench, &blocked), None);
    let id = carrier
        .iter()
        .find(|(k, _)| k == "HERMES_KANBAN_TASK")
        .unwrap()
        .1
        .clone();
    bench.ok(&["reclaim", &id]);
    let mut stale = bench.command();
    stale
        .envs(carrier.iter().cloned())
        .args(["complete", "--summary", "too late"]);
    assert_eq!(stale.output().unwrap().status.code(), Some(1));
    let (_, body) = get(&format!("{}/metrics", server.url));
    let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let rejected = scrape
        .samples
        .iter()
        .find(|s| s.metric == "kanban_stale_writes_rejected")
        .unwrap();
    assert!(
        matches!(rejected.value, prometheus_parse::Value::Gauge(v) if v == 1.0),
        "{body}"
    );
}

/// A ready card to claim (the blocked one stays blocked).
fn blocked_or_ready(bench: &Bench, blocked: &str) -> String {
    let listed: Value =
        serde_json::from_str(&bench.ok(&["ls", "--status", "ready", "--json"])).unwrap();
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    assert_ne!(id, blocked);
    id
}

#[test]
fn off_loopback_needs_a_token_and_a_token_guards_every_request_and_forms_need_csrf() {
    let bench = Bench::new();
    let refused = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("give --token TOKEN"),
        "{}",
        text(&refused.stderr)
    );

    let server = Server::start(&bench, &["--token", "s3cret"]);
    let (status, body) = get(&format!("{}/api/cards", server.url));
    assert_eq!(status, 401);
    assert!(body.contains("Authorization: Bearer TOKEN"), "{body}");
    let mut ok = agent()
        .get(&format!("{}/api/cards", server.url))
        .header("Authorization", "Bearer s3cret")
        .call()
        .unwrap();
    assert_eq!(ok.status().as_u16(), 200);
    assert_eq!(
        ok.body_mut().read_to_string().unwrap(),
        r#"{"cards":[],"next_cursor":null}"#
    );
    let wrong = agent()
        .get(&format!("{}/api/cards", server.url))
        .header("Authorization", "Bearer s3cre7")
        .call()
        .unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    // The login sets a cookie the browser sends back.
    let no_redirects = ureq::Agent::new_with_config(
        ureq::config::Config::builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .build(),
    );
    let login = no_redirects
        .get(&format!("{}/login?token=s3cret", server.url))
        .call()
        .unwrap();
    let cookie = login
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        cookie.starts_with("kanban_token=s3cret;") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let with_cookie = agent()
        .get(&format!("{}/", server.url))
        .header("Cookie", "kanban_token=s3cret")
        .call()
        .unwrap();
    assert_eq!(with_cookie.status().as_u16(), 200);

    // A form without this server's CSRF token changes nothing.
    let forged = agent()
        .post(&format!("{}/actions/add", server.url))
        .header("Authorization", "Bearer s3cret")
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send("csrf=guess&title=forged")
        .unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    assert_eq!(bench.ok(&["ls", "--json"]).trim(), "[]");
}

#[test]
fn a_real_browser_sees_the_board_live_and_its_clicks_change_it() {
    use fantoccini::{ClientBuilder, Locator};

    let bench = Bench::new();
    // A board with something in every lane, for the eye and the screenshot.
    let first = bench.add(
        "write the release notes",
        &["--assignee", "writer", "--priority", "2"],
    );
    bench.add("summarise the design review", &["--assignee", "reviewer"]);
    bench.add("translate the README", &["--blocked"]);
    let running = bench.add("fix the flaky parser test", &["--assignee", "coder"]);
    let carrier = bench.claim(&running, Some(900));
    let finished = bench.add("tidy the changelog", &[]);
    let done_carrier = bench.claim(&finished, None);
    let mut complete = bench.command();
    complete
        .envs(done_carrier.iter().cloned())
        .args(["complete", "--summary", "tidied"]);
    assert!(complete.output().unwrap().status.success());
    let server = Server::start(&bench, &[]);
    let driver = crate::web::ChromeDriver::start();

    let screenshots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--window-size=1400,900",
                    format!("--user-data-dir={}", driver.profile().display()),
                ]
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&driver.url)
            .await
            .expect("a WebDriver session with headless Chromium");
        let wait = Duration::from_secs(10);
        // The board renders, every lane, each card where it belongs.
        client.goto(&server.url).await.unwrap();
        for (lane, id) in [("ready", &first), ("running", &running), ("done", &finished)] {
            client
                .wait()
                .at_most(wait)
                .for_element(Locator::Css(&format!("[data-lane={lane}] [data-card='{id}']")))
                .await
                .unwrap_or_else(|_| panic!("{id} in the {lane} lane"));
        }
        client
            .wait()
            .at_most(wait)
            .for_element(Locator::XPath("//span[@id='live'][contains(., 'live')]"))
            .await
            .expect("the page is live");
        // A card added through the CLI appears without a reload.
        let added = bench.add("added through the CLI", &["--priority", "9"]);
        client
            .wait()
            .at_most(wait)
            .for_element(Locator::Css(&format!("[data-lane=ready] [data-card='{added}']")))
            .await
            .expect("the new card shows up live");
        let png = client.screenshot().await.unwrap();
        std::fs::write(screenshots.join("board.png"), png).unwrap();
        // An action clicked in the page changes the board.
        client.goto(&format!("{}/cards/{first}", server.url)).await.unwrap();
        client
            .find(Locator::Css("[data-action=hold]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let started = Instant::now();
        while bench.show(&first)["task"]["held_reason"].is_null() {
            assert!(started.elapsed() < wait, "the click held the card");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        client
            .wait()
            .at_most(wait)
            .for_element(Locator::Css("[data-action=release]"))
            .await
            .expect("the page shows the card held");
        // A stale worker's refused write shows up as an event, live.
        client.goto(&format!("{}/cards/{running}", server.url)).await.unwrap();
        client
            .wait()
            .at_most(wait)
            .for_element(Locator::Css("[data-action=reclaim]"))
            .await
            .unwrap();
        bench.ok(&["reclaim", &running, "--reason", "taken back"]);
        let mut stale = bench.command();
        stale.envs(carrier.iter().cloned()).args(["complete", "--summary", "too late"]);
        assert_eq!(stale.output().unwrap().status.code(), Some(1));
        client
            .wait()
            .at_most(wait)
            .for_element(Locator::Css("tr[data-event=stale_write_rejected]"))
            .await
            .expect("the refused write shows up without a reload");
        let png = client.screenshot().await.unwrap();
        std::fs::write(screenshots.join("card.png"), png).unwrap();
        client.close().await.unwrap();
    });
}

#[test]
fn the_dispatchers_tick_durations_are_a_histogram_in_the_metrics() {
    let bench = Bench::new();
    let agent = kanban_testkit::AgentScript::new(vec![
        kanban_testkit::AgentTurn::result(r#"{"completed": true}"#).completing(),
    ])
    .write(bench.path(), "agent.sh");
    bench.add("one", &[]);
    let output = bench
        .command()
        .arg("--db")
        .arg(&bench.db)
        .args(["dispatch", "--until-idle", "--interval", "0.2", "--agent"])
        .arg(&agent.path)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let server = Server::start(&bench, &[]);
    let (_, body) = get(&format!("{}/metrics", server.url));
    assert!(body.ends_with("# EOF\n"), "{body}");
    let scrape =
        prometheus_parse::Scrape::parse(body.lines().map(|line| Ok(line.to_owned()))).unwrap();
    let histogram = scrape
        .samples
        .iter()
        .find(|sample| sample.metric == "kanban_tick_duration_seconds")
        .unwrap_or_else(|| panic!("no tick histogram:\n{body}"));
    let prometheus_parse::Value::Histogram(buckets) = &histogram.value else {
        panic!("not a histogram: {:?}", histogram.value);
    };
    let total = buckets.last().unwrap();
    assert!(total.less_than.is_infinite());
    assert!(
        total.count >= 2.0,
        "the dispatcher ticked at least twice: {body}"
    );
    // Buckets are cumulative.
    assert!(
        buckets
            .windows(2)
            .all(|pair| pair[0].count <= pair[1].count),
        "{body}"
    );
    let count = body
        .lines()
        .find_map(|line| line.strip_prefix("kanban_tick_duration_seconds_count "))
        .unwrap();
    assert_eq!(count.parse::<f64>().unwrap(), total.count);
}

#[test]
fn a_card_page_lists_its_files_and_serves_only_its_own_in_a_form_that_cannot_run() {
    let bench = Bench::new();
    let card = bench.add("with files", &["--tenant", "acme"]);
    let note = bench.path().join("note.txt");
    std::fs::write(&note, "plain words").unwrap();
    let page = bench.path().join("page.html");
    std::fs::write(&page, "<script>alert(1)</script>").unwrap();
    bench.ok(&["attach", &card, note.to_str().unwrap()]);
    bench.ok(&["attach", &card, page.to_str().unwrap()]);
    // A row that names a file outside the board's attachments folder, and
    // one that names another card's file.
    let other = bench.add("another card", &[]);
    bench.ok(&["attach", &other, note.to_str().unwrap()]);
    let others = bench
        .path()
        .join("attachments")
        .join(&other)
        .join("note.txt");
    let others = std::fs::canonicalize(others).unwrap();
    {
        let conn = rusqlite::Connection::open(&bench.db).unwrap();
        conn.execute(
            "INSERT INTO task_attachments (task_id, filename, stored_path, size, created_at) VALUES (?1, 'passwd', '/etc/passwd', 1, 1)",
            [&card],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO task_attachments (task_id, filename, stored_path, size, created_at) VALUES (?1, 'note.txt', ?2, 1, 1)",
            [&card, &others.display().to_string()],
        )
        .unwrap();
    }
    let server = Server::start(&bench, &[]);
    let (status, html) = get(&format!("{}/cards/{card}", server.url));
    assert_eq!(status, 200);
    assert!(
        html.contains("note.txt") && html.contains("page.html"),
        "{html}"
    );
    assert!(html.contains("tenant acme"), "{html}");
    let fetch = |n: u32| {
        let mut response = agent()
            .get(&format!("{}/cards/{card}/attachments/{n}", server.url))
            .call()
            .unwrap();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map(|value| value.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        let heads = (
            header("content-type"),
            header("content-disposition"),
            header("x-content-type-options"),
            header("content-security-policy"),
        );
        let status = response.status().as_u16();
        (status, heads, response.body_mut().read_to_string().unwrap())
    };
    let (status, (kind, disposition, nosniff, csp), body) = fetch(1);
    assert_eq!((status, body.as_str()), (200, "plain words"));
    assert_eq!(kind, "text/plain; charset=utf-8");
    assert!(
        disposition.starts_with("inline; filename*=UTF-8''note%2Etxt"),
        "{disposition}"
    );
    assert_eq!(nosniff, "nosniff");
    assert!(csp.contains("sandbox"), "{csp}");
    // HTML is only ever downloaded.
    let (status, (kind, disposition, _, _), _) = fetch(2);
    assert_eq!(status, 200);
    assert_eq!(kind, "application/octet-stream");
    assert!(disposition.starts_with("attachment;"), "{disposition}");
    let (status, _, body) = fetch(4);
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("root:"), "{body}");
    let (status, _, body) = fetch(5);
    assert_eq!(status, 404, "another card's file: {body}");
    let (status, _, _) = fetch(99);
    assert_eq!(status, 404);
    // attach-rm leaves a file outside the card's folder where it is.
    assert!(bench.ok(&["attach-rm", "4"]).contains("left where it is"));
    assert!(std::path::Path::new("/etc/passwd").exists());
    assert!(bench.ok(&["attach-rm", "5"]).contains("left where it is"));
    assert!(others.exists(), "another card's file stays");
}

/// Posts a form; its status (after the redirect a success gives).
fn post_form(url: &str, fields: &[(&str, &str)]) -> (u16, String) {
    let mut response = agent().post(url).send_form(fields.iter().copied()).unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.body_mut().read_to_string().unwrap_or_default(),
    )
}

#[test]
fn a_card_page_and_the_api_subscribe_webhooks_to_its_events() {
    let openapi: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    let bench = Bench::new();
    let card = bench.add("watch me", &[]);
    let other = bench.add("not this one", &[]);
    let server = Server::start(&bench, &[]);
    let base = &server.url;
    let (_, page) = get(&format!("{base}/cards/{card}"));
    assert!(page.contains("<h3>Notifications</h3>"), "{page}");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    // The card page's form: a webhook for this card's events.
    let hook = "https://hooks.example/services/T0/B0/token-abc";
    let (status, page) = post_form(
        &format!("{base}/actions/{card}/notify"),
        &[
            ("csrf", &csrf),
            ("text", hook),
            ("events", "done,needs_input"),
        ],
    );
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("needs_input, done → webhook https://hooks.example/…"),
        "{page}"
    );
    assert!(!page.contains("token-abc"), "the hook's token is not shown");
    let (status, _) = post_form(
        &format!("{base}/actions/{card}/notify"),
        &[("csrf", "stale"), ("text", hook)],
    );
    assert_eq!(status, 403, "a form without its token changes nothing");
    let (status, listed) = get(&format!("{base}/api/notifications"));
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    conforms(&openapi, "/api/notifications", "get", 200, &listed);
    assert_eq!(listed.as_array().unwrap().len(), 1);
    let on_card = listed[0]["id"].as_i64().unwrap().to_string();
    assert_eq!(listed[0]["target"], card.as_str());
    assert_eq!(listed[0]["address"], "https://hooks.example/…");
    assert!(
        !bench
            .ok(&["notify", "list", "--json"])
            .contains("token-abc")
    );
    // Another card's page cannot stop it.
    let (status, _) = post_form(
        &format!("{base}/actions/{other}/unnotify"),
        &[("csrf", &csrf), ("text", &on_card)],
    );
    assert_eq!(status, 404);
    // The API: webhooks only, exactly one scope.
    let (status, made) = post_json(
        &format!("{base}/api/notifications"),
        &json!({"all_cards": true, "events": "failed", "webhook": "https://h.example/k"}),
    );
    assert_eq!(status, 201, "{made}");
    conforms(&openapi, "/api/notifications", "post", 201, &made);
    for (body, says) in [
        (
            json!({"all_cards": true, "command": "rm -rf /", "webhook": "https://h"}),
            "unknown field `command`",
        ),
        (
            json!({"card": card, "all_cards": true, "webhook": "https://h"}),
            "exactly one",
        ),
        (
            json!({"all_cards": true, "webhook": "file:///etc/passwd"}),
            "not an http",
        ),
        (
            json!({"all_cards": true, "webhook": "https://h", "secret_env": "KANBAN_SECRET_MAIL"}),
            "unknown field `secret_env`",
        ),
        (
            json!({"all_cards": true, "webhook": "https://h", "events": "soon"}),
            "not a kind",
        ),
    ] {
        let (status, error) = post_json(&format!("{base}/api/notifications"), &body);
        assert_eq!(status, 400, "{body}: {error}");
        conforms(&openapi, "/api/notifications", "post", 400, &error);
        assert!(
            error["error"].as_str().unwrap().contains(says),
            "{body}: {error}"
        );
    }
    let (status, error) = post_json(
        &format!("{base}/api/notifications"),
        &json!({"card": "t_00000000", "webhook": "https://h"}),
    );
    assert_eq!(status, 404, "{error}");
    let (status, acted) = post_json(
        &format!("{base}/api/cards/{other}/notify"),
        &json!({"text": "https://h.example/other", "events": "blocked"}),
    );
    assert_eq!(status, 200, "{acted}");
    conforms(&openapi, "/api/cards/{id}/{action}", "post", 200, &acted);
    let (status, gone) = post_json(
        &format!("{base}/api/notifications/{on_card}/unsubscribe"),
        &json!({}),
    );
    assert_eq!(status, 200, "{gone}");
    conforms(
        &openapi,
        "/api/notifications/{id}/unsubscribe",
        "post",
        200,
        &gone,
    );
    let (status, gone) = post_json(
        &format!("{base}/api/notifications/{on_card}/unsubscribe"),
        &json!({}),
    );
    assert_eq!(status, 404);
    conforms(
        &openapi,
        "/api/notifications/{id}/unsubscribe",
        "post",
        404,
        &gone,
    );
    // What runs on a dispatcher's host is removed only on its command line.
    let command: Value = serde_json::from_str(&bench.ok(&[
        "notify",
        "subscribe",
        "--card",
        &other,
        "--command",
        "true",
        "--json",
    ]))
    .unwrap();
    let command = command["id"].as_i64().unwrap().to_string();
    let (status, refused) = post_json(
        &format!("{base}/api/notifications/{command}/unsubscribe"),
        &json!({}),
    );
    assert_eq!(status, 400, "{refused}");
    conforms(
        &openapi,
        "/api/notifications/{id}/unsubscribe",
        "post",
        400,
        &refused,
    );
    let (status, _) = post_form(
        &format!("{base}/actions/{other}/unnotify"),
        &[("csrf", &csrf), ("text", &command)],
    );
    assert_eq!(status, 404, "a card page stops webhooks only");
    bench.ok(&["notify", "unsubscribe", &command]);
    let listed: Value = serde_json::from_str(&bench.ok(&["notify", "list", "--json"])).unwrap();
    let targets: Vec<&Value> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|sub| &sub["target"])
        .collect();
    assert_eq!(targets, [&Value::Null, &json!(other)]);
}
