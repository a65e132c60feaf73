//! The Safe Tool Spec document, typed (spec §3 to §10).
//!
//! The typed view is read from a `serde_json::Value`; the raw value stays the source of truth for
//! saving, so unknown fields and key order survive (the store writes the raw document back).
//! Reading applies the §3 defaults (absent or null -> default) and records every shape problem
//! as a SPEC_PARSE diagnostic with a JSON pointer, instead of stopping at the first one.

use crate::diag::{pointer, Code, Diagnostic};
use crate::json::type_name;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// §6.2: the parameter types, stored uppercase in the document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ParamType {
    String,
    Integer,
    Number,
    Boolean,
    Object,
    Array,
}

impl ParamType {
    pub const ALL: [ParamType; 6] = [
        ParamType::String,
        ParamType::Integer,
        ParamType::Number,
        ParamType::Boolean,
        ParamType::Object,
        ParamType::Array,
    ];

    /// The spelling in a spec document ("STRING").
    pub fn spec_name(self) -> &'static str {
        match self {
            ParamType::String => "STRING",
            ParamType::Integer => "INTEGER",
            ParamType::Number => "NUMBER",
            ParamType::Boolean => "BOOLEAN",
            ParamType::Object => "OBJECT",
            ParamType::Array => "ARRAY",
        }
    }

    /// The JSON Schema spelling emitted on the wire (§6.2: "string").
    pub fn json_schema_name(self) -> &'static str {
        match self {
            ParamType::String => "string",
            ParamType::Integer => "integer",
            ParamType::Number => "number",
            ParamType::Boolean => "boolean",
            ParamType::Object => "object",
            ParamType::Array => "array",
        }
    }

    pub fn from_spec_name(s: &str) -> Option<ParamType> {
        ParamType::ALL.into_iter().find(|t| t.spec_name() == s)
    }

    /// Parses a textual value (a `testValue`, a `--arg NAME=VALUE`) into the declared type
    /// (§6.3): INTEGER "7", NUMBER "4.5", BOOLEAN "true"/"false", OBJECT and ARRAY as JSON text.
    pub fn parse_text(self, text: &str) -> Result<Value, String> {
        let t = text.trim();
        match self {
            ParamType::String => Ok(Value::String(text.to_string())),
            ParamType::Integer => t
                .parse::<i64>()
                .map(Value::from)
                .map_err(|_| format!("{text:?} is not an integer (expected e.g. \"7\")")),
            ParamType::Number => match t.parse::<f64>() {
                Ok(n) if n.is_finite() && !t.is_empty() && !t.starts_with('+') => {
                    // Keep integers integral so `7` stays 7, not 7.0, on the way into JS.
                    Ok(t.parse::<i64>().map(Value::from).unwrap_or_else(|_| {
                        serde_json::Number::from_f64(n)
                            .map(Value::Number)
                            .unwrap_or(Value::Null)
                    }))
                }
                _ => Err(format!(
                    "{text:?} is not a finite number (expected e.g. \"4.5\")"
                )),
            },
            ParamType::Boolean => match t {
                "true" => Ok(Value::Bool(true)),
                "false" => Ok(Value::Bool(false)),
                _ => Err(format!(
                    "{text:?} is not a boolean (expected \"true\" or \"false\")"
                )),
            },
            ParamType::Object => match serde_json::from_str::<Value>(t) {
                Ok(v @ Value::Object(_)) => Ok(v),
                Ok(v) => Err(format!("expected a JSON object, got {}", type_name(&v))),
                Err(e) => Err(format!("not JSON object text: {e}")),
            },
            ParamType::Array => match serde_json::from_str::<Value>(t) {
                Ok(v @ Value::Array(_)) => Ok(v),
                Ok(v) => Err(format!("expected a JSON array, got {}", type_name(&v))),
                Err(e) => Err(format!("not JSON array text: {e}")),
            },
        }
    }

    /// Whether an already-typed JSON value (an MCP argument) fits the declared type.
    pub fn accepts(self, v: &Value) -> bool {
        match self {
            ParamType::String => v.is_string(),
            ParamType::Integer => v.is_i64() || v.is_u64(),
            ParamType::Number => v.is_number(),
            ParamType::Boolean => v.is_boolean(),
            ParamType::Object => v.is_object(),
            ParamType::Array => v.is_array(),
        }
    }
}

/// §10.4 network modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    Blocked,
    Allowlist,
    Strict,
    Open,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Blocked => "blocked",
            NetworkMode::Allowlist => "allowlist",
            NetworkMode::Strict => "strict",
            NetworkMode::Open => "open",
        }
    }

    pub fn parse(s: &str) -> Option<NetworkMode> {
        [
            NetworkMode::Blocked,
            NetworkMode::Allowlist,
            NetworkMode::Strict,
            NetworkMode::Open,
        ]
        .into_iter()
        .find(|m| m.as_str() == s)
    }
}

/// A §10.1 tristate field: absent, explicit `null` (both inherit the baseline), or a value.
/// The two inheriting forms are kept apart so tools and reports can show what the author wrote.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Tri<T> {
    #[default]
    Absent,
    Null,
    Set(T),
}

impl<T: Clone> Tri<T> {
    /// Tristate coalesce (§10.2 steps 4, 6 to 8): the explicit value, else the baseline's.
    pub fn or_inherit(&self, baseline: T) -> T {
        match self {
            Tri::Set(v) => v.clone(),
            Tri::Absent | Tri::Null => baseline,
        }
    }

    pub fn value(&self) -> Option<&T> {
        match self {
            Tri::Set(v) => Some(v),
            _ => None,
        }
    }
}

/// §6.1.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSpec {
    /// Position in the document's `params` array (for JSON pointers).
    pub index: usize,
    pub name: String,
    pub description: String,
    pub required: bool,
    pub ty: ParamType,
    pub test_value: Option<String>,
}

/// §7.1: one entry of the ordered list of single-entry objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticVariable {
    /// Position in the document's `staticVariables` array (for JSON pointers).
    pub index: usize,
    pub key: String,
    pub value: String,
}

/// §10.1 author intent. `Default` is the empty block, which §10.1 makes equivalent to no block.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SandboxOverrides {
    pub add_allow_classes: Vec<String>,
    pub remove_allow_classes: Vec<String>,
    pub add_deny_classes: Vec<String>,
    pub remove_deny_classes: Vec<String>,
    pub network_mode: Tri<NetworkMode>,
    pub hosts_allow: Vec<String>,
    pub file_read: Tri<bool>,
    pub file_write: Tri<bool>,
    pub fs_base_path: Tri<String>,
    /// Carried by the reference catalog (3 fs tools); raises the Risk Level to L5.
    pub destructive: Option<bool>,
}

/// The reference catalog's approval block (`{mode: "REQUIRED", promptTemplate}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HumanInTheLoop {
    pub mode: String,
    pub prompt_template: Option<String>,
}

/// The typed view of one spec, with §3 defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub tool_id: Option<String>,
    pub name: String,
    pub description: String,
    pub category: Option<String>,
    pub tags: Vec<String>,
    pub params: Vec<ParamSpec>,
    pub static_variables: Vec<StaticVariable>,
    pub code: String,
    pub code_type: String,
    pub sandbox_overrides: SandboxOverrides,
    /// The stored toolSafety block, verbatim. Informational: stsd re-derives the posture.
    pub tool_safety: Option<Value>,
    pub draft: bool,
    pub create_timestamp: Option<i64>,
    pub update_timestamp: Option<i64>,
    pub human_in_the_loop: Option<HumanInTheLoop>,
}

impl ToolSpec {
    /// The variable bag of §7.1 in declaration order, later duplicates winning.
    pub fn static_bag(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for sv in &self.static_variables {
            if let Some(slot) = out.iter_mut().find(|(k, _)| *k == sv.key) {
                slot.1 = &sv.value;
            } else {
                out.push((&sv.key, &sv.value));
            }
        }
        out
    }

    pub fn param(&self, name: &str) -> Option<&ParamSpec> {
        self.params.iter().find(|p| p.name == name)
    }
}

/// The top-level fields §3 defines (plus the catalog's `humanInTheLoop`). Anything else is an
/// extension field: kept on round-trip, never an error (§14).
pub const KNOWN_TOP_LEVEL: &[&str] = &[
    "toolId",
    "name",
    "description",
    "category",
    "tags",
    "params",
    "staticVariables",
    "code",
    "codeType",
    "sandboxOverrides",
    "toolSafety",
    "draft",
    "createTimestamp",
    "updateTimestamp",
    "humanInTheLoop",
];

const PARAM_FIELDS: &[&str] = &["name", "description", "required", "type", "testValue"];
const OVERRIDE_FIELDS: &[&str] = &[
    "addAllowClasses",
    "removeAllowClasses",
    "addDenyClasses",
    "removeDenyClasses",
    "networkMode",
    "hostsAllow",
    "fileRead",
    "fileWrite",
    "fsBasePath",
    "destructive",
];

/// Reads the typed view. Returns the best-effort spec (defaults where a field is unusable) and
/// every shape diagnostic found. `None` only when the document is not a JSON object at all.
pub fn read_spec(doc: &Value) -> (Option<ToolSpec>, Vec<Diagnostic>) {
    let mut r = Reader { diags: Vec::new() };
    let Some(obj) = doc.as_object() else {
        r.diags.push(Diagnostic::error(
            Code::SpecParse,
            "",
            format!("a spec must be a JSON object, got {}", type_name(doc)),
        ));
        return (None, r.diags);
    };
    let spec = ToolSpec {
        tool_id: r.opt_string(obj, "", "toolId"),
        name: r.required_string(obj, "", "name"),
        description: r.opt_string(obj, "", "description").unwrap_or_default(),
        category: r.opt_string(obj, "", "category"),
        tags: r.string_list(obj, "", "tags"),
        params: r.params(obj),
        static_variables: r.static_variables(obj),
        code: r.required_string(obj, "", "code"),
        code_type: r.required_string(obj, "", "codeType"),
        sandbox_overrides: r.overrides(obj),
        tool_safety: r.tool_safety(obj),
        draft: r.opt_bool(obj, "", "draft").unwrap_or(true),
        create_timestamp: r.opt_i64(obj, "", "createTimestamp"),
        update_timestamp: r.opt_i64(obj, "", "updateTimestamp"),
        human_in_the_loop: r.hitl(obj),
    };
    (Some(spec), r.diags)
}

struct Reader {
    diags: Vec<Diagnostic>,
}

/// A field's value, with absent and null told apart.
enum Slot<'a> {
    Absent,
    Null,
    Present(&'a Value),
}

fn slot<'a>(obj: &'a Map<String, Value>, key: &str) -> Slot<'a> {
    match obj.get(key) {
        None => Slot::Absent,
        Some(Value::Null) => Slot::Null,
        Some(v) => Slot::Present(v),
    }
}

impl Reader {
    fn wrong_type(&mut self, at: String, key: &str, want: &str, got: &Value) {
        self.diags.push(Diagnostic::error(
            Code::SpecParse,
            at,
            format!("`{key}` must be {want}, got {}", type_name(got)),
        ));
    }

    fn opt_string(&mut self, obj: &Map<String, Value>, base: &str, key: &str) -> Option<String> {
        match slot(obj, key) {
            Slot::Present(Value::String(s)) => Some(s.clone()),
            Slot::Present(v) => {
                self.wrong_type(pointer(base, key), key, "a string", v);
                None
            }
            _ => None,
        }
    }

    /// A MUST field (§3: name, code, codeType). Missing is an invariant breach, not a shape one.
    fn required_string(&mut self, obj: &Map<String, Value>, base: &str, key: &str) -> String {
        match slot(obj, key) {
            Slot::Present(Value::String(s)) => s.clone(),
            Slot::Present(v) => {
                self.wrong_type(pointer(base, key), key, "a string", v);
                String::new()
            }
            Slot::Absent | Slot::Null => {
                self.diags.push(Diagnostic::error(
                    Code::SpecInvariant,
                    pointer(base, key),
                    format!("`{key}` is required (spec §3) and is missing"),
                ));
                String::new()
            }
        }
    }

    fn opt_bool(&mut self, obj: &Map<String, Value>, base: &str, key: &str) -> Option<bool> {
        match slot(obj, key) {
            Slot::Present(Value::Bool(b)) => Some(*b),
            Slot::Present(v) => {
                self.wrong_type(pointer(base, key), key, "a boolean", v);
                None
            }
            _ => None,
        }
    }

    fn tri_bool(&mut self, obj: &Map<String, Value>, base: &str, key: &str) -> Tri<bool> {
        match slot(obj, key) {
            Slot::Absent => Tri::Absent,
            Slot::Null => Tri::Null,
            Slot::Present(Value::Bool(b)) => Tri::Set(*b),
            Slot::Present(v) => {
                self.wrong_type(pointer(base, key), key, "a boolean or null", v);
                Tri::Absent
            }
        }
    }

    fn opt_i64(&mut self, obj: &Map<String, Value>, base: &str, key: &str) -> Option<i64> {
        match slot(obj, key) {
            Slot::Present(v) => match v.as_i64() {
                Some(n) => Some(n),
                None => {
                    self.wrong_type(pointer(base, key), key, "an integer (epoch ms)", v);
                    None
                }
            },
            _ => None,
        }
    }

    fn string_list(&mut self, obj: &Map<String, Value>, base: &str, key: &str) -> Vec<String> {
        let at = pointer(base, key);
        match slot(obj, key) {
            Slot::Present(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => out.push(s.clone()),
                        v => self.diags.push(Diagnostic::error(
                            Code::SpecParse,
                            pointer(&at, i),
                            format!("`{key}` entries must be strings, got {}", type_name(v)),
                        )),
                    }
                }
                out
            }
            Slot::Present(v) => {
                self.wrong_type(at, key, "an array of strings", v);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn closed_shape(&mut self, obj: &Map<String, Value>, at: &str, what: &str, known: &[&str]) {
        for key in obj.keys().filter(|k| !known.contains(&k.as_str())) {
            self.diags.push(Diagnostic::error(
                Code::SpecInvariant,
                pointer(at, key),
                format!(
                    "unknown field `{key}` in {what}: the block has a closed shape in spec 1.0 (§14); known fields: {}",
                    known.join(", ")
                ),
            ));
        }
    }

    fn params(&mut self, obj: &Map<String, Value>) -> Vec<ParamSpec> {
        let items = match slot(obj, "params") {
            Slot::Present(Value::Array(items)) => items,
            Slot::Present(v) => {
                self.wrong_type("/params".into(), "params", "an array", v);
                return Vec::new();
            }
            _ => return Vec::new(),
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = pointer("/params", i);
            let Some(p) = item.as_object() else {
                self.diags.push(Diagnostic::error(
                    Code::SpecParse,
                    at,
                    format!("each param must be an object, got {}", type_name(item)),
                ));
                continue;
            };
            self.closed_shape(p, &at, "a param", PARAM_FIELDS);
            let name = self.required_string(p, &at, "name");
            let description = self.opt_string(p, &at, "description").unwrap_or_default();
            let required = match slot(p, "required") {
                Slot::Present(Value::Bool(b)) => *b,
                Slot::Present(v) => {
                    self.wrong_type(pointer(&at, "required"), "required", "a boolean", v);
                    false
                }
                _ => {
                    self.diags.push(Diagnostic::error(
                        Code::SpecInvariant,
                        pointer(&at, "required"),
                        "`required` is required on every param (spec §6.1)",
                    ));
                    false
                }
            };
            let ty_name = self.required_string(p, &at, "type");
            let ty = match ParamType::from_spec_name(&ty_name) {
                Some(t) => t,
                None => {
                    if !ty_name.is_empty() {
                        self.diags.push(Diagnostic::error(
                            Code::SpecInvariant,
                            pointer(&at, "type"),
                            format!(
                                "unknown param type {ty_name:?}: use one of STRING, INTEGER, NUMBER, BOOLEAN, OBJECT, ARRAY (uppercase, §6.2)"
                            ),
                        ));
                    }
                    ParamType::String
                }
            };
            let test_value = self.opt_string(p, &at, "testValue");
            out.push(ParamSpec {
                index: i,
                name,
                description,
                required,
                ty,
                test_value,
            });
        }
        out
    }

    fn static_variables(&mut self, obj: &Map<String, Value>) -> Vec<StaticVariable> {
        let items = match slot(obj, "staticVariables") {
            Slot::Present(Value::Array(items)) => items,
            Slot::Present(v) => {
                self.wrong_type(
                    "/staticVariables".into(),
                    "staticVariables",
                    "an array of single-entry objects (§7.1)",
                    v,
                );
                return Vec::new();
            }
            _ => return Vec::new(),
        };
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let at = pointer("/staticVariables", i);
            let Some(entry) = item.as_object() else {
                self.diags.push(Diagnostic::error(
                    Code::SpecParse,
                    at,
                    format!(
                        "each staticVariables entry must be a single-entry object like {{\"apiKey\": \"${{API_KEY}}\"}}, got {}",
                        type_name(item)
                    ),
                ));
                continue;
            };
            if entry.len() != 1 {
                self.diags.push(Diagnostic::error(
                    Code::SpecInvariant,
                    at,
                    format!(
                        "each staticVariables entry must hold exactly one key (§7.1), this one holds {}; split it into one object per variable",
                        entry.len()
                    ),
                ));
                continue;
            }
            for (key, value) in entry {
                match value {
                    Value::String(s) => out.push(StaticVariable {
                        index: i,
                        key: key.clone(),
                        value: s.clone(),
                    }),
                    v => self.diags.push(Diagnostic::error(
                        Code::SpecParse,
                        pointer(&at, key),
                        format!(
                            "static variable `{key}` must be a string, got {}",
                            type_name(v)
                        ),
                    )),
                }
            }
        }
        out
    }

    fn overrides(&mut self, obj: &Map<String, Value>) -> SandboxOverrides {
        let at = "/sandboxOverrides";
        let o = match slot(obj, "sandboxOverrides") {
            Slot::Present(Value::Object(o)) => o,
            Slot::Present(v) => {
                self.wrong_type(at.into(), "sandboxOverrides", "an object", v);
                return SandboxOverrides::default();
            }
            _ => return SandboxOverrides::default(),
        };
        self.closed_shape(o, at, "sandboxOverrides", OVERRIDE_FIELDS);
        let network_mode = match slot(o, "networkMode") {
            Slot::Absent => Tri::Absent,
            Slot::Null => Tri::Null,
            Slot::Present(Value::String(s)) => match NetworkMode::parse(s) {
                Some(m) => Tri::Set(m),
                None => {
                    self.diags.push(Diagnostic::error(
                        Code::SpecInvariant,
                        pointer(at, "networkMode"),
                        format!(
                            "unknown network mode {s:?}: use blocked, allowlist, strict or open (§10.4)"
                        ),
                    ));
                    Tri::Absent
                }
            },
            Slot::Present(v) => {
                self.wrong_type(
                    pointer(at, "networkMode"),
                    "networkMode",
                    "a string or null",
                    v,
                );
                Tri::Absent
            }
        };
        let fs_base_path = match slot(o, "fsBasePath") {
            Slot::Absent => Tri::Absent,
            Slot::Null => Tri::Null,
            Slot::Present(Value::String(s)) => Tri::Set(s.clone()),
            Slot::Present(v) => {
                self.wrong_type(
                    pointer(at, "fsBasePath"),
                    "fsBasePath",
                    "a string or null",
                    v,
                );
                Tri::Absent
            }
        };
        SandboxOverrides {
            add_allow_classes: self.string_list(o, at, "addAllowClasses"),
            remove_allow_classes: self.string_list(o, at, "removeAllowClasses"),
            add_deny_classes: self.string_list(o, at, "addDenyClasses"),
            remove_deny_classes: self.string_list(o, at, "removeDenyClasses"),
            network_mode,
            hosts_allow: self.string_list(o, at, "hostsAllow"),
            file_read: self.tri_bool(o, at, "fileRead"),
            file_write: self.tri_bool(o, at, "fileWrite"),
            fs_base_path,
            destructive: self.opt_bool(o, at, "destructive"),
        }
    }

    fn tool_safety(&mut self, obj: &Map<String, Value>) -> Option<Value> {
        match slot(obj, "toolSafety") {
            Slot::Present(v @ Value::Object(_)) => Some(v.clone()),
            Slot::Present(v) => {
                self.wrong_type("/toolSafety".into(), "toolSafety", "an object", v);
                None
            }
            _ => None,
        }
    }

    fn hitl(&mut self, obj: &Map<String, Value>) -> Option<HumanInTheLoop> {
        let at = "/humanInTheLoop";
        match slot(obj, "humanInTheLoop") {
            Slot::Present(Value::Object(h)) => {
                let mode = self.opt_string(h, at, "mode").unwrap_or_default();
                let prompt_template = self.opt_string(h, at, "promptTemplate");
                Some(HumanInTheLoop {
                    mode,
                    prompt_template,
                })
            }
            Slot::Present(v) => {
                self.wrong_type(at.into(), "humanInTheLoop", "an object", v);
                None
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> (ToolSpec, Vec<Diagnostic>) {
        let (spec, diags) = read_spec(&v);
        (spec.unwrap_or_else(|| panic!("not an object")), diags)
    }

    #[test]
    fn defaults_apply_for_absent_and_null() {
        let (s, d) = read(json!({
            "name": "a", "code": "return 1", "codeType": "Javascript",
            "description": null, "tags": null, "params": null, "draft": null
        }));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(s.description, "");
        assert!(s.tags.is_empty() && s.params.is_empty());
        assert!(s.draft, "draft defaults to true (§3)");
        assert_eq!(s.sandbox_overrides, SandboxOverrides::default());
    }

    #[test]
    fn tristates_keep_absent_null_and_value_apart() {
        let (s, _) = read(json!({
            "name": "a", "code": "x", "codeType": "Javascript",
            "sandboxOverrides": {"fileRead": null, "fileWrite": false, "fsBasePath": "/srv/x"}
        }));
        let o = &s.sandbox_overrides;
        assert_eq!(o.network_mode, Tri::Absent);
        assert_eq!(o.file_read, Tri::Null);
        assert_eq!(o.file_write, Tri::Set(false));
        assert_eq!(o.fs_base_path, Tri::Set("/srv/x".to_string()));
        assert!(o.file_read.or_inherit(true), "null inherits the baseline");
        assert!(
            !o.file_write.or_inherit(true),
            "explicit false clears the baseline"
        );
    }

    #[test]
    fn static_bag_keeps_order_and_later_duplicate_wins() {
        let (s, _) = read(json!({
            "name": "a", "code": "x", "codeType": "Javascript",
            "staticVariables": [{"b": "1"}, {"a": "2"}, {"b": "3"}]
        }));
        assert_eq!(s.static_variables.len(), 3);
        assert_eq!(s.static_bag(), vec![("b", "3"), ("a", "2")]);
    }

    #[test]
    fn parse_text_follows_declared_types() {
        assert_eq!(ParamType::Integer.parse_text("7"), Ok(json!(7)));
        assert!(ParamType::Integer.parse_text("7.5").is_err());
        assert_eq!(ParamType::Number.parse_text("4.5"), Ok(json!(4.5)));
        assert_eq!(ParamType::Number.parse_text("100"), Ok(json!(100)));
        assert!(ParamType::Number.parse_text("NaN").is_err());
        assert!(ParamType::Number.parse_text("inf").is_err());
        assert_eq!(ParamType::Boolean.parse_text("true"), Ok(json!(true)));
        assert!(ParamType::Boolean.parse_text("yes").is_err());
        assert_eq!(
            ParamType::Object.parse_text("{\"x\":3}"),
            Ok(json!({"x": 3}))
        );
        assert!(ParamType::Object.parse_text("[1]").is_err());
        assert_eq!(ParamType::Array.parse_text("[1, 3]"), Ok(json!([1, 3])));
        assert!(ParamType::Array.parse_text("{}").is_err());
        assert_eq!(ParamType::String.parse_text(" a "), Ok(json!(" a ")));
    }

    #[test]
    fn non_object_document_is_spec_parse() {
        let (s, d) = read_spec(&json!([1]));
        assert!(s.is_none());
        assert_eq!(d[0].code, Code::SpecParse);
    }
}
