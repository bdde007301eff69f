//! An agent's board calls, answered by its own worker.
//!
//! A worker already holds the board open and its claim proven; an agent's
//! `kanban complete` (or `block`, `heartbeat`, `comment`) that opened the
//! board again in a process of its own paid for a second connection (on
//! PostgreSQL, a new server session) per call. So a worker listens on a
//! socket of its own for the duration of its run and hands the agents its
//! address in `KANBAN_WORKER_SOCKET`; the agent's call sends one JSON line
//! there and reads one back. The worker makes the call with its own claim,
//! through the same fenced write as ever, so nothing an agent sends can
//! reach another card.
//!
//! The socket is in Linux's abstract namespace (no file to leave behind or
//! to clean up), named with 128 random bits, and answers only processes of
//! the worker's own user (`SO_PEERCRED`), who could read the board file and
//! the claim carrier anyway. Where there is no worker to ask (no variable,
//! nobody listening, a worker holding another claim or unable to read the
//! call), the call opens the board itself, exactly as before.

use std::io::{BufRead, BufReader, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use kanban_core::{Board, BoardError, Claim, NotLive, ProofIdentity, ProofRequest};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// The variable a worker's agents find its socket in: `@` and the
/// abstract name.
pub(crate) const SOCKET_VAR: &str = "KANBAN_WORKER_SOCKET";

/// The longest request line a worker reads: a summary and a result at
/// their bounds, with room to spare.
const REQUEST_LIMIT: u64 = 4 * 1024 * 1024;
/// How long a worker waits for a connected caller's request line.
const REQUEST_PATIENCE: Duration = Duration::from_secs(10);
/// How long a caller waits for the worker's answer: the worker's own
/// board call waits out a busy board for at most about this long.
const ANSWER_PATIENCE: Duration = Duration::from_secs(300);

/// One board call, as an agent asks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub(crate) enum Call {
    Complete {
        summary: String,
        result: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        metadata: Option<serde_json::Map<String, serde_json::Value>>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        created_cards: Vec<String>,
    },
    /// A card made from inside the run: it waits for the run's card.
    Create {
        task: kanban_core::NewTask,
    },
    /// A file the run attached to its own card (already written).
    Attach {
        new: kanban_core::attachments::NewAttachment,
    },
    Link {
        parent: String,
        child: String,
    },
    Unblock {
        task_id: String,
    },
    Block {
        reason: String,
        #[serde(default)]
        kind: Option<kanban_core::BlockKind>,
    },
    Heartbeat {
        note: Option<String>,
    },
    Comment {
        author: String,
        text: String,
    },
}

/// What a caller asks its worker. On the wire one `call` field names
/// either: the proof by its own name, a board call by its `Call` tag.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
enum Question {
    /// The lease proof of `kanban fence`: answered only when the claim lock
    /// and the board are the worker's own too.
    Prove { claim_lock: String, db: String },
    #[serde(untagged)]
    Board(Box<Call>),
}

/// A question with the claim the caller believes it works under.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    task_id: String,
    run_id: i64,
    #[serde(flatten)]
    call: Question,
}

/// What a call did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Done {
    /// The new end of the lease, after a heartbeat.
    pub(crate) lease_expires: Option<i64>,
    /// The card a create made (or found, for a repeated idempotency key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) created: Option<String>,
    /// The attachment an attach recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) attached: Option<i64>,
    /// Whether a link was new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) linked: Option<bool>,
}

/// Why a call did not go through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "refusal", content = "message", rename_all = "snake_case")]
pub(crate) enum CallError {
    /// The card's doing (reclaimed, settled, not found, bad input): exit 1.
    Refused(String),
    /// Only the lease ran out; the card is still this run's: wait for the
    /// dispatcher to renew it.
    Lapsed(String),
    /// The board failed (busy, full, unreachable): pass, retry.
    Failed(String),
    /// The board cannot even be opened: the environment's fault, at once.
    Unopenable(String),
}

impl CallError {
    /// How a board's refusal reaches the caller.
    pub(crate) fn of(error: &BoardError) -> Self {
        match error {
            BoardError::LeaseLost { reason, .. } if reason.only_expired() => {
                Self::Lapsed(error.to_string())
            }
            BoardError::LeaseLost { .. } => Self::Refused(format!(
                "{error}\nhint: the card was reclaimed, settled or taken by a newer run; `kanban show TASK` tells which"
            )),
            BoardError::TaskNotFound(_)
            | BoardError::InvalidInput(_)
            | BoardError::InvalidTransition { .. } => Self::Refused(error.to_string()),
            _ => Self::Failed(error.to_string()),
        }
    }
}

/// The worker's answer on the wire.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum Answer {
    Done(Done),
    /// This worker holds another claim (or the caller is another user):
    /// the caller goes to the board itself.
    NotMine,
    NotDone {
        error: CallError,
    },
    /// A proof's verdict: live, or why not.
    Proof {
        not_live: Option<NotLive>,
    },
}

/// Makes `call` with `claim` on `board`.
/// Whether a run's attachment record names a plain file in its own card's
/// folder (`…/TASK/NAME`, NAME its filename): an agent cannot record
/// another card's file, or any other.
fn names_own_file(claim: &Claim, new: &kanban_core::attachments::NewAttachment) -> bool {
    let path = std::path::Path::new(&new.stored_path);
    path.is_absolute()
        && path.parent().and_then(std::path::Path::file_name)
            == Some(std::ffi::OsStr::new(&claim.task_id))
        && path.file_name() == Some(std::ffi::OsStr::new(&new.filename))
        && std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file())
}

pub(crate) async fn perform(
    board: &dyn Board,
    claim: &Claim,
    call: &Call,
) -> Result<Done, CallError> {
    let done = match call {
        Call::Complete {
            summary,
            result,
            metadata,
            created_cards,
        } => {
            let handoff = kanban_core::Handoff {
                summary: summary.clone(),
                result: result.clone(),
                metadata: metadata.clone(),
                created_cards: created_cards.clone(),
            };
            board
                .hand_off(claim, &handoff)
                .await
                .map(|()| Done::default())
        }
        Call::Create { task } => board.create_child(claim, task).await.map(|id| Done {
            created: Some(id),
            ..Done::default()
        }),
        Call::Attach { new } if !names_own_file(claim, new) => {
            Err(BoardError::InvalidInput(format!(
                "an attachment of {} names its own file in its own folder ({}/NAME), not {:?}",
                claim.task_id, claim.task_id, new.stored_path
            )))
        }
        Call::Attach { new } => board.attach(claim, new).await.map(|id| Done {
            attached: Some(id),
            ..Done::default()
        }),
        Call::Link { parent, child } => {
            board
                .link_child(claim, parent, child)
                .await
                .map(|linked| Done {
                    linked: Some(linked),
                    ..Done::default()
                })
        }
        Call::Unblock { task_id } => board
            .unblock_child(claim, task_id)
            .await
            .map(|()| Done::default()),
        Call::Block { reason, kind } => board
            .block(claim, reason, *kind)
            .await
            .map(|()| Done::default()),
        Call::Heartbeat { note } => {
            board
                .heartbeat(claim, note.clone())
                .await
                .map(|expires| Done {
                    lease_expires: Some(expires),
                    ..Done::default()
                })
        }
        Call::Comment { author, text } => board
            .comment(claim, author, text)
            .await
            .map(|()| Done::default()),
    };
    done.map_err(|error| CallError::of(&error))
}

/// A worker's listening socket.
pub(crate) struct CallServer {
    name: String,
    listener: tokio::net::UnixListener,
}

/// Listens on a fresh name in Linux's abstract namespace: `kanban-ROLE-`,
/// this process's pid and 128 random bits. Returns the name and the
/// listener (on the current tokio runtime).
pub(crate) fn listen_abstract(role: &str) -> std::io::Result<(String, tokio::net::UnixListener)> {
    let name = format!(
        "kanban-{role}-{}-{}",
        std::process::id(),
        crate::supervisor::random_hex()
    );
    let address = SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = std::os::unix::net::UnixListener::bind_addr(&address)?;
    listener.set_nonblocking(true)?;
    Ok((name, tokio::net::UnixListener::from_std(listener)?))
}

impl CallServer {
    /// Listens on a fresh abstract name.
    pub(crate) fn bind() -> std::io::Result<Self> {
        let (name, listener) = listen_abstract("worker")?;
        Ok(Self { name, listener })
    }

    /// The variable that points an agent here.
    pub(crate) fn env_pair(&self) -> (String, String) {
        (SOCKET_VAR.to_owned(), format!("@{}", self.name))
    }

    /// Answers callers until the worker ends; each connection on a task of
    /// its own, so that a caller that never finishes its line holds up
    /// nobody else.
    pub(crate) async fn serve(
        self,
        board: Arc<dyn Board>,
        claim: Claim,
        facts: Option<HandoffFacts>,
    ) {
        let me = nix::unistd::getuid().as_raw();
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of descriptors, most likely: the agent's own calls
                    // wait; this loop must not spin meanwhile.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let board = board.clone();
            let claim = claim.clone();
            let facts = facts.clone();
            tokio::spawn(async move {
                let _ = answer(stream, me, &*board, &claim, facts.as_ref()).await;
            });
        }
    }
}

/// What the worker adds to its run's handoff when the agent completes: the
/// workspace, and a worktree's branch and the commit it ended on.
pub(crate) type HandoffFacts =
    Arc<dyn Fn() -> serde_json::Map<String, serde_json::Value> + Send + Sync>;

/// `call`, a completion given the worker's `facts` (the agent's own keys
/// stay as they are).
fn with_facts(call: &Call, facts: Option<&HandoffFacts>) -> Option<Call> {
    let (
        Call::Complete {
            summary,
            result,
            metadata,
            created_cards,
        },
        Some(facts),
    ) = (call, facts)
    else {
        return None;
    };
    let mut metadata = metadata.clone().unwrap_or_default();
    for (key, value) in facts() {
        metadata.entry(key).or_insert(value);
    }
    Some(Call::Complete {
        summary: summary.clone(),
        result: result.clone(),
        metadata: Some(metadata),
        created_cards: created_cards.clone(),
    })
}

async fn answer(
    mut stream: tokio::net::UnixStream,
    me: u32,
    board: &dyn Board,
    claim: &Claim,
    facts: Option<&HandoffFacts>,
) -> std::io::Result<()> {
    let same_user = stream.peer_cred().is_ok_and(|cred| cred.uid() == me);
    let answer = if same_user {
        let (read, _) = stream.split();
        let mut line = String::new();
        let mut reader = tokio::io::BufReader::new(read.take(REQUEST_LIMIT));
        let read = tokio::time::timeout(REQUEST_PATIENCE, reader.read_line(&mut line)).await;
        if !matches!(read, Ok(Ok(n)) if n > 0) {
            return Ok(());
        }
        match serde_json::from_str::<Request>(&line) {
            Ok(request) if request.task_id == claim.task_id && request.run_id == claim.run_id => {
                match &request.call {
                    Question::Prove { claim_lock, db }
                        if *claim_lock == claim.claim_lock && *db == claim.db =>
                    {
                        Answer::Proof {
                            not_live: board
                                .prove_claim(claim, ProofIdentity::AnyProcess)
                                .await
                                .err(),
                        }
                    }
                    Question::Prove { .. } => Answer::NotMine,
                    Question::Board(call) => match perform(
                        board,
                        claim,
                        with_facts(call, facts).as_ref().unwrap_or(&**call),
                    )
                    .await
                    {
                        Ok(done) => Answer::Done(done),
                        Err(error) => Answer::NotDone { error },
                    },
                }
            }
            // Another run's call, or one this build cannot read (a caller of
            // another kanban version): the caller makes it on the board.
            Ok(_) | Err(_) => Answer::NotMine,
        }
    } else {
        Answer::NotMine
    };
    let mut text = serde_json::to_string(&answer).unwrap_or_default();
    text.push('\n');
    stream.write_all(text.as_bytes()).await?;
    stream.shutdown().await
}

/// Sends `request` to the worker at `socket` and reads its answer: `None`
/// when nobody listens there (no worker, or this is no worker's agent).
fn exchange(socket: Option<&str>, request: &Request) -> Option<Result<Answer, String>> {
    let name = socket?.strip_prefix('@')?;
    let address = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
    let mut stream = UnixStream::connect_addr(&address).ok()?;
    // Once connected, the call may have been made: a lost answer is a
    // failure (to retry, and a retry is refused if the first went through),
    // never a reason to make the call a second way.
    let lost = |error: std::io::Error| Some(Err(format!("the worker did not answer ({error})")));
    let mut line = serde_json::to_string(request).unwrap_or_default();
    line.push('\n');
    if let Err(error) = stream
        .set_read_timeout(Some(ANSWER_PATIENCE))
        .and_then(|()| stream.write_all(line.as_bytes()))
    {
        return lost(error);
    }
    let mut answer = String::new();
    let mut reader = BufReader::new(std::io::Read::take(stream, REQUEST_LIMIT));
    if let Err(error) = reader.read_line(&mut answer) {
        return lost(error);
    }
    match serde_json::from_str::<Answer>(&answer) {
        Ok(answer) => Some(Ok(answer)),
        Err(_) => lost(std::io::Error::other(
            "its answer was cut short or not understood",
        )),
    }
}

/// Asks the worker named in `KANBAN_WORKER_SOCKET` to make `call`: `None`
/// when there is no worker to ask, and the caller must go to the board.
pub(crate) fn ask_worker(
    socket: Option<&str>,
    claim: &Claim,
    call: &Call,
) -> Option<Result<Done, CallError>> {
    let request = Request {
        task_id: claim.task_id.clone(),
        run_id: claim.run_id,
        call: Question::Board(Box::new(call.clone())),
    };
    match exchange(socket, &request)? {
        Ok(Answer::Done(done)) => Some(Ok(done)),
        Ok(Answer::NotDone { error }) => Some(Err(error)),
        Ok(Answer::NotMine) => None,
        Ok(Answer::Proof { .. }) => Some(Err(CallError::Failed(
            "the worker answered another question".to_owned(),
        ))),
        Err(lost) => Some(Err(CallError::Failed(lost))),
    }
}

/// Asks the worker for the lease proof of `request`, when the request is
/// the worker's own claim: `None` when there is no such worker to ask.
/// Fails closed: a worker that does not answer proves nothing.
pub(crate) fn ask_worker_proof(
    socket: Option<&str>,
    request: &ProofRequest,
) -> Option<Result<(), NotLive>> {
    let asked = Request {
        task_id: request.task_id.clone()?,
        run_id: request.run_id.as_deref()?.trim().parse().ok()?,
        call: Question::Prove {
            claim_lock: request.claim_lock.clone()?,
            db: request.db.clone()?,
        },
    };
    match exchange(socket, &asked)? {
        Ok(Answer::Proof { not_live }) => Some(not_live.map_or(Ok(()), Err)),
        Ok(Answer::NotMine) => None,
        Ok(Answer::Done(_) | Answer::NotDone { .. }) => Some(Err(NotLive::Unreadable(
            "the worker answered another question".to_owned(),
        ))),
        Err(lost) => Some(Err(NotLive::Unreadable(lost))),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use kanban_board_sqlite::{SqliteBoard, SystemClock};
    use kanban_core::{BoardAdmin, NewTask};

    use super::*;

    /// Sends `text` as it is and returns the worker's whole answer.
    fn raw(socket: &str, text: &str) -> String {
        let name = socket.trim_start_matches('@');
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let mut stream = UnixStream::connect_addr(&address).unwrap();
        stream.write_all(text.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn a_run_records_only_a_plain_file_in_its_own_cards_folder() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("t_1").join("a.txt");
        let other = dir.path().join("t_2").join("a.txt");
        for file in [&own, &other] {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, "x").unwrap();
        }
        let link = dir.path().join("t_1").join("l.txt");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        let claim = Claim {
            task_id: "t_1".into(),
            db: "/b.db".into(),
            run_id: 1,
            claim_lock: "l".into(),
            board: None,
        };
        let record = |path: &std::path::Path, name: &str| kanban_core::attachments::NewAttachment {
            filename: name.into(),
            stored_path: path.display().to_string(),
            ..Default::default()
        };
        assert!(names_own_file(&claim, &record(&own, "a.txt")));
        assert!(
            !names_own_file(&claim, &record(&other, "a.txt")),
            "another card's"
        );
        assert!(
            !names_own_file(&claim, &record(&own, "b.txt")),
            "another name"
        );
        assert!(!names_own_file(&claim, &record(&link, "l.txt")), "a link");
        assert!(
            !names_own_file(&claim, &record(std::path::Path::new("t_1/a.txt"), "a.txt")),
            "relative"
        );
        assert!(
            !names_own_file(
                &claim,
                &record(&dir.path().join("t_1/none.txt"), "none.txt")
            ),
            "missing"
        );
    }

    #[test]
    fn a_request_s_lines_stay_as_every_kanban_version_reads_them() {
        // Callers and workers of other builds share these lines: a board
        // call and the proof are one `call` field beside the claim.
        let lines = [
            r#"{"task_id":"t_1","run_id":7,"call":"complete","summary":"done","result":null}"#,
            r#"{"task_id":"t_1","run_id":7,"call":"heartbeat","note":"halfway"}"#,
            r#"{"task_id":"t_1","run_id":7,"call":"prove","claim_lock":"host:1:a","db":"/b.db"}"#,
        ];
        let read: Vec<Request> = lines
            .iter()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        for (line, request) in lines.iter().zip(&read) {
            assert_eq!(serde_json::to_string(request).unwrap(), *line);
        }
        assert!(
            matches!(&read[0].call, Question::Board(call) if matches!(&**call, Call::Complete { summary, .. } if summary == "done")),
            "{:?}",
            read[0]
        );
        assert!(
            matches!(&read[2].call, Question::Prove { claim_lock, .. } if claim_lock == "host:1:a"),
            "{:?}",
            read[2]
        );
        for unknown in [
            r#"{"task_id":"t_1","run_id":7,"call":"delete_board"}"#,
            r#"{"task_id":"t_1","run_id":7,"summary":"done"}"#,
            r#"{"task_id":"t_1","run_id":7,"call":"prove","db":"/b.db"}"#,
        ] {
            assert!(
                serde_json::from_str::<Request>(unknown).is_err(),
                "{unknown}"
            );
        }
    }

    #[test]
    fn the_worker_answers_only_its_own_claim_and_leaves_what_it_cannot_read_to_the_caller() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let board = SqliteBoard::open_in_memory(Arc::new(SystemClock)).unwrap();
            let id = board
                .create_task(&NewTask {
                    title: "served".into(),
                    ..NewTask::default()
                })
                .await
                .unwrap();
            let claim = board
                .claim_task(&id, 900, "test:1:lock")
                .await
                .unwrap()
                .unwrap()
                .claim;
            let server = CallServer::bind().unwrap();
            let (name, socket) = server.env_pair();
            assert_eq!(name, SOCKET_VAR);
            assert!(socket.starts_with("@kanban-worker-"), "{socket}");
            tokio::spawn(server.serve(Arc::new(board.clone()), claim.clone(), None));
            let asked = claim.clone();
            let answers = tokio::task::spawn_blocking(move || {
                let garbage = raw(&socket, "not a call\n");
                let mut other = asked.clone();
                other.run_id += 1;
                let comment = Call::Comment {
                    author: "agent".into(),
                    text: "hello".into(),
                };
                let not_mine = ask_worker(Some(&socket), &other, &comment);
                let commented = ask_worker(Some(&socket), &asked, &comment);
                let complete = Call::Complete {
                    summary: "done".into(),
                    result: None,
                    metadata: None,
                    created_cards: Vec::new(),
                };
                let proof = |claim: &Claim| ProofRequest {
                    task_id: Some(claim.task_id.clone()),
                    db: Some(claim.db.clone()),
                    run_id: Some(claim.run_id.to_string()),
                    claim_lock: Some(claim.claim_lock.clone()),
                };
                let live = ask_worker_proof(Some(&socket), &proof(&asked));
                let mut stranger = asked.clone();
                stranger.claim_lock = "another:1:lock".into();
                let strangers = ask_worker_proof(Some(&socket), &proof(&stranger));
                let first = ask_worker(Some(&socket), &asked, &complete);
                let second = ask_worker(Some(&socket), &asked, &complete);
                let closed = ask_worker_proof(Some(&socket), &proof(&asked));
                let nobody = ask_worker(Some("@kanban-worker-nobody"), &asked, &complete);
                assert_eq!(live, Some(Ok(())), "the worker proves its own claim");
                assert_eq!(strangers, None, "another lock's proof is not the worker's");
                assert!(matches!(closed, Some(Err(_))), "{closed:?}");
                (garbage, not_mine, commented, first, second, nobody)
            })
            .await
            .unwrap();
            let (garbage, not_mine, commented, first, second, nobody) = answers;
            assert_eq!(garbage.trim(), r#"{"outcome":"not_mine"}"#);
            assert_eq!(not_mine, None, "another run's call is not this worker's");
            assert_eq!(commented, Some(Ok(Done::default())));
            assert_eq!(first, Some(Ok(Done::default())));
            assert!(
                matches!(&second, Some(Err(CallError::Refused(message))) if message.contains("hint:")),
                "{second:?}"
            );
            assert_eq!(nobody, None, "nobody listening: the caller opens the board");
            let view = board.show_task(&id).await.unwrap();
            assert_eq!(view.task.status, kanban_core::TaskStatus::Done);
            assert_eq!(view.comments.len(), 1);
        });
    }
}
