//! A posture's template: a pool worker that the supervisor made the template of one tool's
//! posture ([`ToWorker::Template`]) instead of giving it a job. It applies, once, the part of
//! the posture that every worker of it would apply alike (the posture's rlimits and Landlock,
//! `os::confine_template`), and then forks, on each [`ToWorker::Fork`], a child that adds
//! only what must be its own: `RLIMIT_NPROC` 0 and the seccomp narrowing built for its own pid
//! (`os::confine_from_template`). The child then primes itself from the template's prime
//! (binds the globals and compiles the body, under its whole profile) and says Ready, as a
//! primed pool worker does; from there it is one.
//!
//! The template never runs, parses or compiles tool code, and never sees a call: a call goes
//! to a child, over a socket pair of the child's own (made per fork, the supervisor's end
//! sent back as the zygote sends it). Children are forked with `CLONE_PARENT`: they are the
//! supervisor's children, which reaps, kills, pins and classifies them as any worker, and a
//! template that dies takes no child with it.
//!
//! The template's own seccomp filter is the zygote's (it must still fork); its children
//! stack their posture's narrowing on it, as a worker forked by the zygote does.

use crate::channel::Channel;
use crate::engine::{Failure, Warm};
use std::os::fd::AsRawFd;
use std::rc::Rc;
use stsd_profiles::os::{self, WORKER_SOCKET_FD};
use stsd_protocol::frames::{ForkReply, Prime, ToWorker};
use stsd_protocol::Code;

/// A pool worker made a template: confines itself, says Ready, then forks a primed child per
/// request until the supervisor closes the socket. Returns the exit code (in a child, the
/// child's own, from [`super::serve_child`]).
pub(crate) fn run(
    channel: Rc<Channel>,
    prepared: os::Prepared,
    prime: Prime,
    warm: Result<Warm, Failure>,
) -> i32 {
    if let Err(e) = os::confine_template(&prepared, &prime.job.sandbox, &prime.job.limits) {
        return super::fail(
            &channel,
            Code::SandboxUnavailable,
            format!(
                "the OS sandbox cannot be fully enforced here, so no template was made: {}",
                e.0
            ),
        );
    }
    super::set_name(c"stsd-template");
    // The Intl its tool's code names, loaded once here under the template's own confinement
    // (stsd's Intl code: the tool's code is only searched for names). A child would load it
    // again as it primes, 300-400 µs of CPU each for a tool that sorts with localeCompare;
    // now it finds it loaded, its copy shared with the template's until written.
    if let Ok(w) = &warm {
        w.preload_intl(&prime.job.code, prime.job.limits.memory_bytes);
    }
    if super::send_ready(&channel).is_err() {
        return 75;
    }
    loop {
        match channel.recv() {
            Ok(ToWorker::Fork) => {}
            // Closed (replaced, idle, or the daemon stops), or anything else: stop.
            _ => return 0,
        }
        let (theirs, mine) = match super::zygote::pair_or_reply(channel.fd()) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(()) => return 0,
        };
        let cpu0 = os::cpu_time_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        let pid = super::zygote::fork_for_parent();
        if pid == 0 {
            // The child. Its socket goes onto fd 3, over the template's (the channel, whose
            // buffer it keeps, now reads and writes the child's socket); `prepare` closes
            // every other descriptor, these two included.
            // SAFETY: plain fd numbers; the OwnedFds are forgotten, never closed by number
            // again (prepare closes them; a later close could hit a reused number).
            if unsafe { libc::dup2(mine.as_raw_fd(), WORKER_SOCKET_FD) } < 0 {
                // SAFETY: _exit ends this process at once.
                unsafe { libc::_exit(70) };
            }
            std::mem::forget(mine);
            std::mem::forget(theirs);
            super::set_name(c"stsd-worker");
            return super::serve_child(channel, prime, warm);
        }
        let cpu_ns = os::cpu_time_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(cpu0);
        drop(mine);
        let r = if pid < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            super::zygote::reply(channel.fd(), ForkReply::failed(errno), None)
        } else {
            super::zygote::reply(
                channel.fd(),
                ForkReply::forked(pid as u32, cpu_ns),
                Some(&theirs),
            )
        };
        drop(theirs);
        if r.is_err() {
            return 0;
        }
    }
}
