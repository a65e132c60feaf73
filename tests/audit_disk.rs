//! Issue 33 item 6: the audit log of record under a full disk. The log lives on a 1 MiB
//! tmpfs of its own, filled by the test:
//! - a record cut by the full disk never leaves a fragment: every line parses, during and
//!   after (before: the next record was appended onto the fragment, a line that does not
//!   parse);
//! - with `audit_on_failure = "auto"` a tool with effects (here one that writes files) is
//!   refused AUDIT_UNAVAILABLE before it runs, a pure one is served, and each record lost
//!   is counted (`stsd metrics`, `stsd_audit_failures_total`);
//! - when space comes back, the calls are recorded again.
//!
//! Needs root (mount).

use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use stsd_tests::harness::{is_error, text, Daemon, CATALOG};
use stsd_tests::is_root;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap_or_else(|e| panic!("{e}"));
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .unwrap_or_else(|e| panic!("{e}"))
            .success();
        assert!(ok, "mount tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `file` until the filesystem is full.
fn fill(file: &Path) {
    let mut f = std::fs::File::create(file).unwrap_or_else(|e| panic!("{e}"));
    let block = vec![b'x'; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
}

/// Every line of the log, each of which must parse.
fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("line {} does not parse ({e}): {l:?}", i + 1))
        })
        .collect()
}

/// One of `stsd metrics`'s audit counters.
fn metric(d: &Daemon, name: &str) -> u64 {
    let out = Command::new(stsd_tests::stsd_bin())
        .args(["metrics", "--json", "--socket"])
        .arg(&d.socket)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["audit"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no audit.{name} in: {v}"))
}

#[test]
fn a_full_disk_cuts_no_record_refuses_calls_with_effects_and_recovers() {
    if !is_root() {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fs = Tmpfs::mount(&dir.path().join("logfs"), "1m");
    let log = fs.0.join("audit.jsonl");
    // The harness's audit path, a link to the log on the small filesystem.
    std::os::unix::fs::symlink(&log, dir.path().join("audit.jsonl"))
        .unwrap_or_else(|e| panic!("{e}"));
    let d = Daemon::start_with(dir, 1, "", CATALOG, &[]);
    let mut c = d.connect();
    let mut id = 0;
    let mut call = |tool: &str, args: Value| {
        id += 1;
        c.call(id, tool, args);
        let r = c.response();
        (is_error(&r), text(&r))
    };
    assert_eq!(
        call("echo-console", json!({"text": "room"})),
        (false, "echo: room".into())
    );
    assert_eq!(lines(&log).len(), 1);

    // Full, but for one page and a little: records fill it and the last one is cut.
    let gap = fs.0.join("gap");
    std::fs::write(&gap, vec![b'g'; 12 * 1024]).unwrap_or_else(|e| panic!("{e}"));
    fill(&fs.0.join("filler"));
    std::fs::remove_file(&gap).unwrap_or_else(|e| panic!("{e}"));
    for i in 0..40 {
        let (err, t) = call(
            "echo-console",
            json!({"text": format!("pure call {i} {}", "p".repeat(400))}),
        );
        assert!(
            !err,
            "a pure call is served while its record cannot be written: {t}"
        );
        let (err, t) = call("writer", json!({}));
        if err {
            assert!(t.starts_with("AUDIT_UNAVAILABLE: "), "{t}");
        }
    }
    let (err, t) = call("writer", json!({}));
    assert!(
        err && t.starts_with("AUDIT_UNAVAILABLE: "),
        "a call with effects runs unrecorded: {t}"
    );
    let during = lines(&log);
    assert!(during.len() > 1, "{} records", during.len());
    assert!(metric(&d, "failures") > 0);
    assert!(metric(&d, "refused") > 0);

    // Room again: recorded again, after the lines already there, each whole.
    std::fs::remove_file(fs.0.join("filler")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(call("writer", json!({})), (false, "would write".into()));
    assert_eq!(
        call("echo-console", json!({"text": "back"})),
        (false, "echo: back".into())
    );
    let after = lines(&log);
    let last: Vec<&Value> = after.iter().rev().take(2).collect();
    assert_eq!(last[0]["name"], "echo-console");
    assert_eq!(last[1]["name"], "writer");
    assert_eq!(last[1]["outcome"], "OK");
    drop(c);
    drop(d);
}
