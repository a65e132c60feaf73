//! Managing tools on a running daemon through the admin channel: add (served at once, with
//! tools/list_changed to a subscribed session), update through the publish gate (a failing
//! test case is refused and the old version stays), rollback, disable, enable, remove, and a
//! restart that keeps every change.

use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::process::{Command, Output};
use std::time::Duration;
use stsd_tests::harness::{saw_list_changed, subscriber, text, Daemon, CATALOG};
use stsd_tests::stsd_bin;

fn spec(version: &str, expected: &str) -> Value {
    json!({"name": "greeter", "description": "greets whoever it is given", "codeType": "Javascript",
           "params": [{"name": "who", "type": "STRING", "required": true, "description": "", "testValue": "you"}],
           "code": format!("return '{version} hello ' + who;"),
           "testCases": [{"name": "greets", "arguments": {"who": "ann"}, "expected": expected}]})
}

fn tools_cli(d: &Daemon, args: &[&str], file: Option<&Value>) -> Output {
    let mut cmd = Command::new(stsd_bin());
    cmd.arg("tools").args(args).arg("--socket").arg(&d.socket);
    if let Some(doc) = file {
        let p = d.dir().join("submitted.json");
        std::fs::write(&p, doc.to_string()).unwrap_or_else(|e| panic!("{e}"));
        cmd.arg(&p);
    }
    cmd.output().unwrap_or_else(|e| panic!("{e}"))
}

fn listed(d: &Daemon) -> Vec<String> {
    let mut c = d.connect();
    c.send(1, "tools/list", json!({}));
    let r = c.response();
    r["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect()
}

fn greet(d: &Daemon) -> String {
    let mut c = d.connect();
    c.call(1, "greeter", json!({"who": "bo"}));
    let r = c.response();
    if r.get("error").is_some() {
        return format!("error: {}", r["error"]["message"]);
    }
    text(&r)
}

#[test]
fn tools_are_added_updated_rolled_back_disabled_and_removed_on_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The gate is on: managed tools carry their recorded pass.
    let gate = "require_local_pass = true\n";
    let d = Daemon::start_in(dir, 1, gate, CATALOG);
    let mut sub = subscriber(&d);
    std::thread::sleep(Duration::from_millis(200));

    let out = tools_cli(&d, &["add"], Some(&spec("v1", "v1 hello ann")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(listed(&d).contains(&"greeter".to_string()));
    assert_eq!(greet(&d), "v1 hello bo");
    assert!(
        saw_list_changed(&mut sub),
        "no tools/list_changed after add"
    );

    // A version whose test case fails is refused; the served one does not change.
    let out = tools_cli(
        &d,
        &["update", "greeter"],
        Some(&spec("v2", "v1 hello ann")),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("test case") && err.contains("greets"), "{err}");
    assert_eq!(greet(&d), "v1 hello bo");
    // A broken one too: the code must parse, and the refusal says where it does not.
    let mut broken = spec("v2", "v2 hello ann");
    broken["code"] = json!("return (;");
    let out = tools_cli(&d, &["update", "greeter"], Some(&broken));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not parse") && err.contains("line 1, column 9"),
        "{err}"
    );
    assert_eq!(greet(&d), "v1 hello bo");

    assert!(tools_cli(
        &d,
        &["update", "greeter"],
        Some(&spec("v2", "v2 hello ann"))
    )
    .status
    .success());
    assert_eq!(greet(&d), "v2 hello bo");
    assert!(tools_cli(&d, &["rollback", "greeter"], None)
        .status
        .success());
    assert_eq!(greet(&d), "v1 hello bo");
    assert!(tools_cli(
        &d,
        &["update", "greeter"],
        Some(&spec("v3", "v3 hello ann"))
    )
    .status
    .success());

    assert!(tools_cli(&d, &["disable", "greeter"], None)
        .status
        .success());
    assert!(!listed(&d).contains(&"greeter".to_string()));
    let g = greet(&d);
    assert!(
        g.starts_with("TOOL_WITHHELD: greeter is not served: disabled"),
        "a disabled tool is not callable: {g}"
    );

    // A restart keeps all of it: still disabled, then enabled it is v3.
    let dir = d.kill9();
    let d = Daemon::start_in(dir, 1, gate, CATALOG);
    assert!(!listed(&d).contains(&"greeter".to_string()));
    assert!(tools_cli(&d, &["enable", "greeter"], None).status.success());
    assert_eq!(greet(&d), "v3 hello bo");

    assert!(tools_cli(&d, &["rm", "greeter"], None).status.success());
    assert!(!listed(&d).contains(&"greeter".to_string()));
    let dir = d.kill9();
    let d = Daemon::start_in(dir, 1, gate, CATALOG);
    assert!(!listed(&d).contains(&"greeter".to_string()));
    // Removal keeps the history: rollback brings the last version back.
    assert!(tools_cli(&d, &["rollback", "greeter"], None)
        .status
        .success());
    assert_eq!(greet(&d), "v3 hello bo");
    // A description too short for a model to choose by is refused at publish.
    let mut terse = spec("v1", "v1 hello ann");
    terse["name"] = json!("terse");
    terse["description"] = json!("greets");
    let out = tools_cli(&d, &["add"], Some(&terse));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 20 characters"));
    // Adding a name that exists is refused.
    assert!(!tools_cli(&d, &["add"], Some(&spec("v9", "v9 hello ann")))
        .status
        .success());
}

/// The publish gate on files: a spec marked `draft: false` by hand is withheld until it
/// passes; `stsd test --write` records a pass of its content; editing the content afterwards
/// withholds it again, with the reason in `stsd tools list`.
#[test]
fn a_hand_published_or_edited_spec_is_withheld_until_it_passes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("hand.json");
    let mut doc = spec("v1", "v1 hello ann");
    doc["draft"] = json!(false);
    std::fs::write(&file, json!([doc]).to_string()).unwrap_or_else(|e| panic!("{e}"));
    let path = file.display().to_string();
    let d = Daemon::start_with(dir, 1, "require_local_pass = true\n", &path, &[]);
    let withheld = || {
        let out = tools_cli(&d, &["list", "--json"], None);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["name"] == "greeter")
            .map(|t| t["reason"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    assert!(withheld().starts_with("NOT_VERIFIED"), "{}", withheld());
    let test = Command::new(stsd_bin())
        .args(["test", "--write", &path])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        test.status.success(),
        "{}",
        String::from_utf8_lossy(&test.stdout)
    );
    // SAFETY: kill with the daemon's pid and a valid signal.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    // The reload is asynchronous: wait for its outcome, with a deadline.
    let settle = |want: &dyn Fn(&str) -> bool| {
        let t0 = std::time::Instant::now();
        loop {
            let g = greet(&d);
            if want(&g) {
                return g;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "still {g:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    settle(&|g| g == "v1 hello bo");
    // An edit after the pass (the code) withholds it again.
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    std::fs::write(&file, text.replace("v1 hello", "v2 hello")).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: as above.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    let g = settle(&|g| g != "v1 hello bo");
    assert!(
        g.starts_with("TOOL_WITHHELD: greeter is not served: NOT_VERIFIED"),
        "{g}"
    );
    assert!(withheld().starts_with("NOT_VERIFIED"), "{}", withheld());
}

/// Names a client may send that must never become a path: climbing out, separators, NUL, a
/// leading dot, too long, and Unicode look-alikes of a dot or a slash.
fn hostile_names() -> Vec<String> {
    let mut v: Vec<String> = [
        "../../outside/PWNED",
        "../../../../../../../../tmp/stsd-test-PWNED",
        "..",
        ".",
        ".hidden",
        "a/b",
        "/abs/PWNED",
        "a\\b",
        "a\0b",
        "a\u{2024}\u{2024}b",
        "\u{2024}\u{2024}\u{2215}outside",
        "a\u{2215}b",
        "a\u{FF0F}b",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(129));
    v
}

/// Every file below `root`, as paths relative to it.
fn files_below(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(root).unwrap_or(&p).display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Issue 31 item 1: a tool name sent on the admin channel is checked against the one
/// grammar before anything is named after it (before: `stsd/tools/add` of a spec named
/// `../../../../tmp/x/PWNED` wrote `/tmp/x/PWNED.json` as the daemon's uid, and `rollback`
/// of such a name renamed files of any directory). And no file is named after a tool.
#[test]
fn a_tool_name_never_leaves_the_managed_catalog() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = dir.path().to_path_buf();
    let outside = root.join("outside");
    std::fs::create_dir(&outside).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(outside.join("victim.json"), "untouched").unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_in(dir, 1, "", CATALOG);
    let mut c = d.connect();
    let mut id = 10;
    for name in hostile_names() {
        let mut doc = spec("v1", "v1 hello ann");
        doc["name"] = json!(name);
        let mut calls = vec![("stsd/tools/add", json!({ "spec": doc }))];
        for m in [
            "stsd/tools/rollback",
            "stsd/tools/remove",
            "stsd/tools/enable",
            "stsd/tools/disable",
        ] {
            calls.push((m, json!({ "name": name })));
        }
        for (method, params) in calls {
            id += 1;
            c.send(id, method, params);
            let r = c.response();
            assert_eq!(r["error"]["code"], -32602, "{method} {name:?}: {r}");
            let msg = r["error"]["message"].as_str().unwrap_or_default();
            assert!(
                msg.contains("MCP's tool-name rule"),
                "{method} {name:?}: {msg}"
            );
        }
    }
    assert_eq!(files_below(&outside), vec!["victim.json".to_string()]);
    assert!(!std::path::Path::new("/tmp/stsd-test-PWNED.json").exists());
    assert!(!std::path::Path::new("/abs").exists());

    // The managed catalog is kept in the state store: no file is named after a tool (the
    // older layout's specs/ and history/ are gone), so there is nothing a planted link could
    // redirect.
    let out = tools_cli(&d, &["add"], Some(&spec("v1", "v1 hello ann")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(tools_cli(
        &d,
        &["update", "greeter"],
        Some(&spec("v2", "v2 hello ann"))
    )
    .status
    .success());
    assert!(tools_cli(&d, &["rollback", "greeter"], None)
        .status
        .success());
    assert_eq!(greet(&d), "v1 hello bo");
    let managed = root.join("managed");
    assert!(!managed.join("specs").exists() && !managed.join("history").exists());
    assert_eq!(files_below(&outside), vec!["victim.json".to_string()]);
}

/// A copy of a tool that writes and deletes files, published through the admin channel.
fn writer_copy() -> Value {
    json!({"name": "writer-copy", "description": "writes files, like the writer it copies",
           "codeType": "Javascript", "params": [], "code": "return 'would write';",
           "sandboxOverrides": {"fileRead": true, "fileWrite": true, "destructive": true},
           "testCases": [{"name": "runs", "arguments": {}, "expected": "would write"}]})
}

/// Issue 31 item 3: whoever holds the admin channel cannot publish a tool that writes,
/// deletes or reaches the network without a gate (before, a copy of a gated tool without its
/// `humanInTheLoop` ran with nobody asked). An operator's rule that names the capability lifts
/// it.
#[test]
fn a_tool_published_through_the_admin_channel_that_writes_starts_gated() {
    let call_it = |d: &Daemon| {
        let mut c = d.connect();
        c.call(1, "writer-copy", json!({}));
        c.response()
    };
    let d = Daemon::start(1, "");
    let out = tools_cli(&d, &["add"], Some(&writer_copy()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = tools_cli(&d, &["show", "writer-copy", "--json"], None);
    let v: Value = serde_json::from_slice(&show.stdout).unwrap_or_default();
    assert_eq!(v["approval"]["required"], true, "{v}");
    assert_eq!(v["approval"]["source"], "admin-published", "{v}");
    let r = call_it(&d);
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(
        text(&r).starts_with("APPROVAL_"),
        "the call ran without approval: {r}"
    );
    drop(d);

    // The operator lifts it by capability: the same tool then runs.
    let d = Daemon::start(
        1,
        "[approval]\n[[approval.rule]]\nfile_write = true\ndestructive = true\nrequire = false\n",
    );
    let out = tools_cli(&d, &["add"], Some(&writer_copy()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = call_it(&d);
    assert_eq!(text(&r), "would write", "{r}");
}

/// Issue 31 item 3: `stsd mcp`, the bridge an agent host starts, never carries `stsd/...`
/// admin methods, whoever runs it (here root, an admin on the socket itself). Before, the
/// bridge passed every line through, and an agent could `stsd/tools/add` through it.
#[test]
fn the_stdio_bridge_carries_mcp_only() {
    let d = Daemon::start(1, "");
    let mut bridge = stsd_tests::spawn_bridge(&d.socket, &[]);
    let mut stdin = bridge.stdin.take().unwrap_or_else(|| panic!("no stdin"));
    let stdout = bridge.stdout.take().unwrap_or_else(|| panic!("no stdout"));
    let mut lines = std::io::BufReader::new(stdout);
    let mut ask = |id: u64, method: &str, params: Value| -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let mut got = String::new();
        loop {
            got.clear();
            if lines.read_line(&mut got).unwrap_or(0) == 0 {
                panic!("the bridge closed");
            }
            let v: Value = serde_json::from_str(&got).unwrap_or_default();
            if v["id"] == id {
                return v;
            }
        }
    };
    for (id, method, params) in [
        (1, "stsd/status", json!({})),
        (
            2,
            "stsd/tools/add",
            json!({ "spec": spec("v1", "v1 hello ann") }),
        ),
        (3, "stsd/tools/disable", json!({ "name": "echo-console" })),
        (4, "stsd/ledger/approve", json!({ "id": "x/y" })),
    ] {
        let r = ask(id, method, params);
        assert_eq!(r["error"]["code"], -32601, "{method}: {r}");
        assert!(
            r["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("carries MCP only"),
            "{method}: {r}"
        );
    }
    // MCP itself still works through it.
    let r = ask(
        5,
        "tools/list",
        json!({"_meta": stsd_tests::harness::meta()}),
    );
    assert!(r["result"]["tools"].is_array(), "{r}");
    assert!(!listed(&d).contains(&"greeter".to_string()));
    let _ = bridge.kill();
    let _ = bridge.wait();
    // The same admin request straight on the socket, as root: served (it is the bridge that
    // refuses, not the uid).
    let mut c = d.connect();
    c.send(9, "stsd/status", json!({}));
    assert!(c.response()["result"]["pool"].is_object());
}

/// Issue 33 item 5: a kill -9 in the middle of `tools update` leaves exactly one committed
/// version served, never none and never one withheld for re-review. Two points, each a real
/// SIGKILL of the daemon (`STSD_TEST_CRASH_AT`, test builds only):
/// - `store-install`: the old version moved to the history, the new one not yet written
///   (the older file layout lost the tool here);
/// - `admin-installed`: the new version stored, the daemon not yet republished nor the
///   ledger told (the older layout left it AWAITING_REREVIEW).
#[test]
fn a_kill_in_the_middle_of_an_update_serves_one_committed_version() {
    let gate = "require_local_pass = true\n";
    for (point, after) in [
        ("store-install", "v1 hello bo"),
        ("admin-installed", "v2 hello bo"),
    ] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let d = Daemon::start_in(dir, 1, gate, CATALOG);
        assert!(tools_cli(&d, &["add"], Some(&spec("v1", "v1 hello ann")))
            .status
            .success());
        assert_eq!(greet(&d), "v1 hello bo");
        let dir = d.kill9();
        let mut d = Daemon::launch_env(
            dir,
            1,
            gate,
            Some(CATALOG),
            &[],
            None,
            &[("STSD_TEST_CRASH_AT", point)],
        );
        let out = tools_cli(
            &d,
            &["update", "greeter"],
            Some(&spec("v2", "v2 hello ann")),
        );
        assert!(!out.status.success(), "{point}: the daemon did not die");
        let t0 = std::time::Instant::now();
        while d.is_running() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{point}: still running"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let dir = d.kill9();
        let d = Daemon::start_in(dir, 1, gate, CATALOG);
        assert_eq!(greet(&d), after, "{point}: after the restart");
        // The history is whole: an update and a rollback come back to what was served.
        assert!(tools_cli(
            &d,
            &["update", "greeter"],
            Some(&spec("v3", "v3 hello ann"))
        )
        .status
        .success());
        assert_eq!(greet(&d), "v3 hello bo");
        assert!(tools_cli(&d, &["rollback", "greeter"], None)
            .status
            .success());
        assert_eq!(greet(&d), after, "{point}: after the rollback");
    }
}
