//! The CLI verbs that talk to a running daemon, as thin clients of its socket: `stsd call`
//! (MCP), `stsd status` and `stsd tools` (the admin channel), uid checks on every admin
//! method, and the MCP and OpenAI exports.

use serde_json::{json, Value};
use std::process::{Command, Output};
use stsd_tests::harness::{Daemon, CATALOG};
use stsd_tests::{is_root, stsd_bin};

fn cli(d: &Daemon, args: &[&str]) -> Output {
    Command::new(stsd_bin())
        .args(args)
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn stsd_call_runs_a_tool_on_the_daemon_with_stsd_run_exit_codes() {
    let d = Daemon::start(1, "");
    let ok = cli(&d, &["call", "echo-console", "--arg", "text=hi"]);
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "echo: hi");
    assert!(String::from_utf8_lossy(&ok.stderr).contains("[info] starting hi"));
    let failed = cli(&d, &["call", "always-fails"]);
    assert_eq!(failed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failed.stderr).contains("JS_ERROR"));
    let bad = cli(
        &d,
        &["call", "slow", "--json", "--args-json", r#"{"ms": "ten"}"#],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(json_of(&bad)["error"]["code"], "INVALID_INPUT");
    let secret = cli(&d, &["call", "with-secret", "--json"]);
    assert_eq!(json_of(&secret)["result"]["sent"], "Bearer ***");
    let args = d.dir().join("args.json");
    std::fs::write(&args, r#"{"text": "from a file"}"#).unwrap_or_else(|e| panic!("{e}"));
    let from_file = cli(
        &d,
        &[
            "call",
            "echo-console",
            "--args-json",
            &format!("@{}", args.display()),
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&from_file.stdout).trim(),
        "echo: from a file"
    );
    let unknown = cli(&d, &["call", "no-such-tool"]);
    assert_eq!(unknown.status.code(), Some(2));
}

#[test]
fn status_and_tools_list_describe_the_running_daemon() {
    let d = Daemon::start(2, "");
    let s = json_of(&cli(&d, &["status", "--json"]));
    assert_eq!(s["pool"]["size"], 2, "{s}");
    assert!(
        s["sandbox"]["landlockAbi"].as_i64().unwrap_or(0) >= 6,
        "{s}"
    );
    assert_eq!(s["catalog"]["served"], 6, "{s}");
    let t = json_of(&cli(&d, &["tools", "list", "--json"]));
    let tools = t["tools"].as_array().cloned().unwrap_or_default();
    let writer = tools
        .iter()
        .find(|x| x["name"] == "writer")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (writer["state"].clone(), writer["riskLevel"].clone()),
        (json!("ACTIVE"), json!("L5"))
    );
    let draft = tools
        .iter()
        .find(|x| x["name"] == "a-draft")
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        (draft["state"].clone(), draft["reason"].clone()),
        (json!("WITHHELD"), json!("DRAFT: run stsd test --write (records a Local Pass and sets draft: false), or stsd tools add"))
    );
    let show = json_of(&cli(&d, &["tools", "show", "slow", "--json"]));
    assert_eq!(show["inputSchema"]["properties"]["ms"]["type"], "integer");
    // Text by default (issue 38 item 9): a person reads it; --json is for programs.
    let text = String::from_utf8_lossy(&cli(&d, &["tools", "show", "slow"]).stdout).into_owned();
    assert!(text.starts_with("slow  ACTIVE"), "{text}");
    assert!(
        text.contains("  approval: ") && text.contains("  param ms: integer"),
        "{text}"
    );
    let text = String::from_utf8_lossy(&cli(&d, &["metrics"]).stdout).into_owned();
    let own = t["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["state"] == "ACTIVE")
        .count();
    assert!(
        text.starts_with(&format!("tools served: {own} own, 0 upstream")),
        "{text}"
    );
}

#[test]
fn a_uid_outside_admin_uids_is_refused_every_admin_method_but_keeps_mcp() {
    if !is_root() {
        eprintln!("skipped: needs root to act as another uid");
        return;
    }
    let d = Daemon::start(1, "allowed_uids = [65534]\n");
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o777));
    let _ = std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755));
    let as_nobody = |args: &[&str]| {
        use std::os::unix::process::CommandExt;
        Command::new(stsd_bin())
            .args(args)
            .arg("--socket")
            .arg(&d.socket)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    for args in [
        &["status"][..],
        &["tools", "list"],
        &["tools", "show", "slow"],
        &["approvals"],
        &["approve", "1"],
        &["deny", "1", "--reason", "x"],
        &["metrics"],
        &["tools", "rm", "slow"],
        &["tools", "disable", "slow"],
        &["tools", "enable", "slow"],
        &["tools", "rollback", "slow"],
    ] {
        let out = as_nobody(args);
        assert!(!out.status.success(), "{args:?} was allowed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("may not") || err.contains("no call"),
            "{args:?}: {err}"
        );
    }
    let call = as_nobody(&["call", "echo-console", "--arg", "text=still"]);
    assert_eq!(String::from_utf8_lossy(&call.stdout).trim(), "echo: still");
}

#[test]
fn the_mcp_export_is_what_tools_list_serves_and_the_openai_export_has_its_shape() {
    let d = Daemon::start(1, "");
    let mut c = d.connect();
    c.send(1, "tools/list", json!({}));
    let served = c.response()["result"]["tools"].clone();
    let config = d.dir().join("stsd.toml");
    let export = |format: &str, catalog: &str, all: bool| {
        let out = Command::new(stsd_bin())
            .args(["export", "--format", format, catalog])
            .arg("--config")
            .arg(&config)
            .args(if all { &["--all"][..] } else { &[][..] })
            .env("STSD_TEST_TOKEN", "supersecret-token-123")
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        json_of(&out)
    };
    assert_eq!(export("mcp", CATALOG, false)["tools"], served);
    // With no path: what the running daemon serves, read from it (issue 38 item 9: it
    // exported the bundled catalog whatever the daemon served).
    let out = Command::new(stsd_bin())
        .args(["export", "--format", "mcp", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json_of(&out)["tools"], served);
    let cjson = Command::new(stsd_bin())
        .args(["export", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = json_of(&cjson)["toolsets"][0]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect();
    let want: Vec<String> = served
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect();
    assert_eq!(names, want, "{}", String::from_utf8_lossy(&cjson.stdout));
    // The whole reference catalog as OpenAI function-calling tools.
    let catalog = stsd_tests::catalog_dir().display().to_string();
    let openai = export("openai", &catalog, true);
    let tools = openai.as_array().cloned().unwrap_or_default();
    assert_eq!(tools.len(), 116);
    // The OpenAI function-tool shape, as a JSON Schema.
    let shape = json!({
        "type": "object", "required": ["type", "function"],
        "properties": {
            "type": {"const": "function"},
            "function": {"type": "object", "required": ["name", "description", "parameters"],
                "properties": {
                    "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                    "description": {"type": "string"},
                    "parameters": {"type": "object", "required": ["type", "properties"],
                        "properties": {"type": {"const": "object"}, "properties": {"type": "object"}}}}}}
    });
    let validator = jsonschema::draft202012::new(&shape).unwrap_or_else(|e| panic!("{e}"));
    for t in &tools {
        assert!(validator.is_valid(t), "{t}");
        assert_eq!(t["type"], "function");
        let name = t["function"]["name"].as_str().unwrap_or_default();
        assert!(
            !name.is_empty()
                && name.len() <= 64
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
            "{name}"
        );
        assert_eq!(t["function"]["parameters"]["type"], "object", "{t}");
        assert!(t["function"]["description"].is_string());
    }
}

/// Seed 004's execution metrics for every call a worker ran: wall and CPU time, the worker's
/// peak RSS, the QuickJS heap at the end, console lines, the pipeline's own governing time
/// (the reply's figure includes the audit write, the record's cannot); in the result's
/// `_meta` and the audit record alike.
#[test]
fn every_call_reports_its_metrics_in_meta_and_the_audit_record() {
    let d = Daemon::start(1, "");
    let mut c = d.connect();
    c.call(1, "slow", json!({"ms": 80}));
    let r = c.response();
    let m = r["result"]["_meta"]["stsd/metrics"].clone();
    let wall_ms = m["wallMs"].as_u64().unwrap_or(0);
    let cpu_us = m["cpuUs"].as_u64().unwrap_or(0);
    assert!(wall_ms >= 80, "{m}");
    assert!(m["peakRssKib"].as_u64().unwrap_or(0) > 1000, "{m}");
    assert!(m["heapBytes"].as_u64().unwrap_or(0) > 0, "{m}");
    // What governing the call cost (policy, rate, approval lookup, admission, the audit
    // write): some, and less than the whole call, which slept 80 ms of it in the worker.
    let governance_us = m["governanceUs"].as_u64().unwrap_or(u64::MAX);
    assert!(governance_us > 0 && governance_us < wall_ms * 1000, "{m}");
    c.call(2, "echo-console", json!({"text": "x"}));
    let r = c.response();
    let echo = r["result"]["_meta"]["stsd/metrics"].clone();
    assert_eq!(echo["consoleLines"], 2, "{r}");
    // The CPU time is the worker's own: the 80 ms spin costs many times a trivial call, and
    // no more than its wall time. (Not "at least 50 ms": on a loaded machine a spinning
    // process gets a fraction of a core, so its CPU time over 80 ms of wall time is less.)
    let echo_cpu_us = echo["cpuUs"].as_u64().unwrap_or(u64::MAX);
    assert!(cpu_us > 4 * echo_cpu_us, "spin {m} vs trivial {echo}");
    assert!(cpu_us <= wall_ms * 1000 + 20_000, "{m}");
    let recs = d.audit_records();
    assert_eq!(recs[0]["metrics"]["cpuUs"], m["cpuUs"]);
    let daemon_metrics = json_of(&cli(&d, &["metrics", "--json"]));
    assert!(
        daemon_metrics["calls"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["tool"] == "slow" && c["outcome"] == "OK" && c["count"] == 1),
        "{daemon_metrics}"
    );
    assert_eq!(recs[1]["metrics"]["consoleLines"], 2);
}

/// `--preset ID` serves only the tools of one preset of the reference catalog's
/// default-tool-presets.json (still subject to each tool's own state); an unknown preset
/// stops the daemon with the ids there are.
#[test]
fn a_preset_selects_the_tools_a_daemon_serves() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = dir.path().join("cat");
    std::fs::create_dir_all(&cat).unwrap_or_else(|e| panic!("{e}"));
    let src = stsd_tests::catalog_dir();
    for f in [
        "default-tool-presets.json",
        "default-tool-specs-builtin-helpers.json",
    ] {
        let mut text = std::fs::read_to_string(src.join(f)).unwrap_or_else(|e| panic!("{e}"));
        // Published as stsd test --write would; nothing else changes.
        text = text.replace("\"draft\": true", "\"draft\": false");
        std::fs::write(cat.join(f), text).unwrap_or_else(|e| panic!("{e}"));
    }
    let c = cat.display().to_string();
    let d = Daemon::start_with(dir, 1, "", &c, &["--preset", "dev-essentials"]);
    let t = json_of(&cli(&d, &["tools", "list", "--json"]));
    let served: Vec<&str> = t["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["state"] == "ACTIVE")
        .filter_map(|x| x["name"].as_str())
        .collect();
    assert!(!served.is_empty() && served.len() < 10, "{served:?}");
    for name in &served {
        assert!(
            [
                "getCurrentTime",
                "evalExpression",
                "uuid",
                "hash",
                "base64",
                "jwtDecode",
                "regexExtract"
            ]
            .contains(name),
            "{name} is not in the preset"
        );
    }
    let reasons = t.to_string();
    assert!(
        reasons.contains("not in preset dev-essentials"),
        "{reasons}"
    );
    // Its own config and state (the daemon's): a start that fails writes its record there,
    // not in the machine's /var/log/stsd.
    let bad = Command::new(stsd_bin())
        .args(["--socket"])
        .arg(d.dir().join("other.sock"))
        .arg("--config")
        .arg(d.dir().join("stsd.toml"))
        .env("STSD_STATE_DIR", d.dir().join("state"))
        .args(["--catalog", &c, "--preset", "no-such"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("starter-5"));
}

/// A caller that asks (`_meta["stsd/console"]: true`) gets the call's console lines, masked,
/// in the result's `_meta`; others do not.
#[test]
fn console_lines_come_in_meta_when_asked_for() {
    let d = Daemon::start(1, "");
    let mut c = d.connect();
    let mut meta = stsd_tests::harness::meta();
    meta["stsd/console"] = json!(true);
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "with-secret", "arguments": {}, "_meta": meta}});
    use std::io::Write;
    c.writer
        .write_all(format!("{req}\n").as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let r = c.response();
    assert_eq!(
        r["result"]["_meta"]["stsd/console"],
        json!([{"level": "info", "line": "using token ***"}]),
        "{r}"
    );
    c.call(2, "echo-console", json!({"text": "x"}));
    let r = c.response();
    assert!(r["result"]["_meta"].get("stsd/console").is_none(), "{r}");
}

/// A daemon run by uid 65534, as a per-user daemon is run by its user; `extra` joins its
/// `[daemon]` section. Killed when dropped.
struct UserDaemon {
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl UserDaemon {
    fn start(extra: &str) -> UserDaemon {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path();
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o777));
        let config = p.join("stsd.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\naudit_log = \"{}\"\ncatalog_dir = \"{}\"\n{extra}",
                p.join("audit.jsonl").display(),
                p.join("managed").display()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let _ = std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644));
        let log = std::fs::File::create(p.join("stderr.log")).unwrap_or_else(|e| panic!("{e}"));
        let _ =
            std::fs::set_permissions(p.join("stderr.log"), std::fs::Permissions::from_mode(0o666));
        let child = Command::new(stsd_bin())
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(p.join("stsd.sock"))
            .args(["--pool", "1", "--catalog", CATALOG])
            .env("STSD_STATE_DIR", p.join("state"))
            .stderr(log)
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let d = UserDaemon { child, dir };
        let t0 = std::time::Instant::now();
        while !d.log().contains("connection limits") {
            assert!(
                t0.elapsed().as_secs() < 20,
                "the daemon did not start: {}",
                d.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// `stsd ARGS --socket ...` run as the daemon's own uid.
    fn as_its_uid(&self, args: &[&str]) -> Output {
        use std::os::unix::process::CommandExt;
        Command::new(stsd_bin())
            .args(args)
            .arg("--socket")
            .arg(self.dir.path().join("stsd.sock"))
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for UserDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 31 item 3: by default the admin set is root (and the stsd-admin group), never the
/// daemon's own uid. A per-user daemon shares its uid with the agent host that calls its
/// tools; before, that uid was an admin, so the agent could publish, disable and re-approve
/// tools. It may still read what the daemon serves (status, tools list/show, metrics).
/// Listing the uid on purpose works, and the banner warns.
#[test]
fn the_daemons_own_uid_is_not_an_admin_unless_listed() {
    if !is_root() {
        eprintln!("skipped: needs root to run a daemon as another uid");
        return;
    }
    let d = UserDaemon::start("");
    assert!(!d.log().contains("WARN: uid 65534"), "{}", d.log());
    for args in [
        &["tools", "disable", "echo-console"][..],
        &["tools", "rm", "echo-console"],
        &["tools", "rollback", "echo-console"],
        &["approvals"],
        &["ledger", "list"],
    ] {
        let out = d.as_its_uid(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("may not"),
            "{args:?} was allowed to the daemon's own uid: {err}"
        );
    }
    for args in [&["status"][..], &["tools", "list"]] {
        let out = d.as_its_uid(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(d);

    let d = UserDaemon::start("admin_uids = [65534]\n");
    assert!(
        d.log()
            .contains("WARN: uid 65534 runs this daemon and is an admin"),
        "{}",
        d.log()
    );
    let out = d.as_its_uid(&["tools", "disable", "echo-console"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("may not"));
}

/// Issue 38 item 9: a tool the operator disabled says so (it said "disabled by a toolsets
/// document" when no document was involved), in `stsd tools show` and to a caller.
#[test]
fn a_tool_the_operator_disabled_says_so() {
    let d = Daemon::start(1, "");
    let out = cli(&d, &["tools", "disable", "echo-console"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let show = cli(&d, &["tools", "show", "echo-console", "--json"]);
    let v = json_of(&show);
    assert_eq!(v["state"], "WITHHELD", "{v}");
    let reason = v["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("disabled by the operator (stsd tools disable)"),
        "{v}"
    );
    let call = cli(&d, &["call", "echo-console", "--arg", "text=x"]);
    assert!(
        String::from_utf8_lossy(&call.stderr).contains("disabled by the operator"),
        "{}",
        String::from_utf8_lossy(&call.stderr)
    );
}

/// Issue 38 item 7: `stsd new` writes a spec that checks, passes its Local Pass with
/// `stsd test --write`, publishes with `stsd tools add` and answers a call, as the next
/// steps it prints say; it never replaces a file.
#[test]
fn stsd_new_writes_a_spec_that_goes_from_test_to_tools_add() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("greeter.json");
    let f = file.display().to_string();
    let run = |args: &[&str]| {
        Command::new(stsd_bin())
            .args(args)
            .current_dir(dir.path())
            // `stsd test --write` records its ledger in the test's state dir.
            .env("STSD_STATE_DIR", dir.path().join("state"))
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let out = run(&["new", "greeter", "--out", &f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("stsd test --write") && said.contains("stsd tools add"),
        "{said}"
    );
    let out = run(&["new", "greeter", "--out", &f]);
    assert!(!out.status.success(), "an existing file was replaced");
    let out = run(&["check", &f]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("DRAFT"));
    let out = run(&["test", "--write", &f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let d = Daemon::start(1, "");
    let out = cli(&d, &["tools", "add", &f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = d.connect();
    c.call(1, "greeter", json!({"text": "world"}));
    assert_eq!(stsd_tests::harness::text(&c.response()), "hello world");
    // With --network the spec asks for exactly that host.
    let net = dir.path().join("net.json");
    assert!(run(&[
        "new",
        "net",
        "--network",
        "api.example.com",
        "--out",
        &net.display().to_string()
    ])
    .status
    .success());
    let doc: Value =
        serde_json::from_slice(&std::fs::read(&net).unwrap_or_default()).unwrap_or(Value::Null);
    assert_eq!(
        doc["sandboxOverrides"]["hostsAllow"],
        json!(["api.example.com"])
    );
    assert_eq!(doc["sandboxOverrides"]["networkMode"], "allowlist");
}

/// Issue 38 item 10: `stsd client setup CLIENT` writes each client's own config file (its own
/// place and key) with `stsd mcp` on the daemon's socket, keeping what the file held;
/// `--print` writes nothing; a file that is not JSON is left as it is.
#[test]
fn client_setup_points_each_client_at_stsd_mcp_and_keeps_the_file() {
    let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str]| {
        Command::new(stsd_bin())
            .args(args)
            .env("HOME", home.path())
            .current_dir(home.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let cases = [
        (
            "claude-desktop",
            ".config/Claude/claude_desktop_config.json",
            "mcpServers",
        ),
        ("claude-code", ".mcp.json", "mcpServers"),
        ("cursor", ".cursor/mcp.json", "mcpServers"),
        ("vscode", ".vscode/mcp.json", "servers"),
        (
            "windsurf",
            ".codeium/windsurf/mcp_config.json",
            "mcpServers",
        ),
    ];
    for (client, file, key) in cases {
        let path = home.path().join(file);
        std::fs::create_dir_all(path.parent().unwrap_or(home.path())).unwrap_or_default();
        let had = json!({"keep": 1, key: {"other": {"command": "other-server"}}});
        std::fs::write(&path, had.to_string()).unwrap_or_default();
        let out = run(&[
            "client",
            "setup",
            client,
            "--print",
            "--socket",
            "/tmp/s.sock",
        ]);
        assert!(
            out.status.success(),
            "{client}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap_or_default(),
            had.to_string(),
            "{client}: --print wrote"
        );
        for _ in 0..2 {
            let out = run(&["client", "setup", client, "--socket", "/tmp/s.sock"]);
            assert!(
                out.status.success(),
                "{client}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap_or_default())
            .unwrap_or(Value::Null);
        assert_eq!(v["keep"], 1, "{client}: {v}");
        assert_eq!(v[key]["other"]["command"], "other-server", "{client}: {v}");
        let me = &v[key]["stsd"];
        assert_eq!(
            me["args"],
            json!(["mcp", "--socket", "/tmp/s.sock"]),
            "{client}: {v}"
        );
        let cmd = me["command"].as_str().unwrap_or_default();
        assert!(
            cmd.ends_with("/stsd") && std::path::Path::new(cmd).is_file(),
            "{cmd}"
        );
    }
    // A file that does not parse is refused and left as it was.
    let broken = home.path().join("broken.json");
    std::fs::write(&broken, "{ // a comment\n}").unwrap_or_default();
    let out = run(&[
        "client",
        "setup",
        "cursor",
        "--file",
        &broken.display().to_string(),
    ]);
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read_to_string(&broken).unwrap_or_default(),
        "{ // a comment\n}"
    );
}

/// Issue 38 item 9: the socket is settable in the config, and the client commands find the
/// daemon by the same config (no --socket on either side).
#[test]
fn the_socket_set_in_the_config_serves_the_daemon_and_its_clients() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    let socket = d.join("from-config.sock");
    let config = d.join("stsd.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nsocket = \"{}\"\naudit_log = \"{}\"\ncatalog_dir = \"{}\"\n",
            socket.display(),
            d.join("audit.jsonl").display(),
            d.join("managed").display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let clean = |c: &mut Command| {
        c.env_remove("STSD_SOCKET")
            .env("STSD_CONFIG", &config)
            .env("STSD_STATE_DIR", d.join("state"))
            .envs(stsd_tests::harness::systemd_dirs(d));
    };
    let mut daemon = Command::new(stsd_bin());
    clean(&mut daemon);
    daemon
        .args(["--pool", "1", "--catalog", CATALOG])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Killed when the test ends, a failed assertion included.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Killed(daemon.spawn().unwrap_or_else(|e| panic!("{e}")));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon never listened on the configured socket"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut status = Command::new(stsd_bin());
    clean(&mut status);
    let out = status
        .args(["status", "--json"])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let v = json_of(&out);
    assert_eq!(v["pool"]["size"], 1, "{v}");
}
