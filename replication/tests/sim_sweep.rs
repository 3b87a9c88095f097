//! The CI sweep: a fixed set of seeds across fault mixes (loss 0-30%, duplication,
//! reordering, partitions, crashes, torn and corrupted writes) on 3 and 5 replicas and
//! both planes, plus every seed that ever found a bug.

use replication::sim::{partition_plane_group, run_seed, SimOptions};

/// A seed as the sweeps run it now.
fn sweep(seed: u64, replicas: u8, ticks: u64, partition: bool) {
    run(SimOptions::from_seed(seed, replicas, ticks), partition);
}

/// A seed that found a bug, as it ran then: before journal appends past the head were
/// deferred (`SimOptions::defer_gaps`), unless the seed was found with them.
fn check(seed: u64, replicas: u8, ticks: u64, partition: bool) {
    run(before_deferred_gaps(seed, replicas, ticks), partition);
}

fn before_deferred_gaps(seed: u64, replicas: u8, ticks: u64) -> SimOptions {
    let mut options = SimOptions::from_seed(seed, replicas, ticks);
    options.defer_gaps = false;
    options
}

/// A seed as it ran before groups started in views other than 0 (the seeds that found
/// bugs then replay the same run).
fn check_in_view_zero(seed: u64, replicas: u8, ticks: u64, partition: bool) {
    let mut options = before_deferred_gaps(seed, replicas, ticks);
    options.initial_view = 0;
    options.superblock_lag_max = 0;
    run(options, partition);
}

/// A seed with the fault mix it had before lost disks were simulated (the seeds that
/// found bugs then replay the same run).
fn check_without_wipes(seed: u64, replicas: u8, ticks: u64, partition: bool) {
    let mut options = before_deferred_gaps(seed, replicas, ticks);
    options.initial_view = 0;
    options.wipe_percent = 0;
    options.formation = false;
    options.slow_per_10k = 0;
    options.hibernate = false;
    options.superblock_lag_max = 0;
    run(options, partition);
}

/// A seed with the fault mix it had before slow nodes were simulated.
fn check_without_slow_nodes(seed: u64, replicas: u8, ticks: u64, partition: bool) {
    let mut options = before_deferred_gaps(seed, replicas, ticks);
    options.initial_view = 0;
    options.slow_per_10k = 0;
    options.hibernate = false;
    options.superblock_lag_max = 0;
    run(options, partition);
}

/// A seed as it ran before superblock writes took time (`SimOptions::superblock_lag_max`).
fn check_before_superblock_lag(seed: u64, replicas: u8, ticks: u64, partition: bool) {
    let mut options = before_deferred_gaps(seed, replicas, ticks);
    options.superblock_lag_max = 0;
    run(options, partition);
}

fn run(mut options: SimOptions, partition: bool) {
    if partition {
        options.group = partition_plane_group();
    }
    let (seed, replicas, ticks) = (options.seed, options.replica_count, options.ticks);
    let wipes = options.wipe_percent > 0 || options.formation;
    let slow = options.slow_per_10k > 0;
    let view = options.initial_view;
    let lag = options.superblock_lag_max > 0;
    let gaps = options.defer_gaps;
    if let Err(failure) = run_seed(options) {
        panic!(
            "{failure}\nreplay: cargo run -p replication --release --bin appliance-sim -- \
             --seed {seed} --replicas {replicas} --ticks {ticks} --initial-view {view}{}{}{}{}{}",
            if partition { " --partition" } else { "" },
            if gaps { "" } else { " --no-defer-gaps" },
            if wipes { "" } else { " --no-wipes" },
            if slow || !wipes { "" } else { " --no-slow" },
            if lag || !wipes || !slow {
                ""
            } else {
                " --no-superblock-lag"
            }
        );
    }
}

#[test]
fn sweep_300_seeds_three_replicas() {
    for seed in 0..150 {
        sweep(seed, 3, 2_000, false);
    }
}

#[test]
fn sweep_300_seeds_five_replicas() {
    for seed in 1_000..1_100 {
        sweep(seed, 5, 2_000, false);
    }
}

#[test]
fn sweep_300_seeds_partition_plane() {
    for seed in 2_000..2_050 {
        sweep(seed, 3, 2_000, true);
    }
}

/// Seeds that found bugs; each stays as a regression test.
#[test]
fn regression_seeds() {
    // 31: a restarted replica re-requested verified-looking ops forever instead of the op
    // blocking its hash-chain walk.
    check_without_wipes(31, 3, 5_000, false);
    // 115: a retried Register was prepared twice, minting a second session; the client's
    // requests were then evicted and re-applied under the new session.
    check_without_wipes(115, 3, 5_000, false);
    // 1 and 3 (partition plane): stamp positions were lost on re-commit after a restart,
    // so the primary refused every SendMessages as PipelineFull.
    check_without_wipes(1, 3, 5_000, true);
    check_without_wipes(3, 3, 5_000, true);
    // Checkpoint restarts and state transfer: 10 and 20 asked for state transfer once
    // peers had checkpointed past them (now installed), 150 found its source's anchor
    // corrupt, 55 (5 replicas) had two lagging replicas feeding each other partial ranges
    // forever; 3 (partition plane) re-applied a retried request after a checkpoint
    // restart lost the client table (checkpoints now carry it).
    check_without_wipes(10, 3, 5_000, false);
    check_without_wipes(20, 3, 5_000, false);
    check_without_wipes(150, 3, 5_000, false);
    check_without_wipes(55, 5, 5_000, false);
    // 2043: every replica held op 6 but none op 5 (a gap-jumped prepare, the primary's
    // copy lost in a crash): the merge could neither truncate nor repair op 5. A short DVC
    // suffix now nacks the op just below it.
    check_without_wipes(2043, 3, 5_000, false);
    // 2890 (found once probes stopped backing off): an old primary in a view change got
    // the range evicted, installed a peer's checkpoint and restarted from it with its
    // own journal above, whose ops came from the truncated view-0 branch; the chain walk
    // displaced the committed anchor. Entries that do not chain from the anchor go.
    check_without_wipes(2890, 3, 5_000, false);
    // 936: a restarted replica whose top journal entry was corrupt dropped it and later
    // nacked that (committed) op in a DVC: divergence. Unreadable entries above the log now
    // stay "maybe prepared" and raise the DVC op.
    check_without_wipes(936, 3, 5_000, false);
    // 157: replicas with unreadable top entries withheld their DVCs waiting for a
    // StartView nobody could send (deadlock).
    check_without_wipes(157, 3, 5_000, false);
    // 2711 (5 replicas): the same withheld-DVC deadlock.
    check_without_wipes(2711, 5, 5_000, false);
    // 12093: an op only an unreadable journal entry claimed could be neither repaired nor
    // truncated (lower log_view replicas did not count as nacks although their logs ended
    // below it).
    check_without_wipes(12093, 3, 5_000, false);
    // 993 (5 replicas, once DVCs were broadcast as documented): every replica held op
    // 126 but not 124 or 125; a contiguous suffix could only nack 125, leaving 124 headless
    // and the view change stuck. DVCs now vouch for a whole window above their commit.
    check_without_wipes(993, 5, 5_000, false);
    // 244 (5 replicas) and 186: with headers only above the commit, a forming primary kept
    // its own stale header for a committed op: divergence. DVC bodies carry the committed
    // headers below the window too, and the merged head must be a canonical header.
    check_without_wipes(244, 5, 5_000, false);
    check_without_wipes(186, 3, 5_000, false);
    check_without_wipes(186, 3, 5_000, true);
    // 296 (5 replicas, 30000 ticks): a replica far behind repaired one op per repair tick
    // (it asked for the ops above the walk's blocker instead of below it) and did not
    // converge in the bound. Repair now fetches below the blocker and continues on
    // RepairDone.
    check_without_wipes(296, 5, 30_000, false);
    // 58012 (found by a 40,000-seed sweep): the old primary of the canonical view lost
    // (unreadable) an op it prepared in that view; no replica knew its header, and a
    // replica of an older log_view holding another header at that op was not counted
    // as a nack. An op without a canonical header was prepared in the canonical view,
    // which only replicas normal in it acknowledge.
    check_without_wipes(58012, 3, 5_000, false);
    // 870844 (50,000 ticks, both planes) and 810098 (partition plane, 20,000 ticks): a
    // backup acknowledged an op of a later view above stale entries of an older one,
    // then restarted from a checkpoint (its own, or one installed by state transfer);
    // every journal entry above the first that did not chain from the checkpoint was
    // dropped, the acknowledged one with them, and its DVC nacked it: a committed op
    // truncated. Only entries provably off the committed chain are dropped now.
    check_without_wipes(870844, 3, 50_000, false);
    check_without_wipes(870844, 3, 50_000, true);
    check_without_wipes(810098, 3, 20_000, true);
    // 103798 (50,000 ticks, a cluster formed from formatted replicas): a stale superblock
    // suffix named another prepare at the checkpoint's own op, which displaced the
    // committed anchor at a restart from that checkpoint.
    check_without_slow_nodes(103798, 3, 50_000, false);
    // 307092 (20,000 ticks): a replica that lost only its superblock held the one intact
    // copy of a committed op; as a non-voter it served no repair, and the forming
    // primary kept asking a peer that had committed past the op without its body. A
    // non-voter serves the prepares it holds (then answers RangeEvicted op 0), and the
    // forming primary also asks peers other than those that committed past the op.
    check_without_slow_nodes(307092, 3, 20_000, false);
    // 1015327: the simulator corrupted the one voter's copy of a committed op while the
    // other copy was on a wiped disk, counting a third replica's uncommitted prepare at
    // that op as a copy (a fault beyond what 3 replicas survive). Only copies of the
    // committed prepare count now.
    check_without_slow_nodes(1015327, 3, 5_000, false);
    // 1115469 (20,000 ticks; 1150016 and 1156923 on older code): while a replica had lost
    // its superblock, the simulator corrupted a deposed primary's uncommitted prepare, its
    // only copy, on one of the two voters; that voter could never vouch for the op, so no
    // view could form (a fault beyond what 3 replicas survive with one recovering). While
    // a replica may not vote, only the committed prepare itself is corrupted now.
    check_in_view_zero(1115469, 3, 20_000, false);
    // 500166 and 1000236 (50,000 ticks, partition plane): a crash tore the write of an
    // uncommitted op whose only other copy was corrupted on the second replica of the
    // view. Neither could vouch for or nack the op, so no view change ended (a fault
    // beyond what 3 replicas survive). A crash never tears a write at an op unreadable on
    // another replica now.
    check_in_view_zero(500166, 3, 50_000, true);
    check_in_view_zero(1000236, 3, 50_000, true);
    // 1011929: a restarted replica of an older log view had an unreadable uncommitted
    // entry in its DVC window and withheld its DVC until repair, which no peer could
    // serve (that prepare was never in a later view); the two voters of the latest log
    // view could neither truncate nor fetch an op only one of them claimed, unreadable.
    // A DVC now ends below the op its sender cannot vouch for instead.
    check_in_view_zero(1011929, 3, 5_000, false);
    // 11186 (once a Commit that tells a sleeping backup nothing new no longer woke it): a
    // replica restarted on a new disk caught up as a replacement and voted once it had
    // applied the ops its lost state had acknowledged, before its journal held them
    // durably; it crashed, restarted without one, nacked it in a view change with a peer
    // that never had it, and a committed op was truncated. A replacement votes only once
    // those ops are durable.
    check_in_view_zero(11186, 3, 5_000, false);
    // 770 (the group starting in view 5): a backup missed one prepare and acked the next
    // ones; a view change persisted its suffix, which ends at that hole, and it restarted
    // from a checkpoint below it. The ops under the hole, one of them committed with its
    // ack, had no identity after the restart, and once the primary lost its disk no view
    // change could complete. A restart now places them by their own prepares.
    check_before_superblock_lag(770, 3, 5_000, false);
    // 104989 (5 replicas; once a forming primary took the view as its log view at the
    // merge): the merge decided only op 8, and the primary's own op 6, prepared in an
    // older view and replaced by the op that committed, went on under the merged view.
    // Its later DVCs outranked the committed op 6; two replicas adopted the stale header
    // and waited for its body for good. A merge now forgets the headers it did not decide.
    check_before_superblock_lag(104989, 5, 5_000, false);
    // 16 (2,000 ticks; once replicas released the prepare of their commit point): the
    // released op stayed marked after commit moved past it, so every later checkpoint
    // tried to read it back, a lagging replica's state transfer found no source and it
    // never caught up. Past the commit point a released op is evicted like those below.
    check_before_superblock_lag(16, 3, 2_000, false);
    // 24740 (once replicas also dropped committed ops from memory): a replica installed
    // a peer's checkpoint at op 81 with view 6's suffix headers of ops 83 and 84 in its
    // superblock, so it knew op 82 only by identity. Merging view 8 with a replica of
    // log view 3 that held ops 82-84, the unknown canonical header made the older DVC
    // count as a nack: ops 82-84, committed in view 3, were truncated. The merge now
    // takes an op's header from any DVC whose header the canonical op above names as
    // its parent.
    check_before_superblock_lag(24740, 3, 5_000, false);
    // 41981: a forming primary merged view 8 to op 3, persisted log view 8 and crashed
    // before its view started, its journal still holding view 2's op 4. Restarted, it
    // read op 4 back above its log, claimed it as possibly acknowledged, and no merge
    // with the one other voter could decide it: views changed for good. The merge now
    // truncates the journal to the merged log, as a StartView's receiver does.
    check_before_superblock_lag(41981, 3, 5_000, false);
    // 1036 (once a superblock write took time): a formed replica crashed with the write
    // that recorded its formation still in flight, so it came back unformed; the
    // simulator had counted it as a voter and let a second replica lose its disk, which
    // left one voter and no way to recover. The fault budget now counts what is durable.
    check(1036, 3, 5_000, false);
    // 17757 and 1055 (5 replicas), once replies waited for the applied result: a
    // checkpoint taken while Commit actions waited behind a superblock write kept a
    // session still waiting for its op's result; restarted from it, the replica never
    // applied that op again and answered the client's retry "in progress" for good. A
    // checkpoint now settles such a session, and the simulator checkpoints and offers a
    // state only once its Commit actions ran, as the appliance does.
    check(17757, 3, 5_000, false);
    check(1055, 5, 5_000, false);
    // 7 and 30, once journals deferred appends past their head (`SimOptions::defer_gaps`):
    // a lost-disk replacement got an op past its journal's head, deferred, then committed
    // it from memory; the core asked again only for ops above the commit point, so the
    // op stayed a hole in its journal and the replacement, which votes only once every
    // op it stands in for is durable, never voted again. The core now asks again for
    // every op it holds that was not reported durable. With the asking again removed
    // altogether, 30 (both planes) finds the livelock first seen end to end: commit stuck
    // at 15 while the group cycled through 200 views (a backup's deferred append was
    // never journaled, so its PrepareOk never went out). The simulator found neither
    // before it deferred appends as the appliance does.
    sweep(7, 3, 5_000, false);
    sweep(30, 3, 5_000, false);
    sweep(30, 3, 5_000, true);
    // 100264 (50,000 ticks, partition plane): the primary of view 38 prepared ops
    // 184-187; a backup got 186 and 187 but never 185, and the primary restarted unable
    // to vouch for 185. A merge of the two found no header for 185 and kept it anyway
    // (one nack of the two needed), so the forming primary waited for a body nobody
    // could send; it persisted its log view with a suffix ending at the hole, crashed,
    // and could vouch for nothing after: views changed for the remaining 50,000 ticks.
    // A merge now waits for more DVCs while a kept op has no header (the third replica,
    // of an older log view, nacks it).
    sweep(100_264, 3, 50_000, true);
}

/// Sleeping idle replicas (`vsr/hibernate.rs`): seeds that found liveness bugs.
#[test]
fn sleeping_replicas_regressions() {
    // 2336, 11243: a wiped replica restarted as the primary of the current view, and
    // the sleeping backups, hearing its node, never timed it out (it only probed). A
    // peer's restart now starts a new epoch: a backup sleeps only once it heard its
    // primary's Commit in the primary's current epoch (and a Commit sent just before
    // the crash no longer arrives after the restart, as on a real connection).
    check_in_view_zero(2336, 3, 5_000, false);
    check_in_view_zero(11243, 5, 5_000, false);
    // 4671: a new primary re-prepared an op its backups had committed in an earlier
    // view; they never ack such an op, its pipeline stalled and it stopped its Commits,
    // but its node was heard, so the sleeping backups never replaced it. The node no
    // longer vouches for a primary whose Prepare came after its last Commit.
    check_in_view_zero(4671, 3, 5_000, true);
    // 157: a replica cut off during a view change slept in the old view while the new
    // primary slept too, with no client request to wake either (the clients' idle
    // stretch outlived the fault phase). Sleeping primaries now broadcast their Commit
    // periodically (a refresh), and the clients resume when the faults stop.
    check_in_view_zero(157, 3, 5_000, false);
}

/// Long fault phases (the default alone missed a divergence), with lost disks.
#[test]
fn sweep_long_fault_phases() {
    for seed in 3_000..3_004 {
        sweep(seed, 3, 50_000, false);
    }
    for seed in 3_100..3_102 {
        sweep(seed, 3, 50_000, true);
    }
    sweep(3_200, 5, 50_000, false);
}

#[test]
fn one_seed_replays_exactly() {
    let run = || run_seed(SimOptions::from_seed(7, 3, 2_000)).expect("seed 7 passes");
    assert_eq!(run(), run());
    let run = || run_seed(SimOptions::from_seed(8, 5, 2_000)).expect("seed 8 passes");
    assert_eq!(run(), run());
}
