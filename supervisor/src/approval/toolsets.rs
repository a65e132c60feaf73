//! CJSON toolsets documents (seed 003, `application/vnd.cjson-toolsets+json`): the operator's
//! per-tool switches `enabled` and `requiresApproval`, with `toolsetDefaults` for the tools a
//! toolset lists. Documents are validated against the seed's JSON Schema (2020-12) first;
//! every error names the file and a JSON pointer.
//!
//! A toolset of kind `builtin` speaks about stsd's own tools. Only flags written down count:
//! a listed tool without `requiresApproval` (and no default) has no say on approval, so listing
//! a tool to disable another never lifts a spec's REQUIRED by accident. The same tool in two
//! toolsets: disabled if either disables it, approval required if either requires it.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub const MEDIA_TYPE: &str = "application/vnd.cjson-toolsets+json";
pub const SCHEMA_ID: &str =
    "https://schema.cjson.dev/0/toolsets/cjson-toolsets-0.1.0-SNAPSHOT.schema.json";
/// The seed's schema, verbatim.
pub const SCHEMA: &str = include_str!("cjson-toolsets.schema.json");

/// The operator's switches for one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    pub enabled: bool,
    pub requires_approval: Option<bool>,
    /// `file#toolset-id` of every toolset that lists the tool.
    pub from: Vec<String>,
    /// Disabled by the operator (`stsd tools disable`), not (only) by a document.
    pub by_operator: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Toolsets {
    pub tools: BTreeMap<String, Switch>,
    pub files: Vec<PathBuf>,
    /// A preset in force: its id and the only tools it serves.
    pub only: Option<(String, std::collections::BTreeSet<String>)>,
}

impl Toolsets {
    pub fn get(&self, name: &str) -> Option<&Switch> {
        self.tools.get(name)
    }
}

fn validator() -> Result<&'static jsonschema::Validator, String> {
    static V: OnceLock<Result<jsonschema::Validator, String>> = OnceLock::new();
    V.get_or_init(|| {
        let schema: Value = serde_json::from_str(SCHEMA).map_err(|e| e.to_string())?;
        jsonschema::draft202012::new(&schema).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(|e| format!("the toolsets schema does not compile: {e}"))
}

/// Reads and checks every document; `known` says whether a tool name exists in the catalog.
/// Any error leaves nothing applied: the caller keeps what it had.
pub fn load(paths: &[PathBuf], known: &dyn Fn(&str) -> bool) -> Result<Toolsets, Vec<String>> {
    let mut out = Toolsets {
        files: paths.to_vec(),
        ..Toolsets::default()
    };
    let mut errors = Vec::new();
    for path in paths {
        match std::fs::read(path) {
            Ok(bytes) => apply_document(path, &bytes, known, &mut out, &mut errors),
            Err(e) => errors.push(format!("{}: cannot read: {e}", path.display())),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn apply_document(
    path: &Path,
    bytes: &[u8],
    known: &dyn Fn(&str) -> bool,
    out: &mut Toolsets,
    errors: &mut Vec<String>,
) {
    let at = path.display();
    let doc: Value = match stsd_protocol::json::parse_bounded(bytes) {
        Ok(v) => v,
        Err(e) => {
            errors.push(format!("{at}: not JSON: {e}"));
            return;
        }
    };
    match validator() {
        Ok(v) => {
            let before = errors.len();
            for e in v.iter_errors(&doc) {
                let pointer = e.instance_path().to_string();
                let pointer = if pointer.is_empty() {
                    "/".into()
                } else {
                    pointer
                };
                errors.push(format!("{at}: {pointer}: {e}"));
            }
            if errors.len() > before {
                return;
            }
        }
        Err(e) => {
            errors.push(e);
            return;
        }
    }
    if let Some(m) = doc.get("mediaType").and_then(Value::as_str) {
        if m != MEDIA_TYPE {
            errors.push(format!(
                "{at}: /mediaType: expected {MEDIA_TYPE}, got {m:?}"
            ));
        }
    }
    let sets = doc.get("toolsets").and_then(Value::as_array);
    for (i, set) in sets.into_iter().flatten().enumerate() {
        let id = set.get("id").and_then(Value::as_str).unwrap_or_default();
        let kind = set.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind == "mcp" {
            // An external MCP server: the gateway reads it (gateway::sources).
            continue;
        }
        if kind != "builtin" {
            errors.push(format!(
                "{at}: /toolsets/{i}/kind: \"{kind}\" toolsets are not served by this daemon; \
                 stsd's own tools are a toolset of kind \"builtin\", external MCP servers of \
                 kind \"mcp\""
            ));
            continue;
        }
        let defaults = set.get("toolsetDefaults");
        let flag = |tool: &Value, key: &str| {
            tool.get(key)
                .or_else(|| defaults.and_then(|d| d.get(key)))
                .and_then(Value::as_bool)
        };
        for (j, tool) in set
            .get("tools")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            if let Err(e) = stsd_protocol::check_tool_name(name) {
                errors.push(format!("{at}: /toolsets/{i}/tools/{j}/name: {e}"));
                continue;
            }
            if !known(name) {
                errors.push(format!(
                    "{at}: /toolsets/{i}/tools/{j}/name: no tool named {name:?} in the catalog"
                ));
                continue;
            }
            let from = format!("{at}#{id}");
            let enabled = flag(tool, "enabled").unwrap_or(true);
            let requires = flag(tool, "requiresApproval");
            let sw = out.tools.entry(name.to_string()).or_insert(Switch {
                enabled: true,
                requires_approval: None,
                from: Vec::new(),
                by_operator: false,
            });
            sw.enabled &= enabled;
            sw.requires_approval = match (sw.requires_approval, requires) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (a, b) => b.or(a),
            };
            sw.from.push(from);
        }
    }
}

/// One tool as `stsd export --format cjson` writes it.
pub struct ExportTool<'a> {
    pub name: &'a str,
    pub summary: &'a str,
    pub args_schema: &'a Value,
    pub enabled: bool,
    pub requires_approval: bool,
}

/// The served catalog as a toolsets document the loader reads back.
pub fn export(tools: &[ExportTool]) -> Value {
    let tools: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut m = Map::new();
            m.insert("name".into(), json!(t.name));
            m.insert("summary".into(), json!(t.summary));
            m.insert("argsSchema".into(), t.args_schema.clone());
            m.insert("enabled".into(), json!(t.enabled));
            m.insert("requiresApproval".into(), json!(t.requires_approval));
            Value::Object(m)
        })
        .collect();
    json!({
        "mediaType": MEDIA_TYPE,
        "schema": SCHEMA_ID,
        "toolsets": [{
            "id": "stsd",
            "kind": "builtin",
            "version": env!("CARGO_PKG_VERSION"),
            "toolsetDefaults": {"enabled": true},
            "tools": tools,
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_one(doc: &Value) -> Result<Toolsets, Vec<String>> {
        let dir = std::env::temp_dir().join(format!("stsd-toolsets-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let p = dir.join(format!("t{}.json", doc.to_string().len()));
        let _ = std::fs::write(&p, doc.to_string());
        let known = |n: &str| ["deleteFile", "readFile", "writeTextFile"].contains(&n);
        let r = load(std::slice::from_ref(&p), &known);
        let _ = std::fs::remove_file(&p);
        r
    }

    #[test]
    fn switches_with_defaults_and_only_written_flags_count() {
        let doc = json!({"schema": SCHEMA_ID, "toolsets": [{
            "id": "fs", "kind": "builtin",
            "toolsetDefaults": {"requiresApproval": true},
            "tools": [{"name": "deleteFile", "enabled": false},
                      {"name": "readFile", "requiresApproval": false}]},
            {"id": "more", "kind": "builtin",
             "tools": [{"name": "writeTextFile"}]}]});
        let t = load_one(&doc).unwrap_or_else(|e| panic!("{e:?}"));
        let del = t
            .get("deleteFile")
            .cloned()
            .unwrap_or_else(|| panic!("missing"));
        assert_eq!((del.enabled, del.requires_approval), (false, Some(true)));
        let read = t
            .get("readFile")
            .cloned()
            .unwrap_or_else(|| panic!("missing"));
        assert_eq!((read.enabled, read.requires_approval), (true, Some(false)));
        let write = t
            .get("writeTextFile")
            .cloned()
            .unwrap_or_else(|| panic!("missing"));
        assert_eq!((write.enabled, write.requires_approval), (true, None));
    }

    #[test]
    fn schema_errors_and_unknown_names_carry_pointers() {
        let bad = json!({"schema": SCHEMA_ID, "toolsets": [{"id": "x", "kind": "builtin",
            "tools": [{"name": "deleteFile", "enabled": "no"}]}]});
        let e = load_one(&bad).err().unwrap_or_default();
        assert!(
            e.iter().any(|m| m.contains("/toolsets/0/tools/0/enabled")),
            "{e:?}"
        );
        let missing_schema = json!({"toolsets": []});
        let e = load_one(&missing_schema).err().unwrap_or_default();
        assert!(e.iter().any(|m| m.contains("schema")), "{e:?}");
        let unknown = json!({"schema": SCHEMA_ID, "toolsets": [{"id": "x", "kind": "builtin",
            "tools": [{"name": "noSuchTool"}]}]});
        let e = load_one(&unknown).err().unwrap_or_default();
        assert!(
            e.iter()
                .any(|m| m.contains("/toolsets/0/tools/0/name") && m.contains("noSuchTool")),
            "{e:?}"
        );
        // A name outside the tool-name grammar is refused as such, even when `known` would
        // say yes (the grammar is checked first).
        let known_all = |_: &str| true;
        for name in ["../x", "a/b", ".hidden", "a\u{2215}b"] {
            let doc = json!({"schema": SCHEMA_ID, "toolsets": [{"id": "x", "kind": "builtin",
                "tools": [{"name": name}]}]});
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            let p = dir.path().join("t.json");
            std::fs::write(&p, doc.to_string()).unwrap_or_else(|e| panic!("{e}"));
            let e = load(std::slice::from_ref(&p), &known_all)
                .err()
                .unwrap_or_default();
            assert!(
                e.iter().any(|m| m.contains("/toolsets/0/tools/0/name")
                    && m.contains("MCP's tool-name rule")),
                "{name:?}: {e:?}"
            );
        }
        let uri = json!({"schema": SCHEMA_ID, "toolsets": [{"id": "x", "kind": "uri"}]});
        let e = load_one(&uri).err().unwrap_or_default();
        assert!(e.iter().any(|m| m.contains("/toolsets/0/kind")), "{e:?}");
        // An mcp toolset is the gateway's: the switches loader leaves it alone.
        let mcp = json!({"schema": SCHEMA_ID, "toolsets": [{"id": "x", "kind": "mcp",
            "tools": [{"name": "notAnStsdTool"}]}]});
        assert!(load_one(&mcp).is_ok());
    }

    #[test]
    fn an_export_reads_back_as_the_same_switches() {
        let schema = json!({"type": "object"});
        let doc = export(&[
            ExportTool {
                name: "deleteFile",
                summary: "Delete a file",
                args_schema: &schema,
                enabled: true,
                requires_approval: true,
            },
            ExportTool {
                name: "readFile",
                summary: "Read a file",
                args_schema: &schema,
                enabled: true,
                requires_approval: false,
            },
        ]);
        let t = load_one(&doc).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(
            t.get("deleteFile").map(|s| s.requires_approval),
            Some(Some(true))
        );
        assert_eq!(
            t.get("readFile").map(|s| s.requires_approval),
            Some(Some(false))
        );
    }
}
