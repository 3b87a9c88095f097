//! Sans-IO recovery: from the evidence of every slot (see `slot`) and the checkpoint op
//! recorded in the superblock, decide which ops the journal holds, which are faulty and
//! must be repaired from peers, and which torn tail is truncated.
//!
//! Write order makes this decidable. An append writes its prepares (with the redundant
//! headers of earlier, already durable appends) and syncs once before acknowledging; a
//! prepare's own redundant header is written only after that sync, with the next one.
//! So:
//! - a valid redundant header for op `n` means prepare `n` was once durable: if the
//!   prepare no longer verifies, the entry is corrupt (faulty, repaired), not torn;
//! - only the ops above the highest vouched op can be torn: the acknowledged append
//!   whose headers were still pending (its prepares all durable) and the one in flight;
//!   the first of them that fails verification is where the crash tore, and it and
//!   everything after it is the torn tail, truncated (never acknowledged unless a
//!   durable prepare of the pending append was also damaged before the restart: the one
//!   case a single flush per append cannot tell from a tear, see README);
//! - every op between the checkpoint and the head must verify; a gap is faulty.
//!
//! A valid prepare is trusted even if its redundant header is damaged or was never
//! written (a torn header sector, a crash before the next flush), and the header is
//! rewritten from the prepare.

use serde::Serialize;

use crate::layout::JournalLayout;
use crate::slot::{CopyState, EntryFault, SlotEvidence};

/// Why a required op is faulty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum FaultReason {
    /// The prepare is there but fails verification.
    Corrupt { fault: EntryFault },
    /// The slot holds nothing, or an older entry (a lost write).
    Missing,
    /// The slot holds a verified entry for another op's slot.
    Misdirected { found_op: u64 },
    /// Prepare and redundant header verify as the same entry but their bytes differ (in
    /// `view`, outside the identity): one was damaged and neither can be preferred.
    CopiesDisagree,
}

/// The verdict on one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum SlotStatus {
    /// Nothing written and nothing needed.
    Empty,
    /// Holds the verified entry for a required op. `header_repaired` when the redundant
    /// copy disagreed and is rewritten from the prepare.
    Valid {
        op: u64,
        #[serde(serialize_with = "crate::inspect::u128_string")]
        checksum: u128,
        header_repaired: bool,
    },
    /// A verified entry for an op the checkpoint covers; the slot is free for reuse.
    Stale { op: u64 },
    /// The entry for a required op is damaged or missing: report it for repair.
    Faulty { op: u64, reason: FaultReason },
    /// Part of the torn last write (or group commit) of a crash, past the head:
    /// truncated, never acknowledged. `fault` is None for a slot that verified but follows
    /// the torn one (kept out so the log stays contiguous).
    TornTail { op: u64, fault: Option<EntryFault> },
    /// Bytes that fail verification in a slot no required op uses.
    Damaged { fault: EntryFault },
    /// A verified entry for another slot, where no required op lives.
    Misdirected { found_op: u64 },
}

/// A misdirected entry: a verified header or prepare whose op belongs to another slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Misdirection {
    pub slot: u64,
    pub op: u64,
    /// "header" (redundant copy) or "prepare".
    pub copy: &'static str,
}

/// The outcome of a recovery scan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Recovery {
    /// The checkpoint op the scan started from (ops at or below it are not needed).
    pub op_checkpoint: u64,
    /// The highest op the journal knows of (valid or faulty); `op_checkpoint` if none.
    pub op_head: u64,
    /// The lowest required op (`op_head + 1` when none is required).
    pub op_min: u64,
    /// Per-slot verdicts, indexed by slot.
    pub slots: Vec<SlotStatus>,
    /// Required ops that must be repaired from peers, ascending.
    pub faulty: Vec<u64>,
    /// Slots whose torn tail was truncated.
    pub torn: Vec<u64>,
    /// Every misdirected copy seen.
    pub misdirected: Vec<Misdirection>,
    /// Slots whose redundant header must be rewritten from the prepare.
    pub header_repairs: Vec<u64>,
}

impl Recovery {
    /// Whether every required op verified.
    pub fn is_clean(&self) -> bool {
        self.faulty.is_empty()
    }
}

/// Decides the state of the journal from per-slot evidence (`evidence[s].slot == s`).
pub fn recover(layout: &JournalLayout, evidence: &[SlotEvidence], op_checkpoint: u64) -> Recovery {
    // Invariant: the caller reads exactly one evidence record per slot of `layout` (the
    // file's contents decide what a record says, never how many there are).
    assert_eq!(evidence.len() as u64, layout.slot_count);
    let slot_count = layout.slot_count;

    // The highest op any valid copy names, and the highest a redundant header vouches for
    // (written only once its prepare was durable, so everything up to it was durable).
    let mut op_known = op_checkpoint;
    let mut op_vouched = op_checkpoint;
    for ev in evidence {
        if let Some(id) = ev.header.valid() {
            op_known = op_known.max(id.op);
            op_vouched = op_vouched.max(id.op);
        }
        if let Some(id) = ev.prepare.valid() {
            op_known = op_known.max(id.op);
        }
    }
    let op_min = (op_checkpoint + 1).max((op_known + 1).saturating_sub(slot_count));
    // Invariant: op_min >= op_known + 1 - slot_count by its definition just above. The
    // ops read from disk are those of checksummed copies, written by this journal in
    // order from 1, so op_known + 1 does not overflow.
    assert!(op_known + 1 - op_min <= slot_count);

    // Walk the required ops upwards. The first one that fails above the vouched op is
    // where an unacknowledged write (or group of writes) tore: it and everything after
    // it is the torn tail.
    let mut statuses: Vec<Option<SlotStatus>> = vec![None; evidence.len()];
    let mut op_head = op_known;
    for op in op_min..=op_known {
        let slot = layout.slot_of(op) as usize;
        let status = required_slot_status(&evidence[slot], op);
        if op_head == op_known && op > op_vouched && matches!(status, SlotStatus::Faulty { .. }) {
            op_head = op - 1;
        }
        statuses[slot] = Some(if op > op_head {
            SlotStatus::TornTail {
                op,
                fault: match evidence[slot].prepare {
                    CopyState::Invalid { fault } => Some(fault),
                    _ => None,
                },
            }
        } else {
            status
        });
    }
    // Invariant: op_head starts at op_known (>= op_vouched >= op_checkpoint) and is only
    // lowered to op - 1 for an op above op_vouched.
    assert!(op_head >= op_vouched.max(op_checkpoint));

    let mut recovery = Recovery {
        op_checkpoint,
        op_head,
        op_min: op_min.min(op_head + 1),
        slots: Vec::with_capacity(evidence.len()),
        faulty: Vec::new(),
        torn: Vec::new(),
        misdirected: Vec::new(),
        header_repairs: Vec::new(),
    };
    for (ev, status) in evidence.iter().zip(statuses) {
        let slot = ev.slot;
        for (copy, name) in [(ev.header, "header"), (ev.prepare, "prepare")] {
            if let CopyState::Misdirected { op, .. } = copy {
                recovery.misdirected.push(Misdirection {
                    slot,
                    op,
                    copy: name,
                });
            }
        }
        let status = status.unwrap_or_else(|| {
            let next = (slot == (op_head + 1) % slot_count).then_some(op_head + 1);
            free_slot_status(ev, next)
        });
        match status {
            SlotStatus::Faulty { op, .. } => recovery.faulty.push(op),
            SlotStatus::TornTail { .. } => recovery.torn.push(slot),
            SlotStatus::Valid {
                header_repaired: true,
                ..
            } => recovery.header_repairs.push(slot),
            _ => {}
        }
        recovery.slots.push(status);
    }
    recovery.faulty.sort_unstable();
    recovery
}

fn required_slot_status(ev: &SlotEvidence, op: u64) -> SlotStatus {
    match ev.prepare {
        CopyState::Valid { op: found, .. }
            if found == op && ev.header == ev.prepare && !ev.headers_equal =>
        {
            SlotStatus::Faulty {
                op,
                reason: FaultReason::CopiesDisagree,
            }
        }
        CopyState::Valid {
            op: found,
            checksum,
        } if found == op => SlotStatus::Valid {
            op,
            checksum,
            header_repaired: ev.header != ev.prepare,
        },
        CopyState::Invalid { fault } => SlotStatus::Faulty {
            op,
            reason: FaultReason::Corrupt { fault },
        },
        CopyState::Misdirected { op: found_op, .. } => SlotStatus::Faulty {
            op,
            reason: FaultReason::Misdirected { found_op },
        },
        CopyState::Zero | CopyState::Valid { .. } => SlotStatus::Faulty {
            op,
            reason: FaultReason::Missing,
        },
    }
}

fn free_slot_status(ev: &SlotEvidence, next_op: Option<u64>) -> SlotStatus {
    match ev.prepare {
        CopyState::Zero => SlotStatus::Empty,
        CopyState::Valid { op, .. } => SlotStatus::Stale { op },
        CopyState::Misdirected { op, .. } => SlotStatus::Misdirected { found_op: op },
        CopyState::Invalid { fault } => match next_op {
            Some(op) => SlotStatus::TornTail {
                op,
                fault: Some(fault),
            },
            None => SlotStatus::Damaged { fault },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot::{classify_slot, tests::prepare};

    const SLOTS: u64 = 8;
    const SLOT_SIZE: usize = 4096;

    /// An in-memory journal image: header copies and prepare slots.
    struct Image {
        headers: Vec<Vec<u8>>,
        prepares: Vec<Vec<u8>>,
    }

    impl Image {
        fn new() -> Image {
            Image {
                headers: vec![vec![0; 256]; SLOTS as usize],
                prepares: vec![vec![0; SLOT_SIZE]; SLOTS as usize],
            }
        }

        fn append(&mut self, op: u64) {
            let frame = prepare(op, 64 + op as usize, op as u8);
            let slot = (op % SLOTS) as usize;
            self.prepares[slot].fill(0);
            self.prepares[slot][..frame.len()].copy_from_slice(&frame);
            self.headers[slot].copy_from_slice(&frame[..256]);
        }

        fn recover(&self, op_checkpoint: u64) -> Recovery {
            let layout = JournalLayout::new(SLOTS, SLOT_SIZE as u64).unwrap();
            let evidence: Vec<_> = (0..SLOTS)
                .map(|s| {
                    let s_ = s as usize;
                    classify_slot(
                        s,
                        SLOTS,
                        SLOT_SIZE as u64,
                        &self.headers[s_],
                        &self.prepares[s_],
                    )
                })
                .collect();
            recover(&layout, &evidence, op_checkpoint)
        }
    }

    #[test]
    fn clean_journal_recovers_every_op() {
        let mut image = Image::new();
        (1..=5).for_each(|op| image.append(op));
        let r = image.recover(0);
        assert_eq!((r.op_head, r.op_min), (5, 1));
        assert!(r.is_clean() && r.torn.is_empty());
        assert!(matches!(r.slots[0], SlotStatus::Empty));
        assert!(matches!(
            r.slots[3],
            SlotStatus::Valid {
                op: 3,
                header_repaired: false,
                ..
            }
        ));
    }

    #[test]
    fn torn_prepare_after_the_head_is_truncated_not_faulty() {
        let mut image = Image::new();
        (1..=5).for_each(|op| image.append(op));
        // Crash while writing op 6: part of the prepare landed, the header never did.
        let frame = prepare(6, 64, 6);
        image.prepares[6][..100].copy_from_slice(&frame[..100]);
        let r = image.recover(0);
        assert_eq!(r.op_head, 5);
        assert!(r.is_clean());
        assert_eq!(r.torn, vec![6]);
    }

    #[test]
    fn corrupt_head_prepare_with_valid_header_is_faulty_not_torn() {
        let mut image = Image::new();
        (1..=5).for_each(|op| image.append(op));
        image.prepares[5][300] ^= 1;
        let r = image.recover(0);
        assert_eq!(r.op_head, 5);
        assert_eq!(r.faulty, vec![5]);
        assert!(r.torn.is_empty());
    }

    #[test]
    fn corrupt_middle_entry_is_faulty_and_both_copies_lost_too() {
        let mut image = Image::new();
        (1..=6).for_each(|op| image.append(op));
        image.prepares[2][10] ^= 1;
        image.prepares[4].fill(0xAB);
        image.headers[4].fill(0xAB);
        let r = image.recover(0);
        assert_eq!(r.faulty, vec![2, 4]);
        assert!(matches!(
            r.slots[2],
            SlotStatus::Faulty {
                op: 2,
                reason: FaultReason::Corrupt {
                    fault: EntryFault::HeaderChecksum
                }
            }
        ));
    }

    #[test]
    fn torn_header_sector_is_repaired_from_valid_prepares() {
        let mut image = Image::new();
        (1..=6).for_each(|op| image.append(op));
        for slot in 0..SLOTS as usize {
            image.headers[slot].fill(0x5A);
        }
        let r = image.recover(0);
        assert!(r.is_clean());
        assert_eq!(r.header_repairs, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn misdirected_prepare_is_reported_and_never_trusted() {
        let mut image = Image::new();
        (1..=6).for_each(|op| image.append(op));
        let from = image.prepares[2].clone();
        image.prepares[3] = from;
        let r = image.recover(0);
        assert_eq!(r.faulty, vec![3]);
        assert!(r
            .misdirected
            .iter()
            .any(|m| m.slot == 3 && m.op == 2 && m.copy == "prepare"));
        assert!(matches!(
            r.slots[3],
            SlotStatus::Faulty {
                op: 3,
                reason: FaultReason::Misdirected { found_op: 2 }
            }
        ));
    }

    #[test]
    fn lost_prepare_write_under_a_valid_header_is_missing() {
        let mut image = Image::new();
        (1..=9).for_each(|op| image.append(op));
        // Op 10 reuses slot 2 (op 2); its header landed but its prepare write was lost.
        let frame = prepare(10, 64, 10);
        image.headers[2].copy_from_slice(&frame[..256]);
        let r = image.recover(2);
        assert_eq!(r.op_head, 10);
        assert_eq!(r.faulty, vec![10]);
        assert!(matches!(
            r.slots[2],
            SlotStatus::Faulty {
                op: 10,
                reason: FaultReason::Missing
            }
        ));
    }

    #[test]
    fn wrapped_ring_marks_checkpointed_entries_stale() {
        let mut image = Image::new();
        (1..=12).for_each(|op| image.append(op));
        let r = image.recover(6);
        assert_eq!((r.op_head, r.op_min), (12, 7));
        assert!(r.is_clean());
        assert!(matches!(
            r.slots[(5 % SLOTS) as usize],
            SlotStatus::Stale { op: 5 }
        ));
        assert!(matches!(
            r.slots[(12 % SLOTS) as usize],
            SlotStatus::Valid { op: 12, .. }
        ));
    }

    #[test]
    fn torn_group_commit_truncates_from_the_first_failing_unvouched_op() {
        let mut image = Image::new();
        (1..=3).for_each(|op| image.append(op));
        // A group commit of ops 4..=6 crashed after its prepares were written
        // concurrently: 4 and 6 landed, 5 tore, and no redundant header was written yet.
        for op in 4..=6 {
            let frame = prepare(op, 64 + op as usize, op as u8);
            let slot = op as usize;
            image.prepares[slot][..frame.len()].copy_from_slice(&frame);
        }
        image.prepares[5][100] ^= 1;
        let r = image.recover(0);
        assert_eq!(r.op_head, 4);
        assert!(r.is_clean());
        assert_eq!(r.torn, vec![5, 6]);
        assert!(matches!(
            r.slots[6],
            SlotStatus::TornTail { op: 6, fault: None }
        ));
        assert_eq!(r.header_repairs, vec![4]);
    }

    #[test]
    fn acked_append_with_pending_headers_survives_a_torn_next_append() {
        let mut image = Image::new();
        (1..=6).for_each(|op| image.append(op));
        // Ops 4..=6 were acknowledged after one flush; their headers were to be written
        // with the next append (7..=8), which tore: 7 landed whole, 8 partly.
        for slot in 4..=6 {
            image.headers[slot].fill(0);
        }
        let frame = prepare(7, 71, 7);
        image.prepares[7][..frame.len()].copy_from_slice(&frame);
        let frame = prepare(8, 72, 8);
        image.prepares[0][..100].copy_from_slice(&frame[..100]);
        let r = image.recover(0);
        assert_eq!(r.op_head, 7);
        assert!(r.is_clean());
        assert_eq!(r.torn, vec![0]);
        assert_eq!(r.header_repairs, vec![4, 5, 6, 7]);
    }

    #[test]
    fn vouched_prepare_is_faulty_but_an_unvouched_failing_one_is_the_torn_tail() {
        // The window of one flush per append: op 6's header is pending when the crash
        // comes; a damaged prepare 6 then reads as the torn tail, while damage to the
        // vouched op 5 is still reported faulty.
        let mut image = Image::new();
        (1..=6).for_each(|op| image.append(op));
        image.headers[6].fill(0);
        image.prepares[5][300] ^= 1;
        image.prepares[6][300] ^= 1;
        let r = image.recover(0);
        assert_eq!(
            (r.op_head, r.faulty.clone(), r.torn.clone()),
            (5, vec![5], vec![6])
        );
    }

    #[test]
    fn view_flip_outside_the_identity_is_caught_by_the_redundant_copy() {
        let mut image = Image::new();
        (1..=5).for_each(|op| image.append(op));
        image.prepares[2][53] ^= 0x01; // view, not covered by the prepare identity
        let r = image.recover(0);
        assert_eq!(r.faulty, vec![2]);
        assert!(matches!(
            r.slots[2],
            SlotStatus::Faulty {
                reason: FaultReason::CopiesDisagree,
                ..
            }
        ));
    }

    #[test]
    fn missing_entry_between_checkpoint_and_head_is_faulty() {
        let mut image = Image::new();
        (1..=5).for_each(|op| image.append(op));
        image.prepares[3].fill(0);
        image.headers[3].fill(0);
        let r = image.recover(0);
        assert_eq!(r.faulty, vec![3]);
    }
}

#[cfg(test)]
mod proptests {
    use super::*;
    use crate::format::{encode_meta, scan_image};
    use crate::slot::tests::prepare;
    use proptest::prelude::*;

    const SLOTS: u64 = 8;
    const SLOT_SIZE: u64 = 4096;

    /// A journal image with ops 1..=6 written, for damage to be applied to.
    fn image() -> (JournalLayout, Vec<u8>, Vec<(u64, u128)>) {
        let layout = JournalLayout::new(SLOTS, SLOT_SIZE).unwrap();
        let mut image = vec![0u8; layout.file_size() as usize];
        encode_meta(&layout, &mut image[..4096]);
        let mut acked = Vec::new();
        for op in 1..=6u64 {
            let frame = prepare(op, 100 + op as usize * 300, op as u8);
            let at = layout.prepare_offset(op % SLOTS) as usize;
            image[at..at + frame.len()].copy_from_slice(&frame);
            let at = layout.header_offset(op % SLOTS) as usize;
            image[at..at + 256].copy_from_slice(&frame[..256]);
            let header = crate::slot::read_header(&frame).unwrap();
            acked.push((op, header.frame.checksum));
        }
        (layout, image, acked)
    }

    proptest! {
        /// Arbitrary damage never panics, and never turns an acknowledged op into a
        /// different valid entry or drops it without reporting it faulty.
        #[test]
        fn arbitrary_damage_is_never_silently_accepted(
            damage in proptest::collection::vec((0usize..SLOTS as usize * SLOT_SIZE as usize + 4096, any::<u8>(), 1usize..600), 1..6)
        ) {
            let (layout, mut image, acked) = image();
            let base = layout.header_ring_offset() as usize;
            for (at, byte, len) in damage {
                let start = base + at;
                let end = (start + len).min(image.len());
                image[start..end].iter_mut().for_each(|b| *b ^= byte | 1);
            }
            let recovery = recover(&layout, &scan_image(&image, &layout), 0);
            for (op, checksum) in acked {
                match recovery.slots[(op % SLOTS) as usize] {
                    SlotStatus::Valid { op: found, checksum: c, .. } => {
                        prop_assert_eq!((found, c), (op, checksum));
                    }
                    _ => prop_assert!(
                        recovery.faulty.contains(&op) || recovery.op_head < op,
                        "op {} lost silently: {:?}", op, recovery
                    ),
                }
            }
        }
    }
}
