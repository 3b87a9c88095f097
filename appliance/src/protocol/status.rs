//! Reply statuses of the client protocol. On the wire, ReplyHeader.status carries the
//! Apache Iggy error code (`IggyError`'s numeric codes, binary protocol 0.11.0) that
//! stands for the status: `wire_code` and `from_wire` are the one mapping, shared by the
//! daemon and `appliance::client` (docs/client-protocol.md, "Reply statuses").

use replication::wire::Operation;

/// The body of a PipelineFull reply (TransientNotAccepted on the wire): the primary is
/// alive, so a client retries there.
pub const PIPELINE_FULL_REASON: &[u8] = b"pipeline full";

/// What a Reply says about its request; the body's shape depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    /// The request was applied (or read); body per operation.
    Ok,
    /// This node is not the primary of the request's group; body: u8 primary replica id,
    /// then the primary's client address as a short string ("ip:port").
    NotPrimary,
    /// The body does not parse or a field is out of range; body: the reason.
    InvalidRequest,
    /// The stream, topic, partition, user, group or offset does not exist.
    NotFound,
    /// A stream, topic, user or group of that name exists.
    AlreadyExists,
    /// The session's user lacks the permission for this stream.
    PermissionDenied,
    /// The connection has not logged in.
    Unauthenticated,
    /// Wrong user name or password (never says which).
    InvalidCredentials,
    /// A configured limit refuses the request; body: the limit's key.
    LimitReached,
    /// The group's pipeline is full; retry with the same request number.
    PipelineFull,
    /// The request names a session this cluster does not hold (register again).
    NoSession,
    /// The request number is older than the session's last; it was already answered.
    StaleRequest,
    /// The node could not complete the request (e.g. a view change); retry.
    Unavailable,
    /// The node's storage is below its budget (or a write met a full disk): it refuses
    /// new writes and keeps serving reads; body: the reason. Nothing was applied.
    StorageFull,
    /// A command of the Iggy protocol the appliance does not serve.
    FeatureUnavailable,
    /// The client's protocol version is outside the window this node accepts.
    IncompatibleProtocol,
    /// An option key the appliance does not take (Iggy's options block).
    UnsupportedOption,
    /// An option whose value the appliance cannot honour or parse.
    InvalidOptionValue,
}

impl Status {
    /// The code ReplyHeader.status carries for this status in a reply to `operation`
    /// (the client's operation: the code names the resource where the Iggy protocol has
    /// one code per resource).
    pub fn wire_code(self, operation: u8) -> u32 {
        use Operation as O;
        let operation = Operation::from_u8(operation);
        match self {
            Status::Ok => 0,
            // "Not admitted, re-issue anywhere": the body says where the primary is.
            Status::NotPrimary | Status::PipelineFull | Status::Unavailable => {
                code::TRANSIENT_NOT_ACCEPTED
            }
            Status::InvalidRequest => code::INVALID_COMMAND,
            Status::NotFound => match operation {
                Some(O::DeleteStream | O::CreateTopic) => code::STREAM_ID_NOT_FOUND,
                Some(
                    O::UpdateTopic | O::DeleteTopic | O::CreatePartitions | O::DeletePartitions,
                ) => code::TOPIC_ID_NOT_FOUND,
                Some(O::SendMessages | O::DeleteSegments) => code::PARTITION_NOT_FOUND,
                Some(O::StoreConsumerOffset | O::DeleteConsumerOffset) => {
                    code::CONSUMER_OFFSET_NOT_FOUND
                }
                Some(O::DeleteConsumerGroup | O::JoinConsumerGroup | O::LeaveConsumerGroup) => {
                    code::CONSUMER_GROUP_ID_NOT_FOUND
                }
                _ => code::RESOURCE_NOT_FOUND,
            },
            Status::AlreadyExists => match operation {
                Some(O::CreateTopic) => code::TOPIC_NAME_ALREADY_EXISTS,
                Some(O::CreateUser) => code::USER_ALREADY_EXISTS,
                Some(O::CreateConsumerGroup) => code::CONSUMER_GROUP_NAME_ALREADY_EXISTS,
                _ => code::STREAM_NAME_ALREADY_EXISTS,
            },
            Status::PermissionDenied => code::UNAUTHORIZED,
            Status::Unauthenticated => code::UNAUTHENTICATED,
            Status::InvalidCredentials => code::INVALID_CREDENTIALS,
            Status::LimitReached => match operation {
                Some(O::CreateStream) => code::TOO_MANY_STREAMS,
                Some(O::CreateTopic) => code::TOO_MANY_TOPICS,
                Some(O::CreatePartitions) => code::TOO_MANY_PARTITIONS,
                Some(O::CreateUser) => code::USERS_LIMIT_REACHED,
                _ => code::LIMIT_REACHED,
            },
            Status::NoSession => code::INVALID_SESSION,
            Status::StaleRequest => code::REQUEST_ALREADY_APPLIED,
            Status::StorageFull => code::CANNOT_WRITE_TO_FILE,
            Status::FeatureUnavailable => code::FEATURE_UNAVAILABLE,
            Status::IncompatibleProtocol => code::INCOMPATIBLE_PROTOCOL_VERSION,
            Status::UnsupportedOption => code::UNSUPPORTED_OPTION_KEY,
            Status::InvalidOptionValue => code::INVALID_OPTION_VALUE,
        }
    }

    /// The status a ReplyHeader.status code stands for. TransientNotAccepted reads as
    /// Unavailable: the client tells NotPrimary by its body (`reply::NotPrimaryReply`).
    pub fn from_wire(value: u32) -> Option<Status> {
        Some(match value {
            0 => Status::Ok,
            code::TRANSIENT_NOT_ACCEPTED => Status::Unavailable,
            code::INVALID_COMMAND => Status::InvalidRequest,
            code::RESOURCE_NOT_FOUND
            | code::STREAM_ID_NOT_FOUND
            | code::TOPIC_ID_NOT_FOUND
            | code::PARTITION_NOT_FOUND
            | code::CONSUMER_OFFSET_NOT_FOUND
            | code::CONSUMER_GROUP_ID_NOT_FOUND => Status::NotFound,
            code::STREAM_NAME_ALREADY_EXISTS
            | code::TOPIC_NAME_ALREADY_EXISTS
            | code::USER_ALREADY_EXISTS
            | code::CONSUMER_GROUP_NAME_ALREADY_EXISTS => Status::AlreadyExists,
            code::UNAUTHORIZED => Status::PermissionDenied,
            code::UNAUTHENTICATED => Status::Unauthenticated,
            code::INVALID_CREDENTIALS => Status::InvalidCredentials,
            code::TOO_MANY_STREAMS
            | code::TOO_MANY_TOPICS
            | code::TOO_MANY_PARTITIONS
            | code::USERS_LIMIT_REACHED
            | code::LIMIT_REACHED => Status::LimitReached,
            code::INVALID_SESSION => Status::NoSession,
            code::REQUEST_ALREADY_APPLIED => Status::StaleRequest,
            code::CANNOT_WRITE_TO_FILE => Status::StorageFull,
            code::FEATURE_UNAVAILABLE => Status::FeatureUnavailable,
            code::INCOMPATIBLE_PROTOCOL_VERSION => Status::IncompatibleProtocol,
            code::UNSUPPORTED_OPTION_KEY => Status::UnsupportedOption,
            code::INVALID_OPTION_VALUE => Status::InvalidOptionValue,
            _ => return None,
        })
    }

    /// The status of a reply from its code and body: TransientNotAccepted stands for
    /// NotPrimary when its body names the primary, PipelineFull when it is
    /// `PIPELINE_FULL_REASON`, else Unavailable.
    pub fn from_reply(code: u32, body: &[u8]) -> Option<Status> {
        let status = Status::from_wire(code)?;
        if status != Status::Unavailable {
            return Some(status);
        }
        if body == PIPELINE_FULL_REASON {
            return Some(Status::PipelineFull);
        }
        if super::reply::NotPrimaryReply::decode(body).is_ok() {
            return Some(Status::NotPrimary);
        }
        Some(Status::Unavailable)
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

/// The Apache Iggy error codes (binary protocol 0.11.0) the client port answers with.
pub mod code {
    /// A generic error; the appliance sends it for a configured limit Iggy has no code
    /// for (the body names the limit's key).
    pub const LIMIT_REACHED: u32 = 1;
    pub const INVALID_COMMAND: u32 = 3;
    /// A command code the appliance does not serve.
    pub const FEATURE_UNAVAILABLE: u32 = 5;
    pub const RESOURCE_NOT_FOUND: u32 = 20;
    pub const UNAUTHENTICATED: u32 = 40;
    pub const UNAUTHORIZED: u32 = 41;
    pub const INVALID_CREDENTIALS: u32 = 42;
    pub const USER_ALREADY_EXISTS: u32 = 46;
    pub const USERS_LIMIT_REACHED: u32 = 55;
    pub const TRANSIENT_NOT_ACCEPTED: u32 = 58;
    pub const REQUEST_ALREADY_APPLIED: u32 = 59;
    pub const STREAM_ID_NOT_FOUND: u32 = 1009;
    pub const STREAM_NAME_ALREADY_EXISTS: u32 = 1012;
    pub const TOO_MANY_STREAMS: u32 = 1020;
    pub const TOPIC_ID_NOT_FOUND: u32 = 2010;
    pub const TOPIC_NAME_ALREADY_EXISTS: u32 = 2013;
    pub const TOO_MANY_PARTITIONS: u32 = 2015;
    pub const TOO_MANY_TOPICS: u32 = 2021;
    pub const PARTITION_NOT_FOUND: u32 = 3007;
    pub const CONSUMER_OFFSET_NOT_FOUND: u32 = 3021;
    pub const UNSUPPORTED_OPTION_KEY: u32 = 4041;
    pub const INVALID_OPTION_VALUE: u32 = 4042;
    pub const CONSUMER_GROUP_ID_NOT_FOUND: u32 = 5000;
    pub const CONSUMER_GROUP_NAME_ALREADY_EXISTS: u32 = 5004;
    pub const CANNOT_WRITE_TO_FILE: u32 = 10006;
    pub const INVALID_SESSION: u32 = 14001;
    pub const INCOMPATIBLE_PROTOCOL_VERSION: u32 = 14003;
}
