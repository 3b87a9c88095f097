//! The many-group simulator's clients: a few keep their partition group busy, the rest
//! send a rare request to an idle group; each retries unchanged until answered.

use super::{ManyCluster, CLIENT_RETRY_TICKS};
use crate::sim::cluster::{check_reply_result, one_message_batch, request_frame};
use crate::sim::network::{Node, Packet};
use crate::wire::{decode, FrameBuf, Header, Limits, Message, Operation, RequestHeader};

#[derive(Clone, Debug)]
pub(super) struct Client {
    pub(super) group: u64,
    pub(super) id: u128,
    pub(super) busy: bool,
    pub(super) request_last: u64,
    pub(super) outstanding: Option<FrameBuf>,
    /// Requests to send (an idle group's client sends one when told).
    pub(super) wanted: u64,
    pub(super) sent_at: u64,
    pub(super) target: u8,
    /// A backup named the primary: the request goes there on the next tick.
    pub(super) redirected: bool,
}

impl ManyCluster {
    pub(super) fn clients_tick(&mut self) {
        let n = self.options.replica_count;
        for c in 0..self.clients.len() {
            let client = &self.clients[c];
            let due = match &client.outstanding {
                None => client.wanted > 0 || (client.busy && self.clients_on),
                Some(_) => client.redirected || self.now - client.sent_at >= CLIENT_RETRY_TICKS,
            };
            if !due {
                continue;
            }
            if self.clients[c].outstanding.is_none() {
                let frame = self.client_request(c);
                let client = &mut self.clients[c];
                client.wanted = client.wanted.saturating_sub(1);
                client.outstanding = Some(frame);
            } else if !self.clients[c].redirected {
                // A retry goes to the next node (a client rotates past a dead one).
                self.clients[c].target = (self.clients[c].target + 1) % n;
            }
            self.clients[c].redirected = false;
            let client = &mut self.clients[c];
            client.sent_at = self.now;
            let packet = Packet {
                from: Node::Client(c as u16),
                to: Node::Replica(client.target),
                bytes: client.outstanding.clone().expect("set above"),
            };
            self.network.send(self.now, packet, &mut self.prng);
        }
    }

    pub(super) fn client_request(&mut self, c: usize) -> FrameBuf {
        let now = self.now;
        let client = &mut self.clients[c];
        client.request_last += 1;
        let request = client.request_last;
        let mut header = RequestHeader::new();
        header.client = client.id;
        header.session = 1;
        header.request = request;
        header.operation = Operation::SendMessages as u8;
        let body = one_message_batch(client.id, request, now);
        request_frame(header, &body, now)
    }

    pub(super) fn client_receive(&mut self, c: u16, bytes: FrameBuf) -> Result<(), String> {
        let c = usize::from(c);
        match decode(bytes.as_bytes(), &Limits::default()) {
            Ok(Message::Reply(reply, body)) => {
                let client = &mut self.clients[c];
                if client.outstanding.is_none()
                    || reply.client != client.id
                    || reply.request != client.request_last
                {
                    return Ok(());
                }
                check_reply_result(reply, body)?;
                client.outstanding = None;
                client.target = reply.frame.replica;
                let (group, id, request, op) = (client.group, client.id, reply.request, reply.op);
                let checker = self.checkers.get_mut(&group).expect("every group");
                checker
                    .on_reply(id, request, op)
                    .map_err(|e| format!("group {group:x}: {e}"))?;
                self.log(|| format!("group {group:x} reply request {request} op {op}"));
                Ok(())
            }
            // A partition group's sessions never expire here; an eviction leaves the
            // request outstanding (retried).
            Ok(Message::Eviction(_)) => Ok(()),
            _ => Err(format!("client {c} received an invalid frame")),
        }
    }
}
