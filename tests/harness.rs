//! A daemon under test: started on a private socket, audit log and config in a temporary
//! directory, spoken to as raw JSON-RPC (MCP 2026-07-28: stateless requests with `_meta`).

use crate::stsd_bin;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp/catalog.json");

pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub audit: PathBuf,
    dir: Option<tempfile::TempDir>,
}

/// The test catalogs are written by hand with `draft: false`; the publish gate that wants a
/// recorded Local Pass for them has its own test (tests/tools_admin.rs), so the daemons here
/// serve them as they are.
const LOCAL_PASS_KNOB: &str = "require_local_pass = false\n";

/// `STSD_TEST_SPAWN=exec` (or `zygote`) runs every daemon of the suite in that spawn mode
/// (scripts/test runs the suites that matter once more in exec mode).
fn with_spawn_mode(extra_config: &str) -> String {
    let Some(mode) = crate::spawn_mode_from_env() else {
        return extra_config.to_string();
    };
    let line = format!(
        "spawn = \"{}\"\n",
        if mode == stsd_profiles::baseline::SpawnMode::Exec {
            "exec"
        } else {
            "zygote"
        }
    );
    with_worker_key(extra_config, "spawn =", &line)
}

/// Primed workers are off in the suite's daemons unless a test turns them on: many tests
/// take a confined worker for the busy one, and a primed worker is confined while it waits.
/// tests/zygote.rs covers priming (on, as a daemon runs by default).
fn with_prime_off(extra_config: &str) -> String {
    with_worker_key(extra_config, "prime =", "prime = false\n")
}

/// `line` added to `extra_config`'s `[worker]` table (made when missing), unless `key` is
/// set there already.
fn with_worker_key(extra_config: &str, key: &str, line: &str) -> String {
    if extra_config.contains(key) {
        extra_config.to_string()
    } else if let Some(i) = extra_config.find("[worker]\n") {
        let at = i + "[worker]\n".len();
        format!("{}{line}{}", &extra_config[..at], &extra_config[at..])
    } else {
        format!("{extra_config}\n[worker]\n{line}")
    }
}

impl Daemon {
    pub fn start(pool: usize, extra_config: &str) -> Daemon {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        Daemon::start_in(dir, pool, extra_config, CATALOG)
    }

    pub fn start_in(
        dir: tempfile::TempDir,
        pool: usize,
        extra_config: &str,
        catalog: &str,
    ) -> Daemon {
        Daemon::start_with(dir, pool, extra_config, catalog, &[])
    }

    pub fn start_with(
        dir: tempfile::TempDir,
        pool: usize,
        extra_config: &str,
        catalog: &str,
        args: &[&str],
    ) -> Daemon {
        Daemon::launch(dir, pool, extra_config, Some(catalog), args, None)
    }

    /// The general form: `catalog` None serves the bundled catalog; `nofile` caps the
    /// daemon's descriptors (soft and hard), as a small `ulimit -n` would.
    pub fn launch(
        dir: tempfile::TempDir,
        pool: usize,
        extra_config: &str,
        catalog: Option<&str>,
        args: &[&str],
        nofile: Option<u64>,
    ) -> Daemon {
        Daemon::launch_env(dir, pool, extra_config, catalog, args, nofile, &[])
    }

    /// [`Daemon::launch`] with extra environment variables for the daemon.
    pub fn launch_env(
        dir: tempfile::TempDir,
        pool: usize,
        extra_config: &str,
        catalog: Option<&str>,
        args: &[&str],
        nofile: Option<u64>,
        env: &[(&str, &str)],
    ) -> Daemon {
        let socket = dir.path().join("stsd.sock");
        let audit = dir.path().join("audit.jsonl");
        let config = dir.path().join("stsd.toml");
        // `slow` spins on Date.now(), which the default step budget would stop in ~100 ms.
        // `extra_config` may open `[baseline]` (first): its keys join the harness's own (its
        // `max_steps` replaces the harness's).
        let (baseline, extra_config) = match extra_config.strip_prefix("[baseline]\n") {
            Some(rest) => match rest.find("\n[") {
                Some(i) => (&rest[..=i], &rest[i + 1..]),
                None => (rest, ""),
            },
            None => ("", extra_config),
        };
        let extra_config = with_prime_off(&with_spawn_mode(extra_config));
        let _ = std::fs::write(
            &config,
            format!("[baseline]\n{}env_allow = [\"STSD_TEST_*\", \"STSD_HOSTILE_SECRET\"]\n{baseline}\n[daemon]\naudit_log = \"{}\"\ncatalog_dir = \"{}\"\n{}{extra_config}", if baseline.contains("max_steps") { "" } else { "max_steps = 1000000000000\n" }, audit.display(), dir.path().join("managed").display(), if extra_config.contains("require_local_pass") { "" } else { LOCAL_PASS_KNOB }),
        );
        // `STSD_TEST_BINARY` in `env` runs that binary instead of the build's (the test of a
        // binary replaced on disk under a running daemon).
        let bin = env
            .iter()
            .find(|(k, _)| *k == "STSD_TEST_BINARY")
            .map_or_else(stsd_bin, |(_, v)| PathBuf::from(v));
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(&socket)
            .args(["--pool", &pool.to_string()])
            .args(args)
            .env("STSD_TEST_TOKEN", "supersecret-token-123")
            // Its own fingerprint ledger: tests that share tool names never see each other's.
            .env("STSD_STATE_DIR", dir.path().join("state"))
            // The defaults that would be the machine's (/var/lib/stsd/workspace, the audit
            // log's /var/log/stsd, /run/stsd) under the test's directory too, when the run
            // does not already point them somewhere (scripts/test does).
            .envs(systemd_dirs(dir.path()))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // The daemon's log, for tests that read it and for a start that fails.
        if let Ok(f) = std::fs::File::create(dir.path().join("stderr.log")) {
            cmd.stderr(f);
        }
        if let Some(c) = catalog {
            cmd.args(["--catalog", c]);
        }
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // A binary the test just copied can be busy for a moment: another test thread's
        // fork holds the copy's (close-on-exec) descriptor until its child execs (ETXTBSY).
        let mut tries = 0;
        let child = loop {
            match cmd.spawn() {
                Ok(c) => break c,
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let d = Daemon {
            child,
            socket,
            audit,
            dir: Some(dir),
        };
        d.wait_for_socket();
        d
    }

    pub fn wait_for_socket(&self) {
        let t0 = Instant::now();
        while UnixStream::connect(&self.socket).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                let log = self
                    .dir
                    .as_ref()
                    .and_then(|d| std::fs::read_to_string(d.path().join("stderr.log")).ok())
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                panic!("daemon did not start; its log ends:\n{}", tail.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9, keeping the directory (socket, audit log) for a restart.
    pub fn kill9(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dir.take().unwrap_or_else(|| unreachable!())
    }

    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("/nonexistent"))
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// What the daemon logged (only when it was started with STSD_LOG).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("stderr.log")).unwrap_or_default()
    }

    /// True while the daemon process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The daemon's resident set, in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        proc_status_kib(self.pid(), "VmRSS:")
    }

    /// CPU time the daemon has used (user + system), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        // After the comm field: state is 0, utime 11, stime 12.
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        num(11) + num(12)
    }

    pub fn connect(&self) -> Conn {
        let s = UnixStream::connect(&self.socket).unwrap_or_else(|e| panic!("{e}"));
        let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
        Conn {
            reader: BufReader::new(s.try_clone().unwrap_or_else(|e| panic!("{e}"))),
            writer: s,
        }
    }

    /// The daemon's workers (its children but the zygote): (pid, state, confined). A worker
    /// is confined once it has installed its own seccomp filter: it holds more filters than
    /// the zygote it was forked from (which has one of its own, `os::zygote_filter`), or, exec'd,
    /// any.
    pub fn children(&self) -> Vec<(i32, char, bool)> {
        let mut workers = Vec::new();
        let mut zygote_filters = 0;
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            // pid (comm) state ppid ...: comm may hold spaces, so split after the last ')'.
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.len() < 2 || f[1].parse::<i32>().ok() != Some(self.pid()) {
                continue;
            }
            let state = f[0].chars().next().unwrap_or('?');
            let filters = seccomp_filters(pid);
            if head.ends_with("(stsd-zygote") {
                zygote_filters = zygote_filters.max(filters);
                continue;
            }
            workers.push((pid, state, filters));
        }
        workers
            .into_iter()
            .map(|(pid, state, filters)| (pid, state, filters > zygote_filters))
            .collect()
    }

    pub fn wait_until(
        &self,
        what: &str,
        secs: u64,
        mut f: impl FnMut(&[(i32, char, bool)]) -> bool,
    ) {
        let t0 = Instant::now();
        loop {
            let c = self.children();
            if f(&c) {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "{what}: children {c:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `stsd ARGS --socket SOCKET`.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(stsd_bin())
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until `stsd approvals --json` lists a call, and returns the first.
    pub fn pending(&self) -> Value {
        let t0 = Instant::now();
        loop {
            let out = self.cli(&["approvals", "--json"]);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            if let Some(p) = v["pending"].as_array().and_then(|a| a.first()) {
                return p.clone();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "nothing pending: {v}"
            );
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    pub fn audit_records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("torn audit line {l:?}: {e}"))
            })
            .collect()
    }
}

/// A free TCP port on loopback (bound and released: the caller binds it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A `kB` line of /proc/<pid>/status.
/// The threads of process `pid`, by name (`/proc/<pid>/task/*/comm`).
pub fn thread_names(pid: i32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect()
}

pub fn proc_status_kib(pid: i32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Conn {
    pub reader: BufReader<UnixStream>,
    pub writer: UnixStream,
}

pub fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}})
}

impl Conn {
    pub fn send(&mut self, id: u64, method: &str, mut params: Value) {
        params["_meta"] = meta();
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string()
            + "\n";
        self.writer
            .write_all(line.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
    }

    pub fn call(&mut self, id: u64, tool: &str, args: Value) {
        self.send(id, "tools/call", json!({"name": tool, "arguments": args}));
    }

    /// The next response or error, including an error with no id (a parse error).
    pub fn response_or_error(&mut self) -> Value {
        self.next_where(|v| v.get("id").is_some() || v.get("error").is_some())
    }

    /// The next response (notifications skipped).
    pub fn response(&mut self) -> Value {
        self.next_where(|v| v.get("id").is_some())
    }

    /// The next message `keep` accepts; the others are skipped.
    pub fn next_where(&mut self, keep: impl Fn(&Value) -> bool) -> Value {
        loop {
            let mut line = String::new();
            let n = self
                .reader
                .read_line(&mut line)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(n > 0, "connection closed");
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
            if keep(&v) {
                return v;
            }
        }
    }
}

pub fn text(resp: &Value) -> String {
    resp["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn is_error(resp: &Value) -> bool {
    resp["result"]["isError"] == true
}

/// How many seccomp filters process `pid` holds (0 when it cannot be read).
pub fn seccomp_filters(pid: i32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp_filters:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A legacy (2025-11-25) session that receives list changes directly.
pub fn subscriber(d: &Daemon) -> Conn {
    let mut c = d.connect();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    c.writer
        .write_all(format!("{init}\n").as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    let _ = c.response();
    c.writer
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .unwrap_or_else(|e| panic!("{e}"));
    c
}

/// Whether `c` is sent `notifications/tools/list_changed` within 20 s.
pub fn saw_list_changed(c: &mut Conn) -> bool {
    let _ = c
        .reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(20)));
    let mut line = String::new();
    while c.reader.read_line(&mut line).unwrap_or(0) > 0 {
        if line.contains("notifications/tools/list_changed") {
            return true;
        }
        line.clear();
    }
    false
}

/// `STATE_DIRECTORY`, `LOGS_DIRECTORY` and `RUNTIME_DIRECTORY` under `dir` for each that the
/// environment does not set: a test run by hand (`cargo test`) never writes the machine's
/// stsd directories. `dir` is opened to the workers' user, who reaches the default workspace.
pub fn systemd_dirs(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let keys = [
        ("STATE_DIRECTORY", "sys-state"),
        ("LOGS_DIRECTORY", "sys-log"),
        ("RUNTIME_DIRECTORY", "sys-run"),
    ];
    let unset: Vec<(&'static str, PathBuf)> = keys
        .into_iter()
        .filter(|(k, _)| std::env::var_os(k).is_none_or(|v| v.is_empty()))
        .map(|(k, sub)| (k, dir.join(sub)))
        .collect();
    if !unset.is_empty() {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
    }
    unset
}
