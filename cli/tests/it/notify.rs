//! Notifications end to end: real dispatchers deliver the board's outbox
//! to a webhook receiver on loopback (down, failing, back), and to a
//! command.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use hmac::{KeyInit as _, Mac as _};
use kanban_testkit::{WebhookReceiver, unused_loopback_address};
use serde_json::Value;

use crate::{Bench, text, wait_for};

const SUCCESS: &str = r#"{"completed": true, "final_response": "all done"}"#;

/// An agent that asks a person first on a card whose body says
/// `block-first` (blocked, needs_input), and completes every other turn.
fn agent(bench: &Bench) -> std::path::PathBuf {
    let path = bench.path().join("agent.sh");
    let script = format!(
        r#"#!/bin/sh
request=$(cat)
mark="$(dirname "$0")/asked-$KANBAN_TASK"
echo "${{KANBAN_SECRET_HOOK-unset}}" > "$(dirname "$0")/secret-seen-$KANBAN_TASK"
case "$request" in
  *block-first*)
    if [ ! -e "$mark" ]; then
      : > "$mark"
      "$KANBAN_BIN" block --reason "which region?" --kind needs_input >&2 || exit $?
      exit 0
    fi ;;
esac
"$KANBAN_BIN" complete --summary "done" >&2 || exit $?
echo '{SUCCESS}'
"#
    );
    kanban_testkit::write_executable(&path, &script);
    path
}

/// A dispatcher ticking in the background until it is dropped.
struct Ticking(Child);

impl Drop for Ticking {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.0.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

fn ticking(bench: &Bench, env: &[(&str, &str)]) -> Ticking {
    let agent = agent(bench);
    let mut command = bench.dispatch_command(&agent, &[]);
    command
        .env("KANBAN_NOTIFY_RETRY_BASE_SECONDS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    Ticking(command.spawn().unwrap())
}

fn subscribe(bench: &Bench, args: &[&str]) -> i64 {
    let mut all = vec!["notify", "subscribe", "--json"];
    all.extend_from_slice(args);
    let said: Value = serde_json::from_str(&bench.ok(&all)).unwrap();
    said["id"].as_i64().unwrap()
}

/// `t=…,v1=…` checked as docs/notifications.md says to.
fn verify(secret: &str, header: &str, body: &[u8]) -> bool {
    let Some((t, v1)) = header
        .split_once(',')
        .and_then(|(t, v1)| Some((t.strip_prefix("t=")?, v1.strip_prefix("v1=")?)))
    else {
        return false;
    };
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    expected == v1
}

/// Whether both of docs/notifications.md's recipes (its Python and its
/// shell) accept `signature` of `body` with `secret`; they must agree.
fn documented_recipes_accept(
    secret: &str,
    signature: &str,
    body: &[u8],
    dir: &std::path::Path,
) -> bool {
    let docs = include_str!("../../../docs/notifications.md");
    let block = |fence: &str| {
        let start = docs.find(fence).expect("a recipe") + fence.len();
        docs[start..]
            .split("```")
            .next()
            .expect("its end")
            .to_owned()
    };
    let python = format!(
        "{}\nimport sys\nprint(verify(sys.argv[1].encode(), sys.argv[2], open(sys.argv[3], 'rb').read()))\n",
        block("```python\n")
    );
    let file = dir.join("body.json");
    std::fs::write(&file, body).unwrap();
    let by_python = std::process::Command::new("python3")
        .args(["-c", &python, secret, signature])
        .arg(&file)
        .output()
        .unwrap();
    assert!(by_python.status.success(), "{}", text(&by_python.stderr));
    let by_shell = std::process::Command::new("sh")
        .args([
            "-c",
            &block(
                "In shell, with the body in `body.json` and the header in `$SIGNATURE`:\n\n```sh\n",
            ),
        ])
        .current_dir(dir)
        .env("SIGNATURE", signature)
        .env("SECRET", secret)
        .output()
        .unwrap();
    let python_says = text(&by_python.stdout).trim() == "True";
    let shell_says = text(&by_shell.stdout).trim() == "valid";
    assert_eq!(python_says, shell_says, "the two recipes disagree");
    python_says
}

#[test]
fn a_card_needing_input_reaches_a_signed_webhook_within_a_second() {
    let bench = Bench::new();
    let receiver = WebhookReceiver::start(|_| 200);
    subscribe(
        &bench,
        &[
            "--all-cards",
            "--events",
            "needs_input",
            "--webhook",
            &receiver.url,
            "--secret-env",
            "KANBAN_SECRET_HOOK",
        ],
    );
    let _dispatcher = ticking(
        &bench,
        &[
            ("KANBAN_SECRET_HOOK", "s3cret-hook"),
            ("KANBAN_PUBLIC_URL", "http://board.example:8080/"),
        ],
    );
    let quiet = bench.add("no question here", &[]);
    let card = bench.add("ask first", &["--body", "block-first"]);
    let conn = rusqlite::Connection::open(&bench.db).unwrap();
    let mut blocked_seen = None;
    wait_for("the card to be blocked and notified", || {
        if blocked_seen.is_none() {
            let status: String = conn
                .query_row("SELECT status FROM tasks WHERE id = ?1", [&card], |row| {
                    row.get(0)
                })
                .unwrap();
            if status == "blocked" {
                blocked_seen = Some(Instant::now());
            }
        }
        !receiver.hooks().is_empty()
    });
    let hooks = receiver.hooks();
    let hook = &hooks[0];
    let seen = blocked_seen.unwrap_or(hook.at);
    let latency = hook.at.saturating_duration_since(seen);
    eprintln!("notified {latency:?} after the block was seen committed");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    let body = hook.json();
    assert_eq!(body["type"], "needs_input");
    assert_eq!(body["card"]["id"], card.as_str());
    assert_eq!(body["card"]["title"], "ask first");
    assert_eq!(body["card"]["status"], "blocked");
    assert_eq!(body["event"]["kind"], "blocked");
    assert_eq!(body["event"]["payload"]["reason"], "which region?");
    assert_eq!(
        body["link"],
        format!("http://board.example:8080/cards/{card}")
    );
    let id = body["id"].as_str().unwrap();
    assert!(id.starts_with("kn_"), "{id}");
    assert_eq!(hook.header("idempotency-key"), Some(id));
    assert_eq!(hook.header("x-kanban-notification"), Some(id));
    let signature = hook.header("x-kanban-signature").expect("signed");
    assert!(verify("s3cret-hook", signature, &hook.body), "{signature}");
    assert!(!verify("another secret", signature, &hook.body));
    // The recipes docs/notifications.md gives, run as written.
    for (recipe, valid) in [("s3cret-hook", true), ("another secret", false)] {
        assert_eq!(
            documented_recipes_accept(recipe, signature, &hook.body, bench.path()),
            valid
        );
    }
    // The completed card is not a needs_input event: nothing for it.
    wait_for("the other card to be done", || {
        bench.show(&quiet)["task"]["status"] == "done"
    });
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(receiver.hooks().len(), 1, "one notification, once");
    let listed: Value = serde_json::from_str(&bench.ok(&["notify", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["delivered"], 1);
    assert_eq!(listed[0]["pending"], 0);
    assert_eq!(
        listed[0]["secret"], "env:KANBAN_SECRET_HOOK",
        "the name, never the secret"
    );
    let mut board = std::fs::read(&bench.db).unwrap();
    board.extend(std::fs::read(bench.db.with_extension("db-wal")).unwrap_or_default());
    assert!(
        !board.windows(11).any(|window| window == b"s3cret-hook"),
        "the secret is not in the board"
    );
    // Nor in any worker's or agent's environment.
    for id in [&card, &quiet] {
        let seen = std::fs::read_to_string(bench.path().join(format!("secret-seen-{id}"))).unwrap();
        assert_eq!(seen.trim(), "unset", "{id}'s agent saw the secret");
    }
}

#[test]
fn a_receiver_down_then_failing_gets_every_notification_once_and_in_order() {
    let bench = Bench::new();
    let address = unused_loopback_address();
    let url = format!("http://{address}/hook");
    subscribe(
        &bench,
        &[
            "--all-cards",
            "--events",
            "needs_input,done",
            "--webhook",
            &url,
        ],
    );
    let dispatcher = ticking(&bench, &[]);
    let asking = bench.add("ask first", &["--body", "block-first"]);
    let plain = bench.add("plain", &[]);
    wait_for("the first run of each", || {
        bench.show(&asking)["task"]["status"] == "blocked"
            && bench.show(&plain)["task"]["status"] == "done"
    });
    bench.ok(&["unblock", &asking]);
    wait_for("the asking card to be done", || {
        bench.show(&asking)["task"]["status"] == "done"
    });
    // Down: connections refused for 15 s, then 503s for 15 s.
    std::thread::sleep(Duration::from_secs(15));
    let back = Instant::now() + Duration::from_secs(15);
    let receiver =
        WebhookReceiver::start_at(
            address,
            move |_| {
                if Instant::now() < back { 503 } else { 200 }
            },
        );
    let started = Instant::now();
    while receiver.accepted().len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "{:?}",
            receiver.hooks()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(3));
    drop(dispatcher);
    let refused = receiver
        .hooks()
        .iter()
        .filter(|hook| hook.status == 503)
        .count();
    assert!(
        refused > 0,
        "the receiver answered 503 while it was failing"
    );
    let accepted: Vec<Value> = receiver.accepted().iter().map(|hook| hook.json()).collect();
    let mut ids: Vec<&str> = accepted
        .iter()
        .map(|body| body["id"].as_str().unwrap())
        .collect();
    assert_eq!(accepted.len(), 3, "{accepted:?}");
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "each notification accepted once");
    let of_asking: Vec<&str> = accepted
        .iter()
        .filter(|body| body["card"]["id"] == asking.as_str())
        .map(|body| body["type"].as_str().unwrap())
        .collect();
    assert_eq!(of_asking, ["needs_input", "done"], "in order per card");
    // Every attempt at one notification carried the same id.
    for hook in receiver.hooks() {
        let body = hook.json();
        assert_eq!(hook.header("idempotency-key"), body["id"].as_str());
    }
}

#[test]
fn two_dispatchers_on_one_postgres_board_deliver_each_notification_once() {
    let bench = Bench::postgres();
    let receiver = WebhookReceiver::start(|_| 200);
    subscribe(
        &bench,
        &[
            "--all-cards",
            "--events",
            "done",
            "--webhook",
            &receiver.url,
        ],
    );
    let ids: Vec<String> = (0..8)
        .map(|n| bench.add(&format!("card {n}"), &[]))
        .collect();
    let first = ticking(&bench, &[]);
    let second = ticking(&bench, &[]);
    let started = Instant::now();
    while receiver.hooks().len() < ids.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{}",
            receiver.hooks().len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    drop((first, second));
    let mut notified: Vec<String> = receiver
        .hooks()
        .iter()
        .map(|hook| hook.json()["card"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(notified.len(), ids.len(), "one request per notification");
    notified.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(notified, expected);
}

#[test]
fn a_command_channel_gets_the_notification_on_its_stdin() {
    let bench = Bench::new();
    let card = bench.add("report me", &[]);
    let out = bench.path().join("notified.json");
    let command = format!(
        "cat > {}; echo \"$KANBAN_NOTIFICATION_ID\" >> {}.id",
        out.display(),
        out.display()
    );
    subscribe(
        &bench,
        &["--card", &card, "--events", "done", "--command", &command],
    );
    let agent = agent(&bench);
    bench.dispatch_until_idle(&agent, &[]);
    wait_for("the command to run", || out.exists());
    let body: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(body["type"], "done");
    assert_eq!(body["card"]["id"], card.as_str());
    assert_eq!(body["event"]["kind"], "completed");
    let id = std::fs::read_to_string(format!("{}.id", out.display())).unwrap();
    assert_eq!(id.trim(), body["id"].as_str().unwrap());
}

#[test]
fn a_receiver_that_refuses_for_good_is_marked_dead_and_listed() {
    let bench = Bench::new();
    let receiver = WebhookReceiver::start(|_| 410);
    let id = subscribe(
        &bench,
        &[
            "--all-cards",
            "--events",
            "done",
            "--webhook",
            &receiver.url,
        ],
    );
    let card = bench.add("gone receiver", &[]);
    let _dispatcher = ticking(&bench, &[]);
    let started = Instant::now();
    let listed = loop {
        let listed: Value = serde_json::from_str(&bench.ok(&["notify", "list", "--json"])).unwrap();
        if listed[0]["dead"] == 1 {
            break listed;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{listed}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(listed[0]["id"], id);
    assert_eq!(listed[0]["last_error"], "HTTP 410");
    assert_eq!(
        receiver.hooks().len(),
        3,
        "tried three times, then given up"
    );
    assert_eq!(bench.show(&card)["task"]["status"], "done");
    let human = bench.ok(&["notify", "list"]);
    assert!(
        human.contains("dead 1") && human.contains("HTTP 410"),
        "{human}"
    );
    let diagnosed = bench.ok(&["diagnostics"]);
    assert!(
        diagnosed.contains(&format!(
            "notifications: 1 dead for subscription {id} (webhook http://127.0.0.1:"
        )) && diagnosed.contains("HTTP 410"),
        "{diagnosed}"
    );
    bench.ok(&["notify", "unsubscribe", &id.to_string()]);
    assert_eq!(bench.ok(&["notify", "list", "--json"]).trim(), "[]");
    bench.refused(
        &["notify", "unsubscribe", &id.to_string()],
        "no subscription",
    );
}

#[test]
fn a_subscription_refuses_what_it_cannot_deliver_and_keeps_no_secret() {
    let bench = Bench::new();
    let card = bench.add("a card", &[]);
    let secret = bench.path().join("hook.secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let url = "https://hooks.example/k";
    bench.refused(
        &[
            "notify",
            "subscribe",
            "--all-cards",
            "--webhook",
            url,
            "--secret-file",
            secret.to_str().unwrap(),
        ],
        "chmod 600",
    );
    bench.refused(
        &[
            "notify",
            "subscribe",
            "--all-cards",
            "--events",
            "later",
            "--webhook",
            url,
        ],
        "\"later\" is not a kind",
    );
    bench.refused(
        &["notify", "subscribe", "--all-cards", "--webhook", "ftp://x"],
        "not an http:// or https:// URL",
    );
    bench.refused(
        &[
            "notify",
            "subscribe",
            "--card",
            "t_nothere",
            "--webhook",
            url,
        ],
        "t_nothere",
    );
    let usage = bench.run(&["notify", "subscribe", "--webhook", url]);
    assert_eq!(
        usage.status.code(),
        Some(2),
        "a scope is required: {}",
        text(&usage.stderr)
    );
    assert_eq!(
        bench.ok(&["notify", "list", "--json"]).trim(),
        "[]",
        "nothing stored"
    );
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    subscribe(
        &bench,
        &[
            "--card",
            &card,
            "--webhook",
            url,
            "--secret-file",
            secret.to_str().unwrap(),
        ],
    );
    let listed: Value = serde_json::from_str(&bench.ok(&["notify", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["secret"], format!("file:{}", secret.display()));
    assert_eq!(
        listed[0]["kinds"],
        serde_json::json!(["needs_input", "failed"])
    );
    assert_eq!(listed[0]["target"], card.as_str());
}

/// A venv with aiosmtpd, kept under Cargo's folder for test files.
fn smtp_python() -> std::path::PathBuf {
    let venv = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("smtp-venv");
    let ready = venv.join("aiosmtpd-installed");
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&venv);
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .expect("python3 runs the SMTP server: apt-get install python3-venv (.ci/run does)");
        assert!(
            made.status.success(),
            "python3 -m venv: {}",
            text(&made.stderr)
        );
        let installed = std::process::Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "aiosmtpd==1.4.6"])
            .output()
            .expect("pip runs");
        assert!(
            installed.status.success(),
            "pip install aiosmtpd: {}",
            text(&installed.stderr)
        );
        std::fs::write(&ready, "").unwrap();
    }
    venv.join("bin/python")
}

/// An SMTP server on loopback that offers STARTTLS and requires it (and
/// AUTH, as ann/pw), and records each message it takes as a JSON line.
const SMTP_SERVER: &str = r#"
import json, ssl, sys
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
port, cert, key, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
class Handler:
    async def handle_DATA(self, server, session, envelope):
        with open(out, "a") as f:
            f.write(json.dumps({"from": envelope.mail_from, "to": envelope.rcpt_tos,
                "tls": session.ssl is not None, "authenticated": session.authenticated,
                "data": envelope.content.decode("utf8", "replace")}) + "\n")
        return "250 OK"
def check(server, session, envelope, mechanism, auth_data):
    good = isinstance(auth_data, LoginPassword) and auth_data.login == b"ann" and auth_data.password == b"pw"
    return AuthResult(success=good)
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(cert, key)
controller = Controller(Handler(), hostname="127.0.0.1", port=port, tls_context=context,
    require_starttls=True, authenticator=check, auth_required=True)
controller.start()
print("ready", flush=True)
sys.stdin.read()
controller.stop()
"#;

struct SmtpServer(Child);

impl Drop for SmtpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_mail_channel_sends_through_starttls_with_a_password_from_a_file() {
    use std::io::BufRead as _;
    let bench = Bench::new();
    let certs_dir = bench.path().join("tls");
    std::fs::create_dir(&certs_dir).unwrap();
    let certs = kanban_testkit::loopback_certificates(&certs_dir);
    let port = unused_loopback_address().port();
    let script = bench.path().join("smtp.py");
    std::fs::write(&script, SMTP_SERVER).unwrap();
    let received = bench.path().join("received.jsonl");
    let mut child = std::process::Command::new(smtp_python())
        .arg(&script)
        .arg(port.to_string())
        .arg(&certs.cert)
        .arg(&certs.key)
        .arg(&received)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let _server = SmtpServer(child);
    let password = bench.path().join("smtp.password");
    std::fs::write(&password, "pw\n").unwrap();
    std::fs::set_permissions(
        &password,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let card = bench.add("mail me", &[]);
    let server = format!("smtp://ann@127.0.0.1:{port}");
    subscribe(
        &bench,
        &[
            "--card",
            &card,
            "--events",
            "done",
            "--mail",
            "ops@example.com",
            "--smtp",
            &server,
            "--mail-from",
            "kanban@example.com",
            "--smtp-password-file",
            password.to_str().unwrap(),
            "--smtp-ca",
            certs.ca.to_str().unwrap(),
        ],
    );
    let listed: Value = serde_json::from_str(&bench.ok(&["notify", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["smtp"]["server"], server.as_str());
    assert_eq!(listed[0]["secret"], format!("file:{}", password.display()));
    bench.dispatch_until_idle(&agent(&bench), &[]);
    wait_for("the mail", || received.exists());
    let mails: Vec<Value> = std::fs::read_to_string(&received)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(mails.len(), 1, "{mails:?}");
    let mail = &mails[0];
    assert_eq!(mail["tls"], true, "sent after STARTTLS");
    assert_eq!(mail["authenticated"], true);
    assert_eq!(mail["from"], "kanban@example.com");
    assert_eq!(mail["to"], serde_json::json!(["ops@example.com"]));
    let data = mail["data"].as_str().unwrap();
    assert!(
        data.contains(&format!("Subject: [kanban] {card} \"mail me\" is done")),
        "{data}"
    );
    assert!(data.contains("Message-ID: <kn_"), "{data}");
    assert!(data.contains("\"type\":\"done\""), "{data}");
    let listed: Value = serde_json::from_str(&bench.ok(&["notify", "list", "--json"])).unwrap();
    assert_eq!(listed[0]["delivered"], 1);
}

#[test]
fn the_seed_systems_notify_names_work_for_a_cards_webhooks() {
    let bench = Bench::new();
    let card = bench.add("a card", &[]);
    bench.refused(
        &[
            "notify-subscribe",
            &card,
            "--platform",
            "telegram",
            "--chat-id",
            "42",
        ],
        "no chat gateway",
    );
    let said: Value = serde_json::from_str(&bench.ok(&[
        "notify-subscribe",
        &card,
        "--webhook",
        "https://hooks.example/k",
        "--json",
    ]))
    .unwrap();
    let id = said["id"].as_i64().unwrap();
    let other = bench.add("another", &[]);
    bench.ok(&["notify-subscribe", &other, "--command", "true"]);
    let listed: Value = serde_json::from_str(&bench.ok(&["notify-list", &card, "--json"])).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["id"], id);
    assert_eq!(
        listed[0]["kinds"],
        serde_json::json!(["needs_input", "blocked", "done", "failed"])
    );
    bench.refused(
        &[
            "notify-unsubscribe",
            &card,
            "--platform",
            "telegram",
            "--chat-id",
            "42",
        ],
        "no chat gateway",
    );
    assert!(
        bench
            .ok(&["notify-unsubscribe", &card])
            .contains("unsubscribed 1")
    );
    bench.refused(
        &["notify-unsubscribe", &card],
        "no subscription to the events of",
    );
    let left: Value = serde_json::from_str(&bench.ok(&["notify-list", "--json"])).unwrap();
    assert_eq!(left[0]["target"], other.as_str(), "another card's stays");
}
