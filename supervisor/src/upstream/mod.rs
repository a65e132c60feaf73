//! The governed gateway (seed 001): external MCP servers (upstreams) connected, confined,
//! scored, scanned, fingerprinted and re-exposed as wrapped tools beside stsd's own.
//!
//! - `risk`: server and tool scores, floors, composition, HITL mitigation.
//! - `scan`: the description-poisoning scan.
//! - `ledger`: the fingerprint ledger (NEW / UNCHANGED / MISMATCH), persisted.
//! - `shadow`: the composition shadowing rules R1-R3.
//! - `events`: the structured risk events (ServerRiskComputed, ...), logged and audited.
//! - `client`: one connection to one upstream (rmcp client), restarted with backoff.
//! - `proxy`: the egress proxy a networked upstream reaches the world through.
//! - `spawn`: how a stdio upstream is started, confined (`stsd upstream-exec`).
//! - `identity`: the uid each stdio upstream runs as (one of its own, when root).
//! - `budget`: the workspace's byte budget (a tmpfs of its own, when root).

pub mod budget;
pub mod call;
pub mod client;
pub mod events;
pub mod expose;
pub mod gateway;
pub mod identity;
pub mod ledger;
pub mod preview;
pub mod proxy;
pub mod risk;
pub mod scan;
pub mod shadow;
pub mod sources;
pub mod spawn;

pub use gateway::Gateway;
