//! The daemon under faults: a worker killed mid-call, 500 concurrent calls against a pool of 4,
//! a client that disconnects mid-call, kill -9 of the daemon and a restart, a refused uid, a
//! full queue, a graceful stop, a catalog reload. Spoken over the socket as raw JSON-RPC
//! (MCP 2026-07-28: stateless requests with `_meta`).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, meta, text, Conn, Daemon, CATALOG};
use stsd_tests::is_root;

#[test]
fn a_worker_killed_mid_call_fails_only_that_call_and_is_replaced() {
    let d = Daemon::start(2, "");
    // No wait for a full pool first: pool workers are made as background work (SCHED_IDLE),
    // which CPU-bound neighbours (stress-ng on every CPU) may hold back for many seconds.
    // The call takes one, or has one made at once.
    let mut c = d.connect();
    c.call(1, "slow", json!({"ms": 5000}));
    let mut busy = 0;
    d.wait_until("a busy worker", 60, |c| {
        busy = c.iter().find(|x| x.2).map(|x| x.0).unwrap_or(0);
        busy != 0
    });
    // SAFETY: kill with a pid read from /proc and a valid signal.
    unsafe { libc::kill(busy, libc::SIGKILL) };
    let r = c.response();
    assert!(
        is_error(&r) && text(&r).starts_with("WORKER_CRASHED"),
        "{r}"
    );
    c.call(2, "slow", json!({"ms": 1}));
    let r = c.response();
    assert!(!is_error(&r) && text(&r) == "slept 1", "{r}");
    // Refilled, as background work: given a minute for a loaded machine.
    d.wait_until("pool full again", 60, |c| {
        c.iter().filter(|x| !x.2 && x.1 != 'Z').count() == 2
    });
}

#[test]
fn five_hundred_concurrent_calls_against_a_pool_of_4_are_all_answered() {
    let d = Daemon::start(4, "");
    let t0 = Instant::now();
    let handles: Vec<_> = (0..10)
        .map(|k| {
            let mut c = d.connect();
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    c.call(i, "echo-console", json!({"text": format!("{k}-{i}")}));
                }
                let mut seen = HashMap::new();
                for _ in 0..50 {
                    let r = c.response();
                    seen.insert(r["id"].as_u64().unwrap_or(u64::MAX), text(&r));
                }
                (k, seen)
            })
        })
        .collect();
    let mut answered = 0;
    for h in handles {
        let (k, seen) = h
            .join()
            .unwrap_or_else(|_| panic!("client thread panicked"));
        for i in 0..50u64 {
            assert_eq!(
                seen.get(&i).map(String::as_str),
                Some(format!("echo: {k}-{i}").as_str())
            );
            answered += 1;
        }
    }
    assert_eq!(answered, 500);
    eprintln!("500 calls, pool 4: {:?}", t0.elapsed());
    // Nothing left behind: no zombie, only the warm pool.
    // The refill is background work (SCHED_IDLE): a minute for a loaded machine.
    d.wait_until("no zombies, pool refilled", 60, |c| {
        c.iter().all(|x| x.1 != 'Z') && c.iter().filter(|x| !x.2).count() == 4
    });
    let recs = d.audit_records();
    assert_eq!(recs.iter().filter(|r| r["outcome"] == "OK").count(), 500);
}

#[test]
fn a_client_that_disconnects_mid_call_has_its_worker_killed() {
    let d = Daemon::start(2, "");
    {
        let mut c = d.connect();
        c.call(1, "slow", json!({"ms": 20000}));
        d.wait_until("a busy worker", 60, |c| c.iter().any(|x| x.2));
    } // the connection drops here
      // Under the call's own 20 s, so that only a kill ends it in time (15 s: the reaper is
      // background work, slow on a loaded machine).
    d.wait_until("busy worker gone", 15, |c| {
        !c.iter().any(|x| x.2) && c.iter().all(|x| x.1 != 'Z')
    });
    let t0 = Instant::now();
    while d.audit_records().is_empty() && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let recs = d.audit_records();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0]["error"]["code"], "CANCELLED", "{}", recs[0]);
}

#[test]
fn kill_9_of_the_daemon_then_a_restart_reclaims_the_socket_and_keeps_the_audit_parseable() {
    let d = Daemon::start(2, "");
    let mut c = d.connect();
    for i in 0..3 {
        c.call(i, "echo-console", json!({"text": "a"}));
        let _ = c.response();
    }
    c.call(9, "slow", json!({"ms": 20000}));
    d.wait_until("a busy worker", 60, |c| c.iter().any(|x| x.2));
    let workers: Vec<i32> = d.children().iter().map(|x| x.0).collect();
    let dir = d.kill9();
    // Its workers die with it (parent-death signal).
    let t0 = Instant::now();
    while workers
        .iter()
        .any(|p| Path::new(&format!("/proc/{p}")).exists())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "orphaned workers {workers:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Simulate the worst case, a record cut off mid-write.
    let audit = dir.path().join("audit.jsonl");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&audit)
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = f.write_all(b"{\"ts\":1,\"callId\":99,\"name\":\"torn");
    drop(f);
    assert!(
        dir.path().join("stsd.sock").exists(),
        "the stale socket is still there"
    );
    let d = Daemon::start_in(dir, 2, "", CATALOG);
    let mut c = d.connect();
    c.call(1, "echo-console", json!({"text": "after"}));
    assert_eq!(text(&c.response()), "echo: after");
    let recs = d.audit_records(); // panics on any line that does not parse
    assert_eq!(recs.len(), 4);
}

#[test]
fn a_uid_not_on_the_allow_list_is_refused() {
    if !is_root() {
        eprintln!("skipped: needs root to connect as another uid");
        return;
    }
    let d = Daemon::start(1, "");
    use std::os::unix::fs::PermissionsExt;
    // Open the socket's mode so the kernel lets uid 65534 connect; the peer check must refuse.
    let _ = std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o777));
    let _ = std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755));
    let probe = format!(
        "import socket,json,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect({:?})\n\
         s.sendall((json.dumps({{'jsonrpc':'2.0','id':1,'method':'tools/list','params':{{'_meta':{}}}}})+'\\n').encode())\n\
         s.settimeout(5)\nprint(repr(s.recv(4096)))",
        d.socket.display().to_string(),
        meta()
    );
    use std::os::unix::process::CommandExt;
    let out = Command::new("python3")
        .arg("-c")
        .arg(&probe)
        .uid(65534)
        .gid(65534)
        .output();
    let out = out.unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Refused before any request is read: at most a line saying why, never an answer.
    assert!(
        !out.status.success()
            || stdout.trim() == "b''"
            || (stdout.contains("-32000")
                && stdout.contains("not allowed")
                && !stdout.contains("tools")),
        "uid 65534 got an answer: {stdout}"
    );
    // The daemon's own uid still gets served.
    let mut c = d.connect();
    c.send(1, "tools/list", json!({}));
    assert!(c.response()["result"]["tools"].is_array());
}

#[test]
fn a_full_queue_answers_overloaded() {
    let d = Daemon::start(1, "queue_limit = 1\n");
    let mut conns: Vec<Conn> = (0..4).map(|_| d.connect()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        c.call(i as u64, "slow", json!({"ms": 1500}));
        std::thread::sleep(Duration::from_millis(100));
    }
    let texts: Vec<String> = conns.iter_mut().map(|c| text(&c.response())).collect();
    let ok = texts.iter().filter(|t| t.starts_with("slept")).count();
    let overloaded = texts.iter().filter(|t| t.starts_with("OVERLOADED")).count();
    // One runs, one waits in the queue, the other two are turned away.
    assert_eq!((ok, overloaded), (2, 2), "{texts:?}");
}

#[test]
fn sigterm_lets_in_flight_calls_finish_then_exits_and_removes_the_socket() {
    let mut d = Daemon::start(1, "");
    let mut c = d.connect();
    c.call(1, "slow", json!({"ms": 1000}));
    d.wait_until("a busy worker", 60, |c| c.iter().any(|x| x.2));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.pid(), libc::SIGTERM) };
    let r = c.response();
    assert_eq!(text(&r), "slept 1000");
    let status = d.child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success());
    assert!(!d.socket.exists());
}

#[test]
fn sighup_reloads_the_catalog() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = dir.path().join("catalog.json");
    let mut specs: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(CATALOG).unwrap_or_default())
            .unwrap_or_default();
    let _ = std::fs::write(&cat, serde_json::to_string(&specs).unwrap_or_default());
    let cat_s = cat.display().to_string();
    let d = Daemon::start_in(dir, 1, "", &cat_s);
    let mut c = d.connect();
    c.send(1, "tools/list", json!({}));
    let before = c.response()["result"]["tools"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    specs.push(json!({"name": "added-later", "code": "return 7;", "codeType": "Javascript", "draft": false}));
    let _ = std::fs::write(&cat, serde_json::to_string(&specs).unwrap_or_default());
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    let t0 = Instant::now();
    loop {
        c.send(2, "tools/list", json!({}));
        let n = c.response()["result"]["tools"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0);
        if n == before + 1 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "reload not seen");
        std::thread::sleep(Duration::from_millis(50));
    }
    c.call(3, "added-later", json!({}));
    assert_eq!(text(&c.response()), "7");
}

#[test]
fn worker_reuse_serves_k_calls_per_worker_each_in_a_fresh_context() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_with(dir, 1, "", CATALOG, &["--worker-reuse", "3"]);
    let mut c = d.connect();
    for i in 0..6 {
        c.call(i, "leaky", json!({}));
        // A fresh context each time: state set by one call is never seen by the next.
        assert_eq!(text(&c.response()), "1");
        // Time to make that next context: a call that finds its worker still at it goes to
        // a fresh worker (tests/reuse.rs), which would blur the count here.
        std::thread::sleep(Duration::from_millis(200));
    }
    let pids: Vec<i64> = d
        .audit_records()
        .iter()
        .map(|r| r["workerPid"].as_i64().unwrap_or(0))
        .collect();
    assert_eq!(pids.len(), 6);
    // Three calls per worker, then a new one.
    assert!(pids[0] == pids[1] && pids[1] == pids[2], "{pids:?}");
    assert!(
        pids[3] == pids[4] && pids[4] == pids[5] && pids[3] != pids[0],
        "{pids:?}"
    );
    // A worker whose call hit a limit is never reused.
    c.call(10, "slow", json!({"ms": 1}));
    let _ = c.response();
    c.call(11, "slow", json!({"ms": "bad"}));
    let _ = c.response();
    c.call(12, "slow", json!({"ms": 1}));
    let _ = c.response();
}

/// A fetch through the daemon: the reply and the audit record mask the secret that went into
/// the URL and a header, and the audit record names the host override and the extra CA that
/// let the request through, and the rule that refused another.
#[test]
fn fetch_hops_are_audited_with_the_operator_settings_and_secrets_masked() {
    let server = stsd_tests::fixture_server::FixtureServer::start();
    let d = fetch_daemon(&server);
    let mut c = d.connect();
    c.call(1, "fetchEcho", json!({}));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    let t = text(&r);
    assert!(!t.contains("supersecret-token-123"), "{t}");
    // The code held a placeholder (the echo of the real value came back as it too), masked
    // on the way out like the secret.
    assert!(t.contains("Bearer ***") && t.contains("key=***"), "{t}");
    assert!(!t.contains("stsd-secret-"), "{t}");
    // The server did get the real secret: the broker put it back on the wire.
    assert!(server.seen().iter().any(|s| s
        .headers
        .iter()
        .any(|(k, v)| k == "authorization" && v.ends_with("supersecret-token-123"))));
    c.call(2, "fetchLoopback", json!({}));
    let r = c.response();
    assert!(is_error(&r), "{r}");
    let t = text(&r);
    assert!(t.contains("[fetch] denied: loopback: 127.0.0.1"), "{t}");
    assert!(!t.contains("supersecret-token-123"), "{t}");

    let recs = d.audit_records();
    let rec = |name: &str| {
        recs.iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no audit record for {name}: {recs:?}"))
    };
    let ok = rec("fetchEcho");
    let hop = &ok["egress"][0];
    assert_eq!(hop["status"], 200, "{ok}");
    assert_eq!(hop["via"], "override");
    assert_eq!(
        hop["override"],
        format!("fixture.test = 127.0.0.1:{}", server.port)
    );
    assert_eq!(hop["extraCa"], true);
    assert_eq!(hop["mode"], "allowlist");
    assert!(
        hop["url"].as_str().unwrap_or_default().ends_with("key=***"),
        "{hop}"
    );
    assert_eq!(hop["secrets"], json!(["STSD_TEST_TOKEN"]), "{hop}");
    let bad = rec("fetchLoopback");
    assert_eq!(bad["error"]["code"], "SECURITY", "{bad}");
    assert_eq!(bad["egress"][0]["refused"], "loopback");
    assert_eq!(bad["egress"][0]["url"], "http://127.0.0.1:9/***");
    assert!(!bad.to_string().contains("supersecret-token-123"), "{bad}");
}

/// A daemon serving fetch tools, with the fixture server's host and CA configured.
fn fetch_daemon(server: &stsd_tests::fixture_server::FixtureServer) -> Daemon {
    fetch_daemon_env(server, &[])
}

fn fetch_daemon_env(
    server: &stsd_tests::fixture_server::FixtureServer,
    env: &[(&str, &str)],
) -> Daemon {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("net.json");
    let tool = |name: &str, mode: &str, code: &str| {
        json!({"name": name, "description": "fetch test", "codeType": "Javascript",
               "staticVariables": [{"TOKEN": "${STSD_TEST_TOKEN}"}],
               "sandboxOverrides": {"networkMode": mode, "hostsAllow": ["fixture.test"]},
               "draft": false, "code": code})
    };
    let specs = json!([
        tool(
            "fetchEcho",
            "allowlist",
            "const r = await fetch('https://fixture.test/stsd/echo?key=' + TOKEN, \
              {headers: {Authorization: 'Bearer ' + TOKEN}}); const j = r.json(); \
              return {auth: j.headers.authorization, query: j.query, url: r.url};"
        ),
        tool(
            "fetchLoopback",
            "strict",
            "return await fetch('http://127.0.0.1:9/' + TOKEN);"
        ),
        tool(
            "fetchTrickle",
            "allowlist",
            "return (await fetch('https://fixture.test/stsd/trickle')).text();"
        ),
    ]);
    std::fs::write(&catalog, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let egress = format!(
        "\n[egress]\nextra_ca_files = [\"{}\"]\n[egress.host_overrides]\n\"fixture.test\" = \"127.0.0.1:{}\"\n",
        server.ca_file.display(),
        server.port
    );
    let c = catalog.display().to_string();
    Daemon::launch_env(dir, 1, &egress, Some(&c), &[], None, env)
}

/// Debug logging must not carry a secret either: not in stsd's own lines, and not in the
/// lines of the libraries it uses (the HTTP client logs URLs and headers).
#[test]
fn a_secret_in_a_fetch_url_or_header_never_reaches_the_debug_log() {
    let server = stsd_tests::fixture_server::FixtureServer::start();
    // Even a filter that names the HTTP client's target.
    for level in ["debug", "trace,ureq=trace"] {
        let d = fetch_daemon_env(&server, &[("STSD_LOG", level)]);
        let mut c = d.connect();
        c.call(1, "fetchEcho", json!({}));
        assert!(!is_error(&c.response()));
        c.call(2, "fetchLoopback", json!({}));
        let _ = c.response();
        let log = d.log();
        assert!(log.contains("DEBUG"), "no debug lines: {log}");
        let leaks: Vec<String> = log
            .lines()
            .filter(|l| l.contains("supersecret-token-123"))
            .map(|l| l.replace("supersecret-token-123", "<SECRET>"))
            .collect();
        assert!(
            leaks.is_empty(),
            "{level}: the secret is in the log: {leaks:#?}"
        );
    }
}

/// A caller that goes away while its tool waits on a fetch is noticed at once: the worker is
/// killed and the call recorded CANCELLED, without waiting out the 30 s request timeout.
#[test]
fn a_client_that_disconnects_during_a_fetch_is_noticed_at_once() {
    let server = stsd_tests::fixture_server::FixtureServer::start();
    let d = fetch_daemon(&server);
    {
        let mut c = d.connect();
        c.call(1, "fetchTrickle", json!({}));
        let t0 = Instant::now();
        while !server.seen().iter().any(|s| s.path == "/stsd/trickle") {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the fetch never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    } // the connection drops here, mid-fetch
    let t0 = Instant::now();
    while d.audit_records().is_empty() && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let recs = d.audit_records();
    assert_eq!(recs.len(), 1, "no record within 3 s");
    assert_eq!(recs[0]["error"]["code"], "CANCELLED", "{}", recs[0]);
}

/// Issue 33 item 8: a SIGHUP that reads the config while it is being rewritten (empty for a
/// moment) is refused; before, it took the empty file as "all defaults" and moved the audit
/// log away. The call after it is audited where it was.
#[test]
fn a_reload_of_an_empty_config_is_refused_and_the_audit_log_stays() {
    let d = Daemon::start(1, "");
    let config = d.dir().join("stsd.toml");
    let kept = std::fs::read_to_string(&config).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&config, "").unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    let t0 = Instant::now();
    let log = loop {
        let log = d.log();
        if log.contains("reloaded (SIGHUP)") || log.contains("SIGHUP: config refused") {
            break log;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no reload outcome:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(log.contains("holds no setting"), "{log}");
    std::fs::write(&config, kept).unwrap_or_else(|e| panic!("{e}"));
    let mut c = d.connect();
    c.call(1, "echo-console", json!({"text": "still here"}));
    let _ = c.response();
    let recs = d.audit_records();
    assert!(
        recs.iter().any(|r| r["name"] == "echo-console"),
        "the call's record is not in the audit log it had: {recs:?}"
    );
}

/// Issue 33's figure: a call to a published tool that needs no approval asks nothing of the
/// state store (the catalog and the ledger are read at start and on a change, and kept):
/// fifty calls, zero store operations (`stsd metrics` `storeOps`).
#[test]
fn calls_to_a_published_tool_ask_nothing_of_the_state_store() {
    let d = Daemon::start(1, "");
    let ops = || -> u64 {
        let out = Command::new(stsd_tests::stsd_bin())
            .args(["metrics", "--json", "--socket"])
            .arg(&d.socket)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["storeOps"]
            .as_u64()
            .unwrap_or_else(|| panic!("no storeOps in {v}"))
    };
    let mut c = d.connect();
    c.call(0, "echo-console", json!({"text": "warm"}));
    assert!(!is_error(&c.response()));
    let before = ops();
    assert!(before > 0, "the start read nothing from the store?");
    for i in 1..=50u64 {
        c.call(i, "echo-console", json!({"text": "x"}));
        assert!(!is_error(&c.response()));
    }
    assert_eq!(ops(), before, "calls asked the state store");
}
