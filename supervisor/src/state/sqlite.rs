//! The embedded backend: SQLite through `rusqlite` (bundled), WAL, one file.

use super::rows::{crash_point, LedgerRow, Old, Waiting, DONE};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// The schema, by version (`PRAGMA user_version`): each step runs once, in order, in the
/// transaction that bumps the version.
const MIGRATIONS: &[&str] = &[
    // 1: the managed catalog and the ledger.
    "CREATE TABLE tools (
        name TEXT PRIMARY KEY,
        doc BLOB NOT NULL,
        installed_ms INTEGER NOT NULL
     );
     CREATE TABLE tool_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        doc BLOB NOT NULL,
        retired_ms INTEGER NOT NULL
     );
     CREATE INDEX tool_history_name ON tool_history (name, seq);
     CREATE TABLE switches (
        name TEXT PRIMARY KEY,
        enabled INTEGER NOT NULL
     );
     CREATE TABLE ledger (
        id TEXT PRIMARY KEY,
        entry TEXT NOT NULL
     );
     CREATE TABLE ledger_servers (
        id TEXT PRIMARY KEY,
        last_used_ms INTEGER NOT NULL
     );
     CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
     );",
    // 2: approval states spent (single use, across the daemons sharing the store).
    "CREATE TABLE spent_states (
        nonce TEXT PRIMARY KEY,
        expires_ms INTEGER NOT NULL
     );",
    // 3: calls waiting for an operator, so a daemon that died leaves a trace of them.
    "CREATE TABLE waiting (
        instance TEXT NOT NULL,
        id INTEGER NOT NULL,
        view TEXT NOT NULL,
        since_ms INTEGER NOT NULL,
        PRIMARY KEY (instance, id)
     );",
    // 4: an operator's decision made on any daemon sharing the store, for the one holding
    // the call (`ticket`: the id `stsd approvals` shows); and when each daemon was last seen,
    // so the calls of one that is gone for good are recorded, not listed forever.
    "ALTER TABLE waiting ADD COLUMN ticket INTEGER;
     ALTER TABLE waiting ADD COLUMN decision TEXT;
     CREATE TABLE replicas (
        instance TEXT PRIMARY KEY,
        seen_ms INTEGER NOT NULL
     );",
    // 5: HTTP bearer tokens, as digests (the token itself is shown once, never kept).
    "CREATE TABLE tokens (
        digest TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        created_ms INTEGER NOT NULL
     );",
    // 6: upstreams added at run time (`stsd upstream add`), each its `[[upstream]]` entry as
    // JSON (references unresolved: a secret is never stored, only its name).
    "CREATE TABLE upstreams (
        id TEXT PRIMARY KEY,
        config TEXT NOT NULL,
        updated_ms INTEGER NOT NULL
     );",
];

/// The embedded store. One connection behind a lock: the daemon's writes are rare (an
/// operator's change, a ledger sighting) and each is one short transaction.
pub struct Sqlite {
    path: PathBuf,
    conn: Mutex<Connection>,
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> String + '_ {
    move |e| format!("state store {}: {e}", path.display())
}

/// A `waiting` row selected as (ticket, instance, id, view, since_ms).
fn waiting_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Waiting> {
    Ok(Waiting {
        ticket: r.get(0)?,
        instance: r.get(1)?,
        id: r.get(2)?,
        view: r.get(3)?,
        since_ms: r.get(4)?,
    })
}

fn put_token(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
    digest: &str,
    now: i64,
) -> rusqlite::Result<usize> {
    tx.execute(
        "INSERT INTO tokens (digest, name, created_ms) VALUES (?1, ?2, ?3)
         ON CONFLICT (digest) DO NOTHING",
        params![digest, name, now],
    )
}

impl Sqlite {
    /// Opens (creating) the store at `path` and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Sqlite, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("state store {}: {e}", dir.display()))?;
        }
        let conn = Connection::open(path).map_err(sql(path))?;
        // WAL: readers never block the writer; FULL: a committed change survives a power
        // loss, not only a crash of the process.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sql(path))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sql(path))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(sql(path))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql(path))?;
        let store = Sqlite {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        };
        store.migrate()?;
        // The store holds the ledger and the operator's catalog: the daemon's user only.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        }
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A transaction that did not commit is rolled back when it is dropped, even by a
        // panic, so a poisoned lock guards a consistent connection.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn migrate(&self) -> Result<(), String> {
        let mut c = self.lock();
        let at = sql(&self.path);
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Exclusive)
            .map_err(&at)?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(&at)?;
        let version = usize::try_from(version).unwrap_or(usize::MAX);
        if version > MIGRATIONS.len() {
            return Err(format!(
                "state store {}: schema version {version} is newer than this stsd reads ({}); \
                 run the newer stsd, or restore a backup (`stsd store export` there)",
                self.path.display(),
                MIGRATIONS.len()
            ));
        }
        for step in &MIGRATIONS[version..] {
            tx.execute_batch(step).map_err(&at)?;
        }
        tx.pragma_update(None, "user_version", MIGRATIONS.len() as i64)
            .map_err(&at)?;
        tx.commit().map_err(&at)
    }

    /// Runs `f` in one immediate transaction: all of it is committed, or none.
    pub(super) fn write<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, String>,
    ) -> Result<T, String> {
        let mut c = self.lock();
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql(&self.path))?;
        let out = f(&tx)?;
        tx.commit().map_err(sql(&self.path))?;
        Ok(out)
    }

    // The managed catalog.

    /// Every managed tool's served version: (name, document bytes), by name.
    pub fn tools(&self) -> Result<Vec<(String, Vec<u8>)>, String> {
        let c = self.lock();
        let at = sql(&self.path);
        let mut st = c
            .prepare("SELECT name, doc FROM tools ORDER BY name")
            .map_err(&at)?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?;
        rows.collect::<Result<_, _>>().map_err(&at)
    }

    pub fn has_tool(&self, name: &str) -> Result<bool, String> {
        let c = self.lock();
        c.query_row("SELECT 1 FROM tools WHERE name = ?1", [name], |_| Ok(()))
            .optional()
            .map(|r| r.is_some())
            .map_err(sql(&self.path))
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
        let now = crate::store::now_ms();
        let at = sql(&self.path);
        self.write(|tx| {
            retire(tx, name, now).map_err(&at)?;
            // The old layout lost the tool when killed here (moved to the history, the new
            // version not yet written).
            crash_point("store-install");
            tx.execute(
                "INSERT INTO tools (name, doc, installed_ms) VALUES (?1, ?2, ?3)",
                params![name, doc, now],
            )
            .map_err(&at)?;
            if let Some(l) = ledger {
                put_ledger(tx, l).map_err(&at)?;
            }
            Ok(())
        })
    }

    /// Puts `name`'s newest earlier version back in place (the current one is dropped), with
    /// the ledger row `ledger` makes of it: one transaction. The restored document is returned.
    pub fn rollback(
        &self,
        name: &str,
        ledger: impl FnOnce(&[u8]) -> Option<(String, String)>,
    ) -> Result<Vec<u8>, String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            let prev: Option<(i64, Vec<u8>)> = tx
                .query_row(
                    "SELECT seq, doc FROM tool_history WHERE name = ?1 ORDER BY seq DESC LIMIT 1",
                    [name],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(&at)?;
            let Some((seq, doc)) = prev else {
                return Err(format!("{name} has no earlier version to roll back to"));
            };
            tx.execute("DELETE FROM tool_history WHERE seq = ?1", [seq])
                .map_err(&at)?;
            tx.execute(
                "INSERT INTO tools (name, doc, installed_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET doc = excluded.doc,
                                                  installed_ms = excluded.installed_ms",
                params![name, doc, now],
            )
            .map_err(&at)?;
            if let Some((id, entry)) = ledger(&doc) {
                put_ledger(
                    tx,
                    LedgerRow {
                        id: &id,
                        entry: &entry,
                    },
                )
                .map_err(&at)?;
            }
            Ok(doc)
        })
    }

    /// Retires `name`: its served version goes to the history (so `rollback` restores it),
    /// and its switch is cleared.
    pub fn remove(&self, name: &str) -> Result<(), String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            if !retire(tx, name, now).map_err(&at)? {
                return Err(format!("{name} is not in the managed catalog"));
            }
            tx.execute("DELETE FROM switches WHERE name = ?1", [name])
                .map_err(&at)?;
            Ok(())
        })
    }

    /// Earlier versions of `name`, oldest first: (when retired, document).
    pub fn history(&self, name: &str) -> Result<Vec<(i64, Vec<u8>)>, String> {
        let c = self.lock();
        let at = sql(&self.path);
        let mut st = c
            .prepare("SELECT retired_ms, doc FROM tool_history WHERE name = ?1 ORDER BY seq")
            .map_err(&at)?;
        let rows = st
            .query_map([name], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?;
        rows.collect::<Result<_, _>>().map_err(&at)
    }

    pub fn all_history(&self) -> Result<Vec<(String, i64, Vec<u8>)>, String> {
        let c = self.lock();
        let at = sql(&self.path);
        let mut st = c
            .prepare("SELECT name, retired_ms, doc FROM tool_history ORDER BY seq")
            .map_err(&at)?;
        let rows = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(&at)?;
        rows.collect::<Result<_, _>>().map_err(&at)
    }

    /// The operator's switch for a tool (any tool of the catalog, managed or not).
    pub fn set_enabled(&self, name: &str, enabled: bool) -> Result<(), String> {
        let at = sql(&self.path);
        self.write(|tx| {
            if enabled {
                tx.execute("DELETE FROM switches WHERE name = ?1", [name])
            } else {
                tx.execute(
                    "INSERT INTO switches (name, enabled) VALUES (?1, 0)
                     ON CONFLICT (name) DO UPDATE SET enabled = 0",
                    [name],
                )
            }
            .map(|_| ())
            .map_err(&at)
        })
    }

    /// The tools the operator disabled, by name.
    pub fn disabled(&self) -> Result<Vec<String>, String> {
        let c = self.lock();
        let at = sql(&self.path);
        let mut st = c
            .prepare("SELECT name FROM switches WHERE enabled = 0 ORDER BY name")
            .map_err(&at)?;
        let rows = st.query_map([], |r| r.get(0)).map_err(&at)?;
        rows.collect::<Result<_, _>>().map_err(&at)
    }

    // The fingerprint ledger.

    /// Every ledger entry (id, entry as the ledger serialises it) and every server's last
    /// use (id, ms).
    #[allow(clippy::type_complexity)]
    pub fn ledger(&self) -> Result<(Vec<(String, String)>, Vec<(String, i64)>), String> {
        let c = self.lock();
        let at = sql(&self.path);
        let mut st = c
            .prepare("SELECT id, entry FROM ledger ORDER BY id")
            .map_err(&at)?;
        let tools = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?
            .collect::<Result<_, _>>()
            .map_err(&at)?;
        let mut st = c
            .prepare("SELECT id, last_used_ms FROM ledger_servers ORDER BY id")
            .map_err(&at)?;
        let servers = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?
            .collect::<Result<_, _>>()
            .map_err(&at)?;
        Ok((tools, servers))
    }

    /// Writes ledger changes in one transaction: entries upserted or (None) deleted, and
    /// servers' last use.
    pub fn write_ledger(
        &self,
        tools: &[(String, Option<String>)],
        servers: &[(String, i64)],
    ) -> Result<(), String> {
        let at = sql(&self.path);
        self.write(|tx| {
            for (id, entry) in tools {
                match entry {
                    Some(e) => put_ledger(tx, LedgerRow { id, entry: e }).map_err(&at)?,
                    None => {
                        tx.execute("DELETE FROM ledger WHERE id = ?1", [id])
                            .map_err(&at)?;
                    }
                }
            }
            for (id, ms) in servers {
                tx.execute(
                    "INSERT INTO ledger_servers (id, last_used_ms) VALUES (?1, ?2)
                     ON CONFLICT (id) DO UPDATE SET last_used_ms = excluded.last_used_ms",
                    params![id, ms],
                )
                .map_err(&at)?;
            }
            Ok(())
        })?;
        // A publish writes every tool's entry at once, and the pages it read stayed in the
        // connection's cache (up to SQLite's 2 MiB) for the life of the daemon; ledger
        // writes are rare, and the next one reads what it needs from the file again. Only
        // advice: the write has committed whatever becomes of it.
        if let Err(e) = self.lock().execute_batch("PRAGMA shrink_memory") {
            tracing::debug!(error = %e, "the state store kept its page cache");
        }
        Ok(())
    }

    pub fn tokens(&self) -> Result<Vec<(String, String)>, String> {
        let at = sql(&self.path);
        let c = self.lock();
        let mut st = c
            .prepare("SELECT name, digest FROM tokens ORDER BY name, created_ms")
            .map_err(&at)?;
        let it = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?;
        it.collect::<Result<_, _>>().map_err(&at)
    }

    pub fn tokens_add(&self, tokens: &[(String, String)]) -> Result<(), String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            for (name, digest) in tokens {
                put_token(tx, name, digest, now).map_err(&at)?;
            }
            Ok(())
        })
    }

    pub fn tokens_rm(&self, name: &str) -> Result<usize, String> {
        let at = sql(&self.path);
        self.write(|tx| {
            tx.execute("DELETE FROM tokens WHERE name = ?1", [name])
                .map_err(&at)
        })
    }

    // Upstreams added at run time.

    pub fn upstreams(&self) -> Result<Vec<(String, String)>, String> {
        let at = sql(&self.path);
        let c = self.lock();
        let mut st = c
            .prepare("SELECT id, config FROM upstreams ORDER BY id")
            .map_err(&at)?;
        let it = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?;
        it.collect::<Result<_, _>>().map_err(&at)
    }

    pub fn upstream_put(&self, id: &str, config: &str) -> Result<(), String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO upstreams (id, config, updated_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET config = excluded.config,
                                                updated_ms = excluded.updated_ms",
                params![id, config, now],
            )
            .map_err(&at)?;
            crash_point("upstream-written");
            Ok(())
        })
    }

    pub fn upstream_del(&self, id: &str) -> Result<bool, String> {
        let at = sql(&self.path);
        self.write(|tx| {
            tx.execute("DELETE FROM upstreams WHERE id = ?1", [id])
                .map(|n| n == 1)
                .map_err(&at)
        })
    }

    // Bookkeeping.

    pub fn meta(&self, key: &str) -> Result<Option<String>, String> {
        let c = self.lock();
        c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(sql(&self.path))
    }

    /// Spends an approval state: true for the first to spend it, false after (expired ones
    /// forgotten in the same transaction).
    pub fn spend(&self, nonce: &str, expires_ms: i64) -> Result<bool, String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            tx.execute("DELETE FROM spent_states WHERE expires_ms < ?1", [now])
                .map_err(&at)?;
            tx.execute(
                "INSERT INTO spent_states (nonce, expires_ms) VALUES (?1, ?2)
                 ON CONFLICT (nonce) DO NOTHING",
                params![nonce, expires_ms],
            )
            .map(|n| n == 1)
            .map_err(&at)
        })
    }

    /// The embedded store has one daemon: a call's ticket is its id.
    pub fn waiting_put(&self, instance: &str, id: i64, view: &str) -> Result<i64, String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO waiting (instance, id, view, since_ms, ticket)
                 VALUES (?1, ?2, ?3, ?4, ?2)",
                params![instance, id, view, now],
            )
            .map(|_| id)
            .map_err(&at)
        })
    }

    pub fn waiting_list(&self) -> Result<Vec<Waiting>, String> {
        let at = sql(&self.path);
        let c = self.lock();
        let mut st = c
            .prepare(
                "SELECT ticket, instance, id, view, since_ms FROM waiting
                 WHERE decision IS NULL ORDER BY ticket",
            )
            .map_err(&at)?;
        let it = st.query_map([], waiting_row).map_err(&at)?;
        it.collect::<Result<_, _>>().map_err(&at)
    }

    pub fn waiting_decide(&self, ticket: i64, decision: &str) -> Result<bool, String> {
        let at = sql(&self.path);
        self.write(|tx| {
            tx.execute(
                "UPDATE waiting SET decision = ?2 WHERE ticket = ?1 AND decision IS NULL",
                params![ticket, decision],
            )
            .map(|n| n == 1)
            .map_err(&at)
        })
    }

    pub fn waiting_decided(&self, instance: &str) -> Result<Vec<(i64, String)>, String> {
        let at = sql(&self.path);
        let c = self.lock();
        let mut st = c
            .prepare(
                "SELECT ticket, decision FROM waiting
                 WHERE instance = ?1 AND decision IS NOT NULL",
            )
            .map_err(&at)?;
        let it = st
            .query_map([instance], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(&at)?;
        it.collect::<Result<_, _>>().map_err(&at)
    }

    pub fn seen(&self, instance: &str, stale_ms: i64) -> Result<Vec<Waiting>, String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            tx.execute(
                "INSERT INTO replicas (instance, seen_ms) VALUES (?1, ?2)
                 ON CONFLICT (instance) DO UPDATE SET seen_ms = excluded.seen_ms",
                params![instance, now],
            )
            .map_err(&at)?;
            let gone = now - stale_ms;
            let rows: Vec<Waiting> = {
                let mut st = tx
                    .prepare(
                        "SELECT ticket, instance, id, view, since_ms FROM waiting
                         WHERE instance IN (SELECT instance FROM replicas WHERE seen_ms < ?1)",
                    )
                    .map_err(&at)?;
                let it = st.query_map([gone], waiting_row).map_err(&at)?;
                it.collect::<Result<_, _>>().map_err(&at)?
            };
            tx.execute(
                "DELETE FROM waiting
                 WHERE instance IN (SELECT instance FROM replicas WHERE seen_ms < ?1)",
                [gone],
            )
            .map_err(&at)?;
            tx.execute("DELETE FROM replicas WHERE seen_ms < ?1", [gone])
                .map_err(&at)?;
            Ok(rows)
        })
    }

    pub fn waiting_del(&self, instance: &str, id: i64) -> Result<(), String> {
        let at = sql(&self.path);
        self.write(|tx| {
            tx.execute(
                "DELETE FROM waiting WHERE instance = ?1 AND id = ?2",
                params![instance, id],
            )
            .map(|_| ())
            .map_err(&at)
        })
    }

    pub fn waiting_take(&self, instance: &str) -> Result<Vec<(i64, String, i64)>, String> {
        let at = sql(&self.path);
        self.write(|tx| {
            let rows: Vec<(i64, String, i64)> = {
                let mut st = tx
                    .prepare(
                        "SELECT id, view, since_ms FROM waiting WHERE instance = ?1 ORDER BY id",
                    )
                    .map_err(&at)?;
                let it = st
                    .query_map([instance], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .map_err(&at)?;
                it.collect::<Result<_, _>>().map_err(&at)?
            };
            tx.execute("DELETE FROM waiting WHERE instance = ?1", [instance])
                .map_err(&at)?;
            Ok(rows)
        })
    }

    pub(super) fn import(&self, old: &Old) -> Result<bool, String> {
        let at = sql(&self.path);
        let now = crate::store::now_ms();
        self.write(|tx| {
            // Two processes starting on one state directory: the first imports, the other
            // finds it done (the check is inside the write transaction, which serialises them).
            let done: Option<String> = tx
                .query_row("SELECT value FROM meta WHERE key = ?1", [DONE], |r| {
                    r.get(0)
                })
                .optional()
                .map_err(&at)?;
            if done.is_some() {
                return Ok(false);
            }
            for (name, doc, ms) in &old.history {
                tx.execute(
                    "INSERT INTO tool_history (name, doc, retired_ms) VALUES (?1, ?2, ?3)",
                    params![name, doc, ms.unwrap_or(now)],
                )
                .map_err(&at)?;
            }
            for (name, digest) in &old.tokens {
                put_token(tx, name, digest, now).map_err(&at)?;
            }
            for (id, config) in &old.upstreams {
                tx.execute(
                    "INSERT OR REPLACE INTO upstreams (id, config, updated_ms) VALUES (?1, ?2, ?3)",
                    params![id, config, now],
                )
                .map_err(&at)?;
            }
            for (name, doc) in &old.tools {
                tx.execute(
                    "INSERT OR REPLACE INTO tools (name, doc, installed_ms) VALUES (?1, ?2, ?3)",
                    params![name, doc, now],
                )
                .map_err(&at)?;
            }
            for name in &old.disabled {
                tx.execute(
                    "INSERT OR REPLACE INTO switches (name, enabled) VALUES (?1, 0)",
                    [name],
                )
                .map_err(&at)?;
            }
            for (id, entry) in &old.ledger {
                tx.execute(
                    "INSERT OR REPLACE INTO ledger (id, entry) VALUES (?1, ?2)",
                    params![id, entry],
                )
                .map_err(&at)?;
            }
            for (id, ms) in &old.servers {
                tx.execute(
                    "INSERT OR REPLACE INTO ledger_servers (id, last_used_ms) VALUES (?1, ?2)",
                    params![id, ms],
                )
                .map_err(&at)?;
            }
            // Verified before it counts as done: what the store holds is what was read.
            let count = |table: &str| -> Result<usize, String> {
                tx.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
                    r.get::<_, i64>(0)
                })
                .map(|n| n as usize)
                .map_err(&at)
            };
            let held = (
                count("tools")?,
                count("tool_history")?,
                count("switches")?,
                count("ledger")?,
            );
            let read = (
                old.tools.len(),
                old.history.len(),
                old.disabled.len(),
                old.ledger.len(),
            );
            if held != read {
                return Err(format!(
                    "import into {}: read (tools, history, switches, ledger) {read:?}, the store \
                     holds {held:?}: nothing imported",
                    self.path.display()
                ));
            }
            let summary = serde_json::json!({"ms": now, "tools": read.0, "history": read.1,
                                             "switches": read.2, "ledger": read.3});
            tx.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                params![DONE, summary.to_string()],
            )
            .map_err(&at)?;
            Ok(true)
        })
    }
}

/// Moves `name`'s served version, if any, to the history. Whether there was one.
pub(super) fn retire(
    tx: &rusqlite::Transaction<'_>,
    name: &str,
    now: i64,
) -> rusqlite::Result<bool> {
    let moved = tx.execute(
        "INSERT INTO tool_history (name, doc, retired_ms)
         SELECT name, doc, ?2 FROM tools WHERE name = ?1",
        params![name, now],
    )?;
    tx.execute("DELETE FROM tools WHERE name = ?1", [name])?;
    Ok(moved > 0)
}

fn put_ledger(tx: &rusqlite::Transaction<'_>, l: LedgerRow<'_>) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO ledger (id, entry) VALUES (?1, ?2)
         ON CONFLICT (id) DO UPDATE SET entry = excluded.entry",
        params![l.id, l.entry],
    )?;
    Ok(())
}
