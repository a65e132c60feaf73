//! MCP over Streamable HTTP (`--listen ADDR:PORT` or `[http] listen`): one more transport in
//! front of the same MCP handler and service as the Unix socket. This module only decides
//! who may talk (TLS, a bearer token or a client certificate, the `Origin` and `Host`
//! checks) and hands each authenticated request to rmcp's Streamable HTTP service, with the
//! principal in the request's extensions; it knows nothing of tools, approval or workers.
//!
//! | path | auth | what |
//! |---|---|---|
//! | `GET /healthz` | none | liveness: `ok` while the process serves HTTP |
//! | `GET /readyz` | none | readiness: 200 once the pool has warmed and a catalog is served, 503 while draining or while a shared state store is unreachable |
//! | `GET /.well-known/oauth-protected-resource[/path]` | none | with `[http.oauth]`: the protected-resource metadata (RFC 9728) |
//! | `[http] path` (`/mcp`) | token, client cert or OAuth access token | MCP: stateless 2026-07-28, and 2025-11-25 sessions when `legacy_sessions` |
//! | `POST /admin` | token or client cert, a principal in `admin_principals`/`approver_principals` | the `stsd/...` admin methods (JSON-RPC) |
//! | `/ui/...` | a console session (login with a token or client cert) | the operator console (`crate::console`), unless `[console] enabled = false` |
//!
//! `[console] listen` binds a second, loopback-only listener that serves the console alone.

pub mod auth;
pub mod oauth;
mod origin;
pub mod tls;

use crate::call::{Principal, PrincipalKind};
use crate::mcp::Handler;
use crate::service::Service;
use crate::transport::AdminHandler;
use auth::Tokens;
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stsd_profiles::baseline::HttpConfig;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

type Body = BoxBody<Bytes, Infallible>;

/// How often the state store's bearer tokens are read again.
const TOKEN_REFRESH: Duration = Duration::from_secs(5);

/// How long a client has for its TLS handshake and for its request head.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The listener, bound and configured, before it serves.
pub struct Bound {
    listener: TcpListener,
    pub addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// The tokens file's, until [`Bound::with_store`] makes the book of them and the store's.
    tokens: Tokens,
    book: Option<Arc<auth::TokenBook>>,
    oauth: Option<Arc<oauth::OAuth>>,
    config: HttpConfig,
    /// `[console] listen`: serves `/ui/` (and health) only.
    console_only: bool,
}

impl Bound {
    /// The state store's tokens join the tokens file's. Refused when no caller could
    /// authenticate: no token anywhere and no client CA.
    pub fn with_store(mut self, store: Option<Arc<crate::state::Store>>) -> Result<Bound, String> {
        let book = Arc::new(auth::TokenBook::new(
            std::mem::take(&mut self.tokens),
            store.clone(),
        ));
        if book.is_empty() && self.config.client_ca.is_none() && self.oauth.is_none() {
            return Err(
                "MCP over HTTP needs a way to authenticate callers: a bearer token \
                 (stsd token add NAME, kept in the state store; or [http] tokens_file), \
                 [http] client_ca, or [http.oauth]"
                    .into(),
            );
        }
        if let Some(store) = store {
            // Another replica added or removed a token.
            let weak = Arc::downgrade(&book);
            store.on_change(Box::new(move |what: &[String]| {
                if what.iter().any(|w| w == "tokens") {
                    if let Some(b) = weak.upgrade() {
                        b.refresh();
                    }
                }
            }));
        }
        self.book = Some(book);
        Ok(self)
    }

    /// One line for the startup banner.
    pub fn describe(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        if self.console_only {
            return format!("operator console on {scheme}://{}/ui/\n", self.addr);
        }
        let mut auth = Vec::new();
        let (tokens, principals) = match &self.book {
            Some(b) => b.describe(),
            None => (self.tokens.len(), self.tokens.principals().len()),
        };
        if tokens > 0 {
            auth.push(format!(
                "{tokens} bearer tokens for {principals} principals"
            ));
        }
        if self.config.client_ca.is_some() {
            auth.push("client certificates".into());
        }
        if let Some(o) = &self.config.oauth {
            auth.push(format!("OAuth access tokens from {}", o.issuer));
        }
        format!(
            "MCP over Streamable HTTP on {scheme}://{}{} (2026-07-28{}; auth: {}); health on /healthz, /readyz\n",
            self.addr,
            self.config.path,
            if self.config.legacy_sessions {
                " stateless, 2025-11-25 sessions"
            } else {
                " stateless only"
            },
            auth.join(", ")
        )
    }
}

/// Checks the `[http]` settings and binds. Refused: no way to authenticate, a certificate
/// without its key, plain HTTP on a non-loopback address without `allow_plaintext`.
pub async fn bind(config: &HttpConfig, listen: &str) -> Result<Bound, String> {
    let addr: SocketAddr = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| format!("--listen {listen}: {e}"))?
        .next()
        .ok_or_else(|| format!("--listen {listen}: no address"))?;
    if !config.path.starts_with('/') || config.path == "/healthz" || config.path == "/readyz" {
        return Err(format!(
            "[http] path {:?} must start with / and not be a health path",
            config.path
        ));
    }
    let tokens = match &config.tokens_file {
        Some(f) => Tokens::load(f)?,
        None => Tokens::default(),
    };
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(c), Some(k)) => Some(tokio_rustls::TlsAcceptor::from(tls::server_config(
            c,
            k,
            config.client_ca.as_deref(),
        )?)),
        (None, None) => None,
        _ => return Err("[http] tls_cert and tls_key go together".into()),
    };
    if tls.is_none() {
        if config.client_ca.is_some() {
            return Err("[http] client_ca needs TLS (tls_cert and tls_key)".into());
        }
        if !addr.ip().is_loopback() && !config.allow_plaintext {
            return Err(format!(
                "refusing plain HTTP on {addr}: bearer tokens would cross the network in clear; \
                 set [http] tls_cert and tls_key, or allow_plaintext = true when a proxy in \
                 front terminates TLS"
            ));
        }
    }
    for o in &config.allowed_origins {
        origin::normalize(o)
            .ok_or_else(|| format!("[http] allowed_origins: {o:?} is not scheme://host[:port]"))?;
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let addr = listener.local_addr().unwrap_or(addr);
    let oauth = match &config.oauth {
        Some(o) => {
            let scheme = if tls.is_some() { "https" } else { "http" };
            let default_resource = format!("{scheme}://{addr}{}", config.path);
            Some(Arc::new(oauth::OAuth::new(o, default_resource)?))
        }
        None => None,
    };
    Ok(Bound {
        listener,
        addr,
        tls,
        tokens,
        book: None,
        oauth,
        config: config.clone(),
        console_only: false,
    })
}

/// `[console] listen`: a loopback listener for the console alone (plain HTTP: it never leaves
/// the machine), with the `[http]` section's ways to log in.
pub async fn bind_console(config: &HttpConfig, listen: &str) -> Result<Bound, String> {
    let addr = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| format!("[console] listen {listen}: {e}"))?
        .next()
        .ok_or_else(|| format!("[console] listen {listen}: no address"))?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "[console] listen {listen}: a loopback address only (put the console on [http] \
             listen, with TLS, to reach it from elsewhere)"
        ));
    }
    let mut c = config.clone();
    c.tls_cert = None;
    c.tls_key = None;
    c.client_ca = None;
    c.allow_plaintext = false;
    let mut b = bind(&c, &addr.to_string())
        .await
        .map_err(|e| format!("[console] listen: {e}"))?;
    b.console_only = true;
    Ok(b)
}

/// What every request shares.
struct Shared {
    service: Arc<Service>,
    tokens: Arc<auth::TokenBook>,
    oauth: Option<Arc<oauth::OAuth>>,
    config: HttpConfig,
    origins: Vec<String>,
    mcp: StreamableHttpService<Handler, LocalSessionManager>,
    admin: Arc<dyn AdminHandler>,
    /// Cancelled when the daemon stops accepting: `/readyz` says so, so a load balancer
    /// sends nothing new while in-flight calls finish.
    draining: CancellationToken,
    /// Latched once the pool has had a ready worker.
    warmed: AtomicBool,
    /// The operator console (`/ui/`), when served here.
    console: Option<Arc<crate::console::Console>>,
    console_only: bool,
    /// The host names a loopback listener answers to (a DNS-rebinding page is refused).
    loopback: bool,
}

/// Serves until `draining` is cancelled (no new connection), and keeps answering requests
/// on open connections until `stop` (after the daemon's grace period).
pub async fn serve(
    bound: Bound,
    service: Arc<Service>,
    changed: broadcast::Sender<()>,
    admin: Arc<dyn AdminHandler>,
    draining: CancellationToken,
    stop: CancellationToken,
) {
    let mut mcp_config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(bound.config.legacy_sessions)
        .with_cancellation_token(stop.clone())
        .with_max_request_body_bytes(bound.config.max_request_bytes)
        // Origin is checked before authentication, here (403 for any Origin not listed).
        .disable_allowed_origins();
    mcp_config = if !bound.config.allowed_hosts.is_empty() {
        mcp_config.with_allowed_hosts(bound.config.allowed_hosts.clone())
    } else if bound.addr.ip().is_loopback() {
        // Names without a port match any port (a proxy on loopback in front keeps its own).
        mcp_config.with_allowed_hosts(["localhost", "127.0.0.1", "::1"])
    } else {
        mcp_config.disable_allowed_hosts()
    };
    let factory = {
        let (service, changed, stop) = (service.clone(), changed.clone(), stop.clone());
        let legacy = bound.config.legacy_sessions;
        move || {
            let h = Handler::new(
                service.clone(),
                changed.clone(),
                None,
                "http",
                stop.child_token(),
            );
            Ok(if legacy { h } else { h.modern_only() })
        }
    };
    let mcp = StreamableHttpService::new(factory, Default::default(), mcp_config);
    let mut bound = bound;
    let tokens = bound.book.take().unwrap_or_else(|| {
        Arc::new(auth::TokenBook::new(
            std::mem::take(&mut bound.tokens),
            None,
        ))
    });
    let console = console_for(&bound, &service, &admin, &tokens);
    let shared = Arc::new(Shared {
        service,
        origins: bound
            .config
            .allowed_origins
            .iter()
            .filter_map(|o| origin::normalize(o))
            .collect(),
        tokens,
        oauth: bound.oauth,
        config: bound.config,
        mcp,
        admin,
        draining: draining.clone(),
        warmed: AtomicBool::new(false),
        console,
        console_only: bound.console_only,
        loopback: bound.addr.ip().is_loopback(),
    });
    spawn_token_refresh(shared.tokens.clone(), stop.clone());
    let max_conns = Arc::new(tokio::sync::Semaphore::new(
        shared.service.config().daemon.max_connections.max(1),
    ));
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            a = bound.listener.accept() => a,
            _ = draining.cancelled() => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "HTTP accept failed; backing off");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = max_conns.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "HTTP connection refused: max_connections reached");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (shared, tls, stop) = (shared.clone(), bound.tls.clone(), stop.clone());
        conns.spawn(async move {
            tokio::select! {
                _ = connection(tcp, tls, shared) => {}
                _ = stop.cancelled() => {}
            }
            drop(permit);
        });
        while conns.try_join_next().is_some() {}
    }
    // Draining: no new connection; open ones finish the requests they carry (idle ones
    // close at once), until the daemon's grace period is over.
    drop(bound.listener);
    loop {
        tokio::select! {
            next = conns.join_next() => if next.is_none() { break },
            _ = stop.cancelled() => {
                conns.shutdown().await;
                break;
            }
        }
    }
}

/// One TCP connection: TLS if configured, then HTTP/1.1 requests.
async fn connection(
    tcp: tokio::net::TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    let draining = shared.draining.clone();
    match tls {
        None => {
            let svc = service_for(shared, None);
            let conn = builder.serve_connection(TokioIo::new(tcp), svc);
            drain_when(conn, draining).await;
        }
        Some(acceptor) => {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let cert = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(tls::cert_principal);
            let svc = service_for(shared, cert);
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            drain_when(conn, draining).await;
        }
    }
}

/// Serves a connection; once `draining`, it ends gracefully: the response in progress is
/// finished, then the connection closes.
async fn drain_when<I, S>(
    conn: hyper::server::conn::http1::Connection<I, S>,
    draining: CancellationToken,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S: hyper::service::HttpService<Incoming, ResBody = Body>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = draining.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

fn service_for(
    shared: Arc<Shared>,
    cert: Option<String>,
) -> impl hyper::service::Service<
    Request<Incoming>,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl std::future::Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    let cert = Arc::new(cert);
    hyper::service::service_fn(move |req| {
        let (shared, cert) = (shared.clone(), cert.clone());
        async move { Ok(route(&shared, cert.as_deref(), req).await) }
    })
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// 401 with the RFC 6750 challenge: no credential at all, or one that was not accepted.
/// With OAuth the challenge points at the protected-resource metadata (RFC 9728), so a
/// client can find the authorization server; a valid token without a required scope is 403
/// `insufficient_scope`.
fn unauthorized(shared: &Shared, refusal: Option<oauth::Refusal>) -> Response<Body> {
    let (status, body) = match &refusal {
        Some(oauth::Refusal::Scope) => {
            (StatusCode::FORBIDDEN, "the token lacks a required scope\n")
        }
        Some(_) => (StatusCode::UNAUTHORIZED, "the token was not accepted\n"),
        None => (
            StatusCode::UNAUTHORIZED,
            "authentication required: Authorization: Bearer <token>\n",
        ),
    };
    let challenge = match (&shared.oauth, &refusal) {
        (Some(o), r) => o.challenge(r.as_ref()),
        (None, Some(_)) => "Bearer realm=\"stsd\", error=\"invalid_token\"".into(),
        (None, None) => "Bearer realm=\"stsd\"".into(),
    };
    let mut r = text(status, body);
    if let Ok(v) = header::HeaderValue::from_str(&challenge) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// The protected-resource metadata, when OAuth is configured and `path` is its URL.
fn resource_metadata(shared: &Shared, path: &str) -> Option<Response<Body>> {
    let o = shared.oauth.as_ref()?;
    if path != o.metadata_path() && path != "/.well-known/oauth-protected-resource" {
        return None;
    }
    let mut r = Response::new(Full::new(Bytes::from(o.metadata().to_string())).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    Some(r)
}

/// Who presents this request's credential: a bearer token (stsd's own, or an OAuth access
/// token, a JWT, which always has dots and stsd's never do), else the client certificate.
async fn authenticate(
    shared: &Shared,
    cert: Option<&str>,
    req: &Request<Incoming>,
) -> Result<Principal, Response<Body>> {
    let Some(token) = auth::bearer(req.headers().get(header::AUTHORIZATION)) else {
        return match cert {
            Some(name) => Ok(Principal::new(name, PrincipalKind::Certificate)),
            None => {
                let presented = req.headers().contains_key(header::AUTHORIZATION);
                Err(unauthorized(
                    shared,
                    presented.then(|| oauth::Refusal::Invalid("not a bearer token".into())),
                ))
            }
        };
    };
    if let (Some(o), true) = (&shared.oauth, token.contains('.')) {
        return o.authenticate(token).await.map_err(|r| {
            tracing::info!(refusal = ?r, "HTTP request refused: OAuth access token not accepted");
            unauthorized(shared, Some(r))
        });
    }
    match shared.tokens.principal(token).await {
        Some(name) => Ok(Principal::new(name, PrincipalKind::Token)),
        None => {
            tracing::info!("HTTP request refused: unknown bearer token");
            Err(unauthorized(
                shared,
                Some(oauth::Refusal::Invalid("unknown token".into())),
            ))
        }
    }
}

async fn route(shared: &Shared, cert: Option<&str>, mut req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path();
    if path == "/healthz" || path == "/readyz" {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n");
        }
        return if path == "/healthz" {
            text(StatusCode::OK, "ok\n")
        } else if ready(shared) {
            text(StatusCode::OK, "ready\n")
        } else {
            text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
        };
    }
    if crate::console::Console::owns(path) {
        return match &shared.console {
            Some(c) if host_allowed(shared, &req) => c.handle(req, cert).await,
            Some(_) => text(StatusCode::MISDIRECTED_REQUEST, "host not allowed\n"),
            None => text(StatusCode::NOT_FOUND, "not found\n"),
        };
    }
    if shared.console_only {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    if req.method() == Method::GET {
        if let Some(r) = resource_metadata(shared, path) {
            return r;
        }
    }
    let is_mcp = path == shared.config.path;
    let is_admin = path == "/admin";
    if !is_mcp && !is_admin {
        return text(StatusCode::NOT_FOUND, "not found\n");
    }
    // MCP spec (transports): an Origin that is present and not allowed is refused with 403,
    // before anything else is looked at.
    if let Some(o) = req.headers().get(header::ORIGIN) {
        let ok = o
            .to_str()
            .ok()
            .and_then(origin::normalize)
            .is_some_and(|n| shared.origins.contains(&n));
        if !ok {
            tracing::info!(origin = ?o, "HTTP request refused: Origin not allowed");
            return text(StatusCode::FORBIDDEN, "origin not allowed\n");
        }
    }
    let principal = match authenticate(shared, cert, &req).await {
        Ok(p) => p,
        Err(refused) => return refused,
    };
    if is_admin {
        return admin(shared, principal, req).await;
    }
    req.extensions_mut().insert(principal);
    let backoff = crate::mcp::Backoff::default();
    req.extensions_mut().insert(backoff.clone());
    let mut r = shared.mcp.handle(req).await;
    // A call refused RATE_LIMITED: the JSON-RPC reply stays the body, the status says so.
    if let Some(ms) = backoff.retry_after_ms() {
        if r.status() == StatusCode::OK {
            *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            r.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(ms.div_ceil(1000)),
            );
        }
    }
    r
}

/// Reads the state store's tokens again every [`TOKEN_REFRESH`]: a token removed from the
/// store stops working within that.
fn spawn_token_refresh(book: Arc<auth::TokenBook>, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TOKEN_REFRESH) => {}
                _ = stop.cancelled() => return,
            }
            let b = book.clone();
            let _ = tokio::task::spawn_blocking(move || b.refresh()).await;
        }
    });
}

/// The operator console this listener serves, if any (`[console]`).
fn console_for(
    bound: &Bound,
    service: &Arc<Service>,
    admin: &Arc<dyn AdminHandler>,
    tokens: &Arc<auth::TokenBook>,
) -> Option<Arc<crate::console::Console>> {
    if !bound.console_only && !service.config().console.enabled {
        return None;
    }
    let login = console_login(tokens.clone(), bound.oauth.clone());
    crate::console::Console::new(
        admin.clone(),
        service.clone(),
        login,
        // Behind a proxy that terminates TLS (allow_plaintext), the browser's origin is https.
        match (bound.tls.is_some(), bound.config.allow_plaintext) {
            (true, _) => Some(true),
            (false, true) => None,
            (false, false) => Some(false),
        },
        bound.config.allowed_origins.clone(),
    )
    .map_err(|e| tracing::error!(error = %e, "the operator console is not served"))
    .ok()
}

/// The console's DNS-rebinding check, as MCP's: the `Host` is one of `[http] allowed_hosts`,
/// or on a loopback listener a loopback name.
fn host_allowed(shared: &Shared, req: &Request<Incoming>) -> bool {
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => host,
    }
    .trim_matches(['[', ']'])
    .to_ascii_lowercase();
    // The console's own loopback listener answers to loopback names only, whatever the
    // public listener's `allowed_hosts` say.
    if !shared.config.allowed_hosts.is_empty() && !shared.console_only {
        return shared
            .config
            .allowed_hosts
            .iter()
            .any(|h| h.eq_ignore_ascii_case(&name) || h.eq_ignore_ascii_case(host));
    }
    !shared.loopback || matches!(name.as_str(), "localhost" | "127.0.0.1" | "::1")
}

/// How the console's login form checks a token: as a request's bearer token is checked.
fn console_login(
    tokens: Arc<auth::TokenBook>,
    oauth: Option<Arc<oauth::OAuth>>,
) -> crate::console::Login {
    Arc::new(move |token: String| {
        let (tokens, oauth) = (tokens.clone(), oauth.clone());
        Box::pin(async move {
            if let (Some(o), true) = (&oauth, token.contains('.')) {
                return o.authenticate(&token).await.ok();
            }
            tokens
                .principal(&token)
                .await
                .map(|name| Principal::new(name, PrincipalKind::Token))
        })
    })
}

fn ready(shared: &Shared) -> bool {
    if shared.draining.is_cancelled() {
        return false;
    }
    if !shared.warmed.load(Ordering::Relaxed) && shared.service.pool.ready_count() > 0 {
        shared.warmed.store(true, Ordering::Relaxed);
    }
    // A replica that cannot reach the shared store would serve a catalog the others have
    // moved on from: the balancer should send calls elsewhere (it keeps serving those that
    // reach it anyway).
    shared.warmed.load(Ordering::Relaxed)
        && !shared.service.published().tools.is_empty()
        && shared.service.store().is_none_or(|s| s.reachable())
}

/// `POST /admin`: one JSON-RPC request for the admin channel, answered as JSON. The rights
/// are the policy's for the principal (by default `[http] admin_principals`,
/// `approver_principals`).
async fn admin(shared: &Shared, principal: Principal, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::POST {
        return text(StatusCode::METHOD_NOT_ALLOWED, "POST a JSON-RPC request\n");
    }
    let body = match Limited::new(req.into_body(), 1024 * 1024).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return text(StatusCode::PAYLOAD_TOO_LARGE, "request too large\n"),
    };
    let msg: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => return text(StatusCode::BAD_REQUEST, "not JSON\n"),
    };
    let id = msg.get("id").cloned().unwrap_or(serde_json::Value::Null);
    let method = msg
        .get("method")
        .and_then(|m| m.as_str())
        .unwrap_or_default()
        .to_string();
    let params = msg
        .get("params")
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    let who = crate::call::Subject::Principal(principal);
    let reply = match shared.admin.handle(who, method, params).await {
        Ok(result) => serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            serde_json::json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    let mut r = Response::new(Full::new(Bytes::from(reply.to_string())).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    r
}
