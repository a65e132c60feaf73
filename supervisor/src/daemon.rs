//! `stsd` with no subcommand: the daemon. MCP on a Unix socket (0600, peer credentials checked,
//! or the one systemd passed), a pre-warmed pool, the audit log, SIGTERM/SIGINT graceful stop,
//! SIGHUP reload of the config, the catalog and the audit log file, sd_notify.
//! And `stsd mcp`: MCP on stdio, bridged to a running daemon or served by an embedded one.

use crate::audit::AuditLog;
use crate::exec::ExecOptions;
use crate::listener;
use crate::mcp::{self, Handler};
use crate::service::{Service, Source};
use crate::transport::{Limits, Registry};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_profiles::Config;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub struct DaemonOptions {
    pub config: Config,
    pub pool: usize,
    pub socket: PathBuf,
    pub sources: Vec<Source>,
    pub worker_exe: PathBuf,
    /// `--worker-reuse K`: a worker serves up to K calls of one tool (1 = one call per worker).
    pub reuse: u32,
    /// `--toolsets FILE` documents (besides `[daemon] toolsets`).
    pub toolsets: Vec<PathBuf>,
    /// Where `config` came from; SIGHUP reads it again.
    pub config_source: crate::config_file::ConfigSource,
    /// `--preset ID`, which overrides `[daemon] preset` (on reload too).
    pub preset: Option<String>,
    /// What systemd passed (notify socket, listening socket, watchdog); empty otherwise.
    pub systemd: crate::systemd::Systemd,
    /// `--listen ADDR:PORT`: MCP over Streamable HTTP too (besides `[http] listen`).
    pub listen: Option<String>,
}

/// The async runtime. Its threads move messages, and drive the exchange of a call whose
/// worker is at hand (`exec::inline`); the rest of a call runs in its worker process, and a
/// call that must wait for a worker to be made, or may fetch, on a blocking-pool thread.
fn runtime(config: &stsd_profiles::Config) -> Result<tokio::runtime::Runtime, String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(runtime_threads(config.daemon.runtime_threads, cpus))
        .enable_all()
        .thread_name("stsd")
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))
}

/// `[daemon] runtime_threads`, 0 resolved: one per two CPUs, at least one. The other CPUs are
/// the workers'. tokio wakes an idle runtime thread for every task it queues, and that thread
/// takes a CPU a call's worker wants: on 2 CPUs, one runtime thread instead of two took 6
/// context switches off each call, one-shot p50 0.472 -> 0.411 ms and reuse 0.215 -> 0.191
/// (`scripts/ab`, docs/src/performance.md).
fn runtime_threads(configured: usize, cpus: usize) -> usize {
    match configured {
        0 => (cpus / 2).max(1),
        n => n,
    }
}

/// The managed catalog of the daemon, in the state store (opened, and the older layout's
/// files imported into it once).
fn managed_catalog(o: &DaemonOptions) -> Result<Arc<crate::managed::Managed>, String> {
    let dir = o
        .config
        .daemon
        .catalog_dir
        .clone()
        .unwrap_or_else(crate::managed::default_dir);
    let store = crate::state::Store::of_config(&o.config)
        .map_err(|e| format!("cannot open the state store: {e}"))?;
    let ledger = crate::gateway::ledger_path(&o.config);
    if let Some(got) = crate::state::import::once(&store, &dir, &ledger)? {
        if !got.kept.is_empty() {
            tracing::info!(
                store = %store.path().display(),
                tools = got.tools,
                history = got.history,
                switches = got.switches,
                ledger = got.ledger,
                kept = %got.kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
                "imported the older state files into the store (kept, renamed)"
            );
        }
    }
    Ok(Arc::new(crate::managed::Managed::new(
        Arc::new(store),
        &dir,
    )))
}

fn build_service_with(
    o: &DaemonOptions,
    managed: Option<&Arc<crate::managed::Managed>>,
) -> Result<Arc<Service>, String> {
    let audit_path = o
        .config
        .daemon
        .audit_log
        .clone()
        .unwrap_or_else(crate::paths::default_audit_log);
    let d = &o.config.daemon;
    let audit = AuditLog::open(&audit_path)
        .map(|a| {
            a.with_budget(d.audit_max_bytes, d.audit_keep)
                .with_refusal_budget(d.audit_refusals_per_second)
        })
        .map_err(|e| format!("cannot open the audit log {}: {e}", audit_path.display()))?;
    let opts = ExecOptions::new(o.worker_exe.clone(), &o.config)?;
    let toolsets = o.toolsets.clone();
    let mut sources = o.sources.clone();
    if let Some(m) = managed {
        sources.push(Source::Managed(crate::catalog::ManagedSource(m.clone())));
    }
    Service::new(
        o.config.clone(),
        opts,
        o.pool,
        o.reuse,
        sources,
        toolsets,
        Some(audit),
    )
}

fn banner(service: &Service, what: &str) -> String {
    let p = service.published();
    let mut s = format!(
        "{what}\npool: {} ({}), queue limit {}; audit log: {}\nserving {}: {}\n",
        crate::plural::n(service.pool.target(), "worker"),
        if service.reuse() > 1 {
            format!("each serves up to {} calls of one tool", service.reuse())
        } else {
            "one call per worker".to_string()
        },
        service.config().daemon.queue_limit,
        service
            .audit_path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "-".into()),
        crate::plural::n(p.tools.len(), "tool"),
        p.names().join(", ")
    );
    let gated: Vec<String> = p
        .tools
        .iter()
        .filter(|t| t.approval.required)
        .map(|t| {
            format!(
                "{} ({}, {})",
                t.spec.name,
                t.approval.source.as_str(),
                t.approval.strategy.as_str()
            )
        })
        .collect();
    if !gated.is_empty() {
        s.push_str(&format!(
            "approval required for {}: {}\n",
            gated.len(),
            gated.join(", ")
        ));
    }
    for (name, why) in &p.withheld {
        s.push_str(&format!("withheld {name}: {why}\n"));
    }
    let clear: Vec<String> = service
        .config()
        .secrets
        .iter()
        .filter(|(_, c)| c.expose_to_code)
        .map(|(n, _)| n.clone())
        .collect();
    if !clear.is_empty() {
        s.push_str(&format!(
            "secrets given to tool code in clear ([secrets.NAME] expose_to_code; only masking guards them): {}\n",
            clear.join(", ")
        ));
    }
    if service.config().cgroups.mode != stsd_profiles::baseline::CgroupMode::Off {
        s.push_str(&format!("limits: {}\n", crate::cgroup::describe()));
    }
    if let Some(w) = crate::admin::own_uid_warning(&service.config().daemon.admin_uids) {
        s.push_str(&w);
        s.push('\n');
    }
    for (path, why) in &p.unreadable {
        s.push_str(&format!("unreadable {}: {why}\n", path.display()));
    }
    s
}

/// Runs the daemon until SIGTERM/SIGINT. A start that fails is logged, recorded in the audit
/// log (`"event": "start-failed"`) and reported to systemd, and leaves no socket behind.
pub fn run(mut o: DaemonOptions) -> Result<(), String> {
    let mut systemd = std::mem::take(&mut o.systemd);
    if let Some(why) = &systemd.problem {
        tracing::warn!(%why, "socket activation: LISTEN_FDS ignored; binding the socket myself");
    }
    let audit_path = o
        .config
        .daemon
        .audit_log
        .clone()
        .unwrap_or_else(crate::paths::default_audit_log);
    let listen = systemd.listen.take();
    let rt = runtime(&o.config)?;
    let result = rt.block_on(serve(o, listen, &systemd));
    // The pool's and the upstreams' groups go with their owners (main then removes this
    // daemon's own cgroup directory).
    drop(rt);
    // What traces are buffered go out before the process ends.
    crate::telemetry::shutdown();
    if let Err(e) = &result {
        tracing::error!(error = %e, "start failed");
        let ev = crate::audit::DaemonEvent {
            ts: crate::store::now_ms(),
            event: "start-failed",
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION"),
            error: e.clone(),
        };
        if let Err(w) = crate::audit::append_event(&audit_path, &ev) {
            tracing::warn!(error = %w, path = %audit_path.display(), "the failed start is not in the audit log");
        }
        let first = e.lines().next().unwrap_or_default();
        systemd.notify(&format!("STATUS=start failed: {first}\nERRNO=1"));
    }
    result
}

/// With a shared store (PostgreSQL), another replica's change is read in: a tool added, a
/// switch or a ledger approval (the ledger and the catalog again, and clients told), an
/// operator's decision for a call waiting here (delivered). And this replica says it is
/// alive, and records the waiting calls of one that is gone for good.
fn follow_replicas(
    managed: &Arc<crate::managed::Managed>,
    service: &Arc<Service>,
    changed: &broadcast::Sender<()>,
) {
    let store = managed.store();
    if !store.shared() {
        return;
    }
    // Weak: the store's listener must not keep the service (which holds the store) alive.
    let (weak, changed) = (Arc::downgrade(service), changed.clone());
    // The listener runs on the store's thread; an upstream change is applied on the runtime.
    let rt = tokio::runtime::Handle::current();
    let follow = Arc::new(move |what: &[String]| {
        let Some(s) = weak.upgrade() else {
            return;
        };
        if what.iter().any(|w| w == "decision") {
            s.gate.collect_decisions();
        }
        if what.iter().any(|w| w == "upstreams") {
            let s = s.clone();
            rt.spawn(async move {
                if let Err(e) = s.apply_upstreams().await {
                    tracing::warn!(error = %e, "a replica's upstream change was not applied");
                }
            });
        }
        if what.iter().all(|w| w == "decision" || w == "upstreams") {
            return;
        }
        s.refresh_ledger();
        match s.reload() {
            Ok(true) => {
                let _ = changed.send(());
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(errors = %e.join("; "), "a replica's change did not reload"),
        }
    });
    let f = follow.clone();
    store.on_change(Box::new(move |what: &[String]| f(what)));
    // A change another replica committed after this one read the store at start and before
    // the listener above was in place: read in once more now, or it would wait for the next.
    follow(&["catalog".to_string(), "ledger".to_string()]);
    let weak = Arc::downgrade(service);
    // A thread, not a task: the store's calls block.
    let _ = std::thread::Builder::new()
        .name("stsd-replica".into())
        .spawn(move || loop {
            let Some(s) = weak.upgrade() else {
                return;
            };
            s.replica_heartbeat();
            let every = s.config().store.replica_timeout_seconds.max(1) * 1000 / 3;
            drop(s);
            std::thread::sleep(std::time::Duration::from_millis(every.max(100)));
        });
}

/// The daemon's life: start (every error here is a failed start), serve, stop.
async fn serve(
    o: DaemonOptions,
    listen: Option<crate::systemd::ListenFd>,
    systemd: &crate::systemd::Systemd,
) -> Result<(), String> {
    let from_systemd = listen.is_some();
    // A configured approval-state key that cannot be used stops the start, not the first
    // call that needs approval.
    crate::approval::mcp::configured_key(&o.config.approval)?;
    crate::telemetry::start(&o.config.telemetry)?;
    // Before the socket exists: a SIGHUP (a reload right after the start) that arrived
    // before the handlers would end the daemon (the default action) once the socket
    // answers. Handled from the first moment a client can reach it, it waits its turn.
    let mut signals = Signals::install()?;
    let Endpoints {
        http: http_bound,
        console: console_bound,
        socket: bound,
        metrics,
    } = bind_endpoints(&o, listen).await?;
    let managed = managed_catalog(&o)?;
    let [http_bound, console_bound] = [http_bound, console_bound]
        .map(|b| b.map(|b| b.with_store(Some(managed.store()))).transpose());
    let (http_bound, console_bound) = (http_bound?, console_bound?);
    let service = build_service_with(&o, Some(&managed))?;
    let (changed, _) = broadcast::channel::<()>(16);
    follow_replicas(&managed, &service, &changed);
    let exe = service.exec_options().spawner.exe_path();
    service.start_gateway(std::path::Path::new(&exe), changed.clone())?;
    let nofile = raise_nofile_limit();
    crate::logs::banner(&banner(&service, &listening(&o, &bound, from_systemd)));
    let registry = connection_registry(&o, nofile);
    let admin: Arc<dyn crate::transport::AdminHandler> = crate::admin::Admin::with_catalog(
        service.clone(),
        Some((managed.clone(), changed.clone())),
    );
    spawn_audit_flusher(service.clone());
    if let Some((addr, l)) = metrics {
        crate::logs::banner(&format!(
            "metrics: Prometheus text on http://{addr}/metrics"
        ));
        tokio::spawn(serve_metrics(l, service.clone()));
    }
    let running = Running {
        o: &o,
        systemd,
        service: &service,
        changed: &changed,
        admin: &admin,
        registry: &registry,
        draining: CancellationToken::new(),
        stop_all: CancellationToken::new(),
    };
    let http_task = running.spawn_http(http_bound);
    // It ends with the HTTP listener's tokens (draining, then stop).
    let _console_task = running.spawn_http(console_bound);
    tracing::info!(
        nofile,
        max_connections = o.config.daemon.max_connections,
        "connection limits in force"
    );
    let mut sessions = tokio::task::JoinSet::new();
    // Started: from here on nothing is a failed start.
    systemd.notify(&format!(
        "READY=1\nSTATUS=serving {}\nMAINPID={}",
        crate::plural::n(service.published().tools.len(), "tool"),
        std::process::id()
    ));
    if let Some(every) = systemd.watchdog {
        tokio::spawn(watchdog(systemd.notifier.clone(), every));
    }
    running
        .accept_until_stopped(&bound, &mut signals, &mut sessions)
        .await;
    let left = running.stop(bound, http_task, sessions).await;
    crate::logs::banner(&format!(
        "stsd stopped ({left} calls cut off after the grace period)"
    ));
    Ok(())
}

/// What the daemon listens on, all bound before the service starts.
struct Endpoints {
    /// MCP over Streamable HTTP (`--listen`, `[http] listen`).
    http: Option<crate::http::Bound>,
    /// The operator console alone, on loopback (`[console] listen`).
    console: Option<crate::http::Bound>,
    /// The Unix socket (bound here, or the one systemd passed).
    socket: listener::Bound,
    /// The Prometheus port (`[metrics] listen`) and its address.
    metrics: Option<(String, tokio::net::TcpListener)>,
}

/// Binds every endpoint. The HTTP listener is bound before the socket appears: a bad [http]
/// section fails the start before anything is created, and once the socket exists every
/// endpoint takes connections (they wait in the backlog until the service is up).
async fn bind_endpoints(
    o: &DaemonOptions,
    listen: Option<crate::systemd::ListenFd>,
) -> Result<Endpoints, String> {
    let http = match o.listen.as_ref().or(o.config.http.listen.as_ref()) {
        Some(addr) => Some(crate::http::bind(&o.config.http, addr).await?),
        None => None,
    };
    // The console's listener too, before the socket: a bad [console] fails the start before
    // the socket appears (a client that sees the socket sees a daemon that started).
    let console = match &o.config.console.listen {
        Some(addr) => Some(crate::http::bind_console(&o.config.http, addr).await?),
        None => None,
    };
    let socket = match listen {
        Some(fd) => listener::from_systemd(fd)?,
        None => listener::bind(&o.socket, o.config.daemon.socket_group)?,
    };
    // The metrics port is bound with the socket, so it is there as soon as the socket is
    // (scrapes wait in its backlog until the catalog is published).
    let metrics = match &o.config.metrics.listen {
        Some(addr) => Some((
            addr.clone(),
            tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen for metrics on {addr}: {e}"))?,
        )),
        None => None,
    };
    Ok(Endpoints {
        http,
        console,
        socket,
        metrics,
    })
}

/// The first line of the startup banner: version, socket, protocols, config.
fn listening(o: &DaemonOptions, bound: &listener::Bound, from_systemd: bool) -> String {
    format!(
        "stsd {} listening on {} (MCP 2026-07-28 and 2025-11-25, newline-delimited JSON-RPC){}; config: {}",
        env!("CARGO_PKG_VERSION"),
        bound.path.display(),
        if from_systemd { ", socket from systemd" } else { "" },
        o.config_source
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "built-in defaults".into())
    )
}

/// The connection registry. Connections must not use up the descriptors that calls need
/// (worker sockets, fetch connections, the audit log): the bound is lowered to fit under the
/// limit.
fn connection_registry(o: &DaemonOptions, nofile: u64) -> Arc<Registry> {
    let d = &o.config.daemon;
    let reserve = 64 + 8 * o.pool as u64;
    let fit = (nofile.saturating_sub(reserve) as usize).max(8);
    if fit < d.max_connections {
        tracing::warn!(
            nofile,
            configured = d.max_connections,
            used = fit,
            "max_connections lowered to fit the descriptor limit"
        );
    }
    Registry::new(d.max_connections.min(fit), d.max_connections_per_uid)
}

/// Summaries of refused calls (audit_refusals_per_second) are written once their second is
/// over, whether or not the principal comes back.
fn spawn_audit_flusher(service: Arc<Service>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            service.flush_audit_summaries(false);
        }
    });
}

/// The signals the daemon answers: SIGTERM and SIGINT stop it, SIGHUP reloads.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Result<Signals, String> {
        let term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
        Ok(Signals { term, int, hup })
    }
}

/// The daemon once started: what each session is handed, what SIGHUP reloads, and what the
/// stop winds down.
struct Running<'a> {
    o: &'a DaemonOptions,
    systemd: &'a crate::systemd::Systemd,
    service: &'a Arc<Service>,
    changed: &'a broadcast::Sender<()>,
    admin: &'a Arc<dyn crate::transport::AdminHandler>,
    registry: &'a Arc<Registry>,
    /// Cancelled when the stop begins: the HTTP endpoint stops taking calls.
    draining: CancellationToken,
    /// Cancelled once calls in flight are done or cut off: every session ends.
    stop_all: CancellationToken,
}

impl Running<'_> {
    /// Remote MCP over Streamable HTTP, beside the socket, when an address is given.
    fn spawn_http(&self, bound: Option<crate::http::Bound>) -> Option<JoinHandle<()>> {
        let bound = bound?;
        crate::logs::banner(bound.describe().trim_end());
        Some(tokio::spawn(crate::http::serve(
            bound,
            self.service.clone(),
            self.changed.clone(),
            self.admin.clone(),
            self.draining.clone(),
            self.stop_all.clone(),
        )))
    }

    /// Accepts connections on the socket, each served in a session of its own, and reloads
    /// on SIGHUP, until SIGTERM or SIGINT.
    async fn accept_until_stopped(
        &self,
        bound: &listener::Bound,
        signals: &mut Signals,
        sessions: &mut tokio::task::JoinSet<()>,
    ) {
        let mut limits = Limits::from_config(&self.o.config.daemon);
        let mut allowed = self.o.config.daemon.allowed_uids.clone();
        let mut accept_backoff = Duration::ZERO;
        loop {
            tokio::select! {
                accepted = bound.listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => {
                            accept_backoff = Duration::ZERO;
                            stream
                        }
                        Err(e) => {
                            accept_failed(&e, self.registry, &mut accept_backoff).await;
                            continue;
                        }
                    };
                    if let Some((uid, ticket)) = admit(&stream, &allowed, self.registry) {
                        self.spawn_session(sessions, stream, uid, ticket, &limits);
                    }
                }
                Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                _ = signals.hup.recv() => {
                    if let Some((a, l)) = self.on_hup() {
                        allowed = a;
                        limits = l;
                    }
                }
                _ = signals.term.recv() => break,
                _ = signals.int.recv() => break,
            }
        }
    }

    /// Serves one admitted connection until it ends or the stop cuts it off.
    fn spawn_session(
        &self,
        sessions: &mut tokio::task::JoinSet<()>,
        stream: tokio::net::UnixStream,
        uid: u32,
        ticket: crate::transport::Ticket,
        limits: &Limits,
    ) {
        let handler = Handler::new(
            self.service.clone(),
            self.changed.clone(),
            Some(uid),
            "unix",
            ticket.closed.clone(),
        );
        let (stop, limits, admin) = (self.stop_all.clone(), limits.clone(), self.admin.clone());
        sessions.spawn(async move {
            let (r, w) = stream.into_split();
            let activity = ticket.activity.clone();
            tokio::select! {
                _ = mcp::serve(handler, r, w, limits, activity, Some(admin)) => {}
                _ = stop.cancelled() => {}
            }
            drop(ticket);
        });
    }

    /// SIGHUP: tells systemd, reloads, tells systemd again. Some: the reloaded config's
    /// allowed uids and connection limits, now in force.
    fn on_hup(&self) -> Option<(Vec<u32>, Limits)> {
        let systemd = self.systemd;
        systemd.notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
        let reloaded = reload(self.o, self.service, self.changed).then(|| {
            let c = self.service.config();
            (
                c.daemon.allowed_uids.clone(),
                Limits::from_config(&c.daemon),
            )
        });
        systemd.notify(&format!(
            "READY=1\nSTATUS=serving {}",
            crate::plural::n(self.service.published().tools.len(), "tool")
        ));
        reloaded
    }

    /// Stops accepting, lets in-flight calls finish within the grace period, then cuts off
    /// the rest: each is answered CANCELLED and audited before its session goes. Returns how
    /// many calls were cut off.
    async fn stop(
        &self,
        bound: listener::Bound,
        mut http_task: Option<JoinHandle<()>>,
        mut sessions: tokio::task::JoinSet<()>,
    ) -> usize {
        let service = self.service;
        self.systemd
            .notify("STOPPING=1\nSTATUS=stopping: finishing calls in flight");
        drop(bound);
        self.draining.cancel();
        let grace = Duration::from_secs(self.o.config.daemon.shutdown_grace_seconds);
        let t0 = Instant::now();
        while service.in_flight() > 0 && t0.elapsed() < grace {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // HTTP connections send the answers of the calls that just ended, then close.
        if let Some(t) = http_task.as_mut() {
            let rest = grace
                .saturating_sub(t0.elapsed())
                .max(Duration::from_millis(500));
            let _ = tokio::time::timeout(rest, t).await;
        }
        let left = service.in_flight();
        if left > 0 {
            service.cut_off();
            let t1 = Instant::now();
            while service.in_flight() > 0 && t1.elapsed() < CUT_OFF_WAIT {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        self.stop_all.cancel();
        sessions.shutdown().await;
        if let Some(t) = http_task.filter(|t| !t.is_finished()) {
            let _ = t.await;
        }
        service.shutdown();
        left
    }
}

/// A failed accept: out of descriptors (EMFILE/ENFILE) or a transient error. Never spins:
/// out of descriptors, the longest-idle session makes room; else the wait doubles.
async fn accept_failed(e: &std::io::Error, registry: &Registry, accept_backoff: &mut Duration) {
    let out_of_fds = matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE));
    if out_of_fds && (0..8).filter(|_| registry.evict_one()).count() > 0 {
        *accept_backoff = Duration::from_millis(5);
    } else {
        *accept_backoff =
            (*accept_backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
    }
    if *accept_backoff >= Duration::from_secs(1) || !out_of_fds {
        tracing::warn!(error = %e, backoff_ms = accept_backoff.as_millis() as u64, "accept failed; backing off");
    }
    tokio::time::sleep(*accept_backoff).await;
}

/// The peer's uid and its connection's ticket, or None: the connection is refused (logged,
/// and the client told why).
fn admit(
    stream: &tokio::net::UnixStream,
    allowed: &[u32],
    registry: &Arc<Registry>,
) -> Option<(u32, crate::transport::Ticket)> {
    let admitted = listener::check_peer(stream, allowed)
        .and_then(|uid| registry.admit(uid).map(|ticket| (uid, ticket)));
    match admitted {
        Ok(a) => Some(a),
        Err(why) => {
            tracing::warn!(%why, "connection refused");
            refuse(stream, &why);
            None
        }
    }
}

/// How long cut-off calls get to record themselves (their workers are SIGKILLed at once).
const CUT_OFF_WAIT: Duration = Duration::from_secs(5);

/// SIGHUP: reads the config again (the same file, or the lookup again), then the catalog
/// under it, and reopens the audit log (after logrotate moved it away, the next record goes
/// to a fresh file at the configured path). A config that does not load or does not apply
/// is refused with a log line naming why, and the old one stays in force. True when the new
/// config is in force.
fn reload(o: &DaemonOptions, service: &Arc<Service>, changed: &broadcast::Sender<()>) -> bool {
    let loaded = o.config_source.reload().map(|(mut c, path)| {
        if let Some(p) = &o.preset {
            c.daemon.preset = Some(p.clone());
        }
        (c, path)
    });
    let (config, path) = match loaded {
        Ok(x) => x,
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: config refused; the old config, catalog and audit log stay in force");
            return false;
        }
    };
    let from = path
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "built-in defaults".into());
    match service.reload_config(config) {
        Ok(r) => {
            if r.tools_changed {
                let _ = changed.send(());
            }
            // [[upstream]] changes: connected (or drained) in the background; the gateway
            // tells clients when the served list changes.
            let s = service.clone();
            tokio::spawn(async move {
                if let Err(e) = s.apply_upstreams().await {
                    tracing::error!(error = %e, "SIGHUP: the upstreams were not changed");
                }
            });
            if !r.restart_needed.is_empty() {
                tracing::warn!(
                    settings = %r.restart_needed.join(", "),
                    "SIGHUP: these settings changed but take effect only at the next start"
                );
            }
            crate::logs::banner(&banner(
                service,
                &format!("reloaded (SIGHUP): config {from}, catalog, audit log reopened"),
            ));
            true
        }
        Err(errors) => {
            tracing::error!(
                config = %from,
                errors = %errors.join("; "),
                "SIGHUP: config refused; the old config, catalog and audit log stay in force"
            );
            false
        }
    }
}

/// CLOCK_MONOTONIC in microseconds (sd_notify's RELOADING=1 wants it).
fn monotonic_usec() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: t is a valid timespec for the kernel to fill.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000
}

/// WATCHDOG=1 every `every` (half WATCHDOG_USEC) for as long as the runtime turns.
async fn watchdog(notifier: Option<crate::systemd::Notifier>, every: Duration) {
    let Some(n) = notifier else { return };
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Err(e) = n.send("WATCHDOG=1") {
            tracing::warn!(error = %e, "sd_notify WATCHDOG=1 failed");
        }
    }
}

/// `GET /metrics` in the Prometheus text format; anything else 404. One request per
/// connection, read with a bound and a deadline, so a slow or hostile scraper holds nothing.
async fn serve_metrics(listener: tokio::net::TcpListener, service: Arc<Service>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut n = 0;
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                while n < buf.len() {
                    match s.read(&mut buf[n..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(k) => n += k,
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            })
            .await;
            if read.is_err() {
                return;
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if head.starts_with("GET /metrics ") {
                ("200 OK", service.metrics.prometheus(&service.gauges()))
            } else {
                ("404 Not Found", "not found: GET /metrics\n".to_string())
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ =
                tokio::time::timeout(Duration::from_secs(5), s.write_all(reply.as_bytes())).await;
        });
    }
}

/// Tells a refused client why, without waiting on it, then lets the connection drop.
fn refuse(stream: &tokio::net::UnixStream, why: &str) {
    let msg = serde_json::json!({
        "jsonrpc": "2.0",
        "error": {"code": -32000, "message": format!("connection refused: {why}")},
    });
    let _ = stream.try_write(format!("{msg}\n").as_bytes());
}

/// Raises the soft descriptor limit to the hard one (each connection holds one, each running
/// call a few); returns the limit in force.
fn raise_nofile_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Ok((soft, _)) => soft,
        Err(_) => 0,
    }
}

/// How often `stsd mcp` tells the daemon its client is still there while the client is quiet.
pub const BRIDGE_KEEPALIVE: Duration = Duration::from_secs(30);

/// `stsd mcp` as a bridge: stdin to the daemon line by line (with keepalives between lines
/// while the client is quiet, so the session is not closed as idle), the daemon to stdout.
async fn bridge(stream: tokio::net::UnixStream, keepalive: Duration) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let (mut sr, mut sw) = stream.into_split();
    let (stdin, mut stdout) = rmcp::transport::stdio_pipes();
    // First, before any line of the client's: the session carries MCP only.
    let only = format!(
        "{}\n",
        serde_json::json!({"jsonrpc": "2.0", "method": crate::transport::MCP_ONLY_METHOD})
    );
    if sw.write_all(only.as_bytes()).await.is_err() {
        return;
    }
    let up = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stdin);
        let mut line = Vec::new();
        let ping = format!(
            "{}\n",
            serde_json::json!({"jsonrpc": "2.0", "method": crate::transport::KEEPALIVE_METHOD})
        );
        loop {
            // read_until is not cancel-safe across a timeout, so the timeout only runs while
            // no byte of the next line has arrived.
            if line.is_empty() {
                let waited = match tokio::time::timeout(keepalive, lines.fill_buf()).await {
                    Err(_) => None,
                    Ok(r) => Some(r.map(|b| b.is_empty()).unwrap_or(true)),
                };
                match waited {
                    None => {
                        if sw.write_all(ping.as_bytes()).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    Some(true) => break,
                    Some(false) => {}
                }
            }
            let read = lines.read_until(b'\n', &mut line).await;
            match read {
                Ok(0) | Err(_) => break,
                Ok(_) if line.ends_with(b"\n") => {
                    if sw.write_all(&line).await.is_err() {
                        break;
                    }
                    line.clear();
                }
                Ok(_) => {
                    // EOF in the middle of a line: pass it on as it is.
                    let _ = sw.write_all(&line).await;
                    break;
                }
            }
        }
        let _ = sw.shutdown().await;
    });
    let _ = tokio::io::copy(&mut sr, &mut stdout).await;
    let _ = stdout.flush().await;
    up.abort();
}

/// `stsd mcp`: stdio. With `bridge_first`, bridges to the daemon on `socket` when one answers;
/// else (or when none answers) serves the catalog itself with an embedded supervisor.
pub fn run_stdio(o: DaemonOptions, bridge_first: bool, keepalive: Duration) -> Result<(), String> {
    let rt = runtime(&o.config)?;
    rt.block_on(async move {
        let daemon = match bridge_first {
            true => tokio::net::UnixStream::connect(&o.socket).await.ok(),
            false => None,
        };
        if let Some(stream) = daemon {
            tracing::info!(socket = %o.socket.display(), "bridging stdio to the running daemon");
            bridge(stream, keepalive).await;
            // A blocking stdin read would stall runtime shutdown; the session is over.
            std::process::exit(0);
        }
        crate::telemetry::start(&o.config.telemetry)?;
        // What the daemon would serve from the same config: the managed catalog, the
        // toolsets, the gateway's upstreams.
        let managed = managed_catalog(&o)?;
        let service = build_service_with(&o, Some(&managed))?;
        let (changed, _) = broadcast::channel::<()>(16);
        let exe = service.exec_options().spawner.exe_path();
        service.start_gateway(std::path::Path::new(&exe), changed.clone())?;
        crate::logs::banner(&banner(
            &service,
            "stsd mcp: no daemon answered; serving on stdio with an embedded supervisor",
        ));
        let uid = nix::unistd::Uid::effective().as_raw();
        // One session, its own client: no idle timeout on stdio.
        let ticket = Registry::new(1, 1).admit(uid)?;
        let handler = Handler::new(
            service.clone(),
            changed,
            Some(uid),
            "stdio",
            ticket.closed.clone(),
        );
        let mut limits = Limits::from_config(&o.config.daemon);
        limits.idle_timeout = None;
        limits.first_message_timeout = None;
        let (r, w) = rmcp::transport::stdio_pipes();
        mcp::serve(handler, r, w, limits, ticket.activity.clone(), None).await;
        service.shutdown();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_runtime_takes_one_thread_per_two_cpus_unless_told() {
        assert_eq!(super::runtime_threads(0, 0), 1);
        assert_eq!(super::runtime_threads(0, 1), 1);
        assert_eq!(super::runtime_threads(0, 2), 1);
        assert_eq!(super::runtime_threads(0, 3), 1);
        assert_eq!(super::runtime_threads(0, 16), 8);
        assert_eq!(super::runtime_threads(1, 2), 1);
        assert_eq!(super::runtime_threads(3, 2), 3);
    }
}
