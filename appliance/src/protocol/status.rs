//! Reply status codes (ReplyHeader.status) of the client protocol.

/// What a Reply says about its request; the body's shape depends on it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// The request was applied (or read); body per operation.
    Ok = 0,
    /// This node is not the primary of the request's group; body: u8 primary replica id,
    /// then the primary's client address as a short string ("ip:port").
    NotPrimary = 1,
    /// The body does not parse or a field is out of range; body: the reason.
    InvalidRequest = 2,
    /// The stream, topic, partition, user, group or offset does not exist.
    NotFound = 3,
    /// A stream, topic, user or group of that name exists.
    AlreadyExists = 4,
    /// The session's user lacks the permission for this stream.
    PermissionDenied = 5,
    /// The connection has not logged in.
    Unauthenticated = 6,
    /// Wrong user name or password (never says which).
    InvalidCredentials = 7,
    /// A configured limit refuses the request; body: the limit's key.
    LimitReached = 8,
    /// The group's pipeline is full; retry with the same request number.
    PipelineFull = 9,
    /// The request names a session this cluster does not hold (register again).
    NoSession = 10,
    /// The request number is older than the session's last; it was already answered.
    StaleRequest = 11,
    /// The node could not complete the request (e.g. a view change); retry.
    Unavailable = 12,
    /// The node's storage is below its budget (or a write met a full disk): it refuses
    /// new writes and keeps serving reads; body: the reason. Nothing was applied.
    StorageFull = 13,
}

impl Status {
    pub fn from_u32(value: u32) -> Option<Status> {
        use Status as S;
        Some(match value {
            0 => S::Ok,
            1 => S::NotPrimary,
            2 => S::InvalidRequest,
            3 => S::NotFound,
            4 => S::AlreadyExists,
            5 => S::PermissionDenied,
            6 => S::Unauthenticated,
            7 => S::InvalidCredentials,
            8 => S::LimitReached,
            9 => S::PipelineFull,
            10 => S::NoSession,
            11 => S::StaleRequest,
            12 => S::Unavailable,
            13 => S::StorageFull,
            _ => return None,
        })
    }

    /// Whether a client should retry the same request (same request number) later or
    /// elsewhere.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Status::NotPrimary | Status::PipelineFull | Status::Unavailable
        )
    }
}
