//! The proxy request head: read under a size and time bound, parsed with `httparse`, and the
//! origin-form head forwarded for a plain-HTTP request.

use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Headers a request head may carry (httparse needs a fixed table).
const MAX_HEADERS: usize = 96;

/// Headers that end at the proxy (RFC 9110 §7.6.1), and the ones the proxy sets itself. Any
/// `Proxy-*` header is dropped too, and every header the `Connection` header names.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// A refused request: the status answered and the rule and detail in the body
/// `EGRESS_REFUSED: <rule>: <detail>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub status: u16,
    pub rule: String,
    pub detail: String,
}

impl Reject {
    pub fn new(status: u16, rule: &str, detail: impl Into<String>) -> Reject {
        Reject {
            status,
            rule: rule.to_string(),
            detail: detail.into(),
        }
    }

    /// The whole response: a short text body, and the connection closes after it.
    pub fn response(&self) -> Vec<u8> {
        let mut detail = self.detail.replace(['\r', '\n'], " ");
        if detail.len() > 512 {
            let mut end = 512;
            while !detail.is_char_boundary(end) {
                end -= 1;
            }
            detail.truncate(end);
            detail.push_str("...");
        }
        let body = format!("EGRESS_REFUSED: {}: {detail}\n", self.rule);
        format!(
            "HTTP/1.1 {} {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.status,
            reason(self.status),
            body.len()
        )
        .into_bytes()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A parsed request head and the bytes read after it (the start of a body or of a tunnel).
#[derive(Debug)]
pub struct Head {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, Vec<u8>)>,
    pub rest: Vec<u8>,
}

impl Head {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The request body's length: `Content-Length` (0 without one). A chunked body is refused
    /// (411): the proxy forwards exactly one request per connection and must know where it ends.
    pub fn body_length(&self) -> Result<u64, Reject> {
        if self.values("transfer-encoding").next().is_some() {
            return Err(Reject::new(
                411,
                "chunked-request-body",
                "send the request body with Content-Length",
            ));
        }
        let mut length = None;
        for v in self.values("content-length") {
            let n = std::str::from_utf8(v)
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| Reject::new(400, "malformed-request", "bad Content-Length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(Reject::new(
                    400,
                    "malformed-request",
                    "conflicting Content-Length headers",
                ));
            }
            length = Some(n);
        }
        Ok(length.unwrap_or(0))
    }

    /// The head sent to the destination: origin-form request line, `Host` from the checked URL,
    /// the client's end-to-end headers, and `Connection: close`.
    pub fn forward(&self, url: &url::Url) -> Vec<u8> {
        let connection_named: Vec<String> = self
            .values("connection")
            .flat_map(|v| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|t| !t.is_empty())
            .collect();
        let path = &url[url::Position::BeforePath..url::Position::AfterQuery];
        let host = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_string(),
        };
        let mut out = format!("{} {path} HTTP/1.1\r\nHost: {host}\r\n", self.method).into_bytes();
        for (k, v) in &self.headers {
            let lower = k.to_ascii_lowercase();
            if HOP_BY_HOP.contains(&lower.as_str())
                || lower.starts_with("proxy-")
                || connection_named.contains(&lower)
            {
                continue;
            }
            out.extend_from_slice(k.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
    }
}

/// Reads one request head of at most `max` bytes within `timeout`. `Ok(None)`: the client
/// closed without sending anything.
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
    timeout: Duration,
) -> Result<Option<Head>, Reject> {
    match tokio::time::timeout(timeout, read_head_unbounded(r, max)).await {
        Ok(out) => out,
        Err(_) => Err(Reject::new(
            408,
            "head-timeout",
            format!("no complete request head within {} ms", timeout.as_millis()),
        )),
    }
}

async fn read_head_unbounded<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> Result<Option<Head>, Reject> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = r
            .read(&mut chunk)
            .await
            .map_err(|e| Reject::new(400, "malformed-request", format!("read: {e}")))?;
        if n == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(Reject::new(
                400,
                "malformed-request",
                "the connection ended inside the request head",
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(head) = parse(&buf)? {
            return Ok(Some(head));
        }
        if buf.len() >= max {
            return Err(Reject::new(
                431,
                "head-too-large",
                format!("the request head is over {max} bytes"),
            ));
        }
    }
}

/// `Ok(None)` while the head is incomplete.
fn parse(buf: &[u8]) -> Result<Option<Head>, Reject> {
    let mut table = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut table);
    let len = match req.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Reject::new(
                431,
                "head-too-large",
                format!("more than {MAX_HEADERS} headers"),
            ))
        }
        Err(e) => return Err(Reject::new(400, "malformed-request", e.to_string())),
    };
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err(Reject::new(400, "malformed-request", "no request line"));
    };
    Ok(Some(Head {
        method: method.to_string(),
        target: target.to_string(),
        headers: req
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect(),
        rest: buf[len..].to_vec(),
    }))
}

/// The URL a request is checked as. CONNECT's authority must be `host:port` and nothing else
/// (it is then checked as `https://host:port/`); any other method must use the absolute form
/// `http://...` (https goes through CONNECT).
pub fn target_url(head: &Head) -> Result<String, Reject> {
    let t = head.target.as_str();
    if head.method == "CONNECT" {
        let bad = t.is_empty()
            || t.bytes().any(|b| {
                matches!(b, b'/' | b'@' | b'?' | b'#' | b'\\' | b'%') || b.is_ascii_whitespace()
            });
        let port = t.rsplit_once(':').map(|(_, p)| p).unwrap_or("");
        let host = t.rsplit_once(':').map(|(h, _)| h).unwrap_or("");
        let port_ok = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
        // "[::1]:443" splits at its last colon; a bare IPv6 address without brackets does not.
        let host_ok = !host.is_empty() && (!host.contains(':') || host.starts_with('['));
        if bad || !port_ok || !host_ok {
            return Err(Reject::new(
                400,
                "malformed-request",
                format!("CONNECT wants host:port, not {t:?}"),
            ));
        }
        return Ok(format!("https://{t}/"));
    }
    let lower = t.get(..8).unwrap_or(t).to_ascii_lowercase();
    if lower.starts_with("http://") {
        Ok(t.to_string())
    } else if lower.starts_with("https://") {
        Err(Reject::new(
            400,
            "https-needs-connect",
            "an https URL goes through CONNECT",
        ))
    } else {
        Err(Reject::new(
            400,
            "not-a-proxy-request",
            format!("{t:?} is not an absolute http:// URL"),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Head {
        parse(raw.as_bytes()).unwrap().unwrap()
    }

    #[test]
    fn the_forwarded_head_drops_hop_by_hop_and_proxy_headers() {
        let h = head(
            "GET http://a.test:8080/p?q=1#frag HTTP/1.1\r\nHost: evil.test\r\nProxy-Authorization: x\r\n\
             Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\n\
             Accept: */*\r\nKeep-Alive: 5\r\n\r\nBODY",
        );
        assert_eq!(h.rest, b"BODY");
        let url = url::Url::parse(&target_url(&h).unwrap()).unwrap();
        let out = String::from_utf8(h.forward(&url)).unwrap();
        assert_eq!(
            out,
            "GET /p?q=1 HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn targets() {
        let t = |raw: &str| target_url(&head(raw)).map_err(|r| r.rule);
        assert_eq!(
            t("CONNECT a.test:443 HTTP/1.1\r\n\r\n"),
            Ok("https://a.test:443/".into())
        );
        assert_eq!(
            t("CONNECT [::1]:443 HTTP/1.1\r\n\r\n"),
            Ok("https://[::1]:443/".into())
        );
        for bad in [
            "a.test",
            "a.test:",
            "u@a.test:443",
            "a.test:443/x",
            "::1:443",
            ":443",
        ] {
            assert_eq!(
                t(&format!("CONNECT {bad} HTTP/1.1\r\n\r\n")),
                Err("malformed-request".into()),
                "{bad}"
            );
        }
        assert_eq!(
            t("GET /x HTTP/1.1\r\n\r\n"),
            Err("not-a-proxy-request".into())
        );
        assert_eq!(
            t("GET https://a.test/ HTTP/1.1\r\n\r\n"),
            Err("https-needs-connect".into())
        );
    }

    #[test]
    fn body_length_rules() {
        let len = |raw: &str| head(raw).body_length().map_err(|r| (r.status, r.rule));
        assert_eq!(len("POST http://a/ HTTP/1.1\r\n\r\n"), Ok(0));
        assert_eq!(
            len("POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n"),
            Ok(5)
        );
        assert_eq!(
            len("POST http://a/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            Err((411, "chunked-request-body".into()))
        );
        assert_eq!(
            len("POST http://a/ HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n"),
            Err((400, "malformed-request".into()))
        );
        assert_eq!(
            len("POST http://a/ HTTP/1.1\r\nContent-Length: -1\r\n\r\n"),
            Err((400, "malformed-request".into()))
        );
    }

    #[test]
    fn a_refusal_names_its_rule_in_one_line() {
        let r = Reject::new(403, "loopback", "127.0.0.1\r\nX: y");
        let text = String::from_utf8(r.response()).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
        assert!(
            text.ends_with("\r\n\r\nEGRESS_REFUSED: loopback: 127.0.0.1  X: y\n"),
            "{text}"
        );
    }
}
