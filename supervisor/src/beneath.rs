//! A directory handle that cannot be left: every file operation of the managed catalog (and
//! any state kept under a directory of the daemon's) goes through one.
//!
//! Names below the handle are opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`:
//! the kernel refuses a path that climbs out (`..`, an absolute path) or passes through a
//! symlink, whoever planted it. Renames, creations and removals take a single path component
//! relative to a directory handle (`renameat`, `mkdirat`, `unlinkat`), which neither follow a
//! final symlink nor leave the directory. The tool-name grammar
//! (`stsd_protocol::names`) is the first layer; this one holds when that check is wrong.

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub struct Beneath {
    fd: OwnedFd,
    /// Where the handle was opened, for messages only: never resolved again.
    path: PathBuf,
}

fn io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// `name` is one plain path component: not empty, not `.` or `..`, no `/` or NUL.
fn component(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single file name"),
        ));
    }
    Ok(name)
}

fn how(flags: OFlag) -> OpenHow {
    OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS)
}

impl Beneath {
    /// Opens `path` (creating it and its parents): the directory is the operator's, so its own
    /// path is trusted; nothing below it is.
    pub fn open(path: &Path) -> io::Result<Beneath> {
        std::fs::create_dir_all(path)?;
        let fd = nix::fcntl::open(
            path,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io)?;
        Ok(Beneath {
            fd,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The subdirectory `name` (one component), made first when `create`.
    pub fn dir(&self, name: &str, create: bool) -> io::Result<Beneath> {
        let name = component(name)?;
        if create {
            match nix::sys::stat::mkdirat(&self.fd, name, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(io(e)),
            }
        }
        let fd = openat2(&self.fd, name, how(OFlag::O_DIRECTORY | OFlag::O_RDONLY)).map_err(io)?;
        Ok(Beneath {
            fd,
            path: self.path.join(name),
        })
    }

    /// Whether an entry `name` exists (a symlink counts, and is not followed).
    pub fn exists(&self, name: &str) -> bool {
        component(name).is_ok_and(|n| {
            nix::sys::stat::fstatat(&self.fd, n, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
        })
    }

    /// The bytes of the regular file `name` (a symlink is refused).
    pub fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let fd = openat2(&self.fd, component(name)?, how(OFlag::O_RDONLY)).map_err(io)?;
        let mut out = Vec::new();
        io::Read::read_to_end(&mut std::fs::File::from(fd), &mut out)?;
        Ok(out)
    }

    /// Writes `name` atomically: a new file beside it, synced, renamed over it, the directory
    /// synced. A crash leaves the old version or the new one, never a mix. A symlink at
    /// `name` is replaced, not followed.
    pub fn write_atomic(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let name = component(name)?;
        // Keep the permissions of the file being replaced (a regular file only).
        let mode =
            nix::sys::stat::fstatat(&self.fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .ok()
                .filter(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG)
                .map_or(0o644, |st| st.st_mode & 0o7777);
        let mut n = 0u32;
        let (tmp, fd) = loop {
            let tmp = format!(".{name}.{}.{n}.tmp", std::process::id());
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL;
            match openat2(
                &self.fd,
                tmp.as_str(),
                how(flags).mode(Mode::from_bits_truncate(mode)),
            ) {
                Ok(fd) => break (tmp, fd),
                Err(Errno::EEXIST) if n < 100 => n += 1,
                Err(e) => return Err(io(e)),
            }
        };
        let result = (|| {
            let mut f = std::fs::File::from(fd);
            f.write_all(bytes)?;
            // The umask narrowed the mode the file was made with.
            nix::sys::stat::fchmod(&f, Mode::from_bits_truncate(mode)).map_err(io)?;
            f.sync_all()?;
            nix::fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(io)?;
            self.sync()
        })();
        if result.is_err() {
            let _ = nix::unistd::unlinkat(
                &self.fd,
                tmp.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            );
        }
        result
    }

    /// Moves `from` (here) to `to` in `dest` (one component each; neither is followed).
    pub fn rename(&self, from: &str, dest: &Beneath, to: &str) -> io::Result<()> {
        nix::fcntl::renameat(&self.fd, component(from)?, &dest.fd, component(to)?).map_err(io)?;
        dest.sync()?;
        self.sync()
    }

    /// The names of the entries, `.` and `..` left out, in no particular order.
    pub fn entries(&self) -> io::Result<Vec<String>> {
        let fd = openat2(&self.fd, ".", how(OFlag::O_DIRECTORY | OFlag::O_RDONLY)).map_err(io)?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io)?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let e = e.map_err(io)?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(self.fd.as_fd()).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> (tempfile::TempDir, Beneath) {
        let d = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let b = Beneath::open(&d.path().join("root")).unwrap_or_else(|e| panic!("{e}"));
        (d, b)
    }

    #[test]
    fn writes_and_reads_stay_below_the_handle() {
        let (d, b) = tmp();
        b.write_atomic("a.json", b"one")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(b.read("a.json").ok().as_deref(), Some(&b"one"[..]));
        for bad in ["../x", "..", ".", "", "a/b", "/etc/passwd", "x\0y"] {
            assert!(b.write_atomic(bad, b"x").is_err(), "{bad:?}");
            assert!(b.read(bad).is_err(), "{bad:?}");
            assert!(b.dir(bad, true).is_err(), "{bad:?}");
        }
        assert!(!d.path().join("x").exists());
        let mut names = b.entries().unwrap_or_default();
        names.sort();
        assert_eq!(names, vec!["a.json".to_string()]);
    }

    #[test]
    fn a_planted_symlink_is_never_followed() {
        let (d, b) = tmp();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(outside.join("secret"), "s").unwrap_or_else(|e| panic!("{e}"));
        let root = d.path().join("root");
        // A directory symlink: not entered.
        std::os::unix::fs::symlink(&outside, root.join("sub")).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.dir("sub", true).is_err());
        // A file symlink: not read, and a write replaces the link, not its target.
        std::os::unix::fs::symlink(outside.join("secret"), root.join("f.json"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(b.read("f.json").is_err());
        b.write_atomic("f.json", b"new")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            std::fs::read_to_string(outside.join("secret"))
                .ok()
                .as_deref(),
            Some("s")
        );
        assert!(!root.join("f.json").is_symlink());
        // A rename of a symlink moves the link itself.
        std::os::unix::fs::symlink(&outside, root.join("l")).unwrap_or_else(|e| panic!("{e}"));
        b.rename("l", &b, "m").unwrap_or_else(|e| panic!("{e}"));
        assert!(root.join("m").is_symlink());
        assert_eq!(
            std::fs::read_dir(&outside).map(|r| r.count()).unwrap_or(0),
            1
        );
    }

    #[test]
    fn a_rewrite_keeps_the_file_mode() {
        use std::os::unix::fs::PermissionsExt;
        let (d, b) = tmp();
        b.write_atomic("a", b"1").unwrap_or_else(|e| panic!("{e}"));
        let p = d.path().join("root/a");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
            .unwrap_or_else(|e| panic!("{e}"));
        b.write_atomic("a", b"2").unwrap_or_else(|e| panic!("{e}"));
        let mode = std::fs::metadata(&p)
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0);
        assert_eq!(mode, 0o600);
    }
}
