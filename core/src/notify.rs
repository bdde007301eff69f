//! Notifications: which board events a subscription wants, what a
//! notification says, and when a failed delivery is tried again or given
//! up. A notification is an outbox row a board writes in the transaction
//! of the event that causes it; delivering it (a webhook, a command) is
//! the host's.

use serde_json::{Value, json};

/// The kinds of event a subscription chooses from.
pub const NOTIFY_KINDS: [&str; 6] = [
    "needs_input",
    "blocked",
    "done",
    "failed",
    "wall",
    "overrun",
];

/// What each kind means, for `--help` and the docs.
pub const NOTIFY_KIND_MEANINGS: [(&str, &str); 6] = [
    (
        "needs_input",
        "a card blocked for a person's answer (block kind needs_input)",
    ),
    (
        "blocked",
        "a card blocked, whatever its kind, or sent to triage by a block loop",
    ),
    ("done", "a card completed"),
    (
        "failed",
        "a card blocked because its runs failed past its limit",
    ),
    ("wall", "a provider wall armed or lifted on a card"),
    ("overrun", "a run stopped past its card's max runtime"),
];

/// The prefix of the variables that hold notification secrets: a
/// dispatcher hands no variable of that name to its workers, agents or
/// commands.
pub const SECRET_ENV_PREFIX: &str = "KANBAN_SECRET_";

/// Delivery attempts a receiver may refuse for good (a 4xx) before the
/// notification is dead.
pub const PERMANENT_FAILURE_TRIES: u32 = 3;
/// How long a notification is tried before it is dead.
pub const MAX_DELIVERY_SECONDS: i64 = 24 * 3600;
/// The first wait after a failed delivery; it doubles per attempt.
pub const RETRY_BASE_SECONDS: i64 = 2;
/// The longest wait between attempts.
pub const RETRY_CAP_SECONDS: i64 = 300;

/// Who a subscription listens to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotifyScope {
    Card(String),
    Assignee(String),
    Tenant(String),
    Board,
}

impl NotifyScope {
    /// Its stored form: `(scope, target)`.
    pub fn columns(&self) -> (&'static str, Option<&str>) {
        match self {
            Self::Card(id) => ("card", Some(id)),
            Self::Assignee(name) => ("assignee", Some(name)),
            Self::Tenant(name) => ("tenant", Some(name)),
            Self::Board => ("board", None),
        }
    }

    /// The scope of stored columns; `None` for a form this build does not know.
    pub fn from_columns(scope: &str, target: Option<&str>) -> Option<Self> {
        match (scope, target) {
            ("card", Some(id)) => Some(Self::Card(id.to_owned())),
            ("assignee", Some(name)) => Some(Self::Assignee(name.to_owned())),
            ("tenant", Some(name)) => Some(Self::Tenant(name.to_owned())),
            ("board", _) => Some(Self::Board),
            _ => None,
        }
    }
}

/// Reads `--events`: kinds separated by commas, or `all`. Returns them in
/// [`NOTIFY_KINDS`] order, each once.
pub fn parse_kinds(list: &str) -> Result<Vec<&'static str>, String> {
    let mut chosen = Vec::new();
    for name in list
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        if name == "all" {
            return Ok(NOTIFY_KINDS.to_vec());
        }
        let Some(kind) = NOTIFY_KINDS.iter().find(|kind| **kind == name) else {
            return Err(format!(
                "{name:?} is not a kind of notification: use {} or all",
                NOTIFY_KINDS.join(", ")
            ));
        };
        if !chosen.contains(kind) {
            chosen.push(*kind);
        }
    }
    if chosen.is_empty() {
        return Err(format!(
            "name at least one kind of notification: {} or all",
            NOTIFY_KINDS.join(", ")
        ));
    }
    chosen.sort_by_key(|kind| NOTIFY_KINDS.iter().position(|known| known == kind));
    Ok(chosen)
}

/// The stored list: `,a,b,`, so that one kind is matched with `LIKE '%,a,%'`.
pub fn stored_kinds(kinds: &[&str]) -> String {
    format!(",{},", kinds.join(","))
}

/// The kinds a stored list names.
pub fn kinds_of_stored(stored: &str) -> Vec<String> {
    stored
        .split(',')
        .filter(|kind| !kind.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The kinds of notification an event of `kind` with `payload` is: none
/// for most events (claims, heartbeats…), so a board writes no outbox row
/// and reads no subscription for them.
pub fn notify_kinds(kind: &str, payload: &Value) -> &'static [&'static str] {
    match kind {
        "blocked" if payload["kind"] == "needs_input" => &["needs_input", "blocked"],
        "blocked" | "block_loop_detected" => &["blocked"],
        "completed" => &["done"],
        "gave_up" => &["failed"],
        "wall_armed" | "wall_lifted" => &["wall"],
        "timed_out" => &["overrun"],
        _ => &[],
    }
}

/// The card as a notification shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NotifiedCard {
    pub id: String,
    pub title: String,
    pub status: String,
    pub assignee: Option<String>,
    pub tenant: Option<String>,
}

/// The stable id of the notification of outbox row `outbox_id` of the
/// subscription with `token`: the same on every attempt, from any
/// dispatcher, so a receiver dedupes by it.
pub fn notification_id(token: &str, outbox_id: i64) -> String {
    format!("kn_{token}_{outbox_id}")
}

/// A subscription's address as it is shown: a webhook's scheme and host
/// (its path and query may hold a token, as a chat's hook does); a command
/// or a mail address whole.
pub fn shown_address(channel: &str, address: &str) -> String {
    if channel != "webhook" {
        return address.to_owned();
    }
    let Some((scheme, rest)) = address.split_once("://") else {
        return "…".to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = rest[..end].rsplit('@').next().unwrap_or("");
    if end < rest.len() {
        format!("{scheme}://{host}/…")
    } else {
        format!("{scheme}://{host}")
    }
}

/// A notification's JSON body (the schema in `docs/notifications.md`).
pub fn payload(
    id: &str,
    event: &crate::EventRecord,
    card: &NotifiedCard,
    link: Option<&str>,
) -> Value {
    json!({
        "id": id,
        "type": notify_kinds(&event.kind, &event.payload).first().copied().unwrap_or("event"),
        "event": {
            "id": event.id,
            "kind": event.kind,
            "run_id": event.run_id,
            "payload": event.payload,
            "created_at": event.created_at,
        },
        "card": card,
        "link": link,
    })
}

/// The one-line text of a notification, for chat webhooks (Slack,
/// Mattermost, Discord through its Slack path, ntfy).
pub fn summary_line(event: &crate::EventRecord, card: &NotifiedCard, link: Option<&str>) -> String {
    let what = match (event.kind.as_str(), event.payload["kind"].as_str()) {
        ("blocked", Some("needs_input")) => "needs your input".to_owned(),
        ("blocked", Some(kind)) => format!("is blocked ({kind})"),
        ("blocked", None) => "is blocked".to_owned(),
        ("block_loop_detected", _) => {
            "went to triage: blocked again for the same reason".to_owned()
        }
        ("completed", _) => "is done".to_owned(),
        ("gave_up", _) => "failed past its limit and is blocked".to_owned(),
        ("wall_armed", _) => "met a provider wall".to_owned(),
        ("wall_lifted", _) => "is past its provider wall".to_owned(),
        ("timed_out", _) => "ran past its max runtime".to_owned(),
        (other, _) => other.to_owned(),
    };
    let reason = event.payload["reason"]
        .as_str()
        .map(|reason| format!(": {}", reason.chars().take(300).collect::<String>()))
        .unwrap_or_default();
    let link = link.map(|link| format!(" {link}")).unwrap_or_default();
    format!("{} \"{}\" {what}{reason}{link}", card.id, card.title)
}

/// A chat webhook's body: `{"text": …}`.
pub fn slack_body(event: &crate::EventRecord, card: &NotifiedCard, link: Option<&str>) -> Value {
    json!({"text": summary_line(event, card, link)})
}

/// How one delivery attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    Delivered,
    /// It may work later: the receiver unreachable, a 5xx, a 408 or a 429.
    Transient,
    /// The receiver refused it (any other 4xx), or the command failed.
    Refused,
}

/// What an HTTP status says of an attempt.
pub fn attempt_of_status(status: u16) -> Attempt {
    match status {
        200..=299 => Attempt::Delivered,
        408 | 425 | 429 | 500..=599 => Attempt::Transient,
        _ => Attempt::Refused,
    }
}

/// What becomes of a notification after a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Tried again at this time.
    RetryAt(i64),
    /// Given up: shown in `notify list` and `diagnostics`.
    Dead,
}

/// After its `attempts`-th failed attempt (1-based) at `now`, for a
/// notification first tried at `first_try`: refused
/// [`PERMANENT_FAILURE_TRIES`] times, or failing past
/// [`MAX_DELIVERY_SECONDS`], it is dead; else it waits `base` seconds
/// doubling per attempt (capped), plus up to a quarter more of jitter
/// from `jitter_seed`.
pub fn after_failure(
    attempt: Attempt,
    attempts: u32,
    first_try: i64,
    now: i64,
    base: i64,
    jitter_seed: u64,
) -> AfterFailure {
    if attempt == Attempt::Refused && attempts >= PERMANENT_FAILURE_TRIES {
        return AfterFailure::Dead;
    }
    if now.saturating_sub(first_try) >= MAX_DELIVERY_SECONDS {
        return AfterFailure::Dead;
    }
    let doubled = base
        .max(0)
        .saturating_mul(1_i64 << attempts.saturating_sub(1).min(20));
    let wait = doubled.min(RETRY_CAP_SECONDS.max(base));
    let jitter = i64::try_from(jitter_seed % 1000)
        .unwrap_or(0)
        .saturating_mul(wait)
        / 4000;
    AfterFailure::RetryAt(now.saturating_add(wait.saturating_add(jitter)))
}

/// A subscription to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewSubscription {
    pub scope: NotifyScope,
    pub kinds: Vec<String>,
    /// `webhook` or `command`.
    pub channel: String,
    /// The webhook's URL, or the command.
    pub address: String,
    /// `json` (the documented body) or `slack` (`{"text"}`).
    pub format: String,
    /// Where the signing secret (a webhook) or the SMTP password (mail)
    /// is (`env:NAME` or `file:/abs/path`): never the secret itself.
    pub secret: Option<String>,
    /// How mail is sent, for the `mail` channel.
    pub smtp: Option<SmtpSettings>,
    pub created_by: Option<String>,
}

/// The SMTP server a `mail` subscription sends through.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SmtpSettings {
    /// `smtp://[USER@]HOST[:PORT]` (STARTTLS, required; port 587) or
    /// `smtps://[USER@]HOST[:PORT]` (TLS from the start; port 465).
    pub server: String,
    /// The sender's address.
    pub from: String,
    /// A PEM file of the CA that signed the server's certificate, beside
    /// the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
}

/// An SMTP server's parts: whether TLS wraps the connection from the
/// start, the user, the host and the port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SmtpServer {
    pub implicit_tls: bool,
    pub user: Option<String>,
    pub host: String,
    pub port: u16,
}

/// Reads `smtp://[USER@]HOST[:PORT]` or `smtps://…`; a password in it is
/// refused (it would be stored in the board).
pub fn parse_smtp_server(server: &str) -> Result<SmtpServer, String> {
    let (implicit_tls, rest) = if let Some(rest) = server.strip_prefix("smtps://") {
        (true, rest)
    } else if let Some(rest) = server.strip_prefix("smtp://") {
        (false, rest)
    } else {
        return Err(format!(
            "the SMTP server {server:?} is not smtp://[USER@]HOST[:PORT] (STARTTLS) or smtps://… (TLS)"
        ));
    };
    let rest = rest.trim_end_matches('/');
    let (user, host_port) = match rest.rsplit_once('@') {
        Some((user, _)) if user.contains(':') => {
            return Err(
                "the SMTP server's URL holds a password: name it with --smtp-password-env or --smtp-password-file"
                    .to_owned(),
            );
        }
        Some((user, host_port)) => (Some(user.to_owned()), host_port),
        None => (None, rest),
    };
    let (host, port) = match host_port.rsplit_once(':') {
        Some((host, port)) => (
            host,
            port.parse::<u16>()
                .map_err(|_| format!("the SMTP port {port:?} is not a port number"))?,
        ),
        None => (host_port, if implicit_tls { 465 } else { 587 }),
    };
    let plain = |text: &str| {
        !text.is_empty() && !text.chars().any(|c| c.is_control() || c == ' ' || c == '/')
    };
    if !plain(host) || user.as_deref().is_some_and(|user| !plain(user)) {
        return Err(format!("the SMTP server {server:?} names no host"));
    }
    Ok(SmtpServer {
        implicit_tls,
        user,
        host: host.to_owned(),
        port,
    })
}

/// A mail address as a subscription takes it: one `@`, something on each
/// side, one line, no spaces.
pub fn is_mail_address(address: &str) -> bool {
    let parts: Vec<&str> = address.split('@').collect();
    address.len() <= 320
        && parts.len() == 2
        && parts.iter().all(|part| !part.is_empty())
        && !address
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || matches!(c, '<' | '>' | ',' | ';'))
}

/// A mail's subject: the card and what happened to it, on one line.
pub fn mail_subject(event: &crate::EventRecord, card: &NotifiedCard) -> String {
    let line = summary_line(event, card, None);
    let line: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let short: String = line.chars().take(150).collect();
    format!("[kanban] {short}")
}

/// A subscription as stored, with how its notifications stand.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SubscriptionView {
    pub id: i64,
    pub scope: String,
    pub target: Option<String>,
    pub kinds: Vec<String>,
    pub channel: String,
    pub address: String,
    pub format: String,
    pub secret: Option<String>,
    pub smtp: Option<SmtpSettings>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub pending: i64,
    pub delivered: i64,
    pub dead: i64,
    /// Why the newest failed attempt failed.
    pub last_error: Option<String>,
}

/// One notification a deliverer holds, leased to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub outbox_id: i64,
    /// The subscription's random token: with the outbox row, the
    /// notification's id, the same whichever dispatcher sends it.
    pub token: String,
    pub attempts: u32,
    pub first_tried_at: Option<i64>,
    pub subscription_id: i64,
    pub channel: String,
    pub address: String,
    pub format: String,
    pub secret: Option<String>,
    pub smtp: Option<SmtpSettings>,
    /// `None` when the event is gone (`gc`): the notification is dead.
    pub event: Option<crate::EventRecord>,
    pub card: NotifiedCard,
}

/// How an attempt at a delivery is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeliveryResult {
    Delivered,
    Failed {
        error: String,
        /// What [`after_failure`] said.
        next: AfterFailure,
    },
}

/// A secret's reference: `env:KANBAN_SECRET_…` or `file:/absolute/path`.
fn check_secret_reference(secret: &str) -> Result<(), String> {
    let valid = secret.strip_prefix("env:").is_some_and(|name| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    }) || secret
        .strip_prefix("file:")
        .is_some_and(|path| path.starts_with('/') && !path.contains(['\0', '\n']));
    if !valid {
        return Err(
            "a secret is named, never given: env:VARIABLE or file:/absolute/path".to_owned(),
        );
    }
    if let Some(name) = secret.strip_prefix("env:")
        && !name.starts_with(SECRET_ENV_PREFIX)
    {
        return Err(format!(
            "the secret's variable {name} does not start with {SECRET_ENV_PREFIX}: only those are kept from workers, agents and commands"
        ));
    }
    Ok(())
}

/// Checks a subscription before it is stored: a known channel and format,
/// an address of the channel, a secret reference, not a secret.
pub fn check_subscription(new: &NewSubscription) -> Result<(), String> {
    if new.kinds.is_empty()
        || new
            .kinds
            .iter()
            .any(|kind| !NOTIFY_KINDS.contains(&kind.as_str()))
    {
        return Err(format!(
            "a subscription names kinds of {}",
            NOTIFY_KINDS.join(", ")
        ));
    }
    match new.channel.as_str() {
        "webhook" => {
            if !(new.address.starts_with("http://") || new.address.starts_with("https://")) {
                return Err(format!(
                    "the webhook {:?} is not an http:// or https:// URL",
                    new.address
                ));
            }
        }
        "command" => {
            if new.address.trim().is_empty() {
                return Err("the command to run is empty".to_owned());
            }
        }
        "mail" => {
            if !is_mail_address(&new.address) {
                return Err(format!("{:?} is not a mail address", new.address));
            }
            let Some(smtp) = &new.smtp else {
                return Err("mail needs its SMTP server: --smtp smtp://USER@HOST:PORT".to_owned());
            };
            parse_smtp_server(&smtp.server)?;
            if !is_mail_address(&smtp.from) {
                return Err(format!("the sender {:?} is not a mail address", smtp.from));
            }
            if smtp.ca.as_deref().is_some_and(|ca| !ca.starts_with('/')) {
                return Err("the SMTP server's CA file is an absolute path".to_owned());
            }
            if parse_smtp_server(&smtp.server)?.user.is_some() != new.secret.is_some() {
                return Err(
                    "name both the SMTP user (smtp://USER@HOST) and its password (--smtp-password-env or --smtp-password-file), or neither"
                        .to_owned(),
                );
            }
        }
        other => {
            return Err(format!(
                "{other:?} is not a channel: webhook, command or mail"
            ));
        }
    }
    if new.channel != "mail" && new.smtp.is_some() {
        return Err("SMTP settings are for the mail channel".to_owned());
    }
    if new.address.len() > 4096 || new.address.contains(['\0', '\n', '\r']) {
        return Err("the address is one line of at most 4096 bytes".to_owned());
    }
    if !matches!(new.format.as_str(), "json" | "slack") {
        return Err(format!("{:?} is not a format: json or slack", new.format));
    }
    if let Some(secret) = &new.secret {
        check_secret_reference(secret)?;
    }
    if let NotifyScope::Card(target) | NotifyScope::Assignee(target) | NotifyScope::Tenant(target) =
        &new.scope
        && target.trim().is_empty()
    {
        return Err("a subscription's card, assignee or tenant is not blank".to_owned());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, payload: Value) -> crate::EventRecord {
        crate::EventRecord {
            id: 7,
            task_id: "t_1".into(),
            run_id: Some(3),
            kind: kind.into(),
            payload,
            created_at: 100,
        }
    }

    fn card() -> NotifiedCard {
        NotifiedCard {
            id: "t_1".into(),
            title: "ship it".into(),
            status: "blocked".into(),
            assignee: Some("coder".into()),
            tenant: None,
        }
    }

    #[test]
    fn kinds_are_read_once_in_order_or_refused() {
        assert_eq!(
            parse_kinds("done, needs_input,done"),
            Ok(vec!["needs_input", "done"])
        );
        assert_eq!(parse_kinds("all"), Ok(NOTIFY_KINDS.to_vec()));
        assert_eq!(parse_kinds("wall,all"), Ok(NOTIFY_KINDS.to_vec()));
        assert!(parse_kinds("").unwrap_err().contains("at least one"));
        assert!(parse_kinds(" , ").unwrap_err().contains("at least one"));
        assert!(parse_kinds("done,later").unwrap_err().contains("\"later\""));
        assert_eq!(stored_kinds(&["needs_input", "done"]), ",needs_input,done,");
        assert_eq!(
            kinds_of_stored(",needs_input,done,"),
            vec!["needs_input", "done"]
        );
        assert_eq!(kinds_of_stored(""), Vec::<String>::new());
        for (kind, meaning) in NOTIFY_KIND_MEANINGS {
            assert!(NOTIFY_KINDS.contains(&kind) && !meaning.is_empty());
        }
    }

    #[test]
    fn events_map_to_their_kinds() {
        assert_eq!(
            notify_kinds("blocked", &json!({"kind": "needs_input"})),
            &["needs_input", "blocked"]
        );
        assert_eq!(
            notify_kinds("blocked", &json!({"kind": "capability"})),
            &["blocked"]
        );
        assert_eq!(notify_kinds("blocked", &Value::Null), &["blocked"]);
        assert_eq!(
            notify_kinds("block_loop_detected", &Value::Null),
            &["blocked"]
        );
        assert_eq!(notify_kinds("completed", &Value::Null), &["done"]);
        assert_eq!(notify_kinds("gave_up", &Value::Null), &["failed"]);
        assert_eq!(notify_kinds("wall_armed", &Value::Null), &["wall"]);
        assert_eq!(notify_kinds("wall_lifted", &Value::Null), &["wall"]);
        assert_eq!(notify_kinds("timed_out", &Value::Null), &["overrun"]);
        for quiet in ["claimed", "heartbeat", "created", "spawned", "needs_input"] {
            assert!(
                notify_kinds(quiet, &json!({"kind": "needs_input"})).is_empty(),
                "{quiet}"
            );
        }
    }

    #[test]
    fn scopes_round_trip_through_their_columns() {
        for scope in [
            NotifyScope::Card("t_1".into()),
            NotifyScope::Assignee("coder".into()),
            NotifyScope::Tenant("acme".into()),
            NotifyScope::Board,
        ] {
            let (name, target) = scope.columns();
            assert_eq!(NotifyScope::from_columns(name, target), Some(scope.clone()));
        }
        assert_eq!(NotifyScope::from_columns("card", None), None);
        assert_eq!(NotifyScope::from_columns("team", Some("x")), None);
    }

    #[test]
    fn a_notification_says_what_happened_to_which_card() {
        let blocked = event(
            "blocked",
            json!({"kind": "needs_input", "reason": "which region?"}),
        );
        let body = payload("kn_b_9", &blocked, &card(), Some("http://h/cards/t_1"));
        assert_eq!(body["id"], "kn_b_9");
        assert_eq!(body["type"], "needs_input");
        assert_eq!(body["event"]["kind"], "blocked");
        assert_eq!(body["event"]["id"], 7);
        assert_eq!(body["event"]["run_id"], 3);
        assert_eq!(body["event"]["created_at"], 100);
        assert_eq!(body["event"]["payload"]["reason"], "which region?");
        assert_eq!(body["card"]["title"], "ship it");
        assert_eq!(body["card"]["assignee"], "coder");
        assert_eq!(body["link"], "http://h/cards/t_1");
        assert_eq!(
            payload("x", &event("claimed", Value::Null), &card(), None)["type"],
            "event"
        );
        assert_eq!(
            slack_body(&blocked, &card(), Some("http://h/cards/t_1"))["text"],
            "t_1 \"ship it\" needs your input: which region? http://h/cards/t_1"
        );
        for (kind, payload, says) in [
            (
                "blocked",
                json!({"kind": "capability"}),
                "is blocked (capability)",
            ),
            ("blocked", Value::Null, "is blocked"),
            ("block_loop_detected", Value::Null, "went to triage"),
            ("completed", Value::Null, "is done"),
            ("gave_up", Value::Null, "failed past its limit"),
            ("wall_armed", Value::Null, "met a provider wall"),
            ("wall_lifted", Value::Null, "past its provider wall"),
            ("timed_out", Value::Null, "past its max runtime"),
            ("odd", Value::Null, "\"ship it\" odd"),
        ] {
            let line = summary_line(&event(kind, payload), &card(), None);
            assert!(line.contains(says), "{kind}: {line}");
        }
        assert_eq!(notification_id("b1", 42), "kn_b1_42");
        assert_eq!(
            shown_address("webhook", "https://hooks.slack.com/services/T/B/x"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(
            shown_address("webhook", "https://user:pw@h.example:8443?k=1"),
            "https://h.example:8443/…"
        );
        assert_eq!(shown_address("webhook", "http://h"), "http://h");
        assert_eq!(shown_address("webhook", "nonsense"), "…");
        assert_eq!(
            shown_address("command", "notify-send a/b"),
            "notify-send a/b"
        );
        assert_eq!(shown_address("mail", "ops@example.com"), "ops@example.com");
    }

    #[test]
    fn statuses_say_whether_to_try_again() {
        assert_eq!(attempt_of_status(200), Attempt::Delivered);
        assert_eq!(attempt_of_status(204), Attempt::Delivered);
        assert_eq!(attempt_of_status(299), Attempt::Delivered);
        for transient in [408, 425, 429, 500, 503, 599] {
            assert_eq!(
                attempt_of_status(transient),
                Attempt::Transient,
                "{transient}"
            );
        }
        for refused in [199, 300, 301, 400, 401, 404, 410, 600] {
            assert_eq!(attempt_of_status(refused), Attempt::Refused, "{refused}");
        }
    }

    fn subscription(channel: &str, address: &str) -> NewSubscription {
        NewSubscription {
            scope: NotifyScope::Board,
            kinds: vec!["done".into()],
            channel: channel.into(),
            address: address.into(),
            format: "json".into(),
            secret: (channel == "mail").then(|| "env:KANBAN_SECRET_SMTP".into()),
            smtp: (channel == "mail").then(|| SmtpSettings {
                server: "smtp://ann@mail.example".into(),
                from: "kanban@example.com".into(),
                ca: None,
            }),
            created_by: None,
        }
    }

    #[test]
    #[expect(clippy::too_many_lines, reason = "a table of cases reads best whole")]
    fn a_subscription_is_checked_before_it_is_stored() {
        let ok = |new: &NewSubscription| check_subscription(new).map_err(|e| e.to_string());
        assert_eq!(ok(&subscription("webhook", "https://h/x")), Ok(()));
        assert_eq!(ok(&subscription("webhook", "http://h/x")), Ok(()));
        assert_eq!(ok(&subscription("command", "notify-send x")), Ok(()));
        assert_eq!(ok(&subscription("mail", "ops@example.com")), Ok(()));
        let refused = |new: NewSubscription, says: &str| {
            let error = check_subscription(&new).expect_err(says);
            assert!(error.contains(says), "{says}: {error}");
        };
        refused(subscription("webhook", "ftp://h/x"), "not an http");
        refused(subscription("command", "  "), "command to run is empty");
        refused(subscription("pager", "x"), "not a channel");
        refused(subscription("mail", "ops"), "not a mail address");
        refused(
            subscription("webhook", &format!("https://h/{}", "x".repeat(4100))),
            "4096",
        );
        refused(subscription("webhook", "https://h/x\ny"), "one line");
        refused(subscription("command", "a\rb"), "one line");
        refused(subscription("command", "a\0b"), "one line");
        assert_eq!(
            ok(&subscription(
                "webhook",
                // 4096 bytes: the most an address may have.
                &format!("https://h/{}", "x".repeat(4086))
            )),
            Ok(())
        );
        refused(
            NewSubscription {
                kinds: vec![],
                ..subscription("command", "x")
            },
            "kinds",
        );
        refused(
            NewSubscription {
                kinds: vec!["later".into()],
                ..subscription("command", "x")
            },
            "kinds",
        );
        refused(
            NewSubscription {
                format: "xml".into(),
                ..subscription("command", "x")
            },
            "not a format",
        );
        assert_eq!(
            ok(&NewSubscription {
                format: "slack".into(),
                ..subscription("webhook", "https://h")
            }),
            Ok(())
        );
        refused(
            NewSubscription {
                secret: Some("env:HOOK_SECRET".into()),
                ..subscription("webhook", "https://h")
            },
            "does not start with KANBAN_SECRET_",
        );
        for secret in [
            "env:KANBAN_SECRET_HOOK",
            "env:KANBAN_SECRET_a_1",
            "file:/etc/hook",
        ] {
            let new = NewSubscription {
                secret: Some(secret.into()),
                ..subscription("webhook", "https://h")
            };
            assert_eq!(ok(&new), Ok(()), "{secret}");
        }
        for secret in [
            "s3cret",
            "env:",
            "env:A-B",
            "file:relative",
            "file:/a\nb",
            "file:/a\0b",
        ] {
            refused(
                NewSubscription {
                    secret: Some(secret.into()),
                    ..subscription("webhook", "https://h")
                },
                "named, never given",
            );
        }
        for scope in [
            NotifyScope::Card(" ".into()),
            NotifyScope::Assignee(String::new()),
            NotifyScope::Tenant("\t".into()),
        ] {
            refused(
                NewSubscription {
                    scope,
                    ..subscription("command", "x")
                },
                "not blank",
            );
        }
        assert_eq!(
            ok(&NewSubscription {
                scope: NotifyScope::Card("t_1".into()),
                ..subscription("command", "x")
            }),
            Ok(())
        );
        refused(
            NewSubscription {
                smtp: None,
                ..subscription("mail", "a@b")
            },
            "SMTP server",
        );
        let mut stray = subscription("webhook", "https://h");
        stray.smtp = subscription("mail", "a@b").smtp;
        refused(stray, "for the mail channel");
        let with = |server: &str, from: &str, ca: Option<&str>| NewSubscription {
            smtp: Some(SmtpSettings {
                server: server.into(),
                from: from.into(),
                ca: ca.map(Into::into),
            }),
            ..subscription("mail", "a@b")
        };
        refused(with("imap://h", "k@e", None), "is not smtp://");
        refused(with("smtp://h", "kanban", None), "sender");
        refused(with("smtp://h", "k@e", Some("ca.pem")), "absolute");
        assert_eq!(ok(&with("smtps://u@h", "k@e", Some("/etc/ca.pem"))), Ok(()));
        // A user and a password, or neither.
        refused(with("smtp://h", "k@e", None), "or neither");
        refused(
            NewSubscription {
                secret: None,
                ..subscription("mail", "a@b")
            },
            "or neither",
        );
        assert_eq!(
            ok(&NewSubscription {
                secret: None,
                ..with("smtp://h", "k@e", None)
            }),
            Ok(())
        );
    }

    #[test]
    #[expect(clippy::too_many_lines, reason = "a table of cases reads best whole")]
    fn smtp_servers_and_mail_addresses_are_read() {
        let server = |implicit_tls, user: Option<&str>, host: &str, port| SmtpServer {
            implicit_tls,
            user: user.map(Into::into),
            host: host.into(),
            port,
        };
        assert_eq!(
            parse_smtp_server("smtp://mail.example"),
            Ok(server(false, None, "mail.example", 587))
        );
        assert_eq!(
            parse_smtp_server("smtps://mail.example/"),
            Ok(server(true, None, "mail.example", 465))
        );
        assert_eq!(
            parse_smtp_server("smtp://ann@example.com@127.0.0.1:2525"),
            Ok(server(false, Some("ann@example.com"), "127.0.0.1", 2525))
        );
        assert!(
            parse_smtp_server("smtp://ann:pw@h")
                .unwrap_err()
                .contains("password")
        );
        assert!(
            parse_smtp_server("smtp://h:port")
                .unwrap_err()
                .contains("not a port")
        );
        assert!(
            parse_smtp_server("smtp://h:70000")
                .unwrap_err()
                .contains("not a port")
        );
        assert!(
            parse_smtp_server("smtp://")
                .unwrap_err()
                .contains("no host")
        );
        assert!(
            parse_smtp_server("smtp://a b")
                .unwrap_err()
                .contains("no host")
        );
        assert!(
            parse_smtp_server("smtp://@h")
                .unwrap_err()
                .contains("no host")
        );
        assert!(
            parse_smtp_server("smtp://u\n@h")
                .unwrap_err()
                .contains("no host")
        );
        assert!(
            parse_smtp_server("http://h")
                .unwrap_err()
                .contains("is not smtp://")
        );
        for good in ["ops@example.com", "a@b"] {
            assert!(is_mail_address(good), "{good}");
        }
        let long = format!("{}@b", "a".repeat(320));
        for bad in [
            "ops",
            "@b",
            "a@",
            "a@b@c",
            "a b@c",
            "a@b\n",
            "<a@b>",
            "a@b,c@d",
            "a@b;c",
            long.as_str(),
        ] {
            assert!(!is_mail_address(bad), "{bad}");
        }
        assert!(is_mail_address(&format!("{}@b", "a".repeat(318))));
        let subject = mail_subject(
            &event("blocked", json!({"kind": "needs_input", "reason": "a\nb"})),
            &card(),
        );
        assert_eq!(subject, "[kanban] t_1 \"ship it\" needs your input: a b");
        let long = mail_subject(
            &event("blocked", json!({"reason": "x".repeat(400)})),
            &card(),
        );
        assert_eq!(long.chars().count(), "[kanban] ".len() + 150);
    }

    #[test]
    fn a_failed_delivery_backs_off_then_dies() {
        use AfterFailure::{Dead, RetryAt};
        assert_eq!(
            after_failure(Attempt::Transient, 1, 0, 10, 2, 0),
            RetryAt(12)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 2, 0, 10, 2, 0),
            RetryAt(14)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 4, 0, 10, 2, 0),
            RetryAt(26)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 30, 0, 10, 2, 0),
            RetryAt(310)
        );
        // Up to a quarter more of jitter.
        assert_eq!(
            after_failure(Attempt::Transient, 4, 0, 10, 2, 999),
            RetryAt(29)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 4, 0, 10, 2, 500),
            RetryAt(28)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 1, 0, 10, 0, 999),
            RetryAt(10)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 1, 0, 10, 600, 0),
            RetryAt(610)
        );
        assert_eq!(
            after_failure(Attempt::Transient, 1, 0, 10, i64::MAX, 999),
            RetryAt(i64::MAX)
        );
        // Refused for good: dead at the third.
        assert_eq!(after_failure(Attempt::Refused, 2, 0, 10, 2, 0), RetryAt(14));
        assert_eq!(after_failure(Attempt::Refused, 3, 0, 10, 2, 0), Dead);
        assert_eq!(
            after_failure(Attempt::Transient, 3, 0, 10, 2, 0),
            RetryAt(18)
        );
        // Failing for a day: dead.
        assert_eq!(MAX_DELIVERY_SECONDS, 86_400);
        assert_eq!(
            after_failure(Attempt::Transient, 1, 0, MAX_DELIVERY_SECONDS, 2, 0),
            Dead
        );
        assert_eq!(
            after_failure(Attempt::Transient, 1, 0, MAX_DELIVERY_SECONDS - 1, 2, 0),
            RetryAt(MAX_DELIVERY_SECONDS + 1)
        );
    }
}
