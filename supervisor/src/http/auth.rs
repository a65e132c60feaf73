//! Who is calling over HTTP: a bearer token (from the state store, shared by replicas, or
//! the tokens file), or a client certificate.
//!
//! Tokens are kept as SHA-256 digests only. SHA-256 and not a password hash (argon2): every
//! token is 32 random bytes made by `stsd token add`, so there is nothing to guess and no
//! dictionary to slow down; a deliberately slow hash would only hand any client a way to
//! burn the daemon's CPU on every request. A leaked tokens file gives no usable token.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The prefix of every token, so a leaked one is recognisable in a scan.
const TOKEN_PREFIX: &str = "stsd_";

/// The tokens file: digest -> principal.
#[derive(Debug, Default, Clone)]
pub struct Tokens {
    entries: Vec<([u8; 32], String)>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// A principal's name: what the audit record and the rights lists carry.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._@-".contains(c))
}

impl Tokens {
    /// Parses `NAME sha256:HEX` lines; `#` starts a comment. Every error names its line.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(name), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(format!(
                    "line {}: expected `NAME sha256:HEX` (stsd token add writes it)",
                    n + 1
                ));
            };
            if !valid_name(name) {
                return Err(format!(
                    "line {}: principal {name:?} is not a name ([A-Za-z0-9._@-], 1-128)",
                    n + 1
                ));
            }
            let d = hash
                .strip_prefix("sha256:")
                .and_then(unhex32)
                .ok_or_else(|| {
                    format!("line {}: the hash must be sha256:<64 hex digits>", n + 1)
                })?;
            entries.push((d, name.to_string()));
        }
        Ok(Tokens { entries })
    }

    pub fn load(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the tokens file {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal a presented token stands for. Every entry is compared in constant
    /// time, so the answer's timing says nothing about which digest came close.
    pub fn principal(&self, token: &str) -> Option<&str> {
        let d = digest(token);
        let mut found = None;
        for (h, name) in &self.entries {
            let diff = h
                .iter()
                .zip(d.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if diff == 0 && found.is_none() {
                found = Some(name.as_str());
            }
        }
        found
    }

    /// Principals and how many tokens each has (for the startup banner).
    pub fn principals(&self) -> BTreeMap<&str, usize> {
        let mut m = BTreeMap::new();
        for (_, n) in &self.entries {
            *m.entry(n.as_str()).or_insert(0) += 1;
        }
        m
    }
}

impl Tokens {
    /// Rows as the state store keeps them (principal, digest in hex); a row that does not
    /// read is skipped with a warning (the store is the daemon's, not a caller's).
    pub fn of_rows(rows: Vec<(String, String)>) -> Tokens {
        let entries = rows
            .into_iter()
            .filter_map(|(name, hex)| match unhex32(&hex) {
                Some(d) if valid_name(&name) => Some((d, name)),
                _ => {
                    tracing::warn!(principal = %name, "a token row in the state store does not read: skipped");
                    None
                }
            })
            .collect();
        Tokens { entries }
    }
}

/// The bearer tokens in force: the tokens file's (read at start) and the state store's. The
/// store's are read at start and again when a presented token is unknown (at most once a
/// second, so a token just added works at once and a stream of bad tokens costs one read a
/// second), every few seconds (so a removed one stops working), and when another replica
/// changes them.
pub struct TokenBook {
    file: Tokens,
    store: Option<std::sync::Arc<crate::state::Store>>,
    stored: std::sync::RwLock<std::sync::Arc<Tokens>>,
    last: std::sync::Mutex<std::time::Instant>,
}

/// How often a miss may read the store again.
const MISS_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl TokenBook {
    pub fn new(file: Tokens, store: Option<std::sync::Arc<crate::state::Store>>) -> TokenBook {
        let book = TokenBook {
            file,
            store,
            stored: Default::default(),
            last: std::sync::Mutex::new(std::time::Instant::now()),
        };
        book.refresh();
        book
    }

    /// Reads the store's tokens again (blocking: a store round trip).
    pub fn refresh(&self) {
        let Some(store) = &self.store else {
            return;
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
        match store.tokens() {
            Ok(rows) => {
                *self.stored.write().unwrap_or_else(|e| e.into_inner()) =
                    std::sync::Arc::new(Tokens::of_rows(rows));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the bearer tokens in the state store cannot be read: keeping those in force")
            }
        }
    }

    fn lookup(&self, token: &str) -> Option<String> {
        if let Some(n) = self.file.principal(token) {
            return Some(n.to_string());
        }
        let stored = self
            .stored
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        stored.principal(token).map(String::from)
    }

    /// The principal a presented token stands for.
    pub async fn principal(self: &std::sync::Arc<Self>, token: &str) -> Option<String> {
        if let Some(n) = self.lookup(token) {
            return Some(n);
        }
        let stale = self.store.is_some()
            && self
                .last
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .elapsed()
                >= MISS_REFRESH;
        if !stale {
            return None;
        }
        let book = self.clone();
        let _ = tokio::task::spawn_blocking(move || book.refresh()).await;
        self.lookup(token)
    }

    pub fn is_empty(&self) -> bool {
        self.file.is_empty() && self.stored.read().map(|t| t.is_empty()).unwrap_or(true)
    }

    /// Tokens and principals in force (the startup banner).
    pub fn describe(&self) -> (usize, usize) {
        let stored = self
            .stored
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut names = self.file.principals();
        names.extend(stored.principals());
        (self.file.len() + stored.len(), names.len())
    }
}

/// `Authorization: Bearer <token>`: the token, or None when the header is absent or is
/// not a bearer credential.
pub fn bearer(value: Option<&http::HeaderValue>) -> Option<&str> {
    let v = value?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| rest.trim())
        .filter(|t| !t.is_empty())
}

/// A fresh token for principal `name`.
fn fresh_token(name: &str) -> Result<String, String> {
    if !valid_name(name) {
        return Err(format!(
            "{name:?} is not a principal name ([A-Za-z0-9._@-], 1-128 characters)"
        ));
    }
    let mut raw = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw)
        .map_err(|_| "no randomness for a token".to_string())?;
    Ok(format!("{TOKEN_PREFIX}{}", hex(&raw)))
}

/// `stsd token add NAME`: a fresh token, printed once by the caller; only its digest is kept,
/// in the state store (every replica sharing it accepts it within a second).
pub fn add_token_to(store: &crate::state::Store, name: &str) -> Result<String, String> {
    let token = fresh_token(name)?;
    store.tokens_add(&[(name.to_string(), hex(&digest(&token)))])?;
    Ok(token)
}

/// `stsd token add NAME --file FILE`: as [`add_token_to`], the digest appended to `file`
/// (created 0600) instead.
pub fn add_token(file: &Path, name: &str) -> Result<String, String> {
    if file.exists() {
        Tokens::load(file)?;
    }
    let token = fresh_token(name)?;
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)
        .map_err(|e| format!("cannot open {}: {e}", file.display()))?;
    writeln!(f, "{name} sha256:{}", hex(&digest(&token)))
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_maps_to_its_principal_and_only_its_digest_is_stored() {
        let dir = std::env::temp_dir().join(format!("stsd-tokens-{}", std::process::id()));
        let file = dir.join("tokens");
        let _ = std::fs::remove_file(&file);
        let a = add_token(&file, "alice").unwrap_or_else(|e| panic!("{e}"));
        let b = add_token(&file, "ci-bot").unwrap_or_else(|e| panic!("{e}"));
        assert_ne!(a, b);
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(!text.contains(&a) && !text.contains(&a[TOKEN_PREFIX.len()..]));
        let t = Tokens::load(&file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.principal(&a), Some("alice"));
        assert_eq!(t.principal(&b), Some("ci-bot"));
        assert_eq!(t.principal("stsd_00"), None);
        assert_eq!(t.principal(""), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bad_line_is_refused_with_its_number() {
        let e = Tokens::parse("# ok\nalice sha256:00\n")
            .err()
            .unwrap_or_default();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = Tokens::parse("bad/name sha256:0000\n")
            .err()
            .unwrap_or_default();
        assert!(e.contains("not a name"), "{e}");
        assert!(add_token(Path::new("/nonexistent/x"), "a b").is_err());
    }

    #[test]
    fn only_a_bearer_credential_is_taken() {
        let h = |s: &str| http::HeaderValue::from_str(s).ok();
        assert_eq!(bearer(h("Bearer abc").as_ref()), Some("abc"));
        assert_eq!(bearer(h("bearer  abc ").as_ref()), Some("abc"));
        assert_eq!(bearer(h("Basic abc").as_ref()), None);
        assert_eq!(bearer(h("Bearer ").as_ref()), None);
        assert_eq!(bearer(None), None);
    }
}
