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
    pub tool_safety: Value,
    pub risk_level: String,
    /// Arguments as received (after validation), secrets masked.
    pub params: Value,
    /// "OK" or "ERROR".
    pub outcome: &'static str,
    pub error: Option<AuditError>,
    pub elapsed_ms: u64,
    pub worker_pid: Option<u32>,
    pub peer_uid: Option<u32>,
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
    pub approval: Option<crate::approval::ApprovalRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AuditError {
    pub code: String,
    pub message: String,
}

pub struct AuditLog {
    path: PathBuf,
    file: Mutex<File>,
}

impl AuditLog {
    pub fn open(path: &Path) -> std::io::Result<AuditLog> {
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
        Ok(AuditLog {
            path: path.to_path_buf(),
            file: Mutex::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record. Errors are returned so the caller can decide; the daemon logs them
    /// and still answers (a full disk must not take tool calls down with it).
    pub fn append(&self, rec: &AuditRecord) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(&line)?;
        f.flush()
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
