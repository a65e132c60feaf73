//! Upstreams changed on a running gateway: added, updated, removed, restarted (the admin
//! methods, a SIGHUP, another replica's change through the state store).
//!
//! A new upstream is set up as one declared at start: connected, confined and scored; its
//! tools are served only once it has listed them and the exposure has scored them. One that
//! leaves is taken out of the exposure first (its tools leave, clients are told), then
//! drained: its calls in flight get `[gateway] drain_seconds`, what is still running then
//! ends UPSTREAM_LOST, its processes are killed, and its workspace mount and control group
//! are released before a successor with the same id is set up (they are named after it).

use super::front::{set_up_one, Gateway, Upstream};
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stsd_profiles::upstream::UpstreamConfig;

/// What a change did, by upstream id.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct Changes {
    pub added: Vec<String>,
    pub updated: Vec<String>,
    pub removed: Vec<String>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.updated.is_empty() && self.removed.is_empty()
    }
}

/// How long a retired upstream's last reference may take to go (a call ending
/// UPSTREAM_LOST after the stop, which is at once) before its successor is set up
/// regardless, with a warning: the successor's workspace mount and control group have the
/// same names, and the old instance's release would then take them.
const RELEASE_WAIT: Duration = Duration::from_secs(30);

impl Gateway {
    /// Makes the running upstreams those of `declared`: the ones no longer declared leave,
    /// the ones declared differently are replaced, the new ones are set up. Upstreams whose
    /// entry did not change are not touched (their sessions and calls go on).
    pub async fn apply(self: &Arc<Self>, declared: Vec<UpstreamConfig>) -> Changes {
        let _one = self.changing.lock().await;
        self.apply_locked(declared).await
    }

    /// [`Gateway::apply`] with what `declared` reads once the change is this one's turn: a
    /// change queued behind another reads the state after it, never an older one.
    pub async fn apply_from(
        self: &Arc<Self>,
        declared: impl FnOnce() -> Result<Vec<UpstreamConfig>, String>,
    ) -> Result<Changes, String> {
        let _one = self.changing.lock().await;
        let declared = declared()?;
        Ok(self.apply_locked(declared).await)
    }

    async fn apply_locked(self: &Arc<Self>, declared: Vec<UpstreamConfig>) -> Changes {
        let now = self.upstreams();
        let mut changes = Changes::default();
        for u in &now {
            match declared.iter().find(|d| d.id == u.cfg.id) {
                None => changes.removed.push(u.cfg.id.clone()),
                Some(d) if *u.cfg != *d => changes.updated.push(u.cfg.id.clone()),
                Some(_) => {}
            }
        }
        for d in &declared {
            if !now.iter().any(|u| u.cfg.id == d.id) {
                changes.added.push(d.id.clone());
            }
        }
        drop(now);
        let leaving: Vec<String> = changes
            .removed
            .iter()
            .chain(&changes.updated)
            .cloned()
            .collect();
        self.retire(&leaving).await;
        for d in declared {
            if changes.added.contains(&d.id) || changes.updated.contains(&d.id) {
                self.admit(d);
            }
        }
        if !changes.is_empty() {
            tracing::info!(added = ?changes.added, updated = ?changes.updated,
                removed = ?changes.removed, "upstreams changed");
        }
        changes
    }

    /// Ends upstream `id`'s session and processes (drained as a removal is) and sets it up
    /// again from the same entry.
    pub async fn restart(self: &Arc<Self>, id: &str) -> Result<(), String> {
        let _one = self.changing.lock().await;
        let cfg = match self.upstream(id) {
            Some(u) => (*u.cfg).clone(),
            None => return Err(format!("no upstream {id}")),
        };
        self.retire(&[id.to_string()]).await;
        self.admit(cfg);
        tracing::info!(upstream = id, "upstream restarted");
        Ok(())
    }

    /// Begins an OAuth upstream's login (see `oauth`): the URL the operator opens, which
    /// sends the browser back to `redirect_uri`.
    pub async fn login_begin(&self, id: &str, redirect_uri: &str) -> Result<String, String> {
        let u = self
            .upstream(id)
            .ok_or_else(|| format!("no upstream {id}"))?;
        let setup = u.oauth.clone().ok_or_else(|| {
            format!(
                "upstream {id} is not an OAuth upstream (one with a url, auth = \"oauth\" \
                 and no Authorization header)"
            )
        })?;
        drop(u);
        super::oauth::begin(&setup, redirect_uri).await
    }

    /// Deletes the OAuth credentials of upstream `id` (removed: it is no longer set up).
    pub fn forget_credentials(&self, id: &str) {
        if self.upstream(id).is_some() {
            return;
        }
        // `open` refuses an id that is not one plain name (this one is the caller's).
        let state = super::front::state_dir(&self.config());
        super::oauth::drop_login(id);
        match super::oauth::Tokens::open(&state, id, "", Default::default())
            .and_then(|t| t.delete())
        {
            Ok(true) => tracing::info!(upstream = id, "OAuth credentials deleted"),
            Ok(false) => {}
            Err(e) => tracing::warn!(upstream = id, error = %e, "OAuth credentials not deleted"),
        }
    }

    /// Finishes upstream `id`'s login with the URL the browser came back to, then connects
    /// it again with its new tokens. Returns the scopes granted.
    pub async fn login_finish(
        self: &Arc<Self>,
        id: &str,
        callback_url: &str,
    ) -> Result<Vec<String>, String> {
        // The upstream still there, at the URL the login began for.
        let setup = self
            .upstream(id)
            .and_then(|u| u.oauth.clone())
            .ok_or_else(|| format!("upstream {id} is gone or no longer an OAuth upstream"))?;
        let scopes = super::oauth::finish(&setup, callback_url).await?;
        tracing::info!(upstream = id, scopes = ?scopes, "signed in to the upstream's OAuth server");
        self.restart(id).await?;
        Ok(scopes)
    }

    /// Waits (up to `within`) until upstream `id` has listed its tools, or has failed to
    /// (set-up refused, its session restarting after an error).
    pub async fn settle(&self, id: &str, within: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            // Not held across the sleep: a retirement waits for every reference to go.
            let Some(u) = self.upstream(id) else { return };
            let done = match &u.conn {
                None => true,
                Some(c) => {
                    c.tools().borrow().generation > 0
                        || matches!(
                            c.state(),
                            super::client::ConnState::Restarting { .. }
                                | super::client::ConnState::Stopped
                        )
                }
            };
            drop(u);
            if done {
                // The exposure follows the list on a task of its own: once more, now.
                self.recompute();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sets `cfg` up and starts following its tool list; its tools are served once listed.
    fn admit(self: &Arc<Self>, cfg: UpstreamConfig) {
        let u = Arc::new(set_up_one(self, cfg));
        self.upstreams
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(u.clone());
        self.follow(&u);
        self.recompute();
    }

    /// Takes the upstreams `ids` out of service: out of the exposure at once, drained, then
    /// stopped and released.
    async fn retire(&self, ids: &[String]) {
        let leaving: Vec<Arc<Upstream>> = {
            let mut list = self.upstreams.write().unwrap_or_else(|e| e.into_inner());
            let (out, keep) = list.drain(..).partition(|u| ids.contains(&u.cfg.id));
            *list = keep;
            out
        };
        if leaving.is_empty() {
            return;
        }
        self.recompute();
        let grace = Duration::from_secs(self.config().gateway.drain_seconds);
        let deadline = Instant::now() + grace;
        for u in &leaving {
            while u.calls.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let cut = u.calls.load(Ordering::SeqCst);
            if cut > 0 {
                tracing::warn!(upstream = %u.cfg.id, calls = cut,
                    "drain period over: calls still in flight end UPSTREAM_LOST");
            }
            if let Some(c) = &u.conn {
                c.stop();
            }
        }
        for u in leaving {
            let t0 = Instant::now();
            while Arc::strong_count(&u) > 1 && t0.elapsed() < RELEASE_WAIT {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if Arc::strong_count(&u) > 1 {
                tracing::warn!(upstream = %u.cfg.id, "a retired upstream is still referenced: \
                    its workspace and control group are released when the last reference goes");
            }
            // The last reference: its control group is emptied and removed, its workspace
            // unmounted (both may wait on the kernel), off the async threads.
            let _ = tokio::task::spawn_blocking(move || drop(u)).await;
        }
    }
}
