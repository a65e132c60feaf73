//! The supervisor task: one session after another, with backoff in between.

use super::{http, pipes, ConnEvent, ConnState, Launcher, Options, Session, Shared, ToolList};
use rmcp::model::{
    ClientCapabilities, ClientConfig, Implementation, PaginatedRequestParams, ProtocolVersion, Tool,
};
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::ClientHandler;
use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::DuplexStream;
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Lines (JSON-RPC messages) may exceed the reply limit by this much: the envelope around
/// a result that is itself within the limit.
const LINE_SLACK: u64 = 64 * 1024;
/// A tool list longer than this (pages or tools) is refused: a hostile server could page
/// forever. (A stsd upstream pages 100 tools: its 10,000 tools are 100 pages.)
const MAX_PAGES: usize = 1_000;
const MAX_TOOLS: usize = 10_000;

/// The rmcp client handler: wakes the supervisor on a list change (tools, resources,
/// prompts), and passes a subscribed resource's update on.
struct Handler {
    changed: Arc<Notify>,
    id: Arc<str>,
    updates: tokio::sync::broadcast::Sender<String>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        tracing::debug!(upstream = &*self.id, "upstream tools/list_changed");
        self.changed.notify_one();
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        tracing::debug!(upstream = &*self.id, "upstream resources/list_changed");
        self.changed.notify_one();
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        tracing::debug!(upstream = &*self.id, "upstream prompts/list_changed");
        self.changed.notify_one();
    }

    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let _ = self.updates.send(params.uri);
    }

    fn get_info(&self) -> ClientConfig {
        // The legacy initialize handshake: on it, list_changed notifications arrive on the
        // connection (2026-07-28 moves them to subscriptions/listen streams).
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("stsd", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }
}

/// How a session ended.
struct Ended {
    /// How long it was Ready (zero if it never got there).
    up_for: Duration,
    error: String,
}

pub(super) async fn supervise(
    shared: Arc<Shared>,
    launcher: Launcher,
    opts: Options,
    stop: CancellationToken,
) {
    let id: Arc<str> = shared.cfg.id.as_str().into();
    let mut attempt = 0u32;
    loop {
        let ended = tokio::select! {
            ended = run_session(&shared, &launcher, &opts, &id) => ended,
            _ = stop.cancelled() => break,
        };
        shared.set_session(None);
        if stop.is_cancelled() {
            break;
        }
        if ended.up_for >= opts.stable_after {
            attempt = 0;
        }
        attempt = attempt.saturating_add(1);
        let delay = opts.backoff(attempt);
        tracing::warn!(
            upstream = &*id,
            attempt,
            delay_ms = delay.as_millis() as u64,
            error = %ended.error,
            "upstream restarting"
        );
        emit(
            &opts,
            &ConnEvent::Restarting {
                attempt,
                delay,
                error: ended.error.clone(),
            },
        );
        shared.state.send_replace(ConnState::Restarting {
            attempt,
            last_error: ended.error,
        });
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => break,
        }
    }
    shared.set_session(None);
    shared.state.send_replace(ConnState::Stopped);
}

fn emit(opts: &Options, event: &ConnEvent) {
    if let Some(events) = &opts.events {
        events(event);
    }
}

async fn run_session(shared: &Shared, launcher: &Launcher, opts: &Options, id: &Arc<str>) -> Ended {
    let result = match shared.cfg.url.as_deref() {
        Some(url) => http_session(shared, url, opts, id).await,
        None => stdio_session(shared, launcher, opts, id).await,
    };
    match result {
        Ok(ended) => ended,
        Err(error) => Ended {
            up_for: Duration::ZERO,
            error,
        },
    }
}

/// The child, killed (with its process group, see `pipes::kill`) however the session ends.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        pipes::kill(&mut self.0);
    }
}

/// Aborts a helper task when the session ends.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn cap(shared: &Shared) -> usize {
    usize::try_from(shared.cfg.max_output_bytes().saturating_add(LINE_SLACK)).unwrap_or(usize::MAX)
}

/// The stdio child with the tasks on its pipes. The fields drop in this order: the stdout
/// pump and the stderr logger are aborted, then the child is killed.
struct Proc {
    pump: AbortOnDrop<pipes::PumpEnd>,
    _stderr: AbortOnDrop<()>,
    child: ChildGuard,
}

/// A child just started: its stdin and stdout for the session, its stderr being logged.
struct Spawned {
    child: ChildGuard,
    pid: Option<u32>,
    stdin: ChildStdin,
    stdout: ChildStdout,
    stderr: AbortOnDrop<()>,
}

/// One session with a stdio upstream: start the child, initialize over its pipes, list its
/// tools, serve until it goes, then say why it went.
async fn stdio_session(
    shared: &Shared,
    launcher: &Launcher,
    opts: &Options,
    id: &Arc<str>,
) -> Result<Ended, String> {
    let Spawned {
        child,
        pid,
        stdin,
        stdout,
        stderr,
    } = spawn(launcher, opts, id)?;
    let cap = cap(shared);
    let overflow = Arc::new(AtomicBool::new(false));
    let (rmcp_read, pump) = start_pump(stdout, cap, &overflow, shared);
    let mut proc = Proc {
        pump,
        _stderr: stderr,
        child,
    };
    let transport =
        AsyncRwTransport::<RoleClient, _, _>::new(rmcp_read, stdin).with_max_line_length(cap);
    let changed = Arc::new(Notify::new());
    let handler = Handler {
        changed: changed.clone(),
        id: id.clone(),
        updates: shared.updates.clone(),
    };
    let ct = CancellationToken::new();
    let _cancel = ct.clone().drop_guard();
    let connecting = connect(handler, transport, ct.clone(), opts);
    let running = initialize(&mut proc.child, connecting, &overflow, cap).await?;
    let session = Arc::new(Session {
        peer: running.peer().clone(),
        pid,
        lost: CancellationToken::new(),
        overflow,
        cap,
        tokens: None,
    });
    let tools = list_tools(&session.peer, opts).await?;
    let ready_at = ready(shared, &session, tools, opts, id);
    let quit = running.waiting();
    tokio::pin!(quit);
    let reason = serve_stdio(shared, &session, &mut proc, quit, &changed, opts, id).await;
    session.lost.cancel();
    shared.set_session(None);
    let reason = settle_exit(&mut proc.child, reason).await;
    tracing::warn!(upstream = &**id, pid, reason = %reason, "upstream exited");
    emit(
        opts,
        &ConnEvent::Exited {
            reason: reason.clone(),
        },
    );
    Ok(Ended {
        up_for: ready_at.elapsed(),
        error: reason,
    })
}

/// Starts the child with its three pipes, and logs its stderr.
fn spawn(launcher: &Launcher, opts: &Options, id: &Arc<str>) -> Result<Spawned, String> {
    let mut cmd = launcher()?;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = ChildGuard(pipes::spawn_kept(cmd).map_err(|e| format!("cannot start: {e}"))?);
    let pid = child.0.id();
    let (Some(stdin), Some(stdout), Some(stderr)) = (
        child.0.stdin.take(),
        child.0.stdout.take(),
        child.0.stderr.take(),
    ) else {
        return Err("cannot start: no pipes".to_owned());
    };
    tracing::info!(upstream = &**id, pid, "upstream started");
    let stderr = AbortOnDrop(tokio::spawn(pipes::log_stderr(
        stderr,
        id.clone(),
        opts.secrets.clone(),
    )));
    Ok(Spawned {
        child,
        pid,
        stdin,
        stdout,
        stderr,
    })
}

/// Pumps the child's stdout, lines capped at `cap`, into the stream rmcp reads; a line over
/// the cap sets `overflow` before that stream ends.
fn start_pump(
    stdout: ChildStdout,
    cap: usize,
    overflow: &Arc<AtomicBool>,
    shared: &Shared,
) -> (DuplexStream, AbortOnDrop<pipes::PumpEnd>) {
    let (rmcp_read, pump_write) = tokio::io::duplex(64 * 1024);
    let pump = AbortOnDrop(tokio::spawn({
        let (overflow, read) = (overflow.clone(), shared.stdout_bytes.clone());
        async move {
            let mut pump_write = pump_write;
            let end = pipes::pump(stdout, &mut pump_write, cap, read).await;
            // Before the write half drops, so a call that sees the stream end reads the flag
            // (the pump borrows the write half for that reason).
            if end == pipes::PumpEnd::Overflow {
                overflow.store(true, Ordering::SeqCst);
            }
            drop(pump_write);
            end
        }
    }));
    (rmcp_read, pump)
}

/// `initialize` (the `connecting` future), raced against the child's exit; a failure says
/// why in the child's terms where it can (an overflow, the exit status).
async fn initialize(
    child: &mut ChildGuard,
    connecting: impl Future<Output = Result<RunningService<RoleClient, Handler>, String>>,
    overflow: &AtomicBool,
    cap: usize,
) -> Result<RunningService<RoleClient, Handler>, String> {
    let running = tokio::select! {
        r = connecting => r,
        status = child.0.wait() => Err(match status {
            Ok(s) => exit_reason("exited during initialize", s),
            Err(e) => format!("lost during initialize: {e}"),
        }),
    };
    match running {
        Ok(r) => Ok(r),
        Err(e) if overflow.load(Ordering::SeqCst) => Err(format!(
            "wrote a message longer than {cap} bytes during initialize ({e})"
        )),
        Err(e) if e.starts_with("SANDBOX_UNAVAILABLE") => Err(e),
        Err(e) => {
            // The session may have noticed the closed pipe before the exit: the exit status
            // says more (a confinement that failed, above all).
            match tokio::time::timeout(Duration::from_millis(500), child.0.wait()).await {
                Ok(Ok(s)) => Err(exit_reason(&e, s)),
                _ => Err(e),
            }
        }
    }
}

/// Serves the session until the child exits, its stdout closes or floods, the MCP session
/// ends or the connection breaks, refreshing the tool list when told and on a timer;
/// returns why it ended.
async fn serve_stdio<Q: Future>(
    shared: &Shared,
    session: &Session,
    proc: &mut Proc,
    mut quit: Pin<&mut Q>,
    changed: &Notify,
    opts: &Options,
    id: &Arc<str>,
) -> String {
    let cap = session.cap;
    let mut relist =
        tokio::time::interval_at(tokio::time::Instant::now() + opts.relist, opts.relist);
    relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            status = proc.child.0.wait() => break match status {
                Ok(s) => format!("exited: {s}"),
                Err(e) => format!("lost: {e}"),
            },
            end = &mut proc.pump.0 => {
                if matches!(end, Ok(pipes::PumpEnd::Overflow)) {
                    session.lost.cancel();
                    pipes::kill(&mut proc.child.0);
                    break format!("wrote a message longer than {cap} bytes (output flood); killed");
                }
                break "closed its stdout".to_owned();
            }
            _ = &mut quit => break "the MCP session ended".to_owned(),
            _ = session.lost.cancelled() => break "the connection broke".to_owned(),
            _ = changed.notified() => refresh(shared, &session.peer, opts, id).await,
            // A redefinition the upstream does not announce is still caught.
            _ = relist.tick() => refresh(shared, &session.peer, opts, id).await,
        }
    }
}

/// Prefers the exit status to "closed its stdout" when the child is going anyway; a child
/// that is not going is killed.
async fn settle_exit(child: &mut ChildGuard, reason: String) -> String {
    if reason.starts_with("exited") {
        return reason;
    }
    if let Ok(Ok(status)) = tokio::time::timeout(Duration::from_millis(500), child.0.wait()).await {
        exit_reason(&reason, status)
    } else {
        pipes::kill(&mut child.0);
        let _ = tokio::time::timeout(Duration::from_secs(2), child.0.wait()).await;
        reason
    }
}

async fn http_session(
    shared: &Shared,
    url: &str,
    opts: &Options,
    id: &Arc<str>,
) -> Result<Ended, String> {
    match &opts.oauth {
        Some(setup) => {
            let manager = crate::gateway::oauth::connect(setup).await?;
            let transport = http::oauth_transport(&shared.cfg, url, opts, cap(shared), manager)?;
            http_serve(shared, transport, opts, id).await
        }
        None => {
            let transport = http::transport(&shared.cfg, url, opts, cap(shared))?;
            http_serve(shared, transport, opts, id).await
        }
    }
}

/// Serves an HTTP session until it ends; returns why.
async fn http_serve<T, E, A>(
    shared: &Shared,
    transport: T,
    opts: &Options,
    id: &Arc<str>,
) -> Result<Ended, String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let changed = Arc::new(Notify::new());
    let handler = Handler {
        changed: changed.clone(),
        id: id.clone(),
        updates: shared.updates.clone(),
    };
    let ct = CancellationToken::new();
    let _cancel = ct.clone().drop_guard();
    let running = connect(handler, transport, ct, opts).await?;
    let session = Arc::new(Session {
        peer: running.peer().clone(),
        pid: None,
        lost: CancellationToken::new(),
        overflow: Arc::default(),
        cap: cap(shared),
        tokens: opts.oauth.as_ref().map(|o| o.tokens.clone()),
    });
    let tools = list_tools(&session.peer, opts).await?;
    let ready_at = ready(shared, &session, tools, opts, id);
    let quit = running.waiting();
    tokio::pin!(quit);
    let mut relist =
        tokio::time::interval_at(tokio::time::Instant::now() + opts.relist, opts.relist);
    relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let reason = loop {
        tokio::select! {
            _ = &mut quit => break "the HTTP session ended",
            _ = session.lost.cancelled() => break "the HTTP connection broke",
            _ = changed.notified() => refresh(shared, &session.peer, opts, id).await,
            // A redefinition the upstream does not announce is still caught.
            _ = relist.tick() => refresh(shared, &session.peer, opts, id).await,
        }
    }
    .to_owned();
    session.lost.cancel();
    shared.set_session(None);
    tracing::warn!(upstream = &**id, reason = %reason, "upstream disconnected");
    emit(
        opts,
        &ConnEvent::Exited {
            reason: reason.clone(),
        },
    );
    Ok(Ended {
        up_for: ready_at.elapsed(),
        error: reason,
    })
}

/// `initialize`, bounded by the connect timeout.
async fn connect<T, E, A>(
    handler: Handler,
    transport: T,
    ct: CancellationToken,
    opts: &Options,
) -> Result<RunningService<RoleClient, Handler>, String>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    match tokio::time::timeout(
        opts.connect_timeout,
        rmcp::service::serve_client_with_ct(handler, transport, ct),
    )
    .await
    {
        Ok(Ok(running)) => Ok(running),
        Ok(Err(e)) => Err(format!("initialize failed: {e}")),
        Err(_) => Err(format!(
            "initialize did not finish within {} ms",
            opts.connect_timeout.as_millis()
        )),
    }
}

/// The tools, then what else the upstream offers (a failure there is logged and it is
/// served without them).
async fn list_tools(peer: &Peer<RoleClient>, opts: &Options) -> Result<Listing, String> {
    let tools = list_tool_pages(peer, opts).await?;
    let items = super::items::list(peer, opts).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "upstream resources and prompts not listed");
        Default::default()
    });
    Ok(Listing { tools, items })
}

/// A tool list and the items beside it.
struct Listing {
    tools: Vec<Tool>,
    items: super::items::Items,
}

/// All pages of tools/list, bounded in pages, tools and time.
async fn list_tool_pages(peer: &Peer<RoleClient>, opts: &Options) -> Result<Vec<Tool>, String> {
    let all = async {
        let mut tools = Vec::new();
        let mut cursor = None;
        for _ in 0..MAX_PAGES {
            let page = peer
                .list_tools(Some(PaginatedRequestParams::default().with_cursor(cursor)))
                .await
                .map_err(|e| format!("tools/list failed: {e}"))?;
            tools.extend(page.tools);
            if tools.len() > MAX_TOOLS {
                return Err(format!("tools/list: more than {MAX_TOOLS} tools"));
            }
            cursor = page.next_cursor;
            if cursor.is_none() {
                return Ok(tools);
            }
        }
        Err(format!("tools/list: more than {MAX_PAGES} pages"))
    };
    tokio::time::timeout(opts.connect_timeout, all)
        .await
        .map_err(|_| {
            format!(
                "tools/list did not finish within {} ms",
                opts.connect_timeout.as_millis()
            )
        })?
}

/// Publishes the session and its tools; returns when it became Ready.
fn ready(
    shared: &Shared,
    session: &Arc<Session>,
    tools: Listing,
    opts: &Options,
    id: &str,
) -> Instant {
    let count = tools.tools.len();
    publish(shared, tools, opts, id);
    shared.set_session(Some(session.clone()));
    shared.state.send_replace(ConnState::Ready);
    tracing::info!(
        upstream = id,
        pid = session.pid,
        tools = count,
        "upstream connected"
    );
    emit(
        opts,
        &ConnEvent::Connected {
            pid: session.pid,
            tools: count,
        },
    );
    Instant::now()
}

async fn refresh(shared: &Shared, peer: &Peer<RoleClient>, opts: &Options, id: &str) {
    match list_tools(peer, opts).await {
        Ok(tools) => publish(shared, tools, opts, id),
        Err(e) => tracing::warn!(upstream = id, error = %e, "upstream tool list refresh failed"),
    }
}

/// A new generation when the list differs from the last one (or is the first).
fn publish(shared: &Shared, listing: Listing, opts: &Options, id: &str) {
    let Listing { tools, items } = listing;
    let mut generation = None;
    shared.tools.send_if_modified(|last: &mut ToolList| {
        if last.generation > 0 && *last.tools == tools && *last.items == items {
            return false;
        }
        last.generation += 1;
        last.tools = Arc::new(tools);
        last.items = Arc::new(items);
        generation = Some(last.generation);
        true
    });
    if let Some(generation) = generation {
        tracing::info!(upstream = id, generation, "upstream tool list changed");
        emit(opts, &ConnEvent::ToolsChanged { generation });
    }
}

/// `what` and the exit status; an exit of `stsd upstream-exec` that says it could not confine
/// the upstream (so nothing of it ran) leads with SANDBOX_UNAVAILABLE.
fn exit_reason(what: &str, status: std::process::ExitStatus) -> String {
    let reason = format!("{what}; exited: {status}");
    if crate::gateway::spawn::is_sandbox_unavailable(status.code()) {
        format!(
            "SANDBOX_UNAVAILABLE: the upstream could not be confined (its stderr, in the log, \
             says why); {reason}"
        )
    } else {
        reason
    }
}
