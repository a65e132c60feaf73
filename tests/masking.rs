//! Secrets with `"`, `\`, `%`, `+`, spaces and non-ASCII characters never leave in clear, in
//! any form a tool can give them without transforming them itself: as they are, JSON-escaped
//! (objects, arrays, thrown values), percent-encoded, base64; in results, structured results,
//! errors, console lines cut at every position around the line limit, the audit log, and
//! `stsd run --json`. The code holds the secret here (`[secrets.NAME] expose_to_code`): by
//! default it would hold only a placeholder (tests/secrets_egress.rs), and masking would have
//! nothing to do.

use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use stsd_tests::harness::{meta, Daemon};
use stsd_tests::stsd_bin;

const SECRET: &str = "s3\"cr\\et%2B+ wört€-Ω";

fn specs() -> Value {
    let tool = |name: &str, code: &str| {
        json!({"name": name, "description": "masking test", "codeType": "Javascript",
               "draft": false, "staticVariables": [{"token": "${STSD_HOSTILE_SECRET}"}],
               "params": [{"name": "k", "type": "INTEGER", "required": false,
                           "description": "", "testValue": "1"}],
               "code": code})
    };
    json!([
        tool(
            "returnsObject",
            "return {t: token, nested: [token, {deep: token}]};"
        ),
        tool("returnsArray", "return [token, 'x' + token + 'y'];"),
        tool("returnsString", "return 'token is ' + token;"),
        tool("throwsObject", "throw {secret: token};"),
        tool(
            "throwsError",
            "throw new Error('bad ' + JSON.stringify({token}));"
        ),
        tool(
            "encodes",
            "return [encodeURIComponent(token), btoa(unescape(encodeURIComponent(token))), \
                         new URLSearchParams({q: token}).toString()];"
        ),
        tool(
            "logsAtCut",
            "console.log('x'.repeat(16384 - k) + token + 'after'); return 'ok';"
        ),
    ])
}

/// Every form of the secret a reader could turn back into it.
fn leaks(text: &str) -> Vec<String> {
    let json = serde_json::to_string(SECRET).unwrap_or_default();
    let escaped = &json[1..json.len() - 1];
    let mut found = Vec::new();
    for (what, form) in [
        ("raw", SECRET.to_string()),
        ("json", escaped.to_string()),
        ("raw prefix", SECRET[..6].to_string()),
        ("percent", "s3%22cr%5Cet%252B%2B".to_string()),
    ] {
        if text.contains(&form) {
            found.push(format!("{what}: {form}"));
        }
    }
    found
}

fn daemon() -> Daemon {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("m.json");
    std::fs::write(&catalog, specs().to_string()).unwrap_or_else(|e| panic!("{e}"));
    let c = catalog.display().to_string();
    Daemon::launch_env(
        dir,
        1,
        "[secrets.STSD_HOSTILE_SECRET]\nexpose_to_code = true\n",
        Some(&c),
        &[],
        None,
        &[("STSD_HOSTILE_SECRET", SECRET)],
    )
}

#[test]
fn no_form_of_a_hostile_secret_leaves_the_daemon() {
    let d = daemon();
    let mut c = d.connect();
    let mut all = String::new();
    let mut id = 0;
    let mut call = |c: &mut stsd_tests::harness::Conn, tool: &str, k: u64| {
        id += 1;
        let mut params = json!({"name": tool, "arguments": {"k": k}, "_meta": meta()});
        params["_meta"]["io.modelcontextprotocol/logLevel"] = json!("debug");
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        c.writer
            .write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        // Everything up to the response, notifications included.
        let mut seen = String::new();
        loop {
            let mut l = String::new();
            let n = c.reader.read_line(&mut l).unwrap_or_else(|e| panic!("{e}"));
            assert!(n > 0, "connection closed");
            seen.push_str(&l);
            if l.contains(&format!("\"id\":{id}")) {
                break;
            }
        }
        seen
    };
    for tool in [
        "returnsObject",
        "returnsArray",
        "returnsString",
        "throwsObject",
        "throwsError",
        "encodes",
    ] {
        let out = call(&mut c, tool, 1);
        assert!(out.contains("***"), "{tool}: nothing masked in {out}");
        all.push_str(&out);
    }
    // The secret straddles the 16 KiB console cut at every position.
    for k in 0..=(SECRET.len() as u64 + 2) {
        all.push_str(&call(&mut c, "logsAtCut", k));
    }
    let l = leaks(&all);
    assert!(l.is_empty(), "leaked over MCP: {l:?}");
    let audit = std::fs::read_to_string(&d.audit).unwrap_or_default();
    assert!(audit.contains("***"));
    let l = leaks(&audit);
    assert!(l.is_empty(), "leaked into the audit log: {l:?}");
}

#[test]
fn stsd_run_json_masks_every_form_too() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("m.json");
    std::fs::write(&catalog, specs().to_string()).unwrap_or_else(|e| panic!("{e}"));
    for tool in [
        "returnsObject",
        "returnsArray",
        "throwsObject",
        "throwsError",
        "encodes",
        "logsAtCut",
    ] {
        for k in [1u64, 5] {
            let out = Command::new(stsd_bin())
                .args(["run", "--json", "--tool", tool, "--arg"])
                .arg(format!("k={k}"))
                .arg(&catalog)
                .env("STSD_HOSTILE_SECRET", SECRET)
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| panic!("{e}"));
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let l = leaks(&text);
            assert!(l.is_empty(), "{tool} k={k}: leaked {l:?} in {text}");
        }
    }
}

/// A spec cannot read the daemon's own environment unless the operator lists the name.
#[test]
fn specs_see_only_the_environment_the_operator_allows() {
    let catalog = json!([
        {"name": "readsHome", "description": "env test", "codeType": "Javascript", "draft": false,
         "staticVariables": [{"h": "${HOME}"}], "code": "return h;"},
        {"name": "readsPath", "description": "env test", "codeType": "Javascript", "draft": false,
         "staticVariables": [{"p": "${PATH}"}], "code": "return p;"},
    ]);
    let names = |extra: &str| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("env.json");
        std::fs::write(&path, catalog.to_string()).unwrap_or_else(|e| panic!("{e}"));
        let p = path.display().to_string();
        let d = Daemon::launch(dir, 1, extra, Some(&p), &[], None);
        let mut c = d.connect();
        c.send(1, "tools/list", json!({}));
        let r = c.response();
        let mut n: Vec<String> = r["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["name"].as_str().map(String::from))
            .collect();
        n.sort();
        n
    };
    // The harness allows only STSD_TEST_* and STSD_HOSTILE_SECRET.
    assert!(names("").is_empty());
    let out = Command::new(stsd_bin())
        .args(["run", "--json", "--tool", "readsHome"])
        .arg({
            let p = std::env::temp_dir().join(format!("stsd-env-{}.json", std::process::id()));
            std::fs::write(&p, catalog.to_string()).unwrap_or_else(|e| panic!("{e}"));
            p
        })
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("MISSING_REQUIREMENTS") && text.contains("HOME"),
        "{text}"
    );
    let home = std::env::var("HOME").unwrap_or_default();
    assert!(home.is_empty() || !text.contains(&home), "{text}");
}
