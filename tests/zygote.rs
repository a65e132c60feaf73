//! Workers forked from the zygote: what a fresh worker holds (one socket, nothing of any
//! earlier call), the zygote dying or being replaced without a lost call, and a binary
//! replaced on disk under a running daemon.

use serde_json::json;
use std::time::{Duration, Instant};
use stsd_tests::harness::{is_error, text, Daemon};

/// The daemon's zygote: its pid, once one runs (and is not a zombie waiting to be reaped).
/// A worker the zygote has just forked is named like it, and is the daemon's child too
/// (CLONE_PARENT), until it renames itself: of those, the zygote is the oldest.
fn zygote_pid(d: &Daemon) -> Option<i32> {
    let mut oldest: Option<(u64, i32)> = None;
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state, ppid, ..., starttime (field 22 of stat, 20th here).
        let started = f
            .get(19)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        if head.ends_with("(stsd-zygote")
            && f.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(d.pid())
            && f.first() != Some(&"Z")
            && oldest.is_none_or(|(t, _)| started < t)
        {
            oldest = Some((started, pid));
        }
    }
    oldest.map(|(_, pid)| pid)
}

fn wait_for_zygote(d: &Daemon, not: Option<i32>) -> i32 {
    let t0 = Instant::now();
    loop {
        if let Some(p) = zygote_pid(d).filter(|p| Some(*p) != not) {
            return p;
        }
        // A zygote is started as background work (SCHED_IDLE): on a machine whose CPUs are
        // busy (stress-ng on both) it took over 10 s; a minute, returned from at once when
        // it is there.
        assert!(t0.elapsed() < Duration::from_secs(60), "no new zygote");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `specs` written as a catalog file in `dir`, for `Daemon::launch`: its path.
fn write_catalog(dir: &tempfile::TempDir, specs: &serde_json::Value) -> String {
    let catalog = dir.path().join("catalog.json");
    std::fs::write(&catalog, specs.to_string()).unwrap_or_else(|e| panic!("{e}"));
    catalog.display().to_string()
}

/// Every writable mapping of `pid`, concatenated: all that a process can have been given
/// since it was made (its read-only mappings are the binary and libraries). Root reads any
/// process's memory.
fn memory_of(pid: i32) -> Vec<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mem = match std::fs::File::open(format!("/proc/{pid}/mem")) {
        Ok(f) => f,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for line in maps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(range), Some(perms)) = (f.first(), f.get(1)) else {
            continue;
        };
        // [vvar] and friends cannot be read through /proc/PID/mem.
        if !perms.starts_with("rw") || f.get(5).is_some_and(|n| n.starts_with("[v")) {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut buf = vec![0u8; (b - a) as usize];
        use std::os::unix::fs::FileExt;
        if mem.read_exact_at(&mut buf, a).is_ok() {
            out.extend_from_slice(&buf);
        }
    }
    out
}

/// The daemon's workers waiting for a call (alive, not yet confined).
fn idle_workers(d: &Daemon) -> Vec<i32> {
    d.children()
        .iter()
        .filter(|c| !c.2 && c.1 != 'Z')
        .map(|c| c.0)
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A fresh worker holds its socket on fd 3, /dev/null on 0-2, and nothing else; no byte of
/// an earlier call's arguments, secrets or result is in its memory or the zygote's. The
/// scan is shown able to find what is there (the runtime's own source) before it is trusted
/// to find nothing.
#[test]
fn a_fresh_worker_holds_only_its_socket_and_nothing_of_earlier_calls() {
    if stsd_tests::skip_unless_root("reading another process's memory needs root") {
        return;
    }
    let d = Daemon::start(2, "");
    let mut c = d.connect();
    // An argument, a resolved secret (the harness sets STSD_TEST_TOKEN for `with-secret`)
    // and a result, each unique to this call.
    let arg = format!("zy-arg-{}-{}", std::process::id(), line!());
    c.call(1, "echo-console", json!({ "text": arg }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    assert!(text(&r).contains(&arg), "{r}");
    c.call(2, "with-secret", json!({ "count": 7 }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    // Workers forked after those calls, and the zygote that forked them: the pool makes them
    // as background work, which a loaded machine may delay well past the 300 ms given first.
    std::thread::sleep(Duration::from_millis(300));
    let zygote = wait_for_zygote(&d, None);
    let t0 = Instant::now();
    let idle = loop {
        let idle = idle_workers(&d);
        if !idle.is_empty() {
            break idle;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no idle worker in 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    for &pid in &idle {
        let mut fds: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().to_string_lossy().parse().ok()?;
                let t = std::fs::read_link(e.path()).ok()?;
                Some((n, t.to_string_lossy().into_owned()))
            })
            .collect();
        fds.sort();
        assert_eq!(fds.len(), 4, "worker {pid}: {fds:?}");
        for (n, target) in &fds[..3] {
            assert_eq!(target, "/dev/null", "worker {pid} fd {n}");
        }
        assert_eq!(fds[3].0, 3);
        assert!(fds[3].1.starts_with("socket:"), "{fds:?}");
    }
    let secrets: [&[u8]; 3] = [
        arg.as_bytes(),
        b"supersecret-token-123",
        b"Bearer supersecret",
    ];
    for pid in idle.iter().copied().chain([zygote]) {
        let mem = memory_of(pid);
        assert!(
            contains(&mem, b"stsd-prelude.js"),
            "the scan of {pid} cannot see the runtime it must hold ({} bytes read)",
            mem.len()
        );
        for s in secrets {
            assert!(
                !contains(&mem, s),
                "{pid} holds {:?} from an earlier call",
                String::from_utf8_lossy(s)
            );
        }
    }
}

/// The zygote killed (-9) over and over while calls stream in: every call is answered, and a
/// new zygote takes its place each time.
#[test]
fn killing_the_zygote_mid_load_loses_no_call() {
    let d = Daemon::start(2, "");
    let mut first = wait_for_named_zygote(&d, None);
    let clients: Vec<_> = (0..4)
        .map(|k| {
            let mut c = d.connect();
            std::thread::spawn(move || {
                let mut bad = Vec::new();
                for i in 0..40u64 {
                    c.call(i, "echo-console", json!({ "text": format!("c{k}-{i}") }));
                    let r = c.response();
                    if is_error(&r) || !text(&r).contains(&format!("c{k}-{i}")) {
                        bad.push(r);
                    }
                }
                bad
            })
        })
        .collect();
    for _ in 0..4 {
        // SAFETY: kill(2) with a pid the daemon names as its zygote, its child.
        unsafe { libc::kill(first, libc::SIGKILL) };
        first = wait_for_named_zygote(&d, Some(first));
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in clients {
        let bad = c.join().unwrap_or_else(|_| panic!("client panicked"));
        assert!(bad.is_empty(), "lost or failed calls: {bad:?}");
    }
    // And the daemon still serves, from a live zygote.
    let mut c = d.connect();
    c.call(99, "echo-console", json!({ "text": "after" }));
    assert!(text(&c.response()).contains("after"));
    assert!(zygote_pid(&d).is_some());
}

/// `stsd status --json` of the daemon (None: it did not answer with JSON).
fn status_of(d: &Daemon) -> Option<serde_json::Value> {
    let out = std::process::Command::new(stsd_tests::stsd_bin())
        .args(["status", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_slice(&out.stdout).ok()
}

/// The zygote the daemon names (`stsd status`), other than `not`, once /proc shows it named
/// `stsd-zygote`. Not /proc's oldest `stsd-zygote` child: a worker the killed zygote had just
/// forked keeps that name until it renames itself, and on a busy machine (a worker waits as
/// background work) it could be older than the new zygote, and was killed in its place, mid-call.
fn wait_for_named_zygote(d: &Daemon, not: Option<i32>) -> i32 {
    let t0 = Instant::now();
    loop {
        let named = status_of(d)
            .and_then(|s| s["pool"]["zygotePid"].as_i64())
            .map(|p| p as i32)
            .filter(|p| Some(*p) != not);
        if let Some(p) = named.filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm"))
                .is_ok_and(|c| c.trim() == "stsd-zygote")
        }) {
            return p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no new zygote named"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `zygote_max_forks`: after that many workers a freshly exec'd zygote takes over. Twelve
/// one-shot calls took twelve forked workers, so with a budget of three at least three other
/// zygotes took over (`stsd status` counts them; sampling /proc between calls missed a zygote
/// that lived between two samples on a loaded machine).
#[test]
fn the_zygote_is_replaced_after_its_fork_budget() {
    let d = Daemon::start(1, "[worker]\nzygote_max_forks = 3\n");
    let first = wait_for_zygote(&d, None);
    let mut c = d.connect();
    for i in 0..12u64 {
        c.call(i, "echo-console", json!({ "text": "x" }));
        assert!(!is_error(&c.response()));
    }
    let s = status_of(&d).unwrap_or_else(|| panic!("no status"));
    let h = &s["pool"]["zygoteHandovers"];
    let total = h["ahead"].as_u64().unwrap_or(0) + h["cold"].as_u64().unwrap_or(0);
    assert!(
        total >= 3,
        "handovers after 12 forks with a budget of 3: {h}"
    );
    assert_ne!(
        s["pool"]["zygotePid"].as_i64(),
        Some(i64::from(first)),
        "{s}"
    );
}

/// The zygote that takes over when the live one's fork budget is spent was exec'd ahead (a
/// fifth of the budget before) and had said it was ready, so the forks, and the calls, that
/// come at the handover do not wait for a zygote's start (`stsd status`: `zygoteHandovers`).
/// Before, each new zygote was exec'd by the fork that found the budget spent, and that fork
/// waited for its start.
#[test]
fn the_zygotes_successor_is_started_ahead_and_takes_over() {
    let d = Daemon::start(1, "[worker]\nzygote_max_forks = 10\n");
    let mut c = d.connect();
    let mut seen_next = std::collections::BTreeSet::new();
    let mut live = std::collections::BTreeSet::new();
    let mut handovers = json!(null);
    for i in 0..40u64 {
        c.call(i, "echo-console", json!({ "text": format!("n{i}") }));
        let r = c.response();
        assert_eq!((is_error(&r), text(&r)), (false, format!("echo: n{i}")));
        if let Some(s) = status_of(&d) {
            seen_next.extend(s["pool"]["zygoteNext"].as_i64());
            live.extend(s["pool"]["zygotePid"].as_i64());
            handovers = s["pool"]["zygoteHandovers"].clone();
        }
    }
    // At least 40 forks with a budget of 10: three handovers or more, each counted as it is
    // made. Not `cold == 0`: a fork that times out on a loaded machine retires its zygote, and
    // the next one may be started cold.
    assert!(
        handovers["ahead"].as_u64().is_some_and(|n| n >= 2),
        "handovers {handovers}; live zygotes {live:?}, successors named {seen_next:?}"
    );
}

/// A binary replaced on disk (a package upgrade) does not break the running daemon: the
/// zygote and exec'd workers come from the descriptor it opened at start.
#[test]
fn a_binary_replaced_on_disk_does_not_break_the_running_daemon() {
    for mode in ["zygote", "exec"] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let bin = dir.path().join("stsd-copy");
        std::fs::copy(stsd_tests::stsd_bin(), &bin).unwrap_or_else(|e| panic!("{e}"));
        let bin_s = bin.to_string_lossy().into_owned();
        let d = Daemon::launch_env(
            tempfile::tempdir().unwrap_or_else(|e| panic!("{e}")),
            1,
            &format!("[worker]\nspawn = \"{mode}\"\n"),
            Some(stsd_tests::harness::CATALOG),
            &[],
            None,
            &[("STSD_TEST_BINARY", &bin_s)],
        );
        let mut c = d.connect();
        c.call(1, "echo-console", json!({ "text": "before" }));
        assert!(text(&c.response()).contains("before"), "{mode}");
        // The upgrade: the path now holds something else entirely.
        std::fs::remove_file(&bin).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&bin, "#!/bin/false\n").unwrap_or_else(|e| panic!("{e}"));
        // Force a fresh exec: of the zygote, or of each worker.
        if let Some(z) = zygote_pid(&d) {
            // SAFETY: kill(2) with a pid read from /proc that is the daemon's child.
            unsafe { libc::kill(z, libc::SIGKILL) };
        }
        for i in 2..6u64 {
            c.call(i, "echo-console", json!({ "text": format!("after {i}") }));
            let r = c.response();
            assert!(text(&r).contains(&format!("after {i}")), "{mode}: {r}");
        }
    }
}

/// Workers forked from one zygote inherit one context; Math.random must still differ in
/// each (the engine seeds its state once per context, from the clock), and look like the
/// builtin.
#[test]
fn math_random_differs_in_every_forked_worker() {
    let opts = stsd_tests::exec_options_in(stsd_profiles::baseline::SpawnMode::Zygote);
    let base = stsd_tests::scratch_base();
    let j = stsd_tests::job(
        "const d = Object.getOwnPropertyDescriptor(Math, 'random');
         return [Math.random(), Math.random(), Math.random.name, Math.random.length,
                 d.enumerable, d.writable, d.configurable];",
        stsd_protocol::frames::FsAccess::None,
        base.path(),
    );
    let mut firsts = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let out = stsd::exec::run_job(&j, &opts, &mut |_| {});
        let v: serde_json::Value = match &out.result {
            Ok(stsd::exec::CallValue::Json(t)) => {
                serde_json::from_str(t).unwrap_or_else(|e| panic!("{e}"))
            }
            other => panic!("{other:?}"),
        };
        let (a, b) = (v[0].as_f64().unwrap_or(-1.0), v[1].as_f64().unwrap_or(-1.0));
        assert!(
            (0.0..1.0).contains(&a) && (0.0..1.0).contains(&b) && a != b,
            "{v}"
        );
        assert_eq!(v[2], "random");
        assert_eq!(v[3], 0);
        assert_eq!(v[4], false);
        assert_eq!(v[5], true);
        assert_eq!(v[6], true);
        firsts.insert(a.to_bits());
    }
    assert_eq!(
        firsts.len(),
        6,
        "forked workers repeated a Math.random sequence"
    );
}

/// `stsd status` names the spawn mode and the zygote's pid.
#[test]
fn status_names_the_spawn_mode_and_the_zygote() {
    for mode in ["zygote", "exec"] {
        let d = Daemon::start(1, &format!("[worker]\nspawn = \"{mode}\"\n"));
        let status = || status_of(&d).unwrap_or_else(|| panic!("no status from the daemon"));
        let mut s = status();
        if mode == "zygote" {
            // A starting zygote shows in /proc (as `stsd-zygote`, once it has named itself) and
            // in the daemon's status (once exec returned) at moments of their own: wait until
            // the daemon names the zygote that runs.
            let t0 = Instant::now();
            loop {
                let named = s["pool"]["zygotePid"].as_i64().map(|p| p as i32);
                if named.is_some() && named == zygote_pid(&d) {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "the status names {named:?}, /proc shows {:?}: {s}",
                    zygote_pid(&d)
                );
                std::thread::sleep(Duration::from_millis(20));
                s = status();
            }
        } else {
            assert!(s["pool"]["zygotePid"].is_null(), "{s}");
        }
        assert_eq!(s["pool"]["spawn"], mode, "{s}");
    }
}

/// A forked worker finds its code's page-table entries in place, and, once it has waited for
/// work a little (`inherit::IDLE_BEFORE_OWNING`, 10 ms), its own heap pages too
/// (worker/src/inherit.rs): binding its context and running a small body then take about 10
/// page faults in a release build and 30 in a debug one. A worker that faulted them all in
/// itself took about 90 and 100, a few microseconds each on a VM. A worker given its job at
/// once (as under load) copies the heap pages it writes as it writes them: more faults in
/// the call, less CPU in all.
#[test]
fn a_forked_worker_finds_its_pages_in_place() {
    let opts = stsd_tests::exec_options_in(stsd_profiles::baseline::SpawnMode::Zygote);
    let base = stsd_tests::scratch_base();
    let code = "const xs = [3, 1, 4, 1, 5, 9, 2, 6].map((x) => x * 2);\n\
                return { n: xs.length, s: JSON.stringify(xs.sort((a, b) => a - b)) };";
    let faults = |idle: Duration| {
        let mut f: Vec<u64> = (0..5)
            .map(|_| {
                let j = stsd_tests::job(code, stsd_protocol::frames::FsAccess::None, base.path());
                let w = stsd::exec::spawn_ready(&opts, true)
                    .unwrap_or_else(|e| panic!("no worker: {}", e.message));
                std::thread::sleep(idle);
                let out = stsd::exec::run_on(w, &j, &opts, None, &mut |_| {});
                assert!(out.result.is_ok(), "{:?}", out.result);
                let t = out.timings.worker.faults;
                t[1] + t[2]
            })
            .collect();
        f.sort();
        (f[2], f)
    };
    let (waited, all_waited) = faults(Duration::from_millis(200));
    let (at_once, all_at_once) = faults(Duration::ZERO);
    assert!(
        waited <= 50,
        "page faults binding the context and running the body: {all_waited:?}"
    );
    assert!(
        waited < at_once,
        "a worker that waited owns no more of its heap than one given its job at once: \
         {all_waited:?} vs {all_at_once:?}"
    );
}

/// A call wakes the supervisor once per thing it has to act on: the worker sends its
/// confinement and its timings in the record of its result (worker/src/channel.rs), so a
/// call that prints nothing arrives in one record, with its timings; one console line adds
/// one. Before, Confined and Timings were records of their own, and each one woke the
/// supervisor on the call's path (and the supervisor, woken on the worker's CPU, took it).
#[test]
fn a_call_reaches_the_supervisor_in_as_few_records_as_it_has_things_to_say() {
    use stsd_profiles::baseline::SpawnMode;
    let base = stsd_tests::scratch_base();
    for mode in [SpawnMode::Zygote, SpawnMode::Exec] {
        let opts = stsd_tests::exec_options_in(mode);
        for (code, records) in [
            ("return [3, 1, 4].sort();", 1),
            ("console.log('one line'); return 1;", 2),
            ("throw new Error('thrown');", 1),
        ] {
            let j = stsd_tests::job(code, stsd_protocol::frames::FsAccess::None, base.path());
            let out = stsd::exec::run_job(&j, &opts, &mut |_| {});
            assert!(
                out.result.is_ok() || code.starts_with("throw"),
                "{mode:?} {code}: {:?}",
                out.result
            );
            assert_eq!(out.timings.records, records, "{mode:?} {code}: records");
            // The timings came with the result, not after it.
            assert!(
                out.timings.worker.max_rss_kib > 0,
                "{mode:?} {code}: no timings"
            );
        }
    }
}

/// Each code mapping is made writable for one store in the zygote (inherit.rs), then put
/// back: no mapping of the zygote or of a worker is writable and executable, and the code is
/// still mapped read-execute.
/// The daemon's idle workers (once there is one) and its zygote.
fn idle_workers_and_the_zygote(d: &Daemon) -> Vec<i32> {
    let zygote = wait_for_zygote(d, None);
    d.wait_until("an idle worker", 60, |c| {
        c.iter().any(|w| !w.2 && w.1 != 'Z')
    });
    let mut pids = idle_workers(d);
    assert!(!pids.is_empty(), "no idle worker to look at");
    pids.push(zygote);
    pids
}

#[test]
fn no_mapping_of_the_zygote_or_a_worker_is_writable_and_executable() {
    if stsd_tests::skip_unless_root("reading another user's /proc/PID/maps needs root") {
        return;
    }
    let d = Daemon::start(2, "");
    for pid in idle_workers_and_the_zygote(&d) {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        assert!(
            maps.lines().any(|l| l.contains(" r-xp ")),
            "{pid} has no code mapping: {maps}"
        );
        for line in maps.lines() {
            let perms = line.split_whitespace().nth(1).unwrap_or("");
            assert!(
                !(perms.contains('w') && perms.contains('x')),
                "{pid} maps writable code: {line}"
            );
        }
    }
}

/// stsd is one static executable (.cargo/config.toml): the daemon, the zygote and a worker map
/// no shared object. Dynamically linked, each fork copied and each worker's exit tore down
/// libc's, libm's, libgcc_s's and the loader's mappings (37 mappings a worker against 14).
#[test]
fn the_daemon_the_zygote_and_a_worker_map_no_shared_library() {
    if stsd_tests::skip_unless_root("reading another user's /proc/PID/maps needs root") {
        return;
    }
    let d = Daemon::start(2, "");
    for pid in idle_workers_and_the_zygote(&d).into_iter().chain([d.pid()]) {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        assert!(!maps.is_empty(), "{pid}: no maps to read");
        let shared: Vec<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|path| path.contains(".so"))
            .collect();
        assert!(shared.is_empty(), "{pid} maps shared objects: {shared:?}");
    }
}

const SCHED_IDLE: u32 = 5;

/// The scheduling policy of `pid` (None once it has gone).
fn policy_of(pid: i32) -> Option<u32> {
    stsd_tests::sched_policy(
        &std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default(),
    )
}

/// Workers waiting in the pool were made as background work (SCHED_IDLE: a fork or a
/// worker's start never delays a call) when the daemon may put them back for their calls
/// (root); the zygote, between urgent forks, too. tests/escape.rs checks that a call runs at
/// the normal policy.
#[test]
fn pool_workers_and_the_zygote_wait_at_background_priority() {
    if stsd_tests::skip_unless_root("only a root daemon may put a worker back to normal priority") {
        return;
    }
    let d = Daemon::start(2, "");
    let mut c = d.connect();
    // A call uses a pool worker, which the pool replaces in the background.
    c.call(1, "echo-console", json!({ "text": "x" }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    d.wait_until("two background pool workers", 60, |c| {
        c.iter()
            .filter(|w| !w.2 && w.1 != 'Z' && policy_of(w.0) == Some(SCHED_IDLE))
            .count()
            >= 2
    });
    let zygote = wait_for_zygote(&d, None);
    assert_eq!(policy_of(zygote), Some(SCHED_IDLE), "the zygote");
}

/// `pid`'s group in the v1 CPU hierarchy, or its v2 group when the CPU controller is on
/// there; None when it is in no CPU group of its own (no CPU hierarchy, or v2 without the
/// controller in its group).
fn cpu_group_of(pid: i32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut v2 = None;
    for line in text.lines() {
        let mut f = line.splitn(3, ':').skip(1);
        let (Some(controllers), Some(path)) = (f.next(), f.next()) else {
            continue;
        };
        if controllers.split(',').any(|c| c == "cpu") {
            return Some(path.to_string());
        }
        if controllers.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    let path = v2?;
    let listed = std::fs::read_to_string(format!("/sys/fs/cgroup{path}/cgroup.controllers"))
        .unwrap_or_default();
    listed
        .split_whitespace()
        .any(|c| c == "cpu")
        .then_some(path)
}

/// The daemon's zygote that is in its pool's group (`stsd-<pid>/pool-<n>`), once one is;
/// None if none is within 30 s (no cgroups here: not root, nothing delegated). A zygote
/// made for the catalog's checks at start is in no group, and may still be alive.
fn pooled_zygote(d: &Daemon) -> Option<i32> {
    let group = format!("/stsd-{}/pool-", d.pid());
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        if let Some(z) = zygote_pid(d).filter(|z| {
            std::fs::read_to_string(format!("/proc/{z}/cgroup")).is_ok_and(|c| c.contains(&group))
        }) {
            return Some(z);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Background priority holds against the daemon's callers only while the pool shares their
/// CPU group: a group of the CPU controller is scheduled as one entity beside the processes
/// outside it, and a worker's SCHED_IDLE then orders it only inside the pool (a client woken
/// beside a reused worker making its next context waited about 0.2 ms for it, every call).
/// Without a CPU cap (the default) the pool's zygote stays in the daemon's CPU group; with
/// one, the pool has its own.
#[test]
fn the_pool_shares_the_daemons_cpu_group_unless_it_is_capped() {
    let d = Daemon::start(2, "");
    let Some(zygote) = pooled_zygote(&d) else {
        eprintln!("skipped: the daemon made no cgroups here");
        return;
    };
    assert_eq!(
        cpu_group_of(zygote),
        cpu_group_of(d.pid()),
        "the uncapped pool's zygote"
    );
    drop(d);

    let capped = Daemon::start(2, "[cgroups]\npool_cpu_percent = 50\n");
    let zygote = pooled_zygote(&capped).unwrap_or_else(|| panic!("no pooled zygote"));
    match cpu_group_of(std::process::id() as i32) {
        Some(_) => {
            let group = cpu_group_of(zygote).unwrap_or_default();
            assert!(
                group.contains(&format!("/stsd-{}/pool-", capped.pid())),
                "the capped pool's zygote is in {group:?}"
            );
        }
        None => eprintln!("no CPU controller here: the capped case is not checked"),
    }
}

/// A call that has to wait for a fork (the pool is empty) promotes the zygote to the normal
/// policy for that fork; once no call waits, it goes back to the background. It used to stay
/// promoted until the pool's next fork asked for the background, which the pool's refill,
/// queued behind the call's fork while the call still waited, did not (CI saw it once).
#[test]
fn the_zygote_goes_back_to_the_background_after_a_call_s_fork() {
    if stsd_tests::skip_unless_root("only a root daemon may put the zygote back to normal priority")
    {
        return;
    }
    let d = Daemon::start(1, "");
    let mut clients: Vec<_> = (0..3).map(|_| d.connect()).collect();
    for round in 0..5 {
        // Three calls at once on a pool of one: two of them wait for a fork.
        for (i, c) in clients.iter_mut().enumerate() {
            c.call(
                (round * 3 + i) as u64,
                "echo-console",
                json!({ "text": "x" }),
            );
        }
        for c in &mut clients {
            let r = c.response();
            assert!(!is_error(&r), "{r}");
        }
        d.wait_until("the pool refilled in the background", 60, |c| {
            c.iter()
                .any(|w| !w.2 && w.1 != 'Z' && policy_of(w.0) == Some(SCHED_IDLE))
        });
        let zygote = wait_for_zygote(&d, None);
        let t0 = Instant::now();
        while policy_of(zygote) != Some(SCHED_IDLE) {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "round {round}: the zygote stayed at policy {:?}",
                policy_of(zygote)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The daemon's confined workers that are alive: primed ones, once the calls are over and
/// their workers reaped.
fn confined_workers(d: &Daemon) -> Vec<i32> {
    let mut v: Vec<i32> = d
        .children()
        .iter()
        .filter(|c| c.2 && c.1 != 'Z')
        .map(|c| c.0)
        .collect();
    v.sort();
    v
}

/// Waits until the daemon holds exactly `n` confined workers, the same ones for 300 ms.
fn settle_on_primed(d: &Daemon, n: usize) -> Vec<i32> {
    settle_confined(d, &format!("{n} primed workers"), |now| now.len() == n)
}

/// Waits until the daemon's confined workers are the same ones for 300 ms and they are `fit`
/// (`what` says which, if none come within 20 s).
fn settle_confined(d: &Daemon, what: &str, fit: impl Fn(&[i32]) -> bool) -> Vec<i32> {
    let t0 = Instant::now();
    let mut last = Vec::new();
    let mut since = Instant::now();
    loop {
        let now = confined_workers(d);
        if now != last {
            last = now;
            since = Instant::now();
        } else if fit(&last) && since.elapsed() >= Duration::from_millis(300) {
            return last;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "expected {what}, have {last:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A one-shot call has workers primed for its tool's next calls: confined to its posture
/// (seccomp, no_new_privs, no capability, the unprivileged user) and its body compiled before
/// any argument exists; they hold the tool's code and nothing of the call that asked for
/// them, and the next call goes to one of them.
#[test]
fn a_primed_worker_is_confined_before_its_call_and_holds_nothing_of_earlier_calls() {
    if stsd_tests::skip_unless_root("reading another process's memory needs root") {
        return;
    }
    let d = Daemon::start(2, "[worker]\nprime = true\n");
    let mut c = d.connect();
    let arg = format!("pr-arg-{}-{}", std::process::id(), line!());
    c.call(1, "echo-console", json!({ "text": arg }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    let primed = settle_on_primed(&d, 2);
    for &pid in &primed {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
                .unwrap_or_default()
        };
        assert_eq!(field("NoNewPrivs:"), "1", "{pid}");
        assert_eq!(field("Seccomp:"), "2", "{pid}");
        for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            assert_eq!(field(cap), "0000000000000000", "{pid} {cap}");
        }
        assert!(
            field("Uid:").starts_with("65534 "),
            "{pid}: {}",
            field("Uid:")
        );
        let mem = memory_of(pid);
        assert!(
            contains(&mem, b"console.warn('warned')"),
            "{pid} is not primed with the tool's code ({} bytes read)",
            mem.len()
        );
        assert!(
            !contains(&mem, arg.as_bytes()),
            "{pid} holds the argument of the call that asked for it"
        );
    }
    c.call(2, "echo-console", json!({ "text": "second" }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    assert_eq!(text(&r), "echo: second");
    // One of the two served it (and is gone); its replacement is primed in turn.
    d.wait_until("one primed worker used", 60, |c| {
        primed
            .iter()
            .filter(|p| c.iter().any(|w| w.0 == **p && w.1 != 'Z'))
            .count()
            == 1
    });
}

/// A status field of process `pid`, its words joined by single spaces.
fn status_field(pid: i32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The zygote runs under its own seccomp filter (one, installed before its first fork), and
/// a confined worker stacks exactly one more on it (its posture's narrowing, see
/// `os::zygote_filter`): a worker that installed its whole program instead, or a zygote with
/// none, fails this. What the pair allows is the unit tests' (every syscall number, every
/// posture) and the escape suite's.
#[test]
fn the_zygote_has_its_own_filter_and_a_worker_narrows_it() {
    let d = Daemon::start(2, "[worker]\nprime = true\n");
    let zygote = wait_for_zygote(&d, None);
    let mut c = d.connect();
    c.call(1, "echo-console", json!({ "text": "first" }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    assert_eq!(status_field(zygote, "Seccomp:"), "2", "zygote {zygote}");
    assert_eq!(
        status_field(zygote, "Seccomp_filters:"),
        "1",
        "zygote {zygote}"
    );
    for pid in settle_on_primed(&d, 2) {
        assert_eq!(status_field(pid, "Seccomp:"), "2", "{pid}");
        assert_eq!(status_field(pid, "Seccomp_filters:"), "2", "{pid}");
    }
    c.call(2, "echo-console", json!({ "text": "second" }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    assert_eq!(text(&r), "echo: second");
}

/// A primed call's time starts with its call, not with the priming: a worker primed long
/// before a call that takes most of its timeout still finishes it.
#[test]
fn a_primed_call_gets_its_whole_timeout() {
    let d = Daemon::start(
        2,
        "[baseline]\ntimeout_seconds = 1\n[worker]\nprime = true\n",
    );
    let mut c = d.connect();
    c.call(1, "slow", json!({ "ms": 1 }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    let primed = settle_on_primed(&d, 2);
    std::thread::sleep(Duration::from_millis(1200));
    c.call(2, "slow", json!({ "ms": 600 }));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    assert_eq!(text(&r), "slept 600");
    // The primed worker that served it is killed and reaped off the call path, soon after.
    d.wait_until("a primed worker served the call", 60, |c| {
        primed
            .iter()
            .any(|p| !c.iter().any(|w| w.0 == *p && w.1 != 'Z'))
    });
}

/// Calls answered by primed workers read exactly as calls on workers made for them: an
/// optional argument left out (the body compiled for it is compiled again), then given, a
/// static variable, and globals that do not outlive a call.
#[test]
fn primed_and_unprimed_workers_answer_alike() {
    let calls = [
        ("with-secret", json!({ "count": 3 })),
        ("with-secret", json!({})),
        ("with-secret", json!({ "count": 4 })),
        ("leaky", json!({})),
        ("leaky", json!({})),
        ("leaky", json!({})),
        ("always-fails", json!({})),
        ("always-fails", json!({})),
    ];
    let answers = |prime: bool| -> Vec<(bool, String)> {
        let d = Daemon::start(2, &format!("[worker]\nprime = {prime}\n"));
        let mut c = d.connect();
        calls
            .iter()
            .enumerate()
            .map(|(i, (tool, args))| {
                c.call(i as u64 + 1, tool, args.clone());
                let r = c.response();
                // Time for the next call's worker to be primed.
                std::thread::sleep(Duration::from_millis(100));
                (is_error(&r), text(&r))
            })
            .collect()
    };
    let primed = answers(true);
    assert_eq!(primed, answers(false));
    // `count` given, left out (undefined: not in the JSON), given again.
    assert!(primed[0].1.contains(r#""n":3"#), "{primed:?}");
    assert!(!primed[1].1.contains(r#""n""#), "{primed:?}");
    assert!(primed[2].1.contains(r#""n":4"#), "{primed:?}");
    assert!(
        primed[3..6].iter().all(|a| a == &(false, "1".to_string())),
        "{primed:?}"
    );
}

/// With no room to park (`reuse_max_parked = 0`) nothing is primed, and the pool does not
/// keep making workers to prime and letting them go: a prime that cannot be kept ends its
/// tries (it used to loop, forking, until the daemon stopped).
#[test]
fn priming_with_no_room_to_park_settles() {
    let d = Daemon::start(2, "[worker]\nprime = true\nreuse_max_parked = 0\n");
    let mut c = d.connect();
    c.call(1, "leaky", json!({}));
    let r = c.response();
    assert!(!is_error(&r), "{r}");
    let alive = |d: &Daemon| {
        let mut v: Vec<i32> = d
            .children()
            .iter()
            .filter(|c| c.1 != 'Z')
            .map(|c| c.0)
            .collect();
        v.sort();
        v
    };
    d.wait_until("the pool refilled", 60, |c| {
        c.iter().filter(|w| !w.2 && w.1 != 'Z').count() == 2
    });
    std::thread::sleep(Duration::from_millis(300));
    let before = alive(&d);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(before, alive(&d), "workers still coming and going");
    assert!(
        confined_workers(&d).is_empty(),
        "a worker primed with no room"
    );
}

/// A tool called in bursts has two workers primed for it again after each burst, and the
/// burst's calls run on them. (Two calls that each took a primed worker before the first's
/// replacement was primed used to leave the tool one short, for good.) The tool's body is
/// long, so that priming takes longer than the client's turn between two calls.
#[test]
fn a_tool_called_in_bursts_keeps_two_primed_workers() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut code = String::from("let x = 0;\n");
    for i in 0..3000 {
        code.push_str(&format!("x += {i} % 7;\n"));
    }
    code.push_str("return 'sum ' + x;");
    let specs = json!([{"name": "long", "description": "a long body", "codeType": "Javascript",
        "draft": false, "code": code}]);
    let catalog = write_catalog(&dir, &specs);
    // Four pool workers: the pool has one warm when a primed worker is not ready.
    let d = Daemon::launch_env(
        dir,
        4,
        "[worker]\nprime = true\n",
        Some(&catalog),
        &[],
        None,
        &[("STSD_LOG", "stsd::exec=trace")],
    );
    let mut c = d.connect();
    let mut id = 0u64;
    let mut call = |c: &mut stsd_tests::harness::Conn| {
        id += 1;
        c.call(id, "long", json!({}));
        let r = c.response();
        assert!(!is_error(&r), "{r}");
        assert_eq!(text(&r), "sum 8994");
    };
    call(&mut c);
    let rounds = 6;
    for _ in 0..rounds {
        // Two primed and ready. The first call takes one, and another is primed for the
        // next calls; the second takes the other; the third finds the new one (perhaps
        // still priming: it waits for it rather than take a pool worker).
        settle_on_primed(&d, 2);
        for _ in 0..3 {
            call(&mut c);
        }
    }
    settle_on_primed(&d, 2);
    // The exchange lines are logged before each reply is written.
    let log = d.log();
    let exchanges: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("worker exchange"))
        .collect();
    assert_eq!(exchanges.len(), 1 + 3 * rounds, "{log}");
    let primed = exchanges[1..]
        .iter()
        .filter(|l| l.contains("primed=true"))
        .count();
    // Two of each three at the least, whatever the scheduler does (all three, mostly).
    assert!(
        primed >= 2 * rounds,
        "{primed} of {} calls ran on a primed worker:\n{}",
        3 * rounds,
        exchanges.join("\n")
    );
}

/// Idle workers killed (-9) just before a call, as an operator or the OOM killer might: the
/// call goes to a new worker, since it never reached the killed one. It died waiting in the
/// pool, primed, parked, or making its next context (the job was never sent, or its send
/// failed), or with the job unread in its socket (a worker waiting for work only peeks until
/// the job is there, so a killed one never takes it: the supervisor reads ECONNRESET, not
/// EOF). Before, nearly every such call failed with WORKER_CRASHED ("cannot send the job:
/// EPIPE", "the worker exited while it made its next context", or "died mid-call").
#[test]
fn a_call_whose_worker_was_killed_before_it_got_the_job_goes_to_another() {
    for reuse in ["1", "1000"] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        // Priming on, as a daemon runs by default (the suite turns it off elsewhere).
        let d = Daemon::launch_env(
            dir,
            2,
            "[worker]\nprime = true\n",
            Some(stsd_tests::harness::CATALOG),
            &["--worker-reuse", reuse],
            None,
            &[("STSD_LOG", "stsd=info")],
        );
        let mut c = d.connect();
        let rounds = 16u64;
        let mut failed = Vec::new();
        for i in 0..rounds {
            // A call first, so that the tool has primed (or parked) workers waiting.
            c.call(2 * i, "echo-console", json!({ "text": "before" }));
            assert!(!is_error(&c.response()));
            std::thread::sleep(Duration::from_millis(150));
            // Every worker: waiting in the pool, primed or parked (those are confined).
            for (pid, _, _) in d.children().into_iter().filter(|c| c.1 != 'Z') {
                // SAFETY: kill(2) with a pid read from /proc that is the daemon's child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let want = format!("after-{i}");
            c.call(2 * i + 1, "echo-console", json!({ "text": want }));
            let r = c.response();
            if is_error(&r) || !text(&r).contains(&want) {
                failed.push(r);
            }
        }
        // The outcome only: whether a killed worker is still in the pool when the call takes
        // one (and so whether the call is retried) is the scheduler's choice. The test below
        // makes the retry certain.
        assert!(failed.is_empty(), "reuse {reuse}: calls failed: {failed:?}");
    }
}

/// How many pool workers have said Ready, by the daemon's status (None: no answer).
fn pool_ready(d: &Daemon) -> Option<i64> {
    status_of(d)?.pointer("/pool/ready")?.as_i64()
}

/// Waits (up to 20 s) for `cond`, polling every 5 ms; panics with `what` when it never holds.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The retry of the test above, made certain rather than left to the scheduler. The zygote
/// and every worker are stopped (SIGSTOP: alive, so the pool hands one out, and nothing new is
/// made); a call is sent, and takes one of them: it is seen as that worker is put back to the
/// normal policy (SCHED_OTHER, 0) as its call begins. Only then is every worker killed, with the job unread
/// or not yet sent. The call goes to a worker made once the zygote runs again, and answers.
#[test]
fn a_worker_killed_after_the_call_took_it_but_before_it_read_the_job_is_replaced() {
    if stsd_tests::skip_unless_root("only a root daemon puts a worker back to normal priority") {
        return;
    }
    for reuse in ["1", "1000"] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let d = Daemon::launch_env(
            dir,
            2,
            "[worker]\nprime = false\n",
            Some(stsd_tests::harness::CATALOG),
            &["--worker-reuse", reuse],
            None,
            &[("STSD_LOG", "stsd=info")],
        );
        let mut c = d.connect();
        c.call(1, "echo-console", json!({ "text": "before" }));
        assert!(!is_error(&c.response()));
        // Settled: the pool is full (and, with reuse, the first call's worker parked), every
        // worker waiting as background work.
        let live = || -> Vec<i32> {
            d.children()
                .into_iter()
                .filter(|w| w.1 != 'Z')
                .map(|w| w.0)
                .collect()
        };
        // Both pool workers have said Ready (the daemon's count): a worker still starting is
        // idle too, and were both of them starting when everything is stopped, the call would
        // ask the stopped zygote for a worker and never take one.
        let want = if reuse == "1" { 2 } else { 3 };
        wait_until(&format!("reuse {reuse}: {want} idle workers"), || {
            let w = live();
            pool_ready(&d) == Some(2)
                && w.len() >= want
                && w.iter().all(|p| policy_of(*p) == Some(SCHED_IDLE))
        });
        let zygote = wait_for_zygote(&d, None);
        // SAFETY: kill(2) on the daemon's zygote and its workers, pids read from /proc.
        unsafe { libc::kill(zygote, libc::SIGSTOP) };
        // Stopped first, the zygote forks nothing more: this list is every worker there is.
        let workers = live();
        for &w in &workers {
            // SAFETY: as above.
            unsafe { libc::kill(w, libc::SIGSTOP) };
        }
        c.call(2, "echo-console", json!({ "text": "after" }));
        wait_until(&format!("reuse {reuse}: the call took a worker"), || {
            workers.iter().any(|p| policy_of(*p) == Some(0))
        });
        for &w in &workers {
            // SAFETY: as above.
            unsafe { libc::kill(w, libc::SIGKILL) };
        }
        // SAFETY: as above.
        unsafe { libc::kill(zygote, libc::SIGCONT) };
        let r = c.response();
        assert!(
            !is_error(&r) && text(&r).contains("after"),
            "reuse {reuse}: {r}"
        );
        assert!(
            d.log().contains("the call goes to a new worker"),
            "reuse {reuse}: the call was not retried:\n{}",
            d.log()
        );
    }
}

/// A daemon (pool 2) that has served one call and settled, and its zygote.
fn settled_after_one_call() -> (Daemon, i32) {
    let d = Daemon::start(2, "");
    let mut c = d.connect();
    c.call(1, "echo-console", json!({ "text": "settle" }));
    assert!(!is_error(&c.response()));
    std::thread::sleep(Duration::from_millis(300));
    let zygote = wait_for_zygote(&d, None);
    (d, zygote)
}

/// A memfd mapping of `pid` as /proc/PID/smaps shows it, sizes in KiB.
#[derive(Debug, Default)]
struct MemfdMapping {
    start: u64,
    end: u64,
    perms: String,
    size: u64,
    rss: u64,
    anonymous: u64,
    /// Mapped by huge-page (PMD) entries.
    huge: u64,
}

/// Each `/memfd:NAME` mapping of `pid`.
fn memfd_mappings(pid: i32, name: &str) -> Vec<MemfdMapping> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<MemfdMapping> = Vec::new();
    let mut ours = false;
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(first) = f.first() else { continue };
        if first.contains('-') && !first.ends_with(':') {
            ours = line.contains(&format!("/memfd:{name} "));
            if ours {
                let (a, b) = first.split_once('-').unwrap_or(("0", "0"));
                out.push(MemfdMapping {
                    start: u64::from_str_radix(a, 16).unwrap_or(0),
                    end: u64::from_str_radix(b, 16).unwrap_or(0),
                    perms: f.get(1).unwrap_or(&"").to_string(),
                    ..MemfdMapping::default()
                });
            }
            continue;
        }
        let (Some(last), true) = (out.last_mut(), ours) else {
            continue;
        };
        let kib = f.get(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match *first {
            "Size:" => last.size = kib,
            "Rss:" => last.rss = kib,
            "Anonymous:" => last.anonymous = kib,
            "ShmemPmdMapped:" => last.huge = kib,
            _ => {}
        }
    }
    out
}

/// The data the loader relocates and then makes read-only (RELRO: vtables, the GOT; about
/// 1.6 MiB in stsd) is held by the zygote in a sealed memfd, read-only, rather than in
/// anonymous pages: fork copies none of its page-table entries into a worker, and an idle
/// worker has mapped only the few pages it read. (As anonymous pages, every worker got all of
/// them at fork and cleared them again at exit: about 8% of a one-shot call's CPU here.)
#[test]
fn relocated_read_only_data_is_file_pages_a_worker_maps_as_it_reads() {
    if stsd_tests::skip_unless_root("reading the zygote's smaps needs root (it is not dumpable)") {
        return;
    }
    let (d, zygote) = settled_after_one_call();
    let z = memfd_mappings(zygote, "stsd-relro");
    let own = z.iter().map(|m| m.size).max().unwrap_or(0);
    assert!(own >= 256, "stsd's RELRO is not in a memfd: {z:?}");
    for m in &z {
        assert_eq!((m.anonymous, m.perms.as_str()), (0, "r--p"), "{z:?}");
    }
    let idle = idle_workers(&d);
    assert!(!idle.is_empty(), "no idle worker");
    for pid in idle {
        let w = memfd_mappings(pid, "stsd-relro");
        let (size, rss) = w.iter().fold((0, 0), |(s, r), m| (s + m.size, r + m.rss));
        assert!(size >= own, "worker {pid}: {w:?}");
        assert!(w.iter().all(|m| m.anonymous == 0), "worker {pid}: {w:?}");
        // As anonymous pages a worker had all of it; as file pages, what it read (about a
        // quarter of stsd's RELRO, which grows with the crates linked in: under half).
        assert!(rss * 2 < size, "worker {pid} maps most of it: {w:?}");
    }
}

/// Whether this kernel makes huge pages of a memfd on request (`MADV_COLLAPSE`, Linux 6.1,
/// unless shared-memory huge pages are denied): what the zygote's huge code needs.
fn memfd_collapses() -> bool {
    const HUGE: usize = 2 << 20;
    // SAFETY: a memfd and mappings of this function's own, unmapped and closed before it
    // returns.
    unsafe {
        let fd = libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let sized = libc::ftruncate(fd, HUGE as libc::off_t) == 0;
        let span = 2 * HUGE;
        let none = libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        let mut ok = false;
        if sized && none != libc::MAP_FAILED {
            let aligned = (none as usize + HUGE - 1) & !(HUGE - 1);
            let at = libc::mmap(
                aligned as *mut libc::c_void,
                HUGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            );
            if at == aligned as *mut libc::c_void {
                libc::memset(at, 1, HUGE);
                ok = libc::madvise(at, HUGE, 25 /* MADV_COLLAPSE */) == 0;
            }
            libc::munmap(none, span);
        }
        libc::close(fd);
        ok
    }
}

/// True (and says why) when this test cannot see the zygote's huge code: not root (the zygote
/// is not dumpable), or a kernel that makes no huge pages of a memfd.
fn skip_unless_huge_code() -> bool {
    if stsd_tests::skip_unless_root("reading the zygote's maps needs root (it is not dumpable)") {
        return true;
    }
    if !memfd_collapses() {
        eprintln!("skipped: this kernel does not make huge pages of a memfd (MADV_COLLAPSE)");
        return true;
    }
    false
}

/// Bytes of `pid`'s own executable mapped executable from the file itself (small pages), not
/// from the code memfd.
fn small_code_bytes(pid: i32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let exe = exe.to_string_lossy().to_string();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter(|l| l.contains(" r-xp ") && l.ends_with(exe.as_str()))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
        })
        .sum()
}

/// stsd's code is held by the zygote in huge pages (a sealed memfd mapped over it, read-only
/// and executable), and a worker maps each 2 MiB block of it that it runs with one page-table
/// entry: fork copies none of the code's entries and exit clears a handful, where 4 KiB pages
/// cost every one-shot worker about a thousand of each. Nothing can write the memfd.
#[test]
fn the_code_is_huge_pages_a_worker_maps_a_block_at_a_time() {
    if skip_unless_huge_code() {
        return;
    }
    // A block becomes a huge page only where the kernel finds a free 2 MiB of memory
    // (MADV_COLLAPSE); on a machine whose memory is fragmented (a CI run's parallel builds
    // and daemons: 17.8 MB of the code stayed small once) it keeps the small pages, by
    // design. What this test asserts is the zygote's part, so the kernel's is given its
    // chance first: compacted memory (root, which the skip above ensured).
    //
    // Compacting does not always leave a free 2 MiB for every block when the test runs beside
    // the rest of a CI run (11.8 MB of the code stayed small once after it): a daemon whose
    // first zygote left a block small is replaced by a fresh one (which makes its own code
    // memfd), up to three in all. A zygote that never replaces a block fails every time.
    let mut tries = 0;
    let (d, zygote) = loop {
        tries += 1;
        let _ = std::fs::write("/proc/sys/vm/compact_memory", "1");
        let (d, zygote) = settled_after_one_call();
        if tries == 3 || small_code_bytes(zygote) == 0 {
            break (d, zygote);
        }
        eprintln!("try {tries}: the kernel left a block of the code small; a fresh daemon");
    };
    let z = memfd_mappings(zygote, "stsd-code");
    // The binary's code segment starts on a 2 MiB boundary (supervisor/build.rs), and the
    // next segment on the next one: all of it, its last partial block padded, is in huge
    // pages.
    let size: u64 = z.iter().map(|m| m.size).sum();
    assert!(size >= 8 << 10, "stsd's code is not in huge pages: {z:?}");
    for m in &z {
        assert_eq!((m.anonymous, m.perms.as_str()), (0, "r-xp"), "{z:?}");
        assert_eq!(
            m.rss, m.huge,
            "zygote maps part of its code by small pages: {z:?}"
        );
    }
    let exe = std::fs::read_link(format!("/proc/{zygote}/exe")).unwrap_or_default();
    let exe = exe.to_string_lossy().to_string();
    let maps = std::fs::read_to_string(format!("/proc/{zygote}/maps")).unwrap_or_default();
    assert!(
        maps.lines().any(|l| l.ends_with(exe.as_str())),
        "the zygote maps nothing of {exe}"
    );
    let small = small_code_bytes(zygote);
    assert_eq!(
        small, 0,
        "{small} bytes of the code of {exe} are left in small pages (its last block?)"
    );
    let idle = idle_workers(&d);
    assert!(!idle.is_empty(), "no idle worker");
    for pid in idle {
        let w = memfd_mappings(pid, "stsd-code");
        let rss: u64 = w.iter().map(|m| m.rss).sum();
        assert!(rss > 0, "worker {pid} runs no huge-page code: {w:?}");
        for m in &w {
            assert_eq!(m.anonymous, 0, "worker {pid}: {w:?}");
            assert_eq!(
                m.rss, m.huge,
                "worker {pid} maps code by small pages: {w:?}"
            );
        }
    }
    // Sealed: not even root, through the zygote's own mapping, can change a byte of it.
    let m = &z[0];
    let path = format!("/proc/{zygote}/map_files/{:x}-{:x}", m.start, m.end);
    let f = std::fs::OpenOptions::new().write(true).open(&path);
    let written = f.and_then(|mut f| std::io::Write::write(&mut f, b"\xcc"));
    let err = written.expect_err("the code memfd took a write");
    assert_eq!(err.raw_os_error(), Some(libc::EPERM), "{path}: {err}");
}

/// (start address, inode) of each `/memfd:stsd-code` mapping of `pid`.
fn code_memfds(pid: i32) -> Vec<(String, String)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        .filter(|l| l.contains("/memfd:stsd-code "))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let start = f.first()?.split('-').next()?.to_string();
            Some((start, f.get(4)?.to_string()))
        })
        .collect()
}

/// A zygote that replaces another maps the code memfd the first one made (the supervisor keeps
/// it and passes it on), instead of copying and collapsing 18 MiB again; at an address of its
/// own, since every zygote is a fresh exec with a fresh layout.
#[test]
fn a_new_zygote_maps_the_code_its_predecessor_made_at_its_own_address() {
    if skip_unless_huge_code() {
        return;
    }
    let d = Daemon::start(1, "[worker]\nzygote_max_forks = 3\n");
    let mut seen: std::collections::BTreeMap<i32, Vec<(String, String)>> = Default::default();
    let mut c = d.connect();
    // Calls until three zygotes have been seen with their code mapped: each is sampled
    // between calls, and on a loaded machine one may be replaced before it is sampled, or
    // sampled before it has mapped its code. The deadline only bounds a failure.
    let until = Instant::now() + Duration::from_secs(90);
    let mut i = 0u64;
    while seen.len() < 3 && Instant::now() < until {
        if let Some(z) = zygote_pid(&d) {
            let code = code_memfds(z);
            if !code.is_empty() {
                seen.insert(z, code);
            }
        }
        c.call(i, "echo-console", json!({ "text": "x" }));
        assert!(!is_error(&c.response()));
        i += 1;
    }
    assert!(
        seen.len() >= 3,
        "zygotes with huge code seen in {i} calls: {seen:?}"
    );
    let inodes: std::collections::BTreeSet<&String> =
        seen.values().flatten().map(|m| &m.1).collect();
    assert_eq!(inodes.len(), 1, "each zygote made its own: {seen:?}");
    let starts: std::collections::BTreeSet<&String> =
        seen.values().flatten().map(|m| &m.0).collect();
    assert!(
        starts.len() >= 2,
        "every zygote's code at one address: {seen:?}"
    );
}

/// `[worker] huge_code = false`: the zygote leaves its code as the loader mapped it.
#[test]
fn huge_code_off_leaves_the_code_in_small_pages() {
    if skip_unless_huge_code() {
        return;
    }
    let d = Daemon::start(1, "[worker]\nhuge_code = false\n");
    let mut c = d.connect();
    c.call(1, "echo-console", json!({ "text": "small" }));
    assert!(!is_error(&c.response()));
    let zygote = wait_for_zygote(&d, None);
    let maps = std::fs::read_to_string(format!("/proc/{zygote}/maps")).unwrap_or_default();
    assert!(maps.contains(" r-xp "), "no code mapping read: {maps}");
    assert!(code_memfds(zygote).is_empty(), "{maps}");
}

/// Issue 33 item 7: a zygote that is alive but does not answer (SIGSTOP) is taken for hung
/// after `[worker] fork_timeout_ms`, killed and replaced, and the calls that needed a worker
/// meanwhile are served by the next zygote: none fails, none is called a crash. Before: it
/// was replaced only after 10 s, and calls that never ran failed as WORKER_CRASHED.
#[test]
fn a_hung_zygote_is_replaced_and_no_call_fails() {
    let d = Daemon::start(1, "[worker]\nfork_timeout_ms = 300\n");
    let mut c = d.connect();
    c.call(1, "echo-console", json!({ "text": "warm" }));
    assert!(!is_error(&c.response()));
    let hung = wait_for_zygote(&d, None);
    // SAFETY: kill(2) with a pid read from /proc that is the daemon's child.
    unsafe { libc::kill(hung, libc::SIGSTOP) };
    let mut answers = Vec::new();
    for i in 0..4u64 {
        c.call(10 + i, "echo-console", json!({ "text": format!("n{i}") }));
        let r = c.response();
        answers.push((is_error(&r), text(&r)));
    }
    let replaced = wait_for_zygote(&d, Some(hung));
    // In case it is still there: let it go (it is killed if it is not already).
    // SAFETY: as above.
    unsafe { libc::kill(hung, libc::SIGCONT) };
    let want: Vec<(bool, String)> = (0..4).map(|i| (false, format!("echo: n{i}"))).collect();
    assert_eq!(answers, want, "calls while the zygote hung");
    assert_ne!(replaced, hung);
    let recs = d.audit_records();
    assert!(
        recs.iter().all(|r| r["outcome"] == "OK"),
        "a call failed: {recs:?}"
    );
}

/// A primed worker loads the parts of Intl its tool's code names before the call (see
/// `globals::preload_intl`); its answers are those of a worker that loads them in the call,
/// a tool that shadows `Intl` or replaces a locale method (before or after Intl loads)
/// included. In the primed daemon every call but a tool's first runs on a primed worker
/// (the trace says so): the pool is let settle before each.
#[test]
fn primed_workers_answer_intl_calls_as_unprimed_ones() {
    if stsd_tests::skip_unless_root("telling primed workers apart needs root") {
        return;
    }
    let tools = [
        ("nf", "return new Intl.NumberFormat('de').format(1234567.891);", "1.234.567,891"),
        ("sort", "return ['z','ä','a','Ö','o'].sort((a, b) => a.localeCompare(b)).join(',');", "a,ä,o,Ö,z"),
        ("ko", "return new Date(Date.UTC(2024, 0, 15)).toLocaleDateString('ko-KR', {dateStyle: 'full', timeZone: 'UTC'});", "2024년 1월 15일 월요일"),
        ("shadow", "const Intl = 1; return typeof Intl + ',' + 'b'.localeCompare('a');", "number,1"),
        ("replaced", "String.prototype.localeCompare = () => 7; return 'b'.localeCompare('a') + ',' + (1234.5).toLocaleString('en-US');", "7,1,234.5"),
        ("replaced-first", "String.prototype.localeCompare = () => 7; (1).toLocaleString(); return 'b'.localeCompare('a');", "7"),
    ];
    let specs: Vec<_> = tools
        .iter()
        .map(|(name, code, _)| {
            json!({"name": name, "description": "Intl", "codeType": "Javascript",
            "draft": false, "code": code})
        })
        .collect();
    let answers = |prime: bool| -> Vec<(bool, String)> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let catalog = write_catalog(&dir, &json!(specs));
        let config = format!("[worker]\nprime = {prime}\n");
        let d = Daemon::launch_env(
            dir,
            2,
            &config,
            Some(&catalog),
            &[],
            None,
            &[("STSD_LOG", "stsd::exec=trace")],
        );
        let mut c = d.connect();
        let mut out = Vec::new();
        let mut id = 0;
        for (name, _, _) in &tools {
            // The first call asks for primed workers; the next ones find them, made.
            for _ in 0..3 {
                id += 1;
                let before = if prime {
                    confined_workers(&d)
                } else {
                    Vec::new()
                };
                c.call(id, name, json!({}));
                let r = c.response();
                out.push((is_error(&r), text(&r)));
                if prime {
                    // The priming this call asked for is done: a worker primed since (only
                    // this tool wants primes now), two primed in all (the tool's two; the
                    // call's own worker gone), and nothing changing any more. Workers primed
                    // for the tool before are not enough to tell.
                    settle_confined(&d, "two workers, one primed after the call", |now| {
                        now.len() == 2 && now.iter().any(|p| !before.contains(p))
                    });
                }
            }
        }
        if prime {
            let log = d.log();
            let exchanges: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("worker exchange"))
                .collect();
            assert_eq!(exchanges.len(), 3 * tools.len(), "{log}");
            for (i, l) in exchanges.iter().enumerate() {
                assert_eq!(l.contains("primed=true"), i % 3 != 0, "call {i}: {l}");
            }
        }
        out
    };
    let primed = answers(true);
    let want: Vec<(bool, String)> = tools
        .iter()
        .flat_map(|(_, _, want)| std::iter::repeat_n((false, want.to_string()), 3))
        .collect();
    assert_eq!(primed, want);
    assert_eq!(answers(false), want);
}

/// A worker primed with `want_bytecode` hands on its body's bytecode ahead of its Ready, and a
/// later worker given bytecode for its source runs that bytecode rather than parsing the
/// source, primed or not. Shown with a forgery only a test can make (the daemon gives a key's
/// bytecode to that key's workers, for the very source it was made from): tool A's bytecode
/// labelled as tool B's source makes B's call answer as A. A prime that does not ask hands
/// none on, and bytecode that does not read is parsed instead.
#[test]
fn a_primed_workers_bytecode_is_what_later_workers_run() {
    use std::sync::Arc;
    use stsd_protocol::frames::{Bytecode, FsAccess, Prime};
    let opts = stsd_tests::exec_options();
    let base = stsd_tests::scratch_base();
    let a = stsd_tests::job("return 'from A';", FsAccess::None, base.path());
    let b = stsd_tests::job("return 'from B';", FsAccess::None, base.path());
    let prime = |job: &stsd_protocol::frames::Job, want_bytecode: bool| {
        Arc::new(Prime {
            job: job.template(),
            expect_args: Vec::new(),
            want_bytecode,
        })
    };
    let answer = |out: stsd::exec::CallOutcome| match out.result {
        Ok(stsd::exec::CallValue::Json(t)) => t,
        other => panic!("{other:?}"),
    };
    let worker = || stsd::exec::spawn_ready(&opts, true).unwrap_or_else(|e| panic!("{e:?}"));

    let mut w = worker();
    w.prime(prime(&a, true)).unwrap_or_else(|e| panic!("{e}"));
    let made = w
        .await_primed(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e:?}"));
    let made = made.unwrap_or_else(|| panic!("no bytecode from a prime that asked"));
    assert_eq!(made.source, a.wrapped_body(&a.wrapper_prefix()));
    assert!(!made.bytes.is_empty());
    assert_eq!(
        answer(stsd::exec::run_on(w, &a, &opts, None, &mut |_| {})),
        "\"from A\""
    );

    let forged = Bytecode {
        source: b.wrapped_body(&b.wrapper_prefix()),
        bytes: made.bytes,
    };
    // Primed with it.
    let mut w = worker();
    let mut p = (*prime(&b, false)).clone();
    p.job.bytecode = Some(forged.clone());
    w.prime(Arc::new(p)).unwrap_or_else(|e| panic!("{e}"));
    // A prime that did not ask for bytecode hands none on.
    assert!(w.await_primed(Duration::from_secs(10)).is_err());
    assert_eq!(
        answer(stsd::exec::run_on(w, &b, &opts, None, &mut |_| {})),
        "\"from A\""
    );
    // Given it with the job.
    let mut given = b.clone();
    given.bytecode = Some(forged);
    assert_eq!(
        answer(stsd::exec::run_job(&given, &opts, &mut |_| {})),
        "\"from A\""
    );
    // Without it, B is B; and bytecode that does not read is parsed instead.
    assert_eq!(
        answer(stsd::exec::run_job(&b, &opts, &mut |_| {})),
        "\"from B\""
    );
    let mut unreadable = b.clone();
    unreadable.bytecode = Some(Bytecode {
        source: b.wrapped_body(&b.wrapper_prefix()),
        bytes: vec![0; 16],
    });
    assert_eq!(
        answer(stsd::exec::run_job(&unreadable, &opts, &mut |_| {})),
        "\"from B\""
    );
}

/// One-shot with priming: the first worker primed for a tool hands its body's bytecode to the
/// pool (`stsd status`: `pool.bytecodes`), one per tool, and the calls after it (on workers
/// primed with it, or given it with their job) answer as the first did.
#[test]
fn the_pool_keeps_each_tools_bytecode_from_its_first_primed_worker() {
    let d = Daemon::start(2, "[worker]\nprime = true\n");
    let bytecodes = |d: &Daemon| status_of(d)?.pointer("/pool/bytecodes")?.as_i64();
    assert_eq!(bytecodes(&d), Some(0));
    let mut c = d.connect();
    c.call(1, "leaky", json!({}));
    let r = c.response();
    assert_eq!(text(&r), "1", "{r}");
    wait_until("the tool's bytecode is kept", || bytecodes(&d) == Some(1));
    for i in 2..8 {
        c.call(i, "leaky", json!({}));
        let r = c.response();
        assert_eq!(text(&r), "1", "call {i}: {r}");
    }
    c.call(8, "with-secret", json!({ "count": 3 }));
    let r = c.response();
    assert!(text(&r).contains(r#""n":3"#), "{r}");
    wait_until("each tool's bytecode is kept", || bytecodes(&d) == Some(2));
    c.call(9, "with-secret", json!({ "count": 4 }));
    let r = c.response();
    assert!(text(&r).contains(r#""n":4"#), "{r}");
}

fn prime_of(code: &str) -> std::sync::Arc<stsd_protocol::frames::Prime> {
    let base = std::env::temp_dir();
    let j = stsd_tests::job(code, stsd_protocol::frames::FsAccess::None, &base);
    std::sync::Arc::new(stsd_protocol::frames::Prime {
        job: j.template(),
        expect_args: Vec::new(),
        want_bytecode: false,
    })
}

/// Whether `pid` is gone (reaped: no /proc entry) within 10 s.
fn gone(pid: u32) -> bool {
    let t0 = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        if t0.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// One template per key, for the prime it was made with: kept while the prime is the same,
/// replaced (the old one killed and reaped) when the prime changes or its forks run out; at
/// most as many as allowed, the least recently used going first; and gone once idle. Its
/// children run their calls.
#[test]
fn a_template_is_kept_per_key_and_prime_and_replaced_when_either_runs_out() {
    use stsd::exec::template::Templates;
    let opts = stsd_tests::exec_options_in(stsd_profiles::baseline::SpawnMode::Zygote);
    let (one, two, three) = (
        prime_of("return 1;"),
        prime_of("return 2;"),
        prime_of("return 3;"),
    );
    let ts = Templates::new(2, 3);
    let fork = |key: &str, p| {
        ts.fork(key, p, &opts)
            .unwrap_or_else(|e| panic!("{key}: no child: {e}"))
    };
    let first = fork("a", &one);
    let made = ts.list();
    assert_eq!(made.len(), 1);
    let a = made[0].0;
    drop(fork("a", &one));
    drop(fork("a", &one));
    assert_eq!(ts.list(), [(a, 3)], "the same template, three forks");
    // A child runs its call.
    let j = stsd_tests::job(
        "return 1;",
        stsd_protocol::frames::FsAccess::None,
        &std::env::temp_dir(),
    );
    let out = stsd::exec::run_on(first, &j, &opts, None, &mut |_| {});
    assert!(
        matches!(&out.result, Ok(stsd::exec::CallValue::Json(v)) if v == "1"),
        "{out:?}"
    );
    // Its forks ran out: replaced.
    drop(fork("a", &one));
    let a2 = ts.list()[0].0;
    assert_ne!(a2, a);
    assert!(gone(a), "the replaced template {a} lives on");
    // Another prime under the key (its code changed): replaced.
    drop(fork("a", &two));
    let a3 = ts.list()[0].0;
    assert_ne!(a3, a2);
    assert!(gone(a2), "the replaced template {a2} lives on");
    // A third key beside two: the least recently used ("a") goes.
    drop(fork("b", &one));
    drop(fork("c", &three));
    assert_eq!(ts.list().len(), 2);
    assert!(gone(a3), "the least recently used template {a3} lives on");
    // Idle: all go.
    let left = ts.list();
    let expired = ts.take_expired(
        Instant::now() + Duration::from_secs(3600),
        Duration::from_secs(60),
    );
    assert_eq!(expired.len(), 2);
    assert!(ts.list().is_empty());
    drop(expired);
    for (pid, _) in left {
        assert!(gone(pid), "the idle template {pid} lives on");
    }
}

/// A daemon's primed workers come from their tool's template once the tool's bytecode is
/// known (`stsd status` names it and counts its forks); the template runs under the zygote's
/// filter alone and holds nothing of any call. With `[worker] template = false` there is none.
#[test]
fn a_tools_primed_workers_are_forked_by_its_template_which_holds_nothing_of_any_call() {
    if stsd_tests::spawn_mode_from_env() == Some(stsd_profiles::baseline::SpawnMode::Exec) {
        eprintln!("skipped: templates are made only in zygote mode");
        return;
    }
    let d = Daemon::start(2, "[worker]\nprime = true\n");
    let mut c = d.connect();
    let arg = format!("tpl-arg-{}-{}", std::process::id(), line!());
    // The first call has two workers primed for the tool: the first from the pool (it hands
    // on the body's bytecode), the second from the template. Each later call takes one of
    // them (it waits here until both are ready) and has one more forked.
    for i in 0..4 {
        c.call(i, "echo-console", json!({ "text": arg }));
        let r = c.response();
        assert!(!is_error(&r), "{r}");
        settle_on_primed(&d, 2);
    }
    let t0 = Instant::now();
    let (pid, forks) = loop {
        let s = status_of(&d).unwrap_or_default();
        let t = &s["pool"]["templates"];
        if let Some(t) = t.as_array().and_then(|a| a.first()) {
            let forks = t["forks"].as_u64().unwrap_or(0);
            if forks >= 3 {
                break (t["pid"].as_i64().unwrap_or(0) as i32, forks);
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no template forked three children: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(forks >= 3);
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "stsd-template");
    assert_eq!(status_field(pid, "Seccomp_filters:"), "1", "template {pid}");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1", "template {pid}");
    if !stsd_tests::is_root() {
        return;
    }
    let mem = memory_of(pid);
    assert!(
        contains(&mem, b"stsd-prelude.js"),
        "the scan of {pid} cannot see the runtime it must hold ({} bytes read)",
        mem.len()
    );
    assert!(
        !contains(&mem, arg.as_bytes()),
        "the template {pid} holds a call's argument"
    );
    drop(c);
    drop(d);
    let d = Daemon::start(2, "[worker]\nprime = true\ntemplate = false\n");
    let mut c = d.connect();
    for i in 0..6 {
        c.call(i, "echo-console", json!({ "text": "x" }));
        let r = c.response();
        assert!(!is_error(&r), "{r}");
    }
    settle_on_primed(&d, 2);
    let s = status_of(&d).unwrap_or_default();
    assert_eq!(s["pool"]["templates"], json!([]), "{s}");
}

/// A template loads the Intl its tool's code names once, before its first fork: its memory
/// holds a default collator made (the JSON of its options, which only constructing one
/// writes), and so every child it forks inherits it loaded instead of loading it as it
/// primes. A template of a tool whose code names no Intl holds none.
#[test]
fn a_template_loads_the_intl_its_tools_code_names_once_for_all_its_children() {
    if stsd_tests::spawn_mode_from_env() == Some(stsd_profiles::baseline::SpawnMode::Exec) {
        eprintln!("skipped: templates are made only in zygote mode");
        return;
    }
    if stsd_tests::skip_unless_root("reading a template's memory needs root") {
        return;
    }
    let tools = [
        (
            "sorts",
            "return ['z','ä','a'].sort((a, b) => a.localeCompare(b)).join(',');",
        ),
        ("plain", "return [3, 1, 2].sort().join(',');"),
    ];
    let specs: Vec<_> = tools
        .iter()
        .map(|(name, code)| {
            json!({"name": name, "description": "template Intl", "codeType": "Javascript",
            "draft": false, "code": code})
        })
        .collect();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let catalog = write_catalog(&dir, &json!(specs));
    let d = Daemon::launch(
        dir,
        2,
        "[worker]\nprime = true\n",
        Some(&catalog),
        &[],
        None,
    );
    let mut c = d.connect();
    let mut id = 0;
    let mut call = |name: &str| {
        id += 1;
        c.call(id, name, json!({}));
        let r = c.response();
        assert!(!is_error(&r), "{name}: {r}");
    };
    let collator = br#""sensitivity":"variant""#;
    let sorts = call_until_template(&d, None, || call("sorts"));
    assert!(
        contains(&memory_of(sorts), collator),
        "the template {sorts} of a tool that sorts with localeCompare has no collator made"
    );
    let plain = call_until_template(&d, Some(sorts), || call("plain"));
    let mem = memory_of(plain);
    assert!(
        contains(&mem, b"stsd-prelude.js"),
        "the scan of {plain} cannot see the runtime it must hold ({} bytes read)",
        mem.len()
    );
    assert!(
        !contains(&mem, collator),
        "the template {plain} of a tool that names no Intl made a collator"
    );
}

/// The pid of a template that `stsd status` names with at least one fork, other than `not`.
/// Calls are what has templates made and forking, so `call` is made between looks, until one
/// is there (two minutes at most: on CPUs that other work keeps busy, the background waits).
fn call_until_template(d: &Daemon, not: Option<i32>, mut call: impl FnMut()) -> i32 {
    let t0 = Instant::now();
    loop {
        call();
        let s = status_of(d).unwrap_or_default();
        let found = s["pool"]["templates"].as_array().and_then(|a| {
            a.iter()
                .filter(|t| t["forks"].as_u64().unwrap_or(0) >= 1)
                .map(|t| t["pid"].as_i64().unwrap_or(0) as i32)
                .find(|p| Some(*p) != not)
        });
        if let Some(pid) = found {
            return pid;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no template with a fork (other than {not:?}): {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A template killed (-9) while calls come: every call is answered, and the tool gets a new
/// template.
#[test]
fn killing_a_template_loses_no_call_and_the_tool_gets_another() {
    if stsd_tests::spawn_mode_from_env() == Some(stsd_profiles::baseline::SpawnMode::Exec) {
        eprintln!("skipped: templates are made only in zygote mode");
        return;
    }
    let d = Daemon::start(2, "[worker]\nprime = true\n");
    let mut c = d.connect();
    let mut id = 0;
    let mut call = |c: &mut stsd_tests::harness::Conn| {
        id += 1;
        c.call(id, "echo-console", json!({ "text": "k" }));
        let r = c.response();
        assert!(!is_error(&r), "{r}");
        assert_eq!(text(&r), "echo: k");
    };
    let mut killed = None;
    for _ in 0..2 {
        let t = call_until_template(&d, killed, || call(&mut c));
        // SAFETY: kill(2) on the daemon's child that `stsd status` names (once: the daemon
        // reaps it when it next asks it for a child).
        unsafe { libc::kill(t, libc::SIGKILL) };
        killed = Some(t);
        for _ in 0..4 {
            call(&mut c);
        }
    }
    call_until_template(&d, killed, || call(&mut c));
}
