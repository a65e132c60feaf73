//! Reading policies: the default one and the operator's files, each policy named (its `@id`
//! annotation, else `FILE#N`), every one validated against the schema. A problem names its
//! file and line; nothing of a set with a problem is used.

use cedar_policy::{PolicyId, PolicySet, Schema, ValidationMode, Validator};
use miette::Diagnostic;
use std::collections::BTreeMap;
use std::str::FromStr;
use stsd_profiles::Config;

/// The set, and where each policy came from (by id).
pub type Loaded = (PolicySet, BTreeMap<String, String>);

pub fn load(config: &Config, schema: &Schema) -> Result<Loaded, Vec<String>> {
    let mut set = PolicySet::new();
    let mut origin = BTreeMap::new();
    let mut errors = Vec::new();
    if config.policy.defaults {
        if let Err(e) = add(
            &mut set,
            &mut origin,
            "the default policy",
            super::default::TEXT,
        ) {
            errors.extend(e);
        }
    }
    for f in &config.policy.files {
        let label = f.display().to_string();
        match std::fs::read_to_string(f) {
            Ok(text) => {
                if let Err(e) = add(&mut set, &mut origin, &label, &text) {
                    errors.extend(e);
                }
            }
            Err(e) => errors.push(format!("[policy] files: {label}: {e}")),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let result = Validator::new(schema.clone()).validate(&set, ValidationMode::Strict);
    let invalid: Vec<String> = result
        .validation_errors()
        .map(|e| {
            let id = e.policy_id().to_string();
            let at = origin.get(&id).cloned().unwrap_or_default();
            format!("{at}: policy {id}: {e}")
        })
        .collect();
    if !invalid.is_empty() {
        return Err(invalid);
    }
    Ok((set, origin))
}

/// The line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset.min(text.len()))
        .map_or(1, |t| t.matches('\n').count() + 1)
}

/// Parses `text` and adds each of its policies under its name.
fn add(
    set: &mut PolicySet,
    origin: &mut BTreeMap<String, String>,
    label: &str,
    text: &str,
) -> Result<(), Vec<String>> {
    let parsed = PolicySet::from_str(text).map_err(|e| {
        let line = e
            .labels()
            .and_then(|mut l| l.next())
            .map(|l| line_of(text, l.offset()));
        let at = line.map(|l| format!(" line {l}")).unwrap_or_default();
        vec![format!("{label}{at}: {e}")]
    })?;
    if parsed.templates().next().is_some() {
        return Err(vec![format!(
            "{label}: templates (?principal, ?resource) are not supported; write the policy out"
        )]);
    }
    for (i, p) in parsed.policies().enumerate() {
        let name = p
            .annotation("id")
            .map(String::from)
            .unwrap_or_else(|| format!("{label}#{i}"));
        if origin.contains_key(&name) {
            return Err(vec![format!(
                "{label}: policy id {name:?} is used twice (the second in this file)"
            )]);
        }
        set.add(p.new_id(PolicyId::new(&name)))
            .map_err(|e| vec![format!("{label}: policy {name}: {e}")])?;
        origin.insert(name, label.to_string());
    }
    Ok(())
}
