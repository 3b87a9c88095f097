//! Scenario tests named after behaviour, driven through the simulator (real `vsr` code,
//! real sealed frames through `wire::decode`) with scripted faults.

use replication::sim::Cluster;
use replication::vsr::Status;
use replication::wire::{decode, Frame, Header, Limits, Message, RequestStartViewHeader};

const CONVERGE_TICKS: u64 = 40_000;

fn converge(cluster: &mut Cluster) {
    if let Err(e) = cluster.heal_and_converge(CONVERGE_TICKS) {
        panic!("{e}");
    }
}

fn run_until(cluster: &mut Cluster, ticks: u64, what: &str, done: impl Fn(&Cluster) -> bool) {
    match cluster.run_until(ticks, done) {
        Ok(true) => {}
        Ok(false) => panic!(
            "{what}: not reached in {ticks} ticks: {}",
            cluster.status_line()
        ),
        Err(e) => panic!("{what}: checker failed: {e}"),
    }
}

#[test]
fn primary_crash_during_normal_load() {
    let mut cluster = Cluster::scripted(3, 11, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 30);
    assert_eq!(cluster.primary(), Some(0));
    cluster.crash(0);
    let before = cluster.replies();
    run_until(&mut cluster, 10_000, "failover", |c| {
        c.primary().is_some_and(|p| p != 0) && c.replies() >= before + 30
    });
    converge(&mut cluster);
}

#[test]
fn backup_crash_and_rejoin_via_repair() {
    let mut cluster = Cluster::scripted(3, 12, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    cluster.crash(2);
    let before = cluster.replies();
    run_until(&mut cluster, 10_000, "load without r2", |c| {
        c.replies() >= before + 60
    });
    cluster.restart(2).expect("restart");
    run_until(&mut cluster, 10_000, "r2 catches up", |c| {
        let primary = c.replica(0).map(|r| r.commit()).unwrap_or(0);
        c.replica(2)
            .is_some_and(|r| r.status() == Status::Normal && r.commit() + 5 >= primary)
    });
    let r2 = cluster.replica(2).expect("up");
    assert!(
        r2.counters().repairs_accepted > 0,
        "r2 rejoined without repair"
    );
    converge(&mut cluster);
}

#[test]
fn primary_crash_mid_view_change() {
    let mut cluster = Cluster::scripted(3, 13, 2);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    cluster.crash(0);
    // r1 is the primary of view 1: crash it while it is still forming the view.
    run_until(&mut cluster, 5_000, "view change starts", |c| {
        c.replica(1)
            .is_some_and(|r| r.status() == Status::ViewChange)
    });
    cluster.crash(1);
    cluster.run_ticks(300).expect("checkers");
    cluster.restart(0).expect("restart");
    run_until(&mut cluster, 20_000, "a view forms without r1", |c| {
        c.primary().is_some_and(|p| p != 1)
            && c.replica(c.primary().unwrap_or(0))
                .is_some_and(|r| r.view() >= 2)
    });
    let before = cluster.replies();
    run_until(&mut cluster, 10_000, "progress", |c| {
        c.replies() >= before + 10
    });
    converge(&mut cluster);
}

#[test]
fn two_view_changes_in_a_row() {
    let mut cluster = Cluster::scripted(5, 14, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    cluster.crash(0);
    run_until(&mut cluster, 10_000, "view 1", |c| c.primary() == Some(1));
    cluster.crash(1);
    run_until(&mut cluster, 10_000, "view 2", |c| c.primary() == Some(2));
    let before = cluster.replies();
    run_until(&mut cluster, 10_000, "progress in view 2", |c| {
        c.replies() >= before + 20
    });
    converge(&mut cluster);
}

#[test]
fn truncated_suffix_must_not_resurrect_an_uncommitted_op() {
    let mut cluster = Cluster::scripted(3, 15, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    // r0 is cut off from its backups (clients still reach it): what it prepares now is
    // never committed.
    cluster.network.partition_symmetric(1 << 0);
    cluster.sync_links();
    run_until(&mut cluster, 3_000, "uncommitted ops on r0", |c| {
        c.replica(0).is_some_and(|r| r.op() >= r.commit_max() + 2)
    });
    // Let its journal writes become durable, then crash it.
    cluster.run_ticks(20).expect("checkers");
    let r0 = cluster.replica(0).expect("up");
    // Stale: what only r0 holds. An op above r0's commit point that a backup received
    // before the cut (only its PrepareOks were lost) may rightly commit in the new view.
    let held_elsewhere = |op: u64, id: u128| {
        (1..3).any(|r| {
            cluster
                .replica(r)
                .is_some_and(|b| b.log().identity(op) == Some(id))
        })
    };
    let stale: Vec<(u64, u128)> = (r0.commit_max() + 1..=r0.op())
        .filter_map(|op| r0.log().identity(op).map(|id| (op, id)))
        .filter(|(op, id)| !held_elsewhere(*op, *id))
        .collect();
    assert!(!stale.is_empty());
    cluster.crash(0);
    cluster.network.heal();
    cluster.sync_links();
    let before = cluster.replies();
    run_until(
        &mut cluster,
        10_000,
        "new view commits past the stale ops",
        |c| c.replies() >= before + 30,
    );
    cluster.restart(0).expect("restart");
    converge(&mut cluster);
    for (op, identity) in stale {
        let committed = cluster
            .checker
            .get(op)
            .expect("op committed by the new view");
        assert_ne!(committed.identity, identity, "stale op {op} resurrected");
    }
}

#[test]
fn restarted_replica_answered_by_stale_primary() {
    let mut cluster = Cluster::scripted(3, 16, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    // Isolate the primary; the others move on to view 1.
    cluster.network.partition_symmetric(1 << 0);
    cluster.sync_links();
    run_until(&mut cluster, 10_000, "view 1", |c| {
        c.replica(1)
            .is_some_and(|r| r.status() == Status::Normal && r.view() >= 1)
    });
    let view = cluster.replica(1).expect("up").view();
    assert_eq!(
        cluster.replica(0).expect("up").view(),
        0,
        "r0 is the stale primary"
    );
    // r2 restarts where it can reach only the stale primary.
    cluster.crash(2);
    cluster.network.heal();
    cluster.network.cut(0, 1);
    cluster.network.cut(1, 0);
    cluster.network.cut(1, 2);
    cluster.network.cut(2, 1);
    cluster.sync_links();
    cluster.restart(2).expect("restart");
    // The stale primary answers a probe of its own view with a StartView of view 0.
    let mut probe = RequestStartViewHeader::new();
    probe.frame.cluster = cluster.replica(0).expect("up").config().cluster;
    probe.frame.replica = 2;
    probe.group = cluster.replica(0).expect("up").config().group;
    probe.incarnation = 7;
    let probe = Frame::build(&probe, &[]);
    let r0 = cluster.replicas[0].as_mut().expect("up");
    r0.on_message(probe.as_bytes());
    let stale_start_view = r0
        .drain_actions()
        .into_iter()
        .find_map(|action| match action {
            replication::vsr::Action::Send { to: 2, frame } => Some(frame),
            _ => None,
        })
        .expect("the stale primary answers its own view");
    match decode(stale_start_view.as_bytes(), &Limits::default()) {
        Ok(Message::StartView(h, _)) => assert_eq!(h.frame.view, 0),
        other => panic!("expected a StartView, got {other:?}"),
    }
    let r2 = cluster.replicas[2].as_mut().expect("up");
    r2.on_message(stale_start_view.as_bytes());
    assert_ne!(r2.status(), Status::Normal, "adopted a stale view");
    assert!(r2.view() >= view);
    for _ in 0..2_000 {
        cluster.step().expect("checkers");
        let r2 = cluster.replica(2).expect("up");
        assert!(
            !(r2.status() == Status::Normal && r2.view() < view),
            "r2 went back to view {}",
            r2.view()
        );
    }
    converge(&mut cluster);
    assert!(cluster.replica(2).expect("up").view() >= view);
}

#[test]
fn asymmetric_partition_where_the_primary_can_send_but_not_receive() {
    let mut cluster = Cluster::scripted(3, 17, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    assert_eq!(cluster.primary(), Some(0));
    cluster.network.cut(1, 0);
    cluster.network.cut(2, 0);
    cluster.sync_links();
    let before = cluster.replies();
    run_until(&mut cluster, 20_000, "a primary that hears a quorum", |c| {
        c.replies() >= before + 30
    });
    assert!(
        cluster
            .replica(1)
            .is_some_and(|r| r.view() > 0 && r.status() == Status::Normal),
        "backups never left the deaf primary's view"
    );
    converge(&mut cluster);
}

#[test]
fn replica_with_a_corrupt_journal_entry_is_repaired_not_trusted() {
    let mut cluster = Cluster::scripted(3, 18, 3);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 40);
    cluster.crash(1);
    let op = 7;
    assert!(cluster.corrupt(1, op), "r1 held op {op}");
    cluster.restart(1).expect("restart");
    run_until(
        &mut cluster,
        10_000,
        "r1 commits past the corrupt op",
        |c| c.replica(1).is_some_and(|r| r.commit() > op + 10),
    );
    // The repaired prepare is rewritten to the journal (durable a few ticks later).
    cluster.run_ticks(50).expect("checkers");
    let identity = cluster.checker.get(op).expect("committed").identity;
    let entry = cluster.storages[1]
        .read_journal()
        .into_iter()
        .find(|e| e.op == op)
        .and_then(|e| e.bytes)
        .expect("journal slot rewritten");
    match decode(entry.as_bytes(), &Limits::default()) {
        Ok(Message::Prepare(h, _)) => assert_eq!(h.frame.checksum, identity),
        other => panic!("op {op} still unreadable: {other:?}"),
    }
    assert!(cluster.replica(1).expect("up").counters().repairs_accepted > 0);
    converge(&mut cluster);
}

#[test]
fn retried_client_request_after_failover_is_not_applied_twice() {
    let mut cluster = Cluster::scripted(3, 19, 1);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 5);
    // Replies are lost: the client keeps retrying a request that commits.
    cluster.drop_replies = true;
    let commit = cluster.checker.commit_max();
    run_until(&mut cluster, 2_000, "the request commits", |c| {
        c.checker.commit_max() > commit
    });
    cluster.run_ticks(400).expect("checkers");
    cluster.crash(0);
    cluster.drop_replies = false;
    let before = cluster.replies();
    // The retry reaches the new primary, which answers from its client table; a second
    // application would fail the checker ("applied twice").
    run_until(&mut cluster, 10_000, "the retry is answered", |c| {
        c.replies() > before
    });
    converge(&mut cluster);
}

/// Runs the scenario of a lost disk: backup `s` is down while the quorum {p, w} commits;
/// then `p` and `w` die, `wiped` (one of them) comes back with a new disk (formatted as
/// new, as an unattended restart would) next to `s`. The two must not form a view: the
/// wiped one remembers nothing and `s` never had the ops, so any view they formed would
/// lose them. Once the other member of the quorum returns, the cluster serves again and
/// every committed op survives (the checker holds every replica's commits to one
/// history). With `undecided_crash`, the wiped one crashes again before it learned
/// whether its group formed and restarts from what it persisted.
fn lost_disk_costs_no_committed_op(
    seed: u64,
    p: u8,
    w: u8,
    s: u8,
    wiped: u8,
    undecided_crash: bool,
) {
    use replication::sim::Wipe;
    let other = if wiped == p { w } else { p };
    let mut cluster = Cluster::scripted(3, seed, 2);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 10);
    if cluster.primary() != Some(p) {
        panic!("scenario wants r{p} primary: {}", cluster.status_line());
    }
    cluster.crash(s);
    let before = cluster.replies();
    run_until(&mut cluster, 10_000, "load on {p, w}", |c| {
        c.replies() >= before + 40
    });
    let committed = cluster.checker.commit_max();
    cluster.crash(p);
    cluster.crash(w);
    cluster
        .restart_wiped(wiped, Wipe::Formatted)
        .expect("the wiped replica restarts");
    if undecided_crash {
        cluster.crash(wiped);
        cluster
            .restart(wiped)
            .expect("the wiped replica restarts again");
    }
    cluster.restart(s).expect("s restarts");
    cluster.run_ticks(6_000).expect("checkers hold");
    let lost = cluster.replica(wiped).expect("up");
    assert!(
        !lost.is_voter(),
        "r{wiped} votes with an empty disk: {}",
        cluster.status_line()
    );
    assert_eq!(lost.status(), Status::Recovering);
    assert_eq!(cluster.primary(), None, "a view formed without r{other}");
    assert_eq!(
        cluster.checker.commit_max(),
        committed,
        "ops committed without r{other}"
    );
    cluster
        .restart(other)
        .expect("the other member of the quorum restarts");
    run_until(&mut cluster, 20_000, "the wiped replica votes again", |c| {
        c.replica(wiped).is_some_and(|r| r.is_voter())
    });
    converge(&mut cluster);
    for r in [p, w, s] {
        let replica = cluster.replica(r).expect("up");
        assert!(replica.commit() >= committed, "r{r} lacks committed ops");
    }
}

#[test]
fn wiped_backup_and_stale_backup_wait_for_the_primary_that_remembers() {
    lost_disk_costs_no_committed_op(21, 0, 1, 2, 1, false);
}

#[test]
fn wiped_old_primary_and_stale_backup_wait_for_the_backup_that_remembers() {
    lost_disk_costs_no_committed_op(21, 0, 1, 2, 0, false);
}

/// Seed 1102878 (20,000 ticks): a formatted replica crashed before it learned whether its
/// group formed; its restart read the empty superblock as the state of a member in view
/// 0, it voted with a stale backup, and a committed op was truncated. The undecided state
/// is durable now.
#[test]
fn a_wiped_replica_that_crashes_before_it_decides_still_does_not_vote() {
    lost_disk_costs_no_committed_op(21, 0, 1, 2, 0, true);
    lost_disk_costs_no_committed_op(21, 0, 1, 2, 1, true);
}

/// Seed 1000236 (partition plane, 50,000 ticks): the primary of view 44 tore its write of
/// op 201 in a crash, and the one backup of that view tore its own later. A replica
/// cannot tell a torn entry from an acknowledged prepare that was corrupted, so the
/// cluster held two unreadable copies of an op that may have committed, on the only
/// replicas that could have acknowledged it: no nack quorum, no header, a view change
/// that never ends. The simulator tears a write only where no other replica's entry is
/// unreadable (as it corrupts one).
#[test]
fn a_crash_never_tears_a_write_at_an_op_unreadable_on_another_replica() {
    let mut cluster = Cluster::scripted(3, 31, 2);
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 10);
    cluster.set_clients(false);
    let frame = {
        let log = cluster.replica(1).expect("up").log();
        log.slot(log.op())
            .and_then(|s| s.frame.clone())
            .expect("held")
    };
    // Far above every log: only the storage rule decides what lands there (past the
    // journals' heads, so with gaps written rather than deferred).
    let (unreadable_elsewhere, clean) = (10_000, 10_001);
    for r in [0, 2] {
        cluster.storages[r].defer_gaps = false;
    }
    let mut prng = replication::vsr::Prng::new(7);
    cluster.storages[2].append(unreadable_elsewhere, &frame, 0);
    let _ = cluster.storages[2].sync(u64::MAX);
    assert!(cluster.storages[2].corrupt(unreadable_elsewhere, &mut prng));
    assert!(cluster.storages[2].faulty_at(unreadable_elsewhere));
    cluster.crash(0);
    let mut torn_clean = false;
    for _ in 0..16 {
        cluster.storages[0].append(unreadable_elsewhere, &frame, u64::MAX);
        cluster.crash(0);
        assert!(
            cluster.storages[0].entry(unreadable_elsewhere).is_none(),
            "a second unreadable copy of op {unreadable_elsewhere}"
        );
        cluster.storages[0].append(clean, &frame, u64::MAX);
        cluster.crash(0);
        torn_clean |= cluster.storages[0].faulty_at(clean);
    }
    assert!(torn_clean, "no write was torn at all");
}

/// An idle group whose replicas all sleep (nobody ticks them) fails over from a crashed
/// primary as fast as an awake group: the backups hear the primary's node, not the group,
/// and time the group's primary out once that node is silent for a heartbeat timeout.
#[test]
fn a_sleeping_idle_group_fails_over_within_the_heartbeat_timeout() {
    let mut cluster = Cluster::scripted(3, 31, 2);
    cluster.options.hibernate = true;
    run_until(&mut cluster, 5_000, "load", |c| c.replies() >= 20);
    cluster.set_clients(false);
    run_until(&mut cluster, 2_000, "every replica asleep", |c| {
        (0..3).all(|r| c.asleep(r))
    });
    // Asleep, the group stays put: nobody times anyone out while the nodes are heard.
    let view = cluster.replica(1).map(|r| r.view());
    cluster.run_ticks(300).expect("idle");
    assert!(
        (0..3).all(|r| cluster.asleep(r)),
        "{}",
        cluster.status_line()
    );
    assert_eq!(cluster.replica(1).map(|r| r.view()), view);

    let primary = cluster.primary().expect("a primary");
    let timeout = cluster
        .replica(primary)
        .map(|r| r.config().heartbeat_timeout_ticks)
        .expect("up");
    cluster.crash(primary);
    let crashed_at = cluster.now;
    run_until(&mut cluster, 10 * timeout, "failover", |c| {
        c.primary().is_some_and(|p| p != primary)
    });
    let failover = cluster.now - crashed_at;
    // The heartbeat timeout, its jitter (1/8) and the view change's few round trips.
    assert!(
        failover <= timeout + timeout / 8 + 40,
        "failover took {failover} ticks (heartbeat timeout {timeout})"
    );
    cluster.set_clients(true);
    let before = cluster.replies();
    run_until(&mut cluster, 5_000, "writes after failover", |c| {
        c.replies() >= before + 10
    });
    converge(&mut cluster);
}
