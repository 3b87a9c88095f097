//! The simulated clients: each keeps one request outstanding against the primary it
//! believes in, retries it unchanged, and checks that every reply carries the result
//! its op was applied with.

use super::Cluster;
use crate::sim::network::{Node, Packet};
use crate::wire::batch::{BatchBuilder, NewMessage};
use crate::wire::{
    decode, Frame, FrameBuf, Header, Limits, Message, Operation, PrepareHeader, ReplyHeader,
    RequestHeader, METADATA_GROUP,
};

#[derive(Clone, Debug)]
pub(super) struct Client {
    pub(super) id: u128,
    pub(super) session: u64,
    /// The request number of the outstanding request (0 = Register).
    pub(super) request: u64,
    pub(super) request_last: u64,
    pub(super) outstanding: Option<FrameBuf>,
    pub(super) sent_at: u64,
    /// The tick the outstanding request was first sent at.
    pub(super) started_at: u64,
    pub(super) target: u8,
    pub(super) done: u64,
}

const CLIENT_RETRY_TICKS: u64 = 150;

impl Cluster {
    pub(super) fn clients_tick(&mut self) -> Result<(), String> {
        for c in 0..self.clients.len() {
            let client = &self.clients[c];
            let due = match &client.outstanding {
                None => self.clients_on && self.now >= self.clients_idle_until,
                Some(_) => self.now - client.sent_at >= CLIENT_RETRY_TICKS,
            };
            if !due {
                continue;
            }
            if self.clients[c].outstanding.is_none() {
                let frame = self.client_request(c);
                self.clients[c].outstanding = Some(frame);
                self.clients[c].started_at = self.now;
            } else if self.prng.chance(1, 2) {
                let n = self.options.replica_count;
                self.clients[c].target = (self.clients[c].target + 1) % n;
            }
            let client = &mut self.clients[c];
            client.sent_at = self.now;
            let packet = Packet {
                from: Node::Client(c as u16),
                to: Node::Replica(client.target),
                bytes: client.outstanding.clone().expect("set above"),
            };
            self.network.send(self.now, packet, &mut self.prng);
        }
        Ok(())
    }

    fn client_request(&mut self, c: usize) -> FrameBuf {
        let client = &mut self.clients[c];
        let mut header = RequestHeader::new();
        header.client = client.id;
        let body = if client.session == 0 {
            client.request = 0;
            header.operation = Operation::Register as u8;
            Vec::new()
        } else {
            // Request numbers keep growing across sessions, so (client, request) names one
            // request for the checker.
            client.request_last += 1;
            client.request = client.request_last;
            header.session = client.session;
            header.request = client.request;
            if self.options.group == METADATA_GROUP {
                header.operation = Operation::CreateStream as u8;
                let mut body = client.id.to_le_bytes().to_vec();
                body.extend_from_slice(&client.request.to_le_bytes());
                body
            } else {
                header.operation = Operation::SendMessages as u8;
                one_message_batch(client.id, client.request, self.now)
            }
        };
        request_frame(header, &body, self.now)
    }

    pub(super) fn client_receive(&mut self, c: u16, bytes: FrameBuf) -> Result<(), String> {
        let limits = Limits::default();
        let c = usize::from(c);
        match decode(bytes.as_bytes(), &limits) {
            Ok(Message::Reply(reply, body)) => {
                let client = &mut self.clients[c];
                if client.outstanding.is_none() || reply.client != client.id {
                    return Ok(());
                }
                check_reply_result(reply, body)?;
                if client.session == 0 {
                    if reply.operation != Operation::Register as u8 {
                        return Ok(());
                    }
                    client.session = reply.op;
                } else if client.request == 0
                    || reply.request != client.request
                    || reply.operation == Operation::Register as u8
                {
                    return Ok(());
                }
                let (id, request, op) = (client.id, client.request, reply.op);
                if self.options.latency_samples && request != 0 {
                    self.latencies.push(self.now - client.started_at);
                }
                client.outstanding = None;
                client.done += 1;
                client.target = reply.frame.replica;
                if request != 0 {
                    self.checker.on_reply(id, request, op)?;
                }
                self.log(|| format!("client {c} reply request {request} op {op}"));
            }
            Ok(Message::Eviction(eviction)) => {
                let client = &mut self.clients[c];
                if eviction.client == client.id
                    && client.session != 0
                    && self.options.group == METADATA_GROUP
                {
                    // Re-register; the outstanding request is abandoned (never acked).
                    client.session = 0;
                    client.outstanding = None;
                }
            }
            _ => return Err(format!("client {c} received an invalid frame")),
        }
        Ok(())
    }
}

/// A simulated client's SendMessages body: one message whose id and payload name the
/// client's request.
pub(in crate::sim) fn one_message_batch(client: u128, request: u64, now: u64) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(64);
    let payload = request.to_le_bytes();
    builder.push(NewMessage {
        id: client ^ u128::from(request),
        timestamp_delta: 0,
        payload: &payload,
        user_headers: &[],
    });
    builder.finish(now)
}

/// A simulated client's request frame: `header` with its request checksum (standing for
/// the request's identity: client and request number) and timestamp filled in.
pub(in crate::sim) fn request_frame(mut header: RequestHeader, body: &[u8], now: u64) -> FrameBuf {
    header.request_checksum = u128::from(header.request) | (header.client << 64);
    header.timestamp = now;
    Frame::build(&header, body).into_buf()
}

/// The result the simulator's state machine gives an op: a status and a body that
/// name the request, so a client can tell a reply carrying its own result from one
/// without it (an empty body) or with another op's.
pub(in crate::sim) fn applied_result(prepare: &PrepareHeader) -> (u32, Vec<u8>) {
    result_of(prepare.client, prepare.request, prepare.op)
}

fn result_of(client: u128, request: u64, op: u64) -> (u32, Vec<u8>) {
    let mut body = Vec::with_capacity(32);
    body.extend_from_slice(&client.to_le_bytes());
    body.extend_from_slice(&request.to_le_bytes());
    body.extend_from_slice(&op.to_le_bytes());
    ((op % 3) as u32, body)
}

/// A reply must carry the result its op was applied with (retries included, from any
/// replica's client table, after restarts, checkpoints and state transfers).
pub(in crate::sim) fn check_reply_result(reply: &ReplyHeader, body: &[u8]) -> Result<(), String> {
    let (status, expected) = result_of(reply.client, reply.request, reply.op);
    if reply.status != status || body != expected.as_slice() {
        return Err(format!(
            "client {:x} got the reply of request {} at op {} with status {} and a \
             {}-byte body, not the result the op was applied with",
            reply.client,
            reply.request,
            reply.op,
            reply.status,
            body.len()
        ));
    }
    Ok(())
}
