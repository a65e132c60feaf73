//! Issue 32: one door. The same cases through every entry point (MCP on the daemon's
//! socket, `stsd call`, MCP over HTTP, the stdio server's embedded mode, `stsd run`, `stsd
//! test`) give the
//! same decision and error code, and each call writes exactly one audit record with the
//! same fields.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use stsd_tests::harness::{is_error, text, Daemon};
use stsd_tests::stsd_bin;

/// (tool, arguments, the outcome at the doors that serve agents (MCP on the socket, `stsd
/// call`, HTTP, `stsd mcp`), the outcome at the operator's doors on a file (`stsd run`,
/// `stsd test`)): "OK" or the error code. They differ only for a tool that is not served
/// (disabled, a draft): serving is what the operator's doors exist to earn, so they run the
/// file they are given, with every other step of the call the same.
const CASES: [(&str, &str, &str, &str); 12] = [
    ("twice", r#"{"n": 21}"#, "OK", "OK"),
    ("twice", r#"{"n": "x"}"#, "INVALID_INPUT", "INVALID_INPUT"),
    ("gatedNo", "{}", "APPROVAL_REJECTED", "APPROVAL_REJECTED"),
    ("gatedYes", "{}", "OK", "OK"),
    // Seeds 002/003: the tool's own `requiresApproval: false` exempts it from a global rule.
    ("exempt", "{}", "OK", "OK"),
    ("off", "{}", "TOOL_WITHHELD", "OK"),
    ("drafty", "{}", "TOOL_WITHHELD", "OK"),
    // Every limit that ends a call.
    ("spin", "{}", "STEP_LIMIT", "STEP_LIMIT"),
    ("sorts", "{}", "TIMEOUT", "TIMEOUT"),
    ("hog", "{}", "MEMORY_LIMIT", "MEMORY_LIMIT"),
    ("big", "{}", "OUTPUT_LIMIT", "OUTPUT_LIMIT"),
    ("twice", r#"{"n": 2}"#, "OK", "OK"),
];

/// The catalog: each spec's testCases are its cases above, in order (`stsd test --case N`).
fn catalog(dir: &Path) -> PathBuf {
    let spec = |name: &str, code: &str, params: Value| {
        let cases: Vec<Value> = CASES
            .iter()
            .filter(|c| c.0 == name)
            .map(|(_, args, _, want)| {
                let mut c = json!({"name": format!("{name} {args}"),
                                   "arguments": serde_json::from_str::<Value>(args).unwrap_or_default()});
                if *want != "OK" {
                    c["expectedSuccess"] = json!(false);
                    c["expectedErrorCode"] = json!(want);
                }
                c
            })
            .collect();
        json!({"name": name, "description": format!("{name}: a tool of the one-door test"),
               "codeType": "Javascript", "draft": false, "code": code, "params": params,
               "testCases": cases})
    };
    let n = json!([{"name": "n", "type": "INTEGER", "required": true, "description": "", "testValue": "21"}]);
    let mut exempt = spec("exempt", "return 'ran';", json!([]));
    exempt["category"] = json!("OPS");
    let mut drafty = spec("drafty", "return 'ran';", json!([]));
    drafty["draft"] = json!(true);
    let specs = json!([
        spec("twice", "return n * 2;", n),
        spec("gatedNo", "return 'ran';", json!([])),
        spec("gatedYes", "return 'ran';", json!([])),
        exempt,
        spec("off", "return 'ran';", json!([])),
        drafty,
        // The step budget (the default, 5,000,000) ends a bare loop in well under a second.
        spec("spin", "while (true) {}", json!([])),
        // Native sorting spends the deadline between two steps: the clock ends it.
        spec("sorts", "const a = []; for (let i = 0; i < 300000; i++) a.push(i * 7919 % 300007); while (true) { a.slice().sort(); }", json!([])),
        // 4 MiB a step, in few steps and little CPU: the heap's limit (128 MiB), not the
        // one-second deadline, ends it even in a debug build on a loaded machine (megabyte
        // strings, built a character at a time by QuickJS compiled without optimisation,
        // took longer than the deadline there beside two busy loops).
        spec("hog", "const a = []; while (true) { a.push(new Array(1 << 18).fill(a.length)); }", json!([])),
        spec("big", "return 'x'.repeat(4 << 20);", json!([])),
    ]);
    let path = dir.join("one-door.json");
    std::fs::write(&path, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let toolsets = json!({"mediaType": "application/vnd.cjson-toolsets+json",
        "schema": "https://schema.cjson.dev/0/toolsets/cjson-toolsets-0.1.0-SNAPSHOT.schema.json",
        "toolsets": [{"id": "door", "kind": "builtin", "tools": [
            {"name": "off", "enabled": false},
            {"name": "exempt", "requiresApproval": false}]}]});
    std::fs::write(dir.join("toolsets.json"), toolsets.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    path
}

/// The policy every door shares: one tool always refused,
/// one always approved by a command approver, and a global rule (by category) that refuses.
const POLICY: &str = r#"[[approval.rule]]
tools = ["gatedNo"]
require = true
strategy = "reject"
reason = "not through any door"

[[approval.rule]]
tools = ["gatedYes"]
require = true
strategy = "command"
command = ["/bin/sh", "-c", "cat >/dev/null; echo '{\"approved\": true, \"reason\": \"fine\"}'"]

[[approval.rule]]
category = "OPS"
require = true
strategy = "reject"
reason = "global deny"
"#;

/// The toolsets document (`--toolsets` for the daemon, `[daemon] toolsets` without it).
fn toolsets(cat: &Path) -> String {
    cat.with_file_name("toolsets.json").display().to_string()
}

/// A one-second deadline and the default step budget.
const BASELINE: &str = "[baseline]
timeout_seconds = 1
max_steps = 5000000
";

/// A config of its own for a door that runs without the daemon.
fn cli_config(dir: &Path, cat: &Path, door: &str) -> (PathBuf, PathBuf) {
    let audit = dir.join(format!("{door}-audit.jsonl"));
    let config = dir.join(format!("{door}.toml"));
    std::fs::write(
        &config,
        format!(
            "{BASELINE}[daemon]\naudit_log = \"{}\"\nrequire_local_pass = false\ncatalog_dir = \"{}\"\ntoolsets = [\"{}\"]\n{}",
            audit.display(),
            dir.join(format!("{door}-managed")).display(),
            toolsets(cat),
            POLICY
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    (config, audit)
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &Value| r.get("callId").is_some())
        .collect()
}

/// "OK" or the code, from a reply's text ("CODE: message").
fn code_of_text(is_err: bool, text: &str) -> String {
    if is_err {
        text.split(':').next().unwrap_or_default().to_string()
    } else {
        "OK".into()
    }
}

/// "OK" or the code, from `stsd run --json` / `stsd call --json`.
fn code_of_json(v: &Value) -> String {
    if v["ok"] == json!(true) {
        "OK".into()
    } else {
        v["error"]["code"].as_str().unwrap_or("?").to_string()
    }
}

/// What every door's record for a case must agree on.
fn projection(r: &Value) -> Value {
    json!({
        "name": r["name"], "toolId": r["toolId"], "riskLevel": r["riskLevel"],
        "outcome": r["outcome"], "code": r["error"]["code"],
        "approval": r["approval"]["decision"], "limitsHit": r["limitsHit"],
        "toolSafety": r["toolSafety"],
    })
}

fn socket_door(dir: tempfile::TempDir, cat: &Path) -> (Vec<String>, Vec<Value>) {
    let d = Daemon::start_with(
        dir,
        2,
        &format!("{BASELINE}{POLICY}"),
        &cat.display().to_string(),
        &["--toolsets", &toolsets(cat)],
    );
    let mut c = d.connect();
    let mut got = Vec::new();
    for (i, (tool, args, _, _)) in CASES.iter().enumerate() {
        c.call(
            i as u64,
            tool,
            serde_json::from_str(args).unwrap_or_default(),
        );
        let r = c.response();
        got.push(code_of_text(is_error(&r), &text(&r)));
    }
    (got, records(&d.audit))
}

/// One MCP request over plain HTTP on loopback (2026-07-28: stateless, one POST per call);
/// the answer from its event stream.
fn http_call(port: u16, token: &str, id: usize, tool: &str, args: &str) -> Value {
    use std::io::Read;
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": serde_json::from_str::<Value>(args).unwrap_or_default(),
                   "_meta": stsd_tests::harness::meta()}})
    .to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "HTTP listener: {e}");
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    };
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: {tool}\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    // De-chunk the body when it is chunked.
    let mut body = String::new();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut r = rest;
        while let Some((size, after)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            body.push_str(&after[..n]);
            r = after[n..].strip_prefix("\r\n").unwrap_or(&after[n..]);
        }
    } else {
        body.push_str(rest);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v.get("id") == Some(&json!(id)))
        .unwrap_or_else(|| panic!("no answer to {id} in: {raw}"))
}

fn http_door(dir: tempfile::TempDir, cat: &Path) -> (Vec<String>, Vec<Value>) {
    let tokens = dir.path().join("tokens");
    let out = Command::new(stsd_bin())
        .args(["token", "add", "door", "--file"])
        .arg(&tokens)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(token.starts_with("stsd_"), "{token:?}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"));
    let listen = format!("127.0.0.1:{port}");
    let d = Daemon::start_with(
        dir,
        2,
        &format!(
            "{BASELINE}{}\n[http]\ntokens_file = \"{}\"\n",
            POLICY,
            tokens.display()
        ),
        &cat.display().to_string(),
        &["--listen", &listen, "--toolsets", &toolsets(cat)],
    );
    let mut got = Vec::new();
    for (i, (tool, args, _, _)) in CASES.iter().enumerate() {
        let r = http_call(port, &token, i, tool, args);
        got.push(code_of_text(is_error(&r), &text(&r)));
    }
    (got, records(&d.audit))
}

fn call_door(dir: tempfile::TempDir, cat: &Path) -> (Vec<String>, Vec<Value>) {
    let d = Daemon::start_with(
        dir,
        2,
        &format!("{BASELINE}{POLICY}"),
        &cat.display().to_string(),
        &["--toolsets", &toolsets(cat)],
    );
    let mut got = Vec::new();
    for (tool, args, _, _) in CASES {
        let out = Command::new(stsd_bin())
            .args(["call", tool, "--json", "--args-json", args, "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{tool} {args}: {e}: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        got.push(code_of_json(&v));
    }
    (got, records(&d.audit))
}

fn run_door(dir: &Path, cat: &Path) -> (Vec<String>, Vec<Value>) {
    let (config, audit) = cli_config(dir, cat, "run");
    let mut got = Vec::new();
    for (tool, args, _, _) in CASES {
        let out = Command::new(stsd_bin())
            .env("STSD_STATE_DIR", dir.join("state"))
            .arg("run")
            .arg(cat)
            .args(["--tool", tool, "--json", "--args-json", args, "--config"])
            .arg(&config)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{e}: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        got.push(code_of_json(&v));
    }
    (got, records(&audit))
}

fn test_door(dir: &Path, cat: &Path) -> (Vec<String>, Vec<Value>) {
    let (config, audit) = cli_config(dir, cat, "test");
    let mut by_name = std::collections::HashMap::new();
    let most = CASES
        .iter()
        .map(|c| CASES.iter().filter(|d| d.0 == c.0).count())
        .max()
        .unwrap_or(0);
    for case in 0..most {
        let out = Command::new(stsd_bin())
            .env("STSD_STATE_DIR", dir.join("state"))
            .arg("test")
            .arg(cat)
            .args(["--json", "--case", &case.to_string(), "--config"])
            .arg(&config)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        for r in v["results"].as_array().into_iter().flatten() {
            let code = if r["result"]["success"] == json!(true) {
                "OK".to_string()
            } else {
                r["result"]["error"]["code"]
                    .as_str()
                    .unwrap_or("?")
                    .to_string()
            };
            by_name.insert(r["name"].as_str().unwrap_or_default().to_string(), code);
        }
    }
    let got = CASES
        .iter()
        .map(|(tool, args, _, _)| {
            by_name
                .get(&format!("{tool} {args}"))
                .cloned()
                .unwrap_or_else(|| format!("no result for {tool} {args}: {by_name:?}"))
        })
        .collect();
    (got, records(&audit))
}

fn stdio_door(dir: &Path, cat: &Path) -> (Vec<String>, Vec<Value>) {
    let (config, audit) = cli_config(dir, cat, "stdio");
    let mut child = Command::new(stsd_bin())
        .env("STSD_STATE_DIR", dir.join("state"))
        .arg("mcp")
        .arg("--config")
        .arg(&config)
        .arg("--catalog")
        .arg(cat)
        .arg("--socket")
        .arg(dir.join("no-daemon.sock"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap_or_else(|| panic!("no stdout")));
    let mut got = Vec::new();
    for (i, (tool, args, _, _)) in CASES.iter().enumerate() {
        let line = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": tool, "arguments": serde_json::from_str::<Value>(args).unwrap_or_default(),
                       "_meta": stsd_tests::harness::meta()}});
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let r = loop {
            let mut l = String::new();
            let n = stdout.read_line(&mut l).unwrap_or_else(|e| panic!("{e}"));
            assert!(n > 0, "the stdio server closed");
            let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
            if v.get("id") == Some(&json!(i)) {
                break v;
            }
        };
        got.push(code_of_text(is_error(&r), &text(&r)));
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    (got, records(&audit))
}

#[test]
fn every_door_gives_the_same_decision_and_one_audit_record() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog(dir.path());
    let mut doors: Vec<(&str, Vec<String>, Vec<Value>)> = Vec::new();
    let (g, r) = socket_door(tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")), &cat);
    doors.push(("MCP on the socket", g, r));
    let (g, r) = call_door(tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")), &cat);
    doors.push(("stsd call", g, r));
    let (g, r) = http_door(tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")), &cat);
    doors.push(("MCP over HTTP", g, r));
    let (g, r) = stdio_door(dir.path(), &cat);
    doors.push(("stsd mcp (embedded)", g, r));
    let (g, r) = run_door(dir.path(), &cat);
    doors.push(("stsd run", g, r));
    let (g, r) = test_door(dir.path(), &cat);
    doors.push(("stsd test", g, r));
    // The first four serve agents, the last two are the operator's doors on a file.
    let mut reference: [Option<Vec<Value>>; 2] = [None, None];
    for (k, (door, got, recs)) in doors.iter().enumerate() {
        let group = usize::from(k >= 4);
        let want: Vec<&str> = CASES
            .iter()
            .map(|c| if group == 0 { c.2 } else { c.3 })
            .collect();
        assert_eq!(got, &want, "{door}: the decisions");
        // Exactly one record per call (`stsd test` runs case 0 of every spec, then case 1...).
        assert_eq!(recs.len(), CASES.len(), "{door}: {recs:#?}");
        let key = |p: &Value| format!("{} {}", p["name"], p["code"]);
        let mut proj: Vec<Value> = recs.iter().map(projection).collect();
        proj.sort_by_key(key);
        let mut expected: Vec<String> = CASES
            .iter()
            .zip(&want)
            .map(|(c, code)| {
                let c = if *code == "OK" {
                    json!(c.0).to_string() + " null"
                } else {
                    format!("{} {}", json!(c.0), json!(code))
                };
                c
            })
            .collect();
        expected.sort();
        assert_eq!(proj.iter().map(key).collect::<Vec<_>>(), expected, "{door}");
        match &reference[group] {
            None => reference[group] = Some(proj),
            Some(first) => assert_eq!(
                &proj, first,
                "{door}: records differ from its group's first door"
            ),
        }
    }
    // Across the two groups, the records of every case both decide alike are equal.
    let alike = |p: &&Value| CASES.iter().any(|c| p["name"] == json!(c.0) && c.2 == c.3);
    let [Some(serving), Some(operator)] = &reference else {
        panic!("no door ran");
    };
    let serving: Vec<&Value> = serving.iter().filter(alike).collect();
    let operator: Vec<&Value> = operator.iter().filter(alike).collect();
    assert_eq!(
        serving, operator,
        "the serving doors' records and the operator's differ"
    );
}
