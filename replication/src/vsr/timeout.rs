//! Timeouts in ticks with exponential backoff and seeded jitter, and the PRNG behind them.

/// A small seeded PRNG (SplitMix64): deterministic, so one seed replays a run exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prng {
    state: u64,
}

impl Prng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Prng {
        Prng {
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 128 random bits (nonces, incarnations); never zero.
    pub fn next_u128(&mut self) -> u128 {
        let value = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        value.max(1)
    }

    /// Uniform in 0..bound (0 when bound is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}

/// Doublings of the base interval before backoff stops growing.
pub const BACKOFF_DOUBLINGS_MAX: u32 = 4;

/// A timeout that fires `after_ticks` (plus jitter) after it was started, doubling on
/// each consecutive `backoff` up to 2^BACKOFF_DOUBLINGS_MAX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeout {
    pub name: &'static str,
    pub after_ticks: u64,
    /// Jitter at most after_ticks / jitter_divisor.
    jitter_divisor: u64,
    attempts: u32,
    deadline: Option<u64>,
}

impl Timeout {
    /// A stopped timeout with up to half its interval of jitter.
    pub fn new(name: &'static str, after_ticks: u64) -> Timeout {
        Timeout::with_jitter(name, after_ticks, 2)
    }

    /// A stopped timeout with up to `after_ticks / jitter_divisor` of jitter.
    pub fn with_jitter(name: &'static str, after_ticks: u64, jitter_divisor: u64) -> Timeout {
        assert!(after_ticks > 0 && jitter_divisor > 0);
        Timeout {
            name,
            after_ticks,
            jitter_divisor,
            attempts: 0,
            deadline: None,
        }
    }

    /// (Re)starts from `now` without backoff.
    pub fn start(&mut self, now: u64, prng: &mut Prng) {
        self.attempts = 0;
        self.arm(now, prng);
    }

    /// Stops it.
    pub fn stop(&mut self) {
        self.attempts = 0;
        self.deadline = None;
    }

    /// Whether it is running.
    pub fn ticking(&self) -> bool {
        self.deadline.is_some()
    }

    /// Whether it has fired at `now`.
    pub fn fired(&self, now: u64) -> bool {
        self.deadline.is_some_and(|deadline| now >= deadline)
    }

    /// Re-arms after firing with exponential backoff.
    pub fn backoff(&mut self, now: u64, prng: &mut Prng) {
        self.attempts = (self.attempts + 1).min(BACKOFF_DOUBLINGS_MAX);
        self.arm(now, prng);
    }

    /// Re-arms after firing without growing the interval.
    pub fn reset(&mut self, now: u64, prng: &mut Prng) {
        self.arm(now, prng);
    }

    fn arm(&mut self, now: u64, prng: &mut Prng) {
        let base = self.after_ticks << self.attempts;
        let jitter = prng.below(self.after_ticks / self.jitter_divisor + 1);
        self.deadline = Some(now + base + jitter);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_backs_off_exponentially_up_to_a_bound() {
        let mut prng = Prng::new(7);
        let mut timeout = Timeout::new("t", 10);
        timeout.start(0, &mut prng);
        assert!(!timeout.fired(9));
        assert!(timeout.fired(15));
        for _ in 0..10 {
            timeout.backoff(0, &mut prng);
        }
        assert!(!timeout.fired(10 << BACKOFF_DOUBLINGS_MAX));
        assert!(timeout.fired((10 << BACKOFF_DOUBLINGS_MAX) + 6));
    }

    #[test]
    fn jitter_stays_within_its_fraction_of_the_interval() {
        let mut prng = Prng::new(3);
        let mut latest = 0;
        for _ in 0..1_000 {
            let mut timeout = Timeout::with_jitter("heartbeat", 100, 8);
            timeout.start(0, &mut prng);
            assert!(!timeout.fired(99));
            let fires_at = (100..=200).find(|t| timeout.fired(*t)).expect("fires");
            assert!(fires_at <= 112, "fired at {fires_at}");
            latest = latest.max(fires_at);
        }
        // The whole range is used, not only the interval itself.
        assert_eq!(latest, 112);
    }

    #[test]
    fn prng_is_deterministic_per_seed() {
        let a: Vec<u64> = (0..4)
            .scan(Prng::new(1), |p, _| Some(p.next_u64()))
            .collect();
        let b: Vec<u64> = (0..4)
            .scan(Prng::new(1), |p, _| Some(p.next_u64()))
            .collect();
        assert_eq!(a, b);
    }
}
