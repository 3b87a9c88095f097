//! Wire benchmark: frames sealed and verified per second, batch verify throughput next
//! to raw XxHash3 over the same bytes (target: verify >= 0.85 of raw), header decode
//! cost. Run: cargo bench -p replication --bench wire [-- --quick]

use std::hint::black_box;
use std::time::{Duration, Instant};

use replication::wire::batch::{self, BatchBuilder, NewMessage};
use replication::wire::*;
use xxhash_rust::xxh3::xxh3_64;

/// Runs `f` repeatedly for about `budget` and returns (iterations, elapsed).
fn measure(budget: Duration, mut f: impl FnMut()) -> (u64, Duration) {
    for _ in 0..100 {
        f();
    }
    let start = Instant::now();
    let mut iterations = 0u64;
    while start.elapsed() < budget {
        for _ in 0..64 {
            f();
        }
        iterations += 64;
    }
    (iterations, start.elapsed())
}

fn per_second(iterations: u64, elapsed: Duration) -> f64 {
    iterations as f64 / elapsed.as_secs_f64()
}

fn batch_of(messages: u32, payload: usize) -> Vec<u8> {
    let body = vec![0x5au8; payload];
    let mut builder = BatchBuilder::with_capacity(messages as usize * (payload + 48));
    for i in 0..messages {
        builder.push(NewMessage {
            id: u128::from(i),
            timestamp_delta: i,
            payload: &body,
            user_headers: &[],
        });
    }
    let mut bytes = builder.finish(1);
    batch::stamp(&mut bytes, 1, 0, 1).expect("fresh batch stamps");
    bytes
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let budget = Duration::from_millis(if quick { 100 } else { 1500 });
    let limits = Limits::default();

    // Control frames: seal (build) and verify (decode) a Commit.
    let mut commit = CommitHeader::new();
    commit.commit = 42;
    commit.group = METADATA_GROUP;
    let (n, t) = measure(budget, || {
        black_box(Frame::build(black_box(&commit), &[]));
    });
    let sealed_commit = per_second(n, t);
    let frame = Frame::build(&commit, &[]);
    let (n, t) = measure(budget, || {
        black_box(decode(black_box(frame.as_bytes()), &limits).is_ok());
    });
    let verified_commit = per_second(n, t);

    // Metadata prepares with a 4 KiB body: identity + body seal.
    let mut prepare = PrepareHeader::new();
    prepare.op = 1;
    prepare.operation = Operation::CreateStream as u8;
    prepare.group = METADATA_GROUP;
    let body = vec![7u8; 4096];
    let (n, t) = measure(budget, || {
        black_box(Frame::build(black_box(&prepare), &body));
    });
    let sealed_prepare = per_second(n, t);
    let prepare_frame = Frame::build(&prepare, &body);
    let (n, t) = measure(budget, || {
        black_box(decode(black_box(prepare_frame.as_bytes()), &limits).is_ok());
    });
    let verified_prepare = per_second(n, t);

    // Header-only decode cost (check_header alone and full decode of a Commit).
    let head = FrameBuf::from_bytes(&frame.as_bytes()[..HEADER_SIZE]);
    let (n, t) = measure(budget, || {
        black_box(check_header(black_box(head.as_bytes()), &limits).is_ok());
    });
    let check_ns = t.as_nanos() as f64 / n as f64;
    let decode_ns = 1e9 / verified_commit;

    // Batch verify vs raw XxHash3 over the same bytes, for 1 KiB and 4 KiB messages.
    // Also printed: XxHash3 called once per message frame, the floor the format sets
    // (every message carries its own checksum, so verify cannot hash in one pass).
    let rounds = if quick { 20 } else { 600 };
    let batch_rows: Vec<(usize, f64, f64, f64)> = [1024usize, 4096]
        .into_iter()
        .map(|payload| {
            let count = (1 << 20) / payload as u32;
            let aligned = FrameBuf::from_bytes(&batch_of(count, payload));
            let bytes = aligned.as_bytes();
            let frames: Vec<&[u8]> = bytes[256..].chunks(payload + 48).collect();
            let (mut raw, mut floor, mut verify) = (f64::MAX, f64::MAX, f64::MAX);
            // Interleaved so all three see the same cache and frequency conditions.
            for _ in 0..5 {
                let start = Instant::now();
                for _ in 0..rounds / 5 {
                    black_box(xxh3_64(black_box(bytes)));
                }
                raw = raw.min(start.elapsed().as_secs_f64());
                let start = Instant::now();
                for _ in 0..rounds / 5 {
                    for frame in &frames {
                        black_box(xxh3_64(black_box(&frame[8..])));
                    }
                }
                floor = floor.min(start.elapsed().as_secs_f64());
                let start = Instant::now();
                for _ in 0..rounds / 5 {
                    black_box(batch::verify(black_box(bytes)).is_ok());
                }
                verify = verify.min(start.elapsed().as_secs_f64());
            }
            let gb = (bytes.len() * (rounds / 5)) as f64 / 1e9;
            (payload, gb / raw, gb / floor, gb / verify)
        })
        .collect();

    println!(
        "wire benchmark ({} mode)",
        if quick { "quick" } else { "full" }
    );
    println!("  Commit frames sealed/s           {:>14.0}", sealed_commit);
    println!(
        "  Commit frames verified/s         {:>14.0}",
        verified_commit
    );
    println!(
        "  Prepare 4 KiB sealed/s           {:>14.0}",
        sealed_prepare
    );
    println!(
        "  Prepare 4 KiB verified/s         {:>14.0}",
        verified_prepare
    );
    println!("  check_header ns/header           {:>14.1}", check_ns);
    println!("  decode (Commit, seal incl.) ns   {:>14.1}", decode_ns);
    for (payload, raw, floor, verify) in batch_rows {
        println!("  batch of 1 MiB, {:>4} B messages:", payload);
        println!("    raw XxHash3, one pass GB/s     {:>14.2}", raw);
        println!("    XxHash3 per message GB/s       {:>14.2}", floor);
        println!("    batch verify GB/s              {:>14.2}", verify);
        println!(
            "    verify / raw one pass          {:>14.3}  (target >= 0.85)",
            verify / raw
        );
        println!(
            "    verify / per-message hashing   {:>14.3}",
            verify / floor
        );
    }
}
