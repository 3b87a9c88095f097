//! Session forwarding (docs/protocol.md, "Session forwarding"): a client may register or
//! log out through a backup. The backup has authenticated the connection; only the
//! verified user id (Register) or the session and request number (Logout) travel to the
//! metadata primary, which prepares the operation as that client and answers with the
//! outcome once it commits. Credentials never cross the replica plane.
//!
//! The backup answers its client once its own metadata commit has reached the result's
//! watermark, so the session it hands out is already in its own client table.

use std::time::{Duration, Instant};

use replication::bus::{ClientId, VerifiedFrame};
use replication::vsr::RequestOutcome;
use replication::wire::{
    Command, ForwardLogoutHeader, ForwardLogoutResultHeader, ForwardRegisterHeader,
    ForwardRegisterResultHeader, Frame, Header, Operation, ReplyHeader, RequestHeader,
    METADATA_GROUP,
};
use zerocopy::FromBytes;

use super::node::Node;
use super::pending::{Forwarded, PendingForward};
use crate::protocol::reply::RegisterReply;
use crate::protocol::Status;

/// Forwarded requests a backup waits on at once; more are answered Unavailable.
pub const FORWARDS_MAX: usize = 4096;
/// A forwarded request unanswered for this long is answered Unavailable (the client
/// retries with the same request).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Outcome bytes of ForwardRegisterResult.
mod register_outcome {
    pub const OK: u8 = 0;
    pub const NOT_PRIMARY: u8 = 1;
    pub const PIPELINE_FULL: u8 = 3;
    pub const IN_PROGRESS: u8 = 4;
    pub const CANCELED: u8 = 5;
}

/// Outcome bytes of ForwardLogoutResult.
mod logout_outcome {
    pub const OK: u8 = 0;
    pub const NOT_PRIMARY: u8 = 1;
    pub const PIPELINE_FULL: u8 = 2;
    pub const IN_PROGRESS: u8 = 3;
    pub const CANCELED: u8 = 4;
}

impl Node {
    /// Backup: sends a Register or Logout to the primary instead of redirecting.
    pub(super) fn forward_session_op(
        &mut self,
        connection: ClientId,
        request: &RequestHeader,
        primary: u8,
    ) {
        if self.forwards.len() >= FORWARDS_MAX {
            self.reject("forward_table_full");
            return self.answer(connection, request, Status::Unavailable, &[]);
        }
        self.forward_nonces += 1;
        let nonce = (u128::from(self.settings.replica) << 120)
            ^ (u128::from(self.settings.cluster as u64) << 64)
            ^ u128::from(self.forward_nonces);
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
            return self.answer(connection, request, Status::Unavailable, &[]);
        }
        self.forwards.insert(
            nonce,
            PendingForward {
                connection,
                request: *request,
                sent: Instant::now(),
                ok: None,
            },
        );
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
        let forwarded = Forwarded {
            backup: peer,
            nonce,
            logout,
            at: Instant::now(),
        };
        // Before the request: a cached reply is queued as an action right away.
        self.forwarded.insert(request.client, forwarded);
        let frame = Frame::build(&request, &[]);
        let outcome = match self.groups.get_mut(METADATA_GROUP) {
            Some(replica) => replica.on_request(frame.as_bytes()),
            None => RequestOutcome::NotPrimary {
                primary: self.settings.replica,
            },
        };
        let refusal = match outcome {
            // InProgress: the op in flight commits and its reply goes to this backup.
            RequestOutcome::Prepared { .. }
            | RequestOutcome::Replied
            | RequestOutcome::InProgress => return,
            RequestOutcome::NotPrimary { .. } if logout => logout_outcome::NOT_PRIMARY,
            RequestOutcome::NotPrimary { .. } => register_outcome::NOT_PRIMARY,
            RequestOutcome::PipelineFull if logout => logout_outcome::PIPELINE_FULL,
            RequestOutcome::PipelineFull => register_outcome::PIPELINE_FULL,
            _ if logout => logout_outcome::CANCELED,
            _ => register_outcome::CANCELED,
        };
        self.forwarded.remove(&request.client);
        self.send_forward_result(forwarded, request.client, refusal, 0);
    }

    /// Primary: the reply to a forwarded client goes back to the backup that asked.
    /// Returns whether `client` was forwarded.
    pub(super) fn forward_reply(&mut self, client: u128, reply: &Frame) -> bool {
        let Some(forwarded) = self.forwarded.remove(&client) else {
            return false;
        };
        let Ok((header, _)) = ReplyHeader::read_from_prefix(reply.as_bytes()) else {
            return true;
        };
        let ok = header.status == Status::Ok.wire_code(header.operation);
        let outcome = match (ok, forwarded.logout) {
            (true, _) => register_outcome::OK,
            (false, false) => register_outcome::CANCELED,
            (false, true) => logout_outcome::CANCELED,
        };
        let op = if ok { header.op } else { 0 };
        self.send_forward_result(forwarded, client, outcome, op);
        true
    }

    fn send_forward_result(&mut self, to: Forwarded, client: u128, outcome: u8, op: u64) {
        let frame = if to.logout {
            let mut header = ForwardLogoutResultHeader::new();
            header.frame.cluster = self.settings.cluster;
            header.frame.replica = self.settings.replica;
            header.nonce = to.nonce;
            header.client = client;
            header.commit = op;
            header.outcome = outcome;
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
            header.outcome = outcome;
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
        let Some(mut pending) = self.forwards.remove(&nonce) else {
            self.reject("forward_result_unknown");
            return;
        };
        let (ok, in_progress, not_primary, pipeline_full) = if logout {
            (
                logout_outcome::OK,
                logout_outcome::IN_PROGRESS,
                logout_outcome::NOT_PRIMARY,
                logout_outcome::PIPELINE_FULL,
            )
        } else {
            (
                register_outcome::OK,
                register_outcome::IN_PROGRESS,
                register_outcome::NOT_PRIMARY,
                register_outcome::PIPELINE_FULL,
            )
        };
        let status = match outcome {
            o if o == ok => {
                pending.ok = Some((epoch, watermark));
                self.forwards.insert(nonce, pending);
                return self.release_forwards();
            }
            o if o == in_progress => {
                // The op is in the primary's pipeline; its result follows.
                self.forwards.insert(nonce, pending);
                return;
            }
            o if o == not_primary => Status::Unavailable,
            o if o == pipeline_full => Status::PipelineFull,
            _ => Status::Unavailable,
        };
        self.answer(pending.connection, &pending.request, status, &[]);
    }

    /// Primary: forgets forwarded clients whose op will not commit (a view change
    /// discarded it); the backup has answered its client Unavailable by then.
    pub(super) fn forget_forwarded(&mut self) {
        self.forwarded
            .retain(|_, f| f.at.elapsed() < FORWARD_TIMEOUT * 2);
    }

    /// Backup: answers forwarded requests whose result arrived and whose watermark this
    /// node has committed; forgets those unanswered past the timeout.
    pub(super) fn release_forwards(&mut self) {
        if self.forwards.is_empty() {
            return;
        }
        let commit = self.metadata().map_or(0, |r| r.commit());
        let ready: Vec<u128> = self
            .forwards
            .iter()
            .filter(|(_, p)| {
                p.ok.is_some_and(|(_, watermark)| watermark <= commit)
                    || p.sent.elapsed() >= FORWARD_TIMEOUT
            })
            .map(|(nonce, _)| *nonce)
            .collect();
        for nonce in ready {
            let Some(pending) = self.forwards.remove(&nonce) else {
                continue;
            };
            match pending.ok {
                Some((epoch, watermark)) if watermark <= commit => {
                    let body = if pending.request.operation == Operation::Register as u8 {
                        RegisterReply::of_this_server(pending.request.user_id, epoch).encode()
                    } else {
                        Vec::new()
                    };
                    self.answer(pending.connection, &pending.request, Status::Ok, &body);
                }
                _ => {
                    self.reject("forward_timeout");
                    self.answer(
                        pending.connection,
                        &pending.request,
                        Status::Unavailable,
                        &[],
                    );
                }
            }
        }
    }
}
