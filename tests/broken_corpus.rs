//! The broken-spec corpus: each file gives its expected code at its expected pointer.

use stsd::check;
use stsd::store::Catalog;
use stsd_profiles::Config;
use stsd_protocol::Severity;
use stsd_tests::{corpus_dir, read_json};

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn every_broken_spec_gives_its_code_and_pointer() {
    let dir = corpus_dir().join("broken");
    let expected = read_json(&dir.join("expected.json.txt"));
    let expected = expected
        .as_object()
        .unwrap_or_else(|| panic!("manifest must be an object"));
    assert!(
        expected.len() >= 25,
        "the corpus must hold at least 25 broken specs"
    );
    let on_disk = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    assert_eq!(
        on_disk,
        expected.len() + 1,
        "every corpus file has an expectation"
    );
    let mut codes = std::collections::BTreeSet::new();
    for (file, want) in expected {
        let code = want["code"].as_str().unwrap_or_default();
        let ptr = want["pointer"].as_str().unwrap_or_default();
        let index = want["index"].as_u64().unwrap_or(0) as usize;
        codes.insert(code.to_string());
        // Each file is checked alone, as `stsd check FILE` would.
        let cat = Catalog::load(&[dir.join(file)]);
        let report = check::build(&cat, &Config::default(), &no_env);
        assert!(!report.ok(), "{file}: accepted");
        let found: Vec<(String, String, Severity)> = if let Some(p) = report.file_problems.first() {
            vec![(
                p.diagnostic.code.to_string(),
                p.diagnostic.pointer.clone(),
                p.diagnostic.severity,
            )]
        } else {
            let spec = report
                .specs
                .get(index)
                .unwrap_or_else(|| panic!("{file}: no spec #{index}"));
            assert!(!spec.valid, "{file}: spec #{index} reported valid");
            assert_eq!(
                spec.state, None,
                "{file}: an invalid spec has no lifecycle state"
            );
            spec.diagnostics
                .iter()
                .map(|d| (d.code.to_string(), d.pointer.clone(), d.severity))
                .collect()
        };
        assert!(
            found
                .iter()
                .any(|(c, p, s)| c == code && p == ptr && *s == Severity::Error),
            "{file}: expected {code} at {ptr:?}, got {found:?}"
        );
    }
    assert_eq!(
        codes.len(),
        3,
        "the corpus covers SPEC_PARSE, SPEC_INVARIANT and RESOLVER_REJECT"
    );
}

#[test]
fn warnings_never_reject_a_spec() {
    let dir = corpus_dir().join("warnings");
    let expected = read_json(&dir.join("expected.json.txt"));
    for (file, want) in expected.as_object().into_iter().flatten() {
        let ptr = want["pointer"].as_str().unwrap_or_default();
        let cat = Catalog::load(&[dir.join(file)]);
        let report = check::build(&cat, &Config::default(), &no_env);
        assert!(report.ok(), "{file}: rejected: {:?}", report.specs);
        let spec = &report.specs[0];
        assert!(
            spec.diagnostics
                .iter()
                .any(|d| d.pointer == ptr && d.severity == Severity::Warning),
            "{file}: expected a warning at {ptr}, got {:?}",
            spec.diagnostics
        );
    }
}
