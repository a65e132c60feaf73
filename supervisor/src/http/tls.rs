//! TLS for the HTTP listener (rustls, with ring as elsewhere in stsd): the server's chain and
//! key from PEM files, and optionally client certificates signed by the operator's CA, whose
//! subject common name becomes the principal.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::path::Path;
use std::sync::Arc;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let list: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
    if list.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(list)
}

/// The rustls server configuration: HTTP/1.1 only (what rmcp's transport and the MCP
/// clients speak), client certificates optional when `client_ca` is given (a token still
/// authenticates a client without one).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain = certs(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{}: no usable private key: {e}", key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("TLS certificate and key do not go together: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The principal named by a verified client certificate: its subject's common name.
pub fn cert_principal(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?;
    let name = cn.as_str().ok()?.to_string();
    super::auth::valid_name(&name).then_some(name)
}
