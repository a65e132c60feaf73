//! Who may do what, decided by Cedar (`cedar-policy`, the engine ToolHive chose: policies as
//! data, validated against a schema, with the policies behind each decision named).
//!
//! [`Policy::from_config`] is the one entry point: the default policy made from the config's
//! four lists (`default.rs`), then `[policy] files`, every policy validated against
//! `schema.cedarschema`. [`Policy::decide`] answers one question: may this principal
//! ([`Who`]) do this ([`Action`]) to this tool ([`ToolAttrs`]) or to the daemon. The call
//! pipeline asks `call` before anything else of a call; `tools/list` shows a caller only what
//! it may `list`; the admin channel asks `admin`, `read_audit` and `approve`.

mod default;
mod entities;
pub mod groups;
mod load;
pub mod report;
mod slice;

pub use entities::{Action, ToolAttrs, Who};
pub use groups::{AdminSet, ADMIN_GROUP};

use cedar_policy::{Authorizer, Context, Decision as CedarDecision, Request, Schema};
use stsd_profiles::Config;

/// A decision, with the policies that made it (a permit's, or the forbid that overrode it;
/// none when nothing permitted) and any policy that failed to evaluate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub policies: Vec<String>,
    pub errors: Vec<String>,
}

/// The policy in force (swapped whole on a reload).
pub struct Policy {
    /// Every policy in force, cut per principal and action.
    sliced: slice::Sliced,
    schema: Schema,
    authorizer: Authorizer,
    groups: groups::Groups,
    /// Where each policy came from, by id: "the default policy" or a file.
    origin: std::collections::BTreeMap<String, String>,
    /// Decisions made, by everything a decision reads (see [`Policy::decide`]).
    decided: std::sync::Mutex<std::collections::HashMap<DecisionKey, Decision>>,
}

/// Everything a decision reads besides the policies (the request's context is empty).
#[derive(PartialEq, Eq, Hash)]
struct DecisionKey {
    who: Who,
    groups: Vec<String>,
    action: Action,
    tool: Option<ToolAttrs>,
}

/// Decisions kept per policy; past it the cache starts over.
const DECISIONS_KEPT: usize = 4096;

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("policies", &self.origin.len())
            .finish()
    }
}

/// The schema policies are validated against.
pub const SCHEMA: &str = include_str!("schema.cedarschema");

impl Policy {
    /// The config's policy: the default one (unless `[policy] defaults = false`) and the
    /// files, each parsed and validated; every problem is returned, with its file and line.
    pub fn from_config(config: &Config) -> Result<Policy, Vec<String>> {
        let (schema, _) = Schema::from_cedarschema_str(SCHEMA)
            .map_err(|e| vec![format!("the policy schema: {e}")])?;
        let (set, origin) = load::load(config, &schema)?;
        Ok(Policy {
            sliced: slice::Sliced::new(&set),
            schema,
            authorizer: Authorizer::new(),
            groups: groups::Groups::of_config(config),
            origin,
            decided: Default::default(),
        })
    }

    /// May `who` do `action` (to `tool`, for `list` and `call`)? A decision reads nothing
    /// but the principal, its groups, the action, the tool's attributes and the policies
    /// (the request's context is empty), so it is made once per such tuple and kept for the
    /// life of this policy (a reload makes a new one): the Cedar evaluation was most of a
    /// call's governing time. The groups are looked up each time (a uid's Unix groups are
    /// cached for `UNIX_GROUPS_TTL`), so a change of group still applies.
    pub fn decide(&self, who: &Who, action: Action, tool: Option<&ToolAttrs>) -> Decision {
        let groups = self.groups.of(who);
        let key = DecisionKey {
            who: who.clone(),
            groups,
            action,
            tool: tool.cloned(),
        };
        let kept = self
            .decided
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if let Some(d) = kept {
            return d;
        }
        let d = self.evaluate(who, &key.groups, action, tool);
        let mut decided = self.decided.lock().unwrap_or_else(|e| e.into_inner());
        if decided.len() >= DECISIONS_KEPT {
            decided.clear();
        }
        decided.insert(key, d.clone());
        d
    }

    /// How many decisions are kept (for tests).
    #[cfg(test)]
    pub fn decisions_kept(&self) -> usize {
        self.decided.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// [`Policy::decide`] evaluated by Cedar every time (`stsd policy bench`).
    pub fn decide_uncached(&self, who: &Who, action: Action, tool: Option<&ToolAttrs>) -> Decision {
        self.evaluate(who, &self.groups.of(who), action, tool)
    }

    /// Whether `who` may list each tool it is given, evaluated by Cedar and not kept: a
    /// caller's pass over the tool list, whose outcome the listing keeps itself (through
    /// the decision cache, a pass over more tools than it holds filled it and then emptied
    /// it, the calls' decisions with it). The groups are looked up once, here.
    pub(crate) fn lister(&self, who: &Who) -> impl Fn(&ToolAttrs) -> bool + '_ {
        let groups = self.groups.of(who);
        let who = who.clone();
        move |tool| {
            self.evaluate(&who, &groups, Action::List, Some(tool))
                .allowed
        }
    }

    fn evaluate(
        &self,
        who: &Who,
        groups: &[String],
        action: Action,
        tool: Option<&ToolAttrs>,
    ) -> Decision {
        let refused = |why: String| Decision {
            allowed: false,
            policies: Vec::new(),
            errors: vec![why],
        };
        // Debug builds (the tests) check every request's entities against the schema; a
        // release build trusts `entities.rs`, which those tests keep in line with it.
        let schema = cfg!(debug_assertions).then_some(&self.schema);
        let (entities, principal, resource) =
            match entities::build(who, groups, action, tool, schema) {
                Ok(x) => x,
                Err(e) => return refused(e),
            };
        let action_uid = match entities::action_uid(action) {
            Ok(a) => a,
            Err(e) => return refused(e),
        };
        let group_uids: Vec<_> = groups
            .iter()
            .filter_map(|g| entities::group_uid(g).ok())
            .collect();
        let set =
            match self
                .sliced
                .for_request(action.as_str(), &action_uid, &principal, &group_uids)
            {
                Ok(s) => s,
                Err(e) => return refused(e),
            };
        let request = match Request::new(principal, action_uid, resource, Context::empty(), schema)
        {
            Ok(r) => r,
            Err(e) => return refused(format!("the request: {e}")),
        };
        let r = self.authorizer.is_authorized(&request, &set, &entities);
        let errors: Vec<String> = r.diagnostics().errors().map(|e| e.to_string()).collect();
        Decision {
            // A policy that failed to evaluate (a forbid among them, perhaps) fails closed.
            allowed: r.decision() == CedarDecision::Allow && errors.is_empty(),
            policies: r.diagnostics().reason().map(|p| p.to_string()).collect(),
            errors,
        }
    }

    /// Where policy `id` came from.
    pub fn origin(&self, id: &str) -> Option<&str> {
        self.origin.get(id).map(String::as_str)
    }

    /// How many policies are in force.
    pub fn len(&self) -> usize {
        self.origin.len()
    }

    pub fn is_empty(&self) -> bool {
        self.origin.is_empty()
    }

    /// The groups `who` is in (for `stsd policy explain`).
    pub fn groups_of(&self, who: &Who) -> Vec<String> {
        self.groups.of(who)
    }
}

#[cfg(test)]
mod tests;
