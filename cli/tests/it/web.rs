//! The web board in a real browser (headless Chromium through WebDriver):
//! each thing a person does there, checked on the board it changes, and
//! every page and dialog checked by axe-core in the light and dark themes.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use fantoccini::actions::{
    InputSource, KeyAction, KeyActions, MOUSE_BUTTON_LEFT, MouseActions, PointerAction,
};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::Bench;
use crate::serve::Server;

/// A chromedriver on a free port, with a browser profile of its own;
/// stopped when dropped, with every browser process it started.
pub(crate) struct ChromeDriver {
    child: Child,
    pub(crate) url: String,
    /// The browser's profile: every process of that browser names it.
    profile: tempfile::TempDir,
}

impl ChromeDriver {
    pub(crate) fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            // A group of its own, stopped whole.
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs the browser tests: apt-get install chromium chromium-driver (.ci/run does)");
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url,
            profile: tempfile::tempdir().unwrap(),
        }
    }

    /// The folder to give the browser as its `--user-data-dir`.
    pub(crate) fn profile(&self) -> &Path {
        self.profile.path()
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill, killpg};
        use nix::unistd::Pid;
        let group = Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
        // Chromium's helpers may leave the group; each names the profile. A
        // browser left running would slow every later test that reads
        // /proc, and hold its memory until the machine stops.
        let profile = self.profile.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&profile) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// How long a page may take to show what a test waits for.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Runs `test` in a fresh headless Chromium (its own profile), dark when
/// asked: the system's colour scheme as the page's media query sees it.
pub(crate) fn browse(dark: bool, test: impl AsyncFnOnce(&Client)) {
    let driver = ChromeDriver::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut args = vec![
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--no-first-run".to_owned(),
            "--window-size=1400,900".to_owned(),
            format!("--user-data-dir={}", driver.profile().display()),
        ];
        if dark {
            args.push("--blink-settings=preferredColorScheme=0".to_owned());
        }
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            json!({"binary": "/usr/bin/chromium", "args": args}),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(capabilities)
            .connect(&driver.url)
            .await
            .expect("a WebDriver session with headless Chromium");
        test(&client).await;
        client.close().await.unwrap();
    });
}

/// Waits for the element `css` names.
async fn find(client: &Client, css: &str) -> fantoccini::elements::Element {
    client
        .wait()
        .at_most(WAIT)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|_| panic!("no element {css} on the page"))
}

/// Clicks the element `css` names; again when a live refresh replaced it
/// between finding and clicking.
async fn click(client: &Client, css: &str) {
    let started = Instant::now();
    loop {
        match find(client, css).await.click().await {
            Ok(()) => return,
            Err(error) if error.is_stale_element_reference() && started.elapsed() < WAIT => {}
            Err(error) => panic!("click {css}: {error}"),
        }
    }
}

/// Types `keys` into the field `css` names; again, into the field anew,
/// when a live refresh replaced it meanwhile.
async fn type_into(client: &Client, css: &str, keys: &str) {
    let started = Instant::now();
    loop {
        let field = find(client, css).await;
        let typed = match field.clear().await {
            Ok(()) => field.send_keys(keys).await,
            Err(error) => Err(error),
        };
        match typed {
            Ok(()) => return,
            Err(error) if error.is_stale_element_reference() && started.elapsed() < WAIT => {}
            Err(error) => panic!("type into {css}: {error}"),
        }
    }
}

/// The text of the element `css` names, read in one step in the page (a
/// live refresh may replace the element at any time).
async fn text(client: &Client, css: &str) -> String {
    find(client, css).await;
    let read = client
        .execute(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
            vec![json!(css)],
        )
        .await
        .unwrap();
    read.as_str()
        .unwrap_or_else(|| panic!("no element {css} on the page"))
        .to_owned()
}

/// Polls the board until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < WAIT, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn status(bench: &Bench, id: &str) -> String {
    bench.show(id)["task"]["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn script(client: &Client, code: &str) -> Value {
    client.execute(code, Vec::new()).await.unwrap()
}

/// Types `keys` wherever the focus is, as a person at the keyboard does.
async fn press(client: &Client, keys: &str) {
    let mut actions = KeyActions::new("keyboard".to_owned());
    for key in keys.chars() {
        actions = actions
            .then(KeyAction::Down { value: key })
            .then(KeyAction::Up { value: key });
    }
    client.perform_actions(actions).await.unwrap();
}

/// Drags the element `from` onto the element `onto` with the mouse: down,
/// moves in steps, up.
async fn drag(client: &Client, from: &str, onto: &str) {
    let started = Instant::now();
    loop {
        match try_drag(client, from, onto).await {
            Ok(()) => return,
            Err(error) if error.is_stale_element_reference() && started.elapsed() < WAIT => {}
            Err(error) => panic!("drag {from} onto {onto}: {error}"),
        }
    }
}

async fn try_drag(
    client: &Client,
    from: &str,
    onto: &str,
) -> Result<(), fantoccini::error::CmdError> {
    let card = find(client, from).await;
    let lane = find(client, onto).await;
    let actions = MouseActions::new("mouse".to_owned())
        .then(PointerAction::MoveToElement {
            element: card,
            duration: None,
            x: 0.0,
            y: 0.0,
        })
        .then(PointerAction::Down {
            button: MOUSE_BUTTON_LEFT,
        })
        .then(PointerAction::MoveBy {
            duration: Some(Duration::from_millis(100)),
            x: 10.0,
            y: 10.0,
        })
        .then(PointerAction::MoveToElement {
            element: lane,
            duration: Some(Duration::from_millis(200)),
            x: 0.0,
            y: 0.0,
        })
        .then(PointerAction::Up {
            button: MOUSE_BUTTON_LEFT,
        });
    client.perform_actions(actions).await?;
    client.release_actions().await
}

#[test]
fn dragging_a_card_moves_it_and_a_refused_move_snaps_back_and_says_why() {
    let bench = Bench::new();
    let blocked = bench.add("translate the README", &["--blocked"]);
    let ready = bench.add("write the release notes", &[]);
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client.goto(&server.url).await.unwrap();
        find(client, "#live").await;
        // A blocked card dropped on ready is unblocked.
        drag(
            client,
            &format!("[data-card='{blocked}']"),
            "[data-lane=ready] h2",
        )
        .await;
        until("the drop unblocked the card", || {
            status(&bench, &blocked) == "ready"
        })
        .await;
        find(
            client,
            &format!("[data-lane=ready] [data-card='{blocked}']"),
        )
        .await;
        // Done is the agent's to say: the card goes back, and the page says why.
        drag(
            client,
            &format!("[data-card='{ready}']"),
            "[data-lane=done] h2",
        )
        .await;
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath(
                "//div[@id='toast'][contains(., 'agent completes')]",
            ))
            .await
            .expect("the refusal is said");
        find(client, &format!("[data-lane=ready] [data-card='{ready}']")).await;
        assert_eq!(status(&bench, &ready), "ready");
        // A click that is not a drag still opens the card.
        click(client, &format!("[data-card='{ready}'] a.title")).await;
        find(client, "[data-action=edit]").await;
    });
}

#[test]
fn keys_move_the_focused_card_and_question_mark_lists_them() {
    let bench = Bench::new();
    let first = bench.add("first card", &["--priority", "2"]);
    let second = bench.add("second card", &["--priority", "1"]);
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client.goto(&server.url).await.unwrap();
        find(client, &format!("[data-card='{second}']")).await;
        // j focuses the first card, j again the next; s holds it.
        press(client, "j").await;
        let focused = script(
            client,
            "return document.activeElement.closest('[data-card]').dataset.card",
        )
        .await;
        assert_eq!(focused, json!(first));
        press(client, "js").await;
        until("s held the focused card", || {
            status(&bench, &second) == "scheduled"
        })
        .await;
        assert_eq!(status(&bench, &first), "ready", "only the focused card");
        find(
            client,
            &format!("[data-lane=scheduled] [data-card='{second}']"),
        )
        .await;
        // r brings it back: the focus stays on it across the live refresh.
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(&format!(
                "[data-lane=scheduled] [data-card='{second}'] a.title:focus"
            )))
            .await
            .expect("the focus follows the card to its lane");
        press(client, "r").await;
        until("r moved it back to ready", || {
            status(&bench, &second) == "ready"
        })
        .await;
        // ? lists the keys.
        press(client, "?").await;
        let open = script(client, "return document.getElementById('keys').open").await;
        assert_eq!(open, json!(true));
        let listed = text(client, "#keys").await;
        assert!(listed.contains("hold (move to scheduled)"), "{listed}");
        press(client, &Key::Escape.to_string()).await;
        let open = script(client, "return document.getElementById('keys').open").await;
        assert_eq!(open, json!(false), "Escape closes the list");
    });
}

#[test]
fn a_card_is_edited_in_place_its_links_changed_and_a_child_added() {
    let bench = Bench::new();
    let card = bench.add("draft the plan", &[]);
    let other = bench.add("gather the numbers", &[]);
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client
            .goto(&format!("{}/cards/{card}", server.url))
            .await
            .unwrap();
        click(client, "details.edit summary").await;
        let title = find(client, "details.edit input[name=title]").await;
        title.clear().await.unwrap();
        title.send_keys("draft the release plan").await.unwrap();
        let priority = find(client, "details.edit input[name=priority]").await;
        priority.clear().await.unwrap();
        priority.send_keys("5").await.unwrap();
        find(client, "details.edit input[name=tenant]")
            .await
            .send_keys("acme")
            .await
            .unwrap();
        find(client, "details.edit textarea[name=body]")
            .await
            .send_keys("**first** the dates <img src=x onerror=alert(1)>")
            .await
            .unwrap();
        click(client, "[data-action=edit]").await;
        until("the edit is saved", || {
            bench.show(&card)["task"]["title"] == "draft the release plan"
        })
        .await;
        let task = bench.show(&card)["task"].clone();
        assert_eq!(
            (&task["priority"], &task["tenant"]),
            (&json!(5), &json!("acme"))
        );
        // The body is Markdown, rendered without the markup it holds.
        assert_eq!(text(client, ".body.markdown strong").await, "first");
        let images = script(
            client,
            "return document.querySelectorAll('.body.markdown img').length",
        )
        .await;
        assert_eq!(images, json!(0), "no image ran");
        // A link added, then removed.
        click(client, "details.more summary").await;
        find(client, "form[action$='/link'] input[name=text]")
            .await
            .send_keys(&other)
            .await
            .unwrap();
        click(client, "[data-action=link]").await;
        until("the link is made", || {
            bench.show(&card)["parents"] == json!([other])
        })
        .await;
        click(
            client,
            &format!("li[data-linked='{other}'] [data-action=unlink]"),
        )
        .await;
        until("the link is gone", || {
            bench.show(&card)["parents"] == json!([])
        })
        .await;
        // A child of this card, made from its page.
        click(client, "details.more summary").await;
        find(client, "details.more form.add input[name=title]")
            .await
            .send_keys("check the dates")
            .await
            .unwrap();
        click(client, "#add-child").await;
        until("the child is made", || {
            bench.show(&card)["children"]
                .as_array()
                .is_some_and(|c| c.len() == 1)
        })
        .await;
        let child = bench.show(&card)["children"][0]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(bench.show(&child)["task"]["title"], "check the dates");
        assert_eq!(status(&bench, &child), "todo", "it waits for its parent");
        // Where its agent works, moved before its run.
        let folder = bench.path().join("checkout");
        std::fs::create_dir_all(&folder).unwrap();
        click(client, "details.edit summary").await;
        let workspace = find(client, "details.edit input[name=workspace]").await;
        assert_eq!(
            workspace.prop("value").await.unwrap().as_deref(),
            Some("scratch")
        );
        workspace.clear().await.unwrap();
        workspace
            .send_keys(&format!("dir:{}", folder.display()))
            .await
            .unwrap();
        click(client, "[data-action=edit]").await;
        until("the workspace is moved", || {
            bench.show(&card)["task"]["workspace_kind"] == "dir"
        })
        .await;
        assert_eq!(
            bench.show(&card)["task"]["workspace_path"],
            std::fs::canonicalize(&folder)
                .unwrap()
                .display()
                .to_string()
        );
        // A comment typed and not sent outlives the page's live updates,
        // once the focus has left it too.
        let draft = "form[action$='/comment'] input[name=text]";
        type_into(client, draft, "half a thought").await;
        script(client, "document.activeElement.blur(); return null").await;
        bench.ok(&["edit", &card, "--priority", "9"]);
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath("//div[@class='meta']/span[.='priority 9']"))
            .await
            .expect("the page went live on the edit");
        tokio::time::sleep(Duration::from_millis(800)).await;
        let kept = script(
            client,
            &format!("return document.querySelector(\"{draft}\").value"),
        )
        .await;
        assert_eq!(kept, json!("half a thought"), "the draft was kept");
        // Sent (here: cleared), the part goes live again.
        script(
            client,
            &format!("document.querySelector(\"{draft}\").value = ''; return null"),
        )
        .await;
        bench.ok(&["comment", &card, "noted from the command line"]);
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath(
                "//p[contains(., 'noted from the command line')]",
            ))
            .await
            .expect("the comments went live again");
    });
}

#[test]
fn selected_cards_take_one_action_together() {
    let bench = Bench::new();
    let a = bench.add("first of three", &[]);
    let b = bench.add("second of three", &[]);
    let c = bench.add("third of three", &[]);
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client.goto(&server.url).await.unwrap();
        for id in [&a, &c] {
            click(client, &format!("[data-card='{id}'] input.pick")).await;
        }
        let selected = text(client, "#selected").await;
        assert_eq!(selected, "2 selected:");
        // The selection outlives a live update of the lanes.
        let added = bench.add("added meanwhile", &[]);
        find(client, &format!("[data-card='{added}']")).await;
        let checked = script(
            client,
            "return Array.from(document.querySelectorAll('input.pick:checked')).map(b => b.value)",
        )
        .await;
        assert_eq!(checked, json!([a, c]), "the selection outlived the update");
        click(client, "#bulk select[name=action] option[value=priority]").await;
        find(client, "#bulk input[name=text]")
            .await
            .send_keys("7")
            .await
            .unwrap();
        click(client, "[data-bulk]").await;
        until("both selected cards take the priority", || {
            bench.show(&a)["task"]["priority"] == 7 && bench.show(&c)["task"]["priority"] == 7
        })
        .await;
        assert_eq!(bench.show(&b)["task"]["priority"], 0, "only the selected");

        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath("//div[@id='toast'][contains(., '2 done')]"))
            .await
            .expect("the page says what was done");
    });
    // Without JavaScript the same form posts and comes back to the view.
    let (code, page) = crate::serve::get(&format!("{}/", server.url));
    assert_eq!(code, 200);
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let form = format!("csrf={csrf}&action=hold&reason=freeze&card={a}&card={b}&q=three");
    let response = crate::serve::agent()
        .post(&format!("{}/actions/bulk", server.url))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .header("Origin", server.url.as_str())
        .config()
        .max_redirects(0)
        .build()
        .send(form)
        .unwrap();
    assert_eq!(response.status().as_u16(), 303);
    assert_eq!(response.headers()["location"], "/?q=three");
    assert_eq!(
        (status(&bench, &a), status(&bench, &b), status(&bench, &c)),
        (
            "scheduled".to_owned(),
            "scheduled".to_owned(),
            "ready".to_owned()
        )
    );
}

#[test]
fn a_filter_lives_in_the_url_and_a_lane_pages() {
    let bench = Bench::new();
    let flaky = bench.add(
        "fix the flaky parser test",
        &["--assignee", "coder", "--tenant", "acme"],
    );
    let other = bench.add("write the release notes", &["--assignee", "writer"]);
    for n in 0..105 {
        bench.add(&format!("bulk card {n}"), &["--tenant", "bulk"]);
    }
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client.goto(&server.url).await.unwrap();
        let search = find(client, "#search").await;
        search.send_keys("FLAKY").await.unwrap();
        search.send_keys(&Key::Enter.to_string()).await.unwrap();
        find(client, &format!("[data-card='{flaky}']")).await;
        let url = client.current_url().await.unwrap();
        assert!(
            url.as_str().ends_with("/?q=FLAKY&assignee=&tenant=&block="),
            "{url}"
        );
        assert!(
            client
                .find(Locator::Css(&format!("[data-card='{other}']")))
                .await
                .is_err(),
            "the filter hides what does not match"
        );
        // The same URL, opened fresh, shows the same view.
        client
            .goto(&format!("{}/?assignee=writer", server.url))
            .await
            .unwrap();
        find(client, &format!("[data-card='{other}']")).await;
        assert!(
            client
                .find(Locator::Css(&format!("[data-card='{flaky}']")))
                .await
                .is_err()
        );
        // A lane of 107 cards pages by 100, under its filter.
        client
            .goto(&format!("{}/?tenant=bulk", server.url))
            .await
            .unwrap();
        let count = text(client, "[data-lane=ready] [data-count]").await;
        assert_eq!(count, "105");
        click(client, "[data-lane=ready] [data-next-page]").await;
        let url = client.current_url().await.unwrap();
        assert!(
            url.as_str().ends_with("/?tenant=bulk&lane=ready&page=2"),
            "{url}"
        );
        let shown = script(
            client,
            "return document.querySelectorAll('[data-lane=ready] [data-card]').length",
        )
        .await;
        assert_eq!(shown, json!(5));
        let lanes = script(
            client,
            "return document.querySelectorAll('[data-lane]').length",
        )
        .await;
        assert_eq!(lanes, json!(1), "one lane alone");
    });
}

#[test]
fn terminating_a_running_card_from_its_page_fences_its_worker() {
    let bench = Bench::new();
    let running = bench.add("fix the flaky parser test", &[]);
    let carrier = bench.claim(&running, Some(900));
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client
            .goto(&format!("{}/cards/{running}", server.url))
            .await
            .unwrap();
        assert_eq!(text(client, "[data-action=reclaim]").await, "Terminate run");
        click(client, "[data-action=reclaim]").await;
        until("the run is terminated", || {
            status(&bench, &running) == "ready"
        })
        .await;
    });
    let mut stale = bench.command();
    stale
        .envs(carrier.iter().cloned())
        .args(["complete", "--summary", "too late"]);
    assert_eq!(stale.output().unwrap().status.code(), Some(1), "fenced out");
}

/// A provider wall on the board, as a dispatcher's booking leaves one.
fn wall(bench: &Bench, scope: &str, source: &str) {
    let conn = rusqlite::Connection::open(&bench.db).unwrap();
    let now = crate::now();
    conn.execute(
        "INSERT INTO provider_walls (scope, kind, route, since, until, reason, source, hits)
         VALUES (?1, 'rate', 'coder', ?2, ?3, 'HTTP 429: slow down', ?4, 3)",
        rusqlite::params![scope, now, now + 3600, source],
    )
    .unwrap();
}

#[test]
fn walls_diagnostics_and_the_dispatchers_health_have_views_of_their_own() {
    let bench = Bench::new();
    let agents = bench.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.coder]\ncommand = \"true\"\nprovider = \"http:api.example/v1\"\n\
         [agents.writer]\ncommand = \"true\"\nprovider = \"http:api.example/v1\"\n\
         [agents.reviewer]\ncommand = \"true\"\n",
    )
    .unwrap();
    let stray = bench.add("nobody serves this", &["--assignee", "ghost"]);
    let notes = bench.add("write the notes", &["--assignee", "writer"]);
    bench.add("review the notes", &["--assignee", "reviewer"]);
    let running = bench.add("fix the flaky parser test", &["--assignee", "coder"]);
    let _carrier = bench.claim(&running, Some(900));
    wall(&bench, "http:api.example/v1", &format!("{running}#1"));
    // What three hosts' dispatchers said of themselves, as each writes it
    // every 15 s.
    let conn = rusqlite::Connection::open(&bench.db).unwrap();
    let now = crate::now();
    for (host, ago, in_flight, state, why) in [
        ("alpha", 3, 2, "claiming", None),
        ("beta", 5, 1, "paused", Some("the disk is full")),
        ("gamma", 600, 1, "claiming", None),
    ] {
        conn.execute(
            "INSERT INTO dispatchers (host, reported_at, in_flight, state, why) VALUES (?1, ?2, ?3, ?4, ?5)",
            rusqlite::params![host, now - ago, in_flight, state, why],
        )
        .unwrap();
    }
    let server = Server::start(&bench, &["--agents", agents.to_str().unwrap()]);
    browse(false, async |client| {
        client.goto(&server.url).await.unwrap();
        let health = text(client, "[data-health]").await;
        assert!(
            health.starts_with("1 running · 1 provider wall · last activity"),
            "{health}"
        );
        let said = script(
            client,
            "return Array.from(document.querySelectorAll('[data-dispatcher]')).map(d => [d.getAttribute('data-dispatcher'), d.classList.contains('warn'), d.textContent])",
        )
        .await;
        let said = said.as_array().unwrap();
        assert_eq!(said.len(), 3, "{said:?}");
        assert_eq!(said[0][0], "alpha");
        assert_eq!(said[0][1], false);
        assert!(
            said[0][2]
                .as_str()
                .unwrap()
                .starts_with("dispatcher alpha: claiming, 2 in flight, reported "),
            "{said:?}"
        );
        assert_eq!(said[1][1], true, "a pause warns");
        assert!(
            said[1][2]
                .as_str()
                .unwrap()
                .contains("paused (the disk is full), 1 in flight"),
            "{said:?}"
        );
        assert_eq!(said[2][1], true, "silence warns");
        assert!(
            said[2][2]
                .as_str()
                .unwrap()
                .contains("dispatcher gamma: silent for 10m"),
            "{said:?}"
        );
        // A wall's pill narrows the board to the cards it holds back.
        click(client, "a[data-wall-filter='http:api.example/v1']").await;
        find(client, "select[name=wall]").await;
        let url = client.current_url().await.unwrap();
        assert_eq!(url.query(), Some("wall=http%3Aapi.example%2Fv1"));
        let shown = script(
            client,
            "return Array.from(document.querySelectorAll('[data-card]')).map(c => c.getAttribute('data-card'))",
        )
        .await;
        assert_eq!(
            shown,
            json!([notes, running]),
            "the cards of every agent calling the walled provider"
        );
        let selected = script(
            client,
            "return document.querySelector('select[name=wall]').value",
        )
        .await;
        assert_eq!(
            selected,
            json!("http:api.example/v1"),
            "the filter form shows it"
        );
        click(client, "nav a[href='/diagnostics']").await;
        let found = text(client, &format!("[data-diagnosed='{stray}']")).await;
        assert!(found.contains("ghost"), "{found}");
        click(client, "nav a[href='/walls']").await;
        let shown = text(client, "[data-wall='http:api.example/v1']").await;
        assert!(shown.contains("HTTP 429"), "{shown}");
        click(client, "[data-action=lift]").await;
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath("//p[contains(., 'No provider wall')]"))
            .await
            .expect("the wall is lifted");
    });
    assert_eq!(bench.ok(&["walls", "--json"]).trim(), "[]");
    let (code, answer) = crate::serve::get(&format!("{}/?wall=http:api.example/v1", server.url));
    assert_eq!(code, 404, "a wall lifted since: {answer}");
    assert!(answer.contains("the walls page lists"), "{answer}");
    // The same through the API, as described.
    let openapi: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    let (code, answer) = crate::serve::get(&format!("{}/api/diagnostics", server.url));
    let answer: Value = serde_json::from_str(&answer).unwrap();
    crate::serve::conforms(&openapi, "/api/diagnostics", "get", code, &answer);
    assert!(
        answer
            .as_array()
            .unwrap()
            .iter()
            .any(|card| card["task_id"] == json!(stray)),
        "{answer}"
    );
    wall(&bench, "http:api.example/v2", &format!("{running}#1"));
    let lift = format!("{}/api/walls/lift", server.url);
    for (scope, want) in [("http:api.example/v2", 200), ("http:api.example/v2", 404)] {
        let (code, answer) = crate::serve::post_json(&lift, &json!({"scope": scope}));
        crate::serve::conforms(&openapi, "/api/walls/lift", "post", code, &answer);
        assert_eq!(code, want, "{answer}");
    }
    assert_eq!(bench.ok(&["walls", "--json"]).trim(), "[]");
}

#[test]
fn the_notifications_page_subscribes_a_webhook_to_every_card_and_stops_it() {
    let bench = Bench::new();
    let server = Server::start(&bench, &[]);
    let listed = |bench: &Bench| -> Vec<Value> {
        serde_json::from_str::<Value>(&bench.ok(&["notify", "list", "--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    };
    browse(false, async |client| {
        client.goto(&server.url).await.unwrap();
        click(client, "nav a[href='/notifications']").await;
        find(client, "form[action='/actions/notify'] input[name=webhook]")
            .await
            .send_keys("https://hooks.example/board/secret-path")
            .await
            .unwrap();
        click(client, "[data-action=notify]").await;
        until("the board-wide subscription is made", || {
            listed(&bench).len() == 1
        })
        .await;
        let made = listed(&bench)[0].clone();
        assert_eq!(
            (&made["scope"], &made["channel"], &made["kinds"]),
            (
                &json!("board"),
                &json!("webhook"),
                &json!(["needs_input", "failed"])
            ),
            "{made}"
        );
        let shown = text(client, &format!("[data-subscription='{}']", made["id"])).await;
        assert!(
            !shown.contains("secret-path"),
            "the path is not shown: {shown}"
        );
        click(client, "[data-action=unnotify]").await;
        until("the subscription is stopped", || listed(&bench).is_empty()).await;
    });
}

#[test]
fn a_running_card_s_log_streams_to_its_page() {
    use std::io::Write as _;
    let bench = Bench::new();
    let running = bench.add("fix the flaky parser test", &[]);
    let _carrier = bench.claim(&running, Some(900));
    let logs = bench.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let log = logs.join(format!("{running}.log"));
    std::fs::write(&log, "run 1 started\n").unwrap();
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client
            .goto(&format!("{}/cards/{running}", server.url))
            .await
            .unwrap();
        let shown = text(client, "pre[data-log]").await;
        assert!(shown.contains("run 1 started"), "{shown}");
        // Lines the agent writes show up with no commit to the board.
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        writeln!(file, "compiling the parser").unwrap();
        write!(file, "running the tests").unwrap();
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath(
                "//pre[@data-log][contains(., 'compiling the parser')]",
            ))
            .await
            .expect("a whole line the agent wrote streams to the page");
        let shown = text(client, "pre[data-log]").await;
        assert!(
            !shown.contains("running the tests"),
            "a line being written waits for its end: {shown}"
        );
        writeln!(file, " passed").unwrap();
        client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::XPath(
                "//pre[@data-log][contains(., 'running the tests passed')]",
            ))
            .await
            .expect("the line, once ended, streams whole");
    });
    let (code, _) = crate::serve::get(&format!("{}/cards/t_nope/log", server.url));
    assert_eq!(code, 404);

    // A card that does not run: its log from a byte on (every line end a
    // newline, each event's id where it ends), then `end`, and the stream
    // closes; a reconnecting browser's Last-Event-ID goes on from there.
    let idle = bench.add("write the release notes", &[]);
    let log = logs.join(format!("{idle}.log"));
    std::fs::write(&log, "old line\nfirst\r\nsecond\rthird\npartial").unwrap();
    let (code, events) = crate::serve::get(&format!("{}/cards/{idle}/log?from=9", server.url));
    assert_eq!(code, 200);
    assert!(
        events.contains("event: log\nid: 29\ndata: first\ndata: second\ndata: third\n")
            && !events.contains("old line")
            && !events.contains("partial"),
        "{events}"
    );
    assert!(
        events
            .trim_end()
            .ends_with(&format!("event: end\ndata: {idle}")),
        "{events}"
    );
    let mut resumed = crate::serve::agent()
        .get(&format!("{}/cards/{idle}/log?from=0", server.url))
        .header("Last-Event-ID", "23")
        .call()
        .unwrap();
    let events = resumed.body_mut().read_to_string().unwrap();
    assert!(
        events.contains("data: third\n") && !events.contains("second"),
        "{events}"
    );
}

#[test]
fn a_file_is_uploaded_from_a_card_page_and_downloaded_again() {
    let bench = Bench::new();
    let card = bench.add("write the release notes", &[]);
    let file = bench.path().join("notes draft.txt");
    std::fs::write(&file, "the first draft\n").unwrap();
    let server = Server::start(&bench, &[]);
    browse(false, async |client| {
        client
            .goto(&format!("{}/cards/{card}", server.url))
            .await
            .unwrap();
        find(client, "form[data-upload] input[type=file]")
            .await
            .send_keys(file.to_str().unwrap())
            .await
            .unwrap();
        click(client, "[data-action=upload]").await;
        until("the file is attached", || {
            bench.show(&card)["attachments"]
                .as_array()
                .is_some_and(|files| files.len() == 1)
        })
        .await;
        find(client, "[data-attachment] a").await;
    });
    let attached = bench.show(&card)["attachments"][0].clone();
    assert_eq!(
        (&attached["filename"], &attached["size"]),
        (&json!("notes draft.txt"), &json!(16)),
        "{attached}"
    );
    let (code, body) = crate::serve::get(&format!(
        "{}/cards/{card}/attachments/{}",
        server.url, attached["id"]
    ));
    assert_eq!((code, body.as_str()), (200, "the first draft\n"));
    // The API refuses what a form of another site could send, what is too
    // big, and a card that is not there; none of them leaves a file.
    let upload = |path: &str, kind: &str, body: Vec<u8>| -> (u16, Value) {
        let mut response = crate::serve::agent()
            .post(&format!("{}{path}", server.url))
            .header("Content-Type", kind)
            .send(&body[..])
            .unwrap();
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    let openapi: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    let path = "/api/cards/{id}/attachments";
    for (url, kind, size, want) in [
        (
            format!("/api/cards/{card}/attachments?name=a.txt"),
            "text/plain",
            10,
            415,
        ),
        (
            format!("/api/cards/{card}/attachments?name=big.bin"),
            "application/octet-stream",
            25 * 1024 * 1024 + 1,
            413,
        ),
        (
            "/api/cards/t_00000000/attachments?name=a.txt".to_owned(),
            "application/octet-stream",
            10,
            404,
        ),
        (
            format!("/api/cards/{card}/attachments"),
            "application/octet-stream",
            10,
            400,
        ),
    ] {
        let (code, answer) = upload(&url, kind, vec![b'x'; size]);
        crate::serve::conforms(&openapi, path, "post", code, &answer);
        assert_eq!(code, want, "{url}: {answer}");
    }
    let (code, answer) = upload(
        &format!("/api/cards/{card}/attachments?name=report.pdf&type=application/pdf"),
        "application/octet-stream",
        b"%PDF-1.4".to_vec(),
    );
    crate::serve::conforms(&openapi, path, "post", code, &answer);
    assert_eq!(code, 201, "{answer}");
    assert_eq!(
        bench.show(&card)["attachments"].as_array().unwrap().len(),
        2
    );
    let folder = bench.path().join("attachments");
    let leftovers: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".upload-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// axe-core from the npm registry, installed once per build into the
/// test's own folder: its script's text.
fn axe_source() -> String {
    static AXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    AXE.get_or_init(|| {
        let folder = Path::new(env!("CARGO_TARGET_TMPDIR")).join("axe-core-4.10.2");
        let script: PathBuf = folder.join("node_modules/axe-core/axe.min.js");
        if !script.is_file() {
            let installed = std::process::Command::new("npm")
                .args([
                    "install",
                    "--no-save",
                    "--no-audit",
                    "--no-fund",
                    "--prefix",
                ])
                .arg(&folder)
                .arg("axe-core@4.10.2")
                .output()
                .expect("npm installs axe-core for the accessibility test (.ci/run installs npm)");
            assert!(
                installed.status.success(),
                "npm install axe-core: {}",
                crate::text(&installed.stderr)
            );
        }
        std::fs::read_to_string(&script).unwrap()
    })
    .clone()
}

/// The serious and critical violations axe-core finds on the page as it is.
async fn violations(client: &Client, axe: &str) -> Vec<String> {
    client.execute(axe, Vec::new()).await.unwrap();
    let found = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, {resultTypes: ['violations']}).then(
               r => done(r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
                 .map(v => v.id + ': ' + v.help + ' at ' + v.nodes.map(n => n.target.join(' ')).join(', '))),
               e => done(['axe failed: ' + e]));",
            Vec::new(),
        )
        .await
        .unwrap();
    serde_json::from_value(found).unwrap()
}

#[test]
fn every_page_and_dialog_passes_axe_in_both_themes_and_is_photographed() {
    let axe = axe_source();
    let bench = Bench::new();
    let card = bench.add(
        "write the release notes",
        &[
            "--assignee",
            "writer",
            "--priority",
            "2",
            "--body",
            "Notes for **0.3**:\n\n- the board\n- the API",
        ],
    );
    bench.add("summarise the design review", &["--assignee", "reviewer"]);
    bench.add("translate the README", &["--blocked"]);
    bench.add("shape the roadmap", &["--triage"]);
    let running = bench.add("fix the flaky parser test", &["--assignee", "coder"]);
    let _carrier = bench.claim(&running, Some(900));
    bench.ok(&["comment", &card, "start with the API"]);
    wall(&bench, "http:api.example/v1", &format!("{running}#1"));
    let server = Server::start(&bench, &[]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    for dark in [false, true] {
        let theme = if dark { "dark" } else { "light" };
        browse(dark, async |client| {
            client.goto(&server.url).await.unwrap();
            find(client, "#live").await;
            let scheme = script(
                client,
                "return matchMedia('(prefers-color-scheme: dark)').matches",
            )
            .await;
            assert_eq!(scheme, json!(dark), "the {theme} theme");
            let mut found = violations(client, &axe).await;
            std::fs::write(
                shots.join(format!("board-{theme}.png")),
                client.screenshot().await.unwrap(),
            )
            .unwrap();
            // The keys dialog, open.
            press(client, "?").await;
            find(client, "#keys[open]").await;
            found.extend(violations(client, &axe).await);
            // A card's page, its forms open.
            client
                .goto(&format!("{}/cards/{card}", server.url))
                .await
                .unwrap();
            find(client, "[data-action=hold]").await;
            std::fs::write(
                shots.join(format!("card-{theme}.png")),
                client.screenshot().await.unwrap(),
            )
            .unwrap();
            click(client, "details.edit summary").await;
            click(client, "details.more summary").await;
            found.extend(violations(client, &axe).await);
            // The walls and the diagnostics.
            client.goto(&format!("{}/walls", server.url)).await.unwrap();
            find(client, "[data-action=lift]").await;
            found.extend(violations(client, &axe).await);
            client
                .goto(&format!("{}/diagnostics", server.url))
                .await
                .unwrap();
            found.extend(violations(client, &axe).await);
            client
                .goto(&format!("{}/notifications", server.url))
                .await
                .unwrap();
            found.extend(violations(client, &axe).await);
            // A filtered view, one lane paged.
            client
                .goto(&format!("{}/?q=the&lane=ready", server.url))
                .await
                .unwrap();
            found.extend(violations(client, &axe).await);
            assert!(
                found.is_empty(),
                "axe-core in the {theme} theme:\n{}",
                found.join("\n")
            );
        });
    }
}

/// The API behind every page action: moves, edits and bulk actions, each
/// answer checked against the OpenAPI document, refusals included.
#[test]
fn the_api_moves_edits_and_acts_in_bulk_as_described() {
    use crate::serve::{conforms, post_json};
    let openapi: Value = serde_json::from_str(include_str!("../../../docs/openapi.json")).unwrap();
    let bench = Bench::new();
    let agents = bench.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[agents.coder]\ncommand = \"true\"\n[agents.writer]\ncommand = \"true\"\n",
    )
    .unwrap();
    let blocked = bench.add("translate the README", &["--blocked"]);
    let ready = bench.add("write the notes", &[]);
    let archived = bench.add("old idea", &[]);
    bench.ok(&["archive", &archived]);
    let server = Server::start(&bench, &["--agents", agents.to_str().unwrap()]);
    let base = &server.url;
    let act = "/api/cards/{id}/{action}";
    let call = |path: &str, body: Value| post_json(&format!("{base}{path}"), &body);

    let (code, answer) = call(
        &format!("/api/cards/{blocked}/move"),
        json!({"to": "ready"}),
    );
    conforms(&openapi, act, "post", code, &answer);
    assert_eq!((code, status(&bench, &blocked)), (200, "ready".to_owned()));
    // Unblocked with a reason: the reason reaches the card's next run as a
    // comment.
    let asked = bench.add("pick a licence", &["--blocked"]);
    let (code, answer) = call(
        &format!("/api/cards/{asked}/unblock"),
        json!({"reason": "use MIT"}),
    );
    conforms(&openapi, "/api/cards/{id}/{action}", "post", code, &answer);
    assert_eq!(
        (code, status(&bench, &asked)),
        (200, "ready".to_owned()),
        "{answer}"
    );
    assert_eq!(
        bench.show(&asked)["comments"][0]["body"],
        "Unblocked: use MIT"
    );
    let (code, answer) = call(
        &format!("/api/cards/{ready}/move"),
        json!({"to": "running"}),
    );
    conforms(&openapi, act, "post", code, &answer);
    assert_eq!(code, 409);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("dispatcher claims it"),
        "{answer}"
    );
    let (code, answer) = call(
        &format!("/api/cards/{ready}/move"),
        json!({"to": "sideways"}),
    );
    conforms(&openapi, act, "post", code, &answer);
    assert_eq!(code, 400);
    assert_eq!(
        status(&bench, &ready),
        "ready",
        "a refused move changes nothing"
    );
    // A page that showed the card elsewhere moves nothing: the same drop on
    // a card that moved on would be another operation.
    let (code, answer) = call(
        &format!("/api/cards/{ready}/move"),
        json!({"to": "scheduled", "from": "blocked"}),
    );
    conforms(&openapi, act, "post", code, &answer);
    assert_eq!(code, 409);
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("the page was behind"),
        "{answer}"
    );
    assert_eq!(
        status(&bench, &ready),
        "ready",
        "a stale move changes nothing"
    );
    // A card in triage that waits for an open card stays there, said plainly.
    let waiting = bench.add("shape the follow-up", &["--triage", "--parent", &ready]);
    let (code, answer) = call(
        &format!("/api/cards/{waiting}/move"),
        json!({"to": "todo", "from": "triage"}),
    );
    conforms(&openapi, act, "post", code, &answer);
    assert_eq!(code, 409, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("move it again once that one is done"),
        "{answer}"
    );
    assert_eq!(status(&bench, &waiting), "triage");

    let edit = "/api/cards/{id}/edit";
    let (code, answer) = call(
        &format!("/api/cards/{ready}/edit"),
        json!({"title": "write the release notes", "priority": 3, "assignee": "writer", "tenant": "acme"}),
    );
    conforms(&openapi, edit, "post", code, &answer);
    assert_eq!(code, 200);
    let task = bench.show(&ready)["task"].clone();
    assert_eq!(
        (
            &task["title"],
            &task["priority"],
            &task["assignee"],
            &task["tenant"]
        ),
        (
            &json!("write the release notes"),
            &json!(3),
            &json!("writer"),
            &json!("acme")
        )
    );
    for (body, want) in [
        (json!({"assignee": "stranger"}), 400),
        (json!({"priority": "high"}), 400),
        (json!({"title": "  "}), 400),
        (json!({"colour": "red"}), 400),
        (json!({"workspace": "dir:/no/such/folder"}), 400),
        (json!({"workspace": "everywhere"}), 400),
        (json!({"branch": "topic"}), 400),
    ] {
        let (code, answer) = call(&format!("/api/cards/{ready}/edit"), body.clone());
        conforms(&openapi, edit, "post", code, &answer);
        assert_eq!(code, want, "{body}: {answer}");
    }
    let (code, answer) = call(
        &format!("/api/cards/{ready}/edit"),
        json!({"tenant": "two\nlines"}),
    );
    conforms(&openapi, edit, "post", code, &answer);
    assert_eq!(code, 400, "a tenant is one plain line: {answer}");
    let (code, answer) = call(
        &format!("/api/cards/{archived}/edit"),
        json!({"title": "x"}),
    );
    conforms(&openapi, edit, "post", code, &answer);
    assert_eq!(code, 409);
    assert_eq!(
        bench.show(&ready)["task"]["title"],
        "write the release notes",
        "refusals change nothing"
    );
    let (code, answer) = call(
        &format!("/api/cards/{ready}/edit"),
        json!({"workspace": format!("dir:{}", bench.path().display())}),
    );
    conforms(&openapi, edit, "post", code, &answer);
    assert_eq!(code, 200, "{answer}");
    assert_eq!(bench.show(&ready)["task"]["workspace_kind"], "dir");
    // The page's form saves only what was changed in it: a title changed
    // meanwhile by somebody else stays, and a body sent back as a browser
    // sends it (CRLF) is no change.
    bench.ok(&[
        "edit",
        &ready,
        "--title",
        "changed meanwhile",
        "--body",
        "line one\nline two",
    ]);
    let (_, page) = crate::serve::get(&format!("{base}/cards/{ready}"));
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let events_before = bench.show(&ready)["events"].as_array().unwrap().len();
    let form = [
        ("csrf", csrf.as_str()),
        ("was_title", "write the release notes"),
        ("title", "write the release notes"),
        ("was_body", "line one\nline two"),
        ("body", "line one\r\nline two"),
        ("was_priority", "3"),
        ("priority", "4"),
    ];
    let response = crate::serve::agent()
        .post(&format!("{base}/actions/{ready}/edit"))
        .header("Origin", base.as_str())
        .config()
        .max_redirects(0)
        .build()
        .send_form(form)
        .unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let card = bench.show(&ready);
    assert_eq!(
        (
            &card["task"]["title"],
            &card["task"]["body"],
            &card["task"]["priority"]
        ),
        (
            &json!("changed meanwhile"),
            &json!("line one\nline two"),
            &json!(4)
        )
    );
    let events = card["events"].as_array().unwrap();
    assert_eq!(events.len(), events_before + 1);
    assert_eq!(
        events.last().unwrap()["payload"]["fields"],
        json!(["priority"]),
        "{card}"
    );
    // Clearing the tenant: an empty value.
    let (code, _) = call(&format!("/api/cards/{ready}/edit"), json!({"tenant": ""}));
    assert_eq!(code, 200);
    assert_eq!(bench.show(&ready)["task"]["tenant"], Value::Null);

    let (code, answer) = call(
        "/api/bulk",
        json!({"cards": [ready, blocked, archived, "t_nope"], "action": "hold", "reason": "freeze"}),
    );
    conforms(&openapi, "/api/bulk", "post", code, &answer);
    assert_eq!(code, 200);
    let oks: Vec<bool> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ok"] == true)
        .collect();
    assert_eq!(oks, [true, true, false, false], "{answer}");
    assert_eq!(
        (status(&bench, &ready), status(&bench, &blocked)),
        ("scheduled".to_owned(), "scheduled".to_owned())
    );
    let (code, answer) = call(
        "/api/bulk",
        json!({"cards": [ready, blocked], "action": "move", "to": "ready"}),
    );
    conforms(&openapi, "/api/bulk", "post", code, &answer);
    assert_eq!((code, status(&bench, &ready)), (200, "ready".to_owned()));
    for body in [
        json!({"cards": [], "action": "hold"}),
        json!({"cards": [ready], "action": "delete"}),
        json!({"cards": vec![ready.clone(); 1].into_iter().chain((0..500).map(|n| format!("t_{n}"))).collect::<Vec<_>>(), "action": "hold"}),
    ] {
        let (code, answer) = call("/api/bulk", body);
        conforms(&openapi, "/api/bulk", "post", code, &answer);
        assert_eq!(code, 400, "{answer}");
    }
    assert_eq!(status(&bench, &ready), "ready");
    // A reassign names an agent of the file, or none.
    let (code, answer) = call(
        &format!("/api/cards/{ready}/reassign"),
        json!({"text": "stranger"}),
    );
    conforms(&openapi, act, "post", code, &answer);
    assert_eq!(code, 400);
    let (code, _) = call(
        &format!("/api/cards/{ready}/reassign"),
        json!({"text": "coder"}),
    );
    assert_eq!(
        (code, bench.show(&ready)["task"]["assignee"].clone()),
        (200, json!("coder"))
    );
    // An agents file that does not load leaves the pages up (their lists
    // of agents empty); an assignee given is refused with its error.
    std::fs::set_permissions(&agents, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let (code, _) = crate::serve::get(&format!("{base}/"));
    assert_eq!(code, 200);
    let (code, _) = crate::serve::get(&format!("{base}/cards/{ready}"));
    assert_eq!(code, 200);
    let (code, answer) = call(
        &format!("/api/cards/{ready}/reassign"),
        json!({"text": "writer"}),
    );
    assert!(
        code >= 400 && answer["error"].as_str().unwrap().contains("agents.toml"),
        "{code} {answer}"
    );
    std::fs::set_permissions(&agents, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    // A bad board query is refused with what to fix.
    let (code, page) = crate::serve::get(&format!("{base}/?page=0"));
    assert_eq!(code, 400);
    assert!(page.contains("a lane pages from 1"), "{page}");
    let (code, page) = crate::serve::get(&format!("{base}/?lane=sideways"));
    assert_eq!(code, 400);
    assert!(page.contains("name one of"), "{page}");
}

/// `kanban ARGS…` on the kanban home `home`, which must succeed: its output.
fn in_home(bench: &Bench, home: &Path, args: &[&str]) -> String {
    let output = bench
        .command()
        .env(kanban_core::vars::HOME, home)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kanban {args:?}: {}",
        crate::text(&output.stderr)
    );
    crate::text(&output.stdout)
}

#[test]
fn a_page_switches_to_another_board_of_the_home_and_acts_on_it() {
    let bench = Bench::new();
    let home = bench.path().join("home");
    in_home(&bench, &home, &["init"]);
    in_home(
        &bench,
        &home,
        &["boards", "create", "team", "--name", "Team board"],
    );
    in_home(&bench, &home, &["boards", "create", "old"]);
    in_home(&bench, &home, &["boards", "rm", "old"]);
    let ours = in_home(&bench, &home, &["add", "on the default board"]);
    let theirs = in_home(
        &bench,
        &home,
        &["--board", "team", "add", "on the team board"],
    );
    let (ours, theirs) = (ours.trim().to_owned(), theirs.trim().to_owned());
    let team_status = |id: &str| -> String {
        let shown: Value = serde_json::from_str(&in_home(
            &bench,
            &home,
            &["--board", "team", "show", id, "--json"],
        ))
        .unwrap();
        shown["task"]["status"].as_str().unwrap().to_owned()
    };
    let mut command = bench.command();
    command
        .env(kanban_core::vars::HOME, &home)
        .args(["serve", "--listen", "127.0.0.1:0"]);
    let (child, url) = kanban_testkit::start_server(command);
    let _server = crate::serve::Server::adopt(child, url.clone());
    browse(false, async |client| {
        client.goto(&url).await.unwrap();
        find(client, &format!("[data-card='{ours}']")).await;
        let offered = script(
            client,
            "return Array.from(document.querySelectorAll('select[data-switch] option')).map(o => o.value)",
        )
        .await;
        assert_eq!(
            offered,
            json!(["default", "team"]),
            "an archived board is not offered"
        );
        click(client, "select[data-switch] option[value=team]").await;
        click(client, "form.switch button").await;
        find(client, &format!("[data-card='{theirs}']")).await;
        assert_eq!(client.current_url().await.unwrap().path(), "/boards/team");
        let shown = script(
            client,
            "return document.querySelectorAll('[data-card]').length",
        )
        .await;
        assert_eq!(shown, json!(1), "only the team board's card");
        // The switcher, as every page shows it, passes axe-core.
        let found = violations(client, &axe_source()).await;
        assert!(
            found.is_empty(),
            "axe-core on a board with a switcher:\n{}",
            found.join("\n")
        );
        // A key on the team board acts on the team board (the API under
        // its path).
        press(client, "js").await;
        until("s held the team board's card", || {
            team_status(&theirs) == "scheduled"
        })
        .await;
        // Its card page, and a form there, stay on the team board.
        client
            .goto(&format!("{url}/boards/team/cards/{theirs}"))
            .await
            .unwrap();
        click(client, "[data-action=release]").await;
        until("the form released it", || {
            team_status(&theirs) != "scheduled"
        })
        .await;
        find(client, "[data-fragment$='?part=head'] [data-status]").await;
        assert_eq!(
            client.current_url().await.unwrap().path(),
            format!("/boards/team/cards/{theirs}")
        );
        // And back: the first board is at the root.
        click(client, "select[data-switch] option[value=default]").await;
        click(client, "form.switch button").await;
        find(client, &format!("[data-card='{ours}']")).await;
        assert_eq!(client.current_url().await.unwrap().path(), "/");
    });
    let (code, answer) = crate::serve::get(&format!("{url}/switch?board=nope"));
    assert_eq!(code, 404, "{answer}");
    assert!(answer.contains("kanban boards lists"), "{answer}");
    let (code, _) = crate::serve::get(&format!("{url}/boards/old"));
    assert_eq!(code, 404, "an archived board is not served");
}
