//! A simulated replica's life: crashes, restarts from its storage or a checkpoint, lost
//! disks and the state transfers that bring a replica back.

use super::{Cluster, Wipe, WIPES_OVER_REPLICAS_MAX};
use crate::sim::storage::Storage;
use crate::vsr::{Replica, Sleep, Status, Superblock};

impl Cluster {
    /// Crashes replica `r`: its memory is gone and its storage loses unsynced writes.
    pub fn crash(&mut self, r: u8) {
        self.sleeps[usize::from(r)] = Sleep::default();
        // A write in flight is lost with the actions that waited for it.
        self.superblock_writes[usize::from(r)] = None;
        if let Some(replica) = self.replicas[usize::from(r)].take() {
            self.view_changes_retired += replica.counters().view_changes;
            self.slow_skips_retired += replica.slow_counts().0;
        }
        if self.slow.slows(r) {
            // What waited for it is lost with its memory.
            let _ = self.slow_end();
        }
        // While a replica may not vote, the cluster has no fault to spare: a torn entry
        // would be a prepare that one voter may hold and the other never had, which
        // only the non-voter's vote could settle.
        // Nor at an op whose entry is unreadable on another replica (as `corrupt_one`): a
        // replica cannot tell a torn entry from a corrupted acknowledged prepare, so two
        // where nobody else holds the op are a prepare that may have committed and that
        // nobody can serve; no nack quorum truncates it, no view change ends.
        let tail = self.storages[usize::from(r)].tail();
        let tear = self.every_replica_votes()
            && tail.is_none_or(|op| {
                (0..self.options.replica_count)
                    .filter(|x| *x != r)
                    .all(|x| !self.storages[usize::from(x)].faulty_at(op))
            });
        self.storages[usize::from(r)].crash(&mut self.prng, tear);
        self.crashes += 1;
        // Under random faults a crashed replica restarts by itself; scenarios restart it.
        if self.faults_on && self.options.faults.crash_per_10k > 0 {
            let delay = 1 + self.prng.below(self.options.faults.restart_delay_max);
            self.restart_at[usize::from(r)] = self.now + delay;
        }
        self.log(|| format!("r{r} crashed"));
        self.sync_links();
    }

    /// Restarts replica `r` from its storage.
    pub fn restart(&mut self, r: u8) -> Result<(), String> {
        let i = usize::from(r);
        if self.faults_on && self.wipe_allowed(r) {
            let wipe = match self.wipe_prng.below(3) {
                0 => Wipe::Formatted,
                1 => Wipe::Replacement,
                _ => Wipe::SuperblockLost,
            };
            return self.restart_wiped(r, wipe);
        }
        self.incarnations[i] += 1;
        let mut config = self.configs[i].clone();
        config.seed = config
            .seed
            .wrapping_add(self.incarnations[i].wrapping_mul(0x9e37));
        let journal = self.storages[i].read_journal();
        let superblock = &self.storages[i].superblock;
        let checkpoint = if self.options.checkpoint_restarts {
            self.storages[i].checkpoint.clone()
        } else {
            None
        };
        let (replica, from) = match checkpoint {
            Some(checkpoint) => {
                let op = checkpoint.op;
                let Some(replica) =
                    Replica::restart_from_checkpoint(config, superblock, checkpoint, &journal)
                else {
                    return Err(format!("r{r}: checkpoint {op} has an invalid anchor"));
                };
                let held = replica.log().header(op).map(|h| h.frame.checksum);
                let committed = self.checker.get(op).map(|c| c.identity);
                if held.is_none() || held != committed {
                    return Err(format!(
                        "r{r} restarted at checkpoint {op} holding {held:?}, but \
                         {committed:?} was committed"
                    ));
                }
                self.checkpoint_restarts += 1;
                (replica, op)
            }
            None => (Replica::restart(config, superblock, &journal), 0),
        };
        self.install_restarted(r, replica, from, || {
            format!("r{r} restarted (checkpoint {from})")
        })
    }

    /// Puts the restarted `replica` in place of `r`, which replays from `from`.
    fn install_restarted(
        &mut self,
        r: u8,
        replica: Replica,
        from: u64,
        line: impl FnOnce() -> String,
    ) -> Result<(), String> {
        let i = usize::from(r);
        self.replicas[i] = Some(replica);
        self.sleeps[i] = Sleep::default();
        self.liveness[i].reset(self.now);
        // The others see it connect: a new epoch of it, after whatever its old
        // connections carried, and each wakes its groups (their Commits reach the
        // newcomer).
        if self.options.hibernate {
            self.network.drop_from(r);
            self.slow
                .drop_held(|packet| packet.from_replica_to_replica(r));
        }
        for p in (0..self.options.replica_count).filter(|p| *p != r) {
            let p = usize::from(p);
            self.liveness[p].reconnected(r, self.now);
            if let Some(peer) = self.replicas[p].as_mut() {
                self.sleeps[p].wake(peer, &self.liveness[p], self.now);
            }
        }
        self.restart_at[i] = 0;
        self.checker.restarted(r, from);
        self.log(line);
        self.sync_links();
        self.drain(r)
    }

    /// Whether the restart of `r` may lose its disk: at the seed's rate, at most
    /// replica_count + 2 times a run, and only while every other replica is a voter that
    /// kept its state and holds no unreadable journal entry (a lost disk is the one fault
    /// a cluster of 3 survives: with a torn or corrupted entry elsewhere, an op whose only
    /// copy was on the lost disk could be neither repaired nor proven never committed).
    fn wipe_allowed(&mut self, r: u8) -> bool {
        let cap = u64::from(self.options.replica_count) + WIPES_OVER_REPLICAS_MAX;
        if self.options.wipe_percent == 0 || self.wipes >= cap || !self.corrupted_ops.is_empty() {
            return false;
        }
        let others_remember = (0..self.options.replica_count)
            .filter(|x| *x != r)
            .all(|x| self.remembers(x))
            && (0..self.options.replica_count)
                .filter(|x| *x != r)
                .all(|x| !self.storages[usize::from(x)].holds_faulty());
        others_remember && self.wipe_prng.chance(self.options.wipe_percent, 100)
    }

    /// Restarts `r` (down) having lost its disk or its superblock.
    pub fn restart_wiped(&mut self, r: u8, wipe: Wipe) -> Result<(), String> {
        assert!(self.replicas[usize::from(r)].is_none(), "r{r} is up");
        let i = usize::from(r);
        self.incarnations[i] += 1;
        self.wipes += 1;
        let mut config = self.configs[i].clone();
        config.seed = config
            .seed
            .wrapping_add(self.incarnations[i].wrapping_mul(0x9e37));
        let (replica, what) = match wipe {
            Wipe::Formatted => {
                self.storages[i] = Storage::new(self.options.defer_gaps);
                (Replica::unformed(config), "formatted again")
            }
            Wipe::Replacement => {
                self.storages[i] = Storage::new(self.options.defer_gaps);
                (Replica::replacement(config), "as a replacement")
            }
            Wipe::SuperblockLost => {
                // Every superblock copy unreadable: the journal and checkpoint are there,
                // the promises the superblock held are not.
                let superblock = Superblock {
                    replacement: true,
                    ..Superblock::default()
                };
                self.storages[i].superblock = superblock.clone();
                let journal = self.storages[i].read_journal();
                let replica = match self.storages[i].checkpoint.clone() {
                    Some(checkpoint) if self.options.checkpoint_restarts => {
                        Replica::restart_from_checkpoint(config, &superblock, checkpoint, &journal)
                            .ok_or_else(|| format!("r{r}: checkpoint with an invalid anchor"))?
                    }
                    _ => Replica::restart(config, &superblock, &journal),
                };
                (replica, "with its superblock unreadable")
            }
        };
        let from = replica.commit();
        self.install_restarted(r, replica, from, || {
            format!("r{r} lost its disk, restarted {what} (commit {from})")
        })
    }

    /// A simulated state transfer: `r` installs the committed state of `from` at its
    /// commit point (the anchor prepare and the stamp position come along) and restarts
    /// from that checkpoint, as the appliance does after installing artifacts. When the
    /// source is down or cannot read its anchor, `r` restarts from its own state and asks
    /// again.
    pub(super) fn state_transfer(&mut self, r: u8, from: u8) -> Result<(), String> {
        if self.replicas[usize::from(r)].is_none() {
            return Ok(());
        }
        if self.superblock_writes[usize::from(r)].is_some()
            || self.superblock_writes[usize::from(from)].is_some()
        {
            // As the appliance: no install while the replica's superblock write is in
            // flight (the restart would read the superblock without it), and no offer
            // from a source whose Commit actions wait behind one (its state is not yet
            // at its commit point); later.
            self.transfers.push((r, from));
            return Ok(());
        }
        if let Some(checkpoint) = self.checkpoint_of(usize::from(from)) {
            self.log(|| format!("r{r} installs r{from}'s checkpoint {}", checkpoint.op));
            self.storages[usize::from(r)].install(checkpoint);
            self.state_transfers += 1;
        }
        if let Some(replica) = self.replicas[usize::from(r)].take() {
            self.view_changes_retired += replica.counters().view_changes;
            self.slow_skips_retired += replica.slow_counts().0;
        }
        self.restart(r)
    }

    /// Every live replica checkpoints its state at its commit point (the simulator's
    /// state machine is the checker's history and the replies' results, applied up to
    /// there unless Commit actions wait behind a superblock write: then it does not).
    /// With `evict`, it then drops what the checkpoint covers from memory.
    pub(super) fn take_checkpoints(&mut self) {
        for i in 0..self.replicas.len() {
            if self.replicas[i]
                .as_ref()
                .is_none_or(|replica| replica.status() != Status::Normal)
            {
                continue;
            }
            if self.superblock_writes[i].is_some() {
                // Its Commit actions wait behind the write: not yet applied.
                continue;
            }
            let Some(checkpoint) = self.checkpoint_of(i) else {
                continue;
            };
            let op = checkpoint.op;
            self.storages[i].checkpoint = Some(checkpoint);
            if !self.options.evict {
                continue;
            }
            let keep = self.evict_prng.below(6);
            let release = self.evict_prng.chance(1, 2);
            let Some(replica) = self.replicas[i].as_mut() else {
                continue;
            };
            replica.on_checkpoint(op.saturating_sub(keep));
            if keep == 0 && release && replica.release_anchor() {
                self.anchors_released += 1;
                self.log(|| format!("r{i} released the prepare of its commit point {op}"));
            }
        }
    }

    /// The checkpoint of replica `i` at its commit point, its prepare read back from its
    /// storage when it was released from memory (None when that read fails too).
    fn checkpoint_of(&mut self, i: usize) -> Option<crate::vsr::Checkpoint> {
        let replica = self.replicas[i].as_mut()?;
        if let Some(op) = replica.released_anchor() {
            let bytes = self.storages[i].entry(op)?;
            if !replica.restore_anchor(bytes.as_bytes()) {
                return None;
            }
        }
        replica.checkpoint()
    }
}
