//! `stsd policy check` and `stsd policy explain`: the policy of a config, read offline (no
//! daemon), against the catalog it would serve.

use super::{Action, Policy, ToolAttrs, Who};
use crate::catalog::{publish, Source};
use serde_json::{json, Value};
use stsd_profiles::Config;

/// The principals a config names (its lists and groups), and `uid:65534` standing for any
/// principal it does not name.
fn principals(c: &Config) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut add = |p: String| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    for u in c.daemon.admin_uids.iter().chain(&c.approval.operator_uids) {
        add(format!("uid:{u}"));
    }
    if c.daemon.admin_uids.is_empty() {
        add("uid:0".into());
    }
    for p in c
        .http
        .admin_principals
        .iter()
        .chain(&c.http.approver_principals)
    {
        add(p.clone());
    }
    for members in c.policy.groups.values() {
        for m in members {
            add(m.clone());
        }
    }
    add("uid:65534".into());
    out
}

/// The served tools of `sources` under `config`, as policies see them.
fn tools(sources: &[Source], config: &Config) -> Vec<ToolAttrs> {
    publish(sources, config)
        .tools
        .iter()
        .map(ToolAttrs::own)
        .collect()
}

fn word(allowed: bool) -> &'static str {
    if allowed {
        "allow"
    } else {
        "deny"
    }
}

/// Validates the config's policy and decides every principal x tool (list, call) and every
/// principal x daemon action. Err: the policy's problems, each with its file and line.
pub fn check(config: &Config, sources: &[Source]) -> Result<Value, Vec<String>> {
    let policy = Policy::from_config(config)?;
    let tools = tools(sources, config);
    let mut decisions = Vec::new();
    let mut daemon = Vec::new();
    for p in principals(config) {
        let who = Who::parse(&p);
        for t in &tools {
            decisions.push(json!({
                "principal": p,
                "tool": t.name,
                "list": word(policy.decide(&who, Action::List, Some(t)).allowed),
                "call": word(policy.decide(&who, Action::Call, Some(t)).allowed),
            }));
        }
        let mut row = json!({"principal": p});
        for a in [Action::Admin, Action::ReadAudit, Action::Approve] {
            row[a.as_str()] = json!(word(policy.decide(&who, a, None).allowed));
        }
        daemon.push(row);
    }
    let mut ids: Vec<Value> = Vec::new();
    for (id, from) in &policy.origin {
        ids.push(json!({"id": id, "from": from}));
    }
    Ok(json!({"valid": true, "policies": ids, "tools": decisions, "daemon": daemon}))
}

/// `check`'s result as text.
pub fn check_text(v: &Value) -> String {
    let mut out = String::new();
    let policies = v["policies"].as_array().cloned().unwrap_or_default();
    out.push_str(&format!("policy: valid, {} policies\n", policies.len()));
    for p in &policies {
        out.push_str(&format!(
            "  {} ({})\n",
            p["id"].as_str().unwrap_or_default(),
            p["from"].as_str().unwrap_or_default()
        ));
    }
    out.push_str("\nprincipal x tool (list, call):\n");
    for d in v["tools"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {:<24} {:<32} {:<5} {}\n",
            d["principal"].as_str().unwrap_or_default(),
            d["tool"].as_str().unwrap_or_default(),
            d["list"].as_str().unwrap_or_default(),
            d["call"].as_str().unwrap_or_default()
        ));
    }
    out.push_str("\nprincipal x daemon (admin, read_audit, approve):\n");
    for d in v["daemon"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {:<24} {:<5} {:<5} {}\n",
            d["principal"].as_str().unwrap_or_default(),
            d["admin"].as_str().unwrap_or_default(),
            d["read_audit"].as_str().unwrap_or_default(),
            d["approve"].as_str().unwrap_or_default()
        ));
    }
    out
}

/// The decision for one principal, one action and (for `list` and `call`) one tool of the
/// catalog, and the policies that made it.
pub fn explain(
    config: &Config,
    sources: &[Source],
    principal: &str,
    action: Action,
    tool: Option<&str>,
) -> Result<String, Vec<String>> {
    let policy = Policy::from_config(config)?;
    let who = Who::parse(principal);
    let attrs = match (action.on_tool(), tool) {
        (true, Some(name)) => Some(
            tools(sources, config)
                .into_iter()
                .find(|t| t.name == name)
                .ok_or_else(|| vec![format!("the catalog serves no tool named {name}")])?,
        ),
        (true, None) => return Err(vec![format!("{} needs a TOOL", action.as_str())]),
        (false, _) => None,
    };
    let d = policy.decide(&who, action, attrs.as_ref());
    let groups = policy.groups_of(&who);
    let mut out = format!(
        "principal: {} ({}; groups: {})\naction: {}\n",
        who.id,
        who.kind,
        if groups.is_empty() {
            "none".to_string()
        } else {
            groups.join(", ")
        },
        action.as_str()
    );
    if let Some(t) = &attrs {
        out.push_str(&format!(
            "tool: {} (riskLevel {}, fileRead {}, fileWrite {}, destructive {}, network {}, requiresApproval {})\n",
            t.name, t.risk_level, t.file_read, t.file_write, t.destructive, t.network_mode, t.requires_approval
        ));
    }
    out.push_str(&format!(
        "decision: {}\n",
        if d.allowed { "ALLOW" } else { "DENY" }
    ));
    if d.policies.is_empty() {
        out.push_str("policies: none (nothing permits it)\n");
    } else {
        for id in &d.policies {
            out.push_str(&format!(
                "policy: {id} ({})\n",
                policy.origin(id).unwrap_or("?")
            ));
        }
    }
    for e in &d.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    Ok(out)
}

/// `stsd policy bench`: the cost of one decision with `policies` policies in force (the three
/// default ones and generated ones that test groups, names and attributes), over `rounds`
/// decisions: (p50, p99) in microseconds.
pub fn bench(policies: usize, rounds: usize) -> Result<(f64, f64), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut text = String::new();
    let mut config = Config::default();
    for i in 0..policies.saturating_sub(3) {
        if i % 2 == 0 {
            text.push_str(&format!(
                "@id(\"g{i}\")\nforbid (principal in Stsd::Group::\"g{i}\", action == Stsd::Action::\"call\", resource)\nwhen {{ resource.riskLevel >= {} && resource.fileWrite }};\n",
                i % 6
            ));
            config
                .policy
                .groups
                .insert(format!("g{i}"), vec![format!("user{i}")]);
        } else {
            text.push_str(&format!(
                "@id(\"n{i}\")\npermit (principal == Stsd::Principal::\"user{i}\", action == Stsd::Action::\"call\", resource)\nwhen {{ resource.name == \"tool{i}\" && !resource.destructive }};\n"
            ));
        }
    }
    let file = dir.path().join("bench.cedar");
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    config.policy.files = vec![file];
    let policy = Policy::from_config(&config).map_err(|e| e.join("; "))?;
    let who = Who::http("user4", "http");
    let tool = ToolAttrs {
        name: "tool5".into(),
        category: "DATA".into(),
        tags: vec!["read".into()],
        risk_level: 4,
        file_read: true,
        file_write: true,
        network_mode: "allowlist".into(),
        hosts: vec!["api.example.com".into()],
        ..ToolAttrs::default()
    };
    let mut us: Vec<f64> = Vec::with_capacity(rounds);
    for _ in 0..rounds.max(1) {
        let t0 = std::time::Instant::now();
        let d = policy.decide_uncached(&who, Action::Call, Some(&tool));
        us.push(t0.elapsed().as_secs_f64() * 1e6);
        std::hint::black_box(d);
    }
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q) as usize];
    Ok((at(0.5), at(0.99)))
}
