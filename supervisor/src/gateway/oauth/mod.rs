//! The OAuth 2.1 client for HTTP upstreams (the MCP authorization spec), built on rmcp's
//! `auth`: protected-resource and authorization-server metadata discovery, dynamic client
//! registration (or a pre-registered `oauth_client_id`), PKCE, the resource indicator, and
//! token refresh.
//!
//! An upstream is an OAuth upstream when it has a `url`, `auth = "oauth"` and no
//! `Authorization` header of its own. The operator signs in once, with `stsd upstream login
//! ID`: the daemon discovers, registers and makes the PKCE verifier ([`begin`]); the CLI
//! catches the browser's redirect on a loopback port and hands the callback URL back
//! ([`finish`]); the daemon exchanges the code. The verifier and the tokens never leave the
//! daemon, and every request to the authorization server goes through the upstream's egress
//! proxy. The credentials live in `<state>/oauth/<id>.json` ([`tokens`]).

mod http;
pub mod tokens;

use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, AuthorizationSession,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stsd_profiles::upstream::{AuthKind, UpstreamConfig};
pub use tokens::Tokens;

/// What a connection and a login need to know of an OAuth upstream.
#[derive(Clone)]
pub struct Setup {
    pub id: String,
    pub url: String,
    pub scopes: Vec<String>,
    pub client_id: Option<String>,
    /// The upstream's egress proxy, and the CAs trusted besides the bundled roots.
    pub proxy: Option<String>,
    pub extra_ca_files: Vec<std::path::PathBuf>,
    pub tokens: Arc<Tokens>,
}

/// Whether stsd is the upstream's OAuth client (see the module's comment).
pub fn wanted(cfg: &UpstreamConfig) -> bool {
    cfg.url.is_some()
        && cfg.auth == Some(AuthKind::Oauth)
        && !cfg
            .headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case("authorization"))
}

/// What an operator does when the upstream has no usable credentials.
pub fn login_hint(id: &str) -> String {
    format!("not signed in to the upstream's OAuth server: run `stsd upstream login {id}`")
}

async fn manager(setup: &Setup) -> Result<AuthorizationManager, String> {
    let client = http::ProxiedClient::new(setup.proxy.as_deref(), &setup.extra_ca_files)?;
    let mut m = AuthorizationManager::new_with_oauth_http_client(&setup.url, Arc::new(client))
        .await
        .map_err(|e| format!("OAuth: {e}"))?;
    m.set_credential_store(tokens::Shared(setup.tokens.clone()));
    Ok(m)
}

/// The manager a connection uses: its metadata discovered, its client and tokens loaded.
/// Err: why not (no credentials: [`login_hint`]).
pub async fn connect(setup: &Setup) -> Result<AuthorizationManager, String> {
    if !setup.tokens.signed_in() {
        return Err(login_hint(&setup.id));
    }
    let mut m = manager(setup).await?;
    match m.initialize_from_store().await {
        Ok(true) => Ok(m),
        Ok(false) => Err(login_hint(&setup.id)),
        Err(e) => Err(format!("OAuth: {e}")),
    }
}

/// A login begun and not finished, by upstream id.
struct Pending {
    session: AuthorizationSession,
    begun: Instant,
    /// The URL the login began for, and the `state` its callback must carry.
    url: String,
    state: String,
}

/// The `state` parameter of a URL (an authorization address, or a callback).
pub fn state_of(url: &str) -> Option<String> {
    url::Url::parse(url).ok().and_then(|u| {
        u.query_pairs()
            .find(|(k, _)| k == "state")
            .map(|(_, v)| v.into_owned())
    })
}

/// Forgets a login begun for upstream `id` (it was removed).
pub fn drop_login(id: &str) {
    if let Ok(mut p) = pending().lock() {
        p.remove(id);
    }
}

/// How long a login waits for its browser step.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(600);

fn pending() -> &'static Mutex<HashMap<String, Pending>> {
    static PENDING: std::sync::OnceLock<Mutex<HashMap<String, Pending>>> =
        std::sync::OnceLock::new();
    PENDING.get_or_init(Mutex::default)
}

/// Starts a login: discovery, registration, PKCE. Returns the URL the operator opens;
/// `redirect_uri` is the CLI's loopback listener. A login begun earlier for the same
/// upstream is dropped.
pub async fn begin(setup: &Setup, redirect_uri: &str) -> Result<String, String> {
    check_loopback(redirect_uri)?;
    let mut m = manager(setup).await?;
    let resolved = m.resolve_metadata().await.map_err(|e| {
        format!(
            "OAuth discovery: {e} (stsd reaches the authorization server through the \
                 upstream's egress proxy: is its host in the upstream's `network`?)"
        )
    })?;
    m.set_metadata(resolved.metadata);
    let mut request = AuthorizationRequest::new(redirect_uri).with_client_name("stsd");
    if !setup.scopes.is_empty() {
        request = request.with_scopes(setup.scopes.clone());
    }
    if let Some(id) = &setup.client_id {
        request = request.with_preregistered_client(id.clone());
    }
    let session = AuthorizationSession::new(m, request)
        .await
        .map_err(|(_, e)| format!("OAuth: {e}"))?;
    let url = session.get_authorization_url().to_string();
    if let Ok(mut p) = pending().lock() {
        p.retain(|_, v| v.begun.elapsed() < LOGIN_WINDOW);
        p.insert(
            setup.id.clone(),
            Pending {
                state: state_of(&url).unwrap_or_default(),
                session,
                begun: Instant::now(),
                url: setup.url.clone(),
            },
        );
    }
    Ok(url)
}

/// Finishes upstream `id`'s login with the URL the browser was sent back to: the code is
/// exchanged (its `state` checked against the one [`begin`] made) and the tokens saved.
/// Returns the scopes granted.
pub async fn finish(setup: &Setup, callback_url: &str) -> Result<Vec<String>, String> {
    let id = setup.id.as_str();
    // Taken only by the callback this login is waiting for: a request that is not (another
    // local process, a page loading the loopback port) leaves it waiting.
    let came = state_of(callback_url).unwrap_or_default();
    let entry = pending().lock().ok().and_then(|mut p| {
        let matches = p
            .get(id)
            .is_some_and(|w| !came.is_empty() && w.state == came && w.url == setup.url);
        if matches {
            p.remove(id)
        } else {
            None
        }
    });
    let Some(Pending { session, begun, .. }) = entry else {
        return Err(format!(
            "no login for upstream {id} is waiting for this callback (its state does not \
             match, or none was begun: `stsd upstream login {id}`)"
        ));
    };
    if begun.elapsed() >= LOGIN_WINDOW {
        return Err(format!(
            "the login for upstream {id} waited more than {} s; begin again",
            LOGIN_WINDOW.as_secs()
        ));
    }
    if let Some(error) = url::Url::parse(callback_url).ok().and_then(|u| {
        u.query_pairs()
            .find(|(k, _)| k == "error")
            .map(|(_, v)| v.into_owned())
    }) {
        return Err(format!("the authorization server refused: {error}"));
    }
    session
        .handle_callback_url(callback_url)
        .await
        .map_err(|e| match e {
            AuthError::AuthorizationFailed(m) => format!("OAuth: {m}"),
            other => format!("OAuth: {other}"),
        })?;
    Ok(session.auth_manager.get_current_scopes().await)
}

/// A redirect URI stsd's CLI can catch: `http` on a loopback address (RFC 8252 §7.3).
fn check_loopback(redirect_uri: &str) -> Result<(), String> {
    let u = url::Url::parse(redirect_uri).map_err(|e| format!("redirect_uri: {e}"))?;
    let loopback = match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    if u.scheme() != "http" || !loopback {
        return Err(format!(
            "redirect_uri {redirect_uri}: a login redirects to a loopback http address"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_url_with_oauth_and_no_authorization_header_is_an_oauth_upstream() {
        let mut c = UpstreamConfig {
            id: "x".into(),
            url: Some("https://mcp.example.com/mcp".into()),
            auth: Some(AuthKind::Oauth),
            ..Default::default()
        };
        assert!(wanted(&c));
        c.headers
            .insert("authorization".into(), "Bearer static".into());
        assert!(!wanted(&c), "a static token is the operator's own");
        c.headers.clear();
        c.auth = Some(AuthKind::Bearer);
        assert!(!wanted(&c));
        c.auth = Some(AuthKind::Oauth);
        c.url = None;
        c.command = Some("server".into());
        assert!(!wanted(&c), "a stdio server has no HTTP to authorise");
    }

    #[test]
    fn a_login_redirects_only_to_a_loopback_http_address() {
        assert!(check_loopback("http://127.0.0.1:4711/callback").is_ok());
        assert!(check_loopback("http://[::1]:4711/callback").is_ok());
        assert!(check_loopback("http://localhost:4711/callback").is_ok());
        for bad in [
            "https://127.0.0.1/callback",
            "http://attacker.example/callback",
            "http://10.0.0.1/cb",
            "not a url",
        ] {
            assert!(check_loopback(bad).is_err(), "{bad}");
        }
    }
}
