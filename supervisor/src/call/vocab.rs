//! The call's vocabulary, a leaf every layer may import without importing the service: who
//! calls ([`Caller`]), who makes an admin request ([`Subject`]), what a call answers
//! ([`ToolReply`], [`CallFailure`]), and masking.

use crate::exec::CallValue;
use serde::Serialize;
use serde_json::Value;
use stsd_protocol::envvar::SecretSet;
use stsd_protocol::Code;

/// Seed 004's execution metrics, per call: in the audit record and the result's `_meta`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallMetrics {
    /// Arrival to answer, approval and queueing included.
    pub wall_ms: u64,
    /// CPU time of the worker for this call (getrusage), microseconds.
    pub cpu_us: u64,
    /// The worker's peak resident set, KiB.
    pub peak_rss_kib: u64,
    /// CPU time making the worker cost (fork or exec until Ready; 0 for a reused worker).
    pub spawn_cpu_us: u64,
    /// The QuickJS heap when the body ended, bytes.
    pub heap_bytes: u64,
    pub console_lines: u64,
    /// The call pipeline's own steps (policy, rate and limits, approval lookup, admission,
    /// the audit write), microseconds: what governing a call costs beside running it.
    pub governance_us: u64,
}

/// What a caller gets back for a known tool (failures included, as `is_error`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    pub is_error: bool,
    pub code: Option<Code>,
    /// Strings as they are, other results as JSON text; for errors `CODE: message`.
    pub text: String,
    /// The result when it is a JSON object.
    pub structured: Option<Value>,
    /// What the call cost, when a worker ran it.
    pub metrics: Option<CallMetrics>,
    /// An upstream's content blocks as it sent them (masked); None for stsd's own tools,
    /// whose content is the text.
    pub content: Option<Vec<Value>>,
    /// An own tool's result as its `JSON.stringify` wrote it (masked; None for undefined
    /// and for errors): `stsd run --json` prints it as is, so a lone surrogate stays the
    /// `\ud83d` escape a JSON value cannot hold.
    pub raw: Option<String>,
    /// An error's JavaScript stack (masked), for `stsd run`.
    pub stack: Option<String>,
    /// An INVALID_INPUT's JSON pointer into the arguments, for `stsd run --json`.
    pub pointer: Option<String>,
    /// A RATE_LIMITED's wait before a retry may pass (`_meta["stsd/retryAfterMs"]`).
    pub retry_after_ms: Option<u64>,
}

impl ToolReply {
    pub fn error(code: Code, message: &str) -> ToolReply {
        ToolReply {
            is_error: true,
            code: Some(code),
            text: format!("{code}: {message}"),
            structured: None,
            metrics: None,
            content: None,
            raw: None,
            stack: None,
            pointer: None,
            retry_after_ms: None,
        }
    }

    /// A refusal past a limit, with the wait.
    pub fn limited(message: &str, wait: std::time::Duration) -> ToolReply {
        ToolReply {
            retry_after_ms: Some(wait.as_millis().max(1) as u64),
            ..ToolReply::error(Code::RateLimited, message)
        }
    }

    /// An own tool's value: strings as they are, other results as JSON text, an object as
    /// structured content too.
    pub fn success(v: &CallValue, secrets: &SecretSet) -> ToolReply {
        let (text, structured) = match v {
            CallValue::Undefined => ("undefined".to_string(), None),
            CallValue::Json(t) => match stsd_protocol::json::parse_js_json(t) {
                Ok(Value::String(s)) => (s, None),
                Ok(obj @ Value::Object(_)) => (t.clone(), Some(obj)),
                _ => (t.clone(), None),
            },
        };
        ToolReply {
            is_error: false,
            code: None,
            text: secrets.mask(&text),
            structured: structured.map(|s| mask_value(&s, secrets)),
            metrics: None,
            content: None,
            raw: match v {
                CallValue::Json(t) => Some(secrets.mask(t)),
                CallValue::Undefined => None,
            },
            stack: None,
            pointer: None,
            retry_after_ms: None,
        }
    }

    /// The message of an error reply (its text without the `CODE: ` prefix).
    pub fn message(&self) -> &str {
        match self.code {
            Some(c) => self
                .text
                .strip_prefix(c.as_str())
                .and_then(|t| t.strip_prefix(": "))
                .unwrap_or(&self.text),
            None => &self.text,
        }
    }
}

/// Who is calling: the peer's uid (Unix socket) or the authenticated principal (HTTP), the
/// transport, and the session (admission is fair across sessions).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub peer_uid: Option<u32>,
    /// The authenticated HTTP principal, when the call came over HTTP.
    pub principal: Option<Principal>,
    pub transport: &'static str,
    pub session: u64,
}

impl Caller {
    /// The key rates and refusal summaries count by (see [`principal_key`]).
    pub fn principal_key(&self) -> String {
        principal_key(self.principal_name(), self.peer_uid)
    }

    pub fn principal_name(&self) -> Option<&str> {
        self.principal.as_ref().map(|p| p.name.as_str())
    }
}

/// How an HTTP caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrincipalKind {
    /// A bearer token stsd issued (`stsd token add`).
    Token,
    /// A client certificate's common name.
    Certificate,
    /// An OAuth 2.1 access token (a JWT from the configured authorization server).
    OAuth,
}

impl PrincipalKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PrincipalKind::Token => "token",
            PrincipalKind::Certificate => "certificate",
            PrincipalKind::OAuth => "oauth",
        }
    }

    pub fn parse(s: &str) -> Option<PrincipalKind> {
        [
            PrincipalKind::Token,
            PrincipalKind::Certificate,
            PrincipalKind::OAuth,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// An authenticated HTTP caller: its name (a token's or certificate's principal, or
/// `oauth:<subject>`, so an authorization server cannot name a token principal), how it
/// authenticated, and the groups its credential carries (an OAuth token's group claim, and
/// `scope:<s>` for each scope). A socket caller is its uid ([`Caller::peer_uid`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub kind: PrincipalKind,
    pub groups: Vec<String>,
}

impl Principal {
    pub fn new(name: impl Into<String>, kind: PrincipalKind) -> Principal {
        Principal {
            name: name.into(),
            kind,
            groups: Vec::new(),
        }
    }
}

/// Who a call is counted against: the HTTP principal, else the socket peer's uid.
pub fn principal_key(principal: Option<&str>, peer_uid: Option<u32>) -> String {
    match (principal, peer_uid) {
        (Some(p), _) => p.to_string(),
        (None, Some(uid)) => format!("uid:{uid}"),
        (None, None) => "-".to_string(),
    }
}

/// Who makes an admin request: a local uid (SO_PEERCRED) or an HTTP principal. What it may
/// do is the policy's to decide (`policy::Action::{Admin, ReadAudit, Approve}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    Uid(u32),
    Principal(Principal),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Uid(u) => write!(f, "uid {u}"),
            Subject::Principal(p) => write!(f, "principal {}", p.name),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// No ACTIVE tool by that name: a protocol error, not a tool error.
    UnknownTool(String),
}

/// Masks every string inside a JSON value (keys included), leaving its structure intact.
pub fn mask_value(v: &Value, secrets: &SecretSet) -> Value {
    if secrets.is_empty() {
        return v.clone();
    }
    match v {
        Value::String(s) => Value::String(secrets.mask(s)),
        Value::Array(a) => Value::Array(a.iter().map(|x| mask_value(x, secrets)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (secrets.mask(k), mask_value(x, secrets)))
                .collect(),
        ),
        other => other.clone(),
    }
}
