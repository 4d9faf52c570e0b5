//! `https://` backends: TLS by rustls (ring), trusting the host's certificate store
//! (`/etc/ssl/certs` through rustls-native-certs) plus, per backend, the CAs of an optional
//! `ca_file` (a private CA, a self-signed on-prem server). The server's name is checked against
//! its certificate; nothing can turn the check off.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// A client configuration trusting the host's store and the certificates in `ca_file`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for c in native.certs {
        let _ = roots.add(c);
    }
    if let Some(f) = ca_file {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(f)
            .map_err(|e| format!("ca_file {}: {e}", f.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("ca_file {}: {e}", f.display()))?;
        if certs.is_empty() {
            return Err(format!("ca_file {}: no PEM certificate in it", f.display()));
        }
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("ca_file {}: {e}", f.display()))?;
        }
    }
    if roots.is_empty() {
        return Err(
            "no trusted certificates: the host's store is empty (apt-get install ca-certificates) \
             and no ca_file is given"
                .into(),
        );
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// The name the server's certificate must carry, from the URL's host.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
    )
    .map_err(|e| format!("host {host}: not a name or address for TLS: {e}"))
}

/// TLS over `tcp` to `name` with `cfg`.
pub async fn connect(
    cfg: &Arc<rustls::ClientConfig>,
    name: &ServerName<'static>,
    tcp: tokio::net::TcpStream,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name.clone(), tcp)
        .await
}
