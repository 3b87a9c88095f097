//! Arbitrary bytes as an encoded client table (a checkpoint's copy, or a peer's in a
//! state transfer): decoded as given, and once more with every session's reply frame
//! resealed as a Reply, so the fuzzer also reaches the rules behind the seals (sizes,
//! the bounds on sessions and bodies, a client twice). None may panic; a table that
//! decodes encodes to bytes that decode to the same table, within the bodies' bound.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replication::vsr::{ClientTable, REPLY_BODIES_KEPT_MAX};
use replication::wire::frame::seal_in_place;
use replication::wire::{Command, HEADER_SIZE};

const CLIENTS_MAX: usize = 16;
/// Client id, session epoch, request and op before each reply frame.
const SESSION_PREFIX: usize = 16 + 8 + 8 + 8;

fn check(bytes: &[u8]) {
    let Ok(table) = ClientTable::decode(bytes, CLIENTS_MAX) else {
        return;
    };
    assert!(table.len() <= CLIENTS_MAX);
    assert!(table.reply_bodies() <= REPLY_BODIES_KEPT_MAX);
    let encoded = table.encode();
    let again = ClientTable::decode(&encoded, CLIENTS_MAX).expect("an encoded table decodes");
    assert_eq!(again.encode(), encoded);
    assert_eq!(again.reply_bodies(), table.reply_bodies());
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut bytes = data.to_vec();
    let mut at = 4;
    while at + SESSION_PREFIX + HEADER_SIZE <= bytes.len() {
        let frame = at + SESSION_PREFIX;
        let size = u32::from_le_bytes(bytes[frame + 48..frame + 52].try_into().unwrap()) as usize;
        if size < HEADER_SIZE || frame + size > bytes.len() {
            break;
        }
        bytes[frame + 60] = Command::Reply as u8;
        seal_in_place(&mut bytes[frame..frame + size]);
        at = frame + size;
    }
    check(&bytes);
});
