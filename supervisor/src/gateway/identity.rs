//! Which uid each stdio upstream runs as when stsd runs as root: one of its own from
//! `[gateway] upstream_uid_first..+upstream_uid_count` (gid = uid), as systemd's
//! DynamicUser does, so the kernel keeps upstreams apart (signals, ptrace, /proc,
//! RLIMIT_NPROC, file ownership) instead of all sharing 65534 with the workers.
//!
//! The choice is stable: an upstream's id hashes to a slot and probes from there, skipping
//! uids or gids some user, group or systemd dynamic user holds, the worker user, and the
//! slots earlier upstreams (in id order) took; so a restart, or another upstream added,
//! leaves the others where they were unless they collided.

use std::collections::{BTreeMap, BTreeSet};

/// FNV-1a: stable across builds and platforms (std's hasher is not).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether a uid/gid is already someone's: a user or group the system resolves, or a
/// systemd dynamic user's lock file.
pub fn held_by_system(id: u32) -> bool {
    crate::accounts::id_held(id)
        || std::path::Path::new(&format!("/run/systemd/dynamic-uid/{id}")).exists()
}

/// uid per upstream id. `held`: whether an id is taken outside stsd (see
/// [`held_by_system`]); `avoid`: ids never to use (the worker user's). An upstream that
/// finds no free slot is absent from the map (it then does not start: sharing a uid would
/// undo the point).
pub fn assign(
    ids: &[&str],
    first: u32,
    count: u32,
    avoid: &[u32],
    held: impl Fn(u32) -> bool,
) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    if count == 0 {
        return out;
    }
    let sorted: BTreeSet<&str> = ids.iter().copied().collect();
    let mut taken: BTreeSet<u32> = avoid.iter().copied().collect();
    for id in sorted {
        let start = fnv1a(id) % u64::from(count);
        let found = (0..u64::from(count))
            .map(|i| (start + i) % u64::from(count))
            .filter_map(|slot| first.checked_add(slot as u32))
            .find(|uid| *uid != 0 && !taken.contains(uid) && !held(*uid));
        if let Some(uid) = found {
            taken.insert(uid);
            out.insert(id.to_string(), uid);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_upstream_gets_its_own_stable_uid_in_the_range() {
        let a = assign(&["fs", "time", "git"], 61184, 4336, &[65534], |_| false);
        assert_eq!(a.len(), 3);
        let uids: BTreeSet<u32> = a.values().copied().collect();
        assert_eq!(uids.len(), 3, "{a:?}");
        assert!(uids.iter().all(|u| (61184..61184 + 4336).contains(u)));
        // Stable: the same set in another order, or with one more, keeps them.
        let b = assign(&["git", "time", "fs", "new"], 61184, 4336, &[65534], |_| {
            false
        });
        for (k, v) in &a {
            assert_eq!(b[k], *v);
        }
    }

    #[test]
    fn held_and_avoided_ids_are_skipped_and_a_full_range_leaves_one_out() {
        let a = assign(&["a", "b"], 100, 3, &[101], |u| u == 100);
        let uids: BTreeSet<u32> = a.values().copied().collect();
        assert_eq!(a.len(), 1, "{a:?}");
        assert_eq!(uids, BTreeSet::from([102]));
        assert!(assign(&["a"], 100, 0, &[], |_| false).is_empty());
        // uid 0 is never handed out.
        assert_eq!(assign(&["a"], 0, 1, &[], |_| false).len(), 0);
    }

    #[test]
    fn this_hosts_root_and_nobody_are_held() {
        assert!(held_by_system(0));
        assert!(held_by_system(65534));
    }
}
