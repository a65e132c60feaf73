//! The store as one JSON document (`stsd store export|import`): a backup, or a move between
//! backends. Documents (tool versions, ledger entries) are kept as the JSON they are.

use super::rows::Old;
use super::Store;
use serde_json::{json, Value};

/// The document's format: its first key, checked on import.
pub const FORMAT: &str = "stsd-state/1";

fn doc_of(bytes: &[u8], what: &str) -> Result<Value, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("{what}: not JSON in the store: {e}"))
}

/// Everything the store holds that outlives a call: the managed tools, their history, the
/// switches, the ledger, the HTTP token digests, the upstreams added at run
/// time (spent approval states expire within minutes and are left out).
pub fn export(store: &Store) -> Result<Value, String> {
    let tools: Vec<Value> = store
        .tools()?
        .into_iter()
        .map(|(name, doc)| Ok(json!({"name": name, "doc": doc_of(&doc, &name)?})))
        .collect::<Result<_, String>>()?;
    let history: Vec<Value> = store
        .all_history()?
        .into_iter()
        .map(|(name, ms, doc)| {
            Ok(json!({"name": name, "retiredMs": ms, "doc": doc_of(&doc, &name)?}))
        })
        .collect::<Result<_, String>>()?;
    let (entries, servers) = store.ledger()?;
    let ledger: Vec<Value> = entries
        .into_iter()
        .map(|(id, e)| Ok(json!({"id": id, "entry": doc_of(e.as_bytes(), &id)?})))
        .collect::<Result<_, String>>()?;
    let servers: Vec<Value> = servers
        .into_iter()
        .map(|(id, ms)| json!({"id": id, "lastUsedMs": ms}))
        .collect();
    Ok(json!({
        "format": FORMAT,
        "exportedMs": crate::store::now_ms(),
        "tools": tools,
        "history": history,
        "disabled": store.disabled()?,
        "ledger": ledger,
        "servers": servers,
        "tokens": store.tokens()?.into_iter()
            .map(|(name, digest)| json!({"name": name, "sha256": digest}))
            .collect::<Vec<_>>(),
        "upstreams": store.upstreams()?.into_iter()
            .map(|(id, config)| Ok(json!({"id": id, "config": doc_of(config.as_bytes(), &id)?})))
            .collect::<Result<Vec<_>, String>>()?,
    }))
}

fn items<'a>(doc: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    doc[key].as_array().into_iter().flatten()
}

fn text(v: &Value, key: &str, what: &str) -> Result<String, String> {
    v[key]
        .as_str()
        .map(String::from)
        .ok_or_else(|| format!("{what}: no \"{key}\" string in {v}"))
}

fn bytes(v: &Value) -> Result<Vec<u8>, String> {
    serde_json::to_vec_pretty(v).map_err(|e| e.to_string())
}

/// Brings a document [`export`] wrote into `store`, in one transaction; only into a store
/// that holds no state yet. Says what it brought.
pub fn import(store: &Store, doc: &Value) -> Result<String, String> {
    if doc["format"] != FORMAT {
        return Err(format!(
            "not a state export (\"format\" is {}, expected {FORMAT:?})",
            doc["format"]
        ));
    }
    let mut old = Old::default();
    for t in items(doc, "tools") {
        old.tools
            .push((text(t, "name", "tools")?, bytes(&t["doc"])?));
    }
    for h in items(doc, "history") {
        old.history.push((
            text(h, "name", "history")?,
            bytes(&h["doc"])?,
            h["retiredMs"].as_i64(),
        ));
    }
    for d in items(doc, "disabled") {
        old.disabled
            .push(d.as_str().ok_or("disabled: not a name")?.to_string());
    }
    for l in items(doc, "ledger") {
        old.ledger
            .push((text(l, "id", "ledger")?, l["entry"].to_string()));
    }
    for s in items(doc, "servers") {
        let ms = s["lastUsedMs"].as_i64().ok_or("servers: no lastUsedMs")?;
        old.servers.push((text(s, "id", "servers")?, ms));
    }
    for t in items(doc, "tokens") {
        old.tokens
            .push((text(t, "name", "tokens")?, text(t, "sha256", "tokens")?));
    }
    for u in items(doc, "upstreams") {
        old.upstreams
            .push((text(u, "id", "upstreams")?, u["config"].to_string()));
    }
    if !store.import(&old)? {
        return Err(format!(
            "{} holds state already (a daemon has started on it, or it was imported into): \
             import into a new store",
            store.path().display()
        ));
    }
    Ok(format!(
        "{} tools, {} earlier versions, {} switches, {} ledger entries, {} upstreams",
        old.tools.len(),
        old.history.len(),
        old.disabled.len(),
        old.ledger.len(),
        old.upstreams.len()
    ))
}
