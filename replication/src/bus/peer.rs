//! Directional dialing (docs/protocol.md, "Framing"): a replica dials only peers with a
//! greater replica_id, one link per pair, and redials with backoff after a failure.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use futures_rustls::TlsConnector;
use glommio::net::TcpStream;

use super::auth::ChannelBinding;
use super::config::{NodeAddress, RECONNECT_BACKOFF_FACTOR_MAX};
use super::conn::{
    write_all_vectored, FrameReader, SharedStream, Stream, Tcp, TlsTcp, HANDSHAKE_STAGE_SIZE,
    STAGE_SIZE,
};
use super::handshake::Dialer;
use super::link::run_replica_link;
use super::stats::reasons;
use super::{tls, Inner};

pub(crate) async fn dial_loop(inner: Rc<Inner>, node: NodeAddress) {
    debug_assert!(node.replica_id > inner.local.replica);
    let mut failures: u32 = 0;
    let mut jitter = Jitter::new(inner.local.replica, node.replica_id);
    while !inner.closed.get() {
        let grace = inner.config.handshake_grace;
        let result = glommio::timer::timeout(grace, async { Ok(dial(&inner, &node).await) }).await;
        match result {
            Ok(Ok((stream, reader))) => {
                tracing::info!(peer = node.replica_id, remote = %node.addr, "replica link dialed");
                let established = std::time::Instant::now();
                run_replica_link(inner.clone(), node.replica_id, stream, reader).await;
                // A link the acceptor drops at once (e.g. it refused our MAC, or we are
                // unauthenticated against an authenticated node) backs off like a failure.
                if established.elapsed() < grace {
                    failures = failures.saturating_add(1);
                } else {
                    failures = 0;
                }
            }
            Ok(Err(reason)) if reason == reasons::DIAL_FAILED => {
                inner.stats.link_failure(reason);
                failures = failures.saturating_add(1);
            }
            Ok(Err(reason)) => {
                inner.refuse(reason, Some(node.addr), Some(node.replica_id));
                failures = failures.saturating_add(1);
            }
            Err(_) => {
                inner.refuse(
                    reasons::HANDSHAKE_TIMEOUT,
                    Some(node.addr),
                    Some(node.replica_id),
                );
                failures = failures.saturating_add(1);
            }
        }
        if inner.closed.get() {
            break;
        }
        let delay = backoff(inner.config.reconnect_period, failures, jitter.next());
        glommio::timer::sleep(delay).await;
    }
}

/// reconnect_period doubled per consecutive failure, capped, plus up to 25% jitter so
/// peers restarted together do not redial in lockstep.
pub(crate) fn backoff(period: Duration, failures: u32, jitter: u32) -> Duration {
    let factor = 1u32 << failures.min(RECONNECT_BACKOFF_FACTOR_MAX.trailing_zeros());
    let base = period.saturating_mul(factor.min(RECONNECT_BACKOFF_FACTOR_MAX));
    base + base.mul_f64(f64::from(jitter % 1000) / 4000.0)
}

/// A small xorshift for backoff jitter (not security relevant).
struct Jitter(u64);

impl Jitter {
    fn new(local: u8, peer: u8) -> Jitter {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        Jitter(u64::from(nanos) << 16 | u64::from(local) << 8 | u64::from(peer) | 1)
    }

    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 32) as u32
    }
}

/// Connects, runs TLS (when enabled) and the dialer side of the handshake.
async fn dial(
    inner: &Rc<Inner>,
    node: &NodeAddress,
) -> Result<(SharedStream, FrameReader), &'static str> {
    let tcp = TcpStream::connect(node.addr)
        .await
        .map_err(|_| reasons::DIAL_FAILED)?;
    let _ = tcp.set_nodelay(true);
    let context = inner.tls.borrow().clone();
    let (stream, binding) = match context {
        None => (Stream::Plain(Tcp(tcp)), ChannelBinding::Plaintext),
        Some(context) => {
            let name = tls::server_name(node.tls_server_name.as_deref(), node.addr.ip())
                .ok_or(reasons::TLS_HANDSHAKE)?;
            let tls = TlsConnector::from(context.client)
                .connect(name, TlsTcp::new(tcp))
                .await
                .map_err(|_| reasons::TLS_HANDSHAKE)?;
            let connection = tls.get_ref().1;
            if !tls::alpn_ok(connection) {
                return Err(reasons::TLS_ALPN);
            }
            let exporter = tls::exporter(connection).ok_or(reasons::TLS_EXPORTER)?;
            (
                Stream::TlsClient(Box::new(tls)),
                ChannelBinding::Tls(exporter),
            )
        }
    };
    let stream: SharedStream = Rc::new(RefCell::new(stream));
    let (mut dialer, hello) =
        Dialer::new(inner.local, inner.keys.clone(), binding, node.replica_id)
            .map_err(|error| error.reason())?;
    write_all_vectored(&stream, &[hello.as_bytes()])
        .await
        .map_err(|_| reasons::HANDSHAKE_IO)?;
    let mut reader = FrameReader::new(HANDSHAKE_STAGE_SIZE);
    if !dialer.is_established() {
        let mut buf = inner.pool.get();
        let read = reader.read_header(&stream, &mut buf).await;
        let step = match read {
            Ok(()) => dialer
                .on_frame(buf.as_bytes())
                .map_err(|error| error.reason()),
            Err(error) => Err(error.reason().unwrap_or(reasons::HANDSHAKE_IO)),
        };
        inner.pool.put(buf);
        let finish = match step {
            Ok(finish) => finish,
            Err(reason) => {
                stream.borrow().shutdown();
                return Err(reason);
            }
        };
        write_all_vectored(&stream, &[finish.as_bytes()])
            .await
            .map_err(|_| reasons::HANDSHAKE_IO)?;
    }
    reader.grow_stage(STAGE_SIZE);
    Ok((stream, reader))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let period = Duration::from_millis(100);
        assert_eq!(backoff(period, 0, 0), period);
        assert_eq!(backoff(period, 1, 0), period * 2);
        assert_eq!(backoff(period, 3, 0), period * 8);
        assert_eq!(backoff(period, 30, 0), period * 8);
        assert!(backoff(period, 0, 999) <= period * 5 / 4);
    }
}
