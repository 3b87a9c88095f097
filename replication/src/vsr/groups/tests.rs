use super::*;
use crate::vsr::Config;
use crate::wire::METADATA_GROUP;
use crate::wire::{cluster_id, Frame, Header, PartitionKey, StartViewChangeHeader};

#[test]
fn frames_reach_the_replica_of_their_group() {
    let cluster = cluster_id("groups");
    let partition = PartitionKey {
        stream: 3,
        topic: 2,
        partition: 1,
    }
    .pack()
    .expect("valid");
    let mut groups = Groups::new();
    groups.insert(Replica::new(Config::new(cluster, METADATA_GROUP, 1, 3)));
    groups.insert(Replica::new(Config::new(cluster, partition, 1, 3)));
    let mut svc = StartViewChangeHeader::new();
    svc.frame.cluster = cluster;
    svc.frame.view = 1;
    svc.frame.replica = 2;
    svc.group = partition;
    let frame = Frame::build(&svc, &[]);
    assert_eq!(groups.on_message(frame.as_bytes()), Ok(partition));
    assert_eq!(groups.get(partition).map(|r| r.view()), Some(1));
    assert_eq!(groups.get(METADATA_GROUP).map(|r| r.view()), Some(0));
    svc.group = PartitionKey {
        stream: 9,
        topic: 9,
        partition: 9,
    }
    .pack()
    .expect("valid");
    let frame = Frame::build(&svc, &[]);
    assert!(matches!(
        groups.on_message(frame.as_bytes()),
        Err(RouteError::UnknownGroup { .. })
    ));
}

/// Three nodes of 1 + `partitions` groups each, wired without loss: frames and
/// journal writes are delivered on the next tick.
struct Nodes {
    nodes: Vec<Groups>,
    up: Vec<bool>,
    inbox: Vec<Vec<Frame>>,
    /// Commit broadcasts of partition groups, per node.
    partition_commits: Vec<u64>,
}

impl Nodes {
    fn new(partitions: u32) -> Nodes {
        let cluster = cluster_id("hibernate");
        let mut nodes = Vec::new();
        for replica in 0..3 {
            let mut groups = Groups::new();
            groups.insert(Replica::new(Config::new(
                cluster,
                METADATA_GROUP,
                replica,
                3,
            )));
            for partition in 0..partitions {
                let group = PartitionKey {
                    stream: 1,
                    topic: 1,
                    partition,
                }
                .pack()
                .expect("valid");
                groups.insert(Replica::new(Config::new(cluster, group, replica, 3)));
            }
            let timeout = groups
                .get(METADATA_GROUP)
                .expect("metadata")
                .config()
                .heartbeat_timeout_ticks;
            groups.hibernate(replica, 3, timeout);
            nodes.push(groups);
        }
        Nodes {
            nodes,
            up: vec![true; 3],
            inbox: vec![Vec::new(); 3],
            partition_commits: vec![0; 3],
        }
    }

    fn tick(&mut self) {
        for (r, inbox) in self.inbox.iter_mut().enumerate() {
            for frame in std::mem::take(inbox) {
                if self.up[r] {
                    let _ = self.nodes[r].on_message(frame.as_bytes());
                }
            }
        }
        for r in 0..3 {
            if !self.up[r] {
                continue;
            }
            self.nodes[r].on_tick();
            for (group, action) in self.nodes[r].drain_actions() {
                match action {
                    Action::Send { to, frame } => self.inbox[usize::from(to)].push(frame),
                    Action::Broadcast { frame } => {
                        if group != METADATA_GROUP
                            && matches!(
                                decode(frame.as_bytes(), &Limits::default()),
                                Ok(Message::Commit(_))
                            )
                        {
                            self.partition_commits[r] += 1;
                        }
                        for to in (0..3).filter(|to| *to != r) {
                            self.inbox[to].push(frame.clone());
                        }
                    }
                    Action::JournalAppend { op, frame } => {
                        if let Some(replica) = self.nodes[r].get_mut(group) {
                            replica.on_journal_durable(op, frame.checksum());
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    fn asleep(&self, r: usize) -> u64 {
        self.nodes[r].sleep_stats().asleep
    }

    /// The clusters' heartbeat timeout, in ticks.
    fn heartbeat_timeout(&self) -> u64 {
        self.nodes[1]
            .get(METADATA_GROUP)
            .expect("hosted")
            .config()
            .heartbeat_timeout_ticks
    }

    /// Node 0 is cut off until the metadata group elects node 1, then comes back
    /// leading nothing (so it sends no Commit).
    fn node_0_back_leading_nothing(&mut self) {
        let timeout = self.heartbeat_timeout();
        self.up[0] = false;
        for _ in 0..4 * timeout {
            self.tick();
        }
        self.up[0] = true;
        for _ in 0..4 * timeout {
            self.tick();
        }
        for r in 0..3 {
            let normal = (1, crate::vsr::Status::Normal);
            assert_eq!(self.view_status(r, METADATA_GROUP), normal, "node {r}");
        }
    }

    /// Starts node `r`'s replica of a new group (view 0: node 0 is its primary).
    fn start_new_group(&mut self, r: usize) -> u64 {
        let group = PartitionKey {
            stream: 1,
            topic: 2,
            partition: 0,
        }
        .pack()
        .expect("valid");
        let config = Config::new(cluster_id("hibernate"), group, r as u8, 3);
        self.nodes[r].insert(Replica::new(config));
        group
    }

    /// The view and status of node `r`'s replica of `group`.
    fn view_status(&self, r: usize, group: u64) -> (u32, crate::vsr::Status) {
        let replica = self.nodes[r].get(group).expect("hosted");
        (replica.view(), replica.status())
    }
}

/// Idle partition groups sleep on every node but for one each primary keeps awake
/// (its Commits are the node's liveness); when the primary's node stops, the sleeping
/// groups it led wake and elect another primary within the heartbeat timeout.
#[test]
fn idle_groups_sleep_and_fail_over_when_their_primary_node_stops() {
    let partitions = 40;
    let mut nodes = Nodes::new(partitions);
    for _ in 0..300 {
        nodes.tick();
    }
    // Node 0 leads every group of view 0; the metadata group (which never sleeps)
    // carries its Commits, so every partition group sleeps, on the backups too.
    assert_eq!(nodes.asleep(0), u64::from(partitions));
    for r in 1..3 {
        assert!(nodes.asleep(r) >= u64::from(partitions) - 1, "node {r}");
    }
    // Asleep, nothing changes for a long time: every group stays asleep on every
    // node, while each primary's refresh broadcasts its Commit once per
    // REFRESH_HEARTBEATS heartbeat timeouts (the backups handle it asleep).
    let commits_before = nodes.partition_commits[0];
    let refresh_ticks =
        (super::super::hibernate::REFRESH_HEARTBEATS + 2) * nodes.heartbeat_timeout();
    let mut unsettled = 0;
    for _ in 0..2 * refresh_ticks {
        nodes.tick();
        for r in 0..3 {
            assert_eq!(nodes.asleep(r), u64::from(partitions), "node {r}");
            // The groups that tick (the metadata group) only wait on their timers:
            // the node may run its ticks late.
            unsettled += u64::from(!nodes.nodes[r].settled());
        }
    }
    assert_eq!(unsettled, 0);
    for r in 0..3 {
        let listed: Vec<(u64, bool)> = nodes.nodes[r]
            .iter()
            .map(|(group, _, asleep)| (group, asleep))
            .collect();
        let looked_up: Vec<(u64, bool)> = nodes.nodes[r]
            .replicas
            .keys()
            .map(|group| (*group, nodes.nodes[r].asleep(*group)))
            .collect();
        assert_eq!(listed, looked_up);
    }
    let refreshes = nodes.partition_commits[0] - commits_before;
    assert!(
        (u64::from(partitions)..=3 * u64::from(partitions)).contains(&refreshes),
        "{refreshes} refreshes of {partitions} groups"
    );
    for r in 0..3 {
        assert_eq!(nodes.nodes[r].sleep_stats().silent_wakes, 0);
    }
    let views = |nodes: &Nodes, r: usize| -> Vec<u32> {
        nodes.nodes[r]
            .replicas
            .values()
            .map(Replica::view)
            .collect()
    };
    assert!(views(&nodes, 1).iter().all(|v| *v == 0));

    nodes.up[0] = false;
    let timeout = nodes.heartbeat_timeout();
    let mut elected = None;
    let mut settled_throughout = true;
    for tick in 1..=4 * timeout {
        nodes.tick();
        settled_throughout &= nodes.nodes[1].settled();
        let normal_elsewhere = (1..3).all(|r| {
            nodes.nodes[r]
                .replicas
                .values()
                .all(|x| x.view() > 0 && x.status() == crate::vsr::Status::Normal)
        });
        if normal_elsewhere {
            elected = Some(tick);
            break;
        }
    }
    let elected = elected.expect("every group elected a primary without node 0");
    assert!(
        !settled_throughout,
        "a failover is work: node 1 ticks on time"
    );
    assert!(
        elected <= timeout + timeout / 8 + 20,
        "{elected} ticks (timeout {timeout})"
    );
    assert!(nodes.nodes[1].sleep_stats().silent_wakes >= u64::from(partitions) - 1);
    // The new primaries' groups go back to sleep.
    for _ in 0..300 {
        nodes.tick();
    }
    assert!(
        nodes.asleep(1) >= u64::from(partitions) - 1,
        "{:?}",
        nodes.nodes[1].sleep_stats()
    );
}

/// A node that leads no group sends no Commit, so its peers do not hear it. A new
/// group whose view-0 primary is that node must still give the primary a heartbeat
/// timeout from the backups' start: nodes start a new group's replicas at their own
/// pace, and the backups must not fail it over as soon as they fall asleep.
#[test]
fn a_new_group_keeps_its_primary_when_that_node_leads_nothing_yet() {
    let mut nodes = Nodes::new(0);
    let timeout = nodes.heartbeat_timeout();
    nodes.node_0_back_leading_nothing();
    // A new group: its backups start first, its primary (node 0) half a heartbeat
    // timeout later.
    let group = nodes.start_new_group(1);
    nodes.start_new_group(2);
    for _ in 0..timeout / 2 {
        nodes.tick();
    }
    nodes.start_new_group(0);
    for _ in 0..4 * timeout {
        nodes.tick();
    }
    for r in 0..3 {
        let normal = (0, crate::vsr::Status::Normal);
        assert_eq!(nodes.view_status(r, group), normal, "node {r}");
    }
}

/// A new group's backups start while the node of its primary, which leads nothing
/// yet, was heard less than a heartbeat timeout ago (its link just came up): they take
/// the primary as vouched for and fall asleep. That node's silence must not time the
/// primary out before a heartbeat timeout from the backups' start, or a group created
/// just after a node connected changes views at once.
#[test]
fn a_new_group_vouched_by_a_node_heard_just_before_keeps_its_primary() {
    let mut nodes = Nodes::new(0);
    let timeout = nodes.heartbeat_timeout();
    nodes.node_0_back_leading_nothing();
    // Its peers last heard it when its link came up.
    for r in 1..3 {
        nodes.nodes[r].set_connected(0, true);
    }
    for _ in 0..timeout * 2 / 3 {
        nodes.tick();
    }
    let group = nodes.start_new_group(1);
    nodes.start_new_group(2);
    let interval = nodes.nodes[1]
        .get(group)
        .expect("hosted")
        .config()
        .commit_broadcast_interval_ticks;
    for _ in 0..interval + 2 {
        nodes.tick();
    }
    for r in 1..3 {
        assert!(nodes.nodes[r].asleep(group), "node {r} sleeps, vouched for");
    }
    // Node 0 was last heard more than a heartbeat timeout ago when it starts the group.
    for _ in 0..timeout / 3 {
        nodes.tick();
    }
    nodes.start_new_group(0);
    for _ in 0..4 * timeout {
        nodes.tick();
    }
    for r in 0..3 {
        let normal = (0, crate::vsr::Status::Normal);
        assert_eq!(nodes.view_status(r, group), normal, "node {r}");
    }
    assert_eq!(nodes.nodes[1].sleep_stats().silent_wakes, 0);
}

/// An idle group whose primaries go round the nodes comes back to node 0, which led
/// it before at the same commit point: the new view's backups never heard node 0 lead
/// it, so it must broadcast its Commits in the new view before it sleeps, or they time
/// it out again and again (found by the many-group simulator).
#[test]
fn a_primary_that_led_before_at_the_same_commit_is_heard_in_its_new_view() {
    let mut nodes = Nodes::new(1);
    let timeout = nodes.heartbeat_timeout();
    for _ in 0..300 {
        nodes.tick();
    }
    // Each node in turn is cut off until the group elected the next one; the links
    // go down and come up as the bus reports them.
    let link = |nodes: &mut Nodes, node: usize, up: bool| {
        for other in (0..3).filter(|o| *o != node) {
            nodes.nodes[other].set_connected(node as u8, up);
            nodes.nodes[node].set_connected(other as u8, up);
        }
    };
    for down in 0..3 {
        nodes.up[down] = false;
        link(&mut nodes, down, false);
        for _ in 0..4 * timeout {
            nodes.tick();
        }
        nodes.up[down] = true;
        link(&mut nodes, down, true);
        for _ in 0..4 * timeout {
            nodes.tick();
        }
    }
    let group = PartitionKey {
        stream: 1,
        topic: 1,
        partition: 0,
    }
    .pack()
    .expect("valid");
    let (view, status) = nodes.view_status(0, group);
    assert_eq!(status, crate::vsr::Status::Normal);
    assert_eq!(view % 3, 0, "node 0 leads the group again (view {view})");
    // Nothing fails from here on: the group keeps its view, asleep.
    for _ in 0..20 * timeout {
        nodes.tick();
    }
    for r in 0..3 {
        assert_eq!(
            nodes.view_status(r, group),
            (view, crate::vsr::Status::Normal),
            "node {r}"
        );
    }
    assert!(nodes.nodes[1].asleep(group), "the idle group sleeps");
}

/// Drains see every action, however it was queued (a routed frame, a replica reached
/// with `get_mut`, a tick), in group order, and nothing twice.
#[test]
fn every_queued_action_is_drained_once_in_group_order() {
    let cluster = cluster_id("groups");
    let partitions: Vec<u64> = (0..3)
        .map(|partition| {
            PartitionKey {
                stream: 1,
                topic: 1,
                partition,
            }
            .pack()
            .expect("valid")
        })
        .collect();
    let mut groups = Groups::new();
    for group in partitions.iter().copied().chain([METADATA_GROUP]) {
        // Replica 1 of 3: a backup in view 0, which times out its primary.
        groups.insert(Replica::new(Config::new(cluster, group, 1, 3)));
    }
    let _ = groups.drain_actions();
    assert!(groups.drain_actions().is_empty());
    // A frame for one group, a direct call on another.
    let mut svc = StartViewChangeHeader::new();
    svc.frame.cluster = cluster;
    svc.frame.view = 1;
    svc.frame.replica = 2;
    svc.group = partitions[2];
    let frame = Frame::build(&svc, &[]);
    assert_eq!(groups.on_message(frame.as_bytes()), Ok(partitions[2]));
    svc.group = partitions[0];
    let frame = Frame::build(&svc, &[]);
    groups
        .get_mut(partitions[0])
        .expect("hosted")
        .on_message(frame.as_bytes());
    let drained: Vec<u64> = groups.drain_actions().iter().map(|(g, _)| *g).collect();
    assert!(
        drained.contains(&partitions[0]) && drained.contains(&partitions[2]),
        "{drained:?} {partitions:?}"
    );
    assert!(!drained.contains(&partitions[1]));
    assert!(drained.windows(2).all(|w| w[0] <= w[1]), "{drained:?}");
    assert!(groups.drain_actions().is_empty());
    // Ticks until every partition group times out its primary: each queues its view
    // change.
    let mut ticked = Vec::new();
    for _ in 0..10_000 {
        groups.on_tick();
        ticked.extend(groups.drain_actions().into_iter().map(|(g, _)| g));
        if partitions.iter().all(|p| ticked.contains(p)) {
            break;
        }
    }
    assert!(partitions.iter().all(|p| ticked.contains(p)), "{ticked:?}");
    assert!(groups.drain_actions().is_empty());
}
