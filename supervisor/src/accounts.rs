//! User, group and host lookups in a static executable (see `.cargo/config.toml`).
//!
//! glibc's NSS has two sources built in, `files` and `dns`. Any other source that
//! `/etc/nsswitch.conf` names (`systemd`, `mdns4_minimal`, `resolve`, `sss`, `ldap`) is a
//! module it `dlopen`s, and a static executable that does so with threads running loads a
//! second libc beside its own: looking up a uid that /etc/passwd does not hold crashed the
//! process (SIGSEGV in `nss_systemd`, found by the policy's tests). So [`builtin_sources`]
//! pins every database to the built-in sources before any lookup, and what `files` does not
//! answer is asked of `getent(1)`, the system's own dynamically linked NSS client, in a child
//! process: a user or group from LDAP or systemd is still found (and a uid an LDAP user holds
//! is still seen as taken). Hosts are `files dns` (`/etc/hosts`, then the servers in
//! `/etc/resolv.conf`).
//!
//! In a dynamically linked build nothing is pinned and every lookup is NSS's own.

use nix::unistd::{Gid, Group, Uid, User};
use std::process::{Command, Stdio};

/// Pins NSS to its built-in sources (static builds; once, and before the first lookup:
/// `main` calls it before any thread exists, and every lookup here calls it again).
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
    let f = getent_fields("passwd", &uid.to_string())?;
    Some(Account {
        name: f.first()?.clone(),
        uid,
        gid: f.get(3)?.parse().ok()?,
    })
}

/// The group named `name`, if the system knows one.
pub fn group_by_name(name: &str) -> Option<GroupEntry> {
    builtin_sources();
    match Group::from_name(name) {
        Ok(Some(g)) => Some(entry(g)),
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

/// Every gid `user` is in: its primary group and each group that lists it. A user of
/// /etc/passwd gets the groups of /etc/group (no child process on the call path); one
/// only another source knows, the groups the system's NSS gives it (`getent initgroups`).
pub fn group_ids(user: &Account) -> Vec<u32> {
    builtin_sources();
    let mut ids = vec![user.gid];
    let local = matches!(User::from_name(&user.name), Ok(Some(_)));
    if local {
        let listed = std::ffi::CString::new(user.name.clone())
            .ok()
            .and_then(|n| nix::unistd::getgrouplist(&n, Gid::from_raw(user.gid)).ok())
            .unwrap_or_default();
        ids.extend(listed.into_iter().map(Gid::as_raw));
    } else if let Some(line) = getent_line("initgroups", &user.name) {
        ids.extend(
            line.split_whitespace()
                .skip(1)
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
    let f = getent_fields("group", key)?;
    Some(GroupEntry {
        name: f.first()?.clone(),
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

/// `getent DB KEY`'s first line split at `:`, in a static build only (a dynamic one has
/// asked NSS already); None when it is not found or getent cannot be run.
fn getent_fields(db: &str, key: &str) -> Option<Vec<String>> {
    let line = getent_line(db, key)?;
    Some(line.split(':').map(str::to_string).collect())
}

fn getent_line(db: &str, key: &str) -> Option<String> {
    if !cfg!(target_feature = "crt-static") || key.is_empty() || key.starts_with('-') {
        return None;
    }
    let out = Command::new("getent")
        .args([db, key])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    text.lines().next().map(str::to_string)
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
        assert_eq!(user_by_uid(3_999_999_001), None);
        assert_eq!(group_by_gid(3_999_999_001), None);
        assert_eq!(group_by_name("stsd-no-such-group"), None);
    }
}
