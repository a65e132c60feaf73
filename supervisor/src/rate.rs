//! Per-principal call rates (`[daemon] calls_per_second`, `call_burst`): a token bucket per
//! principal (an HTTP principal's name, else the socket peer's uid), checked before anything
//! else of a call, own tool or wrapped upstream tool alike. A call past the rate is answered
//! OVERLOADED with the time to wait, and audited like every refusal (past the refusal budget,
//! summarised: see `audit`). Off when `calls_per_second` is 0.
//!
//! [`Quotas`]: the `[[limits]]` rules, per principal, per tool, or both: a call rate with a
//! burst, calls at once, and CPU seconds in any hour. Counted in memory, per daemon.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stsd_profiles::baseline::LimitRule;

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

/// A rule's budget for one principal (and one tool, unless the rule counts all together).
type Key = (usize, String, String);

#[derive(Debug, Default)]
struct Slot {
    bucket: Option<Bucket>,
    running: u32,
    /// CPU microseconds charged, with when, over the last hour.
    cpu: VecDeque<(Instant, u64)>,
}

const HOUR: Duration = Duration::from_secs(3600);

/// The `[[limits]]` rules and what each principal has used of them.
#[derive(Debug)]
pub struct Quotas {
    rules: Vec<LimitRule>,
    slots: Mutex<HashMap<Key, Slot>>,
}

/// A call admitted: it counts as running against its rules until dropped.
pub struct Held<'a> {
    quotas: &'a Quotas,
    keys: Vec<Key>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut slots = self.quotas.lock();
        for k in &self.keys {
            if let Some(s) = slots.get_mut(k) {
                s.running = s.running.saturating_sub(1);
            }
        }
    }
}

impl Held<'_> {
    /// The call's CPU time, charged to every rule with a CPU quota.
    pub fn charge(&self, cpu_us: u64) {
        let now = Instant::now();
        let mut slots = self.quotas.lock();
        for k in &self.keys {
            if self.quotas.rules[k.0].cpu_seconds_per_hour > 0 {
                if let Some(s) = slots.get_mut(k) {
                    s.cpu.push_back((now, cpu_us));
                }
            }
        }
    }
}

impl Quotas {
    pub fn new(rules: Vec<LimitRule>) -> Quotas {
        Quotas {
            rules,
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The budgets a call of `tool` by `principal` counts against.
    fn keys(&self, principal: &str, tool: &str) -> Vec<Key> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                (r.principal == "*" || r.principal == principal)
                    && (r.tool == "*" || r.tool == tool)
            })
            .map(|(i, r)| {
                let t = if r.tool == "*" { "*" } else { tool };
                (i, principal.to_string(), t.to_string())
            })
            .collect()
    }

    /// Admits a call: every rule that applies has room (nothing is taken from any when one
    /// has not); Err with the wait and why.
    pub fn admit(&self, principal: &str, tool: &str) -> Result<Held<'_>, (Duration, String)> {
        self.admit_at(principal, tool, Instant::now())
    }

    pub fn admit_at(
        &self,
        principal: &str,
        tool: &str,
        now: Instant,
    ) -> Result<Held<'_>, (Duration, String)> {
        let keys = self.keys(principal, tool);
        if keys.is_empty() {
            return Ok(Held { quotas: self, keys });
        }
        let mut slots = self.lock();
        if slots.len() >= MAX_TRACKED {
            slots.retain(|_, s| {
                s.running > 0
                    || !s.cpu.is_empty()
                    || s.bucket.is_some_and(|b| {
                        now.saturating_duration_since(b.at) < Duration::from_secs(60)
                    })
            });
        }
        for k in &keys {
            let r = &self.rules[k.0];
            let s = slots.entry(k.clone()).or_default();
            let scope = if k.2 == "*" {
                principal.to_string()
            } else {
                format!("{principal} on {tool}")
            };
            if r.cpu_seconds_per_hour > 0 {
                while s
                    .cpu
                    .front()
                    .is_some_and(|(t, _)| now.saturating_duration_since(*t) >= HOUR)
                {
                    s.cpu.pop_front();
                }
                let used: u64 = s.cpu.iter().map(|(_, us)| us).sum();
                if used >= u64::from(r.cpu_seconds_per_hour) * 1_000_000 {
                    let wait = s.cpu.front().map_or(HOUR, |(t, _)| {
                        HOUR.saturating_sub(now.saturating_duration_since(*t))
                    });
                    return Err((wait, format!(
                        "CPU quota: {scope} used {:.1} of {} CPU seconds this hour ([[limits]] cpu_seconds_per_hour); retry in {} s",
                        used as f64 / 1e6, r.cpu_seconds_per_hour, wait.as_secs().max(1)
                    )));
                }
            }
            if r.concurrent > 0 && s.running >= r.concurrent {
                let wait = Duration::from_millis(100);
                return Err((
                    wait,
                    format!(
                    "concurrency limit: {scope} has {} calls running ([[limits]] concurrent = {})",
                    s.running, r.concurrent
                ),
                ));
            }
            if let Some((rate, burst)) = rate_and_burst(r) {
                let b = s.bucket.get_or_insert(Bucket {
                    tokens: burst,
                    at: now,
                });
                let tokens = refill(b, now, rate, burst);
                if tokens < 1.0 {
                    let wait = Duration::from_secs_f64((1.0 - tokens) / rate);
                    return Err((wait, format!(
                        "rate limit: {scope} made more than {} calls a second (burst {burst}; [[limits]]); retry in {} ms",
                        r.calls_per_second, wait.as_millis().max(1)
                    )));
                }
            }
        }
        // Every rule has room: take from each.
        for k in &keys {
            let r = &self.rules[k.0];
            if let Some(s) = slots.get_mut(k) {
                s.running += 1;
                if let Some((rate, burst)) = rate_and_burst(r) {
                    if let Some(b) = s.bucket.as_mut() {
                        b.tokens = refill(b, now, rate, burst) - 1.0;
                        b.at = now;
                    }
                }
            }
        }
        drop(slots);
        Ok(Held { quotas: self, keys })
    }
}

/// A rule's calls a second and burst (default: one second's worth), when it limits the rate.
fn rate_and_burst(r: &LimitRule) -> Option<(f64, f64)> {
    (r.calls_per_second > 0).then(|| {
        let rate = f64::from(r.calls_per_second);
        let burst = if r.burst == 0 {
            rate.max(1.0)
        } else {
            f64::from(r.burst)
        };
        (rate, burst)
    })
}

fn refill(b: &Bucket, now: Instant, rate: f64, burst: f64) -> f64 {
    let dt = now.saturating_duration_since(b.at).as_secs_f64();
    (b.tokens + dt * rate).min(burst)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rule(principal: &str, tool: &str) -> LimitRule {
        LimitRule {
            principal: principal.into(),
            tool: tool.into(),
            calls_per_second: 0,
            burst: 0,
            concurrent: 0,
            cpu_seconds_per_hour: 0,
        }
    }

    #[test]
    fn a_rule_per_principal_and_tool_limits_that_pair_only() {
        let q = Quotas::new(vec![LimitRule {
            calls_per_second: 2,
            burst: 2,
            ..rule("*", "slow")
        }]);
        let t = Instant::now();
        assert!(q.admit_at("alice", "slow", t).is_ok());
        assert!(q.admit_at("alice", "slow", t).is_ok());
        let (wait, why) = q.admit_at("alice", "slow", t).err().unwrap();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(why.contains("alice on slow"), "{why}");
        assert!(q.admit_at("alice", "echo", t).is_ok(), "another tool");
        assert!(q.admit_at("bob", "slow", t).is_ok(), "another principal");
        assert!(q
            .admit_at("alice", "slow", t + Duration::from_millis(500))
            .is_ok());
    }

    #[test]
    fn concurrency_is_held_until_the_call_ends_and_a_refusal_takes_nothing() {
        let q = Quotas::new(vec![
            LimitRule {
                concurrent: 1,
                ..rule("uid:0", "*")
            },
            LimitRule {
                calls_per_second: 1,
                burst: 5,
                ..rule("*", "*")
            },
        ]);
        let t = Instant::now();
        let held = q.admit_at("uid:0", "a", t).unwrap();
        // Refused by the first rule: nothing is taken from the second.
        for _ in 0..10 {
            assert!(q.admit_at("uid:0", "b", t).is_err());
        }
        drop(held);
        for _ in 0..4 {
            drop(q.admit_at("uid:0", "b", t).unwrap());
        }
    }

    #[test]
    fn a_cpu_quota_refuses_once_spent_until_the_hour_moves_on() {
        let q = Quotas::new(vec![LimitRule {
            cpu_seconds_per_hour: 1,
            ..rule("alice", "*")
        }]);
        let t = Instant::now();
        q.admit_at("alice", "x", t).unwrap().charge(700_000);
        q.admit_at("alice", "x", t).unwrap().charge(400_000);
        let (wait, why) = q.admit_at("alice", "x", t).err().unwrap();
        assert!(why.starts_with("CPU quota: alice used 1.1 of 1"), "{why}");
        assert!(wait > Duration::from_secs(3500), "{wait:?}");
        assert!(q.admit_at("bob", "x", t).is_ok(), "not bob's quota");
        let later = t + HOUR + Duration::from_secs(1);
        assert!(q.admit_at("alice", "x", later).is_ok(), "an hour later");
    }

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
