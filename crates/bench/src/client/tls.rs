//! TLS for the measured clients: rustls with ring's primitives, as the server uses, trusting
//! the one CA that signed a started server's certificate. Handshakes happen when a connection
//! opens, before it carries anything measured. Records are decrypted from the bytes as the
//! harness reads them off the socket itself, so the kernel's arrival stamps (`rxstamp`) still
//! tell when they came.

use std::io::{self, Read};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};

/// A TLS client configuration: whom it trusts and the name it expects in the certificate.
#[derive(Clone, Debug)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

impl TlsClient {
    /// A client that trusts the certificates in the PEM file `ca` and expects the server's
    /// certificate to name `server_name` (a DNS name or an IP address).
    pub fn trusting(ca: &Path, server_name: &str) -> anyhow::Result<TlsClient> {
        let mut roots = RootCertStore::empty();
        let certificates = CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("reading the CA certificate {}", ca.display()))?;
        for certificate in certificates {
            roots.add(certificate.with_context(|| format!("parsing {}", ca.display()))?)?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_string())?;
        Ok(TlsClient { config: Arc::new(config), server_name })
    }

    /// Runs the handshake over a blocking socket and returns the session, ready for data.
    pub fn handshake(&self, socket: &mut TcpStream) -> io::Result<ClientConnection> {
        let mut session =
            ClientConnection::new(self.config.clone(), self.server_name.clone()).map_err(io::Error::other)?;
        while session.is_handshaking() {
            session.complete_io(socket)?;
        }
        Ok(session)
    }

    /// Runs the handshake over a tokio socket.
    pub async fn connect(
        &self,
        socket: tokio::net::TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        tokio_rustls::TlsConnector::from(self.config.clone()).connect(self.server_name.clone(), socket).await
    }
}

/// The protocol version and cipher suite a session agreed on, as rustls names them
/// (`TLSv1_3 TLS13_AES_256_GCM_SHA384`).
pub fn describe(session: &ClientConnection) -> String {
    let version = session.protocol_version().map_or("none".to_string(), |version| format!("{version:?}"));
    let suite = session.negotiated_cipher_suite().map_or("none".to_string(), |suite| format!("{:?}", suite.suite()));
    format!("{version} {suite}")
}

/// Feeds `cipher`, bytes read from the socket, to `session`, appending the plaintext they
/// complete to `plain`. Plaintext is taken out after every record batch, so rustls's own
/// buffer never fills. Returns whether the server has closed the session (close_notify).
pub fn decrypt(session: &mut ClientConnection, mut cipher: &[u8], plain: &mut Vec<u8>) -> io::Result<bool> {
    while !cipher.is_empty() {
        if session.read_tls(&mut cipher)? == 0 {
            // After close_notify nothing more is read.
            return Ok(true);
        }
        let state = session.process_new_packets().map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        let available = state.plaintext_bytes_to_read();
        if available > 0 {
            let start = plain.len();
            plain.resize(start + available, 0);
            session.reader().read_exact(&mut plain[start..])?;
        }
        if state.peer_has_closed() {
            return Ok(true);
        }
    }
    Ok(false)
}
