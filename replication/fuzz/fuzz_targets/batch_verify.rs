//! Arbitrary bytes as a message batch: verify, iterate, and the backup's stamp check.
//! None may panic, and a batch that verifies iterates exactly message_count messages.
#![no_main]

use libfuzzer_sys::fuzz_target;
use replication::wire::batch::{self, PartitionPosition};

fuzz_target!(|data: &[u8]| {
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
    let mut copy = data.to_vec();
    let _ = batch::stamp(&mut copy, 1, 2, 3);
});
