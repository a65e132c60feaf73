//! MCP over rmcp, in both protocol eras (2026-07-28 stateless, 2025-11-25 with `initialize`):
//! `tools/list` serves the ACTIVE specs in a stable order; `tools/call` checks arguments before
//! any worker is touched, reports tool failures as `isError` results carrying the error code,
//! streams console lines as `notifications/message` on the call's own stream, and cancels the
//! call (its worker is killed) when the caller goes away.
#![allow(deprecated)] // MCP logging notifications are deprecated (SEP-2577) but still the way

use crate::approval::mcp::{McpElicitor, StateBook};
use crate::approval::{Elicited, Elicitor};
use crate::call::{CallFailure, Caller};
use crate::service::Service;
use crate::transport::{Activity, AdminHandler, Limits, Outbox, SessionTransport};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, LoggingLevel, LoggingMessageNotificationParam, MetaObject,
    PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    SetLevelRequestParams, SubscriptionFilter, Tool,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stsd_profiles::approval::StrategyKind;
use stsd_protocol::frames::ConsoleLevel;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// A call's trace span (none when traces are off); the request's `_meta.traceparent` is its
/// parent.
fn trace_span(name: &str, caller: &Caller, ctx: &RequestContext<RoleServer>) -> tracing::Span {
    if !crate::telemetry::enabled() {
        return tracing::Span::none();
    }
    let meta = serde_json::to_value(&ctx.meta).unwrap_or(Value::Null);
    crate::telemetry::call_span(name, &caller.principal_key(), caller.transport, Some(&meta))
}

/// Per-connection facts.
struct Conn {
    caller: Caller,
    /// Cancelled when the session ends (input closed, a write failed, evicted, timed out):
    /// in-flight calls stop at once.
    closed: CancellationToken,
    /// Legacy `logging/setLevel` (the modern era carries a level per request).
    log_level: Mutex<LoggingLevel>,
    /// HTTP: the principal a legacy session belongs to (its first authenticated request);
    /// another principal presenting the session id is refused.
    session_principal: std::sync::OnceLock<String>,
    /// Resources this session subscribed to (upstreams' resources).
    subscriptions: Arc<crate::mcp_items::Subscriptions>,
}

#[derive(Clone)]
pub struct Handler {
    service: Arc<Service>,
    changed: broadcast::Sender<()>,
    conn: Arc<Conn>,
    /// Serve 2026-07-28 only (HTTP with `legacy_sessions = false`): an `initialize` for an
    /// older version is refused, never served without a session.
    modern_only: bool,
}

fn rank(l: LoggingLevel) -> u8 {
    match l {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

fn level_of(c: ConsoleLevel) -> LoggingLevel {
    match c {
        ConsoleLevel::Debug => LoggingLevel::Debug,
        ConsoleLevel::Log | ConsoleLevel::Info => LoggingLevel::Info,
        ConsoleLevel::Warn => LoggingLevel::Warning,
        ConsoleLevel::Error => LoggingLevel::Error,
    }
}

impl Handler {
    /// A handler for one session; `closed` ends it (the connection registry holds it too).
    pub fn new(
        service: Arc<Service>,
        changed: broadcast::Sender<()>,
        peer_uid: Option<u32>,
        transport: &'static str,
        closed: CancellationToken,
    ) -> Handler {
        static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);
        Handler {
            service,
            changed,
            modern_only: false,
            conn: Arc::new(Conn {
                caller: Caller {
                    peer_uid,
                    principal: None,
                    transport,
                    session: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
                },
                closed,
                log_level: Mutex::new(LoggingLevel::Info),
                session_principal: std::sync::OnceLock::new(),
                subscriptions: Arc::default(),
            }),
        }
    }

    /// This handler serves the 2026-07-28 era only.
    pub fn modern_only(mut self) -> Handler {
        self.modern_only = true;
        self
    }

    /// Sends one console line as `notifications/message` on the request's own stream.
    async fn console_line(
        &self,
        ctx: &RequestContext<RoleServer>,
        tool: &str,
        level: ConsoleLevel,
        line: String,
    ) {
        let lvl = level_of(level);
        if self.wants(ctx, lvl) {
            let p = LoggingMessageNotificationParam::new(lvl, json!(line))
                .with_logger(tool.to_string());
            let _ = ctx.peer.notify_logging_message(p).await;
        }
    }

    /// Whether a console line at `level` may go to this request's stream: in 2026-07-28 only
    /// when the request asked for logs; in legacy sessions at or above `logging/setLevel`.
    fn wants(&self, ctx: &RequestContext<RoleServer>, level: LoggingLevel) -> bool {
        let modern = ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        if modern {
            ctx.meta
                .log_level()
                .is_some_and(|min| rank(level) >= rank(min))
        } else {
            let min = *self
                .conn
                .log_level
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            rank(level) >= rank(min)
        }
    }
}

/// A stable admission session per HTTP principal for stateless requests, so a principal's
/// calls are bounded together (`max_calls_per_session`) and slots go round-robin across
/// principals, as they do across socket sessions.
fn principal_session(name: &str) -> u64 {
    static SESSIONS: std::sync::OnceLock<Mutex<std::collections::HashMap<String, u64>>> =
        std::sync::OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(1 << 62);
    let map = SESSIONS.get_or_init(Default::default);
    let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
    *m.entry(name.to_string())
        .or_insert_with(|| NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Set when a call is refused RATE_LIMITED, for a transport that can say so itself: the HTTP
/// transport puts one in each request's extensions and answers 429 with `Retry-After` when
/// the reply was ready before the response started (a stateless request).
#[derive(Debug, Clone, Default)]
pub struct Backoff(Arc<std::sync::OnceLock<u64>>);

impl Backoff {
    /// The wait, in milliseconds, before a retry may pass.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.0.get().copied()
    }
}

/// The principal an HTTP transport authenticated for this request, if any.
fn request_principal(ctx: &RequestContext<RoleServer>) -> Option<crate::call::Principal> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|p| p.extensions.get::<crate::call::Principal>())
        .cloned()
}

impl Handler {
    /// Who makes this request: the connection's caller, with the HTTP principal of the
    /// request when there is one. A legacy HTTP session stays with its first principal.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Caller, ErrorData> {
        let mut caller = self.conn.caller.clone();
        let Some(principal) = request_principal(ctx) else {
            return Ok(caller);
        };
        let name = principal.name.clone();
        let modern = ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        if !modern {
            let owner = self.conn.session_principal.get_or_init(|| name.clone());
            if *owner != name {
                return Err(ErrorData::invalid_request(
                    "this session belongs to another principal",
                    None,
                ));
            }
        } else {
            caller.session = principal_session(&name);
        }
        caller.principal = Some(principal);
        Ok(caller)
    }
}

impl Handler {
    /// The elicitor for a call whose tool asks the caller for approval, or the first round of
    /// a 2026-07-28 call (Err: `input_required` goes back at once, nothing runs).
    fn elicitor_for(
        &self,
        name: &str,
        args: &JsonObject,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
        caller: &Caller,
    ) -> Result<Option<McpElicitor>, Box<CallToolResponse>> {
        let Some(approval) = self.service.approval_of(name) else {
            return Ok(None);
        };
        if !approval.required || approval.strategy != StrategyKind::Elicit {
            return Ok(None);
        }
        let client = ctx
            .client_info()
            .map(|i| format!("{} {}", i.name, i.version))
            .unwrap_or_else(|| "(unnamed)".into());
        let can_elicit = ctx
            .client_capabilities()
            .is_some_and(|c| c.elicitation.is_some());
        if !can_elicit {
            return Ok(Some(McpElicitor::Unsupported { client }));
        }
        let modern = ctx
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        if !modern {
            return Ok(Some(McpElicitor::Session {
                peer: ctx.peer.clone(),
                client,
            }));
        }
        let book = states(&self.service);
        let who = crate::approval::mcp::StateOwner::of(caller);
        match &request.request_state {
            Some(state) => {
                let responses: Option<std::collections::HashMap<String, Value>> = request
                    .input_responses
                    .as_ref()
                    .map(|r| r.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
                let answer = match book {
                    Ok(b) => b.redeem(&who, name, args, state, responses.as_ref()),
                    Err(e) => Elicited::Failed(e.clone()),
                };
                Ok(Some(McpElicitor::Answered { client, answer }))
            }
            None => {
                let message = self
                    .service
                    .approval_prompt_for(name, args)
                    .unwrap_or_default();
                let made = book
                    .map_err(|e| e.clone())
                    .and_then(|b| b.input_required(&who, name, args, message));
                match made {
                    Ok(r) => Err(Box::new(CallToolResponse::InputRequired(r))),
                    Err(e) => Ok(Some(McpElicitor::Answered {
                        client,
                        answer: Elicited::Failed(e),
                    })),
                }
            }
        }
    }
}

/// The process's approval-state book: its key from `[approval] state_key_file` or
/// `STSD_APPROVAL_STATE_KEY` (shared by replicas), else made once, at first use.
fn states(service: &Service) -> Result<&'static StateBook, &'static String> {
    static BOOK: std::sync::OnceLock<Result<StateBook, String>> = std::sync::OnceLock::new();
    BOOK.get_or_init(|| {
        let approval = service.config().approval.clone();
        let ttl = Duration::from_secs(approval.timeout_seconds);
        match crate::approval::mcp::configured_key(&approval)? {
            Some(key) => StateBook::with_key(key, ttl),
            None => StateBook::new(ttl),
        }
        .map(|b| b.with_store(service.store()))
    })
    .as_ref()
}

impl ServerHandler for Handler {
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        if self.modern_only {
            std::borrow::Cow::Owned(vec![ProtocolVersion::V_2026_07_28])
        } else {
            std::borrow::Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
        }
    }

    /// A legacy HTTP session belongs to the principal that opened it: bound here, at
    /// `initialize`, not at its first `tools/call` (a principal holding another's
    /// `Mcp-Session-Id` could take the session over before its owner called a tool, and
    /// lock the owner out).
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        if let Some(p) = request_principal(&ctx) {
            let _ = self.conn.session_principal.set(p.name);
        }
        ctx.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_logging()
                .enable_tools()
                .enable_tool_list_changed()
                .enable_resources()
                .enable_resources_list_changed()
                .enable_resources_subscribe()
                .enable_prompts()
                .enable_prompts_list_changed()
                .enable_completions()
                .build(),
        )
        .with_server_info(Implementation::new("stsd", env!("CARGO_PKG_VERSION")))
        .with_instructions("Tools run by stsd in sandboxed worker processes.")
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let caller = self.caller(&ctx)?;
        let cursor = request.as_ref().and_then(|r| r.cursor.as_deref());
        let size = self.service.config().daemon.list_page_size;
        let page = self
            .service
            .listing()
            .page(&crate::policy::Who::of_caller(&caller), cursor, size)
            .map_err(|e| ErrorData::invalid_params(e, None))?;
        let mut result = ListToolsResult::with_all_items(page.tools);
        result.next_cursor = page.next_cursor;
        Ok(result)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.service.listing().get(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let args = request.arguments.clone().unwrap_or_default();
        let caller = self.caller(&ctx)?;
        let elicitor = match self.elicitor_for(&name, &args, &request, &ctx, &caller) {
            Ok(e) => e,
            Err(first_round) => return Ok(*first_round),
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(ConsoleLevel, String)>();
        let sink = Box::new(move |level, line| {
            let _ = tx.send((level, line));
        });
        // Console lines go out as they happen, on this request's own stream, beside the call
        // in this task: a client that stops reading (or is gone) must not hold the call, whose
        // outcome is audited whatever becomes of the session. (A task of their own, and one
        // to watch for the caller going away, woke another runtime thread on every call.)
        // A caller that sets `_meta["stsd/console"]: true` also gets the call's console lines
        // in the result's `_meta` (already masked, and bounded by the console caps).
        let keep_console = ctx.meta.0.get("stsd/console") == Some(&json!(true));
        let forwarder = async {
            let mut kept = Vec::new();
            while let Some((level, line)) = rx.recv().await {
                if keep_console {
                    kept.push(json!({"level": level_of(level), "line": line}));
                }
                tokio::select! {
                    _ = self.console_line(&ctx, &name, level, line) => {}
                    _ = self.conn.closed.cancelled() => return kept,
                }
            }
            kept
        };
        // The caller going away (notifications/cancelled, or the connection closing) kills
        // the call's worker.
        let gone = async {
            tokio::select! {
                _ = ctx.ct.cancelled() => {}
                _ = self.conn.closed.cancelled() => {}
            }
        };
        let flag = cancel.clone();
        let call = tracing::Instrument::instrument(
            crate::service::raise_on(
                gone,
                &flag,
                self.service.call(
                    &name,
                    args,
                    &caller,
                    elicitor.as_ref().map(|e| e as &dyn Elicitor),
                    cancel,
                    sink,
                ),
            ),
            trace_span(&name, &caller, &ctx),
        );
        // The sink is gone with the call, so the forwarder ends once the lines that raced the
        // result are out: they precede it, in order.
        let (result, console_lines) = tokio::join!(call, forwarder);
        match result {
            Err(CallFailure::UnknownTool(n)) => Err(ErrorData::invalid_params(
                format!("unknown tool: {n}"),
                Some(json!({"tool": n})),
            )),
            Ok(reply) => {
                let content = match &reply.content {
                    // An upstream's blocks as it sent them (masked); one that does not read
                    // back as a content block is given as its JSON text.
                    Some(blocks) => blocks
                        .iter()
                        .map(|b| {
                            serde_json::from_value(b.clone())
                                .unwrap_or_else(|_| ContentBlock::text(b.to_string()))
                        })
                        .collect(),
                    None => vec![ContentBlock::text(reply.text)],
                };
                let mut r = if reply.is_error {
                    CallToolResult::error(content)
                } else {
                    CallToolResult::success(content)
                };
                if let Some(s) = reply.structured {
                    r.structured_content = Some(s);
                }
                let mut meta = MetaObject::new();
                if let Some(code) = reply.code {
                    meta.0.insert("stsd/errorCode".into(), json!(code.as_str()));
                }
                if let Some(m) = reply.metrics {
                    meta.0.insert("stsd/metrics".into(), json!(m));
                }
                if let Some(ms) = reply.retry_after_ms {
                    meta.0.insert("stsd/retryAfterMs".into(), json!(ms));
                    if let Some(b) = ctx
                        .extensions
                        .get::<http::request::Parts>()
                        .and_then(|p| p.extensions.get::<Backoff>())
                    {
                        let _ = b.0.set(ms);
                    }
                }
                if keep_console {
                    meta.0
                        .insert("stsd/console".into(), Value::Array(console_lines));
                }
                if !meta.0.is_empty() {
                    r.meta = Some(meta);
                }
                Ok(r.into())
            }
        }
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        *self
            .conn
            .log_level
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = request.level;
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourcesResult, ErrorData> {
        self.caller(&ctx)?;
        Ok(crate::mcp_items::resources(&self.service))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListResourceTemplatesResult, ErrorData> {
        self.caller(&ctx)?;
        Ok(crate::mcp_items::templates(&self.service))
    }

    async fn read_resource(
        &self,
        request: rmcp::model::ReadResourceRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ReadResourceResponse, ErrorData> {
        let caller = self.caller(&ctx)?;
        crate::mcp_items::read(&self.service, &caller, request)
            .await
            .map(Into::into)
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListPromptsResult, ErrorData> {
        self.caller(&ctx)?;
        Ok(crate::mcp_items::prompts(&self.service))
    }

    async fn get_prompt(
        &self,
        request: rmcp::model::GetPromptRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::GetPromptResponse, ErrorData> {
        let caller = self.caller(&ctx)?;
        crate::mcp_items::prompt(&self.service, &caller, request)
            .await
            .map(Into::into)
    }

    async fn complete(
        &self,
        request: rmcp::model::CompleteRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CompleteResult, ErrorData> {
        let caller = self.caller(&ctx)?;
        crate::mcp_items::complete(&self.service, &caller, request).await
    }

    /// Legacy sessions only: a subscription lives as long as its session, and 2026-07-28
    /// requests have none (they listen with `subscriptions/listen`).
    async fn subscribe(
        &self,
        request: rmcp::model::SubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&ctx)?;
        if ctx.peer.peer_info().is_none() {
            return Err(ErrorData::invalid_request(
                "resources/subscribe needs a session (initialize, MCP 2025-11-25)",
                None,
            ));
        }
        self.conn
            .subscriptions
            .subscribe(&self.service, &caller, request.uri, true)
            .await
    }

    async fn unsubscribe(
        &self,
        request: rmcp::model::UnsubscribeRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = self.caller(&ctx)?;
        self.conn
            .subscriptions
            .subscribe(&self.service, &caller, request.uri, false)
            .await
    }

    /// Legacy sessions: list changes go straight to this peer.
    async fn on_initialized(&self, ctx: NotificationContext<RoleServer>) {
        crate::mcp_items::forward(
            self.service.clone(),
            ctx.peer.clone(),
            self.conn.subscriptions.clone(),
            self.conn.closed.clone(),
        );
        let mut rx = self.changed.subscribe();
        let (peer, closed) = (ctx.peer.clone(), self.conn.closed.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = closed.cancelled() => break,
                    r = rx.recv() => match r {
                        Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => {
                            if peer.notify_tool_list_changed().await.is_err() { break; }
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    }
                }
            }
        });
    }

    /// 2026-07-28: list changes reach clients that opened `subscriptions/listen`.
    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, sub: SubscriptionContext) -> Result<(), ErrorData> {
        let mut rx = self.changed.subscribe();
        loop {
            tokio::select! {
                _ = sub.cancelled() => break,
                _ = self.conn.closed.cancelled() => break,
                r = rx.recv() => match r {
                    Ok(()) | Err(broadcast::error::RecvError::Lagged(_)) => {
                        if sub.accepted().tools_list_changed == Some(true)
                            && sub.sink().notify_tool_list_changed().await.is_err()
                        {
                            break;
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        }
        Ok(())
    }
}

/// How long queued replies may take to reach a client once its session is over.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// Serves one MCP session over a byte stream until it ends: framing, protocol errors,
/// backpressure and idle timeouts are the session transport's; the handler sees messages.
pub async fn serve<R, W>(
    handler: Handler,
    read: R,
    write: W,
    limits: Limits,
    activity: Arc<Activity>,
    admin: Option<Arc<dyn AdminHandler>>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let closed = handler.conn.closed.clone();
    let (out, writer) = Outbox::start(write, closed.clone());
    let mut transport = SessionTransport::new(read, out.clone(), closed.clone(), limits, activity);
    if let (Some(admin), Some(uid)) = (admin, handler.conn.caller.peer_uid) {
        transport = transport.with_admin(admin, uid);
    }
    // Boxed: rmcp's initialization is a future of some 40 KiB, and held inline it would size
    // this session's task (an idle session's memory) for its whole life; boxed, it is freed
    // once the session is initialised (an idle connection 87 -> ~45 KiB, heaptrack).
    match Box::pin(handler.serve(transport)).await {
        Ok(running) => {
            let _ = running.waiting().await;
        }
        Err(e) => tracing::debug!(error = %e, "MCP session ended before it started"),
    }
    closed.cancel();
    writer.finish(out, FLUSH_GRACE).await;
    crate::transport::release_memory();
}
