//! Transports: how bytes from a client become JSON-RPC messages for the service, and back,
//! without a client being able to hurt the daemon. One entry point per concern:
//! [`SessionTransport`] (one session over a byte stream: framing, protocol errors,
//! backpressure, idle timeouts), [`Outbox`] (the bounded, disconnect-safe writer) and
//! [`Registry`] (connection bounds, in total and per uid, with idle eviction). No transport
//! knows what a tool call does; the MCP handler and the service do.

mod framing;
mod outbox;
mod registry;
mod session;

pub use framing::{
    classify, error_reply, Inbound, ADMIN_PREFIX, KEEPALIVE_METHOD, MCP_ONLY_METHOD,
};

use std::future::Future;
use std::pin::Pin;

/// What an admin request comes to: its result, or a JSON-RPC error code and message.
pub type AdminReply<'a> =
    Pin<Box<dyn Future<Output = Result<serde_json::Value, (i32, String)>> + Send + 'a>>;

/// The admin channel's handler (JSON-RPC methods `stsd/...` on the daemon's socket, or
/// `POST /admin` over HTTP): the transport hands it who is asking (a peer uid, or an HTTP
/// principal with its rights), the method and the params, and writes back what it answers.
/// Ok is the result; Err a JSON-RPC error code and message.
pub trait AdminHandler: Send + Sync {
    fn handle(
        &self,
        who: crate::call::Subject,
        method: String,
        params: serde_json::Value,
    ) -> AdminReply<'_>;
}
pub use outbox::{Outbox, Writer};
pub use registry::{Activity, Registry, Ticket};
pub use session::SessionTransport;

use std::time::Duration;
use stsd_profiles::baseline::DaemonConfig;

/// Per-session bounds, from `[daemon]`.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest JSON-RPC message (one line).
    pub max_request_bytes: usize,
    /// Replies queued for a client that is not reading them; beyond it the session stops
    /// reading requests.
    pub max_outbox_bytes: usize,
    /// How long the queue may stay over its bound before the session is closed.
    pub stall_timeout: Duration,
    /// Requests read and not yet answered; beyond it the session stops reading.
    pub max_pending_requests: usize,
    /// A session with nothing in flight is closed after this long without a message
    /// (None: never).
    pub idle_timeout: Option<Duration>,
    /// A new connection must send its first message within this time (None: no limit).
    pub first_message_timeout: Option<Duration>,
}

impl Limits {
    pub fn from_config(d: &DaemonConfig) -> Limits {
        Limits {
            max_request_bytes: d.max_request_bytes.max(1024),
            max_outbox_bytes: d.max_outbox_bytes.max(64 * 1024),
            stall_timeout: Duration::from_millis(d.stall_timeout_ms.max(1)),
            max_pending_requests: d.max_pending_requests.max(1),
            idle_timeout: (d.idle_timeout_seconds > 0)
                .then(|| Duration::from_secs(d.idle_timeout_seconds)),
            first_message_timeout: Some(Duration::from_millis(d.first_message_timeout_ms.max(1))),
        }
    }
}

/// Gives the memory a finished session freed back to the kernel. glibc keeps freed heap
/// for reuse; after a client that pipelined thousands of requests leaves, that would hold
/// the daemon at its peak for good. At most once a second, on a blocking thread (a trim
/// walks the heap), so a stream of short sessions costs nothing measurable.
pub fn release_memory() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(crate::store::now_ms()).unwrap_or(0);
    let last = LAST_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 1000
        || LAST_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    tokio::task::spawn_blocking(|| {
        // SAFETY: malloc_trim only releases free memory of glibc's heap; no pointer is passed.
        unsafe { libc::malloc_trim(0) };
    });
}
