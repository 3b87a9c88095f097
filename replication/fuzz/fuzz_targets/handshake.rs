//! The replica handshake as a state machine fed arbitrary frames, on both sides, with
//! and without authentication. Nothing may panic, and with auth enabled nothing forged
//! may establish a link: the fuzzer does not know the secret, so any established
//! acceptor or dialer is a failure.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replication::bus::auth::{ChannelBinding, Keys};
use replication::bus::handshake::{Acceptor, AcceptorStep, Dialer, Local};
use replication::wire::{decode::split_frames, FrameBuf};

const SECRET: &[u8] = b"fuzz-target-secret-of-at-least-32-bytes";

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let auth = selector & 1 == 1;
    let local = Local { cluster: u128::from(selector >> 1), replica: 1 + (selector >> 6), replica_count: 5 };
    let keys = || auth.then(|| Keys::new(SECRET, None).expect("the secret is long enough"));
    let mut acceptor = Acceptor::new(local, keys(), ChannelBinding::Plaintext);
    let Ok((mut dialer, _hello)) = Dialer::new(Local { replica: 0, ..local }, keys(), ChannelBinding::Plaintext, local.replica) else {
        return;
    };
    for piece in split_frames(rest) {
        let buf = FrameBuf::from_bytes(piece);
        if let Ok(step) = acceptor.on_frame(buf.as_bytes()) {
            if auth {
                assert!(!matches!(step, AcceptorStep::Established { .. }), "forged frames established an authenticated link");
            }
        }
        if dialer.on_frame(buf.as_bytes()).is_ok() && auth {
            panic!("a forged challenge completed an authenticated dialer");
        }
    }
});
