//! The many-group simulator in CI: every node hosts the metadata group and partition
//! groups in one `Groups` with idle groups asleep, under node crashes, partitions, a
//! lossy network, slow nodes and corrupted journal entries; each group's history is
//! checked, and at the end the groups led by the node that crashes, most of them asleep,
//! must fail over and commit.

use replication::sim::{run_many, ManyOptions};

fn check(seed: u64, replicas: u8, ticks: u64, partitions: u32) -> replication::sim::ManySummary {
    let mut options = ManyOptions::from_seed(seed, replicas, ticks);
    options.partitions = partitions;
    run(options, "")
}

/// As `check`, with the fault mix of seeds found before nodes were slow now and then
/// and journal entries corrupted.
fn check_without_slow(seed: u64, replicas: u8, ticks: u64, partitions: u32) {
    let mut options =
        ManyOptions::from_seed(seed, replicas, ticks).without_slow_nodes_or_corruption();
    options.partitions = partitions;
    run(options, " --no-slow");
}

fn run(options: ManyOptions, flags: &str) -> replication::sim::ManySummary {
    let (seed, replicas, ticks, partitions) = (
        options.seed,
        options.replica_count,
        options.ticks,
        options.partitions,
    );
    match run_many(options) {
        Ok(summary) => summary,
        Err(failure) => panic!(
            "{failure}\nreplay: cargo run -p replication --release --bin appliance-sim -- \
             --seed {seed} --replicas {replicas} --ticks {ticks} --groups {partitions}{flags}"
        ),
    }
}

#[test]
fn many_groups_sweep_three_replicas() {
    let (mut asleep, mut silent_wakes, mut slow_stretches, mut slow_skips) = (0, 0, 0, 0);
    let mut corruptions = 0;
    for seed in 0..40 {
        let summary = check(seed, 3, 3_000, 24);
        // The crashed node led groups, and every one of them was elected elsewhere.
        assert!(summary.failover_groups > 0, "seed {seed}: {summary:?}");
        asleep += summary.failover_asleep;
        silent_wakes += summary.silent_wakes;
        slow_stretches += summary.slow_stretches;
        slow_skips += summary.slow_skips;
        corruptions += summary.corruptions;
    }
    // Nodes were slow, and primaries skipped their backups on them.
    assert!(slow_stretches > 10, "{slow_stretches} slow stretches");
    assert!(slow_skips > 10, "{slow_skips} backups skipped as slow");
    assert!(corruptions > 10, "{corruptions} journal entries corrupted");
    // The sweep reaches what it is for: sleeping groups whose primary's node went silent.
    assert!(
        asleep > 100,
        "{asleep} sleeping groups in the failover checks"
    );
    assert!(
        silent_wakes > 100,
        "{silent_wakes} wakes by a silent primary"
    );
}

#[test]
fn many_groups_sweep_five_replicas() {
    for seed in 1_000..1_015 {
        check(seed, 5, 3_000, 24);
    }
}

/// Many more idle groups than busy ones, and longer.
#[test]
fn many_groups_two_hundred_partitions() {
    for seed in 2_000..2_003 {
        let summary = check(seed, 3, 5_000, 200);
        assert!(
            summary.failover_asleep * 10 >= summary.failover_groups * 8,
            "seed {seed}: most groups of the crashed node slept: {summary:?}"
        );
    }
}

/// Seeds that found bugs; each stays as a regression test.
#[test]
fn many_groups_regression_seeds() {
    // An idle group failed over back to a node that had led it at the same commit point:
    // the new primary counted its Commit broadcasts of the earlier view and slept before
    // its backups heard it lead, so they elected another primary every heartbeat timeout
    // for good (group 100100018 cycled through view changes at op 0). The run has
    // changed since with the fix below; the bug itself is pinned by the unit test
    // `a_primary_that_led_before_at_the_same_commit_is_heard_in_its_new_view`.
    check_without_slow(6601, 3, 5_000, 24);
    // A formatted node (disk lost) whose group had changed views but never prepared an op
    // formed as a member in the group's first view: with a member that missed view 11
    // (which the lost disk had led) it elected a primary of view 9 and committed an op
    // that the primary of view 13, elected with the member of view 11, dropped.
    check_without_slow(30_001, 3, 20_000, 200);
    // A forming primary merged a DVC quorum holding the log of view 2 (from a node that
    // then lost its disk) but never started view 3, and kept claiming log_view 1. In the
    // next view changes its DVC and that of the primary of view 1, cut off all along,
    // both claimed log_view 1 with different prepares at op 6: every merge refused them,
    // and busy group 100100001 stayed without a primary.
    check_without_slow(8_241, 3, 5_000, 24);
}
