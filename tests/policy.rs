//! Issue 34: who may call what, decided by the Cedar policy, on the real daemon.
//! - two HTTP principals and two uids see different `tools/list`s and get FORBIDDEN on each
//!   other's tools (the audit record names the policy; the caller learns only "not permitted");
//! - an approver principal may approve but not call;
//! - a policy that forbids `fileWrite` tools to a group holds for a tool added later through
//!   the admin channel (the attribute decides, not the name);
//! - a bad policy file refuses the start and the SIGHUP (with file and line; the old policy
//!   stays in force); `stsd policy explain` output pinned.

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use stsd_tests::harness::{free_port, meta, text, Daemon, CATALOG};
use stsd_tests::{is_root, stsd_bin};

const POLICY: &str = r#"@id("agents-read-only")
forbid (
  principal in Stsd::Group::"agents",
  action in [Stsd::Action::"list", Stsd::Action::"call"],
  resource
) when { resource.fileWrite };

@id("bob-no-echo")
forbid (
  principal == Stsd::Principal::"bob",
  action in [Stsd::Action::"list", Stsd::Action::"call"],
  resource
) when { resource.name == "echo-console" };

@id("approvers-do-not-call")
forbid (principal in Stsd::Group::"stsd:operators", action == Stsd::Action::"call", resource);
"#;

/// A token for `name` in `file` (`stsd token add --file`).
fn token(file: &Path, name: &str) -> String {
    let out = Command::new(stsd_bin())
        .args(["token", "add", name, "--file"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// One JSON-RPC request over HTTP; the response's JSON-RPC message (from a JSON or an SSE
/// body).
fn rpc(port: u16, path: &str, token: &str, method: &str, params: Value) -> Value {
    let mut params = params;
    if path == "/mcp" {
        params["_meta"] = meta();
    }
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("{e}"));
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: {method}\r\n{name}\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len(),
        name = params["name"]
            .as_str()
            .map(|n| format!("Mcp-Name: {n}\r\n"))
            .unwrap_or_default(),
    );
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let Some(at) = raw.find("{\"jsonrpc\"") else {
        panic!("no JSON-RPC answer to {method}: {raw}");
    };
    serde_json::Deserializer::from_str(&raw[at..])
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("an answer that does not parse: {raw}"))
}

fn names(list: &Value) -> Vec<String> {
    let mut n: Vec<String> = list["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("not a tools/list answer: {list}"))
        .iter()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect();
    n.sort();
    n
}

/// One request line on the daemon's socket as the unprivileged user `nobody`.
fn as_nobody(socket: &Path, method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = meta();
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).to_string();
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n\
                  s.sendall((sys.argv[2]+'\\n').encode())\nprint(s.makefile().readline())";
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", "python3", "-c", script])
        .arg(socket)
        .arg(&req)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

struct Setup {
    d: Daemon,
    port: u16,
    alice: String,
    bob: String,
    ops: String,
    policy: std::path::PathBuf,
    _keep: tempfile::TempDir,
}

fn setup() -> Setup {
    let keep = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    use std::os::unix::fs::PermissionsExt;
    let policy = keep.path().join("ops.cedar");
    std::fs::write(&policy, POLICY).unwrap_or_else(|e| panic!("{e}"));
    let tokens = keep.path().join("tokens");
    let (alice, bob, ops) = (
        token(&tokens, "alice"),
        token(&tokens, "bob"),
        token(&tokens, "ops"),
    );
    let port = free_port();
    let config = format!(
        "socket_group = 65534\nallowed_uids = [0, 65534]\n\
         [policy]\nfiles = [\"{}\"]\n[policy.groups]\nagents = [\"alice\", \"uid:65534\"]\n\
         [http]\nlisten = \"127.0.0.1:{port}\"\ntokens_file = \"{}\"\napprover_principals = [\"ops\"]\n",
        policy.display(),
        tokens.display()
    );
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The socket's directory open to `nobody` (the socket itself is root:nogroup 0660).
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_in(dir, 1, &config, CATALOG);
    // The socket answers before the catalog and the policy are read: one answered request
    // says the daemon has read them (a test may change the policy file next).
    let mut c = d.connect();
    c.send(1, "tools/list", json!({}));
    assert!(c.response()["result"].is_object());
    Setup {
        d,
        port,
        alice,
        bob,
        ops,
        policy,
        _keep: keep,
    }
}

#[test]
fn principals_see_and_call_only_what_the_policy_permits() {
    if !is_root() {
        eprintln!("skipped: needs root (runuser nobody)");
        return;
    }
    let s = setup();
    let list = |t: &str| names(&rpc(s.port, "/mcp", t, "tools/list", json!({})));
    let call = |t: &str, tool: &str| {
        let args = if tool == "echo-console" {
            json!({"text": "hi"})
        } else {
            json!({})
        };
        let r = rpc(
            s.port,
            "/mcp",
            t,
            "tools/call",
            json!({"name": tool, "arguments": args}),
        );
        text(&r)
    };
    let (alice, bob) = (list(&s.alice), list(&s.bob));
    assert!(alice.contains(&"echo-console".to_string()), "{alice:?}");
    assert!(!alice.contains(&"writer".to_string()), "{alice:?}");
    assert!(bob.contains(&"writer".to_string()), "{bob:?}");
    assert!(!bob.contains(&"echo-console".to_string()), "{bob:?}");
    assert_eq!(call(&s.alice, "echo-console"), "echo: hi");
    assert_eq!(
        call(&s.alice, "writer"),
        "FORBIDDEN: alice may not call writer"
    );
    assert_eq!(call(&s.bob, "writer"), "would write");
    assert_eq!(
        call(&s.bob, "echo-console"),
        "FORBIDDEN: bob may not call echo-console"
    );
    // The audit record names the policy that decided.
    let recs = s.d.audit_records();
    let forbidden: Vec<&Value> = recs
        .iter()
        .filter(|r| r["error"]["code"] == "FORBIDDEN")
        .collect();
    assert_eq!(forbidden.len(), 2, "{recs:?}");
    assert_eq!(forbidden[0]["principal"], "alice");
    assert_eq!(forbidden[0]["policy"], json!(["agents-read-only"]));
    assert_eq!(forbidden[1]["policy"], json!(["bob-no-echo"]));
    assert!(
        forbidden.iter().all(|r| r["workerPid"].is_null()),
        "none ran"
    );

    // Two uids: root (the default policy) and nobody (in "agents").
    let mut c = s.d.connect();
    c.send(1, "tools/list", json!({}));
    let root = names(&c.response());
    assert!(root.contains(&"writer".to_string()), "{root:?}");
    let nobody = names(&as_nobody(&s.d.socket, "tools/list", json!({})));
    assert!(!nobody.contains(&"writer".to_string()), "{nobody:?}");
    assert!(nobody.contains(&"echo-console".to_string()), "{nobody:?}");
    let r = as_nobody(
        &s.d.socket,
        "tools/call",
        json!({"name": "writer", "arguments": {}}),
    );
    assert_eq!(text(&r), "FORBIDDEN: uid:65534 may not call writer");

    // An approver may approve (read the queue) but not call.
    let q = rpc(s.port, "/admin", &s.ops, "stsd/approvals/list", json!({}));
    assert!(q["result"]["pending"].is_array(), "{q}");
    assert!(call(&s.ops, "echo-console").starts_with("FORBIDDEN"));
    let q = rpc(s.port, "/admin", &s.alice, "stsd/approvals/list", json!({}));
    assert!(q["error"].is_object(), "alice may not read the queue: {q}");
}

#[test]
fn a_forbid_by_attribute_holds_for_a_tool_added_later() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let s = setup();
    let doc = json!({"name": "scribe", "description": "writes notes into its workspace, for the test",
        "codeType": "Javascript", "params": [], "code": "return 'scribed';",
        "sandboxOverrides": {"fileRead": true, "fileWrite": true}});
    let f = s.d.dir().join("scribe.json");
    std::fs::write(&f, doc.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(stsd_bin())
        .args(["tools", "add"])
        .arg(&f)
        .arg("--socket")
        .arg(&s.d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = rpc(
        s.port,
        "/mcp",
        &s.alice,
        "tools/call",
        json!({"name": "scribe", "arguments": {}}),
    );
    assert_eq!(text(&r), "FORBIDDEN: alice may not call scribe");
    let r = rpc(
        s.port,
        "/mcp",
        &s.bob,
        "tools/call",
        json!({"name": "scribe", "arguments": {}}),
    );
    // Bob is not forbidden: the call goes on to its approval (a tool published through the
    // admin channel that writes starts gated), which this client cannot give.
    assert!(text(&r).starts_with("APPROVAL_REQUIRED"), "{}", text(&r));
}

#[test]
fn a_bad_policy_refuses_the_start_and_the_reload_and_the_old_one_stays() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let s = setup();
    // SIGHUP with a policy that does not parse: refused, with the file and line.
    std::fs::write(
        &s.policy,
        format!("{POLICY}\nforbid (principal action, resource);\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(s.d.pid(), libc::SIGHUP) }, 0);
    let t0 = Instant::now();
    while !s.d.log().contains("SIGHUP: config refused") {
        assert!(t0.elapsed() < Duration::from_secs(20), "{}", s.d.log());
        std::thread::sleep(Duration::from_millis(20));
    }
    let at = format!("ops.cedar line {}", POLICY.lines().count() + 2);
    assert!(s.d.log().contains(&at), "{at}: {}", s.d.log());
    let r = rpc(
        s.port,
        "/mcp",
        &s.alice,
        "tools/call",
        json!({"name": "writer", "arguments": {}}),
    );
    assert_eq!(
        text(&r),
        "FORBIDDEN: alice may not call writer",
        "the old policy"
    );
    // At start: refused, with the file and line (the same config on another port).
    let cfg = std::fs::read_to_string(s.d.dir().join("stsd.toml"))
        .unwrap_or_default()
        .replace(
            &format!("127.0.0.1:{}", s.port),
            &format!("127.0.0.1:{}", free_port()),
        );
    let other = s.d.dir().join("other.toml");
    std::fs::write(&other, cfg).unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(stsd_bin())
        .args(["--config"])
        .arg(&other)
        .args(["--socket"])
        .arg(s.d.dir().join("other.sock"))
        .args(["--catalog", CATALOG])
        .env("STSD_STATE_DIR", s.d.dir().join("other-state"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&at), "{at}: {err}");
}

#[test]
fn stsd_policy_explain_names_the_decision_and_its_policies() {
    let keep = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let policy = keep.path().join("ops.cedar");
    std::fs::write(&policy, POLICY).unwrap_or_else(|e| panic!("{e}"));
    let cfg = keep.path().join("stsd.toml");
    std::fs::write(
        &cfg,
        format!(
            "[daemon]\nrequire_local_pass = false\n[policy]\nfiles = [\"{}\"]\n\
             [policy.groups]\nagents = [\"alice\"]\n",
            policy.display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let explain = |args: &[&str]| {
        let out = Command::new(stsd_bin())
            .args(["policy", "explain"])
            .args(args)
            .args(["--catalog", CATALOG, "--config"])
            .arg(&cfg)
            .env("STSD_TEST_TOKEN", "x")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).replace(&policy.display().to_string(), "OPS")
    };
    assert_eq!(
        explain(&["alice", "writer"]),
        "principal: alice (http; groups: agents)\n\
         action: call\n\
         tool: writer (riskLevel 5, fileRead true, fileWrite true, destructive true, network blocked, requiresApproval false)\n\
         decision: DENY\n\
         policy: agents-read-only (OPS)\n"
    );
    assert_eq!(
        explain(&["bob", "writer"]),
        "principal: bob (http; groups: none)\n\
         action: call\n\
         tool: writer (riskLevel 5, fileRead true, fileWrite true, destructive true, network blocked, requiresApproval false)\n\
         decision: ALLOW\n\
         policy: stsd-default:list-call (the default policy)\n"
    );
    assert_eq!(
        explain(&["uid:0", "--action", "admin"]),
        "principal: uid:0 (uid; groups: stsd:admins, unix:root)\n\
         action: admin\n\
         decision: ALLOW\n\
         policy: stsd-default:admin (the default policy)\n"
    );
    // A policy that does not validate: `stsd policy check` says where, and exits 1.
    std::fs::write(
        &policy,
        "permit (principal, action, resource) when { resource.nope };\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(stsd_bin())
        .args(["policy", "check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ops.cedar: policy") && err.contains("nope"),
        "{err}"
    );
}
