//! Arbitrary bytes as a message batch: verify, iterate, and the backup's stamp check.
//! Each input is checked as given and once more after its message checksums, length
//! and batch checksum are recomputed, so the fuzzer also reaches the rules behind them.
//! None may panic, and a batch that verifies iterates exactly message_count messages.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replication::wire::batch::{self, PartitionPosition};
use xxhash_rust::xxh3::xxh3_64;

fn u32_at(data: &[u8], at: usize) -> usize {
    u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]) as usize
}

/// Recomputes what the fuzzer cannot forge: message checksums, batch_length, and the
/// batch checksum (through the real `stamp`, keeping the stamp fields).
fn reseal(data: &mut [u8]) {
    if data.len() < 256 {
        return;
    }
    let count = u32_at(data, 48);
    let mut at = 256;
    for _ in 0..count {
        if at + 48 > data.len() {
            break;
        }
        let end = at + 48 + u32_at(data, at + 36) + u32_at(data, at + 32);
        if end > data.len() {
            break;
        }
        let checksum = xxh3_64(&data[at + 8..end]);
        data[at..at + 8].copy_from_slice(&checksum.to_le_bytes());
        at = end;
    }
    let len = data.len() as u64;
    data[32..40].copy_from_slice(&len.to_le_bytes());
    let field = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().unwrap_or([0; 8]));
    let (partition, base, timestamp) = (field(0), field(8), field(16));
    let _ = batch::stamp(data, partition, base, timestamp);
}

fn check(data: &[u8]) {
    if let Ok(info) = batch::verify(data) {
        let count = batch::messages(data).count();
        assert_eq!(count as u64, u64::from(info.message_count));
        let position = PartitionPosition {
            partition_id: info.partition_id,
            next_offset: info.base_offset,
            last_timestamp: info.base_timestamp,
        };
        assert!(batch::check_stamp(data, &position).is_ok());
    } else {
        let _ = batch::messages(data).count();
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut copy = data.to_vec();
    reseal(&mut copy);
    check(&copy);
});
