//! `kanban specify` and `kanban decompose`: one agent of the agents file
//! answers a prompt about a card in triage, core reads the answer, and the
//! board writes the plan in one transaction (core's `triage`).

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use anyhow::bail;
use kanban_agent_port::{Activity, HttpAgent, HttpAgentConfig, OneShotCommand, SEED_WORKER_PREFIX};
use kanban_core::triage::{self, Prompt, Roster, RosterEntry, TriageCard, TriagePlan};
use kanban_core::{BoardError, Environment, ExitCode, TaskStatus};
use serde_json::json;

use crate::admin::card_id;
use crate::agents_file::{AgentCommand, AgentsFile, agents_file_path, load, names};
use crate::args::{GlobalArgs, TriageArgs};
use crate::board_path::{OpenBoard, open_board};
use kanban_board_sqlite::SystemClock;

use crate::out::{errln, outln};
use crate::runtime::block_on;

/// Which of the two is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    Specify,
    Decompose,
}

impl Ask {
    fn name(self) -> &'static str {
        match self {
            Self::Specify => "specify",
            Self::Decompose => "decompose",
        }
    }
}

/// How one card went.
struct Outcome {
    task_id: String,
    result: Result<Done, String>,
}

/// What was written for one card.
struct Done {
    status: TaskStatus,
    new_title: Option<String>,
    fanout: bool,
    child_ids: Vec<String>,
}

/// The agent that answers, as the agents file names it.
struct Answerer {
    name: String,
    /// Set on Ctrl-C: a command agent is stopped with its group.
    interrupt: Arc<AtomicUsize>,
    agent: AgentCommand,
    timeout: std::time::Duration,
}

pub(crate) fn triage(
    global: &GlobalArgs,
    env: &Environment,
    args: &TriageArgs,
    ask: Ask,
    interrupt: &Arc<AtomicUsize>,
) -> anyhow::Result<ExitCode> {
    if crate::in_run(env) {
        bail!(
            "kanban {} works outside any run, and this is inside one (the claim carrier is set)",
            ask.name()
        );
    }
    let timeout = crate::duration::parse_limit(&args.timeout)
        .map_err(|error| anyhow::anyhow!("--timeout {error}"))?;
    let author = args
        .author
        .as_deref()
        .or_else(|| env.get_trimmed("HERMES_PROFILE"))
        .or_else(|| env.get_trimmed("USER"))
        .unwrap_or(match ask {
            Ask::Specify => "specifier",
            Ask::Decompose => "decomposer",
        })
        .to_owned();
    if let Err(problem) = kanban_core::events::check_label(author.trim()) {
        bail!("--author {problem}");
    }
    let board = open_board(global, env)?;
    let file = agents_file_path(global.agents.as_deref(), &board.folder)
        .map(|path| load(&path, env))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let mut answerer = answerer(file.as_ref(), args.agent.as_deref(), timeout)?;
    crate::runtime::install_signal_handlers(interrupt)?;
    answerer.interrupt = interrupt.clone();
    let roster = roster(file.as_ref());
    let ids = if args.all {
        // In the order they were added.
        let mut cards = block_on(board.list_tasks(Some(TaskStatus::Triage)))?;
        cards.retain(|card| args.tenant.is_none() || card.tenant == args.tenant);
        cards.into_iter().map(|card| card.id).collect()
    } else {
        let given = args.id.as_deref().unwrap_or_default();
        vec![card_id(&board, given)?]
    };
    if ids.is_empty() {
        if args.json {
            // The seed system's line for nothing to do.
            let done = match ask {
                Ask::Specify => "specified",
                Ask::Decompose => "decomposed",
            };
            outln!("{}", json!({done: 0, "total": 0}));
        } else {
            let tenant = args
                .tenant
                .as_deref()
                .map(|tenant| format!(" of the tenant {tenant}"))
                .unwrap_or_default();
            outln!("no cards in triage{tenant}");
        }
        return Ok(ExitCode::Success);
    }
    let mut succeeded = 0;
    for id in &ids {
        if interrupt.load(std::sync::atomic::Ordering::SeqCst) != 0 {
            errln!("interrupted: {id} and the cards after it were not asked about");
            return Ok(ExitCode::Interrupted);
        }
        let outcome = Outcome {
            task_id: id.clone(),
            result: one_card(&board, id, ask, &answerer, &roster, author.trim(), env),
        };
        succeeded += usize::from(outcome.result.is_ok());
        report(&outcome, ask, args.json);
    }
    Ok(if succeeded > 0 {
        ExitCode::Success
    } else {
        ExitCode::Failure
    })
}

/// The agent named by `--agent`, else by the file's `triage_agent`.
fn answerer(
    file: Option<&AgentsFile>,
    named: Option<&str>,
    timeout: std::time::Duration,
) -> anyhow::Result<Answerer> {
    let Some(file) = file else {
        bail!(
            "no agents file: specify and decompose ask an agent of kanban.toml beside the board (or --agents FILE); see docs/agents.md"
        );
    };
    let where_ = file.path.display();
    let Some(name) = named.map(str::trim).or(file.triage_agent.as_deref()) else {
        bail!(
            "name the agent that answers: --agent NAME, or triage_agent = \"NAME\" in {where_} ({})",
            names(&file.agents)
        );
    };
    let Some(agent) = file.agents.get(name) else {
        bail!(
            "--agent {name}: no agent of that name in {where_} ({})",
            names(&file.agents)
        );
    };
    if agent.spec.starts_with(SEED_WORKER_PREFIX) {
        bail!(
            "the agent {name} is the seed system's worker, which works claimed cards only: name a command or http agent"
        );
    }
    Ok(Answerer {
        name: name.to_owned(),
        interrupt: Arc::default(),
        agent: agent.clone(),
        timeout,
    })
}

/// The agents a decomposer may route to, with their descriptions.
fn roster(file: Option<&AgentsFile>) -> Roster {
    let Some(file) = file else {
        return Roster::default();
    };
    Roster {
        agents: file
            .agents
            .iter()
            .map(|(name, agent)| RosterEntry {
                name: name.clone(),
                description: agent.description.clone(),
            })
            .collect(),
        default: file.default.clone(),
    }
}

fn one_card(
    board: &OpenBoard,
    id: &str,
    ask: Ask,
    answerer: &Answerer,
    roster: &Roster,
    author: &str,
    env: &Environment,
) -> Result<Done, String> {
    let view = block_on(board.show_task(id)).map_err(|error| error.to_string())?;
    let task = view.task;
    let status = task.status.as_str();
    if status != TaskStatus::Triage.as_str() {
        // Asked before the agent is: a card already specified costs nothing.
        return Err(format!(
            "{id} is {status}, not in triage: only a card in triage is {} (move it there with `kanban triage {id}`)",
            match ask {
                Ask::Specify => "specified",
                Ask::Decompose => "decomposed",
            }
        ));
    }
    let card = TriageCard {
        id,
        title: &task.title,
        body: task.body.as_deref().unwrap_or(""),
    };
    let prompt = match ask {
        Ask::Specify => triage::specify_prompt(&card),
        Ask::Decompose => triage::decompose_prompt(&card, roster),
    };
    let answer = ask_agent(answerer, &prompt, ask, id, env)?;
    let mut plan = match ask {
        Ask::Specify => triage::read_specification(&answer).map(TriagePlan::Specify),
        Ask::Decompose => triage::read_decomposition(&answer, roster),
    }
    .map_err(|error| format!("{error}; nothing was written"))?;
    if let TriagePlan::Decompose { children, .. } = &mut plan {
        let workspace = crate::workspace::for_children(&task);
        for child in children {
            child.workspace.clone_from(&workspace);
        }
    }
    let settled = block_on(board.settle_triage(id, &plan, &answerer.name, author)).map_err(
        |error| match error {
            BoardError::InvalidTransition { status, .. } => format!(
                "{id} left triage (it is {status}) while the agent answered; nothing was written"
            ),
            other => other.to_string(),
        },
    )?;
    let (new_title, fanout) = match &plan {
        TriagePlan::Specify(spec) => (
            spec.title.clone().filter(|title| *title != task.title),
            false,
        ),
        TriagePlan::Decompose { .. } => (None, true),
    };
    Ok(Done {
        status: settled.status,
        new_title,
        fanout,
        child_ids: settled.child_ids,
    })
}

/// One question to the agent; its text answer.
fn ask_agent(
    answerer: &Answerer,
    prompt: &Prompt,
    ask: Ask,
    id: &str,
    env: &Environment,
) -> Result<String, String> {
    let name = &answerer.name;
    let spec = &answerer.agent.spec;
    if spec.starts_with("http:") {
        let mut config = HttpAgentConfig::parse(spec, env)
            .map_err(|error| format!("the agent {name}: {error}"))?;
        config.timeout = answerer.timeout;
        let activity = Activity::new(Arc::new(SystemClock), answerer.interrupt.clone());
        let mut agent =
            HttpAgent::new(config, None, None, format!("{}-{id}", ask.name()), activity);
        return agent
            .ask(&prompt.system, &prompt.user)
            .map_err(|error| format!("the agent {name} did not answer: {error}"));
    }
    let request = json!({
        "kind": ask.name(),
        "task": {"id": id},
        "system": prompt.system,
        "message": prompt.user,
    });
    let command = OneShotCommand {
        env: answerer.agent.env.clone(),
        env_remove: crate::worker_secrets::withheld(env),
        interrupt: Some(answerer.interrupt.clone()),
        ..OneShotCommand::new(spec.clone(), answerer.timeout)
    };
    command
        .run(&request.to_string())
        .map_err(|error| format!("the agent {name}: {error}"))
}

fn report(outcome: &Outcome, ask: Ask, json: bool) {
    let id = &outcome.task_id;
    if json {
        let mut line = match &outcome.result {
            Ok(done) => json!({
                "task_id": id, "ok": true, "reason": reason(done),
                "new_title": done.new_title, "status": done.status.as_str(),
            }),
            Err(why) => json!({"task_id": id, "ok": false, "reason": why, "new_title": null}),
        };
        if ask == Ask::Decompose {
            let done = outcome.result.as_ref().ok();
            line["fanout"] = json!(done.is_some_and(|done| done.fanout));
            line["child_ids"] = json!(done.filter(|done| done.fanout).map(|done| &done.child_ids));
        }
        outln!("{line}");
        return;
    }
    match &outcome.result {
        Ok(done) => outln!("{id}: {}", reason(done)),
        Err(why) => errln!("error: {} {id}: {why}", ask.name()),
    }
}

fn reason(done: &Done) -> String {
    let landing = done.status.as_str();
    if done.fanout {
        return format!(
            "decomposed into {} cards ({}); it waits for them in {landing}",
            done.child_ids.len(),
            done.child_ids.join(", ")
        );
    }
    match &done.new_title {
        Some(title) => format!("specified, now {landing}; retitled {title:?}"),
        None => format!("specified, now {landing}"),
    }
}
