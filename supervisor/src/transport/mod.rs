//! Transports: how bytes from a client become JSON-RPC messages for the service, and back,
//! without a client being able to hurt the daemon. One entry point per concern:
//! [`SessionTransport`] (one session over a byte stream: framing, protocol errors,
//! backpressure, idle timeouts), [`Outbox`] (the bounded, disconnect-safe writer) and
//! [`Registry`] (connection bounds, in total and per uid, with idle eviction). No transport
//! knows what a tool call does; the MCP handler and the service do.

mod admin;
mod framing;
mod limits;
mod outbox;
mod registry;
mod session;

pub use admin::{AdminHandler, AdminReply};
pub use limits::Limits;

pub use framing::{
    classify, error_reply, Inbound, ADMIN_PREFIX, KEEPALIVE_METHOD, MCP_ONLY_METHOD,
};

pub use outbox::{Outbox, Writer};
pub use registry::{Activity, Registry, Ticket};
pub use session::SessionTransport;

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
