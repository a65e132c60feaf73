//! Shared helpers for stsd's integration tests: where the shared reference material and the
//! test corpus live.

use std::path::{Path, PathBuf};

/// `shared/` beside the checkout (CI and developers have it there); `STSD_SHARED` overrides.
pub fn shared_dir() -> PathBuf {
    let dir = std::env::var_os("STSD_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared"));
    assert!(
        dir.join("catalog").is_dir(),
        "the reference catalog is missing: expected {}/catalog (set STSD_SHARED)",
        dir.display()
    );
    dir
}

pub fn catalog_dir() -> PathBuf {
    shared_dir().join("catalog")
}

/// The six catalog files that hold specs (the others are presets, categories, integrity).
pub fn catalog_spec_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(catalog_dir())
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("default-tool-specs"))
    });
    files.sort();
    assert_eq!(files.len(), 6, "expected the six catalog spec files");
    files
}

pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// Reads a JSON file the test itself relies on; a broken fixture is a test bug, so panic.
pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad JSON in {}: {e}", path.display()))
}
