//! Session forwarding (docs/protocol.md, "Session forwarding"): a client may register or
//! log out through a backup. The backup has authenticated the connection; only the
//! verified user id (Register) or the session and request number (Logout) travel to the
//! metadata primary, which prepares the operation as that client and answers with the
//! outcome once it commits. Credentials never cross the replica plane.
//!
//! The backup answers its client once its own metadata commit has reached the result's
//! watermark, so the session it hands out is already in its own client table.

use std::time::Instant;

use replication::bus::{ClientId, VerifiedFrame};
use replication::wire::{
    Command, ForwardLogoutHeader, ForwardLogoutResultHeader, ForwardRegisterHeader,
    ForwardRegisterResultHeader, Frame, Header, Operation, ReplyHeader, RequestHeader,
    METADATA_GROUP,
};
use zerocopy::FromBytes;

use super::node::Node;
use crate::node_core::forward::{Answer, Forwarded, OnResult, Outcome, Pending};
use crate::protocol::reply::RegisterReply;
use crate::protocol::Status;

impl Node {
    /// Backup: sends a Register or Logout to the primary instead of redirecting.
    pub(super) fn forward_session_op(
        &mut self,
        connection: ClientId,
        request: &RequestHeader,
        primary: u8,
    ) {
        let Some(nonce) = self.forwards.begin(connection, *request, Instant::now()) else {
            self.reject("forward_table_full");
            return self.answer(connection, request, Status::Unavailable, &[]);
        };
        let frame = if request.operation == Operation::Logout as u8 {
            let mut header = ForwardLogoutHeader::new();
            header.frame.cluster = self.settings.cluster;
            header.frame.replica = self.settings.replica;
            header.client = request.client;
            header.nonce = nonce;
            header.session = request.session;
            header.request = request.request;
            Frame::build(&header, &[])
        } else {
            let mut header = ForwardRegisterHeader::new();
            header.frame.cluster = self.settings.cluster;
            header.frame.replica = self.settings.replica;
            header.client = request.client;
            header.nonce = nonce;
            header.user_id = request.user_id;
            Frame::build(&header, &[])
        };
        if self.bus.send(primary, frame).is_err() {
            self.forwards.cancel(nonce);
            self.answer(connection, request, Status::Unavailable, &[]);
        }
    }

    /// Handles a session-forwarding frame from a peer; false when `frame` is not one.
    pub(super) fn on_forward_frame(&mut self, peer: u8, frame: &VerifiedFrame) -> bool {
        match frame.command() {
            Command::ForwardRegister => {
                if let Some(h) = frame.header::<ForwardRegisterHeader>().copied() {
                    self.on_forward_register(peer, &h);
                }
            }
            Command::ForwardLogout => {
                if let Some(h) = frame.header::<ForwardLogoutHeader>().copied() {
                    self.on_forward_logout(peer, &h);
                }
            }
            Command::ForwardRegisterResult => {
                if let Some(h) = frame.header::<ForwardRegisterResultHeader>().copied() {
                    self.on_forward_result(h.nonce, h.outcome, h.epoch, h.watermark, false);
                }
            }
            Command::ForwardLogoutResult => {
                if let Some(h) = frame.header::<ForwardLogoutResultHeader>().copied() {
                    self.on_forward_result(h.nonce, h.outcome, 0, h.commit, true);
                }
            }
            _ => return false,
        }
        true
    }

    /// Primary: prepares a backup's Register as its client.
    fn on_forward_register(&mut self, peer: u8, h: &ForwardRegisterHeader) {
        let mut request = RequestHeader::new();
        request.frame.cluster = self.settings.cluster;
        request.client = h.client;
        request.user_id = h.user_id;
        request.operation = Operation::Register as u8;
        self.prepare_forwarded(peer, h.nonce, request, false);
    }

    /// Primary: prepares a backup's Logout as its client.
    fn on_forward_logout(&mut self, peer: u8, h: &ForwardLogoutHeader) {
        let mut request = RequestHeader::new();
        request.frame.cluster = self.settings.cluster;
        request.client = h.client;
        request.session = h.session;
        request.request = h.request;
        request.operation = Operation::Logout as u8;
        self.prepare_forwarded(peer, h.nonce, request, true);
    }

    fn prepare_forwarded(&mut self, peer: u8, nonce: u128, request: RequestHeader, logout: bool) {
        if request.client == 0 {
            self.reject("forward_client_zero");
            return;
        }
        // Before the request: a cached reply is queued as an action right away.
        self.forwarded
            .insert(request.client, peer, nonce, logout, Instant::now());
        let frame = Frame::build(&request, &[]);
        let outcome = match self.groups.get_mut(METADATA_GROUP) {
            Some(replica) => replica.on_request(frame.as_bytes()),
            None => replication::vsr::RequestOutcome::NotPrimary {
                primary: self.settings.replica,
            },
        };
        // None: the op commits and its reply goes to this backup.
        let Some(refusal) = Outcome::of_request(&outcome) else {
            return;
        };
        if let Some(forwarded) = self.forwarded.take(request.client) {
            self.send_forward_result(forwarded, request.client, refusal, 0);
        }
    }

    /// Primary: the reply to a forwarded client goes back to the backup that asked.
    /// Returns whether `client` was forwarded.
    pub(super) fn forward_reply(&mut self, client: u128, reply: &Frame) -> bool {
        let Some(forwarded) = self.forwarded.take(client) else {
            return false;
        };
        let Ok((header, _)) = ReplyHeader::read_from_prefix(reply.as_bytes()) else {
            return true;
        };
        let ok = header.status == Status::Ok.wire_code(header.operation);
        let outcome = if ok { Outcome::Ok } else { Outcome::Canceled };
        let op = if ok { header.op } else { 0 };
        self.send_forward_result(forwarded, client, outcome, op);
        true
    }

    fn send_forward_result(&mut self, to: Forwarded, client: u128, outcome: Outcome, op: u64) {
        let frame = if to.logout {
            let mut header = ForwardLogoutResultHeader::new();
            header.frame.cluster = self.settings.cluster;
            header.frame.replica = self.settings.replica;
            header.nonce = to.nonce;
            header.client = client;
            header.commit = op;
            header.outcome = outcome.code(to.logout);
            Frame::build(&header, &[])
        } else {
            let mut header = ForwardRegisterResultHeader::new();
            header.frame.cluster = self.settings.cluster;
            header.frame.replica = self.settings.replica;
            header.nonce = to.nonce;
            header.client = client;
            // The session epoch is the op that committed the Register; the backup
            // answers once its own commit reaches it.
            header.epoch = op;
            header.watermark = op;
            header.outcome = outcome.code(to.logout);
            Frame::build(&header, &[])
        };
        let _ = self.bus.send(to.backup, frame);
    }

    /// Backup: the primary's answer to a forwarded request.
    fn on_forward_result(
        &mut self,
        nonce: u128,
        outcome: u8,
        epoch: u64,
        watermark: u64,
        logout: bool,
    ) {
        let commit = self.metadata().map_or(0, |r| r.commit());
        match self
            .forwards
            .on_result(nonce, outcome, logout, epoch, watermark, commit)
        {
            OnResult::Unknown => self.reject("forward_result_unknown"),
            OnResult::Waiting => {}
            OnResult::Answer(pending, answer) => self.answer_forwarded(*pending, answer),
        }
    }

    /// Primary: forgets forwarded clients whose op will not commit (a view change
    /// discarded it); the backup has answered its client Unavailable by then.
    pub(super) fn forget_forwarded(&mut self) {
        self.forwarded.expire(Instant::now());
    }

    /// Backup: answers forwarded requests whose result arrived and whose watermark this
    /// node has committed, and those unanswered past the timeout.
    pub(super) fn release_forwards(&mut self) {
        if self.forwards.is_empty() {
            return;
        }
        let commit = self.metadata().map_or(0, |r| r.commit());
        for (pending, answer) in self.forwards.release(commit, Instant::now()) {
            if answer == Answer::Refused(Status::Unavailable) {
                self.reject("forward_timeout");
            }
            self.answer_forwarded(pending, answer);
        }
    }

    fn answer_forwarded(&mut self, pending: Pending<ClientId>, answer: Answer) {
        let (connection, request) = (pending.connection, pending.request);
        match answer {
            Answer::Ok { epoch } => {
                let body = if request.operation == Operation::Register as u8 {
                    RegisterReply::of_this_server(request.user_id, epoch).encode()
                } else {
                    Vec::new()
                };
                self.answer(connection, &request, Status::Ok, &body);
            }
            Answer::Refused(status) => self.answer(connection, &request, status, &[]),
        }
    }
}
