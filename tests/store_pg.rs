//! Issue 33: the shared state store on a real PostgreSQL (Debian's `postgresql`, installed
//! by `.ci/run`): a throwaway cluster made with `initdb` and started with `pg_ctl` in a
//! temporary directory as the unprivileged user `nobody` (no systemd), and three daemons on
//! it.
//! - `stsd tools add` on A: B and C serve the tool without a restart, and B's subscribed
//!   client gets `tools/list_changed`;
//! - a switch (`tools disable`) made on C reaches A and B;
//! - a kill -9 of A inside an update's transaction: B and C keep serving the committed
//!   version, and A restarted serves it too, its history whole.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use stsd_tests::harness::{free_port, saw_list_changed, subscriber, text, Daemon, CATALOG};
use stsd_tests::{is_root, stsd_bin};

/// A PostgreSQL cluster of the test's own, stopped (immediately) when dropped.
struct Cluster {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// A `[gateway] secrets_dir` holding the password (`pg-password`).
    secrets: PathBuf,
    /// `pg_ctl start`'s arguments after `-D DATA`.
    start_args: Vec<String>,
    _dir: tempfile::TempDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("openssl: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ca.crt` (the test's CA) and the server's pair for 127.0.0.1 in `dir`; the cluster at
/// `data` serves TLS with them and refuses TCP connections without it.
fn serve_tls_only(dir: &Path, data: &Path) {
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-subj",
            "/CN=stsd test CA",
            "-days",
            "2",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ],
    );
    for f in ["server.crt", "server.key", "ca.crt"] {
        let out = Command::new("chown")
            .arg("nobody")
            .arg(dir.join(f))
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success());
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(dir.join("ca.crt"), std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    let conf = data.join("postgresql.conf");
    let mut text = std::fs::read_to_string(&conf).unwrap_or_else(|e| panic!("{e}"));
    text.push_str(&format!(
        "ssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
        dir.join("server.crt").display(),
        dir.join("server.key").display()
    ));
    std::fs::write(&conf, text).unwrap_or_else(|e| panic!("{e}"));
    let hba = data.join("pg_hba.conf");
    let text = std::fs::read_to_string(&hba).unwrap_or_else(|e| panic!("{e}"));
    let text: String = text
        .lines()
        .map(|l| match l.strip_prefix("host ") {
            Some(rest) => format!("hostssl {rest}\n"),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&hba, text).unwrap_or_else(|e| panic!("{e}"));
}

fn pg_bin() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|b| b.join("initdb").is_file())
        .collect();
    found.sort();
    found.pop()
}

fn as_nobody(bin: &Path, tool: &str, args: &[&str]) -> Output {
    Command::new("runuser")
        .args(["-u", "nobody", "--"])
        .arg(bin.join(tool))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

impl Cluster {
    fn start() -> Cluster {
        Cluster::start_with(false)
    }

    /// With `tls`: a CA and a server certificate for 127.0.0.1 made by the openssl CLI, the
    /// server's `ssl = on`, and TCP connections accepted only over TLS (`hostssl`).
    fn start_with(tls: bool) -> Cluster {
        let bin = pg_bin().unwrap_or_else(|| {
            panic!(
                "no PostgreSQL server binaries under /usr/lib/postgresql (.ci/run installs them)"
            )
        });
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .unwrap_or_else(|e| panic!("{e}"));
        let data = dir.path().join("data");
        // Password authentication, the password a secret the daemons resolve from
        // `[gateway] secrets_dir` (`[store] password = "${secret:pg-password}"`).
        let secrets = dir.path().join("secrets");
        std::fs::create_dir(&secrets).unwrap_or_else(|e| panic!("{e}"));
        let pwfile = secrets.join("pg-password");
        std::fs::write(&pwfile, "s3cret-of-the-test\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&pwfile, std::fs::Permissions::from_mode(0o644))
            .unwrap_or_else(|e| panic!("{e}"));
        let out = as_nobody(
            &bin,
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "--auth=scram-sha-256",
                &format!("--pwfile={}", pwfile.display()),
                "-U",
                "stsd",
                "-E",
                "UTF8",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if tls {
            serve_tls_only(dir.path(), &data);
        }
        let port = free_port();
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            dir.path().display()
        );
        let log = dir.path().join("pg.log").display().to_string();
        let c = Cluster {
            bin,
            data,
            port,
            secrets,
            start_args: vec![
                "-o".into(),
                opts,
                "-l".into(),
                log,
                "-w".into(),
                "start".into(),
            ],
            _dir: dir,
        };
        c.up();
        c
    }

    fn up(&self) {
        let mut args = vec!["-D".to_string(), self.data.display().to_string()];
        args.extend(self.start_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = as_nobody(&self.bin, "pg_ctl", &args);
        assert!(
            out.status.success(),
            "pg_ctl start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops the server at once, as a crash would (no checkpoint; recovery at the next start).
    fn crash(&self) {
        let out = as_nobody(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "stop",
            ],
        );
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn url(&self) -> String {
        format!("postgresql://stsd@127.0.0.1:{}/postgres", self.port)
    }

    /// The config that reaches it: its URL, the password by reference. `[store]` last, so
    /// a caller may add keys of it.
    fn store_toml(&self) -> String {
        format!(
            "[gateway]\nsecrets_dir = \"{}\"\n\
             [store]\nurl = \"{}\"\npassword = \"${{secret:pg-password}}\"\n",
            self.secrets.display(),
            self.url()
        )
    }
}

/// A fresh cluster, or None (said) where the test cannot start one: it needs root to run
/// PostgreSQL as `nobody`.
fn cluster() -> Option<Cluster> {
    if !is_root() {
        eprintln!("skipped: needs root (runuser) to start PostgreSQL as nobody");
        return None;
    }
    Some(Cluster::start())
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_nobody(
            &self.bin,
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "stop",
            ],
        );
    }
}

fn spec(version: &str) -> Value {
    json!({"name": "shared", "description": "a tool every replica serves", "codeType": "Javascript",
           "params": [], "code": format!("return '{version}';"),
           "testCases": [{"name": "runs", "arguments": {}, "expected": version}]})
}

fn tools_cli(d: &Daemon, args: &[&str], doc: Option<&Value>) -> Output {
    let mut cmd = Command::new(stsd_bin());
    cmd.arg("tools").args(args).arg("--socket").arg(&d.socket);
    if let Some(doc) = doc {
        let p = d.dir().join("submitted.json");
        std::fs::write(&p, doc.to_string()).unwrap_or_else(|e| panic!("{e}"));
        cmd.arg(&p);
    }
    cmd.output().unwrap_or_else(|e| panic!("{e}"))
}

/// What `shared` answers on `d` (or the error).
fn answer(d: &Daemon) -> String {
    let mut c = d.connect();
    c.call(1, "shared", json!({}));
    let r = c.response();
    match r.get("error") {
        Some(e) => format!("error: {}", e["message"]),
        None => text(&r),
    }
}

/// Waits (with a deadline) until `d` answers `want`; how long it took.
fn until_answers(d: &Daemon, want: &str) -> Duration {
    let t0 = Instant::now();
    loop {
        let got = answer(d);
        if got == want {
            return t0.elapsed();
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let log = d.log();
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains("rmcp") && !l.contains("banner"))
                .rev()
                .take(40)
                .collect();
            panic!(
                "still {got:?}, want {want:?}; its log ends:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn three_replicas_on_one_postgresql_share_the_catalog_and_survive_a_kill() {
    let Some(pg) = cluster() else {
        return;
    };
    let config = format!("require_local_pass = true\n{}", pg.store_toml());
    let replica = || {
        Daemon::start_in(
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            1,
            &config,
            CATALOG,
        )
    };
    let (a, b, c) = (replica(), replica(), replica());
    let mut sub = subscriber(&b);
    std::thread::sleep(Duration::from_millis(100));

    let out = tools_cli(&a, &["add"], Some(&spec("v1")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(answer(&a), "v1");
    let on_b = until_answers(&b, "v1");
    let on_c = until_answers(&c, "v1");
    eprintln!("tools add on A served by B after {on_b:?}, by C after {on_c:?}");
    assert!(saw_list_changed(&mut sub), "B's client was not told");

    // A switch made on C reaches the others.
    assert!(tools_cli(&c, &["disable", "shared"], None).status.success());
    for d in [&a, &b] {
        let t0 = Instant::now();
        while !answer(d).starts_with("TOOL_WITHHELD") {
            assert!(t0.elapsed() < Duration::from_secs(20), "{}", answer(d));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(tools_cli(&a, &["enable", "shared"], None).status.success());
    until_answers(&b, "v1");
    until_answers(&c, "v1");

    // A killed inside an update's transaction: nothing of it is committed anywhere.
    let dir = a.kill9();
    let mut a = Daemon::launch_env(
        dir,
        1,
        &config,
        Some(CATALOG),
        &[],
        None,
        &[("STSD_TEST_CRASH_AT", "store-install")],
    );
    let out = tools_cli(&a, &["update", "shared"], Some(&spec("v2")));
    assert!(!out.status.success(), "the daemon did not die");
    let t0 = Instant::now();
    while a.is_running() {
        assert!(t0.elapsed() < Duration::from_secs(20), "still running");
        std::thread::sleep(Duration::from_millis(20));
    }
    let a = Daemon::start_in(a.kill9(), 1, &config, CATALOG);
    for d in [&a, &b, &c] {
        assert_eq!(answer(d), "v1");
    }
    // The history is whole: an update on B, a rollback on C, seen by all.
    assert!(tools_cli(&b, &["update", "shared"], Some(&spec("v3")))
        .status
        .success());
    for d in [&a, &b, &c] {
        until_answers(d, "v3");
    }
    assert!(tools_cli(&c, &["rollback", "shared"], None)
        .status
        .success());
    for d in [&a, &b, &c] {
        until_answers(d, "v1");
    }

    // PostgreSQL crashes: every replica says its store is down (readiness and the metric),
    // keeps serving the tools it has, and refuses changes; back, the changes flow again.
    pg.crash();
    for d in [&a, &b, &c] {
        let t0 = Instant::now();
        while store_up(d) {
            assert!(t0.elapsed() < Duration::from_secs(20), "still up");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(answer(d), "v1", "a published tool while the store is down");
    }
    let out = tools_cli(&a, &["update", "shared"], Some(&spec("v4")));
    assert!(!out.status.success(), "an update with the store down");
    // A reload while the store is down (SIGHUP) keeps the catalog in force: before, the
    // managed tools read as none and were withdrawn.
    // SAFETY: kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(a.pid(), libc::SIGHUP) }, 0);
    let t0 = Instant::now();
    while !a.log().contains("SIGHUP: config refused") && !a.log().contains("reloaded (SIGHUP)") {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the SIGHUP was not handled"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        a.log().contains("the managed catalog cannot be read"),
        "the reload did not say why it was refused"
    );
    assert_eq!(answer(&a), "v1", "after a SIGHUP with the store down");
    pg.up();
    for d in [&a, &b, &c] {
        let t0 = Instant::now();
        while !store_up(d) {
            assert!(t0.elapsed() < Duration::from_secs(20), "still down");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let out = tools_cli(&a, &["update", "shared"], Some(&spec("v5")));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for d in [&a, &b, &c] {
        until_answers(d, "v5");
    }
}

/// `stsd metrics`: whether the daemon's state store answers.
fn store_up(d: &Daemon) -> bool {
    let out = Command::new(stsd_bin())
        .args(["metrics", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["storeUp"]
        .as_bool()
        .unwrap_or_else(|| panic!("no storeUp in {v}"))
}

/// Two daemons' approval books on one store, the same sealed state presented to both at the
/// same moment, 50 times: exactly one redemption is accepted each time (before: each process
/// kept its own spent list, so both were). On PostgreSQL, and on one SQLite file shared by
/// two connections.
#[test]
fn one_approval_state_is_spent_once_whichever_replica_sees_it() {
    use std::collections::HashMap;
    use std::sync::Arc;
    use stsd::approval::mcp::{StateBook, StateOwner, INPUT_KEY};
    use stsd::approval::Elicited;
    let Some(pg) = cluster() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut config = stsd_profiles::Config::default();
    config.store.url = Some(pg.url());
    config.store.password_file = Some(pg.secrets.join("pg-password"));
    let file = dir.path().join("stsd.db");
    let open = |shared: bool| -> Arc<stsd::state::Store> {
        Arc::new(
            if shared {
                stsd::state::Store::of_config(&config)
            } else {
                stsd::state::Store::open(&file)
            }
            .unwrap_or_else(|e| panic!("{e}")),
        )
    };
    for shared in [true, false] {
        let key = b"0123456789abcdef0123456789abcdef".to_vec();
        let ttl = Duration::from_secs(60);
        let book = |store| {
            Arc::new(
                StateBook::with_key(key.clone(), ttl)
                    .unwrap_or_else(|e| panic!("{e}"))
                    .with_store(Some(store)),
            )
        };
        let (a, b) = (book(open(shared)), book(open(shared)));
        let who = StateOwner::uid(Some(0));
        let args: serde_json::Map<String, Value> = serde_json::Map::new();
        let yes: HashMap<String, Value> =
            [(INPUT_KEY.to_string(), json!({"action": "accept"}))].into();
        for round in 0..50 {
            let state = a
                .input_required(&who, "deleteFile", &args, "ok?".into())
                .unwrap_or_else(|e| panic!("{e}"))
                .request_state
                .unwrap_or_default();
            let go = Arc::new(std::sync::Barrier::new(2));
            let runs: Vec<_> = [a.clone(), b.clone()]
                .into_iter()
                .map(|book| {
                    let (go, who, args, yes, state) = (
                        go.clone(),
                        who.clone(),
                        args.clone(),
                        yes.clone(),
                        state.clone(),
                    );
                    std::thread::spawn(move || {
                        go.wait();
                        book.redeem(&who, "deleteFile", &args, &state, Some(&yes))
                    })
                })
                .collect();
            let answers: Vec<Elicited> = runs
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| panic!("a redeem panicked")))
                .collect();
            let accepted = answers.iter().filter(|e| **e == Elicited::Accepted).count();
            assert_eq!(accepted, 1, "round {round} (shared: {shared}): {answers:?}");
        }
    }
}

/// `stsd store export` from a daemon's embedded store and `stsd store import` into a new
/// PostgreSQL: a daemon on the new store serves the same tools and switches, with the
/// history (a rollback works); a second import into a store that holds state is refused.
#[test]
fn a_store_moves_from_sqlite_to_postgresql_through_export_and_import() {
    let Some(pg) = cluster() else {
        return;
    };
    let gate = "require_local_pass = true\n";
    let d = Daemon::start_in(
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
        1,
        gate,
        CATALOG,
    );
    assert!(tools_cli(&d, &["add"], Some(&spec("v1"))).status.success());
    assert!(tools_cli(&d, &["update", "shared"], Some(&spec("v2")))
        .status
        .success());
    let mut other = spec("o1");
    other["name"] = json!("other");
    assert!(tools_cli(&d, &["add"], Some(&other)).status.success());
    assert!(tools_cli(&d, &["disable", "other"], None).status.success());
    assert_eq!(answer(&d), "v2");
    let dir = d.kill9();
    let cli = |args: &[&str], config: &Path| {
        Command::new(stsd_bin())
            .args(["store"])
            .args(args)
            .arg("--config")
            .arg(config)
            .env("STSD_STATE_DIR", dir.path().join("state"))
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let dump = dir.path().join("state.json");
    let out = cli(
        &["export", "--out", &dump.display().to_string()],
        &dir.path().join("stsd.toml"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&std::fs::read(&dump).unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["format"], "stsd-state/1");
    assert_eq!(doc["disabled"], json!(["other"]));
    let pg_config = dir.path().join("pg.toml");
    std::fs::write(&pg_config, pg.store_toml()).unwrap_or_else(|e| panic!("{e}"));
    let out = cli(&["import", &dump.display().to_string()], &pg_config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2 tools, 1 earlier versions, 1 switches"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["import", &dump.display().to_string()], &pg_config);
    assert!(!out.status.success(), "a second import was taken");
    assert!(String::from_utf8_lossy(&out.stderr).contains("holds state already"));

    let config = format!("{gate}{}", pg.store_toml());
    let moved = Daemon::start_in(
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
        1,
        &config,
        CATALOG,
    );
    assert_eq!(answer(&moved), "v2");
    let mut c = moved.connect();
    c.call(2, "other", json!({}));
    let r = text(&c.response());
    assert!(
        r.starts_with("TOOL_WITHHELD: other is not served: disabled"),
        "{r}"
    );
    assert!(tools_cli(&moved, &["rollback", "shared"], None)
        .status
        .success());
    assert_eq!(answer(&moved), "v1");
}

/// A catalog of one tool every call of which waits for an operator, and a config for it on
/// the shared store.
fn operator_setup(pg: &Cluster, dir: &Path) -> (String, String) {
    let specs = json!([{"name": "guarded", "description": "needs an operator",
        "codeType": "Javascript", "draft": false,
        "params": [{"name": "note", "type": "STRING", "required": true, "description": "",
                    "testValue": "x"}],
        "code": "return 'ran ' + note;"}]);
    let cat = dir.join("guarded.json");
    std::fs::write(&cat, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let config = format!(
        "{}replica_timeout_seconds = 2\n\
         [approval]\ntimeout_seconds = 60\noperator_uids = [{uid}]\n\
         [[approval.rule]]\ntools = [\"guarded\"]\nrequire = true\nstrategy = \"operator\"\n",
        pg.store_toml()
    );
    (config, cat.display().to_string())
}

/// An operator's decision reaches the replica holding the call, whichever replica it was
/// made on: `stsd approvals` on any replica lists every replica's waiting calls (by a ticket
/// unique across them); `stsd approve` on C releases a call waiting on B, `stsd deny` on A
/// reaches it with its reason. A replica killed with a call waiting: another records it as
/// expired once the dead one misses its heartbeats, and no replica lists it any more.
/// Before: each replica knew only its own queue ("no call N is waiting for approval").
#[test]
fn an_operator_decision_on_any_replica_reaches_the_call_waiting_on_another() {
    let Some(pg) = cluster() else {
        return;
    };
    let cat_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let (config, cat) = operator_setup(&pg, cat_dir.path());
    let replica = || {
        Daemon::start_in(
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            1,
            &config,
            &cat,
        )
    };
    let (a, b, c) = (replica(), replica(), replica());

    // Approved on C.
    let mut caller = b.connect();
    caller.call(1, "guarded", json!({"note": "one"}));
    let p = c.pending();
    assert_eq!(p["tool"], "guarded", "{p}");
    assert_eq!(a.pending()["id"], p["id"], "A lists B's call too");
    let ticket = p["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("{p}"))
        .to_string();
    let t0 = Instant::now();
    let out = c.cli(&["approve", &ticket]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text(&caller.response()), "ran one");
    eprintln!(
        "stsd approve on C to the call's reply from B: {:?}",
        t0.elapsed()
    );
    // Answered: the same ticket again is refused, on any replica.
    assert!(!a.cli(&["approve", &ticket]).status.success());

    // Denied on A, with its reason.
    caller.call(2, "guarded", json!({"note": "two"}));
    let ticket = a.pending()["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id"))
        .to_string();
    assert!(a
        .cli(&["deny", &ticket, "--reason", "not during the freeze"])
        .status
        .success());
    assert_eq!(
        text(&caller.response()),
        "APPROVAL_REJECTED: not during the freeze"
    );
    let recs = b.audit_records();
    let rec = |n: &str| {
        recs.iter()
            .find(|r| r["params"]["note"] == n)
            .unwrap_or_else(|| panic!("no record of {n}: {recs:?}"))
            .clone()
    };
    assert_eq!(rec("one")["outcome"], "OK");
    assert!(rec("one")["approval"]["approver"]
        .as_str()
        .unwrap_or_default()
        .starts_with("operator uid"));
    assert_eq!(rec("two")["error"]["code"], "APPROVAL_REJECTED");

    // B killed with a call waiting: A or C records it as expired, and it is listed nowhere.
    caller.call(3, "guarded", json!({"note": "three"}));
    let p = a.pending();
    let call_id = p["callId"].clone();
    drop(b.kill9());
    drop(caller);
    let t0 = Instant::now();
    let expired = loop {
        let found = [&a, &c].into_iter().find_map(|d| {
            d.audit_records()
                .into_iter()
                .find(|r| r["callId"] == call_id && r["approval"]["decision"] == "expired")
        });
        if let Some(r) = found {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "B's waiting call was not recorded"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(expired["error"]["code"], "APPROVAL_TIMEOUT", "{expired}");
    assert_eq!(expired["name"], "guarded");
    let listed: Value =
        serde_json::from_slice(&c.cli(&["approvals", "--json"]).stdout).unwrap_or(Value::Null);
    assert_eq!(listed["pending"], json!([]), "{listed}");
}

/// PostgreSQL crashes (an immediate stop, as a kill -9 of the server would leave it) inside
/// a `tools update`'s transaction, after every row of it is written and before the commit:
/// the update fails, and once the server is back every replica serves the version committed
/// before, and the history is whole (a later update and a rollback land on it).
#[test]
fn a_postgresql_crash_inside_an_update_leaves_the_committed_version_everywhere() {
    let Some(pg) = cluster() else {
        return;
    };
    let config = format!("require_local_pass = true\n{}", pg.store_toml());
    let a_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let pause = a_dir.path().join("paused");
    let a = Daemon::launch_env(
        a_dir,
        1,
        &config,
        Some(CATALOG),
        &[],
        None,
        &[
            ("STSD_TEST_PAUSE_AT", "store-install-written"),
            ("STSD_TEST_PAUSE_FILE", &pause.display().to_string()),
        ],
    );
    let b = Daemon::start_in(
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
        1,
        &config,
        CATALOG,
    );
    let out = tools_cli(&b, &["add"], Some(&spec("v1")));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        b.log()
    );
    until_answers(&a, "v1");

    let update = std::thread::scope(|s| {
        let t = s.spawn(|| tools_cli(&a, &["update", "shared"], Some(&spec("v2"))));
        let t0 = Instant::now();
        while !pause.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "the update never reached its transaction's end"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // The pool: with one connection held inside the paused transaction, the daemon's
        // other store work still runs (`stsd approvals` reads the store's waiting calls).
        let t0 = Instant::now();
        let listed = a.cli(&["approvals", "--json"]);
        assert!(
            listed.status.success(),
            "{}",
            String::from_utf8_lossy(&listed.stderr)
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a store read waited {:?} behind a transaction in progress",
            t0.elapsed()
        );
        pg.crash();
        std::fs::remove_file(&pause).unwrap_or_else(|e| panic!("{e}"));
        t.join()
            .unwrap_or_else(|_| panic!("the update thread panicked"))
    });
    assert!(!update.status.success(), "an update whose commit was lost");
    pg.up();
    for d in [&a, &b] {
        let t0 = Instant::now();
        while !store_up(d) {
            assert!(t0.elapsed() < Duration::from_secs(20), "still down");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(answer(d), "v1");
    }
    // Restarted, A reads the store afresh: still the committed version.
    let a = Daemon::start_in(a.kill9(), 1, &config, CATALOG);
    assert_eq!(answer(&a), "v1");
    assert!(tools_cli(&b, &["update", "shared"], Some(&spec("v3")))
        .status
        .success());
    until_answers(&a, "v3");
    // The history, as the store holds it: v1 retired by v3, nothing of the lost v2.
    let out = Command::new(stsd_bin())
        .args(["store", "export", "--config"])
        .arg(a.dir().join("stsd.toml"))
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    let history: Vec<&str> = doc["history"]
        .as_array()
        .map(|h| h.iter().filter_map(|e| e["doc"]["code"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(history, vec!["return 'v1';"], "{doc}");
    assert!(
        !doc.to_string().contains("v2"),
        "the lost update is in the store: {doc}"
    );
    assert!(tools_cli(&a, &["rollback", "shared"], None)
        .status
        .success());
    for d in [&a, &b] {
        until_answers(d, "v1");
    }
}

/// The HTTP status of an MCP request to `port` with bearer `token`.
fn http_status(port: u16, token: &str) -> u16 {
    use std::io::{Read, Write};
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap_or_else(|e| panic!("{e}"));
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8_lossy(&head[9..12])
        .parse()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Bearer tokens live in the shared store: `stsd token add` (no file) puts a digest there,
/// and every replica accepts the token at once; `stsd token rm` and every replica refuses it
/// within seconds; the store's export carries the digests, never a token. Before, tokens were
/// a file per replica (a token added for one was unknown to the others).
#[test]
fn a_token_added_to_the_shared_store_is_accepted_by_every_replica_and_removed_from_all() {
    let Some(pg) = cluster() else {
        return;
    };
    let cfg_dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cfg = cfg_dir.path().join("stsd.toml");
    std::fs::write(&cfg, pg.store_toml()).unwrap_or_else(|e| panic!("{e}"));
    let token = |args: &[&str]| {
        let out = Command::new(stsd_bin())
            .arg("token")
            .args(args)
            .arg("--config")
            .arg(&cfg)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let alice = token(&["add", "alice"]);
    let (pa, pb) = (free_port(), free_port());
    let replica = |port: u16| {
        let config = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n{}", pg.store_toml());
        Daemon::start_in(
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            1,
            &config,
            CATALOG,
        )
    };
    let (_a, _b) = (replica(pa), replica(pb));
    // Waits (with a deadline) until `port` accepts `t` (or refuses it, `accepted` false).
    let until = |port: u16, t: &str, accepted: bool| {
        let t0 = Instant::now();
        loop {
            let got = http_status(port, t);
            if (got != 401) == accepted {
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{port}: still {got}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for p in [pa, pb] {
        assert_ne!(http_status(p, &alice), 401, "alice on {p}");
        assert_eq!(http_status(p, "stsd_not-a-token"), 401);
    }
    // Added while they run: accepted within a second (the store's notification, or a miss
    // reading the store again).
    let bob = token(&["add", "bob"]);
    for p in [pa, pb] {
        let took = until(p, &bob, true);
        eprintln!("bob's token accepted on {p} after {took:?}");
    }
    let listed: Value = serde_json::from_str(&token(&["list", "--json"])).unwrap_or_default();
    assert_eq!(listed["principals"], json!({"alice": 1, "bob": 1}));
    // Removed: refused everywhere within seconds; bob's still works.
    token(&["rm", "alice"]);
    for p in [pa, pb] {
        until(p, &alice, false);
        assert_ne!(http_status(p, &bob), 401);
    }
    let out = Command::new(stsd_bin())
        .args(["store", "export", "--config"])
        .arg(&cfg)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let doc = String::from_utf8_lossy(&out.stdout);
    assert!(
        doc.contains("\"bob\"") && !doc.contains(&bob) && !doc.contains(&bob[5..]),
        "{doc}"
    );
}

/// The store's conformance suite (`supervisor/src/state/suite.rs`, which the unit tests run
/// on SQLite) on a fresh PostgreSQL: both backends pass the same checks.
#[test]
fn the_conformance_suite_passes_on_postgresql() {
    let Some(pg) = cluster() else {
        return;
    };
    let mut config = stsd_profiles::Config::default();
    config.store.url = Some(pg.url());
    config.store.password_file = Some(pg.secrets.join("pg-password"));
    let store = stsd::state::Store::of_config(&config).unwrap_or_else(|e| panic!("{e}"));
    stsd::state::suite::run(&store);
}

/// The hostile fixture server and the venv that runs it (`scripts/setup-test-deps`), copied
/// where an upstream's own uid can read it; None (said) when the venv is missing.
fn fixture_upstream(dir: &Path, id: &str) -> Option<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The venv's own python (a link to the base interpreter: resolving it would leave the
    // venv and its packages behind), in the venv's real directory.
    let venv = std::fs::canonicalize(root.join("target/upstream-venv")).ok();
    let Some(python) = venv.map(|v| v.join("bin/python")) else {
        eprintln!("skipped: target/upstream-venv is missing (scripts/setup-test-deps)");
        return None;
    };
    use std::os::unix::fs::PermissionsExt;
    let src = root.join("tests/upstreams/hostile_server.py");
    let dst = dir.join("hostile_server.py");
    std::fs::copy(&src, &dst).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644))
        .unwrap_or_else(|e| panic!("{e}"));
    Some(format!(
        "id = \"{id}\"\ncommand = \"{}\"\nargs = [\"{}\", \"plain\"]\n",
        python.display(),
        dst.display()
    ))
}

/// The wrapped tools `d` serves, by name.
fn served_tools(d: &Daemon) -> Vec<String> {
    let out = d.cli(&["tools", "list", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    v["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["state"] == "ACTIVE")
        .filter_map(|t| t["name"].as_str().map(String::from))
        .collect()
}

fn until_served(d: &Daemon, name: &str, want: bool) {
    let t0 = Instant::now();
    while served_tools(d).iter().any(|n| n == name) != want {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{name} served: want {want}; log:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 36 item 2 on replicas: an upstream added through A is run by B too (its own
/// process, confined there), and removed through B it leaves A.
#[test]
fn an_upstream_added_on_one_replica_runs_on_every_replica() {
    let Some(pg) = cluster() else {
        return;
    };
    let fixtures = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let Some(entry) = fixture_upstream(fixtures.path(), "pgup") else {
        return;
    };
    let config = pg
        .store_toml()
        .replacen("[gateway]\n", "[gateway]\ndrain_seconds = 1\n", 1);
    let replica = || {
        Daemon::start_in(
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            1,
            &config,
            CATALOG,
        )
    };
    let (a, b) = (replica(), replica());
    let mut sub = subscriber(&b);
    std::thread::sleep(Duration::from_millis(100));
    let file = a.dir().join("pgup.toml");
    std::fs::write(&file, &entry).unwrap_or_else(|e| panic!("{e}"));
    let out = a.cli(&["upstream", "add", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_served(&a, "pgup__echo", true);
    until_served(&b, "pgup__echo", true);
    assert!(saw_list_changed(&mut sub), "B's client was not told");
    let mut c = b.connect();
    c.call(1, "pgup__echo", json!({"text": "through B"}));
    assert_eq!(text(&c.response()), "through B");

    let out = b.cli(&["upstream", "remove", "pgup"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_served(&b, "pgup__echo", false);
    until_served(&a, "pgup__echo", false);
}

/// `stsd store export` with `config`: it opens the store (connects, migrates) and reads it.
fn export_with(dir: &Path, config: &str) -> Output {
    let cfg = dir.join("export.toml");
    std::fs::write(&cfg, config).unwrap_or_else(|e| panic!("{e}"));
    Command::new(stsd_bin())
        .args(["store", "export", "--config"])
        .arg(&cfg)
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A managed PostgreSQL asks for TLS: stsd reaches the store over TLS with the server's
/// certificate verified against `[store] ca_file`; the Mozilla roots do not verify the
/// test's CA (refused), and a plain connection is refused by the server.
#[test]
fn the_store_is_reached_over_verified_tls() {
    if !is_root() {
        eprintln!("skipped: needs root (runuser) to start PostgreSQL as nobody");
        return;
    }
    let pg = Cluster::start_with(true);
    let dir = pg.data.parent().unwrap_or_else(|| panic!("no parent"));
    let ca = dir.join("ca.crt");
    let with = |mode: &str, ca_line: &str| {
        pg.store_toml()
            .replace(&pg.url(), &format!("{}?sslmode={mode}", pg.url()))
            + ca_line
    };
    let scratch = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ca_line = format!("ca_file = \"{}\"\n", ca.display());
    // With a CA to verify against, TLS is required: `prefer` (which falls back to plain
    // text when a man in the middle says the server has none) is refused.
    let out = export_with(scratch.path(), &with("prefer", &ca_line));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("falls back"), "{err}");
    for mode in ["require", "verify-full"] {
        let out = export_with(scratch.path(), &with(mode, &ca_line));
        assert!(
            out.status.success(),
            "sslmode={mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = export_with(scratch.path(), &with("require", ""));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("certificate"),
        "{err}"
    );
    let out = export_with(scratch.path(), &with("disable", ""));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no encryption"),
        "{err}"
    );

    // A daemon on it: a tool added is served, and the server says its sessions are TLS.
    let d = Daemon::start_in(
        tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
        1,
        &with("require", &ca_line),
        CATALOG,
    );
    assert!(tools_cli(&d, &["add"], Some(&spec("tls"))).status.success());
    assert_eq!(answer(&d), "tls");
    let out = Command::new("runuser")
        .args(["-u", "nobody", "--", "env", "PGPASSWORD=s3cret-of-the-test"])
        .arg(pg.bin.join("psql"))
        .args(["-h", &dir.display().to_string(), "-p", &pg.port.to_string()])
        .args(["-U", "stsd", "-d", "postgres", "-Atc"])
        .arg(
            "SELECT bool_and(s.ssl) || ' ' || count(*) FROM pg_stat_ssl s \
              JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'stsd'",
        )
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = String::from_utf8_lossy(&out.stdout);
    let (all_tls, n) = said.trim().split_once(' ').unwrap_or(("", "0"));
    assert!(
        all_tls == "true" && n.parse::<u32>().unwrap_or(0) >= 2,
        "pg_stat_ssl: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
