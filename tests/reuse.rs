//! Worker reuse (`--worker-reuse K`) in the daemon: the CPU rlimit is a per-call budget even on
//! a worker that serves many calls, parked workers expire and are capped in number, and a
//! posture change (catalog rewritten, SIGHUP) never hands an old-posture worker to a call.

use serde_json::json;
use stsd_tests::harness::{is_error, text, Daemon, CATALOG};

/// The worker pid of every call so far, in order (from the audit log).
fn worker_pids(d: &Daemon) -> Vec<i64> {
    d.audit_records()
        .iter()
        .map(|r| r["workerPid"].as_i64().unwrap_or(0))
        .collect()
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
    }
    let pids = worker_pids(&d);
    assert_eq!(pids.len(), 8);
    assert!(pids.iter().all(|p| *p == pids[0]), "one worker: {pids:?}");
}
