//! The posture resolver, exactly as spec §10.2: baseline + sandboxOverrides -> toolSafety.

use crate::baseline::Config;
use crate::risk::{risk_level, RiskLevel};
use crate::tool_safety::{
    Capabilities, CategoryBlock, NetworkCapability, RuntimeBlock, ToolSafety, HELPER_FS,
    HELPER_HTTP, SHARED_VERSION,
};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use stsd_protocol::{Code, Diagnostic, NetworkMode, ToolSpec, Tri};

/// Per-call limits that come with a posture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Limits {
    #[serde(rename = "timeoutMs")]
    pub timeout_ms: u64,
    #[serde(rename = "maxSteps")]
    pub max_steps: u64,
    #[serde(rename = "memoryLimitBytes")]
    pub memory_limit_bytes: u64,
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
}

/// Everything the resolver decides for one spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolved {
    #[serde(rename = "toolSafety")]
    pub tool_safety: ToolSafety,
    #[serde(rename = "riskLevel")]
    pub risk: RiskLevel,
    /// The root the fs helper and the Landlock rules are confined to (step 8).
    #[serde(rename = "fsBasePath")]
    pub fs_base_path: PathBuf,
    /// The baseline's own lists when the spec overrides neither (every tool shares them,
    /// rather than keeping 17 strings of its own).
    #[serde(rename = "effectiveAllowClasses")]
    pub effective_allow: Arc<[String]>,
    #[serde(rename = "effectiveDenyClasses")]
    pub effective_deny: Arc<[String]>,
    pub limits: Limits,
}

/// `(base ∪ add) − remove`, keeping first-seen order so output is stable; `base` itself
/// when there is nothing to add or remove and it names no class twice.
fn merge(base: &Arc<[String]>, add: &[String], remove: &[String]) -> Arc<[String]> {
    let distinct = || base.iter().enumerate().all(|(i, c)| !base[..i].contains(c));
    if add.is_empty() && remove.is_empty() && distinct() {
        return base.clone();
    }
    let mut out: Vec<String> = Vec::with_capacity(base.len() + add.len());
    for c in base.iter().chain(add) {
        if !remove.contains(c) && !out.contains(c) {
            out.push(c.clone());
        }
    }
    out.into()
}

/// Absolute, with no `.` or `..` components: a path whose meaning does not depend on
/// normalisation. (Symlinks are dealt with when the path is opened.)
pub fn is_plain_absolute(p: &std::path::Path) -> bool {
    use std::path::Component;
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Resolves one spec. The only failures are RESOLVER_REJECT diagnostics.
pub fn resolve(spec: &ToolSpec, config: &Config) -> Result<Resolved, Diagnostic> {
    let b = &config.baseline;
    let o = &spec.sandbox_overrides;

    // Steps 1 to 3: class lists and their disjointness.
    let effective_allow = merge(
        &b.allow_classes,
        &o.add_allow_classes,
        &o.remove_allow_classes,
    );
    let effective_deny = merge(&b.deny_classes, &o.add_deny_classes, &o.remove_deny_classes);
    let overlap: Vec<&String> = effective_allow
        .iter()
        .filter(|c| effective_deny.contains(c))
        .collect();
    if !overlap.is_empty() {
        let at = if overlap.iter().any(|c| o.add_allow_classes.contains(c)) {
            "/sandboxOverrides/addAllowClasses"
        } else {
            "/sandboxOverrides/addDenyClasses"
        };
        return Err(Diagnostic::error(
            Code::ResolverReject,
            at,
            format!(
                "allow and deny class lists overlap after the merge with the baseline (§10.1): {overlap:?}; remove each class from one side"
            ),
        ));
    }

    // Steps 4 to 8: tristate coalesce and hosts.
    let mode = o.network_mode.or_inherit(b.network_mode);
    let hosts = if mode == NetworkMode::Allowlist {
        let mut hosts: Vec<String> = Vec::new();
        for h in o.hosts_allow.iter().chain(&b.allowed_hosts) {
            if !hosts.iter().any(|x| x.eq_ignore_ascii_case(h)) {
                hosts.push(h.clone());
            }
        }
        hosts
    } else {
        Vec::new()
    };
    let file_read = o.file_read.or_inherit(b.file_read);
    let file_write = o.file_write.or_inherit(b.file_write);
    let fs_base_path = match &o.fs_base_path {
        Tri::Set(p) => {
            let p = PathBuf::from(p);
            let reject = |why: String| {
                Diagnostic::error(Code::ResolverReject, "/sandboxOverrides/fsBasePath", why)
            };
            if !is_plain_absolute(&p) {
                return Err(reject(format!(
                    "fsBasePath {:?} must be an absolute path without `.` or `..` (or null to inherit the baseline)",
                    p.display().to_string()
                )));
            }
            let roots = b.base_roots();
            if !roots.iter().any(|r| p.starts_with(r)) {
                return Err(reject(format!(
                    "fsBasePath {:?} is outside the roots the operator allows ({}); add a root to [baseline] allowed_base_roots to permit it",
                    p.display().to_string(),
                    roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ")
                )));
            }
            p
        }
        Tri::Absent | Tri::Null => b.fs_base_path(),
    };
    let destructive = o.destructive.unwrap_or(false);

    // Step 9.
    let tool_safety = ToolSafety {
        version: SHARED_VERSION.clone(),
        runtime: RuntimeBlock {
            id: config.runtime.id.clone(),
            min_version: config.runtime.min_version.clone(),
            ecma_version: config.runtime.ecma_version.clone(),
            java_interop: false,
            helpers: helpers(spec, mode, file_read || file_write),
            console: true,
        },
        category: CategoryBlock {
            source: stored_category_source(spec)
                .map(Arc::from)
                .unwrap_or_else(|| config.runtime.category_source.clone()),
            id: spec.category.clone(),
        },
        capabilities: Capabilities {
            network: NetworkCapability { mode, hosts },
            file_read,
            file_write,
            destructive,
        },
    };
    let risk = risk_level(&tool_safety, spec, b);
    Ok(Resolved {
        tool_safety,
        risk,
        fs_base_path,
        effective_allow,
        effective_deny,
        limits: Limits {
            timeout_ms: b.timeout_seconds * 1000,
            max_steps: b.max_steps,
            memory_limit_bytes: b.memory_limit_mib * 1024 * 1024,
        },
    })
}

/// `runtime.helpers`: the capability-gated helpers the posture grants (`safety.http/v1`,
/// `safety.fs/v1`), then the ungated helper groups the author declared in the stored block
/// (crypto, encoding, parser), in their order. A gated helper the author declared but the
/// posture does not grant is dropped: the block records what is enforced, not what was asked.
fn helpers(spec: &ToolSpec, mode: NetworkMode, file_access: bool) -> Vec<String> {
    let mut out = Vec::new();
    if mode != NetworkMode::Blocked {
        out.push(HELPER_HTTP.to_string());
    }
    if file_access {
        out.push(HELPER_FS.to_string());
    }
    let declared = spec
        .tool_safety
        .as_ref()
        .and_then(|ts| ts.pointer("/runtime/helpers"))
        .and_then(|h| h.as_array());
    for h in declared.into_iter().flatten().filter_map(|h| h.as_str()) {
        let gated = h.starts_with("safety.http/") || h.starts_with("safety.fs/");
        if !gated && !out.iter().any(|x| x == h) {
            out.push(h.to_string());
        }
    }
    out
}

fn stored_category_source(spec: &ToolSpec) -> Option<String> {
    spec.tool_safety
        .as_ref()?
        .pointer("/category/source")?
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}
