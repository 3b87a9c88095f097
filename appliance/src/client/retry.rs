//! Retry bounds and backoff, and how a reply steers the next attempt. Pure logic (time is
//! passed in), so the rules are unit-tested without sockets.

use std::time::{Duration, Instant};

use crate::protocol::Status;

/// Upper bound on `RetryPolicy::attempts_max`, whatever a caller configures.
pub const ATTEMPTS_LIMIT: u32 = 1_000;

/// How hard one call tries before giving up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts per call, redirects included (1 = never retry).
    pub attempts_max: u32,
    /// Wall time per call, from its first attempt, after which no new attempt starts.
    pub total_timeout: Duration,
    /// First backoff delay; doubles per backoff up to `backoff_max`.
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    /// A failover takes the cluster about its heartbeat timeout plus a view change; a
    /// backoff capped at 50 ms finds the new primary within that of the view change, and
    /// 600 attempts still cover an outage of about 30 s, the total bound.
    fn default() -> RetryPolicy {
        RetryPolicy {
            attempts_max: 600,
            total_timeout: Duration::from_secs(30),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(50),
        }
    }
}

/// What the client does after one attempt's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The request is decided (Ok or a final status): return it.
    Done,
    /// Resend at once to the primary the reply named.
    Redirect,
    /// Back off, then resend (same request number) at the next known node.
    RetryElsewhere,
    /// Back off, then resend (same request number) to the same node.
    RetrySame,
    /// Log in again on this connection, then resend.
    Relogin,
    /// The session is gone: register again if that is safe (see the module docs).
    SessionGone,
}

/// How a reply status steers the call (docs/client-protocol.md, "Reply statuses").
pub fn step_for(status: Status) -> Step {
    match status {
        Status::NotPrimary => Step::Redirect,
        // The primary is alive but its pipeline is full: the same node, a little later.
        Status::PipelineFull => Step::RetrySame,
        // A view change or recovery: another node may already be the primary.
        Status::Unavailable => Step::RetryElsewhere,
        Status::Unauthenticated => Step::Relogin,
        Status::NoSession => Step::SessionGone,
        Status::Ok
        | Status::InvalidRequest
        | Status::NotFound
        | Status::AlreadyExists
        | Status::PermissionDenied
        | Status::InvalidCredentials
        | Status::LimitReached
        | Status::StorageFull
        | Status::StaleRequest
        | Status::FeatureUnavailable
        | Status::IncompatibleProtocol
        | Status::UnsupportedOption
        | Status::InvalidOptionValue => Step::Done,
    }
}

/// Whether an answer with `status` proves the attempt was not applied.
pub fn proves_not_applied(status: Status) -> bool {
    matches!(
        status,
        Status::NotPrimary
            | Status::PipelineFull
            | Status::Unavailable
            | Status::NoSession
            | Status::Unauthenticated
            | Status::StorageFull
    )
}

/// The attempt budget of one call.
#[derive(Clone, Debug)]
pub struct Budget {
    policy: RetryPolicy,
    started: Instant,
    attempts: u32,
    backoffs: u32,
    jitter: u64,
}

impl Budget {
    pub fn new(policy: RetryPolicy, now: Instant, jitter_seed: u64) -> Budget {
        Budget {
            policy,
            started: now,
            attempts: 0,
            backoffs: 0,
            jitter: jitter_seed | 1,
        }
    }

    /// Counts an attempt about to start; false when the budget forbids it.
    pub fn start_attempt(&mut self, now: Instant) -> bool {
        let attempts_max = self.policy.attempts_max.clamp(1, ATTEMPTS_LIMIT);
        if self.attempts >= attempts_max {
            return false;
        }
        if self.attempts > 0 && now.duration_since(self.started) >= self.policy.total_timeout {
            return false;
        }
        self.attempts += 1;
        true
    }

    /// Attempts started so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub fn elapsed(&self, now: Instant) -> Duration {
        now.duration_since(self.started)
    }

    /// The next backoff: backoff_min doubling per backoff up to backoff_max, with jitter
    /// in [1/2, 1] of that so clients that failed together do not retry together, and
    /// never past the end of the total timeout.
    pub fn backoff(&mut self, now: Instant) -> Duration {
        let base = self
            .policy
            .backoff_min
            .saturating_mul(1u32 << self.backoffs.min(16))
            .min(self.policy.backoff_max);
        self.backoffs = self.backoffs.saturating_add(1);
        // xorshift64: cheap, deterministic per seed.
        self.jitter ^= self.jitter << 13;
        self.jitter ^= self.jitter >> 7;
        self.jitter ^= self.jitter << 17;
        let fraction = 0.5 + (self.jitter % 1024) as f64 / 2048.0;
        let delay = base.mul_f64(fraction);
        let left = self.policy.total_timeout.saturating_sub(self.elapsed(now));
        delay.min(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(attempts_max: u32, total_ms: u64) -> RetryPolicy {
        RetryPolicy {
            attempts_max,
            total_timeout: Duration::from_millis(total_ms),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(80),
        }
    }

    #[test]
    fn attempts_are_bounded_by_count() {
        let now = Instant::now();
        let mut budget = Budget::new(policy(3, 60_000), now, 7);
        assert!(budget.start_attempt(now));
        assert!(budget.start_attempt(now));
        assert!(budget.start_attempt(now));
        assert!(!budget.start_attempt(now));
        assert_eq!(budget.attempts(), 3);
    }

    #[test]
    fn attempts_are_bounded_by_total_time_but_the_first_always_runs() {
        let now = Instant::now();
        let mut budget = Budget::new(policy(100, 0), now, 7);
        assert!(budget.start_attempt(now));
        assert!(!budget.start_attempt(now + Duration::from_millis(1)));
        let mut budget = Budget::new(policy(100, 50), now, 7);
        assert!(budget.start_attempt(now));
        assert!(budget.start_attempt(now + Duration::from_millis(49)));
        assert!(!budget.start_attempt(now + Duration::from_millis(50)));
    }

    #[test]
    fn backoff_doubles_with_jitter_and_caps() {
        let now = Instant::now();
        let mut budget = Budget::new(policy(100, 60_000), now, 42);
        let delays: Vec<Duration> = (0..6).map(|_| budget.backoff(now)).collect();
        let bases = [10, 20, 40, 80, 80, 80];
        for (delay, base) in delays.iter().zip(bases) {
            let base = Duration::from_millis(base);
            assert!(
                *delay >= base / 2 && *delay <= base,
                "{delay:?} vs {base:?}"
            );
        }
    }

    #[test]
    fn backoff_never_outlives_the_total_timeout() {
        let now = Instant::now();
        let mut budget = Budget::new(policy(100, 15), now, 42);
        for _ in 0..5 {
            assert!(budget.backoff(now + Duration::from_millis(10)) <= Duration::from_millis(5));
        }
    }

    #[test]
    fn statuses_steer_the_next_attempt() {
        assert_eq!(step_for(Status::NotPrimary), Step::Redirect);
        assert_eq!(step_for(Status::PipelineFull), Step::RetrySame);
        assert_eq!(step_for(Status::Unavailable), Step::RetryElsewhere);
        assert_eq!(step_for(Status::Unauthenticated), Step::Relogin);
        assert_eq!(step_for(Status::NoSession), Step::SessionGone);
        for status in [
            Status::Ok,
            Status::NotFound,
            Status::AlreadyExists,
            Status::InvalidRequest,
            Status::StaleRequest,
        ] {
            assert_eq!(step_for(status), Step::Done);
        }
    }

    #[test]
    fn only_refusals_prove_an_attempt_was_not_applied() {
        assert!(proves_not_applied(Status::NotPrimary));
        assert!(proves_not_applied(Status::NoSession));
        assert!(!proves_not_applied(Status::Ok));
        assert!(!proves_not_applied(Status::AlreadyExists));
    }
}
