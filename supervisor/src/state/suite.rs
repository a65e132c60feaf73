//! The store's conformance suite, one for both backends: the unit tests run it on a fresh
//! SQLite file, `tests/store_pg.rs` on a fresh PostgreSQL. Each check panics on a mismatch
//! (it is test code, built for tests and test builds only).

#![allow(clippy::unwrap_used, clippy::panic)]

use super::{LedgerRow, Store};

/// Every check, in order, on `s` (which must hold no state yet).
pub fn run(s: &Store) {
    history_and_rollback(s);
    install_with_ledger(s);
    switches(s);
    waiting_calls(s);
    tokens(s);
    upstreams(s);
    spent_once(s);
}

fn upstreams(s: &Store) {
    assert!(s.upstreams().unwrap().is_empty());
    s.upstream_put("b", "{\"id\":\"b\"}").unwrap();
    s.upstream_put("a", "{\"id\":\"a\"}").unwrap();
    s.upstream_put("b", "{\"id\":\"b\",\"args\":[\"2\"]}")
        .unwrap();
    assert_eq!(
        s.upstreams().unwrap(),
        vec![
            ("a".to_string(), "{\"id\":\"a\"}".to_string()),
            (
                "b".to_string(),
                "{\"id\":\"b\",\"args\":[\"2\"]}".to_string()
            ),
        ]
    );
    assert!(s.upstream_del("a").unwrap());
    assert!(!s.upstream_del("a").unwrap());
    assert_eq!(s.upstreams().unwrap().len(), 1);
    assert!(s.upstream_del("b").unwrap());
}

fn history_and_rollback(s: &Store) {
    s.install("t", b"v1", None).unwrap();
    s.install("t", b"v2", None).unwrap();
    s.install("t", b"v3", None).unwrap();
    assert_eq!(s.tools().unwrap(), vec![("t".to_string(), b"v3".to_vec())]);
    let h: Vec<Vec<u8>> = s
        .history("t")
        .unwrap()
        .into_iter()
        .map(|(_, d)| d)
        .collect();
    assert_eq!(h, vec![b"v1".to_vec(), b"v2".to_vec()]);
    let back = s.rollback("t", |_| None).unwrap();
    assert_eq!(back, b"v2");
    assert_eq!(s.tools().unwrap(), vec![("t".to_string(), b"v2".to_vec())]);
    assert_eq!(s.history("t").unwrap().len(), 1);
    s.remove("t").unwrap();
    assert!(s.tools().unwrap().is_empty());
    assert!(!s.has_tool("t").unwrap());
    // Removed goes to the history: rollback brings it back.
    assert_eq!(s.rollback("t", |_| None).unwrap(), b"v2");
    assert!(s.remove("nope").is_err());
    assert!(s.rollback("nope", |_| None).is_err());
}

fn install_with_ledger(s: &Store) {
    s.install(
        "t",
        b"v1",
        Some(LedgerRow {
            id: "stsd/t",
            entry: "{\"a\":1}",
        }),
    )
    .unwrap();
    let (tools, _) = s.ledger().unwrap();
    assert_eq!(tools, vec![("stsd/t".to_string(), "{\"a\":1}".to_string())]);
    s.write_ledger(
        &[("stsd/t".into(), None), ("u/x".into(), Some("{}".into()))],
        &[("u".into(), 42)],
    )
    .unwrap();
    let (tools, servers) = s.ledger().unwrap();
    assert_eq!(tools, vec![("u/x".to_string(), "{}".to_string())]);
    assert_eq!(servers, vec![("u".to_string(), 42)]);
}

fn switches(s: &Store) {
    s.set_enabled("a", false).unwrap();
    s.set_enabled("b", false).unwrap();
    s.set_enabled("a", true).unwrap();
    assert_eq!(s.disabled().unwrap(), vec!["b".to_string()]);
}

/// The operator queue's rows: a decision is taken once, reaches its holder's instance only,
/// and the calls of an instance not seen within the timeout are taken out for their records.
fn waiting_calls(s: &Store) {
    let t1 = s.waiting_put("b", 7, r#"{"tool":"x"}"#).unwrap();
    let t2 = s.waiting_put("c", 8, r#"{"tool":"y"}"#).unwrap();
    assert_eq!(s.waiting_list().unwrap().len(), 2);
    assert!(s.waiting_decide(t1, r#"{"approved":true}"#).unwrap());
    assert!(!s.waiting_decide(t1, r#"{"approved":false}"#).unwrap());
    assert!(!s.waiting_decide(999, "{}").unwrap());
    assert_eq!(
        s.waiting_list().unwrap().len(),
        1,
        "a decided call is not listed"
    );
    assert_eq!(
        s.waiting_decided("b").unwrap(),
        vec![(t1, r#"{"approved":true}"#.to_string())]
    );
    assert!(s.waiting_decided("c").unwrap().is_empty());
    // "c" says it is alive, then falls silent; "b" is seen later.
    assert!(s.seen("c", 60_000).unwrap().is_empty());
    std::thread::sleep(std::time::Duration::from_millis(30));
    let gone = s.seen("b", 10).unwrap();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(
        (gone[0].instance.as_str(), gone[0].id, gone[0].ticket),
        ("c", 8, t2)
    );
    assert!(s.seen("b", 10).unwrap().is_empty(), "taken once");
}

/// Tokens: added as digests (one already there is left), removed by principal.
fn tokens(s: &Store) {
    s.tokens_add(&[
        ("alice".into(), "aa".repeat(32)),
        ("bob".into(), "bb".repeat(32)),
    ])
    .unwrap();
    s.tokens_add(&[("alice".into(), "aa".repeat(32))]).unwrap();
    assert_eq!(s.tokens().unwrap().len(), 2);
    assert_eq!(s.tokens_rm("alice").unwrap(), 1);
    assert_eq!(s.tokens_rm("alice").unwrap(), 0);
    assert_eq!(
        s.tokens().unwrap(),
        vec![("bob".to_string(), "bb".repeat(32))]
    );
}

/// An approval state is spent once; an expired one is forgotten.
fn spent_once(s: &Store) {
    let later = crate::store::now_ms() + 60_000;
    assert!(s.spend("n1", later).unwrap());
    assert!(!s.spend("n1", later).unwrap());
    assert!(s.spend("n2", later).unwrap());
}
