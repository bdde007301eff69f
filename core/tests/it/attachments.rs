//! Attached files' names and bounds, and the names a card keeps for its
//! tenant and maker.

use kanban_core::attachments::{
    MAX_ATTACHMENT_BYTES, check_attachment_size, collision_free_name, guess_content_type,
    safe_attachment_name,
};
use kanban_core::events::{MAX_LABEL_CHARS, check_label, check_new_task};
use kanban_core::{BoardError, NewTask};

#[test]
fn a_given_name_is_made_safe_as_the_seed_system_makes_it() {
    for (given, kept) in [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("C:\\\\Users\\\\x\\\\notes.txt", "notes.txt"),
        ("  .hidden  ", "hidden"),
        ("...dots", "dots"),
        ("bell\u{7}and\nnewline.txt", "bellandnewline.txt"),
        ("dir/", ""),
    ] {
        match safe_attachment_name(given) {
            Ok(name) => assert_eq!(name, kept, "{given:?}"),
            Err(problem) => {
                assert!(kept.is_empty(), "{given:?}: {problem}");
                assert!(problem.contains("--name"), "{problem}");
            }
        }
    }
    for nothing in ["", "   ", "...", "/", "a/..", "\u{0}"] {
        assert!(safe_attachment_name(nothing).is_err(), "{nothing:?}");
    }
    let long = "x".repeat(300);
    assert_eq!(safe_attachment_name(&long).unwrap().chars().count(), 200);
    assert_eq!(
        safe_attachment_name(&"é".repeat(201))
            .unwrap()
            .chars()
            .count(),
        200
    );
}

#[test]
fn a_taken_name_is_numbered_at_its_first_dot() {
    let taken = |names: &'static [&'static str]| move |name: &str| names.contains(&name);
    assert_eq!(collision_free_name("a.tar.gz", taken(&[])), "a.tar.gz");
    assert_eq!(
        collision_free_name("a.tar.gz", taken(&["a.tar.gz"])),
        "a (1).tar.gz"
    );
    assert_eq!(
        collision_free_name("a.tar.gz", taken(&["a.tar.gz", "a (1).tar.gz"])),
        "a (2).tar.gz"
    );
    assert_eq!(collision_free_name("notes", taken(&["notes"])), "notes (1)");
}

#[test]
fn a_card_takes_files_of_25_mib_at_most_and_guesses_common_types() {
    assert_eq!(MAX_ATTACHMENT_BYTES, 25 * 1024 * 1024);
    assert!(check_attachment_size(MAX_ATTACHMENT_BYTES).is_ok());
    let refused = check_attachment_size(MAX_ATTACHMENT_BYTES + 1).unwrap_err();
    assert!(refused.contains("at most 25 MiB"), "{refused}");
    for (name, kind) in [
        ("a.txt", Some("text/plain")),
        ("a.LOG", Some("text/plain")),
        ("a.md", Some("text/markdown")),
        ("a.csv", Some("text/csv")),
        ("a.json", Some("application/json")),
        ("a.pdf", Some("application/pdf")),
        ("a.png", Some("image/png")),
        ("a.jpg", Some("image/jpeg")),
        ("a.jpeg", Some("image/jpeg")),
        ("a.gif", Some("image/gif")),
        ("a.webp", Some("image/webp")),
        ("a.zip", Some("application/zip")),
        ("a.gz", Some("application/gzip")),
        ("a.html", Some("text/html")),
        ("a.htm", Some("text/html")),
        ("a.svg", Some("image/svg+xml")),
        ("a.bin", None),
        ("noextension", None),
    ] {
        assert_eq!(guess_content_type(name), kind, "{name}");
    }
}

#[test]
fn a_tenant_or_maker_is_one_plain_line() {
    assert!(check_label("acme").is_ok());
    assert!(check_label(&"a".repeat(MAX_LABEL_CHARS)).is_ok());
    assert!(
        check_label(&"a".repeat(MAX_LABEL_CHARS + 1))
            .unwrap_err()
            .contains("longer than")
    );
    assert!(check_label("").unwrap_err().contains("blank"));
    assert!(check_label("  ").unwrap_err().contains("blank"));
    assert!(
        check_label(" acme")
            .unwrap_err()
            .contains("spaces around it")
    );
    assert!(
        check_label("ac\nme")
            .unwrap_err()
            .contains("control character")
    );
    let card = |tenant: Option<&str>, maker: Option<&str>| NewTask {
        title: "x".into(),
        tenant: tenant.map(str::to_owned),
        created_by: maker.map(str::to_owned),
        ..NewTask::default()
    };
    assert!(check_new_task(&card(Some("acme"), Some("alice"))).is_ok());
    for (tenant, maker, says) in [(Some(" "), None, "tenant"), (None, Some("a\tb"), "maker")] {
        match check_new_task(&card(tenant, maker)) {
            Err(BoardError::InvalidInput(message)) => assert!(message.contains(says), "{message}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_recurring_card_s_period_is_a_second_at_least() {
    let every = |seconds: i64| {
        check_new_task(&NewTask {
            title: "x".into(),
            every_seconds: Some(seconds),
            ..NewTask::default()
        })
    };
    assert!(every(1).is_ok());
    assert!(every(2).is_ok());
    for bad in [0, -1] {
        assert!(
            matches!(every(bad), Err(BoardError::InvalidInput(m)) if m.contains("at least one second")),
            "{bad}"
        );
    }
    let blank = check_new_task(&NewTask {
        title: " ".into(),
        ..NewTask::default()
    });
    assert!(matches!(blank, Err(BoardError::InvalidInput(m)) if m.contains("non-blank title")));
}
