//! The shared backend: PostgreSQL through the `postgres` crate, for replicas behind a load
//! balancer. Every change is one transaction that ends with `NOTIFY stsd_state`; each
//! replica LISTENs, and on another's notification its `on_change` callbacks run (the daemon
//! re-reads the catalog and the ledger and tells its clients). The schema is migrated at
//! start under an advisory lock, so replicas starting together migrate once.
//!
//! A pool of connections, each owned by a thread of its own (the `postgres` client must not
//! run inside the daemon's async runtime, so a pool that hands connections to the callers'
//! threads, as r2d2 does, does not fit): callers hand a job to the pool's queue and wait for
//! the answer; whichever connection is free runs it. One more connection only LISTENs (and
//! pings, for readiness). A lost connection is made again at its next job; until then jobs
//! fail fast (the daemon keeps serving the catalog it has).

use super::rows::{crash_point, LedgerRow, LedgerRows, Old, OnChange, ToolRows, Waiting, DONE};
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls, Transaction};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The channel every change is announced on.
const CHANNEL: &str = "stsd_state";
/// The advisory lock migrations run under ("stsd" in ASCII).
const MIGRATE_LOCK: i64 = 0x7374_7364;

/// The schema, by version (`stsd_schema.version`), as the embedded backend's.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE tools (
        name TEXT PRIMARY KEY,
        doc BYTEA NOT NULL,
        installed_ms BIGINT NOT NULL
     );
     CREATE TABLE tool_history (
        seq BIGSERIAL PRIMARY KEY,
        name TEXT NOT NULL,
        doc BYTEA NOT NULL,
        retired_ms BIGINT NOT NULL
     );
     CREATE INDEX tool_history_name ON tool_history (name, seq);
     CREATE TABLE switches (
        name TEXT PRIMARY KEY,
        enabled BOOLEAN NOT NULL
     );
     CREATE TABLE ledger (
        id TEXT PRIMARY KEY,
        entry TEXT NOT NULL
     );
     CREATE TABLE ledger_servers (
        id TEXT PRIMARY KEY,
        last_used_ms BIGINT NOT NULL
     );
     CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
     );",
    // 2: approval states spent (single use, across the replicas).
    "CREATE TABLE spent_states (
        nonce TEXT PRIMARY KEY,
        expires_ms BIGINT NOT NULL
     );",
    // 3: calls waiting for an operator, so a daemon that died leaves a trace of them.
    "CREATE TABLE waiting (
        instance TEXT NOT NULL,
        id BIGINT NOT NULL,
        view TEXT NOT NULL,
        since_ms BIGINT NOT NULL,
        PRIMARY KEY (instance, id)
     );",
    // 4: an operator's decision made on any replica, for the one holding the call (`ticket`,
    // from a sequence: the id `stsd approvals` shows, unique across the replicas); and when
    // each replica was last seen, so the calls of one gone for good are recorded.
    "CREATE SEQUENCE waiting_tickets;
     ALTER TABLE waiting ADD COLUMN ticket BIGINT UNIQUE;
     ALTER TABLE waiting ADD COLUMN decision TEXT;
     CREATE TABLE replicas (
        instance TEXT PRIMARY KEY,
        seen_ms BIGINT NOT NULL
     );",
    // 5: HTTP bearer tokens, as digests (the token itself is shown once, never kept).
    "CREATE TABLE tokens (
        digest TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_ms BIGINT NOT NULL
     );",
    // 6: upstreams added at run time, each its `[[upstream]]` entry as JSON.
    "CREATE TABLE upstreams (
        id TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        updated_ms BIGINT NOT NULL
     );",
];

type Job = Box<dyn FnOnce(Result<&mut Client, String>) + Send>;
type Listeners = Arc<Mutex<Vec<Arc<OnChange>>>>;

pub struct Postgres {
    label: String,
    jobs: Mutex<mpsc::Sender<Job>>,
    listeners: Listeners,
    /// Whether the connection answered its last job or ping.
    up: Arc<AtomicBool>,
    /// The listening thread runs while this lives.
    _alive: Arc<()>,
}

/// How often an idle connection is pinged (so readiness and the metric follow the server).
const PING_EVERY: Duration = Duration::from_secs(2);

fn pg(e: postgres::Error) -> String {
    // The causes too: a TLS failure's reason (an unknown issuer, a name mismatch) is one.
    let mut text = format!("PostgreSQL: {e}");
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

/// `url` with any password in it left out, for messages.
fn label_of(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let user = &url[s + 3..at];
            let user = user.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..s + 3], &url[at + 1..])
        }
        _ => url.to_string(),
    }
}

/// One connection, and its own backend pid (its notifications are not another replica's
/// change). The listener's also brings the schema up to date and LISTENs.
fn connect(
    url: &str,
    password: Option<&str>,
    tls: Option<&MakeRustlsConnect>,
    listen: bool,
) -> Result<(Client, i32), String> {
    let mut cfg: postgres::Config = url.parse().map_err(pg)?;
    if let Some(p) = password {
        cfg.password(p);
    }
    cfg.connect_timeout(Duration::from_secs(5));
    cfg.application_name("stsd");
    let mut client = match tls {
        Some(t) => cfg.connect(t.clone()),
        None => cfg.connect(NoTls),
    }
    .map_err(pg)?;
    if listen {
        migrate(&mut client)?;
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .map_err(pg)?;
    }
    let me: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .map_err(pg)?
        .get(0);
    Ok((client, me))
}

fn migrate(client: &mut Client) -> Result<(), String> {
    let mut tx = client.transaction().map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .map_err(pg)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS stsd_schema (version INTEGER NOT NULL)")
        .map_err(pg)?;
    let at: Option<i32> = tx
        .query_opt("SELECT version FROM stsd_schema", &[])
        .map_err(pg)?
        .map(|r| r.get(0));
    let version = at.unwrap_or(0).max(0) as usize;
    if version > MIGRATIONS.len() {
        return Err(format!(
            "PostgreSQL: schema version {version} is newer than this stsd reads ({})",
            MIGRATIONS.len()
        ));
    }
    for step in &MIGRATIONS[version..] {
        tx.batch_execute(step).map_err(pg)?;
    }
    let now = MIGRATIONS.len() as i32;
    if at.is_some() {
        tx.execute("UPDATE stsd_schema SET version = $1", &[&now])
    } else {
        tx.execute("INSERT INTO stsd_schema (version) VALUES ($1)", &[&now])
    }
    .map_err(pg)?;
    tx.commit().map_err(pg)
}

/// What the pool's threads share.
#[derive(Clone)]
struct Shared {
    url: String,
    password: Option<String>,
    /// None: `sslmode=disable`.
    tls: Option<MakeRustlsConnect>,
    listeners: Listeners,
    up: Arc<AtomicBool>,
    /// The backend pids of this daemon's own connections: their notifications are its own.
    own: Arc<Mutex<std::collections::HashSet<i32>>>,
    /// Bumped each time the listener finds the server gone: a pooled connection made before
    /// is dead too (a crashed server's connections look open until used), so it is made
    /// again before its next job rather than failing that job.
    lost: Arc<std::sync::atomic::AtomicU64>,
}

impl Shared {
    fn connect(&self, listen: bool, was: Option<i32>) -> Result<(Client, i32), String> {
        let (c, me) = connect(
            &self.url,
            self.password.as_deref(),
            self.tls.as_ref(),
            listen,
        )?;
        let mut own = self.own.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = was {
            own.remove(&old);
        }
        own.insert(me);
        Ok((c, me))
    }

    fn is_own(&self, pid: i32) -> bool {
        self.own
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&pid)
    }
}

/// A pool thread: runs the queue's jobs on its connection, made (again) when needed. After a
/// failed connect, while the server is down, jobs fail at once for a ping interval rather
/// than each wait out a connect timeout.
fn work(sh: Shared, jobs: Arc<Mutex<mpsc::Receiver<Job>>>) {
    let mut conn: Option<(Client, i32)> = None;
    let mut was: Option<i32> = None;
    let mut failed: Option<Instant> = None;
    let mut made_at = 0u64;
    loop {
        let job = {
            let rx = jobs.lock().unwrap_or_else(|e| e.into_inner());
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let lost = sh.lost.load(Ordering::Relaxed);
        if made_at != lost || conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            conn = None;
            // Unless the listener has seen the server answer since.
            let down = !sh.up.load(Ordering::Relaxed);
            if down && failed.is_some_and(|t| t.elapsed() < PING_EVERY) {
                job(Err(
                    "PostgreSQL is unreachable (retrying in the background)".into(),
                ));
                continue;
            }
            match sh.connect(false, was) {
                Ok(c) => {
                    failed = None;
                    was = Some(c.1);
                    made_at = lost;
                    conn = Some(c);
                }
                Err(e) => {
                    failed = Some(Instant::now());
                    mark(&sh.up, false, &e);
                    job(Err(e));
                    continue;
                }
            }
        }
        let Some((c, _)) = conn.as_mut() else {
            continue;
        };
        job(Ok(c));
        let alive = !c.is_closed();
        mark(&sh.up, alive, "the connection closed");
        if !alive {
            conn = None;
        }
    }
}

/// The listening connection's thread: hands other replicas' notifications to the listeners,
/// pings (so readiness and the metric follow the server), and makes the connection again
/// when it was lost. Ends when the pool is dropped (`alive` gone).
fn listen(sh: Shared, first: (Client, i32), alive: std::sync::Weak<()>) {
    let mut conn: Option<(Client, i32)> = Some(first);
    let mut was = conn.as_ref().map(|c| c.1);
    let mut last = Instant::now();
    while alive.strong_count() > 0 {
        let Some((c, _)) = conn.as_mut() else {
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() >= PING_EVERY {
                last = Instant::now();
                match sh.connect(true, was) {
                    Ok(c) => {
                        was = Some(c.1);
                        mark(&sh.up, true, "");
                        conn = Some(c);
                        // Whatever changed while it was away: read it all again.
                        changed(
                            &sh,
                            vec![
                                "catalog".into(),
                                "ledger".into(),
                                "tokens".into(),
                                "upstreams".into(),
                                "decision".into(),
                            ],
                        );
                    }
                    Err(e) => mark(&sh.up, false, &e),
                }
            }
            continue;
        };
        if last.elapsed() >= PING_EVERY {
            last = Instant::now();
            if let Err(e) = c.simple_query("SELECT 1") {
                mark(&sh.up, false, &pg(e));
                sh.lost.fetch_add(1, Ordering::Relaxed);
                conn = None;
                continue;
            }
            mark(&sh.up, true, "");
        }
        let mut what: Vec<String> = Vec::new();
        {
            let mut n = c.notifications();
            // A timed wait, not `iter()`: the client's I/O is read only while its runtime
            // turns, and `iter()` never lets it (a notification would sit in the socket for
            // good). The first wait is the loop's tick; after a notification, only what is
            // already there.
            let mut wait = Duration::from_millis(100);
            loop {
                let note = match n.timeout_iter(wait).next() {
                    Ok(Some(note)) => note,
                    Ok(None) => break,
                    Err(e) => {
                        tracing::debug!(error = %e, "waiting for notifications failed");
                        break;
                    }
                };

                wait = Duration::from_millis(2);
                if !sh.is_own(note.process_id()) && !what.iter().any(|w| w == note.payload()) {
                    what.push(note.payload().to_string());
                }
            }
        }
        if c.is_closed() {
            mark(&sh.up, false, "the connection closed");
            sh.lost.fetch_add(1, Ordering::Relaxed);
            conn = None;
        }
        if !what.is_empty() {
            changed(&sh, what);
        }
    }
}

/// Runs the listeners for a change another replica made.
fn changed(sh: &Shared, what: Vec<String>) {
    tracing::debug!(?what, "the state store changed (another replica)");
    let ls: Vec<Arc<OnChange>> = sh
        .listeners
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    if ls.is_empty() {
        return;
    }
    // On a thread of their own: a listener reads the store, which may need every
    // connection of the pool.
    let _ = std::thread::Builder::new()
        .name("stsd-store-change".into())
        .spawn(move || {
            for l in ls {
                l(&what);
            }
        });
}

/// Records whether the store answers, saying so when that changes: a WARN when it is lost
/// (the daemon keeps serving the catalog it has), an INFO when it is back.
fn mark(up: &AtomicBool, now: bool, why: &str) {
    let was = up.swap(now, Ordering::Relaxed);
    if was && !now {
        tracing::warn!(
            error = why,
            "the state store is unreachable: serving the catalog in force; changes wait for it"
        );
    } else if !was && now {
        tracing::info!("the state store answers again");
    }
}

/// Announces a change to the other replicas (delivered when the transaction commits).
fn notify(tx: &mut Transaction<'_>, what: &str) -> Result<(), String> {
    tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &what])
        .map(|_| ())
        .map_err(pg)
}

fn put_token(tx: &mut Transaction<'_>, name: &str, digest: &str, now: i64) -> Result<(), String> {
    tx.execute(
        "INSERT INTO tokens (digest, name, created_ms) VALUES ($1, $2, $3)
         ON CONFLICT (digest) DO NOTHING",
        &[&digest, &name, &now],
    )
    .map(|_| ())
    .map_err(pg)
}

fn waiting_row(r: &postgres::Row) -> Waiting {
    Waiting {
        ticket: r.get(0),
        instance: r.get(1),
        id: r.get(2),
        view: r.get(3),
        since_ms: r.get(4),
    }
}

fn retire(tx: &mut Transaction<'_>, name: &str, now: i64) -> Result<bool, String> {
    let moved = tx
        .execute(
            "INSERT INTO tool_history (name, doc, retired_ms)
             SELECT name, doc, $2 FROM tools WHERE name = $1",
            &[&name, &now],
        )
        .map_err(pg)?;
    tx.execute("DELETE FROM tools WHERE name = $1", &[&name])
        .map_err(pg)?;
    Ok(moved > 0)
}

fn put_ledger(tx: &mut Transaction<'_>, id: &str, entry: &str) -> Result<(), String> {
    tx.execute(
        "INSERT INTO ledger (id, entry) VALUES ($1, $2)
         ON CONFLICT (id) DO UPDATE SET entry = excluded.entry",
        &[&id, &entry],
    )
    .map(|_| ())
    .map_err(pg)
}

impl Postgres {
    /// Connects (failing at once when PostgreSQL cannot be reached or migrated), then hands
    /// the connection to its thread.
    pub fn open(
        url: &str,
        password: Option<String>,
        pool: usize,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Postgres, String> {
        let label = label_of(url);
        let (url, tls) = super::tls::of(url, ca_file)?;
        let sh = Shared {
            url,
            password,
            tls,
            listeners: Arc::default(),
            up: Arc::new(AtomicBool::new(true)),
            own: Arc::default(),
            lost: Arc::default(),
        };
        // The listener's connection first: it migrates, and a store that cannot be reached
        // at start is a failed start. Made on its thread: the caller may be async.
        let alive = Arc::new(());
        let (l, weak) = (sh.clone(), Arc::downgrade(&alive));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        std::thread::Builder::new()
            .name("stsd-store-listen".into())
            .spawn(move || match l.connect(true, None) {
                Ok(first) => {
                    let _ = ready_tx.send(Ok(()));
                    listen(l, first, weak);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .map_err(|e| format!("state store thread: {e}"))?;
        ready_rx
            .recv()
            .map_err(|_| "state store thread went away".to_string())?
            .map_err(|e| format!("{label}: {e}"))?;
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..pool.max(1) {
            let (w, rx) = (sh.clone(), rx.clone());
            std::thread::Builder::new()
                .name(format!("stsd-store-{i}"))
                .spawn(move || work(w, rx))
                .map_err(|e| format!("state store thread: {e}"))?;
        }
        Ok(Postgres {
            label,
            jobs: Mutex::new(tx),
            listeners: sh.listeners,
            up: sh.up,
            _alive: alive,
        })
    }

    pub fn reachable(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn on_change(&self, f: OnChange) {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(f));
    }

    /// Runs `f` on the connection's thread and waits for its answer.
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Client) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move |c| {
            let _ = tx.send(c.and_then(f));
        });
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(job)
            .map_err(|_| format!("{}: the store's thread is gone", self.label))?;
        rx.recv()
            .map_err(|_| format!("{}: the store's thread is gone", self.label))?
    }

    /// Runs `f` in one transaction that announces `what` when it commits.
    fn write<T: Send + 'static>(
        &self,
        what: &'static str,
        f: impl FnOnce(&mut Transaction<'_>) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        self.run(move |c| {
            let mut tx = c.transaction().map_err(pg)?;
            let out = f(&mut tx)?;
            notify(&mut tx, what)?;
            tx.commit().map_err(pg)?;
            Ok(out)
        })
    }

    pub fn tools(&self) -> Result<ToolRows, String> {
        self.run(|c| {
            Ok(c.query("SELECT name, doc FROM tools ORDER BY name", &[])
                .map_err(pg)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
    }

    pub fn has_tool(&self, name: &str) -> Result<bool, String> {
        let name = name.to_string();
        self.run(move |c| {
            c.query_opt("SELECT 1 FROM tools WHERE name = $1", &[&name])
                .map(|r| r.is_some())
                .map_err(pg)
        })
    }

    pub fn install(
        &self,
        name: &str,
        doc: &[u8],
        ledger: Option<LedgerRow<'_>>,
    ) -> Result<(), String> {
        let (name, doc) = (name.to_string(), doc.to_vec());
        let ledger = ledger.map(|l| (l.id.to_string(), l.entry.to_string()));
        let now = crate::store::now_ms();
        self.write("catalog", move |tx| {
            retire(tx, &name, now)?;
            crash_point("store-install");
            tx.execute(
                "INSERT INTO tools (name, doc, installed_ms) VALUES ($1, $2, $3)",
                &[&name, &doc, &now],
            )
            .map_err(pg)?;
            if let Some((id, entry)) = ledger {
                put_ledger(tx, &id, &entry)?;
            }
            crash_point("store-install-written");
            Ok(())
        })
    }

    pub fn rollback(
        &self,
        name: &str,
        ledger: impl FnOnce(&[u8]) -> Option<(String, String)>,
    ) -> Result<Vec<u8>, String> {
        // The ledger row is made from the document: read it first, then restore it in one
        // transaction that checks it is still the newest earlier version.
        let n = name.to_string();
        let newest: Option<(i64, Vec<u8>)> = self.run(move |c| {
            c.query_opt(
                "SELECT seq, doc FROM tool_history WHERE name = $1 ORDER BY seq DESC LIMIT 1",
                &[&n],
            )
            .map(|r| r.map(|r| (r.get(0), r.get(1))))
            .map_err(pg)
        })?;
        let Some((seq, doc)) = newest else {
            return Err(format!("{name} has no earlier version to roll back to"));
        };
        let row = ledger(&doc);
        let (name, back) = (name.to_string(), doc.clone());
        let now = crate::store::now_ms();
        self.write("catalog", move |tx| {
            let gone = tx
                .execute("DELETE FROM tool_history WHERE seq = $1", &[&seq])
                .map_err(pg)?;
            if gone != 1 {
                return Err(format!(
                    "{name}: changed by another replica meanwhile; try again"
                ));
            }
            tx.execute(
                "INSERT INTO tools (name, doc, installed_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET doc = excluded.doc,
                                                  installed_ms = excluded.installed_ms",
                &[&name, &back, &now],
            )
            .map_err(pg)?;
            if let Some((id, entry)) = row {
                put_ledger(tx, &id, &entry)?;
            }
            Ok(())
        })?;
        Ok(doc)
    }

    pub fn remove(&self, name: &str) -> Result<(), String> {
        let name = name.to_string();
        let now = crate::store::now_ms();
        self.write("catalog", move |tx| {
            if !retire(tx, &name, now)? {
                return Err(format!("{name} is not in the managed catalog"));
            }
            tx.execute("DELETE FROM switches WHERE name = $1", &[&name])
                .map_err(pg)?;
            Ok(())
        })
    }

    pub fn history(&self, name: &str) -> Result<Vec<(i64, Vec<u8>)>, String> {
        let name = name.to_string();
        self.run(move |c| {
            Ok(c.query(
                "SELECT retired_ms, doc FROM tool_history WHERE name = $1 ORDER BY seq",
                &[&name],
            )
            .map_err(pg)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
        })
    }

    pub fn all_history(&self) -> Result<Vec<(String, i64, Vec<u8>)>, String> {
        self.run(|c| {
            Ok(c.query(
                "SELECT name, retired_ms, doc FROM tool_history ORDER BY seq",
                &[],
            )
            .map_err(pg)?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
        })
    }

    pub fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), String> {
        let name = name.to_string();
        self.write("catalog", move |tx| {
            if enabled {
                tx.execute("DELETE FROM switches WHERE name = $1", &[&name])
            } else {
                tx.execute(
                    "INSERT INTO switches (name, enabled) VALUES ($1, FALSE)
                     ON CONFLICT (name) DO UPDATE SET enabled = FALSE",
                    &[&name],
                )
            }
            .map(|_| ())
            .map_err(pg)
        })
    }

    pub fn disabled(&self) -> Result<Vec<String>, String> {
        self.run(|c| {
            Ok(c.query(
                "SELECT name FROM switches WHERE NOT enabled ORDER BY name",
                &[],
            )
            .map_err(pg)?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
    }

    pub fn ledger(&self) -> Result<LedgerRows, String> {
        self.run(|c| {
            let tools = c
                .query("SELECT id, entry FROM ledger ORDER BY id", &[])
                .map_err(pg)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let servers = c
                .query(
                    "SELECT id, last_used_ms FROM ledger_servers ORDER BY id",
                    &[],
                )
                .map_err(pg)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            Ok((tools, servers))
        })
    }

    pub fn write_ledger(
        &self,
        tools: &[(String, Option<String>)],
        servers: &[(String, i64)],
    ) -> Result<(), String> {
        let (tools, servers) = (tools.to_vec(), servers.to_vec());
        self.write("ledger", move |tx| {
            for (id, entry) in &tools {
                match entry {
                    Some(e) => put_ledger(tx, id, e)?,
                    None => {
                        tx.execute("DELETE FROM ledger WHERE id = $1", &[id])
                            .map_err(pg)?;
                    }
                }
            }
            for (id, ms) in &servers {
                tx.execute(
                    "INSERT INTO ledger_servers (id, last_used_ms) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET last_used_ms = excluded.last_used_ms",
                    &[id, ms],
                )
                .map_err(pg)?;
            }
            Ok(())
        })
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>, String> {
        let key = key.to_string();
        self.run(move |c| {
            c.query_opt("SELECT value FROM meta WHERE key = $1", &[&key])
                .map(|r| r.map(|r| r.get(0)))
                .map_err(pg)
        })
    }

    /// Spends an approval state: true for the first replica to spend it (one transaction:
    /// of two replicas spending one state at the same moment, exactly one gets true).
    pub fn spend(&self, nonce: &str, expires_ms: i64) -> Result<bool, String> {
        let nonce = nonce.to_string();
        let now = crate::store::now_ms();
        self.run(move |c| {
            let mut tx = c.transaction().map_err(pg)?;
            tx.execute("DELETE FROM spent_states WHERE expires_ms < $1", &[&now])
                .map_err(pg)?;
            let n = tx
                .execute(
                    "INSERT INTO spent_states (nonce, expires_ms) VALUES ($1, $2)
                     ON CONFLICT (nonce) DO NOTHING",
                    &[&nonce, &expires_ms],
                )
                .map_err(pg)?;
            tx.commit().map_err(pg)?;
            Ok(n == 1)
        })
    }

    pub fn tokens(&self) -> Result<Vec<(String, String)>, String> {
        self.run(move |c| {
            Ok(c.query(
                "SELECT name, digest FROM tokens ORDER BY name, created_ms",
                &[],
            )
            .map_err(pg)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
        })
    }

    pub fn tokens_add(&self, tokens: &[(String, String)]) -> Result<(), String> {
        let tokens = tokens.to_vec();
        let now = crate::store::now_ms();
        self.write("tokens", move |tx| {
            for (name, digest) in &tokens {
                put_token(tx, name, digest, now)?;
            }
            Ok(())
        })
    }

    pub fn tokens_rm(&self, name: &str) -> Result<usize, String> {
        let name = name.to_string();
        self.write("tokens", move |tx| {
            tx.execute("DELETE FROM tokens WHERE name = $1", &[&name])
                .map(|n| n as usize)
                .map_err(pg)
        })
    }

    pub fn upstreams(&self) -> Result<Vec<(String, String)>, String> {
        self.run(move |c| {
            Ok(c.query("SELECT id, config FROM upstreams ORDER BY id", &[])
                .map_err(pg)?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect())
        })
    }

    pub fn upstream_put(&self, id: &str, config: &str) -> Result<(), String> {
        let (id, config) = (id.to_string(), config.to_string());
        let now = crate::store::now_ms();
        self.write("upstreams", move |tx| {
            tx.execute(
                "INSERT INTO upstreams (id, config, updated_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET config = excluded.config,
                                                updated_ms = excluded.updated_ms",
                &[&id, &config, &now],
            )
            .map_err(pg)?;
            crash_point("upstream-written");
            Ok(())
        })
    }

    pub fn upstream_del(&self, id: &str) -> Result<bool, String> {
        let id = id.to_string();
        self.write("upstreams", move |tx| {
            tx.execute("DELETE FROM upstreams WHERE id = $1", &[&id])
                .map(|n| n == 1)
                .map_err(pg)
        })
    }

    pub fn waiting_put(&self, instance: &str, id: i64, view: &str) -> Result<i64, String> {
        let (instance, view) = (instance.to_string(), view.to_string());
        let now = crate::store::now_ms();
        self.run(move |c| {
            c.query_one(
                "INSERT INTO waiting (instance, id, view, since_ms, ticket)
                 VALUES ($1, $2, $3, $4, nextval('waiting_tickets'))
                 ON CONFLICT (instance, id) DO UPDATE SET view = excluded.view
                 RETURNING ticket",
                &[&instance, &id, &view, &now],
            )
            .map(|r| r.get(0))
            .map_err(pg)
        })
    }

    pub fn waiting_list(&self) -> Result<Vec<Waiting>, String> {
        self.run(move |c| {
            Ok(c.query(
                "SELECT ticket, instance, id, view, since_ms FROM waiting
                 WHERE decision IS NULL ORDER BY ticket",
                &[],
            )
            .map_err(pg)?
            .iter()
            .map(waiting_row)
            .collect())
        })
    }

    /// Records an operator's decision for the replica holding the call, and tells it.
    pub fn waiting_decide(&self, ticket: i64, decision: &str) -> Result<bool, String> {
        let decision = decision.to_string();
        self.write("decision", move |tx| {
            tx.execute(
                "UPDATE waiting SET decision = $2 WHERE ticket = $1 AND decision IS NULL",
                &[&ticket, &decision],
            )
            .map(|n| n == 1)
            .map_err(pg)
        })
    }

    pub fn waiting_decided(&self, instance: &str) -> Result<Vec<(i64, String)>, String> {
        let instance = instance.to_string();
        self.run(move |c| {
            Ok(c.query(
                "SELECT ticket, decision FROM waiting
                 WHERE instance = $1 AND decision IS NOT NULL",
                &[&instance],
            )
            .map_err(pg)?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
        })
    }

    /// `instance` is alive; the calls of replicas not seen for `stale_ms` are taken out.
    pub fn seen(&self, instance: &str, stale_ms: i64) -> Result<Vec<Waiting>, String> {
        let instance = instance.to_string();
        let now = crate::store::now_ms();
        self.run(move |c| {
            let mut tx = c.transaction().map_err(pg)?;
            tx.execute(
                "INSERT INTO replicas (instance, seen_ms) VALUES ($1, $2)
                 ON CONFLICT (instance) DO UPDATE SET seen_ms = excluded.seen_ms",
                &[&instance, &now],
            )
            .map_err(pg)?;
            let gone = now - stale_ms;
            // Two replicas collecting at once: the row lock lets one take each call.
            let rows = tx
                .query(
                    "DELETE FROM waiting
                     WHERE instance IN (SELECT instance FROM replicas WHERE seen_ms < $1)
                     RETURNING ticket, instance, id, view, since_ms",
                    &[&gone],
                )
                .map_err(pg)?
                .iter()
                .map(waiting_row)
                .collect();
            tx.execute("DELETE FROM replicas WHERE seen_ms < $1", &[&gone])
                .map_err(pg)?;
            tx.commit().map_err(pg)?;
            Ok(rows)
        })
    }

    pub fn waiting_del(&self, instance: &str, id: i64) -> Result<(), String> {
        let instance = instance.to_string();
        self.run(move |c| {
            c.execute(
                "DELETE FROM waiting WHERE instance = $1 AND id = $2",
                &[&instance, &id],
            )
            .map(|_| ())
            .map_err(pg)
        })
    }

    pub fn waiting_take(&self, instance: &str) -> Result<Vec<(i64, String, i64)>, String> {
        let instance = instance.to_string();
        self.run(move |c| {
            Ok(c.query(
                "DELETE FROM waiting WHERE instance = $1 RETURNING id, view, since_ms",
                &[&instance],
            )
            .map_err(pg)?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
        })
    }

    /// Brings `old` in, unless this store imported before (the check is inside the
    /// transaction, under the migration lock: replicas starting together import once).
    pub fn import(&self, old: &Old) -> Result<bool, String> {
        let old = old.clone();
        let now = crate::store::now_ms();
        self.write("catalog", move |tx| {
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
                .map_err(pg)?;
            if tx
                .query_opt("SELECT 1 FROM meta WHERE key = $1", &[&DONE])
                .map_err(pg)?
                .is_some()
            {
                return Ok(false);
            }
            for (name, doc, ms) in &old.history {
                tx.execute(
                    "INSERT INTO tool_history (name, doc, retired_ms) VALUES ($1, $2, $3)",
                    &[name, doc, &ms.unwrap_or(now)],
                )
                .map_err(pg)?;
            }
            for (name, digest) in &old.tokens {
                put_token(tx, name, digest, now)?;
            }
            for (id, config) in &old.upstreams {
                tx.execute(
                    "INSERT INTO upstreams (id, config, updated_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (id) DO UPDATE SET config = excluded.config",
                    &[id, config, &now],
                )
                .map_err(pg)?;
            }
            for (name, doc) in &old.tools {
                tx.execute(
                    "INSERT INTO tools (name, doc, installed_ms) VALUES ($1, $2, $3)
                     ON CONFLICT (name) DO UPDATE SET doc = excluded.doc",
                    &[name, doc, &now],
                )
                .map_err(pg)?;
            }
            for name in &old.disabled {
                tx.execute(
                    "INSERT INTO switches (name, enabled) VALUES ($1, FALSE)
                     ON CONFLICT (name) DO UPDATE SET enabled = FALSE",
                    &[name],
                )
                .map_err(pg)?;
            }
            for (id, entry) in &old.ledger {
                put_ledger(tx, id, entry)?;
            }
            for (id, ms) in &old.servers {
                tx.execute(
                    "INSERT INTO ledger_servers (id, last_used_ms) VALUES ($1, $2)
                     ON CONFLICT (id) DO UPDATE SET last_used_ms = excluded.last_used_ms",
                    &[id, ms],
                )
                .map_err(pg)?;
            }
            let summary = serde_json::json!({"ms": now, "tools": old.tools.len(),
                "history": old.history.len(), "switches": old.disabled.len(),
                "ledger": old.ledger.len()});
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2)",
                &[&DONE, &summary.to_string()],
            )
            .map_err(pg)?;
            Ok(true)
        })
    }
}
