//! The gateway at run time: one connection per upstream (stdio ones confined, networked ones
//! behind their own egress proxy), the ledger, and the exposure recomputed whenever an
//! upstream's tool list changes. The service asks it for the wrapped tools and hands it calls.

use super::client::{self, Connection};
use super::expose::{self, Exposed, Listed, WrappedTool};
use super::ledger::Ledger;
use super::oauth;
use super::proxy::{EgressProxy, ProxyHop};
use super::sources;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use stsd_profiles::upstream::UpstreamConfig;
use stsd_profiles::Config;
use stsd_protocol::envvar::SecretSet;
use stsd_protocol::Code;
use tokio::sync::broadcast;

/// Where the gateway writes what it decides: the log always, the audit log through this.
pub type EventSink = Arc<dyn Fn(&Value) + Send + Sync>;

pub struct Upstream {
    pub cfg: Arc<UpstreamConfig>,
    /// None when the upstream could not be set up (a secret missing, a workspace that cannot
    /// be made): `error` says why.
    pub conn: Option<Arc<Connection>>,
    pub error: Option<String>,
    /// Masks the upstream's resolved secrets (env, args, headers) everywhere; see
    /// [`Upstream::masks`], which adds its OAuth tokens.
    pub secrets: SecretSet,
    /// An OAuth upstream: its login and credentials.
    pub oauth: Option<oauth::Setup>,
    pub workspace: Option<PathBuf>,
    pub proxy_port: Option<u16>,
    /// stdio: the uid:gid it runs as (its own when stsd is root, see `identity`).
    pub ids: Option<(u32, u32)>,
    /// stdio: its control group (dropped after the connection: kills what is left), or why
    /// it has none.
    pub group: Result<Arc<crate::cgroup::Group>, String>,
    /// stdio: its workspace's tmpfs, or why it has none.
    pub budget: Result<super::budget::Budget, String>,
    _proxy: Option<Arc<EgressProxy>>,
    /// A preview's temporary workspace, removed when the preview ends.
    _scratch: Option<tempfile::TempDir>,
    /// Calls in flight through it: a removal waits for them (`change`).
    pub(super) calls: AtomicUsize,
    /// This set-up, unique in the process: a successor with the same id has another.
    pub instance: u64,
}

impl Upstream {
    /// What to mask in everything the upstream says: its resolved secrets and, for an OAuth
    /// upstream, its current tokens.
    pub fn masks(&self) -> SecretSet {
        match &self.oauth {
            Some(o) => o.tokens.masks(),
            None => self.secrets.clone(),
        }
    }
}

/// The next `Upstream::instance`.
fn next_instance() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub struct Gateway {
    config: RwLock<Arc<Config>>,
    /// The upstreams now: changed at run time by `change` (add, update, remove, restart).
    pub(super) upstreams: RwLock<Vec<Arc<Upstream>>>,
    /// Serialises changes to the set of upstreams (admin methods, SIGHUP, replicas).
    pub(super) changing: tokio::sync::Mutex<()>,
    pub(super) stsd_exe: PathBuf,
    pub ledger: Arc<Ledger>,
    exposed: RwLock<Arc<Exposed>>,
    own: RwLock<Vec<String>>,
    changed: broadcast::Sender<()>,
    /// Resource and prompt list changes, resource updates (see [`ItemEvent`]).
    pub(super) item_events: broadcast::Sender<ItemEvent>,
    /// One recompute at a time (two that overlapped could swap in the older snapshot last);
    /// it holds the risk events the last one found (as JSON), so
    /// an event is logged and audited when a result changes, not on every recompute.
    recomputing: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Resource subscriptions across every session: URI -> how many.
    pub(super) subscribed: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    pub(super) sink: EventSink,
    /// False for a preview (`stsd upstream check`): the ledger is read, never written.
    pub(super) observe: bool,
}

/// Counts a call through an upstream for as long as it lives.
pub(super) struct InCall<'a>(&'a AtomicUsize);

impl<'a> InCall<'a> {
    pub(super) fn new(n: &'a AtomicUsize) -> InCall<'a> {
        n.fetch_add(1, Ordering::SeqCst);
        InCall(n)
    }
}

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The state directory (see [`crate::state::dir`]).
pub fn state_dir(config: &Config) -> PathBuf {
    crate::state::dir(config)
}

/// The ledger file of the older layout (the store holds the ledger since; imported once).
pub fn ledger_path(config: &Config) -> PathBuf {
    state_dir(config).join("ledger.json")
}

impl Gateway {
    /// Sets every declared upstream up and starts connecting (in the background: the daemon
    /// serves its own tools meanwhile). An upstream that cannot be set up is kept, with its
    /// error, and serves nothing.
    pub fn start(
        config: Arc<Config>,
        declared: Vec<UpstreamConfig>,
        stsd_exe: &Path,
        ledger: Arc<Ledger>,
        changed: broadcast::Sender<()>,
        sink: EventSink,
        observe: bool,
    ) -> Result<Arc<Gateway>, String> {
        let ids = upstream_ids(&config, &declared);
        let mut upstreams = Vec::new();
        for u in declared {
            let id = ids.get(&u.id).copied();
            upstreams.push(Arc::new(set_up(&config, u, id, stsd_exe, &sink, observe)));
        }
        let gw = Arc::new(Gateway {
            config: RwLock::new(config),
            upstreams: RwLock::new(upstreams),
            changing: tokio::sync::Mutex::new(()),
            stsd_exe: stsd_exe.to_path_buf(),
            ledger,
            exposed: RwLock::new(Arc::new(Exposed::default())),
            own: RwLock::new(Vec::new()),
            changed,
            item_events: broadcast::channel(256).0,
            recomputing: std::sync::Mutex::new(Default::default()),
            subscribed: Default::default(),
            sink,
            observe,
        });
        for u in gw.upstreams() {
            gw.follow(&u);
        }
        gw.recompute();
        Ok(gw)
    }

    /// Recomputes the exposure whenever `u` lists its tools anew, and passes its resource
    /// updates on (a URI served from it only).
    pub(super) fn follow(self: &Arc<Self>, u: &Upstream) {
        if let Some(conn) = &u.conn {
            let (me, mut rx) = (Arc::downgrade(self), conn.tools());
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    let Some(gw) = me.upgrade() else { return };
                    gw.recompute();
                }
            });
            let (me, mut rx, id) = (Arc::downgrade(self), conn.updates(), u.cfg.id.clone());
            tokio::spawn(async move {
                loop {
                    let uri = match rx.recv().await {
                        Ok(uri) => uri,
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return,
                    };
                    let Some(gw) = me.upgrade() else { return };
                    if gw.exposed().items.route(&uri).is_ok_and(|by| by == id) {
                        let _ = gw.item_events.send(ItemEvent::Updated(uri));
                    }
                }
            });
        }
    }

    /// The upstreams now.
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.upstreams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The config in force.
    pub(super) fn config(&self) -> Arc<Config> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The wrapped tools as served now.
    pub fn exposed(&self) -> Arc<Exposed> {
        self.exposed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn get(&self, alias: &str) -> Option<WrappedTool> {
        self.exposed().get(alias).cloned()
    }

    /// stsd's own served names changed (R1 covers them): recompute.
    pub fn set_own(&self, names: Vec<String>) {
        *self.own.write().unwrap_or_else(|e| e.into_inner()) = names;
        self.recompute();
    }

    pub fn set_config(&self, config: Arc<Config>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
        self.recompute();
    }

    /// Re-scores every upstream's current list, applies the ledger and the rules, swaps the
    /// exposure in, and tells clients when the served list changed.
    pub fn recompute(&self) {
        // Seed 001's risk events are span events of this span in a trace.
        let span = crate::telemetry::child("gateway.recompute");
        let _in = span.enter();
        let mut last_events = self.recomputing.lock().unwrap_or_else(|e| e.into_inner());
        let config = self
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let own = self.own.read().unwrap_or_else(|e| e.into_inner()).clone();
        let upstreams = self.upstreams();
        let lists: Vec<Option<Vec<Value>>> = upstreams
            .iter()
            .map(|u| u.conn.as_ref().and_then(|c| tools_json(c)))
            .collect();
        let items: Vec<Option<Arc<super::client::items::Items>>> = upstreams
            .iter()
            .map(|u| u.conn.as_ref().and_then(items_of))
            .collect();
        let listed: Vec<Listed> = upstreams
            .iter()
            .zip(&lists)
            .zip(&items)
            .map(|((u, tools), items)| Listed {
                cfg: &u.cfg,
                tools: tools.as_deref(),
                items: items.as_deref(),
                last_used_ms: self.ledger.last_used(&u.cfg.id),
                instance: u.instance,
            })
            .collect();
        let (fresh, events) = expose::compute(
            &listed,
            &own,
            &config.gateway,
            &config,
            &self.ledger,
            self.observe,
            crate::store::now_ms(),
        );
        let found: std::collections::HashSet<String> = events.iter().map(|e| e.to_json()).collect();
        for ev in events
            .iter()
            .filter(|e| !last_events.contains(&e.to_json()))
        {
            ev.emit();
            if let Ok(v) = serde_json::to_value(ev) {
                (self.sink)(&v);
            }
        }
        *last_events = found;
        let mut slot = self.exposed.write().unwrap_or_else(|e| e.into_inner());
        let names = |e: &Exposed| {
            e.tools
                .iter()
                .map(|t| (t.alias.clone(), t.description.clone(), t.composed.level))
                .collect::<Vec<_>>()
        };
        let changed = names(&slot) != names(&fresh);
        let (was_res, was_prompts) = slot.items.summary();
        let (res, prompts) = fresh.items.summary();
        let (res_changed, prompts_changed) = (was_res != res, was_prompts != prompts);
        *slot = Arc::new(fresh);
        drop(slot);
        if changed {
            let _ = self.changed.send(());
        }
        if res_changed {
            let _ = self.item_events.send(ItemEvent::Resources);
        }
        if prompts_changed {
            let _ = self.item_events.send(ItemEvent::Prompts);
        }
    }

    /// Resource and prompt list changes and resource updates, for the MCP sessions.
    pub fn item_events(&self) -> broadcast::Receiver<ItemEvent> {
        self.item_events.subscribe()
    }

    pub fn upstream(&self, id: &str) -> Option<Arc<Upstream>> {
        self.upstreams
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|u| u.cfg.id == id)
            .cloned()
    }

    /// Calls the upstream tool behind `alias`. The reply's strings are masked by the caller
    /// with [`Upstream::secrets`].
    pub async fn call(
        &self,
        tool: &WrappedTool,
        args: Map<String, Value>,
        cancel: Arc<AtomicBool>,
    ) -> Result<rmcp::model::CallToolResult, (Code, String)> {
        let Some(u) = self.upstream(&tool.upstream) else {
            return Err((
                Code::UpstreamUnavailable,
                format!("no upstream {}", tool.upstream),
            ));
        };
        if u.instance != tool.instance {
            return Err((
                Code::UpstreamUnavailable,
                format!(
                    "upstream {} was replaced while the call waited: {} is served again once \
                     the new set-up has listed and scored it",
                    tool.upstream, tool.alias
                ),
            ));
        }
        let Some(conn) = &u.conn else {
            return Err((
                Code::UpstreamUnavailable,
                u.error.clone().unwrap_or_else(|| "not set up".into()),
            ));
        };
        let _counted = InCall::new(&u.calls);
        if let Err(e) = self.ledger.touch_server(&u.cfg.id, crate::store::now_ms()) {
            tracing::warn!(upstream = %u.cfg.id, error = %e, "the ledger did not record the use");
        }
        conn.call(
            &tool.tool,
            args,
            Duration::from_millis(tool.timeout_ms),
            cancel,
        )
        .await
    }

    /// Every upstream: how it is connected and confined, its server score, its tools served
    /// (with scores, scan hits and ledger state) and withheld (with why). Secrets masked.
    pub fn report(&self) -> Value {
        let exposed = self.exposed();
        let config = self
            .config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let list: Vec<Value> = self
            .upstreams()
            .iter()
            .map(|u| {
                let id = &u.cfg.id;
                let server = exposed
                    .servers
                    .iter()
                    .find(|(s, _)| s == id)
                    .and_then(|(_, r)| r.clone());
                let tools: Vec<Value> = exposed
                    .tools
                    .iter()
                    .filter(|t| &t.upstream == id)
                    .map(|t| {
                        json!({
                            "alias": t.alias, "tool": t.tool,
                            "risk": t.composed, "toolRisk": t.tool_risk,
                            "poisoning": t.hits, "approvalRequired": t.approval.required,
                            "ledger": t.ledger_id,
                            "ledgerState": self.ledger.get(&t.ledger_id)
                                .map(|e| e.state.as_str()).unwrap_or("NEW"),
                        })
                    })
                    .collect();
                let withheld: Vec<&super::expose::Withheld> = exposed
                    .withheld
                    .iter()
                    .chain(&exposed.items.withheld)
                    .filter(|w| &w.upstream == id)
                    .collect();
                let items = &exposed.items;
                let prompts: Vec<&str> = items
                    .prompts
                    .iter()
                    .filter(|p| &p.upstream == id)
                    .map(|p| p.name.as_str())
                    .collect();
                let count = |l: &[super::items::ServedResource]| {
                    l.iter().filter(|r| &r.upstream == id).count()
                };
                let read_paths = u.cfg.command.as_deref().map(|c| {
                    match stsd_profiles::os::process::resolve_program(
                        c,
                        Some(std::ffi::OsStr::new(super::spawn::DEFAULT_PATH)),
                    ) {
                        Ok(p) => json!(stsd_profiles::os::process::derive_read_paths(
                            &p,
                            &u.cfg.args,
                            &u.cfg.read_paths
                        )),
                        Err(e) => json!(e),
                    }
                });
                let (state, last_error) = match u.conn.as_ref().map(|c| c.state()) {
                    None => ("not-started", None),
                    Some(client::ConnState::Starting) => ("starting", None),
                    Some(client::ConnState::Ready) => ("ready", None),
                    Some(client::ConnState::Restarting { last_error, .. }) => {
                        ("restarting", Some(last_error))
                    }
                    Some(client::ConnState::Stopped) => ("stopped", None),
                };
                // Why it is not serving, whichever step failed: set-up, or the session.
                let error = u.error.clone().or(last_error).map(|e| u.masks().mask(&e));
                let config_risk = expose::config_risk(
                    &u.cfg,
                    &config.gateway,
                    self.ledger.last_used(id),
                    crate::store::now_ms(),
                );
                json!({
                    "id": id,
                    "transport": if u.cfg.is_stdio() { "stdio" } else { "streamable-http" },
                    "url": u.cfg.url,
                    "state": state,
                    "pid": u.conn.as_ref().and_then(|c| c.pid()),
                    "callsInFlight": u.calls.load(Ordering::SeqCst),
                    "error": error,
                    "configRisk": config_risk,
                    "workspace": u.workspace,
                    "readPaths": read_paths,
                    "network": if u.cfg.network.is_empty() { Value::from("none") }
                               else { json!(u.cfg.network) },
                    "proxyPort": u.proxy_port,
                    // An OAuth upstream: whether stsd holds its credentials (never them).
                    "oauth": u.oauth.as_ref().map(|o| json!({
                        "signedIn": o.tokens.signed_in(),
                        "credentials": o.tokens.path(),
                    })),
                    "uid": u.ids.map(|i| i.0),
                    "gid": u.ids.map(|i| i.1),
                    "cgroup": u.cfg.is_stdio().then(|| cgroup_report(&u.group)),
                    "workspaceBudget": u.cfg.is_stdio().then(|| match &u.budget {
                        Ok(b) => json!({"bytes": b.bytes()}),
                        Err(why) => json!({"none": why}),
                    }),
                    "serverRisk": server,
                    "tools": tools,
                    "prompts": prompts,
                    "resources": count(&items.resources),
                    "resourceTemplates": count(&items.templates),
                    "withheld": withheld,
                    "listed": listed_names(u),
                    "expose": exposure(&u.cfg),
                })
            })
            .collect();
        json!({"upstreams": list})
    }

    /// Whether every upstream has listed its tools or given up (for the preview).
    pub fn settled(&self) -> bool {
        self.upstreams().iter().all(|u| match &u.conn {
            None => true,
            Some(c) => {
                tools_json(c).is_some() || matches!(c.state(), client::ConnState::Restarting { .. })
            }
        })
    }

    pub fn stop(&self) {
        for u in self.upstreams() {
            if let Some(c) = &u.conn {
                c.stop();
            }
        }
    }
}

/// An upstream's resources, templates and prompts, None until it has listed once.
fn items_of(c: &Arc<Connection>) -> Option<Arc<super::client::items::Items>> {
    let list = c.tools().borrow().clone();
    (list.generation > 0).then_some(list.items)
}

/// What MCP sessions are told besides tool list changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemEvent {
    /// The served resources or resource templates changed.
    Resources,
    /// The served prompts changed.
    Prompts,
    /// A subscribed resource changed (its URI).
    Updated(String),
}

/// An upstream's tools as listed (JSON), None until it has listed them once.
/// Every tool the upstream lists, by its own names (None before its first list).
fn listed_names(u: &Upstream) -> Option<Vec<String>> {
    let tools = u.conn.as_ref().and_then(|c| tools_json(c))?;
    Some(
        tools
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect(),
    )
}

/// What decides which of an upstream's tools are served and how (the console's Expose Tools
/// drawer edits these).
fn exposure(cfg: &UpstreamConfig) -> Value {
    json!({
        "tools": cfg.tools, "aliases": cfg.aliases, "descriptions": cfg.descriptions,
        "approval": cfg.approval, "approvalDefault": cfg.approval_default,
        "maxRisk": cfg.max_risk,
    })
}

fn tools_json(c: &Connection) -> Option<Vec<Value>> {
    let list = c.tools().borrow().clone();
    if list.generation == 0 {
        return None;
    }
    Some(
        list.tools
            .iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .collect(),
    )
}

/// The uid each stdio upstream runs as, when stsd is root and `[gateway]
/// upstream_uid_count` is not 0 (see `identity`); absent: `[worker] uid`.
fn upstream_ids(
    config: &Config,
    declared: &[UpstreamConfig],
) -> std::collections::BTreeMap<String, u32> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Default::default();
    }
    let stdio: Vec<&str> = declared
        .iter()
        .filter(|u| u.is_stdio())
        .map(|u| u.id.as_str())
        .collect();
    let gw = &config.gateway;
    super::identity::assign(
        &stdio,
        gw.upstream_uid_first,
        gw.upstream_uid_count,
        &[config.worker.uid, config.worker.gid],
        super::identity::held_by_system,
    )
}

/// Resolves an upstream's references, makes its workspace and proxy, and starts its
/// connection.
/// `observe` false: a preview (`stsd upstream check`), which writes nothing of the daemon's:
/// a stdio upstream without a configured workspace gets a temporary one, removed after.
fn set_up(
    config: &Arc<Config>,
    u: UpstreamConfig,
    own_uid: Option<u32>,
    stsd_exe: &Path,
    sink: &EventSink,
    observe: bool,
) -> Upstream {
    let cfg = Arc::new(u);
    let prepared = match prepare(config, &cfg, sink) {
        Ok(p) => p,
        Err((error, secrets)) => return not_started(&cfg, error, secrets),
    };
    if !cfg.is_stdio() {
        return start_http(cfg, prepared);
    }
    start_stdio(config, cfg, prepared, own_uid, stsd_exe, observe)
}

/// What every upstream gets before its transport matters: its resolved references, the
/// secrets to mask, its egress proxy and its connection's options.
struct Prepared {
    /// The config the connection sees: references resolved.
    live: Arc<UpstreamConfig>,
    secrets: SecretSet,
    proxy: Option<Arc<EgressProxy>>,
    options: client::Options,
    oauth: Option<oauth::Setup>,
}

/// Sets one upstream up on a running gateway: its own uid picked among those the others do
/// not hold (see `identity`).
pub(super) fn set_up_one(gw: &Gateway, u: UpstreamConfig) -> Upstream {
    let config = gw.config();
    let taken: Vec<u32> = gw
        .upstreams()
        .iter()
        .filter_map(|x| x.ids.map(|i| i.0))
        .collect();
    let own_uid = own_uid(&config, &u, &taken);
    set_up(&config, u, own_uid, &gw.stsd_exe, &gw.sink, gw.observe)
}

/// The uid a stdio upstream added at run time runs as (None: `[worker] uid`), avoiding
/// `taken`.
fn own_uid(config: &Config, u: &UpstreamConfig, taken: &[u32]) -> Option<u32> {
    if !u.is_stdio() || !is_root() {
        return None;
    }
    let gw = &config.gateway;
    let mut avoid = vec![config.worker.uid, config.worker.gid];
    avoid.extend_from_slice(taken);
    super::identity::assign(
        &[u.id.as_str()],
        gw.upstream_uid_first,
        gw.upstream_uid_count,
        &avoid,
        super::identity::held_by_system,
    )
    .get(&u.id)
    .copied()
}

/// An upstream that could not be set up: logged, kept with its error, serving nothing.
fn not_started(cfg: &Arc<UpstreamConfig>, error: String, secrets: SecretSet) -> Upstream {
    tracing::error!(upstream = %cfg.id, error = %error, "upstream not started");
    Upstream {
        cfg: cfg.clone(),
        conn: None,
        error: Some(error),
        secrets,
        oauth: None,
        workspace: None,
        proxy_port: None,
        ids: None,
        group: Err("not started".into()),
        budget: Err("not started".into()),
        _proxy: None,
        _scratch: None,
        calls: AtomicUsize::new(0),
        instance: next_instance(),
    }
}

/// Resolves the upstream's references (secrets, env, args, headers), starts its egress
/// proxy and fills in its connection's options. Err: why not, and the secrets to mask it
/// with.
fn prepare(
    config: &Config,
    cfg: &Arc<UpstreamConfig>,
    sink: &EventSink,
) -> Result<Prepared, (String, SecretSet)> {
    let gw = &config.gateway;
    let resolved = match sources::resolve_upstream(cfg, Some(&crate::secrets::dir(config))) {
        Ok(r) => r,
        Err(e) => return Err((e, SecretSet::default())),
    };
    let secrets = SecretSet::from_values(resolved.secrets.iter().map(String::as_str));
    let proxy = match egress_proxy(config, cfg, sink) {
        Ok(p) => p,
        Err(e) => return Err((e, secrets)),
    };
    let mut options = client::Options::from_gateway(gw);
    options.http_proxy = proxy.as_ref().map(|p| p.url());
    options.extra_ca_files = config.egress.extra_ca_files.clone();
    options.secrets = secrets.clone();
    let oauth = match oauth_setup(config, cfg, &options, &secrets) {
        Ok(o) => o,
        Err(e) => return Err((e, secrets)),
    };
    options.oauth = oauth.clone();
    // The connection sees the resolved values; `cfg` (reports, logs) keeps the references.
    let mut live = (**cfg).clone();
    live.args = resolved.args.clone();
    live.env = resolved.env.clone();
    live.headers = resolved.headers.clone();
    Ok(Prepared {
        live: Arc::new(live),
        secrets,
        proxy,
        options,
        oauth,
    })
}

/// An OAuth upstream's login and credentials (see `oauth`); None for any other.
fn oauth_setup(
    config: &Config,
    cfg: &UpstreamConfig,
    options: &client::Options,
    secrets: &SecretSet,
) -> Result<Option<oauth::Setup>, String> {
    if !oauth::wanted(cfg) {
        return Ok(None);
    }
    let url = cfg.url.clone().unwrap_or_default();
    let tokens = oauth::Tokens::open(&state_dir(config), &cfg.id, &url, secrets.clone())?;
    Ok(Some(oauth::Setup {
        id: cfg.id.clone(),
        url: cfg.url.clone().unwrap_or_default(),
        scopes: cfg.oauth_scopes.clone(),
        client_id: cfg.oauth_client_id.clone(),
        proxy: options.http_proxy.clone(),
        extra_ca_files: options.extra_ca_files.clone(),
        tokens,
    }))
}

/// The upstream's own egress proxy, when it reaches anything: a networked stdio upstream,
/// and every HTTP upstream, reach the world only through an egress proxy of their own with
/// the fetch broker's rules; an HTTP upstream's own host is on its allowlist. Each hop is
/// logged and goes to the sink. Err: why it did not start.
fn egress_proxy(
    config: &Config,
    cfg: &Arc<UpstreamConfig>,
    sink: &EventSink,
) -> Result<Option<Arc<EgressProxy>>, String> {
    let mut allow = cfg.network.clone();
    if let Some(h) = cfg.url.as_deref().and_then(|u| url::Url::parse(u).ok()) {
        if let Some(host) = h.host_str() {
            allow.push(host.trim_matches(['[', ']']).to_string());
        }
    }
    if allow.is_empty() {
        return Ok(None);
    }
    let (id, sink) = (cfg.id.clone(), sink.clone());
    let on_hop = Arc::new(move |hop: ProxyHop| {
        tracing::info!(upstream = %id, host = %hop.host, allowed = hop.allowed, rule = ?hop.rule, "upstream egress");
        if let Ok(mut v) = serde_json::to_value(&hop) {
            v["event"] = Value::from("UpstreamEgress");
            v["ts"] = Value::from(crate::store::now_ms());
            sink(&v);
        }
    });
    EgressProxy::start(cfg.id.clone(), allow, &config.egress, on_hop)
        .map(|p| Some(Arc::new(p)))
        .map_err(|e| format!("egress proxy: {e}"))
}

/// An HTTP upstream: no process, no workspace; its connection starts now.
fn start_http(cfg: Arc<UpstreamConfig>, p: Prepared) -> Upstream {
    let launcher: client::Launcher =
        Arc::new(|| Err("an HTTP upstream is not launched".to_string()));
    Upstream {
        cfg,
        conn: Some(Connection::start(p.live, launcher, p.options)),
        error: None,
        secrets: p.secrets,
        oauth: p.oauth,
        workspace: None,
        proxy_port: p.proxy.as_ref().map(|p| p.port()),
        ids: None,
        group: Err("an HTTP upstream has no process".into()),
        budget: Err("an HTTP upstream has no workspace".into()),
        _proxy: p.proxy,
        _scratch: None,
        calls: AtomicUsize::new(0),
        instance: next_instance(),
    }
}

/// A stdio upstream: its workspace (with its byte budget), the uid:gid it runs as, its
/// control group, then its connection, which launches it confined.
fn start_stdio(
    config: &Arc<Config>,
    cfg: Arc<UpstreamConfig>,
    p: Prepared,
    own_uid: Option<u32>,
    stsd_exe: &Path,
    observe: bool,
) -> Upstream {
    let (workspace, scratch) = match workspace_dir(config, &cfg, observe) {
        Ok(w) => w,
        Err(e) => return not_started(&cfg, e, p.secrets),
    };
    let (uid, gid) = match run_as(config, own_uid) {
        Ok(ids) => ids,
        Err(e) => return not_started(&cfg, e, p.secrets),
    };
    if let Err(e) = super::spawn::program_reachable(&p.live, uid, gid) {
        return not_started(&cfg, e, p.secrets);
    }
    if let Err(e) = super::spawn::prepare_workspace(&workspace, uid, gid) {
        return not_started(
            &cfg,
            format!("workspace {}: {e}", workspace.display()),
            p.secrets,
        );
    }
    let budget = byte_budget(config, &cfg, &workspace, uid, gid);
    match &budget {
        // The tmpfs is a fresh, empty directory: it needs its tmp/ too.
        Ok(_) => {
            if let Err(e) = super::spawn::prepare_workspace(&workspace, uid, gid) {
                let error = format!("workspace {}: {e}", workspace.display());
                return not_started(&cfg, error, p.secrets);
            }
        }
        Err(e) => {
            tracing::warn!(upstream = %cfg.id, why = %e, "workspace without a byte budget")
        }
    }
    let group = match crate::cgroup::for_upstream(&config.cgroups, &cfg) {
        Ok(Some(g)) => Ok(g),
        Ok(None) => Err(crate::cgroup::describe()),
        Err(e) => return not_started(&cfg, e, p.secrets),
    };
    let ids = super::spawn::Ids {
        uid,
        gid,
        group: group.as_ref().ok().cloned(),
    };
    let launcher = stdio_launcher(&p, stsd_exe, &workspace, ids);
    let proxy_port = p.proxy.as_ref().map(|p| p.port());
    let conn = Connection::start(p.live, launcher, p.options);
    Upstream {
        cfg,
        conn: Some(conn),
        error: None,
        secrets: p.secrets,
        oauth: p.oauth,
        workspace: Some(workspace),
        proxy_port,
        ids: Some((uid, gid)),
        group,
        budget,
        _proxy: p.proxy,
        _scratch: scratch,
        calls: AtomicUsize::new(0),
        instance: next_instance(),
    }
}

/// A stdio upstream's workspace: the configured one, else its own under the state
/// directory; a preview's is temporary (the TempDir, removed when the preview ends).
fn workspace_dir(
    config: &Config,
    cfg: &UpstreamConfig,
    observe: bool,
) -> Result<(PathBuf, Option<tempfile::TempDir>), String> {
    match (&cfg.workspace, observe) {
        (Some(w), _) => Ok((w.clone(), None)),
        (None, true) => Ok((state_dir(config).join("upstreams").join(&cfg.id), None)),
        (None, false) => {
            let t = tempfile::Builder::new()
                .prefix("stsd-preview-")
                .tempdir()
                .map_err(|e| format!("a preview workspace: {e}"))?;
            Ok((t.path().join("ws"), Some(t)))
        }
    }
}

/// The uid:gid a stdio upstream runs as: its own (see `identity`), else `[worker]`'s; as
/// root with `[gateway] upstream_uid_count` set and no uid free, none.
fn run_as(config: &Config, own_uid: Option<u32>) -> Result<(u32, u32), String> {
    let root = is_root();
    match own_uid {
        Some(u) => Ok((u, u)),
        None if root && config.gateway.upstream_uid_count > 0 => Err(format!(
            "no free uid in [gateway] upstream_uid_first {} .. +{}",
            config.gateway.upstream_uid_first, config.gateway.upstream_uid_count
        )),
        None => Ok((config.worker.uid, config.worker.gid)),
    }
}

/// The workspace's tmpfs of `workspace_max_bytes` (the upstream's, else `[gateway]`'s), or
/// why it has none (0 turns it off).
fn byte_budget(
    config: &Config,
    cfg: &UpstreamConfig,
    workspace: &Path,
    uid: u32,
    gid: u32,
) -> Result<super::budget::Budget, String> {
    let bytes = cfg
        .workspace_max_bytes
        .unwrap_or(config.gateway.workspace_max_bytes);
    if bytes == 0 {
        Err("workspace_max_bytes = 0".to_string())
    } else {
        super::budget::mount(workspace, bytes, uid, gid)
    }
}

/// What starts (and restarts) a stdio upstream: confined in its workspace, as `ids`, with
/// a fresh channel to its egress proxy each time.
fn stdio_launcher(
    p: &Prepared,
    stsd_exe: &Path,
    workspace: &Path,
    ids: super::spawn::Ids,
) -> client::Launcher {
    let (c, exe, ws) = (
        p.live.clone(),
        stsd_exe.to_path_buf(),
        workspace.to_path_buf(),
    );
    let to_proxy = p.proxy.clone();
    Arc::new(move || {
        // Each start gets a channel of its own to the proxy: the forwarder in the
        // upstream's network namespace hands its connections over it.
        let end = match &to_proxy {
            Some(p) => {
                let (mine, theirs) = super::spawn::ProxyEnd::pair(p.port())
                    .map_err(|e| format!("egress proxy channel: {e}"))?;
                p.attach(mine)
                    .map_err(|e| format!("egress proxy channel: {e}"))?;
                Some(theirs)
            }
            None => None,
        };
        super::spawn::command_as(&c, c.env.clone(), &ws, end, &exe, ids.clone())
    })
}

fn cgroup_report(g: &Result<Arc<crate::cgroup::Group>, String>) -> Value {
    match g {
        Ok(g) => {
            let (l, u) = (g.limits(), g.usage());
            json!({
                "name": g.name(),
                "memoryMax": l.memory_bytes, "pidsMax": l.pids, "cpuPercent": l.cpu_percent,
                "memoryBytes": u.memory_bytes, "pids": u.pids,
            })
        }
        Err(why) => json!({"none": why}),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
