//! TLS for the replica plane (docs/protocol.md, "Handshake"): rustls configs from PEM
//! files, TLS 1.3 only, ALPN "iggy-replica", both sides' certificates verified against
//! ca_file, and the exporter value that binds the handshake MACs to this TLS session.
//! Also the client port's acceptor config (`tcp.tls`): TLS 1.3, no client certificates.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::{ring, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::auth::{Bytes32, EXPORTER_LABEL};
use super::config::TlsConfig;

/// The only ALPN protocol the replica plane speaks.
pub const ALPN: &[u8] = b"iggy-replica";

/// Why TLS could not be set up at start.
#[derive(Debug)]
pub enum TlsSetupError {
    /// A PEM file could not be read or holds no usable item.
    Pem {
        key: &'static str,
        path: String,
        error: String,
    },
    /// rustls refused the configuration (e.g. a key that does not match the cert);
    /// `scope` is the config section ("cluster.tls", "tcp.tls").
    Config {
        scope: &'static str,
        error: rustls::Error,
    },
    /// The CA bundle cannot build a client verifier.
    Verifier { error: String },
}

impl core::fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TlsSetupError::Pem { key, path, error } => write!(f, "{key} = {path}: {error}"),
            TlsSetupError::Config { scope, error } => match error {
                rustls::Error::InconsistentKeys(_) => {
                    write!(f, "{scope}: key_file does not match cert_file ({error})")
                }
                _ => write!(f, "{scope}: {error}"),
            },
            TlsSetupError::Verifier { error } => write!(f, "cluster.tls.ca_file: {error}"),
        }
    }
}

impl std::error::Error for TlsSetupError {}

fn pem_error(key: &'static str, path: &Path, error: impl core::fmt::Display) -> TlsSetupError {
    TlsSetupError::Pem {
        key,
        path: path.display().to_string(),
        error: error.to_string(),
    }
}

fn certificates(
    key: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|error| pem_error(key, path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| pem_error(key, path, error))?;
    if certs.is_empty() {
        return Err(pem_error(key, path, "no CERTIFICATE in the file"));
    }
    Ok(certs)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// Client and server configs of one node.
#[derive(Clone, Debug)]
pub struct TlsContext {
    pub(crate) server: Arc<ServerConfig>,
    pub(crate) client: Arc<ClientConfig>,
}

impl TlsContext {
    /// Loads cert_file, key_file and ca_file and builds TLS 1.3-only configs.
    pub fn load(config: &TlsConfig) -> Result<TlsContext, TlsSetupError> {
        let chain = certificates("cluster.tls.cert_file", &config.cert_file)?;
        let key = PrivateKeyDer::from_pem_file(&config.key_file)
            .map_err(|error| pem_error("cluster.tls.key_file", &config.key_file, error))?;
        let mut roots = RootCertStore::empty();
        for ca in certificates("cluster.tls.ca_file", &config.ca_file)? {
            roots
                .add(ca)
                .map_err(|error| pem_error("cluster.tls.ca_file", &config.ca_file, error))?;
        }
        TlsContext::new(chain, key, roots)
    }

    /// The acceptor-side rustls config.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The dialer-side rustls config.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }

    /// Builds the configs from parsed material (tests build theirs in memory).
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        roots: RootCertStore,
    ) -> Result<TlsContext, TlsSetupError> {
        let roots = Arc::new(roots);
        let config_error = |error| TlsSetupError::Config {
            scope: "cluster.tls",
            error,
        };
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider())
            .build()
            .map_err(|error| TlsSetupError::Verifier {
                error: error.to_string(),
            })?;
        let mut server = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(config_error)?;
        server.alpn_protocols = vec![ALPN.to_vec()];
        // Session resumption would skip client authentication on later connections.
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        server.send_tls13_tickets = 0;
        let mut client = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(config_error)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(config_error)?;
        client.alpn_protocols = vec![ALPN.to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(TlsContext {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// The client port's acceptor config from `tcp.tls.cert_file` and `tcp.tls.key_file`:
/// TLS 1.3 only, no client certificates (clients log in inside the session), any ALPN.
/// Fails with the key's name on an unreadable or empty file and on a key that does not
/// belong to the certificate.
pub fn client_port_config(
    cert_file: &Path,
    key_file: &Path,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let chain = certificates("tcp.tls.cert_file", cert_file)?;
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|error| pem_error("tcp.tls.key_file", key_file, error))?;
    client_port_config_from(chain, key)
}

/// As `client_port_config`, from parsed material.
pub fn client_port_config_from(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let config_error = |error| TlsSetupError::Config {
        scope: "tcp.tls",
        error,
    };
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(config_error)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(config_error)?;
    Ok(Arc::new(config))
}

/// The name a dialer verifies the acceptor's certificate against.
pub fn server_name(name: Option<&str>, ip: std::net::IpAddr) -> Option<ServerName<'static>> {
    match name {
        Some(name) => ServerName::try_from(name.to_owned()).ok(),
        None => Some(ServerName::IpAddress(ip.into())),
    }
}

/// The channel binding value: the TLS 1.3 exporter with `EXPORTER_LABEL`, no context.
pub fn exporter<D>(connection: &rustls::ConnectionCommon<D>) -> Option<Bytes32> {
    connection
        .export_keying_material([0u8; 32], EXPORTER_LABEL, None)
        .ok()
}

/// Whether the session negotiated the replica ALPN.
pub fn alpn_ok<D>(connection: &rustls::ConnectionCommon<D>) -> bool {
    connection.alpn_protocol() == Some(ALPN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn the_client_port_config_names_a_missing_file_and_a_key_of_another_certificate() {
        let dir = std::env::temp_dir().join(format!("client-port-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (cert, key) = leaf();
        let (_, other_key) = leaf();
        let cert_file = dir.join("cert.pem");
        let key_file = dir.join("key.pem");
        let other_key_file = dir.join("other.pem");
        std::fs::write(&cert_file, cert).expect("cert");
        std::fs::write(&key_file, key).expect("key");
        std::fs::write(&other_key_file, other_key).expect("other key");
        assert!(client_port_config(&cert_file, &key_file).is_ok());
        let missing = client_port_config(&dir.join("absent.pem"), &key_file)
            .expect_err("no cert file")
            .to_string();
        assert!(missing.starts_with("tcp.tls.cert_file = "), "{missing}");
        let not_a_key = client_port_config(&cert_file, &cert_file)
            .expect_err("a certificate is not a key")
            .to_string();
        assert!(not_a_key.starts_with("tcp.tls.key_file = "), "{not_a_key}");
        let mismatch = client_port_config(&cert_file, &other_key_file)
            .expect_err("another certificate's key")
            .to_string();
        assert!(
            mismatch.contains("tcp.tls: key_file does not match cert_file"),
            "{mismatch}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
