//! One VSR group per consensus plane (docs/protocol.md, "Consensus planes"): the
//! metadata plane (group 1 << 63) and one group per partition, routed by the group field
//! every consensus header carries.

use std::collections::{BTreeMap, BTreeSet};

use crate::wire::decode::group_of;
use crate::wire::{decode, decode_trusted, Frame, FrameError, Limits, Message};

use super::{Action, Replica};

/// Why a frame could not be routed to a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// The frame failed validation.
    Invalid,
    /// The command carries no group (handshake, client-bound, request).
    NoGroup,
    /// No replica of this group lives on this node.
    UnknownGroup { group: u64 },
}

/// The replicas of every group this node hosts.
#[derive(Debug, Default)]
pub struct Groups {
    replicas: BTreeMap<u64, Replica>,
    /// Groups that may have queued actions since the last drain: every group reached
    /// mutably (a routed frame, `get_mut`, a tick that queued something). Draining visits
    /// only these, so a node with thousands of idle groups does not walk all of them
    /// after every event.
    touched: BTreeSet<u64>,
    limits: Limits,
}

impl Groups {
    /// No groups yet.
    pub fn new() -> Groups {
        Groups::default()
    }

    /// Hosts `replica` under its configured group (replacing a previous one).
    pub fn insert(&mut self, replica: Replica) {
        let group = replica.config().group;
        self.replicas.insert(group, replica);
        self.touched.insert(group);
    }

    /// Stops hosting `group` (its replica, with whatever it held in memory, is returned).
    pub fn remove(&mut self, group: u64) -> Option<Replica> {
        self.touched.remove(&group);
        self.replicas.remove(&group)
    }

    /// The replica of `group`.
    pub fn get(&self, group: u64) -> Option<&Replica> {
        self.replicas.get(&group)
    }

    /// The replica of `group`, mutable (journal completions, client requests).
    pub fn get_mut(&mut self, group: u64) -> Option<&mut Replica> {
        let replica = self.replicas.get_mut(&group)?;
        self.touched.insert(group);
        Some(replica)
    }

    /// Routes a replica-plane frame to its group's replica by the group field.
    pub fn on_message(&mut self, bytes: &[u8]) -> Result<u64, RouteError> {
        let (group, replica) = self.route(decode(bytes, &self.limits))?;
        replica.on_message(bytes);
        Ok(group)
    }

    /// As `on_message`, for a frame that already passed `wire::decode` (the bus's
    /// verified frames): routed without verifying its body again, and a Prepare is kept
    /// in the log as received, without a copy.
    pub fn on_frame(&mut self, frame: Frame) -> Result<u64, RouteError> {
        let (group, replica) = self.route(decode_trusted(frame.as_bytes(), &self.limits))?;
        replica.on_frame(frame);
        Ok(group)
    }

    fn route(
        &mut self,
        decoded: Result<Message<'_>, FrameError>,
    ) -> Result<(u64, &mut Replica), RouteError> {
        let group = match decoded {
            Ok(message) => group_of(&message).ok_or(RouteError::NoGroup)?,
            Err(_) => return Err(RouteError::Invalid),
        };
        let replica = self
            .replicas
            .get_mut(&group)
            .ok_or(RouteError::UnknownGroup { group })?;
        self.touched.insert(group);
        Ok((group, replica))
    }

    /// Ticks every group.
    pub fn on_tick(&mut self) {
        for (group, replica) in &mut self.replicas {
            replica.on_tick();
            if replica.has_actions() {
                self.touched.insert(*group);
            }
        }
    }

    /// Every group's queued actions, tagged with the group, in group order.
    pub fn drain_actions(&mut self) -> Vec<(u64, Action)> {
        let mut actions = Vec::new();
        for group in std::mem::take(&mut self.touched) {
            if let Some(replica) = self.replicas.get_mut(&group) {
                actions.extend(replica.drain_actions().into_iter().map(|a| (group, a)));
            }
        }
        actions
    }
}

#[cfg(test)]
mod tests {
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
}
