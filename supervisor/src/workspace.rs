//! The base path a file posture is confined to.

use std::path::PathBuf;
use stsd_profiles::Config;

/// Makes sure the base path exists before a file posture uses it. stsd's own default
/// workspace is created on first use and, when stsd runs as root, handed to the worker user so
/// write postures can write. An operator's own `fsBasePath` keeps the ownership it has.
pub fn prepare_base_path(
    sandbox: &stsd_protocol::frames::SandboxSpec,
    config: &Config,
) -> Result<(), String> {
    use stsd_protocol::frames::FsAccess;
    if sandbox.fs == FsAccess::None {
        return Ok(());
    }
    let p = PathBuf::from(&sandbox.base_path);
    let ours =
        config.baseline.fs_base_path.is_none() && p == stsd_profiles::baseline::default_workspace();
    if !p.is_dir() {
        std::fs::create_dir_all(&p)
            .map_err(|e| format!("cannot create the base path {}: {e}", p.display()))?;
    }
    if ours && nix::unistd::Uid::effective().is_root() {
        let (u, g) = (config.worker.uid, config.worker.gid);
        std::os::unix::fs::chown(&p, Some(u), Some(g))
            .map_err(|e| format!("chown {}: {e}", p.display()))?;
    }
    Ok(())
}
