//! What a confined upstream may read: the system's shared trees, the few files under /etc
//! that the C library and TLS stacks read, a handful of devices, its own runtime's install
//! tree, the packages its arguments point into, and the paths the operator added.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Libraries, interpreters and their standard libraries (on a merged /usr, /bin, /lib...
/// are symlinks into /usr and collapse into it).
const SYSTEM_DIRS: &[&str] = &["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"];

/// What programs read from /etc: the loader's cache, TLS trust stores, time zone, name
/// service and MIME tables. Not passwd, shadow, group or any daemon's configuration.
const ETC: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ssl",
    "/etc/pki",
    "/etc/ca-certificates",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/mime.types",
    "/etc/protocols",
    "/etc/services",
];

/// Devices every runtime opens (/dev/null is also writable, see the Landlock rules).
pub const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"];

/// /proc, read-only. Node (libuv: CPU count, memory, uptime), Python (os, multiprocessing)
/// and the C library read it, and a narrower grant breaks them where it hurts: a rule on
/// /proc/self follows one pid's directory, so every child the upstream spawns (npx runs the
/// server as a child) would lose its own /proc/self. (Measured with only the upstream's own
/// /proc/<pid>: node's `os.cpus()` comes back empty, it reads /proc/stat and /proc/cpuinfo,
/// and a python child cannot open /proc/self/status.) What the whole of /proc exposes is
/// limited: in its own network namespace /proc/net shows nothing of the host's; environ,
/// maps, mem, fd and the like of other processes need ptrace access, which Landlock denies
/// outside the domain and seccomp denies outright; what is left is other processes' command
/// lines and status, the same that any local user sees.
pub const PROC: &str = "/proc";

/// Package managers put a package's dependencies beside it: the outermost of these on a
/// path is the root of everything the package may import.
const DEPENDENCY_DIRS: &[&str] = &["node_modules", "site-packages", "dist-packages"];

/// A directory holding one of these is a package (or project) root.
const PACKAGE_MARKERS: &[&str] = &[
    "package.json",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "deno.json",
];

/// The paths a program may read, each existing, absolute and canonical (what Landlock sees),
/// sorted, and none under another one of the list. `program` is the resolved program (see
/// [`super::resolve_program`]); `args` its arguments; `extra` the config's `read_paths`.
///
/// - The system trees, the /etc entries above, the devices and /proc.
/// - The program's install prefix: from both the path it was found at and its canonical
///   target, the directory holding its `bin/` (`/opt/node-22/bin/node` -> `/opt/node-22`,
///   `~/.venv/bin/python` -> `~/.venv`), or its own directory when it is not in a `bin/`.
///   A script's interpreter (its `#!` line, through `env`) is followed the same way.
/// - `/etc/<name>` when it is a directory named after the program or its interpreter and
///   that is a known runtime (Debian's `/etc/python3.11` holds the interpreter's
///   sitecustomize); never another program's configuration.
/// - For each argument that is an absolute path (or `--opt=/path`) to a file (a script, a
///   module; never a directory, which is data), its package root: if the path lies inside a `node_modules`, `site-packages` or `dist-packages`
///   directory, the outermost one (its dependencies are siblings there) or, for Python, the
///   virtual environment holding it (a parent with `pyvenv.cfg`); else the nearest parent
///   holding a package marker (package.json, pyproject.toml, setup.py, setup.cfg,
///   deno.json); else the path's own directory. A root that would be `/`, a top-level
///   directory or the home directory is narrowed to the path itself.
/// - `extra`, as given.
pub fn derive_read_paths(program: &Path, args: &[String], extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = SYSTEM_DIRS
        .iter()
        .chain(ETC)
        .chain(DEVICES)
        .map(PathBuf::from)
        .collect();
    for bin in program_and_interpreter(program) {
        for p in [bin.clone(), canonical(&bin).unwrap_or_else(|| bin.clone())] {
            out.push(install_prefix(&p));
            if let Some(name) = p.file_name().filter(|n| is_runtime(n)) {
                out.push(Path::new("/etc").join(name));
            }
        }
    }
    for a in args {
        for candidate in [Some(a.as_str()), a.split_once('=').map(|(_, v)| v)]
            .into_iter()
            .flatten()
        {
            // Files only: a directory argument is data the server is told to serve (the
            // filesystem server's allowed roots), and data is granted by `workspace` and
            // `read_paths`, never read off the command line.
            let p = Path::new(candidate);
            if p.is_absolute() && p.is_file() {
                out.push(package_root(p));
            }
        }
    }
    out.extend(extra.iter().cloned());
    let mut list: Vec<PathBuf> = out
        .iter()
        .filter_map(|p| canonical(p))
        .filter(|p| !is_etc_dir_of_no_interest(p))
        .collect();
    list.push(PathBuf::from(PROC));
    prune(list)
}

/// Interpreters whose distribution keeps part of their setup in `/etc/<name>/`.
const RUNTIMES: &[&str] = &["python", "node", "ruby", "perl", "php"];

fn is_runtime(name: &OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| RUNTIMES.iter().any(|r| n.starts_with(r)))
}

/// `/etc/<name>` is only wanted when it is a directory (`/etc/python3.11`); a file of that
/// name would be some other program's configuration.
fn is_etc_dir_of_no_interest(p: &Path) -> bool {
    p.parent() == Some(Path::new("/etc")) && !ETC.iter().any(|e| Path::new(e) == p) && !p.is_dir()
}

fn canonical(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}

/// Sorted, deduplicated, and without the paths another entry already covers.
fn prune(mut list: Vec<PathBuf>) -> Vec<PathBuf> {
    list.sort();
    list.dedup();
    let mut kept: Vec<PathBuf> = Vec::new();
    for p in list {
        // Sorted by components, so an ancestor comes before everything under it.
        if !kept.iter().any(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    kept
}

/// `/`, a top-level directory (`/tmp`, `/home`) or the home directory itself is too wide to
/// hand out as a package root.
fn too_wide(dir: &Path) -> bool {
    dir.components().count() <= 2
        || std::env::var_os("HOME").is_some_and(|h| Path::new(&h) == dir)
        || Path::new("/root") == dir
}

/// The program, and when it is a `#!` script, its interpreter (resolved on PATH when the
/// line goes through `env`).
fn program_and_interpreter(program: &Path) -> Vec<PathBuf> {
    let mut out = vec![program.to_path_buf()];
    if let Some(interp) = shebang(program) {
        out.push(interp);
    }
    out
}

fn shebang(script: &Path) -> Option<PathBuf> {
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?;
    let mut words = text.split_whitespace();
    let interp = PathBuf::from(words.next()?);
    if interp.file_name() != Some(OsStr::new("env")) {
        return Some(interp);
    }
    // `#!/usr/bin/env node`, `#!/usr/bin/env -S node --flag`.
    let name = words.find(|w| !w.starts_with('-'))?;
    super::resolve_program(name, std::env::var_os("PATH").as_deref()).ok()
}

/// The directory holding the binary's `bin/` (or `sbin/`); the binary's own directory when
/// it is not in one.
fn install_prefix(bin: &Path) -> PathBuf {
    let Some(dir) = bin.parent() else {
        return bin.to_path_buf();
    };
    let prefix = match dir.file_name().and_then(OsStr::to_str) {
        Some("bin" | "sbin") => dir.parent().unwrap_or(dir),
        _ => dir,
    };
    if too_wide(prefix) {
        bin.to_path_buf()
    } else {
        prefix.to_path_buf()
    }
}

/// See [`derive_read_paths`].
fn package_root(path: &Path) -> PathBuf {
    let start = if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(path)
    };
    let outermost_deps = start.ancestors().filter(|a| {
        a.file_name()
            .and_then(OsStr::to_str)
            .is_some_and(|n| DEPENDENCY_DIRS.contains(&n))
    });
    let root = if let Some(deps) = outermost_deps.last() {
        deps.ancestors()
            .skip(1)
            .find(|a| a.join("pyvenv.cfg").is_file())
            .unwrap_or(deps)
    } else {
        start
            .ancestors()
            .find(|a| PACKAGE_MARKERS.iter().any(|m| a.join(m).exists()))
            .unwrap_or(start)
    };
    if too_wide(root) {
        path.to_path_buf()
    } else {
        root.to_path_buf()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A fresh directory under /tmp, removed when dropped (no tempfile in this crate).
    struct TempDir(PathBuf);
    impl TempDir {
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tempdir() -> TempDir {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("stsd-paths-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    #[test]
    fn system_trees_collapse_and_secrets_stay_out() {
        let l = derive_read_paths(Path::new("/bin/sh"), &[], &[]);
        assert!(l.contains(&PathBuf::from("/usr")));
        assert!(l.contains(&PathBuf::from("/proc")));
        assert!(l.contains(&PathBuf::from("/dev/null")));
        assert!(!l.iter().any(|p| p == Path::new("/etc")));
        assert!(!l
            .iter()
            .any(|p| p.starts_with("/etc/passwd") || p.starts_with("/etc/shadow")));
        // Nothing listed twice, nothing under another entry.
        for (i, a) in l.iter().enumerate() {
            for b in &l[i + 1..] {
                assert!(
                    !b.starts_with(a),
                    "{} is under {}",
                    b.display(),
                    a.display()
                );
            }
        }
    }

    #[test]
    fn install_prefix_is_the_parent_of_bin() {
        let d = tempdir();
        let bin = d.path().join("opt/node-22/bin/node");
        touch(&bin);
        let l = derive_read_paths(&bin, &[], &[]);
        let want = std::fs::canonicalize(d.path().join("opt/node-22")).unwrap();
        assert!(l.contains(&want), "{l:?}");
    }

    #[test]
    fn shebang_interpreter_through_env_is_followed() {
        let d = tempdir();
        let script = d.path().join("app/bin/server");
        touch(&script);
        std::fs::write(&script, "#!/usr/bin/env -S sh -e\necho\n").unwrap();
        let l = derive_read_paths(&script, &[], &[]);
        assert!(l.contains(&std::fs::canonicalize(d.path().join("app")).unwrap()));
        assert!(l.contains(&PathBuf::from("/usr")));
    }

    #[test]
    fn argument_package_roots() {
        let d = tempdir();
        let base = std::fs::canonicalize(d.path()).unwrap();
        // A project with a marker: its root.
        touch(&base.join("proj/package.json"));
        touch(&base.join("proj/src/deep/index.js"));
        // Inside node_modules: the outermost node_modules.
        touch(&base.join("app/node_modules/@s/pkg/node_modules/dep/index.js"));
        touch(&base.join("app/node_modules/@s/pkg/package.json"));
        // Inside a venv's site-packages: the venv.
        touch(&base.join("venv/pyvenv.cfg"));
        touch(&base.join("venv/lib/python3.11/site-packages/srv/main.py"));
        // No marker: the file's directory.
        touch(&base.join("loose/dir/server.py"));
        let args = vec![
            base.join("proj/src/deep/index.js").display().to_string(),
            format!(
                "--entry={}",
                base.join("app/node_modules/@s/pkg/node_modules/dep/index.js")
                    .display()
            ),
            base.join("venv/lib/python3.11/site-packages/srv/main.py")
                .display()
                .to_string(),
            base.join("loose/dir/server.py").display().to_string(),
            "relative/path".into(),
            "/no/such/path".into(),
        ];
        let l = derive_read_paths(Path::new("/bin/sh"), &args, &[]);
        for want in ["proj", "app/node_modules", "venv", "loose/dir"] {
            assert!(l.contains(&base.join(want)), "{want} missing from {l:?}");
        }
        assert!(!l.iter().any(|p| p.starts_with("/no")));
    }

    #[test]
    fn wide_roots_narrow_to_the_path() {
        // A file directly in /tmp grants the file, not /tmp.
        let f = PathBuf::from(format!("/tmp/stsd-paths-{}.py", std::process::id()));
        std::fs::write(&f, b"").unwrap();
        let l = derive_read_paths(Path::new("/bin/sh"), &[f.display().to_string()], &[]);
        let _ = std::fs::remove_file(&f);
        assert!(l.contains(&f), "{l:?}");
        assert!(!l.contains(&PathBuf::from("/tmp")));
    }

    #[test]
    fn extra_paths_are_kept_and_missing_ones_dropped() {
        let d = tempdir();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let l = derive_read_paths(
            Path::new("/bin/sh"),
            &[],
            &[base.clone(), PathBuf::from("/does/not/exist")],
        );
        assert!(l.contains(&base));
        assert!(!l.iter().any(|p| p.starts_with("/does")));
    }
}
