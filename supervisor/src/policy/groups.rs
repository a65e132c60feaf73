//! Who is in which group, for the policy: the synthetic `stsd:admins` and `stsd:operators`
//! (from the four lists of the config, so configs written before the policy engine keep
//! their meaning), the operator's `[policy.groups]`, and a uid's Unix groups (`unix:NAME`).

use std::collections::BTreeMap;
use stsd_profiles::Config;

/// The group whose members are admins when `[daemon] admin_uids` is not set (the .deb makes
/// it).
pub const ADMIN_GROUP: &str = "stsd-admin";

/// Who may use the admin channel on the socket. Root only by default, plus members of
/// [`ADMIN_GROUP`] when it exists; never the daemon's own uid unless listed. A per-user
/// daemon runs as the same uid as the agent host that calls its tools: were that uid an
/// admin, the agent could publish a copy of a gated tool without its gate.
#[derive(Debug, Clone)]
pub enum AdminSet {
    /// `[daemon] admin_uids` as written: exactly these uids.
    Listed(Vec<u32>),
    /// Not set: root and the admin group's members (looked up at each check, so a change of
    /// the group applies without a restart).
    Default,
}

impl AdminSet {
    pub fn from_config(admin_uids: &[u32]) -> AdminSet {
        match admin_uids.is_empty() {
            true => AdminSet::Default,
            false => AdminSet::Listed(admin_uids.to_vec()),
        }
    }

    pub fn contains(&self, uid: u32) -> bool {
        match self {
            AdminSet::Listed(l) => l.contains(&uid),
            AdminSet::Default => uid == 0 || in_admin_group(uid),
        }
    }
}

/// Whether `uid` is a member of [`ADMIN_GROUP`] (as its primary group or listed in it).
fn in_admin_group(uid: u32) -> bool {
    let Some(group) = crate::accounts::group_by_name(ADMIN_GROUP) else {
        return false;
    };
    let Some(user) = crate::accounts::user_by_uid(uid) else {
        return false;
    };
    user.gid == group.gid || group.members.contains(&user.name)
}

/// The group of the configured admins.
pub const ADMINS: &str = "stsd:admins";
/// The group of the configured approvers.
pub const OPERATORS: &str = "stsd:operators";

/// The config's lists, as groups.
#[derive(Debug, Clone)]
pub struct Groups {
    admin_uids: AdminSet,
    admin_principals: Vec<String>,
    operator_uids: Vec<u32>,
    approver_principals: Vec<String>,
    named: BTreeMap<String, Vec<String>>,
}

impl Groups {
    pub fn of_config(c: &Config) -> Groups {
        Groups {
            admin_uids: AdminSet::from_config(&c.daemon.admin_uids),
            admin_principals: c.http.admin_principals.clone(),
            operator_uids: c.approval.operator_uids.clone(),
            approver_principals: c.http.approver_principals.clone(),
            named: c.policy.groups.clone(),
        }
    }

    /// Every group `who` is in.
    pub fn of(&self, who: &super::entities::Who) -> Vec<String> {
        let mut out = Vec::new();
        let (uid, http) = match who.uid {
            Some(u) => (Some(u), None),
            None => (None, Some(who.id.as_str())),
        };
        let admin = uid.is_some_and(|u| self.admin_uids.contains(u))
            || http.is_some_and(|n| self.admin_principals.iter().any(|p| p == n));
        if admin {
            out.push(ADMINS.to_string());
        }
        let operator = uid.is_some_and(|u| self.operator_uids.contains(&u))
            || http.is_some_and(|n| self.approver_principals.iter().any(|p| p == n));
        if operator {
            out.push(OPERATORS.to_string());
        }
        for (group, members) in &self.named {
            if members.contains(&who.id) {
                out.push(group.clone());
            }
        }
        out.extend(who.credential_groups.iter().cloned());
        if let Some(u) = uid {
            out.extend(
                unix_groups_cached(u)
                    .into_iter()
                    .map(|g| format!("unix:{g}")),
            );
        }
        out
    }
}

/// How long a uid's Unix groups are kept: a lookup reads the group database (files, or a
/// directory service), too slow for every call; a change of group applies within this.
const UNIX_GROUPS_TTL: std::time::Duration = std::time::Duration::from_secs(10);

type UnixCache =
    std::sync::Mutex<std::collections::HashMap<u32, (std::time::Instant, Vec<String>)>>;

fn unix_groups_cached(uid: u32) -> Vec<String> {
    static CACHE: std::sync::OnceLock<UnixCache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((at, g)) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&uid) {
        if at.elapsed() < UNIX_GROUPS_TTL {
            return g.clone();
        }
    }
    let g = unix_groups(uid);
    let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
    if c.len() > 4096 {
        c.clear();
    }
    c.insert(uid, (std::time::Instant::now(), g.clone()));
    g
}

/// The Unix groups of `uid` (its primary group and those listing it), by name.
fn unix_groups(uid: u32) -> Vec<String> {
    let Some(user) = crate::accounts::user_by_uid(uid) else {
        return Vec::new();
    };
    crate::accounts::group_ids(&user)
        .into_iter()
        .filter_map(|g| crate::accounts::group_by_gid(g).map(|g| g.name))
        .collect()
}
