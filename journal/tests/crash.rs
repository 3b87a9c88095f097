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

use journal::inspect::{journal_verify, superblock};
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

#[test]
fn acknowledged_entries_survive_random_sigkills() {
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("crash test seed {seed} (rerun with CRASH_SEED={seed})");
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let status = Command::new(WRITER)
        .args(["format", dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());

    let started = Instant::now();
    let mut ledger = Ledger::default();
    let (mut kills, mut runs) = (0, 0);
    while kills < KILLS_MIN {
        runs += 1;
        assert!(runs <= RUNS_MAX, "only {kills} kills in {RUNS_MAX} runs");
        let child = Command::new(WRITER)
            .args(["run", dir.path().to_str().unwrap(), &runs.to_string()])
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
        let mut recovered = false;
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("recovered ") {
                recovered = true;
                let faulty: usize = rest.split_whitespace().nth(2).unwrap().parse().unwrap();
                assert_eq!(faulty, 0, "run {runs}: writer recovered faulty ops");
            }
            ledger.absorb(&line);
        }
        killer.join().unwrap();
        let status = guard.0.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        if status.signal() == Some(libc::SIGKILL) {
            kills += 1;
        } else {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut guard.0.stderr.take().unwrap(), &mut stderr)
                .unwrap();
            panic!(
                "run {runs}: writer exited on its own ({status}, recovered={recovered}): {stderr}"
            );
        }
        ledger.check(dir.path(), runs);
    }
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
