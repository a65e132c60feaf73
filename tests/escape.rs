//! The OS layer holds on its own. In attack mode a worker, after its profile is applied, makes
//! raw syscalls (no JavaScript, as an exploited engine would) and each must be denied by the
//! kernel or kill the worker, under every posture. Reading and writing inside the base path
//! works exactly where the posture grants it.

use std::path::Path;
use stsd::exec::ExecOptions;
use stsd::exec::{run_job, CallOutcome};
use stsd_protocol::frames::{FsAccess, ProbeOutcome};
use stsd_protocol::Code;
use stsd_tests::{
    exec_options, exec_options_in, is_root, job, scratch_base, spinning_job, SPAWN_MODES,
};

/// Every hostile probe the worker knows (worker/src/attack.rs).
const HOSTILE: &[&str] = stsd_worker::ATTACK_PROBES;

fn fixture() -> tempfile::TempDir {
    let base = scratch_base();
    let _ = std::fs::write(base.path().join("inside.txt"), "inside");
    std::os::unix::fs::symlink("/etc/passwd", base.path().join("escape-link"))
        .unwrap_or_else(|e| panic!("fixture symlink: {e}"));
    base
}

fn probe(name: &str, fs: FsAccess, base: &Path) -> CallOutcome {
    probe_with(&exec_options(), name, fs, base)
}

fn probe_with(opts: &ExecOptions, name: &str, fs: FsAccess, base: &Path) -> CallOutcome {
    let mut j = job("", fs, base);
    j.attack = Some(name.to_string());
    run_job(&j, opts, &mut |_| {})
}

/// Denied means: the kernel refused (EACCES or EPERM from Landlock/DAC, ENOSYS from the
/// stacked seccomp filter) or the process was killed for asking (SIGSYS). Any other errno
/// (ENOENT from a missing fixture, say) proves nothing and fails the test.
fn assert_denied(name: &str, fs: FsAccess, out: &CallOutcome) {
    match (&out.probe, &out.result) {
        (Some(ProbeOutcome::Denied { errno }), _)
            if [libc::EACCES, libc::EPERM, libc::ENOSYS].contains(errno) => {}
        (None, Err(e)) if e.code == Code::SandboxViolation => {}
        other => panic!("{name} under {fs:?} was not denied: {other:?}"),
    }
}

#[test]
fn attack_mode_is_compiled_into_test_builds() {
    let base = fixture();
    let out = probe("read_inside_base", FsAccess::ReadOnly, base.path());
    assert!(
        out.probe.is_some(),
        "the stsd binary has no attack mode; build the workspace tests with `cargo test --workspace`: {out:?}"
    );
}

#[test]
fn every_hostile_syscall_is_denied_under_every_posture() {
    let base = fixture();
    let mut killed = 0;
    let mut errno = 0;
    // Forked from the zygote and exec'd fresh alike.
    for mode in SPAWN_MODES {
        let opts = exec_options_in(mode);
        for fs in [
            FsAccess::None,
            FsAccess::ReadOnly,
            FsAccess::WriteOnly,
            FsAccess::ReadWrite,
        ] {
            for name in HOSTILE {
                let out = probe_with(&opts, name, fs, base.path());
                assert_denied(name, fs, &out);
                let how = match &out.probe {
                    Some(ProbeOutcome::Denied { errno }) => format!("errno {errno}"),
                    _ => "SIGSYS".to_string(),
                };
                eprintln!("{mode:?} {fs:?} {name}: {how}");
                if out.probe.is_some() {
                    errno += 1;
                } else {
                    killed += 1;
                }
            }
        }
    }
    // Both layers took part: seccomp killed some, Landlock/DAC refused others with an errno.
    assert!(killed > 0 && errno > 0, "killed {killed}, errno {errno}");
    // Nothing leaked onto the host.
    let leftovers: Vec<_> = std::fs::read_dir("/tmp")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !leftovers
            .iter()
            .any(|n: &String| n.starts_with("stsd-attack-")),
        "{leftovers:?}"
    );
}

#[test]
fn file_syscalls_kill_a_worker_without_file_access() {
    // With no file posture the open family is not even in the seccomp allowlist.
    let base = fixture();
    for name in ["open_etc_passwd", "read_inside_base"] {
        let out = probe(name, FsAccess::None, base.path());
        assert_eq!(out.probe, None, "{name}");
        assert_eq!(
            out.result.map_err(|e| e.code),
            Err(Code::SandboxViolation),
            "{name}"
        );
    }
}

#[test]
fn landlock_refuses_paths_outside_the_base_even_with_file_access() {
    // With file access the open syscall is allowed, so these are Landlock's refusals (EACCES),
    // symlinks and `..` resolved against real inodes.
    let base = fixture();
    for name in [
        "open_etc_passwd",
        "symlink_out_of_base",
        "dotdot_out_of_base",
        "create_in_tmp",
    ] {
        let out = probe(name, FsAccess::ReadWrite, base.path());
        assert_eq!(
            out.probe,
            Some(ProbeOutcome::Denied {
                errno: libc::EACCES
            }),
            "{name}: {out:?}"
        );
    }
}

#[test]
fn path_metadata_outside_the_base_is_refused_not_leaked() {
    // Landlock does not cover stat/readlink of paths; the stacked filter answers ENOSYS.
    let base = fixture();
    for name in ["stat_outside", "statx_outside"] {
        let out = probe(name, FsAccess::ReadOnly, base.path());
        let enosys = Some(ProbeOutcome::Denied {
            errno: libc::ENOSYS,
        });
        assert_eq!(out.probe, enosys, "{name}: {out:?}");
    }
    // glibc's readlink() may use the legacy readlink syscall, which is not allowed at all.
    let out = probe("readlink_outside", FsAccess::ReadOnly, base.path());
    assert_denied("readlink_outside", FsAccess::ReadOnly, &out);
    // O_PATH opens skip Landlock's checks, so they are not allowed at all.
    let out = probe("open_o_path_outside", FsAccess::ReadOnly, base.path());
    assert_eq!(out.result.map_err(|e| e.code), Err(Code::SandboxViolation));
}

#[test]
fn reading_and_writing_inside_the_base_follow_the_posture() {
    let base = fixture();
    let allowed = |o: &CallOutcome| matches!(o.probe, Some(ProbeOutcome::Allowed { .. }));
    assert!(allowed(&probe(
        "read_inside_base",
        FsAccess::ReadOnly,
        base.path()
    )));
    assert!(allowed(&probe(
        "read_inside_base",
        FsAccess::ReadWrite,
        base.path()
    )));
    assert!(!allowed(&probe(
        "read_inside_base",
        FsAccess::WriteOnly,
        base.path()
    )));
    assert!(!allowed(&probe(
        "write_inside_base",
        FsAccess::ReadOnly,
        base.path()
    )));
    assert!(allowed(&probe(
        "write_inside_base",
        FsAccess::WriteOnly,
        base.path()
    )));
    assert!(allowed(&probe(
        "write_inside_base",
        FsAccess::ReadWrite,
        base.path()
    )));
    assert_eq!(
        std::fs::read(base.path().join("written-by-probe.txt")).ok(),
        Some(b"ok".to_vec())
    );
}

#[test]
fn proc_status_shows_the_confined_worker() {
    for mode in SPAWN_MODES {
        proc_status_in(mode);
    }
}

fn proc_status_in(mode: stsd_profiles::baseline::SpawnMode) {
    let base = fixture();
    // Spin for a while so the test can look at the running worker.
    let j = spinning_job(1500, base.path());
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    let confined_at = match mode {
        stsd_profiles::baseline::SpawnMode::Exec => 1,
        _ => 2,
    };
    let watcher = std::thread::spawn(move || {
        let pid = rx.recv().unwrap_or(0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            // Confined: its own filter installed (a forked worker also holds the zygote's).
            // Only then is its status read: a status read before could show the moment before
            // the filter (the flake CI saw: Seccomp 0 in a status read just before).
            if stsd_tests::harness::seccomp_filters(pid as i32) >= confined_at {
                if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    let limits =
                        std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    return Some((s, limits, stsd_tests::sched_policy(&stat)));
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        None
    });
    let out = run_job(&j, &exec_options_in(mode), &mut |ev| {
        if let stsd::exec::Event::Started(pid) = ev {
            let _ = tx.send(pid);
        }
    });
    assert!(out.result.is_ok(), "{mode:?}: {out:?}");
    let (status, limits, policy) = watcher
        .join()
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("{mode:?}: never saw the worker under seccomp"));
    let field = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .map(|l| l[k.len()..].trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(field("NoNewPrivs:"), "1");
    // A worker is made as background work (SCHED_IDLE, see profiles/src/os/priority.rs);
    // its call runs at the normal policy.
    assert_eq!(
        policy,
        Some(0),
        "{mode:?}: the call runs under policy {policy:?}"
    );
    // The posture-independent limits (set before Ready) and the posture's.
    for (name, want) in [
        ("Max processes", "0 0"),
        ("Max core file size", "0 0"),
        ("Max file size", "0 0"),
    ] {
        let line = limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{mode:?}: no {name} in {limits}"));
        let got: Vec<&str> = line[name.len()..].split_whitespace().take(2).collect();
        assert_eq!(got.join(" "), want, "{mode:?}: {line}");
    }
    assert_eq!(field("Seccomp:"), "2");
    for set in ["CapEff:", "CapPrm:", "CapInh:", "CapAmb:"] {
        assert_eq!(field(set), "0000000000000000", "{set}");
    }
    if is_root() {
        // Only a root daemon can (and must) drop the bounding set.
        assert_eq!(field("CapBnd:"), "0000000000000000");
        let uids: Vec<String> = field("Uid:")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(
            uids, ["65534"; 4],
            "a root daemon's worker runs as the worker user"
        );
        assert_eq!(field("Groups:"), "");
    }
}

/// The disk budget's OS backstop: code that bypasses safety.fs (as an exploited engine
/// would) cannot write a file past max_write_bytes; the kernel answers EFBIG (RLIMIT_FSIZE).
#[test]
fn rlimit_fsize_holds_a_file_to_the_write_budget_without_the_helper() {
    let base = fixture();
    let mut j = job("", FsAccess::ReadWrite, base.path());
    j.attack = Some("write_past_fsize".into());
    j.limits.max_write_bytes = 4 << 20;
    let out = run_job(&j, &exec_options(), &mut |_| {});
    match &out.probe {
        Some(ProbeOutcome::Denied { errno }) => assert_eq!(*errno, libc::EFBIG),
        other => panic!("not stopped by RLIMIT_FSIZE: {other:?} {:?}", out.result),
    }
    let size = std::fs::metadata(base.path().join("fsize-probe.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(size, 4 << 20);
}

/// Bytecode is taken from a worker only while it is primed, before any call reaches it: a
/// worker that sends some in a call (compromised by the call's input, say) fails the call
/// as a protocol error, and nothing of it is kept for another worker.
#[test]
fn bytecode_sent_in_a_call_is_refused() {
    let base = fixture();
    let out = probe("send_bytecode", FsAccess::None, base.path());
    match &out.result {
        Err(e) => assert!(
            e.message.contains("bytecode from a worker in a call"),
            "{e:?}"
        ),
        Ok(v) => panic!("the call stood: {v:?}"),
    }
}

/// A prime whose job carries the probe of `j` (`Job::template` drops it; the pool never
/// primes one, the suite does, to run it in a template's child).
fn probe_prime(j: &stsd_protocol::frames::Job) -> std::sync::Arc<stsd_protocol::frames::Prime> {
    let mut t = j.template();
    t.attack = j.attack.clone();
    std::sync::Arc::new(stsd_protocol::frames::Prime {
        job: t,
        expect_args: Vec::new(),
        want_bytecode: false,
    })
}

/// The same hostile probes, in children of a posture's template (`exec::template`): the
/// template applied the posture's rlimits and Landlock once and kept the zygote's filter (it
/// must fork); each child stacks the narrowing and forbids new processes itself. Every probe
/// must be denied there exactly as in a worker that applied its whole profile alone.
#[test]
fn every_hostile_syscall_is_denied_in_a_templates_child_under_every_posture() {
    let base = fixture();
    let opts = exec_options_in(stsd_profiles::baseline::SpawnMode::Zygote);
    let (mut killed, mut errno) = (0, 0);
    for fs in [
        FsAccess::None,
        FsAccess::ReadOnly,
        FsAccess::WriteOnly,
        FsAccess::ReadWrite,
    ] {
        let mut template = None;
        for name in HOSTILE {
            let mut j = job("", fs, base.path());
            j.attack = Some(name.to_string());
            let prime = probe_prime(&j);
            // One template per posture; the probe is part of the prime, so each probe's
            // children come from a template made for it.
            let t = template
                .take()
                .filter(|t: &stsd::exec::template::Template| t.is_for(&prime));
            let mut t = match t {
                Some(t) => t,
                None => stsd::exec::template::Template::start(&opts, prime.clone())
                    .unwrap_or_else(|e| panic!("{fs:?}: no template: {e}")),
            };
            let child = t
                .fork()
                .unwrap_or_else(|e| panic!("{fs:?} {name}: no child: {e}"));
            assert_ne!(child.pid(), t.pid());
            let out = stsd::exec::run_on(child, &j, &opts, None, &mut |_| {});
            assert_denied(name, fs, &out);
            if out.probe.is_some() {
                errno += 1;
            } else {
                killed += 1;
            }
            template = Some(t);
        }
    }
    assert!(killed > 0 && errno > 0, "killed {killed}, errno {errno}");
}

/// A template's child holds the whole profile of a worker of its posture (two filters, no
/// new process, no core, no file size), and the template itself only what lets it fork.
#[test]
fn a_templates_child_holds_the_whole_profile_and_the_template_only_what_lets_it_fork() {
    let base = fixture();
    let opts = exec_options_in(stsd_profiles::baseline::SpawnMode::Zygote);
    let j = job("return 1;", FsAccess::None, base.path());
    let prime = std::sync::Arc::new(stsd_protocol::frames::Prime {
        job: j.template(),
        expect_args: Vec::new(),
        want_bytecode: false,
    });
    let mut t = stsd::exec::template::Template::start(&opts, prime)
        .unwrap_or_else(|e| panic!("no template: {e}"));
    let child = t.fork().unwrap_or_else(|e| panic!("no child: {e}"));
    let pid = child.pid() as i32;
    // The supervisor's child (CLONE_PARENT), not the template's.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ppid = stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().nth(1))
        .and_then(|p| p.parse::<u32>().ok());
    assert_eq!(ppid, Some(std::process::id()), "{stat}");
    // Confined once its own filter is stacked on the zygote's (NPROC is set just before).
    let t0 = std::time::Instant::now();
    while stsd_tests::harness::seccomp_filters(pid) < 2 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "the child never stacked its filter"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let limit = |pid: i32, name: &str| {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap_or_default();
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .map(|l| {
                l[name.len()..]
                    .split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| panic!("no {name} for {pid}: {limits}"))
    };
    for (name, want) in [
        ("Max processes", "0 0"),
        ("Max core file size", "0 0"),
        ("Max file size", "0 0"),
        ("Max open files", "8 8"),
    ] {
        assert_eq!(limit(pid, name), want, "the child's {name}");
    }
    let tp = t.pid() as i32;
    assert_eq!(stsd_tests::harness::seccomp_filters(tp), 1, "the template");
    assert_ne!(limit(tp, "Max processes"), "0 0", "the template must fork");
    assert_eq!(limit(tp, "Max open files"), "8 8", "the template's posture");
    let out = stsd::exec::run_on(child, &j, &opts, None, &mut |_| {});
    assert!(
        matches!(&out.result, Ok(stsd::exec::CallValue::Json(v)) if v == "1"),
        "{out:?}"
    );
}
