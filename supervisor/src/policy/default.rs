//! The default policy: what the config's four lists meant before policies existed, so a
//! config written then keeps its meaning. Anyone who may connect may list and call the served
//! tools; `stsd:admins` (`[daemon] admin_uids`, default root and the `stsd-admin` group, and
//! `[http] admin_principals`) administer and read; `stsd:operators` (`[approval]
//! operator_uids`, `[http] approver_principals`) approve and read.

/// Its text, as `stsd policy check` shows it.
pub const TEXT: &str = r#"@id("stsd-default:list-call")
permit (
  principal,
  action in [Stsd::Action::"list", Stsd::Action::"call"],
  resource
);

@id("stsd-default:admin")
permit (
  principal in Stsd::Group::"stsd:admins",
  action in [Stsd::Action::"admin", Stsd::Action::"read_audit"],
  resource
);

@id("stsd-default:operator")
permit (
  principal in Stsd::Group::"stsd:operators",
  action in [Stsd::Action::"approve", Stsd::Action::"read_audit"],
  resource
);
"#;
