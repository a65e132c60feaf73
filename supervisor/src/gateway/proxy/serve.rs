//! One proxied connection: read the head, check and resolve through the broker, connect to a
//! checked address, then tunnel (CONNECT) or forward one request (plain HTTP).

use super::head::{self, Head, Reject};
use super::pipe::{self, Activity};
use super::{ProxyHop, Shared};
use crate::egress::{Failure, HopRecord};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_protocol::Code;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Byte counters of one connection, read when it ends however it ends.
#[derive(Default)]
struct Counters {
    up: AtomicU64,
    down: AtomicU64,
}

/// What an allowed connection ended with, when not a clean close.
enum Ended {
    Clean,
    Error(String),
}

pub(super) async fn serve(mut client: TcpStream, shared: &Arc<Shared>, stop: &CancellationToken) {
    let started = Instant::now();
    let mut hop = ProxyHop {
        upstream: shared.upstream.clone(),
        ..ProxyHop::default()
    };
    let counters = Counters::default();
    let ended = tokio::select! {
        _ = stop.cancelled() => Some(Ended::Error("proxy-stopped".into())),
        r = handle(&mut client, shared, &mut hop, &counters) => r,
    };
    // Closed (or stopped) before a request head arrived: there is no request to report.
    let Some(ended) = ended.filter(|_| !hop.method.is_empty() || hop.rule.is_some()) else {
        return;
    };
    if let Ended::Error(e) = ended {
        hop.error = Some(e);
    }
    hop.bytes_up = counters.up.load(Ordering::Relaxed);
    hop.bytes_down = counters.down.load(Ordering::Relaxed);
    hop.ms = started.elapsed().as_millis() as u64;
    (shared.on_hop)(hop);
}

/// Serves one request; `None` when the client sent nothing. A refusal is answered here and
/// recorded in `hop`.
async fn handle(
    client: &mut TcpStream,
    shared: &Arc<Shared>,
    hop: &mut ProxyHop,
    counters: &Counters,
) -> Option<Ended> {
    match forward(client, shared, hop, counters).await {
        Ok(None) => None,
        Ok(Some(end)) => Some(end),
        Err(r) => {
            hop.allowed = false;
            hop.rule = Some(r.rule.clone());
            hop.status = Some(r.status);
            refuse(client, &r).await;
            Some(Ended::Clean)
        }
    }
}

/// Answers a refusal, then drains what the client still sends for a moment: closing a socket
/// with unread input resets it, and the client could lose the answer.
pub(super) async fn refuse(client: &mut TcpStream, r: &Reject) {
    let write = async {
        client.write_all(&r.response()).await?;
        client.shutdown().await
    };
    if tokio::time::timeout(Duration::from_secs(2), write)
        .await
        .is_err()
    {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut total = 0usize;
        while total < 1024 * 1024 {
            match client.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

fn reject_of(f: &Failure) -> Reject {
    let status = match f.code {
        Code::Security => 403,
        Code::InvalidInput => 400,
        _ => 502,
    };
    // The broker's message is "[fetch] <kind>: <rule>: <detail>"; keep the detail.
    let marker = format!("{}: ", f.rule);
    let detail = f
        .message
        .split_once(&marker)
        .map(|(_, d)| d)
        .unwrap_or(&f.message);
    Reject::new(status, f.rule, detail)
}

async fn forward(
    client: &mut TcpStream,
    shared: &Arc<Shared>,
    hop: &mut ProxyHop,
    counters: &Counters,
) -> Result<Option<Ended>, Reject> {
    let limits = &shared.limits;
    let Some(head) = head::read_head(client, limits.max_head_bytes, limits.head_timeout).await?
    else {
        return Ok(None);
    };
    hop.method = head.method.clone();
    let url = head::target_url(&head)?;
    if let Ok(t) = crate::egress::guard::parse_target(&url) {
        hop.host = t.host;
        hop.port = t.port;
    }
    let connect = head.method == "CONNECT";
    let body = if connect { 0 } else { head.body_length()? };
    let cfg = shared.broker.config();
    if body > cfg.max_request_body_bytes {
        return Err(Reject::new(
            413,
            "request-body-too-large",
            format!("{body} bytes; the limit is {}", cfg.max_request_body_bytes),
        ));
    }
    let (target, addrs) = check_and_resolve(shared, &url, hop).await?;
    let mut server = connect_to(&addrs, Duration::from_millis(cfg.connect_timeout_ms)).await?;
    hop.address = server.peer_addr().ok().map(|a| a.to_string());
    hop.allowed = true;
    let activity = Activity::new();
    if connect {
        hop.status = Some(200);
        Ok(Some(
            tunnel(client, &mut server, head, shared, counters, &activity).await,
        ))
    } else {
        let deadline = Instant::now() + Duration::from_millis(cfg.request_timeout_ms);
        let (end, status) = http(
            client,
            &mut server,
            (&head, &target.url, body),
            (limits.idle, deadline),
            counters,
            &activity,
        )
        .await;
        hop.status = status;
        Ok(Some(end))
    }
}

/// The broker's check and resolution (a blocking DNS lookup, so off the runtime's threads).
async fn check_and_resolve(
    shared: &Arc<Shared>,
    url: &str,
    hop: &mut ProxyHop,
) -> Result<(crate::egress::guard::Target, Vec<SocketAddr>), Reject> {
    let cfg = shared.broker.config();
    let deadline = Instant::now() + Duration::from_millis(cfg.request_timeout_ms);
    let (s, u) = (shared.clone(), url.to_string());
    let (result, rec) = tokio::task::spawn_blocking(move || {
        let mut rec = HopRecord::default();
        let r = s
            .broker
            .check_and_resolve(&s.policy, &u, deadline, &mut rec);
        (r, rec)
    })
    .await
    .map_err(|e| Reject::new(502, "resolver-failed", e.to_string()))?;
    hop.via = rec.via.map(str::to_string);
    result.map_err(|f| reject_of(&f))
}

/// Connects to the first checked address that answers.
async fn connect_to(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, Reject> {
    let mut last = String::from("no address");
    for a in addrs {
        match tokio::time::timeout(timeout, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("{a}: {e}"),
            Err(_) => last = format!("{a}: no connection within {} ms", timeout.as_millis()),
        }
    }
    Err(Reject::new(502, "connect-failed", last))
}

fn io_end(e: io::Error) -> Ended {
    Ended::Error(format!("io: {e}"))
}

async fn tunnel(
    client: &mut TcpStream,
    server: &mut TcpStream,
    head: Head,
    shared: &Shared,
    counters: &Counters,
    activity: &Activity,
) -> Ended {
    if let Err(e) = client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
    {
        return io_end(e);
    }
    // Bytes the client sent right after its head (an eager TLS ClientHello).
    if let Err(e) = pipe::send(server, &head.rest, &counters.up, activity).await {
        return io_end(e);
    }
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let both = async {
        let (a, b) = tokio::join!(
            pipe::pump(&mut cr, &mut sw, None, &counters.up, activity, None),
            pipe::pump(&mut sr, &mut cw, None, &counters.down, activity, None),
        );
        a.and(b)
    };
    tokio::select! {
        r = both => r.map(|()| Ended::Clean).unwrap_or_else(io_end),
        _ = activity.idle(shared.limits.idle) => Ended::Error("idle-timeout".into()),
    }
}

/// Forwards one plain-HTTP request (head, then exactly its `Content-Length` body) and pipes the
/// response back until the destination closes. Returns how it ended and the response status.
async fn http(
    client: &mut TcpStream,
    server: &mut TcpStream,
    (head, url, body): (&Head, &url::Url, u64),
    (idle, deadline): (Duration, Instant),
    counters: &Counters,
    activity: &Activity,
) -> (Ended, Option<u16>) {
    let mut prefix = Vec::new();
    let first = head
        .rest
        .len()
        .min(usize::try_from(body).unwrap_or(usize::MAX));
    let exchange = async {
        pipe::send(server, &head.forward(url), &counters.up, activity).await?;
        pipe::send(server, &head.rest[..first], &counters.up, activity).await?;
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let left = body - first as u64;
        let up = async {
            pipe::pump(&mut cr, &mut sw, Some(left), &counters.up, activity, None).await?;
            // The body is sent; the response decides when this ends.
            std::future::pending::<io::Result<()>>().await
        };
        let down = pipe::pump(
            &mut sr,
            &mut cw,
            None,
            &counters.down,
            activity,
            Some(&mut prefix),
        );
        tokio::select! {
            r = up => r,
            r = down => r,
        }
    };
    let end = tokio::select! {
        r = exchange => r.map(|()| Ended::Clean).unwrap_or_else(io_end),
        _ = activity.idle(idle) => Ended::Error("idle-timeout".into()),
        _ = tokio::time::sleep_until(deadline.into()) => Ended::Error("request-timeout".into()),
    };
    (end, pipe::status_of(&prefix))
}
