//! `stsd secret set|rm|list` on a running daemon (issue 38 item 8): a spec's `${secret:NAME}`
//! and `${NAME}` resolve from the secrets directory, a value set at the CLI is read by the
//! next call without a restart, every value is masked, and a tool whose secret is missing
//! is withheld with the command that fixes it. And `stsd catalog add` publishes what passes
//! and says why each other spec did not.

use serde_json::{json, Value};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output, Stdio};
use stsd_tests::harness::{text, Daemon};
use stsd_tests::stsd_bin;

fn keyed() -> Value {
    json!({"name": "keyed", "description": "reports on the key the operator gave it", "codeType": "Javascript",
           "draft": false, "params": [],
           "staticVariables": [{"k": "${secret:DEMO_KEY}"}, {"t": "${DEMO_TOKEN}"}],
           "code": "return k.length + ':' + k.split('').reverse().join('') + ':' + k + ':' + t;"})
}

fn secret_cli(d: &Daemon, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(stsd_bin())
        .arg("secret")
        .args(args)
        .arg("--socket")
        .arg(&d.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin.unwrap_or("").as_bytes());
    }
    child.wait_with_output().unwrap_or_else(|e| panic!("{e}"))
}

fn call_keyed(d: &Daemon) -> Result<String, String> {
    let mut c = d.connect();
    c.call(1, "keyed", json!({}));
    let r = c.response();
    match r.get("error") {
        Some(e) => Err(e["message"].as_str().unwrap_or_default().to_string()),
        None if r["result"]["isError"] == true => Err(text(&r)),
        None => Ok(text(&r)),
    }
}

fn listed(d: &Daemon) -> Vec<String> {
    let mut c = d.connect();
    c.send(1, "tools/list", json!({}));
    c.response()["result"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_secret_set_at_the_cli_is_read_by_the_next_call_without_a_restart() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("keyed.json");
    std::fs::write(&catalog, keyed().to_string()).unwrap_or_else(|e| panic!("{e}"));
    // The code holds DEMO_KEY in clear (so it can show its length and its reverse, which no
    // masking catches); DEMO_TOKEN stays a placeholder.
    let extra = "[secrets.DEMO_KEY]\nexpose_to_code = true\n";
    let d = Daemon::start_in(dir, 1, extra, &catalog.display().to_string());

    // Missing: withheld, and the reason names the command that fixes it.
    assert!(!listed(&d).contains(&"keyed".to_string()));
    let out = Command::new(stsd_bin())
        .args(["tools", "show", "keyed", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        shown.contains("stsd secret set DEMO_KEY"),
        "the withheld tool does not say how to fix it: {shown}"
    );

    // A name that is a path is refused before anything is written.
    let out = secret_cli(&d, &["set", "../escape"], Some("x"));
    assert!(!out.status.success());
    assert!(!d.dir().join("state/escape").exists());

    // Set without --host, a secret is for upstreams and the store: a spec that names it does
    // not get it (an upstream's token is no tool's), and the reason says how to give it.
    let out = ok(&secret_cli(
        &d,
        &["set", "DEMO_TOKEN"],
        Some("tok-abcdef\n"),
    ));
    assert!(out.contains("not for tools"), "{out}");
    assert!(!out.contains("served, using it"), "{out}");
    let shown = |d: &Daemon| {
        let out = Command::new(stsd_bin())
            .args(["tools", "show", "keyed", "--json", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(shown(&d).contains("DEMO_TOKEN (secret DEMO_TOKEN is set, but not for tools"));
    // For tools, with the hosts it may go to: one of its two secrets, still withheld.
    let out = ok(&secret_cli(
        &d,
        &["set", "DEMO_TOKEN", "--host", "api.example.org"],
        Some("tok-abcdef\n"),
    ));
    assert!(out.contains("sent only to api.example.org"), "{out}");
    assert!(!out.contains("served, using it"), "{out}");
    assert!(!listed(&d).contains(&"keyed".to_string()));
    let out = ok(&secret_cli(&d, &["set", "DEMO_KEY"], Some("alpha-1234\n")));
    assert!(out.contains("served, using it: keyed"), "{out}");
    // Stored 0600 in a 0700 directory of the daemon's state, the value as given.
    let file = d.dir().join("state/secrets/DEMO_KEY");
    let mode = |p: &std::path::Path| {
        std::fs::metadata(p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0)
    };
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&d.dir().join("state/secrets")), 0o700);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_default(),
        "alpha-1234"
    );

    assert!(listed(&d).contains(&"keyed".to_string()));
    let r = call_keyed(&d).unwrap_or_else(|e| panic!("{e}"));
    // The length and the reverse prove the value; the value itself and the token are masked.
    assert!(r.starts_with("10:4321-ahpla:"), "{r}");
    assert!(
        !r.contains("alpha-1234") && !r.contains("tok-abcdef"),
        "{r}"
    );

    // Changed: the very next call reads the new value (no restart, no SIGHUP).
    ok(&secret_cli(&d, &["set", "DEMO_KEY"], Some("beta-567890")));
    let r = call_keyed(&d).unwrap_or_else(|e| panic!("{e}"));
    assert!(r.starts_with("11:098765-ateb:"), "{r}");
    assert!(!r.contains("beta-567890"), "{r}");

    // Listed by name only.
    let out = ok(&secret_cli(&d, &["list", "--json"], None));
    let v: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["secrets"], json!(["DEMO_KEY", "DEMO_TOKEN"]));
    assert!(!out.contains("beta") && !out.contains("tok-"), "{out}");

    // Removed: withheld again, at once.
    let out = ok(&secret_cli(&d, &["rm", "DEMO_KEY"], None));
    assert!(out.contains("withheld: keyed"), "{out}");
    assert!(!listed(&d).contains(&"keyed".to_string()));
    // No value reached the daemon's log or the audit log.
    let log = std::fs::read_to_string(d.dir().join("stderr.log")).unwrap_or_default();
    let audit = std::fs::read_to_string(&d.audit).unwrap_or_default();
    for v in ["alpha-1234", "beta-567890", "tok-abcdef"] {
        assert!(!log.contains(v) && !audit.contains(v), "{v} was logged");
    }
}

#[test]
fn catalog_add_publishes_the_preset_tools_that_pass_and_explains_the_others() {
    let shared = stsd_tests::shared_dir().join("catalog");
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "[]").unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_in(
        dir,
        1,
        "require_local_pass = true\n",
        &empty.display().to_string(),
    );
    let add = |preset: &str| {
        Command::new(stsd_bin())
            .args(["catalog", "add", "--socket"])
            .arg(&d.socket)
            .arg(&shared)
            .args(["--preset", preset])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    // dev-essentials needs nothing from outside: every tool passes and is served.
    let out = add("dev-essentials");
    let text = ok(&out);
    assert!(text.contains("7 of 7 specs served"), "{text}");
    let served = listed(&d);
    for t in [
        "uuid",
        "hash",
        "base64",
        "jwtDecode",
        "regexExtract",
        "getCurrentTime",
        "evalExpression",
    ] {
        assert!(
            served.contains(&t.to_string()),
            "{t} is not served: {served:?}"
        );
    }
    // Again: nothing changes, nothing fails.
    assert!(ok(&add("dev-essentials")).contains("7 of 7 specs served"));

    // file-toolkit's tools read the workspace (they pass in scratch); the reference's
    // "everything" preset lists no tool and means all of them: each one that does not pass
    // is named with a reason an operator acts on, and the command fails.
    let out = add("everything");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let not: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("  ") && l.contains("not published"))
        .collect();
    assert!(!not.is_empty(), "{text}");
    for l in &not {
        // (Where the network is reachable, a service's own refusal of a keyless call is a
        // failing case: still a reason, with the tool's words.)
        assert!(
            l.contains("(missing secret): needs ")
                || l.contains("(network): ")
                || l.contains("(needs approval): ")
                || l.contains("(failing case): "),
            "a refusal without a reason an operator acts on: {l}"
        );
    }
    // Where the secret would go is said before it is set: the spec's own hosts.
    assert!(
        text.contains(
            "searchNaver: not published (missing secret): needs NAVER_CLIENT_ID: stsd secret \
             set NAVER_CLIENT_ID --host openapi.naver.com"
        ),
        "{text}"
    );
    assert!(
        text.contains("deleteFile: not published (needs approval)"),
        "{text}"
    );
    // What passed is served; what did not is not.
    let served = listed(&d);
    assert!(
        served.contains(&"readTextFile".to_string()) || served.contains(&"sortFile".to_string())
    );
    assert!(!served.contains(&"searchNaver".to_string()));
    assert!(!served.contains(&"deleteFile".to_string()));
}
