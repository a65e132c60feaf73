//! The stsd supervisor as a library: spec store, lifecycle, and the `check` report. The `stsd`
//! binary is a thin CLI over it; integration tests in `tests/` use it directly.

pub mod admin;
pub mod admission;
pub mod approval;
pub mod audit;
pub mod bundled;
pub mod call;
pub mod catalog;
pub mod cgroup;
pub mod check;
pub mod config_file;
pub mod daemon;
pub mod egress;
pub mod exec;
pub mod gateway;
pub mod http;
pub mod lifecycle;
pub mod lint;
pub mod listener;
pub mod local_pass;
pub mod logs;
pub mod managed;
pub mod mcp;
pub mod mcp_items;
pub mod metrics;
pub mod paths;
pub mod policy;
pub mod rate;
pub mod refs;
pub mod scratch;
pub mod service;
pub mod state;
pub mod store;
pub mod systemd;
pub mod transport;
pub mod workspace;
