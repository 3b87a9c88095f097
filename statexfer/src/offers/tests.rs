use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::*;

const FRESH: Duration = Duration::from_secs(1);
const IDLE: Duration = Duration::from_secs(60);

fn policy(hash_per_step: u64) -> OfferPolicy {
    OfferPolicy {
        fresh: FRESH,
        refreezes_max: 2,
        idle_max: IDLE,
        hash_per_step,
    }
}

/// An artifact's bytes, by name and length (its checksum is derived from both).
struct Blob {
    id: u32,
    len: u64,
}

impl Content for Blob {
    fn len(&self) -> u64 {
        self.len
    }
}

/// Counts its drops: an offer's resources must be released exactly once.
struct Keep(Rc<Cell<u32>>);

impl Drop for Keep {
    fn drop(&mut self) {
        self.0.set(self.0.get() + 1);
    }
}

fn checksum(blob: &Blob) -> u64 {
    u64::from(blob.id) << 32 | blob.len
}

/// Hashes blobs incrementally (progress kept per id, as the daemon's cache does per
/// inode), recording every read; blob ids in `bad` cannot be read.
#[derive(Default)]
struct Disk {
    done: HashMap<u32, u64>,
    /// (step, blob, bytes) of every read.
    reads: Vec<(usize, u32, u64)>,
    steps: usize,
    bad: Vec<u32>,
}

impl Disk {
    fn hash(&mut self, blob: &Blob, budget: u64) -> std::io::Result<(Option<u64>, u64)> {
        if self.bad.contains(&blob.id) {
            return Err(std::io::Error::other("unreadable"));
        }
        let done = self.done.entry(blob.id).or_default();
        let read = (blob.len - *done).min(budget);
        *done += read;
        self.reads.push((self.steps, blob.id, read));
        Ok(((*done == blob.len).then(|| checksum(blob)), read))
    }
}

fn freeze(
    group: u64,
    commit_op: u64,
    blobs: &[(u32, u64)],
    drops: &Rc<Cell<u32>>,
) -> Freeze<Blob, Keep> {
    Freeze {
        group,
        commit_op,
        commit_max: commit_op + 3,
        artifacts: blobs
            .iter()
            .map(|&(id, len)| (ArtifactKind::SegmentLog, u64::from(id), Blob { id, len }))
            .collect(),
        keep: Keep(drops.clone()),
    }
}

fn step(offers: &mut Offers<Blob, Keep>, disk: &RefCell<Disk>, now: Instant) {
    disk.borrow_mut().steps += 1;
    offers.step(now, |blob, budget| disk.borrow_mut().hash(blob, budget));
}

fn freezes(events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Freeze { group } => Some(*group),
            _ => None,
        })
        .collect()
}

#[test]
fn a_request_freezes_once_and_the_offer_is_served_while_fresh_and_kept_while_used() {
    let t0 = Instant::now();
    let drops = Rc::new(Cell::new(0));
    let disk = RefCell::new(Disk::default());
    let mut offers = Offers::new(policy(u64::MAX));
    assert_eq!(
        offers.on_request(1, 10, 4, t0).err(),
        Some(Unavailable::Transient)
    );
    assert_eq!(
        offers.on_request(2, 20, 4, t0).err(),
        Some(Unavailable::Transient)
    );
    assert_eq!(freezes(&offers.take_events()), vec![4], "one freeze asked");
    assert!(offers.freezing(4));

    offers.on_frozen(freeze(4, 40, &[(1, 100), (2, 50)], &drops), t0);
    step(&mut offers, &disk, t0);
    let events = offers.take_events();
    assert_eq!(
        events,
        vec![Event::Offered {
            group: 4,
            commit_op: 40,
            artifacts: 2,
            bytes: 150
        }]
    );
    assert!(!offers.freezing(4));
    let offer = offers.on_request(1, 11, 4, t0).expect("fresh offer");
    assert_eq!(offer.offer.commit_op, 40);
    assert_eq!(offer.offer.commit_max, 43);
    let sums: Vec<u64> = offer
        .offer
        .manifest
        .entries
        .iter()
        .map(|e| e.checksum)
        .collect();
    assert_eq!(
        sums,
        vec![
            checksum(&Blob { id: 1, len: 100 }),
            checksum(&Blob { id: 2, len: 50 })
        ]
    );
    drop(offer);

    // Stale: a new transfer gets none (and a new freeze is asked); the one served keeps it.
    let later = t0 + FRESH + Duration::from_millis(1);
    assert_eq!(
        offers.on_request(3, 30, 4, later).err(),
        Some(Unavailable::Transient)
    );
    assert_eq!(freezes(&offers.take_events()), vec![4]);
    assert_eq!(
        offers.on_chunk(1, 11, later).map(|o| o.offer.commit_op),
        Some(40)
    );
    assert!(
        offers.on_chunk(1, 99, later).is_none(),
        "a nonce never given"
    );
    offers.expire(later);
    assert_eq!(offers.offers_len(), 1, "kept while a transfer reads it");
    assert_eq!(drops.get(), 0);
    // The transfer idles out, and the stale offer goes with it.
    offers.expire(later + IDLE);
    assert_eq!(offers.serving_len(), 0);
    assert_eq!(offers.offers_len(), 0);
    assert_eq!(drops.get(), 1, "released once");
    assert!(offers.idle());
}

#[test]
fn stale_freezes_are_frozen_again_up_to_the_bound_then_offered_as_they_are() {
    let t0 = Instant::now();
    let drops = Rc::new(Cell::new(0));
    let disk = RefCell::new(Disk::default());
    let mut offers = Offers::new(policy(u64::MAX));
    let stale = FRESH + Duration::from_millis(200);
    let mut now = t0;
    for round in 1..=2u32 {
        offers.on_frozen(freeze(3, 10 * u64::from(round), &[(7, 1000)], &drops), now);
        now += stale;
        step(&mut offers, &disk, now);
        let events = offers.take_events();
        assert!(
            matches!(events[0], Event::Refrozen { group: 3, waited, .. } if waited == stale),
            "round {round}: {events:?}"
        );
        assert_eq!(freezes(&events), vec![3]);
        assert!(offers.offer(3).is_none());
        assert!(offers.freezing(3), "answered transient meanwhile");
        assert_eq!(
            offers.on_request(1, 1, 3, now).err(),
            Some(Unavailable::Transient)
        );
        assert!(
            offers.take_events().is_empty(),
            "the refreeze is the freeze under way"
        );
        assert_eq!(drops.get(), round, "the stale freeze's links released");
        assert_eq!(offers.refreezes_total, u64::from(round));
    }
    offers.on_frozen(freeze(3, 99, &[(7, 1000)], &drops), now);
    now += stale;
    step(&mut offers, &disk, now);
    assert_eq!(offers.offer(3).map(|o| o.offer.commit_op), Some(99));
    assert_eq!(
        offers.on_request(1, 2, 3, now).map(|o| o.offer.commit_op),
        Ok(99)
    );
    // The count starts over for the next stale freeze.
    offers.take_events();
    offers.on_frozen(freeze(3, 120, &[(7, 1000)], &drops), now);
    step(&mut offers, &disk, now + stale);
    assert_eq!(freezes(&offers.take_events()), vec![3]);
}

#[test]
fn hashing_is_paced_and_a_refreeze_goes_ahead_of_a_first_freeze() {
    let t0 = Instant::now();
    let drops = Rc::new(Cell::new(0));
    let disk = RefCell::new(Disk::default());
    let mut offers = Offers::new(policy(1000));
    // Group 6's first freeze takes two steps and is stale when hashed: frozen again.
    offers.on_frozen(freeze(6, 60, &[(3, 1500)], &drops), t0);
    step(&mut offers, &disk, t0);
    let later = t0 + FRESH * 2;
    step(&mut offers, &disk, later);
    assert_eq!(freezes(&offers.take_events()), vec![6]);
    // Group 5's first freeze is being hashed when group 6's fresh one arrives.
    offers.on_frozen(freeze(5, 50, &[(1, 10_000), (2, 10)], &drops), later);
    step(&mut offers, &disk, later);
    offers.on_frozen(freeze(6, 61, &[(3, 2500)], &drops), later);
    step(&mut offers, &disk, later);
    assert_eq!(
        offers.offer(6).map(|o| o.offer.commit_op),
        Some(61),
        "the 1,000 bytes that grew since, hashed in one step ahead of group 5"
    );
    assert!(offers.offer(5).is_none(), "group 5 still hashing");
    let mut steps = 0;
    while offers.offer(5).is_none() {
        step(&mut offers, &disk, later);
        steps += 1;
    }
    assert_eq!(steps, 10, "9,010 bytes left at 1,000 a step");
    assert_eq!(
        offers.offer(5).map(|o| o.offer.manifest.entries.len()),
        Some(2)
    );
    // Each step read at most its budget, and each artifact's bytes once.
    let reads = disk.borrow().reads.clone();
    let mut per_step: HashMap<usize, u64> = HashMap::new();
    let mut per_blob: HashMap<u32, u64> = HashMap::new();
    for (step, id, read) in reads {
        *per_step.entry(step).or_default() += read;
        *per_blob.entry(id).or_default() += read;
    }
    assert!(per_step.values().all(|n| *n <= 1000), "{per_step:?}");
    assert_eq!(per_blob, HashMap::from([(1, 10_000), (2, 10), (3, 2500)]));
}

#[test]
fn refusals_are_remembered_while_fresh_and_an_unreadable_freeze_is_abandoned() {
    let t0 = Instant::now();
    let drops = Rc::new(Cell::new(0));
    let disk = RefCell::new(Disk {
        bad: vec![9],
        ..Disk::default()
    });
    let mut offers = Offers::new(policy(u64::MAX));
    assert!(offers.on_request(1, 1, 8, t0).is_err());
    offers.on_refused(8, false, t0);
    offers.take_events();
    assert_eq!(
        offers.on_request(1, 2, 8, t0).err(),
        Some(Unavailable::Permanent)
    );
    assert!(
        offers.take_events().is_empty(),
        "no freeze asked for a group not held"
    );
    let later = t0 + FRESH;
    assert_eq!(
        offers.on_request(1, 3, 8, later).err(),
        Some(Unavailable::Transient)
    );
    assert_eq!(
        freezes(&offers.take_events()),
        vec![8],
        "asked again once stale"
    );

    offers.on_refused(8, true, later);
    assert_eq!(
        offers.on_request(1, 4, 8, later).err(),
        Some(Unavailable::Transient)
    );
    assert_eq!(
        freezes(&offers.take_events()),
        vec![8],
        "transient: ask again now"
    );

    offers.on_frozen(freeze(8, 80, &[(1, 10), (9, 10)], &drops), later);
    step(&mut offers, &disk, later);
    assert_eq!(offers.take_events(), vec![Event::Unreadable { group: 8 }]);
    assert_eq!(drops.get(), 1, "the abandoned freeze's links released");
    assert!(!offers.freezing(8));
    assert!(offers.offer(8).is_none());
    offers.expire(later + FRESH);
    assert!(offers.idle());
}

/// Random interleavings of requests, chunks, freezes, refusals, steps and expiry: an
/// offer served is fresh when given, each freeze's resources are released once, and all
/// is idle once the transfers stop.
#[test]
fn random_interleavings_release_everything_once() {
    for seed in 1..=200u64 {
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let t0 = Instant::now();
        let drops = Rc::new(Cell::new(0));
        let disk = RefCell::new(Disk::default());
        let mut offers = Offers::new(policy(1 + next(3000)));
        let mut now = t0;
        let mut frozen = 0;
        let mut blob = 0;
        for _ in 0..300 {
            now += Duration::from_millis(next(400));
            let group = next(3);
            match next(6) {
                0 | 1 => {
                    if let Ok(offer) = offers.on_request(next(3) as u8, next(8).into(), group, now)
                    {
                        assert!(
                            now.saturating_duration_since(offer.created) < FRESH,
                            "seed {seed}"
                        );
                    }
                }
                2 => {
                    let _ = offers.on_chunk(next(3) as u8, next(8).into(), now);
                }
                3 => {
                    blob += 1;
                    offers.on_frozen(freeze(group, next(100), &[(blob, next(5000))], &drops), now);
                    frozen += 1;
                }
                4 => offers.on_refused(group, next(2) == 0, now),
                _ => step(&mut offers, &disk, now),
            }
            offers.expire(now);
            offers.take_events();
        }
        while !offers.hashing.is_empty() {
            step(&mut offers, &disk, now);
        }
        offers.expire(now + IDLE + FRESH);
        assert!(offers.idle(), "seed {seed}");
        assert_eq!(
            drops.get(),
            frozen,
            "seed {seed}: each freeze released once"
        );
    }
}
