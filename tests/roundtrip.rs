//! Load then save keeps every byte: every field, unknown ones included, and key order.

use serde_json::Value;
use stsd::store::{Catalog, Container, SpecFile};
use stsd_tests::catalog_spec_files;

fn parse(path: &std::path::Path, bytes: &[u8]) -> SpecFile {
    match SpecFile::parse(path, bytes, true) {
        Ok(Some(f)) => f,
        other => panic!("{}: {other:?}", path.display()),
    }
}

#[test]
fn every_catalog_file_round_trips_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let mut specs = 0;
    for src in catalog_spec_files() {
        let original = std::fs::read(&src).unwrap_or_else(|e| panic!("{e}"));
        let name = src.file_name().unwrap_or_default();
        let copy = dir.path().join(name);
        let file = parse(&copy, &original);
        assert_eq!(file.container, Container::Array);
        specs += file.documents().len();
        file.write_atomic().unwrap_or_else(|e| panic!("{e}"));
        let saved = std::fs::read(&copy).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            saved == original,
            "{} changed on load then save",
            src.display()
        );
        // And the same holds per spec as parsed values, key order included.
        let a: Value = serde_json::from_slice(&original).unwrap_or_default();
        let b: Value = serde_json::from_slice(&saved).unwrap_or_default();
        let keys = |v: &Value| -> Vec<Vec<String>> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .map(|s| {
                            s.as_object()
                                .map(|o| o.keys().cloned().collect())
                                .unwrap_or_default()
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(keys(&a), keys(&b));
    }
    assert_eq!(specs, 116);
    // Nothing but the six files is left in the directory: no temp files.
    assert_eq!(
        std::fs::read_dir(dir.path())
            .map(|d| d.count())
            .unwrap_or(0),
        6
    );
}

#[test]
fn unknown_fields_and_order_survive_in_single_specs_and_bundles() {
    let single = r#"{
  "x-acme-cost": {"cap": 3, "nested": [1, {"z": 1, "a": 2}]},
  "name": "probe",
  "zeta": null,
  "code": "return 1;",
  "codeType": "Javascript",
  "alpha": 1.5
}"#;
    let bundle = r#"{
  "toolMcpServerSetting": {"transport": "stdio", "autoAdd": true},
  "toolSpecs": [
    {"codeType": "Javascript", "x-vendor": [3, 2, 1], "code": "return 2;", "name": "b"}
  ],
  "x-trailer": "kept"
}"#;
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    for (fname, text, kind) in [
        ("single.json", single, Container::Single),
        ("bundle.json", bundle, Container::Bundle),
    ] {
        let path = dir.path().join(fname);
        let file = parse(&path, text.as_bytes());
        assert_eq!(file.container, kind);
        file.write_atomic().unwrap_or_else(|e| panic!("{e}"));
        let back: Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap_or_default()).unwrap_or_default();
        let orig: Value = serde_json::from_str(text).unwrap_or_default();
        // serde_json with preserve_order compares maps in order; compare the serialisations
        // to make the key order part of the assertion.
        assert_eq!(
            serde_json::to_string(&back).ok(),
            serde_json::to_string(&orig).ok()
        );
    }
    let cat = Catalog::load(&[dir.path().to_path_buf()]);
    assert_eq!(cat.entries.len(), 2);
    assert!(cat.entries.iter().all(|e| e.validated.is_valid()));
}

#[test]
fn persisting_sets_create_once_update_always_and_derives_a_tool_id() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("s.json");
    let text =
        r#"[{"name": "probe", "code": "return 1;", "codeType": "Javascript", "x-keep": true}]"#;
    let mut file = parse(&path, text.as_bytes());
    assert!(file.touch(Some(0), 1_000));
    file.write_atomic().unwrap_or_else(|e| panic!("{e}"));
    let mut file = parse(&path, &std::fs::read(&path).unwrap_or_default());
    assert!(file.touch(Some(0), 2_000));
    let doc = file.document_mut(Some(0)).cloned().unwrap_or_default();
    assert_eq!(doc["createTimestamp"], 1_000);
    assert_eq!(doc["updateTimestamp"], 2_000);
    assert_eq!(doc["toolId"], stsd_protocol::ids::derive_tool_id("probe"));
    assert_eq!(doc["x-keep"], true);
    // The original keys keep their places; new ones are appended.
    let keys: Vec<&str> = doc.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "name",
            "code",
            "codeType",
            "x-keep",
            "toolId",
            "createTimestamp",
            "updateTimestamp"
        ]
    );
    // An explicit toolId is never replaced.
    let mut file = parse(
        &path,
        br#"{"toolId": "mine", "name": "p", "code": "x", "codeType": "Javascript"}"#,
    );
    file.touch(None, 5);
    assert_eq!(
        file.document_mut(None).map(|d| d["toolId"].clone()),
        Some(Value::from("mine"))
    );
}

#[test]
fn atomic_write_keeps_the_old_file_when_the_target_directory_is_gone() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("sub/s.json");
    let file = parse(
        &path,
        br#"{"name": "p", "code": "x", "codeType": "Javascript"}"#,
    );
    assert!(
        file.write_atomic().is_err(),
        "writing into a missing directory must fail, not panic"
    );
}
