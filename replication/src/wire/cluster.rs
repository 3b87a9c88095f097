//! Cluster identity and consensus group keys (docs/protocol.md, "Consensus planes").

use super::registry::METADATA_GROUP;

/// The cluster header field: the first 16 bytes of blake3(cluster_name) as a LE u128.
pub fn cluster_id(name: &str) -> u128 {
    let hash = blake3::hash(name.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash.as_bytes()[..16]);
    u128::from_le_bytes(first)
}

/// Bits of each part of a partition group key.
pub const STREAM_BITS: u32 = 20;
pub const TOPIC_BITS: u32 = 12;
pub const PARTITION_BITS: u32 = 20;

/// A partition group key: stream/topic/partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    pub stream: u32,
    pub topic: u32,
    pub partition: u32,
}

/// What a group value routes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    Metadata,
    Partition(PartitionKey),
}

/// Why a group value or key is not valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupError {
    /// Group 0 is "unset", legal only in client requests.
    Unset,
    /// Bits above the 52 of a partition key are set (and it is not the metadata group).
    HighBits { group: u64 },
    /// A part of the key does not fit its bit width.
    OutOfRange { part: &'static str, value: u32 },
}

impl core::fmt::Display for GroupError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            GroupError::Unset => write!(f, "group 0 is unset"),
            GroupError::HighBits { group } => write!(f, "group {group:#x} sets bits above 52"),
            GroupError::OutOfRange { part, value } => {
                write!(f, "{part} id {value} does not fit its bits")
            }
        }
    }
}

impl std::error::Error for GroupError {}

impl PartitionKey {
    /// Packs stream << 32 | topic << 20 | partition.
    pub fn pack(self) -> Result<u64, GroupError> {
        let check = |part, value: u32, bits: u32| {
            if value >> bits == 0 {
                Ok(())
            } else {
                Err(GroupError::OutOfRange { part, value })
            }
        };
        check("stream", self.stream, STREAM_BITS)?;
        check("topic", self.topic, TOPIC_BITS)?;
        check("partition", self.partition, PARTITION_BITS)?;
        let group = u64::from(self.stream) << 32
            | u64::from(self.topic) << PARTITION_BITS
            | u64::from(self.partition);
        if group == 0 {
            return Err(GroupError::Unset);
        }
        Ok(group)
    }
}

/// Classifies a group value.
pub fn group_kind(group: u64) -> Result<GroupKind, GroupError> {
    if group == METADATA_GROUP {
        return Ok(GroupKind::Metadata);
    }
    if group == 0 {
        return Err(GroupError::Unset);
    }
    if group >> (32 + STREAM_BITS) != 0 {
        return Err(GroupError::HighBits { group });
    }
    Ok(GroupKind::Partition(PartitionKey {
        stream: (group >> 32) as u32,
        topic: ((group >> PARTITION_BITS) & ((1 << TOPIC_BITS) - 1)) as u32,
        partition: (group & ((1 << PARTITION_BITS) - 1)) as u32,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_id_is_the_first_16_bytes_of_blake3_little_endian() {
        let hash = blake3::hash(b"appliance");
        let expected = u128::from_le_bytes(hash.as_bytes()[..16].try_into().unwrap());
        assert_eq!(cluster_id("appliance"), expected);
        assert_ne!(cluster_id("appliance"), cluster_id("appliance2"));
    }

    #[test]
    fn partition_key_packs_into_20_12_20_bits_and_back() {
        let key = PartitionKey {
            stream: 0xF_FFFF,
            topic: 0xFFF,
            partition: 0xF_FFFF,
        };
        let group = key.pack().unwrap();
        assert_eq!(group, 0x000F_FFFF_FFFF_FFFF);
        assert_eq!(group_kind(group), Ok(GroupKind::Partition(key)));
        let key = PartitionKey {
            stream: 3,
            topic: 2,
            partition: 1,
        };
        assert_eq!(key.pack(), Ok(3 << 32 | 2 << 20 | 1));
    }

    #[test]
    fn out_of_range_parts_and_unset_group_are_refused() {
        let too_big = PartitionKey {
            stream: 1 << 20,
            topic: 0,
            partition: 0,
        };
        assert!(matches!(
            too_big.pack(),
            Err(GroupError::OutOfRange { part: "stream", .. })
        ));
        let topic = PartitionKey {
            stream: 1,
            topic: 1 << 12,
            partition: 0,
        };
        assert!(matches!(
            topic.pack(),
            Err(GroupError::OutOfRange { part: "topic", .. })
        ));
        assert_eq!(
            PartitionKey {
                stream: 0,
                topic: 0,
                partition: 0
            }
            .pack(),
            Err(GroupError::Unset)
        );
        assert_eq!(group_kind(0), Err(GroupError::Unset));
        assert_eq!(
            group_kind(1 << 52),
            Err(GroupError::HighBits { group: 1 << 52 })
        );
        assert_eq!(group_kind(1 << 63), Ok(GroupKind::Metadata));
    }
}
