//! The reference catalog (116 specs) loads, validates and resolves as the reference does.

use std::collections::BTreeMap;
use stsd::check;
use stsd::lifecycle::State;
use stsd::store::Catalog;
use stsd_profiles::{resolve, Config, RiskLevel};
use stsd_tests::catalog_dir;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn catalog_reads_116_valid_specs_with_the_reference_risk_histogram() {
    let cat = Catalog::load(&[catalog_dir()]);
    let report = check::build(&cat, &Config::default(), &no_env);
    let s = &report.summary;
    let invalid: Vec<_> = report
        .specs
        .iter()
        .filter(|r| !r.valid)
        .map(|r| (&r.name, &r.diagnostics))
        .collect();
    assert!(invalid.is_empty(), "invalid catalog specs: {invalid:?}");
    assert_eq!(
        (s.specs, s.valid, s.invalid, s.unreadable_files),
        (116, 116, 0, 0)
    );
    assert_eq!(s.files, 6);
    assert_eq!(
        s.skipped.len(),
        3,
        "presets, categories and integrity are not specs"
    );
    let hist: BTreeMap<RiskLevel, usize> = s.by_risk.clone();
    let want: BTreeMap<RiskLevel, usize> = [
        (RiskLevel::L0, 50),
        (RiskLevel::L3, 59),
        (RiskLevel::L4, 4),
        (RiskLevel::L5, 3),
    ]
    .into_iter()
    .collect();
    assert_eq!(hist, want);
    // Every catalog spec is a draft (draft: true, or absent which defaults to true).
    assert_eq!(s.by_state.get(&State::Draft), Some(&116));
    assert!(report.ok());
}

/// Where the catalog carries the reference resolver's toolSafety snapshot, our resolver agrees
/// on every capability (hosts aside: the reference snapshot always writes `[]`).
#[test]
fn resolved_capabilities_match_the_reference_snapshots() {
    let cat = Catalog::load(&[catalog_dir()]);
    let mut compared = 0;
    for e in &cat.entries {
        let spec = e
            .validated
            .spec
            .as_ref()
            .unwrap_or_else(|| panic!("unreadable spec"));
        let Some(stored) = &spec.tool_safety else {
            continue;
        };
        let r = resolve(spec, &Config::default()).unwrap_or_else(|d| panic!("{}: {d}", spec.name));
        let caps = &r.tool_safety.capabilities;
        let want = &stored["capabilities"];
        assert_eq!(
            want["network"]["mode"],
            caps.network.mode.as_str(),
            "{}",
            spec.name
        );
        assert_eq!(want["fileRead"], caps.file_read, "{}", spec.name);
        assert_eq!(want["fileWrite"], caps.file_write, "{}", spec.name);
        assert_eq!(
            want["destructive"].as_bool().unwrap_or(false),
            caps.destructive,
            "{}",
            spec.name
        );
        assert_eq!(
            stored["category"]["id"],
            r.tool_safety.category.id.as_deref().unwrap_or(""),
            "{}",
            spec.name
        );
        assert!(!r.tool_safety.runtime.java_interop);
        compared += 1;
    }
    assert_eq!(compared, 87, "87 catalog specs carry a toolSafety snapshot");
}

#[test]
fn allowlist_hosts_are_resolved_for_network_specs() {
    let cat = Catalog::load(&[catalog_dir()]);
    let wiki = cat
        .entries
        .iter()
        .filter_map(|e| e.validated.spec.as_ref())
        .find(|s| s.name == "searchWikipedia")
        .unwrap_or_else(|| panic!("searchWikipedia missing"));
    let r = resolve(wiki, &Config::default()).unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(r.tool_safety.capabilities.network.hosts.len(), 7);
    assert_eq!(
        r.tool_safety.capabilities.network.hosts,
        wiki.sandbox_overrides.hosts_allow
    );
    assert_eq!(r.risk, RiskLevel::L3);
}
