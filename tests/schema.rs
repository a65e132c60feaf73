//! The shipped JSON Schema accepts the whole reference catalog and rejects broken specs.

use serde_json::{json, Value};
use stsd_protocol::schema::SAFE_TOOL_SPEC_SCHEMA;
use stsd_tests::{catalog_spec_files, corpus_dir, read_json};

fn validator() -> jsonschema::Validator {
    let schema: Value =
        serde_json::from_str(SAFE_TOOL_SPEC_SCHEMA).unwrap_or_else(|e| panic!("{e}"));
    jsonschema::draft202012::new(&schema).unwrap_or_else(|e| panic!("schema does not compile: {e}"))
}

#[test]
fn all_116_reference_specs_validate() {
    let v = validator();
    let mut n = 0;
    for f in catalog_spec_files() {
        for spec in read_json(&f).as_array().into_iter().flatten() {
            let errors: Vec<String> = v
                .iter_errors(spec)
                .map(|e| format!("{} at {}", e, e.instance_path()))
                .collect();
            assert!(
                errors.is_empty(),
                "{}: {} rejected: {errors:?}",
                f.display(),
                spec["name"]
            );
            n += 1;
        }
    }
    assert_eq!(n, 116);
}

#[test]
fn broken_specs_the_schema_can_see_are_rejected() {
    let v = validator();
    let dir = corpus_dir().join("broken");
    let expected = read_json(&dir.join("expected.json.txt"));
    let mut checked = 0;
    for (file, want) in expected.as_object().into_iter().flatten() {
        if want["schemaRejects"] != true {
            continue;
        }
        let doc = read_json(&dir.join(file));
        let index = want["index"].as_u64();
        let spec = match index {
            Some(i) => doc[i as usize].clone(),
            None => doc,
        };
        assert!(!v.is_valid(&spec), "{file}: the schema accepted it");
        checked += 1;
    }
    assert!(
        checked >= 20,
        "only {checked} corpus cases exercised the schema"
    );
}

#[test]
fn schema_accepts_minimal_extended_and_all_null_specs() {
    let v = validator();
    assert!(v.is_valid(&json!({"name": "a", "code": "return 1", "codeType": "Javascript"})));
    assert!(v.is_valid(
        &json!({"name": "a", "code": "x", "codeType": "Javascript", "x-acme-cost": {"cap": 1}})
    ));
    let nulls = json!({"name": "a", "code": "x", "codeType": "Javascript", "toolId": null, "description": null,
        "category": null, "tags": null, "params": null, "staticVariables": null, "sandboxOverrides": null,
        "toolSafety": null, "draft": null, "createTimestamp": null, "updateTimestamp": null});
    assert!(v.is_valid(&nulls));
    assert!(!v.is_valid(
        &json!({"name": "a", "code": "x", "codeType": "Javascript", "tags": ["a", "b", "c"]})
    ));
}
