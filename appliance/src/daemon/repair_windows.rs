//! The committed partition prepares a node keeps in memory to serve repair to a lagging
//! replica (older ones are answered RangeEvicted, and a replica further behind catches
//! up by state transfer).
//!
//! Each partition keeps at most `PARTITION_REPAIR_WINDOW_OPS` ops and
//! `PARTITION_REPAIR_WINDOW_BYTES` of them (but always a pipeline's worth), and all
//! partitions together at most `limits.repair_memory_max`: past it the largest windows
//! give up their oldest prepares first, down to one op each: the prepare of the commit
//! point, which the consensus keeps as the parent of the next op. While every window
//! together is still over the bound, a partition checkpointed at its commit point gives
//! that one up too (`release`): the consensus keeps its header only and reads the
//! prepare back from disk when a state transfer asks for it. Without the node-wide
//! bound, 1,000 partitions written at once would each keep up to 32 MiB, and every
//! partition ever written its last batch: the node's memory would grow with every
//! partition written until it ran out.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// Ops in a partition's repair window at most.
pub const PARTITION_REPAIR_WINDOW_OPS: u64 = 256;
const _: () = assert!(PARTITION_REPAIR_WINDOW_OPS > replication::vsr::PIPELINE_MAX);
/// The byte bound of each partition's repair window (256 prepares of 1 MiB batches
/// would hold 256 MiB per partition).
pub const PARTITION_REPAIR_WINDOW_BYTES: u64 = 32 << 20;
/// The byte bound of every partition's repair window together, by default
/// (`limits.repair_memory_max`).
pub const REPAIR_WINDOWS_BYTES_MAX: u64 = 256 << 20;

/// The committed ops (and their sizes) a partition group keeps for repair, oldest first.
#[derive(Default)]
struct RepairWindow {
    ops: VecDeque<(u64, u64)>,
    bytes: u64,
    /// The op `release` gave up (0: none), the floor while no op is held.
    released: u64,
}

impl RepairWindow {
    /// The highest op that may leave memory (0: none).
    fn floor(&self) -> u64 {
        self.ops.front().map_or(self.released, |(op, _)| op - 1)
    }
}

/// Every partition's repair window, with their total.
pub(super) struct RepairWindows {
    windows: HashMap<u64, RepairWindow>,
    /// (bytes, group) of every window holding more than one op: the largest gives up
    /// prepares first.
    by_size: BTreeSet<(u64, u64)>,
    bytes: u64,
    /// The bound of every window together.
    bytes_max: u64,
}

impl Default for RepairWindows {
    fn default() -> RepairWindows {
        RepairWindows::new(REPAIR_WINDOWS_BYTES_MAX)
    }
}

impl RepairWindows {
    pub(super) fn new(bytes_max: u64) -> RepairWindows {
        RepairWindows {
            windows: HashMap::new(),
            by_size: BTreeSet::new(),
            bytes: 0,
            bytes_max,
        }
    }

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
        self.trim_to(self.bytes_max, &mut raised);
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

    /// Whether every window together holds more than the node-wide bound.
    pub(super) fn over_bound(&self) -> bool {
        self.bytes > self.bytes_max
    }

    /// Whether the window of `group` may give up `op`, its commit point (checkpointed):
    /// while every window together is over the bound, when `op` is the one prepare it
    /// holds, or it holds none (a prepare nothing counted).
    pub(super) fn releasable(&self, group: u64, op: u64) -> bool {
        self.over_bound()
            && self.windows.get(&group).is_none_or(|window| {
                window.ops.is_empty() || (window.ops.len() == 1 && window.ops[0].0 == op)
            })
    }

    /// Gives up `op` of `group` (`releasable`): its prepare left memory.
    pub(super) fn release(&mut self, group: u64, op: u64) {
        let window = self.windows.entry(group).or_default();
        self.bytes -= window.bytes;
        window.ops.clear();
        window.bytes = 0;
        window.released = op;
    }

    /// Counts a prepare of `group` held since start (the anchor of its checkpoint, read
    /// back from disk) as its window's only op, so the node-wide bound sees it.
    pub(super) fn hold_anchor(&mut self, group: u64, op: u64, bytes: u64) {
        let window = self.windows.entry(group).or_default();
        if !window.ops.is_empty() {
            return;
        }
        window.ops.push_back((op, bytes));
        window.bytes = bytes;
        self.bytes += bytes;
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

    #[test]
    fn over_the_bound_a_window_of_its_commit_point_alone_gives_it_up() {
        let mut windows = RepairWindows::default();
        let mb = 1 << 20;
        // Under the bound nothing is released.
        windows.push(1, 7, mb, 2);
        assert!(!windows.releasable(1, 7));
        // Prepares read back at start count too: 300 partitions' anchors of 1 MiB.
        for group in 100..400 {
            windows.hold_anchor(group, 3, mb);
        }
        assert!(windows.over_bound());
        // Only the window's one op, and only when it is the commit point named.
        assert!(!windows.releasable(1, 6));
        // Over the bound a window keeps one op (its commit point), not the one below.
        windows.push(2, 1, mb, 2);
        windows.push(2, 2, mb, 2);
        assert_eq!(floor(&windows, 2), 1);
        assert!(!windows.releasable(2, 1));
        assert!(windows.releasable(2, 2));
        assert!(windows.releasable(1, 7));
        let before = windows.bytes();
        windows.release(1, 7);
        assert_eq!(windows.bytes(), before - mb);
        assert_eq!(floor(&windows, 1), 7);
        // The next op starts the window again above it, with no floor raised.
        assert_eq!(windows.push(1, 8, mb, 2), vec![]);
        assert_eq!(floor(&windows, 1), 7);
        // Released until the bound holds, then no more.
        let mut released = 0;
        for group in 100..400 {
            if windows.releasable(group, 3) {
                windows.release(group, 3);
                released += 1;
            }
        }
        assert!(!windows.over_bound());
        assert!(windows.bytes() > REPAIR_WINDOWS_BYTES_MAX - mb);
        assert_eq!(released, 300 - (REPAIR_WINDOWS_BYTES_MAX / mb - 2));
    }
}
