//! An OAuth upstream's credentials on disk: `<state>/oauth/<id>.json`, mode 0600 in a 0700
//! directory, replaced whole (a temp file made 0600 from its first byte, fsynced, renamed,
//! the directory fsynced), so a crash leaves the old credentials or the new ones. rmcp's
//! `AuthorizationManager` reads and writes them through [`CredentialStore`]; a refresh holds
//! the store's lock from its load to its save, so two refreshes do not race.
//!
//! The token values are secrets: every form of them is masked in what the upstream says
//! (see [`Tokens::masks`]), and nothing here logs or formats one.

use rmcp::transport::auth::{
    AuthError, CredentialRefreshGuard, CredentialStore, StoredCredentials,
};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use stsd_protocol::envvar::SecretSet;

/// One upstream's credentials file, and the secrets to mask its replies with.
pub struct Tokens {
    path: PathBuf,
    /// The upstream's URL: credentials saved for another URL (the entry was changed, or a
    /// new upstream took the id) are not used.
    url: String,
    /// The upstream's configured secrets (headers, env) and the current token values.
    base: SecretSet,
    masks: RwLock<SecretSet>,
    /// Held from a refresh's load to its save.
    refresh: Arc<tokio::sync::Mutex<()>>,
}

/// The credentials directory under the state directory.
pub fn dir(state: &Path) -> PathBuf {
    state.join("oauth")
}

impl Tokens {
    /// The store of upstream `id` (an id `UpstreamConfig::check` accepted: one plain path
    /// component; checked again here, the second layer).
    pub fn open(state: &Path, id: &str, url: &str, base: SecretSet) -> Result<Arc<Tokens>, String> {
        let plain = !id.is_empty()
            && id
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !plain {
            return Err(format!("upstream id {id:?} is not a plain name"));
        }
        let tokens = Arc::new(Tokens {
            path: dir(state).join(format!("{id}.json")),
            url: url.to_string(),
            masks: RwLock::new(base.clone()),
            base,
            refresh: Arc::default(),
        });
        if let Ok(Some(c)) = tokens.read() {
            tokens.remask(Some(&c));
        }
        Ok(tokens)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The upstream's secrets and its current tokens, to mask what it says with.
    pub fn masks(&self) -> SecretSet {
        match self.masks.read() {
            Ok(m) => m.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Whether credentials with a token are on disk.
    pub fn signed_in(&self) -> bool {
        matches!(self.read(), Ok(Some(c)) if c.token_response.is_some())
    }

    /// Deletes the credentials; Ok(whether there were any).
    pub fn delete(&self) -> Result<bool, String> {
        let gone = match fs::remove_file(&self.path) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        self.remask(None);
        Ok(gone)
    }

    fn read(&self) -> Result<Option<StoredCredentials>, String> {
        let file: File = match fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: not credentials stsd wrote: {e}", self.path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.path.display())),
        };
        if file.url != self.url {
            tracing::warn!(path = %self.path.display(), "OAuth credentials saved for another URL are not used");
            return Ok(None);
        }
        Ok(Some(file.credentials))
    }

    fn write(&self, c: &StoredCredentials) -> Result<(), String> {
        let file = FileRef {
            url: &self.url,
            credentials: c,
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        crate::secrets::private_dir(dir)?;
        write_private(&self.path, &bytes).map_err(|e| format!("{}: {e}", self.path.display()))
    }

    fn remask(&self, c: Option<&StoredCredentials>) {
        let mut values: Vec<String> = Vec::new();
        if let Some(t) = c.and_then(|c| c.token_response.as_ref()) {
            // The token response as JSON names the access and refresh tokens' values.
            if let Ok(v) = serde_json::to_value(t) {
                for key in ["access_token", "refresh_token", "id_token"] {
                    if let Some(s) = v.get(key).and_then(|s| s.as_str()) {
                        values.push(s.to_string());
                    }
                }
            }
        }
        let set = self.base.and(values);
        match self.masks.write() {
            Ok(mut m) => *m = set,
            Err(p) => *p.into_inner() = set,
        }
    }
}

/// The file: the credentials and the upstream URL they were made for.
#[derive(serde::Deserialize)]
struct File {
    url: String,
    credentials: StoredCredentials,
}

#[derive(serde::Serialize)]
struct FileRef<'a> {
    url: &'a str,
    credentials: &'a StoredCredentials,
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::secrets::write_private(path, bytes, "oauth-token-written")
}

fn store_error(e: String) -> AuthError {
    AuthError::CredentialStoreError(e)
}

#[async_trait::async_trait]
impl CredentialStore for Tokens {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.read().map_err(store_error)
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.write(&credentials).map_err(store_error)?;
        self.remask(Some(&credentials));
        tracing::info!(path = %self.path.display(), "OAuth credentials saved");
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.delete().map(|_| ()).map_err(store_error)
    }

    /// A refresh token the server refused for good (revoked, expired) is dropped, so the
    /// upstream reads as signed out until the next login; credentials saved since (a login
    /// that raced it) are kept. Called with the refresh lock held.
    async fn on_refresh_token_rejected(
        &self,
        credentials: &StoredCredentials,
    ) -> Result<(), AuthError> {
        let refresh = |c: &StoredCredentials| {
            c.token_response
                .as_ref()
                .and_then(|t| serde_json::to_value(t).ok())
                .and_then(|v| v.get("refresh_token").cloned())
        };
        let current = self.read().map_err(store_error)?;
        if current.as_ref().map(refresh) == Some(refresh(credentials)) {
            tracing::warn!(path = %self.path.display(), "the OAuth server refused the refresh token; signed out");
            self.clear().await?;
        }
        Ok(())
    }

    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        let guard = self.refresh.clone().lock_owned().await;
        Ok(Some(CredentialRefreshGuard::new(guard)))
    }
}

/// rmcp's manager takes its store by value; this hands it the shared one.
pub struct Shared(pub Arc<Tokens>);

#[async_trait::async_trait]
impl CredentialStore for Shared {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        self.0.load().await
    }
    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.0.save(credentials).await
    }
    async fn clear(&self) -> Result<(), AuthError> {
        self.0.clear().await
    }
    async fn on_refresh_token_rejected(&self, c: &StoredCredentials) -> Result<(), AuthError> {
        self.0.on_refresh_token_rejected(c).await
    }
    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        self.0.acquire_refresh_guard().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn creds(access: &str) -> StoredCredentials {
        let response: rmcp::transport::auth::OAuthTokenResponse = serde_json::from_value(
            serde_json::json!({"access_token": access, "token_type": "Bearer",
                               "refresh_token": format!("r-{access}"), "expires_in": 60}),
        )
        .expect("a token response");
        StoredCredentials::new("client-1".into(), Some(response), vec![], Some(1))
    }

    #[tokio::test]
    async fn credentials_are_private_whole_and_masked() {
        let state = tempfile::tempdir().expect("tempdir");
        let t = Tokens::open(
            state.path(),
            "up",
            "https://a.example/mcp",
            SecretSet::default(),
        )
        .expect("open");
        assert!(!t.signed_in());
        t.save(creds("tok-aaaaaaaaaaaa")).await.expect("save");
        let meta = fs::metadata(t.path()).expect("file");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dmeta = fs::metadata(dir(state.path())).expect("dir");
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        assert!(t.signed_in());
        let masked = t
            .masks()
            .mask("echo tok-aaaaaaaaaaaa and r-tok-aaaaaaaaaaaa");
        assert!(!masked.contains("tok-aaaaaaaaaaaa"), "{masked}");
        // A reopened store (a restarted daemon) masks the tokens on disk too.
        let again = Tokens::open(
            state.path(),
            "up",
            "https://a.example/mcp",
            SecretSet::default(),
        )
        .expect("open");
        // An upstream of the same id at another URL does not get them.
        let other = Tokens::open(
            state.path(),
            "up",
            "https://b.example/mcp",
            SecretSet::default(),
        )
        .expect("open");
        assert!(!other.signed_in());
        assert!(!again
            .masks()
            .mask("tok-aaaaaaaaaaaa")
            .contains("tok-aaaaaaaaaaaa"));
        t.clear().await.expect("clear");
        assert!(!t.signed_in());
        assert_eq!(t.masks().mask("tok-aaaaaaaaaaaa"), "tok-aaaaaaaaaaaa");
        // No temp file is left beside it.
        let left: Vec<_> = fs::read_dir(dir(state.path())).expect("dir").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn an_id_that_is_not_a_plain_name_is_refused() {
        let state = tempfile::tempdir().expect("tempdir");
        for id in ["../x", "", "a/b", ".hidden", "A"] {
            assert!(
                Tokens::open(state.path(), id, "u", SecretSet::default()).is_err(),
                "{id}"
            );
        }
    }
}
