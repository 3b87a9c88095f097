//! The replica-plane message bus on glommio TCP (docs/protocol.md, "Framing" and
//! "Handshake"): a client listener that admits only Request frames, a replica listener
//! whose connections start with the handshake, directional dialing with backoff, one
//! connection per replica pair, bounded per-peer send queues batched into writev, optional
//! HMAC authentication and TLS 1.3, and counters for every rejection and drop.
//!
//! The bus knows nothing of consensus: it hands validated frames (`VerifiedFrame`, bytes
//! in a 16-aligned `FrameBuf`) to a `Handler` and sends the frames it is given.
//!
//! ```text
//! let bus = Bus::start(config, Rc::new(MyHandler))?;   // inside a glommio executor
//! bus.send(2, frame)?;                                  // to replica 2
//! bus.broadcast(commit);                                // to every connected peer
//! let stats = bus.stats().snapshot();                   // counters for /stats
//! ```

pub mod auth;
pub mod config;
pub(crate) mod conn;
pub mod handshake;
mod link;
mod listener;
mod peer;
pub mod stats;
pub mod tls;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use glommio::net::TcpListener;
use glommio::task::JoinHandle;

pub use auth::{ChannelBinding, Keys, SecretError};
pub use config::{AuthConfig, BusConfig, ConfigError, NodeAddress, TlsConfig};
pub use handshake::HandshakeError;
pub use stats::{BusStats, PeerSnapshot, StatsSnapshot};
pub use tls::{TlsContext, TlsSetupError};

use crate::wire::{
    cluster_id, decode, Command, Frame, FrameBuf, FrameError, Header, Limits, Message, HEADER_SIZE,
};
use conn::BufPool;
use handshake::Local;
use link::Link;

/// A frame that passed `wire::decode` when it was received. Only the bus makes these.
/// A client frame holds its share of limits.frame_memory_max until it is dropped or
/// turned back into its buffer.
pub struct VerifiedFrame {
    buf: FrameBuf,
    command: Command,
    _charge: Option<conn::Charge>,
}

impl VerifiedFrame {
    /// The frame's command.
    pub fn command(&self) -> Command {
        self.command
    }

    /// The whole frame, header first, 16-byte aligned.
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_bytes()
    }

    /// The frame itself, for the consensus core to keep (a Prepare in its log) without
    /// copying or sealing it again.
    pub fn into_frame(self) -> crate::wire::Frame {
        crate::wire::Frame::from_verified(self.buf)
    }

    /// The typed view. Decodes again (seals included); it cannot fail on a frame that
    /// passed at receipt with the same limits.
    pub fn message(&self, limits: &Limits) -> Result<Message<'_>, FrameError> {
        decode(self.buf.as_bytes(), limits)
    }

    /// The header as layout `H` without verifying again: Some when the frame's command
    /// uses that layout (a PrepareOk is never read as a Commit).
    pub fn header<H: Header>(&self) -> Option<&H> {
        if !H::COMMANDS.contains(&self.command) {
            return None;
        }
        H::ref_from_prefix(self.buf.as_bytes())
            .ok()
            .map(|(header, _)| header)
    }

    /// The body after the 256-byte header.
    pub fn body(&self) -> &[u8] {
        self.buf.as_bytes().get(HEADER_SIZE..).unwrap_or(&[])
    }

    /// The buffer, to hand back with `Bus::recycle` when done.
    pub fn into_buf(self) -> FrameBuf {
        self.buf
    }
}

impl core::fmt::Debug for VerifiedFrame {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VerifiedFrame")
            .field("command", &self.command)
            .field("len", &self.buf.len())
            .finish()
    }
}

/// A frame to send: built and sealed here, shared by a broadcast, or a verified frame
/// forwarded as received (chain replication, echoing).
#[derive(Debug)]
pub enum Outbound {
    /// A frame built and sealed by this node.
    Frame(Frame),
    /// One frame queued to several peers without copying.
    Shared(Rc<Frame>),
    /// A received frame passed on unchanged.
    Verified(VerifiedFrame),
}

impl Outbound {
    /// The bytes on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Outbound::Frame(frame) => frame.as_bytes(),
            Outbound::Shared(frame) => frame.as_bytes(),
            Outbound::Verified(frame) => frame.as_bytes(),
        }
    }
}

impl AsRef<[u8]> for Outbound {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<Frame> for Outbound {
    fn from(frame: Frame) -> Outbound {
        Outbound::Frame(frame)
    }
}

impl From<Rc<Frame>> for Outbound {
    fn from(frame: Rc<Frame>) -> Outbound {
        Outbound::Shared(frame)
    }
}

impl From<VerifiedFrame> for Outbound {
    fn from(frame: VerifiedFrame) -> Outbound {
        Outbound::Verified(frame)
    }
}

/// One client connection on the client listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId(pub u64);

/// What the bus delivers. Called on the bus's executor; must not block.
pub trait Handler {
    /// A validated frame from an established replica link.
    fn on_replica_frame(&self, peer: u8, frame: VerifiedFrame);
    /// A validated Request from a client connection.
    fn on_client_frame(&self, client: ClientId, frame: VerifiedFrame) {
        let _ = (client, frame);
    }
    /// A client Request was refused by a limit before its body was read (`reason` is the
    /// counted label, e.g. "frame_memory_limit"); `header` is its 256 unverified header
    /// bytes, enough to address an error reply. The connection stays open.
    fn on_client_refused(&self, client: ClientId, header: &[u8], reason: &'static str) {
        let _ = (client, header, reason);
    }
    /// A well-framed client Request failed validation (counted; the frame is dropped). The
    /// appliance may answer with an error reply or Eviction.
    fn on_client_rejected(&self, client: ClientId, error: &FrameError) {
        let _ = (client, error);
    }
    /// A replica link completed its handshake. A newer link from the same peer replaces
    /// the old one silently, so this may repeat without a disconnect in between.
    fn on_peer_connected(&self, peer: u8) {
        let _ = peer;
    }
    /// A replica link closed.
    fn on_peer_disconnected(&self, peer: u8) {
        let _ = peer;
    }
    /// A client connection closed.
    fn on_client_closed(&self, client: ClientId) {
        let _ = client;
    }
}

/// Why a frame was not queued (it is dropped and counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// Not a replica of the roster, or this node itself.
    UnknownPeer { replica: u8 },
    /// No established link to that replica (the caller skips disconnected peers).
    Disconnected { replica: u8 },
    /// The per-peer queue holds peer_queue_capacity frames already.
    QueueFull { replica: u8 },
    /// No such client connection (it closed).
    UnknownClient { client: ClientId },
    /// The client's queue is full.
    ClientQueueFull { client: ClientId },
}

impl core::fmt::Display for SendError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SendError::UnknownPeer { replica } => write!(f, "replica {replica} is not a peer"),
            SendError::Disconnected { replica } => write!(f, "replica {replica} is not connected"),
            SendError::QueueFull { replica } => {
                write!(f, "send queue to replica {replica} is full")
            }
            SendError::UnknownClient { client } => write!(f, "client {} is gone", client.0),
            SendError::ClientQueueFull { client } => {
                write!(f, "send queue to client {} is full", client.0)
            }
        }
    }
}

impl std::error::Error for SendError {}

/// Why the bus could not start.
#[derive(Debug)]
pub enum BusError {
    /// A configuration value broke a rule.
    Config(ConfigError),
    /// A secret is too short.
    Secret(SecretError),
    /// TLS material could not be loaded or used.
    Tls(TlsSetupError),
    /// A listener could not bind.
    Bind {
        addr: SocketAddr,
        error: std::io::Error,
    },
}

impl core::fmt::Display for BusError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BusError::Config(error) => write!(f, "{error}"),
            BusError::Secret(error) => write!(f, "{error}"),
            BusError::Tls(error) => write!(f, "{error}"),
            BusError::Bind { addr, error } => write!(f, "cannot listen on {addr}: {error}"),
        }
    }
}

impl std::error::Error for BusError {}

/// Shared state of one bus, owned by its tasks.
pub(crate) struct Inner {
    config: BusConfig,
    local: Local,
    keys: Option<Keys>,
    /// The replica plane's TLS material (None: plaintext); `Bus::set_replica_tls` swaps
    /// it for handshakes started from then on.
    tls: RefCell<Option<TlsContext>>,
    limits: Limits,
    stats: Arc<BusStats>,
    handler: Rc<dyn Handler>,
    pool: BufPool,
    /// Established link per replica id (None for self and disconnected peers).
    peers: Vec<RefCell<Option<Rc<Link>>>>,
    clients: RefCell<HashMap<ClientId, Rc<Link>>>,
    /// The address each open client connection comes from.
    client_remotes: RefCell<HashMap<ClientId, std::net::SocketAddr>>,
    next_client: Cell<u64>,
    next_link: Cell<u64>,
    handshakes_in_flight: Cell<usize>,
    /// The client listener's TLS acceptor config (None: plaintext); swapped by
    /// `Bus::set_client_tls`, read once per accepted connection.
    client_tls: RefCell<Option<Arc<rustls::ServerConfig>>>,
    /// Client TLS handshakes in flight (at most config.handshakes_max).
    client_handshakes: Cell<usize>,
    /// Bytes of client frames held (limits.frame_memory_max).
    frame_memory: Arc<conn::FrameMemory>,
    closed: Cell<bool>,
    log_limiter: stats::LogLimiter,
}

impl Inner {
    /// Counts a refused connection or frame and logs it (rate-limited). Statuses 4 and 5
    /// are never sent (docs/protocol.md, "Handshake"), so this is where they show.
    pub(crate) fn refuse(
        &self,
        reason: &'static str,
        remote: Option<SocketAddr>,
        peer: Option<u8>,
    ) {
        self.stats.reject(reason);
        if self.log_limiter.allow() {
            if stats::is_notable(reason) {
                tracing::warn!(reason, ?remote, ?peer, "replica bus refused a connection");
            } else {
                tracing::debug!(reason, ?remote, ?peer, "replica bus refused input");
            }
        }
    }

    fn next_link_id(&self) -> u64 {
        let id = self.next_link.get();
        self.next_link.set(id + 1);
        id
    }
}

/// A running bus. Cheap to clone; `shutdown` stops it.
#[derive(Clone)]
pub struct Bus {
    inner: Rc<Inner>,
    tasks: Rc<RefCell<Vec<JoinHandle<()>>>>,
    replica_addr: SocketAddr,
    client_addr: Option<SocketAddr>,
}

impl Bus {
    /// Validates the config, loads keys and TLS material, binds both listeners and starts
    /// accepting and dialing. Must run inside a glommio executor.
    pub fn start(config: BusConfig, handler: Rc<dyn Handler>) -> Result<Bus, BusError> {
        config.validate().map_err(BusError::Config)?;
        let keys = if config.auth.enabled {
            Some(
                Keys::new(
                    &config.auth.shared_secret,
                    config.auth.previous_shared_secret.as_deref(),
                )
                .map_err(BusError::Secret)?,
            )
        } else {
            None
        };
        let tls = if config.tls.enabled {
            Some(TlsContext::load(&config.tls).map_err(BusError::Tls)?)
        } else {
            None
        };
        Bus::start_with_tls(config, keys, tls, handler)
    }

    /// As `start`, with keys and TLS material supplied by the caller (tests build
    /// certificates in memory): auth runs iff `keys` is Some, TLS iff `tls` is Some, and
    /// config.auth / config.tls are not read.
    pub fn start_with_tls(
        config: BusConfig,
        keys: Option<Keys>,
        tls: Option<TlsContext>,
        handler: Rc<dyn Handler>,
    ) -> Result<Bus, BusError> {
        config.validate_transport().map_err(BusError::Config)?;
        let bind = |addr: SocketAddr| {
            TcpListener::bind(addr).map_err(|error| BusError::Bind {
                addr,
                error: std::io::Error::other(error.to_string()),
            })
        };
        let replica_listener = bind(config.replica_listen)?;
        let replica_addr = replica_listener
            .local_addr()
            .map_err(|error| BusError::Bind {
                addr: config.replica_listen,
                error: std::io::Error::other(error.to_string()),
            })?;
        let client_listener = config.client_listen.map(bind).transpose()?;
        let client_addr = match &client_listener {
            Some(listener) => Some(listener.local_addr().map_err(|error| BusError::Bind {
                addr: replica_addr,
                error: std::io::Error::other(error.to_string()),
            })?),
            None => None,
        };
        let replica_count = config.replica_count();
        let local = Local {
            cluster: cluster_id(&config.cluster_name),
            replica: config.replica_id,
            replica_count,
        };
        let inner = Rc::new(Inner {
            local,
            keys,
            tls: RefCell::new(tls),
            limits: Limits {
                max_message_size: config.max_message_size,
            },
            stats: Arc::new(BusStats::new(config.replica_id, replica_count)),
            handler,
            pool: BufPool::default(),
            peers: (0..replica_count).map(|_| RefCell::new(None)).collect(),
            clients: RefCell::new(HashMap::new()),
            client_remotes: RefCell::new(HashMap::new()),
            next_client: Cell::new(1),
            next_link: Cell::new(1),
            handshakes_in_flight: Cell::new(0),
            client_tls: RefCell::new(config.client_tls.clone()),
            client_handshakes: Cell::new(0),
            frame_memory: Arc::new(conn::FrameMemory::new(config.client_frame_memory_max)),
            closed: Cell::new(false),
            log_limiter: stats::LogLimiter::new(),
            config,
        });
        let mut tasks = Vec::new();
        tasks.push(
            glommio::spawn_local(listener::replica_accept_loop(
                inner.clone(),
                replica_listener,
            ))
            .detach(),
        );
        if let Some(listener) = client_listener {
            tasks.push(
                glommio::spawn_local(listener::client_accept_loop(inner.clone(), listener))
                    .detach(),
            );
        }
        for node in &inner.config.nodes {
            if node.replica_id > inner.local.replica {
                tasks.push(
                    glommio::spawn_local(peer::dial_loop(inner.clone(), node.clone())).detach(),
                );
            }
        }
        Ok(Bus {
            inner,
            tasks: Rc::new(RefCell::new(tasks)),
            replica_addr,
            client_addr,
        })
    }

    /// Where the replica listener listens (the real port when configured with port 0).
    pub fn replica_addr(&self) -> SocketAddr {
        self.replica_addr
    }

    /// Where the client listener listens, if it runs.
    pub fn client_addr(&self) -> Option<SocketAddr> {
        self.client_addr
    }

    /// The frame limits applied on receipt.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// Counters, shareable with a stats thread.
    pub fn stats(&self) -> Arc<BusStats> {
        self.inner.stats.clone()
    }

    /// The address an open client connection comes from.
    pub fn client_address(&self, client: ClientId) -> Option<std::net::SocketAddr> {
        self.inner.client_remotes.borrow().get(&client).copied()
    }

    /// Replaces the client listener's TLS config for connections accepted from now on
    /// (a certificate rotation); connections already open keep their sessions. None
    /// serves plaintext.
    pub fn set_client_tls(&self, config: Option<Arc<rustls::ServerConfig>>) {
        *self.inner.client_tls.borrow_mut() = config;
    }

    /// Replaces the replica plane's TLS material (a certificate rotation) for handshakes
    /// started from then on, dialed or accepted; established links keep their sessions.
    /// A bus that started without TLS stays plaintext (peers would refuse a switch):
    /// false then, and nothing changes.
    pub fn set_replica_tls(&self, context: TlsContext) -> bool {
        let mut tls = self.inner.tls.borrow_mut();
        if tls.is_none() {
            return false;
        }
        *tls = Some(context);
        true
    }

    /// Whether the client listener requires TLS.
    pub fn client_tls_enabled(&self) -> bool {
        self.inner.client_tls.borrow().is_some()
    }

    /// Whether an established link to `replica` exists.
    pub fn is_connected(&self, replica: u8) -> bool {
        self.link(replica).is_some()
    }

    fn link(&self, replica: u8) -> Option<Rc<Link>> {
        self.inner
            .peers
            .get(usize::from(replica))
            .and_then(|slot| slot.borrow().clone())
    }

    /// Queues a frame to a peer. Overruns and sends to disconnected peers are dropped and
    /// counted in that peer's `dropped`.
    pub fn send(&self, replica: u8, frame: impl Into<Outbound>) -> Result<(), SendError> {
        if replica == self.inner.local.replica || replica >= self.inner.local.replica_count {
            return Err(SendError::UnknownPeer { replica });
        }
        let stats = self.inner.stats.peer(replica);
        let Some(link) = self.link(replica) else {
            if let Some(stats) = stats {
                stats.add_dropped(1);
            }
            return Err(SendError::Disconnected { replica });
        };
        match link.push(frame.into()) {
            Ok(()) => {
                if let Some(stats) = stats {
                    stats.set_queue_depth(link.depth());
                }
                Ok(())
            }
            Err(_) => {
                if let Some(stats) = stats {
                    stats.add_dropped(1);
                }
                self.inner.stats.reject(stats::reasons::PEER_QUEUE_FULL);
                Err(SendError::QueueFull { replica })
            }
        }
    }

    /// Queues one shared copy of `frame` to every connected peer; returns how many took it.
    pub fn broadcast(&self, frame: Frame) -> usize {
        let frame = Rc::new(frame);
        (0..self.inner.local.replica_count)
            .filter(|replica| *replica != self.inner.local.replica)
            .filter(|replica| self.send(*replica, frame.clone()).is_ok())
            .count()
    }

    /// Queues a frame to a client connection (Reply, Eviction).
    pub fn send_to_client(
        &self,
        client: ClientId,
        frame: impl Into<Outbound>,
    ) -> Result<(), SendError> {
        let link = self.inner.clients.borrow().get(&client).cloned();
        let Some(link) = link else {
            return Err(SendError::UnknownClient { client });
        };
        link.push(frame.into()).map_err(|_| {
            self.inner.stats.add_client_dropped();
            SendError::ClientQueueFull { client }
        })
    }

    /// Waits until the queue to `replica` has room (or the link is gone). Senders that
    /// prefer backpressure to drops (bulk transfer, benchmarks) use it before `send`.
    pub async fn room(&self, replica: u8) {
        if let Some(link) = self.link(replica) {
            link.room().await;
        }
    }

    /// Bytes of client frames held now (being read, or delivered and not yet dropped).
    pub fn client_frame_memory(&self) -> usize {
        self.inner.frame_memory.used()
    }

    /// Frames queued to `replica` and not yet written.
    pub fn queue_depth(&self, replica: u8) -> usize {
        self.link(replica).map_or(0, |link| link.depth())
    }

    /// Gives a received buffer back to the pool.
    pub fn recycle(&self, buf: FrameBuf) {
        self.inner.pool.put(buf);
    }

    /// Stops listening and dialing and closes every connection.
    pub fn shutdown(&self) {
        self.inner.closed.set(true);
        for task in self.tasks.borrow_mut().drain(..) {
            task.cancel();
        }
        for slot in &self.inner.peers {
            if let Some(link) = slot.borrow_mut().take() {
                link.kill();
            }
        }
        for (_, link) in self.inner.clients.borrow_mut().drain() {
            link.kill();
        }
    }
}
