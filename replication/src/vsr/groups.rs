//! One VSR group per consensus plane (docs/protocol.md, "Consensus planes"): the
//! metadata plane (group 1 << 63) and one group per partition, routed by the group field
//! every consensus header carries.

use std::collections::BTreeMap;

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
    limits: Limits,
}

impl Groups {
    /// No groups yet.
    pub fn new() -> Groups {
        Groups::default()
    }

    /// Hosts `replica` under its configured group (replacing a previous one).
    pub fn insert(&mut self, replica: Replica) {
        self.replicas.insert(replica.config().group, replica);
    }

    /// Stops hosting `group` (its replica, with whatever it held in memory, is returned).
    pub fn remove(&mut self, group: u64) -> Option<Replica> {
        self.replicas.remove(&group)
    }

    /// The replica of `group`.
    pub fn get(&self, group: u64) -> Option<&Replica> {
        self.replicas.get(&group)
    }

    /// The replica of `group`, mutable (journal completions, client requests).
    pub fn get_mut(&mut self, group: u64) -> Option<&mut Replica> {
        self.replicas.get_mut(&group)
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
        Ok((group, replica))
    }

    /// Ticks every group.
    pub fn on_tick(&mut self) {
        for replica in self.replicas.values_mut() {
            replica.on_tick();
        }
    }

    /// Every group's queued actions, tagged with the group, in group order.
    pub fn drain_actions(&mut self) -> Vec<(u64, Action)> {
        let mut actions = Vec::new();
        for (group, replica) in &mut self.replicas {
            actions.extend(replica.drain_actions().into_iter().map(|a| (*group, a)));
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
}
