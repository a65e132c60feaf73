//! `stsd trace-bench` (hidden; scripts/bench): what a call's spans cost, off and on. One
//! round is the spans of one wrapped-tool call as the pipeline makes them: the call span
//! (with a caller's traceparent), its risk attributes, `approval.wait`, `upstream.call`, the
//! context passed on, and the outcome. Timed in batches of 100 (one round is far below the
//! clock's grain); per call.

use std::time::Instant;

fn one_call(meta: &serde_json::Value) {
    let span = super::call_span("bench__tool", "uid:1000", "unix", Some(meta));
    let _in = span.enter();
    super::attribute("mcp.risk.level", "L3");
    super::attribute("mcp.upstream.id", "bench");
    {
        let a = super::child("approval.wait");
        let _a = a.enter();
    }
    {
        let u = super::child("upstream.call");
        let _u = u.enter();
        std::hint::black_box(super::propagation());
    }
    super::attribute("mcp.outcome", "OK");
}

/// (p50, p99) in microseconds per call over `rounds` calls. `on`: traces exported to
/// `endpoint` (the batch processor drops what it cannot send; the spans cost the same).
pub fn run(rounds: usize, on: Option<&str>) -> Result<(f64, f64), String> {
    if let Some(endpoint) = on {
        super::start(&stsd_profiles::baseline::TelemetryConfig {
            otlp_endpoint: Some(endpoint.to_string()),
            service_name: "stsd-bench".into(),
        })?;
    }
    let meta = serde_json::json!({
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    });
    const BATCH: usize = 100;
    let mut per: Vec<f64> = Vec::with_capacity(rounds / BATCH + 1);
    for _ in 0..(rounds / BATCH).max(1) {
        let t0 = Instant::now();
        for _ in 0..BATCH {
            one_call(&meta);
        }
        per.push(t0.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
    }
    per.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| per[((per.len() - 1) as f64 * q) as usize];
    let out = (at(0.5), at(0.99));
    super::shutdown();
    Ok(out)
}
