//! TLS with rustls: the proxy's certificate for clients (reloaded from disk without
//! dropping a connection), and the settings that reach TLS nodes.
//!
//! Client side: `ServerTls` holds the current `rustls::ServerConfig` behind an `ArcSwap`.
//! Each new connection takes the config in force when it arrives; a reload swaps in a new
//! one, so connections already open keep theirs and none is dropped. A certificate or key
//! that does not load leaves the old config serving. With `client_ca`, every client must
//! present a certificate that CA signed (mTLS).
//!
//! Node side: `Connector` is one `rustls::ClientConfig` per set of settings: the CA to
//! trust (the system bundle when none is given), an optional client certificate, the name
//! to send as SNI and check the node's certificate against (the node's host by default),
//! and `verify_hostname: false` for nodes addressed by an IP their certificate does not
//! name (common in Redis Cluster, whose map gives IPs): the chain is still checked.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use super::Stream;

/// Where the system's CA bundle is on Debian and its derivatives (and Alpine, Fedora's
/// compat link): trusted by a node connection that names no CA of its own.
const SYSTEM_CA: &str = "/etc/ssl/certs/ca-certificates.crt";

/// `tls:` in the config file: TLS for clients.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// PEM certificate chain, the proxy's own certificate first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM CA certificates: when set, clients must present a certificate they signed.
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
    /// A TLS port beside `listen`, which then stays plain. Unset: `listen` speaks TLS only.
    #[serde(default)]
    pub listen: Option<String>,
    /// How long a client has to finish its TLS handshake. Default 10000.
    #[serde(default = "default_handshake_ms")]
    pub handshake_timeout_ms: u64,
}

fn default_handshake_ms() -> u64 {
    10_000
}

fn default_true() -> bool {
    true
}

/// `backend.tls`: how to reach nodes that speak TLS.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClientTlsConfig {
    /// PEM CA certificates to trust. Default: the system's bundle.
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// PEM client certificate chain and key, for nodes that require one (`tls-auth-clients`).
    #[serde(default)]
    pub cert: Option<PathBuf>,
    #[serde(default)]
    pub key: Option<PathBuf>,
    /// Name sent as SNI and checked against the node's certificate. Default: the node's host.
    #[serde(default)]
    pub sni: Option<String>,
    /// false: accept a certificate that does not name the node (its chain is still checked).
    #[serde(default = "default_true")]
    pub verify_hostname: bool,
}

/// Why TLS settings did not load. Display names the file.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("{0}")]
    Config(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_err(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let all = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(path, e))?;
    if all.is_empty() {
        return Err(file_err(path, "no PEM certificate in the file"));
    }
    Ok(all)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, e))
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let (_, bad) = roots.add_parsable_certificates(certs(path)?);
    if roots.is_empty() {
        return Err(file_err(
            path,
            format!("no usable CA certificate ({bad} unreadable)"),
        ));
    }
    Ok(roots)
}

fn server_config(cfg: &ServerTlsConfig) -> Result<ServerConfig, TlsError> {
    let chain = certs(&cfg.cert)?;
    let key = key(&cfg.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|e| file_err(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| file_err(&cfg.key, format!("does not go with the certificate: {e}")))?;
    config.alpn_protocols.clear();
    Ok(config)
}

/// The client-facing TLS settings in force, and what they were loaded from.
pub struct ServerTls {
    cfg: ServerTlsConfig,
    current: ArcSwap<ServerConfig>,
    /// Modification times of cert, key and client CA at the last load attempt.
    stamps: Mutex<Vec<Option<SystemTime>>>,
}

impl ServerTls {
    /// Loads the certificate and key (and client CA); an error names the file.
    pub fn load(cfg: &ServerTlsConfig) -> Result<Arc<ServerTls>, TlsError> {
        let config = server_config(cfg)?;
        Ok(Arc::new(ServerTls {
            stamps: Mutex::new(stamps(cfg)),
            cfg: cfg.clone(),
            current: ArcSwap::from_pointee(config),
        }))
    }

    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.handshake_timeout_ms)
    }

    /// The TLS handshake with a client just accepted, within the handshake timeout.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<Stream> {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.current.load_full());
        match tokio::time::timeout(self.handshake_timeout(), acceptor.accept(tcp)).await {
            Ok(Ok(s)) => Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Server(s)))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "TLS handshake timed out",
            )),
        }
    }

    /// True when a file changed on disk since the last load attempt.
    pub fn changed_on_disk(&self) -> bool {
        *self.stamps.lock().expect("not poisoned") != stamps(&self.cfg)
    }

    /// Reads the files again and, when they load, serves new connections with them.
    /// On error the old certificate stays in force.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.stamps.lock().expect("not poisoned") = stamps(&self.cfg);
        let config = server_config(&self.cfg)?;
        self.current.store(Arc::new(config));
        Ok(())
    }

    /// Reloads on SIGHUP and when a file changes (checked every second), counting each
    /// attempt in `ok` or `failed`; `last_failed` is 1 while the old certificate serves. Runs until the process ends.
    pub fn spawn_reloader(
        self: &Arc<Self>,
        ok: prometheus_client::metrics::counter::Counter,
        failed: prometheus_client::metrics::counter::Counter,
        last_failed: prometheus_client::metrics::gauge::Gauge,
    ) {
        let tls = self.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let mut hup = signal(SignalKind::hangup()).ok();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                let why = tokio::select! {
                    _ = tick.tick() => {
                        if !tls.changed_on_disk() {
                            continue;
                        }
                        "a certificate file changed"
                    }
                    Some(_) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => "SIGHUP",
                };
                match tls.reload() {
                    Ok(()) => {
                        ok.inc();
                        last_failed.set(0);
                        tracing::info!(reason = why, cert = %tls.cfg.cert.display(), "TLS certificate reloaded");
                    }
                    Err(e) => {
                        failed.inc();
                        last_failed.set(1);
                        tracing::warn!(reason = why, error = %e, "TLS certificate not reloaded; the previous one stays in force");
                    }
                }
            }
        });
    }
}

fn stamps(cfg: &ServerTlsConfig) -> Vec<Option<SystemTime>> {
    [Some(&cfg.cert), Some(&cfg.key), cfg.client_ca.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}

/// What opens TLS to nodes with one set of settings.
#[derive(Debug)]
pub struct Connector {
    config: Arc<ClientConfig>,
    sni: Option<ServerName<'static>>,
}

impl Connector {
    pub fn new(cfg: &ClientTlsConfig) -> Result<Connector, TlsError> {
        let ca = cfg.ca.clone().unwrap_or_else(|| PathBuf::from(SYSTEM_CA));
        let roots = Arc::new(roots(&ca)?);
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = if cfg.verify_hostname {
            builder.with_root_certificates(roots)
        } else {
            let inner =
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
                    .build()
                    .map_err(|e| file_err(&ca, e))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
        };
        let config = match (&cfg.cert, &cfg.key) {
            (Some(c), Some(k)) => builder
                .with_client_auth_cert(certs(c)?, key(k)?)
                .map_err(|e| file_err(k, format!("does not go with the certificate: {e}")))?,
            (None, None) => builder.with_no_client_auth(),
            _ => {
                return Err(TlsError::Config(
                    "a client certificate needs both cert and key".into(),
                ))
            }
        };
        let sni = match &cfg.sni {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| TlsError::Config(format!("sni {name:?} is not a host name")))?,
            ),
            None => None,
        };
        Ok(Connector {
            config: Arc::new(config),
            sni,
        })
    }

    /// The TLS handshake with the node at `addr` (`host:port`) over `tcp`.
    pub async fn connect(&self, addr: &str, tcp: TcpStream) -> io::Result<Stream> {
        let name = match &self.sni {
            Some(n) => n.clone(),
            None => {
                let host = addr
                    .rsplit_once(':')
                    .map(|(h, _)| h)
                    .unwrap_or(addr)
                    .trim_start_matches('[')
                    .trim_end_matches(']');
                ServerName::try_from(host.to_string()).map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{host:?} is not a host name or IP for TLS"),
                    )
                })?
            }
        };
        let c = tokio_rustls::TlsConnector::from(self.config.clone());
        let s = c.connect(name, tcp).await?;
        Ok(Stream::Tls(Box::new(tokio_rustls::TlsStream::Client(s))))
    }
}

/// `verify_hostname: false`: the node's chain must lead to a trusted CA, but the
/// certificate need not name the address it was reached at.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, Error};
        // webpki checks the chain before the name, so a name error means the chain passed.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
