//! Issue 32: no import cycle inside `supervisor/src`. Every module file's references to other
//! modules (`crate::a::b::Item`, `super::x::Item`, a child `x::Item`) are edges from its file
//! to the deepest module file the path names; the graph of the library's files (tests and
//! the binary's CLI files left out) must have no cycle. Lower layers import what they need
//! from a leaf (`call::vocab` for the call's vocabulary, `catalog::tool` for a served tool),
//! never from the module that uses them.
//!
//! Run it alone: `cargo test -p stsd-tests --test module_graph`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The binary's files: `main.rs` and the CLI it dispatches to.
const BINARY: [&str; 6] = [
    "main.rs",
    "cli.rs",
    "cli_run.rs",
    "cli_daemon.rs",
    "cli_gateway.rs",
    "cli_store.rs",
];

/// `supervisor/src`, or another tree's (`STSD_MODULE_GRAPH_SRC`, to check an older commit).
fn src() -> PathBuf {
    std::env::var_os("STSD_MODULE_GRAPH_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../supervisor/src"))
}

/// The file of module `path` (from the crate root), if it is one.
fn module_file(path: &[String]) -> Option<PathBuf> {
    let mut dir = src();
    let mut file = None;
    for seg in path {
        let as_dir = dir.join(seg).join("mod.rs");
        let as_file = dir.join(format!("{seg}.rs"));
        if as_dir.exists() {
            file = Some(as_dir);
        } else if as_file.exists() {
            file = Some(as_file);
        } else {
            return None;
        }
        dir = dir.join(seg);
    }
    file
}

/// The module path of a file (`exec/pool.rs` -> `[exec, pool]`).
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The deepest module file `path` names.
fn resolve(path: &[String]) -> Option<PathBuf> {
    let mut best = None;
    for k in 1..=path.len() {
        match module_file(&path[..k]) {
            Some(f) => best = Some(f),
            None => break,
        }
    }
    best
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The code of a file without comments and without its test modules (everything from the
/// first `#[cfg(test)]`, where this code base keeps them: at the end).
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `head::a::b` path in `code` with `head` one of `heads`: the segments after it.
fn paths_after(code: &str, heads: &[&str]) -> Vec<(String, Vec<String>)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !is_ident(chars[i]) || (i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < chars.len() && is_ident(chars[i]) {
            i += 1;
        }
        let head: String = chars[start..i].iter().collect();
        if !heads.contains(&head.as_str()) {
            continue;
        }
        let mut segs = Vec::new();
        while i + 2 < chars.len()
            && chars[i] == ':'
            && chars[i + 1] == ':'
            && is_ident(chars[i + 2])
        {
            i += 2;
            let s = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            segs.push(chars[s..i].iter().collect());
        }
        // A group, `head::a::{b, c::D}`: one path per item (its leading segments).
        if i + 2 < chars.len() && chars[i] == ':' && chars[i + 1] == ':' && chars[i + 2] == '{' {
            let open = i + 2;
            let mut depth = 0;
            let mut close = open;
            for (k, ch) in chars.iter().enumerate().skip(open) {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let inner: String = chars[open + 1..close].iter().collect();
            let mut level = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for ch in inner.chars() {
                match ch {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => items.push(std::mem::take(&mut item)),
                    _ if level == 0 => item.push(ch),
                    _ => {}
                }
            }
            items.push(item);
            for it in items {
                let it = it.trim();
                let lead: Vec<String> = it
                    .split("::")
                    .map(|p| p.split_whitespace().next().unwrap_or_default().to_string())
                    .take_while(|p| !p.is_empty() && p.chars().all(is_ident) && p != "self")
                    .collect();
                let mut path = segs.clone();
                path.extend(lead);
                if !path.is_empty() {
                    out.push((head.clone(), path));
                }
            }
            i = close + 1;
            continue;
        }
        if !segs.is_empty() {
            out.push((head, segs));
        }
    }
    out
}

/// file -> the files it names.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let root = src();
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap_or_else(|e| panic!("{e}")).path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut g = BTreeMap::new();
    for f in files {
        let rel = f
            .strip_prefix(&root)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        if BINARY.contains(&rel.as_str()) || rel == "lib.rs" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&f).unwrap_or_default());
        let me = module_path(&rel);
        // The child modules this file declares: `x::Item` names one of them.
        let children: Vec<String> = code
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let l = l.strip_prefix("pub ").unwrap_or(l);
                let l = l.strip_prefix("pub(crate) ").unwrap_or(l);
                let l = l.strip_prefix("pub(super) ").unwrap_or(l);
                l.strip_prefix("mod ")?
                    .strip_suffix(';')
                    .map(|m| m.trim().to_string())
            })
            .collect();
        let mut heads = vec!["crate", "super", "self"];
        heads.extend(children.iter().map(String::as_str));
        let mut edges = BTreeSet::new();
        for (head, segs) in paths_after(&code, &heads) {
            let mut path: Vec<String> = match head.as_str() {
                "crate" => Vec::new(),
                "super" => me[..me.len().saturating_sub(1)].to_vec(),
                "self" => me.clone(),
                child => {
                    let mut p = me.clone();
                    p.push(child.to_string());
                    p
                }
            };
            path.extend(segs);
            if let Some(t) = resolve(&path) {
                let t = t
                    .strip_prefix(&root)
                    .unwrap_or(&t)
                    .to_string_lossy()
                    .replace('\\', "/");
                if t != rel {
                    edges.insert(t);
                }
            }
        }
        g.insert(rel, edges);
    }
    g
}

/// The cycles of `g` (its strongly connected components of more than one file).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, iterative enough for a few hundred files.
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let Some((w, _)) = g.get_key_value(w.as_str()) else {
                continue;
            };
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low[v];
                t.low.insert(v, lv.min(lw));
            } else if t.on.contains(w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low[v];
                t.low.insert(v, lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut c = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                c.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if c.len() > 1 {
                c.sort();
                t.out.push(c);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn the_library_has_no_import_cycle() {
    let g = graph();
    assert!(g.len() > 50, "{} files: is the path right?", g.len());
    assert!(
        g["service.rs"].contains("call/mod.rs"),
        "the walker misses edges: {:?}",
        g["service.rs"]
    );
    let found = cycles(&g);
    let show: Vec<String> = found
        .iter()
        .map(|c| {
            let edges: Vec<String> = c
                .iter()
                .flat_map(|a| {
                    g[a].iter()
                        .filter(|b| c.contains(b))
                        .map(move |b| format!("{a} -> {b}"))
                })
                .collect();
            edges.join(", ")
        })
        .collect();
    assert!(found.is_empty(), "import cycles:\n{}", show.join("\n"));
}

#[test]
fn the_walker_finds_a_planted_cycle() {
    let mut g = BTreeMap::new();
    g.insert("a.rs".to_string(), BTreeSet::from(["b.rs".to_string()]));
    g.insert("b.rs".to_string(), BTreeSet::from(["c.rs".to_string()]));
    g.insert("c.rs".to_string(), BTreeSet::from(["a.rs".to_string()]));
    g.insert("d.rs".to_string(), BTreeSet::from(["a.rs".to_string()]));
    assert_eq!(cycles(&g), vec![vec!["a.rs", "b.rs", "c.rs"]]);
    let paths = paths_after(
        "use crate::call::vocab::Caller; x::y(); super::z::W",
        &["crate", "super", "x"],
    );
    assert_eq!(paths.len(), 3, "{paths:?}");
    // A group names each of its items.
    let paths = paths_after("use super::{rows::Old, Store, x::{a, b}};", &["super"]);
    let got: Vec<Vec<String>> = paths.into_iter().map(|(_, p)| p).collect();
    assert_eq!(
        got,
        vec![
            vec!["rows".to_string(), "Old".to_string()],
            vec!["Store".to_string()],
            vec!["x".to_string()]
        ]
    );
}

/// Every folder of every crate's source is named in that crate's README (as `name/`), so
/// the README is a map a reader can trust.
#[test]
fn every_source_folder_is_named_in_its_crates_readme() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut missing = Vec::new();
    for krate in ["supervisor", "worker", "protocol", "profiles"] {
        let readme = std::fs::read_to_string(root.join(krate).join("README.md"))
            .unwrap_or_else(|e| panic!("{krate}/README.md: {e}"));
        let mut stack = vec![root.join(krate).join("src")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
                let p = e.unwrap_or_else(|e| panic!("{e}")).path();
                if !p.is_dir() {
                    continue;
                }
                let name = p
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string();
                // A module's unit tests live in a `tests` folder beside it.
                if name != "tests" && !readme.contains(&format!("{name}/")) {
                    missing.push(format!("{krate}: {}", p.display()));
                }
                stack.push(p);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "folders no README names:\n{}",
        missing.join("\n")
    );
}
