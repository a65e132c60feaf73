//! The Local Pass's scratch workspace. `stsd test` and the publish gate run the catalog's
//! write and delete tools with their testValues; run against the configured workspace they
//! would overwrite `report.md`, delete `obsolete.txt` and move `draft.md` of whoever has files
//! of those names. So each Local Pass call (and each test case) gets a fresh scratch directory:
//! a copy of the base path it would have used (`std::fs::copy`, which reflinks where the
//! filesystem can), bounded in size, or, when that base path is empty, the sample files the
//! catalog's fs tools expect ([`seed`]). The scratch is removed when the call is over; the
//! real base path is only read.

mod seed;

use seed::chown;

use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use stsd_profiles::Config;
use stsd_protocol::frames::{FsAccess, SandboxSpec};

/// Largest base path the Local Pass copies, in bytes and in entries (files, directories and
/// symlinks).
pub const MAX_COPY_BYTES: u64 = 256 << 20;
pub const MAX_COPY_ENTRIES: u64 = 10_000;

/// Where a Local Pass runs a tool that has file access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PassPlace {
    /// A scratch copy of the base path (the default).
    #[default]
    Scratch,
    /// The base path itself (`stsd test --in-place`): the old behaviour, which writes there.
    InPlace,
}

/// A scratch workspace, removed on drop.
pub struct Scratch {
    _dir: Option<tempfile::TempDir>,
}

/// Makes the base path of a Local Pass job ready: in place, as a published call gets it, or as
/// a scratch copy that `sandbox.base_path` then names. Keep the returned value alive until the
/// call is over. An error means the call must not run (SANDBOX_UNAVAILABLE).
pub fn copy_base_path(
    sandbox: &mut SandboxSpec,
    config: &Config,
    place: PassPlace,
) -> Result<Scratch, String> {
    if sandbox.fs == FsAccess::None {
        return Ok(Scratch { _dir: None });
    }
    if place == PassPlace::InPlace {
        crate::workspace::prepare_base_path(sandbox, config)?;
        return Ok(Scratch { _dir: None });
    }
    let real = PathBuf::from(&sandbox.base_path);
    let dir = tempfile::Builder::new()
        .prefix("stsd-local-pass-")
        .tempdir()
        .map_err(|e| format!("cannot create a scratch workspace: {e}"))?;
    let owner = worker_owner(config);
    // The scratch root stays stsd's own (0700) while it is filled, and goes to the worker user
    // only at the end: no other process of that user can plant a symlink where a copy is about
    // to be written as root.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", dir.path().display()))?;
    let source = match real.symlink_metadata() {
        Ok(_) => Some(crate::workspace::checked_real_path(&real, config)?),
        // stsd's own workspace, not made yet, is an empty one; any other base path must exist,
        // as it must for a published call.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && real.starts_with(config.baseline.fs_base_path()) =>
        {
            None
        }
        Err(e) => return Err(format!("base path {}: {e}", real.display())),
    };
    match source {
        Some(src) if !seed::is_fresh(&src) => {
            let budget = || Budget {
                bytes: MAX_COPY_BYTES,
                entries: MAX_COPY_ENTRIES,
            };
            // Measured first (metadata only), so an oversized base path is refused before a
            // single byte is copied.
            open_dir_at(None, &src)
                .and_then(|fd| {
                    walk(&fd, None, owner, &mut budget())?;
                    walk(&fd, Some(dir.path()), owner, &mut budget())
                })
                .map_err(|e| {
                format!(
                    "{e} (the Local Pass runs file tools in a scratch copy of {}; `stsd test --in-place` runs them there directly)",
                    src.display()
                )
            })?;
        }
        _ => seed::write(dir.path(), owner)?,
    }
    chown(dir.path(), owner)?;
    let path = dir
        .path()
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.path().display()))?;
    sandbox.base_path = path.display().to_string();
    Ok(Scratch { _dir: Some(dir) })
}

/// What the worker user is, when stsd runs as root (files it must write are handed to it).
fn worker_owner(config: &Config) -> Option<(u32, u32)> {
    nix::unistd::Uid::effective()
        .is_root()
        .then_some((config.worker.uid, config.worker.gid))
}

struct Budget {
    bytes: u64,
    entries: u64,
}

impl Budget {
    fn charge(&mut self, bytes: u64) -> Result<(), String> {
        if self.entries == 0 || self.bytes < bytes {
            return Err(format!(
                "the base path is over the scratch copy's limit of {} MiB or {MAX_COPY_ENTRIES} entries",
                MAX_COPY_BYTES >> 20
            ));
        }
        self.entries -= 1;
        self.bytes -= bytes;
        Ok(())
    }
}

/// A directory of the real base path, opened without following a symlink. The walk below
/// goes from directory descriptor to directory descriptor (openat with O_NOFOLLOW, one name
/// at a time): stsd may run as root while a worker of the same base path renames things in
/// it, and a path re-resolved from the top could then be sent through a planted symlink to a
/// file outside the base path, which the copy would hand to the tool under test.
fn open_dir_at(dir: Option<&OwnedFd>, name: &Path) -> Result<OwnedFd, String> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match dir {
        Some(d) => openat(d, name, flags, Mode::empty()),
        None => nix::fcntl::open(name, flags, Mode::empty()),
    }
    .map_err(|e| format!("{}: {e}", name.display()))
}

/// The names in an open directory (`.` and `..` left out).
fn names(dir: &OwnedFd) -> Result<Vec<std::ffi::OsString>, String> {
    let dup = dir.try_clone().map_err(|e| format!("dup: {e}"))?;
    let mut d = nix::dir::Dir::from_fd(dup).map_err(|e| format!("readdir: {e}"))?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| format!("readdir: {e}"))?;
        let name = std::ffi::OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            out.push(name.to_os_string());
        }
    }
    Ok(out)
}

/// Walks the open directory `src`: charges every entry to `budget` and, when `dst` is given,
/// copies it there: files (std's File-to-File copy uses copy_file_range, which reflinks where
/// the filesystem can), directories with their modes, symlinks as symlinks (never followed);
/// other file types (sockets, fifos, devices) are left out.
fn walk(
    src: &OwnedFd,
    dst: Option<&Path>,
    owner: Option<(u32, u32)>,
    budget: &mut Budget,
) -> Result<(), String> {
    for name in names(src)? {
        let name = Path::new(&name);
        let st = fstatat(src, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| format!("{}: {e}", name.display()))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        let to = dst.map(|d| d.join(name));
        if kind == SFlag::S_IFLNK {
            budget.charge(0)?;
            if let Some(to) = &to {
                let target =
                    readlinkat(src, name).map_err(|e| format!("{}: {e}", name.display()))?;
                std::os::unix::fs::symlink(&target, to)
                    .map_err(|e| format!("{}: {e}", to.display()))?;
            }
        } else if kind == SFlag::S_IFDIR {
            budget.charge(0)?;
            let sub = open_dir_at(Some(src), name)?;
            if let Some(to) = &to {
                std::fs::create_dir(to).map_err(|e| format!("{}: {e}", to.display()))?;
            }
            walk(&sub, to.as_deref(), owner, budget)?;
            if let Some(to) = &to {
                // After its contents: a read-only directory is copied read-only.
                std::fs::set_permissions(to, std::fs::Permissions::from_mode(st.st_mode & 0o7777))
                    .map_err(|e| format!("{}: {e}", to.display()))?;
            }
        } else if kind == SFlag::S_IFREG {
            budget.charge(st.st_size.max(0) as u64)?;
            if let Some(to) = &to {
                let flags =
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
                let fd = openat(src, name, flags, Mode::empty())
                    .map_err(|e| format!("{}: {e}", name.display()))?;
                let mut from = std::fs::File::from(fd);
                // Swapped for something else since the stat: not copied.
                if !from.metadata().is_ok_and(|m| m.is_file()) {
                    continue;
                }
                let mut out =
                    std::fs::File::create_new(to).map_err(|e| format!("{}: {e}", to.display()))?;
                std::io::copy(&mut from, &mut out)
                    .map_err(|e| format!("{}: {e}", name.display()))?;
                std::fs::set_permissions(to, std::fs::Permissions::from_mode(st.st_mode & 0o7777))
                    .map_err(|e| format!("{}: {e}", to.display()))?;
            }
        } else {
            continue;
        }
        if let Some(to) = &to {
            chown(to, owner)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(base: &Path) -> Config {
        let mut c = Config::default();
        c.baseline.fs_base_path = Some(base.to_path_buf());
        c
    }

    fn sandbox(base: &Path) -> SandboxSpec {
        SandboxSpec {
            fs: FsAccess::ReadWrite,
            base_path: base.display().to_string(),
            uid: 65534,
            gid: 65534,
            network: stsd_protocol::frames::NetworkGrant::Blocked,
        }
    }

    #[test]
    fn a_scratch_copy_is_a_copy_and_goes_away() {
        let real = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(real.path().join("sub")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(real.path().join("sub/a.txt"), "mine").unwrap_or_else(|e| panic!("{e}"));
        std::os::unix::fs::symlink("/etc/passwd", real.path().join("link"))
            .unwrap_or_else(|e| panic!("{e}"));
        let config = config_with(real.path());
        let mut sb = sandbox(real.path());
        let scratch =
            copy_base_path(&mut sb, &config, PassPlace::Scratch).unwrap_or_else(|e| panic!("{e}"));
        let copy = PathBuf::from(&sb.base_path);
        assert_ne!(copy, real.path());
        assert_eq!(
            std::fs::read_to_string(copy.join("sub/a.txt"))
                .ok()
                .as_deref(),
            Some("mine")
        );
        assert_eq!(
            std::fs::read_link(copy.join("link")).ok(),
            Some(PathBuf::from("/etc/passwd"))
        );
        std::fs::write(copy.join("sub/a.txt"), "changed").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            std::fs::read_to_string(real.path().join("sub/a.txt"))
                .ok()
                .as_deref(),
            Some("mine")
        );
        drop(scratch);
        assert!(!copy.exists());
    }

    #[test]
    fn an_empty_base_path_gets_the_samples_and_stays_empty() {
        let real = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let config = config_with(real.path());
        let mut sb = sandbox(real.path());
        let _scratch =
            copy_base_path(&mut sb, &config, PassPlace::Scratch).unwrap_or_else(|e| panic!("{e}"));
        let copy = PathBuf::from(&sb.base_path);
        for f in [
            "README.md",
            "data.csv",
            "report.md",
            "log.txt",
            "uploads/data.csv",
            "draft.md",
            "obsolete.txt",
            "tmp",
        ] {
            assert!(copy.join(f).exists(), "{f}");
        }
        assert_eq!(
            std::fs::read_dir(real.path()).map(|d| d.count()).ok(),
            Some(0)
        );
    }

    #[test]
    fn an_oversized_base_path_is_refused_with_a_clear_error() {
        let mut b = Budget {
            bytes: 10,
            entries: 2,
        };
        assert!(b.charge(5).is_ok());
        let e = b.charge(6).err().unwrap_or_default();
        assert!(e.contains("over the scratch copy's limit"), "{e}");
    }
}
