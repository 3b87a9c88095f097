//! The server's offer lifecycle as a value: a group frozen at its commit point is hashed
//! into a manifest (paced, a budget of bytes per step), offered to new transfers while
//! fresh, frozen again when its hashing finished too late to be fresh (a bounded number
//! of times in a row), and released once stale and unused. Each transfer keeps the offer
//! its nonce was given until it idles out.
//!
//! It reads no clock and touches no file: callers pass `now`, and a hash function that
//! reads the artifact's bytes. What the caller must do (ask its replica executor for a
//! freeze) and what it may log comes back as [`Event`]s. An offer's resources (the hard
//! links its files are read through) live in `K`, dropped when the offer is released or
//! its freeze abandoned.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::artifact::{Offer, Unavailable};
use crate::manifest::{ArtifactKind, Manifest, ManifestEntry};

/// The bounds of the lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfferPolicy {
    /// An offer is handed to new transfers for this long after it is made; a freeze
    /// that took longer than this to hash is frozen again; a refusal is remembered this
    /// long.
    pub fresh: Duration,
    /// Stale freezes of one group replaced in a row; the next is offered as it is (a
    /// cluster that grows a segment faster than the paced hashing reads it must still
    /// get an offer).
    pub refreezes_max: u32,
    /// A transfer that asked for nothing for this long is forgotten.
    pub idle_max: Duration,
    /// Bytes hashed per step at most (`u64::MAX`: no pacing).
    pub hash_per_step: u64,
}

/// The bytes of one artifact as the caller keeps them.
pub trait Content {
    /// The artifact's length in bytes.
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A group's state frozen at `commit_op`, as the replica executor hands it over.
pub struct Freeze<C, K> {
    pub group: u64,
    pub commit_op: u64,
    pub commit_max: u64,
    /// Each artifact's kind, frontier and bytes.
    pub artifacts: Vec<(ArtifactKind, u64, C)>,
    /// What the offer owns until released (dropped with it).
    pub keep: K,
}

/// An offer ready to serve: the manifest and each artifact's bytes, in manifest order.
pub struct Ready<C, K> {
    pub offer: Offer,
    pub contents: Vec<C>,
    pub created: Instant,
    /// Held for the offer's lifetime.
    pub keep: K,
}

/// What the caller does or reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Ask the replica executor to freeze `group` (answered by `on_frozen` or
    /// `on_refused`).
    Freeze { group: u64 },
    /// A freeze hashed too late to be fresh is replaced by a new one (also a `Freeze`).
    Refrozen {
        group: u64,
        commit_op: u64,
        waited: Duration,
    },
    /// An offer is ready.
    Offered {
        group: u64,
        commit_op: u64,
        artifacts: usize,
        bytes: u64,
    },
    /// An artifact could not be read for hashing: the freeze is abandoned and the group
    /// refused (transient) for a while.
    Unreadable { group: u64 },
}

/// A frozen group whose artifacts are being hashed.
struct Hashing<C, K> {
    freeze: Freeze<C, K>,
    entries: Vec<ManifestEntry>,
    /// When the freeze arrived (about when the group was frozen).
    frozen_at: Instant,
}

struct Serving<C, K> {
    offer: Rc<Ready<C, K>>,
    last: Instant,
}

/// The offers of one server, by group, and the transfers it serves.
pub struct Offers<C, K> {
    policy: OfferPolicy,
    /// The newest offer of each group.
    offers: HashMap<u64, Rc<Ready<C, K>>>,
    /// Freezes asked for and not yet answered, or being hashed: since when.
    freezing: HashMap<u64, Instant>,
    hashing: VecDeque<Hashing<C, K>>,
    /// Groups the replica executor refused to freeze: (when, transient).
    refused: HashMap<u64, (Instant, bool)>,
    /// Transfers served, by (peer, nonce).
    serving: HashMap<(u8, u128), Serving<C, K>>,
    /// Stale freezes replaced in a row, by group.
    refreezes: HashMap<u64, u32>,
    events: Vec<Event>,
    /// Stale freezes replaced since the start.
    pub refreezes_total: u64,
}

impl<C: Content, K> Offers<C, K> {
    pub fn new(policy: OfferPolicy) -> Offers<C, K> {
        Offers {
            policy,
            offers: HashMap::new(),
            freezing: HashMap::new(),
            hashing: VecDeque::new(),
            refused: HashMap::new(),
            serving: HashMap::new(),
            refreezes: HashMap::new(),
            events: Vec::new(),
            refreezes_total: 0,
        }
    }

    pub fn policy(&self) -> &OfferPolicy {
        &self.policy
    }

    /// What happened since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// A transfer asks for `group`'s state: the fresh offer (which the transfer keeps),
    /// or why there is none. With none, a freeze is asked for unless one is under way or
    /// the group was refused for good a moment ago.
    pub fn on_request(
        &mut self,
        peer: u8,
        nonce: u128,
        group: u64,
        now: Instant,
    ) -> Result<Rc<Ready<C, K>>, Unavailable> {
        let fresh = self.policy.fresh;
        if let Some(offer) = self
            .offers
            .get(&group)
            .filter(|o| now.saturating_duration_since(o.created) < fresh)
        {
            let offer = offer.clone();
            self.serving.insert(
                (peer, nonce),
                Serving {
                    offer: offer.clone(),
                    last: now,
                },
            );
            return Ok(offer);
        }
        let refusal = self
            .refused
            .get(&group)
            .filter(|(at, _)| now.saturating_duration_since(*at) < fresh)
            .map(|(_, transient)| *transient);
        if refusal == Some(false) {
            return Err(Unavailable::Permanent);
        }
        if let std::collections::hash_map::Entry::Vacant(entry) = self.freezing.entry(group) {
            entry.insert(now);
            self.events.push(Event::Freeze { group });
        }
        Err(Unavailable::Transient)
    }

    /// The offer a transfer was given, if it is still served (it counts as activity).
    pub fn on_chunk(&mut self, peer: u8, nonce: u128, now: Instant) -> Option<Rc<Ready<C, K>>> {
        let serving = self.serving.get_mut(&(peer, nonce))?;
        serving.last = now;
        Some(serving.offer.clone())
    }

    /// A freeze arrived: queued for hashing (a refreeze ahead of groups hashed for the
    /// first time: it has little left to read, and behind a whole first read it would be
    /// stale again). The next `step` hashes it.
    pub fn on_frozen(&mut self, freeze: Freeze<C, K>, now: Instant) {
        let group = freeze.group;
        self.freezing.insert(group, now);
        self.refused.remove(&group);
        let job = Hashing {
            entries: Vec::with_capacity(freeze.artifacts.len()),
            freeze,
            frozen_at: now,
        };
        if self.refreezes.get(&group).is_some_and(|n| *n > 0) {
            self.hashing.push_front(job);
        } else {
            self.hashing.push_back(job);
        }
    }

    /// The replica executor would not freeze `group` (`transient`: not now).
    pub fn on_refused(&mut self, group: u64, transient: bool, now: Instant) {
        self.freezing.remove(&group);
        self.refreezes.remove(&group);
        self.refused.insert(group, (now, transient));
    }

    /// Hashes queued artifacts for up to one step's budget. `hash(content, budget)`
    /// reads at most `budget` more bytes of `content` and returns its checksum once all
    /// of it is read, and the bytes it read.
    pub fn step(
        &mut self,
        now: Instant,
        mut hash: impl FnMut(&C, u64) -> std::io::Result<(Option<u64>, u64)>,
    ) {
        let mut budget = self.policy.hash_per_step.max(1);
        loop {
            let Some(job) = self.hashing.front_mut() else {
                return;
            };
            let group = job.freeze.group;
            let Some((kind, frontier, content)) = job.freeze.artifacts.get(job.entries.len())
            else {
                if let Some(job) = self.hashing.pop_front() {
                    self.finish(job, now);
                }
                continue;
            };
            if budget == 0 {
                return;
            }
            match hash(content, budget) {
                Ok((checksum, read)) => {
                    budget = budget.saturating_sub(read.max(1));
                    if let Some(checksum) = checksum {
                        let entry = ManifestEntry {
                            kind: *kind,
                            frontier: *frontier,
                            len: content.len(),
                            checksum,
                        };
                        job.entries.push(entry);
                    }
                }
                Err(_) => {
                    self.hashing.pop_front();
                    self.freezing.remove(&group);
                    self.refused.insert(group, (now, true));
                    self.events.push(Event::Unreadable { group });
                }
            }
        }
    }

    fn finish(&mut self, job: Hashing<C, K>, now: Instant) {
        let Hashing {
            freeze,
            entries,
            frozen_at,
        } = job;
        // A fetcher installing a state hashed too long ago would find the ops above it
        // gone from its peers' repair windows and need a second transfer: a stale freeze
        // is replaced by a fresh one, whose hashing resumes where this one ended.
        let waited = now.saturating_duration_since(frozen_at);
        let refreezes = self.refreezes.entry(freeze.group).or_default();
        if waited > self.policy.fresh && *refreezes < self.policy.refreezes_max {
            *refreezes += 1;
            self.refreezes_total += 1;
            self.freezing.insert(freeze.group, now);
            self.events.push(Event::Refrozen {
                group: freeze.group,
                commit_op: freeze.commit_op,
                waited,
            });
            self.events.push(Event::Freeze {
                group: freeze.group,
            });
            return;
        }
        self.refreezes.remove(&freeze.group);
        self.freezing.remove(&freeze.group);
        let Freeze {
            group,
            commit_op,
            commit_max,
            artifacts,
            keep,
        } = freeze;
        let contents: Vec<C> = artifacts.into_iter().map(|(_, _, c)| c).collect();
        self.events.push(Event::Offered {
            group,
            commit_op,
            artifacts: contents.len(),
            bytes: contents.iter().map(C::len).sum(),
        });
        let ready = Ready {
            offer: Offer {
                commit_op,
                commit_max,
                manifest: Manifest { entries },
            },
            contents,
            created: now,
            keep,
        };
        self.offers.insert(group, Rc::new(ready));
    }

    /// Forgets idle transfers and unanswered freezes, and releases stale offers no
    /// transfer uses.
    pub fn expire(&mut self, now: Instant) {
        let OfferPolicy {
            fresh, idle_max, ..
        } = self.policy;
        self.serving
            .retain(|_, s| now.saturating_duration_since(s.last) < idle_max);
        let hashing = &self.hashing;
        self.freezing.retain(|group, at| {
            hashing.iter().any(|h| h.freeze.group == *group)
                || now.saturating_duration_since(*at) < fresh
        });
        let serving = &self.serving;
        self.offers.retain(|_, offer| {
            now.saturating_duration_since(offer.created) < fresh
                || serving.values().any(|s| Rc::ptr_eq(&s.offer, offer))
        });
        self.refused
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < fresh);
    }

    /// Nothing served, frozen, hashed or offered.
    pub fn idle(&self) -> bool {
        self.serving.is_empty()
            && self.hashing.is_empty()
            && self.freezing.is_empty()
            && self.offers.is_empty()
    }

    /// The newest offer of `group`, fresh or not.
    pub fn offer(&self, group: u64) -> Option<&Rc<Ready<C, K>>> {
        self.offers.get(&group)
    }

    /// Whether a freeze of `group` is asked for or being hashed.
    pub fn freezing(&self, group: u64) -> bool {
        self.freezing.contains_key(&group)
    }

    pub fn offers_len(&self) -> usize {
        self.offers.len()
    }

    pub fn serving_len(&self) -> usize {
        self.serving.len()
    }
}

#[cfg(test)]
mod tests;
