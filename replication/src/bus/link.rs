//! One established connection: its bounded send queue, the writer task that drains it in
//! writev batches, and the reader loops that deliver validated frames.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

use super::conn::{write_all_vectored, FrameReader, ReadError, SharedStream};
use super::handshake::check_established_frame;
use super::stats::reasons;
use super::{ClientId, Inner, Outbound, VerifiedFrame};
use crate::wire::{client_plane_admit, decode, replica_plane_admit};

/// Who is at the other end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Remote {
    Replica(u8),
    Client(ClientId),
}

/// A frame to a peer of at most this many bytes (view change, Commit, PrepareOk, repair
/// requests: no prepare body) is small: the queue holds SMALL_FRAME_SLOTS of them per
/// slot of its capacity.
pub const SMALL_FRAME_MAX: usize = 4096;
/// Small frames a peer queue holds per slot of `message_bus.peer_queue_capacity`: the
/// view changes of thousands of groups queue a burst of small frames at once, which a
/// queue sized for prepares would drop (and the groups would wait for retransmits).
pub const SMALL_FRAME_SLOTS: usize = 8;

pub(crate) struct Link {
    pub(crate) id: u64,
    remote: Remote,
    stream: SharedStream,
    queue: RefCell<VecDeque<Outbound>>,
    /// Frames larger than SMALL_FRAME_MAX in the queue.
    large: Cell<usize>,
    /// Bound on the large frames queued; on all frames, times `small_slots`.
    capacity: usize,
    small_slots: usize,
    writer: RefCell<Option<Waker>>,
    room: RefCell<Vec<Waker>>,
    dead: Cell<bool>,
}

impl Link {
    pub(crate) fn new(id: u64, remote: Remote, stream: SharedStream, capacity: usize) -> Link {
        Link {
            id,
            remote,
            stream,
            queue: RefCell::new(VecDeque::with_capacity(capacity.min(4096))),
            large: Cell::new(0),
            capacity,
            // Only peers: a client's queue holds its capacity of frames, whatever their size.
            small_slots: match remote {
                Remote::Replica(_) => SMALL_FRAME_SLOTS,
                Remote::Client(_) => 1,
            },
            writer: RefCell::new(None),
            room: RefCell::new(Vec::new()),
            dead: Cell::new(false),
        }
    }

    /// Queues a frame; gives it back when the queue is full or the link is dead: `capacity`
    /// large frames, and `small_slots` times that of all frames.
    pub(crate) fn push(&self, frame: Outbound) -> Result<(), Outbound> {
        let large = self.is_large(&frame);
        if self.dead.get() || !self.has_room(large) {
            return Err(frame);
        }
        if large {
            self.large.set(self.large.get() + 1);
        }
        self.queue.borrow_mut().push_back(frame);
        if let Some(waker) = self.writer.borrow_mut().take() {
            waker.wake();
        }
        Ok(())
    }

    pub(crate) fn depth(&self) -> usize {
        self.queue.borrow().len()
    }

    /// Whether the queue takes one more frame, `large` or not.
    fn has_room(&self, large: bool) -> bool {
        self.queue.borrow().len() < self.capacity * self.small_slots
            && (!large || self.large.get() < self.capacity)
    }

    /// Whether `frame` counts against the capacity of large frames (every frame of a
    /// client link does).
    fn is_large(&self, frame: &Outbound) -> bool {
        self.small_slots == 1 || frame.as_bytes().len() > SMALL_FRAME_MAX
    }

    /// Resolves once the queue has room for a large frame or the link is dead.
    pub(crate) async fn room(&self) {
        poll_fn(|cx| {
            if self.dead.get() || self.has_room(true) {
                Poll::Ready(())
            } else {
                let mut room = self.room.borrow_mut();
                if !room.iter().any(|waker| waker.will_wake(cx.waker())) {
                    room.push(cx.waker().clone());
                }
                Poll::Pending
            }
        })
        .await
    }

    fn wake_room(&self) {
        for waker in self.room.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Closes the connection both ways; the reader and writer tasks then end.
    pub(crate) fn kill(&self) {
        if self.dead.replace(true) {
            return;
        }
        if let Ok(stream) = self.stream.try_borrow() {
            stream.shutdown();
        }
        if let Some(waker) = self.writer.borrow_mut().take() {
            waker.wake();
        }
        self.wake_room();
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.get()
    }

    /// Waits for frames; false once the link is dead.
    async fn frames_ready(&self) -> bool {
        poll_fn(|cx| {
            if self.dead.get() {
                Poll::Ready(false)
            } else if !self.queue.borrow().is_empty() {
                Poll::Ready(true)
            } else {
                *self.writer.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

/// Drains the queue in batches of up to max_batch frames, one vectored write each.
pub(crate) async fn write_loop(inner: Rc<Inner>, link: Rc<Link>) {
    let max_batch = inner.config.max_batch;
    let mut batch: Vec<Outbound> = Vec::with_capacity(max_batch);
    while link.frames_ready().await {
        {
            let mut queue = link.queue.borrow_mut();
            let take = queue.len().min(max_batch);
            batch.extend(queue.drain(..take));
            let large = batch.iter().filter(|f| link.is_large(f)).count();
            link.large.set(link.large.get().saturating_sub(large));
            if let Remote::Replica(replica) = link.remote {
                if let Some(stats) = inner.stats.peer(replica) {
                    stats.set_queue_depth(queue.len());
                }
            }
        }
        link.wake_room();
        match write_all_vectored(&link.stream, &batch).await {
            Ok(bytes) => {
                if let Remote::Replica(replica) = link.remote {
                    if let Some(stats) = inner.stats.peer(replica) {
                        stats.add_sent(batch.len() as u64, bytes as u64);
                    }
                }
            }
            Err(_) => {
                drop_frames(&inner, link.remote, batch.len());
                batch.clear();
                link.kill();
                break;
            }
        }
        for frame in batch.drain(..) {
            if let Outbound::Verified(frame) = frame {
                inner.pool.put(frame.into_buf());
            }
        }
    }
    let left = {
        let mut queue = link.queue.borrow_mut();
        let left = queue.len();
        queue.clear();
        link.large.set(0);
        left
    };
    drop_frames(&inner, link.remote, left);
    if let Remote::Replica(replica) = link.remote {
        if let Some(stats) = inner.stats.peer(replica) {
            stats.set_queue_depth(0);
        }
    }
}

fn drop_frames(inner: &Inner, remote: Remote, count: usize) {
    if count == 0 {
        return;
    }
    match remote {
        Remote::Replica(replica) => {
            if let Some(stats) = inner.stats.peer(replica) {
                stats.add_dropped(count as u64);
            }
        }
        Remote::Client(_) => {
            for _ in 0..count {
                inner.stats.add_client_dropped();
            }
        }
    }
}

/// Runs an established replica link until it dies: installs it as the pair's only link
/// (a newer link from the same peer replaces an older one), starts its writer, reads.
pub(crate) async fn run_replica_link(
    inner: Rc<Inner>,
    peer: u8,
    stream: SharedStream,
    mut reader: FrameReader,
) {
    let Some(slot) = inner.peers.get(usize::from(peer)) else {
        return;
    };
    if inner.closed.get() {
        stream.borrow().shutdown();
        return;
    }
    let link = Rc::new(Link::new(
        inner.next_link_id(),
        Remote::Replica(peer),
        stream.clone(),
        inner.config.peer_queue_capacity,
    ));
    if let Some(old) = slot.borrow_mut().replace(link.clone()) {
        inner.stats.link_failure(super::stats::reasons::REPLACED);
        old.kill();
    }
    if let Some(stats) = inner.stats.peer(peer) {
        stats.set_connected(true);
    }
    inner.handler.on_peer_connected(peer);
    glommio::spawn_local(write_loop(inner.clone(), link.clone())).detach();

    let stats = inner.stats.peer(peer);
    let mut buf = inner.pool.get();
    while !link.is_dead() {
        let info = match reader.read_frame(&stream, &mut buf, &inner.limits).await {
            Ok(info) => info,
            Err(error) => {
                if let Some(reason) = error.reason() {
                    inner.refuse(reason, None, Some(peer));
                }
                break;
            }
        };
        let command = info.command as u8;
        if let Err(error) = replica_plane_admit(false, command) {
            inner.refuse(error.reason(), None, Some(peer));
            break;
        }
        if let Err(error) = check_established_frame(buf.as_bytes(), &inner.local, peer) {
            inner.refuse(error.reason(), None, Some(peer));
            break;
        }
        if let Err(error) = decode(buf.as_bytes(), &inner.limits) {
            // Framing is intact: drop this frame, keep the link (docs/protocol.md,
            // "Frame integrity": a mismatch drops the frame).
            inner.refuse(error.reason(), None, Some(peer));
            continue;
        }
        if let Some(stats) = stats {
            stats.add_received(buf.len() as u64);
        }
        let frame = VerifiedFrame {
            buf: core::mem::replace(&mut buf, inner.pool.get()),
            command: info.command,
            _charge: None,
        };
        inner.handler.on_replica_frame(peer, frame);
    }
    inner.pool.put(buf);
    link.kill();
    let current = slot.borrow().as_ref().map(|l| l.id) == Some(link.id);
    if current {
        slot.borrow_mut().take();
        if let Some(stats) = inner.stats.peer(peer) {
            stats.set_connected(false);
        }
        tracing::info!(peer, "replica link closed");
        inner.handler.on_peer_disconnected(peer);
    }
}

/// Runs a client connection: every frame must be a Request (the client plane gate).
pub(crate) async fn run_client_link(
    inner: Rc<Inner>,
    stream: SharedStream,
    remote: Option<std::net::SocketAddr>,
    mut reader: FrameReader,
) {
    let client = ClientId(inner.next_client.get());
    if let Some(remote) = remote {
        inner.client_remotes.borrow_mut().insert(client, remote);
    }
    inner.next_client.set(client.0 + 1);
    let link = Rc::new(Link::new(
        inner.next_link_id(),
        Remote::Client(client),
        stream.clone(),
        inner.config.peer_queue_capacity,
    ));
    inner.clients.borrow_mut().insert(client, link.clone());
    glommio::spawn_local(write_loop(inner.clone(), link.clone())).detach();

    // Client frames are bounded by the request size limit, not the replica frame limit:
    // a larger header closes the connection before any of its body is read.
    let limits = crate::wire::Limits {
        max_message_size: inner
            .config
            .client_frame_max
            .min(inner.limits.max_message_size),
    };
    let mut buf = inner.pool.get();
    while !link.is_dead() {
        let counted = |error: ReadError| {
            if let Some(reason) = error.reason() {
                inner.stats.reject(reason);
            }
        };
        let info = match reader.read_checked_header(&stream, &mut buf, &limits).await {
            Ok(info) => info,
            Err(error) => {
                counted(error);
                break;
            }
        };
        if let Err(error) = client_plane_admit(info.command as u8) {
            inner.stats.reject(error.reason());
            break;
        }
        let size = info.size as usize;
        let Some(charge) = inner.frame_memory.reserve(size) else {
            // Frame memory is spent: this frame is refused, not buffered; the connection
            // and every other one go on.
            if let Err(error) = reader.skip_rest(&stream, &mut buf, size).await {
                counted(error);
                break;
            }
            inner.stats.reject(reasons::FRAME_MEMORY_LIMIT);
            inner
                .handler
                .on_client_refused(client, buf.as_bytes(), reasons::FRAME_MEMORY_LIMIT);
            continue;
        };
        // The reservation is held while the body arrives: a sender that stalls is cut
        // off rather than allowed to sit on frame memory.
        let body = glommio::timer::timeout(inner.config.client_body_timeout, async {
            Ok(reader.read_rest(&stream, &mut buf, size).await)
        })
        .await;
        match body {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                counted(error);
                break;
            }
            Err(_) => {
                inner.stats.reject(reasons::CLIENT_BODY_TIMEOUT);
                break;
            }
        }
        if let Err(error) = decode(buf.as_bytes(), &limits) {
            inner.stats.reject(error.reason());
            inner.handler.on_client_rejected(client, &error);
            continue;
        }
        let frame = VerifiedFrame {
            buf: core::mem::replace(&mut buf, inner.pool.get()),
            command: info.command,
            _charge: Some(charge),
        };
        inner.handler.on_client_frame(client, frame);
    }
    inner.pool.put(buf);
    link.kill();
    inner.clients.borrow_mut().remove(&client);
    inner.client_remotes.borrow_mut().remove(&client);
    inner.handler.on_client_closed(client);
}
