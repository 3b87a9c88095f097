//! Many partitions on a 3-node cluster: three real `appliance` processes on 127.0.0.1.
//! Creating a topic of many partitions starts their groups a tick's budget at a time, so
//! no node loop stalls past the heartbeat timeout: the metadata group keeps its view
//! through the creation, every partition group elects its primary, and a message produced to each partition reads back. While a
//! group has not started on a node, that node answers its partition Unavailable (the
//! client retries), never NotFound.
//!
//! `/stats` and `/metrics` list at most `limits.stats_groups_max` groups one by one (the
//! metadata group and the unhealthy ones first) with counts over all of them.
//!
//! E2E_SCALE_PARTITIONS sets the partition count (default 300 in a debug build, 2,000 in
//! release: started all at once, either stalled a node past the heartbeat timeout).

mod common;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use appliance::protocol::reply::split_poll_body;
use appliance::protocol::{Consumer, PollStrategy};
use common::*;
use replication::wire::{batch, PartitionKey};

const NODES: usize = 3;

/// The tests of this file each run a cluster and measure time against the heartbeat
/// timeout; one at a time keeps a topic's creation on one cluster from starving the
/// other's failover of CPU on a small host.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

fn one_cluster() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn partitions() -> u32 {
    std::env::var("E2E_SCALE_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 300 } else { 2_000 })
}

/// Each group's (name, view, status, is_primary) as `replica` reports it.
/// How long the idle figures are taken over (E2E_SCALE_IDLE_SECS, default 5): longer for
/// a profiler to attach.
fn idle_secs() -> u64 {
    std::env::var("E2E_SCALE_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
}

fn groups(files: &ClusterFiles, replica: usize) -> Vec<(String, u64, String, bool)> {
    let stats = stats_at(files, replica, "/stats?groups=all").0;
    let Some(list) = stats["groups"].as_array() else {
        return Vec::new();
    };
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    list.iter()
        .map(|g| {
            let primary = g["is_primary"] == true;
            (
                text(&g["name"]),
                g["view"].as_u64().unwrap_or(0),
                text(&g["status"]),
                primary,
            )
        })
        .collect()
}

/// `path` of node `replica`'s stats endpoint as JSON, and its size in bytes.
fn stats_at(files: &ClusterFiles, replica: usize, path: &str) -> (serde_json::Value, usize) {
    let (code, body) = http_get(files.http_addr(replica), path).expect("GET /stats");
    assert_eq!(code, 200, "{path}: {body}");
    (serde_json::from_str(&body).expect("JSON"), body.len())
}

/// Groups listed one by one in a bounded /stats or /metrics answer.
const STATS_GROUPS_MAX: usize = 100;

fn metadata_view(files: &ClusterFiles, replica: usize) -> u64 {
    groups(files, replica)
        .into_iter()
        .find(|g| g.0 == "metadata")
        .map(|g| g.1)
        .expect("the metadata group in /stats")
}

/// The cluster's nodes, healthy, and a registered client of all of them that created
/// stream `name`.
fn start_with_stream(
    files: &ClusterFiles,
    name: &str,
) -> (Vec<Daemon>, appliance::client::Client, u32) {
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(files, daemon, Duration::from_secs(60));
    }
    let all: Vec<usize> = (0..NODES).collect();
    let mut client = library_client(files, &all);
    client.register().expect("register");
    let stream = client.create_stream(name).expect("stream");
    (daemons, client, stream)
}

#[test]
fn a_topic_of_many_partitions_starts_without_stalling_any_node() {
    let _one = one_cluster();
    let count = partitions();
    let files = ClusterFiles::new(NODES);
    files.edit_configs(&[(
        "[limits]\n",
        &format!("[limits]\nstats_groups_max = {STATS_GROUPS_MAX}\n"),
    )]);
    let (mut daemons, mut client, stream) = start_with_stream(&files, "scale");
    let views_before: Vec<u64> = (0..NODES).map(|r| metadata_view(&files, r)).collect();

    let created = Instant::now();
    let topic = client.create_topic(stream, "many", count).expect("topic");
    // Every node starts every group, and each group elects a primary.
    let deadline = created + Duration::from_secs(if cfg!(debug_assertions) { 240 } else { 120 });
    let mut started = vec![None; NODES];
    loop {
        for (replica, done) in started.iter_mut().enumerate() {
            if done.is_none()
                && groups(&files, replica)
                    .iter()
                    .filter(|g| g.0 != "metadata")
                    .count()
                    == count as usize
            {
                *done = Some(created.elapsed());
            }
        }
        if started.iter().all(Option::is_some) {
            let primaries: usize = (0..NODES)
                .map(|r| {
                    groups(&files, r)
                        .iter()
                        .filter(|g| g.0 != "metadata" && g.3 && g.2 == "normal")
                        .count()
                })
                .sum();
            if primaries == count as usize {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "after {:?}: groups started per node {started:?}",
            created.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "{count} partitions: every group started on each node after {:?}, with a primary after {:?}",
        started,
        created.elapsed()
    );

    // The partitions' first leaders go round the nodes: each leads its share (a group
    // that changed views since may have moved, hence the slack).
    let led: Vec<usize> = (0..NODES)
        .map(|r| {
            groups(&files, r)
                .iter()
                .filter(|g| g.0 != "metadata" && g.3)
                .count()
        })
        .collect();
    println!("partition groups led per node: {led:?}");
    assert!(
        led.iter().all(|n| *n >= count as usize / NODES / 2),
        "partition groups led per node: {led:?}"
    );

    let views_after: Vec<u64> = (0..NODES).map(|r| metadata_view(&files, r)).collect();
    assert_eq!(
        views_before, views_after,
        "the metadata group changed views while the partition groups started"
    );
    // What the idle groups cost, for the record: CPU over 5 s, resident memory and open
    // files per node.
    let cpu = |pids: &[i32]| -> f64 { pids.iter().map(|p| cpu_seconds(*p)).sum() };
    let pids: Vec<i32> = daemons.iter().map(Daemon::pid).collect();
    let (t0, at) = (cpu(&pids), Instant::now());
    std::thread::sleep(Duration::from_secs(idle_secs()));
    let cores = (cpu(&pids) - t0) / at.elapsed().as_secs_f64();
    for pid in &pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let rss = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .unwrap_or("VmRSS: ?");
        let fds = open_files(*pid);
        println!("node {pid}: {rss}, {fds} open files");
        assert!(
            fds <= count as usize + OPEN_FILES_BESIDE_PARTITIONS,
            "node {pid}: {fds} open files for {count} new partitions"
        );
    }
    println!("idle, {count} partitions: the three nodes use {cores:.2} cores");

    // /stats and /metrics stay bounded: the metadata group first, counts over every
    // group; the full list on request.
    for replica in 0..NODES {
        let (bounded, bounded_bytes) = stats_at(&files, replica, "/stats");
        let listed = bounded["groups"].as_array().expect("groups").len();
        assert_eq!(listed, STATS_GROUPS_MAX.min(count as usize + 1));
        assert_eq!(bounded["groups"][0]["name"], "metadata");
        let summary = &bounded["group_summary"];
        assert_eq!(summary["total"], u64::from(count) + 1, "{summary}");
        assert_eq!(summary["listed"], listed as u64, "{summary}");
        assert_eq!(summary["without_quorum"], 0, "{summary}");
        let by_status: u64 = ["normal", "view_change", "recovering", "state_transfer"]
            .iter()
            .map(|s| summary[s].as_u64().unwrap_or(0))
            .sum();
        assert_eq!(by_status, u64::from(count) + 1, "{summary}");
        let (all, all_bytes) = stats_at(&files, replica, "/stats?groups=all");
        assert_eq!(
            all["groups"].as_array().expect("groups").len(),
            count as usize + 1
        );
        let (code, metrics) = http_get(files.http_addr(replica), "/metrics").expect("metrics");
        assert_eq!(code, 200);
        let series = metrics
            .lines()
            .filter(|l| l.starts_with("appliance_group_op{"))
            .count();
        assert_eq!(
            series, listed,
            "appliance_group_op series on node {replica}"
        );
        assert!(metrics.contains(&format!("appliance_groups_listed {listed}\n")));
        let asleep = summary["asleep"].as_u64().unwrap_or(0);
        println!(
            "node {replica}: {asleep} of {} groups asleep, {} silent-primary wakes",
            summary["total"], summary["silent_wakes"]
        );
        println!(
            "node {replica}: /stats {bounded_bytes} bytes ({listed} groups listed), \
             ?groups=all {all_bytes} bytes, /metrics {} bytes",
            metrics.len()
        );
    }

    // Every partition takes a message, and it reads back.
    for partition in 0..count {
        let key = PartitionKey {
            stream,
            topic,
            partition,
        };
        let batch = numbered_batch(u64::from(partition), 1, 64);
        let reply = client.send_messages(key, &batch).expect("send");
        assert_eq!(reply.base_offset, 0, "partition {partition}");
        let read = client
            .poll_messages(key, Consumer::Single(1), PollStrategy::Offset(0), 1)
            .expect("poll");
        let batches = split_poll_body(&read).expect("poll body");
        assert_eq!(batches.len(), 1, "partition {partition}");
        let message = batch::messages(batches[0].0).next().expect("a message");
        assert_eq!(message.offset, 0, "partition {partition}");
        assert_eq!(
            message.payload,
            &numbered_payload(u64::from(partition), 64)[..],
            "partition {partition}"
        );
    }

    // Written partitions close their prepare log once idle: one open file each again.
    let written = Instant::now();
    loop {
        let fds: Vec<usize> = pids.iter().map(|p| open_files(*p)).collect();
        if fds
            .iter()
            .all(|n| *n <= count as usize + OPEN_FILES_BESIDE_PARTITIONS)
        {
            println!(
                "open files per node {:?} after {:?} idle",
                fds,
                written.elapsed()
            );
            break;
        }
        assert!(
            written.elapsed() < Duration::from_secs(60),
            "open files per node {fds:?} for {count} partitions, 60 s after their writes"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // The node leading the most groups dies: the others take over every one of them
    // within the bound (each group's superblock writes of the view change run together,
    // not one group after another, each in place).
    let led = |r: usize| groups(&files, r).iter().filter(|g| g.3).count();
    let victim = (0..NODES).max_by_key(|r| led(*r)).expect("a node");
    let victims_groups = led(victim);
    let others: Vec<usize> = (0..NODES).filter(|r| *r != victim).collect();
    daemons[victim].kill();
    let killed = Instant::now();
    let failover = loop {
        let primaries: usize = others
            .iter()
            .map(|r| {
                groups(&files, *r)
                    .iter()
                    .filter(|g| g.3 && g.2 == "normal")
                    .count()
            })
            .sum();
        if primaries == count as usize + 1 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "{primaries} of {} groups with a primary 30 s after node {victim} died",
            count + 1
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    println!(
        "node {victim} (primary of {victims_groups} groups) killed: every group led by the \
         others after {failover:?}"
    );
    // heartbeat_timeout (500 ms) + 500 ms, the stats' publication interval (100 ms per
    // 500 groups) and this test's polling; and 1 ms per group the dead node led: each
    // of those groups writes its superblock (in place, one fdatasync) on both
    // survivors, in parallel on the blocking pool, twice (its vote, then the new view).
    // On a 2-core VM failovers of 2,001 groups took 1.3-1.8 s; writing each superblock
    // as a new file (temp file, rename, directory sync) took 2.1-4.7 s, one group after
    // another several times that.
    let published = Duration::from_millis(100 * (u64::from(count) / 500).max(1));
    let bound = Duration::from_millis(1_000 + 250 + victims_groups as u64) + published;
    assert!(
        failover <= bound,
        "failover of {victims_groups} groups took {failover:?} (bound {bound:?})"
    );

    // It comes back: its partitions, each holding a message, open off its loop and every
    // group is normal again.
    daemons[victim] = Daemon::start(&files, victim);
    let restarted = Instant::now();
    loop {
        // Not serving /stats until it opened its partitions.
        let serving = http_get(files.http_addr(victim), "/health").is_some();
        let list = if serving {
            groups(&files, victim)
        } else {
            Vec::new()
        };
        if list.len() == count as usize + 1 && list.iter().all(|g| g.2 == "normal") {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(120),
            "node {victim} after {:?}: {} groups, {} normal",
            restarted.elapsed(),
            list.len(),
            list.iter().filter(|g| g.2 == "normal").count()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!(
        "node {victim} restarted: every group normal after {:?}",
        restarted.elapsed()
    );
    let views_now: Vec<u64> = others.iter().map(|r| metadata_view(&files, *r)).collect();
    let mut survivors = library_client(&files, &others);
    survivors.register().expect("register");
    for partition in (0..count).step_by(37) {
        let key = PartitionKey {
            stream,
            topic,
            partition,
        };
        let read = survivors
            .poll_messages(key, Consumer::Single(2), PollStrategy::Offset(0), 1)
            .expect("poll");
        assert_eq!(
            split_poll_body(&read).expect("poll body").len(),
            1,
            "partition {partition} after the failover"
        );
    }
    println!("metadata views after the restart: {views_now:?}");
}

/// utime + stime of process `pid`, in clock ticks (100 a second on Linux).
/// Files a node holds open besides one per partition (journal, sockets, executors).
const OPEN_FILES_BESIDE_PARTITIONS: usize = 64;

/// Descriptors the process holds open.
fn open_files(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The (name, is_primary, asleep, view, status) of every group `replica` reports.
fn group_states(files: &ClusterFiles, replica: usize) -> Vec<(String, bool, bool, u64, String)> {
    let Some((200, body)) = http_get(files.http_addr(replica), "/stats?groups=all") else {
        return Vec::new();
    };
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    stats["groups"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|g| {
                    (
                        text(&g["name"]),
                        g["is_primary"] == true,
                        g["asleep"] == true,
                        g["view"].as_u64().unwrap_or(0),
                        text(&g["status"]),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Idle partition groups sleep (their nodes stop ticking them), and a sleeping group
/// still fails over within heartbeat_timeout + 500 ms when the node of its primary dies:
/// the backups hear that node's Commits, not the group's, and time the group's primary
/// out once the node is silent.
#[test]
fn a_sleeping_partition_group_fails_over_when_its_primary_node_dies() {
    let _one = one_cluster();
    const PARTITIONS: u32 = 30;
    // heartbeat_timeout of the test configs (common::ClusterFiles).
    const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(500);
    let files = ClusterFiles::new(NODES);
    let (mut daemons, mut client, stream) = start_with_stream(&files, "idle");
    let topic = client
        .create_topic(stream, "sleepy", PARTITIONS)
        .expect("topic");
    // One message in every partition, acknowledged before the groups sleep.
    let batch = numbered_batch(1, 1, 64);
    for partition in 0..PARTITIONS {
        let key = PartitionKey {
            stream,
            topic,
            partition,
        };
        assert_eq!(
            client.send_messages(key, &batch).expect("send").base_offset,
            0
        );
    }

    // Every node puts the idle partition groups to sleep (a node that leads partition
    // groups but not the metadata group keeps one of them awake: its Commits are the
    // node's liveness). The test takes a partition whose group sleeps on every node.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (primary, partition) = loop {
        let states: Vec<_> = (0..NODES).map(|r| group_states(&files, r)).collect();
        let asleep = |r: usize| {
            states[r]
                .iter()
                .filter(|g| g.0 != "metadata" && g.2)
                .count()
        };
        let everywhere_asleep = (0..PARTITIONS).find(|p| {
            let name = format!("{stream}/{topic}/{p}");
            (0..NODES).all(|r| states[r].iter().any(|g| g.0 == name && g.2))
        });
        if let Some(partition) =
            everywhere_asleep.filter(|_| (0..NODES).all(|r| asleep(r) + 2 >= PARTITIONS as usize))
        {
            let name = format!("{stream}/{topic}/{partition}");
            let primary = (0..NODES).find(|r| states[*r].iter().any(|g| g.0 == name && g.1));
            break (primary.expect("the partition's primary"), partition);
        }
        assert!(
            Instant::now() < deadline,
            "partition groups asleep per node: {:?}",
            (0..NODES).map(asleep).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let key = PartitionKey {
        stream,
        topic,
        partition,
    };
    let name = format!("{stream}/{topic}/{partition}");
    let view_before = group_states(&files, (primary + 1) % NODES)
        .into_iter()
        .find(|g| g.0 == name)
        .map(|g| g.3)
        .expect("the group");

    daemons[primary].kill();
    let killed = Instant::now();
    let others: Vec<usize> = (0..NODES).filter(|r| *r != primary).collect();
    let failover = loop {
        let elected = others.iter().any(|r| {
            group_states(&files, *r)
                .iter()
                .any(|g| g.0 == name && g.1 && g.3 > view_before && g.4 == "normal")
        });
        if elected {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "no new primary for {name} within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    println!(
        "sleeping group {name}: new primary {failover:?} after its primary's node was killed \
         (heartbeat timeout {HEARTBEAT_TIMEOUT:?})"
    );
    // /stats is published every 100 ms: the bound is checked to that precision.
    assert!(
        failover <= HEARTBEAT_TIMEOUT + Duration::from_millis(500) + Duration::from_millis(100),
        "failover took {failover:?}"
    );

    // The new primary takes writes; the acknowledged message of before reads back.
    let mut survivors = library_client(&files, &others);
    survivors.register().expect("register");
    let batch = numbered_batch(2, 1, 64);
    assert_eq!(
        survivors
            .send_messages(key, &batch)
            .expect("send")
            .base_offset,
        1
    );
    let read = survivors
        .poll_messages(key, Consumer::Single(1), PollStrategy::Offset(0), 2)
        .expect("poll");
    let messages: Vec<_> = split_poll_body(&read)
        .expect("poll body")
        .iter()
        .flat_map(|(bytes, _)| {
            batch::messages(bytes)
                .map(|m| m.payload.to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(
        messages,
        vec![numbered_payload(1, 64), numbered_payload(2, 64)]
    );
}
