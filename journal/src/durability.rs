//! Durability policy per data kind: `message_durability` for segment logs and
//! `offset_durability` for consumer offsets. The policy decides when written data is
//! forced to stable storage (fdatasync); see the crate README for what an ack means
//! under each. The decision is sans-IO: callers pass the current time.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::JournalError;

/// Longest sync interval accepted (a bound on what an unsynced window may hold).
pub const INTERVAL_MAX: Duration = Duration::from_secs(60);

/// When written data reaches stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "policy")]
pub enum Durability {
    /// fdatasync after every write, before it is reported complete.
    EveryBatch,
    /// fdatasync at most `interval` after a write (on the next write or tick past it).
    Interval {
        #[serde(rename = "interval_ms")]
        interval: Duration,
    },
    /// Never forced; the OS writes back when it chooses (and at roll and close).
    None,
}

impl Durability {
    /// Parses a config value: `"every"`, `"none"`, or an interval like `"250ms"`/`"2s"`.
    pub fn parse(key: &'static str, value: &str) -> Result<Durability, JournalError> {
        let bad = || JournalError::Config {
            key,
            value: 0,
            rule: "must be \"every\", \"none\" or an interval such as \"250ms\" (<= 60s)",
        };
        let value = value.trim();
        match value {
            "every" | "every_batch" => return Ok(Durability::EveryBatch),
            "none" => return Ok(Durability::None),
            _ => {}
        }
        let (digits, unit) = value
            .find(|c: char| !c.is_ascii_digit())
            .map(|at| value.split_at(at))
            .ok_or_else(bad)?;
        let number: u64 = digits.parse().map_err(|_| bad())?;
        let interval = match unit.trim() {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            _ => return Err(bad()),
        };
        if interval.is_zero() || interval > INTERVAL_MAX {
            return Err(bad());
        }
        Ok(Durability::Interval { interval })
    }
}

/// Tracks unsynced writes and says when to sync.
#[derive(Clone, Debug)]
pub struct SyncSchedule {
    durability: Durability,
    /// When the oldest unsynced write happened; None when everything is synced.
    dirty_since: Option<Instant>,
}

impl SyncSchedule {
    /// A schedule with nothing unsynced.
    pub fn new(durability: Durability) -> SyncSchedule {
        SyncSchedule {
            durability,
            dirty_since: None,
        }
    }

    /// The policy.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Records a completed write; returns whether to sync now.
    pub fn written(&mut self, now: Instant) -> bool {
        self.dirty_since.get_or_insert(now);
        self.due(now)
    }

    /// Whether a sync is due at `now` (for a periodic tick).
    pub fn due(&self, now: Instant) -> bool {
        let Some(since) = self.dirty_since else {
            return false;
        };
        match self.durability {
            Durability::EveryBatch => true,
            Durability::Interval { interval } => now.duration_since(since) >= interval,
            Durability::None => false,
        }
    }

    /// Whether anything written is not yet synced.
    pub fn is_dirty(&self) -> bool {
        self.dirty_since.is_some()
    }

    /// Records a completed sync.
    pub fn synced(&mut self) {
        self.dirty_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_none_and_intervals() {
        assert_eq!(
            Durability::parse("k", "every").unwrap(),
            Durability::EveryBatch
        );
        assert_eq!(Durability::parse("k", "none").unwrap(), Durability::None);
        assert_eq!(
            Durability::parse("k", "250ms").unwrap(),
            Durability::Interval {
                interval: Duration::from_millis(250)
            }
        );
        for bad in ["", "0ms", "61s", "10", "ms", "5m", "fast"] {
            assert!(Durability::parse("k", bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn every_batch_syncs_each_write_and_interval_waits() {
        let t0 = Instant::now();
        let mut every = SyncSchedule::new(Durability::EveryBatch);
        assert!(every.written(t0));
        let mut interval = SyncSchedule::new(Durability::Interval {
            interval: Duration::from_millis(10),
        });
        assert!(!interval.written(t0));
        assert!(!interval.written(t0 + Duration::from_millis(5)));
        assert!(interval.due(t0 + Duration::from_millis(10)));
        interval.synced();
        assert!(!interval.due(t0 + Duration::from_secs(1)));
        let mut none = SyncSchedule::new(Durability::None);
        assert!(!none.written(t0) && none.is_dirty());
        assert!(!none.due(t0 + Duration::from_secs(100)));
    }
}
