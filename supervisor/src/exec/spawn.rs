//! Starting a worker: a fresh exec of the stsd binary (`stsd worker`), never a fork of the
//! multi-threaded supervisor, with one SOCK_SEQPACKET socket inherited on fd 3, stdio on
//! /dev/null, an empty environment, and a parent-death signal.

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use stsd_profiles::os::WORKER_SOCKET_FD;

pub struct Spawned {
    pub child: Child,
    pub socket: OwnedFd,
}

pub fn spawn_worker(exe: &Path, uid: u32, gid: u32) -> std::io::Result<Spawned> {
    let (parent, child_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let child_raw = child_end.as_raw_fd();
    let mut cmd = Command::new(exe);
    cmd.arg("worker")
        .args(["--uid", &uid.to_string(), "--gid", &gid.to_string()])
        .env_clear()
        // Tools see UTC; nothing of the host's environment crosses over.
        .env("TZ", "UTC")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (fcntl, dup2, prctl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if child_raw == WORKER_SOCKET_FD {
                // dup2 onto itself keeps CLOEXEC; clear it explicitly.
                let flags = libc::fcntl(child_raw, libc::F_GETFD);
                if flags < 0 || libc::fcntl(child_raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(child_raw, WORKER_SOCKET_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // Our copy of the worker's end must go, or a dead worker never reads as EOF.
    drop(child_end);
    Ok(Spawned {
        child,
        socket: parent,
    })
}
