//! Secrets the tool's code never holds (issue 35). Masking output can only catch the forms of
//! a secret it knows; code that reverses, XORs or splits a secret gets it out anyway. So a
//! secret the spec resolves (`${NAME}`) reaches the worker as a placeholder, and the broker
//! puts the value back on the way out, in the request to a host that may receive it (the
//! tool's allowlist, or `[secrets.NAME] hosts`): what the code can transform is worthless.
//!
//! - A placeholder is `stsd-secret-` and 40 hex digits: characters `encodeURIComponent`,
//!   JSON and header values leave as they are, one length for every secret, derived with a
//!   key made at start (stable for a daemon's life, so a primed worker's statics still
//!   match; unguessable). A secret that is an http(s) URL (a webhook) gets a URL on the same
//!   scheme, host and port with an opaque path, so `fetch`, `new URL()` and the allowlist see
//!   the real host.
//! - In a request to an allowed host it is replaced in the URL (percent-encoded, unless the
//!   placeholder is a whole URL), the headers (as is; inside `Basic` credentials too), and the
//!   body (JSON-escaped in a JSON body, form-encoded in a form). To another host it is sent as
//!   it is, and the hop's record says so (`withheld`).
//! - A response that echoes a secret has it masked back to its placeholder before the worker
//!   sees it.

use super::guard;
use stsd_protocol::envvar::{EnvSource, Withheld, WithheldSet};

const PREFIX: &str = "stsd-secret-";

fn key() -> &'static ring::hmac::Key {
    static KEY: std::sync::OnceLock<ring::hmac::Key> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let rng = ring::rand::SystemRandom::new();
        // No randomness at all is not a state to run in; the zero key still gives
        // per-value placeholders, and the failure is loud.
        ring::hmac::Key::generate(ring::hmac::HMAC_SHA256, &rng).unwrap_or_else(|_| {
            tracing::error!("no randomness for the secrets' placeholder key");
            ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[0u8; 32])
        })
    })
}

/// The placeholder for `value` of `${name}` in tool `tool`, and whether it stands for a URL.
pub fn placeholder(tool: &str, name: &str, value: &str) -> (String, bool) {
    let tag = ring::hmac::sign(key(), format!("{tool}\0{name}\0{value}").as_bytes());
    let hex: String = tag.as_ref()[..20]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let opaque = format!("{PREFIX}{hex}");
    match url::Url::parse(value) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
            let host = u.host_str().unwrap_or_default();
            (format!("{}://{host}{port}/{opaque}", u.scheme()), true)
        }
        _ => (opaque, false),
    }
}

/// The environment the spec's static variables resolve against for a worker: a secret's
/// value becomes its placeholder (and is noted, with the hosts it may go to), unless the
/// operator gave it to code in clear (`[secrets.NAME] expose_to_code`).
pub struct Withholding<'a> {
    pub env: &'a dyn EnvSource,
    pub tool: &'a str,
    /// The hosts the tool may send anything to: its allowlist, `*` in open mode.
    pub tool_hosts: &'a [String],
    /// Where a secret may go when the operator did not say: the allowlist; nowhere in open
    /// mode (any host at all is no boundary for a secret).
    pub default_hosts: &'a [String],
    pub config: &'a std::collections::BTreeMap<String, stsd_profiles::baseline::SecretConfig>,
    pub found: std::cell::RefCell<Vec<Withheld>>,
}

impl EnvSource for Withholding<'_> {
    fn lookup(&self, name: &str) -> Option<String> {
        let value = self.env.lookup(name)?;
        // `${NAME}` and `${secret:NAME}` are one secret to `[secrets.NAME]`.
        let bare = stsd_protocol::envvar::secret_name(name).unwrap_or(name);
        let conf = self.config.get(bare);
        if value.trim().is_empty() || conf.is_some_and(|c| c.expose_to_code) {
            return Some(value);
        }
        let (ph, url) = placeholder(self.tool, name, &value);
        // Narrowed by the operator (the config's `[secrets.NAME] hosts`, and the hosts the
        // secret was set for with `stsd secret set --host`), never widened past the tool's
        // allowlist; where both say, a host must be in both.
        let given = self.env.hosts(name);
        let hosts: Vec<String> = match (conf.and_then(|c| c.hosts.clone()), given) {
            (Some(h), given) => h
                .into_iter()
                .filter(|x| guard::host_allowed(x, self.tool_hosts))
                .filter(|x| given.as_ref().is_none_or(|g| guard::host_allowed(x, g)))
                .collect(),
            (None, Some(g)) => g
                .into_iter()
                .filter(|x| guard::host_allowed(x, self.tool_hosts))
                .collect(),
            (None, None) => self.default_hosts.to_vec(),
        };
        // `*` (an allowlist may hold it) names every host: no boundary for a secret.
        let hosts = hosts.into_iter().filter(|h| h.trim() != "*").collect();
        let mut found = self.found.borrow_mut();
        if !found.iter().any(|w| w.placeholder == ph) {
            found.push(Withheld::new(name, &value, ph.clone(), url, hosts));
        }
        Some(ph)
    }
}

/// A request with its secrets put back, for one hop to `host`.
#[derive(Debug, Default)]
pub struct Applied {
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Secrets put back (their names).
    pub sent: Vec<String>,
    /// Secrets whose placeholder went, as is, to a host not allowed to receive them.
    pub withheld: Vec<String>,
}

fn component(s: &str) -> String {
    let keep = |b: u8| b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b);
    s.bytes()
        .map(|b| {
            if keep(b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn form(s: &str) -> String {
    component(s).replace("%20", "+")
}

fn replace_bytes(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    if from.is_empty() || hay.len() < from.len() {
        return hay.to_vec();
    }
    let mut out = Vec::with_capacity(hay.len());
    let mut last = 0;
    for at in memchr::memmem::find_iter(hay, from) {
        if at < last {
            continue; // overlapping match
        }
        out.extend_from_slice(&hay[last..at]);
        out.extend_from_slice(to);
        last = at + from.len();
    }
    out.extend_from_slice(&hay[last..]);
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && memchr::memmem::find(hay, needle).is_some()
}

/// `Basic` credentials carrying a placeholder, decoded (None: not Basic, or none inside).
fn basic_with(value: &str, ph: &str) -> Option<String> {
    let b64 = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))?;
    let raw = base64_decode(b64.trim())?;
    let text = String::from_utf8(raw).ok()?;
    text.contains(ph).then_some(text)
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        } as u32)
    };
    let s = s.trim_end_matches('=');
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        match chunk.len() {
            4 => out.extend_from_slice(&bytes),
            3 => out.extend_from_slice(&bytes[..2]),
            2 => out.push(bytes[0]),
            _ => return None,
        }
    }
    Some(out)
}

fn base64_encode(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The request for one hop to `host`, each placeholder of a secret that host may receive
/// replaced by the secret in the form its place needs. Err: why a secret cannot go where
/// the code put it (the broker refuses the request, `secret-not-placeable`). None: no
/// placeholder in it, the request goes as it is (nothing copied).
pub fn apply(
    set: &WithheldSet,
    host: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
) -> Result<Option<Applied>, String> {
    let carries = |ph: &str| {
        url.contains(ph)
            || headers
                .iter()
                .any(|(_, v)| v.contains(ph) || basic_with(v, ph).is_some())
            || contains(body, ph.as_bytes())
    };
    if !set.0.iter().any(|s| carries(&s.placeholder)) {
        return Ok(None);
    }
    let mut out = Applied {
        url: url.to_string(),
        headers: headers.to_vec(),
        body: body.to_vec(),
        ..Applied::default()
    };
    let content_type = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.to_ascii_lowercase())
        .unwrap_or_default();
    for s in &set.0 {
        let ph = s.placeholder.as_str();
        if !carries(ph) {
            continue;
        }
        if !guard::host_allowed(host, &s.hosts) {
            out.withheld.push(s.name.clone());
            continue;
        }
        let in_url = if s.url {
            s.value.clone()
        } else {
            component(&s.value)
        };
        out.url = out.url.replace(ph, &in_url);
        for (_, v) in out.headers.iter_mut() {
            if let Some(text) = basic_with(v, ph) {
                *v = format!(
                    "Basic {}",
                    base64_encode(text.replace(ph, &s.value).as_bytes())
                );
            }
            if v.contains(ph) {
                if s.value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
                    return Err(format!(
                        "${{{}}} has a line break: it cannot go in a header",
                        s.name
                    ));
                }
                *v = v.replace(ph, &s.value);
            }
        }
        let in_body = if content_type.contains("json") {
            let j = serde_json::to_string(&s.value).unwrap_or_default();
            j[1..j.len().saturating_sub(1).max(1)].to_string()
        } else if content_type.contains("x-www-form-urlencoded") {
            form(&s.value)
        } else {
            s.value.clone()
        };
        out.body = replace_bytes(&out.body, ph.as_bytes(), in_body.as_bytes());
        out.sent.push(s.name.clone());
    }
    if !out.sent.is_empty() {
        // The response to a request that carried a secret is searched for its echoes: it
        // must come whole and as is (a gzip'd or ranged echo would pass unrecognised).
        out.headers.retain(|(k, _)| {
            !k.eq_ignore_ascii_case("accept-encoding") && !k.eq_ignore_ascii_case("range")
        });
        out.headers
            .push(("Accept-Encoding".to_string(), "identity".to_string()));
    }
    Ok(Some(out))
}

/// `crypto.subtle.sign` with a key the code imported from a placeholder: the HMAC of `data`
/// under the secret it stands for (the code never sees the key; `exportKey` refuses it).
pub fn hmac(
    set: &WithheldSet,
    hash: &str,
    placeholder: &str,
    data: &[u8],
) -> Result<Vec<u8>, String> {
    let Some(s) = set.0.iter().find(|s| s.placeholder == placeholder) else {
        return Err("sign: the key is not a secret of this call".into());
    };
    // A MAC under a secret that may go to no host would be a credential the tool mints for
    // anywhere (and an oracle for guessing a weak key): signing follows the secret's hosts.
    if s.hosts.is_empty() {
        return Err(format!(
            "sign: ${{{}}} may go to no host ([secrets.{}] hosts, or the tool's allowlist), so it signs nothing",
            s.name, s.name
        ));
    }
    let alg = match hash {
        "SHA-1" => ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
        "SHA-256" => ring::hmac::HMAC_SHA256,
        "SHA-384" => ring::hmac::HMAC_SHA384,
        "SHA-512" => ring::hmac::HMAC_SHA512,
        _ => return Err(format!("sign: unsupported hash {hash}")),
    };
    let key = ring::hmac::Key::new(alg, s.value.as_bytes());
    Ok(ring::hmac::sign(&key, data).as_ref().to_vec())
}

/// Every form of every withheld secret with its placeholder, longest form first across all
/// secrets (a secret inside a longer one is masked as part of the longer one).
fn forms_by_length(set: &WithheldSet) -> Vec<(&str, &str)> {
    let mut all: Vec<(&str, &str)> = set
        .0
        .iter()
        .flat_map(|s| {
            s.forms()
                .iter()
                .map(|f| (f.as_str(), s.placeholder.as_str()))
        })
        .collect();
    all.sort_by_key(|(f, _)| std::cmp::Reverse(f.len()));
    all
}

/// Masks every form of every withheld secret in a response back to its placeholder, before
/// the worker sees it (a server that echoes the key it was sent), and before any slice of it
/// is cut.
pub fn mask_echoes(
    set: &WithheldSet,
    url: &mut String,
    headers: &mut [(String, String)],
    body: &mut Vec<u8>,
) {
    for (f, ph) in forms_by_length(set) {
        if contains(body, f.as_bytes()) {
            *body = replace_bytes(body, f.as_bytes(), ph.as_bytes());
        }
        if url.contains(f) {
            *url = url.replace(f, ph);
        }
        for (_, v) in headers.iter_mut() {
            if v.contains(f) {
                *v = v.replace(f, ph);
            }
        }
    }
}

/// [`mask_echoes`] for a text (a failed fetch's message, which may name the URL sent).
pub fn mask_text(set: &WithheldSet, text: &str) -> String {
    let mut out = text.to_string();
    for (f, ph) in forms_by_length(set) {
        if out.contains(f) {
            out = out.replace(f, ph);
        }
    }
    out
}

/// `stsd secrets-bench` (scripts/bench): what substitution adds to one fetch, p50 and p99 in
/// microseconds: two secrets put back into a 1 KiB request (a query parameter, a bearer
/// header, the JSON body) and a 1 KiB response searched for every form of both.
pub fn bench(rounds: usize) -> (f64, f64) {
    let secret = |name: &str, value: &str| {
        let (placeholder, url) = placeholder("bench", name, value);
        Withheld::new(
            name,
            value,
            placeholder,
            url,
            vec!["api.example.com".into()],
        )
    };
    let set = WithheldSet(vec![
        secret("API_KEY", "sk-live-0123456789abcdef"),
        secret("CLIENT_ID", "client-0123456789"),
    ]);
    let (k, id) = (&set.0[0].placeholder, &set.0[1].placeholder);
    let url = format!("https://api.example.com/v1/search?q=weather&client={id}&key={k}");
    let headers = vec![
        ("Authorization".to_string(), format!("Bearer {k}")),
        ("Content-Type".to_string(), "application/json".to_string()),
        ("Accept".to_string(), "application/json".to_string()),
    ];
    let filler = "x".repeat(1024 - 40 - k.len());
    let body = format!("{{\"key\":\"{k}\",\"pad\":\"{filler}\"}}").into_bytes();
    let response = format!("{{\"results\":[\"{}\"]}}", "y".repeat(1000)).into_bytes();
    let mut us = Vec::with_capacity(rounds.max(1));
    for _ in 0..rounds.max(1) {
        let t0 = std::time::Instant::now();
        let a = apply(&set, "api.example.com", &url, &headers, &body);
        let (mut head_url, mut head_headers) = (url.clone(), Vec::new());
        let mut resp = response.clone();
        mask_echoes(&set, &mut head_url, &mut head_headers, &mut resp);
        us.push(t0.elapsed().as_secs_f64() * 1e6);
        let _ = std::hint::black_box((a, resp));
    }
    us.sort_by(f64::total_cmp);
    let at = |q: f64| us[((us.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(value: &str, hosts: &[&str]) -> WithheldSet {
        let (placeholder, url) = placeholder("t", "KEY", value);
        WithheldSet(vec![Withheld::new(
            "KEY",
            value,
            placeholder,
            url,
            hosts.iter().map(|h| h.to_string()).collect(),
        )])
    }

    #[test]
    fn a_placeholder_is_opaque_stable_and_survives_every_encoding() {
        let (a, url) = placeholder("tool", "KEY", "sk-live-1");
        assert!(!url && a.starts_with(PREFIX) && a.len() == PREFIX.len() + 40);
        assert_eq!(placeholder("tool", "KEY", "sk-live-1").0, a);
        assert_ne!(placeholder("tool", "KEY", "sk-live-2").0, a);
        assert_ne!(placeholder("other", "KEY", "sk-live-1").0, a);
        assert_eq!(component(&a), a);
        assert_eq!(
            serde_json::to_string(&a).unwrap_or_default(),
            format!("\"{a}\"")
        );
        let (u, url) = placeholder("t", "HOOK", "https://hooks.slack.com/services/T0/B0/xyz");
        assert!(
            url && u.starts_with("https://hooks.slack.com/stsd-secret-"),
            "{u}"
        );
        assert!(!u.contains("T0/B0"));
    }

    #[test]
    fn each_place_gets_the_form_it_needs_and_only_an_allowed_host_gets_it() {
        let s = set("a b&c\"d", &["api.example.com"]);
        let ph = s.0[0].placeholder.clone();
        let headers = vec![
            ("Authorization".into(), format!("Bearer {ph}")),
            ("Content-Type".into(), "application/json".into()),
        ];
        let body = format!("{{\"key\":\"{ph}\"}}");
        let a = apply(
            &s,
            "api.example.com",
            &format!("https://api.example.com/x?k={ph}"),
            &headers,
            body.as_bytes(),
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        assert_eq!(a.url, "https://api.example.com/x?k=a%20b%26c%22d");
        assert_eq!(a.headers[0].1, "Bearer a b&c\"d");
        assert_eq!(String::from_utf8_lossy(&a.body), r#"{"key":"a b&c\"d"}"#);
        assert_eq!(a.sent, ["KEY"]);
        // Another host (allowed for the tool, not for this secret): the placeholder as is.
        let b = apply(
            &s,
            "other.example.com",
            &format!("https://other.example.com/?k={ph}"),
            &headers,
            b"",
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        assert!(b.url.contains(&ph) && b.headers[0].1.contains(&ph));
        assert_eq!(b.withheld, ["KEY"]);
        assert!(b.sent.is_empty());
    }

    #[test]
    fn basic_credentials_forms_and_whole_urls_are_put_back() {
        let s = set("pass:word", &["*.example.com"]);
        let ph = s.0[0].placeholder.clone();
        let basic = format!("Basic {}", base64_encode(format!("user:{ph}").as_bytes()));
        let headers = vec![
            ("authorization".into(), basic),
            (
                "content-type".into(),
                "application/x-www-form-urlencoded".into(),
            ),
        ];
        let a = apply(
            &s,
            "api.example.com",
            "https://api.example.com/",
            &headers,
            format!("k={ph}").as_bytes(),
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        assert_eq!(
            a.headers[0].1,
            format!("Basic {}", base64_encode(b"user:pass:word"))
        );
        assert_eq!(a.body, b"k=pass%3Aword");
        let hook = set(
            "https://hooks.slack.com/services/T0/B0/xyz",
            &["hooks.slack.com"],
        );
        let u = hook.0[0].placeholder.clone();
        let a = apply(&hook, "hooks.slack.com", &u, &[], b"{}")
            .ok()
            .flatten()
            .unwrap_or_default();
        assert_eq!(a.url, "https://hooks.slack.com/services/T0/B0/xyz");
        let lf = set("a\r\nX-Evil: 1", &["api.example.com"]);
        let ph = lf.0[0].placeholder.clone();
        let r = apply(
            &lf,
            "api.example.com",
            "https://api.example.com/",
            &[("x-key".into(), ph)],
            b"",
        );
        assert!(r.is_err_and(|e| e.contains("line break")));
    }

    #[test]
    fn an_echoed_secret_is_masked_back_to_its_placeholder() {
        let s = set("sk-live-echoed", &["api.example.com"]);
        let ph = s.0[0].placeholder.clone();
        let mut url = "https://api.example.com/?k=sk-live-echoed".to_string();
        let mut headers = vec![("x-echo".to_string(), "Bearer sk-live-echoed".to_string())];
        let mut body = br#"{"auth":"Bearer sk-live-echoed","b64":"c2stbGl2ZS1lY2hvZWQ="}"#.to_vec();
        mask_echoes(&s, &mut url, &mut headers, &mut body);
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("sk-live-echoed") && !text.contains("c2stbGl2ZS1lY2hvZWQ"),
            "{text}"
        );
        assert!(text.contains(&ph));
        assert_eq!(headers[0].1, format!("Bearer {ph}"));
        assert!(!url.contains("sk-live"));
        let e = mask_text(
            &s,
            "[fetch] io: https://api.example.com/?k=sk-live-echoed: refused",
        );
        assert!(!e.contains("sk-live") && e.contains(&ph), "{e}");
    }

    #[test]
    fn a_request_that_carries_a_secret_asks_for_the_whole_body_as_is_and_never_to_everywhere() {
        let s = set("sk-live-1234", &["api.example.com"]);
        let ph = s.0[0].placeholder.clone();
        let headers = vec![
            ("Accept-Encoding".to_string(), "gzip".to_string()),
            ("Range".to_string(), "bytes=0-3".to_string()),
            ("X-Key".to_string(), ph.clone()),
        ];
        let a = apply(
            &s,
            "api.example.com",
            "https://api.example.com/",
            &headers,
            b"",
        )
        .ok()
        .flatten()
        .unwrap_or_default();
        assert_eq!(
            a.headers,
            [
                ("X-Key".to_string(), "sk-live-1234".to_string()),
                ("Accept-Encoding".to_string(), "identity".to_string())
            ]
        );
        // A `*` in the allowlist is no host for a secret; a secret with none signs nothing.
        let env = |_: &str| -> Option<String> { Some("sk-live-1234".into()) };
        let conf = std::collections::BTreeMap::new();
        let w = Withholding {
            env: &env,
            tool: "t",
            tool_hosts: &["*".to_string()],
            default_hosts: &["*".to_string(), "api.example.com".to_string()],
            config: &conf,
            found: Default::default(),
        };
        let _ = w.lookup("KEY");
        let found = w.found.into_inner();
        assert_eq!(found[0].hosts, ["api.example.com"]);
        let nowhere = set("sk-live-1234", &[]);
        let ph = nowhere.0[0].placeholder.clone();
        assert!(hmac(&nowhere, "SHA-256", &ph, b"x").is_err());
        assert!(hmac(&s, "SHA-256", &s.0[0].placeholder, b"x").is_ok());
    }
}
