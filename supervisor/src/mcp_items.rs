//! The MCP methods for what upstreams serve besides tools, for `mcp::Handler`: the lists
//! (resources, resource templates, prompts) as the gateway exposes them, and the requests
//! (`resources/read`, `prompts/get`, `completion/complete`) through the item pipeline
//! (`call::item`: authorised, bounded, masked, audited). Subscriptions are kept per session
//! and passed to the upstream once per URI; their updates and the lists' changes reach
//! legacy sessions as notifications.

use crate::call::item::{self, ItemRequest};
use crate::call::Caller;
use crate::gateway::ItemEvent;
use crate::service::Service;
use rmcp::model::{
    CompleteRequestParams, CompleteResult, GetPromptRequestParams, GetPromptResult,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, Prompt,
    ReadResourceRequestParams, ReadResourceResult, Resource, ResourceTemplate,
    ResourceUpdatedNotificationParam,
};
use rmcp::service::Peer;
use rmcp::{ErrorData, RoleServer};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use stsd_protocol::Code;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// A failure as the client sees it: an unknown item is invalid params (MCP's resource "not
/// found" for a URI), the rest carry their code.
fn error((code, message): (Code, String)) -> ErrorData {
    match code {
        Code::InvalidInput => ErrorData::invalid_params(message, None),
        _ => ErrorData::internal_error(format!("{code}: {message}"), None),
    }
}

fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value, what: &str) -> Result<T, ErrorData> {
    serde_json::from_value(v).map_err(|e| {
        ErrorData::internal_error(
            format!("UPSTREAM_ERROR: the upstream's {what} does not parse: {e}"),
            None,
        )
    })
}

pub fn resources(service: &Service) -> ListResourcesResult {
    let list: Vec<Resource> = match service.gateway() {
        Some(gw) => gw
            .exposed()
            .items
            .resources
            .iter()
            .filter_map(|r| serde_json::from_value(r.listing.clone()).ok())
            .collect(),
        None => Vec::new(),
    };
    ListResourcesResult::with_all_items(list)
}

pub fn templates(service: &Service) -> ListResourceTemplatesResult {
    let list: Vec<ResourceTemplate> = match service.gateway() {
        Some(gw) => gw
            .exposed()
            .items
            .templates
            .iter()
            .filter_map(|r| serde_json::from_value(r.listing.clone()).ok())
            .collect(),
        None => Vec::new(),
    };
    ListResourceTemplatesResult::with_all_items(list)
}

pub fn prompts(service: &Service) -> ListPromptsResult {
    let list: Vec<Prompt> = match service.gateway() {
        Some(gw) => gw
            .exposed()
            .items
            .prompts
            .iter()
            .filter_map(|p| serde_json::from_value(p.listing.clone()).ok())
            .collect(),
        None => Vec::new(),
    };
    ListPromptsResult::with_all_items(list)
}

pub async fn read(
    service: &Service,
    caller: &Caller,
    p: ReadResourceRequestParams,
) -> Result<ReadResourceResult, ErrorData> {
    let v = item::serve(service, caller, ItemRequest::Read { uri: p.uri })
        .await
        .map_err(error)?;
    parse(v, "resource")
}

pub async fn prompt(
    service: &Service,
    caller: &Caller,
    p: GetPromptRequestParams,
) -> Result<GetPromptResult, ErrorData> {
    let req = ItemRequest::Prompt {
        name: p.name,
        arguments: p.arguments,
    };
    let v = item::serve(service, caller, req).await.map_err(error)?;
    parse(v, "prompt")
}

pub async fn complete(
    service: &Service,
    caller: &Caller,
    p: CompleteRequestParams,
) -> Result<CompleteResult, ErrorData> {
    let v = item::serve(service, caller, ItemRequest::Complete(Box::new(p)))
        .await
        .map_err(error)?;
    parse(v, "completion")
}

/// One session's resource subscriptions.
#[derive(Default)]
pub struct Subscriptions(Mutex<BTreeSet<String>>);

impl Subscriptions {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub async fn subscribe(
        &self,
        service: &Service,
        caller: &Caller,
        uri: String,
        on: bool,
    ) -> Result<(), ErrorData> {
        if on {
            item::may_subscribe(service, caller, &uri).map_err(error)?;
        }
        let gw = service
            .gateway()
            .ok_or_else(|| ErrorData::invalid_params(format!("no upstream serves {uri}"), None))?;
        // Once per session and URI: the gateway counts sessions.
        let changes = if on {
            self.lock().insert(uri.clone())
        } else {
            self.lock().remove(&uri)
        };
        if !changes {
            return Ok(());
        }
        let r = gw.subscribe(&uri, on).await;
        if r.is_err() && on {
            self.lock().remove(&uri);
        }
        r.map_err(error)
    }

    fn holds(&self, uri: &str) -> bool {
        self.lock().contains(uri)
    }

    /// The session ended: its subscriptions end too.
    async fn end(&self, service: &Service) {
        let all: Vec<String> = std::mem::take(&mut *self.lock()).into_iter().collect();
        if let Some(gw) = service.gateway() {
            for uri in all {
                let _ = gw.subscribe(&uri, false).await;
            }
        }
    }
}

/// Legacy sessions: the resource and prompt lists' changes and the session's subscribed
/// resources' updates, as notifications, until the session closes.
pub fn forward(
    service: Arc<Service>,
    peer: Peer<RoleServer>,
    subs: Arc<Subscriptions>,
    closed: CancellationToken,
) {
    let Some(gw) = service.gateway() else {
        return;
    };
    let mut rx = gw.item_events();
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                _ = closed.cancelled() => break,
                r = rx.recv() => match r {
                    Ok(ev) => ev,
                    Err(broadcast::error::RecvError::Lagged(_)) => ItemEvent::Resources,
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            };
            let sent = match ev {
                ItemEvent::Resources => peer.notify_resource_list_changed().await,
                ItemEvent::Prompts => peer.notify_prompt_list_changed().await,
                ItemEvent::Updated(uri) if subs.holds(&uri) => {
                    peer.notify_resource_updated(ResourceUpdatedNotificationParam::new(uri))
                        .await
                }
                ItemEvent::Updated(_) => Ok(()),
            };
            if sent.is_err() {
                break;
            }
        }
        subs.end(&service).await;
    });
}
