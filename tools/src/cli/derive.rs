//! Message ids and payloads derived from `--seed` and a message's global index, so that
//! `consume --verify` can re-derive every message from its id alone.
//!
//! - tag(seed) = XxHash3-64 of the bytes `appliance-cli message id` with `seed` as the
//!   hash seed.
//! - id(seed, index) = tag(seed) << 64 | index: the high 64 bits name the seed, the low
//!   64 bits are the message's index (0, 1, 2 ... over a whole produce run, across
//!   batches and partitions, starting at --start-index).
//! - block(seed, len): `len` bytes of a SplitMix64 stream whose state starts at XxHash3-64
//!   of `len LE u64` with `seed` as the hash seed; each step's output is written
//!   little-endian, the last one cut to fit. Folding `len` in means a shortened payload
//!   does not match a prefix of the full one.
//! - payload(seed, index, len): block(seed, len) rotated left by XxHash3-64 of
//!   `index LE u64` (seed `seed`) modulo `len`, then its first bytes XORed with
//!   `index LE u64`. Each payload costs two copies of a cached block, not a PRNG step per
//!   8 bytes: the bench's producers build hundreds of megabytes a second on the cores the
//!   nodes they measure run on.

use xxhash_rust::xxh3::xxh3_64_with_seed;

const ID_DOMAIN: &[u8] = b"appliance-cli message id";

/// The high 64 bits of every id produced with `seed`.
pub fn tag(seed: u64) -> u64 {
    xxh3_64_with_seed(ID_DOMAIN, seed)
}

/// The id of message `index` of a run with `seed`.
pub fn message_id(seed: u64, index: u64) -> u128 {
    u128::from(tag(seed)) << 64 | u128::from(index)
}

/// Splits an id into (tag, index).
pub fn split_id(id: u128) -> (u64, u64) {
    ((id >> 64) as u64, id as u64)
}

/// Blocks kept per thread, by (seed, len): a run uses one or a few payload lengths.
const BLOCKS_KEPT: usize = 4;

/// A cached block: (seed, len, bytes).
type Block = (u64, usize, std::rc::Rc<[u8]>);

thread_local! {
    static BLOCKS: std::cell::RefCell<Vec<Block>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// block(seed, len), from the thread's cache.
fn block(seed: u64, len: usize) -> std::rc::Rc<[u8]> {
    BLOCKS.with_borrow_mut(|blocks| {
        if let Some((_, _, block)) = blocks.iter().find(|(s, l, _)| *s == seed && *l == len) {
            return block.clone();
        }
        let mut out = vec![0u8; len];
        let mut state = xxh3_64_with_seed(&(len as u64).to_le_bytes(), seed);
        for chunk in out.chunks_mut(8) {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
        let block: std::rc::Rc<[u8]> = out.into();
        if blocks.len() >= BLOCKS_KEPT {
            blocks.remove(0);
        }
        blocks.push((seed, len, block.clone()));
        block
    })
}

/// Writes the payload of message `index` of a run with `seed` into `out` (its length is
/// the payload length).
pub fn fill_payload(seed: u64, index: u64, out: &mut [u8]) {
    let len = out.len();
    if len == 0 {
        return;
    }
    let block = block(seed, len);
    let turn = (xxh3_64_with_seed(&index.to_le_bytes(), seed) % len as u64) as usize;
    out[..len - turn].copy_from_slice(&block[turn..]);
    out[len - turn..].copy_from_slice(&block[..turn]);
    for (byte, mask) in out.iter_mut().zip(index.to_le_bytes()) {
        *byte ^= mask;
    }
}

/// The payload of message `index` of a run with `seed`, `len` bytes long.
pub fn payload(seed: u64, index: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    fill_payload(seed, index, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_seed_tag_and_the_index() {
        let id = message_id(7, 42);
        assert_eq!(split_id(id), (tag(7), 42));
        assert_ne!(tag(7), tag(8));
    }

    #[test]
    fn payloads_are_deterministic_and_depend_on_seed_index_and_length() {
        assert_eq!(payload(1, 2, 100), payload(1, 2, 100));
        assert_ne!(payload(1, 2, 100), payload(1, 3, 100));
        assert_ne!(payload(1, 2, 100), payload(2, 2, 100));
        assert_ne!(payload(1, 2, 100)[..50], payload(1, 2, 50)[..]);
        assert!(payload(1, 2, 0).is_empty());
        assert_eq!(payload(1, 2, 13).len(), 13);
        // Payloads shorter than the index's 8 bytes still differ by index.
        assert_ne!(payload(1, 2, 3), payload(1, 3, 3));
    }

    #[test]
    fn payloads_of_neighbouring_indexes_are_all_distinct() {
        let all: std::collections::HashSet<Vec<u8>> =
            (0..5000).map(|index| payload(9, index, 1024)).collect();
        assert_eq!(all.len(), 5000);
        // A cached block serves many lengths in turn and comes back the same.
        let first = payload(9, 77, 1024);
        for len in [10, 100, 1000, 2000, 4000, 5000] {
            assert_eq!(payload(9, 1, len).len(), len);
        }
        assert_eq!(payload(9, 77, 1024), first);
    }
}
