//! The official Apache Iggy SDK's producer against appliance-cli's, on the same node in
//! the same run: one node on loopback, a topic per client, the same producers,
//! partitions, message size and batch, flat out for the same time. Prints both
//! throughputs and ack latencies side by side.
//!
//!     cargo bench -p appliance --bench sdk_produce [-- --short | --seconds N] [--sdk-first]
//!
//! `--short` (CI) runs two seconds per client and only fails on an error; the figures
//! in docs/benchmarks.md come from a full run on a quiet machine.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/sdk.rs"]
mod sdk;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use iggy::prelude::{
    Client as _, Identifier, MessageClient, Partitioning, StreamClient, TopicClient,
    TopicCreateOptions, UserClient,
};
use sdk::*;

const PRODUCERS: u32 = 4;
const PARTITIONS: u32 = 4;
const SIZE: usize = 1024;
const BATCH: u32 = 1000;
const WARMUP: Duration = Duration::from_secs(1);

/// What one client reached: MB/s of payload and ack latency percentiles (ms).
struct Figures {
    mb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    sorted[((last as f64) * q).round() as usize].as_secs_f64() * 1e3
}

/// The SDK: one IggyClient per producer, each sending batches to its own partition.
fn sdk_produce(files: &ClusterFiles, measured: Duration) -> Figures {
    runtime().block_on(async {
        let admin = root_client(files, 0).await;
        admin.create_stream("sdk-bench").await.expect("stream");
        let stream = Identifier::named("sdk-bench").expect("name");
        let options = TopicCreateOptions {
            partitions_count: Some(PARTITIONS),
            ..Default::default()
        };
        admin
            .create_topic(&stream, "t", &options)
            .await
            .expect("topic");
        let start = Instant::now();
        let tasks: Vec<_> = (0..PRODUCERS)
            .map(|producer| {
                let client = node_client(files, 0);
                tokio::spawn(async move {
                    client.connect().await.expect("connect");
                    client
                        .login_user("root", ROOT_PASSWORD)
                        .await
                        .expect("login");
                    let stream = Identifier::named("sdk-bench").expect("name");
                    let topic = Identifier::named("t").expect("name");
                    let partitioning = Partitioning::partition_id(producer % PARTITIONS);
                    let payload = Bytes::from(vec![b'x'; SIZE]);
                    let (mut sent, mut latencies) = (0u64, Vec::new());
                    while start.elapsed() < WARMUP + measured {
                        let mut batch = repeated(&payload, BATCH);
                        let at = Instant::now();
                        client
                            .send_messages(&stream, &topic, &partitioning, &mut batch)
                            .await
                            .expect("send");
                        if start.elapsed() > WARMUP {
                            sent += u64::from(BATCH);
                            latencies.push(at.elapsed());
                        }
                    }
                    (sent, latencies)
                })
            })
            .collect();
        let (mut sent, mut latencies) = (0u64, Vec::new());
        for task in tasks {
            let (n, l) = task.await.expect("producer");
            sent += n;
            latencies.extend(l);
        }
        latencies.sort_unstable();
        Figures {
            mb_per_s: (sent * SIZE as u64) as f64 / measured.as_secs_f64() / 1e6,
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
        }
    })
}

/// appliance-cli bench produce with the same settings.
fn cli_produce(files: &ClusterFiles, measured: Duration) -> Figures {
    let output = std::process::Command::new(cli_binary())
        .args(["--server", &files.client_addr(0).to_string(), "--json"])
        .args(["bench", "produce", "--stream", "cli-bench", "--topic", "t"])
        .args(["--producers", &PRODUCERS.to_string()])
        .args(["--partitions", &PARTITIONS.to_string()])
        .args(["--size", &SIZE.to_string(), "--batch", &BATCH.to_string()])
        .args(["--duration", &format!("{}s", measured.as_secs())])
        .args(["--warmup", &format!("{}ms", WARMUP.as_millis())])
        .env("APPLIANCE_PASSWORD", ROOT_PASSWORD)
        .output()
        .expect("run appliance-cli");
    assert!(output.status.success(), "appliance-cli: {output:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("appliance-cli --json output");
    let us = |q: &str| json["latency_us"][q].as_f64().unwrap_or(0.0) / 1e3;
    Figures {
        mb_per_s: json["mb_per_s"].as_f64().expect("mb_per_s"),
        p50_ms: us("p50"),
        p99_ms: us("p99"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let short = args.iter().any(|a| a == "--short");
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if short { 2 } else { 10 });
    let measured = Duration::from_secs(seconds);
    let files = ClusterFiles::new(1);
    // The harness's test limits are small; a batch of 1,000 1 KiB messages needs the
    // defaults back.
    let defaults = [
        ("APPLIANCE_MESSAGE_BUS__MAX_MESSAGE_SIZE", "8 MiB"),
        ("APPLIANCE_STORAGE__SEGMENT_SIZE", "64 MiB"),
        ("APPLIANCE_LIMITS__REQUEST_BODY_MAX", "4 MiB"),
    ];
    let mut daemon = Daemon::start_with_env(&files, 0, &defaults);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    // `--sdk-first` swaps the order, to see what running second is worth.
    let (cli, sdk) = if args.iter().any(|a| a == "--sdk-first") {
        let sdk = sdk_produce(&files, measured);
        (cli_produce(&files, measured), sdk)
    } else {
        let cli = cli_produce(&files, measured);
        (cli, sdk_produce(&files, measured))
    };
    println!(
        "produce, one node, {PRODUCERS} producers on {PARTITIONS} partitions, {SIZE}-byte \
         messages in batches of {BATCH}, {seconds} s each, same node and run:"
    );
    for (client, figures) in [("appliance-cli", &cli), ("iggy SDK 0.11.0", &sdk)] {
        println!(
            "  {client:<16} {:>8.1} MB/s   ack p50 {:>7.2} ms   p99 {:>7.2} ms",
            figures.mb_per_s, figures.p50_ms, figures.p99_ms
        );
    }
    println!("  SDK / appliance-cli: {:.2}", sdk.mb_per_s / cli.mb_per_s);
    assert!(sdk.mb_per_s > 0.0 && cli.mb_per_s > 0.0, "both produced");
    let _ = daemon.terminate(Duration::from_secs(20));
}
