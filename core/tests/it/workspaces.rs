//! A card's workspace: the kinds, paths and branches `add` takes.

use kanban_core::workspaces::{
    WorkspaceError, WorkspaceKind, WorkspaceSpec, check_workspace, parse_workspace, valid_branch,
    worktree_branch, worktree_in,
};

fn spec(kind: WorkspaceKind, path: Option<&str>) -> WorkspaceSpec {
    WorkspaceSpec {
        kind,
        path: path.map(str::to_owned),
    }
}

#[test]
fn the_seed_systems_kinds_are_read_and_named_as_it_names_them() {
    for kind in [
        WorkspaceKind::Scratch,
        WorkspaceKind::Dir,
        WorkspaceKind::Worktree,
    ] {
        assert_eq!(WorkspaceKind::parse(kind.as_str()), Some(kind));
        assert_eq!(kind.to_string(), kind.as_str());
    }
    assert_eq!(WorkspaceKind::default(), WorkspaceKind::Scratch);
    assert_eq!(WorkspaceKind::parse("Scratch"), None);
    assert_eq!(
        [
            WorkspaceKind::Scratch,
            WorkspaceKind::Dir,
            WorkspaceKind::Worktree
        ]
        .map(WorkspaceKind::as_str),
        ["scratch", "dir", "worktree"]
    );
}

#[test]
fn add_takes_each_kind_with_an_absolute_path_and_nothing_else() {
    use WorkspaceKind::{Dir, Scratch, Worktree};
    let taken = [
        ("scratch", spec(Scratch, None)),
        ("  scratch ", spec(Scratch, None)),
        ("dir:/srv/work", spec(Dir, Some("/srv/work"))),
        ("worktree", spec(Worktree, None)),
        ("worktree:/src/repo", spec(Worktree, Some("/src/repo"))),
        (
            "worktree:/src/repo/.worktrees/x",
            spec(Worktree, Some("/src/repo/.worktrees/x")),
        ),
        ("dir:/a/..b/c", spec(Dir, Some("/a/..b/c"))),
    ];
    for (given, wanted) in taken {
        assert_eq!(parse_workspace(given), Ok(wanted), "{given}");
    }
    let refused = [
        (
            "everywhere",
            WorkspaceError::UnknownKind("everywhere".into()),
        ),
        (
            "scratch:/tmp/x",
            WorkspaceError::UnknownKind("scratch:/tmp/x".into()),
        ),
        ("dir", WorkspaceError::DirWithoutPath),
        (
            "dir:relative",
            WorkspaceError::NotAbsolute("relative".into()),
        ),
        ("dir:", WorkspaceError::NotAbsolute(String::new())),
        (
            "worktree:../up",
            WorkspaceError::NotAbsolute("../up".into()),
        ),
        ("dir:/a/../b", WorkspaceError::ParentPart("/a/../b".into())),
        ("dir:/a/..", WorkspaceError::ParentPart("/a/..".into())),
        (
            "dir:/a\nb",
            WorkspaceError::ControlCharacter("/a\nb".into()),
        ),
    ];
    for (given, wanted) in refused {
        assert_eq!(parse_workspace(given), Err(wanted), "{given}");
    }
    let long = format!("dir:/{}", "a".repeat(4096));
    assert!(matches!(
        parse_workspace(&long),
        Err(WorkspaceError::ControlCharacter(_))
    ));
    let longest = format!("dir:/{}", "a".repeat(4095));
    assert!(parse_workspace(&longest).is_ok());
    // Every error names the thing and the fix.
    assert!(
        WorkspaceError::NotAbsolute("x".into())
            .to_string()
            .contains("give the whole path")
    );
}

#[test]
fn a_branch_is_one_git_takes() {
    for name in ["main", "wt/t_1a2b3c4d", "feature/b", "fix-1.2_x", "a"] {
        assert!(valid_branch(name), "{name}");
    }
    let too_long = "a".repeat(256);
    for name in [
        "",
        "-x",
        "/x",
        ".x",
        "x/",
        "x.",
        "x.lock",
        "a..b",
        "a//b",
        "a/.b",
        "a b",
        "a~1",
        "a^",
        "a:b",
        "a?",
        "a*",
        "a[",
        "a\\b",
        "a@{1}",
        too_long.as_str(),
    ] {
        assert!(!valid_branch(name), "{name:?}");
    }
    assert!(valid_branch(&"a".repeat(255)));
}

#[test]
fn a_branch_belongs_to_a_worktree_workspace() {
    let worktree = spec(WorkspaceKind::Worktree, Some("/src/repo"));
    assert_eq!(check_workspace(&worktree, Some("feature/b")), Ok(()));
    assert_eq!(check_workspace(&worktree, None), Ok(()));
    assert_eq!(
        check_workspace(&worktree, Some("a..b")),
        Err(WorkspaceError::BadBranch("a..b".into()))
    );
    for kind in [WorkspaceKind::Scratch, WorkspaceKind::Dir] {
        assert_eq!(
            check_workspace(&spec(kind, Some("/srv")), Some("b")),
            Err(WorkspaceError::BranchWithoutWorktree)
        );
    }
    assert_eq!(
        check_workspace(&spec(WorkspaceKind::Dir, Some("rel")), None),
        Err(WorkspaceError::NotAbsolute("rel".into()))
    );
    // A card made some other way (an agent's call, the seed system) says
    // where, or is refused.
    assert_eq!(
        check_workspace(&spec(WorkspaceKind::Dir, None), None),
        Err(WorkspaceError::DirWithoutPath)
    );
    assert_eq!(
        check_workspace(&spec(WorkspaceKind::Worktree, None), None),
        Err(WorkspaceError::WorktreeWithoutPath)
    );
    assert_eq!(
        check_workspace(&spec(WorkspaceKind::Scratch, None), None),
        Ok(())
    );
}

#[test]
fn a_worktree_has_the_seed_systems_branch_and_place_unless_named() {
    assert_eq!(worktree_branch("t_1", None), "wt/t_1");
    assert_eq!(worktree_branch("t_1", Some("  ")), "wt/t_1");
    assert_eq!(worktree_branch("t_1", Some(" feature/b ")), "feature/b");
    assert_eq!(worktree_in("/src/repo", "t_1"), "/src/repo/.worktrees/t_1");
    assert_eq!(worktree_in("/src/repo/", "t_1"), "/src/repo/.worktrees/t_1");
}

#[test]
fn a_scratch_folder_goes_only_with_its_card_done_and_every_waiting_card_settled() {
    use kanban_core::TaskStatus::{Archived, Blocked, Done, Ready, Running};
    use kanban_core::workspaces::scratch_may_go;
    assert!(scratch_may_go(Some(Done), &[]));
    assert!(scratch_may_go(Some(Done), &[Some(Done), Some(Archived)]));
    for card in [
        None,
        Some(Ready),
        Some(Running),
        Some(Blocked),
        Some(Archived),
    ] {
        assert!(!scratch_may_go(card, &[]), "{card:?}");
    }
    assert!(!scratch_may_go(Some(Done), &[Some(Done), Some(Ready)]));
    assert!(
        !scratch_may_go(Some(Done), &[None]),
        "a child not read keeps it"
    );
}
