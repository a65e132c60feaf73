//! The proxy over real loopback sockets: a fixture HTTP server reached as `fixture.test`
//! through `[egress] host_overrides` (as the `fetch` egress tests reach theirs), scripted DNS
//! for names that resolve to refused addresses, and a raw client speaking the proxy protocol.
#![allow(clippy::unwrap_used)]

use super::*;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);

/// A tiny HTTP/1.1 server: answers each request with its own head and body echoed back
/// (`<head>|<body>`), then closes. Counts the connections it accepted.
struct Fixture {
    port: u16,
    accepted: Arc<AtomicUsize>,
}

async fn fixture() -> Fixture {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let head = String::from_utf8_lossy(&buf[..end]).to_string();
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .unwrap_or(0);
                let mut body = buf[end..].to_vec();
                while body.len() < len {
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => body.extend_from_slice(&chunk[..n]),
                    }
                }
                let mut payload = head.into_bytes();
                payload.push(b'|');
                payload.extend_from_slice(&body);
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    payload.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.write_all(&payload).await;
                let _ = s.shutdown().await;
            });
        }
    });
    Fixture { port, accepted }
}

struct ScriptedDns(HashMap<String, Vec<IpAddr>>);

impl Dns for ScriptedDns {
    fn lookup(&self, host: &str, _: Duration) -> io::Result<Vec<IpAddr>> {
        self.0
            .get(host)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
    }
}

fn dns() -> Arc<dyn Dns> {
    let ip = |s: &str| vec![s.parse::<IpAddr>().unwrap()];
    Arc::new(ScriptedDns(HashMap::from([
        ("intranet.test".to_string(), ip("10.0.0.5")),
        ("rebind.test".to_string(), ip("127.0.0.1")),
        ("trusted.test".to_string(), ip("127.0.0.1")),
        (
            "mixed.test".to_string(),
            vec![
                "93.184.215.14".parse().unwrap(),
                "169.254.169.254".parse().unwrap(),
            ],
        ),
    ])))
}

const ALLOW: &[&str] = &[
    "fixture.test",
    "dead.test",
    "pinned.test",
    "intranet.test",
    "rebind.test",
    "trusted.test",
    "mixed.test",
    "unknown.test",
    "127.0.0.1",
    "::1",
    "169.254.169.254",
];

struct Setup {
    proxy: EgressProxy,
    hops: mpsc::UnboundedReceiver<ProxyHop>,
    fixture: Fixture,
}

impl Setup {
    async fn hop(&mut self) -> ProxyHop {
        tokio::time::timeout(WAIT, self.hops.recv())
            .await
            .unwrap()
            .unwrap()
    }
}

async fn setup_with(limits: ProxyLimits, trusted: &[&str]) -> Setup {
    let fixture = fixture().await;
    let mut cfg = EgressConfig::default();
    cfg.host_overrides
        .insert("fixture.test".into(), format!("127.0.0.1:{}", fixture.port));
    cfg.host_overrides
        .insert("dead.test".into(), "127.0.0.1:1".into());
    cfg.host_overrides
        .insert("pinned.test".into(), "127.0.0.1".into());
    cfg.trusted_ranges = trusted.iter().map(|r| r.to_string()).collect();
    cfg.connect_timeout_ms = 2_000;
    let (tx, hops) = mpsc::unbounded_channel();
    let on_hop: OnHop = Arc::new(move |h| {
        let _ = tx.send(h);
    });
    let allow = ALLOW.iter().map(|s| s.to_string()).collect();
    let proxy = EgressProxy::start_with("up1".into(), allow, &cfg, on_hop, limits, dns()).unwrap();
    Setup {
        proxy,
        hops,
        fixture,
    }
}

async fn setup() -> Setup {
    setup_with(ProxyLimits::default(), &[]).await
}

async fn connect(s: &Setup) -> TcpStream {
    TcpStream::connect(("127.0.0.1", s.proxy.port()))
        .await
        .unwrap()
}

/// Sends `raw` on a new connection and reads the whole answer.
async fn exchange(s: &Setup, raw: &[u8]) -> String {
    let mut c = connect(s).await;
    c.write_all(raw).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn assert_refused(answer: &str, hop: &ProxyHop, status: u16, rule: &str) {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "{answer}"
    );
    assert!(
        answer.contains(&format!("\r\n\r\nEGRESS_REFUSED: {rule}: ")),
        "{answer}"
    );
    assert!(!hop.allowed, "{hop:?}");
    assert_eq!(hop.rule.as_deref(), Some(rule), "{hop:?}");
    assert_eq!(hop.status, Some(status), "{hop:?}");
    assert_eq!((hop.bytes_up, hop.bytes_down), (0, 0), "{hop:?}");
    assert_eq!(hop.upstream, "up1");
}

#[tokio::test]
async fn a_plain_http_request_reaches_an_allowed_host_in_origin_form() {
    let mut s = setup().await;
    let answer = exchange(
        &s,
        b"POST http://fixture.test/ok?x=1 HTTP/1.1\r\nHost: elsewhere.test\r\n\
          Proxy-Authorization: Basic c2VjcmV0\r\nConnection: keep-alive, X-Drop\r\nX-Drop: 1\r\n\
          X-Test: yes\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let echoed = answer.split_once("\r\n\r\n").unwrap().1;
    assert!(
        echoed.starts_with("POST /ok?x=1 HTTP/1.1\r\nHost: fixture.test\r\n"),
        "{echoed}"
    );
    assert!(echoed.contains("X-Test: yes\r\n"), "{echoed}");
    assert!(echoed.contains("Connection: close\r\n"), "{echoed}");
    assert!(echoed.ends_with("|hello"), "{echoed}");
    for gone in ["Proxy-Authorization", "X-Drop", "keep-alive", "elsewhere"] {
        assert!(!echoed.contains(gone), "{gone} forwarded: {echoed}");
    }
    let hop = s.hop().await;
    assert_eq!(
        (hop.method.as_str(), hop.host.as_str(), hop.port),
        ("POST", "fixture.test", 80)
    );
    assert!(hop.allowed, "{hop:?}");
    assert_eq!(hop.rule, None);
    assert_eq!(hop.status, Some(200));
    assert_eq!(hop.error, None);
    assert_eq!(hop.via.as_deref(), Some("override"));
    assert_eq!(hop.address, Some(format!("127.0.0.1:{}", s.fixture.port)));
    assert_eq!(hop.bytes_down, answer.len() as u64);
    assert!(hop.bytes_up > 5, "{hop:?}");
    let json = serde_json::to_value(&hop).unwrap();
    assert_eq!(json["bytesDown"], answer.len() as u64);
    assert_eq!(json["upstream"], "up1");
}

#[tokio::test]
async fn connect_tunnels_bytes_both_ways() {
    let mut s = setup().await;
    let mut c = connect(&s).await;
    let port = s.fixture.port;
    c.write_all(
        format!("CONNECT fixture.test:{port} HTTP/1.1\r\nHost: fixture.test:{port}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let want = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let mut got = vec![0u8; want.len()];
    tokio::time::timeout(WAIT, c.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, want);
    // What goes through the tunnel is not the proxy's business: here, an origin-form request.
    let req = b"GET /through HTTP/1.1\r\nHost: fixture.test\r\nX-Tunnel: 1\r\n\r\n";
    c.write_all(req).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(
        out.contains("GET /through HTTP/1.1\r\nHost: fixture.test\r\nX-Tunnel: 1"),
        "{out}"
    );
    drop(c);
    let hop = s.hop().await;
    assert_eq!(
        (hop.method.as_str(), hop.host.as_str(), hop.port),
        ("CONNECT", "fixture.test", port)
    );
    assert!(hop.allowed, "{hop:?}");
    assert_eq!(hop.status, Some(200));
    assert_eq!(hop.address, Some(format!("127.0.0.1:{port}")));
    assert_eq!(hop.bytes_up, req.len() as u64);
    assert_eq!(hop.bytes_down, out.len() as u64);
}

#[tokio::test]
async fn loopback_link_local_and_private_addresses_are_refused_even_when_allowlisted() {
    let mut s = setup().await;
    let port = s.fixture.port;
    // The fixture listens on 127.0.0.1:port, but the address rules stand between.
    for (raw, host, rule) in [
        (
            format!("GET http://127.0.0.1:{port}/ HTTP/1.1\r\n\r\n"),
            "127.0.0.1",
            "loopback",
        ),
        (
            format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
            "127.0.0.1",
            "loopback",
        ),
        (
            format!("CONNECT [::1]:{port} HTTP/1.1\r\n\r\n"),
            "::1",
            "loopback",
        ),
        (
            format!("GET http://rebind.test:{port}/ HTTP/1.1\r\n\r\n"),
            "rebind.test",
            "loopback",
        ),
        (
            format!("GET http://intranet.test:{port}/ HTTP/1.1\r\n\r\n"),
            "intranet.test",
            "private",
        ),
        (
            "GET http://mixed.test/ HTTP/1.1\r\n\r\n".to_string(),
            "mixed.test",
            "link-local",
        ),
        (
            "GET http://169.254.169.254/latest/meta-data HTTP/1.1\r\n\r\n".to_string(),
            "169.254.169.254",
            "link-local",
        ),
    ] {
        let answer = exchange(&s, raw.as_bytes()).await;
        let hop = s.hop().await;
        assert_refused(&answer, &hop, 403, rule);
        assert_eq!(hop.host, host, "{raw}");
        assert_eq!(hop.address, None);
    }
    assert_eq!(s.fixture.accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_trusted_range_lets_a_resolved_private_address_through() {
    let mut s = setup_with(ProxyLimits::default(), &["127.0.0.1/32"]).await;
    let port = s.fixture.port;
    let answer = exchange(
        &s,
        format!("GET http://trusted.test:{port}/t HTTP/1.1\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    let hop = s.hop().await;
    assert!(hop.allowed);
    assert_eq!(hop.via.as_deref(), Some("dns"));
    assert_eq!(hop.address, Some(format!("127.0.0.1:{port}")));
}

#[tokio::test]
async fn hosts_outside_the_allowlist_and_ports_an_override_does_not_pin_are_refused() {
    let mut s = setup().await;
    let answer = exchange(&s, b"GET http://not-allowed.test/ HTTP/1.1\r\n\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 403, "host-not-in-allowlist");
    assert_eq!(
        (hop.method.as_str(), hop.host.as_str(), hop.port),
        ("GET", "not-allowed.test", 80)
    );
    assert!(
        answer.ends_with("EGRESS_REFUSED: host-not-in-allowlist: not-allowed.test\n"),
        "{answer}"
    );

    let answer = exchange(&s, b"CONNECT not-allowed.test:443 HTTP/1.1\r\n\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 403, "host-not-in-allowlist");
    assert_eq!(hop.port, 443);

    // An override without a port opens only 80 and 443 (the broker's rule).
    let answer = exchange(&s, b"CONNECT pinned.test:6379 HTTP/1.1\r\n\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 403, "override-port");
}

#[tokio::test]
async fn connect_and_dns_failures_are_bad_gateway() {
    let mut s = setup().await;
    let answer = exchange(&s, b"GET http://dead.test/ HTTP/1.1\r\n\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 502, "connect-failed");
    // Allowlisted, but the (scripted) resolver knows no such name.
    let answer = exchange(&s, b"CONNECT unknown.test:443 HTTP/1.1\r\n\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 502, "unknown-host");
}

#[tokio::test]
async fn malformed_oversized_and_chunked_requests_are_refused() {
    let mut s = setup().await;
    let big = format!(
        "GET http://fixture.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    for (raw, status, rule) in [
        ("GARBAGE\r\n\r\n".to_string(), 400, "malformed-request"),
        (
            "GET /ok HTTP/1.1\r\nHost: fixture.test\r\n\r\n".to_string(),
            400,
            "not-a-proxy-request",
        ),
        (
            "GET https://fixture.test/ HTTP/1.1\r\n\r\n".to_string(),
            400,
            "https-needs-connect",
        ),
        (
            "CONNECT fixture.test HTTP/1.1\r\n\r\n".to_string(),
            400,
            "malformed-request",
        ),
        (
            "GET ftp://fixture.test/ HTTP/1.1\r\n\r\n".to_string(),
            400,
            "not-a-proxy-request",
        ),
        (
            "POST http://fixture.test/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
                .to_string(),
            411,
            "chunked-request-body",
        ),
        (
            "POST http://fixture.test/ HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n".to_string(),
            413,
            "request-body-too-large",
        ),
        (big, 431, "head-too-large"),
    ] {
        let answer = exchange(&s, raw.as_bytes()).await;
        let hop = s.hop().await;
        assert_refused(&answer, &hop, status, rule);
    }
    assert_eq!(s.fixture.accepted.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_slow_head_and_an_idle_tunnel_are_closed() {
    let mut s = setup_with(
        ProxyLimits {
            head_timeout: Duration::from_millis(300),
            idle: Duration::from_millis(300),
            ..ProxyLimits::default()
        },
        &[],
    )
    .await;
    let answer = exchange(&s, b"GET http://fixture.test/ HTTP/1.1\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 408, "head-timeout");

    let mut c = connect(&s).await;
    let port = s.fixture.port;
    c.write_all(format!("CONNECT fixture.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    // The tunnel opens, nothing moves, and the proxy ends it.
    tokio::time::timeout(WAIT, c.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200 Connection established"));
    let hop = s.hop().await;
    assert!(hop.allowed);
    assert_eq!(hop.error.as_deref(), Some("idle-timeout"));
    assert!(hop.ms >= 300, "{hop:?}");
}

#[tokio::test]
async fn connections_beyond_the_bound_are_refused() {
    let mut s = setup_with(
        ProxyLimits {
            max_connections: 1,
            ..ProxyLimits::default()
        },
        &[],
    )
    .await;
    let mut first = connect(&s).await;
    first.write_all(b"GET http://fixture.test/").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let answer = exchange(&s, b"GET http://fixture.test/ HTTP/1.1\r\n\r\n").await;
    let hop = s.hop().await;
    assert_refused(&answer, &hop, 503, "too-many-connections");
    assert_eq!(hop.method, "");
    // The held connection still completes.
    first.write_all(b" HTTP/1.1\r\n\r\n").await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, first.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200 OK"));
    assert!(s.hop().await.allowed);
}

#[tokio::test]
async fn dropping_the_proxy_closes_the_listener_and_every_tunnel() {
    let mut s = setup().await;
    let port = s.fixture.port;
    let mut c = connect(&s).await;
    c.write_all(format!("CONNECT fixture.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 39];
    tokio::time::timeout(WAIT, c.read_exact(&mut head))
        .await
        .unwrap()
        .unwrap();
    let proxy_port = s.proxy.port();
    let Setup { proxy, hops, .. } = &mut s;
    proxy.stop.cancel();
    let mut rest = Vec::new();
    tokio::time::timeout(WAIT, c.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    let hop = tokio::time::timeout(WAIT, hops.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(hop.error.as_deref(), Some("proxy-stopped"));
    // The listener is gone shortly after.
    let mut refused = false;
    for _ in 0..50 {
        if TcpStream::connect(("127.0.0.1", proxy_port)).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused, "the listener still accepts");
}
