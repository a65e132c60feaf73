//! The node-comparison corpus: every argument set in `tests/fidelity/*.json` runs through stsd
//! (arguments checked against the params as a caller's are, then a sandboxed worker) and
//! through node (`tests/fidelity_oracle.js`), and the outcomes must be equal: the result's JSON
//! text as JSON.stringify wrote it, or the error as the caller reads it (`Name: message`). A
//! set marked `"differs": "KEY"` is a known difference: the book's chapter on them
//! (`docs/src/fidelity.md`) must list `KEY` with its reason, and the two must still differ (a fixed difference fails until its mark is removed).
//!
//! A group is a catalog tool (`file` + `tool`) or a snippet over the runtime globals (`code` +
//! `params`).

use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use stsd::exec::{run_job, CallValue};
use stsd_protocol::frames::FsAccess;
use stsd_tests::{catalog_dir, exec_options, job, read_json, scratch_base};

struct Case {
    label: String,
    code: String,
    declared: Vec<String>,
    args: serde_json::Map<String, Value>,
    differs: Option<String>,
}

fn corpus() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fidelity");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let doc = read_json(&f);
        let fname = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for g in doc["groups"].as_array().cloned().unwrap_or_default() {
            let (name, code, declared, spec) = if let Some(tool) = g["tool"].as_str() {
                let file = g["file"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{fname}: {tool} has no file"));
                let cat = stsd::store::Catalog::load(&[catalog_dir().join(file)]);
                let spec = cat
                    .entries
                    .iter()
                    .filter_map(|e| e.validated.spec.clone())
                    .find(|s| s.name == tool)
                    .unwrap_or_else(|| panic!("{fname}: {tool} is not in {file}"));
                let declared: Vec<String> = spec.params.iter().map(|p| p.name.clone()).collect();
                (tool.to_string(), spec.code.clone(), declared, Some(spec))
            } else {
                let name = g["name"].as_str().unwrap_or("snippet").to_string();
                let code = g["code"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{fname}: {name} has no code"))
                    .to_string();
                let declared = g["params"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(String::from))
                            .collect()
                    })
                    .unwrap_or_default();
                (name, code, declared, None)
            };
            for (i, set) in g["sets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                let raw = set["args"].as_object().cloned().unwrap_or_default();
                // A catalog tool's arguments are checked as a caller's are: what node gets is
                // what stsd binds.
                let args = match &spec {
                    Some(s) => stsd::exec::job::check_arguments(s, &raw)
                        .unwrap_or_else(|d| panic!("{fname}: {name} set {i}: {d}")),
                    None => raw,
                };
                out.push(Case {
                    label: format!("{fname}: {name} set {i} {}", Value::Object(args.clone())),
                    code: code.clone(),
                    declared: declared.clone(),
                    args,
                    differs: set["differs"].as_str().map(String::from),
                });
            }
        }
    }
    out
}

/// stsd's outcome as the caller reads it: ("ok", JSON text) or ("error", message).
fn ours(c: &Case) -> (bool, String) {
    let base = scratch_base();
    let mut j = job(&c.code, FsAccess::None, base.path());
    j.args_json = Value::Object(c.args.clone()).to_string();
    j.declared = c.declared.clone();
    match run_job(&j, &exec_options(), &mut |_| {}).result {
        Ok(CallValue::Json(t)) => (true, t),
        Ok(CallValue::Undefined) => (true, "undefined".into()),
        Err(e) => (false, e.message),
    }
}

fn theirs(cases: &[Case]) -> Vec<(bool, String)> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/fidelity_oracle.js");
    let input: Vec<Value> = cases
        .iter()
        .map(|c| json!({"code": c.code, "args": c.args, "declared": c.declared}))
        .collect();
    let mut child = Command::new("node")
        .arg(script)
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("node is needed for this test (scripts/setup-test-deps): {e}"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(Value::Array(input).to_string().as_bytes())
            .unwrap_or_else(|e| panic!("node stdin: {e}"));
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("node: {e}"));
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("node output: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    v.as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            if r["ok"] == true {
                (true, r["json"].as_str().unwrap_or_default().to_string())
            } else {
                (false, r["error"].as_str().unwrap_or_default().to_string())
            }
        })
        .collect()
}

/// Where the known differences are listed, with their reasons.
const DIFFERENCES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/fidelity.md");

/// The keys `docs/src/fidelity.md` lists under "Known differences from node"
/// (`- \`KEY\`: reason`).
fn listed_differences() -> Vec<String> {
    let chapter =
        std::fs::read_to_string(DIFFERENCES).unwrap_or_else(|e| panic!("{DIFFERENCES}: {e}"));
    let section = chapter
        .split("Known differences from node")
        .nth(1)
        .unwrap_or_else(|| panic!("{DIFFERENCES} has no \"Known differences from node\" list"));
    section
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("- `") || l.starts_with("  ") || l.is_empty())
        .filter_map(|l| l.strip_prefix("- `").and_then(|r| r.split('`').next()))
        .map(String::from)
        .collect()
}

#[test]
fn stsd_gives_nodes_result_for_every_argument_set() {
    let cases = corpus();
    assert!(
        cases.len() >= 120,
        "the corpus holds {} argument sets",
        cases.len()
    );
    let node = theirs(&cases);
    assert_eq!(
        node.len(),
        cases.len(),
        "node answered {} of {}",
        node.len(),
        cases.len()
    );
    let listed = listed_differences();
    let (mut equal, mut known, mut wrong) = (0, 0, Vec::new());
    for (c, n) in cases.iter().zip(&node) {
        let o = ours(c);
        match &c.differs {
            None if &o == n => equal += 1,
            None => wrong.push(format!("{}\n    stsd {o:?}\n    node {n:?}", c.label)),
            Some(key) if !listed.contains(key) => wrong.push(format!(
                "{}: difference {key:?} is not listed in {DIFFERENCES}",
                c.label
            )),
            // Both engines refuse the input with the same error class, in their own words.
            Some(key) if key == "engine-message" => {
                let name =
                    |(ok, m): &(bool, String)| (!ok).then(|| m.split(':').next().map(String::from));
                if name(&o).flatten().is_some() && name(&o) == name(n) && &o != n {
                    known += 1;
                } else {
                    wrong.push(format!(
                        "{}: marked {key:?}: stsd {o:?}, node {n:?}",
                        c.label
                    ));
                }
            }
            Some(key) if &o == n => wrong.push(format!(
                "{}: marked {key:?} but stsd now equals node; remove the mark",
                c.label
            )),
            Some(_) => known += 1,
        }
    }
    eprintln!(
        "{} argument sets: {equal} equal to node, {known} known differences",
        cases.len()
    );
    assert!(
        wrong.is_empty(),
        "{} differ from node:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
