//! One blocking TCP connection to a node's client port, plain or TLS 1.3: send a Request
//! frame, read back one Reply or Eviction, validated by `replication::wire` before
//! anything reads it.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConnection, RootCertStore, StreamOwned};

use replication::wire::{
    check_header, decode, Frame, FrameBuf, Limits, Message, ReplyHeader, HEADER_SIZE,
};

use super::error::ClientError;

/// The ReplyHeader fields a client checks and acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyFields {
    pub client: u128,
    pub request: u64,
    pub operation: u8,
    pub status: u32,
}

impl ReplyFields {
    fn of(header: &ReplyHeader) -> ReplyFields {
        ReplyFields {
            client: header.client,
            request: header.request,
            operation: header.operation,
            status: header.status,
        }
    }
}

/// What came back for a request.
#[derive(Clone, Debug)]
pub enum Incoming {
    Reply { header: ReplyFields, body: Vec<u8> },
    Eviction { client: u128, reason: u8 },
}

/// Why one exchange failed, and whether the request may have reached the server.
#[derive(Debug)]
pub struct ExchangeError {
    pub error: ClientError,
    /// The whole frame was handed to the kernel: the server may have applied it.
    pub delivered: bool,
}

/// TLS to the client port: the roots a node's certificate must chain to and the name it
/// must carry (the address's IP when no name is given). TLS 1.3 only, as the nodes serve.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    domain: Option<String>,
}

impl ClientTls {
    /// Trusts the PEM CA bundle `ca_file`, or the system's roots when None.
    pub fn new(ca_file: Option<&Path>, domain: Option<String>) -> Result<ClientTls, ClientError> {
        let refused = |rule: String| ClientError::InvalidArgument {
            what: "TLS CA file",
            rule,
        };
        let mut roots = RootCertStore::empty();
        match ca_file {
            Some(path) => {
                let certs = CertificateDer::pem_file_iter(path)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .map_err(|e| refused(format!("{}: {e}", path.display())))?;
                if certs.is_empty() {
                    return Err(refused(format!(
                        "{}: no CERTIFICATE in the file",
                        path.display()
                    )));
                }
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| refused(format!("{}: {e}", path.display())))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                for cert in found.certs {
                    // A system bundle may hold certificates rustls cannot use; skip them.
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(refused(
                        "no CA file given and no usable system root certificates".into(),
                    ));
                }
            }
        }
        ClientTls::with_roots(roots, domain)
    }

    /// Trusts the certificates in `roots`.
    pub fn with_roots(
        roots: RootCertStore,
        domain: Option<String>,
    ) -> Result<ClientTls, ClientError> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| ClientError::InvalidArgument {
            what: "TLS",
            rule: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
        if let Some(name) = &domain {
            ServerName::try_from(name.clone()).map_err(|e| ClientError::InvalidArgument {
                what: "TLS domain",
                rule: format!("{name:?}: {e}"),
            })?;
        }
        Ok(ClientTls {
            config: Arc::new(config),
            domain,
        })
    }

    fn server_name(&self, addr: SocketAddr) -> ServerName<'static> {
        self.domain
            .as_ref()
            .and_then(|name| ServerName::try_from(name.clone()).ok())
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }
}

/// The transport: plain TCP, or TLS over it.
#[derive(Debug)]
enum Transport {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Transport {
    fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(tcp) => tcp,
            Transport::Tls(tls) => tls.get_ref(),
        }
    }
}

impl Read for Transport {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(tcp) => tcp.read(buf),
            Transport::Tls(tls) => tls.read(buf),
        }
    }
}

impl Write for Transport {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Transport::Plain(tcp) => tcp.write(buf),
            Transport::Tls(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Transport::Plain(tcp) => tcp.flush(),
            Transport::Tls(tls) => tls.flush(),
        }
    }
}

/// Runs the TLS handshake to its end within `timeout`, so a node that does not speak TLS
/// or is not trusted fails here, named, rather than at the first request.
fn handshake(
    mut tcp: TcpStream,
    addr: SocketAddr,
    tls: &ClientTls,
    timeout: Duration,
) -> Result<Transport, ClientError> {
    let mut conn =
        ClientConnection::new(tls.config.clone(), tls.server_name(addr)).map_err(|e| {
            ClientError::Tls {
                server: addr,
                message: e.to_string(),
            }
        })?;
    tcp.set_read_timeout(Some(timeout))
        .and_then(|_| tcp.set_write_timeout(Some(timeout)))
        .map_err(|e| ClientError::io(addr, &e))?;
    let deadline = Instant::now() + timeout;
    while conn.is_handshaking() {
        if Instant::now() >= deadline {
            return Err(ClientError::Timeout {
                server: addr,
                after: timeout,
            });
        }
        if let Err(error) = conn.complete_io(&mut tcp) {
            return Err(match error.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout {
                    server: addr,
                    after: timeout,
                },
                ErrorKind::InvalidData => ClientError::Tls {
                    server: addr,
                    message: error.to_string(),
                },
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset => ClientError::Tls {
                    server: addr,
                    message: format!("the node closed the connection during the handshake ({error}): is TLS on at its client port?"),
                },
                _ => ClientError::io(addr, &error),
            });
        }
    }
    Ok(Transport::Tls(Box::new(StreamOwned::new(conn, tcp))))
}

/// A connection and whether it has logged in.
#[derive(Debug)]
pub struct Connection {
    stream: Transport,
    addr: SocketAddr,
    pub logged_in: bool,
    buf: FrameBuf,
}

impl Connection {
    pub fn open(
        addr: SocketAddr,
        connect_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Connection, ClientError> {
        let stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(|e| {
            if e.kind() == ErrorKind::TimedOut || e.kind() == ErrorKind::WouldBlock {
                ClientError::Timeout {
                    server: addr,
                    after: connect_timeout,
                }
            } else {
                ClientError::io(addr, &e)
            }
        })?;
        // Requests are single frames written whole; Nagle would only add latency.
        stream
            .set_nodelay(true)
            .map_err(|e| ClientError::io(addr, &e))?;
        let stream = match tls {
            None => Transport::Plain(stream),
            Some(tls) => handshake(stream, addr, tls, connect_timeout)?,
        };
        Ok(Connection {
            stream,
            addr,
            logged_in: false,
            buf: FrameBuf::default(),
        })
    }

    /// Sends `frame` and waits up to `timeout` for the answer.
    pub fn exchange(
        &mut self,
        frame: &Frame,
        timeout: Duration,
        limits: &Limits,
    ) -> Result<Incoming, ExchangeError> {
        let deadline = Instant::now() + timeout;
        let addr = self.addr;
        let not_delivered = |error| ExchangeError {
            error,
            delivered: false,
        };
        self.stream
            .tcp()
            .set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
            .map_err(|e| not_delivered(ClientError::io(addr, &e)))?;
        self.stream
            .write_all(frame.as_bytes())
            .and_then(|()| self.stream.flush())
            .map_err(|e| not_delivered(timeout_or_io(addr, timeout, &e)))?;
        self.receive(deadline, timeout, limits)
            .map_err(|error| ExchangeError {
                error,
                delivered: true,
            })
    }

    fn receive(
        &mut self,
        deadline: Instant,
        timeout: Duration,
        limits: &Limits,
    ) -> Result<Incoming, ClientError> {
        let addr = self.addr;
        self.buf.resize(HEADER_SIZE);
        read_exact_by(
            &mut self.stream,
            self.buf.as_bytes_mut(),
            deadline,
            addr,
            timeout,
        )?;
        let info =
            check_header(self.buf.as_bytes(), limits).map_err(|error| ClientError::Protocol {
                server: addr,
                error,
            })?;
        self.buf.resize(info.size as usize);
        read_exact_by(
            &mut self.stream,
            &mut self.buf.as_bytes_mut()[HEADER_SIZE..],
            deadline,
            addr,
            timeout,
        )?;
        match decode(self.buf.as_bytes(), limits) {
            Ok(Message::Reply(header, body)) => Ok(Incoming::Reply {
                header: ReplyFields::of(header),
                body: body.to_vec(),
            }),
            Ok(Message::Eviction(header)) => Ok(Incoming::Eviction {
                client: header.client,
                reason: header.reason,
            }),
            Ok(other) => Err(ClientError::UnexpectedReply {
                server: addr,
                what: format!("command {} on the client plane", other.command().name()),
            }),
            Err(error) => Err(ClientError::Protocol {
                server: addr,
                error,
            }),
        }
    }
}

fn timeout_or_io(addr: SocketAddr, timeout: Duration, e: &std::io::Error) -> ClientError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout {
            server: addr,
            after: timeout,
        },
        _ => ClientError::io(addr, e),
    }
}

/// read_exact with a deadline over the whole read, not per read() call, so a server
/// trickling bytes cannot hold a call past its timeout.
fn read_exact_by(
    stream: &mut Transport,
    mut out: &mut [u8],
    deadline: Instant,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), ClientError> {
    while !out.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout {
                server: addr,
                after: timeout,
            });
        }
        stream
            .tcp()
            .set_read_timeout(Some(left))
            .map_err(|e| ClientError::io(addr, &e))?;
        match stream.read(out) {
            Ok(0) => {
                return Err(ClientError::Io {
                    server: addr,
                    kind: ErrorKind::UnexpectedEof,
                    message: "connection closed by the server".into(),
                })
            }
            Ok(n) => out = &mut out[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(timeout_or_io(addr, timeout, &e)),
        }
    }
    Ok(())
}
