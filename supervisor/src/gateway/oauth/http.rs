//! The HTTP client rmcp's OAuth state machine makes every request with (metadata discovery,
//! client registration, the code exchange, refreshes): the upstream's own egress proxy, so
//! an authorization server is reached only where the upstream's allowlist says (its URL's
//! host, and `network`), with the broker's address rules; rustls with the bundled roots. A
//! request that must not follow a redirect (a token request) does not.

use rmcp::transport::auth::{
    OAuthHttpClient, OAuthHttpClientError, OAuthHttpClientFuture, OAuthHttpRedirectPolicy,
    OAuthHttpRequest,
};
use std::time::Duration;

/// An authorization server's answer larger than this is refused.
const MAX_BODY: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(30);

pub struct ProxiedClient {
    follow: reqwest::Client,
    stop: reqwest::Client,
}

impl ProxiedClient {
    pub fn new(
        proxy: Option<&str>,
        extra_ca_files: &[std::path::PathBuf],
    ) -> Result<ProxiedClient, String> {
        let build = |redirect: reqwest::redirect::Policy| {
            crate::gateway::client::http::builder(proxy, TIMEOUT, extra_ca_files).and_then(|b| {
                b.timeout(TIMEOUT)
                    .redirect(redirect)
                    .build()
                    .map_err(|e| format!("HTTP client: {e}"))
            })
        };
        Ok(ProxiedClient {
            follow: build(reqwest::redirect::Policy::limited(5))?,
            stop: build(reqwest::redirect::Policy::none())?,
        })
    }
}

#[derive(Debug)]
struct TooLarge;

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the authorization server's answer is over {MAX_BODY} bytes"
        )
    }
}

impl std::error::Error for TooLarge {}

impl OAuthHttpClient for ProxiedClient {
    fn execute(&self, request: OAuthHttpRequest) -> OAuthHttpClientFuture<'_> {
        Box::pin(async move {
            let OAuthHttpRequest {
                request,
                redirect_policy,
                ..
            } = request;
            let client = match redirect_policy {
                OAuthHttpRedirectPolicy::Stop => &self.stop,
                _ => &self.follow,
            };
            let request = reqwest::Request::try_from(request)
                .map_err(|e| Box::new(e) as OAuthHttpClientError)?;
            let mut response = client
                .execute(request)
                .await
                .map_err(|e| Box::new(e) as OAuthHttpClientError)?;
            let mut answer = http::Response::builder()
                .status(response.status())
                .version(response.version());
            for (name, value) in response.headers() {
                answer = answer.header(name, value);
            }
            let mut body = Vec::new();
            while let Some(chunk) = response
                .chunk()
                .await
                .map_err(|e| Box::new(e) as OAuthHttpClientError)?
            {
                if chunk.len() > MAX_BODY - body.len() {
                    return Err(Box::new(TooLarge) as OAuthHttpClientError);
                }
                body.extend_from_slice(&chunk);
            }
            answer
                .body(body)
                .map_err(|e| Box::new(e) as OAuthHttpClientError)
        })
    }
}
