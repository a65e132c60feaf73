//! Catalog publishing: which specs the daemon serves (ACTIVE, with a Local Pass, not
//! disabled, in the preset) and as what (`tool`: each one's schema, hints and approval).

pub mod tool;

pub use tool::{input_schema, PublishedTool};

use crate::approval::toolsets::Toolsets;
use crate::approval::{requirement, ToolFacts};
use crate::lifecycle::{state_of, State};
use crate::store::{Catalog, Entry as CatalogEntry};
use serde_json::Value;
use std::path::{Path, PathBuf};
use stsd_profiles::{resolve, Config, Resolved};
use stsd_protocol::ToolSpec;

/// Where specs come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Bundled,
    Path(PathBuf),
    /// The managed catalog (what the admin channel published, in the state store): its
    /// tools start gated when they write, delete or reach the network
    /// (`approval::policy::gated_by_default`), and its switches disable tools.
    Managed(ManagedSource),
}

/// The managed catalog as a source: one is equal only to itself.
#[derive(Clone)]
pub struct ManagedSource(pub std::sync::Arc<crate::managed::Managed>);

impl PartialEq for ManagedSource {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ManagedSource {}

impl std::fmt::Debug for ManagedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The catalog as served: ACTIVE specs, sorted by name (a stable order).
#[derive(Debug, Clone, Default)]
pub struct Published {
    /// Sorted by name, as [`publish_catalog`] leaves them (and filtering keeps them): a
    /// lookup by name is a binary search.
    pub tools: Vec<PublishedTool>,
    /// Specs read but not served, with why (for the startup banner and logs).
    pub withheld: Vec<(String, String)>,
    /// Files that could not be read as specs (bad JSON, unreadable), with the reason.
    pub unreadable: Vec<(PathBuf, String)>,
}

impl Published {
    /// The tool of that name (the first published, of two with one name). Every call looks
    /// its tool up here: a scan was a compare per served tool, per call (and a wrapped
    /// tool's name, which is not here, was compared with all of them).
    pub fn get(&self, name: &str) -> Option<&PublishedTool> {
        let at = self.tools.partition_point(|t| t.spec.name.as_str() < name);
        self.tools.get(at).filter(|t| t.spec.name == name)
    }

    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.spec.name.as_str()).collect()
    }
}

/// Reads the catalog and the toolsets documents, then publishes. Toolsets errors (schema, a
/// name that matches no tool) are returned and nothing is published.
pub fn publish_with_toolsets(
    sources: &[Source],
    config: &Config,
    toolset_paths: &[PathBuf],
) -> Result<Published, Vec<String>> {
    let cat = load_catalog(sources).map_err(|e| vec![e])?;
    let mut toolsets = crate::approval::toolsets::load(toolset_paths, &|name: &str| {
        cat.entries
            .iter()
            .any(|e| e.validated.spec.as_ref().is_some_and(|s| s.name == name))
    })?;
    // The operator's switches from the admin channel.
    if let Some(m) = managed(sources) {
        for name in m.disabled().map_err(|e| vec![e])? {
            let sw =
                toolsets
                    .tools
                    .entry(name)
                    .or_insert_with(|| crate::approval::toolsets::Switch {
                        enabled: true,
                        requires_approval: None,
                        from: Vec::new(),
                        by_operator: false,
                    });
            sw.enabled = false;
            sw.by_operator = true;
        }
    }
    if let Some(id) = &config.daemon.preset {
        let tools = preset_tools(sources, config, id)?;
        // A preset that lists no tool (the reference's "everything") is every tool.
        if !tools.is_empty() {
            toolsets.only = Some((id.clone(), tools));
        }
    }
    Ok(publish_catalog(
        &cat,
        config,
        &toolsets,
        false,
        managed_dir(sources).as_deref(),
    ))
}

/// The published catalog without toolsets documents.
pub fn publish(sources: &[Source], config: &Config) -> Published {
    publish_catalog(
        &load_catalog_or_log(sources),
        config,
        &Toolsets::default(),
        false,
        managed_dir(sources).as_deref(),
    )
}

/// Every valid spec as it would be published, whatever its lifecycle state (drafts and
/// specs missing variables included): for exports of a whole catalog.
pub fn publish_any_state(sources: &[Source], config: &Config) -> Published {
    publish_catalog(
        &load_catalog_or_log(sources),
        config,
        &Toolsets::default(),
        true,
        managed_dir(sources).as_deref(),
    )
}

/// Whether one valid spec is served, and resolved as what; else why it is withheld (the
/// reason the admin listing, the banner and a refused call give).
fn served(
    cat: &Catalog,
    e: &CatalogEntry,
    spec: &ToolSpec,
    config: &Config,
    toolsets: &Toolsets,
    any_state: bool,
) -> Result<Resolved, String> {
    if let Some(err) = e.validated.errors().next() {
        return Err(format!(
            "invalid: {err} (fix the spec; stsd check shows all)"
        ));
    }
    let resolved = resolve(spec, config).map_err(|d| format!("invalid: {d}"))?;
    let env = crate::secrets::spec_env(config);
    match state_of(spec, &env) {
        (State::Active, _)
            if config.daemon.require_local_pass
                && !any_state
                && !crate::local_pass::document(cat, e)
                    .is_some_and(crate::local_pass::verified) =>
        {
            return Err(
                "NOT_VERIFIED: draft:false without a Local Pass of this content (edited since, \
                 or never passed): run stsd test --write, or stsd tools add|update"
                    .to_string(),
            );
        }
        (State::Active, _) => {}
        _ if any_state => {}
        (State::MissingRequirements, missing) => {
            let why: Vec<String> = missing.iter().map(|m| env.why_missing(m)).collect();
            return Err(format!(
                "MISSING_REQUIREMENTS: {} (a secret is read at once; the environment after a \
                 SIGHUP)",
                why.join(", ")
            ));
        }
        (State::Draft, _) => {
            return Err(
                "DRAFT: run stsd test --write (records a Local Pass and sets draft: false), \
                 or stsd tools add"
                    .to_string(),
            );
        }
        (state, _) => return Err(state.as_str().to_string()),
    }
    if let Some((id, only)) = &toolsets.only {
        if !only.contains(&spec.name) {
            return Err(format!(
                "not in preset {id}: add it to the preset, or serve without --preset"
            ));
        }
    }
    match toolsets.get(&spec.name) {
        Some(s) if s.by_operator => {
            return Err(
                "disabled by the operator (stsd tools disable): stsd tools enable NAME".into(),
            )
        }
        Some(s) if !s.enabled => {
            return Err(
                "disabled by a toolsets document: stsd tools enable NAME, or edit the document"
                    .into(),
            )
        }
        _ => {}
    }
    Ok(resolved)
}

/// The tools of preset `id`, from `[daemon] presets_file` or a `default-tool-presets.json`
/// in (or beside) a catalog source.
fn preset_tools(
    sources: &[Source],
    config: &Config,
    id: &str,
) -> Result<std::collections::BTreeSet<String>, Vec<String>> {
    let file = config.daemon.presets_file.clone().or_else(|| {
        sources.iter().find_map(|s| match s {
            Source::Path(p) => {
                let dir = if p.is_dir() {
                    p.clone()
                } else {
                    p.parent()?.to_path_buf()
                };
                Some(dir.join("default-tool-presets.json")).filter(|f| f.exists())
            }
            Source::Bundled | Source::Managed(_) => None,
        })
    });
    let Some(file) = file else {
        return Err(vec![format!(
            "preset {id}: no presets file (set [daemon] presets_file, or serve a catalog directory with default-tool-presets.json)"
        )]);
    };
    let doc: Value = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| vec![format!("{}: not a presets document", file.display())])?;
    let presets = doc.as_array().cloned().unwrap_or_default();
    let found = presets.iter().find(|p| p["id"] == id);
    match found {
        Some(p) => Ok(p["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().map(String::from))
            .collect()),
        None => Err(vec![format!(
            "{}: no preset {id:?}; there are {}",
            file.display(),
            presets
                .iter()
                .filter_map(|p| p["id"].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )]),
    }
}

/// The managed catalog's specs directory, when it is a source.
/// The managed catalog among `sources`, if any.
pub fn managed(sources: &[Source]) -> Option<&crate::managed::Managed> {
    sources.iter().find_map(|s| match s {
        Source::Managed(m) => Some(&*m.0),
        _ => None,
    })
}

/// Where the managed catalog's spec files are named (see [`crate::managed`]).
fn managed_dir(sources: &[Source]) -> Option<PathBuf> {
    managed(sources).map(|m| m.specs_dir())
}

/// Every source's specs; Err when the managed catalog's store cannot be read.
fn load_catalog(sources: &[Source]) -> Result<Catalog, String> {
    let paths: Vec<PathBuf> = sources
        .iter()
        .filter_map(|s| match s {
            Source::Path(p) => Some(p.clone()),
            Source::Bundled | Source::Managed(_) => None,
        })
        .collect();
    let mut extra: Vec<crate::store::SpecFile> = if sources.contains(&Source::Bundled) {
        crate::bundled::examples().into_iter().collect()
    } else {
        Vec::new()
    };
    if let Some(m) = managed(sources) {
        extra.extend(m.spec_files()?);
    }
    Ok(Catalog::load_with(&paths, extra))
}

/// As [`load_catalog`], for a view that must be had (an export, a listing): without the
/// managed tools, said, when the store cannot be read.
fn load_catalog_or_log(sources: &[Source]) -> Catalog {
    load_catalog(sources).unwrap_or_else(|e| {
        tracing::error!(error = %e, "listing the catalog without its managed tools");
        let others: Vec<Source> = sources
            .iter()
            .filter(|s| !matches!(s, Source::Managed(_)))
            .cloned()
            .collect();
        load_catalog(&others).unwrap_or_default()
    })
}

/// The published catalog: ACTIVE specs not disabled by a toolsets document, each with its
/// effective approval requirement.
fn publish_catalog(
    cat: &Catalog,
    config: &Config,
    toolsets: &Toolsets,
    any_state: bool,
    managed: Option<&Path>,
) -> Published {
    let mut out = Published {
        unreadable: cat
            .problems
            .iter()
            .map(|p| (p.path.clone(), p.diagnostic.to_string()))
            .collect(),
        ..Published::default()
    };
    for e in &cat.entries {
        let Some(spec) = &e.validated.spec else {
            continue;
        };
        let name = spec.name.clone();
        let resolved = match served(cat, e, spec, config, toolsets, any_state) {
            Ok(r) => r,
            Err(why) => {
                out.withheld.push((name, why));
                continue;
            }
        };
        let switch = toolsets.get(&name);
        let admin_published = managed.is_some_and(|m| cat.files[e.file].path.starts_with(m));
        let facts = ToolFacts::of_spec(spec, &resolved, admin_published);
        let approval = requirement(
            &facts,
            switch.and_then(|s| s.requires_approval),
            &config.approval,
        );
        if approval.refused_override {
            tracing::warn!(
                tool = %name,
                "an operator switch says no approval, but the spec requires it and \
                 [approval] allow_override_required is false: approval stays required"
            );
        }
        let mut tool = PublishedTool::new(spec.clone(), e.tool_id.clone(), resolved, approval);
        tool.test_cases = crate::local_pass::document(cat, e)
            .and_then(|d| d.get("testCases").filter(|c| !c.is_null()).cloned())
            .map(Box::new);
        out.tools.push(tool);
    }
    out.tools.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    // Served for as long as the daemon runs: no room for tools that are not there.
    out.tools.shrink_to_fit();
    out
}

/// The bundled examples as published (4 tools, no Local Pass needed), for tests.
#[cfg(test)]
pub(crate) fn bundled_examples() -> Published {
    let mut config = Config::default();
    config.daemon.require_local_pass = false;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("catalog/examples.json");
    let published = publish(&[Source::Path(examples)], &config);
    assert_eq!(published.tools.len(), 4, "{:?}", published.withheld);
    published
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Tools are found by name by a binary search over the published list: whatever order
    /// the catalog lists them in, each is found, and names not served are not. (Two specs
    /// with one name are not both published: the second is withheld.)
    #[test]
    fn a_tool_is_found_by_name_in_any_catalog_order() {
        let spec = |name: &str, marker: &str| {
            serde_json::json!({"name": name, "description": marker, "code": "return 1",
                               "codeType": "Javascript", "params": [], "draft": false})
        };
        let names = ["zeta", "alpha", "mid-b", "mid-a", "omega", "beta"];
        let mut docs: Vec<Value> = names.iter().map(|n| spec(n, "first")).collect();
        docs.push(spec("mid-b", "second"));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("catalog.json");
        std::fs::write(&path, serde_json::to_vec(&docs).unwrap()).unwrap();
        let mut config = Config::default();
        config.daemon.require_local_pass = false;
        let published = publish(&[Source::Path(path)], &config);
        assert_eq!(
            published.tools.len(),
            names.len(),
            "{:?}",
            published.withheld
        );
        assert!(published.withheld.iter().any(|(n, _)| n == "mid-b"));

        for name in names {
            let t = published
                .get(name)
                .unwrap_or_else(|| panic!("{name} not found"));
            assert_eq!(t.spec.name, name);
            assert_eq!(t.spec.description, "first");
        }
        for missing in ["", "a", "mid", "mid-c", "zzz", "alpha "] {
            assert!(published.get(missing).is_none(), "{missing}");
        }
    }
}
