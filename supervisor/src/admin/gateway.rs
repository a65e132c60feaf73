//! Admin methods of the gateway: `stsd/upstream/list` (each upstream's connection, scores,
//! exposed and withheld tools) and the fingerprint ledger, `stsd/ledger/list`,
//! `stsd/ledger/approve`, `stsd/ledger/revoke`. An approval or a revocation re-publishes at
//! once (stsd's own tools and the upstreams' alike) and tells subscribed clients.
//!
//! `stsd/upstream/show` takes `{"id"}`: its entry as configured (references unresolved).
//! `stsd/upstream/expose` changes only an added upstream's exposure (see [`expose`]).
//!
//! Upstreams at run time ([`change`]): `stsd/upstream/add` and `stsd/upstream/update` take
//! `{"upstream": <an [[upstream]] entry as JSON>}`, `stsd/upstream/remove` and
//! `stsd/upstream/restart` take `{"id"}`. An added upstream is kept in the state store (every
//! replica on a shared one runs it too) and can be updated and removed the same way; one the
//! config declares is changed in the config (and a SIGHUP), only restarted here.
//!
//! An OAuth upstream's login: `stsd/upstream/login` takes `{"id", "redirect_uri"}` (a
//! loopback address the caller listens on) and answers the `authorization_url` to open;
//! `stsd/upstream/login_finish` takes `{"id", "callback_url"}` (where the browser came back
//! to), exchanges the code and connects the upstream again.

use super::codes::{GATE_FAILED, NO_SUCH};
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
        "stsd/upstream/show" => show(service, params),
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
            let seen = params.get("fingerprint").and_then(Value::as_str);
            let r = if approve {
                ledger.approve_seen(id, seen)
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

/// How long `add`, `update` and `restart` wait for the upstream's first tool list, so the
/// answer shows its scores and what it serves (a server still connecting then is reported
/// as such; it goes on connecting).
const SETTLE: std::time::Duration = std::time::Duration::from_secs(30);

/// One of the methods that change the upstreams (admins only; the caller checked).
pub(super) async fn change(
    service: &std::sync::Arc<Service>,
    method: &str,
    params: &Value,
) -> Result<Value, (i32, String)> {
    use stsd_profiles::upstream::UpstreamConfig;
    if method.starts_with("stsd/upstream/login") {
        return login(service, method, params).await;
    }
    if method == "stsd/upstream/expose" {
        return expose(service, params).await;
    }
    let store = service
        .store()
        .ok_or((-32601, "this daemon keeps no state store".to_string()))?;
    let in_config = |id: &str| service.declares_upstream(id);
    let stored = |id: &str| -> Result<bool, (i32, String)> {
        Ok(store
            .upstreams()
            .map_err(|e| (GATE_FAILED, e))?
            .iter()
            .any(|(i, _)| i == id))
    };
    let id_param = || {
        params
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or((-32602, "params: {\"id\": <upstream>}".to_string()))
    };
    let id = match method {
        "stsd/upstream/add" | "stsd/upstream/update" => {
            let entry = params.get("upstream").cloned().ok_or((
                -32602,
                "params: {\"upstream\": <an [[upstream]] entry as JSON>}".to_string(),
            ))?;
            let u: UpstreamConfig = serde_json::from_value(entry)
                .map_err(|e| (-32602, format!("the upstream entry: {e}")))?;
            u.check().map_err(|e| (-32602, e))?;
            let id = u.id.clone();
            let known = service.gateway().and_then(|g| g.upstream(&id)).is_some();
            if in_config(&id) {
                return Err((
                    GATE_FAILED,
                    format!(
                        "upstream {id} is declared in the config: change it there and send SIGHUP"
                    ),
                ));
            }
            if method == "stsd/upstream/add" && (known || stored(&id)?) {
                return Err((
                    GATE_FAILED,
                    format!("an upstream {id} exists already (use update)"),
                ));
            }
            if method == "stsd/upstream/update" && !stored(&id)? {
                return Err((
                    NO_SUCH,
                    format!("no upstream {id} was added at run time (add it first)"),
                ));
            }
            let text = serde_json::to_string(&u).map_err(|e| (GATE_FAILED, e.to_string()))?;
            store
                .upstream_put(&id, &text)
                .map_err(|e| (GATE_FAILED, e))?;
            crate::state::crash_point("upstream-committed");
            service
                .apply_upstreams()
                .await
                .map_err(|e| (GATE_FAILED, e))?;
            id
        }
        "stsd/upstream/remove" => {
            let id = id_param()?;
            if in_config(&id) {
                return Err((
                    GATE_FAILED,
                    format!(
                        "upstream {id} is declared in the config: remove it there and send SIGHUP"
                    ),
                ));
            }
            if !store.upstream_del(&id).map_err(|e| (GATE_FAILED, e))? {
                return Err((NO_SUCH, format!("no upstream {id} was added at run time")));
            }
            service
                .apply_upstreams()
                .await
                .map_err(|e| (GATE_FAILED, e))?;
            // Its OAuth credentials go with it (a later upstream of the same id signs in anew).
            if let Some(gw) = service.gateway() {
                gw.forget_credentials(&id);
            }
            return Ok(json!({"id": id, "removed": true}));
        }
        "stsd/upstream/restart" => {
            let id = id_param()?;
            let gw = service
                .gateway()
                .ok_or((NO_SUCH, format!("no upstream {id}")))?;
            gw.restart(&id).await.map_err(|e| (NO_SUCH, e))?;
            id
        }
        other => return Err((-32601, format!("no admin method {other}"))),
    };
    let gw = service
        .gateway()
        .ok_or((GATE_FAILED, "the gateway is not running".to_string()))?;
    gw.settle(&id, SETTLE).await;
    Ok(report_of(&gw, &id))
}

/// `stsd/upstream/expose`: changes only what decides which of an upstream's tools are served
/// and how, in its stored entry (added at run time; one the config declares is changed
/// there): `tools` (a list, or null for all), and per tool name in `aliases`,
/// `descriptions` and `approval`, a value to set or null to remove (names not mentioned
/// keep theirs), and `max_risk`. Everything else in the entry, its secrets included, stays
/// as stored and never passes through the caller.
async fn expose(service: &std::sync::Arc<Service>, params: &Value) -> Result<Value, (i32, String)> {
    use stsd_profiles::upstream::UpstreamConfig;
    let id = text_param(params, "id")?;
    let store = service
        .store()
        .ok_or((-32601, "this daemon keeps no state store".to_string()))?;
    if service.declares_upstream(&id) {
        return Err((
            GATE_FAILED,
            format!("upstream {id} is declared in the config: change it there and send SIGHUP"),
        ));
    }
    let stored = store.upstreams().map_err(|e| (GATE_FAILED, e))?;
    let text = stored
        .into_iter()
        .find(|(i, _)| *i == id)
        .map(|(_, t)| t)
        .ok_or((NO_SUCH, format!("no upstream {id} was added at run time")))?;
    let mut u: UpstreamConfig =
        serde_json::from_str(&text).map_err(|e| (GATE_FAILED, format!("stored entry: {e}")))?;
    if let Some(t) = params.get("tools") {
        u.tools = serde_json::from_value(t.clone()).map_err(|e| (-32602, format!("tools: {e}")))?;
    }
    let merge = |map: &mut std::collections::BTreeMap<String, String>, key: &str| {
        for (name, v) in params
            .get(key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            match v.as_str().map(str::trim).filter(|s| !s.is_empty()) {
                Some(s) => map.insert(name.clone(), s.to_string()),
                None => map.remove(name),
            };
        }
    };
    merge(&mut u.aliases, "aliases");
    merge(&mut u.descriptions, "descriptions");
    for (name, v) in params
        .get("approval")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        match v.as_bool() {
            Some(b) => u.approval.insert(name.clone(), b),
            None => u.approval.remove(name),
        };
    }
    if let Some(r) = params.get("max_risk") {
        u.max_risk =
            serde_json::from_value(r.clone()).map_err(|e| (-32602, format!("max_risk: {e}")))?;
    }
    u.check().map_err(|e| (-32602, e))?;
    let text = serde_json::to_string(&u).map_err(|e| (GATE_FAILED, e.to_string()))?;
    store
        .upstream_put(&id, &text)
        .map_err(|e| (GATE_FAILED, e))?;
    service
        .apply_upstreams()
        .await
        .map_err(|e| (GATE_FAILED, e))?;
    let gw = service
        .gateway()
        .ok_or((GATE_FAILED, "the gateway is not running".to_string()))?;
    gw.settle(&id, SETTLE).await;
    Ok(report_of(&gw, &id))
}

/// `stsd/upstream/login` and `stsd/upstream/login_finish` (see the module's comment).
async fn login(
    service: &std::sync::Arc<Service>,
    method: &str,
    params: &Value,
) -> Result<Value, (i32, String)> {
    let id = text_param(params, "id")?;
    let gw = service
        .gateway()
        .ok_or((NO_SUCH, format!("no upstream {id}")))?;
    if method == "stsd/upstream/login" {
        let redirect_uri = text_param(params, "redirect_uri")?;
        let url = gw
            .login_begin(&id, &redirect_uri)
            .await
            .map_err(|e| (GATE_FAILED, e))?;
        return Ok(json!({"id": id, "authorization_url": url}));
    }
    let callback = text_param(params, "callback_url")?;
    let scopes = gw
        .login_finish(&id, &callback)
        .await
        .map_err(|e| (GATE_FAILED, e))?;
    gw.settle(&id, SETTLE).await;
    let mut answer = report_of(&gw, &id);
    answer["scopes"] = json!(scopes);
    Ok(answer)
}

/// `{"id", "upstream"}`: upstream `id` as `stsd/upstream/list` shows it.
fn report_of(gw: &crate::gateway::Gateway, id: &str) -> Value {
    let report = gw.report();
    let entry = report["upstreams"]
        .as_array()
        .and_then(|l| l.iter().find(|u| u["id"] == id))
        .cloned()
        .unwrap_or(Value::Null);
    json!({"id": id, "upstream": entry})
}

fn text_param(params: &Value, name: &str) -> Result<String, (i32, String)> {
    params
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or((-32602, format!("params: {{\"id\", \"{name}\"}}")))
}

/// The methods [`change`] serves.
pub(super) const CHANGES: &[&str] = &[
    "stsd/upstream/add",
    "stsd/upstream/update",
    "stsd/upstream/remove",
    "stsd/upstream/restart",
    "stsd/upstream/login",
    "stsd/upstream/login_finish",
    "stsd/upstream/expose",
];

/// `stsd/upstream/preview`: an entry's server risk from its configuration alone (seed 001's
/// connection risk preview, the engine `stsd upstream check` uses), nothing connected.
pub(super) fn preview(service: &Service, params: &Value) -> Result<Value, (i32, String)> {
    use stsd_profiles::upstream::UpstreamConfig;
    let entry = params.get("upstream").cloned().ok_or((
        -32602,
        "params: {\"upstream\": <an [[upstream]] entry as JSON>}".to_string(),
    ))?;
    let u: UpstreamConfig =
        serde_json::from_value(entry).map_err(|e| (-32602, format!("the upstream entry: {e}")))?;
    u.check().map_err(|e| (-32602, e))?;
    let config = service.config();
    // Scored as it would be on connecting now: in use (seed 001's preview shows a
    // vendor-official HTTPS entry as L1, which a never-used server's doc point would not be).
    let now = crate::store::now_ms();
    let risk = crate::gateway::config_risk(&u, &config.gateway, Some(now), now);
    let mut v = serde_json::to_value(&risk).map_err(|e| (GATE_FAILED, e.to_string()))?;
    // The axes that wait on the live tool list (write capability, the tools' own scores).
    v["pending"] = json!(["the no-auth-write floor reads the tools' annotations"]);
    Ok(v)
}

/// Every upstream: how it is connected, its server score, its tools served and withheld.
fn upstreams(service: &Service) -> Value {
    let mut report = match service.gateway() {
        Some(gw) => gw.report(),
        None => json!({"upstreams": []}),
    };
    // Whether the config declares it (changed there) or it was added at run time (changed here).
    for u in report["upstreams"].as_array_mut().into_iter().flatten() {
        let id = u["id"].as_str().unwrap_or_default().to_string();
        u["declared"] = json!(service.declares_upstream(&id));
    }
    report
}

/// `stsd/upstream/show`: upstream `id`'s entry as configured (references unresolved: a
/// secret is its `${secret:NAME}`, never its value; a header or env value written in the
/// entry shows as "(set)"), and whether the config declares it.
fn show(service: &Service, params: &Value) -> Result<Value, (i32, String)> {
    let id = text_param(params, "id")?;
    let u = service
        .gateway()
        .and_then(|g| g.upstream(&id))
        .ok_or((NO_SUCH, format!("no upstream {id}")))?;
    let mut entry = serde_json::to_value(&*u.cfg).map_err(|e| (GATE_FAILED, e.to_string()))?;
    // A header or env value written in the entry itself (not a `${secret:..}` reference) may
    // be a credential: shown as set, never as written.
    for key in ["headers", "env"] {
        for (_, v) in entry[key].as_object_mut().into_iter().flatten() {
            if v.as_str().is_some_and(|s| !s.contains("${")) {
                *v = json!("(set)");
            }
        }
    }
    Ok(json!({"id": id, "entry": entry, "declared": service.declares_upstream(&id)}))
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
