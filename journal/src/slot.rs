//! Sans-IO verification of one journal slot: a prepare (256-byte header + body) and the
//! redundant copy of its header. Pure functions over byte slices, so tests and fuzzers
//! drive them with any bytes; nothing here panics on input.
//!
//! An entry is trusted only if its header's prepare identity (docs/protocol.md,
//! "Frame integrity") matches and its body matches `checksum_body`. The journal stores
//! metadata-plane prepares, whose bodies are always sealed.

use replication::wire::frame::{prepare_identity, seal_of};
use replication::wire::{Command, PrepareHeader};
use serde::Serialize;
use zerocopy::FromBytes;

use crate::layout::HEADER_SIZE;

/// The identity of an entry: its op and its prepare identity checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EntryId {
    pub op: u64,
    /// The prepare identity (header `checksum`).
    #[serde(serialize_with = "crate::inspect::u128_string")]
    pub checksum: u128,
}

/// Why bytes in a slot are not a trustworthy entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryFault {
    /// The header's identity checksum does not match its bytes (torn or corrupt).
    HeaderChecksum,
    /// The header verifies but is not a Prepare.
    NotPrepare,
    /// The header verifies but its size is below 256 or beyond the slot.
    SizeInvalid,
    /// The header verifies but the body does not match `checksum_body`.
    BodyChecksum,
}

/// What one copy (the redundant header or the prepare) in a slot holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "state")]
pub enum CopyState {
    /// All 256 header bytes are zero: never written (or cleared by truncation).
    Zero,
    /// A verified entry that belongs in this slot.
    Valid {
        op: u64,
        #[serde(serialize_with = "crate::inspect::u128_string")]
        checksum: u128,
    },
    /// A verified entry whose op belongs in another slot: a misdirected write.
    Misdirected {
        op: u64,
        #[serde(serialize_with = "crate::inspect::u128_string")]
        checksum: u128,
    },
    /// Bytes that fail verification.
    Invalid { fault: EntryFault },
}

impl CopyState {
    /// The entry, if valid for this slot.
    pub fn valid(&self) -> Option<EntryId> {
        match *self {
            CopyState::Valid { op, checksum } => Some(EntryId { op, checksum }),
            _ => None,
        }
    }
}

/// Both copies of one slot, as read from disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SlotEvidence {
    pub slot: u64,
    /// The redundant copy in the header ring.
    pub header: CopyState,
    /// The prepare in the prepare ring (header and body).
    pub prepare: CopyState,
    /// Whether the two 256-byte headers are byte-identical. Two valid copies of one
    /// entry can still differ in `view`, which the prepare identity does not cover.
    pub headers_equal: bool,
}

/// Reads a header out of any 256 bytes (a copy, so `bytes` needs no alignment).
pub fn read_header(bytes: &[u8]) -> Option<PrepareHeader> {
    PrepareHeader::read_from_bytes(bytes.get(..HEADER_SIZE as usize)?).ok()
}

/// Verifies a header alone: identity checksum, command, size bound.
pub fn verify_header(header: &PrepareHeader, slot_size: u64) -> Result<EntryId, EntryFault> {
    if header.frame.checksum != prepare_identity(header) {
        return Err(EntryFault::HeaderChecksum);
    }
    // The identity hashes the command as Prepare, so check the stored byte too: the
    // journal stores Prepare, never RepairPrepare.
    if header.frame.command != Command::Prepare as u8 {
        return Err(EntryFault::NotPrepare);
    }
    let size = u64::from(header.frame.size);
    if size < HEADER_SIZE || size > slot_size {
        return Err(EntryFault::SizeInvalid);
    }
    Ok(EntryId {
        op: header.op,
        checksum: header.frame.checksum,
    })
}

/// Verifies a whole prepare (`bytes` holds at least `size` bytes, e.g. the whole slot):
/// header, then body seal. Returns the entry and its exact bytes.
pub fn verify_prepare(bytes: &[u8], slot_size: u64) -> Result<(EntryId, &[u8]), EntryFault> {
    let header = read_header(bytes).ok_or(EntryFault::SizeInvalid)?;
    let id = verify_header(&header, slot_size)?;
    let size = header.frame.size as usize;
    let frame = bytes.get(..size).ok_or(EntryFault::SizeInvalid)?;
    if header.frame.checksum_body != seal_of(&frame[HEADER_SIZE as usize..]) {
        return Err(EntryFault::BodyChecksum);
    }
    Ok((id, frame))
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| *b == 0)
}

fn placed(slot: u64, slot_count: u64, id: EntryId) -> CopyState {
    if id.op % slot_count == slot {
        CopyState::Valid {
            op: id.op,
            checksum: id.checksum,
        }
    } else {
        CopyState::Misdirected {
            op: id.op,
            checksum: id.checksum,
        }
    }
}

/// Classifies both copies of `slot`: `header_copy` is its 256 bytes in the header ring,
/// `prepare` the whole slot of the prepare ring.
pub fn classify_slot(
    slot: u64,
    slot_count: u64,
    slot_size: u64,
    header_copy: &[u8],
    prepare: &[u8],
) -> SlotEvidence {
    let header_bytes = header_copy
        .get(..HEADER_SIZE as usize)
        .unwrap_or(header_copy);
    let header = if is_zero(header_bytes) {
        CopyState::Zero
    } else {
        match read_header(header_bytes).map(|h| verify_header(&h, slot_size)) {
            Some(Ok(id)) => placed(slot, slot_count, id),
            Some(Err(fault)) => CopyState::Invalid { fault },
            None => CopyState::Invalid {
                fault: EntryFault::SizeInvalid,
            },
        }
    };
    let prepare_head = prepare.get(..HEADER_SIZE as usize).unwrap_or(prepare);
    let prepare_state = if is_zero(prepare_head) {
        CopyState::Zero
    } else {
        match verify_prepare(prepare, slot_size) {
            Ok((id, _)) => placed(slot, slot_count, id),
            Err(fault) => CopyState::Invalid { fault },
        }
    };
    let headers_equal = header_bytes == prepare_head;
    SlotEvidence {
        slot,
        header,
        prepare: prepare_state,
        headers_equal,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use replication::wire::{Frame, PrepareChain, METADATA_GROUP};

    /// A sealed metadata-plane prepare for `op` with a body derived from `seed`.
    pub(crate) fn prepare(op: u64, body_len: usize, seed: u8) -> Vec<u8> {
        let mut header = <PrepareHeader as replication::wire::Header>::new();
        header.op = op;
        header.group = METADATA_GROUP;
        header.operation = 128;
        header.client = 7;
        let body: Vec<u8> = (0..body_len).map(|i| (i as u8) ^ seed).collect();
        let mut chain = PrepareChain::after(u128::from(op));
        let frame: Frame = chain.append(&mut header, &body);
        frame.as_bytes().to_vec()
    }

    fn slot_bytes(frame: &[u8], slot_size: usize) -> Vec<u8> {
        let mut slot = vec![0; slot_size];
        slot[..frame.len()].copy_from_slice(frame);
        slot
    }

    #[test]
    fn valid_prepare_and_matching_copy_classify_valid() {
        let frame = prepare(5, 100, 1);
        let ev = classify_slot(1, 4, 4096, &frame[..256], &slot_bytes(&frame, 4096));
        assert!(matches!(ev.header, CopyState::Valid { op: 5, .. }));
        assert_eq!(ev.prepare, ev.header);
    }

    #[test]
    fn flipped_body_byte_fails_body_checksum() {
        let mut frame = prepare(5, 100, 1);
        frame[300] ^= 0x40;
        let ev = classify_slot(1, 4, 4096, &frame[..256], &slot_bytes(&frame, 4096));
        assert_eq!(
            ev.prepare,
            CopyState::Invalid {
                fault: EntryFault::BodyChecksum
            }
        );
        assert!(matches!(ev.header, CopyState::Valid { op: 5, .. }));
    }

    #[test]
    fn flipped_header_byte_fails_header_checksum() {
        let mut frame = prepare(5, 100, 1);
        frame[180] ^= 1;
        let ev = classify_slot(1, 4, 4096, &frame[..256], &slot_bytes(&frame, 4096));
        assert_eq!(
            ev.prepare,
            CopyState::Invalid {
                fault: EntryFault::HeaderChecksum
            }
        );
    }

    #[test]
    fn prepare_in_the_wrong_slot_is_misdirected() {
        let frame = prepare(6, 10, 1);
        let ev = classify_slot(1, 4, 4096, &frame[..256], &slot_bytes(&frame, 4096));
        assert!(matches!(ev.prepare, CopyState::Misdirected { op: 6, .. }));
        assert!(matches!(ev.header, CopyState::Misdirected { op: 6, .. }));
    }

    #[test]
    fn oversized_prepare_is_rejected_even_with_valid_checksum() {
        let frame = prepare(1, 5000, 1);
        let ev = classify_slot(1, 4, 4096, &frame[..256], &frame[..4096]);
        assert_eq!(
            ev.prepare,
            CopyState::Invalid {
                fault: EntryFault::SizeInvalid
            }
        );
    }

    #[test]
    fn zero_bytes_classify_zero_and_short_input_does_not_panic() {
        let ev = classify_slot(0, 4, 4096, &[0; 256], &[0; 4096]);
        assert_eq!((ev.header, ev.prepare), (CopyState::Zero, CopyState::Zero));
        let ev = classify_slot(0, 4, 4096, &[1; 10], &[1; 10]);
        assert!(matches!(ev.header, CopyState::Invalid { .. }));
        assert!(matches!(ev.prepare, CopyState::Invalid { .. }));
    }
}
