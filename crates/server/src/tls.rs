//! TLS for the listeners: rustls, with the certificate chain and key read from PEM files and
//! read again on demand (SIGHUP), so a renewed certificate takes effect for new connections
//! while open ones keep the one they began with.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How long a client has to finish the TLS handshake (MQTT and Kafka; HTTPS gives it the
/// header read timeout): as long as MQTT gives a CONNECT.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the certificate chain and its private key are (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the certificate chain {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("reading the private key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("{0}")]
    Config(String),
}

/// The certificate in force, replaced whole by a reload.
#[derive(Debug)]
struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("certificate lock").clone())
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads `files` into a certified key, checking that the key fits the certificate.
fn load(files: &TlsFiles) -> Result<CertifiedKey, TlsError> {
    let cert_error = |reason: String| TlsError::Cert { path: files.cert.clone(), reason };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|error| cert_error(error.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|error| cert_error(error.to_string()))?;
    if chain.is_empty() {
        return Err(cert_error("no CERTIFICATE in it".into()));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|error| TlsError::Key { path: files.key.clone(), reason: error.to_string() })?;
    let certified = CertifiedKey::from_der(chain, key, &provider())
        .map_err(|error| TlsError::Key { path: files.key.clone(), reason: error.to_string() })?;
    Ok(certified)
}

/// A TLS acceptor whose certificate can be read again.
#[derive(Clone)]
pub struct Tls {
    files: TlsFiles,
    resolver: Arc<Resolver>,
    acceptor: tokio_rustls::TlsAcceptor,
    /// The same certificate, offering HTTP/2 and HTTP/1.1 by ALPN.
    http_acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads `files`; an error names the file and what is wrong with it.
    pub fn open(files: TlsFiles) -> Result<Tls, TlsError> {
        let certified = load(&files)?;
        let resolver = Arc::new(Resolver { current: RwLock::new(Arc::new(certified)) });
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| TlsError::Config(error.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        let mut http_config = config.clone();
        http_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let http_acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(http_config));
        Ok(Tls { files, resolver, acceptor, http_acceptor })
    }

    /// Reads the files again and puts the new certificate in force for new connections; on an
    /// error the one in force stays, and the error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        let certified = load(&self.files)?;
        *self.resolver.current.write().expect("certificate lock") = Arc::new(certified);
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// The acceptor for HTTPS: ALPN offers `h2` and `http/1.1`.
    pub fn http_acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.http_acceptor
    }
}

/// The TLS handshake of one connection on `stream`, within `timeout`: the TLS stream, or `None`
/// when it failed or took too long (counted in `tls_handshake_failures_total` for `protocol`;
/// the connection then closes).
pub async fn accept<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    acceptor: &tokio_rustls::TlsAcceptor,
    stream: S,
    timeout: Duration,
    protocol: &'static str,
    peer: std::net::SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<S>> {
    let failure = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => return Some(stream),
        Ok(Err(error)) => error.to_string(),
        Err(_) => "it timed out".to_string(),
    };
    metrics::counter!("tls_handshake_failures_total", "protocol" => protocol).increment(1);
    tracing::debug!(%peer, protocol, failure, "TLS handshake failed");
    None
}
