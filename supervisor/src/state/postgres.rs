//! The shared backend: PostgreSQL through the `postgres` crate, for replicas behind a load
//! balancer. Every change is one transaction that ends with `NOTIFY stsd_state`; each
//! replica LISTENs, and on another's notification its `on_change` callbacks run (the daemon
//! re-reads the catalog and the ledger and tells its clients). The schema is migrated at
//! start under an advisory lock, so replicas starting together migrate once.
//!
//! One connection per daemon, owned by a thread of its own (the `postgres` client must not
//! run inside the daemon's async runtime): callers hand it a job and wait for the answer. A
//! lost connection is made again at the next job; until then jobs fail (the daemon keeps
//! serving the catalog it has).

use super::rows::{crash_point, LedgerRow, LedgerRows, Old, OnChange, ToolRows, Waiting, DONE};
use postgres::fallible_iterator::FallibleIterator;
use postgres::{Client, NoTls, Transaction};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
];

type Job = Box<dyn FnOnce(Result<&mut Client, String>) + Send>;
type Listeners = Arc<Mutex<Vec<Arc<OnChange>>>>;

pub struct Postgres {
    label: String,
    jobs: Mutex<mpsc::Sender<Job>>,
    listeners: Listeners,
    /// Whether the connection answered its last job or ping.
    up: Arc<AtomicBool>,
}

/// How often an idle connection is pinged (so readiness and the metric follow the server).
const PING_EVERY: Duration = Duration::from_secs(2);

fn pg(e: postgres::Error) -> String {
    format!("PostgreSQL: {e}")
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

/// One connection: made, listening, its schema up to date; and its own backend pid (its
/// own notifications are not another replica's change).
fn connect(url: &str, password: Option<&str>) -> Result<(Client, i32), String> {
    let mut cfg: postgres::Config = url.parse().map_err(pg)?;
    if let Some(p) = password {
        cfg.password(p);
    }
    cfg.connect_timeout(Duration::from_secs(5));
    cfg.application_name("stsd");
    let mut client = cfg.connect(NoTls).map_err(pg)?;
    migrate(&mut client)?;
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .map_err(pg)?;
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

/// The connection's thread: runs jobs in order, makes the connection again when it was
/// lost, and between jobs hands other replicas' notifications to the listeners.
fn serve(
    url: String,
    password: Option<String>,
    first: (Client, i32),
    jobs: mpsc::Receiver<Job>,
    listeners: Listeners,
    up: Arc<AtomicBool>,
) {
    let mut conn: Option<(Client, i32)> = Some(first);
    let mut last = Instant::now();
    // When a connection was last tried and failed: jobs meanwhile fail at once rather than
    // each wait out a connect timeout (their callers may be the daemon's async threads);
    // the idle ping keeps trying.
    let mut failed: Option<Instant> = None;
    loop {
        let job = match jobs.recv_timeout(Duration::from_millis(100)) {
            Ok(job) => Some(job),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        if job.is_none() && last.elapsed() < PING_EVERY && conn.is_some() {
            // Idle, and recently heard from: only the notifications below.
        } else {
            last = Instant::now();
            if conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
                if failed.is_some_and(|t| t.elapsed() < PING_EVERY) {
                    if let Some(job) = job {
                        job(Err(
                            "PostgreSQL is unreachable (retrying in the background)".into(),
                        ));
                    }
                    continue;
                }
                conn = match connect(&url, password.as_deref()) {
                    Ok(c) => {
                        failed = None;
                        Some(c)
                    }
                    Err(e) => {
                        failed = Some(Instant::now());
                        mark(&up, false, &e);
                        if let Some(job) = job {
                            job(Err(e));
                        }
                        continue;
                    }
                };
            }
            let Some((c, _)) = conn.as_mut() else {
                continue;
            };
            match job {
                Some(job) => job(Ok(c)),
                None => {
                    if let Err(e) = c.simple_query("SELECT 1") {
                        mark(&up, false, &pg(e));
                        conn = None;
                        continue;
                    }
                }
            }
            let alive = !c.is_closed();
            mark(&up, alive, "the connection closed");
            if !alive {
                conn = None;
                continue;
            }
        }
        let Some((c, me)) = conn.as_mut() else {
            continue;
        };
        let mut changed: Vec<String> = Vec::new();
        let mut n = c.notifications();
        // A short wait, not `iter()`: the client's I/O is read only while its runtime turns,
        // and `iter()` never lets it (a notification would sit in the socket for good).
        let mut it = n.timeout_iter(Duration::from_millis(2));
        while let Ok(Some(note)) = it.next() {
            if note.process_id() != *me && !changed.iter().any(|w| w == note.payload()) {
                changed.push(note.payload().to_string());
            }
        }
        if !changed.is_empty() {
            tracing::debug!("the state store changed (another replica)");
            let ls: Vec<Arc<OnChange>> =
                listeners.lock().unwrap_or_else(|e| e.into_inner()).clone();
            // On a thread of their own: a listener reads the store, which is this thread's
            // to serve.
            let _ = std::thread::Builder::new()
                .name("stsd-store-change".into())
                .spawn(move || {
                    for l in ls {
                        l(&changed);
                    }
                });
        }
    }
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
    pub fn open(url: &str, password: Option<String>) -> Result<Postgres, String> {
        let label = label_of(url);
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let listeners: Listeners = Arc::default();
        let up = Arc::new(AtomicBool::new(true));
        let (u, l, flag) = (url.to_string(), listeners.clone(), up.clone());
        std::thread::Builder::new()
            .name("stsd-store".into())
            .spawn(move || match connect(&u, password.as_deref()) {
                Ok(first) => {
                    let _ = ready_tx.send(Ok(()));
                    serve(u, password, first, rx, l, flag);
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
        Ok(Postgres {
            label,
            jobs: Mutex::new(tx),
            listeners,
            up,
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
            for (name, doc) in &old.history {
                tx.execute(
                    "INSERT INTO tool_history (name, doc, retired_ms) VALUES ($1, $2, $3)",
                    &[name, doc, &now],
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
