//! The daemon's state that outlives a process: the managed catalog (each tool's served
//! version, its history, the operator's enable/disable switches) and the fingerprint
//! ledger. Every change is one transaction, so after any kill the daemon serves exactly the
//! last committed state: a `tools update` moves the old version to the history and installs
//! the new one, with the ledger's approval of its fingerprint, all or nothing.
//!
//! Two backends behind one [`Store`]: `sqlite` (the default: one file in the state
//! directory, `stsd.db`, no set-up) and `postgres` (`[store] url`: replicas share it, and
//! each sees another's change through LISTEN/NOTIFY). [`Store::open`] is the one entry point;
//! `import` brings an older state directory's loose files in on first start (kept, renamed,
//! never deleted).

pub mod export;
pub mod import;
mod postgres;
pub mod rows;
mod sqlite;
#[cfg(any(test, feature = "attack"))]
pub mod suite;
mod tls;

pub use rows::{crash_point, LedgerRow, LedgerRows, OnChange, ToolRows, Waiting};

use std::path::{Path, PathBuf};

/// The state directory: `[gateway] state_dir`, else `STSD_STATE_DIR`, else /var/lib/stsd
/// (root) or $XDG_STATE_HOME/stsd (~/.local/state/stsd).
pub fn dir(config: &stsd_profiles::Config) -> PathBuf {
    if let Some(d) = &config.gateway.state_dir {
        return d.clone();
    }
    if let Some(d) = std::env::var_os("STSD_STATE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    crate::paths::default_state_dir()
}

/// The secrets directory (`crate::secrets`): `[gateway] secrets_dir`, else `secrets` in
/// the state directory.
pub fn secrets_dir(config: &stsd_profiles::Config) -> PathBuf {
    config
        .gateway
        .secrets_dir
        .clone()
        .unwrap_or_else(|| dir(config).join("secrets"))
}

/// The store of a config: `stsd.db` in the state directory.
pub fn path(config: &stsd_profiles::Config) -> PathBuf {
    dir(config).join("stsd.db")
}

/// Who this daemon is in a store: `local` for the embedded one (one daemon per file); on a
/// shared one, an id kept in the state directory (`instance`), so that a restarted replica
/// finds what it left and never takes another's.
pub fn instance(config: &stsd_profiles::Config) -> String {
    if config.store.url.is_none() {
        return "local".into();
    }
    let file = dir(config).join("instance");
    if let Ok(id) = std::fs::read_to_string(&file) {
        let id = id.trim();
        if !id.is_empty() {
            return id.to_string();
        }
    }
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    let id: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let _ = std::fs::create_dir_all(dir(config));
    let _ = crate::store::write_atomic(&file, id.as_bytes());
    id
}

/// The PostgreSQL password: read from `[store] password_file`, or resolved from the
/// reference in `[store] password`.
fn password(config: &stsd_profiles::Config) -> Result<Option<String>, String> {
    let store = &config.store;
    match (&store.password, &store.password_file) {
        (Some(_), Some(_)) => Err("[store] password and password_file: give one of them".into()),
        (Some(p), None) => {
            if !(p.starts_with("${") && p.ends_with('}')) {
                return Err("[store] password must be a reference, ${secret:NAME} or \
                            ${env:NAME}, not the password itself (or use password_file)"
                    .into());
            }
            let mut found = crate::refs::Resolved::default();
            crate::refs::resolve_refs(p, Some(&secrets_dir(config)), &mut found)
                .map(Some)
                .map_err(|e| format!("[store] password: {e}"))
        }
        (None, Some(p)) => std::fs::read_to_string(p)
            .map(|v| Some(v.trim_end_matches(['\n', '\r']).to_string()))
            .map_err(|e| format!("[store] password_file {}: {e}", p.display())),
        (None, None) => Ok(None),
    }
}

/// The state store.
pub struct Store {
    /// What it is, for messages: the SQLite file, or the PostgreSQL URL without a password.
    label: PathBuf,
    backend: Backend,
    /// Operations asked of it since start (`stsd metrics` `storeOps`): the call path should
    /// ask none for a published tool that needs no approval.
    ops: std::sync::atomic::AtomicU64,
}

enum Backend {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("at", &self.label).finish()
    }
}

/// Calls `$m` on whichever backend the store has, as blocking work (see [`blocking`]).
macro_rules! each {
    ($s:expr, $b:ident => $e:expr) => {{
        $s.ops.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        blocking(|| match &$s.backend {
            Backend::Sqlite($b) => $e,
            Backend::Postgres($b) => $e,
        })
    }};
}

/// Runs a store operation, which blocks (a round trip to PostgreSQL, an fsync of SQLite).
/// On a thread of the daemon's multi-threaded runtime the runtime is told first
/// (`block_in_place`), so its other tasks move to another thread: one slow store operation
/// (an admin's update, a database that stopped answering) must not stall every connection
/// (with 2 cores the runtime has one thread). Elsewhere it just runs.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl Store {
    /// The embedded store at `path` (opened, created, its schema brought up to date).
    pub fn open(path: &Path) -> Result<Store, String> {
        Ok(Store {
            label: path.to_path_buf(),
            backend: Backend::Sqlite(sqlite::Sqlite::open(path)?),
            ops: Default::default(),
        })
    }

    /// The store of a config: PostgreSQL when `[store] url` is set, else the embedded file
    /// in the state directory.
    pub fn of_config(config: &stsd_profiles::Config) -> Result<Store, String> {
        match &config.store.url {
            Some(url) => {
                let password = password(config)?;
                let pg = postgres::Postgres::open(
                    url,
                    password,
                    config.store.pool_size,
                    config.store.ca_file.as_deref(),
                )?;
                Ok(Store {
                    label: PathBuf::from(pg.label()),
                    backend: Backend::Postgres(pg),
                    ops: Default::default(),
                })
            }
            None => Store::open(&path(config)),
        }
    }

    /// The SQLite file, or the PostgreSQL URL without its password.
    pub fn path(&self) -> &Path {
        &self.label
    }

    /// Operations asked of it since start.
    pub fn operations(&self) -> u64 {
        self.ops.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether it answered its last request (or ping): the embedded store always does.
    pub fn reachable(&self) -> bool {
        match &self.backend {
            Backend::Sqlite(_) => true,
            Backend::Postgres(pg) => pg.reachable(),
        }
    }

    /// Whether replicas share it (PostgreSQL).
    pub fn shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// `f` runs (on a thread of its own) after another process changed the store: a
    /// replica's `tools add`, a ledger approval. The embedded store has one daemon: never.
    pub fn on_change(&self, f: OnChange) {
        if let Backend::Postgres(pg) = &self.backend {
            pg.on_change(f);
        }
    }

    pub fn tools(&self) -> Result<ToolRows, String> {
        each!(self, b => b.tools())
    }

    pub fn has_tool(&self, name: &str) -> Result<bool, String> {
        each!(self, b => b.has_tool(name))
    }

    /// Installs `doc` as `name`'s served version, its current one (if any) moved to the
    /// history, and (when given) the ledger's approval of the new fingerprint: one
    /// transaction.
    pub fn install(
        &self,
        name: &str,
        doc: &[u8],
        ledger: Option<LedgerRow<'_>>,
    ) -> Result<(), String> {
        each!(self, b => b.install(name, doc, ledger))
    }

    /// Puts `name`'s newest earlier version back in place (the current one is dropped), with
    /// the ledger row `ledger` makes of it: one transaction. The restored document is returned.
    pub fn rollback(
        &self,
        name: &str,
        ledger: impl FnOnce(&[u8]) -> Option<(String, String)>,
    ) -> Result<Vec<u8>, String> {
        each!(self, b => b.rollback(name, ledger))
    }

    /// Retires `name`: its served version goes to the history (so `rollback` restores it),
    /// and its switch is cleared.
    pub fn remove(&self, name: &str) -> Result<(), String> {
        each!(self, b => b.remove(name))
    }

    /// Earlier versions of `name`, oldest first: (when retired, document).
    pub fn history(&self, name: &str) -> Result<Vec<(i64, Vec<u8>)>, String> {
        each!(self, b => b.history(name))
    }

    /// Every earlier version of every tool, oldest first: (name, when retired, document).
    pub fn all_history(&self) -> Result<Vec<(String, i64, Vec<u8>)>, String> {
        each!(self, b => b.all_history())
    }

    /// The operator's switch for a tool (any tool of the catalog, managed or not).
    pub fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), String> {
        each!(self, b => b.set_enabled(name, enabled))
    }

    /// The tools the operator disabled, by name.
    pub fn disabled(&self) -> Result<Vec<String>, String> {
        each!(self, b => b.disabled())
    }

    pub fn ledger(&self) -> Result<LedgerRows, String> {
        each!(self, b => b.ledger())
    }

    /// Writes ledger changes in one transaction: entries upserted or (None) deleted, and
    /// servers' last use.
    pub fn write_ledger(
        &self,
        tools: &[(String, Option<String>)],
        servers: &[(String, i64)],
    ) -> Result<(), String> {
        each!(self, b => b.write_ledger(tools, servers))
    }

    /// Spends a single-use approval state (its nonce) until `expires_ms`: true for the first
    /// to spend it, of every daemon sharing the store; false after.
    pub fn spend(&self, nonce: &str, expires_ms: i64) -> Result<bool, String> {
        each!(self, b => b.spend(nonce, expires_ms))
    }

    /// A call of this daemon (`instance`) waits for an operator: kept until it leaves. Its
    /// ticket (the id an operator answers) is returned.
    pub fn waiting_put(&self, instance: &str, id: i64, view: &str) -> Result<i64, String> {
        each!(self, b => b.waiting_put(instance, id, view))
    }

    /// Every call waiting for an operator and not yet decided, on any daemon sharing it.
    pub fn waiting_list(&self) -> Result<Vec<Waiting>, String> {
        each!(self, b => b.waiting_list())
    }

    /// An operator's decision (JSON) for the call with `ticket`, wherever it waits: true
    /// when it was waiting and undecided (the daemon holding it is told), false otherwise.
    pub fn waiting_decide(&self, ticket: i64, decision: &str) -> Result<bool, String> {
        each!(self, b => b.waiting_decide(ticket, decision))
    }

    /// Decisions made elsewhere for this daemon's waiting calls: (ticket, decision JSON).
    pub fn waiting_decided(&self, instance: &str) -> Result<Vec<(i64, String)>, String> {
        each!(self, b => b.waiting_decided(instance))
    }

    /// This daemon is alive (a heartbeat); the waiting calls of daemons not seen for
    /// `stale_ms` are taken out and returned, for their records.
    pub fn seen(&self, instance: &str, stale_ms: i64) -> Result<Vec<Waiting>, String> {
        each!(self, b => b.seen(instance, stale_ms))
    }

    /// The call left the queue (answered, timed out, its caller gone).
    pub fn waiting_del(&self, instance: &str, id: i64) -> Result<(), String> {
        each!(self, b => b.waiting_del(instance, id))
    }

    /// The calls `instance` left waiting when it died, taken out: (id, view, since ms).
    pub fn waiting_take(&self, instance: &str) -> Result<Vec<(i64, String, i64)>, String> {
        each!(self, b => b.waiting_take(instance))
    }

    /// HTTP bearer tokens: (principal, SHA-256 digest in hex), by principal.
    pub fn tokens(&self) -> Result<Vec<(String, String)>, String> {
        each!(self, b => b.tokens())
    }

    /// Adds tokens (digests) in one transaction; one already there is left as it is.
    pub fn tokens_add(&self, tokens: &[(String, String)]) -> Result<(), String> {
        each!(self, b => b.tokens_add(tokens))
    }

    /// Removes every token of principal `name`: how many there were.
    pub fn tokens_rm(&self, name: &str) -> Result<usize, String> {
        each!(self, b => b.tokens_rm(name))
    }

    /// Upstreams added at run time: (id, its `[[upstream]]` entry as JSON), by id.
    pub fn upstreams(&self) -> Result<Vec<(String, String)>, String> {
        each!(self, b => b.upstreams())
    }

    /// Adds or replaces the upstream `id` (its entry as JSON, references unresolved).
    pub fn upstream_put(&self, id: &str, config: &str) -> Result<(), String> {
        each!(self, b => b.upstream_put(id, config))
    }

    /// Removes the upstream `id`: whether it was there.
    pub fn upstream_del(&self, id: &str) -> Result<bool, String> {
        each!(self, b => b.upstream_del(id))
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>, String> {
        each!(self, b => b.meta(key))
    }

    /// Brings `old` in, in one transaction, unless the store imported before (then false).
    fn import(&self, old: &rows::Old) -> Result<bool, String> {
        each!(self, b => b.import(old))
    }
}

#[cfg(test)]
mod tests;
