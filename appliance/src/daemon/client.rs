//! The client plane (docs/client-protocol.md): login against committed metadata, then
//! replicated requests handed to the group's primary (metadata requests prepared by the
//! state machine first), and reads served from committed state only.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use replication::bus::{ClientId, VerifiedFrame};
use replication::vsr::RequestOutcome;
use replication::wire::{
    batch, Frame, Header, Operation, PartitionKey, ReplyHeader, RequestHeader, METADATA_GROUP,
};

use super::node::Node;
use crate::node_core::pending::Prepared;
use crate::protocol::codec::Writer;
use crate::protocol::options::{self, OptionRefusal, TopicOptions};
use crate::protocol::reply::with_result_section;
use crate::protocol::{ClientRequest, Status};
use crate::state::{auth, Caller, MetadataOp, Right};

/// Client ids of the internal auto-commit writes: this minus the replica id.
pub const AUTO_COMMIT_CLIENT: u128 = u128::MAX;

/// The client plane's limits ([limits] of the config); the bus enforces the rest
/// (connections, request size, frame memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// limits.requests_in_flight_per_session: password checks plus replicated requests
    /// awaiting their reply, per connection.
    pub requests_in_flight_per_session: u32,
    /// limits.sessions_max: sessions in the client table; a Register beyond is refused.
    pub sessions_max: u32,
}

/// The config key a refusal label stands for (the body of a LimitReached reply).
fn limit_key(reason: &'static str) -> &'static str {
    match reason {
        "frame_memory_limit" => "limits.frame_memory_max",
        "requests_in_flight_limit" => "limits.requests_in_flight_per_session",
        "session_limit" => "limits.sessions_max",
        other => other,
    }
}

/// The request number a partition group's core sees for `request` of `session`.
pub fn partition_request_number(session: u32, request: u32) -> u64 {
    (u64::from(session) << 32) | u64::from(request)
}

/// The client's own request number back from `partition_request_number`'s.
pub fn client_request_number(numbered: u64) -> u64 {
    numbered & u64::from(u32::MAX)
}

pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Node {
    /// A reply the client plane builds itself (errors, reads, redirects).
    pub(super) fn reply(&self, request: &RequestHeader, status: Status, body: &[u8]) -> Frame {
        let header = self.reply_header(request, status);
        match status {
            Status::PipelineFull => {
                Frame::build(&header, crate::protocol::status::PIPELINE_FULL_REASON)
            }
            Status::Ok => Frame::build(&header, &with_result_section(request.operation, body)),
            _ => Frame::build(&header, body),
        }
    }

    /// The header of this node's reply to `request`.
    pub(super) fn reply_header(&self, request: &RequestHeader, status: Status) -> ReplyHeader {
        let mut header = ReplyHeader::new();
        header.frame.cluster = self.settings.cluster;
        header.frame.replica = self.settings.replica;
        header.frame.view = self.metadata().map_or(0, |r| r.view());
        header.request_checksum = request.request_checksum;
        header.client = request.client;
        header.request = request.request;
        header.operation = request.operation;
        header.timestamp = request.timestamp;
        header.status = status.wire_code(request.operation);
        header
    }

    pub(super) fn answer(
        &self,
        connection: ClientId,
        request: &RequestHeader,
        status: Status,
        body: &[u8],
    ) {
        let frame = self.reply(request, status, body);
        let _ = self.bus.send_to_client(connection, frame);
    }

    fn invalid(&self, connection: ClientId, request: &RequestHeader, reason: &'static str) {
        self.reject(reason);
        self.answer(
            connection,
            request,
            Status::InvalidRequest,
            reason.as_bytes(),
        );
    }

    /// Answers a request a limit refused: LimitReached, the body naming the key.
    pub(super) fn refuse_limit(
        &self,
        connection: ClientId,
        header: &RequestHeader,
        reason: &'static str,
    ) {
        self.answer(
            connection,
            header,
            Status::LimitReached,
            limit_key(reason).as_bytes(),
        );
    }

    /// A Request the bus refused before reading its body (it counted it already).
    pub(super) fn on_client_refused(
        &self,
        connection: ClientId,
        header: &RequestHeader,
        reason: &'static str,
    ) {
        self.refuse_limit(connection, header, reason);
    }

    /// Whether one more request that stays in flight (a login, a replicated request of
    /// a client id with none pending) fits limits.requests_in_flight_per_session;
    /// refused and counted when not.
    pub(super) fn admit_in_flight(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        login: bool,
    ) -> bool {
        let limit = self.settings.client_limits.requests_in_flight_per_session as usize;
        let Some(entry) = self.connections.get(&connection) else {
            return true;
        };
        if !login && entry.pending.contains_key(&header.client) {
            return true; // a retry or the next request of the same session
        }
        if entry.logins as usize + entry.pending.len() < limit {
            return true;
        }
        self.reject("requests_in_flight_limit");
        self.refuse_limit(connection, header, "requests_in_flight_limit");
        false
    }

    pub(super) fn on_client_frame(&mut self, connection: ClientId, frame: &VerifiedFrame) {
        let Some(header) = frame.header::<RequestHeader>().copied() else {
            self.reject("client_not_a_request");
            return;
        };
        let body = frame.body();
        if header.client == 0 {
            return self.invalid(connection, &header, "client_id_zero");
        }
        let Some(operation) = Operation::from_u8(header.operation) else {
            return self.invalid(connection, &header, "unknown_operation");
        };
        if operation.is_internal() {
            return self.invalid(connection, &header, "internal_operation");
        }
        let request = match ClientRequest::decode(operation, header.read_command, body) {
            Ok(request) => request,
            Err(error) => {
                self.reject("request_body_invalid");
                let reason = error.to_string();
                return self.answer(
                    connection,
                    &header,
                    Status::InvalidRequest,
                    reason.as_bytes(),
                );
            }
        };
        match &request {
            ClientRequest::Ping => return self.answer(connection, &header, Status::Ok, &[]),
            ClientRequest::Unsupported { .. } => {
                self.reject("command_unsupported");
                return self.answer(connection, &header, Status::FeatureUnavailable, &[]);
            }
            _ => {}
        }
        if self.on_login_request(connection, &header, &request) {
            return;
        }
        let entry = self.connections.entry(connection).or_default();
        let Some(user) = entry.user else {
            self.reject("unauthenticated");
            return self.answer(connection, &header, Status::Unauthenticated, &[]);
        };
        if !self.state.is_active(user) {
            // The user was deleted or deactivated after this connection logged in: its
            // session ends.
            entry.user = None;
            self.reject("user_deleted");
            return self.answer(
                connection,
                &header,
                Status::Unauthenticated,
                b"the user no longer exists: log in again",
            );
        }
        self.client_connections.insert(header.client, connection);
        self.on_request(connection, &header, user, operation, &request);
    }

    /// A request of a logged-in user of an active account.
    fn on_request(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        operation: Operation,
        request: &ClientRequest<'_>,
    ) {
        let caller = Caller {
            user_id: user,
            client: header.client,
        };
        match request {
            ClientRequest::ClusterMetadata
            | ClientRequest::ClusterNodes
            | ClientRequest::GetStream { .. }
            | ClientRequest::GetStreams
            | ClientRequest::GetTopic { .. }
            | ClientRequest::GetTopics { .. }
            | ClientRequest::GetConsumerGroup { .. }
            | ClientRequest::GetConsumerGroups { .. }
            | ClientRequest::ListStreams
            | ClientRequest::ListTopics { .. }
            | ClientRequest::GetConsumerOffset { .. } => {
                let (status, body) = self.read(user, request);
                self.answer(connection, header, status, &body);
            }
            ClientRequest::PollMessages {
                target,
                strategy,
                count,
                auto_commit,
            } => match self.poll(header, user, target, *strategy, *count, *auto_commit) {
                Ok(read) => self.start_poll_read(connection, header, read),
                Err((status, body)) => self.answer(connection, header, status, &body),
            },
            ClientRequest::GetUser { .. }
            | ClientRequest::GetUsers
            | ClientRequest::GetTokens
            | ClientRequest::GetMe
            | ClientRequest::GetClient { .. }
            | ClientRequest::GetClients
            | ClientRequest::GetStats => {
                let (status, body) = self.user_read(user, connection, request);
                self.answer(connection, header, status, &body);
            }
            ClientRequest::CreateToken { name, expiry } => {
                let (token, hash) = auth::new_token();
                match self
                    .state
                    .prepare_token(caller, name, hash.clone(), *expiry, now_us())
                {
                    Ok(op) => {
                        self.pending_tokens.insert(hash, token);
                        let body = op.encode();
                        self.metadata_request(connection, header, user, op.operation(), &body);
                    }
                    Err(status) => self.answer(connection, header, status, &[]),
                }
            }
            ClientRequest::GetPollRouting { target, .. }
            | ClientRequest::GetConsumerOffsetRouting { target } => {
                let (status, body) = self.route(user, target, header);
                self.answer(connection, header, status, &body);
            }
            ClientRequest::SyncConsumerGroup { group } => {
                let (status, body) = self.group_assignment(user, group, header.client);
                self.answer(connection, header, status, &body);
            }
            ClientRequest::AttachConsumerSession {
                client,
                session,
                metadata_watermark,
            } => {
                let status = self.attach_status(*client, *session, *metadata_watermark);
                self.answer(connection, header, status, &[]);
            }
            ClientRequest::SendMessages { .. }
            | ClientRequest::StoreConsumerOffset { .. }
            | ClientRequest::DeleteConsumerOffset { .. } => {
                self.on_partition_write(connection, header, user, request)
            }
            ClientRequest::Logout => {
                self.metadata_request(connection, header, user, operation, &[]);
            }
            _ => self.on_metadata_write(connection, header, user, caller, request),
        }
    }

    /// A write to a partition (messages, a consumer offset stored or deleted): verified,
    /// routed to its partition's group and proposed there.
    fn on_partition_write(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        request: &ClientRequest<'_>,
    ) {
        match request {
            ClientRequest::SendMessages {
                stream,
                topic,
                partitioning,
                messages_count,
                batch,
            } => {
                let Ok(info) = batch::verify(batch) else {
                    return self.invalid(connection, header, "batch_invalid");
                };
                if info.message_count != *messages_count {
                    return self.invalid(connection, header, "messages_count_mismatch");
                }
                match self.send_partition(stream, topic, partitioning) {
                    Ok(key) => self.partition_request(connection, header, user, key, batch),
                    Err(status) => self.answer_unresolved(connection, header, status),
                }
            }
            ClientRequest::StoreConsumerOffset { target, .. }
            | ClientRequest::DeleteConsumerOffset { target } => {
                let offset = match &request {
                    ClientRequest::StoreConsumerOffset { offset, .. } => Some(*offset),
                    _ => None,
                };
                match self.offset_target(target) {
                    Ok((key, consumer)) => {
                        let prepare = crate::state::partition::offset_op_body(consumer, offset);
                        self.partition_request(connection, header, user, key, &prepare);
                    }
                    Err(status) => self.answer_unresolved(connection, header, status),
                }
            }
            _ => unreachable!("not a partition write"),
        }
    }

    /// Any other request changes metadata: refused on its topic options, its password
    /// work handed to the blocking pool, else prepared by the state machine (with what
    /// only this node's segments know filled in) and sent to the metadata primary.
    fn on_metadata_write(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        caller: Caller,
        request: &ClientRequest<'_>,
    ) {
        if let Some(refusal) = self.topic_options_refusal(request) {
            self.reject("topic_option_refused");
            let key = refusal.key.into_bytes();
            return self.answer(connection, header, refusal.status, &key);
        }
        // A new password's hash (and a current one's check) is Argon2 work:
        // done on the blocking pool, never on the node loop.
        match self.state.password_work(caller, request, now_us()) {
            Ok(Some(work)) => return self.start_password_work(connection, header, user, work),
            Ok(None) => {}
            Err(status) => return self.answer(connection, header, status, &[]),
        }
        let prepared = self.state.prepare(caller, request, now_us());
        // DeleteSegments names a count; the prepare carries the offset it reaches
        // in this node's segments.
        let mut prepared = match (prepared, request) {
            (
                Ok(MetadataOp::TruncatePartition { partition, .. }),
                ClientRequest::DeleteSegments { segments, .. },
            ) => match self.resolve_delete_segments(partition, *segments) {
                Some(first_offset) => Ok(MetadataOp::TruncatePartition {
                    partition,
                    first_offset,
                }),
                None if self.state.partitions().contains(&partition) => {
                    // No sealed, committed segment to delete: nothing to do.
                    return self.answer(connection, header, Status::Ok, &[]);
                }
                None => Err(Status::NotFound),
            },
            (prepared, _) => prepared,
        };
        if let Ok(MetadataOp::Purge { partitions }) = &mut prepared {
            // Everything this node has committed goes.
            for (key, offset) in partitions.iter_mut() {
                let group = key.pack().ok();
                *offset = group
                    .and_then(|g| self.partitions.by_group.get(&g))
                    .map_or(0, |p| p.state.committed_end);
            }
        }
        if let Ok(MetadataOp::CreateTopic { first_primary, .. }) = &mut prepared {
            // With spreading off, node 0 first leads every partition.
            if !self.settings.spread_primaries {
                *first_primary = None;
            }
        }
        match prepared {
            Ok(op) => {
                let body = op.encode();
                self.metadata_request(connection, header, user, op.operation(), &body);
            }
            Err(status) => self.answer(connection, header, status, &[]),
        }
    }

    /// Why a CreateTopic's or UpdateTopic's options are refused, if they are: a key
    /// the appliance does not take, a value it cannot parse, or acks after the write is
    /// on disk ("persisted") where this node's storage does not sync every write.
    fn topic_options_refusal(&self, request: &ClientRequest<'_>) -> Option<OptionRefusal> {
        let (ClientRequest::CreateTopic { options, .. }
        | ClientRequest::UpdateTopic { options, .. }) = request
        else {
            return None;
        };
        let parsed = match TopicOptions::parse(options) {
            Ok(parsed) => parsed,
            Err(refusal) => return Some(refusal),
        };
        let every = |durability| durability == journal::Durability::EveryBatch;
        let unmet = [
            (
                parsed.messages_persisted && !every(self.settings.partition.durability),
                options::DURABILITY,
            ),
            (
                parsed.offsets_persisted && !every(self.settings.offset_durability),
                options::CONSUMER_OFFSET_DURABILITY,
            ),
        ];
        unmet
            .into_iter()
            .find(|(unmet, _)| *unmet)
            .map(|(_, key)| OptionRefusal {
                status: Status::InvalidOptionValue,
                key: key.to_owned(),
            })
    }

    /// The request frame the core sees: the verified user id stamped in, `body` as given.
    fn core_request(header: &RequestHeader, user: u32, body: &[u8]) -> Frame {
        let mut header = *header;
        header.user_id = user;
        Frame::build(&header, body)
    }

    pub(super) fn metadata_request(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        operation: Operation,
        body: &[u8],
    ) {
        if body.len() as u64 > super::METADATA_BODY_MAX {
            return self.invalid(connection, header, "metadata_body_too_large");
        }
        // Below the storage budget the primary creates nothing new (deletions, which
        // free space, and sessions go on).
        let creation = matches!(
            operation,
            Operation::CreateStream
                | Operation::CreateTopicWithAssignments
                | Operation::CreatePartitionsWithAssignments
                | Operation::CreateUser
                | Operation::CreateConsumerGroup
        );
        if creation && self.metadata().is_some_and(|r| r.is_primary()) {
            if let Some(reason) = self.storage_refusal() {
                return self.answer(connection, header, Status::StorageFull, reason.as_bytes());
            }
        }
        if !self.admit_in_flight(connection, header, false) {
            return;
        }
        // Checkpoints keep the ring from filling (node.rs, checkpoint_metadata); should
        // they fall behind (a faulty entry awaiting repair), refuse before the ring would
        // wrap past the checkpoint, keeping a pipeline of room for ops in flight.
        let op = self.metadata().map_or(0, |r| r.op());
        let room = self.settings.vsr.pipeline_max;
        if op + room >= self.data.journal.op_append_max() {
            self.reject("metadata_journal_full");
            return self.answer(
                connection,
                header,
                Status::LimitReached,
                b"storage.journal_size",
            );
        }
        let frame = Self::core_request(header, user, &[]);
        let Some(replica) = self.groups.get_mut(METADATA_GROUP) else {
            return self.answer(connection, header, Status::Unavailable, &[]);
        };
        let outcome = replica.on_request_prepared(frame.as_bytes(), operation, body);
        if let RequestOutcome::NotPrimary { primary } = outcome {
            let session_op = matches!(operation, Operation::Register | Operation::Logout);
            if session_op && primary != self.settings.replica && self.bus.is_connected(primary) {
                // Only the verified identity travels (Session forwarding).
                let mut request = *header;
                request.user_id = user;
                return self.forward_session_op(connection, &request, primary);
            }
        }
        self.outcome(connection, header, METADATA_GROUP, outcome);
    }

    fn partition_request(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        user: u32,
        key: PartitionKey,
        body: &[u8],
    ) {
        let session = self
            .metadata()
            .and_then(|r| r.clients().get(header.client))
            .map(|s| s.session);
        if session != Some(header.session) || header.session == 0 {
            // A session is the op that committed its Register: a node whose metadata
            // commit has not reached it yet is behind, not sure the session is gone.
            let commit = self.metadata().map_or(0, |r| r.commit());
            if session.is_none() && header.session > commit {
                self.reject("session_not_committed_here");
                return self.answer(connection, header, Status::Unavailable, &[]);
            }
            self.reject("no_session");
            return self.answer(connection, header, Status::NoSession, &[]);
        }
        if !self.state.allows(user, key.stream, Right::Write) {
            self.reject("permission_denied");
            return self.answer(connection, header, Status::PermissionDenied, &[]);
        }
        let Ok(group) = key.pack() else {
            return self.invalid(connection, header, "partition_key_invalid");
        };
        // Below the storage budget the primary takes no new messages (offsets are not
        // refused: they take no room). A group a full disk stopped takes none either.
        let primary_here = self.groups.get(group).is_some_and(|r| r.is_primary());
        if header.operation == Operation::SendMessages as u8
            && (primary_here || self.paused.contains_key(&group))
        {
            if let Some(reason) = self.storage_refusal() {
                return self.answer(connection, header, Status::StorageFull, reason.as_bytes());
            }
        }
        if !self.admit_in_flight(connection, header, false) {
            return;
        }
        // Partition prepares carry no session: the core deduplicates by client and
        // request number, so the request number it sees puts the session (an increasing
        // op number) above the client's: a new session's request 1 is newer than any
        // request of an older session, never a retry of it.
        let (Ok(session), Ok(request)) =
            (u32::try_from(header.session), u32::try_from(header.request))
        else {
            self.reject("request_number_too_large");
            return self.answer(connection, header, Status::LimitReached, b"request");
        };
        let mut numbered = *header;
        numbered.request = partition_request_number(session, request);
        numbered.user_id = user;
        if self.partition_starting(key) {
            return self.answer(connection, header, Status::Unavailable, &[]);
        }
        if self.groups.get(group).is_none() {
            return self.answer_unresolved(connection, header, Status::NotFound);
        }
        let Some(replica) = self.groups.get_mut(group) else {
            return self.answer(connection, header, Status::NotFound, &[]);
        };
        let outcome = replica.on_request_parts(&numbered, body);
        self.outcome(connection, header, group, outcome);
    }

    fn track_pending(&mut self, connection: ClientId, header: &RequestHeader) {
        if let Some(entry) = self.connections.get_mut(&connection) {
            entry.pending.insert(header.client, header.request);
        }
    }

    fn outcome(
        &mut self,
        connection: ClientId,
        header: &RequestHeader,
        group: u64,
        outcome: RequestOutcome,
    ) {
        match outcome {
            RequestOutcome::Prepared { op } => {
                self.request_started
                    .insert((group, header.client), Instant::now());
                self.track_pending(connection, header);
                let prepared = Prepared {
                    connection,
                    header: *header,
                };
                self.prepared_requests.insert(group, op, prepared);
            }
            // A cached reply is queued: it goes where the request waits.
            RequestOutcome::InProgress | RequestOutcome::Replied => {
                self.track_pending(connection, header)
            }
            RequestOutcome::Evicted => {}
            RequestOutcome::NotPrimary { primary } => {
                if primary == self.settings.replica {
                    // Recovering or in a view change with ourselves next: retry here.
                    return self.answer(connection, header, Status::Unavailable, &[]);
                }
                let body = self.not_primary_body(primary);
                self.answer(connection, header, Status::NotPrimary, &body);
            }
            RequestOutcome::PipelineFull => {
                self.answer(connection, header, Status::PipelineFull, &[])
            }
            RequestOutcome::Stale => self.answer(connection, header, Status::StaleRequest, &[]),
            RequestOutcome::Rejected => self.invalid(connection, header, "request_rejected"),
        }
    }

    /// Whether this node's NotFound is final: only the metadata primary, which
    /// committed every acknowledged create, knows a stream, topic or partition is gone
    /// (elsewhere the create may not have arrived yet).
    fn metadata_authoritative(&self) -> bool {
        self.metadata().is_some_and(|m| {
            m.is_primary() && m.status() == replication::vsr::Status::Normal && m.op() == m.commit()
        })
    }

    /// Answers a write refused with `status` before it reached a group. A NotFound is
    /// for a stream, topic, partition or group unknown here: gone, or created by
    /// metadata this node has not applied yet. A backup cannot tell (the create may not
    /// even have reached it: a quorum acknowledged it without this node), so only the
    /// metadata primary, which committed every acknowledged create, answers NotFound;
    /// elsewhere the client is told to retry, and its next node may be the primary.
    fn answer_unresolved(&mut self, connection: ClientId, header: &RequestHeader, status: Status) {
        if status == Status::NotFound && !self.metadata_authoritative() {
            self.reject("metadata_behind");
            return self.answer(connection, header, Status::Unavailable, &[]);
        }
        self.answer(connection, header, status, &[]);
    }

    /// The NotPrimary reply body: the primary's id and client address.
    pub(super) fn not_primary_body(&self, primary: u8) -> Vec<u8> {
        let address = self
            .settings
            .client_addresses
            .get(&primary)
            .cloned()
            .unwrap_or_default();
        let mut w = Writer::default();
        w.u8(primary).short_bytes(address.as_bytes());
        w.finish()
    }
}
