//! The effective approval requirement of one tool, computed when the catalog is published.
//!
//! Inputs: the spec's `humanInTheLoop.mode`, the operator's toolsets switch for the tool (seed
//! 003), and the first matching `[[approval.rule]]`. The operator can always tighten; lifting
//! a spec's REQUIRED needs `allow_override_required`. Among the operator's own switches a
//! `true` wins over a `false`. The README's precedence table is this function; each row has a
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
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Unset => "none",
            Source::Spec => "spec",
            Source::Toolset => "toolset",
            Source::Rule => "rule",
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
}

/// The effective requirement. `toolset` is the toolsets documents' `requiresApproval` for
/// this tool (its own flag, else its toolset's default), when a document lists it.
pub fn requirement(t: &ToolFacts, toolset: Option<bool>, cfg: &ApprovalConfig) -> Requirement {
    let rule_idx = cfg.rules.iter().position(|r| matches(r, t));
    let rule = rule_idx.map(|i| &cfg.rules[i]);
    // The operator's say: a `true` from any switch wins over a `false`.
    let switches = [
        (rule.and_then(|r| r.require), Source::Rule),
        (toolset, Source::Toolset),
    ];
    let tighten = switches.iter().find(|(v, _)| *v == Some(true)).map(|s| s.1);
    let loosen = switches
        .iter()
        .find(|(v, _)| *v == Some(false))
        .map(|s| s.1);
    let (required, source, overrode_spec, refused_override) =
        match (t.spec_required, tighten, loosen) {
            (false, Some(by), _) => (true, by, false, false),
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
    /// overrode, refused). One line per row of the README's table.
    type Row = (
        bool,
        Option<bool>,
        Option<bool>,
        bool,
        (bool, Source, bool, bool),
    );

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

    #[test]
    fn a_gated_tool_is_shown_one_band_lower_floored_at_l1() {
        assert_eq!(mitigated(RiskLevel::L5), RiskLevel::L4);
        assert_eq!(mitigated(RiskLevel::L2), RiskLevel::L1);
        assert_eq!(mitigated(RiskLevel::L1), RiskLevel::L1);
        assert_eq!(mitigated(RiskLevel::L0), RiskLevel::L0);
    }
}
