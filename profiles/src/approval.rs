//! The operator's `[approval]` section: who decides whether a call may run, by which rule.
//! Rules are tried in order; the first whose conditions all hold applies.

use crate::risk::RiskLevel;
use serde::{Deserialize, Serialize};

/// How a call that needs approval gets its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StrategyKind {
    /// Always yes.
    Approve,
    /// Always no, with the rule's reason.
    Reject,
    /// Ask the caller's MCP client (elicitation); `stsd run` asks on its terminal.
    Elicit,
    /// Wait for an operator's `stsd approve` / `stsd deny`.
    Operator,
    /// Ask an executable: the request on stdin, `{"approved": bool, "reason": ...}` back.
    Command,
}

impl StrategyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::Approve => "approve",
            StrategyKind::Reject => "reject",
            StrategyKind::Elicit => "elicit",
            StrategyKind::Operator => "operator",
            StrategyKind::Command => "command",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalConfig {
    /// How long a call may wait for a decision before it is refused (APPROVAL_TIMEOUT).
    pub timeout_seconds: u64,
    /// uids whose `stsd approve` / `stsd deny` are accepted (operator strategy). Empty: none;
    /// the daemon's own uid is deliberately not implied, since agents usually share it.
    pub operator_uids: Vec<u32>,
    /// Lets an operator switch (a toolset's `requiresApproval: false`, a rule's
    /// `require = false`) lift a spec's `humanInTheLoop: REQUIRED`. Every call it affects
    /// says so in its audit record.
    pub allow_override_required: bool,
    /// The strategy for a call that needs approval when no rule names one.
    pub default_strategy: StrategyKind,
    /// Calls waiting for an operator at once; more fail closed (APPROVAL_ERROR).
    pub max_pending: usize,
    /// How long a `command` approver may take.
    pub command_timeout_ms: u64,
    #[serde(rename = "rule")]
    pub rules: Vec<ApprovalRule>,
    /// The HMAC key that seals 2026-07-28 approval states (`requestState`), read from this
    /// file (at least 32 bytes). Replicas behind one load balancer must share it, or a retry
    /// that lands on another replica is refused. Unset (and no `STSD_APPROVAL_STATE_KEY` in
    /// the environment): a random key made at start, private to this process.
    pub state_key_file: Option<std::path::PathBuf>,
}

impl Default for ApprovalConfig {
    fn default() -> Self {
        ApprovalConfig {
            timeout_seconds: 120,
            operator_uids: Vec::new(),
            allow_override_required: false,
            default_strategy: StrategyKind::Elicit,
            max_pending: 64,
            command_timeout_ms: 10_000,
            rules: Vec::new(),
            state_key_file: None,
        }
    }
}

/// One `[[approval.rule]]`: conditions (all that are given must hold) and what follows.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApprovalRule {
    /// Tool names this rule is for (empty: any tool).
    pub tools: Vec<String>,
    pub category: Option<String>,
    /// The tool's sandbox Risk Level is at least this.
    pub min_risk: Option<RiskLevel>,
    pub destructive: Option<bool>,
    /// The tool's effective posture writes files (`true`) or does not (`false`).
    pub file_write: Option<bool>,
    /// The tool's effective network mode: "blocked", "allowlist", "strict" or "open".
    pub network_mode: Option<String>,
    /// true: approval is required; false: not required (lifting a spec's REQUIRED only with
    /// `allow_override_required`); unset: as the spec and toolsets say.
    pub require: Option<bool>,
    pub strategy: Option<StrategyKind>,
    /// The reason a `reject` strategy gives.
    pub reason: Option<String>,
    /// The `command` strategy's program and its arguments.
    pub command: Vec<String>,
}

impl ApprovalConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.timeout_seconds == 0 || self.timeout_seconds > 86_400 {
            return Err("approval.timeout_seconds must be between 1 and 86400".into());
        }
        if self.default_strategy == StrategyKind::Command {
            return Err(
                "approval.default_strategy cannot be \"command\": name the program in a rule"
                    .into(),
            );
        }
        for (i, r) in self.rules.iter().enumerate() {
            if let Some(m) = &r.network_mode {
                if !["blocked", "allowlist", "strict", "open"]
                    .iter()
                    .any(|k| k.eq_ignore_ascii_case(m))
                {
                    return Err(format!(
                        "approval.rule[{i}]: network_mode must be \"blocked\", \"allowlist\", \"strict\" or \"open\", got {m:?}"
                    ));
                }
            }
            if r.strategy == Some(StrategyKind::Command) {
                if r.command.is_empty() {
                    return Err(format!(
                        "approval.rule[{i}]: strategy \"command\" needs command = [\"/path/to/program\", ...]"
                    ));
                }
                if !std::path::Path::new(&r.command[0]).is_absolute() {
                    return Err(format!(
                        "approval.rule[{i}]: the command must be an absolute path, got {}",
                        r.command[0]
                    ));
                }
            } else if !r.command.is_empty() {
                return Err(format!(
                    "approval.rule[{i}]: command is only for strategy \"command\""
                ));
            }
        }
        Ok(())
    }
}
