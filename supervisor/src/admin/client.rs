//! The admin channel's client: one JSON-RPC request on the daemon's socket, one answer. The
//! CLI verbs are built on it; library callers can use it (or any JSON-RPC over a Unix socket).

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Calls `method` with `params`; Ok(result) or Err(message), JSON-RPC errors included.
pub fn call(socket: &Path, method: &str, params: Value) -> Result<Value, String> {
    call_with(socket, method, params, &mut |_| {})
}

/// [`call`], handing every notification that arrives before the answer to `notified` (an MCP
/// call's console lines).
pub fn call_with(
    socket: &Path,
    method: &str,
    params: Value,
    notified: &mut dyn FnMut(&Value),
) -> Result<Value, String> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        format!(
            "cannot reach the daemon on {}: {e} (is it running? --socket / STSD_SOCKET)",
            socket.display()
        )
    })?;
    // Long enough for a call that waits on an approval and then runs.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(3600)));
    let line = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    (&stream)
        .write_all(format!("{line}\n").as_bytes())
        .map_err(|e| format!("writing to the daemon: {e}"))?;
    let mut reader = BufReader::new(&stream);
    loop {
        let mut text = String::new();
        let n = reader
            .read_line(&mut text)
            .map_err(|e| format!("reading the daemon's answer: {e}"))?;
        if n == 0 {
            return Err("the daemon closed the connection without an answer".into());
        }
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("the daemon answered something that is not JSON: {e}"))?;
        if let Some(err) = v.get("error") {
            return Err(err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_string());
        }
        if v.get("id") == Some(&json!(1)) {
            return Ok(v.get("result").cloned().unwrap_or(Value::Null));
        }
        if v.get("method").is_some() {
            notified(&v);
        }
    }
}
