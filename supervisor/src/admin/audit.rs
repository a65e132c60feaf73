//! `stsd/audit/list`: the latest audit records, newest first, filtered by tool, principal and
//! outcome (each a case-insensitive substring; empty: any). Read from the end of the audit
//! log (its last 4 MiB), so the cost does not grow with the log. Records are masked when they
//! are written; nothing is unmasked here.

use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom};

/// How much of the log's end is read.
const TAIL_BYTES: u64 = 4 * 1024 * 1024;
const MAX_LIMIT: usize = 1000;

pub(super) fn list(
    path: Option<std::path::PathBuf>,
    params: &Value,
) -> Result<Value, (i32, String)> {
    let Some(path) = path else {
        return Ok(json!({"records": [], "note": "this daemon writes no audit log"}));
    };
    let text = tail(&path).map_err(|e| (-32603, format!("{}: {e}", path.display())))?;
    let want = |k: &str| {
        params
            .get(k)
            .and_then(Value::as_str)
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| !s.is_empty())
    };
    let (tool, principal, outcome) = (want("tool"), want("principal"), want("outcome"));
    let limit = params
        .get("limit")
        .and_then(Value::as_u64)
        .map_or(200, |n| n as usize)
        .min(MAX_LIMIT);
    let field = |r: &Value, keys: &[&str]| -> String {
        keys.iter()
            .find_map(|k| match &r[*k] {
                Value::String(s) => Some(s.to_ascii_lowercase()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            })
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for line in text.lines().rev() {
        let Ok(mut r) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let keep = tool
            .as_ref()
            .is_none_or(|t| field(&r, &["name", "tool", "method"]).contains(t))
            && principal
                .as_ref()
                .is_none_or(|p| field(&r, &["principal", "peerUid"]).contains(p))
            && outcome
                .as_ref()
                .is_none_or(|o| field(&r, &["outcome", "decision"]).contains(o));
        if keep {
            if let Some(ts) = r["ts"].as_i64() {
                r["time"] = json!(utc(ts));
            }
            out.push(r);
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(json!({"records": out}))
}

/// The last [`TAIL_BYTES`] of the file, from its first whole line.
fn tail(path: &std::path::Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(TAIL_BYTES);
    f.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Ok(if start > 0 {
        text.split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default()
    } else {
        text
    })
}

/// Epoch milliseconds as `YYYY-MM-DD HH:MM:SS` UTC.
fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_newest_first_and_filtered() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let lines = [
            json!({"ts": 0, "name": "readFile", "principal": "alice", "outcome": "OK"}),
            json!({"ts": 1_795_000_000_000i64, "name": "deleteFile", "principal": "bob", "outcome": "ERROR"}),
            json!({"ts": 2, "event": "console", "method": "stsd/tools/disable", "principal": "alice", "outcome": "ok"}),
        ];
        let text: Vec<String> = lines.iter().map(Value::to_string).collect();
        std::fs::write(&path, text.join("\n") + "\nnot json\n").expect("write");
        let all = list(Some(path.clone()), &json!({})).expect("list");
        let names: Vec<&str> = all["records"]
            .as_array()
            .expect("records")
            .iter()
            .map(|r| r["principal"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(names, ["alice", "bob", "alice"]);
        let alice = list(Some(path.clone()), &json!({"principal": "ALI"})).expect("list");
        assert_eq!(alice["records"].as_array().map(Vec::len), Some(2));
        let errors = list(Some(path.clone()), &json!({"outcome": "error"})).expect("list");
        assert_eq!(errors["records"][0]["name"], "deleteFile");
        assert_eq!(errors["records"][0]["time"], "2026-11-18 11:06:40");
        let console = list(Some(path), &json!({"tool": "disable", "limit": 1})).expect("list");
        assert_eq!(console["records"].as_array().map(Vec::len), Some(1));
        assert_eq!(utc(0), "1970-01-01 00:00:00");
    }
}
