//! Validation rules of `wire::decode`, each exercised by a frame that breaks only that
//! rule, and properties over every header type.

use proptest::prelude::*;
use zerocopy::FromBytes;

use super::batch::{self, BatchBuilder, NewMessage};
use super::frame::{prepare_identity, seal_in_place};
use super::*;

const CLUSTER: u128 = 0x1234_5678_9abc_def0_0fed_cba9_8765_4321;
const PARTITION_GROUP: u64 = 1 << 32 | 2 << 20 | 3;

fn limits() -> Limits {
    Limits::default()
}

fn sample_batch(messages: u32) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(1024);
    for i in 0..messages {
        let payload = vec![i as u8; 40 + i as usize];
        builder.push(NewMessage {
            id: u128::from(i) + 1,
            timestamp_delta: i,
            payload: &payload,
            user_headers: if i % 2 == 0 { b"h=v" } else { b"" },
        });
    }
    let mut bytes = builder.finish(1_000_000);
    batch::stamp(&mut bytes, 3, 100, 1_000_100).unwrap();
    bytes
}

fn prepare_header(group: u64, operation: Operation) -> PrepareHeader {
    let mut h = PrepareHeader::new();
    h.frame.cluster = CLUSTER;
    h.frame.view = 7;
    h.frame.replica = 1;
    h.client = 99;
    h.request_checksum = 5;
    h.op = 42;
    h.commit = 40;
    h.timestamp = 123_456;
    h.request = 3;
    h.operation = operation as u8;
    h.group = group;
    h.user_id = 8;
    h
}

fn metadata_prepare() -> Frame {
    Frame::build(
        &prepare_header(METADATA_GROUP, Operation::CreateStream),
        b"stream body",
    )
}

fn partition_prepare() -> Frame {
    let batch = sample_batch(3);
    Frame::build(
        &prepare_header(PARTITION_GROUP, Operation::SendMessages),
        &batch,
    )
}

fn suffix_body(count: usize) -> Vec<u8> {
    let mut chain = PrepareChain::after(0);
    let mut body = Vec::new();
    for i in 0..count {
        let mut h = prepare_header(METADATA_GROUP, Operation::CreateStream);
        h.op = 1000 - i as u64;
        let frame = chain.append(&mut h, b"x");
        body.extend_from_slice(&frame.as_bytes()[..HEADER_SIZE]);
    }
    body
}

fn with_frame<H: Header>(mut h: H) -> H {
    h.frame_mut().cluster = CLUSTER;
    h.frame_mut().view = 7;
    h.frame_mut().replica = 2;
    h
}

/// One valid frame per command (commands 1-4 are unused and have none).
fn sample(command: Command) -> Option<Frame> {
    use Command as C;
    Some(match command {
        C::Ping | C::Pong | C::PingClient | C::PongClient => return None,
        C::Request => {
            let mut h = with_frame(RequestHeader::new());
            h.client = 77;
            h.operation = Operation::CreateStream as u8;
            h.session = 4;
            h.request = 9;
            h.timestamp = 11;
            Frame::build(&h, b"request body")
        }
        C::Prepare => metadata_prepare(),
        C::RepairPrepare => Frame::repair_of(metadata_prepare().as_bytes()),
        C::PrepareOk => {
            let mut h = with_frame(PrepareOkHeader::new());
            h.parent = 1;
            h.prepare_checksum = 2;
            h.op = 42;
            h.commit = 40;
            h.group = METADATA_GROUP;
            Frame::build(&h, &[])
        }
        C::Reply => {
            let mut h = with_frame(ReplyHeader::new());
            h.client = 77;
            h.op = 42;
            h.status = 0;
            Frame::build(&h, b"reply body")
        }
        C::Commit => {
            let mut h = with_frame(CommitHeader::new());
            h.timestamp_monotonic = 5;
            h.commit = 40;
            h.group = PARTITION_GROUP;
            Frame::build(&h, &[])
        }
        C::StartViewChange => {
            let mut h = with_frame(StartViewChangeHeader::new());
            h.group = METADATA_GROUP;
            Frame::build(&h, &[])
        }
        C::DoViewChange => {
            let mut h = with_frame(DoViewChangeHeader::new());
            h.op = 100;
            h.commit = 97;
            h.group = METADATA_GROUP;
            h.log_view = 6;
            h.nack_bitset = 0b100;
            h.present_bitset = 0b011;
            Frame::build(&h, &suffix_body(3))
        }
        C::StartView => {
            let mut h = with_frame(StartViewHeader::new());
            h.op = 100;
            h.commit = 99;
            h.group = METADATA_GROUP;
            h.incarnation = 0xabc;
            Frame::build(&h, &suffix_body(2))
        }
        C::Eviction => {
            let mut h = with_frame(EvictionHeader::new());
            h.client = 77;
            h.server_protocol_version = registry::PROTOCOL_VERSION;
            h.server_protocol_version_min = registry::PROTOCOL_VERSION;
            h.reason = registry::EvictionReason::NoSession as u8;
            Frame::build(&h, &[])
        }
        C::ReplicaHello => {
            let mut h = with_frame(ReplicaHelloHeader::new());
            h.nonce_d = [7; 32];
            Frame::build(&h, &[])
        }
        C::ReplicaChallenge => {
            let mut h = with_frame(ReplicaChallengeHeader::new());
            h.nonce_a = [8; 32];
            h.mac_a = [9; 32];
            Frame::build(&h, &[])
        }
        C::ReplicaFinish => {
            let mut h = with_frame(ReplicaFinishHeader::new());
            h.mac_d = [10; 32];
            Frame::build(&h, &[])
        }
        C::RequestStartView => {
            let mut h = with_frame(RequestStartViewHeader::new());
            h.group = METADATA_GROUP;
            h.incarnation = 0xfeed;
            Frame::build(&h, &[])
        }
        C::RequestPrepares => {
            let mut h = with_frame(RequestPreparesHeader::new());
            h.nonce = 3;
            h.from_op = 10;
            h.to_op = 20;
            h.group = METADATA_GROUP;
            Frame::build(&h, &[])
        }
        C::RepairDone | C::RangeEvicted => {
            let mut h = with_frame(RepairResultHeader::new());
            h.frame.command = command as u8;
            h.nonce = 3;
            h.op = 20;
            h.group = METADATA_GROUP;
            Frame::build(&h, &[])
        }
        C::RequestStateTransfer => {
            let mut h = with_frame(RequestStateTransferHeader::new());
            h.nonce = 4;
            h.group = PARTITION_GROUP;
            Frame::build(&h, &[])
        }
        C::StateTransferTarget => {
            let mut h = with_frame(StateTransferTargetHeader::new());
            h.nonce = 4;
            h.commit_op = 500;
            h.group = PARTITION_GROUP;
            h.available = 1;
            h.commit_max = 510;
            Frame::build(&h, b"ISM1 manifest bytes")
        }
        C::RequestStateChunk => {
            let mut h = with_frame(RequestStateChunkHeader::new());
            h.nonce = 4;
            h.offset = 4096;
            h.group = PARTITION_GROUP;
            h.len = 65536;
            h.artifact = 2;
            Frame::build(&h, &[])
        }
        C::StateChunk => {
            let mut h = with_frame(StateChunkHeader::new());
            h.nonce = 4;
            h.offset = 4096;
            h.group = PARTITION_GROUP;
            h.artifact = 2;
            Frame::build(&h, &[0xaa; 1000])
        }
        C::ForwardRegister => {
            let mut h = with_frame(ForwardRegisterHeader::new());
            h.client = 77;
            h.nonce = 5;
            h.user_id = 1;
            Frame::build(&h, &[])
        }
        C::ForwardRegisterResult => {
            let mut h = with_frame(ForwardRegisterResultHeader::new());
            h.nonce = 5;
            h.client = 77;
            h.epoch = 3;
            h.watermark = 2;
            Frame::build(&h, &[])
        }
        C::ForwardLogout => {
            let mut h = with_frame(ForwardLogoutHeader::new());
            h.client = 77;
            h.nonce = 6;
            h.session = 4;
            h.request = 10;
            Frame::build(&h, &[])
        }
        C::ForwardLogoutResult => {
            let mut h = with_frame(ForwardLogoutResultHeader::new());
            h.nonce = 6;
            h.client = 77;
            h.commit = 44;
            Frame::build(&h, &[])
        }
    })
}

fn samples() -> Vec<Frame> {
    Command::ALL.iter().filter_map(|c| sample(*c)).collect()
}

/// Mutates a copy of `frame` and re-applies its seals, so the result breaks only
/// whatever rule the mutation breaks.
fn resealed(frame: &Frame, mutate: impl FnOnce(&mut Vec<u8>)) -> FrameBuf {
    let mut bytes = frame.as_bytes().to_vec();
    mutate(&mut bytes);
    let size = bytes.len() as u32;
    bytes[48..52].copy_from_slice(&size.to_le_bytes());
    let mut buf = FrameBuf::from_bytes(&bytes);
    seal_in_place(buf.as_bytes_mut());
    buf
}

/// Mutates a copy without resealing.
fn tampered(frame: &Frame, mutate: impl FnOnce(&mut [u8])) -> FrameBuf {
    let mut buf = FrameBuf::from_bytes(frame.as_bytes());
    mutate(buf.as_bytes_mut());
    buf
}

fn decode_err(buf: &FrameBuf) -> FrameError {
    match decode(buf.as_bytes(), &limits()) {
        Ok(message) => panic!("expected an error, decoded {:?}", message.command()),
        Err(error) => error,
    }
}

fn set_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn every_sample_frame_decodes_as_its_command() {
    for frame in samples() {
        let message = decode(frame.as_bytes(), &limits())
            .unwrap_or_else(|e| panic!("command {}: {e}", frame.header().command));
        assert_eq!(message.command() as u8, frame.header().command);
    }
}

#[test]
fn frame_shorter_than_a_header_is_rejected() {
    let buf = FrameBuf::from_bytes(&metadata_prepare().as_bytes()[..255]);
    assert_eq!(decode_err(&buf), FrameError::TooShort { len: 255 });
}

#[test]
fn size_field_below_256_is_rejected() {
    let frame = sample(Command::Commit).unwrap();
    let buf = tampered(&frame, |b| b[48..52].copy_from_slice(&200u32.to_le_bytes()));
    assert_eq!(decode_err(&buf), FrameError::SizeTooSmall { size: 200 });
}

#[test]
fn size_above_max_message_size_is_rejected() {
    let frame = sample(Command::StateChunk).unwrap();
    let small = Limits {
        max_message_size: 1024,
    };
    assert_eq!(
        decode(frame.as_bytes(), &small).unwrap_err(),
        FrameError::SizeTooLarge {
            size: 1256,
            max: 1024
        }
    );
    assert!(decode(frame.as_bytes(), &limits()).is_ok());
}

#[test]
fn size_not_matching_the_bytes_is_rejected() {
    let frame = sample(Command::StateChunk).unwrap();
    let buf = FrameBuf::from_bytes(&frame.as_bytes()[..1000]);
    assert_eq!(
        decode_err(&buf),
        FrameError::SizeMismatch {
            size: 1256,
            len: 1000
        }
    );
}

#[test]
fn command_zero_and_above_29_are_rejected() {
    let frame = sample(Command::Commit).unwrap();
    for command in [0u8, 30, 255] {
        let buf = tampered(&frame, |b| b[60] = command);
        assert_eq!(decode_err(&buf), FrameError::CommandInvalid { command });
    }
}

#[test]
fn unused_commands_1_to_4_are_rejected() {
    let frame = sample(Command::Commit).unwrap();
    for command in 1..=4u8 {
        let buf = tampered(&frame, |b| b[60] = command);
        assert!(matches!(decode_err(&buf), FrameError::CommandUnused { .. }));
    }
}

#[test]
fn non_zero_release_is_rejected_on_every_command() {
    for frame in samples() {
        let buf = resealed(&frame, |b| b[56] = 1);
        assert_eq!(decode_err(&buf), FrameError::ReleaseNonZero { release: 1 });
    }
}

#[test]
fn header_only_commands_with_a_body_are_rejected() {
    use Command as C;
    let header_only = [
        C::Commit,
        C::PrepareOk,
        C::StartViewChange,
        C::RequestStartView,
        C::RequestPrepares,
        C::RepairDone,
        C::RangeEvicted,
        C::RequestStateTransfer,
        C::RequestStateChunk,
        C::ReplicaHello,
        C::ReplicaChallenge,
        C::ReplicaFinish,
        C::ForwardRegister,
    ];
    for command in header_only {
        let frame = sample(command).unwrap();
        let buf = resealed(&frame, |b| b.extend_from_slice(&[0; 16]));
        assert_eq!(
            decode_err(&buf),
            FrameError::HeaderOnlyWithBody { command, size: 272 },
            "{}",
            command.name()
        );
    }
}

#[test]
fn prepare_and_repair_prepare_with_non_zero_reserved_bytes_are_rejected() {
    for frame in [
        metadata_prepare(),
        Frame::repair_of(metadata_prepare().as_bytes()),
    ] {
        let command = Command::from_u8(frame.header().command).unwrap();
        // reserved_frame, the gap after operation, and the tail.
        for offset in [62usize, 127, 209, 215, 228, 255] {
            let buf = resealed(&frame, |b| b[offset] = 1);
            // RepairPrepare keeps the identity computed as Prepare; reseal handles both.
            assert_eq!(
                decode_err(&buf),
                FrameError::ReservedNonZero { command, offset }
            );
        }
    }
}

#[test]
fn forward_frames_with_non_zero_reserved_tails_are_rejected() {
    use Command as C;
    for (command, offset) in [
        (C::ForwardRegister, 164usize),
        (C::ForwardRegisterResult, 200),
        (C::ForwardLogout, 176),
        (C::ForwardLogoutResult, 254),
    ] {
        let frame = sample(command).unwrap();
        let buf = resealed(&frame, |b| b[offset] = 0x80);
        assert_eq!(
            decode_err(&buf),
            FrameError::ReservedNonZero { command, offset }
        );
    }
}

#[test]
fn eviction_reserved_bytes_and_reason_are_checked() {
    let frame = sample(Command::Eviction).unwrap();
    let buf = resealed(&frame, |b| b[200] = 1);
    assert_eq!(
        decode_err(&buf),
        FrameError::ReservedNonZero {
            command: Command::Eviction,
            offset: 200
        }
    );
    for reason in [0u8, 16] {
        let buf = resealed(&frame, |b| b[255] = reason);
        assert_eq!(
            decode_err(&buf),
            FrameError::EvictionReasonInvalid { reason }
        );
    }
}

#[test]
fn sealed_control_frames_with_a_bad_frame_seal_are_rejected() {
    for frame in samples() {
        let command = Command::from_u8(frame.header().command).unwrap();
        if command.seal_kind() != registry::SealKind::Frame {
            continue;
        }
        let buf = tampered(&frame, |b| b[0] ^= 1);
        assert_eq!(decode_err(&buf), FrameError::FrameSealMismatch { command });
        // A field change without resealing is caught the same way.
        let buf = tampered(&frame, |b| b[130] ^= 0x10);
        assert_eq!(decode_err(&buf), FrameError::FrameSealMismatch { command });
    }
}

#[test]
fn client_and_handshake_frames_with_non_zero_checksum_fields_are_rejected() {
    for command in [
        Command::Request,
        Command::Reply,
        Command::Eviction,
        Command::ReplicaHello,
        Command::ReplicaChallenge,
        Command::ReplicaFinish,
    ] {
        let frame = sample(command).unwrap();
        for offset in [0usize, 16] {
            let buf = tampered(&frame, |b| b[offset] = 1);
            assert_eq!(
                decode_err(&buf),
                FrameError::UnsealedChecksumNonZero { command }
            );
        }
    }
}

#[test]
fn a_bit_flip_that_turns_a_sealed_command_into_an_unsealed_one_is_rejected() {
    // Regression (proptest): RepairDone (20) with bit 2 of the command flipped is
    // ReplicaFinish (16), an unsealed header-only frame.
    let frame = sample(Command::RepairDone).unwrap();
    let buf = tampered(&frame, |b| b[60] ^= 1 << 2);
    assert_eq!(
        decode_err(&buf),
        FrameError::UnsealedChecksumNonZero {
            command: Command::ReplicaFinish
        }
    );
    // Every single-bit flip of every sealed sample's command byte is caught.
    for frame in samples() {
        let command = Command::from_u8(frame.header().command).unwrap();
        if command.seal_kind() == registry::SealKind::Unsealed {
            continue;
        }
        for bit in 0..8 {
            let buf = tampered(&frame, |b| b[60] ^= 1 << bit);
            assert!(
                decode(buf.as_bytes(), &limits()).is_err(),
                "{} bit {bit}",
                command.name()
            );
        }
    }
}

#[test]
fn prepare_with_a_bad_identity_is_rejected() {
    let frame = metadata_prepare();
    let buf = tampered(&frame, |b| b[3] ^= 0x40);
    assert_eq!(
        decode_err(&buf),
        FrameError::PrepareIdentityMismatch { op: 42 }
    );
    let buf = tampered(&frame, |b| set_u64(b, 176, 43));
    assert_eq!(
        decode_err(&buf),
        FrameError::PrepareIdentityMismatch { op: 43 }
    );
}

#[test]
fn prepare_identity_ignores_view_so_a_retransmit_under_a_new_view_keeps_it() {
    let frame = metadata_prepare();
    let buf = tampered(&frame, |b| b[52..56].copy_from_slice(&9u32.to_le_bytes()));
    let Message::Prepare(header, _) = decode(buf.as_bytes(), &limits()).unwrap() else {
        panic!("not a prepare");
    };
    assert_eq!(header.frame.view, 9);
    assert_eq!(header.frame.checksum, frame.checksum());
}

#[test]
fn repair_prepare_restores_command_prepare_and_keeps_the_identity() {
    let prepare = metadata_prepare();
    let repair = Frame::repair_of(prepare.as_bytes());
    assert_eq!(&repair.as_bytes()[..60], &prepare.as_bytes()[..60]);
    assert_eq!(&repair.as_bytes()[61..], &prepare.as_bytes()[61..]);
    let Message::RepairPrepare(header, body) = decode(repair.as_bytes(), &limits()).unwrap() else {
        panic!("not a repair prepare");
    };
    assert_eq!(header.frame.checksum, prepare.checksum());
    assert_eq!(prepare_identity(header), prepare.checksum());
    assert_eq!(body, b"stream body");
    let broken = tampered(&repair, |b| b[250] = 1);
    assert!(matches!(
        decode_err(&broken),
        FrameError::PrepareIdentityMismatch { .. }
    ));
}

#[test]
fn metadata_prepare_with_a_bad_body_seal_is_rejected() {
    let frame = metadata_prepare();
    let buf = tampered(&frame, |b| b[HEADER_SIZE] ^= 1);
    assert_eq!(
        decode_err(&buf),
        FrameError::BodySealMismatch {
            command: Command::Prepare
        }
    );
}

#[test]
fn partition_prepare_must_leave_checksum_body_zero() {
    let frame = partition_prepare();
    assert_eq!(frame.header().checksum_body, 0);
    assert!(decode(frame.as_bytes(), &limits()).is_ok());
    // A partition prepare with a body seal, identity recomputed over it.
    let mut bytes = frame.as_bytes().to_vec();
    bytes[16] = 1;
    let mut buf = FrameBuf::from_bytes(&bytes);
    let header = PrepareHeader::mut_from_prefix(buf.as_bytes_mut())
        .unwrap()
        .0;
    header.frame.checksum = prepare_identity(header);
    assert_eq!(
        decode_err(&buf),
        FrameError::BodySealNotZero {
            command: Command::Prepare
        }
    );
}

#[test]
fn partition_send_messages_prepare_with_a_corrupt_batch_is_rejected() {
    let frame = partition_prepare();
    let buf = tampered(&frame, |b| b[HEADER_SIZE + 256 + 60] ^= 1);
    assert_eq!(
        decode_err(&buf),
        FrameError::Batch(batch::BatchError::MessageChecksum { message: 0 })
    );
}

#[test]
fn prepare_whose_operation_belongs_to_the_other_plane_is_rejected() {
    let h = prepare_header(METADATA_GROUP, Operation::SendMessages);
    let frame = Frame::build(&h, &sample_batch(1));
    assert!(matches!(
        decode_err(&FrameBuf::from_bytes(frame.as_bytes())),
        FrameError::OperationNotAllowed { .. }
    ));
    let h = prepare_header(METADATA_GROUP, Operation::NonReplicated);
    let frame = Frame::build(&h, b"");
    assert!(matches!(
        decode_err(&FrameBuf::from_bytes(frame.as_bytes())),
        FrameError::OperationNotAllowed { .. }
    ));
    let frame = resealed(&metadata_prepare(), |b| b[208] = 200);
    assert_eq!(
        decode_err(&frame),
        FrameError::OperationInvalid { operation: 200 }
    );
}

#[test]
fn do_view_change_and_start_view_with_a_bad_body_seal_are_rejected() {
    for command in [Command::DoViewChange, Command::StartView] {
        let frame = sample(command).unwrap();
        let buf = tampered(&frame, |b| b[HEADER_SIZE + 100] ^= 4);
        assert_eq!(decode_err(&buf), FrameError::BodySealMismatch { command });
    }
}

#[test]
fn an_empty_suffix_is_sealed_zero_and_the_hash_of_no_bytes_is_still_accepted() {
    for command in [Command::DoViewChange, Command::StartView] {
        let frame = sample(command).unwrap();
        let empty = resealed(&frame, |b| {
            b.truncate(HEADER_SIZE);
            // No suffix entries: no nack or present bits either.
            if command == Command::DoViewChange {
                b[224..256].fill(0);
            }
        });
        let checksum_body = u128::from_le_bytes(empty.as_bytes()[16..32].try_into().unwrap());
        assert_eq!(
            checksum_body,
            0,
            "{} seals an empty body as zero",
            command.name()
        );
        assert!(
            decode(empty.as_bytes(), &limits()).is_ok(),
            "{}",
            command.name()
        );
        // The XxHash3 of zero bytes, as older builds sealed an empty suffix.
        let mut legacy = FrameBuf::from_bytes(empty.as_bytes());
        legacy.as_bytes_mut()[16..32].copy_from_slice(&frame::seal_of(&[]).to_le_bytes());
        let head: &mut [u8; HEADER_SIZE] = (&mut legacy.as_bytes_mut()[..HEADER_SIZE])
            .try_into()
            .unwrap();
        let seal = frame::frame_seal(head);
        head[..16].copy_from_slice(&seal.to_le_bytes());
        assert!(
            decode(legacy.as_bytes(), &limits()).is_ok(),
            "{}",
            command.name()
        );
        // Any other value is a mismatch.
        let mut wrong = FrameBuf::from_bytes(empty.as_bytes());
        wrong.as_bytes_mut()[16] = 7;
        let head: &mut [u8; HEADER_SIZE] = (&mut wrong.as_bytes_mut()[..HEADER_SIZE])
            .try_into()
            .unwrap();
        let seal = frame::frame_seal(head);
        head[..16].copy_from_slice(&seal.to_le_bytes());
        assert_eq!(decode_err(&wrong), FrameError::BodySealMismatch { command });
    }
}

#[test]
fn a_do_view_change_may_carry_blank_placeholders_where_its_nack_bit_is_set() {
    use zerocopy::{FromZeros, IntoBytes};
    let frame = sample(Command::DoViewChange).unwrap();
    // Entry 2 (op 998) is nacked in the sample: a blank placeholder may stand there.
    let mut blank = PrepareHeader::new_zeroed();
    blank.frame.command = Command::Prepare as u8;
    blank.op = 998;
    let at = HEADER_SIZE + 2 * HEADER_SIZE;
    let with_placeholder = resealed(&frame, |b| {
        b[at..at + HEADER_SIZE].copy_from_slice(blank.as_bytes())
    });
    match decode(with_placeholder.as_bytes(), &limits()) {
        Ok(Message::DoViewChange(_, entries)) => {
            assert!(decode::is_suffix_placeholder(&entries[2]));
            assert!(!decode::is_suffix_placeholder(&entries[0]));
        }
        other => panic!("placeholder at a nacked index refused: {other:?}"),
    }
    // Entry 1 is not nacked: a placeholder there is not a valid entry.
    let at = HEADER_SIZE + HEADER_SIZE;
    blank.op = 999;
    let wrong = resealed(&frame, |b| {
        b[at..at + HEADER_SIZE].copy_from_slice(blank.as_bytes())
    });
    assert_eq!(
        decode_err(&wrong),
        FrameError::SuffixEntryInvalid { index: 1 }
    );
    // A placeholder with any other byte set is no placeholder.
    let mut dirty = blank;
    dirty.op = 998;
    dirty.operation = Operation::CreateStream as u8;
    let at = HEADER_SIZE + 2 * HEADER_SIZE;
    let wrong = resealed(&frame, |b| {
        b[at..at + HEADER_SIZE].copy_from_slice(dirty.as_bytes())
    });
    assert_eq!(
        decode_err(&wrong),
        FrameError::SuffixEntryInvalid { index: 2 }
    );
    // StartView suffixes take no placeholders.
    let sv = sample(Command::StartView).unwrap();
    blank.op = 999;
    let at = HEADER_SIZE + HEADER_SIZE;
    let wrong = resealed(&sv, |b| {
        b[at..at + HEADER_SIZE].copy_from_slice(blank.as_bytes())
    });
    assert!(decode(wrong.as_bytes(), &limits()).is_err());
}

#[test]
fn a_partition_prepare_is_valid_at_the_frame_level_whatever_its_body() {
    let frame = partition_prepare();
    let not_a_batch = resealed(&frame, |b| {
        b.truncate(HEADER_SIZE);
        b.extend_from_slice(&[0x42; 64]);
    });
    assert!(matches!(
        decode::decode_frame(not_a_batch.as_bytes(), &limits()),
        Ok(Message::Prepare(..))
    ));
    assert!(batch::verify(&not_a_batch.as_bytes()[HEADER_SIZE..]).is_err());
    // Replicas decode with the batch checked: refused before it can be journaled.
    assert!(matches!(decode_err(&not_a_batch), FrameError::Batch(..)));
    // Seals are still the frame's: a broken identity is refused at the frame level.
    let mut broken = FrameBuf::from_bytes(not_a_batch.as_bytes());
    broken.as_bytes_mut()[176] ^= 1;
    assert!(decode::decode_frame(broken.as_bytes(), &limits()).is_err());
}

#[test]
fn sealed_frames_other_than_suffixes_must_leave_checksum_body_zero() {
    let frame = sample(Command::StateChunk).unwrap();
    let mut buf = FrameBuf::from_bytes(frame.as_bytes());
    buf.as_bytes_mut()[16] = 1;
    let head: &mut [u8; HEADER_SIZE] = (&mut buf.as_bytes_mut()[..HEADER_SIZE]).try_into().unwrap();
    let seal = frame::frame_seal(head);
    head[..16].copy_from_slice(&seal.to_le_bytes());
    assert_eq!(
        decode_err(&buf),
        FrameError::BodySealNotZero {
            command: Command::StateChunk
        }
    );
}

#[test]
fn suffix_that_is_not_whole_headers_is_rejected() {
    for command in [Command::DoViewChange, Command::StartView] {
        let frame = sample(command).unwrap();
        let buf = resealed(&frame, |b| b.extend_from_slice(&[0; 16]));
        assert_eq!(
            decode_err(&buf),
            FrameError::SuffixNotWhole {
                len: 256
                    * (if command == Command::DoViewChange {
                        3
                    } else {
                        2
                    })
                    + 16
            }
        );
    }
}

#[test]
fn suffix_of_more_than_128_headers_is_rejected() {
    let mut h = with_frame(StartViewHeader::new());
    h.op = 100;
    h.commit = 99;
    h.group = METADATA_GROUP;
    let ok = Frame::build(&h, &suffix_body(128));
    assert!(decode(ok.as_bytes(), &limits()).is_ok());
    let too_long = Frame::build(&h, &suffix_body(129));
    assert_eq!(
        decode(too_long.as_bytes(), &limits()).unwrap_err(),
        FrameError::SuffixTooLong { count: 129 }
    );
}

#[test]
fn suffix_entry_with_a_broken_identity_is_rejected() {
    let frame = sample(Command::StartView).unwrap();
    let buf = resealed(&frame, |b| b[HEADER_SIZE + 256 + 176] ^= 1);
    assert_eq!(
        decode_err(&buf),
        FrameError::SuffixEntryInvalid { index: 1 }
    );
}

#[test]
fn do_view_change_field_rules() {
    let frame = sample(Command::DoViewChange).unwrap();
    let buf = resealed(&frame, |b| set_u64(b, 136, 101));
    assert_eq!(
        decode_err(&buf),
        FrameError::CommitAheadOfOp {
            commit: 101,
            op: 100
        }
    );
    let buf = resealed(&frame, |b| b[152..156].copy_from_slice(&8u32.to_le_bytes()));
    assert_eq!(
        decode_err(&buf),
        FrameError::LogViewAheadOfView {
            log_view: 8,
            view: 7
        }
    );
    let buf = resealed(&frame, |b| b[224] = 0b1000);
    assert_eq!(
        decode_err(&buf),
        FrameError::BitsetBeyondSuffix { count: 3 }
    );
    let buf = resealed(&frame, |b| b[255] = 0x80);
    assert_eq!(
        decode_err(&buf),
        FrameError::BitsetBeyondSuffix { count: 3 }
    );
}

#[test]
fn start_view_commit_ahead_of_op_is_rejected() {
    let frame = sample(Command::StartView).unwrap();
    let buf = resealed(&frame, |b| set_u64(b, 136, 200));
    assert_eq!(
        decode_err(&buf),
        FrameError::CommitAheadOfOp {
            commit: 200,
            op: 100
        }
    );
}

#[test]
fn request_prepares_with_from_op_zero_or_past_to_op_is_rejected() {
    let frame = sample(Command::RequestPrepares).unwrap();
    let buf = resealed(&frame, |b| set_u64(b, 144, 0));
    assert_eq!(
        decode_err(&buf),
        FrameError::RepairRangeInvalid {
            from_op: 0,
            to_op: 20
        }
    );
    let buf = resealed(&frame, |b| set_u64(b, 144, 21));
    assert_eq!(
        decode_err(&buf),
        FrameError::RepairRangeInvalid {
            from_op: 21,
            to_op: 20
        }
    );
    let buf = resealed(&frame, |b| set_u64(b, 144, 20));
    assert!(decode(buf.as_bytes(), &limits()).is_ok());
}

#[test]
fn forward_register_result_non_ok_must_zero_epoch_and_watermark() {
    let frame = sample(Command::ForwardRegisterResult).unwrap();
    let buf = resealed(&frame, |b| b[255] = 1);
    assert_eq!(
        decode_err(&buf),
        FrameError::OutcomeFieldsNonZero { outcome: 1 }
    );
    let buf = resealed(&frame, |b| {
        b[255] = 3;
        set_u64(b, 160, 0);
        set_u64(b, 168, 0);
    });
    assert!(decode(buf.as_bytes(), &limits()).is_ok());
    let buf = resealed(&frame, |b| {
        b[255] = 7;
        set_u64(b, 160, 0);
        set_u64(b, 168, 0);
    });
    assert!(matches!(
        decode_err(&buf),
        FrameError::OutcomeInvalid { outcome: 7, .. }
    ));
}

#[test]
fn forward_logout_result_outcome_above_4_is_rejected() {
    let frame = sample(Command::ForwardLogoutResult).unwrap();
    let buf = resealed(&frame, |b| b[255] = 5);
    assert!(matches!(
        decode_err(&buf),
        FrameError::OutcomeInvalid { outcome: 5, .. }
    ));
}

#[test]
fn forward_register_with_zero_nonce_is_rejected() {
    let frame = sample(Command::ForwardRegister).unwrap();
    let buf = resealed(&frame, |b| b[144..160].fill(0));
    assert_eq!(decode_err(&buf), FrameError::NonceZero);
}

#[test]
fn state_transfer_target_flag_rules() {
    let frame = sample(Command::StateTransferTarget).unwrap();
    let buf = resealed(&frame, |b| b[161] = 1);
    assert_eq!(decode_err(&buf), FrameError::TargetFlagsConflict);
    let buf = resealed(&frame, |b| b[160] = 0);
    assert!(matches!(
        decode_err(&buf),
        FrameError::TargetRefusalWithBody { .. }
    ));
    let buf = resealed(&frame, |b| {
        b[160] = 0;
        b[161] = 1;
        b.truncate(HEADER_SIZE);
    });
    assert!(decode(buf.as_bytes(), &limits()).is_ok());
}

#[test]
fn request_field_rules() {
    let frame = sample(Command::Request).unwrap();
    let buf = resealed(&frame, |b| b[128..144].fill(0));
    assert_eq!(decode_err(&buf), FrameError::ClientZero);
    let buf = resealed(&frame, |b| b[176] = 0);
    assert_eq!(
        decode_err(&buf),
        FrameError::OperationInvalid { operation: 0 }
    );
    let buf = resealed(&frame, |b| b[176] = Operation::TruncatePartition as u8);
    assert!(matches!(
        decode_err(&buf),
        FrameError::OperationNotAllowed { .. }
    ));
    let buf = resealed(&frame, |b| b[176] = Operation::Register as u8);
    assert_eq!(decode_err(&buf), FrameError::RegisterWithSession);
    let buf = resealed(&frame, |b| set_u64(b, 184, 0));
    assert_eq!(decode_err(&buf), FrameError::SessionMissing);
    let buf = resealed(&frame, |b| {
        b[176] = Operation::Register as u8;
        set_u64(b, 168, 0);
        set_u64(b, 184, 0);
    });
    assert!(decode(buf.as_bytes(), &limits()).is_ok());
}

#[test]
fn consensus_frames_with_group_zero_or_high_bits_are_rejected() {
    let frame = sample(Command::Commit).unwrap();
    for group in [0u64, 1 << 52, (1 << 63) | 1] {
        let buf = resealed(&frame, |b| set_u64(b, 168, group));
        assert_eq!(
            decode_err(&buf),
            FrameError::GroupInvalid {
                command: Command::Commit,
                group
            }
        );
    }
}

#[test]
fn misaligned_buffer_is_an_error_not_a_panic() {
    let frame = sample(Command::Commit).unwrap();
    let mut buf = FrameBuf::zeroed(HEADER_SIZE + 1);
    buf.as_bytes_mut()[1..].copy_from_slice(frame.as_bytes());
    // FrameBuf starts 16-aligned, so one byte in is not.
    assert_eq!(
        decode(&buf.as_bytes()[1..], &limits()).unwrap_err(),
        FrameError::Misaligned
    );
}

#[test]
fn a_frame_is_never_accepted_as_another_commands_header() {
    let frame = sample(Command::PrepareOk).unwrap();
    let err = decode_as::<CommitHeader>(frame.as_bytes(), &limits()).unwrap_err();
    assert_eq!(
        err,
        FrameError::CommandMismatch {
            expected: Command::Commit,
            found: Command::PrepareOk as u8
        }
    );
    assert!(decode_as::<PrepareOkHeader>(frame.as_bytes(), &limits()).is_ok());
}

#[test]
fn prepare_chain_links_each_parent_to_the_previous_identity() {
    let mut chain = PrepareChain::after(0xdead);
    let mut first = prepare_header(METADATA_GROUP, Operation::CreateStream);
    let a = chain.append(&mut first, b"a");
    let mut second = prepare_header(METADATA_GROUP, Operation::CreateTopic);
    second.op = 43;
    let b = chain.append(&mut second, b"b");
    let Message::Prepare(ha, _) = decode(a.as_bytes(), &limits()).unwrap() else {
        panic!()
    };
    let Message::Prepare(hb, _) = decode(b.as_bytes(), &limits()).unwrap() else {
        panic!()
    };
    assert_eq!(ha.parent, 0xdead);
    assert_eq!(hb.parent, a.checksum());
    assert_eq!(chain.parent(), b.checksum());
}

#[test]
fn check_header_accepts_a_header_alone_and_reports_the_body_length() {
    let frame = sample(Command::StateChunk).unwrap();
    let head = FrameBuf::from_bytes(&frame.as_bytes()[..HEADER_SIZE]);
    let info = check_header(head.as_bytes(), &limits()).unwrap();
    assert_eq!(info.command, Command::StateChunk);
    assert_eq!(info.body_len(), 1000);
}

#[test]
fn batch_round_trips_through_encode_stamp_and_verify() {
    let bytes = sample_batch(5);
    let info = batch::verify(&bytes).unwrap();
    assert_eq!(info.partition_id, 3);
    assert_eq!(info.base_offset, 100);
    assert_eq!(info.message_count, 5);
    assert_eq!(info.next_offset(), 105);
    let messages: Vec<_> = batch::messages(&bytes).collect();
    assert_eq!(messages.len(), 5);
    assert_eq!(messages[2].offset, 102);
    assert_eq!(messages[2].id, 3);
    assert_eq!(messages[2].payload, &vec![2u8; 42][..]);
    assert_eq!(messages[2].user_headers, b"h=v");
    assert_eq!(messages[3].timestamp, 1_000_003);
}

#[test]
fn a_served_slice_keeps_its_messages_and_offsets() {
    let bytes = sample_batch(5);
    let mut out = Vec::new();
    // The whole batch in range: served as stored.
    assert_eq!(batch::append_served(&bytes, 90, 200, &mut out), Ok(5));
    assert_eq!(out, bytes);
    // Messages 101..104 of 100..105: a batch of three, each message byte-identical.
    out.clear();
    assert_eq!(batch::append_served(&bytes, 101, 104, &mut out), Ok(3));
    let info = batch::verify_served(&out).unwrap();
    assert_eq!((info.base_offset, info.message_count), (101, 3));
    let served: Vec<_> = batch::messages(&out).collect();
    let stored: Vec<_> = batch::messages(&bytes).collect();
    assert_eq!(served, stored[1..4].to_vec());
    // A stored batch must start at offset_delta 0: a slice is not one.
    assert!(matches!(
        batch::verify(&out),
        Err(batch::BatchError::OffsetDelta { message: 0, .. })
    ));
    // Out of range: nothing.
    assert_eq!(batch::append_served(&bytes, 105, 300, &mut out), Ok(0));
    assert_eq!(batch::append_served(&bytes, 0, 100, &mut out), Ok(0));
    // A damaged slice fails verification.
    let mut damaged = Vec::new();
    batch::append_served(&bytes, 102, 105, &mut damaged).unwrap();
    let last = damaged.len() - 1;
    damaged[last] ^= 1;
    assert!(batch::verify_served(&damaged).is_err());
}

#[test]
fn restamping_a_batch_recomputes_its_checksum() {
    let mut bytes = sample_batch(2);
    batch::stamp(&mut bytes, 3, 500, 2_000_000).unwrap();
    assert_eq!(batch::verify(&bytes).unwrap().base_offset, 500);
    // Changing a stamp field without restamping is caught by batch_checksum.
    set_u64(&mut bytes, 8, 501);
    assert!(matches!(
        batch::verify(&bytes),
        Err(batch::BatchError::BatchChecksum { .. })
    ));
}

#[test]
fn batch_verify_rejects_each_kind_of_damage() {
    use batch::BatchError as E;
    let good = sample_batch(3);
    let mut bytes = good.clone();
    bytes[256 + 48 + 1] ^= 1;
    assert_eq!(
        batch::verify(&bytes),
        Err(E::MessageChecksum { message: 0 })
    );
    let mut bytes = good.clone();
    bytes.extend_from_slice(&[0; 8]);
    let len = bytes.len() as u64;
    set_u64(&mut bytes, 32, len);
    assert!(matches!(
        batch::verify(&bytes),
        Err(E::TrailingBytes { trailing: 8, .. })
    ));
    let mut bytes = good.clone();
    bytes[48..52].copy_from_slice(&4u32.to_le_bytes());
    assert_eq!(batch::verify(&bytes), Err(E::MessageOverrun { message: 3 }));
    let mut bytes = good.clone();
    bytes[100] = 1;
    assert_eq!(
        batch::verify(&bytes),
        Err(E::ReservedNonZero { message: None })
    );
    let mut bytes = good.clone();
    bytes[44] ^= 1;
    assert!(matches!(
        batch::verify(&bytes),
        Err(E::BatchChecksum { .. })
    ));
    assert!(matches!(
        batch::verify(&good[..good.len() - 1]),
        Err(E::LengthMismatch { .. })
    ));
    assert!(matches!(
        batch::verify(&good[..100]),
        Err(E::TooShort { .. })
    ));
}

#[test]
fn backup_refuses_a_stamp_that_does_not_match_its_position() {
    use batch::{check_stamp, BatchError, PartitionPosition};
    let bytes = sample_batch(2);
    let at = PartitionPosition {
        partition_id: 3,
        next_offset: 100,
        last_timestamp: 1_000_000,
    };
    assert!(check_stamp(&bytes, &at).is_ok());
    let ahead = PartitionPosition {
        next_offset: 99,
        ..at
    };
    assert!(matches!(
        check_stamp(&bytes, &ahead),
        Err(BatchError::StampMismatch {
            field: "base_offset",
            ..
        })
    ));
    let other = PartitionPosition {
        partition_id: 4,
        ..at
    };
    assert!(matches!(
        check_stamp(&bytes, &other),
        Err(BatchError::StampMismatch {
            field: "partition_id",
            ..
        })
    ));
    let later = PartitionPosition {
        last_timestamp: 1_000_101,
        ..at
    };
    assert!(matches!(
        check_stamp(&bytes, &later),
        Err(BatchError::StampMismatch {
            field: "base_timestamp",
            ..
        })
    ));
}

/// Field values for one header, drawn by proptest and fitted to the field rules.
fn fitted(command: Command, v: &[u64; 6], body: &[u8]) -> Option<FrameBuf> {
    let mut frame_bytes = sample(command)?.as_bytes().to_vec();
    // Overwrite the common frame's free fields.
    frame_bytes[32..48].copy_from_slice(&(u128::from(v[0]) << 64 | u128::from(v[1])).to_le_bytes());
    frame_bytes[61] = v[2] as u8;
    let group = if v[3].is_multiple_of(2) {
        METADATA_GROUP
    } else {
        (v[3] >> 12) | 1
    };
    let buf = FrameBuf::from_bytes(&frame_bytes);
    use Command as C;
    macro_rules! rebuild {
        ($ty:ty, $body:expr, |$h:ident| $fit:block) => {{
            let mut $h = <$ty>::read_from_prefix(buf.as_bytes()).unwrap().0;
            $fit
            FrameBuf::from_bytes(Frame::build(&$h, $body).as_bytes())
        }};
    }
    Some(match command {
        C::Prepare | C::RepairPrepare => rebuild!(PrepareHeader, body, |h| {
            h.frame.command = command as u8;
            h.group = METADATA_GROUP;
            h.op = v[3];
            h.commit = v[4];
            h.timestamp = v[5];
            h.client = u128::from(v[4]) << 3;
            h.parent = u128::from(v[5]) << 7;
        }),
        C::PrepareOk => rebuild!(PrepareOkHeader, &[], |h| {
            h.op = v[3];
            h.commit = v[4];
            h.group = group;
            h.prepare_checksum = u128::from(v[5]);
        }),
        C::Commit => rebuild!(CommitHeader, &[], |h| {
            h.timestamp_monotonic = v[3];
            h.commit = v[4];
            h.group = group;
        }),
        C::DoViewChange => rebuild!(DoViewChangeHeader, &suffix_body((v[5] % 5) as usize), |h| {
            h.op = v[3].max(v[4]);
            h.commit = v[4].min(v[3]);
            h.group = group;
            h.log_view = (v[5] as u32) % (h.frame.view + 1);
            h.nack_bitset = u128::from(v[5]) & ((1 << (v[5] % 5)) - 1);
            h.present_bitset = u128::from(v[4]) & ((1 << (v[5] % 5)) - 1);
        }),
        C::RequestPrepares => rebuild!(RequestPreparesHeader, &[], |h| {
            h.from_op = v[3].min(v[4]).max(1);
            h.to_op = v[3].max(v[4]).max(1);
            h.nonce = u128::from(v[5]);
            h.group = group;
        }),
        C::StateChunk => rebuild!(StateChunkHeader, body, |h| {
            h.offset = v[3];
            h.artifact = v[4] as u32;
            h.group = group;
        }),
        C::ForwardLogout => rebuild!(ForwardLogoutHeader, &[], |h| {
            h.session = v[3];
            h.request = v[4];
            h.nonce = u128::from(v[5]);
        }),
        _ => {
            // Other layouts keep the sample's fields; the common frame varies.
            let mut buf = buf;
            seal_in_place(buf.as_bytes_mut());
            buf
        }
    })
}

fn fields_of(bytes: &[u8]) -> Vec<(&'static str, header::FieldValue)> {
    let command = Command::from_u8(bytes[60]).unwrap();
    let head: &[u8; HEADER_SIZE] = bytes[..HEADER_SIZE].try_into().unwrap();
    let mut out = Vec::new();
    header::with_fields_of(command, head, |h| {
        h.frame().visit_fields(&mut |n, v| out.push((n, v)));
        h.visit_fields(&mut |n, v| out.push((n, v)));
    });
    out
}

fn decoded_fields(message: &Message<'_>) -> Vec<(&'static str, header::FieldValue)> {
    let mut out = Vec::new();
    let header = message.header_fields();
    header.frame().visit_fields(&mut |n, v| out.push((n, v)));
    header.visit_fields(&mut |n, v| out.push((n, v)));
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn encode_then_decode_gives_the_same_fields_for_every_header_type(
        index in 0usize..25,
        v in proptest::array::uniform6(any::<u64>()),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let commands: Vec<Command> = Command::ALL.iter().copied().filter(|c| sample(*c).is_some()).collect();
        let command = commands[index % commands.len()];
        let frame = fitted(command, &v, &body).unwrap();
        let before = fields_of(frame.as_bytes());
        let buf = frame;
        let message = decode(buf.as_bytes(), &limits())
            .map_err(|e| TestCaseError::fail(format!("{}: {e}", command.name())))?;
        prop_assert_eq!(message.command(), command);
        prop_assert_eq!(before, decoded_fields(&message));
    }

    #[test]
    fn flipping_any_bit_of_a_sealed_header_or_body_is_rejected(
        index in 0usize..25,
        bit in any::<usize>(),
    ) {
        let mut frames: Vec<Frame> = samples()
            .into_iter()
            .filter(|f| Command::from_u8(f.header().command).unwrap().seal_kind() != registry::SealKind::Unsealed)
            .collect();
        frames.push(partition_prepare());
        let frame = &frames[index % frames.len()];
        let command = Command::from_u8(frame.header().command).unwrap();
        // Sealed regions: the header, and the body where a seal or the batch covers it.
        let body_sealed = command.has_body_seal() || command.seal_kind() == registry::SealKind::Identity;
        let bits = if body_sealed { frame.as_bytes().len() * 8 } else { HEADER_SIZE * 8 };
        let mut bit = bit % bits;
        // A prepare's view is outside its identity by design (retransmits re-stamp it).
        if command.seal_kind() == registry::SealKind::Identity && (52 * 8..56 * 8).contains(&bit) {
            bit += 4 * 8;
        }
        let buf = tampered(frame, |b| b[bit / 8] ^= 1 << (bit % 8));
        prop_assert!(decode(buf.as_bytes(), &limits()).is_err(), "{} bit {} accepted", command.name(), bit);
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(
        bytes in proptest::collection::vec(any::<u8>(), 0..1024),
        size_matches in any::<bool>(),
        command in 0u8..32,
    ) {
        let mut bytes = bytes;
        if bytes.len() >= HEADER_SIZE {
            bytes[60] = command;
            if size_matches {
                let len = bytes.len() as u32;
                bytes[48..52].copy_from_slice(&len.to_le_bytes());
            }
        }
        let buf = FrameBuf::from_bytes(&bytes);
        let _ = decode(buf.as_bytes(), &limits());
        let _ = check_header(buf.as_bytes(), &limits());
        let _ = batch::verify(&bytes);
        let _ = batch::messages(&bytes).count();
        for piece in decode::split_frames(&bytes) {
            let piece = FrameBuf::from_bytes(piece);
            let _ = decode(piece.as_bytes(), &limits());
        }
    }

    #[test]
    fn arbitrary_batches_never_panic_and_valid_ones_round_trip(
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..20),
        flip in any::<usize>(),
    ) {
        let mut builder = BatchBuilder::with_capacity(4096);
        for (i, p) in payloads.iter().enumerate() {
            builder.push(NewMessage { id: i as u128, timestamp_delta: 0, payload: p, user_headers: &[] });
        }
        let mut bytes = builder.finish(9);
        batch::stamp(&mut bytes, 1, 0, 10).unwrap();
        let info = batch::verify(&bytes).unwrap();
        prop_assert_eq!(info.message_count as usize, payloads.len());
        let read: Vec<Vec<u8>> = batch::messages(&bytes).map(|m| m.payload.to_vec()).collect();
        prop_assert_eq!(&read, &payloads);
        let bit = flip % (bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(batch::verify(&bytes).is_err(), "bit {} flipped and accepted", bit);
    }
}

#[test]
fn header_field_values_are_visible_by_their_wire_table_names() {
    let frame = sample(Command::RequestPrepares).unwrap();
    let fields = fields_of(frame.as_bytes());
    let get = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("from_op"), Some(header::FieldValue::Int(10)));
    assert_eq!(get("to_op"), Some(header::FieldValue::Int(20)));
    assert_eq!(get("size"), Some(header::FieldValue::Int(256)));
    assert!(get("reserved_tail").is_none());
}

#[test]
fn trusted_decoding_and_header_only_batch_info_agree_with_full_verification() {
    let frame = partition_prepare();
    let full = decode(frame.as_bytes(), &Limits::default()).expect("valid");
    let trusted = decode_trusted(frame.as_bytes(), &Limits::default()).expect("valid");
    let (Message::Prepare(a, body), Message::Prepare(b, _)) = (full, trusted) else {
        panic!("both decode as a Prepare");
    };
    assert_eq!(
        zerocopy::IntoBytes::as_bytes(a),
        zerocopy::IntoBytes::as_bytes(b)
    );
    assert_eq!(batch::info_of_verified(body), batch::verify(body));
    // Header rules still hold on the trusted path: a frame cut short is refused.
    let cut = &frame.as_bytes()[..frame.as_bytes().len() - 16];
    assert!(decode_trusted(cut, &Limits::default()).is_err());
    // A batch length that disagrees with the slice is refused without hashing.
    assert!(batch::info_of_verified(&body[..body.len() - 1]).is_err());
}
