//! The book (`docs/`, an mdBook) and the README hold together. Every relative link in
//! `README.md` and `docs/src/**/*.md` names a file that exists, and every `#anchor` a
//! heading of the file it points into, by the slug rules mdBook and GitHub share (lowercase;
//! spaces to `-`; letters, digits, `-` and `_` kept; everything else dropped). A link from a
//! book page stays inside `docs/src`, the only tree mdBook publishes. External links are not
//! fetched (the tests have no internet) but must be well-formed `http(s)` URLs. Every chapter
//! is listed in `SUMMARY.md`, once, and every entry of `SUMMARY.md` exists. `scripts/test`
//! builds the book itself with `mdbook build docs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

fn book_src() -> PathBuf {
    root().join("docs/src")
}

/// Every Markdown file under `dir`, sorted.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap_or_else(|e| panic!("{}: {e}", d.display())).path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The files whose links are checked: the README and every page of the book.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    docs.extend(markdown_under(&book_src()));
    docs
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `p` relative to the workspace, for messages.
fn shown(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let opener = ['`', '~'].into_iter().find_map(|c| {
            let n = t.chars().take_while(|&x| x == c).count();
            (n >= 3).then_some((c, n))
        });
        match (fence, opener) {
            (None, Some(f)) => fence = Some(f),
            (Some((c, n)), Some((c2, n2))) if c == c2 && n2 >= n && t[n2..].trim().is_empty() => {
                fence = None
            }
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// `line` with the contents of its inline code spans blanked, so that text such as
/// `` `[daemon](x)` `` is never read as a link.
fn without_code_spans(line: &str) -> String {
    let chars: Vec<char> = line.chars().collect();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let n = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run: exactly n backticks.
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = chars[j..].iter().take_while(|&&c| c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.extend(std::iter::repeat_n(' ', j + n - i));
                i = j + n;
            }
            None => {
                out.extend(&chars[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// Every link target in `text`: inline links and images `[text](target "title")`,
/// autolinks `<https://...>`, and reference definitions `[name]: target`; with its line.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, raw) in prose_lines(text) {
        let line = without_code_spans(raw);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            let target = target.trim_start_matches('<').trim_end_matches('>');
            out.push((n, target.to_string()));
            rest = &after[end..];
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("<http") {
            let after = &rest[at + 1..];
            let end = after.find('>').unwrap_or(after.len());
            out.push((n, after[..end].to_string()));
            rest = &after[end..];
        }
        let t = line.trim_start();
        if t.starts_with('[') && !t.starts_with("[[") {
            if let Some((label, target)) = t.split_once("]:") {
                if !label.contains(']') {
                    let target = target.split_whitespace().next().unwrap_or("");
                    out.push((n, target.to_string()));
                }
            }
        }
    }
    out
}

/// A heading's text as rendered: code spans, emphasis and links reduced to their text.
fn heading_text(h: &str) -> String {
    let mut s = String::new();
    let mut rest = h;
    // [text](target) -> text
    while let Some(open) = rest.find('[') {
        match rest[open..].find("](") {
            Some(mid) if !rest[open + 1..open + mid].contains('[') => {
                let after = &rest[open + mid + 2..];
                let close = after.find(')').unwrap_or(after.len());
                s.push_str(&rest[..open]);
                s.push_str(&rest[open + 1..open + mid]);
                rest = after.get(close + 1..).unwrap_or("");
            }
            _ => {
                s.push_str(&rest[..open + 1]);
                rest = &rest[open + 1..];
            }
        }
    }
    s.push_str(rest);
    s.chars().filter(|&c| c != '`' && c != '*').collect()
}

/// mdBook's `normalize_id`, which GitHub's anchors agree with for the headings we write.
fn slug(text: &str) -> String {
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown file: one per ATX heading outside code (a repeated slug gets
/// `-1`, `-2`, ... as in mdBook and GitHub).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let text = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(&heading_text(text));
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `base/rel` with `.` and `..` folded, without touching the file system.
fn join(base: &Path, rel: &str) -> PathBuf {
    let mut out = PathBuf::new();
    for c in base.join(rel).components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Why an external URL is not well-formed, if it is not.
fn bad_url(url: &str) -> Option<&'static str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        Some(_) => return Some("a port that is not a number"),
        None => authority,
    };
    let labels_ok = !host.is_empty()
        && host.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !labels_ok {
        return Some("no valid host name");
    }
    if !host.contains('.') && host != "localhost" {
        return Some("a host name without a dot");
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Some("white space in it");
    }
    None
}

/// Everything wrong with the links of one document.
fn check_document(doc: &Path, texts: &BTreeMap<PathBuf, String>) -> Vec<String> {
    let mut problems = Vec::new();
    let dir = doc.parent().expect("a document sits in a directory");
    let in_book = doc.starts_with(book_src());
    for (line, target) in links(&texts[doc]) {
        let at = format!("{}:{line}: {target:?}", shown(doc));
        if target.is_empty() {
            problems.push(format!("{at}: an empty link"));
            continue;
        }
        if let Some((scheme, _)) = target.split_once("://") {
            match scheme {
                "http" | "https" => {
                    if let Some(why) = bad_url(&target) {
                        problems.push(format!("{at}: not a well-formed URL: {why}"));
                    }
                }
                _ => problems.push(format!("{at}: only http(s) links leave the repository")),
            }
            continue;
        }
        if target.starts_with("mailto:") || target.starts_with('/') {
            problems.push(format!("{at}: write a relative link"));
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let file = if path.is_empty() {
            doc.to_path_buf()
        } else {
            join(dir, path)
        };
        if !file.exists() {
            problems.push(format!("{at}: {} does not exist", shown(&file)));
            continue;
        }
        if in_book && !file.starts_with(book_src()) {
            problems.push(format!(
                "{at}: leaves docs/src, which is all mdBook publishes"
            ));
        }
        let Some(anchor) = anchor else { continue };
        if file.extension().is_none_or(|x| x != "md") {
            problems.push(format!("{at}: an anchor into a file that is not Markdown"));
            continue;
        }
        let text = texts.get(&file).cloned().unwrap_or_else(|| read(&file));
        if !anchors(&text).contains(anchor) {
            problems.push(format!(
                "{at}: {} has no heading whose anchor is #{anchor}",
                shown(&file)
            ));
        }
    }
    problems
}

#[test]
fn every_link_of_the_readme_and_the_book_resolves() {
    let docs = documents();
    assert!(docs.len() > 10, "the book has {} pages", docs.len() - 1);
    let texts: BTreeMap<PathBuf, String> = docs.iter().map(|d| (d.clone(), read(d))).collect();
    let mut problems = Vec::new();
    let mut count = 0;
    for d in &docs {
        count += links(&texts[d]).len();
        problems.extend(check_document(d, &texts));
    }
    assert!(
        count > 100,
        "only {count} links found: is the link reader broken?"
    );
    assert!(
        problems.is_empty(),
        "{} broken links:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_chapter_is_in_the_summary_and_every_entry_exists() {
    let src = book_src();
    let summary = read(&src.join("SUMMARY.md"));
    let mut listed = BTreeMap::new();
    let mut problems = Vec::new();
    for (line, target) in links(&summary) {
        if target.contains("://") || target.contains('#') {
            problems.push(format!(
                "SUMMARY.md:{line}: {target:?} is not a chapter file"
            ));
            continue;
        }
        let file = join(&src, &target);
        if !file.is_file() {
            problems.push(format!("SUMMARY.md:{line}: {target} does not exist"));
        }
        if let Some(before) = listed.insert(file, line) {
            problems.push(format!(
                "SUMMARY.md:{line}: {target} is listed already on line {before}"
            ));
        }
    }
    for page in markdown_under(&src) {
        if page != src.join("SUMMARY.md") && !listed.contains_key(&page) {
            problems.push(format!(
                "{} is in no entry of SUMMARY.md (mdBook would not publish it)",
                shown(&page)
            ));
        }
    }
    assert!(
        listed.len() > 10,
        "SUMMARY.md lists {} chapters",
        listed.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The README is a front door: short, and its first sentence says what stsd is.
#[test]
fn the_readme_is_a_front_door() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines < 300,
        "README.md has {lines} lines: move the rest into the book"
    );
    let first = readme
        .lines()
        .skip_while(|l| l.starts_with('#') || l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let sentence = first.split(". ").next().unwrap_or_default();
    for must in ["serves", "tools", "AI agents", "MCP"] {
        assert!(
            sentence.contains(must),
            "the README's first sentence does not say {must:?}: {sentence}"
        );
    }
    // The first screen's two commands: the daemon on its bundled defaults, and the tests.
    let first_block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_default();
    let commands: Vec<&str> = first_block
        .lines()
        .filter_map(|l| l.split('#').next().map(str::trim))
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(
        commands,
        ["cargo run --release -p stsd", "scripts/test"],
        "the README's first commands"
    );
}

/// The README's Cedar example is the book's worked policy, word for word (a test of the
/// policy engine reads the README's copy).
#[test]
fn the_readmes_policy_is_the_books() {
    let readme = read(&root().join("README.md"));
    let book = read(&book_src().join("policy.md"));
    let blocks = |t: &str| -> Vec<String> {
        t.split("```cedar\n")
            .skip(1)
            .map(|b| b.split("```").next().unwrap_or_default().to_string())
            .collect()
    };
    let theirs = blocks(&book);
    for b in blocks(&readme) {
        assert!(
            theirs.contains(&b),
            "README.md has a Cedar policy that docs/src/policy.md does not:\n{b}"
        );
    }
}

#[test]
fn the_slug_rules_are_mdbooks() {
    assert_eq!(slug(&heading_text("Reload (SIGHUP)")), "reload-sighup");
    assert_eq!(
        slug(&heading_text("From `stsd new` to `stsd tools add`")),
        "from-stsd-new-to-stsd-tools-add"
    );
    assert_eq!(slug(&heading_text("`[[approval.rule]]`")), "approvalrule");
    assert_eq!(slug(&heading_text("`[secrets.NAME]`")), "secretsname");
    assert_eq!(
        slug(&heading_text("Gateway: external MCP servers")),
        "gateway-external-mcp-servers"
    );
    assert_eq!(slug(&heading_text("a [link](x.md) in it")), "a-link-in-it");
    let a = anchors("# A\n## B\n```\n# not a heading\n```\n## B\n");
    assert_eq!(a, ["a", "b", "b-1"].map(String::from).into_iter().collect());
    assert_eq!(bad_url("https://example.com/x?y#z"), None);
    assert_eq!(bad_url("http://127.0.0.1:8765/ui/"), None);
    assert!(bad_url("https://exa mple.com/").is_some());
    assert!(bad_url("https://example/").is_some());
    assert!(bad_url("https://example.com:port/").is_some());
    assert_eq!(
        links("see [a](b.md#c) and `[not](a link)` and <https://x.org>\n```\n[no](d)\n```\n"),
        [(1, "b.md#c".to_string()), (1, "https://x.org".to_string())]
    );
}
