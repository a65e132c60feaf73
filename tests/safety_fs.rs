//! safety.fs/v1: the reference catalog's 18 file tools earn their Local Pass against a seeded
//! workspace, and hostile paths end in SECURITY, with the kernel behind the path check.

use std::path::Path;
use stsd::exec::{run_job, CallValue};
use stsd::local_pass::run_entry;
use stsd::store::Catalog;
use stsd_profiles::Config;
use stsd_protocol::frames::FsAccess;
use stsd_protocol::Code;
use stsd_tests::{catalog_dir, exec_options, is_root, job, scratch_base, WORKER_UID};

fn no_env(_: &str) -> Option<String> {
    None
}

/// The files the catalog's testValues expect.
fn seed(dir: &Path) {
    let w = |p: &str, s: &str| {
        let path = dir.join(p);
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(&path, s).unwrap_or_else(|e| panic!("{e}"));
    };
    w("README.md", stsd::workspace::WORKSPACE_README);
    w("data.csv", "name,age,city\nAlice,30,Seoul\nBob,25,Busan\n");
    w("uploads/data.csv", "a,b\n1,2\n");
    w("report.md", "# old title\n\nbody\n");
    w("draft.md", "draft\n");
    w("obsolete.txt", "old\n");
    w("tmp/a.txt", "a");
    w("tmp/nested/b.txt", "b");
    if is_root() {
        let _ = Command::new("chown")
            .args(["-R", &format!("{WORKER_UID}:{WORKER_UID}")])
            .arg(dir)
            .status();
    }
}

use std::process::Command;

#[test]
fn all_18_file_tools_earn_their_local_pass() {
    let cat = Catalog::load(&[catalog_dir().join("default-tool-specs-builtin-fs.json")]);
    assert_eq!(cat.entries.len(), 18);
    let mut passed = Vec::new();
    for e in &cat.entries {
        // A fresh workspace per spec: the write tools change what the next one would see.
        let ws = scratch_base();
        seed(ws.path());
        let mut cfg = Config::default();
        cfg.baseline.fs_base_path = Some(ws.path().to_path_buf());
        let r = run_entry(
            &cat,
            e,
            &cfg,
            &no_env,
            &exec_options(),
            stsd::local_pass::PassPlace::Scratch,
            Some(&stsd_tests::APPROVE),
        );
        assert!(r.outcome.is_ok(), "{}: {:?}", r.name, r.outcome);
        passed.push(r.name);
    }
    assert_eq!(passed.len(), 18);
}

fn run_fs(code: &str, fs: FsAccess, base: &Path) -> Result<String, (Code, String)> {
    let j = job(code, fs, base);
    match run_job(&j, &exec_options(), &mut |_| {}).result {
        Ok(CallValue::Json(t)) => Ok(t),
        Ok(CallValue::Undefined) => Ok("undefined".into()),
        Err(e) => Err((e.code, e.message)),
    }
}

#[test]
fn hostile_paths_are_security_errors() {
    let ws = scratch_base();
    seed(ws.path());
    std::os::unix::fs::symlink("/etc/passwd", ws.path().join("escape-link"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink("/tmp", ws.path().join("escape-dir"))
        .unwrap_or_else(|e| panic!("{e}"));
    if is_root() {
        let _ = Command::new("chown")
            .args(["-h", "65534:65534"])
            .arg(ws.path().join("escape-link"))
            .status();
    }
    let b = ws.path();
    for code in [
        "return safety.fs.readText('../../../etc/passwd');",
        "return safety.fs.readText('/etc/passwd');",
        "return safety.fs.list('..');",
        "return safety.fs.writeText('../outside.txt', 'x');",
        "return safety.fs.deleteDir('.');",
        "return safety.fs.writeText('escape-link', 'x');",
        "return safety.fs.copy('README.md', '/tmp/stolen.txt');",
    ] {
        let r = run_fs(code, FsAccess::ReadWrite, b);
        assert!(matches!(&r, Err((Code::Security, _))), "{code}: {r:?}");
    }
    // The read group is refused to a write-only posture, and writes to a read-only one.
    assert!(matches!(
        run_fs(
            "return safety.fs.readText('README.md');",
            FsAccess::WriteOnly,
            b
        ),
        Err((Code::Security, _))
    ));
    assert!(matches!(
        run_fs(
            "return safety.fs.writeText('n.txt', 'x');",
            FsAccess::ReadOnly,
            b
        ),
        Err((Code::Security, _))
    ));
    // No file access at all: safety.fs does not exist.
    let r = run_fs("return typeof safety.fs;", FsAccess::None, b);
    assert_eq!(r, Ok("\"undefined\"".into()));
    assert!(!Path::new("/tmp/stolen.txt").exists());
}

#[test]
fn a_path_the_engine_accepts_still_cannot_leave_the_base() {
    // `escape-link` lies inside the base, so the lexical check lets it through; the kernel
    // (Landlock, on the real inode) refuses it. This is the path check being fooled, and the
    // OS layer holding on its own; the raw-syscall version is in tests/escape.rs.
    let ws = scratch_base();
    seed(ws.path());
    std::os::unix::fs::symlink("/etc/passwd", ws.path().join("escape-link"))
        .unwrap_or_else(|e| panic!("{e}"));
    let r = run_fs(
        "return safety.fs.readText('escape-link');",
        FsAccess::ReadOnly,
        ws.path(),
    );
    match r {
        // The worker alone cannot tell Landlock from permissions: the call pipeline says
        // which (tests/workspace.rs).
        Err((Code::Security, m)) => assert!(m.contains("access denied by the sandbox"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_api_behaves_as_the_reference_documents() {
    let ws = scratch_base();
    seed(ws.path());
    let b = ws.path();
    let ok = |code: &str| {
        run_fs(code, FsAccess::ReadWrite, b).unwrap_or_else(|e| panic!("{code}: {e:?}"))
    };
    assert_eq!(
        ok("return safety.fs.list('tmp');"),
        r#"["tmp/a.txt","tmp/nested"]"#
    );
    assert_eq!(ok("return safety.fs.list('missing');"), "[]");
    assert_eq!(
        ok("return safety.fs.slice('data.csv', -2);"),
        r#"["Alice,30,Seoul","Bob,25,Busan"]"#
    );
    assert_eq!(
        ok("return safety.fs.cut('data.csv', {fields: [3, 1], delimiter: ','});"),
        r#"["city,name","Seoul,Alice","Busan,Bob"]"#
    );
    assert_eq!(
        ok("return safety.fs.grep('^B', 'data.csv', {numbered: true});"),
        r#"["3:Bob,25,Busan"]"#
    );
    assert_eq!(
        ok("return safety.fs.find('.', '*.txt', {type: 'file'});"),
        r#"["obsolete.txt","tmp/a.txt","tmp/nested/b.txt"]"#
    );
    assert_eq!(
        ok("return safety.fs.find('.', '*.txt', {maxDepth: 1});"),
        r#"["obsolete.txt"]"#
    );
    assert_eq!(ok("safety.fs.appendText('log.txt', 'a\\n'); safety.fs.appendText('log.txt', 'b\\n'); return safety.fs.readText('log.txt');"), r#""a\nb\n""#);
    assert_eq!(
        ok("return safety.fs.editText('report.md', 'old', 'new').replacements;"),
        "1"
    );
    let r = run_fs(
        "safety.fs.writeText('d.txt', 'x x'); return safety.fs.editText('d.txt', 'x', 'y');",
        FsAccess::ReadWrite,
        b,
    );
    assert!(
        matches!(r, Err((Code::InvalidInput, _))),
        "ambiguous edit: {r:?}"
    );
    assert_eq!(ok("return safety.fs.deleteDir('tmp');"), "3");
    assert_eq!(ok("return [safety.fs.exists('tmp'), safety.fs.delete('obsolete.txt'), safety.fs.delete('obsolete.txt')];"), "[false,true,false]");
    assert_eq!(
        ok("const s = safety.fs.stat('data.csv'); return [s.size, s.directory, s.mtime > 1.6e12];"),
        "[42,false,true]"
    );
}

#[test]
fn a_huge_file_is_a_clean_error_not_a_crash() {
    let ws = scratch_base();
    let big = ws.path().join("big.bin");
    let f = std::fs::File::create(&big).unwrap_or_else(|e| panic!("{e}"));
    // Sparse: 1 GiB of size without 1 GiB of disk.
    f.set_len(1 << 30).unwrap_or_else(|e| panic!("{e}"));
    drop(f);
    if is_root() {
        let _ = Command::new("chown")
            .args(["65534:65534"])
            .arg(&big)
            .status();
    }
    for code in [
        "return safety.fs.readText('big.bin').length;",
        "return safety.fs.lineCount('big.bin');",
    ] {
        let r = run_fs(code, FsAccess::ReadOnly, ws.path());
        match r {
            Err((Code::HelperRuntime, m)) => assert!(m.contains("limit"), "{m}"),
            other => panic!("{code}: {other:?}"),
        }
    }
}

/// The disk budget: a tool filling the workspace is stopped with OUTPUT_LIMIT at
/// max_write_bytes, one creating files at max_files. (The kernel's RLIMIT_FSIZE behind it is
/// tested without the helper in tests/escape.rs.)
#[test]
fn the_write_budget_stops_a_filling_tool() {
    let ws = scratch_base();
    let mut j = job(
        "const chunk = 'x'.repeat(1 << 20); let i = 0; \
         for (;;) { safety.fs.appendText('fill.bin', chunk); i++; }",
        FsAccess::ReadWrite,
        ws.path(),
    );
    j.limits.max_write_bytes = 8 << 20;
    let r = run_job(&j, &exec_options(), &mut |_| {}).result;
    let e = r
        .err()
        .unwrap_or_else(|| panic!("the filling tool finished"));
    assert_eq!(e.code, Code::OutputLimit, "{}", e.message);
    assert!(e.message.contains("max_write_bytes"), "{}", e.message);
    let size = std::fs::metadata(ws.path().join("fill.bin"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(size, 8 << 20, "only what fit the budget was written");

    let ws = scratch_base();
    let mut j = job(
        "for (let i = 0; ; i++) safety.fs.writeText('d' + (i % 7) + '/f' + i + '.txt', 'x', false);",
        FsAccess::ReadWrite,
        ws.path(),
    );
    j.limits.max_files = 50;
    let e = run_job(&j, &exec_options(), &mut |_| {})
        .result
        .err()
        .unwrap_or_else(|| panic!("the file-creating tool finished"));
    assert_eq!(e.code, Code::OutputLimit, "{}", e.message);
    assert!(e.message.contains("max_files"), "{}", e.message);
    let count = walk_count(ws.path());
    assert_eq!(count, 50, "entries created");
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let p = e.path();
            1 + if p.is_dir() { walk_count(&p) } else { 0 }
        })
        .sum()
}
