//! User, group and host lookups in a static executable (see `.cargo/config.toml`).
//!
//! glibc's NSS has two sources built in, `files` and `dns`. Any other source that
//! `/etc/nsswitch.conf` names (`systemd`, `mdns4_minimal`, `resolve`, `sss`, `ldap`) is a
//! module it `dlopen`s, and a static executable that does so with threads running loads a
//! second libc beside its own: looking up a uid that /etc/passwd does not hold crashed the
//! process (SIGSEGV in `nss_systemd`, found by the policy's tests). So [`builtin_sources`]
//! pins every database to the built-in sources before any lookup. Where nsswitch.conf names
//! other sources for users or groups, what they would add is asked of `getent(1)`, the
//! system's own dynamically linked NSS client, in a child process (`/usr/bin/getent`, an
//! empty environment, killed after [`GETENT_TIMEOUT`]), and each answer is kept for
//! [`GETENT_TTL`], found or not: a user or group from LDAP or systemd is still found, a
//! uid one holds is still seen as taken, and a caller's groups from those sources still
//! count for the policy. Hosts are `files dns` (`/etc/hosts`, then the servers of
//! `/etc/resolv.conf`).
//!
//! In a dynamically linked build nothing is pinned and every lookup is NSS's own.

use nix::unistd::{Gid, Group, Uid, User};
use std::collections::{BTreeSet, HashMap};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an answer of getent is kept, found or not (as the policy keeps a uid's groups).
pub const GETENT_TTL: Duration = Duration::from_secs(10);
/// How long getent may take before it is killed and its answer is "unknown".
pub const GETENT_TIMEOUT: Duration = Duration::from_secs(3);

/// Pins NSS to its built-in sources (static builds; once, and before the first lookup: a
/// constructor calls it before `main` (`PIN_BEFORE_MAIN`), `main` again, and every lookup
/// here again, in case a linker left the constructor out of an executable).
pub fn builtin_sources() {
    #[cfg(target_feature = "crt-static")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            extern "C" {
                // glibc's: replaces a database's nsswitch.conf line and stops its reload.
                fn __nss_configure_lookup(
                    db: *const libc::c_char,
                    service_line: *const libc::c_char,
                ) -> libc::c_int;
            }
            for (db, line) in [
                (c"passwd", c"files"),
                (c"group", c"files"),
                (c"initgroups", c"files"),
                (c"shadow", c"files"),
                (c"gshadow", c"files"),
                (c"hosts", c"files dns"),
                (c"networks", c"files"),
                (c"services", c"files"),
                (c"protocols", c"files"),
                (c"netgroup", c"files"),
                (c"aliases", c"files"),
                (c"ethers", c"files"),
                (c"rpc", c"files"),
                (c"publickey", c"files"),
            ] {
                // SAFETY: two NUL-terminated strings that outlive the call.
                unsafe { __nss_configure_lookup(db.as_ptr(), line.as_ptr()) };
            }
        });
    }
}

/// [`builtin_sources`] before `main`, in every executable that links this library (the
/// daemon and its commands, and the test binaries): a lookup a dependency makes on its own
/// (`getpwuid` for a home directory, say), from a thread and before anything here ran, would
/// otherwise load the modules nsswitch.conf names into a static executable. glibc has run its
/// own initialisation by the time `.init_array` runs, and passes each entry `argc`, `argv` and
/// `envp`; `Once` needs nothing of Rust's. Not in the binary's child roles (`worker`,
/// `zygote`, `upstream-exec`, dispatched first in `main`): they make no lookup, and touch
/// nothing (here: `/etc/nsswitch.conf`) before their sandbox or their exec.
#[cfg(target_feature = "crt-static")]
#[used]
#[link_section = ".init_array"]
static PIN_BEFORE_MAIN: extern "C" fn(
    libc::c_int,
    *const *const libc::c_char,
    *const *const libc::c_char,
) = {
    extern "C" fn pin(
        argc: libc::c_int,
        argv: *const *const libc::c_char,
        _envp: *const *const libc::c_char,
    ) {
        if argc >= 2 && !argv.is_null() {
            // SAFETY: glibc passes main's argv: argc valid pointers to NUL-terminated strings.
            let role = unsafe { std::ffi::CStr::from_ptr(*argv.add(1)) };
            if CHILD_ROLES.contains(&role.to_bytes()) {
                return;
            }
        }
        builtin_sources();
    }
    pin
};

/// The first arguments `main` dispatches before anything else (see `child_role` there).
#[cfg(target_feature = "crt-static")]
const CHILD_ROLES: [&[u8]; 3] = [b"worker", b"zygote", b"upstream-exec"];

/// A user: name and primary group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// A group: name, gid and the users it lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// What getent said about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// Its first line.
    Found(String),
    /// Exit status 2: no source holds the key (or getent is not asked: no other source).
    Absent,
    /// It could not be run, timed out or failed otherwise.
    Unknown,
}

/// The user `uid`, if the system knows one.
pub fn user_by_uid(uid: u32) -> Option<Account> {
    builtin_sources();
    if let Ok(Some(u)) = User::from_uid(Uid::from_raw(uid)) {
        return Some(Account {
            name: u.name,
            uid,
            gid: u.gid.as_raw(),
        });
    }
    let Answer::Found(line) = getent("passwd", &uid.to_string()) else {
        return None;
    };
    let f: Vec<&str> = line.split(':').collect();
    Some(Account {
        name: f.first()?.to_string(),
        uid,
        gid: f.get(3)?.parse().ok()?,
    })
}

/// The group named `name`, if the system knows one.
pub fn group_by_name(name: &str) -> Option<GroupEntry> {
    builtin_sources();
    match Group::from_name(name) {
        Ok(Some(g)) => Some(entry(g)),
        // getent reads a key of digits as a gid: a name never is one.
        _ if name.bytes().all(|b| b.is_ascii_digit()) => None,
        _ => group_from_getent(name),
    }
}

/// The group `gid`, if the system knows one.
pub fn group_by_gid(gid: u32) -> Option<GroupEntry> {
    builtin_sources();
    match Group::from_gid(Gid::from_raw(gid)) {
        Ok(Some(g)) => Some(entry(g)),
        _ => group_from_getent(&gid.to_string()),
    }
}

/// Whether `id` is some user's uid or some group's gid. A source that cannot be asked counts
/// as holding it (a uid is given out only when nothing could hold it).
pub fn id_held(id: u32) -> bool {
    builtin_sources();
    if matches!(User::from_uid(Uid::from_raw(id)), Ok(Some(_)))
        || matches!(Group::from_gid(Gid::from_raw(id)), Ok(Some(_)))
    {
        return true;
    }
    let key = id.to_string();
    getent("passwd", &key) != Answer::Absent || getent("group", &key) != Answer::Absent
}

/// Every gid `user` is in: its primary group, each group of /etc/group that lists it, and
/// the groups other sources give it (`getent initgroups`, when nsswitch.conf names any).
pub fn group_ids(user: &Account) -> Vec<u32> {
    builtin_sources();
    let mut ids = vec![user.gid];
    if let Ok(name) = std::ffi::CString::new(user.name.clone()) {
        let listed = nix::unistd::getgrouplist(&name, Gid::from_raw(user.gid)).unwrap_or_default();
        ids.extend(listed.into_iter().map(Gid::as_raw));
    }
    if let Answer::Found(line) = getent("initgroups", &user.name) {
        // "NAME<padding> gid gid ...": the gids follow the name.
        let gids = line.strip_prefix(user.name.as_str()).unwrap_or("");
        ids.extend(
            gids.split_whitespace()
                .filter_map(|g| g.parse::<u32>().ok()),
        );
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

fn entry(g: Group) -> GroupEntry {
    GroupEntry {
        name: g.name,
        gid: g.gid.as_raw(),
        members: g.mem,
    }
}

fn group_from_getent(key: &str) -> Option<GroupEntry> {
    let Answer::Found(line) = getent("group", key) else {
        return None;
    };
    let f: Vec<&str> = line.split(':').collect();
    Some(GroupEntry {
        name: f.first()?.to_string(),
        gid: f.get(2)?.parse().ok()?,
        members: f
            .get(3)
            .map(|m| {
                m.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default(),
    })
}

/// The databases for which /etc/nsswitch.conf names a source other than `files` and `dns`
/// (`initgroups` follows `group` when it has no line of its own, as in glibc).
fn databases_with_other_sources() -> &'static BTreeSet<String> {
    static OTHER: OnceLock<BTreeSet<String>> = OnceLock::new();
    OTHER.get_or_init(|| {
        other_sources(&std::fs::read_to_string("/etc/nsswitch.conf").unwrap_or_default())
    })
}

/// [`databases_with_other_sources`] of an nsswitch.conf's text.
fn other_sources(text: &str) -> BTreeSet<String> {
    let mut lines = HashMap::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        if let Some((db, sources)) = line.split_once(':') {
            lines.insert(db.trim().to_string(), sources.to_string());
        }
    }
    let other = |sources: &str| {
        sources
            .split_whitespace()
            .filter(|w| !w.starts_with('['))
            .any(|s| s != "files" && s != "dns")
    };
    let mut out: BTreeSet<String> = lines
        .iter()
        .filter(|(_, s)| other(s))
        .map(|(db, _)| db.clone())
        .collect();
    if !lines.contains_key("initgroups") && out.contains("group") {
        out.insert("initgroups".into());
    }
    out
}

/// getent's answer for `db` `key`, kept for [`GETENT_TTL`]. Asked only in a static build and
/// only when nsswitch.conf names another source for `db`: otherwise `files` has answered.
fn getent(db: &str, key: &str) -> Answer {
    if !cfg!(target_feature = "crt-static")
        || key.is_empty()
        || !databases_with_other_sources().contains(db)
    {
        return Answer::Absent;
    }
    type Kept = HashMap<(String, String), (Instant, Answer)>;
    static KEPT: OnceLock<Mutex<Kept>> = OnceLock::new();
    let kept = KEPT.get_or_init(|| Mutex::new(HashMap::new()));
    let k = (db.to_string(), key.to_string());
    if let Some((at, a)) = kept.lock().unwrap_or_else(|e| e.into_inner()).get(&k) {
        if at.elapsed() < GETENT_TTL {
            return a.clone();
        }
    }
    let a = run_getent(db, key);
    let mut m = kept.lock().unwrap_or_else(|e| e.into_inner());
    if m.len() >= 4096 {
        m.clear();
    }
    m.insert(k, (Instant::now(), a.clone()));
    a
}

fn run_getent(db: &str, key: &str) -> Answer {
    let Some(bin) = ["/usr/bin/getent", "/bin/getent"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
    else {
        return Answer::Unknown;
    };
    let child = Command::new(bin)
        .args(["--", db, key])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        return Answer::Unknown;
    };
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::Builder::new()
        .name("stsd-getent".into())
        .spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
    if waiter.is_err() {
        return Answer::Unknown; // the child is killed and reaped as `child` drops
    }
    match rx.recv_timeout(GETENT_TIMEOUT) {
        Ok(Ok(out)) => match out.status.code() {
            Some(0) => match String::from_utf8(out.stdout) {
                Ok(text) => text
                    .lines()
                    .next()
                    .map_or(Answer::Absent, |l| Answer::Found(l.to_string())),
                Err(_) => Answer::Unknown,
            },
            Some(2) => Answer::Absent,
            _ => Answer::Unknown,
        },
        Ok(Err(_)) => Answer::Unknown,
        Err(_) => {
            // Not reaped until the waiter's wait returns, so the pid is still this child's.
            // SAFETY: kill(2) on our own unreaped child.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            Answer::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Root is found with its group; a uid no source holds is None, without a crash (in a
    /// static build it goes through files, then getent: NSS loads no module in-process).
    #[test]
    fn root_is_found_and_an_unheld_uid_is_none() {
        let root = user_by_uid(0).expect("root");
        assert_eq!((root.name.as_str(), root.gid), ("root", 0));
        assert!(group_ids(&root).contains(&0));
        assert_eq!(group_by_gid(0).map(|g| g.name), Some("root".to_string()));
        assert_eq!(group_by_name("root").map(|g| g.gid), Some(0));
        assert!(id_held(0));
        assert_eq!(user_by_uid(3_999_999_001), None);
        assert_eq!(group_by_gid(3_999_999_001), None);
        assert!(!id_held(3_999_999_001));
        assert_eq!(group_by_name("stsd-no-such-group"), None);
        assert_eq!(group_by_name("0"), None);
    }

    /// A lookup that does not go through this module, made from a thread as the first thing a
    /// fresh process does, for a uid /etc/passwd does not hold, loads no NSS module (in a
    /// static build it crashed the process in `nss_systemd` where nsswitch.conf names it).
    /// Run in a process of its own, so that no other test has pinned NSS first.
    #[cfg(target_feature = "crt-static")]
    #[test]
    fn a_first_lookup_from_a_thread_loads_no_nss_module() {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "accounts::tests::lookup_in_a_fresh_process",
                "--include-ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("STSD_FRESH_LOOKUP", "1")
            .output()
            .expect("run the test binary");
        let said = String::from_utf8_lossy(&out.stdout);
        // Where nsswitch.conf names no module, this passes without the constructor too.
        let names_a_module = std::fs::read_to_string("/etc/nsswitch.conf")
            .is_ok_and(|t| !other_sources(&t).is_empty());
        if !names_a_module {
            eprintln!("nsswitch.conf names no NSS module here: nothing could have been loaded");
        }
        assert!(
            out.status.success() && said.contains("fresh lookup: no module"),
            "{:?}\n{said}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The child of the test above (ignored on its own).
    #[cfg(target_feature = "crt-static")]
    #[test]
    #[ignore]
    fn lookup_in_a_fresh_process() {
        if std::env::var_os("STSD_FRESH_LOOKUP").is_none() {
            return;
        }
        // SAFETY: getpwuid's result is only compared with null, on the thread that made it.
        let found = std::thread::spawn(|| !unsafe { libc::getpwuid(3_999_999_002) }.is_null())
            .join()
            .expect("the lookup's thread");
        assert!(!found);
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        assert!(
            !maps.contains("libnss_"),
            "an NSS module was loaded:\n{maps}"
        );
        println!("fresh lookup: no module");
    }

    /// Which databases getent is asked for: those naming a source glibc does not build in;
    /// actions in brackets are not sources; `initgroups` follows `group` unless it has a line.
    #[test]
    fn getent_is_asked_only_where_nsswitch_names_another_source() {
        let debian = "passwd: files systemd\ngroup: files systemd\nshadow: files\n\
                      hosts: files mdns4_minimal [NOTFOUND=return] dns myhostname\n";
        let got: Vec<String> = other_sources(debian).into_iter().collect();
        assert_eq!(got, ["group", "hosts", "initgroups", "passwd"]);
        let plain =
            "# a container\npasswd: files\ngroup: files [SUCCESS=merge]\nhosts: files dns\n";
        assert!(other_sources(plain).is_empty());
        let own = "group: files sss\ninitgroups: files\n";
        let got: Vec<String> = other_sources(own).into_iter().collect();
        assert_eq!(got, ["group"]);
    }
}
