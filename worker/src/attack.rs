//! Attack mode (the `attack` feature, test builds only). After the OS profile is applied, a
//! probe makes raw syscalls as an exploited engine would, with no JavaScript involved, and
//! reports what the kernel answered. A probe the seccomp filter forbids never returns: the
//! process dies of SIGSYS, which the supervisor sees.

use std::ffi::CString;
use stsd_protocol::frames::ProbeOutcome;

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
}

/// Turns a libc-style return value into an outcome.
fn outcome(rc: i64, what: &str) -> ProbeOutcome {
    if rc < 0 {
        ProbeOutcome::Denied {
            errno: last_errno(),
        }
    } else {
        ProbeOutcome::Allowed {
            detail: format!("{what} returned {rc}"),
        }
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn open(path: &str, flags: i32) -> ProbeOutcome {
    let p = cstr(path);
    // SAFETY: p is a valid NUL-terminated path for the duration of the call.
    let fd = unsafe { libc::open(p.as_ptr(), flags, 0o600) };
    outcome(fd as i64, &format!("open({path})"))
}

fn read_file(path: &str) -> ProbeOutcome {
    match std::fs::read(path) {
        Ok(b) => ProbeOutcome::Allowed {
            detail: format!("read {} bytes of {path}", b.len()),
        },
        Err(e) => ProbeOutcome::Denied {
            errno: e.raw_os_error().unwrap_or(-1),
        },
    }
}

/// Runs one probe. `base` is the sandbox's base path; `parent` the supervisor's pid.
pub fn run(name: &str, base: &str, parent: u32) -> ProbeOutcome {
    let ppid = parent as libc::pid_t;
    // SAFETY (all blocks below): raw syscalls with valid pointers to locals or null; their
    // whole point is to ask the kernel for something the sandbox must refuse.
    unsafe {
        match name {
            "open_etc_passwd" => read_file("/etc/passwd"),
            "create_in_tmp" => open(
                &format!("/tmp/stsd-attack-{}", std::process::id()),
                libc::O_CREAT | libc::O_WRONLY,
            ),
            "symlink_out_of_base" => read_file(&format!("{base}/escape-link")),
            "dotdot_out_of_base" => read_file(&format!("{base}/../../../../../../etc/passwd")),
            "socket_inet" => outcome(
                libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) as i64,
                "socket(AF_INET)",
            ),
            "socket_unix" => outcome(
                libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) as i64,
                "socket(AF_UNIX)",
            ),
            "connect_abstract_unix" => {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0 {
                    return outcome(fd as i64, "socket(AF_UNIX)");
                }
                let mut addr: libc::sockaddr_un = std::mem::zeroed();
                addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                let name = b"\0stsd-attack-abstract";
                for (i, b) in name.iter().enumerate() {
                    addr.sun_path[i] = *b as libc::c_char;
                }
                let len =
                    (std::mem::size_of::<libc::sa_family_t>() + name.len()) as libc::socklen_t;
                outcome(
                    libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) as i64,
                    "connect(abstract)",
                )
            }
            "execve_sh" => {
                let sh = cstr("/bin/sh");
                let argv = [sh.as_ptr(), std::ptr::null()];
                let envp = [std::ptr::null()];
                outcome(
                    libc::execve(sh.as_ptr(), argv.as_ptr(), envp.as_ptr()) as i64,
                    "execve",
                )
            }
            "fork" => {
                let pid = libc::fork();
                if pid == 0 {
                    libc::_exit(0);
                }
                outcome(pid as i64, "fork")
            }
            "clone_process" => {
                let rc = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
                if rc == 0 {
                    libc::_exit(0);
                }
                outcome(rc, "clone")
            }
            "clone3_process" => {
                let mut args = [0u64; 11];
                args[4] = libc::SIGCHLD as u64; // exit_signal
                let rc = libc::syscall(
                    libc::SYS_clone3,
                    args.as_mut_ptr(),
                    std::mem::size_of_val(&args),
                );
                if rc == 0 {
                    libc::_exit(0);
                }
                outcome(rc, "clone3")
            }
            "ptrace_parent" => outcome(
                libc::ptrace(
                    libc::PTRACE_ATTACH,
                    ppid,
                    std::ptr::null_mut::<libc::c_void>(),
                    std::ptr::null_mut::<libc::c_void>(),
                ) as i64,
                "ptrace(ATTACH)",
            ),
            "kill_parent" => outcome(libc::kill(ppid, libc::SIGKILL) as i64, "kill(parent)"),
            "io_uring_setup" => {
                let mut params = [0u8; 120];
                outcome(
                    libc::syscall(libc::SYS_io_uring_setup, 8, params.as_mut_ptr()),
                    "io_uring_setup",
                )
            }
            "process_vm_readv" => {
                let mut buf = [0u8; 8];
                let local = libc::iovec {
                    iov_base: buf.as_mut_ptr() as *mut libc::c_void,
                    iov_len: 8,
                };
                let remote = libc::iovec {
                    iov_base: 0x400000 as *mut libc::c_void,
                    iov_len: 8,
                };
                outcome(
                    libc::process_vm_readv(ppid, &local, 1, &remote, 1, 0) as i64,
                    "process_vm_readv",
                )
            }
            "mount_tmpfs" => {
                let (src, target, fstype) = (cstr("none"), cstr(base), cstr("tmpfs"));
                outcome(
                    libc::mount(
                        src.as_ptr(),
                        target.as_ptr(),
                        fstype.as_ptr(),
                        0,
                        std::ptr::null(),
                    ) as i64,
                    "mount",
                )
            }
            "unshare_user" => outcome(
                libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) as i64,
                "unshare",
            ),
            "chmod_outside_base" => {
                let p = cstr("/etc/passwd");
                outcome(libc::chmod(p.as_ptr(), 0o777) as i64, "chmod(/etc/passwd)")
            }
            "mknod_outside_base" => {
                let p = cstr(&format!("/tmp/stsd-attack-node-{}", std::process::id()));
                outcome(
                    libc::mknod(p.as_ptr(), libc::S_IFIFO | 0o600, 0) as i64,
                    "mknod(/tmp)",
                )
            }
            "bpf_prog_load" => {
                let mut attr = [0u8; 128];
                outcome(
                    libc::syscall(libc::SYS_bpf, 5, attr.as_mut_ptr(), attr.len()),
                    "bpf",
                )
            }
            "perf_event_open" => {
                let mut attr = [0u8; 128];
                attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
                outcome(
                    libc::syscall(libc::SYS_perf_event_open, attr.as_mut_ptr(), 0, -1, -1, 0),
                    "perf_event_open",
                )
            }
            "write_proc_self_mem" => open("/proc/self/mem", libc::O_RDWR),
            "seccomp_loosen" => {
                // A second filter that allows everything; the kernel would AND it with the
                // first anyway, but the call itself must not even be reachable.
                let allow = libc::sock_filter {
                    code: 0x06, // BPF_RET | BPF_K
                    jt: 0,
                    jf: 0,
                    k: 0x7fff_0000, // SECCOMP_RET_ALLOW
                };
                let prog = libc::sock_fprog {
                    len: 1,
                    filter: &allow as *const _ as *mut libc::sock_filter,
                };
                outcome(
                    libc::syscall(libc::SYS_seccomp, 1, 0, &prog as *const libc::sock_fprog),
                    "seccomp(SET_MODE_FILTER)",
                )
            }
            "setuid_root" => outcome(libc::setuid(0) as i64, "setuid(0)"),
            "keyctl" => outcome(libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0), "keyctl"),
            "userfaultfd" => outcome(libc::syscall(libc::SYS_userfaultfd, 0), "userfaultfd"),
            "mmap_exec" => {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                outcome(
                    if p == libc::MAP_FAILED { -1 } else { 0 },
                    "mmap(PROT_EXEC)",
                )
            }
            "mprotect_exec" => {
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                outcome(
                    libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) as i64,
                    "mprotect(PROT_EXEC)",
                )
            }
            "fcntl_setown_parent" => {
                // SIGIO ownership of the socket aimed at the supervisor: a signal by other means.
                outcome(
                    libc::fcntl(3, libc::F_SETOWN, ppid) as i64,
                    "fcntl(F_SETOWN)",
                )
            }
            "sendmsg_scm_rights" => {
                let mut data = [0u8; 1];
                let mut iov = libc::iovec {
                    iov_base: data.as_mut_ptr() as *mut libc::c_void,
                    iov_len: 1,
                };
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                outcome(libc::sendmsg(3, &msg, 0) as i64, "sendmsg")
            }
            "open_o_path_outside" => open("/etc/shadow", libc::O_PATH),
            "stat_outside" => {
                let p = cstr("/etc/shadow");
                let mut st: libc::stat = std::mem::zeroed();
                outcome(libc::stat(p.as_ptr(), &mut st) as i64, "stat(/etc/shadow)")
            }
            "statx_outside" => {
                let p = cstr("/etc/shadow");
                let mut st: libc::statx = std::mem::zeroed();
                outcome(
                    // The raw call: libc's `statx` is a weak symbol in std's static build, which
                    // a link-time-optimised build may leave unresolved (null).
                    libc::syscall(
                        libc::SYS_statx,
                        libc::AT_FDCWD,
                        p.as_ptr(),
                        0,
                        libc::STATX_SIZE,
                        &mut st as *mut libc::statx,
                    ),
                    "statx(/etc/shadow)",
                )
            }
            "readlink_outside" => {
                let p = cstr("/proc/1/exe");
                let mut buf = [0u8; 256];
                outcome(
                    libc::readlink(p.as_ptr(), buf.as_mut_ptr() as *mut libc::c_char, buf.len())
                        as i64,
                    "readlink",
                )
            }
            "x32_syscall" => outcome(libc::syscall(0x4000_0000 | libc::SYS_getpid), "x32 getpid"),
            // prlimit64 is allowed for the worker's own RLIMIT_CPU only (worker reuse).
            "prlimit_parent_cpu" => {
                let lim = libc::rlimit64 {
                    rlim_cur: 1,
                    rlim_max: 1,
                };
                outcome(
                    libc::prlimit64(ppid, libc::RLIMIT_CPU, &lim, std::ptr::null_mut()) as i64,
                    "prlimit64(parent, CPU)",
                )
            }
            "raise_own_nofile" => {
                let lim = libc::rlimit64 {
                    rlim_cur: 4096,
                    rlim_max: 4096,
                };
                outcome(
                    libc::prlimit64(0, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) as i64,
                    "prlimit64(self, NOFILE)",
                )
            }
            "raise_own_cpu_hard" => {
                let lim = libc::rlimit64 {
                    rlim_cur: 1 << 20,
                    rlim_max: 1 << 20,
                };
                outcome(
                    libc::prlimit64(0, libc::RLIMIT_CPU, &lim, std::ptr::null_mut()) as i64,
                    "prlimit64(self, CPU hard up)",
                )
            }
            "read_inside_base" => read_file(&format!("{base}/inside.txt")),
            "write_inside_base" => {
                match std::fs::write(format!("{base}/written-by-probe.txt"), b"ok") {
                    Ok(()) => ProbeOutcome::Allowed {
                        detail: "wrote inside the base path".into(),
                    },
                    Err(e) => ProbeOutcome::Denied {
                        errno: e.raw_os_error().unwrap_or(-1),
                    },
                }
            }
            // Past the write budget without the fs helper: RLIMIT_FSIZE must stop it (EFBIG).
            "write_past_fsize" => {
                let chunk = vec![b'x'; 1 << 20];
                let r =
                    std::fs::File::create(format!("{base}/fsize-probe.bin")).and_then(|mut f| {
                        use std::io::Write;
                        for _ in 0..256 {
                            f.write_all(&chunk)?;
                        }
                        Ok(())
                    });
                match r {
                    Ok(()) => ProbeOutcome::Allowed {
                        detail: "wrote 256 MiB in one file".into(),
                    },
                    Err(e) => ProbeOutcome::Denied {
                        errno: e.raw_os_error().unwrap_or(-1),
                    },
                }
            }
            // The frame went out before the probe ran (lib.rs): nothing to do here.
            "send_bytecode" => ProbeOutcome::Skipped {
                why: "sent a Bytecode frame in a call".into(),
            },
            other => ProbeOutcome::Skipped {
                why: format!("unknown probe {other}"),
            },
        }
    }
}

/// Every probe that must fail under every posture.
pub const HOSTILE: &[&str] = &[
    "open_etc_passwd",
    "create_in_tmp",
    "symlink_out_of_base",
    "dotdot_out_of_base",
    "socket_inet",
    "socket_unix",
    "connect_abstract_unix",
    "execve_sh",
    "fork",
    "clone_process",
    "clone3_process",
    "ptrace_parent",
    "kill_parent",
    "io_uring_setup",
    "process_vm_readv",
    "mount_tmpfs",
    "unshare_user",
    "chmod_outside_base",
    "mknod_outside_base",
    "bpf_prog_load",
    "perf_event_open",
    "write_proc_self_mem",
    "seccomp_loosen",
    "setuid_root",
    "keyctl",
    "userfaultfd",
    "mmap_exec",
    "mprotect_exec",
    "fcntl_setown_parent",
    "sendmsg_scm_rights",
    "prlimit_parent_cpu",
    "raise_own_nofile",
    "raise_own_cpu_hard",
    "open_o_path_outside",
    "stat_outside",
    "statx_outside",
    "readlink_outside",
    "x32_syscall",
];
