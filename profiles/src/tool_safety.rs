//! The resolved `toolSafety` block (spec §10.3): what stsd commits to enforce for a tool, written
//! verbatim into every audit record.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, LazyLock};
use stsd_protocol::NetworkMode;

pub const TOOL_SAFETY_VERSION: &str = "1.0";

/// [`TOOL_SAFETY_VERSION`], one copy for every tool's `toolSafety`.
pub static SHARED_VERSION: LazyLock<Arc<str>> = LazyLock::new(|| TOOL_SAFETY_VERSION.into());
pub const HELPER_HTTP: &str = "safety.http/v1";
pub const HELPER_FS: &str = "safety.fs/v1";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSafety {
    /// This and the runtime's identity are the same for every tool: shared, not copied.
    pub version: Arc<str>,
    pub runtime: RuntimeBlock,
    pub category: CategoryBlock,
    pub capabilities: Capabilities,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeBlock {
    pub id: Arc<str>,
    pub min_version: Arc<str>,
    pub ecma_version: Arc<str>,
    /// Always false: stsd's engine has no host class access at all.
    pub java_interop: bool,
    pub helpers: Vec<String>,
    pub console: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryBlock {
    pub source: Arc<str>,
    pub id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub network: NetworkCapability,
    pub file_read: bool,
    pub file_write: bool,
    /// Written only when true, as the reference catalog does.
    #[serde(default, skip_serializing_if = "is_false")]
    pub destructive: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkCapability {
    pub mode: NetworkMode,
    pub hosts: Vec<String>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ToolSafety {
    pub fn network_mode(&self) -> NetworkMode {
        self.capabilities.network.mode
    }

    pub fn has_file_access(&self) -> bool {
        self.capabilities.file_read || self.capabilities.file_write
    }
}
