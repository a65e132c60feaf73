//! The fetch broker: makes a tool's HTTP requests on the supervisor side. Workers never hold
//! a socket; they send a request frame and get the response back.
//!
//! Every hop (the first request and each redirect) is parsed, checked against the tool's
//! network mode and host list, resolved exactly once, and every resolved address checked.
//! The HTTP client is then handed those checked addresses as its only resolver answer, so the
//! connection goes to an address that was checked: there is no second lookup to rebind.

use super::conn::Abort;
use super::dns::{Dns, SystemDns};
use super::guard::{self, ipnet_lite::Net, Refusal, Target};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_profiles::EgressConfig;
use stsd_protocol::frames::FetchHead;
use stsd_protocol::{Code, NetworkMode};

/// Request headers a tool may not set: hop-by-hop headers (RFC 9110 §7.6.1) and the ones the
/// client derives from the request itself.
const DROPPED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "expect",
];

/// The only request headers that follow a redirect to another origin.
const CROSS_ORIGIN_HEADERS: &[&str] = &[
    "accept",
    "accept-language",
    "content-language",
    "content-type",
    "user-agent",
];

/// Longest failure message sent back (server-controlled text can be in it).
const MAX_MESSAGE_BYTES: usize = 1024;
/// Longest URL kept in an audit hop record.
const MAX_RECORD_URL_BYTES: usize = 2048;

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// A URL as the audit record keeps it: no userinfo, clipped.
fn record_url(url: &str) -> String {
    let text = match url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.to_string()
        }
        Err(_) => url.to_string(),
    };
    clip(&text, MAX_RECORD_URL_BYTES)
}

const METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Response headers beyond this many bytes in all are dropped (the head is one frame).
const MAX_HEAD_BYTES: usize = 64 * 1024;

const USER_AGENT: &str = concat!("stsd/", env!("CARGO_PKG_VERSION"));

/// The tool's network capability, as resolved into its toolSafety.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub mode: NetworkMode,
    pub hosts: Vec<String>,
}

impl Policy {
    /// From the job's resolved toolSafety JSON; anything unreadable is `blocked`.
    pub fn from_tool_safety_json(text: &str) -> Policy {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        let net = &v["capabilities"]["network"];
        let mode = net["mode"]
            .as_str()
            .and_then(NetworkMode::parse)
            .unwrap_or(NetworkMode::Blocked);
        let hosts = net["hosts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|h| h.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Policy { mode, hosts }
    }
}

pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub start_index: u64,
    pub max_length: Option<u64>,
    /// The call's secrets, as placeholders in what the code sent: each hop puts back those
    /// its host may receive ([`super::secrets::apply`]).
    pub withheld: stsd_protocol::envvar::WithheldSet,
}

#[derive(Debug)]
pub struct Response {
    pub head: FetchHead,
    pub body: Vec<u8>,
}

/// A failed fetch: the code the tool's error gets and a message in the reference's form
/// (`[fetch] denied: <rule>: <detail>` for a refusal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: Code,
    /// The rule that refused or failed the request, stable for tests and audits.
    pub rule: &'static str,
    pub message: String,
}

impl Failure {
    fn capped(mut self) -> Failure {
        self.message = clip(&self.message, MAX_MESSAGE_BYTES);
        self
    }

    fn denied(r: Refusal) -> Failure {
        let code = if matches!(r.rule, "invalid-url" | "url-too-long") {
            Code::InvalidInput
        } else {
            Code::Security
        };
        Failure {
            code,
            rule: r.rule,
            message: r.to_string(),
        }
    }

    fn runtime(kind: &str, rule: &'static str, detail: impl AsRef<str>) -> Failure {
        Failure {
            code: Code::HelperRuntime,
            rule,
            message: format!("[fetch] {kind}: {rule}: {}", detail.as_ref()),
        }
    }

    fn input(rule: &'static str, detail: impl AsRef<str>) -> Failure {
        Failure {
            code: Code::InvalidInput,
            rule,
            message: format!("[fetch] invalid request: {rule}: {}", detail.as_ref()),
        }
    }
}

/// One hop as the audit log records it. Every operator setting that let it through (a host
/// override, a trusted range, an extra CA, open mode reaching a private address) is named.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HopRecord {
    pub method: String,
    pub url: String,
    pub mode: &'static str,
    /// The address connected to (or that would have been).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// "dns", "literal" or "override".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<&'static str>,
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    pub host_override: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trusted_range: Option<String>,
    /// Open mode reached an address the guard refuses in the other modes.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub private_address: bool,
    /// https with operator CA files in the trust store.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub extra_ca: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    pub elapsed_ms: u64,
    /// The secrets put back into this hop's request (their names, never values).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Secrets whose placeholder this hop carried to a host not allowed to receive them:
    /// sent as placeholders, worthless there.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub withheld: Vec<String>,
}

#[derive(Debug, Clone, Copy)]
struct HostOverride {
    ip: IpAddr,
    port: Option<u16>,
}

/// The daemon-wide broker: configuration, trust store and resolver. Per-call state (the
/// tool's policy) is passed to [`Broker::fetch`].
pub struct Broker {
    cfg: EgressConfig,
    overrides: HashMap<String, HostOverride>,
    trusted: Vec<Net>,
    tls: Arc<rustls::ClientConfig>,
    dns: Arc<dyn Dns>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("overrides", &self.overrides.keys().collect::<Vec<_>>())
            .field("trusted", &self.trusted)
            .finish_non_exhaustive()
    }
}

fn normal_host(h: &str) -> String {
    h.trim().trim_end_matches('.').to_ascii_lowercase()
}

impl Broker {
    pub fn new(cfg: &EgressConfig) -> Result<Broker, String> {
        let mut overrides = HashMap::new();
        for (host, addr) in &cfg.host_overrides {
            let o = match addr.parse::<SocketAddr>() {
                Ok(sa) => HostOverride {
                    ip: sa.ip(),
                    port: Some(sa.port()),
                },
                Err(_) => HostOverride {
                    ip: addr
                        .parse()
                        .map_err(|_| format!("egress.host_overrides.{host}: bad address"))?,
                    port: None,
                },
            };
            overrides.insert(normal_host(host), o);
        }
        let trusted = cfg
            .trusted_ranges
            .iter()
            .map(|r| Net::parse(r).ok_or_else(|| format!("egress.trusted_ranges: bad range {r}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Broker {
            cfg: cfg.clone(),
            overrides,
            trusted,
            tls: super::tls::client_config(&cfg.extra_ca_files)?,
            dns: Arc::new(SystemDns),
        })
    }

    /// Replaces the resolver (tests script DNS answers with it).
    pub fn with_dns(mut self, dns: Arc<dyn Dns>) -> Broker {
        self.dns = dns;
        self
    }

    pub fn config(&self) -> &EgressConfig {
        &self.cfg
    }

    /// Refuses a request before it starts (the supervisor's own checks), with its record.
    pub fn refuse(
        &self,
        policy: &Policy,
        (method, url): (&str, &str),
        rule: &'static str,
        detail: String,
        records: &mut Vec<HopRecord>,
    ) -> Failure {
        records.push(HopRecord {
            method: method.trim().to_ascii_uppercase(),
            url: record_url(url),
            mode: policy.mode.as_str(),
            refused: Some(rule),
            ..HopRecord::default()
        });
        Failure::denied(guard::refuse(rule, detail)).capped()
    }

    /// Makes one fetch, following redirects. `deadline` is the end of the whole call; the
    /// request also stops at the configured request timeout. One record per hop is appended
    /// to `records`, refused hops included.
    pub fn fetch(
        &self,
        policy: &Policy,
        req: Request,
        deadline: Instant,
        records: &mut Vec<HopRecord>,
    ) -> Result<Response, Failure> {
        self.fetch_abortable(policy, req, deadline, &Abort::new(), records)
    }

    /// [`Broker::fetch`] that another thread can end through `abort` (the caller went away):
    /// the connection is shut down at once and the fetch fails with the rule `cancelled`.
    pub fn fetch_abortable(
        &self,
        policy: &Policy,
        req: Request,
        deadline: Instant,
        abort: &Arc<Abort>,
        records: &mut Vec<HopRecord>,
    ) -> Result<Response, Failure> {
        let before = records.len();
        let mut current = (req.method.clone(), req.url.clone());
        let out = self.run(policy, req, deadline, abort, records, &mut current);
        // A refusal before any hop ran (or of a redirect's target) gets a record of its own.
        if let Err(f) = &out {
            let recorded = records.len() > before
                && records.last().is_some_and(|r| {
                    r.refused == Some(f.rule) || r.error.as_deref() == Some(f.rule)
                });
            if !recorded {
                let mut rec = HopRecord {
                    method: current.0.trim().to_ascii_uppercase(),
                    url: record_url(&current.1),
                    mode: policy.mode.as_str(),
                    ..HopRecord::default()
                };
                if f.code == Code::Security {
                    rec.refused = Some(f.rule);
                } else {
                    rec.error = Some(f.rule.to_string());
                }
                records.push(rec);
            }
        }
        out.map_err(Failure::capped)
    }

    /// Checks the request, then sends it hop by hop (each hop budgeted and recorded),
    /// following redirects, until a final response is read. `current` is kept at the
    /// method and URL being tried, for the record of a refusal.
    fn run(
        &self,
        policy: &Policy,
        req: Request,
        deadline: Instant,
        abort: &Arc<Abort>,
        records: &mut Vec<HopRecord>,
        current: &mut (String, String),
    ) -> Result<Response, Failure> {
        let started = Instant::now();
        let deadline = deadline.min(started + Duration::from_millis(self.cfg.request_timeout_ms));
        let slice = Slice {
            start: req.start_index,
            max_length: req.max_length,
        };
        let mut out = self.outgoing(req)?;
        loop {
            *current = (out.method.clone(), out.url.clone());
            self.admit_hop(abort, records)?;
            let (target, resp) = self.recorded_hop(policy, &out, deadline, abort, records)?;
            let status = resp.status();
            let location = resp.header("location").map(str::to_string);
            let redirect = matches!(status, 301 | 302 | 303 | 307 | 308);
            let Some(loc) = location.filter(|_| redirect) else {
                let final_url = target.url.to_string();
                let withheld = out.withheld.clone();
                return self.read_response(resp, final_url, &slice, deadline, records, &withheld);
            };
            *current = (out.method.clone(), loc.clone());
            self.follow_redirect(policy, &mut out, status, &target.url, &loc, records)?;
            drop(resp);
        }
    }

    /// The request as the first hop sends it: a known method, clean headers, a body within
    /// the limit.
    fn outgoing(&self, req: Request) -> Result<Outgoing, Failure> {
        let Request {
            method,
            url,
            headers,
            body,
            withheld,
            ..
        } = req;
        let method = method.trim().to_ascii_uppercase();
        if !METHODS.contains(&method.as_str()) {
            return Err(Failure::input(
                "unsupported-method",
                format!("{method:?}; use one of {METHODS:?}"),
            ));
        }
        let headers = clean_headers(&headers)?;
        if body.len() as u64 > self.cfg.max_request_body_bytes {
            return Err(Failure::denied(guard::refuse(
                "request-body-too-large",
                format!(
                    "{} bytes; the limit is {}",
                    body.len(),
                    self.cfg.max_request_body_bytes
                ),
            )));
        }
        Ok(Outgoing {
            method,
            url,
            headers,
            body,
            redirects: 0,
            withheld,
        })
    }

    /// Whether another hop may start: the caller is still there, and the call's request
    /// budget (every hop counts) is not spent.
    fn admit_hop(&self, abort: &Arc<Abort>, records: &[HopRecord]) -> Result<(), Failure> {
        if abort.is_aborted() {
            return Err(cancelled());
        }
        if records.len() as u64 >= u64::from(self.cfg.max_requests_per_call) {
            return Err(Failure::denied(guard::refuse(
                "too-many-requests",
                format!(
                    "a call may make {} requests, redirects included",
                    self.cfg.max_requests_per_call
                ),
            )));
        }
        Ok(())
    }

    /// One hop ([`Broker::hop`]), timed, with its record appended (refused or failed ones
    /// too).
    fn recorded_hop(
        &self,
        policy: &Policy,
        out: &Outgoing,
        deadline: Instant,
        abort: &Arc<Abort>,
        records: &mut Vec<HopRecord>,
    ) -> Result<(Target, ureq::Response), Failure> {
        let mut rec = HopRecord {
            method: out.method.clone(),
            url: record_url(&out.url),
            mode: policy.mode.as_str(),
            ..HopRecord::default()
        };
        let t_hop = Instant::now();
        let span = crate::telemetry::child("egress.hop");
        let _in = span.enter();
        crate::telemetry::attribute("http.request.method", out.method.clone());
        let outcome = self.hop(policy, &out.hop(), deadline, abort, &mut rec);
        rec.elapsed_ms = t_hop.elapsed().as_millis() as u64;
        if let Err(f) = &outcome {
            if f.code == Code::Security {
                rec.refused = Some(f.rule);
            } else {
                rec.error = Some(f.rule.to_string());
            }
        }
        if crate::telemetry::enabled() {
            // The host only: a URL's path and query may carry what the tool sent.
            if let Some(h) = url::Url::parse(&out.url)
                .ok()
                .and_then(|u| u.host_str().map(String::from))
            {
                crate::telemetry::attribute("server.address", h);
            }
            if let Some(s) = rec.status {
                crate::telemetry::attribute("http.response.status_code", i64::from(s));
            }
            if let Some(r) = rec.refused {
                crate::telemetry::attribute("stsd.egress.refused", r);
            }
        }
        records.push(rec);
        outcome
    }

    /// Turns `out` into the request for the redirect's target `loc` (relative to `from`):
    /// within the redirect limit (a refusal is recorded), as GET where the status says so,
    /// with only content-neutral headers across origins.
    fn follow_redirect(
        &self,
        policy: &Policy,
        out: &mut Outgoing,
        status: u16,
        from: &url::Url,
        loc: &str,
        records: &mut Vec<HopRecord>,
    ) -> Result<(), Failure> {
        let next = from
            .join(loc)
            .map_err(|e| Failure::denied(guard::refuse("invalid-url", format!("redirect: {e}"))))?;
        out.redirects += 1;
        if out.redirects > self.cfg.max_redirects {
            records.push(HopRecord {
                method: out.method.clone(),
                url: record_url(next.as_str()),
                mode: policy.mode.as_str(),
                refused: Some("too-many-redirects"),
                ..HopRecord::default()
            });
            return Err(Failure::denied(guard::refuse(
                "too-many-redirects",
                format!("more than {} redirects", self.cfg.max_redirects),
            )));
        }
        // RFC 9110 §15.4: 303 becomes GET; so do 301/302 after a POST-like
        // method, as browsers (and the reference) do.
        let to_get = status == 303
            || (matches!(status, 301 | 302)
                && matches!(out.method.as_str(), "POST" | "PUT" | "PATCH"));
        if to_get && out.method != "HEAD" {
            out.method = "GET".into();
            out.body.clear();
            out.headers
                .retain(|(k, _)| !k.eq_ignore_ascii_case("content-type"));
        }
        // Across origins only content-neutral headers follow: a tool's API key in
        // any header must not reach whatever host a redirect names.
        if next.origin() != from.origin() {
            out.headers.retain(|(k, _)| {
                CROSS_ORIGIN_HEADERS
                    .iter()
                    .any(|c| k.eq_ignore_ascii_case(c))
            });
        }
        out.url = next.to_string();
        Ok(())
    }

    /// Checks, resolves and sends one hop; returns the response head (body unread).
    fn hop(
        &self,
        policy: &Policy,
        hop: &Hop<'_>,
        deadline: Instant,
        abort: &Arc<Abort>,
        rec: &mut HopRecord,
    ) -> Result<(Target, ureq::Response), Failure> {
        let Hop {
            method,
            url,
            headers,
            body,
            withheld,
        } = *hop;
        let (target, addrs) = self.check_and_resolve(policy, url, deadline, rec)?;
        // The secrets this host may receive go back in now, after every check of the URL the
        // code sent; the request put together must still name the same host and port.
        let applied = super::secrets::apply(withheld, &target.host, url, headers, body)
            .map_err(|e| Failure::input("secret-not-placeable", e))?;
        let (mut wire_url, headers, body) = match &applied {
            None => (target.url.clone(), headers, body),
            Some(a) => {
                rec.secrets = a.sent.clone();
                rec.withheld = a.withheld.clone();
                match url::Url::parse(&a.url) {
                    Ok(u)
                        if u.host_str() == target.url.host_str()
                            && u.port_or_known_default() == target.url.port_or_known_default() =>
                    {
                        (u, &a.headers[..], &a.body[..])
                    }
                    _ => {
                        return Err(Failure::input(
                            "secret-not-placeable",
                            "the request with its secrets put back names another host",
                        ))
                    }
                }
            }
        };
        let https = target.url.scheme() == "https";
        if https && !self.cfg.extra_ca_files.is_empty() {
            rec.extra_ca = true;
        }
        let remaining = remaining(deadline)?;
        let checked = addrs.clone();
        // A plain-http hop goes to ureq as https with a connector that does no TLS, so that
        // it too gets the deadline under every socket read and write (see conn.rs); the Host
        // header is then ours.
        let mut host_header = None;
        if !https {
            let host = target.url.host_str().unwrap_or_default().to_string();
            host_header = Some(match target.url.port() {
                Some(p) => format!("{host}:{p}"),
                None => host,
            });
            let ok = wire_url.set_scheme("https").is_ok()
                && wire_url.set_port(Some(target.port)).is_ok();
            if !ok {
                return Err(Failure::input("invalid-url", target.url.as_str()));
            }
        }
        let connector = super::conn::Connector {
            tls: https.then(|| self.tls.clone()),
            deadline,
            abort: abort.clone(),
        };
        let before_connect = abort.clone();
        let agent = ureq::AgentBuilder::new()
            // The only answer the client gets for this hop: the checked addresses (none once
            // the caller has gone away).
            .resolver(move |_netloc: &str| {
                if before_connect.is_aborted() {
                    return Err(super::conn::aborted());
                }
                Ok(checked.clone())
            })
            .redirects(0)
            .max_idle_connections(0)
            .timeout_connect(remaining.min(Duration::from_millis(self.cfg.connect_timeout_ms)))
            .timeout(remaining)
            .tls_connector(Arc::new(connector))
            .user_agent(USER_AGENT)
            .build();
        let mut r = agent.request_url(method, &wire_url);
        if let Some(h) = &host_header {
            r = r.set("Host", h);
        }
        for (k, v) in headers {
            r = r.set(k, v);
        }
        // The call's trace context, to a server that reads it (W3C Trace Context).
        for (k, v) in crate::telemetry::propagation() {
            if !headers.iter().any(|(h, _)| h.eq_ignore_ascii_case(&k)) {
                r = r.set(&k, &v);
            }
        }
        let sent = if body.is_empty() || matches!(method, "GET" | "HEAD") {
            r.call()
        } else {
            r.send_bytes(body)
        };
        let resp = match sent {
            Ok(resp) | Err(ureq::Error::Status(_, resp)) => resp,
            Err(ureq::Error::Transport(_)) if abort.is_aborted() => return Err(cancelled()),
            Err(ureq::Error::Transport(t)) => return Err(transport_failure(&t, deadline)),
        };
        rec.status = Some(resp.status());
        // The address actually connected to, and what let it through.
        let used = resp.remote_addr();
        rec.address = Some(used.to_string());
        if rec.via != Some("override") && guard::address_rule(used.ip()).is_some() {
            match guard::trusted_range(used.ip(), &self.trusted) {
                Some(net) => rec.trusted_range = Some(net.to_string()),
                None => rec.private_address = true, // only open mode gets here
            }
        }
        Ok((target, resp))
    }

    /// Parses and checks `url` under `policy` and resolves it to the only addresses it may be
    /// connected to (every rule of the guard, the host overrides and the trusted ranges). The
    /// upstreams' egress proxy (`gateway::proxy`) goes through here too.
    pub(crate) fn check_and_resolve(
        &self,
        policy: &Policy,
        url: &str,
        deadline: Instant,
        rec: &mut HopRecord,
    ) -> Result<(Target, Vec<SocketAddr>), Failure> {
        let target = guard::parse_target(url).map_err(Failure::denied)?;
        guard::check_target(&target, policy.mode, &policy.hosts, &self.trusted)
            .map_err(Failure::denied)?;
        let addrs = self.addresses(policy, &target, deadline, rec)?;
        Ok((target, addrs))
    }

    /// The addresses a hop may connect to: an operator override, the literal address, or one
    /// DNS lookup whose every answer passed the guard.
    fn addresses(
        &self,
        policy: &Policy,
        t: &Target,
        deadline: Instant,
        rec: &mut HopRecord,
    ) -> Result<Vec<SocketAddr>, Failure> {
        if let Some(o) = self.overrides.get(&t.host) {
            rec.via = Some("override");
            // An override without a port stands for the web ports only: it must not open
            // every port of a private address to the tool.
            if o.port.is_none() && !matches!(t.port, 80 | 443) {
                return Err(Failure::denied(guard::refuse(
                    "override-port",
                    format!(
                        "{}:{} is pinned by a host override without a port, which allows only \
                         ports 80 and 443 (write \"ip:port\" to allow another)",
                        t.host, t.port
                    ),
                )));
            }
            let sa = SocketAddr::new(o.ip, o.port.unwrap_or(t.port));
            rec.host_override = Some(format!("{} = {sa}", t.host));
            return Ok(vec![sa]);
        }
        let (ips, via) = match t.ip {
            Some(ip) => (vec![ip], "literal"),
            None => {
                let timeout =
                    remaining(deadline)?.min(Duration::from_millis(self.cfg.connect_timeout_ms));
                let ips = self.dns.lookup(&t.host, timeout).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::TimedOut {
                        Failure::runtime("timeout", "dns-timeout", format!("{}: {e}", t.host))
                    } else {
                        Failure::runtime("dns", "unknown-host", format!("{}: {e}", t.host))
                    }
                })?;
                if ips.is_empty() {
                    return Err(Failure::runtime(
                        "dns",
                        "unknown-host",
                        format!("{} has no address", t.host),
                    ));
                }
                guard::check_resolved(&t.host, &ips, policy.mode, &self.trusted)
                    .map_err(Failure::denied)?;
                (ips, "dns")
            }
        };
        rec.via = Some(via);
        Ok(ips
            .into_iter()
            .map(|ip| SocketAddr::new(ip, t.port))
            .collect())
    }

    /// Reads the body under the cap and the deadline, then slices it as the tool asked.
    fn read_response(
        &self,
        resp: ureq::Response,
        final_url: String,
        slice: &Slice,
        deadline: Instant,
        records: &mut [HopRecord],
        withheld: &stsd_protocol::envvar::WithheldSet,
    ) -> Result<Response, Failure> {
        let status = resp.status();
        let mut names: Vec<String> = resp.headers_names();
        names.dedup();
        let mut headers = Vec::new();
        let mut head_bytes = 0;
        for name in names.iter().filter(|n| !n.is_empty()) {
            if headers.iter().any(|(k, _): &(String, String)| k == name) {
                continue;
            }
            for v in resp.all(name) {
                head_bytes += name.len() + v.len();
                if head_bytes > MAX_HEAD_BYTES {
                    break;
                }
                headers.push((name.clone(), v.to_string()));
            }
        }
        let cap = self.cfg.max_body_bytes;
        let announced: u64 = resp
            .header("content-length")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut body = Vec::with_capacity(announced.min(cap + 1) as usize);
        let read = resp.into_reader().take(cap + 1).read_to_end(&mut body);
        if let Some(last) = records.last_mut() {
            last.bytes = Some(body.len() as u64);
        }
        if let Err(e) = read {
            let f = if is_timeout(&e) || Instant::now() >= deadline {
                Failure::runtime("timeout", "request-timeout", TIMEOUT_DETAIL)
            } else {
                Failure::runtime("io", "read-failed", e.to_string())
            };
            if let Some(last) = records.last_mut() {
                last.error = Some(f.rule.to_string());
            }
            return Err(f);
        }
        if body.len() as u64 > cap {
            if let Some(last) = records.last_mut() {
                last.refused = Some("response-body-too-large");
            }
            return Err(Failure::denied(guard::refuse(
                "response-body-too-large",
                format!("the body is over the {cap} byte limit"),
            )));
        }
        // An echoed secret is masked back to its placeholder before the slice is cut: masked
        // after, a tool could read it a byte at a time (no one-byte slice matches a form).
        let mut head_url = final_url;
        super::secrets::mask_echoes(withheld, &mut head_url, &mut headers, &mut body);
        let final_url = head_url;
        let total = body.len() as u64;
        let start = slice.start.min(total);
        let end = match slice.max_length {
            Some(n) => start.saturating_add(n).min(total),
            None => total,
        };
        let truncated = end < total;
        body.truncate(end as usize);
        body.drain(..start as usize);
        Ok(Response {
            head: FetchHead {
                status,
                status_text: reason(status).to_string(),
                url: final_url,
                headers,
                body_len: body.len() as u64,
                truncated,
                next_start_index: truncated.then_some(end),
            },
            body,
        })
    }
}

struct Slice {
    start: u64,
    max_length: Option<u64>,
}

/// The request as it stands: each redirect followed rewrites it.
struct Outgoing {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Redirects followed so far.
    redirects: u32,
    withheld: stsd_protocol::envvar::WithheldSet,
}

impl Outgoing {
    /// The next hop's request.
    fn hop(&self) -> Hop<'_> {
        Hop {
            method: &self.method,
            url: &self.url,
            headers: &self.headers,
            body: &self.body,
            withheld: &self.withheld,
        }
    }
}

/// One hop's request.
#[derive(Clone, Copy)]
struct Hop<'a> {
    method: &'a str,
    withheld: &'a stsd_protocol::envvar::WithheldSet,
    url: &'a str,
    headers: &'a [(String, String)],
    body: &'a [u8],
}

/// The fetch was aborted because its caller went away (nobody sees this answer; the call
/// is recorded CANCELLED).
fn cancelled() -> Failure {
    Failure::runtime("io", "cancelled", "the caller went away")
}

fn remaining(deadline: Instant) -> Result<Duration, Failure> {
    let now = Instant::now();
    if now >= deadline {
        return Err(Failure::runtime(
            "timeout",
            "request-timeout",
            TIMEOUT_DETAIL,
        ));
    }
    Ok(deadline - now)
}

const TIMEOUT_DETAIL: &str =
    "no complete response before the request timeout (or the call's deadline)";

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
    )
}

fn transport_failure(t: &ureq::Transport, deadline: Instant) -> Failure {
    use std::error::Error as _;
    let mut detail = t.to_string();
    let mut timed_out = Instant::now() >= deadline;
    let mut tls = false;
    let mut src = t.source();
    while let Some(e) = src {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            timed_out |= is_timeout(io);
            tls |= io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some());
        }
        tls |= e.downcast_ref::<rustls::Error>().is_some();
        src = e.source();
    }
    if timed_out {
        return Failure::runtime("timeout", "request-timeout", TIMEOUT_DETAIL);
    }
    if tls {
        return Failure::runtime("tls", "tls-failed", detail);
    }
    match t.kind() {
        ureq::ErrorKind::Dns => Failure::runtime("dns", "unknown-host", detail),
        ureq::ErrorKind::ConnectionFailed => Failure::runtime("io", "connect-failed", detail),
        ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader => {
            Failure::runtime("io", "bad-response", detail)
        }
        ureq::ErrorKind::InvalidUrl | ureq::ErrorKind::UnknownScheme => {
            detail.insert_str(0, "the client refused the URL: ");
            Failure::input("invalid-url", detail)
        }
        _ => Failure::runtime("io", "io-failed", detail),
    }
}

/// Validates the tool's headers (names are tokens, values have no CR, LF or NUL) and drops
/// the ones it may not set.
fn clean_headers(h: &[(String, String)]) -> Result<Vec<(String, String)>, Failure> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    let mut out = Vec::new();
    for (k, v) in h {
        if k.is_empty() || !k.chars().all(token) {
            return Err(Failure::input("bad-header", format!("header name {k:?}")));
        }
        if !v.chars().all(|c| c == '\t' || (' '..='~').contains(&c)) {
            return Err(Failure::input(
                "bad-header",
                format!("the value of {k:?} must be printable ASCII (no line breaks)"),
            ));
        }
        if DROPPED_HEADERS.iter().any(|d| k.eq_ignore_ascii_case(d)) {
            continue;
        }
        out.push((k.clone(), v.clone()));
    }
    Ok(out)
}

/// Canonical reason phrases (the reference uses a fixed table too: a server's own phrase is
/// not passed through).
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_is_read_from_tool_safety() {
        let p = Policy::from_tool_safety_json(
            r#"{"capabilities":{"network":{"mode":"allowlist","hosts":["a.com"]}}}"#,
        );
        assert_eq!(p.mode, NetworkMode::Allowlist);
        assert_eq!(p.hosts, vec!["a.com".to_string()]);
        assert_eq!(
            Policy::from_tool_safety_json("not json").mode,
            NetworkMode::Blocked
        );
    }

    #[test]
    fn header_rules() {
        let h = |k: &str, v: &str| (k.to_string(), v.to_string());
        let out = clean_headers(&[
            h("Host", "evil"),
            h("Connection", "close"),
            h("Transfer-Encoding", "chunked"),
            h("Accept", "application/json"),
            h("X-Api-Key", "k"),
        ])
        .unwrap_or_default();
        assert_eq!(
            out,
            vec![h("Accept", "application/json"), h("X-Api-Key", "k")]
        );
        assert!(clean_headers(&[h("X", "a\r\nInjected: 1")]).is_err());
        assert!(clean_headers(&[h("Bad Name", "a")]).is_err());
    }

    #[test]
    fn a_host_override_without_a_port_allows_only_80_and_443() {
        let mut cfg = EgressConfig::default();
        cfg.host_overrides
            .insert("pinned.test".into(), "127.0.0.1".into());
        cfg.host_overrides
            .insert("ported.test".into(), "127.0.0.1:1".into());
        cfg.connect_timeout_ms = 300;
        let b = Broker::new(&cfg).unwrap_or_else(|e| panic!("{e}"));
        let open = Policy {
            mode: NetworkMode::Open,
            hosts: vec![],
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let req = |url: &str| Request {
            method: "GET".into(),
            url: url.into(),
            headers: vec![],
            body: vec![],
            start_index: 0,
            max_length: None,
            withheld: Default::default(),
        };
        let mut recs = Vec::new();
        for port in [22, 6379, 8080] {
            let e = b
                .fetch(
                    &open,
                    req(&format!("http://pinned.test:{port}/")),
                    deadline,
                    &mut recs,
                )
                .err();
            assert_eq!(
                e.map(|e| (e.code, e.rule)),
                Some((Code::Security, "override-port")),
                "port {port}"
            );
        }
        // The web ports pass the rule (and then fail to connect, nothing listens there).
        for url in ["http://pinned.test/", "https://pinned.test/"] {
            let e = b.fetch(&open, req(url), deadline, &mut recs).err();
            assert_ne!(e.map(|e| e.rule), Some("override-port"), "{url}");
        }
        // With an explicit port, the URL's port does not choose where to connect.
        let _ = b.fetch(&open, req("http://ported.test:6379/"), deadline, &mut recs);
        assert_eq!(
            recs.last().and_then(|r| r.host_override.clone()).as_deref(),
            Some("ported.test = 127.0.0.1:1")
        );
    }

    #[test]
    fn refusals_are_security_errors_naming_the_rule() {
        let b = Broker::new(&EgressConfig::default()).unwrap_or_else(|e| panic!("{e}"));
        let strict = Policy {
            mode: NetworkMode::Strict,
            hosts: vec![],
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut recs = Vec::new();
        let req = |url: &str| Request {
            method: "GET".into(),
            url: url.into(),
            headers: vec![],
            body: vec![],
            start_index: 0,
            max_length: None,
            withheld: Default::default(),
        };
        let e = b.fetch(&strict, req("http://127.0.0.1:1/"), deadline, &mut recs);
        let e = e.err().unwrap_or_else(|| panic!("loopback allowed"));
        assert_eq!((e.code, e.rule), (Code::Security, "loopback"));
        assert!(
            e.message.starts_with("[fetch] denied: loopback: "),
            "{}",
            e.message
        );
        assert_eq!(recs.last().and_then(|r| r.refused), Some("loopback"));
        let e = b.fetch(&strict, req("ftp://x/"), deadline, &mut recs).err();
        assert_eq!(e.map(|e| e.rule), Some("unsupported-scheme"));
        let mut bad = req("https://x/");
        bad.method = "TRACE".into();
        let e = b.fetch(&strict, bad, deadline, &mut recs).err();
        assert_eq!(e.map(|e| e.code), Some(Code::InvalidInput));
    }
}
