//! A card's workspace: a scratch folder of its own, a folder, or a git
//! worktree of its own, with real repositories and real processes.

use std::path::{Path, PathBuf};
use std::process::Command;

use kanban_testkit::{AgentScript, AgentTurn};
use serde_json::Value;

use crate::{Bench, runs, text};

const SUCCESS: &str = r#"{"completed": true, "final_response": "all done"}"#;

/// `git -C DIR ARGS…`, which must succeed; its output.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=test",
            "-c",
            "user.email=test@example.invalid",
        ])
        .args(args)
        .output()
        .expect("git runs: apt-get install git");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        text(&output.stderr)
    );
    text(&output.stdout).trim().to_owned()
}

/// A worktree of `repo` at `at` on a new `branch`, made by git itself.
fn linked_worktree(repo: &Path, branch: &str, at: &Path) {
    git(
        repo,
        &["worktree", "add", "-q", "-b", branch, at.to_str().unwrap()],
    );
}

/// A repository with one commit on `main`.
fn repository(bench: &Bench) -> PathBuf {
    let repo = bench.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("README"), "the project\n").unwrap();
    git(&repo, &["add", "README"]);
    git(&repo, &["commit", "-q", "-m", "start"]);
    std::fs::canonicalize(&repo).unwrap()
}

#[test]
fn cards_of_one_repository_commit_in_worktrees_of_their_own_at_once() {
    worktrees_of_their_own_on(&Bench::new());
}

#[test]
fn cards_of_one_repository_commit_in_worktrees_of_their_own_on_postgresql() {
    worktrees_of_their_own_on(&Bench::postgres());
}

/// Two cards of one repository, each agent committing in its own worktree
/// while the other works, the main checkout untouched.
fn worktrees_of_their_own_on(bench: &Bench) {
    let repo = repository(bench);
    let start = git(&repo, &["rev-parse", "HEAD"]);
    let meet = bench.path().join("meet");
    std::fs::create_dir_all(&meet).unwrap();
    let a = bench.add(
        "card a",
        &["--workspace", &format!("worktree:{}", repo.display())],
    );
    let b = bench.add(
        "card b",
        &["--repo", repo.to_str().unwrap(), "--branch", "feature/b"],
    );
    // Each agent commits in its own folder, then waits (a bounded while)
    // for the other to be working too: both run at once.
    let meet_at = meet.display();
    let shell = format!(
        r#"case "$(pwd -P)" in "{repo}"/.worktrees/*) ;; *) echo "not in a worktree: $(pwd -P)" >&2; exit 3;; esac
echo "$KANBAN_TASK" > "work-$KANBAN_TASK.txt"
git add "work-$KANBAN_TASK.txt"
git -c user.name=agent -c user.email=agent@example.invalid commit -q -m "work on $KANBAN_TASK"
pwd -P > "{meet_at}/$KANBAN_TASK.cwd"
printf '%s' "$KANBAN_WORKSPACE" > "{meet_at}/$KANBAN_TASK.workspace"
n=0
while [ "$(ls "{meet_at}" | grep -c '\.cwd$')" -lt 2 ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done
[ "$(ls "{meet_at}" | grep -c '\.cwd$')" -ge 2 ] && touch "{meet_at}/$KANBAN_TASK.met"
"#,
        repo = repo.display()
    );
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).after(&shell).completing()])
        .write(bench.path(), "agent.sh");
    bench.dispatch_until_idle(&agent.path, &["--max-in-progress", "2"]);
    for (card, branch) in [(&a, format!("wt/{a}")), (&b, "feature/b".to_owned())] {
        let shown = bench.show(card);
        assert_eq!(shown["task"]["status"], "done", "{shown}");
        let worktree = repo.join(".worktrees").join(card);
        let cwd = std::fs::read_to_string(meet.join(format!("{card}.cwd"))).unwrap();
        assert_eq!(
            Path::new(cwd.trim()),
            worktree,
            "{card} works in its own worktree"
        );
        assert_eq!(
            std::fs::read_to_string(meet.join(format!("{card}.workspace"))).unwrap(),
            worktree.display().to_string()
        );
        assert!(
            meet.join(format!("{card}.met")).exists(),
            "both agents ran at once"
        );
        // Its branch holds its commit, and its result names both.
        let commit = git(&repo, &["rev-parse", &branch]);
        assert_eq!(
            git(&repo, &["log", "-1", "--format=%s", &branch]),
            format!("work on {card}")
        );
        let metadata = runs(&shown).last().unwrap()["metadata"].clone();
        assert_eq!(metadata["branch"], branch.as_str(), "{shown}");
        assert_eq!(metadata["commit"], commit.as_str(), "{shown}");
        assert_eq!(metadata["workspace"], worktree.display().to_string());
        assert_eq!(metadata["workspace_kind"], "worktree");
        assert!(
            worktree.join(format!("work-{card}.txt")).is_file(),
            "a worktree is kept"
        );
    }
    // The main checkout is as it was: its branch, its files, its status.
    assert_eq!(git(&repo, &["rev-parse", "HEAD"]), start);
    assert_eq!(git(&repo, &["branch", "--show-current"]), "main");
    assert_eq!(
        git(&repo, &["status", "--porcelain"]),
        "",
        "the worktrees are not the checkout's"
    );
    assert!(!repo.join(format!("work-{a}.txt")).exists());
    // The card page says where each card works and where its run ended.
    let server = crate::serve::Server::start(bench, &[]);
    let (status, page) = crate::serve::get(&format!("{}/cards/{b}", server.url));
    assert_eq!(status, 200);
    let commit = git(&repo, &["rev-parse", "feature/b"]);
    assert!(
        page.contains("data-workspace=\"worktree\"")
            && page.contains("feature/b")
            && page.contains(&commit[..12]),
        "{page}"
    );
    drop(server);
    let shown = bench.ok(&["show", &b]);
    assert!(
        shown.contains("workspace: worktree:") && shown.contains("(branch feature/b)"),
        "{shown}"
    );
}

/// Asserts that `card` is done and that its agent worked in its own scratch
/// folder (the path it wrote to `seen`); that folder.
fn done_in_its_scratch_folder(bench: &Bench, card: &str, seen: &Path) -> PathBuf {
    assert_eq!(bench.show(card)["task"]["status"], "done");
    let folder = std::fs::canonicalize(bench.path())
        .unwrap()
        .join("workspaces")
        .join(card);
    assert_eq!(
        Path::new(std::fs::read_to_string(seen).unwrap().trim()),
        folder
    );
    folder
}

#[test]
fn a_scratch_folder_is_the_cards_own_and_goes_when_it_is_done() {
    let bench = Bench::new();
    let seen = bench.path().join("seen");
    let card = bench.add("scratch work", &[]);
    let shell = format!(
        r#"pwd -P > "{seen}"
echo notes > notes.txt
"#,
        seen = seen.display()
    );
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).after(&shell).completing()])
        .write(bench.path(), "agent.sh");
    bench.dispatch_until_idle(&agent.path, &[]);
    let folder = done_in_its_scratch_folder(&bench, &card, &seen);
    assert!(!folder.exists(), "a done card's scratch folder is removed");
}

#[test]
fn a_workspace_the_world_cannot_give_is_refused_at_add_with_its_own_error() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let plain = bench.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let missing = bench.path().join("missing");
    let refused = |args: &[&str], needle: &str| {
        let mut all = vec!["add", "refused"];
        all.extend_from_slice(args);
        bench.refused(&all, needle);
    };
    refused(
        &["--workspace", "everywhere"],
        "not one of scratch, dir:PATH",
    );
    refused(&["--workspace", "dir:relative/path"], "not absolute");
    refused(
        &["--workspace", &format!("dir:{}/../x", plain.display())],
        "has a `..` part",
    );
    refused(
        &["--workspace", &format!("dir:{}", missing.display())],
        "no such folder",
    );
    refused(
        &["--workspace", &format!("worktree:{}", plain.display())],
        "not in a git repository",
    );
    refused(
        &["--repo", repo.to_str().unwrap(), "--branch", "main"],
        "branch main is checked out at",
    );
    refused(
        &["--repo", repo.to_str().unwrap(), "--branch=bad..name"],
        "not a branch name git takes",
    );
    refused(
        &["--branch", "topic"],
        "--branch is for a worktree workspace",
    );
    let listed: Value = serde_json::from_str(&bench.ok(&["ls", "--json"])).unwrap();
    assert_eq!(
        listed,
        serde_json::json!([]),
        "a refused card changes nothing"
    );
    // A folder that is there is kept by its canonical path.
    let linked = bench.path().join("linked");
    std::os::unix::fs::symlink(&plain, &linked).unwrap();
    let card = bench.add(
        "in a folder",
        &["--workspace", &format!("dir:{}", linked.display())],
    );
    let shown = bench.show(&card);
    assert_eq!(shown["task"]["workspace_kind"], "dir");
    assert_eq!(
        shown["task"]["workspace_path"],
        std::fs::canonicalize(&plain).unwrap().display().to_string()
    );
}

#[test]
fn edit_moves_a_cards_workspace_before_its_run_as_add_takes_one() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let plain = bench.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let card = bench.add("port the parser", &[]);
    let workspace = |bench: &Bench| {
        let task = bench.show(&card)["task"].clone();
        (
            task["workspace_kind"].clone(),
            task["workspace_path"].clone(),
            task["branch_name"].clone(),
        )
    };
    let scratch = workspace(&bench);
    // What add refuses, edit refuses, and the card keeps its own.
    for (args, needle) in [
        (vec!["--workspace", "dir:relative"], "not absolute"),
        (
            vec!["--branch", "topic"],
            "--branch is for a worktree workspace",
        ),
        (
            vec!["--repo", repo.to_str().unwrap(), "--branch", "main"],
            "branch main is checked out at",
        ),
    ] {
        let mut all = vec!["edit", card.as_str()];
        all.extend(args);
        bench.refused(&all, needle);
    }
    assert_eq!(workspace(&bench), scratch);
    let dir = format!("dir:{}", plain.display());
    bench.ok(&["edit", &card, "--workspace", &dir]);
    assert_eq!(
        workspace(&bench),
        (
            Value::from("dir"),
            Value::from(std::fs::canonicalize(&plain).unwrap().display().to_string()),
            Value::Null
        )
    );
    bench.ok(&[
        "edit",
        &card,
        "--repo",
        repo.to_str().unwrap(),
        "--branch",
        "wt/parser",
    ]);
    let (kind, _, branch) = workspace(&bench);
    assert_eq!(
        (kind, branch),
        (Value::from("worktree"), Value::from("wt/parser"))
    );
    // A run works where its card said as it started: a running card keeps it.
    let _carrier = bench.claim(&card, Some(900));
    let held = workspace(&bench);
    bench.refused(
        &["edit", &card, "--workspace", "scratch"],
        "its run works or worked in its workspace",
    );
    assert_eq!(workspace(&bench), held);
}

#[test]
fn a_workspace_gone_since_add_is_the_environments_fault_never_the_cards() {
    let bench = Bench::new();
    let folder = bench.path().join("work");
    std::fs::create_dir_all(&folder).unwrap();
    let card = bench.add(
        "its folder goes",
        &["--workspace", &format!("dir:{}", folder.display())],
    );
    std::fs::remove_dir(&folder).unwrap();
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).completing()])
        .write(bench.path(), "agent.sh");
    let output = bench
        .dispatch_command(&agent.path, &["--until-idle"])
        .output()
        .unwrap();
    let said = format!("{}{}", text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(78), "{said}");
    assert!(
        said.contains("workspace folder") && said.contains("is gone"),
        "{said}"
    );
    let task = &bench.show(&card)["task"];
    assert_eq!(task["status"], "ready", "{task}");
    assert_eq!(task["consecutive_failures"], 0, "never the card's");
    assert!(agent.requests().is_empty(), "no agent ran");
}

#[test]
fn an_agent_named_by_a_relative_path_runs_from_its_cards_workspace() {
    let bench = Bench::new();
    let seen = bench.path().join("seen");
    let card = bench.add("relative agent", &["--blocked"]);
    let shell = format!(r#"pwd -P > "{}""#, seen.display());
    AgentScript::new(vec![AgentTurn::result(SUCCESS).after(&shell).completing()])
        .write(bench.path(), "agent.sh");
    bench.ok(&["unblock", &card]);
    let output = bench
        .dispatch_command(Path::new("./agent.sh"), &["--until-idle"])
        .current_dir(bench.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    done_in_its_scratch_folder(&bench, &card, &seen);
}

#[test]
fn archive_takes_a_clean_worktree_away_and_keeps_one_with_changes() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let clean = bench.add("clean", &["--repo", repo.to_str().unwrap()]);
    let dirty = bench.add("dirty", &["--repo", repo.to_str().unwrap()]);
    let kept = bench.add("kept", &["--repo", repo.to_str().unwrap()]);
    let shell = format!(
        r#"case "$(pwd -P)" in "{repo}"/.worktrees/*) ;; *) echo "not in a worktree: $(pwd -P)" >&2; exit 3;; esac
echo work > "work.txt" && git add work.txt
git -c user.name=agent -c user.email=agent@example.invalid commit -q -m "work on $KANBAN_TASK"
[ "$KANBAN_TASK" = "{dirty}" ] && echo unfinished > notes.txt
true
"#,
        repo = repo.display()
    );
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).after(&shell).completing()])
        .write(bench.path(), "agent.sh");
    bench.dispatch_until_idle(&agent.path, &["--max-in-progress", "3"]);
    let worktree = |card: &str| repo.join(".worktrees").join(card);
    for card in [&clean, &dirty, &kept] {
        assert_eq!(bench.show(card)["task"]["status"], "done");
        assert!(worktree(card).is_dir());
    }
    let archived = bench.run(&["archive", &clean, &dirty]);
    assert!(archived.status.success(), "{}", text(&archived.stderr));
    let said = text(&archived.stderr);
    assert!(!worktree(&clean).exists(), "a clean worktree goes: {said}");
    assert!(said.contains("removed its worktree"), "{said}");
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s", &format!("wt/{clean}")]),
        format!("work on {clean}"),
        "its branch stays"
    );
    assert!(
        worktree(&dirty).join("notes.txt").is_file(),
        "changes not committed are kept"
    );
    assert!(
        said.contains(&format!("{dirty}: kept its worktree")),
        "{said}"
    );
    bench.ok(&["archive", &kept, "--keep-workspaces"]);
    assert!(worktree(&kept).is_dir());
}

#[test]
fn a_reclaimed_runs_successor_finds_the_worktree_only_after_the_old_agent_is_dead() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let card = bench.add("taken back", &["--repo", repo.to_str().unwrap()]);
    let meet = bench.path().join("meet");
    std::fs::create_dir_all(&meet).unwrap();
    let agent = bench.path().join("agent.sh");
    kanban_testkit::write_executable(
        &agent,
        &format!(
            r#"#!/bin/sh
meet="{meet}"
if [ ! -e "$meet/pid1" ]; then
  pwd -P > "$meet/cwd1"
  echo $$ > "$meet/pid1.tmp" && mv "$meet/pid1.tmp" "$meet/pid1"
  exec sleep 300
fi
# A zombie is dead: only its parent has yet to reap it.
state=$(cut -d' ' -f3 "/proc/$(cat "$meet/pid1")/stat" 2> /dev/null)
if [ -n "$state" ] && [ "$state" != Z ]; then echo alive > "$meet/second"; else echo dead > "$meet/second"; fi
pwd -P > "$meet/cwd2"
"$KANBAN_BIN" complete --summary "second run" >&2 || exit $?
echo '{{"completed": true, "final_response": "done"}}'
"#,
            meet = meet.display()
        ),
    );
    let mut dispatcher = bench
        .dispatch_command(&agent, &["--until-idle", "--grace", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    crate::wait_for("the first agent", || meet.join("pid1").exists());
    bench.ok(&["reclaim", &card, "--reason", "the operator takes it back"]);
    let status = dispatcher.wait().unwrap();
    assert!(status.success(), "{status}");
    let read = |name: &str| {
        std::fs::read_to_string(meet.join(name))
            .unwrap()
            .trim()
            .to_owned()
    };
    assert_eq!(
        read("second"),
        "dead",
        "the old agent was gone before the next run began"
    );
    assert_eq!(
        read("cwd1"),
        read("cwd2"),
        "the next run works on in the same worktree"
    );
    assert_eq!(
        Path::new(&read("cwd2")),
        repo.join(".worktrees").join(&card)
    );
    let shown = bench.show(&card);
    assert_eq!(shown["task"]["status"], "done");
    assert_eq!(runs(&shown).len(), 2);
}

#[test]
fn an_agent_of_the_agents_file_gives_its_cards_a_workspace_unless_they_name_one() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let agents = bench.path().join("kanban.toml");
    std::fs::write(
        &agents,
        format!(
            "[agents.coder]\ncommand = \"true\"\nworkspace = \"worktree:{}\"\n[agents.writer]\ncommand = \"true\"\n",
            repo.display()
        ),
    )
    .unwrap();
    let task = |card: &str| bench.show(card)["task"].clone();
    let coded = bench.add("code it", &["--assignee", "coder"]);
    assert_eq!(task(&coded)["workspace_kind"], "worktree");
    assert_eq!(task(&coded)["workspace_path"], repo.display().to_string());
    let own = bench.add(
        "its own",
        &["--assignee", "coder", "--workspace", "scratch"],
    );
    // A scratch folder of its own is said by no workspace field at all.
    assert!(task(&own).get("workspace_kind").is_none(), "{}", task(&own));
    let written = bench.add("write it", &["--assignee", "writer"]);
    assert!(task(&written).get("workspace_kind").is_none());
    // A workspace the file names wrong is the file's error, naming it.
    std::fs::write(
        &agents,
        "[agents.coder]\ncommand = \"true\"\nworkspace = \"dir:relative\"\n",
    )
    .unwrap();
    bench.refused(&["add", "again", "--assignee", "coder"], "workspace");
}

#[test]
fn gc_removes_the_worktrees_of_cards_no_longer_on_the_board_but_not_their_changes() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let live = bench.add("still here", &["--repo", repo.to_str().unwrap()]);
    let worktrees = repo.join(".worktrees");
    // Two worktrees this board made (as its worker marks them), and one of
    // another board's (or the seed system's), unmarked.
    let board = std::fs::canonicalize(&bench.db)
        .unwrap()
        .display()
        .to_string();
    for gone in ["t_deadbeef", "t_cafef00d", "t_0a0b0c0d"] {
        let at = worktrees.join(gone);
        linked_worktree(&repo, &format!("wt/{gone}"), &at);
        if gone != "t_0a0b0c0d" {
            let marker = repo.join(".git/worktrees").join(gone).join("kanban-board");
            std::fs::write(marker, format!("{board}\n")).unwrap();
        }
    }
    std::fs::write(worktrees.join("t_cafef00d/notes.txt"), "unfinished\n").unwrap();
    std::fs::create_dir_all(worktrees.join(&live)).unwrap();
    let said = bench.ok(&["gc"]);
    assert!(!worktrees.join("t_deadbeef").exists(), "{said}");
    assert!(
        said.contains("removed the worktree") && said.contains("t_deadbeef"),
        "{said}"
    );
    assert!(worktrees.join("t_cafef00d/notes.txt").is_file(), "{said}");
    assert!(
        said.contains("kept the worktree") && said.contains("t_cafef00d"),
        "{said}"
    );
    assert!(
        worktrees.join(&live).is_dir(),
        "a card on the board keeps its worktree"
    );
    assert_eq!(
        git(&repo, &["rev-parse", "--verify", "-q", "wt/t_deadbeef"]).len(),
        40
    );
}

#[test]
fn a_worktree_named_by_its_own_path_is_made_once_and_worked_on_by_the_next_run() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let place = repo.join(".worktrees").join("custom");
    let card = bench.add(
        "its own place",
        &["--workspace", &format!("worktree:{}", place.display())],
    );
    let seen = bench.path().join("seen");
    let shell = format!(
        r#"pwd -P >> "{seen}"
if [ "$(wc -l < "{seen}")" -lt 2 ]; then
  "$KANBAN_BIN" block --reason "needs a word" --kind needs_input >&2
  exit 0
fi
"$KANBAN_BIN" complete --summary "done" >&2 || exit $?
"#,
        seen = seen.display()
    );
    let agent = bench.path().join("agent.sh");
    kanban_testkit::write_executable(&agent, &format!("#!/bin/sh\n{shell}echo '{SUCCESS}'\n"));
    bench.dispatch_until_idle(&agent, &[]);
    assert_eq!(bench.show(&card)["task"]["status"], "blocked");
    bench.ok(&["unblock", &card]);
    bench.dispatch_until_idle(&agent, &[]);
    let shown = bench.show(&card);
    assert_eq!(shown["task"]["status"], "done", "{shown}");
    let places: Vec<String> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        places,
        vec![place.display().to_string(); 2],
        "both runs in the one worktree"
    );
    assert_eq!(
        git(&place, &["branch", "--show-current"]),
        format!("wt/{card}")
    );
}

#[test]
fn a_worktree_is_never_made_inside_a_checkout_and_a_repository_is_its_main_checkout() {
    let bench = Bench::new();
    let repo = repository(&bench);
    std::fs::create_dir_all(repo.join("src")).unwrap();
    bench.refused(
        &[
            "add",
            "inside",
            "--workspace",
            &format!("worktree:{}", repo.join("src").display()),
        ],
        "is inside the checkout",
    );
    bench.refused(
        &[
            "add",
            "nested",
            "--workspace",
            &format!("worktree:{}", repo.join(".worktrees/a/b").display()),
        ],
        "is inside the checkout",
    );
    // A repository named from inside one of its worktrees is its main checkout.
    let linked = repo.join(".worktrees").join("t_0a0b0c0d");
    linked_worktree(&repo, "other", &linked);
    let card = bench.add("from a worktree", &["--repo", linked.to_str().unwrap()]);
    assert_eq!(
        bench.show(&card)["task"]["workspace_path"],
        repo.display().to_string()
    );
}

#[test]
fn a_linked_worktree_named_by_its_path_is_worked_in_as_it_is() {
    let bench = Bench::new();
    let repo = repository(&bench);
    let outside = bench.path().join("outside");
    linked_worktree(&repo, "mine", &outside);
    let outside = std::fs::canonicalize(&outside).unwrap();
    let at = format!("worktree:{}", outside.display());
    bench.refused(
        &[
            "add",
            "wrong branch",
            "--workspace",
            &at,
            "--branch",
            "main",
        ],
        "branch main is checked out at",
    );
    let card = bench.add("in it", &["--workspace", &at, "--branch", "mine"]);
    let seen = bench.path().join("seen");
    let shell = format!(r#"pwd -P > "{}""#, seen.display());
    let agent = AgentScript::new(vec![AgentTurn::result(SUCCESS).after(&shell).completing()])
        .write(bench.path(), "agent.sh");
    bench.dispatch_until_idle(&agent.path, &[]);
    assert_eq!(bench.show(&card)["task"]["status"], "done");
    assert_eq!(
        Path::new(std::fs::read_to_string(&seen).unwrap().trim()),
        outside
    );
}
