//! Issue 34 item 3: `[[limits]]` on the real daemon. A principal past a per-tool rate gets
//! RATE_LIMITED (with `_meta["stsd/retryAfterMs"]`) for the excess while its other tools and
//! another principal are untouched; a CPU quota ends a CPU-heavy principal's calls, not
//! another's; a concurrency limit refuses the call past it.

use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, text, Daemon, CATALOG};
use stsd_tests::{is_root, stsd_bin};

/// A daemon with `limits` whose socket `nobody` (uid 65534, another principal) may use.
fn daemon(limits: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_in(
        dir,
        2,
        // Every refusal recorded, none summarised (the test counts them).
        &format!("allowed_uids = [65534]\naudit_refusals_per_second = 0\n{limits}"),
        CATALOG,
    );
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o777));
    let _ = std::fs::set_permissions(d.dir(), std::fs::Permissions::from_mode(0o755));
    d
}

/// `stsd call TOOL --arg K=V` as uid 65534: (succeeded, what it printed), and how long.
fn as_nobody(d: &Daemon, tool: &str, arg: &str) -> (bool, String, Duration) {
    use std::os::unix::process::CommandExt;
    let t0 = Instant::now();
    let out = Command::new(stsd_bin())
        .args(["call", tool, "--arg", arg, "--socket"])
        .arg(&d.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said, t0.elapsed())
}

#[test]
fn a_principal_past_a_tools_rate_is_limited_and_nothing_else_is() {
    if !is_root() {
        eprintln!("skipped: needs root (a second uid)");
        return;
    }
    let d = daemon(
        "[[limits]]\nprincipal = \"*\"\ntool = \"echo-console\"\ncalls_per_second = 5\nburst = 5\n",
    );
    // Another principal's latency before the flood (figures only; outcomes are asserted).
    let before: Vec<Duration> = (0..5).map(|_| as_nobody(&d, "slow", "ms=1").2).collect();
    let mut c = d.connect();
    let n = 50u64;
    let t0 = Instant::now();
    for i in 0..n {
        c.call(i, "echo-console", json!({"text": "x"}));
    }
    // Meanwhile: the same principal's other tool, and another principal on the same tool.
    let mut other = d.connect();
    other.call(1000, "slow", json!({"ms": 1}));
    let during: Vec<(bool, String, Duration)> = (0..5)
        .map(|_| as_nobody(&d, "echo-console", "text=y"))
        .collect();
    let (mut ok, mut limited) = (0u64, 0u64);
    for _ in 0..n {
        let r = c.response();
        let t = text(&r);
        if t.starts_with("RATE_LIMITED: rate limit: uid:0 on echo-console") {
            let after = r["result"]["_meta"]["stsd/retryAfterMs"]
                .as_u64()
                .unwrap_or_else(|| panic!("no retryAfterMs: {r}"));
            assert!(after > 0 && after <= 1000, "{r}");
            limited += 1;
        } else {
            assert!(!is_error(&r), "{r}");
            ok += 1;
        }
    }
    let allowed = 5 + (t0.elapsed().as_secs_f64() * 5.0).ceil() as u64;
    assert!(
        ok >= 5 && ok <= allowed,
        "{ok} passed, at most {allowed} may"
    );
    assert!(limited >= n - allowed, "{limited} limited");
    assert!(!is_error(&other.response()), "its other tool");
    for (passed, said, _) in &during {
        assert!(*passed, "another principal: {said}");
    }
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    eprintln!(
        "uid 65534's `stsd call` p50 before the flood {:?}, during uid 0's flood at 10x its limit {:?}",
        p50(before),
        p50(during.iter().map(|x| x.2).collect())
    );
    let recs = d.audit_records();
    let refused = recs
        .iter()
        .filter(|r| r["error"]["code"] == "RATE_LIMITED")
        .count() as u64;
    assert_eq!(refused, limited, "every refusal audited");
}

#[test]
fn a_cpu_quota_ends_the_heavy_principals_calls_not_anothers() {
    if !is_root() {
        eprintln!("skipped: needs root (a second uid)");
        return;
    }
    let d = daemon("[[limits]]\nprincipal = \"uid:0\"\ntool = \"*\"\ncpu_seconds_per_hour = 1\n");
    let mut c = d.connect();
    // Spin until refused: each call's CPU (its `_meta` metrics) counts, whatever share of
    // the machine it got; the refusal comes once a second of CPU is spent, not before.
    let (mut spent, mut refused) = (0u64, None);
    for i in 0..40 {
        c.call(i, "slow", json!({"ms": 300}));
        let r = c.response();
        if text(&r).starts_with("RATE_LIMITED") {
            refused = Some(r);
            break;
        }
        assert_eq!(text(&r), "slept 300", "{r}");
        spent += r["result"]["_meta"]["stsd/metrics"]["cpuUs"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cpuUs: {r}"));
    }
    let r = refused.unwrap_or_else(|| panic!("never refused; {spent} us of CPU spent"));
    assert!(
        spent >= 1_000_000,
        "refused after {spent} us, under the quota"
    );
    let t = text(&r);
    assert!(t.starts_with("RATE_LIMITED: CPU quota: uid:0 used"), "{t}");
    assert!(
        r["result"]["_meta"]["stsd/retryAfterMs"]
            .as_u64()
            .unwrap_or(0)
            > 3_000_000,
        "{r}"
    );
    let (passed, said, _) = as_nobody(&d, "slow", "ms=600");
    assert!(passed && said.contains("slept 600"), "{said}");
}

#[test]
fn a_call_past_the_concurrency_limit_is_refused() {
    let d = daemon("[[limits]]\nprincipal = \"*\"\ntool = \"slow\"\nconcurrent = 1\n");
    let mut c = d.connect();
    // Two long calls at once: whichever is admitted first holds the one slot while it runs,
    // and the other is refused (the order between them is the daemon's).
    c.call(1, "slow", json!({"ms": 1500}));
    c.call(2, "slow", json!({"ms": 1500}));
    let answers: Vec<String> = vec![text(&c.response()), text(&c.response())];
    let ran = answers.iter().filter(|t| *t == "slept 1500").count();
    let refused = answers
        .iter()
        .filter(|t| t.starts_with("RATE_LIMITED: concurrency limit"))
        .count();
    assert_eq!((ran, refused), (1, 1), "{answers:?}");
    // Over: the next one runs.
    c.call(3, "slow", json!({"ms": 1}));
    assert_eq!(text(&c.response()), "slept 1");
}
