//! `stsd new NAME`: a valid starting spec, with comments in its code saying what to change,
//! a parameter, and a test case its Local Pass runs; `--network HOST` makes it fetch from
//! HOST (allowlisted), `--fs read|write` gives it the workspace. The next steps are printed:
//! `stsd check`, `stsd test --write`, `stsd tools add`.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// What the tool may reach.
pub struct Reach {
    pub network: Vec<String>,
    /// "read" or "write".
    pub fs: Option<String>,
}

fn code(network: &[String], fs: Option<&str>) -> String {
    let head = "// Your tool's body: JavaScript (ES2024) run by QuickJS in a sandboxed worker.\n\
                // Its parameters are variables (`text` below); what it returns is the result\n\
                // (a string, or any JSON value). Throw an Error to fail the call.\n";
    let body = match (network.first(), fs) {
        (Some(host), _) => format!(
            "// fetch() reaches only the hosts in sandboxOverrides.hostsAllow ({host}).\n\
             const resp = await fetch('https://{host}/', {{ headers: {{ 'Accept': 'text/plain' }} }});\n\
             if (!resp.ok) throw new Error('HTTP ' + resp.status);\n\
             return {{ status: resp.status, length: resp.text().length, text }};\n"
        ),
        (None, Some("write")) => "// safety.fs reads and writes under the workspace (fsBasePath) only.\n\
             safety.fs.writeText('hello.txt', text);\n\
             return safety.fs.readText('hello.txt');\n"
            .to_string(),
        (None, Some(_)) => "// safety.fs reads under the workspace (fsBasePath) only.\n\
             return safety.fs.readText(text);\n"
            .to_string(),
        (None, None) => "if (text == null || text === '') throw new Error('text required');\n\
             return 'hello ' + text;\n"
            .to_string(),
    };
    format!("{head}{body}")
}

/// The starting spec for `name`.
pub fn spec(name: &str, reach: &Reach) -> Result<Value, String> {
    stsd_protocol::ToolName::parse(name).map_err(|e| e.to_string())?;
    if let Some(f) = reach.fs.as_deref() {
        if !matches!(f, "read" | "write") {
            return Err(format!("--fs {f}: read or write"));
        }
    }
    for h in &reach.network {
        if h.is_empty() || h.contains(['/', ':', ' ']) {
            return Err(format!(
                "--network {h}: a host name, such as api.example.com"
            ));
        }
    }
    let (test_value, expected) = match (reach.network.is_empty(), reach.fs.as_deref()) {
        (false, _) => ("stsd", None),
        (true, Some("write")) => ("hello from stsd", Some(json!("hello from stsd"))),
        (true, Some(_)) => ("README.md", None),
        (true, None) => ("world", Some(json!("hello world"))),
    };
    let mut doc = json!({
        "name": name,
        "description": format!(
            "Describe what {name} does, for the model that chooses it: what it takes, what it \
             returns, and when to use it."
        ),
        "codeType": "Javascript",
        "category": "OTHER",
        "tags": [],
        "params": [{
            "name": "text",
            "description": "What the tool works on (rename it, add more parameters beside it)",
            "required": true,
            "type": "STRING",
            "testValue": test_value,
        }],
        "code": code(&reach.network, reach.fs.as_deref()),
        "testCases": [],
    });
    if let Some(expected) = expected {
        doc["testCases"] = json!([{
            "name": "answers", "arguments": {"text": test_value}, "expected": expected,
        }]);
    }
    if !reach.network.is_empty() || reach.fs.is_some() {
        doc["sandboxOverrides"] = json!({
            "networkMode": if reach.network.is_empty() { "blocked" } else { "allowlist" },
            "hostsAllow": reach.network,
            "fileRead": reach.fs.is_some(),
            "fileWrite": reach.fs.as_deref() == Some("write"),
        });
    }
    Ok(doc)
}

/// Writes `name`'s starting spec to `out` (default `NAME.json`), never over a file.
pub fn run(name: &str, reach: &Reach, out: Option<PathBuf>) -> Result<PathBuf, String> {
    let doc = spec(name, reach)?;
    let path = out.unwrap_or_else(|| PathBuf::from(format!("{name}.json")));
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n";
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// What to do next, for the file at `path`.
pub fn next_steps(path: &Path, network: bool) -> String {
    let p = path.display();
    let mut s = format!(
        "wrote {p}\nnext:\n  edit its description, parameters, code and test cases\n  \
         stsd check {p}            # valid? what posture and risk it resolves to\n  \
         stsd run {p} --arg text=hi  # one call, in the sandbox\n  \
         stsd test --write {p}     # its Local Pass and test cases; stamps the file\n  \
         stsd tools add {p}        # publish it on the running daemon\n"
    );
    if network {
        s.push_str("  (its Local Pass fetches from the allowed host: run it where that host is reachable)\n");
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_name_or_reach_is_refused_before_anything_is_written() {
        let none = Reach {
            network: vec![],
            fs: None,
        };
        assert!(spec("has space", &none).is_err());
        assert!(spec("../x", &none).is_err());
        let bad = Reach {
            network: vec!["https://x.example/".into()],
            fs: None,
        };
        assert!(spec("ok", &bad).unwrap_err().contains("host name"));
        let fs = Reach {
            network: vec![],
            fs: Some("exec".into()),
        };
        assert!(spec("ok", &fs).unwrap_err().contains("read or write"));
    }
}
