//! An upstream's resources, resource templates and prompts as stsd serves them, governed as
//! its tools are: chosen per upstream (`prompts`, `resources`), scanned for poisoning over
//! every string they are listed with (a prompt is model-facing text), fingerprinted in the
//! ledger (`<upstream>/prompt:NAME`, `<upstream>/resource:URI`,
//! `<upstream>/template:URITEMPLATE`: a change is a MISMATCH, withheld until approved), and
//! withheld with a reason like a tool.
//!
//! Names: a prompt is served as `<upstream>__<name>` (the tool-name grammar); a resource
//! keeps its URI (clients and the upstream's own replies refer to it: a rewritten URI would
//! break every link to it), its `name` prefixed the same way. A URI listed by two upstreams is
//! served by neither (`URI_COLLISION`): a read must never reach a server the client did not
//! mean. A URI no list names is routed by the upstreams' templates, and only when exactly one
//! upstream's template matches it.

use super::client::items::Items;
use super::events::RiskEvent;
use super::ledger::{self, Ledger};
use super::scan::{self, Hit};
use super::vocab::{default_alias, look_up, Withheld};
use serde_json::Value;
use stsd_profiles::upstream::{GatewayConfig, UpstreamConfig};

/// One prompt as served.
#[derive(Debug, Clone)]
pub struct ServedPrompt {
    /// `<upstream>__<name>`.
    pub name: String,
    pub upstream: String,
    /// Its name on the upstream.
    pub prompt: String,
    /// The listing as served (its name replaced).
    pub listing: Value,
    pub hits: Vec<Hit>,
}

/// One resource (or resource template) as served.
#[derive(Debug, Clone)]
pub struct ServedResource {
    pub upstream: String,
    /// The URI, or the URI template.
    pub uri: String,
    /// The listing as served (its name prefixed).
    pub listing: Value,
    pub hits: Vec<Hit>,
}

/// What the upstreams offer besides tools, as served.
#[derive(Debug, Clone, Default)]
pub struct ExposedItems {
    pub prompts: Vec<ServedPrompt>,
    pub resources: Vec<ServedResource>,
    pub templates: Vec<ServedResource>,
    pub withheld: Vec<Withheld>,
    /// Upstreams that answer `completion/complete`, and those that take subscriptions.
    pub completions: Vec<String>,
    pub subscribe: Vec<String>,
}

impl ExposedItems {
    pub fn prompt(&self, name: &str) -> Option<&ServedPrompt> {
        self.prompts.iter().find(|p| p.name == name)
    }

    /// The upstream a URI is read from: the one that lists it, else the only one whose
    /// template matches it. Err: why none.
    pub fn route(&self, uri: &str) -> Result<&str, String> {
        if let Some(r) = self.resources.iter().find(|r| r.uri == uri) {
            return Ok(&r.upstream);
        }
        if let Some(w) = self
            .withheld
            .iter()
            .find(|w| w.tool == format!("resource:{uri}"))
        {
            return Err(format!("{uri} is not served: {}", w.why));
        }
        let mut by: Vec<&str> = self
            .templates
            .iter()
            .filter(|t| template_matches(&t.uri, uri))
            .map(|t| t.upstream.as_str())
            .collect();
        by.dedup();
        match by.as_slice() {
            [one] => Ok(one),
            [] => Err(format!("no upstream serves {uri}")),
            many => Err(format!(
                "{uri} matches templates of {} upstreams ({}): it is read from none",
                many.len(),
                many.join(", ")
            )),
        }
    }

    /// What clients see change when this differs: names and listings.
    pub fn summary(&self) -> (Vec<&Value>, Vec<&Value>) {
        let res = self
            .resources
            .iter()
            .chain(&self.templates)
            .map(|r| &r.listing)
            .collect();
        (res, self.prompts.iter().map(|p| &p.listing).collect())
    }
}

/// Whether `uri` is one of the URIs RFC 6570 `template` expands to (each `{...}` expression
/// matches any run of characters, literals match themselves, in order).
pub fn template_matches(template: &str, uri: &str) -> bool {
    let mut parts: Vec<Option<&str>> = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        if open > 0 {
            parts.push(Some(&rest[..open]));
        }
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        parts.push(None);
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Some(rest));
    }
    fn go(parts: &[Option<&str>], s: &str) -> bool {
        match parts.split_first() {
            None => s.is_empty(),
            Some((Some(lit), more)) => s.strip_prefix(lit).is_some_and(|r| go(more, r)),
            Some((None, more)) => (1..=s.len())
                .filter(|i| s.is_char_boundary(*i))
                .any(|i| go(more, &s[i..])),
        }
    }
    go(&parts, uri)
}

/// One upstream's items and where they came from.
pub struct ListedItems<'a> {
    pub cfg: &'a UpstreamConfig,
    pub items: &'a Items,
}

/// Governs every upstream's items: the exposure, with the events it raised.
pub fn compute(
    listed: &[ListedItems],
    gw: &GatewayConfig,
    ledger: &Ledger,
    observe: bool,
    events: &mut Vec<RiskEvent>,
) -> ExposedItems {
    let mut out = ExposedItems::default();
    for l in listed {
        let g = Govern {
            u: l.cfg,
            gw,
            ledger,
            observe,
        };
        if l.items.completions {
            out.completions.push(l.cfg.id.clone());
        }
        if l.items.subscribe {
            out.subscribe.push(l.cfg.id.clone());
        }
        for p in &l.items.prompts {
            if let Some(p) = g.prompt(p, &mut out.withheld, events) {
                out.prompts.push(p);
            }
        }
        for (list, key, kind) in [
            (&l.items.resources, "uri", "resource"),
            (&l.items.templates, "uriTemplate", "template"),
        ] {
            for r in list {
                if let Some(r) = g.resource(r, key, kind, &mut out.withheld, events) {
                    match kind {
                        "resource" => out.resources.push(r),
                        _ => out.templates.push(r),
                    }
                }
            }
        }
    }
    // One URI, two upstreams: neither serves it.
    let mut seen = std::collections::BTreeMap::<String, Vec<String>>::new();
    for r in &out.resources {
        seen.entry(r.uri.clone())
            .or_default()
            .push(r.upstream.clone());
    }
    out.resources.retain(|r| {
        let by = &seen[&r.uri];
        if by.len() < 2 {
            return true;
        }
        out.withheld.push(Withheld {
            upstream: r.upstream.clone(),
            tool: format!("resource:{}", r.uri),
            alias: r.uri.clone(),
            why: format!(
                "URI_COLLISION: {} is listed by upstreams {}",
                r.uri,
                by.join(", ")
            ),
            poisoning: Vec::new(),
        });
        false
    });
    out.prompts.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

struct Govern<'a> {
    u: &'a UpstreamConfig,
    gw: &'a GatewayConfig,
    ledger: &'a Ledger,
    observe: bool,
}

impl Govern<'_> {
    fn prompt(
        &self,
        p: &Value,
        withheld: &mut Vec<Withheld>,
        events: &mut Vec<RiskEvent>,
    ) -> Option<ServedPrompt> {
        let name = p.get("name").and_then(Value::as_str)?;
        if let Some(only) = &self.u.prompts {
            if !only.iter().any(|n| n == name) {
                return None;
            }
        }
        let served = default_alias(&self.u.id, name);
        let label = format!("prompt:{name}");
        if let Err(e) = stsd_protocol::check_tool_name(&served) {
            withheld.push(self.withheld(&label, &served, e.to_string(), Vec::new()));
            return None;
        }
        let hits = self.scan(&label, name, p, events);
        if let Some(why) = self.verdict(&label, p, &hits, events) {
            withheld.push(self.withheld(&label, &served, why, hits));
            return None;
        }
        let mut listing = p.clone();
        listing["name"] = Value::from(served.clone());
        Some(ServedPrompt {
            name: served,
            upstream: self.u.id.clone(),
            prompt: name.to_string(),
            listing,
            hits,
        })
    }

    fn resource(
        &self,
        r: &Value,
        key: &str,
        kind: &str,
        withheld: &mut Vec<Withheld>,
        events: &mut Vec<RiskEvent>,
    ) -> Option<ServedResource> {
        let uri = r.get(key).and_then(Value::as_str)?;
        if let Some(prefixes) = &self.u.resources {
            if !prefixes.iter().any(|p| uri.starts_with(p.as_str())) {
                return None;
            }
        }
        let label = format!("{kind}:{uri}");
        let name = r.get("name").and_then(Value::as_str).unwrap_or(uri);
        let hits = self.scan(&label, name, r, events);
        if let Some(why) = self.verdict(&label, r, &hits, events) {
            withheld.push(self.withheld(&label, uri, why, hits));
            return None;
        }
        let mut listing = r.clone();
        listing["name"] = Value::from(default_alias(&self.u.id, name));
        Some(ServedResource {
            upstream: self.u.id.clone(),
            uri: uri.to_string(),
            listing,
            hits,
        })
    }

    /// The scan over every string of the listing; an event per hit.
    fn scan(&self, label: &str, name: &str, v: &Value, events: &mut Vec<RiskEvent>) -> Vec<Hit> {
        let hits = scan::scan_served(name, v, &[]);
        for h in &hits {
            events.push(RiskEvent::PoisoningHit {
                upstream: self.u.id.clone(),
                tool: label.to_string(),
                pattern: h.pattern,
                field: h.field.clone(),
                excerpt: h.excerpt.clone(),
                blocked: self.gw.block_on_poisoning,
            });
        }
        hits
    }

    /// The ledger's verdict on the item's listing and the scan's: why it is withheld, if it is.
    fn verdict(
        &self,
        label: &str,
        v: &Value,
        hits: &[Hit],
        events: &mut Vec<RiskEvent>,
    ) -> Option<String> {
        let id = format!("{}/{label}", self.u.id);
        let fp = ledger::fingerprint_item(v);
        let seen = look_up(self.ledger, &id, &fp, self.observe);
        if seen.status == ledger::Status::Mismatch {
            events.push(RiskEvent::HashLedgerMismatch {
                id: id.clone(),
                upstream: self.u.id.clone(),
                tool: label.to_string(),
                approved_fingerprint: seen.approved.clone(),
                observed_fingerprint: fp,
                state: seen.state,
            });
        }
        if seen.state != ledger::State::Active {
            return Some(format!(
                "{}: it changed since it was approved (or was revoked): stsd ledger approve {id}",
                seen.state.as_str()
            ));
        }
        if self.gw.block_on_poisoning && !hits.is_empty() {
            let names: Vec<&str> = hits.iter().map(|h| h.pattern.as_str()).collect();
            return Some(format!(
                "POISONING: {} ([gateway] block_on_poisoning)",
                names.join(", ")
            ));
        }
        None
    }

    fn withheld(&self, label: &str, served: &str, why: String, poisoning: Vec<Hit>) -> Withheld {
        Withheld {
            upstream: self.u.id.clone(),
            tool: label.to_string(),
            alias: served.to_string(),
            why,
            poisoning,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::template_matches;

    #[test]
    fn a_template_matches_the_uris_it_expands_to_and_no_other() {
        let t = "demo://resource/dynamic/text/{resourceId}";
        assert!(template_matches(t, "demo://resource/dynamic/text/7"));
        assert!(template_matches(t, "demo://resource/dynamic/text/a/b"));
        assert!(!template_matches(t, "demo://resource/dynamic/text/"));
        assert!(!template_matches(t, "demo://resource/dynamic/blob/7"));
        assert!(template_matches("file:///{path}.md", "file:///notes/x.md"));
        assert!(!template_matches(
            "file:///{path}.md",
            "file:///notes/x.txt"
        ));
        assert!(template_matches("{a}://{b}", "x://y"));
        assert!(!template_matches("broken{", "broken"));
    }
}
