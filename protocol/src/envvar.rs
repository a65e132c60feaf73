//! `${ENV_VAR}` placeholders (spec §7.2), requirement checks (§11.2), secret collection and
//! masking (§7.4).
//!
//! The grammar is `\$\{([A-Z_]+[A-Z0-9_]*)}`: a name starts with an uppercase letter or `_` and
//! continues with uppercase letters, digits or `_`. Anything else between `${` and `}` (for example
//! `${api_key}`) is not a placeholder: it stays literal text and is never resolved.
//!
//! stsd adds one form: `${secret:NAME}` (NAME as above) names a secret of the operator's
//! secrets directory only, never the environment. Its placeholder name is `secret:NAME`.

use std::collections::BTreeSet;

/// One placeholder occurrence: the name and its byte span (including `${` and `}`) in the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholder<'a> {
    pub name: &'a str,
    pub start: usize,
    pub end: usize,
}

/// The prefix of stsd's `${secret:NAME}` form.
pub const SECRET_PREFIX: &str = "secret:";

/// `secret:NAME` → `NAME` (a name of the secrets directory only); None for a plain name.
pub fn secret_name(name: &str) -> Option<&str> {
    name.strip_prefix(SECRET_PREFIX)
}

fn is_placeholder_name(s: &str) -> bool {
    is_name(secret_name(s).unwrap_or(s))
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
            Some(len) if is_placeholder_name(&value[inner..inner + len]) => {
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

    /// The hosts the value of `name` was given for, when its source says (a secret the
    /// operator set for tools with `--host`); None: the source does not narrow it.
    fn hosts(&self, _name: &str) -> Option<Vec<String>> {
        None
    }
}

/// The daemon's own process environment (the floor every resolver must consult, §7.2).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn lookup(&self, name: &str) -> Option<String> {
        if secret_name(name).is_some() {
            return None;
        }
        std::env::var(name).ok()
    }
}

/// The process environment as the operator lets specs see it: a name resolves only when it
/// matches `[baseline] env_allow` (exact names, or prefixes written `PREFIX*`; `*` alone
/// allows every name). Anything else reads as unset, so a spec that names `${HOME}` or
/// `${STSD_SOCKET}` is MISSING_REQUIREMENTS rather than handed the daemon's own values.
#[derive(Debug, Clone, Copy)]
pub struct AllowedEnv<'a> {
    pub allow: &'a [String],
}

impl AllowedEnv<'_> {
    pub fn allows(&self, name: &str) -> bool {
        self.allow.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => p == name,
        })
    }
}

impl EnvSource for AllowedEnv<'_> {
    fn lookup(&self, name: &str) -> Option<String> {
        // `secret:NAME` is never an environment variable, whatever the allowlist says.
        if secret_name(name).is_none() && self.allows(name) {
            std::env::var(name).ok()
        } else {
            None
        }
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
    values: Vec<String>,
    /// Every form of every secret that output may carry (see [`encoded_forms`]), longest
    /// first, so a form that contains another is masked whole.
    forms: Vec<String>,
}

const BASE64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(bytes: &[u8], url: bool) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            let mut c = BASE64_STD[((n >> (18 - 6 * i)) & 63) as usize];
            if url {
                c = match c {
                    b'+' => b'-',
                    b'/' => b'_',
                    c => c,
                };
            }
            out.push(c as char);
        }
    }
    out
}

fn percent(s: &str, keep: &dyn Fn(u8) -> bool, space_plus: bool, lower: bool) -> String {
    let mut out = String::new();
    for &b in s.as_bytes() {
        if keep(b) {
            out.push(b as char);
        } else if space_plus && b == b' ' {
            out.push('+');
        } else if lower {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The forms a secret takes in text that leaves: as is; JSON-escaped (as `JSON.stringify`
/// and serde write it, and with `\uXXXX` for non-ASCII as Python's `json` does);
/// percent-encoded (`encodeURIComponent`, lower-case hex, and form encoding with `+`); and
/// base64 (standard and URL-safe) at each of the three byte alignments it can have inside a
/// longer encoded text: only the characters that depend on the secret alone, and only when
/// at least 8 of them remain, so short fragments never mask unrelated text.
pub fn encoded_forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_string()];
    let json = serde_json::to_string(secret).unwrap_or_default();
    forms.push(json[1..json.len().saturating_sub(1).max(1)].to_string());
    let ascii: String = json[1..json.len().saturating_sub(1).max(1)]
        .chars()
        .flat_map(|c| {
            if c.is_ascii() {
                vec![c.to_string()]
            } else {
                let mut buf = [0u16; 2];
                c.encode_utf16(&mut buf)
                    .iter()
                    .map(|u| format!("\\u{u:04x}"))
                    .collect()
            }
        })
        .collect();
    forms.push(ascii);
    let component = |b: u8| b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b);
    let form = |b: u8| b.is_ascii_alphanumeric() || b"*-._".contains(&b);
    forms.push(percent(secret, &component, false, false));
    forms.push(percent(secret, &component, false, true));
    forms.push(percent(secret, &form, true, false));
    let bytes = secret.as_bytes();
    for url in [false, true] {
        for lead in 0..3usize {
            let mut padded = vec![0u8; lead];
            padded.extend_from_slice(bytes);
            let enc = base64(&padded, url);
            // Characters touched by the lead bytes, and by whatever follows the secret.
            let skip = [0, 2, 3][lead];
            let full = padded.len() / 3 * 4;
            let tail_ok = if padded.len() % 3 == 0 {
                enc.len()
            } else {
                full
            };
            if tail_ok > skip + 7 {
                forms.push(enc[skip..tail_ok].to_string());
            }
            if lead == 0 {
                // The whole encoding, padded, when the secret is encoded on its own.
                let mut whole = enc.clone();
                while !whole.len().is_multiple_of(4) {
                    whole.push('=');
                }
                forms.push(whole);
                forms.push(enc);
            }
        }
    }
    forms.retain(|f| f.chars().count() >= MIN_SECRET_CHARS);
    forms
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
        let values: Vec<String> = set.into_iter().collect();
        let mut forms: Vec<String> = values.iter().flat_map(|v| encoded_forms(v)).collect();
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        SecretSet { values, forms }
    }

    /// A set of known secret values (an upstream's resolved `${secret:..}` references), with
    /// the same minimum length and encoded forms as [`SecretSet::collect`].
    pub fn from_values<'a>(values: impl IntoIterator<Item = &'a str>) -> Self {
        let mut set: Vec<String> = values
            .into_iter()
            .filter(|v| v.chars().count() >= MIN_SECRET_CHARS)
            .map(str::to_string)
            .collect();
        set.sort();
        set.dedup();
        let mut forms: Vec<String> = set.iter().flat_map(|v| encoded_forms(v)).collect();
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        SecretSet { values: set, forms }
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// This set and `extra` (the placeholders the code holds in the secrets' place: masked
    /// as `***` too, so output reads as it always has).
    pub fn and(&self, extra: impl IntoIterator<Item = String>) -> SecretSet {
        let extra: Vec<String> = extra.into_iter().collect();
        let more = SecretSet::from_values(extra.iter().map(String::as_str));
        if more.is_empty() {
            return self.clone();
        }
        // Only the new values' forms are computed (this runs on every call).
        let mut values = self.values.clone();
        values.extend(more.values);
        values.sort();
        values.dedup();
        let mut forms = self.forms.clone();
        forms.extend(more.forms);
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        SecretSet { values, forms }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Mask: plain substring replacement of every form of every secret with `***` (§7.4,
    /// extended to the encoded forms of [`encoded_forms`]). No regex, no knowledge of the
    /// text's structure.
    pub fn mask(&self, text: &str) -> String {
        let mut out = text.to_string();
        for form in &self.forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), "***");
            }
        }
        out
    }

    /// Masks a line that may have been cut short (it then ends with `marker`): besides
    /// [`SecretSet::mask`], a start of a secret left just before the cut is masked too, so a
    /// cut never leaves part of a secret in clear.
    pub fn mask_cut(&self, text: &str, marker: &str) -> String {
        let masked = self.mask(text);
        let Some(body) = masked.strip_suffix(marker) else {
            return masked;
        };
        let mut keep = body.len();
        for secret in &self.values {
            // The longest start of this secret that the body ends with.
            let mut k = secret.len().min(body.len());
            while k > 0 {
                if secret.is_char_boundary(k) && body.ends_with(&secret[..k]) {
                    keep = keep.min(body.len() - k);
                    break;
                }
                k -= 1;
            }
        }
        if keep == body.len() {
            return masked;
        }
        format!("{}***{marker}", &body[..keep])
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
    fn the_secret_form_is_a_placeholder_that_no_environment_answers() {
        let ps = placeholders("k=${secret:API_KEY}&x=${secret:lower}&y=${secret:}");
        let names: Vec<&str> = ps.iter().map(|p| p.name).collect();
        assert_eq!(names, ["secret:API_KEY"]);
        assert_eq!(secret_name(names[0]), Some("API_KEY"));
        assert_eq!(
            lookalikes("${secret:API_KEY} ${secret:lower}"),
            ["${secret:lower}"]
        );
        // The process environment and a `*` allowlist never answer a secret's name, even
        // when a variable of that very name exists.
        std::env::set_var("secret:STSD_ENVVAR_TEST", "leak");
        let all = ["*".to_string()];
        assert_eq!(
            AllowedEnv { allow: &all }.lookup("secret:STSD_ENVVAR_TEST"),
            None
        );
        assert_eq!(ProcessEnv.lookup("secret:STSD_ENVVAR_TEST"), None);
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
    fn every_encoded_form_of_a_secret_is_masked() {
        let secret = "p\"a\\s%s+w é/ö=tok";
        let e = env(&[("T", secret)]);
        let set = SecretSet::collect(["${T}"], &e);
        let json = serde_json::to_string(&serde_json::json!({"t": secret})).unwrap_or_default();
        assert_eq!(set.mask(&json), r#"{"t":"***"}"#);
        let ascii = r#"{"t": "p\"a\\s%s+w \u00e9/\u00f6=tok"}"#;
        assert!(!set.mask(ascii).contains("tok"), "{}", set.mask(ascii));
        let pct: String = percent(secret, &|b| b.is_ascii_alphanumeric(), false, false);
        assert_eq!(set.mask(&format!("u?k={pct}&x=1")), "u?k=***&x=1");
        let form: String = percent(secret, &|b| b.is_ascii_alphanumeric(), true, false);
        assert_eq!(set.mask(&format!("k={form}")), "k=***");
        for lead in ["", "a", "ab", "abc"] {
            for url in [false, true] {
                let enc = base64(format!("{lead}{secret}tail").as_bytes(), url);
                let masked = set.mask(&enc);
                assert!(masked.contains("***"), "lead {lead:?} url {url}: {enc}");
                // What is left cannot be decoded back into the secret.
                assert!(masked.len() < enc.len());
            }
        }
        // Short incidental fragments are never masked.
        assert_eq!(set.mask("tok"), "tok");
    }

    #[test]
    fn only_allowed_names_resolve() {
        // SAFETY-free: reads only; PATH is set in any test environment.
        assert!(std::env::var("PATH").is_ok());
        let none: Vec<String> = vec![];
        assert_eq!(AllowedEnv { allow: &none }.get("PATH"), None);
        let some = vec!["PA*".to_string(), "EXACT".to_string()];
        let env = AllowedEnv { allow: &some };
        assert!(env.get("PATH").is_some());
        assert!(env.allows("PAGER") && env.allows("EXACT") && !env.allows("EXACTLY"));
        assert!(!env.allows("HOME"));
        let all = vec!["*".to_string()];
        assert!(AllowedEnv { allow: &all }.allows("ANYTHING"));
    }

    #[test]
    fn a_cut_line_never_leaves_the_start_of_a_secret() {
        let secret = "Sup3r-secret-value";
        let e = env(&[("T", secret)]);
        let set = SecretSet::collect(["${T}"], &e);
        let mark = " …[line truncated]";
        for k in 1..secret.len() {
            let line = format!("token: {}{mark}", &secret[..k]);
            let masked = set.mask_cut(&line, mark);
            assert_eq!(masked, format!("token: ***{mark}"), "cut after {k}");
        }
        assert_eq!(set.mask_cut("no secret here", mark), "no secret here");
        assert_eq!(
            set.mask_cut(&format!("plain{mark}"), mark),
            format!("plain{mark}")
        );
    }

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

/// A secret the tool's code never holds: the worker gets `placeholder` in its place, and the
/// supervisor's broker puts `value` back into a request only on its way to one of `hosts`
/// (the forms `host_allowed` matches: a name, `*.apex`, never `*` alone). Lives in the
/// supervisor only: [`crate::frames::Job::withheld`] is never serialized.
#[derive(Clone, PartialEq, Eq)]
pub struct Withheld {
    /// The variable's name (`${NAME}`), for the audit record.
    pub name: String,
    pub value: String,
    pub placeholder: String,
    /// The value is an http(s) URL: the placeholder is a URL on the same scheme, host and
    /// port (so the allowlist sees the real host), and stands for the whole URL.
    pub url: bool,
    pub hosts: Vec<String>,
    /// Every form of the value a response may echo, made when a response is first searched
    /// (a call that fetches nothing never needs them).
    forms: std::sync::OnceLock<Vec<String>>,
}

impl Withheld {
    pub fn new(
        name: &str,
        value: &str,
        placeholder: String,
        url: bool,
        hosts: Vec<String>,
    ) -> Withheld {
        Withheld {
            name: name.to_string(),
            value: value.to_string(),
            placeholder,
            url,
            hosts,
            forms: std::sync::OnceLock::new(),
        }
    }

    /// Every form of the value a response may echo ([`encoded_forms`]).
    pub fn forms(&self) -> &[String] {
        self.forms.get_or_init(|| encoded_forms(&self.value))
    }
}

impl std::fmt::Debug for Withheld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Withheld")
            .field("name", &self.name)
            .field("placeholder", &self.placeholder)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// The call's withheld secrets (none: every secret was given to the code, or there were none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WithheldSet(pub Vec<Withheld>);

impl WithheldSet {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
