//! appliance-cli as a process against the in-memory fake cluster on 127.0.0.1: create,
//! produce, consume with --verify, the faults --verify must catch, exit codes.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use appliance::client::fake::FakeCluster;
use replication::wire::Operation;
use serde_json::Value;

/// Kills the child by its PID if a test leaves it running.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The last stdout line as JSON.
    fn json(&self) -> Value {
        let last = self.stdout.lines().last().unwrap_or("");
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {:?}", self.stdout))
    }
}

const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn cli(args: &[&str]) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_appliance-cli"))
        .args(args)
        .env_remove("APPLIANCE_PASSWORD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("appliance-cli starts");
    let mut guard = ChildGuard(child);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = guard.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < RUN_TIMEOUT,
            "appliance-cli {args:?} hangs"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = guard.0.stdout.take() {
        let _ = out.read_to_string(&mut stdout);
    }
    if let Some(mut err) = guard.0.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    Run {
        code: status.code().unwrap_or(-1),
        stdout,
        stderr,
    }
}

/// Runs a command against the cluster as root, through the last node only (a backup:
/// every write follows a redirect).
fn at(cluster: &FakeCluster, args: &[&str]) -> Run {
    let server = cluster.addrs.last().unwrap().to_string();
    let mut all = vec![
        "--server",
        &server,
        "--password",
        "secret",
        "--json",
        "--attempts",
        "5",
        "--retry-timeout-ms",
        "3000",
    ];
    all.extend_from_slice(args);
    cli(&all)
}

fn setup(cluster: &FakeCluster, partitions: &str) {
    let run = at(cluster, &["stream", "create", "orders"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["stream_id"], 1);
    let run = at(
        cluster,
        &[
            "topic",
            "create",
            "orders",
            "eu",
            "--partitions",
            partitions,
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["topic_id"], 1);
}

fn produce(cluster: &FakeCluster, extra: &[&str]) -> Run {
    let mut args = vec![
        "produce", "--stream", "orders", "--topic", "eu", "--count", "100", "--size", "64",
        "--batch", "10", "--seed", "7",
    ];
    args.extend_from_slice(extra);
    at(cluster, &args)
}

fn consume(cluster: &FakeCluster, count: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "consume",
        "--stream",
        "1",
        "--topic",
        "eu",
        "--partition",
        "0",
        "--from",
        "0",
        "--count",
        count,
        "--wait-ms",
        "300",
    ];
    args.extend_from_slice(extra);
    at(cluster, &args)
}

#[test]
fn topic_retention_is_set_at_create_changed_by_update_and_shown() {
    let cluster = FakeCluster::start(1).unwrap();
    let run = at(&cluster, &["stream", "create", "logs"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = at(
        &cluster,
        &[
            "topic",
            "create",
            "logs",
            "app",
            "--partitions",
            "2",
            "--message-expiry",
            "7d",
            "--max-size",
            "10GiB",
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["message_expiry"], "7d");
    assert_eq!(run.json()["max_size"], "10 GiB");
    let run = at(
        &cluster,
        &["topic", "update", "logs", "app", "--max-size", "unlimited"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let shown = run.json();
    assert_eq!(shown["message_expiry"], "7d", "kept: {shown}");
    assert_eq!(shown["max_size"], "unlimited");
    let run = at(&cluster, &["topic", "show", "logs", "app"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let retained = run.json()["retained"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(retained.len(), 2, "{}", run.stdout);
    assert_eq!(retained[1]["first_offset"], 0);
    // Bad values are usage errors, named.
    let run = at(
        &cluster,
        &[
            "topic",
            "update",
            "logs",
            "app",
            "--message-expiry",
            "7 weeks",
        ],
    );
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("--message-expiry"), "{}", run.stderr);
    let run = at(&cluster, &["topic", "update", "logs", "app"]);
    assert_eq!(run.code, 2);
}

#[test]
fn produce_then_consume_verifies_every_message() {
    let cluster = FakeCluster::start(3).unwrap();
    setup(&cluster, "1");
    let run = produce(&cluster, &["--partition", "0"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.json();
    assert_eq!(report["acked"], 100);
    assert_eq!(report["first_offset"], 0);
    assert_eq!(report["last_offset"], 99);
    assert_eq!(report["partition"], 0);
    assert!(report["msgs_per_s"].is_u64());
    let run = consume(
        &cluster,
        "100",
        &["--verify", "--seed", "7", "--size", "64"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.json();
    assert_eq!(report["consumed"], 100);
    assert_eq!(report["last_offset"], 99);
    assert_eq!(report["verified"], true);
    // Reading registers no session: only the producer and the creates did.
    let registers = cluster
        .state()
        .received
        .iter()
        .filter(|r| r.operation == Operation::Register as u8 && r.node == 0)
        .count();
    assert_eq!(registers, 3);
    // The wrong seed is a mismatch.
    let run = consume(&cluster, "100", &["--verify", "--seed", "8"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("mismatch at offset 0"),
        "{}",
        run.stderr
    );
}

#[test]
fn produce_without_partition_spreads_batches_round_robin() {
    let cluster = FakeCluster::start(1).unwrap();
    setup(&cluster, "3");
    let run = produce(&cluster, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.json();
    assert_eq!(report["acked"], 100);
    let partitions = report["partitions"].as_array().unwrap();
    let acked: Vec<u64> = partitions
        .iter()
        .map(|p| p["acked"].as_u64().unwrap())
        .collect();
    assert_eq!(acked, vec![40, 30, 30]);
    assert_eq!(partitions[0]["last_offset"], 39);
    // Partition 0 holds batches 0, 3, 6, 9: indexes jump, offsets do not.
    let run = consume(&cluster, "40", &["--verify", "--seed", "7"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn verify_catches_a_corrupted_payload_that_checksums_cannot() {
    let cluster = FakeCluster::start(1).unwrap();
    setup(&cluster, "1");
    assert_eq!(produce(&cluster, &["--partition", "0"]).code, 0);
    cluster.state().faults.corrupt_payload_at = Some(42);
    // Checksums were recomputed over the bad byte: only the content check can tell.
    let run = consume(&cluster, "100", &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let run = consume(&cluster, "100", &["--verify", "--seed", "7"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("mismatch at offset 42") && run.stderr.contains("payload"),
        "{}",
        run.stderr
    );
    assert_eq!(run.json()["consumed"], 42);
    assert_eq!(run.stderr.lines().count(), 1);
}

#[test]
fn consume_catches_a_gap() {
    let cluster = FakeCluster::start(1).unwrap();
    setup(&cluster, "1");
    cluster.state().faults.gap_at = Some(30);
    assert_eq!(produce(&cluster, &["--partition", "0"]).code, 0);
    let run = consume(&cluster, "100", &[]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("gap: expected offset 30"),
        "{}",
        run.stderr
    );
}

#[test]
fn verify_catches_a_duplicated_message() {
    let cluster = FakeCluster::start(1).unwrap();
    setup(&cluster, "1");
    assert_eq!(produce(&cluster, &["--partition", "0"]).code, 0);
    // The same messages again (as a producer resending without its request number).
    assert_eq!(produce(&cluster, &["--partition", "0"]).code, 0);
    let run = consume(&cluster, "200", &["--verify", "--seed", "7"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("duplicate: message index 0 at offsets 0 and 100"),
        "{}",
        run.stderr
    );
}

#[test]
fn consume_reports_missing_messages() {
    let cluster = FakeCluster::start(1).unwrap();
    setup(&cluster, "1");
    assert_eq!(produce(&cluster, &["--partition", "0"]).code, 0);
    let run = consume(&cluster, "150", &[]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("only 100 of 150"), "{}", run.stderr);
}

#[test]
fn a_failing_produce_still_reports_what_was_acked() {
    let cluster = FakeCluster::start(1).unwrap();
    setup(&cluster, "1");
    cluster.state().faults.unavailable_after_sends = Some(3);
    let run = produce(&cluster, &["--partition", "0"]);
    assert_eq!(run.code, 1);
    let report = run.json();
    assert_eq!(report["acked"], 30);
    assert_eq!(report["last_offset"], 29);
    assert!(report["error"].as_str().unwrap().contains("Unavailable"));
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
}

#[test]
fn produce_survives_a_primary_crash_without_duplicates() {
    let cluster = FakeCluster::start(3).unwrap();
    setup(&cluster, "1");
    cluster.state().faults.crash_primary_after_apply = Some(Operation::SendMessages);
    let run = produce(&cluster, &["--partition", "0"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["acked"], 100);
    let run = consume(&cluster, "100", &["--verify", "--seed", "7"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn server_lists_skip_dead_nodes_and_accept_repeats() {
    let cluster = FakeCluster::start(2).unwrap();
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let list = format!("{dead},{}", cluster.servers_arg());
    let run = cli(&[
        "--server",
        &list,
        "--password",
        "secret",
        "stream",
        "create",
        "a",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("created with id 1"), "{}", run.stdout);
    let second = cluster.addrs[1].to_string();
    let run = cli(&[
        "--server",
        &dead,
        "--server",
        &second,
        "--password",
        "secret",
        "stream",
        "create",
        "b",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
}

#[test]
fn bad_usage_exits_2_with_one_line() {
    for args in [
        vec![
            "produce", "--stream", "s", "--topic", "t", "--size", "1", "--batch", "1",
        ],
        vec![
            "produce", "--stream", "s", "--topic", "t", "--count", "1", "--size", "1", "--batch",
            "0",
        ],
        vec![
            "consume",
            "--stream",
            "s",
            "--topic",
            "t",
            "--partition",
            "0",
            "--count",
            "x",
        ],
        vec![
            "produce", "--stream", "s", "--topic", "t", "--count", "9", "--size", "16777216",
            "--batch", "9",
        ],
        vec!["frobnicate"],
        vec![],
        vec!["stream", "create", "s", "--server", "no-port-here"],
    ] {
        let run = cli(&args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{args:?}: {}", run.stderr);
        assert!(run.stderr.starts_with("appliance-cli: "), "{}", run.stderr);
    }
    let run = cli(&["stream", "create", "s", "--server", "127.0.0.1:9"]);
    assert_eq!(run.code, 2, "no password is bad usage: {}", run.stderr);
    assert!(run.stderr.contains("APPLIANCE_PASSWORD"));
}

#[test]
fn wrong_password_and_dead_server_exit_1() {
    let cluster = FakeCluster::start(1).unwrap();
    let server = cluster.addrs[0].to_string();
    let run = cli(&[
        "--server",
        &server,
        "--password",
        "nope",
        "stream",
        "create",
        "s",
    ]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("InvalidCredentials"), "{}", run.stderr);
    drop(cluster);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap().to_string();
    drop(listener);
    let run = cli(&[
        "--server",
        &dead,
        "--password",
        "p",
        "stream",
        "create",
        "s",
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
}

/// A stats endpoint stand-in: answers every connection from `answer(path)` until the
/// test ends (the thread is left blocked in accept; it holds only a loopback socket).
fn stats_server(answer: impl Fn(&str) -> (u16, String) + Send + 'static) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let mut header = String::new();
            while reader.read_line(&mut header).is_ok_and(|n| n > 2) {
                header.clear();
            }
            let path = line.split(' ').nth(1).unwrap_or("").to_string();
            let (code, body) = answer(&path);
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {code} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn status_reads_every_member_and_shows_a_dead_one_down() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap().to_string();
    drop(listener);
    // The seed reports itself (replica 1) and a member whose endpoint is dead.
    let seed = {
        let dead = dead.clone();
        let me = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let me2 = me.clone();
        let addr = stats_server(move |path| match path {
            "/stats" => (
                200,
                serde_json::json!({
                    "replica_id": 1, "cluster": "c", "uptime_s": 9,
                    "groups": [{"group": "1", "name": "metadata", "status": "normal",
                        "view": 4, "primary": 1, "is_primary": true, "op": 12, "commit": 10}],
                    "peers": [{"replica": 0, "connected": false, "queue_depth": 3, "dropped": 5}],
                    "nodes": [
                        {"replica": 0, "name": "a", "http": dead},
                        {"replica": 1, "name": "b", "http": me2.lock().unwrap().clone()},
                    ],
                    "latency_us": {"request": {"p99": 250}},
                })
                .to_string(),
            ),
            "/health" => (503, "group metadata has no replication quorum\n".into()),
            _ => (404, String::new()),
        });
        *me.lock().unwrap() = addr.clone();
        addr
    };
    let run = cli(&["status", "--http", &seed, "--json"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let status = run.json();
    assert_eq!(status["nodes_up"], 1, "{status}");
    assert_eq!(status["nodes"][0]["up"], false);
    assert_eq!(status["nodes"][0]["http"], dead.as_str());
    let b = &status["nodes"][1];
    assert_eq!(b["healthy"], false);
    assert!(b["health"].as_str().unwrap().contains("quorum"), "{b}");
    assert_eq!(b["groups"][0]["role"], "primary");
    assert_eq!(b["groups"][0]["commit_lag"], 2);
    assert_eq!(b["dropped"], 5);
    assert_eq!(b["p99_us"]["request"], 250);

    let run = cli(&["status", "--http", &seed]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("node 0 a") && run.stdout.contains("DOWN"));
    assert!(
        run.stdout.contains("0 DOWN (queue 3, dropped 5)"),
        "{}",
        run.stdout
    );

    let run = cli(&[
        "status",
        "--http",
        &seed,
        "--watch",
        "--count",
        "3",
        "--interval",
        "50ms",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.lines().count(), 3, "{}", run.stdout);

    let run = cli(&["status", "--http", &dead]);
    assert_eq!(run.code, 1, "nothing answers: {}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    let run = cli(&["status", "--http", "no-port-here"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

/// `bench MODE` on stream "b", topic "t" with small messages and short windows.
fn bench(cluster: &FakeCluster, mode: &str, extra: &[&str]) -> Run {
    let mut args = vec![
        "bench", mode, "--stream", "b", "--topic", "t", "--size", "64", "--batch", "10", "--seed",
        "3",
    ];
    args.extend_from_slice(extra);
    at(cluster, &args)
}

#[test]
fn bench_produce_and_consume_report_and_check_what_was_acked() {
    let cluster = FakeCluster::start(3).unwrap();
    let run = bench(
        &cluster,
        "produce",
        &[
            "--partitions",
            "2",
            "--producers",
            "2",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.json();
    assert_eq!(report["mode"], "produce");
    let acked = report["acked_total"].as_u64().unwrap();
    assert!(acked >= 40, "{report}");
    assert!(report["messages"].as_u64().unwrap() <= acked);
    // First and last batch of both partitions were read back and compared.
    assert_eq!(report["checked_batches"], 4, "{report}");
    let latency = &report["latency_us"];
    assert!(latency["p50"].as_u64().unwrap() <= latency["max"].as_u64().unwrap());
    assert!(latency["count"].as_u64().unwrap() > 0);
    let stored: u64 = (0..2)
        .map(|partition| {
            cluster
                .state()
                .stored_messages(replication::wire::PartitionKey {
                    stream: 1,
                    topic: 1,
                    partition,
                })
        })
        .sum();
    assert_eq!(stored, acked);

    let expect = acked.to_string();
    let args = ["--partitions", "2", "--consumers", "2", "--verify"];
    let run = bench(
        &cluster,
        "consume",
        &[&args[..], &["--expect", &expect]].concat(),
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["messages"].as_u64(), Some(acked));
    assert_eq!(run.json()["bytes"].as_u64(), Some(acked * 64));

    let more = (acked + 1).to_string();
    let run = bench(
        &cluster,
        "consume",
        &[&args[..], &["--expect", &more]].concat(),
    );
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("expected"), "{}", run.stderr);
}

#[test]
fn bench_produce_open_loop_sends_what_the_rate_schedules() {
    let cluster = FakeCluster::start(1).unwrap();
    // 200 messages/s in batches of 10: one batch every 50 ms, due at 0, 50, ... 550 ms
    // of the 600 ms run: 12 batches, however fast or slow the server answers.
    let run = bench(
        &cluster,
        "produce",
        &[
            "--partitions",
            "1",
            "--rate",
            "200",
            "--duration",
            "400ms",
            "--warmup",
            "200ms",
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["acked_total"], 120, "{}", run.stdout);
    assert_eq!(run.json()["open_loop"], true);
}

#[test]
fn bench_fails_on_a_gap_in_the_acks_and_on_corrupted_data() {
    let cluster = FakeCluster::start(1).unwrap();
    cluster.state().faults.gap_at = Some(30);
    let quick = [
        "--partitions",
        "1",
        "--duration",
        "300ms",
        "--warmup",
        "0ms",
    ];
    let run = bench(&cluster, "produce", &quick);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stderr.contains("gap"), "{}", run.stderr);

    let cluster = FakeCluster::start(1).unwrap();
    let run = bench(&cluster, "produce", &quick);
    assert_eq!(run.code, 0, "{}", run.stderr);
    cluster.state().faults.corrupt_payload_at = Some(42);
    let run = bench(&cluster, "consume", &["--partitions", "1", "--verify"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stderr.contains("offset 42"), "{}", run.stderr);

    let run = bench(&cluster, "roundtrip", &quick);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["mode"], "roundtrip");
    assert!(run.json()["messages"].as_u64().unwrap() > 0);
}
