//! Daemon metrics: calls by tool and outcome code, a latency histogram per tool, and the
//! gauges of the moment (pool, calls in flight and waiting, approvals pending). Read as JSON
//! over the admin channel (`stsd/metrics`) and, when `[metrics] listen` is set, as Prometheus
//! text on a small HTTP endpoint (`GET /metrics`).

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Histogram bucket bounds, milliseconds (Prometheus `le`, in seconds when rendered).
const BUCKETS_MS: [u64; 14] = [
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000,
];

#[derive(Default, Clone)]
struct Histogram {
    /// Observations at or under each bound (not cumulative here; summed when rendered).
    counts: [u64; BUCKETS_MS.len()],
    over: u64,
    sum_ms: u64,
}

#[derive(Default)]
struct Inner {
    calls: BTreeMap<(String, String), u64>,
    latency: BTreeMap<String, Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// The gauges at the moment of a scrape.
pub struct Gauges {
    pub pool_size: usize,
    pub pool_ready: usize,
    pub in_flight: usize,
    pub waiting: usize,
    pub approvals_pending: usize,
    pub tools_served: usize,
    /// Upstream tools the gateway serves (wrapped, exposed).
    pub upstream_tools_served: usize,
    /// The audit log's size and rotations since start.
    pub audit: crate::audit::AuditStats,
    /// Whether the state store answers (1) or not (0); always 1 for the embedded one.
    pub store_up: bool,
    /// Operations asked of the state store since start.
    pub store_ops: u64,
}

/// A Prometheus label value: backslash, quote and newline escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One answered call: its tool, its outcome ("OK" or the error code) and its wall time.
    pub fn observe(&self, tool: &str, outcome: &str, wall_ms: u64) {
        let mut m = self.lock();
        *m.calls
            .entry((tool.to_string(), outcome.to_string()))
            .or_default() += 1;
        let h = m.latency.entry(tool.to_string()).or_default();
        h.sum_ms += wall_ms;
        match BUCKETS_MS.iter().position(|b| wall_ms <= *b) {
            Some(i) => h.counts[i] += 1,
            None => h.over += 1,
        }
    }

    pub fn json(&self, g: &Gauges) -> Value {
        let m = self.lock();
        let calls: Vec<Value> = m
            .calls
            .iter()
            .map(|((tool, code), n)| json!({"tool": tool, "outcome": code, "count": n}))
            .collect();
        json!({
            "calls": calls,
            "pool": {"size": g.pool_size, "ready": g.pool_ready},
            "inFlight": g.in_flight,
            "waiting": g.waiting,
            "approvalsPending": g.approvals_pending,
            "toolsServed": g.tools_served,
            "upstreamToolsServed": g.upstream_tools_served,
            "storeUp": g.store_up,
            "storeOps": g.store_ops,
            "audit": {"bytes": g.audit.bytes, "rotations": g.audit.rotations,
                      "failures": g.audit.failures, "refused": g.audit.refused},
        })
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self, g: &Gauges) -> String {
        let m = self.lock();
        let mut out = String::new();
        let _ = writeln!(out, "# HELP stsd_calls_total Tool calls answered, by tool and outcome (OK or the error code).");
        let _ = writeln!(out, "# TYPE stsd_calls_total counter");
        for ((tool, code), n) in &m.calls {
            let _ = writeln!(
                out,
                "stsd_calls_total{{tool=\"{}\",outcome=\"{}\"}} {n}",
                label(tool),
                label(code)
            );
        }
        let _ = writeln!(
            out,
            "# HELP stsd_call_duration_seconds Wall time of a call, arrival to answer."
        );
        let _ = writeln!(out, "# TYPE stsd_call_duration_seconds histogram");
        for (tool, h) in &m.latency {
            let t = label(tool);
            let mut cumulative = 0;
            for (i, b) in BUCKETS_MS.iter().enumerate() {
                cumulative += h.counts[i];
                let le = *b as f64 / 1000.0;
                let _ = writeln!(
                    out,
                    "stsd_call_duration_seconds_bucket{{tool=\"{t}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let count = cumulative + h.over;
            let _ = writeln!(
                out,
                "stsd_call_duration_seconds_bucket{{tool=\"{t}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(
                out,
                "stsd_call_duration_seconds_sum{{tool=\"{t}\"}} {}",
                h.sum_ms as f64 / 1000.0
            );
            let _ = writeln!(
                out,
                "stsd_call_duration_seconds_count{{tool=\"{t}\"}} {count}"
            );
        }
        write_gauges(&mut out, g);
        out
    }
}

/// The gauges and counters that are not per tool, in the exposition format.
fn write_gauges(out: &mut String, g: &Gauges) {
    for (name, help, v) in [
        (
            "stsd_pool_workers",
            "Workers the pool keeps warm.",
            g.pool_size,
        ),
        (
            "stsd_pool_ready",
            "Workers warm and waiting now.",
            g.pool_ready,
        ),
        (
            "stsd_calls_in_flight",
            "Calls arrived and not yet answered.",
            g.in_flight,
        ),
        (
            "stsd_calls_waiting",
            "Calls waiting for a worker slot.",
            g.waiting,
        ),
        (
            "stsd_approvals_pending",
            "Calls waiting for an operator's approval.",
            g.approvals_pending,
        ),
        ("stsd_tools_served", "Tools published.", g.tools_served),
        (
            "stsd_upstream_tools_served",
            "Upstream tools the gateway serves.",
            g.upstream_tools_served,
        ),
        (
            "stsd_store_up",
            "Whether the state store answers (a shared PostgreSQL can be unreachable).",
            usize::from(g.store_up),
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        let _ = writeln!(out, "{name} {v}");
    }
    for (name, kind, help, v) in [
        (
            "stsd_audit_log_bytes",
            "gauge",
            "Bytes in the audit log file now.",
            g.audit.bytes,
        ),
        (
            "stsd_audit_log_rotations_total",
            "counter",
            "Audit log rotations since start ([daemon] audit_max_bytes).",
            g.audit.rotations,
        ),
        (
            "stsd_store_operations_total",
            "counter",
            "Operations asked of the state store since start (none on a published tool's call).",
            g.store_ops,
        ),
        (
            "stsd_audit_failures_total",
            "counter",
            "Audit records that could not be written since start (a full or failing disk).",
            g.audit.failures,
        ),
        (
            "stsd_audit_refused_total",
            "counter",
            "Calls refused AUDIT_UNAVAILABLE since start ([daemon] audit_on_failure).",
            g.audit.refused,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_a_cumulative_histogram() {
        let m = Metrics::default();
        m.observe("a\"b", "OK", 3);
        m.observe("a\"b", "OK", 40_000);
        m.observe("a\"b", "TIMEOUT", 7);
        let g = Gauges {
            pool_size: 2,
            pool_ready: 1,
            in_flight: 0,
            waiting: 0,
            approvals_pending: 0,
            tools_served: 1,
            upstream_tools_served: 0,
            audit: crate::audit::AuditStats::default(),
            store_up: true,
            store_ops: 0,
        };
        let text = m.prometheus(&g);
        assert!(
            text.contains("stsd_calls_total{tool=\"a\\\"b\",outcome=\"OK\"} 2"),
            "{text}"
        );
        assert!(text.contains("le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("le=\"0.01\"} 2"), "{text}");
        assert!(text.contains("le=\"+Inf\"} 3"), "{text}");
        assert!(text.contains("stsd_pool_ready 1"), "{text}");
    }
}
