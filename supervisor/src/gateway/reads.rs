//! Requests for what upstreams serve besides tools, routed by the exposure (see `items`):
//! `resources/read`, `prompts/get`, `completion/complete`, `resources/subscribe`. Each reply
//! is bounded by its upstream's `max_output_bytes` (the connection checks), has its
//! upstream's secrets masked, and, for a prompt, is scanned for poisoning once more (the
//! text a model will read, which the listing did not show): a hit is reported in `_meta`,
//! and refused under `[gateway] block_on_poisoning`.

use super::front::{Gateway, Upstream};
use rmcp::model::{CompleteRequestParams, Reference};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use stsd_protocol::Code;

/// What a read reached: the upstream, and the reply's size (for the audit record).
pub struct Read {
    pub upstream: String,
    pub value: Value,
    pub bytes: usize,
}

type Failed = (Code, String);

impl Gateway {
    fn live(&self, id: &str) -> Result<(Arc<Upstream>, Arc<super::client::Connection>), Failed> {
        let u = self
            .upstream(id)
            .ok_or((Code::UpstreamUnavailable, format!("no upstream {id}")))?;
        let conn = u.conn.clone().ok_or_else(|| {
            (
                Code::UpstreamUnavailable,
                u.error.clone().unwrap_or_else(|| "not set up".into()),
            )
        })?;
        Ok((u, conn))
    }

    /// `resources/read`: from the upstream that serves `uri`.
    pub async fn read_resource(&self, uri: &str) -> Result<Read, Failed> {
        let id = self
            .exposed()
            .items
            .route(uri)
            .map(str::to_string)
            .map_err(|e| (Code::InvalidInput, e))?;
        let (u, conn) = self.live(&id)?;
        let _counted = super::front::InCall::new(&u.calls);
        let value = conn
            .read_resource(uri, Duration::from_millis(u.cfg.timeout_ms()))
            .await
            .map_err(|e| unmasked(&u, e))?;
        Ok(masked(&u, value))
    }

    /// `prompts/get` of the served prompt `name`.
    pub async fn get_prompt(
        &self,
        name: &str,
        arguments: Option<Map<String, Value>>,
    ) -> Result<Read, Failed> {
        let exposed = self.exposed();
        let p = exposed
            .items
            .prompt(name)
            .ok_or_else(|| (Code::InvalidInput, format!("no prompt {name} is served")))?;
        let (u, conn) = self.live(&p.upstream)?;
        let _counted = super::front::InCall::new(&u.calls);
        let value = conn
            .get_prompt(
                &p.prompt,
                arguments,
                Duration::from_millis(u.cfg.timeout_ms()),
            )
            .await
            .map_err(|e| unmasked(&u, e))?;
        let mut read = masked(&u, value);
        let hits = super::scan::scan_served(name, &read.value, &[]);
        if !hits.is_empty() {
            let names: Vec<&str> = hits.iter().map(|h| h.pattern.as_str()).collect();
            if self.config().gateway.block_on_poisoning {
                return Err((
                    Code::UpstreamError,
                    format!(
                        "POISONING: the prompt's text trips {} ([gateway] block_on_poisoning)",
                        names.join(", ")
                    ),
                ));
            }
            read.value["_meta"] = serde_json::json!({"stsd/poisoning": hits});
        }
        Ok(read)
    }

    /// The upstream a completion's reference goes to (for the policy before it is sent).
    pub fn completion_upstream(&self, r: &Reference) -> Option<String> {
        let exposed = self.exposed();
        match r {
            Reference::Prompt(p) => exposed.items.prompt(&p.name).map(|p| p.upstream.clone()),
            Reference::Resource(t) => exposed
                .items
                .templates
                .iter()
                .find(|x| x.uri == t.uri)
                .map(|x| x.upstream.clone()),
            _ => None,
        }
    }

    /// `completion/complete`: a served prompt's reference is renamed to the upstream's own;
    /// a resource template's goes to the upstream whose template it is.
    pub async fn complete(&self, mut params: CompleteRequestParams) -> Result<Read, Failed> {
        let exposed = self.exposed();
        let id = match &mut params.r#ref {
            Reference::Prompt(p) => {
                let served = exposed.items.prompt(&p.name).ok_or_else(|| {
                    (
                        Code::InvalidInput,
                        format!("no prompt {} is served", p.name),
                    )
                })?;
                p.name = served.prompt.clone();
                served.upstream.clone()
            }
            Reference::Resource(r) => exposed
                .items
                .templates
                .iter()
                .find(|t| t.uri == r.uri)
                .map(|t| t.upstream.clone())
                .ok_or_else(|| {
                    (
                        Code::InvalidInput,
                        format!("no template {} is served", r.uri),
                    )
                })?,
            _ => return Err((Code::InvalidInput, "an unknown kind of reference".into())),
        };
        if !exposed.items.completions.contains(&id) {
            return Ok(Read {
                upstream: id,
                value: serde_json::json!({"completion": {"values": [], "hasMore": false}}),
                bytes: 0,
            });
        }
        let (u, conn) = self.live(&id)?;
        let _counted = super::front::InCall::new(&u.calls);
        let value = conn
            .complete(params, Duration::from_millis(u.cfg.timeout_ms()))
            .await
            .map_err(|e| unmasked(&u, e))?;
        Ok(masked(&u, value))
    }

    /// A session subscribes to (or leaves) `uri`: the upstream serving it is asked on the
    /// first subscription and told on the last one's end.
    pub async fn subscribe(&self, uri: &str, on: bool) -> Result<(), Failed> {
        // Leaving is counted first, whatever now serves the URI: a count must never outlive
        // the sessions it counts.
        if !on {
            let last = {
                let mut subs = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
                match subs.get_mut(uri) {
                    Some(n) if *n > 1 => {
                        *n -= 1;
                        false
                    }
                    Some(_) => {
                        subs.remove(uri);
                        true
                    }
                    None => false,
                }
            };
            let serving = self.exposed().items.route(uri).map(str::to_string);
            return match (last, serving) {
                (true, Ok(id)) if self.exposed().items.subscribe.contains(&id) => {
                    let (u, conn) = self.live(&id)?;
                    conn.subscribe(uri, false, Duration::from_millis(u.cfg.timeout_ms()))
                        .await
                        .map_err(|e| unmasked(&u, e))
                }
                _ => Ok(()),
            };
        }
        let id = {
            let exposed = self.exposed();
            let id = exposed
                .items
                .route(uri)
                .map(str::to_string)
                .map_err(|e| (Code::InvalidInput, e))?;
            if !exposed.items.subscribe.contains(&id) {
                return Err((
                    Code::UpstreamError,
                    format!("upstream {id} takes no resource subscriptions"),
                ));
            }
            id
        };
        let first = {
            let mut subs = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
            let n = subs.entry(uri.to_string()).or_insert(0);
            *n += 1;
            *n == 1
        };
        if !first {
            return Ok(());
        }
        let asked = match self.live(&id) {
            Ok((u, conn)) => conn
                .subscribe(uri, true, Duration::from_millis(u.cfg.timeout_ms()))
                .await
                .map_err(|e| unmasked(&u, e)),
            Err(e) => Err(e),
        };
        if asked.is_err() {
            // The upstream did not take it: this session is not counted (a later one asks
            // again).
            let mut subs = self.subscribed.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = subs.get_mut(uri) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    subs.remove(uri);
                }
            }
        }
        asked
    }
}

/// A failure's message with the upstream's secrets masked (an upstream's error text may
/// echo what it was configured with).
fn unmasked(u: &Upstream, (code, message): Failed) -> Failed {
    (code, u.masks().mask(&message))
}

/// The reply with the upstream's secrets masked in every string, and its size.
fn masked(u: &Upstream, value: Value) -> Read {
    let value = crate::call::vocab::mask_value(&value, &u.masks());
    let bytes = serde_json::to_vec(&value).map(|v| v.len()).unwrap_or(0);
    Read {
        upstream: u.cfg.id.clone(),
        value,
        bytes,
    }
}
