//! A loopback HTTP and HTTPS fixture server for the egress tests. One port speaks both: a
//! connection whose first byte is a TLS handshake record gets TLS (a certificate from a CA made
//! for this run, given to the broker through `egress.extra_ca_files`), anything else plain
//! HTTP/1.1. It answers the catalog's services from `fixtures/services.json`, plus a few
//! `/stsd/...` paths for the SSRF suite (redirects, big and trickling bodies, an echo).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the server saw.
#[derive(Debug, Clone)]
pub struct Seen {
    pub host: String,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub tls: bool,
    pub query: String,
    pub body: Vec<u8>,
}

impl Seen {
    /// The whole request as text (path, query, headers, body), for searching.
    pub fn text(&self) -> String {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        format!(
            "{} {}?{}\n{}\n\n{}",
            self.method,
            self.path,
            self.query,
            headers.join("\n"),
            String::from_utf8_lossy(&self.body)
        )
    }
}

pub struct FixtureServer {
    pub port: u16,
    /// The CA certificate (PEM) the server's certificate chains to.
    pub ca_file: PathBuf,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _dir: tempfile::TempDir,
}

/// Test names the certificate covers besides the catalog's hosts.
pub const TEST_HOSTS: &[&str] = &[
    "fixture.test",
    "other.test",
    "rebind.test",
    "api.example.com",
    "example.org",
    // The hosts of the catalog's tools that take a secret (no route: a request is seen and
    // answered 404, which is all the secrets test needs).
    "openapi.naver.com",
    "dapi.kakao.com",
    "apis.data.go.kr",
    "openapi.seoul.go.kr",
    "www.kamis.or.kr",
    "www.kobis.or.kr",
    "www.googleapis.com",
    "api.openai.com",
    "hooks.slack.com",
];

struct Route {
    host: String,
    path: String,
    status: u16,
    content_type: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

pub fn services() -> Value {
    crate::read_json(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/services.json"))
}

fn routes(services: &Value) -> Vec<Route> {
    let empty = Vec::new();
    services["routes"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|r| Route {
            host: r["host"].as_str().unwrap_or_default().to_ascii_lowercase(),
            path: r["path"].as_str().unwrap_or_default().to_string(),
            status: r["status"].as_u64().unwrap_or(200) as u16,
            content_type: r["contentType"]
                .as_str()
                .unwrap_or("application/json")
                .to_string(),
            headers: r["headers"]
                .as_object()
                .map(|o| {
                    o.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default(),
            body: match (&r["text"], &r["json"]) {
                (Value::String(t), _) => t.clone().into_bytes(),
                (_, j) => j.to_string().into_bytes(),
            },
        })
        .collect()
}

/// Every host the fixture answers for: the catalog services' and the test names.
pub fn hosts() -> Vec<String> {
    let mut h: Vec<String> = routes(&services()).into_iter().map(|r| r.host).collect();
    h.extend(TEST_HOSTS.iter().map(|s| s.to_string()));
    h.sort();
    h.dedup();
    h
}

fn tls_config(hosts: &[String], dir: &Path) -> (Arc<rustls::ServerConfig>, PathBuf) {
    let fail = |e: &dyn std::fmt::Display| -> ! { panic!("fixture TLS: {e}") };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| fail(&e));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "stsd fixture CA (tests only)");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().unwrap_or_else(|e| fail(&e));
    let ca = CertifiedIssuer::self_signed(ca, ca_key).unwrap_or_else(|e| fail(&e));
    let leaf = CertificateParams::new(hosts.to_vec()).unwrap_or_else(|e| fail(&e));
    let leaf_key = KeyPair::generate().unwrap_or_else(|e| fail(&e));
    let cert = leaf.signed_by(&leaf_key, &ca).unwrap_or_else(|e| fail(&e));
    let ca_file = dir.join("fixture-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap_or_else(|e| fail(&e));
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| fail(&e))
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .unwrap_or_else(|e| fail(&e));
    (Arc::new(config), ca_file)
}

impl FixtureServer {
    pub fn start() -> FixtureServer {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (tls, ca_file) = tls_config(&hosts(), dir.path());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
        let routes = Arc::new(routes(&services()));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (tls, routes, seen) = (tls.clone(), routes.clone(), s.clone());
                std::thread::spawn(move || serve(stream, tls, &routes, &seen));
            }
        });
        FixtureServer {
            port,
            ca_file,
            seen,
            _dir: dir,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

fn serve(
    stream: TcpStream,
    tls: Arc<rustls::ServerConfig>,
    routes: &[Route],
    seen: &Mutex<Vec<Seen>>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut first = [0u8; 1];
    if stream.peek(&mut first).unwrap_or(0) == 0 {
        return;
    }
    if first[0] == 0x16 {
        let Ok(conn) = rustls::ServerConnection::new(tls) else {
            return;
        };
        let mut s = rustls::StreamOwned::new(conn, stream);
        handle(&mut s, true, routes, seen);
        s.conn.send_close_notify();
        let _ = s.flush();
    } else {
        let mut s = stream;
        handle(&mut s, false, routes, seen);
    }
}

fn respond(
    s: &mut impl Write,
    status: u16,
    content_type: &str,
    headers: &[(String, String)],
    body: &[u8],
) {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
    let _ = s.flush();
}

fn handle(s: &mut (impl Read + Write), tls: bool, routes: &[Route], seen: &Mutex<Vec<Seen>>) {
    // The request head, then a body of Content-Length bytes.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        if buf.len() > 64 * 1024 {
            return;
        }
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut req = lines.next().unwrap_or_default().split(' ');
    let method = req.next().unwrap_or_default().to_string();
    let target = req.next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let len: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let host = header("host")
        .unwrap_or_default()
        .rsplit_once(':')
        .map(|(h, _)| h.to_string())
        .unwrap_or_else(|| header("host").unwrap_or_default())
        .to_ascii_lowercase();
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    if let Ok(mut v) = seen.lock() {
        v.push(Seen {
            host: host.clone(),
            method: method.clone(),
            path: path.to_string(),
            headers: headers.clone(),
            tls,
            query: query.to_string(),
            body: body.clone(),
        });
    }
    let json_type = "application/json";
    if path == "/stsd/echo" {
        let hs: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let out = json!({"method": method, "host": host, "path": path, "query": query,
            "headers": hs, "body": String::from_utf8_lossy(&body), "tls": tls});
        return respond(s, 200, json_type, &[], out.to_string().as_bytes());
    }
    if let Some(n) = path.strip_prefix("/stsd/redirect/") {
        let n: u32 = n.parse().unwrap_or(0);
        if n == 0 {
            return respond(s, 200, json_type, &[], br#"{"redirects":"done"}"#);
        }
        let loc = vec![("Location".to_string(), format!("/stsd/redirect/{}", n - 1))];
        return respond(s, 302, "text/plain", &loc, b"moved");
    }
    if path == "/stsd/to" {
        let to = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("u="))
            .map(|u| {
                percent_encoding::percent_decode_str(u)
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let status = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("status="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(302);
        return respond(
            s,
            status,
            "text/plain",
            &[("Location".into(), to)],
            b"moved",
        );
    }
    if let Some(n) = path.strip_prefix("/stsd/big/") {
        let n: usize = n.parse().unwrap_or(0);
        return respond(s, 200, "text/plain", &[], &vec![b'x'; n]);
    }
    if path == "/stsd/trickle" {
        let _ = s.write_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\nConnection: close\r\n\r\n",
        );
        for _ in 0..100_000 {
            std::thread::sleep(Duration::from_millis(100));
            if s.write_all(b"x").and_then(|_| s.flush()).is_err() {
                return;
            }
        }
        return;
    }
    if path == "/stsd/longloc" {
        let loc = vec![("Location".to_string(), "\\".repeat(70_000))];
        return respond(s, 302, "text/plain", &loc, b"moved");
    }
    if path == "/stsd/multi" {
        let hs = vec![
            ("X-Multi".to_string(), "a".to_string()),
            ("X-Multi".to_string(), "b".to_string()),
        ];
        return respond(s, 201, "text/plain; charset=utf-8", &hs, "héllo".as_bytes());
    }
    let best = routes
        .iter()
        .filter(|r| r.host == host && path.starts_with(&r.path))
        .max_by_key(|r| r.path.len());
    match best {
        Some(r) => respond(s, r.status, &r.content_type, &r.headers, &r.body),
        None => respond(s, 404, json_type, &[], br#"{"message":"Not Found"}"#),
    }
}
