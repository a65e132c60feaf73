//! The operator console (issue 37): web pages for the decisions seed 001 and seed 002 put in
//! front of a person, served under `/ui/` by the daemon's HTTP listener (and by `[console]
//! listen`, a loopback listener that serves only the console). One entry point,
//! [`Console::handle`].
//!
//! It is a front, like the admin socket: every page reads through the admin channel's
//! methods and every button calls one, as the person who logged in
//! (`Subject::Principal`), so the policy decides what they see and may press and the
//! console adds no second path to the state. Each state-changing request is audited with
//! that principal (`event: "console"`).
//!
//! A person logs in with a bearer token (`stsd token add NAME`) or, over mTLS, their client
//! certificate; the session lives in a cookie (`session`). Every state-changing request is a
//! POST with the session's CSRF token and an `Origin` (or `Referer`) of the console itself.
//! Pages are rendered on the server from templates that escape HTML (`pages`); the only
//! script is `static/console.js` (live approvals, the preview's chip), under a
//! Content-Security-Policy that allows no inline script, no framing and no other origin.

mod door;
mod pages;
mod reply;
pub mod session;
mod sse;

use crate::call::{Principal, Subject};
use crate::service::Service;
use crate::transport::AdminHandler;
use door::Door;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
pub use reply::Body;
use reply::{plain, redirect, Ask};
use serde_json::{json, Value};
use session::Sessions;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// How a login's token becomes a principal (the HTTP listener's own check: stsd's tokens,
/// OAuth access tokens). None: not accepted.
pub type Login =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Option<Principal>> + Send>> + Send + Sync>;

/// The console's Content-Security-Policy: scripts, styles and requests from itself only, no
/// inline script or style, no plugin, no framing, forms posted to itself.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The most live streams open at once.
const MAX_STREAMS: usize = 32;

/// A form body larger than this is refused.
const MAX_FORM: usize = 64 * 1024;

pub struct Console {
    admin: Arc<dyn AdminHandler>,
    service: Arc<Service>,
    login: Login,
    sessions: Arc<Sessions>,
    /// The live streams (server-sent events) open at once, all sessions together.
    streams: Arc<tokio::sync::Semaphore>,
    /// Whether the browser reaches it over TLS (the origin's scheme; None: either, behind a
    /// proxy that terminates TLS).
    tls: Option<bool>,
    /// Origins besides the console's own that may post (`[http] allowed_origins`).
    origins: Vec<String>,
    pages: pages::Pages,
}

impl Console {
    pub fn new(
        admin: Arc<dyn AdminHandler>,
        service: Arc<Service>,
        login: Login,
        tls: Option<bool>,
        origins: Vec<String>,
    ) -> Result<Arc<Console>, String> {
        Ok(Arc::new(Console {
            admin,
            service,
            login,
            sessions: Arc::default(),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            tls,
            origins,
            pages: pages::Pages::new()?,
        }))
    }

    /// Whether `path` is the console's.
    pub fn owns(path: &str) -> bool {
        path == "/ui" || path.starts_with("/ui/")
    }

    /// One request under `/ui/`. `cert`: the client certificate's principal name, over mTLS.
    pub async fn handle(
        &self,
        req: Request<hyper::body::Incoming>,
        cert: Option<&str>,
    ) -> Response<Body> {
        let mut r = self.route(req, cert).await;
        let h = r.headers_mut();
        h.insert("content-security-policy", HeaderValue::from_static(CSP));
        h.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        h.insert("x-frame-options", HeaderValue::from_static("DENY"));
        h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
        h.entry(header::CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-store"));
        r
    }

    async fn route(
        &self,
        req: Request<hyper::body::Incoming>,
        cert: Option<&str>,
    ) -> Response<Body> {
        let path = req.uri().path().to_string();
        let method = req.method().clone();
        if let Some(file) = path.strip_prefix("/ui/static/") {
            return pages::asset(file);
        }
        let posted = method == Method::POST;
        if posted && !session::same_origin(req.headers(), self.tls, &self.origins) {
            tracing::info!(
                path,
                "console request refused: not from the console's origin"
            );
            return plain(StatusCode::FORBIDDEN, "origin not allowed\n");
        }
        if path == "/ui/login" {
            return match method {
                Method::GET => self.pages.login(None),
                Method::POST => self.login(req, cert).await,
                _ => plain(StatusCode::METHOD_NOT_ALLOWED, "GET or POST\n"),
            };
        }
        let sid = session::cookie_of(req.headers().get(header::COOKIE));
        let Some((sid, s)) = sid.and_then(|id| self.sessions.get(&id).map(|s| (id, s))) else {
            return redirect("/ui/login");
        };
        if !self.still_valid(&s, cert).await {
            tracing::info!(who = %s.principal.name, "console session ended: its credential is no longer accepted");
            self.sessions.close(&sid);
            return redirect("/ui/login");
        }
        let query = req.uri().query().unwrap_or_default().to_string();
        let last_event_id: Option<u64> = req
            .headers()
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let mut fields: HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        if posted {
            match form(req).await {
                Ok(f) => fields.extend(f),
                Err(r) => return r,
            }
            let sent = fields.get("csrf").map(String::as_str).unwrap_or_default();
            if !session::same(sent, &s.csrf) {
                tracing::info!(path, who = %s.principal.name, "console request refused: CSRF token");
                return plain(
                    StatusCode::FORBIDDEN,
                    "the form's CSRF token is missing or wrong\n",
                );
            }
        }
        let ask = Ask {
            principal: s.principal.clone(),
            csrf: s.csrf.clone(),
            fields,
        };
        if posted && path == "/ui/logout" {
            self.sessions.close(&sid);
            let mut r = redirect("/ui/login");
            if let Ok(v) = HeaderValue::from_str(&session::set_cookie("")) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            return r;
        }
        if path.starts_with("/ui/events/") && method == Method::GET {
            let Ok(permit) = self.streams.clone().try_acquire_owned() else {
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many live pages open\n",
                );
            };
            let alive = self.alive(sid, &s, cert);
            let f = |k: &str| ask.fields.get(k).cloned().unwrap_or_default();
            return match path.as_str() {
                "/ui/events/approvals" => {
                    sse::approvals(self.admin.clone(), ask.principal, alive, permit)
                }
                "/ui/events/audit" => {
                    let filters = json!({"tool": f("tool"), "principal": f("principal"), "outcome": f("outcome")});
                    // A reconnecting browser says where it got to.
                    let after = last_event_id
                        .or_else(|| f("after").parse().ok())
                        .unwrap_or(0);
                    sse::audit(
                        self.admin.clone(),
                        ask.principal,
                        filters,
                        after,
                        alive,
                        permit,
                    )
                }
                _ => plain(StatusCode::NOT_FOUND, "no such stream\n"),
            };
        }
        match (method, path.as_str()) {
            (Method::GET, "/ui" | "/ui/") => redirect("/ui/tools"),
            (Method::GET, _) => self.pages.get(self, &path, &ask).await,
            (Method::POST, _) => self.pages.post(self, &path, &ask).await,
            _ => plain(StatusCode::METHOD_NOT_ALLOWED, "GET or POST\n"),
        }
    }

    async fn login(
        &self,
        req: Request<hyper::body::Incoming>,
        cert: Option<&str>,
    ) -> Response<Body> {
        let fields = match form(req).await {
            Ok(f) => f,
            Err(r) => return r,
        };
        let token = fields
            .get("token")
            .map(|t| t.trim().to_string())
            .unwrap_or_default();
        let principal = if token.is_empty() {
            cert.map(|c| Principal::new(c, crate::call::PrincipalKind::Certificate))
        } else {
            (self.login)(token.clone()).await
        };
        let Some(principal) = principal else {
            tracing::info!("console login refused");
            return self.pages.login(Some("That token is not accepted."));
        };
        let credential = (!token.is_empty()).then_some(token);
        let Some((id, _)) = self.sessions.open(principal.clone(), credential) else {
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "no session could be made\n",
            );
        };
        self.audit(&principal, "login", &json!({}), Ok(()));
        let mut r = redirect("/ui/tools");
        if let Ok(v) = HeaderValue::from_str(&session::set_cookie(&id)) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        r
    }

    /// A live stream's check: the session still open and its credential still accepted.
    fn alive(&self, sid: String, s: &session::Session, cert: Option<&str>) -> reply::Alive {
        let (sessions, login) = (self.sessions.clone(), self.login.clone());
        let (name, credential) = (s.principal.name.clone(), s.credential.clone());
        let cert = cert.map(str::to_string);
        Arc::new(move || {
            let (sessions, login, sid) = (sessions.clone(), login.clone(), sid.clone());
            let (name, credential, cert) = (name.clone(), credential.clone(), cert.clone());
            Box::pin(async move {
                if !sessions.live(&sid) {
                    return false;
                }
                match credential {
                    Some(token) => login(token).await.is_some_and(|p| p.name == name),
                    None => cert.as_deref() == Some(name.as_str()),
                }
            })
        })
    }

    /// Whether the session's credential is still accepted as the same principal: its token
    /// (removed tokens end their sessions), or the connection's client certificate.
    async fn still_valid(&self, s: &session::Session, cert: Option<&str>) -> bool {
        match &s.credential {
            Some(token) => (self.login)(token.clone())
                .await
                .is_some_and(|p| p.name == s.principal.name),
            None => cert == Some(s.principal.name.as_str()),
        }
    }

    fn audit(&self, who: &Principal, method: &str, params: &Value, outcome: Result<(), String>) {
        let mut rec = json!({
            "ts": crate::store::now_ms(),
            "event": "console",
            "principal": who.name,
            "principalKind": who.kind.as_str(),
            "method": method,
            "params": crate::audit::bounded_params(params, 1024, 8192),
            "outcome": if outcome.is_ok() { "ok" } else { "refused" },
        });
        if let Err(e) = outcome {
            rec["error"] = json!(crate::audit::bounded_message(&e, 1024));
        }
        self.service.audit_value(&rec);
    }
}

/// A urlencoded form body, bounded.
async fn form(
    req: Request<hyper::body::Incoming>,
) -> Result<HashMap<String, String>, Response<Body>> {
    let body = match Limited::new(req.into_body(), MAX_FORM).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Err(plain(StatusCode::PAYLOAD_TOO_LARGE, "form too large\n")),
    };
    Ok(url::form_urlencoded::parse(&body).into_owned().collect())
}

#[async_trait::async_trait]
impl Door for Console {
    async fn run(
        &self,
        who: &Principal,
        tool: &str,
        args: serde_json::Map<String, Value>,
    ) -> Value {
        use std::sync::atomic::AtomicBool;
        let caller = crate::call::Caller {
            peer_uid: None,
            principal: Some(who.clone()),
            transport: "console",
            session: 0,
        };
        let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = lines.clone();
        let sink: crate::call::ConsoleSink = Box::new(move |level, line| {
            if let Ok(mut l) = kept.lock() {
                if l.len() < 200 {
                    l.push(json!({"level": level.as_str(), "line": line}));
                }
            }
        });
        let cancel = Arc::new(AtomicBool::new(false));
        let reply = self
            .service
            .call(tool, args, &caller, None, cancel, sink)
            .await;
        let console = lines.lock().map(|l| l.clone()).unwrap_or_default();
        match reply {
            Ok(r) => json!({
                "isError": r.is_error,
                "code": r.code.map(|c| c.as_str()),
                "text": r.text,
                "structured": r.structured,
                "content": r.content,
                "metrics": r.metrics,
                "console": console,
            }),
            Err(crate::call::CallFailure::UnknownTool(n)) => {
                json!({"isError": true, "text": format!("unknown tool: {n}"), "console": console})
            }
        }
    }

    /// One admin method, as `who`.
    async fn call(
        &self,
        who: &Principal,
        method: &str,
        params: Value,
    ) -> Result<Value, (i32, String)> {
        self.admin
            .handle(Subject::Principal(who.clone()), method.to_string(), params)
            .await
    }

    /// An admin method that changes something: called, then audited with the person.
    async fn act(
        &self,
        who: &Principal,
        method: &str,
        params: Value,
    ) -> Result<Value, (i32, String)> {
        let r = self.call(who, method, params.clone()).await;
        self.audit(
            who,
            method,
            &params,
            r.as_ref().map(|_| ()).map_err(|e| e.1.clone()),
        );
        r
    }

    /// Whether the policy lets `who` do `action` (buttons are shown only to those who may
    /// press them; the method checks again).
    fn may(&self, who: &Principal, action: crate::policy::Action) -> bool {
        self.service
            .permits(&Subject::Principal(who.clone()), action)
    }
}
