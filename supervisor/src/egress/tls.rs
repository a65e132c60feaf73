//! The broker's TLS client configuration: rustls with the bundled Mozilla roots
//! (webpki-roots, so a host's CA store cannot change what tools trust) plus the operator's
//! extra CA files.

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use std::path::PathBuf;
use std::sync::Arc;

pub fn client_config(extra_ca_files: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in extra_ca_files {
        let pem = std::fs::read(path)
            .map_err(|e| format!("egress.extra_ca_files: {}: {e}", path.display()))?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert =
                cert.map_err(|e| format!("egress.extra_ca_files: {}: {e}", path.display()))?;
            roots
                .add(cert)
                .map_err(|e| format!("egress.extra_ca_files: {}: {e}", path.display()))?;
            added += 1;
        }
        if added == 0 {
            return Err(format!(
                "egress.extra_ca_files: {}: no PEM certificate in it",
                path.display()
            ));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
