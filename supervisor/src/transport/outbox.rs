//! Outbound: every message to a client is serialized once into a queue that one writer task
//! drains into the socket. The queue's size is known at all times, so the reader can stop
//! reading while it is over its bound (backpressure), and a write that fails (EPIPE, reset)
//! ends the session instead of the daemon: SIGPIPE is ignored and the error is a disconnect.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    drained: Arc<Notify>,
    /// The writer has stopped (the peer is gone, or the session is over): nothing more goes out.
    dead: CancellationToken,
    /// The session's own token, cancelled when a write fails.
    session: CancellationToken,
    /// The session is over: the writer flushes what is queued and stops.
    finishing: CancellationToken,
}

pub struct Writer {
    task: tokio::task::JoinHandle<()>,
}

impl Outbox {
    /// Starts the writer task on `write`. `session` is cancelled when a write fails.
    pub fn start<W>(write: W, session: CancellationToken) -> (Outbox, Writer)
    where
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (tx, rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let out = Outbox {
            tx,
            queued: Arc::new(AtomicUsize::new(0)),
            drained: Arc::new(Notify::new()),
            dead: CancellationToken::new(),
            session,
            finishing: CancellationToken::new(),
        };
        let task = tokio::spawn(write_loop(write, rx, out.clone()));
        (out, Writer { task })
    }

    /// Queues one message (a newline is added). Fails once the peer is gone.
    pub fn push(&self, mut bytes: Vec<u8>) -> std::io::Result<()> {
        if self.dead.is_cancelled() {
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        bytes.push(b'\n');
        self.queued.fetch_add(bytes.len(), Ordering::SeqCst);
        self.tx
            .send(bytes)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Resolves the next time the writer finishes a message (or the session closes).
    pub async fn progress(&self) {
        tokio::select! {
            _ = self.drained.notified() => {}
            _ = self.dead.cancelled() => {}
        }
    }
}

impl Writer {
    /// Lets the writer flush what is queued for at most `grace`, then stops it.
    pub async fn finish(self, out: Outbox, grace: Duration) {
        let Outbox {
            tx,
            dead,
            finishing,
            ..
        } = out;
        drop(tx);
        finishing.cancel();
        let mut task = self.task;
        if tokio::time::timeout(grace, &mut task).await.is_err() {
            dead.cancel();
            task.abort();
        }
    }
}

async fn write_loop<W>(mut write: W, mut rx: mpsc::UnboundedReceiver<Vec<u8>>, out: Outbox)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    loop {
        let bytes = tokio::select! {
            biased;
            _ = out.dead.cancelled() => break,
            m = rx.recv() => match m {
                Some(b) => b,
                None => break,
            },
            // Other handles may outlive the session (rmcp keeps its transport a while); once
            // the queue is empty there is nothing more to wait for.
            _ = out.finishing.cancelled() => break,
        };
        let written = tokio::select! {
            _ = out.dead.cancelled() => break,
            r = write.write_all(&bytes) => r,
        };
        out.queued.fetch_sub(bytes.len(), Ordering::SeqCst);
        out.drained.notify_waiters();
        if let Err(e) = written {
            // EPIPE / ECONNRESET: the client went away. Its calls are cancelled by the token.
            tracing::debug!(error = %e, "client went away while being written to");
            out.dead.cancel();
            out.session.cancel();
            break;
        }
    }
    // Whatever is left is dropped with the receiver; the counter no longer matters.
    out.dead.cancel();
    let _ = tokio::time::timeout(Duration::from_millis(100), write.shutdown()).await;
    out.drained.notify_waiters();
}
