//! The `stsd` binary as a user runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn stsd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stsd"))
        .args(args)
        .env_remove("STSD_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("cannot run stsd: {e}"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn catalog() -> String {
    let shared = std::env::var_os("STSD_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared"));
    shared.join("catalog").display().to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_catalog_reports_116_valid_and_the_reference_histogram() {
    let out = stsd(&["check", &catalog(), "--no-warnings"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("116 specs in 6 files: 116 valid, 0 invalid"),
        "{stdout}"
    );
    assert!(
        stdout.contains("risk: L0 50, L1 0, L2 0, L3 59, L4 4, L5 3"),
        "{stdout}"
    );
    assert!(stdout.contains("state: DRAFT 116"), "{stdout}");
}

#[test]
fn check_json_is_one_machine_readable_document() {
    let out = stsd(&["check", &catalog(), "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(v["summary"]["specs"], 116);
    assert_eq!(v["summary"]["byRisk"]["L3"], 59);
    let first = &v["specs"][0];
    for key in [
        "name",
        "toolId",
        "state",
        "riskLevel",
        "toolSafety",
        "diagnostics",
    ] {
        assert!(first.get(key).is_some(), "missing {key} in {first}");
    }
}

#[test]
fn an_invalid_spec_exits_1_with_code_and_pointer() {
    let bad = repo().join("tests/corpus/broken/integer-testvalue-word.json");
    let out = stsd(&["check", &bad.display().to_string()]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("INVALID"), "{stdout}");
    assert!(
        stdout.contains("error SPEC_INVARIANT at /params/0/testValue"),
        "{stdout}"
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(stsd(&["check", "/no/such/path"]).status.code(), Some(2));
    assert_eq!(stsd(&["no-such-command"]).status.code(), Some(2));
    let cfg = tempfile_path("bad.toml", "[baseline]\nnetwork_mod = 1\n");
    assert_eq!(stsd(&["check", "--config", &cfg]).status.code(), Some(2));
}

#[test]
fn schema_prints_the_shipped_document() {
    let out = stsd(&["schema"]);
    assert_eq!(out.status.code(), Some(0));
    let shipped = std::fs::read(repo().join("protocol/schema/safe-tool-spec.schema.json"))
        .unwrap_or_default();
    assert_eq!(out.stdout, shipped);
}

#[test]
fn bundled_catalog_is_valid_and_active() {
    let out = stsd(&["check", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let n = v["summary"]["specs"].as_u64().unwrap_or(0);
    assert!(n >= 4);
    assert_eq!(v["summary"]["byState"]["ACTIVE"], n);
    assert_eq!(
        v["summary"]["warnings"], 0,
        "our own specs follow every SHOULD"
    );
}

#[test]
fn config_file_changes_the_resolved_posture() {
    let cfg = tempfile_path("net.toml", "[baseline]\nnetwork_mode = \"strict\"\n");
    let out = stsd(&["check", "--config", &cfg, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        v["specs"][0]["toolSafety"]["capabilities"]["network"]["mode"],
        "strict"
    );
    assert_eq!(v["specs"][0]["riskLevel"], "L3");
}

fn tempfile_path(name: &str, content: &str) -> String {
    let dir = std::env::temp_dir().join(format!("stsd-cli-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let p = dir.join(name);
    let _ = std::fs::write(&p, content);
    p.display().to_string()
}

/// Author lint: fetch without a network grant, safety.fs without file access, a typo of a
/// known field, a secret-shaped testValue, open network in a published spec, a tag outside
/// the vocabulary: each a warning with its pointer; the spec stays valid. At run time the
/// missing grant is named in the error.
#[test]
fn check_lints_what_an_author_most_likely_got_wrong() {
    let dir = std::env::temp_dir().join(format!("stsd-lint-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let spec = dir.join("lint.json");
    let doc = serde_json::json!([
        {"name": "linted", "description": "a spec with everything wrong but valid", "codeType": "Javascript",
         "draft": false, "tags": ["util", "misc"], "descripton": "typo",
         "sandboxOverrides": {"networkMode": "open"},
         "params": [{"name": "token", "type": "STRING", "required": true, "description": "",
                     "testValue": "ghp_abcdefghijklmnopqrstuvwxyz0123456789"}],
         "code": "return safety.fs.readText('x') + fetch('https://x');"},
        {"name": "nofetch", "description": "fetch without the network grant", "codeType": "Javascript",
         "draft": true, "code": "return await fetch('https://example.com');"}
    ]);
    std::fs::write(&spec, doc.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let path = spec.display().to_string();
    let out = stsd(&["check", "--json", &path]);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let warnings: Vec<(String, String)> = v["specs"][0]["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|d| {
            (
                d["pointer"].as_str().unwrap_or_default().to_string(),
                d["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let has = |ptr: &str, text: &str| warnings.iter().any(|(p, m)| p == ptr && m.contains(text));
    assert!(has("/code", "safety.fs"), "{warnings:?}");
    assert!(
        has("/descripton", "did you mean \"description\""),
        "{warnings:?}"
    );
    assert!(has("/params/0/testValue", "GitHub token"), "{warnings:?}");
    assert!(has("/sandboxOverrides/networkMode", "open"), "{warnings:?}");
    assert!(has("/tags/1", "vocabulary"), "{warnings:?}");
    assert_eq!(v["specs"][0]["valid"], true);
    let second = v["specs"][1]["diagnostics"].to_string();
    assert!(
        second.contains("fetch, but the posture blocks the network"),
        "{second}"
    );
    let run = stsd(&["run", "--json", "--tool", "nofetch", &path]);
    let r: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap_or_default();
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("fetch needs sandboxOverrides.networkMode"),
        "{r}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A body that does not parse makes its spec invalid in `stsd check`, with the line and the
/// column in the body (compiled in a sandboxed worker; nothing of it runs).
#[test]
fn check_reports_a_parse_error_with_line_and_column() {
    let dir = std::env::temp_dir().join(format!("stsd-parse-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let spec = dir.join("parse.json");
    let doc = serde_json::json!([
        {"name": "second", "description": "a syntax error on line two", "codeType": "Javascript",
         "code": "const a = 1;\nconst b = (;\nreturn a;"},
        {"name": "first", "description": "a syntax error on line one", "codeType": "Javascript",
         "code": "return (;"},
        {"name": "fine", "description": "a body that parses and never runs here", "codeType": "Javascript",
         "code": "while (true) {}"}
    ]);
    std::fs::write(&spec, doc.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let path = spec.display().to_string();
    let out = stsd(&["check", "--json", &path]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let msg = |i: usize| v["specs"][i]["diagnostics"].to_string();
    assert!(msg(0).contains("(line 2, column 12)"), "{}", msg(0));
    assert!(msg(1).contains("(line 1, column 9)"), "{}", msg(1));
    assert_eq!(v["specs"][2]["valid"], true, "{}", msg(2));
    assert_eq!(v["summary"]["valid"], 1);
    assert_eq!(v["summary"]["invalid"], 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each subcommand takes exactly the flags it uses: the daemon's flags are refused on a
/// subcommand that would ignore them (a usage error, exit 2), and each flag is accepted
/// where it is used.
#[test]
fn each_subcommand_takes_only_its_own_flags() {
    let refused: &[&[&str]] = &[
        &["run", "--pool", "3", "x.json"],
        &["run", "--socket", "/tmp/s.sock", "x.json"],
        &["run", "--catalog", "dir", "x.json"],
        &["check", "--socket", "/tmp/s.sock"],
        &["check", "--pool", "2"],
        &["call", "slugify", "--config", "/dev/null"],
        &["call", "slugify", "--pool", "2"],
        &["status", "--catalog", "dir"],
        &["schema", "--config", "/dev/null"],
        &["--pool", "2", "status"],
        &["--socket", "/tmp/s.sock", "tools", "list"],
        &["--config", "/dev/null", "check"],
    ];
    for args in refused {
        let out = stsd(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("unexpected argument") || err.contains("cannot be used with"),
            "{args:?}: {err}"
        );
    }
    let help = |args: &[&str]| text(&stsd(args).stdout);
    let mcp = help(&["mcp", "--help"]);
    for flag in [
        "--socket",
        "--config",
        "--catalog",
        "--pool",
        "--preset",
        "--toolsets",
    ] {
        assert!(mcp.contains(flag), "stsd mcp lacks {flag}: {mcp}");
    }
    let call = help(&["call", "--help"]);
    assert!(
        call.contains("--socket") && !call.contains("--pool"),
        "{call}"
    );
    let run = help(&["run", "--help"]);
    assert!(
        run.contains("--config") && !run.contains("--socket"),
        "{run}"
    );
    let daemon = help(&["--help"]);
    for flag in [
        "--pool",
        "--socket",
        "--catalog",
        "--config",
        "--worker-reuse",
    ] {
        assert!(daemon.contains(flag), "stsd lacks {flag}: {daemon}");
    }
    // A tools verb takes --socket before or after it.
    for args in [
        &["tools", "--socket", "/nonexistent/s.sock", "list"][..],
        &["tools", "list", "--socket", "/nonexistent/s.sock"],
    ] {
        let out = stsd(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stderr).contains("/nonexistent/s.sock"));
    }
}
