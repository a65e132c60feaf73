//! From upstream tool lists to the wrapped tools stsd serves: per server and per tool, the
//! risk scores, the poisoning scan, the fingerprint ledger, the approval requirement, the
//! `max_risk` cap, then the shadowing rules across every member. Pure but for the ledger.

use super::events::{CompositionAction, RiskEvent};
use super::ledger::{self, Ledger};
use super::risk::{self, Composed, ServerRisk, ToolRisk};
use super::scan::{self, Hit};
use super::shadow;
pub use super::vocab::{default_alias, look_up, Withheld};
use crate::approval::{requirement, Requirement, ToolFacts};
use serde_json::{json, Value};
use std::sync::Arc;
use stsd_profiles::upstream::{GatewayConfig, Trust, UpstreamConfig};
use stsd_profiles::Config;

/// One upstream tool as stsd serves it.
#[derive(Debug, Clone)]
pub struct WrappedTool {
    /// The name stsd serves it under.
    pub alias: String,
    pub upstream: String,
    /// Its name on the upstream.
    pub tool: String,
    pub description: String,
    /// The upstream's input schema, unchanged.
    pub input_schema: Value,
    /// It compiled once, when the tool was exposed (Err: why not; every call says so).
    pub validator: Result<Arc<jsonschema::Validator>, String>,
    pub output_schema: Option<Value>,
    /// The upstream's annotations, passed through (hints, never trusted for policy beyond
    /// the score).
    pub annotations: Option<Value>,
    pub server_risk: ServerRisk,
    pub tool_risk: ToolRisk,
    pub composed: Composed,
    pub hits: Vec<Hit>,
    pub ledger_id: String,
    pub approval: Requirement,
    pub timeout_ms: u64,
    pub max_output_bytes: u64,
    /// Which set-up of its upstream listed it (see `Upstream::instance`): a call held while
    /// the upstream was replaced is not sent to the successor, which has not been scored.
    pub instance: u64,
}

/// What one upstream contributes right now.
pub struct Listed<'a> {
    pub cfg: &'a UpstreamConfig,
    /// The upstream's tools as listed (MCP `Tool` objects as JSON); None while it is not
    /// connected.
    pub tools: Option<&'a [Value]>,
    /// Its resources, templates and prompts (listed with the tools).
    pub items: Option<&'a super::client::items::Items>,
    pub last_used_ms: Option<i64>,
    /// The set-up of the upstream that listed them.
    pub instance: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Exposed {
    pub tools: Vec<WrappedTool>,
    pub withheld: Vec<Withheld>,
    /// Per upstream: its server score (None while it has not listed tools yet).
    pub servers: Vec<(String, Option<ServerRisk>)>,
    /// Resources, templates and prompts (see `items`).
    pub items: super::items::ExposedItems,
}

impl Exposed {
    pub fn get(&self, alias: &str) -> Option<&WrappedTool> {
        self.tools.iter().find(|t| t.alias == alias)
    }
}

/// Computes the exposure. `own` are stsd's own served tool names (R1 covers them too).
/// `observe` says whether ledger observations are recorded (the daemon) or only looked up
/// (a preview such as `stsd upstream check`, which must not change the ledger).
pub fn compute(
    listed: &[Listed],
    own: &[String],
    gw: &GatewayConfig,
    config: &Config,
    ledger: &Ledger,
    observe: bool,
    now_ms: i64,
) -> (Exposed, Vec<RiskEvent>) {
    let mut out = Exposed::default();
    let mut events = Vec::new();
    let mut candidates: Vec<WrappedTool> = Vec::new();
    for l in listed {
        let u = l.cfg;
        let Some(tools) = l.tools else {
            out.servers.push((u.id.clone(), None));
            continue;
        };
        let server = score_server(l, tools, gw, now_ms, &mut events);
        let others = other_names(listed, &u.id, own);
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        out.servers.push((u.id.clone(), Some(server.clone())));
        let wrapping = Wrapping {
            u,
            instance: l.instance,
            server: &server,
            others: &others,
            gw,
            config,
            ledger,
            observe,
        };
        for t in tools {
            if let Some(c) = wrapping.wrap(t, &mut out, &mut events) {
                candidates.push(c);
            }
        }
    }
    apply_shadowing(candidates, own, &mut out, &mut events);
    out.tools.sort_by(|a, b| a.alias.cmp(&b.alias));
    let items: Vec<super::items::ListedItems> = listed
        .iter()
        .filter_map(|l| {
            l.items
                .map(|items| super::items::ListedItems { cfg: l.cfg, items })
        })
        .collect();
    out.items = super::items::compute(&items, gw, ledger, observe, &mut events);
    (out, events)
}

/// What the server score reads of an upstream: its config, and the two facts that come from
/// elsewhere (the ledger's last use, the tool list's annotations).
fn server_facts<'a>(
    u: &'a UpstreamConfig,
    gw: &GatewayConfig,
    used_within_90_days: bool,
    advertises_write: bool,
) -> risk::ServerFacts<'a> {
    risk::ServerFacts {
        host: risk::classify(u.url.as_deref()),
        auth: super::sources::auth_kind(u),
        trust: u.trust,
        known_host: u
            .url
            .as_deref()
            .is_some_and(|url| risk::matches_known_host(url, &gw.known_hosts)),
        docs_url: u.docs_url.as_deref().is_some_and(|d| !d.trim().is_empty()),
        docs_adequate: u.docs_adequate,
        used_within_90_days,
        advertises_write,
        oauth_scopes: &u.oauth_scopes,
    }
}

/// Seed 001's server score from the configuration alone, before (or without) a connection:
/// every axis and the floors that need no tool list (no-auth with unknown trust, a
/// privileged OAuth scope). What waits on the live tool list: the no-auth write-capability
/// floor (read here as no write capability) and every tool's own score.
pub fn config_risk(
    u: &UpstreamConfig,
    gw: &GatewayConfig,
    last_used_ms: Option<i64>,
    now_ms: i64,
) -> ServerRisk {
    risk::server_risk(&server_facts(
        u,
        gw,
        risk::used_within_90_days(last_used_ms, now_ms),
        false,
    ))
}

/// An upstream's server score from its config and its listed tools' annotations, with its
/// events (the score, and the floor when one applies).
fn score_server(
    l: &Listed,
    tools: &[Value],
    gw: &GatewayConfig,
    now_ms: i64,
    events: &mut Vec<RiskEvent>,
) -> ServerRisk {
    let u = l.cfg;
    let annotations: Vec<Option<risk::Annotations>> = tools
        .iter()
        .map(risk::Annotations::from_tool_json)
        .collect();
    let facts = server_facts(
        u,
        gw,
        risk::used_within_90_days(l.last_used_ms, now_ms),
        risk::advertises_write(annotations.iter().map(Option::as_ref)),
    );
    let server = risk::server_risk(&facts);
    events.push(RiskEvent::ServerRiskComputed {
        upstream: u.id.clone(),
        host_class: facts.host,
        risk: server.clone(),
    });
    if let Some(f) = server.floor {
        events.push(RiskEvent::floor(&u.id, None, f));
    }
    server
}

/// The names the cross-server imperative pattern looks for in upstream `id`'s tools:
/// stsd's own, and the names and aliases of *other* servers' tools (not a tool's siblings).
fn other_names(listed: &[Listed], id: &str, own: &[String]) -> Vec<String> {
    let mut others: Vec<String> = own.to_vec();
    for o in listed.iter().filter(|o| o.cfg.id != id) {
        others.extend(names_of(o));
    }
    others
}

/// An upstream's tools' names and aliases.
fn names_of(l: &Listed) -> Vec<String> {
    let mut v = Vec::new();
    for t in l.tools.into_iter().flatten() {
        if let Some(n) = t.get("name").and_then(Value::as_str) {
            v.push(n.to_string());
            v.push(
                l.cfg
                    .aliases
                    .get(n)
                    .cloned()
                    .unwrap_or_else(|| default_alias(&l.cfg.id, n)),
            );
        }
    }
    v
}

/// One listed upstream while its tools are wrapped: its config and server score, the names
/// its tools must not reach for, and the settings and ledger that judge them.
struct Wrapping<'a> {
    u: &'a UpstreamConfig,
    instance: u64,
    server: &'a ServerRisk,
    others: &'a [&'a str],
    gw: &'a GatewayConfig,
    config: &'a Config,
    ledger: &'a Ledger,
    observe: bool,
}

impl Wrapping<'_> {
    /// One upstream tool through every check, in order: the `tools` filter, the alias's
    /// grammar, its risk, the poisoning scan, the ledger, the approval requirement and the
    /// `max_risk` cap. Some: a candidate for the shadowing rules; None: skipped or withheld
    /// (in `out`, with why).
    fn wrap(
        &self,
        t: &Value,
        out: &mut Exposed,
        events: &mut Vec<RiskEvent>,
    ) -> Option<WrappedTool> {
        let u = self.u;
        let name = t.get("name").and_then(Value::as_str)?;
        if u.tools
            .as_ref()
            .is_some_and(|only| !only.iter().any(|n| n == name))
        {
            return None;
        }
        let alias = u
            .aliases
            .get(name)
            .cloned()
            .unwrap_or_else(|| default_alias(&u.id, name));
        // The name clients would see follows the one tool-name grammar, or the tool is
        // not served (an upstream's own name may hold anything).
        if let Err(e) = stsd_protocol::check_tool_name(&alias) {
            let why = format!("{e}; give it an alias in the upstream's `aliases`");
            out.withheld
                .push(self.withheld(name, &alias, why, Vec::new()));
            return None;
        }
        let upstream_description = t.get("description").and_then(Value::as_str);
        let input_schema = t.get("inputSchema").cloned();
        let annotations = t.get("annotations").cloned().filter(|a| !a.is_null());
        let tool = self.tool_risk(name, t, upstream_description, input_schema.as_ref(), events);
        let hits = self.scan(name, &alias, t, events);
        let ledger_id = format!("{}/{}", u.id, name);
        let fp = ledger::fingerprint_served(
            name,
            upstream_description,
            input_schema.as_ref(),
            annotations.as_ref(),
            t.get("outputSchema"),
        );
        let served = serde_json::json!({
            "name": name, "description": upstream_description, "inputSchema": input_schema,
            "annotations": annotations, "outputSchema": t.get("outputSchema"),
        });
        let seen = self.ledger_verdict(&ledger_id, name, &fp, &served, events);
        if let Some(why) = self.refusal(&seen, &ledger_id, &hits) {
            out.withheld
                .push(self.withheld(name, &alias, why, hits.clone()));
            return None;
        }
        let approval = self.approval(name, &alias, &tool, annotations.as_ref());
        let composed = risk::compose(self.server, &tool, approval.required);
        events.push(RiskEvent::ToolPublishRiskComputed {
            upstream: u.id.clone(),
            tool: name.to_string(),
            alias: alias.clone(),
            tool_risk: tool.clone(),
            server_level: self.server.level,
            composed: composed.clone(),
        });
        if let Some(why) = self.above_max_risk(&composed) {
            out.withheld
                .push(self.withheld(name, &alias, why, hits.clone()));
            return None;
        }
        Some(WrappedTool {
            description: u
                .descriptions
                .get(name)
                .cloned()
                .unwrap_or_else(|| upstream_description.unwrap_or_default().to_string()),
            validator: compile(input_schema.as_ref()),
            input_schema: input_schema
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            output_schema: t.get("outputSchema").cloned().filter(|v| !v.is_null()),
            annotations,
            alias,
            upstream: u.id.clone(),
            tool: name.to_string(),
            server_risk: self.server.clone(),
            tool_risk: tool,
            composed,
            hits,
            ledger_id,
            approval,
            timeout_ms: u.timeout_ms(),
            max_output_bytes: u.max_output_bytes(),
            instance: self.instance,
        })
    }

    /// A tool of this upstream that is not served, and why.
    fn withheld(&self, name: &str, alias: &str, why: String, poisoning: Vec<Hit>) -> Withheld {
        Withheld {
            upstream: self.u.id.clone(),
            tool: name.to_string(),
            alias: alias.to_string(),
            why,
            poisoning,
        }
    }

    /// The tool's own risk score, with its floor event when one applies.
    fn tool_risk(
        &self,
        name: &str,
        t: &Value,
        description: Option<&str>,
        input_schema: Option<&Value>,
        events: &mut Vec<RiskEvent>,
    ) -> ToolRisk {
        let tool_facts = risk::ToolFacts {
            name,
            description,
            input_schema,
            annotations: risk::Annotations::from_tool_json(t),
            side_effect: None,
            sends_user_data: false,
            trusted_server: matches!(self.u.trust, Some(Trust::VendorOfficial | Trust::Community)),
        };
        let tool = risk::tool_risk(&tool_facts);
        if let Some(f) = tool.floor {
            events.push(RiskEvent::floor(&self.u.id, Some(name), f));
        }
        tool
    }

    /// The poisoning scan over every string of the tool as the upstream lists it (titles,
    /// output schema, property names, enum values...), not only its descriptions, and over
    /// the operator's description; an event per hit.
    fn scan(&self, name: &str, alias: &str, t: &Value, events: &mut Vec<RiskEvent>) -> Vec<Hit> {
        let mut hits = scan::scan_served(name, t, self.others);
        if let Some(d) = self.u.descriptions.get(name) {
            hits.extend(scan::scan_tool(alias, Some(d), None, self.others));
        }
        for h in &hits {
            events.push(RiskEvent::PoisoningHit {
                upstream: self.u.id.clone(),
                tool: name.to_string(),
                pattern: h.pattern,
                field: h.field.clone(),
                excerpt: h.excerpt.clone(),
                blocked: self.gw.block_on_poisoning,
            });
        }
        hits
    }

    /// The ledger's verdict on the tool's fingerprint `fp`, with an event when it no longer
    /// matches the approved one.
    fn ledger_verdict(
        &self,
        ledger_id: &str,
        name: &str,
        fp: &str,
        served: &Value,
        events: &mut Vec<RiskEvent>,
    ) -> ledger::Observation {
        let seen = look_up(self.ledger, ledger_id, fp, Some(served), self.observe);
        if seen.status == ledger::Status::Mismatch {
            events.push(RiskEvent::HashLedgerMismatch {
                id: ledger_id.to_string(),
                upstream: self.u.id.clone(),
                tool: name.to_string(),
                approved_fingerprint: seen.approved.clone(),
                observed_fingerprint: fp.to_string(),
                state: seen.state,
            });
        }
        seen
    }

    /// Why the ledger or the poisoning scan withholds the tool, if either does.
    fn refusal(&self, seen: &ledger::Observation, ledger_id: &str, hits: &[Hit]) -> Option<String> {
        super::vocab::refusal(
            seen,
            ledger_id,
            "the tool",
            hits,
            self.gw.block_on_poisoning,
        )
    }

    /// Whether a call of the tool needs approval: the approval policy over its facts (its
    /// unmitigated risk standing in for what it writes or reaches), with the upstream's
    /// switch for it.
    fn approval(
        &self,
        name: &str,
        alias: &str,
        tool: &ToolRisk,
        annotations: Option<&Value>,
    ) -> Requirement {
        let unmitigated = risk::compose(self.server, tool, false);
        let hint = |k: &str| annotations.and_then(|a| a.get(k)).and_then(Value::as_bool);
        let facts = ToolFacts {
            name: alias,
            category: None,
            risk: unmitigated.level,
            destructive: hint("destructiveHint") == Some(true),
            spec_required: false,
            // What an upstream tool writes or reaches is not known; its risk stands in.
            file_write: false,
            network: stsd_protocol::NetworkMode::Blocked,
            admin_published: false,
        };
        let switch = self
            .u
            .approval
            .get(name)
            .copied()
            .or(self.u.approval_default);
        requirement(&facts, switch, &self.config.approval)
    }

    /// Why the composed risk is above the upstream's `max_risk`, if it is.
    fn above_max_risk(&self, composed: &Composed) -> Option<String> {
        let max = self.u.max_risk?;
        (composed.level > max).then(|| {
            format!(
                "MAX_RISK: composed risk {} is above the upstream's max_risk {max}",
                composed.level
            )
        })
    }
}

/// The shadowing rules, across every member at once: a violation refuses the member. Each
/// candidate is served or withheld, with its composition events.
fn apply_shadowing(
    candidates: Vec<WrappedTool>,
    own: &[String],
    out: &mut Exposed,
    events: &mut Vec<RiskEvent>,
) {
    let members: Vec<shadow::Member> = candidates
        .iter()
        .map(|c| shadow::Member {
            server_id: c.upstream.clone(),
            tool: c.tool.clone(),
            alias: c.alias.clone(),
            description: c.description.clone(),
        })
        .collect();
    let own_refs: Vec<&str> = own.iter().map(String::as_str).collect();
    let violations = shadow::check(&members, &own_refs);
    for c in candidates {
        let mine: Vec<&shadow::Violation> =
            violations.iter().filter(|v| v.alias == c.alias).collect();
        let event = |v: Option<&shadow::Violation>| RiskEvent::CompositionLifecycle {
            action: if v.is_some() {
                CompositionAction::Refused
            } else {
                CompositionAction::Enabled
            },
            upstream: c.upstream.clone(),
            tool: c.tool.clone(),
            alias: c.alias.clone(),
            rule: v.map(|v| v.rule),
            detail: v.map(|v| v.detail.clone()),
        };
        if mine.is_empty() {
            events.push(event(None));
            out.tools.push(c);
        } else {
            for v in &mine {
                events.push(event(Some(v)));
            }
            out.withheld.push(Withheld {
                upstream: c.upstream.clone(),
                tool: c.tool.clone(),
                alias: c.alias.clone(),
                why: mine
                    .iter()
                    .map(|v| format!("{}: {}", v.rule.as_str(), v.detail))
                    .collect::<Vec<_>>()
                    .join("; "),
                poisoning: c.hits.clone(),
            });
        }
    }
}

/// The validator of an input schema, compiled once per exposure rather than per call.
fn compile(schema: Option<&Value>) -> Result<Arc<jsonschema::Validator>, String> {
    let empty = json!({"type": "object"});
    jsonschema::validator_for(schema.unwrap_or(&empty))
        .map(Arc::new)
        .map_err(|e| format!("the upstream's input schema does not compile: {e}"))
}
