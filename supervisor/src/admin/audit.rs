//! `stsd/audit/list`: audit records filtered by tool, principal and outcome (each a
//! case-insensitive substring; empty: any). Without `after`: the latest ones, newest first,
//! read from the end of the log (its last 4 MiB), so the cost does not grow with the log.
//! With `after` (a byte offset a previous answer gave as `end`): the records written since,
//! oldest first, each exactly once (a log shorter than `after` was rotated: read from its
//! start). Records are masked when they are written; nothing is unmasked here.

use serde_json::{json, Value};
use std::io::{Read, Seek, SeekFrom};

/// How much of the log is read at most.
const TAIL_BYTES: u64 = 4 * 1024 * 1024;
const MAX_LIMIT: usize = 1000;

pub(super) fn list(
    path: Option<std::path::PathBuf>,
    params: &Value,
) -> Result<Value, (i32, String)> {
    let Some(path) = path else {
        return Ok(json!({"records": [], "end": 0, "note": "this daemon writes no audit log"}));
    };
    let after = params.get("after").and_then(Value::as_u64);
    let (text, end) =
        read(&path, after).map_err(|e| (-32603, format!("{}: {e}", path.display())))?;
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
    let keep = |r: &Value| {
        tool.as_ref()
            .is_none_or(|t| field(r, &["name", "tool", "method"]).contains(t))
            && principal
                .as_ref()
                .is_none_or(|p| field(r, &["principal", "peerUid"]).contains(p))
            && outcome
                .as_ref()
                .is_none_or(|o| field(r, &["outcome", "decision"]).contains(o))
    };
    let lines: Box<dyn Iterator<Item = &str>> = if after.is_some() {
        Box::new(text.lines())
    } else {
        Box::new(text.lines().rev())
    };
    let mut out = Vec::new();
    for line in lines {
        let Ok(mut r) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if keep(&r) {
            if let Some(ts) = r["ts"].as_i64() {
                r["time"] = json!(utc(ts));
            }
            out.push(r);
            if out.len() >= limit && after.is_none() {
                break;
            }
        }
    }
    Ok(json!({"records": out, "end": end}))
}

/// The text to read and the offset it ends at (after its last whole line). `after`: from
/// there (from the start when the log is shorter: rotated), at most [`TAIL_BYTES`]; else
/// the last [`TAIL_BYTES`] from their first whole line.
fn read(path: &std::path::Path, after: Option<u64>) -> std::io::Result<(String, u64)> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let start = match after {
        Some(a) if a <= len => a,
        Some(_) => 0,
        None => len.saturating_sub(TAIL_BYTES),
    };
    f.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    f.take(TAIL_BYTES).read_to_end(&mut bytes)?;
    // Only whole lines: a record being written is read next time.
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    bytes.truncate(whole);
    let end = start + whole as u64;
    let mut text = String::from_utf8_lossy(&bytes).into_owned();
    if after.is_none() && start > 0 {
        text = text
            .split_once('\n')
            .map(|(_, rest)| rest.to_string())
            .unwrap_or_default();
    }
    Ok((text, end))
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

    #[test]
    fn a_tail_from_an_offset_sends_each_record_once_whatever_their_times() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        // Times out of order, as calls finish: the offset, not the time, is the cursor.
        std::fs::write(
            &path,
            "{\"ts\": 150, \"name\": \"a\"}\n{\"ts\": 100, \"name\": \"b\"}\n",
        )
        .expect("w");
        let first = list(Some(path.clone()), &json!({})).expect("list");
        let end = first["end"].as_u64().expect("end");
        let none = list(Some(path.clone()), &json!({"after": end})).expect("list");
        assert_eq!(none["records"].as_array().map(Vec::len), Some(0));
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        f.write_all(b"{\"ts\": 90, \"name\": \"c\"}\n{\"ts\": 95, \"na")
            .expect("w");
        let next = list(Some(path.clone()), &json!({"after": end})).expect("list");
        let names: Vec<&str> = next["records"]
            .as_array()
            .expect("r")
            .iter()
            .map(|r| r["name"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(names, ["c"], "the half-written line waits");
        let end2 = next["end"].as_u64().expect("end");
        f.write_all(b"me\": \"d\"}\n").expect("w");
        let last = list(Some(path.clone()), &json!({"after": end2})).expect("list");
        assert_eq!(last["records"][0]["name"], "d");
        // Rotated: shorter than the offset, read from its start.
        std::fs::write(&path, "{\"ts\": 1, \"name\": \"e\"}\n").expect("w");
        let rotated = list(Some(path), &json!({"after": end2 + 100})).expect("list");
        assert_eq!(rotated["records"][0]["name"], "e");
    }
}
