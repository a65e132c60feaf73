//! `${ENV_VAR}` placeholders (spec §7.2), requirement checks (§11.2), secret collection and
//! masking (§7.4).
//!
//! The grammar is `\$\{([A-Z_]+[A-Z0-9_]*)}`: a name starts with an uppercase letter or `_` and
//! continues with uppercase letters, digits or `_`. Anything else between `${` and `}` (for example
//! `${api_key}`) is not a placeholder: it stays literal text and is never resolved.

use std::collections::BTreeSet;

/// One placeholder occurrence: the name and its byte span (including `${` and `}`) in the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholder<'a> {
    pub name: &'a str,
    pub start: usize,
    pub end: usize,
}

fn is_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'A'..=b'Z' | b'_'))
        && bytes.all(|b| matches!(b, b'A'..=b'Z' | b'0'..=b'9' | b'_'))
}

/// Every placeholder in `value`, left to right, matched as the reference regex would.
pub fn placeholders(value: &str) -> Vec<Placeholder<'_>> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(rel) = value[from..].find("${") {
        let start = from + rel;
        let inner = start + 2;
        match value[inner..].find('}') {
            Some(len) if is_name(&value[inner..inner + len]) => {
                let end = inner + len + 1;
                out.push(Placeholder {
                    name: &value[inner..inner + len],
                    start,
                    end,
                });
                from = end;
            }
            // Not a placeholder here; a later `${` may still start one (`${a${B}` holds `${B}`).
            _ => from = start + 1,
        }
    }
    out
}

/// `${...}` segments that look like placeholders but do not match the grammar (lowercase,
/// a leading digit, a dash). They are literal text; validation warns about them.
pub fn lookalikes(value: &str) -> Vec<&str> {
    let real: Vec<_> = placeholders(value).iter().map(|p| p.start).collect();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(rel) = value[from..].find("${") {
        let start = from + rel;
        from = start + 2;
        if real.contains(&start) {
            continue;
        }
        if let Some(len) = value[start + 2..].find('}') {
            let seg = &value[start..start + 2 + len + 1];
            // Only segments without a nested `${` are worth reporting on their own.
            if !seg[2..].contains("${") {
                out.push(seg);
            }
        }
    }
    out
}

/// True when the whole value is one placeholder ("anchored", §7.2).
pub fn is_anchored(value: &str) -> bool {
    matches!(placeholders(value).as_slice(), [p] if p.start == 0 && p.end == value.len())
}

/// Where placeholder values come from. Implementations return `None` for unset values; callers
/// treat empty and whitespace-only values as missing too (§7.2, §11.2).
pub trait EnvSource {
    fn lookup(&self, name: &str) -> Option<String>;

    /// The value if it is set and not blank.
    fn get(&self, name: &str) -> Option<String> {
        self.lookup(name).filter(|v| !v.trim().is_empty())
    }
}

/// The daemon's own process environment (the floor every resolver must consult, §7.2).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn lookup(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl<F: Fn(&str) -> Option<String>> EnvSource for F {
    fn lookup(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// Resolves every placeholder in `value`. Missing names come back sorted and unique, and the
/// value is then left with those placeholders in place, as the reference does.
pub fn resolve(value: &str, env: &dyn EnvSource) -> Result<String, (String, Vec<String>)> {
    let mut out = String::with_capacity(value.len());
    let mut missing = BTreeSet::new();
    let mut last = 0;
    for p in placeholders(value) {
        out.push_str(&value[last..p.start]);
        match env.get(p.name) {
            Some(v) => out.push_str(&v),
            None => {
                missing.insert(p.name.to_string());
                out.push_str(&value[p.start..p.end]);
            }
        }
        last = p.end;
    }
    out.push_str(&value[last..]);
    if missing.is_empty() {
        Ok(out)
    } else {
        Err((out, missing.into_iter().collect()))
    }
}

/// The §11.2 requirement check: every placeholder name whose value is missing, sorted, unique.
pub fn missing_requirements<'a>(
    values: impl IntoIterator<Item = &'a str>,
    env: &dyn EnvSource,
) -> Vec<String> {
    let mut missing = BTreeSet::new();
    for v in values {
        for p in placeholders(v) {
            if env.get(p.name).is_none() {
                missing.insert(p.name.to_string());
            }
        }
    }
    missing.into_iter().collect()
}

/// Values shorter than this are never masked (§7.4), to avoid masking incidental words.
pub const MIN_SECRET_CHARS: usize = 4;

/// The per-call secret set of §7.4: resolved placeholder values, by value identity.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretSet {
    /// Longest first, so a secret that contains another is masked whole.
    values: Vec<String>,
}

impl SecretSet {
    /// Collect: resolve every `${NAME}` in the templates and keep values of 4 or more characters.
    pub fn collect<'a>(templates: impl IntoIterator<Item = &'a str>, env: &dyn EnvSource) -> Self {
        let mut set = BTreeSet::new();
        for t in templates {
            for p in placeholders(t) {
                if let Some(v) = env.get(p.name) {
                    if v.chars().count() >= MIN_SECRET_CHARS {
                        set.insert(v);
                    }
                }
            }
        }
        let mut values: Vec<String> = set.into_iter().collect();
        values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        SecretSet { values }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Mask: plain substring replacement of every secret with `***`. No regex, no prefixes, no
    /// knowledge of the text's structure (§7.4).
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for secret in &self.values {
            if out.contains(secret.as_str()) {
                out = out.replace(secret.as_str(), "***");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl EnvSource {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name: &str| m.get(name).cloned()
    }

    #[test]
    fn grammar_matches_reference_regex() {
        fn names(s: &str) -> Vec<&str> {
            placeholders(s).iter().map(|p| p.name).collect()
        }
        assert_eq!(names("${API_KEY}"), ["API_KEY"]);
        assert_eq!(
            names("https://${API_HOST}/v2?k=${_K1}"),
            ["API_HOST", "_K1"]
        );
        assert!(
            names("${api_key}").is_empty(),
            "lowercase is not a placeholder"
        );
        assert!(
            names("${1ABC}").is_empty(),
            "a leading digit is not a placeholder"
        );
        assert!(names("${API-KEY}").is_empty());
        assert!(names("${}").is_empty());
        assert!(names("$API_KEY").is_empty());
        assert_eq!(names("${a${B}"), ["B"], "a later ${{ can still start one");
        assert_eq!(names("${A}${B}"), ["A", "B"]);
    }

    #[test]
    fn lookalikes_are_reported_but_real_placeholders_are_not() {
        assert_eq!(lookalikes("x ${api_key} ${OK}"), ["${api_key}"]);
        assert!(lookalikes("${OK}").is_empty());
    }

    #[test]
    fn anchored_versus_embedded() {
        assert!(is_anchored("${API_KEY}"));
        assert!(!is_anchored("Bearer ${API_KEY}"));
        assert!(!is_anchored("${A}${B}"));
    }

    #[test]
    fn unset_empty_and_blank_values_are_missing() {
        let e = env(&[("EMPTY", ""), ("BLANK", " \t\n"), ("SET", "v")]);
        assert_eq!(
            missing_requirements(["${UNSET} ${EMPTY} ${BLANK} ${SET}"], &e),
            ["BLANK", "EMPTY", "UNSET"]
        );
        assert_eq!(resolve("a=${SET}", &e), Ok("a=v".to_string()));
        let (partial, missing) = resolve("${SET}/${BLANK}", &e).err().unwrap_or_default();
        assert_eq!(partial, "v/${BLANK}");
        assert_eq!(missing, ["BLANK"]);
    }

    #[test]
    fn lowercase_placeholders_are_never_resolved() {
        let e = env(&[("api_key", "secret-value")]);
        assert_eq!(resolve("${api_key}", &e), Ok("${api_key}".to_string()));
        assert!(missing_requirements(["${api_key}"], &e).is_empty());
    }

    // §7.4 properties, one test each.

    #[test]
    fn masking_is_egress_only_resolution_keeps_the_value() {
        let e = env(&[("TOKEN", "s3cr3t-token")]);
        assert_eq!(
            resolve("Bearer ${TOKEN}", &e),
            Ok("Bearer s3cr3t-token".into())
        );
        let set = SecretSet::collect(["Bearer ${TOKEN}"], &e);
        assert_eq!(set.mask("sent Bearer s3cr3t-token"), "sent Bearer ***");
    }

    #[test]
    fn masking_is_by_value_identity_not_placeholder() {
        let e = env(&[("API_TOKEN", "same-value"), ("OTHER_NAME", "same-value")]);
        let set = SecretSet::collect(["${API_TOKEN}"], &e);
        assert_eq!(set.len(), 1);
        // The value leaks through another name: still masked, it is the same string.
        assert_eq!(set.mask("other=same-value"), "other=***");
    }

    #[test]
    fn values_under_four_characters_are_not_collected() {
        let e = env(&[("A", "abc"), ("B", "abcd"), ("C", "日本語")]);
        let set = SecretSet::collect(["${A}", "${B}", "${C}"], &e);
        assert_eq!(set.len(), 1);
        assert_eq!(set.mask("abc abcd 日本語"), "abc *** 日本語");
    }

    #[test]
    fn masking_has_no_structural_understanding() {
        let e = env(&[("K", "k\"ey.*")]);
        let set = SecretSet::collect(["${K}"], &e);
        // Regex metacharacters are literal; JSON quoting is not special.
        assert_eq!(
            set.mask(r#"{"v":"k"ey.*","w":"kXey"}"#),
            r#"{"v":"***","w":"kXey"}"#
        );
        // No partial-prefix matching.
        assert_eq!(set.mask("k\"ey"), "k\"ey");
    }

    #[test]
    fn secret_set_is_rebuilt_per_call() {
        let first = SecretSet::collect(["${K}"], &env(&[("K", "first-secret")]));
        let second = SecretSet::collect(["${K}"], &env(&[("K", "second-secret")]));
        assert_eq!(
            first.mask("first-secret second-secret"),
            "*** second-secret"
        );
        assert_eq!(
            second.mask("first-secret second-secret"),
            "first-secret ***"
        );
    }

    #[test]
    fn overlapping_secrets_mask_the_longer_whole() {
        let e = env(&[("A", "abcd"), ("B", "abcdefgh")]);
        let set = SecretSet::collect(["${A}${B}"], &e);
        assert_eq!(set.mask("abcdefgh"), "***");
    }
}
