//! The resolver (§10.2) and the Risk Level (§10.6), step by step.

use serde_json::{json, Value};
use std::path::PathBuf;
use stsd_profiles::{resolve, Config, RiskLevel};
use stsd_protocol::{validate_document, Code, NetworkMode, ToolSpec};

fn spec(overrides: Value) -> ToolSpec {
    let mut doc =
        json!({"name": "t", "code": "return 1", "codeType": "Javascript", "category": "MATH"});
    if !overrides.is_null() {
        doc["sandboxOverrides"] = overrides;
    }
    let v = validate_document(&doc);
    assert!(v.is_valid(), "{:?}", v.diagnostics);
    v.spec.unwrap_or_else(|| unreachable!())
}

fn risk(overrides: Value) -> RiskLevel {
    match resolve(&spec(overrides), &Config::default()) {
        Ok(r) => r.risk,
        Err(d) => panic!("rejected: {d}"),
    }
}

#[test]
fn no_overrides_is_the_baseline() {
    let r = resolve(&spec(Value::Null), &Config::default()).unwrap_or_else(|d| panic!("{d}"));
    let ts = serde_json::to_value(&r.tool_safety).unwrap_or_default();
    assert_eq!(
        ts,
        json!({
            "version": "1.0",
            "runtime": {"id": "stsd/quickjs", "minVersion": "0.1.0", "ecmaVersion": "2024",
                        "javaInterop": false, "helpers": [], "console": true},
            "category": {"source": "user", "id": "MATH"},
            "capabilities": {"network": {"mode": "blocked", "hosts": []}, "fileRead": false, "fileWrite": false}
        })
    );
    assert_eq!(r.risk, RiskLevel::L0);
    assert_eq!(r.limits.timeout_ms, 30_000);
    assert_eq!(r.limits.max_steps, 5_000_000);
    // An empty block is the same as no block (§10.1).
    let empty = resolve(&spec(json!({})), &Config::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(empty, r);
}

#[test]
fn tristate_null_inherits_and_explicit_false_clears_the_baseline() {
    let mut cfg = Config::default();
    cfg.baseline.file_read = true;
    cfg.baseline.network_mode = NetworkMode::Strict;
    let inherit = resolve(&spec(json!({"fileRead": null, "networkMode": null})), &cfg)
        .unwrap_or_else(|d| panic!("{d}"));
    assert!(inherit.tool_safety.capabilities.file_read);
    assert_eq!(inherit.tool_safety.network_mode(), NetworkMode::Strict);
    let cleared = resolve(
        &spec(json!({"fileRead": false, "networkMode": "blocked"})),
        &cfg,
    )
    .unwrap_or_else(|d| panic!("{d}"));
    assert!(!cleared.tool_safety.capabilities.file_read);
    assert_eq!(cleared.tool_safety.network_mode(), NetworkMode::Blocked);
    assert!(cleared.tool_safety.runtime.helpers.is_empty());
}

#[test]
fn hosts_are_resolved_only_in_allowlist_mode() {
    let mut cfg = Config::default();
    cfg.baseline.allowed_hosts = vec!["status.example.com".into()];
    let r = resolve(
        &spec(json!({"networkMode": "allowlist", "hostsAllow": ["api.upbit.com", "STATUS.example.com"]})),
        &cfg,
    )
    .unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(
        r.tool_safety.capabilities.network.hosts,
        ["api.upbit.com", "STATUS.example.com"]
    );
    assert_eq!(r.tool_safety.runtime.helpers, ["safety.http/v1"]);
    let strict = resolve(
        &spec(json!({"networkMode": "strict", "hostsAllow": ["a.com"]})),
        &cfg,
    )
    .unwrap_or_else(|d| panic!("{d}"));
    assert!(strict.tool_safety.capabilities.network.hosts.is_empty());
}

#[test]
fn base_path_override_and_its_absolute_rule() {
    let mut cfg = Config::default();
    cfg.baseline.allowed_base_roots = vec![PathBuf::from("/srv")];
    let r = resolve(
        &spec(json!({"fsBasePath": "/srv/data", "fileRead": true})),
        &cfg,
    )
    .unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(r.fs_base_path, PathBuf::from("/srv/data"));
    // Outside every allowed root, or not plain: rejected, whatever the spec asks.
    for bad in ["/", "/etc", "/root/.ssh", "/srv/../etc", "/srvx"] {
        let d = resolve(&spec(json!({"fsBasePath": bad, "fileRead": true})), &cfg).err();
        assert_eq!(d.map(|d| d.code), Some(Code::ResolverReject), "{bad}");
    }
    // Under the baseline's own base path is always allowed.
    let ws = Config::default().baseline.fs_base_path().join("project");
    let under = resolve(
        &spec(json!({"fsBasePath": ws.display().to_string()})),
        &Config::default(),
    );
    assert!(under.is_ok());
    assert_eq!(r.tool_safety.runtime.helpers, ["safety.fs/v1"]);
    let d = resolve(&spec(json!({"fsBasePath": "data"})), &Config::default()).err();
    let d = d.unwrap_or_else(|| panic!("relative base path accepted"));
    assert_eq!(
        (d.code, d.pointer.as_str()),
        (Code::ResolverReject, "/sandboxOverrides/fsBasePath")
    );
}

#[test]
fn allow_deny_overlap_after_the_merge_is_rejected() {
    // The override allows a class the baseline denies.
    let d = resolve(
        &spec(json!({"addAllowClasses": ["java.lang.System"]})),
        &Config::default(),
    )
    .err();
    let d = d.unwrap_or_else(|| panic!("overlap accepted"));
    assert_eq!(d.code, Code::ResolverReject);
    assert_eq!(d.pointer, "/sandboxOverrides/addAllowClasses");
    // The override denies a class the baseline allows.
    let d = resolve(
        &spec(json!({"addDenyClasses": ["java.util.*"]})),
        &Config::default(),
    )
    .err();
    assert_eq!(
        d.map(|d| d.pointer),
        Some("/sandboxOverrides/addDenyClasses".to_string())
    );
    // Removing it from deny first makes the same allow legal.
    assert!(resolve(
        &spec(json!({"addAllowClasses": ["java.lang.System"], "removeDenyClasses": ["java.lang.System"]})),
        &Config::default()
    )
    .is_ok());
}

/// A tool that overrides no class list shares the baseline's (17 strings per served tool
/// otherwise); one that does gets its own merged lists, first-seen order kept. Every tool
/// shares the runtime's identity strings.
#[test]
fn class_lists_are_the_baselines_unless_overridden() {
    let cfg = Config::default();
    let plain = resolve(&spec(Value::Null), &cfg).unwrap_or_else(|d| panic!("{d}"));
    assert!(std::sync::Arc::ptr_eq(
        &plain.effective_allow,
        &cfg.baseline.allow_classes
    ));
    assert!(std::sync::Arc::ptr_eq(
        &plain.effective_deny,
        &cfg.baseline.deny_classes
    ));

    let own = resolve(
        &spec(json!({"addAllowClasses": ["java.lang.System", "java.util.*"], "removeDenyClasses": ["java.lang.System"]})),
        &cfg,
    )
    .unwrap_or_else(|d| panic!("{d}"));
    let mut allow = cfg.baseline.allow_classes.to_vec();
    allow.push("java.lang.System".into());
    assert_eq!(&own.effective_allow[..], &allow[..]);
    let deny: Vec<String> = cfg
        .baseline
        .deny_classes
        .iter()
        .filter(|c| *c != "java.lang.System")
        .cloned()
        .collect();
    assert_eq!(&own.effective_deny[..], &deny[..]);
    assert!(!std::sync::Arc::ptr_eq(
        &own.effective_allow,
        &cfg.baseline.allow_classes
    ));

    // The runtime's identity and the toolSafety version are one copy for every tool.
    let ts = (&plain.tool_safety, &own.tool_safety);
    assert!(std::sync::Arc::ptr_eq(&ts.0.runtime.id, &cfg.runtime.id));
    assert!(std::sync::Arc::ptr_eq(
        &ts.1.runtime.min_version,
        &cfg.runtime.min_version
    ));
    assert!(std::sync::Arc::ptr_eq(
        &ts.1.runtime.ecma_version,
        &cfg.runtime.ecma_version
    ));
    assert!(std::sync::Arc::ptr_eq(
        &ts.0.category.source,
        &cfg.runtime.category_source
    ));
    assert!(std::sync::Arc::ptr_eq(&ts.0.version, &ts.1.version));
    assert_eq!(&*ts.0.version, "1.0");

    // A baseline that names a class twice is not shared as it is: the effective list names
    // each once.
    let mut twice = Config::default();
    twice.baseline.allow_classes =
        vec!["java.lang.*".to_string(), "java.lang.*".to_string()].into();
    let r = resolve(&spec(Value::Null), &twice).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(&r.effective_allow[..], &["java.lang.*".to_string()][..]);
}

#[test]
fn risk_from_capabilities() {
    assert_eq!(
        risk(json!({"networkMode": "allowlist", "hostsAllow": ["a.com"]})),
        RiskLevel::L3
    );
    assert_eq!(
        risk(json!({"networkMode": "allowlist", "hostsAllow": ["*"]})),
        RiskLevel::L4
    );
    assert_eq!(
        risk(json!({"networkMode": "allowlist", "hostsAllow": []})),
        RiskLevel::L0
    );
    assert_eq!(risk(json!({"networkMode": "strict"})), RiskLevel::L3);
    assert_eq!(risk(json!({"networkMode": "open"})), RiskLevel::L4);
    assert_eq!(risk(json!({"fileRead": true})), RiskLevel::L3);
    assert_eq!(
        risk(json!({"fileRead": true, "fileWrite": true})),
        RiskLevel::L4
    );
    assert_eq!(
        risk(json!({"fileWrite": true, "destructive": true})),
        RiskLevel::L5
    );
}

#[test]
fn risk_from_class_list_escalations() {
    // Removing a critical class from the baseline denylist.
    assert_eq!(
        risk(json!({"removeDenyClasses": ["java.lang.Runtime"]})),
        RiskLevel::L5
    );
    // One or two non-critical removals -> L3, three or more -> L4.
    assert_eq!(
        risk(json!({"removeDenyClasses": ["java.lang.Thread"]})),
        RiskLevel::L3
    );
    assert_eq!(
        risk(
            json!({"removeDenyClasses": ["java.lang.Thread", "java.lang.ThreadGroup", "java.util.spi.*"]})
        ),
        RiskLevel::L4
    );
    // Removing a class the baseline never denied is no escalation.
    assert_eq!(
        risk(json!({"removeDenyClasses": ["com.example.Nope"]})),
        RiskLevel::L0
    );
    // Added allow classes, by kind.
    assert_eq!(
        risk(json!({"addAllowClasses": ["java.io.FileWriter"]})),
        RiskLevel::L5
    );
    assert_eq!(
        risk(json!({"addAllowClasses": ["java.net.Socket"]})),
        RiskLevel::L4
    );
    assert_eq!(
        risk(json!({"addAllowClasses": ["java.io.File"]})),
        RiskLevel::L4
    );
    assert_eq!(
        risk(json!({"addAllowClasses": ["com.example.Util"]})),
        RiskLevel::L3
    );
    // Adding what the baseline already allows is no escalation.
    assert_eq!(
        risk(json!({"addAllowClasses": ["java.util.*"]})),
        RiskLevel::L0
    );
}

#[test]
fn declared_ungated_helpers_survive_and_ungranted_gated_ones_are_dropped() {
    let doc = json!({"name": "t", "code": "x", "codeType": "Javascript",
        "toolSafety": {"runtime": {"helpers": ["safety.fs/v1", "tool-safety-helpers/v1#crypto"]},
                       "category": {"source": "builtin", "id": "CRYPTO"}}});
    let s = validate_document(&doc)
        .spec
        .unwrap_or_else(|| unreachable!());
    let r = resolve(&s, &Config::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(
        r.tool_safety.runtime.helpers,
        ["tool-safety-helpers/v1#crypto"]
    );
    assert_eq!(&*r.tool_safety.category.source, "builtin");
}
