//! A worker's board calls, answered by the dispatcher that started it.
//!
//! A dispatcher already holds the board open. A worker that opened it again
//! paid, for every card, for a connection, a schema read and a score of
//! prepared statements, and its writes waited on the write lock against the
//! dispatcher's. So a dispatcher listens on a socket of its own and hands
//! its workers the address in `KANBAN_DISPATCH_SOCKET`; a worker keeps one
//! connection for its run and sends each board call as one JSON line with
//! its claim. The dispatcher makes the call on its board with that claim,
//! through the same fenced write as ever (run id, claim lock, unexpired
//! lease), so nothing a worker sends can reach another run.
//!
//! The socket is in Linux's abstract namespace (nothing to clean up), named
//! with 128 random bits, and serves only processes of the dispatcher's own
//! user (`SO_PEERCRED`), who could open the board file anyway. It serves a
//! claim on its own board only: a claim on another board is answered
//! `not_mine` before anything is done, and a card is shown only to the run
//! that holds it. It makes only whole lines (a call cut short is not made).
//!
//! A worker with no dispatcher to ask (no variable, nobody listening, a
//! dispatcher of another board) opens the board itself, and so does one
//! whose link breaks: its dispatcher left (it says `closing`, once every
//! call it took is answered), died, or did not answer within 45 s (stopped
//! or stuck). A write whose answer was lost fails as a passing board fault,
//! as a commit cut off by a dying board connection does: the link never
//! makes it again, though the caller's own retry may (a worker's bind is
//! retried; a second bind of the same pid adds only its event).
//! A read whose answer was lost is asked of the board, and every later
//! call goes to the board directly.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use kanban_core::rules::{FailurePolicy, Overrun};
use kanban_core::{
    BlockKind, Board, BoardError, Claim, Clock, Environment, Handoff, NewTask, NotLive,
    ProofIdentity, RunStatus, TaskView, WorkerResult,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::board_path::{AnyBoard, open_claim_board};
use crate::runtime::TokioOffload;

/// The variable a dispatcher hands its workers its socket in: `@` and the
/// abstract name.
pub(crate) const LINK_VAR: &str = "KANBAN_DISPATCH_SOCKET";

/// How long a worker waits for its dispatcher's answer: longer than the
/// dispatcher's own board call may wait out a busy board (30 s). A
/// dispatcher stopped (`Ctrl-Z`) or stuck costs its workers no more.
const LINK_PATIENCE: Duration = Duration::from_secs(45);

/// The longest line either side reads: a card's view with its newest
/// comments and events at their bounds, with room to spare.
const LINE_LIMIT: u64 = 16 * 1024 * 1024;

/// One board call of a worker.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
enum LinkCall {
    /// The card, and with it the worker's pid bound to the claim when
    /// `bind` names one: a worker's first two calls in one exchange.
    ShowTask {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        bind: Option<u32>,
    },
    Prove {
        identity: ProofIdentity,
    },
    Bind {
        pid: u32,
    },
    BookResult {
        result: WorkerResult,
    },
    RunStatus,
    Heartbeat {
        note: Option<String>,
    },
    Complete {
        handoff: Handoff,
    },
    Block {
        reason: String,
        #[serde(default)]
        kind: Option<BlockKind>,
    },
    SettleOverrun {
        overrun: Overrun,
        policy: FailurePolicy,
    },
    Comment {
        author: String,
        text: String,
    },
    AppendEvent {
        kind: String,
        payload: serde_json::Value,
    },
}

impl LinkCall {
    /// True when `answer` answers this call (a refusal answers any).
    fn answered_by(&self, answer: &LinkAnswer) -> bool {
        match (self, answer) {
            (Self::Prove { .. }, LinkAnswer::Done | LinkAnswer::NotLive { .. }) => true,
            (Self::Prove { .. }, _) => false,
            (_, LinkAnswer::Failed { .. }) => true,
            (Self::ShowTask { .. }, LinkAnswer::View { .. }) => true,
            (Self::RunStatus, LinkAnswer::Status { .. }) => true,
            (Self::Heartbeat { .. }, LinkAnswer::Expires { .. }) => true,
            (
                Self::Bind { .. }
                | Self::BookResult { .. }
                | Self::Complete { .. }
                | Self::Block { .. }
                | Self::SettleOverrun { .. }
                | Self::Comment { .. }
                | Self::AppendEvent { .. },
                LinkAnswer::Done,
            ) => true,
            _ => false,
        }
    }
}

/// A call with the claim it is made under (sent as `LinkRequest<&LinkCall>`,
/// so that the sender keeps its call).
#[derive(Debug, Serialize, Deserialize)]
struct LinkRequest<C = LinkCall> {
    claim: Claim,
    call: C,
}

/// The dispatcher's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum LinkAnswer {
    Done,
    Expires {
        at: i64,
    },
    Status {
        status: RunStatus,
    },
    View {
        view: Box<TaskView>,
        /// The pid the call named is bound (a dispatcher that binds nothing
        /// with a view leaves it out: the worker binds on its own).
        #[serde(default)]
        bound: bool,
    },
    Failed {
        error: BoardError,
    },
    NotLive {
        reason: NotLive,
    },
    /// Not this dispatcher's board, or a line it cannot read (a worker of
    /// another kanban version): nothing was done; the worker goes to the
    /// board itself.
    NotMine,
    /// The dispatcher is leaving: nothing the worker sent without an answer
    /// was made, and every later call goes to the board.
    Closing,
}

/// A dispatcher's listening socket.
pub(crate) struct LinkServer {
    name: String,
    listener: tokio::net::UnixListener,
}

impl LinkServer {
    /// Listens on a fresh abstract name.
    pub(crate) fn bind() -> std::io::Result<Self> {
        let (name, listener) = crate::worker_calls::listen_abstract("dispatch")?;
        Ok(Self { name, listener })
    }

    /// The variable that points a worker here.
    pub(crate) fn env_pair(&self) -> (String, String) {
        (LINK_VAR.to_owned(), format!("@{}", self.name))
    }

    /// Answers workers, each on a task of its own, until `closing` turns
    /// true; then tells every connected worker it is closing and returns
    /// once each was told. `db` is the board's name as its claims carry it.
    pub(crate) async fn serve(
        self,
        board: Arc<dyn AnyBoard>,
        db: String,
        mut closing: tokio::sync::watch::Receiver<bool>,
    ) {
        let me = nix::unistd::getuid().as_raw();
        let db: Arc<str> = db.into();
        let mut workers = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = closing.wait_for(|closing| *closing) => break,
                // Reap the tasks of workers that hung up as it goes.
                Some(_) = workers.join_next(), if !workers.is_empty() => continue,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(_) => {
                    // Out of descriptors, most likely: the workers' calls go
                    // to the board themselves; this loop must not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if !stream.peer_cred().is_ok_and(|cred| cred.uid() == me) {
                continue;
            }
            let board = board.clone();
            let db = db.clone();
            let closing = closing.clone();
            workers.spawn(async move {
                let _ = answer_worker(stream, &*board, &db, closing).await;
            });
        }
        while workers.join_next().await.is_some() {}
    }
}

/// Answers one worker's calls, one line each, until it hangs up or the
/// dispatcher closes. A call is read whole and answered before the closing
/// is looked at, so `closing` tells the worker that nothing it sent
/// without an answer was made.
async fn answer_worker(
    stream: UnixStream,
    board: &dyn AnyBoard,
    db: &str,
    mut closing: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut line = String::new();
        let mut limited = (&mut reader).take(LINE_LIMIT);
        let read = tokio::select! {
            read = limited.read_line(&mut line) => Some(read?),
            _ = closing.wait_for(|closing| *closing) => None,
        };
        let Some(read) = read else {
            let mut text = serde_json::to_string(&LinkAnswer::Closing).unwrap_or_default();
            text.push('\n');
            return write.write_all(text.as_bytes()).await;
        };
        // Only a whole line is a call: one cut short by the worker's end or
        // by the length limit is not made, and the link ends unanswered.
        if read == 0 || !line.ends_with('\n') {
            return Ok(());
        }
        let answer = match serde_json::from_str::<LinkRequest>(&line) {
            Ok(request) if request.claim.db == db => {
                perform(board, &request.claim, request.call).await
            }
            Ok(_) | Err(_) => LinkAnswer::NotMine,
        };
        let mut text = serde_json::to_string(&answer).unwrap_or_default();
        text.push('\n');
        write.write_all(text.as_bytes()).await?;
    }
}

/// Makes `call` with `claim` on `board`.
/// What a worker's call may reach of a board, checked by the compiler:
/// core's worker port (every write fenced by the worker's own claim) and the
/// view of its card; never the dispatcher's or an operator's calls, which
/// would let a worker reach past its fence.
#[async_trait]
trait WorkersBoard: Board {
    async fn card_view(&self, task_id: &str) -> Result<TaskView, BoardError>;
}

#[async_trait]
impl<B: AnyBoard + ?Sized> WorkersBoard for B {
    async fn card_view(&self, task_id: &str) -> Result<TaskView, BoardError> {
        self.show_task(task_id).await
    }
}

async fn perform<B: WorkersBoard + ?Sized>(board: &B, claim: &Claim, call: LinkCall) -> LinkAnswer {
    let done = |result: Result<(), BoardError>| match result {
        Ok(()) => LinkAnswer::Done,
        Err(error) => LinkAnswer::Failed { error },
    };
    match call {
        LinkCall::ShowTask { bind } => match board.card_view(&claim.task_id).await {
            // A card is shown over the link only to the run holding it;
            // anybody else reads the board the way it always could.
            Ok(view)
                if view.task.current_run_id == Some(claim.run_id)
                    && view.task.claim_lock.as_deref() == Some(claim.claim_lock.as_str()) =>
            {
                // A bind refused here is the worker's to make again: its
                // own call waits out a lease that only lapsed.
                let bound = match bind {
                    Some(pid) => board.bind_worker(claim, pid).await.is_ok(),
                    None => false,
                };
                LinkAnswer::View {
                    view: Box::new(view),
                    bound,
                }
            }
            Ok(_) => LinkAnswer::NotMine,
            Err(error) => LinkAnswer::Failed { error },
        },
        LinkCall::Prove { identity } => match board.prove_claim(claim, identity).await {
            Ok(()) => LinkAnswer::Done,
            Err(reason) => LinkAnswer::NotLive { reason },
        },
        LinkCall::Bind { pid } => done(board.bind_worker(claim, pid).await),
        LinkCall::BookResult { result } => done(board.book_result(claim, &result).await),
        LinkCall::RunStatus => match board.run_status(claim).await {
            Ok(status) => LinkAnswer::Status { status },
            Err(error) => LinkAnswer::Failed { error },
        },
        LinkCall::Heartbeat { note } => match board.heartbeat(claim, note).await {
            Ok(at) => LinkAnswer::Expires { at },
            Err(error) => LinkAnswer::Failed { error },
        },
        LinkCall::Complete { handoff } => done(board.hand_off(claim, &handoff).await),
        LinkCall::Block { reason, kind } => done(board.block(claim, &reason, kind).await),
        LinkCall::SettleOverrun { overrun, policy } => {
            done(board.settle_overrun(claim, &overrun, &policy).await)
        }
        LinkCall::Comment { author, text } => done(board.comment(claim, &author, &text).await),
        LinkCall::AppendEvent { kind, payload } => {
            done(board.append_event(claim, &kind, payload).await)
        }
    }
}

/// The worker's connection to its dispatcher.
struct Link {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

/// How a call sent over the link went.
enum Asked {
    Answered(LinkAnswer),
    /// Never reached the dispatcher, or it answered `not_mine`: nothing was
    /// done, and the call, handed back, is the board's to make.
    NotSent(LinkCall),
    /// Sent, but the answer was lost: it may have been made.
    Lost(String),
}

/// A worker's board: its dispatcher's over the link while the link holds,
/// the board itself otherwise.
pub(crate) struct LinkedBoard {
    link: tokio::sync::Mutex<Option<Link>>,
    /// How long an answer may take ([`LINK_PATIENCE`]).
    patience: Duration,
    own: tokio::sync::OnceCell<Arc<dyn AnyBoard>>,
    claim: Claim,
    clock: Arc<dyn Clock>,
    env: Environment,
    /// The pid the dispatcher bound with the card's view, until the
    /// worker's own bind of that pid finds it done.
    bound_with_view: std::sync::Mutex<Option<u32>>,
}

impl std::fmt::Debug for LinkedBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkedBoard")
            .field("task_id", &self.claim.task_id)
            .field("opened", &self.own.initialized())
            .finish_non_exhaustive()
    }
}

impl LinkedBoard {
    /// Connects to the dispatcher at `socket` (`@` and an abstract name);
    /// `None` when nobody listens there.
    pub(crate) async fn connect(
        socket: &str,
        claim: &Claim,
        clock: Arc<dyn Clock>,
        env: &Environment,
    ) -> Option<Self> {
        let name = socket.strip_prefix('@')?;
        let address = SocketAddr::from_abstract_name(name.as_bytes()).ok()?;
        let stream = std::os::unix::net::UnixStream::connect_addr(&address).ok()?;
        stream.set_nonblocking(true).ok()?;
        let (read, write) = UnixStream::from_std(stream).ok()?.into_split();
        Some(Self {
            link: tokio::sync::Mutex::new(Some(Link {
                read: BufReader::new(read),
                write,
            })),
            patience: LINK_PATIENCE,
            own: tokio::sync::OnceCell::new(),
            claim: claim.clone(),
            clock,
            env: env.clone(),
            bound_with_view: std::sync::Mutex::new(None),
        })
    }

    /// True while calls still go to the dispatcher.
    #[cfg(test)]
    pub(crate) async fn linked(&self) -> bool {
        self.link.lock().await.is_some()
    }

    /// Sends `call` and reads its answer. The link is out of its mutex for
    /// the exchange and goes back only after a whole answer of the right
    /// kind: an exchange cut short (cancelled, timed out, an answer cut or
    /// of another kind) drops the link, so that no later call can read an
    /// answer that was not its own.
    async fn ask(&self, claim: &Claim, call: LinkCall) -> Asked {
        let mut held = self.link.lock().await;
        let Some(mut link) = held.take() else {
            return Asked::NotSent(call);
        };
        let request = LinkRequest {
            claim: claim.clone(),
            call: &call,
        };
        let mut line = serde_json::to_string(&request).unwrap_or_default();
        line.push('\n');
        let exchange = async {
            // A dispatcher that is gone takes no call: the board's to make.
            // (It makes only a whole line, and the newline is written last.)
            if link.write.write_all(line.as_bytes()).await.is_err() {
                return None;
            }
            let mut answer = String::new();
            let read = (&mut link.read)
                .take(LINE_LIMIT)
                .read_line(&mut answer)
                .await;
            Some(match read {
                Ok(0) => Asked::Lost("the dispatcher hung up before it answered".to_owned()),
                Ok(_) if !answer.ends_with('\n') => {
                    Asked::Lost("the dispatcher's answer was cut short".to_owned())
                }
                Ok(_) => match serde_json::from_str::<LinkAnswer>(&answer) {
                    Ok(LinkAnswer::NotMine | LinkAnswer::Closing) => return None,
                    Ok(answer) if request.call.answered_by(&answer) => Asked::Answered(answer),
                    Ok(other) => Asked::Lost(format!(
                        "the dispatcher answered another question ({other:?})"
                    )),
                    Err(error) => {
                        Asked::Lost(format!("the dispatcher's answer was unreadable ({error})"))
                    }
                },
                Err(error) => Asked::Lost(format!("the dispatcher did not answer ({error})")),
            })
        };
        let patience = self.patience;
        let asked = tokio::time::timeout(patience, exchange)
            .await
            .unwrap_or_else(|_| {
                Some(Asked::Lost(format!(
                    "the dispatcher did not answer within {} ms",
                    patience.as_millis()
                )))
            })
            .unwrap_or(Asked::NotSent(call));
        if matches!(asked, Asked::Answered(_)) {
            *held = Some(link);
        }
        // Otherwise the rest of the run goes to the board.
        asked
    }

    /// The board itself, opened at its first need.
    async fn own(&self) -> Result<&Arc<dyn AnyBoard>, BoardError> {
        self.own
            .get_or_try_init(|| async {
                let opened = open_claim_board(&self.claim, self.clock.clone(), &self.env).await;
                match opened {
                    Ok(board) => Ok(board.into_shared(Arc::new(TokioOffload))),
                    Err(error) => Err(match error.downcast_ref::<BoardError>() {
                        Some(error) => error.clone(),
                        None => BoardError::Unusable {
                            path: self.claim.db.clone(),
                            message: format!("{error:#}"),
                        },
                    }),
                }
            })
            .await
    }

    /// The card this worker's claim names, with its runs and events; over
    /// the link, `pid` is bound to the claim in the same exchange, and the
    /// worker's bind of it later is already done (one exchange fewer before
    /// the agent starts).
    pub(crate) async fn show_task(&self, pid: u32) -> Result<TaskView, BoardError> {
        let call = LinkCall::ShowTask { bind: Some(pid) };
        match self.ask(&self.claim, call).await {
            Asked::Answered(LinkAnswer::View { view, bound }) => {
                if bound {
                    *self
                        .bound_with_view
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(pid);
                }
                Ok(*view)
            }
            Asked::Answered(answer) => Err(refusal(answer)),
            // The view is asked of the board again. The bind may have been
            // made with the lost answer; the worker's own bind follows and
            // binds the same pid again, which only repeats the record.
            Asked::Lost(_) | Asked::NotSent(_) => {
                self.own().await?.show_task(&self.claim.task_id).await
            }
        }
    }

    /// A write: over the link, else the same call on the board when the
    /// dispatcher never took it (one dispatch for both, [`perform`]). One
    /// whose answer was lost is never made a second time here (it may have
    /// been made): it fails as a passing board fault.
    async fn write(&self, claim: &Claim, call: LinkCall) -> Result<(), BoardError> {
        match self.ask(claim, call).await {
            Asked::Answered(answer) => done(answer),
            Asked::Lost(why) => Err(BoardError::Storage(why)),
            Asked::NotSent(call) => done(perform(&**self.own().await?, claim, call).await),
        }
    }
}

/// The error an answer carries, or the one it is when it answers another
/// question.
fn refusal(answer: LinkAnswer) -> BoardError {
    match answer {
        LinkAnswer::Failed { error } => error,
        other => BoardError::Storage(format!(
            "the dispatcher answered another question ({other:?})"
        )),
    }
}

fn done(answer: LinkAnswer) -> Result<(), BoardError> {
    match answer {
        LinkAnswer::Done => Ok(()),
        other => Err(refusal(other)),
    }
}

#[async_trait]
impl Board for LinkedBoard {
    async fn prove_claim(&self, claim: &Claim, identity: ProofIdentity) -> Result<(), NotLive> {
        match self.ask(claim, LinkCall::Prove { identity }).await {
            Asked::Answered(LinkAnswer::Done) => Ok(()),
            Asked::Answered(LinkAnswer::NotLive { reason }) => Err(reason),
            // Fails closed: an answer that is not a verdict proves nothing.
            Asked::Answered(other) => Err(NotLive::Unreadable(refusal(other).to_string())),
            // A proof is a read: one whose answer was lost is made again on
            // the board, and proves nothing if the board cannot be read.
            Asked::Lost(_) | Asked::NotSent(_) => match self.own().await {
                Ok(board) => board.prove_claim(claim, identity).await,
                Err(error) => Err(NotLive::Unreadable(error.to_string())),
            },
        }
    }

    async fn bind_worker(&self, claim: &Claim, pid: u32) -> Result<(), BoardError> {
        let bound = self
            .bound_with_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if bound == Some(pid) && *claim == self.claim {
            return Ok(());
        }
        self.write(claim, LinkCall::Bind { pid }).await
    }

    async fn book_result(&self, claim: &Claim, result: &WorkerResult) -> Result<(), BoardError> {
        let result = result.clone();
        self.write(claim, LinkCall::BookResult { result }).await
    }

    async fn run_status(&self, claim: &Claim) -> Result<RunStatus, BoardError> {
        match self.ask(claim, LinkCall::RunStatus).await {
            Asked::Answered(LinkAnswer::Status { status }) => Ok(status),
            Asked::Answered(answer) => Err(refusal(answer)),
            Asked::Lost(_) | Asked::NotSent(_) => self.own().await?.run_status(claim).await,
        }
    }

    async fn heartbeat(&self, claim: &Claim, note: Option<String>) -> Result<i64, BoardError> {
        let call = LinkCall::Heartbeat { note: note.clone() };
        match self.ask(claim, call).await {
            Asked::Answered(LinkAnswer::Expires { at }) => Ok(at),
            Asked::Answered(answer) => Err(refusal(answer)),
            Asked::Lost(why) => Err(BoardError::Storage(why)),
            Asked::NotSent(_) => self.own().await?.heartbeat(claim, note).await,
        }
    }

    async fn hand_off(&self, claim: &Claim, handoff: &Handoff) -> Result<(), BoardError> {
        let handoff = handoff.clone();
        self.write(claim, LinkCall::Complete { handoff }).await
    }

    // A run's fan-out is rare: it is made on the worker's own connection
    // to the board, through the same fenced write, never over the link.
    async fn attach(
        &self,
        claim: &Claim,
        new: &kanban_core::attachments::NewAttachment,
    ) -> Result<i64, BoardError> {
        self.own().await?.attach(claim, new).await
    }

    async fn create_child(&self, claim: &Claim, task: &NewTask) -> Result<String, BoardError> {
        self.own().await?.create_child(claim, task).await
    }

    async fn link_child(
        &self,
        claim: &Claim,
        parent: &str,
        child: &str,
    ) -> Result<bool, BoardError> {
        self.own().await?.link_child(claim, parent, child).await
    }

    async fn unblock_child(&self, claim: &Claim, task_id: &str) -> Result<(), BoardError> {
        self.own().await?.unblock_child(claim, task_id).await
    }

    async fn block(
        &self,
        claim: &Claim,
        reason: &str,
        kind: Option<BlockKind>,
    ) -> Result<(), BoardError> {
        let reason = reason.to_owned();
        self.write(claim, LinkCall::Block { reason, kind }).await
    }

    async fn settle_overrun(
        &self,
        claim: &Claim,
        overrun: &Overrun,
        policy: &FailurePolicy,
    ) -> Result<(), BoardError> {
        let call = LinkCall::SettleOverrun {
            overrun: overrun.clone(),
            policy: *policy,
        };
        self.write(claim, call).await
    }

    async fn comment(&self, claim: &Claim, author: &str, text: &str) -> Result<(), BoardError> {
        let call = LinkCall::Comment {
            author: author.to_owned(),
            text: text.to_owned(),
        };
        self.write(claim, call).await
    }

    async fn append_event(
        &self,
        claim: &Claim,
        kind: &str,
        payload: serde_json::Value,
    ) -> Result<(), BoardError> {
        let kind = kind.to_owned();
        self.write(claim, LinkCall::AppendEvent { kind, payload })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, Write as _};
    use std::path::Path;

    use kanban_board_sqlite::{SqliteBoard, SystemClock};
    use kanban_core::{BoardAdmin, NewTask, TaskStatus};

    use super::*;

    async fn claimed_card(board: &SqliteBoard, title: &str) -> Claim {
        let id = board
            .create_task(&NewTask {
                title: title.into(),
                ..NewTask::default()
            })
            .await
            .unwrap();
        board
            .claim_task(&id, 900, "test:1:lock")
            .await
            .unwrap()
            .unwrap()
            .claim
    }

    /// How a test's dispatcher ends.
    enum Stop {
        /// As a dispatcher that leaves: each worker is told it is closing.
        Close,
        /// As a dispatcher that dies: its connections just end.
        Kill,
    }

    /// A dispatcher's link on a runtime of its own, as in its own process.
    fn dispatcher(board: &SqliteBoard) -> (String, tokio::sync::oneshot::Sender<Stop>) {
        let served: Arc<dyn AnyBoard> = Arc::new(board.clone());
        let db = board.path().display().to_string();
        let (socket, stop) = (std::sync::mpsc::channel(), tokio::sync::oneshot::channel());
        let (named, stopped) = (socket.0, stop.1);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let server = LinkServer::bind().unwrap();
                let (name, socket) = server.env_pair();
                assert_eq!(name, LINK_VAR);
                named.send(socket).unwrap();
                let (closing, closed) = tokio::sync::watch::channel(false);
                let serving = tokio::spawn(server.serve(served, db, closed));
                match stopped.await {
                    // Closed: every worker is told so.
                    Ok(Stop::Close) => {
                        let _ = closing.send(true);
                        let _ = serving.await;
                    }
                    // Killed: the runtime and every connection just end.
                    Ok(Stop::Kill) | Err(_) => {}
                }
            });
        });
        (socket.1.recv().unwrap(), stop.0)
    }

    /// A dispatcher that takes one call and hangs up without an answer.
    fn one_that_hangs_up() -> String {
        one_that_answers(None)
    }

    /// A dispatcher that takes one call, gives `answer` (if any) whatever it
    /// was, and hangs up.
    fn one_that_answers(answer: Option<&'static str>) -> String {
        one_that_answers_then_waits(answer, Duration::ZERO)
    }

    /// The same, holding the connection open for `hold` before it hangs up.
    fn one_that_answers_then_waits(answer: Option<&'static str>, hold: Duration) -> String {
        let name = format!("kanban-test-{}", crate::supervisor::random_hex());
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            std::io::BufReader::new(&stream)
                .read_line(&mut line)
                .unwrap();
            if let Some(answer) = answer {
                (&stream).write_all(answer.as_bytes()).unwrap();
            }
            std::thread::sleep(hold);
        });
        format!("@{name}")
    }

    fn status(board: &SqliteBoard, claim: &Claim) -> TaskStatus {
        crate::runtime::block_on(board.show_task(&claim.task_id))
            .unwrap()
            .task
            .status
            .known()
            .unwrap()
    }

    /// The pids bound to `claim`'s run, in the order they were bound.
    fn bound_pids(board: &SqliteBoard, claim: &Claim) -> Vec<u64> {
        crate::runtime::block_on(board.show_task(&claim.task_id))
            .unwrap()
            .events
            .iter()
            .filter(|event| event.kind == "worker_bound" && event.run_id == Some(claim.run_id))
            .filter_map(|event| event.payload["pid"].as_u64())
            .collect()
    }

    fn file_board(dir: &Path, name: &str) -> SqliteBoard {
        SqliteBoard::create(dir.join(name), Arc::new(SystemClock)).unwrap()
    }

    async fn every_call_goes_over_the_link(
        served: &SqliteBoard,
        socket: &str,
        clock: &Arc<dyn Clock>,
        env: &Environment,
    ) {
        // A claim on the dispatcher's board: every call over the link.
        let claim = claimed_card(served, "linked").await;
        let linked = LinkedBoard::connect(socket, &claim, clock.clone(), env)
            .await
            .unwrap();
        // The view comes with the pid bound: the worker's own bind of
        // that pid is done already, another pid's is a call of its own.
        assert_eq!(linked.show_task(4242).await.unwrap().task.id, claim.task_id);
        assert_eq!(bound_pids(served, &claim), [4242]);
        linked.bind_worker(&claim, 4242).await.unwrap();
        assert_eq!(bound_pids(served, &claim), [4242]);
        linked.bind_worker(&claim, 4343).await.unwrap();
        linked.bind_worker(&claim, 4242).await.unwrap();
        assert_eq!(bound_pids(served, &claim), [4242, 4343, 4242]);
        assert!(linked.heartbeat(&claim, None).await.unwrap() > 0);
        linked
            .prove_claim(&claim, ProofIdentity::BoundOwner(4242))
            .await
            .unwrap();
        linked.comment(&claim, "agent", "hello").await.unwrap();
        // Refusals keep their kind on the way back.
        let mut stale = claim.clone();
        stale.claim_lock = "someone:2:else".into();
        let refused = linked.complete(&stale, "not mine", None).await;
        assert!(
            matches!(refused, Err(BoardError::LeaseLost { .. })),
            "{refused:?}"
        );
        let unproven = linked.prove_claim(&stale, ProofIdentity::AnyProcess).await;
        assert!(unproven.is_err(), "{unproven:?}");
        linked.complete(&claim, "done", None).await.unwrap();
        assert_eq!(linked.run_status(&claim).await.unwrap(), RunStatus::Done);
        assert!(linked.linked().await, "every call went over the link");
        assert!(
            !linked.own.initialized(),
            "the worker never opened the board"
        );
        assert_eq!(status(served, &claim), TaskStatus::Done);
    }

    async fn another_boards_claim_is_made_on_that_board(
        served: &SqliteBoard,
        other: &SqliteBoard,
        socket: &str,
        clock: &Arc<dyn Clock>,
        env: &Environment,
    ) {
        // A claim on another board is not the dispatcher's to make: the
        // worker makes it on that board itself.
        let elsewhere_claim = claimed_card(other, "elsewhere").await;
        let elsewhere = LinkedBoard::connect(socket, &elsewhere_claim, clock.clone(), env)
            .await
            .unwrap();
        elsewhere
            .complete(&elsewhere_claim, "done", None)
            .await
            .unwrap();
        assert!(!elsewhere.linked().await);
        assert_eq!(status(other, &elsewhere_claim), TaskStatus::Done);
        assert_eq!(
            crate::runtime::block_on(served.show_task(&elsewhere_claim.task_id)).err(),
            Some(BoardError::TaskNotFound(elsewhere_claim.task_id.clone())),
            "nothing reached the dispatcher's board"
        );
    }

    async fn a_dispatcher_that_leaves_hands_the_worker_to_the_board(
        served: &SqliteBoard,
        clock: &Arc<dyn Clock>,
        env: &Environment,
    ) {
        // The dispatcher leaves mid-run: the worker is told so and goes
        // on, on the board.
        let (leaving, leave) = dispatcher(served);
        let left_claim = claimed_card(served, "left").await;
        let left = LinkedBoard::connect(&leaving, &left_claim, clock.clone(), env)
            .await
            .unwrap();
        left.bind_worker(&left_claim, 8).await.unwrap();
        assert!(left.linked().await);
        leave
            .send(Stop::Close)
            .unwrap_or_else(|_| panic!("stopped"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        left.complete(&left_claim, "done", None).await.unwrap();
        assert!(!left.linked().await);
        assert_eq!(status(served, &left_claim), TaskStatus::Done);
    }

    async fn a_dispatcher_that_dies_hands_the_worker_to_the_board(
        served: &SqliteBoard,
        socket: &str,
        stop: tokio::sync::oneshot::Sender<Stop>,
        clock: &Arc<dyn Clock>,
        env: &Environment,
    ) {
        // The dispatcher dies mid-run: the worker goes on, on the board.
        let orphan_claim = claimed_card(served, "orphaned").await;
        let orphan = LinkedBoard::connect(socket, &orphan_claim, clock.clone(), env)
            .await
            .unwrap();
        orphan.bind_worker(&orphan_claim, 7).await.unwrap();
        assert!(orphan.linked().await);
        stop.send(Stop::Kill).unwrap_or_else(|_| panic!("stopped"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        orphan.heartbeat(&orphan_claim, None).await.unwrap();
        orphan.complete(&orphan_claim, "done", None).await.unwrap();
        assert!(!orphan.linked().await);
        assert_eq!(status(served, &orphan_claim), TaskStatus::Done);
        assert!(
            LinkedBoard::connect(socket, &orphan_claim, clock.clone(), env)
                .await
                .is_none(),
            "nobody listens there any more"
        );
    }

    async fn a_lost_answer_is_not_made_twice(
        served: &SqliteBoard,
        clock: Arc<dyn Clock>,
        env: &Environment,
    ) {
        // An answer lost on the way (a dispatcher killed mid-call): the
        // write failed, is not made a second way, and what follows goes
        // to the board.
        let lost_claim = claimed_card(served, "lost").await;
        let lost = LinkedBoard::connect(&one_that_hangs_up(), &lost_claim, clock.clone(), env)
            .await
            .unwrap();
        let failed = lost.complete(&lost_claim, "done", None).await;
        assert!(
            matches!(&failed, Err(BoardError::Storage(why)) if why.contains("hung up")),
            "{failed:?}"
        );
        assert_eq!(status(served, &lost_claim), TaskStatus::Running);
        lost.complete(&lost_claim, "done", None).await.unwrap();
        assert_eq!(status(served, &lost_claim), TaskStatus::Done);
        // A read whose answer was lost is asked of the board instead.
        let reread_claim = claimed_card(served, "reread").await;
        let reread = LinkedBoard::connect(&one_that_hangs_up(), &reread_claim, clock, env)
            .await
            .unwrap();
        assert_eq!(
            reread.show_task(7).await.unwrap().task.id,
            reread_claim.task_id
        );
        reread
            .prove_claim(&reread_claim, ProofIdentity::AnyProcess)
            .await
            .unwrap();
    }

    #[test]
    fn a_workers_calls_go_to_its_dispatcher_and_to_the_board_itself_when_they_cannot() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let served = file_board(dir.path(), "served.db");
        let other = file_board(dir.path(), "other.db");
        let (socket, stop) = dispatcher(&served);
        let env = Environment::default();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        runtime.block_on(async {
            every_call_goes_over_the_link(&served, &socket, &clock, &env).await;
            another_boards_claim_is_made_on_that_board(&served, &other, &socket, &clock, &env)
                .await;
            a_dispatcher_that_leaves_hands_the_worker_to_the_board(&served, &clock, &env).await;
            a_dispatcher_that_dies_hands_the_worker_to_the_board(
                &served, &socket, stop, &clock, &env,
            )
            .await;
            a_lost_answer_is_not_made_twice(&served, clock, &env).await;
        });
    }

    #[test]
    fn a_leaving_dispatcher_says_so_and_its_workers_calls_are_made_on_the_board() {
        let dir = tempfile::tempdir().unwrap();
        let served = file_board(dir.path(), "served.db");
        // The dispatcher tells a connected worker it is leaving.
        let (socket, stop) = dispatcher(&served);
        let name = socket.trim_start_matches('@');
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let stream = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        stop.send(Stop::Close).unwrap_or_else(|_| panic!("stopped"));
        let mut said = String::new();
        std::io::BufReader::new(&stream)
            .read_line(&mut said)
            .unwrap();
        assert_eq!(said.trim(), r#"{"outcome":"closing"}"#);
        // A worker told so makes the call it sent on the board, once.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let claim = claimed_card(&served, "told").await;
            let closing = one_that_answers(Some("{\"outcome\":\"closing\"}\n"));
            let told = LinkedBoard::connect(
                &closing,
                &claim,
                Arc::new(SystemClock),
                &Environment::default(),
            )
            .await
            .unwrap();
            told.complete(&claim, "done", None).await.unwrap();
            assert!(!told.linked().await);
            assert_eq!(status(&served, &claim), TaskStatus::Done);
        });
    }

    #[test]
    fn an_answer_cut_short_late_or_to_another_question_fails_the_call_and_ends_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let served = file_board(dir.path(), "served.db");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let cases: [(&str, Option<&'static str>, Duration); 3] = [
                ("cut short", Some("{\"outcome\":\"done\"}"), Duration::ZERO),
                (
                    "another question",
                    Some("{\"outcome\":\"expires\",\"at\":5}\n"),
                    Duration::from_secs(2),
                ),
                ("within 200 ms", None, Duration::from_secs(2)),
            ];
            for (why, answer, hold) in cases {
                let claim = claimed_card(&served, why).await;
                let mut board = LinkedBoard::connect(
                    &one_that_answers_then_waits(answer, hold),
                    &claim,
                    Arc::new(SystemClock),
                    &Environment::default(),
                )
                .await
                .unwrap();
                board.patience = Duration::from_millis(200);
                let failed = board.complete(&claim, "done", None).await;
                assert!(
                    matches!(&failed, Err(BoardError::Storage(message)) if message.contains(why)),
                    "{why}: {failed:?}"
                );
                assert!(!board.linked().await, "{why}: the link is dropped");
                assert_eq!(status(&served, &claim), TaskStatus::Running, "{why}");
                // What follows goes to the board.
                board.complete(&claim, "done", None).await.unwrap();
                assert_eq!(status(&served, &claim), TaskStatus::Done, "{why}");
            }
        });
    }

    #[test]
    fn a_show_or_view_of_an_older_kanban_binds_nothing() {
        // A worker of an older kanban asks for the view alone; a dispatcher
        // of an older kanban answers with the view alone, and the worker
        // then binds with a call of its own.
        let call: LinkCall = serde_json::from_str(r#"{"call":"show_task"}"#).unwrap();
        assert!(
            matches!(call, LinkCall::ShowTask { bind: None }),
            "{call:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let board = file_board(dir.path(), "served.db");
        let claim = crate::runtime::block_on(claimed_card(&board, "old"));
        let view = crate::runtime::block_on(board.show_task(&claim.task_id)).unwrap();
        let mut answer = serde_json::to_value(LinkAnswer::View {
            view: Box::new(view),
            bound: true,
        })
        .unwrap();
        assert_eq!(answer["bound"], true);
        answer.as_object_mut().unwrap().remove("bound");
        let read: LinkAnswer = serde_json::from_value(answer).unwrap();
        assert!(matches!(read, LinkAnswer::View { bound: false, .. }));
    }

    #[test]
    fn a_dispatcher_makes_only_whole_lines_and_shows_a_card_only_to_its_run() {
        let dir = tempfile::tempdir().unwrap();
        let served = file_board(dir.path(), "served.db");
        let (socket, _stop) = dispatcher(&served);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (claim, stale) = runtime.block_on(async {
            let claim = claimed_card(&served, "cut").await;
            let taken = claimed_card(&served, "taken").await;
            let mut stale = taken.clone();
            stale.claim_lock = "someone:2:else".into();
            (claim, stale)
        });
        // A whole call but for its newline, then the worker's end.
        let request = LinkRequest {
            claim: claim.clone(),
            call: LinkCall::Complete {
                handoff: Handoff::new("cut", None),
            },
        };
        let name = socket.trim_start_matches('@');
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let stream = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
        (&stream)
            .write_all(serde_json::to_string(&request).unwrap().as_bytes())
            .unwrap();
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut &stream, &mut answer).unwrap();
        assert_eq!(answer, "", "no answer to a line cut short");
        assert_eq!(status(&served, &claim), TaskStatus::Running, "and no call");
        // Another run's claim is not shown the card: the worker reads the
        // board itself, as anybody can.
        runtime.block_on(async {
            let board = LinkedBoard::connect(
                &socket,
                &stale,
                Arc::new(SystemClock),
                &Environment::default(),
            )
            .await
            .unwrap();
            assert_eq!(board.show_task(7).await.unwrap().task.id, stale.task_id);
            assert!(bound_pids(&served, &stale).is_empty(), "nor bound");
            assert!(!board.linked().await);
            assert!(board.own.initialized(), "read from the board itself");
        });
    }

    #[test]
    fn a_dispatcher_answers_a_line_it_cannot_read_not_mine_and_keeps_listening() {
        let dir = tempfile::tempdir().unwrap();
        let served = file_board(dir.path(), "served.db");
        let (socket, _stop) = dispatcher(&served);
        let name = socket.trim_start_matches('@');
        let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let stream = std::os::unix::net::UnixStream::connect_addr(&address).unwrap();
        let mut reader = std::io::BufReader::new(&stream);
        let mut answers = Vec::new();
        for line in [
            "not json\n",
            "{\"claim\":{},\"call\":{\"call\":\"show_task\"}}\n",
            "{\"call\":\"unheard_of\"}\n",
        ] {
            (&stream).write_all(line.as_bytes()).unwrap();
            let mut answer = String::new();
            reader.read_line(&mut answer).unwrap();
            answers.push(answer.trim().to_owned());
        }
        assert_eq!(answers, vec![r#"{"outcome":"not_mine"}"#; 3]);
    }
}
