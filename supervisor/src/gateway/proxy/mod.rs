//! The egress proxy a networked upstream reaches the world through: an HTTP/1.1 forward proxy
//! on 127.0.0.1 (an ephemeral port), one per upstream, under the same guard as `fetch`.
//!
//! Why the proxy resolves names and pins addresses: the guard's address rules (loopback,
//! private, link-local, cloud metadata...) judge IP addresses, not names. If the upstream
//! resolved a name itself, or the proxy checked one lookup and then let the connect resolve
//! again, a hostile DNS answer could pass the check with a public address and then point the
//! connection at 127.0.0.1 or 169.254.169.254 (DNS rebinding). So the upstream only ever names
//! a host; the proxy resolves it once through the broker's own path
//! ([`Broker::check_and_resolve`]: allowlist, address rules, `[egress] host_overrides`,
//! `trusted_ranges`), refuses the request if any answer is refused, and connects to one of
//! exactly those checked addresses.
//!
//! Two request forms: `CONNECT host:port` (https; after `200 Connection established` the
//! bytes are tunnelled both ways, unread) and absolute-form plain HTTP (`GET http://host/path`,
//! forwarded in origin-form with `Connection: close`, one request per connection). Refusals
//! answer `EGRESS_REFUSED: <rule>: <detail>` with 403 (policy), 502 (DNS or connect failed),
//! 400/408/411/413/431 (a malformed, slow, chunked, oversized request), 503 (too many
//! connections). Each request, refused or not, is reported once through `on_hop` when it ends.

mod head;
mod pipe;
mod serve;
#[cfg(test)]
mod tests;

use crate::egress::dns::{Dns, SystemDns};
use crate::egress::{Broker, Policy};
use head::Reject;
use serde::Serialize;
use serve::{refuse, serve};
use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_profiles::EgressConfig;
use stsd_protocol::NetworkMode;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// One proxied request as the audit records it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProxyHop {
    pub upstream: String,
    /// "CONNECT", "GET", ... (empty when the connection was refused before its head was read).
    pub method: String,
    pub host: String,
    pub port: u16,
    /// The checked address connected to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// How the address was found: "dns", "literal" or "override" (a `[egress] host_overrides`
    /// entry).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// The request reached its destination.
    pub allowed: bool,
    /// The rule that refused it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The proxy's answer (a refusal, or 200 for an established tunnel) or the destination's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// How an allowed request ended other than by a clean close ("idle-timeout", ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bytes written to the destination (a forwarded head included) and read from it.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub ms: u64,
}

/// The proxy's own bounds.
#[derive(Debug, Clone)]
pub struct ProxyLimits {
    /// Connections served at once; more are answered 503.
    pub max_connections: usize,
    /// A connection that moves no byte either way for this long is closed.
    pub idle: Duration,
    /// The request head must arrive within this.
    pub head_timeout: Duration,
    pub max_head_bytes: usize,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            max_connections: 64,
            idle: Duration::from_secs(120),
            head_timeout: Duration::from_secs(10),
            max_head_bytes: 16 * 1024,
        }
    }
}

/// Connections over the bound answered 503 at once; more are closed unanswered.
const BUSY_ANSWERS: usize = 16;

pub type OnHop = Arc<dyn Fn(ProxyHop) + Send + Sync>;

struct Shared {
    upstream: String,
    broker: Broker,
    policy: Policy,
    limits: ProxyLimits,
    on_hop: OnHop,
}

/// A running proxy. Dropping it (or [`EgressProxy::stop`]) closes the listener and every
/// connection.
pub struct EgressProxy {
    port: u16,
    stop: CancellationToken,
    runtime: tokio::runtime::Handle,
    admit: Arc<Admit>,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// What serving one connection needs, whichever way it came: accepted on the listener, or
/// handed over a channel by a stdio upstream's forwarder.
struct Admit {
    shared: Arc<Shared>,
    stop: CancellationToken,
    /// Connections served at once.
    slots: Arc<Semaphore>,
    /// Connections over the bound being answered 503.
    busy: Arc<Semaphore>,
}

impl EgressProxy {
    /// Starts a proxy for `upstream_id` that lets it reach the hosts `allow` names (a tool
    /// allowlist's syntax: `api.example.com`, `*.example.org`, `*`). Must be called inside a
    /// tokio runtime.
    pub fn start(
        upstream_id: String,
        allow: Vec<String>,
        egress: &EgressConfig,
        on_hop: OnHop,
    ) -> io::Result<EgressProxy> {
        Self::start_with(
            upstream_id,
            allow,
            egress,
            on_hop,
            ProxyLimits::default(),
            Arc::new(SystemDns),
        )
    }

    /// [`EgressProxy::start`] with explicit bounds and resolver (tests script DNS with it).
    pub fn start_with(
        upstream_id: String,
        allow: Vec<String>,
        egress: &EgressConfig,
        on_hop: OnHop,
        limits: ProxyLimits,
        dns: Arc<dyn Dns>,
    ) -> io::Result<EgressProxy> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            io::Error::other(format!("the egress proxy needs a tokio runtime: {e}"))
        })?;
        let broker = Broker::new(egress)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?
            .with_dns(dns);
        let std_listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        std_listener.set_nonblocking(true)?;
        let port = std_listener.local_addr()?.port();
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let shared = Arc::new(Shared {
            upstream: upstream_id,
            broker,
            policy: Policy {
                mode: NetworkMode::Allowlist,
                hosts: allow,
            },
            limits,
            on_hop,
        });
        let stop = CancellationToken::new();
        let admit = Arc::new(Admit {
            slots: Arc::new(Semaphore::new(shared.limits.max_connections)),
            busy: Arc::new(Semaphore::new(BUSY_ANSWERS)),
            shared,
            stop: stop.clone(),
        });
        runtime.spawn(accept_loop(listener, admit.clone()));
        Ok(EgressProxy {
            port,
            stop,
            runtime,
            admit,
        })
    }

    /// Serves the connections a stdio upstream's forwarder hands over `channel` (the
    /// supervisor's end of the pair made by `spawn::ProxyEnd::pair`), until the
    /// forwarder closes it or the proxy stops.
    pub fn attach(&self, channel: std::os::fd::OwnedFd) -> io::Result<()> {
        let _entered = self.runtime.enter();
        // SAFETY: the OwnedFd moves into the AsyncFd, which keeps it open (and the same
        // description) for as long as it is registered.
        let fd = unsafe { tokio::io::unix::AsyncFd::register(channel) }?;
        self.runtime.spawn(channel_loop(fd, self.admit.clone()));
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address to give the upstream as `HTTP_PROXY`/`HTTPS_PROXY`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, admit: Arc<Admit>) {
    loop {
        let accepted = tokio::select! {
            _ = admit.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((sock, _)) => admit.serve(sock),
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(upstream = %admit.shared.upstream, error = %e, "egress proxy accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One connection's socket from a forwarder's message, if it carried one. Ok(None): the
/// forwarder is gone (end of the channel).
fn receive_socket(
    channel: &std::os::fd::OwnedFd,
) -> io::Result<Option<Option<std::os::fd::OwnedFd>>> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::{AsRawFd, FromRawFd};
    let mut byte = [0u8; 1];
    let mut iov = [io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        channel.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let mut got = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel just installed this descriptor for us; owned once.
                let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
                if got.is_none() {
                    got = Some(owned);
                }
            }
        }
    }
    if msg.bytes == 0 && got.is_none() {
        return Ok(None);
    }
    Ok(Some(got))
}

/// Connections handed over by one stdio upstream's forwarder.
async fn channel_loop(channel: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>, admit: Arc<Admit>) {
    loop {
        let mut ready = tokio::select! {
            _ = admit.stop.cancelled() => return,
            r = channel.readable() => match r {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        match ready.try_io(|c| receive_socket(c.get_ref())) {
            Err(_would_block) => continue,
            Ok(Err(e)) => {
                tracing::warn!(upstream = %admit.shared.upstream, error = %e, "egress proxy channel failed");
                return;
            }
            Ok(Ok(None)) => return,
            Ok(Ok(Some(None))) => {}
            Ok(Ok(Some(Some(fd)))) => {
                let std = std::net::TcpStream::from(fd);
                match std
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(std))
                {
                    Ok(sock) => admit.serve(sock),
                    // Not a TCP socket (the forwarder only sends what it accepted): dropped.
                    Err(e) => {
                        tracing::warn!(upstream = %admit.shared.upstream, error = %e, "egress proxy: a handed socket is unusable")
                    }
                }
            }
        }
    }
}

impl Admit {
    /// Serves `sock` on a task of its own, or (over the bound) answers it 503.
    fn serve(self: &Arc<Self>, sock: tokio::net::TcpStream) {
        let (shared, stop) = (self.shared.clone(), self.stop.clone());
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                tokio::spawn(async move {
                    let _slot = slot;
                    serve(sock, &shared, &stop).await;
                });
            }
            // Over the bound: answered 503 by a few short-lived tasks of their own; past
            // those, the connection is just closed.
            Err(_) => {
                let Ok(slot) = self.busy.clone().try_acquire_owned() else {
                    return;
                };
                tokio::spawn(async move {
                    let _slot = slot;
                    let started = Instant::now();
                    let mut sock = sock;
                    let r = Reject::new(
                        503,
                        "too-many-connections",
                        format!(
                            "this upstream has {} proxy connections open",
                            shared.limits.max_connections
                        ),
                    );
                    refuse(&mut sock, &r).await;
                    report_refusal(&shared, ProxyHop::default(), &r, started);
                });
            }
        }
    }
}

fn report_refusal(shared: &Shared, mut hop: ProxyHop, r: &Reject, started: Instant) {
    hop.upstream = shared.upstream.clone();
    hop.allowed = false;
    hop.rule = Some(r.rule.clone());
    hop.status = Some(r.status);
    hop.ms = started.elapsed().as_millis() as u64;
    (shared.on_hop)(hop);
}
