//! The official Apache Iggy SDK's producer against appliance-cli's, on the same node in
//! the same run: one node on loopback, a topic per client, the same producers,
//! partitions, message size and batch, flat out for the same time. Prints both
//! throughputs and ack latencies side by side. Then the SDK's producer over plaintext
//! and over client TLS (`[tcp.tls]`, a second node), interleaved, with the node's CPU
//! seconds per GB from /proc.
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
    Client as _, Identifier, IggyClient, MaxTopicSize, MessageClient, Partitioning, StreamClient,
    TopicClient, TopicCreateOptions, UserClient,
};
use sdk::*;

const PRODUCERS: u32 = 4;
const PARTITIONS: u32 = 4;
const SIZE: usize = 1024;
const BATCH: u32 = 1000;
const WARMUP: Duration = Duration::from_secs(1);

/// What one client reached: MB/s of payload and ack latency percentiles (ms); for the
/// SDK also the payload bytes acknowledged over the whole run, warm-up included.
struct Figures {
    mb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    bytes_total: u64,
}

/// CPU seconds (user + system) the process `pid` has used so far, from /proc.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name's ")": state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    // SAFETY: sysconf reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks / per_second
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return 0.0;
    };
    sorted[((last as f64) * q).round() as usize].as_secs_f64() * 1e3
}

/// The SDK: one IggyClient per producer (made by `client`), each sending batches to its
/// own partition of a new topic in stream `stream_name`.
fn sdk_produce(
    client: &(dyn Fn() -> IggyClient + Sync),
    stream_name: &str,
    measured: Duration,
) -> Figures {
    runtime().block_on(async {
        let admin = client();
        admin.connect().await.expect("connect");
        admin
            .login_user("root", ROOT_PASSWORD)
            .await
            .expect("login");
        admin.create_stream(stream_name).await.expect("stream");
        let stream = Identifier::named(stream_name).expect("name");
        // Retention keeps what a round writes at disk speed within 2 GiB per topic.
        let options = TopicCreateOptions {
            partitions_count: Some(PARTITIONS),
            max_topic_size: Some(MaxTopicSize::from(2u64 << 30)),
            ..Default::default()
        };
        admin
            .create_topic(&stream, "t", &options)
            .await
            .expect("topic");
        let start = Instant::now();
        let tasks: Vec<_> = (0..PRODUCERS)
            .map(|producer| {
                let client = client();
                let stream = stream.clone();
                tokio::spawn(async move {
                    client.connect().await.expect("connect");
                    client
                        .login_user("root", ROOT_PASSWORD)
                        .await
                        .expect("login");
                    let topic = Identifier::named("t").expect("name");
                    let partitioning = Partitioning::partition_id(producer % PARTITIONS);
                    let payload = Bytes::from(vec![b'x'; SIZE]);
                    let (mut sent, mut all, mut latencies) = (0u64, 0u64, Vec::new());
                    while start.elapsed() < WARMUP + measured {
                        let mut batch = repeated(&payload, BATCH);
                        let at = Instant::now();
                        client
                            .send_messages(&stream, &topic, &partitioning, &mut batch)
                            .await
                            .expect("send");
                        all += u64::from(BATCH);
                        if start.elapsed() > WARMUP {
                            sent += u64::from(BATCH);
                            latencies.push(at.elapsed());
                        }
                    }
                    (sent, all, latencies)
                })
            })
            .collect();
        let (mut sent, mut all, mut latencies) = (0u64, 0u64, Vec::new());
        for task in tasks {
            let (n, a, l) = task.await.expect("producer");
            sent += n;
            all += a;
            latencies.extend(l);
        }
        latencies.sort_unstable();
        Figures {
            mb_per_s: (sent * SIZE as u64) as f64 / measured.as_secs_f64() / 1e6,
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            bytes_total: all * SIZE as u64,
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
        bytes_total: 0,
    }
}

/// One round of the TLS comparison: throughput, ack latency, and CPU seconds per GB
/// acknowledged of the node and of the producers (this process).
struct Round {
    mb_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    node_cpu_per_gb: f64,
    client_cpu_per_gb: f64,
}

/// The node settings a batch of 1,000 1 KiB messages needs (the harness's test limits
/// are small).
const DEFAULTS: [(&str, &str); 3] = [
    ("APPLIANCE_MESSAGE_BUS__MAX_MESSAGE_SIZE", "8 MiB"),
    ("APPLIANCE_STORAGE__SEGMENT_SIZE", "64 MiB"),
    ("APPLIANCE_LIMITS__REQUEST_BODY_MAX", "4 MiB"),
];

/// The SDK's producer over plaintext and over TLS, on two nodes of the same settings
/// (one with `[tcp.tls]`), `rounds` times each, interleaved; prints throughput, ack
/// latency and each node's CPU seconds per GB acknowledged.
fn tls_against_plaintext(measured: Duration, rounds: usize) {
    let plain_files = ClusterFiles::new(1);
    let tls_files = ClusterFiles::new(1);
    let pki = TestPki::new("bench ca");
    let leaf = pki.leaf(tls_files.dir.path(), "node0", &["localhost"]);
    tls_files.append_config(0, &leaf.client_tls_table());
    let mut plain_node = Daemon::start_with_env(&plain_files, 0, &DEFAULTS);
    let mut tls_node = Daemon::start_with_env(&tls_files, 0, &DEFAULTS);
    wait_healthy(&plain_files, &mut plain_node, Duration::from_secs(60));
    wait_healthy(&tls_files, &mut tls_node, Duration::from_secs(60));
    let plain_addr = plain_files.client_addr(0).to_string();
    let tls_addr = tls_files.client_addr(0).to_string();
    let ca = leaf.ca.display().to_string();
    // The SDK's default leaves Nagle's algorithm on; with TLS the last record of a batch
    // then waits for the node's delayed ACK. Both settings are measured.
    let client = |tls: bool, nodelay: bool| {
        let (plain_addr, tls_addr, ca) = (plain_addr.clone(), tls_addr.clone(), ca.clone());
        move || {
            let mut builder = IggyClient::builder().with_tcp();
            builder = if tls {
                builder
                    .with_server_address(tls_addr.clone())
                    .with_tls_enabled(true)
                    .with_tls_domain("localhost".to_string())
                    .with_tls_ca_file(ca.clone())
            } else {
                builder.with_server_address(plain_addr.clone())
            };
            if nodelay {
                builder = builder.with_no_delay();
            }
            builder.build().expect("client")
        }
    };
    let variants = [
        ("plaintext", false, false),
        ("TLS 1.3", true, false),
        ("plaintext, nodelay", false, true),
        ("TLS 1.3, nodelay", true, true),
    ];
    let mut results: Vec<Vec<Round>> = variants.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (index, (_, tls, nodelay)) in variants.iter().enumerate() {
            let pid = if *tls {
                tls_node.pid()
            } else {
                plain_node.pid()
            };
            let own = std::process::id() as i32;
            let (node_before, client_before) = (cpu_seconds(pid), cpu_seconds(own));
            let make = client(*tls, *nodelay);
            let figures = sdk_produce(&make, &format!("tls-bench-{round}-{index}"), measured);
            let gb = figures.bytes_total.max(1) as f64 / 1e9;
            let node = (cpu_seconds(pid) - node_before) / gb;
            let clients = (cpu_seconds(own) - client_before) / gb;
            results[index].push(Round {
                mb_per_s: figures.mb_per_s,
                p50_ms: figures.p50_ms,
                p99_ms: figures.p99_ms,
                node_cpu_per_gb: node,
                client_cpu_per_gb: clients,
            });
        }
    }
    println!(
        "\nclient TLS: the iggy SDK's producer, {PRODUCERS} producers on {PARTITIONS} \
         partitions, {SIZE}-byte messages in batches of {BATCH}, {} s each, {rounds} \
         round(s) interleaved, two nodes of the same settings in one run (nodelay: the \
         SDK's with_no_delay):",
        measured.as_secs()
    );
    let median = |values: Vec<f64>| {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let mut medians = Vec::new();
    for ((name, _, _), rows) in variants.iter().zip(&results) {
        for r in rows {
            println!(
                "  {name:<19} {:>7.1} MB/s   ack p50 {:>6.2} ms   p99 {:>6.2} ms   CPU-s per \
                 GB: node {:>4.2}, SDK clients {:>4.2}",
                r.mb_per_s, r.p50_ms, r.p99_ms, r.node_cpu_per_gb, r.client_cpu_per_gb
            );
        }
        medians.push((
            median(rows.iter().map(|r| r.mb_per_s).collect()),
            median(rows.iter().map(|r| r.node_cpu_per_gb).collect()),
            median(rows.iter().map(|r| r.client_cpu_per_gb).collect()),
        ));
    }
    for (what, plain, tls) in [("SDK defaults", 0, 1), ("nodelay", 2, 3)] {
        println!(
            "  TLS / plaintext, {what} (medians): throughput {:.2}, node CPU per GB {:.2}, \
             SDK clients' CPU per GB {:.2}",
            medians[tls].0 / medians[plain].0,
            medians[tls].1 / medians[plain].1,
            medians[tls].2 / medians[plain].2
        );
    }
    assert!(
        results.iter().flatten().all(|r| r.mb_per_s > 0.0),
        "every round produced"
    );
    let _ = plain_node.terminate(Duration::from_secs(20));
    let _ = tls_node.terminate(Duration::from_secs(20));
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
    let mut daemon = Daemon::start_with_env(&files, 0, &DEFAULTS);
    wait_healthy(&files, &mut daemon, Duration::from_secs(60));
    let addr = files.client_addr(0).to_string();
    let sdk_client = move || {
        IggyClient::builder()
            .with_tcp()
            .with_server_address(addr.clone())
            .build()
            .expect("client")
    };
    // `--sdk-first` swaps the order, to see what running second is worth.
    let (cli, sdk) = if args.iter().any(|a| a == "--sdk-first") {
        let sdk = sdk_produce(&sdk_client, "sdk-bench", measured);
        (cli_produce(&files, measured), sdk)
    } else {
        let cli = cli_produce(&files, measured);
        (cli, sdk_produce(&sdk_client, "sdk-bench", measured))
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
    drop(files);
    tls_against_plaintext(measured, if short { 1 } else { 3 });
}
