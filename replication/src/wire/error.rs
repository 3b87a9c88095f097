//! Why a frame was refused. Every variant carries what an operator needs to act, and
//! `reason()` names it for the stats endpoint's rejection counters.

use super::batch::BatchError;
use super::registry::Command;

/// A frame failed validation; the frame is dropped and the reason counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The buffer does not start 16-byte aligned (a caller bug, never a panic).
    Misaligned,
    /// Fewer bytes than one header.
    TooShort { len: usize },
    /// The size field is below 256.
    SizeTooSmall { size: u32 },
    /// The size field exceeds max_message_size.
    SizeTooLarge { size: u32, max: u32 },
    /// The size field does not match the bytes received.
    SizeMismatch { size: u32, len: usize },
    /// Command 0 or above 29.
    CommandInvalid { command: u8 },
    /// Commands 1-4: reserved and unused in this version.
    CommandUnused { command: Command },
    /// A frame parsed as one command's header carries another.
    CommandMismatch { expected: Command, found: u8 },
    /// release must be 0 in this version.
    ReleaseNonZero { release: u32 },
    /// A header-only command carries a body.
    HeaderOnlyWithBody { command: Command, size: u32 },
    /// A reserved byte that receivers check is not zero.
    ReservedNonZero { command: Command, offset: usize },
    /// The frame seal over header bytes 16..256 does not match.
    FrameSealMismatch { command: Command },
    /// The prepare identity does not match.
    PrepareIdentityMismatch { op: u64 },
    /// checksum_body does not match the body.
    BodySealMismatch { command: Command },
    /// checksum_body must be zero for this command or plane.
    BodySealNotZero { command: Command },
    /// Client and handshake frames leave checksum and checksum_body zero.
    UnsealedChecksumNonZero { command: Command },
    /// A DoViewChange/StartView body is not a whole number of Prepare headers.
    SuffixNotWhole { len: usize },
    /// A DoViewChange/StartView body holds more than 128 headers.
    SuffixTooLong { count: usize },
    /// A suffix entry is not a Prepare header with a valid identity.
    SuffixEntryInvalid { index: usize },
    /// The group is neither the metadata group nor a packed partition key.
    GroupInvalid { command: Command, group: u64 },
    /// Request: client is zero.
    ClientZero,
    /// Operation byte is 0 or unknown.
    OperationInvalid { operation: u8 },
    /// Operation is known but not allowed here (internal from a client, a read prepared).
    OperationNotAllowed { command: Command, operation: u8 },
    /// Register must carry session = 0 and request = 0.
    RegisterWithSession,
    /// Replicated operations other than Register need session and request.
    SessionMissing,
    /// commit > op on DoViewChange or StartView.
    CommitAheadOfOp { commit: u64, op: u64 },
    /// DoViewChange log_view > view.
    LogViewAheadOfView { log_view: u32, view: u32 },
    /// DoViewChange nack/present bits name entries the body does not hold.
    BitsetBeyondSuffix { count: usize },
    /// RequestPrepares from_op = 0 or from_op > to_op.
    RepairRangeInvalid { from_op: u64, to_op: u64 },
    /// ForwardRegister nonce is zero.
    NonceZero,
    /// A Forward*Result outcome byte out of range.
    OutcomeInvalid { command: Command, outcome: u8 },
    /// ForwardRegisterResult non-Ok with non-zero epoch or watermark.
    OutcomeFieldsNonZero { outcome: u8 },
    /// StateTransferTarget with both available and unavailable_transient set.
    TargetFlagsConflict,
    /// StateTransferTarget refusal (available = 0) with a body.
    TargetRefusalWithBody { size: u32 },
    /// Eviction reason byte 0 or unknown.
    EvictionReasonInvalid { reason: u8 },
    /// A partition-plane SendMessages prepare whose batch fails verification.
    Batch(BatchError),
}

impl FrameError {
    /// A stable label per variant, used as the stats endpoint's rejection counter key.
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::Misaligned => "misaligned",
            FrameError::TooShort { .. } => "too_short",
            FrameError::SizeTooSmall { .. } => "size_too_small",
            FrameError::SizeTooLarge { .. } => "size_too_large",
            FrameError::SizeMismatch { .. } => "size_mismatch",
            FrameError::CommandInvalid { .. } => "command_invalid",
            FrameError::CommandUnused { .. } => "command_unused",
            FrameError::CommandMismatch { .. } => "command_mismatch",
            FrameError::ReleaseNonZero { .. } => "release_non_zero",
            FrameError::HeaderOnlyWithBody { .. } => "header_only_with_body",
            FrameError::ReservedNonZero { .. } => "reserved_non_zero",
            FrameError::FrameSealMismatch { .. } => "frame_seal_mismatch",
            FrameError::PrepareIdentityMismatch { .. } => "prepare_identity_mismatch",
            FrameError::BodySealMismatch { .. } => "body_seal_mismatch",
            FrameError::BodySealNotZero { .. } => "body_seal_not_zero",
            FrameError::UnsealedChecksumNonZero { .. } => "unsealed_checksum_non_zero",
            FrameError::SuffixNotWhole { .. } => "suffix_not_whole",
            FrameError::SuffixTooLong { .. } => "suffix_too_long",
            FrameError::SuffixEntryInvalid { .. } => "suffix_entry_invalid",
            FrameError::GroupInvalid { .. } => "group_invalid",
            FrameError::ClientZero => "client_zero",
            FrameError::OperationInvalid { .. } => "operation_invalid",
            FrameError::OperationNotAllowed { .. } => "operation_not_allowed",
            FrameError::RegisterWithSession => "register_with_session",
            FrameError::SessionMissing => "session_missing",
            FrameError::CommitAheadOfOp { .. } => "commit_ahead_of_op",
            FrameError::LogViewAheadOfView { .. } => "log_view_ahead_of_view",
            FrameError::BitsetBeyondSuffix { .. } => "bitset_beyond_suffix",
            FrameError::RepairRangeInvalid { .. } => "repair_range_invalid",
            FrameError::NonceZero => "nonce_zero",
            FrameError::OutcomeInvalid { .. } => "outcome_invalid",
            FrameError::OutcomeFieldsNonZero { .. } => "outcome_fields_non_zero",
            FrameError::TargetFlagsConflict => "target_flags_conflict",
            FrameError::TargetRefusalWithBody { .. } => "target_refusal_with_body",
            FrameError::EvictionReasonInvalid { .. } => "eviction_reason_invalid",
            FrameError::Batch(_) => "batch_invalid",
        }
    }
}

impl core::fmt::Display for FrameError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        use FrameError as E;
        match self {
            E::Misaligned => write!(f, "frame buffer is not 16-byte aligned"),
            E::TooShort { len } => write!(f, "{len} bytes is shorter than a 256-byte header"),
            E::SizeTooSmall { size } => write!(f, "size {size} is below the 256-byte header"),
            E::SizeTooLarge { size, max } => {
                write!(f, "size {size} exceeds max_message_size {max}")
            }
            E::SizeMismatch { size, len } => write!(f, "size {size} does not match {len} bytes"),
            E::CommandInvalid { command } => write!(f, "command {command} is not in 1..=29"),
            E::CommandUnused { command } => {
                write!(f, "command {} is reserved and unused", command.name())
            }
            E::CommandMismatch { expected, found } => write!(
                f,
                "expected {} but the frame carries command {found}",
                expected.name()
            ),
            E::ReleaseNonZero { release } => write!(f, "release {release} is not 0"),
            E::HeaderOnlyWithBody { command, size } => {
                write!(f, "{} is header-only but size is {size}", command.name())
            }
            E::ReservedNonZero { command, offset } => {
                write!(f, "{} reserved byte {offset} is not zero", command.name())
            }
            E::FrameSealMismatch { command } => write!(f, "{} frame seal mismatch", command.name()),
            E::PrepareIdentityMismatch { op } => write!(f, "prepare op {op} identity mismatch"),
            E::BodySealMismatch { command } => write!(f, "{} body seal mismatch", command.name()),
            E::BodySealNotZero { command } => {
                write!(f, "{} checksum_body must be zero", command.name())
            }
            E::UnsealedChecksumNonZero { command } => write!(
                f,
                "{} is unsealed: checksum and checksum_body must be zero",
                command.name()
            ),
            E::SuffixNotWhole { len } => {
                write!(f, "suffix of {len} bytes is not whole 256-byte headers")
            }
            E::SuffixTooLong { count } => write!(f, "suffix of {count} headers exceeds 128"),
            E::SuffixEntryInvalid { index } => {
                write!(f, "suffix entry {index} is not a valid prepare header")
            }
            E::GroupInvalid { command, group } => write!(
                f,
                "{} group {group:#x} is not a metadata or partition group",
                command.name()
            ),
            E::ClientZero => write!(f, "request client is zero"),
            E::OperationInvalid { operation } => write!(f, "operation {operation} is unknown"),
            E::OperationNotAllowed { command, operation } => write!(
                f,
                "operation {operation} is not allowed on {}",
                command.name()
            ),
            E::RegisterWithSession => write!(f, "Register must have session = 0 and request = 0"),
            E::SessionMissing => {
                write!(f, "replicated request needs session != 0 and request != 0")
            }
            E::CommitAheadOfOp { commit, op } => write!(f, "commit {commit} is ahead of op {op}"),
            E::LogViewAheadOfView { log_view, view } => {
                write!(f, "log_view {log_view} is ahead of view {view}")
            }
            E::BitsetBeyondSuffix { count } => {
                write!(f, "bitsets name entries beyond the {count} in the body")
            }
            E::RepairRangeInvalid { from_op, to_op } => {
                write!(f, "repair range {from_op}..={to_op} is invalid")
            }
            E::NonceZero => write!(f, "nonce is zero"),
            E::OutcomeInvalid { command, outcome } => {
                write!(f, "{} outcome {outcome} is out of range", command.name())
            }
            E::OutcomeFieldsNonZero { outcome } => {
                write!(f, "outcome {outcome} carries a non-zero epoch or watermark")
            }
            E::TargetFlagsConflict => write!(f, "available and unavailable_transient are both set"),
            E::TargetRefusalWithBody { size } => {
                write!(f, "refusal (available = 0) carries a body (size {size})")
            }
            E::EvictionReasonInvalid { reason } => write!(f, "eviction reason {reason} is unknown"),
            E::Batch(error) => write!(f, "message batch: {error}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<BatchError> for FrameError {
    fn from(error: BatchError) -> FrameError {
        FrameError::Batch(error)
    }
}
