//! The command strategy: an executable gets the request as one JSON document on stdin and
//! answers `{"approved": bool, "reason": "..."}` on stdout within a timeout. It runs with an
//! empty environment, no secret (the arguments it sees are masked), stdin/stdout pipes and
//! stderr discarded; whatever goes wrong (no such program, a crash, a timeout, an answer that
//! is not that object) is an approver failure, and the call does not run (fail closed).

use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest answer read from the program.
const MAX_ANSWER: u64 = 64 * 1024;

/// Ok((approved, reason)) or why the approver failed.
pub async fn ask(
    argv: &[String],
    request: &Value,
    timeout: Duration,
) -> Result<(bool, String), String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("no command configured".into());
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            let body = serde_json::to_vec(request).map_err(|e| e.to_string())?;
            // A program that does not read its stdin may still answer.
            let _ = stdin.write_all(&body).await;
            drop(stdin);
        }
        let mut out = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            stdout
                .take(MAX_ANSWER)
                .read_to_end(&mut out)
                .await
                .map_err(|e| format!("reading its answer: {e}"))?;
        }
        let status = child.wait().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((status, out))
    };
    let (status, out) = match tokio::time::timeout(timeout, run).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(format!(
                "{program} did not answer within {} ms",
                timeout.as_millis()
            ))
        }
    };
    if !status.success() {
        return Err(format!("{program} failed ({status})"));
    }
    let v: Value = serde_json::from_slice(&out)
        .map_err(|e| format!("{program} answered something that is not JSON: {e}"))?;
    let approved = v
        .get("approved")
        .and_then(Value::as_bool)
        .ok_or_else(|| format!("{program}'s answer has no boolean \"approved\""))?;
    let reason = v
        .get("reason")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .chars()
        .take(1024)
        .collect();
    Ok((approved, reason))
}
