//! The effective approval requirement of one tool, computed when the catalog is published.
//!
//! Inputs: the spec's `humanInTheLoop.mode`, the operator's toolsets switch for the tool (seed
//! 003), and the first matching `[[approval.rule]]`. The operator can always tighten; lifting
//! a spec's REQUIRED needs `allow_override_required`. Among the operator's own switches a
//! `true` wins over a `false`. The precedence table in docs/src/approval.md is this function; each row has a
//! test below.

use stsd_profiles::approval::{ApprovalConfig, ApprovalRule, StrategyKind};
use stsd_profiles::RiskLevel;

/// What the policy needs to know about a tool.
#[derive(Debug, Clone)]
pub struct ToolFacts<'a> {
    pub name: &'a str,
    pub category: Option<&'a str>,
    pub risk: RiskLevel,
    pub destructive: bool,
    /// `humanInTheLoop.mode` is REQUIRED.
    pub spec_required: bool,
    /// The effective posture writes files.
    pub file_write: bool,
    /// The effective network mode.
    pub network: stsd_protocol::NetworkMode,
    /// Published through the admin channel (the managed catalog), not from a catalog the
    /// operator laid out: see [`gated_by_default`].
    pub admin_published: bool,
}

impl<'a> ToolFacts<'a> {
    /// The facts of one of stsd's own tools, from its spec and its resolved posture: one
    /// place, so that `stsd check`, `stsd run` and the daemon decide alike.
    pub fn of_spec(
        spec: &'a stsd_protocol::ToolSpec,
        resolved: &stsd_profiles::Resolved,
        admin_published: bool,
    ) -> ToolFacts<'a> {
        let caps = &resolved.tool_safety.capabilities;
        ToolFacts {
            name: &spec.name,
            category: spec.category.as_deref(),
            risk: resolved.risk,
            destructive: caps.destructive,
            spec_required: spec
                .human_in_the_loop
                .as_ref()
                .is_some_and(|h| h.mode.eq_ignore_ascii_case("REQUIRED")),
            file_write: caps.file_write,
            network: caps.network.mode,
            admin_published,
        }
    }
}

/// A tool published through the admin channel whose posture writes files, deletes, or
/// reaches the network starts gated, whatever its spec says: whoever holds the admin channel
/// (or takes it over) must not be able to publish a copy of a gated tool without its gate, or
/// under a name no rule matches. Only an operator's explicit switch (a rule, or a toolsets
/// document, saying `false`) lifts it.
pub fn gated_by_default(t: &ToolFacts) -> bool {
    t.admin_published
        && (t.file_write || t.destructive || t.network != stsd_protocol::NetworkMode::Blocked)
}

/// Where the requirement came from, for `stsd check`, the banner, `_meta` and the audit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// No input asks for approval.
    Unset,
    /// The spec's `humanInTheLoop: REQUIRED`.
    Spec,
    /// A toolsets document's `requiresApproval` (tool or toolsetDefaults).
    Toolset,
    /// An `[[approval.rule]]`'s `require`.
    Rule,
    /// Published through the admin channel with a posture that writes, deletes or reaches
    /// the network ([`gated_by_default`]).
    Published,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Unset => "none",
            Source::Spec => "spec",
            Source::Toolset => "toolset",
            Source::Rule => "rule",
            Source::Published => "admin-published",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    pub required: bool,
    /// Why (for a requirement lifted by an override: the switch that lifted it).
    pub source: Source,
    /// The strategy consulted when `required`.
    pub strategy: StrategyKind,
    /// The matching rule's index, if any.
    pub rule: Option<usize>,
    /// A spec's REQUIRED was lifted by an operator switch (allow_override_required).
    pub overrode_spec: bool,
    /// An operator switch tried to lift a spec's REQUIRED without allow_override_required:
    /// ignored, and said at load.
    pub refused_override: bool,
    /// The rule's reject reason or command, carried for the strategy.
    pub reason: Option<String>,
    pub command: Vec<String>,
}

/// Seed 001: a gated tool is shown one band lower, floored at L1 (L0 and L1 stay).
pub fn mitigated(risk: RiskLevel) -> RiskLevel {
    let i = RiskLevel::ALL.iter().position(|r| *r == risk).unwrap_or(0);
    if i <= 1 {
        risk
    } else {
        RiskLevel::ALL[i - 1]
    }
}

fn matches(rule: &ApprovalRule, t: &ToolFacts) -> bool {
    (rule.tools.is_empty() || rule.tools.iter().any(|n| n == t.name))
        && rule
            .category
            .as_deref()
            .is_none_or(|c| t.category.is_some_and(|tc| tc.eq_ignore_ascii_case(c)))
        && rule.min_risk.is_none_or(|m| t.risk >= m)
        && rule.destructive.is_none_or(|d| d == t.destructive)
        && rule.file_write.is_none_or(|w| w == t.file_write)
        && rule
            .network_mode
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(t.network.as_str()))
}

/// The effective requirement. `toolset` is the toolsets documents' `requiresApproval` for
/// this tool (its own flag, else its toolset's default), when a document lists it.
pub fn requirement(t: &ToolFacts, toolset: Option<bool>, cfg: &ApprovalConfig) -> Requirement {
    let rule_idx = cfg.rules.iter().position(|r| matches(r, t));
    let rule = rule_idx.map(|i| &cfg.rules[i]);
    // The operator's say. Seeds 002 and 003: a tool's own flag (`requiresApproval`, in a
    // toolsets document that lists it) decides over a global strategy, so `false` exempts
    // it from a rule that does not name it. Switches that name the tool (its toolsets flag,
    // a rule whose `tools` lists it) decide first, a `true` among them winning over a
    // `false`; a broad rule (by category, risk or capability) only when none of them speaks.
    let names_tool = rule.is_some_and(|r| !r.tools.is_empty());
    let rule_switch = (rule.and_then(|r| r.require), Source::Rule);
    let toolset_switch = (toolset, Source::Toolset);
    let switches: Vec<(Option<bool>, Source)> = if names_tool {
        vec![rule_switch, toolset_switch]
    } else if toolset.is_some() {
        vec![toolset_switch]
    } else {
        vec![rule_switch]
    };
    let tighten = switches.iter().find(|(v, _)| *v == Some(true)).map(|s| s.1);
    let loosen = switches
        .iter()
        .find(|(v, _)| *v == Some(false))
        .map(|s| s.1);
    let (required, source, overrode_spec, refused_override) =
        match (t.spec_required, tighten, loosen) {
            (false, Some(by), _) => (true, by, false, false),
            (false, None, Some(by)) if gated_by_default(t) => (false, by, false, false),
            (false, None, None) if gated_by_default(t) => (true, Source::Published, false, false),
            (false, None, _) => (false, Source::Unset, false, false),
            (true, Some(_), _) => (true, Source::Spec, false, false),
            (true, None, Some(by)) if cfg.allow_override_required => (false, by, true, false),
            (true, None, Some(_)) => (true, Source::Spec, false, true),
            (true, None, None) => (true, Source::Spec, false, false),
        };
    Requirement {
        required,
        source,
        strategy: if required {
            rule.and_then(|r| r.strategy)
                .unwrap_or(cfg.default_strategy)
        } else {
            StrategyKind::Approve
        },
        rule: rule_idx,
        overrode_spec,
        refused_override,
        reason: rule.and_then(|r| r.reason.clone()),
        command: rule.map(|r| r.command.clone()).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(spec_required: bool) -> ToolFacts<'static> {
        ToolFacts {
            name: "deleteFile",
            category: Some("FILES"),
            risk: RiskLevel::L5,
            destructive: true,
            spec_required,
            file_write: true,
            network: stsd_protocol::NetworkMode::Blocked,
            admin_published: false,
        }
    }

    fn cfg(rule_require: Option<bool>, allow: bool) -> ApprovalConfig {
        ApprovalConfig {
            allow_override_required: allow,
            rules: rule_require
                .map(|r| {
                    vec![ApprovalRule {
                        tools: vec!["deleteFile".into()],
                        require: Some(r),
                        ..ApprovalRule::default()
                    }]
                })
                .unwrap_or_default(),
            ..ApprovalConfig::default()
        }
    }

    /// (spec REQUIRED, toolset, rule, allow_override_required) -> (required, source,
    /// overrode, refused). One line per row of that table.
    type Row = (
        bool,
        Option<bool>,
        Option<bool>,
        bool,
        (bool, Source, bool, bool),
    );

    /// Issue 31 item 3: a tool published through the admin channel whose posture writes,
    /// deletes or reaches the network starts gated; only an operator's explicit `false` (a
    /// rule or a toolsets document) lifts it, and rules match by capability.
    #[test]
    fn an_admin_published_tool_that_writes_deletes_or_reaches_out_starts_gated() {
        use stsd_protocol::NetworkMode;
        let base = ToolFacts {
            name: "copyOfDelete",
            category: None,
            risk: RiskLevel::L3,
            destructive: false,
            spec_required: false,
            file_write: false,
            network: NetworkMode::Blocked,
            admin_published: true,
        };
        let none = ApprovalConfig::default();
        // Read-only and offline: nothing to gate.
        let r = requirement(&base, None, &none);
        assert_eq!((r.required, r.source), (false, Source::Unset));
        for t in [
            ToolFacts {
                file_write: true,
                ..base.clone()
            },
            ToolFacts {
                destructive: true,
                ..base.clone()
            },
            ToolFacts {
                network: NetworkMode::Allowlist,
                ..base.clone()
            },
        ] {
            let r = requirement(&t, None, &none);
            assert_eq!((r.required, r.source), (true, Source::Published), "{t:?}");
            // The same tool from a catalog the operator laid out: as its spec says.
            let laid_out = ToolFacts {
                admin_published: false,
                ..t.clone()
            };
            assert!(!requirement(&laid_out, None, &none).required);
            // A toolsets document's explicit false lifts it.
            let r = requirement(&t, Some(false), &none);
            assert_eq!((r.required, r.source), (false, Source::Toolset));
        }
        // Rules match by capability: file_write, network_mode, destructive.
        let lift = |rule: ApprovalRule| ApprovalConfig {
            rules: vec![ApprovalRule {
                require: Some(false),
                ..rule
            }],
            ..ApprovalConfig::default()
        };
        let writes = ToolFacts {
            file_write: true,
            ..base.clone()
        };
        let r = requirement(
            &writes,
            None,
            &lift(ApprovalRule {
                file_write: Some(true),
                ..ApprovalRule::default()
            }),
        );
        assert_eq!((r.required, r.source), (false, Source::Rule));
        let r = requirement(
            &writes,
            None,
            &lift(ApprovalRule {
                file_write: Some(false),
                ..ApprovalRule::default()
            }),
        );
        assert_eq!((r.required, r.source), (true, Source::Published));
        let net = ToolFacts {
            network: NetworkMode::Open,
            ..base.clone()
        };
        let r = requirement(
            &net,
            None,
            &lift(ApprovalRule {
                network_mode: Some("OPEN".into()),
                ..ApprovalRule::default()
            }),
        );
        assert_eq!((r.required, r.source), (false, Source::Rule));
        let r = requirement(
            &net,
            None,
            &lift(ApprovalRule {
                network_mode: Some("allowlist".into()),
                ..ApprovalRule::default()
            }),
        );
        assert!(r.required);
        // A rule can gate by capability any tool, admin-published or not.
        let gate_writes = ApprovalConfig {
            rules: vec![ApprovalRule {
                file_write: Some(true),
                require: Some(true),
                ..ApprovalRule::default()
            }],
            ..ApprovalConfig::default()
        };
        let laid_out = ToolFacts {
            admin_published: false,
            ..writes.clone()
        };
        let r = requirement(&laid_out, None, &gate_writes);
        assert_eq!((r.required, r.source), (true, Source::Rule));
        // The spec's own REQUIRED is not lifted by the admin default's lift rules alone.
        let required = ToolFacts {
            spec_required: true,
            ..writes.clone()
        };
        let r = requirement(
            &required,
            None,
            &lift(ApprovalRule {
                file_write: Some(true),
                ..ApprovalRule::default()
            }),
        );
        assert_eq!((r.required, r.source), (true, Source::Spec));
    }

    #[test]
    fn every_row_of_the_precedence_table() {
        use Source::{Rule, Spec, Toolset, Unset};
        let rows: &[Row] = &[
            (false, None, None, false, (false, Unset, false, false)),
            (
                false,
                Some(true),
                None,
                false,
                (true, Toolset, false, false),
            ),
            (false, None, Some(true), false, (true, Rule, false, false)),
            (
                false,
                Some(false),
                None,
                false,
                (false, Unset, false, false),
            ),
            (
                false,
                Some(false),
                Some(true),
                false,
                (true, Rule, false, false),
            ),
            (
                false,
                Some(true),
                Some(false),
                false,
                (true, Toolset, false, false),
            ),
            (true, None, None, false, (true, Spec, false, false)),
            (true, Some(true), None, false, (true, Spec, false, false)),
            (true, Some(false), None, false, (true, Spec, false, true)),
            (true, None, Some(false), false, (true, Spec, false, true)),
            (true, Some(false), None, true, (false, Toolset, true, false)),
            (true, None, Some(false), true, (false, Rule, true, false)),
            (
                true,
                Some(false),
                Some(true),
                true,
                (true, Spec, false, false),
            ),
        ];
        for (i, (spec, toolset, rule, allow, want)) in rows.iter().enumerate() {
            let r = requirement(&facts(*spec), *toolset, &cfg(*rule, *allow));
            assert_eq!(
                (r.required, r.source, r.overrode_spec, r.refused_override),
                *want,
                "row {i}: spec={spec} toolset={toolset:?} rule={rule:?} allow={allow}"
            );
        }
    }

    #[test]
    fn the_first_matching_rule_names_the_strategy_and_conditions_all_hold() {
        let c = ApprovalConfig {
            rules: vec![
                ApprovalRule {
                    category: Some("NETWORK".into()),
                    strategy: Some(StrategyKind::Reject),
                    ..ApprovalRule::default()
                },
                ApprovalRule {
                    min_risk: Some(RiskLevel::L4),
                    destructive: Some(true),
                    strategy: Some(StrategyKind::Operator),
                    ..ApprovalRule::default()
                },
            ],
            ..ApprovalConfig::default()
        };
        let r = requirement(&facts(true), None, &c);
        assert_eq!((r.strategy, r.rule), (StrategyKind::Operator, Some(1)));
        let mut low = facts(true);
        low.risk = RiskLevel::L3;
        let r = requirement(&low, None, &c);
        assert_eq!((r.strategy, r.rule), (StrategyKind::Elicit, None));
        // Not required: nothing to consult.
        let r = requirement(&facts(false), None, &c);
        assert_eq!((r.required, r.strategy), (false, StrategyKind::Approve));
    }

    /// Issue 32, from seeds 002 and 003: a tool's own `requiresApproval: false` exempts it
    /// from a global rule (one that does not name it); a rule that names it is the tool's
    /// own switch too, and then a `true` wins. The spec's REQUIRED is not lifted by either.
    #[test]
    fn a_tools_own_false_exempts_it_from_a_global_rule_but_not_from_one_naming_it() {
        let global = |require: bool| ApprovalConfig {
            rules: vec![ApprovalRule {
                require: Some(require),
                reason: Some("global deny".into()),
                ..ApprovalRule::default()
            }],
            ..ApprovalConfig::default()
        };
        let r = requirement(&facts(false), Some(false), &global(true));
        assert_eq!((r.required, r.source), (false, Source::Unset));
        // Without a word of its own, the global rule holds.
        let r = requirement(&facts(false), None, &global(true));
        assert_eq!((r.required, r.source), (true, Source::Rule));
        // The tool's own true holds against a global false.
        let r = requirement(&facts(false), Some(true), &global(false));
        assert_eq!((r.required, r.source), (true, Source::Toolset));
        // A rule naming the tool: both are its own switches, and true wins.
        let r = requirement(&facts(false), Some(false), &cfg(Some(true), false));
        assert_eq!((r.required, r.source), (true, Source::Rule));
        // The spec's REQUIRED stays (the switch is refused, as the table says).
        let r = requirement(&facts(true), Some(false), &global(true));
        assert_eq!(
            (r.required, r.source, r.refused_override),
            (true, Source::Spec, true)
        );
    }

    #[test]
    fn a_gated_tool_is_shown_one_band_lower_floored_at_l1() {
        assert_eq!(mitigated(RiskLevel::L5), RiskLevel::L4);
        assert_eq!(mitigated(RiskLevel::L2), RiskLevel::L1);
        assert_eq!(mitigated(RiskLevel::L1), RiskLevel::L1);
        assert_eq!(mitigated(RiskLevel::L0), RiskLevel::L0);
    }
}
