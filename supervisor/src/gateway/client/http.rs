//! The Streamable HTTP transport for a `url` upstream: reqwest with rustls (ring, the bundled
//! Mozilla roots and `[egress] extra_ca_files`, as the egress broker uses) and, when given, stsd's egress proxy. An OAuth
//! upstream's transport adds the bearer token rmcp's authorization manager holds.

use rmcp::transport::auth::{AuthClient, AuthorizationManager};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use stsd_profiles::upstream::UpstreamConfig;

pub type HttpTransport = StreamableHttpClientTransport<reqwest::Client>;
pub type OauthTransport = StreamableHttpClientTransport<AuthClient<reqwest::Client>>;

/// The transport for `cfg.url`. Header values are already resolved (secrets in them are
/// never echoed: errors name the header, not its value).
pub fn transport(
    cfg: &UpstreamConfig,
    url: &str,
    opts: &super::Options,
    max_event: usize,
) -> Result<HttpTransport, String> {
    let client = client(opts)?;
    Ok(StreamableHttpClientTransport::with_client(
        client,
        config(cfg, url, max_event)?,
    ))
}

/// [`transport`] for an OAuth upstream: the same client, with the bearer token `manager`
/// holds (refreshed when it is about to expire, and once when the server refuses it).
pub fn oauth_transport(
    cfg: &UpstreamConfig,
    url: &str,
    opts: &super::Options,
    max_event: usize,
    manager: AuthorizationManager,
) -> Result<OauthTransport, String> {
    let client = client(opts)?;
    Ok(StreamableHttpClientTransport::with_client(
        AuthClient::new(client, manager),
        config(cfg, url, max_event)?,
    ))
}

/// The upstream's HTTP client: its egress proxy, its connect timeout, the trusted CAs.
fn client(opts: &super::Options) -> Result<reqwest::Client, String> {
    builder(
        opts.http_proxy.as_deref(),
        opts.connect_timeout,
        &opts.extra_ca_files,
    )?
    .build()
    .map_err(|e| format!("HTTP client: {e}"))
}

fn config(
    cfg: &UpstreamConfig,
    url: &str,
    max_event: usize,
) -> Result<StreamableHttpClientTransportConfig, String> {
    let mut headers = HashMap::new();
    for (name, value) in &cfg.headers {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name:?}: not a valid header name"))?;
        let mut value = http::HeaderValue::from_str(value)
            .map_err(|_| format!("header {name}: the value is not a valid header value"))?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    Ok(StreamableHttpClientTransportConfig::with_uri(url)
        .custom_headers(headers)
        .max_sse_event_size(max_event))
}

/// The client builder every upstream HTTP request starts from: TLS as the fetch broker's
/// (the bundled roots and `[egress] extra_ca_files`). No system proxy: an upstream reaches
/// the network only through the proxy given here.
pub fn builder(
    proxy: Option<&str>,
    connect_timeout: Duration,
    extra_ca_files: &[PathBuf],
) -> Result<reqwest::ClientBuilder, String> {
    let tls = crate::egress::tls_client_config(extra_ca_files)?;
    let mut client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(connect_timeout)
        .tls_backend_preconfigured((*tls).clone());
    if let Some(proxy) = proxy {
        let proxy = reqwest::Proxy::all(proxy).map_err(|e| format!("proxy {proxy}: {e}"))?;
        client = client.proxy(proxy);
    }
    Ok(client)
}
