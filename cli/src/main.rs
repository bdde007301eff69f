//! The `kanban` binary: wires the SQLite board, the exec agent and the real
//! clock to kanban-core, and is the only place that exits the process, reads
//! the process environment or installs signal handlers.

mod admin;
mod agent_calls;
mod agent_check;
mod agents_file;
mod args;
mod attach;
mod board_path;
mod boards;
mod demo;
mod dispatch;
mod dispatch_link;
mod dry_run;
mod duration;
mod fault;
mod fence;
mod home;
mod logs;
mod mcp;
mod metrics;
mod notify;
mod notify_mail;
mod orphans;
mod out;
mod output;
mod prove;
mod report;
mod runtime;
mod seed_worker;
mod serve;
mod serve_board;
mod serve_net;
mod serve_page;
mod serve_upload;
mod sim_agent;
mod supervisor;
mod triage;
mod watch;
mod worker;
mod worker_calls;
mod worker_secrets;
mod workspace;

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use clap::FromArgMatches as _;
use kanban_core::Environment;
use kanban_core::ExitCode;

use crate::admin::Operation;
use crate::args::{Cli, Command, FenceCommand};
use crate::out::{errln, out};

/// The log filter `KANBAN_LOG` (or the default) names. Empty parts (a
/// trailing comma) are skipped: `Targets` would read one as "errors only".
fn log_targets(
    filter: &str,
) -> Result<tracing_subscriber::filter::Targets, tracing_subscriber::filter::ParseError> {
    filter
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(",")
        .parse()
}

fn init_logging(verbose: u8, quiet: bool, env: &Environment) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, _) => "debug",
    };
    // Recovery and worker lines already reach stderr through the worker's
    // own output; tracing would print them twice.
    let default = format!("{level},kanban::recovery=off,kanban::worker=off");
    let given = env.get("KANBAN_LOG");
    // Targets and levels only: a filter with spans or fields needs regular
    // expressions, whose code every process (each worker, each agent's
    // call) would load and compile at start for nothing.
    let targets = log_targets(given.unwrap_or(&default)).unwrap_or_else(|error| {
            errln!(
                "warning: KANBAN_LOG is not a list of targets and levels ({error}; write it like `debug` or `warn,kanban::dispatch=debug`); logging warnings only"
            );
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing_subscriber::filter::LevelFilter::WARN)
        });
    let color = env.get("NO_COLOR").is_none_or(str::is_empty) && std::io::stderr().is_terminal();
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(color)
                .with_target(false)
                .with_filter(targets),
        )
        .init();
}

fn main() {
    let cli =
        Cli::from_arg_matches(&args::command().get_matches()).unwrap_or_else(|error| error.exit());
    let env = Environment::from_os_vars(std::env::vars_os()).with_kanban_names();
    if let Some(name) = env.unreadable().find(|name| read_by_kanban(name)) {
        errln!(
            "error: the environment variable {name} is not valid UTF-8; set it to text or unset it"
        );
        std::process::exit(1);
    }
    init_logging(cli.global.verbose, cli.global.quiet, &env);
    output::use_utc(cli.global.utc);
    let interrupt = Arc::new(AtomicUsize::new(0));
    let json = json_requested(&cli.command);
    let code = match run(cli, &env, &interrupt) {
        Ok(Ended::Exit(code)) => code.code(),
        // `fence run` ends as its command did.
        Ok(Ended::Passed(status)) => status,
        // With --json, scripts get the error as JSON too.
        Err(error) if json => {
            errln!(
                "{}",
                serde_json::json!({"error": format!("{error:#}"), "exit_code": 1})
            );
            ExitCode::Failure.code()
        }
        Err(error) => {
            errln!("error: {error:#}");
            ExitCode::Failure.code()
        }
    };
    std::process::exit(code);
}

/// True when the command was asked for JSON output.
fn json_requested(command: &Command) -> bool {
    match command {
        Command::Ls { json, .. }
        | Command::Show { json, .. }
        | Command::Events { json, .. }
        | Command::Runs { json, .. }
        | Command::Claim { json, .. }
        | Command::Walls { json, .. } => *json,
        Command::Add(args) => args.json,
        Command::Swarm(args) => args.json,
        Command::Specify(args) | Command::Decompose(args) => args.json,
        Command::Prove(args) => args.json,
        _ => false,
    }
}

/// The variables kanban reads: only these must be text. Any other variable
/// may hold any bytes, and is passed on to workers and agents untouched.
fn read_by_kanban(name: &str) -> bool {
    name.starts_with("HERMES_KANBAN_")
        || name.starts_with("KANBAN_")
        || matches!(
            name,
            "HOME"
                | "PATH"
                | "USER"
                | "XDG_DATA_HOME"
                | "NO_COLOR"
                | "OPENAI_API_KEY"
                | "PGPASSWORD"
                | "PGPASSFILE"
                | "PGUSER"
        )
}

/// A dispatcher's agents: the agents file's (if any), then `--agent`
/// values, which add agents or replace the file's of the same name.
fn dispatch_agents(
    global: &args::GlobalArgs,
    folder: &std::path::Path,
    values: &[String],
    env: &Environment,
) -> Result<dispatch::Agents, String> {
    let file = agents_file::agents_file_path(global.agents.as_deref(), folder)
        .map(|path| agents_file::load(&path, env))
        .transpose()?;
    let given = if values.is_empty() && file.is_some() {
        std::collections::BTreeMap::new()
    } else {
        agent_check::parse_agents(values, env)?
    };
    let mut agents = dispatch::Agents::default();
    if let Some(file) = file {
        agents.unassigned = file.default;
        agents.by_route = file.agents;
    }
    for (route, spec) in given {
        agents
            .by_route
            .insert(route, agents_file::AgentCommand::bare(spec));
    }
    Ok(agents)
}

/// How a command ended: with one of kanban's exit codes, or with the
/// status of a command it ran and passes on.
enum Ended {
    Exit(ExitCode),
    Passed(i32),
}

fn run(cli: Cli, env: &Environment, interrupt: &Arc<AtomicUsize>) -> anyhow::Result<Ended> {
    if let Command::Fence(FenceCommand::Run { command }) = &cli.command {
        runtime::install_signal_handlers(interrupt)?;
        return fence::run(env, command, interrupt).map(Ended::Passed);
    }
    command(cli, env, interrupt).map(Ended::Exit)
}

/// A card and `--ids` more, as one list.
fn with_more(id: String, more: Vec<String>) -> Vec<String> {
    std::iter::once(id).chain(more).collect()
}

#[expect(clippy::too_many_lines, reason = "a table: one arm per command")]
fn command(cli: Cli, env: &Environment, interrupt: &Arc<AtomicUsize>) -> anyhow::Result<ExitCode> {
    let global = &cli.global;
    match cli.command {
        Command::Init => admin::init(global, env),
        Command::Boards { command } => boards::boards(env, command),
        Command::Migrate => admin::migrate(global, env),
        Command::Add(args) => admin::add(global, env, &args),
        Command::Ls {
            status,
            assignee,
            parent,
            archived,
            block_kind,
            tenant,
            mine,
            sort,
            json,
        } => {
            let profile = if mine {
                Some(env.get_trimmed("HERMES_PROFILE").ok_or_else(|| {
                    anyhow::anyhow!("--mine lists the cards of $HERMES_PROFILE, which is not set: name the agent with --assignee NAME")
                })?)
            } else {
                None
            };
            let filter = admin::ListFilter {
                status: status.as_deref(),
                assignee: profile.or(assignee.as_deref()),
                parent: parent.as_deref(),
                archived,
                block_kind,
                tenant: tenant.as_deref(),
                sort: sort.as_deref(),
            };
            admin::list(global, env, &filter, json)
        }
        Command::Cancel { id, reason } => {
            admin::operate(global, env, &id, Operation::Cancel(&reason))
        }
        Command::Edit(args) => admin::edit(global, env, &args),
        Command::Archive {
            ids,
            keep_workspaces,
        } => admin::each_card(global, env, &ids, |id| {
            admin::operate(global, env, id, Operation::Archive { keep_workspaces })
        }),
        Command::Hold { id, reason } => admin::operate(global, env, &id, Operation::Hold(&reason)),
        Command::Release { id } => admin::operate(global, env, &id, Operation::Release),
        Command::Link { parent, child } if in_run(env) => agent_calls::link(env, &parent, &child),
        Command::Link { parent, child } => admin::link(global, env, &parent, &child, true),
        Command::Swarm(args) => admin::swarm(global, env, &args),
        Command::Notify { command } => notify::notify(global, env, command),
        Command::NotifySubscribeSeed(args) => notify::seed_subscribe(global, env, &args),
        Command::NotifyListSeed { task_id, json } => {
            notify::list(global, env, task_id.as_deref(), json)
        }
        Command::NotifyUnsubscribeSeed {
            task_id,
            id,
            platform,
            chat_id,
            thread_id,
        } => {
            let gateway = platform.is_some() || chat_id.is_some() || thread_id.is_some();
            notify::seed_unsubscribe(global, env, &task_id, id, gateway)
        }
        Command::Specify(args) => {
            triage::triage(global, env, &args, triage::Ask::Specify, interrupt)
        }
        Command::Decompose(args) => {
            triage::triage(global, env, &args, triage::Ask::Decompose, interrupt)
        }
        Command::Unlink { parent, child } => admin::link(global, env, &parent, &child, false),
        Command::Prune {
            older_than,
            dry_run,
            keep_workspaces,
        } => admin::prune(global, env, older_than, dry_run, keep_workspaces),
        Command::Logs { id, run, follow } => {
            if follow {
                runtime::install_signal_handlers(interrupt)?;
            }
            logs::logs(global, env, &id, run, follow, interrupt)
        }
        Command::Serve {
            listen,
            token,
            token_file,
        } => {
            let token = serve::serve_token(token, token_file.as_deref(), env)?;
            runtime::install_signal_handlers(interrupt)?;
            let (first, others) = serve::served_boards(global, env)?;
            serve::serve(first, others, listen, token, interrupt)
        }
        Command::Walls { json, lift } => match lift {
            Some(scope) => admin::lift_wall(global, env, &scope),
            None => admin::walls(global, env, json),
        },
        Command::Show { id, json } => admin::show(global, env, &id, json),
        Command::Events { id, json } => admin::events(global, env, &id, json),
        Command::Runs {
            id,
            status,
            outcome,
            json,
        } => admin::runs(global, env, &id, [status, outcome], json),
        Command::Claim { id, ttl, json } => admin::claim(global, env, &id, ttl, json),
        Command::Unblock { ids } if in_run(env) => {
            // In order, stopping at the first that is not done: a later
            // success must not hide an earlier refusal.
            for id in &ids {
                let code = agent_calls::unblock(env, id)?;
                if code != ExitCode::Success {
                    return Ok(code);
                }
            }
            Ok(ExitCode::Success)
        }
        Command::Unblock { ids } => {
            admin::each_card(global, env, &ids, |id| admin::unblock(global, env, id))
        }
        Command::Schedule {
            id,
            reason,
            ids,
            not_before,
        } => admin::each_card(global, env, &with_more(id, ids), |id| {
            admin::schedule(global, env, id, &reason, not_before.as_deref())
        }),
        Command::Promote {
            id,
            reason,
            ids,
            force,
            dry_run,
            json,
        } => admin::each_card(global, env, &with_more(id, ids), |id| {
            admin::promote(global, env, id, &reason, force, dry_run, json)
        }),
        Command::Triage { id, reason } => {
            admin::operate(global, env, &id, Operation::Triage(&reason.join(" ")))
        }
        Command::Review { id, reason } => {
            admin::operate(global, env, &id, Operation::Review(&reason.join(" ")))
        }
        Command::Reclaim { id, reason } => admin::reclaim(global, env, &id, &reason),
        Command::Complete {
            summary,
            result,
            metadata,
            created_cards,
        } => agent_calls::complete(env, &summary, result, metadata, created_cards),
        Command::Block { reason, kind } => agent_calls::block(env, &reason, kind),
        Command::Heartbeat { note } => agent_calls::heartbeat(env, note),
        Command::Stats { json } => report::stats(global, env, json),
        Command::Tail { id, interval, json } => {
            runtime::install_signal_handlers(interrupt)?;
            report::tail(global, env, &id, interval, json, interrupt)
        }
        Command::Gc {
            event_retention_days,
            log_retention_days,
        } => report::gc(global, env, event_retention_days, log_retention_days),
        Command::Diagnostics {
            severity,
            task,
            json,
        } => report::diagnostics(global, env, severity, task.as_deref(), json),
        Command::Context { id, json } => worker::context(global, env, &id, json),
        Command::Assignees { json } => report::assignees(global, env, json),
        Command::Reassign {
            id,
            name,
            reclaim,
            reason,
        } => admin::reassign(global, env, &id, &name, reclaim, &reason),
        Command::Attach {
            task,
            path,
            name,
            content_type,
            author,
            json,
        } => attach::attach(
            global,
            env,
            &attach::AttachRequest {
                task: &task,
                path: &path,
                name: name.as_deref(),
                content_type: content_type.as_deref(),
                author: author.as_deref(),
                json,
            },
        ),
        Command::Attachments { task, json } => attach::list(global, env, &task, json),
        Command::AttachRm { id } => attach::remove(global, env, id),
        Command::Comment { words, author } => match words.as_slice() {
            [task, text] => admin::comment(global, env, task, text, author.as_deref()),
            [text] => agent_calls::comment(env, text),
            _ => anyhow::bail!("kanban comment takes [TASK] TEXT"),
        },
        Command::Worker(args) => {
            runtime::install_signal_handlers(interrupt)?;
            Ok(worker::worker(env, &args, interrupt.clone()))
        }
        Command::Turn(args) => {
            let task = worker::turn_task(global, env, &args)?;
            runtime::install_signal_handlers(interrupt)?;
            worker::one_turn(env, &args.agent, &task, interrupt.clone())
        }
        Command::Prove(args) => prove::prove(global, env, &args),
        Command::Fence(FenceCommand::Check { quiet }) => fence::check(env, quiet),
        // Ended by `run`, which passes its command's status on.
        Command::Fence(FenceCommand::Run { .. }) => {
            anyhow::bail!("kanban fence run passes its command's status on: it is run by `run`")
        }
        Command::Dispatch(args) => {
            runtime::install_signal_handlers(interrupt)?;
            let db = board_path::board_path(global, env)?;
            let slug = board_path::board_slug(global, env)?;
            let folder = board_path::board_folder(global, env, &db)?;
            let agents = match dispatch_agents(global, &folder, &args.agent, env) {
                Ok(agents) => agents,
                Err(problem) => {
                    errln!("error: {problem}; nothing was claimed");
                    return Ok(ExitCode::ConfigFail);
                }
            };
            let plan = match dispatch::DispatchPlan::from_args(&args, agents, db, folder, slug, env)
            {
                Ok(plan) => plan,
                Err(problem) => {
                    errln!("error: {problem}; nothing was claimed");
                    return Ok(ExitCode::ConfigFail);
                }
            };
            if args.dry_run {
                return dry_run::dry_run(&plan, env, args.json);
            }
            dispatch::run(&plan, env, interrupt)
        }
        Command::Demo { board_file } => {
            runtime::install_signal_handlers(interrupt)?;
            if global.db.is_some() || global.board.is_some() {
                anyhow::bail!(
                    "the demo runs on a fresh board of its own and never touches yours: drop --db/--board (--board-file NEW_PATH keeps the demo's board)"
                );
            }
            demo::demo(board_file, interrupt.clone())
        }
        Command::Watch { interval, once } => watch::watch(global, env, interval, once),
        Command::SimAgent => sim_agent::sim_agent(env),
        Command::Mcp => mcp::mcp(env),
        Command::Completions { shell } => {
            let mut bytes = Vec::new();
            clap_complete::generate(shell, &mut args::command(), "kanban", &mut bytes);
            out!("{}", String::from_utf8_lossy(&bytes));
            Ok(ExitCode::Success)
        }
        Command::Man => {
            let mut bytes = Vec::new();
            clap_mangen::Man::new(args::command()).render(&mut bytes)?;
            out!("{}", String::from_utf8_lossy(&bytes));
            Ok(ExitCode::Success)
        }
    }
}

/// Inside an agent: the claim carrier names a claimed card, and the
/// commands that change cards act as the run's fenced fan-out.
pub(crate) fn in_run(env: &Environment) -> bool {
    kanban_core::Claim::from_env(env).is_ok()
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::filter::LevelFilter;

    #[test]
    fn a_log_filter_keeps_its_default_level_whatever_commas_it_has() {
        let targets = super::log_targets(" warn, kanban::dispatch=debug,").unwrap();
        assert_eq!(targets.default_level(), Some(LevelFilter::WARN));
        assert!(super::log_targets("warn,kanban::dispatch=[oops").is_err());
    }
}
