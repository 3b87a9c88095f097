//! Operations against three real `appliance` processes on 127.0.0.1: every
//! documented `/stats` field is present with sane values on every node, op and commit
//! rise with writes, `/metrics` parses with the Prometheus Python client and agrees with
//! `/stats`, `appliance-cli status --json` sees the whole cluster from one node, a killed
//! peer shows disconnected on the others, and the last node standing reports 503 with
//! the reason.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use appliance::client::{Client, ClientOptions};
use common::*;
use replication::wire::batch::{BatchBuilder, NewMessage};
use replication::wire::PartitionKey;
use serde_json::Value;

const NODES: usize = 3;
/// Set (CI does) to fail rather than skip when the Prometheus parser is missing (not
/// APPLIANCE_*: the daemons inherit the environment and read that prefix as config).
const REQUIRE_PARSER_ENV: &str = "REQUIRE_PROMETHEUS_PARSER";

fn stats(files: &ClusterFiles, replica: usize) -> Option<Value> {
    let (code, body) = http_get(files.http_addr(replica), "/stats")?;
    assert_eq!(code, 200, "/stats of node {replica}: {body}");
    Some(serde_json::from_str(&body).expect("/stats is JSON"))
}

/// Polls until `check` holds for the stats of every node in `nodes`, or panics with the
/// last stats seen.
fn wait_for(
    files: &ClusterFiles,
    nodes: &[usize],
    what: &str,
    within: Duration,
    check: impl Fn(usize, &Value) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let all: Vec<Option<Value>> = nodes.iter().map(|r| stats(files, *r)).collect();
        if all
            .iter()
            .zip(nodes)
            .all(|(s, r)| s.as_ref().is_some_and(|s| check(*r, s)))
        {
            return all.into_iter().flatten().collect();
        }
        assert!(
            Instant::now() < deadline,
            "not {what} within {within:?}: {all:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn group<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|g| g["name"] == name))
        .unwrap_or(&Value::Null)
}

fn peer(stats: &Value, replica: usize) -> &Value {
    stats["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["replica"] == replica))
        .unwrap_or(&Value::Null)
}

fn u(value: &Value) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {value}"))
}

/// Every field docs/operations.md lists, with sane values, on one node's stats.
fn check_documented_fields(files: &ClusterFiles, replica: usize, s: &Value) {
    assert_eq!(s["replica_id"], replica, "{s}");
    assert_eq!(s["cluster"], "e2e");
    assert!(s["uptime_s"].is_u64(), "{s}");
    let groups = s["groups"].as_array().expect("groups[]");
    assert!(!groups.is_empty());
    for g in groups {
        for key in ["view", "log_view", "primary", "op", "commit"] {
            assert!(g[key].is_u64(), "groups[].{key} in {g}");
        }
        assert!(g["group"]
            .as_str()
            .is_some_and(|v| v.parse::<u64>().is_ok()));
        assert_eq!(g["status"], "normal", "{g}");
        assert!(u(&g["commit"]) <= u(&g["op"]), "commit <= op: {g}");
        assert!(u(&g["log_view"]) <= u(&g["view"]), "{g}");
        assert!(u(&g["primary"]) < NODES as u64, "{g}");
        assert_eq!(
            g["is_primary"],
            u(&g["primary"]) == replica as u64,
            "is_primary agrees with primary: {g}"
        );
    }
    let peers = s["peers"].as_array().expect("peers[]");
    let ids: BTreeSet<u64> = peers.iter().map(|p| u(&p["replica"])).collect();
    let want: BTreeSet<u64> = (0..NODES as u64).filter(|r| *r != replica as u64).collect();
    assert_eq!(ids, want, "one entry per other replica");
    for p in peers {
        assert_eq!(p["connected"], true, "{p}");
        for key in ["queue_depth", "dropped", "bytes_sent", "bytes_received"] {
            assert!(p[key].is_u64(), "peers[].{key} in {p}");
        }
    }
    // Two backups may have nothing to say to each other; every node talks to someone.
    for key in ["bytes_sent", "bytes_received"] {
        assert!(
            peers.iter().map(|p| u(&p[key])).sum::<u64>() > 0,
            "{key}: {s}"
        );
    }
    assert!(s["rejected"].is_object(), "{s}");
    assert!(s["repair"].is_object() && s["state_transfer"].is_object());
    for figure in ["request", "prepare_commit", "journal_fsync"] {
        let l = &s["latency_us"][figure];
        for key in ["p50", "p99", "p999", "max"] {
            assert!(l[key].is_u64(), "latency_us.{figure}.{key}: {l}");
        }
        assert!(u(&l["p50"]) <= u(&l["p99"]) && u(&l["p99"]) <= u(&l["max"]));
    }
    let nodes = s["nodes"].as_array().expect("nodes[]");
    assert_eq!(nodes.len(), NODES);
    for (r, n) in nodes.iter().enumerate() {
        assert_eq!(n["replica"], r);
        assert_eq!(n["http"], files.http_addr(r).to_string());
        assert_eq!(n["client"], files.client_addr(r).to_string());
    }
}

/// One primary per group across the nodes, agreed by all of them (the stats of each
/// node are read at slightly different times, so a view change in between can fail
/// this; callers retry).
fn one_primary_per_group(all: &[Value]) -> Result<(), String> {
    let mut names = BTreeSet::new();
    for s in all {
        for g in s["groups"].as_array().into_iter().flatten() {
            names.insert(g["name"].as_str().unwrap_or("").to_string());
        }
    }
    for name in names {
        let primaries: Vec<u64> = all
            .iter()
            .filter(|s| group(s, &name)["is_primary"] == true)
            .map(|s| u(&s["replica_id"]))
            .collect();
        if primaries.len() != 1 {
            return Err(format!("primaries of {name}: {primaries:?}"));
        }
        for s in all {
            if group(s, &name)["primary"] != primaries[0] {
                return Err(format!("{name}: not every node names {}", primaries[0]));
            }
        }
    }
    Ok(())
}

fn client(files: &ClusterFiles) -> Client {
    let servers: Vec<_> = (0..NODES).map(|r| files.client_addr(r)).collect();
    let mut client = Client::connect(&servers, ClientOptions::default()).expect("connect");
    client
        .login("root", ROOT_PASSWORD.as_bytes())
        .expect("login");
    client
}

/// A Python interpreter with `prometheus_client`, if there is one.
fn python_with_prometheus_client() -> Option<String> {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|python| {
            Command::new(python)
                .args(["-c", "import prometheus_client.parser"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(str::to_string)
}

/// Parses Prometheus text with `prometheus_client.parser.text_string_to_metric_families`;
/// per family its type and samples (name, labels, value).
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    out[family.name] = {"type": family.type,
                        "samples": [[s.name, s.labels, s.value] for s in family.samples]}
print(json.dumps(out))
"#;

fn parse_prometheus(python: &str, text: &str) -> Value {
    let mut child = Command::new(python)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write metrics");
    let output = child.wait_with_output().expect("python");
    assert!(
        output.status.success(),
        "the Prometheus parser rejected /metrics: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("parser output")
}

/// The value of the sample `name` whose labels include `labels`.
fn sample(families: &Value, family: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    families[family]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no family {family}"))
        .iter()
        .find(|s| s[0] == name && labels.iter().all(|(k, v)| s[1][k] == *v))
        .and_then(|s| s[2].as_f64())
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in {}", families[family]))
}

fn check_metrics_parse_and_match_stats(files: &ClusterFiles, replica: usize) {
    let Some(python) = python_with_prometheus_client() else {
        let message = "python3 with prometheus_client is missing (apt-get install \
                       python3-prometheus-client)";
        assert!(
            std::env::var_os(REQUIRE_PARSER_ENV).is_none(),
            "{message}, and {REQUIRE_PARSER_ENV} is set"
        );
        eprintln!("\n!!!!! SKIPPED the Prometheus parser check: {message} !!!!!\n");
        return;
    };
    // The cluster is idle: op, commit and view hold still, unless a view change lands
    // between the reads; read /stats on both sides of /metrics and retry if it moved.
    let mut tries = 0;
    let (text, s) = loop {
        let before = stats(files, replica).expect("stats");
        let (code, text) = http_get(files.http_addr(replica), "/metrics").expect("/metrics");
        assert_eq!(code, 200);
        let s = stats(files, replica).expect("stats");
        tries += 1;
        if before["groups"] == s["groups"] && before["peers"] == s["peers"] || tries == 10 {
            break (text, s);
        }
    };
    let families = parse_prometheus(&python, &text);
    for (family, kind) in [
        ("appliance_info", "gauge"),
        ("appliance_uptime_seconds", "gauge"),
        ("appliance_group_view", "gauge"),
        ("appliance_group_op", "gauge"),
        ("appliance_group_commit", "gauge"),
        ("appliance_group_status", "gauge"),
        ("appliance_peer_connected", "gauge"),
        // The parser names counter families without their `_total` suffix.
        ("appliance_peer_dropped_frames", "counter"),
        ("appliance_peer_sent_bytes", "counter"),
        ("appliance_rejected_frames", "counter"),
        ("appliance_request_latency_seconds", "summary"),
        ("appliance_prepare_commit_latency_seconds", "summary"),
        ("appliance_journal_fsync_latency_seconds", "summary"),
    ] {
        assert_eq!(families[family]["type"], kind, "{family} in {families}");
    }
    let id = replica.to_string();
    assert_eq!(
        sample(
            &families,
            "appliance_info",
            "appliance_info",
            &[("replica_id", &id), ("cluster", "e2e")]
        ),
        1.0
    );
    for g in s["groups"].as_array().expect("groups") {
        let name = g["name"].as_str().expect("name");
        for (family, key) in [
            ("appliance_group_op", "op"),
            ("appliance_group_commit", "commit"),
            ("appliance_group_view", "view"),
        ] {
            assert_eq!(
                sample(&families, family, family, &[("name", name)]),
                u(&g[key]) as f64,
                "{family} of {name}"
            );
        }
    }
    for p in s["peers"].as_array().expect("peers") {
        let r = u(&p["replica"]).to_string();
        assert_eq!(
            sample(
                &families,
                "appliance_peer_connected",
                "appliance_peer_connected",
                &[("replica", &r)]
            ),
            1.0
        );
        assert_eq!(
            sample(
                &families,
                "appliance_peer_dropped_frames",
                "appliance_peer_dropped_frames_total",
                &[("replica", &r)]
            ),
            u(&p["dropped"]) as f64
        );
    }
    let count = u(&s["latency_us"]["journal_fsync"]["count"]);
    assert!(count > 0, "metadata writes were journaled");
    assert_eq!(
        sample(
            &families,
            "appliance_journal_fsync_latency_seconds",
            "appliance_journal_fsync_latency_seconds_count",
            &[]
        ),
        count as f64
    );
    let p99 = sample(
        &families,
        "appliance_journal_fsync_latency_seconds",
        "appliance_journal_fsync_latency_seconds",
        &[("quantile", "0.99")],
    );
    let want = u(&s["latency_us"]["journal_fsync"]["p99"]) as f64 / 1e6;
    assert!((p99 - want).abs() < 1e-9, "p99 {p99} vs {want}");
}

fn cli_status(cli: &PathBuf, files: &ClusterFiles, via: usize) -> Value {
    let output = Command::new(cli)
        .args(["status", "--json", "--http"])
        .arg(files.http_addr(via).to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run appliance-cli status");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "status exited {:?}: {stdout}{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// The metadata primary `appliance-cli status` reports, checking every up node agrees.
fn status_primary(status: &Value) -> Option<u64> {
    let mut primaries = BTreeMap::new();
    for node in status["nodes"]
        .as_array()?
        .iter()
        .filter(|n| n["up"] == true)
    {
        for g in node["groups"].as_array()? {
            if g["name"] == "metadata" && g["role"] == "primary" {
                primaries.insert(u(&node["replica"]), ());
            }
        }
    }
    (primaries.len() == 1).then(|| *primaries.keys().next().expect("one"))
}

#[test]
fn stats_health_metrics_and_status_on_three_nodes_through_peer_and_quorum_loss() {
    let files = ClusterFiles::new(NODES);
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(&files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
    let all: Vec<usize> = (0..NODES).collect();
    // Links come up and views settle: every peer connected, one agreed primary.
    wait_for(
        &files,
        &all,
        "connected",
        Duration::from_secs(30),
        |_, s| {
            s["peers"]
                .as_array()
                .is_some_and(|p| p.len() == NODES - 1 && p.iter().all(|p| p["connected"] == true))
        },
    );

    // Writes: a stream (metadata group) and a topic with one partition, then messages.
    let before: Vec<Value> = all.iter().map(|r| stats(&files, *r).unwrap()).collect();
    let mut client = client(&files);
    let stream = client.create_stream("ops").expect("stream");
    let topic = client.create_topic(stream, "t", 1).expect("topic");
    client.register().expect("register");
    let key = PartitionKey {
        stream,
        topic,
        partition: 0,
    };
    for b in 0..5u128 {
        let mut builder = BatchBuilder::with_capacity(4096);
        for i in 0..10 {
            builder.push(NewMessage {
                id: b * 10 + i + 1,
                timestamp_delta: 0,
                payload: b"ops",
                user_headers: &[],
            });
        }
        let batch = builder.finish(1);
        // A partition primary that has not applied the Register yet answers NoSession,
        // and the client's re-register-and-resend loop has no backoff (20 attempts in a
        // few ms): give the metadata commit time to reach it.
        let deadline = Instant::now() + Duration::from_secs(15);
        while let Err(error) = client.send_messages(key, &batch) {
            assert!(Instant::now() < deadline, "send: {error:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    drop(client);
    let partition = format!("{stream}/{topic}/0");
    let op_before = u(&group(&before[0], "metadata")["op"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let after = wait_for(
            &files,
            &all,
            "caught up on every write",
            Duration::from_secs(30),
            |_, s| {
                let metadata = group(s, "metadata");
                let part = group(s, &partition);
                metadata["op"].as_u64() >= Some(op_before + 2)
                    && metadata["commit"] == metadata["op"]
                    && part["op"].as_u64() >= Some(5)
                    && part["commit"] == part["op"]
            },
        );
        match one_primary_per_group(&after) {
            Ok(()) => break after,
            Err(e) => assert!(Instant::now() < deadline, "{e}: {after:#?}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for (replica, s) in after.iter().enumerate() {
        check_documented_fields(&files, replica, s);
        assert!(u(&s["latency_us"]["journal_fsync"]["count"]) > 0, "{s}");
        assert!(u(&s["latency_us"]["prepare_commit"]["count"]) > 0, "{s}");
        // The partition written above: its log's segments and their index, counted.
        let storage = &s["storage"];
        assert!(u(&storage["partitions"]) >= 1, "{s}");
        assert!(u(&storage["segments"]) >= u(&storage["partitions"]), "{s}");
        assert!(u(&storage["index_bytes"]) > 0, "{s}");
        assert!(u(&storage["prepare_index_bytes"]) > 0, "{s}");
        // Its committed prepares kept for repair, within the node-wide bound.
        let repair = u(&storage["repair_window_bytes"]);
        assert!(repair > 0 && repair <= 256 << 20, "{s}");
    }
    let primary = u(&group(&after[0], "metadata")["primary"]) as usize;
    let requests: u64 = after
        .iter()
        .map(|s| u(&s["latency_us"]["request"]["count"]))
        .sum();
    assert!(requests >= 2, "primaries time the requests they answer");
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(30));
    }

    check_metrics_parse_and_match_stats(&files, primary);
    check_metrics_parse_and_match_stats(&files, (primary + 1) % NODES);

    // appliance-cli status from one node sees all three.
    let cli = cli_binary();
    // Retried while a view change (slow machine, heartbeat timeouts) is in progress.
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = cli_status(&cli, &files, (primary + 1) % NODES);
        let settled = status["nodes"].as_array().is_some_and(|nodes| {
            nodes.iter().all(|n| {
                n["healthy"] == true
                    && n["groups"]
                        .as_array()
                        .is_some_and(|g| g.iter().all(|g| g["op_lag"] == 0 && g["commit_lag"] == 0))
            })
        });
        if (settled && status_primary(&status).is_some()) || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["nodes_up"], 3, "{status}");
    let primary = status_primary(&status).expect("one metadata primary") as usize;
    for node in status["nodes"].as_array().expect("nodes") {
        assert_eq!(node["healthy"], true, "{node}");
        let groups = node["groups"].as_array().expect("groups");
        assert_eq!(groups.len(), 2, "metadata and one partition: {node}");
        for g in groups {
            assert_eq!(g["op_lag"], 0, "idle cluster, caught up: {g}");
            assert_eq!(g["commit_lag"], 0, "{g}");
            if g["name"] == "metadata" {
                assert_eq!(g["primary"], primary, "every node names the primary: {g}");
            }
        }
        assert!(node["p99_us"]["journal_fsync"].is_u64());
    }

    // Kill the primary: the others show it disconnected, elect a new one and stay
    // healthy; status shows the dead node down, not an error.
    daemons[primary].kill();
    let survivors: Vec<usize> = all.iter().copied().filter(|r| *r != primary).collect();
    let seen = wait_for(
        &files,
        &survivors,
        "showing the killed peer disconnected under a new primary",
        Duration::from_secs(30),
        |_, s| {
            peer(s, primary)["connected"] == false
                && group(s, "metadata")["status"] == "normal"
                && group(s, "metadata")["primary"] != primary
        },
    );
    for s in &seen {
        let other = survivors
            .iter()
            .find(|r| **r != u(&s["replica_id"]) as usize);
        assert_eq!(peer(s, *other.unwrap())["connected"], true, "{s}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = cli_status(&cli, &files, survivors[0]);
        if status_primary(&status).is_some() || Instant::now() > deadline {
            break status;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(status["nodes_up"], 2, "{status}");
    let down = &status["nodes"][primary];
    assert_eq!(down["up"], false, "{status}");
    assert!(down["error"].is_string(), "{down}");
    assert!(status_primary(&status).is_some_and(|p| p != primary as u64));

    // Kill a second node: the last one has no quorum and says so on /health.
    daemons[survivors[1]].kill();
    let last = survivors[0];
    let deadline = Instant::now() + Duration::from_secs(30);
    let (code, body) = loop {
        let answer = http_get(files.http_addr(last), "/health").expect("health");
        if answer.0 != 200 || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("group"), "503 names the reason: {body}");
    let s = stats(&files, last).expect("stats");
    assert!(s["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .all(|p| p["connected"] == false));
    assert!(
        s["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .any(|g| g["quorum"] == false || g["status"] != "normal"),
        "{s}"
    );
    // The log says so too: one line for the change, with the group, view and op.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = log_of(&files.log(last));
        let line = log
            .lines()
            .find(|l| l.contains("no replication quorum") && l.contains("group=metadata"));
        if let Some(line) = line {
            assert!(line.contains("view=") && line.contains("op="), "{line}");
            break;
        }
        assert!(Instant::now() < deadline, "no quorum-loss line in:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}
