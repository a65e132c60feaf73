//! The gateway's vocabulary, a leaf: the name an upstream's tool or prompt is served
//! under, what is withheld and why, and the ledger's verdict on a fingerprint (the exposure
//! of tools and of resources and prompts both read them).

use super::ledger::{self, Ledger};
use super::scan::Hit;

/// A tool that is not served, and why (a code first: AWAITING_REREVIEW, REVOKED, POISONING,
/// MAX_RISK, R1_ALIAS_COLLISION, ...).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Withheld {
    pub upstream: String,
    pub tool: String,
    pub alias: String,
    pub why: String,
    /// Poisoning-scan hits, when the tool got as far as the scan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub poisoning: Vec<Hit>,
}

/// The default exposed name of an upstream tool: `<upstream-id>__<tool>` (names stay within
/// `[A-Za-z0-9_-]`, which every MCP client accepts).
pub fn default_alias(upstream: &str, tool: &str) -> String {
    format!("{upstream}__{tool}")
}

/// The ledger's verdict on `fp` (taken of `object`, kept for a re-review): recorded (the
/// daemon), or only looked up (a preview, which must leave the ledger as it is). A ledger
/// that cannot be written withholds the tool.
pub fn look_up(
    ledger: &Ledger,
    id: &str,
    fp: &str,
    object: Option<&serde_json::Value>,
    observe: bool,
) -> ledger::Observation {
    use ledger::{Observation, State, Status};
    if observe {
        return ledger.observe_object(id, fp, object).unwrap_or_else(|e| {
            tracing::error!(id, error = %e, "the fingerprint ledger cannot be written");
            Observation {
                status: Status::Mismatch,
                state: State::AwaitingRereview,
                approved: String::new(),
                observed: fp.to_string(),
            }
        });
    }
    match ledger.get(id) {
        None => Observation {
            status: Status::New,
            state: State::Active,
            approved: fp.to_string(),
            observed: fp.to_string(),
        },
        Some(e) => Observation {
            status: if e.approved == fp {
                Status::Unchanged
            } else {
                Status::Mismatch
            },
            state: if e.state == State::Active && e.approved != fp {
                State::AwaitingRereview
            } else {
                e.state
            },
            approved: e.approved,
            observed: fp.to_string(),
        },
    }
}

/// Why the ledger or the poisoning scan withholds a served thing (`what`: "the tool", "it"),
/// if either does: a fingerprint not approved, or a scan hit under `block_on_poisoning`.
pub fn refusal(
    seen: &ledger::Observation,
    id: &str,
    what: &str,
    hits: &[Hit],
    block_on_poisoning: bool,
) -> Option<String> {
    if seen.state != ledger::State::Active {
        return Some(format!(
            "{}: {what} changed since it was approved (or was revoked): stsd ledger approve {id}",
            seen.state.as_str(),
        ));
    }
    if block_on_poisoning && !hits.is_empty() {
        let names: Vec<&str> = hits.iter().map(|h| h.pattern.as_str()).collect();
        return Some(format!(
            "POISONING: {} ([gateway] block_on_poisoning)",
            names.join(", ")
        ));
    }
    None
}
