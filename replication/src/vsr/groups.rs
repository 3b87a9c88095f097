//! One VSR group per consensus plane (docs/protocol.md, "Consensus planes"): the
//! metadata plane (group 1 << 63) and one group per partition, routed by the group field
//! every consensus header carries.

use std::collections::{BTreeMap, BTreeSet};

use crate::wire::decode::group_of;
use crate::wire::{decode, decode_trusted, Frame, FrameError, Limits, Message, METADATA_GROUP};

use super::hibernate::{PeerLiveness, Sleep, Woke};
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
    /// Idle groups that sleep, when enabled (`hibernate`).
    hibernation: Option<Hibernation>,
}

/// Which groups sleep, and what the node knows of its peers (`hibernate.rs`).
#[derive(Debug)]
struct Hibernation {
    /// This node's replica id.
    replica: u8,
    now: u64,
    peers: PeerLiveness,
    sleeps: BTreeMap<u64, Sleep>,
    /// Groups not asleep: the ones ticked.
    awake: BTreeSet<u64>,
    /// Sleeping groups by the replica they take for their primary.
    asleep_by_primary: BTreeMap<u8, BTreeSet<u64>>,
    /// Sleeping primaries by the tick of their next refresh (`Sleep::refresh_due`): a
    /// node tick looks only at the ones due, not at every sleeping group.
    refreshes: BTreeSet<(u64, u64)>,
    /// Times groups fell asleep, and woke because their primary's node was silent.
    pub sleeps_total: u64,
    pub silent_wakes: u64,
}

/// Counts of sleeping groups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SleepStats {
    /// Groups asleep now.
    pub asleep: u64,
    /// Times a group fell asleep, and woke because its primary's node was silent.
    pub sleeps: u64,
    pub silent_wakes: u64,
}

impl Hibernation {
    /// Wakes `group` if it sleeps (a request or completion arrived for it).
    fn wake(&mut self, group: u64, replica: &mut Replica) {
        let Some(sleep) = self.sleeps.get_mut(&group) else {
            return;
        };
        let filed = Filed::of(sleep, replica);
        sleep.wake(replica, &self.peers, self.now);
        self.refile(group, filed, replica);
    }

    /// Delivers a peer's frame to `group`'s replica (`Sleep::on_message`): a sleeping
    /// replica the frame leaves with nothing to do sleeps on.
    fn deliver(&mut self, group: u64, replica: &mut Replica, handle: impl FnOnce(&mut Replica)) {
        let Some(sleep) = self.sleeps.get_mut(&group) else {
            handle(replica);
            return;
        };
        let filed = Filed::of(sleep, replica);
        sleep.on_message(replica, &self.peers, self.now, handle);
        self.refile(group, filed, replica);
    }

    /// Brings the indexes of `group` up to date after its sleep changed from `before`:
    /// a group that woke leaves them and is ticked again; one that sleeps on stays filed
    /// under its primary, and a primary's next refresh is queued.
    fn refile(&mut self, group: u64, before: Filed, replica: &Replica) {
        let Some(sleep) = self.sleeps.get(&group) else {
            return;
        };
        // Awake before and after (a busy group's frames), or asleep under the same
        // primary with the same refresh: filed as it is.
        if !before.asleep && !sleep.asleep()
            || before.asleep
                && sleep.asleep()
                && before.leader == replica.config().primary_of(replica.view())
                && before.refresh_due == sleep.refresh_due(replica)
        {
            return;
        }
        if let Some(due) = before.refresh_due {
            self.refreshes.remove(&(due, group));
        }
        if before.asleep {
            if let Some(set) = self.asleep_by_primary.get_mut(&before.leader) {
                set.remove(&group);
            }
        }
        if sleep.asleep() {
            let leader = replica.config().primary_of(replica.view());
            self.asleep_by_primary
                .entry(leader)
                .or_default()
                .insert(group);
            if let Some(due) = sleep.refresh_due(replica) {
                self.refreshes.insert((due, group));
            }
            self.awake.remove(&group);
        } else {
            self.awake.insert(group);
        }
    }

    /// Forgets `group` (removed, or replaced by a new replica); `replica` is the one it
    /// had.
    fn forget(&mut self, group: u64, replica: Option<&Replica>) {
        for set in self.asleep_by_primary.values_mut() {
            set.remove(&group);
        }
        if let (Some(sleep), Some(replica)) = (self.sleeps.remove(&group), replica) {
            if let Some(due) = sleep.refresh_due(replica) {
                self.refreshes.remove(&(due, group));
            }
        }
        self.awake.remove(&group);
    }

    /// Every sleeping group whose primary's node went silent wakes and times it out.
    fn wake_for_silence(
        &mut self,
        replicas: &mut BTreeMap<u64, Replica>,
        touched: &mut BTreeSet<u64>,
    ) {
        let silent: Vec<u8> = self
            .asleep_by_primary
            .iter()
            .filter(|(peer, set)| {
                **peer != self.replica && !set.is_empty() && !self.peers.alive(**peer, self.now)
            })
            .map(|(peer, _)| *peer)
            .collect();
        for peer in silent {
            let groups: Vec<u64> = self
                .asleep_by_primary
                .get(&peer)
                .map(|set| set.iter().copied().collect())
                .unwrap_or_default();
            for group in groups {
                self.check(group, replicas, touched);
            }
        }
    }

    /// Groups asleep now (every hosted group is in `sleeps`, the awake ones in `awake`).
    fn asleep_count(&self) -> usize {
        self.sleeps.len() - self.awake.len()
    }

    /// The sleeping primaries whose refresh is due broadcast their Commits.
    fn refresh(&mut self, replicas: &mut BTreeMap<u64, Replica>, touched: &mut BTreeSet<u64>) {
        let later = self.refreshes.split_off(&(self.now + 1, 0));
        let due = std::mem::replace(&mut self.refreshes, later);
        for (_, group) in due {
            self.check(group, replicas, touched);
            // Queued again for its next refresh (`refile` leaves a group whose filing did
            // not change as it is, and this one left the queue above).
            if let (Some(sleep), Some(replica)) = (self.sleeps.get(&group), replicas.get(&group)) {
                if let Some(next) = sleep.refresh_due(replica) {
                    self.refreshes.insert((next.max(self.now + 1), group));
                }
            }
        }
    }

    /// `Sleep::check` of one sleeping group, keeping the indexes.
    fn check(
        &mut self,
        group: u64,
        replicas: &mut BTreeMap<u64, Replica>,
        touched: &mut BTreeSet<u64>,
    ) {
        let (Some(sleep), Some(replica)) = (self.sleeps.get_mut(&group), replicas.get_mut(&group))
        else {
            return;
        };
        let filed = Filed::of(sleep, replica);
        match sleep.check(replica, &self.peers, self.now) {
            None => {}
            Some(woke) => {
                if woke == Woke::PrimarySilent {
                    self.silent_wakes += 1;
                }
                touched.insert(group);
            }
        }
        self.refile(group, filed, replica);
    }

    /// When no awake group has this node for its primary, one that sleeps wakes: the
    /// peers hear this node by its Commits.
    fn keep_a_beacon(&mut self, replicas: &mut BTreeMap<u64, Replica>) {
        let leads_awake = self
            .awake
            .iter()
            .any(|g| replicas.get(g).is_some_and(Replica::is_primary));
        if leads_awake {
            return;
        }
        let Some(group) = self
            .asleep_by_primary
            .get(&self.replica)
            .and_then(|set| set.iter().next().copied())
        else {
            return;
        };
        if let Some(replica) = replicas.get_mut(&group) {
            self.wake(group, replica);
        }
    }
}

/// Where a group's sleep was filed before something changed it (`Hibernation::refile`).
#[derive(Clone, Copy)]
struct Filed {
    asleep: bool,
    leader: u8,
    refresh_due: Option<u64>,
}

impl Filed {
    fn of(sleep: &Sleep, replica: &Replica) -> Filed {
        Filed {
            asleep: sleep.asleep(),
            leader: replica.config().primary_of(replica.view()),
            refresh_due: sleep.refresh_due(replica),
        }
    }
}

impl Groups {
    /// No groups yet.
    pub fn new() -> Groups {
        Groups::default()
    }

    /// Lets idle partition groups sleep (`hibernate.rs`): this node is replica
    /// `replica` of `replica_count`, and a peer not heard for `heartbeat_timeout_ticks`
    /// is silent. The metadata group never sleeps.
    pub fn hibernate(&mut self, replica: u8, replica_count: u8, heartbeat_timeout_ticks: u64) {
        let mut hibernation = Hibernation {
            replica,
            now: 0,
            peers: PeerLiveness::new(replica_count, heartbeat_timeout_ticks, 0),
            sleeps: BTreeMap::new(),
            awake: self.replicas.keys().copied().collect(),
            asleep_by_primary: BTreeMap::new(),
            refreshes: BTreeSet::new(),
            sleeps_total: 0,
            silent_wakes: 0,
        };
        for group in self.replicas.keys() {
            hibernation.sleeps.insert(*group, Sleep::default());
        }
        self.hibernation = Some(hibernation);
    }

    /// Hosts `replica` under its configured group (replacing a previous one).
    pub fn insert(&mut self, replica: Replica) {
        let group = replica.config().group;
        if let Some(h) = self.hibernation.as_mut() {
            h.forget(group, self.replicas.get(&group));
            h.sleeps
                .insert(group, Sleep::of_new(&replica, &h.peers, h.now));
            h.awake.insert(group);
        }
        self.replicas.insert(group, replica);
        self.touched.insert(group);
    }

    /// Stops hosting `group` (its replica, with whatever it held in memory, is returned).
    pub fn remove(&mut self, group: u64) -> Option<Replica> {
        self.touched.remove(&group);
        if let Some(h) = self.hibernation.as_mut() {
            h.forget(group, self.replicas.get(&group));
        }
        self.replicas.remove(&group)
    }

    /// Whether `group` sleeps.
    pub fn asleep(&self, group: u64) -> bool {
        self.hibernation
            .as_ref()
            .and_then(|h| h.sleeps.get(&group))
            .is_some_and(Sleep::asleep)
    }

    /// How many groups sleep, and how often they fell asleep and were woken by silence.
    pub fn sleep_stats(&self) -> SleepStats {
        self.hibernation
            .as_ref()
            .map_or_else(SleepStats::default, |h| SleepStats {
                asleep: h.asleep_count() as u64,
                sleeps: h.sleeps_total,
                silent_wakes: h.silent_wakes,
            })
    }

    /// The bus reports `peer`'s link up or down, and every replica hears of it. A link
    /// that comes up starts a new epoch of the peer: every group wakes, so the ones this
    /// node leads send their Commits to it and the ones it leads hear from it again.
    pub fn set_connected(&mut self, peer: u8, up: bool) {
        if up {
            if let Some(h) = self.hibernation.as_mut() {
                h.peers.reconnected(peer, h.now);
            }
        }
        let groups: Vec<u64> = self.replicas.keys().copied().collect();
        for group in groups {
            if let Some(replica) = self.get_mut(group) {
                replica.set_connected(peer, up);
            }
        }
    }

    /// Every hosted group in group order: its id, its replica and whether it sleeps
    /// (one walk, no lookup per group).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Replica, bool)> + '_ {
        let mut sleeps = self
            .hibernation
            .as_ref()
            .map(|h| h.sleeps.iter().peekable());
        self.replicas.iter().map(move |(group, replica)| {
            let asleep = sleeps.as_mut().is_some_and(|sleeps| {
                while sleeps.next_if(|(g, _)| *g < group).is_some() {}
                sleeps
                    .next_if(|(g, _)| *g == group)
                    .is_some_and(|(_, sleep)| sleep.asleep())
            });
            (*group, replica, asleep)
        })
    }

    /// The replica of `group`.
    pub fn get(&self, group: u64) -> Option<&Replica> {
        self.replicas.get(&group)
    }

    /// The replica of `group`, mutable (journal completions, client requests).
    pub fn get_mut(&mut self, group: u64) -> Option<&mut Replica> {
        let replica = self.replicas.get_mut(&group)?;
        if let Some(h) = self.hibernation.as_mut() {
            h.wake(group, replica);
        }
        self.touched.insert(group);
        Some(replica)
    }

    /// Drops from memory what a durable checkpoint at `op`, the commit point of `group`,
    /// covers, the prepare of `op` included (`Replica::release_anchor`), without waking
    /// the group: nothing it sends or times changes. Returns whether the prepare left.
    pub fn release_anchor(&mut self, group: u64, op: u64) -> bool {
        let Some(replica) = self.replicas.get_mut(&group) else {
            return false;
        };
        if replica.commit() != op || replica.status() != super::Status::Normal {
            return false;
        }
        replica.on_checkpoint(op);
        replica.release_anchor()
    }

    /// Routes a replica-plane frame to its group's replica by the group field.
    pub fn on_message(&mut self, bytes: &[u8]) -> Result<u64, RouteError> {
        let group = self.route(decode(bytes, &self.limits))?;
        self.deliver(group, |replica| replica.on_message(bytes));
        Ok(group)
    }

    /// As `on_message`, for a frame that already passed `wire::decode` (the bus's
    /// verified frames): routed without verifying its body again, and a Prepare is kept
    /// in the log as received, without a copy.
    pub fn on_frame(&mut self, frame: Frame) -> Result<u64, RouteError> {
        let group = self.route(decode_trusted(frame.as_bytes(), &self.limits))?;
        self.deliver(group, |replica| replica.on_frame(frame));
        Ok(group)
    }

    /// The hosted group a decoded frame is for.
    fn route(&mut self, decoded: Result<Message<'_>, FrameError>) -> Result<u64, RouteError> {
        let group = match decoded {
            Ok(message) => {
                if let (Message::Commit(commit), Some(h)) = (&message, self.hibernation.as_mut()) {
                    // Liveness is the Commit broadcast: any group's proves the node.
                    h.peers.heard(commit.frame.replica, h.now);
                }
                group_of(&message).ok_or(RouteError::NoGroup)?
            }
            Err(_) => return Err(RouteError::Invalid),
        };
        if !self.replicas.contains_key(&group) {
            return Err(RouteError::UnknownGroup { group });
        }
        Ok(group)
    }

    /// Hands a routed frame to `group`'s replica (`Hibernation::deliver`).
    fn deliver(&mut self, group: u64, handle: impl FnOnce(&mut Replica)) {
        let Some(replica) = self.replicas.get_mut(&group) else {
            return;
        };
        match self.hibernation.as_mut() {
            Some(h) => h.deliver(group, replica, handle),
            None => handle(replica),
        }
        if replica.has_actions() {
            self.touched.insert(group);
        }
    }

    /// Whether every group that ticks has nothing to do until a frame, request or
    /// completion arrives (`Replica::quiescent`): its timers only wait. False without
    /// `hibernate` (every group ticks).
    pub fn settled(&self) -> bool {
        self.hibernation.as_ref().is_some_and(|h| {
            h.awake
                .iter()
                .all(|g| self.replicas.get(g).is_none_or(Replica::quiescent))
        })
    }

    /// Ticks every group (every awake one, with `hibernate`).
    pub fn on_tick(&mut self) {
        let Some(h) = self.hibernation.as_mut() else {
            for (group, replica) in &mut self.replicas {
                replica.on_tick();
                if replica.has_actions() {
                    self.touched.insert(*group);
                }
            }
            return;
        };
        h.now += 1;
        h.wake_for_silence(&mut self.replicas, &mut self.touched);
        h.refresh(&mut self.replicas, &mut self.touched);
        let awake: Vec<u64> = h.awake.iter().copied().collect();
        let mut leads_awake = awake
            .iter()
            .filter(|g| self.replicas.get(g).is_some_and(Replica::is_primary))
            .count();
        for group in awake {
            let Some(replica) = self.replicas.get_mut(&group) else {
                continue;
            };
            replica.on_tick();
            if replica.has_actions() {
                self.touched.insert(group);
            }
            // The metadata group never sleeps; nor the last group this node leads that
            // is awake: its Commits tell the peers this node is up.
            let primary = replica.is_primary();
            if group == METADATA_GROUP || (primary && leads_awake <= 1) {
                continue;
            }
            let Some(sleep) = h.sleeps.get_mut(&group) else {
                continue;
            };
            let filed = Filed::of(sleep, replica);
            if sleep.after_tick(replica, &h.peers, h.now) {
                h.sleeps_total += 1;
                h.refile(group, filed, replica);
                leads_awake -= usize::from(primary);
            }
        }
        h.keep_a_beacon(&mut self.replicas);
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
mod tests;
