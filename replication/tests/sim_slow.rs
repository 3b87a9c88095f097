//! Slow nodes in the simulator: a backup paused for long stretches does not slow the
//! cluster (commits flow at the rate of the fastest quorum), a merely slower backup is
//! never skipped, a skipped backup is taken back once it keeps up, and a primary that
//! stalls past the heartbeat timeout is replaced.

use replication::sim::{
    partition_plane_group, run_slow_node, SlowNodeReport, SlowNodeRun, Slowness,
};
use replication::wire::METADATA_GROUP;

fn run(
    seed: u64,
    replica_count: u8,
    slow: Option<u8>,
    kind: Slowness,
    slow_ticks: u64,
    group: u64,
) -> SlowNodeReport {
    let run = SlowNodeRun {
        seed,
        replica_count,
        slow,
        kind,
        slow_ticks,
        period_ticks: 1_000,
        ticks: 10_000,
        clients: 4,
        group,
    };
    run_slow_node(run).unwrap_or_else(|e| panic!("seed {seed}: {e}"))
}

/// A backup paused 300 of every 1,000 ticks (the heartbeat timeout is 300): wherever it
/// stands in the chain, commits keep the pace and the latency of the cluster without it.
#[test]
fn a_paused_backup_does_not_slow_the_cluster() {
    for (seed, group) in [
        (0, METADATA_GROUP),
        (1, METADATA_GROUP),
        (2, partition_plane_group()),
    ] {
        for n in [3u8, 5] {
            let base = run(seed, n, None, Slowness::Paused, 0, group);
            assert_eq!(
                base.skips, 0,
                "seed {seed}, {n} replicas, no slow node: {base:?}"
            );
            for distance in 1..n {
                let slow = run(seed, n, Some(distance), Slowness::Paused, 300, group);
                let what = format!(
                    "seed {seed}, {n} replicas, backup +{distance}: {slow:?} against {base:?}"
                );
                assert!(slow.commits * 10 >= base.commits * 9, "{what}");
                assert!(slow.p99 <= 2 * base.p99, "{what}");
                assert_eq!(slow.view_changes, 0, "{what}");
                // Only a backup the quorum waits on is skipped (one of the first n/2 of
                // the chain), once, and it is back in the chain once the pauses stop.
                let waited_on = distance <= n / 2;
                assert_eq!(slow.skips, u64::from(waited_on), "{what}");
                assert_eq!(slow.skipped_at_end, 0, "{what}");
            }
        }
    }
}

/// A backup whose every packet and write takes 2 to 8 ticks more (up to twice the
/// others' latency) is slower, not stalled: it is never skipped.
#[test]
fn a_merely_slower_backup_is_never_skipped() {
    for seed in 10..13 {
        for n in [3u8, 5] {
            for extra_ticks in [2, 4, 8] {
                let slow = run(
                    seed,
                    n,
                    Some(1),
                    Slowness::Laggy { extra_ticks },
                    1_000,
                    METADATA_GROUP,
                );
                assert_eq!(
                    slow.skips, 0,
                    "seed {seed}, {n} replicas, +{extra_ticks}: {slow:?}"
                );
                assert_eq!(slow.view_changes, 0, "seed {seed}: {slow:?}");
            }
        }
    }
}

/// A primary paused longer than the heartbeat timeout is replaced, and the cluster goes
/// on committing.
#[test]
fn a_primary_stalled_past_the_heartbeat_timeout_is_replaced() {
    for n in [3u8, 5] {
        let base = run(20, n, None, Slowness::Paused, 0, METADATA_GROUP);
        let slow = run(20, n, Some(0), Slowness::Paused, 600, METADATA_GROUP);
        assert!(slow.view_changes > 0, "{slow:?}");
        assert!(
            slow.commits * 2 >= base.commits,
            "{slow:?} against {base:?}"
        );
    }
}

/// A backup skipped in the middle of a 5-replica chain still gets each prepare from its
/// predecessor and forwards it, late, to the replica after it, which has it from the
/// primary already: that replica receives it twice but does not send it on again, so
/// the rest of the chain receives each prepare once.
#[test]
fn a_backup_skipped_mid_chain_sends_duplicates_to_one_replica_only() {
    for (seed, group) in [(0, METADATA_GROUP), (2, partition_plane_group())] {
        let slow = run(seed, 5, Some(2), Slowness::Paused, 300, group);
        // Skipped for the whole run, so about one duplicate per op (two when the
        // replica after it forwarded them again).
        assert_eq!(slow.skips, 1, "seed {seed}: {slow:?}");
        assert!(
            slow.prepares_received_again <= slow.commits + slow.commits / 20,
            "seed {seed}: {slow:?}"
        );
        let base = run(seed, 5, None, Slowness::Paused, 0, group);
        assert!(
            base.prepares_received_again <= base.commits / 100,
            "seed {seed}: {base:?}"
        );
    }
}
