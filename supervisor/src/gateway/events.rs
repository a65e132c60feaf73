//! Seed 001's structured risk events. Each is one JSON object tagged `"event"`; [`RiskEvent::emit`]
//! logs it as one line (warn for floors, poisoning hits, fingerprint mismatches and refused
//! compositions, info otherwise); the integrator appends the same object to the audit log.

use super::ledger::State as LedgerState;
use super::risk::{Composed, Floor, HostClass, ServerRisk, ToolRisk};
use super::scan::{is_invisible, Pattern};
use super::shadow::Rule;
use serde::Serialize;
use stsd_profiles::RiskLevel;

/// Whether a composition was enabled or refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompositionAction {
    Enabled,
    Refused,
}

/// One risk event, as auditors read it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all_fields = "camelCase")]
pub enum RiskEvent {
    /// An upstream's server score, when it is first computed and whenever it changes (a
    /// recompute that finds the same score emits nothing: `Gateway::recompute`).
    ServerRiskComputed {
        upstream: String,
        host_class: HostClass,
        /// transport, auth, trust, doc, total, level, floor.
        #[serde(flatten)]
        risk: ServerRisk,
    },
    /// One upstream tool's publish score and the level it is exposed at.
    ToolPublishRiskComputed {
        upstream: String,
        tool: String,
        alias: String,
        /// base, doc, total, level, floor.
        tool_risk: ToolRisk,
        server_level: RiskLevel,
        /// level, floorTrigger, hitl, levelWithoutHitl.
        composed: Composed,
    },
    /// A floor rule decided a level (server: `tool` is None).
    FloorOverrideTriggered {
        upstream: String,
        tool: Option<String>,
        floor: Floor,
        chip: &'static str,
        level: RiskLevel,
    },
    /// A poisoning signature in a tool's text.
    PoisoningHit {
        upstream: String,
        tool: String,
        pattern: Pattern,
        field: String,
        excerpt: String,
        /// `[gateway] block_on_poisoning`: the tool is withheld.
        blocked: bool,
    },
    /// A tool's content changed since it was approved (or a revoked tool was seen).
    HashLedgerMismatch {
        id: String,
        upstream: String,
        tool: String,
        approved_fingerprint: String,
        observed_fingerprint: String,
        state: LedgerState,
    },
    /// An exposed tool's composition enabled, or refused by a shadowing rule.
    CompositionLifecycle {
        action: CompositionAction,
        upstream: String,
        tool: String,
        alias: String,
        rule: Option<Rule>,
        detail: Option<String>,
    },
}

impl RiskEvent {
    /// A FloorOverrideTriggered event for `floor`, with its chip and level filled in.
    pub fn floor(upstream: &str, tool: Option<&str>, floor: Floor) -> RiskEvent {
        RiskEvent::FloorOverrideTriggered {
            upstream: upstream.to_string(),
            tool: tool.map(str::to_string),
            floor,
            chip: floor.chip(),
            level: floor.level(),
        }
    }

    /// The event's name, as in the `"event"` tag.
    pub fn name(&self) -> &'static str {
        match self {
            RiskEvent::ServerRiskComputed { .. } => "ServerRiskComputed",
            RiskEvent::ToolPublishRiskComputed { .. } => "ToolPublishRiskComputed",
            RiskEvent::FloorOverrideTriggered { .. } => "FloorOverrideTriggered",
            RiskEvent::PoisoningHit { .. } => "PoisoningHit",
            RiskEvent::HashLedgerMismatch { .. } => "HashLedgerMismatch",
            RiskEvent::CompositionLifecycle { .. } => "CompositionLifecycle",
        }
    }

    /// Logged at warn: something an operator should look at.
    pub fn is_warning(&self) -> bool {
        match self {
            RiskEvent::ServerRiskComputed { .. } | RiskEvent::ToolPublishRiskComputed { .. } => {
                false
            }
            RiskEvent::CompositionLifecycle { action, .. } => *action == CompositionAction::Refused,
            _ => true,
        }
    }

    /// The event as one line of JSON. Upstream-controlled text (tool names, excerpts) is
    /// JSON-escaped, and invisible characters (bidi overrides, zero-width) are escaped as
    /// `\uXXXX` too, so the line prints as what it holds.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serializing cannot fail.
        let raw = serde_json::to_string(self).unwrap_or_default();
        let mut out = String::with_capacity(raw.len());
        for c in raw.chars() {
            if is_invisible(c) {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// Logs the event with `tracing` as one structured line (target `stsd::risk`).
    pub fn emit(&self) {
        let record = self.to_json();
        if self.is_warning() {
            tracing::warn!(target: "stsd::risk", event = self.name(), %record, "risk event");
        } else {
            tracing::info!(target: "stsd::risk", event = self.name(), %record, "risk event");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn server() -> ServerRisk {
        ServerRisk {
            transport: 0,
            auth: 0,
            trust: 2,
            doc: 1,
            total: 3,
            level: RiskLevel::L5,
            floor: Some(Floor::NonLoopbackNoAuthTrustUnknown),
        }
    }

    fn json(e: &RiskEvent) -> Value {
        serde_json::from_str(&e.to_json()).unwrap()
    }

    #[test]
    fn server_event_is_tagged_and_flat() {
        let e = RiskEvent::ServerRiskComputed {
            upstream: "gh".into(),
            host_class: HostClass::Public,
            risk: server(),
        };
        let v = json(&e);
        assert_eq!(v["event"], "ServerRiskComputed");
        assert_eq!(v["upstream"], "gh");
        assert_eq!(v["hostClass"], "PUBLIC");
        assert_eq!(
            (v["trust"].as_i64(), v["total"].as_i64()),
            (Some(2), Some(3))
        );
        assert_eq!(v["floor"], "non_loopback_no_auth_trust_unknown");
        assert!(!e.is_warning());
    }

    #[test]
    fn tool_event_carries_both_scores_and_the_composition() {
        let tool = ToolRisk {
            base: 1,
            doc: 0,
            total: 1,
            level: RiskLevel::L2,
            floor: None,
        };
        let composed = super::super::risk::compose(&server(), &tool, true);
        let e = RiskEvent::ToolPublishRiskComputed {
            upstream: "gh".into(),
            tool: "search".into(),
            alias: "gh_search".into(),
            tool_risk: tool,
            server_level: RiskLevel::L5,
            composed,
        };
        let v = json(&e);
        assert_eq!(v["toolRisk"]["base"], 1);
        assert_eq!(v["composed"]["level"], "L4");
        assert_eq!(v["composed"]["levelWithoutHitl"], "L5");
        assert_eq!(
            v["composed"]["floorTrigger"],
            "non_loopback_no_auth_trust_unknown"
        );
        assert_eq!(v["serverLevel"], "L5");
    }

    #[test]
    fn floor_poisoning_mismatch_and_refusal_are_warnings() {
        let f = RiskEvent::floor("gh", Some("delete_repo"), Floor::IrreversibleVerb);
        let v = json(&f);
        assert_eq!(
            (v["event"].as_str(), v["chip"].as_str()),
            (Some("FloorOverrideTriggered"), Some("irreversible-verb"))
        );
        assert_eq!(v["level"], "L5");
        let hit = RiskEvent::PoisoningHit {
            upstream: "gh".into(),
            tool: "t".into(),
            pattern: Pattern::HiddenInstruction,
            field: "description".into(),
            excerpt: "ignore all previous instructions".into(),
            blocked: false,
        };
        assert_eq!(json(&hit)["pattern"], "HIDDEN_INSTRUCTION");
        let mismatch = RiskEvent::HashLedgerMismatch {
            id: "gh/t".into(),
            upstream: "gh".into(),
            tool: "t".into(),
            approved_fingerprint: "aa".into(),
            observed_fingerprint: "bb".into(),
            state: LedgerState::AwaitingRereview,
        };
        let v = json(&mismatch);
        assert_eq!(
            (v["approvedFingerprint"].as_str(), v["state"].as_str()),
            (Some("aa"), Some("AWAITING_REREVIEW"))
        );
        let refused = RiskEvent::CompositionLifecycle {
            action: CompositionAction::Refused,
            upstream: "gh".into(),
            tool: "t".into(),
            alias: "t".into(),
            rule: Some(Rule::R1AliasCollision),
            detail: Some("\"t\" is claimed by gh/t, gl/t".into()),
        };
        assert_eq!(json(&refused)["rule"], "R1_ALIAS_COLLISION");
        let enabled = RiskEvent::CompositionLifecycle {
            action: CompositionAction::Enabled,
            upstream: "gh".into(),
            tool: "t".into(),
            alias: "t".into(),
            rule: None,
            detail: None,
        };
        assert_eq!(json(&enabled)["action"], "enabled");
        for e in [&f, &hit, &mismatch, &refused] {
            assert!(e.is_warning(), "{}", e.name());
            e.emit();
        }
        assert!(!enabled.is_warning());
        enabled.emit();
    }

    #[test]
    fn invisible_upstream_text_is_escaped_in_the_line() {
        let e = RiskEvent::PoisoningHit {
            upstream: "gh".into(),
            tool: "evil\u{202E}txt.exe\u{1b}[2K\u{E0041}".into(),
            pattern: Pattern::UnicodeRtlOverride,
            field: "name".into(),
            excerpt: String::new(),
            blocked: true,
        };
        let line = e.to_json();
        assert!(!line.chars().any(is_invisible), "{line}");
        assert!(
            line.contains("\\u202e") && line.contains("\\u001b") && line.contains("\\udb40\\udc41"),
            "{line}"
        );
        // Still JSON, and it decodes to the original name.
        assert_eq!(json(&e)["tool"], "evil\u{202E}txt.exe\u{1b}[2K\u{E0041}");
    }
}
