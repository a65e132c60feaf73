//! Running under systemd: the units pass `systemd-analyze verify`, and the daemon started the
//! way systemd starts a socket-activated Type=notify service (the listening socket on fd 3,
//! LISTEN_PID/LISTEN_FDS naming it, NOTIFY_SOCKET and WATCHDOG_USEC set) serves a call on the
//! inherited socket and says READY=1, WATCHDOG=1 and STOPPING=1.

use serde_json::json;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stsd_tests::harness::{text, Conn, CATALOG};
use stsd_tests::stsd_bin;

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd")
}

/// `systemd-analyze verify` in a scratch root that holds systemd's own units, the two units
/// and an executable at the ExecStart path (verify checks it exists; the unit is what is
/// verified here, not the binary). `--man=no`: the man page comes with the package.
#[test]
fn the_units_pass_systemd_analyze_verify() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        analyze.is_ok(),
        "systemd-analyze is missing: apt-get install systemd (.ci/run does)"
    );
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let r = root.path();
    let copy_tree = |from: &Path, to: &Path| {
        let out = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(out.status.success(), "{out:?}");
    };
    std::fs::create_dir_all(r.join("usr/lib/systemd")).unwrap_or_else(|e| panic!("{e}"));
    copy_tree(
        Path::new("/usr/lib/systemd/system"),
        &r.join("usr/lib/systemd"),
    );
    let units = r.join("etc/systemd/system");
    std::fs::create_dir_all(&units).unwrap_or_else(|e| panic!("{e}"));
    for u in ["stsd.service", "stsd.socket"] {
        std::fs::copy(units_dir().join(u), units.join(u)).unwrap_or_else(|e| panic!("{e}"));
    }
    for exe in ["usr/bin/stsd", "bin/kill"] {
        let p = r.join(exe);
        std::fs::create_dir_all(p.parent().unwrap_or(r)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&p, "#!/bin/sh\n").unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755));
    }
    let verify = |units: &[&str]| {
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(format!("--root={}", r.display()))
            .args(units)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let out = verify(&["stsd.socket", "stsd.service"]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    // Not even a warning (an unknown key or system call group is only a warning).
    assert!(said.trim().is_empty(), "{said}");

    // The same check does catch a unit it should refuse.
    let svc = std::fs::read_to_string(units.join("stsd.service")).unwrap_or_default();
    std::fs::write(
        units.join("stsd.service"),
        svc.replace(
            "Type=notify",
            "Type=notify\nSystemCallFilter=@no-such-group",
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = verify(&["stsd.service"]);
    assert!(
        !String::from_utf8_lossy(&out.stderr).trim().is_empty(),
        "a broken unit passed: {out:?}"
    );
}

fn recv_until(sock: &UnixDatagram, want: &str, secs: u64, seen: &mut Vec<String>) -> bool {
    let t0 = Instant::now();
    let mut buf = vec![0u8; 4096];
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).to_string();
            let hit = msg.lines().any(|l| l == want);
            seen.push(msg);
            if hit {
                return true;
            }
        }
    }
    false
}

#[test]
fn socket_activation_serves_on_the_inherited_socket_and_notifies_systemd() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    let sock_path = d.join("activated.sock");
    let notify_path = d.join("notify.sock");
    // What stsd.socket does: bind and listen before the service exists.
    let listener = UnixListener::bind(&sock_path).unwrap_or_else(|e| panic!("{e}"));
    let notify = UnixDatagram::bind(&notify_path).unwrap_or_else(|e| panic!("{e}"));
    let _ = notify.set_read_timeout(Some(Duration::from_millis(200)));
    let config = d.join("stsd.toml");
    std::fs::write(
        &config,
        format!(
            "[baseline]\nenv_allow = [\"STSD_TEST_*\"]\n[daemon]\naudit_log = \"{}\"\ncatalog_dir = \"{}\"\nrequire_local_pass = false\n",
            d.join("audit.jsonl").display(),
            d.join("managed").display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let unused_socket = d.join("not-this-one.sock");
    // What systemd does: the socket on fd 3, LISTEN_PID set to the service's own pid (the
    // shell execs stsd, keeping its pid), LISTEN_FDS=1, NOTIFY_SOCKET, WATCHDOG_USEC.
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ exec \"$0\" \"$@\"")
        .arg(stsd_bin())
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(&unused_socket)
        .args(["--pool", "1", "--catalog", CATALOG])
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "stsd.socket")
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "400000")
        .env("STSD_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(d.join("stderr.log"))
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        );
    // SAFETY: dup2 and fcntl are async-signal-safe; nothing else runs before exec.
    unsafe {
        cmd.pre_exec(move || {
            if fd != 3 && libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let flags = libc::fcntl(3, libc::F_GETFD);
            if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{e}"));
    // Our copy of the listener stays open (as systemd's does); stsd answers on it.
    let mut seen = Vec::new();
    let ready = recv_until(&notify, "READY=1", 30, &mut seen);
    let log = || std::fs::read_to_string(d.join("stderr.log")).unwrap_or_default();
    assert!(ready, "no READY=1: {seen:?}\n{}", log());
    assert!(
        seen.iter()
            .any(|m| m.contains(&format!("MAINPID={}", child.id()))),
        "{seen:?}"
    );
    assert!(!unused_socket.exists(), "stsd bound its own socket too");
    assert!(log().contains("socket from systemd"), "{}", log());

    // A call served on the inherited socket.
    let s = std::os::unix::net::UnixStream::connect(&sock_path).unwrap_or_else(|e| panic!("{e}"));
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut c = Conn {
        reader: std::io::BufReader::new(s.try_clone().unwrap_or_else(|e| panic!("{e}"))),
        writer: s,
    };
    c.call(1, "echo-console", json!({"text": "activated"}));
    assert_eq!(text(&c.response()), "echo: activated");

    // WATCHDOG_USEC=400000: a keep-alive at least every 200 ms.
    assert!(
        recv_until(&notify, "WATCHDOG=1", 5, &mut seen),
        "no WATCHDOG=1: {seen:?}"
    );
    // SIGTERM: STOPPING=1, and the socket systemd owns is left in place.
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(
        recv_until(&notify, "STOPPING=1", 15, &mut seen),
        "no STOPPING=1: {seen:?}"
    );
    let status = child.wait().unwrap_or_else(|e| panic!("{e}"));
    assert!(status.success(), "{status:?}\n{}", log());
    assert!(sock_path.exists(), "stsd removed the socket systemd owns");
    drop(listener);
}

/// LISTEN_FDS for another process (LISTEN_PID not ours) is not taken: stsd binds its own.
#[test]
fn listen_fds_for_another_pid_is_ignored() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    let socket = d.join("own.sock");
    let config = d.join("stsd.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\naudit_log = \"{}\"\ncatalog_dir = \"{}\"\nrequire_local_pass = false\n",
            d.join("audit.jsonl").display(),
            d.join("managed").display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(stsd_bin())
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(&socket)
        .args(["--pool", "1", "--catalog", CATALOG])
        .env("LISTEN_FDS", "1")
        .env("LISTEN_PID", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"));
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no socket of its own"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}
