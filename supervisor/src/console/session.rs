//! Who is using the console: a session made at login (a random id in a cookie that is
//! `HttpOnly`, `SameSite=Strict`, `Secure`, and scoped to `/ui/`), held here, and its CSRF
//! token, which every state-changing request carries in its form and which is compared in
//! constant time. A session lasts [`IDLE`] without a request and [`MAX_AGE`] at most.

use crate::call::Principal;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const COOKIE: &str = "stsd_console";
pub const IDLE: Duration = Duration::from_secs(30 * 60);
pub const MAX_AGE: Duration = Duration::from_secs(12 * 3600);
/// The most sessions held at once; the oldest goes first.
const MAX_SESSIONS: usize = 1024;

#[derive(Clone)]
pub struct Session {
    pub principal: Principal,
    pub csrf: String,
    /// The token the person logged in with (None: a client certificate, which the TLS
    /// handshake checks on every connection): checked again on every request, so a token
    /// removed (`stsd token rm`) ends its sessions too.
    pub credential: Option<String>,
    made: Instant,
    seen: Instant,
}

#[derive(Default)]
pub struct Sessions {
    inner: Mutex<HashMap<String, Session>>,
}

/// 32 random bytes, hex.
pub fn random_hex() -> Option<String> {
    let mut raw = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut raw).ok()?;
    Some(raw.iter().map(|b| format!("{b:02x}")).collect())
}

impl Sessions {
    /// A new session for `principal`: (its id, the session).
    pub fn open(
        &self,
        principal: Principal,
        credential: Option<String>,
    ) -> Option<(String, Session)> {
        let (id, csrf) = (random_hex()?, random_hex()?);
        let now = Instant::now();
        let s = Session {
            principal,
            csrf,
            credential,
            made: now,
            seen: now,
        };
        let mut map = self.inner.lock().ok()?;
        map.retain(|_, v| live(v, now));
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map
                .iter()
                .min_by_key(|(_, v)| v.seen)
                .map(|(k, _)| k.clone())
            {
                map.remove(&oldest);
            }
        }
        map.insert(id.clone(), s.clone());
        Some((id, s))
    }

    /// The live session with this id, its idle clock restarted.
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut map = self.inner.lock().ok()?;
        let now = Instant::now();
        let s = map.get_mut(id)?;
        if !live(s, now) {
            map.remove(id);
            return None;
        }
        s.seen = now;
        Some(s.clone())
    }

    /// Whether the session is live, without restarting its idle clock (a live page's
    /// stream checks it: an open tab is not a person using the console).
    pub fn live(&self, id: &str) -> bool {
        let Ok(map) = self.inner.lock() else {
            return false;
        };
        map.get(id).is_some_and(|s| live(s, Instant::now()))
    }

    pub fn close(&self, id: &str) {
        if let Ok(mut map) = self.inner.lock() {
            map.remove(id);
        }
    }
}

fn live(s: &Session, now: Instant) -> bool {
    now.duration_since(s.seen) < IDLE && now.duration_since(s.made) < MAX_AGE
}

/// The session cookie's value in a `Cookie` header.
pub fn cookie_of(header: Option<&http::HeaderValue>) -> Option<String> {
    let v = header?.to_str().ok()?;
    v.split(';').find_map(|part| {
        let (k, val) = part.trim().split_once('=')?;
        (k == COOKIE && !val.is_empty() && val.len() <= 128).then(|| val.to_string())
    })
}

/// The `Set-Cookie` for session `id` (empty: the one that ends it).
pub fn set_cookie(id: &str) -> String {
    let age = if id.is_empty() { 0 } else { MAX_AGE.as_secs() };
    format!("{COOKIE}={id}; Path=/ui/; Max-Age={age}; HttpOnly; Secure; SameSite=Strict")
}

/// Equal, in time that does not depend on where they differ.
pub fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Whether a state-changing request comes from the console's own pages: its `Origin` (or,
/// without one, its `Referer`) is this listener's origin, `scheme://Host` (`tls` None: either
/// scheme), or one of `allowed` (the listener's `allowed_origins`).
pub fn same_origin(headers: &http::HeaderMap, tls: Option<bool>, allowed: &[String]) -> bool {
    let Some(host) = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let host = host.to_ascii_lowercase();
    let own = |o: &str| match tls {
        Some(true) => o == format!("https://{host}"),
        Some(false) => o == format!("http://{host}"),
        None => o == format!("https://{host}") || o == format!("http://{host}"),
    };
    let from = match headers.get(http::header::ORIGIN) {
        Some(o) => o.to_str().ok().map(|s| s.to_ascii_lowercase()),
        None => headers
            .get(http::header::REFERER)
            .and_then(|r| r.to_str().ok())
            .and_then(|r| url::Url::parse(r).ok())
            .map(|u| u.origin().ascii_serialization()),
    };
    match from {
        Some(o) => own(&o) || allowed.iter().any(|a| a.eq_ignore_ascii_case(&o)),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::PrincipalKind;

    #[test]
    fn a_session_is_found_by_its_id_and_ends_when_closed() {
        let s = Sessions::default();
        let (id, made) = s
            .open(Principal::new("alice", PrincipalKind::Token), None)
            .expect("session");
        assert_eq!(id.len(), 64);
        assert_ne!(made.csrf, id);
        assert_eq!(s.get(&id).map(|x| x.principal.name), Some("alice".into()));
        assert!(s.get("0000").is_none());
        s.close(&id);
        assert!(s.get(&id).is_none());
    }

    #[test]
    fn a_live_check_does_not_restart_the_idle_clock() {
        let s = Sessions::default();
        let (id, _) = s
            .open(Principal::new("alice", PrincipalKind::Token), None)
            .expect("session");
        let age = |by: Duration| {
            if let Ok(mut m) = s.inner.lock() {
                if let Some(x) = m.get_mut(&id) {
                    x.seen -= by;
                    x.made -= by;
                }
            }
        };
        age(IDLE - Duration::from_secs(2));
        assert!(s.live(&id));
        age(Duration::from_secs(3));
        assert!(
            !s.live(&id),
            "an open page's checks kept an idle session alive"
        );
        assert!(s.get(&id).is_none());
    }

    #[test]
    fn the_cookie_is_read_and_set_with_its_attributes() {
        let h = http::HeaderValue::from_static("a=b; stsd_console=abc123; c=d");
        assert_eq!(cookie_of(Some(&h)).as_deref(), Some("abc123"));
        let c = set_cookie("abc123");
        for attr in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/ui/"] {
            assert!(c.contains(attr), "{c}");
        }
        assert!(set_cookie("").contains("Max-Age=0"));
    }

    #[test]
    fn only_the_consoles_own_origin_may_change_anything() {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::HOST, "127.0.0.1:8080".parse().expect("host"));
        assert!(!same_origin(&h, Some(false), &[]), "no Origin, no Referer");
        h.insert(
            http::header::ORIGIN,
            "http://127.0.0.1:8080".parse().expect("o"),
        );
        assert!(same_origin(&h, Some(false), &[]));
        assert!(!same_origin(&h, Some(true), &[]), "the scheme counts");
        assert!(
            same_origin(&h, None, &[]),
            "behind a TLS proxy: either scheme"
        );
        h.insert(
            http::header::ORIGIN,
            "http://evil.example".parse().expect("o"),
        );
        assert!(!same_origin(&h, Some(false), &[]));
        assert!(!same_origin(&h, None, &[]));
        assert!(same_origin(
            &h,
            Some(false),
            &["http://evil.example".into()]
        ));
        h.remove(http::header::ORIGIN);
        h.insert(
            http::header::REFERER,
            "http://127.0.0.1:8080/ui/tools".parse().expect("r"),
        );
        assert!(same_origin(&h, Some(false), &[]));
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
