//! The audit log: append-only JSONL, one record per call (spec §11.4 plus call id, worker pid,
//! peer uid and limits hit), written before the reply. Never mixed with logs.
//!
//! Each record is one `write` of one line to an O_APPEND file. A kill -9 can still cut a large
//! write short, so opening the log first trims any torn tail back to the last complete line.

use serde::Serialize;
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    /// Epoch milliseconds when the call arrived.
    pub ts: i64,
    pub call_id: u64,
    pub tool_id: String,
    pub name: String,
    pub category: Option<String>,
    /// The resolved toolSafety block, verbatim.
    pub tool_safety: Option<stsd_protocol::json::SharedJson>,
    pub risk_level: String,
    /// Arguments as received (after validation), secrets masked.
    pub params: Value,
    /// "OK" or "ERROR".
    pub outcome: &'static str,
    pub error: Option<AuditError>,
    pub elapsed_ms: u64,
    pub worker_pid: Option<u32>,
    pub peer_uid: Option<u32>,
    /// The authenticated caller of an HTTP request (a token's or a client certificate's
    /// principal).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// How that principal authenticated: "token", "certificate" or "oauth".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub principal_kind: Option<&'static str>,
    pub limits_hit: Vec<String>,
    pub transport: &'static str,
    /// Every fetch hop of the call, refused ones included, with the operator settings that
    /// applied (host override, trusted range, extra CA, open mode reaching a private address).
    /// URLs are masked like everything else.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::egress::HopRecord>,
    /// For a call that needed approval (or whose spec's REQUIRED was lifted): the strategy,
    /// the approver, the decision, the reason and the wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRecord>,
    /// What the call cost, when a worker ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<CallMetrics>,
    /// For a wrapped upstream tool: the upstream, the tool's name there, and its scores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<UpstreamAudit>,
    /// For a call the policy refused (FORBIDDEN): the policies that decided (a forbid's id,
    /// or none when nothing permitted it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<Vec<String>>,
    /// For a resource read, a prompt or a completion: the reply's size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

impl AuditRecord {
    /// The record of a call as it arrives (outcome ERROR until it is finished), for one of
    /// stsd's own tools or a wrapped upstream tool alike.
    pub fn arrived(
        call_id: u64,
        caller: &crate::call::vocab::Caller,
        tool_id: String,
        name: String,
        risk_level: String,
        params: Value,
    ) -> AuditRecord {
        AuditRecord {
            ts: crate::store::now_ms(),
            call_id,
            tool_id,
            name,
            category: None,
            tool_safety: None,
            risk_level,
            params,
            outcome: "ERROR",
            error: None,
            elapsed_ms: 0,
            worker_pid: None,
            peer_uid: caller.peer_uid,
            principal: caller.principal.as_ref().map(|p| p.name.clone()),
            principal_kind: caller.principal.as_ref().map(|p| p.kind.as_str()),
            limits_hit: Vec::new(),
            transport: caller.transport,
            egress: Vec::new(),
            approval: None,
            metrics: None,
            upstream: None,
            policy: None,
            bytes: None,
        }
    }
}

pub use crate::call::vocab::CallMetrics;

/// The audit record's `approval` member.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecord {
    pub strategy: &'static str,
    /// What made approval required (spec, toolset, rule), or what lifted a spec's REQUIRED.
    pub source: &'static str,
    pub approver: String,
    /// approved, rejected, timeout, error, required
    pub decision: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub wait_ms: u64,
    /// A spec's humanInTheLoop REQUIRED was lifted by an operator switch for this call.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub overrode_required: bool,
}

/// What the audit record says of an upstream call.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UpstreamAudit {
    pub id: String,
    pub tool: String,
    pub server_risk: String,
    pub tool_risk: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor_trigger: Option<String>,
    /// Whether the call reached the upstream (false: refused at stsd's door, which the audit
    /// log counts with the other refusals).
    #[serde(skip)]
    pub reached: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuditError {
    pub code: String,
    pub message: String,
}

pub struct AuditLog {
    inner: Mutex<LogFile>,
    /// Refusals past a per-principal budget, summarised (see [`Refusals`]).
    refusals: Refusals,
    /// Records that could not be written, calls refused for it, and when that was last said.
    failures: Failures,
}

/// The audit log failing (a full disk): counted, and said in one WARN a minute.
#[derive(Default)]
struct Failures {
    lost: std::sync::atomic::AtomicU64,
    refused: std::sync::atomic::AtomicU64,
    said: Mutex<Option<(std::time::Instant, u64)>>,
}

/// Free bytes the audit log's filesystem must have for a call that must be recorded to run:
/// well over one record (arguments are bounded by `audit_max_params_bytes`, 64 KiB).
pub const AUDIT_FREE_MARGIN: u64 = 256 * 1024;

/// Refusals (calls answered with an error before any worker, upstream or approver had
/// them) written one by one up to `per_second` a principal each second; past that they are
/// counted, and one `refusals-summarised` record per principal and second says how many,
/// the first and last call ids and the codes. So a client sending refused calls as fast as
/// it can (51 MB/s of records before) costs at most `per_second` records and one summary a
/// second, and no refusal goes unrecorded.
#[derive(Default)]
struct Refusals {
    per_second: u32,
    windows: Mutex<std::collections::HashMap<String, Window>>,
}

#[derive(Default)]
struct Window {
    second: i64,
    written: u32,
    suppressed: u64,
    first_id: u64,
    last_id: u64,
    codes: std::collections::BTreeMap<String, u64>,
}

impl Window {
    fn summary(&self, principal: &str) -> Option<Value> {
        (self.suppressed > 0).then(|| {
            serde_json::json!({
                "ts": (self.second + 1) * 1000,
                "event": "refusals-summarised",
                "principal": principal,
                "second": self.second,
                "count": self.suppressed,
                "firstCallId": self.first_id,
                "lastCallId": self.last_id,
                "codes": self.codes,
            })
        })
    }
}

impl Refusals {
    /// Whether the refusal is written as itself, and the summaries of windows it closes.
    fn admit(&self, who: &str, call_id: u64, code: &str, second: i64) -> (bool, Vec<Value>) {
        if self.per_second == 0 {
            return (true, Vec::new());
        }
        let mut all = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let w = all.entry(who.to_string()).or_default();
        let mut closed = Vec::new();
        if w.second != second {
            closed.extend(w.summary(who));
            *w = Window {
                second,
                ..Window::default()
            };
        }
        if w.written < self.per_second {
            w.written += 1;
            return (true, closed);
        }
        if w.suppressed == 0 {
            w.first_id = call_id;
        }
        w.suppressed += 1;
        w.last_id = call_id;
        *w.codes.entry(code.to_string()).or_default() += 1;
        (false, closed)
    }

    /// The summaries of every window older than `second` (all of them with `i64::MAX`).
    fn flush(&self, second: i64) -> Vec<Value> {
        let mut all = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        all.retain(|who, w| {
            if w.second < second {
                out.extend(w.summary(who));
                false
            } else {
                true
            }
        });
        out
    }
}

/// The path, the file open on it and what rotation needs; swapped together on a reopen.
struct LogFile {
    path: PathBuf,
    file: File,
    /// Bytes in the file now.
    size: u64,
    /// Past this size the file is rotated before the next line (0: never).
    max_bytes: u64,
    /// Rotated files kept (`audit.jsonl.1` newest .. `.N`); the one past them is deleted.
    keep: usize,
    rotations: u64,
    /// A failed write's fragment may still end the file.
    torn: bool,
}

/// The audit log's size and rotations, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    pub bytes: u64,
    pub rotations: u64,
    /// Records that could not be written.
    pub failures: u64,
    /// Calls refused AUDIT_UNAVAILABLE.
    pub refused: u64,
}

/// `path` with `.n` appended (`audit.jsonl.1`).
fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl LogFile {
    /// Moves the file to `.1` (the older ones one step on, the one past `keep` deleted),
    /// starts a new one, and says so in its first record: the budget never drops a record
    /// silently, and a reader can follow the chain.
    fn rotate(&mut self) -> std::io::Result<()> {
        let dropped = (self.keep > 0)
            .then(|| rotated(&self.path, self.keep))
            .filter(|p| p.exists());
        for n in (1..self.keep).rev() {
            let from = rotated(&self.path, n);
            if from.exists() {
                std::fs::rename(&from, rotated(&self.path, n + 1))?;
            }
        }
        let first = if self.keep > 0 {
            std::fs::rename(&self.path, rotated(&self.path, 1))?;
            Some(rotated(&self.path, 1))
        } else {
            std::fs::remove_file(&self.path)?;
            None
        };
        let mut file = open_file(&self.path)?;
        let line = serde_json::json!({
            "ts": crate::store::now_ms(),
            "event": "audit-rotated",
            "bytes": self.size,
            "rotatedTo": first,
            "deleted": dropped,
        });
        let mut bytes = serde_json::to_vec(&line).map_err(std::io::Error::other)?;
        bytes.push(b'\n');
        file.write_all(&bytes)?;
        self.file = file;
        self.size = bytes.len() as u64;
        self.rotations += 1;
        Ok(())
    }
}

fn open_file(path: &Path) -> std::io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    repair_torn_tail(&mut file)?;
    Ok(file)
}

impl AuditLog {
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
        let file = open_file(path)?;
        let size = file.metadata()?.len();
        Ok(AuditLog {
            inner: Mutex::new(LogFile {
                path: path.to_path_buf(),
                file,
                size,
                max_bytes: 0,
                keep: 0,
                rotations: 0,
                torn: false,
            }),
            refusals: Refusals::default(),
            failures: Failures::default(),
        })
    }

    /// Refusals past `per_second` a principal are summarised (0: every one is written).
    pub fn with_refusal_budget(mut self, per_second: u32) -> AuditLog {
        self.refusals.per_second = per_second;
        self
    }

    /// Writes the summaries of the seconds that have ended (the daemon calls it every
    /// second, and at shutdown with `all`).
    pub fn flush_summaries(&self, all: bool) {
        let second = if all {
            i64::MAX
        } else {
            crate::store::now_ms() / 1000
        };
        for v in self.refusals.flush(second) {
            if let Err(e) = self.append_line(&v) {
                tracing::error!(error = %e, "audit log write failed");
            }
        }
    }

    /// A size budget: past `max_bytes` (0: none) the file is rotated, `keep` older files
    /// kept (`[daemon] audit_max_bytes`, `audit_keep`).
    pub fn with_budget(self, max_bytes: u64, keep: usize) -> AuditLog {
        {
            let mut g = self.lock();
            g.max_bytes = max_bytes;
            g.keep = keep;
        }
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogFile> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn path(&self) -> PathBuf {
        self.lock().path.clone()
    }

    pub fn stats(&self) -> AuditStats {
        let g = self.lock();
        AuditStats {
            bytes: g.size,
            rotations: g.rotations,
            failures: self.failures.lost.load(Ordering::Relaxed),
            refused: self.failures.refused.load(Ordering::Relaxed),
        }
    }

    /// Whether a record can be written now: the log's filesystem has room for one with a
    /// margin. Asked before a call that must be recorded runs (`audit_on_failure`).
    pub fn writable(&self) -> Result<(), String> {
        let g = self.lock();
        // The filesystem the open file is on (the path may be a link to another).
        room(nix::sys::statvfs::fstatvfs(&g.file), &g.path)
    }

    /// A record that could not be written: counted, and said at most once a minute (with
    /// how many since), not once per call.
    pub fn lost(&self, e: &std::io::Error) {
        let n = self.failures.lost.fetch_add(1, Ordering::Relaxed) + 1;
        self.say(n, &e.to_string());
    }

    /// A call refused AUDIT_UNAVAILABLE: counted, and said as [`AuditLog::lost`] is.
    pub fn refused(&self, why: &str) {
        self.failures.refused.fetch_add(1, Ordering::Relaxed);
        let n = self.failures.lost.load(Ordering::Relaxed);
        self.say(n, why);
    }

    fn say(&self, lost: u64, why: &str) {
        let mut said = self.failures.said.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if said.is_some_and(|(at, _)| now.duration_since(at) < std::time::Duration::from_secs(60)) {
            return;
        }
        let since = said.map_or(lost, |(_, before)| lost - before.min(lost));
        *said = Some((now, lost));
        tracing::warn!(
            path = %self.path().display(),
            error = why,
            records_lost = lost,
            records_lost_this_minute = since,
            calls_refused = self.failures.refused.load(Ordering::Relaxed),
            "the audit log cannot be written ([daemon] audit_on_failure decides what calls get)"
        );
    }

    /// Opens `path` afresh and writes there from now on (SIGHUP, after logrotate renamed the
    /// old file away, or a config naming another path). On failure the old file stays in use.
    pub fn reopen(&self, path: &Path) -> std::io::Result<()> {
        let file = open_file(path)?;
        let size = file.metadata()?.len();
        let mut g = self.lock();
        g.path = path.to_path_buf();
        g.file = file;
        g.size = size;
        Ok(())
    }

    /// Appends one record. Errors are returned so the caller can decide; the daemon logs them
    /// and still answers (a full disk must not take tool calls down with it).
    pub fn append(&self, rec: &AuditRecord) -> std::io::Result<()> {
        // A refusal: an error before any worker, upstream or approver had the call.
        let refused = rec.outcome == "ERROR"
            && rec.worker_pid.is_none()
            && rec.upstream.as_ref().is_none_or(|u| !u.reached)
            && rec.approval.is_none();
        if !refused {
            return self.append_line(rec);
        }
        let who = crate::call::vocab::principal_key(rec.principal.as_deref(), rec.peer_uid);
        let code = rec.error.as_ref().map_or("", |e| e.code.as_str());
        let (write, closed) = self.refusals.admit(&who, rec.call_id, code, rec.ts / 1000);
        for v in closed {
            self.append_line(&v)?;
        }
        if write {
            self.append_line(rec)?;
        }
        Ok(())
    }

    /// A gateway event (risk computations, poisoning hits, ledger mismatches, upstream
    /// egress), one line beside the call records; readers tell it apart by its `event` field.
    pub fn append_value(&self, v: &Value) -> std::io::Result<()> {
        self.append_line(v)
    }

    fn append_line(&self, value: &impl Serialize) -> std::io::Result<()> {
        let mut line =
            escape_line_breaks(serde_json::to_vec(value).map_err(std::io::Error::other)?);
        line.push(b'\n');
        let mut g = self.lock();
        if g.max_bytes > 0 && g.size > 0 && g.size + line.len() as u64 > g.max_bytes {
            // A failed rotation (a full disk, say) leaves the record in the current file:
            // over budget rather than lost.
            if let Err(e) = g.rotate() {
                tracing::error!(error = %e, path = %g.path.display(), "cannot rotate the audit log");
            }
        }
        if g.torn {
            // A write that failed earlier left a fragment the repair could not cut then.
            repair_torn_tail(&mut g.file)?;
            g.torn = false;
        }
        if let Err(e) = g.file.write_all(&line).and_then(|_| g.file.flush()) {
            // A full disk cuts a write at a block boundary: cut the fragment now, so the next
            // record never lands on it (every line parses); if that fails too, before the
            // next write.
            g.torn = repair_torn_tail(&mut g.file).is_err();
            g.size = g.file.metadata().map_or(g.size, |m| m.len());
            return Err(e);
        }
        g.size += line.len() as u64;
        Ok(())
    }
}

/// A record of the daemon itself rather than of a call: only a start that failed, so an
/// auditor sees why no calls were served. Readers tell it apart by its `event` field.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DaemonEvent {
    pub ts: i64,
    /// "start-failed".
    pub event: &'static str,
    pub pid: u32,
    pub version: &'static str,
    pub error: String,
}

/// Appends a daemon event to the log at `path`, best effort (the failure may be the log).
pub fn append_event(path: &Path, ev: &DaemonEvent) -> std::io::Result<()> {
    append_line(path, ev)
}

/// One JSON line appended to the log at `path` in one O_APPEND write (so lines never
/// interleave with a daemon writing the same log), the directory made if missing.
fn append_line(path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let mut line = escape_line_breaks(serde_json::to_vec(value).map_err(std::io::Error::other)?);
    line.push(b'\n');
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?
        .write_all(&line)
}

/// JSON allows U+2028, U+2029, U+0085 and the other C1 controls raw inside strings, but
/// readers that split on Unicode line breaks would see a forged record boundary: they are
/// written as `\uXXXX`. (serde_json already escapes C0 controls; these can only occur inside
/// strings, so replacing their UTF-8 bytes is exact.)
pub fn escape_line_breaks(json: Vec<u8>) -> Vec<u8> {
    let needs = json
        .windows(2)
        .any(|w| w[0] == 0xC2 && (0x80..=0x9F).contains(&w[1]))
        || json
            .windows(3)
            .any(|w| w[0] == 0xE2 && w[1] == 0x80 && (w[2] == 0xA8 || w[2] == 0xA9));
    if !needs {
        return json;
    }
    let mut out = Vec::with_capacity(json.len() + 16);
    let mut i = 0;
    while i < json.len() {
        let b = json[i];
        if b == 0xC2 && json.get(i + 1).is_some_and(|c| (0x80..=0x9F).contains(c)) {
            out.extend_from_slice(format!("\\u{:04x}", json[i + 1]).as_bytes());
            i += 2;
        } else if b == 0xE2
            && json.get(i + 1) == Some(&0x80)
            && matches!(json.get(i + 2), Some(0xA8) | Some(0xA9))
        {
            let cp = if json[i + 2] == 0xA8 { "2028" } else { "2029" };
            out.extend_from_slice(format!("\\u{cp}").as_bytes());
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    out
}

/// Arguments as the audit log records them: a string longer than `max_value` bytes becomes
/// its length and SHA-256, and when the whole is still over `max_total` bytes it is replaced
/// the same way, so one call cannot write megabytes to the log.
pub fn bounded_params(params: &Value, max_value: usize, max_total: usize) -> Value {
    fn digest_of(bytes: &[u8]) -> Value {
        let d = ring::digest::digest(&ring::digest::SHA256, bytes);
        let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        serde_json::json!({"truncated": true, "bytes": bytes.len(), "sha256": hex})
    }
    fn walk(v: &Value, max: usize) -> Value {
        match v {
            Value::String(s) if s.len() > max => digest_of(s.as_bytes()),
            Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, max)).collect()),
            Value::Object(o) => {
                Value::Object(o.iter().map(|(k, x)| (k.clone(), walk(x, max))).collect())
            }
            other => other.clone(),
        }
    }
    let v = walk(params, max_value);
    let text = serde_json::to_vec(&v).unwrap_or_default();
    if text.len() > max_total {
        digest_of(&serde_json::to_vec(params).unwrap_or_default())
    } else {
        v
    }
}

/// Cuts a message to at most `max` bytes on a character boundary, saying so.
pub fn bounded_message(m: &str, max: usize) -> String {
    if m.len() <= max {
        return m.to_string();
    }
    let mut cut = max;
    while !m.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &m[..cut], m.len())
}

/// A record for a call made outside the daemon (`stsd run`, a Local Pass of `stsd test`),
/// bounded and masked like the daemon's. `error` is the code and message of a failure.
#[allow(clippy::too_many_arguments)]
pub fn outside_record(
    spec: &stsd_protocol::ToolSpec,
    tool_id: String,
    resolved: &stsd_profiles::Resolved,
    params: Value,
    error: Option<(String, String)>,
    elapsed_ms: u64,
    worker_pid: Option<u32>,
    transport: &'static str,
) -> AuditRecord {
    AuditRecord {
        ts: crate::store::now_ms() - elapsed_ms as i64,
        call_id: 0,
        tool_id,
        name: spec.name.clone(),
        category: spec.category.clone(),
        tool_safety: Some(stsd_protocol::json::shared_json(&resolved.tool_safety)),
        risk_level: resolved.risk.to_string(),
        params: bounded_params(&params, 4096, 65536),
        outcome: if error.is_some() { "ERROR" } else { "OK" },
        error: error.map(|(code, message)| AuditError {
            code,
            message: bounded_message(&message, 4096),
        }),
        elapsed_ms,
        worker_pid,
        peer_uid: Some(nix::unistd::Uid::effective().as_raw()),
        principal: None,
        principal_kind: None,
        limits_hit: Vec::new(),
        transport,
        egress: Vec::new(),
        approval: None,
        metrics: None,
        upstream: None,
        policy: None,
        bytes: None,
    }
}

/// Appends `rec` to the configured audit log, if one is configured; a failure is reported
/// on stderr and does not change the command's outcome.
pub fn append_configured(config: &stsd_profiles::Config, rec: &AuditRecord) {
    let Some(path) = &config.daemon.audit_log else {
        return;
    };
    // No tail repair here: a daemon may be appending to the same log right now.
    if let Err(e) = append_line(path, rec) {
        eprintln!("stsd: audit log {}: {e}", path.display());
    }
}

/// Whether the filesystem holding `path` has room for a record, with a margin.
pub fn free_room(path: &Path) -> Result<(), String> {
    // The file when it exists (through a link, if it is one), else its directory.
    let at = if path.exists() {
        path
    } else {
        path.parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    };
    room(nix::sys::statvfs::statvfs(at), path)
}

fn room(v: nix::Result<nix::sys::statvfs::Statvfs>, path: &Path) -> Result<(), String> {
    match v {
        Ok(v) => {
            let free = v.blocks_available() * v.fragment_size();
            if free < AUDIT_FREE_MARGIN {
                Err(format!(
                    "the filesystem of {} has {free} bytes free, under the {AUDIT_FREE_MARGIN} \
                     a record needs",
                    path.display()
                ))
            } else {
                Ok(())
            }
        }
        Err(e) => Err(format!("the audit log {}: {e}", path.display())),
    }
}

/// Truncates a trailing partial line (left by a kill -9 mid-write) so every line parses.
fn repair_torn_tail(file: &mut File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    // Scan back in blocks for the last newline.
    let mut end = len;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let start = end.saturating_sub(buf.len() as u64);
        let n = (end - start) as usize;
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf[..n])?;
        if let Some(pos) = buf[..n].iter().rposition(|&b| b == b'\n') {
            let keep = start + pos as u64 + 1;
            if keep != len {
                file.set_len(keep)?;
            }
            return Ok(());
        }
        if start == 0 {
            return file.set_len(0);
        }
        end = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unicode_line_breaks_and_c1_controls_are_escaped() {
        let v = serde_json::json!({"a": "x\u{2028}y\u{2029}z\u{85}w\u{9f}é€"});
        let out = escape_line_breaks(serde_json::to_vec(&v).unwrap_or_default());
        let text = String::from_utf8(out).unwrap_or_default();
        assert_eq!(text, r#"{"a":"x\u2028y\u2029z\u0085w\u009fé€"}"#);
        let back: Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(back, v);
    }

    #[test]
    fn long_arguments_are_recorded_as_length_and_digest() {
        let big = "x".repeat(10_000);
        let v = bounded_params(&serde_json::json!({"a": big, "b": "short"}), 4096, 65536);
        assert_eq!(v["a"]["bytes"], 10_000);
        assert_eq!(v["a"]["sha256"].as_str().map(str::len), Some(64));
        assert_eq!(v["b"], "short");
        let many: serde_json::Map<String, Value> = (0..5000)
            .map(|i| (format!("k{i}"), Value::from("v".repeat(100))))
            .collect();
        let v = bounded_params(&Value::Object(many), 4096, 65536);
        assert_eq!(v["truncated"], true);
        assert_eq!(bounded_message("ab€cd", 3), "ab… (7 bytes in all)");
    }

    #[test]
    fn reopen_follows_a_rename_to_a_fresh_file() {
        let dir = std::env::temp_dir().join(format!("stsd-audit-reopen-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join("a.jsonl");
        let _ = std::fs::remove_file(&p);
        let log = AuditLog::open(&p).unwrap_or_else(|e| panic!("{e}"));
        let rec = outside_record_for_test();
        assert!(log.append(&rec).is_ok());
        let rotated = dir.join("a.jsonl.1");
        assert!(std::fs::rename(&p, &rotated).is_ok());
        assert!(log.append(&rec).is_ok()); // still the renamed file
        assert!(log.reopen(&p).is_ok());
        assert!(log.append(&rec).is_ok());
        let lines = |f: &Path| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .count()
        };
        assert_eq!((lines(&rotated), lines(&p)), (2, 1));
        // A reopen that fails keeps the file in use.
        assert!(log.reopen(&dir.join("no/such\0dir/x")).is_err());
        assert!(log.append(&rec).is_ok());
        assert_eq!(lines(&p), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn outside_record_for_test() -> AuditRecord {
        AuditRecord {
            ts: 0,
            call_id: 1,
            tool_id: "t".into(),
            name: "n".into(),
            category: None,
            tool_safety: None,
            risk_level: "L0".into(),
            params: serde_json::json!({}),
            outcome: "OK",
            error: None,
            elapsed_ms: 0,
            worker_pid: None,
            peer_uid: None,
            principal: None,
            principal_kind: None,
            limits_hit: Vec::new(),
            transport: "test",
            egress: Vec::new(),
            approval: None,
            metrics: None,
            upstream: None,
            policy: None,
            bytes: None,
        }
    }

    /// Issue 31 item 6: the log has a size budget. Past it the file rotates, `keep` older
    /// files stay, every record lands whole in one of them, and each new file's first record
    /// says what was rotated and what was deleted.
    #[test]
    fn a_log_over_its_budget_rotates_and_keeps_its_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&p)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_budget(2_000, 2);
        let mut written = 0;
        while log.stats().rotations < 3 {
            let v = serde_json::json!({"event": "refused", "n": written, "pad": "x".repeat(150)});
            log.append_value(&v).unwrap_or_else(|e| panic!("{e}"));
            written += 1;
        }
        let read = |p: &Path| -> Vec<Value> {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
                .collect()
        };
        for f in [p.clone(), rotated(&p, 1), rotated(&p, 2)] {
            let size = std::fs::metadata(&f).map(|m| m.len()).unwrap_or(0);
            assert!(size > 0 && size <= 2_000, "{}: {size}", f.display());
            let recs = read(&f);
            assert_eq!(recs[0]["event"], "audit-rotated", "{}", f.display());
        }
        assert!(!rotated(&p, 3).exists());
        // The third rotation deleted the oldest file, and said so.
        let now = read(&p);
        assert_eq!(
            now[0]["deleted"],
            Value::from(rotated(&p, 2).display().to_string())
        );
        assert_eq!(
            now[0]["rotatedTo"],
            Value::from(rotated(&p, 1).display().to_string())
        );
        // Records are in order across the kept files, none torn.
        let kept: Vec<i64> = [rotated(&p, 2), rotated(&p, 1), p.clone()]
            .iter()
            .flat_map(|f| read(f))
            .filter_map(|r| r["n"].as_i64())
            .collect();
        assert!(kept.windows(2).all(|w| w[1] == w[0] + 1), "{kept:?}");
        assert_eq!(kept.last().copied(), Some(written - 1));
        assert_eq!(
            log.stats().bytes,
            std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0)
        );
    }

    fn refusal(call_id: u64, uid: u32, ts: i64) -> AuditRecord {
        let caller = crate::call::vocab::Caller {
            peer_uid: Some(uid),
            principal: None,
            transport: "unix",
            session: 1,
        };
        let mut r = AuditRecord::arrived(
            call_id,
            &caller,
            "id".into(),
            "slow".into(),
            "L1".into(),
            Value::Null,
        );
        r.ts = ts;
        r.error = Some(AuditError {
            code: "INVALID_INPUT".into(),
            message: "ms: expected a number".into(),
        });
        r
    }

    fn log_with_refusal_budget(n: u32) -> (tempfile::TempDir, std::path::PathBuf, AuditLog) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("audit.jsonl");
        let log = AuditLog::open(&p)
            .unwrap_or_else(|e| panic!("{e}"))
            .with_refusal_budget(n);
        (dir, p, log)
    }

    fn records_in(p: &std::path::Path) -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}")))
            .collect()
    }

    /// Issue 31 item 6: refusals past the per-principal budget are counted into one summary
    /// a second; none is lost, other principals and calls that ran are written as they come.
    #[test]
    fn refusals_past_the_budget_are_summarised_not_lost() {
        let (_dir, p, log) = log_with_refusal_budget(3);
        let t = 1_000_000_000;
        for id in 1..=10 {
            log.append(&refusal(id, 7, t + 10))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        log.append(&refusal(11, 8, t + 20))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut ran = refusal(12, 7, t + 30);
        ran.worker_pid = Some(42);
        log.append(&ran).unwrap_or_else(|e| panic!("{e}"));
        // The next second's first refusal closes the window: its summary comes first.
        log.append(&refusal(13, 7, t + 1_000))
            .unwrap_or_else(|e| panic!("{e}"));
        log.flush_summaries(true);
        let recs = records_in(&p);
        let ids: Vec<u64> = recs.iter().filter_map(|r| r["callId"].as_u64()).collect();
        assert_eq!(ids, vec![1, 2, 3, 11, 12, 13]);
        let sums: Vec<&Value> = recs
            .iter()
            .filter(|r| r["event"] == "refusals-summarised")
            .collect();
        assert_eq!(sums.len(), 1, "{recs:?}");
        assert_eq!(sums[0]["principal"], "uid:7");
        assert_eq!(sums[0]["count"], 7);
        assert_eq!(
            (
                sums[0]["firstCallId"].clone(),
                sums[0]["lastCallId"].clone()
            ),
            (Value::from(4), Value::from(10))
        );
        assert_eq!(sums[0]["codes"]["INVALID_INPUT"], 7);
        // Every refusal is accounted for: written, or counted in a summary.
        assert_eq!(ids.len() as u64 - 1 + 7, 12);
    }

    /// A wrapped upstream tool's call refused at stsd's door (bad arguments, the rate) is a
    /// refusal like any other; one the upstream answered with an error is not.
    #[test]
    fn upstream_refusals_count_against_the_budget_and_upstream_errors_do_not() {
        let (_dir, p, log) = log_with_refusal_budget(1);
        let t = 1_000_000_000;
        let upstream = |id: u64, reached: bool| {
            let mut r = refusal(id, 7, t + 10);
            r.upstream = Some(UpstreamAudit {
                id: "u".into(),
                tool: "t".into(),
                server_risk: "L1".into(),
                tool_risk: "L1".into(),
                floor_trigger: None,
                reached,
            });
            r
        };
        for id in 1..=5 {
            log.append(&upstream(id, false))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        log.append(&upstream(6, true))
            .unwrap_or_else(|e| panic!("{e}"));
        log.flush_summaries(true);
        let recs = records_in(&p);
        let ids: Vec<u64> = recs.iter().filter_map(|r| r["callId"].as_u64()).collect();
        assert_eq!(ids, vec![1, 6], "{recs:?}");
        let counted: u64 = recs
            .iter()
            .filter(|r| r["event"] == "refusals-summarised")
            .filter_map(|r| r["count"].as_u64())
            .sum();
        assert_eq!(counted, 4);
    }

    #[test]
    fn a_torn_tail_is_trimmed_to_the_last_complete_line() {
        let dir = std::env::temp_dir().join(format!("stsd-audit-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join("a.jsonl");
        let _ = std::fs::write(&p, b"{\"a\":1}\n{\"b\":2}\n{\"c\":");
        let log = AuditLog::open(&p);
        assert!(log.is_ok());
        assert_eq!(
            std::fs::read(&p).unwrap_or_default(),
            b"{\"a\":1}\n{\"b\":2}\n"
        );
        let _ = std::fs::write(&p, b"{\"torn");
        let _ = AuditLog::open(&p);
        assert_eq!(std::fs::read(&p).unwrap_or_default(), b"");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
