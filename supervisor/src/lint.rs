//! Author lint for `stsd check` (warnings, never errors): things a spec's author most likely
//! got wrong, found by reading the spec against its resolved posture. Code that uses `fetch`
//! while the network is blocked, or `safety.fs` without file access; top-level keys that look
//! like typos of known ones; secrets in a description or a testValue (seed 000 §5 and §6.3
//! forbid them); `networkMode: open` in a spec about to be published; tags outside the
//! catalog's vocabulary.

use stsd_profiles::Resolved;
use stsd_protocol::envvar::EnvSource;
use stsd_protocol::spec::KNOWN_TOP_LEVEL;
use stsd_protocol::{Code, Diagnostic, NetworkMode, ToolSpec};

/// The shortest description a spec may be published with (a warning in `stsd check`).
pub const MIN_DESCRIPTION_CHARS: usize = 20;

/// The bundled catalog's tag vocabulary (seed 000 §9.2).
pub const TAG_VOCABULARY: &[&str] = &[
    "korea", "example", "util", "pipeline", "github", "search", "finance", "weather", "geo",
];

fn warn(at: &str, msg: String) -> Diagnostic {
    Diagnostic::warning(Code::SpecInvariant, at, msg)
}

/// Edit distance, for "did you mean" (short keys only, so the quadratic cost is nothing).
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Token shapes that are secrets wherever they appear.
fn secret_shape(text: &str) -> Option<&'static str> {
    let words = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'));
    for w in words {
        let tail = |prefix: &str, min: usize| {
            w.strip_prefix(prefix).is_some_and(|t| {
                t.len() >= min
                    && t.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            })
        };
        if tail("ghp_", 30) || tail("github_pat_", 30) || tail("gho_", 30) {
            return Some("a GitHub token");
        }
        if tail("sk-", 20) {
            return Some("an API secret key (sk-...)");
        }
        if tail("xoxb-", 10) || tail("xoxp-", 10) {
            return Some("a Slack token");
        }
        if w.len() == 20
            && w.starts_with("AKIA")
            && w[4..]
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            return Some("an AWS access key id");
        }
    }
    // A URL with a password in it.
    let lower = text.to_ascii_lowercase();
    for scheme in ["http://", "https://"] {
        let mut rest = lower.as_str();
        while let Some(i) = rest.find(scheme) {
            let after = &rest[i + scheme.len()..];
            let authority = after.split(['/', ' ', '"', '\'']).next().unwrap_or("");
            if authority.contains('@')
                && authority.split('@').next().is_some_and(|u| u.contains(':'))
            {
                return Some("a URL with credentials");
            }
            rest = after;
        }
    }
    None
}

/// The lint warnings for one valid spec.
pub fn lint(
    spec: &ToolSpec,
    raw: Option<&serde_json::Value>,
    resolved: &Resolved,
    env: &dyn EnvSource,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let caps = &resolved.tool_safety.capabilities;
    let code = &spec.code;
    if caps.network.mode == NetworkMode::Blocked && code.contains("fetch(") {
        out.push(warn(
            "/code",
            "the code calls fetch, but the posture blocks the network: fetch is not installed; \
             set sandboxOverrides.networkMode to allowlist, strict or open"
                .into(),
        ));
    }
    if !caps.file_read && !caps.file_write && code.contains("safety.fs") {
        out.push(warn(
            "/code",
            "the code uses safety.fs, but the posture grants no file access; set \
             sandboxOverrides.fileRead and/or fileWrite"
                .into(),
        ));
    }
    if let Some(obj) = raw.and_then(|r| r.as_object()) {
        for key in obj.keys() {
            if KNOWN_TOP_LEVEL.contains(&key.as_str()) {
                continue;
            }
            if let Some(near) = KNOWN_TOP_LEVEL
                .iter()
                .filter(|k| distance(&k.to_ascii_lowercase(), &key.to_ascii_lowercase()) <= 2)
                .min_by_key(|k| distance(k, key))
            {
                out.push(warn(
                    &format!("/{key}"),
                    format!("unknown top-level field {key:?}: did you mean {near:?}? (unknown fields are kept but do nothing)"),
                ));
            }
        }
    }
    // Secrets: the resolved value of any ${NAME} the spec references, and well-known shapes.
    let secrets = stsd_protocol::envvar::SecretSet::collect(
        spec.static_variables.iter().map(|s| s.value.as_str()),
        env,
    );
    let mut check_text = |at: String, text: &str| {
        if text.is_empty() {
            return;
        }
        if secrets.mask(text) != text {
            out.push(warn(&at, "contains the value of an environment variable the spec uses: a secret must stay in staticVariables as ${NAME} (§5, §6.3)".into()));
        } else if let Some(what) = secret_shape(text) {
            out.push(warn(&at, format!("looks like it contains {what}: secrets never belong in a description or a testValue (§5, §6.3)")));
        }
    };
    check_text("/description".into(), &spec.description);
    for (i, p) in spec.params.iter().enumerate() {
        check_text(format!("/params/{i}/description"), &p.description);
        if let Some(tv) = &p.test_value {
            check_text(format!("/params/{i}/testValue"), tv);
        }
    }
    if caps.network.mode == NetworkMode::Open && !spec.draft {
        out.push(warn(
            "/sandboxOverrides/networkMode",
            "networkMode open in a published spec: any host on the internet; prefer allowlist with hostsAllow".into(),
        ));
    }
    if spec.description.trim().chars().count() < MIN_DESCRIPTION_CHARS {
        out.push(warn(
            "/description",
            format!(
                "the description has fewer than {MIN_DESCRIPTION_CHARS} characters: the model chooses tools by it (stsd tools add|update refuses it)"
            ),
        ));
    }
    for (i, t) in spec.tags.iter().enumerate() {
        if !TAG_VOCABULARY.contains(&t.as_str()) {
            out.push(warn(
                &format!("/tags/{i}"),
                format!(
                    "tag {t:?} is outside the catalog's vocabulary ({})",
                    TAG_VOCABULARY.join(", ")
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shapes_and_credentialed_urls_are_found() {
        assert!(secret_shape("use ghp_abcdefghijklmnopqrstuvwxyz0123456789 here").is_some());
        assert!(secret_shape("key sk-ABCDEFGHIJKLMNOPQRSTUV").is_some());
        assert!(secret_shape("AKIAIOSFODNN7EXAMPLE").is_some());
        assert!(secret_shape("see https://bob:hunter2@example.com/x").is_some());
        assert!(secret_shape("see https://example.com/@user and sk-short").is_none());
        assert_eq!(distance("descripton", "description"), 1);
    }
}
