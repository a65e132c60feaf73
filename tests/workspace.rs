//! Base paths: a spec can only be confined to a directory under a root the operator allows,
//! and a symlink inside an allowed root cannot point Landlock elsewhere.

use std::path::PathBuf;
use stsd::workspace::prepare_base_path;
use stsd_profiles::Config;
use stsd_protocol::frames::{FsAccess, NetworkGrant, SandboxSpec};

fn sandbox(base: &std::path::Path) -> SandboxSpec {
    SandboxSpec {
        fs: FsAccess::ReadOnly,
        base_path: base.display().to_string(),
        uid: 65534,
        gid: 65534,
        network: NetworkGrant::Blocked,
    }
}

#[test]
fn symlinks_out_of_an_allowed_root_are_refused() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = Config::default();
    cfg.baseline.fs_base_path = Some(root.path().to_path_buf());
    std::fs::create_dir(root.path().join("real")).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink("/etc", root.path().join("to-etc"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(root.path().join("real"), root.path().join("to-real"))
        .unwrap_or_else(|e| panic!("{e}"));

    let mut s = sandbox(&root.path().join("to-etc"));
    let err = prepare_base_path(&mut s, &cfg).err().unwrap_or_default();
    assert!(err.contains("outside every allowed root"), "{err}");

    // A symlink that stays inside resolves to its real path, which the worker is given.
    let mut s = sandbox(&root.path().join("to-real"));
    assert_eq!(prepare_base_path(&mut s, &cfg), Ok(()));
    let want = root.path().join("real").canonicalize().unwrap_or_default();
    assert_eq!(PathBuf::from(&s.base_path), want);
}

#[test]
fn only_stsds_own_workspace_is_created() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let other = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = Config::default();
    cfg.baseline.fs_base_path = Some(root.path().join("ws"));
    cfg.baseline.allowed_base_roots = vec![other.path().to_path_buf()];
    // Inside the workspace: created on first use.
    let mut s = sandbox(&root.path().join("ws/project"));
    assert_eq!(prepare_base_path(&mut s, &cfg), Ok(()));
    assert!(root.path().join("ws/project").is_dir());
    // Under another allowed root: must already exist.
    let mut s = sandbox(&other.path().join("missing"));
    assert!(prepare_base_path(&mut s, &cfg).is_err());
    assert!(!other.path().join("missing").exists());
}

#[test]
fn creating_a_base_path_never_follows_a_planted_symlink() {
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let outside = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(outside.path(), ws.join("outlink"))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut cfg = Config::default();
    cfg.baseline.fs_base_path = Some(ws.clone());
    let mut s = sandbox(&ws.join("outlink/created-by-root/x"));
    let err = prepare_base_path(&mut s, &cfg).err().unwrap_or_default();
    assert!(err.contains("symlink"), "{err}");
    assert!(
        !outside.path().join("created-by-root").exists(),
        "nothing was created outside the workspace"
    );
}
