//! Message ids and payloads derived from `--seed` and a message's global index, so that
//! `consume --verify` can re-derive every message from its id alone.
//!
//! - tag(seed) = XxHash3-64 of the bytes `appliance-cli message id` with `seed` as the
//!   hash seed.
//! - id(seed, index) = tag(seed) << 64 | index: the high 64 bits name the seed, the low
//!   64 bits are the message's index (0, 1, 2 ... over a whole produce run, across
//!   batches and partitions, starting at --start-index).
//! - payload(seed, index, len): `len` bytes of a SplitMix64 stream whose state starts at
//!   XxHash3-64 of `index LE u64 ‖ len LE u64` with `seed` as the hash seed; each step's
//!   output is written little-endian, the last one cut to fit. Folding `len` in means a
//!   shortened payload does not match a prefix of the full one.

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

/// Writes the payload of message `index` of a run with `seed` into `out` (its length is
/// the payload length).
pub fn fill_payload(seed: u64, index: u64, out: &mut [u8]) {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&index.to_le_bytes());
    key[8..].copy_from_slice(&(out.len() as u64).to_le_bytes());
    let mut state = xxh3_64_with_seed(&key, seed);
    for chunk in out.chunks_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
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
    }
}
