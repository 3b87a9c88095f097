//! Bus counters for the stats endpoint: rejections by reason label, and per-peer link
//! state, queue depth, drops and bytes. Shareable across threads (`Arc<BusStats>`) so the
//! stats endpoint reads them off the replica executor's hot path.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// Counters of one peer link.
#[derive(Debug, Default)]
pub struct PeerStats {
    connected: AtomicBool,
    queue_depth: AtomicU64,
    dropped: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    batches_sent: AtomicU64,
    connects: AtomicU64,
}

/// A copy of one peer's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerSnapshot {
    pub replica: u8,
    pub connected: bool,
    pub queue_depth: u64,
    /// Frames dropped: queue overruns, sends while disconnected, frames queued on a link
    /// that died.
    pub dropped: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
    /// Vectored writes (each carries up to max_batch frames).
    pub batches_sent: u64,
    /// Handshakes completed on this link (reconnects included).
    pub connects: u64,
}

impl PeerStats {
    pub(crate) fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Relaxed);
        if connected {
            self.connects.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn set_queue_depth(&self, depth: usize) {
        self.queue_depth.store(depth as u64, Relaxed);
    }

    pub(crate) fn add_dropped(&self, frames: u64) {
        self.dropped.fetch_add(frames, Relaxed);
    }

    pub(crate) fn add_sent(&self, frames: u64, bytes: u64) {
        self.frames_sent.fetch_add(frames, Relaxed);
        self.bytes_sent.fetch_add(bytes, Relaxed);
        self.batches_sent.fetch_add(1, Relaxed);
    }

    pub(crate) fn add_received(&self, bytes: u64) {
        self.frames_received.fetch_add(1, Relaxed);
        self.bytes_received.fetch_add(bytes, Relaxed);
    }

    fn snapshot(&self, replica: u8) -> PeerSnapshot {
        PeerSnapshot {
            replica,
            connected: self.connected.load(Relaxed),
            queue_depth: self.queue_depth.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            bytes_received: self.bytes_received.load(Relaxed),
            frames_sent: self.frames_sent.load(Relaxed),
            frames_received: self.frames_received.load(Relaxed),
            batches_sent: self.batches_sent.load(Relaxed),
            connects: self.connects.load(Relaxed),
        }
    }
}

/// All counters of one bus.
#[derive(Debug)]
pub struct BusStats {
    replica: u8,
    peers: Vec<PeerStats>,
    /// Rejections are rare (never the hot path), so a map under a lock is enough.
    rejected: Mutex<BTreeMap<&'static str, u64>>,
    link_failures: Mutex<BTreeMap<&'static str, u64>>,
    client_dropped: AtomicU64,
}

/// A copy of every counter, for the stats endpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub replica: u8,
    /// Every peer but this node.
    pub peers: Vec<PeerSnapshot>,
    /// Rejected frames and connections by reason label (FrameError, GateError and
    /// HandshakeError labels, plus the bus's own: see `reasons`).
    pub rejected: BTreeMap<&'static str, u64>,
    /// Link events that reject no input: dials and accepts that failed, links replaced.
    pub link_failures: BTreeMap<&'static str, u64>,
    /// Frames to clients dropped on a full client queue.
    pub client_dropped: u64,
}

impl StatsSnapshot {
    /// The count of one rejection reason (0 if never seen).
    pub fn rejected(&self, reason: &str) -> u64 {
        self.rejected.get(reason).copied().unwrap_or(0)
    }

    /// One peer's counters.
    pub fn peer(&self, replica: u8) -> Option<&PeerSnapshot> {
        self.peers.iter().find(|peer| peer.replica == replica)
    }
}

impl BusStats {
    pub(crate) fn new(replica: u8, replica_count: u8) -> BusStats {
        BusStats {
            replica,
            peers: (0..replica_count).map(|_| PeerStats::default()).collect(),
            rejected: Mutex::new(BTreeMap::new()),
            link_failures: Mutex::new(BTreeMap::new()),
            client_dropped: AtomicU64::new(0),
        }
    }

    /// Counts one rejected frame or connection under `reason`.
    pub fn reject(&self, reason: &'static str) {
        count(&self.rejected, reason);
    }

    /// Counts one failure of our own (a dial or an accept) under `reason`.
    pub fn link_failure(&self, reason: &'static str) {
        count(&self.link_failures, reason);
    }

    pub(crate) fn peer(&self, replica: u8) -> Option<&PeerStats> {
        self.peers.get(usize::from(replica))
    }

    pub(crate) fn add_client_dropped(&self) {
        self.client_dropped.fetch_add(1, Relaxed);
    }

    /// A consistent-enough copy of every counter (each counter is read atomically).
    pub fn snapshot(&self) -> StatsSnapshot {
        let copy = |map: &Mutex<BTreeMap<&'static str, u64>>| {
            map.lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .clone()
        };
        StatsSnapshot {
            replica: self.replica,
            peers: self
                .peers
                .iter()
                .enumerate()
                .filter(|(replica, _)| *replica != usize::from(self.replica))
                .map(|(replica, stats)| stats.snapshot(replica as u8))
                .collect(),
            rejected: copy(&self.rejected),
            link_failures: copy(&self.link_failures),
            client_dropped: self.client_dropped.load(Relaxed),
        }
    }
}

fn count(map: &Mutex<BTreeMap<&'static str, u64>>, reason: &'static str) {
    // A poisoned lock only means another thread panicked mid-increment; keep counting.
    let mut map = map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    *map.entry(reason).or_insert(0) += 1;
}

/// The bus's own rejection labels (frame, gate and handshake labels come from their
/// error types' `reason()`).
pub mod reasons {
    /// A replica-listener connection arrived while 256 handshakes were in flight.
    pub const HANDSHAKE_LIMIT: &str = "handshake_limit";
    /// A handshake (TLS included) did not finish within handshake_grace.
    pub const HANDSHAKE_TIMEOUT: &str = "handshake_timeout";
    /// The connection closed or failed during the handshake.
    pub const HANDSHAKE_IO: &str = "handshake_io";
    /// The TLS handshake failed (untrusted certificate, wrong version, ...).
    pub const TLS_HANDSHAKE: &str = "tls_handshake_failed";
    /// TLS completed without ALPN "iggy-replica".
    pub const TLS_ALPN: &str = "tls_alpn_mismatch";
    /// The TLS exporter could not be derived.
    pub const TLS_EXPORTER: &str = "tls_exporter_failed";
    /// A client-listener connection arrived while the client connection limit was reached.
    pub const CLIENT_LIMIT: &str = "client_connection_limit";
    /// With client TLS on, a client connection opened with something other than a TLS
    /// handshake record (a plaintext client): closed unserved.
    pub const CLIENT_PLAINTEXT: &str = "client_plaintext";
    /// With client TLS on, a client's TLS handshake failed (the client did not trust the
    /// certificate, offered no TLS 1.3, closed early, ...).
    pub const CLIENT_TLS_HANDSHAKE: &str = "client_tls_handshake_failed";
    /// With client TLS on, a client's TLS handshake did not finish within handshake_grace.
    pub const CLIENT_TLS_TIMEOUT: &str = "client_tls_handshake_timeout";
    /// With client TLS on, a client connection arrived while handshakes_max client TLS
    /// handshakes were in flight.
    pub const CLIENT_TLS_LIMIT: &str = "client_tls_handshake_limit";
    /// A client frame arrived while limits.frame_memory_max bytes of client frames were
    /// held: it was skipped unread and refused.
    pub const FRAME_MEMORY_LIMIT: &str = "frame_memory_limit";
    /// A client frame's body did not arrive within BusConfig::client_body_timeout: the
    /// connection was closed.
    pub const CLIENT_BODY_TIMEOUT: &str = "client_body_timeout";
    /// A frame to a peer found its queue holding peer_queue_capacity frames: dropped.
    pub const PEER_QUEUE_FULL: &str = "peer_queue_full";
    /// A dial to a peer failed (refused, unreachable); a link failure, not a rejection.
    pub const DIAL_FAILED: &str = "dial_failed";
    /// accept() failed (e.g. out of file descriptors); a link failure, not a rejection.
    pub const ACCEPT_FAILED: &str = "accept_failed";
    /// An established connection was replaced by a newer one from the same peer (a link
    /// event, counted with the link failures).
    pub const REPLACED: &str = "connection_replaced";
}

/// Rate limit for refusal logs: a flood from an untrusted host is counted in full but
/// logged at most `LOG_BURST` times per `LOG_WINDOW`, then summarised.
pub(crate) const LOG_BURST: u32 = 20;
pub(crate) const LOG_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug)]
pub(crate) struct LogLimiter {
    window_start: std::cell::Cell<std::time::Instant>,
    logged: std::cell::Cell<u32>,
    suppressed: std::cell::Cell<u64>,
}

impl LogLimiter {
    pub(crate) fn new() -> LogLimiter {
        LogLimiter {
            window_start: std::cell::Cell::new(std::time::Instant::now()),
            logged: std::cell::Cell::new(0),
            suppressed: std::cell::Cell::new(0),
        }
    }

    /// Whether to log now; reports how many were suppressed in the previous window.
    pub(crate) fn allow(&self) -> bool {
        let now = std::time::Instant::now();
        if now.duration_since(self.window_start.get()) >= LOG_WINDOW {
            let suppressed = self.suppressed.replace(0);
            if suppressed > 0 {
                tracing::warn!(
                    suppressed,
                    "replica bus: refusal logs suppressed (all counted)"
                );
            }
            self.window_start.set(now);
            self.logged.set(0);
        }
        if self.logged.get() < LOG_BURST {
            self.logged.set(self.logged.get() + 1);
            true
        } else {
            self.suppressed.set(self.suppressed.get() + 1);
            false
        }
    }
}

/// Refusals that name a plausible but wrong peer (another cluster, a forbidden direction,
/// a missing or wrong MAC, an untrusted certificate): worth an operator's attention.
pub(crate) fn is_notable(reason: &str) -> bool {
    matches!(
        reason,
        "handshake_cluster_mismatch"
            | "handshake_directional_rule"
            | "handshake_auth_required"
            | "handshake_mac_mismatch"
            | "handshake_refused_by_peer"
            | "handshake_status_unknown"
            | "handshake_wrong_peer"
            | "tls_handshake_failed"
            | "tls_alpn_mismatch"
            | "client_plaintext"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_logs_are_limited_but_every_refusal_is_counted() {
        let limiter = LogLimiter::new();
        let allowed = (0..1000).filter(|_| limiter.allow()).count();
        assert_eq!(allowed, LOG_BURST as usize);
        let stats = BusStats::new(1, 3);
        for _ in 0..1000 {
            stats.reject("handshake_mac_mismatch");
        }
        stats.link_failure(reasons::DIAL_FAILED);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.rejected("handshake_mac_mismatch"), 1000);
        assert_eq!(snapshot.link_failures[reasons::DIAL_FAILED], 1);
        assert_eq!(snapshot.peers.len(), 2, "self is not a peer");
        assert!(snapshot.peer(1).is_none());
    }
}
