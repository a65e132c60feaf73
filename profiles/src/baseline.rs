//! The operator's baseline policy (spec §10.2's second input), read from TOML.
//! Defaults equal the reference runtime's (reference-runtime.md §6).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stsd_protocol::NetworkMode;

/// The whole configuration file. Unknown keys are refused, so a typo cannot silently fall
/// back to a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub baseline: Baseline,
    pub runtime: RuntimeInfo,
    pub worker: WorkerConfig,
    pub daemon: DaemonConfig,
    pub egress: EgressConfig,
    pub approval: crate::approval::ApprovalConfig,
    pub metrics: MetricsConfig,
    pub telemetry: TelemetryConfig,
    pub http: HttpConfig,
    pub console: ConsoleConfig,
    pub gateway: crate::upstream::GatewayConfig,
    /// `[[upstream]]`: external MCP servers re-exposed through the gateway.
    pub upstream: Vec<crate::upstream::UpstreamConfig>,
    pub cgroups: CgroupConfig,
    pub store: StoreConfig,
    pub policy: PolicyConfig,
    /// `[[limits]]`: call rates, concurrent calls and CPU time, per principal, per tool, or
    /// per principal and tool (see [`LimitRule`]).
    pub limits: Vec<LimitRule>,
    /// `[secrets.NAME]`: how the secret `${NAME}` is handled at egress (by default the code
    /// gets a placeholder and the broker puts the value back for the tool's allowed hosts).
    pub secrets: std::collections::BTreeMap<String, SecretConfig>,
}

/// `[secrets.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct SecretConfig {
    /// The hosts the secret may go to (names or `*.apex`), narrower than the tool's
    /// allowlist (a host outside it is ignored). Unset: the tool's allowlist.
    pub hosts: Option<Vec<String>>,
    /// Give the value to the tool's code in clear (it computes on it): masking is then the
    /// only guard, as before placeholders.
    pub expose_to_code: bool,
}

/// One `[[limits]]` rule. It applies to a call when `principal` and `tool` match; each
/// principal has a budget of its own (`principal = "*"`: every principal, each its own), and
/// `tool = "*"` counts all tools together (a tool's name: that tool alone). Past any limit of
/// any rule that applies, a call is refused RATE_LIMITED with the time to wait. Counted in
/// memory, per daemon. A limit of 0 is no limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitRule {
    /// `uid:N`, an HTTP principal's name, or `*`.
    #[serde(default = "any")]
    pub principal: String,
    /// A tool's name, or `*`.
    #[serde(default = "any")]
    pub tool: String,
    #[serde(default)]
    pub calls_per_second: u32,
    /// Calls at once past the rate (default: one second's worth).
    #[serde(default)]
    pub burst: u32,
    /// Calls running or waiting at once.
    #[serde(default)]
    pub concurrent: u32,
    /// CPU time of the calls (their workers'), seconds in any hour.
    #[serde(default)]
    pub cpu_seconds_per_hour: u32,
}

fn any() -> String {
    "*".into()
}

/// `[policy]`: who may call what, as Cedar policies (see docs/src/policy.md). The default
/// policy is made from `[daemon] admin_uids`, `[approval] operator_uids`, `[http]
/// admin_principals` and `approver_principals`: anyone may list and call the served tools,
/// admins administer and read, operators approve and read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Cedar policy files, added to the default policy (or replacing it: `defaults`).
    pub files: Vec<PathBuf>,
    /// Whether the default policy is in force beside the files.
    pub defaults: bool,
    /// Named groups of principals (`uid:N` or an HTTP principal's name), for policies:
    /// `ops = ["alice", "uid:1000"]` is `Stsd::Group::"ops"`.
    pub groups: std::collections::BTreeMap<String, Vec<String>>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            files: Vec::new(),
            defaults: true,
            groups: Default::default(),
        }
    }
}

/// `[store]`: where the daemon's state is kept. Unset: an embedded SQLite file in the state
/// directory (`stsd.db`). A PostgreSQL URL: replicas share the managed catalog and the
/// ledger, and each sees another's change within a second (LISTEN/NOTIFY).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `postgresql://USER@HOST:PORT/DB` (no password in it: see `password_file`).
    pub url: Option<String>,
    /// A file holding the PostgreSQL password (a Kubernetes Secret mounted as a file).
    pub password_file: Option<PathBuf>,
    /// The PostgreSQL password as a reference, `${secret:NAME}` (a file in `[gateway]
    /// secrets_dir`, else the environment) or `${env:NAME}`; never the password itself.
    pub password: Option<String>,
    /// A replica not heard from for this long is gone: another records the calls it left
    /// waiting for an operator as expired (each replica says it is alive every third of it).
    pub replica_timeout_seconds: u64,
    /// PostgreSQL connections for the daemon's work (one more listens for the others'
    /// changes).
    pub pool_size: usize,
    /// PEM CA certificates that verify the PostgreSQL server's certificate (a managed
    /// PostgreSQL's bundle, a CloudNativePG cluster's CA); default: the Mozilla roots. TLS
    /// is asked for by the URL's `sslmode` (`require`, `verify-ca` and `verify-full` all
    /// verify the certificate and the host name; `prefer`, the default, uses TLS when the
    /// server offers it, verified the same way; `disable` never).
    pub ca_file: Option<PathBuf>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: None,
            password_file: None,
            password: None,
            replica_timeout_seconds: 30,
            pool_size: 4,
            ca_file: None,
        }
    }
}

/// `[cgroups]`: the worker pool (the zygote and every worker) and each stdio upstream (with
/// everything it starts) get a control group of their own with these limits, v2 where the
/// host's unified hierarchy has the controllers (under systemd: `Delegate=yes`), else v1.
/// A limit of 0 is no limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CgroupConfig {
    /// "auto": use them where the host gives them (the banner says when it does not);
    /// "required": refuse to start without them; "off".
    pub mode: CgroupMode,
    /// The pool's memory, all workers together (bytes).
    pub pool_memory_max: u64,
    /// The pool's processes and threads.
    pub pool_pids_max: u64,
    /// The pool's CPU, in percent of one core (0: no cap; calls are the daemon's work).
    pub pool_cpu_percent: u32,
    /// Each stdio upstream's memory with its children, tmpfs workspace pages included.
    pub upstream_memory_max: u64,
    pub upstream_pids_max: u64,
    pub upstream_cpu_percent: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    #[default]
    Auto,
    Required,
    Off,
}

impl Default for CgroupConfig {
    fn default() -> Self {
        CgroupConfig {
            mode: CgroupMode::Auto,
            pool_memory_max: 4 << 30,
            pool_pids_max: 1024,
            pool_cpu_percent: 0,
            upstream_memory_max: 2 << 30,
            upstream_pids_max: 256,
            upstream_cpu_percent: 100,
        }
    }
}

/// `[http]`: MCP over Streamable HTTP, off unless an address is given (here or `--listen`).
/// Every request is authenticated (a bearer token from `tokens_file`, or a client
/// certificate signed by `client_ca`); TLS unless the address is loopback or
/// `allow_plaintext` says a proxy in front terminates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `host:port` to listen on (e.g. "0.0.0.0:8443").
    pub listen: Option<String>,
    /// The MCP endpoint's path.
    pub path: String,
    /// PEM certificate chain and private key for TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates whose client certificates are accepted; the principal is the
    /// certificate subject's common name.
    pub client_ca: Option<PathBuf>,
    /// Lines `NAME sha256:HEX` (written by `stsd token add NAME`): each token's SHA-256 and
    /// the principal it stands for.
    pub tokens_file: Option<PathBuf>,
    /// Browser origins allowed to call (scheme://host[:port]); a request carrying any other
    /// `Origin` is refused with 403. Requests without `Origin` (non-browser clients) pass.
    pub allowed_origins: Vec<String>,
    /// `Host` header values accepted (DNS-rebinding guard). Empty: loopback names when
    /// listening on loopback, any host otherwise.
    pub allowed_hosts: Vec<String>,
    /// Plain HTTP on a non-loopback address, for a TLS-terminating proxy in front.
    pub allow_plaintext: bool,
    /// Serve 2025-11-25 clients (`initialize`, `Mcp-Session-Id`) besides the stateless
    /// 2026-07-28 era. A legacy session lives in one replica.
    pub legacy_sessions: bool,
    /// Principals allowed on the admin endpoint (`POST /admin`, the `stsd/...` methods).
    pub admin_principals: Vec<String>,
    /// Principals allowed to answer operator approvals there.
    pub approver_principals: Vec<String>,
    /// Longest request body accepted.
    pub max_request_bytes: usize,
    /// OAuth 2.1 access tokens (JWTs) from an authorization server, as the MCP
    /// authorization spec has it: stsd is the resource server.
    pub oauth: Option<OAuthConfig>,
}

/// `[http.oauth]`: stsd as an OAuth 2.1 resource server. A JWT access token is accepted when
/// its signature verifies against the issuer's JWKS, `iss` is `issuer`, `aud` names
/// `audience`, it has not expired, and it carries every scope in `scopes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server's issuer identifier (its metadata is found from it).
    pub issuer: String,
    /// This MCP endpoint as clients address it (the protected resource's identifier, RFC
    /// 8707/9728). Default: `http(s)://<listen address><path>`.
    #[serde(default)]
    pub resource: Option<String>,
    /// The `aud` a token must name. Default: the resource.
    #[serde(default)]
    pub audience: Option<String>,
    /// The issuer's JWKS. Default: `jwks_uri` from its metadata (RFC 8414, then OpenID
    /// Connect discovery).
    #[serde(default)]
    pub jwks_uri: Option<String>,
    /// Scopes every token must carry; advertised in the protected-resource metadata.
    #[serde(default)]
    pub scopes: Vec<String>,
    /// The claim that names the principal (`oauth:<value>` in policies). Default `sub`.
    #[serde(default = "default_principal_claim")]
    pub principal_claim: String,
    /// A claim holding the principal's groups (a list of strings, or one string).
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, seconds.
    #[serde(default = "default_leeway")]
    pub leeway_seconds: u64,
}

fn default_principal_claim() -> String {
    "sub".into()
}

fn default_groups_claim() -> String {
    "groups".into()
}

fn default_leeway() -> u64 {
    30
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: None,
            path: "/mcp".into(),
            tls_cert: None,
            tls_key: None,
            client_ca: None,
            tokens_file: None,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            allow_plaintext: false,
            legacy_sessions: true,
            admin_principals: Vec::new(),
            approver_principals: Vec::new(),
            max_request_bytes: 4 * 1024 * 1024,
            oauth: None,
        }
    }
}

/// `[metrics]`: Prometheus text over HTTP, off unless an address is given.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// `host:port` for `GET /metrics` (e.g. "127.0.0.1:9464"). Unset: no HTTP endpoint; the
    /// admin channel's `stsd/metrics` answers either way.
    pub listen: Option<String>,
}

/// `[console]`: the operator console's web pages (`/ui/`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Serve `/ui/` on the HTTP listener (`[http] listen`), beside MCP.
    pub enabled: bool,
    /// A loopback `host:port` that serves the console alone, for a daemon without an HTTP
    /// listener (a local one). Unset: none.
    pub listen: Option<String>,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            listen: None,
        }
    }
}

/// `[telemetry]`: OpenTelemetry traces, off unless an OTLP endpoint is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP traces endpoint, `http://collector:4318/v1/traces` (a URL without a
    /// path gets `/v1/traces`). Unset: no traces, and the spans cost a flag check.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "stsd".into(),
        }
    }
}

/// The supervisor's fetch broker (network egress). Host overrides, extra CAs and trusted
/// ranges are operator decisions; every call that relies on one says so in its audit record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Static host overrides, like curl's `--resolve`: host -> "ip:port" (always that port),
    /// or a bare "ip" (the URL's port, which must then be 80 or 443). The address is
    /// connected to without DNS and without the private-range rules; the tool's own host
    /// rules still apply.
    pub host_overrides: std::collections::BTreeMap<String, String>,
    /// PEM files of CA certificates trusted besides the bundled Mozilla roots.
    pub extra_ca_files: Vec<PathBuf>,
    /// CIDR ranges the private-address rules let through (private services), e.g. "10.20.0.0/16".
    pub trusted_ranges: Vec<String>,
    /// Response bodies larger than this are refused (reference: 10 MiB).
    pub max_body_bytes: u64,
    /// Request bodies a tool may send.
    pub max_request_body_bytes: u64,
    pub connect_timeout_ms: u64,
    /// The whole request: connect, TLS, headers, and every byte of the body.
    pub request_timeout_ms: u64,
    pub max_redirects: u32,
    /// Requests one call may make (every redirect hop counts).
    pub max_requests_per_call: u32,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            host_overrides: Default::default(),
            extra_ca_files: Vec::new(),
            trusted_ranges: Vec::new(),
            max_body_bytes: 10 * 1024 * 1024,
            max_request_body_bytes: 10 * 1024 * 1024,
            connect_timeout_ms: 5_000,
            request_timeout_ms: 30_000,
            max_redirects: 5,
            max_requests_per_call: 100,
        }
    }
}

/// The daemon (`stsd` with no subcommand).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Calls waiting for a worker beyond the running ones; more are answered OVERLOADED.
    pub queue_limit: usize,
    /// uids allowed to connect to the socket, besides the daemon's own.
    pub allowed_uids: Vec<u32>,
    /// A group given read/write on the socket (mode 0660 instead of 0600).
    pub socket_group: Option<u32>,
    /// The Unix socket, when `--socket` / `STSD_SOCKET` do not say (the client commands
    /// read it too, from the same config file). Unset: `$RUNTIME_DIRECTORY/stsd.sock`,
    /// `$XDG_RUNTIME_DIR/stsd.sock`, or `/run/stsd/stsd.sock` as root.
    pub socket: Option<PathBuf>,
    /// The audit log; unset: `$XDG_STATE_HOME/stsd/audit.jsonl`, `~/.local/state/stsd/...`,
    /// or `/var/log/stsd/audit.jsonl` when root.
    pub audit_log: Option<PathBuf>,
    /// SIGTERM/SIGINT: how long in-flight calls may finish before they are killed.
    pub shutdown_grace_seconds: u64,
    /// Open connections in total; at the bound the longest-idle session makes room.
    pub max_connections: usize,
    /// Open connections of one uid; at the bound that uid's longest-idle session makes room.
    pub max_connections_per_uid: usize,
    /// A session with nothing in flight is closed after this many seconds without a message
    /// (0: never). `stsd mcp` sends keepalives, so bridged sessions stay open.
    pub idle_timeout_seconds: u64,
    /// A new connection must send its first message within this time.
    pub first_message_timeout_ms: u64,
    /// Longest JSON-RPC message (one line); a longer one is answered -32600 and skipped.
    pub max_request_bytes: usize,
    /// Replies queued for a client that does not read them; beyond it the session stops
    /// reading its requests (backpressure).
    pub max_outbox_bytes: usize,
    /// Tools per `tools/list` page (MCP pagination: every page but the last holds exactly
    /// this many, `nextCursor` names the next). 0: the whole list in one page.
    pub list_page_size: usize,
    /// How long a session's reply queue may stay over its bound before it is closed.
    pub stall_timeout_ms: u64,
    /// Requests of one session read and not yet answered; beyond it the session stops reading.
    pub max_pending_requests: usize,
    /// Tool calls of one session admitted at once (running or waiting); more are OVERLOADED.
    pub max_calls_per_session: usize,
    /// CJSON toolsets documents (seed 003): per-tool `enabled` and `requiresApproval`.
    pub toolsets: Vec<PathBuf>,
    /// An argument string longer than this is audited as its length and SHA-256; error
    /// messages in the audit log are cut to this length too.
    pub audit_max_arg_bytes: usize,
    /// A call's arguments as audited, in all; beyond it they are one length and digest.
    pub audit_max_params_bytes: usize,
    /// The audit log's size budget: past it the file is rotated (`audit.jsonl.1`, ...).
    /// 0: no budget (rotated by logrotate and SIGHUP only).
    pub audit_max_bytes: u64,
    /// Rotated audit files kept; the one past them is deleted (its deletion recorded in the
    /// new file's first record).
    pub audit_keep: usize,
    /// Refused calls (an error before any worker ran them) written one by one, per
    /// principal and second; past it they are counted into one `refusals-summarised` record
    /// a second. 0: every refusal written.
    pub audit_refusals_per_second: u32,
    /// What a call gets when its audit record cannot be written (the log's filesystem full
    /// or failing): `auto` refuses (AUDIT_UNAVAILABLE) the calls of tools that need approval,
    /// write files or reach the network (and wrapped upstream tools), and serves the rest;
    /// `refuse` refuses every call; `serve` serves every call unrecorded. Each unrecorded
    /// call is counted, with one WARN a minute.
    pub audit_on_failure: AuditOnFailure,
    /// Calls a second one principal (an HTTP principal, else a local uid) may make, own and
    /// wrapped tools together; past it a call is refused OVERLOADED with the wait. 0: no
    /// limit (the default: a local agent is bounded by the pool and the queue).
    pub calls_per_second: u32,
    /// The calls a principal may make at once before the rate applies (0: one second's).
    pub call_burst: u32,
    /// uids allowed on the admin channel (`stsd/...` methods). Empty: root, and members of
    /// the `stsd-admin` group if it exists. The daemon's own uid is an admin only when listed
    /// here: for a per-user daemon that is the agent's uid too (the banner warns).
    pub admin_uids: Vec<u32>,
    /// The managed catalog `stsd tools add|update|...` write to (served besides `--catalog`).
    /// Unset: /var/lib/stsd/catalog as root, else $XDG_DATA_HOME/stsd/catalog.
    pub catalog_dir: Option<PathBuf>,
    /// Serve a `draft: false` spec only when it carries a record of a Local Pass of its
    /// content as it is now (`x-stsd-localPass`, written by `stsd test --write` and `stsd
    /// tools add|update`). A spec edited by hand afterwards is withheld until it passes again.
    pub require_local_pass: bool,
    /// Serve only the tools of this preset (seed 000 §17.8), by id (also `--preset`).
    pub preset: Option<String>,
    /// Where presets are read; unset: `default-tool-presets.json` in a `--catalog` directory
    /// (or beside a `--catalog` file).
    pub presets_file: Option<PathBuf>,
    /// Threads of the async runtime (connections, sessions, the gateway). 0: one per two
    /// CPUs, at least one (each one more wakes for every task queued and takes a CPU from
    /// the workers). Read at start.
    pub runtime_threads: usize,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            queue_limit: 1024,
            allowed_uids: Vec::new(),
            socket_group: None,
            socket: None,
            audit_log: None,
            shutdown_grace_seconds: 10,
            max_connections: 1024,
            max_connections_per_uid: 256,
            idle_timeout_seconds: 900,
            first_message_timeout_ms: 10_000,
            max_request_bytes: 16 * 1024 * 1024,
            max_outbox_bytes: 8 * 1024 * 1024,
            list_page_size: 100,
            stall_timeout_ms: 30_000,
            max_pending_requests: 256,
            max_calls_per_session: 64,
            toolsets: Vec::new(),
            audit_max_arg_bytes: 4096,
            audit_max_params_bytes: 65536,
            audit_max_bytes: 256 << 20,
            audit_keep: 4,
            audit_refusals_per_second: 20,
            audit_on_failure: AuditOnFailure::Auto,
            calls_per_second: 0,
            call_burst: 0,
            admin_uids: Vec::new(),
            catalog_dir: None,
            preset: None,
            presets_file: None,
            require_local_pass: true,
            runtime_threads: 0,
        }
    }
}

/// How worker processes are started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The unprivileged user a worker switches to when the daemon runs as root.
    pub uid: u32,
    pub gid: u32,
    /// Extra time after the deadline before the supervisor SIGKILLs a worker (the interrupt
    /// handler does not fire inside some C builtins).
    pub kill_grace_ms: u64,
    /// Reuse (`--worker-reuse K`): a parked worker waiting this long for another call of its
    /// tool is killed.
    pub reuse_idle_seconds: u64,
    /// Reuse: parked workers of all tools together; parking one more lets the longest-parked
    /// go. `None`: the pool size.
    pub reuse_max_parked: Option<usize>,
    /// How a worker is made: forked by the zygote (the default), or exec'd fresh (a new
    /// address-space layout per worker, at several times the cost).
    pub spawn: SpawnMode,
    /// The zygote is replaced by a freshly exec'd one after this many forks, so that
    /// workers do not share one address-space layout forever.
    pub zygote_max_forks: u32,
    /// How long a running zygote may take to answer a fork request, in milliseconds
    /// (a fork takes about one). Past it the zygote is taken for hung (stopped, or spinning):
    /// it is killed and replaced, and the call is served by the next one. A new zygote's
    /// first answer includes its own start and gets ten seconds.
    pub fork_timeout_ms: u64,
    /// One-shot: a call of a tool has pool workers primed for that tool's next calls
    /// (confined to its posture, its globals bound and its body compiled, before any
    /// argument exists). Each primed worker still serves one call.
    pub prime: bool,
    /// One-shot with priming: the primed workers of a tool are forked by a template of its
    /// posture (a process that applied the posture's rlimits and Landlock once and never
    /// runs tool code), so that each applies only the rest of its profile. Zygote mode only.
    pub template: bool,
    /// The zygote holds stsd's code in huge pages (a sealed memfd), so that a worker maps it
    /// with a few page-table entries instead of inheriting about a thousand. Making them costs
    /// the first zygote 13 to 16 ms, which a daemon's workers repay many times and one `stsd
    /// run` does not: it turns this off.
    pub huge_code: bool,
}

/// `[daemon] audit_on_failure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditOnFailure {
    #[default]
    Auto,
    Refuse,
    Serve,
}

/// `[worker] spawn`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpawnMode {
    #[default]
    Zygote,
    Exec,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            uid: 65534,
            gid: 65534,
            kill_grace_ms: 500,
            reuse_idle_seconds: 60,
            reuse_max_parked: None,
            spawn: SpawnMode::Zygote,
            zygote_max_forks: 1000,
            fork_timeout_ms: 1000,
            prime: true,
            template: true,
            huge_code: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Baseline {
    /// Shared with every tool that does not override them (its resolved lists are these).
    pub allow_classes: Arc<[String]>,
    pub deny_classes: Arc<[String]>,
    pub network_mode: NetworkMode,
    pub allowed_hosts: Vec<String>,
    pub file_read: bool,
    pub file_write: bool,
    /// `None`: stsd's own workspace (see [`default_workspace`]).
    pub fs_base_path: Option<PathBuf>,
    /// Where a spec's own `fsBasePath` may point, besides the base path above (and anything
    /// under it). A spec cannot name `/` or the operator's home and get Landlock to grant it.
    pub allowed_base_roots: Vec<PathBuf>,
    pub timeout_seconds: u64,
    pub max_steps: u64,
    pub memory_limit_mib: u64,
    /// Environment variables a spec's `${NAME}` may resolve: exact names, or prefixes written
    /// `PREFIX*` (`*` alone: all). Default: none, so no spec reads HOME, PATH or STSD_*.
    pub env_allow: Vec<String>,
    /// Bytes a write posture may write in one call (also the largest file: RLIMIT_FSIZE).
    pub max_write_bytes: u64,
    /// Files and directories a write posture may create in one call.
    pub max_files: u64,
}

impl Default for Baseline {
    fn default() -> Self {
        let shared = |v: &[&str]| v.iter().map(|c| c.to_string()).collect::<Arc<[_]>>();
        Baseline {
            allow_classes: shared(&[
                "java.lang.*",
                "java.math.*",
                "java.time.*",
                "java.util.*",
                "java.text.*",
            ]),
            deny_classes: shared(&[
                "java.lang.System",
                "java.lang.Runtime",
                "java.lang.ProcessBuilder",
                "java.lang.Process",
                "java.lang.Class",
                "java.lang.invoke.*",
                "java.lang.reflect.*",
                "java.lang.Thread",
                "java.lang.ThreadGroup",
                "java.lang.ClassLoader",
                "java.util.ServiceLoader",
                "java.util.spi.*",
            ]),
            network_mode: NetworkMode::Blocked,
            allowed_hosts: Vec::new(),
            file_read: false,
            file_write: false,
            fs_base_path: None,
            allowed_base_roots: Vec::new(),
            timeout_seconds: 30,
            max_steps: 5_000_000,
            memory_limit_mib: 128,
            env_allow: Vec::new(),
            max_write_bytes: 64 * 1024 * 1024,
            max_files: 1000,
        }
    }
}

impl Baseline {
    /// The process environment as specs may see it.
    pub fn env(&self) -> stsd_protocol::envvar::AllowedEnv<'_> {
        stsd_protocol::envvar::AllowedEnv {
            allow: &self.env_allow,
        }
    }

    /// The base path in force: the configured one, else the per-user default.
    pub fn fs_base_path(&self) -> PathBuf {
        self.fs_base_path.clone().unwrap_or_else(default_workspace)
    }

    /// Every root a base path may live under: the baseline's own base path first.
    pub fn base_roots(&self) -> Vec<PathBuf> {
        let mut roots = vec![self.fs_base_path()];
        roots.extend(self.allowed_base_roots.iter().cloned());
        roots
    }
}

/// Identity written into `toolSafety.runtime` (§10.3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeInfo {
    /// Shared by every tool's `toolSafety` (not a copy each).
    pub id: Arc<str>,
    pub min_version: Arc<str>,
    pub ecma_version: Arc<str>,
    pub category_source: Arc<str>,
}

impl Default for RuntimeInfo {
    fn default() -> Self {
        RuntimeInfo {
            id: "stsd/quickjs".into(),
            min_version: "0.1.0".into(),
            ecma_version: "2024".into(),
            category_source: "user".into(),
        }
    }
}

/// `$STATE_DIRECTORY/workspace` under systemd; `/var/lib/stsd/workspace` when running as root (workers run as an unprivileged user that
/// cannot enter root's home), else `$XDG_DATA_HOME/stsd/workspace`, else
/// `$HOME/.local/share/stsd/workspace`.
pub fn default_workspace() -> PathBuf {
    // The state directory systemd gives the service (the packaged unit's is /var/lib/stsd).
    if let Some(d) = std::env::var("STATE_DIRECTORY")
        .ok()
        .and_then(|v| v.split(':').next().map(PathBuf::from))
        .filter(|d| d.is_absolute())
    {
        return d.join("workspace");
    }
    if nix::unistd::Uid::effective().is_root() {
        return PathBuf::from(ROOT_WORKSPACE);
    }
    let non_empty = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = non_empty("XDG_DATA_HOME") {
        return PathBuf::from(d).join("stsd/workspace");
    }
    if let Some(h) = non_empty("HOME") {
        return PathBuf::from(h).join(".local/share/stsd/workspace");
    }
    PathBuf::from(ROOT_WORKSPACE)
}

pub const ROOT_WORKSPACE: &str = "/var/lib/stsd/workspace";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl Config {
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.check().map_err(|message| ConfigError::Invalid {
            path: path.to_path_buf(),
            message,
        })?;
        Ok(cfg)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text, path)
    }

    fn check(&self) -> Result<(), String> {
        self.approval.check()?;
        let mut ids = std::collections::BTreeSet::new();
        for u in &self.upstream {
            u.check()?;
            if !ids.insert(u.id.as_str()) {
                return Err(format!("two [[upstream]] tables have id {:?}", u.id));
            }
        }
        let b = &self.baseline;
        if let Some(p) = &b.fs_base_path {
            if !p.is_absolute() {
                return Err(format!(
                    "baseline.fs_base_path must be absolute, got {}",
                    p.display()
                ));
            }
        }
        for r in &b.allowed_base_roots {
            if !crate::resolve::is_plain_absolute(r) || r.parent().is_none() {
                return Err(format!(
                    "baseline.allowed_base_roots entries must be absolute, without `.` or `..`, and not `/`: {}",
                    r.display()
                ));
            }
        }
        if !(1..=86_400).contains(&self.worker.reuse_idle_seconds) {
            return Err("worker.reuse_idle_seconds must be between 1 and 86400".into());
        }
        if b.timeout_seconds == 0 || b.timeout_seconds > 3600 {
            return Err("baseline.timeout_seconds must be between 1 and 3600".into());
        }
        if b.max_steps == 0 {
            return Err("baseline.max_steps must be at least 1".into());
        }
        if !(8..=4096).contains(&b.memory_limit_mib) {
            return Err("baseline.memory_limit_mib must be between 8 and 4096".into());
        }
        let overlap: Vec<_> = b
            .allow_classes
            .iter()
            .filter(|c| b.deny_classes.contains(c))
            .collect();
        if !overlap.is_empty() {
            return Err(format!(
                "baseline allow_classes and deny_classes overlap: {overlap:?}"
            ));
        }
        self.check_egress()
    }

    fn check_egress(&self) -> Result<(), String> {
        let e = &self.egress;
        for (host, addr) in &e.host_overrides {
            if host.is_empty() || host.contains(['/', ':', '@', ' ']) {
                return Err(format!(
                    "egress.host_overrides: {host:?} is not a host name"
                ));
            }
            let ok = addr.parse::<std::net::SocketAddr>().is_ok()
                || addr.parse::<std::net::IpAddr>().is_ok();
            if !ok {
                return Err(format!(
                    "egress.host_overrides.{host:?} must be \"ip:port\" or \"ip\", got {addr:?}"
                ));
            }
        }
        for r in &e.trusted_ranges {
            let (a, p) = r.split_once('/').unwrap_or((r, ""));
            let ip: Result<std::net::IpAddr, _> = a.parse();
            let max = if matches!(ip, Ok(std::net::IpAddr::V4(_))) {
                32
            } else {
                128
            };
            let prefix_ok = p.is_empty() || p.parse::<u8>().is_ok_and(|n| n <= max);
            if ip.is_err() || !prefix_ok {
                return Err(format!(
                    "egress.trusted_ranges: {r:?} is not an address or CIDR range"
                ));
            }
        }
        if e.max_body_bytes == 0 || e.connect_timeout_ms == 0 || e.request_timeout_ms == 0 {
            return Err("egress limits and timeouts must be at least 1".into());
        }
        if e.max_redirects > 20 {
            return Err("egress.max_redirects must be at most 20".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_baseline_file_equals_the_built_in_defaults() {
        let text = include_str!("../baseline.toml");
        let cfg = Config::from_toml(text, Path::new("baseline.toml"));
        assert_eq!(cfg.ok(), Some(Config::default()));
    }

    #[test]
    fn empty_file_gives_defaults_and_typos_are_refused() {
        assert_eq!(
            Config::from_toml("", Path::new("x")).ok(),
            Some(Config::default())
        );
        let err = Config::from_toml("[baseline]\nnetwork_mod = \"open\"\n", Path::new("x"));
        assert!(err.is_err());
        let err = Config::from_toml("[baseline]\nfs_base_path = \"rel\"\n", Path::new("x"));
        assert!(err.is_err());
    }

    #[test]
    fn reference_defaults() {
        let b = Baseline::default();
        assert_eq!(b.network_mode, NetworkMode::Blocked);
        assert!(!b.file_read && !b.file_write);
        assert_eq!((b.timeout_seconds, b.max_steps), (30, 5_000_000));
        assert_eq!(b.deny_classes.len(), 12);
        assert_eq!(b.allow_classes.len(), 5);
    }
}
