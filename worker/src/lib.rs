//! stsd-worker: the process that runs one tool call. Started with its socket on fd 3, never as
//! a fork of the multi-threaded supervisor: forked by the zygote (`stsd zygote`, see
//! [`zygote`]), forked by a posture's template (a zygote-forked worker made one, see
//! [`template`]), or exec'd fresh (`stsd worker`, `[worker] spawn = "exec"`). It reports Ready,
//! takes a job, applies the OS profile before the tool's code is even parsed, runs the body in
//! QuickJS, streams console lines and the result back, and exits.

mod body;
mod channel;
mod console;
mod engine;
mod globals;
mod heap;
mod inherit;
mod jsstring;
mod template;
mod zygote;

// Compiled only into debug (test) builds, even when a workspace build unifies the feature on.
#[cfg(all(feature = "attack", debug_assertions))]
mod attack;

use channel::{Channel, Work};
use std::os::fd::{FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};
use stsd_profiles::os::{self, WORKER_SOCKET_FD};
use stsd_protocol::frames::{clip_message, FromWorker, WorkerTimings, MAX_BYTECODE_BYTES};
use stsd_protocol::Code;

pub use engine::STEPS_PER_TICK;
/// What the zygote does to its heap before its first fork (public for its test).
pub use inherit::take_free_chunks;
pub use zygote::run as run_zygote;

#[cfg(all(feature = "attack", debug_assertions))]
pub use attack::HOSTILE as ATTACK_PROBES;

extern "C" {
    /// glibc's tzset(3); the libc crate does not declare it.
    fn tzset();
}

/// Whether this build carries the attack probes (test builds only).
pub const ATTACK_MODE: bool = cfg!(all(feature = "attack", debug_assertions));

/// This process's resource use: (peak resident set in KiB, CPU time in µs); zeros when
/// unknown.
fn usage() -> (u64, u64) {
    let (rss, cpu, _) = usage_faults();
    (rss, cpu)
}

/// [`usage`] and the minor page faults so far.
fn usage_faults() -> (u64, u64, u64) {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is allowed by the
    // seccomp profile.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut u) == 0 {
            let us =
                |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
            (
                u.ru_maxrss.max(0) as u64,
                us(u.ru_utime) + us(u.ru_stime),
                u.ru_minflt.max(0) as u64,
            )
        } else {
            (0, 0, 0)
        }
    }
}

/// Longest error message or stack a worker sends; a longer one is cut (and says so), so a
/// tool that throws a huge message gets its error, not a crashed worker.
const MAX_ERROR_BYTES: usize = 16 * 1024;

fn error_frame(code: Code, message: String, stack: Option<String>) -> FromWorker {
    FromWorker::Error {
        code: code.as_str().into(),
        message: clip_message(message, MAX_ERROR_BYTES),
        stack: stack.map(|s| clip_message(s, MAX_ERROR_BYTES)),
    }
}

fn fail(channel: &Channel, code: Code, message: impl Into<String>) -> i32 {
    let _ = channel.send(&error_frame(code, message.into(), None));
    0
}

/// `stsd worker|zygote --uid N --gid N`: the user a root worker switches to (the supervisor's
/// configuration; a job that names another is refused).
fn ids_from_args() -> (u32, u32) {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(65534)
    };
    (get("--uid"), get("--gid"))
}

/// What every worker process does once, before anything else, whether exec'd or forked from
/// the zygote (which does it once for all the workers it forks).
fn init_process() {
    set_name(c"stsd-worker");
    // glibc reads the zone file for TZ on first use of local time (Date#getHours and friends);
    // load it now, while files may still be opened. Later calls use the cached data.
    // SAFETY: tzset has no preconditions; this process is single-threaded.
    unsafe { tzset() };
    // A write past RLIMIT_FSIZE should fail with EFBIG (a clean helper error), not kill the
    // worker with SIGXFSZ.
    // SAFETY: setting a signal disposition to ignore; no handler code runs.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
}

/// The process name `ps` and /proc/PID/stat show (forked workers would otherwise show the
/// zygote's, and exec'd ones the number of the descriptor they were exec'd from).
fn set_name(name: &std::ffi::CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) };
}

/// `stsd worker`: an exec'd worker's whole life. Returns the process exit code, which the
/// caller passes to `_exit` (nothing is left to flush or tear down).
pub fn run() -> i32 {
    init_process();
    let (uid, gid) = ids_from_args();
    serve(uid, gid, engine::Warm::new(), None)
}

/// A worker's life from its socket on fd 3 to its exit code: the posture-independent half of
/// the profile, Ready, then jobs. `warm` is the context for the first job: made by this
/// process (exec), or inherited from the zygote (fork), which made it before it forked and
/// never used it. `heap`: where the heap a forked worker shares with its zygote begins (see
/// `inherit::own_heap_while_idle`).
fn serve(
    uid: u32,
    gid: u32,
    warm: Result<engine::Warm, engine::Failure>,
    heap: Option<usize>,
) -> i32 {
    // A forked worker's parent is the supervisor too (the zygote forks with CLONE_PARENT).
    let parent = nix::unistd::getppid().as_raw() as u32;
    // SAFETY: the supervisor (or the zygote) placed the socket on fd 3 and nothing else in
    // this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(WORKER_SOCKET_FD) };
    // Everything that does not depend on the tool happens before Ready, off the request path.
    let prepared = os::prepare_worker(uid, gid, parent);
    let channel = Rc::new(Channel::new(fd));
    if send_ready(&channel).is_err() {
        return 71;
    }
    let prepared = match prepared {
        Ok(p) => p,
        Err(e) => {
            let _ = channel.recv();
            return unenforceable(&channel, &e);
        }
    };
    // Before its first work, hence before any seccomp filter (poll is not in one).
    inherit::own_heap_while_idle(heap, |ms| channel.has_record_within(ms));
    serve_calls(channel, prepared, warm, parent, None, Confinement::None)
}

/// A template's child (see `template.rs`), just forked: its socket is on fd 3 and `channel`
/// reads it. It applies the posture-independent half again (closing every other descriptor,
/// the template's own among them), then is confined and primed as a primed pool worker is,
/// except that the template already applied the posture's rlimits and Landlock.
fn serve_child(
    channel: Rc<Channel>,
    prime: stsd_protocol::frames::Prime,
    warm: Result<engine::Warm, engine::Failure>,
) -> i32 {
    let (uid, gid) = ids_from_args();
    // CLONE_PARENT: the supervisor, as for any forked worker.
    let parent = nix::unistd::getppid().as_raw() as u32;
    let prepared = match os::prepare_worker(uid, gid, parent) {
        Ok(p) => p,
        Err(e) => return unenforceable(&channel, &e),
    };
    let posture = (prime.job.sandbox.clone(), prime.job.limits.clone());
    serve_calls(
        channel,
        prepared,
        warm,
        parent,
        Some(Work::Prime(Box::new(prime))),
        Confinement::Template(Box::new(posture)),
    )
}

/// How far this worker is confined.
enum Confinement {
    /// Not yet: its first job (or prime) applies its posture.
    None,
    /// Forked by a template of this posture and these limits: the rlimits made from them
    /// and Landlock are in force, the seccomp narrowing and `RLIMIT_NPROC` are not.
    Template(
        Box<(
            stsd_protocol::frames::SandboxSpec,
            stsd_protocol::frames::JobLimits,
        )>,
    ),
    /// Wholly, to this posture: it only ever runs jobs of it.
    Full(stsd_protocol::frames::SandboxSpec),
}

/// A worker's jobs, from `first` (a template's child's prime) or its socket, until it is let
/// go or it becomes a template.
fn serve_calls(
    channel: Rc<Channel>,
    prepared: os::Prepared,
    mut warm: Result<engine::Warm, engine::Failure>,
    // The attack probes' (test builds): the supervisor's pid, which they try to signal.
    #[cfg_attr(
        not(all(feature = "attack", debug_assertions)),
        allow(unused_variables)
    )]
    parent: u32,
    mut first: Option<Work>,
    mut confined: Confinement,
) -> i32 {
    let mut served = 0u32;
    loop {
        let work = match first.take().map_or_else(|| channel.recv_work(), Ok) {
            Ok(w) => w,
            // The supervisor closed the socket (done), or sent something other than a job (a
            // fetch answer with no fetch outstanding): stop either way.
            Err(_) => return 0,
        };
        // A primed worker is confined and its engine made before its call is known; the
        // call's time starts at its Go.
        let (job, primed) = match work {
            Work::Job(job) => (job, None),
            Work::Go { .. } => return fail(&channel, Code::InvalidInput, "a go with no prime"),
            Work::Template(prime) => {
                if served > 0 || !matches!(confined, Confinement::None) {
                    return fail(
                        &channel,
                        Code::InvalidInput,
                        "only a fresh worker becomes a template",
                    );
                }
                return template::run(channel, prepared, *prime, warm);
            }
            Work::Prime(prime) => {
                if let Err(code) = confine_once(&channel, &mut confined, &prime.job, &prepared) {
                    return code;
                }
                let w = match take_warm(&mut warm) {
                    Ok(w) => w,
                    Err(f) => return fail(&channel, f.code, f.message),
                };
                let engine = match engine::Engine::prime(w, &prime, &channel) {
                    Ok(e) => e,
                    Err(f) => return fail(&channel, f.code, f.message),
                };
                if prime.want_bytecode && send_bytecode(&channel).is_err() {
                    return 75;
                }
                if send_ready(&channel).is_err() {
                    return 75;
                }
                match channel.recv_work() {
                    Ok(Work::Go {
                        call_id,
                        args_json,
                        keep_alive,
                    }) => {
                        let mut job = Box::new(prime.job);
                        job.call_id = call_id;
                        job.args_json = args_json;
                        job.keep_alive = keep_alive;
                        (job, Some(engine))
                    }
                    // Closed (the supervisor let this worker go), or anything but the call it
                    // was primed for: stop either way.
                    _ => {
                        std::mem::forget(engine);
                        return 0;
                    }
                }
            }
        };
        let started = Instant::now();
        let f0 = usage_faults().2;
        let deadline = started + Duration::from_millis(job.limits.timeout_ms);
        if job.attack.is_some() && !ATTACK_MODE {
            return fail(
                &channel,
                Code::InvalidInput,
                "this build has no attack mode",
            );
        }
        if let Err(code) = confine_once(&channel, &mut confined, &job, &prepared) {
            return code;
        }
        // RLIMIT_CPU counts the process's whole life: each call after the first gets its own
        // budget. (A primed first call's budget holds its priming too: well under a second.)
        if served > 0 {
            if let Err(e) = os::rearm_cpu(&job.limits) {
                return fail(
                    &channel,
                    Code::SandboxUnavailable,
                    format!("a reused worker cannot take another call: {}", e.0),
                );
            }
        }
        served += 1;
        let profile_us = started.elapsed().as_micros() as u64;
        let f1 = usage_faults().2;
        if channel.defer(&FromWorker::Confined).is_err() {
            return 73;
        }

        #[cfg(all(feature = "attack", debug_assertions))]
        if let Some(probe) = &job.attack {
            // A compromised worker handing "bytecode" on in a call (the supervisor refuses it).
            if probe == "send_bytecode" {
                let b = stsd_protocol::frames::Bytecode {
                    source: job.wrapped_body(&job.wrapper_prefix()),
                    bytes: vec![0; 16],
                };
                let _ = channel.send(&FromWorker::Bytecode(Box::new(b)));
            }
            let outcome = attack::run(probe, &job.sandbox.base_path, parent);
            let _ = channel.send(&FromWorker::Probe {
                name: probe.clone(),
                outcome,
            });
            return 0;
        }

        let t_ctx = Instant::now();
        let engine = match primed {
            Some(engine) => match engine.start(&job, deadline) {
                Ok(()) => engine,
                Err(f) => return fail(&channel, f.code, f.message),
            },
            None => {
                let w = match take_warm(&mut warm) {
                    Ok(w) => w,
                    Err(f) => return fail(&channel, f.code, f.message),
                };
                match engine::Engine::bind(w, &job, deadline, &channel) {
                    Ok(e) => e,
                    Err(f) => return fail(&channel, f.code, f.message),
                }
            }
        };
        let context_us = t_ctx.elapsed().as_micros() as u64;
        let t_run = Instant::now();
        let (_, cpu_before, f2) = usage_faults();
        let outcome = engine.run(&job);
        let run_us = t_run.elapsed().as_micros() as u64;
        let heap_bytes = engine.heap_bytes();
        let (rss_kib, cpu_after, f3) = usage_faults();
        let clean = outcome.is_ok() || matches!(&outcome, Err(f) if f.code == Code::JsError);
        // The timings go out in the result's record, ahead of it: the supervisor has all of
        // the call when the result arrives, with one wake-up.
        let _ = channel.defer(&FromWorker::Timings(WorkerTimings {
            profile_us,
            context_us,
            run_us,
            max_rss_kib: rss_kib,
            cpu_us: cpu_after.saturating_sub(cpu_before),
            heap_bytes,
            faults: [
                f1.saturating_sub(f0),
                f2.saturating_sub(f1),
                f3.saturating_sub(f2),
            ],
        }));
        let sent = match outcome {
            Ok(r) => engine::send_result(&channel, &r),
            Err(f) => channel.send(&error_frame(f.code, f.message, f.stack)),
        };
        // Only a call that ended cleanly leaves a worker fit for another.
        if sent.is_err() || !job.keep_alive || !clean {
            // The process ends here and the kernel frees its memory at once; tearing the
            // runtime down first (a full GC, then every free) would only cost CPU.
            std::mem::forget(engine);
            if sent.is_err() {
                return 74;
            }
            // The supervisor has everything and ends this process when the reply is on its
            // way. Exiting now would put the teardown (unmapping every page) on this CPU
            // ahead of the supervisor reading the last frame.
            channel.await_close();
            return 0;
        }
        // The next call's context is made once the supervisor has the outcome and says so
        // (until then this process would hold the CPU the supervisor waits for). Ready again
        // says it is made: the supervisor gives the next call to a reused worker that has.
        match channel.recv() {
            Ok(stsd_protocol::frames::ToWorker::Continue) => {}
            // Closed (the supervisor let this worker go), or confused: stop either way.
            _ => {
                std::mem::forget(engine);
                return 0;
            }
        }
        drop(engine);
        warm = engine::Warm::new();
        if send_ready(&channel).is_err() {
            return 75;
        }
    }
}

/// The tool is refused (SANDBOX_UNAVAILABLE): its profile cannot be applied here. Returns the
/// exit code.
fn unenforceable(channel: &Channel, e: &os::SandboxUnavailable) -> i32 {
    fail(
        channel,
        Code::SandboxUnavailable,
        format!(
            "the OS sandbox cannot be fully enforced here, so the tool was not run: {}",
            e.0
        ),
    )
}

/// Ready: this worker waits for work (after its start, after priming, after a reused call's
/// next context).
fn send_ready(channel: &Channel) -> Result<(), String> {
    channel.send(&FromWorker::Ready {
        pid: std::process::id(),
        cpu_us: usage().1,
    })
}

/// A primed worker asked for its body's bytecode sends it, before its Ready, when the body
/// compiled and the bytecode with its source is at most [`MAX_BYTECODE_BYTES`] (else nothing,
/// and the supervisor remembers that the source gave none). No call has reached this process
/// yet, so what it hands on is the tool's alone.
fn send_bytecode(channel: &Channel) -> Result<(), String> {
    match body::take_kept() {
        Some(b) if b.source.len() + b.bytes.len() <= MAX_BYTECODE_BYTES => {
            channel.send(&FromWorker::Bytecode(Box::new(b)))
        }
        _ => Ok(()),
    }
}

/// The context made ahead for the next call, or one made now when there is none (it was
/// used, or making it failed then).
fn take_warm(
    warm: &mut Result<engine::Warm, engine::Failure>,
) -> Result<engine::Warm, engine::Failure> {
    match std::mem::replace(warm, Err(engine::Failure::placeholder())) {
        Ok(w) => Ok(w),
        Err(_) => engine::Warm::new(),
    }
}

/// Applies `job`'s posture if this worker is not confined yet; a confined one only ever runs
/// jobs of the posture it is confined to. Err: the exit code (the failure is sent).
fn confine_once(
    channel: &Channel,
    confined: &mut Confinement,
    job: &stsd_protocol::frames::Job,
    prepared: &os::Prepared,
) -> Result<(), i32> {
    let applied = match confined {
        Confinement::None => os::confine(
            prepared,
            &job.sandbox,
            &job.limits,
            &job.seccomp,
            job.reuse_calls,
        ),
        // Its rlimits are the template's: a job with other limits is refused too.
        Confinement::Template(t) if t.0 == job.sandbox && t.1 == job.limits => {
            os::confine_from_template(prepared, &job.sandbox, &job.seccomp)
        }
        Confinement::Template(_) => {
            return Err(fail(
                channel,
                Code::SandboxUnavailable,
                "a template's child was sent a job of another posture or other limits",
            ))
        }
        Confinement::Full(s) if *s != job.sandbox => {
            return Err(fail(
                channel,
                Code::SandboxUnavailable,
                "a reused worker was sent a job of another posture",
            ))
        }
        Confinement::Full(_) => return Ok(()),
    };
    if let Err(e) = applied {
        return Err(unenforceable(channel, &e));
    }
    *confined = Confinement::Full(job.sandbox.clone());
    Ok(())
}
