//! Writes the seed corpora of the wire fuzz targets: one valid frame of each common
//! shape and a few message batches, so the fuzzers start past the first checks.
//! Usage: cargo run -p replication --example wire_fuzz_seeds -- replication/fuzz/corpus

use std::path::Path;

use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::*;

fn batch(messages: u32) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(4096);
    for i in 0..messages {
        builder.push(NewMessage {
            id: u128::from(i),
            timestamp_delta: i,
            payload: &[i as u8; 24],
            user_headers: b"k=v",
        });
    }
    let mut bytes = builder.finish(1);
    batch::stamp(&mut bytes, 7, 0, 2).expect("a freshly built batch stamps");
    bytes
}

/// Client tables as checkpoints hold them: empty, sessions with small replies (one
/// waiting for its result), and one reply with a large body.
fn client_tables() -> Vec<(&'static str, replication::vsr::ClientTable)> {
    use replication::vsr::ClientTable;
    let reply = |op: u64, body: &[u8]| {
        let mut header = ReplyHeader::new();
        header.op = op;
        header.client = 7;
        Frame::build(&header, body)
    };
    let mut small = ClientTable::new(16);
    small.register(7, 10, reply(10, b""));
    small.apply(7, 10, reply(10, b"registered"));
    small.commit(7, 1, 11, reply(11, b""));
    small.commit_request(9, 5, 12, reply(12, b""));
    small.apply(9, 12, reply(12, &[3; 40]));
    let mut large = ClientTable::new(16);
    large.register(7, 10, reply(10, b""));
    large.commit(7, 1, 11, reply(11, b""));
    large.apply(7, 11, reply(11, &[5; 9000]));
    vec![
        ("empty", ClientTable::new(16)),
        ("small", small),
        ("large_body", large),
    ]
}

fn main() -> std::io::Result<()> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "replication/fuzz/corpus".into());
    let out = Path::new(&out);
    let cluster = cluster_id("appliance");
    let group = PartitionKey {
        stream: 1,
        topic: 1,
        partition: 1,
    }
    .pack()
    .expect("1/1/1 fits the key");

    let mut frames: Vec<(&str, Frame)> = Vec::new();
    let mut prepare = PrepareHeader::new();
    prepare.frame.cluster = cluster;
    prepare.op = 1;
    prepare.operation = Operation::CreateStream as u8;
    prepare.group = METADATA_GROUP;
    let mut chain = PrepareChain::after(0);
    let first = chain.append(&mut prepare, b"{\"name\":\"s\"}");
    frames.push(("prepare_metadata", first.clone()));
    frames.push(("repair_prepare", Frame::repair_of(first.as_bytes())));
    let mut send = prepare;
    send.op = 2;
    send.operation = Operation::SendMessages as u8;
    send.group = group;
    frames.push(("prepare_partition", chain.append(&mut send, &batch(3))));

    let mut commit = CommitHeader::new();
    commit.frame.cluster = cluster;
    commit.commit = 1;
    commit.group = METADATA_GROUP;
    frames.push(("commit", Frame::build(&commit, &[])));

    let mut dvc = DoViewChangeHeader::new();
    dvc.frame.cluster = cluster;
    dvc.frame.view = 2;
    dvc.op = 1;
    dvc.group = METADATA_GROUP;
    dvc.present_bitset = 1;
    frames.push((
        "do_view_change",
        Frame::build(&dvc, &first.as_bytes()[..HEADER_SIZE]),
    ));

    let mut repair = RequestPreparesHeader::new();
    repair.nonce = 9;
    repair.from_op = 1;
    repair.to_op = 4;
    repair.group = METADATA_GROUP;
    frames.push(("request_prepares", Frame::build(&repair, &[])));

    let mut request = RequestHeader::new();
    request.client = 5;
    request.operation = Operation::Register as u8;
    frames.push(("request_register", Frame::build(&request, &[])));

    let mut hello = ReplicaHelloHeader::new();
    hello.frame.cluster = cluster;
    hello.nonce_d = [3; 32];
    frames.push(("replica_hello", Frame::build(&hello, &[])));

    let mut result = ForwardRegisterResultHeader::new();
    result.nonce = 1;
    result.client = 5;
    result.epoch = 1;
    frames.push(("forward_register_result", Frame::build(&result, &[])));

    let decode_dir = out.join("frame_decode");
    std::fs::create_dir_all(&decode_dir)?;
    let mut stream = Vec::new();
    for (name, frame) in &frames {
        std::fs::write(decode_dir.join(name), frame.as_bytes())?;
        stream.extend_from_slice(frame.as_bytes());
    }
    std::fs::write(decode_dir.join("stream_of_frames"), &stream)?;

    let batch_dir = out.join("batch_verify");
    std::fs::create_dir_all(&batch_dir)?;
    for count in [1, 2, 5] {
        std::fs::write(batch_dir.join(format!("batch_{count}")), batch(count))?;
    }

    let table_dir = out.join("client_table_decode");
    std::fs::create_dir_all(&table_dir)?;
    for (name, table) in client_tables() {
        std::fs::write(table_dir.join(name), table.encode())?;
    }
    println!(
        "wrote {} frame seeds, 3 batch seeds and 3 client tables under {}",
        frames.len() + 1,
        out.display()
    );
    Ok(())
}
