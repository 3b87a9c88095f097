//! The committed partition prepares a node keeps in memory to serve repair to a lagging
//! replica (older ones are answered RangeEvicted, and a replica further behind catches
//! up by state transfer).
//!
//! Each partition keeps at most `PARTITION_REPAIR_WINDOW_OPS` ops and
//! `PARTITION_REPAIR_WINDOW_BYTES` of them (but always a pipeline's worth), and all
//! partitions together at most `REPAIR_WINDOWS_BYTES_MAX`: past it the largest windows
//! give up their oldest prepares first, down to one op each (the consensus keeps its
//! commit op's prepare). Without the node-wide bound, 1,000 partitions written at once
//! would each keep up to 32 MiB: the node's memory would grow with every partition
//! written until it ran out.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// Ops in a partition's repair window at most.
pub const PARTITION_REPAIR_WINDOW_OPS: u64 = 256;
const _: () = assert!(PARTITION_REPAIR_WINDOW_OPS > replication::vsr::PIPELINE_MAX);
/// The byte bound of each partition's repair window (256 prepares of 1 MiB batches
/// would hold 256 MiB per partition).
pub const PARTITION_REPAIR_WINDOW_BYTES: u64 = 32 << 20;
/// The byte bound of every partition's repair window together.
pub const REPAIR_WINDOWS_BYTES_MAX: u64 = 256 << 20;

/// The committed ops (and their sizes) a partition group keeps for repair, oldest first.
#[derive(Default)]
struct RepairWindow {
    ops: VecDeque<(u64, u64)>,
    bytes: u64,
}

impl RepairWindow {
    /// The highest op that may leave memory (0: none).
    fn floor(&self) -> u64 {
        self.ops.front().map_or(0, |(op, _)| op - 1)
    }
}

/// Every partition's repair window, with their total.
#[derive(Default)]
pub(super) struct RepairWindows {
    windows: HashMap<u64, RepairWindow>,
    /// (bytes, group) of every window holding more than one op: the largest gives up
    /// prepares first.
    by_size: BTreeSet<(u64, u64)>,
    bytes: u64,
}

impl RepairWindows {
    /// Takes committed `op` of `group` (`bytes` long) into its window, trims the window
    /// to its bounds (keeping at least `ops_min` ops) and every window to the node-wide
    /// bound. Returns the groups whose floor rose, with their new floor: the prepares
    /// at or below it may leave memory.
    pub(super) fn push(
        &mut self,
        group: u64,
        op: u64,
        bytes: u64,
        ops_min: u64,
    ) -> Vec<(u64, u64)> {
        let window = self.windows.entry(group).or_default();
        self.by_size.remove(&(window.bytes, group));
        let floor = window.floor();
        window.ops.push_back((op, bytes));
        window.bytes += bytes;
        self.bytes += bytes;
        while window.ops.len() as u64 > ops_min.max(1)
            && (window.ops.len() as u64 > PARTITION_REPAIR_WINDOW_OPS
                || window.bytes > PARTITION_REPAIR_WINDOW_BYTES)
        {
            if let Some((_, bytes)) = window.ops.pop_front() {
                window.bytes -= bytes;
                self.bytes -= bytes;
            }
        }
        let mut raised = Vec::new();
        if window.floor() > floor {
            raised.push((group, window.floor()));
        }
        if window.ops.len() > 1 {
            self.by_size.insert((window.bytes, group));
        }
        self.trim_to(REPAIR_WINDOWS_BYTES_MAX, &mut raised);
        raised
    }

    /// Gives up the oldest prepares of the largest windows until every window together
    /// holds at most `bytes_max` or each holds one op.
    fn trim_to(&mut self, bytes_max: u64, raised: &mut Vec<(u64, u64)>) {
        while self.bytes > bytes_max {
            let Some((_, group)) = self.by_size.pop_last() else {
                return;
            };
            let Some(window) = self.windows.get_mut(&group) else {
                continue;
            };
            if let Some((_, bytes)) = window.ops.pop_front() {
                window.bytes -= bytes;
                self.bytes -= bytes;
            }
            if window.ops.len() > 1 {
                self.by_size.insert((window.bytes, group));
            }
            let floor = window.floor();
            match raised.iter_mut().find(|(g, _)| *g == group) {
                Some(entry) => entry.1 = floor,
                None => raised.push((group, floor)),
            }
        }
    }

    /// Forgets the window of `group` (its replica stopped or was replaced).
    pub(super) fn remove(&mut self, group: u64) {
        if let Some(window) = self.windows.remove(&group) {
            self.by_size.remove(&(window.bytes, group));
            self.bytes -= window.bytes;
        }
    }

    /// Bytes of prepares held by every window.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floor(windows: &RepairWindows, group: u64) -> u64 {
        windows.windows.get(&group).map_or(0, RepairWindow::floor)
    }

    #[test]
    fn a_window_is_bounded_by_ops_and_bytes_but_keeps_a_pipeline() {
        let mut windows = RepairWindows::default();
        for op in 1..=300 {
            windows.push(1, op, 100, 2);
        }
        // 256 ops of 100 bytes fit the bytes bound: ops 45..=300 stay.
        assert_eq!(floor(&windows, 1), 300 - PARTITION_REPAIR_WINDOW_OPS);
        // 16 MiB prepares against the 32 MiB bound: two stay.
        for op in 301..=304 {
            windows.push(1, op, 16 << 20, 2);
        }
        assert_eq!(floor(&windows, 1), 302);
        assert_eq!(windows.bytes(), 32 << 20);
        // Never below the pipeline's worth, however large the prepares.
        let raised = windows.push(1, 305, 40 << 20, 2);
        assert_eq!(raised, vec![(1, 303)]);
        assert_eq!(windows.windows[&1].ops.len(), 2);
        windows.remove(1);
        assert_eq!(windows.bytes(), 0);
    }

    #[test]
    fn many_windows_share_the_node_bound_largest_first() {
        let mut windows = RepairWindows::default();
        let mb = 1 << 20;
        // Eight busy partitions fill their own bound, and together the node's.
        for op in 1..=40 {
            for group in 1..=8 {
                windows.push(group, op, mb, 9);
            }
        }
        assert_eq!(windows.bytes(), REPAIR_WINDOWS_BYTES_MAX);
        // Two hundred more written once each: the busy windows give up their oldest
        // prepares, evenly; the new ones keep theirs.
        for group in 100..300 {
            let raised = windows.push(group, 1, mb / 2, 9);
            assert!(raised
                .iter()
                .all(|(g, floor)| (1..=8).contains(g) && *floor > 8));
            assert!(windows.bytes() <= REPAIR_WINDOWS_BYTES_MAX);
        }
        let busy: Vec<u64> = (1..=8).map(|g| windows.windows[&g].bytes).collect();
        let (least, most) = (busy.iter().min().unwrap(), busy.iter().max().unwrap());
        assert!(most - least <= mb, "{busy:?}");
        assert!(*most < PARTITION_REPAIR_WINDOW_BYTES - 8 * mb);
        assert!((100..300).all(|g| windows.windows[&g].ops.len() == 1));
        // A thousand more of 1 MiB: every busy window goes down to one op, and none
        // below (the total then stays over the bound).
        for group in 1_000..2_000 {
            windows.push(group, 1, mb, 9);
        }
        assert!(windows.bytes() > REPAIR_WINDOWS_BYTES_MAX);
        assert!(windows.windows.values().all(|w| w.ops.len() == 1));
        assert!((1..=8).all(|g| floor(&windows, g) == 39));
        assert!(windows.by_size.is_empty());
        // A window of many small prepares beside one of a single large one: the small
        // ones go, the large one stays.
        let mut windows = RepairWindows::default();
        windows.push(1, 1, REPAIR_WINDOWS_BYTES_MAX - 4 * mb, 2);
        for op in 1..=8 {
            windows.push(2, op, mb, 2);
        }
        assert_eq!(windows.bytes(), REPAIR_WINDOWS_BYTES_MAX);
        assert_eq!(floor(&windows, 2), 4);
        assert_eq!(floor(&windows, 1), 0);
    }
}
