//! Worker reuse (`--worker-reuse K`) in the daemon: the CPU rlimit is a per-call budget even on
//! a worker that serves many calls, parked workers expire and are capped in number, and a
//! posture change (catalog rewritten, SIGHUP) never hands an old-posture worker to a call.

use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, text, Daemon, CATALOG};

/// The worker pid of every call so far, in order (from the audit log).
fn worker_pids(d: &Daemon) -> Vec<i64> {
    d.audit_records()
        .iter()
        .map(|r| r["workerPid"].as_i64().unwrap_or(0))
        .collect()
}

/// True while `pid` exists and is not a zombie.
fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .is_some_and(|zombie| !zombie)
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` back-to-back calls of `leaky` (a fresh context each: always 1) on a daemon with a pool
/// of `pool` reusing workers `reuse` times; the worker pid of each call.
fn leaky_calls(pool: usize, reuse: &str, n: u64) -> Vec<i64> {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_with(dir, pool, "", CATALOG, &["--worker-reuse", reuse]);
    let mut c = d.connect();
    for i in 0..n {
        c.call(i, "leaky", json!({}));
        let r = c.response();
        assert_eq!(text(&r), "1", "pool {pool}, call {i}: {r}");
    }
    worker_pids(&d)
}

/// A daemon with a pool of one serving `specs` (written to a catalog of its own), each
/// worker reused for up to `reuse` calls.
fn start_reusing(specs: &Value, extra_config: &str, reuse: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("catalog.json");
    std::fs::write(&catalog, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    let catalog = catalog.display().to_string();
    Daemon::start_with(dir, 1, extra_config, &catalog, &["--worker-reuse", reuse])
}

/// RLIMIT_CPU counts a process's whole life. A reused worker serving calls that each burn
/// 0.8 s of CPU under a 2 s timeout (a 4 s CPU limit per call) used to die of SIGXCPU
/// (TIMEOUT) on its sixth call; the limit is now re-armed for every call.
#[test]
fn the_cpu_limit_is_per_call_on_a_reused_worker() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_with(
        dir,
        1,
        "[baseline]\ntimeout_seconds = 2\n",
        CATALOG,
        &["--worker-reuse", "20"],
    );
    let mut c = d.connect();
    for i in 0..8 {
        c.call(i, "slow", json!({"ms": 800}));
        let r = c.response();
        assert!(!is_error(&r), "call {i}: {r}");
        assert_eq!(text(&r), "slept 800");
        // Time for the worker to make its next context: a call that finds the parked worker
        // still at it goes to a fresh one instead (tested below), which is not this test.
        std::thread::sleep(Duration::from_millis(200));
    }
    let pids = worker_pids(&d);
    assert_eq!(pids.len(), 8);
    assert!(pids.iter().all(|p| *p == pids[0]), "one worker: {pids:?}");
}

/// A parked worker is killed after `[worker] reuse_idle_seconds` without a call.
#[test]
fn parked_workers_expire_after_the_idle_time() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_with(
        dir,
        1,
        "[worker]\nreuse_idle_seconds = 1\n",
        CATALOG,
        &["--worker-reuse", "5"],
    );
    let mut c = d.connect();
    c.call(1, "leaky", json!({}));
    assert_eq!(text(&c.response()), "1");
    let pid = worker_pids(&d)[0];
    let parked_at = Instant::now();
    assert!(alive(pid), "the worker was not parked");
    wait_for(
        "the parked worker outlived its idle time",
        Duration::from_secs(5),
        || !alive(pid),
    );
    let idle = parked_at.elapsed();
    assert!(idle >= Duration::from_millis(800), "expired after {idle:?}");
    eprintln!("parked worker gone {} ms after its call", idle.as_millis());
    // The next call of the tool gets a fresh worker.
    c.call(2, "leaky", json!({}));
    assert_eq!(text(&c.response()), "1");
    assert_ne!(worker_pids(&d)[1], pid);
}

/// Parked workers of all tools together are capped by `[worker] reuse_max_parked`: parking
/// one more lets the longest-parked go.
#[test]
fn the_parked_total_is_capped() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_with(
        dir,
        2,
        "[worker]\nreuse_max_parked = 1\n",
        CATALOG,
        &["--worker-reuse", "5"],
    );
    let mut c = d.connect();
    c.call(1, "leaky", json!({}));
    assert_eq!(text(&c.response()), "1");
    c.call(2, "echo-console", json!({"text": "x"}));
    assert_eq!(text(&c.response()), "echo: x");
    let pids = worker_pids(&d);
    assert_ne!(pids[0], pids[1]);
    wait_for(
        "the first tool's parked worker is still there",
        Duration::from_secs(3),
        || !alive(pids[0]),
    );
    assert!(alive(pids[1]), "the last parked worker was let go");
    // Confined children (parked, nothing running): only the one.
    let confined = d.children().iter().filter(|c| c.2 && c.1 != 'Z').count();
    assert_eq!(confined, 1);
}

fn tool(overrides: Value) -> Value {
    json!([{"name": "posture", "description": "reports its network grant",
            "codeType": "Javascript", "draft": false,
            "sandboxOverrides": overrides, "code": "return typeof fetch;"}])
}

/// The parked key is the tool's name and its resolved posture: after the catalog file's posture
/// changes and SIGHUP, the next call runs on a fresh worker confined to the new posture instead
/// of being refused by the old one (SANDBOX_UNAVAILABLE).
#[test]
fn a_posture_change_takes_a_fresh_worker() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = dir.path().join("catalog.json");
    let write = |v: &Value, p: &Path| std::fs::write(p, v.to_string());
    write(&tool(json!({})), &catalog).unwrap_or_else(|e| panic!("{e}"));
    let cat = catalog.display().to_string();
    // The spec is edited behind a SIGHUP on purpose: the fingerprint ledger, which would
    // withhold it until approved, is off here (tests/mcp/test_gateway.py covers it).
    let d = Daemon::start_with(
        dir,
        1,
        "[gateway]\nledger_own_specs = false\n",
        &cat,
        &["--worker-reuse", "5"],
    );
    let mut c = d.connect();
    c.call(1, "posture", json!({}));
    assert_eq!(text(&c.response()), "undefined");
    let first = worker_pids(&d)[0];
    assert!(alive(first), "the worker was not parked");

    write(&tool(json!({"networkMode": "strict"})), &catalog).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    // The reload is seen when the tool's annotations say it reaches the network.
    let mut id = 10;
    wait_for("the reload", Duration::from_secs(5), || {
        id += 1;
        c.send(id, "tools/list", json!({}));
        let r = c.response();
        r["result"]["tools"][0]["annotations"]["openWorldHint"] == true
    });
    c.call(2, "posture", json!({}));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    assert_eq!(text(&r), "function");
    let pids = worker_pids(&d);
    assert_ne!(pids[1], first, "the old-posture worker served the call");
}

/// Back-to-back calls on reused workers: each finds a worker whose next context is made
/// (or a fresh one), never a context an earlier call used, and never an error.
#[test]
fn back_to_back_reused_calls_each_get_a_fresh_context() {
    for pool in [1, 2] {
        let pids = leaky_calls(pool, "100", 40);
        let reused = pids.len() - pids.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(
            reused >= 20,
            "pool {pool}: workers were not reused: {pids:?}"
        );
    }
}

/// A reused worker compiles its tool's body once and loads it from bytecode for its later
/// calls (worker/src/body.rs): what a call sees is the same as from a parse, in sloppy mode
/// (an assignment to an undeclared name makes a global), with its source text and the
/// body's own line numbers in a stack.
#[test]
fn a_reused_workers_later_calls_run_the_body_as_the_first_did() {
    let code = "made = typeof made;\nconst s = String(new Error('x').stack).split('\\n')[0];\n\
                if (n > 1) throw new Error('line three ' + n);\n\
                return [made, s, (function f() { return 1 }).toString()].join(' | ');";
    let specs = json!([{"name": "sloppy", "description": "sloppy-mode body", "codeType": "Javascript",
        "draft": false, "params": [{"name": "n", "type": "NUMBER", "description": "n", "required": true, "testValue": "1"}],
        "code": code}]);
    let d = start_reusing(&specs, "", "10");
    let mut c = d.connect();
    let mut seen = Vec::new();
    for i in 0..4u64 {
        // Two calls that return, then two that throw, on one worker.
        c.call(i, "sloppy", json!({"n": if i < 2 { 1 } else { 2 }}));
        let r = c.response();
        seen.push((is_error(&r), text(&r)));
    }
    assert_eq!(seen[0], seen[1], "{seen:?}");
    assert_eq!(seen[2], seen[3], "{seen:?}");
    assert!(!seen[0].0 && seen[2].0, "{seen:?}");
    assert!(
        seen[0].1 == "undefined |     at <anonymous> (tool.js:2:22) | function f() { return 1 }",
        "{seen:?}"
    );
    assert!(seen[2].1.contains("line three 2"), "{seen:?}");
    let pids = worker_pids(&d);
    assert!(
        pids.windows(2).all(|w| w[0] == w[1]),
        "one worker: {pids:?}"
    );
}

/// One tool called back to back with reuse: the two workers parked under its key take turns,
/// and a call that finds both still making their next contexts waits for the longest-parked
/// rather than taking a pool worker. With the key full, that worker would be let go after
/// one call; the fork, start and teardown of one such worker for every few calls took the
/// CPU the parked workers needed for their contexts, so still more calls missed them (a
/// third of 2000 calls, 589 workers, in one trace).
#[test]
fn back_to_back_calls_of_one_tool_take_turns_on_its_parked_workers() {
    let pids = leaky_calls(2, "1000", 200);
    let distinct = pids.iter().collect::<std::collections::BTreeSet<_>>();
    assert_eq!(pids.len(), 200);
    assert!(
        distinct.len() <= 2,
        "200 calls of one tool took {} workers (two parked per key): {pids:?}",
        distinct.len()
    );
}

/// A call whose worker is at hand (parked by the call before, or warm in the pool) is driven
/// on the runtime thread that holds the request: no blocking thread is started for it, so the
/// daemon's threads named `stsd` stay its main thread and its two runtime threads. A posture
/// with network still runs on a blocking thread (the broker's fetch runs there), which shows
/// that the count sees one when there is one.
#[test]
fn calls_with_a_worker_at_hand_run_on_the_runtime_thread() {
    use stsd_tests::harness::thread_names;
    let specs = json!([
        {"name": "one", "description": "returns one", "codeType": "Javascript",
         "draft": false, "code": "console.log('hi'); return 1;"},
        {"name": "net", "description": "has network, does not use it", "codeType": "Javascript",
         "sandboxOverrides": {"networkMode": "allowlist", "hostsAllow": ["fixture.test"]},
         "draft": false, "code": "return 2;"}
    ]);
    // The harness's config ends in its [daemon] section: this line lands there.
    let d = start_reusing(&specs, "runtime_threads = 2\n", "50");
    let named_stsd = || {
        thread_names(d.pid())
            .iter()
            .filter(|t| *t == "stsd")
            .count()
    };
    // Polled: a thread the daemon has just started (its reaper, at its first worker let
    // go) is named `stsd` until it names itself, and an idle blocking thread stays for 10 s.
    let settles_at = |n: usize, within: Duration| {
        let t0 = Instant::now();
        while named_stsd() != n {
            assert!(
                t0.elapsed() < within,
                "{n} threads named stsd expected: {:?}",
                thread_names(d.pid())
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut c = d.connect();
    // A first call makes the worker the next ones find at hand (parked by it). Waiting for
    // the pool to fill instead failed on a machine whose CPUs were busy: pool workers are
    // made as background work (SCHED_IDLE), which a loaded machine may not run for long.
    // That call may have started a blocking thread: it is idle again after 10 s.
    c.call(999, "one", json!({}));
    assert_eq!(text(&c.response()), "1");
    // Up to three rounds of 20 calls: a round is clean when no thread named `stsd` was
    // started during it. On a loaded machine a call may find its worker not at hand (still
    // making its next context at background priority, starved) and rightly take a blocking
    // thread; one clean round in three shows calls at hand run inline, and a daemon that
    // drove every call on a blocking thread fails all three.
    let mut clean = false;
    for round in 0..3u64 {
        settles_at(3, Duration::from_secs(30));
        for i in 0..20 {
            c.call(round * 100 + i, "one", json!({}));
            let r = c.response();
            assert_eq!(text(&r), "1", "call {i}: {r}");
        }
        let t0 = Instant::now();
        while named_stsd() != 3 && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if named_stsd() == 3 {
            clean = true;
            break;
        }
    }
    assert!(
        clean,
        "every round of calls at hand started a thread: {:?}",
        thread_names(d.pid())
    );
    c.call(100, "net", json!({}));
    let r = c.response();
    assert_eq!(text(&r), "2", "{r}");
    settles_at(4, Duration::from_secs(5));
}
