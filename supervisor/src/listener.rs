//! The daemon's Unix socket: created 0600 (0660 with a configured group) in a directory that
//! is not world-writable, a stale socket from a killed daemon reclaimed, a live one refused;
//! every connection's peer credentials checked against the allow list.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::net::{UnixListener, UnixStream};

pub struct Bound {
    pub listener: UnixListener,
    pub path: PathBuf,
    /// The socket file is ours to remove when the daemon stops (or fails to start); one
    /// systemd passed in belongs to the socket unit and stays.
    owned: bool,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The listening socket systemd passed (socket activation). Its mode and owner are the
/// socket unit's (`SocketMode=`, `SocketGroup=`); peers are still checked by uid.
pub fn from_systemd(l: crate::systemd::ListenFd) -> Result<Bound, String> {
    let std = std::os::unix::net::UnixListener::from(l.fd);
    std.set_nonblocking(true)
        .map_err(|e| format!("socket from systemd: {e}"))?;
    let listener = UnixListener::from_std(std).map_err(|e| format!("socket from systemd: {e}"))?;
    Ok(Bound {
        listener,
        path: l
            .path
            .unwrap_or_else(|| PathBuf::from("(socket from systemd)")),
        owned: false,
    })
}

pub fn bind(path: &Path, group: Option<u32>) -> Result<Bound, String> {
    if let Some(dir) = path.parent() {
        if !dir.exists() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        }
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        // Only a socket is ever reclaimed: a socket path that names some other file (a typo
        // in `[daemon] socket`) is an error, never a deletion.
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket: give [daemon] socket / --socket a path of its own",
                path.display()
            ));
        }
        // A live daemon answers; a stale socket (kill -9) refuses and is reclaimed.
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => {
                return Err(format!(
                    "another stsd is already listening on {}",
                    path.display()
                ))
            }
            Err(_) => std::fs::remove_file(path)
                .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?,
        }
    }
    // The umask makes the socket private from its first moment; no window at a wider mode.
    // SAFETY: umask has no preconditions; it is restored right after bind.
    let old = unsafe { libc::umask(0o177) };
    let listener = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = listener.map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    // From here on the file is ours: dropping the Bound (an error below included) removes it.
    let bound = Bound {
        listener,
        path: path.to_path_buf(),
        owned: true,
    };
    if let Some(gid) = group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| format!("chown socket: {e}"))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|e| format!("chmod socket: {e}"))?;
    }
    Ok(bound)
}

/// The peer's uid when it is allowed, else why not.
pub fn check_peer(stream: &UnixStream, allowed: &[u32]) -> Result<u32, String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("SO_PEERCRED: {e}"))?;
    let uid = cred.uid();
    let own = nix::unistd::Uid::effective().as_raw();
    if uid == own || allowed.contains(&uid) {
        Ok(uid)
    } else {
        Err(format!("uid {uid} is not allowed to use this daemon"))
    }
}

#[cfg(test)]
mod tests {
    /// A socket path that names a file (a typo in `[daemon] socket`) is refused, and the
    /// file is left as it was: a stale socket is the only thing ever reclaimed.
    #[test]
    fn a_path_that_is_not_a_socket_is_refused_and_kept() {
        let d = tempfile::tempdir().expect("tempdir");
        let file = d.path().join("stsd.toml");
        std::fs::write(&file, "[daemon]\n").expect("write");
        let err = super::bind(&file, None).err().unwrap_or_default();
        assert!(err.contains("is not a socket"), "{err}");
        assert_eq!(
            std::fs::read_to_string(&file).ok().as_deref(),
            Some("[daemon]\n")
        );
    }
}
