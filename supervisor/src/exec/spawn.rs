//! Making a worker: forked by the zygote (`[worker] spawn = "zygote"`, the default; see
//! [`super::zygote`]) or a fresh exec of the stsd binary (`spawn = "exec"`). Either way the
//! worker is never a fork of the multi-threaded supervisor, it is the supervisor's child, it
//! holds one SOCK_SEQPACKET socket on fd 3 and nothing else, its stdio is /dev/null, its
//! environment is empty, and its parent-death signal follows the supervisor.
//!
//! The binary is exec'd from a descriptor opened when the daemon started, so a binary
//! replaced on disk (a package upgrade) never mixes versions in a running daemon.

use crate::cgroup::Group;
use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::Arc;
use stsd_profiles::os::WORKER_SOCKET_FD;

/// A child process of the supervisor (a worker or the zygote), reaped by pid.
#[derive(Debug)]
pub struct ChildProc {
    pid: i32,
    status: Option<ExitStatus>,
}

impl ChildProc {
    pub fn from_pid(pid: u32) -> ChildProc {
        ChildProc {
            pid: pid as i32,
            status: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    fn waitpid(&mut self, flags: libc::c_int) -> std::io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        loop {
            let mut raw = 0;
            // SAFETY: waitpid on our own child's pid, writing into a local.
            let r = unsafe { libc::waitpid(self.pid, &mut raw, flags) };
            if r == self.pid {
                let s = ExitStatus::from_raw(raw);
                self.status = Some(s);
                return Ok(Some(s));
            }
            if r == 0 {
                return Ok(None);
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(e);
            }
        }
    }

    /// The exit status when the process has ended (it is then reaped), else None.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.waitpid(libc::WNOHANG)
    }

    pub fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.waitpid(0)?
            .ok_or_else(|| std::io::Error::other("waitpid returned no status"))
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.try_wait(), Ok(None))
    }

    /// SIGKILL, without waiting for the process to be gone. Only a live, unreaped child of
    /// ours is signalled: its pid cannot have been reused, and a pid that is not our child
    /// (ECHILD) is never touched. Returns whether it was still alive.
    pub fn kill(&mut self) -> bool {
        let alive = matches!(self.try_wait(), Ok(None));
        if alive {
            // SAFETY: kill(2) on our own live child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        alive
    }

    /// SIGKILL and reap (see [`ChildProc::kill`]).
    pub fn kill_and_reap(&mut self) {
        if self.kill() {
            let _ = self.wait();
        }
    }
}

/// The stsd binary, held open since the daemon started.
#[derive(Debug)]
pub struct ExeFile {
    file: File,
    /// The control group every child exec'd from here joins before it execs (the pool's).
    group: Option<Arc<Group>>,
}

impl ExeFile {
    /// `path`, or this very process's binary (`/proc/self/exe`) when `path` is it.
    pub fn open(path: &Path) -> std::io::Result<ExeFile> {
        let own = std::env::current_exe().is_ok_and(|me| me == path);
        let opened = File::open(if own {
            Path::new("/proc/self/exe")
        } else {
            path
        })?;
        // Kept well above fd 3, where a child's socket is put before it execs this.
        // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the new one is owned by `file`.
        let fd = unsafe { libc::fcntl(opened.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 16) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by fcntl and nothing else owns it.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(ExeFile { file, group: None })
    }

    /// Every child exec'd from here joins `group` between fork and exec.
    pub fn in_group(mut self, group: Option<Arc<Group>>) -> ExeFile {
        self.group = group;
        self
    }

    pub fn group(&self) -> Option<&Arc<Group>> {
        self.group.as_ref()
    }

    /// A path that execs the held file (the kernel resolves it before close-on-exec applies).
    pub fn exec_path(&self) -> String {
        format!("/proc/self/fd/{}", self.file.as_raw_fd())
    }

    /// `stsd <role> --uid U --gid G` with `socket` on fd 3, stdio on /dev/null, an empty
    /// environment (TZ=UTC: tools see UTC) and a parent-death signal.
    pub fn command(&self, role: &str, uid: u32, gid: u32, socket: &OwnedFd) -> Command {
        let child_raw = socket.as_raw_fd();
        let mut cmd = Command::new(self.exec_path());
        cmd.arg(role)
            .args(["--uid", &uid.to_string(), "--gid", &gid.to_string()])
            .env_clear()
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2, prctl, and write to join the
        // pool's cgroup) between fork and exec.
        unsafe {
            // First: the child joins the pool's group before anything else runs in it.
            if let Some(g) = &self.group {
                cmd.pre_exec(g.join_hook());
            }
            cmd.pre_exec(move || {
                if child_raw == WORKER_SOCKET_FD {
                    // dup2 onto itself keeps CLOEXEC; clear it explicitly.
                    let flags = libc::fcntl(child_raw, libc::F_GETFD);
                    if flags < 0
                        || libc::fcntl(child_raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
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
        cmd
    }
}

/// A socket pair for a worker or the zygote: (the supervisor's end, the child's end).
pub fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(std::io::Error::from)
}

/// CPU time of the calling thread, nanoseconds.
fn thread_cpu_ns() -> u64 {
    stsd_profiles::os::cpu_time_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A worker process just made, before its Ready frame.
pub struct Spawned {
    pub proc: ChildProc,
    pub socket: OwnedFd,
    /// CPU the maker spent on it (the zygote's fork, or the supervisor's fork and exec),
    /// nanoseconds; the worker reports its own share in its Ready frame.
    pub maker_cpu_ns: u64,
}

pub(super) fn spawn_exec(exe: &ExeFile, uid: u32, gid: u32) -> std::io::Result<Spawned> {
    let cpu0 = thread_cpu_ns();
    let (parent, child_end) = seqpacket_pair()?;
    let child = exe.command("worker", uid, gid, &child_end).spawn()?;
    // Our copy of the worker's end must go, or a dead worker never reads as EOF.
    drop(child_end);
    // Reaped by pid from here on (std's handle neither waits nor kills when dropped).
    let proc = ChildProc::from_pid(child.id());
    drop(child);
    Ok(Spawned {
        proc,
        socket: parent,
        maker_cpu_ns: thread_cpu_ns().saturating_sub(cpu0),
    })
}
