//! Committed ops applied to the node's state (the metadata state machine, a partition's
//! segment log and consumer offsets) and their results handed back to the group's core,
//! which seals each reply and keeps it in the client table; the reply goes to the client
//! waiting for it, in the client's own operation and request number.

use replication::vsr::{Applied, Status as VsrStatus};
use replication::wire::{
    Frame, Operation, PartitionKey, PrepareHeader, ReplyHeader, METADATA_GROUP,
};
use zerocopy::FromBytes;

use super::DaemonError;
use crate::node_core::pending::Prepared;
use crate::protocol::reply::{with_result_section, RegisterReply};
use crate::protocol::users::RawTokenReply;
use crate::protocol::Status;
use crate::state::partition::Effect;
use crate::state::{Caller, MetadataOp};

use super::node::{Node, PARTITION_START_BUDGET};

impl Node {
    pub(super) async fn commit_metadata(
        &mut self,
        op: u64,
        prepare: &Frame,
    ) -> Result<(), DaemonError> {
        let Ok((header, _)) = PrepareHeader::read_from_prefix(prepare.as_bytes()) else {
            return Err(not_a_prepare(METADATA_GROUP, op));
        };
        let body = prepare.as_bytes().get(256..).unwrap_or(&[]);
        let (status, reply_body) = match Operation::from_u8(header.operation) {
            Some(Operation::Register) => (
                Status::Ok,
                RegisterReply::of_this_server(header.user_id, op).encode(),
            ),
            Some(Operation::Logout) => {
                // A client that logs out leaves its consumer groups: its partitions go to
                // the members that remain.
                self.state.leave_groups(header.client);
                (Status::Ok, Vec::new())
            }
            Some(operation) => match MetadataOp::decode(operation, body) {
                Ok(metadata_op) => {
                    let caller = Caller {
                        user_id: header.user_id,
                        client: header.client,
                    };
                    let mut applied = self.state.apply(caller, &metadata_op);
                    if let MetadataOp::CreateToken { hash, .. } = &metadata_op {
                        if let Some(token) = self.pending_tokens.take(hash) {
                            if applied.status == Status::Ok {
                                applied.body = RawTokenReply { token }.encode();
                            }
                        }
                    }
                    let truncated: Vec<PartitionKey> = match &metadata_op {
                        MetadataOp::TruncatePartition { partition, .. } => vec![*partition],
                        MetadataOp::Purge { partitions } => {
                            partitions.iter().map(|(key, _)| *key).collect()
                        }
                        _ => Vec::new(),
                    };
                    for partition in truncated {
                        self.on_retention_commit(partition);
                        if let Ok(group) = partition.pack() {
                            self.delete_retained(group)?;
                        }
                    }
                    (applied.status, applied.body)
                }
                Err(error) => {
                    // Every replica decodes the same bytes the same way: a refusal here
                    // is deterministic and leaves the state unchanged everywhere.
                    tracing::error!(op, %error, "committed metadata op does not decode");
                    (Status::InvalidRequest, Vec::new())
                }
            },
            None => (Status::InvalidRequest, Vec::new()),
        };
        self.on_applied(
            METADATA_GROUP,
            op,
            (header.operation, header.request),
            status,
            reply_body,
        );
        self.metadata_applied = op;
        self.partitions_pending = true;
        self.sync_partitions(PARTITION_START_BUDGET).await
    }

    pub(super) async fn commit_partition(
        &mut self,
        group: u64,
        op: u64,
        prepare: &Frame,
    ) -> Result<(), DaemonError> {
        let Ok((header, _)) = PrepareHeader::read_from_prefix(prepare.as_bytes()) else {
            return Err(not_a_prepare(group, op));
        };
        if !self.partitions.by_group.contains_key(&group) {
            self.on_applied(
                group,
                op,
                (header.operation, header.request),
                Status::NotFound,
                Vec::new(),
            );
            return Ok(());
        }
        // Normally journaled at prepare time (its write may still be in flight: reads
        // serve what is committed, so it lands first); an op whose append was deferred
        // (a gap) is journaled now, in order, before it is applied.
        self.wait_written(group, op).await?;
        if !self.journaled(group, op, prepare.checksum())
            && self.partition_journal(group, op, prepare).await?.is_none()
        {
            return Err(DaemonError::Internal {
                group,
                op: Some(op),
                detail: "the committed op cannot be journaled",
            });
        }
        let Some(partition) = self.partitions.by_group.get_mut(&group) else {
            return Ok(());
        };
        let body = prepare.as_bytes().get(256..).unwrap_or(&[]);
        let key = partition.key;
        let applied = partition
            .state
            .apply(key, op, header.operation, body, &partition.offsets)
            .map_err(|source| DaemonError::Batch {
                group,
                op,
                what: "committed batch",
                source,
            })?;
        let offsets_failed = DaemonError::journal(group, Some(op), "consumer offsets");
        match applied.effect {
            Effect::None => {}
            Effect::StoreOffset { consumer, offset } => {
                partition
                    .offsets
                    .store(consumer, offset)
                    .map_err(offsets_failed)?;
            }
            Effect::DeleteOffset { consumer } => {
                partition.offsets.delete(consumer).map_err(offsets_failed)?;
            }
        }
        if is_offset_op(header.operation) {
            self.partitions.unsynced.insert(group);
            self.partitions.grown = true;
        }
        let (status, reply_body) = (applied.status, applied.body);
        self.on_applied(
            group,
            op,
            (header.operation, header.request),
            status,
            reply_body,
        );
        // Committed prepares are in the segment log now: keep only a repair window of
        // them in memory (older ones are answered RangeEvicted).
        let ops_min = self.settings.vsr.pipeline_max + 1;
        let bytes = prepare.as_bytes().len() as u64;
        for (group, floor) in self.repair_windows.push(group, op, bytes, ops_min) {
            if let Some(replica) = self.groups.get_mut(group) {
                let floor = floor.min(replica.commit());
                if floor > replica.log().op_min() {
                    replica.on_checkpoint(floor);
                }
            }
        }
        Ok(())
    }

    /// Hands a committed op's result to its group's core (every committed op, in
    /// order): the core seals the reply with it, in the client's terms (its own
    /// operation's wire code and request number), and keeps it in the client table for
    /// retries (checkpointed with the table). The primary sends the reply; a backup
    /// sends it only to a client waiting on this node for that very request, one this
    /// node took as the primary of an earlier view (replaced while the client waited,
    /// the write committed in the new view). The body is the operation's result section.
    /// A token's secret is not kept (a retry gets the status alone).
    fn on_applied(
        &mut self,
        group: u64,
        op: u64,
        (operation, request): (u8, u64),
        status: Status,
        body: Vec<u8>,
    ) {
        let operation = client_operation(operation);
        let body = if status == Status::Ok {
            with_result_section(operation, &body).into_owned()
        } else {
            body
        };
        let request = client_request(group, request);
        let applied = Applied {
            status: status.wire_code(operation),
            body: &body,
            keep_body: operation != Operation::CreatePersonalAccessToken as u8,
            reply_as: Some((operation, request)),
        };
        let Some(replica) = self.groups.get_mut(group) else {
            return;
        };
        let primary = replica.is_primary() && replica.status() == VsrStatus::Normal;
        let reply = replica.seal_applied(op, applied);
        // The reply carries the client's own request number, sealed just above.
        let carried = reply.as_ref().map(|(client, _)| (*client, request));
        let discarded = self.prepared_requests.applied(group, op, carried);
        self.answer_discarded(group, discarded);
        if let Some((client, frame)) = reply {
            self.deliver(group, client, frame, primary);
        }
    }

    /// Answers Unavailable the requests prepared here that a view change discarded,
    /// where their client still waits for them: it retries at once, under the same
    /// number.
    pub(super) fn answer_discarded(&mut self, group: u64, discarded: Vec<Prepared>) {
        for Prepared { connection, header } in discarded {
            let Some(entry) = self.connections.get_mut(&connection) else {
                continue;
            };
            if entry.pending.get(&header.client) != Some(&header.request) {
                continue;
            }
            entry.pending.remove(&header.client);
            self.request_started.remove(&(group, header.client));
            tracing::debug!(
                group,
                client = header.client,
                request = header.request,
                "a request prepared here was discarded by a view change"
            );
            self.answer(connection, &header, Status::Unavailable, &[]);
        }
    }

    /// A reply of the core, as the primary sends it (a retry's copy from the client
    /// table): see `deliver`.
    pub(super) fn send_reply(&mut self, group: u64, client: u128, frame: Frame) {
        self.deliver(group, client, client_reply(group, frame), true);
    }

    /// A reply in the client's numbering, to the client waiting for it on this node
    /// (its request's latency recorded); on the primary, a forwarded session's result
    /// goes back to the backup that forwarded it instead.
    fn deliver(&mut self, group: u64, client: u128, frame: Frame, primary: bool) {
        if primary && group == METADATA_GROUP && self.forward_reply(client, &frame) {
            return;
        }
        if let Some(at) = self.request_started.remove(&(group, client)) {
            let _ = self
                .latencies
                .request
                .record(at.elapsed().as_micros() as u64);
        }
        self.reply_to_waiting(client, frame);
    }

    /// Sends a reply only where the client waits for it: on its connection with that
    /// request pending. A commit reached while the request is only on its way (a new
    /// primary committing the old view's pipeline) is not sent: the request, when it
    /// arrives, gets the client table's copy, the one reply the client reads for it. Sent
    /// twice, the second would be read as the answer to the client's next request.
    fn reply_to_waiting(&mut self, client: u128, frame: Frame) {
        let Ok((header, _)) = ReplyHeader::read_from_prefix(frame.as_bytes()) else {
            return;
        };
        let waiting = self
            .client_connections
            .get(&client)
            .and_then(|connection| self.connections.get(connection))
            .is_some_and(|entry| entry.pending.get(&client) == Some(&header.request));
        if waiting {
            self.send_to_client(client, frame);
        }
    }

    pub(super) fn send_to_client(&mut self, client: u128, frame: Frame) {
        if let Some(connection) = self.client_connections.get(&client) {
            if let Some(entry) = self.connections.get_mut(connection) {
                entry.pending.remove(&client);
            }
            let _ = self.bus.send_to_client(*connection, frame);
        }
    }
}

/// A committed frame of `group` at `op` that is not a prepare.
fn not_a_prepare(group: u64, op: u64) -> DaemonError {
    DaemonError::Corrupt {
        group,
        op: Some(op),
        detail: "the committed frame is not a prepare".into(),
    }
}

/// Whether a partition group's `operation` writes the consumer offsets.
fn is_offset_op(operation: u8) -> bool {
    operation == Operation::StoreConsumerOffset as u8
        || operation == Operation::DeleteConsumerOffset as u8
}

/// A reply from the client table as the client reads it: sealed in the client's terms
/// already (`on_applied`), it goes as it is; one sealed in the core's (a table written
/// by an older build, an op whose result never came back) is sealed again with the
/// client's own operation and request number.
fn client_reply(group: u64, frame: Frame) -> Frame {
    let Ok((mut header, body)) = ReplyHeader::read_from_prefix(frame.as_bytes()) else {
        return frame;
    };
    let (operation, request) = (
        client_operation(header.operation),
        client_request(group, header.request),
    );
    if (operation, request) == (header.operation, header.request) {
        return frame;
    }
    header.operation = operation;
    header.request = request;
    Frame::build(&header, body)
}

/// The client's own number of a request the core of `group` numbered (the core numbers
/// a partition's requests per session).
fn client_request(group: u64, request: u64) -> u64 {
    if group == METADATA_GROUP {
        request
    } else {
        super::client::client_request_number(request)
    }
}

/// The client-facing operation of a prepared one (docs/protocol.md, "Replication": the
/// primary replaces some requests with internal operations).
fn client_operation(operation: u8) -> u8 {
    match Operation::from_u8(operation) {
        Some(Operation::CreateTopicWithAssignments) => Operation::CreateTopic as u8,
        Some(Operation::CreatePartitionsWithAssignments) => Operation::CreatePartitions as u8,
        Some(Operation::TruncatePartition) => Operation::DeleteSegments as u8,
        _ => operation,
    }
}
