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

/// Issue 38 item 3: a workspace the worker's uid may not use answered "SECURITY: access
/// denied by the sandbox", which sent the operator looking at Landlock. The refusal now says
/// which layer refused: the file system's permissions (the owner, the mode, the uid tools
/// run as and the fix), or Landlock; through the call pipeline, as every door gets it.
#[test]
fn an_access_error_says_which_layer_refused() {
    use std::process::Command;
    use stsd_tests::{is_root, stsd_bin, WORKER_UID};
    if !is_root() {
        eprintln!("skipped: needs root to make files the worker's uid may not use");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path();
    let ws = d.join("ws");
    let sh = |args: &[&str]| {
        let ok = Command::new(args[0])
            .args(&args[1..])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{args:?}");
    };
    std::fs::create_dir(&ws).unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir(ws.join("rootdir")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(ws.join("README.md"), "hi\n").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(ws.join("locked.txt"), "root's\n").unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink("/etc/hostname", ws.join("out-link"))
        .unwrap_or_else(|e| panic!("{e}"));
    let s = |p: &std::path::Path| p.display().to_string();
    sh(&["chmod", "755", &s(d)]);
    sh(&[
        "chown",
        "-R",
        &format!("{WORKER_UID}:{WORKER_UID}"),
        &s(&ws),
    ]);
    sh(&[
        "chown",
        "-h",
        "0:0",
        &s(&ws.join("locked.txt")),
        &s(&ws.join("rootdir")),
    ]);
    sh(&["chmod", "600", &s(&ws.join("locked.txt"))]);
    let config = d.join("stsd.toml");
    std::fs::write(
        &config,
        format!(
            "[baseline]\nfs_base_path = \"{}\"\n[daemon]\naudit_log = \"{}\"\n",
            ws.display(),
            d.join("audit.jsonl").display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let specs = stsd_tests::catalog_dir().join("default-tool-specs-builtin-fs.json");
    let run = |tool: &str, path: &str| -> serde_json::Value {
        let out = Command::new(stsd_bin())
            .arg("run")
            .arg(&specs)
            .args(["--tool", tool, "--arg", &format!("path={path}")])
            .args(if tool == "writeTextFile" {
                &["--arg", "content=x"][..]
            } else {
                &[]
            })
            .args(["--approve", "--json", "--config"])
            .arg(&config)
            .env("STSD_STATE_DIR", d.join("state"))
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    // The control: the workspace works.
    assert_eq!(run("readTextFile", "README.md")["result"], "hi\n");
    // The file's own permissions: named as such, with the owner, the mode and the fix.
    for (tool, path, names) in [
        (
            "readTextFile",
            "locked.txt",
            "locked.txt is owned by uid 0 gid 0 with mode 600",
        ),
        (
            "writeTextFile",
            "rootdir/new.txt",
            "rootdir is owned by uid 0 gid 0 with mode 755",
        ),
        // A directory to make below the one that refuses: the refusing one is named.
        (
            "writeTextFile",
            "rootdir/sub/new.txt",
            "rootdir is owned by uid 0 gid 0 with mode 755",
        ),
    ] {
        let e = &run(tool, path)["error"];
        assert_eq!(e["code"], "HELPER_RUNTIME", "{tool} {path}: {e}");
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.starts_with("permission denied by the file system, not the sandbox"),
            "{m}"
        );
        assert!(m.contains(names), "{m}");
        assert!(m.contains(&format!("tools run as uid {WORKER_UID}")), "{m}");
        assert!(
            m.contains(&format!("chown -R {WORKER_UID}:{WORKER_UID}")),
            "{m}"
        );
    }
    // What the file system would allow and Landlock does not is Landlock's refusal, and
    // nothing about the file outside is told.
    let e = &run("readTextFile", "out-link")["error"];
    assert_eq!(e["code"], "SECURITY", "{e}");
    let m = e["message"].as_str().unwrap_or_default();
    assert!(m.contains("(Landlock)"), "{m}");
    assert!(!m.contains("owned by") && !m.contains("/etc"), "{m}");
}
