//! An upstream's resources, resource templates and prompts (as JSON, the way they are
//! scanned and fingerprinted), listed with its tools when its capabilities say it has them:
//! all pages, bounded like the tool list. A server that lists tools but fails to list these
//! is served without them (logged), not dropped.

use super::Options;
use rmcp::model::PaginatedRequestParams;
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;

/// Pages and entries past these are refused (a hostile server could page forever).
const MAX_PAGES: usize = 64;
const MAX_ITEMS: usize = 10_000;

/// What an upstream offers besides tools.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Items {
    pub resources: Vec<Value>,
    pub templates: Vec<Value>,
    pub prompts: Vec<Value>,
    /// It answers `completion/complete`.
    pub completions: bool,
    /// It takes `resources/subscribe`.
    pub subscribe: bool,
}

/// Collects the pages `page(cursor)` gives: (entries as JSON, next cursor).
async fn paged<F, Fut>(what: &str, mut page: F) -> Result<Vec<Value>, String>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<Value>, Option<String>), String>>,
{
    let mut all = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let (items, next) = page(cursor).await.map_err(|e| format!("{what}: {e}"))?;
        all.extend(items);
        if all.len() > MAX_ITEMS {
            return Err(format!("{what}: more than {MAX_ITEMS} entries"));
        }
        cursor = next;
        if cursor.is_none() {
            return Ok(all);
        }
    }
    Err(format!("{what}: more than {MAX_PAGES} pages"))
}

fn json_all<T: serde::Serialize>(v: &[T]) -> Vec<Value> {
    v.iter()
        .filter_map(|x| serde_json::to_value(x).ok())
        .collect()
}

fn params(cursor: Option<String>) -> Option<PaginatedRequestParams> {
    Some(PaginatedRequestParams::default().with_cursor(cursor))
}

/// Lists what the upstream's capabilities announce, within the connect timeout.
pub(super) async fn list(peer: &Peer<RoleClient>, opts: &Options) -> Result<Items, String> {
    let Some(info) = peer.peer_info() else {
        return Ok(Items::default());
    };
    let caps = info.capabilities.clone();
    let all = async {
        let mut items = Items {
            completions: caps.completions.is_some(),
            subscribe: caps
                .resources
                .as_ref()
                .and_then(|r| r.subscribe)
                .unwrap_or(false),
            ..Items::default()
        };
        if caps.resources.is_some() {
            items.resources = paged("resources/list", |c| async move {
                let p = peer
                    .list_resources(params(c))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((json_all(&p.resources), p.next_cursor))
            })
            .await?;
            items.templates = paged("resources/templates/list", |c| async move {
                let p = peer
                    .list_resource_templates(params(c))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((json_all(&p.resource_templates), p.next_cursor))
            })
            .await?;
        }
        if caps.prompts.is_some() {
            items.prompts = paged("prompts/list", |c| async move {
                let p = peer
                    .list_prompts(params(c))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((json_all(&p.prompts), p.next_cursor))
            })
            .await?;
        }
        Ok(items)
    };
    tokio::time::timeout(opts.connect_timeout, all)
        .await
        .map_err(|_| {
            format!(
                "listing resources and prompts did not finish within {} ms",
                opts.connect_timeout.as_millis()
            )
        })?
}
