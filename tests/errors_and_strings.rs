//! What reaches a tool and its caller: arguments as the inputSchema says (blank strings are
//! bound), host errors with their identity (DOMException name, message and code; never
//! `Uncaught {}`), and lone surrogates through every path (result, `stsd run --json`,
//! console, MCP) written as JSON.stringify writes them.

use serde_json::{json, Value};
use std::process::Command;
use stsd::exec::{run_job, CallValue};
use stsd_protocol::frames::FsAccess;
use stsd_tests::harness::{is_error, text, Daemon};
use stsd_tests::{catalog_dir, exec_options, job, scratch_base, stsd_bin};

/// The body's result as JSON text, or the caller's error message.
fn run(code: &str, args: Value, declared: &[&str]) -> Result<String, String> {
    let base = scratch_base();
    let mut j = job(code, FsAccess::None, base.path());
    j.args_json = args.to_string();
    j.declared = declared.iter().map(|s| s.to_string()).collect();
    match run_job(&j, &exec_options(), &mut |_| {}).result {
        Ok(CallValue::Json(t)) => Ok(t),
        Ok(CallValue::Undefined) => Ok("undefined".into()),
        Err(e) => Err(e.message),
    }
}

fn catalog_tool(file: &str, name: &str) -> stsd_protocol::ToolSpec {
    let cat = stsd::store::Catalog::load(&[catalog_dir().join(file)]);
    cat.entries
        .iter()
        .filter_map(|e| e.validated.spec.clone())
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} missing from {file}"))
}

fn stsd(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(stsd_bin())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("stsd: {e}"));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn blank_string_arguments_are_bound_as_the_schema_says() {
    let file = catalog_dir().join("default-tool-specs-builtin.json");
    let file = file.to_string_lossy();
    // An empty replacement deletes the matches (the reference refused it as missing).
    let args = json!({"text": "a1b22c333", "pattern": "\\d+", "replacement": "", "flags": "g"});
    let (rc, out, err) = stsd(&[
        "run",
        &file,
        "--tool",
        "regexReplace",
        "--json",
        "--args-json",
        &args.to_string(),
    ]);
    assert_eq!(rc, 0, "{out}{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).ok(),
        Some(json!({"ok": true, "result": "abc"}))
    );
    // A tab delimiter is a delimiter, not a missing argument.
    let args = json!({"rows": [["a", "b"], ["c", "d"]], "delimiter": "\t"});
    let (rc, out, err) = stsd(&[
        "run",
        &file,
        "--tool",
        "formatCsv",
        "--json",
        "--args-json",
        &args.to_string(),
    ]);
    assert_eq!(rc, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap_or_default();
    assert_eq!(v["result"], "a\tb\nc\td", "{out}");
    // null is still missing.
    let args = json!({"text": "x", "pattern": "x", "replacement": null});
    let (rc, out, err) = stsd(&[
        "run",
        &file,
        "--tool",
        "regexReplace",
        "--json",
        "--args-json",
        &args.to_string(),
    ]);
    assert_eq!(rc, 2, "{out}{err}");
    assert!(out.contains("missing required argument"), "{out}");
}

#[test]
fn host_errors_reach_the_tool_and_the_caller_with_their_identity() {
    // (code, name, DOMException code)
    let cases = [
        ("btoa('€')", "InvalidCharacterError", 5),
        ("structuredClone(() => 1)", "DataCloneError", 25),
        ("structuredClone(Symbol('s'))", "DataCloneError", 25),
        ("atob('@@@@')", "InvalidCharacterError", 5),
        ("atob('abcde')", "InvalidCharacterError", 5),
        (
            "await crypto.subtle.digest('MD5', 'a')",
            "NotSupportedError",
            9,
        ),
        (
            "await crypto.subtle.importKey('jwk', new Uint8Array(1), 'HMAC', false, [])",
            "NotSupportedError",
            9,
        ),
    ];
    for (expr, name, code) in cases {
        // Inside the tool: a real, catchable DOMException (and an Error).
        let caught = run(
            &format!("try {{ {expr}; return 'no error'; }} catch (e) {{ return [e instanceof DOMException, e instanceof Error, e.name, e.code, typeof e.message, String(e).startsWith(e.name + ': ')]; }}"),
            json!({}),
            &[],
        );
        assert_eq!(
            caught.map(|t| serde_json::from_str::<Value>(&t).unwrap_or_default()),
            Ok(json!([true, true, name, code, "string", true])),
            "{expr}"
        );
        // Uncaught: the caller reads `Name: message`.
        let err = run(&format!("{expr}; return 1;"), json!({}), &[])
            .err()
            .unwrap_or_default();
        assert!(
            err.starts_with(&format!("{name}: ")) && err.len() > name.len() + 3,
            "{expr}: {err:?}"
        );
    }
    // Error classes the host functions throw are real errors too.
    let r = run(
        "try { new TextDecoder('utf-8', {fatal: true}).decode(new Uint8Array([0xff])); } catch (e) { return [e instanceof TypeError, e.name]; }",
        json!({}),
        &[],
    );
    assert_eq!(r.as_deref(), Ok(r#"[true,"TypeError"]"#));
    // A broken JWT through the catalog's jwtDecode: the atob failure, by name.
    let spec = catalog_tool("default-tool-specs-builtin-helpers.json", "jwtDecode");
    let err = run(&spec.code, json!({"token": "a.b"}), &["token"])
        .err()
        .unwrap_or_default();
    assert!(err.starts_with("InvalidCharacterError: "), "{err}");
    let err = run(&spec.code, json!({"token": "e30.bm90IGpzb24"}), &["token"])
        .err()
        .unwrap_or_default();
    assert!(err.starts_with("SyntaxError: "), "{err}");
}

#[test]
fn thrown_non_errors_are_rendered_by_their_json_or_string_form() {
    let cases = [
        ("throw {a: 1};", "Uncaught {\"a\":1}"),
        ("throw 5;", "Uncaught 5"),
        ("throw 'plain';", "Uncaught plain"),
        ("throw null;", "Uncaught null"),
        (
            "throw new (class Oops { toString() { return 'oops!'; } })();",
            "Uncaught oops!",
        ),
        (
            "throw {name: 'QuotaError', message: 'too much'};",
            "QuotaError: too much",
        ),
    ];
    for (code, want) in cases {
        assert_eq!(
            run(code, json!({}), &[]).err().as_deref(),
            Some(want),
            "{code}"
        );
    }
}

/// A spec file for the CLI and the daemon: splits an emoji in half, logs the halves.
fn surrogate_catalog(dir: &std::path::Path) -> std::path::PathBuf {
    let spec = json!([{
        "name": "halves",
        "description": "returns and logs the halves of an emoji for the tests",
        "params": [{"name": "mode", "type": "STRING", "required": false, "testValue": "array"}],
        "code": "const h = '😀a😀'.match(/./g); console.log('half', h[0], h); if (mode === 'string') return 'x' + h[1]; if (mode === 'object') return {k: h[0], [h[1]]: 1}; return h;",
        "codeType": "Javascript",
        "draft": false
    }]);
    let path = dir.join("halves.json");
    std::fs::write(&path, spec.to_string()).unwrap_or_else(|e| panic!("{e}"));
    path
}

#[test]
fn lone_surrogates_survive_the_cli() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = surrogate_catalog(dir.path());
    let path = path.to_string_lossy();
    let (rc, out, err) = stsd(&["run", &path, "--json"]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        out.trim(),
        r#"{"ok":true,"result":["\ud83d","\ude00","a","\ud83d","\ude00"]}"#
    );
    assert!(
        err.contains(r#"[log] half \ud83d ["\ud83d","\ude00","a","\ud83d","\ude00"]"#),
        "{err}"
    );
    let (rc, out, _) = stsd(&["run", &path, "--arg", "mode=string"]);
    assert_eq!((rc, out.trim()), (0, r"x\ude00"));
    let (rc, out, _) = stsd(&["run", &path, "--arg", "mode=object", "--json"]);
    assert_eq!(
        (rc, out.trim()),
        (0, r#"{"ok":true,"result":{"k":"\ud83d","\ude00":1}}"#)
    );
}

#[test]
fn lone_surrogates_survive_mcp() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = surrogate_catalog(dir.path());
    let d = Daemon::start_with(dir, 1, "", &path.to_string_lossy(), &[]);
    let mut c = d.connect();
    c.call(1, "halves", json!({}));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    // The text content is the JSON the tool's JSON.stringify wrote.
    assert_eq!(text(&r), r#"["\ud83d","\ude00","a","\ud83d","\ude00"]"#);
    c.call(2, "halves", json!({"mode": "string"}));
    let r = c.response();
    assert_eq!(text(&r), r"x\ude00", "{r}");
    c.call(3, "halves", json!({"mode": "object"}));
    let r = c.response();
    assert_eq!(text(&r), r#"{"k":"\ud83d","\ude00":1}"#, "{r}");
    assert_eq!(
        r["result"]["structuredContent"],
        json!({"k": "\\ud83d", "\\ude00": 1}),
        "{r}"
    );
}

/// For every catalog tool and every STRING param, an empty, a blank and a tab argument: the
/// advertised inputSchema (what a model is shown) and the argument check give the same
/// verdict, and it is "accepted".
#[test]
fn the_argument_check_and_the_advertised_schema_agree_on_blank_strings() {
    let mut checked = 0;
    for file in stsd_tests::catalog_spec_files() {
        let cat = stsd::store::Catalog::load(&[file]);
        for spec in cat.entries.iter().filter_map(|e| e.validated.spec.as_ref()) {
            let schema = serde_json::Value::Object(stsd::service::input_schema(spec));
            let validator = jsonschema::draft202012::new(&schema).unwrap_or_else(|e| panic!("{e}"));
            let base = stsd::exec::job::test_arguments(spec).unwrap_or_default();
            for p in spec
                .params
                .iter()
                .filter(|p| p.ty.json_schema_name() == "string")
            {
                for blank in ["", " ", "\t"] {
                    let mut args = base.clone();
                    args.insert(p.name.clone(), json!(blank));
                    let by_schema = validator.is_valid(&Value::Object(args.clone()));
                    let by_check = stsd::exec::job::check_arguments(spec, &args).is_ok();
                    assert!(
                        by_schema && by_check,
                        "{}.{} = {blank:?}: schema {by_schema}, check {by_check}",
                        spec.name,
                        p.name
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 600, "{checked}");
}
