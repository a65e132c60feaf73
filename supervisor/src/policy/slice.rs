//! The policies that can apply to one principal and one action, kept per (action, principal,
//! groups): Cedar evaluates every policy of a set, so a set cut down to those whose scope can
//! match keeps a decision's cost near the default policy's however many policies an operator
//! writes. A policy whose scope does not match is never satisfied and never errs, so leaving
//! it out changes no decision.

use cedar_policy::{ActionConstraint, EntityUid, Policy, PolicySet, PrincipalConstraint};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Slices kept at most (principals x actions); past it, all are dropped and made again.
const MAX_SLICES: usize = 4096;

type Key = (&'static str, String, Vec<String>);

pub struct Sliced {
    all: Vec<Policy>,
    cache: Mutex<HashMap<Key, Arc<PolicySet>>>,
}

impl Sliced {
    pub fn new(set: &PolicySet) -> Sliced {
        Sliced {
            all: set.policies().cloned().collect(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The policies whose scope can match `principal` (in `groups`) doing `action`.
    pub fn for_request(
        &self,
        action_name: &'static str,
        action: &EntityUid,
        principal: &EntityUid,
        groups: &[EntityUid],
    ) -> Result<Arc<PolicySet>, String> {
        let key: Key = (
            action_name,
            principal.to_string(),
            groups.iter().map(ToString::to_string).collect(),
        );
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = cache.get(&key) {
            return Ok(s.clone());
        }
        let relevant = self.all.iter().filter(|p| {
            let who = match p.principal_constraint() {
                PrincipalConstraint::Eq(e) => e == *principal,
                PrincipalConstraint::In(e) => e == *principal || groups.contains(&e),
                // Any, and the type tests: kept (conservative).
                _ => true,
            };
            let what = match p.action_constraint() {
                ActionConstraint::Any => true,
                ActionConstraint::Eq(a) => a == *action,
                ActionConstraint::In(list) => list.contains(action),
            };
            who && what
        });
        let set = Arc::new(
            PolicySet::from_policies(relevant.cloned()).map_err(|e| format!("a slice: {e}"))?,
        );
        if cache.len() >= MAX_SLICES {
            cache.clear();
        }
        cache.insert(key, set.clone());
        Ok(set)
    }
}
