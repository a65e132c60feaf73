//! What an operator relies on around the calls: the logs (one line per call, JSON on request,
//! no colour codes in files, banners naming unreadable and withheld specs), SIGHUP (config,
//! catalog and audit log file), the config lookup, and an audit record for every call that
//! arrived (cut off at shutdown, refused at argument checking) and for a failed start.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, text, Daemon, CATALOG};
use stsd_tests::stsd_bin;

/// A catalog directory: the test catalog, plus a spec file that is not JSON.
fn catalog_with_a_broken_file(dir: &Path) -> PathBuf {
    let cat = dir.join("catalog");
    std::fs::create_dir_all(&cat).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(CATALOG, cat.join("tools.json")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(cat.join("broken.json"), "[{\"name\": \"half\", \"code\": ")
        .unwrap_or_else(|e| panic!("{e}"));
    cat
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(d: &Daemon, sig: i32) {
    // SAFETY: kill on the pid of our own child.
    assert_eq!(unsafe { libc::kill(d.pid(), sig) }, 0);
}

#[test]
fn json_logs_are_one_object_per_line_with_a_line_per_call_and_the_banner_names_bad_specs() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog_with_a_broken_file(dir.path());
    let cat = cat.display().to_string();
    let d = Daemon::launch_env(
        dir,
        1,
        "",
        Some(&cat),
        &[],
        None,
        &[("STSD_LOG", "info"), ("STSD_LOG_FORMAT", "json")],
    );
    let mut c = d.connect();
    c.call(1, "echo-console", json!({"text": "hi"}));
    assert_eq!(text(&c.response()), "echo: hi");
    c.call(2, "always-fails", json!({}));
    assert!(is_error(&c.response()));
    wait_for("two call lines", 10, || {
        d.log().matches("\"tool call\"").count() >= 2
    });
    let log = d.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let calls: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "tool call")
        .collect();
    assert_eq!(calls.len(), 2, "{log}");
    let ok = calls[0];
    assert_eq!(ok["level"], "INFO");
    assert_eq!(ok["fields"]["tool"], "echo-console");
    assert_eq!(ok["fields"]["outcome"], "OK");
    assert!(ok["fields"]["ms"].is_u64(), "{ok}");
    assert!(ok["fields"]["call_id"].is_u64(), "{ok}");
    assert_eq!(calls[1]["fields"]["tool"], "always-fails");
    assert_ne!(calls[1]["fields"]["outcome"], "OK");
    // The banner is on the same stream, in the same form; it names the file it could not
    // read with the reason, and says what would publish each withheld spec.
    let banner: Vec<String> = lines
        .iter()
        .filter(|l| l["target"] == "stsd::banner")
        .map(|l| l["fields"]["message"].as_str().unwrap_or("").to_string())
        .collect();
    let all = banner.join("\n");
    assert!(all.contains("listening on"), "{all}");
    assert!(
        banner.iter().any(|l| l.starts_with("unreadable ")
            && l.contains("broken.json")
            && l.contains("SPEC_PARSE")),
        "{all}"
    );
    assert!(
        all.contains("withheld a-draft: DRAFT: run stsd test --write"),
        "{all}"
    );
    assert!(
        all.contains(
            "withheld needs-env: MISSING_REQUIREMENTS: STSD_TEST_UNSET_VARIABLE (stsd secret set \
             STSD_TEST_UNSET_VARIABLE --host HOST, or name it in [baseline] env_allow"
        ),
        "{all}"
    );
}

#[test]
fn text_logs_carry_no_colour_codes_in_a_file_and_none_on_a_terminal_with_no_color() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::launch_env(
        dir,
        1,
        "",
        Some(CATALOG),
        &[],
        None,
        &[("STSD_LOG", "info")],
    );
    let mut c = d.connect();
    c.call(1, "echo-console", json!({"text": "hi"}));
    assert_eq!(text(&c.response()), "echo: hi");
    wait_for("the call line", 10, || d.log().contains("tool call"));
    let log = d.log();
    assert!(!log.contains('\u{1b}'), "ANSI codes in a log file: {log:?}");
    assert!(
        log.lines().any(|l| l.contains("INFO")
            && l.contains("tool call")
            && l.contains("tool=echo-console")
            && l.contains("outcome=\"OK\"")
            && l.contains("call_id=")
            && l.contains("ms=")),
        "{log}"
    );

    // On a terminal (script(1) gives the command a pty) colour is on, unless NO_COLOR.
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("script(1) missing: the terminal half of this test did not run");
        return;
    }
    // A start that fails (a toolsets file that is not there) logs an ERROR line at once.
    let start_on_pty = |no_color: bool| {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let config = dir.path().join("stsd.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\naudit_log = \"{}/audit.jsonl\"\ncatalog_dir = \"{}/managed\"\n",
                dir.path().display(),
                dir.path().display()
            ),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let cmd = format!(
            "{} --config {} --socket {}/s.sock --pool 1 --toolsets /nonexistent.json",
            stsd_bin().display(),
            config.display(),
            dir.path().display()
        );
        let mut p = Command::new("script");
        p.args(["-qec", &cmd, "/dev/null"])
            .env("STSD_LOG", "info")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null());
        if no_color {
            p.env("NO_COLOR", "1");
        }
        let out = p.output().unwrap_or_else(|e| panic!("{e}"));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let coloured = start_on_pty(false);
    assert!(coloured.contains("start failed"), "{coloured}");
    assert!(
        coloured.contains('\u{1b}'),
        "no colour on a terminal: {coloured:?}"
    );
    let plain = start_on_pty(true);
    assert!(plain.contains("start failed"), "{plain}");
    assert!(
        !plain.contains('\u{1b}'),
        "colour despite NO_COLOR: {plain:?}"
    );
}

/// The harness's config file, with `extra` appended.
fn rewrite_config(d: &Daemon, original: &str, extra: &str) {
    std::fs::write(d.dir().join("stsd.toml"), format!("{original}\n{extra}"))
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn sighup_applies_a_new_config_and_refuses_a_broken_one_keeping_the_old() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::launch_env(
        dir,
        1,
        "",
        Some(CATALOG),
        &[],
        None,
        &[("STSD_LOG", "info")],
    );
    let original = std::fs::read_to_string(d.dir().join("stsd.toml")).unwrap_or_default();
    let mut c = d.connect();
    c.call(1, "echo-console", json!({"text": "a"}));
    assert_eq!(text(&c.response()), "echo: a");

    // A rule that rejects the tool: in force after SIGHUP.
    rewrite_config(
        &d,
        &original,
        "[[approval.rule]]\ntools = [\"echo-console\"]\nrequire = true\nstrategy = \"reject\"\nreason = \"closed for the night\"\n",
    );
    signal(&d, libc::SIGHUP);
    wait_for("the reload banner", 10, || {
        d.log().contains("reloaded (SIGHUP)")
    });
    c.call(2, "echo-console", json!({"text": "b"}));
    let r = c.response();
    assert!(is_error(&r), "{r}");
    assert!(text(&r).contains("closed for the night"), "{r}");

    // A config that does not parse: refused with a line naming the file, the rule stays.
    rewrite_config(&d, &original, "[approval\nthis is not toml");
    signal(&d, libc::SIGHUP);
    wait_for("the refusal", 10, || d.log().contains("config refused"));
    let log = d.log();
    let refusal = log
        .lines()
        .find(|l| l.contains("config refused"))
        .unwrap_or_default();
    assert!(refusal.contains("ERROR"), "{refusal}");
    assert!(refusal.contains("stsd.toml"), "{refusal}");
    c.call(3, "echo-console", json!({"text": "c"}));
    let r = c.response();
    assert!(text(&r).contains("closed for the night"), "{r}");

    // A config that parses but does not apply (an extra CA file that is missing): refused too.
    rewrite_config(
        &d,
        &original,
        "[egress]\nextra_ca_files = [\"/nonexistent/ca.pem\"]\n",
    );
    signal(&d, libc::SIGHUP);
    wait_for("the second refusal", 10, || {
        d.log().matches("config refused").count() >= 2
    });
    c.call(4, "echo-console", json!({"text": "d"}));
    assert!(text(&c.response()).contains("closed for the night"));
}

#[test]
fn sighup_reopens_the_audit_log_after_a_logrotate_style_rename() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::launch_env(
        dir,
        1,
        "",
        Some(CATALOG),
        &[],
        None,
        &[("STSD_LOG", "info")],
    );
    let mut c = d.connect();
    c.call(1, "echo-console", json!({"text": "before"}));
    assert_eq!(text(&c.response()), "echo: before");
    let rotated = d.dir().join("audit.jsonl.1");
    std::fs::rename(&d.audit, &rotated).unwrap_or_else(|e| panic!("{e}"));
    signal(&d, libc::SIGHUP);
    wait_for("the reload banner", 10, || {
        d.log().contains("reloaded (SIGHUP)")
    });
    c.call(2, "echo-console", json!({"text": "after"}));
    assert_eq!(text(&c.response()), "echo: after");
    let read = |p: &Path| -> Vec<Value> {
        std::fs::read_to_string(p)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let old = read(&rotated);
    let new = read(&d.audit);
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(old[0]["params"]["text"], "before");
    assert_eq!(new.len(), 1, "{new:?}");
    assert_eq!(new[0]["params"]["text"], "after");
}

#[test]
fn a_call_cut_off_at_the_shutdown_grace_period_is_audited() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut d = Daemon::start_in(dir, 1, "shutdown_grace_seconds = 1\n", CATALOG);
    let mut c = d.connect();
    c.call(1, "slow", json!({"ms": 60000}));
    d.wait_until("the slow call runs", 20, |ch| ch.iter().any(|x| x.2));
    let t0 = Instant::now();
    signal(&d, libc::SIGTERM);
    wait_for("the daemon exits", 30, || !d.is_running());
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let recs = d.audit_records();
    let slow: Vec<&Value> = recs.iter().filter(|r| r["name"] == "slow").collect();
    assert_eq!(slow.len(), 1, "{recs:?}");
    assert_eq!(slow[0]["outcome"], "ERROR");
    assert_eq!(slow[0]["error"]["code"], "CANCELLED");
    assert!(
        slow[0]["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("shutdown grace period"),
        "{}",
        slow[0]
    );
    assert_eq!(slow[0]["params"]["ms"], 60000);
    assert!(!d.socket.exists(), "the socket outlived the daemon");
}

#[test]
fn a_call_refused_at_argument_checking_is_audited_with_its_params_masked() {
    let d = Daemon::start(1, "");
    let mut c = d.connect();
    // `count` is an INTEGER; the secret the tool resolves is passed as the wrong type.
    c.call(1, "with-secret", json!({"count": "supersecret-token-123"}));
    let r = c.response();
    assert!(is_error(&r), "{r}");
    assert!(text(&r).starts_with("INVALID_INPUT"), "{r}");
    let recs = d.audit_records();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["name"], "with-secret");
    assert_eq!(recs[0]["error"]["code"], "INVALID_INPUT");
    assert_eq!(recs[0]["params"]["count"], "***");
    let raw = std::fs::read_to_string(&d.audit).unwrap_or_default();
    assert!(!raw.contains("supersecret-token-123"), "{raw}");
    assert!(!text(&r).contains("supersecret-token-123"), "{r}");
}

#[test]
fn a_failed_start_is_audited_and_removes_its_socket() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let audit = dir.path().join("audit.jsonl");
    let socket = dir.path().join("stsd.sock");
    let config = dir.path().join("stsd.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\naudit_log = \"{}\"\ncatalog_dir = \"{}\"\n",
            audit.display(),
            dir.path().join("managed").display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // A preset that no presets file defines: the daemon refuses to start, after its socket
    // is bound (the catalog is published after the bind).
    let out = Command::new(stsd_bin())
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--pool",
            "1",
            "--catalog",
            CATALOG,
            "--preset",
            "no-such-preset",
        ])
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-preset"), "{err}");
    assert!(!socket.exists(), "a failed start left its socket behind");
    let recs: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["event"], "start-failed");
    assert!(
        recs[0]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-preset"),
        "{}",
        recs[0]
    );
}

/// Without --config: $XDG_CONFIG_HOME/stsd/stsd.toml for a user (root reads
/// /etc/stsd/stsd.toml, which a test must not write; `config_file` has that branch).
#[test]
fn without_config_the_users_config_file_is_looked_up() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !stsd_tests::is_root() {
        eprintln!("not root: cannot run as another user; skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755));
    let conf = dir.path().join("xdg/stsd");
    std::fs::create_dir_all(&conf).unwrap_or_else(|e| panic!("{e}"));
    for p in [dir.path().join("xdg"), conf.clone()] {
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
    }
    let check = || {
        Command::new(stsd_bin())
            .args(["check", "--json", CATALOG])
            .env_remove("STSD_CONFIG")
            .env("XDG_CONFIG_HOME", dir.path().join("xdg"))
            .env("HOME", dir.path())
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    // A rule in the looked-up file gates a tool: check shows it.
    std::fs::write(
        conf.join("stsd.toml"),
        "[[approval.rule]]\ntools = [\"slow\"]\nrequire = true\nstrategy = \"reject\"\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::set_permissions(
        conf.join("stsd.toml"),
        std::fs::Permissions::from_mode(0o644),
    );
    let out = check();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let text = v.to_string();
    let slow = v["specs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == "slow")
        .cloned()
        .unwrap_or_default();
    assert_eq!(slow["approval"]["required"], true, "{text}");
    assert_eq!(slow["approval"]["source"], "rule", "{text}");
    // A broken looked-up file is an error naming it, never silently the defaults.
    std::fs::write(conf.join("stsd.toml"), "not = [toml").unwrap_or_else(|e| panic!("{e}"));
    let out = check();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("xdg/stsd/stsd.toml"), "{err}");
}

/// Issue 38 item 2: with no path configured, the daemon's defaults follow the directories
/// systemd gives a service (`LOGS_DIRECTORY`, `STATE_DIRECTORY`, `RUNTIME_DIRECTORY`), which
/// is how `scripts/test` keeps every test off the machine's /var/log/stsd, /var/lib/stsd and
/// /run/stsd. Before, a failed start as root wrote its record to /var/log/stsd/audit.jsonl.
#[test]
fn default_paths_follow_the_directories_systemd_gives() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (logs, state, run) = (
        dir.path().join("log"),
        dir.path().join("state"),
        dir.path().join("run"),
    );
    std::fs::create_dir_all(&run).unwrap_or_else(|e| panic!("{e}"));
    let config = dir.path().join("stsd.toml");
    std::fs::write(&config, "").unwrap_or_else(|e| panic!("{e}"));
    // A preset no presets file defines: the daemon binds, opens its state and audit log,
    // then refuses to start and records why.
    let out = Command::new(stsd_bin())
        .arg("--config")
        .arg(&config)
        .args([
            "--pool",
            "1",
            "--catalog",
            CATALOG,
            "--preset",
            "no-such-preset",
        ])
        .env("LOGS_DIRECTORY", &logs)
        .env("STATE_DIRECTORY", &state)
        .env("RUNTIME_DIRECTORY", &run)
        // The systemd directories are what this test is about: no override of the state dir.
        .env_remove("STSD_STATE_DIR")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let audit = std::fs::read_to_string(logs.join("audit.jsonl")).unwrap_or_default();
    assert!(audit.contains("start-failed"), "{err}\naudit: {audit:?}");
    assert!(state.join("stsd.db").is_file(), "{err}");
    // The socket's default: the client looks where the daemon would listen.
    let status = Command::new(stsd_bin())
        .arg("status")
        .env_remove("STSD_SOCKET")
        .env("RUNTIME_DIRECTORY", &run)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = String::from_utf8_lossy(&status.stderr);
    assert!(
        said.contains(&run.join("stsd.sock").display().to_string()),
        "{said}"
    );
}
