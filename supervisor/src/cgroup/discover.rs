//! Where this process's cgroups are: `/proc/self/cgroup` says which cgroup it is in per
//! hierarchy, `/proc/self/mountinfo` where each hierarchy is mounted. Pure parsing here;
//! the caller reads the files.

use std::path::{Path, PathBuf};

/// The controllers stsd limits. memory and pids are required; cpu is used when present.
pub const REQUIRED: [&str; 2] = ["memory", "pids"];
pub const OPTIONAL: [&str; 1] = ["cpu"];

/// One mounted hierarchy: v2 (`controllers` empty: read `cgroup.controllers`) or a v1
/// hierarchy with its controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub v2: bool,
    pub controllers: Vec<String>,
    /// Where it is mounted.
    pub point: PathBuf,
    /// The cgroup shown as the mount's root (`/` unless a bind or a cgroup namespace).
    pub root: String,
}

/// The cgroup mounts of a `/proc/self/mountinfo` text.
pub fn mounts(mountinfo: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        // id parent maj:min root point options [optional...] - fstype source superoptions
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let l: Vec<&str> = left.split(' ').collect();
        let r: Vec<&str> = right.split(' ').collect();
        if l.len() < 5 || r.len() < 3 {
            continue;
        }
        let (fstype, superopts) = (r[0], r[2]);
        let point = PathBuf::from(unescape(l[4]));
        let root = unescape(l[3]);
        match fstype {
            "cgroup2" => out.push(Mount {
                v2: true,
                controllers: Vec::new(),
                point,
                root,
            }),
            "cgroup" => out.push(Mount {
                v2: false,
                controllers: superopts
                    .split(',')
                    .filter(|o| *o != "rw" && *o != "ro" && !o.contains('='))
                    .map(str::to_string)
                    .collect(),
                point,
                root,
            }),
            _ => {}
        }
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's cgroup per hierarchy, from `/proc/self/cgroup`: (controllers, path); the
/// v2 entry has no controllers (`0::/path`).
pub fn memberships(proc_cgroup: &str) -> Vec<(Vec<String>, String)> {
    proc_cgroup
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let ctrls = parts.next()?;
            let path = parts.next()?;
            let ctrls = ctrls
                .split(',')
                .filter(|c| !c.is_empty() && !c.starts_with("name="))
                .map(str::to_string)
                .collect();
            Some((ctrls, path.to_string()))
        })
        .collect()
}

/// The directory of cgroup `path` in `mount` (None when the cgroup is outside what the
/// mount shows).
pub fn dir_in(mount: &Mount, path: &str) -> Option<PathBuf> {
    let root = mount.root.trim_end_matches('/');
    let rel = if root.is_empty() {
        path
    } else {
        path.strip_prefix(root)
            .filter(|r| r.is_empty() || r.starts_with('/'))?
    };
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rel.is_empty() {
        mount.point.clone()
    } else {
        mount.point.join(rel)
    })
}

/// This process's v1 directory for `controller`, if a v1 hierarchy carries it.
pub fn v1_dir(
    mounts: &[Mount],
    member: &[(Vec<String>, String)],
    controller: &str,
) -> Option<PathBuf> {
    let m = mounts
        .iter()
        .find(|m| !m.v2 && m.controllers.iter().any(|c| c == controller))?;
    let (_, path) = member
        .iter()
        .find(|(c, _)| c.iter().any(|c| c == controller))?;
    dir_in(m, path)
}

/// This process's v2 directory, if the unified hierarchy is mounted.
pub fn v2_dir(mounts: &[Mount], member: &[(Vec<String>, String)]) -> Option<PathBuf> {
    let m = mounts.iter().find(|m| m.v2)?;
    let (_, path) = member.iter().find(|(c, p)| c.is_empty() && !p.is_empty())?;
    dir_in(m, path)
}

/// Whether `dir` is this daemon's kind of directory (`stsd-<pid>`) and, if so, the pid.
pub fn daemon_pid(name: &str) -> Option<u32> {
    name.strip_prefix("stsd-")?.parse().ok()
}

/// Whether a process `pid` lives.
pub fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 23 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
34 30 0:30 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
35 30 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
36 30 0:32 / /sys/fs/cgroup/cpu\\040acct rw,relatime - cgroup cgroup rw,cpuacct
";
    const MEMBER: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/893c
1:cpu:/
0::/
";

    #[test]
    fn a_hybrid_host_gives_v1_dirs_per_controller() {
        let m = mounts(HYBRID);
        assert_eq!(m.len(), 6);
        assert!(m
            .iter()
            .any(|m| m.point == Path::new("/sys/fs/cgroup/cpu acct")));
        let member = memberships(MEMBER);
        assert_eq!(
            v1_dir(&m, &member, "memory").unwrap(),
            Path::new("/sys/fs/cgroup/memory/process_api/893c")
        );
        assert_eq!(
            v1_dir(&m, &member, "pids").unwrap(),
            Path::new("/sys/fs/cgroup/pids")
        );
        assert_eq!(v1_dir(&m, &member, "blkio"), None);
        assert_eq!(
            v2_dir(&m, &member).unwrap(),
            Path::new("/sys/fs/cgroup/unified")
        );
    }

    #[test]
    fn a_unified_host_gives_one_dir() {
        let m = mounts("25 1 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n");
        let member = memberships("0::/system.slice/stsd.service\n");
        assert_eq!(
            v2_dir(&m, &member).unwrap(),
            Path::new("/sys/fs/cgroup/system.slice/stsd.service")
        );
        assert_eq!(v1_dir(&m, &member, "memory"), None);
    }

    #[test]
    fn a_bind_mounted_root_is_stripped_and_paths_stay_inside() {
        let m = Mount {
            v2: true,
            controllers: vec![],
            point: "/cg".into(),
            root: "/a/b".into(),
        };
        assert_eq!(dir_in(&m, "/a/b/c").unwrap(), Path::new("/cg/c"));
        assert_eq!(dir_in(&m, "/a/b").unwrap(), Path::new("/cg"));
        assert_eq!(dir_in(&m, "/a/bc"), None);
        assert_eq!(dir_in(&m, "/x"), None);
        let root = Mount {
            root: "/".into(),
            ..m
        };
        assert_eq!(dir_in(&root, "/../etc"), None);
    }

    #[test]
    fn daemon_dirs_are_recognised() {
        assert_eq!(daemon_pid("stsd-42"), Some(42));
        assert_eq!(daemon_pid("stsd-x"), None);
        assert_eq!(daemon_pid("pool"), None);
        assert!(alive(std::process::id()));
    }
}
