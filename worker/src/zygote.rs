//! The zygote (`stsd zygote`). The supervisor execs it once, the way it would exec a worker
//! (fresh exec, empty environment, stdio on /dev/null, its control socket on fd 3, no catalog
//! and no secret), and it does once what is the same for every worker: loading and
//! relocation, the time-zone data, the privilege drop (the worker user, no capability,
//! no_new_privs, not dumpable), and a first QuickJS runtime that initialises the engine's
//! one-time state and the allocator. Then, per request, it forks a worker.
//!
//! Workers are forked with `CLONE_PARENT`: they are the supervisor's children, not the
//! zygote's. The supervisor reaps them and classifies their deaths exactly as for exec'd
//! workers, their parent-death signal follows the supervisor, and a zygote that dies (or is
//! replaced) takes no worker with it. The zygote never runs a tool and never sees a job, so
//! nothing of any call can reach a worker through it.
//!
//! Protocol on the control socket (SOCK_SEQPACKET): the zygote says [`ZYGOTE_READY`] once,
//! when it is ready to fork (after its code offer, if it made one); each record the
//! supervisor sends then asks for one worker; each reply is [`ForkReply`] with the
//! supervisor's end of the new worker's socket attached (SCM_RIGHTS) when the fork succeeded.

use nix::sys::socket::{
    recv, sendmsg, socketpair, AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType,
};
use std::io::IoSlice;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use stsd_profiles::os::{self, WORKER_SOCKET_FD};
use stsd_protocol::frames::{ForkReply, ZYGOTE_CODE_FD, ZYGOTE_CODE_OFFER, ZYGOTE_READY};

/// The zygote's control socket sits where a worker's socket sits.
const CONTROL_FD: i32 = WORKER_SOCKET_FD;

/// fork(2), except that the child's parent is this process's parent (the supervisor).
/// Returns the child's pid in the parent, 0 in the child, -1 on failure (errno set).
pub(crate) fn fork_for_parent() -> libc::c_long {
    // SAFETY: a fork-like clone (no new stack: the child continues here on a copy of this
    // single-threaded process). glibc's fork handlers are skipped, which is safe here: this
    // process has one thread and holds no lock at this point, and the child never relies on
    // the thread id glibc caches (raise and abort ask the kernel for it).
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    }
}

/// The argument after `flag` on this process's command line.
fn arg_after(flag: &str) -> Option<String> {
    let mut args = std::env::args();
    args.find(|a| a == flag)?;
    args.next()
}

/// `stsd zygote --uid N --gid N`. Returns the process exit code (in the zygote; a forked
/// worker returns its own).
pub fn run() -> i32 {
    // First, before any limit is set (RLIMIT_FSIZE would refuse the memfd's bytes).
    super::inherit::clean_relro();
    // An earlier zygote's code memfd, if the supervisor passed one; fd 4 is otherwise closed
    // (every descriptor the supervisor holds is close-on-exec) or not a sealed memfd.
    // SAFETY: F_GETFD only asks whether fd 4 is open; if it is, it was placed there for this
    // process, and nothing else owns it.
    let given = (unsafe { libc::fcntl(ZYGOTE_CODE_FD, libc::F_GETFD) } >= 0)
        .then(|| unsafe { OwnedFd::from_raw_fd(ZYGOTE_CODE_FD) });
    let code = if std::env::args().any(|a| a == "--huge-code") {
        super::inherit::huge_code(given)
    } else {
        None
    };
    // The zygote's own seccomp filter, compiled by the supervisor (see os::zygote_filter):
    // read now, before the context is made, installed last.
    let filter = arg_after("--seccomp").map(|hex| os::zygote_filter::parse_zygote_program(&hex));
    // SAFETY: the supervisor placed the control socket on fd 3 and nothing else owns it.
    let ctrl = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    if let Some(code) = code {
        // Made here (the first zygote): offered before anything else. The memfd itself is
        // closed here, as a given one is (no worker holds it).
        let _ = send_with_fd(&ctrl, ZYGOTE_CODE_OFFER, Some(&code));
    }
    super::init_process();
    super::set_name(c"stsd-zygote");
    let (uid, gid) = super::ids_from_args();
    let parent = nix::unistd::getppid().as_raw() as u32;
    // The worker's own posture-independent half, once for all: every worker inherits it and
    // then applies it again itself (cheap, and a failure here is reported by each worker as
    // SANDBOX_UNAVAILABLE when its job comes, just as an exec'd worker would).
    let _ = os::prepare(uid, gid, parent);
    // The first job's runtime and context, with the runtime globals installed, made once
    // here and inherited by every worker (copy-on-write) instead of made by each. The zygote
    // never uses it: no tool code ever runs here. What a context would otherwise get fresh
    // per worker, Math.random's state, is seeded per call (see engine::Engine::prepare).
    let warm = super::engine::Warm::new();
    crate::globals::precompile_intl();
    // What the workers inherit ready to use (see inherit.rs): the page-table entries of the
    // code this process has run, and where its heap starts, for each worker to own it.
    let heap = super::inherit::prepare();
    // Last before the first fork: this process's own seccomp filter, which every worker
    // inherits and narrows to its posture (os::zygote_filter). Without it (an error), each
    // worker installs its posture's whole program, as an exec'd one does.
    if let Some(Ok(program)) = &filter {
        let _ = os::zygote_filter::install_in_zygote(program);
    }
    // Last before the loop: the free chunks the start left are the zygote's for good (see
    // inherit.rs), so that a worker allocates in pages of its own, not in the zygote's holes.
    super::inherit::take_free_chunks(heap);
    // Ready: a zygote started ahead of its predecessor's last fork takes over only now.
    if send_with_fd(&ctrl, ZYGOTE_READY, None).is_err() {
        return 0;
    }
    let mut req = [0u8; 8];
    loop {
        match recv(ctrl.as_raw_fd(), &mut req, MsgFlags::empty()) {
            // The supervisor closed the socket: replaced, or shutting down.
            Ok(0) => return 0,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 0,
        }
        let (theirs, mine) = match pair_or_reply(&ctrl) {
            Ok(Some(p)) => p,
            Ok(None) => continue,
            Err(()) => return 0,
        };
        // The thread's clock: this process has one thread, and the process clock sums the
        // thread group in the kernel (thread_group_cputime: 0.4% of a one-shot call's CPU).
        let cpu0 = os::cpu_time_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        let pid = fork_for_parent();
        if pid == 0 {
            // The worker. dup2 puts its socket on fd 3 (closing the control socket there,
            // and clearing close-on-exec); `os::prepare` closes every other fd.
            // SAFETY: plain fd numbers; the OwnedFds on this copy of the stack are never
            // dropped (the worker leaves through process::exit).
            if unsafe { libc::dup2(mine.as_raw_fd(), WORKER_SOCKET_FD) } < 0 {
                // SAFETY: as below.
                unsafe { libc::_exit(70) };
            }
            super::set_name(c"stsd-worker");
            let code = super::serve(uid, gid, warm, heap);
            // SAFETY: _exit ends this process; nothing in it needs flushing or tearing down.
            unsafe { libc::_exit(code) };
        }
        let cpu_ns = os::cpu_time_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(cpu0);
        drop(mine);
        let r = if pid < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            reply(&ctrl, ForkReply::failed(errno), None)
        } else {
            reply(&ctrl, ForkReply::forked(pid as u32, cpu_ns), Some(&theirs))
        };
        drop(theirs);
        if r.is_err() {
            return 0;
        }
    }
}

/// The socket pair of the next worker (the supervisor's end, the worker's). Ok(None): it
/// could not be made, and the failure was replied on `ctrl`; Err: nor could that be (the
/// supervisor is gone).
pub(crate) fn pair_or_reply(ctrl: &OwnedFd) -> Result<Option<(OwnedFd, OwnedFd)>, ()> {
    match socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    ) {
        Ok(p) => Ok(Some(p)),
        Err(e) => match reply(ctrl, ForkReply::failed(e as i32), None) {
            Ok(_) => Ok(None),
            Err(_) => Err(()),
        },
    }
}

pub(crate) fn reply(ctrl: &OwnedFd, r: ForkReply, fd: Option<&OwnedFd>) -> nix::Result<usize> {
    send_with_fd(ctrl, &r.encode(), fd)
}

fn send_with_fd(ctrl: &OwnedFd, bytes: &[u8], fd: Option<&OwnedFd>) -> nix::Result<usize> {
    let iov = [IoSlice::new(bytes)];
    let fds: Vec<i32> = fd.map(AsRawFd::as_raw_fd).into_iter().collect();
    let rights = [ControlMessage::ScmRights(&fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<()>(ctrl.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
}
