//! Crash test with real processes: `journal-crash-writer` appends prepares and bumps the
//! superblock, printing each write once durable; this driver SIGKILLs it at random
//! points (at least `KILLS_MIN` times) and after each kill checks, with the offline
//! verifier, that every acknowledged entry is intact and only an unacknowledged tail is
//! gone.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use journal::data_dir::SNAPSHOTS_DIR;
use journal::inspect::{journal_verify, superblock};
use journal::snapshot::load_checkpoint;
use journal::SlotStatus;

/// Kills the test requires.
const KILLS_MIN: u32 = 200;
/// Bound on iterations (some runs may end before the kill lands).
const RUNS_MAX: u32 = 400;
/// Upper bound of the random delay before the kill.
const KILL_DELAY_MAX_US: u64 = 60_000;

const WRITER: &str = env!("CARGO_BIN_EXE_journal-crash-writer");

/// Kills and reaps the child by PID even when the test fails.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sigkill(pid: u32) {
    // SAFETY: kill(2) on our own child's PID; the child is not reaped until the guard
    // waits, so the PID cannot be reused meanwhile.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGKILL);
    }
}

/// The metadata state the writer snapshots at `op` (same as in the writer).
fn state_of(op: u64) -> Vec<u8> {
    format!("metadata state at op {op};")
        .repeat(100)
        .into_bytes()
}

#[derive(Default)]
struct Ledger {
    /// Acknowledged ops still above the checkpoint, with their identity.
    acked: BTreeMap<u64, u128>,
    /// Highest op ever acknowledged.
    op_acked_max: u64,
    /// Highest view acknowledged written to the superblock.
    view_acked: u32,
    checkpoint: u64,
}

impl Ledger {
    fn absorb(&mut self, line: &str) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ack", op, checksum] => {
                let op: u64 = op.parse().unwrap();
                let checksum = u128::from_str_radix(checksum, 16).unwrap();
                self.acked.insert(op, checksum);
                self.op_acked_max = self.op_acked_max.max(op);
            }
            ["view", view] => self.view_acked = self.view_acked.max(view.parse().unwrap()),
            ["checkpoint", op] => {
                self.checkpoint = op.parse().unwrap();
                let keep = self.acked.split_off(&(self.checkpoint + 1));
                self.acked = keep;
            }
            ["recovered", _head, checkpoint, _faulty] => {
                // A kill may land after a checkpoint is durable but before it is printed.
                let checkpoint: u64 = checkpoint.parse().unwrap();
                assert!(
                    checkpoint >= self.checkpoint,
                    "recovered checkpoint went back"
                );
                self.absorb(&format!("checkpoint {checkpoint}"));
            }
            _ => panic!("unexpected writer output {line:?}"),
        }
    }

    /// Every acknowledged write is intact; only an unacknowledged tail may be gone.
    fn check(&self, dir: &Path, run: u32) {
        let sb = superblock(dir).unwrap();
        let current = sb
            .current
            .unwrap_or_else(|| panic!("run {run}: superblock lost: {sb:?}"));
        assert!(
            current.view >= self.view_acked,
            "run {run}: acked view {} lost",
            self.view_acked
        );
        assert!(
            current.op_checkpoint >= self.checkpoint,
            "run {run}: checkpoint went back"
        );
        // The snapshot the superblock names is there and intact.
        let snapshot = load_checkpoint(&dir.join(SNAPSHOTS_DIR), &current)
            .unwrap_or_else(|e| panic!("run {run}: checkpoint snapshot lost: {e}"));
        if current.op_checkpoint > 0 {
            let (info, payload) = snapshot.unwrap_or_else(|| panic!("run {run}: no snapshot"));
            assert_eq!(info.op, current.op_checkpoint);
            assert_eq!(
                payload,
                state_of(current.op_checkpoint),
                "run {run}: snapshot content"
            );
        }
        let report = journal_verify(dir).unwrap();
        let recovery = &report.recovery;
        assert!(
            recovery.faulty.is_empty(),
            "run {run}: a crash made ops faulty: {recovery:?}"
        );
        assert!(
            recovery.op_head >= self.op_acked_max,
            "run {run}: head {} below acked op {}",
            recovery.op_head,
            self.op_acked_max
        );
        let slot_count = report.layout.slot_count;
        for (&op, &checksum) in self.acked.range(current.op_checkpoint + 1..) {
            match recovery.slots[(op % slot_count) as usize] {
                SlotStatus::Valid {
                    op: found,
                    checksum: c,
                    ..
                } if found == op && c == checksum => {}
                other => panic!("run {run}: acked op {op} not intact: {other:?}"),
            }
        }
    }
}

/// Runs the writer in `mode` over and over, SIGKILLing each run after a random delay,
/// until `KILLS_MIN` kills landed. Every output line goes to `absorb`; `check` runs after
/// each kill. Returns the kills.
fn kill_runs(
    mode: &str,
    dir: &Path,
    mut absorb: impl FnMut(&str, u32),
    mut check: impl FnMut(u32),
) -> u32 {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("{mode} crash test seed {seed} (rerun with CRASH_SEED={seed})");
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut kills, mut runs) = (0, 0);
    while kills < KILLS_MIN {
        runs += 1;
        assert!(runs <= RUNS_MAX, "only {kills} kills in {RUNS_MAX} runs");
        let child = Command::new(WRITER)
            .args([mode, dir.to_str().unwrap(), &runs.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut guard = ChildGuard(child);
        let pid = guard.0.id();
        let delay = Duration::from_micros(rng.u64(0..KILL_DELAY_MAX_US));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(delay);
            sigkill(pid);
        });
        let stdout = guard.0.stdout.take().unwrap();
        for line in BufReader::new(stdout).lines() {
            absorb(&line.unwrap(), runs);
        }
        killer.join().unwrap();
        let status = guard.0.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        if status.signal() != Some(libc::SIGKILL) {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut guard.0.stderr.take().unwrap(), &mut stderr)
                .unwrap();
            panic!("run {runs}: writer exited on its own ({status}): {stderr}");
        }
        kills += 1;
        check(runs);
    }
    kills
}

#[test]
fn acknowledged_journal_entries_survive_random_sigkills() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let status = Command::new(WRITER)
        .args(["format", dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let ledger = std::cell::RefCell::new(Ledger::default());
    let kills = kill_runs(
        "run",
        dir.path(),
        |line, run| {
            if let Some(rest) = line.strip_prefix("recovered ") {
                let faulty: usize = rest.split_whitespace().nth(2).unwrap().parse().unwrap();
                assert_eq!(faulty, 0, "run {run}: writer recovered faulty ops");
            }
            ledger.borrow_mut().absorb(line);
        },
        |run| ledger.borrow().check(dir.path(), run),
    );
    let ledger = ledger.into_inner();
    eprintln!(
        "{kills} kills, {} ops acknowledged, checkpoint {}, {:?}",
        ledger.op_acked_max,
        ledger.checkpoint,
        started.elapsed()
    );
    assert!(
        ledger.op_acked_max > 2 * 32,
        "too little progress to exercise wrapping"
    );
}

/// Acknowledged batches: base offset to (next offset, batch_checksum).
#[derive(Default)]
struct SegmentLedger {
    acked: BTreeMap<u64, (u64, u64)>,
    next_acked_max: u64,
    start: u64,
}

impl SegmentLedger {
    fn absorb(&mut self, line: &str) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["ack", base, next, checksum] => {
                let next: u64 = next.parse().unwrap();
                let checksum = u64::from_str_radix(checksum, 16).unwrap();
                self.acked.insert(base.parse().unwrap(), (next, checksum));
                self.next_acked_max = self.next_acked_max.max(next);
            }
            ["retained", start] | ["recovered", _, start] => {
                self.start = self.start.max(start.parse().unwrap());
                self.acked = self.acked.split_off(&self.start);
            }
            _ => panic!("unexpected writer output {line:?}"),
        }
    }

    fn check(&self, dir: &Path, run: u32) {
        use journal::segment::{PartitionConfig, PartitionLog};
        let config = PartitionConfig {
            segment_size_max: 64 * 1024,
            index_interval_bytes: 4096,
            durability: journal::Durability::EveryBatch,
        };
        journal::runtime::raise_memlock(64 << 20);
        journal::runtime::block_on(async {
            let (log, _) = PartitionLog::open(dir, 77, config)
                .await
                .unwrap_or_else(|e| panic!("run {run}: partition does not open: {e}"));
            assert!(
                log.next_offset() >= self.next_acked_max,
                "run {run}: next offset {} below acked {}",
                log.next_offset(),
                self.next_acked_max
            );
            for (&base, &(next, checksum)) in self.acked.range(log.start_offset()..) {
                let batches = log.read_from_offset(base, 1).unwrap();
                let info = replication::wire::batch::verify(&batches[0]).unwrap();
                let stored = u64::from_le_bytes(batches[0][40..48].try_into().unwrap());
                assert_eq!(
                    (info.base_offset, info.next_offset(), stored),
                    (base, next, checksum),
                    "run {run}: acked batch at {base} not intact"
                );
            }
            log.close().await.unwrap();
        })
        .unwrap();
    }
}

/// SIGKILLs the writer in segment `mode` at random points; every acknowledged batch must
/// be intact after each kill, and the runs must get far enough to roll and retain.
fn segment_batches_survive_random_sigkills(mode: &str) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let started = Instant::now();
    let ledger = std::cell::RefCell::new(SegmentLedger::default());
    let kills = kill_runs(
        mode,
        dir.path(),
        |line, _| ledger.borrow_mut().absorb(line),
        |run| ledger.borrow().check(dir.path(), run),
    );
    let ledger = ledger.into_inner();
    eprintln!(
        "{mode}: {kills} kills, next offset {} acknowledged, start {}, {:?}",
        ledger.next_acked_max,
        ledger.start,
        started.elapsed()
    );
    assert!(
        ledger.start > 0,
        "too little progress to exercise roll and retention"
    );
}

#[test]
fn acknowledged_segment_batches_survive_random_sigkills() {
    segment_batches_survive_random_sigkills("segments");
}

#[test]
fn acknowledged_batches_of_planned_writes_beside_syncs_survive_random_sigkills() {
    // The daemon's group commit path: coalesced planned writes, each beside the sync of
    // the one before it, a batch acknowledged only after a later-started sync.
    segment_batches_survive_random_sigkills("planned");
}
