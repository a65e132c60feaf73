//! One connection to one upstream MCP server (rmcp client), kept up by a supervisor task:
//! connect (a stdio child from the [`Launcher`], or Streamable HTTP to `url`), initialize,
//! list the tools (all pages), re-list them on `notifications/tools/list_changed`, and
//! restart with exponential backoff when the upstream dies or the connection breaks.
//!
//! The tool list is published on a `watch` channel with a generation counter that moves only
//! when the list's content changes, so the gateway re-scores and re-publishes on change.
//!
//! [`Connection::call`] maps every failure to a stable code: not connected ->
//! UPSTREAM_UNAVAILABLE, died or broke mid-call -> UPSTREAM_LOST, an MCP error reply ->
//! UPSTREAM_ERROR, the deadline -> TIMEOUT (rmcp sends `notifications/cancelled` when the
//! call is dropped), a reply over `max_output_bytes` -> OUTPUT_LIMIT, the caller gone ->
//! CANCELLED.

pub(super) mod http;
pub mod items;
mod pipes;
mod session;
#[cfg(test)]
mod tests;

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, Tool};
use rmcp::service::{Peer, RoleClient, ServiceError};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stsd_profiles::upstream::{GatewayConfig, UpstreamConfig};
use stsd_protocol::Code;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Builds the command that starts a stdio upstream (the confined launcher in the daemon, a
/// plain command in tests). Called once per (re)start; stdin, stdout and stderr are set here.
pub type Launcher = Arc<dyn Fn() -> Result<tokio::process::Command, String> + Send + Sync>;

/// Lifecycle notices for the daemon's event log (tracing lines are written regardless).
pub type OnEvent = Arc<dyn Fn(&ConnEvent) + Send + Sync>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnEvent {
    /// Initialized and the tools listed.
    Connected { pid: Option<u32>, tools: usize },
    /// The tool list changed (after a list_changed notification or a reconnect).
    ToolsChanged { generation: u64 },
    /// The stdio child exited (status as `ExitStatus` prints it), or the connection ended.
    Exited { reason: String },
    /// The next attempt starts after `delay`.
    Restarting {
        attempt: u32,
        delay: Duration,
        error: String,
    },
}

/// How a connection is kept up.
#[derive(Clone)]
pub struct Options {
    /// Restart backoff: the first delay, doubled up to `restart_max`.
    pub restart_initial: Duration,
    pub restart_max: Duration,
    /// Once a session has been up this long, the backoff starts over.
    pub stable_after: Duration,
    /// The longest `initialize` + `tools/list` may take.
    pub connect_timeout: Duration,
    /// HTTP upstream: stsd's egress proxy, `http://127.0.0.1:PORT`.
    pub http_proxy: Option<String>,
    /// HTTP upstream: CA certificates trusted besides the bundled roots (`[egress]`).
    pub extra_ca_files: Vec<std::path::PathBuf>,
    pub events: Option<OnEvent>,
    /// The upstream's resolved secrets: masked in every stderr line that is logged.
    pub secrets: stsd_protocol::envvar::SecretSet,
    /// The tool list is listed again this often, besides on `tools/list_changed`.
    pub relist: Duration,
    /// An OAuth upstream: its authorization and credentials (see `gateway::oauth`).
    pub oauth: Option<crate::gateway::oauth::Setup>,
}

impl Options {
    pub fn from_gateway(g: &GatewayConfig) -> Options {
        Options {
            restart_initial: Duration::from_millis(g.restart_initial_ms.max(1)),
            restart_max: Duration::from_millis(g.restart_max_ms.max(g.restart_initial_ms)),
            stable_after: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(30),
            http_proxy: None,
            extra_ca_files: Vec::new(),
            events: None,
            secrets: Default::default(),
            relist: Duration::from_secs(60),
            oauth: None,
        }
    }

    /// The delay before restart `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32 << attempt.saturating_sub(1).min(20);
        self.restart_initial
            .saturating_mul(factor)
            .min(self.restart_max)
    }
}

impl Default for Options {
    fn default() -> Self {
        Options::from_gateway(&GatewayConfig::default())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnState {
    Starting,
    Ready,
    Restarting { attempt: u32, last_error: String },
    Stopped,
}

/// The last tool list, and how many times it has changed.
#[derive(Debug, Clone, Default)]
pub struct ToolList {
    /// 0 before the first list; +1 on every change.
    pub generation: u64,
    pub tools: Arc<Vec<Tool>>,
    /// Its resources, templates and prompts (listed with the tools).
    pub items: Arc<items::Items>,
}

/// One live session (one child process or one HTTP session).
struct Session {
    peer: Peer<RoleClient>,
    pid: Option<u32>,
    /// Cancelled when the session ends (the child exited, the connection closed, the pump
    /// overflowed, or the connection is stopping).
    lost: CancellationToken,
    /// Set (by the pump) when the child wrote a line over the cap.
    overflow: Arc<AtomicBool>,
    cap: usize,
    /// An OAuth upstream's credentials (a broken call may be a refused token).
    tokens: Option<Arc<crate::gateway::oauth::Tokens>>,
}

impl Session {
    fn lost_error(&self, id: &str) -> (Code, String) {
        if self.overflow.load(Ordering::SeqCst) {
            (
                Code::OutputLimit,
                format!(
                    "upstream {id} wrote a message longer than {} bytes; it is being restarted",
                    self.cap
                ),
            )
        } else {
            (
                Code::UpstreamLost,
                format!("upstream {id} died or its connection broke during the call"),
            )
        }
    }
}

/// State shared by the [`Connection`] handle and its supervisor task.
struct Shared {
    cfg: Arc<UpstreamConfig>,
    session: Mutex<Option<Arc<Session>>>,
    state: watch::Sender<ConnState>,
    tools: watch::Sender<ToolList>,
    /// `notifications/resources/updated` from the upstream: the URI.
    updates: tokio::sync::broadcast::Sender<String>,
    /// Bytes read from the children's stdout, all sessions (the flood test reads it).
    stdout_bytes: Arc<AtomicU64>,
}

impl Shared {
    fn current(&self) -> Option<Arc<Session>> {
        self.session.lock().ok().and_then(|s| s.clone())
    }

    fn set_session(&self, session: Option<Arc<Session>>) {
        if let Ok(mut slot) = self.session.lock() {
            *slot = session;
        }
    }
}

pub struct Connection {
    shared: Arc<Shared>,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Connection {
    /// Starts the supervisor task (inside a Tokio runtime) and returns at once; watch
    /// [`Connection::state_watch`] or call [`Connection::wait_ready`].
    pub fn start(
        cfg: Arc<UpstreamConfig>,
        launcher: Launcher,
        options: Options,
    ) -> Arc<Connection> {
        let shared = Arc::new(Shared {
            cfg,
            session: Mutex::new(None),
            state: watch::Sender::new(ConnState::Starting),
            tools: watch::Sender::new(ToolList::default()),
            updates: tokio::sync::broadcast::channel(64).0,
            stdout_bytes: Arc::default(),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(session::supervise(
            shared.clone(),
            launcher,
            options,
            stop.clone(),
        ));
        Arc::new(Connection {
            shared,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    pub fn id(&self) -> &str {
        &self.shared.cfg.id
    }

    pub fn config(&self) -> &Arc<UpstreamConfig> {
        &self.shared.cfg
    }

    pub fn state(&self) -> ConnState {
        self.shared.state.borrow().clone()
    }

    pub fn state_watch(&self) -> watch::Receiver<ConnState> {
        self.shared.state.subscribe()
    }

    /// The last tool list; `changed()` on the receiver wakes on every new generation.
    pub fn tools(&self) -> watch::Receiver<ToolList> {
        self.shared.tools.subscribe()
    }

    /// The stdio child's pid while a session is up.
    pub fn pid(&self) -> Option<u32> {
        self.shared.current().and_then(|s| s.pid)
    }

    /// Waits until the connection is Ready (true) or `within` passes or it stops (false).
    pub async fn wait_ready(&self, within: Duration) -> bool {
        let mut rx = self.state_watch();
        let ready = rx.wait_for(|s| matches!(s, ConnState::Ready | ConnState::Stopped));
        let ready = matches!(
            tokio::time::timeout(within, ready).await,
            Ok(Ok(s)) if *s == ConnState::Ready
        );
        ready
    }

    /// Kills the child, ends the tasks; calls in flight get UPSTREAM_LOST. Idempotent.
    pub fn stop(&self) {
        self.stop.cancel();
        if let Some(session) = self.shared.current() {
            session.lost.cancel();
        }
        self.shared.set_session(None);
        if let Ok(mut task) = self.task.lock() {
            if let Some(task) = task.take() {
                // The supervisor kills its child when it sees `stop`; aborting drops it (and
                // with it the child, kill_on_drop) if it is stuck somewhere else.
                task.abort();
            }
        }
        self.shared.state.send_replace(ConnState::Stopped);
    }

    /// Calls `tool` on the upstream. `cancel` is set by the transport when the caller went
    /// away; it is polled every 50 ms.
    pub async fn call(
        &self,
        tool: &str,
        args: serde_json::Map<String, Value>,
        timeout: Duration,
        cancel: Arc<AtomicBool>,
    ) -> Result<CallToolResult, (Code, String)> {
        let id = self.id();
        let Some(session) = self.shared.current() else {
            let why = match self.state() {
                ConnState::Restarting { last_error, .. } => {
                    format!("it is restarting after: {last_error}")
                }
                ConnState::Stopped => "it is stopped".to_owned(),
                _ => "it is starting".to_owned(),
            };
            let code = if why.contains("SANDBOX_UNAVAILABLE") {
                Code::SandboxUnavailable
            } else {
                Code::UpstreamUnavailable
            };
            return Err((code, format!("upstream {id} is not connected: {why}")));
        };
        if session.lost.is_cancelled() {
            // Ended before this call began; the supervisor has not cleared it yet.
            return Err((
                Code::UpstreamUnavailable,
                format!("upstream {id} is not connected: it is restarting"),
            ));
        }
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
        // The call's trace goes on to the upstream (SEP-414: `_meta.traceparent`).
        let carry = crate::telemetry::propagation();
        if !carry.is_empty() {
            let meta: serde_json::Map<String, Value> = carry
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            params.meta = Some(rmcp::model::RequestMetaObject(rmcp::model::MetaObject(
                meta,
            )));
        }
        // Dropping this future before the reply sends notifications/cancelled (rmcp).
        let reply = session.peer.call_tool_once(params);
        tokio::pin!(reply);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                biased;
                reply = &mut reply => return self.reply(reply, &session),
                _ = session.lost.cancelled() => return Err(session.lost_error(id)),
                _ = &mut deadline => {
                    return Err((
                        Code::Timeout,
                        format!("upstream {id}: {tool} did not answer within {} ms", timeout.as_millis()),
                    ))
                }
                _ = tick.tick() => {
                    if cancel.load(Ordering::SeqCst) {
                        return Err((Code::Cancelled, "the caller went away".to_owned()));
                    }
                }
            }
        }
    }

    fn reply(
        &self,
        reply: Result<CallToolResponse, ServiceError>,
        session: &Session,
    ) -> Result<CallToolResult, (Code, String)> {
        let id = self.id();
        let result = match reply {
            Ok(CallToolResponse::Complete(result)) => result,
            Ok(_) => {
                return Err((
                    Code::UpstreamError,
                    format!("upstream {id} answered with a task or an input request, which the gateway does not support"),
                ))
            }
            Err(e) => return Err(failed(e, session, id)),
        };
        let limit = self.shared.cfg.max_output_bytes();
        let size = serde_json::to_vec(&result).map(|v| v.len()).unwrap_or(0) as u64;
        if size > limit {
            return Err((
                Code::OutputLimit,
                format!("upstream {id}: the reply is {size} bytes, over the limit of {limit}"),
            ));
        }
        Ok(result)
    }

    /// The upstream's `notifications/resources/updated` (URIs), from now on.
    pub fn updates(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.shared.updates.subscribe()
    }

    /// `resources/read` of `uri`: the result as JSON, bounded by `max_output_bytes`.
    pub async fn read_resource(
        &self,
        uri: &str,
        timeout: Duration,
    ) -> Result<Value, (Code, String)> {
        let params = rmcp::model::ReadResourceRequestParams::new(uri);
        self.request("resources/read", timeout, move |peer| async move {
            Ok(serde_json::to_value(peer.read_resource(params).await?))
        })
        .await
    }

    /// `prompts/get` of the upstream's prompt `name`: the result as JSON, bounded.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<serde_json::Map<String, Value>>,
        timeout: Duration,
    ) -> Result<Value, (Code, String)> {
        let mut params = rmcp::model::GetPromptRequestParams::new(name);
        params.arguments = arguments;
        self.request("prompts/get", timeout, move |peer| async move {
            Ok(serde_json::to_value(peer.get_prompt(params).await?))
        })
        .await
    }

    /// `completion/complete` with `params` (its reference already the upstream's own).
    pub async fn complete(
        &self,
        params: rmcp::model::CompleteRequestParams,
        timeout: Duration,
    ) -> Result<Value, (Code, String)> {
        self.request("completion/complete", timeout, move |peer| async move {
            Ok(serde_json::to_value(peer.complete(params).await?))
        })
        .await
    }

    /// `resources/subscribe` (true) or `resources/unsubscribe` of `uri`.
    #[allow(deprecated)] // legacy-era upstream sessions subscribe this way
    pub async fn subscribe(
        &self,
        uri: &str,
        on: bool,
        timeout: Duration,
    ) -> Result<(), (Code, String)> {
        let uri = uri.to_string();
        self.request("resources/subscribe", timeout, move |peer| async move {
            if on {
                peer.subscribe(rmcp::model::SubscribeRequestParams::new(uri))
                    .await?;
            } else {
                peer.unsubscribe(rmcp::model::UnsubscribeRequestParams::new(uri))
                    .await?;
            }
            Ok(serde_json::to_value(()))
        })
        .await
        .map(|_| ())
    }

    /// One request other than a tool call on the live session: its failures classified as
    /// a call's are, its answer (JSON) bounded by `max_output_bytes`.
    async fn request<F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        send: F,
    ) -> Result<Value, (Code, String)>
    where
        F: FnOnce(Peer<RoleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<serde_json::Result<Value>, ServiceError>>,
    {
        let id = self.id();
        let Some(session) = self.shared.current() else {
            return Err((
                Code::UpstreamUnavailable,
                format!("upstream {id} is not connected"),
            ));
        };
        let reply = send(session.peer.clone());
        let reply = tokio::select! {
            r = reply => r,
            _ = session.lost.cancelled() => return Err(session.lost_error(id)),
            _ = tokio::time::sleep(timeout) => {
                return Err((
                    Code::Timeout,
                    format!("upstream {id}: {what} did not answer within {} ms", timeout.as_millis()),
                ))
            }
        };
        let value = match reply {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => return Err((Code::UpstreamError, format!("upstream {id}: {e}"))),
            Err(e) => return Err(failed(e, &session, id)),
        };
        let limit = self.shared.cfg.max_output_bytes();
        let size = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0) as u64;
        if size > limit {
            return Err((
                Code::OutputLimit,
                format!(
                    "upstream {id}: the {what} reply is {size} bytes, over the limit of {limit}"
                ),
            ));
        }
        Ok(value)
    }

    #[cfg(test)]
    fn stdout_bytes(&self) -> u64 {
        self.shared.stdout_bytes.load(Ordering::Relaxed)
    }
}

/// A request's failure, classified: an MCP error reply is UPSTREAM_ERROR; a broken
/// connection ends the session (so the supervisor reconnects: an HTTP session has no child
/// whose exit would tell it) and is UPSTREAM_LOST (or OUTPUT_LIMIT after a flood).
fn failed(e: ServiceError, session: &Session, id: &str) -> (Code, String) {
    match e {
        ServiceError::McpError(e) => (Code::UpstreamError, format!("upstream {id}: {}", e.message)),
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => {
            let refused = match &e {
                ServiceError::TransportSend(t) => auth_refused(t),
                _ => false,
            };
            session.lost.cancel();
            match &session.tokens {
                Some(t) if refused || !t.signed_in() => (
                    Code::UpstreamUnavailable,
                    format!(
                        "upstream {id} refused stsd's OAuth credentials (revoked or expired); {}",
                        crate::gateway::oauth::login_hint(id)
                    ),
                ),
                _ => session.lost_error(id),
            }
        }
        e => (Code::UpstreamError, format!("upstream {id}: {e}")),
    }
}

/// Whether the server's 401 is somewhere in `e`'s chain (rmcp tried one refresh first).
fn auth_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<rmcp::transport::streamable_http_client::AuthRequiredError>() {
            return true;
        }
        next = e.source();
    }
    false
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.stop();
    }
}
