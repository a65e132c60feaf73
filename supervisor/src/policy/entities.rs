//! The entities of one decision: the principal with its groups, and the tool (its attributes
//! as the schema has them) or the daemon.

use cedar_policy::{
    Entities, Entity, EntityId, EntityTypeName, EntityUid, RestrictedExpression, Schema,
};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;

use crate::call::vocab::{Principal, PrincipalKind};

/// What a principal asks to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    List,
    Call,
    Approve,
    Admin,
    ReadAudit,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::List => "list",
            Action::Call => "call",
            Action::Approve => "approve",
            Action::Admin => "admin",
            Action::ReadAudit => "read_audit",
        }
    }

    pub fn parse(s: &str) -> Option<Action> {
        [
            Action::List,
            Action::Call,
            Action::Approve,
            Action::Admin,
            Action::ReadAudit,
        ]
        .into_iter()
        .find(|a| a.as_str() == s)
    }

    /// Whether it is about a tool (else about the daemon).
    pub fn on_tool(self) -> bool {
        matches!(self, Action::List | Action::Call)
    }
}

/// Who asks: `uid:N` on the socket, an HTTP principal by its name (`oauth:<subject>` for an
/// OAuth token's).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Who {
    /// The principal's id in policies: `Stsd::Principal::"<id>"`.
    pub id: String,
    /// "uid" or "http" (as policies written before `credential` existed read it).
    pub kind: &'static str,
    /// How it proved who it is: "uid", "token", "certificate" or "oauth".
    pub credential: &'static str,
    pub transport: &'static str,
    pub uid: Option<u32>,
    /// The groups the credential itself carries (an OAuth token's claims and scopes).
    pub credential_groups: Vec<String>,
}

impl Who {
    pub fn uid(uid: u32, transport: &'static str) -> Who {
        Who {
            id: format!("uid:{uid}"),
            kind: "uid",
            credential: "uid",
            transport,
            uid: Some(uid),
            credential_groups: Vec::new(),
        }
    }

    /// A bearer-token principal by its name.
    pub fn http(name: &str, transport: &'static str) -> Who {
        Who::principal(&Principal::new(name, PrincipalKind::Token), transport)
    }

    pub fn principal(p: &Principal, transport: &'static str) -> Who {
        Who {
            id: p.name.clone(),
            kind: "http",
            credential: p.kind.as_str(),
            transport,
            uid: None,
            credential_groups: p.groups.clone(),
        }
    }

    /// A principal as written on the command line (`stsd policy explain`): `uid:N`,
    /// `oauth:SUBJECT` or a token's name.
    pub fn parse(text: &str) -> Who {
        match text.strip_prefix("uid:").and_then(|n| n.parse().ok()) {
            Some(uid) => Who::uid(uid, "unix"),
            None if text.starts_with("oauth:") => {
                Who::principal(&Principal::new(text, PrincipalKind::OAuth), "http")
            }
            None => Who::http(text, "http"),
        }
    }

    /// The caller of a call: its HTTP principal, else its peer uid; with neither (stdio, a
    /// process that is not a socket peer) the daemon's own uid, as the process that runs.
    pub fn of_caller(c: &crate::call::vocab::Caller) -> Who {
        match (&c.principal, c.peer_uid) {
            (Some(p), _) => Who::principal(p, c.transport),
            (None, Some(u)) => Who::uid(u, c.transport),
            (None, None) => Who::uid(nix::unistd::Uid::effective().as_raw(), c.transport),
        }
    }

    /// Who makes an admin request.
    pub fn of_subject(s: &crate::call::vocab::Subject) -> Who {
        match s {
            crate::call::vocab::Subject::Uid(u) => Who::uid(*u, "unix"),
            crate::call::vocab::Subject::Principal(p) => Who::principal(p, "http"),
        }
    }
}

/// A tool as policies see it (the schema's `Stsd::Tool`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ToolAttrs {
    pub name: String,
    pub category: String,
    pub tags: Vec<String>,
    /// 0..5.
    pub risk_level: i64,
    pub file_read: bool,
    pub file_write: bool,
    pub destructive: bool,
    pub network_mode: String,
    pub hosts: Vec<String>,
    pub upstream: String,
    pub server_risk: i64,
    pub requires_approval: bool,
}

impl ToolAttrs {
    /// One of stsd's own tools, as served.
    pub fn own(t: &crate::catalog::tool::PublishedTool) -> ToolAttrs {
        let caps = &t.resolved.tool_safety.capabilities;
        ToolAttrs {
            name: t.spec.name.clone(),
            category: t.spec.category.clone().unwrap_or_default(),
            tags: t.spec.tags.clone(),
            risk_level: risk_number(t.resolved.risk.as_str()),
            file_read: caps.file_read,
            file_write: caps.file_write,
            destructive: caps.destructive,
            network_mode: caps.network.mode.as_str().to_string(),
            hosts: caps.network.hosts.clone(),
            upstream: String::new(),
            server_risk: 0,
            requires_approval: t.approval.required,
        }
    }

    /// A tool wrapped from an upstream: what stsd knows of it is its scores (it may do
    /// anything its server can).
    pub fn wrapped(t: &crate::gateway::WrappedTool) -> ToolAttrs {
        ToolAttrs {
            name: t.alias.clone(),
            category: String::new(),
            tags: Vec::new(),
            risk_level: risk_number(t.tool_risk.level.as_str()),
            file_read: true,
            file_write: true,
            destructive: t
                .annotations
                .as_ref()
                .and_then(|a| a.get("destructiveHint"))
                .and_then(serde_json::Value::as_bool)
                .unwrap_or(true),
            network_mode: "upstream".into(),
            hosts: Vec::new(),
            upstream: t.upstream.clone(),
            server_risk: risk_number(t.server_risk.level.as_str()),
            requires_approval: t.approval.required,
        }
    }
}

/// `L3` -> 3.
fn risk_number(level: &str) -> i64 {
    level.trim_start_matches('L').parse().unwrap_or(5)
}

fn ty(name: &str) -> Result<EntityTypeName, String> {
    EntityTypeName::from_str(name).map_err(|e| format!("entity type {name}: {e}"))
}

fn uid(type_name: &str, id: &str) -> Result<EntityUid, String> {
    Ok(EntityUid::from_type_name_and_id(
        ty(type_name)?,
        EntityId::new(id),
    ))
}

/// `Stsd::Group::"<name>"`.
pub fn group_uid(name: &str) -> Result<EntityUid, String> {
    uid("Stsd::Group", name)
}

/// `Stsd::Action::"<action>"`.
pub fn action_uid(a: Action) -> Result<EntityUid, String> {
    uid("Stsd::Action", a.as_str())
}

fn string(s: &str) -> RestrictedExpression {
    RestrictedExpression::new_string(s.to_string())
}

fn strings(v: &[String]) -> RestrictedExpression {
    RestrictedExpression::new_set(v.iter().map(|s| string(s)))
}

/// The entities, principal and resource of one request.
pub fn build(
    who: &Who,
    groups: &[String],
    action: Action,
    tool: Option<&ToolAttrs>,
    schema: Option<&Schema>,
) -> Result<(Entities, EntityUid, EntityUid), String> {
    let principal = uid("Stsd::Principal", &who.id)?;
    let mut parents = HashSet::new();
    let mut all = Vec::new();
    for g in groups {
        let g = uid("Stsd::Group", g)?;
        all.push(Entity::new_no_attrs(g.clone(), HashSet::new()));
        parents.insert(g);
    }
    let attrs = HashMap::from([
        ("kind".to_string(), string(who.kind)),
        ("credential".to_string(), string(who.credential)),
        ("name".to_string(), string(&who.id)),
        ("transport".to_string(), string(who.transport)),
    ]);
    all.push(
        Entity::new(principal.clone(), attrs, parents)
            .map_err(|e| format!("the principal: {e}"))?,
    );
    let resource = match (action.on_tool(), tool) {
        (true, Some(t)) => {
            let r = uid("Stsd::Tool", &t.name)?;
            let attrs = HashMap::from([
                ("name".to_string(), string(&t.name)),
                ("category".to_string(), string(&t.category)),
                ("tags".to_string(), strings(&t.tags)),
                (
                    "riskLevel".to_string(),
                    RestrictedExpression::new_long(t.risk_level),
                ),
                (
                    "fileRead".to_string(),
                    RestrictedExpression::new_bool(t.file_read),
                ),
                (
                    "fileWrite".to_string(),
                    RestrictedExpression::new_bool(t.file_write),
                ),
                (
                    "destructive".to_string(),
                    RestrictedExpression::new_bool(t.destructive),
                ),
                ("networkMode".to_string(), string(&t.network_mode)),
                ("hosts".to_string(), strings(&t.hosts)),
                ("upstream".to_string(), string(&t.upstream)),
                (
                    "serverRisk".to_string(),
                    RestrictedExpression::new_long(t.server_risk),
                ),
                (
                    "requiresApproval".to_string(),
                    RestrictedExpression::new_bool(t.requires_approval),
                ),
            ]);
            all.push(
                Entity::new(r.clone(), attrs, HashSet::new())
                    .map_err(|e| format!("the tool: {e}"))?,
            );
            r
        }
        (true, None) => return Err(format!("{} needs a tool", action.as_str())),
        (false, _) => {
            let r = uid("Stsd::Daemon", "stsd")?;
            all.push(Entity::new_no_attrs(r.clone(), HashSet::new()));
            r
        }
    };
    let entities =
        Entities::from_entities(all, schema).map_err(|e| format!("the entities: {e}"))?;
    Ok((entities, principal, resource))
}
