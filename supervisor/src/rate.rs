//! Per-principal call rates (`[daemon] calls_per_second`, `call_burst`): a token bucket per
//! principal (an HTTP principal's name, else the socket peer's uid), checked before anything
//! else of a call, own tool or wrapped upstream tool alike. A call past the rate is answered
//! OVERLOADED with the time to wait, and audited like every refusal (past the refusal budget,
//! summarised: see `audit`). Off when `calls_per_second` is 0.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Principals tracked at most; past it, buckets that have refilled (they hold no state a
/// fresh one would not) are dropped first, then the oldest.
const MAX_TRACKED: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
pub struct RateLimits {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimits {
    /// `per_second` 0: no limit. `burst` 0: one second's worth.
    pub fn new(per_second: u32, burst: u32) -> RateLimits {
        let per_second = f64::from(per_second);
        RateLimits {
            per_second,
            burst: if burst == 0 {
                per_second.max(1.0)
            } else {
                f64::from(burst)
            },
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.per_second > 0.0
    }

    /// Takes one call from `principal`'s bucket at `now`: Err with the wait until the next
    /// call would pass.
    pub fn admit_at(&self, principal: &str, now: Instant) -> Result<(), Duration> {
        if !self.enabled() {
            return Ok(());
        }
        let mut map = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_TRACKED && !map.contains_key(principal) {
            let (rate, burst) = (self.per_second, self.burst);
            map.retain(|_, b| refill(b, now, rate, burst) < burst);
            if map.len() >= MAX_TRACKED {
                if let Some(oldest) = map.iter().min_by_key(|(_, b)| b.at).map(|(k, _)| k.clone()) {
                    map.remove(&oldest);
                }
            }
        }
        let b = map.entry(principal.to_string()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        b.tokens = refill(b, now, self.per_second, self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.per_second))
        }
    }

    pub fn admit(&self, principal: &str) -> Result<(), Duration> {
        self.admit_at(principal, Instant::now())
    }

    /// The refusal's text.
    pub fn message(&self, principal: &str, wait: Duration) -> String {
        format!(
            "rate limit: {principal} made more than {} calls a second (burst {}); retry in {} ms",
            self.per_second,
            self.burst,
            wait.as_millis().max(1)
        )
    }
}

fn refill(b: &Bucket, now: Instant, rate: f64, burst: f64) -> f64 {
    let dt = now.saturating_duration_since(b.at).as_secs_f64();
    (b.tokens + dt * rate).min(burst)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_gets_its_burst_then_its_rate_and_others_are_untouched() {
        let r = RateLimits::new(10, 5);
        let t = Instant::now();
        for _ in 0..5 {
            assert!(r.admit_at("a", t).is_ok());
        }
        let wait = r.admit_at("a", t).unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // Another principal has its own bucket.
        assert!(r.admit_at("b", t).is_ok());
        // A tenth of a second later: one more call.
        let t1 = t + Duration::from_millis(100);
        assert!(r.admit_at("a", t1).is_ok());
        assert!(r.admit_at("a", t1).is_err());
        // Over a long run the rate holds: 10 a second.
        let mut ok = 0;
        for i in 0..1000 {
            if r.admit_at("a", t1 + Duration::from_millis(i)).is_ok() {
                ok += 1;
            }
        }
        assert!((9..=11).contains(&ok), "{ok}");
        assert!(r.message("a", wait).contains("retry in"));
    }

    #[test]
    fn zero_is_no_limit_and_the_map_stays_bounded() {
        let off = RateLimits::new(0, 0);
        let t = Instant::now();
        assert!((0..10_000).all(|_| off.admit_at("a", t).is_ok()));
        let r = RateLimits::new(1, 1);
        for i in 0..(MAX_TRACKED + 50) {
            let _ = r.admit_at(&format!("p{i}"), t);
        }
        assert!(r.buckets.lock().unwrap().len() <= MAX_TRACKED);
    }
}
