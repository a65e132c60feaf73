//! A networked upstream's only way out: its own network namespace, where loopback holds one
//! listener, `127.0.0.1:PORT`, that its `HTTP_PROXY` names. Behind it is this forwarder, a
//! process forked by `upstream-exec` inside the namespace before the upstream is exec'd. It
//! accepts each connection and hands the accepted socket itself to the supervisor over the
//! channel the supervisor gave (fd passing, `SCM_RIGHTS`), where the egress proxy serves it
//! as if it had accepted it: allowlist, SSRF guard, audit. No address of the host is reachable
//! from the namespace (it has no other interface and no route), so a port is no longer a way
//! past the proxy: before, Landlock's TCP rule named the proxy's port on the host's loopback,
//! and 127.0.0.2:PORT or any public address on PORT went around it. Landlock's port rule
//! stays, as a second layer.
//!
//! The forwarder itself is fenced: the upstream's user, no capability, no_new_privs, the
//! parent-death signal, a Landlock domain that grants nothing, and the upstream's seccomp
//! deny-list. It holds two descriptors: the listener and the channel.

use std::convert::Infallible;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Brings the namespace's loopback up (a new network namespace starts with it down).
fn loopback_up() -> Result<(), String> {
    let err = |what: &str| format!("loopback up: {what}: {}", std::io::Error::last_os_error());
    // SAFETY: socket(2) with integer arguments; the fd is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(err("socket"));
    }
    // SAFETY: fd is a fresh descriptor of ours.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed ifreq is valid; the name is copied within its bounds (3 of 16 bytes).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(err("SIOCGIFFLAGS"));
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(err("SIOCSIFFLAGS"));
        }
    }
    Ok(())
}

/// Starts the forwarder for `port`, sending accepted connections on `channel`. Called in the
/// upstream's own network namespace, single-threaded, before privileges are dropped. In the
/// caller, the channel is closed on return (only the forwarder holds it).
pub(super) fn start(port: u16, channel: RawFd, uid: u32, gid: u32) -> Result<(), String> {
    loopback_up()?;
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("proxy listener 127.0.0.1:{port}: {e}"))?;
    let me = std::process::id();
    // SAFETY: this process is single-threaded (a fresh exec of stsd), so the child may run
    // any code.
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            let e = match serve(listener, channel, uid, gid, me) {
                Ok(never) => match never {},
                Err(e) => e,
            };
            eprintln!("SANDBOX_UNAVAILABLE: proxy forwarder: {e}");
            // SAFETY: _exit ends this child at once, with nothing of the parent's to flush.
            unsafe { libc::_exit(super::EXIT_SANDBOX_UNAVAILABLE) }
        }
        nix::unistd::ForkResult::Parent { .. } => {
            drop(listener);
            // SAFETY: the channel was given to this process, and is the forwarder's now.
            drop(unsafe { OwnedFd::from_raw_fd(channel) });
            Ok(())
        }
    }
}

/// The forwarder's life: fenced, then accept and hand over until the channel or the
/// upstream is gone.
fn serve(
    listener: std::net::TcpListener,
    channel: RawFd,
    uid: u32,
    gid: u32,
    parent: u32,
) -> Result<Infallible, String> {
    // Nothing but the listener and the channel (stdio included: the upstream's pipes are
    // the upstream's).
    let keep = [listener.as_raw_fd(), channel];
    for fd in 0..=keep.iter().copied().max().unwrap_or(0) {
        if !keep.contains(&fd) {
            // SAFETY: closing descriptors this process holds and no Rust object owns.
            unsafe { libc::close(fd) };
        }
    }
    let above = keep.iter().copied().max().unwrap_or(2) as u32 + 1;
    // SAFETY: close_range with integer arguments.
    unsafe { libc::close_range(above, u32::MAX, 0) };
    // The forwarder lives exactly as long as the upstream: a pidfd of it, polled beside the
    // listener (the parent-death signal alone did not end it in every case).
    // SAFETY: pidfd_open with integer arguments; the fd is owned right after.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, parent as libc::pid_t, 0) };
    if pidfd < 0 {
        return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor of ours.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    crate::os::privileges::switch_user(uid, gid)?;
    crate::os::privileges::clear_capabilities()?;
    crate::os::privileges::lock_process(parent)?;
    fence_nothing()?;
    let [enosys, deny] = super::filter::programs()?;
    seccompiler::apply_filter(&enosys).map_err(|e| format!("seccomp: {e}"))?;
    seccompiler::apply_filter(&deny).map_err(|e| format!("seccomp: {e}"))?;
    // SAFETY: the channel is this process's alone now.
    let channel = unsafe { OwnedFd::from_raw_fd(channel) };
    loop {
        let mut fds = [
            libc::pollfd {
                fd: listener.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll on two pollfds we own, no timeout.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(format!("poll: {}", std::io::Error::last_os_error()));
        }
        if fds[1].revents != 0 {
            // The upstream has exited.
            std::process::exit(0);
        }
        if fds[0].revents == 0 {
            continue;
        }
        let conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(format!("accept: {e}")),
        };
        let fds = [conn.as_raw_fd()];
        let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
        let iov = [std::io::IoSlice::new(b"c")];
        if let Err(e) = nix::sys::socket::sendmsg::<()>(
            channel.as_raw_fd(),
            &iov,
            &cmsg,
            nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            // The supervisor closed its end (the upstream is being stopped): done.
            if matches!(e, nix::errno::Errno::EPIPE | nix::errno::Errno::ECONNRESET) {
                std::process::exit(0);
            }
            return Err(format!("sendmsg: {e}"));
        }
        drop(conn);
    }
}

/// A Landlock domain that grants nothing: no file, no TCP bind or connect. Accepting on a
/// socket bound before needs no right.
fn fence_nothing() -> Result<(), String> {
    use landlock::{
        Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, RulesetStatus,
        Scope, ABI,
    };
    let err = |e: landlock::RulesetError| format!("landlock: {e}");
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI::V9))
        .map_err(err)?
        .handle_access(AccessNet::from_all(ABI::V9))
        .map_err(err)?
        .scope(Scope::from_all(ABI::V9))
        .map_err(err)?
        .create()
        .map_err(err)?
        .restrict_self()
        .map_err(err)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("Landlock is not enforced on this kernel".into());
    }
    Ok(())
}
