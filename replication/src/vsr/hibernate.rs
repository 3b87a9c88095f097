//! Idle groups that cost nothing: a group whose replica has nothing left to do falls
//! asleep (its driver stops ticking it) and wakes on the next frame, request or
//! completion for it, or when the node of its primary goes silent.
//!
//! Liveness is the Commit broadcast, and a node hears it per peer, not per group: any
//! Commit from a peer (of whichever group that peer leads and keeps awake) shows the
//! peer's node is up and reaches this one. While that holds, the sleeping backups of
//! the groups the peer leads need no Commit of their own; once the peer is silent for a
//! heartbeat timeout, each of them wakes and times out its primary at once, as its own
//! heartbeat timer would have done. So failover of a sleeping group takes what it takes
//! for an awake one. Safety does not depend on any of this: sleeping only stops timers,
//! and every message a sleeping replica receives is handled as before.
//!
//! The node of a peer that restarts (or whose link came back) is not the node that led
//! the groups before: each (re)connection starts a new epoch of the peer, and a backup
//! sleeps, or lets the node vouch for its primary, only once it heard a Commit of its
//! own group from that primary in the primary's current epoch and in its current view.
//! Until then it keeps its own heartbeat timer, as an awake group does; the node that
//! sees a peer connect wakes the groups it leads, so their Commits reach the peer.
//!
//! A primary sleeps only after it broadcast its final commit point `BROADCASTS_BEFORE_SLEEP`
//! times, so its backups learn it; a backup sleeps once it applied everything it knows of
//! and heard the primary's Commit after its last Prepare (a primary whose pipeline
//! stalled stops its Commits to be replaced; its backups must not sleep through that).
//! A replica that missed a view change (it was cut off while the others elected) learns of
//! the new view from the new primary's Commits; so that it does not sleep in the old view
//! for good, every sleeping primary broadcasts its Commit once per `REFRESH_HEARTBEATS`
//! heartbeat timeouts (spread by group) without waking.
//!
//! A frame for a sleeping replica is handled as for an awake one; the replica wakes only
//! if the frame left it something to do (it is no longer quiescent, or its primary is no
//! longer vouched for). A Commit that tells a sleeping backup nothing new, such as a
//! refresh or the Commits of the group its primary's node keeps awake, costs its
//! handling and nothing more.

use super::{Replica, Status};

/// Commit broadcasts with an unchanged commit point a primary sends before it may sleep.
pub const BROADCASTS_BEFORE_SLEEP: u32 = 2;

/// A sleeping primary broadcasts its Commit once per this many heartbeat timeouts (plus
/// up to two more, by group and to fall on a multiple of the heartbeat timeout), so that
/// a replica of its group in an older view learns of the current one.
pub const REFRESH_HEARTBEATS: u64 = 30;

/// What a sleeping replica did on its own (`Sleep::check`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// The node of its primary was not heard for a heartbeat timeout: it timed out the
    /// primary.
    PrimarySilent,
    /// The node of its primary (re)connected since the replica heard the primary's
    /// Commit: it runs its own heartbeat timer until it hears one again.
    PrimaryReconnected,
    /// Not a wake: a sleeping primary broadcast its Commit (its refresh) and sleeps on.
    Refreshed,
}

/// Whether a peer's node was heard within a heartbeat timeout, per peer: the tick a
/// Commit of any group last arrived from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerLiveness {
    heard: Vec<u64>,
    /// Per peer: (re)connections seen (`reconnected`).
    epochs: Vec<u64>,
    timeout_ticks: u64,
}

impl PeerLiveness {
    /// Every peer counts as just heard at `now` (a node that starts gives its peers a
    /// heartbeat timeout to be heard).
    pub fn new(replica_count: u8, timeout_ticks: u64, now: u64) -> PeerLiveness {
        PeerLiveness {
            heard: vec![now; usize::from(replica_count)],
            epochs: vec![0; usize::from(replica_count)],
            timeout_ticks,
        }
    }

    /// A Commit (of any group) arrived from `peer` at `now`.
    pub fn heard(&mut self, peer: u8, now: u64) {
        if let Some(at) = self.heard.get_mut(usize::from(peer)) {
            *at = (*at).max(now);
        }
    }

    /// Whether `peer` was heard within the heartbeat timeout before `now`.
    pub fn alive(&self, peer: u8, now: u64) -> bool {
        self.heard
            .get(usize::from(peer))
            .is_some_and(|at| now.saturating_sub(*at) <= self.timeout_ticks)
    }

    /// `peer` (re)connected at `now`: a new epoch of it begins.
    pub fn reconnected(&mut self, peer: u8, now: u64) {
        if let Some(epoch) = self.epochs.get_mut(usize::from(peer)) {
            *epoch += 1;
            self.heard(peer, now);
        }
    }

    /// The current epoch of `peer`.
    pub fn epoch(&self, peer: u8) -> u64 {
        self.epochs.get(usize::from(peer)).copied().unwrap_or(0)
    }

    /// Every peer counts as just heard at `now` (after this node restarted).
    pub fn reset(&mut self, now: u64) {
        self.heard.iter_mut().for_each(|at| *at = now);
    }
}

/// One group's sleep on a node: how long its replica has been quiescent, and whether the
/// driver stopped ticking it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sleep {
    quiet_ticks: u64,
    asleep: bool,
    /// The node tick it fell asleep at.
    since: u64,
    /// The replica's `heartbeat_seen` when last looked at, and the view and epoch of
    /// the primary in which a Commit of the group from it was last seen.
    heartbeat_seen: u64,
    vouched: Option<(u32, u64)>,
    /// A new group's backup vouched for at its start by its primary's node: that node's
    /// silence times the primary out no sooner than this node tick, a heartbeat timeout
    /// after the start, as the backup's own timer would have.
    fresh_until: u64,
}

impl Sleep {
    /// Whether the driver should leave the replica unticked.
    pub fn asleep(&self) -> bool {
        self.asleep
    }

    /// The sleep of a replica the node just created at `now`: a new member of a new
    /// group (its initial view, empty log) whose primary's node is heard takes its primary as
    /// vouched for by that node in its current epoch, as if it had heard its Commit.
    /// Nodes start a new group's replicas at their own pace; a backup that starts after
    /// its primary fell asleep would otherwise time it out. A primary's node that is not
    /// heard (it leads no group, so it sends no Commit) vouches for nothing: the backup
    /// keeps its own heartbeat timer, which gives the primary a whole heartbeat timeout
    /// from the backup's start to be heard; vouching would time it out as soon as the
    /// backup fell asleep. For the same reason a node heard just before the start (its
    /// link came up, it leads nothing yet) times out the primary of a group it vouched for
    /// no sooner than a heartbeat timeout after the start.
    pub fn of_new(replica: &Replica, peers: &PeerLiveness, now: u64) -> Sleep {
        let mut sleep = Sleep::default();
        let fresh = replica.status == Status::Normal
            && replica.voter
            && replica.view == replica.config().initial_view
            && replica.log.op == 0
            && replica.commit == 0
            && replica.heartbeat_seen == 0;
        let primary = replica.config().primary_of(replica.view);
        if fresh && peers.alive(primary, now) {
            sleep.vouched = Some((replica.view, peers.epoch(primary)));
            sleep.fresh_until = now + peers.timeout_ticks;
        }
        sleep
    }

    /// Notes a Commit of the group from its primary, if one arrived since last time.
    fn observe(&mut self, replica: &Replica, peers: &PeerLiveness) {
        if replica.heartbeat_seen != self.heartbeat_seen {
            self.heartbeat_seen = replica.heartbeat_seen;
            if replica.heartbeat_seen != 0 {
                let primary = replica.config().primary_of(replica.view());
                self.vouched = Some((replica.view(), peers.epoch(primary)));
            }
        }
    }

    /// Whether a backup heard its primary's Commit in its view and the primary's epoch
    /// (always true of a primary).
    fn vouched(&self, replica: &Replica, peers: &PeerLiveness) -> bool {
        let primary = replica.config().primary_of(replica.view());
        primary == replica.replica() || self.vouched == Some((replica.view(), peers.epoch(primary)))
    }

    /// After the replica's tick: counts the ticks it has stayed quiescent, and puts it to
    /// sleep after a commit broadcast interval of them. True when it fell asleep now.
    pub fn after_tick(&mut self, replica: &Replica, peers: &PeerLiveness, now: u64) -> bool {
        if self.asleep {
            return false;
        }
        self.observe(replica, peers);
        if !replica.quiescent() || !self.vouched(replica, peers) {
            self.quiet_ticks = 0;
            return false;
        }
        self.quiet_ticks += 1;
        if self.quiet_ticks >= replica.config().commit_broadcast_interval_ticks {
            self.asleep = true;
            self.since = now;
            return true;
        }
        false
    }

    /// A frame from a peer arrives for the replica: `handle` delivers it. An awake replica
    /// handles it as ever. A sleeping one first takes its primary as heard (as `wake`
    /// does), and sleeps on if the frame left it quiescent with its primary still vouched
    /// for; otherwise it wakes. True when it woke.
    pub fn on_message(
        &mut self,
        replica: &mut Replica,
        peers: &PeerLiveness,
        now: u64,
        handle: impl FnOnce(&mut Replica),
    ) -> bool {
        if !self.asleep {
            handle(replica);
            if !replica.quiescent() {
                self.quiet_ticks = 0;
            }
            return false;
        }
        self.primary_heard(replica, peers, now);
        handle(replica);
        self.observe(replica, peers);
        if replica.quiescent() && self.vouched(replica, peers) {
            return false;
        }
        self.asleep = false;
        self.quiet_ticks = 0;
        true
    }

    /// The node tick at which a sleeping primary broadcasts its Commit next (`check`);
    /// none for a backup or an awake replica.
    pub fn refresh_due(&self, replica: &Replica) -> Option<u64> {
        if !self.asleep || !replica.is_primary() {
            return None;
        }
        let timeout = replica.config().heartbeat_timeout_ticks;
        let spread = replica.config().group.wrapping_mul(0x9e37_79b9_7f4a_7c15) % timeout;
        // Due on a multiple of the heartbeat timeout: a node's sleeping primaries send
        // their refreshes together, one write per peer, not a few in every tick.
        Some((self.since + REFRESH_HEARTBEATS * timeout + spread).div_ceil(timeout) * timeout)
    }

    /// Something arrived for the replica (a request, a completion): it is ticked
    /// again. A backup whose primary's node is heard restarts its heartbeat timer, since
    /// the time it slept was covered by that node's Commits.
    pub fn wake(&mut self, replica: &mut Replica, peers: &PeerLiveness, now: u64) {
        self.quiet_ticks = 0;
        if std::mem::replace(&mut self.asleep, false) {
            self.primary_heard(replica, peers, now);
        }
    }

    /// A sleeping backup whose primary's node is heard, and whose primary it vouched for,
    /// restarts its heartbeat timer: the time it slept was covered by that node's Commits.
    fn primary_heard(&self, replica: &mut Replica, peers: &PeerLiveness, now: u64) {
        let primary = replica.config().primary_of(replica.view());
        if primary != replica.replica() && peers.alive(primary, now) && self.vouched(replica, peers)
        {
            replica.primary_heard();
        }
    }

    /// Once per node tick while asleep: when the primary's node went silent, the replica
    /// wakes and times out its primary now; when a primary's refresh is due, it
    /// broadcasts its Commit and sleeps on.
    pub fn check(&mut self, replica: &mut Replica, peers: &PeerLiveness, now: u64) -> Option<Woke> {
        if !self.asleep {
            return None;
        }
        let primary = replica.config().primary_of(replica.view());
        if primary != replica.replica() && !peers.alive(primary, now) && now > self.fresh_until {
            self.asleep = false;
            self.quiet_ticks = 0;
            replica.primary_silent();
            return Some(Woke::PrimarySilent);
        }
        if !self.vouched(replica, peers) {
            // Awake with its own timer: the primary's Commit, or a view change.
            self.asleep = false;
            self.quiet_ticks = 0;
            return Some(Woke::PrimaryReconnected);
        }
        if self.refresh_due(replica).is_some_and(|due| now >= due) {
            replica.on_commit_broadcast_timeout();
            self.since = now;
            return Some(Woke::Refreshed);
        }
        None
    }
}

impl Replica {
    /// Whether the replica has nothing to do until a message, request or completion
    /// arrives: a voting member of a normal view that applied every op it knows of, with
    /// no pipeline, no action queued, no probe of a newer view pending, nothing to repair
    /// or transfer; a primary that also
    /// broadcast that commit point `BROADCASTS_BEFORE_SLEEP` times.
    pub fn quiescent(&self) -> bool {
        let settled = self.voter
            && self.status == Status::Normal
            && self.census.is_none()
            && self.recover.is_none()
            && self.formation_wait.0 == 0
            && !self.state_transfer_requested
            && !self.timeout_probe.ticking()
            && self.faulty_above_op == 0
            && self.pipeline.is_empty()
            && self.actions.is_empty()
            && self.log.op <= self.commit
            && self.commit == self.commit_max;
        if !settled {
            return false;
        }
        if self.is_primary() {
            self.commit_broadcasts.0 == self.commit
                && self.commit_broadcasts.1 >= BROADCASTS_BEFORE_SLEEP
        } else {
            self.timeout_heartbeat.ticking() && !self.primary_preparing
        }
    }

    /// A backup's primary is known alive (its node was heard): the heartbeat timer
    /// restarts as if its Commit had arrived. Not while the primary is preparing: a
    /// primary at work is heard by its own Commits, and one whose pipeline stalled stops
    /// them so that its backups elect another.
    pub fn primary_heard(&mut self) {
        if self.status == Status::Normal
            && !self.is_primary()
            && self.timeout_heartbeat.ticking()
            && !self.primary_preparing
        {
            self.timeout_heartbeat.start(self.now, &mut self.prng);
        }
    }

    /// A backup's primary is known silent (its node was not heard for a heartbeat
    /// timeout): the heartbeat timeout fires now.
    pub fn primary_silent(&mut self) {
        if self.status == Status::Normal && !self.is_primary() {
            self.timeout_heartbeat.stop();
            self.on_heartbeat_timeout();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vsr::Config;
    use crate::wire::{cluster_id, METADATA_GROUP};

    #[test]
    fn peers_are_alive_for_a_heartbeat_timeout_after_they_were_heard() {
        let mut peers = PeerLiveness::new(3, 60, 0);
        assert!(peers.alive(1, 60));
        assert!(!peers.alive(1, 61));
        peers.heard(1, 50);
        peers.heard(1, 40);
        assert!(peers.alive(1, 110));
        assert!(!peers.alive(1, 111));
        assert!(!peers.alive(9, 0), "no such peer");
        peers.reset(200);
        assert!(peers.alive(2, 260));
    }

    #[test]
    fn a_fresh_primary_sleeps_after_its_broadcasts_and_a_backup_wakes_on_silence() {
        let cluster = cluster_id("hibernate");
        let mut primary = Replica::new(Config::new(cluster, METADATA_GROUP, 0, 3));
        let mut backup = Replica::new(Config::new(cluster, METADATA_GROUP, 1, 3));
        let (mut primary_sleep, mut backup_sleep) = (Sleep::default(), Sleep::default());
        let mut peers = PeerLiveness::new(3, backup.config().heartbeat_timeout_ticks, 0);
        let mut fell_asleep = (None, None);
        for now in 1..200 {
            if !primary_sleep.asleep() {
                primary.on_tick();
                for action in primary.drain_actions() {
                    if let crate::vsr::Action::Broadcast { frame } = action {
                        peers.heard(0, now);
                        backup_sleep.wake(&mut backup, &peers, now);
                        backup.on_message(frame.as_bytes());
                    }
                }
                if primary_sleep.after_tick(&primary, &peers, now) {
                    fell_asleep.0 = Some(now);
                }
            }
            if !backup_sleep.asleep() {
                backup.on_tick();
                let _ = backup.drain_actions();
                if backup_sleep.after_tick(&backup, &peers, now) {
                    fell_asleep.1 = Some(now);
                }
            }
        }
        let interval = primary.config().commit_broadcast_interval_ticks;
        let primary_at = fell_asleep.0.expect("the idle primary sleeps");
        assert!(
            primary_at >= u64::from(BROADCASTS_BEFORE_SLEEP) * interval,
            "{primary_at}"
        );
        assert!(fell_asleep.1.is_some(), "the idle backup sleeps");
        assert_eq!(backup.status(), Status::Normal);
        // The primary's node stays heard: the backup sleeps on until its refresh.
        let asleep_at = fell_asleep.1.expect("asleep");
        let timeout = backup.config().heartbeat_timeout_ticks;
        let refresh = asleep_at + REFRESH_HEARTBEATS * timeout;
        peers.heard(0, refresh - 1);
        assert_eq!(backup_sleep.check(&mut backup, &peers, refresh - 1), None);
        assert_eq!(backup.status(), Status::Normal);
        assert!(backup_sleep.asleep());
        // The primary sleeps on too; its refresh broadcasts its Commit without waking it.
        assert_eq!(
            primary_sleep.check(&mut primary, &peers, refresh - timeout),
            None
        );
        assert!(primary.drain_actions().is_empty());
        let due = primary_sleep
            .refresh_due(&primary)
            .expect("a sleeping primary");
        let period = REFRESH_HEARTBEATS * timeout..(REFRESH_HEARTBEATS + 2) * timeout;
        assert!(period.contains(&(due - primary_at)), "{due} {primary_at}");
        assert_eq!(due % timeout, 0, "refreshes fall due together");
        let refreshed = (refresh - timeout..refresh + 2 * timeout)
            .find(|now| primary_sleep.check(&mut primary, &peers, *now).is_some());
        assert_eq!(refreshed, Some(due), "the primary's refresh");
        let next = primary_sleep.refresh_due(&primary).expect("asleep");
        assert!(
            period.contains(&(next - due)) && next % timeout == 0,
            "{next} {due}"
        );
        assert!(primary_sleep.asleep(), "a refresh is not a wake");
        let refreshed = due;
        let commits = primary.drain_actions();
        let [crate::vsr::Action::Broadcast { frame }] = commits.as_slice() else {
            panic!("one Commit broadcast: {commits:?}");
        };
        // The backup handles the refresh's Commit asleep: it tells it nothing new.
        let woke = backup_sleep.on_message(&mut backup, &peers, refreshed, |backup| {
            backup.on_message(frame.as_bytes())
        });
        assert!(!woke && backup_sleep.asleep());
        assert!(backup.drain_actions().is_empty());
        // The Commit of a newer view's primary wakes it: it learns of the view.
        let mut newer = backup_sleep;
        let mut header = <crate::wire::CommitHeader as crate::wire::Header>::new();
        header.frame.cluster = cluster;
        header.frame.view = 2;
        header.frame.replica = 2;
        header.timestamp_monotonic = 1;
        header.group = METADATA_GROUP;
        let frame = crate::wire::Frame::build(&header, &[]);
        let woke = newer.on_message(&mut backup, &peers, refreshed, |backup| {
            backup.on_message(frame.as_bytes())
        });
        assert!(woke && !newer.asleep());
        assert!(!backup.quiescent(), "its probe of the view is pending");
        // The primary's node reconnects: the backup wakes and waits for its Commit.
        let mut reconnected = peers.clone();
        reconnected.reconnected(0, refresh - 1);
        let mut woken = backup_sleep;
        assert_eq!(
            woken.check(&mut backup, &reconnected, refresh - 1),
            Some(Woke::PrimaryReconnected)
        );
        assert_eq!(
            backup.status(),
            Status::Normal,
            "no view change for it alone"
        );
        // Silent for a heartbeat timeout: the backup wakes and starts a view change.
        let silent = refresh - 1 + timeout + 1;
        assert_eq!(
            backup_sleep.check(&mut backup, &peers, silent),
            Some(Woke::PrimarySilent)
        );
        assert!(!backup_sleep.asleep());
        assert_eq!(backup.status(), Status::ViewChange);
        assert!(backup
            .drain_actions()
            .iter()
            .any(|a| matches!(a, crate::vsr::Action::Broadcast { .. })));
    }
}
