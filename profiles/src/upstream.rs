//! External MCP servers (upstreams) that the gateway connects to, confines, scores and
//! re-exposes: `[gateway]` (settings for all of them) and `[[upstream]]` (one table each).
//! The same upstreams can come from a CJSON toolsets document whose toolset kind is `mcp`;
//! both are lowered to [`UpstreamConfig`].
//!
//! String values in `env`, `headers` and `args` may hold `${env:NAME}` (the daemon's
//! environment) and `${secret:NAME}` (a file NAME in `[gateway] secrets_dir`, or the
//! environment variable NAME); the values are secrets: masked in every error, log and reply.

use crate::RiskLevel;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// `[gateway]`: how upstream tools are exposed and governed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Which tools the daemon serves: "own" (stsd's JS tools only), "upstream" (wrapped
    /// upstream tools only) or "both".
    pub exposure: Exposure,
    /// A poisoning-scan hit withholds the tool (otherwise it is reported and served).
    pub block_on_poisoning: bool,
    /// The fingerprint ledger covers stsd's own published specs too: a spec whose content
    /// changed since it was first seen is withheld until `stsd ledger approve`.
    pub ledger_own_specs: bool,
    /// Where the ledger lives (default: the state directory, see `stsd status`).
    pub state_dir: Option<PathBuf>,
    /// Files named after secrets, for `${secret:NAME}`.
    pub secrets_dir: Option<PathBuf>,
    /// Host patterns of known (catalog) servers: a user-typed URL whose host matches one
    /// scores trust 1 instead of 2 (seed 001). `*.example.com` matches subdomains.
    pub known_hosts: Vec<String>,
    /// Restart backoff for a stdio upstream that died: first delay, doubled up to the max.
    pub restart_initial_ms: u64,
    pub restart_max_ms: u64,
    /// When stsd runs as root, each stdio upstream runs as a uid of its own from
    /// `first..first+count` (uid = gid, as systemd's DynamicUser does), so the kernel
    /// separates their processes, signals, /proc and RLIMIT_NPROC. A uid some user or
    /// systemd already holds is skipped. `count = 0`: every upstream runs as `[worker] uid`.
    pub upstream_uid_first: u32,
    pub upstream_uid_count: u32,
    /// A stdio upstream's workspace is a tmpfs of this many bytes (the kernel refuses writes
    /// past it; its pages count against the upstream's memory). 0: a plain directory.
    pub workspace_max_bytes: u64,
    /// An upstream removed or changed on a running daemon (`stsd upstream remove|update|
    /// restart`, a SIGHUP): its calls in flight get this long to finish; what is still
    /// running then ends UPSTREAM_LOST, and the server's processes are killed.
    pub drain_seconds: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            exposure: Exposure::Both,
            block_on_poisoning: false,
            ledger_own_specs: true,
            state_dir: None,
            secrets_dir: None,
            known_hosts: Vec::new(),
            restart_initial_ms: 250,
            restart_max_ms: 30_000,
            upstream_uid_first: 61184,
            upstream_uid_count: 4336,
            workspace_max_bytes: 512 << 20,
            drain_seconds: 10,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Exposure {
    Own,
    Upstream,
    #[default]
    Both,
}

/// Seed 001's trust axis: a catalog entry's curation, or none (a user-typed server).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trust {
    VendorOfficial,
    Community,
    /// A catalog entry without curation (scores like an unknown server).
    None,
}

/// Seed 001's auth axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthKind {
    None,
    /// OAuth with the standard flow (scores like none).
    Oauth,
    ApiKey,
    Bearer,
    CustomOauth,
}

/// One `[[upstream]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Names the upstream in logs, the audit, the ledger and the CLI. `[a-z0-9_-]+`.
    pub id: String,
    /// stdio: the program and its arguments (the program is looked up on PATH).
    pub command: Option<String>,
    pub args: Vec<String>,
    /// stdio: the upstream's whole environment (nothing is inherited but PATH, HOME and
    /// LANG, which stsd sets).
    pub env: BTreeMap<String, String>,
    /// Streamable HTTP: the server's URL.
    pub url: Option<String>,
    /// Streamable HTTP: headers sent with every request.
    pub headers: BTreeMap<String, String>,
    /// The auth axis; when absent it is read off the headers (Authorization: Bearer ->
    /// bearer, an api-key-like header -> api-key, none -> none).
    pub auth: Option<AuthKind>,
    /// OAuth scopes granted to the connection (the privileged-scope floor reads them); an
    /// OAuth upstream (`url`, `auth = "oauth"`, no Authorization header) asks for them at
    /// `stsd upstream login`.
    pub oauth_scopes: Vec<String>,
    /// An OAuth upstream's client id registered with its authorization server out of band
    /// (a public client); absent: stsd registers itself (dynamic client registration).
    pub oauth_client_id: Option<String>,
    /// Catalog trust: "vendor-official", "community", "none" (a catalog entry without
    /// curation); absent: a server the operator typed in.
    pub trust: Option<Trust>,
    pub docs_url: Option<String>,
    pub docs_adequate: Option<bool>,
    /// stdio: the only directory the upstream may write (created if missing). Default: a
    /// directory of its own under the state directory.
    pub workspace: Option<PathBuf>,
    /// stdio: extra paths it may read (its own install tree is found from `command`).
    pub read_paths: Vec<PathBuf>,
    /// Hosts the upstream may reach, through stsd's egress proxy. Empty: no network at all.
    pub network: Vec<String>,
    /// Which upstream tools to expose (by their upstream names); absent: all of them.
    pub tools: Option<Vec<String>>,
    /// Which of the upstream's prompts to serve (by their upstream names); absent: all.
    pub prompts: Option<Vec<String>>,
    /// Which of its resources and resource templates to serve: URI prefixes (`file:///docs/`);
    /// absent: all; empty: none.
    pub resources: Option<Vec<String>>,
    /// Upstream tool name -> the name stsd serves it under.
    pub aliases: BTreeMap<String, String>,
    /// Upstream tool name -> the description stsd serves instead of the upstream's.
    pub descriptions: BTreeMap<String, String>,
    /// Per upstream tool name: whether a call needs approval first.
    pub approval: BTreeMap<String, bool>,
    /// Whether a call needs approval when `approval` does not name the tool.
    pub approval_default: Option<bool>,
    /// Tools whose composed risk is above this are not exposed.
    pub max_risk: Option<RiskLevel>,
    /// A call's deadline.
    pub timeout_ms: Option<u64>,
    /// A reply larger than this (its JSON text) is refused with OUTPUT_LIMIT.
    pub max_output_bytes: Option<u64>,
    /// stdio: this upstream's own limits, over `[cgroups] upstream_*` and `[gateway]
    /// workspace_max_bytes`.
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
    pub cpu_percent: Option<u32>,
    pub workspace_max_bytes: Option<u64>,
}

impl UpstreamConfig {
    pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
    pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 1 << 20;

    pub fn is_stdio(&self) -> bool {
        self.command.is_some()
    }

    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms.unwrap_or(Self::DEFAULT_TIMEOUT_MS)
    }

    pub fn max_output_bytes(&self) -> u64 {
        self.max_output_bytes
            .unwrap_or(Self::DEFAULT_MAX_OUTPUT_BYTES)
    }

    /// Structural checks the TOML types cannot express.
    pub fn check(&self) -> Result<(), String> {
        if self.id.is_empty()
            || !self
                .id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(format!(
                "upstream id {:?}: use lowercase letters, digits, - and _",
                self.id
            ));
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => Err(format!(
                "upstream {}: give command (stdio) or url (Streamable HTTP), not both",
                self.id
            )),
            (None, None) => Err(format!(
                "upstream {}: give command (stdio) or url (Streamable HTTP)",
                self.id
            )),
            (Some(c), None) if c.trim().is_empty() => {
                Err(format!("upstream {}: command is empty", self.id))
            }
            _ => Ok(()),
        }
    }
}
