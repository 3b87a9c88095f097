//! The journal recovery scan over arbitrary file contents: either the input is the
//! image itself (behind valid meta copies), or it is damage (offset, xor) applied to a
//! valid image of real prepares. Nothing may panic, every slot gets a verdict, and an
//! undamaged valid image recovers clean with every op.
#![no_main]

use journal::format::{decode_meta_copies, encode_meta, scan_image};
use journal::layout::JournalLayout;
use journal::recovery::recover;
use libfuzzer_sys::fuzz_target;
use replication::wire::{Header, Operation, PrepareChain, PrepareHeader, METADATA_GROUP};

const SLOTS: u64 = 8;
const SLOT_SIZE: u64 = 4096;
const OPS: u64 = 6;

fn valid_image(layout: &JournalLayout) -> Vec<u8> {
    let mut image = vec![0u8; layout.file_size() as usize];
    for copy in 0..2 {
        let at = JournalLayout::meta_offset(copy) as usize;
        encode_meta(layout, &mut image[at..at + 4096]);
    }
    let mut chain = PrepareChain::after(0);
    for op in 1..=OPS {
        let mut header = PrepareHeader::new();
        header.op = op;
        header.operation = Operation::CreateStream as u8;
        header.group = METADATA_GROUP;
        let frame = chain.append(&mut header, &op.to_le_bytes());
        let slot = layout.slot_of(op);
        let prepare_at = layout.prepare_offset(slot) as usize;
        image[prepare_at..prepare_at + frame.as_bytes().len()].copy_from_slice(frame.as_bytes());
        let header_at = layout.header_offset(slot) as usize;
        image[header_at..header_at + 256].copy_from_slice(&frame.as_bytes()[..256]);
    }
    image
}

fuzz_target!(|data: &[u8]| {
    let Ok(layout) = JournalLayout::new(SLOTS, SLOT_SIZE) else {
        return;
    };
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut image = valid_image(&layout);
    let damaged = !rest.is_empty();
    if mode & 1 == 0 {
        // The input is the file after the meta copies.
        let start = layout.header_ring_offset() as usize;
        let n = rest.len().min(image.len() - start);
        image[start..start + n].copy_from_slice(&rest[..n]);
    } else {
        // The input is damage: (u32 offset, u8 xor) triples.
        for chunk in rest.chunks_exact(5) {
            let offset = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) as usize % image.len();
            image[offset] ^= chunk[4];
        }
    }
    let (found, _) = decode_meta_copies(&image);
    let Some(found) = found else {
        return;
    };
    if (image.len() as u64) < found.file_size() {
        return;
    }
    let evidence = scan_image(&image, &found);
    let checkpoint = u64::from(mode >> 1) % (OPS + 2);
    let recovery = recover(&found, &evidence, checkpoint);
    assert_eq!(recovery.slots.len() as u64, found.slot_count);
    if !damaged && checkpoint <= OPS {
        assert!(recovery.is_clean(), "an undamaged journal must recover clean");
        assert_eq!(recovery.op_head, OPS);
    }
});
