//! The client: connections per node, the primary of each group, the session and its
//! request numbers, and the retry loop every call goes through.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use replication::wire::{Frame, Header, Limits, Operation, RequestHeader, METADATA_GROUP};

use super::conn::{ClientTls, Connection, ExchangeError, Incoming};
use super::error::ClientError;
use super::retry::{Budget, RetryPolicy};
use crate::protocol::reply::{reason_text, LoginReply, RegisterReply};
use crate::protocol::request::PROTOCOL_VERSION;
use crate::protocol::{ClientRequest, ClientVersion, Credentials, ReadCommand, Status};

mod attempts;

/// The SDK name this library gives in a Register.
pub const SDK_NAME: &str = "appliance-client";

/// Nodes a client remembers (the configured ones plus those replies name).
pub const NODES_MAX: usize = 256;

/// Timeouts, retry bounds and transport of a client.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// TCP connect, per node.
    pub connect_timeout: Duration,
    /// From sending a request to its whole reply, per attempt.
    pub request_timeout: Duration,
    /// The same for a Login, at least: the server checks the password with a
    /// deliberately slow hash, so a Login may take longer than any other request.
    pub login_timeout: Duration,
    pub retry: RetryPolicy,
    /// Largest reply frame accepted (message_bus.max_message_size).
    pub max_message_size: u32,
    /// TLS to every node (the cluster's `tcp.tls`); None connects in plaintext.
    pub tls: Option<ClientTls>,
    /// How long a node that failed an attempt (no reply within the timeout, a refused
    /// or broken connection) is passed over when another node names it as the primary,
    /// while some other node is left to ask. The backups of a primary that went silent
    /// name it until their heartbeat timeout passes: going back to it would wait out
    /// another reply (or connect) timeout while the cluster elects a new one.
    pub failed_node_pause: Duration,
    /// At login, also open and log in a connection to every other known node (best
    /// effort), so a failover finds a logged-in connection at the new primary instead of
    /// a new connection and a password check: an Argon2 check on a node that many
    /// clients reach at once (they all fail over together) waits behind theirs.
    pub standby_logins: bool,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        ClientOptions {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            max_message_size: replication::wire::decode::MAX_MESSAGE_SIZE_DEFAULT,
            tls: None,
            failed_node_pause: Duration::from_secs(1),
            standby_logins: false,
        }
    }
}

/// The cluster session: its id and the last request number used under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Session {
    id: u64,
    request: u64,
}

/// What one call's attempts may have done.
#[derive(Clone, Copy, Debug, Default)]
struct Fate {
    /// An attempt was delivered and not answered: it may have been applied. Once true,
    /// never false again within the call.
    maybe_applied: bool,
    /// A reply decided the request (Ok or a final status).
    decided: bool,
}

/// How a request is numbered and retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// NonReplicated: session 0, request 0, resent freely.
    Read,
    /// Register: session 0, request 0.
    Register,
    /// Everything else: the session and the next request number, reused by every retry.
    Replicated,
}

/// A blocking client of the appliance's client protocol (docs/client-protocol.md).
/// One request is in flight at a time; see the module docs for what is retried.
#[derive(Debug)]
pub struct Client {
    options: ClientOptions,
    limits: Limits,
    client_id: u128,
    nodes: Vec<SocketAddr>,
    cursor: usize,
    primaries: HashMap<u64, SocketAddr>,
    conns: HashMap<SocketAddr, Connection>,
    /// Nodes whose last attempt failed, and when (`ClientOptions::failed_node_pause`).
    failed: HashMap<SocketAddr, Instant>,
    credentials: Option<(String, Vec<u8>)>,
    user_id: Option<u32>,
    session: Option<Session>,
    /// The highest request number this client id ever used, in any session: a new
    /// session continues above it, so no number is ever reused (partition groups order
    /// a client's requests by number, and a re-Register answered with the same session
    /// must not restart the count).
    request_high: u64,
    jitter: u64,
}

/// Resolves "host:port" (or a comma-separated list of them) to socket addresses.
pub fn resolve(spec: &str) -> Result<Vec<SocketAddr>, ClientError> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let addrs = part
            .to_socket_addrs()
            .map_err(|e| ClientError::InvalidArgument {
                what: "server",
                rule: format!("{part}: {e}"),
            })?;
        out.extend(addrs);
    }
    Ok(out)
}

/// A random non-zero client id: blake3 over the clock, the process id, a per-process
/// counter and std's randomly keyed hasher (no extra crate for 16 random bytes).
fn random_client_id() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut keyed = std::collections::hash_map::RandomState::new().build_hasher();
    keyed.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let mut hasher = blake3::Hasher::new();
    hasher.update(&now_micros().to_le_bytes());
    hasher.update(&std::process::id().to_le_bytes());
    hasher.update(&keyed.finish().to_le_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&hasher.finalize().as_bytes()[..16]);
    u128::from_le_bytes(first).max(1)
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Checks a short string or secret (1 to 255 bytes) before it is encoded.
pub(crate) fn short(what: &'static str, bytes: &[u8]) -> Result<(), ClientError> {
    if bytes.is_empty() || bytes.len() > 255 {
        return Err(ClientError::InvalidArgument {
            what,
            rule: format!("must be 1 to 255 bytes, got {}", bytes.len()),
        });
    }
    Ok(())
}

impl Client {
    /// Connects to the first of `servers` that answers. Any node will do: requests
    /// follow NotPrimary redirects to each group's primary.
    pub fn connect(servers: &[SocketAddr], options: ClientOptions) -> Result<Client, ClientError> {
        if servers.is_empty() {
            return Err(ClientError::NoServers);
        }
        let limits = Limits {
            max_message_size: options.max_message_size,
        };
        let mut client = Client {
            options,
            limits,
            client_id: random_client_id(),
            nodes: Vec::new(),
            cursor: 0,
            primaries: HashMap::new(),
            conns: HashMap::new(),
            failed: HashMap::new(),
            credentials: None,
            user_id: None,
            session: None,
            request_high: 0,
            jitter: 0,
        };
        client.jitter = client.client_id as u64;
        for addr in servers {
            client.add_node(*addr);
        }
        let mut last = ClientError::NoServers;
        for (index, addr) in client.nodes.clone().into_iter().enumerate() {
            match Connection::open(
                addr,
                client.options.connect_timeout,
                client.options.tls.as_ref(),
            ) {
                Ok(conn) => {
                    client.conns.insert(addr, conn);
                    client.cursor = index;
                    return Ok(client);
                }
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// This client's id (RequestHeader.client), fixed for its lifetime.
    pub fn client_id(&self) -> u128 {
        self.client_id
    }

    /// The session, once registered.
    pub fn session(&self) -> Option<u64> {
        self.session.map(|s| s.id)
    }

    /// The last request number used under the session.
    pub fn last_request(&self) -> Option<u64> {
        self.session.map(|s| s.request)
    }

    /// The user Login named.
    pub fn user_id(&self) -> Option<u32> {
        self.user_id
    }

    /// Nodes known so far.
    pub fn nodes(&self) -> &[SocketAddr] {
        &self.nodes
    }

    /// The cached primary of a group, if one is known.
    pub fn primary_of(&self, group: u64) -> Option<SocketAddr> {
        self.primaries.get(&group).copied()
    }

    pub(crate) fn add_node(&mut self, addr: SocketAddr) {
        if !self.nodes.contains(&addr) && self.nodes.len() < NODES_MAX {
            self.nodes.push(addr);
        }
    }

    pub(crate) fn set_primary(&mut self, group: u64, addr: SocketAddr) {
        self.add_node(addr);
        self.primaries.insert(group, addr);
    }

    /// Logs in with `user` and `password` (a NonReplicated Login on the connection) and
    /// keeps the credentials to log in again on every new connection.
    pub fn login(&mut self, user: &str, password: &[u8]) -> Result<u32, ClientError> {
        short("user", user.as_bytes())?;
        short("password", password)?;
        self.credentials = Some((user.to_owned(), password.to_vec()));
        for conn in self.conns.values_mut() {
            conn.logged_in = false;
        }
        let mut budget = Budget::new(self.options.retry, Instant::now(), self.next_jitter());
        let mut last = None;
        while budget.start_attempt(Instant::now()) {
            let addr = self.next_target(METADATA_GROUP);
            match self.ensure_conn(addr) {
                Ok(()) => {
                    let user_id = self.user_id.ok_or(ClientError::NoServers)?;
                    if self.options.standby_logins {
                        self.log_in_standby();
                    }
                    return Ok(user_id);
                }
                Err(e) if e.error.is_transient() => {
                    self.failed_at(addr);
                    last = Some(e.error);
                    std::thread::sleep(budget.backoff(Instant::now()));
                }
                Err(e) => {
                    self.credentials = None;
                    return Err(e.error);
                }
            }
        }
        Err(self.exhausted(&budget, false, last))
    }

    /// Registers a session (any node; a backup forwards it). Replaces a previous one.
    pub fn register(&mut self) -> Result<u64, ClientError> {
        let server = self.target(METADATA_GROUP);
        let Some((username, password)) = self.credentials.clone() else {
            return Err(ClientError::Status {
                status: Status::Unauthenticated,
                reason: "log in before registering a session".to_owned(),
            });
        };
        let register = ClientRequest::Register {
            version: ClientVersion {
                protocol_version: PROTOCOL_VERSION,
                sdk_name: SDK_NAME.to_owned(),
                sdk_version: env!("CARGO_PKG_VERSION").to_owned(),
            },
            credentials: Credentials::Password { username, password },
            context: None,
        };
        let body = self.call(METADATA_GROUP, &register)?;
        let reply =
            RegisterReply::decode(&body).map_err(|e| ClientError::body(server, "Register", e))?;
        self.session = Some(Session {
            id: reply.session,
            request: self.request_high,
        });
        Ok(reply.session)
    }

    /// Ends the session.
    pub fn logout(&mut self) -> Result<(), ClientError> {
        if self.session.is_none() {
            return Ok(());
        }
        let result = self
            .call(METADATA_GROUP, &ClientRequest::Logout)
            .map(|_| ());
        self.session = None;
        result
    }

    fn next_jitter(&mut self) -> u64 {
        self.jitter = self
            .jitter
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1);
        self.jitter
    }

    /// Where the next request for `group` goes: its cached primary, else the current
    /// node. Right after a successful call, the node that answered it.
    pub fn target(&self, group: u64) -> SocketAddr {
        if let Some(addr) = self.primaries.get(&group) {
            return *addr;
        }
        self.nodes[self.cursor % self.nodes.len()]
    }

    /// Drops the connection to a node that failed, forgets it as anyone's primary and
    /// moves the cursor past it, so the next attempt tries another node.
    fn forget(&mut self, addr: SocketAddr) {
        self.conns.remove(&addr);
        self.pass_over(addr);
    }

    /// Forgets a node as anyone's primary and moves the cursor past it, keeping its
    /// connection: it answered, it only cannot take the request now (a view change or
    /// recovery). Coming back to it later costs no new connection and login.
    fn pass_over(&mut self, addr: SocketAddr) {
        self.primaries.retain(|_, a| *a != addr);
        if let Some(index) = self.nodes.iter().position(|a| *a == addr) {
            if index == self.cursor % self.nodes.len() {
                self.cursor = (index + 1) % self.nodes.len();
            }
        }
    }

    /// Records that `addr` failed an attempt: its connection is dropped, it is nobody's
    /// primary and the cursor moves past it.
    fn failed_at(&mut self, addr: SocketAddr) {
        self.forget(addr);
        self.failed.insert(addr, Instant::now());
    }

    /// Whether `addr` failed an attempt within `failed_node_pause` and a node other
    /// than `asked` (the one that named it) is left to ask instead.
    fn paused(&self, addr: SocketAddr, asked: Option<SocketAddr>, now: Instant) -> bool {
        let recent = |a: &SocketAddr| {
            self.failed
                .get(a)
                .is_some_and(|at| now.duration_since(*at) < self.options.failed_node_pause)
        };
        recent(&addr) && self.nodes.iter().any(|a| Some(*a) != asked && !recent(a))
    }

    /// `target`, passing over nodes that failed lately while others are left.
    fn next_target(&mut self, group: u64) -> SocketAddr {
        let now = Instant::now();
        if let Some(addr) = self.primaries.get(&group) {
            if !self.paused(*addr, None, now) {
                return *addr;
            }
        }
        for _ in 0..self.nodes.len() {
            let addr = self.nodes[self.cursor % self.nodes.len()];
            if !self.paused(addr, None, now) {
                return addr;
            }
            self.cursor = (self.cursor + 1) % self.nodes.len();
        }
        self.target(group)
    }

    /// Opens and logs in a connection to every known node that has none (`ensure_conn`
    /// does nothing for one logged in already), best effort: a node that cannot be
    /// reached now is connected to when a request needs it.
    fn log_in_standby(&mut self) {
        for addr in self.nodes.clone() {
            if self.ensure_conn(addr).is_err() {
                self.conns.remove(&addr);
            }
        }
    }

    fn frame(
        &self,
        operation: Operation,
        read_command: u32,
        session: u64,
        request: u64,
        body: &[u8],
    ) -> Frame {
        let mut header = RequestHeader::new();
        header.client = self.client_id;
        header.timestamp = now_micros();
        header.request = request;
        header.operation = operation as u8;
        header.session = session;
        header.read_command = read_command;
        Frame::build(&header, body)
    }

    /// Opens a connection to `addr` if there is none and logs it in if credentials are
    /// set. Nothing of the caller's request has been sent when this fails.
    fn ensure_conn(&mut self, addr: SocketAddr) -> Result<(), ExchangeError> {
        let not_delivered = |error| ExchangeError {
            error,
            delivered: false,
        };
        if !self.conns.contains_key(&addr) {
            let conn = Connection::open(
                addr,
                self.options.connect_timeout,
                self.options.tls.as_ref(),
            )
            .map_err(not_delivered)?;
            self.conns.insert(addr, conn);
        }
        let needs_login = self.conns.get(&addr).is_some_and(|c| !c.logged_in);
        let Some((user, password)) = self.credentials.clone() else {
            return Ok(());
        };
        if !needs_login {
            return Ok(());
        }
        let login = ClientRequest::Login {
            username: user,
            password,
            version: Some(env!("CARGO_PKG_VERSION").to_owned()),
            context: None,
        };
        let (operation, read_command) = login.operation();
        let frame = self.frame(operation, read_command, 0, 0, &login.encode());
        let timeout = self.options.login_timeout.max(self.options.request_timeout);
        let incoming = self
            .exchange(addr, &frame, 0, operation, timeout)
            .map_err(|mut e| {
                e.delivered = false;
                e
            })?;
        let (status, body) = match incoming {
            Incoming::Reply { header, body } => (header.status, body),
            Incoming::Eviction { reason, .. } => {
                return Err(not_delivered(ClientError::evicted(reason)))
            }
        };
        match Status::from_reply(status, &body) {
            Some(Status::Ok) => {
                let reply = LoginReply::decode(&body)
                    .map_err(|e| not_delivered(ClientError::body(addr, "Login", e)))?;
                self.user_id = Some(reply.user_id);
                if let Some(conn) = self.conns.get_mut(&addr) {
                    conn.logged_in = true;
                }
                Ok(())
            }
            Some(status) => Err(not_delivered(ClientError::Status {
                status,
                reason: reason_text(&body),
            })),
            None => Err(not_delivered(ClientError::UnexpectedReply {
                server: addr,
                what: format!("unknown status {status}"),
            })),
        }
    }

    /// One frame out, one answer back, checked to answer this request. Any failure
    /// drops the connection: a late reply must never be read as another request's.
    fn exchange(
        &mut self,
        addr: SocketAddr,
        frame: &Frame,
        request: u64,
        operation: Operation,
        timeout: Duration,
    ) -> Result<Incoming, ExchangeError> {
        let Some(conn) = self.conns.get_mut(&addr) else {
            return Err(ExchangeError {
                error: ClientError::NoServers,
                delivered: false,
            });
        };
        let result = conn.exchange(frame, timeout, &self.limits);
        let checked = result.and_then(|incoming| {
            let mismatch = |what: String| ExchangeError {
                error: ClientError::UnexpectedReply { server: addr, what },
                delivered: true,
            };
            match &incoming {
                Incoming::Reply { header, .. } => {
                    if header.client != self.client_id {
                        return Err(mismatch(format!("reply for client {:#x}", header.client)));
                    }
                    if header.request != request || header.operation != operation as u8 {
                        return Err(mismatch(format!(
                            "reply to request {} operation {}, expected request {request} operation {}",
                            header.request, header.operation, operation as u8
                        )));
                    }
                }
                Incoming::Eviction { client, .. } if *client != self.client_id => {
                    return Err(mismatch(format!("eviction of client {client:#x}")));
                }
                Incoming::Eviction { .. } => {}
            }
            Ok(incoming)
        });
        if checked.is_err() {
            self.conns.remove(&addr);
        }
        checked
    }

    fn exhausted(
        &self,
        budget: &Budget,
        maybe_applied: bool,
        last: Option<ClientError>,
    ) -> ClientError {
        ClientError::RetriesExhausted {
            attempts: budget.attempts(),
            elapsed: budget.elapsed(Instant::now()),
            maybe_applied,
            last: Box::new(last.unwrap_or(ClientError::NoServers)),
        }
    }

    /// Sends `request` to the primary of `group` and returns the Ok reply's body.
    /// The retry rules are docs/client-protocol.md, "What the client library retries".
    pub(crate) fn call(
        &mut self,
        group: u64,
        request: &ClientRequest<'_>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut fate = Fate::default();
        let result = self.call_attempts(group, request, &mut fate);
        if result.is_err() && fate.maybe_applied && !fate.decided {
            // The outcome is unknown, whatever ended the call: never reuse this number
            // for another body (the primary would answer it with this request's reply).
            // A new session, registered by the next call, also fences the abandoned
            // request: it is ordered before that Register or refused.
            self.session = None;
        }
        result
    }

    /// NonReplicated reads go to the group's cached primary (read-your-writes when it is
    /// known), else any node; they are resent freely.
    pub(crate) fn read(
        &mut self,
        group: u64,
        request: &ClientRequest<'_>,
    ) -> Result<Vec<u8>, ClientError> {
        debug_assert_eq!(request.operation().0, Operation::NonReplicated);
        debug_assert_ne!(request.operation().1, ReadCommand::Login as u32);
        self.call(group, request)
    }
}
