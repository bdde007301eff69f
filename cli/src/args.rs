//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::duration::{parse_duration, parse_limit, parse_positive_seconds};

/// The command line as it is parsed and shown: each command's examples
/// moved to the end of its help, where `-h` shows them as `--help` does
/// (clap's short help shows only a command's first paragraph).
pub(crate) fn command() -> clap::Command {
    use clap::CommandFactory as _;
    Cli::command().mut_subcommands(examples_at_the_end)
}

fn examples_at_the_end(command: clap::Command) -> clap::Command {
    let command = command.mut_subcommands(examples_at_the_end);
    let Some(long) = command.get_long_about().map(ToString::to_string) else {
        return command;
    };
    let (examples, rest): (Vec<&str>, Vec<&str>) = long
        .split("\n\n")
        .partition(|paragraph| paragraph.starts_with("Example"));
    if examples.is_empty() {
        return command;
    }
    command
        .after_help(examples.join("\n\n"))
        .long_about(rest.join("\n\n"))
}

/// Run AI-agent workers off a kanban board, recovering failed turns in place.
///
/// The board is `--db PATH` (or `--db postgres://USER@HOST:PORT/DBNAME` for a
/// PostgreSQL board), else `KANBAN_DB`, else the board named by `--board` /
/// `KANBAN_BOARD`, else the current board (`kanban boards`), else `default`,
/// under `KANBAN_HOME` (default `$XDG_DATA_HOME/kanban`, else
/// `~/.local/share/kanban`), laid out as the seed system lays out its boards. The seed system's
/// names of these (`HERMES_KANBAN_DB` and so on) are read too, and win where
/// both are set (docs/agent-protocol.md).
#[derive(Debug, Parser)]
#[command(
    name = "kanban",
    version,
    propagate_version = true,
    max_term_width = 100,
    after_help = "Start with `kanban demo`. Exit codes: 0 success, 1 failure or refusal, 2 usage; a worker also \
                  exits 75 (transient provider wall), 78 (needs a human) or 130 (interrupted). See docs/cli.md."
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: GlobalArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The options every command takes, shown after the command's own.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct GlobalArgs {
    /// The board: a SQLite file, or postgres://USER@HOST:PORT/DBNAME.
    ///
    /// A PostgreSQL board's password comes from PGPASSWORD or ~/.pgpass,
    /// never the URL; add ?sslmode=require&sslrootcert=CA.pem for verified
    /// TLS (docs/cli.md).
    #[arg(long, global = true, value_name = "PATH|URL")]
    pub(crate) db: Option<PathBuf>,
    /// The board's name under the kanban home.
    #[arg(long, global = true, value_name = "SLUG")]
    pub(crate) board: Option<String>,
    /// The agents file (default: kanban.toml beside the board, when there is
    /// one): named agents that cards are routed to by assignee (docs/cli.md).
    #[arg(long, global = true, value_name = "FILE", env = "KANBAN_AGENTS")]
    pub(crate) agents: Option<PathBuf>,
    /// More log output on stderr (-v info, -vv debug).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// Errors only on stderr.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// Times in UTC instead of the local time zone (`--json` always gives
    /// epoch seconds).
    #[arg(long, global = true)]
    pub(crate) utc: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Create the board file (and its folder) if it does not exist.
    ///
    /// Example: kanban --db ./kanban.db init
    Init,
    /// Upgrade a board to this version's schema, keeping a backup beside it.
    ///
    /// A board made by the seed system (schema version 0) is read as it is by
    /// ls, show, events, watch and prove, but kanban writes to it only after
    /// this. The backup is BOARD.vN-TIME.backup, owner-only. Running it on a
    /// board that is up to date does nothing.
    ///
    /// Example: kanban --db ./kanban.db migrate
    Migrate,
    /// Add a card; prints its id. `create` is the seed system's name for it.
    ///
    /// Inside an agent (the claim carrier set), the card is the run's
    /// fan-out: it waits for the run's card (and any --parent), names that
    /// card's assignee as its maker, is recorded on the run's card, and is
    /// made only while the run holds its claim. Hand its id to
    /// `kanban complete --created-cards`.
    ///
    /// Example: kanban add "write the release notes" --priority 2 --body "cover 0.2"
    #[command(visible_alias = "create")]
    Add(AddArgs),
    /// List cards, oldest first, with whom each is for and what it waits for.
    ///
    /// Example: kanban ls --status ready --assignee coder
    #[command(visible_alias = "list")]
    Ls {
        /// Only cards with this status (triage, todo, scheduled, ready, running,
        /// blocked, review, done, archived).
        #[arg(long)]
        status: Option<String>,
        /// Only cards assigned to this agent (`-` for cards with no assignee).
        #[arg(long, value_name = "NAME")]
        assignee: Option<String>,
        /// Only the children of this card (the cards that wait for it).
        #[arg(long, value_name = "ID")]
        parent: Option<String>,
        /// Include archived (and cancelled) cards, hidden otherwise.
        #[arg(long)]
        archived: bool,
        /// Only cards whose last block was of this kind (dependency,
        /// needs_input, capability, transient).
        #[arg(long, value_name = "KIND", value_parser = block_kind)]
        block_kind: Option<kanban_core::BlockKind>,
        /// Only the cards of this tenant.
        #[arg(long, value_name = "NAME")]
        tenant: Option<String>,
        /// Only the cards assigned to $HERMES_PROFILE (the seed system's
        /// name for the agent you are).
        #[arg(long, conflicts_with = "assignee")]
        mine: bool,
        /// The order: created (oldest first, the default), created-desc,
        /// priority (highest first), priority-desc (lowest first),
        /// assignee, status, title.
        #[arg(long, value_name = "ORDER", value_parser = ["created", "created-desc", "priority", "priority-desc", "assignee", "status", "title"])]
        sort: Option<String>,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Cancel a card: it leaves every lane (archived) with why; a running
    /// card's worker and agent are stopped by their dispatcher.
    ///
    /// Example: kanban cancel t_1a2b3c4d --reason "not needed any more"
    Cancel {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Why, for the event log.
        #[arg(long, default_value = "cancelled by an operator")]
        reason: String,
    },
    /// Change a card's title, body, priority, assignee, tenant or limits (a running
    /// run goes on; the next run reads the new fields), or a done card's
    /// handoff: its result, and its last completed run's summary and
    /// metadata.
    ///
    /// Example: kanban edit t_1a2b3c4d --priority 5 --assignee reviewer
    ///
    /// Example: kanban edit t_1a2b3c4d --result "shipped in 0.3" --metadata '{"tests_run": 12}'
    Edit(EditArgs),
    /// Archive a card nobody works (`ls --archived` shows it). Its scratch
    /// folder goes, and its git worktree unless it has changes not
    /// committed (kept, and said); its branch stays.
    ///
    /// Example: kanban archive t_1a2b3c4d
    Archive {
        /// The cards' ids (as `ls` lists them): one or more.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
        /// Keep the cards' scratch folders and worktrees.
        #[arg(long)]
        keep_workspaces: bool,
    },
    /// Hold a ready, todo or scheduled card: it is parked in `scheduled`, and
    /// neither kanban nor the seed system claims it until `release`.
    ///
    /// Example: kanban hold t_1a2b3c4d --reason "waiting for the API key"
    Hold {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Why, for the event log and `ls`.
        #[arg(long, default_value = "held by an operator")]
        reason: String,
    },
    /// Release a held card: back in line (still parked while its
    /// `--not-before` time is to come).
    ///
    /// Example: kanban release t_1a2b3c4d
    Release {
        /// The card's id (as `ls` lists it).
        id: String,
    },
    /// Make a card wait for another: CHILD is claimed only once PARENT is
    /// done (a ready CHILD goes back to todo); a cycle is refused.
    ///
    /// Inside an agent (the claim carrier set), CHILD must be a card the
    /// run's card made (one that waits for it); the link is fenced by the
    /// claim and recorded on the run's card.
    ///
    /// Example: kanban link t_1a2b3c4d t_5e6f7a8b
    Link {
        /// The card to wait for.
        parent: String,
        /// The card that waits.
        child: String,
    },
    /// End a card's wait for another: a todo CHILD with no other open
    /// parent is ready at once.
    ///
    /// Example: kanban unlink t_1a2b3c4d t_5e6f7a8b
    Unlink {
        /// The card waited for.
        parent: String,
        /// The card that waits.
        child: String,
    },
    /// Tell people when cards need them: subscriptions delivered to a
    /// webhook or a command by every dispatcher of the board.
    ///
    /// A notification is written in the transaction of the event that
    /// causes it, then delivered by any dispatcher (or `notify deliver`),
    /// each with a stable id, retried with backoff for up to a day, in
    /// order per card (docs/notifications.md).
    ///
    /// Example: kanban notify subscribe --all-cards --events needs_input,failed --webhook https://hooks.example/k --secret-env KANBAN_SECRET_HOOK
    ///
    /// Example: kanban notify list
    Notify {
        #[command(subcommand)]
        command: NotifyCommand,
    },
    /// The seed system's `notify-subscribe`: subscribe a card's events,
    /// here to a webhook or a command (`notify subscribe --card`). Its
    /// chat gateway (--platform, --chat-id) is not ours: use the chat's
    /// incoming webhook with --format slack.
    ///
    /// Example: kanban notify-subscribe t_1a2b3c4d --webhook https://hooks.example/k
    #[command(name = "notify-subscribe")]
    NotifySubscribeSeed(Box<SeedSubscribeArgs>),
    /// The seed system's `notify-list`: the subscriptions, or one card's.
    ///
    /// Example: kanban notify-list t_1a2b3c4d --json
    #[command(name = "notify-list")]
    NotifyListSeed {
        /// Only the subscriptions to this card's events.
        task_id: Option<String>,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// The seed system's `notify-unsubscribe`: remove the subscriptions to a
    /// card's events (all of them, or --id N).
    ///
    /// Example: kanban notify-unsubscribe t_1a2b3c4d
    #[command(name = "notify-unsubscribe")]
    NotifyUnsubscribeSeed {
        /// The card.
        task_id: String,
        /// Only this subscription (as `notify list` numbers it).
        #[arg(long, value_name = "N")]
        id: Option<i64>,
        /// The seed system's chat gateway: not ours (refused, with what to do).
        #[arg(long, value_name = "P", hide = true)]
        platform: Option<String>,
        /// The seed system's chat: not ours.
        #[arg(long, value_name = "C", hide = true)]
        chat_id: Option<String>,
        /// The seed system's thread: not ours.
        #[arg(long, value_name = "T", hide = true)]
        thread_id: Option<String>,
    },

    /// one turn of an agent of the agents file writes its title and body.
    ///
    /// The agent (a command, or an OpenAI-compatible endpoint) is asked
    /// with a documented prompt and answers {"title", "body"} as JSON
    /// (docs/workspaces.md, "The specifier and the decomposer"). An answer
    /// that is not that JSON, or breaks a bound, writes nothing and says
    /// why. The card changes once: a card no longer in triage is refused.
    /// A note with the author and the agent is left on the card.
    ///
    /// Example: kanban specify t_1a2b3c4d --agent planner
    ///
    /// Example: kanban specify --all --tenant acme --json
    Specify(TriageArgs),
    /// Split a card in triage into linked child cards, each routed to an
    /// agent of the agents file by its description; the card waits for all
    /// of them. One turn of an agent writes the graph, or, when the idea is
    /// one piece of work, specifies the card as `specify` does.
    ///
    /// The answer is checked whole before anything is written: at most 12
    /// cards, parents that are other cards of the answer and no cycle,
    /// assignees that are agents of the file. The cards, their links and
    /// the card's move are one transaction.
    ///
    /// Example: kanban decompose t_1a2b3c4d --agent planner
    Decompose(TriageArgs),
    /// Make a swarm in one transaction: a card per --worker, ready at once;
    /// a verifier card that waits for every worker; a synthesizer card that
    /// waits for the verifier; and a root card, done at once, that keeps
    /// the swarm's notes (the seed system's graph, which either system's
    /// `swarm` recognises by its key).
    ///
    /// With --idempotency-key, running it again prints the first swarm's
    /// cards and makes nothing. Made outside any run: from inside one, fan
    /// out with `kanban create`.
    ///
    /// Example: kanban swarm "ship the 0.3 notes" --worker writer:"draft the notes" --worker counter:"count the changes" --verifier checker --synthesizer editor
    Swarm(SwarmArgs),
    /// Delete done and archived cards with no activity for a while, with
    /// their runs, events, comments and logs.
    ///
    /// Example: kanban prune --older-than 30d --dry-run
    Prune {
        /// Only cards whose last event is older than this (7d, 12h…).
        #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
        older_than: i64,
        /// List what would go; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// Keep the cards' scratch folders and worktrees (otherwise they go
        /// as `archive` takes them).
        #[arg(long)]
        keep_workspaces: bool,
    },
    /// Serve the live web board, a JSON API (/api/, docs/api.md) and
    /// Prometheus metrics (/metrics). Loopback by default; any other address
    /// needs --token.
    ///
    /// On a board of the kanban home, the home's other boards are served
    /// too, at /boards/SLUG, and every page can switch between them.
    ///
    /// Example: kanban --db ./kanban.db serve --listen 127.0.0.1:8080
    Serve {
        /// Where to listen (port 0 picks a free one; the first line says which).
        #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
        /// The token every request must carry (`Authorization: Bearer TOKEN`, or
        /// the cookie /login?token=TOKEN sets); required off loopback. It shows
        /// in `ps`: prefer --token-file.
        #[arg(
            long,
            env = "KANBAN_SERVE_TOKEN",
            value_name = "TOKEN",
            hide_env_values = true,
            conflicts_with = "token_file"
        )]
        token: Option<String>,
        /// Read the token from this file (its first line; owner-only, as
        /// `chmod 600` makes it).
        #[arg(long, value_name = "PATH")]
        token_file: Option<std::path::PathBuf>,
    },
    /// Print a card's worker log: every run, or one (`--run N`); `--follow`
    /// keeps printing while the card runs. Logs live in `logs/` beside the
    /// board; one past 16 MiB moves to `TASK.log.1` when the next run starts,
    /// and each agent turn adds at most 8 MiB per stream.
    ///
    /// Example: kanban logs t_1a2b3c4d --run 3 --follow
    Logs {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Only this run (its id, as `kanban show` lists it).
        #[arg(long, value_name = "N")]
        run: Option<i64>,
        /// Keep printing what is appended while the card runs; Ctrl-C stops.
        #[arg(long, short)]
        follow: bool,
    },
    /// List the provider walls: scopes (an endpoint and key, a model, or an
    /// agent) whose cards wait, uncharged, until the provider's reset time;
    /// then one probe card goes through (docs/policy.md).
    ///
    /// Example: kanban walls --json
    Walls {
        /// One JSON array.
        #[arg(long)]
        json: bool,
        /// Lift the wall of this scope by hand (the provider is back sooner
        /// than it said, or the agent is gone); its cards may be claimed at once.
        #[arg(long, value_name = "SCOPE", conflicts_with = "json")]
        lift: Option<String>,
    },
    /// Show a card with its runs and events.
    ///
    /// Example: kanban show t_1a2b3c4d
    Show {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a card's runs, oldest first: each one's status, outcome, claim
    /// lock, summary (or error) and handoff metadata.
    ///
    /// Example: kanban runs t_1a2b3c4d --outcome completed --json
    Runs {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Only runs with this status (running, done, blocked, failed…).
        #[arg(long)]
        status: Option<String>,
        /// Only runs with this outcome (completed, blocked, crashed…).
        #[arg(long)]
        outcome: Option<String>,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Show a card's events.
    ///
    /// Example: kanban events t_1a2b3c4d --json
    Events {
        /// The card's id (as `ls` lists it).
        id: String,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Claim a ready card by hand; prints the claim carrier to export.
    ///
    /// Example: eval "$(kanban claim t_1a2b3c4d)" && kanban worker --agent ./agent.sh
    Claim {
        /// The card's id (as `ls` lists it).
        id: String,
        /// The lease, 1s to 24h (default KANBAN_CLAIM_TTL_SECONDS, else 15m).
        #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
        ttl: Option<i64>,
        /// The claim as one JSON object instead of shell exports.
        #[arg(long)]
        json: bool,
    },
    /// Move a blocked or scheduled card back to ready (todo while a parent
    /// is open), now: its hold and its time end too.
    ///
    /// Inside an agent (the claim carrier set), only a card the run's card
    /// made; fenced by the claim and recorded on the run's card.
    ///
    /// Example: kanban unblock t_1a2b3c4d
    Unblock {
        /// The cards' ids (as `ls` lists them): one or more.
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
    /// Park a card (todo, ready, blocked or running) in `scheduled`: it
    /// waits on time, not on a person, and neither kanban nor the seed
    /// system claims it. With --not-before a dispatcher puts it back in line
    /// then; without, it waits for `kanban unblock`. A running card's worker
    /// is fenced out and stopped.
    ///
    /// Example: kanban schedule t_1a2b3c4d "after the freeze" --not-before 2026-12-10T09:00:00Z
    Schedule {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Why, or when, in words (for the event log).
        reason: Vec<String>,
        /// More cards to park the same way.
        #[arg(long, num_args = 1.., value_name = "ID")]
        ids: Vec<String>,
        /// Back in line at this time: RFC 3339 or +DURATION (+10m, +2h).
        #[arg(long, value_name = "TIME")]
        not_before: Option<String>,
    },
    /// Move a card in triage, todo or blocked to ready, by hand. Refused
    /// while a parent is neither done nor archived, unless --force.
    ///
    /// Example: kanban promote t_1a2b3c4d "spec reviewed" --dry-run
    Promote {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Why, for the event log.
        reason: Vec<String>,
        /// More cards to promote the same way.
        #[arg(long, num_args = 1.., value_name = "ID")]
        ids: Vec<String>,
        /// Promote even though a parent is not done.
        #[arg(long)]
        force: bool,
        /// Say whether it would be promoted; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Print `{"id": ..., "promoted": ..., "dry_run": ...}`.
        #[arg(long)]
        json: bool,
    },
    /// Send a card nobody works (todo, scheduled, ready or blocked) to
    /// triage: it waits for a person and is never claimed until `promote`.
    ///
    /// Example: kanban triage t_1a2b3c4d "the spec is unclear"
    Triage {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Why, for the event log.
        reason: Vec<String>,
    },
    /// Put a card nobody works (todo, scheduled, ready, blocked or done) up
    /// for review: a dispatcher claims it for its assignee, the reviewer,
    /// without waiting for its parents again.
    ///
    /// Example: kanban review t_1a2b3c4d "check the migration"
    Review {
        /// The card's id (as `ls` lists it).
        id: String,
        /// What to review, for the event log.
        reason: Vec<String>,
    },
    /// Take a card back from its worker: the run closes as reclaimed, the card is ready again.
    ///
    /// Example: kanban reclaim t_1a2b3c4d
    Reclaim {
        /// The card's id (as `ls` lists it).
        id: String,
        /// Why, for the event log.
        #[arg(long, default_value = "operator reclaim")]
        reason: String,
    },
    /// Complete the worker's card (inside an agent; reads the claim carrier).
    ///
    /// Example: kanban complete --summary "notes written" --result "see NOTES.md" --metadata '{"changed_files": ["NOTES.md"]}'
    Complete {
        /// What was done, in a line or two.
        #[arg(long)]
        summary: String,
        /// The result itself, when there is one to keep (a path, a link, a figure).
        #[arg(long)]
        result: Option<String>,
        /// Facts for whoever reads the run, as one JSON object (at most 64 KiB):
        /// changed files, tests run… Kept on the run; `show` and `runs` print it.
        #[arg(long, value_name = "JSON", value_parser = json_object)]
        metadata: Option<serde_json::Map<String, serde_json::Value>>,
        /// The cards this run made (`kanban create` inside it), comma-separated
        /// or repeated: each is checked, and an id the run did not make
        /// refuses the completion, changing nothing.
        #[arg(long, value_name = "ID,…", value_delimiter = ',')]
        created_cards: Vec<String>,
    },
    /// Block the worker's card (inside an agent; reads the claim carrier).
    ///
    /// Example: kanban block --reason "need the API key" --kind needs_input
    Block {
        /// Why, for the event log.
        #[arg(long)]
        reason: String,
        /// What it waits for: `dependency` (another card: back to todo, ready
        /// once its parents are done), `needs_input` or `capability` (a
        /// person), `transient` (may clear by itself). Blocked twice in a row
        /// for the same kind, a card goes to triage.
        #[arg(long, value_name = "KIND", value_parser = block_kind)]
        kind: Option<kanban_core::BlockKind>,
    },
    /// Extend the worker's lease (inside an agent; reads the claim carrier).
    ///
    /// Example: kanban heartbeat --note "half way"
    Heartbeat {
        /// A note kept with the heartbeat event.
        #[arg(long)]
        note: Option<String>,
    },
    /// Count the cards: by status, by assignee, and the age of the oldest
    /// ready card (archived cards are not counted).
    ///
    /// Example: kanban stats --json
    Stats {
        /// One JSON object: by_status, by_assignee, oldest_ready_age_seconds, now.
        #[arg(long)]
        json: bool,
    },
    /// List the names cards go to: every assignee on the board and every
    /// agent of the agents file, whether an agent serves it, and its cards
    /// by status.
    ///
    /// Example: kanban assignees --json
    Assignees {
        /// One JSON array of {name, on_disk (an agent serves it), counts}.
        #[arg(long)]
        json: bool,
    },
    /// Say what is wrong with the cards that are not done or archived: the
    /// seed system's checks (repeated failures and crashes, blocked a day
    /// with nobody answering, block-unblock cycles, ready with no worker)
    /// and ours (no agent serves its assignee, a run whose lease ran out,
    /// a provider wall), worst first, with what to do.
    ///
    /// Example: kanban diagnostics --severity error --json
    Diagnostics {
        /// Only these and worse: warning, error, critical.
        #[arg(long, value_name = "SEVERITY", value_parser = severity)]
        severity: Option<kanban_core::diagnostics::Severity>,
        /// Only this card.
        #[arg(long, value_name = "ID")]
        task: Option<String>,
        /// One JSON array: each card with its diagnostics.
        #[arg(long)]
        json: bool,
    },
    /// Print what a worker would hand the card's agent: its first message
    /// and the card as the agent is told it (with the newest comments).
    ///
    /// Example: kanban context t_1a2b3c4d --json
    Context {
        /// The card.
        id: String,
        /// The turn request a command agent reads on its standard input.
        #[arg(long)]
        json: bool,
    },
    /// Print a card's events, then each new one as it comes, until Ctrl-C.
    ///
    /// Example: kanban tail t_1a2b3c4d --interval 0.5
    Tail {
        /// The card.
        id: String,
        /// How often to look for new events (default 1s).
        #[arg(long, value_parser = crate::duration::parse_duration, default_value = "1")]
        interval: std::time::Duration,
        /// Each event as one JSON line.
        #[arg(long)]
        json: bool,
    },
    /// Clean up as the seed system does: delete the events older than N
    /// days of cards that are done or archived, and the worker logs not
    /// written for N days (`prune` deletes whole cards); and remove the git
    /// worktrees of cards no longer on the board, keeping any with changes
    /// not committed.
    ///
    /// Example: kanban gc --event-retention-days 90 --log-retention-days 30
    Gc {
        /// Keep this many days of a done or archived card's events.
        #[arg(long, default_value_t = 30)]
        event_retention_days: u32,
        /// Keep worker logs written within this many days.
        #[arg(long, default_value_t = 30)]
        log_retention_days: u32,
    },
    /// Give a card to another agent (`none` takes its assignee away). A
    /// running card is refused unless --reclaim takes it back from its
    /// worker first.
    ///
    /// Example: kanban reassign t_1a2b3c4d reviewer --reclaim --reason "the coder is stuck"
    Reassign {
        /// The card.
        id: String,
        /// The agent's name, or `none`.
        name: String,
        /// Reclaim a running card first (its worker is fenced out).
        #[arg(long)]
        reclaim: bool,
        /// Why (recorded on the reclaim).
        #[arg(long, default_value = "reassign")]
        reason: String,
    },
    /// Attach a file to a card: copied into the board's attachments folder,
    /// where the seed system keeps them too (`attachments/ID/` beside the
    /// board; HERMES_KANBAN_ATTACHMENTS_ROOT moves it), 25 MiB at most.
    /// Inside an agent, to the run's own card only, fenced.
    ///
    /// Example: kanban attach t_1a2b3c4d report.pdf --content-type application/pdf
    Attach {
        /// The card.
        task: String,
        /// The file to attach.
        path: PathBuf,
        /// The name to store it under (default: the file's own name).
        #[arg(long)]
        name: Option<String>,
        /// Its content type (default: guessed from its name, else none).
        #[arg(long, value_name = "TYPE")]
        content_type: Option<String>,
        /// Who attached it (default: $HERMES_PROFILE, else $USER, else `user`).
        #[arg(long)]
        author: Option<String>,
        /// Print the attachment as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List a card's attachments: id, name, size, type, who attached it, and the file.
    ///
    /// Example: kanban attachments t_1a2b3c4d --json
    Attachments {
        /// The card.
        task: String,
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Remove an attachment: its record, and its file from the board's
    /// attachments folder.
    ///
    /// Example: kanban attach-rm 3
    #[command(name = "attach-rm")]
    AttachRm {
        /// The attachment's number (`kanban attachments ID` lists them).
        id: i64,
    },
    /// Keep several boards under the kanban home, one per project, in the
    /// seed system's layout (the default board is HOME/kanban.db, another is
    /// HOME/kanban/boards/SLUG/kanban.db), so that both systems see the same
    /// boards. Without a subcommand: `list`.
    ///
    /// `--board SLUG` (or KANBAN_BOARD) picks a board for one command;
    /// `boards switch` picks the one commands use when none is named. A
    /// PostgreSQL board is one database: `boards create SLUG --url URL`
    /// names it under the home.
    ///
    /// Example: kanban boards create atm10-server --name "ATM10 server" --switch
    Boards {
        #[command(subcommand)]
        command: Option<BoardsCommand>,
    },
    /// Comment on a card: `comment TASK TEXT` from anywhere (a human steering
    /// the card's agent: the next run's turn request and `kanban_show` carry
    /// it), or `comment TEXT` inside an agent (reads the claim carrier; fenced).
    ///
    /// Example: kanban comment t_1a2b3c4d "use the v2 API, not v1"
    Comment {
        /// [TASK] TEXT: the card (outside a worker) and the comment.
        #[arg(num_args = 1..=2, required = true, value_names = ["TASK", "TEXT"])]
        words: Vec<String>,
        /// Who says it (outside a worker; default $USER, else `human`).
        #[arg(long)]
        author: Option<String>,
    },
    /// Work the claimed card named by the claim carrier, turn by turn.
    ///
    /// Reads KANBAN_TASK, _DB, _RUN_ID, _CLAIM_LOCK (and _BOARD, _GOAL_MODE,
    /// _TURN_RECOVERY, _STOP_NUDGE), or their HERMES_KANBAN_ names. Exits 0, 1, 75, 78 or 130;
    /// the last stderr line is `[kanban-worker-exit] rc=N`.
    ///
    /// Example: eval "$(kanban claim t_1a2b3c4d)" && kanban worker --agent cli/examples/agents/finish.sh
    Worker(WorkerArgs),
    /// Run one agent turn, to try an agent; prints its text, shows its stderr.
    ///
    /// Nothing on the board changes: with --card the agent is told that
    /// card as its worker would be (its first message, title, body and
    /// comments), but nothing is claimed, so the agent's own board calls
    /// are refused.
    ///
    /// Example: kanban turn --agent cli/examples/agents/finish.sh "say hello"
    ///
    /// Example: kanban turn --agent ./agents/writer.sh --title "fix the README" --body "the install line is wrong"
    ///
    /// Example: kanban --db ./kanban.db turn --agent ./agents/writer.sh --card t_1a2b3c4d
    Turn(TurnArgs),
    /// Fencing for side effects: refuse a push, a post or a write from a run
    /// that lost its claim (docs/cli.md, "Fencing side effects").
    ///
    /// Example: kanban fence run -- git push origin "kanban/$KANBAN_TASK/run-$KANBAN_FENCE_TOKEN"
    #[command(subcommand)]
    Fence(FenceCommand),
    /// Prove a worker's claim is live, read-only; exit 0 when live, 1 when not.
    ///
    /// Flags override the claim carrier in the environment.
    ///
    /// Example: kanban prove --db ./kanban.db --task t_1a2b3c4d --run-id 3 --claim-lock host:42 --json
    Prove(ProveArgs),
    /// Claim ready cards, spawn a worker for each, book every exit, release stale claims.
    ///
    /// Runs until interrupted by default, one tick every --interval (sooner
    /// when a worker exits). Only one dispatcher ticks a board at a time.
    /// Workers' output goes to logs/TASK.log beside the board file.
    ///
    /// Example: kanban dispatch --agent cli/examples/agents/finish.sh --max-in-progress 4
    Dispatch(DispatchArgs),
    /// A demonstration on a fresh board: simulated agents that fail and recover.
    ///
    /// Adds a handful of cards, dispatches them with a bundled simulated
    /// agent (a real child process speaking the agent protocol) and prints a
    /// summary. Short delays; finishes in well under a minute.
    ///
    /// Example: kanban demo
    Demo {
        /// Keep the demo's board at this new path (it must not exist yet)
        /// instead of a fresh temporary folder.
        #[arg(long, value_name = "PATH")]
        board_file: Option<PathBuf>,
    },
    /// A live view of the board: cards by status, running workers, last events.
    ///
    /// Redraws in place on a terminal; prints plain snapshots otherwise.
    ///
    /// Example: kanban watch --interval 2
    Watch {
        /// Time between refreshes (seconds, or 500ms, 2m…).
        #[arg(long, default_value = "1", value_name = "DURATION", value_parser = parse_duration)]
        interval: Duration,
        /// Print one snapshot and exit.
        #[arg(long)]
        once: bool,
    },
    /// Serve the worker's board tools over MCP on stdio (reads the claim carrier).
    ///
    /// Tools: kanban_complete, kanban_block, kanban_heartbeat, kanban_comment,
    /// kanban_show. Every write is fenced by the claim.
    ///
    /// Example: claude mcp add kanban -- kanban mcp
    Mcp,
    /// Print a shell completion script for kanban.
    ///
    /// Example (bash): kanban completions bash > ~/.local/share/bash-completion/completions/kanban
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print kanban's manual page (roff) on stdout.
    ///
    /// Example: kanban man > ~/.local/share/man/man1/kanban.1 && man kanban
    Man,
    /// The simulated agent `kanban demo` uses (speaks the agent protocol).
    #[command(hide = true)]
    SimAgent,
}

#[derive(Debug, Args)]
pub(crate) struct DispatchArgs {
    /// One tick, then exit.
    #[arg(long, conflicts_with = "until_idle")]
    pub(crate) once: bool,
    /// Say what one tick would claim now, and why not each other ready card
    /// (held, waiting for its time, no agent, walled, an agent or this host
    /// full); claim nothing, start nothing, write nothing. It may run beside
    /// a dispatcher that ticks.
    #[arg(long, conflicts_with_all = ["once", "until_idle"])]
    pub(crate) dry_run: bool,
    /// With --dry-run: one JSON object (docs/cli.md).
    #[arg(long, requires = "dry_run")]
    pub(crate) json: bool,
    /// Exit once nothing runs and nothing can be claimed now (cards waiting out a cooldown or a
    /// backoff do not keep it running; `ls` says when they come back).
    #[arg(long)]
    pub(crate) until_idle: bool,
    /// Time between ticks (seconds, or 500ms, 2m…); ticks come sooner when a
    /// worker exits, and at least three times per lease.
    #[arg(long, default_value = "60", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) interval: Duration,
    /// Workers of this host running at once, at most.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub(crate) max_in_progress: u32,
    /// The agent workers run: a command (run with `sh -c` once per turn) or
    /// `http:URL?model=M…`. `NAME=CMD` names an agent: cards assigned to NAME
    /// (`kanban add --assignee NAME`) go to it, and an unnamed agent takes the
    /// cards with no assignee (or every card when no agent is named); repeat
    /// for several. Each is checked before the first claim.
    #[arg(long, env = "KANBAN_AGENT", value_name = "[NAME=]CMD")]
    pub(crate) agent: Vec<String>,
    /// The longest a provider wall holds its cards before one probe card goes
    /// through, whatever reset time the provider named (`kanban walls`).
    #[arg(long, default_value = "1h", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) max_wall: Duration,
    /// The goal judge command workers use.
    #[arg(long, env = "KANBAN_JUDGE", value_name = "CMD")]
    pub(crate) judge: Option<String>,
    /// The workers' in-place recovery backoff (passed to `kanban worker`).
    #[arg(long, value_name = "S[,S...]", overrides_with = "recovery_delays")]
    pub(crate) recovery_delays: Option<String>,
    /// The lease of each claim, 1s to 24h (default KANBAN_CLAIM_TTL_SECONDS, else 15m).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
    pub(crate) ttl: Option<i64>,
    /// How long a card that hit a rate limit (exit 75) waits before its next
    /// worker (default KANBAN_RATE_LIMIT_COOLDOWN_SECONDS, else 5m).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) rate_limit_cooldown: Option<Duration>,
    /// Counted failures that block a card naming no --max-retries of its own.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) failure_limit: u32,
    /// The wait after a card's first counted failure (a crash, a time-out, a
    /// lost lease) before it is claimed again; it doubles per failure in a
    /// row, up to an hour, plus up to a quarter of jitter. 0: none.
    #[arg(long, default_value = "30", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) retry_backoff: Duration,
    /// A turn of a command agent is stopped after this long (at least 1s).
    #[arg(long, default_value = "30m", value_name = "DURATION", value_parser = parse_limit)]
    pub(crate) turn_timeout: Duration,
    /// The longest a run may take, for cards naming no limit of their own
    /// (`kanban add --max-runtime`); past it the run is stopped and counted.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
    pub(crate) max_runtime: Option<i64>,
    /// How long workers get to stop after SIGTERM before SIGKILL.
    #[arg(long, default_value = "10", value_name = "DURATION", value_parser = parse_duration)]
    pub(crate) grace: Duration,
}

#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The card's title: what is to be done, in one line.
    pub(crate) title: String,
    /// The card's body: details for the agent (it reads title and body).
    #[arg(long)]
    pub(crate) body: Option<String>,
    /// The agent the card goes to (a name of the agents file, or of `--agent NAME=CMD`).
    #[arg(long)]
    pub(crate) assignee: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) priority: i64,
    /// A card that must be done first (repeat for several).
    #[arg(long = "parent", value_name = "ID")]
    pub(crate) parents: Vec<String>,
    /// Work the card in goal mode (a judge decides when the goal is reached).
    #[arg(long)]
    pub(crate) goal: bool,
    /// Goal-mode turns per run (default 20).
    #[arg(long, value_name = "N")]
    pub(crate) goal_max_turns: Option<u32>,
    /// Counted failures before the card is blocked (default: the dispatcher's --failure-limit, 2).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) max_retries: Option<u32>,
    /// The longest one run of this card may take (90s, 30m, 2h…); past it
    /// the run is stopped and counted as timed out.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
    pub(crate) max_runtime: Option<i64>,
    /// A second add with the same key returns the first card's id.
    #[arg(long, value_name = "KEY")]
    pub(crate) idempotency_key: Option<String>,
    /// Start blocked instead of ready.
    #[arg(long, conflicts_with = "triage")]
    pub(crate) blocked: bool,
    /// Start in triage: it waits for a person to shape it and is never
    /// claimed until `kanban promote`.
    #[arg(long)]
    pub(crate) triage: bool,
    /// Not claimed before this time: RFC 3339 (2026-12-03T09:00:00Z) or
    /// +DURATION from now (+10m, +2h).
    #[arg(long, value_name = "TIME")]
    pub(crate) not_before: Option<String>,
    /// Recurring: when this card is done, the next one is added, due one
    /// period after this one was (30m, 1d…); never two at once.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
    pub(crate) every: Option<i64>,
    /// The namespace it belongs to (the seed system's tenant): `ls
    /// --tenant` lists one; a card made inside a run takes its card's.
    #[arg(long, value_name = "NAME", value_parser = label)]
    pub(crate) tenant: Option<String>,
    /// Who made it, as `show` names them (inside a run: the run card's
    /// assignee, whatever is given).
    #[arg(long, value_name = "NAME", value_parser = label)]
    pub(crate) created_by: Option<String>,
    /// Where its agent works: `scratch` (a folder of its own under the
    /// board's `workspaces/`, removed when the card is done; the default),
    /// `dir:PATH` (an existing folder), `worktree:PATH` (a git worktree of
    /// the repository at PATH, at REPO/.worktrees/ID, on --branch).
    #[arg(long, value_name = "KIND[:PATH]")]
    pub(crate) workspace: Option<String>,
    /// The repository of a worktree workspace (`--workspace worktree:REPO`).
    #[arg(long, value_name = "PATH")]
    pub(crate) repo: Option<std::path::PathBuf>,
    /// The branch of a worktree workspace (default wt/ID); one checked out
    /// elsewhere is refused.
    #[arg(long, value_name = "NAME")]
    pub(crate) branch: Option<String>,
    /// Print `{"id": ...}`.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct EditArgs {
    /// The card's id (as `ls` lists it).
    pub(crate) id: String,
    /// A new title.
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// The card's body: details for the agent (it reads title and body).
    #[arg(long)]
    pub(crate) body: Option<String>,
    /// Higher runs first.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) priority: Option<i64>,
    /// Route the card to this agent (an empty value clears it).
    #[arg(long)]
    pub(crate) assignee: Option<String>,
    /// Put the card in this tenant (an empty value takes it out of any).
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// Counted failures before the card is blocked.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) max_retries: Option<u32>,
    /// The longest one run may take (90s, 30m, 2h…).
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
    pub(crate) max_runtime: Option<i64>,
    /// A done card's result, backfilled (what `show` and its children read).
    #[arg(long, value_name = "TEXT")]
    pub(crate) result: Option<String>,
    /// A done card's handoff summary (its last completed run's).
    #[arg(long, value_name = "TEXT")]
    pub(crate) summary: Option<String>,
    /// A done card's handoff metadata, a JSON object that replaces its last
    /// completed run's.
    #[arg(long, value_name = "JSON", value_parser = json_object)]
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// Where its agent works from its next run on, as `add --workspace`
    /// takes it: `scratch`, `dir:PATH`, `worktree:PATH` (not for a running
    /// or done card; a folder or worktree made for the old one is left as
    /// it is).
    #[arg(long, value_name = "KIND[:PATH]")]
    pub(crate) workspace: Option<String>,
    /// The repository of a worktree workspace (`--workspace worktree:REPO`).
    #[arg(long, value_name = "PATH")]
    pub(crate) repo: Option<std::path::PathBuf>,
    /// The branch of a worktree workspace (default wt/ID).
    #[arg(long, value_name = "NAME")]
    pub(crate) branch: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct TurnArgs {
    /// The agent command (run with `sh -c`), or `http:URL?model=M…` (docs/agents.md).
    #[arg(long, env = "KANBAN_AGENT", value_name = "CMD")]
    pub(crate) agent: String,
    /// The user message (default: the first message of the card the other
    /// options describe, as a worker sends it).
    pub(crate) message: Option<String>,
    /// Tell the agent this card of the board (read only).
    #[arg(long, value_name = "ID")]
    pub(crate) card: Option<String>,
    /// The task's id, as the agent is told it.
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// The task's title, as the agent is told it.
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// The task's body, as the agent is told it.
    #[arg(long)]
    pub(crate) body: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct WorkerArgs {
    /// The agent: a command run with `sh -c` once per turn (docs/agent-protocol.md),
    /// or `http:URL?model=M[&key_env=VAR&stream=1&retries=N&max_iterations=N]` for an
    /// OpenAI-compatible chat-completions endpoint (docs/agents.md).
    #[arg(long, env = "KANBAN_AGENT", value_name = "CMD")]
    pub(crate) agent: Option<String>,
    /// The goal judge command (goal mode only): gets {"goal", "last_response"}, prints {"verdict", "reason"}.
    #[arg(long, env = "KANBAN_JUDGE", value_name = "CMD")]
    pub(crate) judge: Option<String>,
    /// The in-place recovery backoff in seconds; the last repeats.
    #[arg(long, value_name = "S[,S...]", value_delimiter = ',', default_values_t = [15u64, 45, 90], action = clap::ArgAction::Set, overrides_with = "recovery_delays")]
    pub(crate) recovery_delays: Vec<u64>,
    /// How long a stopped agent's process group gets before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10", value_parser = parse_duration)]
    pub(crate) grace: Duration,
    /// A turn of a command agent is stopped after this long (at least 1s).
    #[arg(long, default_value = "30m", value_name = "DURATION", value_parser = parse_limit, overrides_with = "turn_timeout")]
    pub(crate) turn_timeout: Duration,
    /// The longest the run may take when the card names no limit.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_seconds)]
    pub(crate) max_runtime: Option<i64>,
    /// Counted failures that block the card (the dispatcher's --failure-limit).
    #[arg(long, default_value_t = 2, value_name = "N", hide = true)]
    pub(crate) failure_limit: u32,
    /// The dispatcher's --retry-backoff, for a run this worker settles itself.
    #[arg(long, default_value = "30", value_name = "DURATION", value_parser = parse_duration, hide = true)]
    pub(crate) retry_backoff: Duration,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BoardsCommand {
    /// List the boards with their cards by status; `●` marks the current one.
    ///
    /// Example: kanban boards list --json
    #[command(visible_alias = "ls")]
    List {
        /// One JSON array: each board's board.json fields, with slug, name,
        /// db_path, engine, is_current, counts, total and problem.
        #[arg(long)]
        json: bool,
        /// Include the boards the seed system marked archived.
        #[arg(long)]
        all: bool,
    },
    /// Create a board (its file and board.json); a board that exists is left
    /// as it is, as `mkdir -p` leaves a folder.
    ///
    /// Example: kanban boards create atm10-server --description "the modded server" --switch
    #[command(visible_alias = "new")]
    Create {
        /// 1-64 lowercase letters, digits, '-' or '_' (e.g. atm10-server).
        slug: String,
        /// The name people see (default: the slug in title case).
        #[arg(long)]
        name: Option<String>,
        /// A line saying what the board is for.
        #[arg(long)]
        description: Option<String>,
        /// An emoji or one character, for the seed system's dashboard.
        #[arg(long)]
        icon: Option<String>,
        /// A colour such as '#8b5cf6', for the seed system's dashboard.
        #[arg(long)]
        color: Option<String>,
        /// Make it the current board.
        #[arg(long)]
        switch: bool,
        /// The board is this PostgreSQL database (postgres://USER@HOST:PORT/DBNAME,
        /// its schema made now); its logs and files stay in the board's folder
        /// on each host.
        #[arg(long, value_name = "URL")]
        url: Option<String>,
    },
    /// Show the current board: its name, description, where it is, its cards.
    ///
    /// Example: kanban boards show
    #[command(visible_alias = "current")]
    Show {
        /// One JSON object, as one entry of `boards list --json`.
        #[arg(long)]
        json: bool,
    },
    /// Change a board's display name (its slug stays).
    ///
    /// Example: kanban boards rename atm10-server "ATM10 (prod)"
    Rename {
        /// The board.
        slug: String,
        /// The name people see.
        name: String,
    },
    /// Archive a board: its folder moves to HOME/kanban/boards/_archived/SLUG-TIME,
    /// from where it can be moved back. The default board cannot be removed,
    /// nor a board a dispatcher is ticking.
    ///
    /// Example: kanban boards rm atm10-server
    #[command(visible_alias = "remove")]
    Rm {
        /// The board.
        slug: String,
        /// Delete the board's folder, its cards, logs and files, for good.
        #[arg(long)]
        delete: bool,
    },
    /// Delete a board for good (`rm --delete`).
    ///
    /// Example: kanban boards delete scratch-board
    Delete {
        /// The board.
        slug: String,
    },
    /// Make a board the current one: commands naming no board use it.
    ///
    /// Example: kanban boards switch atm10-server
    #[command(visible_alias = "use")]
    Switch {
        /// The board.
        slug: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum FenceCommand {
    /// Exit 0 only while the carrier's claim is live and its fence token
    /// (KANBAN_FENCE_TOKEN) is the card's newest run; 1, saying why, otherwise.
    ///
    /// Example (a git pre-push hook): exec kanban fence check --quiet
    Check {
        /// Say nothing when live.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Run CMD only while the claim is live, and stop its process group the
    /// moment the lease is lost. Exits with CMD's status, or 1 when the claim
    /// was not live (CMD never ran) or was lost while it ran.
    ///
    /// Example: kanban fence run -- gh pr comment 12 --body done
    Run {
        /// The command and its arguments (not run through a shell).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub(crate) struct ProveArgs {
    /// The task id (overrides KANBAN_TASK; blank means "not a worker").
    #[arg(long)]
    pub(crate) task: Option<String>,
    /// The run id (overrides KANBAN_RUN_ID).
    #[arg(long, value_name = "N")]
    pub(crate) run_id: Option<String>,
    /// The claim lock (overrides KANBAN_CLAIM_LOCK).
    #[arg(long, value_name = "LOCK")]
    pub(crate) claim_lock: Option<String>,
    /// A recorded worker pid must equal N.
    #[arg(long, value_name = "N")]
    pub(crate) pid: Option<u32>,
    /// Owner-side: the newest worker_bound event must name --pid (default: this process's parent).
    #[arg(long)]
    pub(crate) owner: bool,
    /// Print {"live": bool, "reason": "..."}.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A block kind, by the seed system's names.
/// `kanban notify`'s subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum NotifyCommand {
    /// Subscribe a webhook or a command to the events of a card, an
    /// assignee, a tenant or the whole board; prints the subscription's id.
    ///
    /// Kinds: needs_input, blocked, done, failed (past the failure limit),
    /// wall (armed or lifted), overrun (past the max runtime), or all.
    ///
    /// Example: kanban notify subscribe --card t_1a2b3c4d --events done --command "notify-send kanban"
    Subscribe(Box<SubscribeArgs>),
    /// The subscriptions, with their pending, delivered and dead
    /// notifications and the last error.
    ///
    /// Example: kanban notify list --json
    #[command(visible_alias = "ls")]
    List {
        /// One JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Remove a subscription; its notifications not yet delivered are
    /// dropped.
    ///
    /// Example: kanban notify unsubscribe 3
    #[command(visible_alias = "rm")]
    Unsubscribe {
        /// The subscription's id (as `notify list` shows it).
        id: i64,
    },
    /// Deliver the notifications that are due now, as a dispatcher does
    /// (for a board no dispatcher runs on).
    ///
    /// Example: kanban notify deliver
    Deliver,
}

/// `kanban notify-subscribe`'s arguments: the seed system's form.
#[derive(Debug, Args)]
pub(crate) struct SeedSubscribeArgs {
    /// The card whose events are sent.
    pub(crate) task_id: String,
    /// POST each notification to this URL.
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    pub(crate) webhook: Option<String>,
    /// Run this command with each notification on its stdin.
    #[arg(long, value_name = "CMD")]
    pub(crate) command: Option<String>,
    /// The kinds of event, separated by commas, or `all` (the seed
    /// system's: the card's terminal events).
    #[arg(
        long,
        value_name = "KINDS",
        default_value = "needs_input,blocked,done,failed"
    )]
    pub(crate) events: String,
    /// The webhook's body: json or slack.
    #[arg(long, value_name = "FORMAT", default_value = "json", value_parser = ["json", "slack"])]
    pub(crate) format: String,
    /// Sign each webhook body with the secret in this variable (KANBAN_SECRET_…).
    #[arg(long, value_name = "VAR", requires = "webhook")]
    pub(crate) secret_env: Option<String>,
    /// The seed system's chat gateway: not ours (refused, with what to do).
    #[arg(long, value_name = "P", hide = true)]
    pub(crate) platform: Option<String>,
    /// The seed system's chat: not ours.
    #[arg(long, value_name = "C", hide = true)]
    pub(crate) chat_id: Option<String>,
    /// The seed system's thread: not ours.
    #[arg(long, value_name = "T", hide = true)]
    pub(crate) thread_id: Option<String>,
    /// The seed system's user: not ours.
    #[arg(long, value_name = "U", hide = true)]
    pub(crate) user_id: Option<String>,
    /// The seed system's notifier profile: not ours.
    #[arg(long, value_name = "PROFILE", hide = true)]
    pub(crate) notifier_profile: Option<String>,
    /// Print {"id": N}.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `kanban notify subscribe`'s arguments.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["card", "assignee", "tenant", "all_cards"])))]
#[command(group(clap::ArgGroup::new("channel").required(true).args(["webhook", "command", "mail"])))]
pub(crate) struct SubscribeArgs {
    /// The events of one card.
    #[arg(long, value_name = "ID")]
    pub(crate) card: Option<String>,
    /// The events of the cards assigned to this agent.
    #[arg(long, value_name = "NAME")]
    pub(crate) assignee: Option<String>,
    /// The events of the cards of this tenant.
    #[arg(long, value_name = "NAME")]
    pub(crate) tenant: Option<String>,
    /// The events of every card of the board.
    #[arg(long)]
    pub(crate) all_cards: bool,
    /// The kinds of event, separated by commas, or `all`.
    #[arg(long, value_name = "KINDS", default_value = "needs_input,failed")]
    pub(crate) events: String,
    /// POST each notification to this URL (JSON; signed when a secret is named).
    #[arg(long, value_name = "URL")]
    pub(crate) webhook: Option<String>,
    /// Run this command (`sh -c`) with each notification as JSON on its stdin.
    #[arg(long, value_name = "CMD")]
    pub(crate) command: Option<String>,
    /// Mail each notification to this address, through --smtp.
    #[arg(long, value_name = "ADDRESS", requires_all = ["smtp", "mail_from"])]
    pub(crate) mail: Option<String>,
    /// The SMTP server mail goes through: smtp://[USER@]HOST[:PORT]
    /// (STARTTLS, required; port 587) or smtps://… (TLS; port 465).
    #[arg(long, value_name = "URL", requires = "mail")]
    pub(crate) smtp: Option<String>,
    /// The sender of the mail.
    #[arg(long, value_name = "ADDRESS", requires = "mail")]
    pub(crate) mail_from: Option<String>,
    /// The SMTP password, in this environment variable of the dispatchers,
    /// named KANBAN_SECRET_….
    #[arg(
        long,
        value_name = "VAR",
        requires = "mail",
        conflicts_with = "smtp_password_file"
    )]
    pub(crate) smtp_password_env: Option<String>,
    /// The SMTP password, in this file (owner-only, or it is refused).
    #[arg(long, value_name = "PATH", requires = "mail")]
    pub(crate) smtp_password_file: Option<PathBuf>,
    /// A PEM file of the CA that signed the SMTP server's certificate,
    /// trusted beside the system's.
    #[arg(long, value_name = "PATH", requires = "mail")]
    pub(crate) smtp_ca: Option<PathBuf>,
    /// The webhook's body: json (the documented notification) or slack
    /// (`{"text": …}`, which Slack, Mattermost, Discord's /slack path and
    /// ntfy take).
    #[arg(long, value_name = "FORMAT", default_value = "json", value_parser = ["json", "slack"])]
    pub(crate) format: String,
    /// Sign each webhook body with the secret in this environment variable
    /// of the dispatchers, named KANBAN_SECRET_… (no worker, agent or
    /// command gets one; never stored in the board).
    #[arg(
        long,
        value_name = "VAR",
        conflicts_with = "secret_file",
        requires = "webhook"
    )]
    pub(crate) secret_env: Option<String>,
    /// Sign each webhook body with the secret in this file (owner-only, or
    /// it is refused), read by the dispatchers.
    #[arg(long, value_name = "PATH", requires = "webhook")]
    pub(crate) secret_file: Option<PathBuf>,
    /// Print {"id": N}.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `kanban specify`'s and `kanban decompose`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct TriageArgs {
    /// The card (as `ls` lists it); or --all.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub(crate) id: Option<String>,
    /// Every card in triage, oldest first; exits 0 when at least one
    /// succeeded (or there was none), 1 when every one failed.
    #[arg(long)]
    pub(crate) all: bool,
    /// With --all, only the cards of this tenant.
    #[arg(long, value_name = "NAME", requires = "all")]
    pub(crate) tenant: Option<String>,
    /// The agent of the agents file that answers (default: the file's
    /// `triage_agent`).
    #[arg(long, value_name = "NAME")]
    pub(crate) agent: Option<String>,
    /// Who the note on the card names (default $HERMES_PROFILE, else
    /// $USER, else the command's name).
    #[arg(long, value_name = "NAME")]
    pub(crate) author: Option<String>,
    /// The longest the agent may take to answer.
    #[arg(long, value_name = "DURATION", default_value = "3m")]
    pub(crate) timeout: String,
    /// One JSON object per card on stdout: task_id, ok, reason, new_title
    /// (and for decompose: fanout, child_ids).
    #[arg(long)]
    pub(crate) json: bool,
}

/// `kanban swarm`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct SwarmArgs {
    /// What the swarm is for: every card carries it, and the root's title
    /// is its first line.
    pub(crate) goal: String,
    /// A parallel worker card: its assignee and title (repeat for each).
    #[arg(long = "worker", value_name = "ASSIGNEE:TITLE", required = true, value_parser = swarm_worker)]
    pub(crate) workers: Vec<kanban_core::swarm::SwarmWorker>,
    /// Who verifies the workers' outputs (the card waits for every worker).
    #[arg(long, value_name = "NAME")]
    pub(crate) verifier: String,
    /// Who turns the verified outputs into the deliverable (the card waits
    /// for the verifier).
    #[arg(long, value_name = "NAME")]
    pub(crate) synthesizer: String,
    /// The maker named on every card (default $USER, else `human`).
    #[arg(long, value_name = "NAME")]
    pub(crate) created_by: Option<String>,
    /// Higher runs first, for every card of the swarm.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) priority: i64,
    /// A second swarm with the same key prints the first one's cards.
    #[arg(long, value_name = "KEY")]
    pub(crate) idempotency_key: Option<String>,
    /// One JSON object: root_id, worker_ids, verifier_id, synthesizer_id,
    /// and made (false when the key found an earlier swarm).
    #[arg(long)]
    pub(crate) json: bool,
}

fn swarm_worker(raw: &str) -> Result<kanban_core::swarm::SwarmWorker, String> {
    kanban_core::swarm::SwarmWorker::parse(raw)
}

fn severity(raw: &str) -> Result<kanban_core::diagnostics::Severity, String> {
    kanban_core::diagnostics::Severity::parse(raw)
        .ok_or_else(|| format!("unknown severity {raw:?}: use warning, error or critical"))
}

/// A tenant or maker name, trimmed.
fn label(raw: &str) -> Result<String, String> {
    let name = raw.trim();
    kanban_core::events::check_label(name).map(|()| name.to_owned())
}

fn block_kind(raw: &str) -> Result<kanban_core::BlockKind, String> {
    kanban_core::BlockKind::parse(raw).ok_or_else(|| {
        let names: Vec<_> = kanban_core::BlockKind::ALL
            .iter()
            .map(|kind| kind.as_str())
            .collect();
        format!("unknown kind {raw:?}: use one of {}", names.join(", "))
    })
}

/// A JSON object, as `--metadata` takes it.
fn json_object(raw: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::Object(object)) => Ok(object),
        Ok(_) => Err("not a JSON object: give one like '{\"tests_run\": 12}'".to_owned()),
        Err(error) => Err(format!(
            "not JSON ({error}): give an object like '{{\"tests_run\": 12}}'"
        )),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every command says what it does, every flag and argument what it is,
    /// and docs/cli.md names every command.
    #[test]
    fn every_help_entry_is_filled_in_and_documented() {
        let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md"))
            .expect("docs/cli.md");
        let mut missing = Vec::new();
        let mut walk = vec![(String::from("kanban"), Cli::command())];
        while let Some((path, command)) = walk.pop() {
            if command.is_hide_set() {
                continue;
            }
            if command.get_about().is_none() {
                missing.push(format!("{path}: no about"));
            }
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() {
                    missing.push(format!("{path} {id}: no help"));
                }
            }
            for sub in command.get_subcommands() {
                let name = sub.get_name().to_owned();
                let listed = docs.contains(&format!("`{name}"));
                if path == "kanban" && name != "help" && !sub.is_hide_set() && !listed {
                    missing.push(format!("docs/cli.md does not name `{name}`"));
                }
                walk.push((format!("{path} {name}"), sub.clone()));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
