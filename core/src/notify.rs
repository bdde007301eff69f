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

/// The stable id of the notification of outbox row `outbox_id` on the
/// board `board_id`: the same on every attempt, so a receiver dedupes by it.
pub fn notification_id(board_id: &str, outbox_id: i64) -> String {
    format!("kn_{board_id}_{outbox_id}")
}

/// A notification's JSON body (the schema in `docs/notifications.md`).
pub fn payload(
    id: &str,
    event: &crate::EventRecord,
    card: &NotifiedCard,
    board: Option<&str>,
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
        "board": board,
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
    let jitter = i64::try_from(jitter_seed % 1000).unwrap_or(0) * wait / 4000;
    AfterFailure::RetryAt(now.saturating_add(wait + jitter))
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
    /// Where the signing secret is (`env:NAME` or `file:/abs/path`): never
    /// the secret itself.
    pub secret: Option<String>,
    pub created_by: Option<String>,
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
    pub attempts: u32,
    pub first_tried_at: Option<i64>,
    pub subscription_id: i64,
    pub channel: String,
    pub address: String,
    pub format: String,
    pub secret: Option<String>,
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
        other => return Err(format!("{other:?} is not a channel: webhook or command")),
    }
    if new.address.len() > 4096 || new.address.contains(['\0', '\n', '\r']) {
        return Err("the address is one line of at most 4096 bytes".to_owned());
    }
    if !matches!(new.format.as_str(), "json" | "slack") {
        return Err(format!("{:?} is not a format: json or slack", new.format));
    }
    if let Some(secret) = &new.secret {
        let valid = secret.strip_prefix("env:").is_some_and(|name| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }) || secret
            .strip_prefix("file:")
            .is_some_and(|path| path.starts_with('/') && !path.contains(['\0', '\n']));
        if !valid {
            return Err(
                "a signing secret is named, never given: env:VARIABLE or file:/absolute/path"
                    .to_owned(),
            );
        }
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
        let body = payload(
            "kn_b_9",
            &blocked,
            &card(),
            Some("main"),
            Some("http://h/cards/t_1"),
        );
        assert_eq!(body["id"], "kn_b_9");
        assert_eq!(body["type"], "needs_input");
        assert_eq!(body["event"]["kind"], "blocked");
        assert_eq!(body["event"]["id"], 7);
        assert_eq!(body["event"]["run_id"], 3);
        assert_eq!(body["event"]["created_at"], 100);
        assert_eq!(body["event"]["payload"]["reason"], "which region?");
        assert_eq!(body["card"]["title"], "ship it");
        assert_eq!(body["card"]["assignee"], "coder");
        assert_eq!(body["board"], "main");
        assert_eq!(body["link"], "http://h/cards/t_1");
        assert_eq!(
            payload("x", &event("claimed", Value::Null), &card(), None, None)["type"],
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
        // Refused for good: dead at the third.
        assert_eq!(after_failure(Attempt::Refused, 2, 0, 10, 2, 0), RetryAt(14));
        assert_eq!(after_failure(Attempt::Refused, 3, 0, 10, 2, 0), Dead);
        assert_eq!(
            after_failure(Attempt::Transient, 3, 0, 10, 2, 0),
            RetryAt(18)
        );
        // Failing for a day: dead.
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
