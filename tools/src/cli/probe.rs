//! The disk probe of `appliance-cli bench produce --disk-probe FILE`: while producers
//! run, a thread of its own writes 4 KiB to a side file and fdatasyncs it every 50 ms,
//! so a slow ack can be told apart: the host's disk stalled at the same time, or the
//! appliance stalled on its own.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use super::CliError;

/// Time between the starts of two probe writes.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// Bytes per probe write: one page, as small as a write to a disk gets.
const PROBE_BYTES: usize = 4096;
/// An ack or a probe write slower than this is a stall.
pub const STALL: Duration = Duration::from_millis(50);
/// Probe writes cycle over this many pages of the side file (it never grows past it).
const PROBE_PAGES: u64 = 256;
/// Slow acks listed one by one in the report (all are counted).
const LISTED_MAX: usize = 50;

/// One probe write: when it started and how long the write and its fdatasync took, in
/// microseconds since the epoch and microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub start_us: u64,
    pub latency_us: u64,
}

/// A running probe; [`DiskProbe::stop`] ends it and hands back its samples.
pub struct DiskProbe {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Vec<Sample>, String>>,
    path: PathBuf,
}

impl DiskProbe {
    /// Creates `path` (it must not exist: the probe never overwrites a file it did not
    /// make) and starts writing to it.
    pub fn start(path: &Path) -> Result<DiskProbe, CliError> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| CliError::runtime(format!("--disk-probe {}: {e}", path.display())))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("disk-probe".into())
            .spawn(move || probe(&file, &flag))
            .map_err(|e| CliError::runtime(format!("--disk-probe thread: {e}")))?;
        Ok(DiskProbe {
            stop,
            thread,
            path: path.to_path_buf(),
        })
    }

    /// Stops the probe, removes its file, and returns every sample taken.
    pub fn stop(self) -> Result<Vec<Sample>, CliError> {
        self.stop.store(true, Ordering::Relaxed);
        let samples = self
            .thread
            .join()
            .map_err(|_| CliError::runtime("the disk probe thread panicked"))?;
        let _ = std::fs::remove_file(&self.path);
        samples.map_err(|e| CliError::runtime(format!("--disk-probe {}: {e}", self.path.display())))
    }
}

/// Wall-clock microseconds: the clock of the probe's samples and of the ack log, so the
/// two compare.
pub(super) fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn probe(file: &File, stop: &AtomicBool) -> Result<Vec<Sample>, String> {
    let page = vec![0xa5u8; PROBE_BYTES];
    let mut samples = Vec::new();
    let mut next = Instant::now();
    let mut k = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let start_us = epoch_us();
        file.write_all_at(&page, (k % PROBE_PAGES) * PROBE_BYTES as u64)
            .map_err(|e| format!("write: {e}"))?;
        file.sync_data().map_err(|e| format!("fdatasync: {e}"))?;
        samples.push(Sample {
            start_us,
            latency_us: started.elapsed().as_micros() as u64,
        });
        k += 1;
        next += PROBE_INTERVAL;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            // Behind after a stall: start again from now rather than bursting.
            next = now;
        }
    }
    Ok(samples)
}

/// An ack's window: from the batch's due time to its ack, microseconds since the epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckWindow {
    pub due_us: u64,
    pub acked_us: u64,
}

/// Whether one of the stalled probe writes overlaps `window`.
fn host_stalled(stalls: &[Sample], window: AckWindow) -> bool {
    stalls
        .iter()
        .any(|s| s.start_us < window.acked_us && s.start_us + s.latency_us > window.due_us)
}

/// The probe's figures and every ack slower than [`STALL`], each marked with whether the
/// host's disk stalled at the same time; `max_quiet_ms` is the slowest ack during which
/// the probe saw no stall (the appliance's own worst case).
pub fn attribute(samples: &[Sample], acks: &[AckWindow]) -> Value {
    let stall = STALL.as_micros() as u64;
    let mut latencies: Vec<u64> = samples.iter().map(|s| s.latency_us).collect();
    latencies.sort_unstable();
    let quantile = |q: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let at = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[at] as f64 / 1000.0
    };
    // Only the stalled writes can excuse an ack: each ack is held against those few,
    // not against every sample of the run.
    let stalls: Vec<Sample> = samples
        .iter()
        .filter(|s| s.latency_us > stall)
        .copied()
        .collect();
    let mut slow = Vec::new();
    let (mut with_host, mut max_quiet_us) = (0u64, 0u64);
    for ack in acks {
        let latency = ack.acked_us.saturating_sub(ack.due_us);
        let host = host_stalled(&stalls, *ack);
        if !host {
            max_quiet_us = max_quiet_us.max(latency);
        }
        if latency > stall {
            with_host += u64::from(host);
            slow.push((ack.due_us, latency, host));
        }
    }
    let listed: Vec<Value> = slow
        .iter()
        .take(LISTED_MAX)
        .map(|(due_us, latency, host)| {
            json!({"due_us": due_us, "latency_ms": *latency as f64 / 1000.0, "host_stall": host})
        })
        .collect();
    json!({
        "probe": {
            "samples": samples.len(),
            "interval_ms": PROBE_INTERVAL.as_millis() as u64,
            "p50_ms": quantile(0.5),
            "p99_ms": quantile(0.99),
            "max_ms": latencies.last().map_or(0.0, |l| *l as f64 / 1000.0),
            "stalls": stalls.len(),
        },
        "stall_ms": STALL.as_millis() as u64,
        "slow_acks": slow.len(),
        "slow_acks_with_host_stall": with_host,
        "max_quiet_ms": max_quiet_us as f64 / 1000.0,
        "slow_acks_listed": listed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(start_ms: u64, latency_ms: u64) -> Sample {
        Sample {
            start_us: start_ms * 1000,
            latency_us: latency_ms * 1000,
        }
    }

    fn ack(due_ms: u64, acked_ms: u64) -> AckWindow {
        AckWindow {
            due_us: due_ms * 1000,
            acked_us: acked_ms * 1000,
        }
    }

    #[test]
    fn a_slow_ack_is_the_hosts_only_when_a_stalled_probe_write_overlaps_it() {
        let samples = [
            sample(0, 2),
            sample(50, 2),
            sample(100, 180),
            sample(300, 3),
        ];
        let acks = [
            ack(10, 12),   // fast
            ack(120, 260), // 140 ms, during the probe's 180 ms write: the host's
            ack(400, 475), // 75 ms, the probe quiet: the appliance's own
            ack(290, 299), // fast, after the stall
        ];
        let report = attribute(&samples, &acks);
        assert_eq!(report["slow_acks"], 2);
        assert_eq!(report["slow_acks_with_host_stall"], 1);
        assert_eq!(report["max_quiet_ms"], 75.0);
        assert_eq!(report["probe"]["stalls"], 1);
        assert_eq!(report["probe"]["max_ms"], 180.0);
        let listed = report["slow_acks_listed"].as_array().unwrap();
        assert_eq!(listed[0]["host_stall"], true);
        assert_eq!(listed[1]["host_stall"], false);
        assert_eq!(listed[1]["latency_ms"], 75.0);
    }

    #[test]
    fn a_probe_stall_that_ended_before_the_batch_was_due_does_not_excuse_it() {
        let samples = [sample(0, 100)];
        let report = attribute(&samples, &[ack(100, 190)]);
        assert_eq!(report["slow_acks_with_host_stall"], 0);
        assert_eq!(report["max_quiet_ms"], 90.0);
    }

    #[test]
    fn the_probe_writes_and_syncs_its_own_file_and_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe");
        let probe = DiskProbe::start(&path).unwrap();
        assert!(
            DiskProbe::start(&path).is_err(),
            "an existing file is never reused"
        );
        std::thread::sleep(PROBE_INTERVAL * 3);
        let samples = probe.stop().unwrap();
        assert!(samples.len() >= 2, "{samples:?}");
        assert!(samples.windows(2).all(|w| w[0].start_us < w[1].start_us));
        assert!(!path.exists());
    }
}
