//! The byte registries (docs/protocol.md, "Command registry"): command discriminants,
//! operations, eviction reasons and the planes they belong to.

/// Command byte at offset 60 of every header (docs/protocol.md, "Command registry").
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Ping = 1,
    Pong = 2,
    PingClient = 3,
    PongClient = 4,
    Request = 5,
    Prepare = 6,
    PrepareOk = 7,
    Reply = 8,
    Commit = 9,
    StartViewChange = 10,
    DoViewChange = 11,
    StartView = 12,
    Eviction = 13,
    ReplicaHello = 14,
    ReplicaChallenge = 15,
    ReplicaFinish = 16,
    RequestStartView = 17,
    RequestPrepares = 18,
    RepairPrepare = 19,
    RepairDone = 20,
    RangeEvicted = 21,
    RequestStateTransfer = 22,
    StateTransferTarget = 23,
    RequestStateChunk = 24,
    StateChunk = 25,
    ForwardRegister = 26,
    ForwardRegisterResult = 27,
    ForwardLogout = 28,
    ForwardLogoutResult = 29,
}

/// Values above this are rejected (docs/protocol.md, "Command registry").
pub const COMMAND_MAX: u8 = 29;

/// How a command's header checksum field is used (docs/protocol.md, "Frame integrity").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealKind {
    /// Client frames and handshake frames: checksum fields are not a seal.
    Unsealed,
    /// Prepare and RepairPrepare: checksum holds the prepare identity.
    Identity,
    /// Replica control messages: checksum is XxHash3 over header bytes 16..256.
    Frame,
}

impl Command {
    /// Every command, in discriminant order.
    pub const ALL: [Command; 29] = [
        Command::Ping,
        Command::Pong,
        Command::PingClient,
        Command::PongClient,
        Command::Request,
        Command::Prepare,
        Command::PrepareOk,
        Command::Reply,
        Command::Commit,
        Command::StartViewChange,
        Command::DoViewChange,
        Command::StartView,
        Command::Eviction,
        Command::ReplicaHello,
        Command::ReplicaChallenge,
        Command::ReplicaFinish,
        Command::RequestStartView,
        Command::RequestPrepares,
        Command::RepairPrepare,
        Command::RepairDone,
        Command::RangeEvicted,
        Command::RequestStateTransfer,
        Command::StateTransferTarget,
        Command::RequestStateChunk,
        Command::StateChunk,
        Command::ForwardRegister,
        Command::ForwardRegisterResult,
        Command::ForwardLogout,
        Command::ForwardLogoutResult,
    ];

    /// Parses a command byte; 0 and values above 29 are not commands.
    pub fn from_u8(value: u8) -> Option<Command> {
        if value == 0 || value > COMMAND_MAX {
            return None;
        }
        Some(Command::ALL[usize::from(value) - 1])
    }

    /// The registry name, as printed by tools and stats.
    pub fn name(self) -> &'static str {
        match self {
            Command::Ping => "Ping",
            Command::Pong => "Pong",
            Command::PingClient => "PingClient",
            Command::PongClient => "PongClient",
            Command::Request => "Request",
            Command::Prepare => "Prepare",
            Command::PrepareOk => "PrepareOk",
            Command::Reply => "Reply",
            Command::Commit => "Commit",
            Command::StartViewChange => "StartViewChange",
            Command::DoViewChange => "DoViewChange",
            Command::StartView => "StartView",
            Command::Eviction => "Eviction",
            Command::ReplicaHello => "ReplicaHello",
            Command::ReplicaChallenge => "ReplicaChallenge",
            Command::ReplicaFinish => "ReplicaFinish",
            Command::RequestStartView => "RequestStartView",
            Command::RequestPrepares => "RequestPrepares",
            Command::RepairPrepare => "RepairPrepare",
            Command::RepairDone => "RepairDone",
            Command::RangeEvicted => "RangeEvicted",
            Command::RequestStateTransfer => "RequestStateTransfer",
            Command::StateTransferTarget => "StateTransferTarget",
            Command::RequestStateChunk => "RequestStateChunk",
            Command::StateChunk => "StateChunk",
            Command::ForwardRegister => "ForwardRegister",
            Command::ForwardRegisterResult => "ForwardRegisterResult",
            Command::ForwardLogout => "ForwardLogout",
            Command::ForwardLogoutResult => "ForwardLogoutResult",
        }
    }

    /// Commands whose frames must be exactly one 256-byte header.
    pub fn is_header_only(self) -> bool {
        matches!(
            self,
            Command::Commit
                | Command::PrepareOk
                | Command::StartViewChange
                | Command::RequestStartView
                | Command::RequestPrepares
                | Command::RepairDone
                | Command::RangeEvicted
                | Command::RequestStateTransfer
                | Command::RequestStateChunk
                | Command::ReplicaHello
                | Command::ReplicaChallenge
                | Command::ReplicaFinish
                | Command::ForwardRegister
        )
    }

    /// The seal regime of this command's header checksum.
    pub fn seal_kind(self) -> SealKind {
        match self {
            Command::Prepare | Command::RepairPrepare => SealKind::Identity,
            Command::Ping
            | Command::Pong
            | Command::PingClient
            | Command::PongClient
            | Command::Request
            | Command::Reply
            | Command::Eviction
            | Command::ReplicaHello
            | Command::ReplicaChallenge
            | Command::ReplicaFinish => SealKind::Unsealed,
            _ => SealKind::Frame,
        }
    }

    /// Whether checksum_body seals the body (DoViewChange and StartView suffixes; metadata
    /// prepares are decided by their group, see `wire::seal`).
    pub fn has_body_seal(self) -> bool {
        matches!(self, Command::DoViewChange | Command::StartView)
    }
}

/// The metadata plane's group (docs/protocol.md, "Consensus planes").
pub const METADATA_GROUP: u64 = 1 << 63;

/// Which consensus plane an operation is replicated on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plane {
    Metadata,
    Partition,
    /// NonReplicated reads: never journaled.
    None,
}

macro_rules! operations {
    ($($name:ident = $value:literal, $plane:ident, $internal:literal;)*) => {
        /// Operation byte of Request and Prepare (docs/protocol.md, "Command registry").
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Operation {
            $($name = $value,)*
        }

        impl Operation {
            /// Every operation of the table.
            pub const ALL: &'static [Operation] = &[$(Operation::$name,)*];

            /// Parses an operation byte; 0 and unlisted values are rejected.
            pub fn from_u8(value: u8) -> Option<Operation> {
                match value {
                    $($value => Some(Operation::$name),)*
                    _ => None,
                }
            }

            /// The table's name.
            pub fn name(self) -> &'static str {
                match self {
                    $(Operation::$name => stringify!($name),)*
                }
            }

            /// The plane the operation is replicated on.
            pub fn plane(self) -> Plane {
                match self {
                    $(Operation::$name => Plane::$plane,)*
                }
            }

            /// Internal operations are created by replicas, never accepted from a client.
            pub fn is_internal(self) -> bool {
                match self {
                    $(Operation::$name => $internal,)*
                }
            }
        }
    };
}

operations! {
    Register = 1, Metadata, false;
    NonReplicated = 2, None, false;
    Logout = 3, Metadata, false;
    CreateTopicWithAssignments = 64, Metadata, true;
    CreatePartitionsWithAssignments = 65, Metadata, true;
    RemoveConsumerGroupMember = 66, Metadata, true;
    CompleteConsumerGroupRevocation = 67, Metadata, true;
    TruncatePartition = 68, Metadata, true;
    CreateStream = 128, Metadata, false;
    UpdateStream = 129, Metadata, false;
    DeleteStream = 130, Metadata, false;
    PurgeStream = 131, Metadata, false;
    CreateTopic = 132, Metadata, false;
    UpdateTopic = 133, Metadata, false;
    DeleteTopic = 134, Metadata, false;
    PurgeTopic = 135, Metadata, false;
    CreatePartitions = 136, Metadata, false;
    DeletePartitions = 137, Metadata, false;
    // Resolved by the primary to TruncatePartition (68) before it is prepared.
    DeleteSegments = 138, Metadata, false;
    CreateConsumerGroup = 139, Metadata, false;
    DeleteConsumerGroup = 140, Metadata, false;
    CreateUser = 141, Metadata, false;
    UpdateUser = 142, Metadata, false;
    DeleteUser = 143, Metadata, false;
    ChangePassword = 144, Metadata, false;
    UpdatePermissions = 145, Metadata, false;
    CreatePersonalAccessToken = 146, Metadata, false;
    DeletePersonalAccessToken = 147, Metadata, false;
    JoinConsumerGroup = 148, Metadata, false;
    LeaveConsumerGroup = 149, Metadata, false;
    SendMessages = 160, Partition, false;
    StoreConsumerOffset = 161, Partition, false;
    DeleteConsumerOffset = 162, Partition, false;
}

macro_rules! eviction_reasons {
    ($($name:ident = $value:literal,)*) => {
        /// Eviction byte 255 (docs/protocol.md, "Command registry").
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum EvictionReason {
            $($name = $value,)*
        }

        impl EvictionReason {
            /// Parses a reason byte; 0 and unknown values are rejected.
            pub fn from_u8(value: u8) -> Option<EvictionReason> {
                match value {
                    $($value => Some(EvictionReason::$name),)*
                    _ => None,
                }
            }

            /// The table's name.
            pub fn name(self) -> &'static str {
                match self {
                    $(EvictionReason::$name => stringify!($name),)*
                }
            }
        }
    };
}

eviction_reasons! {
    NoSession = 1,
    ClientReleaseTooLow = 2,
    ClientReleaseTooHigh = 3,
    InvalidRequestOperation = 4,
    InvalidRequestBody = 5,
    InvalidRequestBodySize = 6,
    SessionTooLow = 7,
    SessionReleaseMismatch = 8,
    InvalidCredentials = 9,
    InvalidToken = 10,
    UserInactive = 11,
    SessionError = 12,
    StaleClient = 13,
    IncompatibleProtocol = 14,
    MalformedLogin = 15,
}

/// Protocol 0.11.0 packed as major << 16 | minor << 10 | patch (Eviction's version fields).
pub const PROTOCOL_VERSION: u32 = 11 << 10;

/// Outcome byte of ForwardRegisterResult.
pub const FORWARD_REGISTER_OUTCOME_MAX: u8 = 6;
/// Outcome byte of ForwardLogoutResult.
pub const FORWARD_LOGOUT_OUTCOME_MAX: u8 = 4;

/// Handshake status byte of ReplicaChallenge (4 and 5 are log-only labels, never sent).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStatus {
    Ok = 0,
    UnknownCommand = 1,
    ClusterMismatch = 2,
    DirectionalRule = 3,
    AuthRequired = 4,
    MacMismatch = 5,
}

impl HandshakeStatus {
    /// Parses a status byte; a dialer treats `None` as a rejection.
    pub fn from_u8(value: u8) -> Option<HandshakeStatus> {
        Some(match value {
            0 => HandshakeStatus::Ok,
            1 => HandshakeStatus::UnknownCommand,
            2 => HandshakeStatus::ClusterMismatch,
            3 => HandshakeStatus::DirectionalRule,
            4 => HandshakeStatus::AuthRequired,
            5 => HandshakeStatus::MacMismatch,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_bytes_round_trip_and_out_of_range_values_are_not_commands() {
        for value in 0..=255u8 {
            match Command::from_u8(value) {
                Some(command) => assert_eq!(command as u8, value),
                None => assert!(value == 0 || value > COMMAND_MAX),
            }
        }
    }

    #[test]
    fn protocol_version_0_11_0_packs_as_11264() {
        assert_eq!(PROTOCOL_VERSION, 11264);
    }

    #[test]
    fn operation_table_parses_only_listed_values() {
        let listed: Vec<u8> = Operation::ALL.iter().map(|op| *op as u8).collect();
        for value in 0..=255u8 {
            assert_eq!(Operation::from_u8(value).is_some(), listed.contains(&value));
        }
        assert_eq!(Operation::from_u8(160).unwrap().plane(), Plane::Partition);
        assert!(Operation::from_u8(68).unwrap().is_internal());
        assert!(!Operation::from_u8(128).unwrap().is_internal());
    }

    #[test]
    fn eviction_reason_zero_and_unknown_are_rejected() {
        assert!(EvictionReason::from_u8(0).is_none());
        assert!(EvictionReason::from_u8(16).is_none());
        assert_eq!(
            EvictionReason::from_u8(15),
            Some(EvictionReason::MalformedLogin)
        );
    }
}
