//! The Local Pass (`stsd test`) over the reference catalog and our own, and `--write`.

use std::process::Command;
use stsd::local_pass::run_entry;
use stsd::store::Catalog;
use stsd_profiles::Config;
use stsd_tests::{catalog_dir, exec_options, stsd_bin};

fn no_env(_: &str) -> Option<String> {
    None
}

/// Runs the Local Pass of every spec in a catalog file; returns (passed, failed with cause).
fn local_pass(file: &str) -> (Vec<String>, Vec<(String, String)>) {
    let cat = Catalog::load(&[catalog_dir().join(file)]);
    let (mut ok, mut failed) = (Vec::new(), Vec::new());
    for e in &cat.entries {
        let r = run_entry(
            &cat,
            e,
            &Config::default(),
            &no_env,
            &exec_options(),
            stsd::local_pass::PassPlace::Scratch,
            Some(&stsd_tests::APPROVE),
        );
        match r.outcome {
            Ok(_) => ok.push(r.name),
            Err(d) => failed.push((r.name, d.message)),
        }
    }
    (ok, failed)
}

#[test]
fn builtin_specs_all_earn_their_local_pass() {
    let (ok, failed) = local_pass("default-tool-specs-builtin.json");
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(ok.len(), 16);
}

#[test]
fn builtin_helpers_all_earn_their_local_pass() {
    let (ok, failed) = local_pass("default-tool-specs-builtin-helpers.json");
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(ok.len(), 10);
}

#[test]
fn default_specs_pass_unless_they_need_the_network_or_an_unset_variable() {
    // With the default configuration the network specs really try the network: on a machine
    // without it they fail at DNS or connect (tests/egress.rs passes them through a fixture).
    let (ok, failed) = local_pass("default-tool-specs.json");
    assert!(ok.len() >= 24, "{failed:?}");
    assert_eq!(ok.len() + failed.len(), 29);
    for (name, why) in &failed {
        assert!(
            why.contains("[fetch] ") || why.contains("MISSING_REQUIREMENTS"),
            "{name}: {why}"
        );
    }
}

#[test]
fn test_write_persists_draft_false_only_for_passes() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("specs.json");
    let specs = serde_json::json!([
        {"name": "good", "code": "return n * 2;", "codeType": "Javascript", "draft": true,
         "params": [{"name": "n", "type": "INTEGER", "required": true, "testValue": "21"}]},
        {"name": "bad", "code": "throw new Error('nope');", "codeType": "Javascript", "draft": true}
    ]);
    let _ = std::fs::write(
        &path,
        serde_json::to_string_pretty(&specs).unwrap_or_default(),
    );
    let out = Command::new(stsd_bin())
        .args(["test", "--write"])
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "one spec fails: {stdout}");
    assert!(stdout.contains("PASS good"), "{stdout}");
    assert!(
        stdout.contains("LOCAL_PASS_FAILED") && stdout.contains("JS_ERROR: Error: nope"),
        "{stdout}"
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap_or_default()).unwrap_or_default();
    assert_eq!(saved[0]["draft"], false);
    assert!(saved[0]["updateTimestamp"].is_i64() && saved[0]["toolId"].is_string());
    assert_eq!(saved[1]["draft"], true, "a failing spec stays a draft");
    assert!(
        saved[1].get("updateTimestamp").is_none(),
        "a failing spec is not rewritten"
    );
}

#[test]
fn bundled_catalog_passes() {
    let out = Command::new(stsd_bin())
        .arg("test")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("4 specs passed, 0 failed"), "{stdout}");
}

#[test]
fn run_cli_prints_result_and_distinguishes_exit_codes() {
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../supervisor/catalog/examples.json");
    let run = |args: &[&str]| {
        Command::new(stsd_bin())
            .arg("run")
            .arg(&spec)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let ok = run(&[
        "--tool",
        "slugify",
        "--arg",
        "title=Hello World",
        "--arg",
        "maxLength=5",
    ]);
    assert_eq!(ok.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "hello");
    // Wrong type: INVALID_INPUT with a pointer, usage exit code.
    let bad = run(&[
        "--tool",
        "slugify",
        "--arg",
        "title=x",
        "--arg",
        "maxLength=five",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("INVALID_INPUT at /arguments/maxLength"));
    // Missing required argument.
    let missing = run(&["--tool", "slugify", "--json"]);
    assert_eq!(missing.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&missing.stdout).unwrap_or_default();
    assert_eq!(v["error"]["code"], "INVALID_INPUT");
    assert_eq!(v["error"]["pointer"], "/arguments/title");
    // A tool error: exit 1, classified.
    let tool_err = run(&[
        "--tool",
        "slugify",
        "--arg",
        "title=x",
        "--arg",
        "maxLength=0",
        "--json",
    ]);
    assert_eq!(tool_err.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&tool_err.stdout).unwrap_or_default();
    assert_eq!(v["error"]["code"], "JS_ERROR");
    // Several specs in the file and no --tool: usage error.
    assert_eq!(run(&[]).status.code(), Some(2));
}

/// A spec's testCases (seed 004) run after its Local Pass: expected results compared deeply,
/// expected failures by code; `--json` prints seed 004's shape, checked against a schema of
/// it; `--case N` runs one case; a failing case fails the spec (and `--write` leaves it a
/// draft).
#[test]
fn test_cases_run_after_the_local_pass_and_report_in_seed_004_shape() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let spec = |cases: serde_json::Value| {
        serde_json::json!([{"name": "adder", "description": "adds two numbers for the tests",
            "codeType": "Javascript", "draft": true,
            "params": [{"name": "a", "type": "INTEGER", "required": true, "description": "", "testValue": "1"},
                       {"name": "b", "type": "INTEGER", "required": true, "description": "", "testValue": "2"}],
            "code": "if (a < 0) throw new RangeError('negative'); return {sum: a + b};",
            "testCases": cases}])
    };
    let good = serde_json::json!([
        {"name": "adds", "arguments": {"a": 2, "b": 3}, "expected": {"sum": 5}},
        {"name": "refuses negatives", "arguments": {"a": -1, "b": 3},
         "expectedSuccess": false, "expectedErrorCode": "JS_ERROR"},
        {"name": "bad types", "parameters": {"a": "x", "b": 3},
         "expectedSuccess": false, "expectedErrorCode": "INVALID_INPUT"}
    ]);
    let file = dir.path().join("adder.json");
    let run = |args: &[&str]| {
        Command::new(stsd_bin())
            .arg("test")
            .args(args)
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    std::fs::write(&file, spec(good.clone()).to_string()).unwrap_or_else(|e| panic!("{e}"));
    let out = run(&["--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let shape = serde_json::json!({
        "type": "object", "required": ["results", "summary"],
        "properties": {
            "results": {"type": "array", "items": {"type": "object",
                "required": ["name", "success", "result", "duration"],
                "properties": {"name": {"type": "string"}, "success": {"type": "boolean"},
                               "result": {"type": "object", "required": ["success", "executionTime"]},
                               "duration": {"type": "integer", "minimum": 0}}}},
            "summary": {"type": "object", "required": ["total", "passed", "failed", "successRate"],
                "properties": {"total": {"type": "integer"}, "passed": {"type": "integer"},
                               "failed": {"type": "integer"}, "successRate": {"type": "number"}}}}
    });
    let validator = jsonschema::draft202012::new(&shape).unwrap_or_else(|e| panic!("{e}"));
    assert!(validator.is_valid(&v), "{v}");
    assert_eq!(v["summary"]["total"], 4, "{v}");
    assert_eq!(v["summary"]["successRate"], 100.0);
    assert_eq!(v["results"][1]["result"]["output"]["sum"], 5);
    // --case 1: that case alone.
    let one: serde_json::Value =
        serde_json::from_slice(&run(&["--json", "--case", "1"]).stdout).unwrap_or_default();
    assert_eq!(one["summary"]["total"], 1);
    assert_eq!(one["results"][0]["name"], "refuses negatives");
    // A wrong expectation fails the spec, and --write leaves it a draft.
    let mut bad = good.clone();
    bad[0]["expected"] = serde_json::json!({"sum": 6});
    std::fs::write(&file, spec(bad).to_string()).unwrap_or_else(|e| panic!("{e}"));
    let out = run(&["--write"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("differs from the expected one"), "{text}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap_or_default())
            .unwrap_or_default();
    assert_eq!(saved[0]["draft"], true);
}

/// With an audit log configured, `stsd run` and every Local Pass of `stsd test` (failed ones
/// included) write audit records (seed 000 §11.3).
#[test]
fn stsd_run_and_local_passes_are_audited_when_a_log_is_configured() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("c.toml");
    std::fs::write(
        &config,
        format!("[daemon]\naudit_log = \"{}\"\n", audit.display()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("two.json");
    let specs = serde_json::json!([
        {"name": "works", "description": "returns its argument for the test", "codeType": "Javascript",
         "params": [{"name": "x", "type": "STRING", "required": true, "description": "", "testValue": "hi"}],
         "code": "return x;"},
        {"name": "breaks", "description": "always throws for the audit test", "codeType": "Javascript",
         "code": "throw new Error('nope');"}
    ]);
    std::fs::write(&file, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let run = |args: &[&str]| {
        Command::new(stsd_bin())
            .args(args)
            .arg("--config")
            .arg(&config)
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let _ = run(&["run", "--tool", "works", "--arg", "x=yo"]);
    let _ = run(&["test"]);
    let recs: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let seen: Vec<(String, String, String)> = recs
        .iter()
        .map(|r| {
            (
                r["transport"].as_str().unwrap_or_default().to_string(),
                r["name"].as_str().unwrap_or_default().to_string(),
                r["outcome"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let want = |t: &str, n: &str, o: &str| (t.to_string(), n.to_string(), o.to_string());
    assert_eq!(
        seen,
        [
            want("cli", "works", "OK"),
            want("local-pass", "works", "OK"),
            want("local-pass", "breaks", "ERROR")
        ],
        "{recs:?}"
    );
    assert_eq!(recs[0]["params"]["x"], "yo");
    // The pass's record is the call's, through the one pipeline: its own error code.
    assert_eq!(recs[2]["error"]["code"], "JS_ERROR");
}

/// Every entry under `dir`: relative path -> (kind, contents or link target, mode, mtime).
fn snapshot(
    dir: &std::path::Path,
) -> std::collections::BTreeMap<String, (char, Vec<u8>, u32, i64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
            let m = p.symlink_metadata().unwrap_or_else(|e| panic!("{e}"));
            let (kind, body) = if m.file_type().is_symlink() {
                (
                    'l',
                    std::fs::read_link(&p)
                        .map(|t| t.display().to_string().into_bytes())
                        .unwrap_or_default(),
                )
            } else if m.is_dir() {
                stack.push(p.clone());
                ('d', Vec::new())
            } else {
                ('f', std::fs::read(&p).unwrap_or_else(|e| panic!("{e}")))
            };
            out.insert(
                rel,
                (
                    kind,
                    body,
                    m.mode(),
                    m.mtime_nsec() + m.mtime() * 1_000_000_000,
                ),
            );
        }
    }
    out
}

fn config_file(dir: &std::path::Path, workspace: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("stsd.toml");
    let toml = format!(
        "[baseline]\nfs_base_path = {:?}\n",
        workspace.display().to_string()
    );
    std::fs::write(&path, toml).unwrap_or_else(|e| panic!("{e}"));
    path
}

fn stsd_test(config: &std::path::Path, extra: &[&str]) -> (i32, String, String) {
    let out = Command::new(stsd_bin())
        .arg("test")
        .arg("--config")
        .arg(config)
        .args(extra)
        .arg(catalog_dir().join("default-tool-specs-builtin-fs.json"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn builtin_fs_passes_18_of_18_on_a_fresh_install_without_creating_the_workspace() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let workspace = dir.path().join("workspace");
    let config = config_file(dir.path(), &workspace);
    // Seven of them need approval (humanInTheLoop REQUIRED): given ahead, as an operator at
    // a terminal would.
    let (rc, out, err) = stsd_test(&config, &["--approve"]);
    assert_eq!(rc, 0, "{out}{err}");
    assert!(out.contains("18 specs passed, 0 failed"), "{out}");
    assert!(
        !workspace.exists(),
        "a Local Pass must not create or seed the workspace"
    );
}

/// Gives a workspace to the worker user (when the tests run as root), as an install would.
fn to_worker_user(ws: &std::path::Path) {
    if stsd_tests::is_root() {
        let _ = Command::new("chown")
            .args(["-R", &format!("{0}:{0}", stsd_tests::WORKER_UID)])
            .arg(ws)
            .status();
    }
}

#[test]
fn the_local_pass_leaves_a_users_workspace_byte_identical() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ws = stsd_tests::scratch_base();
    // A user's files that happen to carry the names the write and delete tools' testValues use.
    let w = |p: &str, s: &str| {
        let path = ws.path().join(p);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(&path, s).unwrap_or_else(|e| panic!("{e}"));
    };
    w("README.md", "my notes\nTODO: call Bob\n");
    w(
        "report.md",
        "# old title\nQ3 numbers the user cares about\n",
    );
    w("log.txt", "2026-01-01 started\n");
    w("obsolete.txt", "not obsolete to me\n");
    w("draft.md", "my draft\n");
    w("data.csv", "a,b,c\n1,2,3\n");
    w("uploads/data.csv", "x,y\n");
    w("tmp/keep.txt", "precious\n");
    w("deep/er/file.bin", "\u{0}\u{1}binary");
    let _ = std::os::unix::fs::symlink("README.md", ws.path().join("link.md"));
    to_worker_user(ws.path());
    let before = snapshot(ws.path());
    assert!(before.len() >= 13, "{}", before.len());
    let config = config_file(dir.path(), ws.path());
    let (_, out, err) = stsd_test(&config, &["--approve"]);
    // The write and delete tools ran (in their scratch copies) and passed.
    for name in [
        "writeTextFile",
        "appendTextFile",
        "editTextFile",
        "moveFile",
        "deleteFile",
        "deleteDir",
    ] {
        assert!(out.contains(&format!("PASS {name} ")), "{name}: {out}{err}");
    }
    assert_eq!(snapshot(ws.path()), before, "the workspace changed: {out}");
}

/// Issue 32: a Local Pass goes through the approval gate. Without an answer (no terminal, no
/// flag) or with --deny, the tools that need approval (humanInTheLoop REQUIRED: every write
/// and delete tool here) fail and nothing of them runs: even in place, the workspace stays
/// byte-identical. Before, `stsd test` ran them with nobody asked.
#[test]
fn a_local_pass_of_a_tool_that_needs_approval_is_asked_for_first() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ws = stsd_tests::scratch_base();
    std::fs::write(ws.path().join("report.md"), "# mine\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(ws.path().join("obsolete.txt"), "keep\n").unwrap_or_else(|e| panic!("{e}"));
    to_worker_user(ws.path());
    let before = snapshot(ws.path());
    let config = config_file(dir.path(), ws.path());
    for (flags, code) in [
        (&["--in-place"][..], "APPROVAL_REQUIRED"),
        (&["--in-place", "--deny"][..], "APPROVAL_REJECTED"),
    ] {
        let (rc, out, err) = stsd_test(&config, flags);
        assert_eq!(rc, 1, "{out}{err}");
        for name in ["writeTextFile", "deleteFile", "moveFile"] {
            assert!(out.contains(&format!("FAIL {name} ")), "{name}: {out}");
        }
        assert!(out.contains(code), "{flags:?}: {out}");
        assert!(out.contains("PASS listDir "), "{out}");
        assert_eq!(
            snapshot(ws.path()),
            before,
            "{flags:?} changed the workspace: {out}"
        );
    }
}

#[test]
fn in_place_says_what_it_will_touch_and_touches_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ws = stsd_tests::scratch_base();
    let config = config_file(dir.path(), ws.path());
    let (_, out, err) = stsd_test(&config, &["--in-place", "--approve"]);
    let real = ws.path().canonicalize().unwrap_or_else(|e| panic!("{e}"));
    assert!(
        err.contains("--in-place")
            && err.contains(&ws.path().display().to_string())
            && err.contains("deleteFile"),
        "{err}"
    );
    // The old behaviour: the workspace was written (the README seeded, report.md written).
    assert!(real.join("report.md").exists(), "{out}{err}");
}

#[test]
fn an_oversized_workspace_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ws = stsd_tests::scratch_base();
    for i in 0..(stsd::scratch::MAX_COPY_ENTRIES + 1) {
        std::fs::write(ws.path().join(format!("f{i}")), "").unwrap_or_else(|e| panic!("{e}"));
    }
    let config = config_file(dir.path(), ws.path());
    let (rc, out, _) = stsd_test(&config, &[]);
    assert_eq!(rc, 1);
    assert!(
        out.contains("SANDBOX_UNAVAILABLE")
            && out.contains("over the scratch copy's limit")
            && out.contains("--in-place"),
        "{out}"
    );
}
