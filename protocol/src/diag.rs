//! Diagnostics: every problem stsd reports about a spec carries a stable code, a JSON pointer
//! (RFC 6901) to the field at fault, and a message a person can act on.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Stable error codes. The spelling is part of stsd's interface (CLI `--json`, MCP, audit log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    /// The bytes are not a JSON document of the spec's shape: syntax, encoding, size, nesting,
    /// or a field holding the wrong JSON type.
    SpecParse,
    /// The document has the right shape but breaks a rule the spec states (§4 to §10).
    SpecInvariant,
    /// The resolver refuses the posture (allow/deny overlap after the merge, unusable base path).
    ResolverReject,
    LocalPassFailed,
    InvalidInput,
    HelperRuntime,
    Security,
    Timeout,
    MemoryLimit,
    StepLimit,
    OutputLimit,
    SandboxViolation,
    SandboxUnavailable,
    WorkerCrashed,
    JsError,
    Overloaded,
    ApprovalRejected,
    /// A `${ENV}` placeholder the call needs is unset, empty or blank (spec §11.2).
    MissingRequirements,
    /// The caller went away (disconnected or cancelled) and the call was stopped.
    Cancelled,
    /// The call needs approval and the caller has no way to give it (an MCP client without
    /// elicitation, `stsd run` without a terminal or a flag).
    ApprovalRequired,
    /// Nobody decided within `[approval] timeout_seconds`.
    ApprovalTimeout,
    /// The approver itself failed (a command crashed or answered nonsense, the queue is
    /// full): the call does not run.
    ApprovalError,
    /// An external MCP server (an upstream) is not connected: it failed to start, or is being
    /// restarted after it died.
    UpstreamUnavailable,
    /// The upstream died, or its connection broke, while the call was in flight.
    UpstreamLost,
    /// The upstream answered with an error, or with something that is not MCP.
    UpstreamError,
    /// The tool is known but not served: disabled, a draft, not verified, missing
    /// requirements, over an upstream's `max_risk`, its fingerprint changed since it was
    /// approved (AWAITING_REREVIEW), revoked, or a blocking poisoning hit. The message says why.
    ToolWithheld,
    /// The call's audit record could not be written (the log's filesystem is full or
    /// failing), and the operator's `audit_on_failure` refuses such calls rather than run them
    /// unrecorded.
    AuditUnavailable,
    /// The policy (`[policy]`) does not permit this principal this call. The reply says no
    /// more; the audit record names the policies that decided.
    Forbidden,
    /// Past a call rate, a concurrency limit or a CPU quota (`[daemon] calls_per_second`,
    /// `[[limits]]`); `_meta["stsd/retryAfterMs"]` says when to try again.
    RateLimited,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::SpecParse => "SPEC_PARSE",
            Code::SpecInvariant => "SPEC_INVARIANT",
            Code::ResolverReject => "RESOLVER_REJECT",
            Code::LocalPassFailed => "LOCAL_PASS_FAILED",
            Code::InvalidInput => "INVALID_INPUT",
            Code::HelperRuntime => "HELPER_RUNTIME",
            Code::Security => "SECURITY",
            Code::Timeout => "TIMEOUT",
            Code::MemoryLimit => "MEMORY_LIMIT",
            Code::StepLimit => "STEP_LIMIT",
            Code::OutputLimit => "OUTPUT_LIMIT",
            Code::SandboxViolation => "SANDBOX_VIOLATION",
            Code::SandboxUnavailable => "SANDBOX_UNAVAILABLE",
            Code::WorkerCrashed => "WORKER_CRASHED",
            Code::JsError => "JS_ERROR",
            Code::Overloaded => "OVERLOADED",
            Code::ApprovalRejected => "APPROVAL_REJECTED",
            Code::MissingRequirements => "MISSING_REQUIREMENTS",
            Code::Cancelled => "CANCELLED",
            Code::ApprovalRequired => "APPROVAL_REQUIRED",
            Code::ApprovalTimeout => "APPROVAL_TIMEOUT",
            Code::ApprovalError => "APPROVAL_ERROR",
            Code::UpstreamUnavailable => "UPSTREAM_UNAVAILABLE",
            Code::UpstreamLost => "UPSTREAM_LOST",
            Code::UpstreamError => "UPSTREAM_ERROR",
            Code::ToolWithheld => "TOOL_WITHHELD",
            Code::AuditUnavailable => "AUDIT_UNAVAILABLE",
            Code::Forbidden => "FORBIDDEN",
            Code::RateLimited => "RATE_LIMITED",
        }
    }

    pub const ALL: [Code; 29] = [
        Code::SpecParse,
        Code::SpecInvariant,
        Code::ResolverReject,
        Code::LocalPassFailed,
        Code::InvalidInput,
        Code::HelperRuntime,
        Code::Security,
        Code::Timeout,
        Code::MemoryLimit,
        Code::StepLimit,
        Code::OutputLimit,
        Code::SandboxViolation,
        Code::SandboxUnavailable,
        Code::WorkerCrashed,
        Code::JsError,
        Code::Overloaded,
        Code::ApprovalRejected,
        Code::MissingRequirements,
        Code::Cancelled,
        Code::ApprovalRequired,
        Code::ApprovalTimeout,
        Code::ApprovalError,
        Code::UpstreamUnavailable,
        Code::UpstreamLost,
        Code::UpstreamError,
        Code::ToolWithheld,
        Code::AuditUnavailable,
        Code::Forbidden,
        Code::RateLimited,
    ];

    /// The code for its stable spelling.
    pub fn parse(s: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    /// The spec says a consumer must not reject this (e.g. a non-slug name), but it is worth fixing.
    Warning,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    /// JSON pointer into the spec document ("" is the whole document).
    pub pointer: String,
    pub message: String,
}

impl Diagnostic {
    pub fn error(code: Code, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Error,
            pointer: pointer.into(),
            message: message.into(),
        }
    }

    pub fn warning(code: Code, pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: Severity::Warning,
            pointer: pointer.into(),
            message: message.into(),
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sev = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let at = if self.pointer.is_empty() {
            "(document)"
        } else {
            &self.pointer
        };
        write!(f, "{sev} {} at {at}: {}", self.code, self.message)
    }
}

/// Builds JSON pointers with RFC 6901 escaping (`~` -> `~0`, `/` -> `~1`).
pub fn pointer(parent: &str, token: impl fmt::Display) -> String {
    let token = token.to_string().replace('~', "~0").replace('/', "~1");
    format!("{parent}/{token}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_escapes_reserved_characters() {
        assert_eq!(pointer("", "params"), "/params");
        assert_eq!(pointer("/params", 2), "/params/2");
        assert_eq!(
            pointer("/staticVariables/0", "a/b~c"),
            "/staticVariables/0/a~1b~0c"
        );
    }

    #[test]
    fn codes_serialize_in_their_stable_spelling() {
        for code in [
            Code::SpecParse,
            Code::SpecInvariant,
            Code::ResolverReject,
            Code::JsError,
        ] {
            let json = serde_json::to_string(&code).unwrap_or_default();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
