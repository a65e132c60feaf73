//! Admin methods of the gateway: `stsd/upstream/list` (each upstream's connection, scores,
//! exposed and withheld tools) and the fingerprint ledger, `stsd/ledger/list`,
//! `stsd/ledger/approve`, `stsd/ledger/revoke`. An approval or a revocation re-publishes at
//! once (stsd's own tools and the upstreams' alike) and tells subscribed clients.

use super::codes::NO_SUCH;
use crate::service::Service;
use serde_json::{json, Value};

/// One gateway method; `republish` re-publishes the catalog and tells clients.
pub(super) fn call(
    service: &Service,
    method: &str,
    params: &Value,
    republish: &dyn Fn() -> Result<(), (i32, String)>,
) -> Result<Value, (i32, String)> {
    match method {
        "stsd/upstream/list" => Ok(upstreams(service)),
        "stsd/ledger/list" => {
            let ledger = service
                .ledger()
                .ok_or((NO_SUCH, "this daemon keeps no ledger".to_string()))?;
            let entries: Vec<Value> = ledger
                .list()
                .into_iter()
                .map(|(id, e)| {
                    let mut v = serde_json::to_value(&e).unwrap_or(Value::Null);
                    v["id"] = json!(id);
                    v
                })
                .collect();
            Ok(json!({"entries": entries}))
        }
        "stsd/ledger/approve" | "stsd/ledger/revoke" => {
            let id = params.get("id").and_then(Value::as_str).ok_or((
                -32602,
                "params: {\"id\": \"<upstream>/<tool>\" or \"stsd/<tool>\"}".to_string(),
            ))?;
            let ledger = service
                .ledger()
                .ok_or((NO_SUCH, "this daemon keeps no ledger".to_string()))?;
            let approve = method == "stsd/ledger/approve";
            let r = if approve {
                ledger.approve(id)
            } else {
                ledger.revoke(id)
            };
            r.map_err(|e| (NO_SUCH, e))?;
            tracing::info!(id, approve, "ledger decision");
            // Re-publish both halves: the id may name an own spec or an upstream tool.
            republish()?;
            if let Some(gw) = service.gateway() {
                gw.recompute();
            }
            Ok(json!({"id": id, "state": ledger.get(id).map(|e| e.state.as_str())}))
        }
        other => Err((-32601, format!("no admin method {other}"))),
    }
}

/// Every upstream: how it is connected, its server score, its tools served and withheld.
fn upstreams(service: &Service) -> Value {
    match service.gateway() {
        Some(gw) => gw.report(),
        None => json!({"upstreams": []}),
    }
}

/// The wrapped tools as `stsd/tools/list` entries.
pub(super) fn tool_entries(service: &Service) -> Vec<Value> {
    let mut out: Vec<Value> = service
        .wrapped()
        .iter()
        .map(|t| {
            json!({
                "name": t.alias,
                "state": "ACTIVE",
                "riskLevel": t.composed.level.as_str(),
                "toolId": t.ledger_id,
                "upstream": t.upstream,
                "approval": {"required": t.approval.required,
                             "source": t.approval.source.as_str()},
            })
        })
        .collect();
    if let Some(gw) = service.gateway() {
        for w in &gw.exposed().withheld {
            out.push(
                json!({"name": w.alias, "state": "WITHHELD", "upstream": w.upstream,
                            "reason": w.why}),
            );
        }
    }
    out
}
