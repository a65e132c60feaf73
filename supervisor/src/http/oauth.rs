//! OAuth 2.1 on the HTTP transport, as the MCP authorization spec has it: stsd is a resource
//! server. It publishes its protected-resource metadata (RFC 9728) naming the authorization
//! server, answers a request without a usable token with 401 and a `WWW-Authenticate`
//! challenge pointing at that document, and accepts JWT access tokens (RFC 9068) whose
//! signature verifies against the issuer's JWKS and whose issuer, audience, lifetime and
//! scopes are right. The token's subject becomes the principal `oauth:<subject>` (an
//! authorization server cannot name a principal of stsd's own tokens, which have no `:`); its
//! group claim gives groups `oauth:<group>` (never one of the operator's by a coincidence of
//! names), its scopes `scope:<scope>`.
//!
//! The JWKS is found from the issuer's metadata (RFC 8414, then OpenID Connect discovery),
//! fetched when first needed, kept for an hour, and fetched again when a token names a key id
//! it does not hold (at most every [`MIN_REFETCH`], so tokens with made-up key ids cost one
//! fetch per interval, not one per request).

use crate::call::vocab::{Principal, PrincipalKind};
use jsonwebtoken::jwk::{Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{json, Map, Value};
use std::io::Read;
use std::sync::RwLock;
use std::time::{Duration, Instant};
use stsd_profiles::baseline::OAuthConfig;

/// The shortest interval between two JWKS fetches caused by unknown key ids.
pub const MIN_REFETCH: Duration = Duration::from_secs(10);
/// How long a fetched JWKS is used before it is fetched again.
const KEYS_MAX_AGE: Duration = Duration::from_secs(3600);
/// Time allowed for one metadata or JWKS request.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest metadata or JWKS document read.
const FETCH_LIMIT: u64 = 1024 * 1024;
/// Signature algorithms accepted: public-key ones only (an HMAC "signed" with the public key
/// and `none` are the classic confusions).
const ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// Group names a token cannot claim (its groups become `oauth:<name>`, but a claimed
/// `stsd:admins` is refused outright rather than kept under a confusing name).
const RESERVED_GROUP_PREFIXES: &[&str] = &["stsd:", "unix:", "scope:", "oauth:"];

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 401 `error="invalid_token"`: bad signature, issuer, audience, lifetime, form.
    Invalid(String),
    /// 403 `error="insufficient_scope"`: a valid token without every scope required.
    Scope,
}

/// The verification keys in force.
#[derive(Default)]
struct Keys {
    keys: Vec<(Jwk, DecodingKey)>,
    fetched: Option<Instant>,
}

pub struct OAuth {
    config: OAuthConfig,
    resource: String,
    audience: String,
    keys: RwLock<Keys>,
    /// One fetch at a time; holds when the last one was tried.
    fetching: tokio::sync::Mutex<Option<Instant>>,
}

impl OAuth {
    /// `default_resource`: `http(s)://<listen address><path>`, used when `[http.oauth]
    /// resource` is unset.
    pub fn new(config: &OAuthConfig, default_resource: String) -> Result<OAuth, String> {
        secure_url("[http.oauth] issuer", &config.issuer)?;
        if let Some(u) = &config.jwks_uri {
            secure_url("[http.oauth] jwks_uri", u)?;
        }
        let resource = config.resource.clone().unwrap_or(default_resource);
        let parsed = url::Url::parse(&resource)
            .map_err(|e| format!("[http.oauth] resource {resource:?}: {e}"))?;
        if parsed.fragment().is_some() || !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "[http.oauth] resource {resource:?} must be an http(s) URL without a fragment"
            ));
        }
        if config.principal_claim.is_empty() {
            return Err("[http.oauth] principal_claim must name a claim".into());
        }
        Ok(OAuth {
            audience: config.audience.clone().unwrap_or_else(|| resource.clone()),
            resource,
            config: config.clone(),
            keys: RwLock::default(),
            fetching: tokio::sync::Mutex::new(None),
        })
    }

    /// Where the protected-resource metadata is served: RFC 9728's well-known path with the
    /// resource's path appended (`/.well-known/oauth-protected-resource/mcp`).
    pub fn metadata_path(&self) -> String {
        let path = url::Url::parse(&self.resource)
            .map(|u| u.path().trim_end_matches('/').to_string())
            .unwrap_or_default();
        format!("/.well-known/oauth-protected-resource{path}")
    }

    /// The metadata document's URL, on the resource's origin.
    pub fn metadata_url(&self) -> String {
        match url::Url::parse(&self.resource) {
            Ok(u) => format!(
                "{}{}",
                u.origin().ascii_serialization(),
                self.metadata_path()
            ),
            Err(_) => self.metadata_path(),
        }
    }

    /// The protected-resource metadata (RFC 9728).
    pub fn metadata(&self) -> Value {
        let mut m = json!({
            "resource": self.resource,
            "authorization_servers": [self.config.issuer],
            "bearer_methods_supported": ["header"],
            "resource_name": "stsd",
        });
        if !self.config.scopes.is_empty() {
            m["scopes_supported"] = json!(self.config.scopes);
        }
        m
    }

    /// The `WWW-Authenticate` value for a refusal (None: no credential was presented).
    pub fn challenge(&self, refusal: Option<&Refusal>) -> String {
        let mut parts = vec![format!(
            "Bearer resource_metadata=\"{}\"",
            self.metadata_url()
        )];
        match refusal {
            Some(Refusal::Invalid(why)) => {
                parts.push("error=\"invalid_token\"".into());
                parts.push(format!("error_description=\"{}\"", quoted(why)));
            }
            Some(Refusal::Scope) => parts.push("error=\"insufficient_scope\"".into()),
            None => {}
        }
        if !self.config.scopes.is_empty() {
            parts.push(format!(
                "scope=\"{}\"",
                quoted(&self.config.scopes.join(" "))
            ));
        }
        parts.join(", ")
    }

    /// The principal a JWT access token stands for.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, Refusal> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|_| Refusal::Invalid("not a JWT".into()))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(Refusal::Invalid(format!(
                "the signature algorithm {:?} is not accepted",
                header.alg
            )));
        }
        if let Some(typ) = header.typ.as_deref() {
            let typ = typ.to_ascii_lowercase();
            if !matches!(typ.as_str(), "at+jwt" | "application/at+jwt" | "jwt") {
                return Err(Refusal::Invalid(format!("a {typ} is not an access token")));
            }
        }
        let kid = header.kid.as_deref();
        // Keys older than an hour are fetched again (at most every MIN_REFETCH); when the
        // issuer cannot be reached, the keys held stay in force.
        if self.stale() {
            self.refresh(false).await;
        }
        let key = match self.key_for(kid, header.alg) {
            Some(k) => k,
            None => {
                self.refresh(true).await;
                self.key_for(kid, header.alg).ok_or_else(|| {
                    Refusal::Invalid("no key of the issuer verifies this token".into())
                })?
            }
        };
        let mut v = Validation::new(header.alg);
        v.algorithms = vec![header.alg];
        v.set_issuer(&[&self.config.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud"]);
        v.leeway = self.config.leeway_seconds;
        v.validate_nbf = true;
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key, &v)
            .map_err(|e| Refusal::Invalid(refusal_text(e.kind())))?;
        // RFC 7519: valid only *before* `exp`; the library lets the second of `exp` pass.
        let exp = data.claims.get("exp").and_then(Value::as_u64).unwrap_or(0);
        if jsonwebtoken::get_current_timestamp() >= exp.saturating_add(v.leeway) {
            return Err(Refusal::Invalid(refusal_text(
                &jsonwebtoken::errors::ErrorKind::ExpiredSignature,
            )));
        }
        self.principal(&data.claims)
    }

    /// The principal and groups the claims name; Scope when a required scope is missing.
    fn principal(&self, claims: &Map<String, Value>) -> Result<Principal, Refusal> {
        let subject = match claims.get(&self.config.principal_claim) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => {
                return Err(Refusal::Invalid(format!(
                    "the token has no {} claim",
                    self.config.principal_claim
                )))
            }
        };
        if subject.is_empty() || subject.len() > 256 || subject.chars().any(char::is_control) {
            return Err(Refusal::Invalid("the token's subject is not a name".into()));
        }
        let scopes = scopes(claims);
        if !self.config.scopes.iter().all(|s| scopes.contains(s)) {
            return Err(Refusal::Scope);
        }
        let mut groups: Vec<String> = match claims.get(&self.config.groups_claim) {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|g| g.as_str())
                .map(String::from)
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        };
        groups.retain(|g| {
            !g.is_empty()
                && g.len() <= 128
                && !g.chars().any(char::is_control)
                && !RESERVED_GROUP_PREFIXES.iter().any(|p| g.starts_with(p))
        });
        groups.truncate(64);
        // `oauth:<group>`: what the authorization server says is a group of its own, never
        // one of the operator's ([policy.groups]) by a coincidence of names.
        let mut groups: Vec<String> = groups.into_iter().map(|g| format!("oauth:{g}")).collect();
        groups.extend(scopes.iter().map(|s| format!("scope:{s}")));
        let mut p = Principal::new(format!("oauth:{subject}"), PrincipalKind::OAuth);
        p.groups = groups;
        Ok(p)
    }

    /// The key that may verify a token with `kid` and `alg`, when held and fresh.
    fn key_for(&self, kid: Option<&str>, alg: Algorithm) -> Option<DecodingKey> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let usable = |jwk: &Jwk| {
            jwk.common
                .public_key_use
                .as_ref()
                .is_none_or(|u| *u == PublicKeyUse::Signature)
                && jwk
                    .common
                    .key_algorithm
                    .is_none_or(|a| a.to_string() == format!("{alg:?}"))
        };
        let mut candidates = keys.keys.iter().filter(|(j, _)| usable(j));
        match kid {
            Some(kid) => candidates
                .find(|(j, _)| j.common.key_id.as_deref() == Some(kid))
                .map(|(_, k)| k.clone()),
            // No key id: only an issuer with a single signing key is unambiguous.
            None => {
                let first = candidates.next()?;
                candidates.next().is_none().then(|| first.1.clone())
            }
        }
    }

    fn stale(&self) -> bool {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        keys.fetched.is_none_or(|t| t.elapsed() > KEYS_MAX_AGE)
    }

    /// Fetches the JWKS again, at most every [`MIN_REFETCH`]: when none is held, when it is
    /// old, and when a token names a key id not held (`unknown_kid`).
    async fn refresh(&self, unknown_kid: bool) {
        let mut last = self.fetching.lock().await;
        let recent = last.is_some_and(|t| t.elapsed() < MIN_REFETCH);
        if recent || (!unknown_kid && !self.stale()) {
            return;
        }
        *last = Some(Instant::now());
        let (issuer, configured) = (self.config.issuer.clone(), self.config.jwks_uri.clone());
        let fetched = tokio::task::spawn_blocking(move || fetch_keys(&issuer, configured))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
        match fetched {
            Ok(keys) => {
                tracing::info!(issuer = %self.config.issuer, keys = keys.len(), "OAuth: the issuer's signing keys fetched");
                *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Keys {
                    keys,
                    fetched: Some(Instant::now()),
                };
            }
            Err(e) => {
                tracing::warn!(issuer = %self.config.issuer, error = %e, "OAuth: the issuer's signing keys cannot be fetched")
            }
        }
    }
}

/// What the caller is told of a failed verification (no key material, no claims).
fn refusal_text(kind: &jsonwebtoken::errors::ErrorKind) -> String {
    use jsonwebtoken::errors::ErrorKind as K;
    match kind {
        K::ExpiredSignature => "the token has expired",
        K::ImmatureSignature => "the token is not valid yet",
        K::InvalidAudience => "the token is for another audience",
        K::InvalidIssuer => "the token is from another issuer",
        K::InvalidSignature => "the token's signature does not verify",
        K::MissingRequiredClaim(_) => "the token lacks a required claim (exp, iss, aud)",
        K::InvalidAlgorithm => "the token's algorithm does not match its key",
        _ => "the token does not verify",
    }
    .to_string()
}

/// The token's scopes: `scope` (space-separated, RFC 9068) or `scp` (a list or a string).
fn scopes(claims: &Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["scope", "scp"] {
        match claims.get(key) {
            Some(Value::String(s)) => out.extend(s.split_whitespace().map(String::from)),
            Some(Value::Array(a)) => {
                out.extend(a.iter().filter_map(|s| s.as_str()).map(String::from))
            }
            _ => {}
        }
    }
    out
}

/// A value inside a quoted auth-param: no quotes or backslashes, printable ASCII.
fn quoted(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii() && !c.is_ascii_control() && *c != '"' && *c != '\\')
        .collect()
}

/// https, or http to a loopback address (a test's or a sidecar's authorization server).
fn secure_url(what: &str, u: &str) -> Result<(), String> {
    let parsed = url::Url::parse(u).map_err(|e| format!("{what} {u:?}: {e}"))?;
    let loopback = match parsed.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(format!(
            "{what} {u:?} must be https (plain http only to a loopback address): the keys \
             that decide who may call are fetched from it"
        )),
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(FETCH_TIMEOUT)
        .redirects(0)
        .build()
}

fn get_json(agent: &ureq::Agent, url: &str) -> Result<Value, String> {
    let resp = agent.get(url).call().map_err(|e| format!("{url}: {e}"))?;
    let mut body = Vec::new();
    resp.into_reader()
        .take(FETCH_LIMIT)
        .read_to_end(&mut body)
        .map_err(|e| format!("{url}: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
}

/// The metadata URLs to try for `issuer`: RFC 8414's (the well-known segment before the
/// issuer's path), then OpenID Connect discovery's (after it).
pub fn metadata_urls(issuer: &str) -> Vec<String> {
    let Ok(u) = url::Url::parse(issuer) else {
        return Vec::new();
    };
    let origin = u.origin().ascii_serialization();
    let path = u.path().trim_end_matches('/');
    vec![
        format!("{origin}/.well-known/oauth-authorization-server{path}"),
        format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        ),
    ]
}

/// The issuer's JWKS URI, from its metadata; the metadata must name the same issuer.
fn discover(agent: &ureq::Agent, issuer: &str) -> Result<String, String> {
    let mut errors = Vec::new();
    for url in metadata_urls(issuer) {
        match get_json(agent, &url) {
            Ok(m) if m["issuer"].as_str() == Some(issuer) => {
                let jwks = m["jwks_uri"]
                    .as_str()
                    .ok_or_else(|| format!("{url}: no jwks_uri"))?;
                secure_url("the issuer's jwks_uri", jwks)?;
                return Ok(jwks.to_string());
            }
            Ok(m) => errors.push(format!("{url}: names issuer {}", m["issuer"])),
            Err(e) => errors.push(e),
        }
    }
    Err(format!(
        "no metadata for issuer {issuer}: {}",
        errors.join("; ")
    ))
}

fn fetch_keys(issuer: &str, jwks_uri: Option<String>) -> Result<Vec<(Jwk, DecodingKey)>, String> {
    let agent = agent();
    let uri = match jwks_uri {
        Some(u) => u,
        None => discover(&agent, issuer)?,
    };
    let set = get_json(&agent, &uri)?;
    Ok(keys_of(&set))
}

/// The usable keys of a JWKS document; a key that does not read is skipped (an issuer may
/// publish kinds this build does not verify with).
pub fn keys_of(set: &Value) -> Vec<(Jwk, DecodingKey)> {
    set["keys"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .filter_map(|k| serde_json::from_value::<Jwk>(k.clone()).ok())
        .filter_map(|jwk| {
            // The EdDSA verifier slices 32 bytes off the key: a shorter one must not get there.
            if let jsonwebtoken::jwk::AlgorithmParameters::OctetKeyPair(p) = &jwk.algorithm {
                let x = DecodingKey::from_ed_components(&p.x).ok()?;
                if x.try_get_as_bytes().map(<[u8]>::len).ok()? != 32 {
                    return None;
                }
            }
            let key = DecodingKey::from_jwk(&jwk).ok()?;
            // Symmetric keys never verify an access token here.
            (!matches!(
                jwk.algorithm,
                jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)
            ))
            .then_some((jwk, key))
        })
        .collect()
}

#[cfg(test)]
impl OAuth {
    /// Installs a key set as if fetched now.
    fn with_keys(self, set: &Value) -> OAuth {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Keys {
            keys: keys_of(set),
            fetched: Some(Instant::now()),
        };
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use ring::signature::KeyPair;

    const ISSUER: &str = "http://127.0.0.1:9/issuer";
    const RESOURCE: &str = "http://127.0.0.1:8080/mcp";

    fn b64url(b: &[u8]) -> String {
        const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for c in b.chunks(3) {
            let n = (c[0] as u32) << 16
                | (*c.get(1).unwrap_or(&0) as u32) << 8
                | *c.get(2).unwrap_or(&0) as u32;
            for i in 0..=c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    /// An Ed25519 key: its PKCS#8 document and its JWK.
    fn key(kid: &str) -> (Vec<u8>, Value) {
        let rng = ring::rand::SystemRandom::new();
        let doc =
            ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap_or_else(|e| panic!("{e}"));
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(doc.as_ref())
            .unwrap_or_else(|e| panic!("{e}"));
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "x": b64url(pair.public_key().as_ref()),
                         "kid": kid, "alg": "EdDSA", "use": "sig"});
        (doc.as_ref().to_vec(), jwk)
    }

    fn config(scopes: &[&str]) -> OAuthConfig {
        OAuthConfig {
            issuer: ISSUER.into(),
            resource: Some(RESOURCE.into()),
            audience: None,
            jwks_uri: None,
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            principal_claim: "sub".into(),
            groups_claim: "groups".into(),
            leeway_seconds: 0,
        }
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn claims() -> Value {
        json!({"iss": ISSUER, "aud": RESOURCE, "sub": "alice", "exp": now() + 300,
               "scope": "stsd:call openid", "groups": ["ops", "stsd:admins", "unix:root"]})
    }

    fn sign(der: &[u8], kid: &str, claims: &Value) -> String {
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some(kid.into());
        h.typ = Some("at+jwt".into());
        jsonwebtoken::encode(&h, claims, &EncodingKey::from_ed_der(der))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn server(scopes: &[&str], jwks: &Value) -> OAuth {
        OAuth::new(&config(scopes), String::new())
            .unwrap_or_else(|e| panic!("{e}"))
            .with_keys(jwks)
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
            .block_on(f)
    }

    #[test]
    fn a_good_token_names_its_subject_groups_and_scopes_and_never_a_reserved_group() {
        let (der, jwk) = key("k1");
        let oauth = server(&["stsd:call"], &json!({"keys": [jwk]}));
        let p = run(oauth.authenticate(&sign(&der, "k1", &claims())))
            .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(p.name, "oauth:alice");
        assert_eq!(p.kind, PrincipalKind::OAuth);
        assert_eq!(p.groups, ["oauth:ops", "scope:stsd:call", "scope:openid"]);
    }

    #[test]
    fn every_wrong_token_is_refused_with_its_reason() {
        let (der, jwk) = key("k1");
        let (other, _) = key("k1");
        let oauth = server(&["stsd:call"], &json!({"keys": [jwk]}));
        let refused = |token: String| run(oauth.authenticate(&token)).err();
        let with = |k: &str, v: Value| {
            let mut c = claims();
            c[k] = v;
            c
        };
        let invalid = |why: &str| Some(Refusal::Invalid(why.into()));
        assert_eq!(
            refused(sign(&der, "k1", &with("exp", json!(now() - 5)))),
            invalid("the token has expired")
        );
        // At `exp` itself a token is no longer valid (RFC 7519 4.1.4).
        assert_eq!(
            refused(sign(&der, "k1", &with("exp", json!(now())))),
            invalid("the token has expired")
        );
        assert_eq!(
            refused(sign(
                &der,
                "k1",
                &with("aud", json!("http://elsewhere/mcp"))
            )),
            invalid("the token is for another audience")
        );
        assert_eq!(
            refused(sign(
                &der,
                "k1",
                &with("iss", json!("http://127.0.0.1:9/other"))
            )),
            invalid("the token is from another issuer")
        );
        assert_eq!(
            refused(sign(&other, "k1", &claims())),
            invalid("the token's signature does not verify")
        );
        assert_eq!(
            refused(sign(&der, "k1", &with("scope", json!("openid")))),
            Some(Refusal::Scope)
        );
        assert_eq!(
            refused(sign(&der, "k1", &with("nbf", json!(now() + 300)))),
            invalid("the token is not valid yet")
        );
        // CVE-2026-25537's shape: a claim of the wrong type is not a missing one.
        assert!(refused(sign(&der, "k1", &with("exp", json!("never")))).is_some());
        let mut c = claims();
        c.as_object_mut().map(|o| o.remove("exp"));
        assert!(refused(sign(&der, "k1", &c)).is_some());
        // HS256 "signed" with the published key, and no signature at all.
        let hs = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(),
            &EncodingKey::from_secret(b"x"),
        )
        .unwrap_or_default();
        assert_eq!(
            refused(hs),
            invalid("the signature algorithm HS256 is not accepted")
        );
        let token = sign(&der, "k1", &claims());
        let mut parts = token.split('.');
        let unsigned = format!(
            "{}.{}.",
            b64url(br#"{"alg":"none"}"#),
            parts.nth(1).unwrap_or_default()
        );
        assert!(refused(unsigned).is_some());
        assert_eq!(refused("stsd_abc".into()), invalid("not a JWT"));
    }

    #[test]
    fn an_unknown_key_id_fetches_the_keys_again_at_most_every_interval() {
        let (der, jwk) = key("k1");
        let (der2, _) = key("k2");
        let oauth = server(&[], &json!({"keys": [jwk]}));
        // The issuer is unreachable: the fetch fails and the held keys stay in force.
        let t0 = Instant::now();
        let r = run(oauth.authenticate(&sign(&der2, "k2", &claims())));
        assert_eq!(
            r.err(),
            Some(Refusal::Invalid(
                "no key of the issuer verifies this token".into()
            ))
        );
        let first = run(async { *oauth.fetching.lock().await });
        assert!(first.is_some_and(|t| t >= t0));
        let _ = run(oauth.authenticate(&sign(&der2, "k2", &claims())));
        assert_eq!(run(async { *oauth.fetching.lock().await }), first);
        assert!(run(oauth.authenticate(&sign(&der, "k1", &claims()))).is_ok());
    }

    #[test]
    fn keys_an_hour_old_stay_in_force_when_the_issuer_cannot_be_reached() {
        let (der, jwk) = key("k1");
        let oauth = server(&[], &json!({"keys": [jwk]}));
        let old = Instant::now().checked_sub(KEYS_MAX_AGE * 2);
        oauth
            .keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .fetched = old;
        assert!(oauth.stale());
        // The refresh is tried (and fails: nothing listens at the issuer); the token passes.
        assert!(run(oauth.authenticate(&sign(&der, "k1", &claims()))).is_ok());
        assert!(run(async { *oauth.fetching.lock().await }).is_some());
    }

    #[test]
    fn the_metadata_and_the_challenge_point_at_each_other() {
        let oauth = server(&["stsd:call"], &json!({"keys": []}));
        assert_eq!(
            oauth.metadata_path(),
            "/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            oauth.metadata_url(),
            "http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp"
        );
        let m = oauth.metadata();
        assert_eq!(m["resource"], RESOURCE);
        assert_eq!(m["authorization_servers"], json!([ISSUER]));
        assert_eq!(m["scopes_supported"], json!(["stsd:call"]));
        assert_eq!(
            oauth.challenge(None),
            "Bearer resource_metadata=\"http://127.0.0.1:8080/.well-known/oauth-protected-resource/mcp\", scope=\"stsd:call\""
        );
        assert!(oauth
            .challenge(Some(&Refusal::Invalid("a \"quoted\" reason".into())))
            .contains("error=\"invalid_token\", error_description=\"a quoted reason\""));
        assert_eq!(
            metadata_urls("https://as.example/tenant1"),
            [
                "https://as.example/.well-known/oauth-authorization-server/tenant1",
                "https://as.example/tenant1/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn an_issuer_is_reached_over_https_or_on_loopback_only() {
        let mut c = config(&[]);
        c.issuer = "http://as.example".into();
        assert!(OAuth::new(&c, RESOURCE.into()).is_err());
        c.issuer = "https://as.example".into();
        assert!(OAuth::new(&c, RESOURCE.into()).is_ok());
        c.jwks_uri = Some("http://10.0.0.1/jwks".into());
        assert!(OAuth::new(&c, RESOURCE.into()).is_err());
    }

    #[test]
    fn a_short_or_symmetric_key_is_never_used() {
        let set = json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "x": "AAAA", "kid": "short"},
            {"kty": "oct", "k": "c2VjcmV0", "kid": "sym"},
        ]});
        assert!(keys_of(&set).is_empty());
    }
}
