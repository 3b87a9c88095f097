//! Frame validation: one place that every listener, repair and state transfer uses.
//!
//! `check_header` runs the checks that need only the 256-byte header (what the bus can
//! do before reading a body); `decode` runs all of them and hands back a typed, verified
//! `Message` that borrows the buffer. Nothing here panics on any input.

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::batch;
use super::cluster::{group_kind, GroupKind};
use super::error::FrameError;
use super::frame::{control_body_seal, frame_seal, prepare_body_sealed, prepare_identity, seal_of};
use super::header::*;
use super::registry::{
    Command, EvictionReason, Operation, Plane, SealKind, FORWARD_LOGOUT_OUTCOME_MAX,
    FORWARD_REGISTER_OUTCOME_MAX,
};

/// Default message_bus.max_message_size: 64 MiB.
pub const MAX_MESSAGE_SIZE_DEFAULT: u32 = 64 * 1024 * 1024;
/// DoViewChange and StartView carry at most this many suffix headers (the bitsets are u128).
pub const SUFFIX_MAX: usize = 128;

/// Limits a receiver applies to every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_message_size: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_message_size: MAX_MESSAGE_SIZE_DEFAULT,
        }
    }
}

/// What the header alone says about a frame: enough to read its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderInfo {
    pub command: Command,
    pub size: u32,
}

impl HeaderInfo {
    /// Body bytes that follow the header.
    pub fn body_len(&self) -> usize {
        self.size as usize - HEADER_SIZE
    }
}

/// A verified frame: header references into the buffer and the body.
#[derive(Clone, Copy, Debug)]
pub enum Message<'a> {
    Request(&'a RequestHeader, &'a [u8]),
    Prepare(&'a PrepareHeader, &'a [u8]),
    RepairPrepare(&'a PrepareHeader, &'a [u8]),
    PrepareOk(&'a PrepareOkHeader),
    Reply(&'a ReplyHeader, &'a [u8]),
    Commit(&'a CommitHeader),
    StartViewChange(&'a StartViewChangeHeader),
    DoViewChange(&'a DoViewChangeHeader, &'a [PrepareHeader]),
    StartView(&'a StartViewHeader, &'a [PrepareHeader]),
    Eviction(&'a EvictionHeader),
    ReplicaHello(&'a ReplicaHelloHeader),
    ReplicaChallenge(&'a ReplicaChallengeHeader),
    ReplicaFinish(&'a ReplicaFinishHeader),
    RequestStartView(&'a RequestStartViewHeader),
    RequestPrepares(&'a RequestPreparesHeader),
    RepairDone(&'a RepairResultHeader),
    RangeEvicted(&'a RepairResultHeader),
    RequestStateTransfer(&'a RequestStateTransferHeader),
    StateTransferTarget(&'a StateTransferTargetHeader, &'a [u8]),
    RequestStateChunk(&'a RequestStateChunkHeader),
    StateChunk(&'a StateChunkHeader, &'a [u8]),
    ForwardRegister(&'a ForwardRegisterHeader),
    ForwardRegisterResult(&'a ForwardRegisterResultHeader),
    ForwardLogout(&'a ForwardLogoutHeader),
    ForwardLogoutResult(&'a ForwardLogoutResultHeader),
}

impl Message<'_> {
    /// The typed header, for printing its fields.
    pub fn header_fields(&self) -> &dyn HeaderFields {
        match *self {
            Message::Request(h, _) => h,
            Message::Prepare(h, _) | Message::RepairPrepare(h, _) => h,
            Message::PrepareOk(h) => h,
            Message::Reply(h, _) => h,
            Message::Commit(h) => h,
            Message::StartViewChange(h) => h,
            Message::DoViewChange(h, _) => h,
            Message::StartView(h, _) => h,
            Message::Eviction(h) => h,
            Message::ReplicaHello(h) => h,
            Message::ReplicaChallenge(h) => h,
            Message::ReplicaFinish(h) => h,
            Message::RequestStartView(h) => h,
            Message::RequestPrepares(h) => h,
            Message::RepairDone(h) | Message::RangeEvicted(h) => h,
            Message::RequestStateTransfer(h) => h,
            Message::StateTransferTarget(h, _) => h,
            Message::RequestStateChunk(h) => h,
            Message::StateChunk(h, _) => h,
            Message::ForwardRegister(h) => h,
            Message::ForwardRegisterResult(h) => h,
            Message::ForwardLogout(h) => h,
            Message::ForwardLogoutResult(h) => h,
        }
    }

    /// The command of the frame.
    pub fn command(&self) -> Command {
        match self {
            Message::Request(..) => Command::Request,
            Message::Prepare(..) => Command::Prepare,
            Message::RepairPrepare(..) => Command::RepairPrepare,
            Message::PrepareOk(..) => Command::PrepareOk,
            Message::Reply(..) => Command::Reply,
            Message::Commit(..) => Command::Commit,
            Message::StartViewChange(..) => Command::StartViewChange,
            Message::DoViewChange(..) => Command::DoViewChange,
            Message::StartView(..) => Command::StartView,
            Message::Eviction(..) => Command::Eviction,
            Message::ReplicaHello(..) => Command::ReplicaHello,
            Message::ReplicaChallenge(..) => Command::ReplicaChallenge,
            Message::ReplicaFinish(..) => Command::ReplicaFinish,
            Message::RequestStartView(..) => Command::RequestStartView,
            Message::RequestPrepares(..) => Command::RequestPrepares,
            Message::RepairDone(..) => Command::RepairDone,
            Message::RangeEvicted(..) => Command::RangeEvicted,
            Message::RequestStateTransfer(..) => Command::RequestStateTransfer,
            Message::StateTransferTarget(..) => Command::StateTransferTarget,
            Message::RequestStateChunk(..) => Command::RequestStateChunk,
            Message::StateChunk(..) => Command::StateChunk,
            Message::ForwardRegister(..) => Command::ForwardRegister,
            Message::ForwardRegisterResult(..) => Command::ForwardRegisterResult,
            Message::ForwardLogout(..) => Command::ForwardLogout,
            Message::ForwardLogoutResult(..) => Command::ForwardLogoutResult,
        }
    }
}

fn generic(bytes: &[u8]) -> Result<&GenericHeader, FrameError> {
    if bytes.len() < HEADER_SIZE {
        return Err(FrameError::TooShort { len: bytes.len() });
    }
    GenericHeader::ref_from_prefix(bytes)
        .map(|(header, _)| header)
        .map_err(|_| FrameError::Misaligned)
}

/// The checks that need only the header: alignment, size bounds, command, release and
/// the header-only rule. `bytes` may hold just the header.
pub fn check_header(bytes: &[u8], limits: &Limits) -> Result<HeaderInfo, FrameError> {
    let frame = &generic(bytes)?.frame;
    let size = frame.size;
    if (size as usize) < HEADER_SIZE {
        return Err(FrameError::SizeTooSmall { size });
    }
    if size > limits.max_message_size {
        return Err(FrameError::SizeTooLarge {
            size,
            max: limits.max_message_size,
        });
    }
    let command = Command::from_u8(frame.command).ok_or(FrameError::CommandInvalid {
        command: frame.command,
    })?;
    if matches!(
        command,
        Command::Ping | Command::Pong | Command::PingClient | Command::PongClient
    ) {
        return Err(FrameError::CommandUnused { command });
    }
    if frame.release != 0 {
        return Err(FrameError::ReleaseNonZero {
            release: frame.release,
        });
    }
    if command.is_header_only() && size as usize != HEADER_SIZE {
        return Err(FrameError::HeaderOnlyWithBody { command, size });
    }
    Ok(HeaderInfo { command, size })
}

/// Fully validates one frame (`bytes` is exactly the frame, 16-byte aligned) and returns
/// it typed. Seals are verified before any field rule.
pub fn decode<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Message<'a>, FrameError> {
    let command = check_seals(bytes, limits)?;
    decode_typed(command, bytes, &bytes[HEADER_SIZE..], Bodies::Verify)
}

/// The header-only rules and the seals (frame seal, body seal, unsealed-zero rule).
fn check_seals(bytes: &[u8], limits: &Limits) -> Result<Command, FrameError> {
    let command = check_whole(bytes, limits)?;
    let (head, body) = bytes.split_at(HEADER_SIZE);
    let head: &[u8; HEADER_SIZE] = head.try_into().map_err(|_| FrameError::Misaligned)?;
    let frame = &generic(bytes)?.frame;
    // Client and handshake frames leave both checksum fields zero (docs/protocol.md,
    // "Handshake" and "Frame integrity"). Checking it means a bit
    // flip in a sealed frame's command byte cannot turn it into an unsealed one.
    if command.seal_kind() == SealKind::Unsealed
        && (frame.checksum != 0 || frame.checksum_body != 0)
    {
        return Err(FrameError::UnsealedChecksumNonZero { command });
    }
    if command.seal_kind() == SealKind::Frame {
        if frame.checksum != frame_seal(head) {
            return Err(FrameError::FrameSealMismatch { command });
        }
        let expected_body = if command.has_body_seal() {
            control_body_seal(body)
        } else {
            0
        };
        // An empty suffix sealed as the XxHash3 of no bytes (older builds) is accepted too.
        let legacy_empty =
            command.has_body_seal() && body.is_empty() && frame.checksum_body == seal_of(body);
        if frame.checksum_body != expected_body && !legacy_empty {
            return Err(if command.has_body_seal() {
                FrameError::BodySealMismatch { command }
            } else {
                FrameError::BodySealNotZero { command }
            });
        }
    }
    Ok(command)
}

/// Whether decoding re-checks what covers a body (a batch's message checksums).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bodies {
    Verify,
    Trusted,
    /// Seals checked, a partition prepare's batch not (it is checked where it is used).
    FrameOnly,
}

/// The frame-level verdict alone: as `decode`, but a partition-plane prepare's body is
/// not checked as a message batch (`batch::verify` gives that verdict apart). Replicas
/// use `decode`, which refuses a bad batch before it can be journaled.
pub fn decode_frame<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Message<'a>, FrameError> {
    let command = check_seals(bytes, limits)?;
    decode_typed(command, bytes, &bytes[HEADER_SIZE..], Bodies::FrameOnly)
}

/// Types a frame that already passed `decode` (the bus's `VerifiedFrame`, a `Frame` this
/// node sealed): the header-only and field rules again, but not the seals or a batch's
/// message checksums, which cost a pass over the body each.
pub fn decode_trusted<'a>(bytes: &'a [u8], limits: &Limits) -> Result<Message<'a>, FrameError> {
    let command = check_whole(bytes, limits)?;
    decode_typed(command, bytes, &bytes[HEADER_SIZE..], Bodies::Trusted)
}

/// The header-only rules, and `bytes` is exactly the frame the header sizes.
fn check_whole(bytes: &[u8], limits: &Limits) -> Result<Command, FrameError> {
    let info = check_header(bytes, limits)?;
    if info.size as usize != bytes.len() {
        return Err(FrameError::SizeMismatch {
            size: info.size,
            len: bytes.len(),
        });
    }
    Ok(info.command)
}

fn cast<H: Header>(bytes: &[u8]) -> Result<&H, FrameError> {
    H::ref_from_prefix(bytes)
        .map(|(header, _)| header)
        .map_err(|_| FrameError::Misaligned)
}

fn check_reserved<H: Header>(header: &H, command: Command) -> Result<(), FrameError> {
    if let Some(i) = header.frame().reserved_frame.iter().position(|b| *b != 0) {
        return Err(FrameError::ReservedNonZero {
            command,
            offset: 62 + i,
        });
    }
    check_reserved_tail(header, command)
}

fn check_reserved_tail<H: Header>(header: &H, command: Command) -> Result<(), FrameError> {
    match header.reserved_nonzero_at() {
        Some(offset) => Err(FrameError::ReservedNonZero { command, offset }),
        None => Ok(()),
    }
}

/// Consensus headers carry either the metadata group or a packed partition key.
fn check_group(command: Command, group: u64) -> Result<(), FrameError> {
    match group_kind(group) {
        Ok(_) => Ok(()),
        Err(_) => Err(FrameError::GroupInvalid { command, group }),
    }
}

/// Whether a DoViewChange suffix entry is a blank placeholder for an op its sender never
/// prepared: command Prepare, operation Reserved (0), `op` set and every other byte zero.
/// The reference implementation sends them at the indexes whose nack bit is set; they
/// name no prepare and are never taken for one.
pub fn is_suffix_placeholder(header: &PrepareHeader) -> bool {
    let mut blank = PrepareHeader::new_zeroed();
    blank.frame.command = Command::Prepare as u8;
    blank.op = header.op;
    header.op != 0 && header.as_bytes() == blank.as_bytes()
}

/// The suffix headers of a DoViewChange or StartView body. Entries whose bit is set in
/// `placeholders` may be blank placeholders (`is_suffix_placeholder`).
fn suffix(body: &[u8], placeholders: u128) -> Result<&[PrepareHeader], FrameError> {
    if !body.len().is_multiple_of(HEADER_SIZE) {
        return Err(FrameError::SuffixNotWhole { len: body.len() });
    }
    let count = body.len() / HEADER_SIZE;
    if count > SUFFIX_MAX {
        return Err(FrameError::SuffixTooLong { count });
    }
    let headers = <[PrepareHeader]>::ref_from_bytes(body).map_err(|_| FrameError::Misaligned)?;
    for (index, header) in headers.iter().enumerate() {
        let placeholder_allowed = index < 128 && placeholders & (1 << index) != 0;
        if placeholder_allowed && is_suffix_placeholder(header) {
            continue;
        }
        if header.frame.command != Command::Prepare as u8
            || header.frame.checksum != prepare_identity(header)
        {
            return Err(FrameError::SuffixEntryInvalid { index });
        }
    }
    Ok(headers)
}

/// Bits at or above `count` must be clear.
fn bits_within(bits: u128, count: usize) -> bool {
    count >= 128 || bits >> count == 0
}

/// Prepare and RepairPrepare: identity, body seal regime, reserved bytes, operation.
fn decode_prepare<'a>(
    command: Command,
    bytes: &'a [u8],
    body: &'a [u8],
    bodies: Bodies,
) -> Result<&'a PrepareHeader, FrameError> {
    let header: &PrepareHeader = cast(bytes)?;
    if header.frame.checksum != prepare_identity(header) {
        return Err(FrameError::PrepareIdentityMismatch { op: header.op });
    }
    check_group(command, header.group)?;
    if prepare_body_sealed(header) {
        if bodies != Bodies::Trusted && header.frame.checksum_body != seal_of(body) {
            return Err(FrameError::BodySealMismatch { command });
        }
    } else if header.frame.checksum_body != 0 {
        return Err(FrameError::BodySealNotZero { command });
    }
    check_reserved(header, command)?;
    let operation = Operation::from_u8(header.operation).ok_or(FrameError::OperationInvalid {
        operation: header.operation,
    })?;
    let plane_matches = match operation.plane() {
        Plane::Metadata => prepare_body_sealed(header),
        Plane::Partition => !prepare_body_sealed(header),
        Plane::None => false,
    };
    if !plane_matches {
        return Err(FrameError::OperationNotAllowed {
            command,
            operation: header.operation,
        });
    }
    if operation == Operation::SendMessages && bodies == Bodies::Verify {
        batch::verify(body)?;
    }
    Ok(header)
}

fn decode_request(bytes: &[u8]) -> Result<&RequestHeader, FrameError> {
    let header: &RequestHeader = cast(bytes)?;
    check_request(header)?;
    Ok(header)
}

/// The field rules of a Request header (what `decode` checks after the header-only
/// rules), for a header a driver holds apart from its frame.
pub fn check_request(header: &RequestHeader) -> Result<(), FrameError> {
    if header.client == 0 {
        return Err(FrameError::ClientZero);
    }
    let operation = Operation::from_u8(header.operation).ok_or(FrameError::OperationInvalid {
        operation: header.operation,
    })?;
    if operation.is_internal() {
        return Err(FrameError::OperationNotAllowed {
            command: Command::Request,
            operation: header.operation,
        });
    }
    match operation {
        Operation::Register if header.session != 0 || header.request != 0 => {
            Err(FrameError::RegisterWithSession)
        }
        Operation::Register | Operation::NonReplicated => Ok(()),
        _ if header.session == 0 || header.request == 0 => Err(FrameError::SessionMissing),
        _ => Ok(()),
    }
}

fn decode_typed<'a>(
    command: Command,
    bytes: &'a [u8],
    body: &'a [u8],
    bodies: Bodies,
) -> Result<Message<'a>, FrameError> {
    use Command as C;
    Ok(match command {
        C::Ping | C::Pong | C::PingClient | C::PongClient => {
            return Err(FrameError::CommandUnused { command })
        }
        C::Request => Message::Request(decode_request(bytes)?, body),
        C::Prepare => Message::Prepare(decode_prepare(command, bytes, body, bodies)?, body),
        C::RepairPrepare => {
            Message::RepairPrepare(decode_prepare(command, bytes, body, bodies)?, body)
        }
        C::PrepareOk => {
            let h: &PrepareOkHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::PrepareOk(h)
        }
        C::Reply => Message::Reply(cast(bytes)?, body),
        C::Commit => {
            let h: &CommitHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::Commit(h)
        }
        C::StartViewChange => {
            let h: &StartViewChangeHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::StartViewChange(h)
        }
        C::DoViewChange => {
            let h: &DoViewChangeHeader = cast(bytes)?;
            check_group(command, h.group)?;
            let entries = suffix(body, h.nack_bitset)?;
            if h.commit > h.op {
                return Err(FrameError::CommitAheadOfOp {
                    commit: h.commit,
                    op: h.op,
                });
            }
            if h.log_view > h.frame.view {
                return Err(FrameError::LogViewAheadOfView {
                    log_view: h.log_view,
                    view: h.frame.view,
                });
            }
            if !bits_within(h.nack_bitset, entries.len())
                || !bits_within(h.present_bitset, entries.len())
            {
                return Err(FrameError::BitsetBeyondSuffix {
                    count: entries.len(),
                });
            }
            Message::DoViewChange(h, entries)
        }
        C::StartView => {
            let h: &StartViewHeader = cast(bytes)?;
            check_group(command, h.group)?;
            let entries = suffix(body, 0)?;
            if h.commit > h.op {
                return Err(FrameError::CommitAheadOfOp {
                    commit: h.commit,
                    op: h.op,
                });
            }
            Message::StartView(h, entries)
        }
        C::Eviction => {
            let h: &EvictionHeader = cast(bytes)?;
            check_reserved(h, command)?;
            if EvictionReason::from_u8(h.reason).is_none() {
                return Err(FrameError::EvictionReasonInvalid { reason: h.reason });
            }
            Message::Eviction(h)
        }
        C::ReplicaHello => Message::ReplicaHello(cast(bytes)?),
        C::ReplicaChallenge => Message::ReplicaChallenge(cast(bytes)?),
        C::ReplicaFinish => Message::ReplicaFinish(cast(bytes)?),
        C::RequestStartView => {
            let h: &RequestStartViewHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::RequestStartView(h)
        }
        C::RequestPrepares => {
            let h: &RequestPreparesHeader = cast(bytes)?;
            check_group(command, h.group)?;
            if h.from_op == 0 || h.from_op > h.to_op {
                return Err(FrameError::RepairRangeInvalid {
                    from_op: h.from_op,
                    to_op: h.to_op,
                });
            }
            Message::RequestPrepares(h)
        }
        C::RepairDone | C::RangeEvicted => {
            let h: &RepairResultHeader = cast(bytes)?;
            check_group(command, h.group)?;
            if command == C::RepairDone {
                Message::RepairDone(h)
            } else {
                Message::RangeEvicted(h)
            }
        }
        C::RequestStateTransfer => {
            let h: &RequestStateTransferHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::RequestStateTransfer(h)
        }
        C::StateTransferTarget => {
            let h: &StateTransferTargetHeader = cast(bytes)?;
            check_group(command, h.group)?;
            if h.available != 0 && h.unavailable_transient != 0 {
                return Err(FrameError::TargetFlagsConflict);
            }
            if h.available == 0 && !body.is_empty() {
                return Err(FrameError::TargetRefusalWithBody { size: h.frame.size });
            }
            Message::StateTransferTarget(h, body)
        }
        C::RequestStateChunk => {
            let h: &RequestStateChunkHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::RequestStateChunk(h)
        }
        C::StateChunk => {
            let h: &StateChunkHeader = cast(bytes)?;
            check_group(command, h.group)?;
            Message::StateChunk(h, body)
        }
        C::ForwardRegister => {
            let h: &ForwardRegisterHeader = cast(bytes)?;
            check_reserved_tail(h, command)?;
            if h.nonce == 0 {
                return Err(FrameError::NonceZero);
            }
            Message::ForwardRegister(h)
        }
        C::ForwardRegisterResult => {
            let h: &ForwardRegisterResultHeader = cast(bytes)?;
            check_reserved_tail(h, command)?;
            if h.outcome > FORWARD_REGISTER_OUTCOME_MAX {
                return Err(FrameError::OutcomeInvalid {
                    command,
                    outcome: h.outcome,
                });
            }
            if h.outcome != 0 && (h.epoch != 0 || h.watermark != 0) {
                return Err(FrameError::OutcomeFieldsNonZero { outcome: h.outcome });
            }
            Message::ForwardRegisterResult(h)
        }
        C::ForwardLogout => {
            let h: &ForwardLogoutHeader = cast(bytes)?;
            check_reserved_tail(h, command)?;
            Message::ForwardLogout(h)
        }
        C::ForwardLogoutResult => {
            let h: &ForwardLogoutResultHeader = cast(bytes)?;
            check_reserved_tail(h, command)?;
            if h.outcome > FORWARD_LOGOUT_OUTCOME_MAX {
                return Err(FrameError::OutcomeInvalid {
                    command,
                    outcome: h.outcome,
                });
            }
            Message::ForwardLogoutResult(h)
        }
    })
}

/// Parses a verified frame as one specific header type: a frame of another command is
/// refused (a PrepareOk is never accepted where a Commit is expected).
pub fn decode_as<'a, H: Header>(bytes: &'a [u8], limits: &Limits) -> Result<&'a H, FrameError> {
    let message = decode(bytes, limits)?;
    let command = message.command();
    if !H::COMMANDS.contains(&command) {
        return Err(FrameError::CommandMismatch {
            expected: H::COMMANDS[0],
            found: command as u8,
        });
    }
    cast(bytes)
}

/// Splits a byte stream of concatenated frames by their size fields, for tools. Stops at
/// the first frame whose size cannot be trusted and returns the rest as one piece.
pub fn split_frames(mut bytes: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let size = bytes
            .get(48..52)
            .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]) as usize);
        match size {
            Some(size) if size >= HEADER_SIZE && size <= bytes.len() => {
                let (frame, rest) = bytes.split_at(size);
                frames.push(frame);
                bytes = rest;
            }
            _ => {
                frames.push(bytes);
                break;
            }
        }
    }
    frames
}

/// Reads the group a consensus frame routes by, if the command carries one.
pub fn group_of(message: &Message<'_>) -> Option<u64> {
    Some(match message {
        Message::Prepare(h, _) | Message::RepairPrepare(h, _) => h.group,
        Message::PrepareOk(h) => h.group,
        Message::Commit(h) => h.group,
        Message::StartViewChange(h) => h.group,
        Message::DoViewChange(h, _) => h.group,
        Message::StartView(h, _) => h.group,
        Message::RequestStartView(h) => h.group,
        Message::RequestPrepares(h) => h.group,
        Message::RepairDone(h) | Message::RangeEvicted(h) => h.group,
        Message::RequestStateTransfer(h) => h.group,
        Message::StateTransferTarget(h, _) => h.group,
        Message::RequestStateChunk(h) => h.group,
        Message::StateChunk(h, _) => h.group,
        Message::ForwardRegister(_)
        | Message::ForwardRegisterResult(_)
        | Message::ForwardLogout(_)
        | Message::ForwardLogoutResult(_) => super::registry::METADATA_GROUP,
        _ => return None,
    })
}

/// Whether a group value is the metadata plane.
pub fn is_metadata(group: u64) -> bool {
    matches!(group_kind(group), Ok(GroupKind::Metadata))
}
