use super::*;
use replication::wire::{Header, PrepareChain, PrepareHeader};

/// Chained prepares of ops `1..=count`; `salt` makes a different prepare of each op
/// (a partition prepare's identity covers its header, not its body).
fn prepares(count: u64, salt: u8) -> Vec<Frame> {
    let mut chain = PrepareChain::after(0);
    (1..=count)
        .map(|op| {
            let mut header = PrepareHeader::new();
            header.op = op;
            header.group = 7;
            header.timestamp = u64::from(salt);
            chain.append(&mut header, &[salt; 16])
        })
        .collect()
}

/// A journal holding ops `1..=head`, none of them the op asked, none applied.
fn at(head: u64) -> JournalAt {
    JournalAt {
        head,
        empty: head == 0,
        committed_op: 0,
        identity: None,
    }
}

fn staged_ops(lane: &Lane) -> Vec<u64> {
    lane.staged().iter().map(|(op, _)| *op).collect()
}

/// The staged prepares' (op, identity), the first `count` of them.
fn plan(lane: &Lane, count: usize) -> Vec<(u64, u128)> {
    lane.staged()[..count]
        .iter()
        .map(|(op, frame)| (*op, frame.checksum()))
        .collect()
}

fn ops(io: &InFlight) -> Vec<u64> {
    io.ops.iter().map(|(op, _)| *op).collect()
}

#[test]
fn an_append_that_extends_the_journal_is_staged_and_one_that_does_not_goes_alone() {
    let frames = prepares(6, 0);
    let mut lane = Lane::default();
    assert_eq!(
        lane.append(1, frames[0].clone(), at(0)),
        Append::Staged { full: false }
    );
    // Follows the last staged prepare, not the journal's head.
    assert_eq!(
        lane.append(2, frames[1].clone(), at(0)),
        Append::Staged { full: false }
    );
    // A gap past the staged ones.
    assert_eq!(lane.append(4, frames[3].clone(), at(0)), Append::OnItsOwn);
    assert_eq!(staged_ops(&lane), [1, 2]);

    // Below the journal's head, or at or below its commit point: alone.
    let mut lane = Lane::default();
    assert_eq!(lane.append(3, frames[2].clone(), at(5)), Append::OnItsOwn);
    let committed = JournalAt {
        committed_op: 6,
        ..at(5)
    };
    assert_eq!(
        lane.append(6, frames[5].clone(), committed),
        Append::OnItsOwn
    );
    assert_eq!(
        lane.append(6, frames[5].clone(), at(5)),
        Append::Staged { full: false }
    );
}

#[test]
fn an_append_asked_again_is_not_staged_twice_and_a_new_prepare_replaces_the_staged() {
    let frames = prepares(3, 0);
    let other = prepares(3, 1);
    let mut lane = Lane::default();
    for (op, frame) in (1..).zip(&frames) {
        lane.append(op, frame.clone(), at(0));
    }
    assert_eq!(
        lane.append(2, frames[1].clone(), at(0)),
        Append::StagedAlready
    );
    assert_eq!(staged_ops(&lane), [1, 2, 3]);
    // Another prepare of op 2 (a new view's): the staged 2 and 3 go, it takes 2's place.
    assert_eq!(
        lane.append(2, other[1].clone(), at(0)),
        Append::Staged { full: false }
    );
    assert_eq!(staged_ops(&lane), [1, 2]);
    assert_eq!(lane.staged()[1].1.checksum(), other[1].checksum());
}

#[test]
fn a_journaled_prepare_is_reported_now_unless_its_sync_is_pending() {
    let frames = prepares(2, 0);
    let journaled = |op: usize| JournalAt {
        identity: Some(frames[op - 1].checksum()),
        ..at(2)
    };
    let mut lane = Lane::default();
    assert_eq!(
        lane.append(1, frames[0].clone(), journaled(1)),
        Append::Journaled { report_now: true }
    );
    // Op 2 written, its sync not done: reported with the sync, not now.
    lane.stage_alone(2, frames[1].clone());
    lane.planned(plan(&lane, 1), false, Instant::now());
    assert_eq!(
        lane.append(2, frames[1].clone(), journaled(2)),
        Append::Journaled { report_now: false }
    );
    assert_eq!(lane.write_done(true), None);
    assert_eq!(
        lane.append(2, frames[1].clone(), journaled(2)),
        Append::Journaled { report_now: false }
    );
    lane.start_sync(Instant::now());
    assert_eq!(ops(&lane.sync_done()), [2]);
    assert_eq!(
        lane.append(2, frames[1].clone(), journaled(2)),
        Append::Journaled { report_now: true }
    );
    assert!(lane.idle());
}

#[test]
fn a_full_lane_says_so() {
    let frames = prepares(STAGED_OPS_MAX as u64, 0);
    let mut lane = Lane::default();
    for (op, frame) in (1..).zip(&frames) {
        let full = op as usize == STAGED_OPS_MAX;
        assert_eq!(
            lane.append(op, frame.clone(), at(0)),
            Append::Staged { full }
        );
    }
}

#[test]
fn a_sync_covers_only_the_writes_completed_before_it_started() {
    let frames = prepares(4, 0);
    let mut lane = Lane::default();
    let t0 = Instant::now();
    lane.append(1, frames[0].clone(), at(0));
    lane.append(2, frames[1].clone(), at(0));
    lane.planned(plan(&lane, 2), false, t0);
    assert!(lane.unwritten(1) && lane.in_flight(2) && !lane.write_startable());
    // Staged while the write runs: the next write.
    lane.append(3, frames[2].clone(), at(2));
    assert_eq!(lane.write_done(true), None);
    assert!(!lane.unwritten(2) && lane.in_flight(2) && lane.unwritten(3));
    lane.start_sync(Instant::now());
    lane.planned(plan(&lane, 1), false, Instant::now());
    assert!(lane.io_in_flight() && !lane.sync_startable());
    assert_eq!(lane.write_done(true), None);
    // The sync in flight started before op 3 was written: it reports 1 and 2 only,
    // with the start of their write.
    let synced = lane.sync_done();
    assert_eq!((ops(&synced), synced.since), (vec![1, 2], t0));
    assert!(lane.sync_startable() && !lane.idle());
    lane.start_sync(Instant::now());
    assert_eq!(ops(&lane.sync_done()), [3]);
    assert!(lane.idle() && !lane.io_in_flight());
}

#[test]
fn without_a_sync_per_batch_a_write_reports_its_ops() {
    let frames = prepares(2, 0);
    let mut lane = Lane::default();
    lane.append(1, frames[0].clone(), at(0));
    lane.append(2, frames[1].clone(), at(0));
    lane.planned(plan(&lane, 2), false, Instant::now());
    let written = lane.write_done(false).expect("durable as written");
    assert_eq!(ops(&written), [1, 2]);
    assert!(lane.idle() && !lane.sync_startable());
}

#[test]
fn a_plan_takes_a_prefix_and_a_refusal_drops_the_rest() {
    let frames = prepares(4, 0);
    let mut lane = Lane::default();
    for (op, frame) in (1..).zip(&frames) {
        lane.append(op, frame.clone(), at(0));
    }
    lane.planned(plan(&lane, 1), false, Instant::now());
    assert_eq!(staged_ops(&lane), [2, 3, 4]);
    lane.write_done(true);
    lane.planned(plan(&lane, 1), true, Instant::now());
    assert!(staged_ops(&lane).is_empty() && lane.in_flight(2) && !lane.in_flight(3));
    lane.write_done(true);
    // Refused at once: nothing written, nothing staged.
    lane.append(3, frames[2].clone(), at(2));
    lane.planned(Vec::new(), true, Instant::now());
    assert!(!lane.write_startable() && !lane.in_flight(3));
}

#[test]
fn a_failed_lane_reports_nothing_of_the_io_in_flight() {
    let frames = prepares(2, 0);
    let mut lane = Lane::default();
    lane.append(1, frames[0].clone(), at(0));
    lane.planned(plan(&lane, 1), false, Instant::now());
    lane.write_done(true);
    lane.start_sync(Instant::now());
    lane.append(2, frames[1].clone(), at(1));
    lane.planned(plan(&lane, 1), false, Instant::now());
    // The write meets a full disk; the sync completes after.
    lane.failed_done(Io::Write);
    lane.fail();
    lane.failed_done(Io::Sync);
    assert!(lane.failed() && !lane.io_in_flight());
}

#[test]
#[should_panic(expected = "a write completed that was not in flight")]
fn a_write_completion_with_no_write_in_flight_panics() {
    Lane::default().write_done(true);
}

#[test]
#[should_panic(expected = "a sync completed that was not in flight")]
fn a_sync_completion_with_no_sync_in_flight_panics() {
    Lane::default().sync_done();
}

#[test]
#[should_panic(expected = "a sync started while one is in flight or nothing is written")]
fn a_sync_with_nothing_written_panics() {
    Lane::default().start_sync(Instant::now());
}

#[test]
#[should_panic(expected = "a write planned while one is in flight")]
fn a_second_write_in_flight_panics() {
    let frames = prepares(2, 0);
    let mut lane = Lane::default();
    lane.append(1, frames[0].clone(), at(0));
    lane.planned(plan(&lane, 1), false, Instant::now());
    lane.append(2, frames[1].clone(), at(1));
    lane.planned(plan(&lane, 1), false, Instant::now());
}

#[test]
#[should_panic(expected = "not the lane's staged prepares in order")]
fn a_plan_of_other_prepares_panics() {
    let frames = prepares(2, 0);
    let mut lane = Lane::default();
    lane.append(1, frames[0].clone(), at(0));
    lane.append(2, frames[1].clone(), at(0));
    lane.planned(vec![(2, frames[1].checksum())], false, Instant::now());
}

#[test]
#[should_panic(expected = "needs an idle lane")]
fn a_prepare_alone_beside_staged_ones_panics() {
    let frames = prepares(2, 0);
    let mut lane = Lane::default();
    lane.append(1, frames[0].clone(), at(0));
    lane.stage_alone(2, frames[1].clone());
}

/// A small deterministic generator (xorshift64*), so a seed replays exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Random interleavings of appends, plans, completions and syncs against a model of the
/// disk: each op is reported durable once, in op order, and only by a sync that started
/// after its write completed; draining reports every staged op.
#[test]
fn random_interleavings_report_each_op_once_after_a_sync_that_followed_its_write() {
    const OPS: u64 = 300;
    for seed in 1..=200u64 {
        let frames = prepares(OPS, 0);
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut lane = Lane::default();
        let (mut next, mut head) = (1u64, 0u64);
        // Step each op's write completed at, and the step the sync in flight started at.
        let mut written_at = vec![u64::MAX; OPS as usize + 1];
        let mut sync_started = 0;
        let mut reported = Vec::new();
        for step in 1.. {
            if next > OPS && lane.idle() {
                break;
            }
            assert!(step < 100_000, "seed {seed}: the lane never drained");
            match rng.below(5) {
                0 | 1 if next <= OPS => {
                    let appended = lane.append(next, frames[next as usize - 1].clone(), at(head));
                    assert!(matches!(appended, Append::Staged { .. }), "seed {seed}");
                    next += 1;
                }
                2 if lane.write_startable() => {
                    let count = 1 + rng.below(lane.staged().len() as u64) as usize;
                    lane.planned(plan(&lane, count), false, Instant::now());
                    head += count as u64;
                }
                3 if lane.io_in_flight() => {
                    let write = lane.writing.is_some();
                    if write && (lane.syncing.is_none() || rng.below(2) == 0) {
                        let ops: Vec<u64> = lane.writing.as_ref().map(ops).unwrap();
                        assert_eq!(lane.write_done(true), None);
                        for op in ops {
                            written_at[op as usize] = step;
                        }
                    } else if lane.syncing.is_some() {
                        let synced = lane.sync_done();
                        for (op, _) in synced.ops {
                            assert!(written_at[op as usize] < sync_started, "seed {seed}");
                            reported.push(op);
                        }
                    }
                }
                4 if lane.sync_startable() => {
                    lane.start_sync(Instant::now());
                    sync_started = step;
                }
                _ => {}
            }
        }
        assert_eq!(reported, (1..=OPS).collect::<Vec<_>>(), "seed {seed}");
    }
}

#[test]
fn a_prepare_on_its_own_is_journaled_truncated_for_deferred_or_refused_as_its_journal_says() {
    let id = 0xabc;
    let held = JournalAt {
        identity: Some(id),
        ..at(9)
    };
    assert_eq!(alone(5, id, held), Alone::Journaled);
    assert_eq!(alone(10, id, at(9)), Alone::Append);
    assert_eq!(
        alone(1, id, at(0)),
        Alone::Append,
        "the first op of an empty journal"
    );
    assert_eq!(
        alone(12, id, at(9)),
        Alone::Deferred,
        "a gap above the head"
    );
    let other = JournalAt {
        identity: Some(0xdef),
        ..at(9)
    };
    assert_eq!(
        alone(5, id, other),
        Alone::Truncate,
        "another prepare of op 5"
    );
    // After truncating after op 4 the journal's head is 4 and op 5 is not held.
    assert_eq!(alone(5, id, at(4)), Alone::Append);
    let committed = JournalAt {
        committed_op: 6,
        ..other
    };
    assert_eq!(alone(5, id, committed), Alone::Committed);
    assert_eq!(alone(7, id, committed), Alone::Truncate);
    // Below the journal's first record (records 50..=60 after a checkpoint): nothing
    // to truncate, a gap. Asking to truncate here would ask again forever.
    let above = JournalAt {
        head: 60,
        empty: false,
        committed_op: 40,
        identity: None,
    };
    assert_eq!(alone(45, id, above), Alone::Deferred);
    // Truncated after op 4 with the journal's records starting above it: empty now, and
    // op 5 leaves a gap below it.
    let emptied = JournalAt {
        head: 0,
        empty: true,
        committed_op: 0,
        identity: None,
    };
    assert_eq!(alone(5, id, emptied), Alone::Deferred);
    // Truncated after op 4 with op 4 kept: op 5 extends it.
    assert_eq!(alone(5, id, at(4)), Alone::Append);
}
