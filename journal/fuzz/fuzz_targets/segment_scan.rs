//! The segment recovery scan over arbitrary file contents, and over damage applied to a
//! segment of real stamped batches. Nothing may panic; what the scan keeps lies within
//! the image, is contiguous in offsets, and every kept batch verifies.
#![no_main]

use journal::segment::scan_segment;
use libfuzzer_sys::fuzz_target;
use replication::wire::batch::{self, BatchBuilder, NewMessage};

fn valid_segment() -> Vec<u8> {
    let mut image = Vec::new();
    let mut offset = 100;
    for b in 0..4u32 {
        let mut builder = BatchBuilder::with_capacity(1024);
        for i in 0..3u32 {
            builder.push(NewMessage { id: u128::from(b * 10 + i), timestamp_delta: i, payload: &[b as u8; 40], user_headers: &[] });
        }
        let mut bytes = builder.finish(1_000);
        batch::stamp(&mut bytes, 7, offset, 2_000 + u64::from(b)).expect("fresh batch stamps");
        offset += 3;
        image.extend_from_slice(&bytes);
    }
    image
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let image = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut image = valid_segment();
        for chunk in rest.chunks_exact(3) {
            let offset = u16::from_le_bytes([chunk[0], chunk[1]]) as usize % image.len();
            image[offset] ^= chunk[2];
        }
        if mode & 2 == 2 {
            let cut = usize::from(mode) * 7 % image.len();
            image.truncate(cut);
        }
        image
    };
    let scan = scan_segment(&image, 7, 100);
    assert!(scan.valid_len as usize <= image.len());
    let mut next = 100;
    for entry in &scan.batches {
        assert_eq!(entry.base_offset, next, "kept batches are contiguous");
        next = entry.next_offset();
        let start = entry.position as usize;
        let bytes = &image[start..start + entry.len as usize];
        assert!(batch::verify(bytes).is_ok(), "a kept batch verifies");
    }
    if mode & 3 == 1 && rest.len() < 3 {
        assert_eq!(scan.batches.len(), 4, "an undamaged segment keeps every batch");
    }
});
