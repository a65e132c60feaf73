//! A session's bounds (a leaf: the sessions and the daemon share them).

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
