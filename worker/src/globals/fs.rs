//! `safety.fs/v1` (reference-runtime.md §4), on the host side. Paths resolve against the base
//! path and are checked lexically, so `..`, absolute paths elsewhere and writes through
//! symlinks give a clean SECURITY error. The check is for the error message: Landlock already
//! confines the process to the base path, and a check skipped here still fails in the kernel.
//!
//! Landlock does not cover path metadata, so the worker's seccomp profile answers ENOSYS for
//! path stat; metadata here always comes from fstat on a file Landlock let us open.

use rquickjs::{Ctx, Function, Object};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

use super::helper_error as fail;
use stsd_protocol::fs_denial::{self, Need};

fn security(ctx: &Ctx<'_>, msg: impl AsRef<str>) -> rquickjs::Error {
    fail(ctx, "SECURITY", msg)
}

fn io_err(ctx: &Ctx<'_>, path: &str, need: Need, e: std::io::Error) -> rquickjs::Error {
    match e.kind() {
        // Landlock or the file system's permissions refused; which one, only the supervisor
        // can tell (it reads the message back: `stsd_protocol::fs_denial`).
        ErrorKind::PermissionDenied => security(ctx, fs_denial::message(path, need)),
        ErrorKind::NotFound => fail(
            ctx,
            "INVALID_INPUT",
            format!("no such file or directory: {path}"),
        ),
        _ => fail(ctx, "HELPER_RUNTIME", format!("{path}: {e}")),
    }
}

/// Size, mtime (epoch ms) and kind of an open file, from the fstat syscall itself: glibc's
/// fstat() goes through newfstatat, which this sandbox refuses because it also stats paths.
struct FdStat {
    size: u64,
    mtime_ms: f64,
    is_dir: bool,
}

fn fd_stat(f: &File) -> std::io::Result<FdStat> {
    use std::os::fd::AsRawFd;
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open for the call's duration and `st` is a valid out-pointer.
    let rc = unsafe { libc::syscall(libc::SYS_fstat, f.as_raw_fd(), &mut st as *mut libc::stat) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(FdStat {
        size: st.st_size as u64,
        mtime_ms: st.st_mtime as f64 * 1000.0 + (st.st_mtime_nsec / 1_000_000) as f64,
        is_dir: (st.st_mode & libc::S_IFMT) == libc::S_IFDIR,
    })
}

/// One directory entry: name, is a directory, is a symlink.
type DirEnt = (std::ffi::OsString, bool, bool);

/// Lists a directory with getdents64 on an O_DIRECTORY fd. glibc's opendir (and so std's
/// read_dir) calls fstat through newfstatat, which this sandbox refuses.
fn read_dir(path: &Path) -> std::io::Result<Vec<DirEnt>> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStringExt;
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)?;
    let mut buf = vec![0u8; 32 * 1024];
    let mut out = Vec::new();
    loop {
        // SAFETY: buf is valid for writes of buf.len() bytes; the fd is open.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                dir.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
        let mut off = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while off + 19 <= n as usize {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen == 0 || off + reclen > n as usize {
                break;
            }
            let dtype = buf[off + 18];
            let name_bytes = &buf[off + 19..off + reclen];
            let end = name_bytes
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(name_bytes.len());
            let name = &name_bytes[..end];
            if name != b"." && name != b".." {
                out.push((
                    std::ffi::OsString::from_vec(name.to_vec()),
                    dtype == libc::DT_DIR,
                    dtype == libc::DT_LNK,
                ));
            }
            off += reclen;
        }
    }
    out.sort();
    Ok(out)
}

/// Most lines the line-returning helpers hold at once (grep and lineCount stream instead).
const MAX_LINES: usize = 1_000_000;

/// Largest file the helpers read into memory. Reads happen in Rust, outside the engine's
/// heap limit, so they are capped here rather than left to the address-space rlimit.
const MAX_READ_BYTES: u64 = 64 * 1024 * 1024;

/// Reads a whole file, refusing one over [`MAX_READ_BYTES`] before allocating for it.
fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let f = File::open(path)?;
    let size = fd_stat(&f)?.size;
    if size > MAX_READ_BYTES {
        return Err(std::io::Error::other(format!(
            "file is {size} bytes, over the {MAX_READ_BYTES} byte limit of the fs helpers"
        )));
    }
    let mut buf = Vec::with_capacity(size as usize);
    // A file that grows while being read still stops at the cap.
    f.take(MAX_READ_BYTES + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_READ_BYTES {
        return Err(std::io::Error::other(
            "file grew past the fs helpers' read limit",
        ));
    }
    Ok(buf)
}

/// A write posture's budget for one call: bytes written and entries created. Checked before
/// each write, so a write that would go over does not happen at all.
pub struct WriteBudget {
    max_bytes: u64,
    max_files: u64,
    bytes: std::cell::Cell<u64>,
    files: std::cell::Cell<u64>,
}

impl WriteBudget {
    pub fn new(max_bytes: u64, max_files: u64) -> WriteBudget {
        WriteBudget {
            max_bytes,
            max_files,
            bytes: std::cell::Cell::new(0),
            files: std::cell::Cell::new(0),
        }
    }

    fn over(ctx: &Ctx<'_>, what: String) -> rquickjs::Error {
        fail(ctx, "OUTPUT_LIMIT", what)
    }

    fn bytes(&self, ctx: &Ctx<'_>, n: usize) -> rquickjs::Result<()> {
        let total = self.bytes.get().saturating_add(n as u64);
        if total > self.max_bytes {
            return Err(Self::over(
                ctx,
                format!(
                    "this call may write {} bytes in all ([baseline] max_write_bytes); {} more would make {total}",
                    self.max_bytes, n
                ),
            ));
        }
        self.bytes.set(total);
        Ok(())
    }

    fn file(&self, ctx: &Ctx<'_>) -> rquickjs::Result<()> {
        let total = self.files.get() + 1;
        if total > self.max_files {
            return Err(Self::over(
                ctx,
                format!(
                    "this call may create {} files and directories ([baseline] max_files)",
                    self.max_files
                ),
            ));
        }
        self.files.set(total);
        Ok(())
    }
}

pub struct Fs {
    base: PathBuf,
    budget: WriteBudget,
}

impl Fs {
    pub fn new(base: &str, budget: WriteBudget) -> Fs {
        Fs {
            base: PathBuf::from(base),
            budget,
        }
    }

    /// Lexical resolution against the base: relative paths join it, `.`/`..` are folded, and
    /// anything that ends up outside is refused.
    fn resolve(&self, ctx: &Ctx<'_>, p: &str) -> rquickjs::Result<PathBuf> {
        if p.trim().is_empty() {
            return Err(fail(ctx, "INVALID_INPUT", "path required"));
        }
        if p.contains('\0') {
            return Err(fail(ctx, "INVALID_INPUT", "path contains a NUL byte"));
        }
        let joined = if Path::new(p).is_absolute() {
            PathBuf::from(p)
        } else {
            self.base.join(p)
        };
        let mut out = PathBuf::new();
        for c in joined.components() {
            match c {
                Component::RootDir => out.push("/"),
                Component::CurDir => {}
                Component::ParentDir => {
                    out.pop();
                }
                Component::Normal(x) => out.push(x),
                Component::Prefix(_) => {
                    return Err(security(ctx, format!("path escapes base: {p}")))
                }
            }
        }
        if !out.starts_with(&self.base) {
            return Err(security(ctx, format!("path escapes base: {p}")));
        }
        Ok(out)
    }

    fn rel(&self, p: &Path) -> String {
        match p.strip_prefix(&self.base) {
            Ok(r) if r.as_os_str().is_empty() => ".".into(),
            Ok(r) => r.display().to_string(),
            Err(_) => p.display().to_string(),
        }
    }

    fn read_text(&self, ctx: &Ctx<'_>, p: &str) -> rquickjs::Result<String> {
        let path = self.resolve(ctx, p)?;
        let bytes = read_capped(&path).map_err(|e| io_err(ctx, p, Need::Read, e))?;
        String::from_utf8(bytes)
            .map_err(|_| fail(ctx, "HELPER_RUNTIME", format!("{p} is not UTF-8 text")))
    }

    fn lines(&self, ctx: &Ctx<'_>, p: &str) -> rquickjs::Result<Vec<String>> {
        Ok(self
            .read_text(ctx, p)?
            .lines()
            .map(str::to_string)
            .collect())
    }

    fn is_dir(path: &Path) -> Option<bool> {
        fd_stat(&File::open(path).ok()?).ok().map(|m| m.is_dir)
    }

    /// Recursive walk (no symlink following); `max_depth` 0 = unlimited. Sorted for
    /// deterministic output.
    fn walk(&self, dir: &Path, depth: usize, max_depth: usize, out: &mut Vec<(PathBuf, bool)>) {
        let Ok(entries) = read_dir(dir) else { return };
        for (name, is_dir, is_link) in entries {
            let p = dir.join(name);
            out.push((p.clone(), is_dir));
            if is_dir && !is_link && (max_depth == 0 || depth < max_depth) {
                self.walk(&p, depth + 1, max_depth, out);
            }
        }
    }

    /// mkdir -p for a path inside the base. std's create_dir_all stats paths, which this
    /// sandbox answers with ENOSYS; an existing component is fine here (EEXIST).
    fn mkdir_p(&self, ctx: &Ctx<'_>, dir: &Path) -> rquickjs::Result<()> {
        let mut cur = PathBuf::new();
        for c in dir.components() {
            cur.push(c);
            if !cur.starts_with(&self.base) || cur == self.base {
                continue;
            }
            match fs::create_dir(&cur) {
                // A new directory costs one entry of the budget.
                Ok(()) => {
                    if let Err(e) = self.budget.file(ctx) {
                        let _ = fs::remove_dir(&cur);
                        return Err(e);
                    }
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                // The component that failed (`rootdir/sub` of `rootdir/sub/new.txt`): the one
                // whose directory refused.
                Err(e) => return Err(io_err(ctx, &self.rel(&cur), Need::Entry, e)),
            }
        }
        Ok(())
    }

    /// Deletes a tree bottom-up from a directory listing (std's remove_dir_all stats paths).
    /// Returns the number of entries removed.
    fn remove_tree(&self, ctx: &Ctx<'_>, p: &str, root: &Path) -> rquickjs::Result<usize> {
        let mut all = Vec::new();
        self.walk(root, 1, 0, &mut all);
        let count = all.len();
        all.sort_by_key(|(path, _)| std::cmp::Reverse(path.components().count()));
        for (path, is_dir) in all {
            let r = if is_dir {
                fs::remove_dir(&path)
            } else {
                fs::remove_file(&path)
            };
            r.map_err(|e| io_err(ctx, &self.rel(&path), Need::Entry, e))?;
        }
        fs::remove_dir(root).map_err(|e| io_err(ctx, p, Need::Entry, e))?;
        Ok(count)
    }

    fn open_for_write(
        &self,
        ctx: &Ctx<'_>,
        p: &str,
        path: &Path,
        append: bool,
    ) -> rquickjs::Result<File> {
        if let Some(parent) = path.parent() {
            self.mkdir_p(ctx, parent)?;
        }
        // A new file costs one entry of the budget: try an exclusive create first.
        let fresh = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path);
        match fresh {
            Ok(f) => {
                if let Err(e) = self.budget.file(ctx) {
                    drop(f);
                    let _ = fs::remove_file(path);
                    return Err(e);
                }
                return Ok(f);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(security(
                    ctx,
                    format!("writes may not target a symbolic link: {p}"),
                ))
            }
            Err(e) => return Err(io_err(ctx, p, Need::Write, e)),
        }
        OpenOptions::new()
            .write(true)
            .create(true)
            .append(append)
            .truncate(!append)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    security(ctx, format!("writes may not target a symbolic link: {p}"))
                } else {
                    io_err(ctx, p, Need::Write, e)
                }
            })
    }
}

fn glob(ctx: &Ctx<'_>, pattern: &str) -> rquickjs::Result<globset::GlobMatcher> {
    globset::Glob::new(pattern)
        .map(|g| g.compile_matcher())
        .map_err(|e| fail(ctx, "INVALID_INPUT", format!("bad glob {pattern:?}: {e}")))
}

fn regex(ctx: &Ctx<'_>, pattern: &str, insensitive: bool) -> rquickjs::Result<regex::Regex> {
    regex::RegexBuilder::new(pattern)
        .case_insensitive(insensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            fail(
                ctx,
                "INVALID_INPUT",
                format!("bad pattern {pattern:?}: {e}"),
            )
        })
}

/// The host object for the prelude's fs installer. Options arrive already normalised.
pub fn host_object<'js>(
    ctx: &Ctx<'js>,
    base: &str,
    budget: WriteBudget,
) -> rquickjs::Result<Object<'js>> {
    let o = Object::new(ctx.clone())?;
    let fs = std::rc::Rc::new(Fs::new(base, budget));
    macro_rules! f {
        ($name:expr, $closure:expr) => {{
            let fs = fs.clone();
            #[allow(clippy::redundant_closure_call)]
            o.set($name, Function::new(ctx.clone(), $closure(fs))?)?;
        }};
    }
    f!("workspace", |fs: std::rc::Rc<Fs>| move || fs
        .base
        .display()
        .to_string());
    f!("readText", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>, p: String| fs.read_text(&ctx, &p)
    });
    f!("list", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                           p: String|
          -> rquickjs::Result<
        Vec<String>,
    > {
        let path = fs.resolve(&ctx, &p)?;
        match Fs::is_dir(&path) {
            None => Ok(Vec::new()),
            Some(false) => Err(fail(&ctx, "INVALID_INPUT", format!("not a directory: {p}"))),
            Some(true) => {
                let entries = read_dir(&path).map_err(|e| io_err(&ctx, &p, Need::Read, e))?;
                Ok(entries
                    .into_iter()
                    .map(|(n, _, _)| fs.rel(&path.join(n)))
                    .collect())
            }
        }
    });
    f!("exists", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                             p: String|
          -> bool {
        fs.resolve(&ctx, &p)
            .ok()
            .is_some_and(|path| File::open(path).is_ok())
    });
    f!("stat", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                           p: String|
          -> rquickjs::Result<
        Object<'js>,
    > {
        let path = fs.resolve(&ctx, &p)?;
        let m = File::open(&path)
            .and_then(|f| fd_stat(&f))
            .map_err(|e| io_err(&ctx, &p, Need::Read, e))?;
        let out = Object::new(ctx.clone())?;
        out.set("size", m.size as f64)?;
        out.set("mtime", m.mtime_ms)?;
        out.set("directory", m.is_dir)?;
        Ok(out)
    });
    f!("lines", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>, p: String| fs.lines(&ctx, &p)
    });
    // Counted without holding the lines.
    f!("lineCount", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<f64> {
            Ok(fs.read_text(&ctx, &p)?.lines().count() as f64)
        }
    });
    f!("grep", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                           pattern: String,
                                           p: String,
                                           ci: bool,
                                           limit: usize,
                                           numbered: bool|
          -> rquickjs::Result<
        Vec<String>,
    > {
        let re = regex(&ctx, &pattern, ci)?;
        // Streams over the text: only matching lines (up to `limit`) are kept.
        Ok(fs
            .read_text(&ctx, &p)?
            .lines()
            .enumerate()
            .filter(|(_, l)| re.is_match(l))
            .take(limit.min(MAX_LINES))
            .map(|(i, l)| {
                if numbered {
                    format!("{}:{l}", i + 1)
                } else {
                    l.to_string()
                }
            })
            .collect())
    });
    f!("find", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                           dir: String,
                                           pattern: String,
                                           max_depth: usize,
                                           kind: String|
          -> rquickjs::Result<
        Vec<String>,
    > {
        let root = fs.resolve(&ctx, &dir)?;
        let m = glob(&ctx, &pattern)?;
        let mut all = Vec::new();
        fs.walk(&root, 1, max_depth, &mut all);
        Ok(all
            .into_iter()
            .filter(|(_, is_dir)| match kind.as_str() {
                "file" => !is_dir,
                "dir" => *is_dir,
                _ => true,
            })
            .filter(|(p, _)| p.file_name().is_some_and(|n| m.is_match(n)))
            .map(|(p, _)| fs.rel(&p))
            .collect())
    });
    f!("searchInFiles", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>,
              dir: String,
              pattern_glob: String,
              pattern: String,
              ci: bool,
              max_depth: usize,
              limit: usize|
              -> rquickjs::Result<Vec<Object<'js>>> {
            let root = fs.resolve(&ctx, &dir)?;
            let m = glob(&ctx, &pattern_glob)?;
            let re = regex(&ctx, &pattern, ci)?;
            let mut all = Vec::new();
            fs.walk(&root, 1, max_depth, &mut all);
            let mut out = Vec::new();
            'files: for (p, is_dir) in all {
                if is_dir || !p.file_name().is_some_and(|n| m.is_match(n)) {
                    continue;
                }
                // Unreadable or non-UTF-8 files are skipped, as the reference does.
                let Ok(text) = read_capped(&p).map(String::from_utf8) else {
                    continue;
                };
                let Ok(text) = text else { continue };
                for (i, line) in text.lines().enumerate() {
                    if re.is_match(line) {
                        let hit = Object::new(ctx.clone())?;
                        hit.set("file", fs.rel(&p))?;
                        hit.set("line", (i + 1) as f64)?;
                        hit.set("text", line)?;
                        out.push(hit);
                        if out.len() >= limit {
                            break 'files;
                        }
                    }
                }
            }
            Ok(out)
        }
    });
    f!("writeText", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>, p: String, content: String, append: bool| -> rquickjs::Result<String> {
            let path = fs.resolve(&ctx, &p)?;
            fs.budget.bytes(&ctx, content.len())?;
            let mut f = fs.open_for_write(&ctx, &p, &path, append)?;
            f.write_all(content.as_bytes())
                .map_err(|e| io_err(&ctx, &p, Need::Write, e))?;
            Ok(path.display().to_string())
        }
    });
    f!("copy", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                           from: String,
                                           to: String|
          -> rquickjs::Result<
        String,
    > {
        let src = fs.resolve(&ctx, &from)?;
        let dst = fs.resolve(&ctx, &to)?;
        let bytes = read_capped(&src).map_err(|e| io_err(&ctx, &from, Need::Read, e))?;
        fs.budget.bytes(&ctx, bytes.len())?;
        let mut f = fs.open_for_write(&ctx, &to, &dst, false)?;
        f.write_all(&bytes)
            .map_err(|e| io_err(&ctx, &to, Need::Write, e))?;
        Ok(dst.display().to_string())
    });
    f!("move", |fs: std::rc::Rc<Fs>| move |ctx: Ctx<'js>,
                                           from: String,
                                           to: String|
          -> rquickjs::Result<
        String,
    > {
        let src = fs.resolve(&ctx, &from)?;
        let dst = fs.resolve(&ctx, &to)?;
        if let Some(parent) = dst.parent() {
            fs.mkdir_p(&ctx, parent)?;
        }
        fs::rename(&src, &dst).map_err(|e| io_err(&ctx, &from, Need::Entry, e))?;
        Ok(dst.display().to_string())
    });
    f!("delete", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<bool> {
            let path = fs.resolve(&ctx, &p)?;
            match Fs::is_dir(&path) {
                Some(true) => Err(fail(
                    &ctx,
                    "INVALID_INPUT",
                    format!("is a directory (use deleteDir): {p}"),
                )),
                _ => match fs::remove_file(&path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(io_err(&ctx, &p, Need::Entry, e)),
                },
            }
        }
    });
    f!("deleteDir", |fs: std::rc::Rc<Fs>| {
        move |ctx: Ctx<'js>, p: String| -> rquickjs::Result<f64> {
            let path = fs.resolve(&ctx, &p)?;
            if path == fs.base {
                return Err(security(&ctx, "the workspace root cannot be deleted"));
            }
            match Fs::is_dir(&path) {
                Some(true) => {}
                Some(false) => {
                    return Err(fail(
                        &ctx,
                        "INVALID_INPUT",
                        format!("not a directory (use deleteFile): {p}"),
                    ))
                }
                None => {
                    return Err(fail(
                        &ctx,
                        "INVALID_INPUT",
                        format!("no such directory: {p}"),
                    ))
                }
            }
            Ok(fs.remove_tree(&ctx, &p, &path)? as f64)
        }
    });
    Ok(o)
}
