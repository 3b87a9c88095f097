//! What a client call can fail with, with the context an operator needs to act.

use std::net::SocketAddr;
use std::time::Duration;

use replication::wire::registry::EvictionReason;
use replication::wire::FrameError;

use crate::protocol::{BodyError, Status};

/// Why a client call failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientError {
    /// An argument is refused before anything is sent.
    InvalidArgument { what: &'static str, rule: String },
    /// The cluster answered with a final status (the request was decided, not lost).
    Status { status: Status, reason: String },
    /// No reply within the request timeout.
    Timeout { server: SocketAddr, after: Duration },
    /// Connecting, sending or receiving failed.
    Io {
        server: SocketAddr,
        kind: std::io::ErrorKind,
        message: String,
    },
    /// A reply frame failed wire validation (the connection is dropped).
    Protocol {
        server: SocketAddr,
        error: FrameError,
    },
    /// A valid frame that does not answer the request (wrong command, client, request
    /// number, or a body that does not parse).
    UnexpectedReply { server: SocketAddr, what: String },
    /// The cluster ended the session (Eviction) for a reason other than NoSession.
    Evicted { reason: u8, name: &'static str },
    /// The session is gone and an earlier attempt of `request` may have been applied:
    /// its outcome is unknown, so it is not resent under a new session.
    SessionLost { request: u64 },
    /// Every attempt failed; `maybe_applied` says whether one of them may have reached
    /// the primary (its outcome is then unknown).
    RetriesExhausted {
        attempts: u32,
        elapsed: Duration,
        maybe_applied: bool,
        last: Box<ClientError>,
    },
    /// TLS to a node failed: its certificate is not trusted or does not carry the
    /// expected name, or it does not speak TLS 1.3. Not retried: the configuration, not
    /// the moment, is wrong.
    Tls { server: SocketAddr, message: String },
    /// No server address was given or resolved.
    NoServers,
}

impl ClientError {
    /// An error that another attempt (same request number, maybe another node) may cure.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            ClientError::Timeout { .. }
            | ClientError::Io { .. }
            | ClientError::Protocol { .. }
            | ClientError::UnexpectedReply { .. } => true,
            ClientError::Status { status, .. } => {
                matches!(status, Status::PipelineFull | Status::Unavailable)
            }
            _ => false,
        }
    }

    /// The status of a final reply, if this is one.
    pub fn status(&self) -> Option<Status> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::RetriesExhausted { last, .. } => last.status(),
            _ => None,
        }
    }

    pub(crate) fn io(server: SocketAddr, error: &std::io::Error) -> ClientError {
        ClientError::Io {
            server,
            kind: error.kind(),
            message: error.to_string(),
        }
    }

    pub(crate) fn body(server: SocketAddr, what: &str, error: BodyError) -> ClientError {
        ClientError::UnexpectedReply {
            server,
            what: format!("{what} reply body: {error}"),
        }
    }

    pub(crate) fn evicted(reason: u8) -> ClientError {
        ClientError::Evicted {
            reason,
            name: EvictionReason::from_u8(reason).map_or("unknown", EvictionReason::name),
        }
    }
}

impl core::fmt::Display for ClientError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ClientError::InvalidArgument { what, rule } => write!(f, "{what}: {rule}"),
            ClientError::Status { status, reason } if reason.is_empty() => {
                write!(f, "server answered {status:?}")
            }
            ClientError::Status { status, reason } => {
                write!(f, "server answered {status:?}: {reason}")
            }
            ClientError::Timeout { server, after } => {
                write!(f, "{server}: no reply within {} ms", after.as_millis())
            }
            ClientError::Io {
                server, message, ..
            } => write!(f, "{server}: {message}"),
            ClientError::Protocol { server, error } => {
                write!(f, "{server}: invalid reply frame: {error}")
            }
            ClientError::UnexpectedReply { server, what } => {
                write!(f, "{server}: unexpected reply: {what}")
            }
            ClientError::Evicted { reason, name } => {
                write!(f, "session evicted by the cluster: {name} ({reason})")
            }
            ClientError::SessionLost { request } => write!(
                f,
                "session lost while request {request} was in flight: its outcome is unknown"
            ),
            ClientError::RetriesExhausted {
                attempts,
                elapsed,
                maybe_applied,
                last,
            } => write!(
                f,
                "gave up after {attempts} attempts in {} ms{}: {last}",
                elapsed.as_millis(),
                if *maybe_applied {
                    " (the request may have been applied)"
                } else {
                    ""
                }
            ),
            ClientError::Tls { server, message } => write!(f, "{server}: TLS: {message}"),
            ClientError::NoServers => write!(f, "no server address to connect to"),
        }
    }
}

impl std::error::Error for ClientError {}
