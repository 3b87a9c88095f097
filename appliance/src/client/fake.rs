//! An in-memory stand-in for an appliance cluster, for client and CLI tests only
//! (feature `test-server`). Each fake node listens on 127.0.0.1 (port 0) and speaks the
//! documented client protocol: Request frames in, Reply or Eviction frames out. The
//! nodes share one state, as replicas share committed state, including the client
//! table, so a retry that reaches a new primary is answered from it.
//!
//! Faults are injected through `Faults`; every request a node receives is recorded.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use replication::wire::batch;
use replication::wire::{
    check_header, decode, EvictionHeader, Frame, FrameBuf, Header, Limits, Message, Operation,
    PartitionKey, ReplyHeader, RequestHeader, HEADER_SIZE,
};

use crate::protocol::reply::*;
use crate::protocol::status::PIPELINE_FULL_REASON;
use crate::protocol::{ClientRequest, Consumer, Credentials, Status};

mod answers;

use answers::{apply, read};

/// One recorded request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub node: u8,
    pub operation: u8,
    pub read_command: u32,
    pub client: u128,
    pub session: u64,
    pub request: u64,
}

/// Faults the fake injects, each at most once unless said otherwise.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// Apply the next request of this operation, then close the connection unanswered.
    pub drop_reply_after_apply: Option<Operation>,
    /// Apply the next request of this operation, then crash the node that applied it
    /// (it refuses every connection from then on) and make the next node the primary.
    pub crash_primary_after_apply: Option<Operation>,
    /// Apply the next request of this operation, then forget the session and close the
    /// connection unanswered (the retry finds no session).
    pub lose_session_after_apply: Option<Operation>,
    /// Answer the next replicated request (other than Register) with an Eviction of this
    /// reason and forget the session.
    pub evict_once: Option<u8>,
    /// Answer the next replicated request (other than Register) with NoSession and
    /// forget the session, before applying it.
    pub no_session_once: bool,
    /// Polls serve the message at this offset with one payload byte flipped and every
    /// checksum recomputed, as a bad disk plus a re-stamping bug would.
    pub corrupt_payload_at: Option<u64>,
    /// The next append that would start at or after this offset skips one offset.
    pub gap_at: Option<u64>,
    /// Answer this many requests with Unavailable.
    pub unavailable: u32,
    /// Answer this many replicated requests with PipelineFull.
    pub pipeline_full: u32,
    /// Answer this many requests with Unauthenticated and forget the connection's login
    /// (as a node that restarted would).
    pub unauthenticated: u32,
    /// After this many SendMessages are applied, answer every later one Unavailable.
    pub unavailable_after_sends: Option<u32>,
}

#[derive(Clone, Debug)]
struct SessionEntry {
    session: u64,
    latest: u64,
    reply: (Status, Vec<u8>),
}

#[derive(Clone, Debug, Default)]
struct FakeStream {
    name: String,
    topics: BTreeMap<u32, (String, u32)>,
    /// Per topic: message_expiry and max_topic_size as set.
    retention: BTreeMap<u32, (u64, u64)>,
}

#[derive(Clone, Debug, Default)]
struct FakePartition {
    batches: Vec<Vec<u8>>,
    next_offset: u64,
}

/// The state every fake node serves from.
#[derive(Debug, Default)]
pub struct FakeState {
    pub primary: u8,
    pub down: Vec<bool>,
    /// Nodes that read requests (recorded) and never answer, as a host whose link went
    /// down or that stalled: connections stay open.
    pub silent: Vec<bool>,
    pub faults: Faults,
    pub received: Vec<Received>,
    /// (operation, session, request) of every replicated request applied.
    pub applied: Vec<(u8, u64, u64)>,
    users: Vec<(String, Vec<u8>, u32)>,
    sessions: HashMap<u128, SessionEntry>,
    next_session: u64,
    streams: BTreeMap<u32, FakeStream>,
    partitions: BTreeMap<PartitionKey, FakePartition>,
    offsets: HashMap<(PartitionKey, Consumer), u64>,
    addrs: Vec<SocketAddr>,
}

impl FakeState {
    /// Changes (or adds) a user's password.
    pub fn set_password(&mut self, user: &str, password: &[u8]) {
        match self.users.iter_mut().find(|(u, _, _)| u == user) {
            Some(entry) => entry.1 = password.to_vec(),
            None => {
                let id = self.users.len() as u32 + 1;
                self.users.push((user.into(), password.to_vec(), id));
            }
        }
    }

    fn record(&mut self, node: u8, header: &RequestHeader) {
        self.received.push(Received {
            node,
            operation: header.operation,
            read_command: header.read_command,
            client: header.client,
            session: header.session,
            request: header.request,
        });
    }

    /// Messages stored in a partition (sum over its batches).
    pub fn stored_messages(&self, partition: PartitionKey) -> u64 {
        self.partitions.get(&partition).map_or(0, |p| {
            p.batches
                .iter()
                .filter_map(|b| batch::verify(b).ok())
                .map(|i| u64::from(i.message_count))
                .sum()
        })
    }
}

/// A fake cluster of `n` nodes; dropping it stops the listeners.
pub struct FakeCluster {
    pub addrs: Vec<SocketAddr>,
    state: Arc<Mutex<FakeState>>,
    stop: Arc<AtomicBool>,
}

impl FakeCluster {
    /// Starts `nodes` fake nodes on 127.0.0.1; node 0 is the primary of every group.
    /// The only user is `root` with password `secret`.
    pub fn start(nodes: u8) -> std::io::Result<FakeCluster> {
        let state = Arc::new(Mutex::new(FakeState {
            users: vec![("root".into(), b"secret".to_vec(), 1)],
            next_session: 100,
            down: vec![false; usize::from(nodes)],
            silent: vec![false; usize::from(nodes)],
            ..FakeState::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let mut addrs = Vec::new();
        for replica in 0..nodes {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            addrs.push(listener.local_addr()?);
            let state = state.clone();
            let stop = stop.clone();
            thread::spawn(move || accept_loop(replica, listener, state, stop));
        }
        lock(&state).addrs = addrs.clone();
        Ok(FakeCluster { addrs, state, stop })
    }

    /// The shared state, for assertions and to set faults.
    pub fn state(&self) -> MutexGuard<'_, FakeState> {
        lock(&self.state)
    }

    /// The addresses as one comma-separated `--server` value.
    pub fn servers_arg(&self) -> String {
        self.addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for FakeCluster {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for addr in &self.addrs {
            // Wakes each accept loop so it sees the stop flag.
            let _ = TcpStream::connect_timeout(addr, Duration::from_millis(100));
        }
    }
}

fn lock(state: &Mutex<FakeState>) -> MutexGuard<'_, FakeState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn accept_loop(
    replica: u8,
    listener: TcpListener,
    state: Arc<Mutex<FakeState>>,
    stop: Arc<AtomicBool>,
) {
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if lock(&state).down[usize::from(replica)] {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let state = state.clone();
        thread::spawn(move || serve(replica, stream, state));
    }
}

enum Answer {
    Reply(Status, Vec<u8>),
    Evict(u8),
    Close,
}

fn serve(replica: u8, mut stream: TcpStream, state: Arc<Mutex<FakeState>>) {
    let limits = Limits::default();
    let mut user: Option<u32> = None;
    let mut buf = FrameBuf::zeroed(HEADER_SIZE);
    loop {
        buf.resize(HEADER_SIZE);
        if stream.read_exact(buf.as_bytes_mut()).is_err() {
            return;
        }
        let Ok(info) = check_header(buf.as_bytes(), &limits) else {
            return;
        };
        buf.resize(info.size as usize);
        if stream
            .read_exact(&mut buf.as_bytes_mut()[HEADER_SIZE..])
            .is_err()
        {
            return;
        }
        let Ok(Message::Request(header, body)) = decode(buf.as_bytes(), &limits) else {
            return;
        };
        let header = *header;
        let answer = {
            let mut s = lock(&state);
            if s.down[usize::from(replica)] {
                Answer::Close
            } else if s.silent[usize::from(replica)] {
                s.record(replica, &header);
                continue;
            } else {
                handle(&mut s, replica, &mut user, &header, body)
            }
        };
        let frame = match answer {
            Answer::Close => {
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
            Answer::Reply(status, body) => {
                let mut reply = ReplyHeader::new();
                reply.frame.replica = replica;
                reply.client = header.client;
                reply.request = header.request;
                reply.operation = header.operation;
                reply.status = status.wire_code(header.operation);
                let body = match status {
                    Status::PipelineFull => PIPELINE_FULL_REASON.to_vec(),
                    Status::Ok => with_result_section(header.operation, &body).into_owned(),
                    _ => body,
                };
                Frame::build(&reply, &body)
            }
            Answer::Evict(reason) => {
                let mut eviction = EvictionHeader::new();
                eviction.client = header.client;
                eviction.reason = reason;
                Frame::build(&eviction, &[])
            }
        };
        if stream.write_all(frame.as_bytes()).is_err() {
            return;
        }
    }
}

fn ok(body: Vec<u8>) -> Answer {
    Answer::Reply(Status::Ok, body)
}

fn fail(status: Status) -> Answer {
    Answer::Reply(status, Vec::new())
}

fn handle(
    s: &mut FakeState,
    replica: u8,
    user: &mut Option<u32>,
    header: &RequestHeader,
    body: &[u8],
) -> Answer {
    s.record(replica, header);
    let Some(operation) = Operation::from_u8(header.operation) else {
        return Answer::Close;
    };
    let request = match ClientRequest::decode(operation, header.read_command, body) {
        Ok(request) => request,
        Err(e) => return Answer::Reply(Status::InvalidRequest, e.to_string().into_bytes()),
    };
    let user_of = |username: &String, password: &Vec<u8>| {
        s.users
            .iter()
            .find(|(u, p, _)| u == username && p == password)
            .map(|(_, _, id)| *id)
    };
    match &request {
        ClientRequest::Login {
            username, password, ..
        } => {
            return match user_of(username, password) {
                Some(id) => {
                    *user = Some(id);
                    ok(LoginReply { user_id: id }.encode())
                }
                None => fail(Status::InvalidCredentials),
            };
        }
        ClientRequest::Register {
            credentials: Credentials::Password { username, password },
            ..
        } => match user_of(username, password) {
            Some(id) => *user = Some(id),
            None => return fail(Status::InvalidCredentials),
        },
        ClientRequest::Register { .. } => return fail(Status::FeatureUnavailable),
        _ => {}
    }
    if s.faults.unauthenticated > 0 {
        s.faults.unauthenticated -= 1;
        *user = None;
    }
    if user.is_none() {
        return fail(Status::Unauthenticated);
    }
    if s.faults.unavailable > 0 {
        s.faults.unavailable -= 1;
        return fail(Status::Unavailable);
    }
    if operation == Operation::NonReplicated {
        return read(s, &request);
    }
    if replica != s.primary {
        let primary = s.primary;
        return Answer::Reply(
            Status::NotPrimary,
            NotPrimaryReply {
                primary,
                address: s.addrs[usize::from(primary)].to_string(),
            }
            .encode(),
        );
    }
    if s.faults.pipeline_full > 0 {
        s.faults.pipeline_full -= 1;
        return fail(Status::PipelineFull);
    }
    if operation == Operation::Register {
        let session = s.next_session;
        s.next_session += 1;
        let reply = RegisterReply::of_this_server(user.unwrap_or_default(), session).encode();
        s.sessions.insert(
            header.client,
            SessionEntry {
                session,
                latest: 0,
                reply: (Status::Ok, reply.clone()),
            },
        );
        return ok(reply);
    }
    if let Some(reason) = s.faults.evict_once.take() {
        s.sessions.remove(&header.client);
        return Answer::Evict(reason);
    }
    if s.faults.no_session_once {
        s.faults.no_session_once = false;
        s.sessions.remove(&header.client);
    }
    let Some(entry) = s.sessions.get(&header.client).cloned() else {
        return fail(Status::NoSession);
    };
    if entry.session != header.session {
        return fail(Status::NoSession);
    }
    if header.request == entry.latest {
        // A retry of the latest request: answered from the client table.
        return Answer::Reply(entry.reply.0, entry.reply.1);
    }
    if header.request < entry.latest {
        return fail(Status::StaleRequest);
    }
    if operation == Operation::SendMessages {
        let sends = s
            .applied
            .iter()
            .filter(|a| a.0 == Operation::SendMessages as u8)
            .count();
        if s.faults
            .unavailable_after_sends
            .is_some_and(|n| sends >= n as usize)
        {
            return fail(Status::Unavailable);
        }
    }
    let (status, reply) = match apply(s, &request) {
        Answer::Reply(status, body) => (status, body),
        other => return other,
    };
    s.applied
        .push((header.operation, header.session, header.request));
    s.sessions.insert(
        header.client,
        SessionEntry {
            session: entry.session,
            latest: header.request,
            reply: (status, reply.clone()),
        },
    );
    if operation == Operation::Logout {
        s.sessions.remove(&header.client);
    }
    if s.faults.drop_reply_after_apply == Some(operation) {
        s.faults.drop_reply_after_apply = None;
        return Answer::Close;
    }
    if s.faults.lose_session_after_apply == Some(operation) {
        s.faults.lose_session_after_apply = None;
        s.sessions.remove(&header.client);
        return Answer::Close;
    }
    if s.faults.crash_primary_after_apply == Some(operation) {
        s.faults.crash_primary_after_apply = None;
        s.down[usize::from(replica)] = true;
        s.primary = (replica + 1) % s.down.len() as u8;
        return Answer::Close;
    }
    Answer::Reply(status, reply)
}
