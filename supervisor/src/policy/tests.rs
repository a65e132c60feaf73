//! The policy engine on its own: the default policy keeps the four lists' meaning, a file's
//! forbid beats the default permit by attribute, and a bad file is refused with its line.

#![allow(clippy::unwrap_used)]

use super::*;

fn tool(name: &str, write: bool) -> ToolAttrs {
    ToolAttrs {
        name: name.into(),
        file_write: write,
        file_read: write,
        risk_level: if write { 4 } else { 1 },
        network_mode: "blocked".into(),
        ..ToolAttrs::default()
    }
}

fn with_file(text: &str, extra: impl FnOnce(&mut Config)) -> (tempfile::TempDir, Config) {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("ops.cedar");
    std::fs::write(&f, text).unwrap();
    let mut c = Config::default();
    c.policy.files = vec![f];
    extra(&mut c);
    (d, c)
}

#[test]
fn the_default_policy_keeps_the_four_lists_meaning() {
    let mut c = Config::default();
    c.daemon.admin_uids = vec![4242];
    c.approval.operator_uids = vec![777];
    c.http.admin_principals = vec!["boss".into()];
    c.http.approver_principals = vec!["ops".into()];
    let p = Policy::from_config(&c).unwrap();
    let anyone = Who::uid(1001, "unix");
    let t = tool("reader", false);
    let d = p.decide(&anyone, Action::Call, Some(&t));
    assert!(d.allowed, "{d:?}");
    assert_eq!(d.policies, vec!["stsd-default:list-call".to_string()]);
    assert!(p.decide(&anyone, Action::List, Some(&t)).allowed);
    for a in [Action::Admin, Action::ReadAudit, Action::Approve] {
        assert!(!p.decide(&anyone, a, None).allowed, "{a:?}");
    }
    let admin = Who::uid(4242, "unix");
    assert!(p.decide(&admin, Action::Admin, None).allowed);
    assert!(!p.decide(&admin, Action::Approve, None).allowed);
    let op = Who::uid(777, "unix");
    assert!(p.decide(&op, Action::Approve, None).allowed);
    assert!(p.decide(&op, Action::ReadAudit, None).allowed);
    assert!(!p.decide(&op, Action::Admin, None).allowed);
    assert!(
        p.decide(&Who::http("boss", "http"), Action::Admin, None)
            .allowed
    );
    assert!(
        p.decide(&Who::http("ops", "http"), Action::Approve, None)
            .allowed
    );
    assert!(
        !p.decide(&Who::http("ops", "http"), Action::Admin, None)
            .allowed
    );
    // admin_uids written: root is not implied.
    assert!(!p.decide(&Who::uid(0, "unix"), Action::Admin, None).allowed);
}

#[test]
fn a_forbid_by_attribute_beats_the_default_permit_and_is_named() {
    let (_d, c) = with_file(
        r#"@id("agents-read-only")
forbid (principal in Stsd::Group::"agents", action == Stsd::Action::"call", resource)
when { resource.fileWrite };
"#,
        |c| {
            c.policy
                .groups
                .insert("agents".into(), vec!["alice".into()]);
        },
    );
    let p = Policy::from_config(&c).unwrap();
    let alice = Who::http("alice", "http");
    let d = p.decide(&alice, Action::Call, Some(&tool("writer", true)));
    assert!(!d.allowed);
    assert_eq!(d.policies, vec!["agents-read-only".to_string()]);
    assert!(
        p.decide(&alice, Action::Call, Some(&tool("reader", false)))
            .allowed
    );
    // Not in the group: the default permit.
    assert!(
        p.decide(
            &Who::http("bob", "http"),
            Action::Call,
            Some(&tool("writer", true))
        )
        .allowed
    );
    assert_eq!(
        p.origin("agents-read-only")
            .map(|o| o.ends_with("ops.cedar")),
        Some(true)
    );
}

#[test]
fn without_the_defaults_only_the_files_permit() {
    let (_d, c) = with_file(
        r#"permit (principal == Stsd::Principal::"uid:1000", action == Stsd::Action::"call", resource)
when { resource.riskLevel <= 2 };"#,
        |c| c.policy.defaults = false,
    );
    let p = Policy::from_config(&c).unwrap();
    let u = Who::uid(1000, "unix");
    let d = p.decide(&u, Action::Call, Some(&tool("reader", false)));
    assert!(d.allowed);
    assert_eq!(d.policies.len(), 1);
    assert!(d.policies[0].ends_with("ops.cedar#0"), "{:?}", d.policies);
    assert!(
        !p.decide(&u, Action::Call, Some(&tool("writer", true)))
            .allowed
    );
    assert!(
        !p.decide(&u, Action::List, Some(&tool("reader", false)))
            .allowed
    );
    assert!(!p.decide(&Who::uid(0, "unix"), Action::Admin, None).allowed);
}

#[test]
fn a_bad_policy_file_is_refused_with_its_file_and_line() {
    let (_d, c) = with_file(
        "permit (principal, action, resource);\n\nforbid (principal action, resource);\n",
        |_| {},
    );
    let e = Policy::from_config(&c).unwrap_err();
    assert!(e[0].contains("ops.cedar line 3"), "{e:?}");
    // Valid syntax, an attribute the schema does not have.
    let (_d, c) = with_file(
        "@id(\"typo\")\nforbid (principal, action == Stsd::Action::\"call\", resource) when { resource.fileWrites };\n",
        |_| {},
    );
    let e = Policy::from_config(&c).unwrap_err();
    assert!(e[0].contains("ops.cedar: policy typo"), "{e:?}");
    assert!(e[0].contains("fileWrites"), "{e:?}");
    let mut c = Config::default();
    c.policy.files = vec!["/nonexistent/stsd.cedar".into()];
    assert!(Policy::from_config(&c).unwrap_err()[0].contains("/nonexistent/stsd.cedar"));
}

/// The README's worked policy validates and means what it says: agents call read-only tools,
/// writes need ops, nobody calls an L5 tool.
#[test]
fn the_readme_worked_policy_holds() {
    let readme = include_str!("../../../README.md");
    let start = readme.find("```cedar\n").unwrap() + "```cedar\n".len();
    let text = &readme[start..start + readme[start..].find("```").unwrap()];
    let (_d, c) = with_file(text, |c| {
        c.policy
            .groups
            .insert("agents".into(), vec!["uid:1000".into()]);
        c.policy.groups.insert("ops".into(), vec!["alice".into()]);
    });
    let p = Policy::from_config(&c).unwrap();
    let (agent, ops) = (Who::uid(1000, "unix"), Who::http("alice", "http"));
    let (reader, writer) = (tool("reader", false), tool("writer", true));
    let mut l5 = tool("wiper", false);
    l5.risk_level = 5;
    assert!(p.decide(&agent, Action::Call, Some(&reader)).allowed);
    let d = p.decide(&agent, Action::Call, Some(&writer));
    assert!(!d.allowed);
    assert_eq!(d.policies, vec!["writes-need-ops".to_string()]);
    assert!(!p.decide(&agent, Action::List, Some(&writer)).allowed);
    assert!(p.decide(&ops, Action::Call, Some(&writer)).allowed);
    assert!(!p.decide(&ops, Action::Call, Some(&l5)).allowed);
}

#[test]
fn an_oauth_principal_is_decided_by_its_claimed_groups_and_its_kind() {
    use crate::call::{Principal, PrincipalKind};
    let (_d, c) = with_file(
        r#"@id("writes-need-ops-from-the-idp")
forbid (principal, action == Stsd::Action::"call", resource)
when { resource.fileWrite }
unless { principal in Stsd::Group::"oauth:ops" && principal.credential == "oauth" };
"#,
        |_| {},
    );
    let p = Policy::from_config(&c).unwrap();
    let mut ops = Principal::new("oauth:alice", PrincipalKind::OAuth);
    ops.groups = vec!["oauth:ops".into(), "scope:stsd:call".into()];
    let writer = tool("writer", true);
    assert!(
        p.decide(&Who::principal(&ops, "http"), Action::Call, Some(&writer))
            .allowed
    );
    assert_eq!(
        p.groups_of(&Who::principal(&ops, "http")),
        ["oauth:ops", "scope:stsd:call"]
    );
    // The same groups named by a token principal's config are not the IdP's claim: kind
    // decides; and without the claim, the forbid holds.
    let mut token = Principal::new("alice", PrincipalKind::Token);
    token.groups = vec!["oauth:ops".into()];
    assert!(
        !p.decide(&Who::principal(&token, "http"), Action::Call, Some(&writer))
            .allowed
    );
    let bob = Principal::new("oauth:bob", PrincipalKind::OAuth);
    let d = p.decide(&Who::principal(&bob, "http"), Action::Call, Some(&writer));
    assert!(!d.allowed);
    assert_eq!(d.policies, ["writes-need-ops-from-the-idp"]);
    assert_eq!(Who::parse("oauth:bob").credential, "oauth");
    assert_eq!(Who::parse("ci-bot").credential, "token");
    assert_eq!(Who::parse("ci-bot").kind, "http");
}

/// Decisions are kept per policy, keyed by all they read: the same name with other
/// attributes, another principal, another group or action is decided afresh, and a kept
/// decision is the one Cedar would make now.
#[test]
fn a_kept_decision_is_never_another_requests() {
    let (_d, c) = with_file(
        r#"@id("no-risky")
forbid (principal in Stsd::Group::"agents", action == Stsd::Action::"call", resource)
when { resource.riskLevel >= 4 };
"#,
        |c| {
            c.policy
                .groups
                .insert("agents".into(), vec!["alice".into()]);
        },
    );
    let p = Policy::from_config(&c).unwrap();
    let alice = Who::http("alice", "http");
    let mut t = tool("same-name", false);
    t.risk_level = 1;
    for _ in 0..3 {
        assert!(p.decide(&alice, Action::Call, Some(&t)).allowed);
    }
    // Re-published with a higher risk under the same name: decided again.
    t.risk_level = 4;
    for _ in 0..3 {
        let d = p.decide(&alice, Action::Call, Some(&t));
        assert!(!d.allowed);
        assert_eq!(d, p.decide_uncached(&alice, Action::Call, Some(&t)));
    }
    // Another principal, and alice through a credential group of its own.
    assert!(
        p.decide(&Who::http("bob", "http"), Action::Call, Some(&t))
            .allowed
    );
    let mut carol = Who::http("carol", "http");
    assert!(p.decide(&carol, Action::Call, Some(&t)).allowed);
    carol.credential_groups = vec!["agents".into()];
    assert_eq!(
        p.decide(&carol, Action::Call, Some(&t)),
        p.decide_uncached(&carol, Action::Call, Some(&t))
    );
    // Another action on the same tool.
    assert!(p.decide(&alice, Action::List, Some(&t)).allowed);
}
