//! The store's own suite: each change whole or not at all, the history in order, the
//! switches, the ledger, the schema version, and the import of the older layout.

#![allow(clippy::unwrap_used)]

use super::*;

fn temp() -> (tempfile::TempDir, Store) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(&d.path().join("state/stsd.db")).unwrap();
    (d, s)
}

/// The conformance suite (`suite.rs`, which `tests/store_pg.rs` runs on PostgreSQL).
#[test]
fn the_conformance_suite_passes_on_sqlite() {
    let (_d, s) = temp();
    suite::run(&s);
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
    // The imported history works: a rollback puts the newest earlier version back.
    assert_eq!(s.rollback("t", |_| None).unwrap(), b"{\"v\": 2}".to_vec());
    assert_eq!(s.history("t").unwrap().len(), 1);
    // And the ledger reads back through the ledger's own type.
    let l = crate::gateway::Ledger::in_store(std::sync::Arc::new(s)).unwrap();
    assert_eq!(l.get("stsd/t").map(|e| e.approved), Some("ab".to_string()));
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
