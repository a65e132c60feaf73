//! Stdio upstreams run confined: `stsd upstream-exec` around small programs (sh, Debian's
//! python3.11, node), started exactly as the gateway starts them (the argv and environment
//! of `gateway::command_as`), and probed from inside: the filesystem walls, the
//! process state, the refused escape calls, the network, and the fail-closed exit.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use stsd::gateway as spawn;
use stsd_profiles::upstream::UpstreamConfig;
use stsd_tests::stsd_bin;

/// Debian's interpreter: the `python3` on PATH here is pyenv's under /root (mode 0700),
/// which the worker user cannot reach.
const PYTHON: &str = "/usr/bin/python3.11";
const NODE: &str = "/usr/bin/node";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A scratch tree: `ws` (the workspace, prepared as the gateway prepares it), `data` (a
/// directory the upstream is given to read) and `secret` (one it is not).
struct Scratch {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ws: PathBuf,
    data: PathBuf,
    secret: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        // The worker user must be able to reach into it (tempdirs are 0700).
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = root.join("ws");
        spawn::prepare_workspace(&ws, 65534, 65534).unwrap();
        let data = root.join("data");
        let secret = root.join("secret");
        for (d, text) in [(&data, "readable"), (&secret, "hidden")] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("f.txt"), text).unwrap();
        }
        Scratch {
            _dir: dir,
            root,
            ws,
            data,
            secret,
        }
    }

    fn config(&self, program: &str, args: &[&str]) -> UpstreamConfig {
        UpstreamConfig {
            id: "t".into(),
            command: Some(program.into()),
            args: args.iter().map(|s| s.to_string()).collect(),
            read_paths: vec![self.data.clone()],
            ..Default::default()
        }
    }
}

/// The gateway's command for `cfg`, as a std Command (same program, argv, environment and
/// working directory), so the test can wait on it synchronously. With `proxy` (a port), the
/// child inherits its end of a proxy channel as the gateway's does; the test's end is
/// returned, where the forwarder in the upstream's namespace hands its connections.
fn gateway_command(
    s: &Scratch,
    cfg: &UpstreamConfig,
    env: BTreeMap<String, String>,
    proxy: Option<u16>,
) -> (Command, Option<std::os::fd::OwnedFd>) {
    use std::os::fd::AsRawFd;
    let pair = proxy.map(|port| spawn::ProxyEnd::pair(port).unwrap());
    let (mine, theirs) = match pair {
        Some((m, t)) => (Some(m), Some(t)),
        None => (None, None),
    };
    let child_fd = theirs.as_ref().map(|t| t.channel.as_raw_fd());
    let tokio_cmd =
        spawn::command_as(cfg, env, &s.ws, theirs, &stsd_bin(), spawn::Ids::default()).unwrap();
    let c = tokio_cmd.as_std();
    let mut cmd = Command::new(c.get_program());
    cmd.args(c.get_args()).env_clear();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    if let Some(d) = c.get_current_dir() {
        cmd.current_dir(d);
    }
    cmd.stdin(Stdio::null());
    if let Some(fd) = child_fd {
        // The tokio command (which holds the child's end open) lives as long as this one.
        let held = std::sync::Mutex::new(Some(tokio_cmd));
        // SAFETY: only fcntl between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let _held = &held;
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    (cmd, mine)
}

fn run(s: &Scratch, program: &str, args: &[&str], proxy: Option<u16>) -> Output {
    run_with_channel(s, program, args, proxy).0
}

/// [`run`], also returning the test's end of the proxy channel (still open).
fn run_with_channel(
    s: &Scratch,
    program: &str,
    args: &[&str],
    proxy: Option<u16>,
) -> (Output, Option<std::os::fd::OwnedFd>) {
    let (mut cmd, mine) = gateway_command(s, &s.config(program, args), BTreeMap::new(), proxy);
    (cmd.output().unwrap(), mine)
}

fn stdout(o: &Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn python(s: &Scratch, code: &str, proxy: Option<u16>) -> String {
    stdout(&run(s, PYTHON, &["-c", code], proxy))
}

/// Python helpers for the probes: `tryopen` and `connect` print an errno name or "ok".
const PY_PRELUDE: &str = r#"
import errno, os, socket, ctypes
def tryopen(p, mode):
    try:
        open(p, mode).close(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def connect(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port)); return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
def sock(family, kind):
    try:
        socket.socket(family, kind).close(); return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
"#;

#[test]
fn reads_only_the_read_paths_and_writes_only_the_workspace() {
    let s = Scratch::new();
    let outside = s.root.join("outside.txt");
    let _ = std::fs::remove_file("/tmp/stsd-upstream-confine-probe");
    let code = format!(
        "{PY_PRELUDE}\nprint(' '.join([tryopen('/etc/passwd','r'), tryopen('/etc/shadow','r'), \
         tryopen('{data}','r'), tryopen('{secret}','r'), tryopen('{ws}/new.txt','w'), \
         tryopen('/tmp/stsd-upstream-confine-probe','w'), tryopen('{outside}','w'), \
         tryopen('/dev/null','w')]))",
        data = s.data.join("f.txt").display(),
        secret = s.secret.join("f.txt").display(),
        ws = s.ws.display(),
        outside = outside.display(),
    );
    let out = python(&s, &code, None);
    assert_eq!(out, "EACCES EACCES ok EACCES ok EACCES EACCES ok");
    assert!(s.ws.join("new.txt").exists());
    assert!(!outside.exists());
    assert!(!Path::new("/tmp/stsd-upstream-confine-probe").exists());
    // A shell too: reading /etc/passwd fails, the read path and the workspace work.
    let o = run(
        &s,
        "/bin/sh",
        &[
            "-c",
            &format!(
                "cat /etc/passwd >/dev/null 2>&1 && echo leaked; cat {}; echo w > $HOME/w && cat $HOME/w",
                s.data.join("f.txt").display()
            ),
        ],
        None,
    );
    // f.txt has no trailing newline.
    assert_eq!(stdout(&o), "readablew");
}

#[test]
fn process_is_locked_and_unprivileged() {
    let s = Scratch::new();
    let status = python(&s, "print(open('/proc/self/status').read())", None);
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2");
    if is_root() {
        assert_eq!(field("Uid:"), "65534 65534 65534 65534");
        assert_eq!(field("Gid:"), "65534 65534 65534 65534");
        assert_eq!(field("Groups:"), "");
        for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
            assert_eq!(field(cap), "0000000000000000", "{cap}");
        }
    }
    // rlimits: no core, a process cap, data and file size bounded.
    let limits = python(
        &s,
        "import resource as r\nprint(r.getrlimit(r.RLIMIT_CORE), r.getrlimit(r.RLIMIT_NPROC)[0], \
         r.getrlimit(r.RLIMIT_DATA)[0], r.getrlimit(r.RLIMIT_FSIZE)[0])",
        None,
    );
    assert_eq!(limits, "(0, 0) 512 4294967296 1073741824");
}

#[test]
fn only_stdio_is_inherited_and_the_environment_is_the_given_one() {
    let s = Scratch::new();
    let mut env = BTreeMap::new();
    env.insert("API_KEY".to_string(), "k-123".to_string());
    let cfg = s.config(
        PYTHON,
        &[
            "-c",
            "import os\nprint(sorted(int(f) for f in os.listdir('/proc/self/fd')))\n\
             print(sorted(os.environ.keys()))\nprint(os.environ['API_KEY'], os.getcwd())",
        ],
    );
    let mut cmd = gateway_command(&s, &cfg, env, None).0;
    // An fd the daemon leaked without close-on-exec must not reach the upstream.
    // SAFETY: dup2 between fork and exec, async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::dup2(2, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = stdout(&cmd.output().unwrap());
    let lines: Vec<&str> = out.lines().collect();
    // 0-2, plus the directory listing itself.
    assert_eq!(lines[0], "[0, 1, 2, 3]");
    // Exactly what the gateway set: nothing of the test's (the daemon's) own environment.
    assert_eq!(lines[1], "['API_KEY', 'HOME', 'LANG', 'PATH', 'TMPDIR']");
    assert_eq!(lines[2], format!("k-123 {}", s.ws.display()));
}

/// x86_64 syscall numbers (python's ctypes calls syscall(2) directly).
#[cfg(target_arch = "x86_64")]
#[test]
fn escape_calls_are_refused() {
    let s = Scratch::new();
    let code = format!(
        r#"{PY_PRELUDE}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    if r == 0 and nr == 56:
        os._exit(0)  # a clone that went through: the child leaves at once
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
def in_child(f):
    # A probe whose success would change this process (being traced) runs in a child that
    # reports through its exit status.
    pid = os.fork()
    if pid == 0:
        r = f()
        os._exit(0 if r == "ok" else getattr(errno, r))
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "ok" if code == 0 else errno.errorcode[code]
CLONE_NEWUSER = 0x10000000
res = dict(
    ptrace=in_child(lambda: sc(101, 0, 0, 0, 0)),  # PTRACE_TRACEME
    unshare=sc(272, CLONE_NEWUSER),
    clone_newuser=sc(56, CLONE_NEWUSER | 17, 0, 0, 0, 0),
    clone3=sc(435, 0, 0),
    mount=sc(165, 0, 0, 0, 0, 0),
    bpf=sc(321, 5, 0, 0),                  # BPF_PROG_LOAD
    io_uring_setup=sc(425, 1, 0),
    userfaultfd=sc(323, 0),
    keyctl=sc(250, 0, 0, 0, 0, 0),
    perf_event_open=sc(298, 0, 0, -1, -1, 0),
    setns=sc(308, 0, 0),
)
print(" ".join(f"{{k}}={{v}}" for k, v in res.items()))
import threading, subprocess
t = threading.Thread(target=lambda: None); t.start(); t.join()
print(subprocess.run(["/bin/sh", "-c", "echo child"], capture_output=True, text=True).stdout.strip())
"#
    );
    let out = python(&s, &code, None);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().unwrap_or_default(),
        "ptrace=EPERM unshare=EPERM clone_newuser=EPERM clone3=ENOSYS mount=EPERM bpf=EPERM \
         io_uring_setup=EPERM userfaultfd=EPERM keyctl=EPERM perf_event_open=EPERM setns=EPERM"
    );
    // Threads and child processes still work (clone without namespace flags, execve).
    assert_eq!(lines.next(), Some("child"));
}

#[test]
fn no_network_means_none() {
    let s = Scratch::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let code = format!(
        "{PY_PRELUDE}\nprint(connect({port}) != 'ok', sock(socket.AF_INET, socket.SOCK_DGRAM), \
         sock(socket.AF_INET6, socket.SOCK_DGRAM), sock(socket.AF_INET, socket.SOCK_RAW), \
         sock(socket.AF_NETLINK, socket.SOCK_RAW), sock(socket.AF_NETLINK, socket.SOCK_DGRAM), \
         sock(socket.AF_PACKET, socket.SOCK_DGRAM))"
    );
    // Netlink (issue 31 item 9: an upstream could list the host's sockets and interfaces
    // through it) and packet sockets are refused like non-TCP inet sockets.
    assert_eq!(
        python(&s, &code, None),
        "True EPERM EPERM EPERM EPERM EPERM EPERM"
    );
    // Unix sockets (socketpair) are not network: still there.
    assert_eq!(
        python(
            &s,
            "import socket\na, b = socket.socketpair()\nprint('pair')",
            None
        ),
        "pair"
    );
}

/// Serves the connections a forwarder hands over `channel`: each gets `pong` for its line.
/// Returns how many it served once the channel closes.
fn serve_channel(channel: std::os::fd::OwnedFd) -> std::thread::JoinHandle<usize> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::io::{BufRead, Write};
    use std::os::fd::{AsRawFd, FromRawFd};
    std::thread::spawn(move || {
        let mut served = 0;
        loop {
            let mut byte = [0u8; 1];
            let mut iov = [std::io::IoSliceMut::new(&mut byte)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
            let Ok(msg) = recvmsg::<()>(
                channel.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::empty(),
            ) else {
                return served;
            };
            let fds: Vec<i32> = msg
                .cmsgs()
                .into_iter()
                .flatten()
                .filter_map(|c| match c {
                    ControlMessageOwned::ScmRights(f) => Some(f),
                    _ => None,
                })
                .flatten()
                .collect();
            if msg.bytes == 0 && fds.is_empty() {
                return served;
            }
            for fd in fds {
                // SAFETY: received with SCM_RIGHTS: ours to own.
                let sock = unsafe { std::net::TcpStream::from_raw_fd(fd) };
                let mut line = String::new();
                let _ = std::io::BufReader::new(&sock).read_line(&mut line);
                let _ = (&sock).write_all(format!("pong {}", line.trim()).as_bytes());
                served += 1;
            }
        }
    })
}

/// Issue 31 item 2: a networked upstream's only way out is its proxy. In its own network
/// namespace, 127.0.0.1:PORT is a forwarder that hands each connection to the supervisor
/// over a channel; 127.0.0.2:PORT, the host's loopback services (a listener of the test's on
/// the host), another upstream's proxy port on the host and any other address are not there
/// at all. Before, Landlock's rule named the port only: 127.0.0.2:PORT and the host's
/// listeners on PORT were reachable.
#[test]
fn a_proxy_port_is_the_only_way_out() {
    let s = Scratch::new();
    // Host listeners: a service on loopback, and "another upstream's proxy".
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let (hp, op) = (
        host.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    // The upstream's proxy port is the host service's port number: inside the namespace it
    // names the forwarder, never the host's listener.
    let pp = hp;
    let code = format!(
        r#"{PY_PRELUDE}
import os
def ask(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr); s.sendall(b"ping\n"); return s.recv(64).decode() or "closed"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
ifaces = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])
res = [ask(("127.0.0.1", {pp})), ask(("127.0.0.2", {pp})), ask(("127.0.0.1", {op})),
       connect({op}), ",".join(ifaces)]
if ifaces == ["lo"]:
    # No route out of this namespace: the kernel refuses at once, nothing is sent.
    res.append(ask(("192.0.2.2", {pp})))
print(*res, sock(socket.AF_INET, socket.SOCK_DGRAM), os.environ['HTTPS_PROXY'])
b = socket.socket()
try:
    b.bind(('127.0.0.1', 0)); print('bound')
except OSError as e:
    print(errno.errorcode[e.errno])
"#
    );
    let (pp_out, channel) = {
        let (mut cmd, mine) = gateway_command(
            &s,
            &s.config(PYTHON, &["-c", &code]),
            BTreeMap::new(),
            Some(pp),
        );
        let served = serve_channel(mine.unwrap());
        let out = cmd.output().unwrap();
        (out, served)
    };
    let out = stdout(&pp_out);
    assert_eq!(
        out,
        format!(
            "pong ping ECONNREFUSED EACCES EACCES lo ENETUNREACH EPERM http://127.0.0.1:{pp}\nEACCES"
        )
    );
    // Exactly the one connection reached the proxy's side; none reached the host's
    // listeners.
    assert_eq!(channel.join().unwrap(), 1);
    for l in [&host, &other] {
        l.set_nonblocking(true).unwrap();
        assert!(l.accept().is_err(), "a host listener was reached");
    }
}

#[test]
fn node_and_python_run_confined() {
    let s = Scratch::new();
    let o = run(
        &s,
        NODE,
        &[
            "-e",
            "const os = require('os'); const fs = require('fs'); \
             fs.writeFileSync(os.homedir() + '/n.txt', 'n'); \
             console.log('node', 1 + 1, os.cpus().length > 0, fs.readFileSync(os.homedir() + '/n.txt', 'utf8'))",
        ],
        None,
    );
    assert_eq!(stdout(&o), "node 2 true n");
    // With the proxy variables set (a networked upstream) node still starts.
    let (o, _channel) = run_with_channel(
        &s,
        "node",
        &["-e", "console.log(process.env.HTTP_PROXY)"],
        Some(3128),
    );
    assert_eq!(stdout(&o), "http://127.0.0.1:3128");
    let out = python(
        &s,
        "import json, ssl, sqlite3, tempfile, os\nwith tempfile.NamedTemporaryFile(dir=os.environ['TMPDIR']) as f: pass\nprint(json.dumps({'py': 3}))",
        None,
    );
    assert_eq!(out, r#"{"py": 3}"#);
}

#[test]
fn stdio_pipes_carry_the_conversation() {
    let s = Scratch::new();
    let mut cmd = gateway_command(&s, &s.config("cat", &[]), BTreeMap::new(), None).0;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        stdout(&out),
        "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"
    );
}

fn assert_unavailable(o: &Output) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(126), "stderr: {err}");
    assert!(err.starts_with("SANDBOX_UNAVAILABLE:"), "stderr: {err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn fails_closed_with_sandbox_unavailable() {
    let s = Scratch::new();
    // A workspace that is a file cannot be confined to.
    let file = s.root.join("not-a-dir");
    std::fs::write(&file, b"").unwrap();
    let profile = |ws: &Path| {
        format!(
            r#"{{"uid":65534,"gid":65534,"workspace":"{}"}}"#,
            ws.display()
        )
    };
    let exec = |profile: &str, program: &str| {
        Command::new(stsd_bin())
            .args([
                "upstream-exec",
                "--profile",
                profile,
                "--",
                program,
                "-c",
                "echo ran",
            ])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    assert_unavailable(&exec(&profile(&file), "/bin/sh"));
    assert_unavailable(&exec(&profile(&s.root.join("missing")), "/bin/sh"));
    // A program that is not there, a profile that does not parse.
    assert_unavailable(&exec(&profile(&s.ws), "no-such-program-xyz"));
    assert_unavailable(&exec("{not json", "/bin/sh"));
    // As root, the worker user must not be root.
    if is_root() {
        let o = exec(
            &format!(r#"{{"uid":0,"gid":0,"workspace":"{}"}}"#, s.ws.display()),
            "/bin/sh",
        );
        assert_unavailable(&o);
    }
    // A read path that does not exist is skipped, not fatal.
    let o = exec(
        &format!(
            r#"{{"uid":65534,"gid":65534,"workspace":"{}","read_paths":["/does/not/exist"]}}"#,
            s.ws.display()
        ),
        "/bin/sh",
    );
    assert_eq!(stdout(&o), "ran");
}
