//! Arbitrary bytes through every frame entry point: header check, full decode, the
//! plane gates and the frame splitter. Each piece is decoded as given and once more
//! after resealing, so the fuzzer also reaches the field rules behind the seals.
//! None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replication::wire::{self, decode::split_frames, frame::seal_in_place, FrameBuf, Limits};

fn check(buf: &FrameBuf, limits: &Limits) {
    let header = wire::check_header(buf.as_bytes(), limits);
    match wire::decode(buf.as_bytes(), limits) {
        Ok(message) => {
            // A frame that decodes also passes the header check with the same command.
            let info = header.expect("decode accepted a frame check_header refused");
            assert_eq!(info.command, message.command());
            let _ = wire::replica_plane_admit(false, info.command as u8);
            let _ = wire::client_plane_admit(info.command as u8);
            let _ = wire::decode::group_of(&message);
            let _ = message.header_fields().reserved_nonzero_at();
        }
        Err(error) => {
            let _ = error.reason();
            let _ = error.to_string();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let limits = Limits { max_message_size: 1 << 20 };
    for piece in split_frames(data) {
        let mut buf = FrameBuf::from_bytes(piece);
        check(&buf, &limits);
        if buf.len() >= 256 {
            seal_in_place(buf.as_bytes_mut());
            check(&buf, &limits);
        }
    }
});
