//! The Local Pass's scratch workspace. `stsd test` and the publish gate run the catalog's
//! write and delete tools with their testValues; run against the configured workspace they
//! would overwrite `report.md`, delete `obsolete.txt` and move `draft.md` of whoever has files
//! of those names. So each Local Pass call (and each test case) gets a fresh scratch directory:
//! a copy of the base path it would have used (`std::fs::copy`, which reflinks where the
//! filesystem can), bounded in size, or, when that base path is empty, the sample files the
//! catalog's fs tools expect ([`seed`]). The scratch is removed when the call is over; the
//! real base path is only read.

mod seed;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
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
pub fn prepare(
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
    chown(dir.path(), owner)?;
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
            measure(&src, &mut budget())
                .and_then(|()| copy_tree(&src, dir.path(), owner, &mut budget()))
                .map_err(|e| {
                format!(
                    "{e} (the Local Pass runs file tools in a scratch copy of {}; `stsd test --in-place` runs them there directly)",
                    src.display()
                )
            })?;
        }
        _ => seed::write(dir.path(), owner)?,
    }
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

fn chown(path: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    match owner {
        Some((u, g)) => std::os::unix::fs::lchown(path, Some(u), Some(g))
            .map_err(|e| format!("chown {}: {e}", path.display())),
        None => Ok(()),
    }
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

/// Charges every entry under `src` to `budget` (symlinks are not followed).
fn measure(src: &Path, budget: &mut Budget) -> Result<(), String> {
    let entries = std::fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", src.display()))?;
        let meta = entry
            .path()
            .symlink_metadata()
            .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        budget.charge(if meta.is_file() { meta.len() } else { 0 })?;
        if meta.is_dir() {
            measure(&entry.path(), budget)?;
        }
    }
    Ok(())
}

/// Copies `src` into the existing directory `dst`: files (reflinked by the kernel's
/// copy_file_range where the filesystem can), directories and symlinks (as symlinks, never
/// followed); other file types (sockets, fifos, devices) are left out.
fn copy_tree(
    src: &Path,
    dst: &Path,
    owner: Option<(u32, u32)>,
    budget: &mut Budget,
) -> Result<(), String> {
    let entries = std::fs::read_dir(src).map_err(|e| format!("{}: {e}", src.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", src.display()))?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let meta = from
            .symlink_metadata()
            .map_err(|e| format!("{}: {e}", from.display()))?;
        let ft = meta.file_type();
        if ft.is_symlink() {
            budget.charge(0)?;
            let target =
                std::fs::read_link(&from).map_err(|e| format!("{}: {e}", from.display()))?;
            std::os::unix::fs::symlink(&target, &to)
                .map_err(|e| format!("{}: {e}", to.display()))?;
        } else if ft.is_dir() {
            budget.charge(0)?;
            std::fs::create_dir(&to).map_err(|e| format!("{}: {e}", to.display()))?;
            copy_tree(&from, &to, owner, budget)?;
            // After its contents: a read-only directory is copied read-only.
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(|e| format!("{}: {e}", to.display()))?;
        } else if ft.is_file() {
            budget.charge(meta.len())?;
            std::fs::copy(&from, &to).map_err(|e| format!("{}: {e}", from.display()))?;
        } else {
            continue;
        }
        chown(&to, owner)?;
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
            prepare(&mut sb, &config, PassPlace::Scratch).unwrap_or_else(|e| panic!("{e}"));
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
            prepare(&mut sb, &config, PassPlace::Scratch).unwrap_or_else(|e| panic!("{e}"));
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
