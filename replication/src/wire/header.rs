//! The 256-byte headers (docs/protocol.md, "Header layouts") as `#[repr(C)]` zerocopy types.
//!
//! Every header is the 128-byte common frame followed by a per-command area. Sizes,
//! alignment and every field offset are asserted at compile time, so a cast from an
//! aligned buffer is the whole decode. Fields named `reserved*` are written as zero.

use core::mem::{align_of, offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::registry::Command;

#[cfg(not(target_endian = "little"))]
compile_error!("wire headers are cast in place and assume a little-endian target");

/// Every header is exactly this many bytes.
pub const HEADER_SIZE: usize = 256;
/// Headers require this alignment to be cast in place.
pub const HEADER_ALIGN: usize = 16;

/// A header field's value as tools print it (docs/protocol.md names, integers in decimal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldValue {
    Int(u128),
    Bytes(Vec<u8>),
}

/// Converts a header field into a printable value.
pub trait ToFieldValue {
    fn to_field_value(&self) -> FieldValue;
}

macro_rules! int_field {
    ($($ty:ty),*) => {$(
        impl ToFieldValue for $ty {
            fn to_field_value(&self) -> FieldValue {
                FieldValue::Int(u128::from(*self))
            }
        }
    )*};
}
int_field!(u8, u32, u64, u128);

impl<const N: usize> ToFieldValue for [u8; N] {
    fn to_field_value(&self) -> FieldValue {
        FieldValue::Bytes(self.to_vec())
    }
}

/// The common frame, bytes 0..128 of every header.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct FrameHeader {
    pub checksum: u128,
    pub checksum_body: u128,
    pub cluster: u128,
    pub size: u32,
    pub view: u32,
    pub release: u32,
    pub command: u8,
    pub replica: u8,
    pub reserved_frame: [u8; 66],
}

const _: () = {
    assert!(size_of::<FrameHeader>() == 128);
    assert!(offset_of!(FrameHeader, checksum) == 0);
    assert!(offset_of!(FrameHeader, checksum_body) == 16);
    assert!(offset_of!(FrameHeader, cluster) == 32);
    assert!(offset_of!(FrameHeader, size) == 48);
    assert!(offset_of!(FrameHeader, view) == 52);
    assert!(offset_of!(FrameHeader, release) == 56);
    assert!(offset_of!(FrameHeader, command) == 60);
    assert!(offset_of!(FrameHeader, replica) == 61);
    assert!(offset_of!(FrameHeader, reserved_frame) == 62);
};

impl FrameHeader {
    /// Visits the common fields by their names in docs/protocol.md.
    pub fn visit_fields(&self, visit: &mut dyn FnMut(&'static str, FieldValue)) {
        visit("checksum", self.checksum.to_field_value());
        visit("checksum_body", self.checksum_body.to_field_value());
        visit("cluster", self.cluster.to_field_value());
        visit("size", self.size.to_field_value());
        visit("view", self.view.to_field_value());
        visit("release", self.release.to_field_value());
        visit("command", self.command.to_field_value());
        visit("replica", self.replica.to_field_value());
    }
}

/// The object-safe part of a header: its common frame, its fields, its reserved bytes.
pub trait HeaderFields {
    /// The common frame.
    fn frame(&self) -> &FrameHeader;
    /// Visits the per-command fields (reserved regions excluded) by docs/protocol.md name.
    fn visit_fields(&self, visit: &mut dyn FnMut(&'static str, FieldValue));
    /// Absolute offset of the first non-zero byte in a per-command reserved region.
    fn reserved_nonzero_at(&self) -> Option<usize>;
}

/// A 256-byte header type bound to the commands that use its layout.
pub trait Header:
    HeaderFields + FromBytes + IntoBytes + KnownLayout + Immutable + Copy + Sized
{
    /// The commands this layout serves; the first is the one builders stamp.
    const COMMANDS: &'static [Command];
    /// The common frame, mutable.
    fn frame_mut(&mut self) -> &mut FrameHeader;
    /// A header of this type with every byte zero but the command.
    fn new() -> Self {
        let mut header = Self::new_zeroed();
        header.frame_mut().command = Self::COMMANDS[0] as u8;
        header
    }
}

macro_rules! header {
    (
        $(#[$meta:meta])*
        $name:ident [$($command:ident),+] {
            $($field:ident : $ty:ty = $offset:literal,)*
        }
    ) => {
        $(#[$meta])*
        #[repr(C, align(16))]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable)]
        pub struct $name {
            pub frame: FrameHeader,
            $(pub $field: $ty,)*
        }

        const _: () = {
            assert!(size_of::<$name>() == HEADER_SIZE);
            assert!(align_of::<$name>() == HEADER_ALIGN);
            $(assert!(offset_of!($name, $field) == $offset);)*
        };

        impl HeaderFields for $name {
            fn frame(&self) -> &FrameHeader {
                &self.frame
            }

            fn visit_fields(&self, visit: &mut dyn FnMut(&'static str, FieldValue)) {
                $(
                    if !stringify!($field).starts_with("reserved") {
                        visit(stringify!($field), self.$field.to_field_value());
                    }
                )*
            }

            fn reserved_nonzero_at(&self) -> Option<usize> {
                $(
                    if stringify!($field).starts_with("reserved") {
                        if let Some(i) = self.$field.as_bytes().iter().position(|b| *b != 0) {
                            return Some($offset + i);
                        }
                    }
                )*
                None
            }
        }

        impl Header for $name {
            const COMMANDS: &'static [Command] = &[$(Command::$command),+];

            fn frame_mut(&mut self) -> &mut FrameHeader {
                &mut self.frame
            }
        }
    };
}

header! {
    /// Any frame, before its command is known: the common frame and a raw command area.
    GenericHeader [Ping, Pong, PingClient, PongClient] {
        command_area: [u8; 128] = 128,
    }
}

header! {
    /// Request (5): client in; forwarded on the replica plane. Unsealed.
    RequestHeader [Request] {
        client: u128 = 128,
        request_checksum: u128 = 144,
        timestamp: u64 = 160,
        request: u64 = 168,
        operation: u8 = 176,
        reserved_a: [u8; 7] = 177,
        session: u64 = 184,
        user_id: u32 = 192,
        read_command: u32 = 196,
        reserved_tail: [u8; 56] = 200,
    }
}

header! {
    /// Prepare (6) and RepairPrepare (19): checksum is the prepare identity.
    PrepareHeader [Prepare, RepairPrepare] {
        client: u128 = 128,
        parent: u128 = 144,
        request_checksum: u128 = 160,
        op: u64 = 176,
        commit: u64 = 184,
        timestamp: u64 = 192,
        request: u64 = 200,
        operation: u8 = 208,
        reserved_a: [u8; 7] = 209,
        group: u64 = 216,
        user_id: u32 = 224,
        reserved_tail: [u8; 28] = 228,
    }
}

header! {
    /// PrepareOk (7): header-only, sent to the view's primary.
    PrepareOkHeader [PrepareOk] {
        parent: u128 = 128,
        prepare_checksum: u128 = 144,
        op: u64 = 160,
        commit: u64 = 168,
        timestamp: u64 = 176,
        request: u64 = 184,
        operation: u8 = 192,
        reserved_a: [u8; 7] = 193,
        group: u64 = 200,
        reserved_tail: [u8; 48] = 208,
    }
}

header! {
    /// Reply (8): client-bound only.
    ReplyHeader [Reply] {
        request_checksum: u128 = 128,
        context: u128 = 144,
        client: u128 = 160,
        op: u64 = 176,
        commit: u64 = 184,
        timestamp: u64 = 192,
        request: u64 = 200,
        operation: u8 = 208,
        reserved_a: [u8; 7] = 209,
        status: u32 = 216,
        reserved_tail: [u8; 36] = 220,
    }
}

header! {
    /// Commit (9): the heartbeat; header-only broadcast.
    CommitHeader [Commit] {
        commit_checksum: u128 = 128,
        timestamp_monotonic: u64 = 144,
        commit: u64 = 152,
        checkpoint_op: u64 = 160,
        group: u64 = 168,
        reserved_tail: [u8; 80] = 176,
    }
}

header! {
    /// StartViewChange (10): header-only.
    StartViewChangeHeader [StartViewChange] {
        group: u64 = 128,
        reserved_tail: [u8; 120] = 136,
    }
}

header! {
    /// DoViewChange (11): body is the log suffix as packed Prepare headers.
    DoViewChangeHeader [DoViewChange] {
        op: u64 = 128,
        commit: u64 = 136,
        group: u64 = 144,
        log_view: u32 = 152,
        reserved_a: [u8; 68] = 156,
        nack_bitset: u128 = 224,
        present_bitset: u128 = 240,
    }
}

header! {
    /// StartView (12): body is the view's suffix, highest op first.
    StartViewHeader [StartView] {
        op: u64 = 128,
        commit: u64 = 136,
        group: u64 = 144,
        reserved_a: [u8; 88] = 152,
        incarnation: u128 = 240,
    }
}

header! {
    /// Eviction (13): client-bound only.
    EvictionHeader [Eviction] {
        client: u128 = 128,
        server_protocol_version: u32 = 144,
        server_protocol_version_min: u32 = 148,
        reserved_a: [u8; 103] = 152,
        reason: u8 = 255,
    }
}

header! {
    /// ReplicaHello (14): dialer to acceptor; an all-zero nonce is an unauthenticated hello.
    ReplicaHelloHeader [ReplicaHello] {
        nonce_d: [u8; 32] = 128,
        reserved_tail: [u8; 96] = 160,
    }
}

header! {
    /// ReplicaChallenge (15): acceptor to dialer.
    ReplicaChallengeHeader [ReplicaChallenge] {
        nonce_a: [u8; 32] = 128,
        mac_a: [u8; 32] = 160,
        status: u8 = 192,
        reserved_tail: [u8; 63] = 193,
    }
}

header! {
    /// ReplicaFinish (16): dialer to acceptor.
    ReplicaFinishHeader [ReplicaFinish] {
        reserved_a: [u8; 32] = 128,
        mac_d: [u8; 32] = 160,
        reserved_tail: [u8; 64] = 192,
    }
}

header! {
    /// RequestStartView (17): the recovery probe.
    RequestStartViewHeader [RequestStartView] {
        group: u64 = 128,
        reserved_a: [u8; 104] = 136,
        incarnation: u128 = 240,
    }
}

header! {
    /// RequestPrepares (18): asks a peer for journaled prepares from_op..=to_op.
    RequestPreparesHeader [RequestPrepares] {
        nonce: u128 = 128,
        from_op: u64 = 144,
        to_op: u64 = 152,
        group: u64 = 160,
        reserved_tail: [u8; 88] = 168,
    }
}

header! {
    /// RepairDone (20) and RangeEvicted (21): one layout under two command bytes.
    RepairResultHeader [RepairDone, RangeEvicted] {
        nonce: u128 = 128,
        op: u64 = 144,
        group: u64 = 152,
        reserved_tail: [u8; 96] = 160,
    }
}

header! {
    /// RequestStateTransfer (22).
    RequestStateTransferHeader [RequestStateTransfer] {
        nonce: u128 = 128,
        group: u64 = 144,
        reserved_tail: [u8; 104] = 152,
    }
}

header! {
    /// StateTransferTarget (23): body is the ISM1 manifest unless available = 0.
    StateTransferTargetHeader [StateTransferTarget] {
        nonce: u128 = 128,
        commit_op: u64 = 144,
        group: u64 = 152,
        available: u8 = 160,
        unavailable_transient: u8 = 161,
        reserved_a: [u8; 6] = 162,
        commit_max: u64 = 168,
        reserved_tail: [u8; 80] = 176,
    }
}

header! {
    /// RequestStateChunk (24): len describes the reply and is clamped by the server.
    RequestStateChunkHeader [RequestStateChunk] {
        nonce: u128 = 128,
        offset: u64 = 144,
        group: u64 = 152,
        len: u32 = 160,
        artifact: u32 = 164,
        reserved_tail: [u8; 88] = 168,
    }
}

header! {
    /// StateChunk (25): body is raw artifact bytes.
    StateChunkHeader [StateChunk] {
        nonce: u128 = 128,
        offset: u64 = 144,
        group: u64 = 152,
        artifact: u32 = 160,
        reserved_tail: [u8; 92] = 164,
    }
}

header! {
    /// ForwardRegister (26): a backup forwards a verified identity to the primary.
    ForwardRegisterHeader [ForwardRegister] {
        client: u128 = 128,
        nonce: u128 = 144,
        user_id: u32 = 160,
        reserved_tail: [u8; 92] = 164,
    }
}

header! {
    /// ForwardRegisterResult (27).
    ForwardRegisterResultHeader [ForwardRegisterResult] {
        nonce: u128 = 128,
        client: u128 = 144,
        epoch: u64 = 160,
        watermark: u64 = 168,
        reserved_tail: [u8; 79] = 176,
        outcome: u8 = 255,
    }
}

header! {
    /// ForwardLogout (28).
    ForwardLogoutHeader [ForwardLogout] {
        client: u128 = 128,
        nonce: u128 = 144,
        session: u64 = 160,
        request: u64 = 168,
        reserved_tail: [u8; 80] = 176,
    }
}

header! {
    /// ForwardLogoutResult (29).
    ForwardLogoutResultHeader [ForwardLogoutResult] {
        nonce: u128 = 128,
        client: u128 = 144,
        commit: u64 = 160,
        reserved_tail: [u8; 87] = 168,
        outcome: u8 = 255,
    }
}

/// Casts the first 256 bytes to the header layout of `command` and hands it to `f`,
/// without validating anything (for tools that print what a frame claims).
pub fn with_fields_of<R>(
    command: Command,
    header: &[u8; HEADER_SIZE],
    f: impl FnOnce(&dyn HeaderFields) -> R,
) -> R {
    fn cast<H: Header>(bytes: &[u8; HEADER_SIZE]) -> H {
        // A copy, not a cast: `bytes` carries no alignment guarantee here.
        H::read_from_bytes(bytes).unwrap_or_else(|_| unreachable!("256 bytes fit every header"))
    }
    match command {
        Command::Ping | Command::Pong | Command::PingClient | Command::PongClient => {
            f(&cast::<GenericHeader>(header))
        }
        Command::Request => f(&cast::<RequestHeader>(header)),
        Command::Prepare | Command::RepairPrepare => f(&cast::<PrepareHeader>(header)),
        Command::PrepareOk => f(&cast::<PrepareOkHeader>(header)),
        Command::Reply => f(&cast::<ReplyHeader>(header)),
        Command::Commit => f(&cast::<CommitHeader>(header)),
        Command::StartViewChange => f(&cast::<StartViewChangeHeader>(header)),
        Command::DoViewChange => f(&cast::<DoViewChangeHeader>(header)),
        Command::StartView => f(&cast::<StartViewHeader>(header)),
        Command::Eviction => f(&cast::<EvictionHeader>(header)),
        Command::ReplicaHello => f(&cast::<ReplicaHelloHeader>(header)),
        Command::ReplicaChallenge => f(&cast::<ReplicaChallengeHeader>(header)),
        Command::ReplicaFinish => f(&cast::<ReplicaFinishHeader>(header)),
        Command::RequestStartView => f(&cast::<RequestStartViewHeader>(header)),
        Command::RequestPrepares => f(&cast::<RequestPreparesHeader>(header)),
        Command::RepairDone | Command::RangeEvicted => f(&cast::<RepairResultHeader>(header)),
        Command::RequestStateTransfer => f(&cast::<RequestStateTransferHeader>(header)),
        Command::StateTransferTarget => f(&cast::<StateTransferTargetHeader>(header)),
        Command::RequestStateChunk => f(&cast::<RequestStateChunkHeader>(header)),
        Command::StateChunk => f(&cast::<StateChunkHeader>(header)),
        Command::ForwardRegister => f(&cast::<ForwardRegisterHeader>(header)),
        Command::ForwardRegisterResult => f(&cast::<ForwardRegisterResultHeader>(header)),
        Command::ForwardLogout => f(&cast::<ForwardLogoutHeader>(header)),
        Command::ForwardLogoutResult => f(&cast::<ForwardLogoutResultHeader>(header)),
    }
}
