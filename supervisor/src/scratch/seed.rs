//! The sample files a scratch workspace gets when the base path it stands in for is empty:
//! what the catalog's builtin-fs tools expect, read off their testValues (readTextFile,
//! grepFile and friends read `README.md` and look for TODO/FIXME; cutFileFields cuts fields
//! 1 and 3 of `data.csv`; editTextFile replaces "old title" in `report.md`; appendTextFile
//! appends to `log.txt`; copyFile copies `uploads/data.csv`; moveFile moves `draft.md`;
//! deleteFile deletes `obsolete.txt`; deleteDir deletes `tmp`). tests/local_pass.rs checks
//! that all 18 pass on a fresh install.

use std::path::Path;

const DATA_CSV: &str = "name,age,city\nAlice,30,Seoul\nBob,25,Paris\n";

/// (relative path, contents); a path ending in `/` is a directory.
const SAMPLES: &[(&str, &str)] = &[
    ("README.md", crate::workspace::WORKSPACE_README),
    ("data.csv", DATA_CSV),
    (
        "report.md",
        "# old title\n\nA sample report; editTextFile replaces its title.\n",
    ),
    ("log.txt", "first line\n"),
    ("uploads/", ""),
    ("uploads/data.csv", DATA_CSV),
    ("draft.md", "# Draft\n\nmoveFile renames this file.\n"),
    ("obsolete.txt", "deleteFile removes this file.\n"),
    ("tmp/", ""),
    ("tmp/scratch.txt", "deleteDir removes this directory.\n"),
];

/// Whether `dir` holds nothing of the user's: no entries, or only the README stsd seeds into
/// an empty workspace on first use.
pub fn is_fresh(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let names: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    match names.as_slice() {
        [] => true,
        [one] if one == "README.md" => std::fs::read_to_string(dir.join("README.md"))
            .is_ok_and(|t| t == crate::workspace::WORKSPACE_README),
        _ => false,
    }
}

/// Writes the samples into the (empty, private) scratch directory `dir`.
pub fn write(dir: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    for (rel, contents) in SAMPLES {
        let path = dir.join(rel.trim_end_matches('/'));
        let made = if rel.ends_with('/') {
            std::fs::create_dir(&path)
        } else {
            std::fs::write(&path, contents)
        };
        made.map_err(|e| format!("cannot seed {}: {e}", path.display()))?;
        chown(&path, owner)?;
    }
    Ok(())
}

/// lchown of `path` to `owner` (None: left as it is).
pub(super) fn chown(path: &Path, owner: Option<(u32, u32)>) -> Result<(), String> {
    match owner {
        Some((u, g)) => std::os::unix::fs::lchown(path, Some(u), Some(g))
            .map_err(|e| format!("chown {}: {e}", path.display())),
        None => Ok(()),
    }
}
