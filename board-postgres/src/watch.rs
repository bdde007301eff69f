//! Wake-ups through `LISTEN`/`NOTIFY`: a card became ready, a run ended.
//!
//! Writes that make work for a dispatcher notify the channel inside their
//! transaction (PostgreSQL delivers at commit, and folds repeats), and a
//! dispatcher's watch holds one listening connection. Polling on the tick
//! interval stays the fallback: a lost notification delays, never loses.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{AsyncMessage, Config, NoTls, Socket};

use crate::conn::Conn;
use crate::engine::Postgres;

/// The channel every board write that makes work notifies.
pub(crate) const CHANNEL: &str = "kanban_board";
const LISTEN: &str = "LISTEN kanban_board";

/// Notifies the board's listeners when the caller's transaction commits.
pub(crate) async fn notify(conn: &Conn) -> kanban_board::TxResult<()> {
    conn.execute("SELECT pg_notify($1, '')", &[&CHANNEL])
        .await?;
    Ok(())
}

/// Whether anybody made work on the board since the last look.
#[derive(Debug, Clone)]
pub struct ChangeWatch {
    flag: Arc<AtomicBool>,
}

impl ChangeWatch {
    /// True once after each notification (and after each reconnection,
    /// which may have missed one).
    pub fn changed(&mut self) -> bool {
        self.flag.swap(false, Ordering::AcqRel)
    }
}

impl Postgres {
    /// A watch on this board's notifications, listening on a connection of
    /// its own for as long as the board is open; it reconnects after a
    /// second when the connection drops.
    pub fn watch(&self) -> ChangeWatch {
        let flag = Arc::new(AtomicBool::new(false));
        let raised = flag.clone();
        let config = self.pool.config().clone();
        let tls = self.pool.tls().cloned();
        self.pool.runtime().spawn(async move {
            loop {
                match &tls {
                    None => listen(&config, NoTls, &raised).await,
                    Some(tls) => listen(&config, tls.clone(), &raised).await,
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        ChangeWatch { flag }
    }
}

/// Listens on one connection until it drops, raising `raised` for each
/// notification (and once it listens: it may have missed one).
async fn listen<T>(config: &Config, tls: T, raised: &AtomicBool)
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let Ok((client, mut connection)) = config.connect(tls).await else {
        return;
    };
    let listening = {
        let listen = client.batch_execute(LISTEN);
        // The connection must be polled for LISTEN to complete.
        let mut listen = std::pin::pin!(listen);
        loop {
            tokio::select! {
                done = &mut listen => break done.is_ok(),
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => {
                    if !matches!(message, Some(Ok(_))) {
                        break false;
                    }
                }
            }
        }
    };
    if listening {
        raised.store(true, Ordering::Release);
        while let Some(Ok(message)) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if matches!(message, AsyncMessage::Notification(_)) {
                raised.store(true, Ordering::Release);
            }
        }
    }
}
