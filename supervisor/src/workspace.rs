//! The base path a file posture is confined to, made ready for a worker.
//!
//! The resolver already checked the path lexically against the operator's roots. Here the path
//! is resolved on disk (symlinks followed) and checked again against the resolved roots, so a
//! symlink inside an allowed root cannot hand Landlock a directory outside it. Directories are
//! created only inside stsd's own workspace.

use std::path::{Path, PathBuf};
use stsd_profiles::Config;
use stsd_protocol::frames::{FsAccess, SandboxSpec};

/// Creates (when it is ours), resolves and checks the base path of a job, and writes the
/// resolved path back into it. An error means the tool must not run (SANDBOX_UNAVAILABLE).
pub fn prepare_base_path(sandbox: &mut SandboxSpec, config: &Config) -> Result<(), String> {
    if sandbox.fs == FsAccess::None {
        return Ok(());
    }
    let path = PathBuf::from(&sandbox.base_path);
    let workspace = config.baseline.fs_base_path();
    if !path.exists() && path.starts_with(&workspace) {
        create_owned(&workspace, &path, config)?;
    }
    if path == workspace {
        seed_readme(&workspace, config)?;
    }
    let real = path
        .canonicalize()
        .map_err(|e| format!("base path {}: {e}", path.display()))?;
    if !real.is_dir() {
        return Err(format!("base path {} is not a directory", real.display()));
    }
    let roots: Vec<PathBuf> = config
        .baseline
        .base_roots()
        .iter()
        .filter_map(|r| r.canonicalize().ok())
        .collect();
    if !roots.iter().any(|r| real.starts_with(r)) {
        return Err(format!(
            "base path {} resolves to {}, outside every allowed root",
            path.display(),
            real.display()
        ));
    }
    sandbox.base_path = real.display().to_string();
    Ok(())
}

/// An empty workspace gets a short README on first use, as the reference runtime seeds its
/// own, so the file tools have something to read.
pub const WORKSPACE_README: &str = include_str!("../assets/workspace-README.md");

fn seed_readme(workspace: &Path, config: &Config) -> Result<(), String> {
    let empty = std::fs::read_dir(workspace)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false);
    if !empty {
        return Ok(());
    }
    let readme = workspace.join("README.md");
    std::fs::write(&readme, WORKSPACE_README)
        .map_err(|e| format!("cannot seed {}: {e}", readme.display()))?;
    if nix::unistd::Uid::effective().is_root() {
        let (u, g) = (config.worker.uid, config.worker.gid);
        std::os::unix::fs::chown(&readme, Some(u), Some(g))
            .map_err(|e| format!("chown {}: {e}", readme.display()))?;
    }
    Ok(())
}

/// Creates `path` (inside stsd's workspace) and, when stsd runs as root, hands every directory
/// it created to the worker user so write postures can write.
fn create_owned(workspace: &Path, path: &Path, config: &Config) -> Result<(), String> {
    let mut missing = Vec::new();
    let mut p = path;
    while !p.exists() {
        missing.push(p.to_path_buf());
        match p.parent() {
            Some(parent) => p = parent,
            None => break,
        }
    }
    std::fs::create_dir_all(path)
        .map_err(|e| format!("cannot create the base path {}: {e}", path.display()))?;
    if nix::unistd::Uid::effective().is_root() {
        let (u, g) = (config.worker.uid, config.worker.gid);
        for dir in missing.iter().filter(|d| d.starts_with(workspace)) {
            std::os::unix::fs::chown(dir, Some(u), Some(g))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
    }
    Ok(())
}
