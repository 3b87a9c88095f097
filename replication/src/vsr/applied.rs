//! Replies carry what the state machine made of an op. A commit hands the op to the
//! driver (`Action::Commit`); once applied, the driver gives the result back
//! (`Replica::on_applied`): the replica seals the reply with that status and body,
//! keeps it in the client table (for retries, and in checkpoints and state transfers)
//! and returns it for the waiting client (`on_applied`: as the primary only).

use super::{Replica, Status};
use crate::wire::{Frame, ReplyHeader};

/// Committed ops whose result has not come back yet, kept at most: past it the oldest is
/// taken as applied with an empty body (a driver that does not report results).
pub(crate) const APPLYING_MAX: usize = 4096;

/// What the state machine made of a committed op.
#[derive(Clone, Copy, Debug)]
pub struct Applied<'a> {
    /// The reply's status code, as the client reads it (0: ok).
    pub status: u32,
    /// The reply's body.
    pub body: &'a [u8],
    /// Whether the client table may keep `body` for retries (false for a secret, which
    /// must not reach a checkpoint; a retry then gets the status alone).
    pub keep_body: bool,
    /// The operation and request number the client reads in its reply, where they
    /// differ from the prepare's: a driver that prepares a client's request under an
    /// internal operation or numbers requests its own way seals the reply in the
    /// client's terms once, here (None: the prepare's).
    pub reply_as: Option<(u8, u64)>,
}

/// A committed op waiting for its result: the reply header built at commit.
#[derive(Clone, Debug)]
pub(crate) struct Applying {
    pub op: u64,
    pub reply: ReplyHeader,
}

impl Replica {
    /// Records the reply of the op `header` committed, to be sealed when it is applied.
    pub(crate) fn await_applied(&mut self, op: u64, reply: ReplyHeader) {
        if self.applying.len() >= APPLYING_MAX {
            self.settle_oldest_unreported();
        }
        self.applying.push_back(Applying { op, reply });
    }

    /// The oldest op waiting for its result, taken as applied with its status alone:
    /// its result will not come (the driver does not report it, or a state installed
    /// over it).
    fn settle_oldest_unreported(&mut self) {
        if let Some(oldest) = self.applying.pop_front() {
            let frame = Frame::build(&oldest.reply, &[]);
            self.clients.apply(oldest.reply.client, oldest.op, frame);
        }
    }

    /// The driver applied committed op `op` (every op of an `Action::Commit`, in commit
    /// order): the reply is sealed with `applied` and kept in the client table. Returns
    /// the client and the reply to send it when this replica is the primary of a normal
    /// view and the op was a client's request. An op this replica does not wait for
    /// (installed by state transfer meanwhile, or already reported) is ignored.
    pub fn on_applied(&mut self, op: u64, applied: Applied<'_>) -> Option<(u128, Frame)> {
        let primary = self.status == Status::Normal && self.is_primary();
        self.seal_applied(op, applied).filter(|_| primary)
    }

    /// As `on_applied`, but the reply is returned on every replica: a driver that
    /// answers only the clients waiting on its own node for that very request sends a
    /// backup's copy too. A primary replaced while its client waited (its links cut, its
    /// host stalled) commits the write as a backup once the new view has, and its client
    /// gets the one reply it waits for instead of waiting out its timeout.
    pub fn seal_applied(&mut self, op: u64, applied: Applied<'_>) -> Option<(u128, Frame)> {
        while self.applying.front().is_some_and(|a| a.op < op) {
            // Never reported: skipped by a state installed over them.
            self.settle_oldest_unreported();
        }
        if self.applying.front().is_none_or(|a| a.op != op) {
            return None;
        }
        let Applying { mut reply, .. } = self.applying.pop_front()?;
        let client = reply.client;
        if client == 0 {
            return None;
        }
        reply.status = applied.status;
        if let Some((operation, request)) = applied.reply_as {
            reply.operation = operation;
            reply.request = request;
        }
        let frame = Frame::build(&reply, applied.body);
        // The table keeps bodies within its bounds.
        let kept = if applied.keep_body {
            frame.clone()
        } else {
            Frame::build(&reply, &[])
        };
        // A Logout's session is gone from the table; its reply still goes out.
        self.clients.apply(client, op, kept);
        Some((client, frame))
    }
}
