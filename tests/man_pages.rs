//! The man pages `stsd generate-assets` writes (and the Debian package ships): one per
//! command at every depth, every page a page names exists, and the examples name commands
//! that have pages (issue 38 item 9: `stsd-tools(1)` named eight pages that did not exist).

use std::collections::BTreeSet;
use std::process::Command;
use stsd_tests::stsd_bin;

fn refs(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("(1)") {
        let head = &text[..i];
        let start = head
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .map_or(0, |s| s + 1);
        let name = &head[start..];
        if name.starts_with("stsd") {
            out.insert(name.to_string());
        }
    }
    out
}

#[test]
fn every_page_named_exists_and_the_examples_name_real_commands() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(stsd_bin())
        .arg("generate-assets")
        .arg(dir.path())
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let man = dir.path().join("man");
    let pages: BTreeSet<String> = std::fs::read_dir(&man)
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".1").map(String::from))
        .collect();
    for want in [
        "stsd",
        "stsd-call",
        "stsd-tools-add",
        "stsd-catalog-add",
        "stsd-secret-set",
    ] {
        assert!(pages.contains(want), "no page {want}: {pages:?}");
    }
    assert!(!pages.iter().any(|p| p.contains("-help")), "{pages:?}");
    let mut with_examples = 0;
    for p in &pages {
        let text =
            std::fs::read_to_string(man.join(format!("{p}.1"))).unwrap_or_else(|e| panic!("{e}"));
        for r in refs(&text) {
            assert!(pages.contains(&r), "{p}.1 names {r}(1), which has no page");
        }
        if let Some(ex) = text.split(".SH EXAMPLES").nth(1) {
            with_examples += 1;
            let body = ex.split(".fi").next().unwrap_or_default();
            for line in body
                .lines()
                .filter(|l| l.starts_with("stsd ") || l.contains("| stsd "))
            {
                let cmd = line.split("stsd ").nth(1).unwrap_or_default();
                let words: Vec<&str> = cmd.split_whitespace().collect();
                // The longest run of words that names a page: `stsd tools add` -> stsd-tools-add.
                let named = (0..=words.len().min(2))
                    .rev()
                    .map(|n| {
                        std::iter::once("stsd")
                            .chain(words[..n].iter().copied())
                            .collect::<Vec<_>>()
                            .join("-")
                    })
                    .find(|n| pages.contains(n));
                assert!(
                    named.is_some(),
                    "{p}.1: the example {line:?} names no command"
                );
            }
        }
    }
    assert!(
        with_examples >= 10,
        "only {with_examples} pages have examples"
    );
}
