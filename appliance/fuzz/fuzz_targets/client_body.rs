//! Every client operation body decoder and every prepared metadata body decoder, fed
//! arbitrary bytes. None may panic; a body that decodes re-encodes to bytes that decode
//! to the same request.
#![no_main]

use appliance::protocol::ClientRequest;
use appliance::state::MetadataOp;
use libfuzzer_sys::fuzz_target;
use replication::wire::Operation;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let operation = Operation::ALL[usize::from(selector) % Operation::ALL.len()];
    // The read codes the client port serves (ReadCommand).
    const READS: [u32; 12] = [1, 2, 3, 4, 5, 6, 12, 38, 200, 201, 300, 301];
    let read_command = READS[usize::from(selector >> 4) % READS.len()];
    if let Ok(request) = ClientRequest::decode(operation, read_command, body) {
        let (op, read) = request.operation();
        let encoded = request.encode();
        let again = ClientRequest::decode(op, read, &encoded).expect("re-encoded request decodes");
        assert_eq!(again, request);
    }
    if let Ok(op) = MetadataOp::decode(operation, body) {
        let again = MetadataOp::decode(op.operation(), &op.encode()).expect("re-encoded op decodes");
        assert_eq!(again, op);
    }
});
