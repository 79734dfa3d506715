//! TLS for the listeners: rustls, with the certificate chain and key read from PEM files and
//! read again on demand (SIGHUP), so a renewed certificate takes effect for new connections
//! while open ones keep the one they began with.
//!
//! With client CAs configured, clients may (or must) present a certificate those CAs signed:
//! the handshake verifies it, and its subject's common name is the user the connection logs
//! in as where it sends no other credentials (mTLS).

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

/// Where the certificate chain and its private key are (PEM), and the CAs that sign client
/// certificates, if clients present them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA certificates (PEM) that client certificates are verified against; `None`: clients
    /// are not asked for one.
    pub client_ca: Option<PathBuf>,
    /// Refuse the handshake of a client without a certificate (else it may log in otherwise).
    pub client_cert_required: bool,
}

/// The user name a verified client certificate gives: its subject's common name.
pub type CertificateUser = Option<std::sync::Arc<str>>;

/// In an HTTPS request's extensions: the common name of the client certificate its connection
/// presented and the handshake verified.
#[derive(Clone, Debug)]
pub struct VerifiedClient(pub std::sync::Arc<str>);

/// Why a certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading the certificate chain {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("reading the private key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("reading the client CAs {path}: {reason}")]
    ClientCa { path: PathBuf, reason: String },
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

/// How client certificates are verified: against the CAs of `files`, or not asked for.
fn client_verifier(files: &TlsFiles) -> Result<Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>, TlsError> {
    let Some(path) = &files.client_ca else {
        return Ok(None);
    };
    let error = |reason: String| TlsError::ClientCa { path: path.clone(), reason };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in CertificateDer::pem_file_iter(path).map_err(|failure| error(failure.to_string()))? {
        roots
            .add(certificate.map_err(|failure| error(failure.to_string()))?)
            .map_err(|failure| error(failure.to_string()))?;
    }
    if roots.is_empty() {
        return Err(error("no CERTIFICATE in it".into()));
    }
    let builder = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
    let builder = if files.client_cert_required { builder } else { builder.allow_unauthenticated() };
    builder.build().map(Some).map_err(|failure| error(failure.to_string()))
}

/// The acceptors of one reading of the files: replaced whole when they are read again.
struct Acceptors {
    plain: tokio_rustls::TlsAcceptor,
    /// The same certificate, offering HTTP/2 and HTTP/1.1 by ALPN.
    http: tokio_rustls::TlsAcceptor,
}

fn acceptors(files: &TlsFiles, resolver: Arc<Resolver>) -> Result<Acceptors, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Config(error.to_string()))?;
    let config = match client_verifier(files)? {
        None => builder.with_no_client_auth(),
        Some(verifier) => builder.with_client_cert_verifier(verifier),
    }
    .with_cert_resolver(resolver);
    let mut http_config = config.clone();
    http_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Acceptors {
        plain: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        http: tokio_rustls::TlsAcceptor::from(Arc::new(http_config)),
    })
}

/// A TLS acceptor whose certificate (and client CAs) can be read again.
#[derive(Clone)]
pub struct Tls {
    files: TlsFiles,
    resolver: Arc<Resolver>,
    acceptors: Arc<RwLock<Arc<Acceptors>>>,
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
        let acceptors = acceptors(&files, resolver.clone())?;
        Ok(Tls { files, resolver, acceptors: Arc::new(RwLock::new(Arc::new(acceptors))) })
    }

    /// Reads the files again and puts the new certificate and client CAs in force for new
    /// connections; on an error the ones in force stay, and the error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        let certified = load(&self.files)?;
        // The client CAs are checked before anything changes.
        let fresh = acceptors(&self.files, self.resolver.clone())?;
        *self.resolver.current.write().expect("certificate lock") = Arc::new(certified);
        *self.acceptors.write().expect("acceptors lock") = Arc::new(fresh);
        Ok(())
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    fn current(&self) -> Arc<Acceptors> {
        self.acceptors.read().expect("acceptors lock").clone()
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.current().plain.clone()
    }

    /// The acceptor for HTTPS: ALPN offers `h2` and `http/1.1`.
    pub fn http_acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.current().http.clone()
    }
}

/// The TLS handshake of one connection on `stream`, within `timeout`: the TLS stream and the
/// user its verified client certificate names, or `None` when it failed or took too long
/// (counted in `tls_handshake_failures_total` for `protocol`; the connection then closes).
pub async fn accept<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: S,
    timeout: Duration,
    protocol: &'static str,
    peer: std::net::SocketAddr,
) -> Option<(tokio_rustls::server::TlsStream<S>, CertificateUser)> {
    let failure = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let user = certificate_user(&stream, protocol, peer);
            return Some((stream, user));
        }
        Ok(Err(error)) => error.to_string(),
        Err(_) => "it timed out".to_string(),
    };
    metrics::counter!("tls_handshake_failures_total", "protocol" => protocol).increment(1);
    tracing::debug!(%peer, protocol, failure, "TLS handshake failed");
    None
}

/// The common name of the client certificate the handshake verified, if one was presented.
/// rustls hands back peer certificates only once its verifier has accepted them.
fn certificate_user<S>(
    stream: &tokio_rustls::server::TlsStream<S>,
    protocol: &'static str,
    peer: std::net::SocketAddr,
) -> CertificateUser {
    let leaf = stream.get_ref().1.peer_certificates()?.first()?;
    match onehop_engine::access::der::certificate_common_name(leaf) {
        Ok(Some(name)) if !name.is_empty() => Some(Arc::from(name)),
        Ok(_) => {
            tracing::info!(%peer, protocol, "a client certificate without a common name identifies no user");
            None
        }
        Err(reason) => {
            tracing::info!(%peer, protocol, reason, "a client certificate whose subject could not be read");
            None
        }
    }
}
