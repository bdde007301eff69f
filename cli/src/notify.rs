//! `kanban notify`, and the deliverer every dispatcher runs beside its
//! ticks: it leases due notifications from the board's outbox, sends each
//! to its webhook or command, and records the attempt as core's rules say
//! (`kanban_core::notify`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::bail;
use kanban_agent_port::OneShotCommand;
use kanban_board_sqlite::SystemClock;
use kanban_core::notify::{
    self, AfterFailure, Attempt, Delivery, DeliveryResult, NewSubscription, NotifyScope,
};
use kanban_core::{Environment, ExitCode};
use serde_json::json;

use crate::admin::card_id;
use crate::args::{GlobalArgs, NotifyCommand, SubscribeArgs};
use crate::board_path::{OpenBoard, Schema, open_board, open_db};
use crate::out::{errln, outln};
use crate::runtime::block_on;

/// How long a deliverer holds a notification it leased.
const LEASE_SECONDS: i64 = 60;
/// Notifications leased at once.
const BATCH: usize = 20;
/// How long one webhook call or command may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping dispatcher's deliverer goes on sending.
const LAST_PASS: Duration = Duration::from_secs(5);
/// How often a dispatcher's deliverer looks for due notifications.
const POLL: Duration = Duration::from_millis(200);
/// The variable that names the web board's address, for links.
const PUBLIC_URL_VAR: &str = "KANBAN_PUBLIC_URL";
/// The first wait after a failed delivery, in seconds (core's default
/// unless set, for tests and impatient receivers).
const RETRY_BASE_VAR: &str = "KANBAN_NOTIFY_RETRY_BASE_SECONDS";

pub(crate) fn notify(
    global: &GlobalArgs,
    env: &Environment,
    command: NotifyCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        NotifyCommand::Subscribe(args) => subscribe(global, env, &args),
        NotifyCommand::List { json } => list(global, env, None, json),
        NotifyCommand::Unsubscribe { id } => {
            let board = open_board(global, env)?;
            if !block_on(board.unsubscribe(id))? {
                bail!("no subscription {id}: `kanban notify list` shows them");
            }
            outln!("unsubscribed {id}");
            Ok(ExitCode::Success)
        }
        NotifyCommand::Deliver => {
            let board = open_board(global, env)?;
            let deliverer = Deliverer::new(env, "deliver");
            let pass = deliverer.deliver_due(&board, &|| true)?;
            outln!("delivered {}, failed {}", pass.delivered, pass.failed);
            Ok(ExitCode::Success)
        }
    }
}

fn subscribe(
    global: &GlobalArgs,
    env: &Environment,
    args: &SubscribeArgs,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let scope = match (&args.card, &args.assignee, &args.tenant) {
        (Some(card), _, _) => NotifyScope::Card(card_id(&board, card)?),
        (None, Some(assignee), _) => NotifyScope::Assignee(assignee.trim().to_owned()),
        (None, None, Some(tenant)) => NotifyScope::Tenant(tenant.trim().to_owned()),
        (None, None, None) => NotifyScope::Board,
    };
    let kinds =
        notify::parse_kinds(&args.events).map_err(|error| anyhow::anyhow!("--events {error}"))?;
    let (channel, address) = match (&args.webhook, &args.command, &args.mail) {
        (Some(url), _, _) => ("webhook", url.trim().to_owned()),
        (None, Some(command), _) => ("command", command.clone()),
        (None, None, Some(to)) => ("mail", to.trim().to_owned()),
        (None, None, None) => bail!("give --webhook URL, --command CMD or --mail ADDRESS"),
    };
    let (secret_env, secret_file) = if args.mail.is_some() {
        (&args.smtp_password_env, &args.smtp_password_file)
    } else {
        (&args.secret_env, &args.secret_file)
    };
    let secret = match (secret_env, secret_file) {
        (Some(name), _) => Some(format!("env:{}", name.trim())),
        (None, Some(path)) => {
            let path = std::path::absolute(path)?;
            read_secret_file(&path)?;
            Some(format!("file:{}", path.display()))
        }
        (None, None) => None,
    };
    let smtp = match (&args.smtp, &args.mail_from) {
        (Some(server), Some(from)) => Some(notify::SmtpSettings {
            server: server.trim().to_owned(),
            from: from.trim().to_owned(),
            ca: args
                .smtp_ca
                .as_deref()
                .map(std::path::absolute)
                .transpose()?
                .map(|path| path.display().to_string()),
        }),
        _ => None,
    };
    let new = NewSubscription {
        scope,
        kinds: kinds.iter().map(|kind| (*kind).to_owned()).collect(),
        channel: channel.to_owned(),
        address,
        format: args.format.clone(),
        secret,
        smtp,
        created_by: env.get_trimmed("USER").map(str::to_owned),
    };
    let id = block_on(board.subscribe(&new))?;
    if args.json {
        outln!("{}", json!({"id": id}));
    } else {
        outln!("{id}");
    }
    Ok(ExitCode::Success)
}

/// What to do instead of the seed system's chat gateway.
const NO_GATEWAY: &str = "kanban has no chat gateway (--platform, --chat-id): send the card's events to your chat's incoming webhook instead, `--webhook URL --format slack` (Slack, Mattermost, Discord's /slack path and ntfy take it), or to a command; see docs/notifications.md";

/// `notify-subscribe TASK`, the seed system's name: a webhook or a
/// command for one card's events.
pub(crate) fn seed_subscribe(
    global: &GlobalArgs,
    env: &Environment,
    args: &crate::args::SeedSubscribeArgs,
) -> anyhow::Result<ExitCode> {
    if args.webhook.is_none() && args.command.is_none() {
        bail!("{NO_GATEWAY}");
    }
    let ours = SubscribeArgs {
        card: Some(args.task_id.clone()),
        assignee: None,
        tenant: None,
        all_cards: false,
        events: args.events.clone(),
        webhook: args.webhook.clone(),
        command: args.command.clone(),
        mail: None,
        smtp: None,
        mail_from: None,
        smtp_password_env: None,
        smtp_password_file: None,
        smtp_ca: None,
        format: args.format.clone(),
        secret_env: args.secret_env.clone(),
        secret_file: None,
        json: args.json,
    };
    subscribe(global, env, &ours)
}

/// `notify-unsubscribe TASK [--id N]`, the seed system's name: the
/// subscriptions to one card's events go.
pub(crate) fn seed_unsubscribe(
    global: &GlobalArgs,
    env: &Environment,
    task: &str,
    only: Option<i64>,
    gateway: bool,
) -> anyhow::Result<ExitCode> {
    if gateway {
        bail!(
            "{NO_GATEWAY}; `kanban notify-list {task}` shows this card's subscriptions, and --id N removes one"
        );
    }
    let board = open_board(global, env)?;
    let id = card_id(&board, task)?;
    let of_card: Vec<i64> = block_on(board.subscriptions())?
        .iter()
        .filter(|sub| sub.scope == "card" && sub.target.as_deref() == Some(id.as_str()))
        .filter(|sub| only.is_none_or(|only| only == sub.id))
        .map(|sub| sub.id)
        .collect();
    if of_card.is_empty() {
        bail!("no subscription to the events of {id}: `kanban notify-list {id}` shows them");
    }
    for sub in &of_card {
        block_on(board.unsubscribe(*sub))?;
    }
    outln!("unsubscribed {} from {id}", of_card.len());
    Ok(ExitCode::Success)
}

/// The subscriptions (of one card's events, when `task` is given).
pub(crate) fn list(
    global: &GlobalArgs,
    env: &Environment,
    task: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let mut subscriptions = block_on(board.subscriptions())?;
    if let Some(task) = task {
        let id = card_id(&board, task)?;
        subscriptions
            .retain(|sub| sub.scope == "card" && sub.target.as_deref() == Some(id.as_str()));
    }
    // A webhook's path may hold its token: shown without it.
    for sub in &mut subscriptions {
        sub.address = notify::shown_address(&sub.channel, &sub.address);
    }
    if json {
        outln!("{}", serde_json::to_string(&subscriptions)?);
        return Ok(ExitCode::Success);
    }
    if subscriptions.is_empty() {
        outln!("no subscriptions: `kanban notify subscribe --help` makes one");
    }
    for sub in &subscriptions {
        let whom = match &sub.target {
            Some(target) => format!("{} {target}", sub.scope),
            None => sub.scope.clone(),
        };
        outln!(
            "{}  {whom}  {}  {} {}  pending {}, delivered {}, dead {}",
            sub.id,
            sub.kinds.join(","),
            sub.channel,
            notify::shown_address(&sub.channel, &sub.address),
            sub.pending,
            sub.delivered,
            sub.dead
        );
        if let Some(error) = &sub.last_error {
            outln!("    last error: {error}");
        }
    }
    Ok(ExitCode::Success)
}

/// The most of a secret file that is read.
const SECRET_FILE_BYTES: u64 = 64 * 1024;

/// A secret file: a regular file, the owner's alone, or it is refused
/// (like ssh's keys). It is checked on the handle it is read from, and
/// read only so far.
fn read_secret_file(path: &Path) -> anyhow::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let where_ = path.display();
    let cannot =
        |error: std::io::Error| anyhow::anyhow!("cannot read the secret file {where_}: {error}");
    // Not blocking on a FIFO: it is refused below, never waited on.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.is_file() {
        bail!("the secret file {where_} is not a regular file");
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() || meta.mode() & 0o077 != 0 {
        bail!(
            "the secret file {where_} may be read by other users (mode {:o}) or is not yours: run `chmod 600 {where_}`",
            meta.mode() & 0o777
        );
    }
    let mut text = String::new();
    file.take(SECRET_FILE_BYTES)
        .read_to_string(&mut text)
        .map_err(cannot)?;
    let secret = text.trim().to_owned();
    if secret.is_empty() {
        bail!("the secret file {where_} is empty");
    }
    Ok(secret)
}

/// How one pass went.
#[derive(Debug, Default)]
pub(crate) struct Pass {
    pub(crate) delivered: usize,
    pub(crate) failed: usize,
}

/// Delivers a board's notifications.
pub(crate) struct Deliverer {
    owner: String,
    link_base: Option<String>,
    retry_base: i64,
    env: Environment,
    http: ureq::Agent,
}

impl Deliverer {
    pub(crate) fn new(env: &Environment, role: &str) -> Self {
        let host = nix::unistd::gethostname()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        // A redirect is not followed: it would turn the POST into a GET
        // without its body, to a host the receiver names, and count as
        // delivered. A 3xx is the receiver's refusal.
        let http = ureq::Agent::new_with_config(
            ureq::config::Config::builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .timeout_global(Some(SEND_TIMEOUT))
                .build(),
        );
        Self {
            owner: format!("{role}:{host}:{}", std::process::id()),
            link_base: env
                .get_trimmed(PUBLIC_URL_VAR)
                .map(|base| base.trim_end_matches('/').to_owned()),
            retry_base: env
                .get_trimmed(RETRY_BASE_VAR)
                .and_then(|base| base.parse::<i64>().ok())
                .map_or(notify::RETRY_BASE_SECONDS, |base| {
                    base.clamp(1, notify::RETRY_CAP_SECONDS)
                }),
            env: env.clone(),
            http,
        }
    }

    /// Leases the due notifications, sends each, records each attempt;
    /// stops between two when `go_on` says so (the rest wait for their
    /// leases to run out).
    pub(crate) fn deliver_due(
        &self,
        board: &OpenBoard,
        go_on: &dyn Fn() -> bool,
    ) -> anyhow::Result<Pass> {
        let mut pass = Pass::default();
        let deliveries = block_on(board.lease_notifications(&self.owner, LEASE_SECONDS, BATCH))?;
        for delivery in deliveries {
            // Held again just before it goes: one leased long ago in this
            // batch may have passed to another deliverer meanwhile.
            if !go_on()
                || !block_on(board.renew_notification(
                    delivery.outbox_id,
                    &self.owner,
                    LEASE_SECONDS,
                ))?
            {
                continue;
            }
            let (attempt, error) = self.send(&delivery);
            let result = if attempt == Attempt::Delivered {
                pass.delivered += 1;
                DeliveryResult::Delivered
            } else {
                pass.failed += 1;
                let now = unix_now();
                let attempts = delivery.attempts.saturating_add(1);
                let first = delivery.first_tried_at.unwrap_or(now);
                let seed = u64::try_from(delivery.outbox_id)
                    .unwrap_or(0)
                    .wrapping_mul(2_654_435_761);
                let next = if delivery.event.is_none() {
                    AfterFailure::Dead
                } else {
                    notify::after_failure(attempt, attempts, first, now, self.retry_base, seed)
                };
                tracing::info!(target: "kanban::notify", "notification {} of subscription {}: {error}", delivery.outbox_id, delivery.subscription_id);
                DeliveryResult::Failed { error, next }
            };
            block_on(board.settle_notification(delivery.outbox_id, &self.owner, &result))?;
        }
        Ok(pass)
    }

    /// One attempt; what it came to, and why it failed.
    fn send(&self, delivery: &Delivery) -> (Attempt, String) {
        let Some(event) = &delivery.event else {
            return (Attempt::Refused, "its event is gone (gc)".to_owned());
        };
        let id = notify::notification_id(&delivery.token, delivery.outbox_id);
        let link = self
            .link_base
            .as_ref()
            .map(|base| format!("{base}/cards/{}", delivery.card.id));
        let body = if delivery.format == "slack" {
            notify::slack_body(event, &delivery.card, link.as_deref())
        } else {
            notify::payload(&id, event, &delivery.card, link.as_deref())
        }
        .to_string();
        if delivery.channel == "command" {
            let command = OneShotCommand {
                env: vec![("KANBAN_NOTIFICATION_ID".to_owned(), id)],
                env_remove: crate::worker_secrets::withheld(&self.env),
                ..OneShotCommand::new(delivery.address.clone(), SEND_TIMEOUT)
            };
            // Its exit status alone says whether it took the notification.
            return match command.run_bytes(&body) {
                Ok(_) => (Attempt::Delivered, String::new()),
                Err(error) => (Attempt::Refused, error),
            };
        }
        let secret = match delivery.secret.as_deref().map(|secret| self.secret(secret)) {
            Some(Err(error)) => return (Attempt::Transient, error),
            Some(Ok(secret)) => Some(secret),
            None => None,
        };
        if delivery.channel == "mail" {
            return crate::notify_mail::send(delivery, event, &id, &body, link.as_deref(), secret);
        }
        let timestamp = u64::try_from(unix_now()).unwrap_or(0);
        let mut request = self
            .http
            .post(&delivery.address)
            .header("Content-Type", "application/json")
            .header("User-Agent", concat!("kanban/", env!("CARGO_PKG_VERSION")))
            .header("Idempotency-Key", &id)
            .header("X-Kanban-Notification", &id)
            .header("X-Kanban-Timestamp", &timestamp.to_string());
        if let Some(secret) = &secret {
            request = request.header("X-Kanban-Signature", &signature(secret, timestamp, &body));
        }
        match request.send(body) {
            Ok(response) => {
                let status = response.status().as_u16();
                let attempt = notify::attempt_of_status(status);
                (attempt, format!("HTTP {status}"))
            }
            Err(error) => (Attempt::Transient, format!("POST failed: {error}")),
        }
    }

    /// A signing secret, from the dispatcher's environment or a file.
    fn secret(&self, reference: &str) -> Result<String, String> {
        if let Some(name) = reference.strip_prefix("env:") {
            return self
                .env
                .get_trimmed(name)
                .map(str::to_owned)
                .ok_or_else(|| {
                    format!("the signing secret's variable {name} is not set for the dispatcher")
                });
        }
        if let Some(path) = reference.strip_prefix("file:") {
            return read_secret_file(Path::new(path)).map_err(|error| error.to_string());
        }
        Err(format!("{reference:?} names no secret this build reads"))
    }
}

/// Seconds since the epoch, as the board's clock reads them.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
        })
}

/// `t=TIMESTAMP,v1=HEX`: HMAC-SHA256 of `TIMESTAMP.BODY` with the secret,
/// as Stripe signs its webhooks.
pub(crate) fn signature(secret: &str, timestamp: u64, body: &str) -> String {
    use hmac::{KeyInit as _, Mac as _};
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(format!("{timestamp}.").as_bytes());
    mac.update(body.as_bytes());
    let digest: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("t={timestamp},v1={digest}")
}

/// The deliverer a dispatcher runs beside its ticks, on a thread of its
/// own with its own connection to the board.
pub(crate) struct Background {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Background {
    pub(crate) fn start(db: &Path, folder: &Path, env: &Environment) -> Self {
        let (db, folder) = (db.to_owned(), folder.to_owned());
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let env = env.clone();
        let handle = std::thread::Builder::new()
            .name("notify".to_owned())
            .spawn(move || deliver_until(&db, folder, &env, &stopping))
            .map_err(|error| errln!("warning: notifications are not delivered: {error}"))
            .ok();
        Self { stop, handle }
    }

    /// Stops it after one more pass.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

fn deliver_until(db: &Path, folder: PathBuf, env: &Environment, stop: &AtomicBool) {
    let opened = block_on(open_db(
        db,
        Arc::new(SystemClock),
        env,
        Schema::AsItIs,
        || Ok(folder),
    ));
    let board = match opened {
        Ok(board) => board,
        Err(error) => {
            errln!("warning: notifications are not delivered: {error:#}");
            return;
        }
    };
    let deliverer = Deliverer::new(env, "dispatch");
    let mut said = false;
    let mut last_pass_until = None;
    loop {
        let last = stop.load(Ordering::SeqCst);
        // The pass after a stop delivers what the last ticks caused, for
        // a few seconds at most: stopping never waits on a slow receiver.
        if last {
            last_pass_until = Some(std::time::Instant::now() + LAST_PASS);
        }
        let go_on = || last_pass_until.is_none_or(|until| std::time::Instant::now() < until);
        match deliverer.deliver_due(&board, &go_on) {
            Ok(_) => said = false,
            Err(error) if !said => {
                errln!("warning: delivering notifications failed, trying again: {error:#}");
                said = true;
            }
            Err(_) => {}
        }
        if last {
            return;
        }
        std::thread::sleep(POLL);
    }
}
