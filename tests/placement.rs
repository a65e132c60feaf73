//! Where a call's worker runs (`os::priority`, `exec::exchange`). Its own test binary, its
//! tests one at a time ([`serial`]): a lone call is one with no other exchange in flight in
//! the process, which tests running in parallel threads would spoil.

use stsd::exec::{run_job, run_keeping, spawn_ready, Event};
use stsd_profiles::baseline::SpawnMode;
use stsd_tests::{cpus_allowed, exec_options, scratch_base, spinning_job};

/// Held by each test for its whole run, so that no other test's call is in flight beside it;
/// and taken a while after the last test's calls, which may have overlapped: a call alone
/// counts as lone only once calls have not overlapped for 50 ms (`placement::SETTLE`).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    std::thread::sleep(std::time::Duration::from_millis(200));
    guard
}

/// The CPUs this process may use, or None (said) when it may use one only: placement
/// needs a second CPU to be seen.
fn cpus_or_skip() -> Option<Vec<u32>> {
    let all = cpus_allowed("self");
    if all.len() < 2 {
        eprintln!("skipped: this process may use one CPU only");
        return None;
    }
    Some(all)
}

/// A job that spins for `ms` and that asks to keep its worker for another call.
fn kept_job(ms: u64, base: &std::path::Path) -> stsd_protocol::frames::Job {
    let mut j = spinning_job(ms, base);
    j.keep_alive = true;
    j.reuse_calls = 10;
    j
}

/// A reused worker in a lone call runs beside its driver and, kept, makes its next context
/// away from the driver's CPU, where the background (the zygote) is kept off too; in a call
/// with another in flight it is not pinned, and the worker and the zygote may use every CPU.
#[test]
fn a_reused_worker_is_placed_only_for_a_lone_call() {
    let _serial = serial();
    let Some(all) = cpus_or_skip() else {
        return;
    };
    let base = scratch_base();
    let opts = exec_options();
    let j = kept_job(0, base.path());
    let w = spawn_ready(&opts, true).unwrap_or_else(|e| panic!("{}", e.message));

    // Lone: pinned for the call, kept away from that CPU after it. A call whose worker is
    // silent for 2 ms is let go to any CPU (`PINNED_FOR`), so the check is made on a call
    // of an already confined worker (its first made the posture), and a slow one (a loaded
    // machine) is tried again.
    let mut w = w;
    let mut checked = false;
    // Tried for up to 15 s: on a loaded machine (stress-ng on every CPU) six tries all ran
    // over 1.5 ms. Each try still checks that the lone call's worker was pinned at its start.
    let t0 = std::time::Instant::now();
    let mut tries = 0;
    for i in 0.. {
        if i > 0 && t0.elapsed() > std::time::Duration::from_secs(15) {
            break;
        }
        tries += 1;
        let mut at_start = Vec::new();
        let (out, kept) = run_keeping(w, &j, &opts, None, &mut |ev| {
            if let Event::Started(pid) = ev {
                at_start = cpus_allowed(&pid.to_string());
            }
        });
        assert!(out.result.is_ok(), "{out:?}");
        assert_eq!(
            at_start.len(),
            1,
            "a lone call's worker may use {at_start:?}"
        );
        w = kept.unwrap_or_else(|| panic!("the worker was not kept: {out:?}"));
        let exchange_us = out.timings.total_us.saturating_sub(out.timings.spawn_us);
        if i == 0 || exchange_us > 1500 {
            continue; // the first call (it confined the worker), or a slow one
        }
        // Kept away from the CPU it was pinned to: on two CPUs its length alone cannot tell
        // that from still pinned.
        let after = cpus_allowed(&w.pid().to_string());
        assert!(
            after.len() == all.len() - 1 && !after.contains(&at_start[0]),
            "kept after a lone call on CPU {}: {after:?} of {all:?}",
            at_start[0]
        );
        assert!(
            after.iter().all(|c| all.contains(c)),
            "{after:?} of {all:?}"
        );
        checked = true;
        break;
    }
    if !checked {
        // Inconclusive, not failed: the placement after a call is only defined for a short
        // one (`PINNED_FOR`), and this machine ran none in 15 s.
        eprintln!("placement after a lone call not checked: no call of {tries} ran under 1.5 ms");
    }
    // The background (here the zygote) keeps off the lone calls' CPU.
    let zygotes = zygotes_of_this_process();
    if stsd_tests::spawn_mode_from_env().unwrap_or_default() == SpawnMode::Zygote {
        assert_eq!(zygotes.len(), 1, "the zygote of this process: {zygotes:?}");
    }
    for z in &zygotes {
        let mask = cpus_allowed(&z.to_string());
        assert_eq!(
            mask.len(),
            all.len() - 1,
            "the zygote after lone calls: {mask:?}"
        );
    }

    // Another call in flight (a one-shot worker spinning for two seconds): not pinned, and let
    // go to every CPU.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let other_base = scratch_base();
    let other_job = {
        let mut o = kept_job(2000, other_base.path());
        o.keep_alive = false;
        o
    };
    let other_opts = opts.clone();
    let other = std::thread::spawn(move || {
        run_job(&other_job, &other_opts, &mut |ev| {
            if let Event::Started(_) = ev {
                let _ = tx.send(());
            }
        })
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("the other call did not start: {e}"));
    let mut at_start = Vec::new();
    let (out, kept) = run_keeping(w, &j, &opts, None, &mut |ev| {
        if let Event::Started(pid) = ev {
            at_start = cpus_allowed(&pid.to_string());
        }
    });
    assert!(out.result.is_ok(), "{out:?}");
    assert_eq!(at_start, all, "with another call in flight");
    let w = kept.unwrap_or_else(|| panic!("the worker was not kept: {out:?}"));
    assert_eq!(
        cpus_allowed(&w.pid().to_string()),
        all,
        "kept after a call not alone"
    );
    for z in &zygotes {
        assert_eq!(
            cpus_allowed(&z.to_string()),
            all,
            "the zygote while calls overlap"
        );
    }
    // A one-shot call beside it is not pinned either: pinning one-shot workers while calls
    // overlap piled them onto the drivers' CPUs too (one-shot calls/s at c=8 1583 -> 1655,
    // medians of seven alternating rounds).
    let one_shot = {
        let mut o = kept_job(0, other_base.path());
        o.keep_alive = false;
        o
    };
    let mut at_start = Vec::new();
    let out = run_job(&one_shot, &opts, &mut |ev| {
        if let Event::Started(pid) = ev {
            at_start = cpus_allowed(&pid.to_string());
        }
    });
    // Still running now, the other call was in flight for the whole of this one.
    let overlapped = !other.is_finished();
    let other = other
        .join()
        .unwrap_or_else(|_| panic!("the other call panicked"));
    assert!(other.result.is_ok(), "{other:?}");
    assert!(out.result.is_ok(), "{out:?}");
    if overlapped {
        assert_eq!(at_start, all, "a one-shot call with another in flight");
    } else {
        // Inconclusive, not failed: the calls before it took this machine two whole seconds.
        eprintln!("one-shot placement beside another call not checked: the other had ended");
    }
}

/// A call's worker runs on the CPU of the thread that drives its exchange while the call is
/// short (each wake-up between the two then stays on one CPU), and may run on any of the
/// supervisor's CPUs once the call has run longer, so that long calls spread over the
/// machine.
#[test]
fn a_call_s_worker_runs_beside_its_driver_then_anywhere() {
    let Some(all) = cpus_or_skip() else {
        return;
    };
    let _serial = serial();
    let base = scratch_base();
    let j = spinning_job(800, base.path());
    let (tx, rx) = std::sync::mpsc::channel::<u32>();
    let watcher = std::thread::spawn(move || {
        let pid = rx.recv().unwrap_or(0);
        std::thread::sleep(std::time::Duration::from_millis(300));
        cpus_allowed(&pid.to_string())
    });
    let mut at_start = Vec::new();
    let out = run_job(&j, &exec_options(), &mut |ev| {
        if let stsd::exec::Event::Started(pid) = ev {
            at_start = cpus_allowed(&pid.to_string());
            let _ = tx.send(pid);
        }
    });
    assert!(out.result.is_ok(), "{out:?}");
    assert_eq!(
        at_start.len(),
        1,
        "at its start the worker may use {at_start:?}"
    );
    assert!(all.contains(&at_start[0]), "{at_start:?} of {all:?}");
    let later = watcher.join().unwrap_or_default();
    assert_eq!(later, all, "300 ms into its call");
}

/// The zygotes this process started (none in exec mode).
fn zygotes_of_this_process() -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid = rest
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(me) && head.ends_with("(stsd-zygote") {
            out.push(pid);
        }
    }
    out
}
