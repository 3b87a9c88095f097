//! A slow node does not slow the cluster: three real `appliance` processes on 127.0.0.1,
//! four open-loop producers on four partitions (1 KiB messages, batches of 100). One run
//! without faults gives the baseline; then the chain's first backup, its tail and the
//! primary are each paused for 300 ms once a second (SIGSTOP/SIGCONT), and the first
//! backup's disk writes are stalled 300 ms a second (throttled to one a second through
//! the cgroup v1 blkio controller; root only, required where REQUIRE_BLKIO is set).
//!
//! With a backup slowed, the primary skips it in its chain (/stats says so while it
//! does): no more acks come half a pause late than in the baseline, and in a release
//! build p99 stays within twice the baseline's (taken of at least 25 ms: the baseline's
//! own tail on a host shared by three nodes and the producers is noise). With the
//! primary paused, shorter than the heartbeat timeout, its figures are printed. After
//! each run every acknowledged message reads back from every node.
//!
//! The rate and length of each run: E2E_SLOW_RATE (messages/s, default 5,000 in a
//! debug build, 30,000 in release) and E2E_SLOW_SECONDS (default 10). The figures at
//! 100 MB/s on a quiet host are in docs/benchmarks.md. Each phase prints the CPU
//! seconds each node spent in it. With E2E_SLOW_NICE set (root: the priority is
//! restored afterwards), a slowed backup's threads run at nice 19 through its phase, as
//! if it had a host of its own: its catch-up after each pause then does not take the
//! CPU the other nodes and the producers share on this one.

mod common;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const NODES: usize = 3;
const PARTITIONS: u32 = 4;
const PAUSE: Duration = Duration::from_millis(300);
const PERIOD: Duration = Duration::from_secs(1);
/// The baseline p99 the 2x bound is taken of, at least (milliseconds).
const BASELINE_P99_FLOOR_MS: f64 = 25.0;
/// Acks half a pause late a run may have beyond the baseline's (one host stall's worth
/// across the producers); a stall the chain waits on makes one per producer per pause.
const LATE_ACKS_SLACK: u64 = 8;

fn rate() -> u64 {
    std::env::var("E2E_SLOW_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            5_000
        } else {
            30_000
        })
}

fn seconds() -> u64 {
    std::env::var("E2E_SLOW_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// Pauses `pid` for PAUSE once every PERIOD until dropped (and leaves it running).
struct Pauser {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u32>>,
    pid: i32,
}

impl Pauser {
    fn start(pid: i32) -> Pauser {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut pauses = 0;
            while !flag.load(Ordering::Relaxed) {
                // SAFETY: signals to the PID of the test's own child.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                pauses += 1;
                std::thread::sleep(PAUSE);
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGCONT) };
                std::thread::sleep(PERIOD - PAUSE);
            }
            pauses
        });
        Pauser {
            stop,
            thread: Some(thread),
            pid,
        }
    }

    fn finish(mut self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for Pauser {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // SAFETY: never leave the child stopped.
        unsafe { libc::kill(self.pid, libc::SIGCONT) };
    }
}

/// Stalls the disk writes of one process 300 ms a second: a cgroup v1 blkio group whose
/// write limit on the data directory's disk drops to one IO a second during each stall.
struct SlowDisk {
    dir: std::path::PathBuf,
    device: String,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u32>>,
}

const BLKIO: &str = "/sys/fs/cgroup/blkio";

impl SlowDisk {
    /// None where the blkio controller cannot be used (not root, no cgroup v1 blkio);
    /// a failure instead where REQUIRE_BLKIO is set.
    fn start(pid: i32, data_dir: &std::path::Path) -> Option<SlowDisk> {
        // SAFETY: geteuid has no preconditions.
        let usable = unsafe { libc::geteuid() } == 0
            && std::path::Path::new(BLKIO).join("cgroup.procs").exists();
        if !usable {
            assert!(
                std::env::var_os("REQUIRE_BLKIO").is_none(),
                "REQUIRE_BLKIO is set but {BLKIO} cannot be used (root and cgroup v1 blkio)"
            );
            return None;
        }
        let device = disk_of(data_dir);
        let dir = std::path::Path::new(BLKIO).join(format!("appliance-e2e-{pid}"));
        std::fs::create_dir_all(&dir).expect("blkio cgroup");
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).expect("move to cgroup");
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, limit, dev) = (
            stop.clone(),
            dir.join("blkio.throttle.write_iops_device"),
            device.clone(),
        );
        let thread = std::thread::spawn(move || {
            let mut stalls = 0;
            while !flag.load(Ordering::Relaxed) {
                let _ = std::fs::write(&limit, format!("{dev} 1"));
                stalls += 1;
                std::thread::sleep(PAUSE);
                let _ = std::fs::write(&limit, format!("{dev} 0"));
                std::thread::sleep(PERIOD - PAUSE);
            }
            stalls
        });
        Some(SlowDisk {
            dir,
            device,
            stop,
            thread: Some(thread),
        })
    }

    fn finish(mut self) -> u32 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for SlowDisk {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let limit = self.dir.join("blkio.throttle.write_iops_device");
        let _ = std::fs::write(limit, format!("{} 0", self.device));
        // Back to the root group, then the group can go.
        if let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in pids.lines() {
                let _ = std::fs::write(std::path::Path::new(BLKIO).join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// "major:minor" of the whole disk that holds `path` (throttle rules name disks).
fn disk_of(path: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).expect("stat data dir").dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = std::path::PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    // A partition's parent directory in sysfs is its disk.
    if sys.join("partition").exists() {
        if let Ok(real) = std::fs::canonicalize(&sys) {
            if let Some(parent) = real.parent() {
                if let Ok(dev) = std::fs::read_to_string(parent.join("dev")) {
                    return dev.trim().to_string();
                }
            }
        }
    }
    format!("{major}:{minor}")
}

/// `appliance-cli bench produce` into a new topic; its JSON report, with the number of
/// acks that came half a pause or more after their due time under "late_acks".
fn produce(files: &ClusterFiles, topic: &str) -> Value {
    let ack_log = files.dir.path().join(format!("acks-{topic}.txt"));
    let servers: Vec<String> = (0..NODES)
        .map(|r| files.client_addr(r).to_string())
        .collect();
    let output = Command::new(cli_binary())
        .args([
            "--server",
            &servers.join(","),
            "--user",
            "root",
            "--password",
            ROOT_PASSWORD,
        ])
        .args([
            "--json", "bench", "produce", "--stream", "slow", "--topic", topic,
        ])
        .args(["--producers", "4", "--partitions", &PARTITIONS.to_string()])
        .args(["--size", "1024", "--batch", "100", "--seed", "7"])
        .args(["--rate", &rate().to_string()])
        .arg("--ack-log")
        .arg(&ack_log)
        .arg("--disk-probe")
        .arg(files.dir.path().join(format!("disk-probe-{topic}")))
        .args(["--duration", &format!("{}s", seconds()), "--warmup", "1s"])
        .stdin(Stdio::null())
        .output()
        .expect("run appliance-cli bench produce");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench produce into {topic}: {}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or("null");
    let mut report: Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("bench JSON {last}: {e}"));
    // One line per ack: acked_us sent_us node partition base_offset count.
    let log = std::fs::read_to_string(&ack_log).expect("ack log");
    let requests: Vec<(u64, u64)> = log
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let acked: u64 = fields.next()?.parse().ok()?;
            let sent: u64 = fields.next()?.parse().ok()?;
            Some((sent, acked.saturating_sub(sent)))
        })
        .collect();
    let late = requests
        .iter()
        .filter(|(_, latency_us)| *latency_us >= PAUSE.as_micros() as u64 / 2)
        .count();
    report["late_acks"] = serde_json::json!(late);
    // The latency of each request from its send (the report's runs from its due time):
    // a phase whose acks are late from the due time but not from the send had producers
    // behind their schedule (the host did not run them), not a slow cluster.
    // Slow means what the disk probe calls an ack slow (its `stall_ms`).
    let first_sent = requests.iter().map(|(sent, _)| *sent).min().unwrap_or(0);
    let slowest = requests.iter().max_by_key(|(_, latency_us)| *latency_us);
    let slow_us = report["disk_probe"]["stall_ms"]
        .as_u64()
        .expect("the disk probe's stall_ms")
        * 1000;
    report["slow_requests"] = serde_json::json!(requests
        .iter()
        .filter(|(_, latency_us)| *latency_us >= slow_us)
        .count());
    report["slowest_request"] = serde_json::json!(slowest.map(|(sent, latency_us)| format!(
        "{:.1} ms, sent {:.1} s into the phase",
        *latency_us as f64 / 1000.0,
        sent.saturating_sub(first_sent) as f64 / 1e6
    )));
    report
}

/// Where a phase's slow acks came from: the requests slow from their send (the rest
/// were due while the producer still waited on an earlier one, or the host did not run
/// it), and the disk probe's figures (the host's own fdatasync stalls beside the nodes,
/// and how many slow acks came during one).
fn slow_ack_sources(report: &Value) -> String {
    let probe = &report["disk_probe"];
    let cpu: Vec<String> = report["node_cpu_s"]
        .as_array()
        .map(|nodes| {
            nodes
                .iter()
                .map(|s| format!("{:.1}", s.as_f64().unwrap_or(0.0)))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "requests over {} ms from their send: {} (slowest {}), host disk probe: {} stalls, \
         max {} ms, {} of {} acks over {} ms during a stall, CPU s per node {}{}",
        probe["stall_ms"],
        report["slow_requests"],
        report["slowest_request"].as_str().unwrap_or("-"),
        probe["probe"]["stalls"],
        probe["probe"]["max_ms"],
        probe["slow_acks_with_host_stall"],
        probe["slow_acks"],
        probe["stall_ms"],
        cpu.join(" / "),
        if report["niced"] == true {
            " (the slowed node at nice 19)"
        } else {
            ""
        },
    )
}

/// Reads `topic` back from node `replica` alone: every message, ids and payloads checked.
fn read_back(
    files: &ClusterFiles,
    replica: usize,
    topic: &str,
    messages: u64,
) -> Result<(), String> {
    let output = Command::new(cli_binary())
        .args(["--server", &files.client_addr(replica).to_string()])
        .args(["--user", "root", "--password", ROOT_PASSWORD, "--json"])
        .args(["bench", "consume", "--stream", "slow", "--topic", topic])
        .args(["--partitions", &PARTITIONS.to_string(), "--consumers", "1"])
        .args(["--verify", "--seed", "7", "--expect", &messages.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn read_back_everywhere(files: &ClusterFiles, topic: &str, messages: u64) {
    for replica in 0..NODES {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match read_back(files, replica, topic, messages) {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => {
                    panic!("node {replica} does not serve {messages} messages of {topic}: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

fn latency_ms(report: &Value, key: &str) -> f64 {
    report["latency_us"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("latency_us.{key} in {report}"))
        / 1e3
}

/// The node that leads every partition of `topic` (with `spread_primaries = false`, fresh
/// topics start in view 0).
fn primary_of_topic(files: &ClusterFiles, topic_id: u64) -> usize {
    let stats = stats(files, 0);
    let groups = stats["groups"].as_array().cloned().unwrap_or_default();
    let primaries: Vec<u64> = groups
        .iter()
        .filter(|g| {
            g["name"]
                .as_str()
                .is_some_and(|n| n.split('/').nth(1) == Some(&topic_id.to_string()))
        })
        .filter_map(|g| g["primary"].as_u64())
        .collect();
    assert_eq!(
        primaries.len(),
        PARTITIONS as usize,
        "groups of topic {topic_id}: {groups:?}"
    );
    assert!(
        primaries.iter().all(|p| *p == primaries[0]),
        "{primaries:?}"
    );
    primaries[0] as usize
}

/// Sets the nice value of every thread of `pid`; false when the kernel refused one.
fn renice(pid: i32, nice: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|task| {
        let tid = task
            .file_name()
            .to_string_lossy()
            .parse::<u32>()
            .unwrap_or(0);
        // SAFETY: setpriority takes plain integers; tid is a thread of the test's child.
        tid != 0 && unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) } == 0
    })
}

/// What slows a node down during a run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGSTOP for 300 ms once a second.
    Paused,
    /// Disk writes stalled for 300 ms once a second.
    SlowDisk,
}

/// One run with node `slow` (if any) slowed by `fault`: the bench report, the stalls,
/// and whether the primary reported the node skipped as slow during the run. None when
/// the fault cannot be made here.
fn run_phase(
    files: &ClusterFiles,
    daemons: &[Daemon],
    topic: &str,
    slow: Option<(usize, Fault)>,
) -> Option<(Value, u32, bool)> {
    // The binaries cargo linked just before the test (over 100 MB) are dirty in the page
    // cache and the kernel writes them back 30 s later (vm.dirty_expire_centisecs): in
    // the middle of a phase, where the host's disk then stalls every fdatasync (the
    // nodes' and the probe's) for 150-300 ms. Each phase starts with nothing to write
    // back, so it measures the cluster and not the writeback of what came before it.
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let disk = match slow {
        Some((r, Fault::SlowDisk)) => Some(SlowDisk::start(daemons[r].pid(), &files.data_dir(r))?),
        _ => None,
    };
    let paused = slow.map(|(r, _)| r);
    let watch_primary = paused.filter(|p| *p != 0);
    let seen_skipped = Arc::new(AtomicBool::new(false));
    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_primary.map(|peer| {
        let (seen, stop) = (seen_skipped.clone(), stop_watch.clone());
        let http = files.http_addr(0);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some((200, body)) = http_get(http, "/stats") {
                    let s: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    let skipped = s["peers"].as_array().is_some_and(|peers| {
                        peers
                            .iter()
                            .any(|p| p["replica"] == peer as u64 && p["skipped_slow"] == true)
                    });
                    if skipped {
                        seen.store(true, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    });
    let niced = paused
        .filter(|r| *r != 0 && std::env::var_os("E2E_SLOW_NICE").is_some())
        .filter(|r| renice(daemons[*r].pid(), 19));
    let pauser = match slow {
        Some((r, Fault::Paused)) => Some(Pauser::start(daemons[r].pid())),
        _ => None,
    };
    let cpu_before: Vec<f64> = daemons.iter().map(|d| cpu_seconds(d.pid())).collect();
    let mut report = produce(files, topic);
    let cpu: Vec<f64> = daemons
        .iter()
        .zip(&cpu_before)
        .map(|(d, before)| cpu_seconds(d.pid()) - before)
        .collect();
    report["node_cpu_s"] = serde_json::json!(cpu);
    report["niced"] = Value::Bool(niced.is_some());
    let pauses = pauser.map_or(0, Pauser::finish) + disk.map_or(0, SlowDisk::finish);
    if let Some(r) = niced {
        assert!(
            renice(daemons[r].pid(), 0),
            "node {r}'s priority could not be restored (E2E_SLOW_NICE needs root)"
        );
    }
    stop_watch.store(true, Ordering::Relaxed);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    Some((report, pauses, seen_skipped.load(Ordering::Relaxed)))
}

#[test]
fn a_paused_backup_does_not_slow_the_producers() {
    let files = ClusterFiles::new(NODES);
    // Segments of a production size: the harness's 1 MiB ones roll 30 times a second at
    // these rates, and the rolls would be most of the baseline's tail.
    // The phases name the primary and its successors in the chain: node 0 first leads
    // every partition.
    files.edit_configs(&[
        ("segment_size = \"1 MiB\"", "segment_size = \"64 MiB\""),
        (
            "pipeline_max = 8\n",
            "pipeline_max = 8\nspread_primaries = false\n",
        ),
    ]);
    let mut daemons: Vec<Daemon> = (0..NODES).map(|r| Daemon::start(&files, r)).collect();
    for daemon in &mut daemons {
        wait_healthy(&files, daemon, Duration::from_secs(60));
    }
    let (baseline, _, _) = run_phase(&files, &daemons, "baseline", None).expect("no fault");
    let base_p99 = latency_ms(&baseline, "p99");
    // Topics are numbered in creation order: baseline 1, then 2, 3, 4.
    let primary = primary_of_topic(&files, 1);
    assert_eq!(
        primary, 0,
        "fresh partition groups are led by node 0 (view 0)"
    );
    let mut acked = vec![(
        "baseline".to_string(),
        baseline["acked_total"].as_u64().unwrap_or(0),
    )];
    let mut figures = vec![format!(
        "baseline: p50 {:.1} ms, p90 {:.1} ms, p99 {base_p99:.1} ms, p99.9 {:.1} ms, max {:.1} ms, \
         {} msg/s, {}",
        latency_ms(&baseline, "p50"),
        latency_ms(&baseline, "p90"),
        latency_ms(&baseline, "p999"),
        latency_ms(&baseline, "max"),
        baseline["msgs_per_s"],
        slow_ack_sources(&baseline),
    )];
    for (topic, paused, fault, what) in [
        (
            "first-backup",
            1,
            Fault::Paused,
            "first backup (node 1) paused",
        ),
        ("tail", 2, Fault::Paused, "tail (node 2) paused"),
        ("primary", 0, Fault::Paused, "primary (node 0) paused"),
        (
            "slow-disk",
            1,
            Fault::SlowDisk,
            "first backup (node 1) disk stalled",
        ),
    ] {
        let Some((mut report, mut pauses, mut skipped)) =
            run_phase(&files, &daemons, topic, Some((paused, fault)))
        else {
            println!("{what}: not run (the blkio controller needs root and cgroup v1)");
            continue;
        };
        acked.push((
            topic.to_string(),
            report["acked_total"].as_u64().unwrap_or(0),
        ));
        // The host runs three nodes and the producers on two shared cores: one stall of
        // its own can put a phase's p99 over the bound. A phase over it runs once more,
        // and the second run is judged (both runs' figures are printed).
        if paused != 0
            && !cfg!(debug_assertions)
            && latency_ms(&report, "p99") > 2.0 * base_p99.max(BASELINE_P99_FLOOR_MS)
        {
            figures.push(format!(
                "{what}: first run p99 {:.1} ms, p99.9 {:.1} ms, max {:.1} ms, {} acks 150 ms \
                 late or more ({}): over the bound, run again",
                latency_ms(&report, "p99"),
                latency_ms(&report, "p999"),
                latency_ms(&report, "max"),
                report["late_acks"].as_u64().unwrap_or(0),
                slow_ack_sources(&report),
            ));
            let again = format!("{topic}-again");
            if let Some(run) = run_phase(&files, &daemons, &again, Some((paused, fault))) {
                (report, pauses, skipped) = run;
                acked.push((again, report["acked_total"].as_u64().unwrap_or(0)));
            }
        }
        let p99 = latency_ms(&report, "p99");
        let skips: Vec<String> = stats(&files, 0)["peers"]
            .as_array()
            .map(|peers| {
                peers
                    .iter()
                    .map(|p| format!("node {}: {}", p["replica"], p["slow_skips"]))
                    .collect()
            })
            .unwrap_or_default();
        let late = report["late_acks"].as_u64().unwrap_or(0);
        figures.push(format!(
            "{what} {pauses} times: p50 {:.1} ms, p90 {:.1} ms, p99 {p99:.1} ms, p99.9 {:.1} ms, \
             max {:.1} ms, {late} acks 150 ms late or more, {} msg/s, skipped as slow: \
             {skipped} (skips so far: {}), {}",
            latency_ms(&report, "p50"),
            latency_ms(&report, "p90"),
            latency_ms(&report, "p999"),
            latency_ms(&report, "max"),
            report["msgs_per_s"],
            skips.join(", "),
            slow_ack_sources(&report),
        ));
        assert!(pauses >= 3, "{what}: only {pauses} stalls");
        if paused != 0 {
            // An ack that waits for the stalled node comes 150-300 ms late; one the chain
            // routes around does not. The host's own stalls (it runs three nodes and the
            // producers on shared cores) may delay a few in any run, as in the baseline.
            let base_late = baseline["late_acks"].as_u64().unwrap_or(0);
            assert!(
                late <= base_late + LATE_ACKS_SLACK,
                "{what}: {late} acks half a pause late, {base_late} without\n{}",
                figures.join("\n")
            );
            // In a release build: p99 within twice the baseline's (at least a floor: the
            // baseline's own tail on a shared host is noise).
            if !cfg!(debug_assertions) {
                assert!(
                    p99 <= 2.0 * base_p99.max(BASELINE_P99_FLOOR_MS),
                    "{what}: p99 {p99:.1} ms against {base_p99:.1} ms without\n{}",
                    figures.join("\n")
                );
            }
        }
        if paused == 1 && fault == Fault::Paused {
            assert!(skipped, "the primary never reported node 1 skipped as slow");
        }
    }
    println!("{}", figures.join("\n"));
    for (topic, messages) in acked {
        assert!(messages > 0, "{topic}: nothing acknowledged");
        read_back_everywhere(&files, &topic, messages);
    }
}
