//! The two listeners. The replica listener runs at most handshakes_max (256) handshakes at once, each
//! bounded by handshake_grace from accept (TLS included); the client listener admits only
//! Request frames (docs/protocol.md, "Framing").

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use futures_rustls::TlsAcceptor;
use glommio::net::{TcpListener, TcpStream};

use super::auth::ChannelBinding;
use super::conn::{
    write_all_vectored, FrameReader, SharedStream, Stream, Tcp, TlsTcp, CLIENT_STAGE_SIZE,
    HANDSHAKE_STAGE_SIZE, STAGE_SIZE,
};
use super::handshake::{Acceptor, AcceptorStep};
use super::link::{run_client_link, run_replica_link};
use super::stats::reasons;
use super::{tls, Inner};

/// Pause after a failed accept (e.g. out of file descriptors) so the loop cannot spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);

/// Releases a handshake slot however the handshake ends.
struct InFlight(Rc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let count = self.0.handshakes_in_flight.get();
        self.0.handshakes_in_flight.set(count.saturating_sub(1));
    }
}

pub(crate) async fn replica_accept_loop(inner: Rc<Inner>, listener: TcpListener) {
    while !inner.closed.get() {
        let tcp = match listener.accept().await {
            Ok(tcp) => tcp,
            Err(_) => {
                inner.stats.link_failure(reasons::ACCEPT_FAILED);
                glommio::timer::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let in_flight = inner.handshakes_in_flight.get();
        if in_flight >= inner.config.handshakes_max {
            inner.refuse(reasons::HANDSHAKE_LIMIT, tcp.peer_addr().ok(), None);
            drop(tcp);
            continue;
        }
        inner.handshakes_in_flight.set(in_flight + 1);
        let guard = InFlight(inner.clone());
        let inner = inner.clone();
        let remote = tcp.peer_addr().ok();
        glommio::spawn_local(async move {
            let grace = inner.config.handshake_grace;
            let result =
                glommio::timer::timeout(grace, async { Ok(accept_handshake(&inner, tcp).await) })
                    .await;
            drop(guard);
            match result {
                Ok(Ok((peer, stream, reader))) => {
                    tracing::info!(peer, ?remote, "replica link accepted");
                    run_replica_link(inner, peer, stream, reader).await;
                }
                Ok(Err(reason)) => inner.refuse(reason, remote, None),
                Err(_) => inner.refuse(reasons::HANDSHAKE_TIMEOUT, remote, None),
            }
        })
        .detach();
    }
}

/// TLS (when enabled), then the acceptor state machine. Err carries the counter label.
async fn accept_handshake(
    inner: &Rc<Inner>,
    tcp: TcpStream,
) -> Result<(u8, SharedStream, FrameReader), &'static str> {
    let _ = tcp.set_nodelay(true);
    let context = inner.tls.borrow().clone();
    let (stream, binding) = match context {
        None => (Stream::Plain(Tcp(tcp)), ChannelBinding::Plaintext),
        Some(context) => {
            let tls = TlsAcceptor::from(context.server)
                .accept(TlsTcp::new(tcp))
                .await
                .map_err(|_| reasons::TLS_HANDSHAKE)?;
            let connection = tls.get_ref().1;
            if !tls::alpn_ok(connection) {
                return Err(reasons::TLS_ALPN);
            }
            let exporter = tls::exporter(connection).ok_or(reasons::TLS_EXPORTER)?;
            (
                Stream::TlsServer(Box::new(tls)),
                ChannelBinding::Tls(exporter),
            )
        }
    };
    let stream: SharedStream = Rc::new(RefCell::new(stream));
    let mut acceptor = Acceptor::new(inner.local, inner.keys.clone(), binding);
    let mut reader = FrameReader::new(HANDSHAKE_STAGE_SIZE);
    let mut buf = inner.pool.get();
    let result = loop {
        // Handshake frames are exactly one header: never trust a larger size here.
        if let Err(error) = reader.read_header(&stream, &mut buf).await {
            break Err(error.reason().unwrap_or(reasons::HANDSHAKE_IO));
        }
        match acceptor.on_frame(buf.as_bytes()) {
            Ok(AcceptorStep::Challenge(frame)) => {
                if write_all_vectored(&stream, &[frame.as_bytes()])
                    .await
                    .is_err()
                {
                    break Err(reasons::HANDSHAKE_IO);
                }
            }
            Ok(AcceptorStep::Established { peer }) => break Ok(peer),
            Err(refusal) => {
                if let Some(reply) = refusal.reply {
                    let _ = write_all_vectored(&stream, &[reply.as_bytes()]).await;
                }
                stream.borrow().shutdown();
                break Err(refusal.error.reason());
            }
        }
    };
    inner.pool.put(buf);
    reader.grow_stage(STAGE_SIZE);
    result.map(|peer| (peer, stream, reader))
}

/// Releases a client slot when the connection ends.
struct ClientSlot(Rc<std::cell::Cell<usize>>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

pub(crate) async fn client_accept_loop(inner: Rc<Inner>, listener: TcpListener) {
    let open = Rc::new(std::cell::Cell::new(0usize));
    while !inner.closed.get() {
        let tcp = match listener.accept().await {
            Ok(tcp) => tcp,
            Err(_) => {
                inner.stats.link_failure(reasons::ACCEPT_FAILED);
                glommio::timer::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        if open.get() >= inner.config.client_connections_max {
            inner.stats.reject(reasons::CLIENT_LIMIT);
            drop(tcp);
            continue;
        }
        let tls = inner.client_tls.borrow().clone();
        let handshake = match tls {
            None => None,
            Some(config) => {
                let in_flight = inner.client_handshakes.get();
                if in_flight >= inner.config.handshakes_max {
                    refuse_client(&inner, reasons::CLIENT_TLS_LIMIT, tcp.peer_addr().ok());
                    drop(tcp);
                    continue;
                }
                inner.client_handshakes.set(in_flight + 1);
                Some((config, ClientHandshake(inner.clone())))
            }
        };
        open.set(open.get() + 1);
        let slot = ClientSlot(open.clone());
        let inner = inner.clone();
        glommio::spawn_local(async move {
            let _ = tcp.set_nodelay(true);
            let remote = tcp.peer_addr().ok();
            let stream = match handshake {
                None => Stream::Plain(Tcp(tcp)),
                Some((config, in_flight)) => {
                    let result = accept_client_tls(&inner, config, tcp).await;
                    drop(in_flight);
                    match result {
                        Ok(stream) => stream,
                        Err(reason) => {
                            refuse_client(&inner, reason, remote);
                            return;
                        }
                    }
                }
            };
            let stream: SharedStream = Rc::new(RefCell::new(stream));
            run_client_link(inner, stream, remote, FrameReader::new(CLIENT_STAGE_SIZE)).await;
            drop(slot);
        })
        .detach();
    }
}

/// Releases a client TLS handshake slot however the handshake ends.
struct ClientHandshake(Rc<Inner>);

impl Drop for ClientHandshake {
    fn drop(&mut self) {
        let count = self.0.client_handshakes.get();
        self.0.client_handshakes.set(count.saturating_sub(1));
    }
}

/// The first bytes of every TLS connection: a handshake record (content type 22) of
/// record-layer major version 3 (the ClientHello).
const TLS_RECORD_START: [u8; 2] = [0x16, 0x03];
/// Pause between peeks while a connection's first bytes trickle in.
const PEEK_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

/// The client side of TLS on the client port, within handshake_grace. A connection that
/// opens with anything but a TLS handshake record is a plaintext client: refused before
/// any of its bytes is read as a frame. Err carries the counter label.
async fn accept_client_tls(
    inner: &Rc<Inner>,
    config: std::sync::Arc<rustls::ServerConfig>,
    tcp: TcpStream,
) -> Result<Stream, &'static str> {
    let handshake = async {
        let mut first = [0u8; TLS_RECORD_START.len()];
        loop {
            match tcp.peek(&mut first).await {
                Ok(n) if n == first.len() => break,
                Ok(n) if n > 0 && first[..n] == TLS_RECORD_START[..n] => {
                    glommio::timer::sleep(PEEK_PAUSE).await;
                }
                Ok(0) | Err(_) => return Ok(Err(reasons::CLIENT_TLS_HANDSHAKE)),
                Ok(_) => return Ok(Err(reasons::CLIENT_PLAINTEXT)),
            }
        }
        if first != TLS_RECORD_START {
            return Ok(Err(reasons::CLIENT_PLAINTEXT));
        }
        let result = TlsAcceptor::from(config)
            .accept(TlsTcp::new(tcp))
            .await
            .map(|tls| Stream::TlsServer(Box::new(tls)))
            .map_err(|_| reasons::CLIENT_TLS_HANDSHAKE);
        Ok(result)
    };
    match glommio::timer::timeout(inner.config.handshake_grace, handshake).await {
        Ok(result) => result,
        Err(_) => Err(reasons::CLIENT_TLS_TIMEOUT),
    }
}

/// Counts a refused client connection; a plaintext client or a failed handshake is logged
/// (rate-limited), since it usually means a client configured without TLS or without
/// the CA.
fn refuse_client(inner: &Inner, reason: &'static str, remote: Option<std::net::SocketAddr>) {
    inner.stats.reject(reason);
    if inner.log_limiter.allow() {
        if reason == reasons::CLIENT_PLAINTEXT {
            tracing::warn!(
                reason,
                ?remote,
                "client port refused a plaintext connection: tcp.tls is enabled"
            );
        } else {
            tracing::info!(reason, ?remote, "client port refused a TLS connection");
        }
    }
}
