//! Password work (Argon2id checks and hashes) on a thread of its own, one at a time,
//! below the replica executor's priority, and the logins that checked out lately.
//!
//! An Argon2id check costs tens of milliseconds of CPU (seconds on an emulated or
//! starved host) and 19 MiB of memory. Run side by side on the blocking pool, a storm of
//! logins (clients that reconnect to a slow node log in again on each new connection)
//! took every core from the replica executor, so the node answered later still and the
//! clients reconnected more, and each pool thread that ran a check kept its memory in
//! its allocator arena: a node grew by gigabytes. One thread at a lowered priority
//! bounds both: the executor's heartbeats win the CPU, and one check's memory is reused.
//!
//! A client that logged in lately with the same password logs in again without a check:
//! `VerifiedLogins` keeps, for `VERIFIED_LOGINS_TTL`, a keyed digest of the user name,
//! the password and the stored hash it verified against. A changed password (another
//! stored hash) misses; a failed check is never kept; the key is random per process and
//! never leaves it.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use argon2::password_hash::rand_core::{OsRng, RngCore};

/// How long a login that checked out lets the same credentials in without a check.
pub const VERIFIED_LOGINS_TTL: Duration = Duration::from_secs(600);
/// Verified logins kept at most (the oldest go first).
pub const VERIFIED_LOGINS_MAX: usize = 4096;
/// The password thread's nice value (the replica executor runs at the process's).
const PASSWORD_NICE: libc::c_int = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The thread that runs password work, started on first use.
#[derive(Default)]
pub(super) struct PasswordThread {
    jobs: Option<flume::Sender<Job>>,
}

impl PasswordThread {
    /// Runs `work` on the password thread; None when it panicked (a bug, logged). When
    /// no thread can start, the work runs on the executor's blocking pool instead.
    pub fn run<R: Send + 'static>(
        &mut self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> Pin<Box<dyn Future<Output = Option<R>>>> {
        let (done, result) = flume::bounded(1);
        let job: Job = Box::new(move || {
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
            if outcome.is_err() {
                tracing::error!("password work panicked");
            }
            let _ = done.send(outcome.ok());
        });
        let job = match self.sender() {
            Some(jobs) => match jobs.send(job) {
                Ok(()) => return Box::pin(async move { result.recv_async().await.ok().flatten() }),
                // The thread is gone: started again on the next use.
                Err(flume::SendError(job)) => job,
            },
            None => job,
        };
        self.jobs = None;
        let blocking = glommio::executor().spawn_blocking(job);
        Box::pin(async move {
            blocking.await;
            result.recv_async().await.ok().flatten()
        })
    }

    fn sender(&mut self) -> Option<&flume::Sender<Job>> {
        if self.jobs.is_none() {
            let (jobs, inbox) = flume::unbounded::<Job>();
            let spawned = std::thread::Builder::new()
                .name("passwords".to_owned())
                .spawn(move || {
                    super::polls::unpin_and_renice(PASSWORD_NICE);
                    while let Ok(job) = inbox.recv() {
                        job();
                    }
                });
            match spawned {
                Ok(_) => self.jobs = Some(jobs),
                Err(error) => tracing::error!(%error, "cannot start the password thread"),
            }
        }
        self.jobs.as_ref()
    }
}

/// A keyed digest of credentials that verified (see the module's documentation).
pub(super) type Digest = [u8; 32];

/// Credentials that verified lately, bounded in number and age.
pub(super) struct VerifiedLogins {
    key: [u8; 32],
    until: HashMap<Digest, Instant>,
    order: VecDeque<(Digest, Instant)>,
    ttl: Duration,
    max: usize,
}

impl Default for VerifiedLogins {
    fn default() -> Self {
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        VerifiedLogins::new(key, VERIFIED_LOGINS_TTL, VERIFIED_LOGINS_MAX)
    }
}

impl VerifiedLogins {
    pub fn new(key: [u8; 32], ttl: Duration, max: usize) -> VerifiedLogins {
        VerifiedLogins {
            key,
            until: HashMap::new(),
            order: VecDeque::new(),
            ttl,
            max: max.max(1),
        }
    }

    /// The digest of `username` logging in with `password` against the stored `hash`.
    pub fn digest(&self, username: &str, password: &[u8], hash: &str) -> Digest {
        let mut hasher = blake3::Hasher::new_keyed(&self.key);
        for part in [username.as_bytes(), password, hash.as_bytes()] {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        *hasher.finalize().as_bytes()
    }

    /// Whether `digest` verified within the last `ttl`.
    pub fn fresh(&mut self, digest: &Digest, now: Instant) -> bool {
        self.expire(now);
        self.until.get(digest).is_some_and(|until| now < *until)
    }

    /// Keeps `digest`, which just verified, for `ttl` from `now`.
    pub fn insert(&mut self, digest: Digest, now: Instant) {
        self.expire(now);
        let until = now + self.ttl;
        self.until.insert(digest, until);
        self.order.push_back((digest, until));
        while self.until.len() > self.max {
            self.pop_oldest();
        }
        // Entries inserted again leave older copies in `order`: bounded by `max` too.
        while self.order.len() > 2 * self.max {
            self.pop_oldest();
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.until.len()
    }

    fn expire(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(_, until)| *until <= now) {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((digest, until)) = self.order.pop_front() {
            // A newer insert of the same digest keeps its own deadline.
            if self.until.get(&digest) == Some(&until) {
                self.until.remove(&digest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA";

    #[test]
    fn credentials_that_verified_are_fresh_for_the_ttl_only() {
        let mut logins = VerifiedLogins::new([7; 32], Duration::from_secs(10), 8);
        let t0 = Instant::now();
        let digest = logins.digest("alice", b"secret-pass", HASH);
        assert!(!logins.fresh(&digest, t0), "nothing verified yet");
        logins.insert(digest, t0);
        assert!(logins.fresh(&digest, t0 + Duration::from_secs(9)));
        assert!(!logins.fresh(&digest, t0 + Duration::from_secs(10)));
        assert_eq!(logins.len(), 0, "expired entries are dropped");
    }

    #[test]
    fn another_password_name_or_stored_hash_misses() {
        let mut logins = VerifiedLogins::new([7; 32], Duration::from_secs(10), 8);
        let now = Instant::now();
        logins.insert(logins.digest("alice", b"secret-pass", HASH), now);
        for (name, password, hash) in [
            ("alice", &b"secret-pasS"[..], HASH),
            ("alicf", &b"secret-pass"[..], HASH),
            (
                "alice",
                &b"secret-pass"[..],
                "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$b3RoZXI",
            ),
            // Length prefixes: a name's end cannot move into the password.
            ("alices", &b"ecret-pass"[..], HASH),
        ] {
            let digest = logins.digest(name, password, hash);
            assert!(!logins.fresh(&digest, now), "{name} {password:?} {hash}");
        }
        let other_key = VerifiedLogins::new([8; 32], Duration::from_secs(10), 8);
        assert_ne!(
            other_key.digest("alice", b"secret-pass", HASH),
            logins.digest("alice", b"secret-pass", HASH),
            "the digest depends on the key"
        );
    }

    #[test]
    fn the_oldest_go_first_beyond_the_bound() {
        let mut logins = VerifiedLogins::new([7; 32], Duration::from_secs(100), 3);
        let now = Instant::now();
        let digests: Vec<Digest> = (0..5)
            .map(|i| logins.digest(&format!("user{i}"), b"password", HASH))
            .collect();
        for (i, digest) in digests.iter().enumerate() {
            logins.insert(*digest, now + Duration::from_secs(i as u64));
        }
        let later = now + Duration::from_secs(5);
        assert_eq!(logins.len(), 3);
        assert!(!logins.fresh(&digests[0], later));
        assert!(!logins.fresh(&digests[1], later));
        assert!(digests[2..].iter().all(|d| logins.fresh(d, later)));
        // Inserted again, an entry takes the newer deadline and is not dropped by its
        // older copy; the copies stay bounded.
        for i in 0..20 {
            logins.insert(digests[4], now + Duration::from_secs(6 + i));
        }
        assert!(logins.order.len() <= 6);
        assert!(logins.fresh(&digests[4], now + Duration::from_secs(120)));
    }
}
