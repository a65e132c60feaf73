//! A stdio upstream's workspace with a byte budget the kernel enforces: a tmpfs of
//! `[gateway] workspace_max_bytes` (or the upstream's own `workspace_max_bytes`) mounted on
//! the workspace by the supervisor, when it runs as root. A write past the budget fails
//! with ENOSPC at once, whether or not a call is running, and the pages count against the
//! upstream's cgroup memory. The mount lives as long as the daemon's upstream: it is
//! detached when the upstream is dropped, so the workspace is scratch that lasts one
//! daemon run. A mount left by a daemon killed before it could detach is reused (resized).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The mounted workspace; dropping it detaches the mount.
#[derive(Debug)]
pub struct Budget {
    path: PathBuf,
    bytes: u64,
}

impl Budget {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Whether `path` is a tmpfs mounted right there (not merely inside one).
fn is_own_tmpfs(path: &Path) -> bool {
    let Ok(fs) = nix::sys::statfs::statfs(path) else {
        return false;
    };
    let is_tmpfs = fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC;
    let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).ok();
    let parent = path.parent().and_then(dev);
    is_tmpfs && parent.is_some() && dev(path) != parent
}

/// Mounts a tmpfs of `bytes` on the existing directory `path`, owned by `uid:gid`, mode
/// 0700. Err when this process may not mount (not root), or the kernel refuses.
pub fn mount(path: &Path, bytes: u64, uid: u32, gid: u32) -> Result<Budget, String> {
    use nix::mount::MsFlags;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("stsd is not root: a workspace cannot get a tmpfs of its own".into());
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_dir() {
        return Err(format!("{}: not a directory", path.display()));
    }
    let data = format!("size={bytes},mode=0700,uid={uid},gid={gid}");
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    let r = if is_own_tmpfs(path) {
        nix::mount::mount(
            None::<&str>,
            path,
            None::<&str>,
            flags | MsFlags::MS_REMOUNT,
            Some(data.as_str()),
        )
    } else {
        nix::mount::mount(
            Some("stsd-workspace"),
            path,
            Some("tmpfs"),
            flags,
            Some(data.as_str()),
        )
    };
    r.map_err(|e| format!("tmpfs on {}: {e}", path.display()))?;
    Ok(Budget {
        path: path.to_path_buf(),
        bytes,
    })
}

impl Drop for Budget {
    fn drop(&mut self) {
        if is_own_tmpfs(&self.path) {
            let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_write_past_the_budget_fails_and_the_mount_goes_with_the_budget() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            let d = tempfile::tempdir().unwrap();
            assert!(mount(d.path(), 1 << 20, 1, 1).is_err());
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let ws = d.path().join("ws");
        std::fs::create_dir(&ws).unwrap();
        std::fs::write(ws.join("underneath"), b"x").unwrap();
        let b = mount(&ws, 1 << 20, 65534, 65534).unwrap();
        assert!(is_own_tmpfs(&ws));
        assert!(!ws.join("underneath").exists());
        let m = std::fs::metadata(&ws).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (65534, 0o700));
        let big = vec![0u8; 2 << 20];
        let e = std::fs::write(ws.join("big"), &big).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        // A second mount on the same place (a daemon that died) is reused and resized.
        let again = mount(&ws, 4 << 20, 65534, 65534).unwrap();
        std::fs::write(ws.join("big"), &big).unwrap();
        std::mem::forget(again);
        drop(b);
        assert!(!is_own_tmpfs(&ws));
        assert!(ws.join("underneath").exists());
    }
}
