//! Iggy's consumer group replies: a group, its members and their partitions, and a
//! member's own assignment.

use super::{decode_all, list_len, LIST_MAX};
use crate::protocol::codec::{BodyError, Reader, Writer};

/// Iggy's consumer group: `id u32, partitions_count u32, members_count u32`, name
/// (short string). GetConsumerGroups lists them one after another (no count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupReply {
    pub id: u32,
    pub partitions_count: u32,
    pub members_count: u32,
    pub name: String,
}

impl ConsumerGroupReply {
    fn write(&self, w: &mut Writer) {
        w.u32(self.id)
            .u32(self.partitions_count)
            .u32(self.members_count)
            .short_bytes(self.name.as_bytes());
    }

    fn read(r: &mut Reader<'_>) -> Result<ConsumerGroupReply, BodyError> {
        Ok(ConsumerGroupReply {
            id: r.u32("group.id")?,
            partitions_count: r.u32("group.partitions_count")?,
            members_count: r.u32("group.members_count")?,
            name: r.name("group.name")?,
        })
    }

    /// GetConsumerGroups: the groups, concatenated.
    pub fn encode_all(groups: &[ConsumerGroupReply]) -> Vec<u8> {
        let mut w = Writer::default();
        for group in groups {
            group.write(&mut w);
        }
        w.finish()
    }

    pub fn decode_all(body: &[u8]) -> Result<Vec<ConsumerGroupReply>, BodyError> {
        decode_all(body, |r| {
            let mut groups = Vec::new();
            while r.remaining() > 0 {
                if groups.len() >= LIST_MAX {
                    return Err(BodyError::TooMany {
                        field: "groups",
                        count: groups.len() as u64 + 1,
                        max: LIST_MAX as u64,
                    });
                }
                groups.push(ConsumerGroupReply::read(r)?);
            }
            Ok(groups)
        })
    }
}

/// Iggy's consumer group details (CreateConsumerGroup, GetConsumerGroup): the group,
/// then per member (`members_count` of them) `id u32, partitions_count u32`, then its
/// partition ids (u32 each).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerGroupDetailsReply {
    pub group: ConsumerGroupReply,
    /// Per member: its id (1-based, in the group's member order) and partitions.
    pub members: Vec<(u32, Vec<u32>)>,
}

impl ConsumerGroupDetailsReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.group.write(&mut w);
        for (id, partitions) in &self.members {
            w.u32(*id).u32(partitions.len() as u32);
            for partition in partitions {
                w.u32(*partition);
            }
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<ConsumerGroupDetailsReply, BodyError> {
        decode_all(body, |r| {
            let group = ConsumerGroupReply::read(r)?;
            // Each member is at least 8 bytes: refuse a count the body cannot hold
            // before anything is allocated for it.
            if (group.members_count as usize).saturating_mul(8) > r.remaining() {
                return Err(BodyError::Truncated { field: "members" });
            }
            let members = (0..group.members_count)
                .map(|_| {
                    let id = r.u32("member.id")?;
                    let count = list_len(r, "member.partitions", 4, LIST_MAX)?;
                    let partitions = (0..count)
                        .map(|_| r.u32("member.partition"))
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok((id, partitions))
                })
                .collect::<Result<Vec<_>, BodyError>>()?;
            Ok(ConsumerGroupDetailsReply { group, members })
        })
    }
}

/// SyncConsumerGroup (Iggy's): the group's generation u64 (it changes with every
/// membership change), then count u32 and the requesting member's partition ids. An
/// empty body when the requester is not a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupAssignmentReply {
    pub generation: u64,
    pub partitions: Vec<u32>,
}

impl GroupAssignmentReply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.generation).u32(self.partitions.len() as u32);
        for partition in &self.partitions {
            w.u32(*partition);
        }
        w.finish()
    }

    pub fn decode(body: &[u8]) -> Result<GroupAssignmentReply, BodyError> {
        decode_all(body, |r| {
            let generation = r.u64("generation")?;
            let count = list_len(r, "partitions", 4, LIST_MAX)?;
            let partitions = (0..count)
                .map(|_| r.u32("partition"))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(GroupAssignmentReply {
                generation,
                partitions,
            })
        })
    }
}
