//! The spec store: reads spec files and directories, keeps each file's raw JSON as the source
//! of truth (so unknown fields and key order survive), and writes files back atomically.
//!
//! A file holds one of three containers: a single spec object, a plain array of specs (the
//! reference catalog's form), or a bundle `{"toolSpecs": [...], ...}` (spec §12.1).

use serde_json::{Map, Value};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};
use stsd_protocol::json::parse_bounded;
use stsd_protocol::{validate_document, Code, Diagnostic, Validated};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    Single,
    Array,
    Bundle,
}

/// One file on disk and its parsed contents.
#[derive(Debug, Clone)]
pub struct SpecFile {
    pub path: PathBuf,
    pub container: Container,
    root: Value,
    trailing_newline: bool,
}

/// One spec inside a file.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Index into [`Catalog::files`].
    pub file: usize,
    /// Position inside an array or bundle; `None` for a single-spec file.
    pub index: Option<usize>,
    pub validated: Validated,
    /// The spec's toolId, or the one derived from its name (§4.1).
    pub tool_id: String,
    /// Whether `tool_id` is written in the spec (not derived).
    pub tool_id_explicit: bool,
}

/// A file that could not be read as a spec container.
#[derive(Debug, Clone)]
pub struct FileProblem {
    pub path: PathBuf,
    pub diagnostic: Diagnostic,
}

#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub files: Vec<SpecFile>,
    pub entries: Vec<Entry>,
    pub problems: Vec<FileProblem>,
    /// JSON files found while scanning a directory that hold no spec (presets, categories...).
    pub skipped: Vec<PathBuf>,
}

/// Top-level keys that mark an object as a spec rather than some other JSON document.
const SPEC_MARKERS: &[&str] = &[
    "code",
    "codeType",
    "params",
    "staticVariables",
    "sandboxOverrides",
    "toolSafety",
];

fn looks_like_spec(v: &Value) -> bool {
    v.as_object()
        .is_some_and(|o| SPEC_MARKERS.iter().any(|k| o.contains_key(*k)))
}

impl SpecFile {
    /// Parses file bytes into a container. `strict` (a file named on the command line) treats any
    /// JSON as a spec container; otherwise (a directory scan) documents with nothing spec-like are
    /// reported as skipped via `Ok(None)`.
    pub fn parse(path: &Path, bytes: &[u8], strict: bool) -> Result<Option<SpecFile>, Diagnostic> {
        let root = parse_bounded(bytes)?;
        let container = match &root {
            Value::Object(o) if o.contains_key("toolSpecs") => {
                if !o["toolSpecs"].is_array() {
                    return Err(Diagnostic::error(
                        Code::SpecParse,
                        "/toolSpecs",
                        "a bundle's `toolSpecs` must be an array of specs (§12.1)",
                    ));
                }
                Container::Bundle
            }
            Value::Array(items) => {
                if !strict && !items.iter().any(looks_like_spec) {
                    return Ok(None);
                }
                Container::Array
            }
            v @ Value::Object(_) => {
                if !strict && !looks_like_spec(v) {
                    return Ok(None);
                }
                Container::Single
            }
            other => {
                return Err(Diagnostic::error(
                    Code::SpecParse,
                    "",
                    format!(
                        "a spec file holds a spec object, an array of specs or a {{\"toolSpecs\": [...]}} bundle, got {}",
                        stsd_protocol::json::type_name(other)
                    ),
                ))
            }
        };
        Ok(Some(SpecFile {
            path: path.to_path_buf(),
            container,
            root,
            trailing_newline: bytes.ends_with(b"\n"),
        }))
    }

    /// The spec documents in file order, each with its index (None for a single spec).
    pub fn documents(&self) -> Vec<(Option<usize>, &Value)> {
        match self.container {
            Container::Single => vec![(None, &self.root)],
            Container::Array => self
                .root
                .as_array()
                .map(|a| a.iter().enumerate().map(|(i, v)| (Some(i), v)).collect())
                .unwrap_or_default(),
            Container::Bundle => self
                .root
                .get("toolSpecs")
                .and_then(Value::as_array)
                .map(|a| a.iter().enumerate().map(|(i, v)| (Some(i), v)).collect())
                .unwrap_or_default(),
        }
    }

    /// The raw spec object at `index`, for an edit.
    pub fn document_mut(&mut self, index: Option<usize>) -> Option<&mut Map<String, Value>> {
        let v = match (self.container, index) {
            (Container::Single, None) => &mut self.root,
            (Container::Array, Some(i)) => self.root.get_mut(i)?,
            (Container::Bundle, Some(i)) => self.root.get_mut("toolSpecs")?.get_mut(i)?,
            _ => return None,
        };
        v.as_object_mut()
    }

    /// Marks a spec as persisted now: `createTimestamp` once, `updateTimestamp` every time
    /// (§12.2), and a derived `toolId` when the spec has none (§4.1).
    pub fn touch(&mut self, index: Option<usize>, now_ms: i64) -> bool {
        let Some(doc) = self.document_mut(index) else {
            return false;
        };
        if doc.get("toolId").is_none_or(Value::is_null) {
            if let Some(name) = doc.get("name").and_then(Value::as_str) {
                let id = stsd_protocol::ids::derive_tool_id(name);
                doc.insert("toolId".into(), Value::String(id));
            }
        }
        if doc.get("createTimestamp").is_none_or(Value::is_null) {
            doc.insert("createTimestamp".into(), Value::from(now_ms));
        }
        doc.insert("updateTimestamp".into(), Value::from(now_ms));
        true
    }

    /// The file's bytes as stsd writes them: 2-space pretty JSON, the same form the reference
    /// catalog uses, keeping the original's trailing newline (or its absence).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(&self.root).unwrap_or_default();
        if self.trailing_newline {
            out.push(b'\n');
        }
        out
    }

    /// Atomic replace: write a temp file in the same directory, fsync it, rename it over the
    /// target, fsync the directory. A crash leaves either the old file or the new one.
    pub fn write_atomic(&self) -> std::io::Result<()> {
        write_atomic(&self.path, &self.to_bytes())
    }
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "spec.json".into());
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        // Keep the target's permissions when replacing an existing file.
        if let Ok(meta) = fs::metadata(path) {
            fs::set_permissions(&tmp, meta.permissions())?;
        }
        fs::rename(&tmp, path)?;
        File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Catalog {
    /// Loads every path: files directly, directories by their `*.json` files (recursively,
    /// sorted, hidden entries skipped).
    pub fn load(paths: &[PathBuf]) -> Catalog {
        Catalog::load_with(paths, Vec::new())
    }

    /// Like [`Catalog::load`], plus files already in memory (the bundled catalog), all checked
    /// for uniqueness together.
    pub fn load_with(paths: &[PathBuf], extra: Vec<SpecFile>) -> Catalog {
        let mut cat = Catalog::default();
        for f in extra {
            cat.add_file(f);
        }
        for p in paths {
            if p.is_dir() {
                let mut files = Vec::new();
                collect_json_files(p, &mut files, &mut cat.problems);
                for f in files {
                    cat.load_file(&f, false);
                }
            } else {
                cat.load_file(p, true);
            }
        }
        cat.check_uniqueness();
        cat
    }

    fn load_file(&mut self, path: &Path, strict: bool) {
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                self.problems.push(FileProblem {
                    path: path.to_path_buf(),
                    diagnostic: Diagnostic::error(
                        Code::SpecParse,
                        "",
                        format!("cannot read file: {e}"),
                    ),
                });
                return;
            }
        };
        match SpecFile::parse(path, &bytes, strict) {
            Ok(Some(file)) => self.add_file(file),
            Ok(None) => self.skipped.push(path.to_path_buf()),
            Err(diagnostic) => self.problems.push(FileProblem {
                path: path.to_path_buf(),
                diagnostic,
            }),
        }
    }

    pub fn add_file(&mut self, file: SpecFile) {
        let file_idx = self.files.len();
        for (index, doc) in file.documents() {
            let validated = validate_document(doc);
            let explicit = validated
                .spec
                .as_ref()
                .and_then(|s| s.tool_id.clone())
                .filter(|id| !id.trim().is_empty());
            let tool_id = match (&explicit, &validated.spec) {
                (Some(id), _) => id.clone(),
                (None, Some(s)) => stsd_protocol::ids::derive_tool_id(&s.name),
                (None, None) => String::new(),
            };
            self.entries.push(Entry {
                file: file_idx,
                index,
                validated,
                tool_id,
                tool_id_explicit: explicit.is_some(),
            });
        }
        self.files.push(file);
    }

    /// Where an entry lives, for messages: `path` or `path#3`.
    pub fn location(&self, e: &Entry) -> String {
        let path = self.files[e.file].path.display();
        match e.index {
            Some(i) => format!("{path}#{i}"),
            None => path.to_string(),
        }
    }

    /// §4.1 and §4.2: toolIds are unique within a catalog; published (non-draft) names are
    /// unique. The later duplicate gets the error and so is refused.
    fn check_uniqueness(&mut self) {
        let mut found = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let Some(spec) = &e.validated.spec else {
                continue;
            };
            for (j, earlier) in self.entries[..i].iter().enumerate() {
                let Some(other) = &earlier.validated.spec else {
                    continue;
                };
                // Two derived ids collide only when the names do, which the name rule covers
                // (drafts may share a name).
                let either_explicit = e.tool_id_explicit || earlier.tool_id_explicit;
                if either_explicit && !e.tool_id.is_empty() && e.tool_id == earlier.tool_id {
                    found.push((
                        i,
                        Diagnostic::error(
                            Code::SpecInvariant,
                            "/toolId",
                            format!(
                                "toolId {} is already used by {:?} at {}; toolIds must be unique within a catalog (§4.1)",
                                e.tool_id,
                                other.name,
                                self.location(&self.entries[j])
                            ),
                        ),
                    ));
                }
                if !spec.draft && !other.draft && spec.name == other.name {
                    found.push((
                        i,
                        Diagnostic::error(
                            Code::SpecInvariant,
                            "/name",
                            format!(
                                "published name {:?} is already taken by {}; published names must be unique (§4.2), drafts are exempt",
                                spec.name,
                                self.location(&self.entries[j])
                            ),
                        ),
                    ));
                }
            }
        }
        for (i, d) in found {
            self.entries[i].validated.diagnostics.push(d);
        }
    }
}

fn collect_json_files(dir: &Path, out: &mut Vec<PathBuf>, problems: &mut Vec<FileProblem>) {
    let mut items: Vec<PathBuf> = match fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) => {
            problems.push(FileProblem {
                path: dir.to_path_buf(),
                diagnostic: Diagnostic::error(
                    Code::SpecParse,
                    "",
                    format!("cannot read directory: {e}"),
                ),
            });
            return;
        }
    };
    items.sort();
    for p in items {
        let hidden = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'));
        if hidden {
            continue;
        }
        if p.is_dir() {
            collect_json_files(&p, out, problems);
        } else if p.extension().is_some_and(|e| e == "json") {
            out.push(p);
        }
    }
}
