//! Socket activation: systemd passes listening sockets from fd 3 (SD_LISTEN_FDS_START) on,
//! LISTEN_FDS of them, for the process LISTEN_PID. stsd takes exactly one, and checks that it
//! is what `stsd.socket` makes: a listening AF_UNIX stream socket.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

const SD_LISTEN_FDS_START: RawFd = 3;

#[derive(Debug)]
pub struct ListenFd {
    pub fd: OwnedFd,
    /// The socket's path (for the banner); None for an abstract or unnamed socket.
    pub path: Option<PathBuf>,
}

/// Takes fd 3 as the daemon's listening socket. `n` is LISTEN_FDS.
pub(super) fn take(n: &str, names: Option<&str>) -> Result<ListenFd, String> {
    let n: RawFd = n
        .trim()
        .parse()
        .map_err(|_| format!("LISTEN_FDS={n:?} is not a number"))?;
    if n != 1 {
        return Err(format!(
            "LISTEN_FDS={n}: stsd takes exactly one socket (names: {})",
            names.unwrap_or("-")
        ));
    }
    let fd = SD_LISTEN_FDS_START;
    // SAFETY: fcntl on a descriptor number; an unused one fails with EBADF, checked.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(format!("LISTEN_FDS=1 but fd {fd} is not open"));
    }
    // Not inherited by workers or approval commands.
    // SAFETY: as above, on an open descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    let int_opt = |opt| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: v and len are valid for the kernel to write an int into.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        (r == 0).then_some(v)
    };
    if int_opt(libc::SO_DOMAIN) != Some(libc::AF_UNIX)
        || int_opt(libc::SO_TYPE) != Some(libc::SOCK_STREAM)
    {
        return Err(format!(
            "fd {fd} from systemd is not an AF_UNIX stream socket (ListenStream= a path)"
        ));
    }
    if int_opt(libc::SO_ACCEPTCONN) != Some(1) {
        return Err(format!("fd {fd} from systemd is not listening"));
    }
    // SAFETY: fd is open, ours (systemd passed it to this pid), and owned nowhere else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let path = std::os::unix::net::UnixListener::from(
        fd.try_clone()
            .map_err(|e| format!("fd from systemd: {e}"))?,
    )
    .local_addr()
    .ok()
    .and_then(|a| a.as_pathname().map(PathBuf::from));
    Ok(ListenFd { fd, path })
}
