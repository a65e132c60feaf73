//! The store's vocabulary, a leaf: what the backends, the import and the rest of stsd pass
//! each other (rows, a change listener, the older layout as read), and the crash points the
//! tests kill the daemon at.

/// Test builds (`attack`): a kill -9 of this process at the point named by
/// `STSD_TEST_CRASH_AT`, to prove a crash there loses nothing; or, at the point named by
/// `STSD_TEST_PAUSE_AT`, a pause: the file `STSD_TEST_PAUSE_FILE` is made, and the process
/// waits (up to 30 s) until the test removes it, having meanwhile crashed what it wants to
/// (the database, inside the transaction). Release builds: nothing.
#[inline]
pub fn crash_point(name: &str) {
    #[cfg(feature = "attack")]
    {
        if std::env::var("STSD_TEST_CRASH_AT").is_ok_and(|v| v == name) {
            // SAFETY: kill(2) of this very process with SIGKILL.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        if std::env::var("STSD_TEST_PAUSE_AT").is_ok_and(|v| v == name) {
            if let Some(f) = std::env::var_os("STSD_TEST_PAUSE_FILE") {
                let f = std::path::PathBuf::from(f);
                if std::fs::write(&f, name).is_ok() {
                    let t0 = std::time::Instant::now();
                    while f.exists() && t0.elapsed() < std::time::Duration::from_secs(30) {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
        }
    }
    #[cfg(not(feature = "attack"))]
    let _ = name;
}

/// A ledger change for `Store::install`: the entry (as the ledger serialises it) that
/// approves the new version's fingerprint.
pub struct LedgerRow<'a> {
    pub id: &'a str,
    pub entry: &'a str,
}

/// Every managed tool's served version: (name, document bytes), by name.
pub type ToolRows = Vec<(String, Vec<u8>)>;
/// The ledger's entries (id, entry as the ledger serialises it) and servers' last use.
pub type LedgerRows = (Vec<(String, String)>, Vec<(String, i64)>);
/// A change another process made (another replica), for `Store::on_change`: what changed,
/// each kind once ("catalog", "ledger", "decision").
pub type OnChange = Box<dyn Fn(&[String]) + Send + Sync>;

/// A call waiting for an operator, as the store keeps it.
#[derive(Debug, Clone)]
pub struct Waiting {
    /// The id an operator answers (`stsd approvals`): unique among the daemons sharing the
    /// store (the call's own id is unique only in its daemon).
    pub ticket: i64,
    /// The daemon holding the call.
    pub instance: String,
    /// The call's id in that daemon (its audit record's `callId`).
    pub id: i64,
    /// The call as `stsd approvals` shows it (arguments masked), JSON.
    pub view: String,
    pub since_ms: i64,
}

/// One older file set, read whole before anything is written.
#[derive(Clone, Default)]
pub(super) struct Old {
    pub tools: Vec<(String, Vec<u8>)>,
    /// (name, document, when it was retired if known: else the import's time).
    pub history: Vec<(String, Vec<u8>, Option<i64>)>,
    pub disabled: Vec<String>,
    pub ledger: Vec<(String, String)>,
    pub servers: Vec<(String, i64)>,
    /// HTTP bearer tokens: (principal, SHA-256 digest in hex).
    pub tokens: Vec<(String, String)>,
    /// Upstreams added at run time: (id, `[[upstream]]` entry as JSON).
    pub upstreams: Vec<(String, String)>,
}

/// The key a store records its import under (in `meta`).
pub(super) const DONE: &str = "imported";
