//! `tools/list` in pages: every page but the last holds exactly `[daemon] list_page_size`
//! tools, the pages together hold every served tool once, a cursor survives a re-publish
//! between pages, a cursor the daemon did not give out is invalid params, and the client
//! commands (`stsd call`, `stsd export`) read every page.

use serde_json::{json, Value};
use std::collections::HashSet;
use stsd_tests::harness::{Conn, Daemon};

fn spec(i: usize) -> Value {
    json!({"name": format!("tool-{i:03}"), "description": "test tool", "category": "OTHER",
           "params": [{"name": "n", "description": "a number", "required": true, "type": "NUMBER",
                       "testValue": "1"}],
           "code": "return typeof n + ' ' + (n * 2);", "codeType": "Javascript", "draft": false})
}

fn daemon_with(n: usize, extra: &str) -> (Daemon, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let cat = dir.path().join("catalog.json");
    let specs: Vec<Value> = (0..n).map(spec).collect();
    std::fs::write(&cat, Value::Array(specs).to_string()).unwrap_or_else(|e| panic!("{e}"));
    let cat_s = cat.display().to_string();
    (Daemon::start_in(dir, 1, extra, &cat_s), cat)
}

/// One page: (names, nextCursor).
fn page(c: &mut Conn, id: u64, cursor: Option<&str>) -> (Vec<String>, Option<String>) {
    let params = match cursor {
        Some(cur) => json!({"cursor": cur}),
        None => json!({}),
    };
    c.send(id, "tools/list", params);
    let r = c.response();
    let names = r["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("no tools: {r}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap_or_default().to_string())
        .collect();
    (names, r["result"]["nextCursor"].as_str().map(String::from))
}

#[test]
fn pages_hold_exactly_the_page_size_and_together_every_tool_once() {
    let (d, _) = daemon_with(250, "");
    let mut c = d.connect();
    let mut sizes = Vec::new();
    let mut all = Vec::new();
    let mut cursor = None;
    for id in 1..10 {
        let (names, next) = page(&mut c, id, cursor.as_deref());
        sizes.push(names.len());
        all.extend(names);
        cursor = next;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(sizes, vec![100, 100, 50]);
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), 250, "a tool listed twice or missed");
    let expected: Vec<String> = (0..250).map(|i| format!("tool-{i:03}")).collect();
    assert_eq!(all, expected, "the catalog's order, page after page");
}

#[test]
fn a_page_size_of_zero_lists_everything_at_once() {
    let (d, _) = daemon_with(150, "list_page_size = 0\n");
    let mut c = d.connect();
    let (names, next) = page(&mut c, 1, None);
    assert_eq!((names.len(), next), (150, None));
}

#[test]
fn a_cursor_resumes_after_its_last_tool_when_the_list_changed_between_pages() {
    let (d, cat) = daemon_with(250, "");
    let mut c = d.connect();
    let (first, cursor) = page(&mut c, 1, None);
    assert_eq!(first.last().map(String::as_str), Some("tool-099"));
    // Two tools of the first page are unpublished before the second page is asked for: an
    // offset alone would skip tool-100 and tool-101.
    let specs: Vec<Value> = (0..250).filter(|i| *i != 3 && *i != 7).map(spec).collect();
    std::fs::write(&cat, Value::Array(specs).to_string()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut id = 2;
    loop {
        let (names, _) = page(&mut c, id, None);
        id += 1;
        if !names.iter().any(|n| n == "tool-003") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reload was not seen"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (second, _) = page(&mut c, id, cursor.as_deref());
    assert_eq!(second.first().map(String::as_str), Some("tool-100"));
    assert_eq!(second.len(), 100);
}

#[test]
fn a_cursor_the_daemon_did_not_give_is_invalid_params() {
    let (d, _) = daemon_with(3, "");
    let mut c = d.connect();
    for (id, bad) in [(1, "zz"), (2, "abc"), (3, "")].into_iter() {
        c.send(id, "tools/list", json!({"cursor": bad}));
        let r = c.response_or_error();
        if bad.is_empty() {
            // An empty cursor is the first page, as clients that always send one expect.
            assert_eq!(
                r["result"]["tools"].as_array().map(Vec::len),
                Some(3),
                "{r}"
            );
        } else {
            assert_eq!(r["error"]["code"], -32602, "{bad}: {r}");
        }
    }
    // The session goes on.
    let (names, _) = page(&mut c, 9, None);
    assert_eq!(names.len(), 3);
}

#[test]
fn stsd_call_and_export_read_every_page() {
    let (d, _) = daemon_with(230, "");
    // tool-220 is on the third page; `--arg n=21` is typed by its schema as a number.
    let out = d.cli(&["call", "tool-220", "--arg", "n=21"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.trim(), "number 42");
    let out = d.cli(&["export", "--format", "mcp"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(doc["tools"].as_array().map(Vec::len), Some(230));
}
