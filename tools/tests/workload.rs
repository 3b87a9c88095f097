//! appliance-workload as a process against the in-memory fake cluster on 127.0.0.1: a
//! clean run passes the checker, and the faults the checker exists for (a payload
//! changed on the way to disk, an offset skipped) fail it with exit 1.

use std::path::Path;
use std::process::{Command, Stdio};

use appliance::client::fake::FakeCluster;
use serde_json::Value;

/// Runs appliance-workload (every command here ends by itself: produce after
/// --max-seconds, check after its settle time); returns the exit code and the last
/// stdout line as JSON.
fn workload(args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_appliance-workload"))
        .args(args)
        .env("APPLIANCE_PASSWORD", "secret")
        .stdin(Stdio::null())
        .output()
        .expect("appliance-workload runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("null");
    let json = serde_json::from_str(last).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), json)
}

/// The arguments produce and check share: servers, partitions, payload size, seed, acks.
fn shared(cluster: &FakeCluster, dir: &Path) -> Vec<String> {
    let acks = dir.join("acks.jsonl");
    [
        "--servers",
        &cluster.servers_arg(),
        "--partitions",
        "2",
        "--size",
        "64",
        "--seed",
        "3",
        "--acks",
        acks.to_str().expect("utf-8 path"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run(command: &str, cluster: &FakeCluster, dir: &Path, extra: &[&str]) -> (i32, Value) {
    let mut args = vec![command.to_string()];
    args.extend(shared(cluster, dir));
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    workload(&refs)
}

/// Produces for one second to 2 partitions; returns the produce summary.
fn produce(cluster: &FakeCluster, dir: &Path) -> Value {
    let stop = dir.join("stop");
    let stop = stop.to_str().expect("utf-8 path");
    let extra = [
        "--rate",
        "400",
        "--batch",
        "5",
        "--stop-file",
        stop,
        "--max-seconds",
        "1",
    ];
    let (code, json) = run("produce", cluster, dir, &extra);
    assert_eq!(code, 0, "{json}");
    json
}

fn check(cluster: &FakeCluster, dir: &Path) -> (i32, Value) {
    let meta = r#"{"scenario":"fake"}"#;
    run(
        "check",
        cluster,
        dir,
        &["--settle-ms", "1000", "--meta", meta],
    )
}

#[test]
fn a_clean_run_passes_and_counts_every_acked_message() {
    let cluster = FakeCluster::start(3).expect("fake cluster");
    let dir = tempfile::tempdir().expect("tempdir");
    let produced = produce(&cluster, dir.path());
    let acked = produced["acked"].as_u64().expect("acked");
    assert!(acked >= 50, "{produced}");
    let (code, report) = check(&cluster, dir.path());
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["scenario"], "fake");
    assert_eq!(report["messages_acked"].as_u64(), Some(acked));
    assert_eq!(report["messages_stored"].as_u64(), Some(acked));
    assert_eq!(report["replicas"].as_array().map(Vec::len), Some(3));
}

#[test]
fn a_payload_changed_after_the_ack_fails_the_check() {
    let cluster = FakeCluster::start(1).expect("fake cluster");
    let dir = tempfile::tempdir().expect("tempdir");
    produce(&cluster, dir.path());
    cluster.state().faults.corrupt_payload_at = Some(7);
    let (code, report) = check(&cluster, dir.path());
    assert_eq!(code, 1, "{report}");
    // The fake corrupts offset 7 of every partition: one message in each of the two.
    assert_eq!(report["violations_by_kind"]["corrupt"], 2, "{report}");
    assert_eq!(report["violations"][0]["offset"], 7, "{report}");
}

#[test]
fn a_skipped_offset_fails_the_check() {
    let cluster = FakeCluster::start(1).expect("fake cluster");
    let dir = tempfile::tempdir().expect("tempdir");
    cluster.state().faults.gap_at = Some(20);
    produce(&cluster, dir.path());
    let (code, report) = check(&cluster, dir.path());
    assert_eq!(code, 1, "{report}");
    assert!(
        report["violations_by_kind"]["offset_gap"].as_u64() >= Some(1),
        "{report}"
    );
}
