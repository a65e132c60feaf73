//! The configuration reference (`docs/src/configuration.md`) documents every key of the
//! config file, and only keys that exist; the shipped config (`profiles/baseline.toml`)
//! names only keys that exist. The source of truth is the config's own types
//! (`stsd_profiles::baseline::Config` and the sections it holds, all `deny_unknown_fields`):
//! the default config, with every optional table filled once, is serialized and walked for
//! its keys, so a key added to a struct without a line in the book fails here, and so does
//! a line in the book or the shipped file for a key that was renamed or removed.
//!
//! In the book, a section is a heading naming its table (`` ## `[daemon]` ``,
//! `` ## `[[upstream]]` ``, `` ## `[secrets.NAME]` ``) and a key is a table row under it
//! whose first cell is the key in backticks (`` | `queue_limit` | `1024` | ... | ``).

use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use stsd_profiles::baseline::Config;

/// Arrays of tables (`[[name]]`): their keys are documented once, under `[[name]]`.
const ARRAYS: &[&str] = &["upstream", "limits", "approval.rule"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The config's keys as dotted paths: `leaves` are keys that take a value
/// (`daemon.queue_limit`, `upstream.id`, `secrets.NAME.hosts`), `tables` the tables that
/// hold them (`daemon`, `upstream`, `secrets.NAME`).
#[derive(Default, Debug)]
struct Keys {
    leaves: BTreeSet<String>,
    tables: BTreeSet<String>,
}

impl Keys {
    fn any(&self, path: &str) -> bool {
        self.leaves.contains(path) || self.tables.contains(path)
    }
}

/// The default config with every table that is absent by default present once: an
/// `[http.oauth]`, one `[[upstream]]`, one `[[limits]]`, one `[[approval.rule]]` and one
/// `[secrets.NAME]`, each at its own defaults.
fn full_config() -> Value {
    let filled = json!({
        "http": {"oauth": {"issuer": "https://auth.example.com"}},
        "upstream": [{"id": "example", "command": "example-server"}],
        "limits": [{}],
        "approval": {"rule": [{}]},
        "secrets": {"NAME": {}},
    });
    let config: Config = serde_json::from_value(filled)
        .unwrap_or_else(|e| panic!("the filled config does not deserialize: {e}"));
    serde_json::to_value(&config).expect("the config serializes")
}

fn walk(prefix: &str, v: &Value, keys: &mut Keys) {
    let Value::Object(m) = v else {
        panic!("{prefix:?} is not a table: {v}")
    };
    for (k, x) in m {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match x {
            Value::Object(t) if !t.is_empty() => {
                keys.tables.insert(path.clone());
                walk(&path, x, keys);
            }
            Value::Array(a) if ARRAYS.contains(&path.as_str()) => {
                let first = a
                    .first()
                    .unwrap_or_else(|| panic!("[[{path}]] was not filled"));
                keys.tables.insert(path.clone());
                walk(&path, first, keys);
            }
            // A value: a number, a string, a list, an unset option, or a map whose keys
            // are the operator's own names (`host_overrides`, `groups`, `env`, ...).
            _ => {
                keys.leaves.insert(path);
            }
        }
    }
}

fn struct_keys() -> Keys {
    let mut keys = Keys::default();
    walk("", &full_config(), &mut keys);
    for a in ARRAYS {
        assert!(
            keys.tables.contains(*a),
            "[[{a}]] is not in the config any more: update ARRAYS"
        );
    }
    keys
}

/// What `docs/src/configuration.md` documents: `section.key` for each key row, with its
/// line; and the problems found reading it.
fn documented() -> (BTreeMap<String, usize>, Vec<String>) {
    let text = read("docs/src/configuration.md");
    let mut section: Option<String> = None;
    let mut keys = BTreeMap::new();
    let mut problems = Vec::new();
    let mut in_code = false;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if line.starts_with('#') {
            let h = line.trim_start_matches('#').replace('`', "");
            let h = h.trim();
            section = h.starts_with('[').then(|| {
                h.trim_start_matches('[')
                    .split(']')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            });
            continue;
        }
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let key = row.split('`').next().unwrap_or_default();
        match &section {
            Some(s) => {
                if let Some(before) = keys.insert(format!("{s}.{key}"), n) {
                    problems.push(format!(
                        "configuration.md:{n}: [{s}] {key} is documented already on line {before}"
                    ));
                }
            }
            None => problems.push(format!(
                "configuration.md:{n}: `{key}` is in a table under no [section] heading"
            )),
        }
    }
    (keys, problems)
}

/// Every key `profiles/baseline.toml` names, set or commented out (`# key = value`), with
/// its line; commented-out tables (`#   [[approval.rule]]`) hold the commented keys after
/// them.
fn shipped_keys() -> Vec<(usize, String)> {
    let text = read("profiles/baseline.toml");
    let (mut table, mut commented_table) = (String::new(), String::new());
    let mut out = Vec::new();
    let is_key = |s: &str| {
        !s.is_empty()
            && s.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    for (i, line) in text.lines().enumerate() {
        let commented = line.trim_start().starts_with('#');
        let body = line.trim_start_matches(|c: char| c == '#' || c.is_whitespace());
        if body.starts_with('[') {
            let name = body
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            if !name.split('.').all(is_key) {
                continue; // prose in brackets
            }
            out.push((i + 1, name.clone()));
            if commented {
                commented_table = name;
            } else {
                table = name.clone();
                commented_table = name;
            }
            continue;
        }
        let Some((key, value)) = body.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if !is_key(key) || value.trim().is_empty() {
            continue;
        }
        if !commented {
            // A key that is set ends any commented-out table before it.
            commented_table = table.clone();
        }
        let within = if commented { &commented_table } else { &table };
        let path = if within.is_empty() {
            key.to_string()
        } else {
            format!("{within}.{key}")
        };
        out.push((i + 1, path));
    }
    out
}

#[test]
fn the_configuration_reference_documents_every_key_and_no_other() {
    let keys = struct_keys();
    assert!(
        keys.leaves.len() > 100,
        "only {} keys found: is the walk broken?",
        keys.leaves.len()
    );
    let (doc, mut problems) = documented();
    for k in &keys.leaves {
        if !doc.contains_key(k) {
            let (table, key) = k.rsplit_once('.').unwrap_or(("", k));
            problems.push(format!(
                "{k}: not documented in docs/src/configuration.md (a row `{key}` under [{table}])"
            ));
        }
    }
    for (k, line) in &doc {
        if !keys.leaves.contains(k) {
            problems.push(format!(
                "configuration.md:{line}: {k} is documented but is not a key of the config"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_shipped_config_names_only_keys_that_exist() {
    let text = read("profiles/baseline.toml");
    Config::from_toml(&text, Path::new("profiles/baseline.toml"))
        .unwrap_or_else(|e| panic!("the shipped config does not load: {e}"));
    let keys = struct_keys();
    let shipped = shipped_keys();
    assert!(
        shipped.len() > 100,
        "only {} keys read from profiles/baseline.toml: is the reader broken?",
        shipped.len()
    );
    let unknown: Vec<String> = shipped
        .iter()
        .filter(|(_, k)| !keys.any(k))
        .map(|(n, k)| format!("profiles/baseline.toml:{n}: {k} is not a key of the config"))
        .collect();
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
}

/// The readers themselves: a key the walk finds in each kind of table, and the shipped
/// file's commented-out keys.
#[test]
fn the_readers_see_every_kind_of_table() {
    let keys = struct_keys();
    for k in [
        "daemon.queue_limit",
        "http.oauth.issuer",
        "upstream.id",
        "limits.principal",
        "approval.rule.require",
        "secrets.NAME.hosts",
        "egress.host_overrides",
        "policy.groups",
    ] {
        assert!(keys.leaves.contains(k), "{k} not found: {keys:?}");
    }
    let shipped: BTreeSet<String> = shipped_keys().into_iter().map(|(_, k)| k).collect();
    for k in [
        "baseline.fs_base_path",
        "daemon.socket_group",
        "approval.rule",
        "approval.rule.tools",
        "approval.rule.command",
        "store.password",
        "telemetry.service_name",
    ] {
        assert!(
            shipped.contains(k),
            "{k} not read from profiles/baseline.toml"
        );
    }
}
