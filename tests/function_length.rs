//! Issue 32: no function of the supervisor outside its tests is longer than 120 lines
//! (`STSD_FUNCTION_LENGTH_ROOT` points it at another checkout). A long function is a list of steps that has not been named: `main`, the
//! daemon's `serve` and the gateway's `compute` each read as a list of named steps.
//!
//! Run it alone: `cargo test -p stsd-tests --test function_length`.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 120;

/// The trees it walks (the worker's binding tables are left for now: see issue 32's note).
const TREES: [&str; 1] = ["supervisor/src"];

fn root() -> PathBuf {
    std::env::var_os("STSD_FUNCTION_LENGTH_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// The code with comments, strings and character literals blanked (newlines kept), so that
/// braces count only where they are code.
fn blank(text: &str) -> Vec<char> {
    let c: Vec<char> = text.chars().collect();
    let mut out = c.clone();
    let mut i = 0;
    let wipe = |out: &mut Vec<char>, from: usize, to: usize| {
        for ch in out.iter_mut().take(to.min(c.len())).skip(from) {
            if *ch != '\n' {
                *ch = ' ';
            }
        }
    };
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p);
            wipe(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            let mut j = i;
            while j + 1 < c.len() {
                if c[j] == '/' && c[j + 1] == '*' {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c[j + 1] == '/' {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            wipe(&mut out, i, j);
            i = j;
        } else if c[i] == 'r'
            && (next == Some('"') || next == Some('#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            // r"..." or r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while j < c.len() && c[j] == '#' {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|k| c.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            wipe(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                if c[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            wipe(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), not a lifetime ('a).
            let close = if next == Some('\\') {
                c[i + 2..]
                    .iter()
                    .position(|&x| x == '\'')
                    .map(|p| i + 2 + p)
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    wipe(&mut out, i, end + 1);
                    i = end + 1;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// (name, first line, line count) of every `fn` with a body before the file's tests.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let code = blank(text);
    let s: String = code.iter().collect();
    let mut out = Vec::new();
    let bytes: Vec<char> = s.chars().collect();
    let mut search = 0;
    while let Some(p) = s[search..].find("fn ") {
        let at = search + p;
        search = at + 3;
        let before = s[..at].chars().last();
        if before.is_some_and(|b| b.is_alphanumeric() || b == '_') {
            continue;
        }
        let name: String = s[at + 3..]
            .chars()
            .take_while(|ch| ch.is_alphanumeric() || *ch == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body: the first `{` before any `;` (a declaration without a body has none).
        let rest = &s[at..];
        let (Some(open), semi) = (rest.find('{'), rest.find(';')) else {
            continue;
        };
        if semi.is_some_and(|x| x < open) {
            continue;
        }
        let start_char = s[..at + open].chars().count();
        let mut depth = 0usize;
        let mut end = start_char;
        for (k, ch) in bytes.iter().enumerate().skip(start_char) {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        let line_of =
            |char_idx: usize| bytes[..char_idx].iter().filter(|&&x| x == '\n').count() + 1;
        let first = line_of(s[..at].chars().count());
        out.push((name, first, line_of(end) - first + 1));
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap_or_else(|e| panic!("{e}")).path();
        if p.is_dir() {
            // A `tests` folder inside a module holds unit tests.
            if p.file_name().is_some_and(|n| n != "tests") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

#[test]
fn no_function_outside_tests_is_over_120_lines() {
    let root = root();
    let mut files = Vec::new();
    for t in TREES {
        rust_files(&root.join(t), &mut files);
    }
    assert!(
        files.len() > 50,
        "found only {} files under {}",
        files.len(),
        root.display()
    );
    let mut long = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for (name, line, n) in functions(&text) {
            if n > MAX_LINES {
                let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
                long.push(format!("{rel}:{line} {name}: {n} lines"));
            }
        }
    }
    long.sort();
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The counter itself: a 130-line function is found with its length, braces in strings,
/// characters and comments do not count, and a short one passes.
#[test]
fn the_counter_measures_bodies_and_ignores_braces_in_literals() {
    let mut long = String::from(
        "fn long() {\n    let s = \"}}}\"; let c = '}'; // }\n    let r = r#\"{\"#;\n",
    );
    for _ in 0..126 {
        long.push_str("    x();\n");
    }
    long.push_str("}\nfn short<'a>(x: &'a str) -> &'a str {\n    x\n}\n");
    let f = functions(&long);
    assert_eq!(
        f,
        vec![("long".to_string(), 1, 130), ("short".to_string(), 131, 3)]
    );
}
