//! Partition groups' VSR superblock writes, beside the node loop.
//!
//! A group's superblock write holds back that group's later actions only (vsr/mod.rs:
//! a PersistSuperblock completes before any later action of the group runs), so the
//! loop does not wait for it: the group's actions queue behind the write while every
//! other group, and the node's own work, goes on.
//!
//! Writes go in rounds, one round in flight per lane: the writes queued while a round
//! runs make the next one (group commit), so a view change of thousands of groups costs
//! a few rounds, not one write per group, and with many writes in a round one sync of
//! the file system covers them all. Groups that journaled a prepare lately (their
//! prepare log is open) have a lane of their own: when a node's thousands of idle groups
//! change views at once, a busy group's view change does not wait for their rounds.
//!
//! Whatever replaces or stops a group's replica settles its write first
//! (`Node::settle_superblock`): a write still in flight would otherwise race the new
//! replica's own.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Instant;

use glommio::channels::local_channel::{LocalReceiver, LocalSender};
use replication::vsr::{self, Action};

use super::files;

/// A round with at least this many superblocks syncs them with one sync of the file
/// system.
const SYNCED_TOGETHER: usize = 32;

/// One superblock write: the group, its partition directory, what is written.
type Write = (u64, PathBuf, vsr::Superblock);

/// A round that completed: each write with its outcome.
pub(super) struct RoundDone {
    lane: usize,
    outcomes: Vec<(Write, Result<(), files::FileError>)>,
    started: Instant,
}

/// The lane of groups that journaled a prepare lately, and the lane of the others.
const BUSY: usize = 0;
const IDLE: usize = 1;

pub(super) struct Superblocks {
    /// Groups whose write is queued or in flight, with the actions they queued since,
    /// in order.
    held: BTreeMap<u64, Vec<Action>>,
    /// Per lane: the writes for its next round, and whether a round is in flight.
    queued: [Vec<Write>; 2],
    in_flight: [bool; 2],
    /// Actions of groups whose write is durable, to run before anything they queue next.
    released: Vec<(u64, Action)>,
    done_tx: Rc<LocalSender<RoundDone>>,
    pub(super) done: LocalReceiver<RoundDone>,
    /// The data directory, whose file system a round's shared sync covers.
    data_dir: PathBuf,
}

impl Superblocks {
    pub(super) fn new(data_dir: PathBuf) -> Superblocks {
        let (done_tx, done) = glommio::channels::local_channel::new_unbounded();
        Superblocks {
            held: BTreeMap::new(),
            queued: [Vec::new(), Vec::new()],
            in_flight: [false; 2],
            released: Vec::new(),
            done_tx: Rc::new(done_tx),
            done,
            data_dir,
        }
    }

    /// Whether `group` waits on a superblock write.
    pub(super) fn holds(&self, group: u64) -> bool {
        self.held.contains_key(&group)
    }

    /// Holds `action` back behind the group's write, if it has one; otherwise returns it.
    pub(super) fn hold(&mut self, group: u64, action: Action) -> Option<Action> {
        match self.held.get_mut(&group) {
            Some(after) => {
                after.push(action);
                None
            }
            None => Some(action),
        }
    }

    /// Queues a write of `group`'s superblock (in the busy lane if `busy`); the group's
    /// later actions wait for it.
    pub(super) fn queue(
        &mut self,
        group: u64,
        dir: PathBuf,
        superblock: vsr::Superblock,
        busy: bool,
    ) {
        self.held.insert(group, Vec::new());
        let lane = if busy { BUSY } else { IDLE };
        self.queued[lane].push((group, dir, superblock));
    }

    /// The actions released since last taken, in the order their groups queued them.
    pub(super) fn take_released(&mut self) -> Vec<(u64, Action)> {
        std::mem::take(&mut self.released)
    }

    /// A group whose write failed loses its held actions (the messages that promise
    /// what was not written).
    pub(super) fn drop_held(&mut self, group: u64) {
        self.held.remove(&group);
    }

    pub(super) fn release(&mut self, group: u64) {
        if let Some(after) = self.held.remove(&group) {
            self.released
                .extend(after.into_iter().map(|action| (group, action)));
        }
    }

    /// A round completed: its lane may start the next one. Returns its outcomes.
    pub(super) fn complete(
        &mut self,
        done: RoundDone,
    ) -> Vec<(Write, Result<(), files::FileError>)> {
        super::system::slow_step("superblock round", done.started);
        self.in_flight[done.lane] = false;
        done.outcomes
    }

    /// Starts a round in each lane that has writes queued and none in flight.
    pub(super) fn start_rounds(&mut self) {
        for lane in [BUSY, IDLE] {
            if self.in_flight[lane] || self.queued[lane].is_empty() {
                continue;
            }
            self.in_flight[lane] = true;
            let round = std::mem::take(&mut self.queued[lane]);
            let done = self.done_tx.clone();
            let data_dir = self.data_dir.clone();
            glommio::spawn_local(async move {
                let started = Instant::now();
                let outcomes = write_round(&data_dir, round).await;
                // Unbounded: never refused while the node holds the receiver.
                let _ = done.try_send(RoundDone {
                    lane,
                    outcomes,
                    started,
                });
            })
            .detach();
        }
    }
}

/// Writes `writes`, each on the blocking pool; many at once are written in place
/// unsynced, then one sync of the file system covers them all (one device flush
/// instead of one per group).
async fn write_round(
    data_dir: &std::path::Path,
    writes: Vec<Write>,
) -> Vec<(Write, Result<(), files::FileError>)> {
    let shared = (writes.len() >= SYNCED_TOGETHER)
        .then(|| files::SharedSync::open(data_dir).ok())
        .flatten();
    let mut written = files::write_round(writes, shared.as_ref()).await;
    if let Some(shared) = shared {
        let synced = glommio::executor()
            .spawn_blocking(move || shared.sync())
            .await;
        if let Err(error) = synced {
            // Which of them reached the disk is unknown: none counts as written.
            for (_, _, outcome) in &mut written {
                if outcome.is_ok() {
                    *outcome = Err(error.duplicate());
                }
            }
        }
    }
    written
        .into_iter()
        .map(|(write, _, outcome)| (write, outcome))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truncate(op_max: u64) -> Action {
        Action::JournalTruncate { op_max }
    }

    fn ops(actions: &[(u64, Action)]) -> Vec<(u64, u64)> {
        actions
            .iter()
            .map(|(group, action)| match action {
                Action::JournalTruncate { op_max } => (*group, *op_max),
                other => panic!("unexpected action {other:?}"),
            })
            .collect()
    }

    /// The next round to complete: its groups, each written.
    async fn next_round(superblocks: &mut Superblocks) -> Vec<u64> {
        let done = superblocks.done.recv().await.expect("a round");
        superblocks
            .complete(done)
            .into_iter()
            .map(|((group, _, _), outcome)| {
                outcome.expect("written");
                group
            })
            .collect()
    }

    #[test]
    fn a_group_waits_for_its_write_and_the_others_do_not() {
        let mut superblocks = Superblocks::new(PathBuf::from("data"));
        superblocks.queue(7, PathBuf::from("p7"), vsr::Superblock::default(), false);
        assert!(superblocks.holds(7));
        // Another group's action runs at once; group 7's wait, in order.
        assert!(superblocks.hold(8, truncate(1)).is_some());
        assert!(superblocks.hold(7, truncate(2)).is_none());
        assert!(superblocks.hold(7, truncate(3)).is_none());
        assert!(superblocks.take_released().is_empty());
        superblocks.release(7);
        assert!(!superblocks.holds(7));
        assert_eq!(ops(&superblocks.take_released()), vec![(7, 2), (7, 3)]);
        // Released once: nothing runs twice, and the group's next action runs at once.
        assert!(superblocks.take_released().is_empty());
        assert!(superblocks.hold(7, truncate(4)).is_some());
    }

    #[test]
    fn busy_groups_are_written_in_a_round_of_their_own() {
        let dir = std::env::temp_dir().join(format!("superblocks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rounds = journal::runtime::block_on(async {
            let mut superblocks = Superblocks::new(dir.clone());
            for group in 1..=40u64 {
                let group_dir = dir.join(group.to_string());
                std::fs::create_dir_all(&group_dir).expect("create dir");
                let superblock = vsr::Superblock {
                    view: group as u32,
                    ..Default::default()
                };
                superblocks.queue(group, group_dir, superblock, group == 3);
            }
            superblocks.start_rounds();
            let mut rounds = Vec::new();
            for _ in 0..2 {
                rounds.push(next_round(&mut superblocks).await);
            }
            rounds
        })
        .expect("executor");
        let mut sizes: Vec<usize> = rounds.iter().map(Vec::len).collect();
        sizes.sort();
        assert_eq!(sizes, vec![1, 39]);
        assert!(rounds.iter().any(|round| round == &vec![3]));
        for group in 1..=40u64 {
            let read = files::read_vsr_superblock(&dir.join(group.to_string())).expect("read");
            assert_eq!(read.view, group as u32);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writes_queued_while_a_round_runs_make_the_next_round() {
        let dir = std::env::temp_dir().join(format!("superblocks-next-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let rounds = journal::runtime::block_on(async {
            let mut superblocks = Superblocks::new(dir.clone());
            let queue = |superblocks: &mut Superblocks, group: u64| {
                let group_dir = dir.join(group.to_string());
                std::fs::create_dir_all(&group_dir).expect("create dir");
                superblocks.queue(group, group_dir, vsr::Superblock::default(), false);
            };
            queue(&mut superblocks, 1);
            superblocks.start_rounds();
            queue(&mut superblocks, 2);
            queue(&mut superblocks, 3);
            // The lane's round is in flight: 2 and 3 wait for it.
            superblocks.start_rounds();
            let mut rounds = Vec::new();
            for _ in 0..2 {
                rounds.push(next_round(&mut superblocks).await);
                superblocks.start_rounds();
            }
            rounds
        })
        .expect("executor");
        assert_eq!(rounds, vec![vec![1], vec![2, 3]]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
