//! Control groups for what stsd starts: the worker pool (the zygote and every worker, or
//! every exec'd worker) and each stdio upstream with everything it spawns get a group of
//! their own with memory, pids and CPU limits. Per-process rlimits cannot bound five
//! children of one upstream together, nor stop one upstream's zombies from eating the
//! NPROC of every process of the same uid; a group can.
//!
//! Groups live in a directory of this process's own, `stsd-<pid>`, beneath the cgroup it
//! was started in: v2 where the unified hierarchy offers memory and pids (under systemd,
//! `Delegate=yes`; the daemon then moves itself to `stsd-<pid>/supervisor`, as the
//! no-internal-processes rule asks), else v1 (one directory per controller hierarchy). A
//! directory left by a daemon that died is swept at the next start, its processes killed.
//!
//! A group joins the CPU controller only when it caps CPU. A group of the controller is
//! scheduled as one entity beside the processes outside it, so the pool's `SCHED_IDLE`
//! background work (a worker's start, priming, next context; see `os::priority`) would no
//! longer yield to the callers and the daemon: a client woken on the CPU of a worker making
//! its next context waited for that worker's slice (about 0.2 ms, `perf sched timehist`).
//! An uncapped pool (the default) stays in the daemon's CPU group. On v2 the controller is
//! enabled in this daemon's subtree when the first capped group is made, and from then on
//! every group of that subtree is one (v2 gives siblings the same controllers).
//!
//! A process joins its group between fork and exec (a write of "0" to `cgroup.procs`
//! through a descriptor opened beforehand, async-signal-safe), so nothing it starts ever
//! runs outside it. The entry point is [`host`]; [`Host::create`] makes a [`Group`].

mod discover;

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use stsd_profiles::baseline::{CgroupConfig, CgroupMode};
use stsd_profiles::upstream::UpstreamConfig;

/// A group's limits; 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// Percent of one core (200: two cores).
    pub cpu_percent: u32,
}

impl Limits {
    pub fn pool(c: &CgroupConfig) -> Limits {
        Limits {
            memory_bytes: c.pool_memory_max,
            pids: c.pool_pids_max,
            cpu_percent: c.pool_cpu_percent,
        }
    }

    pub fn upstream(c: &CgroupConfig, u: &UpstreamConfig) -> Limits {
        Limits {
            memory_bytes: u.memory_max.unwrap_or(c.upstream_memory_max),
            pids: u.pids_max.unwrap_or(c.upstream_pids_max),
            cpu_percent: u.cpu_percent.unwrap_or(c.upstream_cpu_percent),
        }
    }

    pub fn describe(&self) -> String {
        let or_none = |v: u64, s: String| if v == 0 { "none".into() } else { s };
        format!(
            "memory {}, pids {}, cpu {}",
            or_none(
                self.memory_bytes,
                format!("{} MiB", self.memory_bytes >> 20)
            ),
            or_none(self.pids, self.pids.to_string()),
            or_none(
                u64::from(self.cpu_percent),
                format!("{}% of a core", self.cpu_percent)
            ),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Where this process makes its groups.
#[derive(Debug)]
pub struct Host {
    version: Version,
    /// (controller, this process's `stsd-<pid>` directory); v2 has one, controller "".
    dirs: Vec<(&'static str, PathBuf)>,
    /// The host offers the CPU controller (a group that caps CPU can have it).
    cpu: bool,
    /// v2: the directories whose `cgroup.subtree_control` must list `cpu` for a group in
    /// this daemon's directory to have it (the daemon's own cgroup, then its `stsd-<pid>`),
    /// and whether they have been given it. Empty on v1.
    cpu_path: Vec<PathBuf>,
    cpu_enabled: std::sync::Mutex<bool>,
}

static HOST: OnceLock<Result<Host, String>> = OnceLock::new();

/// This process's cgroup directories, set up at the first call; Err says why there are
/// none (the caller reports it: the banner, `stsd upstream check`).
pub fn host() -> Result<&'static Host, &'static str> {
    HOST.get_or_init(Host::set_up)
        .as_ref()
        .map_err(String::as_str)
}

/// One line for the banner and `stsd status`: what bounds the pool and the upstreams.
pub fn describe() -> String {
    match host() {
        Ok(h) => h.describe(),
        Err(why) => format!(
            "WARN no cgroups ({why}): the pool and each upstream are bounded per process only \
             (rlimits); run under systemd with Delegate=yes, or as root"
        ),
    }
}

/// Calls [`release`] when dropped (held by `main`).
pub struct ReleaseAtExit;

impl Drop for ReleaseAtExit {
    fn drop(&mut self) {
        release();
    }
}

/// Removes this process's own directories if they are empty (at exit; what remains is
/// swept by the next start).
pub fn release() {
    if let Some(Ok(h)) = HOST.get() {
        for (_, d) in &h.dirs {
            if let Ok(rd) = std::fs::read_dir(d) {
                for e in rd.flatten() {
                    if e.path().is_dir() {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The pool's group, per `[cgroups] mode`: None when off, or (auto) when the host gives
/// none; Err when required and there is none, or when a group could not be made.
pub fn for_pool(c: &CgroupConfig) -> Result<Option<Arc<Group>>, String> {
    made(c, "pool", &Limits::pool(c))
}

/// An upstream's group, as [`for_pool`].
pub fn for_upstream(c: &CgroupConfig, u: &UpstreamConfig) -> Result<Option<Arc<Group>>, String> {
    made(c, &format!("upstream-{}", u.id), &Limits::upstream(c, u))
}

fn made(c: &CgroupConfig, name: &str, limits: &Limits) -> Result<Option<Arc<Group>>, String> {
    match (c.mode, host()) {
        (CgroupMode::Off, _) => Ok(None),
        (CgroupMode::Auto, Err(_)) => Ok(None),
        (CgroupMode::Required, Err(why)) => Err(format!(
            "[cgroups] mode = \"required\" and there are none: {why}"
        )),
        (CgroupMode::Auto, Ok(h)) => match h.create(name, limits) {
            Ok(g) => Ok(Some(Arc::new(g))),
            Err(e) => {
                tracing::warn!(group = name, error = %e, "no cgroup: bounded per process only");
                Ok(None)
            }
        },
        (CgroupMode::Required, Ok(h)) => h
            .create(name, limits)
            .map(|g| Some(Arc::new(g)))
            .map_err(|e| format!("cgroup {name}: {e}")),
    }
}

fn read(p: &Path) -> Result<String, String> {
    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))
}

fn write(p: &Path, v: &str) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(p)
        .and_then(|mut f| f.write_all(v.as_bytes()))
        .map_err(|e| format!("{} <- {v:?}: {e}", p.display()))
}

fn mkdir(p: &Path) -> Result<(), String> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot make {}: {e}", p.display())),
    }
}

impl Host {
    fn set_up() -> Result<Host, String> {
        let mounts = discover::mounts(&read(Path::new("/proc/self/mountinfo"))?);
        let member = discover::memberships(&read(Path::new("/proc/self/cgroup"))?);
        let mut why = Vec::new();
        if let Some(own) = discover::v2_dir(&mounts, &member) {
            match Host::set_up_v2(&own) {
                Ok(h) => return Ok(h),
                Err(e) => why.push(format!("v2: {e}")),
            }
        }
        match Host::set_up_v1(&mounts, &member) {
            Ok(h) => Ok(h),
            Err(e) => {
                why.push(format!("v1: {e}"));
                Err(why.join("; "))
            }
        }
    }

    fn set_up_v2(own: &Path) -> Result<Host, String> {
        let offered = read(&own.join("cgroup.controllers"))?;
        let offered: Vec<&str> = offered.split_whitespace().collect();
        if let Some(m) = discover::REQUIRED.iter().find(|c| !offered.contains(c)) {
            return Err(format!(
                "{} does not offer the {m} controller",
                own.display()
            ));
        }
        let cpu = offered.contains(&"cpu");
        // `cpu` is enabled later, for the first group that caps CPU (see the module's doc).
        let enable = |dir: &Path| {
            let line = discover::REQUIRED.map(|c| format!("+{c}"));
            write(&dir.join("cgroup.subtree_control"), &line.join(" "))
        };
        sweep_stale(own);
        let pid = std::process::id();
        let mine = own.join(format!("stsd-{pid}"));
        mkdir(&mine)?;
        let enabled = read(&own.join("cgroup.subtree_control")).unwrap_or_default();
        if !discover::REQUIRED
            .iter()
            .all(|c| enabled.split_whitespace().any(|e| e == *c))
        {
            // A cgroup with processes cannot hand controllers to children: this daemon
            // moves to a leaf of its own first, then enables them above.
            let leaf = mine.join("supervisor");
            let moved = mkdir(&leaf)
                .and_then(|()| write(&leaf.join("cgroup.procs"), &pid.to_string()))
                .and_then(|()| enable(own));
            if let Err(e) = moved {
                let _ = write(&own.join("cgroup.procs"), &pid.to_string());
                let _ = std::fs::remove_dir(&leaf);
                let _ = std::fs::remove_dir(&mine);
                return Err(format!(
                    "{e} (other processes share {}; a unit with Delegate=yes gives stsd one)",
                    own.display()
                ));
            }
        }
        enable(&mine)?;
        Ok(Host {
            version: Version::V2,
            cpu_path: vec![own.to_path_buf(), mine.clone()],
            dirs: vec![("", mine)],
            cpu,
            cpu_enabled: std::sync::Mutex::new(false),
        })
    }

    fn set_up_v1(
        mounts: &[discover::Mount],
        member: &[(Vec<String>, String)],
    ) -> Result<Host, String> {
        let pid = std::process::id();
        let mut dirs = Vec::new();
        for c in discover::REQUIRED.iter().chain(discover::OPTIONAL.iter()) {
            let Some(own) = discover::v1_dir(mounts, member, c) else {
                if discover::REQUIRED.contains(c) {
                    return Err(format!("no hierarchy carries the {c} controller"));
                }
                continue;
            };
            dirs.push((*c, own));
        }
        let mut made: Vec<(&'static str, PathBuf)> = Vec::new();
        for (c, own) in dirs {
            sweep_stale(&own);
            let mine = own.join(format!("stsd-{pid}"));
            if let Err(e) = mkdir(&mine) {
                for (_, d) in &made {
                    let _ = std::fs::remove_dir(d);
                }
                return Err(e);
            }
            made.push((c, mine));
        }
        let cpu = made.iter().any(|(c, _)| *c == "cpu");
        Ok(Host {
            version: Version::V1,
            dirs: made,
            cpu,
            cpu_path: Vec::new(),
            cpu_enabled: std::sync::Mutex::new(false),
        })
    }

    pub fn version(&self) -> Version {
        self.version
    }

    pub fn describe(&self) -> String {
        let ctrls = match self.version {
            Version::V2 => {
                let mut v = discover::REQUIRED.to_vec();
                if self.cpu {
                    v.push("cpu");
                }
                v
            }
            Version::V1 => self.dirs.iter().map(|(c, _)| *c).collect(),
        };
        format!(
            "cgroup {} ({}) under {}",
            if self.version == Version::V2 {
                "v2"
            } else {
                "v1"
            },
            ctrls.join(", "),
            self.dirs
                .first()
                .map(|(_, d)| d.display().to_string())
                .unwrap_or_default()
        )
    }

    /// Gives the CPU controller to this daemon's groups, once (v2; on v1 a group joins the
    /// CPU hierarchy or not, nothing to enable). False, with a warning, if it cannot: the
    /// group is then made without its CPU cap, as on a host without the controller.
    fn enable_cpu(&self) -> bool {
        let mut enabled = self
            .cpu_enabled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !*enabled {
            let given = self.cpu_path.iter().try_for_each(|dir| {
                let control = dir.join("cgroup.subtree_control");
                if read(&control)?.split_whitespace().any(|c| c == "cpu") {
                    return Ok(());
                }
                write(&control, "+cpu")
            });
            match given {
                Ok(()) if !self.cpu_path.is_empty() => {
                    // From now on the pool is a CPU group too (v2 gives siblings the same
                    // controllers): its background work competes with the daemon as a group.
                    tracing::info!("a group caps CPU: the CPU controller is on for every group of this daemon, the pool's included");
                    *enabled = true;
                }
                Ok(()) => *enabled = true,
                Err(e) => tracing::warn!(error = %e, "no CPU controller: CPU caps not applied"),
            }
        }
        *enabled
    }

    /// A new group `name-<n>` (`pool`, `upstream-<id>`; `n` counts the groups this process
    /// made, so two pools in one process, as in tests, never share one) with `limits`.
    pub fn create(&self, name: &str, limits: &Limits) -> Result<Group, String> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(format!("cgroup name {name:?}"));
        }
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let name = format!("{name}-{n}");
        // Only a group that caps CPU joins the CPU controller (see the module's doc).
        let cpu = limits.cpu_percent != 0 && self.cpu && self.enable_cpu();
        let dirs: Vec<(&'static str, PathBuf)> = self
            .dirs
            .iter()
            .filter(|(c, _)| cpu || *c != "cpu")
            .map(|(c, d)| (*c, d.join(&name)))
            .collect();
        let mut group = Group {
            name: name.clone(),
            version: self.version,
            dirs: Vec::new(),
            procs: Vec::new(),
            // What is enforced: no CPU cap where the controller could not be had.
            limits: Limits {
                cpu_percent: if cpu { limits.cpu_percent } else { 0 },
                ..*limits
            },
        };
        for (c, d) in &dirs {
            std::fs::create_dir(d).map_err(|e| format!("cannot make {}: {e}", d.display()))?;
            group.dirs.push((*c, d.clone()));
        }
        group.set_limits(limits, cpu)?;
        for (_, d) in &group.dirs {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(d.join("cgroup.procs"))
                .map_err(|e| format!("{}: {e}", d.join("cgroup.procs").display()))?;
            group.procs.push(high(OwnedFd::from(f))?);
        }
        Ok(group)
    }
}

/// What a group holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub memory_bytes: u64,
    pub pids: u64,
}

/// One group. Dropping it kills what is left in it and removes it.
#[derive(Debug)]
pub struct Group {
    name: String,
    version: Version,
    dirs: Vec<(&'static str, PathBuf)>,
    /// Its `cgroup.procs` files, open for writing (one per hierarchy).
    procs: Vec<OwnedFd>,
    limits: Limits,
}

impl Group {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The directory of `controller` ("" on v2).
    fn dir(&self, controller: &str) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(c, _)| self.version == Version::V2 || *c == controller)
            .map(|(_, d)| d.as_path())
    }

    fn set_limits(&self, l: &Limits, cpu: bool) -> Result<(), String> {
        let at = |c: &str, file: &str| {
            self.dir(c)
                .map(|d| d.join(file))
                .ok_or_else(|| format!("no {c} hierarchy"))
        };
        let num = |v: u64, none: &str| {
            if v == 0 {
                none.to_string()
            } else {
                v.to_string()
            }
        };
        match self.version {
            Version::V2 => {
                write(&at("memory", "memory.max")?, &num(l.memory_bytes, "max"))?;
                // Swap would let the group hold more than its memory; best effort (no swap
                // accounting on some kernels).
                if l.memory_bytes != 0 {
                    let _ = write(&at("memory", "memory.swap.max")?, "0");
                }
                write(&at("pids", "pids.max")?, &num(l.pids, "max"))?;
                if cpu && l.cpu_percent != 0 {
                    let quota = u64::from(l.cpu_percent) * 1000;
                    write(&at("cpu", "cpu.max")?, &format!("{quota} 100000"))?;
                }
            }
            Version::V1 => {
                write(
                    &at("memory", "memory.limit_in_bytes")?,
                    &num(l.memory_bytes, "-1"),
                )?;
                let memsw = at("memory", "memory.memsw.limit_in_bytes")?;
                if memsw.exists() {
                    let _ = write(&memsw, &num(l.memory_bytes, "-1"));
                }
                write(&at("pids", "pids.max")?, &num(l.pids, "max"))?;
                if cpu && l.cpu_percent != 0 {
                    write(&at("cpu", "cpu.cfs_period_us")?, "100000")?;
                    let quota = u64::from(l.cpu_percent) * 1000;
                    write(&at("cpu", "cpu.cfs_quota_us")?, &quota.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// What the group holds now (0 where a file cannot be read).
    pub fn usage(&self) -> Usage {
        let num = |c: &str, file: &str| {
            self.dir(c)
                .and_then(|d| std::fs::read_to_string(d.join(file)).ok())
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        let memory_file = match self.version {
            Version::V2 => "memory.current",
            Version::V1 => "memory.usage_in_bytes",
        };
        Usage {
            memory_bytes: num("memory", memory_file),
            pids: num("pids", "pids.current"),
        }
    }

    /// The processes in the group now.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(self.dir("pids").unwrap_or(Path::new("/nonexistent")))
    }

    /// A hook for `pre_exec`: the forked child joins this group before it execs. Holds the
    /// group (its descriptors) as long as the command that runs it.
    pub fn join_hook(
        self: &Arc<Self>,
    ) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
        let me = self.clone();
        move || {
            for fd in &me.procs {
                // SAFETY: write(2) of a static buffer to a descriptor the group holds open;
                // async-signal-safe, as a pre_exec hook must be.
                let n = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
                if n != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        }
    }

    /// SIGKILL to every process in the group, until it is empty or `within` passes.
    pub fn kill_all(&self, within: Duration) -> bool {
        kill_dir(self.dir("pids"), self.version, within)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        remove(&self.dirs, self.version);
    }
}

/// `fd` moved to 16 or above: a child's pre_exec hooks put its own descriptors at 3 and 4
/// (the worker socket, the zygote's code), and the join hook must never write to those.
fn high(fd: OwnedFd) -> Result<OwnedFd, String> {
    // SAFETY: F_DUPFD_CLOEXEC on a descriptor we own; the new one is owned below.
    let raw = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 16) };
    if raw < 0 {
        return Err(format!("fcntl: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: `raw` was just returned by fcntl and nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Kills what lives in the group at `dir`; true once it is empty.
fn kill_dir(dir: Option<&Path>, version: Version, within: Duration) -> bool {
    let Some(dir) = dir else { return true };
    if !dir.exists() {
        return true;
    }
    // cgroup.kill (v2, Linux 5.14) kills the group in one step, forks in flight included.
    if version == Version::V2 && write(&dir.join("cgroup.kill"), "1").is_ok() {
        // Still wait below for the group to read empty.
    }
    let deadline = Instant::now() + within;
    loop {
        let pids = pids_in(dir);
        if pids.is_empty() {
            return true;
        }
        for p in pids {
            // Never this process (it is never in a group it made, but be certain).
            if p != std::process::id() && p != 0 {
                // SAFETY: kill(2) with a pid read from the group this process made.
                unsafe { libc::kill(p as i32, libc::SIGKILL) };
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Empties and removes a group's directories (best effort: a group that will not empty in
/// a second is left for the next start's sweep).
fn remove(dirs: &[(&'static str, PathBuf)], version: Version) {
    let pids_dir = dirs
        .iter()
        .find(|(c, _)| version == Version::V2 || *c == "pids")
        .map(|(_, d)| d.as_path());
    kill_dir(pids_dir, version, Duration::from_secs(1));
    for (_, d) in dirs {
        let deadline = Instant::now() + Duration::from_secs(1);
        while d.exists() && std::fs::remove_dir(d).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Removes what daemons that died left under `own` (their `stsd-<pid>` directories), killing
/// what still runs there: an upstream's grandchild that outlived its parent-death signal.
fn sweep_stale(own: &Path) {
    let Ok(rd) = std::fs::read_dir(own) else {
        return;
    };
    let me = std::process::id();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = discover::daemon_pid(&name.to_string_lossy()) else {
            continue;
        };
        if pid == me || discover::alive(pid) {
            continue;
        }
        let dir = e.path();
        let version = if own.join("cgroup.controllers").exists() {
            Version::V2
        } else {
            Version::V1
        };
        if let Ok(children) = std::fs::read_dir(&dir) {
            let groups: Vec<(&'static str, PathBuf)> = children
                .flatten()
                .filter(|c| c.path().is_dir())
                .map(|c| ("pids", c.path()))
                .collect();
            for g in &groups {
                remove(std::slice::from_ref(g), version);
            }
        }
        let _ = std::fs::remove_dir(&dir);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    /// This process's cgroup host, or None (said) where there is none (not root, no
    /// delegation): the banner says so then.
    fn host_here() -> Option<&'static Host> {
        host()
            .map_err(|_| eprintln!("skipped: {}", describe()))
            .ok()
    }

    fn test_limits(cpu_percent: u32) -> Limits {
        Limits {
            memory_bytes: 64 << 20,
            pids: 8,
            cpu_percent,
        }
    }

    #[test]
    fn a_child_joins_before_exec_is_held_to_the_limits_and_taken_down_with_the_group() {
        let Some(h) = host_here() else {
            return;
        };
        let limits = test_limits(50);
        let g = Arc::new(h.create("test-join", &limits).unwrap());
        let capped = g.limits().cpu_percent != 0;
        assert_eq!(
            g.limits(),
            Limits {
                cpu_percent: if capped { 50 } else { 0 },
                ..limits
            }
        );
        let joined = |program: &str, args: &[&str]| {
            let mut cmd = std::process::Command::new(program);
            cmd.args(args);
            // SAFETY: the hook only calls write(2).
            unsafe {
                cmd.pre_exec(g.join_hook());
            }
            cmd.spawn().unwrap()
        };
        let mut first = joined("sleep", &["60"]);
        assert!(g.pids().contains(&first.id()), "{:?}", g.pids());
        if capped {
            // It caps CPU, so it has the CPU controller, with the cap.
            let (file, quota) = match h.version {
                Version::V1 => ("cpu.cfs_quota_us", "50000"),
                Version::V2 => ("cpu.max", "50000 100000"),
            };
            let dir = g.dir("cpu").unwrap();
            assert_eq!(read(&dir.join(file)).unwrap().trim(), quota);
            if h.version == Version::V1 {
                assert!(dir.ends_with(cpu_group_of(first.id()).trim_start_matches('/')));
            }
        }
        // Twenty more sleeps forked inside a group of eight: the forks past the limit fail
        // (the shell may give up; its zombie still counts until reaped).
        let mut second = joined(
            "sh",
            &["-c", "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do sleep 60 & done; wait"],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while g.usage().pids < limits.pids {
            assert!(Instant::now() < deadline, "{:?}", g.usage());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(g.usage().pids, limits.pids);
        assert!(g.usage().memory_bytes > 0);
        assert!(g.kill_all(Duration::from_secs(10)));
        assert!(!first.wait().unwrap().success());
        let _ = second.wait();
        let dirs: Vec<PathBuf> = g.dirs.iter().map(|(_, d)| d.clone()).collect();
        drop(Arc::into_inner(g).unwrap());
        assert!(dirs.iter().all(|d| !d.exists()), "{dirs:?}");
    }

    /// The path of `pid`'s group in the v1 CPU hierarchy ("" on a v2-only host).
    fn cpu_group_of(pid: u32) -> String {
        read(Path::new(&format!("/proc/{pid}/cgroup")))
            .unwrap()
            .lines()
            .filter_map(|l| {
                let mut f = l.splitn(3, ':').skip(1);
                f.next().zip(f.next())
            })
            .find(|(c, _)| c.split(',').any(|c| c == "cpu"))
            .map(|(_, p)| p.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn a_group_without_a_cpu_cap_stays_in_the_daemons_cpu_group() {
        let Some(h) = host_here() else {
            return;
        };
        let limits = test_limits(0);
        // Held until the group's controllers are read: a capped group made meanwhile by
        // another test would enable the controller (v2). An uncapped `create` never takes it.
        let enabled = h.cpu_enabled.lock().unwrap();
        let enabled_before = *enabled;
        let g = Arc::new(h.create("test-uncapped", &limits).unwrap());
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("60");
        // SAFETY: the hook only calls write(2).
        unsafe {
            cmd.pre_exec(g.join_hook());
        }
        let mut child = cmd.spawn().unwrap();
        assert!(g.pids().contains(&child.id()), "{:?}", g.pids());
        match h.version {
            // Scheduled beside the daemon, so its SCHED_IDLE work yields to the daemon's
            // callers: not a group of its own in the CPU hierarchy.
            Version::V1 => assert_eq!(cpu_group_of(child.id()), cpu_group_of(std::process::id())),
            // No capped group has been made yet in this process: the controller is not
            // enabled in the daemon's subtree, so the group does not have it.
            Version::V2 if !enabled_before => {
                let controllers = read(&g.dir("").unwrap().join("cgroup.controllers")).unwrap();
                assert!(
                    !controllers.split_whitespace().any(|c| c == "cpu"),
                    "{controllers}"
                );
            }
            Version::V2 => {}
        }
        drop(enabled);
        assert!(g.kill_all(Duration::from_secs(10)));
        let _ = child.wait();
    }

    #[test]
    fn off_means_none_and_names_are_checked() {
        let off = CgroupConfig {
            mode: CgroupMode::Off,
            ..Default::default()
        };
        assert!(for_pool(&off).unwrap().is_none());
        if let Ok(h) = host() {
            assert!(h.create("../x", &Limits::default()).is_err());
            assert!(h.create("", &Limits::default()).is_err());
        }
    }
}
