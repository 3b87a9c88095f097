//! Client requests on the primary (docs/client-protocol.md, "Sessions"): the client
//! table answers retries, new requests become prepares, replies are built from the
//! committed prepare.

use crate::wire::batch;
use crate::wire::decode::check_request;
use crate::wire::registry::{EvictionReason, PROTOCOL_VERSION};
use crate::wire::{
    decode, EvictionHeader, Frame, FrameBuf, Header, Message, Operation, PrepareHeader,
    ReplyHeader, RequestHeader, HEADER_SIZE, METADATA_GROUP,
};

use super::client_table::Lookup;
use super::replica::{Replica, RequestOutcome, Status};
use super::Action;

impl Replica {
    /// A client request (RequestHeader frame, 16-byte aligned). Only the primary of a
    /// normal view prepares; retries are answered from the client table.
    pub fn on_request(&mut self, bytes: &[u8]) -> RequestOutcome {
        let (request, body) = match decode(bytes, &self.limits) {
            Ok(Message::Request(h, body)) => (*h, body),
            _ => return RequestOutcome::Rejected,
        };
        let Some(operation) = Operation::from_u8(request.operation) else {
            return RequestOutcome::Rejected;
        };
        self.request(request, operation, body)
    }

    /// As `on_request`, for a request the driver holds as a header and a body apart
    /// (e.g. renumbered after the client's frame was verified): the body is not copied
    /// into a request frame first. The header's field rules are checked as decode does.
    pub fn on_request_parts(&mut self, request: &RequestHeader, body: &[u8]) -> RequestOutcome {
        let size = HEADER_SIZE as u64 + body.len() as u64;
        if check_request(request).is_err() || size > u64::from(self.limits.max_message_size) {
            return RequestOutcome::Rejected;
        }
        let Some(operation) = Operation::from_u8(request.operation) else {
            return RequestOutcome::Rejected;
        };
        self.request(*request, operation, body)
    }

    /// A client request whose operation and body the driver's state machine already
    /// prepared (docs/protocol.md, "Replication": metadata bodies hold the server-prepared
    /// payload, e.g. CreateTopic travels as CreateTopicWithAssignments). Session and
    /// retry handling use the request header; the prepare carries `operation` and `body`.
    pub fn on_request_prepared(
        &mut self,
        bytes: &[u8],
        operation: Operation,
        body: &[u8],
    ) -> RequestOutcome {
        let mut request = match decode(bytes, &self.limits) {
            Ok(Message::Request(h, _)) => *h,
            _ => return RequestOutcome::Rejected,
        };
        // Register and Logout change the client table: they cannot be re-labelled.
        let session_op = |o: u8| o == Operation::Register as u8 || o == Operation::Logout as u8;
        if session_op(request.operation) != session_op(operation as u8) {
            return RequestOutcome::Rejected;
        }
        request.operation = operation as u8;
        self.request(request, operation, body)
    }

    fn request(
        &mut self,
        request: RequestHeader,
        operation: Operation,
        body: &[u8],
    ) -> RequestOutcome {
        let plane_ok = match operation.plane() {
            crate::wire::Plane::Metadata => self.config.group == METADATA_GROUP,
            crate::wire::Plane::Partition => self.config.group != METADATA_GROUP,
            crate::wire::Plane::None => false,
        };
        if !plane_ok {
            return RequestOutcome::Rejected;
        }
        if self.status != Status::Normal || !self.is_primary() {
            return RequestOutcome::NotPrimary {
                primary: self.config.primary_of(self.view),
            };
        }
        if self.formation_wait.0 != 0 {
            // A new group prepares once a quorum of its members formed it (replacement.rs).
            return RequestOutcome::PipelineFull;
        }
        if operation == Operation::Register {
            if self.in_pipeline(request.client, 0) {
                return RequestOutcome::InProgress;
            }
            // A retried Register (no request since) is answered from the table; a client
            // that registers again after requests lost its session and gets a new one.
            if let Some(session) = self.clients.get(request.client) {
                if session.request == 0 {
                    if !session.applied {
                        return RequestOutcome::InProgress;
                    }
                    let frame = session.reply.clone();
                    self.actions.push_back(Action::Reply {
                        client: request.client,
                        frame,
                    });
                    return RequestOutcome::Replied;
                }
            }
        } else {
            let lookup = if self.config.group == METADATA_GROUP {
                self.clients
                    .lookup(request.client, request.session, request.request)
            } else {
                self.clients.lookup_request(request.client, request.request)
            };
            match lookup {
                Lookup::Fresh => {}
                Lookup::Replied(reply) => {
                    let frame = reply.clone();
                    self.actions.push_back(Action::Reply {
                        client: request.client,
                        frame,
                    });
                    return RequestOutcome::Replied;
                }
                Lookup::Applying => return RequestOutcome::InProgress,
                Lookup::Stale => return RequestOutcome::Stale,
                Lookup::NoSession => {
                    if self.in_pipeline(request.client, 0) {
                        return RequestOutcome::InProgress;
                    }
                    self.evict(request.client, EvictionReason::NoSession);
                    return RequestOutcome::Evicted;
                }
            }
            if self.in_pipeline(request.client, request.request) {
                return RequestOutcome::InProgress;
            }
        }
        if self.log.op - self.commit >= self.config.pipeline_max {
            return RequestOutcome::PipelineFull;
        }
        self.prepare(&request, body)
    }

    pub(crate) fn in_pipeline(&self, client: u128, request: u64) -> bool {
        self.pipeline.keys().any(|op| {
            self.log
                .header(*op)
                .is_some_and(|h| h.client == client && h.request == request)
        })
    }

    pub(crate) fn evict(&mut self, client: u128, reason: EvictionReason) {
        let mut header = EvictionHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.client = client;
        header.server_protocol_version = PROTOCOL_VERSION;
        header.server_protocol_version_min = PROTOCOL_VERSION;
        header.reason = reason as u8;
        let frame = Frame::build(&header, &[]);
        self.actions.push_back(Action::Evict { client, frame });
    }

    fn prepare(&mut self, request: &RequestHeader, body: &[u8]) -> RequestOutcome {
        let op = self.log.op + 1;
        let Some(parent) = self.log.identity(self.log.op) else {
            return RequestOutcome::PipelineFull;
        };
        let timestamp = self.now.max(self.timestamp_last + 1);
        // The prepare's buffer, body in place: a batch is stamped there, not copied twice.
        // Every byte is written: the body here, the header by `Frame::build_in`.
        let mut buf = FrameBuf::for_overwrite(HEADER_SIZE + body.len());
        buf.as_bytes_mut()[HEADER_SIZE..].copy_from_slice(body);
        if request.operation == Operation::SendMessages as u8 {
            let Some(position) = self.positions.get(&self.log.op).copied() else {
                return RequestOutcome::PipelineFull;
            };
            let base_timestamp = timestamp.max(position.last_timestamp);
            // The driver verified the batch at ingress; stamping rewrites header fields
            // and the batch checksum over the message checksums, so it stays verified.
            if batch::stamp(
                &mut buf.as_bytes_mut()[HEADER_SIZE..],
                position.partition_id,
                position.next_offset,
                base_timestamp,
            )
            .is_err()
            {
                return RequestOutcome::Rejected;
            }
        }
        self.timestamp_last = timestamp;
        let mut header = PrepareHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.client = request.client;
        header.parent = parent;
        header.request_checksum = request.request_checksum;
        header.op = op;
        header.commit = self.commit;
        header.timestamp = timestamp;
        header.request = request.request;
        header.operation = request.operation;
        header.group = self.config.group;
        header.user_id = request.user_id;
        let frame = Frame::build_in(&header, buf);
        self.note_position(op, &frame);
        self.log.append(frame.clone());
        if self.pipeline.is_empty() {
            self.progress_tick = self.now;
        }
        self.pipeline.insert(
            op,
            super::replica::Pending {
                acks: 0,
                sent_at: self.now,
                prepared_at: self.now,
            },
        );
        self.actions.push_back(Action::JournalAppend {
            op,
            frame: frame.clone(),
        });
        self.send_chain(frame);
        RequestOutcome::Prepared { op }
    }

    pub(crate) fn build_reply(&self, prepare: &PrepareHeader) -> ReplyHeader {
        let mut header = ReplyHeader::new();
        header.frame.cluster = self.config.cluster;
        header.frame.view = self.view;
        header.frame.replica = self.config.replica;
        header.request_checksum = prepare.request_checksum;
        header.client = prepare.client;
        header.op = prepare.op;
        header.commit = prepare.op;
        header.timestamp = prepare.timestamp;
        header.request = prepare.request;
        header.operation = prepare.operation;
        header
    }
}
