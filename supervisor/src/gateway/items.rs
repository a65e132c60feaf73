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
    /// The upstream's `resources` prefixes (None: all): a URI read through a template must
    /// fit them too, not only the template itself.
    pub prefixes: Option<Vec<String>>,
}

impl ServedResource {
    fn allows(&self, uri: &str) -> bool {
        self.prefixes
            .as_ref()
            .is_none_or(|ps| ps.iter().any(|p| uri.starts_with(p.as_str())))
    }
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
        if has_dot_segment(uri) {
            return Err(format!(
                "{uri} has a `..` segment: it is read from no upstream"
            ));
        }
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
            .filter(|t| t.allows(uri) && template_matches(&t.uri, uri))
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

/// The longest URI and template matched (longer ones match nothing).
const MAX_URI: usize = 8 * 1024;
const MAX_TEMPLATE: usize = 1024;

/// Whether `uri` is one of the URIs RFC 6570 `template` expands to: each `{...}` expression
/// matches one character or more, literals match themselves, in order. Wildcard matching
/// (an expression is `?*`) with one backtrack point, so O(|uri| x |template|) at worst, on
/// bounded lengths: a hostile URI or template cannot make it exponential.
pub fn template_matches(template: &str, uri: &str) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum Tok {
        Char(char),
        One,
        Star,
    }
    if uri.len() > MAX_URI || template.len() > MAX_TEMPLATE {
        return false;
    }
    let mut toks = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        toks.extend(rest[..open].chars().map(Tok::Char));
        let Some(close) = rest[open..].find('}') else {
            return false;
        };
        toks.push(Tok::One);
        toks.push(Tok::Star);
        rest = &rest[open + close + 1..];
    }
    toks.extend(rest.chars().map(Tok::Char));
    let s: Vec<char> = uri.chars().collect();
    let (mut p, mut i) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        match toks.get(p) {
            Some(Tok::Char(c)) if *c == s[i] => {
                p += 1;
                i += 1;
            }
            Some(Tok::One) => {
                p += 1;
                i += 1;
            }
            Some(Tok::Star) => {
                star = Some((p, i));
                p += 1;
            }
            _ => match star {
                Some((sp, si)) => {
                    p = sp + 1;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    while toks.get(p) == Some(&Tok::Star) {
        p += 1;
    }
    p == toks.len()
}

/// A URI with a `..` path segment is read from nowhere: a prefix or a template must not be
/// escaped by one.
pub fn has_dot_segment(uri: &str) -> bool {
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    path.split('/')
        .any(|seg| seg == ".." || seg.eq_ignore_ascii_case("%2e%2e"))
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
    // One served name, two prompts (`a` with `b__c`, `a__b` with `c`): neither is served.
    let mut names = std::collections::BTreeMap::<String, Vec<String>>::new();
    for p in &out.prompts {
        names
            .entry(p.name.clone())
            .or_default()
            .push(p.upstream.clone());
    }
    out.prompts.retain(|p| {
        let by = &names[&p.name];
        if by.len() < 2 {
            return true;
        }
        out.withheld.push(Withheld {
            upstream: p.upstream.clone(),
            tool: format!("prompt:{}", p.prompt),
            alias: p.name.clone(),
            why: format!(
                "NAME_COLLISION: {} is the served name of prompts of upstreams {}",
                p.name,
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
            prefixes: self.u.resources.clone(),
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
        let seen = look_up(self.ledger, &id, &fp, Some(v), self.observe);
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
        super::vocab::refusal(&seen, &id, "it", hits, self.gw.block_on_poisoning)
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
    use super::{template_matches, MAX_URI};

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

    #[test]
    fn a_hostile_template_or_uri_costs_no_more_than_their_lengths() {
        let t = "{a}{b}{c}{d}{e}{f}{g}{h}x";
        let uri = "y".repeat(8000);
        // Backtracking over every split point would not return here for ages; the
        // wildcard match answers at once.
        assert!(!template_matches(t, &uri));
        assert!(!template_matches("{a}", &"z".repeat(MAX_URI + 1)));
        assert!(super::has_dot_segment("file:///docs/../etc/passwd"));
        assert!(!super::has_dot_segment("file:///docs/a..b"));
    }
}
