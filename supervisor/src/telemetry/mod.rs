//! OpenTelemetry traces (seed 001: tool-call spans tagged with the resolved risk), off unless
//! `[telemetry] otlp_endpoint` is set. One entry point, [`start`]; the spans themselves are
//! `tracing` spans of the target [`TARGET`], which `tracing-opentelemetry` turns into OTel
//! spans, exported over OTLP/HTTP (protobuf) by the SDK's batch processor on a thread of its
//! own. Seed 001's risk events (`stsd::risk`) become span events of the span they happen in.
//!
//! The span tree of a call: `tools/call` (the tool, its risk level and floor trigger, the
//! upstream and its composition, the principal, the outcome) with children `approval.wait`,
//! `admission`, `worker.run` and each `egress.hop` of an own tool, or `upstream.call` of a
//! wrapped one. A W3C `traceparent` in the request's `_meta` is the call span's parent, and
//! the call's own context goes on to the upstream (its request's `_meta.traceparent`) and to
//! each fetch (the `traceparent` header). No secret is ever an attribute: attributes carry
//! names, levels and codes, never arguments or replies.
//!
//! Off, a span is a callsite whose filter says no: one atomic load ([`enabled`]); `stsd
//! trace-bench` measures it.

pub mod bench;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use stsd_profiles::baseline::TelemetryConfig;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::{filter, Layer, Registry};

/// The target of every span meant for traces (the log's filter never shows them).
pub const TARGET: &str = "stsd::otel";
/// The target of seed 001's risk events (they become span events).
const RISK: &str = "stsd::risk";

type Otel = tracing_opentelemetry::OpenTelemetryLayer<Registry, opentelemetry_sdk::trace::Tracer>;

static ON: AtomicBool = AtomicBool::new(false);
static SLOT: OnceLock<Otel> = OnceLock::new();
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The OTel layer, set once by [`start`]. Not `tracing_subscriber::reload`: a reloadable
/// layer cannot be downcast through, and `tracing-opentelemetry` finds its context (the
/// parent from `traceparent`, attributes set later, the context passed on) by downcasting.
struct Deferred;

impl Layer<Registry> for Deferred {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        // Decided per span by the filter below (traces may start after a callsite was seen).
        tracing::subscriber::Interest::sometimes()
    }

    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_new_span(attrs, id, ctx);
        }
    }

    fn on_record(
        &self,
        span: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_record(span, values, ctx);
        }
    }

    fn on_follows_from(
        &self,
        span: &tracing::span::Id,
        follows: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_follows_from(span, follows, ctx);
        }
    }

    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_event(event, ctx);
        }
    }

    fn on_enter(
        &self,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_enter(id, ctx);
        }
    }

    fn on_exit(
        &self,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_exit(id, ctx);
        }
    }

    fn on_close(
        &self,
        id: tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_close(id, ctx);
        }
    }

    fn on_id_change(
        &self,
        old: &tracing::span::Id,
        new: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, Registry>,
    ) {
        if let Some(l) = SLOT.get() {
            l.on_id_change(old, new, ctx);
        }
    }

    unsafe fn downcast_raw(&self, id: std::any::TypeId) -> Option<*const ()> {
        if id == std::any::TypeId::of::<Self>() {
            return Some(self as *const Self as *const ());
        }
        // SAFETY: forwarded to the layer in the static, which lives as long as the process
        // and is never replaced, so the pointer it gives stays valid.
        SLOT.get().and_then(|l| unsafe { l.downcast_raw(id) })
    }
}

/// Whether traces are being exported.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The layer `logs::init` puts first on the registry: empty, and filtered to nothing, until
/// [`start`] fills it.
pub fn layer() -> impl Layer<Registry> + Send + Sync {
    Deferred.with_filter(filter::filter_fn(|m| {
        enabled() && (m.target() == TARGET || (m.is_event() && m.target() == RISK))
    }))
}

/// The OTLP traces URL: the endpoint as given, `/v1/traces` added to one without a path.
fn traces_url(endpoint: &str) -> Result<String, String> {
    let u = url::Url::parse(endpoint).map_err(|e| format!("[telemetry] otlp_endpoint: {e}"))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err("[telemetry] otlp_endpoint: an http:// or https:// URL".into());
    }
    Ok(match u.path() {
        "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_string(),
    })
}

/// Starts exporting when the config names an endpoint (once per process; a SIGHUP that
/// changes it says a restart is needed). Err: the endpoint is not usable.
pub fn start(config: &TelemetryConfig) -> Result<(), String> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(());
    };
    if PROVIDER.get().is_some() {
        return Ok(());
    }
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let url = traces_url(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(url.clone())
        .with_headers(HashMap::new())
        .with_http_client(http_client()?)
        .build()
        .map_err(|e| format!("[telemetry] the OTLP exporter: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("stsd");
    let otel = tracing_opentelemetry::layer().with_tracer(tracer);
    if SLOT.set(otel).is_err() {
        return Err("[telemetry]: traces were started already".into());
    }
    let _ = PROVIDER.set(provider);
    ON.store(true, Ordering::Relaxed);
    let mut shown = url::Url::parse(&url).map_err(|e| e.to_string())?;
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    tracing::info!(endpoint = %shown, "traces: OTLP/HTTP");
    Ok(())
}

/// The exporter's HTTP client: rustls with ring and the Mozilla roots (stsd installs no
/// process-wide TLS provider), no system proxy. Built on a thread of its own: the blocking
/// client runs a runtime of its own, which must not be made inside the daemon's.
fn http_client() -> Result<reqwest::blocking::Client, String> {
    std::thread::spawn(|| {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(10))
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(|e| format!("[telemetry] the HTTP client: {e}"))
    })
    .join()
    .map_err(|_| "[telemetry] the HTTP client could not be made".to_string())?
}

/// Exports what is buffered (at shutdown, and for tests that read the receiver).
pub fn flush() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
    }
}

/// Ends exporting: what is buffered is sent first.
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        ON.store(false, Ordering::Relaxed);
        let _ = p.shutdown();
    }
}

/// The span of one tool call. `meta` is the request's `_meta`: its W3C `traceparent` (and
/// `tracestate`) make the caller's trace this span's parent.
/// `principal` is the caller as the audit names it (`uid:N`, a principal's name).
pub fn call_span(
    tool: &str,
    principal: &str,
    transport: &str,
    meta: Option<&serde_json::Value>,
) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    let span = tracing::info_span!(target: TARGET, "tools/call",
        "mcp.method.name" = "tools/call", "mcp.tool.name" = tool,
        "enduser.id" = principal, "mcp.transport" = transport);
    if let Some(meta) = meta.and_then(|m| m.as_object()) {
        let mut carrier = HashMap::new();
        for key in ["traceparent", "tracestate"] {
            if let Some(v) = meta.get(key).and_then(|v| v.as_str()) {
                carrier.insert(key.to_string(), v.to_string());
            }
        }
        if !carrier.is_empty() {
            let parent = TraceContextPropagator::new().extract(&carrier);
            let _ = span.set_parent(parent);
        }
    }
    span
}

/// A child span of the current one (none when traces are off).
pub fn child(name: &'static str) -> tracing::Span {
    if !enabled() {
        return tracing::Span::none();
    }
    match name {
        "approval.wait" => tracing::info_span!(target: TARGET, "approval.wait"),
        "admission" => tracing::info_span!(target: TARGET, "admission"),
        "worker.run" => tracing::info_span!(target: TARGET, "worker.run"),
        "upstream.call" => tracing::info_span!(target: TARGET, "upstream.call"),
        "egress.hop" => tracing::info_span!(target: TARGET, "egress.hop"),
        "gateway.recompute" => tracing::info_span!(target: TARGET, "gateway.recompute"),
        _ => tracing::info_span!(target: TARGET, "stsd"),
    }
}

/// Sets an attribute on the current span (nothing when traces are off).
pub fn attribute(key: &'static str, value: impl Into<opentelemetry::Value>) {
    if enabled() {
        tracing::Span::current().set_attribute(key, value);
    }
}

/// The current span's context as W3C headers (`traceparent`, maybe `tracestate`), to pass on
/// to an upstream or a fetch; empty when traces are off.
pub fn propagation() -> Vec<(String, String)> {
    if !enabled() {
        return Vec::new();
    }
    let cx = tracing::Span::current().context();
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn an_endpoint_without_a_path_gets_the_traces_path() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").ok().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            traces_url("http://c:4318/custom/traces").ok().as_deref(),
            Some("http://c:4318/custom/traces")
        );
        assert!(traces_url("grpc://c:4317").is_err());
    }
}
