//! Board administration: init, add, ls, show, events, claim, unblock, reclaim.

use std::sync::Arc;

use anyhow::bail;
use kanban_board_sqlite::{SqliteBoard, SystemClock};
use kanban_core::ExitCode;
use kanban_core::rules::{Change, Start};
use kanban_core::swarm::{Swarm, Swarmed};
use kanban_core::{Claim, Clock, Environment, NewTask, TaskStatus, claim_ttl_seconds, vars};
use serde_json::json;

use crate::agents_file::{agents_file_path, load, names};
use crate::args::{AddArgs, EditArgs, GlobalArgs, SwarmArgs};
use crate::board_path::{
    OpenBoard, Schema, board_path, board_slug, open_board, open_board_for_reading, open_board_with,
    postgres_url,
};
use crate::duration::parse_moment;
use crate::out::{errln, out, outln};
use crate::output::{
    event_json, human_time, run_json, short, span, table, task_json, visible, visible_line,
    wait_note, walls_table,
};
use crate::runtime::block_on;

pub(crate) fn init(global: &GlobalArgs, env: &Environment) -> anyhow::Result<ExitCode> {
    let path = board_path(global, env)?;
    if postgres_url(&path).is_some() {
        // Connecting creates the schema (or upgrades an older one).
        let board = open_board_with(global, env, Schema::Upgrade)?;
        outln!(
            "board is ready: {} (PostgreSQL, schema {})",
            board.name(),
            kanban_board_postgres::SCHEMA_VERSION
        );
        return Ok(ExitCode::Success);
    }
    let existed = path.exists();
    let board = SqliteBoard::create(&path, Arc::new(SystemClock))?;
    if !existed && let Ok(home) = crate::board_path::home(env) {
        home.mark_default_board(board.path())?;
    }
    let verb = if existed {
        "board is ready"
    } else {
        "created board"
    };
    outln!("{verb}: {}", board.path().display());
    Ok(ExitCode::Success)
}

pub(crate) fn migrate(global: &GlobalArgs, env: &Environment) -> anyhow::Result<ExitCode> {
    let path = board_path(global, env)?;
    if postgres_url(&path).is_some() {
        // `migrate` opens a PostgreSQL board to upgrade it, in one
        // transaction under an advisory lock; there is no file to back up.
        let board = open_board_with(global, env, Schema::Upgrade)?;
        outln!(
            "{} is up to date (schema {})",
            board.name(),
            kanban_board_postgres::SCHEMA_VERSION
        );
        return Ok(ExitCode::Success);
    }
    let upgrade = SqliteBoard::upgrade(&path, Arc::new(SystemClock))?;
    match &upgrade.backup {
        None => outln!(
            "{} is up to date (schema {}); nothing to do",
            upgrade.path.display(),
            upgrade.to
        ),
        Some(backup) => outln!(
            "upgraded {} from schema {} to {}; the board as it was is kept at {}",
            upgrade.path.display(),
            upgrade.from,
            upgrade.to,
            backup.display()
        ),
    }
    Ok(ExitCode::Success)
}

pub(crate) fn add(
    global: &GlobalArgs,
    env: &Environment,
    args: &AddArgs,
) -> anyhow::Result<ExitCode> {
    let now = SystemClock.now();
    let not_before = args
        .not_before
        .as_deref()
        .map(|raw| parse_moment(raw, now))
        .transpose()
        .map_err(|problem| anyhow::anyhow!("--not-before: {problem}"))?;
    let mut new = NewTask {
        not_before,
        every_seconds: args.every,
        title: args.title.clone(),
        body: args.body.clone(),
        assignee: args.assignee.clone(),
        priority: args.priority,
        parents: args.parents.clone(),
        goal_mode: args.goal,
        goal_max_turns: args.goal_max_turns,
        max_retries: args.max_retries,
        idempotency_key: args.idempotency_key.clone(),
        start: if args.blocked {
            Start::Blocked
        } else if args.triage {
            Start::Triage
        } else {
            Start::InLine
        },
        max_runtime_seconds: args.max_runtime,
        created_by: args.created_by.clone(),
        tenant: args.tenant.clone(),
        workspace: None,
        branch: None,
    };
    // Inside an agent, a card is the run's fan-out: fenced by its claim,
    // and it waits for the run's card.
    if let Ok(claim) = Claim::from_env(env) {
        let on_file = !claim.db.contains("://");
        let mut agents_workspace = None;
        if let Some(folder) = std::path::Path::new(&claim.db).parent().filter(|_| on_file) {
            agents_workspace = check_assignee(global, env, folder, args.assignee.as_deref())?;
        }
        (new.workspace, new.branch) = workspace_for_add(args, agents_workspace.as_deref())?;
        return crate::agent_calls::create(env, &claim, new, args.json);
    }
    let board = open_board(global, env)?;
    let agents_workspace = check_assignee(global, env, &board.folder, args.assignee.as_deref())?;
    (new.workspace, new.branch) = workspace_for_add(args, agents_workspace.as_deref())?;
    let id = block_on(board.create_task(&new))?;
    if args.json {
        outln!("{}", json!({"id": id}));
    } else {
        outln!("{id}");
    }
    Ok(ExitCode::Success)
}

fn parse_status(raw: &str) -> anyhow::Result<TaskStatus> {
    TaskStatus::parse(raw.trim()).ok_or_else(|| {
        let names: Vec<_> = TaskStatus::ALL.iter().map(|s| s.as_str()).collect();
        anyhow::anyhow!("unknown status {raw:?}: use one of {}", names.join(", "))
    })
}

/// Runs `one` on each of `ids` (the seed system's bulk form): every id is
/// looked up first, so an unknown one changes nothing; then each card is
/// changed on its own, a refusal said and the rest still done, and the
/// exit is 1 when any was refused.
pub(crate) fn each_card(
    global: &GlobalArgs,
    env: &Environment,
    ids: &[String],
    mut one: impl FnMut(&str) -> anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    let resolved: Vec<String> = {
        let board = open_board_for_reading(global, env)?;
        ids.iter()
            .map(|id| card_id(&board, id))
            .collect::<anyhow::Result<_>>()?
    };
    if let [only] = resolved.as_slice() {
        return one(only);
    }
    let mut worst = ExitCode::Success;
    for id in &resolved {
        match one(id) {
            Ok(ExitCode::Success) => {}
            Ok(code) => worst = code,
            Err(error) => {
                errln!("error: {id}: {error:#}");
                worst = ExitCode::Failure;
            }
        }
    }
    Ok(worst)
}

/// An operator's change to one card.
pub(crate) enum Operation<'a> {
    Cancel(&'a str),
    /// Archive, and take its workspace away unless `keep_workspaces`.
    Archive {
        keep_workspaces: bool,
    },
    Hold(&'a str),
    Release,
    Triage(&'a str),
    Review(&'a str),
}

/// `kanban cancel|archive|hold|release ID`.
pub(crate) fn operate(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    operation: Operation<'_>,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = &card_id(&board, id)?;
    let done = match operation {
        Operation::Cancel(reason) => {
            block_on(board.cancel(id, reason))?;
            "cancelled (archived; a running worker is stopped by its dispatcher)"
        }
        Operation::Archive { keep_workspaces } => {
            let task = block_on(board.show_task(id))?.task;
            block_on(board.archive(id))?;
            if !keep_workspaces {
                retire_workspace(&board, &task, env);
            }
            "archived"
        }
        Operation::Hold(reason) => {
            block_on(board.hold(id, reason))?;
            "held (scheduled): it is not claimed until `kanban release`"
        }
        Operation::Release => {
            block_on(board.release_hold(id))?;
            let status = block_on(board.show_task(id))?.task.status;
            outln!("{id} released: {status}");
            return Ok(ExitCode::Success);
        }
        Operation::Triage(reason) => {
            block_on(board.triage(id, given(reason)))?;
            "in triage: it is not claimed until `kanban promote`"
        }
        Operation::Review(reason) => {
            block_on(board.review(id, given(reason)))?;
            "up for review: a dispatcher claims it for its assignee"
        }
    };
    outln!("{id} {done}");
    Ok(ExitCode::Success)
}

/// A reason in words, none when blank.
fn given(reason: &str) -> Option<&str> {
    Some(reason.trim()).filter(|reason| !reason.is_empty())
}

/// `kanban schedule ID [REASON…] [--not-before TIME]`.
pub(crate) fn schedule(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    reason: &[String],
    not_before: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let now = SystemClock.now();
    let not_before = not_before
        .map(|raw| parse_moment(raw, now))
        .transpose()
        .map_err(|problem| anyhow::anyhow!("--not-before: {problem}"))?;
    let board = open_board(global, env)?;
    let id = &card_id(&board, id)?;
    let reason = reason.join(" ");
    block_on(board.schedule(id, given(&reason), not_before))?;
    match not_before {
        Some(at) => outln!(
            "{id} scheduled: back in line {}",
            wait_note(Some(at), false, now).unwrap_or_else(|| "at once".to_owned())
        ),
        None => outln!("{id} scheduled: it waits for `kanban unblock`"),
    }
    Ok(ExitCode::Success)
}

/// `kanban promote ID [REASON…] [--force] [--dry-run] [--json]`.
pub(crate) fn promote(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    reason: &[String],
    force: bool,
    dry_run: bool,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = &card_id(&board, id)?;
    let reason = reason.join(" ");
    block_on(board.promote(id, given(&reason), force, dry_run))?;
    if as_json {
        outln!(
            "{}",
            json!({"id": id, "promoted": !dry_run, "dry_run": dry_run})
        );
    } else if dry_run {
        outln!("{id} would be promoted to ready (dry run: nothing changed)");
    } else {
        outln!("{id} promoted: ready");
    }
    if force && !as_json {
        // As in the seed system, a claim still sends a card whose parent
        // is open back to todo: say so, and how to run it first.
        let mut open = Vec::new();
        for parent in block_on(board.show_task(id))?.parents {
            let status = block_on(board.show_task(&parent))?.task.status;
            if !matches!(
                status.known(),
                Some(TaskStatus::Done | TaskStatus::Archived)
            ) {
                open.push(parent);
            }
        }
        if !open.is_empty() {
            outln!(
                "note: it still waits for {}: a claim sends it back to todo until then (`kanban unlink PARENT {id}` to run it first)",
                open.join(", ")
            );
        }
    }
    Ok(ExitCode::Success)
}

/// `kanban swarm GOAL --worker ASSIGNEE:TITLE … --verifier --synthesizer`.
pub(crate) fn swarm(
    global: &GlobalArgs,
    env: &Environment,
    args: &SwarmArgs,
) -> anyhow::Result<ExitCode> {
    if crate::in_run(env) {
        bail!(
            "kanban swarm makes cards outside any run, and this is inside one (the claim carrier is set); fan out with `kanban create` instead"
        );
    }
    let created_by = args
        .created_by
        .as_deref()
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .or_else(|| env.get_trimmed("USER"))
        .unwrap_or("human");
    let swarm = Swarm {
        goal: args.goal.clone(),
        workers: args.workers.clone(),
        verifier: args.verifier.clone(),
        synthesizer: args.synthesizer.clone(),
        created_by: created_by.to_owned(),
        priority: args.priority,
        idempotency_key: args.idempotency_key.clone(),
    };
    swarm.check()?;
    let board = open_board(global, env)?;
    let assignees = args.workers.iter().map(|w| w.assignee.as_str());
    for assignee in assignees.chain([args.verifier.as_str(), args.synthesizer.as_str()]) {
        check_assignee(global, env, &board.folder, Some(assignee))?;
    }
    let Swarmed { cards, made } = block_on(board.create_swarm(&swarm))?;
    if args.json {
        let mut shown = json!(cards);
        shown["made"] = json!(made);
        outln!("{shown}");
        return Ok(ExitCode::Success);
    }
    if !made {
        errln!(
            "an earlier swarm has the key {:?}: its cards, nothing new made",
            args.idempotency_key.as_deref().unwrap_or_default()
        );
    }
    outln!("root: {} (done; the swarm's notes)", cards.root_id);
    outln!("workers: {}", cards.worker_ids.join(", "));
    outln!("verifier: {}", cards.verifier_id);
    outln!("synthesizer: {}", cards.synthesizer_id);
    Ok(ExitCode::Success)
}

/// `kanban link|unlink PARENT CHILD`.
pub(crate) fn link(
    global: &GlobalArgs,
    env: &Environment,
    parent: &str,
    child: &str,
    linking: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let parent = &card_id(&board, parent)?;
    let child = &card_id(&board, child)?;
    if linking {
        let said = if block_on(board.link(parent, child))? {
            "now waits for"
        } else {
            "already waits for"
        };
        outln!("{child} {said} {parent}");
    } else if block_on(board.unlink(parent, child))? {
        let status = block_on(board.show_task(child))?.task.status;
        outln!("{child} no longer waits for {parent} (it is {status})");
    } else {
        bail!("{child} does not wait for {parent}: there is no such link to remove");
    }
    Ok(ExitCode::Success)
}

/// The card `given` names: its id, or (as git takes a short hash) a unique
/// start of one, with or without its `t_`.
pub(crate) fn card_id(board: &OpenBoard, given: &str) -> anyhow::Result<String> {
    match block_on(board.show_task(given)) {
        Ok(_) => return Ok(given.to_owned()),
        Err(kanban_core::BoardError::TaskNotFound(_)) => {}
        Err(other) => return Err(other.into()),
    }
    let short = given.strip_prefix("t_").unwrap_or(given);
    if short.is_empty() {
        return Err(kanban_core::BoardError::TaskNotFound(given.to_owned()).into());
    }
    let found: Vec<String> = block_on(board.list_tasks(None))?
        .into_iter()
        .map(|task| task.id)
        .filter(|id| id.strip_prefix("t_").unwrap_or(id).starts_with(short))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(kanban_core::BoardError::TaskNotFound(given.to_owned()).into()),
        many => {
            let shown = many.iter().take(10).cloned().collect::<Vec<_>>().join(", ");
            let more = match many.len() {
                ..=10 => String::new(),
                count => format!(" and {} more", count - 10),
            };
            bail!(
                "{} starts {} card ids ({shown}{more}): give more of it",
                visible_line(given),
                many.len()
            )
        }
    }
}

/// With an agents file, an assignee must name one of its agents: a typo is
/// caught when it is written, not by a card that never runs.
/// The workspace `add` gives a card: its own, else its agent's (the
/// agents file's `workspace`), checked against the world.
fn workspace_for_add(
    args: &AddArgs,
    agents_workspace: Option<&str>,
) -> anyhow::Result<(
    Option<kanban_core::workspaces::WorkspaceSpec>,
    Option<String>,
)> {
    let named = args.workspace.is_some() || args.repo.is_some();
    let spec = if named {
        args.workspace.as_deref()
    } else {
        agents_workspace
    };
    crate::workspace::for_add(spec, args.repo.as_deref(), args.branch.as_deref()).map_err(|error| {
        match (named, agents_workspace) {
            (false, Some(given)) => error.context(format!("the agent's workspace {given:?}")),
            _ => error,
        }
    })
}

/// Checks `assignee` against the agents file, when there is one; the
/// workspace its agent gives the cards that name none.
fn check_assignee(
    global: &GlobalArgs,
    env: &Environment,
    folder: &std::path::Path,
    assignee: Option<&str>,
) -> anyhow::Result<Option<String>> {
    let Some(assignee) = assignee.map(str::trim).filter(|a| !a.is_empty()) else {
        return Ok(None);
    };
    let Some(path) = agents_file_path(global.agents.as_deref(), folder) else {
        return Ok(None);
    };
    let file = load(&path, env).map_err(anyhow::Error::msg)?;
    let Some(agent) = file.agents.get(assignee) else {
        bail!(
            "--assignee {assignee}: no agent of that name in {} ({}); add it there, or pick one of those",
            path.display(),
            names(&file.agents)
        );
    };
    Ok(agent.workspace.clone())
}

/// `kanban edit ID …`.
/// The workspace `edit` gives a card, checked against the world as
/// `add` checks it; none when no workspace option is given.
fn edited_workspace(args: &EditArgs) -> anyhow::Result<Option<kanban_core::rules::WorkspaceEdit>> {
    if args.workspace.is_none() && args.repo.is_none() && args.branch.is_none() {
        return Ok(None);
    }
    if args.workspace.is_none() && args.repo.is_none() {
        anyhow::bail!(
            "--branch is for a worktree workspace: add --workspace worktree:REPO (or --repo REPO)"
        );
    }
    let (spec, branch) = crate::workspace::for_add(
        args.workspace.as_deref(),
        args.repo.as_deref(),
        args.branch.as_deref(),
    )?;
    Ok(spec.map(|spec| kanban_core::rules::WorkspaceEdit { spec, branch }))
}

pub(crate) fn edit(
    global: &GlobalArgs,
    env: &Environment,
    args: &EditArgs,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = card_id(&board, &args.id)?;
    check_assignee(global, env, &board.folder, args.assignee.as_deref())?;
    let change = kanban_core::rules::CardEdit {
        title: args.title.clone(),
        body: args.body.clone(),
        priority: args.priority,
        assignee: args.assignee.as_ref().map_or(Change::Keep, |name| {
            Change::to(Some(name.trim().to_owned()).filter(|name| !name.is_empty()))
        }),
        tenant: args.tenant.as_ref().map_or(Change::Keep, |name| {
            Change::to(Some(name.trim().to_owned()).filter(|name| !name.is_empty()))
        }),
        max_retries: args.max_retries.map_or(Change::Keep, Change::Set),
        max_runtime_seconds: args.max_runtime.map_or(Change::Keep, Change::Set),
        result: args.result.clone(),
        summary: args.summary.clone(),
        metadata: args.metadata.clone(),
        workspace: edited_workspace(args)?,
    };
    block_on(board.edit(&id, &change))?;
    outln!("{id} edited: {}", change.fields().join(", "));
    Ok(ExitCode::Success)
}

/// `kanban prune --older-than D [--dry-run]`: the cards and their logs.
/// The board path its cards' scratch folders are found by: a PostgreSQL
/// board's are in its folder on this host.
pub(crate) fn workspace_db(board: &OpenBoard) -> std::path::PathBuf {
    let name = board.name();
    match postgres_url(std::path::Path::new(&name)) {
        Some(_) => board.folder.join("kanban.db"),
        None => std::path::PathBuf::from(name),
    }
}

/// Takes an archived or pruned card's workspace away ([`crate::workspace::retire`]),
/// saying what it kept.
fn retire_workspace(board: &OpenBoard, task: &kanban_core::TaskRecord, env: &Environment) {
    let db = workspace_db(board);
    if let Some(said) = crate::workspace::retire(task, &db, env) {
        errln!("{}: {said}", task.id);
    }
}

pub(crate) fn prune(
    global: &GlobalArgs,
    env: &Environment,
    older_than: i64,
    dry_run: bool,
    keep_workspaces: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let before = SystemClock.now().saturating_sub(older_than);
    // Their workspaces are read before their rows go.
    let going = if dry_run || keep_workspaces {
        Vec::new()
    } else {
        let ids = block_on(board.prune(before, true))?;
        ids.iter()
            .filter_map(|id| block_on(board.show_task(id)).ok().map(|view| view.task))
            .collect()
    };
    let ids = block_on(board.prune(before, dry_run))?;
    for task in going.iter().filter(|task| ids.contains(&task.id)) {
        retire_workspace(&board, task, env);
    }
    if !dry_run {
        let logs = board.folder.join("logs");
        let files = crate::attach::board_attachments_root(global, env, &board)?;
        for id in &ids {
            // Its attached files went with its rows.
            if kanban_core::is_valid_task_id(id) {
                let _ = std::fs::remove_dir_all(files.join(id));
            }
            let log = crate::supervisor::log_path(&logs, id);
            let _ = std::fs::remove_file(&log);
            // Our link where the seed system looks, not its own log.
            if let Some(seed) = crate::supervisor::seed_logs(&logs) {
                let link = crate::supervisor::log_path(&seed, id);
                if std::fs::symlink_metadata(&link).is_ok_and(|meta| meta.is_symlink()) {
                    let _ = std::fs::remove_file(link);
                }
            }
            let mut older = log.into_os_string();
            older.push(".1");
            let _ = std::fs::remove_file(older);
        }
    }
    for id in &ids {
        outln!("{id}");
    }
    let verb = if dry_run { "would prune" } else { "pruned" };
    errln!(
        "{verb} {} card(s) done or archived with no activity for {older_than}s",
        ids.len()
    );
    Ok(ExitCode::Success)
}

/// Which cards `kanban ls` lists.
#[derive(Debug)]
pub(crate) struct ListFilter<'a> {
    pub(crate) status: Option<&'a str>,
    /// An agent's name, or `-` for cards with no assignee.
    pub(crate) assignee: Option<&'a str>,
    /// A card whose children are listed.
    pub(crate) parent: Option<&'a str>,
    pub(crate) archived: bool,
    /// Only cards whose last block was of this kind.
    pub(crate) block_kind: Option<kanban_core::BlockKind>,
    /// Only the cards of this tenant.
    pub(crate) tenant: Option<&'a str>,
    /// The order (`ls --sort`); oldest first without.
    pub(crate) sort: Option<&'a str>,
}

pub(crate) fn list(
    global: &GlobalArgs,
    env: &Environment,
    filter: &ListFilter<'_>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let status = filter.status.map(parse_status).transpose()?;
    let board = open_board_for_reading(global, env)?;
    let mut tasks = block_on(board.list_tasks(status))?;
    // Archived cards are out of the way unless asked for.
    if !filter.archived && status.is_none() {
        tasks.retain(|task| task.status != TaskStatus::Archived);
    }
    if let Some(kind) = filter.block_kind {
        tasks.retain(|task| task.block_kind.as_deref() == Some(kind.as_str()));
    }
    if let Some(assignee) = filter.assignee {
        tasks.retain(|task| task.assignee.as_deref().unwrap_or("-") == assignee);
    }
    if let Some(tenant) = filter.tenant {
        tasks.retain(|task| task.tenant.as_deref() == Some(tenant));
    }
    sort_cards(&mut tasks, filter.sort);
    let links = block_on(board.links())?;
    if let Some(parent) = filter.parent {
        let parent = card_id(&board, parent)?;
        let children: std::collections::BTreeSet<&str> = links
            .iter()
            .filter(|(of, _)| *of == parent)
            .map(|(_, child)| child.as_str())
            .collect();
        tasks.retain(|task| children.contains(task.id.as_str()));
    }
    let now = SystemClock.now();
    if as_json {
        outln!(
            "{}",
            serde_json::Value::Array(tasks.iter().map(task_json).collect())
        );
        return Ok(ExitCode::Success);
    }
    let waits = open_parents(&board, &tasks, &links)?;
    // A card that is not running shows the run it ran last.
    let last_runs = block_on(board.last_runs())?;
    // A board with tenants shows each card's; one without keeps its columns.
    let tenants = tasks.iter().any(|t| t.tenant.is_some());
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            let mut status = status_line(t, now);
            if let Some(parents) = waits.get(&t.id) {
                status.push_str(&format!(", waits for {}", parents.join(", ")));
            }
            let mut row = vec![
                t.id.clone(),
                status,
                t.priority.to_string(),
                short(t.assignee.as_deref().unwrap_or("-"), 20),
            ];
            if tenants {
                row.push(short(t.tenant.as_deref().unwrap_or("-"), 20));
            }
            row.push(
                t.current_run_id
                    .or_else(|| last_runs.get(&t.id).copied())
                    .map_or_else(|| "-".into(), |run| run.to_string()),
            );
            row.push(short(&t.title, 60));
            row
        })
        .collect();
    let header: &[&str] = if tenants {
        &["ID", "STATUS", "PRIO", "ASSIGNEE", "TENANT", "RUN", "TITLE"]
    } else {
        &["ID", "STATUS", "PRIO", "ASSIGNEE", "RUN", "TITLE"]
    };
    out!("{}", table(header, &rows));
    let walls = block_on(board.walls())?;
    let holding = walls.iter().filter(|wall| wall.until > now).count();
    if !walls.is_empty() {
        outln!(
            "{} provider wall(s), {holding} holding cards now: kanban walls",
            walls.len()
        );
    }
    Ok(ExitCode::Success)
}

/// The parents each `todo` card of `tasks` still waits for (those not
/// done), from the board's `links`; the cards' statuses are read only when
/// some card has parents.
fn open_parents(
    board: &OpenBoard,
    tasks: &[kanban_core::TaskRecord],
    links: &[(String, String)],
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<String>>> {
    let mut waits = std::collections::BTreeMap::new();
    let mut statuses: Option<std::collections::BTreeMap<String, kanban_core::CardStatus>> = None;
    let mut parents_of = std::collections::BTreeMap::<&str, Vec<String>>::new();
    for (parent, child) in links {
        parents_of
            .entry(child.as_str())
            .or_default()
            .push(parent.clone());
    }
    for task in tasks.iter().filter(|task| task.status == TaskStatus::Todo) {
        let Some(parents) = parents_of.remove(task.id.as_str()) else {
            continue;
        };
        let statuses = match &mut statuses {
            Some(statuses) => statuses,
            None => statuses.insert(
                block_on(board.list_tasks(None))?
                    .into_iter()
                    .map(|task| (task.id, task.status))
                    .collect(),
            ),
        };
        let open: Vec<String> = parents
            .into_iter()
            .filter(|parent| {
                statuses
                    .get(parent)
                    .is_none_or(|status| *status != TaskStatus::Done)
            })
            .collect();
        if !open.is_empty() {
            waits.insert(task.id.clone(), open);
        }
    }
    Ok(waits)
}

/// `kanban walls`: the provider walls of the board.
pub(crate) fn walls(
    global: &GlobalArgs,
    env: &Environment,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let walls = block_on(board.walls())?;
    let now = SystemClock.now();
    if as_json {
        let rows: Vec<serde_json::Value> = walls.iter().map(|wall| wall_json(wall, now)).collect();
        outln!("{}", serde_json::Value::Array(rows));
        return Ok(ExitCode::Success);
    }
    if walls.is_empty() {
        outln!("no provider walls: every agent's cards may be claimed");
        return Ok(ExitCode::Success);
    }
    out!("{}", walls_table(&walls, now));
    Ok(ExitCode::Success)
}

/// `kanban comment TASK TEXT`: a human's comment, outside any run.
pub(crate) fn comment(
    global: &GlobalArgs,
    env: &Environment,
    task: &str,
    text: &str,
    author: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let task = &card_id(&board, task)?;
    let author = author
        .map(str::trim)
        .filter(|author| !author.is_empty())
        .or_else(|| env.get_trimmed("USER"))
        .unwrap_or("human");
    block_on(board.add_comment(task, author, text))?;
    outln!("{task} commented");
    Ok(ExitCode::Success)
}

/// A card's files, one line each, as `show` lists them.
fn print_attachments(id: &str, attachments: &[kanban_core::attachments::AttachmentRecord]) {
    if attachments.is_empty() {
        return;
    }
    outln!("attachments (kanban attachments {id}):");
    for attachment in attachments {
        outln!(
            "  #{} {} ({} bytes)",
            attachment.id,
            visible_line(&attachment.filename),
            attachment.size
        );
    }
}

/// Puts cards in `ls --sort`'s order (a stable sort: ties stay oldest first).
fn sort_cards(tasks: &mut [kanban_core::TaskRecord], order: Option<&str>) {
    match order {
        Some("created-desc") => tasks.reverse(),
        Some("priority") => tasks.sort_by_key(|task| std::cmp::Reverse(task.priority)),
        Some("priority-desc") => tasks.sort_by_key(|task| task.priority),
        Some("assignee") => tasks.sort_by(|a, b| a.assignee.cmp(&b.assignee)),
        Some("status") => tasks.sort_by(|a, b| a.status.as_str().cmp(b.status.as_str())),
        Some("title") => tasks.sort_by(|a, b| a.title.cmp(&b.title)),
        _ => {}
    }
}

/// `kanban reassign ID NAME [--reclaim]`: the seed system's reassign. A
/// running card is refused unless reclaimed first.
pub(crate) fn reassign(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    name: &str,
    reclaim: bool,
    reason: &str,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = card_id(&board, id)?;
    let name = name.trim();
    let to = (!name.eq_ignore_ascii_case("none") && !name.is_empty()).then(|| name.to_owned());
    check_assignee(global, env, &board.folder, to.as_deref())?;
    let running = block_on(board.show_task(&id))?.task.status == TaskStatus::Running;
    if running && !reclaim {
        bail!("{id} is running: give --reclaim to take it back from its worker and reassign it");
    }
    // The new assignee first, then the reclaim: a card ready again is
    // never claimed for the old one in between.
    let change = kanban_core::rules::CardEdit {
        assignee: Change::to(to.clone()),
        ..kanban_core::rules::CardEdit::default()
    };
    block_on(board.edit(&id, &change))?;
    if running {
        block_on(board.reclaim(&id, reason))?;
    }
    match to {
        Some(to) => outln!("{id} reassigned to {to}"),
        None => outln!("{id} unassigned"),
    }
    Ok(ExitCode::Success)
}

/// `kanban walls --lift SCOPE`.
pub(crate) fn lift_wall(
    global: &GlobalArgs,
    env: &Environment,
    scope: &str,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    if block_on(board.lift_wall(scope))? {
        outln!("lifted the wall on {scope}: its cards may be claimed at once");
        Ok(ExitCode::Success)
    } else {
        bail!("no provider wall on {scope:?}; `kanban walls` lists them")
    }
}

pub(crate) fn wall_json(wall: &kanban_core::walls::Wall, now: i64) -> serde_json::Value {
    json!({
        "scope": wall.scope, "kind": wall.kind.as_str(), "agent": wall.route,
        "since": wall.since, "until": wall.until, "holding": wall.until > now,
        "reason": wall.reason, "source": wall.source, "hits": wall.hits,
        "failed_probes": wall.failed_probes, "probe_run": wall.probe_run,
    })
}

pub(crate) fn show(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let id = &card_id(&board, id)?;
    let view = block_on(board.show_task(id))?;
    let now = SystemClock.now();
    // The walls this card met last (a wall names the card and run that
    // hit it): why the card, and its agent's other cards, wait.
    let met: Vec<_> = block_on(board.walls())?
        .into_iter()
        .filter(|wall| crate::output::wall_met_by(wall, &view.task.id))
        .collect();
    let linked = block_on(crate::serve::linked_statuses(&board, &view))?;
    let attachments = &view.attachments;
    if as_json {
        let value = json!({
            "attachments": attachments.iter().map(crate::attach::attachment_json).collect::<Vec<_>>(),
            "task": task_json(&view.task),
            "parents": view.parents,
            "children": view.children,
            "linked_statuses": linked,
            "runs": view.runs.iter().map(run_json).collect::<Vec<_>>(),
            "events": view.events.iter().map(event_json).collect::<Vec<_>>(),
            "comments": view.comments,
            "walls": met.iter().map(|wall| wall_json(wall, now)).collect::<Vec<_>>(),
        });
        outln!("{value}");
        return Ok(ExitCode::Success);
    }
    let task = &view.task;
    outln!("{}  {}", visible_line(&task.id), visible_line(&task.title));
    outln!(
        "status: {}   priority: {}   failures: {}",
        status_line(task, now),
        task.priority,
        task.consecutive_failures
    );
    out!("{}", whom_and_why(&view, &linked));
    print_workspace(task);
    print_attachments(id, attachments);
    if !met.is_empty() {
        outln!("met a provider wall (it holds every card of that provider; kanban walls):");
        out!("{}", walls_table(&met, now));
    }
    if let Some(body) = &task.body {
        outln!("\n{}\n", visible(body));
    }
    if let Some(lock) = &task.claim_lock {
        outln!(
            "claim: run {} lock {} expires {}",
            task.current_run_id.unwrap_or(0),
            visible_line(lock),
            task.claim_expires
                .map_or_else(|| "-".to_owned(), |at| human_time(at, now))
        );
    }
    if let Some(result) = &task.result {
        outln!("result: {}", short(result, 200));
    }
    outln!("\nruns:");
    print_runs(&view.runs);
    outln!("\nevents:");
    out!("{}", events_table(&view.events, now));
    if !view.comments.is_empty() {
        outln!("\ncomments (newest last):");
        for comment in &view.comments {
            outln!(
                "  {} {}: {}",
                human_time(comment.created_at, now),
                visible_line(&comment.author),
                visible(&comment.body)
            );
        }
    }
    Ok(ExitCode::Success)
}

/// `show`'s lines on whom a card is for and why it stands where it stands:
/// its assignee, its parents and children with their statuses, why it is blocked or was
/// cancelled.
fn whom_and_why(
    view: &kanban_core::TaskView,
    linked: &std::collections::BTreeMap<String, String>,
) -> String {
    let task = &view.task;
    let mut lines = String::new();
    if let Some(assignee) = &task.assignee {
        lines.push_str(&format!("assignee: {}\n", visible_line(assignee)));
    }
    if let Some(maker) = &task.created_by {
        lines.push_str(&format!("created by: {}\n", visible_line(maker)));
    }
    if let Some(tenant) = &task.tenant {
        lines.push_str(&format!("tenant: {}\n", visible_line(tenant)));
    }
    for (label, ids) in [("parents", &view.parents), ("children", &view.children)] {
        if ids.is_empty() {
            continue;
        }
        let cards: Vec<String> = ids
            .iter()
            .map(|id| format!("{id} ({})", linked.get(id).map_or("gone", String::as_str)))
            .collect();
        lines.push_str(&format!("{label}: {}\n", visible_line(&cards.join(", "))));
    }
    if task.status == TaskStatus::Blocked
        && let Some(reason) = blocked_reason(view)
    {
        lines.push_str(&format!("blocked: {}\n", visible_line(&reason)));
    }
    if task.status == TaskStatus::Archived
        && let Some(reason) = last_reason(view, "cancelled")
    {
        lines.push_str(&format!("cancelled: {}\n", visible_line(&reason)));
    }
    lines
}

/// Why a blocked card is blocked: the reason of its last `blocked` event
/// (its agent's, an operator's), else its last failure.
fn blocked_reason(view: &kanban_core::TaskView) -> Option<String> {
    last_reason(view, "blocked").or_else(|| view.task.last_failure_error.clone())
}

/// The reason of the card's last event of `kind`.
fn last_reason(view: &kanban_core::TaskView, kind: &str) -> Option<String> {
    view.events
        .iter()
        .rev()
        .find(|event| event.kind == kind)
        .and_then(|event| event.payload.get("reason")?.as_str().map(str::to_owned))
}

fn runs_table(runs: &[kanban_core::RunRecord]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                r.status.clone(),
                r.outcome.clone().unwrap_or_else(|| "-".into()),
                r.claim_lock.clone().unwrap_or_default(),
                short(
                    r.summary.as_deref().or(r.error.as_deref()).unwrap_or(""),
                    60,
                ),
            ]
        })
        .collect();
    table(&["RUN", "STATUS", "OUTCOME", "LOCK", "SUMMARY"], &rows)
}

fn events_table(events: &[kanban_core::EventRecord], now: i64) -> String {
    let rows: Vec<Vec<String>> = events
        .iter()
        .map(|e| {
            vec![
                e.id.to_string(),
                human_time(e.created_at, now),
                e.run_id
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| "-".into()),
                e.kind.clone(),
                if e.payload.is_null() {
                    String::new()
                } else {
                    short(&e.payload.to_string(), 80)
                },
            ]
        })
        .collect();
    table(&["EVENT", "AT", "RUN", "KIND", "PAYLOAD"], &rows)
}

/// The runs table, then each run's handoff metadata.
/// A card's workspace, when it has one other than a scratch folder.
fn print_workspace(task: &kanban_core::TaskRecord) {
    if task.workspace.is_none() {
        return;
    }
    outln!(
        "workspace: {}{}{}",
        visible_line(task.workspace_kind()),
        task.workspace_path()
            .map_or_else(String::new, |path| format!(":{}", visible_line(path))),
        task.branch_name()
            .map_or_else(String::new, |branch| format!(
                " (branch {})",
                visible_line(branch)
            ))
    );
}

fn print_runs(runs: &[kanban_core::RunRecord]) {
    out!("{}", runs_table(runs));
    for run in runs {
        if let Some(metadata) = &run.metadata {
            outln!(
                "run {} metadata: {}",
                run.id,
                visible_line(&metadata.to_string())
            );
        }
    }
}

/// `kanban runs ID [--status S] [--outcome O] [--json]`.
pub(crate) fn runs(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    [status, outcome]: [Option<String>; 2],
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let id = &card_id(&board, id)?;
    let view = block_on(board.show_task(id))?;
    let runs: Vec<kanban_core::RunRecord> = view
        .runs
        .into_iter()
        .filter(|run| status.as_ref().is_none_or(|wanted| &run.status == wanted))
        .filter(|run| {
            outcome
                .as_ref()
                .is_none_or(|wanted| run.outcome.as_ref() == Some(wanted))
        })
        .collect();
    if as_json {
        let runs: Vec<serde_json::Value> = runs.iter().map(run_json).collect();
        outln!("{}", serde_json::Value::Array(runs));
    } else if runs.is_empty() {
        errln!(
            "{id} has no runs{}",
            if status.is_some() || outcome.is_some() {
                " of that kind"
            } else {
                " yet"
            }
        );
    } else {
        print_runs(&runs);
    }
    Ok(ExitCode::Success)
}

pub(crate) fn events(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board_for_reading(global, env)?;
    let id = &card_id(&board, id)?;
    let view = block_on(board.show_task(id))?;
    if as_json {
        for event in &view.events {
            outln!("{}", event_json(event));
        }
    } else {
        out!("{}", events_table(&view.events, SystemClock.now()));
    }
    Ok(ExitCode::Success)
}

/// A lock naming this host and process, so an operator can tell claims apart.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

pub(crate) fn claim(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    ttl: Option<i64>,
    as_json: bool,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = &card_id(&board, id)?;
    let ttl = claim_ttl_seconds(ttl, env).map_err(anyhow::Error::msg)?;
    let Some(grant) = block_on(board.claim_task(id, ttl, &crate::supervisor::hand_claim_lock()))?
    else {
        let status = block_on(board.show_task(id))?.task.status;
        bail!(
            "task {id} is {} and cannot be claimed: only a ready card can be",
            status.as_str()
        );
    };
    let slug = board_slug(global, env)?;
    let claim = &grant.claim;
    if as_json {
        outln!(
            "{}",
            json!({"task_id": claim.task_id, "run_id": claim.run_id, "claim_lock": claim.claim_lock, "claim_expires": grant.claim_expires, "db": claim.db, "board": slug})
        );
    } else {
        for (name, value) in claim.to_env_pairs() {
            outln!("export {name}={}", shell_quote(&value));
        }
        for (name, value) in vars::under_both_names([(vars::BOARD, slug)]) {
            outln!("export {name}={}", shell_quote(&value));
        }
    }
    Ok(ExitCode::Success)
}

pub(crate) fn unblock(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = &card_id(&board, id)?;
    block_on(board.unblock(id))?;
    outln!(
        "{id} unblocked: {}",
        block_on(board.show_task(id))?.task.status.as_str()
    );
    Ok(ExitCode::Success)
}

pub(crate) fn reclaim(
    global: &GlobalArgs,
    env: &Environment,
    id: &str,
    reason: &str,
) -> anyhow::Result<ExitCode> {
    let board = open_board(global, env)?;
    let id = &card_id(&board, id)?;
    block_on(board.reclaim(id, reason))?;
    outln!(
        "{id} reclaimed: {}",
        block_on(board.show_task(id))?.task.status.as_str()
    );
    Ok(ExitCode::Success)
}

/// The kind of block a card waits on, while it does: blocked or sent to
/// triage by its blocks, or back in todo for a dependency. (The kind stays
/// stored after an unblock, for the unblock-loop breaker.)
fn blocked_for(task: &kanban_core::TaskRecord) -> Option<&str> {
    let kind = task.block_kind.as_deref()?;
    match task.status.known()? {
        TaskStatus::Blocked | TaskStatus::Triage => Some(kind),
        TaskStatus::Todo => (kind == "dependency").then_some(kind),
        _ => None,
    }
}

/// A card's status as `ls` and `show` say it: held, waiting, recurring.
fn status_line(task: &kanban_core::TaskRecord, now: i64) -> String {
    let mut line = task.status.as_str().to_owned();
    if let Some(kind) = blocked_for(task) {
        line.push_str(&format!(" ({})", visible_line(kind)));
    }
    if let Some(reason) = &task.held_reason {
        line.push_str(&format!(", held: {}", short(reason, 40)));
    }
    if let Some(note) = wait_note(task.not_before, task.last_failure_error.is_some(), now) {
        line.push_str(&format!(", {note}"));
    }
    if let Some(every) = task.every_seconds {
        line.push_str(&format!(", every {}", span(every)));
    }
    line
}
