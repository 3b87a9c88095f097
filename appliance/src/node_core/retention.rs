//! Retention's decisions (docs/operations.md, "Disk space"), as values: which whole
//! sealed segments of a topic go (`decide`), the topic's settings resolved against the
//! server's, and what the metadata primary has in flight (`RetentionWork`). The daemon
//! reads the segments it stores, proposes the decision through the metadata group and
//! removes the files (daemon/retention.rs).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime};

use replication::wire::PartitionKey;

use crate::protocol::Retention;

/// The server defaults ([retention]) and how often the primary looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionSettings {
    /// Zero: never.
    pub message_expiry: Duration,
    /// Zero: no limit.
    pub max_topic_size: u64,
    pub check_ticks: u64,
}

/// The client id of a node's retention proposals (one per replica, below the ids the
/// auto-commit writes use).
pub const RETENTION_CLIENT: u128 = u128::MAX - (1 << 16);

/// A proposal not committed within this long may be proposed again.
pub const PROPOSAL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the primary has in flight.
#[derive(Default)]
pub struct RetentionWork {
    /// Partitions with a proposal in flight, since when.
    pub pending: BTreeMap<PartitionKey, Instant>,
    /// A Register of the internal session is in flight since then.
    pub registering: Option<Instant>,
    /// The session epoch and the next request number of the proposals.
    pub session: u64,
    pub next_request: u64,
    /// Partitions whose segments below the retained offset wait for a checkpoint.
    pub to_delete: BTreeSet<u64>,
}

/// A sealed segment as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sealed {
    pub next_offset: u64,
    pub bytes: u64,
    /// When its last batch was written (the file's modification time).
    pub written: SystemTime,
}

/// One partition as the decision sees it: its sealed segments above the retained
/// offset, oldest first, and how many bytes it stores there in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub key: PartitionKey,
    pub first_offset: u64,
    pub committed_end: u64,
    pub sealed: Vec<Sealed>,
    pub bytes: u64,
}

/// The new first offset of each partition of one topic that retention moves (sans-IO:
/// the unit tests drive it). A segment goes when its newest message is older than
/// `expiry` at `now` (None: never), or while the topic holds more than `max_size` bytes
/// (None: no limit), oldest written first across the topic's partitions. Only
/// segments wholly below the committed end go.
pub fn decide(
    partitions: &[Stored],
    expiry: Option<Duration>,
    max_size: Option<u64>,
    now: SystemTime,
) -> Vec<(PartitionKey, u64)> {
    // How many sealed segments of each partition go.
    let mut cut: Vec<usize> = vec![0; partitions.len()];
    let deletable = |p: &Stored, i: usize| {
        p.sealed
            .get(i)
            .filter(|s| s.next_offset <= p.committed_end)
            .copied()
    };
    if let Some(expiry) = expiry {
        for (n, p) in partitions.iter().enumerate() {
            while let Some(segment) = deletable(p, cut[n]) {
                let age = now.duration_since(segment.written).unwrap_or_default();
                if age <= expiry {
                    break;
                }
                cut[n] += 1;
            }
        }
    }
    if let Some(max) = max_size {
        let mut total: u64 = partitions.iter().map(|p| p.bytes).sum::<u64>()
            - partitions
                .iter()
                .zip(&cut)
                .map(|(p, c)| p.sealed[..*c].iter().map(|s| s.bytes).sum::<u64>())
                .sum::<u64>();
        while total > max {
            let oldest = partitions
                .iter()
                .enumerate()
                .filter_map(|(n, p)| deletable(p, cut[n]).map(|s| (s.written, n)))
                .min();
            let Some((_, n)) = oldest else { break };
            total -= partitions[n].sealed[cut[n]].bytes;
            cut[n] += 1;
        }
    }
    partitions
        .iter()
        .zip(cut)
        .filter(|(_, c)| *c > 0)
        .map(|(p, c)| (p.key, p.sealed[c - 1].next_offset))
        .collect()
}

/// A topic's setting resolved against the server default: None means never / no limit.
pub fn resolve(topic: u64, default: u64) -> Option<u64> {
    let value = if topic == Retention::SERVER_DEFAULT {
        default
    } else {
        topic
    };
    (value != 0 && value != Retention::NEVER).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(partition: u32) -> PartitionKey {
        PartitionKey {
            stream: 1,
            topic: 1,
            partition,
        }
    }

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }

    /// A partition of sealed segments of 100 offsets and `bytes` each, written at the
    /// given seconds, then an active segment of `active` bytes.
    fn stored(partition: u32, written: &[u64], bytes: u64, active: u64) -> Stored {
        let sealed: Vec<Sealed> = written
            .iter()
            .enumerate()
            .map(|(i, w)| Sealed {
                next_offset: (i as u64 + 1) * 100,
                bytes,
                written: at(*w),
            })
            .collect();
        Stored {
            key: key(partition),
            first_offset: 0,
            committed_end: sealed.len() as u64 * 100 + 50,
            bytes: bytes * sealed.len() as u64 + active,
            sealed,
        }
    }

    #[test]
    fn expiry_takes_the_segments_older_than_it_oldest_first() {
        let p = stored(0, &[10, 20, 30, 40], 1000, 10);
        let expiry = Some(Duration::from_secs(15));
        // At 50: written at 10, 20 and 30 are older than 15 s; 40 is not.
        assert_eq!(
            decide(std::slice::from_ref(&p), expiry, None, at(50)),
            vec![(key(0), 300)]
        );
        assert_eq!(
            decide(std::slice::from_ref(&p), expiry, None, at(20)),
            vec![]
        );
        // The active segment never goes, however old.
        assert_eq!(decide(&[p], expiry, None, at(1000)), vec![(key(0), 400)]);
    }

    #[test]
    fn size_takes_the_oldest_segments_across_the_topic_until_it_fits() {
        let a = stored(0, &[10, 30, 50], 1000, 0);
        let b = stored(1, &[20, 40, 60], 1000, 0);
        // 6000 bytes, 3500 allowed: the three oldest (a@10, b@20, a@30) go.
        let cut = decide(&[a.clone(), b.clone()], None, Some(3500), at(100));
        assert_eq!(cut, vec![(key(0), 200), (key(1), 100)]);
        assert_eq!(decide(&[a, b], None, Some(6000), at(100)), vec![]);
    }

    #[test]
    fn nothing_above_the_committed_end_goes() {
        let mut p = stored(0, &[10, 20, 30], 1000, 0);
        p.committed_end = 150;
        assert_eq!(
            decide(&[p], Some(Duration::from_secs(1)), Some(0), at(100)),
            vec![(key(0), 100)]
        );
    }

    #[test]
    fn topic_values_resolve_against_the_server_default() {
        assert_eq!(resolve(Retention::SERVER_DEFAULT, 7), Some(7));
        assert_eq!(resolve(Retention::SERVER_DEFAULT, 0), None);
        assert_eq!(resolve(Retention::NEVER, 7), None);
        assert_eq!(resolve(5, 7), Some(5));
    }
}
