//! Helpers shared by the integration tests: prepare builders and an executor.
#![allow(dead_code)]

use replication::wire::{Header, PrepareChain, PrepareHeader, METADATA_GROUP};

/// Body bytes for `op` in generation `generation` (deterministic, so a checker can
/// rebuild them).
pub fn body(op: u64, generation: u64, len: usize) -> Vec<u8> {
    let mut state = op.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ generation;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A sealed metadata-plane prepare for `op`.
pub fn prepare(op: u64, body: &[u8]) -> Vec<u8> {
    let mut header = PrepareHeader::new();
    header.op = op;
    header.commit = op.saturating_sub(1);
    header.group = METADATA_GROUP;
    header.operation = 128;
    header.client = 1;
    header.request = op;
    PrepareChain::after(u128::from(op) << 1)
        .append(&mut header, body)
        .as_bytes()
        .to_vec()
}

/// Runs `f` on a fresh glommio executor.
pub fn run<T>(f: impl std::future::Future<Output = T>) -> T {
    journal::runtime::raise_memlock(64 << 20);
    journal::runtime::block_on(f).expect("executor")
}

/// A stamped batch of `count` messages of `payload_len` bytes at `base_offset`.
pub fn batch(
    partition_id: u64,
    base_offset: u64,
    timestamp: u64,
    count: u32,
    payload_len: usize,
) -> Vec<u8> {
    use replication::wire::batch::{stamp, BatchBuilder, NewMessage};
    let mut builder = BatchBuilder::with_capacity(count as usize * (payload_len + 48));
    for i in 0..count {
        let offset = base_offset + u64::from(i);
        let payload = body(offset, partition_id, payload_len);
        builder.push(NewMessage {
            id: u128::from(offset),
            timestamp_delta: i,
            payload: &payload,
            user_headers: b"h",
        });
    }
    let mut bytes = builder.finish(timestamp);
    stamp(&mut bytes, partition_id, base_offset, timestamp).expect("stamp");
    bytes
}
