//! The approval gate on the real daemon: the operator strategy through `stsd approvals`,
//! `stsd approve` and `stsd deny` (admin channel, uid-checked), the command strategy
//! (approve, reject, a crashing and a slow approver, all failing closed), a rule that rejects,
//! and a toolsets document that disables one tool and requires approval for another, with
//! SIGHUP applying a changed document and `stsd export --format cjson` reading back.

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, text, Daemon};
use stsd_tests::{is_root, stsd_bin};

fn catalog(dir: &std::path::Path) -> String {
    let tool = |name: &str| {
        json!({"name": name, "description": "approval test", "codeType": "Javascript",
               "draft": false, "staticVariables": [{"token": "${STSD_TEST_TOKEN}"}],
               "params": [{"name": "note", "type": "STRING", "required": false,
                           "description": "", "testValue": "x"}],
               "code": "return 'ran ' + (note || '');"})
    };
    let specs = json!([
        tool("opTool"),
        tool("cmdYes"),
        tool("cmdNo"),
        tool("cmdCrash"),
        tool("cmdSlow"),
        tool("refused"),
        tool("plain")
    ]);
    let p = dir.join("approval.json");
    std::fs::write(&p, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    p.display().to_string()
}

fn script(dir: &std::path::Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
    p.display().to_string()
}

fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn daemon(extra: &str) -> (Daemon, tempfile::TempDir) {
    let scripts = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let s = scripts.path();
    let yes = script(
        s,
        "yes.sh",
        "cat > /dev/null; echo '{\"approved\": true, \"reason\": \"policy ok\"}'",
    );
    let no = script(
        s,
        "no.sh",
        "cat > /dev/null; echo '{\"approved\": false, \"reason\": \"policy says no\"}'",
    );
    let crash = script(s, "crash.sh", "exit 3");
    let slow = script(s, "slow.sh", "sleep 5; echo '{\"approved\": true}'");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog(dir.path());
    let config = format!(
        "{extra}\n[approval]\ntimeout_seconds = 2\ncommand_timeout_ms = 500\noperator_uids = [{uid}]\n\
         [[approval.rule]]\ntools = [\"opTool\"]\nrequire = true\nstrategy = \"operator\"\n\
         [[approval.rule]]\ntools = [\"cmdYes\"]\nrequire = true\nstrategy = \"command\"\ncommand = [\"{yes}\"]\n\
         [[approval.rule]]\ntools = [\"cmdNo\"]\nrequire = true\nstrategy = \"command\"\ncommand = [\"{no}\"]\n\
         [[approval.rule]]\ntools = [\"cmdCrash\"]\nrequire = true\nstrategy = \"command\"\ncommand = [\"{crash}\"]\n\
         [[approval.rule]]\ntools = [\"cmdSlow\"]\nrequire = true\nstrategy = \"command\"\ncommand = [\"{slow}\"]\n\
         [[approval.rule]]\ntools = [\"refused\"]\nrequire = true\nstrategy = \"reject\"\nreason = \"never on Sundays\"\n",
        uid = own_uid()
    );
    (Daemon::start_with(dir, 1, &config, &cat, &[]), scripts)
}

#[test]
fn the_operator_strategy_waits_for_stsd_approve_or_deny_and_times_out() {
    let (d, _s) = daemon("");
    // Denied, with the reason the model sees; the secret in the arguments is masked.
    let mut c = d.connect();
    c.call(
        1,
        "opTool",
        json!({"note": "with supersecret-token-123 inside"}),
    );
    let p = d.pending();
    assert_eq!(p["tool"], "opTool");
    assert!(!p.to_string().contains("supersecret"), "{p}");
    assert!(
        p["arguments"]["note"]
            .as_str()
            .unwrap_or_default()
            .contains("***"),
        "{p}"
    );
    let id = p["id"].as_u64().unwrap_or(0).to_string();
    let out = d.cli(&["deny", &id, "--reason", "not during the freeze"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = c.response();
    assert_eq!(text(&r), "APPROVAL_REJECTED: not during the freeze");
    // Approved: it runs.
    c.call(2, "opTool", json!({"note": "b"}));
    let id = d.pending()["id"].as_u64().unwrap_or(0).to_string();
    assert!(d.cli(&["approve", &id]).status.success());
    assert_eq!(text(&c.response()), "ran b");
    // Nobody answers: APPROVAL_TIMEOUT after [approval] timeout_seconds.
    c.call(3, "opTool", json!({}));
    let t0 = Instant::now();
    let r = c.response();
    assert!(text(&r).starts_with("APPROVAL_TIMEOUT"), "{r}");
    assert!(
        t0.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        t0.elapsed()
    );
    let recs = d.audit_records();
    let decisions: Vec<&str> = recs
        .iter()
        .filter_map(|r| r["approval"]["decision"].as_str())
        .collect();
    assert_eq!(decisions, ["rejected", "approved", "timeout"], "{recs:?}");
    assert_eq!(
        recs[1]["approval"]["approver"],
        format!("operator uid {}", own_uid())
    );
}

#[test]
fn a_uid_not_among_the_operators_cannot_answer() {
    if !is_root() {
        eprintln!("skipped: needs root to act as another uid");
        return;
    }
    // The harness's config ends in its [daemon] section: this line lands there.
    let (d, _s) = daemon("allowed_uids = [65534]\n");
    let _ = std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o777));
    let _ = std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755));
    let mut c = d.connect();
    c.call(1, "opTool", json!({}));
    let id = d.pending()["id"].as_u64().unwrap_or(0).to_string();
    use std::os::unix::process::CommandExt;
    let out = Command::new(stsd_bin())
        .args(["approve", &id])
        .arg("--socket")
        .arg(&d.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("operator_uids") || err.contains("may not"),
        "{err}"
    );
    // Still waiting: the refused answer did not count.
    assert_eq!(
        d.pending()["id"].as_u64().map(|i| i.to_string()),
        Some(id.clone())
    );
    assert!(d
        .cli(&["deny", &id, "--reason", "cleanup"])
        .status
        .success());
    assert!(text(&c.response()).starts_with("APPROVAL_REJECTED"));
}

#[test]
fn the_command_strategy_approves_rejects_and_fails_closed() {
    let (d, _s) = daemon("");
    let mut c = d.connect();
    let mut call = |tool: &str| {
        c.call(1, tool, json!({"note": "n"}));
        text(&c.response())
    };
    assert_eq!(call("cmdYes"), "ran n");
    assert_eq!(call("cmdNo"), "APPROVAL_REJECTED: policy says no");
    let crash = call("cmdCrash");
    assert!(
        crash.starts_with("APPROVAL_ERROR") && crash.contains("failed"),
        "{crash}"
    );
    let t0 = Instant::now();
    let slow = call("cmdSlow");
    assert!(
        slow.starts_with("APPROVAL_ERROR") && slow.contains("500 ms"),
        "{slow}"
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(call("refused"), "APPROVAL_REJECTED: never on Sundays");
    assert_eq!(call("plain"), "ran n");
    let recs = d.audit_records();
    assert!(recs[0]["approval"]["approver"]
        .as_str()
        .unwrap_or_default()
        .ends_with("yes.sh"));
    assert!(recs[5].get("approval").is_none(), "{}", recs[5]);
}

#[test]
fn a_toolsets_document_disables_and_gates_tools_and_sighup_applies_a_change() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog(dir.path());
    let toolsets = dir.path().join("toolsets.json");
    let doc = |disabled: &str| {
        json!({"mediaType": "application/vnd.cjson-toolsets+json",
               "schema": "https://schema.cjson.dev/0/toolsets/cjson-toolsets-0.1.0-SNAPSHOT.schema.json",
               "toolsets": [{"id": "ops", "kind": "builtin", "tools": [
                   {"name": disabled, "enabled": false},
                   {"name": "cmdYes", "requiresApproval": true}]}]})
        .to_string()
    };
    std::fs::write(&toolsets, doc("plain")).unwrap_or_else(|e| panic!("{e}"));
    let ts = toolsets.display().to_string();
    let d = Daemon::start_with(
        dir,
        1,
        "[approval]\ndefault_strategy = \"reject\"\n",
        &cat,
        &["--toolsets", &ts],
    );
    let names = |d: &Daemon| {
        let mut c = d.connect();
        c.send(1, "tools/list", json!({}));
        let r = c.response();
        r["result"]["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or_default().to_string(),
                    t["_meta"]["stsd/approval"]["required"] == true,
                )
            })
            .collect::<Vec<_>>()
    };
    let n = names(&d);
    assert!(!n.iter().any(|(t, _)| t == "plain"), "{n:?}");
    assert!(n.contains(&("cmdYes".to_string(), true)), "{n:?}");
    let mut c = d.connect();
    // A disabled tool is refused with why (and audited), not taken for an unknown name.
    c.call(1, "plain", json!({}));
    let r = c.response();
    assert!(
        is_error(&r)
            && text(&r)
                .starts_with("TOOL_WITHHELD: plain is not served: disabled by a toolsets document"),
        "{r}"
    );
    c.call(2, "cmdYes", json!({}));
    assert!(text(&c.response()).starts_with("APPROVAL_REJECTED"));
    // A changed document applies on SIGHUP; a broken one is refused and changes nothing.
    std::fs::write(&toolsets, doc("cmdNo")).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: kill with the daemon's pid and a valid signal.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    let t0 = Instant::now();
    while names(&d).iter().any(|(t, _)| t == "cmdNo") {
        assert!(t0.elapsed() < Duration::from_secs(5), "SIGHUP not applied");
        std::thread::sleep(Duration::from_millis(30));
    }
    assert!(names(&d).iter().any(|(t, _)| t == "plain"));
    std::fs::write(&toolsets, r#"{"schema": 5}"#).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: as above.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(300));
    assert!(names(&d).iter().any(|(t, _)| t == "plain"));
    assert!(!names(&d).iter().any(|(t, _)| t == "cmdNo"));
}

#[test]
fn a_toolsets_document_with_errors_stops_the_daemon_with_pointers() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog(dir.path());
    let toolsets = dir.path().join("bad.json");
    std::fs::write(
        &toolsets,
        json!({"schema": "x", "toolsets": [{"id": "a", "kind": "builtin",
               "tools": [{"name": "nope"}, {"name": "plain", "enabled": "yes"}]}]})
        .to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let sock = dir.path().join("s.sock");
    let out = Command::new(stsd_bin())
        .arg("--socket")
        .arg(&sock)
        .args(["--catalog", &cat, "--toolsets"])
        .arg(&toolsets)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/toolsets/0/tools/1/enabled"), "{err}");
}

#[test]
fn the_cjson_export_reads_back_through_the_loader() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog(dir.path());
    let config = dir.path().join("export.toml");
    std::fs::write(
        &config,
        "[baseline]\nenv_allow = [\"STSD_TEST_*\"]\n[daemon]\nrequire_local_pass = false\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(stsd_bin())
        .args(["export", "--format", "cjson", &cat])
        .arg("--config")
        .arg(&config)
        .env("STSD_TEST_TOKEN", "supersecret-token-123")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let tools = doc["toolsets"][0]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(tools.len(), 7);
    assert!(tools.iter().all(|t| t["argsSchema"]["type"] == "object"));
    let file = dir.path().join("export.json");
    std::fs::write(&file, &out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let f = file.display().to_string();
    // The daemon loads it as is.
    let d = Daemon::start_with(dir, 1, "", &cat, &["--toolsets", &f]);
    let mut c = d.connect();
    c.call(1, "plain", json!({}));
    assert_eq!(text(&c.response()), "ran ");
}

/// `stsd run` of the reference catalog's deleteFile (humanInTheLoop REQUIRED) in a scratch
/// workspace: refused without a terminal or a flag, denied with --deny, run with --approve.
#[test]
fn stsd_run_needs_an_answer_for_a_gated_tool() {
    let base = stsd_tests::scratch_base();
    let file = base.path().join("doomed.txt");
    std::fs::write(&file, "x").unwrap_or_else(|e| panic!("{e}"));
    if is_root() {
        let _ = std::os::unix::fs::chown(
            &file,
            Some(stsd_tests::WORKER_UID),
            Some(stsd_tests::WORKER_UID),
        );
    }
    let mut specs: Vec<Value> = serde_json::from_str(
        &std::fs::read_to_string(
            stsd_tests::catalog_dir().join("default-tool-specs-builtin-fs.json"),
        )
        .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    specs.retain(|s| s["name"] == "deleteFile");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let spec = dir.path().join("delete.json");
    std::fs::write(&spec, Value::Array(specs).to_string()).unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!("[baseline]\nfs_base_path = \"{}\"\n", base.path().display()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let run = |flag: Option<&str>| {
        let mut cmd = Command::new(stsd_bin());
        cmd.args(["run", "--config"])
            .arg(&config)
            .args(["--json", "--arg", "path=doomed.txt"])
            .arg(&spec)
            .stdin(std::process::Stdio::null());
        if let Some(f) = flag {
            cmd.arg(f);
        }
        let out = cmd.output().unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_slice::<Value>(&out.stdout).unwrap_or(Value::Null)
    };
    let v = run(None);
    assert_eq!(v["error"]["code"], "APPROVAL_REQUIRED", "{v}");
    assert!(file.exists());
    let v = run(Some("--deny"));
    assert_eq!(v["error"]["code"], "APPROVAL_REJECTED", "{v}");
    assert!(file.exists());
    let v = run(Some("--approve"));
    assert_eq!(v["ok"], true, "{v}");
    assert!(!file.exists());
}

/// The ten catalog tools that declare humanInTheLoop REQUIRED are shown gated by `stsd check`,
/// with the mitigated risk level beside the sandbox level; a rule adds an eleventh.
#[test]
fn stsd_check_shows_every_gated_catalog_tool() {
    let run = |config: Option<&std::path::Path>| {
        let mut cmd = Command::new(stsd_bin());
        cmd.arg("check");
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        let out = cmd
            .args(["--json"])
            .arg(stsd_tests::catalog_dir())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
        let mut gated: Vec<(String, String, String)> = v["specs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["approval"]["required"] == true)
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or_default().to_string(),
                    s["riskLevel"].as_str().unwrap_or_default().to_string(),
                    s["approval"]["riskLevelWithApproval"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        gated.sort();
        gated
    };
    let gated = run(None);
    let names: Vec<&str> = gated.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "appendTextFile",
            "copyFile",
            "deleteDir",
            "deleteFile",
            "editTextFile",
            "extractPageContent",
            "moveFile",
            "openaiResponseGenerator",
            "sendSlackMessage",
            "writeTextFile"
        ]
    );
    let delete = gated
        .iter()
        .find(|g| g.0 == "deleteFile")
        .cloned()
        .unwrap_or_default();
    assert_eq!((delete.1.as_str(), delete.2.as_str()), ("L5", "L4"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        "[[approval.rule]]\ntools = [\"readTextFile\"]\nrequire = true\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let more = run(Some(&config));
    assert_eq!(more.len(), 11, "{more:?}");
}

/// Lifting a spec's humanInTheLoop REQUIRED takes allow_override_required, and every call it
/// affects says so in its audit record; without it, the toolset's `false` is ignored.
#[test]
fn lifting_a_spec_requirement_needs_the_switch_and_is_audited() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let spec = json!([{"name": "hitl", "description": "approval test", "codeType": "Javascript",
        "draft": false, "humanInTheLoop": {"mode": "REQUIRED", "promptTemplate": "ok {toolName}?"},
        "code": "return 'ran';"}]);
    let cat = dir.path().join("hitl.json");
    std::fs::write(&cat, spec.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let toolsets = dir.path().join("t.json");
    std::fs::write(
        &toolsets,
        json!({"schema": "x", "toolsets": [{"id": "t", "kind": "builtin",
               "tools": [{"name": "hitl", "requiresApproval": false}]}]})
        .to_string(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (c, t) = (cat.display().to_string(), toolsets.display().to_string());
    let run = |allow: bool| {
        let d2 = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let config = format!(
            "\n[approval]\ndefault_strategy = \"reject\"\nallow_override_required = {allow}\n"
        );
        let d = Daemon::start_with(d2, 1, &config, &c, &["--toolsets", &t]);
        let mut conn = d.connect();
        conn.call(1, "hitl", json!({}));
        let r = text(&conn.response());
        (r, d.audit_records())
    };
    let (r, recs) = run(false);
    assert!(r.starts_with("APPROVAL_REJECTED"), "{r}");
    assert_eq!(recs[0]["approval"]["source"], "spec");
    let (r, recs) = run(true);
    assert_eq!(r, "ran");
    assert_eq!(recs[0]["approval"]["overrodeRequired"], true, "{}", recs[0]);
    assert_eq!(recs[0]["approval"]["source"], "toolset");
}

/// Issue 33: a call waiting for an operator when the daemon is killed is not lost silently:
/// the waiting call is kept in the state store, and the next start records it as expired
/// (APPROVAL_TIMEOUT, "the daemon stopped ..."; it never ran). Before, nothing recorded it.
#[test]
fn a_call_left_waiting_by_a_killed_daemon_is_recorded_expired_at_the_next_start() {
    let (d, _s) = daemon("");
    let mut c = d.connect();
    c.call(1, "opTool", json!({"note": "left waiting"}));
    let p = d.pending();
    let id = p["callId"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id in {p}"));
    assert!(d.audit_records().iter().all(|r| r["callId"] != id));
    let dir = d.kill9();
    drop(c);
    let d = Daemon::start_in(dir, 1, "", stsd_tests::harness::CATALOG);
    // The socket answers before the start has read the store: wait for the record.
    let t0 = Instant::now();
    let r = loop {
        let recs = d.audit_records();
        if let Some(r) = recs.iter().find(|r| r["callId"] == id) {
            break r.clone();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no record of call {id}: {recs:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(r["name"], "opTool");
    assert_eq!(r["error"]["code"], "APPROVAL_TIMEOUT", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the daemon stopped while the call waited"),
        "{r}"
    );
    assert_eq!(r["approval"]["decision"], "expired", "{r}");
    assert!(r["workerPid"].is_null(), "it never ran: {r}");
    // And `stsd approvals` shows it, as expired, beside the (no) waiting calls.
    let out = d.cli(&["approvals", "--json"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let expired = listed["expired"].as_array().cloned().unwrap_or_default();
    assert!(
        expired.iter().any(|e| e["callId"] == id
            && e["tool"] == "opTool"
            && e["reason"]
                .as_str()
                .is_some_and(|w| w.contains("the daemon stopped"))),
        "{listed}"
    );
    let text = String::from_utf8_lossy(&d.cli(&["approvals"]).stdout).to_string();
    assert!(
        text.contains(&format!("EXPIRED call {id}  opTool")),
        "{text}"
    );
    // Once: a second start finds nothing left.
    let dir = d.kill9();
    let d = Daemon::start_in(dir, 1, "", stsd_tests::harness::CATALOG);
    // One answered request: the start is done (and anything it would record, recorded).
    let mut c = d.connect();
    c.send(9, "tools/list", json!({}));
    assert!(c.response()["result"].is_object());
    let again = d.audit_records();
    assert_eq!(
        again.iter().filter(|r| r["callId"] == id).count(),
        1,
        "{again:?}"
    );
}

/// Issue 38 item 9: `stsd call` answers for itself when a tool asks its caller (the elicit
/// strategy, over 2026-07-28's input_required round trip): --approve runs it, --deny refuses
/// it, and with neither and no terminal it says how. A call that waits for an operator says
/// so on stderr, with the command that answers it.
#[test]
fn stsd_call_answers_for_itself_and_says_what_it_waits_for() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let tool = |name: &str| {
        json!({"name": name, "description": "test tool", "codeType": "Javascript", "draft": false,
               "params": [], "code": format!("return '{name} ran';")})
    };
    let cat = dir.path().join("ask.json");
    std::fs::write(&cat, json!([tool("askMe"), tool("waitMe")]).to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    let config = format!(
        "[approval]\ntimeout_seconds = 20\noperator_uids = [{uid}]\n\
         [[approval.rule]]\ntools = [\"askMe\"]\nrequire = true\nstrategy = \"elicit\"\n\
         [[approval.rule]]\ntools = [\"waitMe\"]\nrequire = true\nstrategy = \"operator\"\n",
        uid = own_uid()
    );
    let cat = cat.display().to_string();
    let d = Daemon::start_with(dir, 1, &config, &cat, &[]);
    let call = |extra: &[&str]| {
        let mut args = vec!["call", "askMe"];
        args.extend_from_slice(extra);
        let out = d.cli(&args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, out, err) = call(&["--approve"]);
    assert_eq!((code, out.as_str()), (Some(0), "askMe ran"), "{err}");
    let (code, _, err) = call(&["--deny"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("APPROVAL_REJECTED"), "{err}");
    // No answer ahead and no terminal (the test's stdin is not one): refused, with the way.
    let (code, _, err) = call(&[]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("APPROVAL_REQUIRED"), "{err}");

    // The operator strategy: the line comes while the call waits; `stsd approve` answers.
    let mut waiting = Command::new(stsd_bin())
        .args(["call", "waitMe", "--socket"])
        .arg(&d.socket)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let stderr = waiting.stderr.take().unwrap_or_else(|| panic!("no stderr"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("no line while the call waited: {e}"));
    assert!(
        line.contains("waitMe waits for an operator's approval: stsd approve "),
        "{line}"
    );
    let id = d.pending()["id"].as_u64().unwrap_or(0).to_string();
    assert!(line.contains(&format!("stsd approve {id}")), "{line}");
    assert!(d.cli(&["approve", &id]).status.success());
    let out = waiting.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "waitMe ran");
}
