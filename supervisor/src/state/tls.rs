//! TLS to PostgreSQL: rustls (ring), with the server's certificate and host name always
//! verified, against `[store] ca_file` or the Mozilla roots. With `ca_file` TLS is required
//! (no `sslmode`: `require`; `prefer`, which falls back to plain text, refused); without it
//! the URL's `sslmode` decides, `prefer` being the client's default. libpq's `sslmode=require` does
//! not verify; stsd never connects to a state store it has not verified, so `require`,
//! `verify-ca` and `verify-full` all mean verified TLS here.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;
use tokio_postgres_rustls::MakeRustlsConnect;

/// The URL as the client parses it (libpq's `verify-ca`/`verify-full`, which it does not
/// know, become `require`: verified either way here), and the connector: None when the URL
/// says `sslmode=disable`.
pub(super) fn of(
    url: &str,
    ca_file: Option<&Path>,
) -> Result<(String, Option<MakeRustlsConnect>), String> {
    let url = url
        .replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require");
    // libpq's default, `prefer`, falls back to plain text when the server (or a man in the
    // middle) says it has no TLS: with a CA to verify against, TLS is required.
    let url = if ca_file.is_some() && !url.contains("sslmode=") {
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}sslmode=require")
    } else {
        url
    };
    let cfg: postgres::Config = url.parse().map_err(|e| format!("[store] url: {e}"))?;
    if cfg.get_ssl_mode() == postgres::config::SslMode::Prefer && ca_file.is_some() {
        return Err(
            "[store] ca_file is set and the url says sslmode=prefer, which falls back \
                    to plain text: use sslmode=require (or verify-full)"
                .into(),
        );
    }
    if cfg.get_ssl_mode() == postgres::config::SslMode::Disable {
        if ca_file.is_some() {
            return Err("[store] ca_file is set but the url says sslmode=disable".into());
        }
        return Ok((url, None));
    }
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let at = |e: &dyn std::fmt::Display| format!("[store] ca_file {}: {e}", path.display());
            let pem = std::fs::read(path).map_err(|e| at(&e))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                roots.add(cert.map_err(|e| at(&e))?).map_err(|e| at(&e))?;
            }
            if roots.is_empty() {
                return Err(at(&"no PEM certificate in it"));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok((url, Some(MakeRustlsConnect::new(config))))
}
