//! One call's attempts: the retry loop every call goes through, and what each reply
//! makes of the next attempt (docs/client-protocol.md, "What the client library
//! retries").

use std::net::SocketAddr;
use std::time::Instant;

use replication::wire::registry::EvictionReason;
use replication::wire::Operation;

use super::{resolve, Client, Fate, Kind, Session};
use crate::client::conn::Incoming;
use crate::client::error::ClientError;
use crate::client::retry::{proves_not_applied, step_for, Budget, Step};
use crate::protocol::reply::{reason_text, strip_result_section, NotPrimaryReply};
use crate::protocol::{ClientRequest, Status};

/// What a call carries from one attempt to the next.
struct Attempts {
    kind: Kind,
    operation: Operation,
    read_command: u32,
    body: Vec<u8>,
    budget: Budget,
    /// Why the latest attempt did not end the call.
    last: Option<ClientError>,
    /// The node the next attempt goes to, when a reply named it.
    next_addr: Option<SocketAddr>,
    redirects: u32,
    session: Session,
    /// The request number every attempt under `session` carries.
    number: u64,
}

/// What an attempt's answer leaves the call to do.
enum Answer {
    /// A reply with a status the retry rules know.
    Reply(Status, Vec<u8>),
    /// Nothing to act on (a transient failure, an unreadable reply): try again.
    Again,
}

impl Client {
    pub(super) fn call_attempts(
        &mut self,
        group: u64,
        request: &ClientRequest<'_>,
        fate: &mut Fate,
    ) -> Result<Vec<u8>, ClientError> {
        let (operation, read_command) = request.operation();
        let kind = match operation {
            Operation::NonReplicated => Kind::Read,
            Operation::Register => Kind::Register,
            _ => Kind::Replicated,
        };
        let body = request.encode();
        if kind == Kind::Replicated && self.session.is_none() {
            self.register()?;
        }
        let session = self.session.unwrap_or(Session { id: 0, request: 0 });
        let mut call = Attempts {
            kind,
            operation,
            read_command,
            body,
            budget: Budget::new(self.options.retry, Instant::now(), self.next_jitter()),
            last: None,
            next_addr: None,
            redirects: 0,
            session,
            number: session.request + 1,
        };
        while call.budget.start_attempt(Instant::now()) {
            let addr = call
                .next_addr
                .take()
                .unwrap_or_else(|| self.next_target(group));
            let (status, reply_body) = match self.attempt(&mut call, addr, fate)? {
                Answer::Reply(status, body) => (status, body),
                Answer::Again => {
                    back_off(&mut call);
                    continue;
                }
            };
            if !proves_not_applied(status) && kind == Kind::Replicated {
                // Decided: the number is used whether the status is Ok or final.
                fate.decided = true;
                call.session.request = call.number;
                if self.session.map(|s| s.id) == Some(call.session.id) {
                    self.session = Some(call.session);
                }
            }
            let refused = ClientError::Status {
                status,
                reason: reason_text(&reply_body),
            };
            match step_for(status) {
                Step::Done if status == Status::Ok => {
                    return ok_body(operation, addr, reply_body);
                }
                Step::Done => return Err(refused),
                Step::Redirect => {
                    self.follow_redirect(group, addr, &reply_body, refused, &mut call);
                }
                Step::RetrySame => {
                    call.last = Some(refused);
                    call.next_addr = Some(addr);
                    back_off(&mut call);
                }
                Step::RetryElsewhere => {
                    call.last = Some(refused);
                    self.pass_over(addr);
                    back_off(&mut call);
                }
                Step::Relogin => {
                    if self.credentials.is_none() {
                        return Err(refused);
                    }
                    if let Some(conn) = self.conns.get_mut(&addr) {
                        conn.logged_in = false;
                    }
                    call.last = Some(refused);
                    call.next_addr = Some(addr);
                }
                Step::SessionGone => self.on_session_gone(refused, fate, &mut call)?,
            }
        }
        Err(self.exhausted(&call.budget, fate.maybe_applied, call.last))
    }

    /// Sends the call's request to `addr` once and reads what comes back. A failure
    /// that is not transient, or an eviction other than NoSession, ends the call.
    fn attempt(
        &mut self,
        call: &mut Attempts,
        addr: SocketAddr,
        fate: &mut Fate,
    ) -> Result<Answer, ClientError> {
        let (session_id, request_number) = match call.kind {
            Kind::Replicated => (call.session.id, call.number),
            Kind::Read | Kind::Register => (0, 0),
        };
        self.request_high = self.request_high.max(request_number);
        let frame = self.frame(
            call.operation,
            call.read_command,
            session_id,
            request_number,
            &call.body,
        );
        let incoming = self.ensure_conn(addr).and_then(|()| {
            let timeout = self.options.request_timeout;
            self.exchange(addr, &frame, request_number, call.operation, timeout)
        });
        let replicated = call.kind == Kind::Replicated;
        match incoming {
            Err(e) => {
                fate.maybe_applied |= e.delivered && replicated;
                if !e.error.is_transient() {
                    return Err(e.error);
                }
                self.failed_at(addr);
                call.last = Some(e.error);
                Ok(Answer::Again)
            }
            Ok(Incoming::Eviction { reason, .. }) => {
                if reason != EvictionReason::NoSession as u8 {
                    self.session = None;
                    return Err(ClientError::evicted(reason));
                }
                Ok(Answer::Reply(Status::NoSession, Vec::new()))
            }
            Ok(Incoming::Reply { header, body }) => {
                self.failed.remove(&addr);
                match Status::from_reply(header.status, &body) {
                    Some(status) => Ok(Answer::Reply(status, body)),
                    None => {
                        self.forget(addr);
                        call.last = Some(ClientError::UnexpectedReply {
                            server: addr,
                            what: format!("unknown status {}", header.status),
                        });
                        fate.maybe_applied |= replicated;
                        Ok(Answer::Again)
                    }
                }
            }
        }
    }

    /// NotPrimary from `addr`: the next attempt goes to the node it names, unless that
    /// node failed an attempt lately and `addr` has not noticed yet.
    fn follow_redirect(
        &mut self,
        group: u64,
        addr: SocketAddr,
        body: &[u8],
        refused: ClientError,
        call: &mut Attempts,
    ) {
        let named = NotPrimaryReply::decode(body)
            .map_err(|e| ClientError::body(addr, "NotPrimary", e))
            .and_then(|r| {
                resolve(&r.address)?
                    .into_iter()
                    .next()
                    .ok_or(ClientError::UnexpectedReply {
                        server: addr,
                        what: format!("NotPrimary names no address: {}", r.address),
                    })
            });
        let to = match named {
            Ok(to) => to,
            Err(error) => {
                self.forget(addr);
                call.last = Some(error);
                back_off(call);
                return;
            }
        };
        if to != addr && self.paused(to, Some(addr), Instant::now()) {
            // Named by a node that has not noticed its silence yet: ask the others
            // first (it failed an attempt, so it is known).
            if self.primaries.get(&group) == Some(&addr) {
                self.primaries.remove(&group);
            }
            if let Some(index) = self.nodes.iter().position(|a| *a == addr) {
                self.cursor = (index + 1) % self.nodes.len();
            }
            back_off(call);
        } else {
            self.set_primary(group, to);
            call.redirects += 1;
            if to == addr || call.redirects > 1 {
                // Redirected back to the node that refused, or nodes that disagree
                // about the primary (a view change in progress): give them time to
                // settle instead of spinning.
                back_off(call);
            }
            call.next_addr = Some(to);
        }
        call.last = Some(refused);
    }

    /// The session is gone (evicted, or the node lost it): a call that may have been
    /// applied under it ends; one refused unapplied at every attempt goes on under a
    /// new session, as its first request.
    fn on_session_gone(
        &mut self,
        refused: ClientError,
        fate: &Fate,
        call: &mut Attempts,
    ) -> Result<(), ClientError> {
        self.session = None;
        match call.kind {
            Kind::Read | Kind::Register => Err(refused),
            Kind::Replicated if fate.maybe_applied => Err(ClientError::SessionLost {
                request: call.number,
            }),
            Kind::Replicated => {
                self.register()?;
                call.session = self.session.unwrap_or(Session { id: 0, request: 0 });
                call.number = call.session.request + 1;
                call.last = Some(refused);
                Ok(())
            }
        }
    }
}

/// Waits the budget's backoff before the next attempt.
fn back_off(call: &mut Attempts) {
    std::thread::sleep(call.budget.backoff(Instant::now()));
}

/// The Ok reply's body as the caller gets it: as it came (a poll's is megabytes),
/// unless a result section leads it.
fn ok_body(
    operation: Operation,
    addr: SocketAddr,
    mut body: Vec<u8>,
) -> Result<Vec<u8>, ClientError> {
    let section = body.len()
        - strip_result_section(operation as u8, &body)
            .map_err(|e| ClientError::body(addr, "result section", e))?
            .len();
    body.drain(..section);
    Ok(body)
}
