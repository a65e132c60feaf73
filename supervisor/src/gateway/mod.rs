//! The gateway (seed 001): external MCP servers, called upstreams, connected, confined,
//! scored, scanned, fingerprinted and re-exposed as wrapped tools beside stsd's own. One name
//! for the subsystem: the gateway; an upstream is a server it connects to, a wrapped tool
//! one of an upstream's tools as the gateway serves it.
//!
//! This file is its one front: the rest of stsd (and the binary, and the tests) use the
//! names re-exported here, never a module inside.
//!
//! - `front`: [`Gateway`], the running gateway: its upstreams, its exposure, its calls.
//! - `sources`: which upstreams a config and its toolsets documents declare.
//! - `risk`: server and tool scores, floors, composition, HITL mitigation.
//! - `vocab`: a leaf: served names, what is withheld, the ledger's verdict.
//! - `scan`: the description-poisoning scan.
//! - `ledger`: the fingerprint ledger (NEW / UNCHANGED / MISMATCH), persisted (stsd's own
//!   tools are fingerprinted in it too).
//! - `shadow`: the composition shadowing rules R1-R3.
//! - `reads`: resources/read, prompts/get, completion/complete and subscriptions, routed.
//! - `items`: upstreams' resources, resource templates and prompts, governed as tools are.
//! - `expose`: what is served: the scores, the scan, the ledger and the rules applied.
//! - `events`: the structured risk events (ServerRiskComputed, ...), logged and audited.
//! - `call`: a wrapped tool's schema check, reply and `_meta`.
//! - `change`: upstreams added, updated, removed and restarted on a running gateway.
//! - `oauth`: the OAuth 2.1 client of HTTP upstreams: `stsd upstream login`, tokens kept
//!   0600 in the state directory, refreshed.
//! - `client`: one connection to one upstream (rmcp client), restarted with backoff.
//! - `proxy`: the egress proxy a networked upstream reaches the world through.
//! - `spawn`: how a stdio upstream is started, confined (`stsd upstream-exec`).
//! - `identity`: the uid each stdio upstream runs as (one of its own, when root).
//! - `budget`: the workspace's byte budget (a tmpfs of its own, when root).
//! - `registry`: an MCP registry `server.json` made into an `[[upstream]]` entry.
//! - `preview`: `stsd gateway preview`, the exposure a config would give, without serving.

mod budget;
mod call;
mod change;
mod client;
mod events;
mod expose;
mod front;
mod identity;
mod items;
mod ledger;
mod oauth;
mod preview;
mod proxy;
mod reads;
mod registry;
mod risk;
mod scan;
mod shadow;
mod sources;
mod spawn;
mod vocab;

pub use call::tool_meta;
pub(crate) use call::{check_against_input_schema, reply_of};
pub use change::Changes;
pub use client::ConnState;
pub use events::RiskEvent;
pub use expose::{config_risk, Exposed, WrappedTool};
pub use front::{ledger_path, EventSink, Gateway, ItemEvent};
pub use items::{ExposedItems, ServedPrompt, ServedResource};
pub use ledger::{fingerprint, Ledger, State as LedgerState, Status as LedgerStatus};
pub use preview::run as preview;
pub use reads::Read;
pub use registry::{entry as registry_entry, Prefer as RegistryPrefer};
pub use risk::floor_chip;
pub use scan::scan_text;
pub use sources::{declared, with_added};
// The confinement of a stdio upstream: `stsd upstream-exec` runs `exec_main`; the tests
// probe the rest directly.
pub use spawn::{command_as, exec_main, prepare_workspace, Ids, ProxyEnd};
