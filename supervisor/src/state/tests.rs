//! The store's own suite: each change whole or not at all, the history in order, the
//! switches, the ledger, the schema version, and the import of the older layout.

#![allow(clippy::unwrap_used)]

use super::*;

fn temp() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(&d.path().join("state/stsd.db")).unwrap();
    (d, s)
}

#[test]
fn install_keeps_the_history_and_rollback_restores_it() {
    let (_d, s) = temp();
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

#[test]
fn an_install_and_its_ledger_approval_commit_together() {
    let (_d, s) = temp();
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

#[test]
fn a_failed_change_leaves_nothing_of_itself() {
    let d = tempfile::tempdir().unwrap();
    let s = sqlite::Sqlite::open(&d.path().join("stsd.db")).unwrap();
    s.install("t", b"v1", None).unwrap();
    // A change that fails half-way (its old version already moved to the history) leaves
    // nothing of itself.
    let r = s.write(|tx| {
        sqlite::retire(tx, "t", 1).map_err(|e| e.to_string())?;
        Err::<(), _>("stopped half-way".to_string())
    });
    assert!(r.is_err());
    assert_eq!(s.tools().unwrap(), vec![("t".to_string(), b"v1".to_vec())]);
    assert!(s.history("t").unwrap().is_empty());
}

#[test]
fn switches_disable_and_enable() {
    let (_d, s) = temp();
    s.set_enabled("a", false).unwrap();
    s.set_enabled("b", false).unwrap();
    s.set_enabled("a", true).unwrap();
    assert_eq!(s.disabled().unwrap(), vec!["b".to_string()]);
}

#[test]
fn a_store_of_a_newer_schema_is_refused_and_reopening_migrates_nothing_twice() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("stsd.db");
    drop(Store::open(&p).unwrap());
    let s = Store::open(&p).unwrap();
    s.install("t", b"v1", None).unwrap();
    drop(s);
    {
        let c = rusqlite::Connection::open(&p).unwrap();
        c.pragma_update(None, "user_version", 99).unwrap();
    }
    let e = Store::open(&p).unwrap_err();
    assert!(e.contains("newer than this stsd reads"), "{e}");
}

#[test]
fn the_older_layout_is_imported_once_verified_and_kept() {
    let d = tempfile::tempdir().unwrap();
    let cat = d.path().join("catalog");
    std::fs::create_dir_all(cat.join("specs")).unwrap();
    std::fs::create_dir_all(cat.join("history/t")).unwrap();
    std::fs::write(cat.join("specs/t.json"), b"{\"v\": 3}").unwrap();
    std::fs::write(cat.join("specs/u.json"), b"{\"v\": 1}").unwrap();
    std::fs::write(
        cat.join("history/t/00000001700000000001.json"),
        b"{\"v\": 1}",
    )
    .unwrap();
    std::fs::write(
        cat.join("history/t/00000001700000000002.json"),
        b"{\"v\": 2}",
    )
    .unwrap();
    std::fs::write(
        cat.join("toolsets.json"),
        br#"{"toolsets": [{"id": "stsd-operator", "kind": "builtin", "tools": [{"name": "u", "enabled": false}]}]}"#,
    )
    .unwrap();
    let ledger = d.path().join("ledger.json");
    std::fs::write(
        &ledger,
        br#"{"version": 1, "tools": {"stsd/t": {"approved": "ab", "state": "ACTIVE", "pending": null, "firstSeenMs": 1, "lastSeenMs": 2, "approvedAtMs": 3}}, "servers": {"up": {"lastUsedMs": 7}}}"#,
    )
    .unwrap();
    let s = Store::open(&d.path().join("stsd.db")).unwrap();
    let got = import::once(&s, &cat, &ledger).unwrap().unwrap();
    assert_eq!(
        (got.tools, got.history, got.switches, got.ledger),
        (2, 2, 1, 1)
    );
    assert_eq!(
        s.tools().unwrap(),
        vec![
            ("t".to_string(), b"{\"v\": 3}".to_vec()),
            ("u".to_string(), b"{\"v\": 1}".to_vec())
        ]
    );
    // In order, each with when it was retired (its file name's timestamp, milliseconds).
    assert_eq!(
        s.history("t").unwrap(),
        vec![
            (1_700_000_000_001, b"{\"v\": 1}".to_vec()),
            (1_700_000_000_002, b"{\"v\": 2}".to_vec())
        ]
    );
    assert_eq!(s.disabled().unwrap(), vec!["u".to_string()]);
    let (tools, servers) = s.ledger().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(servers, vec![("up".to_string(), 7)]);
    // The old files are kept, renamed; a second start imports nothing.
    assert!(cat.join("specs.imported/t.json").is_file());
    assert!(cat.join("history.imported").is_dir());
    assert!(cat.join("toolsets.json.imported").is_file());
    assert!(d.path().join("ledger.json.imported").is_file());
    assert!(!cat.join("specs").exists());
    assert_eq!(import::once(&s, &cat, &ledger).unwrap(), None);
    // And the ledger reads back through the ledger's own type.
    let l = crate::gateway::Ledger::in_store(std::sync::Arc::new(s)).unwrap();
    assert_eq!(l.get("stsd/t").map(|e| e.approved), Some("ab".to_string()));
}

/// The operator queue's rows: a decision is taken once, reaches its holder's instance only,
/// and the calls of an instance not seen within the timeout are taken out for their records.
#[test]
fn waiting_calls_are_decided_once_and_a_silent_instance_gives_its_calls_up() {
    let (_d, s) = temp();
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

/// `[store] password` is a reference resolved from `[gateway] secrets_dir` (or the
/// environment), never the password itself; with `password_file` as well it is refused.
#[test]
fn the_store_password_is_a_reference_or_a_file_never_a_literal() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("db"), "hunter2\n").unwrap();
    let mut c = stsd_profiles::Config::default();
    c.gateway.secrets_dir = Some(d.path().to_path_buf());
    c.store.password = Some("${secret:db}".into());
    assert_eq!(password(&c).unwrap().as_deref(), Some("hunter2"));
    c.store.password = Some("${secret:missing}".into());
    let e = password(&c).unwrap_err();
    assert!(
        e.contains("${secret:missing}") && !e.contains("hunter2"),
        "{e}"
    );
    c.store.password = Some("hunter2".into());
    assert!(password(&c).unwrap_err().contains("must be a reference"));
    c.store.password = None;
    c.store.password_file = Some(d.path().join("db"));
    assert_eq!(password(&c).unwrap().as_deref(), Some("hunter2"));
    c.store.password = Some("${secret:db}".into());
    assert!(password(&c).unwrap_err().contains("give one of them"));
}
