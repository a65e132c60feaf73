//! Shared helpers for stsd's integration tests: where the shared reference material and the
//! test corpus live.

use std::path::{Path, PathBuf};

pub mod fixture_server;
pub mod harness;

/// `shared/` beside the checkout (CI and developers have it there); `STSD_SHARED` overrides.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("STSD_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    assert!(
        dir.join("catalog").is_dir(),
        "the reference catalog is missing: expected {}/catalog (set STSD_SHARED)",
        dir.display()
    );
    dir
}

pub fn catalog_dir() -> PathBuf {
    shared_dir().join("catalog")
}

/// The six catalog files that hold specs (the others are presets, categories, integrity).
pub fn catalog_spec_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(catalog_dir())
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("default-tool-specs"))
    });
    files.sort();
    assert_eq!(files.len(), 6, "expected the six catalog spec files");
    files
}

pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// Reads a JSON file the test itself relies on; a broken fixture is a test bug, so panic.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}

/// The `stsd` binary of this build (target/<triple>/<profile>/stsd), which `cargo test
/// --workspace` builds with the test-only `attack` feature.
pub fn stsd_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<triple>/<profile>/deps/<test>-<hash> -> target/<triple>/<profile>/stsd
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("stsd"))
        .unwrap_or_default();
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with `cargo test --workspace` (scripts/test)",
        bin.display()
    );
    bin
}

/// The spawn mode `STSD_TEST_SPAWN` asks for (`exec` or `zygote`), if any.
pub fn spawn_mode_from_env() -> Option<stsd_profiles::baseline::SpawnMode> {
    match std::env::var("STSD_TEST_SPAWN").ok()?.as_str() {
        "" => None,
        "exec" => Some(stsd_profiles::baseline::SpawnMode::Exec),
        "zygote" => Some(stsd_profiles::baseline::SpawnMode::Zygote),
        other => panic!("STSD_TEST_SPAWN={other}: expected exec or zygote"),
    }
}

/// Options for running jobs in-process, in the spawn mode `STSD_TEST_SPAWN` asks for (the
/// default, the zygote, when unset).
pub fn exec_options() -> stsd::exec::ExecOptions {
    exec_options_in(spawn_mode_from_env().unwrap_or_default())
}

pub fn exec_options_in(mode: stsd_profiles::baseline::SpawnMode) -> stsd::exec::ExecOptions {
    let mut c = stsd_profiles::Config::default();
    c.worker.spawn = mode;
    stsd::exec::ExecOptions::new(stsd_bin(), &c).unwrap_or_else(|e| panic!("exec options: {e}"))
}

/// Both spawn modes, for the tests that must hold in each.
pub const SPAWN_MODES: [stsd_profiles::baseline::SpawnMode; 2] = [
    stsd_profiles::baseline::SpawnMode::Zygote,
    stsd_profiles::baseline::SpawnMode::Exec,
];

/// The scheduling policy in a /proc/PID/stat line (its 41st field; 0 is SCHED_OTHER, 5
/// SCHED_IDLE).
pub fn sched_policy(stat: &str) -> Option<u32> {
    // pid (comm) state ...: comm may hold spaces, so count from after the last ')', where
    // the state is field 3.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(41 - 3)?.parse().ok()
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// True (and says why the test is skipped) when not root: `if skip_unless_root(why) { return; }`.
pub fn skip_unless_root(why: &str) -> bool {
    if is_root() {
        return false;
    }
    eprintln!("skipped: {why}");
    true
}

/// The worker user of the default config.
pub const WORKER_UID: u32 = 65534;

/// A scratch base path a worker may use: world-traversable, owned by the worker user when the
/// tests run as root (so write postures can write).
pub fn scratch_base() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("stsd-base-")
        .tempdir_in("/tmp")
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755));
    if is_root() {
        let _ = std::os::unix::fs::chown(dir.path(), Some(WORKER_UID), Some(WORKER_UID));
    }
    dir
}

/// A job for `code` with the given posture and default limits.
pub fn job(
    code: &str,
    fs: stsd_protocol::frames::FsAccess,
    base: &Path,
) -> stsd_protocol::frames::Job {
    use stsd_protocol::frames::{Job, JobLimits, NetworkGrant, SandboxSpec};
    Job {
        call_id: 1,
        code: code.to_string(),
        args_json: "{}".into(),
        statics_json: "{}".into(),
        declared: Vec::new(),
        tool_safety_json: "{}".into(),
        sandbox: SandboxSpec {
            fs,
            base_path: base.display().to_string(),
            uid: WORKER_UID,
            gid: WORKER_UID,
            network: NetworkGrant::Blocked,
        },
        seccomp: stsd_profiles::os::seccomp::bpf_for(fs).unwrap_or_default(),
        limits: JobLimits::default(),
        attack: None,
        keep_alive: false,
        compile_only: false,
        reuse_calls: 1,
        bytecode: None,
        withheld: Default::default(),
    }
}

/// The CPUs process `pid` ("self" for this one) may run on, from its Cpus_allowed_list.
pub fn cpus_allowed(pid: &str) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or("")
        .trim()
        .to_string();
    let mut out = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
            out.extend(a..=b);
        }
    }
    out
}

/// A job whose body spins for `ms` (no step limit), so that a test can look at its worker.
pub fn spinning_job(ms: u64, base: &Path) -> stsd_protocol::frames::Job {
    let mut j = job(
        &format!("const end = Date.now() + {ms}; while (Date.now() < end) {{}} return 1;"),
        stsd_protocol::frames::FsAccess::None,
        base,
    );
    j.limits.max_steps = u64::MAX;
    j
}

/// `stsd mcp --socket SOCKET` (the stdio bridge), with its stdin and stdout piped.
pub fn spawn_bridge(socket: &std::path::Path, extra: &[&str]) -> std::process::Child {
    use std::process::{Command, Stdio};
    Command::new(stsd_bin())
        .arg("mcp")
        .args(extra)
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The approval a Local Pass of a tool that needs one gets in these tests: given ahead, as
/// `stsd test --approve` gives it. The passes run in scratch copies and against fixtures.
pub static APPROVE: stsd::approval::terminal::Terminal = stsd::approval::terminal::Terminal {
    answer: Some(true),
    command: "stsd test",
};
