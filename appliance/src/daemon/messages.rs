//! The messages path of the client plane: where a SendMessages goes (its stream and
//! topic by identifier, its partition by Iggy's partitioning) and what a poll serves
//! (Iggy's PollMessages: the messages of one partition from committed state, cut to
//! the range asked, with auto-commit on the partition's primary); a poll's read handed
//! to the reader threads (polls.rs) or queued, and its reply sent.

use std::rc::Rc;

use replication::bus::ClientId;
use replication::wire::{Frame, Header, Operation, PartitionKey, RequestHeader};

use super::client::{now_us, AUTO_COMMIT_CLIENT};
use super::node::{Event, Node};
use super::partitions::{self, POLL_BYTES_MAX};
use super::polls::{
    caught, start_readers, AutoCommit, Deliver, PollRead, PollReply, QueuedPoll, POLL_QUEUE_MAX,
};
use crate::protocol::reply::{ConsumerOffsetReply, PollRoutingReply};
use crate::protocol::request::{ConsumerRef, Identifier, OffsetTarget, Partitioning};
use crate::protocol::{Consumer, PollStrategy, Status};
use crate::state::partition::{consumer_key, offset_op_body};
use crate::state::Right;
use journal::segment::ReadFrom;

/// Topics whose round-robin position a node keeps for Balanced sends; past this the
/// positions start over (a Balanced send only has to spread, not to alternate exactly).
const BALANCED_TOPICS_MAX: usize = 1 << 16;

impl Node {
    /// The partition a SendMessages names: NotFound when its stream or topic is not in
    /// this node's committed metadata, or the topic has no partitions.
    pub(super) fn send_partition(
        &mut self,
        stream: &Identifier,
        topic: &Identifier,
        partitioning: &Partitioning<'_>,
    ) -> Result<PartitionKey, Status> {
        let (stream_id, topic_id) = self.state.topic_id(stream, topic).ok_or(Status::NotFound)?;
        let partitions = self
            .state
            .topic(stream_id, topic_id)
            .map_or(0, |t| t.partition_count);
        let balanced = &mut self.balanced;
        let next_balanced = || {
            if balanced.len() >= BALANCED_TOPICS_MAX {
                balanced.clear();
            }
            let next = balanced.entry((stream_id, topic_id)).or_insert(0);
            *next = next.wrapping_add(1);
            *next - 1
        };
        let partition = partitioning
            .pick(partitions, next_balanced)
            .ok_or(Status::NotFound)?;
        Ok(PartitionKey {
            stream: stream_id,
            topic: topic_id,
            partition,
        })
    }

    /// The partition and offset key a poll or an offset request names: NotFound for a
    /// stream, topic or group by name that this node's committed metadata does not hold;
    /// FeatureUnavailable for a group member that names no partition.
    pub(super) fn offset_target(
        &self,
        target: &OffsetTarget,
    ) -> Result<(PartitionKey, Consumer), Status> {
        let (stream, topic) = self
            .state
            .topic_id(&target.stream, &target.topic)
            .ok_or(Status::NotFound)?;
        let partition = match (target.partition, &target.consumer) {
            (Some(partition), _) => partition,
            (None, ConsumerRef::Single(_)) => 0,
            // A group member reads the partition assigned to it; assignments are the
            // SDK's own (SyncConsumerGroup), so it must name one.
            (None, ConsumerRef::Group(_)) => {
                self.reject("group_poll_unassigned");
                return Err(Status::FeatureUnavailable);
            }
        };
        let key = PartitionKey {
            stream,
            topic,
            partition,
        };
        let consumer = self
            .consumer_key(&target.consumer, key)
            .ok_or(Status::NotFound)?;
        Ok((key, consumer))
    }

    /// A partition opened from its checkpoint (a start, an installed transfer) applies
    /// the group's journaled ops only once the group is normal again; until it has
    /// applied all the group knows committed, its reads would answer from an earlier end
    /// than it served before, so they are refused as Unavailable (retry). Once caught
    /// up it stays serving: later commits it has yet to apply are reads' ordinary lag.
    fn catching_up(&self, group: u64, stored: &partitions::Partition) -> bool {
        if stored.caught_up.get() {
            return false;
        }
        let Some(replica) = self.groups.get(group) else {
            return false;
        };
        let known = replica.commit().max(replica.commit_max());
        let caught_up = replica.status() == replication::vsr::Status::Normal
            && stored.state.committed_op >= known;
        stored.caught_up.set(caught_up);
        if !caught_up {
            self.reject("read_catching_up");
        }
        !caught_up
    }

    /// Iggy's GetConsumerOffset, from committed state: an empty body when the consumer
    /// stores no offset there.
    pub(super) fn get_consumer_offset(
        &self,
        user: u32,
        target: &OffsetTarget,
    ) -> (Status, Vec<u8>) {
        let (key, consumer, stored) = match self.readable(user, target) {
            Ok(found) => found,
            Err(status) => return (status, Vec::new()),
        };
        match stored.offsets.get(consumer_key(consumer)) {
            Some(offset) => {
                let reply = ConsumerOffsetReply {
                    partition_id: key.partition,
                    current_offset: stored.state.committed_end.saturating_sub(1),
                    stored_offset: offset,
                };
                (Status::Ok, reply.encode())
            }
            None => (Status::Ok, Vec::new()),
        }
    }

    /// What a read of `user` names: its partition, the consumer's offset key and the
    /// partition's storage here; Unavailable while that is still catching up after it
    /// was opened (`catching_up`).
    fn readable(
        &self,
        user: u32,
        target: &OffsetTarget,
    ) -> Result<(PartitionKey, Consumer, &partitions::Partition), Status> {
        let (key, consumer) = self.offset_target(target)?;
        if !self.state.allows(user, key.stream, Right::Read) {
            return Err(Status::PermissionDenied);
        }
        let stored = key
            .pack()
            .ok()
            .and_then(|g| Some((g, self.partitions.by_group.get(&g)?)));
        match stored {
            Some((group, stored)) if self.catching_up(group, stored) => Err(Status::Unavailable),
            Some((_, stored)) => Ok((key, consumer, stored)),
            None => Err(self.missing_partition(key)),
        }
    }

    /// Iggy's GetPollRouting and GetConsumerOffsetRouting: the partition's primary and
    /// the session a connection to it attaches to (the requester's).
    pub(super) fn route(
        &self,
        user: u32,
        target: &OffsetTarget,
        header: &RequestHeader,
    ) -> (Status, Vec<u8>) {
        let key = match self.offset_target(target) {
            Ok((key, _)) => key,
            Err(status) => return (status, Vec::new()),
        };
        if !self.state.allows(user, key.stream, Right::Read) {
            return (Status::PermissionDenied, Vec::new());
        }
        let Some(replica) = key.pack().ok().and_then(|g| self.groups.get(g)) else {
            return (self.missing_partition(key), Vec::new());
        };
        if replica.status() != replication::vsr::Status::Normal {
            // A view change: the primary is not known yet.
            return (Status::Unavailable, Vec::new());
        }
        let primary = replica.config().primary_of(replica.view());
        let reply = PollRoutingReply {
            client: header.client,
            session: header.session,
            metadata_watermark: self.metadata().map_or(0, |m| m.commit()),
            primary: self.cluster_node(primary),
        };
        (Status::Ok, reply.encode())
    }

    /// Iggy's AttachConsumerSession on a logged-in connection: Ok when `session` is
    /// `client`'s session here; Unavailable while this node's metadata commit is below
    /// the watermark the routing reply named (the session may not have arrived yet).
    pub(super) fn attach_status(&self, client: u128, session: u64, watermark: u64) -> Status {
        let Some(metadata) = self.metadata() else {
            return Status::Unavailable;
        };
        if metadata.commit() < watermark {
            self.reject("session_not_committed_here");
            return Status::Unavailable;
        }
        match metadata.clients().get(client) {
            Some(entry) if entry.session == session && session != 0 => Status::Ok,
            _ => {
                self.reject("no_session");
                Status::NoSession
            }
        }
    }

    /// The offset key of a consumer; a group named by name is looked up in the topic.
    fn consumer_key(&self, consumer: &ConsumerRef, key: PartitionKey) -> Option<Consumer> {
        if let ConsumerRef::Group(Identifier::Name(name)) = consumer {
            let topic = self.state.topic(key.stream, key.topic)?;
            return topic
                .groups
                .iter()
                .find(|(_, g)| g.name == *name)
                .map(|(id, _)| Consumer::Group(*id));
        }
        consumer.single_key()
    }

    /// Iggy's PollMessages, from committed state: checked and planned here, read and
    /// answered off the node loop (polls.rs) unless the answer needs no read.
    pub(super) fn poll(
        &mut self,
        request: &RequestHeader,
        user: u32,
        target: &OffsetTarget,
        strategy: PollStrategy,
        count: u32,
        auto_commit: bool,
    ) -> Result<PollRead, (Status, Vec<u8>)> {
        let (key, consumer, stored) = self.readable(user, target).map_err(|s| (s, Vec::new()))?;
        let (partition, group) = (key.partition, key.pack().unwrap_or(0));
        if auto_commit {
            // Storing the offset is a replicated write: only the partition's primary
            // polls with auto_commit.
            if let Some(replica) = self.groups.get(group) {
                let normal = replica.status() == replication::vsr::Status::Normal;
                if !(replica.is_primary() && normal) {
                    let primary = replica.config().primary_of(replica.view());
                    if primary == self.settings.replica {
                        // Recovering or changing views with ourselves next.
                        return Err((Status::Unavailable, Vec::new()));
                    }
                    return Err((Status::NotPrimary, self.not_primary_body(primary)));
                }
            }
        }
        // The log also holds prepared, uncommitted batches: reads stop at the commit
        // point. Reads start at the first retained offset (retention).
        let end = stored.state.committed_end;
        let first = self.state.retained_from(key).max(stored.log.start_offset());
        let from = match strategy {
            PollStrategy::Offset(offset) => offset.max(first),
            PollStrategy::First | PollStrategy::Timestamp(_) => first,
            PollStrategy::Last => end.saturating_sub(u64::from(count)).max(first),
            PollStrategy::Next => stored
                .offsets
                .get(consumer_key(consumer))
                .map_or(0, |o| o + 1)
                .max(first),
        };
        if from >= end || count == 0 {
            return Err((Status::Ok, PollRead::empty_reply(partition, end)));
        }
        let (read_from, serve_from) = match strategy {
            PollStrategy::Timestamp(timestamp) => (ReadFrom::Timestamp(timestamp), None),
            _ => (ReadFrom::Offset(from), Some(from)),
        };
        let plan = match stored.log.read_plan(read_from, end, POLL_BYTES_MAX) {
            Ok(plan) => plan,
            Err(error) => {
                tracing::warn!(?key, %error, "poll read failed");
                return Err((Status::Unavailable, Vec::new()));
            }
        };
        Ok(PollRead {
            reply: self.reply_header(request, Status::Ok),
            plan,
            from: serve_from,
            first,
            end,
            count,
            partition,
            commit: auto_commit.then_some(AutoCommit {
                group,
                user,
                consumer,
            }),
        })
    }

    /// Poll with auto_commit on the partition's primary: prepares StoreConsumerOffset of
    /// the last delivered offset as an internal write of this node's reserved client id
    /// (its reply goes nowhere). It commits after the poll is answered; if the pipeline
    /// is full the offset is not stored (counted) and the next poll stores a later one.
    pub(super) fn auto_commit(&mut self, group: u64, user: u32, consumer: Consumer, offset: u64) {
        let body = offset_op_body(consumer, Some(offset));
        // Request numbers must grow across restarts (the partition's client table
        // outlives the process): microseconds since the epoch, strictly increasing.
        self.auto_commits = now_us().max(self.auto_commits + 1);
        let mut header = RequestHeader::new();
        header.frame.cluster = self.settings.cluster;
        header.client = AUTO_COMMIT_CLIENT - u128::from(self.settings.replica);
        header.request = self.auto_commits;
        // Partition groups deduplicate by client and request alone; the session field
        // only has to be non-zero for a replicated request to decode.
        header.session = u64::MAX;
        header.user_id = user;
        header.operation = Operation::StoreConsumerOffset as u8;
        let frame = Frame::build(&header, &body);
        let Some(replica) = self.groups.get_mut(group) else {
            return;
        };
        if !matches!(
            replica.on_request(frame.as_bytes()),
            replication::vsr::RequestOutcome::Prepared { .. }
        ) {
            self.reject("auto_commit_not_prepared");
        }
    }
}

impl Node {
    /// Starts `read` on a reader thread, or queues it while every reader is busy.
    pub(super) fn start_poll_read(
        &mut self,
        connection: ClientId,
        request: &RequestHeader,
        read: PollRead,
    ) {
        let job = QueuedPoll {
            connection,
            request: Box::new(*request),
            read,
        };
        if self.poll_reads.running < self.poll_reads.readers_max {
            return self.spawn_poll_read(job);
        }
        if self.poll_reads.queued.len() >= POLL_QUEUE_MAX {
            self.reject("poll_queue_full");
            return self.answer(connection, request, Status::Unavailable, &[]);
        }
        self.poll_reads.queued.push_back(job);
    }

    fn spawn_poll_read(&mut self, job: QueuedPoll) {
        self.poll_reads.running += 1;
        if self.poll_reads.readers.is_none() {
            let count = self.poll_reads.readers_max;
            self.poll_reads.readers = start_readers(count, self.poll_deliver());
        }
        let job = match &self.poll_reads.readers {
            Some(readers) => match readers.send(job) {
                Ok(()) => return,
                Err(flume::SendError(job)) => job,
            },
            None => job,
        };
        let read = job.read;
        let done = glommio::executor().spawn_blocking(move || caught(move || read.run()));
        let deliver = self.poll_deliver();
        let (connection, request) = (job.connection, job.request);
        glommio::spawn_local(async move {
            deliver(connection, request, Box::new(done.await));
        })
        .detach();
    }

    /// Hands a finished poll read's reply to the node loop, as its event.
    fn poll_deliver(&self) -> Deliver {
        let events = self.events.clone();
        Rc::new(move |connection, request, reply| {
            let _ = events.try_send(Event::PollRead {
                connection,
                request,
                reply,
            });
        })
    }

    /// A poll read finished: stores the offset (auto_commit), answers, and starts the
    /// next queued read.
    pub(super) fn on_poll_read(
        &mut self,
        connection: ClientId,
        request: &RequestHeader,
        reply: PollReply,
    ) {
        self.poll_reads.running = self.poll_reads.running.saturating_sub(1);
        while self.poll_reads.running < self.poll_reads.readers_max {
            let Some(next) = self.poll_reads.queued.pop_front() else {
                break;
            };
            if self.connections.contains_key(&next.connection) {
                self.spawn_poll_read(next);
            }
        }
        if reply.invalid {
            self.reject("segment_batch_invalid");
        }
        if reply.panicked {
            self.reject("poll_read_panicked");
        }
        if let Some(error) = &reply.error {
            tracing::warn!(%error, "poll read failed");
        }
        if !self.connections.contains_key(&connection) {
            return; // closed meanwhile
        }
        if let (Some(commit), Some(last)) = (reply.commit, reply.last) {
            self.auto_commit(commit.group, commit.user, commit.consumer, last);
        }
        match reply.frame {
            Some(frame) => {
                let _ = self.bus.send_to_client(connection, frame);
            }
            None => self.answer(connection, request, reply.status, &[]),
        }
    }
}
