//! From upstream tool lists to the wrapped tools stsd serves: per server and per tool, the
//! risk scores, the poisoning scan, the fingerprint ledger, the approval requirement, the
//! `max_risk` cap, then the shadowing rules across every member. Pure but for the ledger.

use super::events::{CompositionAction, RiskEvent};
use super::ledger::{self, Ledger};
use super::risk::{self, Composed, ServerRisk, ToolRisk};
use super::scan::{self, Hit};
use super::shadow;
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
}

/// A tool that is not served, and why (a code first: AWAITING_REREVIEW, REVOKED, POISONING,
/// MAX_RISK, R1_ALIAS_COLLISION, ...).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Withheld {
    pub upstream: String,
    pub tool: String,
    pub alias: String,
    pub why: String,
    /// Poisoning-scan hits, when the tool got as far as the scan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub poisoning: Vec<Hit>,
}

/// What one upstream contributes right now.
pub struct Listed<'a> {
    pub cfg: &'a UpstreamConfig,
    /// The upstream's tools as listed (MCP `Tool` objects as JSON); None while it is not
    /// connected.
    pub tools: Option<&'a [Value]>,
    pub last_used_ms: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct Exposed {
    pub tools: Vec<WrappedTool>,
    pub withheld: Vec<Withheld>,
    /// Per upstream: its server score (None while it has not listed tools yet).
    pub servers: Vec<(String, Option<ServerRisk>)>,
}

impl Exposed {
    pub fn get(&self, alias: &str) -> Option<&WrappedTool> {
        self.tools.iter().find(|t| t.alias == alias)
    }
}

/// The default exposed name of an upstream tool: `<upstream-id>__<tool>` (names stay within
/// `[A-Za-z0-9_-]`, which every MCP client accepts).
pub fn default_alias(upstream: &str, tool: &str) -> String {
    format!("{upstream}__{tool}")
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
    // Per upstream, its tools' names and aliases: the cross-server imperative pattern looks
    // for the names of *other* servers' tools (and stsd's own), not a tool's siblings.
    let names_of = |l: &Listed| -> Vec<String> {
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
    };
    for l in listed {
        let u = l.cfg;
        let Some(tools) = l.tools else {
            out.servers.push((u.id.clone(), None));
            continue;
        };
        let annotations: Vec<Option<risk::Annotations>> = tools
            .iter()
            .map(risk::Annotations::from_tool_json)
            .collect();
        let facts = risk::ServerFacts {
            host: risk::classify(u.url.as_deref()),
            auth: super::sources::auth_kind(u),
            trust: u.trust,
            known_host: u
                .url
                .as_deref()
                .is_some_and(|url| risk::matches_known_host(url, &gw.known_hosts)),
            docs_url: u.docs_url.as_deref().is_some_and(|d| !d.trim().is_empty()),
            docs_adequate: u.docs_adequate,
            used_within_90_days: risk::used_within_90_days(l.last_used_ms, now_ms),
            advertises_write: risk::advertises_write(annotations.iter().map(Option::as_ref)),
            oauth_scopes: &u.oauth_scopes,
        };
        let server = risk::server_risk(&facts);
        events.push(RiskEvent::ServerRiskComputed {
            upstream: u.id.clone(),
            host_class: facts.host,
            risk: server.clone(),
        });
        if let Some(f) = server.floor {
            events.push(RiskEvent::floor(&u.id, None, f));
        }
        let mut others: Vec<String> = own.to_vec();
        for o in listed.iter().filter(|o| o.cfg.id != u.id) {
            others.extend(names_of(o));
        }
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        out.servers.push((u.id.clone(), Some(server.clone())));
        for t in tools {
            let Some(name) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            if u.tools
                .as_ref()
                .is_some_and(|only| !only.iter().any(|n| n == name))
            {
                continue;
            }
            let alias = u
                .aliases
                .get(name)
                .cloned()
                .unwrap_or_else(|| default_alias(&u.id, name));
            // The name clients would see follows the one tool-name grammar, or the tool is
            // not served (an upstream's own name may hold anything).
            if let Err(e) = stsd_protocol::check_tool_name(&alias) {
                out.withheld.push(Withheld {
                    upstream: u.id.clone(),
                    tool: name.to_string(),
                    alias: alias.clone(),
                    why: format!("{e}; give it an alias in the upstream's `aliases`"),
                    poisoning: Vec::new(),
                });
                continue;
            }
            let upstream_description = t.get("description").and_then(Value::as_str);
            let input_schema = t.get("inputSchema").cloned();
            let annotations = t.get("annotations").cloned().filter(|a| !a.is_null());
            let tool_facts = risk::ToolFacts {
                name,
                description: upstream_description,
                input_schema: input_schema.as_ref(),
                annotations: risk::Annotations::from_tool_json(t),
                side_effect: None,
                sends_user_data: false,
                trusted_server: matches!(u.trust, Some(Trust::VendorOfficial | Trust::Community)),
            };
            let tool = risk::tool_risk(&tool_facts);
            if let Some(f) = tool.floor {
                events.push(RiskEvent::floor(&u.id, Some(name), f));
            }
            // Every string of the tool as the upstream lists it (titles, output schema,
            // property names, enum values...), not only its descriptions.
            let mut hits = scan::scan_served(name, t, &others);
            if let Some(d) = u.descriptions.get(name) {
                hits.extend(scan::scan_tool(&alias, Some(d), None, &others));
            }
            for h in &hits {
                events.push(RiskEvent::PoisoningHit {
                    upstream: u.id.clone(),
                    tool: name.to_string(),
                    pattern: h.pattern,
                    field: h.field.clone(),
                    excerpt: h.excerpt.clone(),
                    blocked: gw.block_on_poisoning,
                });
            }
            let ledger_id = format!("{}/{}", u.id, name);
            let fp = ledger::fingerprint_served(
                name,
                upstream_description,
                input_schema.as_ref(),
                annotations.as_ref(),
                t.get("outputSchema"),
            );
            let seen = look_up(ledger, &ledger_id, &fp, observe);
            if seen.status == ledger::Status::Mismatch {
                events.push(RiskEvent::HashLedgerMismatch {
                    id: ledger_id.clone(),
                    upstream: u.id.clone(),
                    tool: name.to_string(),
                    approved_fingerprint: seen.approved.clone(),
                    observed_fingerprint: fp.clone(),
                    state: seen.state,
                });
            }
            let withhold = |why: String, out: &mut Exposed| {
                out.withheld.push(Withheld {
                    upstream: u.id.clone(),
                    tool: name.to_string(),
                    alias: alias.clone(),
                    why,
                    poisoning: hits.clone(),
                })
            };
            if seen.state != ledger::State::Active {
                withhold(
                    format!(
                        "{}: the tool changed since it was approved (or was revoked): \
                         stsd ledger approve {ledger_id}",
                        seen.state.as_str(),
                    ),
                    &mut out,
                );
                continue;
            }
            if gw.block_on_poisoning && !hits.is_empty() {
                let names: Vec<&str> = hits.iter().map(|h| h.pattern.as_str()).collect();
                withhold(
                    format!(
                        "POISONING: {} ([gateway] block_on_poisoning)",
                        names.join(", ")
                    ),
                    &mut out,
                );
                continue;
            }
            let unmitigated = risk::compose(&server, &tool, false);
            let ann = annotations.as_ref();
            let hint = |k: &str| ann.and_then(|a| a.get(k)).and_then(Value::as_bool);
            let facts = ToolFacts {
                name: &alias,
                category: None,
                risk: unmitigated.level,
                destructive: hint("destructiveHint") == Some(true),
                spec_required: false,
                // What an upstream tool writes or reaches is not known; its risk stands in.
                file_write: false,
                network: stsd_protocol::NetworkMode::Blocked,
                admin_published: false,
            };
            let switch = u.approval.get(name).copied().or(u.approval_default);
            let approval = requirement(&facts, switch, &config.approval);
            let composed = risk::compose(&server, &tool, approval.required);
            events.push(RiskEvent::ToolPublishRiskComputed {
                upstream: u.id.clone(),
                tool: name.to_string(),
                alias: alias.clone(),
                tool_risk: tool.clone(),
                server_level: server.level,
                composed: composed.clone(),
            });
            if let Some(max) = u.max_risk {
                if composed.level > max {
                    withhold(
                        format!(
                            "MAX_RISK: composed risk {} is above the upstream's max_risk {max}",
                            composed.level
                        ),
                        &mut out,
                    );
                    continue;
                }
            }
            candidates.push(WrappedTool {
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
                server_risk: server.clone(),
                tool_risk: tool,
                composed,
                hits,
                ledger_id,
                approval,
                timeout_ms: u.timeout_ms(),
                max_output_bytes: u.max_output_bytes(),
            });
        }
    }
    // The shadowing rules, across every member at once: a violation refuses the member.
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
    out.tools.sort_by(|a, b| a.alias.cmp(&b.alias));
    (out, events)
}

/// The validator of an input schema, compiled once per exposure rather than per call.
fn compile(schema: Option<&Value>) -> Result<Arc<jsonschema::Validator>, String> {
    let empty = json!({"type": "object"});
    jsonschema::validator_for(schema.unwrap_or(&empty))
        .map(Arc::new)
        .map_err(|e| format!("the upstream's input schema does not compile: {e}"))
}

/// The ledger's verdict on `fp`: recorded (the daemon), or only looked up (a preview, which
/// must leave the ledger as it is). A ledger that cannot be written withholds the tool.
fn look_up(ledger: &Ledger, id: &str, fp: &str, observe: bool) -> ledger::Observation {
    use ledger::{Observation, State, Status};
    if observe {
        return ledger.observe(id, fp).unwrap_or_else(|e| {
            tracing::error!(id, error = %e, "the fingerprint ledger cannot be written");
            Observation {
                status: Status::Mismatch,
                state: State::AwaitingRereview,
                approved: String::new(),
                observed: fp.to_string(),
            }
        });
    }
    match ledger.get(id) {
        None => Observation {
            status: Status::New,
            state: State::Active,
            approved: fp.to_string(),
            observed: fp.to_string(),
        },
        Some(e) => Observation {
            status: if e.approved == fp {
                Status::Unchanged
            } else {
                Status::Mismatch
            },
            state: if e.state == State::Active && e.approved != fp {
                State::AwaitingRereview
            } else {
                e.state
            },
            approved: e.approved,
            observed: fp.to_string(),
        },
    }
}
