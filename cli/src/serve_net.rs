//! The web board's connections, bounded: how many a server holds at once,
//! how long a client may take to send a request's head, and how long a
//! response may wait for a reader that stopped reading. A client that opens
//! sockets and says nothing, more of them than the server has descriptors,
//! does not keep others out: a silent connection gives its place to a new
//! one, and none is held past [`HEADER_TIMEOUT`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// How long a client may take to send a request's head, the first or the
/// next on a kept-alive connection; then the connection is closed.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a response may wait for its reader before the connection is
/// closed: a reader that stopped reading holds no buffer for longer.
const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections held at once; past it, a connection that has not said
/// anything yet is closed for a new one.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// Descriptors kept free of connections for the board, logs and the runtime.
const SPARE_DESCRIPTORS: u64 = 64;

/// The connection cap this process can keep: [`MAX_CONNECTIONS`], fewer
/// when its descriptor limit is lower.
fn connection_cap() -> usize {
    let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let room = usize::try_from(limit.saturating_sub(SPARE_DESCRIPTORS)).unwrap_or(usize::MAX);
    room.clamp(8, MAX_CONNECTIONS)
}

/// The connections a server holds, and which of them said nothing yet.
#[derive(Default)]
struct Held {
    next: u64,
    /// By age: each connection's task, and whether it sent a byte.
    connections: std::collections::BTreeMap<u64, (tokio::task::AbortHandle, Arc<AtomicBool>)>,
}

impl Held {
    /// Makes room for one more: past the cap, the oldest connection that
    /// has not sent a byte is closed. False when every one is busy.
    fn make_room(&mut self, cap: usize) -> bool {
        self.connections.retain(|_, (task, _)| !task.is_finished());
        if self.connections.len() < cap {
            return true;
        }
        let silent = self
            .connections
            .iter()
            .find(|(_, (_, spoke))| !spoke.load(Ordering::Relaxed))
            .map(|(id, _)| *id);
        match silent.and_then(|id| self.connections.remove(&id)) {
            Some((task, _)) => {
                task.abort();
                true
            }
            None => false,
        }
    }
}

/// Serves `router` on `listener` until `stop` is ready. Every connection is
/// taken at once, so that a client behind a queue of silent sockets is
/// reached; past the cap, a silent connection makes room for it.
pub(crate) async fn serve(listener: TcpListener, router: Router, stop: impl Future<Output = ()>) {
    let cap = connection_cap();
    let held = Arc::new(Mutex::new(Held::default()));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let builder = Arc::new(builder);
    let accepting = async {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                // Out of descriptors, or a connection reset before it was
                // taken: wait a little rather than spin, and go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let mut held = held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !held.make_room(cap) {
                // Every connection is working: this one is closed at once,
                // and its client may try again.
                drop(stream);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let spoke = Arc::new(AtomicBool::new(false));
            let io = TokioIo::new(Bounded::new(stream, spoke.clone()));
            let service = TowerToHyperService::new(router.clone());
            let builder = builder.clone();
            let task = tokio::spawn(async move {
                let _ = builder.serve_connection(io, service).await;
            });
            let id = held.next;
            held.next += 1;
            held.connections.insert(id, (task.abort_handle(), spoke));
        }
    };
    tokio::select! {
        () = accepting => {}
        () = stop => {}
    }
}

/// A socket that says whether its client sent anything, and whose writes
/// fail once they waited [`WRITE_STALL_TIMEOUT`] for a reader.
struct Bounded {
    stream: TcpStream,
    spoke: Arc<AtomicBool>,
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Bounded {
    fn new(stream: TcpStream, spoke: Arc<AtomicBool>) -> Self {
        Self {
            stream,
            spoke,
            stalled: None,
        }
    }

    /// A pending write starts the clock; past it, the write fails.
    fn stall(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(WRITE_STALL_TIMEOUT)));
        stalled
            .as_mut()
            .poll(cx)
            .map(|()| io::Error::new(io::ErrorKind::TimedOut, "the client stopped reading"))
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.spoke.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => self.stall(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.stream).poll_flush(cx) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => self.stall(cx).map(Err),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => self.stall(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
